//! F13: the pub/sub connection is killed (`CLIENT KILL TYPE pubsub`) while 50 waiters wait, and
//! the holder releases 10 ms later. The waiters must re-subscribe and re-check the locks, not
//! sleep until the holder's 30 s lease would have run out.

use std::time::Duration;

use futures_util::future::join_all;
use tower_lock::Lease;

use super::{Bed, Topology};
use crate::{checker, run};

const WAITERS: usize = 50;
const LEASE: Duration = Duration::from_secs(30);
/// A waiter not woken within this counts as stranded.
const STRANDED: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f13_pubsub_kill_strands_nobody() {
    let mut bed = Bed::new("F13", Topology::Single).await;
    let runs = run::count(1, 20);
    let holder = bed.client().await;
    let waiter = bed.client().await;
    let lease = Lease::watchdog(LEASE);
    // Both pools grown to their size and one wait cycle done, so the pooled connections and
    // the pub/sub task are in the baseline.
    super::warm_up(&bed, &holder, &waiter).await;
    let baseline = checker::tasks();
    let (mut wakes, mut stranded) = (Vec::new(), 0);
    for run in 0..runs {
        let keys: Vec<_> = (0..WAITERS).map(|i| format!("k{run}-{i}")).collect();
        let held = join_all(keys.iter().map(|key| holder.lock(key).lease(lease).acquire())).await;
        let held: Vec<_> = held.into_iter().map(|g| g.expect("acquire")).collect();
        let waiting: Vec<_> = keys
            .iter()
            .map(|key| {
                let (waiter, key) = (waiter.clone(), key.clone());
                tokio::spawn(async move {
                    let guard = waiter.lock(key).lease(lease).wait(STRANDED).acquire().await;
                    (guard, tokio::time::Instant::now())
                })
            })
            .collect();
        let subscribed = super::eventually(Duration::from_secs(5), || {
            waiter.backend().subscribed_channels() == WAITERS
        })
        .await;
        assert!(subscribed, "run {run}: waiters did not all subscribe");

        let killed = bed.redis.cmd(&["CLIENT", "KILL", "TYPE", "pubsub"]).as_int();
        assert!(killed >= 1, "run {run}: no pub/sub connection killed");
        tokio::time::sleep(Duration::from_millis(10)).await;
        let released = tokio::time::Instant::now();
        for result in join_all(held.into_iter().map(|guard| guard.release())).await {
            result.expect("release");
        }
        for task in waiting {
            match task.await.expect("waiter task") {
                (Ok(guard), at) => {
                    wakes.push(at - released);
                    guard.release().await.expect("release");
                }
                (Err(_), _) => stranded += 1,
            }
        }
    }
    let quiet = super::eventually(Duration::from_secs(2), || {
        checker::client_leaks(&waiter) + checker::client_leaks(&holder) == 0
    })
    .await;
    let settled = super::eventually(Duration::from_secs(2), || checker::tasks() <= baseline).await;
    let leaks = checker::server_settled(&bed.redis, &bed.prefix).await;
    let s = &mut bed.scenario;
    s.figure("runs", runs);
    s.figure("waiters", runs * WAITERS);
    s.figure("stranded", stranded);
    s.figure_ms("wake_p50_ms", &wakes, 0.5);
    s.figure_ms("wake_p99_ms", &wakes, 0.99);
    s.figure("pubsub_reconnects", waiter.backend().pubsub_reconnects());
    s.figure("leaked_keys", leaks.count());
    s.figure("tasks_over_baseline", checker::tasks().saturating_sub(baseline));
    s.report();
    assert_eq!(stranded, 0, "waiters stranded after the pub/sub connection was killed");
    assert!(run::quantile_ms(&wakes, 0.99) < 1000.0, "wake-ups took too long: p99 over 1 s");
    assert!(quiet, "the clients still track state");
    assert!(settled, "{} tasks alive, {baseline} before", checker::tasks());
    assert_eq!(leaks.count(), 0, "{leaks:?}");
}
