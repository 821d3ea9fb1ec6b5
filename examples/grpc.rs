//! A gRPC bank (tonic) served by two instances on two ports that share one lock store: many
//! concurrent Withdraw and Deposit calls on a few accounts, spread over both instances, lose
//! updates without locks (read-modify-write races) and none with them. The locks are set per
//! method (`grpc::MethodLocks`): Withdraw by a `LockLayer` keyed by the `account-id` metadata,
//! Deposit in the method itself, keyed by the decoded message. Then calls that find their
//! account busy show the gRPC status, message and pushback a client gets, the same on both
//! paths.
//!
//! ```text
//! cargo run --example grpc --features tonic                                  # in-memory locks
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example grpc --features tonic # Redis
//! ```

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tonic::{Request, Response, Status};
use tower::Layer;
use tower_lock::{
    Backend, LockClient, LockLayer, MemoryBackend, RedisBackend,
    grpc::{MethodLockService, MethodLocks},
    key,
};

#[path = "common/bank.rs"]
mod bank;
#[path = "common/logs.rs"]
mod logs;

use bank::{Account, Balance, BalanceStream, Bank, BankClient, BankServer, Change, with_metadata};

const START_BALANCE: i64 = 1_000;
const ACCOUNTS: [&str; 3] = ["alice", "bob", "carol"];
const CALLS: usize = 300;

/// Balances in a store that, like a real database, reads and writes in separate steps; both
/// instances use it.
#[derive(Clone, Default)]
struct Ledger {
    balances: Arc<Mutex<HashMap<String, i64>>>,
}

impl Ledger {
    fn read(&self, account: &str) -> i64 {
        *self.balances.lock().unwrap().entry(account.to_owned()).or_insert(START_BALANCE)
    }

    fn write(&self, account: &str, balance: i64) {
        let mut balances = self.balances.lock().unwrap();
        balances.insert(account.to_owned(), balance);
    }

    /// Read, work a little, write back.
    async fn change(&self, account: &str, by: i64) -> Balance {
        let balance = self.read(account);
        tokio::time::sleep(Duration::from_millis(1)).await;
        self.write(account, balance + by);
        Balance { account: account.to_owned(), balance: balance + by }
    }
}

/// One instance's service: the shared ledger, and the instance's lock client (none in the
/// unlocked run).
#[derive(Clone)]
struct Teller<B: Backend> {
    ledger: Ledger,
    locks: Option<LockClient<B>>,
    /// How long a call waits for its account's lock.
    wait: Duration,
}

impl<B: Backend> Bank for Teller<B> {
    /// Locked by the layer's rule for this method, from the `account-id` metadata.
    async fn withdraw(&self, request: Request<Change>) -> Result<Response<Balance>, Status> {
        let change = request.into_inner();
        Ok(Response::new(self.ledger.change(&change.account, -change.amount).await))
    }

    /// Locked here, from the message: the same `account:<id>` lock the layer takes for
    /// Withdraw. `?` answers a busy lock as the layer would (`UNAVAILABLE` with the same
    /// pushback, from the client's hold times).
    async fn deposit(&self, request: Request<Change>) -> Result<Response<Balance>, Status> {
        let change = request.into_inner();
        let guard = match &self.locks {
            Some(locks) => Some(
                locks.lock(format!("account:{}", change.account)).wait(self.wait).acquire().await?,
            ),
            None => None,
        };
        let balance = self.ledger.change(&change.account, change.amount).await;
        if let Some(guard) = guard {
            guard.release().await?;
        }
        Ok(Response::new(balance))
    }

    async fn statement(&self, _: Request<Account>) -> Result<Response<BalanceStream>, Status> {
        Err(Status::unimplemented("not in this demo"))
    }
}

/// The locks per method: Withdraw takes one lock per account, named `account:<id>` from the
/// `account-id` metadata (as an HTTP route's `key::path_param("id").prefixed("account:")`
/// names it), and a call without that metadata is `INVALID_ARGUMENT`, never run unlocked;
/// Deposit takes the same lock itself, from the message; Statement needs none. Rejections are
/// gRPC statuses without `on_rejected`: the layer sees the call's `content-type`.
fn locked<B: Backend>(
    locks: &LockClient<B>,
    teller: Teller<B>,
) -> MethodLockService<BankServer<Teller<B>>> {
    let wait = teller.wait;
    MethodLocks::new()
        .method(
            "Withdraw",
            LockLayer::new(locks.clone())
                .key(key::header("account-id").prefixed("account:"))
                .wait(wait),
        )
        .unlocked("Deposit")
        .unlocked("Statement")
        .layer(BankServer::new(teller))
}

/// Serves the ledger (with locks when `locks` is set) on a free port; returns its URL.
async fn serve<B: Backend>(
    ledger: Ledger,
    locks: Option<&LockClient<B>>,
) -> Result<String, Box<dyn std::error::Error>> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let mut server = tonic::transport::Server::builder();
    let teller = Teller { ledger, locks: locks.cloned(), wait: Duration::from_secs(30) };
    let router = match locks {
        Some(locks) => server.add_service(locked(locks, teller)),
        None => server.add_service(BankServer::new(teller)),
    };
    tokio::spawn(router.serve_with_incoming(incoming));
    Ok(url)
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    logs::show();
    logs::exit(start().await)
}

/// Runs the demo on Redis when `REDIS_URL` is set, else in memory; either way each instance
/// has a lock client of its own on the shared store.
async fn start() -> Result<(), Box<dyn std::error::Error>> {
    match std::env::var("REDIS_URL") {
        Ok(url) => {
            println!("locks: Redis at {url}");
            let a = LockClient::builder(RedisBackend::connect(&url).await?).build()?;
            let b = LockClient::builder(RedisBackend::connect(&url).await?).build()?;
            run(a, b).await
        }
        Err(_) => {
            println!("locks: in memory, shared by both instances (set REDIS_URL to use Redis)");
            let store = MemoryBackend::new();
            let a = LockClient::builder(store.clone()).build()?;
            let b = LockClient::builder(store).build()?;
            run(a, b).await
        }
    }
}

async fn run<B: Backend>(
    a: LockClient<B>,
    b: LockClient<B>,
) -> Result<(), Box<dyn std::error::Error>> {
    for locked in [false, true] {
        let ledger = Ledger::default();
        let urls = [
            serve(ledger.clone(), locked.then_some(&a)).await?,
            serve(ledger.clone(), locked.then_some(&b)).await?,
        ];
        let clients = [
            BankClient::connect(urls[0].clone()).await?,
            BankClient::connect(urls[1].clone()).await?,
        ];
        let started = Instant::now();
        let mut expected: HashMap<&str, i64> =
            ACCOUNTS.iter().map(|a| (*a, START_BALANCE)).collect();
        let mut calls = tokio::task::JoinSet::new();
        for i in 0..CALLS {
            let account = ACCOUNTS[i % ACCOUNTS.len()];
            // Every third call deposits 2, the others withdraw 1; odd calls go to instance 2.
            let deposit = i % 3 == 0;
            *expected.get_mut(account).unwrap() += if deposit { 2 } else { -1 };
            let mut client = clients[i % 2].clone();
            calls.spawn(async move {
                let change =
                    Change { account: account.to_owned(), amount: if deposit { 2 } else { 1 } };
                let request = with_metadata(change, "account-id", account);
                if deposit { client.deposit(request).await } else { client.withdraw(request).await }
            });
        }
        while let Some(result) = calls.join_next().await {
            result??;
        }
        let elapsed = started.elapsed();
        let lost: i64 =
            ACCOUNTS.iter().map(|account| (ledger.read(account) - expected[account]).abs()).sum();
        println!(
            "{}: {CALLS} calls over 2 instances on {} accounts -> {lost} units off the expected balances ({}), in {elapsed:?}",
            if locked { "with locks   " } else { "without locks" },
            ACCOUNTS.len(),
            if lost == 0 { "no lost update" } else { "lost updates" },
        );
    }

    // A busy account: another holder (here, code on instance 2) holds `account:alice`, and a
    // call that may wait 200 ms for it is told when to come back.
    let ledger = Ledger::default();
    let url = {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let teller = Teller { ledger, locks: Some(a.clone()), wait: Duration::from_millis(200) };
        let service = locked(&a, teller);
        let router = tonic::transport::Server::builder().add_service(service);
        tokio::spawn(router.serve_with_incoming(incoming));
        url
    };
    let mut client = BankClient::connect(url).await?;
    let change = Change { account: "alice".into(), amount: 1 };
    // The first busy answers come before any hold was seen: the pushback is the wait the call
    // had (200 ms here), not the holder's whole lease. Then a few calls teach the client how
    // long its locks are held, which later pushbacks use.
    for round in ["fresh instance", "after a few calls"] {
        if round != "fresh instance" {
            for _ in 0..3 {
                let request = with_metadata(change.clone(), "account-id", "alice");
                client.withdraw(request).await?;
            }
        }
        let held = b.lock("account:alice").acquire().await?;
        let by_layer = client
            .withdraw(with_metadata(change.clone(), "account-id", "alice"))
            .await
            .expect_err("the account is busy");
        let in_method = client.deposit(change.clone()).await.expect_err("the account is busy");
        for (path, status) in [("Withdraw (layer)", by_layer), ("Deposit (?)", in_method)] {
            let pushback = status
                .metadata()
                .get("grpc-retry-pushback-ms")
                .and_then(|value| value.to_str().ok())
                .unwrap_or("none")
                .to_owned();
            println!(
                "busy account, {round}, {path}: status {:?}, message {:?}, grpc-retry-pushback-ms {pushback}",
                status.code(),
                status.message()
            );
        }
        held.release().await?;
    }

    // A Withdraw without its key is refused, never run unlocked.
    let status = client.withdraw(change).await.expect_err("no account-id metadata");
    println!("no key: status {:?}, message {:?}", status.code(), status.message());
    Ok(())
}
