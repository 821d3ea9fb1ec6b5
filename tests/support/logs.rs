//! Log lines collected in memory, for tests that check what the library says.
//!
//! One subscriber serves the whole test binary: installed as the global default by the first
//! capture, it writes each event to the capture of the thread that emits it, if that thread has
//! one, and drops it otherwise. Tracing caches per call site whether any subscriber listens; a
//! subscriber set per thread (`set_default`) would make that cache depend on which test reached
//! a line first, and on which thread, so a line could stay hidden from a test that captures it.
//! The global one listens to every call site at `INFO` and above, always, and decides per event.

use std::{
    cell::RefCell,
    sync::{Arc, Mutex, Once},
};

use tracing::{Level, Metadata};
use tracing_subscriber::{Layer as _, filter::filter_fn, layer::SubscriberExt as _};

thread_local! {
    /// The capture this thread's events go to, if any.
    static CAPTURE: RefCell<Option<Logs>> = const { RefCell::new(None) };
}

/// Log output collected in memory.
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

/// Ends a thread's capture when dropped (and restores the one it replaced).
pub struct Capturing {
    previous: Option<Logs>,
}

impl Drop for Capturing {
    fn drop(&mut self) {
        let previous = self.previous.take();
        CAPTURE.with(|capture| *capture.borrow_mut() = previous);
    }
}

/// Whether this thread captures what `metadata` describes.
fn captured(metadata: &Metadata<'_>) -> bool {
    *metadata.level() <= Level::INFO && CAPTURE.with(|capture| capture.borrow().is_some())
}

/// Installs the binary's subscriber, once.
fn install() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let layer = tracing_subscriber::fmt::layer()
            .with_writer(ThreadWriter)
            .with_ansi(false)
            .with_filter(filter_fn(captured).with_max_level_hint(Level::INFO));
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::set_global_default(subscriber)
            .expect("no other global subscriber in a test binary");
    });
}

impl Logs {
    /// Collects this thread's log lines (`INFO` and above) until the guard is dropped.
    pub fn capture() -> (Self, Capturing) {
        install();
        let logs = Self::default();
        let previous = CAPTURE.with(|capture| capture.borrow_mut().replace(logs.clone()));
        (logs, Capturing { previous })
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// Writes to the capture of the thread that formats the event (the thread that emitted it).
struct ThreadWriter;

impl std::io::Write for ThreadWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        CAPTURE.with(|capture| {
            if let Some(logs) = capture.borrow().as_ref() {
                logs.0.lock().unwrap().extend_from_slice(buf);
            }
        });
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for ThreadWriter {
    type Writer = Self;

    fn make_writer(&'a self) -> Self {
        Self
    }
}
