//! The scripts' attempt bookkeeping, driven through the `Backend` trait against a real
//! `redis-server` (the test fixture of `tests/support`).

use crate::test_support as support;

use std::time::Duration;

use crate::{
    backend::{
        AcquireReply, Backend, Grant, LockKind, Reentry, Release, ReleaseReply, Renew, RenewReply,
    },
    lease::Lease,
    lock_key::LockKey,
};

fn grant<'a>(
    key: &'a LockKey,
    kind: LockKind,
    attempt: &'a str,
    supersedes: Option<&'a str>,
) -> Grant<'a> {
    Grant {
        key,
        holder: "h1",
        attempt,
        lease: Lease::fixed(Duration::from_secs(10)),
        fencing: false,
        kind,
        queue: None,
        supersedes,
        reentry: Reentry::Allowed,
        contended: false,
        permits: 1,
    }
}

/// A backend on `server`.
async fn connect(server: &support::RedisServer) -> super::RedisBackend {
    support::redis_backend(server.url())
        .connect()
        .await
        .unwrap()
}

/// A backend on `server` whose exclusive watchdog holds live on a client lease.
async fn connect_leased(server: &support::RedisServer) -> super::RedisBackend {
    support::redis_backend(server.url())
        .client_lease(true)
        .connect()
        .await
        .unwrap()
}

/// A plain connection to `server`, to read and write keys beside the backend.
async fn direct(server: &support::RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

fn count(reply: AcquireReply) -> u64 {
    match reply {
        AcquireReply::Acquired { count, .. } => count,
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// An attempt whose reply was lost took the lock; the retry that supersedes it takes that hold
/// over instead of adding a second, the late undo of the lost attempt changes nothing, and one
/// release frees the lock. Without `supersedes` the retry would have counted two holds.
#[tokio::test]
async fn a_retry_takes_over_the_hold_of_a_lost_attempt() {
    let server = support::RedisServer::start();
    let backend = connect(&server).await;
    for kind in [LockKind::Exclusive, LockKind::Fair, LockKind::Write] {
        let key = LockKey::new("tl:", format!("retry-{kind:?}").as_bytes(), 512).unwrap();
        let key = if kind == LockKind::Write {
            key.with_suffix(":rw")
        } else {
            key
        };
        let lost = backend
            .acquire(grant(&key, kind, "a1", None))
            .await
            .unwrap();
        assert_eq!(count(lost), 1);
        let retry = backend
            .acquire(grant(&key, kind, "a2", Some("a1")))
            .await
            .unwrap();
        assert_eq!(count(retry), 1, "{kind:?}: the retry added a hold");
        let undone = backend
            .abandon(grant(&key, kind, "a1", None))
            .await
            .unwrap();
        assert!(!undone, "{kind:?}: the late undo took the retry's hold");
        // A re-entry that supersedes nothing still counts.
        let again = backend
            .acquire(grant(&key, kind, "a3", Some("a1")))
            .await
            .unwrap();
        assert_eq!(count(again), 2, "{kind:?}");
        for remaining in [1, 0] {
            let release = Release {
                key: &key,
                holder: "h1",
                all: false,
                handoff: None,
                kind,
                attempt: None,
                hold: None,
            };
            let reply = backend.release(release).await.unwrap();
            if remaining == 0 {
                assert!(
                    matches!(reply, ReleaseReply::Released { .. }),
                    "{kind:?}: {reply:?}"
                );
            } else {
                assert_eq!(reply, ReleaseReply::Decremented { remaining }, "{kind:?}");
            }
        }
    }
}

/// The key of a `kind` lock named `name` (a read-write lock's and a semaphore's carry their
/// suffix).
fn kind_key(name: &str, kind: LockKind) -> LockKey {
    let key = LockKey::new("tl:", name.as_bytes(), 512).unwrap();
    match kind {
        LockKind::Read | LockKind::Write => key.with_suffix(":rw"),
        LockKind::Semaphore => key.with_suffix(":sem"),
        _ => key,
    }
}

/// The release of one of `h1`'s holds of `key`, naming `attempt`.
fn release_naming<'a>(key: &'a LockKey, kind: LockKind, attempt: &'a str) -> Release<'a> {
    Release {
        key,
        holder: "h1",
        all: false,
        handoff: None,
        kind,
        attempt: Some(attempt),
        hold: None,
    }
}

/// Asserts that a release of a `kind` lock freed it.
fn assert_freed(reply: ReleaseReply, kind: LockKind) {
    assert!(
        matches!(reply, ReleaseReply::Released { .. }),
        "{kind:?}: {reply:?}"
    );
}

/// `h1`'s acquire of `key`, sent as after finding the lock held (no `SET NX` first).
fn contended<'a>(
    key: &'a LockKey,
    kind: LockKind,
    attempt: &'a str,
    supersedes: Option<&'a str>,
) -> Grant<'a> {
    Grant {
        contended: true,
        ..grant(key, kind, attempt, supersedes)
    }
}

/// A release naming the attempt that granted the hold gives back one hold and keeps the record
/// while holds remain; once the holder has taken the lock anew, it gives back nothing and
/// leaves no record of the old attempt behind. Every kind of lock.
#[tokio::test]
async fn a_release_naming_its_grant_frees_nothing_taken_anew() {
    let server = support::RedisServer::start();
    let backend = connect(&server).await;
    let mut conn = direct(&server).await;
    for kind in [
        LockKind::Exclusive,
        LockKind::Fair,
        LockKind::Read,
        LockKind::Write,
        LockKind::Semaphore,
    ] {
        let key = kind_key(&format!("named-{kind:?}"), kind);
        let release = |attempt| release_naming(&key, kind, attempt);
        let contended = |attempt| contended(&key, kind, attempt, None);
        assert_eq!(count(backend.acquire(contended("g1")).await.unwrap()), 1);
        assert_eq!(count(backend.acquire(contended("g2")).await.unwrap()), 2);
        let one = backend.release(release("g1")).await.unwrap();
        assert_eq!(one, ReleaseReply::Decremented { remaining: 1 }, "{kind:?}");
        assert_freed(backend.release(release("g1")).await.unwrap(), kind);

        assert_eq!(count(backend.acquire(contended("g3")).await.unwrap()), 1);
        let stale = backend.release(release("g1")).await.unwrap();
        assert_eq!(stale, ReleaseReply::NotHeld, "{kind:?}");
        let other = Grant {
            holder: "h2",
            kind: if kind == LockKind::Read {
                LockKind::Write
            } else {
                kind
            },
            ..contended("o1")
        };
        let refused = backend.acquire(other).await.unwrap();
        assert!(
            matches!(refused, AcquireReply::Held { .. }),
            "{kind:?}: {refused:?}"
        );
        let void: i64 = read(&mut conn, "EXISTS", &key.derived(":void")).await;
        assert_eq!(void, 0, "{kind:?}: the stale release left a record");
        assert_freed(backend.release(release("g3")).await.unwrap(), kind);
    }
}

/// A holder holds twice (the second hold joined through another client, say), its second
/// hold's reply was lost, and its first hold is released: the retry that supersedes the lost
/// attempt takes over the only hold left, which is then its grant, so the release naming it
/// frees the lock.
#[tokio::test]
async fn a_retry_that_takes_over_the_last_hold_is_its_grant() {
    let server = support::RedisServer::start();
    let backend = connect(&server).await;
    for kind in [
        LockKind::Exclusive,
        LockKind::Fair,
        LockKind::Write,
        LockKind::Semaphore,
    ] {
        let key = kind_key(&format!("takeover-{kind:?}"), kind);
        let release = |attempt| release_naming(&key, kind, attempt);
        let acquire = |attempt, supersedes| contended(&key, kind, attempt, supersedes);
        assert_eq!(
            count(backend.acquire(acquire("g1", None)).await.unwrap()),
            1
        );
        assert_eq!(
            count(backend.acquire(acquire("b1", None)).await.unwrap()),
            2
        );
        let first = backend.release(release("g1")).await.unwrap();
        assert_eq!(
            first,
            ReleaseReply::Decremented { remaining: 1 },
            "{kind:?}"
        );
        let retry = backend.acquire(acquire("b2", Some("b1"))).await.unwrap();
        assert_eq!(count(retry), 1, "{kind:?}");
        assert_freed(backend.release(release("b2")).await.unwrap(), kind);
    }
}

/// A single hold (the `SET NX` form) is freed only by its holder, and by a release naming an
/// attempt only for that attempt: a holder whose name starts like the owner's, or the owner
/// naming another attempt, leaves it held. The owner's plain release frees it and says nobody
/// was notified.
#[tokio::test]
async fn a_single_hold_is_freed_by_its_holder_only() {
    let server = support::RedisServer::start();
    let backend = connect(&server).await;
    let key = LockKey::new("tl:", b"single", 512).unwrap();
    let acquired = backend
        .acquire(Grant {
            holder: "h1",
            ..grant(&key, LockKind::Exclusive, "h1#7", None)
        })
        .await
        .unwrap();
    assert_eq!(count(acquired), 1);
    let mut conn = direct(&server).await;
    let stored: String = redis::cmd("GET")
        .arg(key.as_str())
        .query_async(&mut conn)
        .await
        .expect("a free lock taken by SET NX is a string");
    assert_eq!(stored, "2:h1h1#7");
    let release = |holder, attempt| Release {
        key: &key,
        holder,
        all: false,
        handoff: None,
        kind: LockKind::Exclusive,
        attempt,
        hold: None,
    };
    for (holder, attempt) in [
        ("h", None),
        ("h1h", None),
        ("2:h1", None),
        ("h1", Some("h1#8")),
    ] {
        let reply = backend.release(release(holder, attempt)).await.unwrap();
        assert_eq!(reply, ReleaseReply::NotHeld, "{holder} {attempt:?}");
    }
    let reply = backend.release(release("h1", Some("h1#7"))).await.unwrap();
    assert_eq!(reply, ReleaseReply::Released { notified: Some(0) });
    let exists: bool = redis::cmd("EXISTS")
        .arg(key.as_str())
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!exists);

    // Another holder's owner prefix inside the value, not at its start, is no match.
    let inner = LockKey::new("tl:", b"single-inner", 512).unwrap();
    let acquired = backend
        .acquire(grant(&inner, LockKind::Exclusive, "1:h", None))
        .await
        .unwrap();
    assert_eq!(count(acquired), 1);
    let reply = backend
        .release(Release {
            key: &inner,
            ..release("h", None)
        })
        .await
        .unwrap();
    assert_eq!(reply, ReleaseReply::NotHeld);
}

/// A renewal, alone or in a batch, extends a lock's lease to the one it asks for and never
/// shortens a longer one, in either of the lock's forms (a single hold, a hash), and renews
/// nothing of another holder's.
#[tokio::test]
async fn a_renewal_extends_a_lease_and_never_shortens_it() {
    use super::{calls, run_call, scripts::SCRIPTS};
    use crate::backend::Renew;

    let server = support::RedisServer::start();
    let backend = connect(&server).await;
    let mut conn = direct(&server).await;
    let pttl = async |conn: &mut redis::aio::MultiplexedConnection, key: &LockKey| -> i64 {
        redis::cmd("PTTL")
            .arg(key.as_str())
            .query_async(conn)
            .await
            .unwrap()
    };
    let single = LockKey::new("tl:", b"renew-single", 512).unwrap();
    let hash = LockKey::new("tl:", b"renew-hash", 512).unwrap();
    for key in [&single, &hash] {
        let acquired = backend
            .acquire(grant(key, LockKind::Exclusive, "h1#1", None))
            .await
            .unwrap();
        assert_eq!(count(acquired), 1);
    }
    // A re-entry makes the second lock a hash.
    let reentered = backend
        .acquire(grant(&hash, LockKind::Exclusive, "h1#2", None))
        .await
        .unwrap();
    assert_eq!(count(reentered), 2);

    let renew = |key, holder, secs| Renew {
        key,
        holder,
        lease: Lease::watchdog(Duration::from_secs(secs)),
        kind: LockKind::Exclusive,
        queued: false,
        session: 0,
        attempt: None,
    };
    for key in [&single, &hash] {
        for batched in [false, true] {
            let run = async |conn: &mut redis::aio::MultiplexedConnection, r: &Renew<'_>| {
                if batched {
                    let call = calls::renew_many(&SCRIPTS, [r].into_iter());
                    let replies: Vec<i64> = run_call(&call, conn).await.unwrap();
                    replies[0]
                } else {
                    run_call(&calls::renew(&SCRIPTS, r), conn).await.unwrap()
                }
            };
            // A shorter lease extended to the renewal's 20 s; a longer one kept.
            for (lease_ms, at_least) in [(2_000, 15_000), (60_000, 50_000)] {
                let _: () = redis::cmd("PEXPIRE")
                    .arg(key.as_str())
                    .arg(lease_ms)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                assert_eq!(run(&mut conn, &renew(key, "h1", 20)).await, 1, "{key:?}");
                let left = pttl(&mut conn, key).await;
                assert!(
                    left > at_least,
                    "{key:?} batched {batched}: {lease_ms} ms renewed to {left} ms"
                );
            }

            assert_eq!(run(&mut conn, &renew(key, "h2", 90)).await, 0, "{key:?}");
            let left = pttl(&mut conn, key).await;
            assert!(
                left <= 60_000,
                "{key:?} batched {batched}: another's renewal"
            );
        }
    }
}

/// A refused acquire turns a single hold into a hash with the hold's lease; a hold read in its
/// last millisecond (no time left) is over, not turned into a hash without a lease, which would
/// never expire. Many holds of 2 ms, each tried again and again by another holder while it
/// runs out: afterwards, every lock key left has a lease.
#[tokio::test]
async fn a_hold_in_its_last_millisecond_never_becomes_a_lock_without_a_lease() {
    use super::{calls, run_call, scripts::SCRIPTS};

    let server = support::RedisServer::start();
    let mut conn = direct(&server).await;
    let keys: Vec<LockKey> = (0..500)
        .map(|i| LockKey::new("tl:", format!("last-ms-{i}").as_bytes(), 512).unwrap())
        .collect();
    for round in 0..6 {
        let mut holds = redis::pipe();
        for key in &keys {
            // A single hold of h1 (see acquire.lua), about to run out.
            holds
                .cmd("SET")
                .arg(key.as_str())
                .arg("2:h1h1#1")
                .arg("PX")
                .arg(2)
                .ignore();
        }
        let () = holds.query_async(&mut conn).await.unwrap();
        let attempt = format!("h2#{round}");
        for _ in 0..3 {
            for key in &keys {
                let call = calls::acquire(
                    &SCRIPTS,
                    &Grant {
                        holder: "h2",
                        ..grant(key, LockKind::Exclusive, &attempt, None)
                    },
                    "",
                    None,
                    None,
                );
                let _: redis::Value = run_call(&call, &mut conn).await.unwrap();
            }
        }
        let mut leases = redis::pipe();
        for key in &keys {
            leases.cmd("PTTL").arg(key.as_str());
        }
        let leases: Vec<i64> = leases.query_async(&mut conn).await.unwrap();
        let without = leases.iter().filter(|&&ttl| ttl == -1).count();
        assert_eq!(without, 0, "round {round}: lock keys without a lease");
        let mut clear = redis::pipe();
        for key in &keys {
            clear.cmd("DEL").arg(key.as_str()).ignore();
        }
        let () = clear.query_async(&mut conn).await.unwrap();
    }
}

/// A renewal that arrives after a reader's (or a semaphore permit's) lease ended, while the
/// lock itself lives on for another holder, does not bring the hold back.
#[tokio::test]
async fn a_late_renewal_does_not_revive_a_reader_or_a_permit() {
    use crate::backend::{Renew, RenewReply};

    let server = support::RedisServer::start();
    let backend = connect(&server).await;
    for (kind, suffix) in [(LockKind::Read, ":rw"), (LockKind::Semaphore, ":sem")] {
        let key = LockKey::new("tl:", format!("late-{kind:?}").as_bytes(), 512).unwrap();
        let key = key.with_suffix(suffix);
        let long = Grant {
            holder: "h-long",
            lease: Lease::fixed(Duration::from_secs(30)),
            permits: 2,
            ..grant(&key, kind, "l1", None)
        };
        let short = Grant {
            holder: "h-short",
            lease: Lease::fixed(Duration::from_millis(50)),
            permits: 2,
            ..grant(&key, kind, "s1", None)
        };
        count(backend.acquire(long).await.unwrap());
        count(backend.acquire(short).await.unwrap());
        tokio::time::sleep(Duration::from_millis(120)).await;
        let renew = Renew::hold(&key, "h-short", Lease::fixed(Duration::from_secs(30)), kind);
        let replies = backend.renew(&[renew]).await.unwrap();
        assert_eq!(replies, [RenewReply::NotHeld], "{kind:?}");
    }
}

/// Every script through its typed call (`calls.rs`) against a real server, for every lock
/// kind: each answers in the shape its Lua file documents, so an argument out of place shows up
/// as a script error or a wrong answer here.
#[tokio::test]
async fn every_script_round_trips_through_its_typed_call() {
    use redis::Value;

    use futures_util::StreamExt;

    use super::{calls, reply_pair, run_call, scripts::SCRIPTS};
    use crate::backend::Renew;

    let server = support::RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let scripts = &*SCRIPTS;
    let lease = Lease::fixed(Duration::from_secs(10));
    for kind in [
        LockKind::Exclusive,
        LockKind::Fair,
        LockKind::Read,
        LockKind::Write,
        LockKind::Semaphore,
    ] {
        let key = LockKey::new("rt:", format!("{kind:?}").as_bytes(), 512).unwrap();
        let key = match kind {
            LockKind::Read | LockKind::Write => key.with_suffix(":rw"),
            LockKind::Semaphore => key.with_suffix(":sem"),
            _ => key,
        };
        let grant = |holder, attempt, queue| Grant {
            key: &key,
            holder,
            attempt,
            lease,
            fencing: true,
            kind,
            queue,
            supersedes: None,
            reentry: Reentry::Allowed,
            contended: false,
            // One permit: a semaphore refuses the second holder as the other kinds do.
            permits: 1,
        };

        // A grant with a fencing token (not for readers or a semaphore's permits, which are
        // shared): {1, count, token}.
        let call = calls::acquire(scripts, &grant("h1", "h1#1", None), "", None, None);
        let reply: Vec<i64> = run_call(&call, &mut conn).await.unwrap();
        assert_eq!(reply[..2], [1, 1], "{kind:?} acquire: {reply:?}");
        let fenced = !matches!(kind, LockKind::Read | LockKind::Semaphore);
        assert_eq!(reply[2] > 0, fenced, "{kind:?} acquire's token: {reply:?}");

        // Another holder, queued where the kind queues: refused with the lease left.
        let queue = kind.queues().then_some(Duration::from_secs(5));
        if kind != LockKind::Read {
            let call = calls::acquire(scripts, &grant("h2", "h2#1", queue), "", None, None);
            let reply: Vec<i64> = run_call(&call, &mut conn).await.unwrap();
            assert_eq!(reply[0], 0, "{kind:?} refuses another holder: {reply:?}");
            assert!(reply[1] > 0, "{kind:?} tells the lease left: {reply:?}");
            // Its place kept, then given up.
            if kind.queues() {
                let place = Renew::place(&key, "h2", Duration::from_secs(5), kind);
                let kept: i64 = run_call(&calls::renew(scripts, &place), &mut conn)
                    .await
                    .unwrap();
                assert_eq!(kept, 1, "{kind:?} keeps the waiter's place");
                let leave = calls::leave(scripts, &key, "h2", kind).expect("a queue");
                let _: i64 = run_call(&leave, &mut conn).await.unwrap();
            }
        }

        // The hold renewed, alone and in a batch where the kind goes into one: by its
        // holder, naming its grant, and not naming an attempt that did not grant it.
        let hold = Renew {
            key: &key,
            holder: "h1",
            lease,
            kind,
            queued: false,
            session: 0,
            attempt: None,
        };
        for (renew, held) in [
            (hold, 1),
            (hold.granted_by("h1#1"), 1),
            (hold.granted_by("h1#0"), 0),
        ] {
            let renewed: i64 = run_call(&calls::renew(scripts, &renew), &mut conn)
                .await
                .unwrap();
            assert_eq!(renewed, held, "{kind:?} renews: {:?}", renew.attempt);
            if calls::renews_with_many(&renew) {
                let call = calls::renew_many(scripts, [&renew].into_iter());
                let renewed: Vec<i64> = run_call(&call, &mut conn).await.unwrap();
                assert_eq!(renewed, [held], "{kind:?} in a batch: {:?}", renew.attempt);
            }
        }

        // An attempt that took nothing, given up on: nothing undone.
        let call = calls::abandon(scripts, &grant("h3", "h3#1", None), None);
        let value: Value = run_call(&call, &mut conn).await.unwrap();
        let undone = match value {
            Value::Int(undone) => undone,
            pair => reply_pair(pair).unwrap().0,
        };
        assert_eq!(
            undone, 0,
            "{kind:?} abandon of an attempt that took nothing"
        );

        // The release: the lock freed ({2, n}; a read-write side done, {3}), published on the
        // lock's channel when another holder was refused.
        let mut listener = client.get_async_pubsub().await.unwrap();
        listener
            .subscribe(key.derived(super::CHANNEL))
            .await
            .unwrap();
        let release = Release {
            key: &key,
            holder: "h1",
            all: false,
            handoff: None,
            kind,
            attempt: None,
            hold: None,
        };
        let value: Value = run_call(&calls::release(scripts, &release, None), &mut conn)
            .await
            .unwrap();
        let (status, notified) = reply_pair(value).unwrap();
        assert!(matches!(status, 2 | 3), "{kind:?} release: {status}");
        if status == 2 && kind != LockKind::Read {
            assert_eq!(notified, Some(1), "{kind:?} release reaches the listener");
        }
    }

    // An exclusive release that hands the lock over: {3, token}.
    let key = LockKey::new("rt:", b"handoff", 512).unwrap();
    let first = Grant {
        key: &key,
        holder: "h1",
        attempt: "h1#9",
        lease,
        fencing: false,
        kind: LockKind::Exclusive,
        queue: None,
        supersedes: None,
        reentry: Reentry::Allowed,
        contended: false,
        permits: 0,
    };
    let _: Vec<i64> = run_call(&calls::acquire(scripts, &first, "", None, None), &mut conn)
        .await
        .unwrap();
    let next = Grant {
        holder: "h2",
        attempt: "h2#9",
        fencing: true,
        ..first
    };
    let release = Release {
        key: &key,
        holder: "h1",
        all: false,
        handoff: None,
        kind: LockKind::Exclusive,
        attempt: Some("h1#9"),
        hold: None,
    };
    let value: Value = run_call(&calls::release(scripts, &release, Some(&next)), &mut conn)
        .await
        .unwrap();
    let (status, token) = reply_pair(value).unwrap();
    assert_eq!(status, 3, "handed over");
    assert!(
        token.is_some_and(|token| token > 0),
        "with a token: {token:?}"
    );

    // Inspect and force-unlock, for each layout: the snapshot names the holder, its side and
    // count, the forced unlock answers the same snapshot and announces the release; then the
    // lock is free.
    for kind in [
        LockKind::Exclusive,
        LockKind::Fair,
        LockKind::Write,
        LockKind::Semaphore,
    ] {
        let key = LockKey::new("rt:", format!("force-{kind:?}").as_bytes(), 512).unwrap();
        let key = match kind {
            LockKind::Write => key.with_suffix(":rw"),
            LockKind::Semaphore => key.with_suffix(":sem"),
            _ => key,
        };
        let grant = Grant {
            key: &key,
            kind,
            permits: 2,
            ..first
        };
        let _: Vec<i64> = run_call(&calls::acquire(scripts, &grant, "", None, None), &mut conn)
            .await
            .unwrap();
        let value: Value = run_call(&calls::inspect(scripts, &key, kind), &mut conn)
            .await
            .unwrap();
        let info = super::inspect::snapshot(value).unwrap();
        assert_eq!(info.holders.len(), 1, "{kind:?}: {info:?}");
        let holder = &info.holders[0];
        assert_eq!((holder.id.as_str(), holder.kind), ("h1", kind), "{kind:?}");
        assert_eq!(holder.hold_count, 1, "{kind:?}");
        assert!(
            holder
                .remaining_lease
                .is_some_and(|left| left <= lease.duration())
        );
        let permits = info.permits.map(|p| (p.in_use, p.limit));
        let expected = (kind == LockKind::Semaphore).then_some((1, 2));
        assert_eq!(permits, expected, "{kind:?}");

        let mut listener = client.get_async_pubsub().await.unwrap();
        listener
            .subscribe(key.derived(super::CHANNEL))
            .await
            .unwrap();
        let value: Value = run_call(&calls::force_unlock(scripts, &key, kind), &mut conn)
            .await
            .unwrap();
        let before = super::inspect::snapshot(value).unwrap();
        let who = |info: &crate::LockInfo| {
            let holders = info.holders.iter();
            holders
                .map(|h| (h.id.clone(), h.kind, h.hold_count))
                .collect::<Vec<_>>()
        };
        assert_eq!(who(&before), who(&info), "{kind:?}");
        let message = tokio::time::timeout(Duration::from_secs(5), listener.on_message().next())
            .await
            .expect("the forced release is announced");
        assert!(message.is_some(), "{kind:?}");
        let value: Value = run_call(&calls::inspect(scripts, &key, kind), &mut conn)
            .await
            .unwrap();
        assert!(
            !super::inspect::snapshot(value).unwrap().is_locked(),
            "{kind:?}"
        );
    }
}

/// What the key `key` holds, read with `command` (`GET`, `PTTL`, …) on `conn`.
async fn read<T: redis::FromRedisValue>(
    conn: &mut redis::aio::MultiplexedConnection,
    command: &str,
    key: &str,
) -> T {
    try_read(conn, command, key).await.unwrap()
}

/// The client lease key the lock `key` names, in either form.
async fn lease_key_of(conn: &mut redis::aio::MultiplexedConnection, key: &LockKey) -> String {
    match try_read::<String>(conn, "GET", key.as_str()).await {
        Ok(value) => value.split_once('\n').expect("a lease").1.to_owned(),
        Err(_) => redis::cmd("HGET")
            .arg(key.as_str())
            .arg("~s")
            .query_async(conn)
            .await
            .unwrap(),
    }
}

/// [`read`], for a command that may fail (a `GET` of a hash, say).
async fn try_read<T: redis::FromRedisValue>(
    conn: &mut redis::aio::MultiplexedConnection,
    command: &str,
    key: &str,
) -> redis::RedisResult<T> {
    redis::cmd(command).arg(key).query_async(conn).await
}

/// On the client lease, a hold is as alive as the lease key it names: both forms of a lock
/// record it, renewals answer from it, and once it is gone the lock is free for anyone, its
/// holder's release and renewals say it is not held, and the next grant starts a new lease key
/// rather than bringing the old one back.
#[tokio::test]
async fn a_hold_on_the_client_lease_lives_and_ends_with_the_lease_key() {
    let server = support::RedisServer::start();
    let leased = connect_leased(&server).await;
    let other = connect(&server).await;
    let mut conn = direct(&server).await;
    let lease = Lease::watchdog(Duration::from_secs(10));
    let on_lease = |key, attempt, contended| Grant {
        lease,
        contended,
        ..grant(key, LockKind::Exclusive, attempt, None)
    };
    let session = |reply| match reply {
        AcquireReply::Acquired { session, .. } => session,
        other => panic!("expected a grant, got {other:?}"),
    };
    // A single hold (`SET NX`) and, through the script, a hash.
    let single = LockKey::new("tl:", b"leased-single", 512).unwrap();
    let hash = LockKey::new("tl:", b"leased-hash", 512).unwrap();
    let first = session(
        leased
            .acquire(on_lease(&single, "h1#1", false))
            .await
            .unwrap(),
    );
    let also = session(leased.acquire(on_lease(&hash, "h1#2", true)).await.unwrap());
    assert!(first != 0 && also == first, "{first} {also}");
    let lease_key = lease_key_of(&mut conn, &single).await;
    assert!(lease_key.starts_with("tl:~lease:"), "{lease_key}");
    assert_eq!(lease_key_of(&mut conn, &hash).await, lease_key);
    let lease_ttl: i64 = read(&mut conn, "PTTL", &lease_key).await;
    assert!(lease_ttl > 0 && lease_ttl <= 10_000, "{lease_ttl}");
    for key in [&single, &hash] {
        let ttl: i64 = read(&mut conn, "PTTL", key.as_str()).await;
        assert!(ttl > 100_000, "the lock's own key lives long: {ttl}");
    }
    // A fixed lease keeps a lease of its own.
    let fixed = LockKey::new("tl:", b"leased-fixed", 512).unwrap();
    let own = session(
        leased
            .acquire(grant(&fixed, LockKind::Exclusive, "h1#3", None))
            .await
            .unwrap(),
    );
    assert_eq!(own, 0);
    let value: String = read(&mut conn, "GET", fixed.as_str()).await;
    assert!(!value.contains('\n'), "{value:?}");

    let renewals = [
        crate::backend::Renew::hold(&single, "h1", lease, LockKind::Exclusive).in_session(first),
        crate::backend::Renew::hold(&hash, "h1", lease, LockKind::Exclusive).in_session(first),
    ];
    let renewed = crate::backend::RenewReply::Renewed;
    assert_eq!(leased.renew(&renewals).await.unwrap(), [renewed, renewed]);
    let taken = other
        .acquire(Grant {
            holder: "h2",
            ..grant(&single, LockKind::Exclusive, "h2#1", None)
        })
        .await
        .unwrap();
    assert!(matches!(taken, AcquireReply::Held { .. }), "{taken:?}");

    // The lease key goes (the client stalled for a whole lease, say).
    let deleted: i64 = read(&mut conn, "DEL", &lease_key).await;
    assert_eq!(deleted, 1);
    let taken = other
        .acquire(Grant {
            holder: "h2",
            ..grant(&single, LockKind::Exclusive, "h2#2", None)
        })
        .await
        .unwrap();
    assert_eq!(count(taken), 1, "a lock whose lease key is gone is free");
    let released = leased
        .release(Release {
            key: &hash,
            holder: "h1",
            all: false,
            handoff: None,
            kind: LockKind::Exclusive,
            attempt: None,
            hold: None,
        })
        .await
        .unwrap();
    assert_eq!(released, ReleaseReply::NotHeld);
    let exists: bool = read(&mut conn, "EXISTS", hash.as_str()).await;
    assert!(!exists, "the lapsed lock is deleted");
    let not_held = crate::backend::RenewReply::NotHeld;
    assert_eq!(leased.renew(&renewals).await.unwrap(), [not_held, not_held]);
    let owner: Option<i64> = redis::cmd("HGET")
        .arg(single.as_str())
        .arg("h2")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(owner, Some(1), "the new owner's hold is untouched");

    // The next grant starts a new lease key; the old one stays gone.
    let next = session(
        leased
            .acquire(on_lease(&hash, "h1#4", false))
            .await
            .unwrap(),
    );
    assert!(next > first, "{next} {first}");
    let exists: bool = read(&mut conn, "EXISTS", &lease_key).await;
    assert!(!exists, "a lease key that ran out is never brought back");
    assert_eq!(leased.renew(&renewals).await.unwrap(), [not_held, not_held]);

    // A grant that finds its lease key gone, by `SET NX` or by the script, takes nothing on it
    // and goes to a new one.
    let mut current = lease_key_of(&mut conn, &hash).await;
    let mut last = next;
    for contended in [false, true] {
        let deleted: i64 = read(&mut conn, "DEL", &current).await;
        assert_eq!(deleted, 1);
        let key = LockKey::new("tl:", format!("leased-{contended}").as_bytes(), 512).unwrap();
        let grant = Grant {
            lease,
            contended,
            ..grant(&key, LockKind::Exclusive, "h1#5", None)
        };
        let after = session(leased.acquire(grant).await.unwrap());
        assert!(after > last, "{after} {last} (contended: {contended})");
        let exists: bool = read(&mut conn, "EXISTS", &current).await;
        assert!(!exists, "{current} came back");
        current = lease_key_of(&mut conn, &key).await;
        last = after;
    }
}

/// An attempt on the client lease that is given up on before it arrived is remembered as long
/// as the key its late `SET` would make lives (the key lease), not one lease: a late single
/// hold that outlived the memory of its attempt would belong to nobody for that long.
#[tokio::test]
async fn an_attempt_given_up_on_the_client_lease_is_remembered_for_the_key_lease() {
    let server = support::RedisServer::start();
    let leased = connect_leased(&server).await;
    let mut conn = direct(&server).await;
    let key = LockKey::new("tl:", b"given-up", 512).unwrap();
    let lease = Lease::watchdog(Duration::from_secs(1));
    let given_up = Grant {
        lease,
        ..grant(&key, LockKind::Exclusive, "h1#9", None)
    };
    assert!(
        !leased.abandon(given_up).await.unwrap(),
        "nothing was taken"
    );
    let remembered: i64 = read(&mut conn, "PTTL", &key.derived(super::VOID)).await;
    assert!(
        remembered > 2 * 1000,
        "remembered for {remembered} ms, no longer than a lease"
    );
}

/// A holder holds twice (the second hold joined through another client), and the attempt that
/// granted its first hold is undone (its reply was lost): an acquire refused afterwards still
/// marks the lock waited for, so the release of the hold left reaches the waiter. Both
/// stores.
#[tokio::test]
async fn a_release_after_the_undo_of_a_shared_holds_grant_is_published() {
    let server = support::RedisServer::start();
    let channel = format!(
        "{}:released",
        kind_key("undone-grant", LockKind::Exclusive).as_str()
    );
    // A listener made while the pub/sub connection is still being set up is subscribed (and
    // woken) once it is: the release below must find it subscribed.
    let subscribed = || support::numsub(&server, &channel) == 1;
    release_after_the_undo_of_a_shared_holds_grant(&connect(&server).await, subscribed).await;
    release_after_the_undo_of_a_shared_holds_grant(&crate::MemoryBackend::new(), || true).await;
}

async fn release_after_the_undo_of_a_shared_holds_grant<B: Backend>(
    backend: &B,
    subscribed: impl Fn() -> bool,
) {
    let key = kind_key("undone-grant", LockKind::Exclusive);
    let acquire = |attempt| contended(&key, LockKind::Exclusive, attempt, None);
    assert_eq!(count(backend.acquire(acquire("g1")).await.unwrap()), 1);
    assert_eq!(count(backend.acquire(acquire("b1")).await.unwrap()), 2);
    let undone = backend.abandon(acquire("g1")).await.unwrap();
    assert!(undone, "the grant's attempt took a hold");
    let listener = backend.listen(&key, None).await.unwrap();
    support::eventually(
        Duration::from_secs(5),
        "the listener subscribed",
        &subscribed,
    )
    .await;
    let other = Grant {
        holder: "h2",
        ..acquire("o1")
    };
    let refused = backend.acquire(other).await.unwrap();
    assert!(matches!(refused, AcquireReply::Held { .. }), "{refused:?}");
    let release = Release {
        attempt: None,
        ..release_naming(&key, LockKind::Exclusive, "")
    };
    let reply = backend.release(release).await.unwrap();
    assert_eq!(reply, ReleaseReply::Released { notified: Some(1) });
    tokio::time::timeout(
        Duration::from_secs(5),
        crate::backend::Listen::notified(&listener),
    )
    .await
    .expect("the waiter heard of the release");
}

/// A late release of a read hold whose lease ran out, while another reader still holds the
/// lock, gives back nothing: both stores answer that it is not held, by the attempt that
/// granted it or by any.
#[tokio::test]
async fn a_late_release_of_an_expired_read_hold_is_not_held() {
    let server = support::RedisServer::start();
    late_release_of_an_expired_read_hold(&connect(&server).await).await;
    late_release_of_an_expired_read_hold(&crate::MemoryBackend::new()).await;
}

async fn late_release_of_an_expired_read_hold<B: Backend>(backend: &B) {
    let key = kind_key("late-read", LockKind::Read);
    let short = Duration::from_millis(100);
    let expiring = Grant {
        lease: Lease::fixed(short),
        ..contended(&key, LockKind::Read, "d1", None)
    };
    assert_eq!(count(backend.acquire(expiring).await.unwrap()), 1);
    let live = Grant {
        holder: "h2",
        ..contended(&key, LockKind::Read, "l1", None)
    };
    assert_eq!(count(backend.acquire(live).await.unwrap()), 1);
    tokio::time::sleep(short * 2).await;
    for attempt in [Some("d1"), None] {
        let late = Release {
            attempt,
            ..release_naming(&key, LockKind::Read, "")
        };
        let reply = backend.release(late).await.unwrap();
        assert_eq!(reply, ReleaseReply::NotHeld, "{attempt:?}");
    }
}

/// A writer's read hold ends with its own lease even though the writer keeps the lock alive
/// far longer: neither a renewal nor inspection finds it afterwards, on either store. (On
/// Redis the readers' set once expired with the read lease while the hash lived on, and the
/// reader's fields in the hash then held the read side for as long as the writer did.)
#[tokio::test]
async fn a_writers_read_hold_ends_with_its_own_lease() {
    let server = support::RedisServer::start();
    writers_read_hold_ends_with_its_own_lease(&connect(&server).await).await;
    writers_read_hold_ends_with_its_own_lease(&crate::MemoryBackend::new()).await;
}

async fn writers_read_hold_ends_with_its_own_lease<B: Backend>(backend: &B) {
    let key = kind_key("writer-reads", LockKind::Read);
    let write = contended(&key, LockKind::Write, "w1", None);
    assert_eq!(count(backend.acquire(write).await.unwrap()), 1);
    let short = Duration::from_millis(100);
    let read = Grant {
        lease: Lease::fixed(short),
        ..contended(&key, LockKind::Read, "r1", None)
    };
    assert_eq!(count(backend.acquire(read).await.unwrap()), 1);
    // The read lease runs out in the store; the write lease (10 s) does not.
    tokio::time::sleep(short * 3).await;
    let renew = Renew::hold(
        &key,
        "h1",
        Lease::fixed(Duration::from_secs(10)),
        LockKind::Read,
    );
    assert_eq!(
        backend.renew(&[renew]).await.unwrap(),
        [RenewReply::NotHeld],
        "{}",
        std::any::type_name::<B>()
    );
    let info = backend.inspect(&key, LockKind::Read).await.unwrap();
    let kinds: Vec<LockKind> = info.holders.iter().map(|holder| holder.kind).collect();
    assert_eq!(kinds, [LockKind::Write], "{info:?}");
}

/// Each hold of a read-write side or a semaphore permit keeps its own lease, on both stores:
/// a re-entry with a longer lease keeps the holder's side that long only while it is held;
/// released, the hold left ends with its own lease again. Releasing the first hold instead
/// leaves the re-entry's lease, and a renewal extends every hold. Checked by inspection, not
/// against a clock.
#[tokio::test]
async fn each_hold_keeps_its_own_lease() {
    let server = support::RedisServer::start();
    for kind in [LockKind::Read, LockKind::Write, LockKind::Semaphore] {
        holds_keep_their_own_leases(&connect(&server).await, kind).await;
        holds_keep_their_own_leases(&crate::MemoryBackend::new(), kind).await;
    }
}

async fn holds_keep_their_own_leases<B: Backend>(backend: &B, kind: LockKind) {
    let store = std::any::type_name::<B>();
    let key = kind_key(&format!("own-lease-{kind:?}"), kind);
    let (short, long) = (Duration::from_secs(5), Duration::from_secs(60));
    let acquire = |attempt, lease| Grant {
        lease: Lease::fixed(lease),
        ..contended(&key, kind, attempt, None)
    };
    let left = || async {
        let info = backend.inspect(&key, kind).await.unwrap();
        let holder = info
            .holder("h1")
            .unwrap_or_else(|| panic!("{store} {kind:?}: {info:?}"));
        holder.remaining_lease.expect("a lease")
    };
    let release = |hold| Release {
        hold: Some(hold),
        ..release_naming(&key, kind, "g1")
    };

    // The re-entry is released: its lease no longer counts.
    assert_eq!(
        count(backend.acquire(acquire("g1", short)).await.unwrap()),
        1
    );
    assert_eq!(
        count(backend.acquire(acquire("r1", long)).await.unwrap()),
        2
    );
    assert!(
        left().await > short,
        "{store} {kind:?}: the re-entry's lease counts"
    );
    let reply = backend.release(release("r1")).await.unwrap();
    assert_eq!(
        reply,
        ReleaseReply::Decremented { remaining: 1 },
        "{store} {kind:?}"
    );
    assert!(
        left().await <= short,
        "{store} {kind:?}: the released re-entry's lease lives on"
    );

    // The first hold is released: the re-entry keeps its own lease.
    assert_eq!(
        count(backend.acquire(acquire("r2", long)).await.unwrap()),
        2
    );
    let reply = backend.release(release("g1")).await.unwrap();
    assert_eq!(
        reply,
        ReleaseReply::Decremented { remaining: 1 },
        "{store} {kind:?}"
    );
    assert!(
        left().await > short,
        "{store} {kind:?}: the re-entry was cut short"
    );
    let all = Release {
        all: true,
        ..release("g1")
    };
    assert_freed(backend.release(all).await.unwrap(), kind);

    // A renewal keeps every hold: the one left after a release lives the renewed lease.
    assert_eq!(
        count(backend.acquire(acquire("g1", short)).await.unwrap()),
        1
    );
    assert_eq!(
        count(backend.acquire(acquire("r3", short)).await.unwrap()),
        2
    );
    let renew = Renew::hold(&key, "h1", Lease::fixed(long), kind);
    assert_eq!(
        backend.renew(&[renew]).await.unwrap(),
        [RenewReply::Renewed]
    );
    let reply = backend.release(release("r3")).await.unwrap();
    assert_eq!(
        reply,
        ReleaseReply::Decremented { remaining: 1 },
        "{store} {kind:?}"
    );
    assert!(
        left().await > short,
        "{store} {kind:?}: a renewed hold was cut short"
    );
    let all = Release {
        all: true,
        ..release("g1")
    };
    assert_freed(backend.release(all).await.unwrap(), kind);
}

/// A re-entry released after the holder's other holds ran out frees the lock at once, on
/// both stores: its lease was all that kept the side, and another holder gets in.
#[tokio::test]
async fn the_last_live_hold_released_frees_the_lock() {
    let server = support::RedisServer::start();
    for kind in [LockKind::Read, LockKind::Write, LockKind::Semaphore] {
        last_live_hold_released_frees_the_lock(&connect(&server).await, kind).await;
        last_live_hold_released_frees_the_lock(&crate::MemoryBackend::new(), kind).await;
    }
}

async fn last_live_hold_released_frees_the_lock<B: Backend>(backend: &B, kind: LockKind) {
    let store = std::any::type_name::<B>();
    let key = kind_key(&format!("last-live-{kind:?}"), kind);
    let short = Duration::from_millis(300);
    let first = Grant {
        lease: Lease::fixed(short),
        ..contended(&key, kind, "g1", None)
    };
    assert_eq!(count(backend.acquire(first).await.unwrap()), 1);
    let reentry = contended(&key, kind, "r1", None);
    assert_eq!(count(backend.acquire(reentry).await.unwrap()), 2);
    // The first hold's lease runs out in the store (any wait past it will do).
    tokio::time::sleep(short * 2).await;
    let release = Release {
        hold: Some("r1"),
        ..release_naming(&key, kind, "g1")
    };
    let reply = backend.release(release).await.unwrap();
    assert_freed(reply, kind);
    let info = backend.inspect(&key, kind).await.unwrap();
    assert!(info.holders.is_empty(), "{store} {kind:?}: {info:?}");
    let other = Grant {
        holder: "h2",
        kind: if kind == LockKind::Read {
            LockKind::Write
        } else {
            kind
        },
        ..contended(&key, kind, "o1", None)
    };
    let reply = backend.acquire(other).await.unwrap();
    assert_eq!(count(reply), 1, "{store} {kind:?}");
}

/// An acquire queued on a server that stalls past the acquire's lease, whose caller gave up
/// and whose undo never got through, grants nothing when the server resumes: it arrived after
/// the latest time it may act. Granted, it would be a hold nobody holds, refusing everyone
/// for a lease. Each kind's acquire script, sent together during one stall.
#[tokio::test]
async fn an_acquire_arriving_after_its_lease_grants_nothing() {
    let server = support::RedisServer::start();
    let backend = support::redis_backend(server.url())
        .command_timeout(Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    let kinds = [
        LockKind::Exclusive,
        LockKind::Fair,
        LockKind::Write,
        LockKind::Semaphore,
    ];
    let keys: Vec<LockKey> = kinds
        .iter()
        .map(|&kind| kind_key(&format!("arrives-late-{kind:?}"), kind))
        .collect();
    // Every script is loaded, and connections know the server's clock, before the stall.
    for (&kind, key) in kinds.iter().zip(&keys) {
        let warm = contended(key, kind, "w1", None);
        assert_eq!(count(backend.acquire(warm).await.unwrap()), 1);
        let reply = backend
            .release(release_naming(key, kind, "w1"))
            .await
            .unwrap();
        assert_freed(reply, kind);
    }
    let scripts = server.calls("evalsha");
    let lease = Duration::from_millis(800);
    server.pause();
    let stalled = std::time::Instant::now();
    let late = kinds.iter().zip(&keys).map(|(&kind, key)| {
        let backend = &backend;
        async move {
            let grant = Grant {
                lease: Lease::fixed(lease),
                queue: Some(Duration::from_secs(5)).filter(|_| kind.queues()),
                ..contended(key, kind, "late1", None)
            };
            backend.acquire(grant).await
        }
    });
    for answer in futures_util::future::join_all(late).await {
        let error = answer.expect_err("the server is stalled");
        assert_eq!(
            *error.kind(),
            crate::error::BackendErrorKind::Timeout,
            "{error}"
        );
    }
    // The stall outlasts the lease: the server's clock goes on while it is stopped.
    tokio::time::sleep((lease + Duration::from_millis(200)).saturating_sub(stalled.elapsed()))
        .await;
    server.resume();
    support::eventually(Duration::from_secs(10), "the held-back scripts run", || {
        server.calls("evalsha") >= scripts + kinds.len() as u64
    })
    .await;
    for (&kind, key) in kinds.iter().zip(&keys) {
        let info = backend.inspect(key, kind).await.unwrap();
        assert!(
            info.holders.is_empty(),
            "{kind:?}: a late acquire granted {info:?}"
        );
        let other = Grant {
            holder: "h2",
            ..contended(key, kind, "o1", None)
        };
        assert_eq!(count(backend.acquire(other).await.unwrap()), 1, "{kind:?}");
    }
}

/// A renewal names the grant it was sent for: delivered after its holder released the lock
/// and took it anew, it extends nothing of the new hold, which keeps its own (shorter) lease;
/// one naming the new grant, or none, renews it. Every kind, the single hold too, on both
/// stores. Without the name the new hold would outlive its lease by the renewed one, held by
/// a guard that had already reported it lost.
#[tokio::test]
async fn a_renewal_naming_an_ended_grant_extends_nothing_taken_anew() {
    let server = support::RedisServer::start();
    let redis = connect(&server).await;
    let memory = crate::MemoryBackend::new();
    for kind in [
        LockKind::Exclusive,
        LockKind::Fair,
        LockKind::Read,
        LockKind::Write,
        LockKind::Semaphore,
    ] {
        renewal_naming_an_ended_grant(&redis, kind, false).await;
        renewal_naming_an_ended_grant(&memory, kind, false).await;
    }
    // The single hold, which the `SET NX` first try writes.
    renewal_naming_an_ended_grant(&redis, LockKind::Exclusive, true).await;
}

async fn renewal_naming_an_ended_grant<B: Backend>(backend: &B, kind: LockKind, single: bool) {
    let store = std::any::type_name::<B>();
    let key = kind_key(&format!("renew-named-{kind:?}-{single}"), kind);
    let (short, long) = (Duration::from_secs(5), Duration::from_secs(60));
    let acquire = |attempt| Grant {
        lease: Lease::fixed(short),
        contended: !single,
        ..grant(&key, kind, attempt, None)
    };
    let renew = |attempt: Option<&'static str>| {
        let renew = Renew::hold(&key, "h1", Lease::fixed(long), kind);
        attempt.map_or(renew, |attempt| renew.granted_by(attempt))
    };
    let left = || async {
        let info = backend.inspect(&key, kind).await.unwrap();
        let holder = info
            .holder("h1")
            .unwrap_or_else(|| panic!("{store} {kind:?}: {info:?}"));
        holder.remaining_lease.expect("a lease")
    };

    assert_eq!(count(backend.acquire(acquire("g1")).await.unwrap()), 1);
    assert_freed(
        backend
            .release(release_naming(&key, kind, "g1"))
            .await
            .unwrap(),
        kind,
    );
    assert_eq!(count(backend.acquire(acquire("g2")).await.unwrap()), 1);
    let late = backend.renew(&[renew(Some("g1"))]).await.unwrap();
    assert_eq!(
        late,
        [RenewReply::NotHeld],
        "{store} {kind:?} single {single}"
    );
    assert!(
        left().await <= short,
        "{store} {kind:?} single {single}: a renewal of the ended grant extended the new hold"
    );
    // An attempt that only starts like the grant's names another grant.
    let prefix = backend.renew(&[renew(Some("g"))]).await.unwrap();
    assert_eq!(
        prefix,
        [RenewReply::NotHeld],
        "{store} {kind:?} single {single}"
    );
    for named in [Some("g2"), None] {
        let renewed = backend.renew(&[renew(named)]).await.unwrap();
        assert_eq!(renewed, [RenewReply::Renewed], "{store} {kind:?} {named:?}");
    }
    assert!(left().await > short, "{store} {kind:?} single {single}");
    assert_freed(
        backend
            .release(release_naming(&key, kind, "g2"))
            .await
            .unwrap(),
        kind,
    );
}

/// A semaphore's set of holders lives as long as its hash: a permit whose lease ran out is
/// purged by its score, so its holder cannot re-enter it after others took every permit.
/// Here the hash outlives a short permit (an earlier permit with a long lease was given back,
/// and hash leases are never shortened); were the set to expire with the short permit alone,
/// its holder's count would stay in the hash, and its re-entry would make three holders of
/// two permits.
#[tokio::test]
async fn an_expired_permit_cannot_be_reentered_on_either_store() {
    let server = support::RedisServer::start();
    expired_permit_cannot_be_reentered(&connect(&server).await).await;
    expired_permit_cannot_be_reentered(&crate::MemoryBackend::new()).await;
}

async fn expired_permit_cannot_be_reentered<B: Backend>(backend: &B) {
    let store = std::any::type_name::<B>();
    let kind = LockKind::Semaphore;
    let key = kind_key("expired-permit", kind);
    let short = Duration::from_millis(200);
    let take = |holder, attempt, lease, reentry| Grant {
        holder,
        lease: Lease::fixed(lease),
        permits: 2,
        reentry,
        ..contended(&key, kind, attempt, None)
    };
    let long = Duration::from_secs(60);
    // A long permit given back while a short one is held keeps the hash's lease.
    for (holder, attempt, lease) in [("h8", "c1", short), ("h9", "l1", long)] {
        let reply = backend
            .acquire(take(holder, attempt, lease, Reentry::Allowed))
            .await
            .unwrap();
        assert_eq!(count(reply), 1, "{store}: {holder}");
    }
    let gone = Release {
        holder: "h9",
        ..release_naming(&key, kind, "l1")
    };
    assert_freed(backend.release(gone).await.unwrap(), kind);
    // The short permit's lease runs out in the store (any wait past it will do); the next
    // grant finds no holder left, and h1's short permit is the only one.
    tokio::time::sleep(short * 2).await;
    let reply = backend
        .acquire(take("h1", "g1", short, Reentry::Allowed))
        .await
        .unwrap();
    assert_eq!(count(reply), 1, "{store}: h1");
    tokio::time::sleep(short * 2).await;
    for (holder, attempt) in [("h2", "o2"), ("h3", "o3")] {
        let reply = backend
            .acquire(take(holder, attempt, long, Reentry::Allowed))
            .await
            .unwrap();
        assert_eq!(count(reply), 1, "{store}: {holder}");
    }
    let reentry = backend
        .acquire(take("h1", "r1", long, Reentry::Only))
        .await
        .unwrap();
    assert!(
        matches!(reentry, AcquireReply::Held { .. }),
        "{store}: an expired permit was re-entered: {reentry:?}"
    );
    let info = backend.inspect(&key, kind).await.unwrap();
    assert_eq!(info.holders.len(), 2, "{store}: {info:?}");
}
