//! Fair (FIFO) locks and read-write locks, run on every backend: in memory and on a real
//! `redis-server` started for each test.

use crate::support;

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use tower_lock::{Backend, Lease, LockClient, LockError};

/// Starts a fair acquire on `client` and returns once its waiter holds a place in the queue.
async fn join_queue<B: Backend>(
    client: &LockClient<B>,
    key: &'static str,
    order: Arc<Mutex<Vec<usize>>>,
    index: usize,
) -> tokio::task::JoinHandle<()> {
    let before = client.queued();
    let waiter = client.clone();
    let task = tokio::spawn(async move {
        let guard = waiter
            .fair_lock(key)
            .wait(Duration::from_secs(20))
            .acquire()
            .await
            .expect("fair waiter acquires");
        order.lock().unwrap().push(index);
        guard.release().await.expect("release");
    });
    support::eventually(Duration::from_secs(5), "the waiter is queued", || {
        client.queued() > before
    })
    .await;
    task
}

/// Takes a read hold of `key` with a fixed `lease` through a client of its own, on a runtime
/// that is then shut down: a process that died holding it (nothing renews or releases it).
fn read_hold_of_a_dead_process<B: Backend>(
    more: &support::stores::MoreClients<B>,
    key: &'static str,
    lease: Duration,
) {
    tokio::task::block_in_place(|| {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let client = more().await;
            let rw = client.read_write_lock(key);
            let guard = rw.read().lease(Lease::fixed(lease)).acquire().await;
            // Never dropped: a dead process gives nothing back.
            let _dead = std::mem::ManuallyDrop::new(guard.unwrap());
        });
        runtime.shutdown_background();
    });
}

macro_rules! fair_rw_semantics {
    ($backend:ident, $env:expr) => {
        mod $backend {
            use super::*;

            /// Sixteen waiters from two clients, joining one after another while the lock is
            /// held, get it in exactly the order they joined; repeated over several rounds.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn fair_lock_is_fifo_across_clients() {
                let env = $env.await;
                for round in 0..5 {
                    let holder = env.a.fair_lock("fifo").acquire().await.unwrap();
                    let order = Arc::new(Mutex::new(Vec::new()));
                    let mut tasks = Vec::new();
                    for i in 0..16 {
                        let client = if i % 2 == 0 { &env.a } else { &env.b };
                        tasks.push(join_queue(client, "fifo", order.clone(), i).await);
                    }
                    holder.release().await.unwrap();
                    for task in tasks {
                        task.await.unwrap();
                    }
                    let order = order.lock().unwrap().clone();
                    assert_eq!(order, (0..16).collect::<Vec<_>>(), "round {round}");
                }
            }

            /// A newcomer cannot take a free fair lock while a live waiter is queued for it.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn newcomer_does_not_jump_the_queue() {
                let env = $env.await;
                let frozen = (env.more)().await;
                let holder = env.a.fair_lock("q").acquire().await.unwrap();
                // A waiter whose client stops running: its place stays until its timeout.
                let mut waiter = Box::pin(
                    frozen
                        .fair_lock("q")
                        .wait(Duration::from_secs(30))
                        .acquire(),
                );
                tokio::select! {
                    _ = &mut waiter => panic!("the lock is held"),
                    () = support::eventually(Duration::from_secs(5), "queued", || frozen.queued() == 1) => {}
                }
                holder.release().await.unwrap();
                let newcomer = env.b.fair_lock("q").try_acquire().await;
                assert!(
                    matches!(newcomer, Err(LockError::WaitTimeout { .. })),
                    "a newcomer took the lock ahead of a queued waiter: {newcomer:?}"
                );
                // The queued waiter itself gets it.
                let guard = waiter.await.unwrap();
                guard.release().await.unwrap();
            }

            /// A waiter whose process died (its place no longer kept alive) is purged after the
            /// waiter timeout, and the next waiter gets the lock.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn dead_waiter_is_purged() {
                let env = $env.await;
                let doomed = (env.more)().await;
                let holder = env.a.fair_lock("dead").acquire().await.unwrap();
                let mut dead = Box::pin(
                    doomed
                        .fair_lock("dead")
                        .wait(Duration::from_secs(30))
                        .acquire(),
                );
                tokio::select! {
                    _ = &mut dead => panic!("the lock is held"),
                    () = support::eventually(Duration::from_secs(5), "queued", || doomed.queued() == 1) => {}
                }
                // The process "dies": its watchdog stops, nothing leaves the queue.
                doomed.shutdown().await;
                let order = Arc::new(Mutex::new(Vec::new()));
                let next = join_queue(&env.b, "dead", order.clone(), 1).await;
                let released = Instant::now();
                holder.release().await.unwrap();
                next.await.unwrap();
                let stall = released.elapsed();
                assert_eq!(*order.lock().unwrap(), vec![1]);
                // The dead waiter stalls the queue for at most its timeout (500 ms here).
                assert!(stall < Duration::from_secs(3), "stalled for {stall:?}");
                // Keep the dead future alive until here: it must not clean up after itself.
                std::mem::drop(dead);
            }

            /// A waiter that gives up leaves the queue at once: the next one is not held up.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn cancelled_waiter_leaves_the_queue() {
                let env = $env.await;
                let holder = env.a.fair_lock("c").acquire().await.unwrap();
                let gives_up = env
                    .b
                    .fair_lock("c")
                    .wait(Duration::from_millis(300))
                    .acquire()
                    .await;
                assert!(matches!(gives_up, Err(LockError::WaitTimeout { .. })));
                let order = Arc::new(Mutex::new(Vec::new()));
                let next = join_queue(&env.a, "c", order.clone(), 7).await;
                let released = Instant::now();
                holder.release().await.unwrap();
                next.await.unwrap();
                assert!(released.elapsed() < Duration::from_millis(400));
                assert_eq!(env.b.queued(), 0);
                assert_eq!(env.b.waiters(), 0);
            }

            /// Fair locks re-enter for the same holder and issue rising fencing tokens.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn fair_lock_reenters_and_fences() {
                let env = $env.await;
                let holder = env.a.holder();
                let outer = env
                    .a
                    .fair_lock("r")
                    .holder(&holder)
                    .fencing()
                    .acquire()
                    .await
                    .unwrap();
                let inner = env
                    .a
                    .fair_lock("r")
                    .holder(&holder)
                    .fencing()
                    .try_acquire()
                    .await
                    .unwrap();
                assert_eq!(inner.hold_count(), 2);
                assert_eq!(inner.fencing_token(), outer.fencing_token());
                inner.release().await.unwrap();
                assert!(env.b.fair_lock("r").try_acquire().await.is_err());
                let first = outer.fencing_token().unwrap();
                outer.release().await.unwrap();
                let next = env.b.fair_lock("r").fencing().try_acquire().await.unwrap();
                assert!(next.fencing_token().unwrap() > first);
                next.release().await.unwrap();
            }

            /// Readers share, writers exclude readers and writers: checked with counters of who
            /// is inside, under real concurrency.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn readers_share_writers_exclude() {
                let env = $env.await;
                let readers = Arc::new(AtomicUsize::new(0));
                let writers = Arc::new(AtomicUsize::new(0));
                let max_readers = Arc::new(AtomicUsize::new(0));
                let mut tasks = Vec::new();
                for t in 0..12 {
                    let client = if t % 2 == 0 {
                        env.a.clone()
                    } else {
                        env.b.clone()
                    };
                    let (readers, writers, max_readers) =
                        (readers.clone(), writers.clone(), max_readers.clone());
                    tasks.push(tokio::spawn(async move {
                        for i in 0..30 {
                            let rw = client.read_write_lock("doc");
                            if (t + i) % 4 == 0 {
                                let guard = rw
                                    .write()
                                    .wait(Duration::from_secs(20))
                                    .acquire()
                                    .await
                                    .unwrap();
                                assert_eq!(
                                    writers.fetch_add(1, Ordering::SeqCst),
                                    0,
                                    "two writers"
                                );
                                assert_eq!(
                                    readers.load(Ordering::SeqCst),
                                    0,
                                    "writer with readers"
                                );
                                tokio::task::yield_now().await;
                                writers.fetch_sub(1, Ordering::SeqCst);
                                guard.release().await.unwrap();
                            } else {
                                let guard = rw
                                    .read()
                                    .wait(Duration::from_secs(20))
                                    .acquire()
                                    .await
                                    .unwrap();
                                let inside = readers.fetch_add(1, Ordering::SeqCst) + 1;
                                max_readers.fetch_max(inside, Ordering::SeqCst);
                                assert_eq!(
                                    writers.load(Ordering::SeqCst),
                                    0,
                                    "reader with a writer"
                                );
                                tokio::time::sleep(Duration::from_millis(1)).await;
                                readers.fetch_sub(1, Ordering::SeqCst);
                                guard.release().await.unwrap();
                            }
                        }
                    }));
                }
                for task in tasks {
                    task.await.unwrap();
                }
                assert!(
                    max_readers.load(Ordering::SeqCst) > 1,
                    "readers never overlapped"
                );
            }

            /// A writer gets in while a steady stream of overlapping readers keeps the read
            /// side busy: waiting writers hold back new readers.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn writer_is_not_starved() {
                let env = $env.await;
                let stop = Arc::new(AtomicBool::new(false));
                let mut readers = Vec::new();
                for t in 0..6 {
                    let client = if t % 2 == 0 {
                        env.a.clone()
                    } else {
                        env.b.clone()
                    };
                    let stop = stop.clone();
                    readers.push(tokio::spawn(async move {
                        while !stop.load(Ordering::SeqCst) {
                            let guard = client
                                .read_write_lock("hot")
                                .read()
                                .wait(Duration::from_secs(20))
                                .acquire()
                                .await
                                .unwrap();
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            guard.release().await.unwrap();
                        }
                    }));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                let writer = env
                    .a
                    .read_write_lock("hot")
                    .write()
                    .wait(Duration::from_secs(5))
                    .acquire()
                    .await;
                stop.store(true, Ordering::SeqCst);
                writer
                    .expect("the writer got in despite the readers")
                    .release()
                    .await
                    .unwrap();
                for reader in readers {
                    reader.await.unwrap();
                }
            }

            /// A writer may take the read side and keep it after releasing the write side
            /// (downgrade); a reader asking for the write side fails at once.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn downgrade_and_refused_upgrade() {
                let env = $env.await;
                let rw = env.a.read_write_lock("dg");
                let h = env.a.holder();
                let write = rw.write().holder(&h).acquire().await.unwrap();
                let read = rw.read().holder(&h).try_acquire().await.unwrap();
                assert!(
                    env.b
                        .read_write_lock("dg")
                        .read()
                        .try_acquire()
                        .await
                        .is_err()
                );
                write.release().await.unwrap();
                // Downgraded: other readers may join, writers may not.
                let other = env
                    .b
                    .read_write_lock("dg")
                    .read()
                    .try_acquire()
                    .await
                    .unwrap();
                assert!(
                    env.b
                        .read_write_lock("dg")
                        .write()
                        .try_acquire()
                        .await
                        .is_err()
                );
                let upgrade = rw
                    .write()
                    .holder(&h)
                    .wait(Duration::from_secs(5))
                    .acquire()
                    .await;
                assert!(
                    matches!(upgrade, Err(LockError::UpgradeRefused)),
                    "{upgrade:?}"
                );
                other.release().await.unwrap();
                read.release().await.unwrap();
                let write = env
                    .b
                    .read_write_lock("dg")
                    .write()
                    .try_acquire()
                    .await
                    .unwrap();
                write.release().await.unwrap();
            }

            /// One reader's lease running out does not cut another reader's short.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn one_reader_expires_alone() {
                let env = $env.await;
                let short = env
                    .a
                    .read_write_lock("exp")
                    .read()
                    .lease(Lease::fixed(Duration::from_millis(200)))
                    .acquire()
                    .await
                    .unwrap();
                let long = env
                    .b
                    .read_write_lock("exp")
                    .read()
                    .lease(Lease::watchdog(Duration::from_millis(300)))
                    .acquire()
                    .await
                    .unwrap();
                tokio::time::timeout(Duration::from_secs(2), short.lost())
                    .await
                    .expect("the short reader's lease ran out");
                tokio::time::sleep(Duration::from_millis(400)).await;
                assert!(!long.is_lost(), "the other reader was cut short");
                assert!(
                    env.a
                        .read_write_lock("exp")
                        .write()
                        .try_acquire()
                        .await
                        .is_err()
                );
                long.release().await.unwrap();
                let write = env
                    .a
                    .read_write_lock("exp")
                    .write()
                    .try_acquire()
                    .await
                    .unwrap();
                write.release().await.unwrap();
                assert!(matches!(short.release().await, Err(LockError::Lost)));
            }

            /// A reader whose process died (its fixed lease ran out, nobody released it) is
            /// still listed when the last live reader releases: that release frees the lock
            /// and wakes the writer waiting for it, long before the live reader's lease would
            /// have run out.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_dead_reader_does_not_hold_back_the_wake_up_of_a_writer() {
                let env = $env.await;
                let short = Duration::from_millis(300);
                read_hold_of_a_dead_process(&env.more, "dead", short);
                let live = env
                    .a
                    .read_write_lock("dead")
                    .read()
                    .lease(Lease::fixed(Duration::from_secs(30)))
                    .acquire()
                    .await
                    .unwrap();
                let b = env.b.clone();
                let writer = tokio::spawn(async move {
                    let rw = b.read_write_lock("dead");
                    rw.write().wait(Duration::from_secs(25)).acquire().await
                });
                support::eventually(Duration::from_secs(5), "the writer is queued", || {
                    env.b.queued() == 1
                })
                .await;
                tokio::time::sleep(short * 2).await;
                live.release().await.unwrap();
                let write = tokio::time::timeout(Duration::from_secs(5), writer)
                    .await
                    .expect("the release woke the writer")
                    .unwrap()
                    .expect("the writer took the lock");
                write.release().await.unwrap();
            }

            /// A reader that died holding the lock outlives the live reader, whose release
            /// then has nobody to wake: the writer waiting for the lock takes it once the dead
            /// reader's lease ends (nothing is published then), not when the live reader's
            /// lease would have.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_writer_gets_in_when_a_dead_readers_lease_ends() {
                let env = $env.await;
                read_hold_of_a_dead_process(&env.more, "outlived", Duration::from_secs(1));
                let live = env
                    .a
                    .read_write_lock("outlived")
                    .read()
                    .lease(Lease::fixed(Duration::from_secs(30)))
                    .acquire()
                    .await
                    .unwrap();
                let b = env.b.clone();
                let writer = tokio::spawn(async move {
                    let rw = b.read_write_lock("outlived");
                    rw.write().wait(Duration::from_secs(25)).acquire().await
                });
                support::eventually(Duration::from_secs(5), "the writer is queued", || {
                    env.b.queued() == 1
                })
                .await;
                live.release().await.unwrap();
                let write = tokio::time::timeout(Duration::from_secs(6), writer)
                    .await
                    .expect("the writer looked again when the dead reader's lease ended")
                    .unwrap()
                    .expect("the writer took the lock");
                write.release().await.unwrap();
            }

            /// Fencing tokens rise from one writer to the next, also when the next one was
            /// already waiting (its place in the queue keeps the lock's state alive between
            /// them).
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn writer_tokens_rise_from_writer_to_waiting_writer() {
                let env = $env.await;
                let rw = env.a.read_write_lock("fenced");
                let first = rw.write().fencing().acquire().await.unwrap();
                let token = first.fencing_token().expect("asked for");
                let b = env.b.clone();
                let next = tokio::spawn(async move {
                    let rw = b.read_write_lock("fenced");
                    let guard = rw.write().fencing().acquire().await.unwrap();
                    let token = guard.fencing_token();
                    guard.release().await.unwrap();
                    token
                });
                support::eventually(Duration::from_secs(5), "the writer is queued", || {
                    env.b.queued() == 1
                })
                .await;
                first.release().await.unwrap();
                let next = next.await.unwrap().expect("asked for");
                assert!(
                    next > token,
                    "the next writer's token {next} is not above {token}"
                );
            }
        }
    };
}

fn builder<B: Backend>(backend: B) -> LockClient<B> {
    LockClient::builder(backend).waiter_timeout(Duration::from_millis(500)).build().unwrap()
}

fair_rw_semantics!(memory, support::stores::in_memory(builder));

fair_rw_semantics!(redis, support::stores::on_redis(builder));
