//! F17: the network to Redis swallows everything (a blackhole), first while a lock is held,
//! then while one is being acquired. The holder must hear `lost()` at its local deadline, not at
//! a TCP timeout, and the acquire must give up within its wait plus the command timeout. Once
//! the network heals, the client works at once, without reusing a connection that went silent.

use std::time::Duration;

use tower_lock::{Lease, LockError};

use super::{Bed, Topology};
use crate::{
    checker,
    proxy::{Mode, Proxy},
    run,
};

const LEASE: Duration = Duration::from_millis(500);
const COMMAND_TIMEOUT: Duration = Duration::from_millis(300);
const WAIT: Duration = Duration::from_millis(400);
/// Scheduling slack on this shared 2-core machine.
const TOLERANCE: Duration = Duration::from_millis(100);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f17_blackhole_bounded_by_deadline_and_wait() {
    let mut bed = Bed::new("F17", Topology::Single).await;
    let runs = run::count(3, 100);
    let proxy = Proxy::start(bed.redis.url()).await;
    let client = bed.client_via(&proxy.url(), COMMAND_TIMEOUT).await;
    let mut rng = bed.scenario.rng();
    let (mut lost_after, mut latencies, mut kinds) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..runs {
        // While held: the blackhole starts at a random point of the renewal cycle.
        let guard = client
            .lock(format!("held{run}"))
            .lease(Lease::watchdog(LEASE))
            .acquire()
            .await
            .expect("acquire");
        tokio::time::sleep(rng.between(Duration::ZERO, LEASE / 3)).await;
        proxy.set(Mode::Blackhole);
        let started = tokio::time::Instant::now();
        tokio::time::timeout(LEASE * 4, guard.lost())
            .await
            .unwrap_or_else(|_| panic!("run {run}: lost() never fired in the blackhole"));
        lost_after.push(started.elapsed());
        drop(guard);

        // While acquiring.
        let started = tokio::time::Instant::now();
        let outcome = client
            .lock(format!("new{run}"))
            .lease(Lease::watchdog(LEASE))
            .wait(WAIT)
            .acquire()
            .await;
        latencies.push(started.elapsed());
        match outcome {
            Err(LockError::Backend(error)) => kinds.push(format!("{:?}", error.kind())),
            other => panic!("run {run}: acquire in a blackhole gave {other:?}"),
        }
        // The partition heals, but the proxy dropped the bytes sent into it: the connections
        // that went silent stay open and out of step. The client must not use them again.
        proxy.set(Mode::Pass);
        let after = client
            .lock(format!("after{run}"))
            .lease(Lease::watchdog(LEASE))
            .wait(Duration::from_secs(2))
            .acquire()
            .await;
        after.expect("acquire after the blackhole").release().await.expect("release");
    }
    kinds.sort_unstable();
    kinds.dedup();
    let quiet = checker::client_settles(&client, Duration::from_secs(2)).await;
    let leaks = checker::server_drains(&bed.redis, &bed.prefix, LEASE * 2).await;
    let s = &mut bed.scenario;
    s.figure("runs", runs);
    s.figure("lease_ms", LEASE.as_millis());
    s.figure_ms("lost_after_blackhole_p99_ms", &lost_after, 0.99);
    s.figure_ms("acquire_latency_max_ms", &latencies, 1.0);
    s.figure("error_kinds", kinds.join(","));
    s.figure("leaked_keys", leaks.count());
    s.report();
    let slowest = lost_after.iter().max().expect("runs");
    assert!(
        *slowest <= LEASE + TOLERANCE,
        "lost() {slowest:?} after the blackhole began, past the {LEASE:?} lease"
    );
    // An attempt started before the wait ends runs to its command timeout, and an attempt whose
    // reply never came is resolved (one more command) before the caller hears of it.
    let longest = latencies.iter().max().expect("runs");
    assert!(
        *longest <= WAIT + 2 * COMMAND_TIMEOUT + TOLERANCE,
        "an acquire in the blackhole took {longest:?}"
    );
    checker::assert_settled(quiet, &client);
    assert_eq!(leaks.count(), 0, "left in Redis: {leaks:?}");
}
