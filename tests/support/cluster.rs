//! Test fixture: a Redis Cluster of three masters, each with one replica, made of six
//! [`RedisServer`]s and formed with plain cluster commands (no `redis-cli`).
//!
//! The nodes use a one-second node timeout, so a killed master's replica takes over within a
//! few seconds, and `cluster-require-full-coverage no`, so the surviving masters keep serving
//! while one shard has no master.

use std::{
    collections::HashMap,
    thread,
    time::{Duration, Instant},
};

use super::{RedisServer, RespValue};

/// The cluster's node timeout, in milliseconds.
pub const NODE_TIMEOUT_MS: u64 = 1000;
/// How long the cluster may take to form, or to settle after a change.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a killed master's replica gets to win its election before the fixture forces the
/// takeover.
const ELECTION_TIMEOUT: Duration = Duration::from_secs(4);
/// How often cluster state is polled.
const POLL: Duration = Duration::from_millis(20);
/// Masters (and so shards) in the cluster.
const MASTERS: usize = 3;
/// Hash slots in a Redis Cluster.
const SLOTS: u16 = 16384;

/// A running 3 + 3 cluster; every node is killed on drop.
#[derive(Debug)]
pub struct RedisCluster {
    /// Nodes 0..3 start as masters, node `3 + i` as the replica of node `i`.
    nodes: Vec<RedisServer>,
    /// Each node's cluster id, by index.
    ids: Vec<String>,
}

/// One line of `CLUSTER NODES`.
#[derive(Debug)]
struct NodeLine {
    id: String,
    port: u16,
    flags: String,
    master: String,
    slots: Vec<(u16, u16)>,
}

impl RedisCluster {
    /// Starts six nodes, assigns the slots evenly to the first three, attaches one replica to
    /// each, and waits until every node reports `cluster_state:ok` and every replica's link to
    /// its master is up.
    ///
    /// # Panics
    /// When a node does not start or the cluster does not form in time.
    pub fn start() -> Self {
        let args = [
            "--cluster-enabled",
            "yes",
            // Relative to the server's own dir (`--dir`), so each node has its own.
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            &NODE_TIMEOUT_MS.to_string(),
            "--cluster-require-full-coverage",
            "no",
            "--cluster-replica-validity-factor",
            "0",
        ]
        .map(str::to_owned);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let nodes: Vec<RedisServer> =
            (0..2 * MASTERS).map(|_| RedisServer::start_with(&args)).collect();
        let ids = nodes.iter().map(|node| text(&node.cmd(&["CLUSTER", "MYID"]))).collect();
        let cluster = Self { nodes, ids };
        let per_master = SLOTS / MASTERS as u16 + 1;
        for i in 0..MASTERS {
            let first = i as u16 * per_master;
            let last = ((i as u16 + 1) * per_master - 1).min(SLOTS - 1);
            cluster.ok(i, &["CLUSTER", "ADDSLOTSRANGE", &first.to_string(), &last.to_string()]);
        }
        for i in 1..cluster.nodes.len() {
            let port = cluster.nodes[i].port().to_string();
            cluster.ok(0, &["CLUSTER", "MEET", "127.0.0.1", &port]);
        }
        cluster.wait("every node to know every other", || {
            (0..cluster.nodes.len()).all(|i| cluster.nodes_seen_by(i).len() == cluster.nodes.len())
        });
        for i in 0..MASTERS {
            let master = cluster.ids[i].clone();
            cluster.ok(MASTERS + i, &["CLUSTER", "REPLICATE", &master]);
        }
        cluster.wait_settled();
        cluster
    }

    /// The URLs of the running nodes, to connect a cluster client with.
    pub fn urls(&self) -> Vec<String> {
        self.running().map(|i| self.nodes[i].url()).collect()
    }

    /// Node `i`.
    pub fn node(&self, i: usize) -> &RedisServer {
        &self.nodes[i]
    }

    /// The slot of `key` (`CLUSTER KEYSLOT`).
    pub fn slot_of(&self, key: &str) -> u16 {
        let i = self.running().next().expect("a running node");
        u16::try_from(self.nodes[i].cmd(&["CLUSTER", "KEYSLOT", key]).as_int())
            .expect("a slot number")
    }

    /// The index of the master that serves `slot`, as a running node sees it.
    pub fn owner_of_slot(&self, slot: u16) -> usize {
        let i = self.running().next().expect("a running node");
        self.nodes_seen_by(i)
            .iter()
            .find(|line| {
                line.flags.contains("master")
                    && !line.flags.contains("fail")
                    && line.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
            })
            .map(|line| self.index_of_port(line.port))
            .unwrap_or_else(|| panic!("no master serves slot {slot}"))
    }

    /// The index of the master that serves the slot of `key`.
    pub fn owner_of(&self, key: &str) -> usize {
        self.owner_of_slot(self.slot_of(key))
    }

    /// The running masters' indexes.
    pub fn masters(&self) -> Vec<usize> {
        self.running().filter(|&i| self.is_master(i)).collect()
    }

    /// Moves `slot` with its keys to master `to`, the way a resharding tool does: `IMPORTING`
    /// on the target, `MIGRATING` on the source, `MIGRATE ... KEYS` of every key, then
    /// `SETSLOT ... NODE` on every master.
    ///
    /// # Panics
    /// When a step fails or the masters do not agree on the new owner in time.
    pub fn migrate_slot(&self, slot: u16, to: usize) {
        let from = self.owner_of_slot(slot);
        assert_ne!(from, to, "slot {slot} is already on node {to}");
        let slot_arg = slot.to_string();
        self.ok(to, &["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", &self.ids[from]]);
        self.ok(from, &["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &self.ids[to]]);
        let port = self.nodes[to].port().to_string();
        loop {
            let keys = match self.nodes[from].cmd(&["CLUSTER", "GETKEYSINSLOT", &slot_arg, "100"]) {
                RespValue::Array(Some(keys)) => keys.iter().map(text).collect::<Vec<_>>(),
                other => panic!("unexpected GETKEYSINSLOT reply {other:?}"),
            };
            if keys.is_empty() {
                break;
            }
            let mut migrate = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            migrate.extend(keys.iter().map(String::as_str));
            self.ok(from, &migrate);
        }
        let masters: Vec<usize> = self.running().filter(|&i| self.is_master(i)).collect();
        // The target first, so it serves the slot before the source starts redirecting.
        for i in std::iter::once(to).chain(masters.into_iter().filter(|&i| i != to)) {
            self.ok(i, &["CLUSTER", "SETSLOT", &slot_arg, "NODE", &self.ids[to]]);
        }
        self.wait("every node to see the slot's new owner", || {
            self.running().all(|i| {
                self.nodes_seen_by(i).iter().any(|line| {
                    line.id == self.ids[to]
                        && line.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
                })
            })
        });
    }

    /// Kills master `i` (SIGKILL) and waits until its replica is promoted and every running
    /// node reports `cluster_state:ok` again; forces the takeover on the replica when the
    /// election takes longer than a few seconds. Returns the promoted replica's index.
    ///
    /// # Panics
    /// When `i` has no replica or the promotion does not happen in time.
    pub fn kill_master(&mut self, i: usize) -> usize {
        let replica = self.replica_of(i);
        self.nodes[i].kill();
        let deadline = Instant::now() + ELECTION_TIMEOUT;
        while !self.is_master(replica) && Instant::now() < deadline {
            thread::sleep(POLL);
        }
        if !self.is_master(replica) {
            self.ok(replica, &["CLUSTER", "FAILOVER", "TAKEOVER"]);
        }
        self.wait("the replica to be promoted", || self.is_master(replica));
        self.wait_settled();
        replica
    }

    /// Waits until the replica of master `i` has applied every write `i` made before the call
    /// (its replication offset reaches the master's), so that a failover from then on loses
    /// none of them. Replication is asynchronous: without this, a write made just before the
    /// master dies may never reach the replica.
    ///
    /// # Panics
    /// When `i` has no replica or the replica does not catch up in time.
    pub fn wait_replicated(&self, i: usize) {
        let replica = self.replica_of(i);
        let written = self.replication_offset(i, "master_repl_offset");
        self.wait("the replica to apply its master's writes", || {
            self.replication_offset(replica, "slave_repl_offset") >= written
        });
    }

    /// The running replica of master `i`.
    fn replica_of(&self, i: usize) -> usize {
        self.running()
            .find(|&r| {
                self.nodes_seen_by(r)
                    .iter()
                    .any(|line| line.id == self.ids[r] && line.master == self.ids[i])
            })
            .unwrap_or_else(|| panic!("node {i} has no replica"))
    }

    /// The `field` of node `i`'s `INFO replication`, a replication offset.
    fn replication_offset(&self, i: usize, field: &str) -> u64 {
        let info = text(&self.nodes[i].cmd(&["INFO", "replication"]));
        info.lines()
            .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|offset| offset.trim().parse().ok())
            .unwrap_or_else(|| panic!("node {i}: no {field} in INFO replication"))
    }

    /// Indexes of the nodes still running.
    fn running(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nodes.len()).filter(|&i| self.nodes[i].try_cmd(&["PING"]).is_ok())
    }

    /// Waits until every running node says `cluster_state:ok`, every running replica's link
    /// is up, and all of them agree on which master serves every slot.
    fn wait_settled(&self) {
        self.wait("the cluster to settle", || {
            let running: Vec<usize> = self.running().collect();
            let ok = running.iter().all(|&i| {
                let info = text(&self.nodes[i].cmd(&["CLUSTER", "INFO"]));
                info.contains("cluster_state:ok")
            });
            let replicas_up = running.iter().all(|&i| {
                let replication = text(&self.nodes[i].cmd(&["INFO", "replication"]));
                replication.contains("role:master") || replication.contains("master_link_status:up")
            });
            let views: Vec<Vec<(u16, u16, String)>> = running
                .iter()
                .map(|&i| {
                    let mut owned: Vec<(u16, u16, String)> = self
                        .nodes_seen_by(i)
                        .into_iter()
                        .filter(|line| {
                            line.flags.contains("master") && !line.flags.contains("fail")
                        })
                        .flat_map(|line| {
                            line.slots
                                .iter()
                                .map(|&(a, b)| (a, b, line.id.clone()))
                                .collect::<Vec<_>>()
                        })
                        .collect();
                    owned.sort();
                    owned
                })
                .collect();
            let covered = views.first().is_some_and(|view| {
                view.iter().map(|&(a, b, _)| u32::from(b - a) + 1).sum::<u32>() == u32::from(SLOTS)
            });
            ok && replicas_up && covered && views.windows(2).all(|pair| pair[0] == pair[1])
        });
    }

    /// Whether node `i` runs as a master.
    fn is_master(&self, i: usize) -> bool {
        matches!(self.nodes[i].try_cmd(&["ROLE"]),
            Ok(RespValue::Array(Some(role))) if text(&role[0]) == "master")
    }

    /// `CLUSTER NODES` as node `i` sees it.
    fn nodes_seen_by(&self, i: usize) -> Vec<NodeLine> {
        text(&self.nodes[i].cmd(&["CLUSTER", "NODES"]))
            .lines()
            .filter_map(parse_node_line)
            .collect()
    }

    fn index_of_port(&self, port: u16) -> usize {
        let ports: HashMap<u16, usize> =
            self.nodes.iter().enumerate().map(|(i, node)| (node.port(), i)).collect();
        ports[&port]
    }

    /// Sends a command that must answer `+OK`.
    fn ok(&self, i: usize, args: &[&str]) {
        let reply = self.nodes[i].cmd(args);
        assert_eq!(reply, RespValue::Simple("OK".to_owned()), "node {i}: {args:?}");
    }

    /// Polls `done` until it holds; panics after [`SETTLE_TIMEOUT`].
    fn wait(&self, what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        while !done() {
            assert!(Instant::now() < deadline, "cluster: timed out waiting for {what}");
            thread::sleep(POLL);
        }
    }
}

/// Parses `<id> <ip:port@cport> <flags> <master> <ping> <pong> <epoch> <link> <slot>...`;
/// importing and migrating markers (`[...]`) are skipped.
fn parse_node_line(line: &str) -> Option<NodeLine> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let [id, addr, flags, master, _, _, _, _, slots @ ..] = fields.as_slice() else {
        return None;
    };
    let port = addr.split(['@', ',']).next()?.rsplit(':').next()?.parse().ok()?;
    let slots = slots
        .iter()
        .filter(|slot| !slot.starts_with('['))
        .filter_map(|slot| match slot.split_once('-') {
            Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
            None => slot.parse().ok().map(|s| (s, s)),
        })
        .collect();
    Some(NodeLine {
        id: (*id).to_owned(),
        port,
        flags: (*flags).to_owned(),
        master: (*master).to_owned(),
        slots,
    })
}

/// A reply as text, for bulk and simple strings; empty otherwise.
fn text(value: &RespValue) -> String {
    value.as_str().unwrap_or_default()
}
