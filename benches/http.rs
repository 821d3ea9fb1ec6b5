//! HTTP load on an axum deposit route, against a Redis server this bench starts: tower-lock's
//! `LockLayer` beside no lock at all and beside a hand-written axum middleware using the
//! `rslock` crate, in the same run. The server runs in this process; the load generator runs in
//! a process of its own (the bench re-executes itself), so the server's CPU time per request is
//! measured apart from the client's.
//!
//! ```text
//! cargo bench --bench http --features axum                          # 3 repetitions of 2 s
//! BENCH_SECS=1 BENCH_REPS=3 cargo bench --bench http --features axum
//! BENCH_ONLY=H2 cargo bench --bench http --features axum
//! BENCH_ONLY=T1,T2 cargo bench --bench http --features axum         # transfers only
//! BENCH_LOCKS=memory,none cargo bench --bench http --features axum  # some variants only
//! ```
//!
//! Deposits (H1–H3): the handler reads an account's balance, awaits (`yield_now`), and writes
//! back balance + 1: without a lock, concurrent requests on one account lose updates. The load
//! generator counts its successful requests; lost updates = successes − sum of the balances
//! (0 under any lock).
//!
//! Transfers (T1, T2): `POST /transfers/{from}/{to}` reads both balances, awaits, and writes
//! `from − 1` and `to + 1`. The total of all balances must not move (its drift is 0 under both
//! locks), and each account must end where the load generator's successful transfers put it.
//!
//! - (a) no lock; (b) `LockLayer` + `MemoryBackend`; (c) `LockLayer` + Redis; (d) an axum
//!   `from_fn` middleware taking rslock locks: the account's, or for a transfer both accounts'
//!   in sorted order; (e) transfers only: the same middleware taking them in the request's
//!   order, with a short wait, so that opposite transfers deadlock until it runs out.
//! - H1: 32 requests in flight over 1 000 accounts; H2: 16 in flight on one account; H3: one
//!   request at a time: the latency each lock adds to (a), also in Redis `PING` round trips
//!   measured in the same repetition.
//! - T1: 32 transfers in flight between random pairs of 1 000 accounts; T2: 16 in flight
//!   among 4 accounts (opposite transfers at once are common).

mod common;
#[path = "common/load.rs"]
mod load;
#[path = "common/measure.rs"]
mod measure;
#[path = "../tests/support/mod.rs"]
mod support;

use std::{
    collections::{BTreeMap, HashMap},
    fmt::Write as _,
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
use load::{
    Balances, Figure, Load, Sample, Seen, Variant as _, Xorshift, added_p50, per_rep, ratios, show,
};
use measure::{Errors, Spread, ms};
use tower_lock::{Backend, LockClient, LockLayer, MemoryBackend, key};

/// The environment variable that makes the bench binary the load generator.
const WORKER_ENV: &str = "TOWER_LOCK_BENCH_LOADGEN";
/// The prefix of the variables that tell the load generator its load.
const LOAD_ENV: &str = "BENCH_HTTP";
/// Lock lease (tower-lock's default watchdog lease; rslock's TTL) and the longest wait.
const LEASE: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(30);
/// rslock's retries per `lock()` (its default) and the bound of its random retry delay.
const RSLOCK_RETRY_COUNT: u32 = 3;
const RSLOCK_RETRY_DELAY: Duration = Duration::from_millis(10);
/// (e)'s wait for both locks: a deadlock of opposite transfers lasts this long, then 423.
const NAIVE_WAIT: Duration = Duration::from_millis(100);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    NoLock,
    Memory,
    Redis,
    Rslock,
    /// Transfers only: rslock locks in the request's order.
    RslockNaive,
}

impl Variant {
    const ALL: [Self; 5] =
        [Self::NoLock, Self::Memory, Self::Redis, Self::Rslock, Self::RslockNaive];
    /// One key per request: a request order to get wrong needs two.
    const DEPOSITS: &[Self] = &[Self::NoLock, Self::Memory, Self::Redis, Self::Rslock];
}

impl load::Variant for Variant {
    fn name(self) -> &'static str {
        match self {
            Self::NoLock => "(a) no lock",
            Self::Memory => "(b) LockLayer memory",
            Self::Redis => "(c) LockLayer Redis",
            Self::Rslock => "(d) rslock from_fn",
            Self::RslockNaive => "(e) rslock req. order",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Self::NoLock => "none",
            Self::Memory => "memory",
            Self::Redis => "tower",
            Self::Rslock => "rslock",
            Self::RslockNaive => "naive",
        }
    }
}

/// What a workload's requests do.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    /// `POST /accounts/{id}/deposit`.
    Deposit,
    /// `POST /transfers/{from}/{to}`, two different accounts.
    Transfer,
}

impl Route {
    fn as_str(self) -> &'static str {
        match self {
            Self::Deposit => "deposit",
            Self::Transfer => "transfer",
        }
    }
}

/// One workload: its route, requests in flight and the accounts they spread over.
type Workload = load::Workload<Variant, Route>;

const WORKLOADS: [Workload; 5] = [
    Workload {
        name: "H1",
        what: "32 in flight over 1000 accounts",
        call: Route::Deposit,
        variants: Variant::DEPOSITS,
        in_flight: 32,
        accounts: 1000,
    },
    Workload {
        name: "H2",
        what: "16 in flight on one account",
        call: Route::Deposit,
        variants: Variant::DEPOSITS,
        in_flight: 16,
        accounts: 1,
    },
    Workload {
        name: "H3",
        what: "one request at a time over 1000 accounts",
        call: Route::Deposit,
        variants: Variant::DEPOSITS,
        in_flight: 1,
        accounts: 1000,
    },
    Workload {
        name: "T1",
        what: "transfers, 32 in flight between random pairs of 1000 accounts",
        call: Route::Transfer,
        variants: &Variant::ALL,
        in_flight: 32,
        accounts: 1000,
    },
    Workload {
        name: "T2",
        what: "transfers, 16 in flight among 4 accounts",
        call: Route::Transfer,
        variants: &Variant::ALL,
        in_flight: 16,
        accounts: 4,
    },
];

fn main() {
    load::main(WORKER_ENV, load_generator, async |url, reps, window| {
        println!(
            "(d) rslock: {RSLOCK_RETRY_COUNT} retries per lock() with a random delay below {RSLOCK_RETRY_DELAY:?}, acquire() looping, TTL {LEASE:?}"
        );
        println!(
            "transfers: (d) locks in sorted order, lock() looping until a {WAIT:?} deadline; (e) in request order, {NAIVE_WAIT:?} deadline"
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

/// Deposits 1: read the balance, await, write it back.
async fn deposit(State(bank): State<Balances>, Path(id): Path<String>) -> &'static str {
    let balance = bank.read(&id);
    tokio::task::yield_now().await;
    bank.write(&id, balance + 1);
    "ok"
}

/// Transfers 1: read both balances, await, write both back.
async fn transfer(
    State(bank): State<Balances>,
    Path((from, to)): Path<(String, String)>,
) -> Result<&'static str, StatusCode> {
    // One account on both sides would write two stale balances to one key.
    if from == to {
        return Err(StatusCode::UNPROCESSABLE_ENTITY);
    }
    let (from_balance, to_balance) = (bank.read(&from), bank.read(&to));
    tokio::task::yield_now().await;
    bank.write(&from, from_balance - 1);
    bank.write(&to, to_balance + 1);
    Ok("ok")
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

/// (d) and (e) on transfers: rslock's locks on both accounts around the handler.
#[derive(Clone)]
struct PairLocks {
    locks: rslock::LockManager,
    /// (d): sorted, as a careful user takes them; (e): in the request's order.
    sorted: bool,
    wait: Duration,
}

/// Both accounts' rslock locks, taken one after the other under one deadline; 423 (as the
/// layer answers when its wait runs out) after releasing what it took, if the deadline passes.
async fn with_rslock_pair(
    State(pair): State<PairLocks>,
    Path((from, to)): Path<(String, String)>,
    request: Request,
    next: Next,
) -> Response {
    let mut keys = vec![format!("account:{from}"), format!("account:{to}")];
    if pair.sorted {
        keys.sort();
    }
    // rslock is not reentrant: one account named twice must be locked once.
    keys.dedup();
    let deadline = Instant::now() + pair.wait;
    let mut held = Vec::with_capacity(keys.len());
    for key in &keys {
        match lock_until(&pair.locks, key, deadline).await {
            Some(lock) => held.push(lock),
            None => {
                release_all(held).await;
                return StatusCode::LOCKED.into_response();
            }
        }
    }
    let response = next.run(request).await;
    release_all(held).await;
    response
}

/// rslock's `lock()` until it grants or `deadline` has passed: `acquire()`'s own loop, with the
/// deadline checked between attempts instead of a timeout cancelling one, which could leave a
/// `SET` it made in place until the TTL.
async fn lock_until(
    locks: &rslock::LockManager,
    key: &str,
    deadline: Instant,
) -> Option<rslock::Lock> {
    loop {
        if let Ok(lock) = locks.lock(key, LEASE).await {
            return Some(lock);
        }
        if Instant::now() >= deadline {
            return None;
        }
    }
}

/// Releases `locks` concurrently, as `MultiGuard::release` does.
async fn release_all(locks: Vec<rslock::Lock>) {
    futures_util::future::join_all(locks.into_iter().map(rslock::Lock::release)).await;
}

/// The unlocked routes of `route`.
fn routes(route: Route) -> Router<Balances> {
    match route {
        Route::Deposit => Router::new().route("/accounts/{id}/deposit", post(deposit)),
        Route::Transfer => Router::new().route("/transfers/{from}/{to}", post(transfer)),
    }
}

/// `route` under a `LockLayer` on `locks`. Keys are prefixed `account:`, so the lock of an
/// account is `account:<id>` for a deposit and for either side of a transfer alike (a set's
/// namespace is otherwise the matched route, as its two parameters' differ).
fn locked<B: Backend>(route: Route, locks: &LockClient<B>) -> Router<Balances> {
    let layer = LockLayer::new(locks.clone()).wait(WAIT);
    match route {
        Route::Deposit => {
            routes(route).route_layer(layer.key(key::path_param("id").prefixed("account:")))
        }
        Route::Transfer => {
            routes(route).route_layer(layer.key(
                key::all([key::path_param("from"), key::path_param("to")]).prefixed("account:"),
            ))
        }
    }
}

/// The service of `variant` for `route`, with the background work to stop after the run.
async fn app(
    variant: Variant,
    route: Route,
    url: &str,
    bank: Balances,
) -> Result<(Router, Stop), String> {
    let rslock = || {
        let mut locks = rslock::LockManager::new(vec![url.to_owned()]);
        locks.set_retry(RSLOCK_RETRY_COUNT, RSLOCK_RETRY_DELAY);
        locks
    };
    Ok(match variant {
        Variant::NoLock => (routes(route).with_state(bank), Stop::Nothing),
        Variant::Memory => {
            let locks =
                LockClient::builder(MemoryBackend::new()).build().map_err(|e| e.to_string())?;
            (locked(route, &locks).with_state(bank), Stop::Memory(locks))
        }
        Variant::Redis => {
            let backend = support::redis_backend(url)
                .connect()
                .await
                .map_err(|e| format!("connect: {e:#}"))?;
            let locks = LockClient::builder(backend).build().map_err(|e| e.to_string())?;
            (locked(route, &locks).with_state(bank), Stop::Redis(locks))
        }
        Variant::Rslock if route == Route::Deposit => {
            let layer = middleware::from_fn_with_state(rslock(), with_rslock);
            (routes(route).route_layer(layer).with_state(bank), Stop::Nothing)
        }
        Variant::Rslock | Variant::RslockNaive => {
            let pair = PairLocks {
                locks: rslock(),
                sorted: variant == Variant::Rslock,
                wait: if variant == Variant::Rslock { WAIT } else { NAIVE_WAIT },
            };
            let layer = middleware::from_fn_with_state(pair, with_rslock_pair);
            (routes(route).route_layer(layer).with_state(bank), Stop::Nothing)
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
    /// Responses per second, whatever their status.
    rate: f64,
    /// 2xx responses per second: for transfers, the transfers made.
    ok_rate: f64,
    p50: Duration,
    p99: Duration,
    /// Deposits: successes − the sum of the balances' increase. Transfers: the sum over the
    /// accounts of |balance − what the successful transfers make it|; unlike the drift, lost
    /// writes of opposite signs do not cancel in it.
    lost: i64,
    /// Transfers: the sum of the balances' change (0 when every transfer is whole).
    drift: i64,
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
    let bank = Balances::default();
    let (router, stop) = app(variant, workload.call, url, bank.clone()).await?;
    let (listener, base) = load::bind_loopback().await?;
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    // One warm-up request: connections and scripts ready before the window.
    warm_up(&base, workload.call).await;
    let warm = bank.snapshot();
    let load = Load::new(base, &workload, window);
    let route = [("ROUTE", workload.call.as_str())];
    let (output, cpu) = load.generate(WORKER_ENV, LOAD_ENV, &route).await?;
    server.abort();
    match stop {
        Stop::Nothing => {}
        Stop::Memory(locks) => locks.shutdown().await,
        Stop::Redis(locks) => locks.shutdown().await,
    }
    let mut run = Run::default();
    // Per account, what the successful transfers added.
    let mut net: HashMap<String, i64> = HashMap::new();
    let seen = Seen::read(&load::stdout(&output)?, |fields| match fields[0] {
        "rate" => run.rate = load::num(fields, 1),
        "status" => {
            run.statuses.insert(load::num(fields, 1) as u16, load::num(fields, 2) as u64);
        }
        "net" => {
            let account = fields.get(1).unwrap_or(&"?").to_string();
            net.insert(account, load::num(fields, 2) as i64);
        }
        _ => {}
    });
    run.ok_rate = seen.ok_rate();
    run.p50 = seen.p50;
    run.p99 = seen.p99;
    let warm_total: i64 = warm.values().sum();
    match workload.call {
        Route::Deposit => run.lost = seen.ok as i64 - (bank.total() - warm_total),
        Route::Transfer => {
            let after = bank.snapshot();
            run.drift = after.values().sum::<i64>() - warm_total;
            let at = |balances: &HashMap<String, i64>, account: &String| {
                balances.get(account).copied().unwrap_or(0)
            };
            run.lost = after
                .keys()
                .chain(net.keys())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .map(|account| (at(&after, account) - at(&warm, account) - at(&net, account)).abs())
                .sum();
        }
    }
    run.server_cpu_us = seen.cpu_per_call(cpu);
    run.errors = seen.errors;
    Ok(run)
}

/// Sends one request of `route` to `base`, on accounts of its own; what it answers does not
/// matter.
async fn warm_up(base: &str, route: Route) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let url = match route {
        Route::Deposit => format!("{base}/accounts/warm/deposit"),
        Route::Transfer => format!("{base}/transfers/warm-a/warm-b"),
    };
    if let Ok(request) = http::Request::post(url).body(Empty::new())
        && let Ok(response) = client.request(request).await
    {
        let _ = response.into_body().collect().await;
    }
}

/// The load generator process: keeps `BENCH_HTTP_IN_FLIGHT` requests in flight for
/// `BENCH_HTTP_SECS`, then prints what it saw.
fn load_generator() {
    let Load { base, in_flight, accounts, window } = Load::from_env(LOAD_ENV);
    let transfers =
        std::env::var(format!("{LOAD_ENV}_ROUTE")).is_ok_and(|r| r == Route::Transfer.as_str());
    let runtime = common::runtime();
    let report = runtime.block_on(async move {
        let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
        let start = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for task in 0..in_flight {
            let (client, base) = (client.clone(), base.clone());
            tasks.spawn(async move {
                let mut accounts_at = Xorshift::new(task);
                let mut latencies = Vec::new();
                let mut statuses: BTreeMap<u16, u64> = BTreeMap::new();
                let mut errors = Errors::default();
                // Transfers: per account, what the successful ones added.
                let mut net: HashMap<u64, i64> = HashMap::new();
                while start.elapsed() < window {
                    let state = accounts_at.next();
                    let from = state % accounts;
                    // Another account, uniformly: never a transfer to itself.
                    let to = (from + 1 + (state / accounts) % (accounts - 1).max(1)) % accounts;
                    let url = if transfers {
                        format!("{base}/transfers/{from}/{to}")
                    } else {
                        format!("{base}/accounts/{from}/deposit")
                    };
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
                            if transfers && (200..300).contains(&status) {
                                *net.entry(from).or_default() -= 1;
                                *net.entry(to).or_default() += 1;
                            }
                        }
                        Err(e) => errors.add("transport", || format!("{e:?}")),
                    }
                }
                (latencies, statuses, errors, net)
            });
        }
        let mut latencies = Vec::new();
        let mut statuses: BTreeMap<u16, u64> = BTreeMap::new();
        let mut errors = Errors::default();
        let mut net: BTreeMap<u64, i64> = BTreeMap::new();
        while let Some(result) = tasks.join_next().await {
            match result {
                Ok((l, s, e, t)) => {
                    latencies.extend(l);
                    for (status, n) in s {
                        *statuses.entry(status).or_default() += n;
                    }
                    errors.merge(&e);
                    for (account, n) in t {
                        *net.entry(account).or_default() += n;
                    }
                }
                Err(e) => errors.add("task", || e.to_string()),
            }
        }
        let secs = start.elapsed().as_secs_f64();
        latencies.sort_unstable();
        let ok: u64 =
            statuses.iter().filter(|(s, _)| (200..300).contains(*s)).map(|(_, n)| n).sum();
        let mut report = String::new();
        let _ = writeln!(report, "rate\t{}", latencies.len() as f64 / secs);
        Seen::of(&latencies, ok, secs, errors).write(&mut report);
        for (status, n) in statuses.iter().filter(|(s, _)| !(200..300).contains(*s)) {
            let _ = writeln!(report, "status\t{status}\t{n}");
        }
        for (account, n) in &net {
            let _ = writeln!(report, "net\t{account}\t{n}");
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
    let transfers = workload.call == Route::Transfer;
    if transfers {
        println!(
            "  {:<22} {:>22} {:>24} {:>24} {:>12} {:>14} {:>20} {:>10}",
            "",
            "transfers/s",
            "p50 ms",
            "p99 ms",
            "total drift",
            "balances off",
            "server CPU µs/req",
            "non-2xx"
        );
    } else {
        println!(
            "  {:<22} {:>22} {:>18} {:>18} {:>14} {:>20} {:>10}",
            "", "req/s", "p50 ms", "p99 ms", "lost updates", "server CPU µs/req", "non-2xx"
        );
    }
    let rate = if transfers { "transfers/s" } else { "req/s" };
    let mut figures = vec![
        Figure::new(format!("{name} {rate}"), false),
        Figure::new(format!("{name} p50 ms"), false),
        Figure::new(format!("{name} p99 ms"), false),
        Figure::new(format!("{name} server CPU µs/req"), false),
    ];
    if transfers {
        figures.push(Figure::new(format!("{name} |total drift| (sum)"), true));
        figures.push(Figure::new(format!("{name} balances off (sum)"), true));
    } else {
        figures.push(Figure::new(format!("{name} lost updates (sum)"), true));
    }
    for &variant in workload.variants {
        let mine: Vec<&Run> =
            runs.iter().filter(|s| s.variant == variant).map(|s| &s.run).collect();
        let of = |f: fn(&Run) -> f64| per_rep(runs, variant, pings.len(), f);
        let (rate, p50, p99, cpu) = (
            if transfers { of(|r| r.ok_rate) } else { of(|r| r.rate) },
            of(|r| ms(r.p50)),
            of(|r| ms(r.p99)),
            of(|r| r.server_cpu_us),
        );
        let each = |f: fn(&Run) -> i64| -> String {
            let each: Vec<String> = mine.iter().map(|r| f(r).to_string()).collect();
            each.join(" ")
        };
        let mut statuses: BTreeMap<u16, u64> = BTreeMap::new();
        let mut errors = Errors::default();
        for run in &mine {
            for (s, n) in &run.statuses {
                *statuses.entry(*s).or_default() += n;
            }
            errors.merge(&run.errors);
        }
        let non_2xx: u64 = statuses.values().sum();
        if transfers {
            println!(
                "  {:<22} {:>22} {:>24} {:>24} {:>12} {:>14} {:>20} {:>10}",
                variant.name(),
                show(&rate, 0),
                show(&p50, 3),
                show(&p99, 3),
                each(|r| r.drift),
                each(|r| r.lost),
                show(&cpu, 1),
                non_2xx
            );
        } else {
            println!(
                "  {:<22} {:>22} {:>18} {:>18} {:>14} {:>20} {:>10}",
                variant.name(),
                show(&rate, 0),
                show(&p50, 3),
                show(&p99, 3),
                each(|r| r.lost),
                show(&cpu, 1),
                non_2xx
            );
        }
        if non_2xx > 0 {
            let by_status: Vec<String> =
                statuses.iter().map(|(s, n)| format!("{s}: {n}")).collect();
            println!("  {:<22}   non-2xx by status: {}", "", by_status.join(", "));
        }
        if errors.total() > 0 {
            println!("  {:<22}   client errors: {}", "", errors.describe());
        }
        let mut values = vec![rate, p50, p99, cpu];
        if transfers {
            values.push(of(|r| r.drift.abs() as f64));
        }
        values.push(of(|r| r.lost as f64));
        for (figure, values) in figures.iter_mut().zip(values) {
            figure.cells.push((variant, values));
        }
        if non_2xx + errors.total() > 0 {
            let mut figure = Figure::new(format!("{name} non-2xx + errors"), true);
            figure.cells.push((variant, vec![(non_2xx + errors.total()) as f64]));
            figures.push(figure);
        }
    }
    if workload.in_flight == 1 {
        // The latency each lock adds to (a), per repetition, in µs and in PING round trips.
        let mut added = Figure::new(format!("{name} added p50 µs"), false);
        let mut in_rtt = Figure::new(format!("{name} added p50 in RTTs"), false);
        let others = &workload.variants[1..];
        for (variant, micros, rtts) in added_p50(runs, pings, Variant::NoLock, others, |r| r.p50) {
            added.cells.push((variant, micros));
            in_rtt.cells.push((variant, rtts));
        }
        figures.push(added);
        figures.push(in_rtt);
    }
    figures
}

/// The summary table: medians per variant (sums for counts), and (c) / (d), tower-lock's layer
/// to rslock's middleware, of the medians and within each repetition.
fn print_summary(figures: &[Figure<Variant>]) {
    println!();
    println!(
        "Summary: medians over the repetitions (lost updates, drift, balances off and errors: sums)."
    );
    println!(
        "ratio = (c) tower-lock Redis / (d) rslock, of the medians, then the median (min–max) of the"
    );
    println!(
        "ratio within each repetition; > 1 is better for tower-lock on rates, < 1 on times and costs."
    );
    // A column only for the variants some workload ran.
    let columns: Vec<Variant> = Variant::ALL
        .into_iter()
        .filter(|v| figures.iter().any(|f| f.cells.iter().any(|(w, _)| w == v)))
        .collect();
    // Figures with one cell per row (errors) are merged by label.
    let mut rows: Vec<Figure<Variant>> = Vec::new();
    for figure in figures {
        match rows.iter_mut().find(|r| r.label == figure.label) {
            Some(row) => row.cells.extend(figure.cells.iter().cloned()),
            None => rows.push(Figure {
                label: figure.label.clone(),
                summed: figure.summed,
                cells: figure.cells.clone(),
            }),
        }
    }
    load::print_table(&rows, &columns, (Variant::Redis, Variant::Rslock));
    print_layer_cost(&rows);
}

/// (b) / (a): what `LockLayer` on the in-memory backend costs against no lock, of the medians
/// and within each repetition (the machine's noise moves both variants of one repetition
/// together).
fn print_layer_cost(rows: &[Figure<Variant>]) {
    let pairs: Vec<(&str, &[f64], &[f64])> = rows
        .iter()
        .filter(|row| !row.summed)
        .filter_map(|row| {
            Some((row.label.as_str(), row.cell(Variant::Memory)?, row.cell(Variant::NoLock)?))
        })
        // Only the figures both variants measured.
        .filter(|(_, b, a)| {
            let median = |v: &[f64]| Spread::of(v.iter().copied()).median;
            median(b).is_finite() && median(a).is_finite()
        })
        .collect();
    if pairs.is_empty() {
        return;
    }
    println!();
    println!("(b) LockLayer memory / (a) no lock: of the medians, then per repetition.");
    for (label, b, a) in pairs {
        let (of_medians, per_rep) = ratios(b, a);
        println!("  {label:<30} {of_medians:>7.2} {:>18}", per_rep.show(2));
    }
}
