//! Inspecting and force-unlocking locks of the in-process backend, mirroring `inspect.lua` and
//! `force_unlock.lua`.

use tokio::time::Instant;

use super::{Publish, State};
use crate::{
    backend::LockKind,
    inspect::{HolderInfo, LockInfo, Permits},
    lock_key::LockKey,
};

impl State {
    /// What the lock `key` of `kind`'s layout holds at `now`.
    pub(super) fn inspect(&mut self, key: &LockKey, kind: LockKind, now: Instant) -> LockInfo {
        match kind {
            LockKind::Read | LockKind::Write => self.rw_inspect(key, now),
            LockKind::Semaphore => self.inspect_semaphore(key, now),
            _ => self.inspect_exclusive(key, now),
        }
    }

    /// Frees the lock `key` of `kind`'s layout whoever holds it; returns what it held and
    /// the release to announce.
    pub(super) fn force_unlock(
        &mut self,
        key: &LockKey,
        kind: LockKind,
        now: Instant,
    ) -> (LockInfo, Publish) {
        match kind {
            LockKind::Read | LockKind::Write => self.rw_force_unlock(key, now),
            LockKind::Semaphore => {
                let before = self.inspect_semaphore(key, now);
                self.semaphores.remove(key.as_str());
                let publish = before.is_locked().then(|| (key.clone(), None));
                (before, publish)
            }
            _ => {
                let before = self.inspect_exclusive(key, now);
                if self.locks.remove(key).is_none() {
                    return (before, None);
                }
                // A fair queue stays as it is: its head is woken by name, the waiters of an
                // exclusive lock by any announcement.
                let head = self
                    .queues
                    .get(key.as_str())
                    .and_then(|queue| queue.order.front().cloned());
                let payload = head.unwrap_or_else(|| "released".to_owned());
                (before, Some((key.clone(), Some(payload))))
            }
        }
    }

    /// The live permits of the semaphore `key`, in the order of their holders' ids.
    fn inspect_semaphore(&mut self, key: &LockKey, now: Instant) -> LockInfo {
        let Some(semaphore) = self.semaphores.get(key.as_str()) else {
            return LockInfo::free();
        };
        let mut live: Vec<_> = semaphore
            .holders()
            .iter()
            .filter(|(_, permit)| permit.until > now)
            .collect();
        if live.is_empty() {
            return LockInfo::free();
        }
        live.sort_by(|a, b| a.0.cmp(b.0));
        let permits = Permits::new(live.len() as u64, u64::from(semaphore.limit));
        let mut info = LockInfo::free().with_permits(permits);
        for (holder, permit) in live {
            let left = permit.until.saturating_duration_since(now);
            let kind = LockKind::Semaphore;
            info = info.with_holder(HolderInfo::new(holder, kind, permit.count, Some(left)));
        }
        info
    }

    fn inspect_exclusive(&mut self, key: &LockKey, now: Instant) -> LockInfo {
        let name = key.as_str();
        let queued = self.queues.get_mut(name).map_or(0, |queue| {
            queue.purge(now);
            queue.order.len()
        });
        let info = LockInfo::free().with_queue_len(queued as u64);
        match self.live(key, now) {
            Some(entry) => {
                let kind = if entry.fair || queued > 0 {
                    LockKind::Fair
                } else {
                    LockKind::Exclusive
                };
                let left = entry.expires.saturating_duration_since(now);
                info.with_holder(HolderInfo::new(
                    entry.owner.clone(),
                    kind,
                    entry.count,
                    Some(left),
                ))
            }
            None => info,
        }
    }
}
