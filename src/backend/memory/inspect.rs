//! Reading and clearing a lock for operators, as `inspect.lua` does.

use tokio::time::Instant;

use super::lock::{Lock, Publish, RELEASED};
use crate::{
    backend::{LockKind, store::holder_of},
    inspect::{HolderInfo, LockInfo, Permits},
};

impl Lock {
    /// What the lock holds in `kind`'s layout: one holder per grant, in the order of their
    /// lease ends for shared grants; the live places.
    pub(super) fn inspect(&self, kind: LockKind, now: Instant) -> LockInfo {
        let mut info = LockInfo::free();
        if kind != LockKind::Semaphore {
            if let Some(owner) = &self.owner {
                // The store keeps no mark of a fair grant: a plain or fair owner is exclusive.
                let side = match kind {
                    LockKind::Read | LockKind::Write => LockKind::Write,
                    _ => LockKind::Exclusive,
                };
                let left = owner.expires.saturating_duration_since(now);
                let holder = HolderInfo::new(holder_of(&owner.attempt), side, 1, Some(left));
                info = info.with_holder(holder);
            }
            let queued = self.queue.items.iter().filter(|(_, end)| *end > now);
            info = info.with_queue_len(queued.count() as u64);
        }
        if matches!(kind, LockKind::Read | LockKind::Write | LockKind::Semaphore) {
            let mut live: Vec<_> = self.grants.items.iter().filter(|(_, end)| *end > now).collect();
            live.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
            let side = match kind {
                LockKind::Semaphore => LockKind::Semaphore,
                _ => LockKind::Read,
            };
            for (attempt, end) in &live {
                let left = end.saturating_duration_since(now);
                info = info.with_holder(HolderInfo::new(holder_of(attempt), side, 1, Some(left)));
            }
            if side == LockKind::Semaphore && !live.is_empty() {
                // The store keeps no permit count: each acquire states its own.
                info = info.with_permits(Permits::new(live.len() as u64, 0));
            }
        }
        info
    }

    /// Deletes the owner record and every shared grant when the lock is held, keeping the
    /// queue; wakes the head of a plain or fair lock's queue by name (after dropping the places
    /// that ended, as the script does), any other waiter with `released`. What it held before.
    pub(super) fn force_unlock(&mut self, kind: LockKind, now: Instant) -> (LockInfo, Publish) {
        let before = self.inspect(kind, now);
        if !before.is_locked() {
            return (before, None);
        }
        self.owner = None;
        self.grants = Default::default();
        let publish = match kind {
            LockKind::Exclusive | LockKind::Fair => self.freed(true, now),
            _ => RELEASED,
        };
        (before, Some(publish))
    }
}
