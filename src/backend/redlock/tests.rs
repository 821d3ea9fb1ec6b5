//! Why a lost round's attempt is spent, against real `redis-server`s (the test fixture of
//! `tests/support`): a node that voided an attempt refuses it for a lease, so trying again
//! under that id can be refused by a majority while the lock is free.

use crate::test_support as support;

use std::time::Duration;

use crate::{
    backend::{AcquireReply, Backend, Grant, LockKind, Reentry, Release, ReleaseReply},
    lease::Lease,
    lock_key::LockKey,
};

fn grant<'a>(key: &'a LockKey, holder: &'a str, attempt: &'a str) -> Grant<'a> {
    Grant {
        key,
        holder,
        attempt,
        lease: Lease::fixed(Duration::from_secs(10)),
        fencing: false,
        kind: LockKind::Exclusive,
        queue: None,
        supersedes: None,
        reentry: Reentry::Refused,
        contended: false,
        permits: 1,
    }
}

/// The release of `holder`'s hold of `key`.
fn release<'a>(key: &'a LockKey, holder: &'a str) -> Release<'a> {
    Release {
        key,
        holder,
        all: false,
        handoff: None,
        kind: LockKind::Exclusive,
        attempt: None,
        hold: None,
    }
}

/// A round lost to a holder answers `Spent`. Had two of three nodes voided that attempt (its
/// give-back reached them before its acquire), sending it again once the lock is free would
/// leave holds there that are nobody's, which a third holder takes while the second believes
/// it holds the lock. A new attempt, superseding the spent one, holds on every node.
#[tokio::test]
async fn a_lost_round_spends_its_attempt() {
    let servers: Vec<_> = (0..3).map(|_| support::RedisServer::start()).collect();
    let backend = support::redlock_backend(servers.iter().map(support::RedisServer::url))
        .build()
        .unwrap();
    for (name, renamed) in [("reused", false), ("renamed", true)] {
        let key = LockKey::new("rl:", name.as_bytes(), 512).unwrap();
        let taken = backend.acquire(grant(&key, "a", "a#1")).await.unwrap();
        assert!(matches!(taken, AcquireReply::Acquired { .. }), "{taken:?}");
        let lost = backend.acquire(grant(&key, "b", "b#1")).await.unwrap();
        assert!(matches!(lost, AcquireReply::Spent { .. }), "{lost:?}");
        for node in &backend.nodes()[..2] {
            assert!(!node.abandon(grant(&key, "b", "b#1")).await.unwrap());
        }
        backend.release(release(&key, "a")).await.unwrap();

        let next = match renamed {
            true => Grant {
                supersedes: Some("b#1"),
                ..grant(&key, "b", "b#2")
            },
            false => grant(&key, "b", "b#1"),
        };
        let taken = backend.acquire(next).await.unwrap();
        assert!(matches!(taken, AcquireReply::Acquired { .. }), "{taken:?}");
        let third = backend.acquire(grant(&key, "c", "c#1")).await.unwrap();
        match renamed {
            true => assert!(
                matches!(third, AcquireReply::Spent { .. }),
                "a third holder got in: {third:?}"
            ),
            // The hazard a spent attempt avoids (so this test cannot pass blind).
            false => assert!(
                matches!(third, AcquireReply::Acquired { .. }),
                "the reused attempt held on the nodes that voided it: {third:?}"
            ),
        }
    }
}

#[allow(dead_code)]
#[path = "../../../tests/chaos/proxy.rs"]
mod proxy;

use proxy::{Mode, Proxy};

/// Three nodes, each behind a proxy that can hold back or swallow its traffic, with a short
/// node timeout.
async fn behind_proxies() -> (Vec<support::RedisServer>, Vec<Proxy>, crate::RedlockBackend) {
    let servers: Vec<_> = (0..3).map(|_| support::RedisServer::start()).collect();
    let mut proxies = Vec::new();
    for server in &servers {
        proxies.push(Proxy::start(&server.url()).await);
    }
    let backend = support::redlock_backend(proxies.iter().map(Proxy::url))
        .node_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    // Every node's connection is open before any traffic is held back.
    let key = LockKey::new("rl:", b"warm", 512).unwrap();
    let taken = backend.acquire(grant(&key, "w", "w#1")).await.unwrap();
    assert!(matches!(taken, AcquireReply::Acquired { .. }), "{taken:?}");
    backend.release(release(&key, "w")).await.unwrap();
    (servers, proxies, backend)
}

/// Acquires `key` for `holder` with a new attempt each round, until a round wins or `within`
/// has passed.
async fn acquire_within(
    backend: &crate::RedlockBackend,
    key: &LockKey,
    holder: &str,
    within: Duration,
) -> AcquireReply {
    let deadline = tokio::time::Instant::now() + within;
    for round in 1.. {
        let attempt = format!("{holder}#{round}");
        let reply = backend.acquire(grant(key, holder, &attempt)).await;
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

/// Two of three nodes stalled while a hold was released: one node freed it, so the release
/// is done, but the other two never saw it. Released again until they answer, they free it
/// once they are back, not when the 10 s lease runs out.
#[tokio::test]
async fn a_release_missed_by_stalled_nodes_reaches_them_once_they_are_back() {
    let (_servers, proxies, backend) = behind_proxies().await;
    let key = LockKey::new("rl:", b"stalled", 512).unwrap();
    let taken = backend.acquire(grant(&key, "a", "a#1")).await.unwrap();
    assert!(matches!(taken, AcquireReply::Acquired { .. }), "{taken:?}");

    for proxy in &proxies[1..] {
        proxy.set(Mode::Blackhole);
    }
    let released = backend.release(release(&key, "a")).await.unwrap();
    assert!(
        matches!(released, ReleaseReply::Released { .. }),
        "{released:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    for proxy in &proxies[1..] {
        proxy.set(Mode::Pass);
    }

    let next = acquire_within(&backend, &key, "b", Duration::from_secs(4)).await;
    assert!(
        matches!(next, AcquireReply::Acquired { .. }),
        "the stalled nodes kept the released hold: {next:?}"
    );
}

/// An acquire's `SET` to one node is held back past the node timeout; the vote is won on the
/// other two, and the hold released. The `SET` then lands on its node: a hold there that
/// nobody holds. With one more node stalled, that minority hold must not keep the lock from
/// the next holder: the release left a record there that gives the late grant no weight.
#[tokio::test]
async fn a_late_grant_on_a_node_never_outlives_the_release() {
    let (servers, proxies, backend) = behind_proxies().await;
    let key = LockKey::new("rl:", b"straggler", 512).unwrap();
    let late_by = Duration::from_millis(800);
    let sets = servers[2].calls("set");

    proxies[2].set(Mode::Delay {
        up: late_by,
        down: Duration::ZERO,
    });
    let taken = backend.acquire(grant(&key, "a", "a#1")).await.unwrap();
    assert!(matches!(taken, AcquireReply::Acquired { .. }), "{taken:?}");
    proxies[2].set(Mode::Pass);
    let released = backend.release(release(&key, "a")).await.unwrap();
    assert!(
        matches!(released, ReleaseReply::Released { .. }),
        "{released:?}"
    );
    support::eventually(late_by * 4, "the late SET lands", || {
        servers[2].calls("set") > sets
    })
    .await;

    proxies[0].set(Mode::Blackhole);
    let next = acquire_within(&backend, &key, "b", Duration::from_secs(3)).await;
    assert!(
        matches!(next, AcquireReply::Acquired { .. }),
        "a late grant on one node and a stalled node kept a free lock: {next:?}"
    );
}

/// A holder that also holds on one node through another client: there the grant is a
/// re-entry (the other client's attempt is that node's grant record), elsewhere the grant.
/// A renewal naming the grant is accepted on every node, so it holds with another node down.
#[tokio::test]
async fn a_renewal_naming_a_grant_reentered_on_one_node_is_kept_there() {
    use crate::backend::{Renew, RenewReply};
    let mut servers: Vec<_> = (0..3).map(|_| support::RedisServer::start()).collect();
    let backend = support::redlock_backend(servers.iter().map(support::RedisServer::url))
        .build()
        .unwrap();
    let key = LockKey::new("rl:", b"reentered-on-one", 512).unwrap();
    let shared = |attempt| Grant {
        reentry: Reentry::Allowed,
        ..grant(&key, "h", attempt)
    };
    let other = backend.nodes()[0].acquire(shared("g#1")).await.unwrap();
    assert!(
        matches!(other, AcquireReply::Acquired { count: 1, .. }),
        "{other:?}"
    );
    // With the third node down, the majority is nodes 0 and 1: both answered the grant.
    servers[2].kill();
    let taken = backend.acquire(shared("x#1")).await.unwrap();
    assert!(matches!(taken, AcquireReply::Acquired { .. }), "{taken:?}");
    let reentered = backend.nodes()[0]
        .inspect(&key, LockKind::Exclusive)
        .await
        .unwrap();
    assert_eq!(
        reentered.holder("h").map(|h| h.hold_count),
        Some(2),
        "{reentered:?}"
    );
    let lease = Lease::fixed(Duration::from_secs(10));
    let renew = Renew::hold(&key, "h", lease, LockKind::Exclusive).granted_by("x#1");
    assert_eq!(
        backend.renew(&[renew]).await.unwrap(),
        [RenewReply::Renewed]
    );
}
