//! What the HTTP and gRPC benches share: the in-memory balances their services update, the
//! driver over workloads, repetitions and variants, the plumbing of the load generator process
//! (the bench re-executes itself), and the pieces of their tables.
//!
//! Included with `#[path = "common/load.rs"] mod load;` next to `mod common;`, `mod measure;`
//! and `mod support;`; each bench uses a subset, hence the `dead_code` allowance.
#![allow(dead_code)]

use std::{
    collections::HashMap,
    fmt::Write as _,
    future::Future,
    process::Output,
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::{
    common,
    measure::{self, Errors, Spread, cpu_time, lock_selected, quantile, rotated, selected, us},
    support,
};

/// Balances held in process memory; read and written in separate steps, as with a database.
#[derive(Clone, Default)]
pub(crate) struct Balances {
    balances: Arc<Mutex<HashMap<String, i64>>>,
}

impl Balances {
    pub(crate) fn read(&self, account: &str) -> i64 {
        let balances = self.balances.lock().unwrap_or_else(|e| e.into_inner());
        balances.get(account).copied().unwrap_or(0)
    }

    pub(crate) fn write(&self, account: &str, balance: i64) {
        let mut balances = self.balances.lock().unwrap_or_else(|e| e.into_inner());
        balances.insert(account.to_owned(), balance);
    }

    pub(crate) fn total(&self) -> i64 {
        let balances = self.balances.lock().unwrap_or_else(|e| e.into_inner());
        balances.values().sum()
    }

    pub(crate) fn snapshot(&self) -> HashMap<String, i64> {
        self.balances.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// One of a bench's variants (no lock, a lock…).
pub(crate) trait Variant: Copy + Eq + 'static {
    /// Its name in the tables.
    fn name(self) -> &'static str;
    /// Its tag in `BENCH_LOCKS`.
    fn tag(self) -> &'static str;
}

/// One workload: what its calls do, the variants it runs, the calls in flight and the
/// accounts they spread over.
#[derive(Clone, Copy)]
pub(crate) struct Workload<V: 'static, C> {
    /// Its name in the tables and in `BENCH_ONLY`.
    pub(crate) name: &'static str,
    /// What it does, in a few words.
    pub(crate) what: &'static str,
    /// What each call does, for a bench with more than one kind of call.
    pub(crate) call: C,
    /// The variants it runs, in the order of the first repetition.
    pub(crate) variants: &'static [V],
    pub(crate) in_flight: usize,
    pub(crate) accounts: usize,
}

/// What one variant measured in one repetition.
pub(crate) struct Sample<V, R> {
    pub(crate) variant: V,
    pub(crate) rep: usize,
    pub(crate) run: R,
}

/// A bench's `main`: in the load generator process (`worker_env` set) `generator`; otherwise,
/// with a Redis server started, the setup line, then `bench` with the server's URL, the
/// repetitions (`BENCH_REPS`, 3 by default) and the window.
pub(crate) fn main(
    worker_env: &str,
    generator: fn(),
    bench: impl AsyncFnOnce(&str, usize, Duration),
) {
    if std::env::var_os(worker_env).is_some() {
        generator();
        return;
    }
    let window = common::window();
    let reps = measure::reps(3);
    let runtime = common::runtime();
    let server = support::RedisServer::start();
    runtime.block_on(async {
        let url = server.url();
        let rtt = common::ping_rtt(&url).await;
        print_setup(rtt, reps, window);
        bench(&url, reps, window).await;
    });
    drop(server);
}

/// The first line of a bench's output: the Redis server, its `PING` round trip `rtt`, the
/// repetitions and their window, the CPUs.
fn print_setup(rtt: Duration, reps: usize, window: Duration) {
    let version: Vec<String> = support::redis_version().iter().map(u32::to_string).collect();
    println!(
        "redis-server {}, PING round trip {:.1} µs; {reps} repetitions of {:.1} s windows; {} CPUs",
        version.join("."),
        us(rtt),
        window.as_secs_f64(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
}

/// Runs each workload `BENCH_ONLY` selects, under a heading: `reps` repetitions, each
/// measuring the `PING` round trip to `url` (in µs), then `run`ning the variants
/// `BENCH_LOCKS` selects in an order rotated by the repetition; then `report` prints the
/// workload's table. Returns the summary rows `report` gave.
pub(crate) async fn drive<V, C, R, Fut>(
    url: &str,
    reps: usize,
    workloads: &[Workload<V, C>],
    mut run: impl FnMut(V, Workload<V, C>) -> Fut,
    mut report: impl FnMut(Workload<V, C>, &[Sample<V, R>], &[f64]) -> Vec<Figure<V>>,
) -> Vec<Figure<V>>
where
    V: Variant,
    C: Copy,
    Fut: Future<Output = Result<R, String>>,
{
    let mut summary = Vec::new();
    for &workload in workloads {
        if !selected(workload.name) {
            continue;
        }
        println!();
        println!("{}: {}", workload.name, workload.what);
        let mut samples = Vec::new();
        let mut pings = Vec::new();
        for rep in 0..reps {
            pings.push(us(common::ping_rtt(url).await));
            for variant in rotated(workload.variants, rep) {
                if !lock_selected(variant.tag()) {
                    continue;
                }
                match run(variant, workload).await {
                    Ok(measured) => samples.push(Sample { variant, rep, run: measured }),
                    Err(e) => println!("  {} rep {rep}: {e}", variant.name()),
                }
            }
        }
        summary.extend(report(workload, &samples, &pings));
    }
    summary
}

/// A listener on a free loopback port, and its `http://` address.
pub(crate) async fn bind_loopback() -> Result<(tokio::net::TcpListener, String), String> {
    let listener =
        tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(|e| format!("bind: {e}"))?;
    let base = format!("http://{}", listener.local_addr().map_err(|e| e.to_string())?);
    Ok((listener, base))
}

/// What the load generator process is asked to do, passed to it in the environment variables
/// `<prefix>_BASE`, `_IN_FLIGHT`, `_ACCOUNTS` and `_SECS`.
pub(crate) struct Load {
    /// The server's address.
    pub(crate) base: String,
    /// Calls kept in flight.
    pub(crate) in_flight: usize,
    /// The accounts they spread over.
    pub(crate) accounts: u64,
    pub(crate) window: Duration,
}

impl Load {
    /// `workload`'s load on the server at `base` for `window`.
    pub(crate) fn new<V, C>(base: String, workload: &Workload<V, C>, window: Duration) -> Self {
        Self { base, in_flight: workload.in_flight, accounts: workload.accounts as u64, window }
    }

    /// The load asked of this process, in the variables named after `prefix`.
    pub(crate) fn from_env(prefix: &str) -> Self {
        let var = |name: &str| std::env::var(format!("{prefix}_{name}")).unwrap_or_default();
        Self {
            base: var("BASE"),
            in_flight: var("IN_FLIGHT").parse().unwrap_or(1),
            accounts: var("ACCOUNTS").parse().unwrap_or(1).max(1),
            window: Duration::from_secs_f64(var("SECS").parse().unwrap_or(2.0)),
        }
    }

    /// Runs this bench's binary again with `worker_env` set, as the load generator of this
    /// load (in the variables named after `prefix`, and `extra`), and waits for it. Returns its
    /// standard output and the CPU time this process spent meanwhile, or why it failed.
    pub(crate) async fn generate(
        &self,
        worker_env: &str,
        prefix: &str,
        extra: &[(&str, &str)],
    ) -> Result<(Output, Duration), String> {
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let cpu = cpu_time();
        let output = tokio::process::Command::new(exe)
            .env(worker_env, "1")
            .env(format!("{prefix}_BASE"), &self.base)
            .envs(extra.iter().map(|(k, v)| (format!("{prefix}_{k}"), v)))
            .env(format!("{prefix}_IN_FLIGHT"), self.in_flight.to_string())
            .env(format!("{prefix}_ACCOUNTS"), self.accounts.to_string())
            .env(format!("{prefix}_SECS"), self.window.as_secs_f64().to_string())
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|e| format!("load generator: {e}"))?;
        Ok((output, cpu_time().saturating_sub(cpu)))
    }
}

/// The standard output of a load generator that succeeded; why not otherwise.
pub(crate) fn stdout(output: &Output) -> Result<String, String> {
    if !output.status.success() {
        return Err(format!(
            "load generator exited with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// xorshift: a spread of accounts, the same in every run, a sequence of its own per task.
pub(crate) struct Xorshift(u64);

impl Xorshift {
    pub(crate) fn new(task: usize) -> Self {
        Self(0x9e37_79b9_7f4a_7c15_u64 ^ (task as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d))
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Field `i` of a `\t`-separated line of the load generator's output as a number; 0 when it
/// is missing or not one.
pub(crate) fn num(fields: &[&str], i: usize) -> f64 {
    fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0)
}

/// What a load generator saw, as both load generators report it: one `key\tvalue…` line each.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    /// Calls answered, whatever the answer.
    pub(crate) calls: u64,
    /// Calls that succeeded.
    pub(crate) ok: u64,
    pub(crate) secs: f64,
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
    /// Calls that got no answer, by kind.
    pub(crate) errors: Errors,
}

impl Seen {
    /// What `latencies` (sorted) over `secs` seconds, `ok` of them successful, and `errors`
    /// make.
    pub(crate) fn of(latencies: &[Duration], ok: u64, secs: f64, errors: Errors) -> Self {
        Self {
            calls: latencies.len() as u64,
            ok,
            secs,
            p50: quantile(latencies, 0.5),
            p99: quantile(latencies, 0.99),
            errors,
        }
    }

    /// Its lines, for the bench process to read.
    pub(crate) fn write(&self, report: &mut String) {
        let _ = writeln!(report, "calls\t{}", self.calls);
        let _ = writeln!(report, "ok\t{}", self.ok);
        let _ = writeln!(report, "secs\t{}", self.secs);
        let _ = writeln!(report, "p50\t{}", self.p50.as_nanos());
        let _ = writeln!(report, "p99\t{}", self.p99.as_nanos());
        for (kind, n, first) in self.errors.entries() {
            let first = first.replace(['\t', '\n'], " ");
            let _ = writeln!(report, "error\t{kind}\t{n}\t{first}");
        }
    }

    /// Reads the lines of `output`; hands the fields of lines of other keys to `other`.
    pub(crate) fn read(output: &str, mut other: impl FnMut(&[&str])) -> Self {
        let mut seen = Self::default();
        for line in output.lines() {
            let fields: Vec<&str> = line.split('\t').collect();
            let field = |i: usize| fields.get(i).copied().unwrap_or("");
            let num = |i: usize| num(&fields, i);
            match field(0) {
                "calls" => seen.calls = num(1) as u64,
                "ok" => seen.ok = num(1) as u64,
                "secs" => seen.secs = num(1),
                "p50" => seen.p50 = Duration::from_nanos(num(1) as u64),
                "p99" => seen.p99 = Duration::from_nanos(num(1) as u64),
                "error" => seen.errors.add_n(field(1), num(2) as u64, field(3)),
                _ => other(&fields),
            }
        }
        seen
    }

    /// Successful calls per second.
    pub(crate) fn ok_rate(&self) -> f64 {
        if self.secs > 0.0 { self.ok as f64 / self.secs } else { 0.0 }
    }

    /// `cpu` in µs per call.
    pub(crate) fn cpu_per_call(&self, cpu: Duration) -> f64 {
        us(cpu) / self.calls.max(1) as f64
    }
}

/// One summary figure: its label, whether it is a count (summed over the repetitions in the
/// summary), and per variant its value in each repetition.
pub(crate) struct Figure<V> {
    pub(crate) label: String,
    pub(crate) summed: bool,
    /// Per variant, the figure in each repetition.
    pub(crate) cells: Vec<(V, Vec<f64>)>,
}

impl<V: Variant> Figure<V> {
    pub(crate) fn new(label: String, summed: bool) -> Self {
        Self { label, summed, cells: Vec::new() }
    }

    /// `variant`'s values, if it has a cell.
    pub(crate) fn cell(&self, variant: V) -> Option<&[f64]> {
        self.cells.iter().find(|(v, _)| *v == variant).map(|(_, x)| x.as_slice())
    }
}

/// `variant`'s `figure` in each of `reps` repetitions; `NaN` where it has no sample.
pub(crate) fn per_rep<V: Variant, R>(
    samples: &[Sample<V, R>],
    variant: V,
    reps: usize,
    figure: impl Fn(&R) -> f64,
) -> Vec<f64> {
    (0..reps)
        .map(|rep| {
            samples
                .iter()
                .find(|s| s.variant == variant && s.rep == rep)
                .map_or(f64::NAN, |s| figure(&s.run))
        })
        .collect()
}

/// `median (min–max)` of per-repetition values.
pub(crate) fn show(values: &[f64], decimals: usize) -> String {
    Spread::of(values.iter().copied()).show(decimals)
}

/// For a workload of one call at a time: prints the `PING` round trip of each repetition
/// (`pings`, µs), then for each of `variants` the latency it adds at p50 over `base`, in µs
/// and in round trips of the same repetition. Returns those per variant.
pub(crate) fn added_p50<V: Variant, R>(
    samples: &[Sample<V, R>],
    pings: &[f64],
    base: V,
    variants: &[V],
    p50: impl Fn(&R) -> Duration,
) -> Vec<(V, Vec<f64>, Vec<f64>)> {
    println!("  PING round trip per repetition: {} µs", Spread::of(pings.iter().copied()).show(1));
    let mut added = Vec::new();
    for &variant in variants {
        let mut micros = Vec::new();
        let mut rtts = Vec::new();
        for (rep, ping) in pings.iter().enumerate() {
            let p50 = |v: V| {
                samples.iter().find(|s| s.variant == v && s.rep == rep).map(|s| us(p50(&s.run)))
            };
            let more = match (p50(base), p50(variant)) {
                (Some(base), Some(with)) => with - base,
                _ => f64::NAN,
            };
            micros.push(more);
            rtts.push(more / ping);
        }
        println!(
            "  {:<22} adds {} µs at p50 over (a) = {} PING round trips",
            variant.name(),
            show(&micros, 0),
            show(&rtts, 2)
        );
        added.push((variant, micros, rtts));
    }
    added
}

/// The summary table of `rows`: per row, the median over the repetitions of each of `columns`
/// (the sum for counts), then `x / y` of the medians and the spread of `x / y` within each
/// repetition.
pub(crate) fn print_table<V: Variant>(rows: &[Figure<V>], columns: &[V], (x, y): (V, V)) {
    print!("  {:<30}", "figure");
    for variant in columns {
        print!(" {:>21}", variant.name());
    }
    println!(" {:>7} {:>18}", "ratio", "per-rep ratio");
    for row in rows {
        print!("  {:<30}", row.label);
        for &variant in columns {
            match row.cell(variant) {
                Some(v) if row.summed => {
                    print!(" {:>21.0}", v.iter().filter(|v| !v.is_nan()).sum::<f64>())
                }
                Some(v) => match Spread::of(v.iter().copied()).median {
                    m if m.is_nan() => print!(" {:>21}", "-"),
                    m => print!(" {:>21}", measure::cell(m, 3)),
                },
                None => print!(" {:>21}", "-"),
            }
        }
        match (row.cell(x), row.cell(y)) {
            (Some(x), Some(y)) if !row.summed => {
                let (of_medians, per_rep) = ratios(x, y);
                println!(" {of_medians:>7.2} {:>18}", per_rep.show(2));
            }
            _ => println!(" {:>7} {:>18}", "-", "-"),
        }
    }
}

/// `x / y` of the medians, and the spread of `x / y` within each repetition.
pub(crate) fn ratios(x: &[f64], y: &[f64]) -> (f64, Spread) {
    let median = |v: &[f64]| Spread::of(v.iter().copied()).median;
    let per_rep = Spread::of(x.iter().zip(y).map(|(x, y)| x / y).filter(|r| r.is_finite()));
    (median(x) / median(y), per_rep)
}
