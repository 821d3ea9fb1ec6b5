//! HTTP load through `LockLayer` on an axum route, against a Redis server this bench starts.
//!
//! ```text
//! cargo bench --bench http --all-features               # 5 s per configuration
//! BENCH_SECS=1 cargo bench --bench http --all-features  # quicker
//! ```
//!
//! (a) no layer, (b) layer + memory backend, (c) layer + Redis with a key per client task,
//! (d) layer + Redis with one hot key. 32 client tasks keep one request each in flight over
//! loopback (throughput at saturation: on a 2-core machine the load generator, the server and
//! Redis share the cores). Then (a) and (c) again with one request at a time, for the latency
//! the layer adds, in Redis round trips measured in the same run.

mod common;
#[path = "../tests/support/mod.rs"]
mod support;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use axum::{Router, routing::post};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use tower_lock::{Backend, LockClient, LockLayer, MemoryBackend, key};

const TASKS: usize = 32;

fn main() {
    let window = common::window();
    let runtime = common::runtime();
    let server = support::RedisServer::start();
    runtime.block_on(async {
        let rtt = common::ping_rtt(&server.url()).await;
        println!(
            "redis PING round trip: {:.1} µs (median)",
            rtt.as_secs_f64() * 1e6
        );
        println!("{TASKS} requests in flight:");
        let redis = || async {
            let backend = support::redis_backend(server.url())
                .connect()
                .await
                .expect("connect");
            LockClient::builder(backend).build().expect("client")
        };
        let memory = LockClient::builder(MemoryBackend::new())
            .build()
            .expect("client");

        let a = load(app::<MemoryBackend>(None), false, window, TASKS).await;
        let b = load(app(Some(memory)), false, window, TASKS).await;
        let c = load(app(Some(redis().await)), false, window, TASKS).await;
        let d = load(app(Some(redis().await)), true, window, TASKS).await;
        println!("(a) no layer                 {}", a.line());
        println!(
            "(b) layer, memory            {}   (b)/(a) = {:.2}",
            b.line(),
            b.rate / a.rate
        );
        println!(
            "(c) layer, Redis, own keys   {}   (c)/(a) = {:.2}",
            c.line(),
            c.rate / a.rate
        );
        println!("(d) layer, Redis, one key    {}", d.line());
        let a1 = load(app::<MemoryBackend>(None), false, window, 1).await;
        let c1 = load(app(Some(redis().await)), false, window, 1).await;
        println!("one request at a time:");
        println!("(a) no layer                 {}", a1.line());
        println!("(c) layer, Redis             {}", c1.line());
        let added = c1.p50.saturating_sub(a1.p50);
        println!(
            "(c) adds {:.0} µs at p50 over (a) = {:.2} Redis round trips",
            added.as_secs_f64() * 1e6,
            added.as_secs_f64() / rtt.as_secs_f64()
        );
    });
}

fn app<B: Backend>(locks: Option<LockClient<B>>) -> Router {
    let router = Router::new().route("/r/{id}", post(|| async { "ok" }));
    match locks {
        Some(locks) => router.route_layer(
            LockLayer::new(locks)
                .key(key::path_param("id"))
                .wait(Duration::from_secs(30)),
        ),
        None => router,
    }
}

struct Load {
    rate: f64,
    p50: Duration,
    p99: Duration,
}

impl Load {
    fn line(&self) -> String {
        format!(
            "{:>8.0} req/s  p50 {:>6.2} ms  p99 {:>6.2} ms",
            self.rate,
            self.p50.as_secs_f64() * 1e3,
            self.p99.as_secs_f64() * 1e3
        )
    }
}

/// Serves `app` on loopback and keeps `TASKS` requests in flight for `window`.
async fn load(app: Router, hot_key: bool, window: Duration, in_flight: usize) -> Load {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..in_flight {
        let (client, stop) = (client.clone(), stop.clone());
        let url = if hot_key {
            format!("{base}/r/hot")
        } else {
            format!("{base}/r/{task}")
        };
        tasks.spawn(async move {
            let mut latencies = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let sent = Instant::now();
                let request = http::Request::post(&url)
                    .body(Empty::new())
                    .expect("request");
                let response = client.request(request).await.expect("response");
                assert!(response.status().is_success(), "{}", response.status());
                let _ = response.into_body().collect().await;
                latencies.push(sent.elapsed());
            }
            latencies
        });
    }
    tokio::time::sleep(window).await;
    stop.store(true, Ordering::Relaxed);
    let mut latencies = Vec::new();
    while let Some(task) = tasks.join_next().await {
        latencies.extend(task.expect("load task"));
    }
    let elapsed = started.elapsed();
    server.abort();
    latencies.sort();
    let at = |p: f64| latencies[((latencies.len() - 1) as f64 * p) as usize];
    Load {
        rate: latencies.len() as f64 / elapsed.as_secs_f64(),
        p50: at(0.5),
        p99: at(0.99),
    }
}
