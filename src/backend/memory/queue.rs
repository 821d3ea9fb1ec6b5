//! Waiters' places in the queue of a fair lock or of a read-write lock's writers, kept or
//! left step by step as `wait.lua` does.

use std::{borrow::Cow, time::Duration};

use tokio::time::Instant;

use super::lock::{Lock, Publish, RELEASED};
use crate::{
    backend::{LockKind, store::RenewReply},
    clock::after,
};

impl Lock {
    /// Keeps `holder`'s place for `timeout` from now, or with `None` takes it out. Passes the
    /// wake-up on when the head changed while the lock is free (to the new head, by name), or
    /// when the queue emptied (`released`, for readers held back by a waiting writer).
    pub(super) fn wait(
        &mut self,
        holder: &str,
        kind: LockKind,
        timeout: Option<Duration>,
        now: Instant,
    ) -> (RenewReply, Publish) {
        // The head goes if its place ended, or if it is the holder leaving.
        let head_goes = self
            .head()
            .is_some_and(|(head, end)| end <= now || (timeout.is_none() && head == holder));
        self.purge_queue(now);
        if timeout.is_none() {
            self.unqueue(holder);
        }
        let mut free = self.owner.is_none();
        if free && kind == LockKind::Write {
            self.drop_ended_grants(now);
            free = self.grants.items.is_empty();
        }
        let first = self.head().map(|(first, _)| first);
        let publish = (head_goes && (free || first.is_none()))
            .then(|| first.map_or(RELEASED, |first| Cow::Owned(first.to_owned())));
        let ready = free && first == Some(holder);
        let Some(timeout) = timeout else {
            return (RenewReply::NotHeld, publish);
        };
        let Some(place) = self.queue.items.iter_mut().find(|(waiter, _)| waiter == holder) else {
            return (RenewReply::NotHeld, publish);
        };
        place.1 = after(now, timeout);
        self.queue.extend(now, timeout);
        let reply = if ready { RenewReply::Ready } else { RenewReply::Renewed };
        (reply, publish)
    }
}
