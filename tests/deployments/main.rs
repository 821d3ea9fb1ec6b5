//! The Redis backend on each deployment and through its faults: a single server that stalls,
//! fails or restarts (and the quarantine after a restart), replicas acknowledging grants,
//! Redlock over several masters, and a Redis Cluster.
//!
//! `scripts/test.sh` runs this binary a second time as the crate's limited ACL user.

#[path = "../support/mod.rs"]
mod support;

#[cfg(feature = "cluster")]
mod cluster;
mod quarantine;
mod redis_faults;
mod redlock;
mod replicas;
