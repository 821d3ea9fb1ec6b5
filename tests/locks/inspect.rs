//! Inspection and force-unlock, on the in-memory backend and on a `redis-server` started by the
//! fixture in `tests/support` (and on Redlock nodes and a Redis Cluster, below): who holds a
//! lock in each of its forms, and what a forced unlock does to its holders and its waiters.

use crate::support;

use std::time::Duration;

use support::{RedisServer, RespValue};
use tokio::time::{Instant, timeout};
use tower_lock::{
    Backend, Lease, LockClient, LockError, LockInfo, LockKind, MemoryBackend, RedisBackend,
};

/// How long a waiter may take to get a lock after a forced unlock announced its release: far
/// less than the holders' 30-second lease, its own retry timer.
const PROMPT: Duration = Duration::from_secs(2);

/// Three clients that act like three processes (the holder, a waiter, the operator) and the
/// Redis server behind them, if any.
struct Env<B: Backend> {
    a: LockClient<B>,
    b: LockClient<B>,
    operator: LockClient<B>,
    /// Dropped last, after the clients.
    server: Option<RedisServer>,
}

/// A client whose fair waiters keep their place for 30 s: the watchdog refreshes it (and
/// would find the lock free) only every 10 s, so a waiter that gets a lock within [`PROMPT`]
/// was woken by its release announcement.
fn client<B: Backend>(backend: B) -> LockClient<B> {
    LockClient::builder(backend)
        .waiter_timeout(Duration::from_secs(30))
        .build()
        .expect("the default configuration is valid")
}

async fn memory_env() -> Env<MemoryBackend> {
    with_operator(support::stores::in_memory(client).await).await
}

async fn redis_env() -> Env<RedisBackend> {
    with_operator(support::stores::on_redis(client).await).await
}

/// The two clients of `store` and a third one as the operator.
async fn with_operator<B: Backend>(store: support::stores::Env<B>) -> Env<B> {
    let operator = (store.more)().await;
    Env { a: store.a, b: store.b, operator, server: store.server }
}

/// The one holder of `info`, as (id, kind, count).
fn only_holder(info: &LockInfo) -> (&str, LockKind, u64) {
    assert_eq!(info.holders.len(), 1, "one holder: {info:?}");
    let holder = &info.holders[0];
    (holder.id.as_str(), holder.kind, holder.hold_count)
}

impl<B: Backend> Env<B> {
    /// `TYPE` of the backend name of `key`'s exclusive lock, on Redis.
    fn redis_type(&self, key: &str) -> Option<String> {
        let name = self.a.lock_key("", key, LockKind::Exclusive).unwrap();
        let server = self.server.as_ref()?;
        server.cmd(&["TYPE", name.as_str()]).as_str()
    }

    /// Waits until `client` has one acquire parked on a notification: waiting in the client
    /// and, on Redis, subscribed to the lock's release channel.
    async fn until_waiting(&self, client: &LockClient<B>, name: &str) {
        let channel = format!("{name}:released");
        support::eventually(Duration::from_secs(2), "the waiter is parked", || {
            client.waiters() == 1
                && self.server.as_ref().is_none_or(|server| {
                    matches!(
                        server.cmd(&["PUBSUB", "NUMSUB", &channel]),
                        RespValue::Array(Some(items)) if items.len() == 2 && items[1].as_int() > 0
                    )
                })
        })
        .await;
    }
}

/// A key nobody locked is free, with nobody queued, and a forced unlock frees nothing.
async fn free_lock<B: Backend>(env: Env<B>) {
    let info = env.operator.inspect("nobody").await.unwrap();
    assert!(!info.is_locked());
    assert_eq!((info.kind(), info.queue_len), (None, 0));
    assert!(!env.operator.force_unlock("nobody").await.unwrap());
}

/// An exclusive lock held once (on Redis, the owner record `SET NX` writes) names its holder
/// with the guard's id, one hold and a lease. Re-entered, the store still keeps the one record
/// (re-entries are counted by the client that holds the grant): another client reports one
/// hold, the holder's own client two.
async fn exclusive_single_hold_and_reentered<B: Backend>(env: Env<B>) {
    let lease = Lease::watchdog(Duration::from_secs(30));
    let first = env.a.lock("order:1").lease(lease).acquire().await.unwrap();
    if env.server.is_some() {
        assert_eq!(env.redis_type("order:1").as_deref(), Some("string"));
    }
    let info = env.operator.inspect("order:1").await.unwrap();
    let id = first.holder().id();
    assert_eq!(only_holder(&info), (id, LockKind::Exclusive, 1));
    let left = info.holders[0].remaining_lease.expect("a lease");
    assert!(left > Duration::ZERO && left <= lease.duration(), "{left:?}");
    assert_eq!(info.kind(), Some(LockKind::Exclusive));

    let again = env.a.lock("order:1").holder(first.holder()).acquire().await.unwrap();
    if env.server.is_some() {
        assert_eq!(env.redis_type("order:1").as_deref(), Some("string"));
    }
    let info = env.operator.inspect("order:1").await.unwrap();
    assert_eq!(only_holder(&info), (id, LockKind::Exclusive, 1));
    let info = env.a.inspect("order:1").await.unwrap();
    assert_eq!(only_holder(&info), (id, LockKind::Exclusive, 2));
    again.release().await.unwrap();
    first.release().await.unwrap();
    assert!(!env.operator.inspect("order:1").await.unwrap().is_locked());
}

/// A fair lock counts its queue. Its holder is reported as exclusive: a fair grant is the same
/// owner record as a plain one, and the store keeps no mark of it.
async fn fair_with_queue<B: Backend>(env: Env<B>) {
    let guard = env.a.fair_lock("fifo").acquire().await.unwrap();
    let info = env.operator.inspect("fifo").await.unwrap();
    let exclusive = LockKind::Exclusive;
    assert_eq!(only_holder(&info), (guard.holder().id(), exclusive, 1));
    assert_eq!(info.queue_len, 0);

    let b = env.b.clone();
    let waiter = tokio::spawn(async move {
        let wait = Duration::from_secs(10);
        b.fair_lock("fifo").wait(wait).acquire().await
    });
    support::eventually(Duration::from_secs(2), "the waiter is queued", || env.b.queued() == 1)
        .await;
    let info = env.operator.inspect("fifo").await.unwrap();
    assert_eq!(info.queue_len, 1, "{info:?}");
    assert_eq!(info.kind(), Some(exclusive));
    guard.release().await.unwrap();
    let next = timeout(PROMPT, waiter).await.unwrap().unwrap().unwrap();
    let info = env.operator.inspect("fifo").await.unwrap();
    assert_eq!(only_holder(&info), (next.holder().id(), exclusive, 1));
    assert_eq!(info.queue_len, 0);
    next.release().await.unwrap();
}

/// Two readers of a read-write lock are both named, as readers; a writer waiting for them is
/// counted in the queue.
async fn read_write_two_readers<B: Backend>(env: Env<B>) {
    let first = env.a.read_write_lock("doc").read().acquire().await.unwrap();
    let second = env.b.read_write_lock("doc").read().acquire().await.unwrap();
    let info = env.operator.inspect("doc").await.unwrap();
    assert_eq!(info.holders.len(), 2, "{info:?}");
    assert_eq!(info.kind(), Some(LockKind::Read));
    for guard in [&first, &second] {
        let holder = info.holder(guard.holder().id()).expect("named");
        assert_eq!((holder.kind, holder.hold_count), (LockKind::Read, 1));
        assert!(holder.remaining_lease.is_some());
    }

    let operator = env.operator.clone();
    let writer = tokio::spawn(async move {
        let wait = Duration::from_secs(10);
        operator.read_write_lock("doc").write().wait(wait).acquire().await
    });
    support::eventually(Duration::from_secs(2), "the writer is queued", || {
        env.operator.queued() == 1
    })
    .await;
    assert_eq!(env.b.inspect("doc").await.unwrap().queue_len, 1);
    first.release().await.unwrap();
    second.release().await.unwrap();
    let writer = timeout(PROMPT, writer).await.unwrap().unwrap().unwrap();
    let info = env.a.inspect("doc").await.unwrap();
    assert_eq!(only_holder(&info), (writer.holder().id(), LockKind::Write, 1));
    writer.release().await.unwrap();
}

/// A forced unlock frees the lock and tells the holder: in the same client its guard is lost
/// at once; in another client at that client's next renewal (a third of the lease), its
/// `lost()` resolving. A read-write lock's holds go too.
async fn force_unlock_loses_the_guards<B: Backend>(env: Env<B>) {
    // Elsewhere: renewals every 300 ms.
    let lease = Lease::watchdog(Duration::from_millis(900));
    let elsewhere = env.a.lock("stuck").lease(lease).acquire().await.unwrap();
    assert!(env.operator.force_unlock("stuck").await.unwrap());
    assert!(!env.operator.inspect("stuck").await.unwrap().is_locked());
    timeout(lease.duration(), elsewhere.lost())
        .await
        .expect("the other client's guard is lost at its next renewal");
    assert!(matches!(elsewhere.release().await, Err(LockError::Lost)));

    // Here: at once, before any renewal.
    let here = env.a.lock("stuck").acquire().await.unwrap();
    let reader = env.a.read_write_lock("stuck").read().acquire().await.unwrap();
    assert!(env.a.force_unlock("stuck").await.unwrap());
    assert!(here.is_lost() && reader.is_lost());
    here.lost().await;
    assert!(!env.a.inspect("stuck").await.unwrap().is_locked());
    // Free for the next holder.
    let next = env.b.lock("stuck").try_acquire().await.unwrap();
    next.release().await.unwrap();
}

/// A waiter in another client gets the lock right after a forced unlock, woken by its
/// announcement, long before the holder's 30-second lease would have let it in; so does the
/// head of a fair lock's queue.
async fn force_unlock_wakes_waiters<B: Backend>(env: Env<B>) {
    for fair in [false, true] {
        let key = if fair { "fair-stuck" } else { "plain-stuck" };
        let holder = request(&env.a, key, fair).acquire().await.unwrap();
        let b = env.b.clone();
        let waiter = tokio::spawn(async move {
            let wait = Duration::from_secs(20);
            request(&b, key, fair).wait(wait).acquire().await
        });
        let name = env.b.lock_key("", key, LockKind::Exclusive).unwrap();
        env.until_waiting(&env.b, name.as_str()).await;
        let started = Instant::now();
        assert!(env.operator.force_unlock(key).await.unwrap());
        let next = timeout(PROMPT, waiter)
            .await
            .unwrap_or_else(|_| panic!("fair {fair}: the waiter was not woken"))
            .unwrap()
            .unwrap();
        assert!(started.elapsed() < PROMPT);
        let info = env.operator.inspect(key).await.unwrap();
        assert_eq!(only_holder(&info).0, next.holder().id(), "fair {fair}");
        next.release().await.unwrap();
        drop(holder);
    }
}

/// Fencing tokens keep rising across a forced unlock: the next holder's token is higher than
/// the cleared holder's.
async fn fencing_rises_after_force_unlock<B: Backend>(env: Env<B>) {
    let cleared = env.a.lock("fenced").fencing().acquire().await.unwrap();
    let before = cleared.fencing_token().expect("asked for");
    assert!(env.operator.force_unlock("fenced").await.unwrap());
    let next = env.b.lock("fenced").fencing().try_acquire().await.unwrap();
    assert!(next.fencing_token().expect("asked for") > before);
    next.release().await.unwrap();
}

/// A semaphore names each holder of a permit and counts the permits in use (the store keeps
/// no permit count, so the limit is reported as 0); a forced unlock gives every permit back
/// (the holders here lose their guards at once) and the permits are free.
async fn semaphore_permits<B: Backend>(env: Env<B>) {
    let first = env.a.semaphore("exports", 3).acquire().await.unwrap();
    let second = env.b.semaphore("exports", 3).acquire().await.unwrap();
    let info = env.operator.inspect("exports").await.unwrap();
    assert_eq!(info.kind(), Some(LockKind::Semaphore));
    let permits = info.permits.expect("a semaphore");
    assert_eq!((permits.in_use, permits.limit), (2, 0));
    for guard in [&first, &second] {
        let holder = info.holder(guard.holder().id()).expect("named");
        assert_eq!((holder.kind, holder.hold_count), (LockKind::Semaphore, 1));
    }
    assert!(env.a.force_unlock("exports").await.unwrap());
    assert!(first.is_lost());
    let info = env.operator.inspect("exports").await.unwrap();
    assert!(!info.is_locked() && info.permits.is_none(), "{info:?}");
    // Both permits are free again, though `second`'s holder has not found out yet.
    let a = env.a.semaphore("exports", 2).try_acquire().await.unwrap();
    let b = env.b.semaphore("exports", 2).try_acquire().await.unwrap();
    a.release().await.unwrap();
    b.release().await.unwrap();
    drop(second);
}

/// A request for `key`'s fair lock, or its exclusive lock.
fn request<'a, B: Backend>(
    client: &'a LockClient<B>,
    key: &str,
    fair: bool,
) -> tower_lock::LockRequest<'a, B> {
    if fair { client.fair_lock(key) } else { client.lock(key) }
}

/// The namespaced forms name what `lock_in_namespace` (and a layer's route) locks.
async fn namespaced<B: Backend>(env: Env<B>) {
    let guard = env.a.lock_in_namespace("withdraw", "7").acquire().await.unwrap();
    assert!(!env.operator.inspect("7").await.unwrap().is_locked());
    let info = env.operator.inspect_in_namespace("withdraw", "7").await.unwrap();
    assert_eq!(only_holder(&info).0, guard.holder().id());
    assert!(!env.operator.force_unlock("7").await.unwrap());
    assert!(env.a.force_unlock_in_namespace("withdraw", "7").await.unwrap());
    assert!(guard.is_lost());
}

/// Instantiates every case as a test, once per backend.
macro_rules! cases {
    ($backend:ident, $env:ident) => {
        mod $backend {
            use super::*;

            #[tokio::test]
            async fn free_lock() {
                super::free_lock($env().await).await;
            }

            #[tokio::test]
            async fn exclusive_single_hold_and_reentered() {
                super::exclusive_single_hold_and_reentered($env().await).await;
            }

            #[tokio::test]
            async fn fair_with_queue() {
                super::fair_with_queue($env().await).await;
            }

            #[tokio::test]
            async fn read_write_two_readers() {
                super::read_write_two_readers($env().await).await;
            }

            #[tokio::test]
            async fn force_unlock_loses_the_guards() {
                super::force_unlock_loses_the_guards($env().await).await;
            }

            #[tokio::test]
            async fn force_unlock_wakes_waiters() {
                super::force_unlock_wakes_waiters($env().await).await;
            }

            #[tokio::test]
            async fn fencing_rises_after_force_unlock() {
                super::fencing_rises_after_force_unlock($env().await).await;
            }

            #[tokio::test]
            async fn semaphore_permits() {
                super::semaphore_permits($env().await).await;
            }

            #[tokio::test]
            async fn namespaced() {
                super::namespaced($env().await).await;
            }
        }
    };
}

cases!(memory, memory_env);
cases!(redis, redis_env);

/// Data of another type at a lock's name is reported as such and left alone, by inspect and
/// by force-unlock: a string that is not a hold, a list, a hash that is not a lock, and data
/// at the read-write lock's name.
#[tokio::test]
async fn foreign_data_is_wrong_type_and_left_alone() {
    let env = redis_env().await;
    let server = env.server.as_ref().unwrap();
    let name = |key: &str, kind| env.a.lock_key("", key, kind).unwrap().as_str().to_owned();
    let plain = name("s", LockKind::Exclusive);
    server.cmd(&["SET", &plain, "hello"]);
    let list = name("l", LockKind::Exclusive);
    server.cmd(&["RPUSH", &list, "a"]);
    let hash = name("h", LockKind::Exclusive);
    server.cmd(&["HSET", &hash, "name", "bob"]);
    let rw = name("r", LockKind::Read);
    server.cmd(&["HSET", &rw, "r:someone", "1"]);
    for (key, stored) in [("s", &plain), ("l", &list), ("h", &hash), ("r", &rw)] {
        for force in [false, true] {
            let error = if force {
                env.operator.force_unlock(key).await.err()
            } else {
                env.operator.inspect(key).await.err()
            };
            match error {
                Some(LockError::Backend(error)) if error.is_wrong_type() => {}
                other => panic!("{key} (force {force}): {other:?}"),
            }
        }
        assert_eq!(server.cmd(&["EXISTS", stored]).as_int(), 1, "{key} left alone");
    }
    assert_eq!(server.cmd(&["GET", &plain]).as_str().as_deref(), Some("hello"));
}

/// Redlock: the holder a majority of the nodes name, with the guard's id; a forced unlock
/// clears every node, and the holder's guard is lost at its next renewal.
#[tokio::test]
async fn redlock_inspect_and_force_unlock() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let client = || {
        let backend = support::redlock_backend(servers.iter().map(RedisServer::url))
            .node_timeout(Duration::from_millis(200))
            .build()
            .expect("valid Redlock configuration");
        LockClient::builder(backend).prefix("rl:").build().expect("valid configuration")
    };
    let (holder, operator) = (client(), client());
    let lease = Lease::watchdog(Duration::from_millis(900));
    let guard = holder.lock("order:9").lease(lease).acquire().await.unwrap();
    let info = operator.inspect("order:9").await.unwrap();
    assert_eq!(only_holder(&info), (guard.holder().id(), LockKind::Exclusive, 1));
    assert!(info.holders[0].remaining_lease.is_some());

    assert!(operator.force_unlock("order:9").await.unwrap());
    let name = operator.lock_key("", "order:9", LockKind::Exclusive).unwrap();
    for server in &servers {
        assert_eq!(server.cmd(&["EXISTS", name.as_str()]).as_int(), 0);
    }
    timeout(lease.duration(), guard.lost()).await.expect("the guard is lost at its next renewal");
    assert!(!operator.inspect("order:9").await.unwrap().is_locked());
    let next = operator.lock("order:9").try_acquire().await.unwrap();
    next.release().await.unwrap();
}

/// Redis Cluster: inspect and force-unlock reach the lock's shard; the waiter there is woken
/// by the sharded announcement.
#[cfg(feature = "cluster")]
#[tokio::test]
async fn cluster_inspect_and_force_unlock() {
    use support::cluster::RedisCluster;

    let cluster = RedisCluster::start();
    let client = async || {
        let backend = RedisBackend::cluster(cluster.urls()).connect().await;
        LockClient::builder(backend.expect("connect to the cluster"))
            .prefix("tl:")
            .build()
            .expect("valid configuration")
    };
    let (a, b, operator) = (client().await, client().await, client().await);
    let guard = a.lock("acct:1").acquire().await.unwrap();
    let info = operator.inspect("acct:1").await.unwrap();
    assert_eq!(only_holder(&info), (guard.holder().id(), LockKind::Exclusive, 1));
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { b.lock("acct:1").wait(Duration::from_secs(20)).acquire().await }
    });
    support::eventually(Duration::from_secs(2), "the waiter waits", || b.waiters() == 1).await;
    // The waiter has tried once and listens; the forced unlock must reach it on its shard.
    assert!(operator.force_unlock("acct:1").await.unwrap());
    let next = timeout(PROMPT, waiter).await.unwrap().unwrap().unwrap();
    let info = operator.inspect("acct:1").await.unwrap();
    assert_eq!(only_holder(&info).0, next.holder().id());
    next.release().await.unwrap();
    drop(guard);
}

/// With keyed hashing, the operator's client (same secret) finds the lock by its user key.
#[cfg(feature = "keyed-hash")]
#[tokio::test]
async fn keyed_hash_names_the_same_lock() {
    let backend = MemoryBackend::new();
    let keyed = |backend| {
        LockClient::builder(backend)
            .keyed_hash(b"a secret of at least thirty-two bytes!!")
            .build()
            .expect("valid configuration")
    };
    let (app, operator) = (keyed(backend.clone()), keyed(backend));
    let guard = app.lock("user@example.com").acquire().await.unwrap();
    let info = operator.inspect("user@example.com").await.unwrap();
    assert_eq!(only_holder(&info).0, guard.holder().id());
    assert!(operator.force_unlock("user@example.com").await.unwrap());
}

/// A forced unlock that freed a hold is counted, by the kind of the hold as the store reports
/// it (a fair grant is an owner record like a plain one: exclusive); one that freed nothing is
/// not.
#[cfg(feature = "metrics")]
#[test]
fn force_unlocks_are_counted() {
    use metrics_util::debugging::DebugValue;

    let mut counted: Vec<_> = support::recorded::run(async |snapshotter| {
        let locks = LockClient::in_memory();
        let guard = locks.fair_lock("counted").acquire().await.unwrap();
        assert!(locks.force_unlock("counted").await.unwrap());
        assert!(!locks.force_unlock("counted").await.unwrap());
        drop(guard);
        let rw = locks.read_write_lock("read");
        let guard = rw.read().acquire().await.unwrap();
        assert!(locks.force_unlock("read").await.unwrap());
        drop(guard);
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| key.key().name() == tower_lock::metrics::FORCE_UNLOCKS)
            .map(|(key, _, _, value)| {
                let labels: Vec<String> =
                    key.key().labels().map(|l| l.value().to_owned()).collect();
                (labels, value)
            })
            .collect()
    });
    counted.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        counted,
        [
            (vec!["exclusive".to_owned()], DebugValue::Counter(1)),
            (vec!["read".to_owned()], DebugValue::Counter(1)),
        ]
    );
}
