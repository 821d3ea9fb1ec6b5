//! W3b and W3f: one key contended by tasks in several real OS processes. The bench re-executes
//! itself as the workers; each worker records when each of its tasks asked, entered and left the
//! critical section on `CLOCK_MONOTONIC` (one clock for all processes), and the parent merges
//! the records, checks that no two critical sections overlap, and counts owner and process
//! changes.

use std::{
    fmt::Write as _,
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use crate::{
    lockers::{Impl, Locker},
    measure::{Errors, monotonic_ns, quantile},
};

/// The environment variable that makes the bench binary a W3b worker; the other parameters
/// follow in `BENCH_W_*` variables.
pub(crate) const WORKER_ENV: &str = "TOWER_LOCK_BENCH_WORKER";

/// One critical section: which process and task, when it asked, entered and left (ns).
#[derive(Clone, Copy, Debug)]
struct Section {
    process: usize,
    task: usize,
    asked: u64,
    entered: u64,
    left: u64,
}

/// What one multi-process run showed.
#[derive(Debug, Default)]
pub(crate) struct ProcRun {
    pub(crate) owner_changes_per_sec: f64,
    pub(crate) process_changes_per_sec: f64,
    pub(crate) acquisitions_per_sec: f64,
    pub(crate) wait_p50: Duration,
    pub(crate) wait_p99: Duration,
    pub(crate) wait_max: Duration,
    /// Acquisitions in the window per task, process by process.
    pub(crate) per_task: Vec<u64>,
    /// Pairs of critical sections that overlapped in time (must be 0).
    pub(crate) overlaps: u64,
    /// Entries seen by a task's in-process check while another task of it was inside.
    pub(crate) violations: u64,
    pub(crate) errors: Errors,
    /// The latest a worker started after the common start, if any was late.
    pub(crate) late: Duration,
}

/// Runs `processes` workers × `tasks` tasks of `which` on `key` for `window`.
pub(crate) async fn run(
    which: Impl,
    url: &str,
    key: &str,
    processes: usize,
    tasks: usize,
    window: Duration,
) -> Result<ProcRun, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    // Time to exec, connect and warm up before the common start.
    let start = monotonic_ns() + 1_500_000_000;
    let end = start + window.as_nanos() as u64;
    let mut children = Vec::new();
    for process in 0..processes {
        let child = tokio::process::Command::new(&exe)
            .env(WORKER_ENV, "w3b")
            .env("BENCH_W_IMPL", which.tag())
            .env("BENCH_W_URL", url)
            .env("BENCH_W_KEY", key)
            .env("BENCH_W_TASKS", tasks.to_string())
            .env("BENCH_W_START", start.to_string())
            .env("BENCH_W_END", end.to_string())
            .env("BENCH_W_PROCESS", process.to_string())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("spawn worker: {e}"))?;
        children.push(child);
    }
    let mut run = ProcRun::default();
    let mut sections = Vec::new();
    for (process, child) in children.into_iter().enumerate() {
        let output =
            child.wait_with_output().await.map_err(|e| format!("worker {process}: {e}"))?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            return Err(format!(
                "worker {process} exited with {}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        parse(process, &stdout, &mut sections, &mut run);
    }
    summarize(&mut sections, &mut run, start, end, processes * tasks, tasks);
    Ok(run)
}

/// Reads one worker's report into `sections` and `run`.
fn parse(process: usize, stdout: &str, sections: &mut Vec<Section>, run: &mut ProcRun) {
    for line in stdout.lines() {
        let mut fields = line.split('\t');
        match fields.next() {
            Some("S") => {
                let mut n = || fields.next().and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
                let (task, asked, entered, left) = (n(), n(), n(), n());
                sections.push(Section { process, task: task as usize, asked, entered, left });
            }
            Some("E") => {
                let kind = fields.next().unwrap_or("?");
                let n = fields.next().and_then(|f| f.parse().ok()).unwrap_or(1);
                run.errors.add_n(kind, n, fields.next().unwrap_or(""));
            }
            Some("V") => run.violations += fields.next().and_then(|f| f.parse().ok()).unwrap_or(0),
            Some("L") => {
                let late =
                    Duration::from_nanos(fields.next().and_then(|f| f.parse().ok()).unwrap_or(0));
                run.late = run.late.max(late);
            }
            _ => {}
        }
    }
}

/// Owner and process changes, overlaps, waits and per-task counts of the sections entered in
/// the window `[start, end)`.
fn summarize(
    sections: &mut [Section],
    run: &mut ProcRun,
    start: u64,
    end: u64,
    all_tasks: usize,
    tasks: usize,
) {
    sections.sort_by_key(|s| s.entered);
    let mut waits = Vec::with_capacity(sections.len());
    run.per_task = vec![0; all_tasks];
    let mut latest_left = 0;
    let mut previous: Option<(usize, usize)> = None;
    let (mut owners, mut processes, mut acquisitions) = (0u64, 0u64, 0u64);
    for s in sections.iter() {
        if s.entered < latest_left {
            run.overlaps += 1;
        }
        latest_left = latest_left.max(s.left);
        waits.push(Duration::from_nanos(s.entered.saturating_sub(s.asked)));
        let owner = (s.process, s.task);
        if (start..end).contains(&s.entered) {
            acquisitions += 1;
            if let Some(slot) = run.per_task.get_mut(s.process * tasks + s.task) {
                *slot += 1;
            }
            if let Some(prev) = previous {
                owners += u64::from(prev != owner);
                processes += u64::from(prev.0 != owner.0);
            }
        }
        previous = Some(owner);
    }
    waits.sort_unstable();
    let secs = (end - start) as f64 / 1e9;
    run.owner_changes_per_sec = owners as f64 / secs;
    run.process_changes_per_sec = processes as f64 / secs;
    run.acquisitions_per_sec = acquisitions as f64 / secs;
    run.wait_p50 = quantile(&waits, 0.5);
    run.wait_p99 = quantile(&waits, 0.99);
    run.wait_max = waits.last().copied().unwrap_or_default();
}

/// A worker's life: read the parameters, connect, wait for the common start, contend until the
/// end, print the records. Runs instead of the bench when [`WORKER_ENV`] is set.
pub(crate) fn worker() {
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let num = |name: &str| var(name).parse::<u64>().unwrap_or(0);
    let Some(which) = Impl::from_tag(&var("BENCH_W_IMPL")) else {
        eprintln!("unknown BENCH_W_IMPL");
        std::process::exit(2);
    };
    let (url, key) = (var("BENCH_W_URL"), var("BENCH_W_KEY"));
    let (tasks, start, end) =
        (num("BENCH_W_TASKS") as usize, num("BENCH_W_START"), num("BENCH_W_END"));
    let process = num("BENCH_W_PROCESS");
    let runtime = crate::common::runtime();
    let report = runtime.block_on(async move {
        let locker = match Locker::connect(which, &url).await {
            Ok(locker) => locker,
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(1);
            }
        };
        // Connections and scripts warmed up on a key of its own.
        if let Ok(held) = locker.acquire(&format!("{key}:warm:{process}")).await {
            let _ = locker.release(held).await;
        }
        let now = monotonic_ns();
        let mut report = String::new();
        if now < start {
            tokio::time::sleep(Duration::from_nanos(start - now)).await;
        } else {
            let _ = writeln!(report, "L\t{}", now - start);
        }
        let inside = Arc::new(AtomicUsize::new(0));
        let violations = Arc::new(AtomicU64::new(0));
        let mut set = tokio::task::JoinSet::new();
        for task in 0..tasks {
            let (locker, key, inside, violations) =
                (locker.clone(), key.clone(), inside.clone(), violations.clone());
            set.spawn(async move {
                let me = task + 1;
                let mut sections = Vec::new();
                let mut errors = Errors::default();
                while monotonic_ns() < end {
                    let asked = monotonic_ns();
                    let held = match locker.acquire(&key).await {
                        Ok(held) => held,
                        Err(f) => {
                            errors.add(f.kind, || f.message);
                            continue;
                        }
                    };
                    let entered = monotonic_ns();
                    if inside.compare_exchange(0, me, Ordering::SeqCst, Ordering::SeqCst).is_err() {
                        violations.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::task::yield_now().await;
                    if inside.load(Ordering::SeqCst) != me {
                        violations.fetch_add(1, Ordering::Relaxed);
                    }
                    let _ = inside.compare_exchange(me, 0, Ordering::SeqCst, Ordering::SeqCst);
                    let left = monotonic_ns();
                    sections.push((task, asked, entered, left));
                    if let Err(f) = locker.release(held).await {
                        errors.add(f.kind, || f.message);
                    }
                }
                (sections, errors)
            });
        }
        let mut errors = Errors::default();
        while let Some(result) = set.join_next().await {
            match result {
                Ok((sections, task_errors)) => {
                    for (task, asked, entered, left) in sections {
                        let _ = writeln!(report, "S\t{task}\t{asked}\t{entered}\t{left}");
                    }
                    errors.merge(&task_errors);
                }
                Err(e) => errors.add("task panicked", || e.to_string()),
            }
        }
        for (kind, n, first) in errors.entries() {
            let first = first.replace(['\t', '\n'], " ");
            let _ = writeln!(report, "E\t{kind}\t{n}\t{first}");
        }
        let _ = writeln!(report, "V\t{}", violations.load(Ordering::Relaxed));
        locker.shutdown().await;
        report
    });
    print!("{report}");
}
