//! Contention from clients in this process (each with its own connections, as separate
//! processes would have), for backends a holder process does not speak: the clients start
//! together and run critical sections on random keys, each checked by the witness and
//! recorded in the history.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::sync::Barrier;
use tower_lock::{Backend, Lease, LockClient, LockGuard};

use crate::{
    clock,
    history::{History, Outcome, Section},
    run::Rng,
    witness::Witness,
};

/// What the clients run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Contention {
    /// Sections, shared evenly between the clients.
    pub(crate) sections: usize,
    /// Keys `k0..k<keys>`, picked uniformly.
    pub(crate) keys: u64,
    /// How long each acquire waits.
    pub(crate) wait: Duration,
}

/// What the clients saw: acquire latencies and caller-visible errors.
#[derive(Debug, Default)]
pub(crate) struct Contended {
    pub(crate) latencies: Vec<Duration>,
    pub(crate) errors: Vec<String>,
}

/// Takes `key` with a watchdog `lease` for a section the caller ends, recorded as begun in
/// `history`; panics (naming `run`) if it cannot.
pub(crate) async fn hold<B: Backend>(
    locks: &LockClient<B>,
    key: &str,
    lease: Duration,
    history: &History,
    run: usize,
) -> (LockGuard<B>, Section) {
    let mut section = history.begin(key, "");
    let guard = locks
        .lock(key)
        .lease(Lease::watchdog(lease))
        .acquire()
        .await
        .unwrap_or_else(|e| panic!("run {run}: {key}: {e:?}"));
    section.t_ok = Some(clock::now_ns());
    section.holder = guard.holder().id().to_owned();
    (guard, section)
}

/// One client's share.
async fn sections<B: Backend>(
    client: LockClient<B>,
    (history, witness): (History, Witness),
    load: Contention,
    sections: usize,
    mut rng: Rng,
    start: Arc<Barrier>,
) -> Contended {
    let mut seen = Contended::default();
    start.wait().await;
    for _ in 0..sections {
        let key = format!("k{}", rng.below(load.keys));
        let mut section = history.begin(&key, "");
        let asked = Instant::now();
        let guard = match client.lock(&key).wait(load.wait).acquire().await {
            Ok(guard) => guard,
            Err(error) => {
                section.result = Outcome::Fail;
                history.record(&section);
                seen.errors.push(format!("{key}: {error}"));
                continue;
            }
        };
        seen.latencies.push(asked.elapsed());
        section.t_ok = Some(clock::now_ns());
        section.holder = guard.holder().id().to_owned();
        witness.enter(&key).await;
        witness.increment_slowly(&key, Duration::from_micros(rng.below(500))).await;
        witness.exit(&key).await;
        section.t_rel_inv = Some(clock::now_ns());
        match guard.release().await {
            Ok(()) => section.result = Outcome::Ok,
            Err(error) => seen.errors.push(format!("{key}: release: {error}")),
        }
        section.t_rel_ok = Some(clock::now_ns());
        history.record(&section);
    }
    seen
}

/// Runs `load` on `clients`, which start together; returns once every section ended.
pub(crate) async fn contend<B: Backend>(
    (history, witness): (&History, &Witness),
    clients: &[LockClient<B>],
    load: Contention,
    rng: &mut Rng,
) -> Contended {
    let start = Arc::new(Barrier::new(clients.len()));
    let tasks: Vec<_> = clients
        .iter()
        .map(|client| {
            tokio::spawn(sections(
                client.clone(),
                (history.clone(), witness.clone()),
                load,
                load.sections / clients.len(),
                Rng::new(rng.next_u64()),
                start.clone(),
            ))
        })
        .collect();
    let mut seen = Contended::default();
    for task in tasks {
        let done = task.await.expect("client task");
        seen.latencies.extend(done.latencies);
        seen.errors.extend(done.errors);
    }
    seen
}
