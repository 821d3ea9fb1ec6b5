//! The Redis backend: one Redis node through a few multiplexed connections, plus one pub/sub
//! connection.
//!
//! A lock held once, taken while it was free, is a string at `prefix{key}` naming its holder
//! and attempt, set by one `SET NX PX`: the common case costs what a hand-written lock costs.
//! Everything else (a re-entry, a contended lock, a fencing token, the fair and read-write
//! kinds) is a Redis hash whose field `<holder id>` counts the holder's holds, and every change
//! goes through a Lua script (`lua/*.lua`) so ownership is checked in the same atomic step
//! that changes it; the scripts turn a single hold into the hash when it is re-entered or an
//! acquire is refused. Scripts are sent by SHA (`EVALSHA`); after a Redis restart or `SCRIPT
//! FLUSH` the next call loads them again without the caller noticing, including inside the
//! watchdog's pipelined renewals. A release is published on `prefix{key}:released` when an
//! acquire was refused since the lock was taken (someone may wait), and waiters listen through
//! the backend's single pub/sub connection.
//!
//! With the `cluster` feature, `RedisBackend::cluster` runs the same scripts on a Redis
//! Cluster: each lock lives in its key's hash slot, releases go out with `SPUBLISH` and waiters
//! listen with `SSUBSCRIBE` on the slot's shard.
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
    collections::HashSet,
    fmt,
    sync::{Arc, OnceLock},
    time::Duration,
};

use redis::{FromRedisValue, RedisError, Value, aio::ConnectionLike};
use tokio_util::sync::{CancellationToken, DropGuard};

// The versions this crate builds against: an application's pool handed to
// `RedisBackendBuilder::pool` must be of exactly these types, and a `redis` error or TLS
// certificate type of another version would not match either. Re-exported so an application
// can name them without pinning the same versions in its own manifest.
pub use bb8;
pub use bb8_redis;
pub use redis;

use self::{
    acknowledge::{Acknowledgement, Probed, wait_aof_probe},
    builder::Source,
    client_lease::{ClientLease, Session},
    errors::{is_noscript, protocol_error, protocol_error_redis, redis_error, wrong_type},
    pool::Pool,
    pubsub::PubSub,
    quarantine::Quarantine,
    scripts::{Call, Scripts},
    server_clock::Unanswered,
    transport::{Conn, Transport},
};
use super::{
    AcquireReply, Backend, Grant, Listener, LockKind, Reentry, Release, ReleaseReply, Renew,
    RenewReply,
};
use crate::{
    clock::BootInstant,
    error::{BackendError, BackendErrorKind},
    inspect::LockInfo,
    lock_key::LockKey,
};

pub use self::builder::RedisBackendBuilder;

mod acknowledge;
mod builder;
mod calls;
mod client_lease;
#[cfg(feature = "cluster")]
mod cluster;
mod connection;
mod errors;
mod health;
mod inspect;
mod pool;
mod pubsub;
mod quarantine;
mod scripts;
mod server_clock;
#[cfg(feature = "cluster")]
mod sharded_pubsub;
mod target;
#[cfg(test)]
mod tests;
mod transport;

/// Suffix of the fencing counter key.
const FENCE: &str = ":fence";
/// Suffix of the set of attempts given up on.
const VOID: &str = ":void";
/// The reply of an acquire held back by the restart quarantine: nothing was sent.
const QUARANTINED: i64 = -100;
/// The acquire scripts' reply to a request that arrived too late to act (see `lua/acquire.lua`,
/// ARGV[9]).
const ARRIVED_LATE: i64 = -4;
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
/// Suffix of a client lease key's hash of holds an operator cleared, one field each
/// (`lua/force_unlock.lua` writes it).
const REVOKED: &str = ":revoked";

/// Locks in one Redis node, or in a Redis Cluster. See the [module docs](self). Cheap to clone.
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    transport: Transport,
    pubsub: OnceLock<PubSub>,
    command_timeout: Duration,
    acknowledgement: Acknowledgement,
    quarantine: Arc<Quarantine>,
    /// With [`RedisBackendBuilder::client_lease`]: the lease every watchdog hold of an
    /// exclusive lock lives on.
    client_lease: Option<ClientLease>,
    /// Single holds whose `SET` went unanswered: their undo names when they would end.
    unanswered: Unanswered,
    stop: CancellationToken,
    _stop_on_drop: DropGuard,
    health: health::Health,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The connection info may carry a password: show only the address.
        let mut f = f.debug_struct("RedisBackend");
        match &self.inner.transport {
            Transport::Node { target, .. } => f.field("target", target),
            #[cfg(feature = "cluster")]
            Transport::Cluster(cluster) => f.field("cluster", &cluster.addrs()),
        };
        f.field("command_timeout", &self.inner.command_timeout)
            .field("quarantine", &self.inner.quarantine.length())
            .field("min_replicas", &self.inner.acknowledgement.replicas)
            .field("wait_aof", &self.inner.acknowledgement.aof)
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// Connects to the Redis server at `url` (`redis://[user:password@]host:port[/db]`) with
    /// default settings.
    ///
    /// # Errors
    /// As [`RedisBackendBuilder::connect`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use tower_lock::{LockClient, RedisBackend};
    ///
    /// # #[tokio::main]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend = RedisBackend::connect("redis://127.0.0.1:6379").await?;
    /// let locks = LockClient::builder(backend).build()?;
    /// # let _ = locks;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect(url: &str) -> Result<Self, BackendError> {
        Self::builder(url).connect().await
    }

    /// Starts configuring a backend for the server at `url`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// use tower_lock::RedisBackend;
    ///
    /// # #[tokio::main]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend = RedisBackend::builder("redis://locks:secret@10.0.0.5:6379/0")
    ///     .pool_size(8)
    ///     .command_timeout(Duration::from_millis(500))
    ///     .connect()
    ///     .await?;
    /// # let _ = backend;
    /// # Ok(())
    /// # }
    /// ```
    pub fn builder(url: impl Into<String>) -> RedisBackendBuilder {
        RedisBackendBuilder::new(Source::Url(url.into()))
    }

    /// Starts configuring a backend for the master that the Sentinels at `sentinels`
    /// (`redis://host:port` each) monitor under `master_name` (feature `sentinel`).
    ///
    /// Every new connection asks the Sentinels for the current master, and the backend drops a
    /// connection that failed or found its server demoted to a replica, so after a failover
    /// commands and release notifications move to the new master; waiters then check their
    /// lock again. Locks granted by the old master and not yet replicated can be lost in the
    /// failover: see [`min_replicas`](RedisBackendBuilder::min_replicas) and fencing tokens.
    ///
    /// A failover counts as a restart for the [quarantine](RedisBackendBuilder::quarantine)
    /// only when this backend saw it: one created after the failover (or in a process started
    /// after it) takes the promoted replica for a server that has been up all along, and grants
    /// at once. Create the backend once, at start-up, and keep it.
    ///
    /// ```no_run
    /// use tower_lock::{LockClient, RedisBackend};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend = RedisBackend::sentinel(
    ///     ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
    ///     "locks",
    /// )
    /// .connect()
    /// .await?;
    /// let locks = LockClient::builder(backend).build()?;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "sentinel")]
    pub fn sentinel(
        sentinels: impl IntoIterator<Item = impl Into<String>>,
        master_name: impl Into<String>,
    ) -> RedisBackendBuilder {
        RedisBackendBuilder::new(Source::Sentinel {
            sentinels: sentinels.into_iter().map(Into::into).collect(),
            name: master_name.into(),
        })
    }

    /// Starts configuring a backend for the Redis Cluster that `nodes` belong to (any of its
    /// nodes; the rest are discovered). Each lock lives in the hash slot of its key, its scripts
    /// go to that slot's master, following `MOVED` and `ASK` through migrations and failovers,
    /// and its release notifications use sharded pub/sub (`SPUBLISH`/`SSUBSCRIBE`) on the same
    /// shard. Needs the `cluster` feature. `pool_size` does not apply (one multiplexed
    /// connection per node), nor do `min_replicas` and `wait_aof` (`WAIT` and `WAITAOF` must
    /// follow the write on its own connection).
    ///
    /// ```no_run
    /// use tower_lock::{LockClient, RedisBackend};
    ///
    /// # #[tokio::main]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend = RedisBackend::cluster(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"])
    ///     .connect()
    ///     .await?;
    /// let locks = LockClient::builder(backend).build()?;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "cluster")]
    pub fn cluster<I>(nodes: I) -> RedisBackendBuilder
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        RedisBackendBuilder::new(Source::Cluster(nodes.into_iter().map(Into::into).collect()))
    }

    fn new(
        transport: Transport,
        command_timeout: Duration,
        acknowledgement: Acknowledgement,
        quarantine: Arc<Quarantine>,
        client_lease: bool,
    ) -> Self {
        let stop = CancellationToken::new();
        let server = transport.node_target().map_or_else(
            || "the Redis Cluster".to_owned(),
            |target| target.describe(),
        );
        Self {
            inner: Arc::new(Inner {
                health: health::Health::new(server),
                transport,
                pubsub: OnceLock::new(),
                command_timeout,
                acknowledgement,
                quarantine,
                client_lease: client_lease.then(ClientLease::new),
                unanswered: Unanswered::default(),
                _stop_on_drop: stop.clone().drop_guard(),
                stop,
            }),
        }
    }

    /// Whether the backend keeps its holds on a client lease
    /// ([`RedisBackendBuilder::client_lease`]).
    pub(crate) fn has_client_lease(&self) -> bool {
        self.inner.client_lease.is_some()
    }

    /// How many lock channels the pub/sub connection is subscribed to (for dashboards and
    /// leak checks).
    pub fn subscribed_channels(&self) -> usize {
        self.inner.pubsub.get().map_or(0, PubSub::channel_count)
    }

    /// How many times the pub/sub connection was re-established (in a cluster: how many times
    /// one of its node connections dropped).
    pub fn pubsub_reconnects(&self) -> u64 {
        self.inner.pubsub.get().map_or(0, PubSub::reconnects)
    }

    /// Asks the server whether it has `WAITAOF` (Redis 7.2 and newer): `false` on an older
    /// server, which is not an error unless [`wait_aof`](RedisBackendBuilder::wait_aof) is
    /// set (then [`connect`](RedisBackendBuilder::connect) has already failed).
    ///
    /// The question is a `WAITAOF` that waits for nothing. An older server answers that it
    /// does not know the command whatever the user's ACL grants; on 7.2 and newer an ACL user
    /// without `+waitaof` is refused (still counted as supported) and the denial is recorded
    /// in `ACL LOG`.
    ///
    /// # Errors
    /// The backend's errors when the server cannot be asked.
    pub async fn supports_wait_aof(&self) -> Result<bool, BackendError> {
        Ok(!matches!(
            self.probe_wait_aof(false).await?,
            Probed::Unknown
        ))
    }

    /// One `PING`, within the command timeout.
    pub(crate) async fn ping(&self) -> Result<(), BackendError> {
        self.query(&mut redis::cmd("PING"), None).await
    }

    /// Sends a `WAITAOF` that waits for nothing but the local fsync when `local` is set, and
    /// tells what the answer says.
    async fn probe_wait_aof(&self, local: bool) -> Result<Probed, BackendError> {
        let probe = wait_aof_probe(local);
        self.with_conn(None, async |conn| {
            Probed::of(probe.query_async::<Value>(conn).await)
        })
        .await
    }

    /// With [`wait_aof`](RedisBackendBuilder::wait_aof) set, checks the server runs `WAITAOF`
    /// as configured, so that a missing feature fails `connect`, not an acquire.
    async fn check_wait_aof(&self) -> Result<(), BackendError> {
        let Some(wanted) = self.inner.acknowledgement.aof else {
            return Ok(());
        };
        match self.probe_wait_aof(wanted.local).await? {
            Probed::Supported => Ok(()),
            Probed::Unknown => Err(BackendError::from_kind(BackendErrorKind::Unsupported {
                feature: "WAITAOF (wait_aof), which needs Redis 7.2 or newer",
            })),
            Probed::Refused(error) => Err(redis_error(error)),
        }
    }

    /// Runs an acquire attempt (a script as [`invoke`](Self::invoke) does, or a single hold's
    /// `SET NX`, which answers nothing when refused). With
    /// [`min_replicas`](RedisBackendBuilder::min_replicas) or
    /// [`wait_aof`](RedisBackendBuilder::wait_aof), a grant is then followed, on the same
    /// connection, by `WAIT` and `WAITAOF`; what they found short comes back too. On a
    /// connection to a server in [quarantine](RedisBackendBuilder::quarantine), nothing is
    /// sent: the reply is "held" until the quarantine ends.
    async fn invoke_acquire(
        &self,
        attempt: &Attempt<'_>,
        key: &LockKey,
    ) -> Result<(Vec<i64>, Option<BackendErrorKind>), BackendError> {
        let acknowledgement = self.inner.acknowledgement;
        let quarantine = &self.inner.quarantine;
        // The waits may take their whole timeouts on top of the script's command.
        let budget = self.inner.command_timeout + acknowledgement.timeout();
        let result = self
            .with_conn_within(Some(key), budget, async |conn| {
                if let Some(left) = conn
                    .booted()
                    .and_then(|booted| quarantine.remaining(booted))
                {
                    quarantine.held_back(key.as_str(), left);
                    let retry_ms = i64::try_from(left.as_millis()).unwrap_or(i64::MAX).max(1);
                    return Ok((vec![QUARANTINED, retry_ms], None));
                }
                let reply: Vec<i64> = match attempt {
                    Attempt::Script { grant, boot, lease } => {
                        let not_after = conn.clock().and_then(|clock| clock.expiry(&grant.lease));
                        let call = calls::acquire(self.scripts(), grant, boot, *lease, not_after);
                        let reply: Vec<i64> = run_call(&call, conn).await?;
                        if reply.first() == Some(&ARRIVED_LATE) {
                            // It did nothing: the call took longer than its lease, or the
                            // server's clock moved on by more than this connection's reading
                            // allows. A new connection reads it again.
                            conn.mark_broken();
                        }
                        reply
                    }
                    Attempt::Single(single) => {
                        // Without the server's clock, the script takes the lock.
                        let Some(clock) = conn.clock() else {
                            return Ok((Vec::new(), None));
                        };
                        let grant = single.grant;
                        let Some(pxat) = clock.expiry(&grant.lease) else {
                            return Ok((Vec::new(), None));
                        };
                        let sending = self.inner.unanswered.sending(
                            grant.attempt,
                            pxat,
                            grant.lease.duration(),
                        );
                        let reply = single.send(conn, pxat).await?;
                        sending.answered();
                        reply
                    }
                };
                let shortfall = if reply.first() == Some(&1) {
                    acknowledgement.shortfall(conn).await?
                } else {
                    None
                };
                Ok((reply, shortfall))
            })
            .await;
        self.name_wrong_type_in(result, key).await
    }

    /// The first try at a free exclusive lock, as one `SET NX PXAT` (see [`SingleSet`]): a
    /// single hold, which the scripts turn into a hash when it is re-entered or contended.
    /// `None` when the lock was not free (the acquire script then looks at what holds it), or
    /// when the acquire needs the script anyway: connections that do not know their server's
    /// clock, a fencing token, a boot check, a re-entry, an earlier
    /// attempt to take over, or a lock an earlier attempt found held (a waiter's retry would
    /// otherwise pay two round trips whenever someone got in first). On the client lease
    /// `session`, the hold names its key, and the same round trip extends that key; a lease
    /// that may have run out while idle goes to the script, which finds out without writing.
    async fn acquire_single(
        &self,
        grant: &Grant<'_>,
        boot: &str,
        session: Option<&Session>,
    ) -> Result<Option<(Vec<i64>, Option<BackendErrorKind>)>, BackendError> {
        let plain = grant.kind == LockKind::Exclusive
            && self.inner.transport.knows_server_clock()
            && !grant.fencing
            && boot.is_empty()
            && grant.supersedes.is_none()
            && grant.reentry != Reentry::Only
            && !grant.contended
            && !session.is_some_and(|session| session.idle);
        if !plain {
            return Ok(None);
        }
        let attempt = Attempt::Single(SingleSet { grant, session });
        let (reply, shortfall) = self.invoke_acquire(&attempt, grant.key).await?;
        Ok((!reply.is_empty()).then_some((reply, shortfall)))
    }

    /// An acquire, on the client lease `session` when one is given: `None` when that lease had
    /// run out (nothing was granted).
    async fn acquire_on(
        &self,
        grant: Grant<'_>,
        boot: &str,
        session: Option<&Session>,
    ) -> Result<Option<AcquireReply>, BackendError> {
        let key = grant.key;
        // On the client lease, the lock's own key lives long: the lease key decides.
        let grant = match session {
            Some(session) => Grant {
                lease: session.key_lease(),
                ..grant
            },
            None => grant,
        };
        let (reply, shortfall) = match self.acquire_single(&grant, boot, session).await? {
            Some(single) => single,
            None => {
                let lease = session.map(|session| (&*session.key, session.millis));
                let attempt = Attempt::Script {
                    grant: &grant,
                    boot,
                    lease,
                };
                let answer = self.invoke_acquire(&attempt, key).await?;
                if answer.0 != [ARRIVED_LATE] {
                    answer
                } else {
                    // It did nothing, and its connection was dropped: once more, on a new
                    // connection with a fresh reading of the server's clock.
                    self.invoke_acquire(&attempt, key).await?
                }
            }
        };
        if reply == [-3] {
            return Ok(None);
        }
        // A fourth element: the grant joined a hold with a lease of its own.
        let on_lease = session.filter(|_| reply.len() == 3);
        let reply = self.acquire_reply(grant, reply, shortfall).await?;
        Ok(Some(match (on_lease, reply) {
            (Some(on), AcquireReply::Acquired { count, token, .. }) => AcquireReply::Acquired {
                count,
                token,
                session: on.number,
            },
            (_, reply) => reply,
        }))
    }

    /// Creates the client lease key `name` for `millis` (a new session's).
    async fn start_lease(
        &self,
        key: &LockKey,
        name: &str,
        millis: u64,
    ) -> Result<(), BackendError> {
        self.with_conn(Some(key), async |conn| {
            redis::cmd("SET")
                .arg(name)
                .arg(1)
                .arg("NX")
                .arg("PX")
                .arg(millis)
                .query_async::<()>(conn)
                .await
        })
        .await
    }

    /// What an acquire's reply means; a grant that was not acknowledged as configured is undone.
    async fn acquire_reply(
        &self,
        grant: Grant<'_>,
        reply: Vec<i64>,
        shortfall: Option<BackendErrorKind>,
    ) -> Result<AcquireReply, BackendError> {
        let key = grant.key;
        if let Some(shortfall) = shortfall {
            return Err(self.unacknowledged(grant, shortfall).await);
        }
        match reply.as_slice() {
            [1, count, raw_token] | [1, count, raw_token, 0] => Ok(AcquireReply::Acquired {
                count: u64::try_from(*count).unwrap_or(1),
                token: token(*raw_token),
                session: 0,
            }),
            [0, retry] => Ok(AcquireReply::Held {
                ttl: u64::try_from(*retry).ok().map(Duration::from_millis),
            }),
            [-1] => Ok(AcquireReply::WouldDeadlock),
            // Twice too late to act: nothing was done, but the server is slower than the lease.
            [ARRIVED_LATE] => {
                Err(errors::arrived_late(grant.lease.duration()).with_key(key.as_str()))
            }
            // The server started less than a quarantine ago: the script's boot check, or the
            // connection's own (see `invoke_acquire`).
            [-2 | QUARANTINED, left] => {
                let left = Duration::from_millis(u64::try_from(*left).unwrap_or(1).max(1));
                if reply[0] == -2 {
                    self.inner.quarantine.held_back(key.as_str(), left);
                }
                Err(errors::quarantined(left).with_key(key.as_str()))
            }
            _ => Err(protocol_error("acquire reply").with_key(key.as_str())),
        }
    }

    /// The boot check the acquire scripts run for `key` (see `boot_unverified` in
    /// `lua/prelude.lua`): for an application's pool with the quarantine on (the backend's own
    /// connections know their server's boot), else `''`.
    fn boot_check(&self, key: &LockKey) -> String {
        let shared = matches!(
            self.inner.transport,
            Transport::Node {
                pool: Pool::Shared(_),
                ..
            }
        );
        if shared && self.inner.quarantine.is_on() {
            quarantine::boot_check(key.as_str(), self.inner.quarantine.length())
        } else {
            String::new()
        }
    }

    /// The pub/sub connection's handle, started on first use.
    fn pubsub(&self) -> &PubSub {
        let inner = &self.inner;
        inner.pubsub.get_or_init(|| match &inner.transport {
            Transport::Node { target, .. } => {
                PubSub::start(target.clone(), inner.command_timeout, inner.stop.clone())
            }
            #[cfg(feature = "cluster")]
            Transport::Cluster(cluster) => {
                sharded_pubsub::start(cluster, inner.command_timeout, inner.stop.clone())
            }
        })
    }

    /// [`listen`](Backend::listen) in two halves, for a Redlock listener that need not wait
    /// for every node: the listener at once, and the wait for the subscription, which tells
    /// whether the server confirmed it.
    pub(crate) fn subscribe(
        &self,
        key: &LockKey,
        only_for: Option<&str>,
    ) -> (Listener, impl Future<Output = bool> + Send + 'static) {
        self.pubsub().subscribe(key.derived(CHANNEL), only_for)
    }

    /// Undoes a grant that was not acknowledged as configured, and builds the error the
    /// acquire fails with, of kind `shortfall`.
    async fn unacknowledged(&self, grant: Grant<'_>, shortfall: BackendErrorKind) -> BackendError {
        let key = grant.key.as_str();
        tracing::warn!(
            key,
            ?shortfall,
            "a grant was not acknowledged as configured; undoing it"
        );
        match self.abandon(grant).await {
            Ok(_) => BackendError::from_kind(shortfall).with_key(key),
            // The grant may still stand: report an unknown outcome, so the engine keeps trying
            // to undo it.
            Err(error) => BackendError::new(BackendErrorKind::Interrupted, error).with_key(key),
        }
    }

    /// The scripts of this backend's transport.
    fn scripts(&self) -> &'static Scripts {
        self.inner.transport.scripts()
    }

    /// Runs the renewal script of every entry, replies in order. A single node gets one
    /// pipeline, resent by body when it lost a script; in a cluster the entries live on
    /// different nodes, so each is its own call on the multiplexed cluster connection, all
    /// sent at once.
    ///
    /// With `lease` (a single node only), the pipeline first extends that client lease key
    /// (by name, for milliseconds) and reads the holds on it an operator cleared; the replies
    /// come back too.
    async fn renew_replies(
        &self,
        renewals: &[Renew<'_>],
        lease: Option<(&str, u64)>,
    ) -> Result<RenewReplies, BackendError> {
        #[cfg(feature = "cluster")]
        if let Some(cluster) = self.inner.transport.cluster() {
            let calls: Vec<Call> = renewals
                .iter()
                .map(|renew| calls::renew(self.scripts(), renew))
                .collect();
            let replies = futures_util::future::join_all(
                calls
                    .iter()
                    .map(async |call| run_call(call, &mut cluster.connection()).await),
            );
            return tokio::time::timeout(self.inner.command_timeout, replies)
                .await
                .map(|replies| (replies, None))
                .map_err(|_| BackendError::from_kind(BackendErrorKind::Timeout));
        }
        let (mut replies, noscript) = self.renew_pipeline(renewals, lease, true).await?;
        // A pipeline is not retried by redis-rs: when the server lost a script, resend the
        // batch by body. Renewal is idempotent, so entries that succeeded are safe to resend.
        if noscript {
            replies = self.renew_pipeline(renewals, lease, false).await?.0;
        }
        Ok(replies)
    }

    /// Renews every entry in one pipeline, by hash or by body: the holds of plain and fair
    /// locks in calls of up to [`RENEW_CHUNK`] locks each, every other entry in a call of its
    /// own. Also says whether the server had lost a script.
    async fn renew_pipeline(
        &self,
        renewals: &[Renew<'_>],
        lease: Option<(&str, u64)>,
        by_hash: bool,
    ) -> Result<(RenewReplies, bool), BackendError> {
        let (many, single): (Vec<usize>, Vec<usize>) =
            (0..renewals.len()).partition(|&i| calls::renews_with_many(&renewals[i]));
        let chunks: Vec<&[usize]> = many.chunks(RENEW_CHUNK).collect();
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        if let Some((name, millis)) = lease {
            pipe.cmd("PEXPIRE").arg(name).arg(millis);
            pipe.cmd("HKEYS").arg(format!("{name}{REVOKED}"));
        }
        for chunk in &chunks {
            let call = calls::renew_many(self.scripts(), chunk.iter().map(|&i| &renewals[i]));
            pipe.add_command(call.into_cmd(by_hash));
        }
        for &i in &single {
            pipe.add_command(calls::renew(self.scripts(), &renewals[i]).into_cmd(by_hash));
        }
        let values: Vec<Value> = self
            .with_conn(None, async |conn| pipe.query_async(conn).await)
            .await?;
        let mut replies: Vec<Option<Result<i64, RedisError>>> =
            (0..renewals.len()).map(|_| None).collect();
        let mut noscript = false;
        let mut values = values.into_iter();
        let lease_reply = lease.map(|_| {
            let mut next = || values.next().ok_or_else(protocol_error_redis);
            let alive = next().and_then(reply_of::<i64>);
            let revoked = next().and_then(reply_of::<HashSet<String>>);
            LeaseTick { alive, revoked }
        });
        for chunk in &chunks {
            let value = values.next().unwrap_or(Value::Nil);
            match reply_of::<Vec<i64>>(value) {
                Ok(each) if each.len() == chunk.len() => {
                    for (&i, reply) in chunk.iter().zip(each) {
                        // Foreign data at a key: as renew.lua's own error would say.
                        replies[i] = Some(match reply {
                            -1 => Err(wrong_type()),
                            reply => Ok(reply),
                        });
                    }
                }
                Ok(_) => return Err(protocol_error("renewal batch reply")),
                Err(error) => {
                    noscript |= is_noscript(&error);
                    for &i in *chunk {
                        replies[i] = Some(Err(RedisError::from((
                            redis::ErrorKind::Io,
                            "renewal batch failed",
                            error.to_string(),
                        ))));
                    }
                }
            }
        }
        for &i in &single {
            let reply = values
                .next()
                .map_or(Err(protocol_error_redis()), reply_of::<i64>);
            noscript |= reply.as_ref().is_err_and(is_noscript);
            replies[i] = Some(reply);
        }
        let replies = replies
            .into_iter()
            .map(|reply| reply.unwrap_or_else(|| Err(protocol_error_redis())))
            .collect();
        Ok(((replies, lease_reply), noscript))
    }

    /// Renews a batch some of whose holds live on the client lease `lease`: one `PEXPIRE` of
    /// the lease key answers for them, but for the few whose lock's own key is due for a
    /// refresh (renewed one by one, owner-checked, for the key's long life), in the pipeline
    /// of every renewal of a lease of its own. A hold an operator may have cleared is renewed
    /// owner-checked too, in a second round trip.
    async fn renew_on_lease(
        &self,
        lease: &ClientLease,
        renewals: &[Renew<'_>],
    ) -> Result<Vec<RenewReply>, BackendError> {
        let sent_at = BootInstant::now();
        let plan = lease.plan(renewals, sent_at);
        let mut answers: Vec<Option<RenewReply>> = vec![None; renewals.len()];
        for &i in &plan.ended {
            answers[i] = Some(RenewReply::NotHeld);
        }
        // Sent one by one: every renewal of a lease of its own, then the refreshes.
        let mut sent: Vec<usize> = (0..renewals.len())
            .filter(|&i| renewals[i].session == 0 || renewals[i].queued)
            .collect();
        let own = sent.len();
        let mut batch: Vec<Renew<'_>> = sent.iter().map(|&i| renewals[i]).collect();
        if let Some(session) = &plan.session {
            sent.extend(&plan.refresh);
            batch.extend(plan.refresh.iter().map(|&i| session.refresh(&renewals[i])));
        }
        let command = plan
            .session
            .as_ref()
            .map(|session| (&*session.key, session.millis));
        let (replies, lease_reply) = if batch.is_empty() && command.is_none() {
            (Vec::new(), None)
        } else {
            self.renew_replies(&batch, command).await?
        };
        let (alive, revoked) = match lease_reply {
            None => (false, Some(HashSet::new())),
            Some(tick) => {
                let revoked = tick
                    .revoked
                    .inspect_err(|error| {
                        tracing::warn!(%error, "cannot read the holds cleared on the client lease; checking each by its owner");
                    })
                    .ok();
                (tick.alive.map_err(redis_error)? == 1, revoked)
            }
        };
        if let Some(session) = &plan.session {
            if alive {
                lease.extended(session.number, sent_at);
            } else {
                lease.ended(session.number, sent_at);
            }
        }
        // A refresh answers as its owner-checked renewal did, and is recorded when it renewed.
        let session = plan.session.as_ref();
        let refreshed = |answer: RenewReply, renew: &Renew<'_>, at: BootInstant| {
            if alive && answer == RenewReply::Renewed {
                lease.refreshed(session.map_or(0, |s| s.number), renew.key, at);
                RenewReply::Renewed
            } else {
                RenewReply::NotHeld
            }
        };
        for (n, ((&i, renew), reply)) in sent.iter().zip(&batch).zip(replies).enumerate() {
            let answer = renew_answer(reply, renew)?;
            answers[i] = Some(if n < own {
                answer
            } else {
                refreshed(answer, renew, sent_at)
            });
        }
        // A hold an operator may have cleared (`force_unlock.lua` names it `<holder>\n<lock>`;
        // every hold, when that list could not be read) is checked by its owner-checked
        // renewal, in a second round trip: the same holder may hold the lock anew.
        let suspect = |renew: &Renew<'_>| match &revoked {
            Some(cleared) => {
                !cleared.is_empty()
                    && cleared.contains(&format!("{}\n{}", renew.holder, renew.key.as_str()))
            }
            None => true,
        };
        let mut check: Vec<(usize, Renew<'_>)> = Vec::new();
        for &i in &plan.on_lease {
            match session.filter(|_| alive && suspect(&renewals[i])) {
                Some(session) => check.push((i, session.refresh(&renewals[i]))),
                None if alive => answers[i] = Some(RenewReply::Renewed),
                None => answers[i] = Some(RenewReply::NotHeld),
            }
        }
        if !check.is_empty() {
            let batch: Vec<Renew<'_>> = check.iter().map(|(_, renew)| *renew).collect();
            let checked_at = BootInstant::now();
            let (replies, _) = self.renew_replies(&batch, None).await?;
            for ((i, renew), reply) in check.iter().zip(replies) {
                answers[*i] = Some(refreshed(renew_answer(reply, renew)?, renew, checked_at));
            }
        }
        answers
            .into_iter()
            .map(|answer| answer.ok_or_else(|| protocol_error("renewal batch reply")))
            .collect()
    }
}

/// How many sessions of the client lease one acquire starts at most, should each run out
/// before the grant reaches it.
const LEASE_STARTS: usize = 3;

/// How many locks one renewal call renews at most, bounding the time one script holds the
/// server.
const RENEW_CHUNK: usize = 500;

/// One reply of a pipeline that ignores errors: the server's error, or the value.
fn reply_of<T: FromRedisValue>(value: Value) -> Result<T, RedisError> {
    Result::<T, RedisError>::from_redis_value(value)
        .map_err(RedisError::from)
        .and_then(|reply| reply)
}

/// One try at acquiring: the acquire script of the lock's kind, or a single hold's `SET NX`.
enum Attempt<'a> {
    /// The script, for `grant` with the boot check `boot`, on the client lease `lease` (name,
    /// milliseconds) when given; built for the connection it goes on, whose clock bounds when
    /// it may still act (see [`calls::acquire`]).
    Script {
        grant: &'a Grant<'a>,
        boot: &'a str,
        lease: Option<(&'a str, u64)>,
    },
    Single(SingleSet<'a>),
}

/// A single hold's `SET NX PXAT` (followed, for a hold on the client lease, by the `PEXPIRE` of
/// the lease key). Its expiry is absolute, on the server's clock: the send time (at most) plus
/// the lease. A copy held back on its connection and delivered after the caller gave up ends
/// when a hold sent on time would have, and the attempt's undo records it as given up until
/// then (see [`server_clock`]): it never outlives that record. With a relative `PX` it would
/// live a lease from its late arrival, after the record had gone, and strand the lock.
struct SingleSet<'a> {
    grant: &'a Grant<'a>,
    session: Option<&'a Session>,
}

impl SingleSet<'_> {
    /// Sends the `SET` with its key expiring at `pxat` (server ms): the reply as the acquire
    /// script would put it, empty when the lock was not free.
    async fn send(&self, conn: &mut Conn, pxat: u64) -> Result<Vec<i64>, RedisError> {
        let grant = self.grant;
        // Sized once: the command is built for every uncontended acquire.
        let lease = self.session.map(|session| &*session.key);
        let size = grant.key.as_str().len()
            + grant.holder.len()
            + grant.attempt.len()
            + lease.map_or(0, str::len)
            + 48;
        let mut set = redis::Cmd::with_capacity(6, size);
        set.arg("SET")
            .arg(grant.key.as_str())
            .arg(calls::SingleHold {
                holder: grant.holder,
                attempt: grant.attempt,
                lease,
            })
            .arg("NX")
            .arg("PXAT")
            .arg(pxat);
        let Some(session) = self.session else {
            let granted: Option<()> = set.query_async(conn).await?;
            // Refused: the script decides what the lock's state means.
            return Ok(granted.map_or_else(Vec::new, |()| vec![1, 1, -1]));
        };
        let mut pipe = redis::pipe();
        pipe.add_command(set);
        pipe.cmd("PEXPIRE").arg(&*session.key).arg(session.millis);
        let (granted, lease): (Option<()>, i64) = pipe.query_async(conn).await?;
        Ok(match (granted, lease) {
            (None, _) => Vec::new(),
            (Some(()), 1) => vec![1, 1, -1],
            // The lease had run out: the hold names it, so nobody holds the lock (the script
            // says so, as acquire.lua's {-3} does).
            (Some(()), _) => vec![-3],
        })
    }
}

/// Runs one script call on `conn`: by hash, and by body when the server lost the script.
async fn run_call<T: FromRedisValue>(
    call: &Call,
    conn: &mut impl ConnectionLike,
) -> Result<T, RedisError> {
    match call.cmd(true).query_async(conn).await {
        Err(error) if is_noscript(&error) => call.cmd(false).query_async(conn).await,
        other => other,
    }
}

/// Reads `{status, n}` replies of the scripts; a bare integer `status` stands for
/// `{status, 0}`.
fn reply_pair(value: Value) -> Result<(i64, Option<i64>), BackendError> {
    if let Value::Int(status) = value {
        return Ok((status, Some(0)));
    }
    let items: Vec<i64> =
        FromRedisValue::from_redis_value(value).map_err(|_| protocol_error("script reply"))?;
    match items.as_slice() {
        [status] => Ok((*status, None)),
        [status, n, ..] => Ok((*status, Some(*n))),
        [] => Err(protocol_error("empty script reply")),
    }
}

/// The replies of a renewal pipeline, in order, and those about the client lease when it was
/// renewed.
type RenewReplies = (Vec<Result<i64, RedisError>>, Option<LeaseTick>);

/// What one renewal of the client lease found.
struct LeaseTick {
    /// The `PEXPIRE` of the lease key: 1 when it still lived.
    alive: Result<i64, RedisError>,
    /// The holds on it an operator cleared since, as `<holder>\n<lock>`.
    revoked: Result<HashSet<String>, RedisError>,
}

/// What one renewal's reply means.
fn renew_answer(
    reply: Result<i64, RedisError>,
    renew: &Renew<'_>,
) -> Result<RenewReply, BackendError> {
    match reply {
        Ok(1) => Ok(RenewReply::Renewed),
        Ok(2) => Ok(RenewReply::Ready),
        Ok(_) => Ok(RenewReply::NotHeld),
        Err(error) => {
            let error = redis_error(error).with_key(renew.key.as_str());
            if error.is_wrong_type() {
                // Foreign data at the key: the lock is not ours any more.
                tracing::warn!(key = %renew.key, error = %format_args!("{error:#}"), "renewal found foreign data");
                Ok(RenewReply::NotHeld)
            } else {
                Err(error)
            }
        }
    }
}

fn token(raw: i64) -> Option<u64> {
    u64::try_from(raw).ok()
}

impl Backend for RedisBackend {
    type Listener = Listener;

    async fn acquire(&self, grant: Grant<'_>) -> Result<AcquireReply, BackendError> {
        let key = grant.key;
        self.inner.quarantine.note_lease(grant.lease.duration());
        let boot = self.boot_check(key);
        let lease = self.inner.client_lease.as_ref();
        let Some(lease) = lease.filter(|lease| lease.serves(&grant)) else {
            return (self.acquire_on(grant, &boot, None).await?)
                .ok_or_else(|| protocol_error("acquire reply").with_key(key.as_str()));
        };
        // A session whose lease ran out is over; the grant goes to a new one.
        for _ in 0..LEASE_STARTS {
            let session = lease
                .session(key, async |name, millis| {
                    self.start_lease(key, name, millis).await
                })
                .await?;
            let sent_at = BootInstant::now();
            match self.acquire_on(grant, &boot, Some(&session)).await? {
                Some(reply) => {
                    if matches!(reply, AcquireReply::Acquired { session: on, .. } if on == session.number)
                    {
                        lease.extended(session.number, sent_at);
                    }
                    return Ok(reply);
                }
                None => lease.ended(session.number, sent_at),
            }
        }
        Err(BackendError::new(
            BackendErrorKind::Unavailable,
            "the client lease ran out as soon as it was started",
        )
        .with_key(key.as_str()))
    }

    async fn release(&self, release: Release<'_>) -> Result<ReleaseReply, BackendError> {
        let key = release.key;
        // With acknowledgements, every grant goes through `acquire` and its waits.
        let handoff = release
            .handoff
            .filter(|_| !self.inner.acknowledgement.is_wanted());
        let invocation = calls::release(self.scripts(), &release, handoff.as_ref());
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
        if let Some(lease) = &self.inner.client_lease
            && renewals.iter().any(|renew| renew.session != 0)
        {
            return self.renew_on_lease(lease, renewals).await;
        }
        let (replies, _) = self.renew_replies(renewals, None).await?;
        replies
            .into_iter()
            .zip(renewals)
            .map(|(reply, renew)| renew_answer(reply, renew))
            .collect()
    }

    async fn abandon(&self, grant: Grant<'_>) -> Result<bool, BackendError> {
        let key = grant.key;
        // On the client lease, the attempt's `SET` (should it arrive late) makes a key that
        // lives the key lease: the attempt is remembered as long.
        let key_lease = self
            .inner
            .client_lease
            .as_ref()
            .and_then(|lease| lease.serves(&grant).then(|| lease.key_lease()));
        let grant = Grant {
            lease: key_lease.unwrap_or(grant.lease),
            ..grant
        };
        // A single hold's `SET` that went unanswered may still arrive: its attempt is
        // remembered until that hold would end.
        let pxat = self.inner.unanswered.pxat(grant.attempt);
        let invocation = calls::abandon(self.scripts(), &grant, pxat);
        // The read-write release answers a pair, the others 1 or 0.
        let value: Value = self.invoke(&invocation, key).await?;
        if let Value::Int(undone) = value {
            return Ok(undone == 1);
        }
        Ok(!matches!(reply_pair(value)?, (0, _)))
    }

    async fn leave(&self, key: &LockKey, holder: &str, kind: LockKind) -> Result<(), BackendError> {
        if let Some(invocation) = calls::leave(self.scripts(), key, holder, kind) {
            self.invoke::<i64>(&invocation, key).await?;
        }
        Ok(())
    }

    async fn listen(
        &self,
        key: &LockKey,
        only_for: Option<&str>,
    ) -> Result<Listener, BackendError> {
        Ok(self.pubsub().listen(key.derived(CHANNEL), only_for).await)
    }

    async fn shutdown(&self) {
        self.inner.stop.cancel();
    }

    async fn inspect(&self, key: &LockKey, kind: LockKind) -> Result<LockInfo, BackendError> {
        self.inspect_lock(key, kind).await
    }

    async fn force_unlock(&self, key: &LockKey, kind: LockKind) -> Result<LockInfo, BackendError> {
        self.force_unlock_lock(key, kind).await
    }
}
