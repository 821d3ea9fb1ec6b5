//! `LockLayer` end to end: axum routers served over loopback HTTP, locks in a real
//! `redis-server` started for each test.

use crate::support;

use std::{
    convert::Infallible,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use axum::{
    Extension, Router,
    extract::Path,
    routing::{get, post},
};
use http::StatusCode;
use http_body_util::{BodyExt, Empty};
use support::{
    RedisServer,
    http::{Entered, assert_told_the_likely_wait, http, send, serve},
    logs::Logs,
};
use tower_lock::{Lease, LockClient, LockContext, LockLayer, RedisBackend, key};

async fn locks(server: &RedisServer) -> LockClient<RedisBackend> {
    let backend = support::redis_backend(server.url()).connect().await.unwrap();
    LockClient::builder(backend).build().unwrap()
}

/// Who is inside a handler right now, per key, across every app instance in the test.
#[derive(Clone, Default)]
struct Witness {
    inside: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
    overlaps: Arc<AtomicUsize>,
    max_concurrent: Arc<AtomicUsize>,
    total: Arc<AtomicUsize>,
}

impl Witness {
    async fn section(&self, key: &str, hold: Duration) {
        {
            let mut inside = self.inside.lock().unwrap();
            let n = inside.entry(key.to_owned()).or_default();
            *n += 1;
            if *n > 1 {
                self.overlaps.fetch_add(1, Ordering::SeqCst);
            }
            let all: usize = inside.values().sum();
            self.max_concurrent.fetch_max(all, Ordering::SeqCst);
        }
        tokio::time::sleep(hold).await;
        *self.inside.lock().unwrap().get_mut(key).unwrap() -= 1;
        self.total.fetch_add(1, Ordering::SeqCst);
    }
}

fn withdraw_app(locks: LockClient<RedisBackend>, witness: Witness, hold: Duration) -> Router {
    Router::new()
        .route(
            "/accounts/{id}/withdraw",
            post(move |Path(id): Path<String>| async move {
                witness.section(&id, hold).await;
                "ok"
            }),
        )
        .route_layer(LockLayer::new(locks).key(key::path_param("id")).wait(Duration::from_secs(10)))
}

/// Requests on one account serialize across two app instances sharing one Redis, while
/// requests on different accounts run at the same time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn same_key_serializes_across_instances() {
    let server = RedisServer::start();
    let witness = Witness::default();
    let hold = Duration::from_millis(5);
    let one = serve(withdraw_app(locks(&server).await, witness.clone(), hold)).await;
    let two = serve(withdraw_app(locks(&server).await, witness.clone(), hold)).await;
    let http = http();
    let mut tasks = Vec::new();
    for i in 0..120 {
        let base = if i % 2 == 0 { &one } else { &two };
        let url = format!("{base}/accounts/{}/withdraw", i % 4);
        let http = http.clone();
        tasks.push(tokio::spawn(async move { send(&http, "POST", &url).await.0 }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap(), StatusCode::OK);
    }
    assert_eq!(witness.total.load(Ordering::SeqCst), 120);
    assert_eq!(
        witness.overlaps.load(Ordering::SeqCst),
        0,
        "two requests on one account overlapped"
    );
    assert!(
        witness.max_concurrent.load(Ordering::SeqCst) > 1,
        "different accounts never ran concurrently"
    );
}

/// A request that cannot get the lock within the wait gets 423 with `Retry-After`: with no
/// hold of the lock seen yet, the 200 ms it waited (in whole seconds: 1), in milliseconds in
/// the text, never the 30 s watchdog lease the holder has left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wait_timeout_is_423_with_retry_after() {
    let server = RedisServer::start();
    let locks = locks(&server).await;
    let app = Router::new().route("/docs/{id}", post(|| async { "ok" })).route_layer(
        LockLayer::new(locks.clone())
            .key(key::path_param("id"))
            .name("docs")
            .wait(Duration::from_millis(200)),
    );
    let base = serve(app).await;
    // Someone else holds the lock the route would take (same name and key).
    let holder = locks
        .lock_in_namespace("docs", "7")
        .lease(Lease::watchdog(Duration::from_secs(30)))
        .acquire()
        .await
        .unwrap();
    let started = Instant::now();
    let (status, retry, body) = send(&http(), "POST", &format!("{base}/docs/7")).await;
    assert_eq!(status, StatusCode::LOCKED);
    assert_eq!(retry.as_deref(), Some("1"), "{body}");
    let ms: u64 = body
        .strip_prefix("locked; retry in about ")
        .and_then(|rest| rest.strip_suffix(" ms\n"))
        .expect("milliseconds under a second")
        .parse()
        .unwrap();
    assert!((200..1000).contains(&ms), "{ms} ms: the wait, not the lease");
    assert!(started.elapsed() < Duration::from_secs(2));
    holder.release().await.unwrap();
    let (status, _, _) = send(&http(), "POST", &format!("{base}/docs/7")).await;
    assert_eq!(status, StatusCode::OK);
}

/// A missing key is 400, an oversized one too; with `skip_missing_key` the request runs unlocked.
/// A `path_param` named after no parameter of the matched route: every request is refused
/// with 400, and a warning names the parameter and the route, once per route.
#[tokio::test(flavor = "current_thread")]
async fn a_path_param_the_route_lacks_is_reported() {
    let (logs, _capturing) = Logs::capture();
    let app = Router::new()
        .route("/accounts/{account_id}/withdraw", post(|| async { "ran" }))
        .route_layer(LockLayer::new(LockClient::in_memory()).key(key::path_param("id")));
    let url = format!("{}/accounts/7/withdraw", serve(app).await);
    for _ in 0..2 {
        assert_eq!(send(&http(), "POST", &url).await.0, StatusCode::BAD_REQUEST);
    }
    let logs = logs.text();
    let warnings = logs.matches("the matched route has no such path parameter").count();
    assert_eq!(warnings, 1, "one warning per route: {logs}");
    assert!(
        logs.contains("param=id") && logs.contains("/accounts/{account_id}/withdraw"),
        "the warning names the parameter and the route: {logs}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn missing_and_invalid_keys_are_400() {
    let server = RedisServer::start();
    let locks = locks(&server).await;
    let app = Router::new()
        .route("/strict", get(|| async { "ok" }))
        .route_layer(LockLayer::new(locks.clone()).key(key::header("x-account")))
        .merge(Router::new().route("/lenient", get(|| async { "ok" })).route_layer(
            LockLayer::new(locks.clone()).key(key::header("x-account")).skip_missing_key(),
        ));
    let base = serve(app).await;
    let http = http();
    assert_eq!(send(&http, "GET", &format!("{base}/strict")).await.0, StatusCode::BAD_REQUEST);
    assert_eq!(send(&http, "GET", &format!("{base}/lenient")).await.0, StatusCode::OK);
    let long = "x".repeat(600);
    let request = http::Request::get(format!("{base}/strict"))
        .header("x-account", long)
        .body(Empty::new())
        .unwrap();
    assert_eq!(http.request(request).await.unwrap().status(), StatusCode::BAD_REQUEST);
    let request = http::Request::get(format!("{base}/strict"))
        .header("x-account", "42")
        .body(Empty::new())
        .unwrap();
    assert_eq!(http.request(request).await.unwrap().status(), StatusCode::OK);
}

/// A client that disconnects mid-handler frees the lock at once, not after the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn client_disconnect_releases() {
    let server = RedisServer::start();
    let locks = locks(&server).await;
    let dropped = Arc::new(AtomicBool::new(false));
    let entered = Arc::new(tokio::sync::Notify::new());
    let (flag, signal) = (dropped.clone(), entered.clone());
    let app = Router::new()
        .route(
            "/slow/{id}",
            post(move || async move {
                struct OnDrop(Arc<AtomicBool>);
                impl Drop for OnDrop {
                    fn drop(&mut self) {
                        self.0.store(true, Ordering::SeqCst);
                    }
                }
                let _guard = OnDrop(flag);
                signal.notify_one();
                tokio::time::sleep(Duration::from_secs(60)).await;
                "done"
            }),
        )
        .route_layer(LockLayer::new(locks.clone()).key(key::path_param("id")).name("slow"));
    let base = serve(app).await;
    let url = format!("{base}/slow/1");
    let request = tokio::spawn(async move { send(&http(), "POST", &url).await });
    entered.notified().await;
    request.abort();
    let _ = request.await;
    // The server notices the closed connection and drops the handler and the guard.
    let started = Instant::now();
    let again = locks
        .lock_in_namespace("slow", "1")
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .expect("the lock is free after the client left");
    assert!(started.elapsed() < Duration::from_secs(2), "freed only after {:?}", started.elapsed());
    assert!(dropped.load(Ordering::SeqCst), "the handler future was not dropped");
    again.release().await.unwrap();
}

/// A panic in the handler, caught by `CatchPanicLayer`, releases the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn panic_in_handler_releases() {
    let server = RedisServer::start();
    let locks = locks(&server).await;
    let app = Router::new()
        .route(
            "/boom/{id}",
            post(|| async {
                if true {
                    panic!("handler failed");
                }
                "unreachable"
            }),
        )
        .route_layer(LockLayer::new(locks.clone()).key(key::path_param("id")).name("boom"))
        .layer(tower_http::catch_panic::CatchPanicLayer::new());
    let base = serve(app).await;
    let (status, _, _) = send(&http(), "POST", &format!("{base}/boom/1")).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    let again = locks
        .lock_in_namespace("boom", "1")
        .wait(Duration::from_secs(2))
        .acquire()
        .await
        .expect("free after the panic");
    again.release().await.unwrap();
}

/// A lock deleted behind the request's back: the handler future is dropped and the client gets 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_lock_cancels_the_handler_with_503() {
    let server = RedisServer::start();
    let locks = locks(&server).await;
    let finished = Arc::new(AtomicBool::new(false));
    let entered = Arc::new(tokio::sync::Notify::new());
    let (flag, signal) = (finished.clone(), entered.clone());
    let app = Router::new()
        .route(
            "/long/{id}",
            post(move |Extension(context): Extension<LockContext>| async move {
                signal.notify_one();
                let _ = context;
                tokio::time::sleep(Duration::from_secs(5)).await;
                flag.store(true, Ordering::SeqCst);
                "done"
            }),
        )
        .route_layer(
            LockLayer::new(locks.clone())
                .key(key::path_param("id"))
                .name("long")
                .lease(Lease::watchdog(Duration::from_millis(600))),
        );
    let base = serve(app).await;
    let url = format!("{base}/long/1");
    let request = tokio::spawn(async move { send(&http(), "POST", &url).await });
    entered.notified().await;
    // The key of route "long", id "1".
    let deleted = server.cmd(&["DEL", "tower-lock:long{1}"]).as_int();
    assert_eq!(deleted, 1);
    let started = Instant::now();
    let (status, _, _) = request.await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(!finished.load(Ordering::SeqCst), "the handler ran on without its lock");
}

/// Nested layers on the same key re-enter instead of deadlocking; the handler sees the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nested_layers_reenter() {
    let server = RedisServer::start();
    let locks = locks(&server).await;
    let inner_locks = locks.clone();
    let app = Router::new()
        .route(
            "/n/{id}",
            post(move |Extension(context): Extension<LockContext>| async move {
                // Direct use inside the request re-enters too.
                let again = inner_locks
                    .lock_in_namespace("nested", "1")
                    .try_acquire()
                    .await
                    .expect("re-entry from the handler");
                let count = again.hold_count();
                again.release().await.unwrap();
                format!("{count} {}", context.fencing_token().is_some())
            }),
        )
        .route_layer(LockLayer::new(locks.clone()).key(key::path_param("id")).name("nested"))
        .route_layer(
            LockLayer::new(locks.clone())
                .key(key::path_param("id"))
                .name("nested")
                .fencing()
                .wait(Duration::from_millis(500)),
        );
    let base = serve(app).await;
    let (status, _, body) = send(&http(), "POST", &format!("{base}/n/1")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, "3 true");
}

/// The layer composes with tower-http's `TimeoutLayer` (the lock is released when the
/// timeout drops the request) and tower's `ConcurrencyLimitLayer`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn composes_with_timeout_and_concurrency_limit() {
    let server = RedisServer::start();
    let locks = locks(&server).await;
    let app = Router::new()
        .route(
            "/t/{id}",
            post(|| async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                "late"
            }),
        )
        .route_layer(LockLayer::new(locks.clone()).key(key::path_param("id")).name("t"))
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(
            StatusCode::GATEWAY_TIMEOUT,
            Duration::from_millis(200),
        ))
        .layer(tower::limit::ConcurrencyLimitLayer::new(8));
    let base = serve(app).await;
    let (status, _, _) = send(&http(), "POST", &format!("{base}/t/1")).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    let again = locks
        .lock_in_namespace("t", "1")
        .wait(Duration::from_secs(2))
        .acquire()
        .await
        .expect("free after the timeout dropped the request");
    again.release().await.unwrap();
}

/// In read-write mode GETs overlap and writes run alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn read_write_mode() {
    let server = RedisServer::start();
    let locks = locks(&server).await;
    let readers = Arc::new(AtomicUsize::new(0));
    let max_readers = Arc::new(AtomicUsize::new(0));
    let writing = Arc::new(AtomicBool::new(false));
    let violations = Arc::new(AtomicUsize::new(0));
    let (r, m, w, v) = (readers.clone(), max_readers.clone(), writing.clone(), violations.clone());
    let (r2, w2, v2) = (readers.clone(), writing.clone(), violations.clone());
    let app = Router::new()
        .route(
            "/doc/{id}",
            get(move || {
                let (r, m, w, v) = (r.clone(), m.clone(), w.clone(), v.clone());
                async move {
                    let n = r.fetch_add(1, Ordering::SeqCst) + 1;
                    m.fetch_max(n, Ordering::SeqCst);
                    if w.load(Ordering::SeqCst) {
                        v.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    r.fetch_sub(1, Ordering::SeqCst);
                    Ok::<_, Infallible>("read")
                }
            })
            .post(move || {
                let (r, w, v) = (r2.clone(), w2.clone(), v2.clone());
                async move {
                    if w.swap(true, Ordering::SeqCst) || r.load(Ordering::SeqCst) > 0 {
                        v.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    w.store(false, Ordering::SeqCst);
                    "written"
                }
            }),
        )
        .route_layer(
            LockLayer::new(locks)
                .key(key::path_param("id"))
                .read_write()
                .wait(Duration::from_secs(10)),
        );
    let base = serve(app).await;
    let http = http();
    let mut tasks = Vec::new();
    for i in 0..60 {
        let (http, url) = (http.clone(), format!("{base}/doc/1"));
        let method = if i % 6 == 0 { "POST" } else { "GET" };
        tasks.push(tokio::spawn(async move { send(&http, method, &url).await.0 }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap(), StatusCode::OK);
    }
    assert_eq!(violations.load(Ordering::SeqCst), 0, "a write overlapped another request");
    assert!(max_readers.load(Ordering::SeqCst) > 1, "GETs never overlapped");
}

/// Past the per-key cap of waiting requests, a request is answered 503 with `Retry-After` at
/// once instead of piling up; a lease too short to hold is refused, not used.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiter_cap_and_bad_lease() {
    let server = RedisServer::start();
    let backend = support::redis_backend(server.url()).connect().await.unwrap();
    let locks = LockClient::builder(backend).max_waiters_per_key(2).build().unwrap();
    let app = Router::new().route("/c/{id}", post(|| async { "ok" })).route_layer(
        LockLayer::new(locks.clone())
            .key(key::path_param("id"))
            .name("cap")
            .wait(Duration::from_secs(5)),
    );
    let base = serve(app).await;
    let holder = locks.lock_in_namespace("cap", "1").acquire().await.unwrap();
    let http = http();
    let mut waiting = Vec::new();
    for _ in 0..2 {
        let (http, url) = (http.clone(), format!("{base}/c/1"));
        waiting.push(tokio::spawn(async move { send(&http, "POST", &url).await.0 }));
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while locks.waiters() < 2 {
        assert!(Instant::now() < deadline, "the two requests never queued");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let started = Instant::now();
    let (status, retry, _) = send(&http, "POST", &format!("{base}/c/1")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(retry.as_deref(), Some("1"));
    assert!(started.elapsed() < Duration::from_millis(500));
    holder.release().await.unwrap();
    for request in waiting {
        assert_eq!(request.await.unwrap(), StatusCode::OK);
    }
    let bad = locks.lock("k").lease(Lease::fixed(Duration::ZERO)).acquire().await;
    assert!(matches!(bad, Err(tower_lock::LockError::InvalidLease(_))), "{bad:?}");
}

/// Two routes with the same parameter value take different locks (the route is part of the
/// key); a custom rejection builder shapes the 423 response.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn routes_do_not_share_locks_and_rejections_are_customisable() {
    let server = RedisServer::start();
    let locks = locks(&server).await;
    let entered = Arc::new(tokio::sync::Notify::new());
    let release = Arc::new(tokio::sync::Notify::new());
    let (signal, wait_for) = (entered.clone(), release.clone());
    let layer = LockLayer::new(locks.clone())
        .key(key::path_param("id"))
        .wait(Duration::from_millis(100))
        .on_rejected(|rejection: tower_lock::LockRejection| {
            let status = rejection.status();
            let mut response =
                rejection.into_response_with(axum::body::Body::from(format!("busy: {status}")));
            response.headers_mut().insert("x-lock", http::HeaderValue::from_static("held"));
            response
        });
    let app = Router::new()
        .route(
            "/orders/{id}",
            post(move || async move {
                signal.notify_one();
                wait_for.notified().await;
                "order"
            }),
        )
        .route("/accounts/{id}", post(|| async { "account" }))
        .route("/accounts/{id}/again", post(|| async { "again" }))
        .route_layer(layer);
    let base = serve(app).await;
    let http = http();
    let order = {
        let (http, url) = (http.clone(), format!("{base}/orders/7"));
        tokio::spawn(async move { send(&http, "POST", &url).await })
    };
    entered.notified().await;
    // Same id, other route: not blocked by the order's lock.
    let (status, _, body) = send(&http, "POST", &format!("{base}/accounts/7")).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "account"));
    // Same route, same id: blocked, answered by the custom builder.
    let request = http::Request::post(format!("{base}/orders/7")).body(Empty::new()).unwrap();
    let response = http.request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::LOCKED);
    assert_eq!(response.headers()["x-lock"], "held");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"busy: 423 Locked");
    release.notify_one();
    assert_eq!(order.await.unwrap().0, StatusCode::OK);
}

/// With `continue_on_lost`, a request whose lock is lost runs to the end and can see it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn continue_on_lost_lets_the_handler_finish() {
    let server = RedisServer::start();
    let locks = locks(&server).await;
    let entered = Arc::new(tokio::sync::Notify::new());
    let signal = entered.clone();
    let app = Router::new()
        .route(
            "/c/{id}",
            post(move |Extension(context): Extension<LockContext>| async move {
                signal.notify_one();
                tokio::time::timeout(Duration::from_secs(5), context.lost())
                    .await
                    .expect("the handler sees the loss");
                format!("finished, lost = {}", context.is_lost())
            }),
        )
        .route_layer(
            LockLayer::new(locks.clone())
                .key(key::path_param("id"))
                .name("continue")
                .lease(Lease::watchdog(Duration::from_millis(600)))
                .continue_on_lost(),
        );
    let base = serve(app).await;
    let url = format!("{base}/c/1");
    let request = tokio::spawn(async move { send(&http(), "POST", &url).await });
    entered.notified().await;
    assert_eq!(server.cmd(&["DEL", "tower-lock:continue{1}"]).as_int(), 1);
    let (status, _, body) = request.await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, "finished, lost = true");
}

/// An inner service that fails with `Err` releases the lock before the error is returned, and
/// the error passes through untouched (plain tower, no axum).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inner_error_releases_and_passes_through() {
    use tower::{ServiceBuilder, ServiceExt};
    let server = RedisServer::start();
    let locks = locks(&server).await;
    // Another client: inside the request, the layer's own client would re-enter.
    let probe = self::locks(&server).await;
    let service = ServiceBuilder::new()
        .layer(LockLayer::new(locks).key(key::header("x-k")).name("err"))
        .service(tower::service_fn(move |_request: http::Request<()>| {
            let probe = probe.clone();
            async move {
                // While the inner service runs, the lock is held by this request: another
                // client acquiring it in the request's scope would wait for itself, and fails
                // at once.
                let busy = probe.lock_in_namespace("err", "1").try_acquire().await;
                assert!(
                    matches!(busy, Err(tower_lock::LockError::HeldThroughOtherClient)),
                    "the lock is not held while the service runs: {busy:?}"
                );
                Err::<http::Response<String>, _>("backend exploded")
            }
        }));
    let request = http::Request::get("/").header("x-k", "1").body(()).unwrap();
    let error = service.oneshot(request).await.expect_err("the inner error");
    assert_eq!(error, "backend exploded");
    let again = locks_free(&server, "err", "1").await;
    assert!(again, "the lock outlived the failed request");
}

/// Two layers over one lock built on different clients: the inner one would wait for the lock
/// its own request holds through the outer one, so the request is answered 500 (a
/// misconfiguration) at once rather than after the wait, and the lock is free afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_layers_on_different_clients_over_one_lock_are_refused_at_once() {
    use tower::{ServiceBuilder, ServiceExt};
    let backend = tower_lock::MemoryBackend::new();
    let outer = LockClient::builder(backend.clone()).build().unwrap();
    let inner = LockClient::builder(backend).build().unwrap();
    let layer = |locks: &LockClient<tower_lock::MemoryBackend>| {
        LockLayer::new(locks.clone())
            .key(key::header("x-k"))
            .name("twice")
            .wait(Duration::from_secs(60))
    };
    let service = ServiceBuilder::new().layer(layer(&outer)).layer(layer(&inner)).service(
        tower::service_fn(|_request: http::Request<()>| async {
            Ok::<_, Infallible>(http::Response::new(String::from("ran")))
        }),
    );
    let request = http::Request::get("/").header("x-k", "1").body(()).unwrap();
    let response = tokio::time::timeout(Duration::from_secs(30), service.oneshot(request))
        .await
        .expect("answered at once, not after the inner layer's wait")
        .expect("infallible");
    assert_eq!(response.status(), http::StatusCode::INTERNAL_SERVER_ERROR);
    let free = outer.lock_in_namespace("twice", "1").try_acquire().await;
    free.expect("free after the request").release().await.unwrap();
}

/// The layer asks nothing of the inner service, its future or the bodies beyond what it uses:
/// a `!Send` service with `!Send` response bodies and a request body that borrows works on one
/// thread, and its rejections too.
#[tokio::test(flavor = "current_thread")]
async fn inner_service_and_bodies_need_not_be_send_or_static() {
    use std::{cell::Cell, rc::Rc};
    use tower::{ServiceBuilder, ServiceExt};
    let calls = Rc::new(Cell::new(0));
    let service = ServiceBuilder::new()
        .layer(LockLayer::new(LockClient::in_memory()).key(key::header("x-k")).name("local"))
        .service(tower::service_fn({
            let calls = calls.clone();
            move |request: http::Request<&str>| {
                calls.set(calls.get() + 1);
                let body = Rc::new(request.body().to_uppercase());
                async move { Ok::<_, Infallible>(http::Response::new(body)) }
            }
        }));
    let text = String::from("borrowed body");
    let request = http::Request::get("/").header("x-k", "1").body(text.as_str()).unwrap();
    let response = service.clone().oneshot(request).await.unwrap();
    assert_eq!(response.body().as_str(), "BORROWED BODY");
    let no_key = http::Request::get("/").body(text.as_str()).unwrap();
    let rejected = service.oneshot(no_key).await.unwrap();
    assert_eq!(rejected.status(), StatusCode::BAD_REQUEST);
    assert_eq!(calls.get(), 1, "the rejected request did not run");
}

/// Whether the lock of `key` in `namespace` is free right now (a fresh client tries it).
async fn locks_free(server: &RedisServer, namespace: &str, key: &str) -> bool {
    let other = locks(server).await;
    match other.lock_in_namespace(namespace, key).try_acquire().await {
        Ok(guard) => guard.release().await.is_ok(),
        Err(_) => false,
    }
}

/// A handler that stalls its thread past a fixed lease (so nothing can report the loss while
/// it runs) still gets 503 when it finishes: its response was not made under the lock. The
/// lock is then free for others.
#[tokio::test(flavor = "current_thread")]
async fn handler_finishing_past_its_deadline_gets_503() {
    use tower::ServiceExt as _;
    let server = RedisServer::start();
    let locks = locks(&server).await;
    let lease = Duration::from_millis(200);
    let app = Router::new()
        .route(
            "/stall/{id}",
            post(move || async move {
                // Blocks the runtime's only thread: no timer or watchdog runs meanwhile.
                std::thread::sleep(lease * 2);
                "done"
            }),
        )
        .route_layer(
            LockLayer::new(locks.clone())
                .key(key::path_param("id"))
                .name("stall")
                .lease(Lease::fixed(lease)),
        );
    let request = http::Request::post("/stall/1").body(axum::body::Body::empty()).unwrap();
    let response = app.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let again = locks
        .lock_in_namespace("stall", "1")
        .wait(Duration::from_secs(1))
        .acquire()
        .await
        .expect("the lock is free");
    again.release().await.unwrap();
}

/// Wakes itself and yields once: the task is polled again without the runtime running its
/// timers first, so nothing but the clock can tell that the lease ran out meanwhile.
async fn yield_without_timers() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            return std::task::Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    })
    .await;
}

/// A handler resumed after a stall past its lease is not polled again: the layer checks the
/// lease's deadline before every poll, not only the watchdog's report. The response future is
/// polled by hand, so nothing else (no watchdog) runs between its polls.
#[tokio::test(flavor = "current_thread")]
async fn handler_resumed_past_its_lease_is_not_polled_again() {
    use std::task::{Context, Poll, Waker};
    use tower::{ServiceBuilder, ServiceExt};
    let lease = Duration::from_millis(100);
    let wrote = Arc::new(AtomicBool::new(false));
    let service = ServiceBuilder::new()
        .layer(
            LockLayer::new(LockClient::in_memory())
                .key(key::header("x-k"))
                .name("resume")
                .lease(Lease::fixed(lease)),
        )
        .service(tower::service_fn({
            let wrote = wrote.clone();
            move |_request: http::Request<()>| {
                let wrote = wrote.clone();
                async move {
                    yield_without_timers().await;
                    wrote.store(true, Ordering::SeqCst);
                    Ok::<_, Infallible>(http::Response::new(String::from("written")))
                }
            }
        }));
    let request = http::Request::get("/").header("x-k", "1").body(()).unwrap();
    let mut response = std::pin::pin!(service.oneshot(request));
    let mut cx = Context::from_waker(Waker::noop());
    // Acquires and runs the handler up to its yield.
    assert!(response.as_mut().poll(&mut cx).is_pending());
    // The process stalls past the lease.
    std::thread::sleep(lease * 2);
    let Poll::Ready(Ok(response)) = response.as_mut().poll(&mut cx) else {
        panic!("the layer answers at once");
    };
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(!wrote.load(Ordering::SeqCst), "the handler ran on past its lease");
}

/// `LockContext::is_lost` looks at the lease's deadline too: a handler that stalled past it
/// learns so before its next write, even before the watchdog reports the loss.
#[tokio::test(flavor = "current_thread")]
async fn lock_context_is_lost_past_the_deadline() {
    use tower::ServiceExt as _;
    let server = RedisServer::start();
    let locks = locks(&server).await;
    let lease = Duration::from_millis(150);
    let app = Router::new()
        .route(
            "/stall/{id}",
            post(move |Extension(lock): Extension<LockContext>| async move {
                let before = lock.is_lost();
                std::thread::sleep(lease * 2);
                format!("{before} {}", lock.is_lost())
            }),
        )
        .route_layer(
            LockLayer::new(locks.clone())
                .key(key::path_param("id"))
                .name("context")
                .lease(Lease::fixed(lease))
                .continue_on_lost(),
        );
    let request = http::Request::post("/stall/1").body(axum::body::Body::empty()).unwrap();
    let response = app.oneshot(request).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"false true");
}

/// Options the layer does not set come from the client: its lease (here 10 s, where the
/// engine's default is 30 s) and its wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unset_options_come_from_the_client() {
    let server = RedisServer::start();
    let backend = support::redis_backend(server.url()).connect().await.unwrap();
    let locks = LockClient::builder(backend)
        .lease(Lease::watchdog(Duration::from_secs(10)))
        .wait(Duration::ZERO)
        .build()
        .unwrap();
    let probe = server.url();
    let app = Router::new()
        .route(
            "/docs/{id}",
            post(move |Extension(lock): Extension<LockContext>| {
                let probe = probe.clone();
                async move {
                    let client = redis::Client::open(probe).unwrap();
                    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
                    let ttl: i64 = redis::cmd("PTTL")
                        .arg(lock.key().as_str())
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    ttl.to_string()
                }
            }),
        )
        .route_layer(LockLayer::new(locks.clone()).key(key::path_param("id")).name("docs"));
    let base = serve(app).await;
    let (status, _, body) = send(&http(), "POST", &format!("{base}/docs/1")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let ttl: i64 = body.parse().unwrap();
    assert!((9_000..=10_000).contains(&ttl), "lease {ttl} ms, not the client's 10 s");
    // The client's zero wait: a held lock is answered at once.
    let held = locks.lock_in_namespace("docs", "1").acquire().await.unwrap();
    let started = Instant::now();
    let (status, _, _) = send(&http(), "POST", &format!("{base}/docs/1")).await;
    assert_eq!(status, StatusCode::LOCKED);
    assert!(started.elapsed() < Duration::from_secs(1), "waited {:?}", started.elapsed());
    held.release().await.unwrap();
}

/// A handler that holds its account for 1.5 s.
async fn slow_transfer(Path(id): Path<String>, Extension(entered): Extension<Entered>) -> String {
    entered.signal();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    id
}

/// A request that waited in vain behind a 1.5 s handler holding a 30 s watchdog lease hears
/// `Retry-After: 2` (how long this route's requests hold the lock, rounded up), not the 30 s of
/// the holder's lease, and a one-line text body saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_tells_the_likely_wait() {
    let locks = LockClient::in_memory();
    let (entered, mut entries) = Entered::channel();
    let router = Router::new().route("/accounts/{id}/transfer", post(slow_transfer)).route_layer(
        LockLayer::new(locks.clone())
            .key(key::path_param("id"))
            .wait(Duration::from_millis(100))
            .lease(Lease::watchdog(Duration::from_secs(30))),
    );
    let base = serve(router.layer(Extension(entered))).await;
    let url = format!("{base}/accounts/alice/transfer");
    assert_told_the_likely_wait(&url, &mut entries).await;
}

/// `key::all` over two path parameters, prefixed: opposite transfers (`/transfers/1/2` and
/// `/transfers/2/1`) through two instances on one Redis never deadlock and never overlap on an
/// account; the handler sees both locks in its `LockContext`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn several_keys_from_path_params() {
    let server = RedisServer::start();
    let witness = Witness::default();
    let mut bases = Vec::new();
    for _ in 0..2 {
        let witness = witness.clone();
        let app = Router::new()
            .route(
                "/transfers/{from}/{to}",
                post(
                    move |Path((from, to)): Path<(String, String)>, lock: LockContext| async move {
                        let (a, b) = (
                            witness.section(&from, Duration::from_millis(2)),
                            witness.section(&to, Duration::from_millis(2)),
                        );
                        tokio::join!(a, b);
                        assert!(lock.fencing_token_of(format!("account:{from}")).is_some());
                        lock.keys().count().to_string()
                    },
                ),
            )
            .route_layer(
                LockLayer::new(locks(&server).await)
                    .key(
                        key::all([key::path_param("from"), key::path_param("to")])
                            .prefixed("account:"),
                    )
                    .wait(Duration::from_secs(10))
                    .fencing(),
            );
        bases.push(serve(app).await);
    }
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..16usize {
        let base = bases[i % 2].clone();
        tasks.spawn(async move {
            for j in 0..8usize {
                let (from, to) = if (i + j) % 2 == 0 { (1, 2) } else { (2, 1) };
                let (status, _, body) =
                    send(&http(), "POST", &format!("{base}/transfers/{from}/{to}")).await;
                assert_eq!((status, body.as_str()), (StatusCode::OK, "2"));
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.unwrap();
    }
    assert_eq!(witness.overlaps.load(Ordering::SeqCst), 0);
    assert_eq!(witness.total.load(Ordering::SeqCst), 2 * 16 * 8);
}

/// A set behind `key::from_fn_many`: a held member answers 423 with `Retry-After`, and leaves
/// the other member free; a request missing a key is a 400; the locks are the same ones a
/// `LockClient` takes by name.
#[tokio::test]
async fn several_keys_rejections() {
    let server = RedisServer::start();
    let locks = locks(&server).await;
    let merge = key::from_fn_many(|parts: &http::request::Parts| {
        let into = parts.headers.get("x-into")?.to_str().ok()?.to_owned();
        let from = parts.headers.get("x-from")?.to_str().ok()?.to_owned();
        Some(vec![into, from])
    });
    let app = Router::new().route("/merge", post(|| async { "merged" })).route_layer(
        LockLayer::new(locks.clone()).key(merge.prefixed("doc:")).wait(Duration::from_millis(100)),
    );
    let base = serve(app).await;
    let send_merge = |into: Option<&'static str>, from: &'static str| {
        let base = base.clone();
        async move {
            let mut request = http::Request::post(format!("{base}/merge")).header("x-from", from);
            if let Some(into) = into {
                request = request.header("x-into", into);
            }
            let response = http().request(request.body(Empty::new()).unwrap()).await.unwrap();
            let retry = response.headers().get("retry-after").cloned();
            (response.status(), retry)
        }
    };
    assert_eq!(send_merge(Some("7"), "3").await.0, StatusCode::OK);
    assert_eq!(send_merge(None, "3").await.0, StatusCode::BAD_REQUEST);

    let held =
        locks.lock("doc:3").lease(Lease::fixed(Duration::from_secs(5))).acquire().await.unwrap();
    let (status, retry) = send_merge(Some("7"), "3").await;
    assert_eq!(status, StatusCode::LOCKED);
    assert!(retry.is_some(), "Retry-After on a set's wait timeout");
    let other = locks.lock("doc:7").try_acquire().await;
    other.expect("doc:7 is not left held").release().await.unwrap();
    held.release().await.unwrap();
    assert_eq!(send_merge(Some("3"), "7").await.0, StatusCode::OK);
}

/// With `.permits(3)`, up to three requests per key run at once across two instances, never
/// more; with every permit taken, the next request is answered 423 with `Retry-After`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn permits_let_n_requests_per_key_run() {
    #[derive(Clone, Default)]
    struct Inside {
        now: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
        most: Arc<AtomicUsize>,
    }
    let server = RedisServer::start();
    let inside = Inside::default();
    let (entered, mut entries) = Entered::channel();
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let app = |locks: LockClient<RedisBackend>| {
        let (inside, entered, release) = (inside.clone(), entered.clone(), release.clone());
        Router::new()
            .route(
                "/exports/{tenant}",
                post(move |Path(tenant): Path<String>| async move {
                    let n = {
                        let mut now = inside.now.lock().unwrap();
                        let n = now.entry(tenant.clone()).or_default();
                        *n += 1;
                        *n
                    };
                    inside.most.fetch_max(n, Ordering::SeqCst);
                    entered.signal();
                    // An `acme` request holds its permit until the test lets one handler go.
                    if tenant == "acme" {
                        release.acquire().await.unwrap().forget();
                    }
                    *inside.now.lock().unwrap().get_mut(&tenant).unwrap() -= 1;
                    "ok"
                }),
            )
            .route_layer(
                LockLayer::new(locks)
                    .key(key::path_param("tenant"))
                    .permits(3)
                    .wait(Duration::from_secs(10)),
            )
    };
    let one = serve(app(locks(&server).await)).await;
    let two = serve(app(locks(&server).await)).await;
    let http = http();
    let mut tasks = Vec::new();
    for i in 0..12 {
        let url = format!("{}/exports/acme", if i % 2 == 0 { &one } else { &two });
        let http = http.clone();
        tasks.push(tokio::spawn(async move { send(&http, "POST", &url).await.0 }));
    }
    // Three get in; the rest wait for a permit.
    for _ in 0..3 {
        entries.recv().await.expect("a request entered");
    }
    // Another tenant has permits of its own.
    let other = tokio::spawn({
        let (http, url) = (http.clone(), format!("{one}/exports/globex"));
        async move { send(&http, "POST", &url).await.0 }
    });
    entries.recv().await.expect("the other tenant's request entered");
    // With every permit of `acme` out, a request that waits briefly is told to come back.
    let impatient = Router::new().route("/exports/{tenant}", post(|| async { "ok" })).route_layer(
        LockLayer::new(locks(&server).await)
            .key(key::path_param("tenant"))
            .permits(3)
            .wait(Duration::from_millis(100)),
    );
    let impatient = serve(impatient).await;
    let (status, retry, _) = send(&http, "POST", &format!("{impatient}/exports/acme")).await;
    assert_eq!(status, StatusCode::LOCKED);
    assert!(retry.is_some(), "423 without Retry-After");
    // Let them all through, one at a time.
    for _ in 0..(12 - 3) {
        release.add_permits(1);
        entries.recv().await.expect("a waiting request entered");
    }
    release.add_permits(3);
    for task in tasks {
        assert_eq!(task.await.unwrap(), StatusCode::OK);
    }
    assert_eq!(other.await.unwrap(), StatusCode::OK);
    assert_eq!(inside.most.load(Ordering::SeqCst), 3, "per-key concurrency");
}

/// A set's hold time counts from when the whole set was taken, not from when its first lock
/// was: a request that waited 1.2 s for its second account (held through another client of
/// the same store, whose hold times are its own) and then held both for a moment makes a later
/// request that tries once in vain hear `Retry-After: 1`, not 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_hold_time_leaves_out_the_wait_for_its_members() {
    let store = tower_lock::MemoryBackend::new();
    let locks = LockClient::builder(store.clone()).build().unwrap();
    let elsewhere = LockClient::builder(store).build().unwrap();
    let layer = LockLayer::new(locks.clone())
        .key(key::all([key::path_param("from"), key::path_param("to")]))
        .name("transfers")
        .wait(Duration::from_secs(2));
    let app = Router::new()
        .route("/transfers/{from}/{to}", post(|| async { "moved" }))
        .route_layer(layer.clone())
        .merge(
            Router::new()
                .route("/at-once/transfers/{from}/{to}", post(|| async { "moved" }))
                .route_layer(layer.wait(Duration::ZERO)),
        );
    let base = serve(app).await;

    // One account taken elsewhere for 1.2 s: the request waits for it, then moves at once.
    let held = elsewhere
        .lock_in_namespace("transfers", "2")
        .lease(Lease::fixed(Duration::from_secs(30)))
        .acquire()
        .await
        .unwrap();
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1200)).await;
        held.release().await.unwrap();
    });
    let started = Instant::now();
    let (status, _, _) = send(&http(), "POST", &format!("{base}/transfers/1/2")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(started.elapsed() >= Duration::from_millis(1100), "it waited");
    release.await.unwrap();

    // Now one account is held for good: a request that tries once hears the typical hold.
    let _held = locks.lock_in_namespace("transfers", "1").acquire().await.unwrap();
    let (status, retry, _) = send(&http(), "POST", &format!("{base}/at-once/transfers/1/2")).await;
    assert_eq!(status, StatusCode::LOCKED);
    assert_eq!(
        retry.as_deref(),
        Some("1"),
        "the typical hold is the moment the set was held, not the wait for its second lock"
    );
}

/// The remaining lease of the lock at `name`, in milliseconds, as Redis counts it now.
fn pttl(server: &RedisServer, name: &str) -> i64 {
    server.cmd(&["PTTL", name]).as_int()
}

/// A 423's `Retry-After` is never less than what the request waited (the holder has held at
/// least that long) and never more than the holder's remaining lease when it was answered:
/// before the route has a history (the remaining lease, measured when the wait ended, not when
/// it began), and after requests that held the lock for milliseconds (their average, which
/// says nothing of this holder, is raised to the wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retry_after_is_at_least_the_wait_and_at_most_the_lease() {
    const WAIT: Duration = Duration::from_secs(2);
    let server = RedisServer::start();
    let locks = locks(&server).await;
    let app = Router::new().route("/docs/{id}", post(|| async { "ok" })).route_layer(
        LockLayer::new(locks.clone()).key(key::path_param("id")).name("docs").wait(WAIT),
    );
    let base = serve(app).await;
    // A fixed lease: Redis's PTTL is the truth the answer is checked against.
    let holder = locks
        .lock_in_namespace("docs", "7")
        .lease(Lease::fixed(Duration::from_secs(12)))
        .acquire()
        .await
        .unwrap();
    let name = holder.key().as_str().to_owned();
    for history in ["none", "a quick request"] {
        if history != "none" {
            let (status, _, _) = send(&http(), "POST", &format!("{base}/docs/8")).await;
            assert_eq!(status, StatusCode::OK);
        }
        let (status, retry, body) = send(&http(), "POST", &format!("{base}/docs/7")).await;
        let answered = Instant::now();
        let left_ms = pttl(&server, &name);
        let since_answer = answered.elapsed();
        assert_eq!(status, StatusCode::LOCKED, "{history}: {body}");
        let retry: u64 = retry.expect("Retry-After").parse().unwrap();
        // The lease left when the answer was made is at most what Redis says now plus the
        // time since the answer arrived.
        let lease_left_ms = u64::try_from(left_ms).unwrap() + since_answer.as_millis() as u64;
        println!(
            "history {history}: Retry-After {retry} s, waited {WAIT:?}, holder's lease {lease_left_ms} ms"
        );
        assert!(
            retry >= WAIT.as_secs(),
            "{history}: Retry-After {retry} s, less than the {WAIT:?} waited"
        );
        assert!(
            retry <= lease_left_ms.div_ceil(1000),
            "{history}: Retry-After {retry} s, more than the holder's {lease_left_ms} ms left"
        );
        assert_eq!(body, format!("locked; retry in about {retry} s\n"));
    }
    holder.release().await.unwrap();
}

/// A store in its restart quarantine answers 503 at once when the quarantine outlasts the
/// wait, with the quarantine's time left, as measured when the response was made, as
/// `Retry-After`, and a body that says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quarantine_answers_503_at_once_with_its_time_left() {
    const QUARANTINE: Duration = Duration::from_secs(30);
    let before_start = Instant::now();
    let server = RedisServer::start();
    let started = Instant::now();
    let backend =
        RedisBackend::builder(server.url()).quarantine(QUARANTINE).connect().await.unwrap();
    let locks = LockClient::builder(backend).build().unwrap();
    let app = Router::new()
        .route("/docs/{id}", post(|| async { "ok" }))
        .route_layer(LockLayer::new(locks).key(key::path_param("id")).wait(Duration::from_secs(5)));
    let base = serve(app).await;
    let sent = Instant::now();
    let (status, retry, body) = send(&http(), "POST", &format!("{base}/docs/7")).await;
    let answered = Instant::now();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(
        answered - sent < Duration::from_secs(5),
        "answered only after the wait: {:?}",
        answered - sent
    );
    let retry: u64 = retry.expect("Retry-After").parse().unwrap();
    // The server booted between `before_start` and `started`; the backend reads its uptime in
    // whole seconds and errs long by up to two.
    let earliest = (QUARANTINE.saturating_sub(answered - before_start)).as_secs();
    let latest = (QUARANTINE + Duration::from_secs(2)).saturating_sub(sent - started).as_secs() + 1;
    println!("quarantine: Retry-After {retry} s, expected {earliest}..={latest}");
    assert!(
        (earliest..=latest).contains(&retry),
        "Retry-After {retry} s, the quarantine had {earliest}..={latest} s left"
    );
    assert_eq!(
        body,
        format!("lock store restarted recently and grants no lock yet; retry in about {retry} s\n")
    );
}

/// With the store refusing connections (killed), a request is answered 503 with `Retry-After`
/// long before its 20 s wait would end; once the store is back, the probe lets requests
/// through again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_that_is_down_fails_fast_until_the_probe_finds_it_back() {
    const WAIT: Duration = Duration::from_secs(20);
    let mut server = RedisServer::start();
    let locks = locks(&server).await;
    let app = Router::new()
        .route("/docs/{id}", post(|| async { "ok" }))
        .route_layer(LockLayer::new(locks).key(key::path_param("id")).wait(WAIT));
    let url = format!("{}/docs/7", serve(app).await);
    assert_eq!(send(&http(), "POST", &url).await.0, StatusCode::OK);

    tokio::task::block_in_place(|| server.kill());
    for attempt in 1..=3 {
        let sent = Instant::now();
        let (status, retry, body) = send(&http(), "POST", &url).await;
        let took = sent.elapsed();
        println!("down, request {attempt}: {status} in {took:?}, Retry-After {retry:?}");
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert!(took < WAIT / 4, "request {attempt} answered after {took:?} of its {WAIT:?} wait");
        assert_eq!(retry.as_deref(), Some("1"), "the next probe is within a second");
    }

    tokio::task::block_in_place(|| server.restart());
    let back = Instant::now();
    loop {
        let (status, _, _) = send(&http(), "POST", &url).await;
        if status == StatusCode::OK {
            break;
        }
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        // The probe looks at least once a second.
        assert!(
            back.elapsed() < Duration::from_secs(5),
            "still refused {:?} after the store came back",
            back.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("store back: requests run again after {:?}", back.elapsed());
}

/// A set's 423 counts the whole wait of the set, not only the wait for the lock that stayed
/// held: the first account was freed after a second of a 1.5 s wait, the second never, so the
/// request waited 1.5 s and hears `Retry-After: 2`, though this route's requests hold their
/// locks for milliseconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_retry_after_counts_the_whole_wait() {
    let locks = LockClient::in_memory();
    let app =
        Router::new().route("/transfers/{from}/{to}", post(|| async { "moved" })).route_layer(
            LockLayer::new(locks.clone())
                .key(key::all([key::path_param("from"), key::path_param("to")]))
                .name("transfers")
                .wait(Duration::from_millis(1500)),
        );
    let base = serve(app).await;
    let (status, _, _) = send(&http(), "POST", &format!("{base}/transfers/3/4")).await;
    assert_eq!(status, StatusCode::OK, "a quick request: the route's history");

    let first = locks.lock_in_namespace("transfers", "1").acquire().await.unwrap();
    let _second = locks.lock_in_namespace("transfers", "2").acquire().await.unwrap();
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        first.release().await.unwrap();
    });
    let (status, retry, _) = send(&http(), "POST", &format!("{base}/transfers/1/2")).await;
    assert_eq!(status, StatusCode::LOCKED);
    assert_eq!(retry.as_deref(), Some("2"), "the set waited 1.5 s in all");
    release.await.unwrap();
}

/// A hyper client under `RetryAfterPolicy` waits out a 423: its first attempt is answered 423
/// with `Retry-After`, the lock is freed once the test sees that answer, and the retry, sent
/// after the `Retry-After`, succeeds; the caller sees only the success.
#[cfg(feature = "retry")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_policy_waits_out_retry_after_over_hyper() {
    use tower::{ServiceBuilder, ServiceExt as _, retry::RetryLayer};
    use tower_lock::retry::RetryAfterPolicy;

    let locks = LockClient::in_memory();
    let app = Router::new().route("/docs/{id}", post(|| async { "saved" })).route_layer(
        LockLayer::new(locks.clone())
            .key(key::path_param("id").prefixed("doc:"))
            .wait(Duration::from_millis(50)),
    );
    let base = serve(app).await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<String>();
    let (seen, mut answers) = tokio::sync::mpsc::unbounded_channel();
    let service = ServiceBuilder::new()
        .layer(RetryLayer::new(RetryAfterPolicy::new()))
        .map_response(move |response: http::Response<hyper::body::Incoming>| {
            let _ = seen.send(response.status());
            response
        })
        .service(client);

    let held = locks.lock("doc:7").acquire().await.unwrap();
    let started = Instant::now();
    let request = http::Request::post(format!("{base}/docs/7")).body(String::new()).unwrap();
    let call = tokio::spawn(service.oneshot(request));
    assert_eq!(answers.recv().await, Some(StatusCode::LOCKED));
    held.release().await.unwrap();
    let response = call.await.unwrap().expect("the retry is answered");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(answers.recv().await, Some(StatusCode::OK));
    assert!(started.elapsed() >= Duration::from_secs(1), "sent again after the 1 s Retry-After");
}

/// A busy lock is a normal outcome: no line at INFO or above for any number of 423s (they are
/// at debug, and counted). A rejection of a gRPC call is logged with the gRPC code it was
/// answered with, and answered as a gRPC status by a layer with no rejection hook.
#[tokio::test(flavor = "current_thread")]
async fn busy_rejections_are_quiet_and_grpc_ones_name_their_code() {
    let (logs, _capturing) = Logs::capture();
    let locks = LockClient::in_memory();
    let app = Router::new().route("/docs/{id}", post(|| async { "ok" })).route_layer(
        LockLayer::new(locks.clone())
            .key(key::path_param("id").prefixed("doc:"))
            .wait(Duration::ZERO),
    );
    let base = serve(app).await;
    let held = locks.lock("doc:7").acquire().await.unwrap();
    for _ in 0..20 {
        let (status, retry, _) = send(&http(), "POST", &format!("{base}/docs/7")).await;
        assert_eq!(status, StatusCode::LOCKED);
        assert!(retry.is_some());
    }
    held.release().await.unwrap();
    assert!(
        !logs.text().contains("request rejected"),
        "a busy lock logged at INFO or above: {}",
        logs.text()
    );

    // A gRPC call whose key is refused (the empty path parameter cannot be; an oversized one
    // can): INVALID_ARGUMENT in the answer and in the warning.
    let long = "9".repeat(600);
    let request = http::Request::post(format!("{base}/docs/{long}"))
        .header("content-type", "application/grpc")
        .body(Empty::new())
        .unwrap();
    let response = http().request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["grpc-status"], "3");
    let text = logs.text();
    assert!(
        text.contains("request rejected") && text.contains("status=INVALID_ARGUMENT"),
        "{text}"
    );
}
