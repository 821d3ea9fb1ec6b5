//! Connecting to Redis: start-up errors, the crate's ACL user, TLS, Sentinel; and checks of the
//! test fixture itself.
//!
//! Not run as the limited ACL user: these tests make their own servers, users and grants, or
//! check the fixture's plain URL.

#[path = "../support/mod.rs"]
mod support;

mod acl;
mod harness;
#[cfg(feature = "sentinel")]
mod sentinel;
mod startup;
#[cfg(feature = "tls")]
mod tls;
