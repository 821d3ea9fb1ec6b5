//! F19 (K6): a lock granted on a master whose replica never got it, then a failover to that
//! replica. The replica is killed (a paused one would still read the grant from its socket once
//! resumed), the master grants, the master is killed, the replica comes back empty and is
//! promoted (`REPLICAOF NO ONE`), and the proxy the clients go through is switched to it.
//!
//! Without `min_replicas` the lock is granted a second time on the promoted replica: that is the
//! negative control, and the checker must see the double grant or it is blind. With
//! `min_replicas(1, 100 ms)` the first grant is undone on the master and fails cleanly, so no
//! one holds twice. Each run does both, the two servers swapping roles every failover. The
//! overhead of `WAIT` is then measured on the healthy pair, and whether the server has
//! `WAITAOF` (Redis 7.2 and newer) is checked against its version: where it lacks it,
//! `wait_aof` is refused at connect, and where it has it, an `appendonly` server acknowledges
//! the grant.
//!
//! The variant is a coordinated failover (`FAILOVER`: the master pauses writes, waits for the
//! replica to catch up, and the two swap roles), with locks held on the master, half with a
//! fixed lease and half renewed by the watchdog, and the proxy switched to the new master once
//! the roles have swapped. No lock may be lost: each is still in Redis under its holder, a rival
//! cannot take it, a renewed one is renewed on the new master, its release succeeds, and then it
//! is free.

use std::time::{Duration, Instant};

use tower_lock::{Lease, LockClient, LockError, LockGuard, RedisBackend, error::BackendErrorKind};

use super::{Bed, Topology, eventually};
use crate::{
    checker, clock,
    history::{History, Outcome, Section},
    proxy::Proxy,
    run::{self, Node},
    support::owned_by,
};

/// How long `WAIT` waits for the replica.
const ACK_TIMEOUT: Duration = Duration::from_millis(100);
/// How long `WAIT` (or `WAITAOF`) waits where it must succeed even on a loaded machine (its
/// latency there is the round trip, not the timeout).
const HEALTHY_ACK_TIMEOUT: Duration = Duration::from_secs(2);
/// The fixed lease: far longer than a run, so only a failover can end it.
const LEASE: Duration = Duration::from_secs(30);
/// How long a replica gets to sync.
const SYNC_TIMEOUT: Duration = Duration::from_secs(10);
/// Locks held through each coordinated failover.
const HELD_PER_FAILOVER: usize = 8;
/// The watchdog lease of the renewed half: a third of it may have passed since the last
/// renewal when the failover starts, and the retry after the switch takes a twelfth, so the
/// failover itself may take up to about half of it (it takes about a second, up to two on a
/// loaded machine).
const WATCHDOG_LEASE: Duration = Duration::from_secs(5);
/// How long `FAILOVER` waits for the replica to catch up before it gives up.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(5);

/// What the acknowledged first grants did.
#[derive(Default)]
struct Failovers {
    /// First grants that failed with `ReplicasNotAcknowledged` and left no key on the master.
    clean_failures: usize,
    /// Other outcomes of an acknowledged first grant.
    unclean: Vec<String>,
}

/// The Redis key of `key` with `prefix`.
fn redis_key(prefix: &str, key: &str) -> String {
    format!("{prefix}{{{key}}}")
}

/// Makes `replica` a synced replica of `master`.
async fn sync(replica: &Node, master: &Node) {
    replica.replicate(master);
    in_sync(replica, master).await;
}

/// Waits until `replica` is in sync with `master`, as both see it.
async fn in_sync(replica: &Node, master: &Node) {
    let online = || {
        replica.replica_in_sync()
            && master.info("replication").is_some_and(|info| info.contains("state=online"))
    };
    assert!(
        eventually(SYNC_TIMEOUT, online).await,
        "the replica did not sync within {SYNC_TIMEOUT:?}"
    );
}

/// Whether `node` reports `role:<role>` (`master` or `slave`).
fn has_role(node: &Node, role: &str) -> bool {
    node.info("replication")
        .is_some_and(|info| info.lines().any(|line| line == format!("role:{role}")))
}

/// One failover from `master` to `replica` (a synced replica of it) with the first grant
/// `acknowledged` or not. Leaves `replica` the only server running, as master.
async fn failover(
    bed: &Bed,
    proxy: &Proxy,
    history: &History,
    (master, replica): (&Node, &Node),
    key: &str,
    acknowledged: bool,
    failovers: &mut Failovers,
) {
    replica.kill();
    proxy.retarget(master.url());
    let builder =
        crate::support::redis_backend(proxy.url()).command_timeout(Duration::from_secs(1));
    let first = bed
        .client_of(if acknowledged { builder.min_replicas(1, ACK_TIMEOUT) } else { builder })
        .await;
    let mut first_section = history.begin(key, "");
    let granted = first.lock(key).lease(Lease::fixed(LEASE)).try_acquire().await;
    match &granted {
        Ok(guard) => {
            first_section.t_ok = Some(clock::now_ns());
            first_section.holder = guard.holder().id().to_owned();
        }
        Err(error) => {
            first_section.result = Outcome::Fail;
            let left = master.cmd(&["EXISTS", &redis_key(&bed.prefix, key)]).as_int();
            let clean = matches!(error, LockError::Backend(e) if matches!(
                e.kind(),
                BackendErrorKind::ReplicasNotAcknowledged { wanted: 1, acknowledged: 0 }
            ));
            if clean && left == 0 && first.active_keys() == 0 {
                failovers.clean_failures += 1;
            } else {
                failovers.unclean.push(format!("{key}: {error:?}, key left: {left}"));
            }
        }
    }

    master.kill();
    replica.restart();
    let promoted = replica.cmd(&["REPLICAOF", "NO", "ONE"]);
    assert_eq!(promoted.as_str().as_deref(), Some("OK"), "{promoted:?}");
    proxy.retarget(replica.url());

    let second = bed
        .client_of(
            crate::support::redis_backend(proxy.url()).command_timeout(Duration::from_secs(1)),
        )
        .await;
    super::grant_again_after_failover(history, &second, key, (first_section, granted)).await;
}

/// Acquire latencies of `samples` uncontended acquisitions on `master`, alternating a client
/// without and one with `min_replicas`: (without, with).
async fn wait_overhead(bed: &Bed, master: &Node, samples: usize) -> (Vec<Duration>, Vec<Duration>) {
    let plain = bed.client_of(crate::support::redis_backend(master.url())).await;
    let acknowledged = bed
        .client_of(crate::support::redis_backend(master.url()).min_replicas(1, HEALTHY_ACK_TIMEOUT))
        .await;
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for sample in 0..samples {
        for (client, latencies) in [(&plain, &mut without), (&acknowledged, &mut with)] {
            let started = Instant::now();
            let guard = client
                .lock(format!("healthy{sample}"))
                .try_acquire()
                .await
                .expect("acquire on a healthy pair");
            latencies.push(started.elapsed());
            guard.release().await.expect("release");
        }
    }
    (without, with)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f19_failover_double_grants_with_and_without_wait() {
    let mut bed = Bed::new("F19", Topology::Single).await;
    let runs = run::count(10, 100);
    let history = bed.scenario.history();
    let (mut master, mut replica) = (bed.redis.clone(), bed.scenario.redis("replica"));
    let proxy = Proxy::start(master.url()).await;
    let mut failovers = Failovers::default();
    let started = Instant::now();
    for run in 0..runs {
        for acknowledged in [false, true] {
            sync(&replica, &master).await;
            let key = format!("{}{run}", if acknowledged { "wait" } else { "nowait" });
            failover(
                &bed,
                &proxy,
                &history,
                (&master, &replica),
                &key,
                acknowledged,
                &mut failovers,
            )
            .await;
            // The promoted replica is the master now; the dead master comes back empty.
            std::mem::swap(&mut master, &mut replica);
            replica.restart();
        }
    }
    let failover_secs = started.elapsed().as_secs_f64();

    sync(&replica, &master).await;
    let (without, with) = wait_overhead(&bed, &master, run::count(200, 2000)).await;

    let leaks = checker::server_settled(&master, &bed.prefix).await;
    let (p50_without, p50_with) = (run::quantile_ms(&without, 0.5), run::quantile_ms(&with, 0.5));
    let wait_aof = wait_aof_detection(&mut bed).await;
    let s = &mut bed.scenario;
    let (without_wait, with_wait) = super::double_grant_figures(s, runs, failovers.clean_failures);
    s.figure("acquire_p50_ms", format!("{p50_without:.2}"));
    s.figure("acquire_wait_p50_ms", format!("{p50_with:.2}"));
    s.figure("wait_overhead_p50_ms", format!("{:.2}", p50_with - p50_without));
    s.figure("leaked_keys", leaks.count());
    s.figure("failover_secs", format!("{failover_secs:.1}"));
    s.figure("waitaof", wait_aof);
    s.report();

    assert!(without_wait.violations > 0, "checker blind: no double grant without WAIT");
    assert_eq!(with_wait.violations, 0, "{:?}", with_wait.examples);
    assert_eq!(with_wait.token_errors, 0, "{:?}", with_wait.examples);
    assert!(failovers.unclean.is_empty(), "{:?}", failovers.unclean);
    assert_eq!(failovers.clean_failures, runs);
    assert_eq!(leaks.count(), 0, "left in Redis: {leaks:?}");
}

/// Checks that `supports_wait_aof` finds `WAITAOF` exactly where the server's version has it (7.2 and
/// newer), and what `wait_aof` does then: refused at connect, with `Unsupported`, where it is
/// missing; where it is there, refused at connect for a local fsync on a server without
/// `appendonly`, acknowledged by one with it, and undone when the replicas it asks for do not
/// exist. Returns the figure.
async fn wait_aof_detection(bed: &mut Bed) -> String {
    let version = bed.redis.version();
    let numbers: Vec<u32> = version.split('.').filter_map(|n| n.parse().ok()).collect();
    let expected = numbers[..] >= [7, 2][..];
    let plain = crate::support::redis_backend(bed.redis.url())
        .connect()
        .await
        .expect("connect without wait_aof, whatever the version");
    let supported = plain.supports_wait_aof().await.expect("ask for WAITAOF");
    assert_eq!(supported, expected, "redis {version}");

    let local =
        |url: &str| crate::support::redis_backend(url).wait_aof(true, 0, HEALTHY_ACK_TIMEOUT);
    let refused = local(bed.redis.url())
        .connect()
        .await
        .expect_err("no WAITAOF, or no appendonly for a local fsync");
    if expected {
        // The command exists: the server's own refusal, not a missing feature.
        assert!(!refused.is_unsupported(), "{refused}");
        let aof = bed.scenario.redis_with("aof", &["--appendonly", "yes"]);
        let acknowledged = bed.client_of(local(aof.url())).await;
        let guard = acknowledged
            .lock("aof")
            .try_acquire()
            .await
            .expect("a grant fsynced by an appendonly server");
        guard.release().await.expect("release");
        assert!(aof.calls("waitaof") >= 2, "the probe and one grant");

        let no_replica = bed
            .client_of(crate::support::redis_backend(aof.url()).wait_aof(false, 1, ACK_TIMEOUT))
            .await;
        let error = no_replica
            .lock("aof-replica")
            .try_acquire()
            .await
            .expect_err("no replica can fsync it");
        assert!(
            matches!(&error, LockError::Backend(e) if matches!(
                e.kind(),
                BackendErrorKind::AofNotAcknowledged { wanted: 1, acknowledged: 0, .. }
            )),
            "{error:?}"
        );
        assert_eq!(aof.cmd(&["EXISTS", &bed.lock_key("aof-replica")]).as_int(), 0);
        format!("supported (redis {version})")
    } else {
        assert!(
            matches!(refused.kind(), BackendErrorKind::Unsupported { feature }
                if feature.contains("WAITAOF") && feature.contains("7.2")),
            "{refused:?}"
        );
        format!("unsupported (redis {version})")
    }
}

/// A lock held through a coordinated failover, and the record of its section.
struct Kept {
    guard: LockGuard<RedisBackend>,
    section: Section,
    /// Whether the watchdog renews it.
    renewed: bool,
}

/// Acquires [`HELD_PER_FAILOVER`] fenced locks with `holders`, every other one renewed by the
/// watchdog.
async fn hold(holders: &LockClient<RedisBackend>, history: &History, run: usize) -> Vec<Kept> {
    let mut kept = Vec::new();
    for i in 0..HELD_PER_FAILOVER {
        let key = format!("kept{run}-{i}");
        let renewed = i % 2 == 1;
        let lease = if renewed { Lease::watchdog(WATCHDOG_LEASE) } else { Lease::fixed(LEASE) };
        let mut section = history.begin(&key, "");
        let guard = holders
            .lock(&key)
            .lease(lease)
            .fencing()
            .try_acquire()
            .await
            .unwrap_or_else(|e| panic!("{key}: the master does not grant: {e:?}"));
        section.t_ok = Some(clock::now_ns());
        section.holder = guard.holder().id().to_owned();
        section.token = guard.fencing_token();
        kept.push(Kept { guard, section, renewed });
    }
    kept
}

/// `FAILOVER` on `master`, then waits until `replica` is the master and `master` its replica;
/// how long that took.
async fn coordinated_failover(master: &Node, replica: &Node) -> Duration {
    let started = Instant::now();
    let timeout = FAILOVER_TIMEOUT.as_millis().to_string();
    let reply = master.cmd(&["FAILOVER", "TIMEOUT", &timeout]);
    assert_eq!(reply.as_str().as_deref(), Some("OK"), "FAILOVER: {reply:?}");
    let swapped = || has_role(replica, "master") && has_role(master, "slave");
    assert!(eventually(FAILOVER_TIMEOUT + SYNC_TIMEOUT, swapped).await, "the roles did not swap");
    started.elapsed()
}

/// Tries `key` with `rival`, recording a grant; whether it got it.
async fn rival_takes(rival: &LockClient<RedisBackend>, history: &History, key: &str) -> bool {
    let mut section = history.begin(key, "");
    match rival.lock(key).fencing().try_acquire().await {
        Ok(guard) => {
            section.t_ok = Some(clock::now_ns());
            section.holder = guard.holder().id().to_owned();
            section.token = guard.fencing_token();
            section.t_rel_inv = Some(clock::now_ns());
            let released = guard.release().await;
            section.t_rel_ok = Some(clock::now_ns());
            section.result = if released.is_ok() { Outcome::Ok } else { Outcome::Info };
            history.record(&section);
            true
        }
        Err(LockError::WaitTimeout { .. }) => false,
        Err(error) => panic!("{key}: the rival's attempt failed: {error:?}"),
    }
}

/// Checks every lock `kept` through a failover whose proxy switch happened at `switched`, with
/// `master` the new master, and releases them; one line for each lock lost, with what showed it.
async fn check_kept(
    bed: &Bed,
    master: &Node,
    (rival, history): (&LockClient<RedisBackend>, &History),
    kept: Vec<Kept>,
    switched: Instant,
) -> Vec<String> {
    let mut problems = vec![Vec::new(); kept.len()];
    for (Kept { section, .. }, problems) in kept.iter().zip(&mut problems) {
        // Any grant here is a second holder: the checker sees it in the history too.
        if rival_takes(rival, history, &section.key).await {
            problems.push("granted to a rival while held".to_owned());
        }
    }
    // A renewal sent after the switch pushes the deadline past any made before it.
    let renewed_since_switch = |guard: &LockGuard<RedisBackend>| {
        guard.remaining() > WATCHDOG_LEASE.saturating_sub(switched.elapsed())
    };
    for (Kept { guard, renewed, .. }, problems) in kept.iter().zip(&mut problems) {
        if *renewed && !eventually(WATCHDOG_LEASE, || renewed_since_switch(guard)).await {
            problems.push("not renewed on the new master".to_owned());
        }
    }
    let mut lost = Vec::new();
    for (Kept { guard, mut section, .. }, mut problems) in kept.into_iter().zip(problems) {
        let key = section.key.clone();
        let owned = owned_by(|args| master.cmd(args), &bed.lock_key(&key), &section.holder);
        if !owned {
            problems.push("not in Redis under its holder".to_owned());
        }
        if guard.is_lost() {
            section.t_lost = Some(clock::now_ns());
            problems.push("the holder's guard reports it lost".to_owned());
        }
        section.t_rel_inv = Some(clock::now_ns());
        match guard.release().await {
            Ok(()) => {
                section.t_rel_ok = Some(clock::now_ns());
                section.result = Outcome::Ok;
            }
            Err(error) => problems.push(format!("release failed: {error:?}")),
        }
        history.record(&section);
        if !rival_takes(rival, history, &key).await {
            problems.push("not free after its release".to_owned());
        }
        if !problems.is_empty() {
            lost.push(format!("{key}: {}", problems.join("; ")));
        }
    }
    lost
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f19_coordinated_failover_loses_no_lock() {
    let mut bed = Bed::new("F19-coordinated", Topology::Single).await;
    let runs = run::count(3, 30);
    let history = bed.scenario.history();
    let (mut master, mut replica) = (bed.redis.clone(), bed.scenario.redis("replica"));
    sync(&replica, &master).await;
    let proxy = Proxy::start(master.url()).await;
    // The holders keep their client through every failover. One pooled connection: after the
    // switch, the first command that meets the cut one replaces it, so once a renewal has
    // succeeded the release goes through a live connection.
    let holders = bed
        .client_of(
            crate::support::redis_backend(proxy.url())
                .pool_size(1)
                .command_timeout(Duration::from_secs(1)),
        )
        .await;
    let (mut lost, mut durations) = (Vec::new(), Vec::new());
    for run in 0..runs {
        let kept = hold(&holders, &history, run).await;
        durations.push(coordinated_failover(&master, &replica).await);
        proxy.retarget(replica.url());
        let switched = Instant::now();
        std::mem::swap(&mut master, &mut replica);
        // Another process, started after the switch (an attempt on a cut connection would
        // leave its undo marker behind).
        let rival = bed.client_via(&proxy.url(), Duration::from_secs(1)).await;
        lost.extend(check_kept(&bed, &master, (&rival, &history), kept, switched).await);
        // The demoted master follows the new one; it takes over again next run.
        in_sync(&replica, &master).await;
    }

    let sweep = checker::sweep(&History::read(&bed.scenario.history_path()));
    let leaks = checker::server_settled(&master, &bed.prefix).await;
    let settled = checker::client_settles(&holders, Duration::from_secs(5)).await;
    let total = runs * HELD_PER_FAILOVER;
    let s = &mut bed.scenario;
    s.figure("runs", runs);
    s.figure("coordinated_failover_lost", format!("{}/{total}", lost.len()));
    s.figure("double_grants", sweep.violations);
    s.figure_ms("failover_ms_p50", &durations, 0.5);
    s.figure_ms("failover_ms_max", &durations, 1.0);
    s.figure("leaked_keys", leaks.count());
    s.report();

    assert!(lost.is_empty(), "{lost:#?}");
    assert_eq!(sweep.violations, 0, "{:?}", sweep.examples);
    assert_eq!(sweep.token_errors, 0, "{:?}", sweep.examples);
    assert_eq!(sweep.held, 2 * total, "every lock held, then free");
    assert_eq!(leaks.count(), 0, "left in Redis: {leaks:?}");
    checker::assert_settled(settled, &holders);
}
