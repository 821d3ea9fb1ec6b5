//! Random programs against the lock engine, under many seeds, with an independent checker.
//!
//! Each seed builds a program: three clients on one store, two holders (tasks) per client,
//! each running a random sequence of operations on a few keys: acquires with random waits and
//! leases, re-entries (often with a shorter lease than the hold they nest in), releases and
//! dropped guards, acquires dropped at a random poll or after a random time, a re-entry joined
//! with the release of the guard it nests in, critical sections long enough for renewals to
//! fall due, a release followed by an acquire of the same key by the same holder, and now and
//! then a client shut down while it holds and waits; and sets of two or three locks taken
//! together (`lock_all`, plain or fair, in random orders, a key now and then named twice), some
//! of them patient (a wait far longer than any program). On the in-memory store every backend call
//! is delayed by a random few milliseconds before and after it runs, so attempts, renewals
//! and releases are in flight when the program cancels or races them; and in half of the
//! programs a call now and then fails: refused before it runs (no connection), or run with its
//! reply lost (a timeout), an acquire also left unrun with a timeout. Those programs may see
//! these errors, and their keys need only be free within a lease after the program (an undo
//! retried in the background may still be on its way).
//!
//! The checker never looks inside the engine. It records who is inside which critical
//! section, holding which guard, and asserts:
//! 1. no two holders are inside one key's section with both guards not lost (readers may share;
//!    a semaphore's holders may be as many as its permits);
//! 2. a guard whose lock another holder took reports it: its `lost()` resolves soon after;
//! 3. once the program is over, every key can be taken at once by a fresh client (no lock is
//!    stranded by a cancelled or raced operation);
//! 4. after the leases have run out, nothing is left: no client state, nothing in the store;
//! 5. no deadlock: a patient set is always granted (sets take their locks in one canonical
//!    order, and no one waits while holding a lock otherwise), and every program finishes.
//!
//! On the in-memory store the clock is tokio's paused clock and every delay comes from the
//! seed, so a seed replays exactly. A failure prints the seed and the program's log:
//!
//! ```text
//! INTERLEAVINGS_SEED=1234 cargo test --all-features --test interleavings -- --nocapture
//! INTERLEAVINGS_SEEDS=5000 cargo test --release --all-features --test interleavings   # soak
//! ```
//!
//! A shorter run goes against a real `redis-server` in real time.

mod support;

use std::{
    collections::HashMap,
    fmt::Write as _,
    future::Future,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    task::Poll,
    time::Duration,
};

use support::{RedisServer, RespValue, rng::Rng};
use tokio::time::Instant;
use tower_lock::{
    Backend, Lease, LockClient, LockError, LockGuard, MemoryBackend, MultiGuard,
    backend::{AcquireReply, Grant, Listener, Release, ReleaseReply, Renew, RenewReply},
    error::BackendErrorKind,
    key::LockKey,
};

/// The in-memory store with a random delay before and after every call, drawn from the seed:
/// calls are in flight long enough to be cancelled or raced. With `faults` on, one call in
/// [`FAULT_ONE_IN`] fails.
#[derive(Clone)]
struct Delayed {
    inner: MemoryBackend,
    rng: Arc<Mutex<Rng>>,
    faults: Arc<AtomicBool>,
}

/// How rare a failed call is, in a program with faults.
const FAULT_ONE_IN: u64 = 40;

/// How a call fails.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Refused before it runs: no connection could be had.
    Refused,
    /// Run, and its reply lost: a timeout.
    ReplyLost,
    /// Not run, and answered with a timeout: its outcome unknown to the caller.
    Unrun,
}

/// Every fault.
const ANY_FAULT: &[Fault] = &[Fault::Refused, Fault::ReplyLost, Fault::Unrun];
/// The faults of leaving a queue: only a lost reply, since a queue place that could not be
/// left stays until the waiter timeout (5 s), by design, and the check would report it.
const LEAVE_FAULTS: &[Fault] = &[Fault::ReplyLost];

impl Delayed {
    fn delay(&self) -> Duration {
        let mut rng = self.rng.lock().unwrap_or_else(PoisonError::into_inner);
        match rng.below(4) {
            0 | 1 => Duration::ZERO,
            2 => Duration::from_micros(500),
            _ => rng.millis(0, 3),
        }
    }

    async fn pass<T>(&self, op: impl Future<Output = T>) -> T {
        let (before, after) = (self.delay(), self.delay());
        tokio::time::sleep(before).await;
        let result = op.await;
        tokio::time::sleep(after).await;
        result
    }

    /// The fault the next call gets, if any: one of `faults`.
    fn fault(&self, faults: &[Fault]) -> Option<Fault> {
        if !self.faults.load(Ordering::Relaxed) {
            return None;
        }
        let mut rng = self.rng.lock().unwrap_or_else(PoisonError::into_inner);
        (rng.below(FAULT_ONE_IN) == 0).then(|| rng.pick(faults))
    }

    /// [`pass`](Self::pass), failing the call as [`fault`](Self::fault) draws.
    async fn faulty<T>(
        &self,
        faults: &[Fault],
        op: impl Future<Output = BackendResult<T>>,
    ) -> BackendResult<T> {
        let kind = match self.fault(faults) {
            None => return self.pass(op).await,
            Some(Fault::Refused) => BackendErrorKind::Unavailable,
            Some(Fault::ReplyLost) => {
                let _ = self.pass(op).await;
                BackendErrorKind::Timeout
            }
            Some(Fault::Unrun) => {
                self.pass(async {}).await;
                BackendErrorKind::Timeout
            }
        };
        Err(tower_lock::BackendError::from_kind(kind))
    }
}

type BackendResult<T> = Result<T, tower_lock::BackendError>;

impl Backend for Delayed {
    type Listener = Listener;

    async fn acquire(&self, grant: Grant<'_>) -> BackendResult<AcquireReply> {
        self.faulty(ANY_FAULT, self.inner.acquire(grant)).await
    }

    async fn release(&self, release: Release<'_>) -> BackendResult<ReleaseReply> {
        self.faulty(ANY_FAULT, self.inner.release(release)).await
    }

    async fn renew(&self, renewals: &[Renew<'_>]) -> BackendResult<Vec<RenewReply>> {
        self.faulty(ANY_FAULT, self.inner.renew(renewals)).await
    }

    async fn abandon(&self, grant: Grant<'_>) -> BackendResult<bool> {
        self.faulty(ANY_FAULT, self.inner.abandon(grant)).await
    }

    async fn leave(
        &self,
        key: &LockKey,
        holder: &str,
        kind: tower_lock::LockKind,
    ) -> BackendResult<()> {
        self.faulty(LEAVE_FAULTS, self.inner.leave(key, holder, kind))
            .await
    }

    async fn listen(&self, key: &LockKey, only_for: Option<&str>) -> BackendResult<Listener> {
        self.faulty(&[Fault::Refused], self.inner.listen(key, only_for))
            .await
    }

    async fn inspect(
        &self,
        key: &LockKey,
        kind: tower_lock::LockKind,
    ) -> BackendResult<tower_lock::LockInfo> {
        self.pass(self.inner.inspect(key, kind)).await
    }

    async fn force_unlock(
        &self,
        key: &LockKey,
        kind: tower_lock::LockKind,
    ) -> BackendResult<tower_lock::LockInfo> {
        self.pass(self.inner.force_unlock(key, kind)).await
    }
}

/// Which lock a key of the program is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Exclusive,
    Fair,
    Read,
    Write,
    /// A permit of a semaphore of [`PERMITS`].
    Semaphore,
}

/// The permits of the program's semaphore.
const PERMITS: usize = 2;

impl Kind {
    /// Whether holders of these two sides may be inside at once.
    fn shares_with(self, other: Self) -> bool {
        self == Self::Read && other == Self::Read
    }
}

/// The program's keys: plain locks, one fair lock, one read-write lock, one semaphore.
const KEYS: [(&str, Option<Kind>); 5] = [
    ("a", Some(Kind::Exclusive)),
    ("b", Some(Kind::Exclusive)),
    ("f", Some(Kind::Fair)),
    ("rw", None),
    ("s", Some(Kind::Semaphore)),
];

/// The keys sets are made of: plain locks (two shared with single acquires) and fair locks.
const SET_KEYS: [&str; 4] = ["a", "b", "c", "d"];
const FAIR_SET_KEYS: [&str; 3] = ["f", "g", "h"];

/// Who is inside which section: the checker's own record, built from the program's events.
struct Inside<B: Backend> {
    task: usize,
    section: u64,
    kind: Kind,
    guard: Holding<B>,
}

/// What a task inside a section holds the key with: a guard of its own, or one of a set's.
enum Holding<B: Backend> {
    One(Arc<LockGuard<B>>),
    Member(Arc<MultiGuard<B>>, &'static str),
}

impl<B: Backend> Holding<B> {
    fn guard(&self) -> &LockGuard<B> {
        match self {
            Self::One(guard) => guard,
            Self::Member(set, key) => set.guard(key).expect("a member of the set"),
        }
    }

    fn is(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::One(a), Self::One(b)) => Arc::ptr_eq(a, b),
            (Self::Member(a, _), Self::Member(b, _)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

/// The independent checker, and the program's log.
struct Checker<B: Backend> {
    inside: Mutex<HashMap<&'static str, Vec<Inside<B>>>>,
    violations: Mutex<Vec<String>>,
    log: Mutex<String>,
    sections: Mutex<u64>,
    /// How long a lost guard's `lost()` may take to resolve once another holder is inside.
    slack: Duration,
    started: Instant,
}

impl<B: Backend> Checker<B> {
    fn new(slack: Duration) -> Arc<Self> {
        Arc::new(Self {
            inside: Mutex::new(HashMap::new()),
            violations: Mutex::new(Vec::new()),
            log: Mutex::new(String::new()),
            sections: Mutex::new(0),
            slack,
            started: Instant::now(),
        })
    }

    fn note(&self, task: usize, what: impl std::fmt::Display) {
        let at = self.started.elapsed();
        let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = writeln!(log, "{:>9.3} ms  t{task}  {what}", at.as_secs_f64() * 1e3);
    }

    fn violation(&self, what: String) {
        self.note(usize::MAX, format!("VIOLATION: {what}"));
        self.violations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(what);
    }

    /// Checks `guard` against everyone inside `key` by another task.
    fn check_against_others(
        &self,
        key: &'static str,
        task: usize,
        kind: Kind,
        guard: &LockGuard<B>,
    ) {
        let inside = self.inside.lock().unwrap_or_else(PoisonError::into_inner);
        if kind == Kind::Semaphore {
            let others = holding_tasks(inside.get(key).into_iter().flatten(), task);
            if !guard.is_lost() && others.len() >= PERMITS {
                self.violation(format!(
                    "key {key}: t{task} and {others:?} hold a permit, neither lost, over {PERMITS} permits"
                ));
            }
            return;
        }
        for other in inside.get(key).into_iter().flatten() {
            if other.task == task || kind.shares_with(other.kind) {
                continue;
            }
            if !other.guard.guard().is_lost() && !guard.is_lost() {
                self.violation(format!(
                    "key {key}: t{task} ({kind:?}) and t{} ({:?}, section {}) both hold it, neither lost",
                    other.task, other.kind, other.section
                ));
            }
        }
    }

    /// `task` enters the section of `key` holding `guard`.
    fn enter(
        self: &Arc<Self>,
        key: &'static str,
        task: usize,
        kind: Kind,
        guard: LockGuard<B>,
    ) -> Arc<LockGuard<B>> {
        let guard = Arc::new(guard);
        self.enter_holding(key, task, kind, Holding::One(guard.clone()));
        guard
    }

    /// `task` enters the sections of every key of `set` at once.
    fn enter_set(
        self: &Arc<Self>,
        keys: &[&'static str],
        task: usize,
        kind: Kind,
        set: MultiGuard<B>,
    ) -> Arc<MultiGuard<B>> {
        let set = Arc::new(set);
        for key in keys {
            self.enter_holding(key, task, kind, Holding::Member(set.clone(), key));
        }
        set
    }

    fn enter_holding(
        self: &Arc<Self>,
        key: &'static str,
        task: usize,
        kind: Kind,
        holding: Holding<B>,
    ) {
        let guard = holding.guard();
        self.check_against_others(key, task, kind, guard);
        let section = {
            let mut sections = self.sections.lock().unwrap_or_else(PoisonError::into_inner);
            *sections += 1;
            *sections
        };
        let mut inside = self.inside.lock().unwrap_or_else(PoisonError::into_inner);
        let entries = inside.entry(key).or_default();
        if kind == Kind::Semaphore {
            self.expect_displaced_permits(key, task, guard, entries);
        }
        // Everyone this entry displaced (inside, but past their deadline) must learn of it
        // soon. An entry whose own guard is already lost displaced nobody.
        for other in entries.iter() {
            if other.task == task
                || kind.shares_with(other.kind)
                || kind == Kind::Semaphore
                || guard.is_lost()
            {
                continue;
            }
            let lost = other.guard.guard().lost();
            let (checker, slack, other_task) = (self.clone(), self.slack, other.task);
            tokio::spawn(async move {
                if tokio::time::timeout(slack, lost).await.is_err() {
                    checker.violation(format!(
                        "key {key}: t{other_task}'s guard was not reported lost within {slack:?} \
                         after t{task} took the lock"
                    ));
                }
            });
        }
        let count = guard.hold_count();
        entries.push(Inside {
            task,
            section,
            kind,
            guard: holding,
        });
        drop(inside);
        self.note(
            task,
            format_args!("enter {key} {kind:?} section {section} count {count}"),
        );
    }

    /// `task` takes a permit while `entries` (other tasks' permits) may already use them all:
    /// enough of those must have been displaced (past their deadline) and learn of it soon.
    fn expect_displaced_permits(
        self: &Arc<Self>,
        key: &'static str,
        task: usize,
        guard: &LockGuard<B>,
        entries: &[Inside<B>],
    ) {
        let mut holders = HashMap::new();
        for other in entries.iter().filter(|other| other.task != task) {
            holders
                .entry(other.task)
                .or_insert_with(|| other.guard.guard().lost());
        }
        if guard.is_lost() || holders.len() < PERMITS {
            return;
        }
        // One more permit than there are: that many holders must hear they lost theirs.
        let displaced = holders.len() + 1 - PERMITS;
        let (checker, slack) = (self.clone(), self.slack);
        tokio::spawn(async move {
            let tasks: Vec<usize> = holders.keys().copied().collect();
            let mut lost: futures_util::stream::FuturesUnordered<_> =
                holders.into_values().collect();
            let heard = async {
                for _ in 0..displaced {
                    futures_util::StreamExt::next(&mut lost).await;
                }
            };
            if tokio::time::timeout(slack, heard).await.is_err() {
                checker.violation(format!(
                    "key {key}: t{task} took a permit while {tasks:?} held all {PERMITS}, and \
                     {displaced} of them were not reported lost within {slack:?}"
                ));
            }
        });
    }

    /// `task` leaves the section of `key`; gives the guard back to be released or dropped.
    fn leave(
        &self,
        key: &'static str,
        task: usize,
        kind: Kind,
        guard: Arc<LockGuard<B>>,
    ) -> LockGuard<B> {
        self.check_against_others(key, task, kind, &guard);
        let holding = Holding::One(guard);
        self.remove(key, &holding);
        let Holding::One(guard) = holding else {
            unreachable!()
        };
        self.note(task, format_args!("leave {key} lost={}", guard.is_lost()));
        Arc::try_unwrap(guard).unwrap_or_else(|_| panic!("the checker keeps no other reference"))
    }

    /// `task` leaves the sections of every key of `set`; gives the set back.
    fn leave_set(
        &self,
        keys: &[&'static str],
        task: usize,
        kind: Kind,
        set: Arc<MultiGuard<B>>,
    ) -> MultiGuard<B> {
        for key in keys {
            let holding = Holding::Member(set.clone(), key);
            self.check_against_others(key, task, kind, holding.guard());
            self.remove(key, &holding);
        }
        self.note(
            task,
            format_args!("leave set {keys:?} lost={}", set.is_lost()),
        );
        Arc::try_unwrap(set).unwrap_or_else(|_| panic!("the checker keeps no other reference"))
    }

    fn remove(&self, key: &'static str, holding: &Holding<B>) {
        let mut inside = self.inside.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(entries) = inside.get_mut(key) {
            entries.retain(|entry| !entry.guard.is(holding));
        }
    }

    fn violations(&self) -> Vec<String> {
        self.violations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn log(&self) -> String {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// The tasks other than `task` inside with a guard not lost.
fn holding_tasks<'a, B: Backend>(
    entries: impl Iterator<Item = &'a Inside<B>>,
    task: usize,
) -> Vec<usize> {
    let mut tasks: Vec<usize> = entries
        .filter(|entry| entry.task != task && !entry.guard.guard().is_lost())
        .map(|entry| entry.task)
        .collect();
    tasks.sort_unstable();
    tasks.dedup();
    tasks
}

/// Time scale of a program: the in-memory run uses short leases on the paused clock; the Redis
/// run uses real time, with leases long enough for loopback round trips.
#[derive(Clone, Copy)]
struct Scale {
    unit: Duration,
}

impl Scale {
    fn ms(self, n: u32) -> Duration {
        self.unit * n
    }
}

/// What a task may be asked to do next, with its request settings drawn from the seed.
struct Ask {
    key: &'static str,
    kind: Kind,
    wait: Duration,
    lease: Lease,
    /// Drop the acquire after this many polls, or after this long.
    cancel: Option<Cancel>,
}

#[derive(Clone, Copy, Debug)]
enum Cancel {
    AfterPolls(u32),
    After(Duration),
}

fn ask(rng: &mut Rng, scale: Scale) -> Ask {
    let (key, kind) = rng.pick(&KEYS);
    let kind = kind.unwrap_or_else(|| {
        if rng.chance(0.7) {
            Kind::Read
        } else {
            Kind::Write
        }
    });
    let wait = rng.pick(&[Duration::ZERO, scale.ms(5), scale.ms(50), scale.ms(300)]);
    let lease = lease(rng, scale);
    let cancel = match rng.below(10) {
        0 => Some(Cancel::AfterPolls(1 + rng.below(4) as u32)),
        1 => Some(Cancel::After(
            rng.millis(0, 20).max(Duration::from_micros(300))
                * scale.unit.as_millis().max(1) as u32,
        )),
        _ => None,
    };
    Ask {
        key,
        kind,
        wait,
        lease,
        cancel,
    }
}

fn lease(rng: &mut Rng, scale: Scale) -> Lease {
    match rng.below(4) {
        0 => Lease::fixed(scale.ms(30)),
        1 => Lease::fixed(scale.ms(200)),
        2 => Lease::watchdog(scale.ms(45)),
        _ => Lease::watchdog(scale.ms(300)),
    }
}

/// The longest lease a program uses.
fn longest_lease(scale: Scale) -> Duration {
    scale.ms(300)
}

/// Runs `acquire`, dropping it as `cancel` says. `None`: it was dropped before it finished.
async fn acquire_unless_cancelled<F: Future>(
    acquire: F,
    cancel: Option<Cancel>,
) -> Option<F::Output> {
    match cancel {
        None => Some(acquire.await),
        Some(Cancel::After(after)) => tokio::time::timeout(after, acquire).await.ok(),
        Some(Cancel::AfterPolls(polls)) => {
            let mut acquire = std::pin::pin!(acquire);
            let mut left = polls;
            std::future::poll_fn(|cx| match acquire.as_mut().poll(cx) {
                Poll::Ready(output) => Poll::Ready(Some(output)),
                Poll::Pending if left <= 1 => Poll::Ready(None),
                Poll::Pending => {
                    left -= 1;
                    Poll::Pending
                }
            })
            .await
        }
    }
}

fn request<'a, B: Backend>(client: &'a LockClient<B>, ask: &Ask) -> tower_lock::LockRequest<'a, B> {
    let request = match ask.kind {
        Kind::Exclusive => client.lock(ask.key),
        Kind::Fair => client.fair_lock(ask.key),
        Kind::Read => client.read_write_lock(ask.key).read(),
        Kind::Write => client.read_write_lock(ask.key).write(),
        Kind::Semaphore => client.semaphore(ask.key, PERMITS as u32),
    };
    request.wait(ask.wait).lease(ask.lease)
}

/// Errors an acquire may end with in these programs (in a program with faults, the store's
/// too; in real time, a timeout); anything else is a defect.
fn expected(error: &LockError, faulty: bool, real_time: bool) -> bool {
    match error {
        LockError::WaitTimeout { .. }
        | LockError::Lost
        | LockError::ShutDown
        | LockError::UpgradeRefused
        | LockError::TooManyWaiters => true,
        // In real time a busy machine may delay a reply past a short lease, or the command
        // timeout: the acquire says so instead of handing out a lock that has run out.
        LockError::Backend(error) => {
            (faulty && error.is_unavailable()) || ((faulty || real_time) && error.is_timeout())
        }
        _ => false,
    }
}

struct Task<B: Backend> {
    id: usize,
    /// The store fails calls now and then.
    faulty: bool,
    /// A real server in real time (not tokio's paused clock).
    real_time: bool,
    client: LockClient<B>,
    checker: Arc<Checker<B>>,
    rng: Rng,
    scale: Scale,
}

impl<B: Backend> Task<B> {
    async fn run(mut self, ops: usize) {
        let holder = self.client.holder();
        holder
            .scope(async move {
                for _ in 0..ops {
                    if self.rng.chance(0.25) {
                        self.set_operation().await;
                    } else {
                        let ask = ask(&mut self.rng, self.scale);
                        self.operation(ask, 0).await;
                    }
                }
            })
            .await;
    }

    /// One acquire and, if it succeeds, one critical section (which may nest more).
    fn operation(
        &mut self,
        ask: Ask,
        depth: u32,
    ) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            let (id, key, kind) = (self.id, ask.key, ask.kind);
            self.checker.note(
                id,
                format_args!(
                    "acquire {key} {kind:?} wait {:?} lease {:?} cancel {:?} depth {depth}",
                    ask.wait, ask.lease, ask.cancel
                ),
            );
            let outcome =
                acquire_unless_cancelled(request(&self.client, &ask).acquire(), ask.cancel).await;
            let guard = match outcome {
                None => {
                    self.checker
                        .note(id, format_args!("acquire of {key} dropped"));
                    return;
                }
                Some(Err(error)) => {
                    self.checker
                        .note(id, format_args!("acquire of {key} failed: {error}"));
                    if !expected(&error, self.faulty, self.real_time) {
                        self.checker.violation(format!(
                            "t{id}: acquire of {key} failed unexpectedly: {error:?}"
                        ));
                    }
                    return;
                }
                Some(Ok(guard)) => guard,
            };
            self.section(key, kind, guard, depth).await;
        })
    }

    /// One acquire of a set of two or three locks and, if it succeeds, one critical section
    /// over all of them (which may re-enter one of them).
    async fn set_operation(&mut self) {
        let id = self.id;
        let (kind, pool): (Kind, &[&'static str]) = if self.rng.chance(0.3) {
            (Kind::Fair, &FAIR_SET_KEYS)
        } else {
            (Kind::Exclusive, &SET_KEYS)
        };
        let size = 2 + self.rng.below(2) as usize;
        let mut asked: Vec<&'static str> = Vec::with_capacity(size + 1);
        while asked.len() < size {
            let key = self.rng.pick(pool);
            if !asked.contains(&key) {
                asked.push(key);
            }
        }
        if self.rng.chance(0.1) {
            asked.push(asked[0]); // named twice: one lock
        }
        // Patient: far longer than any program lasts, so only a deadlock can time it out.
        let patient = self.rng.chance(0.4);
        let wait = if patient {
            self.scale.ms(20_000)
        } else {
            self.rng.pick(&[
                Duration::ZERO,
                self.scale.ms(5),
                self.scale.ms(50),
                self.scale.ms(300),
            ])
        };
        let lease = lease(&mut self.rng, self.scale);
        let cancel = match self.rng.below(10) {
            0 => Some(Cancel::AfterPolls(1 + self.rng.below(6) as u32)),
            1 => Some(Cancel::After(self.scale.ms(1 + self.rng.below(20) as u32))),
            _ => None,
        };
        self.checker.note(
            id,
            format_args!(
                "acquire set {asked:?} {kind:?} wait {wait:?} lease {lease:?} cancel {cancel:?}"
            ),
        );
        let request = self.client.lock_all(&asked).wait(wait).lease(lease);
        let request = if kind == Kind::Fair {
            request.fair()
        } else {
            request
        };
        let set = match acquire_unless_cancelled(request.acquire(), cancel).await {
            None => {
                self.checker
                    .note(id, format_args!("acquire of set {asked:?} dropped"));
                return;
            }
            Some(Err(error)) => {
                self.checker
                    .note(id, format_args!("acquire of set {asked:?} failed: {error}"));
                if patient && matches!(error.error(), LockError::WaitTimeout { .. }) {
                    self.checker.violation(format!(
                        "t{id}: deadlock? the patient set {asked:?} timed out at {:?}",
                        error.key()
                    ));
                } else if !expected(error.error(), self.faulty, self.real_time) {
                    self.checker.violation(format!(
                        "t{id}: acquire of set {asked:?} failed unexpectedly: {error:?}"
                    ));
                }
                return;
            }
            Some(Ok(set)) => set,
        };
        let mut keys = asked.clone();
        keys.sort_unstable();
        keys.dedup();
        if set.guards().len() != keys.len() {
            self.checker.violation(format!(
                "t{id}: the set {asked:?} holds {} locks",
                set.guards().len()
            ));
        }
        let set = self.checker.enter_set(&keys, id, kind, set);
        tokio::time::sleep(self.scale.ms(self.rng.pick(&[0, 1, 5, 20, 60]))).await;
        if self.rng.chance(0.25) {
            // Re-enter one lock of the set on its own.
            let nested = Ask {
                key: self.rng.pick(&keys),
                kind,
                wait: self.scale.ms(5),
                lease: Lease::fixed(self.scale.ms(10)),
                cancel: None,
            };
            self.operation(nested, 1).await;
        }
        let set = self.checker.leave_set(&keys, id, kind, set);
        if self.rng.chance(0.6) {
            let released = set.release().await;
            self.checker
                .note(id, format_args!("released set {keys:?}: {released:?}"));
        } else {
            drop(set);
            self.checker.note(id, format_args!("dropped set {keys:?}"));
        }
    }

    async fn section(&mut self, key: &'static str, kind: Kind, guard: LockGuard<B>, depth: u32) {
        let id = self.id;
        let mut guard = self.checker.enter(key, id, kind, guard);
        // Long enough, at times, for renewals to fall due and fixed leases to run out.
        let hold = self.rng.pick(&[0, 1, 5, 20, 60]);
        tokio::time::sleep(self.scale.ms(hold)).await;
        if depth < 2 && self.rng.chance(0.3) {
            // Re-enter, often with a shorter fixed lease than the hold it nests in.
            let lease = if self.rng.chance(0.6) {
                Lease::fixed(self.scale.ms(10))
            } else {
                lease(&mut self.rng, self.scale)
            };
            let nested = Ask {
                key,
                kind,
                wait: self.scale.ms(5),
                lease,
                cancel: if self.rng.chance(0.15) {
                    Some(Cancel::AfterPolls(1))
                } else {
                    None
                },
            };
            self.operation(nested, depth + 1).await;
            tokio::time::sleep(self.scale.ms(self.rng.pick(&[0, 5, 20]))).await;
        }
        if depth == 0 && self.rng.chance(0.15) {
            // A re-entry racing the release of the guard it would nest in.
            let held = self.checker.leave(key, id, kind, guard);
            let ask = Ask {
                key,
                kind,
                wait: self.scale.ms(5),
                lease: lease(&mut self.rng, self.scale),
                cancel: None,
            };
            self.checker
                .note(id, format_args!("re-enter {key} joined with the release"));
            let (again, released) =
                tokio::join!(request(&self.client, &ask).acquire(), held.release());
            self.checker.note(
                id,
                format_args!(
                    "joined: acquire {:?}, release {:?}",
                    again.as_ref().map(|g| g.hold_count()),
                    released
                ),
            );
            match again {
                Ok(again) => guard = self.checker.enter(key, id, kind, again),
                Err(error) => {
                    if !expected(&error, self.faulty, self.real_time) {
                        self.checker
                            .violation(format!("t{id}: joined acquire of {key} failed: {error:?}"));
                    }
                    return;
                }
            }
            tokio::time::sleep(self.scale.ms(self.rng.pick(&[0, 5, 50]))).await;
        }
        let guard = self.checker.leave(key, id, kind, guard);
        if self.rng.chance(0.6) {
            let released = guard.release().await;
            self.checker
                .note(id, format_args!("released {key}: {released:?}"));
        } else {
            drop(guard);
            self.checker.note(id, format_args!("dropped {key}"));
        }
    }
}

/// What the Redis store still holds: keys and release channels. A lock that names a client
/// lease key that is gone holds nothing (its key lives on for a while, and the next acquire
/// takes it): it is not counted. With the client lease, attempts given up on are remembered
/// as long as a lock's key lives there (20 leases), so a set of them that will still expire is
/// not counted either.
fn redis_leftovers(server: &RedisServer, client_lease: bool) -> Vec<String> {
    let mut left = Vec::new();
    if let RespValue::Array(Some(keys)) = server.cmd(&["KEYS", "*"]) {
        let held = |key: &String| match lease_of(server, key) {
            Some(lease) => server.cmd(&["EXISTS", &lease]).as_int() == 1,
            None => {
                !(client_lease && key.ends_with(":void") && server.cmd(&["PTTL", key]).as_int() > 0)
            }
        };
        left.extend(keys.iter().filter_map(RespValue::as_str).filter(held));
    }
    if let RespValue::Array(Some(channels)) = server.cmd(&["PUBSUB", "CHANNELS"]) {
        let channels = channels.iter().filter_map(RespValue::as_str);
        left.extend(channels.map(|channel| format!("channel {channel}")));
    }
    left
}

/// The client lease key a lock at `key` names, if any: after the newline of a single hold, or
/// in the field `~s` of a hash.
fn lease_of(server: &RedisServer, key: &str) -> Option<String> {
    match server.cmd(&["TYPE", key]).as_str()?.as_str() {
        "string" => {
            let value = server.cmd(&["GET", key]).as_str()?;
            value.split_once('\n').map(|(_, lease)| lease.to_owned())
        }
        "hash" => server.cmd(&["HGET", key, "~s"]).as_str(),
        _ => None,
    }
}

/// One seed's program against `store`; `leftovers` says what the store still holds at the end.
/// Returns the violations and the log.
/// Runs the program of `seed` on `store`. With `faults`, the store fails calls while it is
/// set; it is cleared once the program's tasks are over.
async fn program<S: Backend + Clone>(
    seed: u64,
    store: S,
    faults: Option<&AtomicBool>,
    leftovers: impl Fn() -> Vec<String>,
    scale: Scale,
    ops: usize,
) -> (Vec<String>, String) {
    let faulty = faults.is_some_and(|faults| faults.load(Ordering::Relaxed));
    let mut rng = Rng(seed);
    let clients: Vec<LockClient<S>> = (0..3)
        .map(|_| LockClient::builder(store.clone()).build().expect("valid"))
        .collect();
    let checker = Checker::new(scale.ms(40));
    let mut tasks = tokio::task::JoinSet::new();
    for id in 0..6 {
        let task = Task {
            id,
            faulty,
            // Only the in-memory runs inject faults, on the paused clock.
            real_time: faults.is_none(),
            client: clients[id / 2].clone(),
            checker: checker.clone(),
            rng: Rng(rng.next()),
            scale,
        };
        tasks.spawn(task.run(ops));
    }
    // Now and then a client shuts down in the middle of it all.
    if rng.chance(0.2) {
        let victim = clients[rng.below(3) as usize].clone();
        let at = scale.ms(rng.below(200) as u32);
        let checker = checker.clone();
        tasks.spawn(async move {
            tokio::time::sleep(at).await;
            checker.note(99, "shutting a client down");
            victim.shutdown().await;
        });
    }
    while let Some(joined) = tasks.join_next().await {
        if let Err(error) = joined {
            checker.violation(format!("a task panicked: {error}"));
        }
    }
    // Background releases finish; then no key may still be taken. After faults, undos and
    // releases retried in the background may take up to a lease (and then give up: the lease
    // has freed the lock).
    if let Some(faults) = faults {
        faults.store(false, Ordering::Relaxed);
    }
    let settle = match faulty {
        true => longest_lease(scale),
        false => Duration::ZERO,
    };
    tokio::time::sleep(scale.ms(20) + settle).await;
    let fresh = LockClient::builder(store.clone()).build().expect("valid");
    let set_keys = SET_KEYS.iter().map(|key| (*key, Some(Kind::Exclusive)));
    let fair_set_keys = FAIR_SET_KEYS.iter().map(|key| (*key, Some(Kind::Fair)));
    for (key, kind) in KEYS.into_iter().chain(set_keys).chain(fair_set_keys) {
        let request = match kind {
            Some(Kind::Exclusive) => fresh.lock(key),
            Some(Kind::Fair) => fresh.fair_lock(key),
            // Every permit at once: nobody holds one.
            Some(Kind::Semaphore) => fresh.semaphore(key, 1),
            _ => fresh.read_write_lock(key).write(),
        };
        match request.wait(scale.ms(10)).acquire().await {
            Ok(guard) => {
                let _ = guard.release().await;
            }
            Err(error) => checker.violation(format!(
                "key {key} is still taken after the program: {error:?}"
            )),
        }
    }
    // Once every lease has run out, nothing is left anywhere.
    tokio::time::sleep(longest_lease(scale) + scale.ms(50)).await;
    for (i, client) in clients.iter().chain([&fresh]).enumerate() {
        let state = (client.active_keys(), client.waiters(), client.queued());
        if state != (0, 0, 0) {
            checker.violation(format!(
                "client {i} still tracks (keys, waiters, queued) = {state:?}"
            ));
        }
    }
    for client in clients.iter().chain([&fresh]) {
        client.shutdown().await;
    }
    let left = leftovers();
    if !left.is_empty() {
        checker.violation(format!("the store still holds {left:?}"));
    }
    (checker.violations(), checker.log())
}

/// Runs the in-memory program of `seed` on a paused clock.
fn memory_seed(seed: u64, ops: usize) -> (Vec<String>, String) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let mut rng = Rng(seed ^ 0x5EED);
        let faults = Arc::new(AtomicBool::new(rng.chance(0.5)));
        let store = Delayed {
            inner: MemoryBackend::new(),
            rng: Arc::new(Mutex::new(rng)),
            faults: faults.clone(),
        };
        let memory = store.inner.clone();
        let leftovers = move || match memory.held_count() {
            0 => Vec::new(),
            held => vec![format!("{held} locks held")],
        };
        let scale = Scale {
            unit: Duration::from_millis(1),
        };
        // Every program finishes: far longer than any takes, on the paused clock.
        let finished = tokio::time::timeout(
            Duration::from_secs(600),
            program(seed, store, Some(&faults), leftovers, scale, ops),
        );
        finished.await.unwrap_or_else(|_| {
            let violation = "the program did not finish within 600 s: a deadlock".to_owned();
            (vec![violation], String::new())
        })
    })
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|value| {
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, not {value:?}"))
    })
}

fn report(seed: u64, violations: &[String], log: &str) -> String {
    format!(
        "seed {seed}: {} violation(s):\n  {}\nprogram log:\n{log}\nreplay: INTERLEAVINGS_SEED={seed} cargo test --all-features --test interleavings -- --nocapture",
        violations.len(),
        violations.join("\n  ")
    )
}

/// Many seeds on the in-memory store (each replays exactly). `INTERLEAVINGS_SEEDS` sets how
/// many, `INTERLEAVINGS_SEED` runs one and prints its log.
#[test]
fn random_programs_in_memory() {
    const OPS: usize = 12;
    if let Some(seed) = env_u64("INTERLEAVINGS_SEED") {
        let (violations, log) = memory_seed(seed, OPS);
        println!("{log}");
        assert!(violations.is_empty(), "{}", report(seed, &violations, ""));
        return;
    }
    let seeds = env_u64("INTERLEAVINGS_SEEDS").unwrap_or(400);
    let first = env_u64("INTERLEAVINGS_FIRST_SEED").unwrap_or(1);
    let started = std::time::Instant::now();
    let mut failed = Vec::new();
    for seed in first..first + seeds {
        let (violations, log) = memory_seed(seed, OPS);
        if !violations.is_empty() {
            if failed.is_empty() {
                eprintln!("{}", report(seed, &violations, &log));
            }
            failed.push(seed);
        }
    }
    println!(
        "interleavings: {seeds} seeds x 6 tasks x {OPS} operations in {:.1} s, {} failing",
        started.elapsed().as_secs_f64(),
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "failing seeds: {failed:?} (the first one's log is above)"
    );
}

/// A few seeds against a real `redis-server`, in real time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_programs_on_redis() {
    programs_on_redis(false).await;
}

/// The same seeds with the client lease: the clients' exclusive watchdog holds live on the
/// lease key of their (shared) backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_programs_on_redis_with_the_client_lease() {
    programs_on_redis(true).await;
}

async fn programs_on_redis(client_lease: bool) {
    let seeds = env_u64("INTERLEAVINGS_REDIS_SEEDS").unwrap_or(3);
    for seed in 1..=seeds {
        let server = RedisServer::start();
        let backend = support::redis_backend(server.url())
            .client_lease(client_lease)
            .connect()
            .await
            .expect("connect");
        let leftovers = || redis_leftovers(&server, client_lease);
        let scale = Scale {
            unit: Duration::from_millis(3),
        };
        let (violations, log) = program(seed, backend, None, leftovers, scale, 8).await;
        assert!(
            violations.is_empty(),
            "Redis (client lease: {client_lease}) {}",
            report(seed, &violations, &log)
        );
    }
}
