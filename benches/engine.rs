//! Lock engine throughput, latency and cost against a Redis server this bench starts, with two
//! baselines measured in the same run: a minimal hand-written Redis lock
//! (`benches/common/handwritten.rs`) and the `rslock` crate. The machines these run on are
//! shared and noisy, so every figure is repeated (`BENCH_REPS`, interleaved: each repetition
//! runs every lock once, in a rotated order) and the ratios within a run are what counts.
//!
//! ```text
//! cargo bench --bench engine --features unstable-backend        # 5 repetitions of 2 s windows
//! BENCH_SECS=1 BENCH_REPS=3 cargo bench --bench engine --features unstable-backend   # quicker
//! BENCH_ONLY=W1,W3 cargo bench --bench engine --features unstable-backend  # some workloads
//! BENCH_LOCKS=tower cargo bench --bench engine --features unstable-backend # some locks only
//! ```
//!
//! - W1: one task, sequential acquire + release of one key: pairs/s; per pair the client's CPU,
//!   Redis's CPU and the commands Redis ran.
//! - W2: 64 tasks (and W2x256: 256), each on its own key: pairs/s and the same costs.
//! - W3: 16 tasks of one process on one key; each checks across an `.await` inside the critical
//!   section that no one else entered: owner changes/s, waits.
//! - W3b: 4 OS processes × 4 tasks on one key (the bench re-executes itself as the workers);
//!   critical sections recorded on `CLOCK_MONOTONIC` must not overlap: owner changes/s, process
//!   changes/s, waits.
//! - W3f: W3b with tower-lock's fair lock: acquisitions per task (FIFO: even). No baseline has a
//!   fair lock.
//! - W4: one watchdog tick for 10 000 held locks: the renewal of all of them, p50/p99, and
//!   Redis's time per tick; beside them, the floor of any renewal that moves each lock's own
//!   expiry: a bare `PEXPIRE` per lock, on the hand-written lock's keys. The renewal is built
//!   through the feature `unstable-backend` (`Renew::Grant` for each guard's grant, read from
//!   Redis), which this bench requires.
//! - W5: one task holds a key and takes it again and gives it back in a loop: tower-lock
//!   re-enters its own grant (counted in the client, no round trip); the baselines have no
//!   re-entry, so their nearest is a pair on a second key while the first is held.
//!
//! See `benches/README.md` for what is counted and the latest results.

mod common;
#[path = "common/handwritten.rs"]
mod handwritten;
#[path = "engine/lockers.rs"]
mod lockers;
#[path = "common/measure.rs"]
mod measure;
#[path = "engine/procs.rs"]
mod procs;
#[path = "../tests/support/mod.rs"]
mod support;

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use lockers::{Held, Impl, Locker};
use measure::{Errors, Spread, ms, quantile, redis_counters, rotated, selected, us};
use support::{RedisServer, RespValue};
use tower_lock::{
    Lease, LockGuard, LockKind, RedisBackend,
    backend::store::{Renew, RenewReply, Store},
};

/// Locks renewed by one W4 tick.
const W4_LOCKS: usize = 10_000;

fn main() {
    if std::env::var_os(procs::WORKER_ENV).is_some() {
        procs::worker();
        return;
    }
    let window = common::window();
    let reps = measure::reps(5);
    let runtime = common::runtime();
    let server = RedisServer::start();
    runtime.block_on(async {
        let url = server.url();
        let rtt = common::ping_rtt(&url).await;
        let version: Vec<String> = support::redis_version().iter().map(u32::to_string).collect();
        println!(
            "redis-server {}, PING round trip {:.1} µs (median of 2000); {reps} repetitions of {:.1} s windows; {} CPUs",
            version.join("."),
            us(rtt),
            window.as_secs_f64(),
            std::thread::available_parallelism().map_or(0, |n| n.get()),
        );
        println!(
            "baselines: hand-written SET NX PX + EVALSHA release + pub/sub; rslock {} retries per lock() with a random delay below {:?}, acquire() looping",
            lockers::RSLOCK_RETRY_COUNT,
            lockers::rslock_retry_delay()
        );
        let bench = Bench {
            url: &url,
            server: &server,
            window,
            reps,
        };
        let mut table = Table::default();
        let all = lockers::chosen(&[Impl::Tower, Impl::Memory, Impl::Hand, Impl::Rslock]);
        let redis = lockers::chosen(&[Impl::Tower, Impl::Hand, Impl::Rslock]);
        if selected("W1") {
            bench.pairs("W1", "1 task, one key", 1, &all, &mut table).await;
        }
        if selected("W2") {
            bench.pairs("W2", "64 tasks, own keys", 64, &all, &mut table).await;
        }
        if selected("W2x256") || selected("W2") {
            bench.pairs("W2x256", "256 tasks, own keys", 256, &all, &mut table).await;
        }
        if selected("W3") {
            bench.w3(&all, &mut table).await;
        }
        if selected("W3b") {
            bench.w3b("W3b", &redis, &mut table).await;
        }
        if selected("W3f") {
            bench
                .w3b("W3f", &lockers::chosen(&[Impl::TowerFair]), &mut table)
                .await;
            println!("    (the hand-written lock and rslock have no fair lock: no baseline for W3f)");
        }
        if selected("W4") {
            let w4 = [Impl::Tower, Impl::Hand, Impl::Rslock];
            bench.w4(&lockers::chosen(&w4), &mut table).await;
        }
        if selected("W5") {
            bench.w5(&all, &mut table).await;
        }
        table.print();
    });
    drop(server);
}

/// What every workload needs.
struct Bench<'a> {
    url: &'a str,
    server: &'a RedisServer,
    window: Duration,
    reps: usize,
}

/// One W1/W2 run.
#[derive(Default)]
struct PairRun {
    rate: f64,
    client_cpu_us: f64,
    redis_cpu_us: f64,
    cmd_us: f64,
    cmds: f64,
    scripts: f64,
    breakdown: String,
    errors: Errors,
}

/// One W3 run.
#[derive(Default)]
struct ContRun {
    owner_changes: f64,
    acquisitions: f64,
    p50: Duration,
    p99: Duration,
    max: Duration,
    violations: u64,
    errors: Errors,
}

/// One W4 run.
#[derive(Default)]
struct TickRun {
    p50: Duration,
    p99: Duration,
    redis_script_ms: f64,
    redis_cpu_ms: f64,
    calls: f64,
    not_renewed: u64,
    errors: Errors,
    /// Hand-written lock only: Redis CPU per tick of a bare `PEXPIRE` per lock, on the same
    /// keys in the same run.
    floor_cpu_ms: Option<f64>,
}

impl Bench<'_> {
    /// Runs `once` for every lock of `impls`, `self.reps` times, the order rotated each
    /// repetition, on a fresh key each time (`{name}:{lock}:{rep}`); a failed run is reported
    /// and left out.
    async fn repeated<R>(
        &self,
        name: &str,
        impls: &[Impl],
        once: impl AsyncFn(Impl, String) -> Result<R, String>,
    ) -> Vec<(Impl, usize, R)> {
        let mut runs = Vec::new();
        for rep in 0..self.reps {
            for which in rotated(impls, rep) {
                let key = format!("{name}:{}:{rep}", which.tag());
                match once(which, key).await {
                    Ok(run) => runs.push((which, rep, run)),
                    Err(e) => println!("  {} rep {rep}: {e}", which.name()),
                }
            }
        }
        runs
    }

    /// W1 and W2: `tasks` tasks, each acquiring and releasing its own key in a loop.
    async fn pairs(&self, name: &str, what: &str, tasks: usize, impls: &[Impl], table: &mut Table) {
        println!();
        println!("{name}: {what}, sequential acquire + release");
        let runs = self
            .repeated(name, impls, async |which, key| self.pairs_once(which, &key, tasks).await)
            .await;
        println!(
            "  {:<18} {:>24} {:>20} {:>20} {:>16} {:>12}",
            "",
            "pairs/s",
            "client CPU µs/pair",
            "Redis CPU µs/pair",
            "Redis cmds/pair",
            "scripts/pair"
        );
        for &which in impls {
            let of = |f: fn(&PairRun) -> f64| by_rep(&runs, self.reps, which, f);
            let rate = of(|r| r.rate);
            let (client, redis) = (of(|r| r.client_cpu_us), of(|r| r.redis_cpu_us));
            let (cmds, scripts) = (of(|r| r.cmds), of(|r| r.scripts));
            println!(
                "  {:<18} {:>24} {:>20} {:>20} {:>16} {:>12}",
                which.name(),
                show(&rate, 0),
                show(&client, 1),
                show(&redis, 1),
                show(&cmds, 2),
                show(&scripts, 2)
            );
            let mine = runs.iter().filter(|r| r.0 == which);
            let mut errors = Errors::default();
            for (_, _, run) in mine.clone() {
                errors.merge(&run.errors);
            }
            if let Some((_, _, last)) = mine.clone().next_back()
                && !last.breakdown.is_empty()
            {
                println!(
                    "  {:<18}   per pair (last rep): {}; command µs {}",
                    "",
                    last.breakdown,
                    show(&of(|r| r.cmd_us), 1)
                );
            }
            if errors.total() > 0 {
                println!("  {:<18}   errors: {}", "", errors.describe());
            }
            table.add(&format!("{name} pairs/s"), true, which, rate);
            table.add(&format!("{name} client CPU µs/pair"), false, which, client);
            if which != Impl::Memory {
                table.add(&format!("{name} Redis CPU µs/pair"), false, which, redis);
                table.add(&format!("{name} Redis cmds/pair"), false, which, cmds);
            }
            table.add_errors(&format!("{name} errors"), which, errors.total());
        }
    }

    async fn pairs_once(&self, which: Impl, key: &str, tasks: usize) -> Result<PairRun, String> {
        let locker = Locker::connect(which, self.url).await?;
        warm_up(&locker, key).await;
        let on_redis = which != Impl::Memory;
        let before = on_redis.then(|| redis_counters(self.server)).flatten();
        let cpu = measure::cpu_time();
        let pairs = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let mut set = tokio::task::JoinSet::new();
        for task in 0..tasks {
            let (locker, pairs, window) = (locker.clone(), pairs.clone(), self.window);
            let key = format!("{key}:{task}");
            set.spawn(async move {
                let mut errors = Errors::default();
                while start.elapsed() < window {
                    match locker.acquire(&key).await {
                        Ok(held) => match locker.release(held).await {
                            Ok(()) => {
                                pairs.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(f) => errors.add(f.kind, || f.message),
                        },
                        Err(f) => errors.add(f.kind, || f.message),
                    }
                }
                errors
            });
        }
        let mut run = PairRun::default();
        while let Some(result) = set.join_next().await {
            match result {
                Ok(errors) => run.errors.merge(&errors),
                Err(e) => run.errors.add("task panicked", || e.to_string()),
            }
        }
        let elapsed = start.elapsed();
        let cpu = measure::cpu_time().saturating_sub(cpu);
        let after = on_redis.then(|| redis_counters(self.server)).flatten();
        locker.shutdown().await;
        let n = pairs.load(Ordering::Relaxed).max(1) as f64;
        run.rate = pairs.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64();
        run.client_cpu_us = us(cpu) / n;
        match (before, after) {
            (Some(before), Some(after)) => {
                let delta = before.delta(&after);
                run.redis_cpu_us = us(delta.cpu) / n;
                run.cmd_us = delta.usec as f64 / n;
                run.cmds = delta.calls as f64 / n;
                run.scripts = delta.scripts as f64 / n;
                run.breakdown = delta.breakdown(n);
            }
            _ => {
                run.redis_cpu_us = f64::NAN;
                run.cmd_us = f64::NAN;
                run.cmds = f64::NAN;
                run.scripts = f64::NAN;
            }
        }
        Ok(run)
    }

    /// W5: re-entries of a held key (the baselines: pairs on a second key while holding one).
    async fn w5(&self, impls: &[Impl], table: &mut Table) {
        println!();
        println!(
            "W5: one task holding a key takes it again and gives it back (baselines, without re-entry: a pair on a second key)"
        );
        let runs =
            self.repeated("W5", impls, async |which, key| self.w5_once(which, &key).await).await;
        println!("  {:<18} {:>24} {:>20} {:>16}", "", "pairs/s", "ns/pair", "Redis cmds/pair");
        for &which in impls {
            let of = |f: fn(&PairRun) -> f64| by_rep(&runs, self.reps, which, f);
            let (rate, ns, cmds) = (of(|r| r.rate), of(|r| 1e9 / r.rate), of(|r| r.cmds));
            println!(
                "  {:<18} {:>24} {:>20} {:>16}",
                which.name(),
                show(&rate, 0),
                show(&ns, 0),
                show(&cmds, 2)
            );
            let mut errors = Errors::default();
            for (_, _, run) in runs.iter().filter(|r| r.0 == which) {
                errors.merge(&run.errors);
            }
            if errors.total() > 0 {
                println!("  {:<18}   errors: {}", "", errors.describe());
            }
            table.add("W5 nested pairs/s", true, which, rate);
            table.add("W5 ns/nested pair", false, which, ns);
            if which != Impl::Memory {
                table.add("W5 Redis cmds/nested pair", false, which, cmds);
            }
            table.add_errors("W5 errors", which, errors.total());
        }
    }

    async fn w5_once(&self, which: Impl, key: &str) -> Result<PairRun, String> {
        let locker = Locker::connect(which, self.url).await?;
        warm_up(&locker, key).await;
        let before = redis_counters(self.server);
        let mut run = PairRun::default();
        let start = Instant::now();
        let pairs = match &locker {
            Locker::Tower(client, _) => {
                reenter_for(client, key, self.window, &mut run.errors).await
            }
            Locker::Memory(client) => reenter_for(client, key, self.window, &mut run.errors).await,
            Locker::Hand(_) | Locker::Rslock(_) => {
                let outer = locker.acquire(key).await.map_err(|f| f.message)?;
                let inner = format!("{key}:inner");
                let mut pairs = 0u64;
                while start.elapsed() < self.window {
                    match locker.acquire(&inner).await {
                        Ok(held) => match locker.release(held).await {
                            Ok(()) => pairs += 1,
                            Err(f) => run.errors.add(f.kind, || f.message),
                        },
                        Err(f) => run.errors.add(f.kind, || f.message),
                    }
                }
                let _ = locker.release(outer).await;
                pairs
            }
        };
        let elapsed = start.elapsed();
        let after = redis_counters(self.server);
        locker.shutdown().await;
        run.rate = pairs as f64 / elapsed.as_secs_f64();
        run.cmds = match (before, after) {
            (Some(before), Some(after)) => before.delta(&after).calls as f64 / pairs.max(1) as f64,
            _ => f64::NAN,
        };
        Ok(run)
    }

    /// W3: 16 tasks of this process on one key, exclusivity checked across an `.await`.
    async fn w3(&self, impls: &[Impl], table: &mut Table) {
        const TASKS: usize = 16;
        println!();
        println!(
            "W3: {TASKS} tasks of one process on one key, an .await inside the critical section"
        );
        let runs = self
            .repeated("W3", impls, async |which, key| self.w3_once(which, &key, TASKS).await)
            .await;
        println!(
            "  {:<18} {:>22} {:>22} {:>18} {:>18} {:>18} {:>10}",
            "",
            "owner changes/s",
            "acquisitions/s",
            "wait p50 ms",
            "wait p99 ms",
            "wait max ms",
            "overlaps"
        );
        for &which in impls {
            let mine: Vec<&ContRun> = runs.iter().filter(|r| r.0 == which).map(|r| &r.2).collect();
            let of = |f: fn(&ContRun) -> f64| by_rep(&runs, self.reps, which, f);
            let changes = of(|r| r.owner_changes);
            let p99 = of(|r| ms(r.p99));
            let violations: u64 = mine.iter().map(|r| r.violations).sum();
            println!(
                "  {:<18} {:>22} {:>22} {:>18} {:>18} {:>18} {:>10}",
                which.name(),
                show(&changes, 0),
                show(&of(|r| r.acquisitions), 0),
                show(&of(|r| ms(r.p50)), 2),
                show(&p99, 2),
                show(&of(|r| ms(r.max)), 1),
                violations
            );
            let mut errors = Errors::default();
            for run in &mine {
                errors.merge(&run.errors);
            }
            if errors.total() > 0 {
                println!("  {:<18}   errors: {}", "", errors.describe());
            }
            table.add("W3 owner changes/s", true, which, changes);
            table.add("W3 wait p99 ms", false, which, p99);
            table.add_errors("W3 overlaps", which, violations);
            table.add_errors("W3 errors", which, errors.total());
        }
    }

    async fn w3_once(&self, which: Impl, key: &str, tasks: usize) -> Result<ContRun, String> {
        let locker = Locker::connect(which, self.url).await?;
        warm_up(&locker, key).await;
        let inside = Arc::new(AtomicUsize::new(0));
        let last = Arc::new(AtomicUsize::new(0));
        let violations = Arc::new(AtomicU64::new(0));
        let changes = Arc::new(AtomicU64::new(0));
        let acquisitions = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let window = self.window;
        let mut set = tokio::task::JoinSet::new();
        for task in 0..tasks {
            let locker = locker.clone();
            let key = key.to_owned();
            let (inside, last, violations, changes, acquisitions) = (
                inside.clone(),
                last.clone(),
                violations.clone(),
                changes.clone(),
                acquisitions.clone(),
            );
            set.spawn(async move {
                let me = task + 1;
                let mut waits = Vec::new();
                let mut errors = Errors::default();
                while start.elapsed() < window {
                    let asked = Instant::now();
                    let held: Held = match locker.acquire(&key).await {
                        Ok(held) => held,
                        Err(f) => {
                            errors.add(f.kind, || f.message);
                            continue;
                        }
                    };
                    waits.push(asked.elapsed());
                    if inside.compare_exchange(0, me, Ordering::SeqCst, Ordering::SeqCst).is_err() {
                        violations.fetch_add(1, Ordering::Relaxed);
                    }
                    let previous = last.swap(me, Ordering::SeqCst);
                    if start.elapsed() < window {
                        acquisitions.fetch_add(1, Ordering::Relaxed);
                        if previous != me {
                            changes.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    tokio::task::yield_now().await;
                    if inside.load(Ordering::SeqCst) != me {
                        violations.fetch_add(1, Ordering::Relaxed);
                    }
                    let _ = inside.compare_exchange(me, 0, Ordering::SeqCst, Ordering::SeqCst);
                    if let Err(f) = locker.release(held).await {
                        errors.add(f.kind, || f.message);
                    }
                }
                (waits, errors)
            });
        }
        let mut run = ContRun::default();
        let mut waits = Vec::new();
        while let Some(result) = set.join_next().await {
            match result {
                Ok((task_waits, errors)) => {
                    waits.extend(task_waits);
                    run.errors.merge(&errors);
                }
                Err(e) => run.errors.add("task panicked", || e.to_string()),
            }
        }
        locker.shutdown().await;
        waits.sort_unstable();
        let secs = window.as_secs_f64();
        run.owner_changes = changes.load(Ordering::Relaxed) as f64 / secs;
        run.acquisitions = acquisitions.load(Ordering::Relaxed) as f64 / secs;
        run.p50 = quantile(&waits, 0.5);
        run.p99 = quantile(&waits, 0.99);
        run.max = waits.last().copied().unwrap_or_default();
        run.violations = violations.load(Ordering::Relaxed);
        Ok(run)
    }

    /// W3b (and W3f with the fair lock): 4 processes × 4 tasks on one key.
    async fn w3b(&self, name: &str, impls: &[Impl], table: &mut Table) {
        const PROCESSES: usize = 4;
        const TASKS: usize = 4;
        println!();
        println!(
            "{name}: {PROCESSES} OS processes x {TASKS} tasks on one key{}",
            if name == "W3f" { ", fair lock" } else { "" }
        );
        let runs = self
            .repeated(name, impls, async |which, key| {
                let run = procs::run(which, self.url, &key, PROCESSES, TASKS, self.window).await?;
                if !run.late.is_zero() {
                    println!("  {}: a worker started {:.0} ms late", which.name(), ms(run.late));
                }
                Ok(run)
            })
            .await;
        println!(
            "  {:<18} {:>20} {:>20} {:>20} {:>16} {:>18} {:>10}",
            "",
            "owner changes/s",
            "process changes/s",
            "acquisitions/s",
            "wait p50 ms",
            "wait p99 ms",
            "overlaps"
        );
        for &which in impls {
            let mine: Vec<&procs::ProcRun> =
                runs.iter().filter(|r| r.0 == which).map(|r| &r.2).collect();
            let of = |f: fn(&procs::ProcRun) -> f64| by_rep(&runs, self.reps, which, f);
            let owners = of(|r| r.owner_changes_per_sec);
            let processes = of(|r| r.process_changes_per_sec);
            let p99 = of(|r| ms(r.wait_p99));
            let overlaps: u64 = mine.iter().map(|r| r.overlaps + r.violations).sum();
            println!(
                "  {:<18} {:>20} {:>20} {:>20} {:>16} {:>18} {:>10}",
                which.name(),
                show(&owners, 0),
                show(&processes, 0),
                show(&of(|r| r.acquisitions_per_sec), 0),
                show(&of(|r| ms(r.wait_p50)), 2),
                show(&p99, 2),
                overlaps
            );
            let mut errors = Errors::default();
            for run in &mine {
                errors.merge(&run.errors);
            }
            if errors.total() > 0 {
                println!("  {:<18}   errors: {}", "", errors.describe());
            }
            let evenness = of(|r| {
                let max = r.per_task.iter().copied().max().unwrap_or(0);
                let min = r.per_task.iter().copied().min().unwrap_or(0);
                if max == 0 { f64::NAN } else { min as f64 / max as f64 }
            });
            println!(
                "  {:<18}   per task min/max: {}; max wait {}",
                "",
                show(&evenness, 2),
                show(&of(|r| ms(r.wait_max)), 1)
            );
            if let Some(last) = mine.last() {
                let counts: Vec<String> = last.per_task.iter().map(u64::to_string).collect();
                println!("  {:<18}   acquisitions per task (last rep): {}", "", counts.join(" "));
            }
            table.add(&format!("{name} owner changes/s"), true, which, owners);
            table.add(&format!("{name} process changes/s"), true, which, processes);
            table.add(&format!("{name} wait p99 ms"), false, which, p99);
            if name == "W3f" {
                table.add("W3f per-task min/max", true, which, evenness);
            }
            table.add_errors(&format!("{name} overlaps"), which, overlaps);
            table.add_errors(&format!("{name} errors"), which, errors.total());
        }
    }

    /// W4: one renewal call for [`W4_LOCKS`] held locks, as a watchdog makes it once per tick.
    async fn w4(&self, impls: &[Impl], table: &mut Table) {
        println!();
        println!("W4: one renewal tick for {W4_LOCKS} held locks");
        let runs =
            self.repeated("W4", impls, async |which, key| self.w4_once(which, &key).await).await;
        println!(
            "  {:<18} {:>18} {:>18} {:>20} {:>20} {:>16}",
            "", "tick p50 ms", "tick p99 ms", "Redis script ms", "Redis CPU ms", "cmds/tick"
        );
        for &which in impls {
            let mine: Vec<&TickRun> = runs.iter().filter(|r| r.0 == which).map(|r| &r.2).collect();
            let of = |f: fn(&TickRun) -> f64| by_rep(&runs, self.reps, which, f);
            let p50 = of(|r| ms(r.p50));
            let cpu = of(|r| r.redis_cpu_ms);
            println!(
                "  {:<18} {:>18} {:>18} {:>20} {:>20} {:>16}",
                which.name(),
                show(&p50, 2),
                show(&of(|r| ms(r.p99)), 2),
                show(&of(|r| r.redis_script_ms), 2),
                show(&cpu, 2),
                show(&of(|r| r.calls), 0)
            );
            let mut errors = Errors::default();
            for run in &mine {
                errors.merge(&run.errors);
            }
            let not_renewed: u64 = mine.iter().map(|r| r.not_renewed).sum();
            if errors.total() > 0 || not_renewed > 0 {
                println!(
                    "  {:<18}   errors: {} ; not renewed: {not_renewed}",
                    "",
                    errors.describe()
                );
            }
            table.add("W4 tick p50 ms", false, which, p50.clone());
            table.add("W4 Redis CPU ms/tick", false, which, cpu.clone());
            table.add_errors("W4 errors", which, errors.total() + not_renewed);
            if which == Impl::Hand {
                let floor = of(|r| r.floor_cpu_ms.unwrap_or(f64::NAN));
                println!(
                    "  {:<18} {:>18} {:>18} {:>20} {:>20}",
                    "bare PEXPIRE/lock",
                    "",
                    "",
                    "",
                    show(&floor, 2)
                );
                table.add("W4 Redis CPU ms/tick, bare PEXPIRE", false, which, floor);
            }
        }
    }

    async fn w4_once(&self, which: Impl, key: &str) -> Result<TickRun, String> {
        let keys: Vec<String> = (0..W4_LOCKS).map(|i| format!("{key}:{i}")).collect();
        let mut run = TickRun::default();
        let mut ticks = Vec::new();
        let lease = Duration::from_secs(60);
        let measured = match Locker::connect(which, self.url).await? {
            Locker::Tower(client, _) => {
                // Watchdog leases, renewed as the watchdog renews them (its own tick, 20 s
                // away, never comes within the window).
                let guards = acquire_all(&keys, &mut run.errors, |k| {
                    client.lock(k).lease(Lease::watchdog(lease)).acquire()
                })
                .await;
                // Each guard's grant, as its record in Redis names it: the renewal names it.
                let grants = self.grants(&guards);
                let renewals: Vec<Renew<'_>> = guards
                    .iter()
                    .zip(&grants)
                    .map(|(guard, grant)| Renew::Grant {
                        key: guard.key(),
                        kind: LockKind::Exclusive,
                        grant,
                        lease: Lease::watchdog(lease),
                    })
                    .collect();
                let counted = self
                    .ticks(&mut ticks, &mut run, async || {
                        let replies = client
                            .backend()
                            .renew(&renewals)
                            .await
                            .map_err(|e| format!("{e:#}"))?;
                        Ok(replies.iter().filter(|r| **r != RenewReply::Renewed).count() as u64)
                    })
                    .await;
                drop(renewals);
                for guard in guards {
                    let _ = guard.release().await;
                }
                client.shutdown().await;
                counted
            }
            Locker::Hand(lock) => {
                let guards =
                    acquire_all(&keys, &mut run.errors, |k| lock.acquire(k, lockers::WAIT)).await;
                let counted = self
                    .ticks(&mut ticks, &mut run, async || {
                        let renewed = lock.renew(&guards).await.map_err(|e| format!("{e:?}"))?;
                        Ok((guards.len() - renewed) as u64)
                    })
                    .await;
                let (mut floor_ticks, mut floor_run) = (Vec::new(), TickRun::default());
                let floor = self
                    .ticks(&mut floor_ticks, &mut floor_run, async || {
                        lock.expire_all(&guards).await.map_err(|e| format!("{e:?}"))?;
                        Ok(0)
                    })
                    .await;
                run.errors.merge(&floor_run.errors);
                run.floor_cpu_ms =
                    floor.map(|delta| ms(delta.cpu) / floor_ticks.len().max(1) as f64);
                for guard in guards {
                    let _ = lock.release(guard).await;
                }
                counted
            }
            Locker::Rslock(manager) => {
                let locks = acquire_all(&keys, &mut run.errors, |k| manager.lock(k, lease)).await;
                let counted = self
                    .ticks(&mut ticks, &mut run, async || {
                        let extends = locks.iter().map(|l| manager.extend(l, lease));
                        let results = futures_util::future::join_all(extends).await;
                        Ok(results.iter().filter(|r| r.is_err()).count() as u64)
                    })
                    .await;
                for lock in &locks {
                    manager.unlock(lock).await;
                }
                counted
            }
            Locker::Memory(_) => return Err("W4 runs on Redis only".to_owned()),
        };
        let Some(delta) = measured else {
            return Err("no tick measured".to_owned());
        };
        let n = ticks.len().max(1) as f64;
        ticks.sort_unstable();
        run.p50 = quantile(&ticks, 0.5);
        run.p99 = quantile(&ticks, 0.99);
        run.redis_script_ms = delta.script_usec as f64 / 1e3 / n;
        run.redis_cpu_ms = ms(delta.cpu) / n;
        run.calls = delta.calls as f64 / n;
        Ok(run)
    }

    /// The grant each of `guards` holds, read from its owner record in Redis (`<attempt>` or
    /// `<attempt>~<token>`), a thousand at a time.
    fn grants(&self, guards: &[LockGuard<RedisBackend>]) -> Vec<String> {
        let mut grants = Vec::with_capacity(guards.len());
        for chunk in guards.chunks(1000) {
            let mut args = vec!["MGET"];
            args.extend(chunk.iter().map(|guard| guard.key().as_str()));
            let RespValue::Array(Some(values)) = self.server.cmd(&args) else {
                panic!("MGET of the held locks");
            };
            grants.extend(values.iter().map(|value| {
                let record = value.as_str().expect("a held lock's record");
                let grant = record.split_once('~').map_or(record.as_str(), |(grant, _)| grant);
                grant.to_owned()
            }));
        }
        grants
    }

    /// Runs `tick` repeatedly for the window, recording each one's time in `ticks`; returns the
    /// Redis counters' change over the ticks.
    async fn ticks(
        &self,
        ticks: &mut Vec<Duration>,
        run: &mut TickRun,
        mut tick: impl AsyncFnMut() -> Result<u64, String>,
    ) -> Option<measure::RedisDelta> {
        let before = redis_counters(self.server)?;
        let start = Instant::now();
        while start.elapsed() < self.window {
            let sent = Instant::now();
            match tick().await {
                Ok(not_renewed) => {
                    ticks.push(sent.elapsed());
                    run.not_renewed += not_renewed;
                }
                Err(e) => run.errors.add("renew", || e),
            }
        }
        let after = redis_counters(self.server)?;
        Some(before.delta(&after))
    }
}

/// One acquire + release on a key of its own, so connections, pools and scripts are ready
/// before the measured window.
/// W5 on tower-lock: holds `key` for one holder and re-enters it for `window`; the re-entries
/// made. The outer acquire and release are outside the count.
async fn reenter_for<B: tower_lock::Backend>(
    client: &tower_lock::LockClient<B>,
    key: &str,
    window: Duration,
    errors: &mut Errors,
) -> u64 {
    let holder = client.holder();
    let outer = match client.lock(key).holder(&holder).acquire().await {
        Ok(guard) => guard,
        Err(e) => {
            errors.add("acquire", || e.to_string());
            return 0;
        }
    };
    let start = Instant::now();
    let mut pairs = 0u64;
    while start.elapsed() < window {
        match client.lock(key).holder(&holder).acquire().await {
            Ok(guard) => match guard.release().await {
                Ok(()) => pairs += 1,
                Err(e) => errors.add("release", || e.to_string()),
            },
            Err(e) => errors.add("acquire", || e.to_string()),
        }
    }
    let _ = outer.release().await;
    pairs
}

async fn warm_up(locker: &Locker, key: &str) {
    for _ in 0..3 {
        if let Ok(held) = locker.acquire(&format!("{key}:warm")).await {
            let _ = locker.release(held).await;
        }
    }
}

/// `f` of `which`'s run in each repetition; `NaN` where that run failed.
fn by_rep<R>(runs: &[(Impl, usize, R)], reps: usize, which: Impl, f: fn(&R) -> f64) -> Vec<f64> {
    (0..reps)
        .map(|rep| runs.iter().find(|r| r.0 == which && r.1 == rep).map_or(f64::NAN, |r| f(&r.2)))
        .collect()
}

/// `median (min–max)` of per-repetition values.
fn show(values: &[f64], decimals: usize) -> String {
    Spread::of(values.iter().copied()).show(decimals)
}

/// The summary: each figure's median per lock, and tower-lock's ratio to the best baseline,
/// of the medians and per repetition.
#[derive(Default)]
struct Table {
    rows: Vec<Row>,
}

struct Row {
    label: String,
    higher_is_better: bool,
    /// Error counts are shown as totals, with no ratio.
    count: bool,
    /// Per lock, the figure in each repetition.
    cells: Vec<(Impl, Vec<f64>)>,
}

impl Table {
    fn row(&mut self, label: &str, higher_is_better: bool, count: bool) -> &mut Row {
        if let Some(i) = self.rows.iter().position(|r| r.label == label) {
            return &mut self.rows[i];
        }
        self.rows.push(Row { label: label.to_owned(), higher_is_better, count, cells: Vec::new() });
        self.rows.last_mut().expect("just pushed")
    }

    fn add(&mut self, label: &str, higher_is_better: bool, which: Impl, values: Vec<f64>) {
        self.row(label, higher_is_better, false).cells.push((which, values));
    }

    fn add_errors(&mut self, label: &str, which: Impl, n: u64) {
        self.row(label, false, true).cells.push((which, vec![n as f64]));
    }

    fn print(&self) {
        println!();
        println!(
            "Summary: medians over the repetitions. ratio = tower-lock / the best of hand-written and rslock,"
        );
        println!(
            "of the medians, then the median (min–max) of the same ratio taken within each repetition;"
        );
        println!("> 1 is better for tower-lock on rates, < 1 is better on times and costs.");
        let columns = [Impl::Tower, Impl::TowerFair, Impl::Memory, Impl::Hand, Impl::Rslock];
        print!("  {:<28}", "figure");
        for which in columns {
            print!(" {:>17}", which.name());
        }
        println!(" {:>7} {:>20}", "ratio", "per-rep ratio");
        let best = |higher: bool, values: &mut dyn Iterator<Item = f64>| {
            let values = values.filter(|v| !v.is_nan());
            if higher { values.fold(f64::NAN, f64::max) } else { values.fold(f64::NAN, f64::min) }
        };
        for row in &self.rows {
            // Error rows that are zero everywhere say nothing.
            if row.count && row.cells.iter().all(|(_, v)| v.iter().all(|x| *x == 0.0)) {
                continue;
            }
            let median = |v: &[f64]| Spread::of(v.iter().copied()).median;
            print!("  {:<28}", row.label);
            for which in columns {
                match row.cells.iter().find(|(w, _)| *w == which).map(|(_, v)| median(v)) {
                    Some(v) if !v.is_nan() => print!(" {:>17}", measure::cell(v, 2)),
                    _ => print!(" {:>17}", "-"),
                }
            }
            let ours = row
                .cells
                .iter()
                .find(|(w, _)| matches!(w, Impl::Tower | Impl::TowerFair))
                .map(|(_, v)| v.as_slice());
            let peers: Vec<&[f64]> =
                row.cells.iter().filter(|(w, _)| w.is_peer()).map(|(_, v)| v.as_slice()).collect();
            let (Some(ours), false, false) = (ours, peers.is_empty(), row.count) else {
                println!(" {:>7} {:>20}", "-", "-");
                continue;
            };
            let of_medians =
                median(ours) / best(row.higher_is_better, &mut peers.iter().map(|v| median(v)));
            let per_rep = (0..ours.len()).map(|rep| {
                let peer = best(
                    row.higher_is_better,
                    &mut peers.iter().map(|v| v.get(rep).copied().unwrap_or(f64::NAN)),
                );
                ours[rep] / peer
            });
            let per_rep = Spread::of(per_rep.filter(|r| r.is_finite()));
            println!(" {:>7.2} {:>20}", of_medians, per_rep.show(2));
        }
        println!("  (errors and overlaps rows appear only when some are non-zero)");
    }
}

/// Takes the lock of every key through `acquire`, 500 at a time, counting each failure in
/// `errors` by kind.
async fn acquire_all<'k, G, E, F>(
    keys: &'k [String],
    errors: &mut Errors,
    acquire: impl Fn(&'k str) -> F,
) -> Vec<G>
where
    F: Future<Output = Result<G, E>>,
    E: std::fmt::Debug,
{
    let mut taken = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(500) {
        let acquires = chunk.iter().map(|k| acquire(k.as_str()));
        for result in futures_util::future::join_all(acquires).await {
            match result {
                Ok(guard) => taken.push(guard),
                Err(e) => {
                    errors.add(format!("acquire {}", measure::error_kind(&e)), || format!("{e:?}"))
                }
            }
        }
    }
    taken
}
