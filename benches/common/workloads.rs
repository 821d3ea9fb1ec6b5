//! The workloads the engine and scale-out benches share (W1 and W3 of `benches/engine.rs`),
//! generic over the backend so every backend runs the very same code.
//!
//! Included with `#[path = "common/workloads.rs"] mod workloads;` by the benches that use it.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use tower_lock::{Backend, LockClient, LockKind};

/// W1: the mean time of one acquire + release.
pub(crate) async fn w1<B: Backend>(client: &LockClient<B>, window: Duration) -> Duration {
    let pairs = w1_pairs(client, window).await;
    Duration::from_secs_f64(1.0 / pairs)
}

/// W1 as acquire + release pairs per second.
pub(crate) async fn w1_pairs<B: Backend>(client: &LockClient<B>, window: Duration) -> f64 {
    let start = Instant::now();
    let mut pairs = 0u64;
    while start.elapsed() < window {
        let guard = client.lock("w1").acquire().await.expect("acquire");
        guard.release().await.expect("release");
        pairs += 1;
    }
    pairs as f64 / start.elapsed().as_secs_f64()
}

/// Results of a one-key contention run.
pub(crate) struct Contention {
    pub(crate) handoffs_per_sec: f64,
    pub(crate) waits: Vec<Duration>,
    pub(crate) per_task: Vec<u64>,
}

impl Contention {
    /// The wait at percentile `p` (0.0 to 1.0).
    pub(crate) fn percentile(&self, p: f64) -> Duration {
        let i = ((self.waits.len() as f64 - 1.0) * p).round() as usize;
        self.waits.get(i).copied().unwrap_or_default()
    }

    /// One report line, with the time per hand-off in round trips of `rtt`.
    pub(crate) fn line(&self, rtt: Duration) -> String {
        let pct = |p: f64| self.percentile(p);
        let max = self.waits.last().copied().unwrap_or_default();
        let min_task = self.per_task.iter().min().copied().unwrap_or(0);
        let max_task = self.per_task.iter().max().copied().unwrap_or(0);
        format!(
            "{:>9.0} hand-offs/s  wait p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms  ({:.1} RTT per hand-off; per task {min_task}..{max_task})",
            self.handoffs_per_sec,
            pct(0.5).as_secs_f64() * 1e3,
            pct(0.99).as_secs_f64() * 1e3,
            max.as_secs_f64() * 1e3,
            1.0 / self.handoffs_per_sec / rtt.as_secs_f64(),
        )
    }
}

/// W3 / W3b / W3f: `tasks` tasks per client on one key; each checks it is alone inside.
pub(crate) async fn contend<B: Backend>(
    clients: &[LockClient<B>],
    tasks: usize,
    window: Duration,
    kind: LockKind,
) -> Contention {
    let inside = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for client in clients {
        for _ in 0..tasks {
            let (client, inside) = (client.clone(), inside.clone());
            set.spawn(async move {
                let mut waits = Vec::new();
                while start.elapsed() < window {
                    let asked = Instant::now();
                    let request = match kind {
                        LockKind::Fair => client.fair_lock("w3"),
                        _ => client.lock("w3"),
                    };
                    let guard =
                        request.wait(Duration::from_secs(30)).acquire().await.expect("acquire");
                    waits.push(asked.elapsed());
                    assert!(!inside.swap(true, Ordering::SeqCst), "two holders inside");
                    inside.store(false, Ordering::SeqCst);
                    guard.release().await.expect("release");
                }
                waits
            });
        }
    }
    let mut waits = Vec::new();
    let mut per_task = Vec::new();
    while let Some(result) = set.join_next().await {
        let task_waits = result.expect("task");
        per_task.push(task_waits.len() as u64);
        waits.extend(task_waits);
    }
    let elapsed = start.elapsed();
    waits.sort();
    Contention { handoffs_per_sec: waits.len() as f64 / elapsed.as_secs_f64(), waits, per_task }
}
