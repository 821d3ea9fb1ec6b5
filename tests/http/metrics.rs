//! The metrics of the `metrics` feature move as locks are taken, waited for, renewed, lost,
//! released and refused, with labels from fixed sets only (never a user key). Recorded with
//! `metrics-util`'s debugging recorder, installed for this thread only.
use crate::support;

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use http::{Request, Response, StatusCode};
use metrics_util::debugging::{DebugValue, Snapshotter};
use support::RedisServer;
use tower::{ServiceBuilder, ServiceExt, service_fn};
use tower_lock::{Lease, LockClient, LockError, LockLayer, key, metrics::*};

/// A snapshot as `name{label=value,...}` → value; counters and gauges as numbers, histograms
/// as their sample count. Taking it resets the recorder.
fn snapshot(snapshotter: &Snapshotter) -> HashMap<String, f64> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let mut labels: Vec<String> = key
                .key()
                .labels()
                .map(|label| format!("{}={}", label.key(), label.value()))
                .collect();
            labels.sort();
            let name = format!("{}{{{}}}", key.key().name(), labels.join(","));
            let value = match value {
                DebugValue::Counter(n) => n as f64,
                DebugValue::Gauge(g) => g.into_inner(),
                DebugValue::Histogram(samples) => samples.len() as f64,
            };
            (name, value)
        })
        .collect()
}

fn get(values: &HashMap<String, f64>, name: &str) -> f64 {
    values.get(name).copied().unwrap_or(0.0)
}

/// The watchdog lease of the holder: long enough that a renewal delayed by a busy machine
/// still lands within it.
const LEASE: Duration = Duration::from_millis(1500);

#[test]
fn metrics_follow_the_engine() {
    let server = RedisServer::start();
    support::recorded::run(async |snapshotter| scenario(&server, snapshotter).await);
}

async fn scenario(server: &RedisServer, snapshotter: &Snapshotter) {
    let connect = async || support::redis_backend(server.url()).connect().await.expect("connect");
    let a = LockClient::builder(connect().await).lease(Lease::watchdog(LEASE)).build().unwrap();
    let b = LockClient::builder(connect().await).build().unwrap();
    let secret_key = "user-secret-key-7";

    // Acquired, then held across renewals.
    let guard = a.lock(secret_key).acquire().await.expect("acquire");
    // A waiter while it is held: the gauge counts it.
    let waiting = {
        let b = b.clone();
        tokio::spawn(async move { b.lock(secret_key).wait(Duration::from_secs(5)).acquire().await })
    };
    while b.waiters() != 1 {
        tokio::task::yield_now().await;
    }
    let timeout = b.lock(secret_key).try_acquire().await;
    assert!(matches!(timeout, Err(LockError::WaitTimeout { .. })));
    let during = snapshot(snapshotter);
    assert_eq!(get(&during, &format!("{WAITERS}{{}}")), 1.0, "{during:?}");
    assert_eq!(get(&during, &format!("{ACQUISITIONS}{{kind=exclusive}}")), 1.0);
    assert_eq!(get(&during, &format!("{TIMEOUTS}{{kind=exclusive}}")), 1.0);
    assert_eq!(get(&during, &format!("{WAIT_SECONDS}{{kind=exclusive,outcome=timeout}}")), 1.0);

    // Renewals: two of them, each moving the guard's deadline on.
    for _ in 0..2 {
        let deadline = Instant::now() + guard.remaining();
        support::eventually(LEASE, "the watchdog renewed the lock", || {
            Instant::now() + guard.remaining() > deadline + LEASE / 10
        })
        .await;
    }
    guard.release().await.expect("release");
    let handed = waiting.await.expect("task").expect("the waiter gets it");
    handed.release().await.expect("release");
    let after = snapshot(snapshotter);
    assert!(
        get(&after, &format!("{RENEWALS}{{kind=exclusive,outcome=renewed}}")) >= 2.0,
        "{after:?}"
    );
    // One batch per tick: the one lock held here, one round trip each.
    assert_eq!(
        get(&after, &format!("{RENEWAL_BATCH_SECONDS}{{outcome=ok}}")),
        get(&after, &format!("{RENEWALS}{{kind=exclusive,outcome=renewed}}")),
        "{after:?}"
    );
    assert_eq!(get(&after, &format!("{HOLD_SECONDS}{{kind=exclusive}}")), 2.0, "{after:?}");
    assert_eq!(get(&after, &format!("{ACQUISITIONS}{{kind=exclusive}}")), 1.0);
    // The gauge went back down (the snapshot shows the change since the last one).
    assert_eq!(get(&after, &format!("{WAITERS}{{}}")), -1.0, "{after:?}");

    // Losses: a foreign write takes the lock away; the next renewal finds another owner.
    let lost = a.lock("lose-me").acquire().await.expect("acquire");
    let name = lost.key().as_str().to_owned();
    server.cmd(&["DEL", &name]);
    server.cmd(&["HSET", &name, "someone-else", "1"]);
    tokio::time::timeout(Duration::from_secs(2), lost.lost()).await.expect("the loss is noticed");
    drop(lost);
    let losses = snapshot(snapshotter);
    assert_eq!(get(&losses, &format!("{LOSSES}{{kind=exclusive}}")), 1.0, "{losses:?}");
    assert!(get(&losses, &format!("{RENEWALS}{{kind=exclusive,outcome=not_held}}")) >= 1.0);

    // Errors by reason, and layer rejections by reason.
    let invalid = b.lock("").acquire().await;
    assert!(matches!(invalid, Err(LockError::InvalidKey(_))));
    let service = ServiceBuilder::new()
        .layer(LockLayer::new(b.clone()).key(key::header("x-account")))
        .service(service_fn(|_: Request<()>| async {
            Ok::<_, std::convert::Infallible>(Response::new(()))
        }));
    let response = service.oneshot(Request::get("/").body(()).unwrap()).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let refused = snapshot(snapshotter);
    assert_eq!(
        get(&refused, &format!("{ACQUIRE_ERRORS}{{kind=exclusive,reason=invalid_key}}")),
        1.0,
        "{refused:?}"
    );
    assert_eq!(get(&refused, &format!("{REJECTIONS}{{reason=missing_key}}")), 1.0);

    // No label anywhere carries the user key.
    for values in [&during, &after, &losses, &refused] {
        for name in values.keys() {
            assert!(!name.contains(secret_key) && !name.contains("lose-me"), "{name}");
        }
    }
}
