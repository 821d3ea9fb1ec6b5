//! Semaphores of the in-process backend, mirroring `sem_*.lua`.

use std::{collections::HashMap, time::Duration};

use tokio::time::Instant;

use super::{HoldEnds, Named, Publish, State, names_hold, reenter_hold, takes_over};
use crate::{
    backend::{AcquireReply, Grant, Reentry, ReleaseReply, Renew, RenewReply},
    clock::after,
    lock_key::LockKey,
};

/// One semaphore: its holders, each with its own lease.
#[derive(Debug, Default)]
pub(super) struct Semaphore {
    holders: HashMap<String, Permit>,
    /// The permit count of the last grant, for inspection.
    pub(super) limit: u32,
}

/// One holder's permit.
#[derive(Debug)]
pub(super) struct Permit {
    /// Holds (a holder that acquires again nests in the permit it has).
    pub(super) count: u64,
    pub(super) until: Instant,
    /// The attempt that granted the permit.
    grant: String,
    /// The last re-entry's attempt.
    reentry: String,
    /// The lease of each hold: `until` is the latest of them.
    ends: HoldEnds,
}

impl Semaphore {
    fn purge(&mut self, now: Instant) {
        self.holders.retain(|_, permit| permit.until > now);
    }

    /// When the first holder's lease ends, counted from `now`.
    fn retry(&self, now: Instant) -> Option<Duration> {
        let first = self.holders.values().map(|permit| permit.until).min()?;
        Some(first.saturating_duration_since(now))
    }

    /// The live permits, by holder.
    pub(super) fn holders(&self) -> &HashMap<String, Permit> {
        &self.holders
    }
}

impl State {
    fn semaphore(&mut self, key: &LockKey, now: Instant) -> &mut Semaphore {
        let semaphore = self.semaphores.entry(key.as_str().to_owned()).or_default();
        semaphore.purge(now);
        semaphore
    }

    /// Forgets `key`'s semaphore once nobody holds a permit.
    fn drop_idle_semaphore(&mut self, key: &LockKey) {
        if self
            .semaphores
            .get(key.as_str())
            .is_some_and(|semaphore| semaphore.holders.is_empty())
        {
            self.semaphores.remove(key.as_str());
        }
    }

    pub(super) fn sem_acquire(&mut self, grant: Grant<'_>, now: Instant) -> AcquireReply {
        let semaphore = self.semaphore(grant.key, now);
        let permit = semaphore.holders.get(grant.holder);
        let held = permit.is_some();
        let taken_over = permit
            .is_some_and(|permit| takes_over(&permit.grant, &permit.reentry, grant.supersedes));
        let taken_over = taken_over.then_some(grant.supersedes).flatten();
        let refused = match grant.reentry {
            Reentry::Allowed => false,
            Reentry::Only => !held,
            Reentry::Refused => held && taken_over.is_none(),
        };
        let full = !held && semaphore.holders.len() >= grant.permits as usize;
        if refused || full {
            let ttl = semaphore.retry(now);
            self.drop_idle_semaphore(grant.key);
            return AcquireReply::Held { ttl };
        }
        semaphore.limit = grant.permits;
        let until = after(now, grant.lease.duration());
        let permit = semaphore
            .holders
            .entry(grant.holder.to_owned())
            .or_insert_with(|| Permit {
                count: 0,
                until,
                grant: String::new(),
                reentry: String::new(),
                ends: HoldEnds::default(),
            });
        reenter_hold(
            &mut permit.count,
            &mut permit.grant,
            &mut permit.reentry,
            grant.attempt,
            grant.supersedes,
        );
        if permit.count == 1 {
            // A new permit (or the only hold, taken over): its grant is recorded as such.
            grant.attempt.clone_into(&mut permit.grant);
            permit.reentry.clear();
        }
        // A re-entry with a shorter lease never cuts the earlier lease short; each hold keeps
        // its own.
        permit.until = permit.until.max(until);
        permit.ends.add(grant.attempt, taken_over, until);
        AcquireReply::Acquired {
            count: permit.count,
            token: None,
            session: 0,
        }
    }

    /// Gives back one hold (every hold, with `all`) of `holder`'s permit, if it is the one
    /// `named`; the lease of the hold `hold` took goes with it (see
    /// [`rw_release`](State::rw_release)).
    pub(super) fn sem_release(
        &mut self,
        key: &LockKey,
        holder: &str,
        all: bool,
        (named, hold): (Named<'_>, Option<&str>),
        now: Instant,
    ) -> (ReleaseReply, Publish) {
        let semaphore = self.semaphore(key, now);
        let Some(permit) = semaphore.holders.get_mut(holder) else {
            self.drop_idle_semaphore(key);
            return (ReleaseReply::NotHeld, None);
        };
        let Some(clears) = named.matches(Some((&permit.grant, &permit.reentry)), all) else {
            return (ReleaseReply::NotHeld, None);
        };
        permit.count = if all { 0 } else { permit.count - 1 };
        if permit.count > 0 {
            clears.apply(&mut permit.grant, &mut permit.reentry);
            let remaining = permit.count;
            // The permit lasts until the latest lease of the holds left ends.
            let ends = permit.ends.remove(hold);
            if ends.is_none_or(|ends| ends > now) {
                if let Some(ends) = ends {
                    permit.until = ends;
                }
                return (ReleaseReply::Decremented { remaining }, None);
            }
        }
        semaphore.holders.remove(holder);
        self.drop_idle_semaphore(key);
        let publish = Some((key.clone(), None));
        (ReleaseReply::Released { notified: None }, publish)
    }

    pub(super) fn sem_renew(&mut self, renew: &Renew<'_>, now: Instant) -> RenewReply {
        let semaphore = self.semaphore(renew.key, now);
        let reply = match semaphore.holders.get_mut(renew.holder) {
            Some(permit) if names_hold(renew, &permit.grant, &permit.reentry) => {
                let until = after(now, renew.lease.duration());
                permit.until = permit.until.max(until);
                permit.ends.renew(until);
                RenewReply::Renewed
            }
            _ => RenewReply::NotHeld,
        };
        self.drop_idle_semaphore(renew.key);
        reply
    }
}
