//! F24: Redlock over five nodes. Eight clients (each with its own connections, as separate
//! processes) start together and contend for a few keys, first with every node up, then while
//! two nodes are killed in the middle of the load (locks held and acquires in flight on them),
//! then with those two down; every section goes through the witness and the history. Then an
//! acquire alone with two down (bounded by a node timeout), and with a third node killed: the
//! typed quorum error within the wait. The attempts per acquisition show whether the random
//! retry delay keeps split votes rare.

use std::time::{Duration, Instant};

use tower_lock::{Lease, LockError, error::BackendErrorKind};

use super::{
    Bed, REDLOCK_NODES, Topology,
    in_process::{Contention, contend},
};
use crate::{checker, clock, history::History, run};

/// Clients contending.
const CLIENTS: usize = 8;
/// Keys they contend for.
const KEYS: u64 = 8;
/// How long a contended acquire waits: with two nodes down every round takes a node timeout,
/// and the lock is not fair.
const WAIT: Duration = Duration::from_secs(30);
/// How long one node may take to answer.
const NODE_TIMEOUT: Duration = Duration::from_millis(200);
/// Scheduling slack allowed past a computed bound.
const SLACK: Duration = Duration::from_millis(150);
/// The wait of the acquires that cannot reach a majority.
const QUORUM_WAIT: Duration = Duration::from_millis(400);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f24_redlock_with_nodes_killed() {
    let mut bed = Bed::new("F24", Topology::Redlock).await;
    let mut rng = bed.scenario.rng();
    let started = Instant::now();
    // With two nodes down every acquire and release waits a node timeout for them.
    let (all_up_sections, killed_sections, two_down_sections) =
        (run::count(800, 10_000), run::count(48, 1000), run::count(48, 1000));
    let clients: Vec<_> = (0..CLIENTS).map(|_| bed.redlock_client(NODE_TIMEOUT)).collect();

    let history = bed.scenario.history();
    let load = |sections| Contention { sections, keys: KEYS, wait: WAIT };
    let all_up = contend((&history, &bed.witness), &clients, load(all_up_sections), &mut rng).await;
    // Two nodes picked by the seed die once the witness has seen a third of the next load's
    // sections; three remain, a majority.
    let mut order: Vec<usize> = (0..REDLOCK_NODES).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let killed_at = bed.witness.seen().await.counted + (killed_sections / 3) as u64;
    let killing = contend((&history, &bed.witness), &clients, load(killed_sections), &mut rng);
    let kill_mid_load = async {
        while bed.witness.seen().await.counted < killed_at {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        for &node in &order[..2] {
            bed.nodes[node].kill();
        }
    };
    let (killed, ()) = tokio::join!(killing, kill_mid_load);
    let two_down =
        contend((&history, &bed.witness), &clients, load(two_down_sections), &mut rng).await;

    // Alone, an acquire with two nodes down takes at most a node timeout more than a round
    // trip.
    let alone = &clients[0];
    let mut solo = Vec::new();
    for attempt in 0..run::count(10, 200) {
        let asked = Instant::now();
        let guard =
            alone.lock(format!("alone{attempt}")).try_acquire().await.expect("acquire on 3 of 5");
        solo.push(asked.elapsed());
        guard.release().await.expect("release on 3 of 5");
    }
    let (rounds, won): (u64, u64) = clients.iter().fold((0, 0), |(rounds, won), client| {
        (rounds + client.backend().acquire_rounds(), won + client.backend().acquire_rounds_won())
    });

    let live = &order[3..];
    // Attempts that lost their vote were given back: each node records them as given up on,
    // for a lease.
    let (mut leaks, mut voids, mut left) = (0, 0, Vec::new());
    for &node in live {
        let found = checker::server_settled(&bed.nodes[node], &bed.prefix).await;
        let (found, bounded) =
            found.less_bounded_voids(&bed.nodes[node], Lease::DEFAULT.duration());
        leaks += found.count();
        voids += bounded;
        left.push(found);
    }
    bed.nodes[order[2]].kill();
    let mut failures = Vec::new();
    let mut wrong_errors = Vec::new();
    for attempt in 0..run::count(5, 50) {
        let asked = Instant::now();
        let result = alone.lock(format!("three-down{attempt}")).wait(QUORUM_WAIT).acquire().await;
        failures.push(asked.elapsed());
        match result {
            Err(LockError::Backend(e))
                if *e.kind()
                    == (BackendErrorKind::QuorumUnavailable { reachable: 2, needed: 3 }) => {}
            other => wrong_errors.push(format!("{:?}", other.map(|_| "the lock"))),
        }
    }
    let mut left_on_two = 0;
    for &node in live {
        let found = checker::server_settled(&bed.nodes[node], &bed.prefix).await;
        let (found, bounded) =
            found.less_bounded_voids(&bed.nodes[node], Lease::DEFAULT.duration());
        left_on_two += found.count();
        voids += bounded;
        left.push(found);
    }

    let recorded = History::read(&bed.scenario.history_path());
    let sweep = checker::sweep(&recorded);
    let seen = bed.witness.seen().await;
    let ok = checker::completed(&recorded);
    let lost_updates = (ok as u64).abs_diff(seen.counted);
    let violations = sweep.violations as u64 + seen.overlaps + lost_updates;
    let errors: Vec<_> =
        [&all_up, &killed, &two_down].iter().flat_map(|phase| &phase.errors).collect();
    let slowest_failure = failures.iter().max().copied().unwrap_or_default();
    let s = &mut bed.scenario;
    s.figure("violations", format!("{violations}/{}", sweep.held));
    s.figure("sections_two_down", two_down.latencies.len());
    s.figure("witness_overlaps", seen.overlaps);
    s.figure("lost_updates", lost_updates);
    s.figure("errors", errors.len());
    for (name, phase) in [("all_up", &all_up), ("killed", &killed), ("two_down", &two_down)] {
        s.figure(
            &format!("contended_p99_ms_{name}"),
            format!("{:.1}", run::quantile_ms(&phase.latencies, 0.99)),
        );
    }
    s.figure("acquire_p99_ms_two_down", format!("{:.2}", run::quantile_ms(&solo, 0.99)));
    s.figure("attempts_per_acquisition", format!("{:.3}", rounds as f64 / won.max(1) as f64));
    s.figure(
        "failure_max_ms_three_down",
        format!("{:.0}/{}", clock::ms(slowest_failure), QUORUM_WAIT.as_millis()),
    );
    s.figure("void_records", voids);
    s.figure("leaked_keys", leaks + left_on_two);
    s.figure("secs", format!("{:.1}", started.elapsed().as_secs_f64()));
    s.report();

    assert_eq!(violations, 0, "mutual exclusion broken: {:?}", sweep.examples);
    assert!(errors.is_empty(), "caller-visible errors: {:?}", &errors[..errors.len().min(5)]);
    let total = [all_up_sections, killed_sections, two_down_sections]
        .iter()
        .map(|sections| sections / CLIENTS * CLIENTS)
        .sum::<usize>();
    assert_eq!(ok, total, "every section completed");
    let slowest = solo.iter().max().copied().unwrap_or_default();
    assert!(slowest <= NODE_TIMEOUT + SLACK, "acquire with 2 down took {slowest:?}");
    assert!(wrong_errors.is_empty(), "with 3 down: {wrong_errors:?}");
    assert!(slowest_failure <= QUORUM_WAIT + SLACK, "failed after {slowest_failure:?}");
    assert_eq!(leaks + left_on_two, 0, "keys or channels left on the live nodes: {left:?}");
}
