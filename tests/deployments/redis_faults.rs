//! Redis-only behaviour under faults: a lock key deleted behind the holder's back, `SCRIPT FLUSH`
//! under load (every 10 ms, and back to back as a storm that widens the reload race), foreign
//! data at the lock key, a server killed, restarted or paused. Every test starts its own
//! `redis-server` through the fixture in `tests/support`.

use crate::support;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use support::RedisServer;
use tokio::time::{Instant, timeout};
use tower_lock::{Lease, LockClient, LockError, RedisBackend, error::BackendErrorKind};

/// Scheduling slack allowed past a local deadline before `lost()` counts as late.
const TOLERANCE: Duration = Duration::from_millis(100);

/// A client with its own connections to `url`, using `prefix`.
async fn client(url: &str, prefix: &str) -> LockClient<RedisBackend> {
    let backend = support::redis_backend(url).connect().await.expect("connect");
    LockClient::builder(backend).prefix(prefix).build().expect("valid configuration")
}

/// The record at `key` (an owner record names its grant), for failure messages.
fn record(server: &RedisServer, key: &str) -> String {
    format!("{:?}", server.cmd(&["GET", key]))
}

/// Asserts that `client` cannot take `key` right now: `try_acquire` answers `WaitTimeout`.
async fn assert_busy(client: &LockClient<RedisBackend>, key: &str, why: &str) {
    match client.lock(key).try_acquire().await {
        Err(LockError::WaitTimeout { .. }) => {}
        Ok(guard) => panic!("{why}: the lock was free, got {guard:?}"),
        Err(error) => panic!("{why}: unexpected error {error:?}"),
    }
}

/// Sets its flag when dropped, so a background loop ends even when the test panics (the
/// runtime waits for blocking tasks at shutdown).
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Sends `SCRIPT FLUSH` from a blocking thread (the fixture speaks synchronous RESP).
async fn script_flush(server: &Arc<RedisServer>) {
    let server = server.clone();
    let reply = tokio::task::spawn_blocking(move || server.cmd(&["SCRIPT", "FLUSH"]))
        .await
        .expect("flush task");
    assert_eq!(reply.as_str().as_deref(), Some("OK"));
}

/// Deleting the lock key behind the holder's back is noticed by the next renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_detected_when_key_deleted() {
    let server = RedisServer::start();
    let a = client(&server.url(), "t5:").await;
    let b = client(&server.url(), "t5:").await;
    let lease = Duration::from_millis(600);
    let guard = a.lock("k").lease(Lease::watchdog(lease)).acquire().await;
    let guard = guard.expect("acquire");
    let name = guard.key().as_str().to_owned();
    assert_eq!(name, "t5:{k}");

    assert_eq!(server.cmd(&["DEL", &name]).as_int(), 1);
    let deleted_at = Instant::now();
    timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("lost() resolves once the key is gone");
    let noticed = deleted_at.elapsed();
    println!("lost detected {noticed:?} after the DEL (renewal every {:?})", lease / 3);
    assert!(guard.is_lost());
    assert!(guard.remaining() > Duration::ZERO, "detected by a renewal, before the local deadline");
    assert!(noticed < lease, "noticed only after {noticed:?}");

    // The lost guard's release does not touch the next owner's lock.
    let theirs = b.lock("k").try_acquire().await.expect("the key is free");
    let released = guard.release().await;
    assert!(matches!(released, Err(LockError::Lost)), "{released:?}");
    assert!(!theirs.is_lost());
    assert_busy(&a, "k", "the next owner keeps the lock").await;
    theirs.release().await.expect("release");
}

/// 300+ acquire/release cycles while `SCRIPT FLUSH` runs every 10 ms: no caller sees an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn script_flush_under_load() {
    let server = Arc::new(RedisServer::start());
    let a = client(&server.url(), "t14:").await;
    let stop = StopOnDrop(Arc::new(AtomicBool::new(false)));
    let flushes = Arc::new(AtomicU64::new(0));
    let flusher = {
        let (server, stop, flushes) = (server.clone(), stop.0.clone(), flushes.clone());
        tokio::task::spawn_blocking(move || {
            while !stop.load(Ordering::SeqCst) {
                let reply = server.cmd(&["SCRIPT", "FLUSH"]);
                assert_eq!(reply.as_str().as_deref(), Some("OK"));
                flushes.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let started = Instant::now();
    let mut cycles = 0;
    let mut error = None;
    // At least 300 cycles, and at least 20 flushes in between them; stop at the first error.
    while error.is_none() && (cycles < 300 || flushes.load(Ordering::SeqCst) < 20) {
        assert!(started.elapsed() < Duration::from_secs(20), "the flusher stalled");
        match a.lock("hot").wait(Duration::from_secs(2)).acquire().await {
            Ok(guard) => {
                if let Err(e) = guard.release().await {
                    error = Some(format!("release: {e}"));
                }
            }
            Err(e) => error = Some(format!("acquire: {e}")),
        }
        cycles += 1;
    }
    drop(stop);
    flusher.await.expect("flusher");
    println!(
        "SCRIPT FLUSH under load: cycles={cycles} flushes={} in {:?}",
        flushes.load(Ordering::SeqCst),
        started.elapsed()
    );
    if let Some(error) = error {
        panic!("cycle {cycles} failed while scripts were being flushed: {error}");
    }
}

/// A watchdog lock (300 ms lease) stays held across repeated `SCRIPT FLUSH`es.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn held_lock_survives_script_flush() {
    let server = Arc::new(RedisServer::start());
    let a = client(&server.url(), "t14b:").await;
    let b = client(&server.url(), "t14b:").await;
    let lease = Duration::from_millis(300);
    let guard = a.lock("k").lease(Lease::watchdog(lease)).acquire().await;
    let guard = guard.expect("acquire");
    let held_since = Instant::now();
    while held_since.elapsed() < Duration::from_secs(1) {
        script_flush(&server).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!guard.is_lost(), "renewals reload the flushed script");
    assert_busy(&b, "k", "still held after the flushes").await;
    let name = guard.key().as_str().to_owned();
    let pttl = server.cmd(&["PTTL", &name]).as_int();
    assert!(pttl > 0, "the lease is still running in Redis: PTTL {pttl}");
    script_flush(&server).await;
    guard.release().await.expect("release reloads its script too");
    let next = b.lock("k").try_acquire().await.expect("free after the release");
    next.release().await.expect("release");
}

/// Runs `SCRIPT FLUSH` back to back from two threads until the returned guard is dropped;
/// the handle counts the flushes.
fn flush_storm(server: &Arc<RedisServer>) -> (StopOnDrop, Vec<tokio::task::JoinHandle<u64>>) {
    let stop = StopOnDrop(Arc::new(AtomicBool::new(false)));
    let flushers = (0..2)
        .map(|_| {
            let (server, stop) = (server.clone(), stop.0.clone());
            tokio::task::spawn_blocking(move || {
                let mut flushes = 0;
                while !stop.load(Ordering::SeqCst) {
                    server.cmd(&["SCRIPT", "FLUSH"]);
                    flushes += 1;
                }
                flushes
            })
        })
        .collect();
    (stop, flushers)
}

/// Stops a flush storm and returns how many flushes it made.
async fn end_storm(storm: (StopOnDrop, Vec<tokio::task::JoinHandle<u64>>)) -> u64 {
    let (stop, flushers) = storm;
    drop(stop);
    let mut flushes = 0;
    for flusher in flushers {
        flushes += flusher.await.expect("flusher");
    }
    flushes
}

/// 20 watchdog locks (600 ms lease, renewed every 200 ms) stay held through 1 s of back-to-back
/// `SCRIPT FLUSH`es: a renewal that meets `NOSCRIPT` is retried, never taken for another owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn held_locks_survive_flush_storm() {
    let server = Arc::new(RedisServer::start());
    let a = client(&server.url(), "t14c:").await;
    let b = client(&server.url(), "t14c:").await;
    let lease = Lease::watchdog(Duration::from_millis(600));
    let mut guards = Vec::new();
    for i in 0..20 {
        let guard = a.lock(format!("k{i}")).lease(lease).acquire().await;
        guards.push(guard.expect("acquire"));
    }
    let storm = flush_storm(&server);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let flushes = end_storm(storm).await;
    let lost: Vec<String> = guards
        .iter()
        .filter(|guard| guard.is_lost())
        .map(|guard| guard.key().to_string())
        .collect();
    println!("flush storm: {flushes} flushes, {} of {} held locks lost", lost.len(), guards.len());
    assert!(lost.is_empty(), "held locks lost during SCRIPT FLUSHes: {lost:?}");
    for i in 0..20 {
        assert_busy(&b, &format!("k{i}"), "still held after the storm").await;
    }
    for guard in guards {
        guard.release().await.expect("release");
    }
}

/// Acquire/release cycles through 1 s of back-to-back `SCRIPT FLUSH`es: no caller sees an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acquire_release_survive_flush_storm() {
    let server = Arc::new(RedisServer::start());
    let a = client(&server.url(), "t14d:").await;
    let storm = flush_storm(&server);
    let started = Instant::now();
    let mut cycles = 0;
    let mut errors = Vec::new();
    while started.elapsed() < Duration::from_secs(1) {
        match a.lock("hot").wait(Duration::from_secs(2)).acquire().await {
            Ok(guard) => {
                if let Err(error) = guard.release().await {
                    errors.push(format!("release: {error}"));
                    // The lock is left to its lease: go on with another key.
                    break;
                }
            }
            Err(error) => errors.push(format!("acquire: {error}")),
        }
        cycles += 1;
    }
    let flushes = end_storm(storm).await;
    println!("flush storm: {cycles} cycles, {flushes} flushes, {} errors", errors.len());
    assert!(errors.is_empty(), "errors seen by callers: {errors:?}");
}

/// A string at the lock key gives a typed wrong-type error naming `string`, and stays intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wrong_type_is_reported_not_overwritten() {
    let server = RedisServer::start();
    let a = client(&server.url(), "t:").await;
    assert_eq!(server.cmd(&["SET", "t:{order:1}", "x"]).as_str().as_deref(), Some("OK"));
    for wait in [Duration::ZERO, Duration::from_secs(2)] {
        let started = Instant::now();
        let outcome = a.lock("order:1").wait(wait).acquire().await;
        let elapsed = started.elapsed();
        let error = outcome.expect_err("a string is not a lock");
        let LockError::Backend(backend) = &error else {
            panic!("expected a backend error, got {error:?}");
        };
        println!("wrong type (wait {wait:?}): {error}");
        assert!(backend.is_wrong_type(), "{backend:?}");
        assert!(
            matches!(backend.kind(), BackendErrorKind::WrongType { found } if found == "string"),
            "{backend:?}"
        );
        assert!(error.to_string().contains("string"), "{error}");
        assert_eq!(backend.key(), Some("t:{order:1}"));
        assert!(elapsed < Duration::from_secs(1), "no waiting on a foreign key: {elapsed:?}");
    }
    assert_eq!(server.cmd(&["GET", "t:{order:1}"]).as_str().as_deref(), Some("x"));
    assert_eq!(server.cmd(&["PTTL", "t:{order:1}"]).as_int(), -1);
}

/// With the server killed, acquires fail with a backend error within their wait, and a held
/// guard reports itself lost by its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_server_fails_fast() {
    let mut server = RedisServer::start();
    let a = client(&server.url(), "t16:").await;
    let warm = a.lock("k").acquire().await.expect("acquire");
    warm.release().await.expect("release");
    let lease = Duration::from_millis(600);
    let held = a.lock("held").lease(Lease::watchdog(lease));
    let held = held.acquire().await.expect("acquire");

    let lost = held.lost();
    let lost_at = tokio::spawn(async move {
        lost.await;
        Instant::now()
    });

    server.kill();
    let killed_at = Instant::now();
    for attempt in 1..=3 {
        let started = Instant::now();
        let outcome =
            timeout(Duration::from_secs(5), a.lock("k").wait(Duration::from_secs(1)).acquire())
                .await
                .expect("an acquire against a dead server must not hang");
        let elapsed = started.elapsed();
        let error = outcome.expect_err("the server is dead");
        println!("attempt {attempt} after the kill: {error} in {elapsed:?}");
        assert!(matches!(error, LockError::Backend(_)), "{error:?}");
        assert!(elapsed < Duration::from_secs(3), "failed only after {elapsed:?}");
    }
    let lost_at = timeout(Duration::from_secs(2), lost_at)
        .await
        .expect("the held guard is lost once its deadline passes without renewal")
        .expect("lost task");
    let lost_after = lost_at.saturating_duration_since(killed_at);
    println!("held guard (lease {lease:?}) lost {lost_after:?} after the kill");
    assert!(held.is_lost());
    // Every renewal that succeeded was sent before the kill, so the local deadline is at most
    // one lease after it: lost() must fire by then, whatever the renewal in flight does.
    assert!(
        lost_after < lease + TOLERANCE,
        "lost() fired {lost_after:?} after the kill, past the {lease:?} lease"
    );
}

/// After a restart on the same port the same client works again, and a waiter is not stranded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restarted_server_recovers() {
    let mut server = RedisServer::start();
    let a = client(&server.url(), "t17:").await;
    let b = client(&server.url(), "t17:").await;
    let guard = a.lock("k").acquire().await.expect("acquire");
    guard.release().await.expect("release");

    // B waits, across the restart, for a lock A holds with a 30 s lease.
    let held = a.lock("w").lease(Lease::watchdog(Duration::from_secs(30)));
    let held = held.acquire().await.expect("acquire");
    let channel = format!("{}:released", held.key().as_str());
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move {
            let acquired = b.lock("w").wait(Duration::from_secs(10)).acquire().await;
            (Instant::now(), acquired)
        })
    };
    support::eventually(Duration::from_secs(2), "B waits", || {
        b.waiters() == 1 && support::numsub(&server, &channel) == 1
    })
    .await;

    server.restart();
    let restarted_at = Instant::now();
    let mut attempts = 0;
    let mut errors = Vec::new();
    loop {
        attempts += 1;
        match a.lock("k").try_acquire().await {
            Ok(guard) => match guard.release().await {
                Ok(()) => break,
                Err(error) => errors.push(format!("release: {error}")),
            },
            Err(error) => errors.push(format!("acquire: {error}")),
        }
        assert!(
            restarted_at.elapsed() < Duration::from_secs(3),
            "no successful acquire + release within 3 s of the restart: {errors:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "restart: acquire + release works again after {attempts} attempts, {:?}; errors: {errors:?}",
        restarted_at.elapsed()
    );

    let (ended_at, acquired) = timeout(Duration::from_secs(12), waiter)
        .await
        .expect("the waiter ends within its wait")
        .expect("waiter task");
    let waited = ended_at - restarted_at;
    println!("restart: the waiter ended {waited:?} after the restart with {acquired:?}");
    assert!(waited < Duration::from_secs(5), "the waiter was stranded for {waited:?}");
    match acquired {
        Ok(guard) => guard.release().await.expect("release"),
        Err(LockError::Backend(_)) => {}
        Err(error) => panic!("the waiter ended with {error:?}"),
    }
    support::eventually(Duration::from_secs(3), "B's pub/sub reconnects", || {
        b.backend().pubsub_reconnects() >= 1
    })
    .await;
    drop(held);
}

/// A holder whose renewals hang on a paused server hears `lost()` at its local deadline, before
/// Redis expires the lock, and the lock is free once the server resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paused_server_holder_lost_at_deadline() {
    let server = RedisServer::start();
    let a = client(&server.url(), "t10:").await;
    let b = client(&server.url(), "t10:").await;
    let lease = Duration::from_millis(300);
    let held = a.lock("k").lease(Lease::watchdog(lease)).acquire().await;
    let held = held.expect("acquire");
    let lost = held.lost();
    let lost_at = tokio::spawn(async move {
        lost.await;
        Instant::now()
    });

    server.pause();
    let paused_at = Instant::now();
    let lost_at = timeout(Duration::from_secs(3), lost_at).await;
    tokio::time::sleep_until(paused_at + 2 * lease).await;
    server.resume();
    let lost_at = lost_at.expect("lost() fires while the server is paused").expect("lost task");
    let lost_after = lost_at.saturating_duration_since(paused_at);
    println!("paused server: holder (lease {lease:?}) lost {lost_after:?} after the pause");
    assert!(held.is_lost());
    // Every renewal that succeeded was sent before the pause, so the local deadline is at most
    // one lease after it: lost() must fire by then, not when a hanging renewal gives up.
    assert!(
        lost_after < lease + TOLERANCE,
        "lost() fired {lost_after:?} after the pause, past the {lease:?} lease"
    );

    // The lease ran out in Redis during the pause: the lock is free after resume.
    let next = b.lock("k").wait(Duration::from_secs(2)).acquire().await;
    next.expect("free after resume").release().await.expect("release");
    let released = held.release().await;
    assert!(matches!(released, Err(LockError::Lost)), "{released:?}");
}

/// An acquire that times out against a paused server is undone: no orphan lock after resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paused_server_times_out_and_undoes_attempt() {
    let server = RedisServer::start();
    let backend = support::redis_backend(server.url())
        .command_timeout(Duration::from_millis(200))
        .connect()
        .await
        .expect("connect");
    let a = LockClient::builder(backend).prefix("t18:").build();
    let a = a.expect("valid configuration");
    let b = client(&server.url(), "t18:").await;
    // Load the scripts, so the acquire sent to the paused server really runs once it resumes.
    let warm = a.lock("warm").acquire().await.expect("acquire");
    warm.release().await.expect("release");

    server.pause();
    let paused_at = Instant::now();
    let outcome = a
        .lock("k")
        .lease(Lease::watchdog(Duration::from_secs(30)))
        .wait(Duration::from_secs(1))
        .acquire()
        .await;
    let elapsed = paused_at.elapsed();
    tokio::time::sleep_until(paused_at + Duration::from_millis(1500)).await;
    server.resume();
    let resumed_at = Instant::now();

    let error = outcome.expect_err("the server is paused");
    println!("paused server: {error} after {elapsed:?}");
    let LockError::Backend(backend) = &error else {
        panic!("expected a backend error, got {error:?}");
    };
    // The last try met the pause: no reply, or no connection, in time.
    assert!(backend.is_timeout() || backend.is_unavailable(), "{backend:?}");
    assert!(elapsed < Duration::from_secs(1), "failed only after {elapsed:?}");

    // Whatever the paused server runs once resumed, the lock must not stay held by nobody.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let deadline = resumed_at + Duration::from_secs(2);
    while server.cmd(&["EXISTS", "t18:{k}"]).as_int() != 0 {
        assert!(
            Instant::now() < deadline,
            "orphan lock 2 s after resume: {} with PTTL {} ms; server errors: {}",
            record(&server, "t18:{k}"),
            server.cmd(&["PTTL", "t18:{k}"]).as_int(),
            server.cmd(&["INFO", "errorstats"]).as_str().unwrap_or_default().replace("\r\n", " ")
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!("paused server: lock key gone {:?} after resume", resumed_at.elapsed());
    let next = b.lock("k").try_acquire().await.expect("the key is free");
    next.release().await.expect("release");
}

/// Two waiters start while the store is held in a 4 s `CLIENT PAUSE`: their first attempts
/// time out (1 s command timeout) on live connections, and they try again within their 30 s
/// waits instead of failing with `Timeout`. Once the pause ends and the holder releases, both
/// acquire, one after the other. As Redisson's `testAcquireFailedNotCalledOnRedisTimeout`,
/// for the fair lock and the plain one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiters_ride_out_a_client_pause() {
    for fair in [true, false] {
        ride_out_a_client_pause(fair).await;
    }
}

async fn ride_out_a_client_pause(fair: bool) {
    let server = Arc::new(RedisServer::start());
    let prefix = if fair { "t19f:" } else { "t19p:" };
    let holder = client(&server.url(), prefix).await;
    let waiters = client(&server.url(), prefix).await;
    let held = match fair {
        true => holder.fair_lock("k").acquire().await,
        false => holder.lock("k").acquire().await,
    };
    let held = held.expect("acquire");
    let paused = server.clone();
    let reply = tokio::task::spawn_blocking(move || paused.cmd(&["CLIENT", "PAUSE", "4000"]))
        .await
        .expect("pause");
    assert_eq!(reply.as_str().as_deref(), Some("OK"));
    let paused_at = Instant::now();
    let tasks: Vec<_> = (0..2)
        .map(|_| {
            let waiters = waiters.clone();
            tokio::spawn(async move {
                let request = match fair {
                    true => waiters.fair_lock("k"),
                    false => waiters.lock("k"),
                };
                let guard = request.wait(Duration::from_secs(30)).acquire().await;
                let at = Instant::now();
                let acquired = match guard {
                    Ok(guard) => {
                        guard.release().await.map_err(|error| format!("release: {error:?}"))
                    }
                    Err(error) => Err(format!("{error:?}")),
                };
                (acquired, at)
            })
        })
        .collect();
    // The holder lets go once the waiters are waiting. Its release meets the pause too: it is
    // retried in the background until it is applied (its error here says only that).
    support::eventually(Duration::from_secs(10), "both wait", || waiters.waiters() == 2).await;
    if let Err(error) = held.release().await {
        println!("fair {fair}: release during the pause: {error} (retried in the background)");
    }
    for task in tasks {
        let (acquired, at) = task.await.expect("waiter task");
        println!(
            "fair {fair}: waiter {:?} {:?} after the pause began",
            acquired.as_ref().map(|()| "acquired"),
            at - paused_at
        );
        acquired.unwrap_or_else(|error| {
            panic!("fair {fair}: a waiter failed with {error} with wait left")
        });
    }
}
