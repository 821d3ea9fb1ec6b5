//! Concurrent paths of the engine that once granted a lock twice or stranded it: a cancelled
//! acquire, a re-entry with a shorter lease, a re-entry's extend racing the release of the
//! holder's other hold, a renewal reply about a grant that ended, a handler resumed past its
//! lease, a release whose reply was lost, a first attempt made before queueing that found the
//! lock held while another task queued behind it, a re-entry's extend answered after the
//! grant's deadline or dropped.
//!
//! Each interleaving is forced, not hoped for: [`Gated`] wraps a backend (most often the
//! in-memory one) and holds one chosen call at its arrival and again before its reply, so the
//! test decides what happens in between. On Redis, the faults are also real: a future dropped
//! with its script on the wire, a server frozen with SIGSTOP.

use crate::support::{self, forward_to_inner};

use std::{
    future::Future,
    sync::{Arc, Mutex, PoisonError},
    task::Poll,
    time::Duration,
};

use support::{
    RedisServer,
    kinds::{KINDS, assert_free_for, assert_refused_to, hold, request},
};
use tokio::sync::oneshot;
use tower_lock::{
    Backend, BackendError, Lease, LockClient, LockError, LockGuard, MemoryBackend, RedisBackend,
    backend::store::{
        AcquireReply, Extend, ExtendReply, Grant, Release, ReleaseReply, Renew, RenewReply, Store,
    },
};

/// Which call the gate holds next.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Call {
    Acquire,
    Extend,
    Release,
    Renew,
}

/// The test's side of a held call: learn that it arrived, let it run, learn that it ran, let
/// its reply go.
struct Held {
    arrived: oneshot::Receiver<()>,
    run: oneshot::Sender<()>,
    ran: oneshot::Receiver<()>,
    reply: oneshot::Sender<()>,
}

impl Held {
    async fn arrived(&mut self) {
        (&mut self.arrived).await.expect("the gated call arrives");
    }

    /// Lets the call run in the store and waits until it has.
    async fn run(self) -> oneshot::Sender<()> {
        let Self { run, ran, reply, .. } = self;
        run.send(()).expect("the gated call waits to run");
        ran.await.expect("the gated call runs");
        reply
    }
}

/// The backend's side of a held call.
struct Gate {
    call: Call,
    arrived: oneshot::Sender<()>,
    run: oneshot::Receiver<()>,
    ran: oneshot::Sender<()>,
    reply: oneshot::Receiver<()>,
}

/// A store (the in-memory one unless told) with a gate in front: the next call of a chosen
/// kind waits at its arrival and before its reply until the test lets it go. Every release
/// goes through [`Store::release`] (it does not answer at once), so the gate can hold the
/// in-memory store's releases too.
#[derive(Clone)]
struct Gated<B = MemoryBackend> {
    inner: B,
    gate: Arc<Mutex<Option<Gate>>>,
    /// Every gated kind of call that reached the store, in order.
    calls: Arc<Mutex<Vec<Call>>>,
}

impl<B> Gated<B> {
    fn new(inner: B) -> Self {
        Self { inner, gate: Arc::default(), calls: Arc::default() }
    }

    /// How many calls of kind `call` reached the store so far.
    fn calls(&self, call: Call) -> usize {
        let calls = self.calls.lock().unwrap_or_else(PoisonError::into_inner);
        calls.iter().filter(|&&made| made == call).count()
    }

    fn hold_next(&self, call: Call) -> Held {
        let (arrived_tx, arrived) = oneshot::channel();
        let (run, run_rx) = oneshot::channel();
        let (ran_tx, ran) = oneshot::channel();
        let (reply, reply_rx) = oneshot::channel();
        *self.gate.lock().unwrap_or_else(PoisonError::into_inner) =
            Some(Gate { call, arrived: arrived_tx, run: run_rx, ran: ran_tx, reply: reply_rx });
        Held { arrived, run, ran, reply }
    }

    /// Runs `op` through the gate when it is set for `call`. A call whose caller went away
    /// while it waited still runs, as a request on the wire would.
    async fn pass<T>(&self, call: Call, op: impl Future<Output = T>) -> T {
        self.calls.lock().unwrap_or_else(PoisonError::into_inner).push(call);
        let gate = {
            let mut slot = self.gate.lock().unwrap_or_else(PoisonError::into_inner);
            match slot.as_ref() {
                Some(gate) if gate.call == call => slot.take(),
                _ => None,
            }
        };
        let Some(gate) = gate else {
            return op.await;
        };
        let _ = gate.arrived.send(());
        let _ = gate.run.await;
        let result = op.await;
        let _ = gate.ran.send(());
        let _ = gate.reply.await;
        result
    }
}

impl<B: Store> Store for Gated<B> {
    type Listener = B::Listener;

    async fn acquire(&self, grant: Grant<'_>) -> Result<AcquireReply, BackendError> {
        self.pass(Call::Acquire, self.inner.acquire(grant)).await
    }

    async fn extend(&self, extend: Extend<'_>) -> Result<ExtendReply, BackendError> {
        self.pass(Call::Extend, self.inner.extend(extend)).await
    }

    async fn release(&self, release: Release<'_>) -> Result<ReleaseReply, BackendError> {
        self.pass(Call::Release, self.inner.release(release)).await
    }

    async fn renew(&self, renewals: &[Renew<'_>]) -> Result<Vec<RenewReply>, BackendError> {
        self.pass(Call::Renew, self.inner.renew(renewals)).await
    }

    forward_to_inner!(abandon, leave, listen, inspect, force_unlock);
}

fn client<B: Backend>(backend: B, lease: Lease) -> LockClient<B> {
    LockClient::builder(backend).lease(lease).build().expect("a valid configuration")
}

/// A client with connections of its own on `server`: another process's view.
async fn redis_client(server: &RedisServer, lease: Lease) -> LockClient<RedisBackend> {
    let backend = support::redis_backend(server.url()).connect().await.expect("connect");
    client(backend, lease)
}

/// Asserts that `other` cannot take `key` within `wait`: someone holds it.
async fn assert_held_against<B: Backend>(other: &LockClient<B>, key: &str, wait: Duration) {
    match other.lock(key).wait(wait).acquire().await {
        Err(LockError::WaitTimeout { .. }) => {}
        Ok(guard) => panic!("another client took {key} while it was held: {guard:?}"),
        Err(error) => panic!("unexpected error: {error:?}"),
    }
}

/// Polls `future` once; true when it is still pending.
async fn pending_after_one_poll<F: Future>(future: &mut std::pin::Pin<Box<F>>) -> bool {
    std::future::poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx).is_pending())).await
}

/// An acquire dropped after the store granted it, before the reply came back: the grant is
/// undone in the background, and the next client gets the lock at once rather than after the
/// 30 s lease.
#[tokio::test(flavor = "current_thread")]
async fn cancelled_acquire_in_flight_does_not_strand_the_lock() {
    let backend = Gated::new(MemoryBackend::new());
    let a = client(backend.clone(), Lease::DEFAULT);
    let b = client(backend.clone(), Lease::DEFAULT);
    let held = backend.hold_next(Call::Acquire);
    let mut acquire = Box::pin(a.lock("order:1").acquire());
    assert!(pending_after_one_poll(&mut acquire).await, "waits at the gate");
    let Held { mut arrived, run, ran, reply } = held;
    (&mut arrived).await.unwrap();
    run.send(()).unwrap();
    // The store grants it; the reply is on its way when the caller goes away.
    assert!(pending_after_one_poll(&mut acquire).await, "waits for its reply");
    ran.await.unwrap();
    drop(acquire);
    drop(reply);
    let guard = b
        .lock("order:1")
        .wait(Duration::from_secs(2))
        .acquire()
        .await
        .expect("the cancelled grant was undone");
    guard.release().await.unwrap();
    assert_eq!(a.active_keys(), 0);
}

/// A client shut down while an acquire's call is on its way: the store grants it after the
/// client released what it held, and the acquire must not hand out a guard that no watchdog
/// watches. It fails with `ShutDown` and gives the lock back (found by the interleaving test,
/// seed 34075).
#[tokio::test(flavor = "current_thread")]
async fn an_acquire_granted_after_shutdown_gives_the_lock_back() {
    let backend = Gated::new(MemoryBackend::new());
    let a = client(backend.clone(), Lease::DEFAULT);
    let b = client(backend.clone(), Lease::DEFAULT);
    let mut held = backend.hold_next(Call::Acquire);
    let acquire = tokio::spawn({
        let a = a.clone();
        async move { a.lock("order:2").acquire().await }
    });
    held.arrived().await;
    a.shutdown().await;
    let reply = held.run().await;
    reply.send(()).unwrap();
    let acquired = acquire.await.expect("acquire task");
    assert!(
        matches!(acquired, Err(LockError::ShutDown)),
        "a guard from a shut-down client: {acquired:?}"
    );
    let guard = b
        .lock("order:2")
        .wait(Duration::from_secs(2))
        .acquire()
        .await
        .expect("the late grant was given back");
    guard.release().await.unwrap();
}

/// The same on Redis: an acquire future polled until its script is on the wire, then
/// dropped. The lock must not stay taken for the 30 s lease; the rounds drop it at different
/// points after the script was sent.
#[tokio::test]
async fn cancelled_acquire_on_redis_does_not_strand_the_lock() {
    let server = RedisServer::start();
    let a = client(support::redis_backend(server.url()).connect().await.unwrap(), Lease::DEFAULT);
    let b = client(support::redis_backend(server.url()).connect().await.unwrap(), Lease::DEFAULT);
    for round in 0..8 {
        let key = format!("order:{round}");
        let mut acquire = Box::pin(a.lock(&key).acquire());
        // One poll queues the script; letting the runtime run (without polling the acquire)
        // puts it on the wire. The drop comes while its reply is on its way.
        if !pending_after_one_poll(&mut acquire).await {
            continue;
        }
        for _ in 0..round % 4 + 1 {
            tokio::task::yield_now().await;
        }
        drop(acquire);
        let guard =
            b.lock(&key).wait(Duration::from_secs(2)).acquire().await.unwrap_or_else(|e| {
                panic!("round {round}: the dropped acquire kept the lock: {e:?}")
            });
        guard.release().await.unwrap();
    }
}

/// A re-entry with a shorter fixed lease never shortens the outer hold: after it is released
/// and its lease has passed, the outer guard still holds the lock, in the store too.
async fn short_reentry_keeps_the_outer_hold<B: Store + Clone>(backend: B) {
    let a = client(backend.clone(), Lease::watchdog(Duration::from_secs(30)));
    let b = client(backend, Lease::DEFAULT);
    let holder = a.holder();
    let (outer, inner) = holder
        .scope(async {
            let outer = a.lock("doc:1").acquire().await.unwrap();
            let inner = a
                .lock("doc:1")
                .lease(Lease::fixed(Duration::from_millis(100)))
                .acquire()
                .await
                .unwrap();
            (outer, inner)
        })
        .await;
    assert_eq!(inner.hold_count(), 2);
    inner.release().await.unwrap();
    // Past the re-entry's own lease.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!outer.is_lost());
    // Outside the holder's scope: inside it, another client would fail at once rather than
    // wait for a lock its request holds.
    assert_held_against(&b, "doc:1", Duration::ZERO).await;
    outer.release().await.unwrap();
}

#[tokio::test]
async fn short_reentry_keeps_the_outer_hold_in_memory() {
    short_reentry_keeps_the_outer_hold(MemoryBackend::new()).await;
}

#[tokio::test]
async fn short_reentry_keeps_the_outer_hold_on_redis() {
    let server = RedisServer::start();
    short_reentry_keeps_the_outer_hold(
        support::redis_backend(server.url()).connect().await.unwrap(),
    )
    .await;
}

/// A re-entry that needs a longer lease than the grant has extends it first; the holder's
/// other guard is released while the extend is on its way. The grant must not end under the
/// re-entry: it waits for the extend, and the re-entered guard holds a renewed lock (renewed
/// with the longer lease), which its release then frees.
#[tokio::test(flavor = "current_thread")]
async fn an_extend_racing_the_release_of_the_other_hold_keeps_the_grant() {
    let backend = Gated::new(MemoryBackend::new());
    let lease = Lease::watchdog(Duration::from_millis(150));
    let a = client(backend.clone(), lease);
    let b = client(backend.clone(), lease);
    let holder = a.holder();
    let first = holder.clone().scope(a.lock("doc:2").acquire()).await.unwrap();
    let mut held = backend.hold_next(Call::Extend);
    let reentry = tokio::spawn(holder.scope({
        let a = a.clone();
        async move {
            let longer = Lease::watchdog(Duration::from_millis(300));
            a.lock("doc:2").lease(longer).acquire().await
        }
    }));
    held.arrived().await;
    first.release().await.unwrap();
    let reply = held.run().await;
    let _ = reply.send(());
    let second = reentry.await.unwrap().expect("the re-entry extends the grant");
    // A hold of the same grant, the other gone: nothing was deleted, nothing acquired anew.
    assert_eq!(second.hold_count(), 1);
    assert_eq!(backend.calls(Call::Release), 0, "the grant ended under the re-entry");
    assert_eq!(backend.calls(Call::Acquire), 1, "acquired afresh");
    // Several leases later: still renewed, still ours.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!second.is_lost());
    assert_held_against(&b, "doc:2", Duration::ZERO).await;
    second.release().await.unwrap();
    assert_eq!(a.active_keys(), 0);
    let next = b.lock("doc:2").try_acquire().await.expect("free");
    next.release().await.unwrap();
}

/// A re-entry dropped while its extend is on its way, after the holder's other guard was
/// released: the grant ends with it, and its one delete frees the lock at once, whatever the
/// extend did in the store.
#[tokio::test(flavor = "current_thread")]
async fn a_reentry_dropped_during_its_extend_ends_the_grant_it_kept() {
    let backend = Gated::new(MemoryBackend::new());
    let a = client(backend.clone(), Lease::DEFAULT);
    let b = client(backend.clone(), Lease::DEFAULT);
    let holder = a.holder();
    let first = holder.clone().scope(a.lock("doc:5").acquire()).await.unwrap();
    let mut held = backend.hold_next(Call::Extend);
    let reentry = tokio::spawn(holder.scope({
        let a = a.clone();
        async move { a.lock("doc:5").fencing().acquire().await }
    }));
    held.arrived().await;
    first.release().await.unwrap();
    assert_held_against(&b, "doc:5", Duration::ZERO).await;
    let _reply = held.run().await;
    reentry.abort();
    assert!(reentry.await.unwrap_err().is_cancelled());
    let next = b
        .lock("doc:5")
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .expect("the grant's delete frees the lock long before its 30 s lease");
    next.release().await.unwrap();
    assert_eq!(a.active_keys(), 0);
}

/// On Redis, a re-entry and the release of the holder's other guard at the same time: the
/// re-entry is a hold of the same grant (no round trip), and the re-entered guard holds a
/// renewed lock. (A lease long enough that a renewal delayed by a busy machine still lands in
/// time.)
#[tokio::test]
async fn reentry_racing_a_release_on_redis() {
    let server = RedisServer::start();
    let lease = Lease::watchdog(Duration::from_secs(2));
    let a = redis_client(&server, lease).await;
    let b = redis_client(&server, lease).await;
    for round in 0..10 {
        let key = format!("doc:{round}");
        let holder = a.holder();
        let second = holder
            .scope(async {
                let first = a.lock(&key).acquire().await.unwrap();
                let (second, released) = tokio::join!(a.lock(&key).acquire(), first.release());
                released.unwrap();
                second
            })
            .await
            .unwrap_or_else(|e| panic!("round {round}: {e:?}"));
        // The watchdog renews it: its deadline moves on before the lease runs out.
        let deadline = std::time::Instant::now() + second.remaining();
        support::eventually(lease.duration(), "the watchdog renewed the guard", || {
            std::time::Instant::now() + second.remaining() > deadline + lease.duration() / 10
        })
        .await;
        assert!(!second.is_lost(), "round {round}: the guard was lost");
        assert_held_against(&b, &key, Duration::ZERO).await;
        second.release().await.unwrap();
    }
    assert_eq!(a.active_keys(), 0);
}

/// A renewal on its way when its guard was released comes back "not held". That is about the
/// grant that ended: it must neither report a loss nor free the grant the same holder took
/// anew meanwhile.
#[tokio::test(flavor = "current_thread")]
async fn stale_renewal_does_not_free_a_newer_hold() {
    let backend = Gated::new(MemoryBackend::new());
    let lease = Lease::watchdog(Duration::from_millis(150));
    let a = client(backend.clone(), lease);
    let b = client(backend.clone(), lease);
    let holder = a.holder();
    let mut held = backend.hold_next(Call::Renew);
    let first = holder.clone().scope(a.lock("doc:3").acquire()).await.unwrap();
    held.arrived().await;
    first.release().await.unwrap();
    // The renewal reaches the store after the release: nothing to renew.
    let reply = held.run().await;
    let again = holder.scope(a.lock("doc:3").acquire()).await.unwrap();
    // Its reply arrives after the holder took the lock anew.
    let _ = reply.send(());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!again.is_lost());
    assert_held_against(&b, "doc:3", Duration::from_millis(100)).await;
    again.release().await.unwrap();
}

/// A release that reaches the store after the grant's lease ran out there, when the same holder
/// has taken the lock anew meanwhile: it names the grant it ends, so it frees nothing of the
/// new one. Every kind of lock.
#[tokio::test(flavor = "current_thread")]
async fn late_release_does_not_free_a_newer_hold() {
    for kind in KINDS {
        let backend = Gated::new(MemoryBackend::new());
        let lease = Lease::fixed(Duration::from_millis(100));
        let a = client(backend.clone(), lease);
        let b = client(backend.clone(), lease);
        let key = format!("doc:late:{kind}");
        let holder = a.holder();
        let first = hold(&a, &key, kind, &holder).await;
        let mut held = backend.hold_next(Call::Release);
        let release = tokio::spawn(first.release());
        held.arrived().await;
        // The lease runs out in the store while the release is on its way.
        tokio::time::sleep(Duration::from_millis(150)).await;
        let again = request(&a, &key, kind)
            .holder(&holder)
            .lease(Lease::fixed(Duration::from_secs(10)))
            .acquire()
            .await
            .unwrap();
        let _ = held.run().await.send(());
        let _ = release.await.unwrap();
        assert!(!again.is_lost(), "{kind}");
        // Another holder's write (or permit) is refused: the new hold is still there.
        assert_refused_to(&b, &key, kind).await;
        again.release().await.unwrap();
    }
}

/// A holder belongs to the client that made it: another client refuses it as an explicit
/// holder (it would be a second grant of one holder), takes nothing, and the lock stays held
/// by the first client until its release. Every kind of lock.
#[tokio::test(flavor = "current_thread")]
async fn another_clients_holder_is_refused_and_takes_nothing() {
    for kind in KINDS {
        let store = MemoryBackend::new();
        let (a, b, c) = (
            client(store.clone(), Lease::DEFAULT),
            client(store.clone(), Lease::DEFAULT),
            client(store, Lease::DEFAULT),
        );
        let key = format!("doc:joined:{kind}");
        let holder = a.holder();
        let first = hold(&a, &key, kind, &holder).await;
        let joined = request(&b, &key, kind).holder(&holder).try_acquire().await;
        assert!(matches!(joined, Err(LockError::ForeignHolder)), "{kind}: {joined:?}");
        assert_eq!(b.active_keys(), 0, "{kind}");
        assert_refused_to(&c, &key, kind).await;
        first.release().await.unwrap();
        assert_free_for(&c, &key, kind).await;
    }
}

/// The inner guard of a re-entered hold is dropped (its release left to a task) and the outer
/// one released at once: both releases succeed and the lock is free.
#[tokio::test(flavor = "current_thread")]
async fn two_releases_of_one_hold_close_together_both_succeed() {
    for kind in KINDS {
        let backend = Gated::new(MemoryBackend::new());
        let (a, b) = (client(backend.clone(), Lease::DEFAULT), client(backend, Lease::DEFAULT));
        let key = format!("doc:twice:{kind}");
        let holder = a.holder();
        let outer = hold(&a, &key, kind, &holder).await;
        let inner = hold(&a, &key, kind, &holder).await;
        drop(inner);
        outer.release().await.expect("the outer release succeeds");
        let free = request(&b, &key, kind).wait(Duration::from_secs(1)).acquire().await;
        free.expect("free once both are released").release().await.unwrap();
    }
}

/// How long the re-entries of the next two tests ask the store to keep the lock: far longer
/// than the tests wait for it to be free.
const LONG_REENTRY: Duration = Duration::from_secs(20);

/// Takes `key` as the kind `kind` is refused to (a read hold: the write side) through `other`
/// within `wait`, and releases it.
async fn free_within<B: Backend>(other: &LockClient<B>, key: &str, kind: &str, wait: Duration) {
    let kind = if kind == "read" { "write" } else { kind };
    request(other, key, kind)
        .wait(wait)
        .acquire()
        .await
        .unwrap_or_else(|error| panic!("{kind}: still held after its holder lost it: {error:?}"))
        .release()
        .await
        .expect("released");
}

/// A hold of `key` with a 300 ms fixed lease by a client `a`, and its re-entry with a long
/// lease, whose extend of the grant the store has run and whose reply is held back until the
/// returned sender is used (or dropped); `b` is a second client on the same store.
async fn reentry_held_in_the_store<B: Store + Clone>(
    backend: &Gated<B>,
    key: &str,
    kind: &'static str,
) -> HeldReentry<Gated<B>> {
    let (a, b) = (client(backend.clone(), Lease::DEFAULT), client(backend.clone(), Lease::DEFAULT));
    let holder = a.holder();
    let outer = request(&a, key, kind)
        .holder(&holder)
        .lease(Lease::fixed(Duration::from_millis(300)))
        .acquire()
        .await
        .unwrap();
    let mut held = backend.hold_next(Call::Extend);
    let reentry = tokio::spawn({
        let (a, key, holder) = (a.clone(), key.to_owned(), holder.clone());
        async move {
            let request = request(&a, &key, kind).holder(&holder);
            request.lease(Lease::fixed(LONG_REENTRY)).acquire().await
        }
    });
    held.arrived().await;
    let reply = held.run().await;
    HeldReentry { a, b, outer, reentry, reply }
}

/// What [`reentry_held_in_the_store`] set up.
struct HeldReentry<B: Backend> {
    a: LockClient<B>,
    b: LockClient<B>,
    outer: LockGuard<B>,
    reentry: tokio::task::JoinHandle<Result<LockGuard<B>, LockError>>,
    reply: oneshot::Sender<()>,
}

/// A re-entry with a long lease, whose extend the store ran before the grant's fixed lease
/// ended but answered after the holder's deadline: the grant was reported lost, and its client
/// deletes it, so the store does not keep it for the re-entry's lease. The re-entry reports the
/// loss too, and the lock is free long before that lease ends. Every kind of lock.
async fn reentry_answered_after_the_deadline<B: Store + Clone>(backend: Gated<B>) {
    for kind in KINDS {
        let key = format!("doc:late-reentry:{kind}");
        let HeldReentry { a, b, outer, reentry, reply } =
            reentry_held_in_the_store(&backend, &key, kind).await;
        outer.lost().await;
        let _ = reply.send(());
        let reentered = reentry.await.unwrap();
        assert!(
            matches!(reentered, Err(LockError::Lost)),
            "{kind}: the re-entry of a lost hold: {reentered:?}"
        );
        assert!(matches!(outer.release().await, Err(LockError::Lost)), "{kind}");
        free_within(&b, &key, kind, LONG_REENTRY / 4).await;
        assert_eq!(a.active_keys(), 0, "{kind}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_reentry_answered_after_the_deadline_leaves_nothing_held() {
    reentry_answered_after_the_deadline(Gated::new(MemoryBackend::new())).await;
}

#[tokio::test]
async fn a_reentry_answered_after_the_deadline_leaves_nothing_held_on_redis() {
    let server = RedisServer::start();
    let backend = support::redis_backend(server.url()).connect().await.unwrap();
    reentry_answered_after_the_deadline(Gated::new(backend)).await;
}

/// A re-entry with a long lease dropped after the store extended the grant for it, which leaves
/// its lease in the store; once the grant's fixed lease ends and the holder hears the lock was
/// lost, its client deletes the grant, so the store does not keep it for the dropped
/// re-entry's lease. Every kind of lock.
async fn undone_reentry_of_a_lost_hold<B: Store + Clone>(backend: Gated<B>) {
    for kind in KINDS {
        let key = format!("doc:undone-reentry:{kind}");
        let HeldReentry { a: _a, b, outer, reentry, reply: _reply } =
            reentry_held_in_the_store(&backend, &key, kind).await;
        // Dropped while its reply is on its way: undone in the background.
        reentry.abort();
        assert!(reentry.await.unwrap_err().is_cancelled());
        outer.lost().await;
        assert!(matches!(outer.release().await, Err(LockError::Lost)), "{kind}");
        free_within(&b, &key, kind, LONG_REENTRY / 4).await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn an_undone_reentry_leaves_nothing_held_once_the_hold_is_lost() {
    undone_reentry_of_a_lost_hold(Gated::new(MemoryBackend::new())).await;
}

#[tokio::test]
async fn an_undone_reentry_leaves_nothing_held_once_the_hold_is_lost_on_redis() {
    let server = RedisServer::start();
    let backend = support::redis_backend(server.url()).connect().await.unwrap();
    undone_reentry_of_a_lost_hold(Gated::new(backend)).await;
}

/// A release whose reply is lost (the server froze past the command timeout) is sent again
/// once the server answers, instead of leaving the lock for the rest of its 30 s lease.
#[tokio::test]
async fn release_whose_reply_was_lost_is_retried() {
    let server = RedisServer::start();
    let backend = support::redis_backend(server.url())
        .command_timeout(Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    let a = client(backend, Lease::DEFAULT);
    let b = client(support::redis_backend(server.url()).connect().await.unwrap(), Lease::DEFAULT);
    let guard = a.lock("doc:4").acquire().await.unwrap();
    server.pause();
    let release = tokio::spawn(guard.release());
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.resume();
    let _ = release.await.unwrap();
    let again = b
        .lock("doc:4")
        .wait(Duration::from_secs(3))
        .acquire()
        .await
        .expect("the release went through once the server answered");
    again.release().await.unwrap();
}

/// A release that found no pooled connection within the command timeout (nothing was sent)
/// is sent again: with one connection and 64 tasks on their own keys, every task's next
/// acquire of its key gets it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_without_a_connection_is_retried() {
    let server = RedisServer::start();
    let backend = support::redis_backend(server.url())
        .pool_size(1)
        .command_timeout(Duration::from_millis(20))
        .connect()
        .await
        .unwrap();
    let locks = client(backend, Lease::DEFAULT);
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..64 {
        let locks = locks.clone();
        tasks.spawn(async move {
            let key = format!("task:{task}");
            let mut strays = 0;
            for _ in 0..20 {
                match locks.lock(&key).wait(Duration::from_secs(2)).acquire().await {
                    Ok(guard) => drop(guard),
                    // Acquires may fail for want of a connection; none may find the key
                    // still taken by this task's own earlier hold.
                    Err(LockError::WaitTimeout { .. }) => strays += 1,
                    Err(_) => {}
                }
            }
            strays
        });
    }
    let mut strays = 0;
    while let Some(joined) = tasks.join_next().await {
        strays += joined.unwrap();
    }
    assert_eq!(strays, 0, "acquires found the task's own released lock still held");
}

/// The uncontended path costs one round trip to acquire and one to release: 100 pairs on
/// distinct keys send 100 `SET NX` and 100 `EVALSHA` and nothing else. (Each release publishes
/// from inside its script: nobody records whether someone waits.)
#[tokio::test]
async fn uncontended_pairs_cost_one_call_each() {
    let server = RedisServer::start();
    let locks =
        client(support::redis_backend(server.url()).connect().await.unwrap(), Lease::DEFAULT);
    // Warm: scripts cached, the connection made.
    locks.lock("warm").acquire().await.unwrap().release().await.unwrap();
    server.cmd(&["CONFIG", "RESETSTAT"]);
    for pair in 0..100 {
        let guard = locks.lock(format!("pair:{pair}")).acquire().await.unwrap();
        guard.release().await.unwrap();
    }
    let stats = server.info("commandstats").expect("INFO commandstats");
    let mut calls: Vec<(String, u64)> = stats
        .lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let count = rest.strip_prefix("calls=")?.split(',').next()?.parse().ok()?;
            Some((name.to_owned(), count))
        })
        .filter(|(name, _)| !matches!(name.as_str(), "info" | "config|resetstat"))
        .collect();
    calls.sort();
    println!("commands per 100 pairs, those run inside the scripts included: {calls:?}");
    // What the release script runs inside Redis is counted too; from the client come one
    // `SET NX` per acquire and one `EVALSHA` per release.
    assert!(calls.contains(&("publish".to_owned(), 100)), "one publish per release: {calls:?}");
    let inside_scripts = ["del", "get", "publish"];
    calls.retain(|(name, _)| !inside_scripts.contains(&name.as_str()));
    assert_eq!(calls, [("evalsha".to_owned(), 100), ("set".to_owned(), 100)]);
}

/// A lock key overwritten with a string that is not a lock while held: the renewal batch that
/// meets it reports that lock lost, and renews the others it carries as usual.
#[tokio::test]
async fn a_foreign_key_in_a_renewal_batch_loses_only_its_lock() {
    foreign_key_in_a_renewal_batch("redis.call('SET', KEYS[1], 'foreign')").await;
}

/// The same with a value of another type (a list), which the batch's read of the single holds
/// passes over: that lock alone is reported lost.
#[tokio::test]
async fn a_key_of_another_type_in_a_renewal_batch_loses_only_its_lock() {
    foreign_key_in_a_renewal_batch("redis.call('DEL', KEYS[1]) redis.call('RPUSH', KEYS[1], 'x')")
        .await;
}

/// Holds three locks in one client, overwrites the second's key with the script `overwrite`
/// (its `KEYS[1]`: in one step, so no renewal sees the key missing), and checks that only that
/// one is lost.
async fn foreign_key_in_a_renewal_batch(overwrite: &str) {
    let server = RedisServer::start();
    let lease = Lease::watchdog(Duration::from_millis(300));
    let a = redis_client(&server, lease).await;
    let b = redis_client(&server, lease).await;
    let mut guards = Vec::new();
    for key in ["k1", "k2", "k3"] {
        guards.push(a.lock(key).acquire().await.unwrap());
    }
    let name = guards[1].key().as_str().to_owned();
    server.cmd(&["EVAL", overwrite, "1", &name]);
    tokio::time::timeout(Duration::from_secs(2), guards[1].lost())
        .await
        .expect("the overwritten lock is reported lost");
    tokio::time::sleep(Duration::from_millis(600)).await;
    for (guard, key) in [(&guards[0], "k1"), (&guards[2], "k3")] {
        assert!(!guard.is_lost(), "{key} was renewed");
        assert_held_against(&b, key, Duration::ZERO).await;
    }
}

/// 256 tasks, each on its own key, with the default pool: no acquire or release fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_errors_at_256_tasks() {
    let server = RedisServer::start();
    let locks =
        client(support::redis_backend(server.url()).connect().await.unwrap(), Lease::DEFAULT);
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..256 {
        let locks = locks.clone();
        tasks.spawn(async move {
            let mut errors = Vec::new();
            for _ in 0..20 {
                match locks.lock(format!("task:{task}")).acquire().await {
                    Ok(guard) => {
                        if let Err(error) = guard.release().await {
                            errors.push(format!("release: {error}"));
                        }
                    }
                    Err(error) => errors.push(format!("acquire: {error}")),
                }
            }
            errors
        });
    }
    let mut errors = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        errors.extend(joined.unwrap());
    }
    assert!(errors.is_empty(), "{} errors, e.g. {:?}", errors.len(), errors.first());
}

/// How many connections the server has subscribed to the release channel of `key`.
fn subscribers(server: &RedisServer, key: &str) -> i64 {
    let channel = format!("tower-lock:{{{key}}}:released");
    match server.cmd(&["PUBSUB", "NUMSUB", &channel]) {
        support::RespValue::Array(Some(items)) if items.len() == 2 => items[1].as_int(),
        other => panic!("unexpected PUBSUB NUMSUB reply: {other:?}"),
    }
}

/// Starts an acquire of `key` by `client` that waits up to 20 s (and then gives the lock
/// back), and returns it once it listens for releases: it was refused once before it
/// subscribed.
async fn waiting(
    server: &RedisServer,
    client: &LockClient<RedisBackend>,
    key: &'static str,
) -> tokio::task::JoinHandle<Result<(), LockError>> {
    let client = client.clone();
    let waiter = tokio::spawn(async move {
        let guard = client.lock(key).wait(Duration::from_secs(20)).acquire().await?;
        guard.release().await
    });
    while subscribers(server, key) == 0 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    waiter
}

/// Asserts that `waiter` gets its lock within 2 s: woken by a release, not by a 30 s lease
/// running out.
async fn assert_woken(waiter: tokio::task::JoinHandle<Result<(), LockError>>) {
    tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .expect("the waiter is woken by the release")
        .unwrap()
        .expect("the waiter gets the lock");
}

/// A lock taken by a client's first `SET NX` (the owner record) and released while a client
/// elsewhere waits: the release publishes, and the waiter is woken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_of_a_single_hold_wakes_waiters_elsewhere() {
    let server = RedisServer::start();
    let a = redis_client(&server, Lease::DEFAULT).await;
    let b = redis_client(&server, Lease::DEFAULT).await;
    let held = a.lock("one").acquire().await.unwrap();
    let waiter = waiting(&server, &b, "one").await;
    held.release().await.unwrap();
    assert_woken(waiter).await;
}

/// A lock handed to a waiter of the same client while a client elsewhere also waits: the next
/// release still publishes (nobody records whether someone waits), and wakes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_keeps_waiters_elsewhere_listening() {
    let server = RedisServer::start();
    let a = redis_client(&server, Lease::DEFAULT).await;
    let b = redis_client(&server, Lease::DEFAULT).await;
    let held = a.lock("two").acquire().await.unwrap();
    let remote = waiting(&server, &b, "two").await;
    let local = {
        let a = a.clone();
        tokio::spawn(async move { a.lock("two").wait(Duration::from_secs(20)).acquire().await })
    };
    while a.waiters() != 1 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    held.release().await.unwrap();
    let handed = tokio::time::timeout(Duration::from_secs(2), local)
        .await
        .expect("handed off at once")
        .unwrap()
        .expect("the local waiter gets the lock");
    assert!(!remote.is_finished(), "the lock went to the local waiter");
    handed.release().await.unwrap();
    assert_woken(remote).await;
}

/// An owner record whose attempt was given up on (its `SET NX` reached the server after the
/// caller had recorded it as void) belongs to nobody: the next acquire takes it at once. A
/// record that was not given up on stays held.
#[tokio::test]
async fn a_record_given_up_on_is_taken_by_the_next_acquire() {
    let server = RedisServer::start();
    let b = redis_client(&server, Lease::DEFAULT).await;
    let attempt = "gone:0#7";
    server.cmd(&["SET", "tower-lock:{kept}", attempt, "PX", "30000"]);
    assert_held_against(&b, "kept", Duration::ZERO).await;

    server.cmd(&["SET", "tower-lock:{void}", attempt, "PX", "30000"]);
    server.cmd(&["SADD", "tower-lock:{void}:void", attempt]);
    let guard = b.lock("void").try_acquire().await.expect("taken over");
    guard.release().await.unwrap();
}

/// A waiter's later attempts go straight to the acquire script: only its first try is a
/// `SET NX` meant for a free lock, so a retry never pays a refused `SET` before the script.
/// (`SET` counts the script's own too: the grant it writes once the waiter is woken.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_first_try_is_a_set() {
    let server = RedisServer::start();
    let a = redis_client(&server, Lease::DEFAULT).await;
    let b = redis_client(&server, Lease::DEFAULT).await;
    let held = a.lock("three").acquire().await.unwrap();
    server.cmd(&["CONFIG", "RESETSTAT"]);
    let waiter = waiting(&server, &b, "three").await;
    held.release().await.unwrap();
    assert_woken(waiter).await;
    let stats = server.info("commandstats").expect("INFO commandstats");
    assert_eq!(
        support::command_calls(&stats, "set"),
        2,
        "the waiter's first try and its grant only: {stats}"
    );
}

/// An acquire of a key unused in its client tries the store before it queues. A second task of
/// that client arriving during the attempt waits for it, and when the attempt finds the lock
/// held elsewhere, the first task still goes first: it joins ahead of the one that came later.
#[tokio::test(flavor = "current_thread")]
async fn a_first_try_that_finds_the_lock_held_keeps_its_turn() {
    let backend = Gated::new(MemoryBackend::new());
    let a = client(backend.clone(), Lease::DEFAULT);
    let b = client(backend.clone(), Lease::DEFAULT);
    let elsewhere = b.lock("turn").acquire().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let task = |name: &'static str| {
        let (a, order) = (a.clone(), order.clone());
        tokio::spawn(async move {
            let guard = a
                .lock("turn")
                .wait(Duration::from_secs(5))
                .acquire()
                .await
                .expect("acquired within the wait");
            order.lock().unwrap_or_else(PoisonError::into_inner).push(name);
            guard.release().await.unwrap();
        })
    };
    let mut held = backend.hold_next(Call::Acquire);
    let first = task("first");
    held.arrived().await;
    // The first task's attempt is at the store's door (not queued); the second arrives and
    // queues.
    let second = task("second");
    while a.waiters() < 1 {
        tokio::task::yield_now().await;
    }
    let reply = held.run().await;
    reply.send(()).unwrap();
    elsewhere.release().await.unwrap();
    first.await.unwrap();
    second.await.unwrap();
    assert_eq!(*order.lock().unwrap_or_else(PoisonError::into_inner), ["first", "second"]);
}
