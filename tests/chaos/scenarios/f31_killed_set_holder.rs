//! F31: a holder process that takes a set of three locks with `lock_all` is `kill -9`'d while it
//! holds two of them and waits for the third (another client holds the last one in the
//! canonical order), or while it holds the whole set; or it is `SIGSTOP`ped past its lease
//! while holding the set. Waiters in another process for single keys, and a second set over all
//! three keys, get them within one lease of the fault; no two holders are believed inside one
//! key at once; the dead holder's partial set strands nothing (a fresh client takes all three
//! at once); the paused holder hears the loss once it runs again, and its release fails
//! without touching its successor's locks.

use std::time::Duration;

use tower_lock::{Lease, LockClient, LockError, LockGuard, MultiGuard, RedisBackend};

use super::{Bed, Topology};
use crate::{
    checker, clock,
    history::{History, Outcome, Section},
    holder::{Command, HolderProc, Reply},
    run::{self, Scenario},
    support::RespValue,
};

const LEASE: Duration = Duration::from_millis(500);
/// Scheduling slack on this shared 2-core machine (as F8).
const TOLERANCE: Duration = Duration::from_millis(200);
/// Every acquire in the runner waits this long at most: far past any bound checked.
const WAIT: Duration = Duration::from_secs(5);
/// The keys of each run's set, before their canonical order is worked out.
const NAMES: [&str; 3] = ["a", "b", "c"];

/// What the victim holds when the fault hits it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Holds {
    /// The first two keys of the set, waiting for the third.
    TwoOfThree,
    /// The whole set.
    Whole,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f31_killed_holding_two_of_three() {
    killed("F31", Holds::TwoOfThree, run::count(3, 100)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f31_killed_holding_the_whole_set() {
    killed("F31-whole", Holds::Whole, run::count(2, 50)).await;
}

/// A run's keys in canonical order (the byte order of their lock names, as `lock_all` takes
/// them): the blocker holds the last.
fn keys(bed: &Bed, run: usize) -> Vec<String> {
    let mut keys: Vec<String> = NAMES.iter().map(|name| format!("r{run}-{name}")).collect();
    keys.sort_by_key(|key| bed.lock_key(key));
    keys
}

/// One lock or a set, held by a client of the runner.
enum Guard {
    One(LockGuard<RedisBackend>),
    Set(MultiGuard<RedisBackend>),
}

impl Guard {
    fn locks(&self) -> Vec<&LockGuard<RedisBackend>> {
        match self {
            Self::One(guard) => vec![guard],
            Self::Set(set) => set.guards().collect(),
        }
    }

    fn is_lost(&self) -> bool {
        self.locks().iter().any(|lock| lock.is_lost())
    }

    async fn release(self) -> Result<(), LockError> {
        match self {
            Self::One(guard) => guard.release().await,
            Self::Set(set) => set.release().await,
        }
    }
}

/// A hold of the runner with its sections, one per key (one holder id for a set).
struct Taken {
    guard: Guard,
    sections: Vec<Section>,
}

impl Taken {
    /// When the acquire returned.
    fn t_ok(&self) -> u64 {
        self.sections[0].t_ok.expect("held")
    }

    /// Releases and records each key's section.
    async fn release(self, history: &History) -> Result<(), LockError> {
        let Self { guard, mut sections } = self;
        let (t_rel_inv, lost) = (clock::now_ns(), guard.is_lost());
        let result = guard.release().await;
        let t_rel_ok = clock::now_ns();
        for section in &mut sections {
            section.t_rel_inv = Some(t_rel_inv);
            section.t_rel_ok = Some(t_rel_ok);
            section.t_lost = lost.then_some(t_rel_inv);
            section.result = if result.is_ok() && !lost { Outcome::Ok } else { Outcome::Fail };
            history.record(section);
        }
        result
    }
}

/// Takes `keys` with a watchdog lease and fencing: one lock, or the set with `lock_all`.
async fn take(
    client: &LockClient<RedisBackend>,
    history: &History,
    keys: &[String],
    wait: Duration,
) -> Result<Taken, String> {
    let lease = Lease::watchdog(LEASE);
    let t_inv = clock::now_ns();
    let guard = if let [key] = keys {
        let request = client.lock(key).lease(lease).fencing().wait(wait);
        Guard::One(request.acquire().await.map_err(|e| format!("{e:?}"))?)
    } else {
        let request = client.lock_all(keys).lease(lease).fencing().wait(wait);
        Guard::Set(request.acquire().await.map_err(|e| e.to_string())?)
    };
    let t_ok = clock::now_ns();
    let sections = guard
        .locks()
        .into_iter()
        .map(|lock| {
            let key = String::from_utf8_lossy(&lock.key().user_key()).into_owned();
            let mut section = history.begin(&key, lock.holder().id());
            (section.t_inv, section.t_ok) = (t_inv, Some(t_ok));
            section.token = lock.fencing_token();
            section
        })
        .collect();
    Ok(Taken { guard, sections })
}

/// A waiter of the runner: takes `keys` as soon as it can, holds them `hold` (the work), and
/// releases; when it got them.
fn waiter(
    client: &LockClient<RedisBackend>,
    history: &History,
    keys: Vec<String>,
    hold: Duration,
) -> tokio::task::JoinHandle<Result<u64, String>> {
    let (client, history) = (client.clone(), history.clone());
    tokio::spawn(async move {
        let taken = take(&client, &history, &keys, WAIT).await?;
        let t_ok = taken.t_ok();
        tokio::time::sleep(hold).await;
        taken.release(&history).await.map_err(|e| format!("{keys:?}: release: {e:?}"))?;
        Ok(t_ok)
    })
}

/// The holders of `key` in Redis now.
async fn holders(client: &LockClient<RedisBackend>, key: &str) -> Vec<String> {
    let info = client.inspect(key).await.expect("inspect");
    info.holders.into_iter().map(|holder| holder.id).collect()
}

/// Waits until Redis shows `victim` holding exactly `held` of `keys` (one holder id for them
/// all), and nothing of the rest; that holder id.
async fn victim_holds(
    client: &LockClient<RedisBackend>,
    victim: &HolderProc,
    keys: &[String],
    held: usize,
) -> Option<String> {
    let deadline = tokio::time::Instant::now() + WAIT;
    while tokio::time::Instant::now() < deadline {
        let mut ids = Vec::new();
        let mut others = 0;
        for key in keys {
            let of_victim: Vec<String> =
                holders(client, key).await.into_iter().filter(|id| victim.made(id)).collect();
            match of_victim.as_slice() {
                [] => ids.push(None),
                [id] => ids.push(Some(id.clone())),
                _ => others += 1,
            }
        }
        let expected = ids[..held].iter().all(Option::is_some)
            && ids[held..].iter().all(Option::is_none)
            && others == 0;
        if expected {
            let id = ids[0].clone().expect("held");
            if ids[..held].iter().all(|other| other.as_deref() == Some(&*id)) {
                return Some(id);
            }
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    None
}

/// The fencing token of the grant at `key`'s lock now (read before anyone else can take it):
/// its owner record is `<attempt>~<token>`.
fn token_in_redis(bed: &Bed, key: &str) -> Option<u64> {
    let reply = bed.redis.cmd(&["GET", &bed.lock_key(key)]);
    assert!(!matches!(reply, RespValue::Error(_)), "GET {key}: {reply:?}");
    let record = reply.as_str()?;
    record.split_once('~')?.1.parse().ok()
}

/// A fresh client takes the whole set at once, without waiting: nothing of the runs is left
/// stranded. Its sections are recorded.
async fn fresh_client_takes_all(bed: &Bed, history: &History, keys: &[String]) -> bool {
    let fresh = bed.client().await;
    match take(&fresh, history, keys, Duration::ZERO).await {
        Ok(taken) => taken.release(history).await.is_ok(),
        Err(_) => false,
    }
}

async fn killed(name: &'static str, holds: Holds, runs: usize) {
    let mut bed = Bed::new(name, Topology::Single).await;
    let mut rng = bed.scenario.rng();
    let history = bed.scenario.history();
    // Each its own connections, as separate processes would have.
    let (blocker, waiters, setter) = (bed.client().await, bed.client().await, bed.client().await);
    let mut takeovers = Vec::new();
    let mut set_takeovers = Vec::new();
    let (mut confirmed, mut dead_holds_seen, mut stranded) = (0, 0, 0);
    for run in 0..runs {
        let keys = keys(&bed, run);
        let held = match holds {
            Holds::TwoOfThree => keys.len() - 1,
            Holds::Whole => keys.len(),
        };
        let blocked = match holds {
            Holds::TwoOfThree => Some(
                take(&blocker, &history, &keys[held..], WAIT)
                    .await
                    .expect("the blocker takes the last key"),
            ),
            Holds::Whole => None,
        };
        let mut victim = bed.holder_process().await;
        victim.send(&Command::HoldAll { keys: keys.clone(), lease_ms: LEASE.as_millis() as u64 });
        if holds == Holds::Whole {
            let reply = victim.reply(WAIT).await;
            assert!(
                matches!(reply, Reply::HeldAll { .. }),
                "run {run}: the victim did not take the set: {reply:?}"
            );
        }
        let id = victim_holds(&blocker, &victim, &keys, held)
            .await
            .unwrap_or_else(|| panic!("run {run}: the victim was never seen holding {held}"));
        confirmed += 1;
        let t_confirmed = clock::now_ns();
        // Only the victim can have been granted them yet: these are its tokens.
        let tokens: Vec<Option<u64>> =
            keys[..held].iter().map(|key| token_in_redis(&bed, key)).collect();
        assert!(
            tokens.iter().all(Option::is_some),
            "run {run}: no token in the victim's holds: {tokens:?}"
        );

        // Already waiting when the victim dies: each key on its own, and the set again.
        let singles: Vec<_> = keys[..held]
            .iter()
            .map(|key| {
                let hold = rng.between(Duration::ZERO, Duration::from_millis(5));
                waiter(&waiters, &history, vec![key.clone()], hold)
            })
            .collect();
        let set = waiter(
            &setter,
            &history,
            keys.clone(),
            rng.between(Duration::ZERO, Duration::from_millis(5)),
        );

        // Kill at a random point of the renewal cycle.
        tokio::time::sleep(rng.between(Duration::ZERO, LEASE)).await;
        let t_kill = clock::now_ns();
        victim.kill();
        // Its holds outlive it in Redis until their lease runs out.
        let mut still = true;
        for key in &keys[..held] {
            still &= holders(&blocker, key).await.contains(&id);
        }
        dead_holds_seen += usize::from(still);
        match holds {
            // Its client held them, but its caller never had the set: recorded from what
            // Redis showed, from then to the death.
            Holds::TwoOfThree => {
                for (key, token) in keys[..held].iter().zip(tokens) {
                    let mut section = history.begin(key, &id);
                    section.pid = victim.pid();
                    (section.t_inv, section.t_ok) = (t_confirmed, Some(t_confirmed));
                    (section.token, section.t_lost) = (token, Some(t_kill));
                    history.record(&section);
                }
            }
            Holds::Whole => close_dead(&bed.scenario, victim.pid(), t_kill),
        }

        if let Some(blocked) = blocked {
            // The blocker lets the last key go at a random moment before the dead holds
            // expire: the second set must then complete within one lease of the kill.
            tokio::time::sleep(rng.between(Duration::ZERO, LEASE * 3 / 4)).await;
            blocked.release(&history).await.expect("the blocker releases");
        }
        for single in singles {
            let t_ok = single.await.expect("waiter task");
            let t_ok = t_ok.unwrap_or_else(|e| panic!("run {run}: a waiter failed: {e}"));
            takeovers.push(clock::between(t_kill, t_ok));
        }
        let t_ok = set.await.expect("set task");
        let t_ok = t_ok.unwrap_or_else(|e| panic!("run {run}: the second set failed: {e}"));
        set_takeovers.push(clock::between(t_kill, t_ok));
        stranded += usize::from(!fresh_client_takes_all(&bed, &history, &keys).await);
    }

    let sweep = checker::sweep(&History::read(&bed.scenario.history_path()));
    let leaks = checker::server_drains(&bed.redis, &bed.prefix, Duration::from_secs(3)).await;
    let all: Vec<Duration> = takeovers.iter().chain(&set_takeovers).copied().collect();
    let s = &mut bed.scenario;
    s.figure("runs", runs);
    s.figure("lease_ms", LEASE.as_millis());
    s.figure("victim_held_confirmed", format!("{confirmed}/{runs}"));
    s.figure("dead_holds_seen", format!("{dead_holds_seen}/{runs}"));
    s.figure_ms("takeover_p50_ms", &all, 0.5);
    s.figure_ms("takeover_p99_ms", &all, 0.99);
    s.figure_ms("takeover_max_ms", &all, 1.0);
    s.figure_ms("set_takeover_max_ms", &set_takeovers, 1.0);
    let violations = sweep.violations + sweep.fenced_overlaps + sweep.token_errors;
    s.figure("violations", violations);
    s.figure("stranded", format!("{stranded}/{runs}"));
    s.figure("leaked_keys", leaks.count());
    s.report();

    assert_eq!(violations, 0, "{:?}", sweep.examples);
    assert_eq!(dead_holds_seen, runs, "the victim's holds were gone before its lease ran out");
    let bound = LEASE + TOLERANCE;
    let slowest = all.iter().max().expect("runs");
    assert!(
        *slowest <= bound,
        "a dead set holder's keys were taken over only after {slowest:?} (lease {LEASE:?})"
    );
    assert_eq!(stranded, 0, "a fresh client could not take the whole set");
    assert_eq!(leaks.count(), 0, "left in Redis: {leaks:?}");
}

/// The killed process's sections end at its death: the last record of each key it held (open:
/// granted, never closed) is recorded again with the loss at `t_kill`.
fn close_dead(scenario: &Scenario, pid: u32, t_kill: u64) {
    let history = scenario.history();
    let sections = History::read(&scenario.history_path());
    let mut last: Vec<&Section> = Vec::new();
    for section in sections.iter().filter(|s| s.pid == pid && s.is_open()) {
        match last.iter_mut().find(|s| s.key == section.key) {
            Some(slot) => *slot = section,
            None => last.push(section),
        }
    }
    for open in last {
        history.record(&Section { t_lost: Some(t_kill), ..open.clone() });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f31_paused_set_holder_told_lost() {
    let mut bed = Bed::new("F31-paused", Topology::Single).await;
    let runs = run::count(2, 30);
    let mut rng = bed.scenario.rng();
    let history = bed.scenario.history();
    let (setter, observer) = (bed.client().await, bed.client().await);
    let mut victim = bed.holder_process().await;
    let mut takeovers = Vec::new();
    let mut lost_after_cont = Vec::new();
    let (mut release_failed, mut told_after_cont, mut intact, mut stranded) = (0, 0, 0, 0);
    // Each run's victim, keys, stop and takeover.
    let mut stops = Vec::new();
    for run in 0..runs {
        let keys = keys(&bed, run);
        victim.send(&Command::HoldAll { keys: keys.clone(), lease_ms: LEASE.as_millis() as u64 });
        let reply = victim.reply(WAIT).await;
        assert!(
            matches!(reply, Reply::HeldAll { .. }),
            "run {run}: the victim did not take the set: {reply:?}"
        );
        victim_holds(&observer, &victim, &keys, keys.len())
            .await
            .unwrap_or_else(|| panic!("run {run}: the victim was never seen holding the set"));

        // The second set waits from before the stop, and holds across the resume.
        let second = {
            let (setter, history, keys) = (setter.clone(), history.clone(), keys.clone());
            tokio::spawn(async move { take(&setter, &history, &keys, WAIT * 2).await })
        };
        tokio::time::sleep(rng.between(Duration::ZERO, LEASE)).await;
        let (t_stop, stopped_at) = (clock::now_ns(), tokio::time::Instant::now());
        victim.signal("STOP");
        let second = second
            .await
            .expect("set task")
            .unwrap_or_else(|e| panic!("run {run}: no takeover from the paused victim: {e}"));
        takeovers.push(clock::between(t_stop, second.t_ok()));
        stops.push((victim.pid(), keys.clone(), t_stop, second.t_ok()));

        // Stopped 2 to 2.5 leases in all.
        let pause = rng.between(LEASE * 2, LEASE * 5 / 2);
        tokio::time::sleep_until(stopped_at + pause).await;
        let t_cont = clock::now_ns();
        victim.signal("CONT");
        victim.send(&Command::Release);
        let Reply::Released { result, t_lost } = victim.reply(WAIT).await else {
            panic!("run {run}: no release reply");
        };
        release_failed += usize::from(result != "ok");
        if let Some(t_lost) = t_lost.filter(|&t| t >= t_cont) {
            told_after_cont += 1;
            lost_after_cont.push(clock::between(t_cont, t_lost));
        }

        // The stale release left the second set alone.
        let mut kept = !second.guard.is_lost();
        let of_second = second.sections[0].holder.clone();
        for key in &keys {
            kept &= holders(&observer, key).await == [of_second.clone()];
        }
        intact += usize::from(kept);
        second.release(&history).await.expect("the second set releases");
        stranded += usize::from(!fresh_client_takes_all(&bed, &history, &keys).await);
    }

    let sections = History::read(&bed.scenario.history_path());
    let sweep = checker::sweep(&sections);
    // As if the paused holder believed it held until it saw the loss (its closing records,
    // without their deadline): the pause really let the second set in while the victim could
    // not know, once per key and run (a check of the check).
    let late: Vec<Section> = sections
        .iter()
        .filter(|s| !s.is_open())
        .cloned()
        .map(|s| Section { t_deadline: None, ..s })
        .collect();
    let seen_late = checker::sweep(&late);
    // The latest deadline the victim recorded for each key it held at a stop: after the stop
    // (it held then, renewed as its tracker saw), and before the second set got in.
    let (mut after_stop, mut before_takeover) = (Vec::new(), Vec::new());
    for (pid, keys, t_stop, t_took) in &stops {
        for key in keys {
            let deadline = sections
                .iter()
                .filter(|s| s.pid == *pid && &s.key == key && s.t_ok.is_some_and(|t| t < *t_stop))
                .filter_map(|s| s.t_deadline)
                .max()
                .unwrap_or(0);
            after_stop.push(i128::from(deadline) - i128::from(*t_stop));
            before_takeover.push(i128::from(*t_took) - i128::from(deadline));
        }
    }
    let min_ms = |gaps: &[i128]| gaps.iter().min().map_or(0.0, |&ns| ns as f64 / 1e6);
    let leaks = checker::server_drains(&bed.redis, &bed.prefix, Duration::from_secs(3)).await;
    let s = &mut bed.scenario;
    s.figure("runs", runs);
    s.figure("lease_ms", LEASE.as_millis());
    s.figure("deadline_after_stop_min_ms", format!("{:.1}", min_ms(&after_stop)));
    s.figure("takeover_after_deadline_min_ms", format!("{:.1}", min_ms(&before_takeover)));
    s.figure_ms("takeover_p50_ms", &takeovers, 0.5);
    s.figure_ms("takeover_p99_ms", &takeovers, 0.99);
    s.figure_ms("takeover_max_ms", &takeovers, 1.0);
    s.figure("told_lost_after_cont", format!("{told_after_cont}/{runs}"));
    s.figure_ms("lost_after_cont_p99_ms", &lost_after_cont, 0.99);
    s.figure("release_failed", format!("{release_failed}/{runs}"));
    s.figure("successor_intact", format!("{intact}/{runs}"));
    let violations = sweep.violations + sweep.fenced_overlaps + sweep.token_errors;
    s.figure("violations", violations);
    s.figure("overlaps_if_loss_seen_late", seen_late.violations + seen_late.fenced_overlaps);
    s.figure("stranded", format!("{stranded}/{runs}"));
    s.figure("leaked_keys", leaks.count());
    s.report();

    assert_eq!(violations, 0, "{:?}", sweep.examples);
    assert!(
        after_stop.iter().all(|&gap| gap > 0),
        "the victim's recorded deadline had passed before the stop: {after_stop:?} ns"
    );
    assert_eq!(
        seen_late.violations + seen_late.fenced_overlaps,
        runs * keys(&bed, 0).len(),
        "the second set did not get in while the victim was stopped: {:?}",
        seen_late.examples
    );
    let slowest = takeovers.iter().max().expect("runs");
    assert!(
        *slowest <= LEASE + TOLERANCE,
        "a paused set holder's keys were taken over only after {slowest:?} (lease {LEASE:?})"
    );
    assert_eq!(told_after_cont, runs, "the paused holder's lost() did not fire after SIGCONT");
    assert_eq!(release_failed, runs, "a paused holder's release succeeded");
    assert_eq!(intact, runs, "a stale release touched the second set");
    assert_eq!(stranded, 0, "a fresh client could not take the whole set");
    assert_eq!(leaks.count(), 0, "left in Redis: {leaks:?}");
}
