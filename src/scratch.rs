//! A per-thread scratch string. Shared strings (`Arc<str>`) made on every acquire — lock names,
//! holder and attempt ids — are written there first, so that the shared string is their one
//! allocation.

use std::{cell::RefCell, sync::Arc};

thread_local! {
    static SCRATCH: RefCell<String> = const { RefCell::new(String::new()) };
}

/// The text `write` appends to an empty string, shared.
pub(crate) fn shared(write: impl FnOnce(&mut String)) -> Arc<str> {
    let build = |text: &mut String| {
        text.clear();
        write(text);
        Arc::from(text.as_str())
    };
    SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
        Ok(mut text) => {
            let shared = build(&mut text);
            // A very long text does not stay allocated for the thread's lifetime.
            text.shrink_to(256);
            shared
        }
        // Only a `write` that itself builds a shared string gets here.
        Err(_) => build(&mut String::new()),
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
