//! A per-thread scratch string. Shared strings (`Arc<str>`) made on every acquire — lock names,
//! holder and attempt ids — are written there first, so that the shared string is their one
//! allocation.

use std::{cell::RefCell, sync::Arc};

thread_local! {
    static SCRATCH: RefCell<String> = const { RefCell::new(String::new()) };
}

/// The text `write` appends to an empty string, shared.
pub(crate) fn shared(write: impl FnOnce(&mut String)) -> Arc<str> {
    let mut write = Some(write);
    let built = SCRATCH
        .try_with(|scratch| {
            // Busy only for a `write` that itself builds a shared string.
            let mut text = scratch.try_borrow_mut().ok()?;
            text.clear();
            (write.take()?)(&mut text);
            let shared = Arc::from(text.as_str());
            // A very long text does not stay allocated for the thread's lifetime.
            text.shrink_to(256);
            Some(shared)
        })
        .ok()
        .flatten();
    // Nested, or the thread's locals are being torn down: a string of its own. (`write` is
    // taken only on the way to a built text.)
    built.unwrap_or_else(|| {
        let mut text = String::new();
        if let Some(write) = write {
            write(&mut text);
        }
        Arc::from(text)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_each_text_afresh_and_nests() {
        let outer = shared(|text| {
            text.push_str("outer ");
            text.push_str(&shared(|inner| inner.push_str("inner")));
        });
        assert_eq!(&*outer, "outer inner");
        assert_eq!(&*shared(|text| text.push('x')), "x");
        let long = "y".repeat(10_000);
        assert_eq!(&*shared(|text| text.push_str(&long)), long);
    }
}
