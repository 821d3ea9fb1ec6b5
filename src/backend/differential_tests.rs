//! The same random programs of backend calls against a real `redis-server` and the in-memory
//! store, compared reply by reply: the two stores implement one protocol and must answer alike.
//!
//! Each seed draws a sequence of calls by three holders on four locks (plain, fair, read-write,
//! a semaphore of two permits): acquires with long or short leases, re-entries, takeovers of
//! an earlier attempt (`supersedes`), acquires sent only after their undo (a late delivery),
//! releases of one hold or all, naming their grant or an older attempt or none, and the hold
//! given back (whose own lease goes with it) or none, hand-offs,
//! renewals of holds and of queue places, undos of attempts, leaving a queue, and the short
//! leases running out. Every step runs on both stores; their replies, reduced to what the
//! protocol promises (not timing or subscriber counts), must be equal, and so must what
//! `inspect` then reports.
//!
//! One property is checked on each store's replies too: once an acquire of a lock was refused
//! (someone may be waiting), the release that frees it must notify the lock's listener (a
//! lost wake-up otherwise). Every lock has a listener on both stores.
//!
//! A step never runs while a short lease may be running out on one store and not yet on the
//! other: it waits until the lease is over on both (`Expiries`), so both stores see the same
//! history whatever the machine's load. A failure prints the seed and the steps so far:
//!
//! ```text
//! DIFFERENTIAL_SEED=17 cargo test --lib differential -- --nocapture
//! DIFFERENTIAL_SEEDS=2000 cargo test --lib differential   # more seeds
//! ```

use std::{
    collections::HashMap,
    fmt::Write as _,
    time::{Duration, Instant},
};

use crate::{
    Lease,
    backend::{
        AcquireReply, Backend, Grant, LockKind, Reentry, Release, ReleaseReply, Renew,
        memory::MemoryBackend, redis::RedisBackend,
    },
    inspect::LockInfo,
    lock_key::LockKey,
    test_support as support,
};

/// A long lease: never runs out during a program.
const LONG: Duration = Duration::from_secs(60);
/// A short lease: runs out at an `Expire` step.
const SHORT: Duration = Duration::from_millis(250);
/// How long a queue place lasts unless kept: longer than any program.
const QUEUE: Duration = Duration::from_secs(60);
/// How far either side of a short lease's end the two stores may disagree about it: the time
/// one call takes to reach a store, at most (a call that took longer is waited out too).
const MARGIN: Duration = Duration::from_millis(60);
/// The semaphore's permits.
const PERMITS: u32 = 2;
const HOLDERS: [&str; 3] = ["h1", "h2", "h3"];

/// SplitMix64: the same seed, the same program.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        // The index is below the slice's length: the cast cannot truncate.
        items[self.below(items.len() as u64) as usize]
    }
}

/// The four locks of a program, by kind.
struct Keys {
    plain: LockKey,
    rw: LockKey,
    semaphore: LockKey,
}

impl Keys {
    fn new(seed: u64) -> Self {
        let base = LockKey::new("dt:", format!("{seed}").as_bytes(), 512).expect("a valid key");
        Self {
            plain: base.with_suffix(":x"),
            rw: base.with_suffix(":rw"),
            semaphore: base.with_suffix(":sem"),
        }
    }

    /// The fair lock has its own name: a plain and a fair lock of one name share a layout.
    fn of(&self, kind: LockKind, fair: &LockKey) -> LockKey {
        match kind {
            LockKind::Exclusive => self.plain.clone(),
            LockKind::Fair => fair.clone(),
            LockKind::Read | LockKind::Write => self.rw.clone(),
            _ => self.semaphore.clone(),
        }
    }
}

const KINDS: [LockKind; 5] = [
    LockKind::Exclusive,
    LockKind::Fair,
    LockKind::Read,
    LockKind::Write,
    LockKind::Semaphore,
];

/// The lock a kind's holds are counted on, for the wake-up check: both sides of a read-write
/// lock are one lock.
fn lock_of(kind: LockKind) -> LockKind {
    match kind {
        LockKind::Read => LockKind::Write,
        other => other,
    }
}

/// An acquire, kept so that it can be sent again late or undone.
#[derive(Clone, Debug)]
struct Sent {
    holder: &'static str,
    kind: LockKind,
    attempt: String,
    lease: Duration,
    fencing: bool,
    queue: bool,
    supersedes: Option<String>,
    reentry: Reentry,
    contended: bool,
    /// Sent after its undo: its caller gave up on it and waits for nothing.
    late: bool,
}

impl Sent {
    fn grant<'a>(&'a self, key: &'a LockKey) -> Grant<'a> {
        Grant {
            key,
            holder: self.holder,
            attempt: &self.attempt,
            lease: Lease::fixed(self.lease),
            fencing: self.fencing,
            kind: self.kind,
            queue: self.queue.then_some(QUEUE),
            supersedes: self.supersedes.as_deref(),
            reentry: self.reentry,
            contended: self.contended,
            permits: PERMITS,
        }
    }
}

/// One step of a program.
#[derive(Clone, Debug)]
enum Step {
    Acquire(Sent),
    /// An undo of an acquire that was never sent; the acquire follows later, late.
    Forget(Sent),
    Abandon(Sent),
    Release {
        holder: &'static str,
        kind: LockKind,
        all: bool,
        attempt: Option<String>,
        /// The attempt that took the hold given back (its lease goes with it).
        hold: Option<String>,
        handoff: Option<Sent>,
    },
    Renew {
        holder: &'static str,
        kind: LockKind,
        lease: Duration,
        queued: bool,
    },
    Leave {
        holder: &'static str,
        kind: LockKind,
    },
    /// Every short lease runs out.
    Expire,
}

/// What a store answered to a step, reduced to what the protocol promises.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Answer {
    Acquired { count: u64, token: bool },
    Busy,
    WouldDeadlock,
    NotHeld,
    Decremented(u64),
    Released,
    HandedOff { token: bool },
    Undone(bool),
    Renewed(crate::backend::RenewReply),
    Done,
    Error(String),
}

/// A reply and whether it notified a listener (for releases).
struct Outcome {
    answer: Answer,
    notified: bool,
}

/// What `inspect` reports of a lock, reduced to what both stores must agree on: its holders
/// (id, kind, hold count), sorted, its queue's length and its permits in use and limit.
type Holds = (Vec<(String, String, u64)>, u64, Option<(u64, u64)>);

/// The holds of a lock as `inspect` reports them, sorted.
fn holds(info: &LockInfo) -> Holds {
    let mut holders: Vec<_> = info
        .holders
        .iter()
        .map(|holder| {
            (
                holder.id.clone(),
                format!("{:?}", holder.kind),
                holder.hold_count,
            )
        })
        .collect();
    holders.sort();
    (
        holders,
        info.queue_len,
        info.permits.map(|permits| (permits.in_use, permits.limit)),
    )
}

/// The instants around which a short lease ends: no step runs inside one, so that both stores
/// agree whether it ended.
#[derive(Default)]
struct Expiries(Vec<(Instant, Instant)>);

impl Expiries {
    /// A short lease set by a call sent at `sent` and answered at `answered`.
    fn add(&mut self, lease: Duration, sent: Instant, answered: Instant) {
        if lease == SHORT {
            self.0
                .push((sent + lease - MARGIN, answered + lease + MARGIN));
        }
    }

    /// Waits until no short lease is ending.
    async fn clear_of_endings(&mut self) {
        let now = Instant::now();
        if let Some(end) = self
            .0
            .iter()
            .filter(|(from, to)| *from <= now && now < *to)
            .map(|(_, to)| *to)
            .max()
        {
            tokio::time::sleep(end - now).await;
        }
        let now = Instant::now();
        self.0.retain(|(_, to)| *to > now);
    }

    /// Waits until every short lease has ended.
    async fn all_over(&mut self) {
        if let Some(end) = self.0.iter().map(|(_, to)| *to).max() {
            tokio::time::sleep_until(end.into()).await;
        }
        self.0.clear();
    }
}

/// Runs `step` on `store`.
async fn run<B: Backend>(store: &B, keys: &Keys, fair: &LockKey, step: &Step) -> Outcome {
    let plain = |answer| Outcome {
        answer,
        notified: false,
    };
    match step {
        Step::Acquire(sent) => {
            let key = keys.of(sent.kind, fair);
            plain(match store.acquire(sent.grant(&key)).await {
                Ok(AcquireReply::Acquired { count, token, .. }) => Answer::Acquired {
                    count,
                    token: token.is_some(),
                },
                Ok(AcquireReply::Held { .. } | AcquireReply::Spent { .. }) => Answer::Busy,
                Ok(AcquireReply::WouldDeadlock) => Answer::WouldDeadlock,
                Err(error) => Answer::Error(format!("{:?}", error.kind())),
            })
        }
        Step::Forget(sent) | Step::Abandon(sent) => {
            let key = keys.of(sent.kind, fair);
            plain(match store.abandon(sent.grant(&key)).await {
                Ok(undone) => Answer::Undone(undone),
                Err(error) => Answer::Error(format!("{:?}", error.kind())),
            })
        }
        Step::Release {
            holder,
            kind,
            all,
            attempt,
            hold,
            handoff,
        } => {
            let key = keys.of(*kind, fair);
            let reply = store
                .release(Release {
                    key: &key,
                    holder,
                    all: *all,
                    handoff: handoff.as_ref().map(|sent| sent.grant(&key)),
                    kind: *kind,
                    attempt: attempt.as_deref(),
                    hold: hold.as_deref(),
                })
                .await;
            match reply {
                Ok(ReleaseReply::NotHeld) => plain(Answer::NotHeld),
                Ok(ReleaseReply::Decremented { remaining }) => {
                    plain(Answer::Decremented(remaining))
                }
                Ok(ReleaseReply::Released { notified }) => Outcome {
                    answer: Answer::Released,
                    notified: notified.is_some_and(|n| n > 0),
                },
                Ok(ReleaseReply::HandedOff { token }) => plain(Answer::HandedOff {
                    token: token.is_some(),
                }),
                Err(error) => plain(Answer::Error(format!("{:?}", error.kind()))),
            }
        }
        Step::Renew {
            holder,
            kind,
            lease,
            queued,
        } => {
            let key = keys.of(*kind, fair);
            let renew = if *queued {
                Renew::place(&key, holder, *lease, *kind)
            } else {
                Renew::hold(&key, holder, Lease::fixed(*lease), *kind)
            };
            plain(match store.renew(&[renew]).await {
                Ok(replies) => Answer::Renewed(replies[0]),
                Err(error) => Answer::Error(format!("{:?}", error.kind())),
            })
        }
        Step::Leave { holder, kind } => {
            let key = keys.of(*kind, fair);
            plain(match store.leave(&key, holder, *kind).await {
                Ok(()) => Answer::Done,
                Err(error) => Answer::Error(format!("{:?}", error.kind())),
            })
        }
        Step::Expire => plain(Answer::Done),
    }
}

/// Draws the programs' steps, remembering what was sent so that later steps can name it.
struct Program {
    rng: Rng,
    attempts: u64,
    /// Every acquire sent, by holder and kind.
    sent: HashMap<(&'static str, LockKind), Vec<Sent>>,
    /// Undone before they were sent: each is sent later, late.
    forgotten: Vec<Sent>,
}

impl Program {
    fn attempt(&mut self) -> String {
        self.attempts += 1;
        format!("a{}", self.attempts)
    }

    fn acquire(&mut self, holder: &'static str, kind: LockKind) -> Sent {
        let earlier = self
            .sent
            .get(&(holder, kind))
            .and_then(|sent| sent.last())
            .map(|sent| sent.attempt.clone());
        let supersedes = earlier.filter(|_| self.rng.chance(15));
        Sent {
            holder,
            kind,
            attempt: self.attempt(),
            lease: if self.rng.chance(35) { SHORT } else { LONG },
            fencing: kind != LockKind::Semaphore && self.rng.chance(40),
            queue: kind.queues() && self.rng.chance(70),
            supersedes,
            reentry: self.rng.pick(&[
                Reentry::Allowed,
                Reentry::Allowed,
                Reentry::Only,
                Reentry::Refused,
            ]),
            contended: self.rng.chance(30),
            late: false,
        }
    }

    fn step(&mut self) -> Step {
        let holder = self.rng.pick(&HOLDERS);
        let kind = self.rng.pick(&KINDS);
        let earlier = self.sent.get(&(holder, kind)).cloned().unwrap_or_default();
        match self.rng.below(100) {
            0..=39 => {
                if !self.forgotten.is_empty() && self.rng.chance(25) {
                    // Sent as after a refusal: a late first try at a free lock (the Redis
                    // backend's `SET NX`, which no script sees) lands as a hold that others
                    // take over, and its expiry is the Redis backend's own tests' subject.
                    let late = self.forgotten.remove(0);
                    return Step::Acquire(Sent {
                        late: true,
                        contended: true,
                        ..late
                    });
                }
                let sent = self.acquire(holder, kind);
                self.sent
                    .entry((holder, kind))
                    .or_default()
                    .push(sent.clone());
                Step::Acquire(sent)
            }
            40..=64 => {
                let attempt = match self.rng.below(3) {
                    0 => None,
                    1 => earlier.last().map(|sent| sent.attempt.clone()),
                    _ => earlier.first().map(|sent| sent.attempt.clone()),
                };
                // The hold given back: the last or an earlier one, or none named.
                let hold = match self.rng.below(3) {
                    0 => None,
                    1 => earlier.last().map(|sent| sent.attempt.clone()),
                    _ if earlier.is_empty() => None,
                    _ => {
                        let at = self.rng.below(earlier.len() as u64);
                        // Below the length: the cast cannot truncate.
                        Some(earlier[at as usize].attempt.clone())
                    }
                };
                let handoff = (kind == LockKind::Exclusive && self.rng.chance(20))
                    .then(|| {
                        let other = self.rng.pick(&HOLDERS);
                        let sent = self.acquire(other, kind);
                        self.sent
                            .entry((other, kind))
                            .or_default()
                            .push(sent.clone());
                        sent
                    })
                    .filter(|sent| sent.holder != holder);
                Step::Release {
                    holder,
                    kind,
                    all: self.rng.chance(15),
                    attempt,
                    hold,
                    handoff,
                }
            }
            65..=74 => match earlier.last() {
                Some(sent) if self.rng.chance(70) => Step::Abandon(sent.clone()),
                _ => {
                    let sent = self.acquire(holder, kind);
                    self.forgotten.push(sent.clone());
                    Step::Forget(sent)
                }
            },
            75..=84 => Step::Renew {
                holder,
                kind,
                lease: if self.rng.chance(30) { SHORT } else { LONG },
                queued: kind.queues() && self.rng.chance(30),
            },
            85..=92 if kind.queues() => Step::Leave { holder, kind },
            85..=92 => Step::Renew {
                holder,
                kind,
                lease: LONG,
                queued: false,
            },
            _ => Step::Expire,
        }
    }
}

/// The lease a step sets, for [`Expiries`].
fn lease_set(step: &Step) -> Option<Duration> {
    match step {
        Step::Acquire(sent) => Some(sent.lease),
        Step::Release {
            handoff: Some(sent),
            ..
        } => Some(sent.lease),
        Step::Renew { lease, .. } => Some(*lease),
        _ => None,
    }
}

/// Runs the program of `seed` on both stores. Returns the first disagreement or violation,
/// with the steps that led to it.
async fn compare(seed: u64, redis: &RedisBackend, steps: usize) -> Result<(), String> {
    let memory = MemoryBackend::new();
    let keys = Keys::new(seed);
    let fair = keys.plain.with_suffix(":fair");
    let mut listeners = Vec::new();
    for kind in KINDS {
        let key = keys.of(kind, &fair);
        listeners.push(memory.listen(&key, None).await.expect("listen in memory"));
        listeners.push(redis.listen(&key, None).await.expect("listen on Redis"));
    }
    let mut program = Program {
        rng: Rng(seed),
        attempts: 0,
        sent: HashMap::new(),
        forgotten: Vec::new(),
    };
    let mut expiries = Expiries::default();
    // Locks an acquire was refused on since they were last freed: their release must notify.
    let mut refused: HashMap<LockKind, bool> = HashMap::new();
    let mut log = String::new();
    for index in 0..steps {
        let step = program.step();
        if matches!(step, Step::Expire) {
            expiries.all_over().await;
            refused.clear();
        } else {
            expiries.clear_of_endings().await;
        }
        let sent = Instant::now();
        let on_memory = run(&memory, &keys, &fair, &step).await;
        let on_redis = run(redis, &keys, &fair, &step).await;
        let answered = Instant::now();
        if let Some(lease) = lease_set(&step) {
            expiries.add(lease, sent, answered);
        }
        let _ = writeln!(
            log,
            "{index:>3}: {step:?}\n     memory {:?}, Redis {:?}",
            on_memory.answer, on_redis.answer
        );
        let failed = |what: String| Err(format!("seed {seed}, step {index}: {what}\n{log}"));
        if on_memory.answer != on_redis.answer {
            return failed("the stores disagree".to_owned());
        }
        let mut free = HashMap::new();
        for kind in [
            LockKind::Exclusive,
            LockKind::Fair,
            LockKind::Write,
            LockKind::Semaphore,
        ] {
            let key = keys.of(kind, &fair);
            let (in_memory, in_redis) = (
                memory.inspect(&key, kind).await,
                redis.inspect(&key, kind).await,
            );
            let (in_memory, in_redis) = match (in_memory, in_redis) {
                (Ok(a), Ok(b)) => (holds(&a), holds(&b)),
                (a, b) => return failed(format!("inspect of {kind:?}: {a:?} / {b:?}")),
            };
            if in_memory != in_redis {
                return failed(format!(
                    "inspect of {kind:?} disagrees: memory {in_memory:?}, Redis {in_redis:?}"
                ));
            }
            // Whether a waiter refused before could now get in.
            let room = match kind {
                LockKind::Semaphore => in_memory.0.len() < PERMITS as usize,
                _ => in_memory.0.is_empty(),
            };
            free.insert(kind, room);
        }
        let (kind, released) = match &step {
            // Waiting follows a refusal, but not of a re-entry only (nothing to wait for) or
            // of a call delivered late (nobody waits for its answer).
            Step::Acquire(sent) if sent.late || sent.reentry == Reentry::Only => continue,
            Step::Acquire(sent) => (lock_of(sent.kind), false),
            Step::Release { kind, .. } => (lock_of(*kind), on_memory.answer == Answer::Released),
            _ => continue,
        };
        if on_memory.answer == Answer::Busy {
            refused.insert(kind, true);
        }
        // A fair lock's waiters are woken through their queue (each listens for its own turn),
        // which this check does not model.
        if released && kind != LockKind::Fair && free[&kind] && refused.remove(&kind).is_some() {
            for (store, outcome) in [("memory", &on_memory), ("Redis", &on_redis)] {
                if !outcome.notified {
                    return failed(format!(
                        "{store}: the release that let a refused waiter in notified nobody"
                    ));
                }
            }
        }
    }
    Ok(())
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|value| {
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, not {value:?}"))
    })
}

#[tokio::test]
async fn both_stores_answer_every_program_alike() {
    const STEPS: usize = 40;
    let server = support::RedisServer::start();
    let redis = support::redis_backend(server.url())
        .connect()
        .await
        .expect("connect");
    let seeds = match env_u64("DIFFERENTIAL_SEED") {
        Some(seed) => seed..seed + 1,
        None => {
            let first = env_u64("DIFFERENTIAL_FIRST_SEED").unwrap_or(1);
            first..first + env_u64("DIFFERENTIAL_SEEDS").unwrap_or(60)
        }
    };
    let mut failures = Vec::new();
    for seed in seeds {
        if let Err(failure) = compare(seed, &redis, STEPS).await {
            if failures.is_empty() {
                eprintln!("{failure}");
            }
            failures.push(seed);
        }
    }
    assert!(
        failures.is_empty(),
        "failing seeds: {failures:?} (the first one's steps are above); replay one with \
         DIFFERENTIAL_SEED=<seed> cargo test --lib differential -- --nocapture"
    );
}
