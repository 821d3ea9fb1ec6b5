//! Commands delivered late: a request held back on its connection reaches the server after its
//! caller gave up on it, and after later commands the client sent on other connections.

use crate::support;

#[allow(dead_code)]
#[path = "../chaos/proxy.rs"]
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

    proxy.set(Mode::Delay { up: late_by, down: Duration::ZERO });
    let given_up = locks.lock("k").lease(Lease::fixed(lease)).try_acquire().await;
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
    eventually(late_by * 2, "the late SET arrives", || server.calls("set") > sets).await;
    eventually(lease * 3, "the record of the given-up attempt expires", || {
        server.cmd(&["EXISTS", &void]).as_int() == 0
    })
    .await;
    assert_eq!(
        server.cmd(&["EXISTS", &lock]).as_int(),
        0,
        "the late hold outlived the record of its given-up attempt: {:?} for {} ms more",
        server.cmd(&["GET", &lock]),
        server.cmd(&["PTTL", &lock]).as_int(),
    );
    let guard = locks.lock("k").try_acquire().await.expect("the lock is free");
    guard.release().await.expect("release");
}

/// A client whose calls wait up to 5 s, on one connection: a call held up by a stalled server
/// is answered after the stall rather than timing out.
async fn patient_client(server: &RedisServer) -> LockClient<tower_lock::RedisBackend> {
    let backend = support::redis_backend(server.url())
        .command_timeout(Duration::from_secs(5))
        .pool_size(1)
        .connect()
        .await
        .expect("connect");
    LockClient::builder(backend).build().expect("client")
}

/// How long the server stalls in the two tests below: longer than the acquires' lease, so
/// that they reach it after the time they may act.
const STALL: Duration = Duration::from_millis(1500);
const SHORT_LEASE: Duration = Duration::from_secs(1);

/// A re-entry that extends its grant (for a fencing token the grant lacks) reaches the server
/// after its lease (the server stalled while its caller waited): the extend does nothing
/// there, and the client sends it once more on a new connection, where it extends the grant.
/// It is not mistaken for another owner's grant: the hold it nests in is not reported lost,
/// and nothing is left in the store when both are released.
#[tokio::test]
async fn a_reentry_extend_arriving_after_its_lease_is_sent_again() {
    let server = RedisServer::start();
    let locks = patient_client(&server).await;
    // The acquire script (an extend goes through it) is loaded before the stall.
    let warm = locks.lock("w").fencing().try_acquire().await.expect("free");
    warm.release().await.expect("release");
    let holder = locks.holder();
    let first = locks
        .lock("k")
        .holder(&holder)
        .lease(Lease::fixed(Duration::from_secs(30)))
        .acquire()
        .await
        .expect("a free lock");
    assert_eq!(first.fencing_token(), None);

    server.pause();
    let reentry = tokio::spawn({
        let (locks, holder) = (locks.clone(), holder.clone());
        async move {
            // A watchdog lease: the re-entry's hold lives as long as the grant, whenever the
            // extend's answer comes.
            locks
                .lock("k")
                .holder(&holder)
                .fencing()
                .lease(Lease::watchdog(SHORT_LEASE))
                .try_acquire()
                .await
        }
    });
    tokio::time::sleep(STALL).await;
    server.resume();
    let reentry = reentry.await.expect("task").expect("the re-entry's extend, sent again");
    assert_eq!(reentry.hold_count(), 2);
    assert!(reentry.fencing_token().is_some(), "the extend gave a token");
    assert_eq!(first.fencing_token(), reentry.fencing_token());
    assert!(!first.is_lost(), "the hold the re-entry nests in was reported lost");
    reentry.release().await.expect("release the re-entry");
    first.release().await.expect("release");
    assert!(keys_ending(&server, "{k}").is_empty(), "left in the store");
}

/// A first acquire of a free lock that reaches the server after its lease does nothing there,
/// and is sent again on a new connection. The call as a whole took longer than the lease, so
/// what the second try granted is given back and the caller gets a timeout: never "held" (a
/// free lock reported held), and nothing is left in the store.
#[tokio::test]
async fn an_acquire_arriving_after_its_lease_is_never_taken_for_held() {
    let server = RedisServer::start();
    let locks = patient_client(&server).await;
    // A fenced acquire goes through the script, which is loaded before the stall.
    let warm = locks.lock("w").fencing().try_acquire().await.expect("free");
    warm.release().await.expect("release");

    server.pause();
    let attempt = tokio::spawn({
        let locks = locks.clone();
        async move { locks.lock("free").fencing().lease(Lease::fixed(SHORT_LEASE)).try_acquire().await }
    });
    tokio::time::sleep(STALL).await;
    server.resume();
    let outcome = attempt.await.expect("task");
    assert!(
        matches!(&outcome, Err(LockError::Backend(error)) if *error.kind() == BackendErrorKind::Timeout),
        "{outcome:?}"
    );
    eventually(SHORT_LEASE * 2, "nothing is left of the lock", || {
        server.cmd(&["EXISTS", "tower-lock:{free}"]).as_int() == 0
    })
    .await;
    let guard = locks.lock("free").try_acquire().await.expect("the lock is free");
    guard.release().await.expect("release");
}
