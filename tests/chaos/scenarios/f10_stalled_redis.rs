//! F10: Redis itself stalls while a lock is held: `SIGSTOP` for two leases, or `DEBUG SLEEP`
//! for 1.5 leases. The holder must hear `lost()` at its local deadline, before Redis expires
//! the key; renewals queued during the stall must not bring the lock back; and a caller
//! acquiring meanwhile answers within its wait plus the command timeout.

use std::time::Duration;

use tower_lock::{Lease, LockError};

use super::{Bed, Topology};
use crate::{checker, run};

const LEASE: Duration = Duration::from_secs(1);
const COMMAND_TIMEOUT: Duration = Duration::from_millis(300);
const WAIT: Duration = Duration::from_millis(500);
/// How late `lost()` may be woken on this shared 2-core machine.
const SCHEDULING: Duration = Duration::from_millis(50);
/// Scheduling slack on this shared 2-core machine.
const TOLERANCE: Duration = Duration::from_millis(100);

/// How Redis is stalled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stall {
    /// `SIGSTOP` for two leases, then `SIGCONT`.
    Signal,
    /// `DEBUG SLEEP 1.5` (the server blocks itself).
    DebugSleep,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f10_stalled_redis_holder_lost_first() {
    let mut bed = Bed::new("F10", Topology::Single).await;
    let runs = run::count(1, 50);
    let client = bed.client_via(bed.redis.url(), COMMAND_TIMEOUT).await;
    let other = bed.client().await;
    let (mut margins, mut latencies, mut revived) = (Vec::new(), Vec::new(), 0);
    for run in 0..runs * 2 {
        let stall = if run % 2 != 1 { Stall::Signal } else { Stall::DebugSleep };
        let key = format!("k{run}");
        let guard =
            client.lock(&key).lease(Lease::watchdog(LEASE)).acquire().await.expect("acquire");
        // The last renewal that Redis answered bounds when the key expires there.
        let ttl_before = bed.redis.cmd(&["PTTL", &bed.lock_key(&key)]).as_int();
        let stalled_at = tokio::time::Instant::now();
        let server_expiry = stalled_at + Duration::from_millis(ttl_before.max(0) as u64);
        let node = bed.redis.clone();
        let stall_task = tokio::task::spawn_blocking(move || match stall {
            Stall::Signal => {
                node.pause();
                std::thread::sleep(LEASE * 2);
                node.resume();
            }
            Stall::DebugSleep => {
                node.cmd(&["DEBUG", "SLEEP", "1.5"]);
            }
        });
        // A caller meanwhile gets an answer within its wait plus the command timeout.
        let probe = bed.redis.clone();
        assert!(
            super::eventually(Duration::from_secs(1), || probe.stalled()).await,
            "run {run} ({stall:?}): Redis did not stall"
        );
        let started = tokio::time::Instant::now();
        // Its lease bounds how long Redis remembers the attempt as given up (so that it is
        // refused if it runs after the stall): the drain check below waits two leases.
        let outcome = client
            .lock(format!("during{run}"))
            .lease(Lease::watchdog(LEASE))
            .wait(WAIT)
            .acquire()
            .await;
        latencies.push(started.elapsed());
        assert!(
            matches!(outcome, Err(LockError::Backend(_))),
            "run {run} ({stall:?}): acquire against a stalled Redis gave {outcome:?}"
        );
        tokio::time::timeout(LEASE * 3, guard.lost())
            .await
            .unwrap_or_else(|_| panic!("run {run} ({stall:?}): lost() never fired"));
        let lost_at = tokio::time::Instant::now();
        margins.push(server_expiry.saturating_duration_since(lost_at));
        // The client's drift margin is 12 ms here; a loaded machine may wake it later than that.
        assert!(
            lost_at <= server_expiry + SCHEDULING,
            "run {run} ({stall:?}): lost() {:?} after Redis expired the key",
            lost_at.saturating_duration_since(server_expiry)
        );
        stall_task.await.expect("stall");
        // Renewals queued during the stall ran after it: the lock must be gone, not revived.
        let taken = other.lock(&key).wait(Duration::from_secs(1)).acquire().await;
        match taken {
            Ok(theirs) => theirs.release().await.expect("release"),
            Err(_) => revived += 1,
        }
        assert!(matches!(guard.release().await, Err(LockError::Lost)));
    }
    let mut leaks = checker::server_drains(&bed.redis, &bed.prefix, LEASE * 2).await;
    // A record of an attempt given up during the stall lives a lease from the last undo that
    // reached the server (the undos queued during the stall land after it, and one may land
    // after an earlier record went): it must go on its own, so what is left is only such
    // records, each with no more than a lease to live.
    if leaks.channels.is_empty() && leaks.keys.iter().all(|key| key.ends_with(":void")) {
        leaks = checker::server_drains(&bed.redis, &bed.prefix, LEASE + TOLERANCE).await;
    }
    let ttls: Vec<i64> = leaks.keys.iter().map(|k| bed.redis.cmd(&["PTTL", k]).as_int()).collect();
    let bounded = |(key, ttl): (&String, &i64)| {
        key.ends_with(":void") && *ttl > 0 && *ttl <= LEASE.as_millis() as i64
    };
    let leaked =
        leaks.channels.len() + leaks.keys.iter().zip(&ttls).filter(|&pair| !bounded(pair)).count();
    let s = &mut bed.scenario;
    s.figure("runs", runs * 2);
    s.figure_ms("margin_min_ms", &margins, 0.0);
    s.figure_ms("margin_p50_ms", &margins, 0.5);
    s.figure_ms("caller_latency_max_ms", &latencies, 1.0);
    s.figure("revived", revived);
    s.figure("leaked_keys", leaked);
    s.report();
    assert_eq!(revived, 0, "a renewal queued during the stall brought the lock back");
    let longest = latencies.iter().max().expect("runs");
    // As in F17: an attempt runs to its command timeout and a lost reply is resolved first.
    assert!(*longest <= WAIT + 2 * COMMAND_TIMEOUT + TOLERANCE, "caller waited {longest:?}");
    assert_eq!(leaked, 0, "left in Redis: {leaks:?} ttls {ttls:?}");
}
