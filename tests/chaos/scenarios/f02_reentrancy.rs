//! F2: reentrancy under load. Tasks of two clients nest the same lock 1 to 5 deep inside their
//! holder scope, interleaved with each other. The client counts the holds: each guard's hold
//! count must follow every step, while Redis keeps the grant's one record, unchanged, until the
//! last hold is released; the key must go with that release, and no other holder may get in
//! meanwhile.

use std::time::Duration;

use futures_util::future::join_all;
use tower_lock::{Lease, LockClient, RedisBackend};

use super::{Bed, Topology};
use crate::{
    checker, clock,
    history::{History, Outcome},
    run::{self, Rng},
    witness::Witness,
};

const TASKS: usize = 8;
const KEYS: u64 = 4;

/// The grant the lock's record in Redis names.
fn grant_in_redis(bed: &Bed, name: &str) -> Option<String> {
    crate::support::owner_grant(|args| bed.redis.cmd(args), name)
}

async fn nest(
    bed: &Bed,
    client: &LockClient<RedisBackend>,
    witness: &Witness,
    history: &History,
    rng: &mut Rng,
) -> usize {
    let key = format!("k{}", rng.below(KEYS));
    let name = bed.lock_key(&key);
    let depth = 1 + rng.below(5);
    let holder = client.holder();
    let mut mismatches = 0;
    let mut grant = None;
    let mut section = history.begin(&key, holder.id());
    holder
        .clone()
        .scope(async {
            let mut guards = Vec::new();
            for level in 1..=depth {
                let guard = client.lock(&key).lease(Lease::watchdog(Duration::from_secs(2)));
                let guard = guard.wait(Duration::from_secs(30)).acquire().await;
                let guard = guard.expect("acquire");
                if level == 1 {
                    section.t_ok = Some(clock::now_ns());
                    witness.enter(&key).await;
                    grant = grant_in_redis(bed, &name);
                }
                let held = grant
                    .as_deref()
                    .is_some_and(|grant| crate::support::attempt_of(grant, holder.id()));
                if guard.hold_count() != level || !held || grant_in_redis(bed, &name) != grant {
                    mismatches += 1;
                }
                guards.push(guard);
            }
            while let Some(guard) = guards.pop() {
                let remaining = guards.len() as u64;
                if remaining == 0 {
                    witness.exit(&key).await;
                    section.t_rel_inv = Some(clock::now_ns());
                }
                guard.release().await.expect("release");
                // The grant's record stays until the last release, which deletes it (another
                // holder may have a record of its own there by now).
                let left = grant_in_redis(bed, &name);
                if (left == grant) != (remaining > 0) {
                    mismatches += 1;
                }
            }
        })
        .await;
    section.result = Outcome::Ok;
    history.record(&section);
    mismatches
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f02_reentrancy_under_load() {
    let mut bed = Bed::new("F2", Topology::Single).await;
    let sections = run::count(1_000, 10_000);
    let clients = [bed.client().await, bed.client().await];
    let history = bed.scenario.history();
    let base = bed.scenario.rng().next_u64();
    let tasks = (0..TASKS).map(|task| {
        let (bed, client, history) = (&bed, &clients[task % 2], &history);
        async move {
            let mut rng = Rng::new(base ^ task as u64);
            let mut mismatches = 0;
            for _ in 0..sections / TASKS {
                mismatches += nest(bed, client, &bed.witness, history, &mut rng).await;
            }
            mismatches
        }
    });
    let mismatches: usize = join_all(tasks).await.into_iter().sum();
    let sweep = checker::sweep(&History::read(&bed.scenario.history_path()));
    let seen = bed.witness.seen().await;
    let leaks = checker::server_settled(&bed.redis, &bed.prefix).await;
    let s = &mut bed.scenario;
    s.figure("sections", sweep.held);
    s.figure("hold_count_mismatches", format!("{mismatches}/{}", sweep.held));
    s.figure("violations", sweep.violations as u64 + seen.overlaps);
    s.figure("keys_left", leaks.keys.len());
    s.report();
    assert_eq!(mismatches, 0, "hold counts or the grant's record diverged from the nesting");
    assert_eq!(sweep.violations as u64 + seen.overlaps, 0, "{:?}", sweep.examples);
    assert_eq!(leaks.count(), 0, "{leaks:?}");
}
