//! Random client-level programs against the lock engine, under many seeds, on a store that
//! loses replies, delays, stalls and delivers late, with an independent checker.
//!
//! Each seed builds a program: three clients on one store, two holders (tasks) per client,
//! each running a random sequence of operations on a few keys (two plain locks, a fair lock, a
//! read-write lock, a semaphore of two permits): acquires with random waits and leases,
//! re-entries, often with a fixed lease shorter than the hold they nest in (each hold keeps
//! its own lease), releases and dropped guards, acquires dropped at a random poll or after a
//! random time, a re-entry joined with the release of the guard it nests in, critical
//! sections long enough for renewals to fall due and fixed leases to run out, and sets of two
//! or three locks taken together (`lock_all`, plain or fair, some of them patient: a wait far
//! longer than any program). In some programs a client is shut down in the middle of it all,
//! beside a holder of another client that holds a lock (re-entered with a short lease of its
//! own) across the shutdown, and which first checks that the shut-down client refuses its
//! holder.
//!
//! The store is the in-memory one behind a wrapper ([`Faulty`]) that delays every call by a
//! random few milliseconds and, in most programs, now and then fails a write: refused before it
//! runs (no connection), run with its reply lost (a timeout), not run (a timeout), or held back
//! and run later, after the caller has given up on it and sent its undo or its repeat (a late
//! delivery; an acquire or an extend delivered after its send time plus its lease does nothing,
//! as the Redis backend's "not after" makes it). Every write can fail so: an acquire, an extend,
//! a release, a hand-off, an undo, a renewal, leaving a queue. And the store stalls now and
//! then: calls that arrive meanwhile wait until the stall is over.
//!
//! The checker never looks inside the engine. It records who is inside which critical section
//! with which guard, reads the store underneath the wrapper, and asserts:
//! 1. **Exclusion**: no two holders are inside one key's section with both guards not lost
//!    (readers may share; a semaphore's holders may be as many as its permits);
//! 2. **No guard believes it holds after the store let its grant go**: every guard not lost has
//!    its grant in the store (its holder, on its side), checked at every entry and exit and
//!    every 2 ms; and a hold whose own fixed lease ended says it is lost;
//! 3. **A displaced guard hears of it**: a guard whose lock another holder took reports it
//!    (`lost()` resolves) soon after;
//! 4. **No stranding**: while a waiter waits for a key, the store never leaves it free for that
//!    waiter (no holder in its way, no live waiter ahead) for longer than a bound (a stall, a
//!    retry pause and a dead queue place's timeout); the store keeps no grant that no guard
//!    (nor an acquire on its way) accounts for beyond a few milliseconds, or, a while after a
//!    fault of a write naming it, until the engine's next try; once the program is over, every
//!    key can be taken at once by a fresh client; after the leases have run out nothing is left:
//!    no client state, nothing in the store;
//! 5. **No deadlock**: a patient set is always granted, and every program finishes;
//! 6. a client's shutdown leaves another client's locks held (in a program without faults,
//!    its guard is not lost and its release succeeds), and a request on one client naming
//!    another client's holder is refused;
//! 7. an acquire delivered after the store applied its undo takes nothing.
//!
//! The clock is tokio's paused clock and every delay and fault comes from the seed, so a seed
//! replays exactly (300 seeds by default, a few seconds; the log of a failure ends with what the
//! wrapper did with each faulted write). It needs the features `test-util` and
//! `unstable-backend` (the store trait). A failure prints the seed and the program's log:
//!
//! ```text
//! INTERLEAVINGS_SEED=1234 cargo test --all-features --test interleavings -- --nocapture
//! INTERLEAVINGS_SEEDS=5000 cargo test --release --all-features --test interleavings   # soak
//! ```
//!
//! A shorter run goes against a real `redis-server` in real time, without the wrapper.

mod support;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fmt::Write as _,
    future::Future,
    pin::Pin,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    task::Poll,
    time::Duration,
};

use futures_util::FutureExt as _;
use support::{RedisServer, RespValue, forward_to_inner, rng::Rng};
use tokio::time::Instant;
use tower_lock::{
    Backend, BackendError, Lease, LockClient, LockError, LockGuard, LockInfo, LockKey, LockKind,
    MemoryBackend, MultiGuard,
    backend::store::{
        AcquireReply, Extend, ExtendReply, Grant, OwnedGrant, Release, ReleaseReply, Renew,
        RenewReply, Store,
    },
    error::BackendErrorKind,
};

type BackendResult<T> = Result<T, BackendError>;

/// How rare a failed write is, in a program with faults.
const FAULT_ONE_IN: u64 = 25;

/// How a write fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// Refused before it runs: no connection could be had.
    Refused,
    /// Run, and its reply lost: a timeout.
    ReplyLost,
    /// Not run, and answered with a timeout.
    Unrun,
    /// Answered with a timeout at once, and run this much later: a late delivery, after its
    /// caller sent its undo or its repeat.
    Late(Duration),
}

/// The faults, stalls and delays of one program, drawn from its seed.
struct Faults {
    /// The program's seed: each call's delays and fault come from it and the call alone.
    seed: u64,
    /// How many calls of each kind, lock and holder came before (see [`Faulty::draws`]).
    calls: Mutex<HashMap<String, u64>>,
    /// Writes fail now and then while set (cleared once the program's tasks are over).
    on: AtomicBool,
    /// The store stalls from each start to each end: calls that arrive meanwhile wait.
    stalls: Vec<(Instant, Instant)>,
    /// How many of each fault each write got, for the report.
    injected: Mutex<BTreeMap<String, u64>>,
    /// The last fault of a write naming a lock (store name) and a holder: a record of that
    /// holder there may be left for a while (until the engine's next try, or its lease).
    faulted: Mutex<HashMap<(String, String), Instant>>,
    /// The attempts whose undo the store applied, by lock (store name) and attempt.
    undone: Mutex<HashSet<(String, String)>>,
    /// What a late delivery did that it must not: an acquire after its undo that took a lock.
    violations: Mutex<Vec<String>>,
    /// What the wrapper did with faulted writes, for the log.
    notes: Mutex<String>,
    started: Instant,
}

impl Faults {
    fn note(&self, what: impl std::fmt::Display) {
        let at = self.started.elapsed().as_secs_f64() * 1e3;
        let _ = writeln!(lock(&self.notes), "{at:>9.3} ms  store  {what}");
    }
}

/// How long after a fault of a write naming it, or a stall, a record nobody holds may stay: the
/// engine's pauses between tries of a release (10 ms, doubling) and of an undo (50 ms,
/// doubling), and a late delivery's delay.
const EXCUSED_FOR: Duration = Duration::from_millis(250);

impl Faults {
    /// Whether a record of `holder` at `key` may be left after a fault or a stall.
    fn excused(&self, key: &str, holder: &str) -> bool {
        let now = Instant::now();
        let stalled = self.stalls.iter().any(|(from, to)| *from <= now && now < *to + EXCUSED_FOR);
        let faulted = self
            .faulted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(key.to_owned(), holder.to_owned()))
            .is_some_and(|at| now < *at + EXCUSED_FOR);
        stalled || faulted
    }
}

/// The in-memory store behind delays, faults and stalls. See the [module docs](self).
#[derive(Clone)]
struct Faulty {
    inner: MemoryBackend,
    faults: Arc<Faults>,
}

/// A write to run later, owning what it needs.
type Later = Pin<Box<dyn Future<Output = ()> + Send>>;

fn delay(rng: &mut Rng) -> Duration {
    match rng.below(4) {
        0 | 1 => Duration::ZERO,
        2 => Duration::from_micros(500),
        _ => rng.millis(0, 3),
    }
}

/// A holder id with its client's random part left out: `<client name>:<n>`. The program names
/// its clients, so this is the same in every run of a seed.
fn stable(holder: &str) -> String {
    let name = holder.split('@').next().unwrap_or(holder);
    let number = holder.rsplit(':').next().unwrap_or(holder);
    format!("{name}:{number}")
}

impl Faulty {
    /// The draws of the next call `op` naming `names` (store key and holder): from the seed,
    /// the call and how many such calls came before, never from the order in which calls of
    /// different locks or holders happen to come (the engine spawns background work in an order
    /// that varies from run to run), so that a seed replays exactly.
    fn draws(&self, op: &'static str, names: &[(String, String)]) -> Rng {
        use std::hash::{Hash, Hasher};
        // A renewal batch lists its grants in the engine's table order: sorted here.
        let mut call: Vec<String> =
            names.iter().map(|(key, holder)| format!("{key} {}", stable(holder))).collect();
        call.sort_unstable();
        let call = call.join(", ");
        let call = format!("{op} [{call}]");
        let nth = {
            let mut calls = lock(&self.faults.calls);
            let nth = calls.entry(call.clone()).or_default();
            *nth += 1;
            *nth
        };
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (self.faults.seed, call, nth).hash(&mut hasher);
        Rng(hasher.finish())
    }

    /// The fault the call `op`, naming `names` (store key and holder), gets, if any.
    fn fault(&self, op: &'static str, names: &[(String, String)], rng: &mut Rng) -> Option<Fault> {
        if !self.faults.on.load(Ordering::Relaxed) || rng.below(FAULT_ONE_IN) != 0 {
            return None;
        }
        let fault = match rng.below(4) {
            0 => Fault::Refused,
            1 => Fault::ReplyLost,
            2 => Fault::Unrun,
            _ => Fault::Late(rng.millis(1, 40)),
        };
        let name = match fault {
            Fault::Late(_) => format!("{op} late"),
            other => format!("{op} {other:?}"),
        };
        let named: Vec<_> = names.iter().map(|(key, holder)| (key, stable(holder))).collect();
        self.faults.note(format_args!("{op} {named:?}: {fault:?}"));
        *self
            .faults
            .injected
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(name)
            .or_default() += 1;
        let until = Instant::now()
            + match fault {
                Fault::Late(after) => after,
                _ => Duration::ZERO,
            };
        let mut faulted = self.faults.faulted.lock().unwrap_or_else(PoisonError::into_inner);
        for name in names {
            let at = faulted.entry(name.clone()).or_insert(until);
            *at = (*at).max(until);
        }
        Some(fault)
    }

    /// Waits out a stall the store is in.
    async fn stalled(&self) {
        let now = Instant::now();
        let until = self
            .faults
            .stalls
            .iter()
            .filter(|(from, to)| *from <= now && now < *to)
            .map(|(_, to)| *to)
            .max();
        if let Some(until) = until {
            tokio::time::sleep_until(until).await;
        }
    }

    /// Runs the write `op` (as `now`, or `later` for a late delivery), with delays, stalls and a
    /// fault now and then.
    async fn write<T>(
        &self,
        (op, names): (&'static str, Vec<(String, String)>),
        now: impl Future<Output = BackendResult<T>>,
        later: impl FnOnce() -> Later,
    ) -> BackendResult<T> {
        let mut rng = self.draws(op, &names);
        self.stalled().await;
        tokio::time::sleep(delay(&mut rng)).await;
        let kind = match self.fault(op, &names, &mut rng) {
            None => {
                let result = now.await;
                tokio::time::sleep(delay(&mut rng)).await;
                return result;
            }
            Some(Fault::Refused) => BackendErrorKind::Unavailable,
            Some(Fault::ReplyLost) => {
                let _ = now.await;
                tokio::time::sleep(delay(&mut rng)).await;
                BackendErrorKind::Timeout
            }
            Some(Fault::Unrun) => {
                tokio::time::sleep(delay(&mut rng)).await;
                BackendErrorKind::Timeout
            }
            Some(Fault::Late(after)) => {
                let write = later();
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    write.await;
                });
                tokio::time::sleep(delay(&mut rng)).await;
                BackendErrorKind::Timeout
            }
        };
        Err(BackendError::from_kind(kind))
    }
}

// A std mutex: a few map updates, never held across an await.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A lock's store name and a holder, as a fault records them.
fn named(key: &LockKey, holder: &str) -> (String, String) {
    (key.as_str().to_owned(), holder.to_owned())
}

/// The holder an attempt (`<holder>#<n>`) is of.
fn holder_of(attempt: &str) -> &str {
    attempt.rsplit_once('#').map_or(attempt, |(holder, _)| holder)
}

/// A renewal with owned fields.
enum OwnedRenew {
    Grant(LockKey, LockKind, String, Lease),
    Place(LockKey, LockKind, String, Duration),
}

impl OwnedRenew {
    fn of(renew: &Renew<'_>) -> Self {
        match *renew {
            Renew::Grant { key, kind, grant, lease } => {
                Self::Grant(key.clone(), kind, grant.to_owned(), lease)
            }
            Renew::Place { key, kind, holder, timeout } => {
                Self::Place(key.clone(), kind, holder.to_owned(), timeout)
            }
        }
    }

    fn renew(&self) -> Renew<'_> {
        match self {
            Self::Grant(key, kind, grant, lease) => {
                Renew::Grant { key, kind: *kind, grant, lease: *lease }
            }
            Self::Place(key, kind, holder, timeout) => {
                Renew::Place { key, kind: *kind, holder, timeout: *timeout }
            }
        }
    }
}

impl Store for Faulty {
    type Listener = <MemoryBackend as Store>::Listener;

    async fn acquire(&self, grant: Grant<'_>) -> BackendResult<AcquireReply> {
        let (inner, owned) = (self.inner.clone(), OwnedGrant::of(&grant));
        let faults = self.faults.clone();
        let not_after = Instant::now() + grant.lease.duration();
        let later = move || -> Later {
            Box::pin(async move {
                // An acquire carries the time it may act until: the Redis backend's "not after"
                // (its send time plus its lease). From then on it does nothing (the memory
                // store's ends are exclusive: its undo's record of it is gone then).
                if Instant::now() >= not_after {
                    faults.note(format_args!(
                        "late acquire of {} arrived too late",
                        owned.grant().attempt
                    ));
                    return;
                }
                let id = (owned.grant().key.as_str().to_owned(), owned.grant().attempt.to_owned());
                let undone = lock(&faults.undone).contains(&id);
                let reply = inner.acquire(owned.grant()).await;
                faults.note(format_args!("late acquire of {} delivered: {reply:?}", id.1));
                if undone && matches!(reply, Ok(AcquireReply::Acquired { .. })) {
                    lock(&faults.violations).push(format!(
                        "{}: the acquire of {}, delivered after its undo, took the lock",
                        id.0, id.1
                    ));
                }
            })
        };
        let names = vec![named(grant.key, grant.holder)];
        self.write(("acquire", names), self.inner.acquire(grant), later).await
    }

    async fn extend(&self, extend: Extend<'_>) -> BackendResult<ExtendReply> {
        let inner = self.inner.clone();
        let (key, kind, grant) = (extend.key.clone(), extend.kind, extend.grant.to_owned());
        let (lease, fencing) = (extend.lease, extend.fencing);
        let not_after = Instant::now() + lease.duration();
        let later = move || -> Later {
            Box::pin(async move {
                // An extend, as an acquire, does nothing from its "not after" on.
                if Instant::now() >= not_after {
                    return;
                }
                let extend = Extend { key: &key, kind, grant: &grant, lease, fencing };
                let _ = inner.extend(extend).await;
            })
        };
        let names = vec![named(extend.key, holder_of(extend.grant))];
        self.write(("extend", names), self.inner.extend(extend), later).await
    }

    async fn release(&self, release: Release<'_>) -> BackendResult<ReleaseReply> {
        let inner = self.inner.clone();
        let (key, kind, grant) = (release.key.clone(), release.kind, release.grant.to_owned());
        let token = release.token;
        let handoff = release.handoff.as_ref().map(OwnedGrant::of);
        let op = match handoff {
            Some(_) => "hand-off",
            None => "release",
        };
        let later = move || -> Later {
            Box::pin(async move {
                let release = Release {
                    key: &key,
                    kind,
                    grant: &grant,
                    token,
                    handoff: handoff.as_ref().map(OwnedGrant::grant),
                };
                let _ = inner.release(release).await;
            })
        };
        let mut names = vec![named(release.key, holder_of(release.grant))];
        names.extend(release.handoff.as_ref().map(|next| named(next.key, next.holder)));
        self.write((op, names), self.inner.release(release), later).await
    }

    async fn renew(&self, renewals: &[Renew<'_>]) -> BackendResult<Vec<RenewReply>> {
        let inner = self.inner.clone();
        let owned: Vec<OwnedRenew> = renewals.iter().map(OwnedRenew::of).collect();
        let later = move || -> Later {
            Box::pin(async move {
                let renewals: Vec<Renew<'_>> = owned.iter().map(OwnedRenew::renew).collect();
                let _ = inner.renew(&renewals).await;
            })
        };
        let names = renewals
            .iter()
            .map(|renew| match *renew {
                Renew::Grant { key, grant, .. } => named(key, holder_of(grant)),
                Renew::Place { key, holder, .. } => named(key, holder),
            })
            .collect();
        self.write(("renew", names), self.inner.renew(renewals), later).await
    }

    async fn abandon(&self, grant: Grant<'_>) -> BackendResult<bool> {
        let (inner, owned) = (self.inner.clone(), OwnedGrant::of(&grant));
        let faults = self.faults.clone();
        let later = move || -> Later {
            Box::pin(async move {
                if inner.abandon(owned.grant()).await.is_ok() {
                    let id =
                        (owned.grant().key.as_str().to_owned(), owned.grant().attempt.to_owned());
                    lock(&faults.undone).insert(id);
                }
            })
        };
        let names = vec![named(grant.key, grant.holder)];
        let id = (grant.key.as_str().to_owned(), grant.attempt.to_owned());
        let now = async {
            let undone = self.inner.abandon(grant).await;
            if undone.is_ok() {
                self.faults.note(format_args!("undo of {} applied: {undone:?}", id.1));
                lock(&self.faults.undone).insert(id);
            }
            undone
        };
        self.write(("undo", names), now, later).await
    }

    async fn leave(&self, key: &LockKey, holder: &str, kind: LockKind) -> BackendResult<()> {
        let (inner, owned_key, owned_holder) = (self.inner.clone(), key.clone(), holder.to_owned());
        let later = move || -> Later {
            Box::pin(async move {
                let _ = inner.leave(&owned_key, &owned_holder, kind).await;
            })
        };
        let names = vec![named(key, holder)];
        self.write(("leave", names), self.inner.leave(key, holder, kind), later).await
    }

    async fn listen(&self, key: &LockKey, only_for: Option<&str>) -> BackendResult<Self::Listener> {
        self.stalled().await;
        self.inner.listen(key, only_for).await
    }

    forward_to_inner!(inspect, force_unlock);
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

    /// The side `inspect` reports a grant of this kind on (a fair grant is not marked).
    fn side(self) -> LockKind {
        match self {
            Self::Exclusive | Self::Fair => LockKind::Exclusive,
            Self::Read => LockKind::Read,
            Self::Write => LockKind::Write,
            Self::Semaphore => LockKind::Semaphore,
        }
    }

    /// The kind the key's layout is read as.
    fn layout(self) -> LockKind {
        match self {
            Self::Exclusive => LockKind::Exclusive,
            Self::Fair => LockKind::Fair,
            Self::Read | Self::Write => LockKind::Write,
            Self::Semaphore => LockKind::Semaphore,
        }
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

/// The key a holder of another client holds across a shutdown.
const BYSTANDER_KEY: &str = "z";

/// Who is inside which section: the checker's own record, built from the program's events.
struct Inside<B: Backend> {
    task: usize,
    section: u64,
    kind: Kind,
    guard: Holding<B>,
    /// When its own fixed lease ends at the latest (counted from when it was heard of).
    own_until: Option<Instant>,
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

/// Reads the store underneath any wrapper at once: what `inspect` reports of the program's key
/// as a lock of the kind; and whether a record of a holder there may stay a while after a
/// fault.
struct Truth {
    inspect: Box<Inspect>,
    excused: Box<Excused>,
}

/// What the store reports of a program's key as a lock of a kind.
type Inspect = dyn Fn(&str, Kind) -> LockInfo + Send + Sync;
/// Whether a record of a holder at a program's key may stay a while after a fault.
type Excused = dyn Fn(&str, Kind, &str) -> bool + Send + Sync;

/// Since when a waiter of a key could have got it, as the store says.
#[derive(Default)]
struct Stranding {
    /// The waiters of each key (task, kind), while their acquire runs.
    waiting: HashMap<&'static str, Vec<(usize, Kind)>>,
    /// Since when a waiter of the key could proceed.
    free_since: HashMap<&'static str, Instant>,
}

/// The independent checker, and the program's log.
struct Checker<B: Backend> {
    inside: Mutex<HashMap<&'static str, Vec<Inside<B>>>>,
    violations: Mutex<Vec<String>>,
    log: Mutex<String>,
    sections: Mutex<u64>,
    /// How long a lost guard's `lost()` may take to resolve once another holder is inside.
    slack: Duration,
    /// How long a waiter may be kept from a key the store leaves free for it.
    strand_bound: Duration,
    started: Instant,
    truth: Option<Truth>,
    stranding: Mutex<Stranding>,
    /// Each task's holder id, to tell whose a record in the store is.
    holders: Mutex<HashMap<String, usize>>,
    /// Records in the store that no guard not lost (nor an acquire on its way) accounts for,
    /// by key, holder and side: since when.
    orphans: Mutex<HashMap<(&'static str, String, LockKind), Instant>>,
    /// How long such a record may stay: promptly gone without faults, within a lease with them.
    orphan_bound: Duration,
}

impl<B: Backend> Checker<B> {
    fn new(
        slack: Duration,
        strand_bound: Duration,
        orphan_bound: Duration,
        truth: Option<Truth>,
    ) -> Arc<Self> {
        Arc::new(Self {
            inside: Mutex::new(HashMap::new()),
            violations: Mutex::new(Vec::new()),
            log: Mutex::new(String::new()),
            sections: Mutex::new(0),
            slack,
            strand_bound,
            started: Instant::now(),
            truth,
            stranding: Mutex::default(),
            holders: Mutex::default(),
            orphans: Mutex::default(),
            orphan_bound,
        })
    }

    fn note(&self, task: usize, what: impl std::fmt::Display) {
        let at = self.started.elapsed();
        let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = writeln!(log, "{:>9.3} ms  t{task}  {what}", at.as_secs_f64() * 1e3);
    }

    fn violation(&self, what: String) {
        self.note(usize::MAX, format!("VIOLATION: {what}"));
        self.violations.lock().unwrap_or_else(PoisonError::into_inner).push(what);
    }

    /// Checks everyone inside `key`: exclusion among the guards not lost, each of them held in
    /// the store, and holds past their own fixed lease lost.
    fn check_key(&self, key: &'static str, entries: &[Inside<B>]) {
        let live: Vec<&Inside<B>> =
            entries.iter().filter(|entry| !entry.guard.guard().is_lost()).collect();
        let now = Instant::now();
        for entry in &live {
            if entry.own_until.is_some_and(|until| until <= now) {
                self.violation(format!(
                    "key {key}: t{}'s hold (section {}) is not lost past its own fixed lease",
                    entry.task, entry.section
                ));
            }
        }
        let permits: Vec<usize> = dedup(
            live.iter().filter(|entry| entry.kind == Kind::Semaphore).map(|entry| entry.task),
        );
        if permits.len() > PERMITS {
            self.violation(format!(
                "key {key}: {permits:?} hold a permit, none lost, over {PERMITS} permits"
            ));
        }
        for (i, a) in live.iter().enumerate() {
            for b in &live[i + 1..] {
                if a.task == b.task || a.kind.shares_with(b.kind) || a.kind == Kind::Semaphore {
                    continue;
                }
                self.violation(format!(
                    "key {key}: t{} ({:?}, section {}) and t{} ({:?}, section {}) both hold it, \
                     neither lost",
                    a.task, a.kind, a.section, b.task, b.kind, b.section
                ));
            }
        }
        let Some(truth) = &self.truth else {
            return;
        };
        for entry in &live {
            let guard = entry.guard.guard();
            let info = (truth.inspect)(key, entry.kind);
            let held = info
                .holders
                .iter()
                .any(|holder| holder.id == guard.holder().id() && holder.kind == entry.kind.side());
            if !held {
                self.violation(format!(
                    "key {key}: t{}'s guard (section {}, {:?}) is not lost, yet the store does \
                     not hold its grant: {info:?}",
                    entry.task, entry.section, entry.kind
                ));
            }
        }
    }

    /// Checks every key someone is inside, whether a waiter is kept from a free key, and
    /// whether the store keeps a grant nobody holds.
    fn check_all(&self) {
        {
            let inside = self.inside.lock().unwrap_or_else(PoisonError::into_inner);
            for (key, entries) in inside.iter() {
                self.check_key(key, entries);
            }
        }
        self.check_stranding();
        self.check_orphans();
    }

    /// `task` acquires as `holder`.
    fn holder(&self, task: usize, holder: &str) {
        self.holders.lock().unwrap_or_else(PoisonError::into_inner).insert(holder.to_owned(), task);
    }

    /// Every grant in the store must be accounted for by a guard not lost, or an acquire of
    /// its holder on its way; one that is not goes within the bound (its holder released it,
    /// or its lease ran out).
    fn check_orphans(&self) {
        let Some(truth) = &self.truth else {
            return;
        };
        let now = Instant::now();
        let inside = self.inside.lock().unwrap_or_else(PoisonError::into_inner);
        let holders = self.holders.lock().unwrap_or_else(PoisonError::into_inner);
        let stranding = self.stranding.lock().unwrap_or_else(PoisonError::into_inner);
        let mut orphans = self.orphans.lock().unwrap_or_else(PoisonError::into_inner);
        let mut seen = Vec::new();
        for (key, kind) in every_lock() {
            let info = (truth.inspect)(key, kind);
            for grant in &info.holders {
                let guarded = inside.get(key).into_iter().flatten().any(|entry| {
                    let guard = entry.guard.guard();
                    entry.kind.side() == grant.kind
                        && guard.holder().id() == grant.id
                        && !guard.is_lost()
                });
                let task = holders.get(&grant.id);
                let acquiring = stranding
                    .waiting
                    .get(key)
                    .into_iter()
                    .flatten()
                    .any(|(waiter, _)| Some(waiter) == task);
                if guarded || acquiring || (truth.excused)(key, kind, &grant.id) {
                    continue;
                }
                let id = (key, grant.id.clone(), grant.kind);
                let since = *orphans.entry(id.clone()).or_insert(now);
                if now.duration_since(since) > self.orphan_bound {
                    orphans.insert(id.clone(), now);
                    self.violation(format!(
                        "key {key}: the store keeps a {:?} grant of {} (t{task:?}) that no \
                         guard holds, for over {:?}",
                        grant.kind, grant.id, self.orphan_bound
                    ));
                }
                seen.push(id);
            }
        }
        orphans.retain(|id, _| seen.contains(id));
    }

    /// A waiter of a key the store leaves free for it (no holder in its way, nobody live ahead)
    /// must get it within the bound.
    fn check_stranding(&self) {
        let Some(truth) = &self.truth else {
            return;
        };
        let now = Instant::now();
        let mut stranding = self.stranding.lock().unwrap_or_else(PoisonError::into_inner);
        let Stranding { waiting, free_since } = &mut *stranding;
        for (key, waiters) in waiting.iter() {
            let could = waiters.iter().any(|(_, kind)| {
                let info = (truth.inspect)(key, *kind);
                let owner = info
                    .holders
                    .iter()
                    .any(|h| matches!(h.kind, LockKind::Exclusive | LockKind::Write));
                let readers = info.holders.iter().any(|h| h.kind == LockKind::Read);
                let writer_waits = waiters.iter().any(|(_, kind)| *kind == Kind::Write);
                match kind {
                    Kind::Exclusive | Kind::Fair => !owner,
                    Kind::Write => !owner && !readers,
                    Kind::Read => !owner && (info.queue_len == 0 || !writer_waits),
                    Kind::Semaphore => info.holders.len() < PERMITS,
                }
            });
            match could {
                false => {
                    free_since.remove(key);
                }
                true => {
                    let since = *free_since.entry(key).or_insert(now);
                    if now.duration_since(since) > self.strand_bound {
                        free_since.insert(key, now);
                        self.violation(format!(
                            "key {key}: stranded: the store left it free for {waiters:?} for \
                             over {:?}",
                            self.strand_bound
                        ));
                    }
                }
            }
        }
        free_since.retain(|key, _| waiting.get(key).is_some_and(|w| !w.is_empty()));
    }

    /// `task` waits for `keys` as `kind` until the returned registration is dropped.
    fn waiting(self: &Arc<Self>, task: usize, keys: &[&'static str], kind: Kind) -> Waiting<B> {
        let mut stranding = self.stranding.lock().unwrap_or_else(PoisonError::into_inner);
        for key in keys {
            stranding.waiting.entry(key).or_default().push((task, kind));
        }
        Waiting { checker: self.clone(), task, keys: keys.to_vec() }
    }

    /// Checks `guard` against everyone inside `key` by another task, and the store.
    fn check_against_others(&self, key: &'static str) {
        let inside = self.inside.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(entries) = inside.get(key) {
            self.check_key(key, entries);
        }
    }

    /// `task` enters the section of `key` holding `guard` (with its own fixed `lease`, if any).
    fn enter(
        self: &Arc<Self>,
        key: &'static str,
        task: usize,
        kind: Kind,
        guard: LockGuard<B>,
        lease: Lease,
    ) -> Arc<LockGuard<B>> {
        let guard = Arc::new(guard);
        self.enter_holding(key, task, kind, Holding::One(guard.clone()), lease);
        guard
    }

    /// `task` enters the sections of every key of `set` at once.
    fn enter_set(
        self: &Arc<Self>,
        keys: &[&'static str],
        task: usize,
        kind: Kind,
        set: MultiGuard<B>,
        lease: Lease,
    ) -> Arc<MultiGuard<B>> {
        let set = Arc::new(set);
        for key in keys {
            self.enter_holding(key, task, kind, Holding::Member(set.clone(), key), lease);
        }
        set
    }

    fn enter_holding(
        self: &Arc<Self>,
        key: &'static str,
        task: usize,
        kind: Kind,
        holding: Holding<B>,
        lease: Lease,
    ) {
        let section = {
            let mut sections = self.sections.lock().unwrap_or_else(PoisonError::into_inner);
            *sections += 1;
            *sections
        };
        let own_until = (!lease.is_renewed()).then(|| Instant::now() + lease.duration());
        let mut inside = self.inside.lock().unwrap_or_else(PoisonError::into_inner);
        let entries = inside.entry(key).or_default();
        let guard = holding.guard();
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
            let other_section = other.section;
            tokio::spawn(async move {
                // A guard given back meanwhile believes nothing any more (and its `lost()`
                // never resolves once it is released).
                if tokio::time::timeout(slack, lost).await.is_err()
                    && checker.is_inside(key, other_section)
                {
                    checker.violation(format!(
                        "key {key}: t{other_task}'s guard was not reported lost within {slack:?} \
                         after t{task} took the lock"
                    ));
                }
            });
        }
        let count = guard.hold_count();
        entries.push(Inside { task, section, kind, guard: holding, own_until });
        self.check_key(key, entries);
        drop(inside);
        self.note(task, format_args!("enter {key} {kind:?} section {section} count {count}"));
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
                .or_insert_with(|| (other.section, other.guard.guard().lost()));
        }
        if guard.is_lost() || holders.len() < PERMITS {
            return;
        }
        // One more permit than there are: that many holders must hear they lost theirs.
        let displaced = holders.len() + 1 - PERMITS;
        let (checker, slack) = (self.clone(), self.slack);
        tokio::spawn(async move {
            let tasks: Vec<usize> = holders.keys().copied().collect();
            let sections: Vec<u64> = holders.values().map(|(section, _)| *section).collect();
            let mut lost: futures_util::stream::FuturesUnordered<_> =
                holders.into_values().map(|(_, lost)| lost).collect();
            let heard = async {
                for _ in 0..displaced {
                    futures_util::StreamExt::next(&mut lost).await;
                }
            };
            // Holders that gave their permit back meanwhile believe nothing any more.
            let still = |checker: &Self| {
                let inside =
                    sections.iter().filter(|section| checker.is_inside(key, **section)).count();
                inside + 1 > PERMITS
            };
            if tokio::time::timeout(slack, heard).await.is_err() && still(&checker) {
                checker.violation(format!(
                    "key {key}: t{task} took a permit while {tasks:?} held all {PERMITS}, and \
                     {displaced} of them were not reported lost within {slack:?}"
                ));
            }
        });
    }

    /// Whether section `section` of `key` is still entered.
    fn is_inside(&self, key: &str, section: u64) -> bool {
        let inside = self.inside.lock().unwrap_or_else(PoisonError::into_inner);
        inside.get(key).is_some_and(|entries| entries.iter().any(|entry| entry.section == section))
    }

    /// `task` leaves the section of `key`; gives the guard back to be released or dropped.
    fn leave(&self, key: &'static str, task: usize, guard: Arc<LockGuard<B>>) -> LockGuard<B> {
        self.check_against_others(key);
        let holding = Holding::One(guard);
        self.remove(key, &holding);
        let Holding::One(guard) = holding else { unreachable!() };
        self.note(task, format_args!("leave {key} lost={}", guard.is_lost()));
        Arc::try_unwrap(guard).unwrap_or_else(|_| panic!("the checker keeps no other reference"))
    }

    /// `task` leaves the sections of every key of `set`; gives the set back.
    fn leave_set(
        &self,
        keys: &[&'static str],
        task: usize,
        set: Arc<MultiGuard<B>>,
    ) -> MultiGuard<B> {
        for key in keys {
            self.check_against_others(key);
            let holding = Holding::Member(set.clone(), key);
            self.remove(key, &holding);
        }
        self.note(task, format_args!("leave set {keys:?} lost={}", set.is_lost()));
        Arc::try_unwrap(set).unwrap_or_else(|_| panic!("the checker keeps no other reference"))
    }

    fn remove(&self, key: &'static str, holding: &Holding<B>) {
        let mut inside = self.inside.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(entries) = inside.get_mut(key) {
            entries.retain(|entry| !entry.guard.is(holding));
        }
    }

    fn violations(&self) -> Vec<String> {
        self.violations.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn log(&self) -> String {
        self.log.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// Every lock of the program, once, as the kind its layout is read as.
fn every_lock() -> Vec<(&'static str, Kind)> {
    let keys = KEYS.into_iter().map(|(key, kind)| (key, kind.unwrap_or(Kind::Write)));
    let sets = SET_KEYS.into_iter().map(|key| (key, Kind::Exclusive));
    let fair_sets = FAIR_SET_KEYS.into_iter().map(|key| (key, Kind::Fair));
    let mut locks: Vec<_> =
        keys.chain(sets).chain(fair_sets).chain([(BYSTANDER_KEY, Kind::Exclusive)]).collect();
    locks.sort_by_key(|(key, _)| *key);
    locks.dedup_by_key(|(key, _)| *key);
    locks
}

fn dedup(tasks: impl Iterator<Item = usize>) -> Vec<usize> {
    let mut tasks: Vec<usize> = tasks.collect();
    tasks.sort_unstable();
    tasks.dedup();
    tasks
}

/// A task's acquire of some keys, registered with the stranding check while it runs.
struct Waiting<B: Backend> {
    checker: Arc<Checker<B>>,
    task: usize,
    keys: Vec<&'static str>,
}

impl<B: Backend> Drop for Waiting<B> {
    fn drop(&mut self) {
        let mut stranding = self.checker.stranding.lock().unwrap_or_else(PoisonError::into_inner);
        for key in &self.keys {
            if let Some(waiters) = stranding.waiting.get_mut(key)
                && let Some(at) = waiters.iter().position(|(task, _)| *task == self.task)
            {
                waiters.remove(at);
            }
        }
    }
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
    let kind = kind.unwrap_or_else(|| if rng.chance(0.7) { Kind::Read } else { Kind::Write });
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
    Ask { key, kind, wait, lease, cancel }
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
        self.checker.holder(self.id, holder.id());
        holder
            .scope(async move {
                for _ in 0..ops {
                    if self.rng.chance(0.2) {
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
            let waiting = self.checker.waiting(id, &[key], kind);
            let outcome =
                acquire_unless_cancelled(request(&self.client, &ask).acquire(), ask.cancel).await;
            drop(waiting);
            let guard = match outcome {
                None => {
                    self.checker.note(id, format_args!("acquire of {key} dropped"));
                    return;
                }
                Some(Err(error)) => {
                    self.checker.note(id, format_args!("acquire of {key} failed: {error}"));
                    if !expected(&error, self.faulty, self.real_time) {
                        self.checker.violation(format!(
                            "t{id}: acquire of {key} failed unexpectedly: {error:?}"
                        ));
                    }
                    return;
                }
                Some(Ok(guard)) => guard,
            };
            self.section(key, kind, guard, ask.lease, depth).await;
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
        let request = if kind == Kind::Fair { request.fair() } else { request };
        let waiting = self.checker.waiting(id, &asked, kind);
        let outcome = acquire_unless_cancelled(request.acquire(), cancel).await;
        drop(waiting);
        let set = match outcome {
            None => {
                self.checker.note(id, format_args!("acquire of set {asked:?} dropped"));
                return;
            }
            Some(Err(error)) => {
                self.checker.note(id, format_args!("acquire of set {asked:?} failed: {error}"));
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
            self.checker
                .violation(format!("t{id}: the set {asked:?} holds {} locks", set.guards().len()));
        }
        let set = self.checker.enter_set(&keys, id, kind, set, lease);
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
        let set = self.checker.leave_set(&keys, id, set);
        if self.rng.chance(0.6) {
            let released = set.release().await;
            self.checker.note(id, format_args!("released set {keys:?}: {released:?}"));
        } else {
            drop(set);
            self.checker.note(id, format_args!("dropped set {keys:?}"));
        }
    }

    async fn section(
        &mut self,
        key: &'static str,
        kind: Kind,
        guard: LockGuard<B>,
        own_lease: Lease,
        depth: u32,
    ) {
        let id = self.id;
        let mut guard = self.checker.enter(key, id, kind, guard, own_lease);
        // Long enough, at times, for renewals to fall due and fixed leases to run out.
        let hold = self.rng.pick(&[0, 1, 5, 20, 60]);
        tokio::time::sleep(self.scale.ms(hold)).await;
        if depth < 2 && self.rng.chance(0.35) {
            // Re-enter, often with a shorter fixed lease than the hold it nests in: each hold
            // keeps its own lease.
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
                cancel: if self.rng.chance(0.15) { Some(Cancel::AfterPolls(1)) } else { None },
            };
            self.operation(nested, depth + 1).await;
            tokio::time::sleep(self.scale.ms(self.rng.pick(&[0, 5, 20]))).await;
        }
        if depth == 0 && self.rng.chance(0.15) {
            // A re-entry racing the release of the guard it would nest in.
            let held = self.checker.leave(key, id, guard);
            let ask = Ask {
                key,
                kind,
                wait: self.scale.ms(5),
                lease: lease(&mut self.rng, self.scale),
                cancel: None,
            };
            self.checker.note(id, format_args!("re-enter {key} joined with the release"));
            let waiting = self.checker.waiting(id, &[key], kind);
            let (again, released) =
                tokio::join!(request(&self.client, &ask).acquire(), held.release());
            drop(waiting);
            self.checker.note(
                id,
                format_args!(
                    "joined: acquire {:?}, release {:?}",
                    again.as_ref().map(|g| g.hold_count()),
                    released
                ),
            );
            match again {
                Ok(again) => guard = self.checker.enter(key, id, kind, again, ask.lease),
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
        let guard = self.checker.leave(key, id, guard);
        if self.rng.chance(0.6) {
            let released = guard.release().await;
            self.checker.note(id, format_args!("released {key}: {released:?}"));
        } else {
            drop(guard);
            self.checker.note(id, format_args!("dropped {key}"));
        }
    }
}

/// A holder of client `client` that holds [`BYSTANDER_KEY`] across the shutdown of `victim`
/// at `at`: it re-enters with a short fixed lease of its own, checks that the victim refuses
/// its holder, and releases after the shutdown.
async fn bystander<B: Backend>(
    client: LockClient<B>,
    victim: LockClient<B>,
    at: Duration,
    checker: Arc<Checker<B>>,
    scale: Scale,
    faulty: bool,
) {
    const TASK: usize = 90;
    let lease = Lease::watchdog(scale.ms(45));
    let guard = match client.lock(BYSTANDER_KEY).lease(lease).wait(scale.ms(50)).acquire().await {
        Ok(guard) => guard,
        Err(error) => {
            checker.note(TASK, format_args!("bystander's acquire failed: {error}"));
            if !expected(&error, faulty, false) {
                checker.violation(format!("the bystander's acquire failed: {error:?}"));
            }
            return;
        }
    };
    let holder = guard.holder().clone();
    checker.holder(TASK, holder.id());
    let guard = checker.enter(BYSTANDER_KEY, TASK, Kind::Exclusive, guard, lease);
    // A request on the victim naming this holder is refused, named or in scope.
    let named = victim.lock(BYSTANDER_KEY).holder(&holder).try_acquire().await;
    if !matches!(named, Err(LockError::ForeignHolder | LockError::ShutDown)) {
        checker.violation(format!(
            "a request on another client naming the bystander's holder: {named:?}"
        ));
    }
    let scoped = holder.clone().scope(victim.lock(BYSTANDER_KEY).try_acquire()).await;
    if !matches!(scoped, Err(LockError::HeldThroughOtherClient | LockError::ShutDown)) {
        checker
            .violation(format!("a request on another client in the bystander's scope: {scoped:?}"));
    }
    // A re-entry with a short fixed lease of its own, across the shutdown.
    let short = Lease::fixed(scale.ms(15));
    let inner = holder.clone().scope(client.lock(BYSTANDER_KEY).lease(short).try_acquire()).await;
    let inner = match inner {
        Ok(inner) => Some(checker.enter(BYSTANDER_KEY, TASK, Kind::Exclusive, inner, short)),
        Err(error) => {
            if !expected(&error, faulty, false) {
                checker.violation(format!("the bystander's re-entry failed: {error:?}"));
            }
            None
        }
    };
    let now = checker.started.elapsed();
    tokio::time::sleep(at.saturating_sub(now) + scale.ms(150)).await;
    if let Some(inner) = inner {
        let inner = checker.leave(BYSTANDER_KEY, TASK, inner);
        if !inner.is_lost() {
            checker.violation("the bystander's short re-entry outlived its own lease".to_owned());
        }
        drop(inner);
    }
    let guard = checker.leave(BYSTANDER_KEY, TASK, guard);
    let lost = guard.is_lost();
    let released = guard.release().await;
    checker.note(
        TASK,
        format_args!("bystander released after the shutdown: lost {lost}, {released:?}"),
    );
    if !faulty && (lost || released.is_err()) {
        checker.violation(format!(
            "another client's shutdown cost the bystander its lock: lost {lost}, release \
             {released:?}"
        ));
    }
}

/// What the Redis store still holds: keys other than the attempts given up on (kept a lease
/// after their undo, then gone) and release channels.
fn redis_leftovers(server: &RedisServer) -> Vec<String> {
    let mut left = Vec::new();
    if let RespValue::Array(Some(keys)) = server.cmd(&["KEYS", "*"]) {
        let held = |key: &String| !key.ends_with(":void") && !key.ends_with(":fence");
        left.extend(keys.iter().filter_map(RespValue::as_str).filter(held));
    }
    if let RespValue::Array(Some(channels)) = server.cmd(&["PUBSUB", "CHANNELS"]) {
        let channels = channels.iter().filter_map(RespValue::as_str);
        left.extend(channels.map(|channel| format!("channel {channel}")));
    }
    left
}

/// How a program runs.
struct Setup<'a> {
    /// Writes fail while this is set; cleared once the program's tasks are over.
    faults: Option<&'a AtomicBool>,
    truth: Option<Truth>,
    leftovers: Box<dyn Fn() -> Vec<String> + 'a>,
    scale: Scale,
    ops: usize,
}

/// Runs the program of `seed` on `store`. Returns the violations and the log.
async fn program<S: Backend + Clone>(
    seed: u64,
    store: S,
    setup: Setup<'_>,
) -> (Vec<String>, String) {
    let Setup { faults, truth, leftovers, scale, ops } = setup;
    let faulty = faults.is_some_and(|faults| faults.load(Ordering::Relaxed));
    let real_time = faults.is_none();
    let mut rng = Rng(seed);
    let clients: Vec<LockClient<S>> = (0..3)
        .map(|i| {
            LockClient::builder(store.clone())
                .name(format!("c{i}"))
                .waiter_timeout(scale.ms(150))
                .build()
                .expect("valid")
        })
        .collect();
    let strand_bound = scale.ms(500);
    // Delays before and after each call, and a release after a hand-off to a waiter that gave
    // up: a few of them.
    let orphan_bound = scale.ms(25);
    let checker = Checker::new(scale.ms(40), strand_bound, orphan_bound, truth);
    let mut tasks = tokio::task::JoinSet::new();
    for id in 0..6 {
        let task = Task {
            id,
            faulty,
            real_time,
            client: clients[id / 2].clone(),
            checker: checker.clone(),
            rng: Rng(rng.next()),
            scale,
        };
        tasks.spawn(task.run(ops));
    }
    // Now and then a client shuts down in the middle of it all, beside another client's holder.
    if rng.chance(0.35) {
        let victim = rng.below(3) as usize;
        let other = (victim + 1 + rng.below(2) as usize) % 3;
        let at = scale.ms(20 + rng.below(200) as u32);
        let (checker, victim_client) = (checker.clone(), clients[victim].clone());
        tasks.spawn(bystander(
            clients[other].clone(),
            victim_client.clone(),
            at,
            checker.clone(),
            scale,
            faulty,
        ));
        tasks.spawn(async move {
            tokio::time::sleep(at).await;
            checker.note(99, format_args!("shutting client {victim} down"));
            victim_client.shutdown().await;
        });
    }
    let sampling = {
        let checker = checker.clone();
        let period = scale.ms(2);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                checker.check_all();
            }
        })
    };
    while let Some(joined) = tasks.join_next().await {
        if let Err(error) = joined {
            checker.violation(format!("a task panicked: {error}"));
        }
    }
    sampling.abort();
    // Background releases finish; then no key may still be taken. After faults, undos and
    // releases retried in the background (and late deliveries) may take up to a lease (and
    // then give up: the lease has freed the lock).
    if let Some(faults) = faults {
        faults.store(false, Ordering::Relaxed);
    }
    let settle = match faulty {
        true => longest_lease(scale) + scale.ms(50),
        false => Duration::ZERO,
    };
    tokio::time::sleep(scale.ms(20) + settle).await;
    let fresh = LockClient::builder(store.clone()).name("fresh").build().expect("valid");
    let set_keys = SET_KEYS.iter().map(|key| (*key, Some(Kind::Exclusive)));
    let fair_set_keys = FAIR_SET_KEYS.iter().map(|key| (*key, Some(Kind::Fair)));
    let bystander_key = [(BYSTANDER_KEY, Some(Kind::Exclusive))];
    for (key, kind) in KEYS.into_iter().chain(set_keys).chain(fair_set_keys).chain(bystander_key) {
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
            Err(error) => {
                checker.violation(format!("key {key} is still taken after the program: {error:?}"))
            }
        }
    }
    // Once every lease has run out, nothing is left anywhere.
    tokio::time::sleep(longest_lease(scale) + scale.ms(50)).await;
    for (i, client) in clients.iter().chain([&fresh]).enumerate() {
        let state = (client.active_keys(), client.waiters(), client.queued());
        if state != (0, 0, 0) {
            checker
                .violation(format!("client {i} still tracks (keys, waiters, queued) = {state:?}"));
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
        // Most programs fail writes now and then; a few run clean, for the checks only a
        // program without faults can make.
        let on = rng.chance(0.8);
        let start = Instant::now();
        let stalls = (0..if on { rng.below(3) } else { 0 })
            .map(|_| {
                let from = start + rng.millis(0, 400);
                (from, from + rng.millis(10, 120))
            })
            .collect();
        let faults = Arc::new(Faults {
            seed,
            calls: Mutex::default(),
            on: AtomicBool::new(on),
            stalls,
            injected: Mutex::default(),
            faulted: Mutex::default(),
            undone: Mutex::default(),
            violations: Mutex::default(),
            notes: Mutex::default(),
            started: start,
        });
        let store = Faulty { inner: MemoryBackend::new(), faults: faults.clone() };
        let memory = store.inner.clone();
        let leftovers = move || match memory.held_count() {
            0 => Vec::new(),
            held => vec![format!("{held} locks held")],
        };
        let underneath = store.inner.clone();
        // Names keys as the program's clients do.
        let namer = LockClient::builder(MemoryBackend::new()).build().expect("valid");
        let name = move |key: &str, kind: Kind| {
            namer.lock_key("", key, kind.layout()).expect("a valid key")
        };
        let named = name.clone();
        let excuses = faults.clone();
        let truth = Truth {
            inspect: Box::new(move |key, kind| {
                underneath
                    .inspect(&name(key, kind), kind.layout())
                    .now_or_never()
                    .expect("the memory store answers at once")
                    .expect("inspect")
            }),
            excused: Box::new(move |key, kind, holder| {
                excuses.excused(named(key, kind).as_str(), holder)
            }),
        };
        let setup = Setup {
            faults: Some(&faults.on),
            truth: Some(truth),
            leftovers: Box::new(leftovers),
            scale: Scale { unit: Duration::from_millis(1) },
            ops,
        };
        // Every program finishes: far longer than any takes, on the paused clock.
        let finished = tokio::time::timeout(Duration::from_secs(600), program(seed, store, setup));
        let (mut violations, mut log) = finished.await.unwrap_or_else(|_| {
            let violation = "the program did not finish within 600 s: a deadlock".to_owned();
            (vec![violation], String::new())
        });
        let injected = faults.injected.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let _ = writeln!(log, "faults injected: {injected:?}");
        let _ = write!(log, "what the store did with faulted writes:\n{}", lock(&faults.notes));
        violations.extend(lock(&faults.violations).drain(..));
        (violations, log)
    })
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|value| {
        value.parse().unwrap_or_else(|_| panic!("{name} must be a number, not {value:?}"))
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
    let seeds = env_u64("INTERLEAVINGS_SEEDS").unwrap_or(300);
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
    assert!(failed.is_empty(), "failing seeds: {failed:?} (the first one's log is above)");
}

/// A few seeds against a real `redis-server`, in real time, without injected faults.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_programs_on_redis() {
    let seeds = env_u64("INTERLEAVINGS_REDIS_SEEDS").unwrap_or(3);
    for seed in 1..=seeds {
        let server = RedisServer::start();
        let backend = support::redis_backend(server.url()).connect().await.expect("connect");
        let setup = Setup {
            faults: None,
            truth: None,
            leftovers: Box::new(|| redis_leftovers(&server)),
            scale: Scale { unit: Duration::from_millis(3) },
            ops: 8,
        };
        let (violations, log) = program(seed, backend, setup).await;
        assert!(violations.is_empty(), "Redis {}", report(seed, &violations, &log));
    }
}
