//! Configuring and connecting a [`RedisBackend`]: where the server is, the connections, the
//! time budgets, the quarantine and the acknowledgements a grant waits for.

use std::{fmt, sync::Arc, time::Duration};

use redis::Client;
#[cfg(feature = "sentinel")]
use redis::RedisError;

#[cfg(feature = "cluster")]
use super::cluster;
use super::{
    RedisBackend,
    acknowledge::{Acknowledgement, MinReplicas, WaitAof},
    errors::connect_error,
    pool::{Connections, Manager, Pool},
    quarantine::Quarantine,
    target::Target,
    transport::Transport,
};
use crate::error::{BackendError, BackendErrorKind};

/// Builds a [`RedisBackend`]. Made by [`RedisBackend::builder`].
#[must_use]
pub struct RedisBackendBuilder {
    source: Source,
    /// `None`: chosen by the acknowledgement settings (see `pool_size`).
    pool_size: Option<u32>,
    command_timeout: Duration,
    acknowledgement: Acknowledgement,
    quarantine: Option<Duration>,
    /// The application's pool, when the lock commands go through it.
    shared: Option<bb8::Pool<bb8_redis::RedisConnectionManager>>,
    #[cfg(feature = "tls")]
    tls: Option<redis::TlsCertificates>,
}

/// Where a builder finds the server.
pub(super) enum Source {
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
    pub(super) fn new(source: Source) -> Self {
        Self {
            source,
            pool_size: None,
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

    /// How many connections (sockets) the backend opens, used in turn. Each is multiplexed:
    /// any number of commands are in flight on one. Defaults to 1, which lets Redis read many
    /// commands per system call (measured: a third less Redis CPU per lock than 4
    /// connections, see `benches/README.md`); to 4 with [`min_replicas`](Self::min_replicas)
    /// or [`wait_aof`](Self::wait_aof), whose `WAIT` holds back the later replies of its
    /// connection until it returns. A cluster backend keeps one multiplexed connection per node
    /// instead.
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = Some(size);
        self
    }

    /// How long one command (including getting a connection) may take before it fails with a
    /// [`BackendErrorKind::Timeout`] error. Keep it well below the lease. Defaults to 1 second.
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// How long a server run that may have forgotten grants grants no new lock (its
    /// quarantine). Defaults to the default lease (30 s); never shorter than the longest lease
    /// this process asks for. `Duration::ZERO` turns it off.
    ///
    /// A Redis restarted without persistence (or from an older snapshot, or a replica promoted
    /// before it had the last grants) has forgotten grants whose holders are still inside their
    /// critical sections until their leases run out. So a new server run grants nothing until
    /// the quarantine has passed since its start (for a promoted replica: since a script first
    /// saw it): an acquire fails with [`BackendErrorKind::Quarantined`], saying when it ends
    /// (a layer answers `423 Locked` with `Retry-After`; a waiter waits). Renewals and releases
    /// go on. The acquire scripts tell from the server itself (`INFO server`'s `run_id` against
    /// a run marker key `<prefix>{}:run` under the lock prefix; the ACL user needs `+info`), so
    /// every process waits from the same origin, and no clocks are compared.
    ///
    /// Each process waits its own quarantine: set it to at least the longest lease any process
    /// of this store uses, on every process (a process that uses a longer lease than its
    /// quarantine warns once). Turn it off only for a server that loses no acknowledged write
    /// across a restart (`appendonly yes` with `appendfsync always`), or for tests that start
    /// their own server. A Redis Cluster is not quarantined (its nodes fail over to replicas
    /// that usually had the grants).
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
                Quarantine::new(Some(Duration::ZERO)),
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
        let quarantine = Quarantine::new(self.quarantine);
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
        let waits = self.acknowledgement.is_wanted();
        let pool_size = self.pool_size.unwrap_or(if waits { 4 } else { 1 });
        let manager = Manager {
            target: target.clone(),
            connect_timeout: self.command_timeout,
        };
        Ok(RedisBackend::new(
            Transport::Node {
                pool: Pool::Own(Connections::new(manager, pool_size)),
                target,
            },
            self.command_timeout,
            self.acknowledgement,
            quarantine,
        ))
    }
}
