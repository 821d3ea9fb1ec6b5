//! F20: behind Sentinel, the master is killed (`SIGKILL`) while two holders (in two clients)
//! hold a lock each, already copied to the replica, and ten waiters wait for those locks. The
//! sentinels promote the replica; the clients must follow it: each holder keeps its lock or is
//! told it lost it, the waiters get the locks one at a time or time out cleanly, none is
//! stranded. Every section goes through the history and the witness.
//!
//! Second test: a lock granted on the master that the replica never got, then the same
//! failover. The replica replicates through a proxy, blackholed around the grant: the write
//! never arrives, yet the replica keeps its place in the sentinels' view (the master lists it
//! under its own listening port) and is promoted. Without `min_replicas` a client following
//! the sentinels gets the lock again while the first holder still believes it holds it: the
//! negative control, which the checker must see. With `min_replicas(1, 100 ms)` the first
//! grant fails cleanly and leaves no key, so no one holds twice.

use std::time::Duration;

use tokio::time::Instant;
use tower_lock::{
    Lease, LockClient, LockError, RedisBackend, RedisBackendBuilder, error::BackendErrorKind,
};

use super::eventually;
use crate::{
    checker, clock,
    history::{History, Outcome},
    proxy::{Mode, Proxy},
    run::{self, Scenario},
    support::{
        RedisServer,
        sentinel::{MASTER_NAME, SentinelGroup},
    },
    witness::Witness,
};

const PREFIX: &str = "chaos-f20:";
const KEYS: [&str; 2] = ["a", "b"];
const WAITERS: usize = 10;
const LEASE: Duration = Duration::from_secs(6);
/// How long a waiter waits: past any failover the sentinels can agree on here.
const WAIT: Duration = Duration::from_secs(20);
/// How long `WAIT` waits for the replica.
const ACK_TIMEOUT: Duration = Duration::from_millis(100);
/// The unreplicated grant's lease: far longer than a failover, so only the failover can end
/// it.
const UNREPLICATED_LEASE: Duration = Duration::from_secs(30);

/// A backend on whichever server the group's sentinels name as master.
fn following(group: &SentinelGroup) -> RedisBackendBuilder {
    RedisBackend::sentinel(group.sentinel_urls(), MASTER_NAME)
        .command_timeout(Duration::from_millis(500))
        .quarantine(Duration::ZERO)
}

async fn client_of(builder: RedisBackendBuilder) -> LockClient<RedisBackend> {
    let backend = builder.connect().await.expect("connect through the sentinels");
    LockClient::builder(backend).prefix(PREFIX).build().expect("client configuration")
}

async fn client(group: &SentinelGroup) -> LockClient<RedisBackend> {
    client_of(following(group)).await
}

/// The Redis key of the lock `key`.
fn redis_key(key: &str) -> String {
    format!("{PREFIX}{{{key}}}")
}

/// Whether `server` holds the lock `key` (false when it does not answer).
fn has(server: &RedisServer, key: &str) -> bool {
    server.try_cmd(&["EXISTS", &redis_key(key)]).is_ok_and(|reply| reply.as_int() == 1)
}

/// `SIGKILL`s the master and waits until the sentinels have promoted the replica; returns when
/// the kill happened.
fn fail_over(group: &mut SentinelGroup) -> (u64, Instant) {
    let killed = (clock::now_ns(), Instant::now());
    group.master.kill();
    tokio::task::block_in_place(|| group.wait_for_master(&group.replica, WAIT));
    killed
}

/// What one failover showed.
struct Failover {
    /// From the kill to the first waiter's grant.
    first_acquire: Option<Duration>,
    /// Holders that kept their lock through the failover (the others were told they lost it).
    kept: usize,
    acquired: usize,
    timed_out: usize,
    /// Waiters that neither acquired nor failed within their wait, or were left in a client.
    stranded: usize,
    /// Waiters that ended with another error.
    other_errors: Vec<String>,
}

/// A waiter: acquires `key` within the wait, enters the witness, releases.
async fn waiter(
    locks: LockClient<RedisBackend>,
    key: &'static str,
    history: History,
    witness: Witness,
) -> Result<u64, LockError> {
    let mut section = history.begin(key, "");
    let result = locks.lock(key).lease(Lease::watchdog(LEASE)).wait(WAIT).acquire().await;
    let guard = match result {
        Ok(guard) => guard,
        Err(error) => {
            section.result = Outcome::Fail;
            history.record(&section);
            return Err(error);
        }
    };
    let t_ok = clock::now_ns();
    section.t_ok = Some(t_ok);
    section.holder = guard.holder().id().to_owned();
    witness.enter(key).await;
    witness.increment_slowly(key, Duration::from_millis(5)).await;
    witness.exit(key).await;
    section.t_rel_inv = Some(clock::now_ns());
    // A release racing the failover may fail; the lease then frees the lock.
    let _ = guard.release().await;
    section.t_rel_ok = Some(clock::now_ns());
    section.result = Outcome::Ok;
    history.record(&section);
    Ok(t_ok)
}

async fn failover(run: usize, history: &History, witness: &Witness) -> Failover {
    let mut group = tokio::task::block_in_place(SentinelGroup::start);
    let clients = [client(&group).await, client(&group).await];
    let mut holders = Vec::new();
    for (locks, key) in clients.iter().zip(KEYS) {
        holders.push(super::in_process::hold(locks, key, LEASE, history, run).await);
    }
    let waiters: Vec<_> = (0..WAITERS)
        .map(|i| {
            tokio::spawn(waiter(
                clients[i % 2].clone(),
                KEYS[i % KEYS.len()],
                history.clone(),
                witness.clone(),
            ))
        })
        .collect();
    let copied =
        eventually(Duration::from_secs(5), || KEYS.iter().all(|key| has(&group.replica, key)))
            .await;
    assert!(copied, "run {run}: the locks did not reach the replica");
    let queued = eventually(Duration::from_secs(5), || {
        clients.iter().map(LockClient::waiters).sum::<usize>() == WAITERS
    })
    .await;
    assert!(queued, "run {run}: the waiters did not queue");

    let (killed_ns, killed) = fail_over(&mut group);

    let mut kept = 0;
    for (guard, mut section) in holders {
        if guard.is_lost() {
            section.t_lost = Some(clock::now_ns());
        }
        section.t_rel_inv = Some(clock::now_ns());
        match guard.release().await {
            Ok(()) => kept += 1,
            Err(LockError::Lost | LockError::NotHeld | LockError::Backend(_)) => {}
            Err(other) => panic!("run {run}: unexpected release error {other:?}"),
        }
        section.t_rel_ok = Some(clock::now_ns());
        section.result = Outcome::Ok;
        history.record(&section);
    }

    let mut outcome = Failover {
        first_acquire: None,
        kept,
        acquired: 0,
        timed_out: 0,
        stranded: 0,
        other_errors: Vec::new(),
    };
    let deadline = killed + WAIT + Duration::from_secs(5);
    for waiter in waiters {
        match tokio::time::timeout_at(deadline, waiter).await {
            Err(_) => outcome.stranded += 1,
            Ok(joined) => match joined.expect("waiter task") {
                Ok(t_ok) => {
                    outcome.acquired += 1;
                    let after = clock::between(killed_ns, t_ok);
                    outcome.first_acquire =
                        Some(outcome.first_acquire.map_or(after, |first| first.min(after)));
                }
                Err(LockError::WaitTimeout { .. }) => outcome.timed_out += 1,
                Err(other) => outcome.other_errors.push(format!("{other:?}")),
            },
        }
    }
    outcome.stranded += clients.iter().map(LockClient::waiters).sum::<usize>();
    outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f20_sentinel_failover_with_holders_and_waiters() {
    let mut scenario = Scenario::new("F20");
    let witness = Witness::connect(scenario.redis("witness").url()).await;
    let history = scenario.history();
    let runs = run::count(2, 10);
    let mut first_acquire = Vec::new();
    let (mut kept, mut acquired, mut timed_out, mut stranded) = (0, 0, 0, 0);
    let mut other_errors = Vec::new();
    let mut never_acquired = 0;
    for run in 0..runs {
        let outcome = failover(run, &history, &witness).await;
        match outcome.first_acquire {
            Some(first) => first_acquire.push(first),
            None => never_acquired += 1,
        }
        kept += outcome.kept;
        acquired += outcome.acquired;
        timed_out += outcome.timed_out;
        stranded += outcome.stranded;
        other_errors.extend(outcome.other_errors);
    }

    let sections = History::read(&scenario.history_path());
    let sweep = checker::sweep(&sections);
    let seen = witness.seen().await;
    let lost_updates = (acquired as u64).abs_diff(seen.counted);
    let violations = sweep.violations as u64 + seen.overlaps + lost_updates;
    scenario.figure("runs", runs);
    scenario.figure(
        "first_acquire_after_kill_p99_ms",
        format!("{:.0}", run::quantile_ms(&first_acquire, 0.99)),
    );
    scenario.figure("holders_kept", format!("{kept}/{}", runs * KEYS.len()));
    scenario.figure("waiters_acquired", format!("{acquired}/{}", runs * WAITERS));
    scenario.figure("waiters_timed_out", timed_out);
    scenario.figure("stranded", stranded);
    scenario.figure("violations", violations);
    scenario.report();

    assert_eq!(violations, 0, "mutual exclusion broken: {:?}", sweep.examples);
    assert_eq!(stranded, 0, "waiters stranded by the failover");
    assert!(other_errors.is_empty(), "waiters ended with {other_errors:?}");
    assert_eq!(never_acquired, 0, "a failover after which no waiter got a lock");
}

/// What one failover after an unreplicated grant showed.
struct Unreplicated {
    /// From the kill to the promoted replica's grant.
    failover: Duration,
    /// With `min_replicas`: whether the first grant failed with `ReplicasNotAcknowledged` and
    /// left no key on the master nor in its client.
    clean_failure: bool,
    /// What the first grant did instead, when that is wrong for its variant.
    unclean: Option<String>,
}

/// The port of a `redis://host:port` URL.
fn port_of(url: &str) -> &str {
    url.rsplit_once(':').map_or(url, |(_, port)| port)
}

/// Whether `replica`'s link to its master through `port` is up.
fn replicates_through(replica: &RedisServer, port: &str) -> bool {
    replica.info("replication").is_ok_and(|info| {
        let mut lines = info.lines();
        let port_line = format!("master_port:{port}");
        lines.clone().any(|line| line == port_line)
            && lines.any(|line| line == "master_link_status:up")
    })
}

/// One failover after a lock is granted on the master while its replication stream is
/// blackholed; the grant is `acknowledged` (`min_replicas`) or not. A second client, following
/// the sentinels, then takes the same key on the promoted replica.
async fn unreplicated_grant(run: usize, acknowledged: bool, history: &History) -> Unreplicated {
    let mut group = tokio::task::block_in_place(SentinelGroup::start);
    // By address: the master's URL may carry credentials.
    let proxy = Proxy::start(&format!("redis://127.0.0.1:{}", group.master.port())).await;
    let through = port_of(&proxy.url()).to_owned();
    let reply = group.replica.cmd(&["REPLICAOF", "127.0.0.1", &through]);
    assert_eq!(reply.as_str().as_deref(), Some("OK"), "run {run}: REPLICAOF: {reply:?}");
    // The sentinels keep the replica: the master lists it under its own listening port. They
    // point a replica of another address back at the master only failover-timeout (5 s) after
    // they see the change, and the master is dead well before (a partial resync takes
    // milliseconds).
    let linked =
        eventually(Duration::from_secs(2), || replicates_through(&group.replica, &through)).await;
    assert!(linked, "run {run}: the replica did not sync through the proxy");

    let builder = following(&group);
    let first =
        client_of(if acknowledged { builder.min_replicas(1, ACK_TIMEOUT) } else { builder }).await;
    let key = format!("{}{run}", if acknowledged { "wait" } else { "nowait" });
    // Unlike a paused or killed replica, the replica stays up and promotable; what the master
    // sends it from now on is read by the proxy and dropped.
    proxy.set(Mode::Blackhole);
    let mut first_section = history.begin(&key, "");
    let granted = first.lock(&key).lease(Lease::fixed(UNREPLICATED_LEASE)).try_acquire().await;
    let (mut clean_failure, mut unclean) = (false, None);
    match &granted {
        Ok(guard) => {
            first_section.t_ok = Some(clock::now_ns());
            first_section.holder = guard.holder().id().to_owned();
            if acknowledged {
                unclean = Some(format!("{key}: granted, though no replica could acknowledge"));
            }
        }
        Err(error) => {
            assert!(acknowledged, "run {run}: {key}: the master does not grant: {error:?}");
            first_section.result = Outcome::Fail;
            let left = has(&group.master, &key);
            let not_acknowledged = matches!(error, LockError::Backend(e) if matches!(
                e.kind(),
                BackendErrorKind::ReplicasNotAcknowledged { wanted: 1, acknowledged: 0 }
            ));
            clean_failure = not_acknowledged && !left && first.active_keys() == 0;
            if !clean_failure {
                unclean = Some(format!("{key}: {error:?}, key left: {left}"));
            }
        }
    }

    let (killed_ns, _) = fail_over(&mut group);
    // Its master dead, the promoted replica's data is final.
    assert!(
        !has(&group.replica, &key),
        "run {run}: {key} reached the replica: the blackhole missed it, or the sentinels \
         pointed the replica back at the master before the kill"
    );
    let second = client(&group).await;
    let t_ok =
        super::grant_again_after_failover(history, &second, &key, (first_section, granted)).await;
    Unreplicated { failover: clock::between(killed_ns, t_ok), clean_failure, unclean }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f20_unreplicated_grant_double_grants_with_and_without_wait() {
    let mut scenario = Scenario::new("F20-wait");
    let history = scenario.history();
    let runs = run::count(1, 20);
    let (mut failovers, mut clean_failures, mut unclean) = (Vec::new(), 0, Vec::new());
    for run in 0..runs {
        for acknowledged in [false, true] {
            let outcome = unreplicated_grant(run, acknowledged, &history).await;
            failovers.push(outcome.failover);
            clean_failures += usize::from(outcome.clean_failure);
            unclean.extend(outcome.unclean);
        }
    }

    let (without_wait, with_wait) =
        super::double_grant_figures(&mut scenario, runs, clean_failures);
    scenario.figure_ms("failover_p50_ms", &failovers, 0.5);
    scenario.figure_ms("failover_max_ms", &failovers, 1.0);
    scenario.report();

    assert_eq!(
        without_wait.violations, runs,
        "checker blind: a grant the promoted replica never got was not seen granted twice"
    );
    assert_eq!(with_wait.violations, 0, "{:?}", with_wait.examples);
    assert!(unclean.is_empty(), "{unclean:?}");
    assert_eq!(clean_failures, runs);
}
