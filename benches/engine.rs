//! Lock engine throughput and latency against a Redis server this bench starts, each figure
//! printed beside the Redis `PING` round trip measured in the same run (the machines these run on
//! are shared and noisy, so ratios travel better than absolute numbers).
//!
//! ```text
//! cargo bench --bench engine                  # 5 s per concurrent workload
//! BENCH_SECS=1 cargo bench --bench engine     # quicker
//! ```
//!
//! - W1: one task, sequential acquire + release of one key: pairs/s and round trips per pair.
//! - W2: 64 tasks, each on its own key: pairs/s.
//! - W3: one client, 16 tasks on one key; each checks no one else is inside: hand-offs/s and
//!   wait p50/p99/max.
//! - W3b: four clients (four pub/sub connections, as four processes) × 4 tasks on one key.
//! - W3f: W3b with the fair lock: FIFO across clients, so acquisitions per task must be even.
//! - RW: 16 tasks, 95 % reads and 5 % writes of one resource (each holding it ~100 µs), with a
//!   read-write lock and, for comparison, with the plain lock.
//! - W4: one watchdog tick for 10 000 held locks: the backend's renewal of all of them in one
//!   call (one pipeline, one round trip), p50 and p99.
//!
//! W1–W3 also run on the in-memory backend as a floor for the engine's own overhead.

mod common;
#[path = "../tests/support/mod.rs"]
mod support;
#[path = "common/workloads.rs"]
mod workloads;

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use support::RedisServer;
use tower_lock::{
    Backend, Lease, LockClient, LockKind, MemoryBackend,
    backend::{Renew, RenewReply},
};
use workloads::{contend, w1, w1_pairs};

fn main() {
    let window = common::window();
    let runtime = common::runtime();
    let server = RedisServer::start();
    runtime.block_on(async {
        let url = server.url();
        let rtt = common::ping_rtt(&url).await;
        println!("redis PING round trip: {:.1} µs (median of 2000)", micros(rtt));
        println!();

        let redis = |n: usize| {
            let url = url.clone();
            async move {
                let mut clients = Vec::new();
                for _ in 0..n {
                    let backend = support::redis_backend(&url).connect().await.expect("connect");
                    let mut builder = LockClient::builder(backend);
                    if let Some(streak) = std::env::var("HANDOFF_STREAK").ok().and_then(|s| s.parse().ok()) {
                        builder = builder.handoff_streak(streak);
                    }
                    clients.push(builder.build().expect("client"));
                }
                clients
            }
        };
        let memory = LockClient::builder(MemoryBackend::new()).build().expect("client");

        let w1 = w1(&redis(1).await[0], window).await;
        let w1_mem = w1_pairs(&memory, window).await;
        println!(
            "W1  sequential pairs, 1 task:      {:>9.0} pairs/s  {:>7.1} µs/pair = {:.2} RTT   (memory: {:.0} pairs/s)",
            1.0 / w1.as_secs_f64(),
            micros(w1),
            w1.as_secs_f64() / rtt.as_secs_f64(),
            w1_mem
        );

        let w2_redis = w2(&redis(1).await[0], window).await;
        let w2_mem = w2(&memory, window).await;
        println!(
            "W2  64 tasks, own keys:            {w2_redis:>9.0} pairs/s                      (memory: {w2_mem:.0} pairs/s)"
        );

        let w3 = contend(&redis(1).await, 16, window, LockKind::Exclusive).await;
        println!("W3  1 client x 16 tasks, one key:  {}", w3.line(rtt));
        let w3_mem = contend(std::slice::from_ref(&memory), 16, window, LockKind::Exclusive).await;
        println!("    (memory)                       {}", w3_mem.line(rtt));

        let w3b = contend(&redis(4).await, 4, window, LockKind::Exclusive).await;
        println!("W3b 4 clients x 4 tasks, one key:  {}", w3b.line(rtt));

        let w3f = contend(&redis(4).await, 4, window, LockKind::Fair).await;
        println!("W3f same, fair lock:               {}", w3f.line(rtt));

        let clients = redis(1).await;
        let rw = read_heavy(&clients[0], window, true).await;
        let plain = read_heavy(&clients[0], window, false).await;
        println!(
            "RW  16 tasks, 95 % reads:          {rw:>9.0} ops/s with a read-write lock, {plain:.0} ops/s with the plain lock ({:.1}x)",
            rw / plain
        );

        let tick = w4(&redis(1).await[0], &server, window).await;
        println!(
            "W4  watchdog tick, {W4_LOCKS} locks:      p50 {:.2} ms = {:.1} RTT, p99 {:.2} ms; Redis time {:.2} ms and {:.0} script calls per tick",
            tick.p50.as_secs_f64() * 1e3,
            tick.p50.as_secs_f64() / rtt.as_secs_f64(),
            tick.p99.as_secs_f64() * 1e3,
            tick.redis.as_secs_f64() * 1e3,
            tick.calls,
        );
    });
    drop(server);
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// W2: pairs per second over 64 tasks on distinct keys.
async fn w2<B: Backend>(client: &LockClient<B>, window: Duration) -> f64 {
    let pairs = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..64 {
        let (client, pairs) = (client.clone(), pairs.clone());
        tasks.spawn(async move {
            let key = format!("w2:{task}");
            while start.elapsed() < window {
                let guard = client.lock(&key).acquire().await.expect("acquire");
                guard.release().await.expect("release");
                pairs.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    pairs.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// Locks one W4 tick renews.
const W4_LOCKS: usize = 10_000;

/// What one W4 tick costs: round trip p50 and p99, and per tick the server's time in
/// scripts and the script calls (from `INFO commandstats`).
struct Tick {
    p50: Duration,
    p99: Duration,
    redis: Duration,
    calls: f64,
}

/// W4: one renewal call for [`W4_LOCKS`] held locks, as the watchdog makes it once per tick.
async fn w4<B: Backend>(client: &LockClient<B>, server: &RedisServer, window: Duration) -> Tick {
    let lease = Lease::fixed(Duration::from_secs(60));
    let mut guards = Vec::new();
    for i in 0..W4_LOCKS {
        let guard = client.lock(format!("w4:{i}")).lease(lease).acquire();
        guards.push(guard.await.expect("acquire"));
    }
    let renewals: Vec<Renew<'_>> = guards
        .iter()
        .map(|guard| Renew::hold(guard.key(), guard.holder().id(), lease, LockKind::Exclusive))
        .collect();
    let mut ticks = Vec::new();
    // Redis time is counted from here: the acquires above are not part of a tick.
    server.cmd(&["CONFIG", "RESETSTAT"]);
    let start = Instant::now();
    while start.elapsed() < window {
        let sent = Instant::now();
        let replies = client.backend().renew(&renewals).await.expect("renew");
        ticks.push(sent.elapsed());
        assert!(replies.iter().all(|reply| *reply == RenewReply::Renewed));
    }
    drop(renewals);
    let stats = server.info("commandstats").expect("INFO commandstats");
    for guard in guards {
        guard.release().await.expect("release");
    }
    let count = ticks.len() as f64;
    let usec = support::command_stat(&stats, "evalsha", "usec");
    let calls = support::command_stat(&stats, "evalsha", "calls");
    ticks.sort_unstable();
    let at = |q: f64| ticks[((ticks.len() - 1) as f64 * q) as usize];
    Tick {
        p50: at(0.5),
        p99: at(0.99),
        redis: Duration::from_secs_f64(usec as f64 / 1e6 / count),
        calls: calls as f64 / count,
    }
}

/// Operations per second of 16 tasks doing 95 % reads and 5 % writes of one resource, each
/// holding it about 100 µs; with a read-write lock, or with the plain lock for both.
async fn read_heavy<B: Backend>(client: &LockClient<B>, window: Duration, read_write: bool) -> f64 {
    let ops = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..16u64 {
        let (client, ops) = (client.clone(), ops.clone());
        tasks.spawn(async move {
            let mut n = task;
            while start.elapsed() < window {
                n += 1;
                let write = n % 20 == 0;
                let rw = client.read_write_lock("rw");
                let request = match (read_write, write) {
                    (true, true) => rw.write(),
                    (true, false) => rw.read(),
                    (false, _) => client.lock("rw-plain"),
                };
                let guard = request
                    .wait(Duration::from_secs(30))
                    .acquire()
                    .await
                    .expect("acquire");
                spin(Duration::from_micros(100));
                guard.release().await.expect("release");
                ops.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    ops.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// Busy work standing in for reading the resource (a timer would round up to a millisecond).
fn spin(duration: Duration) {
    let start = Instant::now();
    while start.elapsed() < duration {
        std::hint::spin_loop();
    }
}
