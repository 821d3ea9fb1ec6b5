//! F23: on a 3 + 3 Redis Cluster, a lock that is held and waited on has its slot migrated to
//! another master (`SETSLOT IMPORTING/MIGRATING`, `MIGRATE`, `SETSLOT NODE`), and then that
//! master is killed so its replica is promoted. Another lock, on a master never touched, is held
//! and waited on throughout. Neither holder may be told it lost its lock (both locks were
//! replicated, and the lease outlasts the failover), and both waiters must get their lock once
//! it is released. Recovery is the time from the kill until the failed shard grants a lock
//! again.

use std::time::Duration;

use tokio::time::Instant;
use tower_lock::{LockClient, LockGuard, RedisBackend};

use super::eventually;
use crate::{
    checker, clock,
    history::{History, Outcome, Section},
    run::{self, Scenario},
    support::{
        RedisServer,
        cluster::{NODE_TIMEOUT_MS, RedisCluster},
    },
};

const PREFIX: &str = "chaos-f23:";
/// Longer than any failover here, so only a wrong answer could end it.
const LEASE: Duration = Duration::from_secs(10);
/// The recovery asserted: the fixture forces the takeover when the election takes 4 s, and a
/// loaded machine may need that; the figure shows it against the catalogue's node timeout + 2 s (tests/chaos/README.md).
const RECOVERY_LIMIT: Duration = Duration::from_secs(6);
/// How long a waiter may take to get a released lock (its own retry timer is the lease).
const PROMPT: Duration = Duration::from_secs(1);

async fn client(cluster: &RedisCluster) -> LockClient<RedisBackend> {
    let backend =
        RedisBackend::cluster(cluster.urls()).connect().await.expect("connect to the cluster");
    LockClient::builder(backend)
        .prefix(PREFIX)
        .wait(Duration::from_secs(30))
        .build()
        .expect("client configuration")
}

/// The Redis key of lock `key`.
fn lock_name(key: &str) -> String {
    format!("{PREFIX}{{{key}}}")
}

/// A key `<stem><n>` whose lock lives on master `node`.
fn key_on(cluster: &RedisCluster, stem: &str, node: usize) -> String {
    (0..)
        .map(|i| format!("{stem}{i}"))
        .find(|key| cluster.owner_of(&lock_name(key)) == node)
        .expect("some key hashes to every master")
}

/// Whether every replica of `master` has applied all it was sent so far.
fn replicas_caught_up(master: &RedisServer) -> bool {
    let Ok(info) = master.info("replication") else {
        return false;
    };
    let field =
        |name: &str| info.lines().find_map(|line| line.strip_prefix(name)).map(str::to_owned);
    let Some(offset) = field("master_repl_offset:").and_then(|o| o.trim().parse::<u64>().ok())
    else {
        return false;
    };
    field("slave0:")
        .and_then(|slave| {
            slave
                .split(',')
                .find_map(|part| part.strip_prefix("offset="))
                .and_then(|o| o.parse::<u64>().ok())
        })
        .is_some_and(|acknowledged| acknowledged >= offset)
}

/// A waiter for `key`: the guard it gets and its section so far.
fn spawn_waiter(
    client: &LockClient<RedisBackend>,
    history: &History,
    key: &str,
) -> tokio::task::JoinHandle<(Option<LockGuard<RedisBackend>>, Section)> {
    let (client, key) = (client.clone(), key.to_owned());
    let mut section = history.begin(&key, "");
    tokio::spawn(async move {
        match client.lock(&key).acquire().await {
            Ok(guard) => {
                section.t_ok = Some(clock::now_ns());
                section.holder = guard.holder().id().to_owned();
                (Some(guard), section)
            }
            Err(_) => {
                section.result = Outcome::Fail;
                (None, section)
            }
        }
    })
}

/// What one run showed.
#[derive(Default)]
struct Outcomes {
    spurious_lost: usize,
    stranded: usize,
    recovery: Vec<Duration>,
    handoffs: Vec<Duration>,
}

async fn migrate_then_fail(run: usize, history: &History, outcomes: &mut Outcomes) {
    let cluster = tokio::task::block_in_place(RedisCluster::start);
    let (a, b) = (client(&cluster).await, client(&cluster).await);
    let moved = key_on(&cluster, "moved", 0);
    let untouched = key_on(&cluster, "untouched", 2);
    let mut held = Vec::new();
    for key in [&moved, &untouched] {
        held.push(super::in_process::hold(&a, key, LEASE, history, run).await);
    }
    let waiters = [spawn_waiter(&b, history, &moved), spawn_waiter(&b, history, &untouched)];
    assert!(
        eventually(Duration::from_secs(5), || b.waiters() == 2).await,
        "run {run}: the waiters did not queue"
    );

    // The held and waited slot moves from master 0 to master 1, which then dies.
    tokio::task::block_in_place(|| cluster.migrate_slot(cluster.slot_of(&lock_name(&moved)), 1));
    assert!(
        eventually(Duration::from_secs(5), || replicas_caught_up(cluster.node(1))).await,
        "run {run}: master 1's replica did not catch up"
    );
    let probe = key_on(&cluster, "probe", 1);
    let doomed = ("127.0.0.1", cluster.node(1).port());
    let failover = tokio::task::spawn_blocking(move || {
        let mut cluster = cluster;
        let promoted = cluster.kill_master(1);
        (cluster, promoted)
    });
    // The kill happens on the failover's thread: from when the master stops accepting
    // connections until the failed shard grants a lock again (polling, with deadlines).
    assert!(
        eventually(Duration::from_secs(5), || std::net::TcpStream::connect(doomed).is_err()).await,
        "run {run}: master 1 still accepts connections"
    );
    let killed = Instant::now();
    let recovered = loop {
        if let Ok(guard) = a.lock(&probe).try_acquire().await {
            let at = killed.elapsed();
            guard.release().await.expect("release the probe");
            break at;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "run {run}: the failed shard never granted again"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    outcomes.recovery.push(recovered);
    let (_cluster, _promoted) = failover.await.expect("failover");

    for ((guard, mut section), waiter) in held.into_iter().zip(waiters) {
        if guard.is_lost() {
            outcomes.spurious_lost += 1;
            section.t_lost = Some(clock::now_ns());
        }
        section.t_rel_inv = Some(clock::now_ns());
        let released = guard.release().await;
        section.t_rel_ok = Some(clock::now_ns());
        if released.is_err() {
            outcomes.spurious_lost += 1;
        }
        section.result = Outcome::Ok;
        history.record(&section);
        let released_at = Instant::now();
        match tokio::time::timeout(Duration::from_secs(5), waiter).await {
            Ok(joined) => {
                let (guard, mut section) = joined.expect("waiter task");
                if let Some(guard) = guard {
                    outcomes.handoffs.push(released_at.elapsed());
                    section.t_rel_inv = Some(clock::now_ns());
                    guard.release().await.expect("release after the failover");
                    section.t_rel_ok = Some(clock::now_ns());
                    section.result = Outcome::Ok;
                } else {
                    outcomes.stranded += 1;
                }
                history.record(&section);
            }
            Err(_) => outcomes.stranded += 1,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f23_cluster_slot_migrated_then_master_killed() {
    let mut scenario = Scenario::new("F23");
    let history = scenario.history();
    let runs = run::count(1, 5);
    let mut outcomes = Outcomes::default();
    for run in 0..runs {
        migrate_then_fail(run, &history, &mut outcomes).await;
    }
    let sweep = checker::sweep(&History::read(&scenario.history_path()));
    // The catalogue's bound, for the figure.
    let bound = Duration::from_millis(NODE_TIMEOUT_MS) + Duration::from_secs(2);
    let slowest_recovery = outcomes.recovery.iter().max().copied().unwrap_or_default();
    let slowest_handoff = outcomes.handoffs.iter().max().copied().unwrap_or_default();
    scenario.figure("runs", runs);
    scenario.figure("spurious_lost", format!("{}/{}", outcomes.spurious_lost, 2 * runs));
    scenario.figure("stranded", format!("{}/{}", outcomes.stranded, 2 * runs));
    scenario.figure("violations", sweep.violations);
    scenario.figure(
        "recovery_max_ms",
        format!("{:.0}/{}", clock::ms(slowest_recovery), bound.as_millis()),
    );
    scenario.figure("handoff_max_ms", format!("{:.1}", clock::ms(slowest_handoff)));
    scenario.report();

    assert_eq!(outcomes.spurious_lost, 0, "a holder lost a replicated lock");
    assert_eq!(outcomes.stranded, 0, "a waiter never got its lock");
    assert_eq!(sweep.violations, 0, "{:?}", sweep.examples);
    assert!(slowest_handoff < PROMPT, "a waiter woke {slowest_handoff:?} after the release");
    assert!(slowest_recovery <= RECOVERY_LIMIT, "recovered after {slowest_recovery:?}");
}
