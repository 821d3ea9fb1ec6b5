//! Faults the engine must survive without granting a lock twice or stranding it: replies lost
//! on their way back (stores wrapped to lose or hold chosen calls), forced interleavings of
//! concurrent paths, commands delivered late, servers stalled, killed and restarted, fencing
//! across restarts, and what an outage logs.
//!
//! Not run as the limited ACL user: some tests talk to the server through a proxy, and the
//! wrapped stores need the feature `unstable-backend`.

#[path = "../support/mod.rs"]
mod support;

mod fencing;
mod late_commands;
mod lost_replies;
mod outage_logs;
mod races;
mod regressions;
mod server_faults;
