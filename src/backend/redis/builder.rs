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
    pool::{Connections, Pool},
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
                .field("sentinels", &redacted(sentinels))
                .field("name", name)
                .finish(),
            #[cfg(feature = "cluster")]
            Self::Cluster(nodes) => f.debug_tuple("Cluster").field(&redacted(nodes)).finish(),
        }
    }
}

#[cfg(any(feature = "sentinel", feature = "cluster"))]
fn redacted(urls: &[String]) -> Vec<std::borrow::Cow<'_, str>> {
    urls.iter().map(|url| redact_password(url)).collect()
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
    /// the backend's own. The builder's URL must name the same server: the pub/sub connection
    /// goes there. [`pool_size`](Self::pool_size) does not apply; [`connect`](Self::connect)
    /// checks that the pool reaches the server. Keep bb8's test on checkout (the default), or
    /// a connection broken by a Redis restart stays in the pool. Not for Sentinel or a
    /// cluster, whose servers change ([`BackendErrorKind::Misconfigured`]).
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

    /// How many connections (sockets) the backend opens, used in turn; each carries any
    /// number of commands at once. Defaults to 1, which lets Redis read many commands per
    /// system call (a third less Redis CPU per lock than 4, see `benches/README.md`); to 4
    /// with [`min_replicas`](Self::min_replicas) or [`wait_aof`](Self::wait_aof), whose waits
    /// hold back the later replies of their connection. Not for a cluster (one connection per
    /// node).
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

    /// How long a new server run grants no new lock (its quarantine). Defaults to the default
    /// lease (30 s), and is never shorter than the longest lease this process asks for;
    /// `Duration::ZERO` turns it off.
    ///
    /// A Redis restarted without persistence (or from an older snapshot, or a replica promoted
    /// before it had the last grants) forgot grants whose holders still work under them until
    /// their leases run out. So the acquire scripts grant nothing until the quarantine has
    /// passed since the run started (a promoted replica: since a script first saw it); the
    /// acquire fails with [`BackendErrorKind::Quarantined`], saying when it ends. Renewals and
    /// releases go on. The scripts tell from the server itself: its `run_id` (`INFO server`,
    /// the ACL user needs `+info`) against a run marker `<prefix>{}:run`, so every process
    /// counts from the same origin and no clocks are compared.
    ///
    /// Set it to at least the longest lease any process of this store uses, on every process
    /// (one that uses a longer lease warns once). Turn it off only for a server that loses no
    /// acknowledged write across a restart (`appendonly yes`, `appendfsync always`), or for
    /// tests. A Redis Cluster is not quarantined (its replicas usually had the grants).
    pub fn quarantine(mut self, quarantine: Duration) -> Self {
        self.quarantine = Some(quarantine);
        self
    }

    /// After each grant, waits (Redis `WAIT`) until at least `replicas` replicas copied it, for
    /// at most `timeout`; when fewer did, the grant is undone and the acquire fails with
    /// [`BackendErrorKind::ReplicasNotAcknowledged`]. This narrows the window in which a
    /// failover to a replica that never received a grant lets a second holder in; it does not
    /// close it, and it is not consensus. Hand-offs to waiters of the same client become
    /// normal acquires, so every grant is acknowledged. An acquire may take the command
    /// timeout plus `timeout`.
    pub fn min_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.acknowledgement.replicas = (replicas > 0).then_some(MinReplicas { replicas, timeout });
        self
    }

    /// After each grant, waits (Redis `WAITAOF`, 7.2 and newer) until it is fsynced to an
    /// append-only file: by this server when `local` is set, and by at least `replicas`
    /// replicas, for at most `timeout`; when not, the grant is undone and the acquire fails
    /// with [`BackendErrorKind::AofNotAcknowledged`]. With `local`, a grant survives a restart
    /// of its server from its append-only file. Runs after `WAIT` when both are set; hand-offs
    /// become normal acquires, as with [`min_replicas`](Self::min_replicas). Not on a cluster.
    ///
    /// [`connect`](Self::connect) fails with [`BackendErrorKind::Unsupported`] on a server
    /// without `WAITAOF`, and with the server's error when it refuses it as configured
    /// (`local` without `appendonly`, an ACL user without `+waitaof`).
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
    /// URL, and presents `certificates.client_tls` when asked for a client certificate.
    #[cfg(feature = "tls")]
    pub fn tls_certificates(mut self, certificates: redis::TlsCertificates) -> Self {
        self.tls = Some(certificates);
        self
    }

    /// Connects, checking the server answers (and, with [`wait_aof`](Self::wait_aof), that it
    /// runs `WAITAOF`).
    ///
    /// # Errors
    /// [`BackendErrorKind::Misconfigured`] for a URL or credentials that cannot work;
    /// [`BackendErrorKind::Unavailable`] when the server (with Sentinel: every sentinel or
    /// the master) cannot be reached; [`BackendErrorKind::Timeout`] when it does not answer
    /// within the command timeout; the `wait_aof` errors. The password never shows.
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
            if self.acknowledgement.is_wanted() {
                let feature = "min_replicas or wait_aof on a Redis Cluster";
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
        let connections = Connections::new(target.clone(), self.command_timeout, pool_size);
        Ok(RedisBackend::new(
            Transport::Node {
                pool: Pool::Own(connections),
                target,
            },
            self.command_timeout,
            self.acknowledgement,
            quarantine,
        ))
    }
}
