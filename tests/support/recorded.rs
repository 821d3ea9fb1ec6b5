//! Metrics recorded for one test: its runtime, the watchdog's task included, runs on the test's
//! thread under a debugging recorder installed for that thread only.

use metrics_util::debugging::{DebuggingRecorder, Snapshotter};

/// Runs `test` on a current-thread runtime under a recorder of its own, which `test` reads
/// through the snapshotter it is given (taking a snapshot resets the counters).
pub fn run<T>(test: impl AsyncFnOnce(&Snapshotter) -> T) -> T {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    metrics::with_local_recorder(&recorder, || runtime.block_on(test(&snapshotter)))
}
