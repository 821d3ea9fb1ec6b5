//! F14: connections are killed at a random moment of an acquire or a release, by the proxy
//! (`cut`) or by Redis (`CLIENT KILL TYPE normal`). No ambiguous state may remain: a failed
//! acquire holds nothing, a failed release frees the lock within one lease, and the next holder
//! is never harmed.

use std::time::Duration;

use tower_lock::{Lease, LockError};

use super::{Bed, Topology};
use crate::{checker, proxy::Proxy, run, support::owned_by};

const LEASE: Duration = Duration::from_millis(500);
const COMMAND_TIMEOUT: Duration = Duration::from_millis(300);
/// How long after a failed acquire the key is checked.
const SETTLE: Duration = Duration::from_millis(50);
/// Scheduling slack on this shared 2-core machine.
const TOLERANCE: Duration = Duration::from_millis(200);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f14_killed_connections_leave_no_ambiguity() {
    let mut bed = Bed::new("F14", Topology::Single).await;
    let runs = run::count(40, 1000);
    let mut rng = bed.scenario.rng();
    let proxy = std::sync::Arc::new(Proxy::start(bed.redis.url()).await);
    let a = bed.client_via(&proxy.url(), COMMAND_TIMEOUT).await;
    let b = bed.client().await;
    let lease = Lease::watchdog(LEASE);
    let (mut orphans, mut harmed, mut stuck, mut faults_hit) = (0, 0, 0, 0);
    let (mut kinds, mut tracked, mut held_after_release) = (Vec::new(), Vec::new(), Vec::new());
    let mut phantoms = 0;
    for run in 0..runs {
        let key = format!("k{run}");
        let name = bed.lock_key(&key);
        let on_release = rng.chance(0.5);
        let by_redis = rng.chance(0.5);
        let delay = Duration::from_micros(rng.below(1500));
        let fault = {
            let (proxy, node) = (proxy.clone(), bed.redis.clone());
            async move {
                tokio::time::sleep(delay).await;
                if by_redis {
                    tokio::task::spawn_blocking(move || {
                        node.cmd(&["CLIENT", "KILL", "TYPE", "normal"]);
                    })
                    .await
                    .expect("CLIENT KILL");
                } else {
                    proxy.cut();
                }
            }
        };
        if on_release {
            let guard = a.lock(&key).lease(lease).acquire().await;
            let guard = guard.expect("acquire before the fault");
            let (released, ()) = tokio::join!(guard.release(), fault);
            if let Err(error) = released {
                faults_hit += 1;
                match error {
                    LockError::Backend(error) => kinds.push(format!("{:?}", error.kind())),
                    other => panic!("run {run}: release failed with {other:?}"),
                }
                // The lease stopped being renewed: the lock frees within one lease.
                let node = bed.redis.clone();
                let freed = super::eventually(LEASE + TOLERANCE, || {
                    node.cmd(&["EXISTS", &name]).as_int() == 0
                })
                .await;
                if !freed {
                    stuck += 1;
                }
            }
        } else {
            let (acquired, ()) = tokio::join!(
                a.lock(&key).lease(lease).wait(Duration::from_secs(1)).acquire(),
                fault
            );
            match acquired {
                Ok(guard) => {
                    // A retry carries a new attempt: the lock's record must be the holder's
                    // grant (a first attempt whose reply was lost is undone before it is
                    // granted), and the release must free it.
                    let owned = owned_by(|args| bed.redis.cmd(args), &name, guard.holder().id());
                    if !owned {
                        phantoms += 1;
                    }
                    if guard.release().await.is_ok()
                        && bed.redis.cmd(&["EXISTS", &name]).as_int() == 1
                    {
                        held_after_release.push(format!("run {run}: held after its release"));
                    }
                }
                Err(LockError::Backend(error)) => {
                    faults_hit += 1;
                    kinds.push(format!("{:?}", error.kind()));
                    tokio::time::sleep(SETTLE).await;
                    if bed.redis.cmd(&["EXISTS", &name]).as_int() == 1 {
                        orphans += 1;
                    }
                }
                Err(other) => panic!("run {run}: acquire failed with {other:?}"),
            }
        }
        // A has nothing new left to track once its call returned.
        let settled = super::eventually(Duration::from_secs(1), || {
            checker::client_leaks(&a) <= tracked.len()
        })
        .await;
        if !settled {
            tracked.push(format!(
                "run {run} (fault on {}, by {}, after {delay:?}): {}",
                if on_release { "release" } else { "acquire" },
                if by_redis { "CLIENT KILL" } else { "proxy cut" },
                checker::client_state(&a)
            ));
        }
        // The next holder gets the lock and keeps it while A's stragglers arrive.
        let started = tokio::time::Instant::now();
        let next = b.lock(&key).lease(lease).wait(LEASE + TOLERANCE).acquire().await;
        let next = next.unwrap_or_else(|e| {
            // Say who had the key: a straggler of A, or nobody (B's own call failed).
            panic!(
                "run {run}: the next holder was kept out after {:?}: {e:?}; the key then: \
                 {:?} (ttl {} ms); A: {}; B: {}",
                started.elapsed(),
                bed.redis.cmd(&["DUMP", &name]),
                bed.redis.cmd(&["PTTL", &name]).as_int(),
                checker::client_state(&a),
                checker::client_state(&b),
            )
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let owned = owned_by(|args| bed.redis.cmd(args), &name, next.holder().id());
        if !owned || next.is_lost() {
            harmed += 1;
        }
        next.release().await.expect("the next holder releases");
    }
    kinds.sort_unstable();
    kinds.dedup();
    let leaks = checker::server_drains(&bed.redis, &bed.prefix, LEASE * 2).await;
    let s = &mut bed.scenario;
    s.figure("runs", runs);
    s.figure("faults_hit", faults_hit);
    s.figure("orphan_holds", format!("{orphans}/{runs}"));
    s.figure("successors_harmed", harmed);
    s.figure("release_failed_and_stuck", stuck);
    s.figure("retries_reentering_lost_attempt", phantoms);
    s.figure("held_after_release", held_after_release.len());
    s.figure("client_state_left", tracked.len());
    s.figure("error_kinds", kinds.join(","));
    s.figure("leaked_keys", leaks.count());
    s.report();
    assert!(held_after_release.is_empty(), "{held_after_release:#?}");
    assert!(tracked.is_empty(), "the client kept tracking a finished call: {tracked:#?}");
    assert_eq!(orphans, 0, "a failed acquire left the lock held");
    assert_eq!(harmed, 0, "a straggler harmed the next holder");
    assert_eq!(stuck, 0, "a failed release kept the lock past its lease");
    assert_eq!(leaks.count(), 0, "left in Redis: {leaks:?}");
}
