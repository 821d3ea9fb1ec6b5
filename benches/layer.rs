//! The layer's own cost per request, in one process: an axum deposit route called through
//! `tower::ServiceExt` (no sockets, no Redis), with no lock, with `LockLayer` on the in-memory
//! backend, and with the middleware one writes for a single process instead: a `from_fn`
//! taking a per-account `tokio::sync::Mutex` from a map. Nanoseconds per request, each variant
//! run once per repetition in a rotating order. On one thread by default; with
//! `BENCH_THREADS=n`, n threads (each with a runtime of its own, sharing the router and its
//! lock client) send their own shares of the requests at once, on accounts apart so that no
//! request waits for another: what the threads share then shows. The figure is CPU time per
//! request (wall time × threads / requests).
//!
//! ```text
//! cargo bench --bench layer --features axum
//! BENCH_REQUESTS=50000 BENCH_REPS=3 cargo bench --bench layer --features axum
//! BENCH_ONLY=layer cargo bench --bench layer --features axum   # one variant, for a profiler
//! BENCH_THREADS=2 cargo bench --bench layer --features axum     # two threads at once
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
        Variant::Mutexes => {
            routes().route_layer(middleware::from_fn_with_state(Mutexes::default(), with_mutex))
        }
    }
}

/// CPU nanoseconds per request over `requests` requests: `threads` OS threads, each with a
/// runtime of its own, send their shares at once, after a warm-up.
fn run(variant: Variant, requests: usize, threads: usize) -> Result<f64, String> {
    // `with_state` turns each handler into its route once, as `axum::serve` does: without it,
    // every request would build its route (and the middleware's service) anew.
    let service = app(variant).with_state(()).into_service::<Body>();
    let share = requests / threads;
    let start = std::sync::Barrier::new(threads);
    let windows: Vec<Result<(Instant, Instant), String>> = std::thread::scope(|scope| {
        let senders: Vec<_> = (0..threads)
            .map(|thread| {
                let (service, start) = (service.clone(), &start);
                // Accounts `thread`, `thread + threads`, ...: no two threads share one.
                let uris: Vec<String> = (0..share)
                    .map(|i| format!("/accounts/{}/deposit", (i * threads + thread) % ACCOUNTS))
                    .collect();
                scope.spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| e.to_string())?;
                    runtime.block_on(send_all(service, uris, start))
                })
            })
            .collect();
        senders
            .into_iter()
            .map(|sender| sender.join().unwrap_or_else(|_| Err("a sender panicked".into())))
            .collect()
    });
    // From the first sender's start to the last one's end.
    let mut window: Option<(Instant, Instant)> = None;
    for sent in windows {
        let (began, ended) = sent?;
        window = Some(window.map_or((began, ended), |(b, e)| (b.min(began), e.max(ended))));
    }
    let (began, ended) = window.ok_or("no sender")?;
    let elapsed = ended.duration_since(began).as_nanos() as f64;
    Ok(elapsed * threads as f64 / (share * threads) as f64)
}

/// Sends `uris` one after another, after a warm-up and once every sender is ready.
async fn send_all(
    mut service: axum::routing::RouterIntoService<Body>,
    uris: Vec<String>,
    start: &std::sync::Barrier,
) -> Result<(Instant, Instant), String> {
    let mut call = async |uri: &str| -> Result<(), String> {
        let request =
            axum::http::Request::post(uri).body(Body::empty()).map_err(|e| e.to_string())?;
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
    // Every thread is warm before any starts: a plain barrier, as nothing else runs here.
    start.wait();
    let began = Instant::now();
    for uri in &uris {
        call(uri).await?;
    }
    Ok((began, Instant::now()))
}

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(default).max(1)
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
    let threads = env_number("BENCH_THREADS", 1);
    println!("{requests} requests per run, {reps} repetitions, {threads} thread(s)");
    let mut times: HashMap<&str, Vec<f64>> = HashMap::new();
    for rep in 0..reps {
        let mut order = variants.clone();
        let turn = rep % order.len().max(1);
        order.rotate_left(turn);
        for variant in order {
            match run(variant, requests, threads) {
                Ok(ns) => times.entry(variant.name()).or_default().push(ns),
                Err(error) => println!("  {} rep {rep}: {error}", variant.name()),
            }
        }
    }
    let none = times.get(Variant::NoLock.name()).map(|t| median(&mut t.clone()));
    println!("  {:<22} {:>12} {:>16} {:>14}", "", "ns/request", "over no lock", "min–max");
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
