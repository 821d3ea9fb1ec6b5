//! The scripts' attempt bookkeeping, driven through the `Backend` trait against a real
//! `redis-server` (the test fixture of `tests/support`).

#[path = "../../../tests/support/mod.rs"]
mod support;

use std::time::Duration;

use crate::{
    backend::{AcquireReply, Backend, Grant, LockKind, Reentry, Release, ReleaseReply},
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
    }
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
    let backend = support::redis_backend(server.url())
        .connect()
        .await
        .unwrap();
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
