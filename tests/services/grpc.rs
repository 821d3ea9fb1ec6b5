//! `LockLayer` in front of a tonic gRPC service, over real HTTP/2 with a real tonic client:
//! each rejection as a gRPC status with its message and pushback, keys from metadata shared
//! with HTTP routes and `#[locked]` handlers, the lock taken in a service method from the
//! decoded message, and a server stream that holds its lock until it ends.

use crate::support;

#[path = "../../examples/common/bank.rs"]
mod bank;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{Router, extract::Path, routing::post};
use bank::{Account, Balance, BalanceStream, Bank, BankClient, BankServer, Change, with_metadata};
use http::StatusCode;
use support::{
    RedisServer,
    http::{http, send, serve},
};
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::{StreamExt as _, wrappers::ReceiverStream};
use tonic::{Code, Request, Response, Status};
use tower::Layer;
use tower_lock::{
    AnyLockClient, Backend, Lease, LockClient, LockError, LockKind, LockLayer, MemoryBackend,
    RedisBackend, grpc::GrpcRejection, key, locked,
};

/// A bank whose calls the test steers: `Withdraw` with amount 0 waits for a permit of `gate`
/// (so the call holds its lock as long as the test wants), `Statement` streams what the test
/// feeds it, `Deposit` takes its lock itself, from the decoded message.
#[derive(Clone)]
struct TestBank<B: Backend> {
    balances: Arc<Mutex<HashMap<String, i64>>>,
    /// Each call that runs says so here, with its account.
    entered: mpsc::UnboundedSender<String>,
    gate: Arc<Semaphore>,
    feed: Arc<Mutex<Option<mpsc::Receiver<Balance>>>>,
    /// For `Deposit`, which takes `account:<id>` in the method.
    locks: LockClient<B>,
}

impl<B: Backend> Bank for TestBank<B> {
    async fn withdraw(&self, request: Request<Change>) -> Result<Response<Balance>, Status> {
        let change = request.into_inner();
        let _ = self.entered.send(change.account.clone());
        if change.amount == 0 {
            let _permit = self.gate.acquire().await.expect("gate open");
        }
        Ok(Response::new(self.change(&change.account, -change.amount)))
    }

    async fn deposit(&self, request: Request<Change>) -> Result<Response<Balance>, Status> {
        let change = request.into_inner();
        // The message form of a key: the lock the layer takes for this account, taken here;
        // `?` answers as the layer would.
        let guard = self
            .locks
            .lock(format!("account:{}", change.account))
            .wait(Duration::from_millis(100))
            .acquire()
            .await?;
        let _ = self.entered.send(change.account.clone());
        let balance = self.change(&change.account, change.amount);
        guard.release().await?;
        Ok(Response::new(balance))
    }

    async fn statement(
        &self,
        request: Request<Account>,
    ) -> Result<Response<BalanceStream>, Status> {
        let _ = self.entered.send(request.into_inner().account);
        let feed = self.feed.lock().unwrap().take().expect("one statement per feed");
        let stream: BalanceStream = Box::pin(ReceiverStream::new(feed).map(Ok));
        Ok(Response::new(stream))
    }
}

impl<B: Backend> TestBank<B> {
    fn change(&self, account: &str, by: i64) -> Balance {
        let mut balances = self.balances.lock().unwrap();
        let balance = balances.entry(account.to_owned()).or_insert(0);
        *balance += by;
        Balance { account: account.to_owned(), balance: *balance }
    }
}

/// What a test holds of its bank: the signals it steers it with.
struct Steer {
    entered: mpsc::UnboundedReceiver<String>,
    gate: Arc<Semaphore>,
    feed: mpsc::Sender<Balance>,
}

fn test_bank<B: Backend>(locks: &LockClient<B>) -> (TestBank<B>, Steer) {
    let (entered, entered_rx) = mpsc::unbounded_channel();
    let (feed, feed_rx) = mpsc::channel(16);
    let gate = Arc::new(Semaphore::new(0));
    let bank = TestBank {
        balances: Arc::default(),
        entered,
        gate: gate.clone(),
        feed: Arc::new(Mutex::new(Some(feed_rx))),
        locks: locks.clone(),
    };
    let steer = Steer { entered: entered_rx, gate, feed };
    (bank, steer)
}

/// Serves `service` (a layered `BankServer`) with tonic on a free loopback port; returns a
/// client of it.
async fn serve_grpc<S>(service: S) -> BankClient
where
    S: tower::Service<http::Request<tonic::body::Body>, Error = std::convert::Infallible>
        + tonic::server::NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Response: axum::response::IntoResponse,
    S::Future: Send + 'static,
{
    serve_grpc_with(tower::layer::util::Identity::new(), service).await
}

/// As [`serve_grpc`], with `outer` around the whole server.
async fn serve_grpc_with<L, S>(outer: L, service: S) -> BankClient
where
    L: Layer<tonic::service::Routes> + Clone + Send + 'static,
    L::Service: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
        > + Clone
        + Send
        + 'static,
    <L::Service as tower::Service<http::Request<tonic::body::Body>>>::Future: Send,
    <L::Service as tower::Service<http::Request<tonic::body::Body>>>::Error:
        Into<Box<dyn std::error::Error + Send + Sync>> + Send,
    S: tower::Service<http::Request<tonic::body::Body>, Error = std::convert::Infallible>
        + tonic::server::NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Response: axum::response::IntoResponse,
    S::Future: Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let server = tonic::transport::Server::builder().layer(outer).add_service(service);
    tokio::spawn(async move { server.serve_with_incoming(incoming).await.unwrap() });
    BankClient::connect(url).await.unwrap()
}

/// The layer of most tests: one lock per account, named `account:<id>` from the `account-id`
/// metadata, rejections as gRPC statuses.
fn account_layer<B: Backend>(
    locks: &LockClient<B>,
    wait: Duration,
) -> LockLayer<B, key::Prefixed<key::Header>, GrpcRejection> {
    LockLayer::new(locks.clone())
        .key(key::header("account-id").prefixed("account:"))
        .wait(wait)
        .on_rejected(GrpcRejection)
}

fn withdraw(account: &str, amount: i64) -> Request<Change> {
    let change = Change { account: account.to_owned(), amount };
    with_metadata(change, "account-id", account)
}

/// The status's pushback, in milliseconds.
fn pushback(status: &Status) -> Option<u64> {
    let value = status.metadata().get("grpc-retry-pushback-ms")?;
    Some(value.to_str().unwrap().parse().expect("a number of milliseconds"))
}

async fn redis_locks(server: &RedisServer, lease: Lease) -> LockClient<RedisBackend> {
    let backend = support::redis_backend(server.url()).connect().await.unwrap();
    LockClient::builder(backend).lease(lease).build().unwrap()
}

/// A call that waits in vain is `UNAVAILABLE` (retryable), its message says so with the
/// pushback's number, and its pushback, on a client with no hold seen yet, is the 100 ms it
/// waited, not the holder's 30 s lease.
#[tokio::test]
async fn busy_lock_is_unavailable_with_pushback() {
    const WAIT: Duration = Duration::from_millis(100);
    let locks = LockClient::in_memory();
    let (bank, _steer) = test_bank(&locks);
    let mut client = serve_grpc(account_layer(&locks, WAIT).layer(BankServer::new(bank))).await;
    let held = locks.lock("account:7").acquire().await.unwrap();

    let started = Instant::now();
    let status = client.withdraw(withdraw("7", 5)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(started.elapsed() >= WAIT);
    let pushback = pushback(&status).expect("a pushback");
    assert!(
        (100..=5_000).contains(&pushback),
        "pushback {pushback} ms: at least the 100 ms waited, not the 30 s lease"
    );
    assert_eq!(status.message(), format!("locked; retry in about {pushback} ms"));

    held.release().await.unwrap();
    let balance = client.withdraw(withdraw("7", 5)).await.unwrap().into_inner();
    assert_eq!(balance.balance, -5);
}

/// A call without the key's metadata, or with a key the client refuses, is
/// `INVALID_ARGUMENT`, with no pushback: trying again will not help.
#[tokio::test]
async fn missing_or_invalid_key_is_invalid_argument() {
    let locks = LockClient::builder(MemoryBackend::new()).max_key_len(32).build().unwrap();
    let (bank, _steer) = test_bank(&locks);
    let mut client =
        serve_grpc(account_layer(&locks, Duration::ZERO).layer(BankServer::new(bank))).await;

    let no_key = Request::new(Change { account: "7".into(), amount: 1 });
    let status = client.withdraw(no_key).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(status.message(), "request has no lock key");
    assert_eq!(pushback(&status), None);

    let status = client.withdraw(withdraw(&"9".repeat(100), 1)).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().starts_with("invalid lock key: "), "{}", status.message());
    assert_eq!(pushback(&status), None);
}

/// Past the cap of waiters per key, a call is `RESOURCE_EXHAUSTED` (as tonic answers an
/// overloaded service) with a pushback of one second.
#[tokio::test]
async fn too_many_waiters_is_resource_exhausted() {
    let locks = LockClient::builder(MemoryBackend::new()).max_waiters_per_key(1).build().unwrap();
    let (bank, _steer) = test_bank(&locks);
    let client =
        serve_grpc(account_layer(&locks, Duration::from_secs(30)).layer(BankServer::new(bank)))
            .await;
    let held = locks.lock("account:7").acquire().await.unwrap();

    let waiter = tokio::spawn({
        let mut client = client.clone();
        async move { client.withdraw(withdraw("7", 1)).await }
    });
    support::eventually(Duration::from_secs(5), "the first call waits", || locks.waiters() == 1)
        .await;
    let status = client.clone().withdraw(withdraw("7", 1)).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(
        status.message(),
        "too many requests wait for this resource; retry in about 1000 ms"
    );
    assert_eq!(pushback(&status), Some(1000));

    held.release().await.unwrap();
    assert_eq!(waiter.await.unwrap().unwrap().into_inner().balance, -1);
}

/// With the store down, a call is `UNAVAILABLE` at once, with the pushback of the store's
/// next probe (within a second).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_down_is_unavailable() {
    let mut server = RedisServer::start();
    let locks = redis_locks(&server, Lease::default()).await;
    let (bank, _steer) = test_bank(&locks);
    let mut client =
        serve_grpc(account_layer(&locks, Duration::from_secs(20)).layer(BankServer::new(bank)))
            .await;
    client.withdraw(withdraw("7", 1)).await.unwrap();

    tokio::task::block_in_place(|| server.kill());
    let started = Instant::now();
    let status = client.withdraw(withdraw("7", 1)).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5), "answered at once");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    let pushback = pushback(&status).expect("the next probe");
    assert!((10..=1000).contains(&pushback), "pushback {pushback} ms");
    assert_eq!(status.message(), format!("lock backend unavailable; retry in about {pushback} ms"));
}

/// A lock lost while the call runs (deleted in the store) cuts the call short with `ABORTED`
/// (and a pushback of a second, as the HTTP answer's 503 has a `Retry-After`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_lock_is_aborted() {
    let server = RedisServer::start();
    let locks = redis_locks(&server, Lease::watchdog(Duration::from_millis(600))).await;
    let (bank, mut steer) = test_bank(&locks);
    let mut client =
        serve_grpc(account_layer(&locks, Duration::ZERO).layer(BankServer::new(bank))).await;

    let call = tokio::spawn(async move { client.withdraw(withdraw("7", 0)).await });
    steer.entered.recv().await.unwrap();
    let name = locks.lock_key("", "account:7", LockKind::Exclusive).unwrap();
    assert_eq!(server.cmd(&["DEL", name.as_str()]).as_int(), 1);
    let status = call.await.unwrap().unwrap_err();
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert_eq!(status.message(), "lock lost while the request ran; retry in about 1000 ms");
    assert_eq!(pushback(&status), Some(1000));
}

/// A call whose holder holds the read side of the lock it asks to write is
/// `FAILED_PRECONDITION`: waiting would deadlock, and trying again will not help.
#[tokio::test]
async fn conflict_is_failed_precondition() {
    let locks = LockClient::in_memory();
    let holder = locks.holder();
    let read = locks.read_write_lock("account:7").read().holder(&holder).acquire().await.unwrap();
    let (bank, _steer) = test_bank(&locks);
    // The call runs as the holder of the read lock (as a nested layer's would).
    let as_reader = tower::layer::layer_fn(move |inner| {
        let holder = holder.clone();
        tower::util::MapRequest::new(inner, move |mut request: http::Request<tonic::body::Body>| {
            request.extensions_mut().insert(holder.clone());
            request
        })
    });
    let layer = account_layer(&locks, Duration::from_secs(5)).read_write();
    let mut client = serve_grpc_with(as_reader, layer.layer(BankServer::new(bank))).await;

    let status = client.withdraw(withdraw("7", 1)).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert_eq!(status.message(), "lock request would deadlock");
    read.release().await.unwrap();
}

/// A layer whose settings cannot work (permits with fencing) is `INTERNAL`; a client that was
/// shut down is `UNAVAILABLE` (another instance can take the call).
#[tokio::test]
async fn misconfigured_is_internal_and_shut_down_is_unavailable() {
    let locks = LockClient::in_memory();
    let (bank, _steer) = test_bank(&locks);
    let misconfigured = account_layer(&locks, Duration::ZERO).permits(2).fencing();
    let mut client = serve_grpc(misconfigured.layer(BankServer::new(bank))).await;
    let status = client.withdraw(withdraw("7", 1)).await.unwrap_err();
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert_eq!(status.message(), "lock layer misconfigured");

    let (bank, _steer) = test_bank(&locks);
    let mut client =
        serve_grpc(account_layer(&locks, Duration::ZERO).layer(BankServer::new(bank))).await;
    locks.shutdown().await;
    let status = client.withdraw(withdraw("7", 1)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(status.message(), "lock client shut down; retry in about 1000 ms");
    assert_eq!(pushback(&status), Some(1000));
}

/// A method that takes its lock from the decoded message answers with `?` as the layer does:
/// `UNAVAILABLE`, the same message and a pushback.
#[tokio::test]
async fn a_lock_taken_in_the_method_answers_as_the_layer() {
    let locks = LockClient::in_memory();
    let (bank, mut steer) = test_bank(&locks);
    // No layer: `Deposit` locks `account:<id>` itself.
    let mut client = serve_grpc(BankServer::new(bank)).await;
    let deposit = |account: &str| Change { account: account.to_owned(), amount: 3 };
    assert_eq!(client.deposit(deposit("7")).await.unwrap().into_inner().balance, 3);
    assert_eq!(steer.entered.recv().await.as_deref(), Some("7"));

    let held = locks.lock("account:7").acquire().await.unwrap();
    let status = client.deposit(deposit("7")).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    let waited = pushback(&status).expect("a pushback");
    // The client's hold times, as a layer's answer would use: the deposit above held the lock
    // for a moment, so the hint is the 100 ms this call waited, not the 30 s lease.
    assert!((100..=5_000).contains(&waited), "the 100 ms waited: {waited}");
    assert_eq!(status.message(), format!("locked; retry in about {waited} ms"));
    held.release().await.unwrap();

    // The conversion itself, for every outcome, is the layer's.
    let status = Status::from(LockError::TooManyWaiters);
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(pushback(&status), Some(1000));
    assert_eq!(Status::from(LockError::Lost).code(), Code::Aborted);
    assert_eq!(Status::from(LockError::UpgradeRefused).code(), Code::FailedPrecondition);
}

/// `#[locked(key = "account:{id}")]` on an HTTP route, for the test below.
#[locked(key = "account:{id}", wait = "0s")]
async fn http_withdraw(Path(id): Path<String>) -> String {
    format!("withdrew from {id}")
}

/// The same key prefix names the same lock across gRPC and HTTP: while a gRPC call holds
/// `account:7` (from its metadata), an HTTP route's layer (`path_param("id").prefixed(..)`),
/// a `#[locked]` handler and `LockClient::lock` find it busy, and a gRPC call finds busy the
/// lock an HTTP request holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_and_http_routes_share_a_lock() {
    let server = RedisServer::start();
    // Two instances: the gRPC service on one client, the HTTP routes on another.
    let grpc_locks = redis_locks(&server, Lease::default()).await;
    let http_locks = redis_locks(&server, Lease::default()).await;
    let (bank, mut steer) = test_bank(&grpc_locks);
    let mut client =
        serve_grpc(account_layer(&grpc_locks, Duration::ZERO).layer(BankServer::new(bank))).await;

    let (entered_tx, mut entered) = mpsc::unbounded_channel::<()>();
    let gate = Arc::new(Semaphore::new(0));
    let http_gate = gate.clone();
    let app = Router::new()
        .route(
            "/accounts/{id}/withdraw",
            post(move |Path(id): Path<String>| {
                let (entered, gate) = (entered_tx.clone(), http_gate.clone());
                async move {
                    let _ = entered.send(());
                    let _permit = gate.acquire().await.unwrap();
                    id
                }
            }),
        )
        .route_layer(
            LockLayer::new(http_locks.clone())
                .key(key::path_param("id").prefixed("account:"))
                .wait(Duration::ZERO),
        )
        .route("/locked/{id}/withdraw", post(http_withdraw))
        .layer(axum::Extension(AnyLockClient::from(http_locks.clone())));
    let base = serve(app).await;

    // A gRPC call holds account 7.
    let call = tokio::spawn({
        let mut client = client.clone();
        async move { client.withdraw(withdraw("7", 0)).await }
    });
    steer.entered.recv().await.unwrap();
    let (status, _, body) = send(&http(), "POST", &format!("{base}/accounts/7/withdraw")).await;
    assert_eq!(status, StatusCode::LOCKED, "{body}");
    let (status, _, body) = send(&http(), "POST", &format!("{base}/locked/7/withdraw")).await;
    assert_eq!(status, StatusCode::LOCKED, "{body}");
    assert!(matches!(
        http_locks.lock("account:7").try_acquire().await,
        Err(LockError::WaitTimeout { .. })
    ));
    // Another account is free.
    let (status, _, body) = send(&http(), "POST", &format!("{base}/locked/8/withdraw")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    steer.gate.add_permits(1);
    call.await.unwrap().unwrap();

    // An HTTP request holds account 7: the gRPC call is refused.
    let request = tokio::spawn({
        let url = format!("{base}/accounts/7/withdraw");
        async move { send(&http(), "POST", &url).await }
    });
    entered.recv().await.unwrap();
    let status = client.withdraw(withdraw("7", 1)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    gate.add_permits(1);
    assert_eq!(request.await.unwrap().0, StatusCode::OK);
    client.withdraw(withdraw("7", 1)).await.unwrap();
}

/// The key of a statement: the account in its metadata.
fn statement(account: &str) -> Request<Account> {
    with_metadata(Account { account: account.to_owned() }, "account-id", account)
}

fn balance(n: i64) -> Balance {
    Balance { account: "7".into(), balance: n }
}

async fn is_free<B: Backend>(locks: &LockClient<B>) -> bool {
    match locks.lock("account:7").try_acquire().await {
        Ok(guard) => {
            guard.release().await.unwrap();
            true
        }
        Err(LockError::WaitTimeout { .. }) => false,
        Err(other) => panic!("{other}"),
    }
}

/// With `hold_until_body_ends`, a server stream holds its lock while it streams and releases
/// it before its end reaches the client: a call made once the client has seen the end finds
/// the lock free.
#[tokio::test]
async fn a_stream_holds_its_lock_until_it_ends() {
    let locks = LockClient::in_memory();
    let (bank, steer) = test_bank(&locks);
    let layer = account_layer(&locks, Duration::ZERO).hold_until_body_ends();
    let mut client = serve_grpc(layer.layer(BankServer::new(bank))).await;

    let mut stream = client.statement(statement("7")).await.unwrap().into_inner();
    steer.feed.send(balance(1)).await.unwrap();
    assert_eq!(stream.message().await.unwrap(), Some(balance(1)));
    assert!(!is_free(&locks).await, "held while the stream is open");
    let status = client.withdraw(withdraw("7", 1)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    steer.feed.send(balance(2)).await.unwrap();
    assert_eq!(stream.message().await.unwrap(), Some(balance(2)));
    assert!(!is_free(&locks).await, "held while the stream is open");

    drop(steer.feed);
    assert_eq!(stream.message().await.unwrap(), None);
    assert!(is_free(&locks).await, "released before the end reached the client");
}

/// A client that drops its stream (goes away) releases the stream's lock.
#[tokio::test]
async fn dropping_the_stream_releases_its_lock() {
    let locks = LockClient::in_memory();
    let (bank, steer) = test_bank(&locks);
    let layer = account_layer(&locks, Duration::ZERO).hold_until_body_ends();
    let mut client = serve_grpc(layer.layer(BankServer::new(bank))).await;

    let mut stream = client.statement(statement("7")).await.unwrap().into_inner();
    steer.feed.send(balance(1)).await.unwrap();
    assert_eq!(stream.message().await.unwrap(), Some(balance(1)));
    assert!(!is_free(&locks).await);
    drop(stream);
    // Released when the server sees the stream reset: waited for, not polled.
    let guard = locks
        .lock("account:7")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("released after the client went away");
    guard.release().await.unwrap();
    // The server stopped feeding: its receiver is gone with the body.
    steer.feed.closed().await;
}

/// Without the option, the lock covers the call that opened the stream, not the stream.
#[tokio::test]
async fn without_the_option_a_stream_does_not_hold_the_lock() {
    let locks = LockClient::in_memory();
    let (bank, steer) = test_bank(&locks);
    let mut client =
        serve_grpc(account_layer(&locks, Duration::ZERO).layer(BankServer::new(bank))).await;

    let mut stream = client.statement(statement("7")).await.unwrap().into_inner();
    steer.feed.send(balance(1)).await.unwrap();
    assert_eq!(stream.message().await.unwrap(), Some(balance(1)));
    assert!(is_free(&locks).await, "released when the method returned its stream");
}

/// The watchdog renews a stream's lock past several leases, and a lock lost while the
/// stream runs ends it with `ABORTED` trailers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_stream_is_renewed_and_a_lost_one_is_aborted() {
    const LEASE: Duration = Duration::from_millis(300);
    let server = RedisServer::start();
    let locks = redis_locks(&server, Lease::watchdog(LEASE)).await;
    let other = redis_locks(&server, Lease::watchdog(LEASE)).await;
    let (bank, steer) = test_bank(&locks);
    let layer = account_layer(&locks, Duration::ZERO).hold_until_body_ends();
    let mut client = serve_grpc(layer.layer(BankServer::new(bank))).await;

    let mut stream = client.statement(statement("7")).await.unwrap().into_inner();
    steer.feed.send(balance(1)).await.unwrap();
    assert_eq!(stream.message().await.unwrap(), Some(balance(1)));
    // Time passing is what is tested: four leases, over which only renewals keep the lock.
    tokio::time::sleep(LEASE * 4).await;
    assert!(!is_free(&other).await, "renewed while the stream is open");
    steer.feed.send(balance(2)).await.unwrap();
    assert_eq!(stream.message().await.unwrap(), Some(balance(2)));

    let name = locks.lock_key("", "account:7", LockKind::Exclusive).unwrap();
    assert_eq!(server.cmd(&["DEL", name.as_str()]).as_int(), 1);
    let status = stream.message().await.unwrap_err();
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert_eq!(status.message(), "lock lost while the request ran; retry in about 1000 ms");
}

/// An HTTP body holds its lock the same way: a streamed response keeps the lock until its
/// last chunk, and releases it before the client sees the end.
#[tokio::test]
async fn an_http_body_holds_its_lock_until_it_ends() {
    use http_body_util::BodyExt;

    let locks = LockClient::in_memory();
    let (chunks_tx, chunks_rx) = mpsc::channel::<&'static str>(4);
    let chunks = Arc::new(Mutex::new(Some(chunks_rx)));
    let app = Router::new()
        .route(
            "/export/{id}",
            post(move || {
                let chunks = chunks.lock().unwrap().take().expect("one export");
                async move {
                    let stream = ReceiverStream::new(chunks)
                        .map(|chunk| Ok::<_, std::convert::Infallible>(chunk.to_owned()));
                    axum::body::Body::from_stream(stream)
                }
            }),
        )
        .route_layer(
            LockLayer::new(locks.clone())
                .key(key::path_param("id").prefixed("account:"))
                .hold_until_body_ends(),
        );
    let base = serve(app).await;
    let request =
        http::Request::post(format!("{base}/export/7")).body(http_body_util::Empty::new()).unwrap();
    let response = http().request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    chunks_tx.send("first").await.unwrap();
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "first");
    assert!(!is_free(&locks).await, "held while the body streams");
    drop(chunks_tx);
    while body.frame().await.is_some() {}
    assert!(is_free(&locks).await, "released before the end reached the client");
}

/// The end of a stream (its status trailers) is sent only once the release is done: with the
/// store frozen, the client does not see the end; once it runs again, the end arrives and the
/// lock is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_end_of_a_stream_waits_for_its_release() {
    // Well under the store's 1 s command timeout, past which the release would give up.
    const FROZEN: Duration = Duration::from_millis(300);
    let server = RedisServer::start();
    let locks = redis_locks(&server, Lease::default()).await;
    let other = redis_locks(&server, Lease::default()).await;
    let (bank, steer) = test_bank(&locks);
    let layer = account_layer(&locks, Duration::ZERO).hold_until_body_ends();
    let mut client = serve_grpc(layer.layer(BankServer::new(bank))).await;

    let mut stream = client.statement(statement("7")).await.unwrap().into_inner();
    steer.feed.send(balance(1)).await.unwrap();
    assert_eq!(stream.message().await.unwrap(), Some(balance(1)));
    tokio::task::block_in_place(|| server.pause());
    drop(steer.feed);
    let early = tokio::time::timeout(FROZEN, stream.message()).await;
    tokio::task::block_in_place(|| server.resume());
    assert!(early.is_err(), "the end arrived before the release: {early:?}");
    assert_eq!(stream.message().await.unwrap(), None);
    assert!(is_free(&other).await, "released before the end reached the client");
}

/// A layer with no rejection hook set answers a gRPC call in gRPC form anyway: a busy lock is
/// `UNAVAILABLE` with a pushback, a missing key `INVALID_ARGUMENT` (not `UNKNOWN` or
/// `INTERNAL` read from an HTTP 423 or 400), and an HTTP route beside it keeps its 423.
#[tokio::test]
async fn grpc_calls_get_grpc_answers_without_grpc_rejection() {
    let locks = LockClient::in_memory();
    let (bank, mut steer) = test_bank(&locks);
    let layer = LockLayer::new(locks.clone())
        .key(key::header("account-id").prefixed("account:"))
        .wait(Duration::from_millis(50));
    let mut client = serve_grpc(layer.layer(BankServer::new(bank))).await;

    let held = locks.lock("account:7").acquire().await.unwrap();
    let status = client.withdraw(withdraw("7", 1)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    let pushback = pushback(&status).expect("a pushback");
    assert_eq!(status.message(), format!("locked; retry in about {pushback} ms"));
    held.release().await.unwrap();

    let no_key = Request::new(Change { account: "7".into(), amount: 1 });
    let status = client.withdraw(no_key).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(steer.entered.try_recv().is_err(), "the method never ran");

    let app = Router::new().route("/accounts/{id}", post(|| async { "ok" })).route_layer(
        LockLayer::new(locks.clone())
            .key(key::path_param("id").prefixed("account:"))
            .wait(Duration::ZERO),
    );
    let base = serve(app).await;
    let held = locks.lock("account:7").acquire().await.unwrap();
    let (status, retry, _) = send(&http(), "POST", &format!("{base}/accounts/7")).await;
    assert_eq!(status, StatusCode::LOCKED);
    assert!(retry.is_some());
    held.release().await.unwrap();
}

/// `MethodLocks`: `Withdraw` locked from its metadata (a call without it is
/// `INVALID_ARGUMENT` and never runs), `Statement` holding its lock until its stream ends,
/// `Deposit` left to lock itself from the message, through the client, answering with `?` the
/// same pushback a layer would; over real HTTP/2 with a tonic client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_rule_per_method() {
    let locks = LockClient::in_memory();
    let (bank, mut steer) = test_bank(&locks);
    let account = || key::header("account-id").prefixed("account:");
    let layer = tower_lock::grpc::MethodLocks::new()
        .method(
            "Withdraw",
            LockLayer::new(locks.clone()).key(account()).wait(Duration::from_millis(100)),
        )
        .method(
            "/bank.Bank/Statement",
            LockLayer::new(locks.clone())
                .key(account())
                .wait(Duration::ZERO)
                .hold_until_body_ends(),
        )
        .unlocked("Deposit");
    let mut client = serve_grpc(layer.layer(BankServer::new(bank))).await;

    // Each method runs as its rule says.
    assert_eq!(client.withdraw(withdraw("7", 2)).await.unwrap().into_inner().balance, -2);
    assert_eq!(steer.entered.recv().await.as_deref(), Some("7"));
    let deposit = Change { account: "7".into(), amount: 5 };
    assert_eq!(
        client.deposit(deposit.clone()).await.unwrap().into_inner().balance,
        3,
        "no metadata needed: the method takes its lock from the message"
    );
    assert_eq!(steer.entered.recv().await.as_deref(), Some("7"));

    // A rule's call without its key is refused, never run unlocked.
    let no_key = Request::new(Change { account: "7".into(), amount: 1 });
    let status = client.withdraw(no_key).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(status.message(), "request has no lock key");
    assert!(steer.entered.try_recv().is_err(), "the method never ran");

    // Busy: the layer's rule and the method's own lock answer alike.
    let held = locks.lock("account:7").acquire().await.unwrap();
    for status in [
        client.withdraw(withdraw("7", 1)).await.unwrap_err(),
        client.deposit(deposit.clone()).await.unwrap_err(),
    ] {
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        let pushback = pushback(&status).expect("a pushback");
        assert!((100..=5_000).contains(&pushback), "{pushback} ms");
        assert_eq!(status.message(), format!("locked; retry in about {pushback} ms"));
    }
    held.release().await.unwrap();

    // The stream holds its account's lock until it ends.
    let mut stream = client.statement(statement("7")).await.unwrap().into_inner();
    steer.feed.send(balance(1)).await.unwrap();
    assert_eq!(stream.message().await.unwrap(), Some(balance(1)));
    assert!(!is_free(&locks).await, "held while the stream is open");
    let status = client.withdraw(withdraw("7", 1)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    drop(steer.feed);
    assert_eq!(stream.message().await.unwrap(), None);
    assert!(is_free(&locks).await, "released with the stream's end");
}

/// Serves `service` with tonic on a free loopback port; returns its URL.
#[cfg(feature = "retry")]
async fn grpc_url<S>(service: S) -> String
where
    S: tower::Service<http::Request<tonic::body::Body>, Error = std::convert::Infallible>
        + tonic::server::NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Response: axum::response::IntoResponse,
    S::Future: Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let server = tonic::transport::Server::builder().add_service(service);
    tokio::spawn(async move { server.serve_with_incoming(incoming).await.unwrap() });
    url
}

/// A tonic client whose `Channel` sits under `RetryAfterPolicy` (with `BufferRequestLayer`, so
/// a call can be sent again) waits out a busy lock: its first attempt is answered
/// `UNAVAILABLE` with a pushback, the lock is freed once the test sees that answer, and the
/// retry, sent after the pushback, succeeds; the caller sees only the success.
#[cfg(feature = "retry")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_policy_waits_out_the_pushback_over_a_channel() {
    use tower::{ServiceBuilder, retry::RetryLayer};
    use tower_lock::retry::{BufferRequestLayer, Buffered, RetryAfterPolicy};

    let locks = LockClient::in_memory();
    let (bank, _steer) = test_bank(&locks);
    let url =
        grpc_url(account_layer(&locks, Duration::from_millis(50)).layer(BankServer::new(bank)))
            .await;
    let channel = tonic::transport::Endpoint::from_shared(url).unwrap().connect().await.unwrap();
    // Each answer's gRPC status, as the retry policy sees it.
    let (seen, mut answers) = mpsc::unbounded_channel::<Option<String>>();
    let service = ServiceBuilder::new()
        .layer(BufferRequestLayer::new())
        .layer(RetryLayer::new(RetryAfterPolicy::new()))
        .map_response(move |response: http::Response<tonic::body::Body>| {
            let status = response.headers().get("grpc-status");
            let _ = seen.send(status.map(|s| s.to_str().unwrap().to_owned()));
            response
        })
        .map_request(|request: http::Request<Buffered>| request.map(tonic::body::Body::new))
        .service(channel);
    let mut grpc = tonic::client::Grpc::new(service);

    let held = locks.lock("account:7").acquire().await.unwrap();
    let started = Instant::now();
    let call = tokio::spawn(async move {
        grpc.ready().await.unwrap();
        let codec = tonic_prost::ProstCodec::<Change, Balance>::default();
        let path = http::uri::PathAndQuery::from_static("/bank.Bank/Withdraw");
        grpc.unary(withdraw("7", 4), path, codec).await
    });
    assert_eq!(
        answers.recv().await.unwrap().as_deref(),
        Some("14"),
        "the first attempt finds the account busy"
    );
    held.release().await.unwrap();
    let balance = call.await.unwrap().expect("the retry succeeds");
    assert_eq!(balance.into_inner().balance, -4);
    assert_eq!(answers.recv().await.unwrap(), None, "the retry's answer: a success");
    // The pushback of a fresh client is the wait, raised to 100 ms.
    assert!(started.elapsed() >= Duration::from_millis(100));
}
