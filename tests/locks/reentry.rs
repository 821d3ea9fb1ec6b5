//! Re-entries, run on every store: in memory and on a real `redis-server` started for each
//! test.

use crate::support;

use std::time::Duration;

use tower_lock::{Backend, Holder, Lease, LockClient, LockGuard};

use support::kinds::request;

macro_rules! reentry_semantics {
    ($backend:ident, $env:expr) => {
        mod $backend {
            use super::*;

            /// A re-entry that asks for a fencing token, of a hold taken without one, gets the
            /// token the store issued for the hold; the hold keeps it (the first guard and a
            /// later re-entry report the same), and the next owner's token is higher.
            #[tokio::test]
            async fn a_reentry_asking_for_a_token_gets_the_one_issued() {
                let env = $env.await;
                for kind in ["plain", "fair", "write"] {
                    let h = env.a.holder();
                    let first = request(&env.a, "fenced", kind)
                        .holder(&h)
                        .acquire()
                        .await
                        .unwrap();
                    assert_eq!(first.fencing_token(), None, "{kind}: none asked for");
                    let fenced = request(&env.a, "fenced", kind)
                        .holder(&h)
                        .fencing()
                        .try_acquire()
                        .await
                        .unwrap();
                    let token = fenced.fencing_token();
                    assert!(token.is_some(), "{kind}: the re-entry asked for a token");
                    let again = request(&env.a, "fenced", kind)
                        .holder(&h)
                        .fencing()
                        .try_acquire()
                        .await
                        .unwrap();
                    assert_eq!(again.fencing_token(), token, "{kind}");
                    assert_eq!(first.fencing_token(), token, "{kind}");
                    for guard in [again, fenced, first] {
                        guard.release().await.unwrap();
                    }
                    let next = request(&env.b, "fenced", kind)
                        .fencing()
                        .try_acquire()
                        .await
                        .unwrap();
                    assert!(next.fencing_token() > token, "{kind}");
                    next.release().await.unwrap();
                }
            }

            /// Each hold keeps its own lease (read and write sides, semaphore permits): a hold
            /// of 3 s re-entered with a 60 s lease, the re-entry released, ends with its own
            /// 3 s lease again. Its guard believes in it no longer, the store keeps it no
            /// longer, and another holder waiting elsewhere gets in then, long before the
            /// re-entry's lease would have ended.
            #[tokio::test]
            async fn a_released_reentry_leaves_each_hold_its_own_lease() {
                let env = $env.await;
                let (short, long) = (Duration::from_secs(3), Duration::from_secs(60));
                for kind in ["read", "write", "semaphore"] {
                    let key = format!("own-lease-{kind}");
                    let (h, first, again) = reentered(&env.a, &key, kind, short, long).await;
                    assert_eq!(again.hold_count(), 2, "{kind}");
                    assert!(
                        first.remaining() > short,
                        "{kind}: the re-entry keeps the lock"
                    );
                    again.release().await.unwrap();
                    assert!(
                        first.remaining() <= short,
                        "{kind}: its guard counts the re-entry"
                    );
                    let info = env.b.inspect(&key).await.unwrap();
                    let holder = info.holder(h.id()).expect("still held");
                    let left = holder.remaining_lease.expect("a lease");
                    assert!(
                        left <= short,
                        "{kind}: the store counts the re-entry: {left:?}"
                    );
                    let other = if kind == "read" { "write" } else { kind };
                    let next = request(&env.b, &key, other)
                        .wait(long / 2)
                        .acquire()
                        .await
                        .unwrap_or_else(|error| {
                            panic!("{kind}: the re-entry's lease held on: {error:?}")
                        });
                    assert!(first.is_lost(), "{kind}: its guard outlived its lease");
                    next.release().await.unwrap();
                    drop(first);
                }
            }

            /// A plain or fair lock keeps one lease for all its holds: after a re-entry with a
            /// longer lease is released, the guard left believes in the lock as long as the
            /// store keeps it, so its release is sent and frees the lock at once (a guard lost
            /// earlier would leave the lock to the re-entry's lease).
            #[tokio::test]
            async fn a_plain_or_fair_lock_keeps_the_longest_lease_for_its_guards() {
                let env = $env.await;
                let (short, long) = (Duration::from_secs(3), Duration::from_secs(60));
                for kind in ["plain", "fair"] {
                    let key = format!("one-lease-{kind}");
                    let (_, first, again) = reentered(&env.a, &key, kind, short, long).await;
                    again.release().await.unwrap();
                    assert!(first.remaining() > short, "{kind}: its guard gave up early");
                    first.release().await.unwrap();
                    support::kinds::assert_free_for(&env.b, &key, kind).await;
                }
            }
        }
    };
}

/// A hold of `key` by a new holder of `client` with a fixed lease `first`, and its re-entry
/// with a fixed lease `again`: the holder and both guards.
async fn reentered<B: Backend>(
    client: &LockClient<B>,
    key: &str,
    kind: &str,
    first: Duration,
    again: Duration,
) -> (Holder, LockGuard<B>, LockGuard<B>) {
    let holder = client.holder();
    let hold = |lease| {
        request(client, key, kind)
            .holder(&holder)
            .lease(Lease::fixed(lease))
    };
    let first = hold(first).acquire().await.unwrap();
    let again = hold(again).try_acquire().await.unwrap();
    (holder, first, again)
}

fn builder<B: Backend>(backend: B) -> LockClient<B> {
    LockClient::builder(backend).build().unwrap()
}

reentry_semantics!(memory, support::stores::in_memory(builder));

reentry_semantics!(redis, support::stores::on_redis(builder));
