//! What the demos print of the library's own events: warnings by default (a Redis that started
//! less than a lease ago, which grants no lock yet, says so), more with `RUST_LOG`, e.g.
//! `RUST_LOG=tower_lock=debug` for every acquire, hand-off and release.

use tracing_subscriber::EnvFilter;

/// Prints the library's warnings (or what `RUST_LOG` asks for) on standard error.
pub(crate) fn show() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
