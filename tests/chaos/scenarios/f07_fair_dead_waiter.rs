//! F7: a fair lock across processes. This process holds it; holder process P1 queues for it,
//! then holder process P2, then a waiter in this process. P2 is `kill -9`'d in the queue. The
//! lock must go to P1 first, then to the waiter here, in order: P2's dead place is purged once
//! its waiter timeout passes without a refresh, so it delays the hand-off by at most that
//! timeout, and no later.

use std::time::Duration;

use tokio::time::Instant;
use tower_lock::{Lease, LockClient, RedisBackend};

use super::{Bed, Topology, eventually};
use crate::{
    checker, clock,
    history::{History, Outcome},
    holder::{Command, HolderProc, Reply},
    run,
};

const LEASE_MS: u64 = 5000;
/// Every client's waiter timeout: how long a dead waiter's place can hold the queue up.
const WAITER_TIMEOUT: Duration = Duration::from_millis(1000);
/// Scheduling slack allowed past a computed bound.
const SLACK: Duration = Duration::from_millis(200);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f07_fair_lock_purges_a_killed_waiter() {
    let mut bed = Bed::new("F7", Topology::Single).await;
    let runs = run::count(3, 100);
    let history = bed.scenario.history();
    // Every client keeps its queue places alive with the same timeout.
    let backend = RedisBackend::builder(bed.redis.url())
        .connect()
        .await
        .expect("connect");
    let locks = LockClient::builder(backend)
        .prefix(&bed.prefix)
        .waiter_timeout(WAITER_TIMEOUT)
        .build()
        .expect("client configuration");
    let mut setup = bed.setup(bed.redis.url(), false);
    setup.waiter_timeout_ms = WAITER_TIMEOUT.as_millis() as u64;
    let mut first = HolderProc::spawn(&setup).await;
    let (mut inversions, mut stalls) = (0, Vec::new());
    for run in 0..runs {
        let key = format!("k{run}");
        let queue = format!("{}:queue", bed.lock_key(&key));
        let queued = |n: i64| {
            let (node, queue) = (bed.redis.clone(), queue.clone());
            move || node.cmd(&["LLEN", &queue]).as_int() == n
        };
        let mut own = history.begin(&key, "");
        let held = locks
            .fair_lock(&key)
            .lease(Lease::watchdog(Duration::from_millis(LEASE_MS)))
            .acquire()
            .await
            .expect("the first holder");
        own.t_ok = Some(clock::now_ns());
        own.holder = held.holder().id().to_owned();

        let mut doomed = HolderProc::spawn(&setup).await;
        for (proc, place) in [(&mut first, 1), (&mut doomed, 2)] {
            proc.send(&Command::Hold {
                key: key.clone(),
                lease_ms: LEASE_MS,
                fair: true,
            });
            assert!(
                eventually(Duration::from_secs(5), queued(place)).await,
                "run {run}: holder process not queued at place {place}"
            );
        }
        let waiter = {
            let (locks, history, key) = (locks.clone(), history.clone(), key.clone());
            tokio::spawn(async move {
                let mut section = history.begin(&key, "");
                let guard = locks
                    .fair_lock(&key)
                    .wait(Duration::from_secs(10))
                    .acquire()
                    .await
                    .expect("the waiter behind the dead one");
                section.t_ok = Some(clock::now_ns());
                section.holder = guard.holder().id().to_owned();
                (guard, section)
            })
        };
        assert!(
            eventually(Duration::from_secs(5), queued(3)).await,
            "run {run}: the waiter did not queue"
        );
        doomed.kill();

        own.t_rel_inv = Some(clock::now_ns());
        held.release().await.expect("release");
        own.t_rel_ok = Some(clock::now_ns());
        own.result = Outcome::Ok;
        history.record(&own);
        let Reply::Held { t_ok: first_ok, .. } = first.reply(Duration::from_secs(5)).await else {
            panic!("run {run}: P1 did not get the lock");
        };
        first.send(&Command::Release);
        let Reply::Released { result, .. } = first.reply(Duration::from_secs(5)).await else {
            panic!("run {run}: P1 did not release");
        };
        assert_eq!(result, "ok", "run {run}: P1's release");
        let released = Instant::now();
        let (guard, mut section) = waiter.await.expect("waiter task");
        stalls.push(released.elapsed());
        if section.t_ok.is_some_and(|t| t < first_ok) {
            inversions += 1;
        }
        section.t_rel_inv = Some(clock::now_ns());
        guard.release().await.expect("release");
        section.t_rel_ok = Some(clock::now_ns());
        section.result = Outcome::Ok;
        history.record(&section);
    }
    let sweep = checker::sweep(&History::read(&bed.scenario.history_path()));
    let leaks = checker::server_leaks(&bed.redis, &bed.prefix);
    let slowest = stalls.iter().max().copied().unwrap_or_default();
    let s = &mut bed.scenario;
    s.figure("runs", runs);
    s.figure("fifo_inversions", format!("{inversions}/{runs}"));
    s.figure("violations", sweep.violations);
    s.figure(
        "stall_p50_ms",
        format!("{:.0}", run::quantile_ms(&stalls, 0.5)),
    );
    s.figure(
        "stall_max_ms",
        format!("{:.0}/{}", clock::ms(slowest), WAITER_TIMEOUT.as_millis()),
    );
    s.figure("leaked_keys", leaks.count());
    s.report();

    assert_eq!(inversions, 0, "the lock skipped a live waiter's turn");
    assert_eq!(sweep.violations, 0, "{:?}", sweep.examples);
    assert!(
        slowest <= WAITER_TIMEOUT + SLACK,
        "the dead waiter held the queue up {slowest:?}"
    );
    assert_eq!(leaks.count(), 0, "left in Redis: {leaks:?}");
}
