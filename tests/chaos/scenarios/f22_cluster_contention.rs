//! F22: F1-style contention on a 3 + 3 Redis Cluster, two clients with their own cluster
//! connections taking locks on keys whose slots are spread over every master. Every section goes
//! through the witness and the history; afterwards no node may have refused a command for
//! spanning slots (`CROSSSLOT` in `INFO errorstats`), release notifications must have gone out
//! with `SPUBLISH` only (a plain `PUBLISH` reaches every node of the cluster), and no node may
//! have redirected one (`MOVED`: sent to a node that does not own the slot).

use std::time::Instant;

use tower_lock::{LockClient, RedisBackend};

use super::in_process::{Contention, contend};
use crate::{
    checker,
    history::History,
    run::{self, Scenario},
    support::{RedisServer, RespValue, cluster::RedisCluster},
    witness::Witness,
};

const PREFIX: &str = "chaos-f22:";
/// Clients (each one a process's worth of connections).
const CLIENTS: usize = 2;
/// Tasks per client.
const TASKS: usize = 8;
/// Keys `k0..k64`: their slots fall on every master.
const KEYS: u64 = 64;

/// `INFO <section>` of `node`, parsed as `field:value` lines; the `count` or `calls` of `name`.
fn stat(node: &RedisServer, section: &str, name: &str) -> u64 {
    let text = node.info(section).unwrap_or_default();
    let prefix = format!("{name}:");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|rest| {
            let first = rest.split(',').next()?;
            first.split_once('=')?.1.parse().ok()
        })
        .unwrap_or(0)
}

/// The sum of a stat over the nodes `nodes`.
fn total(cluster: &RedisCluster, nodes: &[usize], section: &str, name: &str) -> u64 {
    nodes.iter().map(|&i| stat(cluster.node(i), section, name)).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f22_cluster_contention_over_all_masters() {
    let mut scenario = Scenario::new("F22");
    let witness = Witness::connect(scenario.redis("witness").url()).await;
    let history = scenario.history();
    let mut rng = scenario.rng();
    let cluster = tokio::task::block_in_place(RedisCluster::start);
    let mut clients = Vec::new();
    for _ in 0..CLIENTS * TASKS {
        // Tasks of one client share its connections.
        if clients.len() % TASKS == 0 {
            let backend = RedisBackend::cluster(cluster.urls())
                .connect()
                .await
                .expect("connect to the cluster");
            clients.push(
                LockClient::builder(backend).prefix(PREFIX).build().expect("client configuration"),
            );
        } else {
            let shared = clients[clients.len() - 1].clone();
            clients.push(shared);
        }
    }
    let masters = cluster.masters();
    let owners: std::collections::BTreeSet<usize> =
        (0..KEYS).map(|k| cluster.owner_of(&format!("{PREFIX}{{k{k}}}"))).collect();

    let started = Instant::now();
    let load = Contention {
        sections: run::count(2000, 20_000),
        keys: KEYS,
        wait: std::time::Duration::from_secs(30),
    };
    let seen_by_clients = contend((&history, &witness), &clients, load, &mut rng).await;
    let elapsed = started.elapsed();

    let sections = History::read(&scenario.history_path());
    let sweep = checker::sweep(&sections);
    let seen = witness.seen().await;
    let ok = checker::completed(&sections);
    let lost_updates = (ok as u64).abs_diff(seen.counted);
    let violations = sweep.violations as u64 + seen.overlaps + lost_updates;
    let crossslot = total(&cluster, &masters, "errorstats", "errorstat_CROSSSLOT");
    let moved = total(&cluster, &masters, "errorstats", "errorstat_MOVED");
    let publish = total(&cluster, &masters, "commandstats", "cmdstat_publish");
    let spublish = total(&cluster, &masters, "commandstats", "cmdstat_spublish");
    let leaks: usize = masters
        .iter()
        .map(|&i| {
            let keys = cluster.node(i).cmd(&["KEYS", &format!("{PREFIX}*")]);
            match keys {
                RespValue::Array(Some(found)) => found
                    .iter()
                    .filter_map(RespValue::as_str)
                    .filter(|key| !key.ends_with(":fence"))
                    .count(),
                other => panic!("unexpected KEYS reply {other:?}"),
            }
        })
        .sum();

    scenario.figure("masters_used", format!("{}/{}", owners.len(), masters.len()));
    scenario.figure("violations", format!("{violations}/{}", sweep.held));
    scenario.figure("witness_overlaps", seen.overlaps);
    scenario.figure("lost_updates", lost_updates);
    scenario.figure("errors", seen_by_clients.errors.len());
    scenario.figure(
        "acquire_p99_ms",
        format!("{:.1}", run::quantile_ms(&seen_by_clients.latencies, 0.99)),
    );
    scenario.figure("crossslot", crossslot);
    scenario.figure("moved", moved);
    scenario.figure("publish", publish);
    scenario.figure("spublish", spublish);
    scenario.figure("leaked_keys", leaks);
    scenario.figure("secs", format!("{:.1}", elapsed.as_secs_f64()));
    scenario.report();

    assert_eq!(owners.len(), masters.len(), "the keys cover every master");
    assert_eq!(violations, 0, "mutual exclusion broken: {:?}", sweep.examples);
    assert!(
        seen_by_clients.errors.is_empty(),
        "caller-visible errors: {:?}",
        &seen_by_clients.errors[..seen_by_clients.errors.len().min(5)]
    );
    assert_eq!(ok, load.sections / clients.len() * clients.len());
    assert_eq!(crossslot, 0, "a command spanned slots");
    assert_eq!(publish, 0, "a release was published cluster-wide");
    assert!(spublish > 0, "no release was published to its shard");
    assert_eq!(moved, 0, "a command went to a node that does not own its slot");
    assert_eq!(leaks, 0, "keys left on the masters");
}
