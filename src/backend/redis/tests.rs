//! The backend against a real `redis-server` (the fixture of `tests/support`): each script's
//! call as `calls.rs` builds it, and the protocol's rules as the store answers them.

use std::{sync::Arc, time::Duration};

use redis::aio::MultiplexedConnection;
use tokio::sync::{mpsc, oneshot};

use super::{
    RedisBackend, calls,
    pool::ServerClock,
    pubsub::PubSub,
    scripts::{PUBLISH, SCRIPTS, Scripts},
};
use crate::{
    backend::{
        LockKind,
        store::{
            AcquireReply, Extend, ExtendReply, Grant, Listen, Release, ReleaseReply, Renew,
            RenewReply, Store,
        },
    },
    error::BackendErrorKind,
    lease::Lease,
    lock_key::LockKey,
    test_support::{self as support, RedisServer, RespValue},
};

const KINDS: [LockKind; 5] =
    [LockKind::Exclusive, LockKind::Fair, LockKind::Write, LockKind::Read, LockKind::Semaphore];

/// The key of a `kind` lock named `name`.
fn key(name: &str, kind: LockKind) -> LockKey {
    let key = LockKey::new("tl:", name.as_bytes(), 512).unwrap();
    match kind {
        LockKind::Read | LockKind::Write => key.with_suffix(":rw"),
        LockKind::Semaphore => key.with_suffix(":sem"),
        _ => key,
    }
}

/// An acquire by the holder of `attempt` (`<holder>#<n>`), with a 10 s lease.
fn grant<'a>(key: &'a LockKey, kind: LockKind, attempt: &'a str) -> Grant<'a> {
    Grant {
        key,
        holder: crate::backend::store::holder_of(attempt),
        attempt,
        lease: Lease::fixed(Duration::from_secs(10)),
        fencing: false,
        kind,
        queue: None,
        contended: false,
        permits: 1,
        within: None,
    }
}

fn release<'a>(key: &'a LockKey, kind: LockKind, grant: &'a str) -> Release<'a> {
    Release { key, kind, grant, token: None, handoff: None }
}

fn extend<'a>(key: &'a LockKey, kind: LockKind, grant: &'a str, ms: u64) -> Extend<'a> {
    Extend { key, kind, grant, lease: Lease::fixed(Duration::from_millis(ms)), fencing: false }
}

fn renewal<'a>(key: &'a LockKey, kind: LockKind, grant: &'a str, ms: u64) -> Renew<'a> {
    Renew::Grant { key, kind, grant, lease: Lease::fixed(Duration::from_millis(ms)) }
}

async fn connect(server: &RedisServer) -> RedisBackend {
    support::redis_backend(server.url()).connect().await.unwrap()
}

async fn direct(server: &RedisServer) -> MultiplexedConnection {
    let client = redis::Client::open(server.url()).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}

fn text(server: &RedisServer, args: &[&str]) -> Option<String> {
    server.cmd(args).as_str()
}

fn int(server: &RedisServer, args: &[&str]) -> i64 {
    server.cmd(args).as_int()
}

fn score(server: &RedisServer, set: &str, member: &str) -> i64 {
    text(server, &["ZSCORE", set, member]).unwrap().parse().unwrap()
}

/// Where the grant `attempt` of `kind` is recorded: its owner record, or its member's score.
fn recorded(server: &RedisServer, key: &LockKey, kind: LockKind, attempt: &str) -> Option<String> {
    match kind {
        LockKind::Read => text(server, &["ZSCORE", &key.derived(":readers"), attempt]),
        LockKind::Semaphore => text(server, &["ZSCORE", key.as_str(), attempt]),
        _ => text(server, &["GET", key.as_str()])
            .filter(|record| record == attempt || record.starts_with(&format!("{attempt}~"))),
    }
}

fn acquired(reply: AcquireReply) -> Option<u64> {
    match reply {
        AcquireReply::Acquired { token } => token,
        other => panic!("expected a grant, got {other:?}"),
    }
}

fn held(reply: AcquireReply) -> Option<Duration> {
    match reply {
        AcquireReply::Held { ttl } => ttl,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Every kind grants, answers a repeat of the same attempt as granted, refuses another holder,
/// and frees only on a release naming the grant; a repeated release finds nothing.
#[tokio::test]
async fn grants_refuses_repeats_and_releases_per_kind() {
    let server = RedisServer::start();
    let backend = connect(&server).await;
    for kind in KINDS {
        let key = key(&format!("basic-{kind:?}"), kind);
        let first = grant(&key, kind, "h1#1");
        assert_eq!(acquired(backend.acquire(first).await.unwrap()), None);
        assert!(recorded(&server, &key, kind, "h1#1").is_some(), "{kind:?}");
        let again = backend.acquire(first).await.unwrap();
        assert_eq!(acquired(again), None, "{kind:?}: the repeat");
        // A reader is refused by a writer, the other kinds by the grant.
        let (other_kind, other_key) = match kind {
            LockKind::Read => (LockKind::Write, key.clone()),
            _ => (kind, key.clone()),
        };
        let other = grant(&other_key, other_kind, "h2#1");
        let ttl = held(backend.acquire(Grant { contended: true, ..other }).await.unwrap());
        assert!(ttl.is_some_and(|ttl| ttl <= Duration::from_secs(10)), "{kind:?}: {ttl:?}");

        let stale = backend.release(release(&key, kind, "h1#9")).await.unwrap();
        assert_eq!(stale, ReleaseReply::NotHeld, "{kind:?}");
        assert!(recorded(&server, &key, kind, "h1#1").is_some(), "{kind:?}");
        let freed = backend.release(release(&key, kind, "h1#1")).await.unwrap();
        assert_eq!(freed, ReleaseReply::Released { notified: Some(0) }, "{kind:?}");
        assert_eq!(recorded(&server, &key, kind, "h1#1"), None, "{kind:?}");
        let repeated = backend.release(release(&key, kind, "h1#1")).await.unwrap();
        assert_eq!(repeated, ReleaseReply::NotHeld, "{kind:?}");
        assert_eq!(acquired(backend.acquire(other).await.unwrap()), None, "{kind:?}");
    }
}

/// A fenced grant's record carries its token, which rises from grant to grant; the release
/// names the whole record. Fair and write acquires refused keep a place, read by the next
/// acquire and kept or left with `wait.lua`; a reader waits behind a waiting writer unless it
/// nests in its own holder's write grant. Every call of `calls.rs` runs here in its order.
#[tokio::test]
async fn every_call_puts_its_keys_and_arguments_in_order() {
    let server = RedisServer::start();
    let backend = connect(&server).await;
    let fenced = |key, attempt| Grant { fencing: true, ..grant(key, LockKind::Exclusive, attempt) };
    let plain = key("order", LockKind::Exclusive);
    let first = acquired(backend.acquire(fenced(&plain, "h1#1")).await.unwrap()).unwrap();
    let record = format!("h1#1~{first}");
    assert_eq!(text(&server, &["GET", plain.as_str()]), Some(record));
    assert_eq!(int(&server, &["EXISTS", &plain.derived(":fence")]), 1);
    let mut named = release(&plain, LockKind::Exclusive, "h1#1");
    named.token = Some(first + 1);
    assert_eq!(backend.release(named).await.unwrap(), ReleaseReply::NotHeld);
    named.token = Some(first);
    assert!(matches!(backend.release(named).await.unwrap(), ReleaseReply::Released { .. }));
    let second = acquired(backend.acquire(fenced(&plain, "h1#2")).await.unwrap()).unwrap();
    assert!(second > first);

    // Fair: a refused acquire joins the queue; its place is kept, then its turn comes.
    let fair = key("fair", LockKind::Fair);
    let queue = |key: &LockKey| match server.cmd(&["LRANGE", &key.derived(":queue"), "0", "-1"]) {
        RespValue::Array(Some(items)) => {
            items.iter().filter_map(RespValue::as_str).collect::<Vec<_>>()
        }
        other => panic!("{other:?}"),
    };
    acquired(backend.acquire(grant(&fair, LockKind::Fair, "h1#1")).await.unwrap());
    let waiting =
        Grant { queue: Some(Duration::from_secs(5)), ..grant(&fair, LockKind::Fair, "h2#1") };
    held(backend.acquire(waiting).await.unwrap());
    assert_eq!(queue(&fair), ["h2"]);
    let place = score(&server, &fair.derived(":timeouts"), "h2");
    let keep = |ms: u64| Renew::Place {
        key: &fair,
        kind: LockKind::Fair,
        holder: "h2",
        timeout: Duration::from_millis(ms),
    };
    assert_eq!(backend.renew(&[keep(9000)]).await.unwrap(), [RenewReply::Renewed]);
    assert!(score(&server, &fair.derived(":timeouts"), "h2") > place);
    // A third waiter queues behind; the fair release wakes the head by name.
    held(
        backend
            .acquire(Grant {
                queue: Some(Duration::from_secs(5)),
                ..grant(&fair, LockKind::Fair, "h3#1")
            })
            .await
            .unwrap(),
    );
    let head = backend.listen(&fair, Some("h2")).await.unwrap();
    // The first listener may come before the pub/sub connection is up.
    let channel = fair.derived(":released");
    support::eventually(Duration::from_secs(5), "the subscription", || {
        support::numsub(&server, &channel) == 1
    })
    .await;
    let released = backend.release(release(&fair, LockKind::Fair, "h1#1")).await.unwrap();
    assert_eq!(released, ReleaseReply::Released { notified: Some(1) });
    tokio::time::timeout(Duration::from_secs(5), head.notified()).await.unwrap();
    assert_eq!(backend.renew(&[keep(9000)]).await.unwrap(), [RenewReply::Ready]);
    held(backend.acquire(grant(&fair, LockKind::Fair, "h3#2")).await.unwrap());
    acquired(backend.acquire(waiting).await.unwrap());
    assert_eq!(queue(&fair), ["h3"]);
    backend.leave(&fair, "h3", LockKind::Fair).await.unwrap();
    assert!(queue(&fair).is_empty());
    assert_eq!(backend.renew(&[keep(9000)]).await.unwrap(), [RenewReply::NotHeld]);

    // Read-write: a writer waits for the reader and holds back other readers, not its own.
    let rw = key("rw", LockKind::Write);
    acquired(backend.acquire(grant(&rw, LockKind::Read, "r1#1")).await.unwrap());
    let writer =
        Grant { queue: Some(Duration::from_secs(5)), ..grant(&rw, LockKind::Write, "w1#1") };
    held(backend.acquire(writer).await.unwrap());
    assert_eq!(queue(&rw), ["w1"]);
    held(backend.acquire(grant(&rw, LockKind::Read, "r2#1")).await.unwrap());
    let info = backend.inspect(&rw, LockKind::Read).await.unwrap();
    assert_eq!((info.holders.len(), info.queue_len), (1, 1));
    assert_eq!((info.holders[0].id.as_str(), info.holders[0].kind), ("r1", LockKind::Read));
    let place = [Renew::Place {
        key: &rw,
        kind: LockKind::Write,
        holder: "w1",
        timeout: Duration::from_secs(5),
    }];
    assert_eq!(backend.renew(&place).await.unwrap(), [RenewReply::Renewed]);
    backend.release(release(&rw, LockKind::Read, "r1#1")).await.unwrap();
    // The readers gone, the waiting writer's turn.
    assert_eq!(backend.renew(&place).await.unwrap(), [RenewReply::Ready]);
    acquired(backend.acquire(writer).await.unwrap());
    let nested = Grant { within: Some("w1#1"), ..grant(&rw, LockKind::Read, "w1#2") };
    acquired(backend.acquire(nested).await.unwrap());
    held(backend.acquire(grant(&rw, LockKind::Read, "r2#2")).await.unwrap());
    let info = backend.force_unlock(&rw, LockKind::Write).await.unwrap();
    let kinds: Vec<_> =
        info.holders.iter().map(|holder| (holder.id.as_str(), holder.kind)).collect();
    assert_eq!(kinds, [("w1", LockKind::Write), ("w1", LockKind::Read)]);
    assert!(!backend.inspect(&rw, LockKind::Write).await.unwrap().is_locked());

    // A semaphore of 2 permits; its permits show with no limit (the store keeps none).
    let sem = key("sem", LockKind::Semaphore);
    let permit = |attempt| Grant { permits: 2, ..grant(&sem, LockKind::Semaphore, attempt) };
    acquired(backend.acquire(permit("p1#1")).await.unwrap());
    acquired(backend.acquire(permit("p2#1")).await.unwrap());
    held(backend.acquire(permit("p3#1")).await.unwrap());
    let info = backend.inspect(&sem, LockKind::Semaphore).await.unwrap();
    assert_eq!(info.permits.map(|p| (p.in_use, p.limit)), Some((2, 0)));

    // The acquire scripts' "not after": a request that arrives later does nothing.
    let mut conn = direct(&server).await;
    for kind in KINDS {
        let key = key("late", kind);
        let call = calls::acquire(&SCRIPTS, &grant(&key, kind, "h1#1"), false, Some(1), None);
        assert_eq!(call.run::<Vec<i64>>(&mut conn).await.unwrap(), [-4], "{kind:?}");
        assert_eq!(recorded(&server, &key, kind, "h1#1"), None, "{kind:?}");
    }
}

/// The undo of an attempt that never landed records it as given up on: the attempt is
/// refused, and a late `SET NX` of it takes nothing. The undo of one that won deletes it.
#[tokio::test]
async fn an_undo_voids_an_attempt_that_never_landed() {
    let server = RedisServer::start();
    let backend = connect(&server).await;
    for kind in KINDS {
        let key = key(&format!("undo-{kind:?}"), kind);
        let lost = grant(&key, kind, "h1#1");
        assert!(!backend.abandon(lost).await.unwrap(), "{kind:?}");
        let void = key.derived(":void");
        assert_eq!(int(&server, &["SISMEMBER", &void, "h1#1"]), 1, "{kind:?}");
        assert!(int(&server, &["PTTL", &void]) > 9000, "{kind:?}");
        held(backend.acquire(Grant { contended: true, ..lost }).await.unwrap());
        if kind.owns() {
            // A late `SET NX PXAT` of the given-up attempt: a record nobody holds.
            let set = ["SET", key.as_str(), "h1#1", "NX", "PX", "10000"];
            assert_eq!(text(&server, &set).as_deref(), Some("OK"));
        }
        let next = backend.acquire(grant(&key, kind, "h2#1")).await.unwrap();
        assert_eq!(acquired(next), None, "{kind:?}: the late copy counts as free");
        assert!(backend.abandon(grant(&key, kind, "h2#1")).await.unwrap(), "{kind:?}");
        assert_eq!(recorded(&server, &key, kind, "h2#1"), None, "{kind:?}");
    }
}

/// A release hands a plain lock to a local waiter's attempt in the same step, with its own
/// token; not to an attempt given up on, which frees it instead.
#[tokio::test]
async fn a_release_hands_the_lock_off() {
    let server = RedisServer::start();
    let backend = connect(&server).await;
    let key = key("handoff", LockKind::Exclusive);
    acquired(backend.acquire(grant(&key, LockKind::Exclusive, "h1#1")).await.unwrap());
    let next = Grant { fencing: true, ..grant(&key, LockKind::Exclusive, "h2#1") };
    let handoff = Release { handoff: Some(next), ..release(&key, LockKind::Exclusive, "h1#1") };
    let ReleaseReply::HandedOff { token: Some(token) } = backend.release(handoff).await.unwrap()
    else {
        panic!("not handed off");
    };
    let record = text(&server, &["GET", key.as_str()]);
    assert_eq!(record, Some(format!("h2#1~{token}")));
    backend.abandon(grant(&key, LockKind::Exclusive, "h3#1")).await.unwrap();
    let to_void = Release {
        token: Some(token),
        handoff: Some(grant(&key, LockKind::Exclusive, "h3#1")),
        ..release(&key, LockKind::Exclusive, "h2#1")
    };
    let reply = backend.release(to_void).await.unwrap();
    assert!(matches!(reply, ReleaseReply::Released { .. }), "{reply:?}");
    assert_eq!(text(&server, &["GET", key.as_str()]), None);
}

/// An extend makes a grant live longer (never shorter) and gives it a token it lacks, once;
/// a grant that ended is not held.
#[tokio::test]
async fn an_extend_lengthens_a_grant_and_adds_a_token() {
    let server = RedisServer::start();
    let backend = connect(&server).await;
    for kind in KINDS {
        let key = key(&format!("extend-{kind:?}"), kind);
        let short =
            Grant { lease: Lease::fixed(Duration::from_secs(2)), ..grant(&key, kind, "h1#1") };
        acquired(backend.acquire(short).await.unwrap());
        let left = || match kind {
            LockKind::Read | LockKind::Semaphore => {
                let set = if kind == LockKind::Read {
                    key.derived(":readers")
                } else {
                    key.as_str().to_owned()
                };
                let score: i64 = text(&server, &["ZSCORE", &set, "h1#1"]).unwrap().parse().unwrap();
                let RespValue::Array(Some(time)) = server.cmd(&["TIME"]) else { panic!() };
                let now: i64 = time[0].as_str().unwrap().parse::<i64>().unwrap() * 1000;
                score - now
            }
            _ => int(&server, &["PTTL", key.as_str()]),
        };
        let longer = backend.extend(extend(&key, kind, "h1#1", 20_000)).await.unwrap();
        assert_eq!(longer, ExtendReply::Extended { token: None }, "{kind:?}");
        assert!(left() > 15_000, "{kind:?}");
        backend.extend(extend(&key, kind, "h1#1", 1000)).await.unwrap();
        assert!(left() > 15_000, "{kind:?}: shortened");
        if kind.owns() {
            let fenced = Extend { fencing: true, ..extend(&key, kind, "h1#1", 1000) };
            let ExtendReply::Extended { token: Some(token) } =
                backend.extend(fenced).await.unwrap()
            else {
                panic!("{kind:?}: no token");
            };
            let again = backend.extend(fenced).await.unwrap();
            assert_eq!(again, ExtendReply::Extended { token: Some(token) }, "{kind:?}");
            assert_eq!(text(&server, &["GET", key.as_str()]), Some(format!("h1#1~{token}")));
            assert!(left() > 15_000, "{kind:?}: the token shortened the lease");
        }
        backend.abandon(grant(&key, kind, "h1#1")).await.unwrap();
        let ended = backend.extend(extend(&key, kind, "h1#1", 20_000)).await.unwrap();
        assert_eq!(ended, ExtendReply::NotHeld, "{kind:?}");
        assert_eq!(recorded(&server, &key, kind, "h1#1"), None, "{kind:?}");
    }
}

/// A renewal extends the grants it names, in one pipeline: never shorter, never another grant,
/// and never a shared grant whose lease ended.
#[tokio::test]
async fn a_renewal_never_shortens_nor_revives() {
    let server = RedisServer::start();
    let backend = connect(&server).await;
    let keys: Vec<LockKey> =
        KINDS.iter().map(|&kind| key(&format!("renew-{kind:?}"), kind)).collect();
    for (key, kind) in keys.iter().zip(KINDS) {
        acquired(backend.acquire(grant(key, kind, "h1#1")).await.unwrap());
    }
    let renew = |attempt, ms| -> Vec<Renew<'_>> {
        keys.iter().zip(KINDS).map(|(key, kind)| renewal(key, kind, attempt, ms)).collect()
    };
    let renewed = backend.renew(&renew("h1#1", 30_000)).await.unwrap();
    assert_eq!(renewed, [RenewReply::Renewed; 5]);
    assert!(int(&server, &["PTTL", keys[0].as_str()]) > 25_000);
    assert!(int(&server, &["PTTL", &keys[3].derived(":readers")]) > 25_000);
    let shorter = backend.renew(&renew("h1#1", 1000)).await.unwrap();
    assert_eq!(shorter, [RenewReply::Renewed; 5]);
    assert!(int(&server, &["PTTL", keys[0].as_str()]) > 25_000);
    assert!(int(&server, &["PTTL", keys[4].as_str()]) > 25_000);
    let other = backend.renew(&renew("h1#2", 30_000)).await.unwrap();
    assert_eq!(other, [RenewReply::NotHeld; 5]);
    // Shared grants whose lease ended (their score is past): not renewed, not revived.
    server.cmd(&["ZADD", &keys[3].derived(":readers"), "1", "h1#1"]);
    server.cmd(&["ZADD", keys[4].as_str(), "1", "h1#1"]);
    let ended = backend.renew(&renew("h1#1", 30_000)).await.unwrap();
    assert_eq!(&ended[3..], [RenewReply::NotHeld; 2]);
    assert_eq!(recorded(&server, &keys[3], LockKind::Read, "h1#1").as_deref(), Some("1"));
    assert_eq!(recorded(&server, &keys[4], LockKind::Semaphore, "h1#1").as_deref(), Some("1"));
    // More grants than one call takes: split into several calls of the same pipeline.
    let many: Vec<LockKey> =
        (0..1200).map(|n| key(&format!("many-{n}"), LockKind::Exclusive)).collect();
    for key in &many {
        acquired(backend.acquire(grant(key, LockKind::Exclusive, "h1#1")).await.unwrap());
    }
    let batch: Vec<Renew<'_>> =
        many.iter().map(|key| renewal(key, LockKind::Exclusive, "h1#1", 30_000)).collect();
    let evalsha = server.calls("evalsha");
    assert_eq!(backend.renew(&batch).await.unwrap(), vec![RenewReply::Renewed; 1200]);
    assert_eq!(server.calls("evalsha") - evalsha, 3);
}

/// An acquire delivered after its "not after" does nothing and answers so; it is sent once
/// more on a new connection, which grants it.
#[tokio::test]
async fn a_late_acquire_is_sent_again_on_a_new_connection() {
    let server = RedisServer::start();
    let backend = support::redis_backend(server.url())
        .command_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    let key = key("late", LockKind::Fair);
    // The script is loaded and the connection knows the server's clock.
    let warm = grant(&key, LockKind::Fair, "h1#1");
    acquired(backend.acquire(warm).await.unwrap());
    backend.release(release(&key, LockKind::Fair, "h1#1")).await.unwrap();
    let connections = || {
        let stats = server.info("stats").unwrap();
        let field = stats.lines().find_map(|line| line.strip_prefix("total_connections_received:"));
        field.unwrap().trim().parse::<u64>().unwrap()
    };
    let (evalsha, opened) = (server.calls("evalsha"), connections());
    // Long enough that its drift margin (1 % + 2 ms) takes the clock reading's round trip on a
    // loaded machine: the connection then sends a "not after".
    let lease = Duration::from_millis(1500);
    server.pause();
    let acquire = backend
        .acquire(Grant { lease: Lease::fixed(lease), ..grant(&key, LockKind::Fair, "h1#2") });
    let stall = async {
        // The stall itself: the server's clock goes on while it is stopped.
        tokio::time::sleep(lease + Duration::from_millis(100)).await;
        server.resume();
    };
    let (reply, ()) = tokio::join!(acquire, stall);
    acquired(reply.unwrap());
    // The backend's new connection, and this reading's own.
    assert_eq!(connections() - opened, 2, "the retry went on a new connection");
    assert_eq!(server.calls("evalsha") - evalsha, 2);
}

/// A fresh server run grants nothing until the quarantine has passed since it started, by the
/// run marker, also through an application's pool; meanwhile nothing takes the `SET NX` path.
/// The marker keeps the run's origin once the quarantine is over (another process may wait a
/// longer one from it). Once a script saw the run past it, the connection's plain locks are one
/// `SET NX`.
#[tokio::test]
async fn a_fresh_run_is_quarantined_by_its_run_marker() {
    let mut server = RedisServer::start();
    server.restart();
    let quarantine = Duration::from_millis(1500);
    let backend =
        support::redis_backend(server.url()).quarantine(quarantine).connect().await.unwrap();
    let manager = bb8_redis::RedisConnectionManager::new(server.url()).unwrap();
    let pool = bb8::Pool::builder().build(manager).await.unwrap();
    let pooled = support::redis_backend(server.url())
        .quarantine(quarantine)
        .pool(pool)
        .connect()
        .await
        .unwrap();
    let key = key("fresh", LockKind::Exclusive);
    let lease = Grant {
        lease: Lease::fixed(Duration::from_millis(500)),
        ..grant(&key, LockKind::Exclusive, "h1#1")
    };
    let error = backend.acquire(lease).await.unwrap_err();
    assert_eq!(*error.kind(), BackendErrorKind::Quarantined, "{error}");
    let left = error.retry_after().unwrap();
    // From the end of the second the run started in: up to a second more than the quarantine.
    assert!(left <= quarantine + Duration::from_secs(1), "{left:?}");
    let marker = text(&server, &["GET", "tl:{}:run"]).unwrap();
    assert_eq!(marker.split(' ').count(), 2, "{marker}");
    let error = pooled.acquire(grant(&key, LockKind::Exclusive, "h2#1")).await.unwrap_err();
    assert_eq!(*error.kind(), BackendErrorKind::Quarantined, "{error}");
    assert_eq!(text(&server, &["GET", key.as_str()]), None, "granted in quarantine");

    // The time the store gave, not a guess.
    tokio::time::sleep(left).await;
    acquired(backend.acquire(Grant { attempt: "h1#2", ..lease }).await.unwrap());
    assert_eq!(text(&server, &["GET", "tl:{}:run"]), Some(marker));
    backend.release(release(&key, LockKind::Exclusive, "h1#2")).await.unwrap();
    let evalsha = server.calls("evalsha");
    acquired(backend.acquire(Grant { attempt: "h1#3", ..lease }).await.unwrap());
    assert_eq!(server.calls("evalsha"), evalsha, "one SET NX, no script");
    assert_eq!(text(&server, &["GET", key.as_str()]).as_deref(), Some("h1#3"));

    // Restarted, the server starts a new run, quarantined again: the connection that saw the
    // old one past it went with it (its first command may fail on the dead socket).
    server.restart();
    let mut refused = None;
    for attempt in ["h1#4", "h1#5", "h1#6"] {
        let error = backend.acquire(Grant { attempt, ..lease }).await.unwrap_err();
        if *error.kind() == BackendErrorKind::Quarantined {
            refused = Some(error);
            break;
        }
    }
    assert!(refused.is_some(), "a new run granted at once");
    assert_eq!(text(&server, &["GET", key.as_str()]), None);
}

/// A hash at a lock's key (a lock of the protocol before, or anyone's data) fails every script
/// that reads it with `WRONGTYPE` naming it, and is left as it was.
#[tokio::test]
async fn an_old_layout_hash_is_named_and_left_alone() {
    let server = RedisServer::start();
    let backend = connect(&server).await;
    for kind in [LockKind::Exclusive, LockKind::Write, LockKind::Semaphore] {
        let key = key(&format!("old-{kind:?}"), kind);
        server.cmd(&["HSET", key.as_str(), "h1", "2"]);
        let wrong = |error: crate::error::BackendError| {
            assert!(
                matches!(error.kind(), BackendErrorKind::WrongType { found } if found == "hash"),
                "{kind:?}: {error:#}"
            );
        };
        wrong(backend.acquire(grant(&key, kind, "h1#1")).await.unwrap_err());
        wrong(backend.release(release(&key, kind, "h1#1")).await.unwrap_err());
        wrong(backend.inspect(&key, kind).await.unwrap_err());
        let renewed = backend.renew(&[renewal(&key, kind, "h1#1", 1000)]).await.unwrap();
        assert_eq!(renewed, [RenewReply::NotHeld]);
        assert_eq!(text(&server, &["HGET", key.as_str(), "h1"]).as_deref(), Some("2"));
        assert_eq!(int(&server, &["PTTL", key.as_str()]), -1, "{kind:?}");
    }
}

/// Scripts the server lost (`SCRIPT FLUSH`) are sent again by body, by a single call and
/// inside the renewal pipeline.
#[tokio::test]
async fn lost_scripts_are_sent_by_body() {
    let server = RedisServer::start();
    let backend = connect(&server).await;
    let fair = key("flush", LockKind::Fair);
    let read = key("flush", LockKind::Read);
    acquired(backend.acquire(grant(&fair, LockKind::Fair, "h1#1")).await.unwrap());
    acquired(backend.acquire(grant(&read, LockKind::Read, "h1#1")).await.unwrap());
    held(
        backend
            .acquire(Grant {
                queue: Some(Duration::from_secs(5)),
                ..grant(&fair, LockKind::Fair, "h2#1")
            })
            .await
            .unwrap(),
    );
    server.cmd(&["SCRIPT", "FLUSH"]);
    let eval = server.calls("eval");
    let batch = [
        renewal(&fair, LockKind::Fair, "h1#1", 5000),
        renewal(&read, LockKind::Read, "h1#1", 5000),
        Renew::Place {
            key: &fair,
            kind: LockKind::Fair,
            holder: "h2",
            timeout: Duration::from_secs(5),
        },
    ];
    let replies = backend.renew(&batch).await.unwrap();
    assert_eq!(replies, [RenewReply::Renewed, RenewReply::Renewed, RenewReply::Renewed]);
    assert_eq!(server.calls("eval") - eval, 2);
    server.cmd(&["SCRIPT", "FLUSH"]);
    let freed = backend.release(release(&fair, LockKind::Fair, "h1#1")).await.unwrap();
    assert!(matches!(freed, ReleaseReply::Released { .. }));
    assert_eq!(server.calls("eval") - eval, 3);
}

/// A second listener of a channel whose subscribe is still on its way does not resolve
/// before Redis confirmed it: its caller checks the lock again counting on every release
/// from then on reaching it.
#[tokio::test]
async fn every_listener_waits_for_the_subscription() {
    let (confirm, confirmed) = oneshot::channel::<()>();
    let pubsub = Arc::new(PubSub::spawn(Duration::from_secs(5), true, |mut feed| async move {
        // Holds every request until the test lets the subscription be confirmed.
        let mut waiting = Vec::new();
        let mut confirmed = confirmed;
        loop {
            tokio::select! {
                Some((_, done)) = feed.requests.recv() => waiting.push(done),
                _ = &mut confirmed => break,
            }
        }
        for done in waiting {
            let _ = done.send(());
        }
        // Subscribed from now on: every request is answered at once.
        while let Some((_, done)) = feed.requests.recv().await {
            let _ = done.send(());
        }
    }));
    let first = tokio::spawn({
        let pubsub = pubsub.clone();
        async move { pubsub.listen("lock:released".to_owned(), None).await }
    });
    while pubsub.channel_count() == 0 {
        tokio::task::yield_now().await;
    }
    let second = tokio::time::timeout(
        Duration::from_millis(50),
        pubsub.listen("lock:released".to_owned(), None),
    )
    .await;
    assert!(second.is_err(), "the second listener did not wait for the subscription");
    confirm.send(()).unwrap();
    let _first = first.await.unwrap();
    let third = tokio::time::timeout(
        Duration::from_secs(1),
        pubsub.listen("lock:released".to_owned(), None),
    )
    .await;
    assert!(third.is_ok(), "a confirmed subscription answers at once");
}

/// While the task has no connection, a listener does not wait for a subscription that
/// cannot be confirmed before the reconnect: it is registered, and the reconnect wakes it.
#[tokio::test]
async fn a_listener_does_not_wait_while_disconnected() {
    let (requests_seen, mut seen) = mpsc::unbounded_channel();
    let pubsub = PubSub::spawn(Duration::from_secs(5), false, |mut feed| async move {
        // Never connects: requests are kept, never answered.
        let mut kept = Vec::new();
        while let Some(request) = feed.requests.recv().await {
            let _ = requests_seen.send(());
            kept.push(request);
        }
    });
    let listener = tokio::time::timeout(
        Duration::from_secs(1),
        pubsub.listen("lock:released".to_owned(), None),
    )
    .await;
    assert!(listener.is_ok(), "the listener waited for a connection that is down");
    seen.recv().await.expect("the subscription is still asked for");
    assert_eq!(pubsub.channel_count(), 1, "the listener is registered");
}

/// Each script is hashed from its own file; the release's common case comes before the
/// helpers, which follow it.
#[test]
fn scripts_differ_and_helpers_follow_the_common_case() {
    let all = |s: &'static Scripts| {
        [&s.acquire, &s.release, &s.share, &s.unshare, &s.renew, &s.wait, &s.inspect]
            .map(|lua| lua.script.get_hash().to_owned())
    };
    let hashes = all(&SCRIPTS);
    for (i, hash) in hashes.iter().enumerate() {
        assert!(hashes[i + 1..].iter().all(|other| other != hash));
    }
    let release = &SCRIPTS.release.code;
    assert!(release.starts_with(PUBLISH));
    assert!(release.find("'DEL'").unwrap() < release.find("local function now_ms").unwrap());
    #[cfg(feature = "cluster")]
    for (node, cluster) in hashes.iter().zip(all(&super::scripts::SHARDED_SCRIPTS)) {
        assert_ne!(*node, cluster);
    }
}

/// The "not after" of a request sent now covers the lease the client trusts, and no more than
/// the lease.
#[tokio::test(start_paused = true)]
async fn the_expiry_covers_the_trusted_lease_and_no_more_than_the_lease() {
    let lease = Lease::fixed(Duration::from_secs(10));
    let clock = ServerClock {
        answered: tokio::time::Instant::now(),
        server_ms: 1_000_000,
        round_trip: Duration::from_micros(300),
    };
    tokio::time::advance(Duration::from_millis(7)).await;
    // The server's clock is now within 1_000_007 and 1_000_009 (a reading rounded down
    // and the round trip): the lease from the lower bound, the margin covers the rest.
    assert_eq!(clock.expiry(&lease), Some(1_000_007 + 10_000));
    // A slow reading that the margin (102 ms) does not cover is not used: the hold would
    // outlive its lease by what it does not cover.
    let slow = ServerClock { round_trip: Duration::from_millis(500), ..clock };
    assert_eq!(slow.expiry(&lease), None);
    // A longer lease's margin covers it.
    assert!(slow.expiry(&Lease::fixed(Duration::from_secs(60))).is_some());
}
