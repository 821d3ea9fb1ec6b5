//! F18 / §4.4: the crate works as a Redis ACL user limited to its key and channel prefix and
//! to the commands it sends (`support::acl::rules`, the line the security guide documents):
//! exclusive, fair and read-write locks, fencing, waiting through pub/sub, renewals, leaving a
//! queue and resolving a lost reply run with no denial in `ACL LOG`. A user missing a grant gets the typed
//! `NoPermission` error at once.

use crate::support;

use std::time::Duration;

use support::{RedisServer, acl};
use tokio::time::{Instant, timeout};
use tower_lock::{BackendError, Lease, LockClient, LockError, LockGuard, RedisBackend};

async fn client_as(
    server: &RedisServer,
    user: &str,
    timeout: Duration,
) -> LockClient<RedisBackend> {
    let backend = support::redis_backend(server.url_as(user, PASSWORD))
        .command_timeout(timeout)
        .connect()
        .await
        .expect("connect as the ACL user");
    LockClient::builder(backend)
        .lease(Lease::watchdog(Duration::from_millis(300)))
        .wait(Duration::from_secs(5))
        .build()
        .expect("valid configuration")
}

/// `guard`'s lock `key` taken once more by its holder, through `client`.
async fn reenter(
    client: &LockClient<RedisBackend>,
    guard: &LockGuard<RedisBackend>,
    key: &str,
) -> LockGuard<RedisBackend> {
    let acquire = client.lock(key).acquire();
    guard.holder().clone().scope(acquire).await.expect("re-enter")
}

/// The password of the users made here.
const PASSWORD: &str = "lock-password";

/// Creates `user` with the README's rules for the default prefix on this server, less the
/// rule `without`.
fn create_user(server: &RedisServer, user: &str, without: Option<&str>) {
    let all = acl::rules(support::redis_version(), PASSWORD, &["tower-lock:"]);
    let rules: Vec<&str> =
        all.iter().map(String::as_str).filter(|rule| Some(*rule) != without).collect();
    assert_eq!(
        rules.len() + usize::from(without.is_some()),
        all.len(),
        "{without:?} is one of the rules"
    );
    server.acl_setuser(user, &rules);
}

fn assert_no_denials(server: &RedisServer, step: &str) {
    let log = server.acl_log();
    assert!(log.is_empty(), "ACL denials after {step}: {log:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_runs_as_the_limited_acl_user() {
    let server = RedisServer::start();
    create_user(&server, "towerlock", None);
    let a = client_as(&server, "towerlock", Duration::from_secs(1)).await;
    let b = client_as(&server, "towerlock", Duration::from_secs(1)).await;

    // Exclusive, re-entered, fenced; a waiter in the other client is woken through pub/sub.
    let first = a.lock("order:1").fencing().acquire().await.expect("acquire");
    let first_token = first.fencing_token().expect("a fencing token");
    let again = reenter(&a, &first, "order:1").await;
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.lock("order:1").fencing().acquire().await })
    };
    while b.waiters() != 1 {
        tokio::task::yield_now().await;
    }
    // Renewals: held past two renewal intervals.
    tokio::time::sleep(Duration::from_millis(250)).await;
    again.release().await.expect("release the re-entry");
    first.release().await.expect("release");
    let second = waiter.await.expect("task").expect("woken and acquired");
    assert!(second.fencing_token().expect("a fencing token") > first_token);
    second.release().await.expect("release");
    assert_no_denials(&server, "exclusive locks");

    // Fair: a queued waiter is served; a cancelled waiter leaves the queue.
    let fair = a.fair_lock("fair:1").acquire().await.expect("fair acquire");
    let queued = {
        let b = b.clone();
        tokio::spawn(async move { b.fair_lock("fair:1").acquire().await })
    };
    let cancelled = {
        let b = b.clone();
        tokio::spawn(async move { b.fair_lock("fair:1").acquire().await.map(drop) })
    };
    while b.queued() != 2 {
        tokio::task::yield_now().await;
    }
    cancelled.abort();
    fair.release().await.expect("fair release");
    queued.await.expect("task").expect("served").release().await.unwrap();
    assert_no_denials(&server, "fair locks");

    // Read-write: readers share, a writer waits for them.
    let rw = a.read_write_lock("doc:1");
    let (r1, r2) = (rw.read().acquire().await.unwrap(), rw.read().acquire().await.unwrap());
    let writer = {
        let b = b.clone();
        tokio::spawn(async move { b.read_write_lock("doc:1").write().acquire().await })
    };
    while b.waiters() != 1 {
        tokio::task::yield_now().await;
    }
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    writer.await.expect("task").expect("writer").release().await.unwrap();
    assert_no_denials(&server, "read-write locks");

    // A reply lost to a timeout is resolved (abandoned) once the server answers again.
    let slow = client_as(&server, "towerlock", Duration::from_millis(100)).await;
    let held_by_nobody = async {
        server.pause();
        let lost = slow.lock("lost:1").lease(Lease::fixed(Duration::from_secs(30))).acquire();
        let result = lost.await;
        server.resume();
        result
    };
    let result = held_by_nobody.await;
    // The last try met the pause: no reply, or no connection, in time.
    assert!(
        matches!(&result, Err(LockError::Backend(e)) if e.is_timeout() || e.is_unavailable()),
        "{result:?}"
    );
    let freed = b.lock("lost:1").wait(Duration::from_secs(3)).acquire().await;
    freed.expect("the abandoned attempt does not hold the lock").release().await.unwrap();
    assert_no_denials(&server, "resolving a lost reply");

    // Foreign data under the prefix is named by type, not overwritten.
    server.cmd(&["SET", "tower-lock:{foreign}", "x"]);
    let foreign = a.lock("foreign").try_acquire().await;
    assert!(matches!(&foreign, Err(LockError::Backend(e)) if e.is_wrong_type()), "{foreign:?}");
    assert_no_denials(&server, "foreign data");
}

fn no_permission(result: &Result<impl std::fmt::Debug, LockError>) -> Option<&BackendError> {
    match result {
        Err(LockError::Backend(error)) if error.is_no_permission() => Some(error),
        _ => None,
    }
}

/// Without the key grant, an acquire fails at once with `NoPermission`; without the channel
/// grant, a release that publishes (someone was refused the lock) does too.
#[tokio::test]
async fn missing_grants_give_no_permission_at_once() {
    let server = RedisServer::start();
    create_user(&server, "nokeys", Some("~tower-lock:*"));
    create_user(&server, "nochannels", Some("&tower-lock:*"));

    let nokeys = client_as(&server, "nokeys", Duration::from_secs(1)).await;
    let started = Instant::now();
    let refused =
        timeout(Duration::from_secs(2), nokeys.lock("k").acquire()).await.expect("no hang");
    let error = no_permission(&refused).unwrap_or_else(|| panic!("{refused:?}"));
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(error.to_string().contains("tower-lock:{k}"), "names the key: {error}");

    let nochannels = client_as(&server, "nochannels", Duration::from_secs(1)).await;
    let guard = nochannels.lock("k").acquire().await.expect("no channel needed yet");
    // A release publishes once an acquire was refused (someone may wait for it).
    let other = client_as(&server, "nochannels", Duration::from_secs(1)).await;
    assert!(matches!(other.lock("k").try_acquire().await, Err(LockError::WaitTimeout { .. })));
    let refused = timeout(Duration::from_secs(2), guard.release()).await.expect("no hang");
    assert!(no_permission(&refused).is_some(), "{refused:?}");
}
