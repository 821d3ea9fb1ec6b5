//! Waiter caps (§4.2) and F29 floods on Redis: a client refuses waiters over its caps at once,
//! and thousands of waiters (on one key, or on 10 000 distinct keys) use no more Redis
//! connections than a quiet client: the pool and one pub/sub connection.

use crate::support;

use std::time::Duration;

use support::{RedisServer, RespValue};
use tokio::{task::JoinHandle, time::Instant};
use tower_lock::{LockClient, LockError, LockGuard, RedisBackend};

const POOL_SIZE: u32 = 4;

async fn client(server: &RedisServer, max_waiters: usize) -> LockClient<RedisBackend> {
    let backend = support::redis_backend(server.url())
        .pool_size(POOL_SIZE)
        .command_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connect");
    LockClient::builder(backend)
        .max_waiters(max_waiters)
        .max_waiters_per_key(max_waiters)
        .wait(Duration::from_secs(60))
        .build()
        .expect("valid configuration")
}

/// Waits until `locks` has `count` waiters (polled: the engine has no event for it).
async fn until_waiters(locks: &LockClient<RedisBackend>, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while locks.waiters() != count {
        assert!(Instant::now() < deadline, "{} waiters, expected {count}", locks.waiters());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `count` tasks, each waiting for one of `keys`.
fn spawn_waiters(
    locks: &LockClient<RedisBackend>,
    keys: &[String],
    count: usize,
) -> Vec<JoinHandle<Result<LockGuard<RedisBackend>, LockError>>> {
    (0..count)
        .map(|i| {
            let (locks, key) = (locks.clone(), keys[i % keys.len()].clone());
            tokio::spawn(async move { locks.lock(key).acquire().await })
        })
        .collect()
}

/// Holds every key in `keys`.
async fn hold_all(
    locks: &LockClient<RedisBackend>,
    keys: &[String],
) -> Vec<LockGuard<RedisBackend>> {
    let tasks: Vec<_> = keys
        .iter()
        .map(|key| {
            let (locks, key) = (locks.clone(), key.clone());
            tokio::spawn(async move { locks.lock(key).try_acquire().await.expect("free key") })
        })
        .collect();
    let mut guards = Vec::with_capacity(tasks.len());
    for task in tasks {
        guards.push(task.await.expect("task"));
    }
    guards
}

/// Connected clients, the fixture's own connection excluded.
fn connections(server: &RedisServer) -> usize {
    let list = server.cmd(&["CLIENT", "LIST"]).as_str().expect("text");
    list.lines().count() - 1
}

/// The overall cap counts waiters over all keys; over it, an acquire fails at once with
/// `TooManyWaiters`, and the cap frees up as waiters finish.
#[tokio::test]
async fn global_cap_refuses_at_once() {
    let server = RedisServer::start();
    let holder = client(&server, 10_000).await;
    let waiter = client(&server, 50).await;
    let keys: Vec<String> = (0..25).map(|i| format!("key:{i}")).collect();
    let guards = hold_all(&holder, &keys).await;
    let waiting = spawn_waiters(&waiter, &keys, 50);
    until_waiters(&waiter, 50).await;

    for key in ["key:0", "elsewhere"] {
        let started = Instant::now();
        let refused = waiter.lock(key).acquire().await;
        assert!(matches!(refused, Err(LockError::TooManyWaiters)), "{refused:?}");
        assert!(started.elapsed() < Duration::from_millis(100), "{:?}", started.elapsed());
    }
    assert_eq!(waiter.waiters(), 50, "a refused acquire is not counted");

    for guard in guards {
        guard.release().await.expect("release");
    }
    for task in waiting {
        task.await.expect("task").expect("acquired").release().await.unwrap();
    }
    assert_eq!(waiter.waiters(), 0);
    let below = waiter.lock("elsewhere").try_acquire().await;
    below.expect("below the cap again").release().await.unwrap();
}

/// The per-key cap still applies below the overall one.
#[tokio::test]
async fn per_key_cap_refuses_at_once() {
    let server = RedisServer::start();
    let holder = client(&server, 100).await;
    let backend = support::redis_backend(server.url()).connect().await.expect("connect");
    let waiter =
        LockClient::builder(backend).max_waiters(100).max_waiters_per_key(3).build().unwrap();
    let _held = holder.lock("hot").try_acquire().await.unwrap();
    let waiting: Vec<_> = (0..3)
        .map(|_| {
            let waiter = waiter.clone();
            tokio::spawn(async move { waiter.lock("hot").acquire().await.map(drop) })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while waiter.waiters() != 3 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let refused = waiter.lock("hot").acquire().await;
    assert!(matches!(refused, Err(LockError::TooManyWaiters)), "{refused:?}");
    let cold = waiter.lock("cold").try_acquire().await;
    cold.expect("another key has room").release().await.unwrap();
    for task in waiting {
        task.abort();
    }
}

/// F29 (small counts): 2 000 waiters on one key, then 10 000 waiters on 10 000 distinct keys,
/// use the pool and one pub/sub connection per client, like a quiet client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_keep_connections_constant() {
    let server = RedisServer::start();
    let holder = client(&server, 20_000).await;
    let waiter = client(&server, 20_000).await;
    // Each client: at most POOL_SIZE pooled connections and one pub/sub connection.
    let bound = 2 * (POOL_SIZE as usize + 1);

    let hot = vec!["hot".to_owned()];
    let hot_guard = hold_all(&holder, &hot).await;
    let one_key = spawn_waiters(&waiter, &hot, 2_000);
    until_waiters(&waiter, 2_000).await;
    let on_one_key = connections(&server);
    assert!(on_one_key <= bound, "{on_one_key} connections with 2 000 waiters");
    assert_eq!(waiter.backend().subscribed_channels(), 1);
    let refused = waiter.lock("hot").try_acquire().await;
    assert!(matches!(refused, Err(LockError::WaitTimeout { .. })), "{refused:?}");

    let distinct: Vec<String> = (0..10_000).map(|i| format!("flood:{i}")).collect();
    let guards = hold_all(&holder, &distinct).await;
    let many_keys = spawn_waiters(&waiter, &distinct, distinct.len());
    until_waiters(&waiter, 12_000).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while waiter.backend().subscribed_channels() != 10_001 {
        assert!(Instant::now() < deadline, "{} channels", waiter.backend().subscribed_channels());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let on_many_keys = connections(&server);
    assert!(on_many_keys <= bound, "{on_many_keys} connections with 12 000 waiters");
    eprintln!(
        "connections: {on_one_key} (2 000 waiters on one key), {on_many_keys} (+10 000 keys)"
    );

    for task in one_key.into_iter().chain(many_keys) {
        task.abort();
    }
    drop((hot_guard, guards));
    until_waiters(&waiter, 0).await;
    assert!(connections(&server) <= bound);
}

/// Checks the fixture helper the flood test relies on: `CLIENT LIST` counts our connections.
#[tokio::test]
async fn connection_count_sees_clients() {
    let server = RedisServer::start();
    assert_eq!(connections(&server), 0);
    let locks = client(&server, 10).await;
    locks.lock("k").try_acquire().await.unwrap().release().await.unwrap();
    assert!(matches!(server.cmd(&["PING"]), RespValue::Simple(_)));
    assert!((1..=POOL_SIZE as usize).contains(&connections(&server)));
}
