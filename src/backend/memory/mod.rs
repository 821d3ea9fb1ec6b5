//! The in-process backend.
//!
//! Same semantics as the Redis backend (owner-checked reentrant holds, leases that expire,
//! fencing counters that never go back, hand-off, fair queues with waiter timeouts, read-write
//! locks with a lease per reader, semaphores with a lease per permit, release notifications)
//! for one process. Clones share the same
//! locks, so two [`LockClient`](crate::LockClient)s built on clones of one `MemoryBackend`
//! contend exactly as two processes would on one Redis.

use std::{
    collections::{HashMap, VecDeque},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::time::Instant;

use super::{
    AcquireReply, Backend, Grant, Listener, Listeners, LockKind, Reentry, Release, ReleaseReply,
    Renew, RenewReply,
};
use crate::{
    clock::after,
    error::BackendError,
    inspect::LockInfo,
    lock_key::{KeyMap, LockKey, Shards},
};

mod inspect;
mod rw;
mod semaphore;

/// Locks held in this process. See the [module docs](self).
///
/// ```
/// use tower_lock::{LockClient, MemoryBackend};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_lock::LockError> {
/// let locks = LockClient::builder(MemoryBackend::new()).build().unwrap();
/// let guard = locks.lock("order:42").acquire().await?;
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct MemoryBackend {
    /// The locks, spread over shards by name.
    shards: Arc<Shards<State>>,
    listeners: Arc<Listeners>,
}

impl Default for MemoryBackend {
    fn default() -> Self {
        let tokens = Arc::new(AtomicU64::new(0));
        let shard = || State {
            tokens: tokens.clone(),
            ..State::default()
        };
        Self {
            shards: Arc::new(Shards::new(shard)),
            listeners: Arc::default(),
        }
    }
}

/// One shard of the locks.
#[derive(Debug, Default)]
struct State {
    locks: KeyMap<Entry>,
    /// The last fencing token issued, for any lock: one number for every shard, whatever the
    /// lock names.
    tokens: Arc<AtomicU64>,
    /// Fair locks' waiter queues.
    queues: HashMap<String, FairQueue>,
    /// Read-write locks.
    rw: HashMap<String, rw::RwLock>,
    /// Semaphores.
    semaphores: HashMap<String, semaphore::Semaphore>,
    given_up: HashMap<String, GivenUp>,
}

/// The attempts on one lock whose undo found nothing to undo, as Redis keeps them in the lock's
/// `:void` set: one that still arrives (a copy delivered late) takes nothing. They are all
/// forgotten together, one lease after the last was given up, as the set expires.
#[derive(Debug)]
struct GivenUp {
    attempts: std::collections::HashSet<String>,
    until: Instant,
}

#[derive(Debug)]
struct Entry {
    owner: String,
    count: u64,
    expires: Instant,
    /// The attempt that granted the hold.
    attempt: String,
    /// The last re-entry's attempt.
    reentry: String,
    token: Option<u64>,
    /// Granted by a fair acquire (for [`Backend::inspect`]).
    fair: bool,
}

/// Waiters of a fair lock, oldest first, each with the time its place expires.
#[derive(Debug, Default)]
struct FairQueue {
    order: VecDeque<String>,
    timeouts: HashMap<String, Instant>,
}

impl FairQueue {
    fn purge(&mut self, now: Instant) {
        self.timeouts.retain(|_, until| *until > now);
        let timeouts = &self.timeouts;
        self.order.retain(|waiter| timeouts.contains_key(waiter));
    }

    fn remove(&mut self, holder: &str) {
        self.timeouts.remove(holder);
        self.order.retain(|waiter| waiter != holder);
    }
}

/// What a release should publish, decided under the state lock and sent after it: on the
/// channel of which lock, and what (`None`: "released").
type Publish = Option<(LockKey, Option<String>)>;

/// The hold a release of a read-write side or a semaphore permit names.
#[derive(Clone, Copy, Debug)]
pub(super) enum Named<'a> {
    /// Any hold of the holder.
    Any,
    /// The hold this attempt granted: nothing is given back once the holder took the lock
    /// anew, and the record stays while holds remain.
    Grant(&'a str),
    /// The undo of this attempt: its grant or, for one hold, its last re-entry; the record it
    /// matched goes.
    Undo(&'a str),
}

/// Which record of a hold a release clears.
#[derive(Clone, Copy, Debug)]
pub(super) enum Clears {
    Nothing,
    Grant,
    Reentry,
}

impl Clears {
    /// Clears that record of a hold recorded as `grant` and `reentry`.
    pub(super) fn apply(self, grant: &mut String, reentry: &mut String) {
        match self {
            Self::Nothing => {}
            Self::Grant => grant.clear(),
            Self::Reentry => reentry.clear(),
        }
    }
}

/// The lease of each hold of one side of a holder (a read-write lock's side, a semaphore's
/// permit): the attempt that took it and when its lease ends, in the order the holds were
/// taken; as `hold_ends` in the scripts' prelude. The holder's own end is the latest of them.
#[derive(Debug, Default)]
pub(super) struct HoldEnds(Vec<(String, Instant)>);

impl HoldEnds {
    /// The hold `attempt` took, or else the one whose lease ends first (the first such).
    fn at(&self, attempt: Option<&str>) -> Option<usize> {
        let mut at: Option<usize> = None;
        for (index, (took, until)) in self.0.iter().enumerate() {
            if attempt == Some(took.as_str()) {
                return Some(index);
            }
            if at.is_none_or(|first| *until < self.0[first].1) {
                at = Some(index);
            }
        }
        at
    }

    /// A hold `attempt` took until `until`: a new one, or with `taken_over` (an earlier
    /// attempt recorded as having taken a hold) that hold, whose lease ends at the later end.
    pub(super) fn add(&mut self, attempt: &str, taken_over: Option<&str>, until: Instant) {
        match taken_over.and_then(|earlier| self.at(Some(earlier))) {
            Some(at) => {
                let hold = &mut self.0[at];
                attempt.clone_into(&mut hold.0);
                hold.1 = hold.1.max(until);
            }
            None => self.0.push((attempt.to_owned(), until)),
        }
    }

    /// Every hold lives until at least `until`.
    pub(super) fn renew(&mut self, until: Instant) {
        for hold in &mut self.0 {
            hold.1 = hold.1.max(until);
        }
    }

    /// Gives back the hold `attempt` took (or else the one that ends first): the latest end of
    /// the holds left, if any.
    pub(super) fn remove(&mut self, attempt: Option<&str>) -> Option<Instant> {
        if let Some(at) = self.at(attempt) {
            self.0.remove(at);
        }
        self.0.iter().map(|(_, until)| *until).max()
    }
}

/// Whether `supersedes`, an earlier attempt of an acquisition whose reply was lost, is a
/// hold's grant or last re-entry (its records): it took that hold, and the attempt that
/// supersedes it takes the hold over instead of adding one (the scripts' `recorded`).
pub(super) fn takes_over(grant: &str, reentry: &str, supersedes: Option<&str>) -> bool {
    supersedes
        .is_some_and(|earlier| !earlier.is_empty() && (grant == earlier || reentry == earlier))
}

/// One more grant of a hold to `attempt`, recorded as the scripts' `reenter` does: when
/// `supersedes` is the hold's grant, `attempt` is the grant now; when it is the last re-entry,
/// `attempt` is (and, for the holder's only hold, the grant too); otherwise the hold gains
/// one, with `attempt` as its last re-entry.
pub(super) fn reenter_hold(
    count: &mut u64,
    grant: &mut String,
    reentry: &mut String,
    attempt: &str,
    supersedes: Option<&str>,
) {
    if !takes_over(grant, reentry, supersedes) {
        *count += 1;
    } else if supersedes == Some(grant.as_str()) {
        attempt.clone_into(grant);
        return;
    } else if *count == 1 {
        attempt.clone_into(grant);
    }
    attempt.clone_into(reentry);
}

/// Whether `renew` names the holder's holds, recorded as granted by `grant` and last
/// re-entered by `reentry` (or names none, as an empty attempt does on Redis too): a renewal
/// extends nothing of a hold the holder took anew (see prelude.lua's `holds_named`).
pub(super) fn names_hold(renew: &Renew<'_>, grant: &str, reentry: &str) -> bool {
    renew
        .attempt
        .is_none_or(|attempt| attempt.is_empty() || attempt == grant || attempt == reentry)
}

impl Named<'_> {
    /// Whether a hold recorded as `(grant, reentry)` (none: `None`) is the one named, and
    /// which of its records a release of `all` or one of its holds then clears.
    pub(super) fn matches(self, records: Option<(&str, &str)>, all: bool) -> Option<Clears> {
        let (grant, reentry) = records.unwrap_or_default();
        match self {
            Self::Any => Some(Clears::Nothing),
            Self::Grant(attempt) => (grant == attempt).then_some(Clears::Nothing),
            Self::Undo(attempt) if grant == attempt => Some(Clears::Grant),
            Self::Undo(attempt) if !all && reentry == attempt => Some(Clears::Reentry),
            Self::Undo(_) => None,
        }
    }
}

impl MemoryBackend {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many locks are currently held (expired ones not counted).
    pub fn held_count(&self) -> usize {
        let now = Instant::now();
        self.shards
            .each()
            .map(|state| {
                state.locks.values().filter(|e| e.expires > now).count()
                    + state.rw.values().filter(|l| l.is_live(now)).count()
                    + state
                        .semaphores
                        .values()
                        .filter(|s| s.holders().values().any(|permit| permit.until > now))
                        .count()
            })
            .sum()
    }

    /// A release, done at once: the in-memory store never waits.
    fn release_sync(&self, release: Release<'_>) -> ReleaseReply {
        let now = Instant::now();
        let (reply, publish) = {
            let mut state = self.lock(release.key);
            match release.kind {
                LockKind::Read | LockKind::Write => state.rw_release(
                    release.key,
                    release.holder,
                    release.kind,
                    release.all,
                    (
                        release.attempt.map_or(Named::Any, Named::Grant),
                        release.hold,
                    ),
                    now,
                ),
                LockKind::Semaphore => state.sem_release(
                    release.key,
                    release.holder,
                    release.all,
                    (
                        release.attempt.map_or(Named::Any, Named::Grant),
                        release.hold,
                    ),
                    now,
                ),
                _ => state.release_owned(release, now),
            }
        };
        let notified = self.publish(publish);
        match reply {
            ReleaseReply::Released { .. } => ReleaseReply::Released { notified },
            other => other,
        }
    }

    /// The shard that keeps the lock `key`.
    fn lock(&self, key: &LockKey) -> std::sync::MutexGuard<'_, State> {
        self.shards.of(key)
    }

    fn publish(&self, publish: Publish) -> Option<u64> {
        publish.map(|(key, payload)| {
            // Nobody listens on any lock (the uncontended case): no channel name to build.
            if self.listeners.is_empty() {
                return 0;
            }
            let payload = payload.as_deref().unwrap_or("released");
            self.listeners.notify(&channel(&key), payload)
        })
    }
}

/// The channel a lock's releases are announced on (the same name for every backend).
fn channel(key: &LockKey) -> String {
    key.derived(":released")
}

impl State {
    /// Whether `attempt` on `key` was given up on before it took anything.
    fn was_given_up(&mut self, key: &LockKey, attempt: &str, now: Instant) -> bool {
        if self.given_up.is_empty() {
            return false;
        }
        match self.given_up.get(key.as_str()) {
            Some(given_up) if given_up.until <= now => {
                self.given_up.remove(key.as_str());
                false
            }
            Some(given_up) => given_up.attempts.contains(attempt),
            None => false,
        }
    }

    /// Remembers that `attempt` on `key` was given up on, for at least `lease` from `now`.
    /// (Undos are rare: each sweeps what has run out.)
    fn give_up(&mut self, key: &LockKey, attempt: &str, now: Instant, lease: Duration) {
        self.given_up.retain(|_, given_up| given_up.until > now);
        let until = after(now, lease);
        let given_up = self
            .given_up
            .entry(key.as_str().to_owned())
            .or_insert_with(|| GivenUp {
                attempts: std::collections::HashSet::new(),
                until,
            });
        given_up.attempts.insert(attempt.to_owned());
        given_up.until = given_up.until.max(until);
    }

    /// The live entry for `key`, dropping it first if its lease ran out.
    fn live(&mut self, key: &LockKey, now: Instant) -> Option<&mut Entry> {
        if self.locks.get(key)?.expires <= now {
            self.locks.remove(key);
            return None;
        }
        self.locks.get_mut(key)
    }

    /// A new fencing token: the wall clock in milliseconds times 1000, or one more than the
    /// last token when that is higher, as the Redis backend issues them (strictly rising in
    /// this store, across all locks).
    fn next_token(&mut self) -> u64 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| {
                u64::try_from(since.as_millis()).unwrap_or(u64::MAX / 1000)
            });
        let next = |last: u64| (now * 1000).max(last + 1);
        // The closure always gives a value: the update cannot fail.
        let last = self
            .tokens
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |last| Some(next(last)))
            .unwrap_or_else(|last| last);
        next(last)
    }

    fn grant(&mut self, grant: Grant<'_>, now: Instant) -> Option<u64> {
        let token = grant.fencing.then(|| self.next_token());
        self.locks.insert(
            grant.key.clone(),
            Entry {
                owner: grant.holder.to_owned(),
                count: 1,
                expires: after(now, grant.lease.duration()),
                attempt: grant.attempt.to_owned(),
                reentry: String::new(),
                token,
                fair: grant.kind == LockKind::Fair,
            },
        );
        token
    }

    /// Re-entry of the current owner, unless the grant refuses it.
    fn reenter(&mut self, grant: Grant<'_>, now: Instant) -> Option<AcquireReply> {
        let entry = self
            .live(grant.key, now)
            .filter(|e| e.owner == grant.holder)?;
        let taken_over = takes_over(&entry.attempt, &entry.reentry, grant.supersedes);
        if grant.reentry == Reentry::Refused && !taken_over {
            return None;
        }
        reenter_hold(
            &mut entry.count,
            &mut entry.attempt,
            &mut entry.reentry,
            grant.attempt,
            grant.supersedes,
        );
        entry.expires = match entry.count {
            // The only hold: its lease is this grant's.
            1 => after(now, grant.lease.duration()),
            // A re-entry with a shorter lease never cuts the earlier lease short.
            _ => entry.expires.max(after(now, grant.lease.duration())),
        };
        let (count, existing) = (entry.count, entry.token);
        let token = match (grant.fencing, existing) {
            (false, _) => None,
            (true, Some(token)) => Some(token),
            (true, None) => {
                let token = self.next_token();
                if let Some(entry) = self.locks.get_mut(grant.key) {
                    entry.token = Some(token);
                }
                Some(token)
            }
        };
        Some(AcquireReply::Acquired {
            count,
            token,
            session: 0,
        })
    }

    fn acquire_exclusive(&mut self, grant: Grant<'_>, now: Instant) -> AcquireReply {
        // A lock nobody holds (the common case): granted after one lookup.
        if grant.reentry != Reentry::Only && !self.locks.contains_key(grant.key) {
            let token = self.grant(grant, now);
            return AcquireReply::Acquired {
                count: 1,
                token,
                session: 0,
            };
        }
        if let Some(reply) = self.reenter(grant, now) {
            return reply;
        }
        match self.live(grant.key, now) {
            Some(entry) => AcquireReply::Held {
                ttl: Some(entry.expires.saturating_duration_since(now)),
            },
            None if grant.reentry == Reentry::Only => AcquireReply::Held { ttl: None },
            None => {
                let token = self.grant(grant, now);
                AcquireReply::Acquired {
                    count: 1,
                    token,
                    session: 0,
                }
            }
        }
    }

    fn acquire_fair(&mut self, grant: Grant<'_>, now: Instant) -> AcquireReply {
        let name = grant.key.as_str();
        if grant.reentry == Reentry::Only {
            return self.reenter(grant, now).unwrap_or(AcquireReply::Held {
                ttl: self
                    .live(grant.key, now)
                    .map(|e| e.expires.saturating_duration_since(now)),
            });
        }
        let queue = self.queues.entry(name.to_owned()).or_default();
        queue.purge(now);
        if let Some(reply) = self.reenter(grant, now) {
            return reply;
        }
        let held = self
            .live(grant.key, now)
            .map(|e| e.expires.saturating_duration_since(now));
        let queue = self.queues.entry(name.to_owned()).or_default();
        let head = queue.order.front().cloned();
        let first = head.as_deref().is_none_or(|head| head == grant.holder);
        if held.is_none() && first {
            queue.remove(grant.holder);
            let token = self.grant(grant, now);
            return AcquireReply::Acquired {
                count: 1,
                token,
                session: 0,
            };
        }
        if let Some(timeout) = grant.queue {
            if !queue.timeouts.contains_key(grant.holder) {
                queue.order.push_back(grant.holder.to_owned());
            }
            queue
                .timeouts
                .insert(grant.holder.to_owned(), after(now, timeout));
        }
        let ttl = held.or_else(|| {
            let head = head?;
            Some(queue.timeouts.get(&head)?.saturating_duration_since(now))
        });
        AcquireReply::Held { ttl }
    }

    fn release_owned(&mut self, release: Release<'_>, now: Instant) -> (ReleaseReply, Publish) {
        let owned = |e: &&mut Entry| {
            e.owner == release.holder && release.attempt.is_none_or(|a| a == e.attempt)
        };
        let Some(entry) = self.live(release.key, now).filter(owned) else {
            return (ReleaseReply::NotHeld, None);
        };
        entry.count = if release.all { 0 } else { entry.count - 1 };
        if entry.count > 0 {
            let remaining = entry.count;
            return (ReleaseReply::Decremented { remaining }, None);
        }
        self.locks.remove(release.key);
        if let Some(next) = release.handoff {
            let token = self.grant(next, now);
            return (ReleaseReply::HandedOff { token }, None);
        }
        let publish = self.freed(release.key, release.kind, now);
        (ReleaseReply::Released { notified: None }, publish)
    }

    /// The wake-up for `key`, just freed: a fair lock wakes the head of its queue (each fair
    /// waiter listens for its own turn), any other lock every listener.
    fn freed(&mut self, key: &LockKey, kind: LockKind, now: Instant) -> Publish {
        let head = match kind {
            LockKind::Fair => self.queues.get_mut(key.as_str()).and_then(|queue| {
                queue.purge(now);
                queue.order.front().cloned()
            }),
            _ => None,
        };
        Some((key.clone(), head))
    }

    /// Keeps (or ends, with `timeout` None) a fair waiter's place.
    fn fair_wait(
        &mut self,
        key: &LockKey,
        holder: &str,
        timeout: Option<Duration>,
        now: Instant,
    ) -> (RenewReply, Publish) {
        let name = key.as_str();
        let free = self.live(key, now).is_none();
        let Some(queue) = self.queues.get_mut(name) else {
            return (RenewReply::NotHeld, None);
        };
        let head_before = queue.order.front().cloned();
        queue.purge(now);
        if timeout.is_none() {
            queue.remove(holder);
        }
        let head = queue.order.front().cloned();
        let publish = match &head {
            Some(head) if free && head_before.as_ref() != Some(head) => {
                Some((key.clone(), Some(head.clone())))
            }
            _ => None,
        };
        let reply = match timeout {
            Some(timeout) if queue.timeouts.contains_key(holder) => {
                queue
                    .timeouts
                    .insert(holder.to_owned(), after(now, timeout));
                if free && head.as_deref() == Some(holder) {
                    RenewReply::Ready
                } else {
                    RenewReply::Renewed
                }
            }
            _ => RenewReply::NotHeld,
        };
        if queue.order.is_empty() {
            self.queues.remove(name);
        }
        (reply, publish)
    }

    /// Renews one hold or waiter place; what it must announce goes to `publish`.
    fn renew(&mut self, renew: &Renew<'_>, now: Instant, publish: &mut Vec<Publish>) -> RenewReply {
        match (renew.kind, renew.queued) {
            (LockKind::Fair, true) => {
                let (reply, announce) =
                    self.fair_wait(renew.key, renew.holder, Some(renew.lease.duration()), now);
                publish.push(announce);
                reply
            }
            (LockKind::Write, true) => {
                self.rw_wait(renew.key, renew.holder, Some(renew.lease.duration()), now)
                    .0
            }
            (LockKind::Read | LockKind::Write, false) => self.rw_renew(renew, now),
            (LockKind::Semaphore, _) => self.sem_renew(renew, now),
            _ => match self.live(renew.key, now) {
                Some(entry)
                    if entry.owner == renew.holder
                        && names_hold(renew, &entry.attempt, &entry.reentry) =>
                {
                    entry.expires = entry.expires.max(after(now, renew.lease.duration()));
                    RenewReply::Renewed
                }
                _ => RenewReply::NotHeld,
            },
        }
    }
}

impl Backend for MemoryBackend {
    type Listener = Listener;

    async fn acquire(&self, grant: Grant<'_>) -> Result<AcquireReply, BackendError> {
        let now = Instant::now();
        let mut state = self.lock(grant.key);
        if state.was_given_up(grant.key, grant.attempt, now) {
            return Ok(AcquireReply::Held { ttl: None });
        }
        Ok(match grant.kind {
            LockKind::Fair => state.acquire_fair(grant, now),
            LockKind::Read | LockKind::Write => state.rw_acquire(grant, now),
            LockKind::Semaphore => state.sem_acquire(grant, now),
            _ => state.acquire_exclusive(grant, now),
        })
    }

    async fn release(&self, release: Release<'_>) -> Result<ReleaseReply, BackendError> {
        Ok(self.release_sync(release))
    }

    fn release_now(&self, release: Release<'_>) -> Option<Result<ReleaseReply, BackendError>> {
        Some(Ok(self.release_sync(release)))
    }

    async fn renew(&self, renewals: &[Renew<'_>]) -> Result<Vec<RenewReply>, BackendError> {
        let now = Instant::now();
        let mut publish = Vec::new();
        // One shard at a time, each for one renewal.
        let replies = renewals
            .iter()
            .map(|renew| self.lock(renew.key).renew(renew, now, &mut publish))
            .collect();
        for announce in publish {
            self.publish(announce);
        }
        Ok(replies)
    }

    async fn abandon(&self, grant: Grant<'_>) -> Result<bool, BackendError> {
        let now = Instant::now();
        let (undone, publish) = {
            let mut state = self.lock(grant.key);
            if matches!(grant.kind, LockKind::Read | LockKind::Write) {
                let (reply, publish) = state.rw_release(
                    grant.key,
                    grant.holder,
                    grant.kind,
                    false,
                    (Named::Undo(grant.attempt), Some(grant.attempt)),
                    now,
                );
                (reply != ReleaseReply::NotHeld, publish)
            } else if grant.kind == LockKind::Semaphore {
                let (reply, publish) = state.sem_release(
                    grant.key,
                    grant.holder,
                    false,
                    (Named::Undo(grant.attempt), Some(grant.attempt)),
                    now,
                );
                (reply != ReleaseReply::NotHeld, publish)
            } else {
                match state
                    .live(grant.key, now)
                    .filter(|e| e.owner == grant.holder)
                {
                    Some(entry)
                        if entry.reentry == grant.attempt || entry.attempt == grant.attempt =>
                    {
                        entry.count -= 1;
                        match entry.reentry == grant.attempt {
                            true => entry.reentry.clear(),
                            false => entry.attempt.clear(),
                        }
                        if entry.count == 0 {
                            state.locks.remove(grant.key);
                            (true, state.freed(grant.key, grant.kind, now))
                        } else {
                            (true, None)
                        }
                    }
                    _ => (false, None),
                }
            }
        };
        if !undone {
            self.lock(grant.key)
                .give_up(grant.key, grant.attempt, now, grant.lease.duration());
        }
        self.publish(publish);
        Ok(undone)
    }

    async fn leave(&self, key: &LockKey, holder: &str, kind: LockKind) -> Result<(), BackendError> {
        let now = Instant::now();
        let publish = {
            let mut state = self.lock(key);
            match kind {
                LockKind::Fair => state.fair_wait(key, holder, None, now).1,
                LockKind::Write => state.rw_wait(key, holder, None, now).1,
                _ => None,
            }
        };
        self.publish(publish);
        Ok(())
    }

    async fn listen(
        &self,
        key: &LockKey,
        only_for: Option<&str>,
    ) -> Result<Listener, BackendError> {
        Ok(self.listeners.add(channel(key), only_for).0)
    }

    async fn inspect(&self, key: &LockKey, kind: LockKind) -> Result<LockInfo, BackendError> {
        Ok(self.lock(key).inspect(key, kind, Instant::now()))
    }

    async fn force_unlock(&self, key: &LockKey, kind: LockKind) -> Result<LockInfo, BackendError> {
        let (before, publish) = self.lock(key).force_unlock(key, kind, Instant::now());
        self.publish(publish);
        Ok(before)
    }
}
