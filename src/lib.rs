//! Distributed locks for tower and axum services, correct by default.
//!
//! [`LockLayer`] serializes requests per resource across every instance of a service: it takes
//! a key from each request, holds that key's lock while the request runs, and releases it when
//! the response is ready, on every path (see [`middleware`]). Underneath, [`LockClient`] is a
//! lock engine usable on its own: reentrant locks in Redis (or in process) that a watchdog keeps
//! alive while they are held, waiters woken by notification instead of polling, fair and
//! read-write locks, fencing tokens, and guards that tell the holder the moment a lock is lost.
//!
//! ```
//! use std::time::Duration;
//! use tower_lock::{Lease, LockClient, MemoryBackend};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let locks = LockClient::builder(MemoryBackend::new())
//!     .lease(Lease::watchdog(Duration::from_secs(30)))
//!     .build()?;
//!
//! let guard = locks.lock("account:7").acquire().await?;
//! // ... read, modify and write account 7; no other holder can be here ...
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Lock kinds
//!
//! - [`LockClient::lock`]: exclusive and reentrant; waiters in one process queue locally and a
//!   release hands the lock straight to the next of them.
//! - [`LockClient::fair_lock`]: exclusive, reentrant, and granted in FIFO order across every
//!   process.
//! - [`LockClient::read_write_lock`]: many readers or one writer, with writer preference.
//!
//! # What is guaranteed, and what is not
//!
//! - At most one holder at a time, **as long as pauses, network delays and clock-rate errors
//!   stay below the lease**. A holder whose process stalls past its lease can wake up believing
//!   it still holds the lock. The guard notices from its own clock ([`LockGuard::is_lost`],
//!   [`LockGuard::lost`]), but a write it already sent cannot be recalled. For that case ask for
//!   a fencing token ([`LockRequest::fencing`]) and have the store reject writes carrying an
//!   older token than it has seen: it is the only defence that does not depend on timing.
//! - Redis replication is asynchronous. When a master fails over, a replica promoted before it
//!   received a lock may grant the same lock again.
//! - A crashed holder's lock is freed within one lease; a clean release frees it at once and
//!   wakes the next waiter.
//!
//! # Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `redis` | yes | [`RedisBackend`]: Redis through bb8-redis and redis-rs |
//! | `axum` | no | `key::path_param`, route namespacing by axum's `MatchedPath`, `IntoResponse` for [`LockRejection`] |
//!
//! The minimum supported Rust version is 1.88.

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backend;
mod client;
mod clock;
pub mod error;
mod guard;
mod holder;
pub mod key;
mod lease;
mod local;
pub mod middleware;
mod watchdog;

#[cfg(feature = "redis")]
pub use backend::redis::{RedisBackend, RedisBackendBuilder};
pub use backend::{Backend, LockKind, memory::MemoryBackend};
pub use client::{LockClient, LockClientBuilder, LockRequest, ReadWriteLock};
pub use error::{BackendError, ConfigError, LockError};
pub use guard::{LockGuard, Lost};
pub use holder::Holder;
pub use key::LockKey;
pub use lease::Lease;
pub use middleware::{LockContext, LockLayer, LockRejection, LockService};
