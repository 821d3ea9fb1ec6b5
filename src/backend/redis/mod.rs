//! The Redis backend: one Redis node (or the master Sentinel names) through a few multiplexed
//! connections and one pub/sub connection, or with the `cluster` feature a Redis Cluster.
//!
//! Each grant is one record, named by the attempt that won it: an owner record (a string at the
//! lock's key `K`) for plain, fair and write locks, a member of a sorted set for readers and
//! permits. Every write goes through a Lua script (`lua/*.lua`) that checks the record it names
//! in the same atomic step, except the uncontended plain lock: one `SET K <attempt> NX PXAT`,
//! then one compare-and-delete, what a hand-written lock costs. Scripts go by SHA, and by body
//! after the server lost them (`scripts.rs`). Releases are published on `K:released`; waiters
//! listen through the pub/sub connection. The protocol, its invariants and faults are in
//! `src/backend/protocol.md`.
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
    sync::{Arc, OnceLock, atomic::Ordering},
    time::Duration,
};

use redis::{FromRedisValue, RedisError, Value};
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
    calls::CHANNEL,
    errors::{is_noscript, protocol_error, redis_error},
    pubsub::PubSub,
    quarantine::Quarantine,
    scripts::{Call, Scripts},
    transport::Transport,
};
use super::{
    Listener, LockKind,
    store::{
        AcquireReply, Extend, ExtendReply, Grant, Release, ReleaseReply, Renew, RenewReply, Store,
        holder_of,
    },
};
use crate::{
    error::{BackendError, BackendErrorKind},
    inspect::{HolderInfo, LockInfo, Permits},
    lease::Lease,
    lock_key::LockKey,
};

pub use self::builder::RedisBackendBuilder;

mod acknowledge;
mod builder;
mod calls;
#[cfg(feature = "cluster")]
mod cluster;
mod connection;
mod errors;
mod health;
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

/// An acquire's reply while the server run is in quarantine: `{-2, ms left}`.
const QUARANTINED: i64 = -2;
/// An acquire's reply when it arrived after its "not after": it did nothing.
const ARRIVED_LATE: i64 = -4;
/// How many grants one renewal call renews at most, bounding the time one script holds the
/// server.
const RENEW_CHUNK: usize = 500;

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
    quarantine: Quarantine,
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
    /// A promoted replica is [quarantined](RedisBackendBuilder::quarantine) from when a
    /// script first sees it as a master.
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
        quarantine: Quarantine,
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

    /// [`listen`](Store::listen) in two halves, for a Redlock listener that need not wait
    /// for every node: the listener at once, and the wait for the subscription, which tells
    /// whether the server confirmed it.
    pub(crate) fn subscribe(
        &self,
        key: &LockKey,
        only_for: Option<&str>,
    ) -> (Listener, impl Future<Output = bool> + Send + 'static) {
        self.pubsub().subscribe(key.derived(CHANNEL), only_for)
    }

    /// The scripts of this backend's transport.
    fn scripts(&self) -> &'static Scripts {
        self.inner.transport.scripts()
    }

    /// Sends the acquire of `grant` (with `extend`, the extend of the grant it names), once
    /// more on a new connection when it arrived too late to act; a second time is a timeout.
    async fn take(
        &self,
        grant: &Grant<'_>,
        extend: bool,
    ) -> Result<(Vec<i64>, Option<BackendErrorKind>), BackendError> {
        self.inner.quarantine.note_lease(grant.lease.duration());
        for _ in 0..2 {
            let answer = self.take_once(grant, extend).await?;
            if answer.0 != [ARRIVED_LATE] {
                return Ok(answer);
            }
        }
        Err(errors::arrived_late(grant.lease.duration()).with_key(grant.key.as_str()))
    }

    /// One try of [`take`](Self::take), on one connection: the uncontended `SET NX` where it
    /// may serve, else (or when the lock was taken) the script; after a grant, the
    /// acknowledgements, whose shortfall comes back with the reply.
    async fn take_once(
        &self,
        grant: &Grant<'_>,
        extend: bool,
    ) -> Result<(Vec<i64>, Option<BackendErrorKind>), BackendError> {
        let inner = &*self.inner;
        let (key, quarantine) = (grant.key, &inner.quarantine);
        // The waits may take their whole timeouts on top of the script's command.
        let budget = inner.command_timeout + inner.acknowledgement.timeout();
        let result = self
            .with_conn_within(Some(key), budget, async |conn| {
                let state = conn.state();
                let clock = state.as_ref().and_then(|state| state.clock);
                let not_after = clock.and_then(|clock| clock.expiry(&grant.lease));
                // Only on a connection whose run a script saw past its quarantine: `SET NX`
                // cannot check the run marker.
                let plain = !extend
                    && grant.kind == LockKind::Exclusive
                    && !grant.fencing
                    && !grant.contended
                    && state.as_ref().is_some_and(|state| {
                        !quarantine.is_on() || state.run_verified.load(Ordering::Relaxed)
                    });
                if let Some(pxat) = not_after.filter(|_| plain) {
                    let set: Option<()> = redis::cmd("SET")
                        .arg(key.as_str())
                        .arg(grant.attempt)
                        .arg("NX")
                        .arg("PXAT")
                        .arg(pxat)
                        .query_async(conn)
                        .await?;
                    if set.is_some() {
                        let shortfall = inner.acknowledgement.shortfall(conn).await?;
                        return Ok((vec![1, -1], shortfall));
                    }
                }
                let run = state.as_ref().map_or("", |state| state.run.as_str());
                let check = quarantine.check(run).filter(|_| !extend);
                let call = calls::acquire(self.scripts(), grant, extend, not_after, check);
                let reply: Vec<i64> = call.run(conn).await?;
                match reply.first() {
                    // It did nothing: the call took longer than its lease, or the server's
                    // clock moved on more than this connection's reading allows.
                    Some(&ARRIVED_LATE) => conn.mark_broken(),
                    Some(&QUARANTINED) => {}
                    _ if check.is_some() => {
                        if let Some(state) = &state {
                            state.run_verified.store(true, Ordering::Relaxed);
                        }
                    }
                    _ => {}
                }
                let shortfall = match reply.first() {
                    Some(1) if !extend => inner.acknowledgement.shortfall(conn).await?,
                    _ => None,
                };
                Ok((reply, shortfall))
            })
            .await;
        self.name_wrong_type_in(result, key).await
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

    /// Runs `batches`, replies in order. A single node gets one pipeline, sent again by body
    /// when the server lost a script (renewals may be repeated); in a cluster the batches
    /// live on different nodes, so each is its own call, all sent at once.
    async fn run_batches(
        &self,
        batches: &[Batch],
    ) -> Result<Vec<Result<Value, RedisError>>, BackendError> {
        #[cfg(feature = "cluster")]
        if let Some(cluster) = self.inner.transport.cluster() {
            let replies = futures_util::future::join_all(
                batches
                    .iter()
                    .map(async |batch| batch.call.run(&mut cluster.connection()).await),
            );
            return tokio::time::timeout(self.inner.command_timeout, replies)
                .await
                .map_err(|_| BackendError::from_kind(BackendErrorKind::Timeout));
        }
        let pipeline = async |by_hash: bool| {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for batch in batches {
                pipe.add_command(batch.call.cmd(by_hash).into_owned());
            }
            let values: Vec<Value> = self
                .with_conn(None, async |conn| pipe.query_async(conn).await)
                .await?;
            Ok::<_, BackendError>(
                values
                    .into_iter()
                    .map(Value::extract_error)
                    .collect::<Vec<_>>(),
            )
        };
        let replies = pipeline(true).await?;
        if replies
            .iter()
            .any(|reply| reply.as_ref().is_err_and(is_noscript))
        {
            return pipeline(false).await;
        }
        Ok(replies)
    }
}

/// One call of a renewal: the renewals it answers for (their indexes), and whether it keeps a
/// place (`wait.lua`, one integer) rather than renewing grants (`renew.lua`, one each).
struct Batch {
    entries: Vec<usize>,
    call: Call,
    place: bool,
}

/// A fencing token of a reply (`-1`: none).
fn token(raw: i64) -> Option<u64> {
    u64::try_from(raw).ok()
}

/// A reply's milliseconds (`-1` or less: unknown).
fn millis(raw: i64) -> Option<Duration> {
    u64::try_from(raw).ok().map(Duration::from_millis)
}

/// What `lua/inspect.lua` answered, for a lock of `kind`'s layout: one holder per grant, of
/// the kind of its record.
fn lock_info(value: Value, kind: LockKind) -> Result<LockInfo, BackendError> {
    let bad = |_| protocol_error("inspect reply");
    let items = Vec::<Value>::from_redis_value(value).map_err(bad)?;
    // {owner record or '', its ms left, waiters queued, grant, ms left, grant, ms left, ...}
    let mut items = items.into_iter();
    let mut next = |what| items.next().ok_or_else(|| protocol_error(what));
    let int = |value| i64::from_redis_value(value).map_err(bad);
    let owner = String::from_redis_value(next("short inspect reply")?).map_err(bad)?;
    let left = int(next("short inspect reply")?)?;
    let queued = int(next("short inspect reply")?)?;
    let mut info = LockInfo::free().with_queue_len(u64::try_from(queued).unwrap_or(0));
    if !owner.is_empty() {
        // '<attempt>' or '<attempt>~<token>'.
        let attempt = owner
            .rsplit_once('~')
            .filter(|(_, token)| !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit()))
            .map_or(owner.as_str(), |(attempt, _)| attempt);
        let side = match kind {
            LockKind::Read | LockKind::Write => LockKind::Write,
            // The store does not mark a fair grant.
            _ => LockKind::Exclusive,
        };
        info = info.with_holder(HolderInfo::new(holder_of(attempt), side, 1, millis(left)));
    }
    let side = match kind {
        LockKind::Semaphore => LockKind::Semaphore,
        _ => LockKind::Read,
    };
    while let Ok(grant) = next("") {
        let grant = String::from_redis_value(grant).map_err(bad)?;
        let left = int(next("odd inspect reply")?)?;
        info = info.with_holder(HolderInfo::new(holder_of(&grant), side, 1, millis(left)));
    }
    if kind == LockKind::Semaphore && info.is_locked() {
        // The store keeps no permit count.
        let in_use = info.holders.len() as u64;
        info = info.with_permits(Permits::new(in_use, 0));
    }
    Ok(info)
}

impl Store for RedisBackend {
    type Listener = Listener;

    async fn acquire(&self, grant: Grant<'_>) -> Result<AcquireReply, BackendError> {
        let key = grant.key.as_str();
        let (reply, shortfall) = self.take(&grant, false).await?;
        if let Some(shortfall) = shortfall {
            return Err(self.unacknowledged(grant, shortfall).await);
        }
        match *reply.as_slice() {
            [1, raw] => Ok(AcquireReply::Acquired { token: token(raw) }),
            [0, retry] => Ok(AcquireReply::Held { ttl: millis(retry) }),
            [QUARANTINED, left] => {
                let left = millis(left)
                    .unwrap_or_default()
                    .max(Duration::from_millis(1));
                self.inner.quarantine.held_back(key, left);
                Err(errors::quarantined(left).with_key(key))
            }
            _ => Err(protocol_error("acquire reply").with_key(key)),
        }
    }

    async fn extend(&self, extend: Extend<'_>) -> Result<ExtendReply, BackendError> {
        let grant = Grant {
            key: extend.key,
            holder: "",
            attempt: extend.grant,
            lease: extend.lease,
            fencing: extend.fencing,
            kind: extend.kind,
            queue: None,
            contended: true,
            permits: 0,
            within: None,
        };
        match *self.take(&grant, true).await?.0.as_slice() {
            [1, raw] => Ok(ExtendReply::Extended { token: token(raw) }),
            [0, _] => Ok(ExtendReply::NotHeld),
            _ => Err(protocol_error("extend reply").with_key(extend.key.as_str())),
        }
    }

    async fn release(&self, release: Release<'_>) -> Result<ReleaseReply, BackendError> {
        // With acknowledgements, every grant goes through `acquire` and its waits.
        let handoff = release.handoff.filter(|_| {
            release.kind == LockKind::Exclusive && !self.inner.acknowledgement.is_wanted()
        });
        if let Some(next) = &handoff {
            self.inner.quarantine.note_lease(next.lease.duration());
        }
        let call = calls::release(self.scripts(), &release, handoff.as_ref());
        let reply: Vec<i64> = self.invoke(&call, release.key).await?;
        match *reply.as_slice() {
            [0] => Ok(ReleaseReply::NotHeld),
            [2, n] => Ok(ReleaseReply::Released {
                notified: u64::try_from(n).ok(),
            }),
            [3, raw] => Ok(ReleaseReply::HandedOff { token: token(raw) }),
            _ => Err(protocol_error("release reply").with_key(release.key.as_str())),
        }
    }

    async fn renew(&self, renewals: &[Renew<'_>]) -> Result<Vec<RenewReply>, BackendError> {
        let scripts = self.scripts();
        // One grant per call in a cluster, where each lives on its own node.
        #[cfg(feature = "cluster")]
        let chunk = if self.inner.transport.cluster().is_some() {
            1
        } else {
            RENEW_CHUNK
        };
        #[cfg(not(feature = "cluster"))]
        let chunk = RENEW_CHUNK;
        let grants: Vec<(usize, calls::Renewal<'_>)> = (renewals.iter().enumerate())
            .filter_map(|(i, renew)| match *renew {
                Renew::Grant {
                    key,
                    kind,
                    grant,
                    lease,
                } => Some((i, (key, kind, grant, lease))),
                Renew::Place { .. } => None,
            })
            .collect();
        let mut batches: Vec<Batch> = grants
            .chunks(chunk)
            .map(|chunk| Batch {
                entries: chunk.iter().map(|(i, _)| *i).collect(),
                call: calls::renew(scripts, &chunk.iter().map(|(_, g)| *g).collect::<Vec<_>>()),
                place: false,
            })
            .collect();
        for (i, renew) in renewals.iter().enumerate() {
            if let Renew::Place {
                key,
                kind,
                holder,
                timeout,
            } = *renew
            {
                let ms = Lease::fixed(timeout).millis();
                let call = calls::wait(scripts, key, kind, holder, ms);
                batches.push(Batch {
                    entries: vec![i],
                    call,
                    place: true,
                });
            }
        }
        if batches.is_empty() {
            return Ok(Vec::new());
        }
        let mut replies = vec![RenewReply::NotHeld; renewals.len()];
        for (batch, reply) in batches.iter().zip(self.run_batches(&batches).await?) {
            let key = renewals[batch.entries[0]].key();
            let answers = reply.and_then(|value| {
                match batch.place {
                    true => i64::from_redis_value(value).map(|answer| vec![answer]),
                    false => Vec::<i64>::from_redis_value(value),
                }
                .map_err(RedisError::from)
            });
            let answers = match answers {
                Ok(answers) if answers.len() == batch.entries.len() => answers,
                Ok(_) => return Err(protocol_error("renewal reply").with_key(key.as_str())),
                Err(error) => {
                    let error = redis_error(error).with_key(key.as_str());
                    if !error.is_wrong_type() {
                        return Err(error);
                    }
                    vec![-1]
                }
            };
            for (&i, answer) in batch.entries.iter().zip(answers) {
                replies[i] = match answer {
                    1 => RenewReply::Renewed,
                    2 if batch.place => RenewReply::Ready,
                    -1 => {
                        // Foreign data at the key: the lock is not ours any more.
                        tracing::warn!(key = %renewals[i].key(), "renewal found foreign data");
                        RenewReply::NotHeld
                    }
                    _ => RenewReply::NotHeld,
                };
            }
        }
        Ok(replies)
    }

    async fn abandon(&self, grant: Grant<'_>) -> Result<bool, BackendError> {
        let reply: Vec<i64> = self
            .invoke(&calls::abandon(self.scripts(), &grant), grant.key)
            .await?;
        Ok(reply.first() == Some(&2))
    }

    async fn leave(&self, key: &LockKey, holder: &str, kind: LockKind) -> Result<(), BackendError> {
        if kind.queues() {
            let call = calls::wait(self.scripts(), key, kind, holder, 0);
            self.invoke::<i64>(&call, key).await?;
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
        // A backend shared by several clients (clones of it) keeps serving the others: its
        // pub/sub connection and probes stop with the last handle, or when it is dropped.
        if Arc::strong_count(&self.inner) == 1 {
            self.inner.stop.cancel();
        }
    }

    async fn inspect(&self, key: &LockKey, kind: LockKind) -> Result<LockInfo, BackendError> {
        let value = self
            .invoke(&calls::inspect(self.scripts(), key, kind, false), key)
            .await?;
        lock_info(value, kind).map_err(|error| error.with_key(key.as_str()))
    }

    async fn force_unlock(&self, key: &LockKey, kind: LockKind) -> Result<LockInfo, BackendError> {
        let value = self
            .invoke(&calls::inspect(self.scripts(), key, kind, true), key)
            .await?;
        lock_info(value, kind).map_err(|error| error.with_key(key.as_str()))
    }
}
