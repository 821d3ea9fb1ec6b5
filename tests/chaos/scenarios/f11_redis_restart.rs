//! F11: Redis is `kill -9`'d while locks are held and waited for, and restarted empty on the
//! same port 500 ms later. Held guards must report the loss, callers must not hang, and the
//! pool, the pub/sub connection and the scripts must come back by themselves.

use std::time::Duration;

use futures_util::future::join_all;
use tower_lock::{Lease, LockError};

use super::{Bed, Topology};
use crate::{checker, run};

const LEASE: Duration = Duration::from_secs(1);
const COMMAND_TIMEOUT: Duration = Duration::from_millis(300);
const DOWN: Duration = Duration::from_millis(500);
const WAIT: Duration = Duration::from_secs(1);
const HELD: usize = 5;
/// Scheduling slack on this shared 2-core machine.
const TOLERANCE: Duration = Duration::from_millis(200);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f11_redis_restart_recovers() {
    let mut bed = Bed::new("F11", Topology::Single).await;
    let runs = run::count(2, 20);
    let a = bed.client_via(bed.redis.url(), COMMAND_TIMEOUT).await;
    let b = bed.client_via(bed.redis.url(), COMMAND_TIMEOUT).await;
    let (mut first_acquire, mut lost_after_kill, mut wakes) = (Vec::new(), Vec::new(), Vec::new());
    let (mut hung, mut kinds) = (0, Vec::new());
    for run in 0..runs {
        let lease = Lease::watchdog(LEASE);
        let guards =
            join_all((0..HELD).map(|i| a.lock(format!("held{run}-{i}")).lease(lease).acquire()))
                .await;
        let guards: Vec<_> = guards.into_iter().map(|g| g.expect("acquire")).collect();
        // A waiter that waited for a release: the pub/sub connection (opened by the first
        // listener) is open when the server dies.
        let blocker = b.lock("blocker").lease(lease).acquire().await.expect("acquire");
        let waiting = {
            let a = a.clone();
            tokio::spawn(async move {
                a.lock("blocker").lease(lease).wait(Duration::from_secs(10)).acquire().await
            })
        };
        assert!(
            super::eventually(Duration::from_secs(5), || a.waiters() == 1).await,
            "run {run}: the blocker's waiter never waited"
        );
        blocker.release().await.expect("release");
        waiting
            .await
            .expect("waiter task")
            .expect("the waiter gets the lock")
            .release()
            .await
            .expect("release");
        let reconnects_before = a.backend().pubsub_reconnects();

        let killed = tokio::time::Instant::now();
        bed.redis.kill();
        let losses = join_all(guards.iter().map(|guard| async move {
            guard.lost().await;
            killed.elapsed()
        }));
        // Callers during the outage get an answer within their wait plus a command timeout.
        let callers = join_all((0..HELD).map(|i| {
            let a = a.clone();
            async move {
                let started = tokio::time::Instant::now();
                let outcome =
                    a.lock(format!("down{run}-{i}")).lease(lease).wait(WAIT).acquire().await;
                (started.elapsed(), outcome)
            }
        }));
        let restart = async {
            tokio::time::sleep(DOWN).await;
            let node = bed.redis.clone();
            tokio::task::spawn_blocking(move || node.restart()).await.expect("restart");
            tokio::time::Instant::now()
        };
        let (losses, callers, restarted) =
            tokio::join!(tokio::time::timeout(LEASE * 3, losses), callers, restart);
        lost_after_kill.extend(
            losses.unwrap_or_else(|_| panic!("run {run}: a held guard never heard lost()")),
        );
        for (took, outcome) in callers {
            if took > WAIT + COMMAND_TIMEOUT + TOLERANCE {
                hung += 1;
            }
            match outcome {
                Ok(guard) => drop(guard),
                Err(LockError::Backend(error)) => kinds.push(format!("{:?}", error.kind())),
                Err(other) => panic!("run {run}: caller during the outage got {other:?}"),
            }
        }
        // The first acquire after the restart (scripts reloaded, pool reconnected), on each
        // client: one that saw the server refuse connections fails at once until its probe
        // reaches the server again (within a second of the restart).
        for (name, client) in [("a", &a), ("b", &b)] {
            loop {
                match client.lock(format!("first{run}{name}")).lease(lease).try_acquire().await {
                    Ok(guard) => {
                        if name == "a" {
                            first_acquire.push(restarted.elapsed());
                        }
                        guard.release().await.expect("release");
                        break;
                    }
                    Err(error) => {
                        assert!(
                            restarted.elapsed() < Duration::from_secs(5),
                            "run {run}: no acquire by {name} after the restart: {error:?}"
                        );
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
        }
        // The pub/sub connection comes back on its own (its retries back off to one a second;
        // the bound leaves room for a busy machine).
        let reconnected = super::eventually(Duration::from_secs(15), || {
            a.backend().pubsub_reconnects() > reconnects_before
        })
        .await;
        assert!(reconnected, "run {run}: pub/sub did not reconnect");
        // A release wakes a waiter again.
        let holder = b.lock(format!("wake{run}")).lease(lease).acquire().await.expect("acquire");
        let waiter = {
            let (a, key) = (a.clone(), format!("wake{run}"));
            tokio::spawn(async move {
                a.lock(key).lease(lease).wait(Duration::from_secs(5)).acquire().await
            })
        };
        let a_waits = super::eventually(Duration::from_secs(2), || a.waiters() == 1).await;
        assert!(a_waits, "run {run}: the waiter never started waiting");
        tokio::time::sleep(Duration::from_millis(20)).await;
        let released = tokio::time::Instant::now();
        holder.release().await.expect("release");
        let woken = waiter.await.expect("waiter task").expect("the waiter gets the lock");
        wakes.push(released.elapsed());
        woken.release().await.expect("release");
        drop(guards);
    }
    kinds.sort_unstable();
    kinds.dedup();
    let quiet = checker::client_settles(&a, Duration::from_secs(3)).await;
    let leaks = checker::server_drains(&bed.redis, &bed.prefix, LEASE * 2).await;
    let s = &mut bed.scenario;
    s.figure("runs", runs);
    s.figure_ms("first_acquire_after_restart_p99_ms", &first_acquire, 0.99);
    s.figure_ms("lost_after_kill_p99_ms", &lost_after_kill, 0.99);
    s.figure_ms("wake_after_restart_p99_ms", &wakes, 0.99);
    s.figure("callers_hung", hung);
    s.figure("error_kinds", kinds.join(","));
    s.figure("leaked_keys", leaks.count());
    s.report();
    assert_eq!(hung, 0, "callers waited past their wait and command timeout");
    let slowest = lost_after_kill.iter().max().expect("runs");
    assert!(*slowest <= LEASE + TOLERANCE, "a guard heard lost() {slowest:?} after the kill");
    let first = first_acquire.iter().max().expect("runs");
    assert!(*first < Duration::from_secs(1), "first acquire {first:?} after the restart");
    let wake = wakes.iter().max().expect("runs");
    assert!(*wake < Duration::from_secs(1), "a waiter woke {wake:?} after a release");
    checker::assert_settled(quiet, &a);
    assert_eq!(leaks.count(), 0, "left in Redis: {leaks:?}");
}
