//! Two clients contend for one key: each increments a shared counter with a read, a pause and
//! a write, which loses updates unless the lock serializes them.
//!
//! Runs on the in-memory backend, or on Redis when `REDIS_URL` is set:
//!
//! ```text
//! cargo run --example contend
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example contend
//! ```

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use tower_lock::{Backend, LockClient, MemoryBackend, RedisBackend};

#[path = "common/logs.rs"]
mod logs;

const TASKS_PER_CLIENT: usize = 8;
const ROUNDS: usize = 50;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    logs::show();
    logs::exit(start().await)
}

/// Runs the demo on Redis when `REDIS_URL` is set, else in memory.
async fn start() -> Result<(), Box<dyn std::error::Error>> {
    match std::env::var("REDIS_URL") {
        Ok(url) => {
            println!("backend: Redis at {url}");
            let a = LockClient::builder(RedisBackend::connect(&url).await?).build()?;
            let b = LockClient::builder(RedisBackend::connect(&url).await?).build()?;
            run(a, b).await
        }
        Err(_) => {
            println!("backend: in-memory (set REDIS_URL to use Redis)");
            let shared = MemoryBackend::new();
            let a = LockClient::builder(shared.clone()).build()?;
            let b = LockClient::builder(shared).build()?;
            run(a, b).await
        }
    }
}

/// Runs the same racy increment once without and once with the lock.
async fn run<B: Backend>(
    a: LockClient<B>,
    b: LockClient<B>,
) -> Result<(), Box<dyn std::error::Error>> {
    let expected = (2 * TASKS_PER_CLIENT * ROUNDS) as u64;
    for locked in [false, true] {
        let counter = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for client in [&a, &b] {
            for _ in 0..TASKS_PER_CLIENT {
                let (client, counter) = (client.clone(), counter.clone());
                tasks.spawn(async move {
                    for _ in 0..ROUNDS {
                        let guard = match locked {
                            true => Some(client.lock("counter:shared").acquire().await?),
                            false => None,
                        };
                        // Read, think, write: the classic lost update without a lock.
                        let seen = counter.load(Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_micros(200)).await;
                        counter.store(seen + 1, Ordering::SeqCst);
                        if let Some(guard) = guard {
                            guard.release().await?;
                        }
                    }
                    Ok::<_, tower_lock::LockError>(())
                });
            }
        }
        while let Some(result) = tasks.join_next().await {
            result??;
        }
        let total = counter.load(Ordering::SeqCst);
        println!(
            "{:<13} counter = {total:>4} of {expected} expected ({} lost) in {:?}",
            if locked { "with lock:" } else { "without lock:" },
            expected - total,
            started.elapsed()
        );
    }
    Ok(())
}
