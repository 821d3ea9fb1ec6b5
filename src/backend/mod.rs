//! The store behind the locks.
//!
//! A [`Backend`] speaks lock semantics: acquire, release (optionally handing the lock straight to
//! a waiter), renew a batch of leases, undo an attempt whose reply was lost, and listen for
//! releases. The engine in [`LockClient`](crate::LockClient) builds reentrancy bookkeeping,
//! waiting, the watchdog and guards on top, the same way for every backend.
//!
//! - [`MemoryBackend`](memory::MemoryBackend): in this process; for single-instance services, examples and tests of the
//!   code around the locks.
//! - [`RedisBackend`](crate::RedisBackend) (feature `redis`, on by default): one Redis node, Lua scripts, pub/sub wake-ups.

use std::{future::Future, time::Duration};

use crate::{error::BackendError, key::LockKey, lease::Lease};

mod listeners;
pub mod memory;
#[cfg(feature = "redis")]
pub mod redis;

pub use listeners::Listener;
pub(crate) use listeners::Listeners;

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
    },
    /// Another holder has the lock.
    Held {
        /// The lock's remaining lease, when it has one.
        ttl: Option<Duration>,
    },
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
    /// publishing the release.
    pub handoff: Option<Grant<'a>>,
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

/// One lease to extend.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct Renew<'a> {
    /// The lock.
    pub key: &'a LockKey,
    /// The holder that must still own it.
    pub holder: &'a str,
    /// The new lease, counted from now.
    pub lease: Lease,
}

/// The answer to one renewal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RenewReply {
    /// The lease was extended.
    Renewed,
    /// The holder no longer owns the lock.
    NotHeld,
}

/// A store that can hold locks. See the [module docs](self).
///
/// Methods return `impl Future + Send` so implementations can be `async fn`s while the engine
/// stays statically dispatched.
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

    /// Registers for release notifications of `key`. Resolves once notifications are flowing,
    /// so a caller that checks the lock after this cannot miss a release.
    fn listen(
        &self,
        key: &LockKey,
    ) -> impl Future<Output = Result<Self::Listener, BackendError>> + Send;

    /// Stops background work (connections, tasks). Called by
    /// [`LockClient::shutdown`](crate::LockClient::shutdown).
    fn shutdown(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// A registration for release notifications; dropping it unregisters.
pub trait Listen: Send + Sync + 'static {
    /// Resolves at the next release notification, or at once if one arrived since the last call.
    /// Also resolves after a reconnect, when notifications may have been missed.
    fn notified(&self) -> impl Future<Output = ()> + Send + '_;
}
