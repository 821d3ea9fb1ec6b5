//! One lock acquisition to configure: [`LockRequest`], and both sides of a read-write lock.

use std::{fmt, sync::Arc, time::Duration};

use futures_util::future::{self, Either};

use tracing::Instrument;

use super::LockClient;
use crate::{
    backend::{Backend, LockKind},
    engine::{Acquired, Request, Want, watchdog},
    error::{BackendError, BackendErrorKind, LockError},
    guard::LockGuard,
    holder::Holder,
    lease::Lease,
    lock_key::{KeyError, LockKey},
};

/// Both sides of one read-write lock. Made by [`LockClient::read_write_lock`].
pub struct ReadWriteLock<'a, B: Backend> {
    pub(super) client: &'a LockClient<B>,
    pub(super) key: Result<LockKey, KeyError>,
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
        f.debug_struct("ReadWriteLock").field("key", &self.key).finish_non_exhaustive()
    }
}

/// One lock acquisition to configure. Made by [`LockClient::lock`],
/// [`LockClient::fair_lock`] and [`ReadWriteLock`].
#[must_use = "a lock request does nothing until acquired"]
pub struct LockRequest<'a, B: Backend> {
    pub(super) client: &'a LockClient<B>,
    pub(super) key: Result<LockKey, KeyError>,
    pub(super) kind: LockKind,
    pub(super) wait: Duration,
    pub(super) lease: Lease,
    pub(super) fencing: bool,
    pub(super) holder: Option<Holder>,
    /// A semaphore's permits (0 for the other kinds).
    pub(super) permits: u32,
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
            .field("permits", &self.permits)
            .finish()
    }
}

impl<B: Backend> LockRequest<'_, B> {
    /// How long to wait for the lock. Zero means try once; `Duration::MAX` waits without limit
    /// (until the lock is granted, the backend fails or the client shuts down). Defaults to the
    /// client's `wait`.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// The lease to hold the lock with. Defaults to the client's `lease`. A lease under 3 ms
    /// or over 365 days fails the acquire with [`LockError::InvalidLease`].
    pub fn lease(mut self, lease: Lease) -> Self {
        self.lease = lease;
        self
    }

    /// Issue a fencing token with the lock ([`LockGuard::fencing_token`]). Off by default.
    ///
    /// A token is the lock store's clock (Redis `TIME`) in milliseconds times 1000, or one
    /// more than the last token of the same lock name when that is higher (grants within one
    /// millisecond). The last token is kept for 5 s after each grant (a `…:fence` key that
    /// expires): nothing of a lock outlives it for longer, whatever names clients send.
    ///
    /// **Guarantee**: the tokens of one lock name rise strictly from one owner to the next,
    /// including across a restart of the lock store without persistence, a Sentinel failover
    /// and a Cluster slot migration. **Assumption**: the clock of the Redis server that grants
    /// never steps back by more than 5 s, and after a failover the new master's clock is not
    /// behind the old one's by more than the failover took (clocks kept by NTP are within
    /// milliseconds; a failover takes seconds). Tokens are below 2^53 until the year 2255, so
    /// they fit a JSON number, an `i64` or a double.
    ///
    /// The store checks it in the same step as the write, for example in Redis:
    ///
    /// ```lua
    /// -- KEYS[1]: the resource; ARGV[1]: the token, ARGV[2]: the new value
    /// local last = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
    /// if tonumber(ARGV[1]) < last then
    ///   return redis.error_reply('STALE fencing token')
    /// end
    /// redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'value', ARGV[2])
    /// return 1
    /// ```
    ///
    /// or in SQL: `UPDATE accounts SET balance = $1, fence = $2 WHERE id = $3 AND fence <= $2`
    /// (zero rows updated: a newer owner has written; answer 409).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_lock::LockError> {
    /// let locks = tower_lock::LockClient::in_memory();
    /// let first = locks.lock("order:42").fencing().acquire().await?;
    /// let token = first.fencing_token().expect("asked for");
    /// first.release().await?;
    /// let next = locks.lock("order:42").fencing().acquire().await?;
    /// assert!(next.fencing_token().expect("asked for") > token);
    /// # next.release().await
    /// # }
    /// ```
    pub fn fencing(mut self) -> Self {
        self.fencing = true;
        self
    }

    /// A semaphore's permits, for a request a layer or an attribute made.
    pub(crate) fn with_permits(mut self, permits: u32) -> Self {
        self.permits = permits;
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

    /// Acquire as `holder` (made by this client, or a clone of it) instead of the current
    /// [`Holder::scope`] or a fresh holder: a lock `holder` holds is re-entered. A holder of
    /// another client is refused with [`LockError::ForeignHolder`]: the client counts its
    /// holders' re-entries, so a holder belongs to the client that made it.
    pub fn holder(self, holder: &Holder) -> Self {
        self.with_holder(holder.clone())
    }

    /// [`holder`](Self::holder), given the holder.
    pub(crate) fn with_holder(mut self, holder: Holder) -> Self {
        self.holder = Some(holder);
        self
    }

    /// Acquires the lock, waiting up to the request's `wait` for it. The future owns what it
    /// needs (the request is checked when it is made), so it may outlive the client handle.
    ///
    /// # Errors
    /// [`LockError::WaitTimeout`] when another holder kept it for the whole wait,
    /// [`LockError::InvalidKey`], [`LockError::InvalidLease`], [`LockError::TooManyWaiters`], [`LockError::Backend`] when the
    /// backend failed (an acquire whose reply was lost is undone before this returns, where the
    /// backend can still be reached), [`LockError::ShutDown`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_lock::LockError> {
    /// use std::time::Duration;
    ///
    /// use tower_lock::{LockClient, LockError};
    ///
    /// let locks = LockClient::in_memory();
    /// let guard = locks.lock("order:42").acquire().await?;
    ///
    /// // Held: a second acquire waits 10 ms, then gives up.
    /// let waited = locks.lock("order:42").wait(Duration::from_millis(10)).acquire().await;
    /// assert!(matches!(waited, Err(LockError::WaitTimeout { .. })));
    ///
    /// // The future borrows nothing: it can be spawned.
    /// let next = tokio::spawn(locks.lock("order:42").acquire());
    /// guard.release().await?;
    /// next.await.expect("not cancelled")?.release().await
    /// # }
    /// ```
    // Not an `async fn`: the request's checks run here, and the future owns what the wait needs
    // (a handle on the client, the checked key and settings) rather than the request, so it is
    // smaller and outlives the borrowed client (a layer boxes it as it is).
    pub fn acquire(
        self,
    ) -> impl Future<Output = Result<LockGuard<B>, LockError>> + Send + 'static + use<B> {
        let Self { client, key, kind, wait, lease, fencing, holder, permits } = self;
        let key = match Self::checked(key, kind, lease, fencing, permits) {
            Ok(key) => key,
            Err(error) => {
                crate::metrics::acquire_finished(kind, Err(&error), Duration::ZERO);
                return Either::Left(future::ready(Err(error)));
            }
        };
        let inner = client.inner.clone();
        let holds = client.holds.clone();
        Either::Right(async move {
            let shared = &inner.engine;
            if shared.stop.is_cancelled() {
                return Err(LockError::ShutDown);
            }
            watchdog::start(shared);
            // The wait is timed for the metrics and the debug events only: a clock read apiece.
            let timed = cfg!(feature = "metrics") || tracing::enabled!(tracing::Level::DEBUG);
            let key_name = key.clone();
            // What the engine's acquire is made of is built in a block that ends before the
            // wait, so that none of it stays in this future beside the engine's.
            let started;
            let result = {
                let holder = match holder_for(shared, holder, &key) {
                    Ok(holder) => holder,
                    Err(error) => {
                        crate::metrics::acquire_finished(kind, Err(&error), Duration::ZERO);
                        return Err(error);
                    }
                };
                let span = tracing::debug_span!(
                    "lock_acquire",
                    key = %key,
                    kind = ?kind,
                    holder = %holder
                );
                let want = Arc::new(Want {
                    attempt: shared.attempt_id(&holder),
                    holder,
                    kind,
                    lease,
                    fencing,
                    permits,
                    within: None,
                });
                started = timed.then(tokio::time::Instant::now);
                shared.acquire(Request { key, want, wait }).instrument(span)
            }
            .await;
            let waited = started.map_or(Duration::ZERO, |started| started.elapsed());
            crate::metrics::acquire_finished(kind, result.as_ref().map(|_| ()), waited);
            match result {
                Ok(Acquired { held, hold, .. }) if shared.stop.is_cancelled() => {
                    // The client shut down while this acquire was on its way, perhaps after its
                    // held locks were released: a guard now would have no watchdog to tell it
                    // of a loss. The hold is given back as a dropped guard's is.
                    tracing::debug!(key = %held.key, "lock acquired as the client shut down; giving it back");
                    shared.release_detached(held, hold);
                    Err(LockError::ShutDown)
                }
                Ok(Acquired { held, hold, at }) => {
                    let count = held.hold_count() as u64;
                    tracing::debug!(
                        key = %held.key,
                        count,
                        waited_ms = waited.as_millis() as u64,
                        token = held.token(),
                        "lock acquired"
                    );
                    Ok(LockGuard::new((inner, holds), (held, hold), count, at))
                }
                Err(error) => {
                    tracing::debug!(
                        key = %key_name,
                        waited_ms = waited.as_millis() as u64,
                        error = %format_args!("{error:#}"),
                        "lock not acquired"
                    );
                    // A busy lock says when it is likely free, from this client's hold times:
                    // the figure every answer (a layer's, `#[locked]`'s, `?`'s) gives.
                    Err(match error {
                        LockError::WaitTimeout { retry_after, waited } => LockError::WaitTimeout {
                            retry_after: Some(holds.retry_after(&key_name, retry_after, waited)),
                            waited,
                        },
                        other => other,
                    })
                }
            }
        })
    }

    /// The request's key, unless the request is invalid.
    fn checked(
        key: Result<LockKey, KeyError>,
        kind: LockKind,
        lease: Lease,
        fencing: bool,
        permits: u32,
    ) -> Result<LockKey, LockError> {
        let key = key?;
        if !lease.is_valid() {
            return Err(LockError::InvalidLease(lease.duration()));
        }
        if kind == LockKind::Semaphore && permits == 0 {
            return Err(LockError::InvalidPermits);
        }
        if kind == LockKind::Semaphore && fencing {
            // Permits are shared: a token would not say who wrote last.
            let feature = "fencing tokens on semaphore permits";
            let error = BackendError::from_kind(BackendErrorKind::Unsupported { feature });
            return Err(LockError::Backend(error.with_key(key.as_str())));
        }
        Ok(key)
    }

    /// Tries once, without waiting. Same as `.wait(Duration::ZERO).acquire()`.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    pub async fn try_acquire(self) -> Result<LockGuard<B>, LockError> {
        self.wait(Duration::ZERO).acquire().await
    }
}

/// The holder an acquire of `key` by a client runs as: the one named (which must be the
/// client's own), or the current scope's when the client made it, or a fresh one. A scope's
/// holder of another client that holds `key` there would make the request wait for itself.
pub(crate) fn holder_for<B: Backend>(
    shared: &Arc<crate::engine::Engine<B>>,
    named: Option<Holder>,
    key: &LockKey,
) -> Result<Holder, LockError> {
    match named {
        Some(holder) if holder.is_from(&shared.id) => Ok(holder),
        Some(_) => Err(LockError::ForeignHolder),
        None => match Holder::current() {
            Some(holder) if holder.is_from(&shared.id) => Ok(holder),
            Some(holder) if holder.holds(key) => Err(LockError::HeldThroughOtherClient),
            _ => Ok(shared.new_holder()),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::LockClient;

    /// An acquire future needs no runtime to be made and borrows nothing: it runs on a runtime
    /// made later, after the client handle it came from is gone.
    #[test]
    fn an_acquire_future_owns_what_it_needs() {
        let locks = LockClient::in_memory();
        let acquire = locks.lock("k").acquire();
        let again = locks.lock("k").wait(Duration::ZERO).acquire();
        drop(locks);
        let runtime =
            tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        let guard = runtime.block_on(acquire).expect("acquired");
        // Another holder (none in scope): refused while the lock is held.
        assert!(runtime.block_on(again).is_err(), "held by another holder");
        runtime.block_on(guard.release()).expect("released");
    }

    /// The holder is looked up when the future first runs, not when it is made: a future made
    /// outside a holder's scope and run inside it re-enters that holder's lock.
    #[tokio::test]
    async fn the_holder_is_the_scope_the_future_runs_in() {
        let locks = LockClient::in_memory();
        let first = locks.lock("k").acquire().await.expect("acquired");
        let again = locks.lock("k").wait(Duration::ZERO).acquire();
        let again = first.holder().clone().scope(again).await.expect("re-entered");
        again.release().await.expect("released");
        first.release().await.expect("released");
    }
}
