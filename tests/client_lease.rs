//! The Redis backend's client lease (`RedisBackendBuilder::client_lease`): every watchdog hold
//! of an exclusive lock lives on one lease key per client, `<prefix>~lease:<client id>:<session>`.
//!
//! Covered here, each against a private `redis-server` from the fixture in `tests/support`:
//! holds record the lease key and outlive many lease periods (and their own keys' long life);
//! every grant extends the lease key; one `PEXPIRE` per renewal tick renews every hold
//! (measured against a backend without the lease); a lease key that is gone frees every lock
//! at once, its holds are lost, releases of them answer "not held" and touch nobody else's
//! lock, and the next acquire (or renewal) starts a new session and never brings the old key
//! back; a lock key deleted behind its holder's back is noticed at its next refresh; fair,
//! read-write, semaphore, fixed-lease and other-length holds keep leases of their own; a paused
//! and a restarted server end the session; a hold with a lease of its own (another length, a
//! hand-off) that is re-entered at the client lease's length keeps its lock; a Redis Cluster
//! refuses the option. Also: a re-entry off the client lease (a fixed lease, another length)
//! does not make a hold on it last longer, by its deadline or when the server stalls, while one
//! on the lease extends it; another client (plain or with a lease of its own) cannot join a
//! hold on the lease through its holder's id; Redlock refuses a node built with the client
//! lease; and a lease that ran out while idle is replaced without counting in
//! `tower_lock_client_leases_ended_total`, which counts one that ran out under a hold.

mod support;

use std::time::Duration;

use futures_util::future::{join_all, select_all};
use support::{RedisServer, RespValue};
use tokio::time::{Instant, timeout};
use tower_lock::{ConfigError, Lease, LockClient, LockError, LockGuard, RedisBackend};

/// The lock prefix of every client here.
const PREFIX: &str = "t:";
/// The client lease of most tests: renewals every 100 ms.
const LEASE: Duration = Duration::from_millis(300);
/// Scheduling slack allowed past a deadline.
const TOLERANCE: Duration = Duration::from_millis(150);
/// How soon a waiter gets a lock after a release it was told of (its own retry timer is
/// seconds away in the tests that use this).
const PROMPT: Duration = Duration::from_secs(1);

type Guard = LockGuard<RedisBackend>;

/// A client of `url` whose backend has the client lease on, with watchdog leases of `lease`.
async fn leased_client(url: &str, lease: Duration) -> LockClient<RedisBackend> {
    client(url, lease, true).await
}

/// A client of `url` without the client lease, with watchdog leases of `lease`.
async fn plain_client(url: &str, lease: Duration) -> LockClient<RedisBackend> {
    client(url, lease, false).await
}

async fn client(url: &str, lease: Duration, client_lease: bool) -> LockClient<RedisBackend> {
    let backend = support::redis_backend(url)
        .client_lease(client_lease)
        .connect()
        .await
        .expect("connect");
    LockClient::builder(backend)
        .prefix(PREFIX)
        .lease(Lease::watchdog(lease))
        .build()
        .expect("valid configuration")
}

/// The Redis key of lock `key`.
fn lock_name(key: &str) -> String {
    format!("{PREFIX}{{{key}}}")
}

/// Every client lease key on the server, sorted.
fn lease_keys(server: &RedisServer) -> Vec<String> {
    match server.cmd(&["KEYS", "*~lease:*"]) {
        RespValue::Array(Some(keys)) => {
            let mut keys: Vec<String> = keys.iter().filter_map(RespValue::as_str).collect();
            keys.sort();
            keys
        }
        other => panic!("unexpected KEYS reply: {other:?}"),
    }
}

/// The only client lease key on the server.
fn the_lease_key(server: &RedisServer) -> String {
    let keys = lease_keys(server);
    assert_eq!(keys.len(), 1, "one client lease key: {keys:?}");
    keys.into_iter().next().expect("one key")
}

/// The client id and session number in the lease key `key`, checking its form:
/// `t:~lease:<32 hex digits>:<session>`.
fn parse_lease_key(key: &str) -> (String, u64) {
    let rest = key
        .strip_prefix(&format!("{PREFIX}~lease:"))
        .unwrap_or_else(|| panic!("{key:?} is not named <prefix>~lease:…"));
    let (id, session) = rest
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("{key:?} has no session number"));
    assert!(
        id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "{key:?}: the client id is not 32 hex digits"
    );
    let session = session
        .parse()
        .unwrap_or_else(|_| panic!("{key:?}: the session is not a number"));
    (id.to_owned(), session)
}

/// What the lock at `name` is in Redis.
#[derive(Debug, PartialEq, Eq)]
enum Record {
    /// No key.
    Missing,
    /// A single hold: the string written by `SET NX`.
    Single(String),
    /// A hash, as `(field, value)` pairs.
    Hash(Vec<(String, String)>),
}

fn record(server: &RedisServer, name: &str) -> Record {
    match server.cmd(&["TYPE", name]).as_str().as_deref() {
        Some("none") => Record::Missing,
        Some("string") => Record::Single(
            server
                .cmd(&["GET", name])
                .as_str()
                .expect("a string's value"),
        ),
        Some("hash") => match server.cmd(&["HGETALL", name]) {
            RespValue::Array(Some(items)) => Record::Hash(
                items
                    .chunks(2)
                    .map(|pair| {
                        let text = |value: &RespValue| value.as_str().unwrap_or_default();
                        (text(&pair[0]), text(&pair[1]))
                    })
                    .collect(),
            ),
            other => panic!("unexpected HGETALL reply: {other:?}"),
        },
        other => panic!("{name} is of type {other:?}, not a lock"),
    }
}

/// The client lease the lock at `name` records: a single hold's text after its newline, or a
/// hash's `~s` field.
fn recorded_lease(server: &RedisServer, name: &str) -> Option<String> {
    match record(server, name) {
        Record::Missing => None,
        Record::Single(value) => value.split_once('\n').map(|(_, lease)| lease.to_owned()),
        Record::Hash(fields) => fields
            .into_iter()
            .find(|(field, _)| field == "~s")
            .map(|(_, lease)| lease),
    }
}

/// `PTTL key`.
fn pttl(server: &RedisServer, key: &str) -> i64 {
    server.cmd(&["PTTL", key]).as_int()
}

/// `EXISTS key`.
fn exists(server: &RedisServer, key: &str) -> bool {
    server.cmd(&["EXISTS", key]).as_int() == 1
}

/// A duration in whole milliseconds, to compare with a `PTTL`.
fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).expect("a short duration")
}

/// Asserts that `client` cannot take `key` right now: `try_acquire` answers `WaitTimeout`.
async fn assert_busy(client: &LockClient<RedisBackend>, key: &str, why: &str) {
    match client.lock(key).try_acquire().await {
        Err(LockError::WaitTimeout { .. }) => {}
        Ok(guard) => panic!("{why}: {key} was free, got {guard:?}"),
        Err(error) => panic!("{why}: {key}: unexpected error {error:?}"),
    }
}

/// `key` taken by one holder of `client`, then re-entered: the outer and the inner guard.
async fn reentered(client: &LockClient<RedisBackend>, key: &str) -> (Guard, Guard) {
    client
        .holder()
        .scope(async {
            let outer = client.lock(key).acquire().await.expect("acquire");
            let inner = client.lock(key).try_acquire().await;
            (outer, inner.expect("a re-entry does not wait for itself"))
        })
        .await
}

/// `guard`, another client's hold of `key`, is kept: not lost, recorded once under its
/// holder, and `client` cannot take the lock.
async fn assert_kept(
    server: &RedisServer,
    client: &LockClient<RedisBackend>,
    key: &str,
    guard: &Guard,
) {
    assert!(!guard.is_lost(), "{key}: its holder keeps it");
    let count = support::hold_count(
        |args| server.cmd(args),
        &lock_name(key),
        guard.holder().id(),
    );
    assert_eq!(count, Some(1), "{key} names its holder");
    assert_busy(client, key, "another client holds it").await;
}

/// Holds `guards` for `period`, failing the test as soon as one of them is lost.
async fn hold_unlost(guards: &[&Guard], period: Duration, what: &str) {
    let lost = select_all(guards.iter().map(|guard| Box::pin(guard.lost())));
    if let Ok(((), i, _)) = timeout(period, lost).await {
        panic!(
            "{what}: {} was lost while held (remaining {:?})",
            guards[i].key(),
            guards[i].remaining()
        );
    }
}

/// Every hold (a single hold, a re-entered lock, a contended lock that became a hash) records
/// the client lease key, whose TTL is one lease, while the locks' own keys live far longer; the
/// holds outlive many lease periods and their own keys' first life (20 leases) without being
/// lost, nobody else can take them, and inspect names their holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_live_on_the_client_lease() {
    let lease = Duration::from_millis(200);
    let server = RedisServer::start();
    let a = leased_client(&server.url(), lease).await;
    let b = plain_client(&server.url(), lease).await;

    let single = a.lock("single").acquire().await.expect("acquire");
    let (outer, inner) = reentered(&a, "nested").await;
    assert_eq!(inner.hold_count(), 2);
    let contended = a.lock("contended").acquire().await.expect("acquire");
    assert_busy(&b, "contended", "held by A").await;

    let lease_key = the_lease_key(&server);
    let (_, session) = parse_lease_key(&lease_key);
    assert_eq!(session, 1, "the first session: {lease_key}");
    let lease_left = pttl(&server, &lease_key);
    assert!(
        0 < lease_left && lease_left <= millis(lease),
        "the lease key lives one lease: PTTL {lease_left} ms"
    );

    // The single hold is the `SET NX` string, with the lease key after a newline.
    let id = single.holder().id();
    match record(&server, &lock_name("single")) {
        Record::Single(value) => {
            let owner = format!("{}:{id}", id.len());
            assert!(value.starts_with(&owner), "{value:?} names {owner:?}");
            assert!(
                value.ends_with(&format!("\n{lease_key}")),
                "{value:?} records the lease key {lease_key:?}"
            );
        }
        other => panic!("the single hold is a string, found {other:?}"),
    }
    // The re-entered and the contended locks are hashes naming the lease in `~s`.
    for (key, guard, count) in [("nested", &outer, "2"), ("contended", &contended, "1")] {
        let Record::Hash(fields) = record(&server, &lock_name(key)) else {
            panic!("{key} is a hash");
        };
        let field = |name: &str| {
            fields
                .iter()
                .find(|(field, _)| field == name)
                .map(|(_, value)| value.as_str())
        };
        assert_eq!(field("~s"), Some(lease_key.as_str()), "{key}: {fields:?}");
        assert_eq!(field(guard.holder().id()), Some(count), "{key}: {fields:?}");
    }
    let check_keys = |when: &str| {
        for key in ["single", "nested", "contended"] {
            let name = lock_name(key);
            assert_eq!(
                recorded_lease(&server, &name).as_deref(),
                Some(lease_key.as_str()),
                "{when}: {name} records the lease"
            );
            let left = pttl(&server, &name);
            assert!(
                left > 5 * millis(lease),
                "{when}: {name} lives far longer than the lease: PTTL {left} ms"
            );
        }
    };
    check_keys("just acquired");

    // Inspect sees through the lease: the holder, its count, and no more than a lease left.
    for (key, guard, count) in [("single", &single, 1), ("nested", &outer, 2)] {
        let info = a.inspect(key).await.expect("inspect");
        let found = info
            .holder(guard.holder().id())
            .unwrap_or_else(|| panic!("{key}: inspect names the holder: {info:?}"));
        assert_eq!(found.hold_count, count, "{key}: {info:?}");
        let left = found.remaining_lease.expect("a lease");
        assert!(
            left <= lease,
            "{key}: at most the client lease left: {info:?}"
        );
    }

    // 4.5 s: over 20 leases, past the 4 s the locks' keys were first given.
    let guards = [&single, &outer, &inner, &contended];
    hold_unlost(&guards, Duration::from_millis(4500), "holding on the lease").await;
    for key in ["single", "nested", "contended"] {
        assert_busy(&b, key, "still held on the lease").await;
    }
    assert_eq!(
        the_lease_key(&server),
        lease_key,
        "the same session all along"
    );
    let lease_left = pttl(&server, &lease_key);
    assert!(
        0 < lease_left && lease_left <= millis(lease),
        "the lease key still lives one lease: PTTL {lease_left} ms"
    );
    check_keys("after 4.5 s");

    for guard in [single, inner, outer, contended] {
        guard.release().await.expect("release");
    }
    for key in ["single", "nested", "contended"] {
        assert!(!exists(&server, &lock_name(key)), "{key} is gone");
        let next = b.lock(key).try_acquire().await.expect("free once released");
        next.release().await.expect("release");
    }
}

/// The commands a server ran, from `INFO commandstats`.
#[derive(Clone, Copy, Debug, Default)]
struct Calls {
    /// `PEXPIRE`, sent by the client or run by a script.
    pexpire: u64,
    /// Script calls: `EVALSHA` and `EVAL`.
    scripts: u64,
    /// Every command but `INFO`.
    total: u64,
}

impl Calls {
    fn read(server: &RedisServer) -> Self {
        let stats = server.info("commandstats").expect("INFO commandstats");
        let total = stats
            .lines()
            .filter(|line| line.starts_with("cmdstat_") && !line.starts_with("cmdstat_info:"))
            .filter_map(|line| {
                let calls = line.split_once("calls=")?.1;
                calls.split(',').next()?.parse::<u64>().ok()
            })
            .sum();
        Self {
            pexpire: support::command_calls(&stats, "pexpire"),
            scripts: support::command_calls(&stats, "evalsha")
                + support::command_calls(&stats, "eval"),
            total,
        }
    }

    fn since(self, before: Self) -> Self {
        Self {
            pexpire: self.pexpire - before.pexpire,
            scripts: self.scripts - before.scripts,
            total: self.total - before.total,
        }
    }
}

/// Holds `count` locks of `client` and measures what the server runs over `window`, once
/// every hold has had its first renewal.
async fn renewal_load(
    server: &RedisServer,
    client: &LockClient<RedisBackend>,
    count: usize,
    window: Duration,
) -> Calls {
    let acquires = (0..count).map(|i| client.lock(format!("many:{i}")).acquire());
    let guards: Vec<Guard> = join_all(acquires)
        .await
        .into_iter()
        .map(|guard| guard.expect("acquire"))
        .collect();
    let all: Vec<&Guard> = guards.iter().collect();
    // Two leases: every hold has been renewed (and, on the client lease, its key refreshed).
    hold_unlost(&all, 2 * LEASE, "before the window").await;
    let before = Calls::read(server);
    hold_unlost(&all, window, "during the window").await;
    let calls = Calls::read(server).since(before);
    for guard in guards {
        guard.release().await.expect("release");
    }
    calls
}

/// With the client lease, one `PEXPIRE` of the lease key per renewal tick renews every hold,
/// and each lock's own key is refreshed (owner-checked) only now and then: 200 held locks cost
/// the server a small fraction of the commands a backend without the lease runs, which extends
/// each lock every tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_command_renews_every_hold() {
    const LOCKS: usize = 200;
    // Four leases: about twelve ticks. A lock's own key lives 20 leases and is refreshed about
    // once every ten, so at most once in the window.
    let window = 4 * LEASE;
    let server = RedisServer::start();

    let plain = plain_client(&server.url(), LEASE).await;
    let without = renewal_load(&server, &plain, LOCKS, window).await;
    drop(plain);
    let leased = leased_client(&server.url(), LEASE).await;
    let with = renewal_load(&server, &leased, LOCKS, window).await;
    // Renewal ticks of the backend without the lease: one script call renews all 200 locks.
    let ticks = without.scripts;
    println!(
        "{LOCKS} locks over {window:?}: without the client lease {without:?}, with it {with:?}"
    );

    assert!(
        ticks >= 6,
        "renewals ran during the window (lease {LEASE:?}): {without:?}"
    );
    assert!(
        without.pexpire >= ticks * LOCKS as u64 / 2,
        "the baseline extends every lock each tick: {without:?}"
    );
    assert!(
        with.pexpire >= ticks / 2,
        "the lease key is extended every tick: {with:?}, {ticks} ticks without"
    );
    assert!(
        with.pexpire <= 2 * ticks + LOCKS as u64,
        "one PEXPIRE per tick, and each lock's key refreshed at most once: {with:?}, \
         {ticks} ticks without"
    );
    assert!(
        with.scripts <= 2 * ticks,
        "at most one renewal script call per tick: {with:?}, {ticks} ticks without"
    );
    assert!(
        with.pexpire * 5 <= without.pexpire,
        "PEXPIREs with the lease are a small fraction of those without: {with:?} vs {without:?}"
    );
    assert!(
        with.total * 5 <= without.total,
        "commands with the lease are a small fraction of those without: {with:?} vs {without:?}"
    );
}

/// Deleting the lease key frees every lock on it at once: a lock whose key is still there
/// inspects as free and another client takes it without waiting; every guard on the lease is
/// lost at the next renewal, well before its own deadline; releasing those guards leaves the
/// new owner's locks alone; and the next acquire of the first client starts session 2, never
/// bringing back the old lease key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lapsed_lease_frees_every_lock_and_loses_every_hold() {
    let server = RedisServer::start();
    let a = leased_client(&server.url(), LEASE).await;
    let b = plain_client(&server.url(), LEASE).await;
    let keys = ["k0", "k1", "k2", "k3", "contended"];
    let mut guards = Vec::new();
    for key in keys {
        guards.push(a.lock(key).acquire().await.expect("acquire"));
    }
    assert_busy(&b, "contended", "held by A").await;
    // A few renewals on the lease first.
    let all: Vec<&Guard> = guards.iter().collect();
    hold_unlost(&all, 2 * LEASE, "before the lease key is deleted").await;
    let lease_key = the_lease_key(&server);
    let (id, session) = parse_lease_key(&lease_key);
    assert_eq!(session, 1);
    let lost = tokio::spawn(join_all(guards.iter().map(|guard| {
        let lost = guard.lost();
        async move {
            lost.await;
            Instant::now()
        }
    })));

    assert_eq!(server.cmd(&["DEL", &lease_key]).as_int(), 1);
    let deleted_at = Instant::now();
    for key in keys {
        // The lock's key is still there, naming a lease that is gone: nobody holds it.
        assert!(
            exists(&server, &lock_name(key)),
            "{key}'s key is still there"
        );
        let info = a.inspect(key).await.expect("inspect");
        assert!(!info.is_locked(), "{key} inspects as free: {info:?}");
    }
    let mut theirs = Vec::new();
    for key in keys {
        let started = Instant::now();
        let guard = b.lock(key).try_acquire().await;
        let guard = guard.unwrap_or_else(|error| panic!("{key} is free: {error:?}"));
        assert!(started.elapsed() < PROMPT, "{key} was taken at once");
        theirs.push(guard);
    }

    let lost_at = timeout(LEASE + TOLERANCE, lost)
        .await
        .expect("every hold on the deleted lease is lost within a lease")
        .expect("lost task");
    for (guard, at) in guards.iter().zip(&lost_at) {
        let after = at.saturating_duration_since(deleted_at);
        println!(
            "{} lost {after:?} after the lease key was deleted",
            guard.key()
        );
        assert!(guard.is_lost());
        assert!(
            guard.remaining() > Duration::ZERO,
            "{}: lost by a renewal, before its own deadline",
            guard.key()
        );
    }

    // A new acquire works, on a new session; the old lease key stays gone.
    let fresh = a
        .lock("fresh")
        .acquire()
        .await
        .expect("acquire after the lease ran out");
    let new_key = the_lease_key(&server);
    assert_eq!(
        parse_lease_key(&new_key),
        (id, 2),
        "the same client, session 2: {new_key}"
    );
    assert!(
        !exists(&server, &lease_key),
        "the old lease key is not recreated"
    );
    assert_eq!(
        recorded_lease(&server, &lock_name("fresh")).as_deref(),
        Some(new_key.as_str())
    );

    // The lost guards' releases free nothing of B's.
    for guard in guards {
        let released = guard.release().await;
        assert!(matches!(released, Err(LockError::Lost)), "{released:?}");
    }
    for (key, guard) in keys.iter().zip(&theirs) {
        assert_kept(&server, &a, key, guard).await;
    }
    assert!(
        !exists(&server, &lease_key),
        "the old lease key is not recreated"
    );
    for guard in theirs {
        guard.release().await.expect("release");
    }
    fresh.release().await.expect("release");
}

/// A release of a hold whose client lease ran out answers "not held" and deletes the lapsed
/// lock (a single hold, a re-entered hash), frees nothing that another client took since, and
/// wakes a waiter of the lock at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_after_the_lease_ran_out_is_not_held() {
    // A long lease: the first renewal is a second away, so the releases reach Redis first.
    let lease = Duration::from_secs(3);
    let server = RedisServer::start();
    let a = leased_client(&server.url(), lease).await;
    let b = plain_client(&server.url(), lease).await;

    let solo = a.lock("solo").acquire().await.expect("acquire");
    let (outer, inner) = reentered(&a, "nested").await;
    let taken = a.lock("taken").acquire().await.expect("acquire");
    let waited = a.lock("waited").acquire().await.expect("acquire");
    // B waits for "waited": its own retry timer is the lease key's 3 s.
    let channel = format!("{}:released", lock_name("waited"));
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move {
            let acquired = b
                .lock("waited")
                .wait(Duration::from_secs(10))
                .acquire()
                .await;
            (Instant::now(), acquired)
        })
    };
    support::eventually(Duration::from_secs(2), "B waits", || {
        b.waiters() == 1 && support::numsub(&server, &channel) == 1
    })
    .await;

    let lease_key = the_lease_key(&server);
    assert_eq!(server.cmd(&["DEL", &lease_key]).as_int(), 1);

    let released = solo.release().await;
    assert!(
        matches!(released, Err(LockError::NotHeld)),
        "solo: {released:?}"
    );
    assert!(
        !exists(&server, &lock_name("solo")),
        "the lapsed single hold is deleted"
    );

    let released = inner.release().await;
    assert!(
        matches!(released, Err(LockError::NotHeld)),
        "nested: {released:?}"
    );
    assert!(
        !exists(&server, &lock_name("nested")),
        "the lapsed hash is deleted"
    );
    let released = outer.release().await;
    assert!(
        matches!(released, Err(LockError::NotHeld | LockError::Lost)),
        "nested, outer: {released:?}"
    );

    let theirs = b.lock("taken").try_acquire().await.expect("lapsed: free");
    let released = taken.release().await;
    assert!(
        matches!(released, Err(LockError::NotHeld)),
        "taken: {released:?}"
    );
    assert_kept(&server, &a, "taken", &theirs).await;

    let released = waited.release().await;
    let released_at = Instant::now();
    assert!(
        matches!(released, Err(LockError::NotHeld)),
        "waited: {released:?}"
    );
    let (got_at, acquired) = timeout(Duration::from_secs(12), waiter)
        .await
        .expect("the waiter ends")
        .expect("waiter task");
    let woke = got_at.saturating_duration_since(released_at);
    println!("the waiter got the lapsed lock {woke:?} after the release");
    let next = acquired.expect("the waiter gets the lapsed lock");
    assert!(
        woke < PROMPT,
        "the release woke the waiter: it got the lock after {woke:?}"
    );

    assert!(
        !exists(&server, &lease_key),
        "the old lease key is not recreated"
    );
    theirs.release().await.expect("release");
    next.release().await.expect("release");
}

/// An acquire that finds the lease key gone starts session 2 at once, and the holds of session
/// 1 are lost at their next renewal (before their own deadlines), even though that renewal no
/// longer sends the old lease key anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_after_the_lease_ran_out_starts_a_new_session() {
    let lease = Duration::from_secs(3);
    let server = RedisServer::start();
    let a = leased_client(&server.url(), lease).await;
    let b = plain_client(&server.url(), lease).await;
    let old = a.lock("old").acquire().await.expect("acquire");
    let lease_key = the_lease_key(&server);
    assert_eq!(server.cmd(&["DEL", &lease_key]).as_int(), 1);
    let deleted_at = Instant::now();

    let fresh = a.lock("fresh").acquire().await.expect("acquire");
    let new_key = the_lease_key(&server);
    assert_eq!(parse_lease_key(&new_key).1, 2, "session 2: {new_key}");
    assert_eq!(
        recorded_lease(&server, &lock_name("fresh")).as_deref(),
        Some(new_key.as_str())
    );

    timeout(lease, old.lost())
        .await
        .expect("the old session's hold is lost at its next renewal");
    println!(
        "old hold lost {:?} after the lease key was deleted",
        deleted_at.elapsed()
    );
    assert!(
        old.remaining() > Duration::ZERO,
        "lost by a renewal, before its deadline"
    );
    let theirs = b.lock("old").try_acquire().await.expect("free");
    hold_unlost(&[&fresh], Duration::from_millis(1200), "the new session").await;
    assert_busy(&b, "fresh", "held on session 2").await;
    assert!(
        !exists(&server, &lease_key),
        "the old lease key is not recreated"
    );
    assert_eq!(lease_keys(&server), [new_key]);
    theirs.release().await.expect("release");
    fresh.release().await.expect("release");
}

/// A lock's key deleted behind its holder's back (by an operator, say) is noticed at that
/// lock's next owner-checked refresh, within half the key's life (10 leases): the guard is lost,
/// the other holds on the lease are not, and the lost guard's release leaves the next owner's
/// lock alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_lock_key_is_noticed_at_its_next_refresh() {
    let server = RedisServer::start();
    let a = leased_client(&server.url(), LEASE).await;
    let b = plain_client(&server.url(), LEASE).await;
    let doomed = a.lock("doomed").acquire().await.expect("acquire");
    let other = a.lock("other").acquire().await.expect("acquire");
    let lease_key = the_lease_key(&server);
    assert_eq!(server.cmd(&["DEL", &lock_name("doomed")]).as_int(), 1);
    let deleted_at = Instant::now();

    let lost = select_all([Box::pin(doomed.lost()), Box::pin(other.lost())]);
    let ((), i, _) = timeout(10 * LEASE + 2 * TOLERANCE, lost)
        .await
        .expect("the deleted lock is noticed within 10 leases");
    println!(
        "deleted lock key noticed {:?} after the DEL",
        deleted_at.elapsed()
    );
    assert_eq!(i, 0, "the deleted lock is the one lost");
    assert!(doomed.is_lost());
    assert!(!other.is_lost(), "the other hold on the lease is kept");
    assert_eq!(the_lease_key(&server), lease_key, "the session goes on");

    let theirs = b.lock("doomed").try_acquire().await.expect("free");
    let released = doomed.release().await;
    assert!(matches!(released, Err(LockError::Lost)), "{released:?}");
    assert!(!theirs.is_lost());
    assert_busy(&a, "doomed", "B holds it").await;
    hold_unlost(&[&other], LEASE, "the other hold").await;
    theirs.release().await.expect("release");
    other.release().await.expect("release");
}

/// Every grant on the client lease extends the lease key to a whole lease: a first hold
/// (`SET NX`), a re-entry and a grant of a contended lock (both by script).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_grant_extends_the_lease_key() {
    // Renewals are a second apart: the grants alone move the lease key here.
    let lease = Duration::from_secs(3);
    let server = RedisServer::start();
    let a = leased_client(&server.url(), lease).await;
    let b = plain_client(&server.url(), lease).await;
    let first = a.lock("first").acquire().await.expect("acquire");
    let lease_key = the_lease_key(&server);
    let shorten = || {
        assert_eq!(server.cmd(&["PEXPIRE", &lease_key, "500"]).as_int(), 1);
    };
    let assert_extended = |what: &str| {
        let left = pttl(&server, &lease_key);
        assert!(
            millis(lease) - 500 < left && left <= millis(lease),
            "{what} extends the lease key to a lease: PTTL {left} ms"
        );
    };
    assert_extended("the first grant");

    shorten();
    let single = a.lock("single").acquire().await.expect("acquire");
    assert!(
        matches!(record(&server, &lock_name("single")), Record::Single(_)),
        "a single hold"
    );
    assert_extended("a single hold");

    shorten();
    let holder = single.holder().clone();
    let again = holder
        .scope(a.lock("single").try_acquire())
        .await
        .expect("re-entry");
    assert_eq!(again.hold_count(), 2);
    assert_extended("a re-entry");

    let theirs = b.lock("contended").acquire().await.expect("acquire");
    let waiting = tokio::spawn({
        let a = a.clone();
        async move {
            a.lock("contended")
                .wait(Duration::from_secs(5))
                .acquire()
                .await
        }
    });
    support::eventually(Duration::from_secs(2), "A waits", || a.waiters() == 1).await;
    shorten();
    theirs.release().await.expect("release");
    let contended = waiting.await.expect("waiter task").expect("acquire");
    assert_eq!(
        recorded_lease(&server, &lock_name("contended")).as_deref(),
        Some(lease_key.as_str())
    );
    assert_extended("a contended grant");

    for guard in [again, single, first, contended] {
        guard.release().await.expect("release");
    }
}

/// With the client lease on, fair, read-write and semaphore holds, fixed leases, and watchdog
/// leases of another length than the client lease's keep leases of their own: their locks
/// name no lease key and live no longer than their own lease, and they stay held when the
/// client lease itself runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_holds_keep_leases_of_their_own() {
    let server = RedisServer::start();
    let a = leased_client(&server.url(), LEASE).await;
    let b = plain_client(&server.url(), LEASE).await;
    // The first watchdog hold sets the client lease's length.
    let on_lease = a.lock("on-lease").acquire().await.expect("acquire");
    let lease_key = the_lease_key(&server);
    assert_eq!(
        recorded_lease(&server, &lock_name("on-lease")).as_deref(),
        Some(lease_key.as_str())
    );

    let fixed = Duration::from_secs(10);
    let longer = 2 * LEASE;
    let fair = a.fair_lock("fair").acquire().await.expect("fair");
    let fixed_guard = a.lock("fixed").lease(Lease::fixed(fixed)).acquire().await;
    let fixed_guard = fixed_guard.expect("fixed");
    let longer_guard = a
        .lock("longer")
        .lease(Lease::watchdog(longer))
        .acquire()
        .await;
    let longer_guard = longer_guard.expect("longer");
    let write = a
        .read_write_lock("rw")
        .write()
        .acquire()
        .await
        .expect("write");
    let read = a
        .read_write_lock("rw-read")
        .read()
        .acquire()
        .await
        .expect("read");
    let permit = a.semaphore("sem", 2).acquire().await.expect("permit");
    let own: [(&Guard, Duration); 6] = [
        (&fair, LEASE),
        (&fixed_guard, fixed),
        (&longer_guard, longer),
        (&write, LEASE),
        (&read, LEASE),
        (&permit, LEASE),
    ];
    let check = |when: &str| {
        for (guard, lease) in own {
            let name = guard.key().as_str();
            assert_eq!(
                recorded_lease(&server, name),
                None,
                "{when}: {name} names no client lease: {:?}",
                record(&server, name)
            );
            let left = pttl(&server, name);
            assert!(
                0 < left && left <= millis(lease),
                "{when}: {name} lives its own lease of {lease:?}: PTTL {left} ms"
            );
        }
    };
    check("acquired");
    let renewed: Vec<&Guard> = own
        .iter()
        .map(|(guard, _)| *guard)
        .filter(|guard| guard.key().as_str() != lock_name("fixed"))
        .collect();
    let mut watched = renewed.clone();
    watched.push(&on_lease);
    hold_unlost(&watched, 3 * LEASE, "renewed").await;
    check("after a few renewals");
    drop(watched);

    // The lease key runs out with its only hold released: the others are not on it.
    on_lease.release().await.expect("release");
    support::eventually(3 * LEASE, "the lease key runs out", || {
        !exists(&server, &lease_key)
    })
    .await;
    hold_unlost(&renewed, 3 * LEASE, "with the client lease gone").await;
    check("with the client lease gone");
    for key in ["fair", "longer"] {
        assert_busy(&b, key, "held on a lease of its own").await;
    }
    for (guard, _) in own {
        assert!(!guard.is_lost(), "{} is held", guard.key());
    }
    for guard in [fair, fixed_guard, longer_guard, write, read, permit] {
        guard.release().await.expect("release");
    }
}

/// A server paused for longer than the lease: the holds on the lease are lost by their
/// deadline, another client takes their locks once it resumes, and the next acquire of the
/// paused client's backend starts a new session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_server_ends_the_session() {
    let server = RedisServer::start();
    let a = leased_client(&server.url(), LEASE).await;
    let b = plain_client(&server.url(), LEASE).await;
    let guards = [
        a.lock("p0").acquire().await.expect("acquire"),
        a.lock("p1").acquire().await.expect("acquire"),
    ];
    let all: Vec<&Guard> = guards.iter().collect();
    hold_unlost(&all, LEASE, "before the pause").await;
    let lease_key = the_lease_key(&server);
    let lost = join_all(guards.iter().map(LockGuard::lost));

    server.pause();
    let paused_at = Instant::now();
    let lost = timeout(LEASE + TOLERANCE, lost).await;
    tokio::time::sleep_until(paused_at + 2 * LEASE).await;
    server.resume();
    lost.expect("every hold is lost by its deadline while the server is paused");

    for key in ["p0", "p1"] {
        let theirs = b.lock(key).wait(Duration::from_secs(2)).acquire().await;
        let theirs = theirs.unwrap_or_else(|error| panic!("{key} is free after resume: {error:?}"));
        theirs.release().await.expect("release");
    }
    let fresh = a
        .lock("fresh")
        .acquire()
        .await
        .expect("acquire after resume");
    let new_key = the_lease_key(&server);
    assert_eq!(parse_lease_key(&new_key).1, 2, "session 2: {new_key}");
    assert!(
        !exists(&server, &lease_key),
        "the old lease key is not recreated"
    );
    hold_unlost(&[&fresh], 3 * LEASE, "on the new session").await;
    assert_busy(&b, "fresh", "held on session 2").await;
    fresh.release().await.expect("release");
    for guard in guards {
        let released = guard.release().await;
        assert!(matches!(released, Err(LockError::Lost)), "{released:?}");
    }
}

/// A Redis restart without persistence loses the lease key: every hold on it is lost, and
/// acquires work again on a new session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_server_ends_the_session() {
    let mut server = RedisServer::start();
    let a = leased_client(&server.url(), LEASE).await;
    let guards = [
        a.lock("r0").acquire().await.expect("acquire"),
        a.lock("r1").acquire().await.expect("acquire"),
    ];
    let lease_key = the_lease_key(&server);
    let lost = join_all(guards.iter().map(LockGuard::lost));

    server.restart();
    let restarted_at = Instant::now();
    timeout(LEASE + TOLERANCE, lost)
        .await
        .expect("every hold on the lease is lost after the restart");
    println!("holds lost {:?} after the restart", restarted_at.elapsed());

    let fresh = loop {
        match a.lock("fresh").try_acquire().await {
            Ok(guard) => break guard,
            Err(error) => {
                assert!(
                    restarted_at.elapsed() < Duration::from_secs(3),
                    "no acquire within 3 s of the restart: {error:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let new_key = the_lease_key(&server);
    let (_, session) = parse_lease_key(&new_key);
    assert!(session >= 2, "a new session: {new_key}");
    assert_ne!(new_key, lease_key, "the old lease key is not recreated");
    assert_eq!(
        recorded_lease(&server, &lock_name("fresh")).as_deref(),
        Some(new_key.as_str())
    );
    hold_unlost(&[&fresh], 3 * LEASE, "on the new session").await;
    // Connected after the restart: its first command does not meet a dropped connection.
    let b = plain_client(&server.url(), LEASE).await;
    assert_busy(&b, "fresh", "held on the new session").await;
    for key in ["r0", "r1"] {
        let theirs = b
            .lock(key)
            .try_acquire()
            .await
            .expect("free after the restart");
        theirs.release().await.expect("release");
    }
    fresh.release().await.expect("release");
    for guard in guards {
        let released = guard.release().await;
        assert!(matches!(released, Err(LockError::Lost)), "{released:?}");
    }
}

/// A hold with a lease of its own (a watchdog lease of another length) that its holder
/// re-enters at the client lease's length keeps the lock: the re-entry must not tie the lock to
/// a lease key that nothing renews for this hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_lease_hold_reentered_at_the_client_lease_length_is_kept() {
    let server = RedisServer::start();
    let a = leased_client(&server.url(), LEASE).await;
    let b = plain_client(&server.url(), LEASE).await;
    // Sets the client lease's length to LEASE.
    let anchor = a.lock("anchor").acquire().await.expect("acquire");
    let holder = a.holder();
    let (outer, inner) = holder
        .clone()
        .scope(async {
            let outer = a
                .lock("k")
                .lease(Lease::watchdog(2 * LEASE))
                .acquire()
                .await;
            let outer = outer.expect("acquire");
            assert_eq!(
                recorded_lease(&server, &lock_name("k")),
                None,
                "a lease of its own"
            );
            let inner = a.lock("k").try_acquire().await.expect("re-entry");
            (outer, inner)
        })
        .await;
    println!("after the re-entry: {:?}", record(&server, &lock_name("k")));
    // Nothing else keeps the client lease alive now.
    anchor.release().await.expect("release");

    hold_unlost(&[&outer, &inner], 6 * LEASE, "re-entered hold").await;
    assert_busy(&b, "k", "A holds it").await;
    inner.release().await.expect("release the re-entry");
    outer.release().await.expect("release");
}

/// A hold handed off to a local waiter has a lease of its own; when its holder re-enters it
/// (at the client lease's length, the default), the lock stays held even though no hold on the
/// client lease is left to renew the lease key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handed_off_hold_reentered_is_kept() {
    let server = RedisServer::start();
    let a = leased_client(&server.url(), LEASE).await;
    let b = plain_client(&server.url(), LEASE).await;
    let first = a.lock("k").acquire().await.expect("acquire");
    let holder = a.holder();
    let waiting = tokio::spawn(holder.clone().scope({
        let a = a.clone();
        async move { a.lock("k").wait(Duration::from_secs(5)).acquire().await }
    }));
    support::eventually(Duration::from_secs(2), "a local waiter", || {
        a.waiters() == 1
    })
    .await;
    first.release().await.expect("release");
    let handed = waiting
        .await
        .expect("waiter task")
        .expect("handed the lock");
    assert_eq!(handed.holder(), &holder);
    let name = lock_name("k");
    assert_eq!(
        recorded_lease(&server, &name),
        None,
        "a hand-off has a lease of its own: {:?}",
        record(&server, &name)
    );
    let inner = holder
        .clone()
        .scope(a.lock("k").try_acquire())
        .await
        .expect("re-entry");
    assert_eq!(inner.hold_count(), 2);
    println!("after the re-entry: {:?}", record(&server, &name));

    hold_unlost(&[&handed, &inner], 6 * LEASE, "re-entered hand-off").await;
    assert_busy(&b, "k", "A holds it").await;
    inner.release().await.expect("release the re-entry");
    handed.release().await.expect("release");
}

/// A Redis Cluster refuses the client lease at `connect` (its locks live on many nodes), while
/// the same builder without it connects.
#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_refuses_the_client_lease() {
    use tower_lock::error::BackendErrorKind;

    let node = RedisServer::start_with(&[
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
    ]);
    let added = node.cmd(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]);
    assert_eq!(added.as_str().as_deref(), Some("OK"), "{added:?}");
    support::eventually(Duration::from_secs(5), "the one-node cluster is up", || {
        node.info("cluster").is_ok()
            && node
                .cmd(&["CLUSTER", "INFO"])
                .as_str()
                .is_some_and(|info| info.contains("cluster_state:ok"))
    })
    .await;

    let refused = RedisBackend::cluster([node.url()])
        .client_lease(true)
        .connect()
        .await
        .expect_err("client_lease on a cluster");
    assert!(
        matches!(refused.kind(), BackendErrorKind::Unsupported { .. }),
        "{refused:?}"
    );
    let backend = RedisBackend::cluster([node.url()])
        .connect()
        .await
        .expect("the same cluster without the client lease");
    let locks = LockClient::builder(backend)
        .build()
        .expect("valid configuration");
    locks
        .lock("k")
        .acquire()
        .await
        .expect("acquire")
        .release()
        .await
        .expect("release");
}

/// A re-entry that does not live on the client lease (a fixed lease, a watchdog lease of
/// another length) does not make a hold that lives on it last longer: right after it, both
/// guards have no more than the client lease left; the lock still names the lease key; once
/// that key is deleted, both guards are lost within about a lease (not the re-entry's 10 s)
/// and another client takes the lock at once. A re-entry on the lease (the same length) keeps
/// its hold through many renewals, is lost with the lease too, and extends its hold as a
/// renewal does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentry_off_the_client_lease_does_not_extend_a_hold_on_it() {
    let long = Duration::from_secs(10);
    let server = RedisServer::start();
    let a = leased_client(&server.url(), LEASE).await;
    let b = plain_client(&server.url(), LEASE).await;
    let holder = a.holder();
    let reentries = [
        ("fixed", Lease::fixed(long)),
        ("longer", Lease::watchdog(long)),
        ("same", Lease::watchdog(LEASE)),
    ];
    let pairs: Vec<(Guard, Guard)> = holder
        .clone()
        .scope(async {
            let mut pairs = Vec::new();
            for (key, lease) in reentries {
                let outer = a.lock(key).acquire().await.expect("acquire");
                let inner = a.lock(key).lease(lease).try_acquire().await;
                let inner = inner.unwrap_or_else(|error| panic!("{key}: re-entry: {error:?}"));
                assert_eq!(inner.hold_count(), 2, "{key}: re-entered");
                pairs.push((outer, inner));
            }
            pairs
        })
        .await;
    let lease_key = the_lease_key(&server);
    let check = |when: &str| {
        for ((key, _), (outer, inner)) in reentries.iter().zip(&pairs) {
            for guard in [outer, inner] {
                let left = guard.remaining();
                assert!(
                    Duration::ZERO < left && left <= LEASE,
                    "{when}: {key}: at most the client lease left, not the re-entry's: {left:?}"
                );
            }
            assert_eq!(
                recorded_lease(&server, &lock_name(key)).as_deref(),
                Some(lease_key.as_str()),
                "{when}: {key} still lives on the client lease"
            );
        }
    };
    check("just re-entered");
    let all: Vec<&Guard> = pairs
        .iter()
        .flat_map(|(outer, inner)| [outer, inner])
        .collect();
    hold_unlost(&all, 4 * LEASE, "re-entered holds on the lease").await;
    check("after a few renewals");
    for (key, _) in reentries {
        assert_busy(&b, key, "held on the lease").await;
    }

    let lost = join_all(all.iter().map(|guard| guard.lost()));
    assert_eq!(server.cmd(&["DEL", &lease_key]).as_int(), 1);
    let deleted_at = Instant::now();
    timeout(LEASE + TOLERANCE, lost)
        .await
        .expect("every guard is lost within a lease of the lease key's end");
    println!(
        "re-entered holds lost {:?} after the lease key was deleted",
        deleted_at.elapsed()
    );
    for (key, _) in reentries {
        let started = Instant::now();
        let theirs = b.lock(key).try_acquire().await;
        let theirs = theirs.unwrap_or_else(|error| panic!("{key} is free: {error:?}"));
        assert!(started.elapsed() < PROMPT, "{key} was taken at once");
        theirs.release().await.expect("release");
    }
    for (outer, inner) in pairs {
        for guard in [inner, outer] {
            let released = guard.release().await;
            assert!(
                matches!(released, Err(LockError::Lost | LockError::NotHeld)),
                "{released:?}"
            );
        }
    }

    // A re-entry on the lease extends its hold as a renewal does: seen on a client whose first
    // renewal is a second away, re-entering once some time has passed (the time is the point
    // here, not a signal).
    let slow = leased_client(&server.url(), Duration::from_secs(3)).await;
    let (outer, inner, fresh) = slow
        .holder()
        .scope(async {
            let outer = slow.lock("slow").acquire().await.expect("acquire");
            let fresh = outer.remaining();
            tokio::time::sleep(Duration::from_millis(400)).await;
            let inner = slow.lock("slow").try_acquire().await.expect("re-entry");
            (outer, inner, fresh)
        })
        .await;
    let left = inner.remaining();
    assert!(
        left + TOLERANCE >= fresh,
        "the re-entry on the lease extended the hold: {left:?} left, {fresh:?} after the grant"
    );
    inner.release().await.expect("release");
    outer.release().await.expect("release");
}

/// A hold on the client lease re-entered with a lease of its own (fixed, 10 s) is lost by the
/// client lease's deadline when the server cannot be reached (paused), as if it had not been
/// re-entered: the re-entry did not push the deadline past the lease key's life, so the
/// holder stops believing it holds the lock before another client can take it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentry_off_the_client_lease_is_lost_by_the_lease_deadline() {
    let server = RedisServer::start();
    let a = leased_client(&server.url(), LEASE).await;
    let b = plain_client(&server.url(), LEASE).await;
    let holder = a.holder();
    let (outer, inner) = holder
        .clone()
        .scope(async {
            let outer = a.lock("x").acquire().await.expect("acquire");
            let inner = a.lock("x").lease(Lease::fixed(Duration::from_secs(10)));
            (outer, inner.try_acquire().await.expect("re-entry"))
        })
        .await;
    assert_eq!(inner.hold_count(), 2);
    hold_unlost(&[&outer, &inner], LEASE, "before the pause").await;
    let lost = join_all([outer.lost(), inner.lost()]);

    server.pause();
    let paused_at = Instant::now();
    let lost = timeout(LEASE + TOLERANCE, lost).await;
    tokio::time::sleep_until(paused_at + 2 * LEASE).await;
    server.resume();
    lost.expect("both guards are lost by the client lease's deadline, not the re-entry's");

    let theirs = b.lock("x").wait(Duration::from_secs(2)).acquire().await;
    let theirs = theirs.expect("x is free once the lease key ran out");
    theirs.release().await.expect("release");
    for guard in [inner, outer] {
        let released = guard.release().await;
        assert!(
            matches!(released, Err(LockError::Lost | LockError::NotHeld)),
            "{released:?}"
        );
    }
}

/// Another client cannot join, through the holder's id (`LockRequest::holder`), a hold that
/// lives on a client lease it does not renew: a plain client and one with a client lease of
/// its own are both refused as for a lock another owner holds, and the hold is left as it was
/// (one hold, on the first client's lease). A waiter of the same holder in the other client
/// gets the lock once it is released, a hold of its own that outlives the first client's
/// lease; so does a client with a lease of its own, on its own lease key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_client_cannot_join_a_hold_on_the_client_lease() {
    let server = RedisServer::start();
    let a = leased_client(&server.url(), LEASE).await;
    let plain = plain_client(&server.url(), LEASE).await;
    let leased = leased_client(&server.url(), LEASE).await;
    let c = plain_client(&server.url(), LEASE).await;
    let held = a.lock("x").acquire().await.expect("acquire");
    let holder = held.holder().clone();
    let a_lease = the_lease_key(&server);
    let (a_id, _) = parse_lease_key(&a_lease);

    for (who, b) in [("a plain client", &plain), ("a leased client", &leased)] {
        for _ in 0..2 {
            match b.lock("x").holder(&holder).try_acquire().await {
                Err(LockError::WaitTimeout { .. }) => {}
                Ok(guard) => panic!("{who} joined A's hold on its lease: {guard:?}"),
                Err(error) => panic!("{who}: unexpected error {error:?}"),
            }
        }
    }
    let count = support::hold_count(|args| server.cmd(args), &lock_name("x"), holder.id());
    assert_eq!(count, Some(1), "A's one hold, nobody joined it");
    assert_eq!(
        recorded_lease(&server, &lock_name("x")).as_deref(),
        Some(a_lease.as_str()),
        "still on A's lease"
    );
    hold_unlost(&[&held], LEASE, "A's hold").await;

    let waiting = tokio::spawn({
        let plain = plain.clone();
        let holder = holder.clone();
        async move {
            let acquired = plain
                .lock("x")
                .holder(&holder)
                .wait(Duration::from_secs(5))
                .acquire()
                .await;
            (Instant::now(), acquired)
        }
    });
    support::eventually(Duration::from_secs(2), "the plain client waits", || {
        plain.waiters() == 1
    })
    .await;
    held.release().await.expect("release");
    let released_at = Instant::now();
    let (got_at, acquired) = waiting.await.expect("waiter task");
    let theirs = acquired.expect("x once A released it");
    assert!(
        got_at.saturating_duration_since(released_at) < PROMPT,
        "the plain client got x promptly"
    );
    assert_eq!(theirs.hold_count(), 1, "a hold of its own");
    assert_eq!(theirs.holder(), &holder);
    assert_eq!(
        recorded_lease(&server, &lock_name("x")),
        None,
        "no lease key"
    );
    // Past A's lease: its key runs out with nothing on it.
    hold_unlost(&[&theirs], 3 * LEASE, "the plain client's hold").await;
    assert!(!exists(&server, &a_lease), "A's lease key ran out");
    assert_busy(&c, "x", "the plain client holds it").await;
    theirs.release().await.expect("release");

    let theirs = leased.lock("x").holder(&holder).try_acquire().await;
    let theirs = theirs.expect("x is free");
    assert_eq!(theirs.hold_count(), 1);
    let on = recorded_lease(&server, &lock_name("x")).expect("on a client lease");
    assert_ne!(
        parse_lease_key(&on).0,
        a_id,
        "on the leased client's own lease: {on}"
    );
    hold_unlost(&[&theirs], 2 * LEASE, "the leased client's hold").await;
    assert_busy(&c, "x", "the leased client holds it").await;
    theirs.release().await.expect("release");
}

/// A Redlock backend refuses, at `build`, a node given as a backend built with the client
/// lease (its grants would live on a lease key that Redlock's renewals never extend), whichever
/// node it is, with an error naming the `nodes` setting; the same nodes without the lease build
/// a backend that takes and releases a lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_refuses_a_node_with_a_client_lease() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let mut plain = Vec::new();
    let mut leased = Vec::new();
    for server in &servers {
        let backend = support::redis_backend(server.url()).connect().await;
        plain.push(backend.expect("connect"));
        let backend = support::redis_backend(server.url())
            .client_lease(true)
            .connect()
            .await;
        leased.push(backend.expect("connect"));
    }
    let redlock = |leased_at: Option<usize>| {
        let mut builder = support::redlock_backend(Vec::<String>::new());
        for i in 0..servers.len() {
            let node = if leased_at == Some(i) {
                &leased[i]
            } else {
                &plain[i]
            };
            builder = builder.backend(node.clone());
        }
        builder.build()
    };
    for at in 0..servers.len() {
        let refused = redlock(Some(at)).expect_err("a node with a client lease");
        assert!(
            matches!(
                refused,
                ConfigError::Invalid {
                    setting: "nodes",
                    ..
                }
            ),
            "node {at}: {refused:?}"
        );
        assert!(
            refused.to_string().contains("client lease"),
            "node {at}: the error says why: {refused}"
        );
    }
    let backend = redlock(None).expect("the same nodes without the client lease");
    let locks = LockClient::builder(backend)
        .prefix(PREFIX)
        .lease(Lease::watchdog(LEASE))
        .build()
        .expect("valid configuration");
    let guard = locks.lock("k").acquire().await.expect("acquire");
    guard.release().await.expect("release");
    for server in &servers {
        assert!(lease_keys(server).is_empty(), "no client lease key");
    }
}

/// How many times the client lease ended counter moved since the last call (taking a snapshot
/// resets the debugging recorder's counters).
#[cfg(feature = "metrics")]
fn leases_ended(snapshotter: &metrics_util::debugging::Snapshotter) -> u64 {
    use metrics_util::debugging::DebugValue;

    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == tower_lock::metrics::CLIENT_LEASES_ENDED)
        .map(|(.., value)| match value {
            DebugValue::Counter(n) => n,
            other => panic!("the counter is a counter: {other:?}"),
        })
        .sum()
}

/// A hold on the client lease that an operator clears with `force_unlock` is lost at its
/// client's next renewal (the lease's hash of cleared holds names it), as a hold with a lease
/// of its own would be, not at its lock's next refresh; the client's other holds on the lease
/// are kept, and the cleared lock is another client's to take at once. The same for a lock
/// whose name is long (over the 96 bytes a key shows in messages).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_unlocked_hold_is_lost_at_the_next_renewal() {
    let server = RedisServer::start();
    let a = leased_client(&server.url(), LEASE).await;
    let operator = plain_client(&server.url(), LEASE).await;
    let long = "l".repeat(120);
    for key in ["cleared", long.as_str()] {
        let cleared = a.lock(key).acquire().await.expect("acquire");
        let kept = a.lock("kept").acquire().await.expect("acquire");
        // Past the first renewals: both live on the lease alone.
        hold_unlost(&[&cleared, &kept], LEASE, "before the unlock").await;
        let unlocked_at = Instant::now();
        assert!(
            operator.force_unlock(key).await.expect("force_unlock"),
            "the operator found a hold to clear"
        );
        timeout(LEASE / 3 + TOLERANCE, cleared.lost())
            .await
            .unwrap_or_else(|_| panic!("{key}: the cleared hold is lost at the next renewal"));
        let noticed = unlocked_at.elapsed();
        assert!(noticed < LEASE, "{key}: noticed after {noticed:?}");
        let taken = operator
            .lock(key)
            .try_acquire()
            .await
            .expect("the cleared lock is free");
        hold_unlost(&[&kept], LEASE, "the other hold on the lease").await;
        taken.release().await.expect("release");
        kept.release().await.expect("release");
    }
}

/// A holder whose hold was cleared by `force_unlock` and who takes the lock again on the same
/// lease keeps the new hold: the record of the cleared one sends the new hold to its
/// owner-checked renewal, which finds it held, rather than reporting it lost (and leaving a
/// lock nobody releases).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_taken_again_after_a_force_unlock_is_kept() {
    let server = RedisServer::start();
    let a = leased_client(&server.url(), LEASE).await;
    let operator = plain_client(&server.url(), LEASE).await;
    let holder = a.holder();
    // Keeps the lease key renewed throughout.
    let other = a.lock("other").acquire().await.expect("acquire");
    let first = holder
        .clone()
        .scope(a.lock("again").acquire())
        .await
        .expect("acquire");
    hold_unlost(&[&first], LEASE, "before the unlock").await;
    assert!(operator.force_unlock("again").await.expect("force_unlock"));
    timeout(LEASE / 3 + TOLERANCE, first.lost())
        .await
        .expect("the cleared hold is lost");
    drop(first);
    let second = holder
        .clone()
        .scope(a.lock("again").acquire())
        .await
        .expect("the same holder takes the lock again");
    hold_unlost(&[&second, &other], 3 * LEASE, "the hold taken again").await;
    assert_busy(&operator, "again", "the hold taken again is held").await;
    second.release().await.expect("release");
    other.release().await.expect("release");
}

/// When the hash of cleared holds cannot be read (foreign data at its name), the renewals on
/// the lease do not fail: each hold is checked by its owner-checked renewal instead, and stays
/// held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_cleared_holds_fall_back_to_owner_checks() {
    let server = RedisServer::start();
    let a = leased_client(&server.url(), LEASE).await;
    let other = plain_client(&server.url(), LEASE).await;
    let held = a.lock("held").acquire().await.expect("acquire");
    let lease_key = the_lease_key(&server);
    let revoked = format!("{lease_key}:revoked");
    server.cmd(&["SET", &revoked, "not a hash"]);
    hold_unlost(&[&held], 3 * LEASE, "with the cleared holds unreadable").await;
    assert_busy(&other, "held", "the hold is kept").await;
    held.release().await.expect("release");
}

/// A client lease left idle (nothing held) for more than a lease is replaced quietly: the next
/// acquire succeeds at once, on a new session (`:2`; the old key is not brought back), without
/// first writing a lock that names the old lease, and
/// `tower_lock_client_leases_ended_total` does not move. A lease key that runs out under a
/// hold (deleted) does move it, by one, once the hold is lost. The client runs on a
/// current-thread runtime under a local metrics recorder, its watchdog included.
#[cfg(feature = "metrics")]
#[test]
fn idle_client_lease_is_replaced_quietly() {
    let server = RedisServer::start();
    support::recorded::run(async |snapshotter| {
        let a = leased_client(&server.url(), LEASE).await;
        let first = a.lock("first").acquire().await.expect("acquire");
        let old_key = the_lease_key(&server);
        assert_eq!(parse_lease_key(&old_key).1, 1, "session 1: {old_key}");
        hold_unlost(&[&first], LEASE, "the first hold").await;
        first.release().await.expect("release");
        let released_at = Instant::now();
        // The fault: nothing held for over a lease, so the lease key runs out.
        support::eventually(3 * LEASE, "the idle lease key runs out", || {
            !exists(&server, &old_key)
        })
        .await;
        tokio::time::sleep_until(released_at + LEASE + TOLERANCE).await;
        assert_eq!(leases_ended(snapshotter), 0, "nothing ended yet");

        let sets = server.calls("set");
        let started = Instant::now();
        let second = a.lock("second").acquire().await.expect("acquire");
        let took = started.elapsed();
        assert!(took < PROMPT, "acquired at once, in {took:?}");
        // The lease key's start and the grant's `SET NX`: no lock naming the old lease was
        // written first (the script found the lease gone without writing).
        assert_eq!(
            server.calls("set") - sets,
            2,
            "SET commands for the acquire"
        );
        let new_key = the_lease_key(&server);
        assert_eq!(
            parse_lease_key(&new_key),
            (parse_lease_key(&old_key).0, 2),
            "the same client, session 2: {new_key}"
        );
        assert_eq!(
            recorded_lease(&server, &lock_name("second")).as_deref(),
            Some(new_key.as_str())
        );
        assert!(
            !exists(&server, &old_key),
            "the old key is not brought back"
        );
        assert_eq!(
            leases_ended(snapshotter),
            0,
            "an idle lease replaced is not counted as ended"
        );

        // The contrast: the lease key gone under a hold.
        hold_unlost(&[&second], LEASE, "the second hold").await;
        assert_eq!(server.cmd(&["DEL", &new_key]).as_int(), 1);
        timeout(LEASE + TOLERANCE, second.lost())
            .await
            .expect("the hold is lost within a lease");
        assert_eq!(
            leases_ended(snapshotter),
            1,
            "a lease that ran out under a hold is counted once"
        );
        let released = second.release().await;
        assert!(matches!(released, Err(LockError::Lost)), "{released:?}");
        assert_eq!(leases_ended(snapshotter), 0, "counted once only");
    });
}
