//! F30: holder processes contend for the permits of one semaphore while Redis drops their
//! connections (`CLIENT KILL TYPE normal`) at random moments, one holder process is `kill -9`'d
//! while it holds permits and another is `SIGSTOP`ped past its lease. No more holders than
//! permits are ever believed inside, and a dead or paused process's permits come back to the
//! others within one lease.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use super::{Bed, Topology};
use crate::{
    checker, clock,
    history::{History, Outcome, Section},
    holder::{Command, HolderProc, Load, Reply},
    run::{self, Node, Rng, Scenario},
    support::RespValue,
};

/// Holder processes.
const PROCESSES: usize = 3;
/// Tasks per holder process.
const TASKS: usize = 4;
const PERMITS: u32 = 3;
const LEASE: Duration = Duration::from_millis(400);
/// How long each round's load runs: past the kill, its takeover, the pause and its takeover.
const LOAD: Duration = Duration::from_millis(3500);
/// Scheduling slack on this shared 2-core machine (as F8).
const TOLERANCE: Duration = Duration::from_millis(200);
/// The semaphore every section takes (the load's hot key).
const KEY: &str = "hot";

/// How many permits of the semaphore's grants `grants` (a sorted set of attempts) each of
/// `holders` holds now.
fn permits_of(node: &Node, grants: &str, holders: &[HolderProc]) -> Vec<usize> {
    let ids: Vec<String> = match node.cmd(&["ZRANGE", grants, "0", "-1"]) {
        RespValue::Array(Some(ids)) => ids.iter().filter_map(RespValue::as_str).collect(),
        other => panic!("unexpected ZRANGE reply {other:?}"),
    };
    holders.iter().map(|holder| ids.iter().filter(|id| holder.made(id)).count()).collect()
}

/// Among the processes not `out`, one that holds the most permits now, if any holds one.
fn holding(node: &Node, grants: &str, holders: &[HolderProc], out: &[usize]) -> Option<usize> {
    let counts = permits_of(node, grants, holders);
    (0..holders.len()).filter(|i| !out.contains(i) && counts[*i] > 0).max_by_key(|&i| counts[i])
}

/// What one round saw.
#[derive(Default)]
struct Round {
    dead_pid: u32,
    /// The process to be killed was stopped (it renews nothing from then on).
    t_dead_stopped: u64,
    t_kill: u64,
    dead_permits: usize,
    /// Sections of the killed process that were open at its death.
    dead_sections: usize,
    paused_pid: u32,
    /// `SIGSTOP` had certainly arrived.
    t_stopped: u64,
    t_cont: u64,
    /// Calls of the live processes that waited out their whole command timeout.
    stuck_calls: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f30_permits_never_exceeded_under_faults() {
    let mut bed = Bed::new("F30", Topology::Single).await;
    let rounds = run::count(1, 30);
    let mut rng = bed.scenario.rng();
    let sem = format!("{}:sem", bed.lock_key(KEY));
    // The semaphore's key is the sorted set of its permit grants.
    let grants = sem.clone();
    // Connections `CLIENT KILL` closed.
    let client_kills = Arc::new(AtomicU64::new(0));
    let (mut completed, mut leaked_client, mut sem_keys_unseen) = (0, 0, 0);
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    let mut unexpected = Vec::new();
    let mut done = Vec::new();
    let started = std::time::Instant::now();
    for _ in 0..rounds {
        let mut holders = Vec::new();
        for _ in 0..PROCESSES {
            holders.push(bed.holder_process().await);
        }
        for holder in &mut holders {
            holder.send(&Command::Contend(Load {
                tasks: TASKS,
                sections: usize::MAX,
                hot_share: 1.0,
                cold_keys: 1,
                max_pause_us: 20_000,
                lease_ms: LEASE.as_millis() as u64,
                seed: rng.next_u64(),
                permits: Some(PERMITS),
                for_ms: Some(LOAD.as_millis() as u64),
            }));
        }
        // Redis drops every client connection at random moments throughout.
        let stop = Arc::new(AtomicBool::new(false));
        let killer = {
            let (node, stop, kills) = (bed.redis.clone(), stop.clone(), client_kills.clone());
            let mut rng = Rng::new(rng.next_u64());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(
                        rng.between(Duration::from_millis(10), Duration::from_millis(50)),
                    );
                    let killed = node.cmd(&["CLIENT", "KILL", "TYPE", "normal"]).as_int();
                    kills.fetch_add(u64::try_from(killed).unwrap_or(0), Ordering::SeqCst);
                }
            })
        };
        let mut round = Round::default();

        // kill -9 a process that holds permits, at a random moment.
        tokio::time::sleep(rng.between(Duration::from_millis(300), Duration::from_millis(700)))
            .await;
        let (dead, stopped) = stop_holding(&bed, &grants, &holders, &[], &mut rng).await;
        round.dead_pid = holders[dead].pid();
        round.t_dead_stopped = stopped;
        round.t_kill = clock::now_ns();
        holders[dead].kill();
        // Still in Redis until their lease runs out; the leak check must see their keys.
        round.dead_permits = permits_of(&bed.redis, &grants, &holders)[dead];
        let keys = checker::server_leaks(&bed.redis, &bed.prefix).keys;
        if !keys.contains(&sem) {
            sem_keys_unseen += 1;
        }

        // SIGSTOP another for 2 to 2.5 leases, once the first takeover had its time.
        tokio::time::sleep(LEASE + TOLERANCE + rng.between(Duration::ZERO, TOLERANCE)).await;
        let (paused, stopped) = stop_holding(&bed, &grants, &holders, &[dead], &mut rng).await;
        round.t_stopped = stopped;
        round.paused_pid = holders[paused].pid();
        tokio::time::sleep(rng.between(LEASE * 2, LEASE * 5 / 2)).await;
        round.t_cont = clock::now_ns();
        holders[paused].signal("CONT");

        for (i, holder) in holders.iter_mut().enumerate() {
            if i == dead {
                continue;
            }
            match holder.reply(LOAD + Duration::from_secs(60)).await {
                Reply::Done { completed: n, errors, leaked } => {
                    completed += n;
                    leaked_client += leaked;
                    for error in errors {
                        let kind = error.split_once(": ").map_or(&*error, |(_, k)| k);
                        let expected = matches!(
                            kind,
                            "Backend(Interrupted)" | "Backend(Unavailable)" | "Backend(Timeout)"
                        ) || (i == paused && matches!(kind, "Lost" | "NotHeld"));
                        let label =
                            if i == paused { format!("{kind}(paused)") } else { kind.to_owned() };
                        if i != paused && kind == "Backend(Timeout)" {
                            round.stuck_calls += 1;
                        }
                        *kinds.entry(label).or_default() += 1;
                        if !expected {
                            unexpected.push(format!("pid {}: {error}", holder.pid()));
                        }
                    }
                }
                other => panic!("unexpected holder reply {other:?}"),
            }
        }
        stop.store(true, Ordering::SeqCst);
        killer.join().expect("the CLIENT KILL thread");
        round.dead_sections = close_dead(&bed.scenario, round.dead_pid, round.t_kill);
        done.push(round);
    }
    let elapsed = started.elapsed();

    let sections = History::read(&bed.scenario.history_path());
    let permits = PERMITS as usize;
    let crowd = checker::max_holders(&sections, permits);
    // As if a paused holder believed it held until it saw the loss: the pause really let
    // the others take its permits (a figure, not a check).
    let late: Vec<Section> =
        sections.iter().cloned().map(|s| Section { t_deadline: None, ..s }).collect();
    let crowd_if_seen_late = checker::max_holders(&late, permits);
    let takeover = |after: u64, excluded: &[u32]| {
        checker::first_full(&sections, KEY, permits, after, excluded)
            .map(|at| clock::between(after, at))
    };
    let mut kill_takeovers = Vec::new();
    let mut pause_takeovers = Vec::new();
    let command_timeout =
        Duration::from_millis(bed.setup(bed.redis.url(), false).command_timeout_ms);
    // A live process's call that `CLIENT KILL` left without an answer holds its task for a
    // command timeout, so its permits can be taken up that much later.
    let mut late_by_stuck_calls = Vec::new();
    let (mut spanning, mut told, mut not_told) = (0, 0, Vec::new());
    for round in &done {
        let kill = takeover(round.t_dead_stopped, &[round.dead_pid]);
        let pause = takeover(round.t_stopped, &[round.dead_pid, round.paused_pid]);
        for (took, takeovers) in [(kill, &mut kill_takeovers), (pause, &mut pause_takeovers)] {
            let took = took.unwrap_or(Duration::MAX);
            if round.stuck_calls > 0 && took > LEASE + TOLERANCE {
                late_by_stuck_calls.push(took);
            } else {
                takeovers.push(took);
            }
        }
        // Sections of the paused process that held across the stop: the guard's clock must
        // tell each, once it runs again, that its permit was lost.
        for section in sections.iter().filter(|s| {
            s.pid == round.paused_pid
                && s.t_rel_ok.is_some()
                && s.t_ok.is_some_and(|t| t < round.t_stopped)
                && s.t_rel_inv.is_none_or(|t| t > round.t_stopped)
        }) {
            spanning += 1;
            if section.t_lost.is_some_and(|t| t >= round.t_cont) && section.result == Outcome::Fail
            {
                told += 1;
            } else {
                not_told.push(format!("{section:?}"));
            }
        }
    }
    let dead_permits: usize = done.iter().map(|r| r.dead_permits).sum();
    let dead_sections: usize = done.iter().map(|r| r.dead_sections).sum();
    let errors: usize = kinds.values().sum();
    let leaks = checker::server_drains(&bed.redis, &bed.prefix, Duration::from_secs(3)).await;

    let s = &mut bed.scenario;
    s.figure("rounds", rounds);
    s.figure("processes", format!("{PROCESSES}x{TASKS}"));
    s.figure("permits", PERMITS);
    s.figure("lease_ms", LEASE.as_millis());
    s.figure("sections", crowd.held);
    s.figure("max_holders", format!("{}/{PERMITS}", crowd.max));
    s.figure("excess", crowd.excess);
    s.figure("max_if_loss_seen_late", crowd_if_seen_late.max);
    s.figure("connections_killed", client_kills.load(Ordering::SeqCst));
    s.figure("errors", format!("{errors}/{}", errors + completed));
    let kinds_figure: Vec<String> = kinds.iter().map(|(k, n)| format!("{k}:{n}")).collect();
    s.figure("error_kinds", kinds_figure.join(","));
    s.figure("unexpected_errors", unexpected.len());
    s.figure("dead_permits", dead_permits);
    s.figure("dead_sections_closed", dead_sections);
    s.figure_ms("kill_takeover_p50_ms", &kill_takeovers, 0.5);
    s.figure_ms("kill_takeover_max_ms", &kill_takeovers, 1.0);
    s.figure("paused_told_lost", format!("{told}/{spanning}"));
    s.figure_ms("pause_takeover_max_ms", &pause_takeovers, 1.0);
    s.figure(
        "rounds_with_stuck_calls",
        format!("{}/{rounds}", done.iter().filter(|r| r.stuck_calls > 0).count()),
    );
    s.figure("takeovers_late_by_stuck_calls", format!("{}/{rounds}", late_by_stuck_calls.len()));
    s.figure("leaked_keys", leaks.count());
    s.figure("leaked_client", leaked_client);
    s.figure("secs", format!("{:.1}", elapsed.as_secs_f64()));
    s.report();

    assert_eq!(crowd.excess, 0, "permits exceeded: {:#?}", crowd.examples);
    assert!(crowd.max <= permits, "{} holders of {PERMITS} permits", crowd.max);
    assert_eq!(crowd.max, permits, "the load never filled the permits");
    assert!(unexpected.is_empty(), "unexpected errors: {unexpected:#?}");
    assert!(dead_sections > 0, "no process was killed while holding a permit");
    let bound = LEASE + TOLERANCE;
    for (what, takeovers) in [("killed", &kill_takeovers), ("paused", &pause_takeovers)] {
        let Some(slowest) = takeovers.iter().max() else {
            continue;
        };
        assert!(
            *slowest <= bound,
            "the others got all {PERMITS} permits back only after {slowest:?} from a {what} \
             process (lease {LEASE:?}; Duration::MAX: never)"
        );
    }
    let stuck_bound = bound + command_timeout;
    assert!(
        late_by_stuck_calls.iter().all(|late| *late <= stuck_bound),
        "a takeover after stuck calls took longer than {stuck_bound:?}: {late_by_stuck_calls:?}"
    );
    assert!(spanning > 0, "the pause hit no held permit");
    assert!(not_told.is_empty(), "paused and not told: {not_told:#?}");
    assert_eq!(sem_keys_unseen, 0, "the leak check does not see the semaphore's keys");
    assert_eq!(leaks.count(), 0, "left in Redis: {leaks:?}");
    assert_eq!(leaked_client, 0, "left in the holders' clients");
}

/// Stops a process among `holders` (none of `out`) that holds a permit: one that has one in
/// Redis, confirmed once it is stopped by a section of its history still open (Redis alone
/// also shows grants being undone). Returns it and when it was surely stopped.
async fn stop_holding(
    bed: &Bed,
    grants: &str,
    holders: &[HolderProc],
    out: &[usize],
    rng: &mut Rng,
) -> (usize, u64) {
    for _ in 0..100 {
        let candidate = pick(&bed.redis, grants, holders, out, rng).await;
        holders[candidate].signal("STOP");
        let stopped = clock::now_ns();
        if open_sections(&bed.scenario, holders[candidate].pid()) > 0 {
            return (candidate, stopped);
        }
        holders[candidate].signal("CONT");
    }
    panic!("no holder process was caught holding a permit");
}

/// Sections of process `pid` granted and not yet given back, as its history says.
fn open_sections(scenario: &Scenario, pid: u32) -> usize {
    let text = std::fs::read_to_string(scenario.history_path()).unwrap_or_default();
    let mine = format!("\"pid\":{pid},");
    let mut open: HashMap<String, bool> = HashMap::new();
    for line in text.lines().filter(|line| line.contains(&mine)) {
        let section: Section = serde_json::from_str(line).expect("a history line parses");
        if section.t_ok.is_some() {
            *open.entry(section.holder).or_insert(true) &= section.is_open();
        }
    }
    open.values().filter(|&&open| open).count()
}

/// A process among `holders` (none of `out`) that holds a permit, found at a random moment
/// soon after now.
async fn pick(
    node: &Node,
    grants: &str,
    holders: &[HolderProc],
    out: &[usize],
    rng: &mut Rng,
) -> usize {
    for _ in 0..1000 {
        if let Some(found) = holding(node, grants, holders, out) {
            return found;
        }
        tokio::time::sleep(rng.between(Duration::from_millis(1), Duration::from_millis(5))).await;
    }
    panic!("no holder process held a permit for a second");
}

/// The killed process's sections end at its death: each open one it left (granted, never
/// closed) is closed with the loss at `t_kill`.
fn close_dead(scenario: &Scenario, pid: u32, t_kill: u64) -> usize {
    let history = scenario.history();
    let sections = History::read(&scenario.history_path());
    let mut closed = 0;
    for open in sections.iter().filter(|s| s.pid == pid && s.is_open()) {
        // The same section's closing record: a holder may hold the same key many times over
        // (and record refused tries), so only its grant time tells its sections apart.
        let ended = sections.iter().any(|s| {
            s.holder == open.holder && s.key == open.key && s.t_ok == open.t_ok && !s.is_open()
        });
        if !ended {
            history.record(&Section { t_lost: Some(t_kill), ..open.clone() });
            closed += 1;
        }
    }
    closed
}

/// A hand-made history with one holder too many: the sweep must count it, and must not count
/// holds that only touch, a section's open record beside its closing one, or a paused holder
/// past its recorded deadline.
#[test]
fn f30_max_holders_sees_one_holder_too_many() {
    let ms = |ms: u64| ms * 1_000_000;
    let hold = |holder: &str, pid: u32, from: u64, to: u64| Section {
        t_inv: ms(from),
        t_ok: Some(ms(from)),
        t_rel_inv: Some(ms(to)),
        t_rel_ok: Some(ms(to)),
        result: Outcome::Ok,
        pid,
        ..Section::begin("F30", "k", holder)
    };
    let open = |section: &Section| Section {
        t_rel_inv: None,
        t_rel_ok: None,
        result: Outcome::Info,
        ..section.clone()
    };
    // Three holders inside 10..20 ms; one more enters at 15 ms.
    let mut sections = vec![
        hold("a", 1, 10, 20),
        hold("b", 1, 11, 20),
        hold("c", 2, 12, 20),
        // Enters as `a` leaves: holds are half-open.
        hold("e", 2, 20, 30),
    ];
    sections.push(open(&sections[0]));
    let within = checker::max_holders(&sections, 3);
    assert_eq!((within.max, within.excess), (3, 0), "{:?}", within.examples);

    sections.push(hold("d", 3, 15, 16));
    let over = checker::max_holders(&sections, 3);
    assert_eq!((over.max, over.excess), (4, 1));
    assert!(over.examples[0].contains("4 holders of 3 permits"), "{over:?}");

    // A paused holder that learned of its loss at 40 ms but was promised only until 18 ms:
    // past 18 ms it no longer counts; the open record of a killed one counts.
    let paused = Section {
        t_lost: Some(ms(40)),
        t_rel_inv: Some(ms(41)),
        t_deadline: Some(ms(18)),
        result: Outcome::Fail,
        ..hold("p", 4, 5, 41)
    };
    let killed = open(&hold("x", 5, 21, 30));
    let late = vec![paused, hold("f", 1, 19, 25), hold("g", 2, 19, 25), killed];
    let crowd = checker::max_holders(&late, 2);
    assert_eq!((crowd.max, crowd.excess), (3, 1), "{:?}", crowd.examples);
    assert!(crowd.examples[0].contains("x@5"), "{crowd:?}");
    assert_eq!(checker::first_full(&late, "k", 2, ms(18), &[4]), Some(ms(19)));
    assert_eq!(checker::first_full(&late, "k", 3, 0, &[4, 5]), None);
}
