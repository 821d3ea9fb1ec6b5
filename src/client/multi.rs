//! Several locks taken as one: [`MultiLockRequest`] and the error naming the lock not granted.

use std::{fmt, time::Duration};

use tracing::Instrument;

use super::LockClient;
use crate::{
    backend::{Backend, LockKind},
    error::LockError,
    guard::LockGuard,
    holder::Holder,
    lease::Lease,
    lock_key::{KeyError, LockKey},
    multi_guard::{Member, MultiGuard},
};

/// One acquisition of a set of locks, to configure. Made by [`LockClient::lock_all`] and
/// [`LockClient::lock_all_in_namespace`].
///
/// The locks are taken one at a time in one canonical order, the byte order of their backend
/// names ([`LockKey`]), whatever order the keys were given in: two sets that share locks take
/// them in the same order, so they cannot wait for each other in a cycle. A key named twice is
/// one lock. All or nothing: if one lock is not granted within what is left of the set's one
/// wait, the locks already taken are released before [`acquire`](Self::acquire) returns.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
///
/// let locks = tower_lock::LockClient::in_memory();
/// // Opposite transfers name their accounts in opposite orders; both take `account:1` first.
/// let a_to_b = locks.lock_all(["account:2", "account:1"]).wait(Duration::from_secs(2));
/// let guard = a_to_b.fencing().acquire().await?;
/// assert_eq!(guard.guards().len(), 2);
/// assert!(guard.fencing_token("account:1").is_some());
///
/// // While the set is held, neither account can be taken by anyone else.
/// assert!(locks.lock("account:1").try_acquire().await.is_err());
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[must_use = "a lock request does nothing until acquired"]
pub struct MultiLockRequest<'a, B: Backend> {
    client: &'a LockClient<B>,
    /// Each key as given, with its lock name before any kind's suffix.
    keys: Result<Vec<(Vec<u8>, LockKey)>, KeyError>,
    kind: LockKind,
    wait: Duration,
    lease: Lease,
    fencing: bool,
    holder: Option<Holder>,
    /// Each key's semaphore permits, for a set of semaphores (0 for the other kinds).
    permits: u32,
}

impl<B: Backend> fmt::Debug for MultiLockRequest<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys =
            self.keys.as_ref().map(|keys| keys.iter().map(|(_, key)| key).collect::<Vec<_>>());
        f.debug_struct("MultiLockRequest")
            .field("keys", &keys)
            .field("kind", &self.kind)
            .field("wait", &self.wait)
            .field("lease", &self.lease)
            .field("fencing", &self.fencing)
            .field("holder", &self.holder)
            .finish()
    }
}

impl<'a, B: Backend> MultiLockRequest<'a, B> {
    /// A request for the locks named `keys` (user keys as given, with their base lock names).
    pub(crate) fn new(
        client: &'a LockClient<B>,
        keys: Result<Vec<(Vec<u8>, LockKey)>, KeyError>,
        kind: LockKind,
    ) -> Self {
        let config = &client.inner.engine.config;
        Self {
            client,
            keys,
            kind,
            wait: config.wait,
            lease: config.lease,
            fencing: false,
            holder: None,
            permits: 0,
        }
    }

    /// The permits of each key's semaphore, for a set of semaphores a layer asked for.
    pub(crate) fn with_permits(mut self, permits: u32) -> Self {
        self.permits = permits;
        self
    }

    /// How long to wait for the whole set. Zero means try each lock once; `Duration::MAX` waits
    /// without limit. Defaults to the client's `wait`.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// The lease to hold every lock of the set with. Defaults to the client's `lease`.
    pub fn lease(mut self, lease: Lease) -> Self {
        self.lease = lease;
        self
    }

    /// Issue a fencing token with each lock ([`MultiGuard::fencing_token`]); each lock's
    /// tokens rise as [`LockRequest::fencing`](crate::LockRequest::fencing) says. Off by
    /// default.
    pub fn fencing(mut self) -> Self {
        self.fencing = true;
        self
    }

    /// Take the fair locks of the keys ([`LockClient::fair_lock`]): each lock is granted to its
    /// waiters in the order they asked. Sets cannot deadlock with fair locks either, since each
    /// lock is still taken in the canonical order.
    pub fn fair(mut self) -> Self {
        self.kind = LockKind::Fair;
        self
    }

    /// Take the read side of each key's read-write lock ([`LockClient::read_write_lock`]),
    /// shared with other readers.
    pub fn read(mut self) -> Self {
        self.kind = LockKind::Read;
        self
    }

    /// Take the write side of each key's read-write lock ([`LockClient::read_write_lock`]).
    pub fn write(mut self) -> Self {
        self.kind = LockKind::Write;
        self
    }

    /// Acquire as `holder` instead of the current [`Holder::scope`] (or a fresh holder). One
    /// holder holds the whole set.
    pub fn holder(mut self, holder: &Holder) -> Self {
        self.holder = Some(holder.clone());
        self
    }

    /// Applies what a layer or an attribute set; what it left unset stays the client's.
    pub(crate) fn configured(
        mut self,
        wait: Option<Duration>,
        lease: Option<Lease>,
        fencing: bool,
    ) -> Self {
        self.wait = wait.unwrap_or(self.wait);
        self.lease = lease.unwrap_or(self.lease);
        self.fencing |= fencing;
        self
    }

    /// Acquires every lock of the set, in the canonical order, waiting up to the request's
    /// `wait` for all of them together.
    ///
    /// # Errors
    /// A [`MultiLockError`] that names the lock not granted and says why, as
    /// [`LockRequest::acquire`](crate::LockRequest::acquire) would for that lock
    /// ([`LockError::WaitTimeout`] when another holder kept it past what was left of the wait).
    /// The locks of the set taken before it are released first. [`LockError::Lost`], naming
    /// the lock, when a lock taken early was lost while a later one was waited for (a fixed
    /// lease counts from each lock's own grant, and may run out during a long wait). An empty
    /// set, or an invalid key, fails with [`LockError::InvalidKey`] before any backend call.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    ///
    /// use tower_lock::{LockClient, LockError};
    ///
    /// let locks = LockClient::in_memory();
    /// let b = locks.lock("b").acquire().await?;
    ///
    /// // `b` is taken: the set fails after its wait, and leaves `a` free.
    /// let set = locks.lock_all(["a", "b"]).wait(Duration::from_millis(10)).acquire().await;
    /// let error = set.expect_err("b is held");
    /// assert_eq!(error.key().map(|key| key.user_key()), Some(b"b".to_vec()));
    /// assert!(matches!(error.error(), LockError::WaitTimeout { .. }));
    /// locks.lock("a").try_acquire().await?.release().await?;
    /// b.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire(self) -> Result<MultiGuard<B>, MultiLockError> {
        let kind = self.kind;
        let mut keys = match self.keys {
            Ok(keys) if keys.is_empty() => return Err(MultiLockError::before(KeyError::Empty)),
            Ok(keys) => keys,
            Err(error) => return Err(MultiLockError::before(error)),
        };
        let suffix = match kind {
            LockKind::Read | LockKind::Write => Some(":rw"),
            LockKind::Semaphore => Some(":sem"),
            _ => None,
        };
        if let Some(suffix) = suffix {
            for (_, name) in &mut keys {
                *name = name.with_suffix(suffix);
            }
        }
        // The canonical order: the backend names' bytes, which every client of one store
        // computes alike. Duplicates would wait for themselves if re-entry were not allowed
        // for the kind; one lock per name is also what the caller means.
        keys.sort_by(|(_, a), (_, b)| a.as_str().cmp(b.as_str()));
        keys.dedup_by(|(_, a), (_, b)| a == b);

        let shared = &self.client.inner.engine;
        // One holder for the set, the client's own; a scope's holder of another client that
        // holds one of the locks there would make the set wait for itself.
        let holder = match self.holder {
            Some(holder) if !holder.is_from(&shared.id) => {
                return Err(MultiLockError { key: None, error: LockError::ForeignHolder });
            }
            Some(holder) => holder,
            None => match Holder::current() {
                Some(holder) if holder.is_from(&shared.id) => holder,
                Some(foreign) => {
                    if let Some((_, name)) = keys.iter().find(|(_, name)| foreign.holds(name)) {
                        return Err(MultiLockError {
                            key: Some(name.clone()),
                            error: LockError::HeldThroughOtherClient,
                        });
                    }
                    shared.new_holder()
                }
                None => shared.new_holder(),
            },
        };
        let span = tracing::debug_span!(
            "lock_acquire_all",
            keys = keys.len(),
            kind = ?kind,
            holder = %holder,
            blocked_by = tracing::field::Empty,
        );
        let (wait, lease, fencing, permits) = (self.wait, self.lease, self.fencing, self.permits);
        let client = self.client;
        async move {
            let started = tokio::time::Instant::now();
            let deadline = crate::clock::after(started, wait);
            let mut members: Vec<Member<B>> = Vec::with_capacity(keys.len());
            for (user_key, name) in keys {
                // One deadline for the set: each lock waits for what is left of it.
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let request = client
                    .request_for(name.clone(), kind)
                    .with_permits(permits)
                    .wait(left)
                    .lease(lease)
                    .holder(&holder);
                let request = if fencing { request.fencing() } else { request };
                match request.acquire().await {
                    Ok(guard) => members.push(Member { user_key, guard }),
                    Err(error) => {
                        tracing::Span::current()
                            .record("blocked_by", tracing::field::display(&name));
                        tracing::debug!(
                            blocked_by = %name,
                            taken = members.len(),
                            waited_ms = started.elapsed().as_millis() as u64,
                            error = %format_args!("{error:#}"),
                            "lock set not acquired; giving back what it took"
                        );
                        release_all(members).await;
                        // The set waited for every lock it took before this one, too.
                        let error = match error {
                            LockError::WaitTimeout { retry_after, .. } => {
                                // Its holder has held the lock at least as long as the set
                                // waited for it.
                                let waited = started.elapsed();
                                LockError::WaitTimeout {
                                    retry_after: retry_after.map(|after| after.max(waited)),
                                    waited,
                                }
                            }
                            other => other,
                        };
                        return Err(MultiLockError { key: Some(name), error });
                    }
                }
            }
            // A lock taken early may have been lost while a later one was waited for (a fixed
            // lease shorter than that wait runs out): the set is all or nothing.
            if let Some(lost) = members.iter().find(|member| member.guard.is_lost()) {
                let name = lost.guard.key().clone();
                tracing::debug!(
                    lost = %name,
                    waited_ms = started.elapsed().as_millis() as u64,
                    "a lock of the set was lost while the rest were waited for; giving back the set"
                );
                release_all(members).await;
                return Err(MultiLockError { key: Some(name), error: LockError::Lost });
            }
            tracing::debug!(
                keys = members.len(),
                waited_ms = started.elapsed().as_millis() as u64,
                "lock set acquired"
            );
            Ok(MultiGuard::new(members))
        }
        .instrument(span)
        .await
    }

    /// Tries each lock once, without waiting. Same as `.wait(Duration::ZERO).acquire()`.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    pub async fn try_acquire(self) -> Result<MultiGuard<B>, MultiLockError> {
        self.wait(Duration::ZERO).acquire().await
    }
}

/// Gives back the locks of a set that could not be completed, all at once. Awaited, so that
/// when the acquire returns they are free; if it is cancelled here, the releases not yet done
/// finish on the runtime, as dropped guards' do.
async fn release_all<B: Backend>(members: Vec<Member<B>>) {
    let releases = members.into_iter().map(|member| async move {
        let key = member.guard.key().clone();
        if let Err(error) = LockGuard::release(member.guard).await {
            tracing::debug!(%key, error = %format_args!("{error:#}"), "release of a partial lock set failed");
        }
    });
    futures_util::future::join_all(releases).await;
}

/// Why a set of locks was not acquired: the lock that was not granted, and its error.
///
/// Converts into [`LockError`] (with `?` too), which keeps the error and drops the key.
#[derive(Debug)]
pub struct MultiLockError {
    key: Option<LockKey>,
    error: LockError,
}

impl MultiLockError {
    fn before(error: KeyError) -> Self {
        Self { key: None, error: LockError::InvalidKey(error) }
    }

    /// The lock that was not granted; `None` when the set failed before any lock was asked for
    /// (an invalid key, an empty set).
    pub fn key(&self) -> Option<&LockKey> {
        self.key.as_ref()
    }

    /// Why that lock was not granted.
    pub fn error(&self) -> &LockError {
        &self.error
    }

    /// The error, without the key.
    pub fn into_error(self) -> LockError {
        self.error
    }
}

impl fmt::Display for MultiLockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.key {
            Some(key) => write!(f, "lock set not acquired at {key}: {}", self.error),
            None => write!(f, "lock set not acquired: {}", self.error),
        }
    }
}

impl std::error::Error for MultiLockError {
    // The error's own message is part of ours: its source comes next in a chain.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.error)
    }
}

impl From<MultiLockError> for LockError {
    fn from(error: MultiLockError) -> Self {
        error.error
    }
}
