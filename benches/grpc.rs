//! gRPC load on a tonic `bank.Bank` service's `Deposit`, against a Redis server this bench
//! starts: tower-lock's `LockLayer` beside no lock at all and beside a hand-written tower layer
//! using the `rslock` crate, in the same run. The server runs in this process (tonic over HTTP/2
//! on loopback); the load generator, a tonic client, runs in a process of its own (the bench
//! re-executes itself), so the server's CPU time per call is measured apart from the client's.
//!
//! ```text
//! cargo bench --bench grpc --features tonic                          # 3 repetitions of 2 s
//! BENCH_SECS=1 BENCH_REPS=2 cargo bench --bench grpc --features tonic
//! BENCH_ONLY=G2 cargo bench --bench grpc --features tonic
//! BENCH_LOCKS=tower,rslock cargo bench --bench grpc --features tonic  # some variants only
//! ```
//!
//! `Deposit` reads the account's balance, awaits (`yield_now`), and writes back balance + the
//! amount (1): without a lock, concurrent calls on one account lose updates. The load generator
//! counts its successful calls; lost updates = successes − the sum of the balances' increase
//! (0 under any lock). Every call names its account in the message and in the `account-id`
//! metadata, where the locks take their key from.
//!
//! - (a) no lock; (b) `LockLayer` on Redis, key `key::header("account-id").prefixed("account:")`,
//!   rejections as gRPC statuses (`GrpcRejection`); (c) a hand-written tower layer taking an
//!   rslock lock on `account:<account-id>` on the same Redis around the call, releasing it
//!   after the call (`UNAVAILABLE` if it does not get it within the wait).
//! - G1: 32 calls in flight over 1 000 accounts; G2: 16 in flight on one account; G3: one call
//!   at a time over 1 000 accounts (the latency each lock adds to (a)).

#[path = "../examples/common/bank.rs"]
mod bank;
mod common;
#[path = "common/load.rs"]
mod load;
#[path = "common/measure.rs"]
mod measure;
#[path = "../tests/support/mod.rs"]
mod support;

use std::{
    collections::BTreeMap,
    convert::Infallible,
    fmt::Write as _,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::{Duration, Instant},
};

use bank::{Account, Balance, BalanceStream, BankClient, BankServer, Change, with_metadata};
use load::{
    Balances, Figure, Load, Sample, Seen, Variant as _, Xorshift, added_p50, per_rep, show,
};
use measure::{Errors, ms};
use tonic::{Request, Response, Status, body::Body, server::NamedService, transport::server};
use tower::Layer;
use tower_lock::{LockClient, LockLayer, grpc::GrpcRejection, key};

/// The environment variable that makes the bench binary the load generator.
const WORKER_ENV: &str = "TOWER_LOCK_BENCH_GRPC_LOADGEN";
/// The prefix of the variables that tell the load generator its load.
const LOAD_ENV: &str = "BENCH_GRPC";
/// The metadata entry the locks take the account from.
const ACCOUNT_ID: &str = "account-id";
/// Lock lease (tower-lock's default watchdog lease; rslock's TTL) and the longest wait.
const LEASE: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(30);
/// rslock's retries per `lock()` (its default) and the bound of its random retry delay.
const RSLOCK_RETRY_COUNT: u32 = 3;
const RSLOCK_RETRY_DELAY: Duration = Duration::from_millis(10);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    NoLock,
    Redis,
    Rslock,
}

impl Variant {
    const ALL: [Self; 3] = [Self::NoLock, Self::Redis, Self::Rslock];
}

impl load::Variant for Variant {
    fn name(self) -> &'static str {
        match self {
            Self::NoLock => "(a) no lock",
            Self::Redis => "(b) LockLayer Redis",
            Self::Rslock => "(c) rslock layer",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Self::NoLock => "none",
            Self::Redis => "tower",
            Self::Rslock => "rslock",
        }
    }
}

/// One workload: calls in flight and the accounts they spread over.
type Workload = load::Workload<Variant, ()>;

const WORKLOADS: [Workload; 3] = [
    Workload {
        name: "G1",
        what: "32 calls in flight over 1000 accounts",
        call: (),
        variants: &Variant::ALL,
        in_flight: 32,
        accounts: 1000,
    },
    Workload {
        name: "G2",
        what: "16 calls in flight on one account",
        call: (),
        variants: &Variant::ALL,
        in_flight: 16,
        accounts: 1,
    },
    Workload {
        name: "G3",
        what: "one call at a time over 1000 accounts",
        call: (),
        variants: &Variant::ALL,
        in_flight: 1,
        accounts: 1000,
    },
];

fn main() {
    load::main(WORKER_ENV, load_generator, async |url, reps, window| {
        println!(
            "(c) rslock: {RSLOCK_RETRY_COUNT} retries per lock() with a random delay below {RSLOCK_RETRY_DELAY:?}, acquire() looping, TTL {LEASE:?}"
        );
        let summary = load::drive(
            url,
            reps,
            &WORKLOADS,
            |variant, workload| run(variant, url, workload, window),
            report,
        )
        .await;
        print_summary(&summary);
    });
}

/// Deposits on balances held in process memory.
impl bank::Bank for Balances {
    async fn withdraw(&self, _: Request<Change>) -> Result<Response<Balance>, Status> {
        Err(Status::unimplemented("deposits only"))
    }

    /// Read the balance, await, write it back with the amount added.
    async fn deposit(&self, request: Request<Change>) -> Result<Response<Balance>, Status> {
        let change = request.into_inner();
        let balance = self.read(&change.account);
        tokio::task::yield_now().await;
        self.write(&change.account, balance + change.amount);
        Ok(Response::new(Balance { account: change.account, balance: balance + change.amount }))
    }

    async fn statement(&self, _: Request<Account>) -> Result<Response<BalanceStream>, Status> {
        Err(Status::unimplemented("deposits only"))
    }
}

/// (c): what a user would write with rslock: a tower layer locking the account named in the
/// call's metadata around the call.
#[derive(Clone)]
struct RslockLayer {
    locks: rslock::LockManager,
}

impl<S> Layer<S> for RslockLayer {
    type Service = Rslocked<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Rslocked { locks: self.locks.clone(), inner }
    }
}

/// The service of [`RslockLayer`].
#[derive(Clone)]
struct Rslocked<S> {
    locks: rslock::LockManager,
    inner: S,
}

impl<S: NamedService> NamedService for Rslocked<S> {
    const NAME: &'static str = S::NAME;
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> tower::Service<http::Request<Body>> for Rslocked<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        // The clone that was made ready serves this call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let locks = self.locks.clone();
        let account =
            request.headers().get(ACCOUNT_ID).and_then(|v| v.to_str().ok()).map(str::to_owned);
        Box::pin(async move {
            let Some(account) = account else {
                return Ok(Status::invalid_argument("no account-id").into_http());
            };
            let key = format!("account:{account}");
            let guard = match tokio::time::timeout(WAIT, locks.acquire(key.as_str(), LEASE)).await {
                Ok(Ok(guard)) => guard,
                Ok(Err(e)) => return Ok(Status::unavailable(e.to_string()).into_http()),
                Err(_) => return Ok(Status::unavailable("lock wait timed out").into_http()),
            };
            let response = inner.call(request).await;
            guard.release().await;
            response
        })
    }
}

/// The tonic server of `variant`, with the lock client to shut down after the run.
async fn app(
    variant: Variant,
    url: &str,
    ledger: Balances,
) -> Result<(server::Router, Option<LockClient<tower_lock::RedisBackend>>), String> {
    let mut builder = tonic::transport::Server::builder();
    let service = BankServer::new(ledger);
    Ok(match variant {
        Variant::NoLock => (builder.add_service(service), None),
        Variant::Redis => {
            let backend = support::redis_backend(url)
                .connect()
                .await
                .map_err(|e| format!("connect: {e:#}"))?;
            let locks = LockClient::builder(backend).build().map_err(|e| e.to_string())?;
            let layer = LockLayer::new(locks.clone())
                .key(key::header(ACCOUNT_ID).prefixed("account:"))
                .wait(WAIT)
                .on_rejected(GrpcRejection);
            (builder.add_service(layer.layer(service)), Some(locks))
        }
        Variant::Rslock => {
            let mut locks = rslock::LockManager::new(vec![url.to_owned()]);
            locks.set_retry(RSLOCK_RETRY_COUNT, RSLOCK_RETRY_DELAY);
            let layer = RslockLayer { locks };
            (builder.add_service(layer.layer(service)), None)
        }
    })
}

/// One run of one variant.
#[derive(Debug, Default)]
struct Run {
    /// Successful calls per second.
    ok_rate: f64,
    p50: Duration,
    p99: Duration,
    /// Successes − the sum of the balances' increase.
    lost: i64,
    /// Failed calls by gRPC status code.
    codes: BTreeMap<String, u64>,
    /// The first message of each code.
    first: BTreeMap<String, String>,
    errors: Errors,
    server_cpu_us: f64,
}

/// Serves `variant` on loopback and has a load generator process drive it for `window`.
async fn run(
    variant: Variant,
    url: &str,
    workload: Workload,
    window: Duration,
) -> Result<Run, String> {
    let ledger = Balances::default();
    let (router, locks) = app(variant, url, ledger.clone()).await?;
    let (listener, base) = load::bind_loopback().await?;
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(router.serve_with_incoming_shutdown(incoming, async {
        let _ = stopped.await;
    }));
    // One warm-up call: connections and scripts ready before the window.
    warm_up(&base).await;
    let warm = ledger.total();
    let load = Load::new(base, &workload, window);
    let (output, cpu) = load.generate(WORKER_ENV, LOAD_ENV, &[]).await?;
    let _ = stop.send(());
    if tokio::time::timeout(Duration::from_secs(5), server).await.is_err() {
        println!("  {}: the server did not stop within 5 s", variant.name());
    }
    if let Some(locks) = locks {
        locks.shutdown().await;
    }
    let mut run = Run::default();
    let seen = Seen::read(&load::stdout(&output)?, |fields| {
        if fields[0] == "code" {
            let field = |i: usize| fields.get(i).copied().unwrap_or("");
            run.codes.insert(field(1).to_owned(), load::num(fields, 2) as u64);
            run.first.insert(field(1).to_owned(), field(3).to_owned());
        }
    });
    run.ok_rate = seen.ok_rate();
    run.lost = seen.ok as i64 - (ledger.total() - warm);
    run.server_cpu_us = seen.cpu_per_call(cpu);
    run.p50 = seen.p50;
    run.p99 = seen.p99;
    run.errors = seen.errors;
    Ok(run)
}

/// One deposit to an account of its own at `base`; what it answers does not matter.
async fn warm_up(base: &str) {
    if let Ok(mut client) = BankClient::connect(base.to_owned()).await {
        let change = Change { account: "warm".to_owned(), amount: 1 };
        let _ = client.deposit(with_metadata(change, ACCOUNT_ID, "warm")).await;
    }
}

/// The load generator process: keeps `BENCH_GRPC_IN_FLIGHT` calls in flight on one HTTP/2
/// channel for `BENCH_GRPC_SECS`, then prints what it saw.
fn load_generator() {
    let Load { base, in_flight, accounts, window } = Load::from_env(LOAD_ENV);
    let runtime = common::runtime();
    let report = runtime.block_on(async move {
        let mut report = String::new();
        let client = match BankClient::connect(base).await {
            Ok(client) => client,
            Err(e) => {
                let _ = writeln!(report, "error\tconnect\t1\t{e:?}");
                return report;
            }
        };
        let start = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for task in 0..in_flight {
            let mut client = client.clone();
            tasks.spawn(async move {
                let mut accounts_at = Xorshift::new(task);
                let mut latencies = Vec::new();
                let mut ok = 0u64;
                // Failed calls by code, with the first message of each.
                let mut codes = Errors::default();
                while start.elapsed() < window {
                    let account = (accounts_at.next() % accounts).to_string();
                    let change = Change { account: account.clone(), amount: 1 };
                    let request = with_metadata(change, ACCOUNT_ID, &account);
                    let sent = Instant::now();
                    let result = client.deposit(request).await;
                    latencies.push(sent.elapsed());
                    match result {
                        Ok(_) => ok += 1,
                        Err(status) => codes
                            .add(format!("{:?}", status.code()), || status.message().to_owned()),
                    }
                }
                (latencies, ok, codes)
            });
        }
        let mut latencies = Vec::new();
        let mut ok = 0u64;
        let mut codes = Errors::default();
        let mut errors = Errors::default();
        while let Some(result) = tasks.join_next().await {
            match result {
                Ok((l, n, c)) => {
                    latencies.extend(l);
                    ok += n;
                    codes.merge(&c);
                }
                Err(e) => errors.add("task", || e.to_string()),
            }
        }
        let secs = start.elapsed().as_secs_f64();
        latencies.sort_unstable();
        Seen::of(&latencies, ok, secs, errors).write(&mut report);
        for (code, n, first) in codes.entries() {
            let first = first.replace(['\t', '\n'], " ");
            let _ = writeln!(report, "code\t{code}\t{n}\t{first}");
        }
        report
    });
    print!("{report}");
}

/// Prints one workload's figures; returns its summary rows.
fn report(
    workload: Workload,
    runs: &[Sample<Variant, Run>],
    pings: &[f64],
) -> Vec<Figure<Variant>> {
    let name = workload.name;
    println!(
        "  {:<22} {:>22} {:>18} {:>18} {:>14} {:>20} {:>8}",
        "", "ok calls/s", "p50 ms", "p99 ms", "lost updates", "server CPU µs/call", "failed"
    );
    let mut figures = vec![
        Figure::new(format!("{name} ok calls/s"), false),
        Figure::new(format!("{name} p50 ms"), false),
        Figure::new(format!("{name} p99 ms"), false),
        Figure::new(format!("{name} server CPU µs/call"), false),
        Figure::new(format!("{name} lost updates (sum)"), true),
        Figure::new(format!("{name} failed + errors (sum)"), true),
    ];
    for variant in Variant::ALL {
        let mine: Vec<&Run> =
            runs.iter().filter(|s| s.variant == variant).map(|s| &s.run).collect();
        if mine.is_empty() {
            continue;
        }
        let of = |f: &dyn Fn(&Run) -> f64| per_rep(runs, variant, pings.len(), f);
        let failed_of = |r: &Run| (r.codes.values().sum::<u64>() + r.errors.total()) as f64;
        let values = [
            of(&|r| r.ok_rate),
            of(&|r| ms(r.p50)),
            of(&|r| ms(r.p99)),
            of(&|r| r.server_cpu_us),
            of(&|r| r.lost as f64),
            of(&failed_of),
        ];
        let lost: Vec<String> = mine.iter().map(|r| r.lost.to_string()).collect();
        let mut codes: BTreeMap<&str, u64> = BTreeMap::new();
        let mut first: BTreeMap<&str, &str> = BTreeMap::new();
        let mut errors = Errors::default();
        for run in &mine {
            for (code, n) in &run.codes {
                *codes.entry(code).or_default() += n;
            }
            for (code, message) in &run.first {
                first.entry(code).or_insert(message);
            }
            errors.merge(&run.errors);
        }
        let failed: u64 = codes.values().sum();
        println!(
            "  {:<22} {:>22} {:>18} {:>18} {:>14} {:>20} {:>8}",
            variant.name(),
            show(&values[0], 0),
            show(&values[1], 3),
            show(&values[2], 3),
            lost.join(" "),
            show(&values[3], 1),
            failed
        );
        if failed > 0 {
            let by_code: Vec<String> = codes
                .iter()
                .map(|(c, n)| format!("{c}: {n} (first: {})", first.get(c).unwrap_or(&"")))
                .collect();
            println!("  {:<22}   failed by code: {}", "", by_code.join(", "));
        }
        if errors.total() > 0 {
            println!("  {:<22}   client errors: {}", "", errors.describe());
        }
        for (figure, values) in figures.iter_mut().zip(values) {
            figure.cells.push((variant, values));
        }
    }
    if workload.in_flight == 1 {
        // The latency each lock adds to (a), per repetition, in µs and in PING round trips.
        let mut added = Figure::new(format!("{name} added p50 µs"), false);
        for (variant, micros, _) in
            added_p50(runs, pings, Variant::NoLock, &[Variant::Redis, Variant::Rslock], |r| r.p50)
        {
            added.cells.push((variant, micros));
        }
        figures.push(added);
    }
    figures
}

/// The summary table: medians per variant (sums for counts), and (b) / (c), tower-lock's layer
/// to the rslock layer, of the medians and within each repetition.
fn print_summary(figures: &[Figure<Variant>]) {
    println!();
    println!("Summary: medians over the repetitions (lost updates and failures: sums).");
    println!(
        "ratio = (b) tower-lock Redis / (c) rslock, of the medians, then the median (min–max) of the"
    );
    println!(
        "ratio within each repetition; > 1 is better for tower-lock on rates, < 1 on times and costs."
    );
    load::print_table(figures, &Variant::ALL, (Variant::Redis, Variant::Rslock));
}
