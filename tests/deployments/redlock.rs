//! The Redlock backend over five `redis-server`s started by the fixture in `tests/support`:
//! mutual exclusion under contention and in a stampede of clients, re-entrancy, wake-up by notification, nodes killed (2:
//! still works; 3: the typed quorum error within the wait), nodes paused past the lease while
//! held (2: still held; 3: lost at the deadline), refused lock kinds, and no keys left behind.

use crate::support;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use support::{RedisServer, RespValue};
use tokio::time::{Instant, timeout};
use tower_lock::{
    Lease, LockClient, LockError, LockGuard, RedlockBackend, error::BackendErrorKind,
};

/// How many nodes each test runs.
const NODES: usize = 5;
/// The per-node timeout of the tests: short, with room for a loaded machine.
const NODE_TIMEOUT: Duration = Duration::from_millis(200);
/// Scheduling slack allowed past a computed bound.
const SLACK: Duration = Duration::from_millis(150);
/// How late past its deadline a guard may report itself lost (fault catalogue, F25: under 50 ms).
const LOSS_LATENCY: Duration = Duration::from_millis(50);

/// Five independent servers.
struct Nodes {
    servers: Vec<RedisServer>,
}

impl Nodes {
    fn start() -> Self {
        Self { servers: (0..NODES).map(|_| RedisServer::start()).collect() }
    }

    /// A backend of its own (own connections, own pub/sub: a separate process's view).
    fn backend(&self) -> RedlockBackend {
        support::redlock_backend(self.servers.iter().map(RedisServer::url))
            .node_timeout(NODE_TIMEOUT)
            .retry_jitter(Duration::from_millis(20))
            .build()
            .expect("valid Redlock configuration")
    }

    fn client(&self) -> LockClient<RedlockBackend> {
        LockClient::builder(self.backend()).prefix("rl:").build().expect("valid configuration")
    }

    /// The keys left on every node that still runs, as `port: key` lines. The record of an
    /// attempt voided on a node (`…:void`, made when a reply came too late, which a busy
    /// machine decides) is not one while it expires on its own.
    fn leftovers(&self) -> Vec<String> {
        self.servers
            .iter()
            .filter_map(|server| match server.try_cmd(&["KEYS", "*"]) {
                Ok(RespValue::Array(Some(keys))) => Some((server, keys)),
                _ => None,
            })
            .flat_map(|(server, keys)| {
                keys.into_iter()
                    .map(|key| key.as_str().unwrap_or_default())
                    .filter(|key| {
                        !key.ends_with(":void") || server.cmd(&["PTTL", key]).as_int() < 0
                    })
                    .map(move |key| format!("{}: {key}", server.port()))
            })
            .collect()
    }

    /// On how many nodes the owner record `name` names `grant`.
    fn holding(&self, name: &str, grant: &str) -> usize {
        self.servers
            .iter()
            .filter(|server| {
                support::owner_grant(|args| server.cmd(args), name).as_deref() == Some(grant)
            })
            .count()
    }

    /// The grant the owner record `name` names on the first node, once every node has a
    /// record there (a call returns once a majority answered; the slowest node follows within
    /// its call bound).
    async fn grant_everywhere(&self, name: &str) -> Option<String> {
        let settled = Instant::now() + NODE_TIMEOUT * 4;
        loop {
            let grants: Vec<Option<String>> = self
                .servers
                .iter()
                .map(|server| support::owner_grant(|args| server.cmd(args), name))
                .collect();
            if grants.iter().all(Option::is_some) || Instant::now() >= settled {
                return grants[0].clone();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Expects `result` to be the backend error of `kind`.
fn expect_backend_error<T>(result: Result<T, LockError>, what: &str) -> BackendErrorKind {
    match result {
        Err(LockError::Backend(error)) => {
            println!("{what}: {error}");
            error.kind().clone()
        }
        Err(other) => panic!("{what}: expected a backend error, got {other:?}"),
        Ok(_) => panic!("{what}: expected a backend error, got the lock"),
    }
}

/// Three clients (three processes' worth of connections) × 6 tasks × 50 acquisitions of one
/// key: never two inside at once, no acquisition fails, nothing left on any node.
/// One critical section on `key`: acquire within `wait`, count an overlap if another holder is
/// inside, yield so others can run, release.
async fn section(
    client: &LockClient<RedlockBackend>,
    key: &str,
    wait: Duration,
    inside: &AtomicBool,
    overlaps: &AtomicU64,
) {
    let guard = client.lock(key).wait(wait).acquire().await.expect("acquire within the wait");
    if inside.swap(true, Ordering::SeqCst) {
        overlaps.fetch_add(1, Ordering::SeqCst);
    }
    tokio::task::yield_now().await;
    inside.store(false, Ordering::SeqCst);
    guard.release().await.expect("release a held lock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mutual_exclusion() {
    const CLIENTS: usize = 3;
    const TASKS: usize = 6;
    const ROUNDS: usize = 50;
    let nodes = Nodes::start();
    let clients: Vec<_> = (0..CLIENTS).map(|_| nodes.client()).collect();
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for client in &clients {
        for _ in 0..TASKS {
            let (client, inside, overlaps) = (client.clone(), inside.clone(), overlaps.clone());
            set.spawn(async move {
                for _ in 0..ROUNDS {
                    section(&client, "hot", Duration::from_secs(30), &inside, &overlaps).await;
                }
            });
        }
    }
    while let Some(joined) = set.join_next().await {
        joined.expect("contending task");
    }
    let sections = CLIENTS * TASKS * ROUNDS;
    let (rounds, won) = clients.iter().fold((0, 0), |(rounds, won), client| {
        let backend = client.backend();
        (rounds + backend.acquire_rounds(), won + backend.acquire_rounds_won())
    });
    println!(
        "redlock mutual exclusion: {sections} sections in {:?}, {rounds} acquire rounds ({won} won, {:.2} per acquisition)",
        started.elapsed(),
        rounds as f64 / won.max(1) as f64
    );
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders were inside at once");
    assert_eq!(nodes.leftovers(), Vec::<String>::new(), "keys left behind");
}

/// Eight clients (eight processes' worth of connections) start contending at the same moment,
/// 10 times over: split votes are given back and retried after a random delay, so every
/// acquisition succeeds well within its wait and never two holders at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_clients_start_together() {
    const CLIENTS: usize = 8;
    const ROUNDS: usize = 10;
    let nodes = Nodes::start();
    let clients: Vec<_> = (0..CLIENTS).map(|_| nodes.client()).collect();
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    for _ in 0..ROUNDS {
        let start = Arc::new(tokio::sync::Barrier::new(CLIENTS));
        let mut set = tokio::task::JoinSet::new();
        for client in &clients {
            let (client, inside, overlaps) = (client.clone(), inside.clone(), overlaps.clone());
            let start = start.clone();
            set.spawn(async move {
                start.wait().await;
                section(&client, "stampede", Duration::from_secs(10), &inside, &overlaps).await;
            });
        }
        while let Some(joined) = set.join_next().await {
            joined.expect("contending client");
        }
    }
    let rounds: u64 = clients.iter().map(|c| c.backend().acquire_rounds()).sum();
    let acquisitions = (CLIENTS * ROUNDS) as u64;
    println!(
        "redlock stampede: {acquisitions} acquisitions by {CLIENTS} clients in {:?}, {:.2} rounds per acquisition",
        started.elapsed(),
        rounds as f64 / acquisitions as f64
    );
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders were inside at once");
    assert_eq!(nodes.leftovers(), Vec::<String>::new(), "keys left behind");
}

/// A holder re-enters (counts 1, 2, 3, kept by its client): every node keeps the grant's one
/// record throughout, another client is kept out until the last hold is released, and nothing
/// is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reentrancy() {
    let nodes = Nodes::start();
    let (a, b) = (nodes.client(), nodes.client());
    let holder = a.holder();
    let guards: Vec<LockGuard<RedlockBackend>> = holder
        .clone()
        .scope(async {
            let mut guards = Vec::new();
            for _ in 0..3 {
                let guard = a.lock("order:7").try_acquire().await;
                guards.push(guard.expect("the holder re-enters without waiting"));
            }
            guards
        })
        .await;
    let counts: Vec<u64> = guards.iter().map(LockGuard::hold_count).collect();
    assert_eq!(counts, [1, 2, 3]);
    let name = guards[0].key().as_str().to_owned();
    let grant = nodes.grant_everywhere(&name).await.expect("the grant's record");
    assert!(support::attempt_of(&grant, holder.id()), "{grant}");
    for (released, guard) in guards.into_iter().enumerate() {
        let left = 3 - released;
        assert_eq!(
            nodes.holding(&name, &grant),
            NODES,
            "the grant on every node, {left} holds left"
        );
        let busy = b.lock("order:7").try_acquire().await;
        assert!(
            matches!(busy, Err(LockError::WaitTimeout { .. })),
            "another holder gets in with {left} holds left: {busy:?}"
        );
        guard.release().await.expect("release one hold");
    }
    let next = b.lock("order:7").try_acquire().await;
    next.expect("free once every hold is released").release().await.expect("release");
    assert_eq!(nodes.leftovers(), Vec::<String>::new(), "keys left behind");
}

/// A waiter in another client is woken by the release notifications and acquires long before
/// the holder's 30 s lease would have run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiter_woken_by_release() {
    let nodes = Nodes::start();
    let (a, b) = (nodes.client(), nodes.client());
    let held = a
        .lock("doc:3")
        .lease(Lease::watchdog(Duration::from_secs(30)))
        .acquire()
        .await
        .expect("acquire");
    let waiter = tokio::spawn(async move {
        let acquired = b.lock("doc:3").wait(Duration::from_secs(10)).acquire().await;
        (Instant::now(), acquired, b)
    });
    // The waiter is subscribed on every node once its listen has returned.
    let deadline = Instant::now() + Duration::from_secs(5);
    let channel = format!("{}:released", held.key().as_str());
    while nodes.servers.iter().any(|server| match server.cmd(&["PUBSUB", "NUMSUB", &channel]) {
        RespValue::Array(Some(items)) => items[1].as_int() < 1,
        other => panic!("unexpected PUBSUB NUMSUB reply: {other:?}"),
    }) {
        assert!(Instant::now() < deadline, "the waiter never subscribed on every node");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let released_at = Instant::now();
    held.release().await.expect("release");
    let (acquired_at, acquired, _b) = waiter.await.expect("waiter task");
    let guard = acquired.expect("the waiter gets the lock");
    let gap = acquired_at - released_at;
    println!("redlock wake-up: release -> acquire in {gap:?} (lease 30 s)");
    assert!(gap < Duration::from_secs(1), "woken after {gap:?}");
    guard.release().await.expect("release");
}

/// With 2 of 5 nodes killed, locks are still taken, exclusive and released, within one node
/// timeout of the round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_nodes_killed_still_works() {
    let mut nodes = Nodes::start();
    let (a, b) = (nodes.client(), nodes.client());
    nodes.servers[1].kill();
    nodes.servers[3].kill();
    for round in 0..5 {
        let asked = Instant::now();
        let guard = a.lock("two-down").acquire().await.expect("acquire on 3 of 5");
        let took = asked.elapsed();
        assert!(took <= NODE_TIMEOUT + SLACK, "round {round}: acquire took {took:?}");
        let busy = b.lock("two-down").try_acquire().await;
        assert!(
            matches!(busy, Err(LockError::WaitTimeout { .. })),
            "round {round}: a second holder got in: {busy:?}"
        );
        guard.release().await.expect("release on 3 of 5");
    }
    let guard = b.lock("two-down").try_acquire().await;
    guard.expect("free after release").release().await.expect("release");
    assert_eq!(nodes.leftovers(), Vec::<String>::new(), "keys left behind");
}

/// With 2 of 5 nodes refusing connections, only the first call waits for them: the nodes are
/// then skipped for a moment, so 50 acquire-and-release pairs (100 calls) take a few node
/// timeouts in all, not 100 of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nodes_refusing_connections_are_skipped() {
    let mut nodes = Nodes::start();
    let client = nodes.client();
    let healthy = pair_latencies(&client, "skip", 50).await;
    nodes.servers[1].kill();
    nodes.servers[3].kill();
    let started = Instant::now();
    let down = pair_latencies(&client, "skip", 50).await;
    let took = started.elapsed();
    let (healthy_p50, down_p50) = (median(healthy), median(down));
    println!(
        "redlock with 2 of 5 refusing: 50 pairs in {took:?} (node timeout {NODE_TIMEOUT:?}), \
         pair p50 {down_p50:?} against {healthy_p50:?} with all 5 up"
    );
    // Without skipping: at least 100 node timeouts. With it: the first call, plus one more
    // per node back-off (1 s) that the loop outlasts.
    assert!(took < NODE_TIMEOUT * 10, "50 pairs took {took:?}");
    // A skipped node answers "no" at once: a typical pair costs what it costs with every node
    // up (a millisecond of allowance for a loaded machine).
    assert!(
        down_p50 <= healthy_p50 * 2 + Duration::from_millis(1),
        "pair p50 {down_p50:?} with 2 of 5 down, {healthy_p50:?} with all up"
    );
}

/// Two clients (two processes' worth of connections) pass one lock back and forth: with 2 of
/// 5 nodes refusing connections, the lock changes owner at least a quarter as often as with all
/// 5 up, in the same test (about half on an idle machine; waiting out the refusing nodes'
/// timeouts instead of skipping them would allow a few hand-offs a second).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hand_offs_keep_pace_with_two_nodes_refusing() {
    const RUN: Duration = Duration::from_millis(1500);
    let mut nodes = Nodes::start();
    let clients = [nodes.client(), nodes.client()];
    let healthy = owner_changes(&clients, "pass", RUN).await;
    nodes.servers[0].kill();
    nodes.servers[4].kill();
    let down = owner_changes(&clients, "pass", RUN).await;
    println!(
        "redlock hand-offs: {:.0}/s with 2 of 5 refusing, {:.0}/s with all 5 up",
        down as f64 / RUN.as_secs_f64(),
        healthy as f64 / RUN.as_secs_f64()
    );
    assert!(
        down * 4 >= healthy,
        "{down} owner changes with 2 of 5 refusing, {healthy} with all up"
    );
}

/// How many times `key` changed owner while each client kept taking it, for `run`.
async fn owner_changes(clients: &[LockClient<RedlockBackend>], key: &str, run: Duration) -> u64 {
    let last = Arc::new(AtomicU64::new(u64::MAX));
    let changes = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + run;
    let tasks = clients.iter().enumerate().map(|(me, client)| {
        let (client, key) = (client.clone(), key.to_owned());
        let (last, changes) = (last.clone(), changes.clone());
        tokio::spawn(async move {
            while Instant::now() < until {
                let guard = client
                    .lock(&key)
                    .wait(Duration::from_secs(2))
                    .acquire()
                    .await
                    .expect("acquire on a majority");
                if last.swap(me as u64, Ordering::SeqCst) != me as u64 {
                    changes.fetch_add(1, Ordering::SeqCst);
                }
                guard.release().await.expect("release on a majority");
            }
        })
    });
    for task in futures_util::future::join_all(tasks).await {
        task.expect("contending task");
    }
    changes.load(Ordering::SeqCst)
}

/// The time of each of `pairs` acquire-and-release pairs on `key`.
async fn pair_latencies(
    client: &LockClient<RedlockBackend>,
    key: &str,
    pairs: usize,
) -> Vec<Duration> {
    let mut latencies = Vec::with_capacity(pairs);
    for _ in 0..pairs {
        let started = Instant::now();
        let guard = client.lock(key).acquire().await.expect("acquire on a majority");
        guard.release().await.expect("release on a majority");
        latencies.push(started.elapsed());
    }
    latencies
}

fn median(mut latencies: Vec<Duration>) -> Duration {
    latencies.sort_unstable();
    latencies[latencies.len() / 2]
}

/// With 2 of 5 nodes stopped (they accept connections but answer nothing), an acquire is
/// decided by the three that answer: it does not wait out the stopped nodes' timeout. Their
/// late calls are resolved once they answer again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_acquire_returns_once_a_majority_granted() {
    let nodes = Nodes::start();
    let client = nodes.client();
    // Connections open before the pause, so the stopped nodes are slow, not unreachable.
    client
        .lock("warm")
        .acquire()
        .await
        .expect("acquire on every node")
        .release()
        .await
        .expect("release on every node");
    nodes.servers[0].pause();
    nodes.servers[2].pause();
    let asked = Instant::now();
    let guard = client.lock("majority").acquire().await.expect("acquire on 3 of 5");
    let took = asked.elapsed();
    println!(
        "redlock with 2 of 5 stopped: first acquire in {took:?} (node timeout {NODE_TIMEOUT:?})"
    );
    assert!(took < NODE_TIMEOUT / 2, "the acquire took {took:?}: it waited for the stopped nodes");
    guard.release().await.expect("release on 3 of 5");
    nodes.servers[0].resume();
    nodes.servers[2].resume();
}

/// With 3 of 5 nodes killed, an acquire fails with `QuorumUnavailable` within its wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_killed_fails_within_the_wait() {
    let mut nodes = Nodes::start();
    let client = nodes.client();
    for node in [0, 2, 4] {
        nodes.servers[node].kill();
    }
    let wait = Duration::from_millis(800);
    let asked = Instant::now();
    let result = client.lock("three-down").wait(wait).acquire().await;
    let took = asked.elapsed();
    let kind = expect_backend_error(result, "3 of 5 down");
    assert_eq!(kind, BackendErrorKind::QuorumUnavailable { reachable: 2, needed: 3 });
    println!("redlock with 3 of 5 down: failed in {took:?} (wait {wait:?})");
    assert!(took <= wait + SLACK, "failed after {took:?}");
    // Nothing it took on the two live nodes is left there.
    assert_eq!(nodes.leftovers(), Vec::<String>::new(), "keys left behind");
}

/// Two nodes paused (SIGSTOP) for three leases while held: a majority still renews, the guard
/// is never lost and nobody else gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_nodes_paused_keep_the_lock() {
    let nodes = Nodes::start();
    let (a, b) = (nodes.client(), nodes.client());
    let lease = Duration::from_millis(900);
    let guard = a.lock("paused").lease(Lease::watchdog(lease)).acquire().await.expect("acquire");
    nodes.servers[0].pause();
    nodes.servers[1].pause();
    let lost = guard.lost();
    let outcome = timeout(lease * 3, lost).await;
    let intruder = b.lock("paused").try_acquire().await;
    nodes.servers[0].resume();
    nodes.servers[1].resume();
    assert!(outcome.is_err(), "lost with only 2 of 5 nodes paused");
    assert!(!guard.is_lost());
    assert!(
        matches!(intruder, Err(LockError::WaitTimeout { .. })),
        "another holder got in: {intruder:?}"
    );
    guard.release().await.expect("release");
}

/// Three nodes paused while held: renewals cannot reach a majority, so the guard reports
/// itself lost at its deadline, before the lease it last renewed runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_paused_lose_the_lock_at_the_deadline() {
    let nodes = Nodes::start();
    let client = nodes.client();
    let lease = Duration::from_millis(900);
    let guard =
        client.lock("paused").lease(Lease::watchdog(lease)).acquire().await.expect("acquire");
    for node in 0..3 {
        nodes.servers[node].pause();
    }
    let paused_at = Instant::now();
    let lost = timeout(lease * 2, guard.lost()).await;
    let after = paused_at.elapsed();
    for node in 0..3 {
        nodes.servers[node].resume();
    }
    assert!(lost.is_ok(), "not lost {after:?} after pausing 3 of 5 nodes");
    println!("redlock with 3 of 5 paused: lost {after:?} after the pause (lease {lease:?})");
    // The last renewal that reached a majority was sent at most a third of a lease before the
    // pause, and the deadline is that send time plus the lease minus the drift margin (11 ms
    // here): so the loss comes before the nodes' lease ends, give or take timer latency.
    assert!(after >= lease / 2, "lost too early: {after:?}");
    assert!(after <= lease + LOSS_LATENCY, "lost too late: {after:?}");
    assert!(matches!(guard.release().await, Err(LockError::Lost)));
}

/// Fair locks, read-write locks and fencing tokens are refused with the typed error, before
/// any node is touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refused_kinds() {
    let nodes = Nodes::start();
    let client = nodes.client();
    let rw = client.read_write_lock("doc");
    let cases = [
        ("fair locks", client.fair_lock("doc").try_acquire().await),
        ("read-write locks", rw.read().try_acquire().await),
        ("read-write locks", rw.write().try_acquire().await),
        ("fencing tokens", client.lock("doc").fencing().try_acquire().await),
    ];
    for (feature, result) in cases {
        let kind = expect_backend_error(result, feature);
        assert_eq!(kind, BackendErrorKind::Unsupported { feature });
    }
    assert_eq!(nodes.leftovers(), Vec::<String>::new(), "a refused kind touched a node");
}

/// The builder refuses node counts without a clear majority.
#[tokio::test]
async fn builder_refuses_node_counts_without_a_majority() {
    for count in [0, 1, 2, 4, 6] {
        let urls = (0..count).map(|i| format!("redis://127.0.0.1:{}", 7000 + i));
        let built = support::redlock_backend(urls).build();
        assert!(built.is_err(), "{count} nodes accepted");
    }
    let urls = (0..3).map(|i| format!("redis://127.0.0.1:{}", 7000 + i));
    let backend = support::redlock_backend(urls).build().expect("3 nodes");
    assert_eq!(backend.quorum(), 2);
}
