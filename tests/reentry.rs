//! Re-entries, run on every store: in memory and on a real `redis-server` started for each
//! test.

mod support;

use tower_lock::{Backend, LockClient};

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
        }
    };
}

fn builder<B: Backend>(backend: B) -> LockClient<B> {
    LockClient::builder(backend).build().unwrap()
}

reentry_semantics!(memory, support::stores::in_memory(builder));

reentry_semantics!(redis, support::stores::on_redis(builder));
