//! What one client holds and waits for, per key.
//!
//! Waiters of one key in this client form a FIFO queue. Only the head contends in the backend,
//! and only while no local holder has the lock: when the lock is held here, the head simply waits
//! for the holder to hand it over. A release wakes (or hands the lock to) the head alone, so a hot
//! key costs one backend round trip per hand-off instead of one per waiter, and the connections
//! and subscriptions used do not grow with the number of waiters.

use std::{
    collections::VecDeque,
    sync::{Arc, MutexGuard},
    time::Duration,
};

use tokio::{
    sync::{Notify, oneshot},
    time::Instant,
};

use crate::{
    backend::{LockKind, store::Grant},
    clock::BootInstant,
    error::LockError,
    holder::Holder,
    lease::Lease,
    lock_key::{KeyMap, LockKey, Shards},
};

use super::{
    held::{Check, Held},
    place::Queued,
};

/// The per-key state of one client.
pub(crate) struct Table<L> {
    /// The keys' states, spread over shards by name.
    shards: Shards<Keys<L>>,
}

/// One shard of the table.
type Keys<L> = KeyMap<KeyState<L>>;

/// How long waiters seen in other processes keep the hand-off streak short: one release that
/// reached none of them (between an attempt and a subscription, say) must not lengthen it.
pub(crate) const CONTENDED_FOR: Duration = Duration::from_secs(1);

struct KeyState<L> {
    held: Vec<Arc<Held>>,
    waiters: VecDeque<Slot>,
    /// Hand-offs in flight: the lock is on its way to a local waiter.
    handing_off: u32,
    /// Consecutive hand-offs without a real release.
    streak: u32,
    /// Until when waiters in other processes count as present ([`CONTENDED_FOR`]).
    contended_until: Option<Instant>,
    /// The release listener, shared by whichever waiter is head.
    listener: Option<Arc<L>>,
    /// After a streak, local waiters hold back until then: other processes' go first.
    yield_until: Option<Instant>,
}

impl<L> Default for KeyState<L> {
    fn default() -> Self {
        Self {
            held: Vec::new(),
            waiters: VecDeque::new(),
            handing_off: 0,
            streak: 0,
            contended_until: None,
            listener: None,
            yield_until: None,
        }
    }
}

impl<L> KeyState<L> {
    /// Whether an exclusive lock of this name is held (or being handed over) here.
    fn held_here(&self) -> bool {
        self.handing_off > 0
            || self.held.iter().any(|held| {
                matches!(held.kind, LockKind::Exclusive | LockKind::Fair) && !held.is_marked_lost()
            })
    }

    fn is_idle(&self) -> bool {
        self.held.is_empty() && self.waiters.is_empty() && self.handing_off == 0
    }

    fn wake_head(&self) {
        if let Some(head) = self.waiters.front() {
            head.wake.notify_one();
        }
    }

    /// A semaphore waiter left position `left`: the one that moved into the contenders contends.
    fn wake_new_contender(&self, left: usize) {
        let Some(front) = self.waiters.front() else {
            return;
        };
        if front.want.kind != LockKind::Semaphore {
            return;
        }
        let window = contenders(&front.want);
        if left < window
            && let Some(entered) = self.waiters.get(window - 1)
        {
            entered.wake.notify_one();
        }
    }
}

/// How many of a key's first waiters of a semaphore contend at once: its permits.
fn contenders(want: &Want) -> usize {
    usize::try_from(want.permits).unwrap_or(usize::MAX).max(1)
}

/// What a waiter asks for.
#[derive(Clone, Debug)]
pub(crate) struct Want {
    pub(crate) holder: Holder,
    pub(crate) attempt: Arc<str>,
    pub(crate) kind: LockKind,
    pub(crate) lease: Lease,
    pub(crate) fencing: bool,
    /// A semaphore's permits (0 for the other kinds).
    pub(crate) permits: u32,
    /// A read: the write grant its holder holds on the lock, which the read nests in.
    pub(crate) within: Option<Arc<str>>,
}

impl Want {
    /// The same request under a new attempt id, after this attempt failed or was spent.
    pub(crate) fn retry(&self, attempt: Arc<str>) -> Self {
        Self { attempt, ..self.clone() }
    }

    /// The store's grant for this waiter.
    pub(crate) fn grant<'a>(&'a self, key: &'a LockKey, queue: Option<Duration>) -> Grant<'a> {
        Grant {
            key,
            holder: self.holder.id(),
            attempt: &self.attempt,
            lease: self.lease,
            fencing: self.fencing,
            kind: self.kind,
            queue,
            contended: false,
            permits: self.permits,
            within: self.within.as_deref(),
        }
    }
}

/// A queued waiter, with what it asks for and where to deliver a hand-off.
pub(crate) struct Slot {
    id: u64,
    pub(crate) want: Arc<Want>,
    handoff: oneshot::Sender<Handoff>,
    wake: Arc<Notify>,
    /// Its place in a backend queue, kept alive by the watchdog.
    queued: Option<Arc<Queued>>,
    /// `want` was replaced ([`rename`](Self::rename)): its next turn to contend says so.
    renamed: bool,
}

/// A waiter's place in the queue, held by its acquire future.
pub(crate) struct Ticket {
    pub(crate) wake: Arc<Notify>,
    pub(crate) handoff: oneshot::Receiver<Handoff>,
    pub(crate) queued: Option<Arc<Queued>>,
}

/// What a holder holds of a lock that its next acquire must know ([`Table::find`]).
#[derive(Debug)]
pub(crate) enum Found {
    /// A grant the acquire re-enters.
    Reenter(Arc<Held>),
    /// A read side: a write would wait for itself.
    Upgrade,
    /// A write grant a read nests in.
    Within(Arc<str>),
}

/// What a waiter should do next.
#[derive(Debug)]
pub(crate) enum Turn {
    /// Try the backend; under a new attempt when one is given (a hand-off to the waiter's own
    /// had an unknown outcome, and its undo may still be on its way).
    Contend(Option<Arc<Want>>),
    /// Wait: the lock is held here or another waiter is ahead (the holder's lease left).
    Park(Option<Duration>),
    /// Wait this long before contending: other processes have their turn.
    Yield(Duration),
    /// A holder is handing the lock over to this waiter right now.
    AwaitHandoff,
}

impl<L> Default for Table<L> {
    fn default() -> Self {
        Self { shards: Shards::default() }
    }
}

impl<L> Table<L> {
    /// The shard that keeps the state of the lock `key`.
    fn keys(&self, key: &LockKey) -> MutexGuard<'_, Keys<L>> {
        self.shards.of(key)
    }

    /// Every shard in turn, for what looks at all keys.
    fn all_keys(&self) -> impl Iterator<Item = MutexGuard<'_, Keys<L>>> {
        self.shards.each()
    }

    /// How many live holds the holder `holder_id` has here of its grant of `kind` of `key`.
    pub(crate) fn hold_count(&self, key: &LockKey, holder_id: &str, kind: LockKind) -> Option<u64> {
        let keys = self.keys(key);
        let held = keys.get(key)?.held.iter().find(|held| {
            held.holder.id() == holder_id && !held.is_ended() && kind.reenters(held.kind)
        })?;
        Some(held.hold_count() as u64)
    }

    /// Whether `holder` holds the lock `key` here (of any kind).
    pub(crate) fn holds(&self, key: &LockKey, holder: &Holder) -> bool {
        let keys = self.keys(key);
        keys.get(key).is_some_and(|state| {
            state.held.iter().any(|held| held.holder == *holder && !held.is_ended())
        })
    }

    /// What `holder` holds here of the lock `key` that its acquire of `kind` must know.
    pub(crate) fn find(&self, key: &LockKey, holder: &Holder, kind: LockKind) -> Option<Found> {
        let keys = self.keys(key);
        let mine =
            keys.get(key)?.held.iter().filter(|held| {
                held.holder == *holder && !held.is_marked_lost() && !held.is_ended()
            });
        let mut found = None;
        for held in mine {
            if kind.reenters(held.kind) {
                return Some(Found::Reenter(held.clone()));
            }
            found = match (kind, held.kind) {
                (LockKind::Write, LockKind::Read) => Some(Found::Upgrade),
                (LockKind::Read, LockKind::Write) => Some(Found::Within(held.grant().clone())),
                _ => found,
            };
        }
        found
    }

    /// Queues a waiter. With `queue_timeout`, it keeps a place in the backend's queue, which
    /// the watchdog keeps alive.
    ///
    /// # Errors
    /// [`LockError::TooManyWaiters`] when `max_waiters` already wait for the key.
    pub(crate) fn join(
        &self,
        id: u64,
        key: &LockKey,
        want: Arc<Want>,
        queue_timeout: Option<Duration>,
        max_waiters: usize,
    ) -> Result<Ticket, LockError> {
        let mut keys = self.keys(key);
        let state = state_of(&mut keys, key);
        if state.waiters.len() >= max_waiters {
            return Err(LockError::TooManyWaiters);
        }
        let (tx, rx) = oneshot::channel();
        let wake = Arc::new(Notify::new());
        let queued = queue_timeout.map(|timeout| {
            Queued::new(key.clone(), want.holder.clone(), want.kind, timeout, wake.clone())
        });
        let slot = Slot {
            id,
            want,
            handoff: tx,
            wake: wake.clone(),
            queued: queued.clone(),
            renamed: false,
        };
        state.waiters.push_back(slot);
        Ok(Ticket { wake, handoff: rx, queued })
    }

    /// Replaces what waiter `id` asks for (a new attempt id after a failed attempt).
    pub(crate) fn set_want(&self, key: &LockKey, id: u64, want: Arc<Want>) {
        let mut keys = self.keys(key);
        let slot =
            keys.get_mut(key).and_then(|state| state.waiters.iter_mut().find(|slot| slot.id == id));
        if let Some(slot) = slot {
            slot.want = want;
        }
    }

    /// Decides what waiter `id` does next.
    pub(crate) fn turn(&self, key: &LockKey, id: u64) -> Turn {
        let mut keys = self.keys(key);
        let Some(state) = keys.get_mut(key) else {
            return Turn::AwaitHandoff;
        };
        match state.waiters.iter().position(|slot| slot.id == id) {
            None => Turn::AwaitHandoff,
            // A semaphore's first `permits` waiters contend, each on its own: a permit given
            // back wakes at most that many, and as many as could be granted at once try.
            Some(pos) if state.waiters[pos].want.kind == LockKind::Semaphore => {
                if pos < contenders(&state.waiters[pos].want) {
                    state.waiters[pos].contend()
                } else {
                    Turn::Park(None)
                }
            }
            // Fair and read-write waiters each contend; the backend orders them.
            Some(pos) if state.waiters[pos].want.kind != LockKind::Exclusive => {
                state.waiters[pos].contend()
            }
            Some(0) if !state.held_here() => match state.yield_until.take() {
                Some(until) if until > Instant::now() => {
                    state.yield_until = Some(until);
                    Turn::Yield(until - Instant::now())
                }
                _ => state.waiters[0].contend(),
            },
            Some(_) => Turn::Park(
                state.held.iter().find(|held| !held.is_marked_lost()).map(|held| held.remaining()),
            ),
        }
    }

    /// Waiter `id` acquired the lock in the backend.
    pub(crate) fn acquired(&self, key: &LockKey, id: u64, held: Arc<Held>) {
        let mut keys = self.keys(key);
        let state = state_of(&mut keys, key);
        if let Some(pos) = state.waiters.iter().position(|slot| slot.id == id) {
            state.waiters.remove(pos);
            state.wake_new_contender(pos);
        }
        state.held.push(held);
        state.streak = 0;
        if state.waiters.is_empty() {
            state.listener = None;
            state.yield_until = None;
        }
    }

    /// Waiter `id` leaves the queue (timed out, failed or dropped).
    pub(crate) fn leave(&self, key: &LockKey, id: u64) {
        let mut keys = self.keys(key);
        let Some(state) = keys.get_mut(key) else {
            return;
        };
        let Some(pos) = state.waiters.iter().position(|slot| slot.id == id) else {
            return;
        };
        state.waiters.remove(pos);
        if pos == 0 {
            state.wake_head();
        }
        state.wake_new_contender(pos);
        if state.waiters.is_empty() {
            state.listener = None;
            state.yield_until = None;
        }
        if state.is_idle() {
            keys.remove(key);
        }
    }

    /// The listener the head waits on, if there is one yet.
    pub(crate) fn listener(&self, key: &LockKey) -> Option<Arc<L>> {
        self.keys(key).get(key)?.listener.clone()
    }

    /// Stores a new listener for `key` while it has waiters; returns the one to use.
    pub(crate) fn set_listener(&self, key: &LockKey, listener: L) -> Arc<L> {
        let listener = Arc::new(listener);
        let mut keys = self.keys(key);
        match keys.get_mut(key) {
            Some(state) if !state.waiters.is_empty() => {
                state.listener.get_or_insert(listener).clone()
            }
            _ => listener,
        }
    }

    /// The entry `held` ended: it leaves the table (renewal stops at once), and the head waiter
    /// is taken for a hand-off when the grant is a plain lock's. Once `max_streak` hand-offs
    /// happened in a row (eight times as many while no other process was seen waiting in the
    /// last second) it takes none and says the local waiters should yield (the second value).
    pub(crate) fn ended(&self, held: &Arc<Held>, max_streak: u32) -> (Option<Slot>, bool) {
        let mut keys = self.keys(&held.key);
        let Some(state) = keys.get_mut(&held.key) else {
            return (None, false);
        };
        let before = state.held.len();
        state.held.retain(|other| !Arc::ptr_eq(other, held));
        // Hand off only a lock this entry still holds (a lost one may already be another's),
        // and only between exclusive holders.
        let exclusive_next =
            state.waiters.front().is_some_and(|slot| slot.want.kind == LockKind::Exclusive);
        if state.held.len() == before
            || held.kind != LockKind::Exclusive
            || !exclusive_next
            || held.is_lost_at(BootInstant::now())
        {
            return (None, false);
        }
        let limit = if state.contended_until.is_some_and(|until| until > Instant::now()) {
            max_streak
        } else {
            max_streak.saturating_mul(8)
        };
        if state.streak >= limit {
            return (None, true);
        }
        state.handing_off += 1;
        state.streak += 1;
        (state.waiters.pop_front(), false)
    }

    /// A hand-off succeeded: `held` is now held here for the waiter.
    pub(crate) fn handed_off(&self, held: Arc<Held>) {
        let mut keys = self.keys(&held.key);
        let state = state_of(&mut keys, &held.key);
        state.handing_off = state.handing_off.saturating_sub(1);
        state.held.push(held);
        if state.waiters.is_empty() {
            state.listener = None;
            state.yield_until = None;
        }
    }

    /// A hand-off did not happen: the waiter goes back to the head of the queue and re-checks,
    /// unless it gave up meanwhile (a dead head would hold back every waiter behind it).
    pub(crate) fn restore(&self, key: &LockKey, slot: Slot) {
        let mut keys = self.keys(key);
        let state = state_of(&mut keys, key);
        state.handing_off = state.handing_off.saturating_sub(1);
        if slot.handoff.is_closed() {
            state.wake_head();
            if state.is_idle() {
                keys.remove(key);
            }
            return;
        }
        slot.wake.notify_one();
        state.waiters.push_front(slot);
    }

    /// The lock was really released (or lost): the next waiter contends, after `yield_for` when
    /// other processes go first; `elsewhere` when the release reached waiters in other ones.
    pub(crate) fn released(&self, key: &LockKey, elsewhere: bool, yield_for: Option<Duration>) {
        let mut keys = self.keys(key);
        if let Some(state) = keys.get_mut(key) {
            state.streak = 0;
            if elsewhere {
                state.contended_until = Some(Instant::now() + CONTENDED_FOR);
            }
            state.yield_until = yield_for.map(|pause| Instant::now() + pause);
            state.wake_head();
            if state.is_idle() {
                keys.remove(key);
            }
        }
    }

    /// Removes a lost entry; the head waiter may now contend.
    pub(crate) fn remove_held(&self, held: &Arc<Held>) {
        let mut keys = self.keys(&held.key);
        if let Some(state) = keys.get_mut(&held.key) {
            state.held.retain(|other| !Arc::ptr_eq(other, held));
            state.wake_head();
            if state.is_idle() {
                keys.remove(&held.key);
            }
        }
    }

    /// Removes every held entry (at shutdown) and wakes every waiter.
    pub(crate) fn drain_held(&self) -> Vec<Arc<Held>> {
        let mut drained = Vec::new();
        for mut keys in self.all_keys() {
            for state in keys.values_mut() {
                drained.append(&mut state.held);
                for slot in &state.waiters {
                    slot.wake.notify_one();
                }
            }
            keys.retain(|_, state| !state.is_idle());
        }
        drained
    }

    /// Looks at every held entry for the watchdog.
    pub(crate) fn scan(&self, now: BootInstant) -> Scan {
        let mut scan = Scan::default();
        for keys in self.all_keys() {
            for state in keys.values() {
                for held in &state.held {
                    if !held.is_marked_lost() {
                        scan.add(held, now);
                    }
                }
                for wait in state.waiters.iter().filter_map(|slot| slot.queued.as_ref()) {
                    scan.add_wait(wait, now);
                }
            }
        }
        scan
    }

    /// Sums `count` over the states of every key.
    fn sum(&self, count: impl Fn(&KeyState<L>) -> usize) -> usize {
        let count = &count;
        self.all_keys().map(|keys| keys.values().map(count).sum::<usize>()).sum()
    }

    /// How many keys have local state (held or waited on).
    pub(crate) fn key_count(&self) -> usize {
        self.sum(|_| 1)
    }

    /// How many waiters hold a place in a backend queue.
    pub(crate) fn queued_count(&self) -> usize {
        self.sum(|state| {
            let active = |slot: &&Slot| slot.queued.as_ref().is_some_and(|q| q.is_active());
            state.waiters.iter().filter(active).count()
        })
    }

    /// How many waiters are queued across all keys.
    pub(crate) fn waiter_count(&self) -> usize {
        self.sum(|state| state.waiters.len())
    }

    /// The head waiter of `key`: its id and what it asks for.
    #[cfg(test)]
    pub(crate) fn head(&self, key: &LockKey) -> Option<(u64, Arc<Want>)> {
        let keys = self.keys(key);
        let slot = keys.get(key)?.waiters.front()?;
        Some((slot.id, slot.want.clone()))
    }

    /// The entries held here for `key` right now.
    pub(crate) fn held_entries(&self, key: &LockKey) -> Vec<Arc<Held>> {
        self.keys(key).get(key).map(|state| state.held.clone()).unwrap_or_default()
    }
}

/// The state of `name`, created when missing; allocates the name only then.
fn state_of<'a, L>(keys: &'a mut Keys<L>, key: &LockKey) -> &'a mut KeyState<L> {
    keys.entry(key.clone()).or_default()
}

impl Slot {
    /// Gives the waiter a new attempt, taken up at its next turn to contend.
    pub(crate) fn rename(&mut self, want: Arc<Want>) {
        self.want = want;
        self.renamed = true;
    }

    /// The waiter's turn to contend: under a new attempt if it was renamed.
    fn contend(&mut self) -> Turn {
        Turn::Contend(std::mem::take(&mut self.renamed).then(|| self.want.clone()))
    }

    /// Delivers a handed-off lock to the waiter. Should the waiter have left, or leave before
    /// taking it, the hand-off releases the lock on its own.
    pub(crate) fn deliver(self, handoff: Handoff) {
        let _ = self.handoff.send(handoff);
    }
}

/// A lock handed over to a local waiter: its entry and the waiter's hold. Released when dropped
/// untaken: the waiter gave up while the lock was on its way, or before it looked.
pub(crate) struct Handoff {
    held: Option<(Arc<Held>, u64)>,
    release: Option<ReleaseUntaken>,
}

/// How a hand-off nobody took is released.
type ReleaseUntaken = Box<dyn FnOnce((Arc<Held>, u64)) + Send + Sync>;

impl Handoff {
    /// `held`, to be released by `release` unless it is [taken](Self::take).
    pub(crate) fn new(
        held: (Arc<Held>, u64),
        release: impl FnOnce((Arc<Held>, u64)) + Send + Sync + 'static,
    ) -> Self {
        Self { held: Some(held), release: Some(Box::new(release)) }
    }

    /// The waiter takes the lock.
    pub(crate) fn take(mut self) -> (Arc<Held>, u64) {
        self.release = None;
        self.held.take().expect("taken once")
    }
}

impl Drop for Handoff {
    fn drop(&mut self) {
        if let (Some(held), Some(release)) = (self.held.take(), self.release.take()) {
            release(held);
        }
    }
}

/// What a scan of the table found.
#[derive(Default)]
pub(crate) struct Scan {
    pub(crate) lost: Vec<Arc<Held>>,
    /// Entries whose holds' own leases all ran out: they ended at this look.
    pub(crate) expired: Vec<Arc<Held>>,
    pub(crate) due: Vec<Arc<Held>>,
    pub(crate) due_waits: Vec<Arc<Queued>>,
    pub(crate) next: Option<BootInstant>,
}

impl Scan {
    pub(crate) fn add(&mut self, held: &Arc<Held>, now: BootInstant) {
        match held.check(now) {
            Check::Lost => self.lost.push(held.clone()),
            Check::Expired => self.expired.push(held.clone()),
            Check::Due(deadline) => {
                // The renewal may hang: wake at the deadline whatever it does.
                self.due.push(held.clone());
                self.later(deadline);
            }
            Check::Later(at) => self.later(at),
        }
    }

    pub(crate) fn add_wait(&mut self, wait: &Arc<Queued>, now: BootInstant) {
        match wait.check(now) {
            Some(Check::Due(_)) => self.due_waits.push(wait.clone()),
            Some(Check::Later(at)) => self.later(at),
            _ => {}
        }
    }

    fn later(&mut self, at: BootInstant) {
        self.next = Some(self.next.map_or(at, |next| next.min(at)));
    }
}
