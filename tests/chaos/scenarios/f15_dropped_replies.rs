//! F15: the reply to an acquire or a release is swallowed after the script ran, and the
//! connection cut (ZOOKEEPER-1262, Redisson #5987). An acquire that reports failure must hold
//! nothing; a release whose answer is lost must still have freed the lock.

use std::time::Duration;

use tower_lock::{Lease, LockClient, LockError, RedisBackend};

use super::{Bed, Topology};
use crate::{
    checker,
    proxy::{Mode, Proxy},
    run,
    support::owned_by,
};

/// How long after the caller's answer the key is checked.
const SETTLE: Duration = Duration::from_millis(50);

/// Whether the lock key of `key` exists, asked of Redis directly (not through the proxy).
async fn exists(bed: &Bed, key: &str) -> bool {
    let (node, name) = (bed.redis.clone(), bed.lock_key(key));
    tokio::task::spawn_blocking(move || node.cmd(&["EXISTS", &name]).as_int() == 1)
        .await
        .expect("EXISTS")
}

async fn warm(client: &LockClient<RedisBackend>) {
    // Scripts loaded and every pooled connection open, so the swallowed reply is the lock's
    // own and the calls after it may be handed a connection that the cut killed.
    futures_util::future::join_all((0..8).map(|i| async move {
        let guard = client.lock(format!("warm{i}")).acquire().await;
        guard.expect("warm-up").release().await.expect("warm-up release");
    }))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f15_dropped_replies_leave_nothing_ambiguous() {
    let mut bed = Bed::new("F15", Topology::Single).await;
    let runs = run::count(20, 1000);
    let proxy = Proxy::start(bed.redis.url()).await;
    let client = bed.client_via(&proxy.url(), Duration::from_millis(500)).await;
    warm(&client).await;

    let (mut acquire_errors, mut acquire_retried, mut orphans, mut release_errors, mut unreleased) =
        (0, 0, 0, 0, 0);
    let mut kinds = Vec::new();
    for run in 0..runs {
        // Acquire: the script runs, its answer is lost.
        let key = format!("a{run}");
        proxy.drop_next_reply();
        let outcome = client.lock(&key).wait(Duration::from_secs(1)).acquire().await;
        assert!(proxy.reply_dropped(), "run {run}: no reply was swallowed");
        match outcome {
            // The client resolved the attempt and then took the lock for real.
            Ok(guard) => {
                acquire_retried += 1;
                assert!(exists(&bed, &key).await, "run {run}: Ok but no key");
                guard.release().await.expect("release");
            }
            Err(LockError::Backend(error)) => {
                acquire_errors += 1;
                kinds.push(format!("{:?}", error.kind()));
                tokio::time::sleep(SETTLE).await;
                if exists(&bed, &key).await {
                    orphans += 1;
                }
            }
            Err(other) => panic!("run {run}: acquire failed with {other:?}"),
        }

        // Release: the script runs, its answer is lost.
        let key = format!("r{run}");
        let guard = client.lock(&key).acquire().await.expect("acquire");
        proxy.drop_next_reply();
        match guard.release().await {
            Ok(()) => {}
            Err(LockError::Backend(error)) => {
                release_errors += 1;
                kinds.push(format!("{:?}", error.kind()));
            }
            Err(other) => panic!("run {run}: release failed with {other:?}"),
        }
        tokio::time::sleep(SETTLE).await;
        if exists(&bed, &key).await {
            unreleased += 1;
        }
    }
    kinds.sort_unstable();
    kinds.dedup();
    let quiet = checker::client_settles(&client, Duration::from_secs(2)).await;
    let leaks = checker::server_settled(&bed.redis, &bed.prefix).await;
    // The acquires whose replies were lost were undone: their attempts are recorded as given
    // up on, for a lease.
    let (leaks, voids) = leaks.less_bounded_voids(&bed.redis, Lease::DEFAULT.duration());
    let s = &mut bed.scenario;
    s.figure("runs", runs);
    s.figure("orphan_holds", format!("{orphans}/{runs}"));
    s.figure("acquire_errors", acquire_errors);
    s.figure("acquire_resolved_then_ok", acquire_retried);
    s.figure("release_errors", release_errors);
    s.figure("unreleased_after_50ms", format!("{unreleased}/{runs}"));
    s.figure("error_kinds", kinds.join(","));
    s.figure("void_records", voids);
    s.figure("leaked_keys", leaks.count());
    s.report();
    assert_eq!(orphans, 0, "a failed acquire left the lock held");
    assert_eq!(unreleased, 0, "a release whose reply was lost left the lock held");
    checker::assert_settled(quiet, &client);
    assert_eq!(leaks.count(), 0, "{leaks:?}");
}

/// F15b: the acquire's reply is lost *and* the network is slow long enough for the client's
/// inline resolution of that attempt to time out, so it is resolved in the background while
/// the waiter retries. However the two race, a successful release must free the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f15_lost_reply_with_late_resolution_is_released() {
    let mut bed = Bed::new("F15b", Topology::Single).await;
    let runs = run::count(10, 200);
    let command_timeout = Duration::from_millis(200);
    let proxy = Proxy::start(bed.redis.url()).await;
    let client = bed.client_via(&proxy.url(), command_timeout).await;
    warm(&client).await;
    let (mut phantom_holds, mut held_after_release) = (0, 0);
    for run in 0..runs {
        let key = format!("k{run}");
        let name = bed.lock_key(&key);
        // The resolution's request reaches Redis only after the client gave up on it.
        proxy.drop_next_reply_then(Mode::Delay {
            up: command_timeout + Duration::from_millis(50),
            down: Duration::ZERO,
        });
        let heal = async {
            tokio::time::sleep(command_timeout + Duration::from_millis(30)).await;
            proxy.set(Mode::Pass);
        };
        let (outcome, ()) =
            tokio::join!(client.lock(&key).wait(Duration::from_secs(2)).acquire(), heal);
        let guard = outcome.unwrap_or_else(|e| panic!("run {run}: {e:?}"));
        let owned = owned_by(|args| bed.redis.cmd(args), &name, guard.holder().id());
        if !owned {
            phantom_holds += 1;
        }
        guard.release().await.expect("release");
        // Give the background resolution time to land, then the lock must be free.
        tokio::time::sleep(Duration::from_millis(300)).await;
        if exists(&bed, &key).await {
            held_after_release += 1;
        }
    }
    let quiet = checker::client_settles(&client, Duration::from_secs(2)).await;
    let s = &mut bed.scenario;
    s.figure("runs", runs);
    s.figure("phantom_holds", format!("{phantom_holds}/{runs}"));
    s.figure("held_after_release", format!("{held_after_release}/{runs}"));
    s.figure("client_state_left", checker::client_leaks(&client));
    s.report();
    assert_eq!(held_after_release, 0, "a released lock stayed held in Redis");
    checker::assert_settled(quiet, &client);
}
