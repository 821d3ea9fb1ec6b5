//! Commands delivered late: a request held back on its connection reaches the server after its
//! caller gave up on it, and after later commands the client sent on other connections.

mod support;

#[allow(dead_code)]
#[path = "chaos/proxy.rs"]
mod proxy;

use std::time::Duration;

use proxy::{Mode, Proxy};
use support::{RedisServer, RespValue, eventually};
use tower_lock::{Lease, LockClient, LockError, error::BackendErrorKind};

/// The keys on `server` whose names end with `suffix`.
fn keys_ending(server: &RedisServer, suffix: &str) -> Vec<String> {
    match server.cmd(&["KEYS", &format!("*{suffix}")]) {
        RespValue::Array(Some(keys)) => keys.iter().filter_map(RespValue::as_str).collect(),
        other => panic!("KEYS answered {other:?}"),
    }
}

/// An acquire's `SET NX` is held back on its connection; the call times out and the undo of
/// its attempt, sent on a fresh connection, arrives first and records the attempt as given
/// up. Then the `SET` lands and makes a single hold that nobody holds. It must end no later
/// than that record: once the record is gone, a hold it no longer names would count as its
/// holder's, and every acquire would be refused while nobody holds the lock.
#[tokio::test]
async fn a_late_single_hold_ends_with_the_record_of_its_undo() {
    let server = RedisServer::start();
    let proxy = Proxy::start(&server.url()).await;
    let backend = support::redis_backend(proxy.url())
        .command_timeout(Duration::from_millis(200))
        .connect()
        .await
        .expect("connect");
    let locks = LockClient::builder(backend).build().expect("client");
    let lease = Duration::from_secs(2);
    // Late by most of the lease: a hold living a lease from its arrival would outlive the
    // record by about as much.
    let late_by = Duration::from_millis(1500);
    // The connection is open (and knows the server's clock) before anything is held back.
    let warm = locks.lock("warm").try_acquire().await.expect("a free lock");
    warm.release().await.expect("release");
    let sets = server.calls("set");

    proxy.set(Mode::Delay {
        up: late_by,
        down: Duration::ZERO,
    });
    let given_up = locks
        .lock("k")
        .lease(Lease::fixed(lease))
        .try_acquire()
        .await;
    assert!(
        matches!(&given_up, Err(LockError::Backend(error)) if *error.kind() == BackendErrorKind::Timeout),
        "{given_up:?}"
    );
    proxy.set(Mode::Pass);

    // The undo reaches the server on a fresh connection (retried until it does) and records
    // the attempt; the `SET` lands after it.
    let mut voids = Vec::new();
    eventually(late_by, "the undo records the attempt", || {
        voids = keys_ending(&server, ":void");
        !voids.is_empty()
    })
    .await;
    let void = voids.remove(0);
    let lock = void.strip_suffix(":void").expect("a void set").to_owned();
    eventually(late_by * 2, "the late SET arrives", || {
        server.calls("set") > sets
    })
    .await;
    eventually(
        lease * 3,
        "the record of the given-up attempt expires",
        || server.cmd(&["EXISTS", &void]).as_int() == 0,
    )
    .await;
    assert_eq!(
        server.cmd(&["EXISTS", &lock]).as_int(),
        0,
        "the late hold outlived the record of its given-up attempt: {:?} for {} ms more",
        server.cmd(&["GET", &lock]),
        server.cmd(&["PTTL", &lock]).as_int(),
    );
    let guard = locks
        .lock("k")
        .try_acquire()
        .await
        .expect("the lock is free");
    guard.release().await.expect("release");
}
