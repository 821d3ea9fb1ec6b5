//! Fencing tokens: they rise strictly for one lock name from one owner to the next, across a
//! restart of the lock store that lost everything, and fencing leaves nothing behind for longer
//! than a few seconds whatever names clients send. (The failover and slot migration cases are
//! in `sentinel.rs` and `cluster.rs`, beside their fixtures.)

use crate::support;

use std::time::Duration;

use support::{RedisServer, RespValue};
use tower_lock::{Backend, Lease, LockClient, MemoryBackend, RedisBackend};

/// How long the lock store keeps a lock's last token after its last grant (the `…:fence` key).
const RECORD: Duration = Duration::from_secs(5);

async fn client(server: &RedisServer) -> LockClient<RedisBackend> {
    let backend = support::redis_backend(server.url())
        .command_timeout(Duration::from_millis(300))
        .connect()
        .await
        .expect("connect");
    LockClient::builder(backend).build().expect("valid")
}

/// Takes and releases the fenced lock `key` `times` times; returns its tokens in order.
async fn tokens<B: Backend>(locks: &LockClient<B>, key: &str, times: usize) -> Vec<u64> {
    let mut tokens = Vec::new();
    for _ in 0..times {
        let guard = locks
            .lock(key)
            .fencing()
            .wait(Duration::from_secs(5))
            .acquire()
            .await
            .expect("acquire");
        tokens.push(guard.fencing_token().expect("a fenced lock has a token"));
        guard.release().await.expect("release");
    }
    tokens
}

fn rising(tokens: &[u64]) -> bool {
    tokens.windows(2).all(|pair| pair[0] < pair[1])
}

/// Every key in the server, with its remaining time to live in milliseconds.
fn keys_with_ttl(server: &RedisServer) -> Vec<(String, i64)> {
    let RespValue::Array(Some(keys)) = server.cmd(&["KEYS", "*"]) else {
        panic!("KEYS failed");
    };
    keys.iter()
        .filter_map(RespValue::as_str)
        .map(|key| {
            let ttl = server.cmd(&["PTTL", &key]).as_int();
            (key, ttl)
        })
        .collect()
}

/// The store restarts empty (no persistence) between owners: every token after the restart is
/// above every token before it, although the store lost all it knew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rise_across_a_restart_without_persistence() {
    let mut server = RedisServer::start();
    let locks = client(&server).await;
    let mut before = Vec::new();
    for key in ["order:1", "order:2"] {
        let key_tokens = tokens(&locks, key, 20).await;
        assert!(rising(&key_tokens), "{key}: {key_tokens:?}");
        before.extend(key_tokens);
    }
    let holding = locks.lock("order:1").fencing().acquire().await.expect("hold");
    tokio::task::block_in_place(|| server.restart());
    assert!(keys_with_ttl(&server).is_empty(), "the store restarted empty");
    // The hold was lost with the store; the next owners still get higher tokens.
    drop(holding);
    let highest = before.iter().copied().max().expect("tokens");
    for key in ["order:1", "order:2"] {
        let after = tokens(&locks, key, 20).await;
        assert!(rising(&after), "{key}: {after:?}");
        assert!(
            after[0] > highest,
            "{key}: token {} after the restart, {highest} before",
            after[0]
        );
    }
}

/// Within one millisecond, or with the clock not moving, tokens still rise: 200 owners of one
/// lock back to back, from two clients.
#[tokio::test]
async fn tokens_rise_between_back_to_back_owners() {
    let server = RedisServer::start();
    let (a, b) = (client(&server).await, client(&server).await);
    let mut all = Vec::new();
    for _ in 0..100 {
        all.extend(tokens(&a, "hot", 1).await);
        all.extend(tokens(&b, "hot", 1).await);
    }
    assert!(rising(&all), "{all:?}");
    let memory = LockClient::in_memory();
    let local = tokens(&memory, "hot", 200).await;
    assert!(rising(&local), "{local:?}");
}

/// 10 000 fenced locks with distinct names, as untrusted path parameters would make: while
/// their last grant is recent, each leaves one key that expires within the record's life, and
/// then nothing at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_fenced_names_leave_nothing_behind() {
    const NAMES: usize = 10_000;
    let server = RedisServer::start();
    let locks = client(&server).await;
    let lease = Lease::fixed(Duration::from_secs(1));
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..32 {
        let locks = locks.clone();
        tasks.spawn(async move {
            for i in (task..NAMES).step_by(32) {
                let name = format!("upload:{i}:{}", "x".repeat(400));
                let guard = locks.lock(&name).fencing().lease(lease).acquire().await;
                guard.expect("acquire").release().await.expect("release");
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("task");
    }
    let left = keys_with_ttl(&server);
    assert!(left.len() <= NAMES, "{} keys for {NAMES} names", left.len());
    let unbounded: Vec<_> = left
        .iter()
        // -2: expired between the listing and the TTL (gone, as it should); -1: no expiry.
        .filter(|(_, ttl)| *ttl == -1 || *ttl > RECORD.as_millis() as i64)
        .take(5)
        .collect();
    assert!(unbounded.is_empty(), "keys that do not expire in time: {unbounded:?}");
    tokio::time::sleep(RECORD + Duration::from_millis(500)).await;
    let left = keys_with_ttl(&server);
    assert!(left.is_empty(), "{} keys left, e.g. {:?}", left.len(), left.first());
    assert_eq!(locks.active_keys(), 0);
}

/// The in-memory store keeps one number for all its tokens, whatever the names.
#[tokio::test]
async fn memory_tokens_rise_across_names() {
    let locks = LockClient::builder(MemoryBackend::new()).build().expect("valid");
    let mut all = Vec::new();
    for i in 0..100 {
        all.extend(tokens(&locks, &format!("name:{i}"), 1).await);
    }
    assert!(rising(&all), "{all:?}");
}

/// The store-side check the docs show: a write carrying a lower token than the highest seen is
/// refused.
const FENCED_WRITE: &str = "local last = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0') \
     if tonumber(ARGV[1]) < last then return 0 end \
     redis.call('HSET', KEYS[1], 'fence', ARGV[1]) \
     redis.call('HINCRBY', KEYS[1], 'writes', 1) \
     return 1";

/// Three clients take turns writing to a fenced store (a second Redis that refuses lower
/// tokens) while the lock store is restarted empty: writes are accepted again within one lease
/// of the restart (tokens went on rising), and once the leases and fencing records have run
/// out the lock store holds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_store_accepts_writes_soon_after_a_lock_store_restart() {
    let mut locks_store = RedisServer::start();
    let storage = RedisServer::start();
    let lease = Lease::watchdog(Duration::from_secs(1));
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(client(&locks_store).await);
    }
    let write = |token: u64| {
        let reply = storage.cmd(&["EVAL", FENCED_WRITE, "1", "account:1", &token.to_string()]);
        reply.as_int() == 1
    };
    let mut rejected_before = 0;
    for round in 0..30 {
        let locks = &clients[round % 3];
        let guard =
            locks.lock("account:1").fencing().lease(lease).acquire().await.expect("acquire");
        if !write(guard.fencing_token().expect("token")) {
            rejected_before += 1;
        }
        guard.release().await.expect("release");
    }
    assert_eq!(rejected_before, 0, "writes by successive owners were refused");
    tokio::task::block_in_place(|| locks_store.restart());
    let restarted = tokio::time::Instant::now();
    let mut first_accepted = None;
    let mut rejected_after = 0;
    for round in 0..30 {
        let locks = &clients[round % 3];
        let Ok(guard) = locks
            .lock("account:1")
            .fencing()
            .lease(lease)
            .wait(Duration::from_secs(2))
            .acquire()
            .await
        else {
            continue;
        };
        if write(guard.fencing_token().expect("token")) {
            first_accepted.get_or_insert_with(|| restarted.elapsed());
        } else {
            rejected_after += 1;
        }
        let _ = guard.release().await;
    }
    let first_accepted = first_accepted.expect("no write was accepted after the restart");
    println!(
        "fenced store: first write accepted {first_accepted:?} after the restart, \
         {rejected_after} refused after it"
    );
    assert!(first_accepted < lease.duration(), "accepted only after {first_accepted:?}");
    assert_eq!(rejected_after, 0, "writes refused after the restart");
    tokio::time::sleep(RECORD + Duration::from_millis(500)).await;
    assert!(keys_with_ttl(&locks_store).is_empty(), "the lock store keeps keys");
}
