//! `#[locked]` handlers end to end: axum routers served over loopback HTTP, locks in memory and
//! in a real `redis-server` started by the test.

use crate::support;

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use axum::{
    Extension, Json, Router,
    extract::{FromRef, Path, State},
    routing::{get, post},
};
use http::StatusCode;
use support::{
    RedisServer,
    http::{Entered, assert_told_the_likely_wait, http, post_json, send, serve},
    logs::Logs,
};
use tokio::sync::{Notify, Semaphore, watch};
use tower_lock::{
    AnyLockClient, LockClient, LockContext, LockLayer, MemoryBackend, RedisBackend, key, locked,
};

/// Whether the lock the attribute takes for `key` on `route` is free right now.
async fn is_free<B: tower_lock::Backend>(locks: &LockClient<B>, route: &str, key: &str) -> bool {
    match locks.lock_in_namespace(route, key).try_acquire().await {
        Ok(guard) => guard.release().await.is_ok(),
        Err(_) => false,
    }
}

/// Polls until the lock is free (a background release), failing after two seconds.
async fn until_free<B: tower_lock::Backend>(locks: &LockClient<B>, route: &str, key: &str) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while !is_free(locks, route, key).await {
        assert!(Instant::now() < deadline, "`{key}` is still held");
        tokio::task::yield_now().await;
    }
}

/// Who is inside a handler right now, per key.
#[derive(Clone, Default)]
struct Witness {
    inside: Arc<Mutex<std::collections::HashMap<u64, usize>>>,
    overlaps: Arc<AtomicUsize>,
    max_concurrent: Arc<AtomicUsize>,
    /// The most requests inside on one key at once.
    max_per_key: Arc<AtomicUsize>,
    total: Arc<AtomicUsize>,
}

impl Witness {
    async fn section(&self, key: u64) {
        {
            let mut inside = self.inside.lock().unwrap();
            let n = inside.entry(key).or_default();
            *n += 1;
            self.max_per_key.fetch_max(*n, Ordering::SeqCst);
            if *n > 1 {
                self.overlaps.fetch_add(1, Ordering::SeqCst);
            }
            let all: usize = inside.values().sum();
            self.max_concurrent.fetch_max(all, Ordering::SeqCst);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
        *self.inside.lock().unwrap().get_mut(&key).unwrap() -= 1;
        self.total.fetch_add(1, Ordering::SeqCst);
    }

    fn assert_serialized(&self, requests: usize) {
        assert_eq!(self.total.load(Ordering::SeqCst), requests);
        assert_eq!(
            self.overlaps.load(Ordering::SeqCst),
            0,
            "two requests on one account overlapped"
        );
        assert!(
            self.max_concurrent.load(Ordering::SeqCst) > 1,
            "different accounts never ran concurrently"
        );
    }
}

/// State holding the client by its concrete type; the attribute finds it through `FromRef`.
#[derive(Clone, FromRef)]
struct MemoryApp {
    locks: LockClient<MemoryBackend>,
    witness: Witness,
}

#[derive(Clone, FromRef)]
struct RedisApp {
    locks: LockClient<RedisBackend>,
    witness: Witness,
}

#[locked(key = "account:{id}", wait = "10s")]
async fn withdraw_memory(State(app): State<MemoryApp>, Path(id): Path<u64>) -> &'static str {
    app.witness.section(id).await;
    "ok"
}

#[locked(key = "account:{id}", wait = "10s")]
async fn withdraw_redis(State(app): State<RedisApp>, Path(id): Path<u64>) -> &'static str {
    app.witness.section(id).await;
    "ok"
}

#[locked(key = "account:{id}", permits = 2, wait = "10s")]
async fn export_redis(State(app): State<RedisApp>, Path(id): Path<u64>) -> &'static str {
    app.witness.section(id).await;
    "ok"
}

/// Fires `requests` POSTs over 4 accounts, alternating between `bases`.
async fn hammer(bases: &[String], requests: usize) {
    let http = http();
    let mut tasks = Vec::new();
    for i in 0..requests {
        let url = format!("{}/accounts/{}/withdraw", bases[i % bases.len()], i % 4);
        let http = http.clone();
        tasks.push(tokio::spawn(async move { send(&http, "POST", &url).await }));
    }
    for task in tasks {
        let (status, _, body) = task.await.unwrap();
        assert_eq!((status, body.as_str()), (StatusCode::OK, "ok"));
    }
}

/// Requests on one account serialize, requests on different accounts run together; the client
/// comes from the state (`LockClient<MemoryBackend>: FromRef<MemoryApp>`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serializes_per_key_with_the_client_in_state() {
    let witness = Witness::default();
    let app = MemoryApp { locks: LockClient::in_memory(), witness: witness.clone() };
    let router =
        Router::new().route("/accounts/{id}/withdraw", post(withdraw_memory)).with_state(app);
    assert_serializes(router, &witness).await;
}

/// Serves `router` and hammers it with 120 requests over 4 accounts: one account's requests
/// never overlap in `witness`.
async fn assert_serializes(router: Router, witness: &Witness) {
    let base = serve(router).await;
    hammer(std::slice::from_ref(&base), 120).await;
    witness.assert_serialized(120);
}

#[locked(key = "account:{id}", wait = "10s")]
async fn withdraw_shared(State(app): State<Arc<MemoryApp>>, Path(id): Path<u64>) -> &'static str {
    app.witness.section(id).await;
    "ok"
}

/// The same with the state shared as `State<Arc<MemoryApp>>`: the attribute looks through the
/// `Arc` for the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serializes_per_key_with_the_client_in_shared_state() {
    let witness = Witness::default();
    let app = Arc::new(MemoryApp { locks: LockClient::in_memory(), witness: witness.clone() });
    let router =
        Router::new().route("/accounts/{id}/withdraw", post(withdraw_shared)).with_state(app);
    assert_serializes(router, &witness).await;
}

/// Two app instances on one Redis, each with its own client in its state, serving `handler`
/// at `/accounts/{id}/withdraw`, hammered with 120 requests over 4 accounts.
async fn hammer_two_instances<H, T>(handler: H) -> Witness
where
    H: axum::handler::Handler<T, RedisApp> + Clone,
    T: 'static,
{
    let server = RedisServer::start();
    let witness = Witness::default();
    let mut bases = Vec::new();
    for _ in 0..2 {
        let backend = support::redis_backend(server.url()).connect().await.unwrap();
        let app = RedisApp {
            locks: LockClient::builder(backend).build().unwrap(),
            witness: witness.clone(),
        };
        let router =
            Router::new().route("/accounts/{id}/withdraw", post(handler.clone())).with_state(app);
        bases.push(serve(router).await);
    }
    hammer(&bases, 120).await;
    witness
}

/// Two app instances on one Redis serialize per account (`LockClient<RedisBackend>` in state).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serializes_across_instances_on_redis() {
    hammer_two_instances(withdraw_redis).await.assert_serialized(120);
}

/// `permits = 2`: two requests per account at once across two instances, never three.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn permits_let_two_per_key_across_instances() {
    let witness = hammer_two_instances(export_redis).await;
    assert_eq!(witness.total.load(Ordering::SeqCst), 120);
    assert_eq!(witness.max_per_key.load(Ordering::SeqCst), 2);
}

#[locked(key = "slow:{id}", wait = "50ms")]
async fn slow(Path(id): Path<u64>) -> String {
    format!("slow {id}")
}

/// A lock held elsewhere for the whole wait answers 423 with `Retry-After`; the attribute names
/// the lock its key names (`lock_in_namespace("", key)`, as `lock(key)`). The client comes
/// from an `Extension<AnyLockClient>`.
#[tokio::test]
async fn wait_timeout_is_423() {
    let locks = LockClient::in_memory();
    let router = Router::new()
        .route("/slow/{id}", post(slow))
        .layer(Extension(AnyLockClient::from(locks.clone())));
    let base = serve(router).await;
    let url = format!("{base}/slow/1");
    let held = locks.lock("slow:1").acquire().await.unwrap();
    let started = Instant::now();
    let (status, retry, _) = send(&http(), "POST", &url).await;
    assert_eq!(status, StatusCode::LOCKED);
    assert!(retry.is_some(), "423 without Retry-After");
    assert!(started.elapsed() >= Duration::from_millis(50), "gave up before the wait");
    // Another key of the same route is not affected.
    let (status, _, body) = send(&http(), "POST", &format!("{base}/slow/2")).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "slow 2"));
    held.release().await.unwrap();
    let (status, _, body) = send(&http(), "POST", &url).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "slow 1"));
}

/// Under a `LockLayer`, a handler with no client of its own (no state, no extension) takes
/// its lock from the layer's client: the lock held through that client makes it answer 423,
/// and once released the handler runs. (The layer's own lock is another one.)
#[tokio::test]
async fn a_handler_under_a_layer_locks_with_the_layers_client() {
    let locks = LockClient::in_memory();
    let router = Router::new()
        .route("/slow/{id}", post(slow))
        .route_layer(LockLayer::new(locks.clone()).key(key::path_param("id")).name("requests"));
    let base = serve(router).await;
    let url = format!("{base}/slow/3");
    let held = locks.lock("slow:3").acquire().await.unwrap();
    let (status, _, _) = send(&http(), "POST", &url).await;
    assert_eq!(status, StatusCode::LOCKED);
    held.release().await.unwrap();
    let (status, _, body) = send(&http(), "POST", &url).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "slow 3"));
}

#[locked(key = "{id}", wait = "0ms")]
async fn reenter_stateless(Path(id): Path<String>) -> String {
    id
}

/// A client in the extensions does not take the place of the layer's: the handler re-enters
/// the layer's lock with the layer's client and holder, even when the extension's client
/// shares the layer's backend (where it would be another owner).
#[tokio::test]
async fn under_a_layer_its_client_comes_before_an_extensions() {
    let backend = MemoryBackend::new();
    let layers = LockClient::builder(backend.clone()).build().unwrap();
    let other = LockClient::builder(backend).build().unwrap();
    let router = Router::new()
        .route("/docs/{id}", post(reenter_stateless))
        .route_layer(LockLayer::new(layers.clone()).key(key::path_param("id")))
        .layer(Extension(AnyLockClient::from(other)));
    let base = serve(router).await;
    let (status, _, body) = send(&http(), "POST", &format!("{base}/docs/4")).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "4"));
    assert!(is_free(&layers, "/docs/{id}", "4").await, "a hold leaked");
}

/// State providing the type-erased client.
#[derive(Clone, FromRef)]
struct AnyApp {
    locks: AnyLockClient,
}

#[locked(key = "slow:{id}", wait = "50ms")]
async fn slow_with_state(State(_): State<AnyApp>, Path(id): Path<u64>) -> String {
    format!("slow {id}")
}

/// The client can also come from the state as an `AnyLockClient` (`FromRef`), here over Redis.
#[tokio::test]
async fn client_from_any_lock_client_in_state() {
    let server = RedisServer::start();
    let locks = redis_locks(&server).await;
    let router = Router::new()
        .route("/slow/{id}", post(slow_with_state))
        .with_state(AnyApp { locks: locks.clone().into() });
    let base = serve(router).await;
    let url = format!("{base}/slow/9");
    let held = locks.lock("slow:9").acquire().await.unwrap();
    let (status, retry, _) = send(&http(), "POST", &url).await;
    assert_eq!(status, StatusCode::LOCKED);
    assert!(retry.is_some(), "423 without Retry-After");
    held.release().await.unwrap();
    let (status, _, body) = send(&http(), "POST", &url).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "slow 9"));
}

/// Re-enters the layer's lock, and a direct acquire in the body re-enters too (holder scope).
#[locked(key = "{id}", wait = "0ms")]
async fn under_layer(
    State(locks): State<LockClient<MemoryBackend>>,
    Path(id): Path<String>,
    lock: LockContext,
) -> Result<String, StatusCode> {
    let nested = locks
        .lock_in_namespace("/docs/{id}", &id)
        .try_acquire()
        .await
        .map_err(|_| StatusCode::CONFLICT)?;
    let same_holder = nested.holder() == lock.holder();
    nested.release().await.map_err(|_| StatusCode::GONE)?;
    Ok(format!("{id} {same_holder}"))
}

/// A handler under a `LockLayer` taking the same lock re-enters it instead of deadlocking (or,
/// with `wait = "0ms"`, instead of answering 423), and leaves it free afterwards.
#[tokio::test]
async fn reenters_under_a_layer_on_the_same_key() {
    let locks = LockClient::in_memory();
    let router = Router::new()
        .route("/docs/{id}", post(under_layer))
        .route_layer(LockLayer::new(locks.clone()).key(key::path_param("id")))
        .with_state(locks.clone());
    let base = serve(router).await;
    for _ in 0..20 {
        let (status, _, body) = send(&http(), "POST", &format!("{base}/docs/7")).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "7 true"));
    }
    assert!(is_free(&locks, "/docs/{id}", "7").await, "re-entered holds leaked");
}

#[locked(key = "doc:{doc_id}:{user.tenant}", fair, lease = "10s", fencing)]
async fn edit(
    Path((doc_id, _rev)): Path<(u64, String)>,
    user: Tenant,
    lock: LockContext,
) -> String {
    let _ = user;
    lock.fencing_token().map_or_else(|| "none".to_owned(), |t| t.to_string())
}

/// A field of a binding used in the key: the tenant comes from a header.
#[derive(Debug)]
struct Tenant {
    tenant: String,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Tenant {
    type Rejection = StatusCode;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        let tenant = parts.headers.get("x-tenant").map_or("acme", |v| v.to_str().unwrap_or("?"));
        Ok(Self { tenant: tenant.to_owned() })
    }
}

/// With `fencing`, the handler sees a token that rises from one request to the next.
#[tokio::test]
async fn fencing_token_is_visible_to_the_handler() {
    let locks = LockClient::in_memory();
    let router = Router::new()
        .route("/docs/{doc_id}/{rev}", post(edit))
        .layer(Extension(AnyLockClient::from(locks.clone())));
    let base = serve(router).await;
    let mut last = 0;
    for _ in 0..5 {
        let (status, _, body) = send(&http(), "POST", &format!("{base}/docs/3/r1")).await;
        assert_eq!(status, StatusCode::OK);
        let token: u64 = body.parse().expect("a fencing token");
        assert!(token > last, "token {token} after {last}");
        last = token;
    }
    assert!(is_free(&locks, "", "doc:3:acme").await);
}

/// State of the read-write test: readers report how many are inside and wait for the gate.
#[derive(Clone)]
struct Reports {
    locks: LockClient<MemoryBackend>,
    readers: Arc<watch::Sender<usize>>,
    gate: Arc<Semaphore>,
}

impl FromRef<Reports> for LockClient<MemoryBackend> {
    fn from_ref(app: &Reports) -> Self {
        app.locks.clone()
    }
}

#[locked(key = "report:{id}", read, name = "reports")]
async fn read_report(State(app): State<Reports>, Path(id): Path<u64>) -> String {
    app.readers.send_modify(|n| *n += 1);
    let _permit = app.gate.acquire().await.unwrap();
    app.readers.send_modify(|n| *n -= 1);
    format!("report {id}")
}

#[locked(key = "report:{id}", write, name = "reports", wait = "100ms")]
async fn write_report(State(_): State<Reports>, Path(id): Path<u64>) -> String {
    format!("written {id}")
}

/// Readers share the lock, a writer waits for them (423 after its wait), and gets it once they
/// are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn read_and_write_split() {
    let (readers, mut inside) = watch::channel(0);
    let app = Reports {
        locks: LockClient::in_memory(),
        readers: Arc::new(readers),
        gate: Arc::new(Semaphore::new(0)),
    };
    let router = Router::new()
        .route("/reports/{id}", get(read_report).post(write_report))
        .with_state(app.clone());
    let base = serve(router).await;
    let url = format!("{base}/reports/5");
    let reads: Vec<_> = (0..2)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { send(&http(), "GET", &url).await })
        })
        .collect();
    tokio::time::timeout(Duration::from_secs(5), inside.wait_for(|n| *n == 2))
        .await
        .expect("two readers were never inside together")
        .unwrap();
    let (status, _, _) = send(&http(), "POST", &url).await;
    assert_eq!(status, StatusCode::LOCKED, "a writer got in with readers inside");
    app.gate.add_permits(2);
    for read in reads {
        let (status, _, body) = read.await.unwrap();
        assert_eq!((status, body.as_str()), (StatusCode::OK, "report 5"));
    }
    let (status, _, body) = send(&http(), "POST", &url).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "written 5"));
}

#[locked(key = "orphan")]
async fn orphan() -> &'static str {
    "ran without a lock"
}

#[locked(key = "{id}")]
async fn deposit_renamed(Path(id): Path<u64>) -> String {
    format!("deposited to {id}")
}

/// A key that is one binding, named after no parameter of the matched route: the lock is the
/// route's rather than the resource's, and a warning says so, once per route.
#[tokio::test(flavor = "current_thread")]
async fn a_key_naming_no_route_parameter_is_reported() {
    let (logs, _capturing) = Logs::capture();
    let app = Router::new()
        .route("/accounts/{account_id}/deposit", post(deposit_renamed))
        .layer(Extension(AnyLockClient::from(LockClient::in_memory())));
    let url = format!("{}/accounts/7/deposit", serve(app).await);
    for _ in 0..2 {
        let (status, _, body) = send(&http(), "POST", &url).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "deposited to 7"));
    }
    let logs = logs.text();
    let warnings = logs.matches("no path parameter of that name").count();
    assert_eq!(warnings, 1, "one warning per route: {logs}");
    assert!(logs.contains("/accounts/{account_id}/deposit"), "the warning names the route: {logs}");
}

/// No client in the extensions or the state: 500 with a short body and an error log saying how
/// to provide one, never a panic and never the handler's body.
#[tokio::test(flavor = "current_thread")]
async fn missing_client_is_500_with_a_log_line() {
    let (logs, _capturing) = Logs::capture();
    let base = serve(Router::new().route("/orphan", post(orphan))).await;
    let (status, _, body) = send(&http(), "POST", &format!("{base}/orphan")).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(body, "lock misconfigured on the server (see its log)");
    let logs = logs.text();
    assert!(
        logs.contains("ERROR") && logs.contains("Extension") && logs.contains("FromRef"),
        "no log line on how to provide a client: {logs}"
    );
}

/// An application error type with its own response.
#[derive(Debug)]
struct AppError;

impl axum::response::IntoResponse for AppError {
    fn into_response(self) -> axum::response::Response {
        (StatusCode::UNPROCESSABLE_ENTITY, "app error").into_response()
    }
}

#[derive(serde::Deserialize)]
struct Withdrawal {
    amount: String,
}

#[locked(key = "acct:{id}", wait = "2s")]
async fn fallible(Path(id): Path<u64>, Json(w): Json<Withdrawal>) -> Result<Json<u64>, AppError> {
    let amount: u64 = w.amount.parse().map_err(|_| AppError)?;
    if amount == 0 {
        return Err(AppError);
    }
    Ok(Json(id + amount))
}

/// The handler's `?` and `return` keep their meaning; an error response releases the lock.
#[tokio::test]
async fn errors_pass_through_and_release() {
    let locks = LockClient::in_memory();
    let router = Router::new()
        .route("/acct/{id}", post(fallible))
        .layer(Extension(AnyLockClient::from(locks.clone())));
    let base = serve(router).await;
    let url = format!("{base}/acct/4");
    let post_json = |body: &'static str| post_json(&url, body);
    assert_eq!(post_json(r#"{"amount":"3"}"#).await, (StatusCode::OK, "7".to_owned()));
    for bad in [r#"{"amount":"x"}"#, r#"{"amount":"0"}"#] {
        let (status, body) = post_json(bad).await;
        assert_eq!((status, body.as_str()), (StatusCode::UNPROCESSABLE_ENTITY, "app error"));
        // Released before the response left.
        assert!(is_free(&locks, "", "acct:4").await, "held after an error");
    }
}

/// Marks that a handler future was dropped or finished.
struct OnDrop(Arc<AtomicBool>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A client with default settings on `server`.
async fn redis_locks(server: &RedisServer) -> LockClient<RedisBackend> {
    let backend = support::redis_backend(server.url()).connect().await.unwrap();
    LockClient::builder(backend).build().unwrap()
}

#[derive(Clone, Default)]
struct Signals {
    entered: Arc<Notify>,
    dropped: Arc<AtomicBool>,
}

#[locked(key = "hang:{id}")]
async fn hang(Extension(signals): Extension<Signals>, Path(id): Path<u64>) -> String {
    let _guard = OnDrop(signals.dropped.clone());
    signals.entered.notify_one();
    std::future::pending::<()>().await;
    format!("{id}")
}

#[locked(key = "boom:{id}")]
async fn boom(Path(id): Path<u64>) -> String {
    assert!(id == 0, "handler failed");
    String::new()
}

/// A client that disconnects mid-handler and a panic caught by `CatchPanicLayer` both free the
/// lock at once, not after its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn disconnect_and_panic_release() {
    let server = RedisServer::start();
    let locks = redis_locks(&server).await;
    let signals = Signals::default();
    let router = Router::new()
        .route("/hang/{id}", post(hang))
        .route("/boom/{id}", post(boom))
        .layer(Extension(signals.clone()))
        .layer(Extension(AnyLockClient::from(locks.clone())))
        .layer(tower_http::catch_panic::CatchPanicLayer::new());
    let base = serve(router).await;

    let url = format!("{base}/hang/1");
    let request = tokio::spawn(async move { send(&http(), "POST", &url).await });
    signals.entered.notified().await;
    assert!(!is_free(&locks, "", "hang:1").await);
    request.abort();
    let _ = request.await;
    until_free(&locks, "", "hang:1").await;
    assert!(signals.dropped.load(Ordering::SeqCst), "the handler was not dropped");

    let (status, _, _) = send(&http(), "POST", &format!("{base}/boom/1")).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    until_free(&locks, "", "boom:1").await;
}

#[locked(key = "long:{id}", lease = "watchdog(600ms)")]
async fn long_abort(Extension(signals): Extension<Signals>, Path(id): Path<u64>) -> String {
    let _guard = OnDrop(signals.dropped.clone());
    signals.entered.notify_one();
    std::future::pending::<()>().await;
    format!("{id}")
}

#[locked(key = "long:{id}", lease = "watchdog(600ms)", on_lost = "continue")]
async fn long_continue(
    Extension(signals): Extension<Signals>,
    Path(id): Path<u64>,
    lock: LockContext,
) -> String {
    signals.entered.notify_one();
    lock.lost().await;
    format!("{id} finished after losing its lock")
}

/// A lock deleted behind the handler's back: by default the handler is dropped and the client
/// gets 503; with `on_lost = "continue"` it runs on and can watch the loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_lock_aborts_or_continues() {
    let server = RedisServer::start();
    let locks = redis_locks(&server).await;
    let signals = Signals::default();
    let router = Router::new()
        .route("/abort/{id}", post(long_abort))
        .route("/continue/{id}", post(long_continue))
        .layer(Extension(signals.clone()))
        .layer(Extension(AnyLockClient::from(locks)));
    let base = serve(router).await;

    for (route, expect) in [
        (
            "abort",
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "lock lost while the request ran; retry in about 1 s\n".to_owned(),
            ),
        ),
        ("continue", (StatusCode::OK, "1 finished after losing its lock".to_owned())),
    ] {
        let url = format!("{base}/{route}/1");
        let request = tokio::spawn(async move { send(&http(), "POST", &url).await });
        signals.entered.notified().await;
        // The key names its resource (`long:`): no route in the lock's name.
        let name = "tower-lock:{long:1}".to_owned();
        let deleted = server.cmd(&["DEL", &name]).as_int();
        assert_eq!(deleted, 1, "no lock at {name}");
        let started = Instant::now();
        let (status, _, body) = request.await.unwrap();
        assert_eq!((status, body), expect);
        assert!(started.elapsed() < Duration::from_secs(2));
    }
    assert!(signals.dropped.load(Ordering::SeqCst), "the aborted handler was not dropped");
}

/// `#[debug_handler]` on the same function, in either order.
#[locked(key = "dbg:{id}")]
#[axum::debug_handler]
async fn debug_below(Path(id): Path<u64>, lock: LockContext) -> String {
    format!("{id} {}", lock.key().as_str())
}

#[axum::debug_handler]
#[locked(key = "dbg:{id}")]
async fn debug_above(State(app): State<MemoryApp>, Path(id): Path<u64>) -> String {
    let _ = app;
    format!("{id}")
}

/// Both orders of `#[debug_handler]` and `#[locked]` compile and serve.
#[tokio::test]
async fn works_with_debug_handler() {
    let app = MemoryApp { locks: LockClient::in_memory(), witness: Witness::default() };
    let router = Router::new()
        .route("/below/{id}", post(debug_below))
        .route("/above/{id}", post(debug_above))
        .layer(Extension(AnyLockClient::from(app.locks.clone())))
        .with_state(app);
    let base = serve(router).await;
    let (status, _, body) = send(&http(), "POST", &format!("{base}/below/2")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.starts_with("2 tower-lock:"), "{body}");
    let (status, _, body) = send(&http(), "POST", &format!("{base}/above/3")).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "3"));
}

#[locked(key = "stall:{id}", lease = "200ms")]
async fn stalls_past_its_lease(Path(id): Path<u64>) -> String {
    // Blocks the runtime's only thread: no timer or watchdog runs meanwhile.
    std::thread::sleep(Duration::from_millis(400));
    format!("stalled {id}")
}

/// A handler that stalls its thread past a fixed lease still gets 503 when it finishes: its
/// response was not made under the lock.
#[tokio::test(flavor = "current_thread")]
async fn handler_finishing_past_its_deadline_gets_503() {
    use tower::ServiceExt as _;
    let locks = LockClient::in_memory();
    let router = Router::new()
        .route("/stall/{id}", post(stalls_past_its_lease))
        .layer(Extension(AnyLockClient::from(locks.clone())));
    let request = http::Request::post("/stall/1").body(axum::body::Body::empty()).unwrap();
    let response = router.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
}

#[locked(key = "stall:{id}", lease = "150ms", on_lost = "continue")]
async fn reports_its_loss(Path(id): Path<u64>, lock: LockContext) -> String {
    let before = lock.is_lost();
    // Blocks the runtime's only thread: no timer or watchdog runs meanwhile.
    std::thread::sleep(Duration::from_millis(300));
    format!("{id} {before} {}", lock.is_lost())
}

/// Under `#[locked]`, `LockContext::is_lost` looks at the lease's deadline too: a handler
/// that stalled past it learns so before its next write, before the watchdog reports it.
#[tokio::test(flavor = "current_thread")]
async fn lock_context_is_lost_past_the_deadline() {
    use tower::ServiceExt as _;
    let locks = LockClient::in_memory();
    let router = Router::new()
        .route("/stall/{id}", post(reports_its_loss))
        .layer(Extension(AnyLockClient::from(locks.clone())));
    let request = http::Request::post("/stall/4").body(axum::body::Body::empty()).unwrap();
    let response = router.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = http_body_util::BodyExt::collect(response.into_body()).await.unwrap().to_bytes();
    assert_eq!(&body[..], b"4 false true");
}

/// Where a handler can reach the test's Redis.
#[derive(Clone)]
struct RedisUrl(String);

#[locked(key = "doc:{id}")]
async fn reports_its_lease(
    Path(id): Path<u64>,
    Extension(RedisUrl(url)): Extension<RedisUrl>,
    lock: LockContext,
) -> String {
    let client = redis::Client::open(url).expect("url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
    let ttl: i64 =
        redis::cmd("PTTL").arg(lock.key().as_str()).query_async(&mut conn).await.expect("PTTL");
    format!("{id} {ttl}")
}

/// Options the attribute does not set come from the client: its lease (10 s here, where the
/// engine's default is 30 s).
#[tokio::test]
async fn unset_options_come_from_the_client() {
    let server = RedisServer::start();
    let backend = support::redis_backend(server.url()).connect().await.unwrap();
    let locks = LockClient::builder(backend)
        .lease(tower_lock::Lease::watchdog(Duration::from_secs(10)))
        .build()
        .unwrap();
    let router = Router::new()
        .route("/docs/{id}", post(reports_its_lease))
        .layer(Extension(AnyLockClient::from(locks)))
        .layer(Extension(RedisUrl(server.url())));
    let base = serve(router).await;
    let (status, _, body) = send(&http(), "POST", &format!("{base}/docs/3")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let ttl: i64 = body.strip_prefix("3 ").unwrap().parse().unwrap();
    assert!((9_000..=10_000).contains(&ttl), "lease {ttl} ms, not the client's 10 s");
}

/// A deposit under `#[locked]`, keyed by the account alone.
#[locked(key = "{id}")]
async fn deposit(Path(id): Path<String>, lock: LockContext) -> String {
    format!("{id} {}", lock.key())
}

/// A withdrawal under the route's `LockLayer`: `LockContext` is an extractor there too.
async fn withdraw(lock: LockContext) -> String {
    lock.key().to_string()
}

/// The same through the extensions the layer fills.
async fn pay(Extension(lock): Extension<LockContext>) -> String {
    lock.key().to_string()
}

/// One resource, one lock, whichever endpoint: a `LockLayer` on `/accounts/{id}/withdraw`
/// keyed by the path parameter and `#[locked(key = "{id}")]` on `/accounts/{id}/deposit` take
/// the same lock for one account (named by the route up to the parameter), with nothing
/// named twice; `/orders/{id}/pay` takes another; a prefixed key names its resource itself.
#[tokio::test]
async fn one_lock_per_resource_across_endpoints() {
    let locks = LockClient::in_memory();
    let withdrawals = Router::new()
        .route("/accounts/{id}/withdraw", post(withdraw))
        .route("/orders/{id}/pay", post(pay))
        .route_layer(LockLayer::new(locks.clone()).key(key::path_param("id")));
    let prefixed = Router::new()
        .route("/v2/accounts/{id}/withdraw", post(withdraw))
        .route_layer(LockLayer::new(locks.clone()).key(key::path_param("id").prefixed("account:")));
    let router = Router::new()
        .route("/accounts/{id}/deposit", post(deposit))
        .merge(withdrawals)
        .merge(prefixed)
        .layer(Extension(AnyLockClient::from(locks.clone())));
    let base = serve(router).await;
    let name = |path: &'static str| {
        let url = format!("{base}{path}");
        async move {
            let (status, _, body) = send(&http(), "POST", &url).await;
            assert_eq!(status, StatusCode::OK, "{path}: {body}");
            body
        }
    };
    let withdrawn = name("/accounts/alice/withdraw").await;
    assert_eq!(withdrawn, "tower-lock:/accounts/:id{alice}");
    assert_eq!(name("/accounts/alice/deposit").await, format!("alice {withdrawn}"));
    assert_eq!(name("/orders/alice/pay").await, "tower-lock:/orders/:id{alice}");
    assert_eq!(name("/v2/accounts/alice/withdraw").await, "tower-lock:{account:alice}");

    // The same lock for real: while the account's lock is held, either endpoint waits for it.
    for path in ["/accounts/alice/withdraw", "/accounts/alice/deposit"] {
        let held = locks
            .lock_in_namespace("/accounts/{id}", "alice")
            .acquire()
            .await
            .expect("take the account's lock");
        let url = format!("{base}{path}");
        let request = tokio::spawn(async move { send(&http(), "POST", &url).await });
        let deadline = Instant::now() + Duration::from_secs(2);
        while locks.waiters() == 0 {
            assert!(Instant::now() < deadline, "{path} did not wait for the account");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        held.release().await.expect("release");
        let (status, _, _) = request.await.expect("request task");
        assert_eq!(status, StatusCode::OK, "{path} after the release");
    }
}

/// A handler that takes `LockContext` on a route without a lock layer answers 500 (with a
/// body and a log line naming the fix), rather than failing to compile in a way axum cannot
/// explain.
#[tokio::test]
async fn lock_context_without_a_layer_is_500() {
    let base = serve(Router::new().route("/accounts/{id}/withdraw", post(withdraw))).await;
    let (status, _, body) = send(&http(), "POST", &format!("{base}/accounts/1/withdraw")).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(body.contains("no lock layer"), "{body}");
}

/// Holds its account for 1.5 s under a 30 s watchdog lease.
#[locked(key = "transfer:{id}", wait = "100ms", lease = "watchdog(30s)")]
async fn slow_transfer(Path(id): Path<String>, Extension(entered): Extension<Entered>) -> String {
    entered.signal();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    id
}

/// As under the layer: a request that waited in vain hears how long this handler's requests
/// hold the lock (`Retry-After: 2`), not the holder's 30 s lease, in a text body too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_tells_the_likely_wait() {
    let locks = LockClient::in_memory();
    let (entered, mut entries) = Entered::channel();
    let router = Router::new()
        .route("/accounts/{id}/transfer", post(slow_transfer))
        .layer(Extension(AnyLockClient::from(locks.clone())));
    let base = serve(router.layer(Extension(entered))).await;
    let url = format!("{base}/accounts/bob/transfer");
    assert_told_the_likely_wait(&url, &mut entries).await;
}

/// Accounts whose transfers read both balances, wait, then write both: without a lock on both
/// accounts, concurrent transfers lose money.
#[derive(Clone)]
struct Bank {
    balances: Arc<Mutex<std::collections::HashMap<u64, i64>>>,
    inside: Arc<Mutex<std::collections::HashMap<u64, usize>>>,
    overlaps: Arc<AtomicUsize>,
}

impl Bank {
    fn new(accounts: u64, each: i64) -> Self {
        Self {
            balances: Arc::new(Mutex::new((0..accounts).map(|id| (id, each)).collect())),
            inside: Arc::default(),
            overlaps: Arc::default(),
        }
    }

    fn total(&self) -> i64 {
        self.balances.lock().unwrap().values().sum()
    }

    async fn transfer(&self, from: u64, to: u64, amount: i64) {
        {
            let mut inside = self.inside.lock().unwrap();
            for id in [from, to] {
                let n = inside.entry(id).or_default();
                *n += 1;
                if *n > 1 {
                    self.overlaps.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
        let (a, b) = {
            let balances = self.balances.lock().unwrap();
            (balances[&from], balances[&to])
        };
        tokio::time::sleep(Duration::from_millis(1)).await;
        {
            let mut balances = self.balances.lock().unwrap();
            balances.insert(from, a - amount);
            balances.insert(to, b + amount);
        }
        let mut inside = self.inside.lock().unwrap();
        for id in [from, to] {
            *inside.get_mut(&id).unwrap() -= 1;
        }
    }
}

#[derive(serde::Deserialize)]
struct Transfer {
    from: u64,
    to: u64,
    amount: i64,
}

#[locked(keys = ["account:{t.from}", "account:{t.to}"], wait = "10s", fencing)]
async fn transfer(
    Extension(bank): Extension<Bank>,
    lock: LockContext,
    Json(t): Json<Transfer>,
) -> String {
    bank.transfer(t.from, t.to, t.amount).await;
    let keys = lock.keys().count();
    let tokens = [t.from, t.to].map(|id| lock.fencing_token_of(format!("account:{id}")));
    assert!(tokens.iter().all(Option::is_some), "a token per account");
    format!("{keys}")
}

async fn post_transfer(base: &str, from: u64, to: u64) -> (StatusCode, String) {
    let body = format!(r#"{{"from":{from},"to":{to},"amount":1}}"#);
    post_json(&format!("{base}/transfers"), body).await
}

/// `#[locked(keys = [..])]` on the fields of a JSON body: random transfers among 5 accounts,
/// in both directions, through two app instances on one Redis: every one succeeds (no
/// deadlock, no 423), no account has two transfers inside at once, and the total is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transfers_lock_both_accounts_from_the_body() {
    let server = RedisServer::start();
    let bank = Bank::new(5, 100);
    let mut bases = Vec::new();
    for _ in 0..2 {
        let backend = support::redis_backend(server.url()).connect().await.unwrap();
        let locks = LockClient::builder(backend).build().unwrap();
        let app = Router::new()
            .route("/transfers", post(transfer))
            .layer(Extension(bank.clone()))
            .layer(Extension(AnyLockClient::from(locks)));
        bases.push(serve(app).await);
    }
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..16u64 {
        let base = bases[i as usize % 2].clone();
        tasks.spawn(async move {
            for j in 0..10u64 {
                let from = (i + j) % 5;
                let to = (from + 1 + (i * 7 + j) % 4) % 5;
                let answer = post_transfer(&base, from, to).await;
                assert_eq!(answer, (StatusCode::OK, "2".to_owned()));
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.unwrap();
    }
    assert_eq!(bank.overlaps.load(Ordering::SeqCst), 0);
    assert_eq!(bank.total(), 500);
}

/// A set's locks are the resources' own: a layer holding `account:3` on another route makes
/// a transfer touching account 3 wait and answer 423, and the other account is not left held.
#[tokio::test]
async fn transfer_shares_locks_with_a_layer_and_is_all_or_nothing() {
    let locks = LockClient::in_memory();
    let bank = Bank::new(5, 100);
    let (entered, mut entries) = Entered::channel();
    let release = Arc::new(Notify::new());
    let freeze = {
        let release = release.clone();
        move |Extension(entered): Extension<Entered>| async move {
            entered.signal();
            release.notified().await;
            "unfrozen"
        }
    };
    let app = Router::new()
        .route(
            "/accounts/{id}/freeze",
            post(freeze).route_layer(
                LockLayer::new(locks.clone()).key(key::path_param("id").prefixed("account:")),
            ),
        )
        .route("/transfers", post(transfer_quick))
        .layer(Extension(entered))
        .layer(Extension(bank.clone()))
        .layer(Extension(AnyLockClient::from(locks.clone())));
    let base = serve(app).await;
    let frozen = tokio::spawn({
        let base = base.clone();
        async move { send(&http(), "POST", &format!("{base}/accounts/3/freeze")).await }
    });
    entries.recv().await.unwrap();
    let (status, _) = post_transfer(&base, 1, 3).await;
    assert_eq!(status, StatusCode::LOCKED);
    assert!(is_free(&locks, "", "account:1").await, "account 1 is not left held");
    release.notify_one();
    assert_eq!(frozen.await.unwrap().0, StatusCode::OK);
    assert_eq!(post_transfer(&base, 1, 3).await.0, StatusCode::OK);
    assert_eq!(bank.total(), 500);
}

#[locked(keys = ["account:{t.from}", "account:{t.to}"], wait = "50ms")]
async fn transfer_quick(Extension(bank): Extension<Bank>, Json(t): Json<Transfer>) -> String {
    bank.transfer(t.from, t.to, t.amount).await;
    "done".to_owned()
}

/// Waits 2 s for `doc:{id}`.
#[locked(key = "doc:{id}", wait = "2s")]
async fn edit_doc(Path(id): Path<u64>) -> String {
    format!("edited {id}")
}

/// A `#[locked]` handler's 423: `Retry-After` at least the 2 s it waited, though its requests
/// held the lock for milliseconds, and at most the holder's remaining lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retry_after_is_at_least_the_wait_and_at_most_the_lease() {
    let server = RedisServer::start();
    let locks = redis_locks(&server).await;
    let app = Router::new()
        .route("/docs/{id}", post(edit_doc))
        .layer(Extension(AnyLockClient::from(locks.clone())));
    let base = serve(app).await;
    let (status, _, _) = send(&http(), "POST", &format!("{base}/docs/8")).await;
    assert_eq!(status, StatusCode::OK, "a quick request: the handler's history");
    let holder = locks
        .lock("doc:7")
        .lease(tower_lock::Lease::fixed(Duration::from_secs(12)))
        .acquire()
        .await
        .unwrap();
    let (status, retry, body) = send(&http(), "POST", &format!("{base}/docs/7")).await;
    let answered = Instant::now();
    let left_ms = server.cmd(&["PTTL", holder.key().as_str()]).as_int();
    let lease_left_ms = u64::try_from(left_ms).unwrap() + answered.elapsed().as_millis() as u64;
    assert_eq!(status, StatusCode::LOCKED, "{body}");
    let retry: u64 = retry.expect("Retry-After").parse().unwrap();
    println!("#[locked]: Retry-After {retry} s, waited 2 s, holder's lease {lease_left_ms} ms");
    assert!(retry >= 2, "Retry-After {retry} s, less than the 2 s waited");
    assert!(
        retry <= lease_left_ms.div_ceil(1000),
        "Retry-After {retry} s, more than the holder's {lease_left_ms} ms left"
    );
    holder.release().await.unwrap();
}

/// A `#[locked]` handler on a store in its restart quarantine answers 503 at once, with the
/// quarantine's time left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quarantine_answers_503_at_once() {
    let server = RedisServer::start();
    let backend = RedisBackend::builder(server.url())
        .quarantine(Duration::from_secs(30))
        .connect()
        .await
        .unwrap();
    let locks = LockClient::builder(backend).build().unwrap();
    let app = Router::new()
        .route("/docs/{id}", post(edit_doc))
        .layer(Extension(AnyLockClient::from(locks)));
    let sent = Instant::now();
    let (status, retry, body) =
        send(&http(), "POST", &format!("{}/docs/7", serve(app).await)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(sent.elapsed() < Duration::from_secs(2), "answered after the wait");
    let retry: u64 = retry.expect("Retry-After").parse().unwrap();
    assert!((25..=33).contains(&retry), "Retry-After {retry} s");
    assert!(body.contains("restarted recently"), "{body}");
}
