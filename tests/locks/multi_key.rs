//! Sets of locks (`LockClient::lock_all`), on every backend: the in-memory backend (two clients
//! on clones of one `MemoryBackend`) and Redis (two clients, each with its own connections, on
//! a `redis-server` started for the test). Each case is a generic `async fn`; [`multi_key!`]
//! runs every case on each backend.

use crate::support;

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use support::stores::Env;
use tokio::time::{Instant, timeout};
use tower_lock::{Backend, Lease, LockClient, LockError, MemoryBackend, key::KeyError};

fn client<B: Backend>(backend: B) -> LockClient<B> {
    LockClient::builder(backend).build().expect("valid")
}

async fn memory_env() -> Env<MemoryBackend> {
    support::stores::in_memory(client).await
}

async fn redis_env() -> Env<tower_lock::RedisBackend> {
    support::stores::on_redis(client).await
}

/// Who is inside a section of each key, checked across an `.await`.
#[derive(Clone, Default)]
struct Exclusivity {
    inside: Arc<Mutex<HashMap<String, usize>>>,
    overlaps: Arc<AtomicU64>,
    sections: Arc<AtomicU64>,
}

impl Exclusivity {
    async fn section(&self, keys: &[String]) {
        {
            let mut inside = self.inside.lock().unwrap();
            for key in keys {
                let n = inside.entry(key.clone()).or_default();
                *n += 1;
                if *n > 1 {
                    self.overlaps.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
        // Others run meanwhile: a second holder of any of these keys would be seen above.
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_micros(200)).await;
        let mut inside = self.inside.lock().unwrap();
        for key in keys {
            *inside.get_mut(key).unwrap() -= 1;
        }
        self.sections.fetch_add(1, Ordering::SeqCst);
    }
}

/// A small seedable generator (SplitMix64), so a task's sequence of sets is reproducible.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % n
    }
}

async fn opposite_orders<B: Backend>(env: Env<B>) {
    const ACCOUNTS: u64 = 4;
    const ROUNDS: usize = 40;
    let witness = Exclusivity::default();
    let mut tasks = tokio::task::JoinSet::new();
    for (c, client) in [&env.a, &env.b].into_iter().enumerate() {
        for t in 0..8u64 {
            let (client, witness) = (client.clone(), witness.clone());
            let mut rng = Rng(c as u64 * 100 + t);
            tasks.spawn(async move {
                for _ in 0..ROUNDS {
                    // Two or three accounts, in a random order: opposite orders are common.
                    let n = 2 + rng.below(2);
                    let mut keys = Vec::new();
                    while keys.len() < n as usize {
                        let key = format!("account:{}", rng.below(ACCOUNTS));
                        if !keys.contains(&key) {
                            keys.push(key);
                        }
                    }
                    let set = client.lock_all(&keys).wait(Duration::from_secs(20));
                    let guard = set.acquire().await.expect("no deadlock: granted in the wait");
                    witness.section(&keys).await;
                    guard.release().await.expect("release a held set");
                }
            });
        }
    }
    let all = timeout(Duration::from_secs(60), async {
        while let Some(joined) = tasks.join_next().await {
            joined.expect("a contending task");
        }
    });
    all.await.expect("every task finished: no deadlock");
    assert_eq!(witness.sections.load(Ordering::SeqCst), 2 * 8 * ROUNDS as u64);
    assert_eq!(witness.overlaps.load(Ordering::SeqCst), 0, "two holders of one key");
}

async fn request_order_deadlocks<B: Backend>(env: Env<B>) {
    // The control: one lock at a time in each request's own order, two opposite requests,
    // each holding its first lock when it asks for its second, wait for each other until both
    // waits run out (each keeps its first lock until both have given up, as a request would
    // until its response). The same two as sets both succeed.
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let one_by_one = |client: LockClient<B>, first: &'static str, second: &'static str| {
        let barrier = barrier.clone();
        async move {
            let first = client.lock(first).acquire().await.expect("first lock");
            barrier.wait().await;
            let second = client.lock(second).wait(Duration::from_millis(300)).acquire().await;
            barrier.wait().await;
            drop(first);
            second.map(drop)
        }
    };
    let (ab, ba) =
        tokio::join!(one_by_one(env.a.clone(), "x", "y"), one_by_one(env.b.clone(), "y", "x"));
    assert!(
        matches!(ab, Err(LockError::WaitTimeout { .. }))
            && matches!(ba, Err(LockError::WaitTimeout { .. })),
        "opposite orders one by one: {ab:?} {ba:?}"
    );

    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let as_set = |client: LockClient<B>, keys: [&'static str; 2]| {
        let barrier = barrier.clone();
        async move {
            barrier.wait().await;
            let set = client.lock_all(keys).wait(Duration::from_secs(5));
            let guard = set.acquire().await?;
            tokio::time::sleep(Duration::from_millis(20)).await;
            guard.release().await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }
    };
    let (ab, ba) =
        tokio::join!(as_set(env.a.clone(), ["x", "y"]), as_set(env.b.clone(), ["y", "x"]));
    ab.expect("x, y as a set");
    ba.expect("y, x as a set");
}

/// Each of `keys` can be taken at once by `client`: nothing left it held.
async fn assert_free<B: Backend>(client: &LockClient<B>, keys: &[&str]) {
    for key in keys {
        let guard = client.lock(key).try_acquire().await;
        guard.unwrap_or_else(|e| panic!("{key} left held: {e:?}")).release().await.unwrap();
    }
}

async fn all_or_nothing<B: Backend>(env: Env<B>) {
    let held = env.b.lock("k2").acquire().await.expect("k2");
    let started = Instant::now();
    let set = env.a.lock_all(["k3", "k2", "k1"]);
    let error =
        set.wait(Duration::from_millis(150)).acquire().await.expect_err("k2 is held elsewhere");
    assert!(started.elapsed() >= Duration::from_millis(140), "waited the set's wait");
    assert!(matches!(error.error(), LockError::WaitTimeout { .. }), "{error:?}");
    assert_eq!(error.key().map(|key| key.user_key()), Some(b"k2".to_vec()));
    assert!(error.to_string().contains("k2"), "{error}");
    // Nothing of the set is left held: another client takes k1 and k3 at once.
    assert_free(&env.b, &["k1", "k3"]).await;
    assert_eq!(env.a.active_keys(), 0, "the client tracks nothing of the set");
    held.release().await.unwrap();
    // And then the set is granted.
    let set = env.a.lock_all(["k3", "k2", "k1"]).try_acquire().await.expect("all free");
    set.release().await.unwrap();
}

async fn lost_while_waiting_for_the_rest<B: Backend>(env: Env<B>) {
    // k2 frees itself after 300 ms; k1, taken first with a 100 ms fixed lease, runs out while
    // the set waits for k2.
    let held = env
        .b
        .lock("k2")
        .lease(Lease::fixed(Duration::from_millis(300)))
        .acquire()
        .await
        .expect("k2");
    let error = env
        .a
        .lock_all(["k2", "k1"])
        .lease(Lease::fixed(Duration::from_millis(100)))
        .wait(Duration::from_secs(2))
        .acquire()
        .await
        .expect_err("k1 ran out while k2 was waited for");
    assert!(matches!(error.error(), LockError::Lost), "{error:?}");
    assert_eq!(error.key().map(|key| key.user_key()), Some(b"k1".to_vec()));
    // Nothing of the set is held: both are free for another client.
    assert_free(&env.b, &["k1", "k2"]).await;
    drop(held);
}

async fn one_wait_for_the_set<B: Backend>(env: Env<B>) {
    // The wait is the set's, not each lock's: two held locks cost one wait, not two.
    let (x, y) =
        (env.b.lock("w1").acquire().await.unwrap(), env.b.lock("w2").acquire().await.unwrap());
    // w1 frees after 300 ms of a 400 ms wait: one wait for the set ends at 400 ms, a wait per
    // lock would run to 700 ms.
    let started = Instant::now();
    let set = env.a.lock_all(["w1", "w2"]).wait(Duration::from_millis(400));
    let release_first = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        x.release().await.unwrap();
    };
    let (result, ()) = tokio::join!(set.acquire(), release_first);
    let took = started.elapsed();
    let error = result.expect_err("w2 stays held");
    assert_eq!(error.key().map(|key| key.user_key()), Some(b"w2".to_vec()));
    assert!(took < Duration::from_millis(650), "the set waited {took:?}, more than its wait");
    y.release().await.unwrap();
}

async fn fencing_per_key<B: Backend>(env: Env<B>) {
    let first = env.a.lock_all(["f:1", "f:2"]).fencing().acquire().await.unwrap();
    let tokens: Vec<u64> = first.guards().map(|g| g.fencing_token().expect("asked for")).collect();
    assert_eq!(tokens.len(), 2);
    assert_eq!(first.fencing_token("f:1"), Some(tokens[0]));
    assert_eq!(first.fencing_token("f:2"), Some(tokens[1]));
    assert_eq!(first.fencing_token("f:3"), None, "not in the set");
    first.release().await.unwrap();
    // Each lock's tokens rise on its own, whether the next owner takes it alone or in a set.
    let alone = env.b.lock("f:1").fencing().acquire().await.unwrap();
    let alone_token = alone.fencing_token().unwrap();
    assert!(alone_token > tokens[0]);
    alone.release().await.unwrap();
    let next = env.b.lock_all(["f:2", "f:1"]).fencing().acquire().await.unwrap();
    assert!(next.fencing_token("f:1").unwrap() > alone_token);
    assert!(next.fencing_token("f:2").unwrap() > tokens[1]);
    next.release().await.unwrap();
}

async fn lost_when_a_lease_runs_out<B: Backend>(env: Env<B>) {
    let set = env.a.lock_all(["l:1", "l:2"]).lease(Lease::fixed(Duration::from_millis(200)));
    let set = set.acquire().await.unwrap();
    assert!(!set.is_lost());
    timeout(Duration::from_secs(2), set.lost()).await.expect("lost() resolves");
    assert!(set.is_lost());
    let released = set.release().await;
    assert!(matches!(released, Err(LockError::Lost | LockError::NotHeld)), "{released:?}");
}

async fn drop_releases_all<B: Backend>(env: Env<B>) {
    let set = env.a.lock_all(["d:1", "d:2", "d:3"]).acquire().await.unwrap();
    drop(set);
    // Released in the background: another client's set is granted well within a lease.
    let started = Instant::now();
    let next = env.b.lock_all(["d:3", "d:1", "d:2"]).wait(Duration::from_secs(5)).acquire().await;
    next.expect("released by the drop").release().await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(2), "freed only by the lease");
}

async fn duplicates_collapse<B: Backend>(env: Env<B>) {
    let set = env.a.lock_all(["dup", "other", "dup"]).acquire().await.unwrap();
    assert_eq!(set.guards().len(), 2);
    assert!(set.guards().all(|g| g.hold_count() == 1), "one hold each, no re-entry");
    set.release().await.unwrap();
    assert_free(&env.b, &["dup", "other"]).await;
}

async fn empty_and_invalid<B: Backend>(env: Env<B>) {
    let empty = env.a.lock_all(Vec::<String>::new()).acquire().await.unwrap_err();
    assert!(matches!(empty.error(), LockError::InvalidKey(KeyError::Empty)), "{empty:?}");
    assert!(empty.key().is_none());
    let invalid = env.a.lock_all(["fine", ""]).acquire().await.unwrap_err();
    assert!(matches!(invalid.into_error(), LockError::InvalidKey(KeyError::Empty)));
    assert_eq!(env.a.active_keys(), 0, "nothing was taken");
}

async fn reentry_and_kinds<B: Backend>(env: Env<B>) {
    // A holder that has one lock of the set re-enters it.
    let me = env.a.holder();
    let outer = env.a.lock("r:1").holder(&me).acquire().await.unwrap();
    let set = env.a.lock_all(["r:2", "r:1"]).holder(&me).try_acquire().await.unwrap();
    assert_eq!(set.holder(), &me);
    assert_eq!(set.guard("r:1").unwrap().hold_count(), 2);
    set.release().await.unwrap();
    assert!(env.b.lock("r:1").try_acquire().await.is_err(), "the outer hold remains");
    env.b.lock("r:2").try_acquire().await.unwrap().release().await.unwrap();
    outer.release().await.unwrap();

    // Fair sets; read sets share; a write set waits for readers.
    let fair = env.a.lock_all(["q:1", "q:2"]).fair().acquire().await.unwrap();
    assert!(env.b.fair_lock("q:2").try_acquire().await.is_err());
    fair.release().await.unwrap();
    let read_a = env.a.lock_all(["q:1", "q:2"]).read().acquire().await.unwrap();
    let read_b = env.b.lock_all(["q:2", "q:1"]).read().try_acquire().await.unwrap();
    assert!(env.b.lock_all(["q:1"]).write().try_acquire().await.is_err());
    read_a.release().await.unwrap();
    read_b.release().await.unwrap();
    env.b.read_write_lock("q:1").write().try_acquire().await.unwrap().release().await.unwrap();
}

async fn cancelled_acquire_leaves_nothing<B: Backend>(env: Env<B>) {
    let held = env.b.lock("c:2").acquire().await.unwrap();
    // Dropped while it waits for c:2, holding c:1.
    let set = env.a.lock_all(["c:1", "c:2"]).wait(Duration::from_secs(10)).acquire();
    assert!(timeout(Duration::from_millis(150), set).await.is_err());
    let freed = env.b.lock("c:1").wait(Duration::from_secs(2)).acquire().await;
    freed.expect("c:1 given back by the dropped acquire").release().await.unwrap();
    held.release().await.unwrap();
    let started = Instant::now();
    while env.a.active_keys() + env.a.waiters() > 0 {
        assert!(started.elapsed() < Duration::from_secs(2), "client state left behind");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn holders_of_another_client<B: Backend>(env: Env<B>) {
    let holder = env.a.holder();
    let held = env.a.lock("h:2").holder(&holder).acquire().await.unwrap();
    // An explicit holder of another client: refused before any lock is asked for.
    let foreign = env.b.lock_all(["h:1", "h:3"]).holder(&holder).try_acquire().await;
    let error = foreign.expect_err("another client's holder");
    assert!(matches!(error.error(), LockError::ForeignHolder), "{error:?}");
    assert!(error.key().is_none(), "{error:?}");
    assert_eq!(env.b.active_keys(), 0);
    holder
        .clone()
        .scope(async {
            // In the scope of a holder of another client that holds one of the set's locks:
            // the set would wait for itself, so it fails at once, naming that lock.
            let set = env.b.lock_all(["h:1", "h:2"]).wait(Duration::from_secs(60)).acquire();
            let error = timeout(Duration::from_secs(30), set)
                .await
                .expect("failed at once, not after the wait")
                .expect_err("held through the other client");
            assert!(matches!(error.error(), LockError::HeldThroughOtherClient), "{error:?}");
            assert!(error.key().is_some_and(|key| key.as_str().ends_with("{h:2}")), "{error:?}");
            // A set of locks it does not hold: taken under a holder of the client's own.
            let set = env.b.lock_all(["h:1", "h:3"]).try_acquire().await.unwrap();
            assert_ne!(set.holder(), &holder);
            set.release().await.unwrap();
        })
        .await;
    held.release().await.unwrap();
    assert_free(&env.b, &["h:1", "h:2", "h:3"]).await;
}

macro_rules! multi_key {
    ($backend:ident, $make:expr) => {
        mod $backend {
            use super::*;

            /// 2 clients × 8 tasks × 40 random 2–3-key sets over 4 keys, in random orders:
            /// every set is granted (no deadlock) and no key ever has two holders.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn opposite_orders_never_deadlock_nor_overlap() {
                super::opposite_orders($make.await).await;
            }

            /// Taken one by one in request order, opposite requests deadlock until their waits
            /// run out; as sets, both are granted.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn request_order_deadlocks_sets_do_not() {
                super::request_order_deadlocks($make.await).await;
            }

            /// One key held elsewhere: the set times out naming it, and leaves the others free.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn all_or_nothing() {
                super::all_or_nothing($make.await).await;
            }

            /// A lock taken early and lost while the rest were waited for fails the set.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn lost_while_waiting_for_the_rest() {
                super::lost_while_waiting_for_the_rest($make.await).await;
            }

            /// One wait for the whole set, not one per lock.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn one_wait_for_the_set() {
                super::one_wait_for_the_set($make.await).await;
            }

            /// A fencing token per lock, rising per lock across sets and single locks.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn fencing_per_key() {
                super::fencing_per_key($make.await).await;
            }

            /// A set whose leases run out is lost: `lost()` resolves, the release says so.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn lost_when_a_lease_runs_out() {
                super::lost_when_a_lease_runs_out($make.await).await;
            }

            /// Dropping the guard releases every lock of the set.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn drop_releases_all() {
                super::drop_releases_all($make.await).await;
            }

            /// A key named twice is one lock, held once.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn duplicates_collapse() {
                super::duplicates_collapse($make.await).await;
            }

            /// An empty set and a set with an invalid key fail before any lock is taken.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn empty_and_invalid() {
                super::empty_and_invalid($make.await).await;
            }

            /// A holder re-enters a lock it has; fair, read and write sets behave as their locks.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn reentry_and_kinds() {
                super::reentry_and_kinds($make.await).await;
            }

            /// An acquire dropped halfway gives back what it took.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn cancelled_acquire_leaves_nothing() {
                super::cancelled_acquire_leaves_nothing($make.await).await;
            }

            /// A holder belongs to its client: a set refuses another client's, and fails at
            /// once in the scope of another client's holder that holds one of its locks.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn holders_of_another_client() {
                super::holders_of_another_client($make.await).await;
            }
        }
    };
}

multi_key!(memory, memory_env());
multi_key!(redis, redis_env());

/// On Redis, one lock of a held set taken away (its key deleted, as a failover without the
/// grant would) makes the whole set lost within a renewal, while the other lock is still held.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_member_lost_loses_the_set() {
    let env = redis_env().await;
    let server = env.server.as_ref().unwrap();
    let set = env.a.lock_all(["m:1", "m:2"]).lease(Lease::watchdog(Duration::from_millis(300)));
    let set = set.acquire().await.unwrap();
    let gone = set.guard("m:2").unwrap().key().as_str().to_owned();
    server.cmd(&["DEL", &gone]);
    timeout(Duration::from_secs(2), set.lost()).await.expect("the set is lost");
    assert!(set.is_lost());
    assert!(set.guard("m:2").unwrap().is_lost());
    assert!(!set.guard("m:1").unwrap().is_lost(), "the other lock is still held");
    assert!(env.b.lock("m:1").try_acquire().await.is_err());
    let released = set.release().await;
    assert!(released.is_err(), "the release reports the lost lock: {released:?}");
    // Every lock was released all the same.
    env.b.lock("m:1").try_acquire().await.unwrap().release().await.unwrap();
}
