//! Compile-time checks of `#[locked]`: every misuse is an error pointing at the mistake, and the
//! documented forms compile as axum handlers. Snapshots in `tests/ui/fail/*.stderr`; refresh them
//! with `TRYBUILD=overwrite cargo test -p tower-lock-macros --test ui` after a deliberate change.
//! They live in this crate so that trybuild builds tower-lock with `macros` only, not with the
//! root crate's features and dev-dependencies.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/fail/*.rs");
    cases.pass("tests/ui/pass/*.rs");
}
