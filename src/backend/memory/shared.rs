//! Shared grants, readers of a read-write lock and permits of a semaphore, step by step as
//! `share.lua` and `unshare.lua` take, extend and give them back.

use tokio::time::Instant;

use super::lock::{Lock, Publish, RELEASED};
use crate::{
    backend::{
        LockKind,
        store::{AcquireReply, Extend, ExtendReply, Grant},
    },
    clock::after,
};

impl Lock {
    /// Takes a shared grant for `grant.attempt` if the lock lets it (`share.lua`).
    pub(super) fn share(&mut self, grant: &Grant<'_>, now: Instant) -> AcquireReply {
        self.drop_ended_grants(now);
        if self.given_up(grant.attempt) {
            return AcquireReply::Held { ttl: None };
        }
        if self.grant(grant.attempt).is_some() {
            // The same request, sent again: it holds the grant already.
            return AcquireReply::Acquired { token: None };
        }
        // Grants of attempts given up on are late copies nobody holds.
        let (grants, void) = (&mut self.grants, &self.void.items);
        if !void.is_empty() {
            grants.retain(|(attempt, _)| !void.contains(attempt));
        }
        let left = |end: Instant| end.saturating_duration_since(now);
        if grant.kind == LockKind::Semaphore {
            if self.grants.items.len() >= grant.permits as usize {
                // No grant at all (no permits): the script finds no score; the time is unknown.
                let ttl = self.first_grant_end().map(left);
                return AcquireReply::Held { ttl };
            }
        } else if let Some(writer) = &self.owner {
            if grant.within != Some(writer.attempt.as_str()) {
                return AcquireReply::Held { ttl: Some(left(writer.expires)) };
            }
        } else {
            self.purge_queue(now);
            if let Some((waiter, end)) = self.head()
                && waiter != grant.holder
            {
                return AcquireReply::Held { ttl: Some(left(end)) };
            }
        }
        let lease = grant.lease.duration();
        let end = after(now, lease);
        self.grants.items.push((grant.attempt.to_owned(), end));
        self.grants.extend(now, lease);
        AcquireReply::Acquired { token: None }
    }

    /// Extends the live shared grant `extend.grant` names (`share.lua` with a grant to extend).
    pub(super) fn extend_shared(&mut self, extend: &Extend<'_>, now: Instant) -> ExtendReply {
        self.drop_ended_grants(now);
        if !self.renew_shared(extend.grant, extend.lease.duration(), now) {
            return ExtendReply::NotHeld;
        }
        ExtendReply::Extended { token: None }
    }

    /// Makes the shared grant `attempt` live at least `lease` from now, unless its lease ended
    /// (`renew.lua`): whether it was held.
    pub(super) fn renew_shared(
        &mut self,
        attempt: &str,
        lease: std::time::Duration,
        now: Instant,
    ) -> bool {
        let Some(end) = self.grant(attempt).filter(|end| **end > now) else {
            return false;
        };
        *end = (*end).max(after(now, lease));
        self.grants.extend(now, lease);
        true
    }

    /// Gives back the shared grant `attempt` (`unshare.lua`): a grant whose lease ended but that
    /// nothing dropped yet goes too, as its `ZREM` finds it.
    pub(super) fn unshare(&mut self, attempt: &str) -> Publish {
        self.take_grant(attempt).then_some(RELEASED)
    }

    /// Records the attempt of `grant` as given up on and gives back its shared grant if it has
    /// one (`unshare.lua`'s undo): whether a grant went.
    pub(super) fn abandon_shared(&mut self, grant: &Grant<'_>, now: Instant) -> (bool, Publish) {
        self.give_up(grant.attempt, now, grant.lease.duration());
        let publish = self.unshare(grant.attempt);
        (publish.is_some(), publish)
    }
}
