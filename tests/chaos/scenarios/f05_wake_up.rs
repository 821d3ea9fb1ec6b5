//! F5: a hundred waiters in two holder processes take one lock in turn, with a 30-second
//! lease, so a waiter that polled instead of being notified would wait seconds. Each release
//! must wake a waiter at once, and only one: the scripts run per hand-off stay at the acquire
//! and the release (`EVALSHA` in `INFO commandstats`), where a herd would run one acquire per
//! waiter.

use std::time::Duration;

use super::{Bed, Topology};
use crate::{
    checker, clock,
    history::History,
    holder::{Command, Load, Reply},
    run,
};

const PROCESSES: usize = 2;
/// Waiters per holder process.
const TASKS: usize = 50;
const LEASE_MS: u64 = 30_000;
/// The bound on the release → acquire gap's p99 (tests/chaos/README.md): a waiter that polled
/// would wait out the 30 s lease; an idle machine shows 1–3 ms, a busy one tens.
const GAP: Duration = Duration::from_millis(100);
/// The catalogue's bound on scripts per hand-off (tests/chaos/README.md).
const EVALSHA_PER_HANDOFF: f64 = 2.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f05_waiters_woken_one_at_a_time() {
    let mut bed = Bed::alone("F5", Topology::Single).await;
    let per_task = run::count(4, 40);
    let mut rng = bed.scenario.rng();
    let mut holders = Vec::new();
    for _ in 0..PROCESSES {
        holders.push(bed.holder_process().await);
    }
    let evalsha_before = bed.redis.calls("evalsha");
    for holder in &mut holders {
        holder.send(&Command::Contend(Load {
            tasks: TASKS,
            sections: per_task,
            hot_share: 1.0,
            cold_keys: 1,
            max_pause_us: 1000,
            lease_ms: LEASE_MS,
            seed: rng.next_u64(),
            permits: None,
            for_ms: None,
        }));
    }
    let mut errors = Vec::new();
    for holder in &mut holders {
        match holder.reply(Duration::from_secs(300)).await {
            Reply::Done { errors: failed, leaked, .. } => {
                errors.extend(failed);
                assert_eq!(leaked, 0, "left in a holder's client");
            }
            other => panic!("unexpected holder reply {other:?}"),
        }
    }
    let evalsha = bed.redis.calls("evalsha") - evalsha_before;

    let sections = History::read(&bed.scenario.history_path());
    let sweep = checker::sweep(&sections);
    let seen = bed.witness.seen().await;
    let gaps = checker::handoffs(&sections, "hot");
    let held = checker::completed(&sections);
    let per_handoff = evalsha as f64 / held.max(1) as f64;
    let gap_p99 = run::quantile_ms(&gaps, 0.99);
    let s = &mut bed.scenario;
    s.figure("waiters", PROCESSES * TASKS);
    s.figure("handoffs", gaps.len());
    s.figure("violations", sweep.violations as u64 + seen.overlaps);
    s.figure("errors", errors.len());
    s.figure("gap_p50_ms", format!("{:.2}", run::quantile_ms(&gaps, 0.5)));
    s.figure("gap_p99_ms", format!("{gap_p99:.2}"));
    s.figure("evalsha_per_handoff", format!("{per_handoff:.2}"));
    s.report();

    assert_eq!(sweep.violations, 0, "{:?}", sweep.examples);
    assert_eq!(seen.overlaps, 0);
    assert!(errors.is_empty(), "{:?}", &errors[..errors.len().min(5)]);
    assert_eq!(held, PROCESSES * TASKS * per_task, "every section completed");
    assert!(gap_p99 < clock::ms(GAP), "hand-off p99 {gap_p99:.2} ms");
    assert!(per_handoff <= EVALSHA_PER_HANDOFF, "{per_handoff:.2} scripts per hand-off: a herd");
}
