//! The in-memory store, called as the engine calls it: every rule of the scripts, and that
//! every write may be sent again.

use std::time::Duration;

use futures_util::FutureExt;
use tokio::time::advance;

use super::MemoryBackend;
use crate::{
    LockKey,
    backend::{
        Listener, LockKind,
        store::{
            AcquireReply::{self, Acquired, Held},
            Extend, ExtendReply, Grant, Listen, Release, ReleaseReply, Renew, RenewReply, Store,
            holder_of,
        },
    },
    inspect::{HolderInfo, LockInfo, Permits},
    lease::Lease,
};

use LockKind::{Exclusive, Fair, Read, Semaphore, Write};

const LEASE: Duration = Duration::from_secs(10);

fn secs(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

fn key(name: &str) -> LockKey {
    LockKey::new("test:", name.as_bytes(), 512).unwrap()
}

fn rw(name: &str) -> LockKey {
    key(name).with_suffix(":rw")
}

/// An acquire of `attempt` (`<holder>#<n>`): a 10 s lease, no token, a place kept 10 s when a
/// queue refuses it, two permits.
fn grant<'a>(key: &'a LockKey, kind: LockKind, attempt: &'a str) -> Grant<'a> {
    Grant {
        key,
        holder: holder_of(attempt),
        attempt,
        lease: Lease::fixed(LEASE),
        fencing: false,
        kind,
        queue: kind.queues().then_some(LEASE),
        contended: false,
        permits: 2,
        within: None,
    }
}

fn fenced(grant: Grant<'_>) -> Grant<'_> {
    Grant { fencing: true, ..grant }
}

fn leased(grant: Grant<'_>, lease: Duration) -> Grant<'_> {
    Grant { lease: Lease::fixed(lease), ..grant }
}

fn one(grant: Grant<'_>) -> Grant<'_> {
    Grant { permits: 1, ..grant }
}

fn release<'a>(key: &'a LockKey, kind: LockKind, grant: &'a str) -> Release<'a> {
    Release { key, kind, grant, token: None, handoff: None }
}

fn extend<'a>(key: &'a LockKey, kind: LockKind, grant: &'a str, lease: Duration) -> Extend<'a> {
    Extend { key, kind, grant, lease: Lease::watchdog(lease), fencing: false }
}

fn held(ttl: u64) -> AcquireReply {
    Held { ttl: Some(secs(ttl)) }
}

const REFUSED: AcquireReply = Held { ttl: None };
const GRANTED: AcquireReply = Acquired { token: None };
const NOT_HELD: ReleaseReply = ReleaseReply::NotHeld;

fn released(notified: u64) -> ReleaseReply {
    ReleaseReply::Released { notified: Some(notified) }
}

async fn acquire(store: &MemoryBackend, grant: Grant<'_>) -> AcquireReply {
    store.acquire(grant).await.unwrap()
}

async fn token(store: &MemoryBackend, grant: Grant<'_>) -> u64 {
    match acquire(store, grant).await {
        Acquired { token: Some(token) } => token,
        other => panic!("{} not granted with a token: {other:?}", grant.attempt),
    }
}

async fn free(store: &MemoryBackend, release: Release<'_>) -> ReleaseReply {
    store.release(release).await.unwrap()
}

async fn renew(store: &MemoryBackend, renewal: Renew<'_>) -> RenewReply {
    store.renew(&[renewal]).await.unwrap()[0]
}

fn renewal<'a>(key: &'a LockKey, kind: LockKind, grant: &'a str, lease: Duration) -> Renew<'a> {
    Renew::Grant { key, kind, grant, lease: Lease::watchdog(lease) }
}

fn place<'a>(key: &'a LockKey, kind: LockKind, holder: &'a str) -> Renew<'a> {
    Renew::Place { key, kind, holder, timeout: LEASE }
}

async fn inspect(store: &MemoryBackend, key: &LockKey, kind: LockKind) -> LockInfo {
    store.inspect(key, kind).await.unwrap()
}

async fn listen(store: &MemoryBackend, key: &LockKey, only_for: Option<&str>) -> Listener {
    store.listen(key, only_for).await.unwrap()
}

/// Whether a notification reached `listener` since the last look (consuming it).
fn woken(listener: &Listener) -> bool {
    listener.notified().now_or_never().is_some()
}

/// How many locks the store keeps an entry for.
fn entries(store: &MemoryBackend) -> usize {
    store.shards.each().map(|shard| shard.locks.len()).sum()
}

/// A free plain lock is granted, another attempt is refused with the lease left, and the
/// granted attempt sent again is granted with its token, without a longer lease.
#[tokio::test(start_paused = true)]
async fn plain_lock_is_exclusive_and_an_acquire_may_be_repeated() {
    let store = MemoryBackend::new();
    let k = key("k");
    let a = fenced(grant(&k, Exclusive, "a#1"));
    let token = token(&store, a).await;
    advance(secs(3)).await;
    assert_eq!(acquire(&store, grant(&k, Exclusive, "b#1")).await, held(7));
    assert_eq!(acquire(&store, a).await, Acquired { token: Some(token) });
    // A plain lock keeps no place, whatever the grant says.
    assert_eq!(acquire(&store, grant(&k, Exclusive, "b#2")).await, held(7));
    assert_eq!(inspect(&store, &k, Exclusive).await.queue_len, 0);
    advance(secs(7)).await;
    assert_eq!(acquire(&store, grant(&k, Exclusive, "b#3")).await, GRANTED);
    assert_eq!(acquire(&store, a).await, held(10));
}

/// A release frees only the grant it names; sent again, it finds nothing.
#[tokio::test(start_paused = true)]
async fn release_names_its_grant_and_may_be_repeated() {
    let store = MemoryBackend::new();
    let k = key("k");
    let token = token(&store, fenced(grant(&k, Exclusive, "a#1"))).await;
    let listener = listen(&store, &k, None).await;
    assert_eq!(free(&store, release(&k, Exclusive, "a#2")).await, NOT_HELD);
    let wrong = Release { token: Some(token + 1), ..release(&k, Exclusive, "a#1") };
    assert_eq!(free(&store, wrong).await, NOT_HELD);
    assert!(!woken(&listener));
    let right = Release { token: Some(token), ..release(&k, Exclusive, "a#1") };
    assert_eq!(free(&store, right).await, released(1));
    assert!(woken(&listener));
    assert_eq!(free(&store, right).await, NOT_HELD);
    assert_eq!(free(&store, release(&k, Exclusive, "a#1")).await, NOT_HELD);
    assert!(!woken(&listener));
    // A record that expired is gone: its release frees nothing of the next grant.
    acquire(&store, grant(&k, Exclusive, "a#3")).await;
    advance(LEASE).await;
    acquire(&store, grant(&k, Exclusive, "b#1")).await;
    assert_eq!(free(&store, release(&k, Exclusive, "a#3")).await, NOT_HELD);
    assert_eq!(acquire(&store, grant(&k, Exclusive, "c#1")).await, held(10));
    // Done at once, with the same answers.
    let now = store.release_now(release(&k, Exclusive, "b#1"));
    assert_eq!(now.unwrap().unwrap(), released(1));
    assert_eq!(store.held_count(), 0);
    assert_eq!(entries(&store), 0, "a free lock keeps no entry");
}

/// An extend makes the grant it names live longer, never shorter, and gives it a token it
/// lacks once; it never brings back a grant that ended.
#[tokio::test(start_paused = true)]
async fn extend_lengthens_and_adds_a_token_once() {
    let store = MemoryBackend::new();
    let k = key("k");
    acquire(&store, grant(&k, Exclusive, "a#1")).await;
    advance(secs(5)).await;
    let longer = extend(&k, Exclusive, "a#1", secs(20));
    let reply = store.extend(longer).await.unwrap();
    assert_eq!(reply, ExtendReply::Extended { token: None });
    let shorter = extend(&k, Exclusive, "a#1", secs(1));
    store.extend(shorter).await.unwrap();
    assert_eq!(acquire(&store, grant(&k, Exclusive, "b#1")).await, held(20));
    let fencing = Extend { fencing: true, ..shorter };
    let ExtendReply::Extended { token: Some(token) } = store.extend(fencing).await.unwrap() else {
        panic!("no token");
    };
    let again = store.extend(fencing).await.unwrap();
    assert_eq!(again, ExtendReply::Extended { token: Some(token) });
    // The same token for the acquire sent again, and for an extend that asks for none.
    let a = grant(&k, Exclusive, "a#1");
    assert_eq!(acquire(&store, a).await, Acquired { token: Some(token) });
    let reply = store.extend(shorter).await.unwrap();
    assert_eq!(reply, ExtendReply::Extended { token: Some(token) });
    assert_eq!(free(&store, release(&k, Exclusive, "a#1")).await, released(0));
    assert_eq!(store.extend(longer).await.unwrap(), ExtendReply::NotHeld);
    // A grant whose lease ran out is not extended either.
    acquire(&store, grant(&k, Exclusive, "a#2")).await;
    advance(LEASE).await;
    let ended = extend(&k, Exclusive, "a#2", LEASE);
    assert_eq!(store.extend(ended).await.unwrap(), ExtendReply::NotHeld);
    assert_eq!(acquire(&store, grant(&k, Exclusive, "b#2")).await, GRANTED);
}

/// Renewals extend the grant they name, never shorten it, and never bring one back.
#[tokio::test(start_paused = true)]
async fn renewals_extend_only_live_grants() {
    let store = MemoryBackend::new();
    let (k, sem) = (key("k"), key("s").with_suffix(":sem"));
    acquire(&store, grant(&k, Exclusive, "a#1")).await;
    acquire(&store, leased(grant(&sem, Semaphore, "p#1"), secs(1))).await;
    acquire(&store, grant(&sem, Semaphore, "q#1")).await;
    advance(secs(4)).await;
    let replies = store
        .renew(&[
            renewal(&k, Exclusive, "a#1", secs(30)),
            renewal(&k, Exclusive, "a#0", secs(30)),
            renewal(&sem, Semaphore, "p#1", secs(30)),
            renewal(&sem, Semaphore, "q#1", secs(30)),
            renewal(&k, Exclusive, "a#1", secs(1)),
        ])
        .await
        .unwrap();
    use RenewReply::{NotHeld, Renewed};
    assert_eq!(replies, [Renewed, NotHeld, NotHeld, Renewed, Renewed]);
    assert_eq!(acquire(&store, grant(&k, Exclusive, "b#1")).await, held(30));
    let info = inspect(&store, &sem, Semaphore).await;
    let q = HolderInfo::new("q", Semaphore, 1, Some(secs(30)));
    assert_eq!(info.holders, [q]);
    free(&store, release(&k, Exclusive, "a#1")).await;
    let renewed = renew(&store, renewal(&k, Exclusive, "a#1", LEASE)).await;
    assert_eq!(renewed, NotHeld);
    assert_eq!(entries(&store), 1, "only the semaphore is kept");
    // A record whose lease ran out is not brought back.
    acquire(&store, leased(grant(&k, Exclusive, "a#2"), secs(1))).await;
    advance(secs(1)).await;
    let late = renew(&store, renewal(&k, Exclusive, "a#2", LEASE)).await;
    assert_eq!(late, NotHeld);
    assert_eq!(acquire(&store, grant(&k, Exclusive, "b#2")).await, GRANTED);
}

/// An undo deletes the attempt's record when it won one; otherwise the attempt is given up
/// on, and a copy still on its way takes nothing.
#[tokio::test(start_paused = true)]
async fn abandon_deletes_the_record_or_gives_the_attempt_up() {
    let store = MemoryBackend::new();
    let k = key("k");
    let listener = listen(&store, &k, None).await;
    let a = grant(&k, Exclusive, "a#1");
    acquire(&store, a).await;
    assert!(store.abandon(a).await.unwrap());
    assert!(woken(&listener));
    // Sent again, the undo finds nothing: the attempt is given up on.
    assert!(!store.abandon(a).await.unwrap());
    assert!(!woken(&listener));
    assert_eq!(acquire(&store, a).await, REFUSED);
    // An attempt that never arrived: refused on a free lock, and on a held one told the lease.
    let b = grant(&k, Exclusive, "b#1");
    assert!(!store.abandon(b).await.unwrap());
    assert_eq!(acquire(&store, b).await, REFUSED);
    acquire(&store, grant(&k, Exclusive, "c#1")).await;
    advance(secs(2)).await;
    assert_eq!(acquire(&store, b).await, held(8));
    // An undo after a release finds nothing, and frees nothing of the next grant.
    free(&store, release(&k, Exclusive, "c#1")).await;
    acquire(&store, grant(&k, Exclusive, "d#1")).await;
    assert!(!store.abandon(grant(&k, Exclusive, "c#1")).await.unwrap());
    assert_eq!(acquire(&store, grant(&k, Exclusive, "e#1")).await, held(10));
}

/// The attempts given up on are kept at least one lease from each addition, all together.
#[tokio::test(start_paused = true)]
async fn given_up_attempts_live_a_lease_from_the_last_addition() {
    let store = MemoryBackend::new();
    let k = key("k");
    let a = leased(grant(&k, Exclusive, "a#1"), secs(10));
    store.abandon(a).await.unwrap();
    advance(secs(5)).await;
    store.abandon(leased(grant(&k, Exclusive, "b#1"), secs(10))).await.unwrap();
    store.abandon(leased(grant(&k, Exclusive, "c#1"), secs(1))).await.unwrap();
    advance(secs(9)).await;
    assert_eq!(acquire(&store, a).await, REFUSED);
    advance(secs(1)).await;
    assert_eq!(acquire(&store, a).await, GRANTED);
}

/// A record or shared grant whose attempt was given up on (a late copy, as a late `SET NX`
/// leaves on Redis) is held by nobody: the lock counts as free.
#[tokio::test(start_paused = true)]
async fn a_record_of_an_attempt_given_up_on_counts_as_free() {
    let store = MemoryBackend::new();
    let (k, sem) = (key("k"), key("s").with_suffix(":sem"));
    acquire(&store, grant(&k, Exclusive, "a#1")).await;
    acquire(&store, one(grant(&sem, Semaphore, "p#1"))).await;
    for key in [&k, &sem] {
        let mut shard = store.shards.of(key);
        let lock = shard.locks.get_mut(key).unwrap();
        lock.give_up(if *key == k { "a#1" } else { "p#1" }, tokio::time::Instant::now(), LEASE);
    }
    assert_eq!(acquire(&store, grant(&k, Exclusive, "b#1")).await, GRANTED);
    assert_eq!(acquire(&store, grant(&k, Exclusive, "a#1")).await, held(10));
    assert_eq!(acquire(&store, one(grant(&sem, Semaphore, "q#1"))).await, GRANTED);
    // The late permit was dropped for good.
    assert_eq!(free(&store, release(&sem, Semaphore, "p#1")).await, NOT_HELD);
}

/// A hand-off gives the record to the waiter's attempt in the same step, with its lease and a
/// new token, and tells nobody; to an attempt given up on, the lock is released instead.
#[tokio::test(start_paused = true)]
async fn hand_off_passes_the_record_on() {
    let store = MemoryBackend::new();
    let k = key("k");
    let listener = listen(&store, &k, None).await;
    let first = token(&store, fenced(grant(&k, Exclusive, "a#1"))).await;
    let next = fenced(leased(grant(&k, Exclusive, "b#1"), secs(5)));
    let handoff = |grant| Release { handoff: Some(next), ..release(&k, Exclusive, grant) };
    assert_eq!(free(&store, handoff("x#1")).await, NOT_HELD);
    let ReleaseReply::HandedOff { token: Some(second) } = free(&store, handoff("a#1")).await else {
        panic!("not handed off");
    };
    assert!(second > first);
    assert!(!woken(&listener));
    assert_eq!(free(&store, handoff("a#1")).await, NOT_HELD);
    assert_eq!(acquire(&store, next).await, Acquired { token: Some(second) });
    assert_eq!(acquire(&store, grant(&k, Exclusive, "c#1")).await, held(5));
    // To an attempt given up on: released, and the waiters told.
    let late = grant(&k, Exclusive, "d#1");
    store.abandon(late).await.unwrap();
    let to_late = Release { handoff: Some(late), ..release(&k, Exclusive, "b#1") };
    assert_eq!(free(&store, to_late).await, released(1));
    assert!(woken(&listener));
    assert_eq!(acquire(&store, grant(&k, Exclusive, "c#2")).await, GRANTED);
}

/// A forced unlock of a fair lock wakes its live queue head by name, past a waiter whose place
/// ended before it (as the script drops dead places first): no lost wake-up.
#[tokio::test(start_paused = true)]
async fn a_forced_unlock_wakes_the_live_head() {
    let store = MemoryBackend::new();
    let k = key("forced");
    assert_eq!(acquire(&store, grant(&k, Fair, "a#1")).await, GRANTED);
    let dead = Grant { queue: Some(secs(1)), ..grant(&k, Fair, "d#1") };
    assert_eq!(acquire(&store, dead).await, held(10));
    assert_eq!(acquire(&store, grant(&k, Fair, "b#1")).await, held(10));
    let (dead, live) = (listen(&store, &k, Some("d")).await, listen(&store, &k, Some("b")).await);
    advance(secs(2)).await;
    store.force_unlock(&k, Fair).await.unwrap();
    assert!(woken(&live), "the live head was not woken");
    assert!(!woken(&dead));
    assert_eq!(acquire(&store, grant(&k, Fair, "b#2")).await, GRANTED);
}

/// Only a plain lock is handed off, as the Redis backend sends the release of any other kind
/// plainly: a fair or write grant's release with a hand-off frees the lock and wakes its
/// waiters.
#[tokio::test(start_paused = true)]
async fn only_a_plain_lock_is_handed_off() {
    let store = MemoryBackend::new();
    for (k, kind) in [(key("hf"), Fair), (rw("hw"), Write)] {
        let listener = listen(&store, &k, None).await;
        assert_eq!(acquire(&store, grant(&k, kind, "a#1")).await, GRANTED);
        let next = grant(&k, kind, "b#1");
        let release = Release { handoff: Some(next), ..release(&k, kind, "a#1") };
        assert_eq!(free(&store, release).await, released(1), "{kind:?}");
        assert!(woken(&listener), "{kind:?}");
        assert!(!inspect(&store, &k, kind).await.is_locked(), "{kind:?}");
    }
}

/// Leaving as a kind that keeps no place (a reader, a plain lock, a permit) changes nothing,
/// as the Redis backend sends nothing for it: the holder's place as a writer stays, and
/// nobody is woken.
#[tokio::test(start_paused = true)]
async fn leaving_as_a_kind_without_a_place_changes_nothing() {
    let store = MemoryBackend::new();
    let k = rw("leave");
    assert_eq!(acquire(&store, grant(&k, Read, "r#1")).await, GRANTED);
    assert_eq!(acquire(&store, grant(&k, Write, "w#1")).await, held(10));
    let listener = listen(&store, &k, None).await;
    for kind in [Read, Exclusive, Semaphore] {
        store.leave(&k, "w", kind).await.unwrap();
        assert_eq!(inspect(&store, &k, Write).await.queue_len, 1, "{kind:?}");
        assert!(!woken(&listener), "{kind:?}");
    }
    store.leave(&k, "w", Write).await.unwrap();
    assert_eq!(inspect(&store, &k, Write).await.queue_len, 0);
}

/// A fair lock is granted in queue order: refused acquires keep a place, a release wakes the
/// head alone by name, and a waiter behind the head is told when the head's place ends.
#[tokio::test(start_paused = true)]
async fn fair_lock_grants_in_queue_order() {
    let store = MemoryBackend::new();
    let k = key("f");
    let (to_b, to_c) = (listen(&store, &k, Some("b")).await, listen(&store, &k, Some("c")).await);
    acquire(&store, grant(&k, Fair, "a#1")).await;
    advance(secs(1)).await;
    assert_eq!(acquire(&store, grant(&k, Fair, "b#1")).await, held(9));
    assert_eq!(acquire(&store, grant(&k, Fair, "c#1")).await, held(9));
    // Sent again, a refused acquire keeps one place.
    assert_eq!(acquire(&store, grant(&k, Fair, "c#1")).await, held(9));
    assert_eq!(inspect(&store, &k, Fair).await.queue_len, 2);
    assert_eq!(free(&store, release(&k, Fair, "a#1")).await, released(2));
    assert!(woken(&to_b) && !woken(&to_c));
    advance(secs(1)).await;
    // The lock is free, but b is first: c is told when b's place may end.
    assert_eq!(acquire(&store, grant(&k, Fair, "c#2")).await, held(9));
    assert_eq!(acquire(&store, grant(&k, Fair, "b#2")).await, GRANTED);
    assert_eq!(inspect(&store, &k, Fair).await.queue_len, 1);
    // A place that was not kept alive is dropped: the release wakes the one after it.
    acquire(&store, grant(&k, Fair, "d#1")).await;
    advance(secs(9)).await;
    renew(&store, place(&k, Fair, "d")).await;
    assert_eq!(renew(&store, renewal(&k, Fair, "b#2", LEASE)).await, RenewReply::Renewed);
    advance(secs(1)).await;
    assert_eq!(free(&store, release(&k, Fair, "b#2")).await, released(2));
    assert!(!woken(&to_c) && !woken(&to_b));
    assert_eq!(renew(&store, place(&k, Fair, "d")).await, RenewReply::Ready);
    assert_eq!(renew(&store, place(&k, Fair, "c")).await, RenewReply::NotHeld);
    // A plain acquire of the same name shares the record and ignores the queue.
    assert_eq!(acquire(&store, grant(&k, Exclusive, "e#1")).await, GRANTED);
    assert_eq!(acquire(&store, grant(&k, Fair, "d#2")).await, held(10));
}

/// A kept place answers whether it is the holder's turn; leaving passes the wake-up on when
/// the head changed while the lock is free, or when the queue emptied.
#[tokio::test(start_paused = true)]
async fn places_are_kept_and_left_as_wait_does() {
    let store = MemoryBackend::new();
    let k = key("f");
    let (to_b, to_c) = (listen(&store, &k, Some("b")).await, listen(&store, &k, Some("c")).await);
    let anyone = listen(&store, &k, None).await;
    assert_eq!(renew(&store, place(&k, Fair, "b")).await, RenewReply::NotHeld);
    acquire(&store, grant(&k, Fair, "a#1")).await;
    acquire(&store, grant(&k, Fair, "b#1")).await;
    acquire(&store, grant(&k, Fair, "c#1")).await;
    assert_eq!(renew(&store, place(&k, Fair, "b")).await, RenewReply::Renewed);
    // The head leaves while the lock is held: nobody is told.
    store.leave(&k, "b", Fair).await.unwrap();
    assert!(!woken(&to_c) && !woken(&anyone));
    assert_eq!(renew(&store, place(&k, Fair, "b")).await, RenewReply::NotHeld);
    free(&store, release(&k, Fair, "a#1")).await;
    assert!(woken(&to_c) && woken(&anyone));
    assert_eq!(renew(&store, place(&k, Fair, "c")).await, RenewReply::Ready);
    acquire(&store, grant(&k, Fair, "b#2")).await;
    // One behind the head leaves: nothing changes for the head.
    store.leave(&k, "b", Fair).await.unwrap();
    assert!(!woken(&to_c) && !woken(&anyone));
    acquire(&store, grant(&k, Fair, "b#3")).await;
    // The head leaves while the lock is free: the next one is told by name.
    store.leave(&k, "c", Fair).await.unwrap();
    assert!(woken(&to_b) && woken(&anyone) && !woken(&to_c));
    // The last one leaves: `released`, for whoever waits without a place.
    store.leave(&k, "b", Fair).await.unwrap();
    assert!(woken(&anyone) && !woken(&to_b));
    store.leave(&k, "b", Fair).await.unwrap();
    assert!(!woken(&anyone));
    assert_eq!(entries(&store), 0);
    // A place kept with no time at all is left.
    acquire(&store, grant(&k, Fair, "x#1")).await;
    acquire(&store, grant(&k, Fair, "y#1")).await;
    let zero = Renew::Place { key: &k, kind: Fair, holder: "y", timeout: Duration::ZERO };
    assert_eq!(renew(&store, zero).await, RenewReply::NotHeld);
    assert_eq!(inspect(&store, &k, Fair).await.queue_len, 0);
    // The head's place ended while the lock is free: the next one is told at its renewal.
    let l = key("g");
    let to_q = listen(&store, &l, Some("q")).await;
    acquire(&store, grant(&l, Fair, "a#1")).await;
    let short = Grant { queue: Some(secs(1)), ..grant(&l, Fair, "p#1") };
    acquire(&store, short).await;
    acquire(&store, grant(&l, Fair, "q#1")).await;
    free(&store, release(&l, Fair, "a#1")).await;
    assert!(!woken(&to_q));
    advance(secs(1)).await;
    assert_eq!(renew(&store, place(&l, Fair, "q")).await, RenewReply::Ready);
    assert!(woken(&to_q));
}

/// A writer waits for the live readers and keeps a place; a waiting writer holds back new
/// readers; the writer's own reads nest in its grant.
#[tokio::test(start_paused = true)]
async fn writers_wait_for_readers_and_hold_back_new_ones() {
    let store = MemoryBackend::new();
    let k = rw("r");
    let listener = listen(&store, &k, None).await;
    acquire(&store, leased(grant(&k, Read, "r#1"), secs(4))).await;
    acquire(&store, grant(&k, Read, "s#1")).await;
    // Refused by the reader whose lease ends first.
    assert_eq!(acquire(&store, grant(&k, Write, "w#1")).await, held(4));
    assert_eq!(acquire(&store, grant(&k, Read, "t#1")).await, held(10));
    assert_eq!(renew(&store, place(&k, Write, "w")).await, RenewReply::Renewed);
    free(&store, release(&k, Read, "s#1")).await;
    assert!(woken(&listener));
    advance(secs(4)).await;
    // The last reader's lease ended: the writer's turn.
    assert_eq!(renew(&store, place(&k, Write, "w")).await, RenewReply::Ready);
    let w = grant(&k, Write, "w#2");
    assert_eq!(acquire(&store, w).await, GRANTED);
    advance(secs(1)).await;
    assert_eq!(acquire(&store, grant(&k, Read, "t#2")).await, held(9));
    assert_eq!(acquire(&store, grant(&k, Write, "v#1")).await, held(9));
    // A read by the writer's holder, nested in its grant, goes past the writer and the queue.
    let nested = Grant { within: Some("w#2"), ..grant(&k, Read, "w#3") };
    assert_eq!(acquire(&store, nested).await, GRANTED);
    let foreign = Grant { within: Some("w#2"), ..grant(&k, Read, "t#3") };
    assert_eq!(acquire(&store, foreign).await, GRANTED, "within names the writer");
    free(&store, release(&k, Write, "w#2")).await;
    assert_eq!(renew(&store, place(&k, Write, "v")).await, RenewReply::Renewed);
    assert_eq!(acquire(&store, grant(&k, Write, "v#2")).await, held(10));
    free(&store, release(&k, Read, "w#3")).await;
    free(&store, release(&k, Read, "t#3")).await;
    assert_eq!(acquire(&store, grant(&k, Write, "v#3")).await, GRANTED);
    // The queue emptied: readers may come once the writer is done.
    free(&store, release(&k, Write, "v#3")).await;
    assert_eq!(acquire(&store, grant(&k, Read, "t#4")).await, GRANTED);
}

/// A reader's grant is its own: sent again it is granted once, each has its own lease, and a
/// release frees only the one it names.
#[tokio::test(start_paused = true)]
async fn readers_keep_a_grant_each() {
    let store = MemoryBackend::new();
    let k = rw("r");
    let r = grant(&k, Read, "r#1");
    assert_eq!(acquire(&store, r).await, GRANTED);
    assert_eq!(acquire(&store, r).await, GRANTED);
    acquire(&store, leased(grant(&k, Read, "r#2"), secs(20))).await;
    assert_eq!(inspect(&store, &k, Read).await.holders.len(), 2);
    assert_eq!(free(&store, release(&k, Read, "r#1")).await, released(0));
    assert_eq!(free(&store, release(&k, Read, "r#1")).await, NOT_HELD);
    assert_eq!(acquire(&store, grant(&k, Write, "w#1")).await, held(20));
    let longer = extend(&k, Read, "r#2", secs(30));
    let reply = store.extend(longer).await.unwrap();
    assert_eq!(reply, ExtendReply::Extended { token: None });
    store.leave(&k, "w", Write).await.unwrap();
    assert_eq!(acquire(&store, grant(&k, Write, "w#2")).await, held(30));
    advance(secs(30)).await;
    assert_eq!(store.extend(longer).await.unwrap(), ExtendReply::NotHeld);
}

/// A semaphore grants while fewer permits than the acquire states are held; a permit whose
/// lease ended counts no more.
#[tokio::test(start_paused = true)]
async fn semaphore_caps_its_permits() {
    let store = MemoryBackend::new();
    let k = key("s").with_suffix(":sem");
    acquire(&store, leased(grant(&k, Semaphore, "a#1"), secs(3))).await;
    acquire(&store, grant(&k, Semaphore, "b#1")).await;
    assert_eq!(acquire(&store, grant(&k, Semaphore, "c#1")).await, held(3));
    let more = Grant { permits: 3, ..grant(&k, Semaphore, "c#2") };
    assert_eq!(acquire(&store, more).await, GRANTED, "each acquire states its permits");
    free(&store, release(&k, Semaphore, "c#2")).await;
    advance(secs(3)).await;
    assert_eq!(acquire(&store, grant(&k, Semaphore, "c#3")).await, GRANTED);
    assert_eq!(acquire(&store, grant(&k, Semaphore, "d#1")).await, held(7));
    free(&store, release(&k, Semaphore, "b#1")).await;
    assert_eq!(acquire(&store, grant(&k, Semaphore, "d#2")).await, GRANTED);
    let none = Grant { permits: 0, ..grant(&k, Semaphore, "e#1") };
    assert_eq!(acquire(&store, none).await, held(10));
    let empty = key("t").with_suffix(":sem");
    let none = Grant { key: &empty, ..none };
    assert_eq!(acquire(&store, none).await, REFUSED);
}

/// A shared grant whose lease ended stays until an acquire drops it, as a sorted set member
/// does: its release still finds it (and tells the waiters), its renewal does not.
#[tokio::test(start_paused = true)]
async fn an_ended_shared_grant_is_dropped_by_the_next_acquire() {
    let store = MemoryBackend::new();
    let k = key("s").with_suffix(":sem");
    let short = leased(grant(&k, Semaphore, "a#1"), secs(1));
    acquire(&store, short).await;
    acquire(&store, grant(&k, Semaphore, "b#1")).await;
    acquire(&store, leased(grant(&k, Semaphore, "c#1"), secs(1))).await;
    advance(secs(2)).await;
    assert_eq!(renew(&store, renewal(&k, Semaphore, "a#1", LEASE)).await, RenewReply::NotHeld);
    assert_eq!(inspect(&store, &k, Semaphore).await.holders.len(), 1);
    assert_eq!(free(&store, release(&k, Semaphore, "a#1")).await, released(0));
    acquire(&store, grant(&k, Semaphore, "d#1")).await;
    assert_eq!(free(&store, release(&k, Semaphore, "c#1")).await, NOT_HELD);
    // Sent again after its lease ended, an acquire is a new one: refused while full.
    assert_eq!(acquire(&store, short).await, held(8));
    // Once the set's TTL is over, it is gone with its ended members.
    free(&store, release(&k, Semaphore, "d#1")).await;
    acquire(&store, leased(grant(&k, Semaphore, "e#1"), secs(1))).await;
    free(&store, release(&k, Semaphore, "b#1")).await;
    advance(LEASE).await;
    assert_eq!(free(&store, release(&k, Semaphore, "e#1")).await, NOT_HELD);
    assert_eq!(entries(&store), 0);
}

/// An undo of a shared grant gives it back, or gives the attempt up; either may be repeated.
#[tokio::test(start_paused = true)]
async fn abandon_of_a_shared_grant() {
    let store = MemoryBackend::new();
    let k = rw("r");
    let listener = listen(&store, &k, None).await;
    let r = grant(&k, Read, "r#1");
    acquire(&store, r).await;
    assert!(store.abandon(r).await.unwrap());
    assert!(woken(&listener));
    assert!(!store.abandon(r).await.unwrap());
    assert_eq!(acquire(&store, r).await, REFUSED);
    assert_eq!(store.extend(extend(&k, Read, "r#1", LEASE)).await.unwrap(), ExtendReply::NotHeld);
    assert_eq!(acquire(&store, grant(&k, Write, "w#1")).await, GRANTED);
    assert_eq!(acquire(&store, r).await, REFUSED);
}

/// Fencing tokens rise strictly from one grant to the next, whichever lock, shard or clone
/// of the store issues them, and however they are issued.
#[tokio::test(start_paused = true)]
async fn fencing_tokens_rise_across_owners() {
    let store = MemoryBackend::new();
    let clone = store.clone();
    let (k, l, w) = (key("k"), key("l"), rw("w"));
    let mut tokens = Vec::new();
    for n in 0..20 {
        let (a, b) = (format!("a#{n}"), format!("b#{n}"));
        tokens.push(token(&store, fenced(grant(&k, Exclusive, &a))).await);
        free(&store, release(&k, Exclusive, &a)).await;
        tokens.push(token(&clone, fenced(grant(&l, Fair, &b))).await);
        free(&clone, release(&l, Fair, &b)).await;
        tokens.push(token(&store, fenced(grant(&w, Write, &a))).await);
        free(&store, release(&w, Write, &a)).await;
        // Only a plain lock is handed off.
        tokens.push(token(&clone, fenced(grant(&l, Exclusive, &b))).await);
        let handoff = Release {
            handoff: Some(fenced(grant(&l, Exclusive, &a))),
            ..release(&l, Exclusive, &b)
        };
        let ReleaseReply::HandedOff { token: Some(token) } = free(&clone, handoff).await else {
            panic!("not handed off");
        };
        tokens.push(token);
        free(&store, release(&l, Exclusive, &a)).await;
        acquire(&store, grant(&k, Exclusive, &b)).await;
        let add = Extend { fencing: true, ..extend(&k, Exclusive, &b, LEASE) };
        let ExtendReply::Extended { token: Some(token) } = store.extend(add).await.unwrap() else {
            panic!("no token");
        };
        tokens.push(token);
        free(&store, release(&k, Exclusive, &b)).await;
    }
    assert!(tokens.windows(2).all(|pair| pair[0] < pair[1]), "{tokens:?}");
    // Tokens count microseconds of the wall clock, as the scripts' do.
    let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    assert!(tokens[0] / 1000 + 60_000 > u64::try_from(wall.as_millis()).unwrap());
}

/// Inspection reports one holder per grant with its lease left, the live places, and a
/// semaphore's permits in use.
#[tokio::test(start_paused = true)]
async fn inspect_reports_each_grant() {
    let store = MemoryBackend::new();
    let (k, r, s) = (key("k"), rw("r"), key("s").with_suffix(":sem"));
    assert_eq!(inspect(&store, &k, Fair).await, LockInfo::free());
    acquire(&store, grant(&k, Fair, "app@host/1/x:1#1")).await;
    acquire(&store, leased(grant(&k, Fair, "b#1"), secs(1))).await;
    acquire(&store, Grant { queue: Some(secs(1)), ..grant(&k, Fair, "c#1") }).await;
    advance(secs(1)).await;
    let holder = HolderInfo::new("app@host/1/x:1", Exclusive, 1, Some(secs(9)));
    let info = LockInfo::free().with_holder(holder).with_queue_len(1);
    assert_eq!(inspect(&store, &k, Fair).await, info);
    assert_eq!(inspect(&store, &k, Exclusive).await, info);

    acquire(&store, grant(&r, Read, "a#1")).await;
    acquire(&store, leased(grant(&r, Read, "b#1"), secs(5))).await;
    acquire(&store, grant(&r, Write, "w#1")).await;
    let info = LockInfo::free()
        .with_queue_len(1)
        .with_holder(HolderInfo::new("b", Read, 1, Some(secs(5))))
        .with_holder(HolderInfo::new("a", Read, 1, Some(LEASE)));
    assert_eq!(inspect(&store, &r, Write).await, info);
    free(&store, release(&r, Read, "a#1")).await;
    free(&store, release(&r, Read, "b#1")).await;
    acquire(&store, grant(&r, Write, "w#1")).await;
    let writer = HolderInfo::new("w", Write, 1, Some(LEASE));
    assert_eq!(inspect(&store, &r, Read).await, LockInfo::free().with_holder(writer));

    assert_eq!(inspect(&store, &s, Semaphore).await.permits, None);
    acquire(&store, grant(&s, Semaphore, "p#1")).await;
    acquire(&store, grant(&s, Semaphore, "q#1")).await;
    let info = inspect(&store, &s, Semaphore).await;
    assert_eq!(info.permits, Some(Permits::new(2, 0)));
    assert_eq!(info.holders[0], HolderInfo::new("p", Semaphore, 1, Some(LEASE)));
    assert_eq!(store.held_count(), 3);
}

/// A forced unlock deletes every grant, keeps the queue and wakes its head by name; the
/// holders find out at their next write.
#[tokio::test(start_paused = true)]
async fn force_unlock_clears_grants_and_wakes_waiters() {
    let store = MemoryBackend::new();
    let (k, r) = (key("k"), rw("r"));
    let (to_b, anyone) = (listen(&store, &k, Some("b")).await, listen(&store, &k, None).await);
    assert_eq!(store.force_unlock(&k, Fair).await.unwrap(), LockInfo::free());
    assert!(!woken(&anyone));
    acquire(&store, grant(&k, Fair, "a#1")).await;
    acquire(&store, grant(&k, Fair, "b#1")).await;
    let before = store.force_unlock(&k, Fair).await.unwrap();
    assert_eq!(before.holders[0].id, "a");
    assert!(woken(&to_b) && woken(&anyone));
    assert_eq!(inspect(&store, &k, Fair).await.queue_len, 1);
    assert_eq!(renew(&store, renewal(&k, Fair, "a#1", LEASE)).await, RenewReply::NotHeld);
    assert_eq!(free(&store, release(&k, Fair, "a#1")).await, NOT_HELD);
    assert_eq!(renew(&store, place(&k, Fair, "b")).await, RenewReply::Ready);

    let readers = listen(&store, &r, None).await;
    acquire(&store, grant(&r, Read, "x#1")).await;
    acquire(&store, grant(&r, Read, "y#1")).await;
    acquire(&store, grant(&r, Write, "w#1")).await;
    assert_eq!(store.force_unlock(&r, Read).await.unwrap().holders.len(), 2);
    assert!(woken(&readers));
    assert_eq!(renew(&store, place(&r, Write, "w")).await, RenewReply::Ready);
    assert_eq!(acquire(&store, grant(&r, Write, "w#1")).await, GRANTED);
    assert_eq!(free(&store, release(&r, Read, "x#1")).await, NOT_HELD);
}

/// Locks left to expire (a fixed lease nobody releases) do not stay in the store.
#[tokio::test(start_paused = true)]
async fn expired_locks_are_swept() {
    let store = MemoryBackend::new();
    let names: Vec<_> = (0..2000).map(|n| key(&n.to_string())).collect();
    for name in &names {
        acquire(&store, grant(name, Exclusive, "a#1")).await;
    }
    advance(LEASE).await;
    assert_eq!(store.held_count(), 0);
    let others: Vec<_> = (0..2000).map(|n| key(&format!("other {n}"))).collect();
    for name in &others {
        acquire(&store, grant(name, Exclusive, "a#1")).await;
    }
    assert_eq!(store.held_count(), 2000);
    assert!(entries(&store) < 3000, "{} entries kept", entries(&store));
}
