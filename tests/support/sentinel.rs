//! A Sentinel topology on loopback: one master, one replica, three sentinels watching them.
//!
//! Sentinels notice a dead master after `down-after-milliseconds` (1 s here), agree (quorum 2)
//! and promote the replica; [`SentinelGroup::wait_for_master`] polls them until they name the
//! new one.

use std::time::{Duration, Instant};

use super::{RedisServer, RespValue};

/// The name the sentinels monitor the master under.
pub const MASTER_NAME: &str = "locks";

/// One master, one replica and three sentinels.
#[derive(Debug)]
pub struct SentinelGroup {
    /// The server that is master at the start.
    pub master: RedisServer,
    /// Its replica, promoted when the master dies.
    pub replica: RedisServer,
    /// The sentinels.
    pub sentinels: Vec<RedisServer>,
}

impl SentinelGroup {
    /// Starts the servers and the sentinels and waits until the replica is in sync and every
    /// sentinel knows the replica and the other sentinels (so a failover can be agreed on).
    ///
    /// # Panics
    /// When the topology does not come together within 20 s.
    pub fn start() -> Self {
        let master = RedisServer::start();
        let replica = start_replica_of(&master);
        let config = format!(
            "sentinel monitor {MASTER_NAME} 127.0.0.1 {} 2\n\
             sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
             sentinel failover-timeout {MASTER_NAME} 5000\n",
            master.port()
        );
        let sentinels: Vec<_> =
            (0..3).map(|_| RedisServer::start_with_config(&config, &["--sentinel"])).collect();
        let group = Self { master, replica, sentinels };
        wait_until(Duration::from_secs(20), "sentinels to discover each other", || {
            group.sentinels.iter().all(|sentinel| {
                count(sentinel, "replicas") == 1 && count(sentinel, "sentinels") == 2
            })
        });
        group
    }

    /// The sentinels' URLs.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::url).collect()
    }

    /// The port of the master the sentinels name, if they agree on one.
    pub fn master_port(&self) -> Option<u16> {
        let ports: Vec<Option<u16>> = self.sentinels.iter().map(named_master).collect();
        ports.windows(2).all(|w| w[0] == w[1]).then(|| ports[0])?
    }

    /// Waits until every sentinel names the server on `port` as master and that server says
    /// it is one.
    ///
    /// # Panics
    /// After `timeout`.
    pub fn wait_for_master(&self, server: &RedisServer, timeout: Duration) {
        wait_until(timeout, "the sentinels to promote the replica", || {
            self.master_port() == Some(server.port()) && role(server).as_deref() == Some("master")
        });
    }
}

/// Starts a replica of `master` and waits until it is in sync.
///
/// # Panics
/// When it does not sync within 10 s.
pub fn start_replica_of(master: &RedisServer) -> RedisServer {
    // By default a master waits 5 s for more replicas before the first sync.
    master.cmd(&["CONFIG", "SET", "repl-diskless-sync-delay", "0"]);
    let port = master.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    wait_until(Duration::from_secs(10), "the replica to sync", || {
        replica.info("replication").is_ok_and(|info| info.contains("master_link_status:up"))
    });
    replica
}

/// Polls `done` every 20 ms until it holds.
///
/// # Panics
/// After `timeout`, naming what was awaited.
pub fn wait_until(timeout: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How many replicas or sentinels (`what`) a sentinel knows for the master.
fn count(sentinel: &RedisServer, what: &str) -> usize {
    match sentinel.try_cmd(&["SENTINEL", what, MASTER_NAME]) {
        Ok(RespValue::Array(Some(items))) => items.len(),
        _ => 0,
    }
}

/// The master port a sentinel names.
fn named_master(sentinel: &RedisServer) -> Option<u16> {
    match sentinel.try_cmd(&["SENTINEL", "get-master-addr-by-name", MASTER_NAME]) {
        Ok(RespValue::Array(Some(items))) if items.len() == 2 => items[1].as_str()?.parse().ok(),
        _ => None,
    }
}

/// The role a server reports (`master` or `slave`), if it answers.
fn role(server: &RedisServer) -> Option<String> {
    match server.try_cmd(&["ROLE"]) {
        Ok(RespValue::Array(Some(items))) => items.first()?.as_str(),
        _ => None,
    }
}
