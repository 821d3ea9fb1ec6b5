//! F20: behind Sentinel, the master is killed (`SIGKILL`) while two holders (in two clients)
//! hold a lock each, already copied to the replica, and ten waiters wait for those locks. The
//! sentinels promote the replica; the clients must follow it: each holder keeps its lock or is
//! told it lost it, the waiters get the locks one at a time or time out cleanly, none is
//! stranded. Every section goes through the history and the witness.

use std::time::Duration;

use tokio::time::Instant;
use tower_lock::{Lease, LockClient, LockError, RedisBackend};

use super::eventually;
use crate::{
    checker, clock,
    history::{History, Outcome},
    run::{self, Scenario},
    support::sentinel::{MASTER_NAME, SentinelGroup},
    witness::Witness,
};

const PREFIX: &str = "chaos-f20:";
const KEYS: [&str; 2] = ["a", "b"];
const WAITERS: usize = 10;
const LEASE: Duration = Duration::from_secs(6);
/// How long a waiter waits: past any failover the sentinels can agree on here.
const WAIT: Duration = Duration::from_secs(20);

async fn client(group: &SentinelGroup) -> LockClient<RedisBackend> {
    let backend = RedisBackend::sentinel(group.sentinel_urls(), MASTER_NAME)
        .command_timeout(Duration::from_millis(500))
        .connect()
        .await
        .expect("connect through the sentinels");
    LockClient::builder(backend)
        .prefix(PREFIX)
        .build()
        .expect("client configuration")
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
    let result = locks
        .lock(key)
        .lease(Lease::watchdog(LEASE))
        .wait(WAIT)
        .acquire()
        .await;
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
    witness
        .increment_slowly(key, Duration::from_millis(5))
        .await;
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
    let copied = eventually(Duration::from_secs(5), || {
        KEYS.iter().all(|key| {
            group
                .replica
                .try_cmd(&["EXISTS", &format!("{PREFIX}{{{key}}}")])
                .is_ok_and(|reply| reply.as_int() == 1)
        })
    })
    .await;
    assert!(copied, "run {run}: the locks did not reach the replica");
    let queued = eventually(Duration::from_secs(5), || {
        clients.iter().map(LockClient::waiters).sum::<usize>() == WAITERS
    })
    .await;
    assert!(queued, "run {run}: the waiters did not queue");

    let killed_ns = clock::now_ns();
    let killed = Instant::now();
    group.master.kill();
    tokio::task::block_in_place(|| group.wait_for_master(&group.replica, WAIT));

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
                    outcome.first_acquire = Some(
                        outcome
                            .first_acquire
                            .map_or(after, |first| first.min(after)),
                    );
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

    assert_eq!(
        violations, 0,
        "mutual exclusion broken: {:?}",
        sweep.examples
    );
    assert_eq!(stranded, 0, "waiters stranded by the failover");
    assert!(
        other_errors.is_empty(),
        "waiters ended with {other_errors:?}"
    );
    assert_eq!(
        never_acquired, 0,
        "a failover after which no waiter got a lock"
    );
}
