//! F29: a flood of waiters on one key and of distinct keys. The per-key cap must turn the
//! excess away at once, and the number of Redis connections must stay constant.

use std::time::Duration;

use futures_util::{StreamExt, stream};
use tower_lock::{Lease, LockError};

use super::{Bed, Topology};
use crate::{checker, run};

/// The client's default cap of waiters per key.
const CAP: usize = 1024;

/// How many clients Redis has connected.
fn connections(bed: &Bed) -> usize {
    let list = bed.redis.cmd(&["CLIENT", "LIST"]).as_str().unwrap_or_default();
    list.lines().count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f29_flood_is_capped_with_constant_connections() {
    let mut bed = Bed::new("F29", Topology::Single).await;
    let flood: usize = std::env::var("F29_FLOOD").map(|v| v.parse().unwrap()).unwrap_or(10_001);
    let distinct = run::count(2_000, 100_000);
    let holder = bed.client().await;
    let client = bed.client().await;
    // Pools grown and pub/sub open before counting connections.
    super::warm_up(&bed, &holder, &client).await;
    let before = connections(&bed);

    // One key, held, and far more waiters than the cap.
    let held = holder
        .lock("hot")
        .lease(Lease::watchdog(Duration::from_secs(10)))
        .acquire()
        .await
        .expect("acquire");
    // Each waiter releases as soon as it has the lock, so the queue drains in any order.
    let waiting: Vec<_> = (0..CAP)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                let guard = client.lock("hot").wait(Duration::from_secs(30)).acquire().await?;
                guard.release().await
            })
        })
        .collect();
    let all_waiting = super::eventually(Duration::from_secs(10), || client.waiters() == CAP).await;
    assert!(all_waiting, "{} of {CAP} waiters queued", client.waiters());
    let mut rejects = Vec::new();
    for _ in CAP..flood {
        let started = tokio::time::Instant::now();
        let outcome = client.lock("hot").wait(Duration::from_secs(30)).acquire().await;
        rejects.push(started.elapsed());
        assert!(matches!(outcome, Err(LockError::TooManyWaiters)), "{outcome:?}");
    }
    let during = connections(&bed);
    held.release().await.expect("release");
    for task in waiting {
        let turn = task.await.expect("waiter task");
        turn.expect("every capped waiter gets its turn");
    }

    // Many distinct keys, 64 at a time.
    let started = tokio::time::Instant::now();
    let client_ref = &client;
    let failures = stream::iter(0..distinct)
        .map(|i| async move {
            match client_ref.lock(format!("d{i}")).acquire().await {
                Ok(guard) => guard.release().await.is_err() as usize,
                Err(_) => 1,
            }
        })
        .buffer_unordered(64)
        .fold(0, |sum, failed| async move { sum + failed })
        .await;
    let distinct_secs = started.elapsed().as_secs_f64();
    let after = connections(&bed);
    let quiet = checker::client_settles(&client, Duration::from_secs(2)).await;
    let leaks = checker::server_settled(&bed.redis, &bed.prefix).await;
    let s = &mut bed.scenario;
    s.figure("waiters", flood);
    s.figure("rejected", rejects.len());
    s.figure("reject_p99_ms", format!("{:.3}", run::quantile_ms(&rejects, 0.99)));
    s.figure("distinct_keys", distinct);
    s.figure("distinct_failures", failures);
    s.figure("distinct_per_s", format!("{:.0}", distinct as f64 / distinct_secs));
    s.figure("connections", format!("{before}/{during}/{after}"));
    s.figure("leaked_keys", leaks.count());
    s.report();
    assert_eq!(rejects.len(), flood - CAP);
    assert!(run::quantile_ms(&rejects, 0.99) < 1.0, "rejections are not immediate");
    assert_eq!(failures, 0);
    assert_eq!((during, after), (before, before), "connections grew with the flood");
    checker::assert_settled(quiet, &client);
    assert_eq!(leaks.count(), 0, "{leaks:?}");
}
