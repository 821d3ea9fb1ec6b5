//! F19 (K6): a lock granted on a master whose replica never got it, then a failover to that
//! replica. The replica is killed (a paused one would still read the grant from its socket once
//! resumed), the master grants, the master is killed, the replica comes back empty and is
//! promoted (`REPLICAOF NO ONE`), and the proxy the clients go through is switched to it.
//!
//! Without `min_replicas` the lock is granted a second time on the promoted replica: that is the
//! negative control, and the checker must see the double grant or it is blind. With
//! `min_replicas(1, 100 ms)` the first grant is undone on the master and fails cleanly, so no
//! one holds twice. Each run does both, the two servers swapping roles every failover. The
//! overhead of `WAIT` is then measured on the healthy pair.

use std::time::{Duration, Instant};

use tower_lock::{Lease, LockError, RedisBackend, error::BackendErrorKind};

use super::{Bed, Topology, eventually};
use crate::{
    checker, clock,
    history::{History, Outcome, Section},
    proxy::Proxy,
    run::{self, Node},
};

/// How long `WAIT` waits for the replica.
const ACK_TIMEOUT: Duration = Duration::from_millis(100);
/// How long `WAIT` waits on the healthy pair, where it must succeed even on a loaded machine
/// (its latency there is the round trip, not the timeout).
const HEALTHY_ACK_TIMEOUT: Duration = Duration::from_secs(2);
/// The first holder's lease: far longer than a run, so only the failover can end it.
const LEASE: Duration = Duration::from_secs(30);
/// How long a replica gets to sync.
const SYNC_TIMEOUT: Duration = Duration::from_secs(10);

/// What the acknowledged first grants did.
#[derive(Default)]
struct Failovers {
    /// First grants that failed with `ReplicasNotAcknowledged` and left no key on the master.
    clean_failures: usize,
    /// Other outcomes of an acknowledged first grant.
    unclean: Vec<String>,
}

/// The Redis key of `key` with `prefix`.
fn redis_key(prefix: &str, key: &str) -> String {
    format!("{prefix}{{{key}}}")
}

/// Makes `replica` a synced replica of `master`.
async fn sync(replica: &Node, master: &Node) {
    replica.replicate(master);
    assert!(
        eventually(SYNC_TIMEOUT, || replica.replica_in_sync()).await,
        "the replica did not sync within {SYNC_TIMEOUT:?}"
    );
}

/// One failover from `master` to `replica` (a synced replica of it) with the first grant
/// `acknowledged` or not. Leaves `replica` the only server running, as master.
async fn failover(
    bed: &Bed,
    proxy: &Proxy,
    history: &History,
    (master, replica): (&Node, &Node),
    key: &str,
    acknowledged: bool,
    failovers: &mut Failovers,
) {
    replica.kill();
    proxy.retarget(master.url());
    let builder = RedisBackend::builder(proxy.url()).command_timeout(Duration::from_secs(1));
    let first = bed
        .client_of(if acknowledged {
            builder.min_replicas(1, ACK_TIMEOUT)
        } else {
            builder
        })
        .await;
    let mut first_section = history.begin(key, "");
    let granted = first
        .lock(key)
        .lease(Lease::fixed(LEASE))
        .try_acquire()
        .await;
    match &granted {
        Ok(guard) => {
            first_section.t_ok = Some(clock::now_ns());
            first_section.holder = guard.holder().id().to_owned();
        }
        Err(error) => {
            first_section.result = Outcome::Fail;
            let left = master
                .cmd(&["EXISTS", &redis_key(&bed.prefix, key)])
                .as_int();
            let clean = matches!(error, LockError::Backend(e) if matches!(
                e.kind(),
                BackendErrorKind::ReplicasNotAcknowledged { wanted: 1, acknowledged: 0 }
            ));
            if clean && left == 0 && first.active_keys() == 0 {
                failovers.clean_failures += 1;
            } else {
                failovers
                    .unclean
                    .push(format!("{key}: {error:?}, key left: {left}"));
            }
        }
    }

    master.kill();
    replica.restart();
    let promoted = replica.cmd(&["REPLICAOF", "NO", "ONE"]);
    assert_eq!(promoted.as_str().as_deref(), Some("OK"), "{promoted:?}");
    proxy.retarget(replica.url());

    let second = bed
        .client_of(RedisBackend::builder(proxy.url()).command_timeout(Duration::from_secs(1)))
        .await;
    let mut second_section = history.begin(key, "");
    let guard = second
        .lock(key)
        .try_acquire()
        .await
        .unwrap_or_else(|e| panic!("{key}: the promoted replica does not grant: {e:?}"));
    second_section.t_ok = Some(clock::now_ns());
    second_section.holder = guard.holder().id().to_owned();
    second_section.t_rel_inv = Some(clock::now_ns());
    guard
        .release()
        .await
        .expect("release on the promoted replica");
    second_section.t_rel_ok = Some(clock::now_ns());
    second_section.result = Outcome::Ok;

    if let Ok(guard) = granted {
        // Still believed held until now: the fixed lease has 30 s left.
        first_section.t_rel_inv = Some(clock::now_ns());
        let _ = guard.release().await;
        first_section.t_rel_ok = Some(clock::now_ns());
        first_section.result = Outcome::Ok;
    }
    history.record(&first_section);
    history.record(&second_section);
}

/// Acquire latencies of `samples` uncontended acquisitions on `master`, alternating a client
/// without and one with `min_replicas`: (without, with).
async fn wait_overhead(bed: &Bed, master: &Node, samples: usize) -> (Vec<Duration>, Vec<Duration>) {
    let plain = bed.client_of(RedisBackend::builder(master.url())).await;
    let acknowledged = bed
        .client_of(RedisBackend::builder(master.url()).min_replicas(1, HEALTHY_ACK_TIMEOUT))
        .await;
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for sample in 0..samples {
        for (client, latencies) in [(&plain, &mut without), (&acknowledged, &mut with)] {
            let started = Instant::now();
            let guard = client
                .lock(format!("healthy{sample}"))
                .try_acquire()
                .await
                .expect("acquire on a healthy pair");
            latencies.push(started.elapsed());
            guard.release().await.expect("release");
        }
    }
    (without, with)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f19_failover_double_grants_with_and_without_wait() {
    let mut bed = Bed::new("F19", Topology::Single).await;
    let runs = run::count(10, 100);
    let history = bed.scenario.history();
    let (mut master, mut replica) = (bed.redis.clone(), bed.scenario.redis("replica"));
    let proxy = Proxy::start(master.url()).await;
    let mut failovers = Failovers::default();
    let started = Instant::now();
    for run in 0..runs {
        for acknowledged in [false, true] {
            sync(&replica, &master).await;
            let key = format!("{}{run}", if acknowledged { "wait" } else { "nowait" });
            failover(
                &bed,
                &proxy,
                &history,
                (&master, &replica),
                &key,
                acknowledged,
                &mut failovers,
            )
            .await;
            // The promoted replica is the master now; the dead master comes back empty.
            std::mem::swap(&mut master, &mut replica);
            replica.restart();
        }
    }
    let failover_secs = started.elapsed().as_secs_f64();

    sync(&replica, &master).await;
    let (without, with) = wait_overhead(&bed, &master, run::count(200, 2000)).await;

    let sections = History::read(&bed.scenario.history_path());
    let double_grants = |prefix: &str| {
        let variant: Vec<Section> = sections
            .iter()
            .filter(|s| s.key.starts_with(prefix))
            .cloned()
            .collect();
        checker::sweep(&variant)
    };
    let (without_wait, with_wait) = (double_grants("nowait"), double_grants("wait"));
    let leaks = checker::server_leaks(&master, &bed.prefix);
    let (p50_without, p50_with) = (
        run::quantile_ms(&without, 0.5),
        run::quantile_ms(&with, 0.5),
    );
    let s = &mut bed.scenario;
    s.figure("runs", runs);
    s.figure(
        "double_grants_without_wait",
        format!("{}/{runs}", without_wait.violations),
    );
    s.figure(
        "double_grants_with_wait",
        format!("{}/{runs}", with_wait.violations),
    );
    s.figure(
        "clean_failures_with_wait",
        format!("{}/{runs}", failovers.clean_failures),
    );
    s.figure("acquire_p50_ms", format!("{p50_without:.2}"));
    s.figure("acquire_wait_p50_ms", format!("{p50_with:.2}"));
    s.figure(
        "wait_overhead_p50_ms",
        format!("{:.2}", p50_with - p50_without),
    );
    s.figure("leaked_keys", leaks.count());
    s.figure("failover_secs", format!("{failover_secs:.1}"));
    s.report();

    assert!(
        without_wait.violations > 0,
        "checker blind: no double grant without WAIT"
    );
    assert_eq!(with_wait.violations, 0, "{:?}", with_wait.examples);
    assert_eq!(with_wait.token_errors, 0, "{:?}", with_wait.examples);
    assert!(failovers.unclean.is_empty(), "{:?}", failovers.unclean);
    assert_eq!(failovers.clean_failures, runs);
    assert_eq!(leaks.count(), 0, "left in Redis: {leaks:?}");
}
