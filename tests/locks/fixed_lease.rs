//! A fixed lease that runs out while its guard lives: the guard reports the lock lost at its
//! deadline (a little before the lease ends in the store), and its client deletes the grant
//! then, so the lock is free at once rather than when the store would have expired it. (The
//! in-memory store's case is a unit test of the watchdog, on a paused clock.)

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
async fn a_fixed_lease_that_ran_out_is_deleted_by_its_client() {
    let server = RedisServer::start();
    let backend = support::redis_backend(server.url()).connect().await.expect("connect");
    let locks = LockClient::builder(backend).build().expect("valid client");
    let lease = Lease::fixed(Duration::from_millis(500));
    let guard = locks.lock("report").lease(lease).acquire().await.expect("acquired");
    let name = guard.key().as_str().to_owned();
    let grant = support::owner_grant(|args| server.cmd(args), &name).expect("the grant");
    // The store would keep the record for a minute: only the client's delete can end it
    // sooner (its own expiry cannot race the delete).
    server.cmd(&["PEXPIRE", &name, "60000"]);
    let expired = expired_keys(&server);
    guard.lost().await;
    assert!(guard.is_lost());
    support::eventually(Duration::from_secs(20), "the lock's record is gone", || {
        server.cmd(&["EXISTS", &name]) == RespValue::Int(0)
    })
    .await;
    assert_eq!(expired_keys(&server), expired, "the record of {grant} was deleted, not expired");
    // The lock is free for the next holder at once.
    let next = locks.lock("report").try_acquire().await.expect("free");
    next.release().await.expect("released");
    drop(guard);
}
