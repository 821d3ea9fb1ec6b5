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
    fmt,
    sync::{Arc, OnceLock},
    time::Duration,
};

use redis::{Client, FromRedisValue, RedisError, Value, aio::ConnectionLike};
use tokio_util::sync::{CancellationToken, DropGuard};

// The versions this crate builds against: an application's pool handed to
// `RedisBackendBuilder::pool` must be of exactly these types, and a `redis` error or TLS
// certificate type of another version would not match either. Re-exported so an application
// can name them without pinning the same versions in its own manifest.
pub use bb8;
pub use bb8_redis;
pub use redis;

use self::{
    acknowledge::{Acknowledgement, MinReplicas, Probed, WaitAof, wait_aof_probe},
    pool::{Connections, Manager, Pool},
    pubsub::PubSub,
    quarantine::Quarantine,
    scripts::{Call, Scripts},
    target::Target,
    transport::{Conn, Transport},
};
use super::{
    AcquireReply, Backend, Grant, Listener, LockKind, Reentry, Release, ReleaseReply, Renew,
    RenewReply,
};
use crate::{
    error::{BackendError, BackendErrorKind},
    lease::Lease,
    lock_key::LockKey,
};

mod acknowledge;
#[cfg(feature = "cluster")]
mod cluster;
mod pool;
mod pubsub;
mod quarantine;
mod scripts;
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
    stop: CancellationToken,
    _stop_on_drop: DropGuard,
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

/// Builds a [`RedisBackend`]. Made by [`RedisBackend::builder`].
#[must_use]
pub struct RedisBackendBuilder {
    source: Source,
    pool_size: u32,
    command_timeout: Duration,
    acknowledgement: Acknowledgement,
    quarantine: Option<Duration>,
    /// The application's pool, when the lock commands go through it.
    shared: Option<bb8::Pool<bb8_redis::RedisConnectionManager>>,
    #[cfg(feature = "tls")]
    tls: Option<redis::TlsCertificates>,
}

/// Where a builder finds the server.
enum Source {
    Url(String),
    #[cfg(feature = "sentinel")]
    Sentinel {
        sentinels: Vec<String>,
        name: String,
    },
    #[cfg(feature = "cluster")]
    Cluster(Vec<String>),
}

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Url(url) => f.debug_tuple("Url").field(&redact_password(url)).finish(),
            #[cfg(feature = "sentinel")]
            Self::Sentinel { sentinels, name } => f
                .debug_struct("Sentinel")
                .field(
                    "sentinels",
                    &sentinels
                        .iter()
                        .map(|url| redact_password(url))
                        .collect::<Vec<_>>(),
                )
                .field("name", name)
                .finish(),
            #[cfg(feature = "cluster")]
            Self::Cluster(nodes) => f
                .debug_tuple("Cluster")
                .field(
                    &nodes
                        .iter()
                        .map(|url| redact_password(url))
                        .collect::<Vec<_>>(),
                )
                .finish(),
        }
    }
}

impl fmt::Debug for RedisBackendBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("RedisBackendBuilder");
        debug
            .field("source", &self.source)
            .field("pool_size", &self.pool_size)
            .field("command_timeout", &self.command_timeout)
            .field("quarantine", &self.quarantine)
            .field("min_replicas", &self.acknowledgement.replicas)
            .field("wait_aof", &self.acknowledgement.aof)
            .field("application_pool", &self.shared.is_some());
        // Certificates and the client key are not shown, only whether they are set.
        #[cfg(feature = "tls")]
        debug.field("custom_tls", &self.tls.is_some());
        debug.finish()
    }
}

/// `url` with the password of its user info, if any, replaced by `***`.
fn redact_password(url: &str) -> std::borrow::Cow<'_, str> {
    let authority_start = url.find("://").map_or(0, |i| i + 3);
    let authority_len = url[authority_start..]
        .find(['/', '?', '#'])
        .unwrap_or(url.len() - authority_start);
    let authority = &url[authority_start..authority_start + authority_len];
    let Some(at) = authority.rfind('@') else {
        return url.into();
    };
    match authority[..at].split_once(':') {
        Some((user, _password)) => {
            let rest = &url[authority_start + at..];
            format!("{}{user}:***{rest}", &url[..authority_start]).into()
        }
        None => url.into(),
    }
}

impl RedisBackendBuilder {
    fn new(source: Source) -> Self {
        Self {
            source,
            pool_size: 4,
            command_timeout: Duration::from_secs(1),
            acknowledgement: Acknowledgement::default(),
            quarantine: None,
            shared: None,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }

    /// Runs the lock commands on the application's bb8-redis pool instead of connections of
    /// the backend's own. The builder's URL must name the same server: the backend opens its
    /// pub/sub connection there (a bb8-redis manager does not say where it connects).
    /// [`pool_size`](Self::pool_size) does not apply; every other setting does, and
    /// [`connect`](Self::connect) checks that the pool reaches the server.
    ///
    /// bb8 tests a connection with `PING` on checkout unless the pool was built with
    /// `test_on_check_out(false)`; without that test a connection broken by a Redis restart
    /// stays in the pool. Not for Sentinel or a cluster, whose servers change: `connect` fails
    /// with [`BackendErrorKind::Misconfigured`].
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use tower_lock::{
    ///     LockClient, RedisBackend,
    ///     backend::redis::{bb8, bb8_redis},
    /// };
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let url = "redis://127.0.0.1:6379";
    /// let pool = bb8::Pool::builder()
    ///     .build(bb8_redis::RedisConnectionManager::new(url)?)
    ///     .await?;
    /// let backend = RedisBackend::builder(url)
    ///     .pool(pool)
    ///     .command_timeout(Duration::from_millis(500))
    ///     .connect()
    ///     .await?;
    /// let locks = LockClient::builder(backend).build()?;
    /// # let _ = locks;
    /// # Ok(())
    /// # }
    /// ```
    pub fn pool(mut self, pool: bb8::Pool<bb8_redis::RedisConnectionManager>) -> Self {
        self.shared = Some(pool);
        self
    }

    /// The most pooled connections (sockets). Each is multiplexed and only cloned out for a
    /// command, so any number of commands are in flight on a few connections. Defaults to 4.
    /// A cluster backend keeps one multiplexed connection per node instead.
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

    /// How long a server that has just started grants no new lock (its quarantine). Defaults
    /// to the longest lease this process's clients have asked for.
    ///
    /// A Redis restarted without persistence has forgotten every lock, while their holders are
    /// still inside their critical sections until their leases run out: granting at once would
    /// let a second holder in. So a server that has been up for less than the quarantine
    /// answers every new acquire with "held" (a layer answers `423 Locked` with the time left
    /// as `Retry-After`; a waiter waits); renewals and releases go on. The server's own
    /// `uptime_in_seconds` (`INFO server`, asked once per new connection: the ACL user needs
    /// `+info`) tells when it started, so no clocks are compared. A Sentinel failover to
    /// another server counts as a start, unless [`min_replicas`](Self::min_replicas) is set.
    ///
    /// The cost: up to one lease without new grants after a restart, and after the first start
    /// of a server. Set it to at least the longest lease any client of this store uses when
    /// they differ. `Duration::ZERO` turns it off, for a server that loses no acknowledged
    /// write across a restart (`appendonly yes` with `appendfsync always`), or for tests that
    /// start their own server. An application's pool ([`pool`](Self::pool)) is quarantined
    /// through a boot marker instead (a key the backend sets once the server has been up for a
    /// whole quarantine, which a restart without persistence loses); a Redis
    /// Cluster is not quarantined (its nodes fail over to replicas rather than restart empty
    /// as masters).
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// use tower_lock::RedisBackend;
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// // Some clients of this Redis hold locks for up to 2 minutes.
    /// let backend = RedisBackend::builder("redis://127.0.0.1:6379")
    ///     .quarantine(Duration::from_secs(120))
    ///     .connect()
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn quarantine(mut self, quarantine: Duration) -> Self {
        self.quarantine = Some(quarantine);
        self
    }

    /// After each acquire, waits (Redis `WAIT`) until at least `replicas` replicas have
    /// copied the grant, for at most `timeout`. When fewer did, the grant is undone and the
    /// acquire fails with [`BackendErrorKind::ReplicasNotAcknowledged`].
    ///
    /// This narrows the window in which a failover to a replica that never received the lock
    /// lets a second holder in; it does not close it (replication stays asynchronous, and a
    /// replica that acknowledged can still lose the write before a promotion), and it is not
    /// consensus. Locks handed from one holder to a waiter of the same client go through a
    /// normal acquire in this mode, so every grant is acknowledged. `WAIT` holds up the
    /// connection it runs on for as long as it waits, and an acquire may take the command
    /// timeout plus `timeout`.
    pub fn min_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.acknowledgement.replicas = (replicas > 0).then_some(MinReplicas { replicas, timeout });
        self
    }

    /// After each acquire, waits (Redis `WAITAOF`, Redis 7.2 and newer) until the grant is in
    /// an append-only file on disk: fsynced by this server when `local` is set, and by at least
    /// `replicas` replicas, for at most `timeout`. When fewer did, the grant is undone and the
    /// acquire fails with [`BackendErrorKind::AofNotAcknowledged`].
    ///
    /// With `local`, a grant survives a restart of the server that made it from its
    /// append-only file (`appendonly yes`), which [`min_replicas`](Self::min_replicas) does not
    /// promise; with `replicas`, a replica that acknowledged it keeps it through its own
    /// restart. It is still not consensus. Set with `min_replicas`, `WAIT` runs first, then
    /// `WAITAOF`. Like `WAIT`, `WAITAOF` holds up the connection it runs on while it waits, and
    /// hand-offs to waiters of the same client become normal acquires.
    ///
    /// [`connect`](Self::connect) checks the server has `WAITAOF` and fails with
    /// [`BackendErrorKind::Unsupported`] when it does not (before Redis 7.2), and with the
    /// server's error when it refuses the command as configured (`local` on a server without
    /// `appendonly`, a user without the ACL grant `+waitaof`), so a missing feature shows at
    /// start-up, not as a failed acquire. Not available on a Redis Cluster.
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// use tower_lock::{LockClient, RedisBackend};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// // Each grant is on this server's disk and on one replica's before `acquire` returns.
    /// let backend = RedisBackend::builder("redis://127.0.0.1:6379")
    ///     .wait_aof(true, 1, Duration::from_millis(500))
    ///     .connect()
    ///     .await?;
    /// assert!(backend.supports_wait_aof().await?);
    /// let locks = LockClient::builder(backend).build()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn wait_aof(mut self, local: bool, replicas: u32, timeout: Duration) -> Self {
        self.acknowledgement.aof = (local || replicas > 0).then_some(WaitAof {
            local,
            replicas,
            timeout,
        });
        self
    }

    /// Trusts `certificates.root_cert` (PEM) instead of the system's roots for a `rediss://`
    /// URL, and presents `certificates.client_tls` when the server asks for a client
    /// certificate. A server whose certificate does not chain to the trusted roots fails the
    /// connection; nothing falls back to plain text.
    #[cfg(feature = "tls")]
    pub fn tls_certificates(mut self, certificates: redis::TlsCertificates) -> Self {
        self.tls = Some(certificates);
        self
    }

    /// Connects, checking the server answers (and, with [`wait_aof`](Self::wait_aof), that it
    /// runs `WAITAOF`).
    ///
    /// # Errors
    /// [`BackendErrorKind::Unavailable`] when the URL is invalid, the server (or, with
    /// Sentinel, every sentinel or the master) cannot be reached, or the server refuses the
    /// connection (TLS certificate, password); [`BackendErrorKind::Timeout`] when it does not
    /// answer within the command timeout. The URL's password never appears in the error.
    /// With [`wait_aof`](Self::wait_aof): [`BackendErrorKind::Unsupported`] when the server
    /// has no `WAITAOF`, or the server's error when it refuses it as configured.
    pub async fn connect(self) -> Result<RedisBackend, BackendError> {
        let command_timeout = self.command_timeout;
        #[cfg(feature = "cluster")]
        if let Source::Cluster(nodes) = &self.source {
            if self.shared.is_some() {
                return Err(BackendError::from_kind(BackendErrorKind::Misconfigured {
                    what: "an application's pool goes to one server, not a Redis Cluster: drop \
                           `.pool(..)`"
                        .to_owned(),
                }));
            }
            // `WAIT` and `WAITAOF` must follow the write on its connection, which a cluster
            // connection does not promise.
            let feature = match self.acknowledgement {
                Acknowledgement {
                    replicas: Some(_), ..
                } => Some("min_replicas on a Redis Cluster"),
                Acknowledgement { aof: Some(_), .. } => Some("wait_aof on a Redis Cluster"),
                _ => None,
            };
            if let Some(feature) = feature {
                return Err(BackendError::from_kind(BackendErrorKind::Unsupported {
                    feature,
                }));
            }
            let cluster = cluster::Cluster::connect(nodes, command_timeout).await?;
            return Ok(RedisBackend::new(
                Transport::Cluster(cluster),
                command_timeout,
                Acknowledgement::default(),
                Arc::new(Quarantine::new(Some(Duration::ZERO))),
            ));
        }
        let backend = self.build_lazy()?;
        if let Some(target) = backend.inner.transport.node_target() {
            // One connection made directly first: the pool would retry a failing connect (a
            // refused certificate, a wrong password) until its timeout and report only that.
            let first = async {
                target
                    .client()
                    .await?
                    .get_multiplexed_async_connection()
                    .await
            };
            let server = target.describe();
            match tokio::time::timeout(command_timeout, first).await {
                Ok(Ok(_checked)) => {}
                Ok(Err(error)) => return Err(connect_error(error, &server)),
                Err(_) => {
                    return Err(BackendError::new(
                        BackendErrorKind::Timeout,
                        format!("no answer from Redis at {server} within {command_timeout:?}"),
                    ));
                }
            }
        }
        backend.ping().await?;
        backend.check_wait_aof().await?;
        backend.open_pool().await;
        Ok(backend)
    }

    /// Builds a single-node (or Sentinel) backend without contacting the server: connections
    /// open on first use. For Redlock, whose nodes need not all be up when it starts.
    pub(crate) fn build_lazy(self) -> Result<RedisBackend, BackendError> {
        #[cfg(feature = "sentinel")]
        let unavailable = |e: RedisError| BackendError::new(BackendErrorKind::Unavailable, e);
        let url_error = |url: &str| {
            let shown = redact_password(url).into_owned();
            move |error| connect_error(error, &shown)
        };
        let target = match self.source {
            #[cfg(feature = "tls")]
            Source::Url(url) if self.tls.is_some() => {
                let certificates = self.tls.expect("checked");
                Target::Node(
                    Client::build_with_tls(url.as_str(), certificates).map_err(url_error(&url))?,
                )
            }
            Source::Url(url) => Target::Node(Client::open(url.as_str()).map_err(url_error(&url))?),
            #[cfg(feature = "sentinel")]
            Source::Sentinel { sentinels, name } => Target::Sentinel {
                sentinels: tokio::sync::Mutex::new(
                    redis::sentinel::SentinelClient::build(
                        sentinels,
                        name.clone(),
                        None,
                        redis::sentinel::SentinelServerType::Master,
                    )
                    .map_err(unavailable)?,
                ),
                name,
            },
            #[cfg(feature = "cluster")]
            Source::Cluster(_) => {
                return Err(BackendError::from_kind(BackendErrorKind::Unsupported {
                    feature: "a Redis Cluster as a Redlock node",
                }));
            }
        };
        let target = Arc::new(target);
        let quarantine = Arc::new(Quarantine::new(self.quarantine));
        if let Some(shared) = self.shared {
            if !matches!(*target, Target::Node(_)) {
                return Err(BackendError::from_kind(BackendErrorKind::Misconfigured {
                    what: "an application's pool goes to one server; Sentinel follows failovers \
                           with connections of its own: drop `.pool(..)`"
                        .to_owned(),
                }));
            }
            return Ok(RedisBackend::new(
                Transport::Node {
                    pool: Pool::Shared(shared),
                    target,
                },
                self.command_timeout,
                self.acknowledgement,
                quarantine,
            ));
        }
        let manager = Manager::new(
            target.clone(),
            self.command_timeout,
            quarantine.clone(),
            self.acknowledgement.replicas.is_none(),
        );
        Ok(RedisBackend::new(
            Transport::Node {
                pool: Pool::Own(Connections::new(manager, self.pool_size)),
                target,
            },
            self.command_timeout,
            self.acknowledgement,
            quarantine,
        ))
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
    ) -> Self {
        let stop = CancellationToken::new();
        Self {
            inner: Arc::new(Inner {
                transport,
                pubsub: OnceLock::new(),
                command_timeout,
                acknowledgement,
                quarantine,
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

    /// Opens every connection of the backend's own now (bounded by the command timeout), so
    /// the first commands do not pay for connecting.
    async fn open_pool(&self) {
        if let Transport::Node {
            pool: Pool::Own(connections),
            ..
        } = &self.inner.transport
        {
            let _ = tokio::time::timeout(self.inner.command_timeout, connections.open_all()).await;
        }
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
            .with_conn(Some(key), async |conn| run_call(call, conn).await)
            .await;
        self.name_wrong_type_in(result, key).await
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
                    return Ok((vec![0, retry_ms], None));
                }
                let reply: Vec<i64> = match attempt {
                    Attempt::Script(call) => run_call(call, conn).await?,
                    Attempt::Single(set) => {
                        let granted: Option<()> = set.query_async(conn).await?;
                        // Refused: the script decides what the lock's state means.
                        granted.map_or_else(Vec::new, |()| vec![1, 1, -1])
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

    /// The first try at a free exclusive lock, as one `SET NX`: a single hold, which the
    /// scripts turn into a hash when it is re-entered or contended. `None` when the lock was
    /// not free (the acquire script then looks at what holds it), or when the acquire needs
    /// the script anyway: a fencing token, a boot marker to check, a re-entry, or an earlier
    /// attempt to take over.
    async fn acquire_single(
        &self,
        grant: &Grant<'_>,
        marker: &str,
    ) -> Result<Option<AcquireReply>, BackendError> {
        let plain = grant.kind == LockKind::Exclusive
            && !grant.fencing
            && marker.is_empty()
            && grant.supersedes.is_none()
            && grant.reentry != Reentry::Only;
        if !plain {
            return Ok(None);
        }
        let mut set = redis::cmd("SET");
        set.arg(grant.key.as_str())
            .arg(single_hold(grant.holder, grant.attempt))
            .arg("NX")
            .arg("PX")
            .arg(grant.lease.millis());
        let (reply, shortfall) = self
            .invoke_acquire(&Attempt::Single(set), grant.key)
            .await?;
        if reply.is_empty() {
            return Ok(None);
        }
        self.acquire_reply(*grant, reply, shortfall).await.map(Some)
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
            [1, count, raw_token] => Ok(AcquireReply::Acquired {
                count: u64::try_from(*count).unwrap_or(1),
                token: token(*raw_token),
            }),
            [0, retry] => Ok(AcquireReply::Held {
                ttl: u64::try_from(*retry).ok().map(Duration::from_millis),
            }),
            [-1] => Ok(AcquireReply::WouldDeadlock),
            // The marker went again between the check and the retry: another restart.
            [-2] => Ok(AcquireReply::Held {
                ttl: Some(self.inner.quarantine.length()),
            }),
            _ => Err(protocol_error("acquire reply").with_key(key.as_str())),
        }
    }

    /// The boot marker the acquire scripts require for `key`: for an application's pool with
    /// the quarantine on (the backend's own connections know their server's boot), else `''`.
    fn boot_marker(&self, key: &LockKey) -> String {
        let shared = matches!(
            self.inner.transport,
            Transport::Node {
                pool: Pool::Shared(_),
                ..
            }
        );
        if shared && self.inner.quarantine.is_on() {
            quarantine::boot_marker(key.as_str())
        } else {
            String::new()
        }
    }

    /// After an acquire found no boot marker: asks the server's uptime and, when it has been up
    /// for a whole quarantine, sets the marker on the same connection (so on the same server
    /// run) and answers `None`; otherwise the time the quarantine has left.
    async fn verify_boot(
        &self,
        marker: &str,
        key: &LockKey,
    ) -> Result<Option<Duration>, BackendError> {
        let quarantine = &self.inner.quarantine;
        self.with_conn(Some(key), async |conn| {
            let uptime = quarantine::uptime(conn).await?;
            if let Some(left) = quarantine.remaining_after(uptime) {
                quarantine.held_back(key.as_str(), left);
                return Ok(Some(left));
            }
            redis::cmd("SET")
                .arg(marker)
                .arg(1)
                .query_async::<()>(conn)
                .await?;
            Ok(None)
        })
        .await
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

    /// Replaces a wrong-type error with one naming the type found at `key`.
    async fn name_wrong_type_in<T>(
        &self,
        result: Result<T, BackendError>,
        key: &LockKey,
    ) -> Result<T, BackendError> {
        match result {
            Err(error) if error.is_wrong_type() => Err(self.name_wrong_type(key).await),
            other => other,
        }
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

    /// Checks out a connection and runs `op` on it, all within the command timeout. A
    /// connection that failed at the connection level, ran out of time, or whose server is no
    /// longer a master, is not put back.
    async fn with_conn<T>(
        &self,
        key: Option<&LockKey>,
        op: impl AsyncFnOnce(&mut Conn) -> Result<T, RedisError>,
    ) -> Result<T, BackendError> {
        self.with_conn_within(key, self.inner.command_timeout, op)
            .await
    }

    /// [`with_conn`](Self::with_conn) with a time budget other than the command timeout.
    async fn with_conn_within<T>(
        &self,
        key: Option<&LockKey>,
        budget: Duration,
        op: impl AsyncFnOnce(&mut Conn) -> Result<T, RedisError>,
    ) -> Result<T, BackendError> {
        let deadline = tokio::time::Instant::now() + budget;
        let result = async {
            // No connection in time: nothing was sent, so the outcome is known.
            let mut conn = tokio::time::timeout_at(deadline, self.inner.transport.get())
                .await
                .map_err(|_| BackendError::from_kind(BackendErrorKind::Unavailable))??;
            let Ok(result) = tokio::time::timeout_at(deadline, op(&mut conn)).await else {
                // A connection that stayed silent for the whole budget may be half-open or
                // cut off: a fresh one is cheaper than finding out on the next command.
                conn.mark_broken();
                return Err(BackendError::from_kind(BackendErrorKind::Timeout));
            };
            if let Err(error) = &result
                && (error.is_io_error()
                    || error.is_connection_dropped()
                    || error.is_timeout()
                    || is_read_only(error))
            {
                conn.mark_broken();
            }
            result.map_err(redis_error)
        }
        .await;
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

    /// The scripts of this backend's transport.
    fn scripts(&self) -> &'static Scripts {
        self.inner.transport.scripts()
    }

    /// Runs the renewal script of every entry, replies in order. A single node gets one
    /// pipeline, resent by body when it lost a script; in a cluster the entries live on
    /// different nodes, so each is its own call on the multiplexed cluster connection, all
    /// sent at once.
    async fn renew_replies(
        &self,
        renewals: &[Renew<'_>],
    ) -> Result<Vec<Result<i64, RedisError>>, BackendError> {
        #[cfg(feature = "cluster")]
        if let Some(cluster) = self.inner.transport.cluster() {
            let calls: Vec<Call> = renewals
                .iter()
                .map(|renew| renew_call(self.scripts(), renew))
                .collect();
            let replies = futures_util::future::join_all(
                calls
                    .iter()
                    .map(async |call| run_call(call, &mut cluster.connection()).await),
            );
            return tokio::time::timeout(self.inner.command_timeout, replies)
                .await
                .map_err(|_| BackendError::from_kind(BackendErrorKind::Timeout));
        }
        let (mut replies, noscript) = self.renew_pipeline(renewals, true).await?;
        // A pipeline is not retried by redis-rs: when the server lost a script, resend the
        // batch by body. Renewal is idempotent, so entries that succeeded are safe to resend.
        if noscript {
            replies = self.renew_pipeline(renewals, false).await?.0;
        }
        Ok(replies)
    }

    /// Renews every entry in one pipeline, by hash or by body: the holds of plain and fair
    /// locks in calls of up to [`RENEW_CHUNK`] locks each, every other entry in a call of its
    /// own. Also says whether the server had lost a script.
    async fn renew_pipeline(
        &self,
        renewals: &[Renew<'_>],
        by_hash: bool,
    ) -> Result<(Vec<Result<i64, RedisError>>, bool), BackendError> {
        let plain = |renew: &&Renew<'_>| {
            !renew.queued && matches!(renew.kind, LockKind::Exclusive | LockKind::Fair)
        };
        let (many, single): (Vec<usize>, Vec<usize>) =
            (0..renewals.len()).partition(|&i| plain(&&renewals[i]));
        let chunks: Vec<&[usize]> = many.chunks(RENEW_CHUNK).collect();
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for chunk in &chunks {
            let mut call = self.scripts().renew_many.prepare_invoke();
            for &i in *chunk {
                let renew = &renewals[i];
                call.key(renew.key.as_str())
                    .arg(renew.holder)
                    .arg(renew.lease.millis());
            }
            pipe.add_command(call.cmd(by_hash));
        }
        for &i in &single {
            pipe.add_command(renew_call(self.scripts(), &renewals[i]).cmd(by_hash));
        }
        let values: Vec<Value> = self
            .with_conn(None, async |conn| pipe.query_async(conn).await)
            .await?;
        let mut replies: Vec<Option<Result<i64, RedisError>>> =
            (0..renewals.len()).map(|_| None).collect();
        let mut noscript = false;
        let mut values = values.into_iter();
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
        Ok((replies, noscript))
    }
}

/// How many locks one renewal call renews at most, bounding the time one script holds the
/// server.
const RENEW_CHUNK: usize = 500;

/// One reply of a pipeline that ignores errors: the server's error, or the value.
fn reply_of<T: FromRedisValue>(value: Value) -> Result<T, RedisError> {
    Result::<T, RedisError>::from_redis_value(value)
        .map_err(RedisError::from)
        .and_then(|reply| reply)
}

/// The error of a reply missing from a pipeline.
fn protocol_error_redis() -> RedisError {
    RedisError::from((redis::ErrorKind::Parse, "a pipeline reply is missing"))
}

/// The error a script meets at a key of another type.
fn wrong_type() -> RedisError {
    RedisError::from((
        redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
        "WRONGTYPE",
        "Operation against a key holding the wrong kind of value".to_owned(),
    ))
}

/// One try at acquiring: the acquire script of the lock's kind, or a single hold's `SET NX`.
enum Attempt<'a> {
    Script(&'a Call),
    Single(redis::Cmd),
}

/// The value of a single hold (see `lua/acquire.lua`): the holder, prefixed by its length so
/// that no holder's name can pass for another's, then the attempt.
fn single_hold(holder: &str, attempt: &str) -> String {
    format!("{}:{holder}{attempt}", holder.len())
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

/// The script call that renews one hold, or keeps one waiter's place.
fn renew_call(scripts: &'static Scripts, renew: &Renew<'_>) -> Call {
    let key = renew.key;
    let (script, keys, args) = match (renew.kind, renew.queued) {
        (LockKind::Fair, true) => (
            &scripts.fair_wait,
            vec![
                key.as_str().to_owned(),
                key.derived(QUEUE),
                key.derived(TIMEOUTS),
            ],
            vec![renew.lease.millis().to_string(), key.derived(CHANNEL)],
        ),
        (LockKind::Write, true) => (
            &scripts.rw_wait,
            vec![key.derived(WRITERS)],
            vec![renew.lease.millis().to_string(), key.derived(CHANNEL)],
        ),
        (LockKind::Read | LockKind::Write, _) => (
            &scripts.rw_renew,
            vec![key.as_str().to_owned(), key.derived(READERS)],
            vec![
                side(renew.kind).to_owned(),
                renew.lease.millis().to_string(),
            ],
        ),
        _ => (
            &scripts.renew,
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
    } else if error.is_connection_refusal() || is_read_only(&error) || is_slot_unserved(&error) {
        // The command did not run: a demoted master refuses writes, a cluster slot without a
        // master refuses everything. Look for the new one.
        BackendErrorKind::Unavailable
    } else if error.is_io_error() || error.is_connection_dropped() {
        BackendErrorKind::Interrupted
    } else if error.code() == Some("WRONGTYPE") || error.to_string().contains("WRONGTYPE") {
        BackendErrorKind::WrongType {
            found: String::new(),
        }
    } else if error.code() == Some("NOPERM")
        || error.to_string().contains("NOPERM")
        // An ACL denial inside a script comes back as a plain ERR with this wording.
        || error.to_string().contains("The user executing the script can't")
    {
        BackendErrorKind::NoPermission
    } else {
        BackendErrorKind::Other
    };
    BackendError::new(kind, error)
}

/// The error of a first connection to `server` (its address, or the URL without password):
/// a configuration that cannot work is [`BackendErrorKind::Misconfigured`] and says what to
/// fix; a server that cannot be reached is `Unavailable`, naming it.
fn connect_error(error: RedisError, server: &str) -> BackendError {
    let message = error.to_string();
    let what = if error.kind() == redis::ErrorKind::InvalidClientConfig {
        if server.starts_with("rediss://") && !cfg!(feature = "tls") {
            Some("a `rediss://` URL needs tower-lock's `tls` feature".to_owned())
        } else {
            Some(format!(
                "the Redis URL `{server}`: expected `redis://[user:password@]host:port[/db]`{}",
                if cfg!(feature = "tls") {
                    " or `rediss://…`"
                } else {
                    ""
                }
            ))
        }
    } else if error.kind() == redis::ErrorKind::AuthenticationFailed
        || message.contains("WRONGPASS")
        || message.contains("NOAUTH")
    {
        Some(format!(
            "Redis at {server} refused the user or password: check the URL's credentials and \
             the ACL user"
        ))
    } else if message.contains("DB index") {
        Some(format!(
            "Redis at {server} has no such database: check the database index in the URL"
        ))
    } else {
        None
    };
    match what {
        Some(what) => BackendError::new(BackendErrorKind::Misconfigured { what }, error),
        None => BackendError::new(
            BackendErrorKind::Unavailable,
            ConnectFailed {
                server: server.to_owned(),
                cause: error,
            },
        ),
    }
}

/// A first connection that failed: names the server, with the client library's error as the
/// source.
#[derive(Debug)]
struct ConnectFailed {
    server: String,
    cause: RedisError,
}

impl fmt::Display for ConnectFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "could not connect to Redis at {}", self.server)
    }
}

impl std::error::Error for ConnectFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        // redis-rs's message repeats its I/O cause: name that cause alone.
        self.cause.source().or(Some(&self.cause))
    }
}

fn protocol_error(what: &'static str) -> BackendError {
    BackendError::new(BackendErrorKind::Protocol, what)
}

/// Whether a Redis Cluster could not run the command because its slot is not served right now
/// (moving, or its master failed and no replica took over yet, or no connection to the slot's
/// node) and redis-rs ran out of redirects and retries: the script did not run, and trying
/// again a little later can succeed.
fn is_slot_unserved(error: &RedisError) -> bool {
    use redis::ServerErrorKind::{Ask, ClusterDown, MasterDown, Moved, TryAgain};
    matches!(
        error.kind(),
        redis::ErrorKind::Server(Moved | Ask | TryAgain | ClusterDown | MasterDown)
            | redis::ErrorKind::ClusterConnectionNotFound
    )
}

fn is_noscript(error: &RedisError) -> bool {
    error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// The server is a replica now (a failover demoted it).
fn is_read_only(error: &RedisError) -> bool {
    error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
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
        self.inner.quarantine.note_lease(grant.lease.duration());
        let marker = self.boot_marker(key);
        let queue = grant
            .queue
            .map_or(0, |timeout| Lease::fixed(timeout).millis());
        let invocation = match grant.kind {
            LockKind::Fair => {
                let mut invocation = self.scripts().fair_acquire.prepare_invoke();
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
                    .arg(queue)
                    .arg(grant.supersedes.unwrap_or(""))
                    .arg(grant.reentry.as_arg())
                    .arg(&marker);
                invocation
            }
            LockKind::Read | LockKind::Write => {
                let mut invocation = self.scripts().rw_acquire.prepare_invoke();
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
                    .arg(queue)
                    .arg(grant.supersedes.unwrap_or(""))
                    .arg(grant.reentry.as_arg())
                    .arg(&marker);
                invocation
            }
            _ => {
                if let Some(reply) = self.acquire_single(&grant, &marker).await? {
                    return Ok(reply);
                }
                let mut invocation = self.scripts().acquire.prepare_invoke();
                invocation
                    .key(key.as_str())
                    .key(key.derived(FENCE))
                    .key(key.derived(VOID))
                    .arg(grant.holder)
                    .arg(grant.lease.millis())
                    .arg(grant.attempt)
                    .arg(flag(grant.fencing))
                    .arg(grant.supersedes.unwrap_or(""))
                    .arg(grant.reentry.as_arg())
                    .arg(&marker);
                invocation
            }
        };
        let attempt = Attempt::Script(&invocation);
        let (mut reply, mut shortfall) = self.invoke_acquire(&attempt, key).await?;
        if reply == [-2] {
            if let Some(left) = self.verify_boot(&marker, key).await? {
                return Ok(AcquireReply::Held { ttl: Some(left) });
            }
            (reply, shortfall) = self.invoke_acquire(&attempt, key).await?;
        }
        self.acquire_reply(grant, reply, shortfall).await
    }

    async fn release(&self, release: Release<'_>) -> Result<ReleaseReply, BackendError> {
        let key = release.key;
        let invocation = match release.kind {
            LockKind::Fair => {
                let mut invocation = self.scripts().fair_release.prepare_invoke();
                invocation
                    .key(key.as_str())
                    .key(key.derived(QUEUE))
                    .key(key.derived(TIMEOUTS))
                    .arg(release.holder)
                    .arg(key.derived(CHANNEL))
                    .arg(flag(release.all))
                    .arg(release.attempt.unwrap_or(""));
                invocation
            }
            LockKind::Read | LockKind::Write => {
                let mut invocation = rw_release(
                    self.scripts(),
                    key,
                    release.holder,
                    release.kind,
                    release.all,
                    release.attempt.unwrap_or(""),
                );
                // How long a non-matching attempt is remembered as given up: it has had its
                // reply already, so only briefly.
                invocation.arg(1000);
                invocation
            }
            _ => {
                let mut invocation = self.scripts().release.prepare_invoke();
                invocation
                    .key(key.as_str())
                    .key(key.derived(FENCE))
                    .key(key.derived(VOID))
                    .arg(release.holder)
                    .arg(key.derived(CHANNEL))
                    .arg(flag(release.all));
                // With acknowledgements, every grant goes through `acquire` and its waits.
                let handoff = release
                    .handoff
                    .filter(|_| !self.inner.acknowledgement.is_wanted());
                match handoff {
                    Some(next) => invocation
                        .arg(next.holder)
                        .arg(next.lease.millis())
                        .arg(next.attempt)
                        .arg(flag(next.fencing)),
                    None => invocation.arg("").arg(0).arg("").arg("0"),
                };
                invocation.arg(release.attempt.unwrap_or(""));
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
        let replies = self.renew_replies(renewals).await?;
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
                        tracing::warn!(key = %renew.key, error = %format_args!("{error:#}"), "renewal found foreign data");
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
                let mut invocation = rw_release(
                    self.scripts(),
                    key,
                    grant.holder,
                    grant.kind,
                    false,
                    grant.attempt,
                );
                invocation.arg(grant.lease.millis());
                let value: Value = self.invoke(&invocation, key).await?;
                !matches!(reply_pair(value)?, (0, _))
            }
            _ => {
                let mut invocation = self.scripts().abandon.prepare_invoke();
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
                let mut invocation = self.scripts().fair_wait.prepare_invoke();
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
                let mut invocation = self.scripts().rw_wait.prepare_invoke();
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
        Ok(self.pubsub().listen(key.derived(CHANNEL), only_for).await)
    }

    async fn shutdown(&self) {
        self.inner.stop.cancel();
    }
}

/// The read-write release script, optionally only for one attempt.
fn rw_release(
    scripts: &'static Scripts,
    key: &LockKey,
    holder: &str,
    kind: LockKind,
    all: bool,
    attempt: &str,
) -> Call {
    let mut invocation = scripts.rw_release.prepare_invoke();
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
