//! The Redis backend on a Redis Cluster of three masters and three replicas, formed by the
//! fixture in `tests/support/cluster.rs`: mutual exclusion on keys spread over every master,
//! sharded notifications on the owning shard, fair and read-write locks, semaphores, a slot
//! migrated while
//! its lock is held and waited on, a master killed and replaced by its replica, and scripts
//! flushed on every node.
use crate::support;

use std::{
    collections::HashSet,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use support::{
    RedisServer, RespValue,
    cluster::{NODE_TIMEOUT_MS, RedisCluster},
};
use tokio::time::{Instant, timeout};
use tower_lock::{Lease, LockClient, LockError, LockGuard, RedisBackend};

/// How long a waiter may take to get a lock after its release when notifications work (its
/// own retry timer is the holder's 30-second lease).
const PROMPT: Duration = Duration::from_secs(1);

/// A client with its own cluster connections, using `prefix`.
async fn client(cluster: &RedisCluster, prefix: &str) -> LockClient<RedisBackend> {
    let backend =
        RedisBackend::cluster(cluster.urls()).connect().await.expect("connect to the cluster");
    LockClient::builder(backend)
        .prefix(prefix)
        .wait(Duration::from_secs(20))
        .build()
        .expect("valid configuration")
}

/// The Redis key of lock `key` under `prefix`.
fn lock_name(prefix: &str, key: &str) -> String {
    format!("{prefix}{{{key}}}")
}

/// The release channel of lock `key` under `prefix`.
fn channel(prefix: &str, key: &str) -> String {
    format!("{}:released", lock_name(prefix, key))
}

/// `PUBSUB SHARDNUMSUB channel` on `node`: its sharded subscribers of `channel`.
fn shard_subscribers(node: &RedisServer, channel: &str) -> i64 {
    match node.cmd(&["PUBSUB", "SHARDNUMSUB", channel]) {
        RespValue::Array(Some(items)) if items.len() == 2 => items[1].as_int(),
        other => panic!("unexpected PUBSUB SHARDNUMSUB reply: {other:?}"),
    }
}

/// A key under `prefix` whose lock lives on master `node`.
fn key_on(cluster: &RedisCluster, prefix: &str, node: usize) -> String {
    (0..)
        .map(|i| format!("k{i}"))
        .find(|key| cluster.owner_of(&lock_name(prefix, key)) == node)
        .expect("some key hashes to every master")
}

/// Starts waiting for `key` on `client`; the task returns the guard and when it was granted.
fn spawn_waiter(
    client: &LockClient<RedisBackend>,
    key: &str,
) -> tokio::task::JoinHandle<Result<(LockGuard<RedisBackend>, Instant), LockError>> {
    let client = client.clone();
    let key = key.to_owned();
    tokio::spawn(async move {
        let guard = client.lock(&key).acquire().await?;
        Ok((guard, Instant::now()))
    })
}

/// Two clients, eight tasks each, taking locks spread over every master in turn: never two
/// holders of one lock at a time, and no command ever spans slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mutual_exclusion_across_masters() {
    const KEYS: usize = 24;
    const TASKS: usize = 8;
    const ROUNDS: usize = 40;
    let cluster = RedisCluster::start();
    let keys: Vec<String> = (0..KEYS).map(|i| format!("order:{i}")).collect();
    let owners: HashSet<usize> =
        keys.iter().map(|key| cluster.owner_of(&lock_name("mx:", key))).collect();
    assert_eq!(owners.len(), 3, "the keys cover every master: {owners:?}");
    let clients = [client(&cluster, "mx:").await, client(&cluster, "mx:").await];
    let inside: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    let violations = Arc::new(AtomicU64::new(0));
    let granted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for (c, client) in clients.iter().enumerate() {
        for t in 0..TASKS {
            let (client, keys, inside) = (client.clone(), keys.clone(), inside.clone());
            let (violations, granted) = (violations.clone(), granted.clone());
            tasks.push(tokio::spawn(async move {
                for round in 0..ROUNDS {
                    let k = (round * 7 + t * 5 + c) % KEYS;
                    let guard = client.lock(&keys[k]).acquire().await.expect("acquire");
                    if inside[k].fetch_add(1, Ordering::SeqCst) != 0 {
                        violations.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::task::yield_now().await;
                    inside[k].fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.expect("release");
                    granted.fetch_add(1, Ordering::SeqCst);
                }
            }));
        }
    }
    for task in tasks {
        timeout(Duration::from_secs(40), task).await.expect("contention finishes").expect("task");
    }
    assert_eq!(violations.load(Ordering::SeqCst), 0, "mutual exclusion");
    assert_eq!(granted.load(Ordering::SeqCst), (2 * TASKS * ROUNDS) as u64, "every acquisition");
    for master in cluster.masters() {
        let stats = cluster.node(master).cmd(&["INFO", "errorstats"]).as_str().unwrap_or_default();
        assert!(!stats.contains("CROSSSLOT"), "node {master}: {stats}");
    }
}

/// A waiter subscribes on the shard that owns its lock and nowhere else, and the release is
/// published there alone (`SPUBLISH`, never `PUBLISH`) and wakes it at once.
#[tokio::test]
async fn waiters_listen_on_the_owning_shard() {
    let cluster = RedisCluster::start();
    let (a, b) = (client(&cluster, "sh:").await, client(&cluster, "sh:").await);
    for node in 0..3 {
        let key = key_on(&cluster, "sh:", node);
        let guard = a.lock(&key).acquire().await.expect("acquire");
        let waiter = spawn_waiter(&b, &key);
        let channel = channel("sh:", &key);
        support::eventually(Duration::from_secs(5), "the waiter subscribed", || {
            shard_subscribers(cluster.node(node), &channel) == 1
        })
        .await;
        for other in cluster.masters().into_iter().filter(|&m| m != node) {
            assert_eq!(shard_subscribers(cluster.node(other), &channel), 0);
        }
        let before: Vec<u64> = (0..3).map(|m| cluster.node(m).calls("spublish")).collect();
        guard.release().await.expect("release");
        let released = Instant::now();
        let (guard, granted) = waiter.await.expect("task").expect("the waiter acquires");
        assert!(granted - released < PROMPT, "woken by the release");
        for (m, before) in before.into_iter().enumerate() {
            let published = cluster.node(m).calls("spublish") - before;
            assert_eq!(published, u64::from(m == node), "SPUBLISH calls on node {m}");
        }
        guard.release().await.expect("release");
    }
    for master in cluster.masters() {
        assert_eq!(cluster.node(master).calls("publish"), 0);
    }
}

/// Fair locks hand out in queue order and read-write locks share readers, in cluster mode.
#[tokio::test]
async fn fair_and_read_write_locks() {
    let cluster = RedisCluster::start();
    let [a, b, c] = [
        client(&cluster, "frw:").await,
        client(&cluster, "frw:").await,
        client(&cluster, "frw:").await,
    ];

    let held = a.fair_lock("fair").acquire().await.expect("fair acquire");
    let order = Arc::new(Mutex::new(Vec::new()));
    let queue = lock_name("frw:", "fair") + ":queue";
    let owner = cluster.owner_of(&queue);
    let mut waiters = Vec::new();
    for (name, client) in [("b", &b), ("c", &c)] {
        let (client, order) = (client.clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let guard = client.fair_lock("fair").acquire().await.expect("fair wait");
            order.lock().unwrap_or_else(PoisonError::into_inner).push(name);
            guard.release().await.expect("fair release");
        }));
        let queued = waiters.len() as i64;
        support::eventually(Duration::from_secs(5), "the waiter queued", || {
            cluster.node(owner).cmd(&["LLEN", &queue]).as_int() == queued
        })
        .await;
    }
    held.release().await.expect("fair release");
    for waiter in waiters {
        timeout(Duration::from_secs(10), waiter).await.expect("fair waiters finish").expect("task");
    }
    assert_eq!(*order.lock().unwrap_or_else(PoisonError::into_inner), ["b", "c"]);

    let read_a = a.read_write_lock("rw").read().acquire().await.expect("read");
    let read_b = b.read_write_lock("rw").read().try_acquire().await.expect("shared read");
    assert!(matches!(
        c.read_write_lock("rw").write().try_acquire().await,
        Err(LockError::WaitTimeout { .. })
    ));
    let writer = {
        let c = c.clone();
        tokio::spawn(async move { c.read_write_lock("rw").write().acquire().await })
    };
    read_a.release().await.expect("release read");
    read_b.release().await.expect("release read");
    let write = timeout(Duration::from_secs(5), writer)
        .await
        .expect("the writer is woken")
        .expect("task")
        .expect("write");
    write.release().await.expect("release write");
}

/// A semaphore on every master: its permits are shared up to the count, a waiter listens on
/// the shard that owns it and is woken there when a permit is given back.
#[tokio::test]
async fn semaphores_on_every_master() {
    let cluster = RedisCluster::start();
    let (a, b) = (client(&cluster, "sem:").await, client(&cluster, "sem:").await);
    for node in 0..3 {
        let key = key_on(&cluster, "sem:", node);
        let lease = Lease::fixed(Duration::from_secs(30));
        let one = a.semaphore(&key, 2).lease(lease).acquire().await.expect("permit");
        let two = b.semaphore(&key, 2).lease(lease).acquire().await.expect("permit");
        assert!(matches!(
            b.semaphore(&key, 2).try_acquire().await,
            Err(LockError::WaitTimeout { .. })
        ));
        // The semaphore's key is the sorted set of its permit grants.
        let holders = lock_name("sem:", &key) + ":sem";
        assert_eq!(cluster.owner_of(&holders), node, "its keys share the lock's slot");
        assert_eq!(cluster.node(node).cmd(&["ZCARD", &holders]).as_int(), 2);
        let channel = lock_name("sem:", &key) + ":sem:released";
        let waiter = {
            let b = b.clone();
            tokio::spawn(async move {
                let permit = b.semaphore(&key, 2).acquire().await;
                (permit, Instant::now())
            })
        };
        support::eventually(Duration::from_secs(5), "the waiter subscribed", || {
            shard_subscribers(cluster.node(node), &channel) == 1
        })
        .await;
        one.release().await.expect("release");
        let released = Instant::now();
        let (permit, granted) = waiter.await.expect("task");
        let permit = permit.expect("the waiter gets the permit");
        assert!(granted - released < PROMPT, "woken by the release");
        permit.release().await.expect("release");
        two.release().await.expect("release");
    }
}

/// A held and waited lock whose slot moves to another master: the holder keeps renewing on the
/// new owner and releases there, the waiter follows its channel to the new owner and gets the
/// lock when it is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slot_migrated_while_held() {
    let lease = Lease::watchdog(Duration::from_millis(1500));
    let cluster = RedisCluster::start();
    let (a, b) = (client(&cluster, "mig:").await, client(&cluster, "mig:").await);
    let key = key_on(&cluster, "mig:", 0);
    let name = lock_name("mig:", &key);
    let channel = channel("mig:", &key);
    let guard = a.lock(&key).lease(lease).acquire().await.expect("acquire");
    let waiter = spawn_waiter(&b, &key);
    support::eventually(Duration::from_secs(5), "the waiter subscribed", || {
        shard_subscribers(cluster.node(0), &channel) == 1
    })
    .await;

    cluster.migrate_slot(cluster.slot_of(&name), 1);
    assert_eq!(cluster.owner_of(&name), 1);
    support::eventually(Duration::from_secs(3), "the waiter resubscribed on the new owner", || {
        shard_subscribers(cluster.node(1), &channel) == 1
    })
    .await;
    // Past two whole leases: only renewals sent to the new owner keep the lock.
    tokio::time::sleep(lease.duration() * 2).await;
    assert!(!guard.is_lost(), "the holder kept its lock");
    assert!(cluster.node(1).cmd(&["PTTL", &name]).as_int() > 0);
    assert!(!waiter.is_finished(), "the waiter still waits");

    guard.release().await.expect("release on the new owner");
    let released = Instant::now();
    let (guard, granted) = timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter is not stranded")
        .expect("task")
        .expect("the waiter acquires");
    assert!(granted - released < PROMPT, "woken by the release");
    guard.release().await.expect("release");
}

/// A fenced lock's tokens rise across a migration of its slot, whether the lock's last token
/// travels with it or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_rise_across_a_slot_migration() {
    let cluster = RedisCluster::start();
    let locks = client(&cluster, "mig:").await;
    let key = key_on(&cluster, "mig:", 0);
    let name = lock_name("mig:", &key);
    let mut last = 0;
    for (to, keep_record) in [(1, true), (2, false)] {
        let guard = locks.lock(&key).fencing().acquire().await.expect("acquire");
        let token = guard.fencing_token().expect("a token");
        assert!(token > last, "token {token} after {last}");
        last = token;
        guard.release().await.expect("release");
        let from = cluster.owner_of(&name);
        if !keep_record {
            // As if the last token had been lost with the old owner.
            cluster.node(from).cmd(&["DEL", &format!("{name}:fence")]);
        }
        cluster.migrate_slot(cluster.slot_of(&name), to);
        assert_eq!(cluster.owner_of(&name), to);
    }
    let guard = locks.lock(&key).fencing().acquire().await.expect("acquire");
    assert!(guard.fencing_token().expect("a token") > last);
    guard.release().await.expect("release");
}

/// A master killed while locks on it and on another master are held and waited on: its replica
/// takes over with the replicated locks, locks on the surviving masters keep working throughout
/// (new ones too, while the failed shard has no master), and both waiters get their lock
/// promptly once it is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn master_failover_while_held_and_waited() {
    let cluster = RedisCluster::start();
    let (a, b) = (client(&cluster, "fo:").await, client(&cluster, "fo:").await);
    let doomed = key_on(&cluster, "fo:", 0);
    let surviving = key_on(&cluster, "fo:", 1);
    let doomed_guard = a.lock(&doomed).acquire().await.expect("acquire");
    let surviving_guard = a.lock(&surviving).acquire().await.expect("acquire");
    let doomed_waiter = spawn_waiter(&b, &doomed);
    let surviving_waiter = spawn_waiter(&b, &surviving);
    for (node, key) in [(0, &doomed), (1, &surviving)] {
        support::eventually(Duration::from_secs(5), "the waiter subscribed", || {
            shard_subscribers(cluster.node(node), &channel("fo:", key)) == 1
        })
        .await;
    }
    // The replica has copied the doomed lock (and the waiter's mark on it) before its master
    // dies. Replication is asynchronous: a grant it had not copied yet would be gone after the
    // failover and its waiter would take the lock at once (the cluster guide's "Across a
    // failover"), which is not what this test is about.
    cluster.wait_replicated(0);

    let elsewhere = key_on(&cluster, "fo:", 2);
    let killed = Instant::now();
    let failover = tokio::task::spawn_blocking(move || {
        let mut cluster = cluster;
        let promoted = cluster.kill_master(0);
        (cluster, promoted)
    });
    let mut outage_rounds = 0;
    while !failover.is_finished() {
        let guard = a
            .lock(&elsewhere)
            .try_acquire()
            .await
            .expect("a surviving master grants locks during the failover");
        guard.release().await.expect("and releases them");
        outage_rounds += 1;
    }
    let (cluster, promoted) = failover.await.expect("failover");
    assert!(outage_rounds > 10, "only {outage_rounds} rounds during the failover");
    let recovery = Duration::from_millis(NODE_TIMEOUT_MS) + Duration::from_secs(2);
    support::eventually(recovery, "the waiter resubscribed on the promoted replica", || {
        shard_subscribers(cluster.node(promoted), &channel("fo:", &doomed)) == 1
    })
    .await;
    println!("waiter resubscribed {:?} after the kill", killed.elapsed());

    // The surviving master's lock never stopped working.
    assert!(!surviving_guard.is_lost());
    surviving_guard.release().await.expect("release on a surviving master");
    let released = Instant::now();
    let (guard, granted) = timeout(Duration::from_secs(5), surviving_waiter)
        .await
        .expect("not stranded")
        .expect("task")
        .expect("acquire on a surviving master");
    assert!(granted - released < PROMPT, "woken by the release");
    guard.release().await.expect("release");

    // The replica took over the replicated lock: its holder still holds it there (it renews
    // and releases it there), and the waiter gets it once released.
    let name = lock_name("fo:", &doomed);
    assert_eq!(cluster.owner_of(&name), promoted);
    assert_eq!(cluster.node(promoted).cmd(&["EXISTS", &name]).as_int(), 1);
    assert!(!doomed_guard.is_lost());
    assert!(!doomed_waiter.is_finished(), "the waiter still waits");
    doomed_guard.release().await.expect("release on the promoted replica");
    let released = Instant::now();
    let (guard, granted) = timeout(Duration::from_secs(5), doomed_waiter)
        .await
        .expect("not stranded")
        .expect("task")
        .expect("acquire after the failover");
    assert!(granted - released < PROMPT, "woken by the release");
    guard.release().await.expect("release");
}

/// `SCRIPT FLUSH` on every master: acquires, renewals and releases reload the scripts on each
/// node by sending their bodies.
#[tokio::test]
async fn scripts_reloaded_after_flush() {
    let lease = Lease::watchdog(Duration::from_millis(1500));
    let cluster = RedisCluster::start();
    let a = client(&cluster, "ns:").await;
    let keys: Vec<String> = (0..3).map(|node| key_on(&cluster, "ns:", node)).collect();
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(a.lock(key).lease(lease).acquire().await.expect("acquire"));
    }
    for master in cluster.masters() {
        assert_eq!(
            cluster.node(master).cmd(&["SCRIPT", "FLUSH"]),
            RespValue::Simple("OK".to_owned())
        );
    }
    // Past two whole leases: the locks live only if renewals reloaded the scripts.
    tokio::time::sleep(lease.duration() * 2).await;
    for (guard, key) in guards.iter().zip(&keys) {
        assert!(!guard.is_lost(), "{key} kept");
    }
    for master in cluster.masters() {
        cluster.node(master).cmd(&["SCRIPT", "FLUSH"]);
    }
    for guard in guards {
        guard.release().await.expect("release after a flush");
    }
    for master in cluster.masters() {
        cluster.node(master).cmd(&["SCRIPT", "FLUSH"]);
    }
    for key in &keys {
        let guard = a.lock(key).try_acquire().await.expect("acquire after a flush");
        guard.release().await.expect("release");
    }
}
