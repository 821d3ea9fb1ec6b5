//! Redlock against three real `redis-server`s (the test fixture of `tests/support`), at the
//! store level: a grant is one record, named by its attempt, on a majority of the nodes; a
//! vote lost is undone where it won; node calls still on their way when the vote was decided
//! are settled after it; a release reaches a node that missed it once the node is back; an
//! extend and a renewal hold only on a majority.

use crate::test_support::{self as support, RedisServer, RespValue};

use std::time::Duration;

use crate::{
    RedlockBackend,
    backend::{
        LockKind,
        store::{
            AcquireReply, Extend, ExtendReply, Grant, Release, ReleaseReply, Renew, RenewReply,
            Store, holder_of,
        },
    },
    lease::Lease,
    lock_key::LockKey,
};

const LEASE: Duration = Duration::from_secs(10);

fn key(name: &str) -> LockKey {
    LockKey::new("rl:", name.as_bytes(), 512).unwrap()
}

/// An acquire of a plain lock by `attempt` (`<holder>#<n>`), with a 10 s lease.
fn grant<'a>(key: &'a LockKey, attempt: &'a str) -> Grant<'a> {
    Grant {
        key,
        holder: holder_of(attempt),
        attempt,
        lease: Lease::fixed(LEASE),
        fencing: false,
        kind: LockKind::Exclusive,
        queue: None,
        contended: false,
        permits: 0,
        within: None,
    }
}

/// The same acquire sent through the scripts (the uncontended `SET NX` cannot see an undo).
fn contended(grant: Grant<'_>) -> Grant<'_> {
    Grant { contended: true, ..grant }
}

fn release<'a>(key: &'a LockKey, grant: &'a str) -> Release<'a> {
    Release { key, kind: LockKind::Exclusive, grant, token: None, handoff: None }
}

fn three() -> (Vec<RedisServer>, RedlockBackend) {
    let servers: Vec<_> = (0..3).map(|_| RedisServer::start()).collect();
    let backend = support::redlock_backend(servers.iter().map(RedisServer::url)).build().unwrap();
    (servers, backend)
}

/// The owner record of `key` on `server`, if any.
fn record(server: &RedisServer, key: &LockKey) -> Option<String> {
    server.cmd(&["GET", key.as_str()]).as_str()
}

/// The milliseconds the owner record of `key` on `server` has left.
fn pttl(server: &RedisServer, key: &LockKey) -> i64 {
    server.cmd(&["PTTL", key.as_str()]).as_int()
}

/// Whether `server` recorded `attempt` as given up on for `key`.
fn voided(server: &RedisServer, key: &LockKey, attempt: &str) -> bool {
    let void = key.derived(":void");
    server.cmd(&["SISMEMBER", &void, attempt]) == RespValue::Int(1)
}

fn acquired(reply: AcquireReply) -> bool {
    matches!(reply, AcquireReply::Acquired { .. })
}

/// A grant is the same record on every node; the same acquire sent again answers granted, and
/// a second holder loses its vote. With one node down, a majority of two grants, extends,
/// renews and releases.
#[tokio::test]
async fn a_grant_is_one_record_on_a_majority() {
    let (mut servers, backend) = three();
    let key = key("majority");
    assert!(acquired(backend.acquire(grant(&key, "a#1")).await.unwrap()));
    // A won vote answers once a majority granted; the last node's call may still be on its way.
    support::eventually(Duration::from_secs(1), "the record on every node", || {
        servers.iter().all(|server| record(server, &key).as_deref() == Some("a#1"))
    })
    .await;
    assert!(
        acquired(backend.acquire(contended(grant(&key, "a#1"))).await.unwrap()),
        "the same acquire, sent again, finds its own record"
    );
    let lost = backend.acquire(grant(&key, "b#1")).await.unwrap();
    assert!(matches!(lost, AcquireReply::Spent { .. }), "{lost:?}");

    servers[2].kill();
    let extend = Extend {
        key: &key,
        kind: LockKind::Exclusive,
        grant: "a#1",
        lease: Lease::fixed(Duration::from_secs(30)),
        fencing: false,
    };
    assert_eq!(backend.extend(extend).await.unwrap(), ExtendReply::Extended { token: None });
    for server in &servers[..2] {
        assert!(pttl(server, &key) > 20_000, "extended on every live node");
    }
    let renew = Renew::Grant {
        key: &key,
        kind: LockKind::Exclusive,
        grant: "a#1",
        lease: Lease::fixed(Duration::from_secs(40)),
    };
    assert_eq!(backend.renew(&[renew]).await.unwrap(), [RenewReply::Renewed]);
    assert!(matches!(
        backend.release(release(&key, "a#1")).await.unwrap(),
        ReleaseReply::Released { .. }
    ));
    for server in &servers[..2] {
        assert_eq!(record(server, &key), None);
    }
    assert!(acquired(backend.acquire(grant(&key, "c#1")).await.unwrap()));
}

/// A vote lost to a holder of two nodes: the third node granted the attempt, and that grant is
/// undone there (its record deleted, the attempt recorded as given up on), so that a late copy
/// of the attempt takes nothing on that node either. A new attempt wins once the lock is free.
#[tokio::test]
async fn a_lost_vote_is_undone_where_it_won() {
    let (servers, backend) = three();
    let key = key("lost-vote");
    for node in &backend.nodes()[..2] {
        assert!(acquired(node.acquire(grant(&key, "x#1")).await.unwrap()));
    }
    let lost = backend.acquire(grant(&key, "b#1")).await.unwrap();
    assert!(matches!(lost, AcquireReply::Spent { .. }), "{lost:?}");
    assert_eq!(record(&servers[2], &key), None, "undone where it won");
    assert!(voided(&servers[2], &key, "b#1"));
    let late = backend.nodes()[2].acquire(contended(grant(&key, "b#1"))).await.unwrap();
    assert!(!acquired(late), "a late copy of the lost attempt: {late:?}");
    assert_eq!(record(&servers[2], &key), None);

    for node in &backend.nodes()[..2] {
        assert!(matches!(
            node.release(release(&key, "x#1")).await.unwrap(),
            ReleaseReply::Released { .. }
        ));
    }
    assert!(acquired(backend.acquire(grant(&key, "b#2")).await.unwrap()));
    support::eventually(Duration::from_secs(1), "the record on every node", || {
        servers.iter().all(|server| record(server, &key).as_deref() == Some("b#2"))
    })
    .await;
}

/// Why a lost round's attempt is spent: a node that recorded it as given up on refuses it for
/// its lease, so the same id sent again once the lock is free wins only where it was not (a
/// minority); a new attempt wins on every node, and a third holder loses.
#[tokio::test]
async fn a_lost_round_spends_its_attempt() {
    let (_servers, backend) = three();
    let key = key("spent");
    assert!(acquired(backend.acquire(grant(&key, "a#1")).await.unwrap()));
    let lost = backend.acquire(grant(&key, "b#1")).await.unwrap();
    assert!(matches!(lost, AcquireReply::Spent { .. }), "{lost:?}");
    // Its undo reached two nodes (say its acquire timed out there).
    for node in &backend.nodes()[..2] {
        assert!(!node.abandon(grant(&key, "b#1")).await.unwrap());
    }
    backend.release(release(&key, "a#1")).await.unwrap();

    let reused = backend.acquire(contended(grant(&key, "b#1"))).await.unwrap();
    assert!(
        matches!(reused, AcquireReply::Spent { .. }),
        "the reused id won on the nodes that gave it up: {reused:?}"
    );
    assert!(acquired(backend.acquire(grant(&key, "b#2")).await.unwrap()));
    let third = backend.acquire(grant(&key, "c#1")).await.unwrap();
    assert!(matches!(third, AcquireReply::Spent { .. }), "a third holder got in: {third:?}");
}

#[allow(dead_code)]
#[path = "../../../tests/chaos/proxy.rs"]
mod proxy;

use proxy::{Mode, Proxy};

/// Three nodes, each behind a proxy that can hold back or swallow its traffic, with a short
/// node timeout.
async fn behind_proxies() -> (Vec<RedisServer>, Vec<Proxy>, RedlockBackend) {
    let servers: Vec<_> = (0..3).map(|_| RedisServer::start()).collect();
    let mut proxies = Vec::new();
    for server in &servers {
        proxies.push(Proxy::start(&server.url()).await);
    }
    let backend = support::redlock_backend(proxies.iter().map(Proxy::url))
        .node_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    // Every node's connection is open before any traffic is held back.
    let key = key("warm");
    assert!(acquired(backend.acquire(grant(&key, "w#1")).await.unwrap()));
    backend.release(release(&key, "w#1")).await.unwrap();
    (servers, proxies, backend)
}

/// Acquires `key` for `holder` with a new attempt each round, until a round wins or `within`
/// has passed.
async fn acquire_within(
    backend: &RedlockBackend,
    key: &LockKey,
    holder: &str,
    within: Duration,
) -> AcquireReply {
    let deadline = tokio::time::Instant::now() + within;
    for round in 1.. {
        let attempt = format!("{holder}#{round}");
        let reply = backend.acquire(grant(key, &attempt)).await;
        if let Ok(reply @ AcquireReply::Acquired { .. }) = reply {
            return reply;
        }
        if tokio::time::Instant::now() >= deadline {
            return reply.unwrap_or(AcquireReply::Held { ttl: None });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    unreachable!()
}

/// Two of three nodes stalled while a grant was released: one node freed it, so the release
/// is done, and the other two get the grant's undo once they are back (the same write on every
/// node: no count to reconcile). The grant is gone from every node then, and its attempt is
/// given up on there, not left until its 10 s lease ends.
#[tokio::test]
async fn a_release_missed_by_stalled_nodes_reaches_them_once_they_are_back() {
    let (servers, proxies, backend) = behind_proxies().await;
    let key = key("stalled");
    assert!(acquired(backend.acquire(grant(&key, "a#1")).await.unwrap()));

    for proxy in &proxies[1..] {
        proxy.set(Mode::Blackhole);
    }
    let released = backend.release(release(&key, "a#1")).await.unwrap();
    assert!(matches!(released, ReleaseReply::Released { .. }), "{released:?}");
    assert_eq!(record(&servers[0], &key), None);
    for server in &servers[1..] {
        assert_eq!(record(server, &key).as_deref(), Some("a#1"), "stalled");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for proxy in &proxies[1..] {
        proxy.set(Mode::Pass);
    }
    support::eventually(Duration::from_secs(3), "the stalled nodes free it", || {
        servers[1..]
            .iter()
            .all(|server| record(server, &key).is_none() && voided(server, &key, "a#1"))
    })
    .await;
    let next = acquire_within(&backend, &key, "b", Duration::from_secs(2)).await;
    assert!(acquired(next), "the stalled nodes kept the released grant: {next:?}");
}

/// An acquire's call to one node is held back past the node timeout; the vote is won on the
/// other two, and the grant released. The held-back acquire then lands on its node (within
/// its lease, so it acts): a record there that nobody holds, which the straggler's settlement
/// undoes once its reply comes. With one more node stalled, the next holder gets the lock from
/// the two others.
#[tokio::test]
async fn a_late_grant_on_a_node_never_outlives_the_release() {
    let (servers, proxies, backend) = behind_proxies().await;
    let key = key("straggler");
    let late_by = Duration::from_millis(800);
    let sets = servers[2].calls("set");

    proxies[2].set(Mode::Delay { up: late_by, down: Duration::ZERO });
    assert!(acquired(backend.acquire(grant(&key, "a#1")).await.unwrap()));
    proxies[2].set(Mode::Pass);
    let released = backend.release(release(&key, "a#1")).await.unwrap();
    assert!(matches!(released, ReleaseReply::Released { .. }), "{released:?}");
    support::eventually(late_by * 4, "the late acquire lands and is undone", || {
        servers[2].calls("set") > sets
            && record(&servers[2], &key).is_none()
            && voided(&servers[2], &key, "a#1")
    })
    .await;

    proxies[0].set(Mode::Blackhole);
    let next = acquire_within(&backend, &key, "b", Duration::from_secs(3)).await;
    assert!(
        acquired(next),
        "a late grant on one node and a stalled node kept a free lock: {next:?}"
    );
}

/// An extend and a renewal name the grant on every node and hold only where a majority has
/// it: with the record gone from one node they hold (and lengthen it on the others), with it
/// gone from two they answer not held, and with two nodes down they fail.
#[tokio::test]
async fn an_extend_and_a_renewal_hold_on_a_majority_only() {
    let (mut servers, backend) = three();
    let key = key("extend");
    let extend = |ms| Extend {
        key: &key,
        kind: LockKind::Exclusive,
        grant: "a#1",
        lease: Lease::fixed(Duration::from_millis(ms)),
        fencing: false,
    };
    let renew = |ms| Renew::Grant {
        key: &key,
        kind: LockKind::Exclusive,
        grant: "a#1",
        lease: Lease::fixed(Duration::from_millis(ms)),
    };
    assert!(acquired(backend.acquire(grant(&key, "a#1")).await.unwrap()));
    // The vote is won on a majority: the grant may still be on its way to the third node.
    let since = std::time::Instant::now();
    while servers.iter().any(|server| record(server, &key).is_none()) {
        assert!(since.elapsed() < Duration::from_secs(5), "the grant never reached every node");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    servers[0].cmd(&["DEL", key.as_str()]);
    assert_eq!(
        backend.extend(extend(30_000)).await.unwrap(),
        ExtendReply::Extended { token: None }
    );
    assert_eq!(backend.renew(&[renew(40_000)]).await.unwrap(), [RenewReply::Renewed]);
    for server in &servers[1..] {
        assert!(pttl(server, &key) > 30_000, "renewed where it is held");
    }
    assert_eq!(record(&servers[0], &key), None, "never created where it is gone");

    servers[1].cmd(&["DEL", key.as_str()]);
    assert_eq!(backend.extend(extend(50_000)).await.unwrap(), ExtendReply::NotHeld);
    assert_eq!(backend.renew(&[renew(50_000)]).await.unwrap(), [RenewReply::NotHeld]);

    servers[0].kill();
    servers[1].kill();
    assert!(backend.extend(extend(50_000)).await.is_err(), "no majority answers");
    assert!(backend.renew(&[renew(50_000)]).await.is_err(), "no majority answers");
}
