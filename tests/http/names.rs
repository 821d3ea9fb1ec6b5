//! What names say, on the in-memory backend and on a `redis-server` started by the fixture in
//! `tests/support`: the lock a layer and an attribute take for one account (the same one, when
//! both keys carry the account's prefix), and the instance a lock's holder id names.

use crate::support;

use std::sync::Arc;

use axum::{Extension, Router, body::Body, extract::Path, routing::post};
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::Notify;
use tower::ServiceExt;
use tower_lock::{
    AnyLockClient, Backend, LockClient, LockContext, LockError, LockKind, LockLayer, MemoryBackend,
    RedisBackend, key, locked,
};

/// Lets a test hold a handler inside its lock: a request with the `x-park` header says it is
/// in, then waits until the test lets it go.
#[derive(Default)]
struct Park {
    entered: Notify,
    go: Notify,
}

impl Park {
    /// Parks the handler when `headers` ask for it.
    async fn maybe(&self, headers: &HeaderMap) {
        if headers.contains_key("x-park") {
            self.entered.notify_one();
            self.go.notified().await;
        }
    }
}

/// The lock name a handler ran under.
async fn withdraw(
    Extension(park): Extension<Arc<Park>>,
    headers: HeaderMap,
    lock: LockContext,
) -> String {
    park.maybe(&headers).await;
    lock.key().to_string()
}

#[locked(key = "account:{id}", wait = "0ms")]
async fn deposit(
    Path(id): Path<u64>,
    Extension(park): Extension<Arc<Park>>,
    headers: HeaderMap,
    lock: LockContext,
) -> String {
    let _ = id;
    park.maybe(&headers).await;
    lock.key().to_string()
}

/// One account's withdrawals under a layer, its deposits under `#[locked]`: the README's
/// router.
fn accounts<B: Backend>(locks: &LockClient<B>, park: &Arc<Park>) -> Router {
    Router::new()
        .route("/accounts/{id}/withdraw", post(withdraw))
        .route_layer(
            LockLayer::new(locks.clone())
                .key(key::path_param("id").prefixed("account:"))
                .wait(std::time::Duration::ZERO),
        )
        .route("/accounts/{id}/deposit", post(deposit))
        .layer(Extension(AnyLockClient::from(locks.clone())))
        .layer(Extension(park.clone()))
}

/// Sends `POST uri` (parked in its handler with `park`); returns the status and the body.
async fn post_to(app: &Router, uri: &str, park: bool) -> (StatusCode, String) {
    let mut request = Request::post(uri);
    if park {
        request = request.header("x-park", "1");
    }
    let response = app.clone().oneshot(request.body(Body::empty()).unwrap()).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// While a request on one route holds account 7, a request on the other route is refused at
/// once (423), and the operator's `inspect("account:7")` sees the hold; both routes run under
/// the lock `locks.lock("account:7")` names.
async fn layer_and_attribute_take_one_lock<B: Backend>(locks: LockClient<B>) {
    let park = Arc::new(Park::default());
    let app = accounts(&locks, &park);
    let expected = locks.lock_key("", "account:7", LockKind::Exclusive).unwrap().to_string();
    for (holder, other) in [("withdraw", "deposit"), ("deposit", "withdraw")] {
        let held = tokio::spawn({
            let app = app.clone();
            async move { post_to(&app, &format!("/accounts/7/{holder}"), true).await }
        });
        park.entered.notified().await;
        assert!(locks.inspect("account:7").await.unwrap().is_locked());
        let refused = post_to(&app, &format!("/accounts/7/{other}"), false).await;
        assert_eq!(
            refused.0,
            StatusCode::LOCKED,
            "{other} ran while {holder} held account 7: {refused:?}"
        );
        // Another account is another lock.
        assert_eq!(post_to(&app, &format!("/accounts/8/{other}"), false).await.0, StatusCode::OK);
        park.go.notify_one();
        assert_eq!(held.await.unwrap(), (StatusCode::OK, expected.clone()));
        assert_eq!(
            post_to(&app, &format!("/accounts/7/{other}"), false).await,
            (StatusCode::OK, expected.clone())
        );
    }
    assert!(!locks.inspect("account:7").await.unwrap().is_locked());
}

#[tokio::test]
async fn a_layer_and_an_attribute_take_one_lock_per_account_in_memory() {
    layer_and_attribute_take_one_lock(LockClient::in_memory()).await;
}

#[tokio::test]
async fn a_layer_and_an_attribute_take_one_lock_per_account_on_redis() {
    let store =
        support::stores::on_redis(|backend| LockClient::builder(backend).build().unwrap()).await;
    layer_and_attribute_take_one_lock(store.a.clone()).await;
}

/// A client named `billing`.
fn billing<B: Backend>(backend: B) -> LockClient<B> {
    LockClient::builder(backend).name("billing").build().unwrap()
}

/// A client whose name has every character a holder id must not carry.
fn oddly_named<B: Backend>(backend: B) -> LockClient<B> {
    LockClient::builder(backend).name("pay:ments@eu/1 {x}~\n#é").build().unwrap()
}

/// `inspect` names the instance that holds a lock (name, host, pid), and two clients of one
/// name in one process keep distinct holder ids: neither re-enters the other's lock.
async fn inspect_names_the_holder<B: Backend>(store: support::stores::Env<B>) {
    let (a, b) = (store.a, store.b);
    let guard = a.lock("account:7").acquire().await.unwrap();
    let info = b.inspect("account:7").await.unwrap();
    assert_eq!(info.holders.len(), 1, "{info:?}");
    let holder = &info.holders[0];
    assert_eq!(holder.id, guard.holder().id());
    let client = holder.client().expect("a holder of this crate");
    assert!(client.starts_with("billing@"), "{holder:?}");
    assert!(client.ends_with(&format!("/{}", std::process::id())), "{holder:?}");
    assert_eq!(client, guard.holder().client());

    // Same name, host and pid: still another holder.
    let theirs = b.holder();
    assert_eq!(theirs.client(), client);
    assert_ne!(theirs.id(), guard.holder().id());
    let refused = theirs.scope(async { b.lock("account:7").try_acquire().await }).await;
    assert!(matches!(refused, Err(LockError::WaitTimeout { .. })), "{refused:?}");
    guard.release().await.unwrap();
}

/// An odd name is sanitised in the holder id, and the lock it holds works as any other:
/// taken, re-entered, inspected (one grant in the store; two holds as its own client counts
/// them), released.
async fn odd_names_are_sanitised<B: Backend>(store: support::stores::Env<B>) {
    let locks = store.a;
    let holder = locks.holder();
    let (outer, inner) = holder
        .clone()
        .scope(async {
            let outer = locks.lock("account:7").acquire().await.unwrap();
            let inner = locks.lock("account:7").try_acquire().await.unwrap();
            (outer, inner)
        })
        .await;
    let info = store.b.inspect("account:7").await.unwrap();
    assert_eq!(info.holders.len(), 1, "{info:?}");
    let (id, count) = (&info.holders[0].id, info.holders[0].hold_count);
    assert_eq!((id.as_str(), count), (holder.id(), 1));
    let own = locks.inspect("account:7").await.unwrap();
    assert_eq!(own.holders[0].hold_count, 2, "{own:?}");
    let client = info.holders[0].client().expect("a holder of this crate");
    assert!(client.starts_with("pay_ments_eu_1__x_____@"), "{id}");
    assert!(!id[..client.len()].contains(['{', '}', '~', '\n', ':', '#']), "{id}");
    inner.release().await.unwrap();
    outer.release().await.unwrap();
    assert!(!store.b.inspect("account:7").await.unwrap().is_locked());
}

#[tokio::test]
async fn inspect_names_the_holder_in_memory() {
    inspect_names_the_holder(support::stores::in_memory(billing::<MemoryBackend>).await).await;
}

#[tokio::test]
async fn inspect_names_the_holder_on_redis() {
    inspect_names_the_holder(support::stores::on_redis(billing::<RedisBackend>).await).await;
}

#[tokio::test]
async fn odd_names_are_sanitised_in_memory() {
    odd_names_are_sanitised(support::stores::in_memory(oddly_named::<MemoryBackend>).await).await;
}

#[tokio::test]
async fn odd_names_are_sanitised_on_redis() {
    odd_names_are_sanitised(support::stores::on_redis(oddly_named::<RedisBackend>).await).await;
}
