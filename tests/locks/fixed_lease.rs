//! A fixed lease lives its whole length in Redis: the guard of a hold kept past its lease
//! reports the lock lost at its deadline (a little before the lease ends), and its client
//! leaves the key to expire by itself rather than delete it. (The in-memory store's case is a
//! unit test of the watchdog, on a paused clock.)

use crate::support;

use std::time::Duration;

use support::{RedisServer, RespValue};
use tower_lock::{Lease, LockClient};

/// The store's count of keys it expired, from `INFO stats`.
fn expired_keys(server: &RedisServer) -> u64 {
    let stats = server.info("stats").expect("INFO stats");
    stats
        .lines()
        .find_map(|line| line.strip_prefix("expired_keys:"))
        .and_then(|count| count.trim().parse().ok())
        .expect("expired_keys in INFO stats")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_lease_expires_in_the_store_not_by_its_client() {
    let server = RedisServer::start();
    let backend = support::redis_backend(server.url())
        .connect()
        .await
        .expect("connect");
    let locks = LockClient::builder(backend).build().expect("valid client");
    let lease = Lease::fixed(Duration::from_secs(2));
    let (deletes, expired) = (server.calls("del"), expired_keys(&server));
    let guard = locks
        .lock("report")
        .lease(lease)
        .acquire()
        .await
        .expect("acquired");
    guard.lost().await;
    // Once the key is gone, it went either by its own expiry or by a delete from the client,
    // which the client would have sent the moment the guard was lost, before the expiry.
    support::eventually(lease.duration() * 2, "the lock's key is gone", || {
        server.cmd(&["EXISTS", "tower-lock:{report}"]) == RespValue::Int(0)
    })
    .await;
    assert_eq!(
        server.calls("del"),
        deletes,
        "the client deleted its hold before its fixed lease ran out"
    );
    assert!(expired_keys(&server) > expired, "the key expired by itself");
    drop(guard);
}
