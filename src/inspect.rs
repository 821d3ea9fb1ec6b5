//! What a lock holds right now, for operators: [`LockInfo`] and [`HolderInfo`], as
//! [`LockClient::inspect`](crate::LockClient::inspect) reports them and
//! [`LockClient::force_unlock`](crate::LockClient::force_unlock) clears them.
//!
//! One user key names up to three locks in the backend: the exclusive (or fair) lock, the
//! read-write lock (see [`LockClient::read_write_lock`](crate::LockClient::read_write_lock)) and
//! the semaphore (see [`LockClient::semaphore`](crate::LockClient::semaphore)) of the same key.
//! A [`LockInfo`] covers them all: each holder says which kind of hold it has. The guide
//! `guide::locks` ("Who holds this lock?") shows the two calls an operator needs.
//!
//! With feature `serde`, [`LockInfo`] and its parts implement `Serialize` and `Deserialize`,
//! for an admin endpoint or a tool that reports them: fields by their names, a
//! [`LockKind`] in snake case (`"exclusive"`, `"read"`, ...), a remaining lease as serde writes
//! a `Duration` (`{"secs": 9, "nanos": 500000000}`).
//!
#![cfg_attr(feature = "serde", doc = "```")]
#![cfg_attr(not(feature = "serde"), doc = "```ignore")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use tower_lock::{LockClient, LockInfo, MemoryBackend};
//!
//! let locks = LockClient::builder(MemoryBackend::new()).name("billing").build()?;
//! let guard = locks.lock("account:7").acquire().await?;
//! let info = locks.inspect("account:7").await?;
//! let json = serde_json::to_value(&info)?;
//! assert_eq!(json["holders"][0]["kind"], "exclusive");
//! assert_eq!(json["holders"][0]["id"], guard.holder().id());
//! assert!(json["holders"][0]["id"].as_str().unwrap().starts_with("billing@"));
//! assert_eq!(serde_json::from_value::<LockInfo>(json)?, info);
//! # guard.release().await?;
//! # Ok(())
//! # }
//! ```

use std::time::Duration;

use crate::backend::LockKind;

/// What one lock name (or one user key, both of its locks) holds right now.
///
/// An empty [`holders`](Self::holders) list means the lock is free. Several holders are
/// normal for the read side of a read-write lock and for a semaphore; a holder of the write
/// side that also took the read side appears once per side.
///
/// **Exclusive or fair.** Both keep the same record for a grant, reported as
/// [`LockKind::Exclusive`]; a fair lock also keeps a waiter queue (`queue_len`).
///
/// New fields may be added, hence `#[non_exhaustive]`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_lock::LockError> {
/// use tower_lock::{LockClient, LockKind};
///
/// let locks = LockClient::in_memory();
/// let guard = locks.lock("order:42").acquire().await?;
/// let info = locks.inspect("order:42").await?;
/// assert!(info.is_locked());
/// assert_eq!(info.kind(), Some(LockKind::Exclusive));
/// assert_eq!(info.holders[0].id, guard.holder().id());
/// # guard.release().await
/// # }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct LockInfo {
    /// Who holds the lock, one entry per holder and side. Empty when the lock is free.
    pub holders: Vec<HolderInfo>,
    /// How many waiters keep a place in the backend's queue: fair waiters, and writers waiting
    /// for a read-write lock. Waiters of an exclusive lock keep no place in the backend and are
    /// not counted.
    pub queue_len: u64,
    /// For a semaphore: its permits taken and its limit. `None` when the key has no
    /// semaphore held.
    pub permits: Option<Permits>,
}

/// The permits of a semaphore (see [`LockClient::semaphore`](crate::LockClient::semaphore)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Permits {
    /// How many holders hold a permit.
    pub in_use: u64,
    /// How many may hold one at once, when the store knows: the store keeps no permit count
    /// (each acquire states it); 0 when not known.
    pub limit: u64,
}

impl Permits {
    /// `in_use` permits of `limit` (for a [`Backend`](crate::Backend) implementation).
    pub(crate) fn new(in_use: u64, limit: u64) -> Self {
        Self { in_use, limit }
    }
}

impl LockInfo {
    /// A free lock with nobody queued (for a [`Backend`](crate::Backend) implementation).
    pub(crate) fn free() -> Self {
        Self::default()
    }

    /// Adds a holder (for a [`Backend`](crate::Backend) implementation).
    #[must_use]
    pub(crate) fn with_holder(mut self, holder: HolderInfo) -> Self {
        self.holders.push(holder);
        self
    }

    /// Sets the number of queued waiters (for a [`Backend`](crate::Backend) implementation).
    #[must_use]
    pub(crate) fn with_queue_len(mut self, queue_len: u64) -> Self {
        self.queue_len = queue_len;
        self
    }

    /// Sets a semaphore's permits (for a [`Backend`](crate::Backend) implementation).
    #[must_use]
    pub(crate) fn with_permits(mut self, permits: Permits) -> Self {
        self.permits = Some(permits);
        self
    }

    /// Whether anyone holds the lock.
    pub fn is_locked(&self) -> bool {
        !self.holders.is_empty()
    }

    /// The kind of the lock as held right now: the first holder's kind, the write side when
    /// a writer holds it. `None` when the lock is free.
    pub fn kind(&self) -> Option<LockKind> {
        self.holders
            .iter()
            .find(|holder| holder.kind == LockKind::Write)
            .or_else(|| self.holders.first())
            .map(|holder| holder.kind)
    }

    /// The holder with `id`, on whichever side it holds first.
    pub fn holder(&self, id: &str) -> Option<&HolderInfo> {
        self.holders.iter().find(|holder| holder.id == id)
    }

    /// Joins what another lock of the same user key holds.
    pub(crate) fn merge(mut self, other: Self) -> Self {
        self.holders.extend(other.holders);
        self.queue_len += other.queue_len;
        self.permits = self.permits.or(other.permits);
        self
    }
}

/// One grant of a lock, as the store records it: who holds it, and how.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_lock::LockError> {
/// use tower_lock::{LockClient, LockKind};
///
/// let locks = LockClient::in_memory();
/// let outer = locks.lock("cart:9").acquire().await?;
/// let inner = locks.lock("cart:9").holder(outer.holder()).acquire().await?;
/// let info = locks.inspect("cart:9").await?;
/// let holder = &info.holders[0];
/// assert_eq!((holder.kind, holder.hold_count), (LockKind::Exclusive, 2));
/// # inner.release().await?;
/// # outer.release().await
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct HolderInfo {
    /// The holder's id: the same string as
    /// [`LockGuard::holder`](crate::LockGuard::holder)`().id()` of its guard,
    /// `<name>@<host>/<pid>/<random>:<sequence>` for a holder of this crate (see
    /// [`client`](Self::client)).
    pub id: String,
    /// Which kind of hold it has: exclusive or fair, a side of a read-write lock, or a
    /// semaphore's permit.
    pub kind: LockKind,
    /// How many times the holder holds it: above 1 after re-entries, as counted by the client
    /// that holds the grant when it is the one asking; 1 from any other client, since the
    /// store keeps one record per grant.
    pub hold_count: u64,
    /// How long the backend keeps the hold without another renewal; `None` when it has no
    /// expiry.
    pub remaining_lease: Option<Duration>,
}

impl HolderInfo {
    /// A holder (for a [`Backend`](crate::Backend) implementation).
    pub(crate) fn new(
        id: impl Into<String>,
        kind: LockKind,
        hold_count: u64,
        remaining_lease: Option<Duration>,
    ) -> Self {
        Self { id: id.into(), kind, hold_count, remaining_lease }
    }

    /// The instance holding the lock, `<name>@<host>/<pid>` (the client's
    /// [`name`](crate::LockClientBuilder::name), its host and its process id), read from
    /// [`id`](Self::id); `None` for an id not made by a client of this crate.
    pub fn client(&self) -> Option<&str> {
        crate::holder::client_of(&self.id)
    }
}
