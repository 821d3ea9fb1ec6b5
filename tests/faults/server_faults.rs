//! Random programs against real `redis-server`s whose *servers* fail: Redlock nodes stalled
//! (`SIGSTOP`) and resumed, killed and restarted empty; a single Redis killed (`SIGKILL`) and
//! restarted empty, or from a snapshot (`SAVE`, RDB) taken at a random earlier moment, so that
//! it comes back with old locks, old void records, an old run marker and old fencing records;
//! a single Redis stalled (`SIGSTOP`) for less than a lease or past the longest, and resumed,
//! so that the acquires, undos and releases sent meanwhile run late, after their callers may
//! have timed out. The protocol page (`src/backend/protocol.md`: "The quarantine and the run
//! marker", "Faults" and "Redlock") says what must hold under those faults; this file checks
//! it.
//!
//! Each seed builds a program: two or three clients (each with a backend of its own: a separate
//! process's connections; on the single Redis one more, through an application's pool), two
//! tasks per client, one or two keys (on the single Redis, one more: `f0`, a fair lock). A task
//! acquires with a random wait and lease (watchdog or fixed), stays inside its critical section
//! a random short time (sometimes past a fixed lease), and releases or drops its guard. On the
//! single Redis a section sometimes re-enters its hold (the same key, its guard's holder, a
//! lease and wait of its own) and releases or drops the re-entry's guard before it leaves. A
//! fault driver, drawn from the same seed, injects server faults at random moments while the
//! program runs, and heals them when it ends. The Redlock nodes and the single Redis's clients
//! have a quarantine of the longest lease (which each client also asks for once before the
//! program), checked by the acquire scripts against the run marker; the pool client's scripts
//! read the server's run themselves. On the single Redis half the acquires ask for a fencing token, the
//! first client's commands time out after 150 ms and the second's after the default (1 s), the
//! others draw one of the two.
//!
//! The checker never looks inside the engine; it sees only what callers see:
//! 1. **Exclusion.** Every section records when it was entered (a timestamp taken after the
//!    grant returned) and the last moment its guard was seen not lost (timestamps taken inside
//!    the section before each `is_lost()` that answered "not lost"; a loss is final, so the
//!    guard believed in its hold over that whole interval). Two sections of one key by
//!    different holders whose intervals overlap both believed they held the lock at one time
//!    (a re-entry is a section of the holder it re-entered). The same is checked live: when a
//!    holder enters, everyone else inside that key must already be lost.
//! 2. **Liveness.** Once the program is over and every fault healed, a fresh client takes every
//!    key within the longest lease + the quarantine + the uptime rounding of the quarantine
//!    (whole seconds) + a Redlock node's skip time + slack, never later; a fair key within one
//!    waiter timeout more (a waiter's place left behind holds its queue up that long). A stall
//!    adds nothing: a late acquire does nothing, so it strands no lock.
//! 3. **Fencing** (single Redis). A section entered before another's acquire was sent by
//!    another holder was granted first: its token must be lower, across restarts and snapshots
//!    too.
//!
//! Errors from acquires under faults (timeouts, quorum or quarantine refusals, refused
//! connections) are allowed; panics and other errors are failures. Time is real: a seed's
//! program is replayed from its seed, its timing is not. A failure prints the seed, the
//! violations and the program's log:
//!
//! ```text
//! SERVER_FAULTS_SEED=7 cargo test --all-features --test faults server_faults -- --nocapture
//! SERVER_FAULTS_SEEDS=40 cargo test --all-features --test faults server_faults -- --nocapture
//! ```
//!
//! `SERVER_FAULTS_NO_QUARANTINE=1` turns the quarantine off in every backend: a negative control
//! that shows the checker catching the double grants a restart then lets through (on a single
//! Redis most seeds fail; on Redlock, the seeds whose driver restarts two nodes one after the
//! other while a holder is inside).

use crate::support;

use std::{
    collections::{BTreeMap, HashMap},
    fmt::Write as _,
    path::PathBuf,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use support::{RedisServer, RespValue, rng::Rng};
use tokio::time::Instant;
use tower_lock::{
    Backend, Lease, LockClient, LockError, LockGuard, LockRequest, RedisBackend, RedlockBackend,
    error::BackendErrorKind,
};

/// The leases a program draws from, watchdog or fixed.
const LEASES_MS: [u64; 3] = [300, 600, 1200];
/// The longest of them.
const LONGEST_LEASE: Duration = Duration::from_millis(1200);
/// The quarantine of the Redlock nodes and of the single Redis's clients: the longest lease
/// (the default, the default lease of 30 s, would hold a restarted server back past the
/// program).
const QUARANTINE: Duration = LONGEST_LEASE;
/// How long tasks start new operations, and the fault driver injects faults.
const PROGRAM: Duration = Duration::from_secs(4);
/// How often a holder looks at its guard inside its section.
const SAMPLE: Duration = Duration::from_millis(10);
/// The per-node timeout of the Redlock backends.
const NODE_TIMEOUT: Duration = Duration::from_millis(150);
/// The quarantine may end up to two seconds late: the server's uptime is whole seconds, and
/// the backend takes one off.
const UPTIME_ROUNDING: Duration = Duration::from_secs(2);
/// How long a Redlock node that could not be reached is skipped.
const NODE_SKIP: Duration = Duration::from_secs(1);
/// How long a fair waiter's place lives unless its client keeps it alive (the single Redis's
/// clients): a place left behind (a waiter whose leave was lost, or whose join landed late)
/// holds the queue up for at most this.
const WAITER_TIMEOUT: Duration = Duration::from_secs(1);
/// The command timeout of some single-Redis clients (the others keep the default, 1 s): an
/// acquire sent to a stalled server times out and is undone while the server still has it
/// queued.
const SHORT_COMMAND_TIMEOUT: Duration = Duration::from_millis(150);
/// Scheduling slack past a computed bound, on a busy machine.
const SLACK: Duration = Duration::from_millis(1500);
/// How many seeds each family runs by default.
const DEFAULT_SEEDS: u64 = 6;

/// The negative control: `SERVER_FAULTS_NO_QUARANTINE=1` turns every backend's quarantine off.
fn quarantine_off() -> bool {
    std::env::var("SERVER_FAULTS_NO_QUARANTINE").is_ok_and(|value| value == "1")
}

/// One critical section, as the checker recorded it.
#[derive(Clone, Debug)]
struct Record {
    section: u64,
    /// Whose hold it is: the section that took it (a re-entry names its first section).
    holder: u64,
    task: usize,
    key: &'static str,
    /// When the acquire was sent: the grant came later.
    sent: Instant,
    /// When the acquire returned the guard: the grant came earlier.
    entered: Instant,
    /// The last moment the guard was seen not lost (`None`: lost already when entered).
    believed_until: Option<Instant>,
    token: Option<u64>,
}

/// Counts for the summary line.
#[derive(Debug, Default)]
struct Stats {
    sections: u64,
    /// Sections that re-entered a hold (counted in `sections` too).
    reentries: u64,
    /// Sections of a fair lock (counted in `sections` too).
    fair: u64,
    lost_inside: u64,
    errors: BTreeMap<String, u64>,
    faults: BTreeMap<&'static str, u64>,
    /// The longest a fresh client took to get a key after the faults were healed.
    slowest_liveness: Duration,
}

impl Stats {
    fn add(&mut self, other: &Self) {
        self.sections += other.sections;
        self.reentries += other.reentries;
        self.fair += other.fair;
        self.lost_inside += other.lost_inside;
        for (kind, n) in &other.errors {
            *self.errors.entry(kind.clone()).or_default() += n;
        }
        for (kind, n) in &other.faults {
            *self.faults.entry(kind).or_default() += n;
        }
        self.slowest_liveness = self.slowest_liveness.max(other.slowest_liveness);
    }
}

/// Who is inside a key's section right now, with their guards.
struct Inside<B: Backend> {
    section: u64,
    holder: u64,
    task: usize,
    guard: Arc<LockGuard<B>>,
}

/// The independent checker, the program's log and its counts.
struct Checker<B: Backend> {
    started: Instant,
    inside: Mutex<HashMap<&'static str, Vec<Inside<B>>>>,
    records: Mutex<Vec<Record>>,
    violations: Mutex<Vec<String>>,
    log: Mutex<String>,
    stats: Mutex<Stats>,
    next_section: AtomicU64,
}

/// Locks a mutex, through a poisoning (a panicking task is reported as such).
fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<B: Backend> Checker<B> {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            started: Instant::now(),
            inside: Mutex::new(HashMap::new()),
            records: Mutex::new(Vec::new()),
            violations: Mutex::new(Vec::new()),
            log: Mutex::new(String::new()),
            stats: Mutex::new(Stats::default()),
            next_section: AtomicU64::new(1),
        })
    }

    /// Milliseconds since the program started, for the log.
    fn at(&self, instant: Instant) -> f64 {
        instant.saturating_duration_since(self.started).as_secs_f64() * 1e3
    }

    fn note(&self, who: &str, what: impl std::fmt::Display) {
        let at = self.at(Instant::now());
        let _ = writeln!(locked(&self.log), "{at:>9.1} ms  {who:<6} {what}");
    }

    fn violation(&self, what: String) {
        self.note("CHECK", format_args!("VIOLATION: {what}"));
        locked(&self.violations).push(what);
    }

    fn fault(&self, kind: &'static str, what: impl std::fmt::Display) {
        *locked(&self.stats).faults.entry(kind).or_default() += 1;
        self.note("fault", what);
    }

    /// Counts a restart that came while a holder was inside with its guard not lost: the case
    /// the quarantine is for.
    fn note_holders_inside(&self) {
        let believing =
            locked(&self.inside).values().flatten().filter(|entry| !entry.guard.is_lost()).count();
        if believing > 0 {
            *locked(&self.stats).faults.entry("restarts with a holder inside").or_default() += 1;
            self.note("fault", format_args!("{believing} holder(s) inside at the kill"));
        }
    }

    /// An acquire failed: allowed under server faults when the store timed out, refused the
    /// connection, had no quorum, was in quarantine, or the wait ran out.
    fn acquire_failed(&self, task: usize, key: &str, error: &LockError) {
        let kind = match error {
            LockError::WaitTimeout { .. } => Some("wait timeout".to_owned()),
            LockError::Backend(backend) => match backend.kind() {
                BackendErrorKind::Unavailable
                | BackendErrorKind::Timeout
                | BackendErrorKind::Interrupted
                | BackendErrorKind::Quarantined
                | BackendErrorKind::Other => Some(format!("{:?}", backend.kind())),
                BackendErrorKind::QuorumUnavailable { .. } => Some("QuorumUnavailable".to_owned()),
                _ => None,
            },
            _ => None,
        };
        self.note(&format!("t{task}"), format_args!("acquire of {key} failed: {error}"));
        match kind {
            Some(kind) => *locked(&self.stats).errors.entry(kind).or_default() += 1,
            None => self.violation(format!(
                "t{task}: acquire of {key} failed with an error server faults do not explain: \
                 {error:?}"
            )),
        }
    }

    /// `task` enters the section of `key` with `guard`, whose acquire was sent at `sent`; a
    /// re-entry names the section whose hold it re-entered (`of`). Returns the section's
    /// number, the guard, and when it was seen believing (if it was).
    fn enter(
        &self,
        key: &'static str,
        task: usize,
        sent: Instant,
        guard: LockGuard<B>,
        of: Option<u64>,
    ) -> (u64, Arc<LockGuard<B>>, Option<Instant>) {
        // The timestamp first: a guard not lost now was not lost then (a loss is final).
        let entered = Instant::now();
        let believed = (!guard.is_lost()).then_some(entered);
        let section = self.next_section.fetch_add(1, Ordering::Relaxed);
        let holder = of.unwrap_or(section);
        let guard = Arc::new(guard);
        let mut inside = locked(&self.inside);
        let entries = inside.entry(key).or_default();
        if believed.is_some() {
            for other in entries.iter() {
                if other.holder != holder && !other.guard.is_lost() {
                    self.violation(format!(
                        "key {key}: t{task} entered section {section} while t{} (section {}) \
                         was inside with its guard not lost",
                        other.task, other.section
                    ));
                }
            }
        }
        entries.push(Inside { section, holder, task, guard: guard.clone() });
        drop(inside);
        let token = guard.fencing_token();
        {
            let mut stats = locked(&self.stats);
            stats.sections += 1;
            stats.reentries += u64::from(of.is_some());
            stats.fair += u64::from(is_fair(key));
        }
        self.note(
            &format!("t{task}"),
            format_args!(
                "{} {key} section {section} token {token:?} (sent at {:.1} ms){}",
                of.map_or("enter".to_owned(), |of| format!(
                    "re-enter (count {}) section {of}'s hold of",
                    guard.hold_count()
                )),
                self.at(sent),
                if believed.is_none() { " already lost" } else { "" },
            ),
        );
        let record =
            Record { section, holder, task, key, sent, entered, believed_until: believed, token };
        locked(&self.records).push(record);
        (section, guard, believed)
    }

    /// `task` leaves section `section` of `key`, its guard last seen believing at
    /// `believed_until`; gives the guard back to be released or dropped.
    fn leave(
        &self,
        key: &'static str,
        task: usize,
        section: u64,
        believed_until: Option<Instant>,
        guard: Arc<LockGuard<B>>,
    ) -> LockGuard<B> {
        if let Some(entries) = locked(&self.inside).get_mut(key) {
            entries.retain(|entry| entry.section != section);
        }
        if let Some(record) =
            locked(&self.records).iter_mut().find(|record| record.section == section)
        {
            record.believed_until = believed_until;
        }
        self.note(
            &format!("t{task}"),
            format_args!(
                "leave {key} section {section}, believed until {}",
                believed_until.map_or("-".to_owned(), |at| format!("{:.1} ms", self.at(at)))
            ),
        );
        Arc::try_unwrap(guard).unwrap_or_else(|_| panic!("the checker keeps no other reference"))
    }

    /// The checks over the whole history: exclusion by the believed intervals, and fencing
    /// tokens in grant order.
    fn check_history(&self) {
        let records = locked(&self.records).clone();
        for (i, a) in records.iter().enumerate() {
            for b in &records[i + 1..] {
                // A re-entry shares its hold with the section it re-entered.
                if a.key != b.key || a.holder == b.holder {
                    continue;
                }
                if let (Some(a_until), Some(b_until)) = (a.believed_until, b.believed_until)
                    && a.entered <= b_until
                    && b.entered <= a_until
                {
                    self.violation(format!(
                        "key {}: t{} (section {}, believed {:.1}..{:.1} ms) and t{} (section {}, \
                         believed {:.1}..{:.1} ms) both believed they held it at one time",
                        a.key,
                        a.task,
                        a.section,
                        self.at(a.entered),
                        self.at(a_until),
                        b.task,
                        b.section,
                        self.at(b.entered),
                        self.at(b_until),
                    ));
                }
                for (first, then) in [(a, b), (b, a)] {
                    if let (Some(low), Some(high)) = (first.token, then.token)
                        && first.entered < then.sent
                        && low >= high
                    {
                        self.violation(format!(
                            "key {}: section {} (t{}, token {low}) was granted before section {} \
                             (t{}, token {high}) was asked for, and its token is not lower",
                            first.key, first.section, first.task, then.section, then.task
                        ));
                    }
                }
            }
        }
    }

    fn outcome(&self) -> Outcome {
        Outcome {
            violations: locked(&self.violations).clone(),
            log: locked(&self.log).clone(),
            stats: std::mem::take(&mut *locked(&self.stats)),
        }
    }
}

/// What one seed found.
struct Outcome {
    violations: Vec<String>,
    log: String,
    stats: Stats,
}

/// One task of a program: acquires, sections, releases, until the program's time is up.
struct Task<B: Backend> {
    id: usize,
    client: LockClient<B>,
    checker: Arc<Checker<B>>,
    rng: Rng,
    keys: &'static [&'static str],
    mix: Mix,
    until: Instant,
}

/// What a program's tasks do besides plain acquires.
#[derive(Clone, Copy, Debug)]
struct Mix {
    /// Some acquires ask for a fencing token (not on Redlock, which refuses them).
    fencing: bool,
    /// Some sections re-enter their hold (the single Redis).
    reentry: bool,
}

/// A re-entry a section makes: the same key, the section's holder, its own lease and wait.
#[derive(Debug)]
struct Reentry {
    /// How long after entering the section (or at its end, when that is sooner).
    after: Duration,
    wait: Duration,
    lease: Lease,
    hold: Duration,
    fencing: bool,
    release: bool,
}

/// A guard inside its section, and what its holder saw of it.
struct Held<B: Backend> {
    guard: Arc<LockGuard<B>>,
    /// The last moment it was seen not lost.
    believed: Option<Instant>,
    lost: bool,
}

impl<B: Backend> Held<B> {
    fn new(guard: Arc<LockGuard<B>>, believed: Option<Instant>) -> Self {
        let lost = believed.is_none();
        Self { guard, believed, lost }
    }

    /// Looks at the guard: the timestamp first, so a guard not lost now was not lost then.
    fn look(&mut self) {
        let seen = Instant::now();
        if self.guard.is_lost() {
            self.lost = true;
        } else {
            self.believed = Some(seen);
        }
    }
}

/// Stays inside until `until`, looking at every guard every [`SAMPLE`]; leaves at once when
/// one is seen lost (as the middleware does).
async fn stay<B: Backend>(held: &mut [&mut Held<B>], until: Instant) {
    while !held.iter().any(|h| h.lost) {
        let now = Instant::now();
        if now >= until {
            break;
        }
        tokio::time::sleep((until - now).min(SAMPLE)).await;
        for h in held.iter_mut() {
            h.look();
        }
    }
}

/// A request for `key` of the kind its name says: `f…` names a fair lock, others a plain one
/// (a key keeps one kind).
fn request<'a, B: Backend>(client: &'a LockClient<B>, key: &str) -> LockRequest<'a, B> {
    match is_fair(key) {
        true => client.fair_lock(key),
        false => client.lock(key),
    }
}

fn is_fair(key: &str) -> bool {
    key.starts_with('f')
}

impl<B: Backend> Task<B> {
    async fn run(mut self) {
        let who = format!("t{}", self.id);
        while Instant::now() < self.until {
            let key = self.rng.pick(self.keys);
            let lease = self.lease();
            let wait = self.wait();
            let hold = self.hold();
            let fencing = self.mix.fencing && self.rng.chance(0.5);
            let release = self.rng.chance(0.6);
            let reentry = (self.mix.reentry && self.rng.chance(0.35)).then(|| Reentry {
                after: Duration::from_millis(self.rng.pick(&[0, 10, 100])),
                wait: self.wait(),
                lease: self.lease(),
                hold: self.hold(),
                fencing: self.mix.fencing && self.rng.chance(0.5),
                release: self.rng.chance(0.6),
            });
            self.checker.note(
                &who,
                format_args!(
                    "acquire {key} wait {wait:?} lease {lease:?} fencing {fencing} hold {hold:?}\
                     {}",
                    reentry.as_ref().map_or(String::new(), |r| format!(", then {r:?}"))
                ),
            );
            let mut request = request(&self.client, key).wait(wait).lease(lease);
            if fencing {
                request = request.fencing();
            }
            let sent = Instant::now();
            match request.acquire().await {
                Ok(guard) => {
                    self.section(key, sent, guard, hold, release, reentry).await;
                }
                Err(error) => self.checker.acquire_failed(self.id, key, &error),
            }
            let pause = self.rng.pick(&[0, 5, 30]);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }

    /// A lease of the program's lengths, watchdog or fixed.
    fn lease(&mut self) -> Lease {
        let length = Duration::from_millis(self.rng.pick(&LEASES_MS));
        if self.rng.chance(0.5) { Lease::watchdog(length) } else { Lease::fixed(length) }
    }

    fn wait(&mut self) -> Duration {
        Duration::from_millis(self.rng.pick(&[0, 100, 500, 2000]))
    }

    /// How long to stay inside (sometimes past a fixed lease).
    fn hold(&mut self) -> Duration {
        Duration::from_millis(self.rng.pick(&[0, 10, 50, 200, 500, 1500]))
    }

    /// Inside `key` for `hold`, looking at the guard every [`SAMPLE`] (and re-entering it
    /// meanwhile, when `reentry` says so); a holder that sees its guard lost leaves at once (as
    /// the middleware does). Then releases or drops the guard.
    async fn section(
        &self,
        key: &'static str,
        sent: Instant,
        guard: LockGuard<B>,
        hold: Duration,
        release: bool,
        reentry: Option<Reentry>,
    ) {
        let (section, guard, believed) = self.checker.enter(key, self.id, sent, guard, None);
        let until = Instant::now() + hold;
        let mut held = Held::new(guard, believed);
        if let Some(reentry) = reentry {
            stay(&mut [&mut held], until.min(Instant::now() + reentry.after)).await;
            if !held.lost {
                self.reenter(key, section, &mut held, reentry).await;
            }
        }
        stay(&mut [&mut held], until).await;
        self.end(key, section, held, release).await;
    }

    /// Re-enters the hold of section `of` (`outer`) with its holder, stays inside for the
    /// re-entry's hold (looking at both guards), and releases or drops the re-entry's guard.
    async fn reenter(&self, key: &'static str, of: u64, outer: &mut Held<B>, reentry: Reentry) {
        let mut request = request(&self.client, key)
            .holder(outer.guard.holder())
            .wait(reentry.wait)
            .lease(reentry.lease);
        if reentry.fencing {
            request = request.fencing();
        }
        let sent = Instant::now();
        let guard = match request.acquire().await {
            Ok(guard) => guard,
            Err(error) => {
                self.checker.acquire_failed(self.id, key, &error);
                return;
            }
        };
        let (section, guard, believed) = self.checker.enter(key, self.id, sent, guard, Some(of));
        let mut inner = Held::new(guard, believed);
        stay(&mut [&mut *outer, &mut inner], Instant::now() + reentry.hold).await;
        self.end(key, section, inner, reentry.release).await;
    }

    /// Ends section `section`: counts a loss its holder saw inside, records that it left, and
    /// releases or drops its guard.
    async fn end(&self, key: &'static str, section: u64, held: Held<B>, release: bool) {
        if held.lost {
            locked(&self.checker.stats).lost_inside += 1;
            let who = format!("t{}", self.id);
            self.checker.note(&who, format_args!("section {section} saw its guard lost"));
        }
        let guard = self.checker.leave(key, self.id, section, held.believed, held.guard);
        self.give_back(key, guard, release).await;
    }

    /// Releases the guard, or drops it.
    async fn give_back(&self, key: &str, guard: LockGuard<B>, release: bool) {
        let who = format!("t{}", self.id);
        if release {
            let released = guard.release().await;
            self.checker.note(&who, format_args!("released {key}: {released:?}"));
        } else {
            drop(guard);
            self.checker.note(&who, format_args!("dropped {key}"));
        }
    }
}

/// Spawns the program's tasks: two per client, each with its own generator.
fn spawn_tasks<B: Backend>(
    tasks: &mut tokio::task::JoinSet<()>,
    clients: &[LockClient<B>],
    checker: &Arc<Checker<B>>,
    rng: &mut Rng,
    keys: &'static [&'static str],
    mix: Mix,
    until: Instant,
) {
    for (id, client) in clients.iter().flat_map(|c| [c, c]).enumerate() {
        let task = Task {
            id,
            client: client.clone(),
            checker: checker.clone(),
            rng: Rng(rng.next()),
            keys,
            mix,
            until,
        };
        tasks.spawn(task.run());
    }
}

/// Waits for every task and the driver; a panic is a failure.
async fn join_all<B: Backend>(tasks: &mut tokio::task::JoinSet<()>, checker: &Checker<B>) {
    while let Some(joined) = tasks.join_next().await {
        if let Err(error) = joined {
            checker.violation(format!("a task or the fault driver panicked: {error}"));
        }
    }
}

/// Once the faults are healed, a fresh client takes every key within `bound` (a fair key:
/// within `bound` + [`WAITER_TIMEOUT`], as a place a waiter left behind holds the queue up
/// that long) (retrying on errors a store that just came back may answer), never later.
async fn check_liveness<B: Backend>(
    client: &LockClient<B>,
    keys: &[&'static str],
    bound: Duration,
    checker: &Checker<B>,
) {
    let healed = Instant::now();
    for key in keys {
        let bound = match is_fair(key) {
            true => bound + WAITER_TIMEOUT,
            false => bound,
        };
        loop {
            let left = bound.saturating_sub(healed.elapsed());
            let taken =
                request(client, key).lease(Lease::fixed(LONGEST_LEASE)).wait(left).acquire().await;
            match taken {
                Ok(guard) => {
                    let took = healed.elapsed();
                    checker.note("fresh", format_args!("took {key} {took:?} after the heal"));
                    if took > bound {
                        checker.violation(format!(
                            "key {key} was free only {took:?} after the faults were healed \
                             (bound {bound:?})"
                        ));
                    }
                    {
                        let mut stats = locked(&checker.stats);
                        stats.slowest_liveness = stats.slowest_liveness.max(took);
                    }
                    let _ = guard.release().await;
                    break;
                }
                Err(error) if healed.elapsed() < bound && !is_wait_timeout(&error) => {
                    checker.note("fresh", format_args!("acquire of {key} failed: {error}"));
                    // Pacing between tries of a store that refuses at once, not a wait for
                    // an event.
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
                Err(error) => {
                    checker.violation(format!(
                        "key {key} is stranded: a fresh client could not take it within \
                         {bound:?} of the heal: {error:?}"
                    ));
                    break;
                }
            }
        }
    }
}

fn is_wait_timeout(error: &LockError) -> bool {
    matches!(error, LockError::WaitTimeout { .. })
}

/// Runs `blocking` (a fixture call that waits on a process) off the runtime's threads.
async fn off_runtime<T: Send + 'static>(blocking: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(blocking).await.expect("fixture call")
}

/// Waits until every server in `servers` has been up long enough that a quarantine of
/// [`QUARANTINE`] is over by its own uptime, so that a program starts with every store
/// granting (faults come from the driver only).
async fn wait_out_quarantine(servers: &Arc<Mutex<Vec<RedisServer>>>) {
    // The backend takes a second off the uptime it reads (see `UPTIME_ROUNDING`).
    let needed = QUARANTINE.as_secs() + 1 + u64::from(QUARANTINE.subsec_millis() > 0);
    let deadline = Instant::now() + Duration::from_secs(needed + 10);
    loop {
        let servers = servers.clone();
        let youngest =
            off_runtime(move || locked(&servers).iter().map(uptime_secs).min().unwrap_or(u64::MAX))
                .await;
        if youngest >= needed {
            return;
        }
        assert!(Instant::now() < deadline, "a server's uptime stayed at {youngest} s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `uptime_in_seconds` of a running server.
fn uptime_secs(server: &RedisServer) -> u64 {
    let info = server.info("server").expect("INFO server");
    info.lines()
        .find_map(|line| line.strip_prefix("uptime_in_seconds:"))
        .and_then(|value| value.trim().parse().ok())
        .expect("uptime_in_seconds")
}

/// Empties every server (each seed also uses keys of its own prefix).
async fn flush_all(servers: &Arc<Mutex<Vec<RedisServer>>>) {
    let servers = servers.clone();
    off_runtime(move || {
        for server in locked(&servers).iter() {
            assert_eq!(server.cmd(&["FLUSHALL"]), RespValue::Simple("OK".into()), "FLUSHALL");
        }
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// Redlock over three nodes.

/// The liveness bound on Redlock: a hold left behind lives a lease; a restarted node votes
/// "held" for the quarantine (late by the uptime rounding); a node that could not be reached
/// is skipped for a second; node calls take up to their timeout.
const REDLOCK_BOUND: Duration = Duration::from_millis(
    (LONGEST_LEASE.as_millis()
        + QUARANTINE.as_millis()
        + UPTIME_ROUNDING.as_millis()
        + NODE_SKIP.as_millis()
        + 2 * NODE_TIMEOUT.as_millis()
        + SLACK.as_millis()) as u64,
);

/// Three nodes shared by the seeds of one run (each seed flushes them, waits until none is in
/// quarantine, and uses a key prefix of its own).
struct Nodes {
    servers: Arc<Mutex<Vec<RedisServer>>>,
    urls: Vec<String>,
}

impl Nodes {
    fn start() -> Self {
        let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
        let urls = servers.iter().map(RedisServer::url).collect();
        Self { servers: Arc::new(Mutex::new(servers)), urls }
    }

    /// A backend of its own: a separate process's connections and subscriptions.
    fn client(&self, prefix: &str) -> LockClient<RedlockBackend> {
        let backend = support::redlock_backend(self.urls.iter().cloned())
            .node_timeout(NODE_TIMEOUT)
            .retry_jitter(Duration::from_millis(20))
            .quarantine(if quarantine_off() { Duration::ZERO } else { QUARANTINE })
            .build()
            .expect("valid Redlock configuration");
        LockClient::builder(backend).prefix(prefix).build().expect("valid configuration")
    }
}

/// The Redlock fault driver: until the program's time is up, at random moments, stalls one
/// node (or two, briefly) and resumes it; kills one and restarts it empty; stalls one node and,
/// once it is resumed, kills another; or keeps one node down for a while (holds taken
/// meanwhile live on exactly the two others), restarts it empty, and at once kills one of the
/// two others and restarts it empty too (without the quarantine, the two restarted nodes would
/// make a majority for a second holder). Each fault is healed before the next; when the driver
/// returns, every node runs.
async fn redlock_driver(
    servers: Arc<Mutex<Vec<RedisServer>>>,
    checker: Arc<Checker<RedlockBackend>>,
    mut rng: Rng,
    until: Instant,
) {
    while Instant::now() < until {
        tokio::time::sleep(rng.millis(50, 600)).await;
        let node = rng.below(3) as usize;
        let other = (node + 1 + rng.below(2) as usize) % 3;
        match rng.below(10) {
            0..=2 => {
                let stall = rng.millis(50, 800);
                checker.fault("pause 1", format_args!("pause node {node} for {stall:?}"));
                stall_nodes(&servers, &[node], stall).await;
            }
            3 | 4 => {
                let stall = rng.millis(20, 300);
                checker
                    .fault("pause 2", format_args!("pause nodes {node} and {other} for {stall:?}"));
                stall_nodes(&servers, &[node, other], stall).await;
            }
            5 | 6 => {
                let down = rng.millis(0, 400);
                checker.fault(
                    "kill+restart",
                    format_args!("kill node {node}, restart it empty after {down:?}"),
                );
                kill_and_restart(&servers, &checker, node, down).await;
            }
            7 => {
                let (stall, down) = (rng.millis(200, 900), rng.millis(0, 400));
                checker.fault(
                    "pause 1, then kill another",
                    format_args!(
                        "pause node {node} for {stall:?}, then kill node {other} and restart \
                         it empty after {down:?}"
                    ),
                );
                stall_nodes(&servers, &[node], stall).await;
                kill_and_restart(&servers, &checker, other, down).await;
            }
            8 => {
                let (first_down, down) = (rng.millis(300, 900), rng.millis(0, 400));
                checker.fault(
                    "kill 1, then kill another",
                    format_args!(
                        "kill node {node}, restart it empty after {first_down:?}, then kill \
                         node {other} and restart it empty after {down:?}"
                    ),
                );
                kill_and_restart(&servers, &checker, node, first_down).await;
                kill_and_restart(&servers, &checker, other, down).await;
            }
            _ => {}
        }
    }
}

/// Stalls `nodes` (`SIGSTOP`) for `stall`, then resumes them (the single Redis is node 0).
async fn stall_nodes(servers: &Arc<Mutex<Vec<RedisServer>>>, nodes: &[usize], stall: Duration) {
    let (s, stalled) = (servers.clone(), nodes.to_vec());
    off_runtime(move || stalled.iter().for_each(|&node| locked(&s)[node].pause())).await;
    tokio::time::sleep(stall).await;
    let (s, stalled) = (servers.clone(), nodes.to_vec());
    off_runtime(move || stalled.iter().for_each(|&node| locked(&s)[node].resume())).await;
}

/// Kills `node` (`SIGKILL`), waits `down`, and starts it again, empty.
async fn kill_and_restart(
    servers: &Arc<Mutex<Vec<RedisServer>>>,
    checker: &Checker<RedlockBackend>,
    node: usize,
    down: Duration,
) {
    let s = servers.clone();
    off_runtime(move || locked(&s)[node].kill()).await;
    checker.note_holders_inside();
    tokio::time::sleep(down).await;
    let s = servers.clone();
    off_runtime(move || locked(&s)[node].restart()).await;
    checker.note("fault", format_args!("node {node} is back, empty"));
}

/// One seed's Redlock program.
async fn redlock_seed(nodes: &Nodes, seed: u64) -> Outcome {
    flush_all(&nodes.servers).await;
    wait_out_quarantine(&nodes.servers).await;
    let mut rng = Rng(seed);
    let checker = Checker::<RedlockBackend>::new();
    let prefix = format!("sf{seed}:");
    let client_count = 2 + rng.below(2) as usize;
    let keys: &'static [&'static str] = if rng.chance(0.5) { &["k0"] } else { &["k0", "k1"] };
    checker
        .note("setup", format_args!("seed {seed}: {client_count} clients x 2 tasks on {keys:?}"));
    let clients: Vec<_> = (0..client_count).map(|_| nodes.client(&prefix)).collect();
    let until = Instant::now() + PROGRAM;
    let mut tasks = tokio::task::JoinSet::new();
    let mix = Mix { fencing: false, reentry: false };
    spawn_tasks(&mut tasks, &clients, &checker, &mut rng, keys, mix, until);
    tasks.spawn(redlock_driver(nodes.servers.clone(), checker.clone(), Rng(rng.next()), until));
    join_all(&mut tasks, &checker).await;
    checker.note("setup", "program over, every node runs");
    let fresh = nodes.client(&prefix);
    check_liveness(&fresh, keys, REDLOCK_BOUND, &checker).await;
    for client in clients.iter().chain([&fresh]) {
        client.shutdown().await;
    }
    checker.check_history();
    checker.outcome()
}

// ---------------------------------------------------------------------------------------------
// A single Redis restarted empty or from older snapshots.

/// The liveness bound on a single Redis: a hold left behind (or brought back by a snapshot)
/// lives a lease; a restarted server grants nothing for the quarantine (late by the uptime
/// rounding).
const SINGLE_BOUND: Duration = Duration::from_millis(
    (LONGEST_LEASE.as_millis()
        + QUARANTINE.as_millis()
        + UPTIME_ROUNDING.as_millis()
        + SLACK.as_millis()) as u64,
);

/// One server shared by the seeds of one run, which restarts it on its port and dir.
struct Single {
    servers: Arc<Mutex<Vec<RedisServer>>>,
    url: String,
    dir: PathBuf,
}

impl Single {
    fn start() -> Self {
        let server = RedisServer::start();
        let (url, dir) = (server.url(), server.dir().to_owned());
        Self { servers: Arc::new(Mutex::new(vec![server])), url, dir }
    }

    /// A client over connections its backend opens itself (a quarantine of [`QUARANTINE`]),
    /// with the [`SHORT_COMMAND_TIMEOUT`] when `short`.
    async fn own_client(&self, prefix: &str, short: bool) -> LockClient<RedisBackend> {
        let backend = connect(|| async {
            command_timeout(control(RedisBackend::builder(self.url.clone())), short).connect().await
        })
        .await;
        single_client(backend, prefix)
    }

    /// A client over an application's pool: the acquire scripts read the server's run
    /// themselves and check it against the run marker.
    async fn pool_client(&self, prefix: &str, short: bool) -> LockClient<RedisBackend> {
        use tower_lock::backend::redis::{bb8, bb8_redis::RedisConnectionManager};

        let backend = connect(|| async {
            let manager = RedisConnectionManager::new(self.url.clone()).expect("manager");
            let pool = bb8::Pool::builder()
                .connection_timeout(Duration::from_secs(1))
                .build(manager)
                .await
                .expect("pool");
            command_timeout(control(RedisBackend::builder(self.url.clone())), short)
                .pool(pool)
                .connect()
                .await
        })
        .await;
        single_client(backend, prefix)
    }

    /// The server's snapshot file.
    fn dump(&self) -> PathBuf {
        self.dir.join("dump.rdb")
    }

    /// Removes the snapshots of earlier seeds.
    fn forget_snapshots(&self) {
        let entries = std::fs::read_dir(&self.dir).expect("the server's dir");
        for entry in entries {
            let path = entry.expect("dir entry").path();
            if path.extension().is_some_and(|ext| ext == "rdb") {
                std::fs::remove_file(&path).expect("remove a snapshot");
            }
        }
    }
}

/// Connects with `connect`, tried three times: a first command may take longer than a short
/// command timeout on a busy machine (no fault is injected yet).
async fn connect<F, Fut>(mut connect: F) -> RedisBackend
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<RedisBackend, tower_lock::BackendError>>,
{
    let mut tries = 0;
    loop {
        tries += 1;
        match connect().await {
            Ok(backend) => return backend,
            Err(error) if tries < 3 => eprintln!("connect, try {tries}: {error}"),
            Err(error) => panic!("connect: {error}"),
        }
    }
}

/// A single-Redis program's client over `backend`: fair waiters' places live
/// [`WAITER_TIMEOUT`].
fn single_client(backend: RedisBackend, prefix: &str) -> LockClient<RedisBackend> {
    LockClient::builder(backend)
        .prefix(prefix)
        .waiter_timeout(WAITER_TIMEOUT)
        .build()
        .expect("valid configuration")
}

/// The builder with the [`SHORT_COMMAND_TIMEOUT`] when `short`, else as it is (the default).
fn command_timeout(
    builder: tower_lock::RedisBackendBuilder,
    short: bool,
) -> tower_lock::RedisBackendBuilder {
    match short {
        true => builder.command_timeout(SHORT_COMMAND_TIMEOUT),
        false => builder,
    }
}

/// The builder with a quarantine of [`QUARANTINE`], or off for the negative control.
fn control(builder: tower_lock::RedisBackendBuilder) -> tower_lock::RedisBackendBuilder {
    match quarantine_off() {
        true => builder.quarantine(Duration::ZERO),
        false => builder.quarantine(QUARANTINE),
    }
}

/// The single-Redis fault driver: until the program's time is up, at random moments, takes a
/// snapshot (`SAVE`, copied aside); kills the server (`SIGKILL`) and restarts it from one of
/// the snapshots taken so far (the older data) or empty; or stalls it (`SIGSTOP`) for less
/// than the shortest lease, for less than the longest, or for up to 1.5 times the longest,
/// then resumes it, so that the commands sent meanwhile (acquires whose callers timed out,
/// their undos, releases) run late, in one burst. When it returns, the server runs.
async fn single_driver(
    single: Arc<Single>,
    checker: Arc<Checker<RedisBackend>>,
    mut rng: Rng,
    until: Instant,
) {
    let mut snapshots: Vec<PathBuf> = Vec::new();
    while Instant::now() < until {
        tokio::time::sleep(rng.millis(100, 1000)).await;
        match rng.below(20) {
            0..=7 => {
                let copy = single.dir.join(format!("snapshot-{}.rdb", snapshots.len()));
                checker.fault("save", format_args!("SAVE as {}", copy.display()));
                let (s, from, to) = (single.clone(), single.dump(), copy.clone());
                off_runtime(move || {
                    let reply = locked(&s.servers)[0].cmd(&["SAVE"]);
                    assert_eq!(reply, RespValue::Simple("OK".into()), "SAVE");
                    std::fs::copy(from, to).expect("copy the snapshot aside");
                })
                .await;
                snapshots.push(copy);
            }
            8..=11 if !snapshots.is_empty() => {
                let snapshot = snapshots[rng.below(snapshots.len() as u64) as usize].clone();
                let down = rng.millis(0, 200);
                checker.fault(
                    "restart from snapshot",
                    format_args!("kill -9, restart from {} after {down:?}", snapshot.display()),
                );
                restart_single(&single, &checker, Some(snapshot), down).await;
                checker.note("fault", "the server is back from the snapshot");
            }
            8..=14 => {
                let down = rng.millis(0, 200);
                checker
                    .fault("restart empty", format_args!("kill -9, restart empty after {down:?}"));
                restart_single(&single, &checker, None, down).await;
                checker.note("fault", "the server is back, empty");
            }
            _ => {
                let shortest = LEASES_MS[0];
                let longest = LONGEST_LEASE.as_millis() as u64;
                let (kind, stall) = match rng.below(3) {
                    0 => ("pause < shortest lease", rng.millis(20, shortest - 1)),
                    1 => ("pause < longest lease", rng.millis(shortest, longest - 1)),
                    _ => ("pause > longest lease", rng.millis(longest, longest * 3 / 2)),
                };
                checker.fault(kind, format_args!("pause (SIGSTOP) for {stall:?}"));
                stall_nodes(&single.servers, &[0], stall).await;
                checker.note("fault", "the server runs again");
            }
        }
    }
}

/// Kills the server, waits `down`, puts `snapshot` in place of its dump (none: no dump, so it
/// starts empty) and starts it again.
async fn restart_single(
    single: &Arc<Single>,
    checker: &Checker<RedisBackend>,
    snapshot: Option<PathBuf>,
    down: Duration,
) {
    let s = single.clone();
    off_runtime(move || locked(&s.servers)[0].kill()).await;
    checker.note_holders_inside();
    tokio::time::sleep(down).await;
    let s = single.clone();
    off_runtime(move || {
        let dump = s.dump();
        match snapshot {
            Some(snapshot) => {
                std::fs::copy(snapshot, &dump).expect("put the snapshot back");
            }
            None => match std::fs::remove_file(&dump) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => panic!("remove {}: {e}", dump.display()),
            },
        }
        locked(&s.servers)[0].restart();
    })
    .await;
}

/// One seed's single-Redis program.
async fn single_seed(single: &Arc<Single>, seed: u64) -> Outcome {
    flush_all(&single.servers).await;
    single.forget_snapshots();
    wait_out_quarantine(&single.servers).await;
    let mut rng = Rng(seed);
    let checker = Checker::<RedisBackend>::new();
    let prefix = format!("sf{seed}:");
    let own = 2 + rng.below(2) as usize;
    // `f0` is a fair lock, the others plain ones.
    let keys: &'static [&'static str] =
        if rng.chance(0.5) { &["k0", "f0"] } else { &["k0", "k1", "f0"] };
    checker.note(
        "setup",
        format_args!("seed {seed}: {own} clients + 1 through a pool, x 2 tasks on {keys:?}"),
    );
    // The first own client has a short command timeout, the second the default; the others
    // draw theirs.
    let short: Vec<bool> = (0..=own).map(|i| i == 0 || (i > 1 && rng.chance(0.5))).collect();
    checker.note("setup", format_args!("short command timeouts (the pool's last): {short:?}"));
    let mut clients = Vec::new();
    for &short in &short[..own] {
        clients.push(single.own_client(&prefix, short).await);
    }
    clients.push(single.pool_client(&prefix, short[own]).await);
    // Every client asks for the longest lease once, which its quarantine covers, and finds the
    // server past its quarantine.
    for client in &clients {
        warm_up(client).await;
    }
    let until = Instant::now() + PROGRAM;
    let mut tasks = tokio::task::JoinSet::new();
    let mix = Mix { fencing: true, reentry: true };
    spawn_tasks(&mut tasks, &clients, &checker, &mut rng, keys, mix, until);
    tasks.spawn(single_driver(single.clone(), checker.clone(), Rng(rng.next()), until));
    join_all(&mut tasks, &checker).await;
    checker.note("setup", "program over, the server runs");
    let fresh = single.own_client(&prefix, false).await;
    check_liveness(&fresh, keys, SINGLE_BOUND, &checker).await;
    for client in clients.iter().chain([&fresh]) {
        client.shutdown().await;
    }
    checker.check_history();
    checker.outcome()
}

/// Acquires and releases a key of its own with the longest lease, once the server is past its
/// quarantine.
/// A short command timeout may run out on a busy machine (no fault is injected yet): such an
/// acquire is tried again.
async fn warm_up(client: &LockClient<RedisBackend>) {
    let deadline = Instant::now() + QUARANTINE + UPTIME_ROUNDING + SLACK;
    let guard = loop {
        let taken = client
            .lock("warm-up")
            .lease(Lease::fixed(LONGEST_LEASE))
            .wait(deadline.saturating_duration_since(Instant::now()))
            .acquire()
            .await;
        match taken {
            Ok(guard) => break guard,
            Err(LockError::Backend(error))
                if matches!(error.kind(), BackendErrorKind::Timeout)
                    && Instant::now() < deadline =>
            {
                eprintln!("warm-up acquire: {error}");
            }
            Err(error) => panic!("a warm-up acquire on a server past its quarantine: {error}"),
        }
    };
    // A release that timed out leaves the warm-up lock to its lease: the next warm-up waits.
    if let Err(error) = guard.release().await {
        eprintln!("warm-up release: {error}");
    }
}

// ---------------------------------------------------------------------------------------------
// Seeds.

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|value| {
        value.parse().unwrap_or_else(|_| panic!("{name} must be a number, not {value:?}"))
    })
}

/// The seeds to run: `SERVER_FAULTS_SEED` alone, or `SERVER_FAULTS_SEEDS` of them (default
/// [`DEFAULT_SEEDS`]) from `SERVER_FAULTS_FIRST_SEED` (default 1).
fn seeds() -> Vec<u64> {
    if let Some(seed) = env_u64("SERVER_FAULTS_SEED") {
        return vec![seed];
    }
    let count = env_u64("SERVER_FAULTS_SEEDS").unwrap_or(DEFAULT_SEEDS);
    let first = env_u64("SERVER_FAULTS_FIRST_SEED").unwrap_or(1);
    (first..first + count).collect()
}

/// Runs every seed with `run`, prints a summary, and fails with the first failing seed's
/// violations and log (later failing seeds are listed).
async fn run_seeds<F, Fut>(family: &str, test: &str, mut run: F)
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = Outcome>,
{
    let started = std::time::Instant::now();
    let seeds = seeds();
    let mut total = Stats::default();
    let mut failed = Vec::new();
    let mut first_report = None;
    for &seed in &seeds {
        let seed_started = std::time::Instant::now();
        let outcome = run(seed).await;
        println!(
            "{family} seed {seed}: {:.1} s, {} sections ({} re-entries, {} fair; {} saw their \
             guard lost), faults {:?}, acquire errors {:?}, slowest fresh acquire after the heal \
             {:?}{}",
            seed_started.elapsed().as_secs_f64(),
            outcome.stats.sections,
            outcome.stats.reentries,
            outcome.stats.fair,
            outcome.stats.lost_inside,
            outcome.stats.faults,
            outcome.stats.errors,
            outcome.stats.slowest_liveness,
            if outcome.violations.is_empty() {
                String::new()
            } else {
                format!(", {} VIOLATION(S)", outcome.violations.len())
            }
        );
        if seeds.len() == 1 {
            println!("{}", outcome.log);
        }
        total.add(&outcome.stats);
        if !outcome.violations.is_empty() {
            if first_report.is_none() {
                first_report = Some(format!(
                    "{family} seed {seed}: {} violation(s):\n  {}\nprogram log:\n{}\nreplay: \
                     SERVER_FAULTS_SEED={seed} cargo test --all-features --test faults \
                     server_faults::{test} -- --nocapture",
                    outcome.violations.len(),
                    outcome.violations.join("\n  "),
                    outcome.log
                ));
            }
            failed.push(seed);
        }
    }
    println!(
        "{family}: {} seeds in {:.1} s, {} sections ({} re-entries, {} fair; {} saw their guard \
         lost), faults {:?}, acquire errors {:?}, slowest fresh acquire after a heal {:?}, {} \
         failing",
        seeds.len(),
        started.elapsed().as_secs_f64(),
        total.sections,
        total.reentries,
        total.fair,
        total.lost_inside,
        total.faults,
        total.errors,
        total.slowest_liveness,
        failed.len()
    );
    if let Some(report) = first_report {
        panic!("{report}\nfailing seeds: {failed:?}");
    }
}

/// Redlock over three nodes, with nodes stalled, two stalled at once, and nodes killed and
/// restarted empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_programs_with_nodes_stalled_killed_and_restarted() {
    let nodes = Nodes::start();
    run_seeds("redlock", "redlock_programs_with_nodes_stalled_killed_and_restarted", |seed| {
        redlock_seed(&nodes, seed)
    })
    .await;
}

/// One Redis, killed and restarted empty or from a snapshot taken at a random earlier moment,
/// or stalled and resumed, with clients over their own connections (some with a short command
/// timeout) and one over an application's pool; plain, re-entered and fair locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_redis_programs_with_restarts_from_older_snapshots_and_stalls() {
    let single = Arc::new(Single::start());
    run_seeds(
        "single",
        "single_redis_programs_with_restarts_from_older_snapshots_and_stalls",
        |seed| single_seed(&single, seed),
    )
    .await;
}
