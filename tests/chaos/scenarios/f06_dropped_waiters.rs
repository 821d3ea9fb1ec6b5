//! F6: a thousand waiters give up at random times, some by their wait running out and some by
//! their future being dropped, on plain and fair locks. Nothing may stay behind: no
//! subscriptions, no queue places, no waiter entries, no extra tasks.

use std::time::Duration;

use futures_util::future::join_all;
use tower_lock::{Lease, LockError};

use super::{Bed, Topology};
use crate::{checker, run, support::RespValue};

/// Keys waited for: enough that the waiters of one key stay under the client's per-key cap
/// (1 024) at soak counts too.
const KEYS: usize = 20;

/// The waiters' lease. A waiter dropped while its attempt was on its way leaves a record
/// that voids the attempt, should it still arrive, for this long.
const WAITER_LEASE: Lease = Lease::fixed(Duration::from_secs(1));

/// Odd keys are fair locks, even ones plain locks.
fn fair(key: usize) -> bool {
    key % 2 == 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f06_dropped_waiters_leave_nothing() {
    let mut bed = Bed::new("F6", Topology::Single).await;
    // Under the client's cap of 10 000 waiters in all.
    let waiters = run::count(1_000, 8_000);
    let mut rng = bed.scenario.rng();
    let holder = bed.client().await;
    let waiter = bed.client().await;
    let lease = Lease::watchdog(Duration::from_secs(5));
    // Connections and the pub/sub task belong in the baseline.
    super::warm_up(&bed, &holder, &waiter).await;
    let baseline = checker::tasks();

    let held = join_all((0..KEYS).map(|i| {
        let holder = &holder;
        async move {
            let guard = if !fair(i) {
                holder.lock(format!("k{i}")).lease(lease).acquire().await
            } else {
                holder.fair_lock(format!("k{i}")).lease(lease).acquire().await
            };
            guard.expect("acquire")
        }
    }))
    .await;
    let started = tokio::time::Instant::now();
    let (mut timed_out, mut dropped) = (0, 0);
    let attempts = (0..waiters).map(|_| {
        let i = rng.below(KEYS as u64) as usize;
        let give_up = rng.between(Duration::from_millis(1), Duration::from_millis(300));
        let by_drop = rng.chance(0.5);
        if by_drop {
            dropped += 1;
        } else {
            timed_out += 1;
        }
        let waiter = &waiter;
        async move {
            let request = if !fair(i) {
                waiter.lock(format!("k{i}"))
            } else {
                waiter.fair_lock(format!("k{i}"))
            };
            // An attempt dropped on its way is voided for its lease: keep that short.
            let request = request.lease(WAITER_LEASE);
            if by_drop {
                let acquire = request.wait(Duration::from_secs(30)).acquire();
                if let Ok(early) = tokio::time::timeout(give_up, acquire).await {
                    panic!("a waiter ended before it was dropped: {early:?}");
                }
            } else {
                let result = request.wait(give_up).acquire().await;
                assert!(
                    matches!(result, Err(LockError::WaitTimeout { .. })),
                    "a waiter ended otherwise than by its wait: {result:?}"
                );
            }
        }
    });
    join_all(attempts).await;
    let elapsed = started.elapsed();
    // Nothing left while the holder still holds: the waiters are all gone.
    let quiet = checker::client_settles(&waiter, Duration::from_secs(2)).await;
    let numsub = || -> i64 {
        (0..KEYS)
            .map(|i| {
                let channel = format!("{}:released", bed.lock_key(&format!("k{i}")));
                match bed.redis.cmd(&["PUBSUB", "NUMSUB", &channel]) {
                    RespValue::Array(Some(items)) => items[1].as_int(),
                    other => panic!("PUBSUB NUMSUB: {other:?}"),
                }
            })
            .sum()
    };
    let queued = || -> i64 {
        (0..KEYS)
            .filter(|&i| fair(i))
            .map(|i| {
                let name = bed.lock_key(&format!("k{i}"));
                bed.redis.cmd(&["LLEN", &format!("{name}:queue")]).as_int()
                    + bed.redis.cmd(&["ZCARD", &format!("{name}:timeouts")]).as_int()
            })
            .sum()
    };
    // Unsubscribing and leaving a queue are sent in the background. A fair waiter dropped
    // while its joining call was in flight is not known to be queued, so its place goes only
    // when it times out: the waiter timeout (5 s by default) bounds it.
    let gone_since = tokio::time::Instant::now();
    super::eventually(Duration::from_secs(6), || numsub() + queued() == 0).await;
    let drained_after = gone_since.elapsed();
    let (numsub, queued) = (numsub(), queued());
    for guard in held {
        guard.release().await.expect("release");
    }
    let settled = super::eventually(Duration::from_secs(2), || checker::tasks() <= baseline).await;
    let voids = checker::server_leaks(&bed.redis, &bed.prefix).count();
    // Void records of dropped attempts expire with the waiters' lease.
    let leaks = checker::server_drains(
        &bed.redis,
        &bed.prefix,
        WAITER_LEASE.duration() + Duration::from_secs(1),
    )
    .await;
    let s = &mut bed.scenario;
    s.figure("waiters", waiters);
    s.figure("timed_out", timed_out);
    s.figure("dropped", dropped);
    s.figure("numsub_left", numsub);
    s.figure("queue_places_left", queued);
    s.figure("drained_after_ms", drained_after.as_millis());
    s.figure("client_state_left", checker::client_leaks(&waiter));
    s.figure("tasks_over_baseline", checker::tasks().saturating_sub(baseline));
    s.figure("void_records", voids);
    s.figure("leaked_keys", leaks.count());
    s.figure("secs", format!("{:.1}", elapsed.as_secs_f64()));
    s.report();
    assert!(quiet, "the waiting client still tracks state: {}", checker::client_state(&waiter));
    assert_eq!(numsub, 0, "subscriptions left behind");
    assert_eq!(queued, 0, "fair queue places left behind");
    assert!(settled, "{} tasks alive, {baseline} before", checker::tasks());
    assert_eq!(leaks.count(), 0, "{leaks:?}");
}
