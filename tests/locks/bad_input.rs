//! What a caller passes never panics a thread: a wait of `Duration::MAX` waits without limit,
//! a lease no store can hold is refused at the call with `InvalidLease` (a client or a layer
//! configured with one fails as clearly), and no lock is taken or left behind. Each test runs
//! on the in-memory store and on Redis, and counts the panics of every thread while it runs.

use crate::support;

use std::{
    convert::Infallible,
    sync::{
        OnceLock,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use support::{RedisServer, granted::Granted};
use tower_lock::{
    Backend, ConfigError, Lease, LockClient, LockError, LockGuard, LockKind, LockLayer,
    MemoryBackend, MultiGuard, MultiLockError, RedisBackend,
    backend::store::{Renew, Store},
    key,
};

/// Panics seen in this process since the hook was installed, on any thread.
static PANICS: AtomicUsize = AtomicUsize::new(0);

/// Installs a panic hook that counts every panic (a runtime worker's too) before the default
/// report, and returns the count so far.
fn panics() -> usize {
    static HOOK: OnceLock<()> = OnceLock::new();
    HOOK.get_or_init(|| {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            report(info);
        }));
    });
    PANICS.load(Ordering::SeqCst)
}

/// The longest wait and leases no store can hold.
const FOREVER: Duration = Duration::MAX;
const TOO_LONG: Duration = Duration::from_secs(366 * 24 * 60 * 60);

async fn redis_clients(
    server: &RedisServer,
) -> (LockClient<RedisBackend>, LockClient<RedisBackend>) {
    let connect = || async {
        let backend = support::redis_backend(server.url()).connect().await.expect("connect");
        LockClient::builder(backend).build().expect("valid client")
    };
    (connect().await, connect().await)
}

fn memory_clients() -> (LockClient<MemoryBackend>, LockClient<MemoryBackend>) {
    let backend = MemoryBackend::new();
    let build = |backend| LockClient::builder(backend).build().expect("valid client");
    (build(backend.clone()), build(backend))
}

/// The lock kinds a wait applies to, by name.
const KINDS: [&str; 5] = ["lock", "fair", "write", "semaphore", "set"];

/// A hold of one lock or of a set.
enum Held<B: Backend> {
    One(LockGuard<B>),
    Set(MultiGuard<B>),
}

impl<B: Backend> Held<B> {
    async fn release(self) -> Result<(), LockError> {
        match self {
            Self::One(guard) => guard.release().await,
            Self::Set(guard) => guard.release().await,
        }
    }
}

/// Takes `key` as `kind` (a set: `key` and "other") through `client` with `wait` and `lease`.
async fn hold<B: Backend>(
    client: &LockClient<B>,
    kind: &str,
    key: &str,
    wait: Duration,
    lease: Lease,
) -> Result<Held<B>, LockError> {
    let request = match kind {
        "lock" => client.lock(key),
        "fair" => client.fair_lock(key),
        "write" => client.read_write_lock(key).write(),
        "read" => client.read_write_lock(key).read(),
        "semaphore" => client.semaphore(key, 1),
        "set" => {
            let set = client.lock_all([key, "other"]).wait(wait).lease(lease);
            return Ok(Held::Set(set.acquire().await.map_err(MultiLockError::into_error)?));
        }
        other => unreachable!("no kind {other}"),
    };
    Ok(Held::One(request.wait(wait).lease(lease).acquire().await?))
}

/// [`hold`], then the release.
async fn take<B: Backend>(
    client: &LockClient<B>,
    kind: &str,
    key: &str,
    wait: Duration,
    lease: Lease,
) -> Result<(), LockError> {
    hold(client, kind, key, wait, lease).await?.release().await
}

/// A wait of `Duration::MAX` takes a free lock at once, and waits for a held one until it is
/// released, for every kind of lock.
async fn unlimited_wait<B: Backend>(a: LockClient<B>, b: LockClient<B>) {
    let before = panics();
    for kind in KINDS {
        let key = format!("unlimited-{kind}");
        take(&b, kind, &key, FOREVER, Lease::DEFAULT)
            .await
            .unwrap_or_else(|error| panic!("{kind}: a free lock with an unlimited wait: {error}"));
        let held = hold(&a, kind, &key, Duration::ZERO, Lease::DEFAULT)
            .await
            .unwrap_or_else(|error| panic!("{kind}: the first holder: {error}"));
        let waiter = tokio::spawn({
            let (b, key) = (b.clone(), key.clone());
            async move { take(&b, kind, &key, FOREVER, Lease::DEFAULT).await }
        });
        support::eventually(Duration::from_secs(5), "the waiter waits", || {
            b.waiters() == 1 || waiter.is_finished()
        })
        .await;
        assert!(!waiter.is_finished(), "{kind}: the waiter did not wait");
        held.release().await.expect("the first holder releases");
        waiter
            .await
            .expect("the waiter's task")
            .unwrap_or_else(|error| panic!("{kind}: the waiter after the release: {error}"));
    }
    assert_eq!(panics(), before, "a thread panicked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlimited_wait_waits_until_the_release_in_memory() {
    let (a, b) = memory_clients();
    unlimited_wait(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlimited_wait_waits_until_the_release_on_redis() {
    let server = RedisServer::start();
    let (a, b) = redis_clients(&server).await;
    unlimited_wait(a, b).await;
}

/// A lease no store can hold fails the acquire with `InvalidLease` before anything is sent,
/// for every kind of lock; the lock stays free.
async fn impossible_leases<B: Backend>(a: LockClient<B>, b: LockClient<B>) {
    let before = panics();
    let leases = [
        Lease::fixed(FOREVER),
        Lease::watchdog(FOREVER),
        Lease::fixed(TOO_LONG),
        Lease::watchdog(TOO_LONG),
    ];
    for kind in KINDS.iter().copied().chain(["read"]) {
        for lease in leases {
            let key = format!("impossible-{kind}");
            for wait in [Duration::ZERO, FOREVER] {
                match take(&a, kind, &key, wait, lease).await {
                    Err(LockError::InvalidLease(refused)) => {
                        assert_eq!(refused, lease.duration(), "{kind}: the lease refused");
                    }
                    other => panic!("{kind}, {lease:?}: {other:?}, not InvalidLease"),
                }
            }
            take(&b, kind, &key, Duration::ZERO, Lease::DEFAULT)
                .await
                .unwrap_or_else(|error| panic!("{kind}: the lock stayed free: {error}"));
        }
    }
    // The longest lease there is still works.
    take(
        &a,
        "lock",
        "longest",
        Duration::ZERO,
        Lease::fixed(Duration::from_secs(365 * 24 * 60 * 60)),
    )
    .await
    .expect("a lease of 365 days");
    assert_eq!(panics(), before, "a thread panicked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_impossible_lease_is_refused_at_the_call_in_memory() {
    let (a, b) = memory_clients();
    impossible_leases(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_impossible_lease_is_refused_at_the_call_on_redis() {
    let server = RedisServer::start();
    let (a, b) = redis_clients(&server).await;
    impossible_leases(a, b).await;
}

/// A client's own settings: an impossible default lease or waiter timeout fails the build; an
/// unlimited default wait and an unlimited `max_hold` work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_settings_never_overflow() {
    let before = panics();
    for lease in [Lease::watchdog(FOREVER), Lease::fixed(TOO_LONG)] {
        let built = LockClient::builder(MemoryBackend::new()).lease(lease).build();
        assert!(
            matches!(built, Err(ConfigError::Invalid { setting: "lease", .. })),
            "{lease:?}: {built:?}"
        );
    }
    let built = LockClient::builder(MemoryBackend::new()).waiter_timeout(FOREVER).build();
    assert!(
        matches!(built, Err(ConfigError::Invalid { setting: "waiter_timeout", .. })),
        "{built:?}"
    );
    let server = RedisServer::start();
    let backend = support::redis_backend(server.url()).connect().await.expect("connect");
    let locks = LockClient::builder(backend)
        .wait(FOREVER)
        .max_hold(FOREVER)
        .lease(Lease::watchdog(Duration::from_millis(300)))
        .build()
        .expect("valid client");
    let guard = locks.lock("settings").acquire().await.expect("acquired");
    // Renewed past a lease: the watchdog's arithmetic with an unlimited max_hold holds up.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!guard.is_lost(), "renewed");
    guard.release().await.expect("released");
    assert_eq!(panics(), before, "a thread panicked");
}

/// A layer configured with an unlimited wait works; one with an impossible lease answers 500
/// (a misconfiguration) without taking the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_with_extreme_options_never_panics() {
    use tower::{ServiceBuilder, ServiceExt};
    let before = panics();
    let locks = LockClient::in_memory();
    let service = |layer: LockLayer<MemoryBackend>| {
        ServiceBuilder::new().layer(layer.key(key::header("x-k")).name("extreme")).service(
            tower::service_fn(|_request: http::Request<()>| async {
                Ok::<_, Infallible>(http::Response::new(String::from("done")))
            }),
        )
    };
    let request = || http::Request::get("/").header("x-k", "1").body(()).unwrap();
    let unlimited = service(LockLayer::new(locks.clone()).wait(FOREVER));
    let response = unlimited.oneshot(request()).await.expect("infallible");
    assert_eq!(response.status(), http::StatusCode::OK);
    let impossible = service(LockLayer::new(locks.clone()).lease(Lease::fixed(FOREVER)));
    let response = impossible.oneshot(request()).await.expect("infallible");
    assert_eq!(response.status(), http::StatusCode::INTERNAL_SERVER_ERROR);
    assert!(
        locks.lock_in_namespace("extreme", "1").try_acquire().await.is_ok(),
        "the lock stayed free"
    );
    assert_eq!(panics(), before, "a thread panicked");
}

/// A store called directly (as a scheduler of one's own would) with renewals of unlimited
/// length naming a held grant answers, and panics no thread: the in-memory store keeps the
/// grant, Redis answers or refuses.
async fn unlimited_renewals<B: Store + Clone>(backend: B) {
    let before = panics();
    let store = Granted::new(backend);
    let client = LockClient::builder(store.clone()).build().expect("valid client");
    for kind in ["lock", "write", "semaphore"] {
        let Held::One(guard) =
            hold(&client, kind, "direct", Duration::ZERO, Lease::DEFAULT).await.expect("acquired")
        else {
            unreachable!("one lock")
        };
        let kind = match kind {
            "lock" => LockKind::Exclusive,
            "write" => LockKind::Write,
            _ => LockKind::Semaphore,
        };
        let grant = store.grant(guard.key(), guard.holder().id()).expect("the grant was answered");
        for lease in [Lease::watchdog(FOREVER), Lease::fixed(FOREVER)] {
            let renew = Renew::Grant { key: guard.key(), kind, grant: &grant, lease };
            let _answered = store.renew(&[renew]).await;
        }
        guard.release().await.expect("released");
    }
    assert_eq!(panics(), before, "a thread panicked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_renewing_without_limit_never_panics_in_memory() {
    unlimited_renewals(MemoryBackend::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_renewing_without_limit_never_panics_on_redis() {
    let server = RedisServer::start();
    let backend = support::redis_backend(server.url()).connect().await.expect("connect");
    unlimited_renewals(backend).await;
}

/// `#[locked]`: an unlimited wait takes the lock; a lease no store can hold answers 500 (a
/// misconfiguration) at the request, without taking the lock.
#[cfg(feature = "macros")]
mod attribute {
    use axum::{
        Router,
        body::Body,
        extract::{Path, State},
        http::{Request, StatusCode},
        routing::post,
    };
    use tower::ServiceExt;
    use tower_lock::{LockClient, MemoryBackend, locked};

    use super::panics;

    type Locks = LockClient<MemoryBackend>;

    // 1 000 000 hours: longer than any wait can run.
    #[locked(key = "{id}", wait = "1000000h")]
    async fn unlimited(State(_locks): State<Locks>, Path(id): Path<u64>) -> String {
        id.to_string()
    }

    // 9 000 hours: more than 365 days.
    #[locked(key = "{id}", lease = "9000h", wait = "0ms")]
    async fn too_long(State(_locks): State<Locks>, Path(id): Path<u64>) -> String {
        id.to_string()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn extreme_attribute_options_never_panic() {
        let before = panics();
        let locks = LockClient::in_memory();
        let router = Router::new()
            .route("/unlimited/{id}", post(unlimited))
            .route("/too-long/{id}", post(too_long))
            .with_state(locks.clone());
        let status = |path: &'static str| {
            let router = router.clone();
            async move {
                let request = Request::post(path).body(Body::empty()).expect("request");
                router.oneshot(request).await.expect("infallible").status()
            }
        };
        assert_eq!(status("/unlimited/1").await, StatusCode::OK);
        assert_eq!(status("/too-long/1").await, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(
            locks.lock_in_namespace("/too-long/{id}", "1").try_acquire().await.is_ok(),
            "the lock stayed free"
        );
        assert_eq!(panics(), before, "a thread panicked");
    }
}
