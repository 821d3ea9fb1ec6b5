//! Replica acknowledgement (`RedisBackendBuilder::min_replicas`): a grant counts only once
//! enough replicas copied it, and a grant they did not copy in time is undone. Also the failure
//! it narrows: without it, a lock granted on a master whose replica never saw it is granted
//! again after the replica is promoted.

use crate::support;

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use support::{
    RedisServer, RespValue,
    sentinel::{start_replica_of, wait_until},
};
use tokio::time::Instant;
use tower_lock::{Lease, LockClient, LockError, RedisBackend, error::BackendErrorKind};

const PREFIX: &str = "tl:";
/// How long a grant waits for acknowledgements when they are expected to come (generous: a
/// loaded machine must not fail it).
const ACK_TIMEOUT: Duration = Duration::from_secs(2);
/// How long it waits when they cannot come.
const SHORT_ACK_TIMEOUT: Duration = Duration::from_millis(200);

/// A client of `url` that wants `replicas` acknowledgements within `timeout` (none with 0).
async fn client(url: &str, replicas: u32, timeout: Duration) -> LockClient<RedisBackend> {
    let backend = support::redis_backend(url)
        .min_replicas(replicas, timeout)
        .connect()
        .await
        .expect("connect");
    LockClient::builder(backend).prefix(PREFIX).build().expect("valid configuration")
}

fn exists(server: &RedisServer, key: &str) -> bool {
    server.cmd(&["EXISTS", key]).as_int() == 1
}

#[tokio::test]
async fn a_grant_waits_for_the_replica_and_is_on_it_when_acquire_returns() {
    let master = RedisServer::start();
    let replica = start_replica_of(&master);
    let locks = client(&master.url(), 1, ACK_TIMEOUT).await;

    for fencing in [false, true] {
        let request = locks.lock("order:1").lease(Lease::fixed(Duration::from_secs(10)));
        let request = if fencing { request.fencing() } else { request };
        let guard = request.acquire().await.expect("acknowledged by the replica");
        // WAIT returned 1: the replica has applied the grant already.
        assert!(exists(&replica, "tl:{order:1}"), "grant not on the replica");
        guard.release().await.expect("release");
    }
    assert!(master.calls("wait") >= 2);
    assert!(!exists(&master, "tl:{order:1}"));
}

#[tokio::test]
async fn too_few_acknowledgements_undo_the_grant_and_fail_clearly() {
    let master = RedisServer::start();
    let replica = start_replica_of(&master);
    let locks = client(&master.url(), 1, SHORT_ACK_TIMEOUT).await;
    replica.pause();

    let started = Instant::now();
    let error = locks
        .lock("order:2")
        .wait(Duration::from_secs(2))
        .acquire()
        .await
        .expect_err("a paused replica cannot acknowledge");
    let elapsed = started.elapsed();
    replica.resume();

    match &error {
        LockError::Backend(e) => assert_eq!(
            e.kind(),
            &BackendErrorKind::ReplicasNotAcknowledged { wanted: 1, acknowledged: 0 },
            "{error}"
        ),
        other => panic!("expected a replica acknowledgement error, got {other:?}"),
    }
    // Failed after one WAIT, not after the whole wait.
    assert!(elapsed < Duration::from_secs(1), "took {elapsed:?}");
    assert!(!exists(&master, "tl:{order:2}"), "the undone grant was left behind");
    assert_eq!(locks.active_keys(), 0);

    // With the replica back, the same lock is granted (the undone attempt blocks nothing); a
    // resumed replica may take longer than the short timeout to catch up.
    let patient = client(&master.url(), 1, ACK_TIMEOUT).await;
    let guard = patient.lock("order:2").acquire().await.expect("acquire");
    guard.release().await.expect("release");
}

#[tokio::test]
async fn asking_for_more_replicas_than_exist_never_grants() {
    let master = RedisServer::start();
    let _replica = start_replica_of(&master);
    let locks = client(&master.url(), 2, SHORT_ACK_TIMEOUT).await;
    let error = locks.lock("order:3").try_acquire().await.expect_err("only one replica");
    assert!(
        matches!(&error, LockError::Backend(e) if matches!(
            e.kind(),
            BackendErrorKind::ReplicasNotAcknowledged { wanted: 2, acknowledged } if *acknowledged < 2
        )),
        "{error:?}"
    );
    assert!(!exists(&master, "tl:{order:3}"));
}

/// Mutual exclusion holds and every grant, including those to waiters of the same client
/// (which otherwise get the lock handed over in the release), is acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_grant_under_contention_is_acknowledged() {
    const TASKS: u64 = 6;
    const ROUNDS: u64 = 25;
    let master = RedisServer::start();
    let _replica = start_replica_of(&master);
    let locks = client(&master.url(), 1, ACK_TIMEOUT).await;
    let inside = Arc::new(AtomicU64::new(0));
    let waits_before = master.calls("wait");

    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (locks, inside) = (locks.clone(), inside.clone());
            tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let guard = locks
                        .lock("hot")
                        .wait(Duration::from_secs(20))
                        .acquire()
                        .await
                        .expect("acquire");
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                    tokio::task::yield_now().await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.expect("release");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    assert!(master.calls("wait") - waits_before >= TASKS * ROUNDS);
}

/// The failure `min_replicas` narrows, shown both ways: the master grants a lock its replica
/// never receives (the replica is down, and comes back empty), dies, and the replica is
/// promoted. Without acknowledgement the lock
/// is granted a second time on the promoted replica; with it, the first grant already failed.
#[tokio::test]
async fn failover_to_a_replica_that_missed_the_grant() {
    for acknowledged in [false, true] {
        let mut master = RedisServer::start();
        let mut replica = start_replica_of(&master);
        let first = client(&master.url(), u32::from(acknowledged), SHORT_ACK_TIMEOUT).await;
        // A paused replica would still read the grant from its socket once resumed; a dead one
        // restarted without persistence has lost it for sure.
        replica.kill();
        let granted = first
            .lock("account:7")
            .lease(Lease::fixed(Duration::from_secs(30)))
            .try_acquire()
            .await;
        master.kill();
        replica.restart();
        assert_eq!(replica.cmd(&["REPLICAOF", "NO", "ONE"]), RespValue::Simple("OK".to_owned()));
        wait_until(Duration::from_secs(5), "the promoted replica", || {
            replica.info("replication").is_ok_and(|info| info.contains("role:master"))
        });
        let second = client(&replica.url(), 0, SHORT_ACK_TIMEOUT).await;
        let again = second.lock("account:7").try_acquire().await;
        if acknowledged {
            assert!(granted.is_err(), "an unacknowledged grant was reported");
            assert!(again.is_ok(), "the lock was never held: {again:?}");
        } else {
            // The negative control: two holders believe they hold the lock.
            let _first = granted.expect("the master granted it");
            assert!(again.is_ok(), "expected the double grant without WAIT");
        }
    }
}

/// Like `WAIT`, `WAITAOF` must follow the grant on its own connection, which a cluster
/// connection does not promise: both options are refused before any node is contacted.
#[cfg(feature = "cluster")]
#[tokio::test]
async fn acknowledgements_are_refused_on_a_cluster() {
    // Nothing listens there: a refusal that needed a node would fail otherwise.
    let nodes = ["redis://127.0.0.1:1"];
    let builders = [
        RedisBackend::cluster(nodes).min_replicas(1, SHORT_ACK_TIMEOUT),
        RedisBackend::cluster(nodes).wait_aof(true, 0, SHORT_ACK_TIMEOUT),
    ];
    for (builder, option) in builders.into_iter().zip(["min_replicas", "wait_aof"]) {
        let error = builder.connect().await.expect_err("refused");
        assert!(
            matches!(error.kind(), BackendErrorKind::Unsupported { feature } if feature.starts_with(option)),
            "{error:?}"
        );
    }
}

/// `supports_wait_aof` asks the server on demand, from a backend made by `connect` or from an
/// existing pool alike (F19 checks the answer against the server's version); `connect` itself
/// sends no `WAITAOF` unless `wait_aof` is set (seen in `INFO commandstats` on servers that
/// have the command).
#[tokio::test]
async fn wait_aof_support_is_asked_on_demand() {
    use tower_lock::backend::redis::{bb8, bb8_redis::RedisConnectionManager};

    let server = RedisServer::start();
    let connected = support::redis_backend(server.url()).connect().await.expect("connect");
    let commands = server.info("commandstats").expect("INFO commandstats");
    assert!(!commands.contains("cmdstat_waitaof"), "{commands}");

    let manager = RedisConnectionManager::new(server.url()).expect("manager");
    let pool = bb8::Pool::builder().build_unchecked(manager);
    let shared = RedisBackend::builder(server.url())
        .pool(pool)
        .connect()
        .await
        .expect("connect through the application's pool");
    assert_eq!(
        connected.supports_wait_aof().await.expect("ask"),
        shared.supports_wait_aof().await.expect("ask")
    );
}
