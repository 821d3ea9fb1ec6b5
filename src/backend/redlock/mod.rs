//! Redlock: one lock over N independent Redis masters, held while a majority of them hold it.
//!
//! Each node is a [`RedisBackend`], so the scripts, script reloading, error mapping and pub/sub
//! of a single node are the same here. On top of them:
//!
//! - **Acquire** asks every node at once, each bounded by the node timeout, and returns as
//!   soon as a majority granted it: a slow node does not hold up a won vote, and its late
//!   reply is left to finish in the background. A vote not won waits for every node, so that
//!   what the slow ones took is given back before the engine tries again. It succeeds when a
//!   majority granted it while the lease still had time left once the round trip and the
//!   clock drift margin (1 % of the lease + 2 ms) are taken off. Otherwise the attempt is given back on every node that took it (or may
//!   have), and the engine is told to retry after a random delay under the retry jitter, so
//!   that contenders of a split vote do not collide again.
//!   When fewer than a majority answer at all, the acquire fails with
//!   [`BackendErrorKind::QuorumUnavailable`], which the engine retries while the wait lasts.
//! - **Release** goes to every node. A hand-off cannot be made atomically across nodes: the lock
//!   is released plainly and the local waiter contends like any other. Every node that did not
//!   answer the release, or never answered the grant's acquire, gets the grant's undo in the
//!   background until it answers or the grant's lease ends: it deletes the record if the node
//!   has it, and records the attempt as given up on otherwise, so a late acquire there takes
//!   nothing (see `Held`). Since a node keeps one record per grant and no counts, the nodes
//!   cannot disagree on what a release or an undo does.
//! - **Renewal** (and a re-entry's extend) holds only if a majority renewed it; otherwise the
//!   guard is lost. If fewer than a majority answer, the watchdog keeps trying until the
//!   lock's deadline.
//! - **Waiting** listens on every node and wakes once a majority of them published a release.
//! - **Inspection** asks every node and reports a holder that a majority of them name, with
//!   the hold count and remaining lease a majority still has; a hold on a minority of the
//!   nodes (an attempt that lost its vote, waiting out its lease there) holds nothing and is
//!   not reported. **Force-unlock** clears every node that answers, reports what any node
//!   held, and fails unless a majority answered (repeat it once the nodes are back).
//! - **A node that cannot be reached** (no connection within the node timeout) is skipped for
//!   a second, counting as not answering at once, rather than costing every call its timeout.
//!
//! Fair and read-write locks, semaphores and fencing tokens are refused with
//! [`BackendErrorKind::Unsupported`] before any node is contacted: a FIFO queue and a counter
//! that only ever rises need one ordered store, and N independent masters are not one.
//!
//! ```no_run
//! use std::time::Duration;
//! use tower_lock::{LockClient, RedlockBackend};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let backend = RedlockBackend::builder([
//!     "redis://10.0.0.1:6379",
//!     "redis://10.0.0.2:6379",
//!     "redis://10.0.0.3:6379",
//!     "redis://10.0.0.4:6379",
//!     "redis://10.0.0.5:6379",
//! ])
//! .node_timeout(Duration::from_millis(50))
//! .build()?;
//! let locks = LockClient::builder(backend).build()?;
//! let guard = locks.lock("order:42").acquire().await?;
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```

use std::{
    collections::HashMap,
    fmt,
    future::Future,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use futures_util::{
    StreamExt,
    future::{BoxFuture, join_all},
    stream::FuturesUnordered,
};
use tokio::time::Instant;

use self::vote::{AcquireVote, NodeResult};
use super::{
    LockKind,
    redis::RedisBackend,
    store::{
        AcquireReply, Extend, ExtendReply, Grant, OwnedGrant, Release, ReleaseReply, Renew,
        RenewReply, Store,
    },
};
use crate::{
    error::{BackendError, BackendErrorKind, ConfigError},
    inspect::LockInfo,
    lock_key::LockKey,
};

mod inspect;
mod listener;
#[cfg(test)]
mod tests;
mod vote;

pub(crate) use listener::RedlockListener;

/// The most nodes one backend takes (the listener tracks them in a 64-bit mask).
const MAX_NODES: usize = 63;

/// How long a node that could not be reached is skipped before it is tried again.
const NODE_BACKOFF: Duration = Duration::from_secs(1);

/// Skips `node` after `error`, with a probe in the background that keeps it skipped (for
/// [`NODE_BACKOFF`] past each failed probe) until it answers again: calls then never wait for
/// a node that is down, and a node back from a restart is used again at once.
fn skip(node: &RedisBackend, skipped_until: &Arc<Mutex<Option<Instant>>>, error: &BackendError) {
    let was_skipped = lock(skipped_until)
        .replace(Instant::now() + NODE_BACKOFF)
        .is_some_and(|until| Instant::now() < until);
    if was_skipped {
        return;
    }
    tracing::debug!(node = ?node, error = %format_args!("{error:#}"), "Redlock node unreachable; skipping it until it answers");
    let (node, skipped_until) = (node.clone(), skipped_until.clone());
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(PROBE_EVERY).await;
            // The backend is gone: nothing to probe for.
            if Arc::strong_count(&skipped_until) == 1 {
                return;
            }
            if node.ping().await.is_ok() {
                *lock(&skipped_until) = None;
                tracing::debug!(node = ?node, "Redlock node answers again");
                return;
            }
            *lock(&skipped_until) = Some(Instant::now() + NODE_BACKOFF);
        }
    });
}

/// How often a skipped node is probed.
const PROBE_EVERY: Duration = Duration::from_millis(25);

/// The longest pause between two tries of a call a node owes (a release it missed, the undo of
/// an acquire it never answered): a node back from a stall gets it this long after at most.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

// A std mutex: one field read or written, never held across an await.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Locks held on a majority of independent Redis masters. See the [module docs](self).
/// Cheap to clone.
#[derive(Clone)]
pub struct RedlockBackend {
    inner: Arc<Inner>,
}

struct Inner {
    nodes: Vec<RedisBackend>,
    /// Per node: until when it is skipped, after it could not be reached. A probe clears it
    /// as soon as the node answers again.
    skipped_until: Vec<Arc<Mutex<Option<Instant>>>>,
    quorum: usize,
    node_timeout: Duration,
    retry_jitter: Duration,
    rounds: AtomicU64,
    won: AtomicU64,
    /// The grants won here and not yet released, by lock and attempt: what their release owes
    /// the nodes that did not take part in the vote.
    holds: Mutex<HashMap<Hold, Held>>,
}

/// A lock and the attempt that won it.
type Hold = (LockKey, String);

/// What a release owes the nodes of a grant beyond the release each answers at once.
///
/// A node that did not answer the release may keep the record; an acquire a node never
/// answered (it timed out with its command on the wire) may still write it there. Either way
/// the node gets the grant's undo after the release until it answers, within
/// [`lease_ends`](Self::lease_ends) (then its lease frees it anyway): it deletes the record if
/// there, and records the attempt as given up on otherwise, so a late acquire takes nothing.
/// A node that granted after the vote was won, once the grant was released, is undone at once.
struct Held {
    /// When the grant's lease ends, as last granted or renewed.
    lease_ends: Instant,
    /// The grant, for its undo.
    grant: Arc<OwnedGrant>,
    /// The nodes that never answered its acquire.
    unanswered: Vec<usize>,
}

impl fmt::Debug for RedlockBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockBackend")
            .field("nodes", &self.inner.nodes)
            .field("quorum", &self.inner.quorum)
            .field("node_timeout", &self.inner.node_timeout)
            .field("retry_jitter", &self.inner.retry_jitter)
            .finish_non_exhaustive()
    }
}

/// Where a node comes from.
#[derive(Debug)]
enum Node {
    Url(String),
    Backend(RedisBackend),
}

/// Builds a [`RedlockBackend`]. Made by [`RedlockBackend::builder`].
#[derive(Debug)]
#[must_use]
pub struct RedlockBackendBuilder {
    nodes: Vec<Node>,
    node_timeout: Duration,
    retry_jitter: Duration,
    pool_size: Option<u32>,
    quarantine: Option<Duration>,
}

impl RedlockBackendBuilder {
    /// Adds a node by URL (`redis://[user:password@]host:port[/db]`).
    pub fn node(mut self, url: impl Into<String>) -> Self {
        self.nodes.push(Node::Url(url.into()));
        self
    }

    /// Adds a node already connected, sharing its connections with the application. Calls to
    /// it are still bounded by the node timeout.
    pub fn backend(mut self, backend: RedisBackend) -> Self {
        self.nodes.push(Node::Backend(backend));
        self
    }

    /// How long one node may take to answer one call before it counts as not answering. Keep
    /// it a small fraction of the lease: an acquire may wait this long for a node that is slow.
    /// A node that cannot be reached (no connection within this time) is skipped for a second
    /// afterwards, so a node that is down costs one call in a second its timeout, not every
    /// call. Defaults to 100 ms.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// The longest random delay before retrying after a split vote (no holder has a
    /// majority). Defaults to 50 ms.
    pub fn retry_jitter(mut self, jitter: Duration) -> Self {
        self.retry_jitter = jitter;
        self
    }

    /// How long a node added by URL that has just started grants no new lock: see
    /// [`RedisBackendBuilder::quarantine`](crate::backend::redis::RedisBackendBuilder::quarantine).
    /// Defaults to the longest lease asked for. A node restarted without persistence while
    /// it was part of a holder's majority would otherwise let a second holder win a majority
    /// with it; in quarantine it votes "held".
    pub fn quarantine(mut self, quarantine: Duration) -> Self {
        self.quarantine = Some(quarantine);
        self
    }

    /// How many connections each node added by URL opens. Defaults to one, as for
    /// [`RedisBackendBuilder::pool_size`](crate::RedisBackendBuilder::pool_size).
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = Some(size);
        self
    }

    /// Builds the backend. Nodes added by URL connect on first use, so a node that is down at
    /// start only counts as not answering.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] for `nodes` when there are fewer than 3, an even number (a
    /// majority of an even count tolerates no more failures than one node less) or more than
    /// 63, when a URL is invalid, or when nodes are given by URL outside a tokio runtime; for
    /// `node_timeout` when it is zero.
    pub fn build(self) -> Result<RedlockBackend, ConfigError> {
        let count = self.nodes.len();
        if count < 3 || count.is_multiple_of(2) || count > MAX_NODES {
            return Err(ConfigError::Invalid {
                setting: "nodes",
                reason: "Redlock needs an odd number of nodes, from 3 to 63",
            });
        }
        let by_url = self.nodes.iter().any(|node| matches!(node, Node::Url(_)));
        if by_url && tokio::runtime::Handle::try_current().is_err() {
            // The connection pools start their housekeeping on the current runtime.
            return Err(ConfigError::Invalid {
                setting: "nodes",
                reason: "nodes given by URL must be built inside a tokio runtime",
            });
        }
        if self.node_timeout.is_zero() {
            return Err(ConfigError::Invalid {
                setting: "node_timeout",
                reason: "must be above zero",
            });
        }
        let nodes = self
            .nodes
            .into_iter()
            .map(|node| match node {
                Node::Backend(backend) => Ok(backend),
                Node::Url(url) => {
                    let mut builder = RedisBackend::builder(url).command_timeout(self.node_timeout);
                    if let Some(size) = self.pool_size {
                        builder = builder.pool_size(size);
                    }
                    match self.quarantine {
                        Some(quarantine) => builder.quarantine(quarantine),
                        None => builder,
                    }
                    .build_lazy()
                    .map_err(|_| ConfigError::Invalid {
                        setting: "nodes",
                        reason: "invalid Redis URL",
                    })
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(RedlockBackend {
            inner: Arc::new(Inner {
                quorum: count / 2 + 1,
                skipped_until: nodes.iter().map(|_| Arc::default()).collect(),
                nodes,
                node_timeout: self.node_timeout,
                retry_jitter: self.retry_jitter,
                rounds: AtomicU64::new(0),
                won: AtomicU64::new(0),
                holds: Mutex::default(),
            }),
        })
    }
}

impl RedlockBackend {
    /// Starts configuring a backend over the nodes at `urls` (more can be added with
    /// [`node`](RedlockBackendBuilder::node) and [`backend`](RedlockBackendBuilder::backend)).
    pub fn builder<I>(urls: I) -> RedlockBackendBuilder
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        RedlockBackendBuilder {
            nodes: urls.into_iter().map(|url| Node::Url(url.into())).collect(),
            node_timeout: Duration::from_millis(100),
            retry_jitter: Duration::from_millis(50),
            pool_size: None,
            quarantine: None,
        }
    }

    /// The nodes, in the order they were added.
    pub fn nodes(&self) -> &[RedisBackend] {
        &self.inner.nodes
    }

    /// How many nodes make a majority.
    pub fn quorum(&self) -> usize {
        self.inner.quorum
    }

    /// How many acquire rounds (one call to every node) were made, won or not.
    pub fn acquire_rounds(&self) -> u64 {
        self.inner.rounds.load(Ordering::Relaxed)
    }

    /// How many acquire rounds won a majority.
    pub fn acquire_rounds_won(&self) -> u64 {
        self.inner.won.load(Ordering::Relaxed)
    }

    /// The nodes (by their index in [`nodes`](Self::nodes)) skipped right now because they
    /// could not be reached moments ago; each is tried again once a probe finds it answering,
    /// or after a second. A lock acquired meanwhile is held on the other nodes only.
    pub fn skipped_nodes(&self) -> Vec<usize> {
        let now = Instant::now();
        self.inner
            .skipped_until
            .iter()
            .enumerate()
            .filter(|(_, until)| lock(until).is_some_and(|until| now < until))
            .map(|(node, _)| node)
            .collect()
    }

    /// Runs `op` on every node at once, each bounded by the node timeout; results in node
    /// order. A node that could not be reached (no connection: refused, or none in time) is
    /// skipped for [`NODE_BACKOFF`] and counts as not answering at once, instead of costing
    /// every call its whole timeout.
    async fn on_every_node<'a, T, F, Fut>(&'a self, op: F) -> Vec<NodeResult<T>>
    where
        F: Fn(&'a RedisBackend) -> Fut,
        Fut: Future<Output = NodeResult<T>>,
    {
        let timeout = self.inner.call_timeout();
        let nodes = self.inner.nodes.iter().zip(&self.inner.skipped_until);
        join_all(
            nodes.map(|(node, skipped_until)| call_node(node, skipped_until, timeout, op(node))),
        )
        .await
    }

    /// Sends `grant` to every node at once and returns as soon as a majority granted it, or
    /// once every node answered. Nodes that have not answered by then are [`Stragglers`],
    /// shown as not answering.
    async fn acquire_round(&self, grant: Grant<'_>) -> (Vec<NodeResult<AcquireReply>>, Stragglers) {
        let owned = Arc::new(OwnedGrant::of(&grant));
        let timeout = self.inner.call_timeout();
        let mut pending: FuturesUnordered<StragglerCall> = (0..self.inner.nodes.len())
            .map(|index| {
                let (inner, owned) = (self.inner.clone(), owned.clone());
                let call: StragglerCall = Box::pin(async move {
                    let (node, skipped_until) = (&inner.nodes[index], &inner.skipped_until[index]);
                    let reply =
                        call_node(node, skipped_until, timeout, node.acquire(owned.grant())).await;
                    // A node in its restart quarantine votes "held" until it ends.
                    let reply = match reply {
                        Err(error) if error.quarantine_ends().is_some() => {
                            Ok(AcquireReply::Held { ttl: error.retry_after() })
                        }
                        reply => reply,
                    };
                    (index, reply)
                });
                call
            })
            .collect();
        let mut replies: Vec<Option<NodeResult<AcquireReply>>> =
            self.inner.nodes.iter().map(|_| None).collect();
        while !vote::acquire_decided(&replies, self.inner.quorum) {
            let Some((index, reply)) = pending.next().await else {
                break;
            };
            replies[index] = Some(reply);
        }
        let replies = replies
            .into_iter()
            .map(|reply| {
                reply.unwrap_or_else(|| {
                    Err(BackendError::new(
                        BackendErrorKind::Unavailable,
                        "no answer before the vote was decided",
                    ))
                })
            })
            .collect();
        let stragglers = Stragglers { pending, grant: owned, inner: self.inner.clone() };
        (replies, stragglers)
    }

    /// Gives back an attempt that lost its vote on every node that took it or may have.
    async fn give_back(&self, grant: Grant<'_>, replies: &[NodeResult<AcquireReply>]) {
        let took =
            self.inner.nodes.iter().zip(replies).filter(|(_, reply)| took_or_may_have(reply));
        let undo =
            join_all(took.map(|(node, _)| {
                tokio::time::timeout(self.inner.node_timeout, node.abandon(grant))
            }))
            .await;
        let failed = undo.iter().filter(|result| !matches!(result, Ok(Ok(_)))).count();
        if failed > 0 {
            // Those nodes free it when the attempt's lease runs out.
            tracing::debug!(key = %grant.key, failed, "could not give a lost attempt back on every node");
        }
    }

    /// A random delay under the retry jitter.
    fn jitter(&self) -> Duration {
        // The first 48 bits of a v4 UUID are random (its version and variant bits come later).
        let random = uuid::Uuid::new_v4().as_u128() >> 80;
        let fraction = random as f64 / (1u64 << 48) as f64;
        self.inner.retry_jitter.mul_f64(fraction)
    }
}

/// Refuses what a set of independent masters cannot offer.
fn refuse(kind: LockKind, fencing: bool, key: &LockKey) -> Result<(), BackendError> {
    let feature = match (kind, fencing) {
        (LockKind::Fair, _) => "fair locks",
        (LockKind::Read | LockKind::Write, _) => "read-write locks",
        (LockKind::Semaphore, _) => "semaphores",
        (_, true) => "fencing tokens",
        _ => return Ok(()),
    };
    tracing::warn!(key = %key, feature, "Redlock refused a lock it cannot offer");
    Err(BackendError::from_kind(BackendErrorKind::Unsupported { feature }).with_key(key.as_str()))
}

/// The node calls of an acquire that were still on their way when its vote was decided.
struct Stragglers {
    pending: FuturesUnordered<StragglerCall>,
    grant: Arc<OwnedGrant>,
    inner: Arc<Inner>,
}

/// One node's acquire call, with the node's index.
type StragglerCall = BoxFuture<'static, (usize, NodeResult<AcquireReply>)>;

impl Stragglers {
    /// Lets the late calls finish in the background. With `undo` (the acquire failed), what
    /// each took, or may have, is given back.
    fn settle(self, undo: bool) {
        let Self { mut pending, grant, inner } = self;
        if pending.is_empty() {
            return;
        }
        tokio::spawn(async move {
            while let Some((index, reply)) = pending.next().await {
                if !took_or_may_have(&reply) {
                    continue;
                }
                if undo {
                    let node = &inner.nodes[index];
                    let given_back =
                        tokio::time::timeout(inner.node_timeout, node.abandon(grant.grant())).await;
                    if !matches!(given_back, Ok(Ok(_))) {
                        tracing::debug!(key = %grant.grant().key, node = index, "could not give a late grant back; its lease frees it");
                    }
                } else {
                    inner.straggled(&grant, index).await;
                }
            }
        });
    }
}

/// Whether a node's reply to an acquire means it holds the attempt's grant, or may.
fn took_or_may_have(reply: &NodeResult<AcquireReply>) -> bool {
    match reply {
        Ok(reply) => matches!(reply, AcquireReply::Acquired { .. }),
        Err(error) => error.outcome_unknown(),
    }
}

/// One call to one node, bounded by `timeout`: a node being skipped answers "unavailable" at
/// once (the call is never started), and a node that could not be reached starts being
/// skipped.
async fn call_node<T>(
    node: &RedisBackend,
    skipped_until: &Arc<Mutex<Option<Instant>>>,
    timeout: Duration,
    call: impl Future<Output = NodeResult<T>>,
) -> NodeResult<T> {
    if lock(skipped_until).is_some_and(|until| Instant::now() < until) {
        return Err(BackendError::new(
            BackendErrorKind::Unavailable,
            "skipped: the node could not be reached moments ago",
        ));
    }
    let result = tokio::time::timeout(timeout, call)
        .await
        .unwrap_or_else(|_| Err(BackendError::from_kind(BackendErrorKind::Timeout)));
    if let Err(error) = &result
        && *error.kind() == BackendErrorKind::Unavailable
    {
        skip(node, skipped_until, error);
    }
    result
}

impl Inner {
    /// Records a grant won with `grant`, whose lease ends at `lease_ends`; `unanswered` are the
    /// nodes that never answered its acquire. Drops the records of grants whose lease ended.
    fn won(
        &self,
        grant: &Arc<OwnedGrant>,
        lease_ends: Instant,
        unanswered: impl Iterator<Item = usize>,
    ) {
        let now = Instant::now();
        let mut holds = lock(&self.holds);
        holds.retain(|_, held| held.lease_ends > now);
        holds.insert(
            (grant.grant().key.clone(), grant.grant().attempt.to_owned()),
            Held { lease_ends, grant: grant.clone(), unanswered: unanswered.collect() },
        );
    }

    /// After the vote on `grant` was won, `node` answered that it took the lock, or never
    /// answered (it may take it still). When the grant was released meanwhile (or its
    /// lease ended), the attempt is undone there at once: the release may have come first.
    /// Otherwise the node is owed the grant's undo after its release (see [`Held`]): a late
    /// grant there may come after the release.
    async fn straggled(self: &Arc<Self>, grant: &Arc<OwnedGrant>, node: usize) {
        let hold = (grant.grant().key.clone(), grant.grant().attempt.to_owned());
        if let Some(held) = lock(&self.holds).get_mut(&hold) {
            // Granted late, its record may come after the grant's release reached that node:
            // the node gets the undo after the release either way.
            held.unanswered.push(node);
            return;
        }
        let until = Instant::now() + grant.grant().lease.duration();
        self.until_answered(node, until, |node| node.abandon(grant.grant())).await;
    }

    /// Makes a release that some nodes answered at once true on the others too (see
    /// [`Held`]): in the background, so the caller does not wait for a stalled node.
    fn released(self: &Arc<Self>, release: &Release<'_>, replies: &[NodeResult<ReleaseReply>]) {
        let hold = (release.key.clone(), release.grant.to_owned());
        let Some(held) = lock(&self.holds).remove(&hold) else {
            return;
        };
        if Instant::now() >= held.lease_ends {
            return;
        }
        for (node, reply) in replies.iter().enumerate() {
            // Not answered: it may not have arrived (an error the node answered, such as
            // foreign data at the key, would answer the same again).
            let silent = reply
                .as_ref()
                .is_err_and(|error| error.is_unavailable() || error.outcome_unknown());
            if !silent && !held.unanswered.contains(&node) {
                continue;
            }
            let (inner, grant, until) = (self.clone(), held.grant.clone(), held.lease_ends);
            tokio::spawn(async move {
                let undone =
                    inner.until_answered(node, until, |node| node.abandon(grant.grant())).await;
                tracing::debug!(key = %grant.grant().key, node, undone = ?undone, "released a grant on a node that missed the release or its acquire");
            });
        }
    }

    /// Moves the lease end of each grant renewed on a majority (sent at `sent`).
    fn renewed(&self, renewals: &[Renew<'_>], tally: &[RenewReply], sent: Instant) {
        let mut holds = lock(&self.holds);
        if holds.is_empty() {
            return;
        }
        for (renew, reply) in renewals.iter().zip(tally) {
            let Renew::Grant { key, grant, lease, .. } = renew else {
                continue;
            };
            if *reply != RenewReply::Renewed {
                continue;
            }
            if let Some(held) = holds.get_mut(&((*key).clone(), (*grant).to_owned())) {
                held.lease_ends = held.lease_ends.max(sent + lease.duration());
            }
        }
    }

    /// Calls `op` on `node` until it answers (each try within a node call's bound, the pause
    /// between tries growing to [`RETRY_PAUSE`]), or until `until`: the answer, or `None` when
    /// it never came.
    async fn until_answered<'a, T, Fut>(
        &'a self,
        node: usize,
        until: Instant,
        op: impl Fn(&'a RedisBackend) -> Fut,
    ) -> Option<T>
    where
        Fut: Future<Output = NodeResult<T>>,
    {
        let (backend, skipped_until) = (&self.nodes[node], &self.skipped_until[node]);
        let mut pause = PROBE_EVERY;
        loop {
            if let Ok(answer) =
                call_node(backend, skipped_until, self.call_timeout(), op(backend)).await
            {
                return Some(answer);
            }
            if Instant::now() + pause >= until {
                return None;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(RETRY_PAUSE);
        }
    }

    /// The bound of one node call: the node's own budget ends first, so a call that found no
    /// connection says so (`Unavailable`) rather than timing out here.
    fn call_timeout(&self) -> Duration {
        self.node_timeout + Duration::from_millis(10)
    }
}

impl Store for RedlockBackend {
    type Listener = RedlockListener;

    async fn acquire(&self, grant: Grant<'_>) -> Result<AcquireReply, BackendError> {
        refuse(grant.kind, grant.fencing, grant.key)?;
        let quorum = self.inner.quorum;
        let started = Instant::now();
        self.inner.rounds.fetch_add(1, Ordering::Relaxed);
        let (replies, stragglers) = self.acquire_round(grant).await;
        let vote = vote::acquire(&replies, quorum);
        let elapsed = started.elapsed();
        let validity = grant
            .lease
            .duration()
            .checked_sub(elapsed + grant.lease.drift())
            .filter(|left| !left.is_zero());
        let ttl = match vote {
            AcquireVote::Won if validity.is_some() => {
                self.inner.won.fetch_add(1, Ordering::Relaxed);
                let unanswered = replies
                    .iter()
                    .enumerate()
                    .filter(|(_, reply)| reply.as_ref().is_err() && took_or_may_have(reply));
                self.inner.won(
                    &stragglers.grant,
                    started + grant.lease.duration(),
                    unanswered.map(|(node, _)| node),
                );
                stragglers.settle(false);
                return Ok(AcquireReply::Acquired { token: None });
            }
            AcquireVote::Won => {
                tracing::warn!(key = %grant.key, ?elapsed, "Redlock majority came too late for the lease; giving it back");
                Some(self.jitter())
            }
            AcquireVote::Lost { blocked: true, ttl } => ttl,
            AcquireVote::Lost { blocked: false, .. } => Some(self.jitter()),
            AcquireVote::NoQuorum { reachable } => {
                stragglers.settle(true);
                self.give_back(grant, &replies).await;
                let error =
                    vote::no_quorum(replies, reachable, quorum).with_key(grant.key.as_str());
                tracing::warn!(key = %grant.key, error = %format_args!("{error:#}"), "Redlock acquire without a quorum");
                return Err(error);
            }
        };
        stragglers.settle(true);
        self.give_back(grant, &replies).await;
        // A node that recorded the attempt as given up on refuses it from now on.
        Ok(AcquireReply::Spent { ttl })
    }

    async fn extend(&self, extend: Extend<'_>) -> Result<ExtendReply, BackendError> {
        refuse(extend.kind, extend.fencing, extend.key)?;
        let replies = self.on_every_node(|node| node.extend(extend)).await;
        let reachable = replies.iter().filter(|reply| reply.is_ok()).count();
        let extended = replies
            .iter()
            .filter(|reply| matches!(reply, Ok(ExtendReply::Extended { .. })))
            .count();
        if extended >= self.inner.quorum {
            let ends = Instant::now() + extend.lease.duration();
            let hold = (extend.key.clone(), extend.grant.to_owned());
            if let Some(held) = lock(&self.inner.holds).get_mut(&hold) {
                held.lease_ends = held.lease_ends.max(ends);
            }
            return Ok(ExtendReply::Extended { token: None });
        }
        if reachable < self.inner.quorum {
            return Err(vote::no_quorum(replies, reachable, self.inner.quorum)
                .with_key(extend.key.as_str()));
        }
        Ok(ExtendReply::NotHeld)
    }

    async fn release(&self, release: Release<'_>) -> Result<ReleaseReply, BackendError> {
        refuse(release.kind, false, release.key)?;
        // No hand-off: it could not be atomic across nodes.
        let plain = Release { handoff: None, ..release };
        let replies = self.on_every_node(|node| node.release(plain)).await;
        self.inner.released(&plain, &replies);
        match vote::release(&replies, self.inner.quorum) {
            Ok(reply) => Ok(reply),
            Err(reachable) => {
                let error = vote::no_quorum(replies, reachable, self.inner.quorum)
                    .with_key(release.key.as_str());
                tracing::warn!(key = %release.key, error = %format_args!("{error:#}"), "Redlock release without a quorum");
                Err(error)
            }
        }
    }

    async fn renew(&self, renewals: &[Renew<'_>]) -> Result<Vec<RenewReply>, BackendError> {
        if renewals.is_empty() {
            return Ok(Vec::new());
        }
        let sent = Instant::now();
        let replies = self.on_every_node(|node| node.renew(renewals)).await;
        match vote::renew(&replies, renewals.len(), self.inner.quorum) {
            Ok(tally) => {
                self.inner.renewed(renewals, &tally, sent);
                Ok(tally)
            }
            Err(reachable) => Err(vote::no_quorum(replies, reachable, self.inner.quorum)),
        }
    }

    async fn abandon(&self, grant: Grant<'_>) -> Result<bool, BackendError> {
        refuse(grant.kind, grant.fencing, grant.key)?;
        let replies = self.on_every_node(|node| node.abandon(grant)).await;
        let undone = replies.iter().any(|reply| matches!(reply, Ok(true)));
        let reachable = replies.iter().filter(|reply| reply.is_ok()).count();
        if reachable < self.inner.quorum && !undone {
            return Err(
                vote::no_quorum(replies, reachable, self.inner.quorum).with_key(grant.key.as_str())
            );
        }
        Ok(undone)
    }

    async fn leave(
        &self,
        key: &LockKey,
        _holder: &str,
        kind: LockKind,
    ) -> Result<(), BackendError> {
        // Only queueing kinds have anything to leave, and those are refused.
        refuse(kind, false, key)
    }

    async fn listen(
        &self,
        key: &LockKey,
        only_for: Option<&str>,
    ) -> Result<RedlockListener, BackendError> {
        // A waiter wakes once a majority of the nodes published a release, so it listens as
        // soon as a majority confirmed its subscriptions: a node that is down (it subscribes
        // when it is back) or slow does not hold up every waiter for its timeout.
        let (listeners, confirmations): (Vec<_>, FuturesUnordered<_>) =
            self.inner.nodes.iter().map(|node| node.subscribe(key, only_for)).unzip();
        let mut confirmations = confirmations;
        let mut confirmed = 0;
        while confirmed < self.inner.quorum {
            match confirmations.next().await {
                Some(true) => confirmed += 1,
                Some(false) => {}
                None => break,
            }
        }
        Ok(RedlockListener::new(listeners, self.inner.quorum))
    }

    async fn shutdown(&self) {
        // Shared by several clients (clones of it): the nodes keep serving the others.
        if Arc::strong_count(&self.inner) > 1 {
            return;
        }
        join_all(self.inner.nodes.iter().map(Store::shutdown)).await;
    }

    /// Asks every node; reports the holders a majority of the nodes name: a grant left on a
    /// minority (an attempt that lost its vote) holds nothing. A read-write lock or a
    /// semaphore is never taken here: it is free.
    async fn inspect(&self, key: &LockKey, kind: LockKind) -> Result<LockInfo, BackendError> {
        self.snapshot_on_every_node(key, kind, false).await
    }

    /// Clears every node; reports what any node held. Fails without a majority of answers
    /// (the nodes that answered are cleared all the same; repeating the call is safe).
    async fn force_unlock(&self, key: &LockKey, kind: LockKind) -> Result<LockInfo, BackendError> {
        self.snapshot_on_every_node(key, kind, true).await
    }
}

impl RedlockBackend {
    /// Inspects (or with `clear`, force-unlocks) `key` on every node and joins the answers.
    async fn snapshot_on_every_node(
        &self,
        key: &LockKey,
        kind: LockKind,
        clear: bool,
    ) -> Result<LockInfo, BackendError> {
        // The kinds Redlock refuses are never held here.
        if !matches!(kind, LockKind::Exclusive | LockKind::Fair) {
            return Ok(LockInfo::free());
        }
        let replies = self
            .on_every_node(|node| async move {
                if clear {
                    node.force_unlock(key, kind).await
                } else {
                    node.inspect(key, kind).await
                }
            })
            .await;
        // Foreign data on any node is not a lock: say so rather than vote it away.
        if let Some(Err(error)) =
            replies.iter().find(|r| r.as_ref().is_err_and(BackendError::is_wrong_type))
        {
            let found = match error.kind() {
                BackendErrorKind::WrongType { found } => found.clone(),
                _ => String::new(),
            };
            return Err(BackendError::from_kind(BackendErrorKind::WrongType { found })
                .with_key(key.as_str()));
        }
        let at_least = if clear { 1 } else { self.inner.quorum };
        inspect::join(&replies, at_least, self.inner.quorum).map_err(|reachable| {
            vote::no_quorum(replies, reachable, self.inner.quorum).with_key(key.as_str())
        })
    }
}
