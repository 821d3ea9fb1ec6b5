//! F9 (K1): a holder is stopped past its lease after checking it still holds the lock, another
//! holder takes over and writes, then the first wakes and sends the write it prepared. Fencing
//! must reject it. Variants: the pause is `SIGSTOP` of the holder process, or a blocking sleep
//! inside a current-thread runtime (which also stalls that client's watchdog). The negative
//! control runs the same with the store's fencing check off: the checker must report the stale
//! write, or it is blind.
//!
//! The layer variant: the holder is an HTTP service whose route runs behind a fenced
//! `LockLayer`. A request's handler holds the lock and starts a write with its token, the
//! service process is stopped past the lease, another holder takes over and writes, and on
//! `SIGCONT` the request must be answered 503 (lock lost) while the write, which outlives the
//! cancelled handler, is rejected by fencing.

use std::time::Duration;

use http::StatusCode;
use tower_lock::Lease;

use super::{Bed, Topology};
use crate::{
    checker, clock,
    history::{History, Outcome},
    holder::{self, Command, HolderProc, Reply},
    run,
    support::http::{http, send},
};

const LEASE: Duration = Duration::from_millis(500);
/// The second holder's lease: long, so that a busy machine's watchdog keeps it while it writes.
const TAKEOVER_LEASE: Duration = Duration::from_secs(10);
/// How long the first holder is stopped: three leases.
const PAUSE: Duration = Duration::from_millis(1500);

/// How the first holder is stalled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stall {
    /// `SIGSTOP` / `SIGCONT` of the holder process.
    Signal,
    /// `std::thread::sleep` on a current-thread runtime.
    Blocking,
}

struct Figures {
    stale_accepted: u64,
    stale_rejected: u64,
    sweep: checker::Sweep,
    lost_after_resume: Vec<Duration>,
}

async fn paused_holder(name: &'static str, stall: Stall, enforce: bool, runs: usize) -> Figures {
    let mut bed = Bed::new(name, Topology::Single).await;
    let history = bed.scenario.history();
    let other = bed.client().await;
    let setup = bed.setup(bed.redis.url(), stall == Stall::Blocking);
    let mut holder = HolderProc::spawn(&setup).await;
    let mut lost_after_resume = Vec::new();
    for run in 0..runs {
        let key = format!("k{run}");
        holder.send(&Command::Hold {
            key: key.clone(),
            lease_ms: LEASE.as_millis() as u64,
            fair: false,
        });
        let Reply::Held { token, .. } = holder.reply(Duration::from_secs(5)).await else {
            panic!("holder did not take {key}");
        };
        let token = token.expect("fencing token");
        holder.send(&Command::WriteAfterCheck {
            delay_ms: match stall {
                Stall::Signal => 200,
                Stall::Blocking => PAUSE.as_millis() as u64,
            },
            enforce,
            blocking: stall == Stall::Blocking,
        });
        assert!(matches!(holder.reply(Duration::from_secs(5)).await, Reply::Checked));
        let stopped_at = tokio::time::Instant::now();
        if stall == Stall::Signal {
            holder.signal("STOP");
        }

        // The second holder gets the lock once the first one's lease ran out, and writes.
        let mut section = history.begin(&key, "");
        let guard = other
            .lock(&key)
            .lease(Lease::watchdog(TAKEOVER_LEASE))
            .fencing()
            .wait(PAUSE * 2)
            .acquire()
            .await
            .unwrap_or_else(|e| {
                panic!("run {run}: no takeover while the holder is stalled: {e:?}")
            });
        section.t_ok = Some(clock::now_ns());
        section.token = guard.fencing_token();
        section.holder = guard.holder().id().to_owned();
        let newer = section.token.expect("fencing token");
        assert!(newer > token, "tokens rise: {newer} after {token}");
        assert!(
            bed.witness.fenced_write(&key, &section.holder, newer, enforce).await,
            "the current holder's write is accepted"
        );

        tokio::time::sleep_until(stopped_at + PAUSE).await;
        let resumed = clock::now_ns();
        if stall == Stall::Signal {
            holder.signal("CONT");
        }
        let Reply::Wrote { accepted, .. } = holder.reply(Duration::from_secs(5)).await else {
            panic!("the stalled holder did not write");
        };
        assert_eq!(accepted, !enforce, "run {run}: stale write accepted={accepted}");
        holder.send(&Command::Release);
        let Reply::Released { result, t_lost } = holder.reply(Duration::from_secs(5)).await else {
            panic!("no release reply");
        };
        assert!(result.contains("Lost"), "run {run}: stale holder's release: {result}");
        let t_lost = t_lost.unwrap_or_else(|| panic!("run {run}: lost() never fired"));
        lost_after_resume.push(clock::between(resumed, t_lost));

        section.t_rel_inv = Some(clock::now_ns());
        guard.release().await.expect("release");
        section.t_rel_ok = Some(clock::now_ns());
        section.result = Outcome::Ok;
        history.record(&section);
    }
    let seen = bed.witness.seen().await;
    let sweep = checker::sweep(&History::read(&bed.scenario.history_path()));
    let violations = sweep.violations as u64 + sweep.token_errors as u64 + seen.stale_accepted;
    let s = &mut bed.scenario;
    s.figure("runs", runs);
    s.figure("violations", violations);
    s.figure("fenced_overlaps", sweep.fenced_overlaps);
    s.figure("stale_accepted", seen.stale_accepted);
    s.figure("stale_rejected", seen.stale_rejected);
    s.figure_ms("lost_after_resume_p99_ms", &lost_after_resume, 0.99);
    s.report();
    Figures {
        stale_accepted: seen.stale_accepted,
        stale_rejected: seen.stale_rejected,
        sweep,
        lost_after_resume,
    }
}

/// Asserts the fenced run: every stale write rejected, overlaps only fenced ones.
fn assert_fenced(figures: &Figures, runs: usize) {
    assert_eq!(figures.stale_accepted, 0);
    assert_eq!(figures.stale_rejected, runs as u64, "one stale write per run, rejected");
    assert_eq!(figures.sweep.violations, 0, "{:?}", figures.sweep.examples);
    assert_eq!(figures.sweep.token_errors, 0, "{:?}", figures.sweep.examples);
    assert_eq!(figures.sweep.fenced_overlaps, runs, "each pause is seen as a fenced overlap");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f09_paused_holder_is_fenced() {
    let runs = run::count(3, 100);
    let figures = paused_holder("F9", Stall::Signal, true, runs).await;
    assert_fenced(&figures, runs);
    assert_lost_on_resume(&figures);
}

/// `lost()` fires from the local deadline as soon as the process runs again.
fn assert_lost_on_resume(figures: &Figures) {
    let slowest = figures.lost_after_resume.iter().max().expect("runs");
    assert!(*slowest < Duration::from_millis(200), "lost() {slowest:?} after SIGCONT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f09_blocked_runtime_is_fenced() {
    let runs = run::count(2, 20);
    let figures = paused_holder("F9-blocking", Stall::Blocking, true, runs).await;
    assert_fenced(&figures, runs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f09_control_without_fencing_is_caught() {
    let figures = paused_holder("F9-control", Stall::Signal, false, 1).await;
    assert!(
        figures.stale_accepted > 0,
        "checker blind: a stale write without fencing went unnoticed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f09_paused_service_answers_503() {
    let mut bed = Bed::new("F9-layer", Topology::Single).await;
    let runs = run::count(3, 100);
    let other = bed.client().await;
    let mut service = bed.holder_process().await;
    service.send(&Command::Serve { lease_ms: LEASE.as_millis() as u64, delay_ms: 200 });
    let Reply::Serving { url } = service.reply(Duration::from_secs(5)).await else {
        panic!("the service did not start");
    };
    let (mut unavailable, mut other_answers, mut answered_after_resume) =
        (0, Vec::new(), Vec::new());
    for run in 0..runs {
        let key = format!("k{run}");
        let request = {
            let url = format!("{url}/write/{key}");
            tokio::spawn(async move { send(&http(), "POST", &url).await.0 })
        };
        assert!(
            matches!(service.reply(Duration::from_secs(5)).await, Reply::Checked),
            "run {run}: the handler did not run"
        );
        let stopped_at = tokio::time::Instant::now();
        service.signal("STOP");

        // The second holder takes the same lock the layer holds once its lease ran out.
        let guard = other
            .lock_in_namespace(holder::SERVICE, &key)
            .lease(Lease::watchdog(TAKEOVER_LEASE))
            .fencing()
            .wait(PAUSE * 2)
            .acquire()
            .await
            .unwrap_or_else(|e| {
                panic!("run {run}: no takeover while the service is stopped: {e:?}")
            });
        let token = guard.fencing_token().expect("fencing token");
        assert!(
            bed.witness.fenced_write(&key, guard.holder().id(), token, true).await,
            "the current holder's write is accepted"
        );

        tokio::time::sleep_until(stopped_at + PAUSE).await;
        let resumed = tokio::time::Instant::now();
        service.signal("CONT");
        let status = request.await.expect("request task");
        answered_after_resume.push(resumed.elapsed());
        if status == StatusCode::SERVICE_UNAVAILABLE {
            unavailable += 1;
        } else {
            other_answers.push(status);
        }
        let Reply::Wrote { .. } = service.reply(Duration::from_secs(5)).await else {
            panic!("run {run}: the stale write was not sent");
        };
        guard.release().await.expect("release");
    }
    let seen = bed.witness.seen().await;
    let leaks = checker::server_settled(&bed.redis, &bed.prefix).await;
    let s = &mut bed.scenario;
    s.figure("runs", runs);
    s.figure("responses_503", format!("{unavailable}/{runs}"));
    s.figure("stale_accepted", seen.stale_accepted);
    s.figure("stale_rejected", seen.stale_rejected);
    s.figure_ms("answered_after_resume_p99_ms", &answered_after_resume, 0.99);
    s.figure("leaked_keys", leaks.count());
    s.report();

    assert_eq!(unavailable, runs, "requests that lost their lock were answered {other_answers:?}");
    assert_eq!(seen.stale_accepted, 0);
    assert_eq!(seen.stale_rejected, runs as u64, "one stale write per run, rejected");
    let slowest = answered_after_resume.iter().max().expect("runs");
    assert!(*slowest < Duration::from_millis(200), "503 {slowest:?} after SIGCONT");
    assert_eq!(leaks.count(), 0, "left in Redis: {leaks:?}");
}
