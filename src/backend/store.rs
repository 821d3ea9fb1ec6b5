//! The protocol between the lock engine and a store: one record per grant, named by the
//! attempt that won it; every write names its grant, so every write may be sent again. See
//! `src/backend/protocol.md` for the invariants, the layouts and the fault table.
//!
//! **Unstable.** Public only under the feature `unstable-backend`, for tests that wrap a store
//! to delay or fail chosen calls; it changes whenever the protocol does.

use std::{future::Future, time::Duration};

use super::LockKind;
use crate::{error::BackendError, inspect::LockInfo, lease::Lease, lock_key::LockKey};

/// An attempt to take a grant, as sent to the store.
#[derive(Clone, Copy, Debug)]
pub struct Grant<'a> {
    /// The lock.
    pub key: &'a LockKey,
    /// The holder the grant is for: a fair waiter's or a waiting writer's place in the queue is
    /// in its name.
    pub holder: &'a str,
    /// This attempt, unique across clients (`<holder>#<n>`): the record a grant writes is named
    /// by it, and a lost reply is resolved with it ([`Store::abandon`]).
    pub attempt: &'a str,
    /// The lease the record lives by.
    pub lease: Lease,
    /// Whether to issue a fencing token.
    pub fencing: bool,
    /// The kind of lock.
    pub kind: LockKind,
    /// For kinds that queue (fair locks, writers): when refused, keep a place in the queue for
    /// this long (renewed with [`Renew::Place`]).
    pub queue: Option<Duration>,
    /// An earlier attempt of the same acquisition found the lock held: a store skips a first
    /// try meant for a free lock (the Redis backend's `SET NX`).
    pub contended: bool,
    /// A semaphore's permits; ignored by the other kinds.
    pub permits: u32,
    /// A read: the write grant the same holder holds on this lock, which the read nests in.
    pub within: Option<&'a str>,
}

/// A [`Grant`] that owns its fields, for a call made after the request that made the grant is
/// gone (a node call that outlives a Redlock vote; in tests, an acquire held back to be
/// delivered late).
#[derive(Clone, Debug)]
#[cfg_attr(not(feature = "unstable-backend"), allow(unreachable_pub, dead_code))]
pub struct OwnedGrant {
    key: LockKey,
    holder: String,
    attempt: String,
    lease: Lease,
    fencing: bool,
    kind: LockKind,
    queue: Option<Duration>,
    contended: bool,
    permits: u32,
    within: Option<String>,
}

#[cfg_attr(not(feature = "unstable-backend"), allow(unreachable_pub, dead_code))]
impl OwnedGrant {
    /// A copy of `grant`.
    pub fn of(grant: &Grant<'_>) -> Self {
        Self {
            key: grant.key.clone(),
            holder: grant.holder.to_owned(),
            attempt: grant.attempt.to_owned(),
            lease: grant.lease,
            fencing: grant.fencing,
            kind: grant.kind,
            queue: grant.queue,
            contended: grant.contended,
            permits: grant.permits,
            within: grant.within.map(str::to_owned),
        }
    }

    /// The grant, borrowed from this copy.
    pub fn grant(&self) -> Grant<'_> {
        Grant {
            key: &self.key,
            holder: &self.holder,
            attempt: &self.attempt,
            lease: self.lease,
            fencing: self.fencing,
            kind: self.kind,
            queue: self.queue,
            contended: self.contended,
            permits: self.permits,
            within: self.within.as_deref(),
        }
    }
}

/// The answer to an acquire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcquireReply {
    /// The attempt's record was written (or was already there).
    Acquired {
        /// The fencing token, when one was asked for.
        token: Option<u64>,
    },
    /// The lock is taken.
    Held {
        /// When to look again at the latest: when what is in the way may end, if known.
        ttl: Option<Duration>,
    },
    /// Taken, as with [`Held`](Self::Held), and the attempt was given up on part of the store
    /// (a Redlock round that lost its vote), where its id is now refused: the next try carries
    /// a new one.
    Spent {
        /// When to look again at the latest.
        ttl: Option<Duration>,
    },
}

/// A grant to extend for a re-entry that needs a longer lease, or a fencing token, than the
/// grant has.
#[derive(Clone, Copy, Debug)]
pub struct Extend<'a> {
    /// The lock.
    pub key: &'a LockKey,
    /// The kind of lock.
    pub kind: LockKind,
    /// The grant (the attempt that won it).
    pub grant: &'a str,
    /// The grant lives at least this long from now (never shorter than it already does).
    pub lease: Lease,
    /// Give the grant a fencing token if it has none.
    pub fencing: bool,
}

/// The answer to an extend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtendReply {
    /// Extended; the grant's token, when it has one.
    Extended {
        /// The fencing token.
        token: Option<u64>,
    },
    /// The grant is not held (its lease ran out, or the lock was cleared).
    NotHeld,
}

/// The release of a grant.
#[derive(Clone, Copy, Debug)]
pub struct Release<'a> {
    /// The lock.
    pub key: &'a LockKey,
    /// The kind of lock.
    pub kind: LockKind,
    /// The grant to delete: nothing else is ever deleted.
    pub grant: &'a str,
    /// The grant's token, when known: an owner record is then compared whole.
    pub token: Option<u64>,
    /// Grant the lock to this attempt in the same step instead of freeing it (plain locks).
    pub handoff: Option<Grant<'a>>,
}

/// The answer to a release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseReply {
    /// The grant was not held; nothing changed.
    NotHeld,
    /// The grant is gone and the waiters were told.
    Released {
        /// How many listeners (pub/sub connections, for Redis) the notification reached, the
        /// releasing client's own included; `None` when the store cannot tell.
        notified: Option<u64>,
    },
    /// The lock went straight to the hand-off attempt.
    HandedOff {
        /// The new grant's fencing token, when one was asked for.
        token: Option<u64>,
    },
}

/// One lease to extend, or one place in a queue to keep.
#[derive(Clone, Copy, Debug)]
pub enum Renew<'a> {
    /// Extends a grant to `lease` from now while it is held, never shortening it.
    Grant {
        /// The lock.
        key: &'a LockKey,
        /// The kind of lock.
        kind: LockKind,
        /// The grant (the attempt that won it).
        grant: &'a str,
        /// The lease.
        lease: Lease,
    },
    /// Keeps `holder`'s place in the queue of `key` for `timeout` from now.
    Place {
        /// The lock.
        key: &'a LockKey,
        /// The kind of lock ([`LockKind::Fair`] or [`LockKind::Write`]).
        kind: LockKind,
        /// The waiting holder.
        holder: &'a str,
        /// How long the place lives unless kept again.
        timeout: Duration,
    },
}

impl Renew<'_> {
    /// The lock renewed.
    pub fn key(&self) -> &LockKey {
        match self {
            Self::Grant { key, .. } | Self::Place { key, .. } => key,
        }
    }

    /// A grant's renewal lease; `None` for a place.
    pub fn lease(&self) -> Option<Lease> {
        match self {
            Self::Grant { lease, .. } => Some(*lease),
            Self::Place { .. } => None,
        }
    }
}

/// The answer to one renewal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RenewReply {
    /// Extended (or the place kept).
    Renewed,
    /// The grant is not held (or the holder is no longer queued).
    NotHeld,
    /// The holder is first in the queue and the lock is free: its turn.
    Ready,
}

/// A store that can hold locks, in the terms of the protocol.
///
/// Methods return `impl Future + Send`, so implementations can be `async fn`s while the engine
/// stays statically dispatched.
pub trait Store: Send + Sync + 'static {
    /// A registration for release notifications of one lock.
    type Listener: Listen;

    /// Writes the record of `grant.attempt` if the lock lets it.
    fn acquire(
        &self,
        grant: Grant<'_>,
    ) -> impl Future<Output = Result<AcquireReply, BackendError>> + Send;

    /// Extends a grant for a re-entry (see [`Extend`]).
    fn extend(
        &self,
        extend: Extend<'_>,
    ) -> impl Future<Output = Result<ExtendReply, BackendError>> + Send;

    /// Deletes a grant's record (or hands it off), if it is there.
    fn release(
        &self,
        release: Release<'_>,
    ) -> impl Future<Output = Result<ReleaseReply, BackendError>> + Send;

    /// [`release`](Self::release), done at once by a store that needs no I/O for it (the
    /// in-memory one): the engine then makes no future. `None`, the default, when the release
    /// must go through `release`.
    fn release_now(&self, release: Release<'_>) -> Option<Result<ReleaseReply, BackendError>> {
        let _ = release;
        None
    }

    /// Extends every grant (or keeps every place) in `renewals`, in one round trip where the
    /// store allows; replies in the same order.
    fn renew(
        &self,
        renewals: &[Renew<'_>],
    ) -> impl Future<Output = Result<Vec<RenewReply>, BackendError>> + Send;

    /// Resolves an attempt whose reply was lost: deletes its record if it won one, and
    /// otherwise records it as given up on, so that it takes nothing should it still arrive.
    /// Returns whether a record was deleted.
    fn abandon(&self, grant: Grant<'_>) -> impl Future<Output = Result<bool, BackendError>> + Send;

    /// Takes `holder` out of the queue of `key` (it gave up waiting), passing the wake-up on
    /// when it was first.
    fn leave(
        &self,
        key: &LockKey,
        holder: &str,
        kind: LockKind,
    ) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// Registers for release notifications of `key`. With `only_for`, only notifications that
    /// name that holder wake the listener (a fair lock wakes its next holder alone). Resolves
    /// once notifications flow, so a caller that checks the lock after this misses no
    /// release; or at once while none can flow, and the listener is woken when they flow again.
    fn listen(
        &self,
        key: &LockKey,
        only_for: Option<&str>,
    ) -> impl Future<Output = Result<Self::Listener, BackendError>> + Send;

    /// Stops background work (connections, tasks), unless other handles (clones) of the store
    /// are left: a store shared by several clients keeps serving the others when one of them
    /// shuts down.
    fn shutdown(&self) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Reads what the lock `key` of `kind`'s layout holds: one holder per grant (the owner of
    /// a plain or fair lock, the writer, each reader, each permit), changing nothing.
    ///
    /// # Errors
    /// `WrongType` when the key holds data that is not a lock of that layout.
    fn inspect(
        &self,
        key: &LockKey,
        kind: LockKind,
    ) -> impl Future<Output = Result<LockInfo, BackendError>> + Send;

    /// Deletes every grant of the lock `key` (of `kind`'s layout), whoever holds it, and wakes
    /// the waiters (a fair queue is kept, and its head woken). Returns what it held just
    /// before. Holders find out at their next renewal.
    fn force_unlock(
        &self,
        key: &LockKey,
        kind: LockKind,
    ) -> impl Future<Output = Result<LockInfo, BackendError>> + Send;
}

/// A registration for release notifications; dropping it unregisters.
pub trait Listen: Send + Sync + 'static {
    /// Resolves at the next release notification, or at once if one arrived since the last
    /// call. Also resolves after a reconnect, when notifications may have been missed.
    fn notified(&self) -> impl Future<Output = ()> + Send + '_;
}

/// The holder an attempt id belongs to: `<holder>#<n>` without `#<n>`.
pub(crate) fn holder_of(attempt: &str) -> &str {
    attempt.rsplit_once('#').map_or(attempt, |(holder, _)| holder)
}
