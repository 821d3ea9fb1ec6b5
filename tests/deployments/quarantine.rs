//! A lock store that restarts while a lock is held, without persistence or from a snapshot or
//! an append-only file that missed the last grants, grants nothing new until every lease it may
//! have forgotten has run out (its quarantine), on one node and as a Redlock node; with the
//! quarantine off, the same runs show the double grant it prevents.
//!
//! The checker is the holders' own view: a second holder may be granted only once the first
//! holder's guard reports the lock lost (its deadline passed). Leases are fixed, so the first
//! holder never renews and learns of the restart only at its deadline: exactly the holder a
//! restart endangers, one inside a long critical section.

use crate::support;

use std::time::Duration;

use support::{RedisServer, RespValue};
use tokio::time::Instant;
use tower_lock::{Lease, LockClient, LockError, LockGuard, RedisBackend, RedlockBackend};

/// The lease of every lock here, and the quarantine that covers it.
const LEASE: Duration = Duration::from_millis(2500);
/// The store key of the lock "account".
const ACCOUNT: &str = "tower-lock:{account}";
/// Scheduling slack past a computed bound.
const SLACK: Duration = Duration::from_millis(700);

/// How a client reaches the node: through connections the backend opens itself, or through
/// an application's bb8 pool.
#[derive(Clone, Copy, Debug)]
enum Via {
    Connect,
    Pool,
}

async fn node_client(
    server: &RedisServer,
    via: Via,
    quarantine: Duration,
) -> LockClient<RedisBackend> {
    use tower_lock::backend::redis::{bb8, bb8_redis::RedisConnectionManager};

    let backend = match via {
        Via::Connect => RedisBackend::builder(server.url())
            .quarantine(quarantine)
            .connect()
            .await
            .expect("connect"),
        Via::Pool => {
            let manager = RedisConnectionManager::new(server.url()).expect("manager");
            let pool = bb8::Pool::builder().build(manager).await.expect("pool");
            RedisBackend::builder(server.url())
                .pool(pool)
                .quarantine(quarantine)
                .connect()
                .await
                .expect("connect through the application's pool")
        }
    };
    LockClient::builder(backend).lease(Lease::fixed(LEASE)).build().expect("valid configuration")
}

/// What happened to the waiter: when it was granted, and whether the first holder still
/// believed it held the lock at that moment.
struct Outcome {
    granted_after_restart: Duration,
    double_grant: bool,
}

/// What the restarted server comes back with.
#[derive(Clone, Copy, Debug)]
enum Restart {
    /// Nothing: persistence is off.
    Empty,
    /// The RDB snapshot taken (`SAVE`) after the first grants, before A's.
    Snapshot,
    /// The append-only file as it was before A's grant, as after a power loss with
    /// `appendfsync everysec`: the file is cut back to that length while the server is down
    /// (the server writes with `appendfsync always`, so the cut falls between two commands).
    AofMissingLastWrites,
}

impl Restart {
    fn server(self) -> RedisServer {
        match self {
            Self::Empty | Self::Snapshot => RedisServer::start(),
            Self::AofMissingLastWrites => {
                RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"])
            }
        }
    }
}

/// The append-only file Redis 7 writes commands to (`appendonlydir/*.incr.aof`).
fn incr_aof(server: &RedisServer) -> std::path::PathBuf {
    let dir = server.dir().join("appendonlydir");
    std::fs::read_dir(&dir)
        .expect("appendonlydir")
        .map(|entry| entry.expect("dir entry").path())
        .find(|path| path.to_string_lossy().ends_with(".incr.aof"))
        .expect("an incremental append-only file")
}

/// A holds `key` with a fixed lease; B waits for it; the server restarts at once, keeping what
/// `restart` says.
async fn single_node_restart(via: Via, quarantine: Duration, restart: Restart) -> Outcome {
    let mut server = restart.server();
    let a = node_client(&server, via, quarantine).await;
    let b = node_client(&server, via, quarantine).await;
    // A fresh server is itself in quarantine: A waits it out, and the store now knows this
    // server run has been up for a whole quarantine.
    a.lock("earlier")
        .wait(quarantine + LEASE)
        .acquire()
        .await
        .expect("A acquires once the new server's quarantine is over")
        .release()
        .await
        .expect("release");
    // A key that the restarted server must come back with (not with an empty store).
    server.cmd(&["SET", "kept", "1"]);
    let mut aof_kept = None;
    match restart {
        Restart::Empty => {}
        Restart::Snapshot => assert_eq!(server.cmd(&["SAVE"]).as_str().as_deref(), Some("OK")),
        Restart::AofMissingLastWrites => {
            let file = incr_aof(&server);
            let kept = std::fs::metadata(&file).expect("aof").len();
            aof_kept = Some((file, kept));
        }
    }
    let held = a.lock("account").wait(LEASE).acquire().await.expect("A acquires a free lock");
    let waiter = tokio::spawn({
        let b = b.clone();
        async move {
            let guard =
                b.lock("account").wait(LEASE * 4).acquire().await.expect("B acquires in the end");
            (Instant::now(), guard)
        }
    });
    // B is queued on A's hold before the restart (it listens for the release).
    let deadline = Instant::now() + Duration::from_secs(2);
    while b.waiters() == 0 {
        assert!(Instant::now() < deadline, "B did not queue behind A");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(!waiter.is_finished(), "B waits while A holds");
    assert_eq!(server.cmd(&["EXISTS", ACCOUNT]), RespValue::Int(1), "A's lock key");
    let restarted = Instant::now();
    server.kill();
    if let Some((file, kept)) = aof_kept {
        let aof = std::fs::OpenOptions::new().write(true).open(&file).expect("open the aof");
        let len = aof.metadata().expect("aof").len();
        assert!(len > kept, "A's grant is in the aof ({file:?}: {len} bytes, {kept} before)");
        aof.set_len(kept).expect("cut the aof back");
    }
    server.restart();
    let kept = !matches!(restart, Restart::Empty);
    assert_eq!(
        server.cmd(&["EXISTS", "kept"]),
        RespValue::Int(kept.into()),
        "{restart:?}: the server came back with the data before A's grant"
    );
    assert_eq!(
        server.cmd(&["EXISTS", ACCOUNT]),
        RespValue::Int(0),
        "{restart:?}: the server came back without A's grant"
    );
    let (granted, guard) = waiter.await.expect("waiter task");
    let outcome =
        Outcome { granted_after_restart: granted - restarted, double_grant: !held.is_lost() };
    drop((held, guard));
    outcome
}

/// With the quarantine on, B is granted only after A's deadline, and no later than the
/// quarantine plus slack after the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_grants_nothing_while_a_forgotten_lease_runs() {
    for via in [Via::Connect, Via::Pool] {
        restarted_node_grants_nothing(via, Restart::Empty).await;
    }
}

/// The same after a restart from a snapshot, or from an append-only file, that has the first
/// grants but not A's: the store knew the earlier server run, not this one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_from_older_data_grants_nothing_while_a_forgotten_lease_runs() {
    for restart in [Restart::Snapshot, Restart::AofMissingLastWrites] {
        for via in [Via::Connect, Via::Pool] {
            restarted_node_grants_nothing(via, restart).await;
        }
    }
}

async fn restarted_node_grants_nothing(via: Via, restart: Restart) {
    let outcome = single_node_restart(via, LEASE, restart).await;
    assert!(
        !outcome.double_grant,
        "{via:?}, {restart:?}: B was granted {:?} after the restart while A's lease ran",
        outcome.granted_after_restart
    );
    // Whole seconds of uptime: the quarantine may end up to two seconds late.
    assert!(
        outcome.granted_after_restart <= LEASE + Duration::from_secs(2) + SLACK,
        "{via:?}, {restart:?}: B waited {:?} after the restart (quarantine {LEASE:?})",
        outcome.granted_after_restart
    );
}

/// Negative control: without the quarantine, the same restart grants the lock twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_quarantine_a_restarted_node_grants_twice() {
    for via in [Via::Connect, Via::Pool] {
        let outcome = single_node_restart(via, Duration::ZERO, Restart::Empty).await;
        assert!(
            outcome.double_grant,
            "{via:?}: B was granted {:?} after the restart, after A's lease: the control found \
             nothing",
            outcome.granted_after_restart
        );
    }
}

/// A Redlock client of five nodes with the given quarantine.
fn redlock_client(servers: &[RedisServer], quarantine: Duration) -> LockClient<RedlockBackend> {
    let backend = RedlockBackend::builder(servers.iter().map(RedisServer::url))
        .node_timeout(Duration::from_millis(200))
        .quarantine(quarantine)
        .build()
        .expect("valid Redlock configuration");
    LockClient::builder(backend).lease(Lease::fixed(LEASE)).build().expect("valid configuration")
}

/// A holds on exactly nodes 0–2 (3 and 4 are down when it acquires, then come back empty);
/// node 2 is restarted empty at once; B then tries for the lock until A's lease is over.
async fn redlock_restart(quarantine: Duration) -> (Option<Duration>, bool) {
    let mut servers: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    let a = redlock_client(&servers, quarantine);
    let b = redlock_client(&servers, quarantine);
    servers[3].kill();
    servers[4].kill();
    let held: LockGuard<_> = a
        .lock("order")
        .wait(LEASE + Duration::from_secs(2))
        .acquire()
        .await
        .expect("A wins nodes 0, 1 and 2");
    servers[3].restart();
    servers[4].restart();
    servers[2].restart();
    let restarted = Instant::now();
    // B tries until well past A's lease: any grant while A's guard is not lost is a double grant.
    let taken = b.lock("order").wait(LEASE * 3).acquire().await;
    let double_grant = taken.is_ok() && !held.is_lost();
    let after = taken.is_ok().then(|| restarted.elapsed());
    (after, double_grant)
}

/// With the quarantine on, the restarted node votes "held" until A's lease is over: B never
/// holds a majority while A does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_redlock_node_lends_no_majority_while_a_forgotten_lease_runs() {
    let (granted_after, double_grant) = redlock_restart(LEASE).await;
    assert!(
        !double_grant,
        "B won a majority {granted_after:?} after node 2 restarted, while A held"
    );
    let granted_after = granted_after.expect("B acquires once A's lease is over");
    assert!(
        granted_after <= LEASE + Duration::from_secs(2) + SLACK,
        "B waited {granted_after:?} after the restart (quarantine {LEASE:?})"
    );
}

/// Negative control: without the quarantine, B wins nodes 2, 3 and 4 while A holds 0, 1, 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_quarantine_a_restarted_redlock_node_grants_twice() {
    let (granted_after, double_grant) = redlock_restart(Duration::ZERO).await;
    assert!(
        double_grant,
        "B was granted {granted_after:?} after the restart, not while A held: the control found nothing"
    );
}

/// The quarantine an acquire is refused with, and how long it has left.
fn quarantine_left(result: Result<LockGuard<RedisBackend>, LockError>) -> Duration {
    match result {
        Err(LockError::Backend(error))
            if *error.kind() == tower_lock::error::BackendErrorKind::Quarantined =>
        {
            error.retry_after().expect("the quarantine says when it ends")
        }
        other => panic!("not refused for the quarantine: {other:?}"),
    }
}

/// By default the quarantine is the default lease (5 s), counted from the server's start: a
/// server started just now is refused for about that long, whatever shorter lease the client
/// asks for. A configured quarantine shorter than a lease the client asks for is stretched to
/// that lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quarantine_is_the_default_lease_and_no_shorter_than_a_lease_in_use() {
    let server = RedisServer::start();
    let backend = RedisBackend::connect(&server.url()).await.expect("connect");
    let locks = LockClient::builder(backend)
        .lease(Lease::fixed(Duration::from_millis(1500)))
        .build()
        .expect("valid configuration");
    let left = quarantine_left(locks.lock("first").try_acquire().await);
    let default = Lease::DEFAULT.duration();
    // The server started moments ago (a busy machine may take seconds to get here); the
    // quarantine counts from the end of the second it started in.
    assert!(
        left <= default + Duration::from_secs(1) && !left.is_zero(),
        "{left:?} left of a default quarantine of {default:?}"
    );

    let lease = Duration::from_secs(10);
    let backend = RedisBackend::builder(server.url())
        .quarantine(Duration::from_secs(1))
        .connect()
        .await
        .expect("connect");
    let locks = LockClient::builder(backend)
        .lease(Lease::fixed(lease))
        .build()
        .expect("valid configuration");
    let left = quarantine_left(locks.lock("first").try_acquire().await);
    assert!(
        left > Duration::from_secs(1) && left <= lease + Duration::from_secs(1),
        "{left:?} left of a 1 s quarantine stretched to the 10 s lease"
    );
}

/// The server's `run_id`, from `INFO server`.
fn run_id(server: &RedisServer) -> String {
    let info = server.info("server").expect("INFO server");
    info.lines()
        .find_map(|line| line.strip_prefix("run_id:"))
        .expect("run_id in INFO server")
        .trim()
        .to_owned()
}

/// The run marker of the default prefix: the run id of a server run whose quarantine is over,
/// or `<run id> <origin ms>` while one runs.
const RUN_MARKER: &str = "tower-lock:{}:run";

/// Through an application's pool, the acquire scripts read the server's run themselves: once
/// its quarantine is over the run marker holds the run id, and a save (the same run) holds
/// back no acquire and leaves the marker as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_save_holds_back_no_acquire_through_a_pool() {
    let server = RedisServer::start();
    let locks = node_client(&server, Via::Pool, LEASE).await;
    locks
        .lock("first")
        .wait(LEASE * 3)
        .acquire()
        .await
        .expect("granted once the new server's quarantine is over")
        .release()
        .await
        .expect("release");
    let run = run_id(&server);
    let marker = server.cmd(&["GET", RUN_MARKER]).as_str().unwrap_or_default();
    assert!(
        marker.starts_with(&format!("{run} ")),
        "the marker names the server's run and its origin: {marker}"
    );
    for round in 0..2 {
        assert_eq!(server.cmd(&["SAVE"]).as_str().as_deref(), Some("OK"));
        locks
            .lock("after-save")
            .try_acquire()
            .await
            .unwrap_or_else(|error| panic!("round {round}: refused right after a save: {error}"))
            .release()
            .await
            .expect("release");
        assert_eq!(
            server.cmd(&["GET", RUN_MARKER]).as_str(),
            Some(marker.clone()),
            "round {round}: a save is the same run"
        );
    }
}

/// Every acquire script checks the server's run through an application's pool: after a
/// restart from a snapshot that has the run marker of the run before, a free fair, read,
/// write or semaphore lock is refused for the rest of the new run's quarantine, then granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_lock_kind_waits_out_a_restart_from_a_snapshot_through_a_pool() {
    let mut server = RedisServer::start();
    let locks = node_client(&server, Via::Pool, LEASE).await;
    locks
        .lock("first")
        .wait(LEASE * 3)
        .acquire()
        .await
        .expect("granted once the new server's quarantine is over")
        .release()
        .await
        .expect("release");
    assert_eq!(server.cmd(&["SAVE"]).as_str().as_deref(), Some("OK"));
    server.restart();
    assert!(
        server.cmd(&["EXISTS", RUN_MARKER]) == RespValue::Int(1),
        "the snapshot kept the run marker"
    );
    let kinds = [
        ("fair", locks.fair_lock("fair")),
        ("read", locks.read_write_lock("rw").read()),
        ("write", locks.read_write_lock("rw").write()),
        ("semaphore", locks.semaphore("sem", 3)),
    ];
    for (kind, request) in kinds {
        match request.try_acquire().await {
            Err(LockError::Backend(error))
                if *error.kind() == tower_lock::error::BackendErrorKind::Quarantined =>
            {
                let left = error.retry_after();
                // From the end of the second the server started in: up to a second more.
                let most = LEASE + Duration::from_secs(1);
                assert!(
                    left.is_some_and(|left| left > Duration::ZERO && left <= most),
                    "{kind}: refused with {left:?} left of a quarantine of {LEASE:?}"
                )
            }
            other => panic!("{kind}: granted right after the restart: {other:?}"),
        }
    }
    // Once the quarantine is over, each is granted.
    for kind in ["fair", "read", "semaphore"] {
        let request = match kind {
            "fair" => locks.fair_lock("fair"),
            "read" => locks.read_write_lock("rw").read(),
            _ => locks.semaphore("sem", 3),
        };
        request
            .wait(LEASE + Duration::from_secs(2) + SLACK)
            .acquire()
            .await
            .unwrap_or_else(|error| panic!("{kind}: not granted after the quarantine: {error}"))
            .release()
            .await
            .expect("release");
    }
}

/// At default settings (a 5 s watchdog lease, the quarantine it implies), a lock store down
/// for 3 s costs under 10 s of refusals: a second client that keeps asking for a lock held
/// across the restart is granted it within 10 s of the store going down, and only once the
/// first holder, which could not renew, has given the lock up (no double grant).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_restart_at_defaults_costs_under_ten_seconds() {
    const DOWN: Duration = Duration::from_secs(3);
    let mut server = RedisServer::start();
    let connect = || async {
        let backend = RedisBackend::connect(&server.url()).await.expect("connect");
        LockClient::builder(backend).build().expect("defaults")
    };
    let (a, b) = (connect().await, connect().await);
    // A fresh server is in its quarantine too: wait it out before the run.
    let held = loop {
        match a.lock("account").acquire().await {
            Ok(guard) => break guard,
            Err(error) => tokio::time::sleep(error.retry_after().unwrap_or(DOWN / 10)).await,
        }
    };
    assert_eq!(Lease::DEFAULT.duration(), Duration::from_secs(5));

    tokio::task::block_in_place(|| server.kill());
    let down_at = Instant::now();
    // The outage itself: the store is away this long.
    tokio::time::sleep(DOWN).await;
    tokio::task::block_in_place(|| server.restart());

    let mut refusals = 0u32;
    let granted = loop {
        match b.lock("account").wait(Duration::from_secs(1)).acquire().await {
            Ok(guard) => break guard,
            Err(error) => {
                refusals += 1;
                let hint = error.retry_after().expect("every refusal says when to retry");
                assert!(!hint.is_zero(), "{error:?}");
                tokio::time::sleep(hint.min(Duration::from_millis(500))).await;
            }
        }
    };
    let outage = down_at.elapsed();
    println!("store down {DOWN:?}: first grant {outage:?} after it went down, {refusals} refusals");
    assert!(held.is_lost(), "granted while the first holder still believed it held the lock");
    assert!(
        outage < Duration::from_secs(10) + SLACK,
        "{outage:?} of refusals for a {DOWN:?} restart"
    );
    granted.release().await.unwrap();
}
