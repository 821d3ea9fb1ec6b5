//! Latency of one request at a time over loopback HTTP (an axum server and a hyper client in
//! this process, one kept-alive connection) to a payment route: with no layer, with
//! `LockLayer` on Redis, and with `IdempotencyLayer` on Redis for a fresh key per request and
//! for a replay (one key, answered once, then replayed); the idempotency rows again on the
//! in-memory stores, for the layer's own cost. Each variant runs once per repetition, in a
//! rotating order; the figures are the medians over the repetitions of each one's p50 and p99,
//! beside the Redis `PING` round trip measured at the start.
//!
//! ```text
//! cargo bench --bench idempotency --features idempotency,axum
//! BENCH_SECS=1 BENCH_REPS=5 cargo bench --bench idempotency --features idempotency,axum
//! BENCH_ONLY=none,fresh cargo bench --bench idempotency --features idempotency,axum
//! ```

mod common;
#[path = "common/measure.rs"]
mod measure;
#[path = "../tests/support/mod.rs"]
mod support;

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use axum::{Router, extract::Path, routing::post};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use measure::{quantile, rotated, us};
use support::RedisServer;
use tower_lock::{
    LockClient, LockLayer, MemoryBackend,
    idempotency::{IdempotencyLayer, MemoryAnswerStore, RedisAnswerStore},
    key,
};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Variant {
    None,
    Lock,
    Fresh,
    Replay,
    FreshMemory,
    ReplayMemory,
}

impl Variant {
    const ALL: [Self; 6] =
        [Self::None, Self::Lock, Self::Fresh, Self::Replay, Self::FreshMemory, Self::ReplayMemory];

    fn tag(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Lock => "lock",
            Self::Fresh => "fresh",
            Self::Replay => "replay",
            Self::FreshMemory => "fresh-memory",
            Self::ReplayMemory => "replay-memory",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::None => "no layer",
            Self::Lock => "LockLayer, Redis",
            Self::Fresh => "IdempotencyLayer, Redis, fresh key",
            Self::Replay => "IdempotencyLayer, Redis, replay",
            Self::FreshMemory => "IdempotencyLayer, memory, fresh key",
            Self::ReplayMemory => "IdempotencyLayer, memory, replay",
        }
    }

    fn selected(self) -> bool {
        match std::env::var("BENCH_ONLY") {
            Ok(only) if !only.trim().is_empty() => {
                only.split(',').any(|tag| tag.trim() == self.tag())
            }
            _ => true,
        }
    }
}

async fn pay(Path(order): Path<String>) -> String {
    format!("{{\"order\":\"{order}\",\"charge\":\"ch_1\"}}")
}

/// The route behind `variant`'s layer, on fresh clients of the Redis at `url`.
async fn app(variant: Variant, url: &str) -> Router {
    let routes = Router::new().route("/orders/{order}/pay", post(pay));
    let redis = || async {
        let backend = support::redis_backend(url).connect().await.expect("connect");
        let locks = LockClient::builder(backend.clone()).build().expect("client");
        (locks, RedisAnswerStore::new(backend))
    };
    match variant {
        Variant::None => routes,
        Variant::Lock => routes.route_layer(
            LockLayer::new(redis().await.0).key(key::path_param("order").prefixed("order:")),
        ),
        Variant::Fresh | Variant::Replay => {
            let (locks, answers) = redis().await;
            routes.route_layer(IdempotencyLayer::new(locks, answers))
        }
        Variant::FreshMemory | Variant::ReplayMemory => {
            let locks = LockClient::builder(MemoryBackend::new()).build().expect("client");
            routes.route_layer(IdempotencyLayer::new(locks, MemoryAnswerStore::new()))
        }
    }
}

/// Keys unique to the process, so that no run replays another's answer.
static NEXT_KEY: AtomicU64 = AtomicU64::new(0);

/// The latencies of requests sent one at a time for `window`, after a warm-up.
async fn run(variant: Variant, url: &str, window: Duration) -> Vec<Duration> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let service = app(variant, url).await;
    let server = tokio::spawn(async move { axum::serve(listener, service).await });
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let replay_key = format!("replay-{}", NEXT_KEY.fetch_add(1, Ordering::Relaxed));
    let send = async |i: u64| {
        // A replay is the same request again; the others spread over 1 000 orders.
        let (key, order) = match variant {
            Variant::Replay | Variant::ReplayMemory => (replay_key.clone(), 0),
            _ => (format!("fresh-{}", NEXT_KEY.fetch_add(1, Ordering::Relaxed)), i % 1000),
        };
        let request = http::Request::post(format!("{base}/orders/{order}/pay"))
            .header("idempotency-key", key)
            .header("authorization", "Bearer shop-7")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(b"{\"amount\":4200}")))
            .unwrap();
        let response = client.request(request).await.expect("a response");
        let status = response.status();
        let _ = response.into_body().collect().await.expect("the body");
        assert!(status.is_success(), "{variant:?}: {status}");
    };
    for i in 0..200 {
        send(i).await;
    }
    let mut latencies = Vec::new();
    let started = Instant::now();
    let mut i = 0;
    while started.elapsed() < window {
        let sent = Instant::now();
        send(i).await;
        latencies.push(sent.elapsed());
        i += 1;
    }
    server.abort();
    latencies.sort();
    latencies
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let server = RedisServer::start();
    let url = server.url();
    let runtime = common::runtime();
    let window = common::window();
    let reps = measure::reps(3);
    let variants: Vec<Variant> = Variant::ALL.into_iter().filter(|v| v.selected()).collect();
    let rtt = runtime.block_on(common::ping_rtt(&url));
    println!(
        "one request at a time over loopback HTTP, {} s windows, {reps} repetitions; Redis PING {:.0} µs",
        window.as_secs_f64(),
        us(rtt)
    );
    let mut p50s = vec![Vec::new(); variants.len()];
    let mut p99s = vec![Vec::new(); variants.len()];
    let mut counts = vec![0usize; variants.len()];
    for rep in 0..reps {
        for variant in rotated(&variants, rep) {
            let latencies = runtime.block_on(run(variant, &url, window));
            let at = variants.iter().position(|v| *v == variant).unwrap();
            p50s[at].push(us(quantile(&latencies, 0.5)));
            p99s[at].push(us(quantile(&latencies, 0.99)));
            counts[at] += latencies.len();
        }
    }
    let base =
        variants.iter().position(|v| *v == Variant::None).map(|at| median(&mut p50s[at].clone()));
    println!(
        "{:<38} {:>9} {:>9} {:>14} {:>10}",
        "", "p50 µs", "p99 µs", "p50 over none", "requests"
    );
    for (at, variant) in variants.iter().enumerate() {
        let p50 = median(&mut p50s[at]);
        let p99 = median(&mut p99s[at]);
        let over = base.map_or_else(String::new, |base| {
            format!("{:+.0} ({:+.1} RTT)", p50 - base, (p50 - base) / us(rtt))
        });
        println!("{:<38} {p50:>9.0} {p99:>9.0} {over:>14} {:>10}", variant.name(), counts[at]);
    }
}
