//! `LockLayer` and `#[locked]` in front of HTTP services: keys, rejections, bodies, nesting,
//! holder names, and the metrics they record.
//!
//! `scripts/test.sh` runs this binary a second time as the crate's limited ACL user.

#[path = "../support/mod.rs"]
mod support;

mod layer;
mod locked;
#[cfg(feature = "metrics")]
mod metrics;
mod names;
