//! A payment endpoint on two instances (two axum servers in this process, sharing one lock
//! store and one answer store) and a client that gives up waiting for its first attempt and
//! sends the payment again, with the same idempotency key, to the other instance. Behind a
//! plain `LockLayer` the retry waits for the first attempt's lock, then charges the card a
//! second time; behind `IdempotencyLayer` it is told to come back (409, `Retry-After`) and then
//! gets the first attempt's answer: one charge.
//!
//! ```text
//! cargo run --example idempotency --features idempotency,axum                                  # in memory
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example idempotency --features idempotency,axum # Redis
//! ```
//!
//! The servers let a request finish after its client left (a small layer runs each request on
//! a task of its own): the card is charged and the answer kept even though the first attempt's
//! client is gone. Without that, hyper drops a handler whose client left, and a handler
//! dropped after it charged keeps no answer: its retry charges again (see "What is promised"
//! in the `idempotency` guide).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    Router,
    extract::{Path, Request, State},
    http::StatusCode,
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::post,
};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use tower_lock::{
    Backend, LockClient, LockLayer, MemoryBackend, RedisBackend,
    idempotency::{
        AnswerStore, FencingBackend, IdempotencyLayer, MemoryAnswerStore, RedisAnswerStore,
    },
    key,
};

#[path = "common/logs.rs"]
mod logs;

/// How long the card network takes to confirm a charge.
const CONFIRMATION: Duration = Duration::from_millis(250);
/// How long the client waits for its first attempt.
const FIRST_TIMEOUT: Duration = Duration::from_millis(100);

/// The card network: charges made, per order.
#[derive(Clone, Default)]
struct Cards {
    charges: Arc<Mutex<HashMap<String, u32>>>,
}

/// Charges the order's card, then waits for the network's confirmation.
async fn pay(State(cards): State<Cards>, Path(order): Path<String>) -> Response {
    let charge = {
        let mut charges = cards.charges.lock().unwrap();
        let count = charges.entry(order.clone()).or_insert(0);
        *count += 1;
        *count
    };
    tokio::time::sleep(CONFIRMATION).await;
    let body = format!("{{\"order\":\"{order}\",\"charge\":{charge}}}");
    (StatusCode::CREATED, body).into_response()
}

/// Runs each request on a task of its own, so that it finishes after its client left.
async fn run_to_completion(request: Request, next: Next) -> Response {
    match tokio::spawn(next.run(request)).await {
        Ok(response) => response,
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// What stands in front of the endpoint.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Guard {
    /// A `LockLayer` on the order: one attempt at a time, each of them charging.
    Lock,
    /// An `IdempotencyLayer`: one charge per key.
    Idempotency,
}

/// One instance's stores: its lock client and its answer store.
struct Instance<B: Backend, S> {
    locks: LockClient<B>,
    answers: S,
}

fn app<B, S>(guard: Guard, instance: Instance<B, S>, cards: Cards) -> Router
where
    B: FencingBackend,
    S: AnswerStore,
{
    let router = Router::new().route("/orders/{order}/pay", post(pay));
    let router = match guard {
        Guard::Lock => router.route_layer(
            LockLayer::new(instance.locks)
                .key(key::path_param("order").prefixed("order:"))
                .wait(Duration::from_secs(30)),
        ),
        Guard::Idempotency => router.route_layer(
            IdempotencyLayer::builder(instance.locks, instance.answers)
                .required(true)
                .ttl(Duration::from_secs(60)) // a demo's keys need not be kept for a day
                .build()
                .expect("valid settings"),
        ),
    };
    router.layer(middleware::from_fn(run_to_completion)).with_state(cards)
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    logs::show();
    logs::exit(start().await)
}

/// Runs the demo on Redis when `REDIS_URL` is set, else in memory.
async fn start() -> Result<(), Box<dyn std::error::Error>> {
    match std::env::var("REDIS_URL") {
        Ok(url) => {
            println!("stores: Redis at {url}, one connection pool per instance");
            for guard in [Guard::Lock, Guard::Idempotency] {
                let mut instances = Vec::new();
                for _ in 0..2 {
                    let backend = RedisBackend::connect(&url).await?;
                    let locks = LockClient::builder(backend.clone()).build()?;
                    let answers = RedisAnswerStore::new(backend);
                    instances.push(Instance { locks, answers });
                }
                run(guard, instances).await?;
            }
        }
        Err(_) => {
            println!("stores: in memory, shared by both instances (set REDIS_URL to use Redis)");
            for guard in [Guard::Lock, Guard::Idempotency] {
                let (backend, answers) = (MemoryBackend::new(), MemoryAnswerStore::new());
                let instances = (0..2)
                    .map(|_| {
                        let locks = LockClient::builder(backend.clone()).build()?;
                        let answers = answers.clone();
                        Ok(Instance { locks, answers })
                    })
                    .collect::<Result<Vec<_>, tower_lock::ConfigError>>()?;
                run(guard, instances).await?;
            }
        }
    }
    Ok(())
}

async fn run<B, S>(
    guard: Guard,
    instances: Vec<Instance<B, S>>,
) -> Result<(), Box<dyn std::error::Error>>
where
    B: FencingBackend,
    S: AnswerStore,
{
    println!(
        "{}",
        match guard {
            Guard::Lock => "\nbehind a plain LockLayer on the order:",
            Guard::Idempotency => "\nbehind IdempotencyLayer:",
        }
    );
    let cards = Cards::default();
    let mut bases = Vec::new();
    for instance in instances {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        bases.push(format!("http://{}", listener.local_addr()?));
        let service = app(guard, instance, cards.clone());
        tokio::spawn(async move { axum::serve(listener, service).await });
    }

    // One payment, one key, whichever attempt carries it (a fresh one per run: answers on a
    // shared Redis outlive the demo).
    let order = "42";
    let payment_key = format!("pay-order-42-{}", uuid::Uuid::new_v4());
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let started = Instant::now();
    let mut timeout = FIRST_TIMEOUT;
    for attempt in 1..=10 {
        let instance = ["a", "b"][(attempt - 1) % 2];
        let request =
            http::Request::post(format!("{}/orders/{order}/pay", bases[(attempt - 1) % 2]))
                .header("idempotency-key", &payment_key)
                .header("authorization", "Bearer shop-7")
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from_static(b"{\"amount\":4200}")))?;
        let outcome = tokio::time::timeout(timeout, async {
            let response = client.request(request).await?;
            let (parts, body) = response.into_parts();
            let body = body.collect().await?.to_bytes();
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>((parts, body))
        })
        .await;
        let at = started.elapsed().as_millis();
        let Ok(outcome) = outcome else {
            println!(
                "  {at:>5} ms  attempt {attempt} -> instance {instance}: no answer within {timeout:?}, sending it again"
            );
            timeout = Duration::from_secs(5);
            continue;
        };
        let (parts, body) = outcome.map_err(|error| error.to_string())?;
        let replayed = parts.headers.contains_key("idempotent-replayed");
        let text = String::from_utf8_lossy(&body);
        println!(
            "  {at:>5} ms  attempt {attempt} -> instance {instance}: {} {}{}",
            parts.status.as_u16(),
            text.trim_end(),
            if replayed { " (replayed)" } else { "" }
        );
        if parts.status.is_success() {
            break;
        }
        // 409 (the first attempt still runs) or 503 (a store that just started): come back
        // when told.
        let after = parts
            .headers
            .get("retry-after")
            .and_then(|value| value.to_str().ok()?.parse().ok())
            .unwrap_or(1);
        tokio::time::sleep(Duration::from_secs(after)).await;
    }
    // Let any attempt still running finish, then count.
    tokio::time::sleep(CONFIRMATION * 2).await;
    let charges = cards.charges.lock().unwrap().get(order).copied().unwrap_or(0);
    println!("  order {order} was charged {charges} time{}", if charges == 1 { "" } else { "s" });
    Ok(())
}
