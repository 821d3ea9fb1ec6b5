//! The layer's own cost per request, in one process and on one thread: an axum deposit route
//! called through `tower::ServiceExt` (no sockets, no Redis), with no lock, with `LockLayer` on
//! the in-memory backend, and with the middleware one writes for a single process instead: a
//! `from_fn` taking a per-account `tokio::sync::Mutex` from a map. Nanoseconds per request,
//! each variant run once per repetition in a rotating order.
//!
//! ```text
//! cargo bench --bench layer --features axum
//! BENCH_REQUESTS=50000 BENCH_REPS=3 cargo bench --bench layer --features axum
//! BENCH_ONLY=layer cargo bench --bench layer --features axum   # one variant, for a profiler
//! ```

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Instant,
};

use axum::{
    Router,
    body::Body,
    extract::{Path, Request, State},
    middleware::{self, Next},
    response::Response,
    routing::post,
};
use tower::{Service, ServiceExt};
use tower_lock::{LockClient, LockLayer, key};

/// Accounts the requests spread over, in turn.
const ACCOUNTS: usize = 1000;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    NoLock,
    Layer,
    Mutexes,
}

impl Variant {
    const ALL: [Self; 3] = [Self::NoLock, Self::Layer, Self::Mutexes];

    /// Its tag in `BENCH_ONLY`.
    fn tag(self) -> &'static str {
        match self {
            Self::NoLock => "none",
            Self::Layer => "layer",
            Self::Mutexes => "mutex",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::NoLock => "no lock",
            Self::Layer => "LockLayer memory",
            Self::Mutexes => "from_fn + Mutex map",
        }
    }
}

async fn deposit(Path(id): Path<String>) -> String {
    id
}

fn routes() -> Router {
    Router::new().route("/accounts/{id}/deposit", post(deposit))
}

/// One `tokio::sync::Mutex` per account, made on first use.
#[derive(Clone, Default)]
struct Mutexes(Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>);

async fn with_mutex(
    State(mutexes): State<Mutexes>,
    Path(id): Path<String>,
    request: Request,
    next: Next,
) -> Response {
    let mutex = {
        let mut map = mutexes.0.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(id).or_default().clone()
    };
    let _held = mutex.lock().await;
    next.run(request).await
}

fn app(variant: Variant) -> Router {
    match variant {
        Variant::NoLock => routes(),
        Variant::Layer => routes().route_layer(
            LockLayer::new(LockClient::in_memory()).key(key::path_param("id").prefixed("account:")),
        ),
        Variant::Mutexes => routes().route_layer(middleware::from_fn_with_state(
            Mutexes::default(),
            with_mutex,
        )),
    }
}

/// Nanoseconds per request over `requests` sequential requests, after a warm-up.
async fn run(variant: Variant, requests: usize) -> Result<f64, String> {
    // `with_state` turns each handler into its route once, as `axum::serve` does: without it,
    // every request would build its route (and the middleware's service) anew.
    let mut service = app(variant).with_state(()).into_service::<Body>();
    let uris: Vec<String> = (0..requests)
        .map(|i| format!("/accounts/{}/deposit", i % ACCOUNTS))
        .collect();
    let mut call = async |uri: &str| -> Result<(), String> {
        let request = axum::http::Request::post(uri)
            .body(Body::empty())
            .map_err(|e| e.to_string())?;
        let ready = service.ready().await.map_err(|e| e.to_string())?;
        let response = ready.call(request).await.map_err(|e| e.to_string())?;
        if !response.status().is_success() {
            return Err(format!("{uri}: {}", response.status()));
        }
        Ok(())
    };
    for uri in uris.iter().take(ACCOUNTS) {
        call(uri).await?;
    }
    let started = Instant::now();
    for uri in &uris {
        call(uri).await?;
    }
    Ok(started.elapsed().as_nanos() as f64 / requests as f64)
}

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(default)
        .max(1)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let requests = env_number("BENCH_REQUESTS", 200_000);
    let reps = env_number("BENCH_REPS", 5);
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let variants: Vec<Variant> = Variant::ALL
        .into_iter()
        .filter(|v| only.is_empty() || only.split(',').any(|tag| tag.trim() == v.tag()))
        .collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    println!("{requests} requests per run, {reps} repetitions, one thread");
    let mut times: HashMap<&str, Vec<f64>> = HashMap::new();
    runtime.block_on(async {
        for rep in 0..reps {
            let mut order = variants.clone();
            let turn = rep % order.len().max(1);
            order.rotate_left(turn);
            for variant in order {
                match run(variant, requests).await {
                    Ok(ns) => times.entry(variant.name()).or_default().push(ns),
                    Err(error) => println!("  {} rep {rep}: {error}", variant.name()),
                }
            }
        }
    });
    let none = times
        .get(Variant::NoLock.name())
        .map(|t| median(&mut t.clone()));
    println!(
        "  {:<22} {:>12} {:>16} {:>14}",
        "", "ns/request", "over no lock", "min–max"
    );
    for variant in Variant::ALL {
        let Some(runs) = times.get_mut(variant.name()) else {
            continue;
        };
        let ns = median(runs);
        let (min, max) = (runs[0], runs[runs.len() - 1]);
        let over = none.map_or(String::from("-"), |none| format!("+{:.0} ns", ns - none));
        println!(
            "  {:<22} {:>12.0} {:>16} {:>14}",
            variant.name(),
            ns,
            over,
            format!("{min:.0}–{max:.0}")
        );
    }
}
