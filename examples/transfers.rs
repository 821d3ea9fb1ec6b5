//! Transfers between accounts: `POST /transfers {"from": 3, "to": 7, "amount": 5}` must hold
//! both accounts' locks. Many concurrent clients send random transfers among 20 accounts over
//! HTTP, three times:
//!
//! 1. without a lock: concurrent read-modify-writes of one account lose updates, and the total
//!    of all balances changes;
//! 2. one lock at a time, in the request's order (a `LockLayer` on `from`, inside it one on
//!    `to`): opposite transfers (3 → 7 while 7 → 3) each hold one account and wait for the
//!    other until their waits run out, answered 423;
//! 3. both locks as one set (`key::all` here, or `#[locked(keys = [...])]` with feature
//!    `macros`): taken in one canonical order, so opposite transfers cannot deadlock; the total
//!    is kept and no wait times out.
//!
//! The request body is JSON; a lock key extractor sees only the request head, so a small
//! middleware in front of the lock layer decodes the body into the request's extensions, where
//! the key extractor finds the accounts. (With `#[locked(keys = ["account:{t.from}",
//! "account:{t.to}"])]` on the handler, its `Json(t)` binding does this by itself.)
//!
//! ```text
//! cargo run --example transfers                                    # in-memory locks
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example transfers   # Redis
//! ```
//!
//! Exits with an error if the run with the set of locks loses money or has a wait time out. A
//! Redis server that started less than a lease (30 s) ago grants no lock yet (its quarantine,
//! see the `failover` guide): start the demo after that.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    Json, Router,
    body::{Body, to_bytes},
    extract::{Request, State},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::post,
};
use http::StatusCode;
use serde::Deserialize;
use tower_lock::{Backend, LockClient, LockLayer, MemoryBackend, RedisBackend, key};

#[path = "common/http_client.rs"]
mod client;
#[path = "common/logs.rs"]
mod logs;

const ACCOUNTS: u64 = 20;
const START_BALANCE: i64 = 1_000;
const CLIENTS: u64 = 32;
const TRANSFERS_PER_CLIENT: u64 = 25;

#[derive(Clone, Copy, Debug, Deserialize)]
struct Transfer {
    from: u64,
    to: u64,
    amount: i64,
}

/// Balances in a store that, like a real database, reads and writes in separate steps.
#[derive(Clone)]
struct Bank {
    balances: Arc<Mutex<HashMap<u64, i64>>>,
}

impl Bank {
    fn new() -> Self {
        let balances = (0..ACCOUNTS).map(|id| (id, START_BALANCE)).collect();
        Self { balances: Arc::new(Mutex::new(balances)) }
    }

    fn read(&self, account: u64) -> i64 {
        self.balances.lock().unwrap()[&account]
    }

    fn write(&self, account: u64, balance: i64) {
        self.balances.lock().unwrap().insert(account, balance);
    }

    fn total(&self) -> i64 {
        self.balances.lock().unwrap().values().sum()
    }
}

/// Reads both balances, does some work, writes both back.
async fn transfer(State(bank): State<Bank>, Json(t): Json<Transfer>) -> StatusCode {
    let (from, to) = (bank.read(t.from), bank.read(t.to));
    tokio::time::sleep(Duration::from_millis(2)).await;
    bank.write(t.from, from - t.amount);
    bank.write(t.to, to + t.amount);
    StatusCode::OK
}

/// Decodes the JSON body into the request's extensions (and puts the body back), so that the
/// lock layers' key extractors can read the accounts.
async fn decode_transfer(request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    let Ok(bytes) = to_bytes(body, 64 * 1024).await else {
        return StatusCode::PAYLOAD_TOO_LARGE.into_response();
    };
    match serde_json::from_slice::<Transfer>(&bytes) {
        Ok(transfer) if transfer.from != transfer.to => {
            parts.extensions.insert(transfer);
        }
        _ => return StatusCode::UNPROCESSABLE_ENTITY.into_response(),
    }
    next.run(Request::from_parts(parts, Body::from(bytes))).await
}

/// The account named by one side of the decoded transfer.
fn account(side: fn(&Transfer) -> u64) -> impl Fn(&http::request::Parts) -> Option<String> + Clone {
    move |parts| parts.extensions.get::<Transfer>().map(|t| side(t).to_string())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Locking {
    None,
    OneByOne,
    Set,
}

fn app<B: Backend>(bank: Bank, locks: &LockClient<B>, locking: Locking) -> Router {
    let route = Router::new().route("/transfers", post(transfer));
    let route = match locking {
        Locking::None => route,
        Locking::OneByOne => route
            // The inner layer runs second: `to` is locked while `from` is held.
            .route_layer(
                LockLayer::new(locks.clone())
                    .key(key::from_fn(account(|t| t.to)).prefixed("account:"))
                    .wait(Duration::from_millis(200)),
            )
            .route_layer(
                LockLayer::new(locks.clone())
                    .key(key::from_fn(account(|t| t.from)).prefixed("account:"))
                    .wait(Duration::from_millis(200)),
            ),
        Locking::Set => route.route_layer(
            LockLayer::new(locks.clone())
                .key(
                    key::all([key::from_fn(account(|t| t.from)), key::from_fn(account(|t| t.to))])
                        .prefixed("account:"),
                )
                .wait(Duration::from_secs(30)),
        ),
    };
    route.route_layer(middleware::from_fn(decode_transfer)).with_state(bank)
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
            println!("locks: Redis at {url}");
            let backend = RedisBackend::connect(&url).await?;
            run(LockClient::builder(backend).build()?).await
        }
        Err(_) => {
            println!("locks: in memory (set REDIS_URL to use Redis)");
            run(LockClient::builder(MemoryBackend::new()).build()?).await
        }
    }
}

/// What one run saw.
#[derive(Debug, Default)]
struct Outcome {
    done: u64,
    timed_out: u64,
    other: u64,
}

async fn run<B: Backend>(locks: LockClient<B>) -> Result<(), Box<dyn std::error::Error>> {
    let expected = START_BALANCE * ACCOUNTS as i64;
    let mut failed = false;
    for locking in [Locking::None, Locking::OneByOne, Locking::Set] {
        let bank = Bank::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/transfers", listener.local_addr()?);
        let service = app(bank.clone(), &locks, locking);
        let server = tokio::spawn(async move { axum::serve(listener, service).await });

        let started = Instant::now();
        let http = client::Client::new();
        let mut clients = tokio::task::JoinSet::new();
        for c in 0..CLIENTS {
            let (http, url) = (http.clone(), url.clone());
            clients.spawn(async move {
                let mut rng = Rng(c + 1);
                let mut outcome = Outcome::default();
                for _ in 0..TRANSFERS_PER_CLIENT {
                    let from = rng.below(ACCOUNTS);
                    let to = (from + 1 + rng.below(ACCOUNTS - 1)) % ACCOUNTS;
                    let amount = 1 + rng.below(50);
                    let body = format!(r#"{{"from":{from},"to":{to},"amount":{amount}}}"#);
                    match http.post_json(&url, body).await {
                        Ok(200) => outcome.done += 1,
                        Ok(423) => outcome.timed_out += 1,
                        _ => outcome.other += 1,
                    }
                }
                outcome
            });
        }
        let mut outcome = Outcome::default();
        while let Some(one) = clients.join_next().await {
            let one = one?;
            outcome.done += one.done;
            outcome.timed_out += one.timed_out;
            outcome.other += one.other;
        }
        let elapsed = started.elapsed();
        server.abort();

        let total = bank.total();
        let label = match locking {
            Locking::None => "without a lock         ",
            Locking::OneByOne => "one lock at a time     ",
            Locking::Set => "both locks as one set  ",
        };
        println!(
            "{label}: total {expected} -> {total} ({}), {} transfers done, {} waits timed out \
             (423), {} other failures, in {elapsed:.2?}",
            if total == expected { "kept" } else { "BROKEN" },
            outcome.done,
            outcome.timed_out,
            outcome.other,
        );
        if locking == Locking::Set && (total != expected || outcome.timed_out + outcome.other > 0) {
            failed = true;
        }
    }
    if failed {
        return Err("the set of locks did not keep the total, or a wait timed out".into());
    }
    Ok(())
}

/// A small seedable generator (SplitMix64): the same transfers on every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % n
    }
}
