//! Read-write locks of the in-process backend, mirroring `rw_*.lua`.

use std::{collections::HashMap, time::Duration};

use tokio::time::Instant;

use super::{HoldEnds, Named, Publish, State, names_hold, reenter_hold, takes_over};
use crate::{
    backend::{AcquireReply, Grant, LockKind, Reentry, ReleaseReply, Renew, RenewReply},
    clock::after,
    inspect::{HolderInfo, LockInfo},
    lock_key::LockKey,
};

/// One read-write lock: a writer's holds, each reader's holds with its own lease, and the
/// writers waiting for it.
#[derive(Debug, Default)]
pub(super) struct RwLock {
    writer: Option<(String, u64)>,
    /// When the writer's own lease ends: a reader (the writer itself, after a downgrade)
    /// keeping the lock alive does not keep the write side.
    writer_until: Option<Instant>,
    readers: HashMap<String, (u64, Instant)>,
    /// The lock as a whole lives until the longest lease ends.
    expires: Option<Instant>,
    /// Each hold's attempts, by side and holder: the one that granted it and its last
    /// re-entry's. Readers take holds side by side, so one record for the whole lock could
    /// not tell whose attempt it was.
    attempts: HashMap<(bool, String), (String, String)>,
    /// The lease of each hold, by side and holder: the writer's and each reader's own end is
    /// the latest of its holds'.
    ends: HashMap<(bool, String), HoldEnds>,
    token: Option<u64>,
    waiting_writers: HashMap<String, Instant>,
}

impl RwLock {
    /// Drops expired readers, waiting writers and (when its lease ended) the writer.
    fn purge(&mut self, now: Instant) {
        self.readers.retain(|_, (_, until)| *until > now);
        self.waiting_writers.retain(|_, until| *until > now);
        if self.writer_until.is_some_and(|until| until <= now) {
            self.end_writer();
        }
        let (readers, writer) = (&self.readers, &self.writer);
        let holds = |(write, holder): &(bool, String)| match write {
            true => writer.as_ref().is_some_and(|(w, _)| w == holder),
            false => readers.contains_key(holder),
        };
        self.attempts.retain(|side, _| holds(side));
        self.ends.retain(|side, _| holds(side));
        if self.expires.is_some_and(|until| until <= now) {
            self.end_writer();
            self.readers.clear();
            self.expires = None;
        }
        if self.writer.is_none() && self.readers.is_empty() {
            self.expires = None;
        }
    }

    /// The writer's hold is over: its fencing token goes with it, so the next writer gets a
    /// new one (as the Redis scripts issue one per grant of a free lock).
    fn end_writer(&mut self) {
        self.writer = None;
        self.writer_until = None;
        self.token = None;
    }

    pub(super) fn is_live(&self, now: Instant) -> bool {
        self.expires.is_some_and(|until| until > now)
    }

    fn extend(&mut self, until: Instant) {
        self.expires = Some(self.expires.map_or(until, |current| current.max(until)));
    }

    fn is_idle(&self) -> bool {
        self.writer.is_none() && self.readers.is_empty() && self.waiting_writers.is_empty()
    }

    /// When a refused acquire of the write side (`write`) or the read side looks again at the
    /// latest: when the first thing in its way ends, as `rw_acquire.lua` answers (a holder
    /// that crashed ends without a release, and nothing is published then).
    fn retry(&self, now: Instant, write: bool) -> Option<Duration> {
        let first = match write {
            true => self.readers.values().map(|(_, until)| *until).min(),
            false => self.waiting_writers.values().copied().min(),
        };
        let until = match (self.writer_until, first) {
            (Some(writer), Some(first)) => Some(writer.min(first)),
            (writer, first) => writer.or(first).or(self.expires),
        };
        until.map(|until| until.saturating_duration_since(now))
    }
}

impl State {
    fn rw_entry(&mut self, key: &LockKey, now: Instant) -> &mut RwLock {
        let lock = self.rw.entry(key.as_str().to_owned()).or_default();
        lock.purge(now);
        lock
    }

    pub(super) fn rw_acquire(&mut self, grant: Grant<'_>, now: Instant) -> AcquireReply {
        let holder = grant.holder;
        let lock = self.rw_entry(grant.key, now);
        let is_writer = lock.writer.as_ref().is_some_and(|(w, _)| w == holder);
        let is_reader = lock.readers.contains_key(holder);
        let holds_side = match grant.kind {
            LockKind::Write => is_writer,
            _ => is_reader,
        };
        let write = grant.kind == LockKind::Write;
        let taken_over = lock
            .attempts
            .get(&(write, holder.to_owned()))
            .is_some_and(|(first, last)| takes_over(first, last, grant.supersedes));
        // Only a hold the holder has can be taken over.
        let taken_over = (taken_over && holds_side)
            .then_some(grant.supersedes)
            .flatten();
        let refused = match grant.reentry {
            Reentry::Allowed => false,
            Reentry::Only => !holds_side,
            Reentry::Refused => holds_side && taken_over.is_none(),
        };
        if refused {
            return AcquireReply::Held {
                ttl: lock
                    .expires
                    .map(|until| until.saturating_duration_since(now)),
            };
        }
        let granted = match grant.kind {
            LockKind::Write => {
                if !is_writer && is_reader {
                    return AcquireReply::WouldDeadlock;
                }
                is_writer || (lock.writer.is_none() && lock.readers.is_empty())
            }
            _ => {
                let writer_waiting = lock.waiting_writers.keys().any(|w| w != holder);
                is_reader || is_writer || (lock.writer.is_none() && !writer_waiting)
            }
        };
        if !granted {
            if let (LockKind::Write, Some(timeout)) = (grant.kind, grant.queue) {
                lock.waiting_writers
                    .insert(holder.to_owned(), after(now, timeout));
            }
            return AcquireReply::Held {
                ttl: lock.retry(now, grant.kind == LockKind::Write),
            };
        }
        let until = after(now, grant.lease.duration());
        lock.extend(until);
        let record = lock.attempts.entry((write, holder.to_owned())).or_default();
        let count = match grant.kind {
            LockKind::Write => {
                lock.waiting_writers.remove(holder);
                lock.writer_until = Some(lock.writer_until.map_or(until, |t| t.max(until)));
                &mut lock.writer.get_or_insert_with(|| (holder.to_owned(), 0)).1
            }
            _ => {
                let reader = lock.readers.entry(holder.to_owned()).or_insert((0, until));
                // A re-entry with a shorter lease never cuts the earlier lease short.
                reader.1 = reader.1.max(until);
                &mut reader.0
            }
        };
        reenter_hold(
            count,
            &mut record.0,
            &mut record.1,
            grant.attempt,
            grant.supersedes,
        );
        if *count == 1 {
            // A new hold (or the only one, taken over): its grant is recorded as such.
            grant.attempt.clone_into(&mut record.0);
            record.1.clear();
        }
        let count = *count;
        // Each hold keeps its own lease: a re-entry's ends with it.
        lock.ends
            .entry((write, holder.to_owned()))
            .or_default()
            .add(grant.attempt, taken_over, until);
        let token = match (grant.kind, grant.fencing, lock.token) {
            (LockKind::Write, true, Some(token)) => Some(token),
            (LockKind::Write, true, None) => {
                let token = self.next_token();
                if let Some(lock) = self.rw.get_mut(grant.key.as_str()) {
                    lock.token = Some(token);
                }
                Some(token)
            }
            _ => None,
        };
        AcquireReply::Acquired {
            count,
            token,
            session: 0,
        }
    }

    /// Gives back one hold (every hold, with `all`) of `holder`'s side, if it is the one
    /// `named`; the lease of the hold `hold` took goes with it (`None`, or one not recorded:
    /// the lease that ends first), as `rw_release.lua` does.
    pub(super) fn rw_release(
        &mut self,
        key: &LockKey,
        holder: &str,
        kind: LockKind,
        all: bool,
        (named, hold): (Named<'_>, Option<&str>),
        now: Instant,
    ) -> (ReleaseReply, Publish) {
        let lock = self.rw_entry(key, now);
        let record = (kind == LockKind::Write, holder.to_owned());
        let recorded = lock.attempts.get(&record);
        let recorded = recorded.map(|(grant, reentry)| (grant.as_str(), reentry.as_str()));
        let Some(clears) = named.matches(recorded, all) else {
            return (ReleaseReply::NotHeld, None);
        };
        let count = match kind {
            LockKind::Write => lock
                .writer
                .as_mut()
                .filter(|(w, _)| w == holder)
                .map(|(_, count)| count),
            _ => lock.readers.get_mut(holder).map(|(count, _)| count),
        };
        let Some(count) = count else {
            return (ReleaseReply::NotHeld, None);
        };
        *count = if all { 0 } else { *count - 1 };
        if *count > 0 {
            let remaining = *count;
            if let Some((grant, reentry)) = lock.attempts.get_mut(&record) {
                clears.apply(grant, reentry);
            }
            // The holds left keep the side until the latest of their own leases ends.
            let ends = lock
                .ends
                .get_mut(&record)
                .and_then(|ends| ends.remove(hold));
            if ends.is_none_or(|ends| ends > now) {
                match (kind, ends) {
                    (_, None) => {}
                    (LockKind::Write, ends) => lock.writer_until = ends,
                    (_, Some(ends)) => {
                        if let Some(reader) = lock.readers.get_mut(holder) {
                            reader.1 = ends;
                        }
                    }
                }
                return (ReleaseReply::Decremented { remaining }, None);
            }
            // Every hold left has run out: the holder's side is over.
        }
        lock.attempts.remove(&record);
        lock.ends.remove(&record);
        let publish = Some((key.clone(), None));
        let reply = match kind {
            LockKind::Write => {
                lock.end_writer();
                (ReleaseReply::Released { notified: None }, publish)
            }
            _ => {
                lock.readers.remove(holder);
                if lock.writer.is_some() || !lock.readers.is_empty() {
                    // Others still hold it: nothing for waiters to act on.
                    (ReleaseReply::Released { notified: Some(0) }, None)
                } else {
                    (ReleaseReply::Released { notified: None }, publish)
                }
            }
        };
        lock.purge(now);
        if lock.is_idle() {
            self.rw.remove(key.as_str());
        }
        reply
    }

    pub(super) fn rw_renew(&mut self, renew: &Renew<'_>, now: Instant) -> RenewReply {
        let lock = self.rw_entry(renew.key, now);
        let until = after(now, renew.lease.duration());
        let side = (renew.kind == LockKind::Write, renew.holder.to_owned());
        let (grant, reentry) = lock
            .attempts
            .get(&side)
            .map_or(("", ""), |(grant, reentry)| {
                (grant.as_str(), reentry.as_str())
            });
        if !names_hold(renew, grant, reentry) {
            return RenewReply::NotHeld;
        }
        let held = match renew.kind {
            LockKind::Write => {
                let held = lock.writer.as_ref().is_some_and(|(w, _)| w == renew.holder);
                if held {
                    lock.writer_until = Some(lock.writer_until.map_or(until, |t| t.max(until)));
                }
                held
            }
            _ => match lock.readers.get_mut(renew.holder) {
                Some(reader) => {
                    reader.1 = reader.1.max(until);
                    true
                }
                None => false,
            },
        };
        if !held {
            return RenewReply::NotHeld;
        }
        // A renewal keeps every hold of that side.
        if let Some(ends) = lock.ends.get_mut(&side) {
            ends.renew(until);
        }
        lock.extend(until);
        RenewReply::Renewed
    }

    /// Keeps (or ends, with `timeout` None) a waiting writer's place.
    pub(super) fn rw_wait(
        &mut self,
        key: &LockKey,
        holder: &str,
        timeout: Option<Duration>,
        now: Instant,
    ) -> (RenewReply, Publish) {
        let lock = self.rw_entry(key, now);
        let reply = match timeout {
            None => {
                let left = lock.waiting_writers.remove(holder).is_some();
                let publish = left.then(|| (key.clone(), None));
                (RenewReply::NotHeld, publish)
            }
            Some(timeout) => match lock.waiting_writers.get_mut(holder) {
                Some(until) => {
                    *until = after(now, timeout);
                    (RenewReply::Renewed, None)
                }
                None => (RenewReply::NotHeld, None),
            },
        };
        if lock.is_idle() {
            self.rw.remove(key.as_str());
        }
        reply
    }
}

impl RwLock {
    /// What the lock holds at `now`: its writer and its readers, in the order of their ids.
    fn snapshot(&mut self, now: Instant) -> LockInfo {
        self.purge(now);
        let left = |until: Instant| Some(until.saturating_duration_since(now));
        let mut holders = Vec::new();
        if let Some((writer, count)) = &self.writer {
            let until = self.writer_until.or(self.expires);
            holders.push(HolderInfo::new(
                writer.clone(),
                LockKind::Write,
                *count,
                until.and_then(left),
            ));
        }
        let mut readers: Vec<_> = self.readers.iter().collect();
        readers.sort_by(|a, b| a.0.cmp(b.0));
        for (reader, (count, until)) in readers {
            holders.push(HolderInfo::new(
                reader.clone(),
                LockKind::Read,
                *count,
                left(*until),
            ));
        }
        let mut info = LockInfo::free().with_queue_len(self.waiting_writers.len() as u64);
        info.holders = holders;
        info
    }
}

impl State {
    /// What the read-write lock `key` holds at `now`.
    pub(super) fn rw_inspect(&mut self, key: &LockKey, now: Instant) -> LockInfo {
        self.rw
            .get_mut(key.as_str())
            .map_or_else(LockInfo::free, |lock| lock.snapshot(now))
    }

    /// Drops every hold of the read-write lock `key`, keeping its waiting writers; as
    /// `force_unlock.lua` deletes the lock's hash (and with it the writer's fencing token).
    pub(super) fn rw_force_unlock(&mut self, key: &LockKey, now: Instant) -> (LockInfo, Publish) {
        let Some(lock) = self.rw.get_mut(key.as_str()) else {
            return (LockInfo::free(), None);
        };
        let before = lock.snapshot(now);
        lock.writer = None;
        lock.writer_until = None;
        lock.readers.clear();
        lock.attempts.clear();
        lock.ends.clear();
        lock.expires = None;
        lock.token = None;
        if lock.is_idle() {
            self.rw.remove(key.as_str());
        }
        let publish = before.is_locked().then(|| (key.clone(), None));
        (before, publish)
    }
}
