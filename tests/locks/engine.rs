//! The lock semantics every backend shares, written once and run on each backend: the in-memory
//! backend (two clients on clones of one `MemoryBackend`) and Redis (two clients, each with its
//! own connection, on a `redis-server` started for the test by the fixture in `tests/support`).
//!
//! Each case is a generic `async fn` over the backend; [`lock_semantics!`] instantiates every
//! case as a test in one module per backend. Redis-only fault behaviour is in `redis_faults.rs`.

use crate::support;

use std::{
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use support::{RedisServer, RespValue};
use tokio::time::{Instant, timeout};
use tower_lock::{
    Backend, ConfigError, Lease, LockClient, LockError, LockGuard, MemoryBackend, RedisBackend,
    key::KeyError,
};

/// Two clients that contend like two processes, and the Redis server behind them, if any.
struct Env<B: Backend> {
    a: LockClient<B>,
    b: LockClient<B>,
    /// Dropped last, after the clients.
    server: Option<RedisServer>,
}

/// What the cases can observe of a backend beyond the `Backend` trait.
trait Probe: Backend + Clone {
    /// How many release channels the backend's pub/sub connection is subscribed to; `None` for a
    /// backend that has no such connection.
    fn subscriptions(&self) -> Option<usize>;
}

impl Probe for MemoryBackend {
    fn subscriptions(&self) -> Option<usize> {
        None
    }
}

impl Probe for RedisBackend {
    fn subscriptions(&self) -> Option<usize> {
        Some(self.subscribed_channels())
    }
}

fn client<B: Backend>(backend: B) -> LockClient<B> {
    LockClient::builder(backend).build().expect("the default configuration is valid")
}

/// Two clients on clones of one in-memory store.
async fn memory_env() -> Env<MemoryBackend> {
    let backend = MemoryBackend::new();
    Env { a: client(backend.clone()), b: client(backend), server: None }
}

/// A fresh `redis-server` and two clients, each with its own pool and pub/sub connection.
async fn redis_env() -> Env<RedisBackend> {
    let server = RedisServer::start();
    let url = server.url();
    let a = client(support::redis_backend(&url).connect().await.expect("connect a"));
    let b = client(support::redis_backend(&url).connect().await.expect("connect b"));
    Env { a, b, server: Some(server) }
}

/// Every key in the server (`KEYS *`), sorted.
fn keys(server: &RedisServer) -> Vec<String> {
    match server.cmd(&["KEYS", "*"]) {
        RespValue::Array(Some(items)) => {
            let mut keys: Vec<String> =
                items.iter().map(|item| item.as_str().expect("a key name")).collect();
            keys.sort();
            keys
        }
        other => panic!("unexpected KEYS reply: {other:?}"),
    }
}

/// The release channel of the lock named `lock` (documented in the Redis backend's docs).
fn channel(lock: &str) -> String {
    format!("{lock}:released")
}

impl<B: Probe> Env<B> {
    /// Waits (bounded) until `client` has `n` queued acquires and, on Redis, the server has a
    /// subscriber on the release channel of `lock`: the waiter is parked on a notification.
    async fn until_waiting(&self, client: &LockClient<B>, lock: &str, n: usize) {
        let channel = channel(lock);
        support::eventually(Duration::from_secs(2), "the waiter is parked", || {
            client.waiters() == n
                && self.server.as_ref().is_none_or(|server| support::numsub(server, &channel) > 0)
        })
        .await;
    }

    /// Waits (bounded) until nothing listens to the release channel of `lock` any more, in
    /// `client` and, on Redis, on the server.
    async fn until_unsubscribed(&self, client: &LockClient<B>, lock: &str) {
        let channel = channel(lock);
        support::eventually(Duration::from_secs(2), "the subscription is gone", || {
            client.backend().subscriptions().is_none_or(|n| n == 0)
                && self.server.as_ref().is_none_or(|server| support::numsub(server, &channel) == 0)
        })
        .await;
    }
}

/// Asserts that `client` cannot take `key` right now: `try_acquire` answers `WaitTimeout`.
async fn assert_busy<B: Backend>(client: &LockClient<B>, key: impl AsRef<[u8]>, why: &str) {
    match client.lock(key).try_acquire().await {
        Err(LockError::WaitTimeout { .. }) => {}
        Ok(guard) => panic!("{why}: the lock was free, got {guard:?}"),
        Err(error) => panic!("{why}: unexpected error {error:?}"),
    }
}

/// Runs `rounds` acquire/release cycles of `key` in each of `tasks` tasks per client, checking
/// inside every section that nobody else is inside. Returns (sections, overlaps).
async fn hammer<B: Backend>(
    clients: &[&LockClient<B>],
    tasks: usize,
    rounds: usize,
    key: &'static str,
) -> (u64, u64) {
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicU64::new(0));
    let sections = Arc::new(AtomicU64::new(0));
    let mut set = tokio::task::JoinSet::new();
    for client in clients {
        for _ in 0..tasks {
            let client = (*client).clone();
            let (inside, overlaps, sections) = (inside.clone(), overlaps.clone(), sections.clone());
            set.spawn(async move {
                for _ in 0..rounds {
                    let guard = client
                        .lock(key)
                        .wait(Duration::from_secs(30))
                        .acquire()
                        .await
                        .expect("acquire within the wait");
                    if inside.swap(true, Ordering::SeqCst) {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::task::yield_now().await;
                    inside.store(false, Ordering::SeqCst);
                    sections.fetch_add(1, Ordering::SeqCst);
                    guard.release().await.expect("release a held lock");
                }
            });
        }
    }
    while let Some(joined) = set.join_next().await {
        joined.expect("contending task");
    }
    (sections.load(Ordering::SeqCst), overlaps.load(Ordering::SeqCst))
}

async fn mutual_exclusion<B: Probe>(env: Env<B>) {
    const TASKS: usize = 16;
    const ROUNDS: usize = 100;
    let started = Instant::now();
    let (sections, overlaps) = hammer(&[&env.a, &env.b], TASKS, ROUNDS, "hot").await;
    println!(
        "mutual exclusion: sections={sections} overlaps={overlaps} in {:?}",
        started.elapsed()
    );
    assert_eq!(overlaps, 0, "two holders were inside at once");
    assert_eq!(sections, (2 * TASKS * ROUNDS) as u64);
    for client in [&env.a, &env.b] {
        assert_eq!(client.waiters(), 0);
        assert_eq!(client.active_keys(), 0);
    }
    if let Some(server) = &env.server {
        assert_eq!(keys(server), Vec::<String>::new(), "the lock key is gone");
    }
}

async fn reentrancy<B: Probe>(env: Env<B>) {
    // Release the three holds outer-first and in a shuffled order: the client counts them, and
    // the lock goes with the last, whichever it is. The store keeps the one record of the
    // grant throughout: the re-entries never reach it.
    for order in [[0, 1, 2], [2, 0, 1]] {
        let holder = env.a.holder();
        let guards = holder
            .clone()
            .scope(async {
                let first = env.a.lock("order:7").acquire().await.expect("first hold");
                let second = env.a.lock("order:7").try_acquire().await;
                let second = second.expect("a re-entry does not wait for itself");
                let third = env.a.lock("order:7").try_acquire().await;
                let third = third.expect("a second re-entry does not wait either");
                vec![first, second, third]
            })
            .await;
        let counts: Vec<u64> = guards.iter().map(LockGuard::hold_count).collect();
        assert_eq!(counts, [1, 2, 3]);
        assert!(guards.iter().all(|guard| guard.holder() == &holder));
        let name = guards[0].key().as_str().to_owned();
        let grant = env.server.as_ref().map(|server| {
            let grant = support::owner_grant(|args| server.cmd(args), &name);
            let grant = grant.expect("the grant's record is in Redis");
            assert!(support::attempt_of(&grant, holder.id()), "{grant}");
            grant
        });
        let mut guards: Vec<Option<LockGuard<B>>> = guards.into_iter().map(Some).collect();
        for (released, &i) in order.iter().enumerate() {
            assert_busy(&env.b, "order:7", &format!("{released} of 3 holds released")).await;
            if let Some(server) = &env.server {
                let record = support::owner_grant(|args| server.cmd(args), &name);
                assert_eq!(record, grant, "the grant's one record, {released} of 3 released");
            }
            let guard = guards[i].take().expect("each guard is released once");
            guard.release().await.expect("release one hold");
        }
        if let Some(server) = &env.server {
            let record = support::owner_grant(|args| server.cmd(args), &name);
            assert_eq!(record, None, "one delete once the last hold is released");
        }
        let next = env.b.lock("order:7").try_acquire().await;
        let next = next.expect("free once every hold is released");
        next.release().await.expect("release");
    }
}

/// A holder's scope applies to the client that made the holder only. Client B acquiring
/// inside A's scope takes a fresh holder of its own: it never re-enters A's lock, and since it
/// would wait for a lock its request holds through A, it fails at once instead of waiting for
/// itself. A lock A's holder does not hold, B takes as usual, under a holder of its own.
async fn holder_scope_is_per_client<B: Probe>(env: Env<B>) {
    let holder = env.a.holder();
    holder
        .clone()
        .scope(async {
            let ours = env.a.lock("order:9").acquire().await.expect("acquire");
            // A long wait: failing at once is not a wait that ran out.
            let theirs = env.b.lock("order:9").wait(Duration::from_secs(60));
            match timeout(Duration::from_secs(30), theirs.acquire()).await {
                Ok(Err(LockError::HeldThroughOtherClient)) => {}
                Ok(Ok(theirs)) => panic!(
                    "client B took client A's held lock as a re-entry (hold count {}, holder {}) \
                     because it ran inside A's holder scope",
                    theirs.hold_count(),
                    theirs.holder()
                ),
                Ok(Err(error)) => panic!("unexpected error {error:?}"),
                Err(_) => panic!("client B waited for the lock its request holds through A"),
            }
            let other = env.b.lock("order:10").try_acquire().await;
            let other = other.expect("a lock A's holder does not hold");
            assert_ne!(other.holder(), &holder, "B used A's holder");
            assert_eq!(other.hold_count(), 1);
            other.release().await.expect("release");
            ours.release().await.expect("release");
        })
        .await;
}

async fn fixed_lease_expiry<B: Probe>(env: Env<B>) {
    let lease = Duration::from_millis(300);
    let started = Instant::now();
    let expired = env.a.lock("doc:1").lease(Lease::fixed(lease)).acquire().await;
    let expired = expired.expect("acquire");
    assert!(!expired.is_lost());
    let name = expired.key().as_str().to_owned();
    // Made before the loss: it must wake for it, and stay resolved.
    let mut watched = expired.lost();

    let theirs = env.b.lock("doc:1").wait(Duration::from_secs(2)).acquire().await;
    let theirs = theirs.expect("the lock is free once the fixed lease ran out");
    let took = started.elapsed();
    println!("fixed lease {lease:?}: the other client got the lock after {took:?}");
    assert!(
        took >= lease - Duration::from_millis(20),
        "taken over after {took:?}, before the lease ran out"
    );
    assert!(took < Duration::from_millis(1500), "taken over only after {took:?}");

    assert!(expired.is_lost(), "the expired guard knows it is lost");
    timeout(Duration::from_secs(1), expired.lost())
        .await
        .expect("lost() resolves for an expired lease");
    timeout(Duration::from_secs(1), &mut watched)
        .await
        .expect("a lost() made while held resolves when the lease runs out");
    assert_eq!(
        futures_util::FutureExt::now_or_never(&mut watched),
        Some(()),
        "a resolved lost() polled again is ready again"
    );
    let released = expired.release().await;
    assert!(
        matches!(released, Err(LockError::Lost | LockError::NotHeld)),
        "releasing an expired lock: {released:?}"
    );

    // The stale release touched nothing: the new owner still has the lock.
    assert!(!theirs.is_lost());
    assert_busy(&env.a, "doc:1", "after the stale release").await;
    if let Some(server) = &env.server {
        let owned = support::owned_by(|args| server.cmd(args), &name, theirs.holder().id());
        assert!(owned, "the new owner's grant is still in Redis");
    }
    theirs.release().await.expect("the new owner releases normally");
}

async fn watchdog_keeps_lock<B: Probe>(env: Env<B>) {
    // Long enough that a renewal delayed by a busy machine still lands within the lease.
    let lease = Duration::from_millis(1500);
    let guard = env.a.lock("doc:2").lease(Lease::watchdog(lease)).acquire().await;
    let guard = guard.expect("acquire");
    let held_since = Instant::now();
    let mut attempts = 0;
    while held_since.elapsed() < lease * 4 {
        assert_busy(&env.b, "doc:2", "while the watchdog renews").await;
        attempts += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("watchdog: held {:?}, {attempts} attempts refused", held_since.elapsed());
    assert!(attempts >= 10);
    assert!(!guard.is_lost(), "renewed past 4 leases");
    assert!(guard.remaining() > Duration::ZERO);
    guard.release().await.expect("release");
    let next = env.b.lock("doc:2").try_acquire().await;
    next.expect("free at once after the release").release().await.expect("release");
}

async fn wake_up_by_notification<B: Probe>(env: Env<B>) {
    let held = env.a.lock("doc:3").lease(Lease::watchdog(Duration::from_secs(30)));
    let held = held.acquire().await.expect("acquire");
    let name = held.key().as_str().to_owned();
    let b = env.b.clone();
    let waiter = tokio::spawn(async move {
        let acquired = b.lock("doc:3").wait(Duration::from_secs(10)).acquire().await;
        (Instant::now(), acquired)
    });
    env.until_waiting(&env.b, &name, 1).await;
    let released_at = Instant::now();
    held.release().await.expect("release");
    let (acquired_at, acquired) = waiter.await.expect("waiter task");
    let guard = acquired.expect("the waiter gets the lock");
    assert!(acquired_at > released_at, "acquired before the release");
    let gap = acquired_at - released_at;
    println!("wake-up: release -> acquire in {gap:?} (lease 30 s)");
    assert!(gap < Duration::from_secs(1), "woken after {gap:?}");
    guard.release().await.expect("release");
}

async fn waiter_cancellation<B: Probe>(env: Env<B>) {
    let held = env.a.lock("doc:4").acquire().await.expect("acquire");
    let name = held.key().as_str().to_owned();

    // A waiting acquire future dropped by a timeout around it.
    let waiting = env.b.lock("doc:4").wait(Duration::from_secs(10)).acquire();
    let dropped = timeout(Duration::from_millis(300), waiting).await;
    assert!(dropped.is_err(), "the lock is held: {dropped:?}");
    assert_eq!(env.b.waiters(), 0);
    assert_eq!(env.b.active_keys(), 0);
    env.until_unsubscribed(&env.b, &name).await;

    // A waiting task aborted.
    let b = env.b.clone();
    let task =
        tokio::spawn(async move { b.lock("doc:4").wait(Duration::from_secs(10)).acquire().await });
    env.until_waiting(&env.b, &name, 1).await;
    task.abort();
    let joined = task.await;
    assert!(joined.is_err_and(|error| error.is_cancelled()));
    assert_eq!(env.b.waiters(), 0);
    assert_eq!(env.b.active_keys(), 0);
    env.until_unsubscribed(&env.b, &name).await;

    held.release().await.expect("the holder's release still works");
    assert_eq!(env.a.active_keys(), 0);
    let later = env.b.lock("doc:4").try_acquire().await;
    later.expect("the client that gave up can acquire later").release().await.expect("release");
    assert_eq!(env.b.active_keys(), 0);
}

async fn wait_timeout<B: Probe>(env: Env<B>) {
    let held = env.a.lock("doc:5").acquire().await.expect("acquire");

    let started = Instant::now();
    let error = env.b.lock("doc:5").wait(Duration::from_millis(200)).acquire().await;
    let waited = started.elapsed();
    let error = error.expect_err("the lock is held for the whole wait");
    let LockError::WaitTimeout { retry_after, .. } = error else {
        panic!("expected WaitTimeout, got {error:?}");
    };
    let retry_after = retry_after.expect("the holder's remaining lease is reported");
    println!("wait timeout after {waited:?}, retry after {retry_after:?}");
    assert!(retry_after > Duration::ZERO && retry_after <= Duration::from_secs(30));
    assert!(waited >= Duration::from_millis(200), "gave up after {waited:?}");
    assert!(waited < Duration::from_secs(2), "gave up only after {waited:?}");

    let started = Instant::now();
    let error = env.b.lock("doc:5").try_acquire().await;
    let tried = started.elapsed();
    let error = error.expect_err("the lock is held");
    assert!(
        matches!(error, LockError::WaitTimeout { retry_after: Some(d), .. } if d > Duration::ZERO),
        "try_acquire: {error:?}"
    );
    assert!(error.retry_after().is_some());
    assert!(tried < Duration::from_millis(500), "try_acquire took {tried:?}");

    assert_eq!(env.b.waiters(), 0);
    assert_eq!(env.b.active_keys(), 0);
    held.release().await.expect("release");
}

async fn fencing_tokens<B: Probe>(env: Env<B>) {
    const TASKS: usize = 4;
    const ROUNDS: usize = 25;
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut set = tokio::task::JoinSet::new();
    for client in [&env.a, &env.b] {
        for _ in 0..TASKS {
            let (client, tokens) = (client.clone(), tokens.clone());
            set.spawn(async move {
                for _ in 0..ROUNDS {
                    let guard = client.lock("fenced").fencing().wait(Duration::from_secs(30));
                    let guard = guard.acquire().await.expect("acquire");
                    let token = guard.fencing_token().expect("a fenced lock has a token");
                    tokens.lock().unwrap_or_else(PoisonError::into_inner).push(token);
                    guard.release().await.expect("release");
                }
            });
        }
    }
    while let Some(joined) = set.join_next().await {
        joined.expect("task");
    }
    let tokens = tokens.lock().unwrap_or_else(PoisonError::into_inner).clone();
    assert_eq!(tokens.len(), 2 * TASKS * ROUNDS);
    let inversions: Vec<&[u64]> = tokens.windows(2).filter(|w| w[0] >= w[1]).collect();
    assert!(
        inversions.is_empty(),
        "tokens must rise strictly in the order they were granted: {inversions:?}"
    );
    println!("fencing: {} tokens, {}..={}", tokens.len(), tokens[0], tokens[tokens.len() - 1]);
    // A re-entry keeps the owner's token; the next owner gets a higher one.
    let holder = env.a.holder();
    let (outer, inner) = holder
        .scope(async {
            let outer = env.a.lock("fenced").fencing().acquire().await;
            let inner = env.a.lock("fenced").fencing().try_acquire().await;
            (outer.expect("acquire"), inner.expect("re-enter"))
        })
        .await;
    assert_eq!(inner.fencing_token(), outer.fencing_token());
    let last = outer.fencing_token().expect("token");
    assert!(last > tokens[tokens.len() - 1]);
    inner.release().await.expect("release");
    outer.release().await.expect("release");
    let next = env.b.lock("fenced").fencing().try_acquire().await.expect("acquire");
    assert!(next.fencing_token().expect("token") > last);
    next.release().await.expect("release");
}

async fn invalid_keys<B: Probe>(env: Env<B>) {
    let empty = env.a.lock("").acquire().await.expect_err("an empty key");
    assert!(matches!(empty, LockError::InvalidKey(KeyError::Empty)), "{empty:?}");
    let long = vec![b'k'; 513];
    let too_long = env.a.lock(&long).acquire().await.expect_err("a 513-byte key");
    assert!(
        matches!(too_long, LockError::InvalidKey(KeyError::TooLong { len: 513, max: 512 })),
        "{too_long:?}"
    );
    if let Some(server) = &env.server {
        assert_eq!(server.cmd(&["DBSIZE"]).as_int(), 0, "refused keys wrote nothing");
    }
    let longest = env.a.lock(&long[..512]).try_acquire().await;
    longest.expect("512 bytes is within the default limit").release().await.expect("release");

    let hostile = b"{}%\0".repeat(16);
    let guard = env.a.lock(&hostile).acquire().await.expect("any bytes are a key");
    let name = guard.key().as_str().to_owned();
    assert_eq!(name.matches('{').count(), 1, "{name}");
    assert_eq!(name.matches('}').count(), 1, "{name}");
    assert!(name.starts_with("tower-lock:{") && name.ends_with('}'), "{name}");
    assert_eq!(guard.key().user_key(), hostile);
    if let Some(server) = &env.server {
        assert_eq!(keys(server), vec![name.clone()]);
        assert_eq!(server.cmd(&["EXISTS", &name]).as_int(), 1);
    }
    assert_busy(&env.b, &hostile, "the hostile key excludes itself").await;
    assert_busy(&env.a, &hostile, "even for another holder of the same client").await;

    // The escaped spelling of the same bytes names a different lock.
    let lookalike = "%7B%7D%25%00".repeat(16);
    let other = env.b.lock(&lookalike).try_acquire().await;
    let other = other.expect("a lookalike key is a different lock");
    assert_ne!(other.key(), guard.key());
    other.release().await.expect("release");
    guard.release().await.expect("release");
    if let Some(server) = &env.server {
        assert_eq!(keys(server), Vec::<String>::new());
    }
}

async fn builder_refuses_bad_config<B: Probe>(env: Env<B>) {
    let backend = env.a.backend().clone();
    for prefix in ["a{b:", "a}b:", "{x}:"] {
        let error = LockClient::builder(backend.clone()).prefix(prefix).build();
        assert_eq!(
            error.expect_err("braces in the prefix"),
            ConfigError::PrefixBraces(prefix.to_owned())
        );
    }
    for lease in [Lease::fixed(Duration::ZERO), Lease::watchdog(Duration::ZERO)] {
        let error = LockClient::builder(backend.clone()).lease(lease).build();
        assert_eq!(error.expect_err("a zero lease"), ConfigError::LeaseTooShort);
    }
    let error = LockClient::builder(backend.clone()).max_key_len(0).build();
    assert_eq!(error.expect_err("max_key_len 0"), ConfigError::ZeroMaxKeyLen);

    let custom = LockClient::builder(backend).prefix("shop:").build();
    let custom = custom.expect("a prefix without braces is fine");
    let guard = custom.lock("x").acquire().await.expect("acquire");
    assert_eq!(guard.key().as_str(), "shop:{x}");
    guard.release().await.expect("release");
}

async fn shutdown<B: Probe>(env: Env<B>) {
    let one = env.a.lock("s:1").acquire().await.expect("acquire");
    let two = env.a.lock("s:2").acquire().await.expect("acquire");
    let theirs = env.b.lock("s:3").acquire().await.expect("acquire");
    let (name_one, name_three) = (one.key().as_str().to_owned(), theirs.key().as_str().to_owned());
    let b = env.b.clone();
    let b_waits = tokio::spawn(async move {
        let acquired = b.lock("s:1").wait(Duration::from_secs(10)).acquire().await;
        (Instant::now(), acquired)
    });
    let a = env.a.clone();
    let a_waits =
        tokio::spawn(async move { a.lock("s:3").wait(Duration::from_secs(10)).acquire().await });
    env.until_waiting(&env.b, &name_one, 1).await;
    env.until_waiting(&env.a, &name_three, 1).await;

    let shut_at = Instant::now();
    env.a.shutdown().await;

    let (got_at, got) = b_waits.await.expect("task");
    let got = got.expect("B gets the lock A held once A shuts down");
    println!("shutdown: waiter in the other client acquired after {:?}", got_at - shut_at);
    assert!(got_at - shut_at < Duration::from_secs(2));
    let a_waited = a_waits.await.expect("task");
    assert!(matches!(a_waited, Err(LockError::ShutDown)), "A's waiting acquire: {a_waited:?}");
    for guard in [&one, &two] {
        assert!(guard.is_lost(), "{guard:?}");
        timeout(Duration::from_secs(1), guard.lost())
            .await
            .expect("lost() resolves for a guard of a client that shut down");
    }
    let free = env.b.lock("s:2").try_acquire().await;
    let free = free.expect("A's other lock was released at shutdown");
    let after = env.a.lock("s:4").acquire().await;
    assert!(matches!(after, Err(LockError::ShutDown)), "{after:?}");
    let after = env.a.lock("s:4").try_acquire().await;
    assert!(matches!(after, Err(LockError::ShutDown)), "{after:?}");
    let released = one.release().await;
    assert!(matches!(released, Err(LockError::Lost)), "{released:?}");
    drop(two);
    for guard in [got, free, theirs] {
        guard.release().await.expect("B's locks are untouched");
    }
}

async fn handoff_within_one_client<B: Probe>(env: Env<B>) {
    const TASKS: usize = 8;
    const ROUNDS: usize = 25;
    if let Some(server) = &env.server {
        assert_eq!(server.cmd(&["CONFIG", "RESETSTAT"]).as_str().as_deref(), Some("OK"));
    }
    let started = Instant::now();
    let (sections, overlaps) = hammer(&[&env.a], TASKS, ROUNDS, "local").await;
    let took = started.elapsed();
    assert_eq!(overlaps, 0);
    assert_eq!(sections, (TASKS * ROUNDS) as u64);
    assert_eq!(env.a.active_keys(), 0);
    match &env.server {
        Some(server) => {
            let calls = server.calls("evalsha");
            println!(
                "hand-off: {sections} acquisitions by {TASKS} tasks in {took:?}, {calls} EVALSHA \
                 ({:.2} per acquisition)",
                calls as f64 / sections as f64
            );
            assert!(
                calls * 2 <= sections * 5,
                "{calls} EVALSHA calls for {sections} acquisitions: waiters poll"
            );
        }
        None => println!("hand-off: {sections} acquisitions by {TASKS} tasks in {took:?}"),
    }
}

/// Instantiates every shared case as a test of one backend. `$make` is an async expression
/// giving a fresh [`Env`] of that backend.
macro_rules! lock_semantics {
    ($backend_mod:ident, $make:expr) => {
        mod $backend_mod {
            use super::*;

            /// 2 clients × 16 tasks × 100 acquisitions of one key: never two inside at once.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn mutual_exclusion() {
                super::mutual_exclusion($make.await).await;
            }

            /// A holder re-enters its lock (counts 1, 2, 3); it is freed by the last release, in any order.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn reentrancy() {
                super::reentrancy($make.await).await;
            }

            /// One client's holder scope does not let another client re-enter that holder's lock.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn holder_scope_is_per_client() {
                super::holder_scope_is_per_client($make.await).await;
            }

            /// A fixed lease frees the lock when it runs out; the stale guard is lost and its release harms no one.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn fixed_lease_expiry() {
                super::fixed_lease_expiry($make.await).await;
            }

            /// The watchdog keeps a 1.5 s lease held for 4 leases; the release frees it at once.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn watchdog_keeps_lock() {
                super::watchdog_keeps_lock($make.await).await;
            }

            /// A waiter wakes on the release notification, far sooner than the 30 s lease.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn wake_up_by_notification() {
                super::wake_up_by_notification($make.await).await;
            }

            /// A cancelled waiter leaves no queue entry, key state or subscription behind.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn waiter_cancellation() {
                super::waiter_cancellation($make.await).await;
            }

            /// A wait that runs out, and a try, give WaitTimeout with the holder's remaining lease.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn wait_timeout() {
                super::wait_timeout($make.await).await;
            }

            /// Fencing tokens rise strictly from owner to owner across clients, and re-entry keeps the token.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn fencing_tokens() {
                super::fencing_tokens($make.await).await;
            }

            /// Empty and oversized keys are refused; hostile bytes are escaped into one hash tag.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn invalid_keys() {
                super::invalid_keys($make.await).await;
            }

            /// The builder names the bad setting: braces in the prefix, a zero lease, a zero key length.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn builder_refuses_bad_config() {
                super::builder_refuses_bad_config($make.await).await;
            }

            /// Shutdown releases every lock, fails waiters and later acquires, and marks guards lost.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn shutdown() {
                super::shutdown($make.await).await;
            }

            /// 8 tasks of one client share a key by hand-off: no overlap, and no polling storm.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn handoff_within_one_client() {
                super::handoff_within_one_client($make.await).await;
            }
        }
    };
}

lock_semantics!(memory, memory_env());
lock_semantics!(redis, redis_env());

/// `max_hold` caps how long the watchdog keeps a lock: past it the lease runs out and the
/// guard reports itself lost, on both backends.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn max_hold_caps_renewal() {
    let server = RedisServer::start();
    let redis = support::redis_backend(server.url()).connect().await.unwrap();
    let lease = Lease::watchdog(Duration::from_millis(300));
    let cap = Duration::from_millis(600);
    let on_redis = LockClient::builder(redis).lease(lease).max_hold(cap);
    let on_redis = on_redis.build().unwrap();
    let on_memory = LockClient::builder(MemoryBackend::new()).lease(lease).max_hold(cap);
    let on_memory = on_memory.build().unwrap();
    let started = Instant::now();
    let a = on_redis.lock("capped").acquire().await.unwrap();
    let b = on_memory.lock("capped").acquire().await.unwrap();
    for lost in [a.lost(), b.lost()] {
        timeout(Duration::from_secs(3), lost).await.expect("lost once renewals stop at max_hold");
    }
    let held = started.elapsed();
    // Renewed up to the cap, then one more lease at most.
    assert!(held >= cap, "lost after {held:?}, before the cap");
    assert!(held < cap + Duration::from_millis(700), "lost only after {held:?}");
    // The guard reports the loss a drift margin before the server's expiry: wait that out.
    let next = on_redis.lock("capped").wait(Duration::from_secs(1)).acquire().await;
    next.expect("free once the capped lease ran out").release().await.unwrap();
}

/// The in-memory backend releases without I/O, so at once: a dropped guard's lock is free
/// before the runtime runs anything else (here, on one thread, before any spawned task could),
/// and a release is ready at its first poll.
#[tokio::test(flavor = "current_thread")]
async fn memory_releases_happen_at_once() {
    use futures_util::FutureExt as _;
    let backend = MemoryBackend::new();
    let a = LockClient::builder(backend.clone()).build().unwrap();
    let b = LockClient::builder(backend.clone()).build().unwrap();
    for round in 0..3 {
        let guard = a.lock("at-once").acquire().await.unwrap();
        drop(guard);
        let taken = b
            .lock("at-once")
            .try_acquire()
            .now_or_never()
            .expect("an uncontended try on memory needs no wait")
            .unwrap_or_else(|e| panic!("round {round}: not free after the drop: {e}"));
        taken.release().now_or_never().expect("a release on memory is ready at once").unwrap();
        assert_eq!(backend.held_count(), 0, "round {round}");
    }
}

/// A wait that runs out behind a holder whose watchdog renewed its lease while the waiter
/// waited is never told 0: the lease the waiter last heard of ran out, so it caps nothing; with
/// no hold seen yet the hint is the wait (not the holder's lease); once holds were seen it is
/// their typical length, raised to the wait. The client that answers with `?` reads the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_behind_a_renewed_holder_is_never_told_zero() {
    let store = MemoryBackend::new();
    let holder = LockClient::builder(store.clone())
        .lease(Lease::watchdog(Duration::from_millis(150)))
        .build()
        .unwrap();
    let waiter = LockClient::builder(store).build().unwrap();
    let held = holder.lock("doc:9").acquire().await.unwrap();
    // Several renewals happen during the wait: the lease first heard of is long gone.
    let wait = Duration::from_millis(600);
    let error = waiter.lock("doc:9").wait(wait).acquire().await.unwrap_err();
    let retry_after = error.retry_after().expect("a hint");
    assert!(held.remaining() > Duration::ZERO, "renewed while waited for");
    assert!(
        retry_after >= wait && retry_after <= Duration::from_secs(5),
        "no history: the {wait:?} waited, got {retry_after:?}"
    );
    held.release().await.unwrap();

    // Holds of the family (`doc:`) seen by the waiting client: the typical one, raised to the
    // (here zero) wait.
    for _ in 0..3 {
        let guard = waiter.lock("doc:1").acquire().await.unwrap();
        guard.release().await.unwrap();
    }
    let held = holder.lock("doc:9").acquire().await.unwrap();
    let error = waiter.lock("doc:9").try_acquire().await.unwrap_err();
    let retry_after = error.retry_after().expect("a hint");
    assert!(
        retry_after >= Duration::from_millis(10) && retry_after < Duration::from_millis(100),
        "the typical hold of moments, got {retry_after:?}"
    );
    held.release().await.unwrap();
}
