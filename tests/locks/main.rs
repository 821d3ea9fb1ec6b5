//! The locks themselves, on the in-memory store and on a real `redis-server`: exclusion,
//! re-entry, leases, fair and read-write locks, semaphores, sets of keys, inspection, waiter
//! caps, keyed-hash names and bad input.
//!
//! `scripts/test.sh` runs this binary a second time as the crate's limited ACL user.

#[path = "../support/mod.rs"]
mod support;

mod bad_input;
mod engine;
mod fair_rw;
mod fixed_lease;
mod inspect;
mod key_fuzz;
#[cfg(feature = "keyed-hash")]
mod keyed_hash;
mod multi_key;
mod reentry;
mod semaphore;
mod waiter_caps;
