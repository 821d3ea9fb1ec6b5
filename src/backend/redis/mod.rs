//! The Redis backend: one Redis node through a bb8 pool, plus one pub/sub connection.
//!
//! A lock is a Redis hash at `prefix{key}` whose field `<holder id>` counts the holder's holds;
//! every change goes through a Lua script (`lua/*.lua`) so ownership is checked in the same
//! atomic step that changes it. Scripts are sent by SHA (`EVALSHA`); after a Redis restart or
//! `SCRIPT FLUSH` the next call loads them again without the caller noticing, including inside
//! the watchdog's pipelined renewals. Releases are published on `prefix{key}:released` and waiters
//! listen through the backend's single pub/sub connection.
//!
//! ```no_run
//! use tower_lock::{LockClient, RedisBackend};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let backend = RedisBackend::connect("redis://127.0.0.1:6379").await?;
//! let locks = LockClient::builder(backend).build()?;
//! let guard = locks.lock("order:42").acquire().await?;
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```

use std::{
    fmt,
    sync::{Arc, OnceLock},
    time::Duration,
};

use redis::{Client, FromRedisValue, RedisError, Value};
use tokio_util::sync::{CancellationToken, DropGuard};

pub use bb8;
pub use bb8_redis;
pub use redis;

use self::{
    pool::{Manager, Pool},
    pubsub::PubSub,
    scripts::{Call, SCRIPTS},
};
use super::{
    AcquireReply, Backend, Grant, Listener, LockKind, Release, ReleaseReply, Renew, RenewReply,
};
use crate::{
    error::{BackendError, BackendErrorKind},
    key::LockKey,
    lease::Lease,
};

mod pool;
mod pubsub;
mod scripts;

/// Suffix of the fencing counter key.
const FENCE: &str = ":fence";
/// Suffix of the set of attempts given up on.
const VOID: &str = ":void";
/// Suffix of the release channel.
const CHANNEL: &str = ":released";
/// Suffix of a fair lock's waiter queue.
const QUEUE: &str = ":queue";
/// Suffix of a fair lock's waiter timeouts.
const TIMEOUTS: &str = ":timeouts";
/// Suffix of a read-write lock's readers.
const READERS: &str = ":readers";
/// Suffix of a read-write lock's waiting writers.
const WRITERS: &str = ":writers";

/// Locks in one Redis node. See the [module docs](self). Cheap to clone.
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    client: Client,
    pubsub: OnceLock<PubSub>,
    command_timeout: Duration,
    stop: CancellationToken,
    _stop_on_drop: DropGuard,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The connection info may carry a password: show only the address.
        f.debug_struct("RedisBackend")
            .field("addr", &self.inner.client.get_connection_info().addr())
            .field("command_timeout", &self.inner.command_timeout)
            .finish_non_exhaustive()
    }
}

/// Builds a [`RedisBackend`]. Made by [`RedisBackend::builder`].
#[derive(Debug)]
#[must_use]
pub struct RedisBackendBuilder {
    url: String,
    pool_size: u32,
    command_timeout: Duration,
}

impl RedisBackendBuilder {
    /// The most pooled connections. Each is multiplexed, so a few serve many tasks.
    /// Defaults to 4.
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = size;
        self
    }

    /// How long one command (including getting a connection) may take before it fails with a
    /// [`BackendErrorKind::Timeout`] error. Keep it well below the lease. Defaults to 1 second.
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// Connects, checking the server answers.
    ///
    /// # Errors
    /// [`BackendErrorKind::Unavailable`] when the URL is invalid or the server cannot be
    /// reached; the URL's password never appears in the error.
    pub async fn connect(self) -> Result<RedisBackend, BackendError> {
        let client = Client::open(self.url.as_str())
            .map_err(|e| BackendError::new(BackendErrorKind::Unavailable, e))?;
        let pool = bb8::Pool::builder()
            .max_size(self.pool_size.max(1))
            .connection_timeout(self.command_timeout)
            .test_on_check_out(false)
            .build_unchecked(Manager::new(client.clone()));
        let backend = RedisBackend::new(Pool::Own(pool), client, self.command_timeout);
        backend.ping().await?;
        Ok(backend)
    }
}

impl RedisBackend {
    /// Connects to the Redis server at `url` (`redis://[user:password@]host:port[/db]`) with
    /// default settings.
    ///
    /// # Errors
    /// As [`RedisBackendBuilder::connect`].
    pub async fn connect(url: &str) -> Result<Self, BackendError> {
        Self::builder(url).connect().await
    }

    /// Starts configuring a backend for the server at `url`.
    pub fn builder(url: impl Into<String>) -> RedisBackendBuilder {
        RedisBackendBuilder {
            url: url.into(),
            pool_size: 4,
            command_timeout: Duration::from_secs(1),
        }
    }

    /// Uses an application's existing pool for commands, and `client` (the same server) for the
    /// pub/sub connection. Commands time out after 1 second.
    ///
    /// bb8 tests a connection with `PING` on checkout unless the pool was built with
    /// `test_on_check_out(false)`; without that test a connection broken by a Redis restart
    /// stays in the pool.
    pub fn from_pool(pool: bb8::Pool<bb8_redis::RedisConnectionManager>, client: Client) -> Self {
        Self::new(Pool::Shared(pool), client, Duration::from_secs(1))
    }

    fn new(pool: Pool, client: Client, command_timeout: Duration) -> Self {
        let stop = CancellationToken::new();
        Self {
            inner: Arc::new(Inner {
                pool,
                client,
                pubsub: OnceLock::new(),
                command_timeout,
                _stop_on_drop: stop.clone().drop_guard(),
                stop,
            }),
        }
    }

    /// How many lock channels the pub/sub connection is subscribed to (for dashboards and
    /// leak checks).
    pub fn subscribed_channels(&self) -> usize {
        self.inner.pubsub.get().map_or(0, PubSub::channel_count)
    }

    /// How many times the pub/sub connection was re-established.
    pub fn pubsub_reconnects(&self) -> u64 {
        self.inner.pubsub.get().map_or(0, PubSub::reconnects)
    }

    async fn ping(&self) -> Result<(), BackendError> {
        self.query(&mut redis::cmd("PING"), None).await
    }

    /// Runs one command with the command timeout.
    async fn query<T: FromRedisValue>(
        &self,
        cmd: &mut redis::Cmd,
        key: Option<&LockKey>,
    ) -> Result<T, BackendError> {
        self.with_conn(key, async |conn| cmd.query_async(conn).await)
            .await
    }

    /// Runs one script call with the command timeout; by body when the server lost the
    /// script.
    async fn invoke<T: FromRedisValue>(
        &self,
        call: &Call,
        key: &LockKey,
    ) -> Result<T, BackendError> {
        let result = self
            .with_conn(Some(key), async |conn| {
                match call.cmd(true).query_async(conn).await {
                    Err(error) if is_noscript(&error) => call.cmd(false).query_async(conn).await,
                    other => other,
                }
            })
            .await;
        match result {
            Err(error) if error.is_wrong_type() => Err(self.name_wrong_type(key).await),
            other => other,
        }
    }

    /// Checks out a connection and runs `op` on it, all within the command timeout. A
    /// connection that failed at the connection level is not put back.
    async fn with_conn<T>(
        &self,
        key: Option<&LockKey>,
        op: impl AsyncFnOnce(&mut redis::aio::MultiplexedConnection) -> Result<T, RedisError>,
    ) -> Result<T, BackendError> {
        let attempt = async {
            let mut conn = self.inner.pool.get().await.map_err(pool_error)?;
            let result = op(&mut conn).await;
            if let Err(error) = &result
                && (error.is_io_error() || error.is_connection_dropped() || error.is_timeout())
            {
                conn.mark_broken();
            }
            result.map_err(redis_error)
        };
        let result = match tokio::time::timeout(self.inner.command_timeout, attempt).await {
            Ok(result) => result,
            Err(_) => Err(BackendError::from_kind(BackendErrorKind::Timeout)),
        };
        result.map_err(|error| match key {
            Some(key) => error.with_key(key.as_str()),
            None => error,
        })
    }

    /// Builds the error for a key of a foreign type, naming the type found there.
    async fn name_wrong_type(&self, key: &LockKey) -> BackendError {
        let found: String = self
            .query(redis::cmd("TYPE").arg(key.as_str()), Some(key))
            .await
            .unwrap_or_else(|_| "unknown".to_owned());
        tracing::warn!(key = %key, found, "lock key holds a value of another type");
        BackendError::from_kind(BackendErrorKind::WrongType { found }).with_key(key.as_str())
    }

    /// Runs the renewal script of every entry in one pipeline, by hash or by body.
    async fn renew_pipeline(
        &self,
        renewals: &[Renew<'_>],
        by_hash: bool,
    ) -> Result<Vec<Result<i64, RedisError>>, BackendError> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for renew in renewals {
            pipe.add_command(renew_call(renew).cmd(by_hash));
        }
        self.with_conn(None, async |conn| pipe.query_async(conn).await)
            .await
    }
}

/// The script call that renews one hold, or keeps one waiter's place.
fn renew_call(renew: &Renew<'_>) -> Call {
    let key = renew.key;
    let (script, keys, args) = match (renew.kind, renew.queued) {
        (LockKind::Fair, true) => (
            &SCRIPTS.fair_wait,
            vec![
                key.as_str().to_owned(),
                key.derived(QUEUE),
                key.derived(TIMEOUTS),
            ],
            vec![renew.lease.millis().to_string(), key.derived(CHANNEL)],
        ),
        (LockKind::Write, true) => (
            &SCRIPTS.rw_wait,
            vec![key.derived(WRITERS)],
            vec![renew.lease.millis().to_string(), key.derived(CHANNEL)],
        ),
        (LockKind::Read | LockKind::Write, _) => (
            &SCRIPTS.rw_renew,
            vec![key.as_str().to_owned(), key.derived(READERS)],
            vec![
                side(renew.kind).to_owned(),
                renew.lease.millis().to_string(),
            ],
        ),
        _ => (
            &SCRIPTS.renew,
            vec![key.as_str().to_owned()],
            vec![renew.lease.millis().to_string()],
        ),
    };
    let mut call = script.prepare_invoke();
    call.key(keys).arg(renew.holder).arg(args);
    call
}

/// The side argument of the read-write scripts.
fn side(kind: LockKind) -> &'static str {
    if kind == LockKind::Write { "w" } else { "r" }
}

/// Maps a redis-rs error to what the engine needs to know.
fn redis_error(error: RedisError) -> BackendError {
    let kind = if error.is_timeout() {
        BackendErrorKind::Timeout
    } else if error.is_connection_refusal() {
        BackendErrorKind::Unavailable
    } else if error.is_io_error() || error.is_connection_dropped() {
        BackendErrorKind::Interrupted
    } else if error.code() == Some("WRONGTYPE") || error.to_string().contains("WRONGTYPE") {
        BackendErrorKind::WrongType {
            found: String::new(),
        }
    } else if error.code() == Some("NOPERM") || error.to_string().contains("NOPERM") {
        BackendErrorKind::NoPermission
    } else {
        BackendErrorKind::Other
    };
    BackendError::new(kind, error)
}

fn pool_error(error: bb8::RunError<RedisError>) -> BackendError {
    match error {
        bb8::RunError::User(error) => redis_error(error),
        bb8::RunError::TimedOut => BackendError::from_kind(BackendErrorKind::Unavailable),
    }
}

fn protocol_error(what: &'static str) -> BackendError {
    BackendError::new(BackendErrorKind::Protocol, what)
}

fn is_noscript(error: &RedisError) -> bool {
    error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// Reads `{status, n}` replies of the scripts.
fn reply_pair(value: Value) -> Result<(i64, Option<i64>), BackendError> {
    let items: Vec<i64> =
        FromRedisValue::from_redis_value(value).map_err(|_| protocol_error("script reply"))?;
    match items.as_slice() {
        [status] => Ok((*status, None)),
        [status, n, ..] => Ok((*status, Some(*n))),
        [] => Err(protocol_error("empty script reply")),
    }
}

fn token(raw: i64) -> Option<u64> {
    u64::try_from(raw).ok()
}

fn flag(on: bool) -> &'static str {
    if on { "1" } else { "0" }
}

impl Backend for RedisBackend {
    type Listener = Listener;

    async fn acquire(&self, grant: Grant<'_>) -> Result<AcquireReply, BackendError> {
        let key = grant.key;
        let queue = grant
            .queue
            .map_or(0, |timeout| Lease::fixed(timeout).millis());
        let invocation = match grant.kind {
            LockKind::Fair => {
                let mut invocation = SCRIPTS.fair_acquire.prepare_invoke();
                invocation
                    .key(key.as_str())
                    .key(key.derived(QUEUE))
                    .key(key.derived(TIMEOUTS))
                    .key(key.derived(FENCE))
                    .key(key.derived(VOID))
                    .arg(grant.holder)
                    .arg(grant.lease.millis())
                    .arg(grant.attempt)
                    .arg(flag(grant.fencing))
                    .arg(queue);
                invocation
            }
            LockKind::Read | LockKind::Write => {
                let mut invocation = SCRIPTS.rw_acquire.prepare_invoke();
                invocation
                    .key(key.as_str())
                    .key(key.derived(READERS))
                    .key(key.derived(WRITERS))
                    .key(key.derived(FENCE))
                    .key(key.derived(VOID))
                    .arg(grant.holder)
                    .arg(side(grant.kind))
                    .arg(grant.lease.millis())
                    .arg(grant.attempt)
                    .arg(flag(grant.fencing))
                    .arg(queue);
                invocation
            }
            _ => {
                let mut invocation = SCRIPTS.acquire.prepare_invoke();
                invocation
                    .key(key.as_str())
                    .key(key.derived(FENCE))
                    .key(key.derived(VOID))
                    .arg(grant.holder)
                    .arg(grant.lease.millis())
                    .arg(grant.attempt)
                    .arg(flag(grant.fencing));
                invocation
            }
        };
        let reply: Vec<i64> = self.invoke(&invocation, key).await?;
        match reply.as_slice() {
            [1, count, raw_token] => Ok(AcquireReply::Acquired {
                count: u64::try_from(*count).unwrap_or(1),
                token: token(*raw_token),
            }),
            [0, retry] => Ok(AcquireReply::Held {
                ttl: u64::try_from(*retry).ok().map(Duration::from_millis),
            }),
            [-1] => Ok(AcquireReply::WouldDeadlock),
            _ => Err(protocol_error("acquire reply").with_key(key.as_str())),
        }
    }

    async fn release(&self, release: Release<'_>) -> Result<ReleaseReply, BackendError> {
        let key = release.key;
        let invocation = match release.kind {
            LockKind::Fair => {
                let mut invocation = SCRIPTS.fair_release.prepare_invoke();
                invocation
                    .key(key.as_str())
                    .key(key.derived(QUEUE))
                    .key(key.derived(TIMEOUTS))
                    .arg(release.holder)
                    .arg(key.derived(CHANNEL))
                    .arg(flag(release.all));
                invocation
            }
            LockKind::Read | LockKind::Write => {
                rw_release(key, release.holder, release.kind, release.all, "")
            }
            _ => {
                let mut invocation = SCRIPTS.release.prepare_invoke();
                invocation
                    .key(key.as_str())
                    .key(key.derived(FENCE))
                    .key(key.derived(VOID))
                    .arg(release.holder)
                    .arg(key.derived(CHANNEL))
                    .arg(flag(release.all));
                match release.handoff {
                    Some(next) => invocation
                        .arg(next.holder)
                        .arg(next.lease.millis())
                        .arg(next.attempt)
                        .arg(flag(next.fencing)),
                    None => invocation.arg("").arg(0).arg("").arg("0"),
                };
                invocation
            }
        };
        let value: Value = self.invoke(&invocation, key).await?;
        match reply_pair(value).map_err(|e| e.with_key(key.as_str()))? {
            (0, _) => Ok(ReleaseReply::NotHeld),
            (1, Some(remaining)) => Ok(ReleaseReply::Decremented {
                remaining: u64::try_from(remaining).unwrap_or(0),
            }),
            (2, notified) => Ok(ReleaseReply::Released {
                notified: notified.and_then(|n| u64::try_from(n).ok()),
            }),
            (3, Some(raw_token)) => Ok(ReleaseReply::HandedOff {
                token: token(raw_token),
            }),
            // Read-write: this holder is done, other holders keep the lock.
            (3, None) => Ok(ReleaseReply::Released { notified: Some(0) }),
            _ => Err(protocol_error("release reply").with_key(key.as_str())),
        }
    }

    async fn renew(&self, renewals: &[Renew<'_>]) -> Result<Vec<RenewReply>, BackendError> {
        if renewals.is_empty() {
            return Ok(Vec::new());
        }
        let mut replies = self.renew_pipeline(renewals, true).await?;
        // A pipeline is not retried by redis-rs: when the server lost a script, resend the
        // batch by body. Renewal is idempotent, so entries that succeeded are safe to resend.
        if replies
            .iter()
            .any(|reply| reply.as_ref().is_err_and(is_noscript))
        {
            replies = self.renew_pipeline(renewals, false).await?;
        }
        replies
            .into_iter()
            .zip(renewals)
            .map(|(reply, renew)| match reply {
                Ok(1) => Ok(RenewReply::Renewed),
                Ok(2) => Ok(RenewReply::Ready),
                Ok(_) => Ok(RenewReply::NotHeld),
                Err(error) => {
                    let error = redis_error(error).with_key(renew.key.as_str());
                    if error.is_wrong_type() {
                        // Foreign data at the key: the lock is not ours any more.
                        tracing::warn!(key = %renew.key, %error, "renewal found foreign data");
                        Ok(RenewReply::NotHeld)
                    } else {
                        Err(error)
                    }
                }
            })
            .collect()
    }

    async fn abandon(&self, grant: Grant<'_>) -> Result<bool, BackendError> {
        let key = grant.key;
        let undone = match grant.kind {
            LockKind::Read | LockKind::Write => {
                let mut invocation =
                    rw_release(key, grant.holder, grant.kind, false, grant.attempt);
                invocation.arg(grant.lease.millis());
                let value: Value = self.invoke(&invocation, key).await?;
                !matches!(reply_pair(value)?, (0, _))
            }
            _ => {
                let mut invocation = SCRIPTS.abandon.prepare_invoke();
                invocation
                    .key(key.as_str())
                    .key(key.derived(VOID))
                    .arg(grant.holder)
                    .arg(grant.attempt)
                    .arg(key.derived(CHANNEL))
                    .arg(grant.lease.millis());
                self.invoke::<i64>(&invocation, key).await? == 1
            }
        };
        Ok(undone)
    }

    async fn leave(&self, key: &LockKey, holder: &str, kind: LockKind) -> Result<(), BackendError> {
        let invocation = match kind {
            LockKind::Fair => {
                let mut invocation = SCRIPTS.fair_wait.prepare_invoke();
                invocation
                    .key(key.as_str())
                    .key(key.derived(QUEUE))
                    .key(key.derived(TIMEOUTS))
                    .arg(holder)
                    .arg(0)
                    .arg(key.derived(CHANNEL));
                invocation
            }
            LockKind::Write => {
                let mut invocation = SCRIPTS.rw_wait.prepare_invoke();
                invocation
                    .key(key.derived(WRITERS))
                    .arg(holder)
                    .arg(0)
                    .arg(key.derived(CHANNEL));
                invocation
            }
            _ => return Ok(()),
        };
        self.invoke::<i64>(&invocation, key).await?;
        Ok(())
    }

    async fn listen(
        &self,
        key: &LockKey,
        only_for: Option<&str>,
    ) -> Result<Listener, BackendError> {
        let inner = &self.inner;
        let pubsub = inner.pubsub.get_or_init(|| {
            PubSub::start(
                inner.client.clone(),
                inner.command_timeout,
                inner.stop.clone(),
            )
        });
        Ok(pubsub.listen(key.derived(CHANNEL), only_for).await)
    }

    async fn shutdown(&self) {
        self.inner.stop.cancel();
    }
}

/// The read-write release script, optionally only for one attempt.
fn rw_release(key: &LockKey, holder: &str, kind: LockKind, all: bool, attempt: &str) -> Call {
    let mut invocation = SCRIPTS.rw_release.prepare_invoke();
    invocation
        .key(key.as_str())
        .key(key.derived(READERS))
        .key(key.derived(VOID))
        .arg(holder)
        .arg(side(kind))
        .arg(key.derived(CHANNEL))
        .arg(flag(all))
        .arg(attempt);
    invocation
}
