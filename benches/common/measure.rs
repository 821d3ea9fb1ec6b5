//! What the engine and HTTP benches measure with: repetitions, medians and spreads, error
//! tallies, process CPU time, a monotonic clock comparable across processes, and Redis's own
//! counters (`INFO commandstats` and `INFO cpu`).
//!
//! Included with `#[path = "common/measure.rs"] mod measure;` next to `mod support;`; each bench
//! uses a subset, hence the `dead_code` allowance.
#![allow(dead_code)]

use std::{collections::BTreeMap, fmt::Write as _, time::Duration};

use crate::support::RedisServer;

/// Interleaved repetitions of every figure: `BENCH_REPS`, 5 by default, at least 1.
pub(crate) fn reps(default: usize) -> usize {
    std::env::var("BENCH_REPS").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(default).max(1)
}

/// Whether workload `name` runs: `BENCH_ONLY=W1,W3` selects some (case-insensitive); all run
/// without it.
pub(crate) fn selected(name: &str) -> bool {
    match std::env::var("BENCH_ONLY") {
        Ok(only) if !only.trim().is_empty() => {
            only.split(',').any(|item| item.trim().eq_ignore_ascii_case(name))
        }
        _ => true,
    }
}

/// Whether the lock (or HTTP variant) tagged `tag` runs: `BENCH_LOCKS=tower,rslock` selects
/// some, for profiling one at a time; all run without it.
pub(crate) fn lock_selected(tag: &str) -> bool {
    match std::env::var("BENCH_LOCKS") {
        Ok(only) if !only.trim().is_empty() => only.split(',').any(|item| item.trim() == tag),
        _ => true,
    }
}

/// `items` rotated left by `rep`: repetition 0 runs them in order, 1 starts with the second…
pub(crate) fn rotated<T: Clone>(items: &[T], rep: usize) -> Vec<T> {
    let mut items = items.to_vec();
    if !items.is_empty() {
        let by = rep % items.len();
        items.rotate_left(by);
    }
    items
}

/// User + system CPU time of this whole process so far (all threads).
#[cfg(target_os = "linux")]
pub(crate) fn cpu_time() -> Duration {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// User + system CPU time of this process (not measured off Linux).
#[cfg(not(target_os = "linux"))]
pub(crate) fn cpu_time() -> Duration {
    Duration::ZERO
}

/// `CLOCK_MONOTONIC` in nanoseconds: one clock for every process on the machine, so intervals
/// recorded by different processes can be compared.
#[cfg(target_os = "linux")]
pub(crate) fn monotonic_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Off Linux the multi-process workloads do not run.
#[cfg(not(target_os = "linux"))]
pub(crate) fn monotonic_ns() -> u64 {
    unimplemented!("the multi-process workloads need CLOCK_MONOTONIC (Linux)")
}

/// The value at quantile `q` (0.0 to 1.0) of sorted `values`; zero when empty.
pub(crate) fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Milliseconds of `d`.
pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Microseconds of `d`.
pub(crate) fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// One figure over the repetitions: median, min and max. `NaN` values (not measured) are left
/// out; with none left all three are `NaN`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Spread {
    pub(crate) median: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
}

impl Spread {
    /// The spread of `values`.
    pub(crate) fn of(values: impl IntoIterator<Item = f64>) -> Self {
        let mut values: Vec<f64> = values.into_iter().filter(|v| !v.is_nan()).collect();
        if values.is_empty() {
            return Self { median: f64::NAN, min: f64::NAN, max: f64::NAN };
        }
        values.sort_by(f64::total_cmp);
        let n = values.len();
        let median =
            if n % 2 == 1 { values[n / 2] } else { (values[n / 2 - 1] + values[n / 2]) / 2.0 };
        Self { median, min: values[0], max: values[n - 1] }
    }

    /// `median (min–max)` with `decimals` decimals; `-` when not measured.
    pub(crate) fn show(&self, decimals: usize) -> String {
        if self.median.is_nan() {
            return "-".to_owned();
        }
        format!("{:.decimals$} ({:.decimals$}–{:.decimals$})", self.median, self.min, self.max)
    }
}

/// Errors counted by kind, with the first message of each kind.
#[derive(Clone, Debug, Default)]
pub(crate) struct Errors {
    kinds: BTreeMap<String, (u64, String)>,
}

impl Errors {
    /// Counts one error of `kind`.
    pub(crate) fn add(&mut self, kind: impl Into<String>, message: impl FnOnce() -> String) {
        let entry = self.kinds.entry(kind.into()).or_insert((0, String::new()));
        if entry.0 == 0 {
            entry.1 = message();
        }
        entry.0 += 1;
    }

    /// Counts `n` errors of `kind` at once.
    pub(crate) fn add_n(&mut self, kind: &str, n: u64, first: &str) {
        let entry = self.kinds.entry(kind.to_owned()).or_insert((0, first.to_owned()));
        entry.0 += n;
    }

    /// Adds every count of `other`.
    pub(crate) fn merge(&mut self, other: &Self) {
        for (kind, (n, first)) in &other.kinds {
            self.add_n(kind, *n, first);
        }
    }

    /// All errors counted.
    pub(crate) fn total(&self) -> u64 {
        self.kinds.values().map(|(n, _)| n).sum()
    }

    /// `kind ×count (first: message)` per kind, one string; empty when there were none.
    pub(crate) fn describe(&self) -> String {
        let mut out = String::new();
        for (kind, (n, first)) in &self.kinds {
            if !out.is_empty() {
                out.push_str("; ");
            }
            let _ = write!(out, "{kind} x{n} (first: {first})");
        }
        out
    }

    /// The kinds and counts, for passing between processes.
    pub(crate) fn entries(&self) -> impl Iterator<Item = (&str, u64, &str)> {
        self.kinds.iter().map(|(kind, (n, first))| (kind.as_str(), *n, first.as_str()))
    }
}

/// The variant name of an error from its `Debug` form (`Backend(..)` gives `Backend`).
pub(crate) fn error_kind(error: &impl std::fmt::Debug) -> String {
    let debug = format!("{error:?}");
    debug.split(|c: char| !(c.is_alphanumeric() || c == '_')).next().unwrap_or("?").to_owned()
}

/// A reading of a Redis server's counters.
#[derive(Clone, Debug, Default)]
pub(crate) struct RedisCounters {
    /// `calls` and `usec` per command (`INFO commandstats`), without `INFO` itself.
    commands: BTreeMap<String, (u64, u64)>,
    /// `used_cpu_user + used_cpu_sys` (`INFO cpu`): the whole server process.
    cpu: f64,
}

/// What a Redis server did between two readings.
#[derive(Clone, Debug, Default)]
pub(crate) struct RedisDelta {
    /// Command calls, including the commands Lua scripts run (Redis counts those too).
    pub(crate) calls: u64,
    /// Calls of `EVAL`/`EVALSHA`/`FCALL` (top-level script runs).
    pub(crate) scripts: u64,
    /// `usec` of those script runs (which includes the commands they run).
    pub(crate) script_usec: u64,
    /// Sum of `usec` over the commands: a script's time includes the commands it runs, which
    /// are also counted on their own lines.
    pub(crate) usec: u64,
    /// CPU time of the server process, network I/O included.
    pub(crate) cpu: Duration,
    /// Calls per command, most first.
    pub(crate) per_command: Vec<(String, u64)>,
}

impl RedisDelta {
    /// `cmd n, cmd n…` per `per` unit (e.g. per pair), the largest first.
    pub(crate) fn breakdown(&self, per: f64) -> String {
        let mut out = String::new();
        for (cmd, n) in &self.per_command {
            if !out.is_empty() {
                out.push_str(", ");
            }
            let _ = write!(out, "{cmd} {:.2}", *n as f64 / per);
        }
        out
    }
}

/// Reads `server`'s counters; `None` (and the figure is not reported) when it does not answer.
pub(crate) fn redis_counters(server: &RedisServer) -> Option<RedisCounters> {
    let stats = server.info("commandstats").ok()?;
    let cpu = server.info("cpu").ok()?;
    let mut commands = BTreeMap::new();
    for line in stats.lines() {
        let Some((name, rest)) =
            line.trim().strip_prefix("cmdstat_").and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        if name == "info" {
            continue;
        }
        let field = |f: &str| -> u64 {
            rest.split(',')
                .find_map(|part| part.strip_prefix(f)?.strip_prefix('='))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        commands.insert(name.to_owned(), (field("calls"), field("usec")));
    }
    let cpu_field = |f: &str| -> f64 {
        cpu.lines()
            .find_map(|l| l.trim().strip_prefix(f)?.strip_prefix(':'))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    Some(RedisCounters { commands, cpu: cpu_field("used_cpu_user") + cpu_field("used_cpu_sys") })
}

impl RedisCounters {
    /// What happened from `self` to `later`.
    pub(crate) fn delta(&self, later: &Self) -> RedisDelta {
        let mut delta = RedisDelta {
            cpu: Duration::from_secs_f64((later.cpu - self.cpu).max(0.0)),
            ..RedisDelta::default()
        };
        for (cmd, (calls, usec)) in &later.commands {
            let (calls0, usec0) = self.commands.get(cmd).copied().unwrap_or((0, 0));
            let calls = calls.saturating_sub(calls0);
            let usec = usec.saturating_sub(usec0);
            if calls == 0 {
                continue;
            }
            delta.calls += calls;
            delta.usec += usec;
            if matches!(
                cmd.as_str(),
                "eval" | "evalsha" | "eval_ro" | "evalsha_ro" | "fcall" | "fcall_ro"
            ) {
                delta.scripts += calls;
                delta.script_usec += usec;
            }
            delta.per_command.push((cmd.clone(), calls));
        }
        delta.per_command.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
        delta
    }
}

/// A table cell: few significant digits; `small` decimals below 10.
pub(crate) fn cell(v: f64, small: usize) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.small$}")
    }
}
