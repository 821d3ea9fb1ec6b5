//! Keyed-hash lock names on Redis: clients sharing the secret share locks, other secrets name
//! other locks, names have one length whatever the key, and the secret stays out of `Debug`.
use crate::support;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use support::{RedisServer, RespValue};
use tower_lock::{LockClient, LockError, LockKind, RedisBackend};

const SECRET: &[u8] = b"keyed-hash test secret";

async fn client(server: &RedisServer, secret: &[u8]) -> LockClient<RedisBackend> {
    let backend = support::redis_backend(server.url()).connect().await.expect("connect");
    LockClient::builder(backend)
        .keyed_hash(secret)
        .wait(Duration::from_secs(5))
        .build()
        .expect("valid configuration")
}

fn keys(server: &RedisServer) -> Vec<String> {
    match server.cmd(&["KEYS", "*"]) {
        RespValue::Array(Some(items)) => items.iter().filter_map(RespValue::as_str).collect(),
        other => panic!("KEYS answered {other:?}"),
    }
}

/// Two clients with one secret exclude each other on the same key: never two holders at once.
#[tokio::test]
async fn same_secret_same_lock() {
    let server = RedisServer::start();
    let (a, b) = (client(&server, SECRET).await, client(&server, SECRET).await);
    let name = a.lock_key("", "order:42", LockKind::Exclusive).unwrap();
    assert_eq!(name, b.lock_key("", "order:42", LockKind::Exclusive).unwrap());

    let held = a.lock("order:42").acquire().await.expect("a acquires");
    assert_eq!(keys(&server), vec![name.as_str().to_owned()]);
    let busy = b.lock("order:42").try_acquire().await;
    assert!(matches!(busy, Err(LockError::WaitTimeout { .. })), "{busy:?}");
    held.release().await.expect("release");

    let inside = Arc::new(AtomicBool::new(false));
    let entries = Arc::new(AtomicU64::new(0));
    let workers = [a, b].into_iter().map(|locks| {
        let (inside, entries) = (inside.clone(), entries.clone());
        tokio::spawn(async move {
            for _ in 0..25 {
                let guard = locks.lock("order:42").acquire().await.expect("acquire");
                assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                tokio::task::yield_now().await;
                inside.store(false, Ordering::SeqCst);
                entries.fetch_add(1, Ordering::SeqCst);
                guard.release().await.expect("release");
            }
        })
    });
    for worker in workers.collect::<Vec<_>>() {
        worker.await.expect("worker");
    }
    assert_eq!(entries.load(Ordering::SeqCst), 50);
}

/// Another secret names another lock: both clients hold "the same" key at once.
#[tokio::test]
async fn different_secrets_different_locks() {
    let server = RedisServer::start();
    let (a, b) = (client(&server, SECRET).await, client(&server, b"other").await);
    assert_ne!(
        a.lock_key("", "k", LockKind::Exclusive).unwrap(),
        b.lock_key("", "k", LockKind::Exclusive).unwrap()
    );
    let first = a.lock("k").try_acquire().await.expect("a acquires");
    let second = b.lock("k").try_acquire().await.expect("b's lock is another");
    assert_eq!(keys(&server).len(), 2);
    first.release().await.unwrap();
    second.release().await.unwrap();
}

/// Every name has the same length, whatever the key's length or bytes; the secret is never
/// shown.
#[tokio::test]
async fn names_are_bounded_and_secret_hidden() {
    let server = RedisServer::start();
    let locks = client(&server, SECRET).await;
    let lengths: Vec<usize> = [&b"k"[..], &[0xff; 512], b"{}%\0"]
        .iter()
        .map(|key| locks.lock_key("", key, LockKind::Exclusive).unwrap().as_str().len())
        .collect();
    assert_eq!(lengths, vec!["tower-lock:{}".len() + 43; 3]);
    let guard = locks.lock([0xff; 512]).acquire().await.expect("acquire");
    assert_eq!(keys(&server)[0].len(), lengths[0]);
    guard.release().await.unwrap();
    let shown = format!("{locks:?}");
    assert!(!shown.contains("keyed-hash test secret"), "{shown}");
    assert!(shown.contains("<secret>"), "{shown}");
}
