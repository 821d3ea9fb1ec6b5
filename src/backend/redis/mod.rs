//! The Redis backend: one Redis node (or the master Sentinel names) through a few multiplexed
//! connections and one pub/sub connection; with the `cluster` feature, a Redis Cluster.
//!
//! Each grant is one record named by the attempt that won it: a string at the lock's key `K`
//! for plain, fair and write locks, a member of a sorted set for readers and permits. Every
//! write is a Lua script (`lua/*.lua`) that checks the record it names in the same step, but
//! the uncontended plain lock: `SET K <attempt> NX PXAT`, then a compare-and-delete. Releases
//! are published on `K:released`. The protocol is described in `src/backend/protocol.md`; the
//! crate's docs show a service on Redis.

use std::{
    fmt,
    sync::{Arc, OnceLock, atomic::Ordering},
    time::Duration,
};

use redis::{FromRedisValue, RedisError, Value};
use tokio_util::sync::{CancellationToken, DropGuard};

// The versions this crate builds against (an application's pool, a TLS certificate, an error
// must be of exactly these types), for an application to name without pinning them.
pub use bb8;
pub use bb8_redis;
pub use redis;

use self::{
    acknowledge::Acknowledgement,
    builder::Source,
    calls::CHANNEL,
    errors::{is_noscript, protocol_error, redis_error},
    pubsub::PubSub,
    quarantine::Quarantine,
    scripts::{Call, Scripts},
    transport::{Conn, Transport},
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
    lock_key::LockKey,
};

pub use self::builder::RedisBackendBuilder;

mod acknowledge;
mod builder;
mod calls;
#[cfg(feature = "cluster")]
mod cluster;
mod errors;
mod health;
mod pool;
mod pubsub;
mod quarantine;
mod scripts;
#[cfg(test)]
mod tests;
mod transport;

/// An acquire's reply while the server run is in quarantine: `{-2, ms left}`.
const QUARANTINED: i64 = -2;
/// An acquire's reply when it arrived after its "not after": it did nothing.
const ARRIVED_LATE: i64 = -4;
/// How many grants one renewal call renews at most: one script holds the server meanwhile.
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
        f.debug_struct("RedisBackend")
            .field("server", &self.inner.transport.describe())
            .field("command_timeout", &self.inner.command_timeout)
            .field("quarantine", &self.inner.quarantine.length())
            .field("min_replicas", &self.inner.acknowledgement.replicas)
            .field("wait_aof", &self.inner.acknowledgement.aof)
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// Connects to the Redis server at `url` (`redis://[user:password@]host:port[/db]`).
    ///
    /// # Errors
    /// As [`RedisBackendBuilder::connect`].
    pub async fn connect(url: &str) -> Result<Self, BackendError> {
        Self::builder(url).connect().await
    }

    /// Starts configuring a backend for the server at `url`.
    pub fn builder(url: impl Into<String>) -> RedisBackendBuilder {
        RedisBackendBuilder::new(Source::Url(url.into()))
    }

    /// Starts configuring a backend for the master that the Sentinels at `sentinels`
    /// (`redis://host:port` each) monitor under `master_name` (feature `sentinel`).
    ///
    /// Every new connection asks the Sentinels for the master, and a connection that failed or
    /// found its server demoted is dropped, so after a failover commands and notifications
    /// move to the new master (waiters check their locks again), which is
    /// [quarantined](RedisBackendBuilder::quarantine) from when a script first sees it. Grants
    /// not yet replicated can be lost in a failover: see
    /// [`min_replicas`](RedisBackendBuilder::min_replicas) and fencing tokens.
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
    /// nodes; the rest are discovered; feature `cluster`). Each lock's scripts go to its hash
    /// slot's master, following `MOVED` and `ASK`; its notifications use sharded pub/sub on
    /// the same shard. `pool_size`, `min_replicas` and `wait_aof` do not apply.
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
        Self {
            inner: Arc::new(Inner {
                health: health::Health::new(transport.describe()),
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

    /// One `PING`, within the command timeout.
    pub(crate) async fn ping(&self) -> Result<(), BackendError> {
        let ping = async |conn: &mut Conn| redis::cmd("PING").query_async(conn).await;
        self.with_conn(None, ping).await
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
                cluster::start_pubsub(cluster, inner.command_timeout, inner.stop.clone())
            }
        })
    }

    /// [`listen`](Store::listen) in two halves (for Redlock): the listener, and the wait for
    /// the subscription, which tells whether the server confirmed it.
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
    /// more on a new connection when it arrived too late to act; twice is a timeout. The reply
    /// comes with what a grant's acknowledgements fell short of.
    async fn take(
        &self,
        grant: &Grant<'_>,
        extend: bool,
    ) -> Result<(Vec<i64>, Option<BackendErrorKind>), BackendError> {
        self.inner.quarantine.note_lease(grant.lease.duration());
        // The waits may take their whole timeouts on top of the command.
        let budget = self.inner.command_timeout + self.inner.acknowledgement.timeout();
        for _ in 0..2 {
            let answer = self.with_conn_within(Some(grant.key), budget, async |conn| {
                self.take_on(conn, grant, extend).await
            });
            let answer = self.name_wrong_type_in(answer.await, grant.key).await?;
            if answer.0 != [ARRIVED_LATE] {
                return Ok(answer);
            }
        }
        // Twice too late: nothing was done, and the server answers too slowly for the lease.
        let lease = grant.lease.duration();
        let late = format!("the acquire reached the server after its lease of {lease:?}");
        Err(BackendError::new(BackendErrorKind::Timeout, late).with_key(grant.key.as_str()))
    }

    /// One try of [`take`](Self::take) on `conn`: the uncontended `SET NX` where it may serve,
    /// else (or when the lock was taken) the script; after a grant, the acknowledgements.
    async fn take_on(
        &self,
        conn: &mut Conn,
        grant: &Grant<'_>,
        extend: bool,
    ) -> Result<(Vec<i64>, Option<BackendErrorKind>), RedisError> {
        let (quarantine, acknowledgement) = (&self.inner.quarantine, &self.inner.acknowledgement);
        let state = conn.state.clone();
        let clock = state.as_ref().and_then(|state| state.clock);
        let not_after = clock.and_then(|clock| clock.expiry(&grant.lease));
        // `SET NX` cannot check the run marker: only where a script saw the run past it.
        let plain = !extend
            && grant.kind == LockKind::Exclusive
            && !grant.fencing
            && !grant.contended
            && state.as_ref().is_some_and(|state| {
                !quarantine.is_on() || state.run_verified.load(Ordering::Relaxed)
            });
        let mut set = redis::cmd("SET");
        set.arg(grant.key.as_str()).arg(grant.attempt).arg("NX").arg("PXAT");
        let set: Option<()> = match not_after.filter(|_| plain) {
            Some(pxat) => set.arg(pxat).query_async(conn).await?,
            None => None,
        };
        let reply = if set.is_some() {
            vec![1, -1]
        } else {
            let run = state.as_ref().map_or("", |state| state.run.as_str());
            let check = quarantine.check(run).filter(|_| !extend);
            let call = calls::acquire(self.scripts(), grant, extend, not_after, check.as_deref());
            let reply: Vec<i64> = call.run(conn).await?;
            match reply.first() {
                // It did nothing: the call took longer than its lease, or the server's clock
                // moved on more than this connection's reading allows.
                Some(&ARRIVED_LATE) => conn.mark_broken(),
                Some(&QUARANTINED) => {}
                // Past the check: the connection's run is over its quarantine.
                _ if check.is_some() => (state.iter()).for_each(|state| {
                    state.run_verified.store(true, Ordering::Relaxed);
                }),
                _ => {}
            }
            reply
        };
        let shortfall = match reply.first() {
            Some(1) if !extend => acknowledgement.shortfall(conn).await?,
            _ => None,
        };
        Ok((reply, shortfall))
    }

    /// Undoes a grant that was not acknowledged as configured, and builds the error the
    /// acquire fails with, of kind `shortfall`.
    async fn unacknowledged(&self, grant: Grant<'_>, shortfall: BackendErrorKind) -> BackendError {
        let key = grant.key.as_str();
        tracing::warn!(key, ?shortfall, "a grant was not acknowledged as configured; undoing");
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
        batches: &[(Vec<usize>, Call)],
    ) -> Result<Vec<Result<Value, RedisError>>, BackendError> {
        #[cfg(feature = "cluster")]
        if let Transport::Cluster(cluster) = &self.inner.transport {
            let replies = futures_util::future::join_all(
                batches.iter().map(async |(_, call)| call.run(&mut cluster.conn.clone()).await),
            );
            return tokio::time::timeout(self.inner.command_timeout, replies)
                .await
                .map_err(|_| BackendError::from_kind(BackendErrorKind::Timeout));
        }
        let pipeline = async |by_hash: bool| {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for (_, call) in batches {
                pipe.add_command(call.cmd(by_hash).into_owned());
            }
            let values =
                self.with_conn(None, async |conn| pipe.query_async::<Vec<Value>>(conn).await);
            Ok::<_, BackendError>(values.await?.into_iter().map(Value::extract_error).collect())
        };
        let replies: Vec<_> = pipeline(true).await?;
        match replies.iter().any(|reply| reply.as_ref().is_err_and(is_noscript)) {
            true => pipeline(false).await,
            false => Ok(replies),
        }
    }
}

/// A fencing token of a reply (`-1`: none).
fn token(raw: i64) -> Option<u64> {
    u64::try_from(raw).ok()
}

/// A release or undo script's reply: `-1` not held, `n >= 0` freed (n subscribers told),
/// `{3, token}` handed off.
fn release_reply(reply: &redis::Value) -> Option<ReleaseReply> {
    use redis::Value::{Array, Int};
    match reply {
        Int(-1) => Some(ReleaseReply::NotHeld),
        Int(n) => Some(ReleaseReply::Released { notified: u64::try_from(*n).ok() }),
        Array(items) => match items.as_slice() {
            // A token beyond a Lua number's exact range comes as a string.
            [Int(3), raw] => {
                let raw = redis::from_redis_value::<i64>(raw.clone()).ok()?;
                Some(ReleaseReply::HandedOff { token: token(raw) })
            }
            _ => None,
        },
        _ => None,
    }
}

/// A reply's milliseconds (`-1` or less: unknown).
fn millis(raw: i64) -> Option<Duration> {
    u64::try_from(raw).ok().map(Duration::from_millis)
}

/// What `lua/inspect.lua` answered for a lock of `kind`'s layout: one holder per grant, of the
/// kind of its record (the store does not mark a fair grant: it shows as exclusive).
fn lock_info(value: Value, kind: LockKind) -> Result<LockInfo, BackendError> {
    let bad = || protocol_error("inspect reply");
    // {owner record or '', its ms left, waiters queued, grant, ms left, grant, ms left, ...}
    let items = Vec::<Value>::from_redis_value(value).ok();
    let items = items.filter(|items| items.len() % 2 == 1).ok_or_else(bad)?;
    let queued = i64::from_redis_value_ref(&items[2]).map_err(|_| bad())?;
    let mut info = LockInfo::free().with_queue_len(u64::try_from(queued).unwrap_or(0));
    let (owner, shared) = match kind {
        LockKind::Read | LockKind::Write => (LockKind::Write, LockKind::Read),
        LockKind::Semaphore => (LockKind::Semaphore, LockKind::Semaphore),
        _ => (LockKind::Exclusive, LockKind::Read),
    };
    let grants = std::iter::once((&items[..2], owner));
    for (pair, side) in grants.chain(items[3..].chunks(2).map(|pair| (pair, shared))) {
        let record = String::from_redis_value_ref(&pair[0]).map_err(|_| bad())?;
        let left = i64::from_redis_value_ref(&pair[1]).map_err(|_| bad())?;
        // '<attempt>' or '<attempt>~<token>'.
        let attempt = (record.rsplit_once('~'))
            .filter(|(_, token)| token.bytes().all(|b| b.is_ascii_digit()))
            .map_or(record.as_str(), |(attempt, _)| attempt);
        if !record.is_empty() {
            info = info.with_holder(HolderInfo::new(holder_of(attempt), side, 1, millis(left)));
        }
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
                let left = millis(left).unwrap_or_default().max(Duration::from_millis(1));
                let server = self.inner.transport.describe();
                self.inner.quarantine.held_back(&server, key, left);
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
        let reply = self.invoke(&call, release.key).await?;
        release_reply(&reply)
            .ok_or_else(|| protocol_error("release reply").with_key(release.key.as_str()))
    }

    async fn renew(&self, renewals: &[Renew<'_>]) -> Result<Vec<RenewReply>, BackendError> {
        // One grant per call in a cluster, where each may live on another node.
        let chunk = match self.inner.transport {
            Transport::Node { .. } => RENEW_CHUNK,
            #[cfg(feature = "cluster")]
            Transport::Cluster(_) => 1,
        };
        let batches = calls::renewals(self.scripts(), renewals, chunk);
        if batches.is_empty() {
            return Ok(Vec::new());
        }
        let mut replies = vec![RenewReply::NotHeld; renewals.len()];
        for ((entries, _), reply) in batches.iter().zip(self.run_batches(&batches).await?) {
            let key = renewals[entries[0]].key().as_str();
            // `renew.lua` answers one integer per grant, `wait.lua` one for its place.
            let answers = reply.and_then(|value| match value {
                Value::Int(answer) => Ok(vec![answer]),
                value => Vec::<i64>::from_redis_value(value).map_err(RedisError::from),
            });
            let answers = match answers.map_err(|error| redis_error(error).with_key(key)) {
                Ok(answers) if answers.len() == entries.len() => answers,
                Ok(_) => return Err(protocol_error("renewal reply").with_key(key)),
                Err(error) if error.is_wrong_type() => vec![-1; entries.len()],
                Err(error) => return Err(error),
            };
            for (&i, answer) in entries.iter().zip(answers) {
                replies[i] = match answer {
                    1 => RenewReply::Renewed,
                    2 => RenewReply::Ready,
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
        let reply = self.invoke(&calls::abandon(self.scripts(), &grant), grant.key).await?;
        Ok(matches!(release_reply(&reply), Some(ReleaseReply::Released { .. })))
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
        let value = self.invoke(&calls::inspect(self.scripts(), key, kind, false), key).await?;
        lock_info(value, kind).map_err(|error| error.with_key(key.as_str()))
    }

    async fn force_unlock(&self, key: &LockKey, kind: LockKind) -> Result<LockInfo, BackendError> {
        let value = self.invoke(&calls::inspect(self.scripts(), key, kind, true), key).await?;
        lock_info(value, kind).map_err(|error| error.with_key(key.as_str()))
    }
}
