//! The Redis backend behind Sentinel (feature `sentinel`): it finds the master the sentinels
//! name, and after the master dies and the sentinels promote its replica, commands and release
//! notifications follow: holders keep or lose their locks cleanly, waiters acquire or time out,
//! never strand.
use crate::support;

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use support::sentinel::{MASTER_NAME, SentinelGroup, wait_until};
use tower_lock::{Lease, LockClient, LockError, RedisBackend, error::BackendErrorKind};

const PREFIX: &str = "tl:";

async fn client(group: &SentinelGroup) -> LockClient<RedisBackend> {
    let backend = RedisBackend::sentinel(group.sentinel_urls(), MASTER_NAME)
        .command_timeout(Duration::from_millis(500))
        .quarantine(Duration::ZERO)
        .connect()
        .await
        .expect("connect through the sentinels");
    LockClient::builder(backend).prefix(PREFIX).build().expect("valid configuration")
}

fn exists(server: &support::RedisServer, key: &str) -> bool {
    server.try_cmd(&["EXISTS", key]).is_ok_and(|reply| reply.as_int() == 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_live_on_the_master_the_sentinels_name() {
    let group = tokio::task::block_in_place(SentinelGroup::start);
    let locks = client(&group).await;
    let guard = locks.lock("doc:1").acquire().await.expect("acquire");
    assert!(exists(&group.master, "tl:{doc:1}"));
    guard.release().await.expect("release");
    assert!(!exists(&group.master, "tl:{doc:1}"));
}

#[tokio::test]
async fn an_unknown_master_name_fails_to_connect() {
    let group = tokio::task::spawn_blocking(SentinelGroup::start).await.expect("start");
    let error = RedisBackend::sentinel(group.sentinel_urls(), "no-such-master")
        .connect()
        .await
        .expect_err("the sentinels monitor no such master");
    assert_eq!(error.kind(), &BackendErrorKind::Unavailable, "{error}");
}

/// The master dies while two locks are held and four requests wait for one of them. The
/// sentinels promote the replica; the client follows it: each holder either still holds its
/// lock (it was replicated) and releases it, or is told it lost it; every waiter then gets the
/// lock in turn, one at a time, or times out cleanly — none waits forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_a_failover_while_locks_are_held_and_waited_on() {
    const WAITERS: u64 = 4;
    let mut group = tokio::task::block_in_place(SentinelGroup::start);
    let locks = client(&group).await;
    let lease = Lease::watchdog(Duration::from_secs(6));
    // A fenced lock's token before the failover; its next owner's must be higher after it.
    let fenced = locks.lock("f").fencing().acquire().await.expect("f");
    let token_before = fenced.fencing_token().expect("a token");
    fenced.release().await.expect("release f");
    let first = locks.lock("a").lease(lease).acquire().await.expect("a");
    let second = locks.lock("b").lease(lease).acquire().await.expect("b");

    let inside = Arc::new(AtomicU64::new(0));
    let acquired = Arc::new(AtomicU64::new(0));
    let waiters: Vec<_> = (0..WAITERS)
        .map(|_| {
            let (locks, inside, acquired) = (locks.clone(), inside.clone(), acquired.clone());
            tokio::spawn(async move {
                let result =
                    locks.lock("a").lease(lease).wait(Duration::from_secs(25)).acquire().await;
                match result {
                    Ok(guard) => {
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                        acquired.fetch_add(1, Ordering::SeqCst);
                        // A release racing the failover may fail; the lease then frees it.
                        let _ = guard.release().await;
                        Ok(())
                    }
                    Err(error) => Err(error),
                }
            })
        })
        .collect();
    let replica_has_locks = || exists(&group.replica, "tl:{a}") && exists(&group.replica, "tl:{b}");
    tokio::task::block_in_place(|| {
        wait_until(Duration::from_secs(5), "the locks to reach the replica", replica_has_locks);
    });
    wait_for(|| locks.waiters() == WAITERS as usize).await;

    let killed = std::time::Instant::now();
    group.master.kill();
    tokio::task::block_in_place(|| group.wait_for_master(&group.replica, Duration::from_secs(20)));
    let promoted = killed.elapsed();

    // Each holder kept its lock through the failover or was told it lost it.
    let mut kept = 0;
    for guard in [first, second] {
        if guard.is_lost() {
            continue;
        }
        match guard.release().await {
            Ok(()) => kept += 1,
            Err(LockError::Lost | LockError::NotHeld | LockError::Backend(_)) => {}
            Err(other) => panic!("unexpected release error {other:?}"),
        }
    }
    for waiter in waiters {
        match waiter.await.expect("waiter task") {
            Ok(()) => {}
            Err(LockError::WaitTimeout { .. } | LockError::Backend(_)) => {}
            Err(other) => panic!("waiter ended with {other:?}"),
        }
    }
    assert!(acquired.load(Ordering::SeqCst) >= 1, "no waiter got the lock after the failover");
    assert_eq!(locks.waiters(), 0);
    println!(
        "sentinel failover: promoted_after_ms={} holders_kept={kept}/2 waiters_acquired={}/{WAITERS} all_done_after_ms={}",
        promoted.as_millis(),
        acquired.load(Ordering::SeqCst),
        killed.elapsed().as_millis()
    );

    // New locks go to the promoted replica.
    let guard = locks.lock("c").acquire().await.expect("acquire after failover");
    assert!(exists(&group.replica, "tl:{c}"));
    guard.release().await.expect("release after failover");
    let fenced = locks.lock("f").fencing().acquire().await.expect("f after failover");
    let token_after = fenced.fencing_token().expect("a token");
    assert!(
        token_after > token_before,
        "token {token_after} after the failover, {token_before} before"
    );
    fenced.release().await.expect("release f");
}

/// Polls `check` every 10 ms for up to 5 s.
async fn wait_for(mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "condition not reached");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Without `min_replicas`, a failover counts as a restart: the promoted replica may have missed
/// the last grants, so it grants nothing new for the quarantine after the backend moved to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_replica_is_in_quarantine() {
    const QUARANTINE: Duration = Duration::from_millis(1500);
    let mut group = SentinelGroup::start();
    let backend = RedisBackend::sentinel(group.sentinel_urls(), MASTER_NAME)
        .command_timeout(Duration::from_millis(500))
        .quarantine(QUARANTINE)
        .connect()
        .await
        .expect("connect through the sentinels");
    // A lease within the quarantine: the quarantine is never shorter than the longest lease
    // the process asks for.
    let locks = LockClient::builder(backend)
        .prefix(PREFIX)
        .lease(Lease::watchdog(Duration::from_secs(1)))
        .build()
        .expect("valid configuration");
    // The fresh master's own quarantine (uptime counts whole seconds: up to two seconds more).
    let guard = locks
        .lock("before")
        .wait(QUARANTINE + Duration::from_secs(3))
        .acquire()
        .await
        .expect("the first master grants once its quarantine is over");
    guard.release().await.expect("release before the failover");

    group.master.kill();
    tokio::task::block_in_place(|| group.wait_for_master(&group.replica, Duration::from_secs(20)));
    // Until the backend has moved, a try fails with a backend error; once it has, it must be
    // refused for the quarantine (nobody holds "after") until it is over.
    let refused = loop {
        match locks.lock("after").try_acquire().await {
            Err(LockError::Backend(error)) if !in_quarantine(&error) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => break other,
        }
    };
    let moved = std::time::Instant::now();
    assert!(
        matches!(&refused, Err(LockError::Backend(error)) if in_quarantine(error)),
        "the promoted replica granted at once: {refused:?}"
    );
    // Through every pooled connection, not only the first one opened to the new master:
    // tries at once make the pool open the others.
    let tries = (0..8).map(|i| {
        let locks = locks.clone();
        async move { locks.lock(format!("after-{i}")).try_acquire().await }
    });
    for (attempt, again) in futures_util::future::join_all(tries).await.into_iter().enumerate() {
        assert!(
            matches!(&again, Err(LockError::Backend(error)) if in_quarantine(error)),
            "try {attempt}: the promoted replica granted within its quarantine: {again:?}"
        );
    }
    let guard = locks
        .lock("after")
        .wait(QUARANTINE * 2)
        .acquire()
        .await
        .expect("granted once the quarantine is over");
    let waited = moved.elapsed();
    assert!(
        waited >= QUARANTINE - Duration::from_millis(300),
        "granted {waited:?} after the move (quarantine {QUARANTINE:?})"
    );
    guard.release().await.expect("release after the failover");
}

/// Whether an acquire was refused because the store is in its restart quarantine.
fn in_quarantine(error: &tower_lock::BackendError) -> bool {
    *error.kind() == tower_lock::error::BackendErrorKind::Quarantined
}
