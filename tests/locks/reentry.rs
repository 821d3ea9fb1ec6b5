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
                    let first = request(&env.a, "fenced", kind).holder(&h).acquire().await.unwrap();
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
                    let next =
                        request(&env.b, "fenced", kind).fencing().try_acquire().await.unwrap();
                    assert!(next.fencing_token() > token, "{kind}");
                    next.release().await.unwrap();
                }
            }

            /// Each hold keeps its own lease, on every kind: a hold of 3 s re-entered with a
            /// 60 s lease (the grant is extended for it), the re-entry released, ends with its
            /// own 3 s lease. Its guard never believes in more; the store keeps the grant for
            /// the re-entry's lease (it never shortens one), so the client deletes the grant
            /// when its last hold ends, and another holder waiting elsewhere gets in then, long
            /// before the re-entry's lease would have ended.
            #[tokio::test]
            async fn a_released_reentry_leaves_each_hold_its_own_lease() {
                let env = $env.await;
                let (short, long) = (Duration::from_secs(3), Duration::from_secs(60));
                for kind in support::kinds::KINDS {
                    let key = format!("own-lease-{kind}");
                    let (h, first, again) = reentered(&env.a, &key, kind, short, long).await;
                    assert_eq!(again.hold_count(), 2, "{kind}");
                    assert!(again.remaining() > short, "{kind}: the re-entry's own lease");
                    assert!(first.remaining() <= short, "{kind}: the first guard's own lease");
                    again.release().await.unwrap();
                    assert!(first.remaining() <= short, "{kind}");
                    let info = env.b.inspect(&key).await.unwrap();
                    let holder = info.holder(h.id()).expect("still held");
                    let left = holder.remaining_lease.expect("a lease");
                    assert!(
                        left > short,
                        "{kind}: the store keeps the grant for the re-entry: {left:?}"
                    );
                    let other = if kind == "read" { "write" } else { kind };
                    let next =
                        request(&env.b, &key, other).wait(long / 2).acquire().await.unwrap_or_else(
                            |error| panic!("{kind}: the re-entry's lease held on: {error:?}"),
                        );
                    assert!(first.is_lost(), "{kind}: its guard outlived its lease");
                    next.release().await.unwrap();
                    drop(first);
                }
            }

            /// The grant ends with its last live hold, whichever it is: the first guard
            /// released while a re-entry with a longer lease lives leaves the lock held, and
            /// the re-entry's release then frees it at once.
            #[tokio::test]
            async fn the_grant_ends_with_its_last_live_hold() {
                let env = $env.await;
                let (short, long) = (Duration::from_secs(3), Duration::from_secs(60));
                for kind in support::kinds::KINDS {
                    let key = format!("last-hold-{kind}");
                    let (_, first, again) = reentered(&env.a, &key, kind, short, long).await;
                    first.release().await.unwrap();
                    assert!(!again.is_lost(), "{kind}");
                    support::kinds::assert_refused_to(&env.b, &key, kind).await;
                    again.release().await.unwrap();
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
    let hold = |lease| request(client, key, kind).holder(&holder).lease(Lease::fixed(lease));
    let first = hold(first).acquire().await.unwrap();
    let again = hold(again).try_acquire().await.unwrap();
    (holder, first, again)
}

fn builder<B: Backend>(backend: B) -> LockClient<B> {
    LockClient::builder(backend).build().unwrap()
}

reentry_semantics!(memory, support::stores::in_memory(builder));

reentry_semantics!(redis, support::stores::on_redis(builder));
