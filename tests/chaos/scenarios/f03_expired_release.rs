//! F3 (Redisson `testExpire`): A holds with a fixed 300 ms lease but works for 500 ms; B takes
//! the lock when A's lease runs out; then A releases. A's release must not touch B's lock, and
//! a third client C must still find it held. The negative control releases with a plain `DEL`:
//! C then gets in while B still holds, and the checkers must say so.

use std::time::Duration;

use futures_util::future::join_all;
use tower_lock::{Lease, LockClient, LockError, RedisBackend};

use super::{Bed, Topology};
use crate::{
    checker, clock,
    history::{History, Outcome, Section},
    run,
    support::owned_by,
    witness::Witness,
};

const LEASE: Duration = Duration::from_millis(300);
const WORK: Duration = Duration::from_millis(500);
/// B's watchdog lease: it renews every 300 ms while A releases and C tries.
const B_LEASE: Duration = Duration::from_millis(900);

/// What one run saw.
struct Outcomes {
    /// B's hold was gone after A's release.
    wrong_deletion: bool,
    /// From A's lease running out (counted from its acquire call) to B holding.
    b_delay: Duration,
    /// A's release result.
    a_release: String,
}

struct Clients {
    a: LockClient<RedisBackend>,
    b: LockClient<RedisBackend>,
    c: LockClient<RedisBackend>,
}

/// Runs the critical section of a holder that stops work when `lost()` fires, recording it.
async fn hold_until(
    witness: &Witness,
    section: &mut Section,
    guard: &tower_lock::LockGuard<RedisBackend>,
    work: Duration,
) {
    witness.enter(&section.key).await;
    tokio::select! {
        () = guard.lost() => section.t_lost = Some(clock::now_ns()),
        () = tokio::time::sleep(work) => {}
    }
    witness.exit(&section.key).await;
}

async fn one_run(
    bed: &Bed,
    clients: &Clients,
    history: &History,
    key: String,
    plain_del: bool,
) -> Outcomes {
    let witness = &bed.witness;
    let mut a = history.begin(&key, "");
    let a_guard = clients
        .a
        .lock(&key)
        .lease(Lease::fixed(LEASE))
        .fencing()
        .acquire()
        .await
        .expect("A acquires");
    a.t_ok = Some(clock::now_ns());
    a.token = a_guard.fencing_token();
    a.holder = a_guard.holder().id().to_owned();
    let a_expires = a.t_inv + LEASE.as_nanos() as u64;

    let (a_done, a_released) = tokio::sync::oneshot::channel::<()>();
    // A releases only once B holds: a release before that would test nothing.
    let (b_holds, b_held) = tokio::sync::oneshot::channel::<()>();
    let b_side = async {
        let mut b = history.begin(&key, "");
        let guard = clients
            .b
            .lock(&key)
            .lease(Lease::watchdog(B_LEASE))
            .fencing()
            .wait(Duration::from_secs(3))
            .acquire()
            .await
            .expect("B acquires after A's lease");
        b.t_ok = Some(clock::now_ns());
        b.token = guard.fencing_token();
        b.holder = guard.holder().id().to_owned();
        witness.enter(&key).await;
        let _ = b_holds.send(());
        let _ = a_released.await;
        // A has released: B's hold must be intact, and C must not get in.
        let owned = owned_by(|args| bed.redis.cmd(args), &bed.lock_key(&key), &b.holder);
        let wrong_deletion = !owned;
        let mut c = history.begin(&key, "");
        match clients.c.lock(&key).wait(Duration::from_millis(100)).acquire().await {
            Ok(c_guard) => {
                c.t_ok = Some(clock::now_ns());
                c.holder = c_guard.holder().id().to_owned();
                witness.enter(&key).await;
                witness.exit(&key).await;
                c.t_rel_inv = Some(clock::now_ns());
                let _ = c_guard.release().await;
                c.result = Outcome::Ok;
            }
            Err(LockError::WaitTimeout { .. }) => c.result = Outcome::Fail,
            Err(error) => panic!("C: {error:?}"),
        }
        history.record(&c);
        // Two renewal intervals: B's lease is still being kept.
        tokio::time::sleep(B_LEASE * 2 / 3).await;
        let renewable = !guard.is_lost();
        witness.exit(&key).await;
        b.t_rel_inv = Some(clock::now_ns());
        let released = guard.release().await;
        b.t_rel_ok = Some(clock::now_ns());
        b.result = if released.is_ok() { Outcome::Ok } else { Outcome::Fail };
        history.record(&b);
        if !plain_del {
            assert!(renewable, "B lost its lock after A's stale release");
            released.expect("B releases");
        }
        (wrong_deletion, clock::between(a_expires, b.t_ok.expect("held")))
    };
    let a_side = async {
        hold_until(witness, &mut a, &a_guard, WORK).await;
        let _ = b_held.await;
        a.t_rel_inv = Some(clock::now_ns());
        let result = if plain_del {
            let node = bed.redis.clone();
            let name = bed.lock_key(&key);
            drop(a_guard); // the guard knows it is lost and leaves Redis alone
            tokio::task::spawn_blocking(move || node.cmd(&["DEL", &name])).await.expect("DEL");
            "DEL".to_owned()
        } else {
            match a_guard.release().await {
                Err(error @ (LockError::Lost | LockError::NotHeld)) => format!("{error:?}"),
                other => panic!("A's late release: {other:?}"),
            }
        };
        a.t_rel_ok = Some(clock::now_ns());
        a.result = Outcome::Fail;
        history.record(&a);
        let _ = a_done.send(());
        result
    };
    let (a_release, (wrong_deletion, b_delay)) = tokio::join!(a_side, b_side);
    Outcomes { wrong_deletion, b_delay, a_release }
}

/// Runs `runs` F3 runs, `batch` at a time on distinct keys; returns (violations, wrong deletions).
async fn expired_release(name: &'static str, plain_del: bool, runs: usize) -> (u64, usize) {
    let mut bed = Bed::new(name, Topology::Single).await;
    let clients = Clients { a: bed.client().await, b: bed.client().await, c: bed.client().await };
    let history = bed.scenario.history();
    let mut outcomes = Vec::new();
    let stalls = super::StallMeter::start();
    for batch in (0..runs).collect::<Vec<_>>().chunks(10) {
        let batch =
            batch.iter().map(|run| one_run(&bed, &clients, &history, format!("k{run}"), plain_del));
        outcomes.extend(join_all(batch).await);
    }
    let sweep = checker::sweep(&History::read(&bed.scenario.history_path()));
    let seen = bed.witness.seen().await;
    let violations = (sweep.violations + sweep.token_errors) as u64 + seen.overlaps;
    let wrong = outcomes.iter().filter(|o| o.wrong_deletion).count();
    let delays: Vec<_> = outcomes.iter().map(|o| o.b_delay).collect();
    let mut kinds: Vec<_> = outcomes.iter().map(|o| o.a_release.as_str()).collect();
    kinds.sort_unstable();
    kinds.dedup();
    let leaks = checker::server_settled(&bed.redis, &bed.prefix).await;
    let s = &mut bed.scenario;
    s.figure("runs", runs);
    s.figure("wrong_deletions", format!("{wrong}/{runs}"));
    s.figure("violations", violations);
    s.figure("witness_overlaps", seen.overlaps);
    s.figure_ms("b_after_expiry_p50_ms", &delays, 0.5);
    s.figure_ms("b_after_expiry_p99_ms", &delays, 0.99);
    s.figure("a_release", kinds.join(","));
    s.figure("leaked_keys", leaks.count());
    s.report();
    if !plain_del {
        assert_eq!(leaks.count(), 0, "{leaks:?}");
        assert!(
            run::quantile_ms(&delays, 0.99) <= 100.0 + stalls.worst().as_secs_f64() * 1000.0,
            "B took the lock late after A's expiry: {delays:?} (the runtime woke timers up to \
             {:?} late)",
            stalls.worst()
        );
    }
    (violations, wrong)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f03_expired_release_leaves_successor_alone() {
    let runs = run::count(20, 1000);
    let (violations, wrong) = expired_release("F3", false, runs).await;
    assert_eq!(wrong, 0, "a stale release deleted the successor's lock");
    assert_eq!(violations, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f03_control_plain_del_is_caught() {
    let (violations, wrong) = expired_release("F3-control", true, 3).await;
    assert!(wrong > 0, "checker blind: a plain DEL removed nothing of B's");
    assert!(violations > 0, "checker blind: C got in beside B unnoticed");
}
