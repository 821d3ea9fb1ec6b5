//! Owner records of plain, fair and write locks, step by step as `acquire.lua` and
//! `release.lua` take, extend, free and hand them off.

use std::{sync::atomic::AtomicU64, time::Duration};

use tokio::time::Instant;

use super::lock::{Lock, Owner, Publish, new_token};
use crate::{
    backend::{
        LockKind,
        store::{AcquireReply, Extend, ExtendReply, Grant, Release, ReleaseReply},
    },
    clock::after,
};

impl Lock {
    /// Takes the owner record for `grant.attempt` if the lock lets it (`acquire.lua`).
    pub(super) fn acquire(
        &mut self,
        grant: &Grant<'_>,
        now: Instant,
        fence: &AtomicU64,
    ) -> AcquireReply {
        let left = |owner: &Owner| owner.expires.saturating_duration_since(now);
        if self.given_up(grant.attempt) {
            let ttl = self.owner.as_ref().map(left);
            return AcquireReply::Held { ttl };
        }
        if let Some(owner) = self.owner.as_ref().filter(|o| o.attempt == grant.attempt) {
            // The same request, sent again: it holds the lock already.
            return AcquireReply::Acquired { token: owner.token };
        }
        // A record whose attempt was given up on is a late copy nobody holds: free.
        let held = self.owner.as_ref().filter(|owner| !self.given_up(&owner.attempt));
        let mut retry = held.map(left);
        if grant.kind != LockKind::Exclusive {
            self.purge_queue(now);
            if retry.is_none() && grant.kind == LockKind::Write {
                self.drop_ended_grants(now);
                retry = self.first_grant_end().map(|end| end.saturating_duration_since(now));
            }
            let head = self.head();
            if retry.is_none()
                && let Some((waiter, end)) = head
                && waiter != grant.holder
            {
                retry = Some(end.saturating_duration_since(now));
            }
            if retry.is_some() {
                if let Some(timeout) = grant.queue.filter(|timeout| !timeout.is_zero()) {
                    self.join(grant.holder, now, timeout);
                }
                return AcquireReply::Held { ttl: retry };
            }
            if head.is_some() {
                self.unqueue(grant.holder);
            }
        } else if retry.is_some() {
            return AcquireReply::Held { ttl: retry };
        }
        let token = self.own(grant.attempt, grant.lease.duration(), grant.fencing, now, fence);
        AcquireReply::Acquired { token }
    }

    /// Writes the owner record of `attempt`; its token.
    fn own(
        &mut self,
        attempt: &str,
        lease: Duration,
        fencing: bool,
        now: Instant,
        fence: &AtomicU64,
    ) -> Option<u64> {
        let token = fencing.then(|| new_token(fence));
        self.owner = Some(Owner { attempt: attempt.to_owned(), token, expires: after(now, lease) });
        token
    }

    /// Extends the owner record `extend.grant` names, and gives it a token if asked and it has
    /// none (`acquire.lua` with a grant to extend).
    pub(super) fn extend_owner(
        &mut self,
        extend: &Extend<'_>,
        now: Instant,
        fence: &AtomicU64,
    ) -> ExtendReply {
        let Some(owner) = self.renew_owner(extend.grant, extend.lease.duration(), now) else {
            return ExtendReply::NotHeld;
        };
        if extend.fencing && owner.token.is_none() {
            owner.token = Some(new_token(fence));
        }
        ExtendReply::Extended { token: owner.token }
    }

    /// Makes the owner record `grant` names live at least `lease` from now, never shorter
    /// (`renew.lua`); the record, when it names the grant.
    pub(super) fn renew_owner(
        &mut self,
        grant: &str,
        lease: Duration,
        now: Instant,
    ) -> Option<&mut Owner> {
        let owner = self.owner.as_mut().filter(|owner| owner.attempt == grant)?;
        owner.expires = owner.expires.max(after(now, lease));
        Some(owner)
    }

    /// Whether the owner record names `grant` (and, when given, carries `token`: `release.lua`
    /// then compares the whole record).
    fn names(&self, grant: &str, token: Option<u64>) -> bool {
        self.owner.as_ref().is_some_and(|owner| {
            owner.attempt == grant && token.is_none_or(|token| owner.token == Some(token))
        })
    }

    /// Deletes the owner record if it names the grant, or hands a plain lock to
    /// `release.handoff` unless that attempt was given up on (`release.lua`; the Redis backend
    /// sends the release of any other kind plainly).
    pub(super) fn release_owner(
        &mut self,
        release: &Release<'_>,
        now: Instant,
        fence: &AtomicU64,
    ) -> (ReleaseReply, Publish) {
        if !self.names(release.grant, release.token) {
            return (ReleaseReply::NotHeld, None);
        }
        let handoff = release.handoff.filter(|_| release.kind == LockKind::Exclusive);
        if let Some(next) = handoff.filter(|next| !self.given_up(next.attempt)) {
            let token = self.own(next.attempt, next.lease.duration(), next.fencing, now, fence);
            return (ReleaseReply::HandedOff { token }, None);
        }
        self.owner = None;
        let publish = Some(self.freed(release.kind == LockKind::Fair, now));
        (ReleaseReply::Released { notified: None }, publish)
    }

    /// Records the attempt of `grant` as given up on and deletes its record if it has one
    /// (`release.lua`'s undo): whether a record went.
    pub(super) fn abandon_owner(&mut self, grant: &Grant<'_>, now: Instant) -> (bool, Publish) {
        self.give_up(grant.attempt, now, grant.lease.duration());
        if !self.names(grant.attempt, None) {
            return (false, None);
        }
        self.owner = None;
        (true, Some(self.freed(grant.kind == LockKind::Fair, now)))
    }
}
