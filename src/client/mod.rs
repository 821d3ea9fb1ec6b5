//! [`LockClient`]: the lock engine's public face, its builder and lock requests.

use std::{fmt, sync::Arc};

use crate::{
    backend::{Backend, LockKind},
    engine::{Config, EngineRef},
    holder::Holder,
    lock_key::{KeyError, LockKey},
};

mod builder;
pub(crate) mod holds;
mod inspect;
mod multi;
mod request;

pub use builder::LockClientBuilder;
pub use multi::{MultiLockError, MultiLockRequest};
pub use request::{LockRequest, ReadWriteLock};

/// The lock engine: acquires, renews and releases locks in a [`Backend`].
///
/// Cheap to clone; clones share the watchdog, the waiter queues and the backend connections.
/// Dropping the last clone (and the last guard) stops the background tasks.
///
/// ```
/// use std::time::Duration;
/// use tower_lock::{Lease, LockClient, MemoryBackend};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let locks = LockClient::builder(MemoryBackend::new())
///     .prefix("shop:")
///     .lease(Lease::watchdog(Duration::from_secs(30)))
///     .wait(Duration::from_secs(5))
///     .build()?;
///
/// let guard = locks.lock("order:42").fencing().acquire().await?;
/// assert!(guard.fencing_token().is_some());
///
/// // Someone else cannot have it meanwhile.
/// let busy = locks.lock("order:42").try_acquire().await;
/// assert!(matches!(busy, Err(tower_lock::LockError::WaitTimeout { .. })));
///
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
pub struct LockClient<B: Backend> {
    pub(crate) inner: Arc<EngineRef<B>>,
    /// How long this client's locks are typically held, per lock family: the `Retry-After` of
    /// a busy lock on every path.
    pub(crate) holds: Arc<holds::HoldStats>,
}

impl<B: Backend> Clone for LockClient<B> {
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone(), holds: self.holds.clone() }
    }
}

impl<B: Backend> fmt::Debug for LockClient<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("id", &self.inner.engine.id)
            .field("config", &self.inner.engine.config)
            .finish_non_exhaustive()
    }
}

impl LockClient<crate::MemoryBackend> {
    /// A client on a fresh [`MemoryBackend`](crate::MemoryBackend) with default settings.
    pub fn in_memory() -> Self {
        Self::builder(crate::MemoryBackend::new())
            .build()
            .unwrap_or_else(|_| unreachable!("the default configuration is valid"))
    }
}

impl<B: Backend> LockClient<B> {
    /// Starts building a client on `backend`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// use tower_lock::{LockClient, MemoryBackend};
    ///
    /// let locks = LockClient::builder(MemoryBackend::new())
    ///     .prefix("billing:")
    ///     .wait(Duration::from_secs(2))
    ///     .build()
    ///     .expect("valid settings");
    /// # let _ = locks;
    /// ```
    pub fn builder(backend: B) -> LockClientBuilder<B> {
        LockClientBuilder { backend, config: Config::default() }
    }

    /// A request for the lock named `key`, to configure and then
    /// [`acquire`](LockRequest::acquire). The key is validated and escaped here; an invalid key
    /// fails at acquire time with [`LockError::InvalidKey`](crate::LockError::InvalidKey).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_lock::LockError> {
    /// use std::time::Duration;
    ///
    /// let locks = tower_lock::LockClient::in_memory();
    /// let guard = locks
    ///     .lock("order:42")
    ///     .wait(Duration::from_secs(1))
    ///     .acquire()
    ///     .await?;
    /// guard.release().await
    /// # }
    /// ```
    pub fn lock(&self, key: impl AsRef<[u8]>) -> LockRequest<'_, B> {
        self.request(self.key(key.as_ref()), LockKind::Exclusive)
    }

    /// A request for the lock named `key` in `namespace`: the same lock a
    /// [`LockLayer`](crate::LockLayer) named `namespace` (or on the route `namespace`) takes for
    /// that key, so code inside or outside the request can share it.
    pub fn lock_in_namespace(&self, namespace: &str, key: impl AsRef<[u8]>) -> LockRequest<'_, B> {
        let key = self.key_in(namespace, key.as_ref(), LockKind::Exclusive);
        self.request(key, LockKind::Exclusive)
    }

    /// A request for the locks named `keys`, taken together: one guard, one holder, one wait
    /// for the set, all or nothing, in one canonical order so that two sets sharing locks
    /// cannot deadlock. The locks are those [`lock`](Self::lock) takes for each key
    /// ([`fair`](MultiLockRequest::fair), [`read`](MultiLockRequest::read) and
    /// [`write`](MultiLockRequest::write) choose another kind). See [`MultiLockRequest`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let locks = tower_lock::LockClient::in_memory();
    /// let (from, to) = ("account:9", "account:4");
    /// let both = locks.lock_all([from, to]).acquire().await?;
    /// // ... move the money ...
    /// both.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn lock_all<K: AsRef<[u8]>>(
        &self,
        keys: impl IntoIterator<Item = K>,
    ) -> MultiLockRequest<'_, B> {
        self.lock_all_in_namespace("", keys)
    }

    /// [`lock_all`](Self::lock_all) in `namespace`: the locks a [`LockLayer`](crate::LockLayer)
    /// named `namespace` takes for these keys, as [`lock_in_namespace`](Self::lock_in_namespace)
    /// is for one.
    pub fn lock_all_in_namespace<K: AsRef<[u8]>>(
        &self,
        namespace: &str,
        keys: impl IntoIterator<Item = K>,
    ) -> MultiLockRequest<'_, B> {
        let named = keys
            .into_iter()
            .map(|key| {
                let key = key.as_ref();
                Ok((key.to_vec(), self.name(namespace, key)?))
            })
            .collect();
        MultiLockRequest::new(self, named, LockKind::Exclusive)
    }

    /// A request for the set of `keys` (user keys and their names in `key_in(.., Exclusive)`)
    /// of `kind`: what a layer or an attribute takes.
    pub(crate) fn request_all_for(
        &self,
        keys: Vec<(Vec<u8>, LockKey)>,
        kind: LockKind,
    ) -> MultiLockRequest<'_, B> {
        MultiLockRequest::new(self, Ok(keys), kind)
    }

    /// A request for the fair lock named `key`: waiters get it in the order they asked, across
    /// every process. It shares its name with [`lock`](Self::lock)'s lock; use one kind per key.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_lock::LockError> {
    /// let locks = tower_lock::LockClient::in_memory();
    /// let guard = locks.fair_lock("order:42").acquire().await?;
    /// guard.release().await
    /// # }
    /// ```
    pub fn fair_lock(&self, key: impl AsRef<[u8]>) -> LockRequest<'_, B> {
        self.request(self.key(key.as_ref()), LockKind::Fair)
    }

    /// The read-write lock named `key`: many readers or one writer. A waiting writer holds
    /// back new readers; the writer may take the read side too and keep it after releasing the
    /// write side (downgrade), but a reader asking for the write side fails with
    /// [`LockError::UpgradeRefused`](crate::LockError::UpgradeRefused). Its name is separate from [`lock`](Self::lock)'s.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_lock::LockError> {
    /// let locks = tower_lock::LockClient::in_memory();
    /// let rw = locks.read_write_lock("doc:7");
    /// let a = rw.read().acquire().await?;
    /// let b = rw.read().acquire().await?; // readers share
    /// assert!(rw.write().try_acquire().await.is_err());
    /// a.release().await?;
    /// b.release().await
    /// # }
    /// ```
    pub fn read_write_lock(&self, key: impl AsRef<[u8]>) -> ReadWriteLock<'_, B> {
        ReadWriteLock {
            client: self,
            key: self.key(key.as_ref()).map(|key| key.with_suffix(":rw")),
        }
    }

    /// A request for a permit of the semaphore named `key`: at most `permits` holders hold one
    /// at once, across every process sharing the backend. A permit is leased and renewed like
    /// a lock (a crashed holder's permit comes back when its lease runs out), waiters are woken
    /// when a permit is given back, and a holder that acquires again nests in the permit it
    /// has. Use one permit count per key: each acquire is checked against its own count. Its
    /// name is separate from [`lock`](Self::lock)'s; it has no fencing tokens. Not offered by
    /// Redlock.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_lock::LockError> {
    /// let locks = tower_lock::LockClient::in_memory();
    /// let a = locks.semaphore("exports:tenant-7", 2).acquire().await?;
    /// let b = locks.semaphore("exports:tenant-7", 2).acquire().await?;
    /// // Both permits are out: a third request waits (here: not at all) and is refused.
    /// assert!(locks.semaphore("exports:tenant-7", 2).try_acquire().await.is_err());
    /// a.release().await?;
    /// let c = locks.semaphore("exports:tenant-7", 2).try_acquire().await?;
    /// # b.release().await?;
    /// # c.release().await
    /// # }
    /// ```
    ///
    /// # Errors
    /// At acquire time, [`LockError::InvalidPermits`](crate::LockError::InvalidPermits) when
    /// `permits` is 0, and an [`Unsupported`](crate::error::BackendErrorKind::Unsupported)
    /// backend error when [`fencing`](LockRequest::fencing) was asked for; otherwise as for a
    /// lock.
    pub fn semaphore(&self, key: impl AsRef<[u8]>, permits: u32) -> LockRequest<'_, B> {
        let key = self.key_in("", key.as_ref(), LockKind::Semaphore);
        LockRequest { permits, ..self.request(key, LockKind::Semaphore) }
    }

    /// The backend name of the lock `key` in `namespace` (`""` for [`lock`](Self::lock) and
    /// its siblings) of `kind`: what this client locks for that key. The backend derives its
    /// other keys of the lock (and its release channel) by appending suffixes to it.
    ///
    /// # Errors
    /// [`KeyError`] when the key is empty or longer than `max_key_len`.
    pub fn lock_key(
        &self,
        namespace: &str,
        key: impl AsRef<[u8]>,
        kind: LockKind,
    ) -> Result<LockKey, KeyError> {
        self.key_in(namespace, key.as_ref(), kind)
    }

    /// The lock name of `key` in `namespace`, for a lock of `kind`.
    pub(crate) fn key_in(
        &self,
        namespace: &str,
        key: &[u8],
        kind: LockKind,
    ) -> Result<LockKey, KeyError> {
        let name = self.name(namespace, key)?;
        Ok(match kind {
            LockKind::Read | LockKind::Write => name.with_suffix(":rw"),
            LockKind::Semaphore => name.with_suffix(":sem"),
            _ => name,
        })
    }

    /// A request for the lock `key` (from [`key_in`](Self::key_in)) of `kind`.
    pub(crate) fn request_for(&self, key: LockKey, kind: LockKind) -> LockRequest<'_, B> {
        self.request(Ok(key), kind)
    }

    fn key(&self, key: &[u8]) -> Result<LockKey, KeyError> {
        self.name("", key)
    }

    /// The one place user keys become lock names: escaped, or hashed under the secret.
    fn name(&self, namespace: &str, key: &[u8]) -> Result<LockKey, KeyError> {
        let config = &self.inner.engine.config;
        #[cfg(feature = "keyed-hash")]
        if let Some(hash) = &config.keyed_hash {
            return hash.name(&config.prefix, namespace, key, config.max_key_len);
        }
        LockKey::namespaced(&config.prefix, namespace, key, config.max_key_len)
    }

    fn request(&self, key: Result<LockKey, KeyError>, kind: LockKind) -> LockRequest<'_, B> {
        let config = &self.inner.engine.config;
        LockRequest {
            client: self,
            key,
            kind,
            wait: config.wait,
            lease: config.lease,
            fencing: false,
            holder: None,
            permits: 0,
        }
    }

    /// A new holder identity of this client, for [`Holder::scope`].
    pub fn holder(&self) -> Holder {
        self.inner.engine.new_holder()
    }

    /// The backend this client uses.
    pub fn backend(&self) -> &B {
        &self.inner.engine.backend
    }

    /// How many keys this client holds or waits for right now.
    pub fn active_keys(&self) -> usize {
        self.inner.engine.table.key_count()
    }

    /// How many waiters of this client hold a place in a backend queue right now (fair locks
    /// and writers of read-write locks).
    pub fn queued(&self) -> usize {
        self.inner.engine.table.queued_count()
    }

    /// How many acquires of this client are waiting right now: queued behind a holder or
    /// another waiter, or with their attempt on its way to the backend.
    pub fn waiters(&self) -> usize {
        self.inner.engine.table.waiter_count()
    }

    /// Releases every lock this client holds, fails every waiting acquire with
    /// [`LockError::ShutDown`](crate::LockError::ShutDown), and stops the background tasks. Guards still alive report
    /// themselves lost. A release that fails (this one's, or one already being retried) is sent
    /// again for up to a second, so that a lock is not left to its lease over one failed try.
    /// Other clients on clones of the same backend keep their locks, and the backend keeps
    /// serving them (its own background work stops with its last handle).
    pub async fn shutdown(&self) {
        let shared = &self.inner.engine;
        shared.stop.cancel();
        let held = shared.table.drain_held();
        // Each of this client's own grants, by name: nothing of another client's goes. A delete
        // that fails is sent again for the clean-up grace, as any release's is.
        let releases = held.iter().filter(|held| held.end()).map(|held| async move {
            held.mark_lost();
            let mut reply = shared.backend.release(held.release()).await;
            if let Err(error) = reply {
                reply = shared.release_again(held, error).await;
            }
            if let Err(error) = reply {
                tracing::warn!(key = %held.key, error = %format_args!("{error:#}"), "release at shutdown failed");
            }
        });
        futures_util::future::join_all(releases).await;
        shared.backend.shutdown().await;
        tracing::debug!(released = held.len(), "lock client shut down");
    }
}
