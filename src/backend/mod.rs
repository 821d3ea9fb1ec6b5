//! The store behind the locks.
//!
//! A [`Backend`] speaks lock semantics: acquire, release (optionally handing the lock straight to
//! a waiter), renew a batch of leases, undo an attempt whose reply was lost, and listen for
//! releases. The engine in [`LockClient`](crate::LockClient) builds reentrancy bookkeeping,
//! waiting, the watchdog and guards on top, the same way for every backend.
//!
//! - [`MemoryBackend`](memory::MemoryBackend): in this process; for single-instance services, examples and tests of the
//!   code around the locks.
//! - `RedisBackend` (feature `redis`, on by default): one Redis node, Lua scripts, pub/sub wake-ups;
//!   with the feature `cluster`, a Redis Cluster (sharded pub/sub).
//! - `RedlockBackend` (feature `redis`): a majority of N independent
//!   Redis masters (exclusive locks only).

use std::{future::Future, time::Duration};

use crate::{error::BackendError, inspect::LockInfo, lease::Lease, lock_key::LockKey};

#[cfg(all(test, feature = "redis"))]
mod differential_tests;
mod listeners;
pub mod memory;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "redis")]
pub mod redlock;

pub use listeners::Listener;
pub(crate) use listeners::Listeners;

/// The kind of a lock, which decides who may hold it together and in what order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum LockKind {
    /// One holder at a time; waiters are woken in no particular order across processes.
    Exclusive,
    /// One holder at a time, granted in the order waiters joined the lock's queue.
    Fair,
    /// The read side of a read-write lock: shared with other readers.
    Read,
    /// The write side of a read-write lock: exclusive, and waiting writers hold back new readers.
    Write,
    /// A permit of a semaphore: at most [`Grant::permits`] holders hold it at once, each with
    /// a lease of its own. No fencing tokens (permits are shared).
    Semaphore,
}

impl LockKind {
    /// Whether waiters of this kind keep a place in a queue in the backend.
    pub fn queues(self) -> bool {
        matches!(self, Self::Fair | Self::Write)
    }

    /// Whether the store keeps a lease per hold of this kind, so that a holder's hold given
    /// back ([`Release::hold`]) takes its own lease with it: the sides of a read-write lock
    /// and a semaphore's permits. A plain or fair lock lives as long as the longest lease any
    /// of its holds had.
    pub(crate) fn lease_per_hold(self) -> bool {
        matches!(self, Self::Read | Self::Write | Self::Semaphore)
    }
}

/// Who is to own a lock, as the backend records it.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct Grant<'a> {
    /// The lock.
    pub key: &'a LockKey,
    /// The holder id stored as the owner.
    pub holder: &'a str,
    /// A unique id of this attempt, recorded with the grant so a lost reply can be resolved with
    /// [`Backend::abandon`].
    pub attempt: &'a str,
    /// The lease to set.
    pub lease: Lease,
    /// Whether to issue a fencing token.
    pub fencing: bool,
    /// The kind of lock.
    pub kind: LockKind,
    /// For kinds that [queue](LockKind::queues): when the lock is busy, join (or stay in) its
    /// wait queue for this long unless the place is kept alive with [`Backend::renew`].
    pub queue: Option<Duration>,
    /// An earlier attempt of the same acquisition whose reply was lost. If that attempt took
    /// the holder's hold, this one takes it over rather than adding another (the undo of the
    /// earlier attempt may arrive only later, and then finds nothing to undo). Backends that
    /// never lose replies may ignore it.
    pub supersedes: Option<&'a str>,
    /// Whether this grant may add a hold to one the holder already has.
    pub reentry: Reentry,
    /// An earlier attempt of the same acquisition found the lock held: it likely still is, so
    /// a backend skips a first try meant for a free lock (the Redis backend's `SET NX`) and
    /// asks what holds it at once.
    pub contended: bool,
    /// For a [semaphore](LockKind::Semaphore): how many holders may hold it at once. Ignored
    /// by the other kinds.
    pub permits: u32,
}

/// Whether an acquire may add a hold to one its holder already has in the backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reentry {
    /// Re-enter when the holder holds the lock, take it when it is free.
    #[default]
    Allowed,
    /// Re-enter only: grant nothing (and join no queue) unless the holder already holds the
    /// lock (that side, for a read-write lock), answering [`AcquireReply::Held`] instead. A
    /// re-entry racing the release of the holder's last hold must not take the lock afresh.
    Only,
    /// Take the lock only as a new hold: while the holder still holds it (a hold its client
    /// no longer counts on, say one being released or whose deadline passed), answer
    /// [`AcquireReply::Held`], as for any other owner. An earlier attempt named in
    /// `supersedes` is still taken over.
    Refused,
}

impl Reentry {
    /// The script argument: `''`, `'held'` or `'free'`.
    #[cfg(feature = "redis")]
    pub(crate) fn as_arg(self) -> &'static str {
        match self {
            Self::Allowed => "",
            Self::Only => "held",
            Self::Refused => "free",
        }
    }
}

/// The answer to an acquire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AcquireReply {
    /// The holder now holds the lock `count` times.
    Acquired {
        /// The holder's hold count after this acquire (1 for a first acquisition).
        count: u64,
        /// The fencing token, when one was asked for.
        token: Option<u64>,
        /// The shared lease the hold lives on, handed back in [`Renew::session`]; `0` for a
        /// hold with a lease of its own. The Redis backend with a client lease
        /// (`RedisBackendBuilder::client_lease`) keeps every watchdog hold of one client alive
        /// with one command per renewal.
        session: u64,
    },
    /// Another holder has the lock.
    Held {
        /// When to try again at the latest: the blocking lease's remaining time, when known.
        ttl: Option<Duration>,
    },
    /// Another holder has the lock, as with [`Held`](Self::Held), and the attempt was given
    /// back on part of the store (a Redlock round that lost its vote), where its id may now be
    /// refused: the next try carries a new attempt id.
    Spent {
        /// When to try again at the latest: the blocking lease's remaining time, when known.
        ttl: Option<Duration>,
    },
    /// The holder holds the read side and asked for the write side: waiting would deadlock.
    WouldDeadlock,
}

/// A release of one hold (or all of them) by `holder`.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct Release<'a> {
    /// The lock.
    pub key: &'a LockKey,
    /// The releasing holder.
    pub holder: &'a str,
    /// Release every hold of this holder at once instead of one.
    pub all: bool,
    /// When the lock becomes free, grant it to this waiter in the same step instead of
    /// publishing the release (exclusive locks only).
    pub handoff: Option<Grant<'a>>,
    /// The kind of lock.
    pub kind: LockKind,
    /// Release only while the holder's hold is still the one this attempt granted: a release
    /// made for one particular hold, retried or sent after the hold was lost, then never frees a
    /// newer hold of the same holder. `None` releases whatever the holder holds.
    pub attempt: Option<&'a str>,
    /// The attempt that took the hold given back: the grant's or a re-entry's. Where the
    /// backend keeps a lease per hold (read-write locks and semaphores), that hold's lease goes
    /// with it and the holds left keep theirs; `None` (or an attempt it does not know) gives
    /// back the hold whose lease ends first. Ignored with `all`, and by the kinds that keep one
    /// lease per lock.
    pub hold: Option<&'a str>,
}

/// The answer to a release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReleaseReply {
    /// The holder did not hold the lock; nothing was changed.
    NotHeld,
    /// One hold was released; the holder still holds the lock `remaining` times.
    Decremented {
        /// Holds left.
        remaining: u64,
    },
    /// The lock is free and waiters were notified.
    Released {
        /// How many listeners (pub/sub connections, for Redis) the notification reached,
        /// including the releasing client's own; `None` when the backend cannot tell.
        notified: Option<u64>,
    },
    /// The lock went straight to the hand-off grant.
    HandedOff {
        /// The new owner's fencing token, when one was asked for.
        token: Option<u64>,
    },
}

/// One lease to extend, or one place in a wait queue to keep.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct Renew<'a> {
    /// The lock.
    pub key: &'a LockKey,
    /// The holder that must still own it (or be queued for it).
    pub holder: &'a str,
    /// The new lease (or waiter timeout), counted from now.
    pub lease: Lease,
    /// The kind of lock.
    pub kind: LockKind,
    /// Keep the holder's place in the wait queue instead of extending a hold.
    pub queued: bool,
    /// The shared lease the hold lives on, from [`AcquireReply::Acquired`]; `0` for a hold
    /// with a lease of its own.
    pub session: u64,
    /// The attempt that granted the hold, as the backend recorded it (see
    /// [`Release::attempt`]), or `None` (or an empty one) for any hold of the holder. Named, a renewal extends
    /// nothing of a hold another attempt granted: one that arrives after its holder released
    /// the lock and took it anew leaves the new hold its own lease.
    pub attempt: Option<&'a str>,
}

impl<'a> Renew<'a> {
    /// Extends `holder`'s hold of the `kind` lock `key` to `lease` from now.
    ///
    /// ```
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use tower_lock::{
    ///     Backend, Lease, LockClient, LockKind, MemoryBackend,
    ///     backend::{Renew, RenewReply},
    /// };
    ///
    /// let locks = LockClient::builder(MemoryBackend::new()).build()?;
    /// let lease = Lease::fixed(Duration::from_secs(10));
    /// let guard = locks.lock("report").lease(lease).acquire().await?;
    /// let renew = Renew::hold(guard.key(), guard.holder().id(), lease, LockKind::Exclusive);
    /// let replies = locks.backend().renew(&[renew]).await?;
    /// assert_eq!(replies, [RenewReply::Renewed]);
    /// # Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    /// #     .block_on(demo()).unwrap();
    /// ```
    pub fn hold(key: &'a LockKey, holder: &'a str, lease: Lease, kind: LockKind) -> Self {
        Self {
            key,
            holder,
            lease,
            kind,
            queued: false,
            session: 0,
            attempt: None,
        }
    }

    /// The same renewal, for a hold that lives on the shared lease `session` (from
    /// [`AcquireReply::Acquired`]).
    #[must_use]
    pub fn in_session(self, session: u64) -> Self {
        Self { session, ..self }
    }

    /// The same renewal, extending the hold only while it is the one `attempt` granted (see
    /// [`Renew::attempt`]).
    #[must_use]
    pub fn granted_by(self, attempt: &'a str) -> Self {
        Self {
            attempt: Some(attempt),
            ..self
        }
    }

    /// Keeps `holder`'s place in the wait queue of the `kind` lock `key` for `timeout` from
    /// now.
    pub fn place(key: &'a LockKey, holder: &'a str, timeout: Duration, kind: LockKind) -> Self {
        Self {
            key,
            holder,
            lease: Lease::fixed(timeout),
            kind,
            queued: true,
            session: 0,
            attempt: None,
        }
    }
}

/// The answer to one renewal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RenewReply {
    /// The lease was extended (or the place in the queue kept).
    Renewed,
    /// The holder no longer owns the lock (or is no longer queued).
    NotHeld,
    /// The holder is first in the queue and the lock is free: its turn to acquire.
    Ready,
}

/// A store that can hold locks. See the [module docs](self).
///
/// Methods return `impl Future + Send` so implementations can be `async fn`s while the engine
/// stays statically dispatched.
///
/// **Unstable before 1.0.** The trait is public so that another store can be plugged in, and
/// so that tests can wrap a backend to delay or fail chosen calls (this crate's own race tests
/// do). Its methods and the request and reply types may still change in a minor version while
/// the engine's needs settle: pin the minor version if you implement it. It is not sealed,
/// because sealing would take both uses away.
pub trait Backend: Send + Sync + 'static {
    /// A registration for release notifications of one lock.
    type Listener: Listen;

    /// Acquires `grant.key` for `grant.holder`, re-entering when it already holds it.
    fn acquire(
        &self,
        grant: Grant<'_>,
    ) -> impl Future<Output = Result<AcquireReply, BackendError>> + Send;

    /// Releases a hold, owner-checked: a holder that no longer owns the lock changes nothing.
    fn release(
        &self,
        release: Release<'_>,
    ) -> impl Future<Output = Result<ReleaseReply, BackendError>> + Send;

    /// [`release`](Self::release), done at once by a backend that needs no I/O for it (the
    /// in-memory backend): the engine then makes no future for the release. `None`, the
    /// default, when the release must go through `release`; the backend then has done nothing.
    /// An answer given here is final: a backend that cannot tell whether the release happened
    /// answers `None` rather than an error whose outcome is unknown.
    fn release_now(&self, release: Release<'_>) -> Option<Result<ReleaseReply, BackendError>> {
        let _ = release;
        None
    }

    /// Extends every lease in `renewals`, in one round trip where the store allows; replies in
    /// the same order.
    fn renew(
        &self,
        renewals: &[Renew<'_>],
    ) -> impl Future<Output = Result<Vec<RenewReply>, BackendError>> + Send;

    /// Resolves an acquire (or hand-off) whose reply was lost: undoes what the attempt
    /// `grant.attempt` took, if it took anything and nothing newer has happened to the
    /// holder's hold since, and otherwise makes sure the attempt, should it still arrive, takes
    /// nothing. Returns whether a hold was undone.
    fn abandon(&self, grant: Grant<'_>) -> impl Future<Output = Result<bool, BackendError>> + Send;

    /// Takes `holder` out of the wait queue of `key` (it gave up waiting), passing the wake-up
    /// on when it was first.
    fn leave(
        &self,
        key: &LockKey,
        holder: &str,
        kind: LockKind,
    ) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// Registers for release notifications of `key`. With `only_for`, only notifications that
    /// name that holder wake the listener (a fair lock wakes its next holder alone). Resolves
    /// once notifications are flowing, so a caller that checks the lock after this cannot miss
    /// a release; or at once while none can flow (the connection that carries them is down),
    /// and then the listener is woken when they flow again, so its caller checks once more.
    fn listen(
        &self,
        key: &LockKey,
        only_for: Option<&str>,
    ) -> impl Future<Output = Result<Self::Listener, BackendError>> + Send;

    /// Stops background work (connections, tasks). Called by
    /// [`LockClient::shutdown`](crate::LockClient::shutdown).
    fn shutdown(&self) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Reads what the lock `key` holds, changing nothing. `kind` names the lock's layout:
    /// [`LockKind::Exclusive`] and [`LockKind::Fair`] share one (a fair lock's waiter queue is
    /// counted too), [`LockKind::Read`] and [`LockKind::Write`] name a read-write lock.
    ///
    /// The default answers [`BackendErrorKind::Unsupported`](crate::error::BackendErrorKind::Unsupported):
    /// the crate's own backends all implement it.
    ///
    /// # Errors
    /// [`BackendErrorKind::WrongType`](crate::error::BackendErrorKind::WrongType) when the key
    /// holds data that is not a lock of that layout; the store's failures.
    fn inspect(
        &self,
        key: &LockKey,
        kind: LockKind,
    ) -> impl Future<Output = Result<LockInfo, BackendError>> + Send {
        let _ = (key, kind);
        async { Err(unsupported("inspect")) }
    }

    /// Deletes every hold of the lock `key` (of `kind`'s layout, as for
    /// [`inspect`](Self::inspect)), whoever holds it, and announces the release so that waiters
    /// everywhere look again (a fair lock's queue is kept, and its head is woken). Returns what
    /// the lock held just before. Holders find out at their next renewal, which answers
    /// [`RenewReply::NotHeld`].
    ///
    /// The default answers [`BackendErrorKind::Unsupported`](crate::error::BackendErrorKind::Unsupported).
    ///
    /// # Errors
    /// [`BackendErrorKind::WrongType`](crate::error::BackendErrorKind::WrongType) when the key
    /// holds data that is not a lock of that layout (it is left alone); the store's failures.
    fn force_unlock(
        &self,
        key: &LockKey,
        kind: LockKind,
    ) -> impl Future<Output = Result<LockInfo, BackendError>> + Send {
        let _ = (key, kind);
        async { Err(unsupported("force_unlock")) }
    }
}

/// The error of a trait method a backend does not implement.
fn unsupported(feature: &'static str) -> BackendError {
    BackendError::from_kind(crate::error::BackendErrorKind::Unsupported { feature })
}

/// A registration for release notifications; dropping it unregisters.
pub trait Listen: Send + Sync + 'static {
    /// Resolves at the next release notification, or at once if one arrived since the last call.
    /// Also resolves after a reconnect, when notifications may have been missed.
    fn notified(&self) -> impl Future<Output = ()> + Send + '_;
}
