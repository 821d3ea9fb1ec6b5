//! An axum service with a withdraw endpoint, hit by many concurrent requests on one account:
//! once without `LockLayer` (read-modify-write races lose updates) and once with it (every
//! withdrawal counted), while requests on other accounts run in parallel.
//!
//! ```text
//! cargo run --example quickstart --features axum                                  # in-memory locks
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example quickstart --features axum # Redis
//! ```

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    Router,
    extract::{Path, State},
    routing::post,
};
use tower_lock::{Backend, LockClient, LockLayer, MemoryBackend, RedisBackend, key};

#[path = "common/http_client.rs"]
mod client;
#[path = "common/logs.rs"]
mod logs;

const START_BALANCE: i64 = 1_000;
const WITHDRAWALS: i64 = 200;

/// Balances in a store that, like a real database, reads and writes in separate steps.
#[derive(Clone, Default)]
struct Bank {
    balances: Arc<Mutex<HashMap<String, i64>>>,
}

impl Bank {
    fn read(&self, account: &str) -> i64 {
        *self.balances.lock().unwrap().entry(account.to_owned()).or_insert(START_BALANCE)
    }

    fn write(&self, account: &str, balance: i64) {
        self.balances.lock().unwrap().insert(account.to_owned(), balance);
    }
}

/// Withdraws 1: read the balance, do some work, write it back.
async fn withdraw(State(bank): State<Bank>, Path(id): Path<String>) -> String {
    let balance = bank.read(&id);
    tokio::time::sleep(Duration::from_millis(2)).await;
    bank.write(&id, balance - 1);
    (balance - 1).to_string()
}

fn app<B: Backend>(bank: Bank, locks: Option<LockClient<B>>) -> Router {
    let router = Router::new().route("/accounts/{id}/withdraw", post(withdraw));
    let router = match locks {
        Some(locks) => router.route_layer(
            LockLayer::new(locks)
                .key(key::path_param("id").prefixed("account:")) // the lock "account:<id>"
                .wait(Duration::from_secs(30)),
        ),
        None => router,
    };
    router.with_state(bank)
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

async fn run<B: Backend>(locks: LockClient<B>) -> Result<(), Box<dyn std::error::Error>> {
    for locked in [false, true] {
        let bank = Bank::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        let service = app(bank.clone(), locked.then(|| locks.clone()));
        let server = tokio::spawn(async move { axum::serve(listener, service).await });

        let http = client::Client::new();
        let started = Instant::now();
        let mut requests = tokio::task::JoinSet::new();
        for i in 0..WITHDRAWALS {
            // Most requests hit account "hot"; every fifth goes to one of 10 other accounts.
            let account = if i % 5 == 0 { format!("other-{}", i % 10) } else { "hot".to_owned() };
            let (http, url) = (http.clone(), format!("{base}/accounts/{account}/withdraw"));
            requests.spawn(async move { http.post(&url).await });
        }
        while let Some(status) = requests.join_next().await {
            let status = status?.map_err(|e| e.to_string())?;
            assert_eq!(status, 200);
        }
        let elapsed = started.elapsed();
        server.abort();

        let hot_requests = WITHDRAWALS - WITHDRAWALS / 5;
        let hot = bank.read("hot");
        let lost = hot - (START_BALANCE - hot_requests);
        println!(
            "{}: {hot_requests} withdrawals from account hot -> balance {hot} (expected {}), {lost} lost updates; {WITHDRAWALS} requests in {elapsed:?}",
            if locked { "with LockLayer   " } else { "without LockLayer" },
            START_BALANCE - hot_requests,
        );
    }
    Ok(())
}
