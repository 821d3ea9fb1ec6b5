//! The stores behind the locks.
//!
//! - [`MemoryBackend`](memory::MemoryBackend): in this process; for single-instance services,
//!   examples and tests of the code around the locks.
//! - `RedisBackend` (feature `redis`, on by default): one Redis node (or a Sentinel-watched
//!   master), Lua scripts, pub/sub wake-ups; with the feature `cluster`, a Redis Cluster.
//! - `RedlockBackend` (feature `redis`): a majority of N independent Redis masters (plain locks
//!   only).
//!
//! Each implements [`Backend`], which a [`LockClient`](crate::LockClient) is built on. What a
//! store keeps and how a client talks to it (the protocol) is not public: its maintainers'
//! description is `src/backend/protocol.md` in the repository.

mod listeners;
pub mod memory;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "redis")]
pub mod redlock;
// The protocol between the engine and a store. Public under the feature `unstable-backend`
// (for tests that wrap a store to delay or fail chosen calls), never part of the stable API.
#[cfg(feature = "unstable-backend")]
#[doc(hidden)]
pub mod store;
#[cfg(not(feature = "unstable-backend"))]
pub(crate) mod store;

#[cfg(all(test, feature = "redis"))]
mod differential_tests;

pub(crate) use listeners::{Listener, Listeners};

/// A store a [`LockClient`](crate::LockClient) can keep its locks in:
/// [`MemoryBackend`](memory::MemoryBackend), `RedisBackend` or `RedlockBackend`.
///
/// The trait is sealed: its methods are the crate's lock protocol, which is not a public API.
pub trait Backend: store::Store {}

impl<T: store::Store> Backend for T {}

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
    /// A permit of a semaphore: at most its number of permits are held at once, each with a
    /// lease of its own. No fencing tokens (permits are shared).
    Semaphore,
}

impl LockKind {
    /// Whether waiters of this kind keep a place in a queue in the store.
    pub(crate) fn queues(self) -> bool {
        matches!(self, Self::Fair | Self::Write)
    }

    /// Whether a grant of this kind is its lock's owner record (plain, fair and write), rather
    /// than one of its shared grants (readers, permits).
    pub(crate) fn owns(self) -> bool {
        matches!(self, Self::Exclusive | Self::Fair | Self::Write)
    }

    /// Whether a holder's grant of kind `held` serves a new acquire of `self` by the same
    /// holder as a re-entry: the same record (a plain and a fair lock of one name share theirs).
    pub(crate) fn reenters(self, held: Self) -> bool {
        self == held
            || (self.owns() && held.owns() && (self == Self::Write) == (held == Self::Write))
    }
}
