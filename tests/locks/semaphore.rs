//! Per-key semaphores, run on every backend that offers them: in memory, on a real
//! `redis-server` started for each test, and on a Redis Cluster.

use crate::support;

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use support::granted::Granted;
use tower_lock::{
    Backend, Holder, Lease, LockClient, LockError, LockKind,
    backend::store::{Renew, RenewReply, Store},
};

fn builder<B: Backend>(backend: B) -> LockClient<B> {
    LockClient::builder(backend).wait(Duration::from_secs(20)).build().expect("valid configuration")
}

/// How long a waiter may take to get a permit after it was given back when notifications
/// work: far below every lease the tests hold permits with.
const PROMPT: Duration = Duration::from_secs(1);

macro_rules! semaphore_semantics {
    ($backend:ident, $env:expr) => {
        mod $backend {
            use super::*;

            /// Twenty-four tasks over three clients, each taking a permit of a 3-permit
            /// semaphore many times with an await inside: never more than 3 inside at once,
            /// and 3 inside at some point (the permits are really shared).
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn never_more_holders_than_permits() {
                let env = $env.await;
                let c = (env.more)().await;
                let inside = Arc::new(AtomicUsize::new(0));
                let most = Arc::new(AtomicUsize::new(0));
                let mut tasks = Vec::new();
                for i in 0..24 {
                    let client = [&env.a, &env.b, &c][i % 3].clone();
                    let (inside, most) = (inside.clone(), most.clone());
                    tasks.push(tokio::spawn(async move {
                        for _ in 0..15 {
                            let permit = client.semaphore("pool", 3).acquire().await.unwrap();
                            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(now, Ordering::SeqCst);
                            assert!(now <= 3, "{now} holders of a 3-permit semaphore");
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            inside.fetch_sub(1, Ordering::SeqCst);
                            permit.release().await.unwrap();
                        }
                    }));
                }
                for task in tasks {
                    task.await.unwrap();
                }
                assert_eq!(most.load(Ordering::SeqCst), 3, "permits were not shared");
            }

            /// With every permit out, a waiter is woken when one is given back, long before
            /// any lease runs out; a refused try says when to retry (the first lease's end).
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_given_back_permit_wakes_a_waiter() {
                let env = $env.await;
                let lease = Lease::fixed(Duration::from_secs(30));
                let one = env.a.semaphore("wake", 2).lease(lease).acquire().await.unwrap();
                let two = env.a.semaphore("wake", 2).lease(lease).acquire().await.unwrap();
                let refused = env.b.semaphore("wake", 2).try_acquire().await;
                let retry = match refused {
                    Err(LockError::WaitTimeout { retry_after, .. }) => retry_after,
                    other => panic!("every permit is out: {other:?}"),
                };
                // No hold of the semaphore seen yet, no wait: the bounded guess, not the 30 s
                // the first permit's lease has left.
                assert_eq!(retry, Some(Duration::from_millis(100)), "retry after a bounded guess");
                let b = env.b.clone();
                let waiter = tokio::spawn(async move {
                    let permit = b.semaphore("wake", 2).acquire().await;
                    (permit, Instant::now())
                });
                // The waiter is listening once it has been refused; give it the chance.
                while env.b.waiters() == 0 {
                    tokio::task::yield_now().await;
                }
                let released = Instant::now();
                one.release().await.unwrap();
                let (permit, got) = waiter.await.unwrap();
                let permit = permit.expect("a permit came back");
                assert!(got - released < PROMPT, "woken after {:?}", got - released);
                permit.release().await.unwrap();
                two.release().await.unwrap();
            }

            /// A holder that stops renewing (a crashed process) loses its permit when its
            /// lease runs out, and a waiter elsewhere takes it then.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_crashed_holders_permit_comes_back() {
                let env = $env.await;
                let doomed = (env.more)().await;
                let lease = Lease::fixed(Duration::from_millis(400));
                let kept = env.a.semaphore("crash", 2).acquire().await.unwrap();
                let dead = doomed.semaphore("crash", 2).lease(lease).acquire().await.unwrap();
                let started = Instant::now();
                // The process stops holding the permit without giving it back: a fixed lease
                // is never renewed, and the guard is not dropped until the end.
                let _stuck = dead;
                let permit =
                    env.b.semaphore("crash", 2).wait(Duration::from_secs(5)).acquire().await;
                let permit = permit.expect("the dead holder's permit came back");
                assert!(
                    started.elapsed() >= Duration::from_millis(350),
                    "taken before the lease ran out"
                );
                permit.release().await.unwrap();
                kept.release().await.unwrap();
            }

            /// The watchdog keeps a permit held for longer than many leases.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn the_watchdog_keeps_a_permit() {
                let env = $env.await;
                let lease = Lease::watchdog(Duration::from_millis(150));
                let permit = env.a.semaphore("renewed", 1).lease(lease).acquire().await.unwrap();
                let lost = permit.lost();
                tokio::select! {
                    () = lost => panic!("the permit was lost while renewed"),
                    () = tokio::time::sleep(Duration::from_millis(900)) => {}
                }
                assert!(matches!(
                    env.b.semaphore("renewed", 1).try_acquire().await,
                    Err(LockError::WaitTimeout { .. })
                ));
                permit.release().await.unwrap();
                env.b.semaphore("renewed", 1).try_acquire().await.unwrap().release().await.unwrap();
            }

            /// A renewal that comes after a permit's lease ended does not bring it back.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_late_renewal_does_not_revive_a_permit() {
                let env = $env.await;
                // Another holder's long lease keeps the semaphore itself alive meanwhile.
                let long = Lease::fixed(Duration::from_secs(30));
                let kept = env.b.semaphore("late", 2).lease(long).acquire().await.unwrap();
                let lease = Lease::fixed(Duration::from_millis(100));
                // Through a store that tells the permit's grant, which the renewal names.
                let store = Granted::new(env.a.backend().clone());
                let a = builder(store.clone());
                let permit = a.semaphore("late", 2).lease(lease).acquire().await.unwrap();
                permit.lost().await;
                // Past its lease in the store too (the guard's own deadline comes first).
                tokio::time::sleep(Duration::from_millis(50)).await;
                let grant = store.grant(permit.key(), permit.holder().id()).unwrap();
                let renew = Renew::Grant {
                    key: permit.key(),
                    kind: LockKind::Semaphore,
                    grant: &grant,
                    lease,
                };
                let replies = store.renew(&[renew]).await.unwrap();
                assert_eq!(replies, [RenewReply::NotHeld]);
                // Its permit is free for someone else.
                let other = env.b.semaphore("late", 2).try_acquire().await.unwrap();
                other.release().await.unwrap();
                kept.release().await.unwrap();
            }

            /// A holder that acquires again nests in its permit: one permit, two holds.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_holder_nests_in_its_permit() {
                let env = $env.await;
                let holder = env.a.holder();
                let (outer, inner) = holder
                    .scope(async {
                        let outer = env.a.semaphore("nest", 2).acquire().await.unwrap();
                        let inner = env.a.semaphore("nest", 2).acquire().await.unwrap();
                        (outer, inner)
                    })
                    .await;
                assert_eq!(inner.hold_count(), 2);
                let other = env
                    .b
                    .semaphore("nest", 2)
                    .try_acquire()
                    .await
                    .expect("a second permit is free");
                inner.release().await.unwrap();
                outer.release().await.unwrap();
                other.release().await.unwrap();
                let _ = Holder::current();
            }

            /// A semaphore's name is its own: the lock of the same key is not in its way.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn separate_from_the_lock_of_the_same_key() {
                let env = $env.await;
                let lock = env.a.lock("same").acquire().await.unwrap();
                let permit = env.b.semaphore("same", 1).try_acquire().await.unwrap();
                permit.release().await.unwrap();
                lock.release().await.unwrap();
            }

            /// A fencing token on a shared permit would not say who wrote last: refused.
            #[tokio::test]
            async fn fencing_is_refused() {
                let env = $env.await;
                let refused = env.a.semaphore("fenced", 2).fencing().acquire().await;
                match refused {
                    Err(LockError::Backend(error)) => assert!(error.is_unsupported(), "{error:#}"),
                    other => panic!("a fenced permit: {other:?}"),
                }
            }

            /// No permits is a misconfiguration, refused before the backend is asked.
            #[tokio::test]
            async fn zero_permits_is_refused() {
                let env = $env.await;
                let refused = env.a.semaphore("none", 0).acquire().await;
                assert!(matches!(refused, Err(LockError::InvalidPermits)), "{refused:?}");
            }
        }
    };
}

semaphore_semantics!(memory, support::stores::in_memory(builder));

semaphore_semantics!(redis, support::stores::on_redis(builder));

/// A key of another type at the semaphore's name is reported, never overwritten.
#[tokio::test]
async fn foreign_data_is_left_alone() {
    let server = support::RedisServer::start();
    let locks = builder(support::redis_backend(server.url()).connect().await.unwrap());
    server.cmd(&["SET", "tower-lock:{jobs}:sem", "not a semaphore"]);
    let refused = locks.semaphore("jobs", 2).try_acquire().await;
    match refused {
        Err(LockError::Backend(error)) => assert!(error.is_wrong_type(), "{error:#}"),
        other => panic!("foreign data: {other:?}"),
    }
    assert_eq!(
        server.cmd(&["GET", "tower-lock:{jobs}:sem"]).as_str().as_deref(),
        Some("not a semaphore")
    );
}

/// Redlock offers no semaphore: refused with a clear error before any node is asked.
#[tokio::test]
async fn redlock_refuses_semaphores() {
    let servers: Vec<_> = (0..3).map(|_| support::RedisServer::start()).collect();
    let backend = support::redlock_backend(servers.iter().map(|s| s.url())).build().unwrap();
    let locks = builder(backend);
    let refused = locks.semaphore("jobs", 2).try_acquire().await;
    match refused {
        Err(LockError::Backend(error)) => assert!(error.is_unsupported(), "{error:#}"),
        other => panic!("Redlock semaphore: {other:?}"),
    }
}

/// Twenty waiters of one client for a full semaphore: a permit given back wakes one acquire
/// call of that client (its first waiter), not one per waiter; the rest follow one by one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_given_back_permit_wakes_one_call_per_client() {
    let server = support::RedisServer::start();
    let connect =
        || async { builder(support::redis_backend(server.url()).connect().await.unwrap()) };
    let (holder, waiting) = (connect().await, connect().await);
    let lease = Lease::fixed(Duration::from_secs(30));
    let held = holder.semaphore("herd", 1).lease(lease).acquire().await.unwrap();
    let (got, mut granted) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for _ in 0..20 {
        let (waiting, got) = (waiting.clone(), got.clone());
        waiters.push(tokio::spawn(async move {
            let permit = waiting.semaphore("herd", 1).lease(lease).acquire().await.unwrap();
            got.send(()).unwrap();
            // Held until the test ends, so the next waiter stays refused.
            std::future::pending::<()>().await;
            drop(permit);
        }));
    }
    while waiting.waiters() < 20 {
        tokio::task::yield_now().await;
    }
    // Every waiter has had its chance to ask: only the first of them does.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = server.calls("evalsha");
    held.release().await.unwrap();
    granted.recv().await.expect("a waiter got the permit");
    // Whatever more the release set off has happened by now.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let calls = server.calls("evalsha") - before;
    // The release, the first waiter's grant, the next waiter's refused try.
    assert!(calls <= 4, "{calls} script calls for one permit given back to 20 waiters");
    assert!(granted.try_recv().is_err(), "two waiters got the one permit");
    for waiter in waiters {
        waiter.abort();
    }
}
