//! The engine's W1 and W3 workloads on each multi-node backend, next to a single Redis node in
//! the same run, with each figure's ratio to the single node (the machines these run on are
//! shared and noisy, so ratios travel better than absolute numbers).
//!
//! ```text
//! cargo bench --bench scale_out                          # 2 s per workload and backend
//! BENCH_SECS=1 cargo bench --bench scale_out             # quicker
//! cargo bench --bench scale_out --features cluster       # with a Redis Cluster row
//! ```
//!
//! - W1: one task, sequential acquire + release of one key: µs per pair.
//! - W3: one client, 16 tasks on one key: hand-offs/s and waits.
//! - W3b: four clients (as four processes) × 4 tasks on one key: hand-offs/s and waits.
//!
//! Every server runs on this machine, so a multi-node figure shows the cost of the protocol
//! (more commands, the slowest node's reply), not of a network.

mod common;
#[path = "../tests/support/mod.rs"]
mod support;
#[path = "common/workloads.rs"]
mod workloads;

use std::{future::Future, time::Duration};

use support::RedisServer;
#[cfg(feature = "cluster")]
use tower_lock::RedisBackend;
use tower_lock::{Backend, LockClient, LockKind};
use workloads::{Contention, contend, w1};

/// Nodes of the Redlock row.
const REDLOCK_NODES: usize = 5;

/// One backend's figures.
struct Row {
    name: &'static str,
    w1: Duration,
    w3: Contention,
    w3b: Contention,
}

fn main() {
    let window = common::window();
    let runtime = common::runtime();
    let single = RedisServer::start();
    let redlock: Vec<RedisServer> = (0..REDLOCK_NODES).map(|_| RedisServer::start()).collect();
    #[cfg(feature = "cluster")]
    let cluster = support::cluster::RedisCluster::start();
    runtime.block_on(async {
        let rtt = common::ping_rtt(&single.url()).await;
        println!("redis PING round trip: {:.1} µs (median of 2000)", rtt.as_secs_f64() * 1e6);
        println!();

        let single_url = single.url();
        let redlock_urls: Vec<String> = redlock.iter().map(RedisServer::url).collect();
        // One row per backend; the first is the baseline of the ratios.
        #[allow(unused_mut)]
        let mut rows = vec![
            measure("single node", window, || async {
                support::redis_backend(&single_url).connect().await.expect("connect")
            })
            .await,
            measure("redlock, 5 nodes", window, || async {
                support::redlock_backend(redlock_urls.iter().cloned())
                    .build()
                    .expect("Redlock configuration")
            })
            .await,
        ];
        #[cfg(feature = "cluster")]
        rows.push(
            measure("cluster, 3 masters + 3 replicas", window, || async {
                RedisBackend::cluster(cluster.urls())
                    .connect()
                    .await
                    .expect("connect to the cluster")
            })
            .await,
        );
        report(&rows, rtt);
    });
    drop((single, redlock));
}

/// Runs every workload on fresh clients of the backend `connect` makes.
async fn measure<B, F, Fut>(name: &'static str, window: Duration, connect: F) -> Row
where
    B: Backend,
    F: Fn() -> Fut,
    Fut: Future<Output = B>,
{
    let client = async || LockClient::builder(connect().await).build().expect("client");
    let w1 = w1(&client().await, window).await;
    let w3 = contend(&[client().await], 16, window, LockKind::Exclusive).await;
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(client().await);
    }
    let w3b = contend(&clients, 4, window, LockKind::Exclusive).await;
    Row { name, w1, w3, w3b }
}

fn report(rows: &[Row], rtt: Duration) {
    let Some(base) = rows.first() else {
        return;
    };
    for row in rows {
        println!("{}:", row.name);
        println!(
            "  W1  sequential pairs, 1 task:     {:>8.1} µs/pair = {:.2} RTT   ({:.2}x the {})",
            row.w1.as_secs_f64() * 1e6,
            row.w1.as_secs_f64() / rtt.as_secs_f64(),
            row.w1.as_secs_f64() / base.w1.as_secs_f64(),
            base.name
        );
        for (label, run, base_run) in [
            ("W3  1 client x 16 tasks, one key:", &row.w3, &base.w3),
            ("W3b 4 clients x 4 tasks, one key:", &row.w3b, &base.w3b),
        ] {
            println!(
                "  {label} {}   ({:.2}x the {})",
                run.line(rtt),
                run.handoffs_per_sec / base_run.handoffs_per_sec,
                base.name
            );
        }
    }
}
