//! Replies lost on their way back, with the undo of the attempt failing too: a re-entry's
//! extend whose reply was lost, a hand-off whose outcome is unknown, the release of a grant
//! whose reply was lost, an attempt the store gave back and voided. None of them may grant a
//! lock twice or strand it.
//!
//! [`Lossy`] wraps a store (in memory, or a real Redis) and turns the next matching call into a
//! chosen fault: applied with its reply lost, not applied at all, or refused for want of a
//! connection. One Redis test has a real fault instead: a server frozen with SIGSTOP while the
//! command is on the wire, so it runs once the server resumes, after the client gave up
//! waiting for its reply.

use crate::support::{self, forward_to_inner};

use std::{
    collections::HashSet,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use support::{
    RedisServer,
    kinds::{KINDS, assert_free_for, hold, request},
};
use tokio::sync::watch;
use tower_lock::{
    Backend, BackendError, Lease, LockClient, LockError, MemoryBackend,
    backend::store::{AcquireReply, Extend, ExtendReply, Grant, Release, ReleaseReply, Store},
    error::BackendErrorKind,
};

/// Faults armed for the next matching calls (each counter is how many calls to hit).
#[derive(Default)]
struct Faults {
    /// Extends (a re-entry that needs more than its grant has): applied, then answered with
    /// a timeout.
    extend_reply_lost: AtomicU32,
    /// Releases with a hand-off: not applied, answered with a timeout.
    handoff_unanswered: AtomicU32,
    /// Releases without a hand-off: applied, then answered with a timeout.
    release_reply_lost: AtomicU32,
    /// Releases without a hand-off: applied, then the connection drops.
    release_connection_dropped: AtomicU32,
    /// Releases without a hand-off: not applied, answered with a timeout.
    release_unanswered: AtomicU32,
    /// Releases without a hand-off: refused, as if no connection could be had.
    release_refused: AtomicU32,
    /// Undos of an attempt: refused, as if no connection could be had.
    abandon_refused: AtomicU32,
    /// Acquires: not applied; the attempt is given back and answered `Spent`, as a Redlock
    /// round that lost its vote is. Like a node that voided it, the store refuses the attempt
    /// from then on.
    acquire_spent: AtomicU32,
    /// Acquires that granted: answered with a timeout.
    grant_reply_lost: AtomicU32,
    /// The attempts spent so far.
    spent: Mutex<HashSet<String>>,
}

/// Takes one of the calls `counter` arms, if any.
fn hit(counter: &AtomicU32) -> bool {
    counter.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
}

fn timeout() -> BackendError {
    BackendError::from_kind(BackendErrorKind::Timeout)
}

/// A store with [`Faults`], counting the undos that reached it. Every release goes through
/// [`Store::release`] (it does not answer at once), so the faults meet the in-memory store's
/// releases too.
#[derive(Clone)]
struct Lossy<B = MemoryBackend> {
    inner: B,
    faults: Arc<Faults>,
    abandons: Arc<watch::Sender<u32>>,
}

impl Lossy {
    fn new() -> Self {
        Self::over(MemoryBackend::new())
    }
}

impl<B: Store> Lossy<B> {
    fn over(inner: B) -> Self {
        Self { inner, faults: Arc::default(), abandons: Arc::new(watch::channel(0).0) }
    }

    /// Waits until `n` undos (refused or not) have been tried.
    async fn abandons_tried(&self, n: u32) {
        let mut seen = self.abandons.subscribe();
        seen.wait_for(|tried| *tried >= n).await.expect("sender kept");
    }
}

type BackendResult<T> = Result<T, BackendError>;

impl<B: Store> Store for Lossy<B> {
    type Listener = B::Listener;

    async fn acquire(&self, grant: Grant<'_>) -> BackendResult<AcquireReply> {
        let spent = || AcquireReply::Spent { ttl: Some(Duration::from_millis(10)) };
        if self.faults.spent.lock().unwrap().contains(grant.attempt) {
            return Ok(spent());
        }
        if hit(&self.faults.acquire_spent) {
            self.abandon(grant).await?;
            let mut attempts = self.faults.spent.lock().unwrap();
            attempts.insert(grant.attempt.to_owned());
            return Ok(spent());
        }
        let reply = self.inner.acquire(grant).await;
        let granted = matches!(reply, Ok(AcquireReply::Acquired { .. }));
        if granted && hit(&self.faults.grant_reply_lost) {
            return Err(timeout());
        }
        reply
    }

    async fn extend(&self, extend: Extend<'_>) -> BackendResult<ExtendReply> {
        let reply = self.inner.extend(extend).await;
        if hit(&self.faults.extend_reply_lost) {
            return Err(timeout());
        }
        reply
    }

    async fn release(&self, release: Release<'_>) -> BackendResult<ReleaseReply> {
        if release.handoff.is_some() && hit(&self.faults.handoff_unanswered) {
            return Err(timeout());
        }
        let plain = release.handoff.is_none();
        if plain && hit(&self.faults.release_unanswered) {
            return Err(timeout());
        }
        if plain && hit(&self.faults.release_refused) {
            return Err(BackendError::from_kind(BackendErrorKind::Unavailable));
        }
        let reply = self.inner.release(release).await;
        if plain && hit(&self.faults.release_reply_lost) {
            return Err(timeout());
        }
        if plain && hit(&self.faults.release_connection_dropped) {
            return Err(BackendError::from_kind(BackendErrorKind::Interrupted));
        }
        reply
    }

    forward_to_inner!(renew, leave, listen, inspect, force_unlock);

    async fn abandon(&self, grant: Grant<'_>) -> BackendResult<bool> {
        let refused = hit(&self.faults.abandon_refused);
        let reply = match refused {
            true => Err(BackendError::from_kind(BackendErrorKind::Unavailable)),
            false => self.inner.abandon(grant).await,
        };
        self.abandons.send_modify(|tried| *tried += 1);
        reply
    }
}

fn client<B: Backend>(backend: B) -> LockClient<B> {
    client_with(backend, Lease::DEFAULT)
}

fn client_with<B: Backend>(backend: B, lease: Lease) -> LockClient<B> {
    LockClient::builder(backend).lease(lease).build().expect("a valid configuration")
}

/// Asserts that `other` cannot take `key` within `wait`: somebody holds it all along.
async fn assert_held_against<B: Backend>(other: &LockClient<B>, key: &str, wait: Duration) {
    match other.lock(key).wait(wait).acquire().await {
        Err(LockError::WaitTimeout { .. }) => {}
        Ok(guard) => panic!("another client took {key} while it was held: {guard:?}"),
        Err(error) => panic!("unexpected error: {error:?}"),
    }
}

/// Asserts that `other` takes `key` within `wait` (a release wakes it): nothing strands it.
async fn assert_free_within<B: Backend>(other: &LockClient<B>, key: &str, wait: Duration) {
    let guard =
        other.lock(key).wait(wait).acquire().await.unwrap_or_else(|error| {
            panic!("{key} stayed held after its last guard went: {error:?}")
        });
    guard.release().await.expect("released");
}

/// A hand-off whose outcome is unknown, and whose undo cannot be sent at once: the waiter goes
/// back to the head of the queue and acquires under a new attempt, so the undo, when it gets
/// through, cannot free the lock the waiter then holds.
#[tokio::test]
async fn a_waiter_put_back_after_an_unknown_hand_off_keeps_what_it_acquires() {
    let backend = Lossy::new();
    let locks = client(backend.clone());
    let other = client(backend.inner.clone());
    let holding = locks.lock("doc").acquire().await.unwrap();
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.lock("doc").wait(Duration::from_secs(5)).acquire().await })
    };
    while locks.waiters() == 0 {
        tokio::task::yield_now().await;
    }
    backend.faults.handoff_unanswered.store(1, Ordering::SeqCst);
    backend.faults.abandon_refused.store(1, Ordering::SeqCst);
    holding.release().await.expect("released after a retry");
    let guard = waiter.await.unwrap().expect("the waiter acquires");
    // The undo refused at once is sent again in the background: let it through.
    backend.abandons_tried(2).await;
    assert!(!guard.is_lost());
    assert_held_against(&other, "doc", Duration::ZERO).await;
    guard.release().await.expect("released");
    assert_free_within(&other, "doc", Duration::from_secs(1)).await;
}

/// An attempt the store gave back and voided (a lost Redlock round) is not sent again: the
/// store would refuse it for a lease. The next try carries a new attempt id and gets the free
/// lock.
#[tokio::test]
async fn a_spent_attempt_is_not_sent_again() {
    let backend = Lossy::new();
    let locks = client(backend.clone());
    backend.faults.acquire_spent.store(1, Ordering::SeqCst);
    let guard = locks
        .lock("doc")
        .wait(Duration::from_secs(2))
        .acquire()
        .await
        .expect("the next try acquires the free lock");
    assert_eq!(*backend.abandons.borrow(), 1, "the spent attempt was given back");
    guard.release().await.expect("released");
}

/// A fair lock granted to the head of its queue, with the grant's reply lost: the grant is
/// undone, and the undo wakes the next waiter in the queue (each fair waiter listens for its
/// own turn only). Without that wake-up the next waiter would sleep until its place's next
/// refresh, 10 s here, or the first holder's lease.
#[tokio::test]
async fn an_undone_fair_grant_wakes_the_next_waiter() {
    undone_fair_grant_wakes_the_next_waiter(MemoryBackend::new()).await;
}

/// The same on Redis.
#[tokio::test]
async fn an_undone_fair_grant_on_redis_wakes_the_next_waiter() {
    let server = RedisServer::start();
    let backend = support::redis_backend(server.url()).connect().await.unwrap();
    undone_fair_grant_wakes_the_next_waiter(backend).await;
}

async fn undone_fair_grant_wakes_the_next_waiter<B: Store + Clone>(store: B) {
    fn patient<B: Backend>(backend: B) -> LockClient<B> {
        LockClient::builder(backend)
            .waiter_timeout(Duration::from_secs(30))
            .build()
            .expect("a valid configuration")
    }
    let backend = Lossy::over(store.clone());
    let (holding, first, next) = (client(store.clone()), patient(backend.clone()), patient(store));
    let held = holding.fair_lock("doc").acquire().await.unwrap();
    let wait = Duration::from_secs(3);
    let first_waiter = {
        let first = first.clone();
        tokio::spawn(async move { first.fair_lock("doc").wait(wait).acquire().await })
    };
    while first.queued() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let next_waiter = {
        let next = next.clone();
        tokio::spawn(async move { next.fair_lock("doc").wait(wait).acquire().await })
    };
    while next.queued() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    backend.faults.grant_reply_lost.store(1, Ordering::SeqCst);
    held.release().await.expect("released");
    let lost = first_waiter.await.unwrap();
    // It hears that the reply was lost, or, trying again within its wait, finds the next
    // waiter holding the lock.
    assert!(
        matches!(&lost, Err(LockError::Backend(error)) if error.is_timeout())
            || matches!(&lost, Err(LockError::WaitTimeout { .. })),
        "the first waiter hears that the reply was lost: {lost:?}"
    );
    let guard = next_waiter.await.unwrap().expect("the next waiter is woken by the undo");
    guard.release().await.expect("released");
}

/// A re-entered hold's release stays in the client (the store keeps one record for the
/// grant), and the last hold's release, whose reply was lost, is sent again: the caller hears
/// it released and the lock is free.
#[tokio::test]
async fn the_last_release_with_its_reply_lost_is_sent_again() {
    last_release_fails(|faults| &faults.release_reply_lost).await;
}

/// The same when the connection drops after the release ran.
#[tokio::test]
async fn the_last_release_with_its_connection_dropped_is_sent_again() {
    last_release_fails(|faults| &faults.release_connection_dropped).await;
}

/// The same when the release never ran.
#[tokio::test]
async fn the_last_release_that_never_ran_is_sent_again() {
    last_release_fails(|faults| &faults.release_unanswered).await;
}

async fn last_release_fails(fault: impl Fn(&Faults) -> &AtomicU32) {
    let backend = Lossy::new();
    let locks = client(backend.clone());
    let other = client(backend.inner.clone());
    let holder = locks.holder();
    let outer = locks.lock("doc").holder(&holder).acquire().await.unwrap();
    let inner = locks.lock("doc").holder(&holder).acquire().await.unwrap();
    assert_eq!(inner.hold_count(), 2);
    fault(&backend.faults).store(1, Ordering::SeqCst);
    inner.release().await.expect("an inner release needs no store");
    assert_eq!(
        fault(&backend.faults).load(Ordering::SeqCst),
        1,
        "the inner release reached the store"
    );
    assert!(!outer.is_lost());
    assert_held_against(&other, "doc", Duration::ZERO).await;
    outer.release().await.expect("released on the second try");
    assert_eq!(fault(&backend.faults).load(Ordering::SeqCst), 0, "the last release met the fault");
    assert_free_within(&other, "doc", Duration::from_secs(1)).await;
}

/// A holder belongs to the client that made it: another client refuses it, whatever the kind,
/// and takes nothing. The grant's release, refused for want of a connection, is sent again and
/// frees the lock.
#[tokio::test]
async fn a_foreign_holder_is_refused_and_a_refused_release_is_sent_again() {
    for kind in KINDS {
        let store = MemoryBackend::new();
        let backend = Lossy::over(store.clone());
        let (first, foreign, other) =
            (client(backend.clone()), client(store.clone()), client(store));
        let holder = first.holder();
        let held = hold(&first, "doc", kind, &holder).await;
        let refused = request(&foreign, "doc", kind).holder(&holder).try_acquire().await;
        assert!(
            matches!(refused, Err(LockError::ForeignHolder)),
            "{kind}: another client's holder: {refused:?}"
        );
        support::kinds::assert_refused_to(&other, "doc", kind).await;
        backend.faults.release_refused.store(1, Ordering::SeqCst);
        held.release().await.expect("released on the second try");
        assert_eq!(backend.faults.release_refused.load(Ordering::SeqCst), 0);
        assert_free_for(&other, "doc", kind).await;
    }
}

/// A re-entry that asks for a fencing token the grant lacks extends the grant first; with the
/// extend's reply lost, the re-entry fails and the outer guard keeps the lock. The next
/// re-entry extends again and gets the token, no undo is sent (an extend names the grant, and
/// its lease is the grant's to cover), and the last release frees the lock at once, though
/// the lost extend may have lengthened the record.
#[tokio::test]
async fn a_reentry_whose_extend_reply_was_lost_fails_alone() {
    let backend = Lossy::new();
    let locks = client(backend.clone());
    let other = client(backend.inner.clone());
    let holder = locks.holder();
    let outer = locks.lock("doc").holder(&holder).acquire().await.unwrap();
    assert_eq!(outer.fencing_token(), None);
    backend.faults.extend_reply_lost.store(1, Ordering::SeqCst);
    let lost = locks.lock("doc").holder(&holder).fencing().acquire().await;
    assert!(matches!(&lost, Err(LockError::Backend(error)) if error.is_timeout()), "{lost:?}");
    assert!(!outer.is_lost());
    assert_held_against(&other, "doc", Duration::ZERO).await;
    let inner = locks
        .lock("doc")
        .holder(&holder)
        .fencing()
        .acquire()
        .await
        .expect("the next re-entry extends the grant");
    assert!(inner.fencing_token().is_some());
    assert_eq!(inner.hold_count(), 2);
    assert_eq!(*backend.abandons.borrow(), 0, "an extend is never undone");
    inner.release().await.expect("released");
    outer.release().await.expect("released");
    assert_free_within(&other, "doc", Duration::from_secs(1)).await;
}

/// On Redis: a re-entered hold's release needs no store, so it returns while the server is
/// frozen and the outer guard keeps the lock. The last release, on its way while the server
/// is frozen, is sent again once it answers, and the lock is free.
#[tokio::test]
async fn a_release_on_a_frozen_redis_is_sent_again_once_it_answers() {
    let server = RedisServer::start();
    let backend = support::redis_backend(server.url())
        .command_timeout(Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    let lease = Lease::watchdog(Duration::from_secs(2));
    let locks = client_with(backend, lease);
    let other = client_with(support::redis_backend(server.url()).connect().await.unwrap(), lease);
    let holder = locks.holder();
    let outer = locks.lock("doc").holder(&holder).acquire().await.unwrap();
    let inner = locks.lock("doc").holder(&holder).acquire().await.unwrap();
    server.pause();
    let released = inner.release().await;
    server.resume();
    released.expect("an inner release needs no store");
    assert!(!outer.is_lost());
    // Long enough for a stray release to arrive, had one been sent.
    assert_held_against(&other, "doc", Duration::from_millis(1500)).await;
    server.pause();
    let release = tokio::spawn(outer.release());
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.resume();
    // Released at once, or (on a machine slow enough that the inline retries ran out) the
    // caller heard of the timeout and the retries went on in the background.
    let released = release.await.unwrap();
    assert!(matches!(&released, Ok(()) | Err(LockError::Backend(_))), "{released:?}");
    assert_free_within(&other, "doc", Duration::from_secs(3)).await;
}
