//! F8: a holder process is `kill -9`'d while it holds a lock; a waiter in another process must
//! get the lock within one lease.

use std::time::Duration;

use tower_lock::Lease;

use super::{Bed, Topology};
use crate::{
    checker, clock,
    history::{History, Outcome},
    holder::{Command, Reply},
    run,
};

const LEASE: Duration = Duration::from_millis(500);
/// Scheduling slack on this shared 2-core machine (the catalogue in tests/chaos/README.md: at least 50 ms + 2 RTT).
const TOLERANCE: Duration = Duration::from_millis(200);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f08_killed_holder_frees_within_one_lease() {
    let mut bed = Bed::new("F8", Topology::Single).await;
    let runs = run::count(5, 100);
    let mut rng = bed.scenario.rng();
    let history = bed.scenario.history();
    let waiter = bed.client().await;
    let mut takeovers = Vec::new();
    for run in 0..runs {
        let key = format!("k{run}");
        let mut holder = bed.holder_process().await;
        holder.send(&Command::Hold {
            key: key.clone(),
            lease_ms: LEASE.as_millis() as u64,
            fair: false,
        });
        let Reply::Held { token, t_ok } = holder.reply(Duration::from_secs(5)).await else {
            panic!("holder did not take {key}");
        };
        // The waiter is already waiting when the holder dies.
        let mut waiting = history.begin(&key, "");
        let acquire = {
            let (waiter, key) = (waiter.clone(), key.clone());
            tokio::spawn(async move {
                let guard = waiter
                    .lock(&key)
                    .lease(Lease::watchdog(LEASE))
                    .fencing()
                    .wait(Duration::from_secs(5))
                    .acquire()
                    .await;
                (guard, clock::now_ns())
            })
        };
        // Kill at a random point of the renewal cycle.
        tokio::time::sleep(rng.between(Duration::ZERO, LEASE)).await;
        let t_kill = clock::now_ns();
        holder.kill();
        // The killed holder's section ends at its death: it believed it held until then.
        let mut dead = history.begin(&key, &format!("killed-{}", holder.pid()));
        (dead.t_inv, dead.t_ok, dead.token, dead.t_lost) = (t_ok, Some(t_ok), token, Some(t_kill));
        history.record(&dead);

        let (guard, t_got) = acquire.await.expect("waiter task");
        let guard = guard.unwrap_or_else(|e| panic!("run {run}: no takeover: {e:?}"));
        waiting.t_ok = Some(t_got);
        waiting.token = guard.fencing_token();
        waiting.holder = guard.holder().id().to_owned();
        takeovers.push(clock::between(t_kill, t_got));
        waiting.t_rel_inv = Some(clock::now_ns());
        guard.release().await.expect("release");
        waiting.t_rel_ok = Some(clock::now_ns());
        waiting.result = Outcome::Ok;
        history.record(&waiting);
    }

    let sweep = checker::sweep(&History::read(&bed.scenario.history_path()));
    let late: Vec<_> = takeovers.iter().map(|t| t.saturating_sub(LEASE)).collect();
    // The waiter's subscription ends when its last lock of the key is released, with an
    // UNSUBSCRIBE sent after the release returns: give it a moment, not a lease.
    let leaks = checker::server_drains(&bed.redis, &bed.prefix, Duration::from_secs(1)).await;
    let s = &mut bed.scenario;
    s.figure("runs", runs);
    s.figure("lease_ms", LEASE.as_millis());
    s.figure_ms("takeover_p50_ms", &takeovers, 0.5);
    s.figure_ms("takeover_p99_ms", &takeovers, 0.99);
    s.figure_ms("past_lease_p99_ms", &late, 0.99);
    s.figure("violations", sweep.violations + sweep.token_errors);
    s.figure("leaked_keys", leaks.count());
    s.report();

    assert_eq!(sweep.violations + sweep.token_errors, 0, "{:?}", sweep.examples);
    let slowest = takeovers.iter().max().expect("runs");
    assert!(
        *slowest <= LEASE + TOLERANCE,
        "a killed holder's lock was taken over only after {slowest:?} (lease {LEASE:?})"
    );
    assert_eq!(leaks.count(), 0, "{leaks:?}");
}
