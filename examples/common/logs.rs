//! What the demos print: the library's own events, warnings by default (a Redis that started
//! less than a lease ago, which grants no lock yet, says so), more with `RUST_LOG`, e.g.
//! `RUST_LOG=tower_lock=debug` for every acquire, hand-off and release; and the error that ends
//! a demo, with its causes.

use std::{error::Error, process::ExitCode};

use tracing_subscriber::EnvFilter;

/// Prints the library's warnings (or what `RUST_LOG` asks for) on standard error.
pub(crate) fn show() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
}

/// The demo's exit code; an error is printed with each of its causes, e.g. "lock backend
/// unavailable: could not connect to Redis at 127.0.0.1:6379: Connection refused (os error
/// 111)", rather than in its `Debug` form.
pub(crate) fn exit(result: Result<(), Box<dyn Error>>) -> ExitCode {
    let Err(error) = result else {
        return ExitCode::SUCCESS;
    };
    let mut message = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        message = format!("{message}: {next}");
        cause = next.source();
    }
    eprintln!("error: {message}");
    ExitCode::FAILURE
}
