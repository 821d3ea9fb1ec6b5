//! F4: one client holds a thousand locks with a one-second watchdog lease for several leases
//! while a competitor keeps trying to take them. The watchdog must keep every one (the
//! competitor never gets in) and renew each lock once per tick: the renewal scripts the server
//! runs (`EVALSHA` in `INFO commandstats`, less the competitor's attempts) per lock and tick stay
//! at one. (The watchdog sends a tick's renewals as one pipeline; `commandstats` counts the
//! scripts in it, not round trips.) Then a waiting competitor gets a released lock at once.

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use tower_lock::{Lease, LockError};

use super::{Bed, Topology};
use crate::{clock, run};

const LOCKS: usize = 1000;
const LEASE: Duration = Duration::from_secs(1);
/// Renewal scripts per lock and tick allowed: one, and some slack for a tick that falls just
/// inside the measured window.
const SCRIPTS_PER_LOCK_TICK: f64 = 1.2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f04_thousand_locks_renewed_in_batches() {
    let mut bed = Bed::new("F4", Topology::Single).await;
    let hold = Duration::from_secs(run::count(3, 5) as u64);
    let mut rng = bed.scenario.rng();
    let (holder, competitor) = (bed.client().await, bed.client().await);
    let guards: Vec<_> = join_all((0..LOCKS).map(|i| {
        holder
            .lock(format!("k{i}"))
            .lease(Lease::watchdog(LEASE))
            .acquire()
    }))
    .await
    .into_iter()
    .collect::<Result<_, _>>()
    .expect("acquire the thousand locks");

    let evalsha_before = bed.redis.calls("evalsha");
    let started = Instant::now();
    let (mut attempts, mut intrusions) = (0u64, 0usize);
    while started.elapsed() < hold {
        let key = format!("k{}", rng.below(LOCKS as u64));
        match competitor.lock(&key).try_acquire().await {
            Err(LockError::WaitTimeout { .. }) => {}
            Ok(guard) => {
                intrusions += 1;
                guard.release().await.expect("release");
            }
            Err(other) => panic!("competitor on {key}: {other:?}"),
        }
        attempts += 1;
        // The competitor's pace; the fault is the pressure, not a synchronisation.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let held_for = started.elapsed();
    let renewals = bed.redis.calls("evalsha") - evalsha_before - attempts;
    let ticks = held_for.as_secs_f64() / (LEASE / 3).as_secs_f64();
    let per_lock_tick = renewals as f64 / ticks / LOCKS as f64;
    let lost = guards.iter().filter(|guard| guard.is_lost()).count();

    // A waiting competitor gets a released lock at once.
    let mut guards = guards;
    let released = guards.pop().expect("a guard");
    let key = format!("k{}", LOCKS - 1);
    let waiter = {
        let competitor = competitor.clone();
        tokio::spawn(async move {
            let guard = competitor
                .lock(&key)
                .wait(Duration::from_secs(5))
                .acquire()
                .await;
            (guard, Instant::now())
        })
    };
    assert!(
        super::eventually(Duration::from_secs(5), || competitor.waiters() == 1).await,
        "the competitor did not queue"
    );
    released.release().await.expect("release");
    let released_at = Instant::now();
    let (guard, granted_at) = waiter.await.expect("waiter task");
    let gap = granted_at - released_at;
    guard
        .expect("the competitor acquires")
        .release()
        .await
        .expect("release");
    join_all(guards.into_iter().map(|guard| guard.release()))
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .expect("release the rest");

    let s = &mut bed.scenario;
    s.figure("locks", LOCKS);
    s.figure("held_ms", held_for.as_millis());
    s.figure("lost", lost);
    s.figure("intrusions", format!("{intrusions}/{attempts}"));
    s.figure("renewal_scripts", renewals);
    s.figure("renewals_per_lock_tick", format!("{per_lock_tick:.3}"));
    s.figure("competitor_gap_ms", format!("{:.2}", clock::ms(gap)));
    s.report();

    assert_eq!(lost, 0, "the watchdog lost locks");
    assert_eq!(intrusions, 0, "the competitor got a held lock");
    assert!(
        per_lock_tick <= SCRIPTS_PER_LOCK_TICK,
        "{per_lock_tick:.3} renewals per lock and tick"
    );
    assert!(
        gap < Duration::from_millis(10),
        "woken {gap:?} after the release"
    );
}
