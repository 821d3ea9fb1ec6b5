//! Configuring and connecting a [`RedisBackend`].

use std::{fmt, sync::Arc, time::Duration};

use redis::Client;

#[cfg(feature = "cluster")]
use super::cluster;
use super::{
    RedisBackend,
    acknowledge::{Acknowledgement, MinReplicas, WaitAof},
    errors::connect_error,
    pool::{Connections, Pool},
    quarantine::Quarantine,
    transport::{Target, Transport},
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

impl fmt::Debug for RedisBackendBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // URLs without their passwords; certificates not shown, only whether they are set.
        #[cfg(any(feature = "sentinel", feature = "cluster"))]
        let redacted = |urls: &[String]| -> Vec<String> {
            urls.iter().map(|url| redact(url).into_owned()).collect()
        };
        let mut debug = f.debug_struct("RedisBackendBuilder");
        match &self.source {
            Source::Url(url) => debug.field("url", &redact(url)),
            #[cfg(feature = "sentinel")]
            Source::Sentinel { sentinels, name } => {
                debug.field("sentinels", &redacted(sentinels)).field("master", name)
            }
            #[cfg(feature = "cluster")]
            Source::Cluster(nodes) => debug.field("cluster", &redacted(nodes)),
        };
        debug
            .field("pool_size", &self.pool_size)
            .field("command_timeout", &self.command_timeout)
            .field("quarantine", &self.quarantine)
            .field("min_replicas", &self.acknowledgement.replicas)
            .field("wait_aof", &self.acknowledgement.aof)
            .field("application_pool", &self.shared.is_some());
        #[cfg(feature = "tls")]
        debug.field("custom_tls", &self.tls.is_some());
        debug.finish()
    }
}

/// `url` with the password of its user info, if any, replaced by `***`.
fn redact(url: &str) -> std::borrow::Cow<'_, str> {
    let start = url.find("://").map_or(0, |i| i + 3);
    let end = url[start..].find(['/', '?', '#']).map_or(url.len(), |i| start + i);
    let at = url[start..end].rfind('@').map(|at| start + at);
    match at.and_then(|at| url[start..at].find(':').map(|colon| (start + colon, at))) {
        Some((colon, at)) => format!("{}:***{}", &url[..colon], &url[at..]).into(),
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
    /// the backend's own; the builder's URL must name the same server (the pub/sub connection
    /// goes there). Keep bb8's test on checkout, or a connection broken by a Redis restart
    /// stays in the pool. Not for Sentinel or a cluster ([`BackendErrorKind::Misconfigured`]).
    ///
    /// ```no_run
    /// use tower_lock::{RedisBackend, backend::redis::{bb8, bb8_redis}};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let url = "redis://127.0.0.1:6379";
    /// let pool = bb8::Pool::builder().build(bb8_redis::RedisConnectionManager::new(url)?).await?;
    /// let backend = RedisBackend::builder(url).pool(pool).connect().await?;
    /// # Ok(()) }
    /// ```
    pub fn pool(mut self, pool: bb8::Pool<bb8_redis::RedisConnectionManager>) -> Self {
        self.shared = Some(pool);
        self
    }

    /// How many connections (sockets) the backend opens, used in turn; each carries any
    /// number of commands at once. Defaults to 1 (Redis reads many commands per system call),
    /// or 4 with [`min_replicas`](Self::min_replicas) or [`wait_aof`](Self::wait_aof), whose
    /// waits hold back their connection's later replies. Not for a cluster.
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

    /// How long a new server run grants no new lock (its quarantine): by default the default
    /// lease (5 s), never shorter than the longest lease this process asks for; `ZERO` is off.
    ///
    /// A Redis restarted without persistence (or from an older snapshot, or a replica promoted
    /// before it had the last grants) forgot grants whose holders work on until their leases
    /// end. So the acquire scripts grant nothing until the quarantine has passed since the run
    /// started (a promoted replica: since a script saw it), by the server's `run_id` against a
    /// marker key `<prefix>{}:run` (the ACL user needs `+info`); an acquire meanwhile fails
    /// with [`BackendErrorKind::Quarantined`], saying when it ends. Set it on every process to
    /// at least the longest lease any of them uses (a longer lease warns once). Turn it off
    /// only for a server that loses no acknowledged write (`appendfsync always`), or in tests.
    /// A Redis Cluster is not quarantined.
    pub fn quarantine(mut self, quarantine: Duration) -> Self {
        self.quarantine = Some(quarantine);
        self
    }

    /// After each grant, waits (Redis `WAIT`) until at least `replicas` replicas copied it, for
    /// at most `timeout`; when fewer did, the grant is undone and the acquire fails with
    /// [`BackendErrorKind::ReplicasNotAcknowledged`]. This narrows, not closes, the window in
    /// which a failover to a replica without the grant lets a second holder in. Hand-offs to
    /// local waiters become acquires, so every grant is acknowledged.
    pub fn min_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.acknowledgement.replicas = (replicas > 0).then_some(MinReplicas { replicas, timeout });
        self
    }

    /// After each grant, waits (Redis `WAITAOF`, 7.2 and newer) until it is fsynced to an
    /// append-only file, by this server when `local` is set and by at least `replicas`
    /// replicas, for at most `timeout`; when not, the grant is undone and the acquire fails
    /// with [`BackendErrorKind::AofNotAcknowledged`]. Runs after `WAIT` when both are set; as
    /// with [`min_replicas`](Self::min_replicas), hand-offs become acquires.
    /// [`connect`](Self::connect) fails on a server without `WAITAOF`
    /// ([`BackendErrorKind::Unsupported`]) or that refuses it as configured (an ACL, no
    /// `appendonly` for `local`).
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// // Each grant is on this server's disk and on one replica's before `acquire` returns.
    /// let backend = tower_lock::RedisBackend::builder("redis://127.0.0.1:6379")
    ///     .wait_aof(true, 1, std::time::Duration::from_millis(500))
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn wait_aof(mut self, local: bool, replicas: u32, timeout: Duration) -> Self {
        self.acknowledgement.aof =
            (local || replicas > 0).then_some(WaitAof { local, replicas, timeout });
        self
    }

    /// Trusts `certificates.root_cert` (PEM) instead of the system's roots for a `rediss://`
    /// URL, and presents `certificates.client_tls` when asked for a client certificate.
    #[cfg(feature = "tls")]
    pub fn tls_certificates(mut self, certificates: redis::TlsCertificates) -> Self {
        self.tls = Some(certificates);
        self
    }

    /// Connects, checking the server answers.
    ///
    /// # Errors
    /// [`BackendErrorKind::Misconfigured`] for a URL or credentials that cannot work,
    /// `Unavailable` when the server cannot be reached, `Timeout` when it does not answer
    /// within the command timeout, and the [`wait_aof`](Self::wait_aof) errors; never the
    /// password.
    pub async fn connect(self) -> Result<RedisBackend, BackendError> {
        let command_timeout = self.command_timeout;
        #[cfg(feature = "cluster")]
        if let Source::Cluster(nodes) = &self.source {
            if self.shared.is_some() {
                let what = "an application's pool goes to one server, not a Redis Cluster: \
                            drop `.pool(..)`";
                let what = what.to_owned();
                return Err(BackendError::from_kind(BackendErrorKind::Misconfigured { what }));
            }
            // `WAIT` and `WAITAOF` must follow the write on its connection, which a cluster
            // connection does not promise.
            if self.acknowledgement.is_wanted() {
                let feature = match self.acknowledgement.replicas {
                    Some(_) => "min_replicas on a Redis Cluster",
                    None => "wait_aof on a Redis Cluster",
                };
                return Err(BackendError::from_kind(BackendErrorKind::Unsupported { feature }));
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
        #[cfg_attr(not(feature = "cluster"), allow(irrefutable_let_patterns))]
        if let Transport::Node { target, .. } = &backend.inner.transport {
            // One connection made directly first, for an error that says why (a pool would
            // retry a refused certificate or password until its timeout).
            let first = async { target.client().await?.get_multiplexed_async_connection().await };
            let server = target.describe();
            match tokio::time::timeout(command_timeout, first).await {
                Ok(Ok(_checked)) => {}
                Ok(Err(error)) => return Err(connect_error(error, &server)),
                Err(_) => {
                    let message =
                        format!("no answer from Redis at {server} within {command_timeout:?}");
                    return Err(BackendError::new(BackendErrorKind::Timeout, message));
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
        let url_error = |url: &str| {
            let shown = redact(url).into_owned();
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
                    .map_err(|e| BackendError::new(BackendErrorKind::Unavailable, e))?,
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
        let pool = match self.shared {
            Some(_) if !matches!(*target, Target::Node(_)) => {
                let what = "an application's pool goes to one server; Sentinel follows \
                            failovers with connections of its own: drop `.pool(..)`";
                let what = what.to_owned();
                return Err(BackendError::from_kind(BackendErrorKind::Misconfigured { what }));
            }
            Some(shared) => Pool::Shared(shared),
            None => {
                let waits = self.acknowledgement.is_wanted();
                let size = self.pool_size.unwrap_or(if waits { 4 } else { 1 });
                Pool::Own(Connections::new(target.clone(), self.command_timeout, size))
            }
        };
        Ok(RedisBackend::new(
            Transport::Node { pool, target },
            self.command_timeout,
            self.acknowledgement,
            Quarantine::new(self.quarantine),
        ))
    }
}
