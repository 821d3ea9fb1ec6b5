//! Why a lost round's attempt is spent, against real `redis-server`s (the test fixture of
//! `tests/support`): a node that voided an attempt refuses it for a lease, so trying again
//! under that id can be refused by a majority while the lock is free.

use crate::test_support as support;

use std::time::Duration;

use crate::{
    backend::{AcquireReply, Backend, Grant, LockKind, Reentry, Release},
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
