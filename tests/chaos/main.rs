//! Fault-injection suite: scenarios that pause, kill or cut holders and Redis while a history of
//! critical sections is recorded, then checkers that look for overlapping holds, lost updates,
//! stale writes and leaked state.
//!
//! - [`run`]: the seed, CI or soak counts, the figure line and the failure report of a scenario.
//! - [`clock`]: `CLOCK_MONOTONIC` timestamps, comparable across processes.
//! - [`history`]: critical sections appended as JSON lines by every process.
//! - [`witness`]: a never-faulted Redis that sees every section in real time.
//! - [`checker`]: the overlap sweep over a history, and the leak check after quiescence.
//! - [`proxy`]: a TCP proxy between a client and Redis that can delay, swallow or cut traffic.
//! - [`holder`]: this test binary re-run as a holder process, so faults can hit a client.
//! - [`scenarios`]: one module per fault (the `F` numbers of the catalogue in `README.md`).
//!
//! `TOWER_LOCK_SEED=<n>` repeats a run's random choices; `TOWER_LOCK_SOAK=1` raises the counts;
//! `RUST_LOG=tower_lock=debug` prints the crate's tracing events.
#![cfg(all(target_os = "linux", feature = "redis"))]

#[path = "../support/mod.rs"]
mod support;

mod checker;
mod clock;
mod history;
mod holder;
mod proxy;
mod run;
mod scenarios;
mod witness;
