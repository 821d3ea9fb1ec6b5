//! HTTP load on an axum deposit route, against a Redis server this bench starts: tower-lock's
//! `LockLayer` beside no lock at all and beside a hand-written axum middleware using the
//! `rslock` crate, in the same run. The server runs in this process; the load generator runs in
//! a process of its own (the bench re-executes itself), so the server's CPU time per request is
//! measured apart from the client's.
//!
//! ```text
//! cargo bench --bench http --all-features                          # 3 repetitions of 2 s
//! BENCH_SECS=1 BENCH_REPS=3 cargo bench --bench http --all-features
//! BENCH_ONLY=H2 cargo bench --bench http --all-features
//! ```
//!
//! The handler reads an account's balance, awaits (`yield_now`), and writes back balance + 1:
//! without a lock, concurrent requests on one account lose updates. The load generator counts
//! its successful requests; lost updates = successes − sum of the balances (0 under any lock).
//!
//! - (a) no lock; (b) `LockLayer` + `MemoryBackend`; (c) `LockLayer` + Redis; (d) an axum
//!   `from_fn` middleware taking an rslock lock on the account.
//! - H1: 32 requests in flight over 1 000 accounts; H2: 16 in flight on one account; H3: one
//!   request at a time: the latency each lock adds to (a), also in Redis `PING` round trips
//!   measured in the same repetition.

mod common;
#[path = "common/measure.rs"]
mod measure;
#[path = "../tests/support/mod.rs"]
mod support;

use std::{
    collections::{BTreeMap, HashMap},
    fmt::Write as _,
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
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use measure::{Errors, Spread, cpu_time, ms, quantile, rotated, selected, us};
use tower_lock::{LockClient, LockLayer, MemoryBackend, key};

/// The environment variable that makes the bench binary the load generator.
const WORKER_ENV: &str = "TOWER_LOCK_BENCH_LOADGEN";
/// Lock lease (tower-lock's default watchdog lease; rslock's TTL) and the longest wait.
const LEASE: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(30);
/// rslock's retries per `lock()` (its default) and the bound of its random retry delay.
const RSLOCK_RETRY_COUNT: u32 = 3;
const RSLOCK_RETRY_DELAY: Duration = Duration::from_millis(10);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    NoLock,
    Memory,
    Redis,
    Rslock,
}

impl Variant {
    const ALL: [Self; 4] = [Self::NoLock, Self::Memory, Self::Redis, Self::Rslock];

    fn name(self) -> &'static str {
        match self {
            Self::NoLock => "(a) no lock",
            Self::Memory => "(b) LockLayer memory",
            Self::Redis => "(c) LockLayer Redis",
            Self::Rslock => "(d) rslock from_fn",
        }
    }
}

/// One workload: requests in flight and the accounts they spread over.
#[derive(Clone, Copy)]
struct Workload {
    name: &'static str,
    what: &'static str,
    in_flight: usize,
    accounts: usize,
}

const WORKLOADS: [Workload; 3] = [
    Workload {
        name: "H1",
        what: "32 in flight over 1000 accounts",
        in_flight: 32,
        accounts: 1000,
    },
    Workload {
        name: "H2",
        what: "16 in flight on one account",
        in_flight: 16,
        accounts: 1,
    },
    Workload {
        name: "H3",
        what: "one request at a time over 1000 accounts",
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
            "(d) rslock: {RSLOCK_RETRY_COUNT} retries per lock() with a random delay below {RSLOCK_RETRY_DELAY:?}, acquire() looping, TTL {LEASE:?}"
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
struct Bank {
    balances: Arc<Mutex<HashMap<String, i64>>>,
}

impl Bank {
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

/// Deposits 1: read the balance, await, write it back.
async fn deposit(State(bank): State<Bank>, Path(id): Path<String>) -> &'static str {
    let balance = bank.read(&id);
    tokio::task::yield_now().await;
    bank.write(&id, balance + 1);
    "ok"
}

/// (d): what a user would write with rslock: lock the account from the path around the handler.
async fn with_rslock(
    State(locks): State<rslock::LockManager>,
    Path(id): Path<String>,
    request: Request,
    next: Next,
) -> Response {
    let key = format!("account:{id}");
    let guard = match tokio::time::timeout(WAIT, locks.acquire(key.as_str(), LEASE)).await {
        Ok(Ok(guard)) => guard,
        Ok(Err(_)) | Err(_) => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
    };
    let response = next.run(request).await;
    guard.release().await;
    response
}

/// The service of `variant`, with the background work to stop after the run.
async fn app(variant: Variant, url: &str, bank: Bank) -> Result<(Router, Stop), String> {
    let route = Router::new().route("/accounts/{id}/deposit", post(deposit));
    let account = || key::path_param("id").prefixed("account:");
    Ok(match variant {
        Variant::NoLock => (route.with_state(bank), Stop::Nothing),
        Variant::Memory => {
            let locks = LockClient::builder(MemoryBackend::new())
                .build()
                .map_err(|e| e.to_string())?;
            let layer = LockLayer::new(locks.clone()).key(account()).wait(WAIT);
            (
                route.route_layer(layer).with_state(bank),
                Stop::Memory(locks),
            )
        }
        Variant::Redis => {
            let backend = support::redis_backend(url)
                .connect()
                .await
                .map_err(|e| format!("connect: {e:#}"))?;
            let locks = LockClient::builder(backend)
                .build()
                .map_err(|e| e.to_string())?;
            let layer = LockLayer::new(locks.clone()).key(account()).wait(WAIT);
            (
                route.route_layer(layer).with_state(bank),
                Stop::Redis(locks),
            )
        }
        Variant::Rslock => {
            let mut locks = rslock::LockManager::new(vec![url.to_owned()]);
            locks.set_retry(RSLOCK_RETRY_COUNT, RSLOCK_RETRY_DELAY);
            let layer = middleware::from_fn_with_state(locks, with_rslock);
            (route.route_layer(layer).with_state(bank), Stop::Nothing)
        }
    })
}

/// A lock client to shut down after a run.
enum Stop {
    Nothing,
    Memory(LockClient<MemoryBackend>),
    Redis(LockClient<tower_lock::RedisBackend>),
}

/// One run of one variant.
#[derive(Debug, Default)]
struct Run {
    rep: usize,
    rate: f64,
    p50: Duration,
    p99: Duration,
    ok: u64,
    lost: i64,
    /// Non-2xx responses by status.
    statuses: BTreeMap<u16, u64>,
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
    let bank = Bank::default();
    let (router, stop) = app(variant, url, bank.clone()).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("bind: {e}"))?;
    let base = format!(
        "http://{}",
        listener.local_addr().map_err(|e| e.to_string())?
    );
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    // One warm-up request: connections and scripts ready before the window.
    warm_up(&base).await;
    let warm = bank.total();
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let cpu = cpu_time();
    let output = tokio::process::Command::new(exe)
        .env(WORKER_ENV, "1")
        .env("BENCH_HTTP_BASE", &base)
        .env("BENCH_HTTP_IN_FLIGHT", workload.in_flight.to_string())
        .env("BENCH_HTTP_ACCOUNTS", workload.accounts.to_string())
        .env("BENCH_HTTP_SECS", window.as_secs_f64().to_string())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| format!("load generator: {e}"))?;
    let cpu = cpu_time().saturating_sub(cpu);
    server.abort();
    match stop {
        Stop::Nothing => {}
        Stop::Memory(locks) => locks.shutdown().await,
        Stop::Redis(locks) => locks.shutdown().await,
    }
    if !output.status.success() {
        return Err(format!(
            "load generator exited with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    let mut run = Run::default();
    let mut requests = 0u64;
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let fields: Vec<&str> = line.split('\t').collect();
        let num = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        match fields.first().copied() {
            Some("requests") => requests = num(1) as u64,
            Some("ok") => run.ok = num(1) as u64,
            Some("rate") => run.rate = num(1),
            Some("p50") => run.p50 = Duration::from_nanos(num(1) as u64),
            Some("p99") => run.p99 = Duration::from_nanos(num(1) as u64),
            Some("status") => {
                run.statuses.insert(num(1) as u16, num(2) as u64);
            }
            Some("error") => run.errors.add_n(
                fields.get(1).unwrap_or(&"?"),
                num(2) as u64,
                fields.get(3).unwrap_or(&""),
            ),
            _ => {}
        }
    }
    run.lost = run.ok as i64 - (bank.total() - warm);
    run.server_cpu_us = us(cpu) / requests.max(1) as f64;
    Ok(run)
}

/// Sends one request to `base`; what it answers does not matter.
async fn warm_up(base: &str) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    if let Ok(request) =
        http::Request::post(format!("{base}/accounts/warm/deposit")).body(Empty::new())
        && let Ok(response) = client.request(request).await
    {
        let _ = response.into_body().collect().await;
    }
}

/// The load generator process: keeps `BENCH_HTTP_IN_FLIGHT` requests in flight for
/// `BENCH_HTTP_SECS`, then prints what it saw.
fn load_generator() {
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let base = var("BENCH_HTTP_BASE");
    let in_flight: usize = var("BENCH_HTTP_IN_FLIGHT").parse().unwrap_or(1);
    let accounts: u64 = var("BENCH_HTTP_ACCOUNTS").parse().unwrap_or(1).max(1);
    let window = Duration::from_secs_f64(var("BENCH_HTTP_SECS").parse().unwrap_or(2.0));
    let runtime = common::runtime();
    let report = runtime.block_on(async move {
        let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
        let start = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for task in 0..in_flight {
            let (client, base) = (client.clone(), base.clone());
            tasks.spawn(async move {
                // xorshift: a spread of accounts, the same in every run.
                let mut state = 0x9e37_79b9_7f4a_7c15_u64
                    ^ (task as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d);
                let mut latencies = Vec::new();
                let mut statuses: BTreeMap<u16, u64> = BTreeMap::new();
                let mut errors = Errors::default();
                while start.elapsed() < window {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    let url = format!("{base}/accounts/{}/deposit", state % accounts);
                    let sent = Instant::now();
                    let request = match http::Request::post(&url).body(Empty::new()) {
                        Ok(request) => request,
                        Err(e) => {
                            errors.add("request", || e.to_string());
                            continue;
                        }
                    };
                    match client.request(request).await {
                        Ok(response) => {
                            let status = response.status().as_u16();
                            let _ = response.into_body().collect().await;
                            latencies.push(sent.elapsed());
                            *statuses.entry(status).or_default() += 1;
                        }
                        Err(e) => errors.add("transport", || format!("{e:?}")),
                    }
                }
                (latencies, statuses, errors)
            });
        }
        let mut latencies = Vec::new();
        let mut statuses: BTreeMap<u16, u64> = BTreeMap::new();
        let mut errors = Errors::default();
        while let Some(result) = tasks.join_next().await {
            match result {
                Ok((l, s, e)) => {
                    latencies.extend(l);
                    for (status, n) in s {
                        *statuses.entry(status).or_default() += n;
                    }
                    errors.merge(&e);
                }
                Err(e) => errors.add("task", || e.to_string()),
            }
        }
        let elapsed = start.elapsed();
        latencies.sort_unstable();
        let ok: u64 = statuses
            .iter()
            .filter(|(s, _)| (200..300).contains(*s))
            .map(|(_, n)| n)
            .sum();
        let mut report = String::new();
        let _ = writeln!(report, "requests\t{}", latencies.len());
        let _ = writeln!(report, "ok\t{ok}");
        let _ = writeln!(
            report,
            "rate\t{}",
            latencies.len() as f64 / elapsed.as_secs_f64()
        );
        let _ = writeln!(report, "p50\t{}", quantile(&latencies, 0.5).as_nanos());
        let _ = writeln!(report, "p99\t{}", quantile(&latencies, 0.99).as_nanos());
        for (status, n) in statuses.iter().filter(|(s, _)| !(200..300).contains(*s)) {
            let _ = writeln!(report, "status\t{status}\t{n}");
        }
        for (kind, n, first) in errors.entries() {
            let first = first.replace(['\t', '\n'], " ");
            let _ = writeln!(report, "error\t{kind}\t{n}\t{first}");
        }
        report
    });
    print!("{report}");
}

/// One summary figure: its label, whether higher is better, and per variant the medians.
struct Figure {
    label: String,
    higher_is_better: bool,
    /// Per variant, the figure in each repetition.
    cells: Vec<(Variant, Vec<f64>)>,
}

/// Prints one workload's figures; returns its summary rows.
fn report(workload: Workload, runs: &[(Variant, Run)], pings: &[f64]) -> Vec<Figure> {
    println!(
        "  {:<22} {:>22} {:>18} {:>18} {:>14} {:>20} {:>10}",
        "", "req/s", "p50 ms", "p99 ms", "lost updates", "server CPU µs/req", "non-2xx"
    );
    let mut figures = vec![
        Figure {
            label: format!("{} req/s", workload.name),
            higher_is_better: true,
            cells: Vec::new(),
        },
        Figure {
            label: format!("{} p50 ms", workload.name),
            higher_is_better: false,
            cells: Vec::new(),
        },
        Figure {
            label: format!("{} p99 ms", workload.name),
            higher_is_better: false,
            cells: Vec::new(),
        },
        Figure {
            label: format!("{} server CPU µs/req", workload.name),
            higher_is_better: false,
            cells: Vec::new(),
        },
        Figure {
            label: format!("{} lost updates (sum)", workload.name),
            higher_is_better: false,
            cells: Vec::new(),
        },
    ];
    for variant in Variant::ALL {
        let mine: Vec<&Run> = runs
            .iter()
            .filter(|r| r.0 == variant)
            .map(|r| &r.1)
            .collect();
        let of = |f: fn(&Run) -> f64| -> Vec<f64> {
            (0..pings.len())
                .map(|rep| {
                    runs.iter()
                        .find(|(v, r)| *v == variant && r.rep == rep)
                        .map_or(f64::NAN, |(_, r)| f(r))
                })
                .collect()
        };
        let (rate, p50, p99, cpu) = (
            of(|r| r.rate),
            of(|r| ms(r.p50)),
            of(|r| ms(r.p99)),
            of(|r| r.server_cpu_us),
        );
        let lost_each: Vec<String> = mine.iter().map(|r| r.lost.to_string()).collect();
        let mut statuses: BTreeMap<u16, u64> = BTreeMap::new();
        let mut errors = Errors::default();
        for run in &mine {
            for (s, n) in &run.statuses {
                *statuses.entry(*s).or_default() += n;
            }
            errors.merge(&run.errors);
        }
        let non_2xx: u64 = statuses.values().sum();
        println!(
            "  {:<22} {:>22} {:>18} {:>18} {:>14} {:>20} {:>10}",
            variant.name(),
            show(&rate, 0),
            show(&p50, 3),
            show(&p99, 3),
            lost_each.join(" "),
            show(&cpu, 1),
            non_2xx
        );
        if non_2xx > 0 {
            let by_status: Vec<String> =
                statuses.iter().map(|(s, n)| format!("{s}: {n}")).collect();
            println!("  {:<22}   non-2xx by status: {}", "", by_status.join(", "));
        }
        if errors.total() > 0 {
            println!("  {:<22}   client errors: {}", "", errors.describe());
        }
        let lost = of(|r| r.lost as f64);
        for (figure, values) in figures.iter_mut().zip([rate, p50, p99, cpu, lost]) {
            figure.cells.push((variant, values));
        }
        if non_2xx + errors.total() > 0 {
            figures.push(Figure {
                label: format!("{} non-2xx + errors", workload.name),
                higher_is_better: false,
                cells: vec![(variant, vec![(non_2xx + errors.total()) as f64])],
            });
        }
    }
    if workload.in_flight == 1 {
        // The latency each lock adds to (a), per repetition, in µs and in PING round trips.
        let mut added = Figure {
            label: format!("{} added p50 µs", workload.name),
            higher_is_better: false,
            cells: Vec::new(),
        };
        let mut in_rtt = Figure {
            label: format!("{} added p50 in RTTs", workload.name),
            higher_is_better: false,
            cells: Vec::new(),
        };
        println!(
            "  PING round trip per repetition: {} µs",
            Spread::of(pings.iter().copied()).show(1)
        );
        for variant in Variant::ALL.into_iter().skip(1) {
            let mut micros = Vec::new();
            let mut rtts = Vec::new();
            for (rep, ping) in pings.iter().enumerate() {
                let p50 = |v: Variant| {
                    runs.iter()
                        .find(|(w, r)| *w == v && r.rep == rep)
                        .map(|(_, r)| us(r.p50))
                };
                match (p50(Variant::NoLock), p50(variant)) {
                    (Some(base), Some(with)) => {
                        micros.push(with - base);
                        rtts.push((with - base) / ping);
                    }
                    _ => {
                        micros.push(f64::NAN);
                        rtts.push(f64::NAN);
                    }
                }
            }
            println!(
                "  {:<22} adds {} µs at p50 over (a) = {} PING round trips",
                variant.name(),
                show(&micros, 0),
                show(&rtts, 2)
            );
            added.cells.push((variant, micros));
            in_rtt.cells.push((variant, rtts));
        }
        figures.push(added);
        figures.push(in_rtt);
    }
    figures
}

/// `median (min–max)` of per-repetition values.
fn show(values: &[f64], decimals: usize) -> String {
    Spread::of(values.iter().copied()).show(decimals)
}

/// The summary table: medians per variant (sums for lost updates and errors), and (c) / (d),
/// tower-lock's layer to rslock's middleware, of the medians and within each repetition.
fn print_summary(figures: &[Figure]) {
    println!();
    println!(
        "Summary: medians over the repetitions (lost updates and errors: sums). ratio = (c) tower-lock"
    );
    println!(
        "Redis / (d) rslock, of the medians, then the median (min–max) of the ratio within each"
    );
    println!("repetition; > 1 is better for tower-lock on rates, < 1 on times and costs.");
    print!("  {:<26}", "figure");
    for variant in Variant::ALL {
        print!(" {:>20}", variant.name());
    }
    println!(" {:>7} {:>18}", "ratio", "per-rep ratio");
    // Figures with one cell per row (errors) are merged by label.
    let mut rows: Vec<Figure> = Vec::new();
    for figure in figures {
        match rows.iter_mut().find(|r| r.label == figure.label) {
            Some(row) => row.cells.extend(figure.cells.iter().cloned()),
            None => rows.push(Figure {
                label: figure.label.clone(),
                higher_is_better: figure.higher_is_better,
                cells: figure.cells.clone(),
            }),
        }
    }
    for Figure { label, cells, .. } in &rows {
        let counted = label.contains("lost") || label.contains("errors");
        print!("  {label:<26}");
        let cell = |v: Variant| {
            cells
                .iter()
                .find(|(w, _)| *w == v)
                .map(|(_, x)| x.as_slice())
        };
        for variant in Variant::ALL {
            match cell(variant) {
                Some(x) if counted => {
                    print!(" {:>20.0}", x.iter().filter(|v| !v.is_nan()).sum::<f64>())
                }
                Some(x) => match Spread::of(x.iter().copied()).median {
                    m if m.is_nan() => print!(" {:>20}", "-"),
                    m => print!(" {:>20}", measure::cell(m, 3)),
                },
                None => print!(" {:>20}", "-"),
            }
        }
        match (cell(Variant::Redis), cell(Variant::Rslock)) {
            (Some(c), Some(d)) if !counted => {
                let median = |v: &[f64]| Spread::of(v.iter().copied()).median;
                let per_rep = Spread::of(
                    c.iter()
                        .zip(d)
                        .map(|(c, d)| c / d)
                        .filter(|r| r.is_finite()),
                );
                println!(" {:>7.2} {:>18}", median(c) / median(d), per_rep.show(2));
            }
            _ => println!(" {:>7} {:>18}", "-", "-"),
        }
    }
}
