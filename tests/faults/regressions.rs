//! Regression tests for the defects that the protocol of one record per grant removes, at the
//! level of clients: each case runs on the in-memory store, on a real Redis server and, where
//! the case applies to it, on Redlock over three servers (the fixture of `tests/support`).
//! The first line of each case's doc says what it proves.
//!
//! Faults come from [`Lossy`], a store wrapper that applies a write and loses its reply, fails
//! writes without applying them, or holds an acquire back to deliver it late.

use std::{
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::{sync::Notify, time::Instant};

use tower_lock::{
    Lease, LockClient, LockError, LockGuard, MemoryBackend, RedisBackend, RedlockBackend,
    backend::{
        Backend, LockKind,
        store::{
            AcquireReply, Extend, ExtendReply, Grant, OwnedGrant, Release, ReleaseReply, Store,
        },
    },
    error::{BackendError, BackendErrorKind},
};

use crate::support::{self, RedisServer, forward_to_inner};

/// What [`Lossy`] does to the next calls.
#[derive(Default)]
struct Plan {
    /// Releases to apply and answer with a timeout: their reply is lost.
    releases_lost: AtomicUsize,
    /// A lost release waits for [`resume`](Self::resume) before it answers, after telling
    /// [`applied`](Self::applied): the test acts in between.
    gated: AtomicBool,
    applied: Notify,
    resume: Notify,
    /// While set, releases fail with a timeout without reaching the store.
    releases_dropped: AtomicBool,
    /// Releases to fail with a timeout without reaching the store.
    releases_failed: AtomicUsize,
    /// Extends to apply and answer with a timeout.
    extends_lost: AtomicUsize,
    /// Acquires to hold back (not applied, answered with a timeout), kept to be delivered late.
    acquires_held_back: AtomicUsize,
    held_back: Mutex<Vec<OwnedGrant>>,
    /// Every attempt an acquire named, in order.
    attempts: Mutex<Vec<String>>,
    /// How many releases were sent.
    releases: AtomicUsize,
}

/// Takes one from `count` if it is not zero.
fn take(count: &AtomicUsize) -> bool {
    count.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
}

fn timeout() -> BackendError {
    BackendError::from_kind(BackendErrorKind::Timeout)
}

/// A store that loses replies, drops releases and holds acquires back, as [`Plan`] says.
#[derive(Clone)]
struct Lossy<B> {
    inner: B,
    plan: Arc<Plan>,
}

impl<B> Lossy<B> {
    fn new(inner: B) -> Self {
        Self { inner, plan: Arc::default() }
    }

    /// The next release is applied, then answered with a timeout once the test resumes it.
    fn lose_next_release_reply(&self) {
        self.plan.gated.store(true, Ordering::SeqCst);
        self.plan.releases_lost.store(1, Ordering::SeqCst);
    }

    fn attempts(&self) -> Vec<String> {
        self.plan.attempts.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn releases(&self) -> usize {
        self.plan.releases.load(Ordering::SeqCst)
    }
}

impl<B: Store> Lossy<B> {
    /// Delivers the acquire held back, late: what the store answers it.
    async fn deliver_late(&self) -> AcquireReply {
        let held = self
            .plan
            .held_back
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
            .expect("an acquire held back");
        let grant = Grant {
            // Through the scripts, as a copy held back on a connection arrives.
            contended: true,
            ..held.grant()
        };
        self.inner.acquire(grant).await.expect("delivered")
    }
}

impl<B: Store + Clone> Store for Lossy<B> {
    type Listener = B::Listener;

    async fn acquire(&self, grant: Grant<'_>) -> Result<AcquireReply, BackendError> {
        self.plan
            .attempts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(grant.attempt.to_owned());
        if take(&self.plan.acquires_held_back) {
            let held = OwnedGrant::of(&grant);
            self.plan.held_back.lock().unwrap_or_else(PoisonError::into_inner).push(held);
            return Err(timeout());
        }
        self.inner.acquire(grant).await
    }

    async fn extend(&self, extend: Extend<'_>) -> Result<ExtendReply, BackendError> {
        let reply = self.inner.extend(extend).await;
        if take(&self.plan.extends_lost) {
            assert!(
                matches!(reply, Ok(ExtendReply::Extended { .. })),
                "the extend whose reply is lost was applied: {reply:?}"
            );
            return Err(timeout());
        }
        reply
    }

    async fn release(&self, release: Release<'_>) -> Result<ReleaseReply, BackendError> {
        self.plan.releases.fetch_add(1, Ordering::SeqCst);
        if self.plan.releases_dropped.load(Ordering::SeqCst) || take(&self.plan.releases_failed) {
            return Err(timeout());
        }
        let reply = self.inner.release(release).await;
        if take(&self.plan.releases_lost) {
            if self.plan.gated.swap(false, Ordering::SeqCst) {
                self.plan.applied.notify_one();
                self.plan.resume.notified().await;
            }
            return Err(timeout());
        }
        reply
    }

    forward_to_inner!(renew, abandon, leave, listen, inspect, force_unlock);
}

fn client<B: Backend>(store: B) -> LockClient<B> {
    LockClient::builder(store).build().expect("valid settings")
}

async fn redis(server: &RedisServer) -> RedisBackend {
    support::redis_backend(server.url()).connect().await.expect("connect")
}

fn three() -> Vec<RedisServer> {
    (0..3).map(|_| RedisServer::start()).collect()
}

fn redlock(servers: &[RedisServer]) -> RedlockBackend {
    support::redlock_backend(servers.iter().map(RedisServer::url)).build().expect("valid nodes")
}

fn refused<B: Backend>(outcome: Result<LockGuard<B>, LockError>) -> bool {
    matches!(outcome, Err(LockError::WaitTimeout { .. }))
}

/// Runs `case` on the in-memory store, on Redis and on Redlock: one test each.
macro_rules! on_every_store {
    ($case:ident: $memory:ident, $redis:ident, $redlock:ident) => {
        #[tokio::test]
        async fn $memory() {
            $case(MemoryBackend::new()).await;
        }

        #[tokio::test]
        async fn $redis() {
            let server = RedisServer::start();
            $case(redis(&server).await).await;
        }

        #[tokio::test]
        async fn $redlock() {
            let servers = three();
            $case(redlock(&servers)).await;
        }
    };
    ($case:ident: $memory:ident, $redis:ident) => {
        #[tokio::test]
        async fn $memory() {
            $case(MemoryBackend::new()).await;
        }

        #[tokio::test]
        async fn $redis() {
            let server = RedisServer::start();
            $case(redis(&server).await).await;
        }
    };
}

/// (1) A client's shutdown releases its own grants only: another client's locks on the same
/// store stay held (a third client is refused), its guards are not lost across renewals, its
/// waiters are still woken by a release; and a request on one client naming another client's
/// holder is refused.
async fn shutdown_leaves_another_clients_locks<B: Backend + Clone>(store: B) {
    let (x, y, z) = (client(store.clone()), client(store.clone()), client(store.clone()));
    let lease = Lease::watchdog(Duration::from_millis(600));
    let xk = x.lock("k").lease(lease).acquire().await.unwrap();
    let named = y.lock("k").holder(xk.holder()).try_acquire().await;
    assert!(matches!(named, Err(LockError::ForeignHolder)), "{named:?}");
    let scoped = xk.holder().clone().scope(y.lock("k").try_acquire()).await;
    assert!(matches!(scoped, Err(LockError::HeldThroughOtherClient)), "{scoped:?}");
    let xo = x.lock("x-own").lease(lease).acquire().await.unwrap();
    let y1 = y.lock("y1").lease(lease).acquire().await.unwrap();
    // Held long, so that a waiter that missed its release would wait far past the test.
    let y2 = y.lock("y2").lease(Lease::watchdog(Duration::from_secs(60))).acquire().await.unwrap();
    x.shutdown().await;
    assert!(xk.is_lost() && xo.is_lost(), "the shut-down client's guards");
    // Several renewals of Y's locks fall due.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for (name, guard) in [("y1", &y1), ("y2", &y2)] {
        assert!(!guard.is_lost(), "{name} lost by another client's shutdown");
        assert!(
            refused(z.lock(name).try_acquire().await),
            "{name} freed by another client's shutdown"
        );
    }
    // X's own locks were released.
    for name in ["k", "x-own"] {
        let guard = z.lock(name).try_acquire().await;
        guard.expect("released at shutdown").release().await.unwrap();
    }
    // Z waits for y2, and is woken by its release.
    let waiting = tokio::spawn({
        let z = z.clone();
        async move { z.lock("y2").wait(Duration::from_secs(10)).acquire().await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released = Instant::now();
    y2.release().await.unwrap();
    let next = waiting.await.unwrap().expect("woken by the release");
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "the waiter was not woken by the release: {:?}",
        released.elapsed()
    );
    next.release().await.unwrap();
    y1.release().await.unwrap();
}

on_every_store!(shutdown_leaves_another_clients_locks:
    shutdown_leaves_another_clients_locks_in_memory,
    shutdown_leaves_another_clients_locks_on_redis,
    shutdown_leaves_another_clients_locks_on_redlock);

/// (1b) A client that shuts down while a release of one of its locks fails, or keeps failing,
/// still frees the lock once the store answers, within its clean-up grace: the release its
/// shutdown sends is sent again after a failure, and a release already being retried is not
/// cut off by the shutdown. The lock is not left to its lease.
async fn a_shutdown_finishes_its_releases<B: Backend + Clone>(store: B) {
    let lossy = Lossy::new(store.clone());
    let (x, z) = (client(lossy.clone()), client(store.clone()));
    let lease = Lease::watchdog(Duration::from_secs(30));
    let held = x.lock("held").lease(lease).acquire().await.unwrap();
    let releasing = x.lock("releasing").lease(lease).acquire().await.unwrap();
    lossy.plan.releases_dropped.store(true, Ordering::SeqCst);
    let released = tokio::spawn(releasing.release());
    // The release is being sent again when the client stops.
    tokio::time::sleep(Duration::from_millis(50)).await;
    lossy.plan.releases_dropped.store(false, Ordering::SeqCst);
    // The first delete the shutdown sends fails too.
    lossy.plan.releases_failed.store(1, Ordering::SeqCst);
    x.shutdown().await;
    assert!(held.is_lost());
    assert!(released.await.unwrap().is_ok());
    for name in ["held", "releasing"] {
        let next = z.lock(name).wait(Duration::from_millis(900)).acquire().await;
        next.unwrap_or_else(|e| panic!("{name}: left to its lease: {e:?}"))
            .release()
            .await
            .unwrap();
    }
}

on_every_store!(a_shutdown_finishes_its_releases:
    a_shutdown_finishes_its_releases_in_memory,
    a_shutdown_finishes_its_releases_on_redis,
    a_shutdown_finishes_its_releases_on_redlock);

/// X's release of `key` is applied, its reply lost; `between` runs before X hears of it (and
/// sends the release again). Returns once X's release returned.
async fn release_with_lost_reply<B: Backend + Clone, F: Future>(
    lossy: &Lossy<B>,
    guard: LockGuard<Lossy<B>>,
    between: F,
) -> F::Output {
    lossy.lose_next_release_reply();
    let releasing = tokio::spawn(guard.release());
    lossy.plan.applied.notified().await;
    let output = between.await;
    lossy.plan.resume.notify_one();
    let released = releasing.await.unwrap();
    assert!(
        released.is_ok(),
        "a repeat that finds the grant gone confirms the release: {released:?}"
    );
    assert!(lossy.releases() >= 2, "the release was sent again");
    output
}

/// (2) A release whose reply was lost after it was applied is sent again; if another client
/// took the freed lock meanwhile, the repeat frees nothing of its: it names X's grant.
async fn a_repeated_release_frees_nothing_newer<B: Backend + Clone>(store: B) {
    let lossy = Lossy::new(store.clone());
    let (x, z, w) = (client(lossy.clone()), client(store.clone()), client(store.clone()));
    let guard = x.lock("k").acquire().await.unwrap();
    let zk = release_with_lost_reply(&lossy, guard, async {
        z.lock("k").try_acquire().await.expect("freed by X's release")
    })
    .await;
    assert!(refused(w.lock("k").try_acquire().await), "X's repeated release freed Z's grant");
    assert!(!zk.is_lost());
    zk.release().await.unwrap();
}

on_every_store!(a_repeated_release_frees_nothing_newer:
    a_repeated_release_frees_nothing_newer_in_memory,
    a_repeated_release_frees_nothing_newer_on_redis,
    a_repeated_release_frees_nothing_newer_on_redlock);

/// The number at the end of an id (`…:<n>` or `…#<n>`).
fn number(id: &str) -> &str {
    id.rsplit([':', '#']).next().unwrap_or(id)
}

/// (3) Two clients never send the same attempt id, even for holders of the same number in
/// clients of the same name: ids start with the client's own id. With (2)'s sequence between
/// two such clients, the second client's grant survives the first one's repeated release.
async fn attempts_of_two_clients_never_collide<B: Backend + Clone>(store: B) {
    let (lx, lz) = (Lossy::new(store.clone()), Lossy::new(store.clone()));
    let twin = |store| LockClient::builder(store).name("twin").build().expect("valid");
    let (x, z, w) = (twin(lx.clone()), twin(lz.clone()), client(store.clone()));
    let guard = x.lock("k").acquire().await.unwrap();
    let x_holder = guard.holder().id().to_owned();
    let zk = release_with_lost_reply(&lx, guard, async {
        z.lock("k").try_acquire().await.expect("freed by X's release")
    })
    .await;
    assert!(refused(w.lock("k").try_acquire().await), "X's repeated release freed Z's grant");
    assert!(!zk.is_lost());
    let (xa, za) = (&lx.attempts()[0], &lz.attempts()[0]);
    assert_eq!(
        (number(&x_holder), number(xa)),
        (number(zk.holder().id()), number(za)),
        "fresh clients number their first holder and attempt alike"
    );
    assert_ne!(xa, za, "two clients sent the same attempt id");
    zk.release().await.unwrap();
}

on_every_store!(attempts_of_two_clients_never_collide:
    attempts_of_two_clients_never_collide_in_memory,
    attempts_of_two_clients_never_collide_on_redis,
    attempts_of_two_clients_never_collide_on_redlock);

/// (4) A reader's early release, and the end of a reader's short lease, end that reader's grant
/// only: another holder's read goes on, and a writer is refused while any reader holds; a
/// holder is not shared across clients.
async fn readers_hold_on_their_own<B: Backend + Clone>(store: B) {
    let (a, b, c) = (client(store.clone()), client(store.clone()), client(store.clone()));
    fn rw<B: Backend>(client: &LockClient<B>) -> tower_lock::LockRequest<'_, B> {
        client.read_write_lock("doc").read()
    }
    let long = rw(&a).lease(Lease::watchdog(Duration::from_millis(600))).acquire().await.unwrap();
    let short = Lease::fixed(Duration::from_millis(300));
    let early = rw(&b).lease(short).acquire().await.unwrap();
    early.release().await.unwrap();
    assert!(refused(c.read_write_lock("doc").write().try_acquire().await));
    let ends = rw(&b).lease(short).acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(ends.is_lost(), "a read past its own lease");
    drop(ends);
    assert!(!long.is_lost(), "another reader's end ended this read");
    assert!(
        refused(c.read_write_lock("doc").write().try_acquire().await),
        "a writer got in while a reader holds"
    );
    let shared = rw(&b).holder(long.holder()).try_acquire().await;
    assert!(matches!(shared, Err(LockError::ForeignHolder)), "{shared:?}");
    long.release().await.unwrap();
    c.read_write_lock("doc")
        .write()
        .try_acquire()
        .await
        .expect("free once the last reader went")
        .release()
        .await
        .unwrap();
}

on_every_store!(readers_hold_on_their_own:
    readers_hold_on_their_own_in_memory,
    readers_hold_on_their_own_on_redis);

/// What a case of (5) takes: a plain lock, a read side, or a permit of a one-permit semaphore.
#[derive(Clone, Copy, Debug)]
enum Side {
    Plain,
    Read,
    Permit,
}

impl Side {
    fn request<B: Backend>(self, client: &LockClient<B>) -> tower_lock::LockRequest<'_, B> {
        match self {
            Self::Plain => client.lock("k"),
            Self::Read => client.read_write_lock("k").read(),
            Self::Permit => client.semaphore("k", 1),
        }
    }

    /// A newcomer's request that the grant keeps out.
    fn excluded<B: Backend>(self, client: &LockClient<B>) -> tower_lock::LockRequest<'_, B> {
        match self {
            Self::Read => client.read_write_lock("k").write(),
            other => other.request(client),
        }
    }
}

/// (5) A re-entry whose extend (to a longer fixed lease) is applied but its reply lost fails;
/// the grant's release then frees the lock at once, not after the longer lease: a newcomer is
/// granted. For a plain lock, a read side and a semaphore permit.
async fn a_lost_extend_strands_nothing<B: Backend + Clone>(store: B, sides: &[Side]) {
    for &side in sides {
        let lossy = Lossy::new(store.clone());
        let (x, z) = (client(lossy.clone()), client(store.clone()));
        let holder = x.holder();
        let first = holder
            .clone()
            .scope(side.request(&x).lease(Lease::fixed(Duration::from_secs(2))).acquire())
            .await
            .unwrap();
        lossy.plan.extends_lost.store(1, Ordering::SeqCst);
        let longer = Lease::fixed(Duration::from_secs(60));
        let again = holder.scope(side.request(&x).lease(longer).acquire()).await;
        assert!(
            matches!(&again, Err(LockError::Backend(error)) if error.is_timeout()),
            "{side:?}: {again:?}"
        );
        assert!(!first.is_lost(), "{side:?}");
        first.release().await.unwrap();
        let next = side.excluded(&z).try_acquire().await;
        next.unwrap_or_else(|e| panic!("{side:?}: not free at once: {e:?}"))
            .release()
            .await
            .unwrap();
    }
}

async fn a_lost_extend_strands_nothing_of_any_kind<B: Backend + Clone>(store: B) {
    a_lost_extend_strands_nothing(store, &[Side::Plain, Side::Read, Side::Permit]).await;
}

async fn a_lost_extend_strands_nothing_of_a_plain_lock<B: Backend + Clone>(store: B) {
    a_lost_extend_strands_nothing(store, &[Side::Plain]).await;
}

on_every_store!(a_lost_extend_strands_nothing_of_any_kind:
    a_lost_extend_strands_nothing_in_memory,
    a_lost_extend_strands_nothing_on_redis);

#[tokio::test]
async fn a_lost_extend_strands_nothing_on_redlock() {
    let servers = three();
    a_lost_extend_strands_nothing_of_a_plain_lock(redlock(&servers)).await;
}

/// (6) A release that never gets through is sent again until the grant could no longer be kept
/// (its lease, counted from when it was sent), and then no more; the lock is free once that
/// lease ends, not later, and the release that was given up on frees nothing of the next
/// holder's.
async fn release_retries_stop_once_the_grant_is_over<B: Backend + Clone>(store: B) {
    let lossy = Lossy::new(store.clone());
    let (x, z, w) = (client(lossy.clone()), client(store.clone()), client(store.clone()));
    let lease = Duration::from_millis(1500);
    let sent = Instant::now();
    let guard = x.lock("k").lease(Lease::fixed(lease)).acquire().await.unwrap();
    lossy.plan.releases_dropped.store(true, Ordering::SeqCst);
    let outcome = guard.release().await;
    assert!(
        matches!(&outcome, Err(LockError::Backend(error)) if error.is_timeout()),
        "{outcome:?}"
    );
    let zk = z.lock("k").wait(lease * 3).acquire().await.unwrap();
    let freed = sent.elapsed();
    assert!(
        freed >= lease - Duration::from_millis(50) && freed < lease + Duration::from_millis(700),
        "free at {freed:?}, the lease was {lease:?}"
    );
    let tries = lossy.releases();
    assert!(tries >= 3, "sent again while the grant could be kept: {tries}");
    // Past the lease, the release is no longer sent (and would free nothing if it were).
    lossy.plan.releases_dropped.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(lossy.releases(), tries, "sent again after the grant was over");
    assert!(refused(w.lock("k").try_acquire().await));
    assert!(!zk.is_lost());
    zk.release().await.unwrap();
}

on_every_store!(release_retries_stop_once_the_grant_is_over:
    release_retries_stop_once_the_grant_is_over_in_memory,
    release_retries_stop_once_the_grant_is_over_on_redis,
    release_retries_stop_once_the_grant_is_over_on_redlock);

/// (8) An attempt recorded as given up on (its acquire held back unanswered, then undone)
/// blocks that attempt id only: another client's acquire is granted at once, and the given-up
/// attempt, delivered late, takes nothing.
async fn a_given_up_attempt_blocks_only_itself<B: Backend + Clone>(store: B) {
    let lossy = Lossy::new(store.clone());
    let (x, y, w) = (client(lossy.clone()), client(store.clone()), client(store.clone()));
    lossy.plan.acquires_held_back.store(1, Ordering::SeqCst);
    let first = x.lock("k").try_acquire().await;
    assert!(matches!(&first, Err(LockError::Backend(error)) if error.is_timeout()), "{first:?}");
    let yk = y
        .lock("k")
        .try_acquire()
        .await
        .expect("another client's attempt is not blocked by X's given-up one");
    yk.release().await.unwrap();
    let late = lossy.deliver_late().await;
    assert!(
        !matches!(late, AcquireReply::Acquired { .. }),
        "the given-up attempt, delivered late, took the lock: {late:?}"
    );
    let key = x.lock_key("", "k", LockKind::Exclusive).unwrap();
    assert!(!store.inspect(&key, LockKind::Exclusive).await.unwrap().is_locked());
    w.lock("k").try_acquire().await.expect("free").release().await.unwrap();
}

on_every_store!(a_given_up_attempt_blocks_only_itself:
    a_given_up_attempt_blocks_only_itself_in_memory,
    a_given_up_attempt_blocks_only_itself_on_redis,
    a_given_up_attempt_blocks_only_itself_on_redlock);

/// (7) On Redlock a grant's release and its renewals are the same write on every node, as its
/// record is: with one node stalled, renewals hold on the others, and after the release the
/// stalled node gets the grant's undo once it answers, so the grant is gone from every node
/// (and given up on there), and the next holder is granted on every node.
#[tokio::test]
async fn a_redlock_release_reaches_a_stalled_node() {
    let servers = three();
    let locks = client(redlock(&servers));
    let key = locks.lock_key("", "k", LockKind::Exclusive).unwrap();
    let record = |server: &RedisServer| server.cmd(&["GET", key.as_str()]).as_str();
    let guard =
        locks.lock("k").lease(Lease::watchdog(Duration::from_millis(600))).acquire().await.unwrap();
    support::eventually(Duration::from_secs(1), "the record on every node", || {
        servers.iter().all(|server| record(server).is_some())
    })
    .await;
    let attempt = record(&servers[0]).unwrap();
    servers[2].pause();
    // Renewals fall due while the node is stalled: a majority renews.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(!guard.is_lost());
    guard.release().await.unwrap();
    for server in &servers[..2] {
        assert_eq!(record(server), None);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    servers[2].resume();
    let void = key.derived(":void");
    support::eventually(Duration::from_secs(3), "the stalled node lets it go", || {
        record(&servers[2]).is_none()
            && servers[2].cmd(&["SISMEMBER", &void, &attempt]).as_int() == 1
    })
    .await;
    let next = locks.lock("k").try_acquire().await.unwrap();
    let next_attempt = record(&servers[0]).unwrap();
    support::eventually(Duration::from_secs(1), "the next grant on every node", || {
        servers.iter().all(|server| record(server).as_deref() == Some(next_attempt.as_str()))
    })
    .await;
    next.release().await.unwrap();
}

/// Acquires `key` on `locks` every 50 ms from `start` until granted; when. A refusal while the
/// server is quarantined (or its connections come back after its restart) is tried again.
async fn granted_after<B: Backend>(locks: &LockClient<B>, key: &str, start: Instant) -> Duration {
    loop {
        match locks.lock(key).try_acquire().await {
            Ok(guard) => {
                let at = start.elapsed();
                guard.release().await.unwrap();
                return at;
            }
            Err(LockError::Backend(error))
                if *error.kind() == BackendErrorKind::Quarantined || error.is_unavailable() => {}
            Err(other) => panic!("{other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A client on the server at `url` with a fixed `lease` and a quarantine shorter than it: the
/// quarantine follows the longest lease the process uses.
async fn quarantined(url: String, lease: Duration) -> LockClient<RedisBackend> {
    let backend = RedisBackend::builder(url)
        .quarantine(Duration::from_millis(100))
        .connect()
        .await
        .expect("connect");
    LockClient::builder(backend).lease(Lease::fixed(lease)).build().expect("valid")
}

/// (9) The restart quarantine counts from one origin, recorded by the run marker, for every
/// process whatever its length: two backends on one server restarted empty, whose quarantines
/// follow their leases (1 s and 3 s), each grant once its own quarantine has passed since the
/// restart, in whichever order they ask (the one with the shorter quarantine asking on
/// through its end, or starting after the other).
#[tokio::test]
async fn the_quarantine_counts_from_one_origin_whoever_asks_first() {
    let mut server = RedisServer::start();
    let short = quarantined(server.url(), Duration::from_secs(1)).await;
    let long = quarantined(server.url(), Duration::from_secs(3)).await;
    for round in ["short first", "long first"] {
        server.restart();
        let start = Instant::now();
        let (short_at, long_at) = match round {
            "short first" => {
                // The short one asks on through its quarantine's end; the long one after it.
                let short_at = granted_after(&short, "s", start).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
                (short_at, granted_after(&long, "l", start).await)
            }
            _ => {
                let long_first = granted_after(&long, "l", start);
                let short_later = async {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    granted_after(&short, "s", start).await
                };
                let (long_at, short_at) = tokio::join!(long_first, short_later);
                (short_at, long_at)
            }
        };
        // The origin is the server's start, read in whole seconds of uptime (at most a second
        // later than the restart).
        assert!(
            short_at >= Duration::from_millis(950) && short_at < Duration::from_millis(2600),
            "{round}: the 1 s quarantine granted at {short_at:?}"
        );
        assert!(
            long_at >= Duration::from_millis(2950) && long_at < Duration::from_millis(4600),
            "{round}: the 3 s quarantine granted at {long_at:?}"
        );
    }
}
