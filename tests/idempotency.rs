//! `IdempotencyLayer` end to end: two axum instances on loopback sharing one lock store and
//! one answer store (a `redis-server` of the fixture, or the in-memory stores), called over
//! real HTTP with a hyper client. Replays across instances; 409 for duplicates under real
//! concurrency; 422; 400 for missing and bad keys; nothing kept for 5xx, panics, cancelled
//! handlers, streamed and oversized bodies; scoping; expiry; a handler slower than its lease;
//! a lost lock; a late answer fenced out by a later holder's; a lock-store restart inside its quarantine; gRPC unary replay over
//! HTTP/2 with a tonic client; the round trips a fresh key and a replay cost.
//!
//! Each test that makes sense on both stores runs the same body on each (`<test>::memory`,
//! `<test>::redis`). Handlers say when they are entered and when they are dropped; tests await
//! those signals rather than sleep.

mod support;

#[path = "../examples/common/bank.rs"]
mod bank;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    Extension, Router,
    body::Body,
    extract::State,
    response::{IntoResponse, Response},
    routing::post as on_post,
};
use bytes::Bytes;
use futures_util::{StreamExt as _, stream::FuturesUnordered};
use http::{HeaderMap, HeaderValue, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper_util::{client::legacy::Client as HttpClient, rt::TokioExecutor};
use support::{RedisServer, RespValue, http::serve};
use tokio::sync::{Semaphore, mpsc};
use tower_lock::{
    Lease, LockClient, LockKey, MemoryBackend, RedisBackend,
    error::BackendError,
    idempotency::{
        AnswerStore, IdempotencyContext, IdempotencyLayer, IdempotencyLayerBuilder,
        MemoryAnswerStore, Put, Record, RedisAnswerStore, RequestBody,
    },
};

/// The namespace of the keys' locks (the layer's default).
const NAMESPACE: &str = "idempotency:";
/// The caller of most requests.
const ALICE: &str = "Bearer alice";

// ---------------------------------------------------------------------------------------------
// The stores of both instances.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Memory,
    Redis,
}

/// One instance's lock client, whatever its backend.
#[derive(Clone)]
enum Locks {
    Memory(LockClient<MemoryBackend>),
    Redis(LockClient<RedisBackend>),
}

impl Locks {
    fn builder(&self, store: impl AnswerStore) -> IdempotencyLayerBuilder {
        match self {
            Self::Memory(locks) => IdempotencyLayer::builder(locks.clone(), store),
            Self::Redis(locks) => IdempotencyLayer::builder(locks.clone(), store),
        }
    }

    /// Frees the lock `key` whoever holds it; its holder hears at its next renewal.
    async fn force_unlock(&self, key: &LockKey) -> bool {
        let user_key = key.user_key();
        match self {
            Self::Memory(locks) => locks.force_unlock_in_namespace(NAMESPACE, user_key).await,
            Self::Redis(locks) => locks.force_unlock_in_namespace(NAMESPACE, user_key).await,
        }
        .expect("force unlock")
    }

    /// Whether anyone holds the lock `key`.
    async fn is_held(&self, key: &LockKey) -> bool {
        let user_key = key.user_key();
        let info = match self {
            Self::Memory(locks) => locks.inspect_in_namespace(NAMESPACE, user_key).await,
            Self::Redis(locks) => locks.inspect_in_namespace(NAMESPACE, user_key).await,
        };
        !info.expect("inspect").holders.is_empty()
    }
}

/// One instance's answer store, whatever it is; with an optional pause of its puts.
#[derive(Clone)]
struct Store {
    inner: Stored,
    pause: Option<Arc<Pause>>,
}

#[derive(Clone)]
enum Stored {
    Memory(MemoryAnswerStore),
    Redis(RedisAnswerStore),
}

/// Holds a store's puts back: each put says it arrived, then waits for a permit.
struct Pause {
    arrived: mpsc::UnboundedSender<()>,
    resume: Semaphore,
}

impl AnswerStore for Store {
    async fn get(&self, key: &LockKey) -> Result<Option<Record>, BackendError> {
        match &self.inner {
            Stored::Memory(store) => store.get(key).await,
            Stored::Redis(store) => store.get(key).await,
        }
    }

    async fn put(&self, key: &LockKey, record: Record, ttl: Duration) -> Result<Put, BackendError> {
        if let Some(pause) = &self.pause {
            let _ = pause.arrived.send(());
            pause.resume.acquire().await.expect("open").forget();
        }
        match &self.inner {
            Stored::Memory(store) => store.put(key, record, ttl).await,
            Stored::Redis(store) => store.put(key, record, ttl).await,
        }
    }
}

/// The stores both instances share: a Redis server, or one memory backend and answer map.
struct Stores {
    kind: Kind,
    server: Option<RedisServer>,
    memory: (MemoryBackend, MemoryAnswerStore),
    /// The lock-store restart quarantine of the Redis backends.
    quarantine: Duration,
}

impl Stores {
    fn new(kind: Kind) -> Self {
        Self::with_quarantine(kind, Duration::ZERO)
    }

    fn with_quarantine(kind: Kind, quarantine: Duration) -> Self {
        Self {
            kind,
            server: (kind == Kind::Redis).then(RedisServer::start),
            memory: (MemoryBackend::new(), MemoryAnswerStore::new()),
            quarantine,
        }
    }

    fn server(&self) -> &RedisServer {
        self.server.as_ref().expect("a Redis test")
    }

    /// An instance's lock client (with `lease`) and answer store: on Redis, with connections
    /// of its own, as another process would have.
    async fn instance(&self, lease: Lease) -> (Locks, Stored) {
        match self.kind {
            Kind::Memory => {
                let locks =
                    LockClient::builder(self.memory.0.clone()).lease(lease).build().unwrap();
                (Locks::Memory(locks), Stored::Memory(self.memory.1.clone()))
            }
            Kind::Redis => {
                let backend = support::redis_backend(self.server().url())
                    .quarantine(self.quarantine)
                    .connect()
                    .await
                    .expect("connect");
                let locks = LockClient::builder(backend.clone()).lease(lease).build().unwrap();
                (Locks::Redis(locks), Stored::Redis(RedisAnswerStore::new(backend)))
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The handler both instances run, and what it tells the test.

/// The sending end of a streamed response's rest.
type Chunks = mpsc::Sender<Result<Bytes, std::io::Error>>;

/// What handlers share with the test, across both instances.
#[derive(Clone)]
struct Probe {
    /// How many times the handler began, per idempotency key.
    runs: Arc<Mutex<HashMap<String, u32>>>,
    /// Each run that begins sends its key.
    entered: mpsc::UnboundedSender<String>,
    /// Each run dropped before it finished sends its key.
    dropped: mpsc::UnboundedSender<String>,
    /// A request with `x-hold` waits here for a permit (one per held request).
    gate: Arc<Semaphore>,
    /// The sender of a streamed response's rest, for the test to finish.
    stream: Arc<Mutex<Option<Chunks>>>,
}

/// The test's ends of a [`Probe`].
struct Signals {
    entered: mpsc::UnboundedReceiver<String>,
    dropped: mpsc::UnboundedReceiver<String>,
}

fn probe() -> (Probe, Signals) {
    let (entered, entered_rx) = mpsc::unbounded_channel();
    let (dropped, dropped_rx) = mpsc::unbounded_channel();
    let probe = Probe {
        runs: Arc::default(),
        entered,
        dropped,
        gate: Arc::new(Semaphore::new(0)),
        stream: Arc::default(),
    };
    let signals = Signals { entered: entered_rx, dropped: dropped_rx };
    (probe, signals)
}

impl Probe {
    fn runs(&self, key: &str) -> u32 {
        self.runs.lock().unwrap().get(key).copied().unwrap_or(0)
    }

    /// Lets `n` held requests go on.
    fn open(&self, n: usize) {
        self.gate.add_permits(n);
    }
}

/// Sends the run's key on `dropped` if the run is dropped before it finishes.
struct Running {
    key: String,
    dropped: mpsc::UnboundedSender<String>,
    finished: bool,
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.dropped.send(self.key.clone());
        }
    }
}

/// Which instance answered.
#[derive(Clone, Copy)]
struct Instance(&'static str);

/// The handler: counts its run, says it is in, waits at the gate for `x-hold`, then answers as
/// `x-outcome` asks (on its first run only for `500` and `panic`): 201 with a body naming the
/// instance, the run, the token and the request body's length by default.
async fn charge(
    State(probe): State<Probe>,
    Extension(Instance(instance)): Extension<Instance>,
    context: IdempotencyContext,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let key = context.key().to_owned();
    let run = {
        let mut runs = probe.runs.lock().unwrap();
        let run = runs.entry(key.clone()).or_insert(0);
        *run += 1;
        *run
    };
    let mut running = Running { key: key.clone(), dropped: probe.dropped.clone(), finished: false };
    let _ = probe.entered.send(key.clone());
    if headers.contains_key("x-hold") {
        probe.gate.acquire().await.expect("gate open").forget();
    }
    running.finished = true;
    let outcome = headers.get("x-outcome").map(|value| value.to_str().unwrap().to_owned());
    let answer = format!(
        "{{\"instance\":\"{instance}\",\"key\":\"{key}\",\"run\":{run},\"token\":{},\"body\":{}}}",
        context.fencing_token(),
        body.len()
    );
    match outcome.as_deref() {
        Some("500") if run == 1 => (StatusCode::INTERNAL_SERVER_ERROR, "try again").into_response(),
        Some("429") if run == 1 => (StatusCode::TOO_MANY_REQUESTS, "slow down").into_response(),
        Some("404") => (StatusCode::NOT_FOUND, answer).into_response(),
        Some("panic") if run == 1 => panic!("the handler's first run fails"),
        Some("stream") => {
            let (sender, receiver) = mpsc::channel(4);
            sender.try_send(Ok(Bytes::from(answer))).expect("room for the first chunk");
            *probe.stream.lock().unwrap() = Some(sender);
            let stream = tokio_stream::wrappers::ReceiverStream::new(receiver);
            (StatusCode::CREATED, Body::from_stream(stream)).into_response()
        }
        Some("big") => (StatusCode::CREATED, "x".repeat(64 * 1024)).into_response(),
        _ => {
            let mut response = (StatusCode::CREATED, answer).into_response();
            response.headers_mut().insert("x-charge-run", HeaderValue::from(run));
            response.headers_mut().insert("set-cookie", HeaderValue::from_static("session=1"));
            response
        }
    }
}

/// Both instances, their layers and what the test steers them with.
struct Pair {
    a: String,
    b: String,
    /// Instance A's layer (to name a key's lock).
    layer: IdempotencyLayer,
    locks: [Locks; 2],
    /// The answer store as instance A reads it (without A's pause).
    store: Store,
    probe: Probe,
    signals: Signals,
    /// Instance A's put pause, when asked for.
    pause: Option<Arc<Pause>>,
    pause_arrived: Option<mpsc::UnboundedReceiver<()>>,
    stores: Stores,
}

/// What a pair is made with.
struct Setup {
    lease: Lease,
    /// Whether instance A's puts are held back until the test lets them go.
    pause_a: bool,
    configure: fn(IdempotencyLayerBuilder) -> IdempotencyLayerBuilder,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            lease: Lease::watchdog(Duration::from_secs(10)),
            pause_a: false,
            configure: |builder| builder,
        }
    }
}

async fn pair(kind: Kind) -> Pair {
    pair_with(Stores::new(kind), Setup::default()).await
}

async fn pair_with(stores: Stores, setup: Setup) -> Pair {
    let (probe, signals) = probe();
    let (pause, pause_arrived) = if setup.pause_a {
        let (arrived, receiver) = mpsc::unbounded_channel();
        let pause = Arc::new(Pause { arrived, resume: Semaphore::new(0) });
        (Some(pause), Some(receiver))
    } else {
        (None, None)
    };
    let mut urls = Vec::new();
    let mut layers = Vec::new();
    let mut all_locks = Vec::new();
    let mut first_store = None;
    for (i, name) in ["a", "b"].into_iter().enumerate() {
        let (locks, stored) = stores.instance(setup.lease).await;
        let store =
            Store { inner: stored.clone(), pause: if i == 0 { pause.clone() } else { None } };
        first_store.get_or_insert(Store { inner: stored, pause: None });
        let layer =
            (setup.configure)(locks.builder(store).required(true)).build().expect("valid settings");
        let app = Router::new()
            .route("/charges", on_post(charge))
            .route("/refunds", on_post(charge))
            .route_layer(layer.clone())
            .layer(tower_http::catch_panic::CatchPanicLayer::new())
            .layer(Extension(Instance(name)))
            .with_state(probe.clone());
        urls.push(serve(app).await);
        layers.push(layer);
        all_locks.push(locks);
    }
    let [a, b] = <[String; 2]>::try_from(urls).unwrap();
    let [locks_a, locks_b] = <[Locks; 2]>::try_from(all_locks).ok().unwrap();
    Pair {
        a,
        b,
        layer: layers.swap_remove(0),
        locks: [locks_a, locks_b],
        store: first_store.expect("two instances"),
        probe,
        signals,
        pause,
        pause_arrived,
        stores,
    }
}

impl Pair {
    /// The name of the lock (and answer) of `key` for `caller`.
    fn key(&self, caller: &str, key: &str) -> LockKey {
        self.layer.lock_key(Some(caller.as_bytes()), key).unwrap()
    }

    /// The answer kept for `key` of `caller`.
    async fn kept(&self, caller: &str, key: &str) -> Option<Record> {
        self.store.get(&self.key(caller, key)).await.unwrap()
    }

    /// Waits for a run of the handler to begin; returns its key.
    async fn entered(&mut self) -> String {
        self.signals.entered.recv().await.expect("a run began")
    }

    /// Waits for a run of the handler to be dropped; returns its key.
    async fn dropped(&mut self) -> String {
        self.signals.dropped.recv().await.expect("a run was dropped")
    }

    /// The Redis keys of the pair's server.
    fn redis_keys(&self) -> Vec<String> {
        match self.stores.server().cmd(&["KEYS", "*"]) {
            RespValue::Array(Some(keys)) => keys.iter().filter_map(RespValue::as_str).collect(),
            other => panic!("KEYS answered {other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The client.

/// A response, read whole.
#[derive(Debug)]
struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Reply {
    fn replayed(&self) -> bool {
        self.headers.get("idempotent-replayed").is_some_and(|value| value == "true")
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn retry_after(&self) -> Option<u64> {
        self.headers.get("retry-after").map(|value| value.to_str().unwrap().parse().unwrap())
    }
}

/// A POST to `url` as `ALICE` with `key`, extra `headers` and `body`.
struct Post {
    url: String,
    key: Option<HeaderValue>,
    caller: Option<&'static str>,
    headers: Vec<(&'static str, &'static str)>,
    body: Bytes,
}

fn post(base: &str, key: &str) -> Post {
    Post {
        url: format!("{base}/charges"),
        key: Some(HeaderValue::from_str(key).unwrap()),
        caller: Some(ALICE),
        headers: Vec::new(),
        body: Bytes::from_static(b"{\"amount\":100}"),
    }
}

impl Post {
    fn header(mut self, name: &'static str, value: &'static str) -> Self {
        self.headers.push((name, value));
        self
    }

    fn caller(mut self, caller: Option<&'static str>) -> Self {
        self.caller = caller;
        self
    }

    fn raw_key(mut self, key: Option<HeaderValue>) -> Self {
        self.key = key;
        self
    }

    fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }

    fn path(mut self, path: &str) -> Self {
        let base = self.url.rsplit_once('/').expect("a path").0.to_owned();
        self.url = format!("{base}{path}");
        self
    }

    fn request(&self) -> http::Request<Full<Bytes>> {
        let mut request = http::Request::post(&self.url)
            .header("content-type", "application/json")
            .body(Full::new(self.body.clone()))
            .unwrap();
        let headers = request.headers_mut();
        if let Some(key) = &self.key {
            headers.insert("idempotency-key", key.clone());
        }
        if let Some(caller) = self.caller {
            headers.insert("authorization", HeaderValue::from_static(caller));
        }
        for (name, value) in &self.headers {
            headers.append(*name, HeaderValue::from_static(value));
        }
        request
    }

    async fn send(self) -> Reply {
        let client = HttpClient::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let response = client.request(self.request()).await.expect("a response");
        let (parts, body) = response.into_parts();
        let body = body.collect().await.expect("the whole body").to_bytes();
        Reply { status: parts.status, headers: parts.headers, body }
    }
}

/// Runs `$test` on the in-memory stores and on Redis, as `$test::memory` and `$test::redis`.
macro_rules! on_both_stores {
    ($($test:ident),* $(,)?) => {$(
        mod $test {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn memory() {
                super::$test(super::Kind::Memory).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis() {
                super::$test(super::Kind::Redis).await;
            }
        }
    )*};
}

on_both_stores!(
    replays_across_instances,
    duplicates_in_flight_get_409,
    concurrent_duplicates_run_once,
    another_request_with_the_key_gets_422,
    server_errors_and_retry_later_answers_are_not_kept,
    panics_are_not_kept,
    cancelled_handlers_are_not_kept,
    streamed_and_oversized_bodies_are_not_kept,
    keys_are_scoped_to_the_caller,
    answers_expire,
    a_lost_lock_keeps_nothing,
    a_late_answer_never_replaces_a_later_holders,
    a_slow_handler_keeps_its_key_past_the_lease,
    a_duplicate_can_wait_for_the_answer,
    bad_keys_are_refused_and_nothing_is_kept,
);

// ---------------------------------------------------------------------------------------------
// The tests.

/// The first request runs and is kept; its retry on the other instance gets the same status,
/// headers and body replayed, without running the handler.
async fn replays_across_instances(kind: Kind) {
    let pair = pair(kind).await;
    let first = post(&pair.a, "order-1").send().await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text());
    assert!(!first.replayed());
    assert!(first.text().contains("\"instance\":\"a\""));
    for base in [&pair.b, &pair.a, &pair.b] {
        let again = post(base, "order-1").send().await;
        assert_eq!(again.status, StatusCode::CREATED);
        assert!(again.replayed(), "{again:?}");
        assert_eq!(again.body, first.body, "the kept body, whichever instance answers");
        assert_eq!(again.headers["content-type"], first.headers["content-type"]);
        assert_eq!(again.headers["x-charge-run"], "1");
        assert!(!again.headers.contains_key("set-cookie"), "cookies are not kept");
    }
    assert_eq!(pair.probe.runs("order-1"), 1);
    let kept = pair.kept(ALICE, "order-1").await.expect("kept");
    assert!(kept.token > 0);
    if kind == Kind::Redis {
        let lock = pair.key(ALICE, "order-1");
        let answer = RedisAnswerStore::key_of(&lock);
        assert_eq!(answer, format!("{}:answer", lock.as_str()));
        // Everything the layer and the lock engine wrote expires: the answer within its TTL.
        let server = pair.stores.server();
        support::eventually(Duration::from_secs(10), "the key's lock is released", || {
            !pair.redis_keys().contains(&lock.as_str().to_owned())
        })
        .await;
        for key in pair.redis_keys() {
            let ttl = server.cmd(&["PTTL", &key]).as_int();
            assert!(ttl > 0, "{key} has no TTL ({ttl})");
        }
        let ttl = server.cmd(&["PTTL", &answer]).as_int();
        assert!(ttl > 23 * 3600 * 1000 && ttl <= 24 * 3600 * 1000, "{ttl}");
    }
}

/// While the first request with a key runs, a duplicate on either instance is answered 409
/// with `Retry-After`; once the first is answered, duplicates get its answer.
async fn duplicates_in_flight_get_409(kind: Kind) {
    let mut pair = pair(kind).await;
    let first = tokio::spawn(post(&pair.a, "order-2").header("x-hold", "1").send());
    assert_eq!(pair.entered().await, "order-2");
    for base in [&pair.a, &pair.b] {
        let duplicate = post(base, "order-2").send().await;
        assert_eq!(duplicate.status, StatusCode::CONFLICT, "{}", duplicate.text());
        assert!(duplicate.retry_after().is_some_and(|secs| secs >= 1));
        assert_eq!(
            duplicate.text(),
            format!(
                "a request with this Idempotency-Key is in progress; retry in about {} s\n",
                duplicate.retry_after().unwrap()
            )
        );
    }
    pair.probe.open(1);
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    let again = post(&pair.b, "order-2").send().await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(pair.probe.runs("order-2"), 1);
}

/// Many requests with one key sent at once to both instances: one runs; every other is
/// answered 409 while it runs (the handler waits until all of them are answered), and a retry
/// afterwards gets its answer. Repeated with fresh keys.
async fn concurrent_duplicates_run_once(kind: Kind) {
    const ITERATIONS: usize = 25;
    const AT_ONCE: usize = 6;
    let pair = pair(kind).await;
    let mut conflicts = 0;
    for i in 0..ITERATIONS {
        let key = format!("burst-{i}");
        let key = key.as_str();
        let mut requests: FuturesUnordered<_> = (0..AT_ONCE)
            .map(|n| {
                let base = if n % 2 == 0 { &pair.a } else { &pair.b };
                tokio::spawn(post(base, key).header("x-hold", "1").send())
            })
            .collect();
        // Every duplicate is answered while the one that runs waits at the gate.
        for _ in 1..AT_ONCE {
            let reply = requests.next().await.unwrap().unwrap();
            assert_eq!(reply.status, StatusCode::CONFLICT, "{}: {}", key, reply.text());
            assert!(reply.retry_after().is_some());
            conflicts += 1;
        }
        pair.probe.open(1);
        let ran = requests.next().await.unwrap().unwrap();
        assert_eq!(ran.status, StatusCode::CREATED);
        let again = post(&pair.b, key).send().await;
        assert!(again.replayed());
        assert_eq!(again.body, ran.body);
        assert_eq!(pair.probe.runs(key), 1, "{key}");
    }
    println!(
        "F37 {kind:?} keys={ITERATIONS} requests={} runs_per_key=1 conflicts={conflicts} replays_equal={ITERATIONS}",
        ITERATIONS * AT_ONCE
    );
}

/// The same key with another body, or on another path, is answered 422; the request it
/// answered still gets its answer.
async fn another_request_with_the_key_gets_422(kind: Kind) {
    let pair = pair(kind).await;
    let first = post(&pair.a, "order-3").send().await;
    assert_eq!(first.status, StatusCode::CREATED);
    let other_body = post(&pair.b, "order-3").body("{\"amount\":200}").send().await;
    assert_eq!(other_body.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(other_body.text(), "this Idempotency-Key was used with another request\n");
    let other_path = post(&pair.a, "order-3").path("/refunds").send().await;
    assert_eq!(other_path.status, StatusCode::UNPROCESSABLE_ENTITY);
    let same = post(&pair.b, "order-3").send().await;
    assert!(same.replayed());
    assert_eq!(pair.probe.runs("order-3"), 1);
}

/// A 500 is not kept: the retry runs the handler again, and its 201 is kept. Neither is a
/// 429 (a "not now").
async fn server_errors_and_retry_later_answers_are_not_kept(kind: Kind) {
    let pair = pair(kind).await;
    let failed = post(&pair.a, "order-4").header("x-outcome", "500").send().await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(pair.kept(ALICE, "order-4").await.is_none());
    let retried = post(&pair.b, "order-4").header("x-outcome", "500").send().await;
    assert_eq!(retried.status, StatusCode::CREATED);
    assert!(!retried.replayed());
    assert_eq!(pair.probe.runs("order-4"), 2);
    let again = post(&pair.a, "order-4").header("x-outcome", "500").send().await;
    assert!(again.replayed());
    assert_eq!(again.body, retried.body);

    let busy = post(&pair.a, "order-5").header("x-outcome", "429").send().await;
    assert_eq!(busy.status, StatusCode::TOO_MANY_REQUESTS);
    let retried = post(&pair.a, "order-5").header("x-outcome", "429").send().await;
    assert_eq!(retried.status, StatusCode::CREATED);
    assert_eq!(pair.probe.runs("order-5"), 2);

    // A client error is an answer: kept and replayed.
    let missing = post(&pair.a, "order-6").header("x-outcome", "404").send().await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    let again = post(&pair.b, "order-6").header("x-outcome", "404").send().await;
    assert!(again.replayed());
    assert_eq!(pair.probe.runs("order-6"), 1);
}

/// A handler that panics (caught by `CatchPanicLayer` above the layer) keeps nothing: the
/// retry runs it again, once the key's lock is released. The retries here wait for the lock
/// (`wait`) rather than poll.
async fn panics_are_not_kept(kind: Kind) {
    let setup =
        Setup { configure: |builder| builder.wait(Duration::from_secs(30)), ..Setup::default() };
    let pair = pair_with(Stores::new(kind), setup).await;
    let panicked = post(&pair.a, "order-7").header("x-outcome", "panic").send().await;
    assert_eq!(panicked.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(pair.kept(ALICE, "order-7").await.is_none());
    let retried = post(&pair.b, "order-7").header("x-outcome", "panic").send().await;
    assert_eq!(retried.status, StatusCode::CREATED, "{}", retried.text());
    assert!(!retried.replayed());
    assert_eq!(pair.probe.runs("order-7"), 2);
}

/// A client that goes away mid-handler: the handler is dropped, nothing is kept, and the
/// retry runs it again.
async fn cancelled_handlers_are_not_kept(kind: Kind) {
    let setup =
        Setup { configure: |builder| builder.wait(Duration::from_secs(30)), ..Setup::default() };
    let mut pair = pair_with(Stores::new(kind), setup).await;
    let request = tokio::spawn(post(&pair.a, "order-8").header("x-hold", "1").send());
    assert_eq!(pair.entered().await, "order-8");
    request.abort();
    let _ = request.await;
    assert_eq!(pair.dropped().await, "order-8", "the server dropped the handler");
    assert!(pair.kept(ALICE, "order-8").await.is_none());
    let retried = post(&pair.b, "order-8").send().await;
    assert_eq!(retried.status, StatusCode::CREATED);
    assert!(!retried.replayed());
    assert_eq!(pair.probe.runs("order-8"), 2);
}

/// A body that streams (a frame not ready when the handler answers) and a body over the limit
/// are passed on whole and not kept; the key is free for the retry.
async fn streamed_and_oversized_bodies_are_not_kept(kind: Kind) {
    let setup =
        Setup { configure: |builder| builder.max_response_body(16 * 1024), ..Setup::default() };
    let pair = pair_with(Stores::new(kind), setup).await;
    let client = HttpClient::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let response = client
        .request(post(&pair.a, "order-9").header("x-outcome", "stream").request())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("\"run\":1"));
    // The response streams: its lock was released when it was handed back.
    assert!(!pair.locks[0].is_held(&pair.key(ALICE, "order-9")).await);
    let rest = pair.probe.stream.lock().unwrap().take().expect("streaming");
    rest.send(Ok(Bytes::from_static(b" and the rest"))).await.unwrap();
    drop(rest);
    let tail = body.collect().await.unwrap().to_bytes();
    assert_eq!(&tail[..], b" and the rest");
    assert!(pair.kept(ALICE, "order-9").await.is_none());
    let retried = post(&pair.b, "order-9").header("x-outcome", "stream").request();
    let retried = client.request(retried).await.unwrap();
    assert_eq!(retried.status(), StatusCode::CREATED);
    assert_eq!(pair.probe.runs("order-9"), 2);
    drop(pair.probe.stream.lock().unwrap().take());

    let big = post(&pair.a, "order-10").header("x-outcome", "big").send().await;
    assert_eq!(big.status, StatusCode::CREATED);
    assert_eq!(big.body.len(), 64 * 1024, "passed on whole");
    assert!(pair.kept(ALICE, "order-10").await.is_none());
    let again = post(&pair.b, "order-10").header("x-outcome", "big").send().await;
    assert_eq!(again.body.len(), 64 * 1024);
    assert!(!again.replayed());
    assert_eq!(pair.probe.runs("order-10"), 2);
}

/// Keys are scoped by the `Authorization` header: another caller with the same key runs its
/// own request and never gets the first caller's answer; a request with nothing to scope by
/// is answered 400. With `scope_by`, the scope is what the closure finds.
async fn keys_are_scoped_to_the_caller(kind: Kind) {
    let pair = pair(kind).await;
    let alice = post(&pair.a, "order-11").send().await;
    assert_eq!(alice.status, StatusCode::CREATED);
    let bob = post(&pair.b, "order-11").caller(Some("Bearer bob")).send().await;
    assert_eq!(bob.status, StatusCode::CREATED);
    assert!(!bob.replayed(), "bob never gets alice's answer");
    assert_ne!(bob.body, alice.body);
    assert_eq!(pair.probe.runs("order-11"), 2);
    let alice_again = post(&pair.b, "order-11").send().await;
    assert_eq!(alice_again.body, alice.body);
    assert!(alice_again.replayed());
    let nobody = post(&pair.a, "order-11").caller(None).send().await;
    assert_eq!(nobody.status, StatusCode::BAD_REQUEST);
    assert!(nobody.text().contains("scope"), "{}", nobody.text());
    assert_eq!(pair.probe.runs("order-11"), 2);

    // Scoped by a tenant header instead.
    let setup = Setup {
        configure: |builder| {
            builder.scope_by(|parts: &http::request::Parts| {
                parts.headers.get("x-tenant").map(|value| value.as_bytes().to_vec())
            })
        },
        ..Setup::default()
    };
    let tenants = pair_with(Stores::new(kind), setup).await;
    let one = post(&tenants.a, "order-12").header("x-tenant", "1").send().await;
    let two = post(&tenants.b, "order-12").header("x-tenant", "2").send().await;
    let one_again = post(&tenants.b, "order-12").header("x-tenant", "1").caller(None).send().await;
    assert!(!two.replayed());
    assert!(one_again.replayed());
    assert_eq!(one_again.body, one.body);
    assert_eq!(tenants.probe.runs("order-12"), 2);
    let untenanted = post(&tenants.a, "order-12").send().await;
    assert_eq!(untenanted.status, StatusCode::BAD_REQUEST);
}

/// An answer is kept for the configured TTL only: once the store has dropped it, the key runs
/// again.
async fn answers_expire(kind: Kind) {
    let setup =
        Setup { configure: |builder| builder.ttl(Duration::from_millis(500)), ..Setup::default() };
    let pair = pair_with(Stores::new(kind), setup).await;
    let first = post(&pair.a, "order-13").send().await;
    assert_eq!(first.status, StatusCode::CREATED);
    if kind == Kind::Redis {
        let answer = RedisAnswerStore::key_of(&pair.key(ALICE, "order-13"));
        let ttl = pair.stores.server().cmd(&["PTTL", &answer]).as_int();
        // -2: gone already (a slow machine); otherwise within the TTL set.
        assert!(ttl == -2 || (ttl > 0 && ttl <= 500), "{ttl}");
    }
    // Expiry has no signal: wait for the store to say the answer is gone.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while pair.kept(ALICE, "order-13").await.is_some() {
        assert!(tokio::time::Instant::now() < deadline, "never expired");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let again = post(&pair.b, "order-13").send().await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(!again.replayed());
    assert_eq!(pair.probe.runs("order-13"), 2);
}

/// The key's lock is lost while the handler runs (an operator frees it; the watchdog's next
/// renewal says so): the handler is dropped, the request answered 503, nothing is kept, and a
/// retry runs again.
async fn a_lost_lock_keeps_nothing(kind: Kind) {
    let setup = Setup { lease: Lease::watchdog(Duration::from_millis(900)), ..Setup::default() };
    let mut pair = pair_with(Stores::new(kind), setup).await;
    let request = tokio::spawn(post(&pair.a, "order-14").header("x-hold", "1").send());
    assert_eq!(pair.entered().await, "order-14");
    assert!(pair.locks[1].force_unlock(&pair.key(ALICE, "order-14")).await);
    let lost = request.await.unwrap();
    assert_eq!(lost.status, StatusCode::SERVICE_UNAVAILABLE, "{}", lost.text());
    assert!(lost.text().contains("was lost"), "{}", lost.text());
    assert_eq!(pair.dropped().await, "order-14");
    assert!(pair.kept(ALICE, "order-14").await.is_none());
    let retried = post(&pair.b, "order-14").send().await;
    assert_eq!(retried.status, StatusCode::CREATED);
    assert_eq!(pair.probe.runs("order-14"), 2);
}

/// A paused instance: A answers, then stalls before its answer reaches the store (its put is
/// held back); meanwhile its lock is taken from it, B takes the key, runs and keeps its answer.
/// When A's put lands it is refused (a lower fencing token): B's answer stays, A's client is
/// answered 503, and every retry gets B's answer.
async fn a_late_answer_never_replaces_a_later_holders(kind: Kind) {
    let setup = Setup { pause_a: true, ..Setup::default() };
    let mut pair = pair_with(Stores::new(kind), setup).await;
    let late = tokio::spawn(post(&pair.a, "order-15").send());
    pair.pause_arrived.as_mut().unwrap().recv().await.expect("A's put arrived");
    // A believes it holds the lock; an operator (or its lease) ends that.
    assert!(pair.locks[1].force_unlock(&pair.key(ALICE, "order-15")).await);
    let newer = post(&pair.b, "order-15").send().await;
    assert_eq!(newer.status, StatusCode::CREATED, "{}", newer.text());
    assert!(newer.text().contains("\"instance\":\"b\""));
    let kept = pair.kept(ALICE, "order-15").await.expect("B's answer kept");
    pair.pause.as_ref().unwrap().resume.add_permits(1);
    let late = late.await.unwrap();
    assert_eq!(late.status, StatusCode::SERVICE_UNAVAILABLE, "{}", late.text());
    assert_eq!(pair.kept(ALICE, "order-15").await, Some(kept.clone()));
    let retried = post(&pair.a, "order-15").send().await;
    assert!(retried.replayed());
    assert_eq!(retried.body, newer.body);
    // A ran once, B once: the late answer's token is below the kept one.
    assert_eq!(pair.probe.runs("order-15"), 2);
    assert!(!late.text().contains("instance"));
}

/// A handler that runs for several leases keeps its key: the watchdog renews the lock, and
/// duplicates are still answered 409 (a `SET NX` with a fixed TTL would let them run).
async fn a_slow_handler_keeps_its_key_past_the_lease(kind: Kind) {
    let lease = Duration::from_secs(1);
    let setup = Setup { lease: Lease::watchdog(lease), ..Setup::default() };
    let mut pair = pair_with(Stores::new(kind), setup).await;
    let first = tokio::spawn(post(&pair.a, "order-20").header("x-hold", "1").send());
    assert_eq!(pair.entered().await, "order-20");
    // The point is the time: the handler outlives two and a half leases.
    tokio::time::sleep(lease * 5 / 2).await;
    let duplicate = post(&pair.b, "order-20").send().await;
    assert_eq!(duplicate.status, StatusCode::CONFLICT, "{}", duplicate.text());
    pair.probe.open(1);
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text());
    assert!(post(&pair.b, "order-20").send().await.replayed());
    assert_eq!(pair.probe.runs("order-20"), 1);
}

/// With `wait`, a duplicate of a request in progress waits for it and gets its answer.
async fn a_duplicate_can_wait_for_the_answer(kind: Kind) {
    let setup =
        Setup { configure: |builder| builder.wait(Duration::from_secs(30)), ..Setup::default() };
    let mut pair = pair_with(Stores::new(kind), setup).await;
    let first = tokio::spawn(post(&pair.a, "order-16").header("x-hold", "1").send());
    assert_eq!(pair.entered().await, "order-16");
    let duplicate = tokio::spawn(post(&pair.b, "order-16").send());
    pair.probe.open(1);
    let first = first.await.unwrap();
    let duplicate = duplicate.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(duplicate.replayed(), "{duplicate:?}");
    assert_eq!(duplicate.body, first.body);
    assert_eq!(pair.probe.runs("order-16"), 1);
}

/// Keys the layer refuses (none where one is required, empty, over 255 bytes, bytes outside
/// visible ASCII, the header twice) and a body over the limit are answered 400 (413) naming
/// the header; the handler never runs and nothing is written.
async fn bad_keys_are_refused_and_nothing_is_kept(kind: Kind) {
    let setup = Setup { configure: |builder| builder.max_request_body(64), ..Setup::default() };
    let pair = pair_with(Stores::new(kind), setup).await;
    let long = "k".repeat(256);
    let cases: Vec<(Post, &str)> = vec![
        (post(&pair.a, "x").raw_key(None), "this request needs an Idempotency-Key header\n"),
        (
            post(&pair.a, "x").raw_key(Some(HeaderValue::from_static(""))),
            "the Idempotency-Key header is empty\n",
        ),
        (
            post(&pair.a, "x").raw_key(Some(HeaderValue::from_str(&long).unwrap())),
            "the Idempotency-Key header is longer than 255 bytes\n",
        ),
        (
            post(&pair.a, "x").raw_key(Some(HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap())),
            "the Idempotency-Key header holds bytes other than visible ASCII and spaces\n",
        ),
        (
            post(&pair.a, "x").raw_key(Some(HeaderValue::from_bytes(b"a\tb").unwrap())),
            "the Idempotency-Key header holds bytes other than visible ASCII and spaces\n",
        ),
        (
            post(&pair.a, "x").header("idempotency-key", "y"),
            "the Idempotency-Key header appears more than once\n",
        ),
    ];
    for (request, text) in cases {
        let reply = request.send().await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text());
        assert_eq!(reply.text(), text);
    }
    let too_large = post(&pair.b, "order-17").body(vec![b'x'; 65]).send().await;
    assert_eq!(too_large.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(too_large.text().contains("64 bytes"));
    assert!(pair.probe.runs.lock().unwrap().is_empty(), "no handler ran");
    if kind == Kind::Redis {
        assert_eq!(pair.redis_keys(), Vec::<String>::new(), "nothing written");
    } else {
        assert!(pair.stores.memory.1.is_empty());
    }
    // A valid key within the limit runs.
    let fine = post(&pair.b, "order-17").body(vec![b'x'; 64]).send().await;
    assert_eq!(fine.status, StatusCode::CREATED);
}

// ---------------------------------------------------------------------------------------------
// Redis only.

/// The lock store restarts (without persistence) while a request holds its key: the request's
/// lock is lost (503, nothing kept), and inside the restart quarantine a retry is refused with
/// 503 and `Retry-After` rather than run a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_second_run_inside_the_restart_quarantine() {
    // At least the lease, and long enough that the retries below are sent well inside it.
    let quarantine = Duration::from_secs(6);
    let stores = Stores::with_quarantine(Kind::Redis, quarantine);
    let setup = Setup { lease: Lease::watchdog(Duration::from_secs(2)), ..Setup::default() };
    let mut pair = pair_with(stores, setup).await;
    // A fresh server is in its quarantine too: wait it out with a lock of its own.
    let Locks::Redis(locks) = &pair.locks[0] else { unreachable!() };
    let warm = locks
        .lock("warm-up")
        .wait(quarantine * 3)
        .acquire()
        .await
        .expect("granted once the first start's quarantine is over");
    warm.release().await.unwrap();
    let first = tokio::spawn(post(&pair.a, "order-18").header("x-hold", "1").send());
    assert_eq!(pair.entered().await, "order-18");
    pair.stores.server.as_mut().unwrap().restart();
    // Every retry inside the quarantine is refused; the first run's lock is lost meanwhile. A
    // retry may first meet a connection the restart broke (503 too, without a hint).
    let mut retried = post(&pair.b, "order-18").send().await;
    for _ in 0..10 {
        assert_eq!(retried.status, StatusCode::SERVICE_UNAVAILABLE, "{}", retried.text());
        if retried.text().contains("restarted") {
            break;
        }
        retried = post(&pair.b, "order-18").send().await;
    }
    assert!(retried.text().contains("restarted"), "{}", retried.text());
    let retry_after = retried.retry_after().expect("Retry-After in the quarantine");
    // The quarantine counts from the end of the second the server started in: up to a second
    // more than its length.
    assert!((1..=7).contains(&retry_after), "{retry_after}");
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE, "{}", first.text());
    assert_eq!(pair.dropped().await, "order-18");
    assert!(pair.kept(ALICE, "order-18").await.is_none());
    let again = post(&pair.a, "order-18").send().await;
    assert_eq!(again.status, StatusCode::SERVICE_UNAVAILABLE, "{}", again.text());
    assert_eq!(pair.probe.runs("order-18"), 1, "no second run inside the quarantine");
}

/// The store's script runs by hash, and by body once the server lost it (`SCRIPT FLUSH`);
/// a put carrying a lower token than the kept answer's changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_puts_are_fenced_and_survive_a_script_flush() {
    let stores = Stores::new(Kind::Redis);
    let (locks, _) = stores.instance(Lease::DEFAULT).await;
    let Locks::Redis(locks) = locks else { unreachable!() };
    let store = RedisAnswerStore::new(locks.backend().clone());
    let key = locks.lock_key(NAMESPACE, "-:fenced", tower_lock::LockKind::Exclusive).unwrap();
    let record = |token, answer: &'static str| Record {
        token,
        answer: Bytes::from_static(answer.as_bytes()),
    };
    let ttl = Duration::from_secs(60);
    let server = stores.server();
    assert_eq!(store.put(&key, record(10, "ten"), ttl).await.unwrap(), Put::Stored);
    assert_eq!(store.put(&key, record(9, "nine"), ttl).await.unwrap(), Put::Stale { kept: 10 });
    assert_eq!(store.get(&key).await.unwrap(), Some(record(10, "ten")));
    let evals = server.calls("eval");
    assert_eq!(server.cmd(&["SCRIPT", "FLUSH"]), RespValue::Simple("OK".into()));
    assert_eq!(store.put(&key, record(11, "eleven"), ttl).await.unwrap(), Put::Stored);
    assert_eq!(server.calls("eval"), evals + 1, "sent by body once");
    assert_eq!(store.put(&key, record(12, "twelve"), ttl).await.unwrap(), Put::Stored);
    assert_eq!(server.calls("eval"), evals + 1, "then by hash again");
    assert_eq!(store.get(&key).await.unwrap(), Some(record(12, "twelve")));
    let ttl = server.cmd(&["PTTL", &RedisAnswerStore::key_of(&key)]).as_int();
    assert!(ttl > 50_000 && ttl <= 60_000, "{ttl}");
}

/// Every command clients send to a server, as `MONITOR` reports them (the commands scripts
/// call are left out): each is one round trip, as none is pipelined here.
struct Monitor {
    commands: Arc<Mutex<Vec<String>>>,
    stream: std::net::TcpStream,
}

impl Monitor {
    fn start(server: &RedisServer) -> Self {
        use std::io::{BufRead, BufReader, Write};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", server.port())).unwrap();
        stream.write_all(b"MONITOR\r\n").unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut ok = String::new();
        reader.read_line(&mut ok).unwrap();
        assert_eq!(ok.trim_end(), "+OK");
        let commands = Arc::new(Mutex::new(Vec::new()));
        let seen = commands.clone();
        std::thread::spawn(move || {
            // `+<time> [<db> <client>] "<command>" ...`; a script's calls name the client `lua`.
            for line in reader.lines() {
                let Ok(line) = line else { return };
                if line.contains(" lua] ") {
                    continue;
                }
                if let Some(command) = line.split('"').nth(1) {
                    seen.lock().unwrap().push(command.to_ascii_lowercase());
                }
            }
        });
        Self { commands, stream }
    }

    /// The commands seen since the last call, but the test's own (`keys`, `info`).
    fn take(&self) -> Vec<String> {
        let mut commands = std::mem::take(&mut *self.commands.lock().unwrap());
        commands.retain(|command| !matches!(command.as_str(), "keys" | "info" | "pttl"));
        commands
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// The round trips a fresh key and a replay cost on Redis, as the server saw the commands (none
/// is pipelined, so each is one round trip): a fresh key looks for its answer, takes the lock,
/// looks again, keeps its answer and releases the lock (five, the release after the response);
/// a replay looks once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_of_a_fresh_key_and_a_replay() {
    let pair = pair(Kind::Redis).await;
    let server = pair.stores.server();
    let pair = &pair;
    let released = |key: &str| {
        let lock = pair.key(ALICE, key).as_str().to_owned();
        move || !pair.redis_keys().contains(&lock)
    };
    // The scripts are loaded once per server: a first request does it.
    assert_eq!(post(&pair.a, "warm-up").send().await.status, StatusCode::CREATED);
    support::eventually(Duration::from_secs(10), "released", released("warm-up")).await;
    let monitor = Monitor::start(server);
    let fresh = post(&pair.a, "order-19").send().await;
    assert_eq!(fresh.status, StatusCode::CREATED);
    support::eventually(Duration::from_secs(10), "released", released("order-19")).await;
    // MONITOR reports a command before its reply: the reply was read, so was the line.
    support::eventually(Duration::from_secs(10), "monitored", || {
        monitor.commands.lock().unwrap().len() >= 5
    })
    .await;
    let fresh_commands = monitor.take();
    let replay = post(&pair.b, "order-19").send().await;
    assert!(replay.replayed());
    support::eventually(Duration::from_secs(10), "monitored", || {
        !monitor.commands.lock().unwrap().is_empty()
    })
    .await;
    let replay_commands = monitor.take();
    println!(
        "round trips: fresh key {} {fresh_commands:?}, replay {} {replay_commands:?}",
        fresh_commands.len(),
        replay_commands.len()
    );
    // Look, acquire, look again, keep, release.
    assert_eq!(fresh_commands, ["hmget", "evalsha", "hmget", "evalsha", "evalsha"]);
    assert_eq!(replay_commands, ["hmget"]);
}

// ---------------------------------------------------------------------------------------------
// gRPC.

mod grpc {
    use super::*;
    use bank::{Account, Balance, BalanceStream, Bank, BankClient, BankServer, Change};
    use tonic::{Code, Request, Status};
    use tower::ServiceBuilder;

    /// A bank whose `Withdraw` counts its runs per key and waits at the gate for amount 0.
    #[derive(Clone)]
    struct CountingBank {
        probe: Probe,
        withdrawals: Arc<Mutex<i64>>,
    }

    impl Bank for CountingBank {
        async fn withdraw(
            &self,
            request: Request<Change>,
        ) -> Result<tonic::Response<Balance>, Status> {
            let context = request
                .extensions()
                .get::<IdempotencyContext>()
                .cloned()
                .ok_or_else(|| Status::internal("no idempotency context"))?;
            let key = context.key().to_owned();
            *self.probe.runs.lock().unwrap().entry(key.clone()).or_insert(0) += 1;
            let _ = self.probe.entered.send(key);
            let change = request.into_inner();
            if change.amount == 0 {
                self.probe.gate.acquire().await.expect("open").forget();
            }
            let balance = {
                let mut withdrawals = self.withdrawals.lock().unwrap();
                *withdrawals += 1;
                1000 * *withdrawals + change.amount
            };
            Ok(tonic::Response::new(Balance { account: change.account, balance }))
        }

        async fn deposit(
            &self,
            _request: Request<Change>,
        ) -> Result<tonic::Response<Balance>, Status> {
            Err(Status::unimplemented("not here"))
        }

        async fn statement(
            &self,
            _request: Request<Account>,
        ) -> Result<tonic::Response<BalanceStream>, Status> {
            Err(Status::unimplemented("not here"))
        }
    }

    /// Serves the bank behind `layer` on a free port (tonic's server, HTTP/2); a client of it.
    async fn serve_bank(layer: IdempotencyLayer, bank: CountingBank) -> BankClient {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        // Tonic's routes take its own body type: the layer's request body is mapped to it.
        let stack = ServiceBuilder::new().layer(layer).map_request(
            |request: http::Request<RequestBody<tonic::body::Body>>| {
                request.map(tonic::body::Body::new)
            },
        );
        let server =
            tonic::transport::Server::builder().layer(stack).add_service(BankServer::new(bank));
        tokio::spawn(async move { server.serve_with_incoming(incoming).await.unwrap() });
        BankClient::connect(url).await.unwrap()
    }

    fn withdraw(key: Option<&str>, amount: i64) -> Request<Change> {
        let mut request = Request::new(Change { account: "7".into(), amount });
        if let Some(key) = key {
            request.metadata_mut().insert("idempotency-key", key.parse().unwrap());
        }
        request.metadata_mut().insert("authorization", ALICE.parse().unwrap());
        request
    }

    /// A unary call runs once per key across two tonic instances; its reply (message and
    /// trailers) is replayed to the retry; a duplicate in flight is `ABORTED` with a pushback;
    /// the key with another message is `FAILED_PRECONDITION`; a call without the required key
    /// is `INVALID_ARGUMENT`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unary_replay_over_http2() {
        let stores = Stores::new(Kind::Redis);
        let (probe, mut signals) = probe();
        let bank = CountingBank { probe: probe.clone(), withdrawals: Arc::default() };
        let mut clients = Vec::new();
        for _ in 0..2 {
            let (locks, stored) = stores.instance(Lease::DEFAULT).await;
            let store = Store { inner: stored, pause: None };
            let layer = locks.builder(store).required(true).build().unwrap();
            clients.push(serve_bank(layer, bank.clone()).await);
        }
        let (mut a, mut b) = (clients[0].clone(), clients[1].clone());

        let first = a.withdraw(withdraw(Some("grpc-1"), 5)).await.expect("the first call");
        assert!(first.metadata().get("idempotent-replayed").is_none());
        let again = b.withdraw(withdraw(Some("grpc-1"), 5)).await.expect("the replay");
        assert_eq!(again.metadata().get("idempotent-replayed").unwrap(), "true");
        assert_eq!(again.get_ref(), first.get_ref());
        assert_eq!(first.get_ref().balance, 1005);
        assert_eq!(probe.runs("grpc-1"), 1);

        let other = b.withdraw(withdraw(Some("grpc-1"), 6)).await.unwrap_err();
        assert_eq!(other.code(), Code::FailedPrecondition, "{other:?}");
        let missing = a.withdraw(withdraw(None, 5)).await.unwrap_err();
        assert_eq!(missing.code(), Code::InvalidArgument, "{missing:?}");
        assert!(
            missing.message().contains("idempotency-key")
                || missing.message().contains("Idempotency-Key")
        );

        let held = tokio::spawn({
            let mut a = a.clone();
            async move { a.withdraw(withdraw(Some("grpc-2"), 0)).await }
        });
        assert_eq!(signals.entered.recv().await.unwrap(), "grpc-1");
        assert_eq!(signals.entered.recv().await.unwrap(), "grpc-2");
        let busy = b.withdraw(withdraw(Some("grpc-2"), 0)).await.unwrap_err();
        assert_eq!(busy.code(), Code::Aborted, "{busy:?}");
        let pushback: u64 = busy
            .metadata()
            .get("grpc-retry-pushback-ms")
            .expect("a pushback")
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(pushback >= 100, "{pushback}");
        probe.open(1);
        let held = held.await.unwrap().expect("the held call");
        let replayed = b.withdraw(withdraw(Some("grpc-2"), 0)).await.unwrap();
        assert_eq!(replayed.get_ref(), held.get_ref());
        assert_eq!(probe.runs("grpc-2"), 1);
    }
}
