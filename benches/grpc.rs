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
#[path = "common/measure.rs"]
mod measure;
#[path = "../tests/support/mod.rs"]
mod support;

use std::{
    collections::{BTreeMap, HashMap},
    convert::Infallible,
    fmt::Write as _,
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use bank::{Account, Balance, BalanceStream, BankClient, BankServer, Change, with_metadata};
use measure::{Errors, Spread, cpu_time, lock_selected, ms, quantile, rotated, selected, us};
use tonic::{Request, Response, Status, body::Body, server::NamedService, transport::server};
use tower::Layer;
use tower_lock::{LockClient, LockLayer, grpc::GrpcRejection, key};

/// The environment variable that makes the bench binary the load generator.
const WORKER_ENV: &str = "TOWER_LOCK_BENCH_GRPC_LOADGEN";
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

    fn name(self) -> &'static str {
        match self {
            Self::NoLock => "(a) no lock",
            Self::Redis => "(b) LockLayer Redis",
            Self::Rslock => "(c) rslock layer",
        }
    }

    /// Its tag in `BENCH_LOCKS`.
    fn tag(self) -> &'static str {
        match self {
            Self::NoLock => "none",
            Self::Redis => "tower",
            Self::Rslock => "rslock",
        }
    }
}

/// One workload: calls in flight and the accounts they spread over.
#[derive(Clone, Copy)]
struct Workload {
    name: &'static str,
    what: &'static str,
    in_flight: usize,
    accounts: usize,
}

const WORKLOADS: [Workload; 3] = [
    Workload {
        name: "G1",
        what: "32 calls in flight over 1000 accounts",
        in_flight: 32,
        accounts: 1000,
    },
    Workload {
        name: "G2",
        what: "16 calls in flight on one account",
        in_flight: 16,
        accounts: 1,
    },
    Workload {
        name: "G3",
        what: "one call at a time over 1000 accounts",
        in_flight: 1,
        accounts: 1000,
    },
];

fn main() {
    if std::env::var_os(WORKER_ENV).is_some() {
        load_generator();
        return;
    }
    let window = common::window();
    let reps = measure::reps(3);
    let runtime = common::runtime();
    let server = support::RedisServer::start();
    runtime.block_on(async {
        let url = server.url();
        let rtt = common::ping_rtt(&url).await;
        let version: Vec<String> = support::redis_version()
            .iter()
            .map(u32::to_string)
            .collect();
        println!(
            "redis-server {}, PING round trip {:.1} µs; {reps} repetitions of {:.1} s windows; {} CPUs",
            version.join("."),
            us(rtt),
            window.as_secs_f64(),
            std::thread::available_parallelism().map_or(0, |n| n.get()),
        );
        println!(
            "(c) rslock: {RSLOCK_RETRY_COUNT} retries per lock() with a random delay below {RSLOCK_RETRY_DELAY:?}, acquire() looping, TTL {LEASE:?}"
        );
        let mut summary = Vec::new();
        for workload in WORKLOADS {
            if !selected(workload.name) {
                continue;
            }
            println!();
            println!("{}: {}", workload.name, workload.what);
            let mut runs: Vec<(Variant, Run)> = Vec::new();
            let mut pings: Vec<f64> = Vec::new();
            for rep in 0..reps {
                pings.push(us(common::ping_rtt(&url).await));
                for variant in rotated(&Variant::ALL, rep) {
                    if !lock_selected(variant.tag()) {
                        continue;
                    }
                    match run(variant, &url, workload, window).await {
                        Ok(mut run) => {
                            run.rep = rep;
                            runs.push((variant, run));
                        }
                        Err(e) => println!("  {} rep {rep}: {e}", variant.name()),
                    }
                }
            }
            summary.extend(report(workload, &runs, &pings));
        }
        print_summary(&summary);
    });
    drop(server);
}

/// Balances held in process memory; read and written in separate steps, as with a database.
#[derive(Clone, Default)]
struct Ledger {
    balances: Arc<Mutex<HashMap<String, i64>>>,
}

impl Ledger {
    fn read(&self, account: &str) -> i64 {
        let balances = self.balances.lock().unwrap_or_else(|e| e.into_inner());
        balances.get(account).copied().unwrap_or(0)
    }

    fn write(&self, account: &str, balance: i64) {
        let mut balances = self.balances.lock().unwrap_or_else(|e| e.into_inner());
        balances.insert(account.to_owned(), balance);
    }

    fn total(&self) -> i64 {
        let balances = self.balances.lock().unwrap_or_else(|e| e.into_inner());
        balances.values().sum()
    }
}

impl bank::Bank for Ledger {
    async fn withdraw(&self, _: Request<Change>) -> Result<Response<Balance>, Status> {
        Err(Status::unimplemented("deposits only"))
    }

    /// Read the balance, await, write it back with the amount added.
    async fn deposit(&self, request: Request<Change>) -> Result<Response<Balance>, Status> {
        let change = request.into_inner();
        let balance = self.read(&change.account);
        tokio::task::yield_now().await;
        self.write(&change.account, balance + change.amount);
        Ok(Response::new(Balance {
            account: change.account,
            balance: balance + change.amount,
        }))
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
        Rslocked {
            locks: self.locks.clone(),
            inner,
        }
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
        let account = request
            .headers()
            .get(ACCOUNT_ID)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
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
    ledger: Ledger,
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
            let locks = LockClient::builder(backend)
                .build()
                .map_err(|e| e.to_string())?;
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
    rep: usize,
    /// Successful calls per second.
    ok_rate: f64,
    p50: Duration,
    p99: Duration,
    ok: u64,
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
    let ledger = Ledger::default();
    let (router, locks) = app(variant, url, ledger.clone()).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("bind: {e}"))?;
    let base = format!(
        "http://{}",
        listener.local_addr().map_err(|e| e.to_string())?
    );
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(router.serve_with_incoming_shutdown(incoming, async {
        let _ = stopped.await;
    }));
    // One warm-up call: connections and scripts ready before the window.
    warm_up(&base).await;
    let warm = ledger.total();
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let cpu = cpu_time();
    let output = tokio::process::Command::new(exe)
        .env(WORKER_ENV, "1")
        .env("BENCH_GRPC_BASE", &base)
        .env("BENCH_GRPC_IN_FLIGHT", workload.in_flight.to_string())
        .env("BENCH_GRPC_ACCOUNTS", workload.accounts.to_string())
        .env("BENCH_GRPC_SECS", window.as_secs_f64().to_string())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| format!("load generator: {e}"))?;
    let cpu = cpu_time().saturating_sub(cpu);
    let _ = stop.send(());
    if tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .is_err()
    {
        println!("  {}: the server did not stop within 5 s", variant.name());
    }
    if let Some(locks) = locks {
        locks.shutdown().await;
    }
    if !output.status.success() {
        return Err(format!(
            "load generator exited with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    let mut run = Run::default();
    let mut calls = 0u64;
    let mut secs = 0.0;
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let fields: Vec<&str> = line.split('\t').collect();
        let field = |i: usize| fields.get(i).copied().unwrap_or("");
        let num = |i: usize| field(i).parse::<f64>().unwrap_or(0.0);
        match field(0) {
            "calls" => calls = num(1) as u64,
            "ok" => run.ok = num(1) as u64,
            "secs" => secs = num(1),
            "p50" => run.p50 = Duration::from_nanos(num(1) as u64),
            "p99" => run.p99 = Duration::from_nanos(num(1) as u64),
            "code" => {
                run.codes.insert(field(1).to_owned(), num(2) as u64);
                run.first.insert(field(1).to_owned(), field(3).to_owned());
            }
            "error" => run.errors.add_n(field(1), num(2) as u64, field(3)),
            _ => {}
        }
    }
    if secs > 0.0 {
        run.ok_rate = run.ok as f64 / secs;
    }
    run.lost = run.ok as i64 - (ledger.total() - warm);
    run.server_cpu_us = us(cpu) / calls.max(1) as f64;
    Ok(run)
}

/// One deposit to an account of its own at `base`; what it answers does not matter.
async fn warm_up(base: &str) {
    if let Ok(mut client) = BankClient::connect(base.to_owned()).await {
        let change = Change {
            account: "warm".to_owned(),
            amount: 1,
        };
        let _ = client
            .deposit(with_metadata(change, ACCOUNT_ID, "warm"))
            .await;
    }
}

/// The load generator process: keeps `BENCH_GRPC_IN_FLIGHT` calls in flight on one HTTP/2
/// channel for `BENCH_GRPC_SECS`, then prints what it saw.
fn load_generator() {
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let base = var("BENCH_GRPC_BASE");
    let in_flight: usize = var("BENCH_GRPC_IN_FLIGHT").parse().unwrap_or(1);
    let accounts: u64 = var("BENCH_GRPC_ACCOUNTS").parse().unwrap_or(1).max(1);
    let window = Duration::from_secs_f64(var("BENCH_GRPC_SECS").parse().unwrap_or(2.0));
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
                // xorshift: a spread of accounts, the same in every run.
                let mut state = 0x9e37_79b9_7f4a_7c15_u64
                    ^ (task as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d);
                let mut latencies = Vec::new();
                let mut ok = 0u64;
                // Failed calls by code, with the first message of each.
                let mut codes = Errors::default();
                while start.elapsed() < window {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    let account = (state % accounts).to_string();
                    let change = Change {
                        account: account.clone(),
                        amount: 1,
                    };
                    let request = with_metadata(change, ACCOUNT_ID, &account);
                    let sent = Instant::now();
                    let result = client.deposit(request).await;
                    latencies.push(sent.elapsed());
                    match result {
                        Ok(_) => ok += 1,
                        Err(status) => codes.add(format!("{:?}", status.code()), || {
                            status.message().to_owned()
                        }),
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
        let elapsed = start.elapsed();
        latencies.sort_unstable();
        let _ = writeln!(report, "calls\t{}", latencies.len());
        let _ = writeln!(report, "ok\t{ok}");
        let _ = writeln!(report, "secs\t{}", elapsed.as_secs_f64());
        let _ = writeln!(report, "p50\t{}", quantile(&latencies, 0.5).as_nanos());
        let _ = writeln!(report, "p99\t{}", quantile(&latencies, 0.99).as_nanos());
        for (code, n, first) in codes.entries() {
            let first = first.replace(['\t', '\n'], " ");
            let _ = writeln!(report, "code\t{code}\t{n}\t{first}");
        }
        for (kind, n, first) in errors.entries() {
            let first = first.replace(['\t', '\n'], " ");
            let _ = writeln!(report, "error\t{kind}\t{n}\t{first}");
        }
        report
    });
    print!("{report}");
}

/// One summary figure: its label, whether it is a count (summed over the repetitions in the
/// summary), and per variant its value in each repetition.
struct Figure {
    label: String,
    summed: bool,
    cells: Vec<(Variant, Vec<f64>)>,
}

impl Figure {
    fn new(label: String, summed: bool) -> Self {
        Self {
            label,
            summed,
            cells: Vec::new(),
        }
    }
}

/// Prints one workload's figures; returns its summary rows.
fn report(workload: Workload, runs: &[(Variant, Run)], pings: &[f64]) -> Vec<Figure> {
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
        let mine: Vec<&Run> = runs
            .iter()
            .filter(|r| r.0 == variant)
            .map(|r| &r.1)
            .collect();
        if mine.is_empty() {
            continue;
        }
        let of = |f: &dyn Fn(&Run) -> f64| -> Vec<f64> {
            (0..pings.len())
                .map(|rep| {
                    runs.iter()
                        .find(|(v, r)| *v == variant && r.rep == rep)
                        .map_or(f64::NAN, |(_, r)| f(r))
                })
                .collect()
        };
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
        println!(
            "  PING round trip per repetition: {} µs",
            Spread::of(pings.iter().copied()).show(1)
        );
        let mut added = Figure::new(format!("{name} added p50 µs"), false);
        for variant in [Variant::Redis, Variant::Rslock] {
            let mut micros = Vec::new();
            let mut rtts = Vec::new();
            for (rep, ping) in pings.iter().enumerate() {
                let p50 = |v: Variant| {
                    runs.iter()
                        .find(|(w, r)| *w == v && r.rep == rep)
                        .map(|(_, r)| us(r.p50))
                };
                let added = match (p50(Variant::NoLock), p50(variant)) {
                    (Some(base), Some(with)) => with - base,
                    _ => f64::NAN,
                };
                micros.push(added);
                rtts.push(added / ping);
            }
            println!(
                "  {:<22} adds {} µs at p50 over (a) = {} PING round trips",
                variant.name(),
                show(&micros, 0),
                show(&rtts, 2)
            );
            added.cells.push((variant, micros));
        }
        figures.push(added);
    }
    figures
}

/// `median (min–max)` of per-repetition values.
fn show(values: &[f64], decimals: usize) -> String {
    Spread::of(values.iter().copied()).show(decimals)
}

/// The summary table: medians per variant (sums for counts), and (b) / (c), tower-lock's layer
/// to the rslock layer, of the medians and within each repetition.
fn print_summary(figures: &[Figure]) {
    println!();
    println!("Summary: medians over the repetitions (lost updates and failures: sums).");
    println!(
        "ratio = (b) tower-lock Redis / (c) rslock, of the medians, then the median (min–max) of the"
    );
    println!(
        "ratio within each repetition; > 1 is better for tower-lock on rates, < 1 on times and costs."
    );
    print!("  {:<30}", "figure");
    for variant in Variant::ALL {
        print!(" {:>21}", variant.name());
    }
    println!(" {:>7} {:>18}", "ratio", "per-rep ratio");
    for Figure {
        label,
        summed,
        cells,
    } in figures
    {
        print!("  {label:<30}");
        let cell = |v: Variant| {
            cells
                .iter()
                .find(|(w, _)| *w == v)
                .map(|(_, x)| x.as_slice())
        };
        for variant in Variant::ALL {
            match cell(variant) {
                Some(x) if *summed => {
                    print!(" {:>21.0}", x.iter().filter(|v| !v.is_nan()).sum::<f64>())
                }
                Some(x) => match Spread::of(x.iter().copied()).median {
                    m if m.is_nan() => print!(" {:>21}", "-"),
                    m => print!(" {:>21}", measure::cell(m, 3)),
                },
                None => print!(" {:>21}", "-"),
            }
        }
        match (cell(Variant::Redis), cell(Variant::Rslock)) {
            (Some(b), Some(c)) if !summed => {
                let median = |v: &[f64]| Spread::of(v.iter().copied()).median;
                let per_rep = Spread::of(
                    b.iter()
                        .zip(c)
                        .map(|(b, c)| b / c)
                        .filter(|r| r.is_finite()),
                );
                println!(" {:>7.2} {:>18}", median(b) / median(c), per_rep.show(2));
            }
            _ => println!(" {:>7} {:>18}", "-", "-"),
        }
    }
}
