//! F1: contention soak across two holder processes, one hot key and 64 cold ones; F12: the same
//! load while `SCRIPT FLUSH` runs every 100 ms.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use super::{Bed, Topology};
use crate::{
    checker,
    history::History,
    holder::{Command, Load, Reply},
    run,
};

/// Holder processes.
const PROCESSES: usize = 2;
/// Tasks per holder process.
const TASKS: usize = 16;

/// Runs the contention load; with `flush_every`, a thread flushes the script cache meanwhile.
async fn contention(name: &'static str, flush_every: Option<Duration>) {
    let mut bed = Bed::new(name, Topology::Single).await;
    let per_task = run::count(10_000, 100_000).div_ceil(PROCESSES * TASKS);
    let total = per_task * PROCESSES * TASKS;
    let mut rng = bed.scenario.rng();
    let mut holders = Vec::new();
    for _ in 0..PROCESSES {
        holders.push(bed.holder_process().await);
    }

    let stop = Arc::new(AtomicBool::new(false));
    let flushes = Arc::new(AtomicU64::new(0));
    let flusher = flush_every.map(|every| {
        let (node, stop, flushes) = (bed.redis.clone(), stop.clone(), flushes.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let reply = node.cmd(&["SCRIPT", "FLUSH"]);
                assert_eq!(reply.as_str().as_deref(), Some("OK"));
                flushes.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(every);
            }
        })
    });

    let started = std::time::Instant::now();
    for holder in &mut holders {
        holder.send(&Command::Contend(Load {
            tasks: TASKS,
            sections: per_task,
            hot_share: 0.25,
            cold_keys: 64,
            max_pause_us: 2000,
            lease_ms: 2000,
            seed: rng.next_u64(),
            permits: None,
            for_ms: None,
        }));
    }
    let mut completed = 0;
    let mut errors = Vec::new();
    let mut leaked_client = 0;
    for holder in &mut holders {
        match holder.reply(Duration::from_secs(600)).await {
            Reply::Done { completed: done, errors: failed, leaked } => {
                completed += done;
                errors.extend(failed);
                leaked_client += leaked;
            }
            other => panic!("unexpected holder reply {other:?}"),
        }
    }
    let elapsed = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    if let Some(flusher) = flusher {
        flusher.join().expect("flusher thread");
    }

    let sections = History::read(&bed.scenario.history_path());
    let sweep = checker::sweep(&sections);
    let seen = bed.witness.seen().await;
    let ok = checker::completed(&sections);
    let lost_updates = (ok as u64).abs_diff(seen.counted);
    let violations =
        sweep.violations as u64 + seen.overlaps + lost_updates + sweep.token_errors as u64;
    let leaks = checker::server_settled(&bed.redis, &bed.prefix).await;
    let gaps = checker::handoffs(&sections, "hot");

    let s = &mut bed.scenario;
    s.figure("sections", sweep.held);
    s.figure("violations", format!("{violations}/{}", sweep.held));
    s.figure("witness_overlaps", seen.overlaps);
    s.figure("lost_updates", lost_updates);
    s.figure("token_errors", sweep.token_errors);
    s.figure("errors", format!("{}/{total}", errors.len()));
    s.figure("handoff_p50_ms", format!("{:.2}", run::quantile_ms(&gaps, 0.5)));
    s.figure("handoff_p99_ms", format!("{:.2}", run::quantile_ms(&gaps, 0.99)));
    if flush_every.is_some() {
        s.figure("flushes", flushes.load(Ordering::SeqCst));
        // A flushed script is sent again in full with `EVAL`, which caches it.
        s.figure("script_reloads", bed.redis.calls("eval"));
    }
    s.figure("leaked_keys", leaks.count());
    s.figure("leaked_client", leaked_client);
    s.figure("secs", format!("{:.1}", elapsed.as_secs_f64()));
    s.report();

    assert_eq!(violations, 0, "mutual exclusion broken: {:?}", sweep.examples);
    assert!(errors.is_empty(), "caller-visible errors: {:?}", &errors[..errors.len().min(5)]);
    assert_eq!(completed, ok, "holders and history disagree");
    assert_eq!(ok, total, "every section completed");
    assert_eq!(leaks.count(), 0, "left in Redis: {leaks:?}");
    assert_eq!(leaked_client, 0, "left in the holders' clients");
    if flush_every.is_some() {
        assert!(flushes.load(Ordering::SeqCst) > 0, "the flusher never ran");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f01_contention() {
    contention("F1", None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f12_script_flush_under_contention() {
    contention("F12", Some(Duration::from_millis(100))).await;
}
