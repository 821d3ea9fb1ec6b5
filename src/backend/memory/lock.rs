//! What the store keeps of one lock key: the same records as the Redis layout (see
//! `protocol.md`), each with the lifetime its Redis key would have.

use std::{borrow::Cow, sync::atomic::AtomicU64, time::Duration};

use tokio::time::Instant;

use crate::clock::after;

/// What a change asks to publish on the lock's release channel: `released`, or a waiter's
/// holder id.
pub(super) type Publish = Option<Cow<'static, str>>;

/// The message of a release that names no waiter.
pub(super) const RELEASED: Cow<'static, str> = Cow::Borrowed("released");

/// The records of one lock key. A plain and a fair lock share theirs; a read-write lock's key
/// ends in `:rw` and a semaphore's in `:sem`, so each layout has its own.
#[derive(Debug, Default)]
pub(super) struct Lock {
    /// The owner record of a plain, fair or write lock (`K`).
    pub(super) owner: Option<Owner>,
    /// Shared grants, readers (`K:readers`) or permits (`K` of a semaphore): attempt and when
    /// its lease ends. A grant whose lease ended stays until an operation that looks drops it,
    /// exactly where a script drops it by score, so a release still finds it as on Redis.
    pub(super) grants: Keyed<(String, Instant)>,
    /// The waiter queue of a fair lock or of a read-write lock's writers (`K:queue` with
    /// `K:timeouts`): holders in the order they joined, each with when its place ends. A place
    /// that ended stays until an operation drops it, as on Redis.
    pub(super) queue: Keyed<(String, Instant)>,
    /// Attempts given up on (`K:void`).
    pub(super) void: Keyed<String>,
}

/// An owner record: `<attempt>` or `<attempt>~<token>`, with the TTL of its lease.
#[derive(Debug)]
pub(super) struct Owner {
    pub(super) attempt: String,
    pub(super) token: Option<u64>,
    pub(super) expires: Instant,
}

/// A collection that Redis keeps under one key: its items, and while it has any, when the key
/// expires. The key goes with its last item, and its TTL with it.
#[derive(Debug)]
pub(super) struct Keyed<T> {
    pub(super) items: Vec<T>,
    until: Option<Instant>,
}

impl<T> Default for Keyed<T> {
    fn default() -> Self {
        Self { items: Vec::new(), until: None }
    }
}

impl<T> Keyed<T> {
    /// Keeps the items `keep` accepts.
    pub(super) fn retain(&mut self, keep: impl FnMut(&T) -> bool) {
        self.items.retain(keep);
        if self.items.is_empty() {
            self.until = None;
        }
    }

    /// Makes the key live at least `ttl` more, never shortening it (the prelude's `extend`).
    pub(super) fn extend(&mut self, now: Instant, ttl: Duration) {
        let end = after(now, ttl);
        self.until = Some(self.until.map_or(end, |until| until.max(end)));
    }

    fn expire(&mut self, now: Instant) {
        if self.until.is_some_and(|until| until <= now) {
            *self = Self::default();
        }
    }
}

impl Lock {
    /// Drops what expired by `now`, as Redis drops keys whose TTL ran out.
    pub(super) fn expire(&mut self, now: Instant) {
        self.owner.take_if(|owner| owner.expires <= now);
        self.grants.expire(now);
        self.queue.expire(now);
        self.void.expire(now);
    }

    /// Whether nothing is kept: the lock's entry can go.
    pub(super) fn is_empty(&self) -> bool {
        self.owner.is_none()
            && self.grants.items.is_empty()
            && self.queue.items.is_empty()
            && self.void.items.is_empty()
    }

    /// Whether `attempt` was given up on.
    pub(super) fn given_up(&self, attempt: &str) -> bool {
        self.void.items.iter().any(|given_up| given_up == attempt)
    }

    /// Records `attempt` as given up on; the set lives at least `lease` more (`give_up`).
    pub(super) fn give_up(&mut self, attempt: &str, now: Instant, lease: Duration) {
        if !self.given_up(attempt) {
            self.void.items.push(attempt.to_owned());
        }
        self.void.extend(now, lease);
    }

    /// Drops the shared grants whose lease ended (`ZREMRANGEBYSCORE … now`).
    pub(super) fn drop_ended_grants(&mut self, now: Instant) {
        self.grants.retain(|(_, end)| *end > now);
    }

    /// When the first shared grant's lease ends (the lowest score).
    pub(super) fn first_grant_end(&self) -> Option<Instant> {
        self.grants.items.iter().map(|(_, end)| *end).min()
    }

    /// The shared grant of `attempt`, ended or not.
    pub(super) fn grant(&mut self, attempt: &str) -> Option<&mut Instant> {
        let grant = self.grants.items.iter_mut().find(|(a, _)| a == attempt);
        grant.map(|(_, end)| end)
    }

    /// Gives back the shared grant of `attempt`, ended or not (`ZREM`): whether it was there.
    pub(super) fn take_grant(&mut self, attempt: &str) -> bool {
        let before = self.grants.items.len();
        self.grants.retain(|(a, _)| a != attempt);
        self.grants.items.len() < before
    }

    /// Drops the waiters whose place ended (`purge_queue`).
    pub(super) fn purge_queue(&mut self, now: Instant) {
        self.queue.retain(|(_, end)| *end > now);
    }

    /// The first waiter and when its place ends.
    pub(super) fn head(&self) -> Option<(&str, Instant)> {
        let (holder, end) = self.queue.items.first()?;
        Some((holder, *end))
    }

    /// Keeps `holder`'s place (at the end of the queue if it had none) for `timeout` from now.
    pub(super) fn join(&mut self, holder: &str, now: Instant, timeout: Duration) {
        let end = after(now, timeout);
        match self.queue.items.iter_mut().find(|(waiter, _)| waiter == holder) {
            Some(place) => place.1 = end,
            None => self.queue.items.push((holder.to_owned(), end)),
        }
        self.queue.extend(now, timeout);
    }

    /// Takes `holder` out of the queue.
    pub(super) fn unqueue(&mut self, holder: &str) {
        self.queue.retain(|(waiter, _)| waiter != holder);
    }

    /// The wake-up for a lock an owner record just freed: a fair lock's queue head by name
    /// (after dropping dead places), any other `released`.
    pub(super) fn freed(&mut self, fair: bool, now: Instant) -> Cow<'static, str> {
        if fair {
            self.purge_queue(now);
            if let Some((head, _)) = self.head() {
                return Cow::Owned(head.to_owned());
            }
        }
        RELEASED
    }
}

/// A new fencing token: the wall clock in milliseconds times 1000, or one more than the last
/// token the store issued when that is higher (`new_token`). One counter serves every lock, so
/// tokens rise strictly per lock whatever the clock does.
pub(super) fn new_token(fence: &AtomicU64) -> u64 {
    use std::sync::atomic::Ordering;
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX / 1000));
    let next = |last: u64| (ms * 1000).max(last + 1);
    // The closure always gives a value: the update cannot fail.
    let last = fence
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |last| Some(next(last)))
        .unwrap_or_else(|last| last);
    next(last)
}
