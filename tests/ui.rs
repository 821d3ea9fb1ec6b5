//! Compile-time checks of `#[locked]`: every misuse is an error pointing at the mistake, and the
//! documented forms compile as axum handlers. Snapshots in `tests/ui/fail/*.stderr`; refresh them
//! with `TRYBUILD=overwrite cargo test --all-features --test ui` after a deliberate change.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/fail/*.rs");
    cases.pass("tests/ui/pass/*.rs");
}
