//! F7: a fair lock across processes.
//!
//! The dead waiter: this process holds the lock; holder process P1 queues for it, then holder
//! process P2, then a waiter in this process. P2 is `kill -9`'d in the queue. The lock must go to
//! P1 first, then to the waiter here, in order: P2's dead place is purged once its waiter timeout
//! passes without a refresh, so it delays the hand-off by at most that timeout, and no later.
//!
//! The live waiter (Redisson #3004): holder process P1 queues first, a waiter in this process
//! second, and the lock stays held for several waiter timeouts while P1 is `SIGSTOP`ped now and
//! then for less than the timeout. P1's client keeps its place alive, so the head of the queue in
//! Redis must be P1 at every look, with time left, and P1 must get the lock before the waiter
//! behind it. The control stops P1 for longer than the timeout: then P1 is a dead waiter, its
//! place must be seen purged and the waiter behind it served first, or the watch is blind.

use std::time::Duration;

use tokio::time::Instant;
use tower_lock::{Lease, LockClient, LockGuard, RedisBackend};

use super::{Bed, Topology, eventually};
use crate::{
    checker, clock,
    history::{History, Outcome, Section},
    holder::{Command, HolderProc, Reply},
    run::{self, Node},
};

const LEASE_MS: u64 = 5000;
/// Every client's waiter timeout: how long a dead waiter's place can hold the queue up.
const WAITER_TIMEOUT: Duration = Duration::from_millis(1000);
/// Scheduling slack allowed past a computed bound.
const SLACK: Duration = Duration::from_millis(200);
/// How long the live waiter waits for its turn: several waiter timeouts.
const LIVE_WAIT: Duration = WAITER_TIMEOUT.saturating_mul(3);
/// How many times the live waiter's process is stopped while it waits.
const STALLS: u32 = 2;
/// How long each stop lasts. A client refreshes its place every third of the timeout, so a stop
/// of up to two thirds of it can never outlast the place, wherever it falls in that cycle.
const STALL: Duration = Duration::from_millis(500);
/// The control's one stop: longer than the timeout, so the place must go.
const LONG_STALL: Duration = Duration::from_millis(1500);
/// How often the queue in Redis is looked at.
const LOOK_EVERY: Duration = Duration::from_millis(5);
/// Milliseconds left on the server's clock to the place of holder `ARGV[1]` at the head of queue
/// `KEYS[1]`, by its deadline in `KEYS[2]`: negative once the deadline passed (the next script
/// purges the place), -1 when it is not at the head.
const PLACE_LEFT: &str = "
    if redis.call('LINDEX', KEYS[1], 0) ~= ARGV[1] then return -1 end
    local deadline = redis.call('ZSCORE', KEYS[2], ARGV[1])
    if not deadline then return -1 end
    local time = redis.call('TIME')
    return tonumber(deadline) - (tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000))";

/// A client in this process with the shared waiter timeout.
async fn client(bed: &Bed) -> LockClient<RedisBackend> {
    let backend = crate::support::redis_backend(bed.redis.url()).connect().await.expect("connect");
    LockClient::builder(backend)
        .prefix(&bed.prefix)
        .waiter_timeout(WAITER_TIMEOUT)
        .build()
        .expect("client configuration")
}

/// A check for `eventually`: the fair lock `key`'s queue holds `n` places.
fn queue_holds(bed: &Bed, key: &str, n: i64) -> impl FnMut() -> bool + use<> {
    let (node, queue) = (bed.redis.clone(), format!("{}:queue", bed.lock_key(key)));
    move || node.cmd(&["LLEN", &queue]).as_int() == n
}

/// This process takes the fair lock `key` before anyone queues; its section is open.
async fn hold_first(
    locks: &LockClient<RedisBackend>,
    history: &History,
    key: &str,
) -> (LockGuard<RedisBackend>, Section) {
    let mut own = history.begin(key, "");
    let held = locks
        .fair_lock(key)
        .lease(Lease::watchdog(Duration::from_millis(LEASE_MS)))
        .acquire()
        .await
        .expect("the first holder");
    own.t_ok = Some(clock::now_ns());
    own.holder = held.holder().id().to_owned();
    (held, own)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f07_fair_lock_purges_a_killed_waiter() {
    let mut bed = Bed::new("F7", Topology::Single).await;
    let runs = run::count(3, 100);
    let history = bed.scenario.history();
    // Every client keeps its queue places alive with the same timeout.
    let locks = client(&bed).await;
    let mut setup = bed.setup(bed.redis.url(), false);
    setup.waiter_timeout_ms = WAITER_TIMEOUT.as_millis() as u64;
    let mut first = HolderProc::spawn(&setup).await;
    let (mut inversions, mut stalls) = (0, Vec::new());
    for run in 0..runs {
        let key = format!("k{run}");
        let queued = |n: i64| queue_holds(&bed, &key, n);
        let (held, mut own) = hold_first(&locks, &history, &key).await;

        let mut doomed = HolderProc::spawn(&setup).await;
        for (proc, place) in [(&mut first, 1), (&mut doomed, 2)] {
            proc.send(&Command::Hold { key: key.clone(), lease_ms: LEASE_MS, fair: true });
            assert!(
                eventually(Duration::from_secs(5), queued(place)).await,
                "run {run}: holder process not queued at place {place}"
            );
        }
        let waiter = {
            let (locks, history, key) = (locks.clone(), history.clone(), key.clone());
            tokio::spawn(async move {
                let mut section = history.begin(&key, "");
                let guard = locks
                    .fair_lock(&key)
                    .wait(Duration::from_secs(10))
                    .acquire()
                    .await
                    .expect("the waiter behind the dead one");
                section.t_ok = Some(clock::now_ns());
                section.holder = guard.holder().id().to_owned();
                (guard, section)
            })
        };
        assert!(
            eventually(Duration::from_secs(5), queued(3)).await,
            "run {run}: the waiter did not queue"
        );
        doomed.kill();

        own.t_rel_inv = Some(clock::now_ns());
        held.release().await.expect("release");
        own.t_rel_ok = Some(clock::now_ns());
        own.result = Outcome::Ok;
        history.record(&own);
        let Reply::Held { t_ok: first_ok, .. } = first.reply(Duration::from_secs(5)).await else {
            panic!("run {run}: P1 did not get the lock");
        };
        first.send(&Command::Release);
        let Reply::Released { result, .. } = first.reply(Duration::from_secs(5)).await else {
            panic!("run {run}: P1 did not release");
        };
        assert_eq!(result, "ok", "run {run}: P1's release");
        let released = Instant::now();
        let (guard, mut section) = waiter.await.expect("waiter task");
        stalls.push(released.elapsed());
        if section.t_ok.is_some_and(|t| t < first_ok) {
            inversions += 1;
        }
        section.t_rel_inv = Some(clock::now_ns());
        guard.release().await.expect("release");
        section.t_rel_ok = Some(clock::now_ns());
        section.result = Outcome::Ok;
        history.record(&section);
    }
    let sweep = checker::sweep(&History::read(&bed.scenario.history_path()));
    let leaks = checker::server_settled(&bed.redis, &bed.prefix).await;
    let slowest = stalls.iter().max().copied().unwrap_or_default();
    let s = &mut bed.scenario;
    s.figure("runs", runs);
    s.figure("fifo_inversions", format!("{inversions}/{runs}"));
    s.figure("violations", sweep.violations);
    s.figure("stall_p50_ms", format!("{:.0}", run::quantile_ms(&stalls, 0.5)));
    s.figure("stall_max_ms", format!("{:.0}/{}", clock::ms(slowest), WAITER_TIMEOUT.as_millis()));
    s.figure("leaked_keys", leaks.count());
    s.report();

    assert_eq!(inversions, 0, "the lock skipped a live waiter's turn");
    assert_eq!(sweep.violations, 0, "{:?}", sweep.examples);
    assert!(slowest <= WAITER_TIMEOUT + SLACK, "the dead waiter held the queue up {slowest:?}");
    assert_eq!(leaks.count(), 0, "left in Redis: {leaks:?}");
}

/// Looks at the head of a fair queue in Redis, keeping the least time its place had left.
struct Watch {
    node: Node,
    queue: String,
    timeouts: String,
    holder: String,
    /// The last look, in milliseconds left (negative: purged or due to be).
    last: i64,
    /// The least of every look.
    least: i64,
}

impl Watch {
    fn look(&mut self) -> i64 {
        let args = ["EVAL", PLACE_LEFT, "2", &self.queue, &self.timeouts, &self.holder];
        self.last = self.node.cmd(&args).as_int();
        self.least = self.least.min(self.last);
        self.last
    }

    /// Looks every [`LOOK_EVERY`] until `deadline` (at least once).
    async fn until(&mut self, deadline: Instant) {
        loop {
            self.look();
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep(LOOK_EVERY).await;
        }
    }

    /// Looks until the place has more time left than at the look before, that is until its
    /// waiter refreshed it, or `within` passed.
    async fn refreshed(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let before = self.last;
            if self.look() > before || Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep(LOOK_EVERY).await;
        }
    }
}

/// What the live-waiter runs saw.
struct Live {
    /// Runs where the live waiter's place was gone from the head at some look.
    purged: usize,
    inversions: usize,
    /// The least time a place had left at any look, in milliseconds (negative: purged).
    least_left_ms: i64,
    /// From queueing to getting the lock, per run.
    waited: Vec<Duration>,
    sweep: checker::Sweep,
    leaks: checker::Leaks,
}

/// Holder process P1 queues for a lock held here, a waiter here queues behind it, and the lock
/// stays held for [`LIVE_WAIT`] while P1 is stopped `stalls` times for `stall` each.
async fn live_waiter(name: &'static str, stall: Duration, stalls: u32, runs: usize) -> Live {
    let mut bed = Bed::new(name, Topology::Single).await;
    let mut rng = bed.scenario.rng();
    let history = bed.scenario.history();
    let locks = client(&bed).await;
    let mut setup = bed.setup(bed.redis.url(), false);
    setup.waiter_timeout_ms = WAITER_TIMEOUT.as_millis() as u64;
    let mut live = HolderProc::spawn(&setup).await;
    let (mut purged, mut inversions, mut least, mut waited) = (0, 0, i64::MAX, Vec::new());
    for run in 0..runs {
        let key = format!("k{run}");
        let name = bed.lock_key(&key);
        let queue = format!("{name}:queue");
        let queued = |n: i64| queue_holds(&bed, &key, n);
        let (held, mut own) = hold_first(&locks, &history, &key).await;

        live.send(&Command::Hold { key: key.clone(), lease_ms: LEASE_MS, fair: true });
        assert!(
            eventually(Duration::from_secs(5), queued(1)).await,
            "run {run}: the live waiter did not queue"
        );
        let (queued_at, started) = (clock::now_ns(), Instant::now());
        let live_id = bed.redis.cmd(&["LINDEX", &queue, "0"]).as_str();
        let later = {
            let (locks, history, key) = (locks.clone(), history.clone(), key.clone());
            tokio::spawn(async move {
                let mut section = history.begin(&key, "");
                let guard = locks
                    .fair_lock(&key)
                    .wait(Duration::from_secs(10))
                    .acquire()
                    .await
                    .expect("the waiter behind the live one");
                let t_ok = clock::now_ns();
                section.t_ok = Some(t_ok);
                section.holder = guard.holder().id().to_owned();
                section.t_rel_inv = Some(clock::now_ns());
                guard.release().await.expect("release");
                section.t_rel_ok = Some(clock::now_ns());
                section.result = Outcome::Ok;
                history.record(&section);
                t_ok
            })
        };
        assert!(
            eventually(Duration::from_secs(5), queued(2)).await,
            "run {run}: the later waiter did not queue"
        );

        let mut watch = Watch {
            node: bed.redis.clone(),
            queue: queue.clone(),
            timeouts: format!("{name}:timeouts"),
            holder: live_id.expect("the live waiter's holder id"),
            last: i64::MAX,
            least: i64::MAX,
        };
        // Each stop starts at a random point of its share of the wait, so stops fall anywhere
        // in the refresh cycle; the next one only once the place was seen refreshed.
        let share = LIVE_WAIT / (stalls + 1);
        for n in 0..stalls {
            let gap = rng.between(Duration::ZERO, share.saturating_sub(stall));
            watch.until(started + share * n + gap).await;
            live.signal("STOP");
            watch.until(Instant::now() + stall).await;
            live.signal("CONT");
            watch.refreshed(WAITER_TIMEOUT).await;
        }
        watch.until(started + LIVE_WAIT).await;

        own.t_rel_inv = Some(clock::now_ns());
        held.release().await.expect("release");
        own.t_rel_ok = Some(clock::now_ns());
        own.result = Outcome::Ok;
        history.record(&own);
        let live_ok = match live.reply(Duration::from_secs(5)).await {
            Reply::Held { t_ok, .. } => Some(t_ok),
            // Stopped past its place's timeout, the waiter may have been stopped with a backend
            // call in flight: the call times out on resume, and an acquire does not retry a
            // timed-out call. Only the control's long stop allows this; its point is the purge
            // and the turn of the waiter behind, checked by the caller.
            Reply::Failed { error } if stall > WAITER_TIMEOUT && error.contains("timed out") => {
                None
            }
            other => panic!("run {run}: the live waiter did not get the lock: {other:?}"),
        };
        if let Some(live_ok) = live_ok {
            waited.push(clock::between(queued_at, live_ok));
            live.send(&Command::Release);
            let Reply::Released { result, .. } = live.reply(Duration::from_secs(5)).await else {
                panic!("run {run}: the live waiter did not release");
            };
            assert_eq!(result, "ok", "run {run}: the live waiter's release");
        }
        let later_ok = later.await.expect("waiter task");
        inversions += usize::from(live_ok.is_none_or(|live_ok| later_ok < live_ok));
        purged += usize::from(watch.least < 0);
        least = least.min(watch.least);
    }
    let sweep = checker::sweep(&History::read(&bed.scenario.history_path()));
    let leaks = checker::server_settled(&bed.redis, &bed.prefix).await;
    let shortest = waited.iter().min().copied().unwrap_or_default();
    let s = &mut bed.scenario;
    s.figure("runs", runs);
    s.figure("stalls", format!("{stalls}x{}ms/{}", stall.as_millis(), WAITER_TIMEOUT.as_millis()));
    s.figure("live_purged", format!("{purged}/{runs}"));
    s.figure("place_left_min_ms", least);
    s.figure(
        "waited_min_x_timeout",
        format!("{:.1}", shortest.as_secs_f64() / WAITER_TIMEOUT.as_secs_f64()),
    );
    s.figure("fifo_inversions", format!("{inversions}/{runs}"));
    s.figure("violations", sweep.violations);
    s.figure("leaked_keys", leaks.count());
    s.report();
    Live { purged, inversions, least_left_ms: least, waited, sweep, leaks }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f07_fair_lock_keeps_a_slow_live_waiter() {
    let runs = run::count(2, 30);
    let live = live_waiter("F7-live", STALL, STALLS, runs).await;
    assert_eq!(
        live.purged, 0,
        "a live waiter lost its place (least time left {} ms)",
        live.least_left_ms
    );
    assert_eq!(live.inversions, 0, "the lock skipped a live waiter's turn");
    assert!(
        live.waited.iter().all(|waited| *waited >= LIVE_WAIT),
        "the live waiter got in while the lock was held: {:?}",
        live.waited
    );
    assert_eq!(live.sweep.violations, 0, "{:?}", live.sweep.examples);
    assert_eq!(live.leaks.count(), 0, "left in Redis: {:?}", live.leaks);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f07_control_waiter_stalled_past_its_timeout_is_purged() {
    let live = live_waiter("F7-live-control", LONG_STALL, 1, 1).await;
    assert_eq!(live.purged, 1, "watch blind: a waiter stopped past its timeout kept its place");
    assert_eq!(live.inversions, 1, "the waiter behind a purged one was not served first");
}
