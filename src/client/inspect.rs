//! Operators' calls: who holds a lock ([`LockClient::inspect`]) and clearing a stuck one
//! ([`LockClient::force_unlock`]).

use futures_util::future::join_all;

use super::LockClient;
use crate::{
    backend::{Backend, LockKind},
    engine::Loss,
    error::LockError,
    inspect::LockInfo,
    lock_key::LockKey,
};

/// The kinds of lock one user key names, one per layout in the backend: the exclusive (or
/// fair) lock, the read-write lock and the semaphore.
const LAYOUTS: [LockKind; 3] = [LockKind::Exclusive, LockKind::Write, LockKind::Semaphore];

impl<B: Backend> LockClient<B> {
    /// The backend locks of `key` in `namespace`, each with the kind that names its layout.
    fn locks_of(&self, namespace: &str, key: &[u8]) -> Result<Vec<(LockKey, LockKind)>, LockError> {
        let name = |kind| Ok((self.key_in(namespace, key, kind)?, kind));
        LAYOUTS.into_iter().map(name).collect()
    }

    /// Who holds the locks of `key` right now: its exclusive (or fair) lock, its read-write
    /// lock and its semaphore, named as [`lock`](Self::lock),
    /// [`read_write_lock`](Self::read_write_lock) and [`semaphore`](Self::semaphore) name them
    /// (prefix, escaping, keyed hash). Reads only; one backend call per lock, made at once.
    ///
    /// The answer is a snapshot: by the time it arrives a holder may have released. The holder
    /// ids are those of [`LockGuard::holder`](crate::LockGuard::holder).
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] for a key [`lock`](Self::lock) would refuse;
    /// [`LockError::Backend`] when the backend fails, or with
    /// [`BackendErrorKind::WrongType`](crate::error::BackendErrorKind::WrongType) when a lock's
    /// name holds data that is not a lock.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_lock::LockError> {
    /// use tower_lock::{LockClient, LockKind};
    ///
    /// let locks = LockClient::in_memory();
    /// assert!(!locks.inspect("doc:7").await?.is_locked());
    ///
    /// let rw = locks.read_write_lock("doc:7");
    /// let (a, b) = (rw.read().acquire().await?, rw.read().acquire().await?);
    /// let info = locks.inspect("doc:7").await?;
    /// assert_eq!(info.kind(), Some(LockKind::Read));
    /// assert_eq!(info.holders.len(), 2);
    /// # a.release().await?;
    /// # b.release().await
    /// # }
    /// ```
    pub async fn inspect(&self, key: impl AsRef<[u8]>) -> Result<LockInfo, LockError> {
        self.inspect_in_namespace("", key).await
    }

    /// [`inspect`](Self::inspect) for the locks of `key` in `namespace`: what a
    /// [`LockLayer`](crate::LockLayer) in that namespace takes, as
    /// [`lock_in_namespace`](Self::lock_in_namespace) names it.
    ///
    /// # Errors
    /// As [`inspect`](Self::inspect).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_lock::LockError> {
    /// let locks = tower_lock::LockClient::in_memory();
    /// let guard = locks.lock_in_namespace("withdraw", "7").acquire().await?;
    /// assert!(locks.inspect_in_namespace("withdraw", "7").await?.is_locked());
    /// assert!(!locks.inspect("7").await?.is_locked());
    /// # guard.release().await
    /// # }
    /// ```
    pub async fn inspect_in_namespace(
        &self,
        namespace: &str,
        key: impl AsRef<[u8]>,
    ) -> Result<LockInfo, LockError> {
        let backend = &self.inner.engine.backend;
        let locks = self.locks_of(namespace, key.as_ref())?;
        let found = join_all(locks.iter().map(|(key, kind)| backend.inspect(key, *kind))).await;
        let mut info = LockInfo::free();
        for (found, (key, _)) in found.into_iter().zip(&locks) {
            let mut found = found.map_err(|error| error.with_key(key.as_str()))?;
            // The store keeps one record per grant; this client counts its own holders' holds.
            for holder in &mut found.holders {
                if let Some(count) =
                    self.inner.engine.table.hold_count(key, &holder.id, holder.kind)
                {
                    holder.hold_count = count;
                }
            }
            info = info.merge(found);
        }
        Ok(info)
    }

    /// Frees the locks of `key` whoever holds them, for an operator clearing a stuck lock.
    /// Returns whether anything was held.
    ///
    /// Every hold of the key's exclusive (or fair) lock, read-write lock and semaphore is
    /// deleted, and the release is announced, so waiters in every process try again at once (a fair lock
    /// keeps its queue, and its head is woken). A warning is logged with the key and the
    /// holders cleared, and `tower_lock_force_unlocks_total` counts them (feature `metrics`).
    ///
    /// The holders' guards find out: in this client at once, elsewhere at their watchdog's
    /// next renewal (within a third of the lease) — each guard's
    /// [`lost`](crate::LockGuard::lost) resolves then. A holder with a fixed lease is not
    /// renewed and learns of it only from a fencing token refused downstream: without fencing
    /// it may still be at work when the next holder starts.
    ///
    /// Data at a lock's name that is not laid out as a lock is reported as
    /// [`WrongType`](crate::error::BackendErrorKind::WrongType) and not touched (the check is
    /// by shape: keep other data out of the crate's prefix).
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] for a key [`lock`](Self::lock) would refuse;
    /// [`LockError::Backend`] when the backend fails (the call can be repeated), or with
    /// [`BackendErrorKind::WrongType`](crate::error::BackendErrorKind::WrongType) when a lock's
    /// name holds data that is not a lock (the other lock of the key is cleared all the same).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_lock::LockError> {
    /// let locks = tower_lock::LockClient::in_memory();
    /// let guard = locks.lock("order:42").acquire().await?;
    /// assert!(locks.force_unlock("order:42").await?);
    /// assert!(guard.is_lost());
    /// guard.lost().await; // resolved
    /// assert!(!locks.force_unlock("order:42").await?); // nothing left to free
    /// # Ok(())
    /// # }
    /// ```
    pub async fn force_unlock(&self, key: impl AsRef<[u8]>) -> Result<bool, LockError> {
        self.force_unlock_in_namespace("", key).await
    }

    /// [`force_unlock`](Self::force_unlock) for the locks of `key` in `namespace`, as
    /// [`lock_in_namespace`](Self::lock_in_namespace) names them.
    ///
    /// # Errors
    /// As [`force_unlock`](Self::force_unlock).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_lock::LockError> {
    /// let locks = tower_lock::LockClient::in_memory();
    /// let guard = locks.lock_in_namespace("withdraw", "7").acquire().await?;
    /// assert!(locks.force_unlock_in_namespace("withdraw", "7").await?);
    /// assert!(guard.is_lost());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn force_unlock_in_namespace(
        &self,
        namespace: &str,
        key: impl AsRef<[u8]>,
    ) -> Result<bool, LockError> {
        let engine = &self.inner.engine;
        let locks = self.locks_of(namespace, key.as_ref())?;
        // The holds of this client before the call: one taken after it (a waiter here woken by
        // the announcement) is a new hold, not one that was cleared.
        let local: Vec<_> = locks.iter().map(|(key, _)| engine.table.held_entries(key)).collect();
        let cleared =
            join_all(locks.iter().map(|(key, kind)| engine.backend.force_unlock(key, *kind))).await;
        let mut freed = false;
        let mut failed = None;
        for ((before, local), (key, _)) in cleared.into_iter().zip(local).zip(&locks) {
            let before = match before {
                Ok(before) => before,
                Err(error) => {
                    failed.get_or_insert(error.with_key(key.as_str()));
                    continue;
                }
            };
            if let Some(kind) = before.kind() {
                freed = true;
                let holders: Vec<&str> = before.holders.iter().map(|h| h.id.as_str()).collect();
                tracing::warn!(key = %key, ?holders, queued = before.queue_len, "lock force-unlocked");
                crate::metrics::force_unlocked(kind);
            }
            for held in local {
                if before.holder(held.holder.id()).is_some() {
                    engine.lose(&held, Loss::Taken("force-unlocked by an operator"));
                }
            }
        }
        match failed {
            Some(error) => Err(LockError::Backend(error)),
            None => Ok(freed),
        }
    }
}
