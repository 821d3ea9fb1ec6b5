//! The lock engine: [`LockClient`], its builder and lock requests.

use std::{
    fmt,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::{runtime::Handle, sync::Notify};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::{
    backend::{AcquireReply, Backend, Grant, Listen, LockKind, Release, ReleaseReply},
    clock::BootInstant,
    error::{BackendError, BackendErrorKind, ConfigError, LockError},
    guard::LockGuard,
    holder::Holder,
    key::{self, KeyError, LockKey},
    lease::Lease,
    local::{Slot, Table, Turn, Want},
    watchdog::{self, Held},
};

/// The shortest lease that can be kept: renewals run every third of it.
const MIN_LEASE: Duration = Duration::from_millis(3);

/// Settings of a [`LockClient`]; `Default` states every default in one place.
#[derive(Clone, Debug)]
struct Config {
    prefix: String,
    lease: Lease,
    wait: Duration,
    max_key_len: usize,
    max_hold: Option<Duration>,
    max_waiters_per_key: usize,
    max_waiters: usize,
    handoff_streak: u32,
    waiter_timeout: Duration,
    #[cfg(feature = "keyed-hash")]
    keyed_hash: Option<key::KeyedHash>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            prefix: "tower-lock:".to_owned(),
            lease: Lease::DEFAULT,
            wait: Duration::from_secs(5),
            max_key_len: key::DEFAULT_MAX_KEY_LEN,
            max_hold: None,
            max_waiters_per_key: 1024,
            max_waiters: 10_000,
            handoff_streak: 4,
            waiter_timeout: Duration::from_secs(5),
            #[cfg(feature = "keyed-hash")]
            keyed_hash: None,
        }
    }
}

/// Builds a [`LockClient`]. Made by [`LockClient::builder`].
#[derive(Debug)]
#[must_use]
pub struct LockClientBuilder<B> {
    backend: B,
    config: Config,
}

impl<B: Backend> LockClientBuilder<B> {
    /// The prefix of every backend key this client uses. Must not contain `{` or `}`.
    /// Defaults to `"tower-lock:"`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.config.prefix = prefix.into();
        self
    }

    /// The lease used when a request does not set one. Defaults to
    /// `Lease::watchdog(Duration::from_secs(30))`.
    pub fn lease(mut self, lease: Lease) -> Self {
        self.config.lease = lease;
        self
    }

    /// How long [`LockRequest::acquire`] waits when a request does not say. Zero means try
    /// once. Defaults to 5 seconds.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.config.wait = wait;
        self
    }

    /// The longest user key accepted, in bytes. Defaults to 512.
    pub fn max_key_len(mut self, max: usize) -> Self {
        self.config.max_key_len = max;
        self
    }

    /// The longest the watchdog keeps renewing one lock; after that the lease runs out and the
    /// guard reports itself lost. Defaults to no limit.
    pub fn max_hold(mut self, max: Duration) -> Self {
        self.config.max_hold = Some(max);
        self
    }

    /// How many acquires may wait for one key in this client at once; one more fails at once
    /// with [`LockError::TooManyWaiters`]. Defaults to 1024.
    pub fn max_waiters_per_key(mut self, max: usize) -> Self {
        self.config.max_waiters_per_key = max;
        self
    }

    /// How many acquires may wait in this client at once, over all keys; one more fails at
    /// once with [`LockError::TooManyWaiters`] (the layer answers 503 with `Retry-After`).
    /// Each waiter costs a task, and for a new key a subscription. Defaults to 10 000.
    pub fn max_waiters(mut self, max: usize) -> Self {
        self.config.max_waiters = max;
        self
    }

    /// Names locks by `base64url(HMAC-SHA256(secret, namespace and key))` instead of the
    /// escaped key: every name is as long whatever the key, and nobody without the secret can
    /// choose keys that crowd one Redis Cluster slot. Clients sharing locks must share the
    /// secret (and prefix); switching it on or off, or changing the secret, renames every lock,
    /// so do it only while no old-style holder runs. Off by default. The secret never appears
    /// in `Debug` output.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use tower_lock::{LockClient, LockKind, MemoryBackend};
    ///
    /// let locks = LockClient::builder(MemoryBackend::new())
    ///     .keyed_hash(b"a secret from your configuration")
    ///     .build()?;
    /// let name = locks.lock_key("", "order:42", LockKind::Exclusive)?;
    /// assert_eq!(name.as_str().len(), "tower-lock:{}".len() + 43);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "keyed-hash")]
    pub fn keyed_hash(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.config.keyed_hash = Some(key::KeyedHash::new(secret.as_ref()));
        self
    }

    /// How many times in a row a release may hand the lock straight to a waiter of this client
    /// before it releases for real, giving waiters in other processes their turn. While no
    /// other process was seen waiting for the key, the streak may run eight times longer.
    /// Zero disables hand-off. Defaults to 4.
    pub fn handoff_streak(mut self, max: u32) -> Self {
        self.config.handoff_streak = max;
        self
    }

    /// How long a waiter's place in a fair lock's queue (or a waiting writer's claim on a
    /// read-write lock) survives without being kept alive. A live waiter's client keeps it
    /// alive; a crashed waiter is purged after this and the next waiter moves up. Defaults to
    /// 5 seconds.
    pub fn waiter_timeout(mut self, timeout: Duration) -> Self {
        self.config.waiter_timeout = timeout;
        self
    }

    /// Builds the client. Its watchdog starts with the first lock it takes, on that caller's
    /// tokio runtime.
    ///
    /// # Errors
    /// [`ConfigError`] naming the setting that cannot work: a prefix with braces, a zero lease,
    /// a zero `max_key_len`.
    pub fn build(self) -> Result<LockClient<B>, ConfigError> {
        let config = self.config;
        if !key::valid_prefix(&config.prefix) {
            return Err(ConfigError::PrefixBraces(config.prefix));
        }
        if config.lease.duration() < MIN_LEASE {
            return Err(ConfigError::LeaseTooShort);
        }
        if config.max_key_len == 0 {
            return Err(ConfigError::ZeroMaxKeyLen);
        }
        if config.waiter_timeout < Duration::from_millis(3) {
            return Err(ConfigError::Invalid {
                setting: "waiter_timeout",
                reason: "must be at least 3 ms, so it can be kept alive",
            });
        }
        let shared = Arc::new(Shared {
            backend: self.backend,
            config,
            table: Table::default(),
            id: uuid::Uuid::new_v4().simple().to_string(),
            sequence: AtomicU64::new(0),
            waiting: AtomicUsize::new(0),
            stop: CancellationToken::new(),
            watchdog_wake: Notify::new(),
            watchdog_due: AtomicU64::new(0),
            runtime: OnceLock::new(),
        });
        Ok(LockClient {
            inner: Arc::new(ClientInner { shared }),
        })
    }
}

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
/// assert_eq!(guard.fencing_token(), Some(1));
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
    inner: Arc<ClientInner<B>>,
}

impl<B: Backend> Clone for LockClient<B> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<B: Backend> fmt::Debug for LockClient<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("id", &self.inner.shared.id)
            .field("config", &self.inner.shared.config)
            .finish_non_exhaustive()
    }
}

/// Owned by every client clone and every guard; stops the background work when the last goes.
pub(crate) struct ClientInner<B: Backend> {
    pub(crate) shared: Arc<Shared<B>>,
}

impl<B: Backend> Drop for ClientInner<B> {
    fn drop(&mut self) {
        self.shared.stop.cancel();
    }
}

/// State shared by the client, its guards and its watchdog task.
pub(crate) struct Shared<B: Backend> {
    pub(crate) backend: B,
    config: Config,
    pub(crate) table: Table<B::Listener>,
    id: String,
    sequence: AtomicU64,
    /// Acquires waiting right now, for the `max_waiters` cap.
    waiting: AtomicUsize,
    pub(crate) stop: CancellationToken,
    pub(crate) watchdog_wake: Notify,
    /// When the watchdog plans to wake next (boot-clock nanoseconds).
    pub(crate) watchdog_due: AtomicU64,
    runtime: OnceLock<Handle>,
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
    pub fn builder(backend: B) -> LockClientBuilder<B> {
        LockClientBuilder {
            backend,
            config: Config::default(),
        }
    }

    /// A request for the lock named `key`, to configure and then
    /// [`acquire`](LockRequest::acquire). The key is validated and escaped here; an invalid key
    /// fails at acquire time with [`LockError::InvalidKey`].
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
    /// [`LockError::UpgradeRefused`]. Its name is separate from [`lock`](Self::lock)'s.
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
        let config = &self.inner.shared.config;
        #[cfg(feature = "keyed-hash")]
        if let Some(hash) = &config.keyed_hash {
            return hash.name(&config.prefix, namespace, key, config.max_key_len);
        }
        LockKey::namespaced(&config.prefix, namespace, key, config.max_key_len)
    }

    fn request(&self, key: Result<LockKey, KeyError>, kind: LockKind) -> LockRequest<'_, B> {
        let config = &self.inner.shared.config;
        LockRequest {
            client: self,
            key,
            kind,
            wait: config.wait,
            lease: config.lease,
            fencing: false,
            holder: None,
        }
    }

    /// A new holder identity of this client, for [`Holder::scope`].
    pub fn holder(&self) -> Holder {
        self.inner.shared.new_holder()
    }

    /// The backend this client uses.
    pub fn backend(&self) -> &B {
        &self.inner.shared.backend
    }

    /// How many keys this client holds or waits for right now.
    pub fn active_keys(&self) -> usize {
        self.inner.shared.table.key_count()
    }

    /// How many waiters of this client hold a place in a backend queue right now (fair locks
    /// and writers of read-write locks).
    pub fn queued(&self) -> usize {
        self.inner.shared.table.queued_count()
    }

    /// How many acquires of this client are waiting right now.
    pub fn waiters(&self) -> usize {
        self.inner.shared.table.waiter_count()
    }

    /// Releases every lock this client holds, fails every waiting acquire with
    /// [`LockError::ShutDown`], and stops the background tasks. Guards still alive report
    /// themselves lost.
    pub async fn shutdown(&self) {
        let shared = &self.inner.shared;
        shared.stop.cancel();
        let held = shared.table.drain_held();
        let releases = held.iter().map(|held| async move {
            held.lost.cancel();
            if let Err(error) = shared.backend.release(held.release_all()).await {
                tracing::warn!(key = %held.key, %error, "release at shutdown failed");
            }
        });
        futures_util::future::join_all(releases).await;
        shared.backend.shutdown().await;
        tracing::debug!(released = held.len(), "lock client shut down");
    }
}

/// Both sides of one read-write lock. Made by [`LockClient::read_write_lock`].
pub struct ReadWriteLock<'a, B: Backend> {
    client: &'a LockClient<B>,
    key: Result<LockKey, KeyError>,
}

impl<'a, B: Backend> ReadWriteLock<'a, B> {
    /// A request for the read side, shared with other readers.
    pub fn read(&self) -> LockRequest<'a, B> {
        self.client.request(self.key.clone(), LockKind::Read)
    }

    /// A request for the write side, exclusive.
    pub fn write(&self) -> LockRequest<'a, B> {
        self.client.request(self.key.clone(), LockKind::Write)
    }
}

impl<B: Backend> fmt::Debug for ReadWriteLock<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadWriteLock")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// One lock acquisition to configure. Made by [`LockClient::lock`],
/// [`LockClient::fair_lock`] and [`ReadWriteLock`].
#[must_use = "a lock request does nothing until acquired"]
pub struct LockRequest<'a, B: Backend> {
    client: &'a LockClient<B>,
    key: Result<LockKey, KeyError>,
    kind: LockKind,
    wait: Duration,
    lease: Lease,
    fencing: bool,
    holder: Option<Holder>,
}

impl<B: Backend> fmt::Debug for LockRequest<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockRequest")
            .field("key", &self.key)
            .field("kind", &self.kind)
            .field("wait", &self.wait)
            .field("lease", &self.lease)
            .field("fencing", &self.fencing)
            .field("holder", &self.holder)
            .finish()
    }
}

impl<B: Backend> LockRequest<'_, B> {
    /// How long to wait for the lock. Zero means try once. Defaults to the client's `wait`.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// The lease to hold the lock with. Defaults to the client's `lease`.
    pub fn lease(mut self, lease: Lease) -> Self {
        self.lease = lease;
        self
    }

    /// Issue a fencing token with the lock ([`LockGuard::fencing_token`]). Off by default: the
    /// counter is a backend key per lock name that never expires.
    pub fn fencing(mut self) -> Self {
        self.fencing = true;
        self
    }

    /// Acquire as `holder` instead of the current [`Holder::scope`] (or a fresh holder). Unlike
    /// a scope, an explicit holder is used even when another client made it.
    pub fn holder(mut self, holder: &Holder) -> Self {
        self.holder = Some(holder.clone());
        self
    }

    /// Acquires the lock, waiting up to the request's `wait` for it.
    ///
    /// # Errors
    /// [`LockError::WaitTimeout`] when another holder kept it for the whole wait,
    /// [`LockError::InvalidKey`], [`LockError::TooManyWaiters`], [`LockError::Backend`] when the
    /// backend failed (an acquire whose reply was lost is undone before this returns, where the
    /// backend can still be reached), [`LockError::ShutDown`].
    pub async fn acquire(self) -> Result<LockGuard<B>, LockError> {
        let kind = self.kind;
        let checked = self.key.map_err(LockError::from).and_then(|key| {
            if self.lease.duration() < MIN_LEASE {
                return Err(LockError::InvalidLease(self.lease.duration()));
            }
            Ok(key)
        });
        let key = match checked {
            Ok(key) => key,
            Err(error) => {
                crate::metrics::acquire_finished(kind, Err(&error), Duration::ZERO);
                return Err(error);
            }
        };
        let inner = &self.client.inner;
        let shared = &inner.shared;
        if shared.stop.is_cancelled() {
            return Err(LockError::ShutDown);
        }
        shared.start_watchdog();
        let holder = self
            .holder
            .or_else(|| Holder::current().filter(|holder| holder.is_from(&shared.id)))
            .unwrap_or_else(|| shared.new_holder());
        let request = Request {
            key,
            want: Arc::new(Want {
                attempt: format!("{holder}#{}", shared.next_id()),
                holder,
                kind: self.kind,
                lease: self.lease,
                fencing: self.fencing,
                supersedes: None,
            }),
            wait: self.wait,
        };
        let started = tokio::time::Instant::now();
        let span = tracing::debug_span!(
            "lock_acquire",
            key = %request.key,
            kind = ?request.want.kind,
            holder = %request.want.holder
        );
        let want = &request.want;
        let result = match shared.table.held_by(&request.key, &want.holder, want.kind) {
            Some(held) => shared.reenter(&request, &held).instrument(span).await,
            None => shared.wait_and_acquire(&request).instrument(span).await,
        };
        let waited = started.elapsed();
        crate::metrics::acquire_finished(request.want.kind, result.as_ref().map(|_| ()), waited);
        match result {
            Ok((held, count)) => {
                tracing::debug!(
                    key = %request.key,
                    count,
                    waited_ms = waited.as_millis() as u64,
                    token = held.token,
                    "lock acquired"
                );
                Ok(LockGuard::new(inner.clone(), held, count))
            }
            Err(error) => {
                tracing::debug!(
                    key = %request.key,
                    waited_ms = waited.as_millis() as u64,
                    %error,
                    "lock not acquired"
                );
                Err(error)
            }
        }
    }

    /// Tries once, without waiting. Same as `.wait(Duration::ZERO).acquire()`.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    pub async fn try_acquire(self) -> Result<LockGuard<B>, LockError> {
        self.wait(Duration::ZERO).acquire().await
    }
}

/// A validated acquire.
struct Request {
    key: LockKey,
    want: Arc<Want>,
    wait: Duration,
}

/// A release decided locally (renewal already stopped), with its backend call still to make.
pub(crate) struct Releasing {
    held: Arc<Held>,
    handoff: Option<Slot>,
    /// The hand-off streak ended: local waiters let other processes go first.
    yield_turn: bool,
}

/// One acquire counted against `max_waiters` until it ends, however it ends.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    /// Counts one more waiter of `shared`, or refuses it when `max_waiters` already wait.
    fn admit<B: Backend>(shared: &'a Shared<B>) -> Result<Self, LockError> {
        let waiting = &shared.waiting;
        if waiting.fetch_add(1, Ordering::AcqRel) >= shared.config.max_waiters {
            waiting.fetch_sub(1, Ordering::AcqRel);
            tracing::debug!(
                max = shared.config.max_waiters,
                "too many waiters in this client"
            );
            return Err(LockError::TooManyWaiters);
        }
        crate::metrics::waiting(true);
        Ok(Self(waiting))
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
        crate::metrics::waiting(false);
    }
}

/// Leaves the waiter queue when the acquire future ends, however it ends.
struct QueueGuard<'a, B: Backend> {
    shared: &'a Arc<Shared<B>>,
    request: &'a Request,
    id: u64,
    /// The waiter has a place in the backend's queue to give up.
    in_backend: bool,
}

impl<B: Backend> Drop for QueueGuard<'_, B> {
    fn drop(&mut self) {
        self.shared.table.leave(&self.request.key, self.id);
        if !self.in_backend {
            return;
        }
        let Some(runtime) = self.shared.runtime() else {
            return;
        };
        // Leave at once rather than wait to be purged, passing the wake-up on if first.
        let (shared, key, want) = (
            self.shared.clone(),
            self.request.key.clone(),
            self.request.want.clone(),
        );
        runtime.spawn(async move {
            if let Err(error) = shared.backend.leave(&key, want.holder.id(), want.kind).await {
                tracing::debug!(key = %key, %error, "leaving the wait queue failed; the entry times out");
            }
        });
    }
}

impl<B: Backend> Shared<B> {
    fn new_holder(&self) -> Holder {
        Holder::new(&self.id, self.sequence.fetch_add(1, Ordering::Relaxed))
    }

    /// Wakes the watchdog if it must act at `at`, before it planned to wake.
    pub(crate) fn watch(&self, at: BootInstant) {
        if at.as_nanos() < self.watchdog_due.load(Ordering::Acquire) {
            self.watchdog_wake.notify_one();
        }
    }

    fn next_id(&self) -> u64 {
        self.sequence.fetch_add(1, Ordering::Relaxed)
    }

    /// The runtime to spawn background releases on.
    pub(crate) fn runtime(&self) -> Option<Handle> {
        Handle::try_current()
            .ok()
            .or_else(|| self.runtime.get().cloned())
    }

    fn start_watchdog(self: &Arc<Self>) {
        if self.runtime.get().is_some() {
            return;
        }
        let Ok(runtime) = Handle::try_current() else {
            return;
        };
        if self.runtime.set(runtime.clone()).is_ok() {
            runtime.spawn(watchdog::run(self.clone()));
        }
    }

    /// Re-enters a lock the holder already holds here: one round trip, no queueing.
    async fn reenter(
        self: &Arc<Self>,
        request: &Request,
        held: &Arc<Held>,
    ) -> Result<(Arc<Held>, u64), LockError> {
        let grant = request.want.grant(&request.key, None);
        let sent_at = BootInstant::now();
        match self.backend.acquire(grant).await {
            Ok(AcquireReply::Acquired { count, .. }) => {
                self.table.reentered(held, sent_at);
                Ok((held.clone(), count))
            }
            // The backend no longer has it for this holder: the lock was lost behind our back.
            Ok(AcquireReply::Held { .. }) => {
                self.lose(held, "re-entry found another owner");
                Err(LockError::Lost)
            }
            Ok(AcquireReply::WouldDeadlock) => Err(LockError::UpgradeRefused),
            Err(error) => Err(self.unknown_outcome(grant, error).await),
        }
    }

    /// Queues behind local waiters, contends in the backend when first, and waits for a
    /// release notification, a hand-off or the holder's lease to run out.
    async fn wait_and_acquire(
        self: &Arc<Self>,
        request: &Request,
    ) -> Result<(Arc<Held>, u64), LockError> {
        let _waiting = Waiting::admit(self)?;
        let mut want = request.want.clone();
        let id = self.next_id();
        // Fair waiters and waiting writers keep a place in the backend's queue while waiting.
        let queue =
            (want.kind.queues() && !request.wait.is_zero()).then_some(self.config.waiter_timeout);
        let mut ticket = self.table.join(
            id,
            &request.key,
            want.clone(),
            queue,
            self.config.max_waiters_per_key,
        )?;
        let mut queued = QueueGuard {
            shared: self,
            request,
            id,
            in_backend: false,
        };
        let deadline = tokio::time::Instant::now() + request.wait;
        let mut listener = None;
        // The current holder's remaining lease, as last seen: the hint for a caller timed out.
        let mut retry_after = None;
        loop {
            // When to try again at the latest (the holder's lease runs out).
            let retry_in = match self.table.turn(&request.key, id) {
                Turn::Contend => {
                    let grant = want.grant(&request.key, queue);
                    let sent_at = BootInstant::now();
                    let attempt_started = tokio::time::Instant::now();
                    match self.backend.acquire(grant).await {
                        Ok(AcquireReply::Acquired { count, token }) => {
                            // The backend took it out of its queue in the same step.
                            queued.in_backend = false;
                            if want.lease.valid_until(sent_at) <= BootInstant::now() {
                                // Granted, but the reply came after the lease ran out: the
                                // lock may be someone else's already. Undo it and say so.
                                self.resolve_attempt(grant).await;
                                let late = BackendError::new(
                                    BackendErrorKind::Timeout,
                                    "the lock was granted, but the reply came after its lease ran out",
                                );
                                return Err(LockError::Backend(
                                    late.with_key(request.key.as_str()),
                                ));
                            }
                            let held = Held::new(
                                request.key.clone(),
                                want.holder.clone(),
                                want.kind,
                                (want.lease, token),
                                sent_at,
                                self.config.max_hold,
                            );
                            self.table.acquired(&request.key, id, held.clone());
                            self.watch(held.next_event());
                            return Ok((held, count));
                        }
                        Ok(AcquireReply::Held { ttl }) => {
                            retry_after = ttl;
                            if let Some(place) = &ticket.queued {
                                // The watchdog keeps the place alive from now on.
                                self.watch(place.joined(sent_at));
                                queued.in_backend = true;
                            }
                            if request.wait.is_zero() || tokio::time::Instant::now() >= deadline {
                                return Err(LockError::WaitTimeout { retry_after: ttl });
                            }
                            if listener.is_none() {
                                let (shared_listener, fresh) =
                                    self.listen(&request.key, &want).await?;
                                listener = Some(shared_listener);
                                if fresh {
                                    // Check again now that releases can no longer be missed.
                                    continue;
                                }
                            }
                            ttl
                        }
                        Ok(AcquireReply::WouldDeadlock) => return Err(LockError::UpgradeRefused),
                        Err(error) => {
                            let unknown = error.outcome_unknown();
                            let error = self.unknown_outcome(grant, error).await;
                            // A connection that broke (a restarting backend) is tried again
                            // while the wait lasts. A timeout is not: it already took its time.
                            // An attempt that could not end before the deadline is not started:
                            // the caller hears of the failure within its wait.
                            let pause = Duration::from_millis(50);
                            let transient =
                                matches!(&error, LockError::Backend(e) if e.is_unavailable());
                            let now = tokio::time::Instant::now();
                            let next_ends = now + pause + (now - attempt_started);
                            if !transient || next_ends >= deadline {
                                return Err(error);
                            }
                            tracing::debug!(%error, "backend error while waiting; trying again");
                            // The failed attempt may have been voided: retry under a new id. If
                            // it may have taken the lock, the retry takes that hold over.
                            let attempt = format!("{}#{}", want.holder, self.next_id());
                            want = Arc::new(want.retry(attempt, unknown));
                            self.table.set_want(&request.key, id, want.clone());
                            Some(pause)
                        }
                    }
                }
                Turn::Park(remaining) => {
                    retry_after = remaining.or(retry_after);
                    if request.wait.is_zero() {
                        return Err(LockError::WaitTimeout { retry_after });
                    }
                    None
                }
                Turn::Yield(pause) => {
                    if request.wait.is_zero() {
                        return Err(LockError::WaitTimeout {
                            retry_after: Some(pause),
                        });
                    }
                    Some(pause)
                }
                Turn::AwaitHandoff => None,
            };
            tracing::trace!(?retry_in, "waiting for the lock");
            let listening = listener.clone();
            tokio::select! {
                biased;
                () = self.stop.cancelled() => return Err(LockError::ShutDown),
                handed = &mut ticket.handoff => match handed {
                    Ok(held) => return Ok((held, 1)),
                    // Only a dropped table could drop the sender; contend again.
                    Err(_) => return Err(LockError::ShutDown),
                },
                () = ticket.wake.notified() => {}
                () = notified(listening.as_deref()) => {}
                () = sleep_opt(retry_in) => {}
                () = tokio::time::sleep_until(deadline) => {
                    return Err(LockError::WaitTimeout { retry_after });
                }
            }
        }
    }

    /// The release listener for a waiter of `key`; the flag tells whether it is new (the lock
    /// must then be checked again). Exclusive waiters share one per key (only the head
    /// contends); a fair waiter listens for its own name; readers and writers each listen.
    async fn listen(
        &self,
        key: &LockKey,
        want: &Want,
    ) -> Result<(Arc<B::Listener>, bool), LockError> {
        let exclusive = want.kind == LockKind::Exclusive;
        if exclusive && let Some(listener) = self.table.listener(key) {
            return Ok((listener, false));
        }
        let only_for = (want.kind == LockKind::Fair).then(|| want.holder.id());
        let listener = self
            .backend
            .listen(key, only_for)
            .await
            .map_err(|e| LockError::Backend(e.with_key(key.as_str())))?;
        let listener = match exclusive {
            true => self.table.set_listener(key, listener),
            false => Arc::new(listener),
        };
        Ok((listener, true))
    }

    /// An acquire failed without a clear answer: undo what it may have taken, then report it.
    async fn unknown_outcome(self: &Arc<Self>, grant: Grant<'_>, error: BackendError) -> LockError {
        if error.outcome_unknown() {
            self.resolve_attempt(grant).await;
        }
        LockError::Backend(error.with_key(grant.key.as_str()))
    }

    /// Makes sure an attempt whose reply was lost holds nothing: once now, and while the
    /// backend cannot be reached, again in the background until it answers or the attempt's
    /// lease has run out anyway.
    async fn resolve_attempt(self: &Arc<Self>, grant: Grant<'_>) {
        match self.backend.abandon(grant).await {
            Ok(undone) => {
                tracing::info!(key = %grant.key, undone, "resolved an attempt whose reply was lost");
                return;
            }
            Err(error) => tracing::warn!(
                key = %grant.key,
                %error,
                "could not resolve an attempt whose reply was lost; retrying in the background"
            ),
        }
        let Some(runtime) = self.runtime() else {
            return;
        };
        let (shared, key, holder, attempt) = (
            self.clone(),
            grant.key.clone(),
            grant.holder.to_owned(),
            grant.attempt.to_owned(),
        );
        let (lease, fencing, kind) = (grant.lease, grant.fencing, grant.kind);
        runtime.spawn(async move {
            let give_up = tokio::time::Instant::now() + lease.duration();
            let mut pause = Duration::from_millis(50);
            while tokio::time::Instant::now() < give_up && !shared.stop.is_cancelled() {
                tokio::time::sleep(pause).await;
                let grant = Grant {
                    key: &key,
                    holder: &holder,
                    attempt: &attempt,
                    lease,
                    fencing,
                    kind,
                    queue: None,
                    supersedes: None,
                };
                if let Ok(undone) = shared.backend.abandon(grant).await {
                    tracing::info!(key = %key, undone, "resolved an attempt whose reply was lost");
                    return;
                }
                pause = (pause * 2).min(Duration::from_secs(1));
            }
        });
    }

    /// Marks `held` lost, stops renewing it, and frees it in the backend if it is still ours.
    pub(crate) fn lose(self: &Arc<Self>, held: &Arc<Held>, reason: &'static str) {
        if held.lost.is_cancelled() {
            return;
        }
        held.lost.cancel();
        self.table.remove_held(held);
        crate::metrics::lost(held.kind);
        tracing::warn!(key = %held.key, holder = %held.holder, reason, "lock lost");
        // Best effort, owner-checked: if the backend still has it for us (it was unreachable
        // past our deadline), free it now rather than leave it for a whole lease.
        if let Some(runtime) = self.runtime() {
            let shared = self.clone();
            let held = held.clone();
            runtime.spawn(async move {
                let _ = shared.backend.release(held.release_all()).await;
            });
        }
    }

    /// The synchronous half of a release: stop renewing and pick a waiter to hand off to.
    pub(crate) fn begin_release(&self, held: Arc<Held>) -> Result<Releasing, LockError> {
        if held.is_lost() {
            held.drop_ref();
            return Err(LockError::Lost);
        }
        let (handoff, yield_turn) = self.table.release_ref(&held, self.config.handoff_streak);
        Ok(Releasing {
            held,
            handoff,
            yield_turn,
        })
    }

    /// The backend half of a release.
    pub(crate) async fn finish_release(
        self: &Arc<Self>,
        releasing: Releasing,
    ) -> Result<(), LockError> {
        let Releasing {
            held,
            handoff,
            yield_turn,
        } = releasing;
        let release = Release {
            key: &held.key,
            holder: held.holder.id(),
            all: false,
            handoff: handoff
                .as_ref()
                .map(|slot| slot.want.grant(&held.key, None)),
            kind: held.kind,
        };
        let sent_at = BootInstant::now();
        let started = tokio::time::Instant::now();
        let reply = self.backend.release(release).await;
        if let Ok(ReleaseReply::Released { .. } | ReleaseReply::HandedOff { .. }) = reply {
            let held_for = BootInstant::now().duration_since(held.acquired_at);
            crate::metrics::released(held.kind, held_for);
        }
        // When listeners elsewhere heard the release, they learn of it about when we do and
        // need one more round trip to reach the backend: hold local waiters back for two.
        let own = u64::from(self.table.listener(&held.key).is_some());
        let others_heard = matches!(reply, Ok(ReleaseReply::Released { notified }) if notified.is_none_or(|n| n > own));
        let yield_for = (yield_turn && others_heard).then(|| {
            (started.elapsed() * 2).clamp(Duration::from_micros(200), Duration::from_millis(20))
        });
        let outcome = match (reply, handoff) {
            (Ok(ReleaseReply::HandedOff { token }), Some(slot)) => {
                let next = Held::new(
                    held.key.clone(),
                    slot.want.holder.clone(),
                    slot.want.kind,
                    (slot.want.lease, token),
                    sent_at,
                    self.config.max_hold,
                );
                self.table.handed_off(next.clone());
                self.watch(next.next_event());
                tracing::debug!(key = %held.key, "lock handed to a local waiter");
                if let Err(orphan) = slot.deliver(next) {
                    // The waiter gave up while the lock was on its way: release it in turn.
                    let releasing = self.begin_release(orphan)?;
                    return Box::pin(self.finish_release(releasing)).await;
                }
                Ok(())
            }
            (reply, slot) => {
                if let Some(slot) = slot {
                    if let Err(error) = &reply
                        && error.outcome_unknown()
                    {
                        // The hand-off may have happened: undo it before the waiter retries.
                        self.resolve_attempt(slot.want.grant(&held.key, None)).await;
                    }
                    self.table.restore(&held.key, slot);
                }
                // Unless holds remain, the head waiter looks again, whatever happened.
                if !matches!(reply, Ok(ReleaseReply::Decremented { .. })) {
                    self.table.released(&held.key, others_heard, yield_for);
                }
                match reply {
                    Ok(
                        ReleaseReply::Released { .. }
                        | ReleaseReply::Decremented { .. }
                        | ReleaseReply::HandedOff { .. },
                    ) => Ok(()),
                    Ok(ReleaseReply::NotHeld) => Err(LockError::NotHeld),
                    Err(error) => Err(LockError::Backend(error.with_key(held.key.as_str()))),
                }
            }
        };
        tracing::debug!(key = %held.key, ok = outcome.is_ok(), "lock released");
        outcome
    }

    /// A release that cannot run (no runtime): put its waiter back; the lease frees the lock.
    pub(crate) fn abort_release(&self, releasing: Releasing) {
        if let Some(slot) = releasing.handoff {
            self.table.restore(&releasing.held.key, slot);
        }
        self.table.released(&releasing.held.key, false, None);
    }
}

async fn notified<L: Listen>(listener: Option<&L>) {
    match listener {
        Some(listener) => listener.notified().await,
        None => std::future::pending().await,
    }
}

async fn sleep_opt(duration: Option<Duration>) {
    match duration {
        Some(duration) => tokio::time::sleep(duration).await,
        None => std::future::pending().await,
    }
}
