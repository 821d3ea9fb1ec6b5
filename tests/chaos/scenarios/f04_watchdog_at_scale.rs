//! F4: one client holds a thousand locks with a one-second watchdog lease for several leases
//! while a competitor keeps trying to take them. The watchdog must keep every one (the
//! competitor never gets in) and renew them in batches: every lease due at about the same time
//! goes to Redis in one call, one round trip. The holder runs on a runtime of its own thread,
//! whose metrics a local recorder collects: the renewal batch histogram gives the batches per
//! tick and how long a tick's round trip took. `INFO commandstats` (the `PEXPIRE`s the renewal
//! scripts ran: one per grant they extend) shows each lock renewed once per tick. Then a
//! waiting competitor gets a released lock at once.

use std::{
    thread,
    time::{Duration, Instant},
};

use futures_util::future::join_all;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tokio::sync::oneshot;
use tower_lock::{Lease, LockClient, LockError, metrics::RENEWAL_BATCH_SECONDS};

use super::{Bed, Topology};
use crate::{clock, run};

const LOCKS: usize = 1000;
const LEASE: Duration = Duration::from_secs(1);
/// Renewals (a record's `PEXPIRE`) per lock and tick allowed: one, and some slack for a tick
/// that falls just inside the measured window.
const RENEWALS_PER_LOCK_TICK: f64 = 1.2;
/// Renewal batches per tick allowed for locks taken within half a renewal interval of each
/// other (a renewal goes up to half an interval early to share a round trip, and locks renewed
/// together stay together): two batches of 500, and some slack. A burst of acquires that a
/// loaded machine spreads over longer makes a group per half interval, each allowed as much.
const BATCHES_PER_TICK: f64 = 2.2;

/// The holder thread's side of the scenario.
struct Holder {
    /// Answers once the locks are held: how long taking them all took.
    ready: oneshot::Receiver<Duration>,
    /// Asks the holder to count its lost locks and release the last one; the answer is the
    /// count and when the release returned.
    release_one: oneshot::Sender<oneshot::Sender<(usize, Instant)>>,
    /// Asks the holder to release the rest.
    finish: oneshot::Sender<()>,
    thread: thread::JoinHandle<()>,
}

/// Starts the holder: a thread with a current-thread runtime, `recorder` as the metrics
/// recorder of everything that runs on it (the holder client's watchdog included).
fn start_holder(url: String, prefix: String, recorder: DebuggingRecorder) -> Holder {
    let (ready_tx, ready) = oneshot::channel();
    let (release_one, release_rx) = oneshot::channel::<oneshot::Sender<(usize, Instant)>>();
    let (finish, finish_rx) = oneshot::channel();
    let thread = thread::spawn(move || {
        let runtime =
            tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        metrics::with_local_recorder(&recorder, || {
            runtime.block_on(async move {
                let backend = crate::support::redis_backend(&url).connect().await.expect("connect");
                let holder = LockClient::builder(backend)
                    .prefix(&prefix)
                    .build()
                    .expect("client configuration");
                let burst = Instant::now();
                let mut guards: Vec<_> =
                    join_all((0..LOCKS).map(|i| {
                        holder.lock(format!("k{i}")).lease(Lease::watchdog(LEASE)).acquire()
                    }))
                    .await
                    .into_iter()
                    .collect::<Result<_, _>>()
                    .expect("acquire the thousand locks");
                ready_tx.send(burst.elapsed()).expect("the scenario waits");
                let answer = release_rx.await.expect("the scenario asks");
                let lost = guards.iter().filter(|guard| guard.is_lost()).count();
                let last = guards.pop().expect("a guard");
                last.release().await.expect("release");
                answer.send((lost, Instant::now())).expect("the scenario waits");
                finish_rx.await.expect("the scenario asks");
                join_all(guards.into_iter().map(|guard| guard.release()))
                    .await
                    .into_iter()
                    .collect::<Result<Vec<_>, _>>()
                    .expect("release the rest");
            });
        });
    });
    Holder { ready, release_one, finish, thread }
}

/// The renewal batches recorded since the last call: how long each took.
fn batches(snapshotter: &Snapshotter) -> Vec<Duration> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == RENEWAL_BATCH_SECONDS)
        .flat_map(|(.., value)| match value {
            DebugValue::Histogram(samples) => samples,
            _ => Vec::new(),
        })
        .map(|seconds| Duration::from_secs_f64(seconds.into_inner()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f04_thousand_locks_renewed_in_batches() {
    // Alone: the wake-up after the release is held to 10 ms.
    let mut bed = Bed::alone("F4", Topology::Single).await;
    let hold = Duration::from_secs(run::count(3, 5) as u64);
    let mut rng = bed.scenario.rng();
    let competitor = bed.client().await;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let holder = start_holder(bed.redis.url().to_owned(), bed.prefix.clone(), recorder);
    let burst = holder.ready.await.expect("the holder holds the locks");

    batches(&snapshotter);
    let (evalsha_before, pexpire_before) = (bed.redis.calls("evalsha"), bed.redis.calls("pexpire"));
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
    // Each refused attempt of the competitor runs the acquire script once.
    let scripts = bed.redis.calls("evalsha") - evalsha_before - attempts;
    let renewals = bed.redis.calls("pexpire") - pexpire_before;
    let ticks = held_for.as_secs_f64() / (LEASE / 3).as_secs_f64();
    let per_lock_tick = renewals as f64 / ticks / LOCKS as f64;
    let round_trips = batches(&snapshotter);
    let per_tick = round_trips.len() as f64 / ticks;

    // A waiting competitor gets a released lock at once.
    let key = format!("k{}", LOCKS - 1);
    let waiter = {
        let competitor = competitor.clone();
        tokio::spawn(async move {
            let guard = competitor.lock(&key).wait(Duration::from_secs(5)).acquire().await;
            (guard, Instant::now())
        })
    };
    assert!(
        super::eventually(Duration::from_secs(5), || competitor.waiters() == 1).await,
        "the competitor did not queue"
    );
    let (answer, answered) = oneshot::channel();
    assert!(holder.release_one.send(answer).is_ok(), "the holder stopped");
    let (lost, released_at) = answered.await.expect("the holder answers");
    let (guard, granted_at) = waiter.await.expect("waiter task");
    let gap = granted_at.saturating_duration_since(released_at);
    guard.expect("the competitor acquires").release().await.expect("release");
    assert!(holder.finish.send(()).is_ok(), "the holder stopped");
    holder.thread.join().expect("the holder thread");

    let s = &mut bed.scenario;
    s.figure("locks", LOCKS);
    s.figure("held_ms", held_for.as_millis());
    s.figure("lost", lost);
    s.figure("intrusions", format!("{intrusions}/{attempts}"));
    s.figure("renewal_scripts", scripts);
    s.figure("renewals", renewals);
    s.figure("renewals_per_lock_tick", format!("{per_lock_tick:.3}"));
    s.figure("round_trips_per_tick", format!("{per_tick:.2}"));
    s.figure("tick_p50_ms", format!("{:.2}", run::quantile_ms(&round_trips, 0.5)));
    s.figure("tick_p99_ms", format!("{:.2}", run::quantile_ms(&round_trips, 0.99)));
    s.figure("competitor_gap_ms", format!("{:.2}", clock::ms(gap)));
    s.figure("acquire_burst_ms", format!("{:.2}", clock::ms(burst)));
    s.report();

    assert_eq!(lost, 0, "the watchdog lost locks");
    assert_eq!(intrusions, 0, "the competitor got a held lock");
    assert!(
        per_lock_tick <= RENEWALS_PER_LOCK_TICK,
        "{per_lock_tick:.3} renewals per lock and tick"
    );
    assert!(!round_trips.is_empty(), "no renewal batch recorded");
    let groups = 1.0 + (burst.as_secs_f64() / (LEASE / 6).as_secs_f64()).floor();
    assert!(
        per_tick <= BATCHES_PER_TICK * groups,
        "{per_tick:.2} renewal round trips per tick (the locks were taken over {burst:?})"
    );
    assert!(gap < Duration::from_millis(10), "woken {gap:?} after the release");
}
