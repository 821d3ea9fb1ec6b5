//! The scenarios of the fault catalogue (`tests/chaos/README.md`), one module per fault, and the
//! test bed they share.
//!
//! A scenario runs on a [`Topology`]: a single node, or the independent nodes of a Redlock
//! backend. Sentinel and Cluster beds add a variant and a way to build their clients, and
//! scenarios that make sense on several take the topology as a parameter.

use std::time::Duration;

use tower_lock::{
    LockClient, LockError, LockGuard, RedisBackend, RedisBackendBuilder, RedlockBackend,
};

use crate::{
    checker::{self, Sweep},
    clock,
    history::{History, Outcome, Section},
    holder::{HolderProc, Setup},
    run::{Node, Scenario},
    witness::Witness,
};

mod f01_contention;
mod f02_reentrancy;
mod f03_expired_release;
#[cfg(feature = "metrics")]
mod f04_watchdog_at_scale;
mod f05_wake_up;
mod f06_dropped_waiters;
mod f07_fair_dead_waiter;
mod f08_killed_holder;
mod f09_paused_holder;
mod f10_stalled_redis;
mod f11_redis_restart;
mod f13_pubsub_kill;
mod f14_connection_kill;
mod f15_dropped_replies;
mod f16_slow_replies;
mod f17_blackhole;
mod f18_foreign_data;
mod f19_replica_acknowledgement;
#[cfg(feature = "sentinel")]
mod f20_sentinel_failover;
#[cfg(feature = "cluster")]
mod f22_cluster_contention;
#[cfg(feature = "cluster")]
mod f23_cluster_migration_failover;
mod f24_redlock_node_loss;
mod f25_redlock_paused_nodes;
mod f29_flood;
mod f30_semaphore_faults;
mod f31_killed_set_holder;
mod in_process;

/// Where the locks live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Topology {
    /// One `redis-server`.
    Single,
    /// Five independent `redis-server`s, the nodes of a Redlock backend.
    Redlock,
}

/// How many nodes a [`Topology::Redlock`] bed runs.
pub(crate) const REDLOCK_NODES: usize = 5;

/// A scenario with its lock store, its never-faulted witness and its key prefix.
#[derive(Debug)]
pub(crate) struct Bed {
    /// The lock store: the single node, or the first of `nodes`.
    pub(crate) redis: Node,
    /// Every node of the lock store.
    pub(crate) nodes: Vec<Node>,
    pub(crate) witness: Witness,
    witness_url: String,
    pub(crate) prefix: String,
    /// Declared last: its nodes are the last handles on the servers, which stop before it
    /// gives up its turn on the machine.
    pub(crate) scenario: Scenario,
}

impl Bed {
    pub(crate) async fn new(name: &'static str, topology: Topology) -> Self {
        Self::on(Scenario::new(name), topology).await
    }

    /// A bed for a scenario that asserts a latency bound: it runs alone ([`Scenario::alone`]).
    pub(crate) async fn alone(name: &'static str, topology: Topology) -> Self {
        Self::on(Scenario::alone(name), topology).await
    }

    async fn on(mut scenario: Scenario, topology: Topology) -> Self {
        let name = scenario.name();
        let nodes = match topology {
            Topology::Single => vec![scenario.redis("redis")],
            Topology::Redlock => {
                let labels: [&'static str; REDLOCK_NODES] =
                    ["node0", "node1", "node2", "node3", "node4"];
                labels.map(|label| scenario.redis(label)).to_vec()
            }
        };
        let witness_node = scenario.redis("witness");
        let witness = Witness::connect(witness_node.url()).await;
        Self {
            prefix: format!("chaos-{}:", name.to_lowercase()),
            scenario,
            redis: nodes[0].clone(),
            nodes,
            witness_url: witness_node.url().to_owned(),
            witness,
        }
    }

    /// What a holder process of this bed needs, connecting to `url`.
    pub(crate) fn setup(&self, url: &str, current_thread: bool) -> Setup {
        Setup {
            scenario: self.scenario.name().to_owned(),
            url: url.to_owned(),
            witness: self.witness_url.clone(),
            prefix: self.prefix.clone(),
            history: self.scenario.history_path(),
            command_timeout_ms: 1000,
            waiter_timeout_ms: 5000,
            current_thread,
        }
    }

    /// Spawns a holder process on this bed's Redis.
    pub(crate) async fn holder_process(&self) -> HolderProc {
        HolderProc::spawn(&self.setup(self.redis.url(), false)).await
    }

    /// A client in this process, connecting to `url` (the bed's Redis, or a proxy to it).
    pub(crate) async fn client_via(
        &self,
        url: &str,
        command_timeout: Duration,
    ) -> LockClient<RedisBackend> {
        self.client_of(crate::support::redis_backend(url).command_timeout(command_timeout)).await
    }

    /// A client in this process on the backend `builder` describes, with the bed's prefix.
    pub(crate) async fn client_of(&self, builder: RedisBackendBuilder) -> LockClient<RedisBackend> {
        let backend = builder.connect().await.expect("connect");
        LockClient::builder(backend).prefix(&self.prefix).build().expect("client configuration")
    }

    /// A client in this process on the bed's Redis.
    pub(crate) async fn client(&self) -> LockClient<RedisBackend> {
        self.client_via(self.redis.url(), Duration::from_secs(1)).await
    }

    /// A Redlock client over every node of the bed, with its own connections (as a separate
    /// process would have), each call bounded by `node_timeout`.
    pub(crate) fn redlock_client(&self, node_timeout: Duration) -> LockClient<RedlockBackend> {
        let backend = crate::support::redlock_backend(self.nodes.iter().map(Node::url))
            .node_timeout(node_timeout)
            .retry_jitter(Duration::from_millis(20))
            .build()
            .expect("Redlock configuration");
        LockClient::builder(backend).prefix(&self.prefix).build().expect("client configuration")
    }

    /// The Redis key of the exclusive lock `key`.
    pub(crate) fn lock_key(&self, key: &str) -> String {
        format!("{}{{{key}}}", self.prefix)
    }
}

/// Brings two clients to their steady state before a baseline is taken: both pools grown by a
/// burst of 16 locks each, and one wait that the release ends (so `waiter`'s pub/sub connection
/// is open: the server counts its subscription before the release).
pub(crate) async fn warm_up(
    bed: &Bed,
    holder: &LockClient<RedisBackend>,
    waiter: &LockClient<RedisBackend>,
) {
    for client in [holder, waiter] {
        futures_util::future::join_all((0..16).map(|i| async move {
            let guard = client.lock(format!("burst{i}")).acquire().await;
            guard.expect("acquire").release().await.expect("release");
        }))
        .await;
    }
    let warm = holder.lock("warm").acquire().await.expect("acquire");
    let channel = format!("{}:released", bed.lock_key("warm"));
    let subscribed = || match bed.redis.cmd(&["PUBSUB", "NUMSUB", &channel]) {
        crate::support::RespValue::Array(Some(items)) if items.len() == 2 => items[1].as_int() == 1,
        other => panic!("unexpected PUBSUB NUMSUB reply: {other:?}"),
    };
    let (waited, ()) =
        tokio::join!(waiter.lock("warm").wait(Duration::from_secs(30)).acquire(), async {
            let listening = eventually(Duration::from_secs(30), subscribed).await;
            assert!(listening, "the waiter subscribed to the release");
            warm.release().await.expect("release");
        });
    let waited = waited.expect("the waiter gets the lock once released");
    waited.release().await.expect("release");
}

/// Polls `check` every 5 ms until it holds or `within` passes; returns whether it held.
pub(crate) async fn eventually(within: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if check() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// After a failover: `second` takes `key` on the promoted server, recorded as a section held
/// until its release; then the first holder, whose grant (`granted`, recorded in `first`) may
/// have been lost with the old master, releases. Both sections go into `history`, so a grant
/// the failover lost shows up as two overlapping holds. Returns when `second` held the lock
/// (`clock::now_ns`).
pub(crate) async fn grant_again_after_failover(
    history: &History,
    second: &LockClient<RedisBackend>,
    key: &str,
    (mut first, granted): (Section, Result<LockGuard<RedisBackend>, LockError>),
) -> u64 {
    let mut section = history.begin(key, "");
    let guard = second
        .lock(key)
        .try_acquire()
        .await
        .unwrap_or_else(|e| panic!("{key}: the promoted replica does not grant: {e:?}"));
    let t_ok = clock::now_ns();
    section.t_ok = Some(t_ok);
    section.holder = guard.holder().id().to_owned();
    section.t_rel_inv = Some(clock::now_ns());
    guard.release().await.expect("release on the promoted replica");
    section.t_rel_ok = Some(clock::now_ns());
    section.result = Outcome::Ok;

    if let Ok(guard) = granted {
        // Still believed held until now: the first holder's fixed lease has time left.
        first.t_rel_inv = Some(clock::now_ns());
        let _ = guard.release().await;
        first.t_rel_ok = Some(clock::now_ns());
        first.result = Outcome::Ok;
    }
    history.record(&first);
    history.record(&section);
    t_ok
}

/// The double grants of a failover scenario whose keys start with `nowait` (granted without
/// `min_replicas`) and `wait` (with it), from its history, printed as figures beside the runs
/// and the acknowledged grants that failed cleanly: (without, with).
pub(crate) fn double_grant_figures(
    scenario: &mut Scenario,
    runs: usize,
    clean_failures: usize,
) -> (Sweep, Sweep) {
    let sections = History::read(&scenario.history_path());
    let double_grants = |prefix: &str| {
        let variant: Vec<Section> =
            sections.iter().filter(|s| s.key.starts_with(prefix)).cloned().collect();
        checker::sweep(&variant)
    };
    let (without_wait, with_wait) = (double_grants("nowait"), double_grants("wait"));
    scenario.figure("runs", runs);
    scenario.figure("double_grants_without_wait", format!("{}/{runs}", without_wait.violations));
    scenario.figure("double_grants_with_wait", format!("{}/{runs}", with_wait.violations));
    scenario.figure("clean_failures_with_wait", format!("{clean_failures}/{runs}"));
    (without_wait, with_wait)
}

/// How late this runtime wakes a 5 ms timer, at worst, while it runs: what a loaded machine
/// adds to any wake-up the tests time, so that a bound can allow for it instead of counting
/// on an idle machine.
pub(crate) struct StallMeter {
    worst_us: std::sync::Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl StallMeter {
    pub(crate) fn start() -> Self {
        let worst_us = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let task = tokio::spawn({
            let worst_us = worst_us.clone();
            async move {
                const TICK: Duration = Duration::from_millis(5);
                loop {
                    let asked = tokio::time::Instant::now();
                    tokio::time::sleep(TICK).await;
                    let late = asked.elapsed().saturating_sub(TICK);
                    let late_us = u64::try_from(late.as_micros()).unwrap_or(u64::MAX);
                    worst_us.fetch_max(late_us, std::sync::atomic::Ordering::Relaxed);
                }
            }
        });
        Self { worst_us, task }
    }

    /// The worst lateness seen so far.
    pub(crate) fn worst(&self) -> Duration {
        Duration::from_micros(self.worst_us.load(std::sync::atomic::Ordering::Relaxed))
    }
}

impl Drop for StallMeter {
    fn drop(&mut self) {
        self.task.abort();
    }
}
