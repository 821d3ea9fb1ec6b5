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
//! # A service on Redis
//!
//! With features `axum` and `redis` (the default), an axum service whose withdrawals run one at
//! a time per account, across every instance that shares the Redis. The key's prefix names the
//! resource: the layer takes the lock `account:7` for account 7, the lock
//! `locks.lock("account:7")` and `#[locked(key = "account:{id}")]` take (below), whatever the
//! route. A bare `key::path_param("id")` would take the route's lock instead (`/accounts/:id`
//! and the id), which none of those exclude: see "Lock names" in [`guide::layer`].
//!
#![cfg_attr(all(feature = "axum", feature = "redis"), doc = "```no_run")]
#![cfg_attr(not(all(feature = "axum", feature = "redis")), doc = "```ignore")]
//! use std::time::Duration;
//!
//! use axum::{Router, extract::Path, routing::post};
//! use tower_lock::{Lease, LockClient, LockLayer, RedisBackend, key};
//!
//! async fn withdraw(Path(id): Path<String>) -> String {
//!     // Read the balance, change it, write it back: one request per account at a time.
//!     format!("withdrew from account {id}")
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let backend = RedisBackend::connect("redis://127.0.0.1:6379").await?;
//!     let locks = LockClient::builder(backend).build()?;
//!     let app = Router::new()
//!         .route("/accounts/{id}/withdraw", post(withdraw))
//!         .route_layer(
//!             LockLayer::new(locks)
//!                 .key(key::path_param("id").prefixed("account:")) // the lock `account:<id>`
//!                 .wait(Duration::from_secs(2))                    // then 423 Locked + Retry-After
//!                 .lease(Lease::watchdog(Duration::from_secs(30))), // renewed while the handler runs
//!         );
//!     let listener = tokio::net::TcpListener::bind("0.0.0.0:3000").await?;
//!     axum::serve(listener, app).await?;
//!     Ok(())
//! }
//! ```
//!
//! # Attribute
//!
//! With feature `macros`, the `locked` attribute holds a lock while one axum handler runs, with
//! the key written over the handler's bindings. Its `"account:{id}"` takes the lock
//! `account:7` for account 7, with the same rejections, as the [`LockLayer`] beside it does
//! with `key::path_param("id").prefixed("account:")`:
//!
#![cfg_attr(feature = "macros", doc = "```")]
#![cfg_attr(not(feature = "macros"), doc = "```ignore")]
//! use std::time::Duration;
//! use axum::{Extension, Router, extract::Path, routing::post};
//! use tower_lock::{AnyLockClient, LockClient, LockContext, LockLayer, key::{self, MakeKey}, locked};
//!
//! #[locked(key = "account:{id}", wait = "2s", fencing)]
//! async fn withdraw(Path(id): Path<u64>, lock: LockContext) -> String {
//!     format!("account {id}, token {:?}", lock.fencing_token())
//! }
//!
//! let locks = LockClient::in_memory();
//! let with_attribute: Router = Router::new()
//!     .route("/accounts/{id}/withdraw", post(withdraw))
//!     .layer(Extension(AnyLockClient::from(locks.clone())));
//!
//! async fn plain_withdraw(Path(id): Path<u64>) -> String {
//!     format!("account {id}")
//! }
//! let with_layer: Router = Router::new()
//!     .route("/accounts/{id}/withdraw", post(plain_withdraw))
//!     .route_layer(
//!         LockLayer::new(locks)
//!             .key(key::path_param("id").prefixed("account:"))
//!             .wait(Duration::from_secs(2))
//!             .fencing(),
//!     );
//! # let _ = (with_attribute, with_layer);
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
//! # Guides
//!
//! The [`guide`] module holds the long-form documentation, with examples that are compiled and
//! tested: [`guide::layer`] (the layer's options, a request's lock, rejections, lock names),
//! `guide::attribute` (`#[locked]`), [`guide::locks`] (leases, guards, reentrancy, fair and
//! read-write locks, fencing), `guide::backends`, `guide::failover` (Sentinel, replica
//! acknowledgement, the quarantine after a restart), `guide::redlock`, `guide::cluster`,
//! [`guide::security`], [`guide::errors`], `guide::metrics`, `guide::grpc` (tonic services),
//! `guide::idempotency` (idempotency keys) and [`guide::testing`]. The guides
//! about a feature are built with it: `cargo doc --open --all-features` builds them all.
//!
//! # Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `redis` | yes | `RedisBackend`: Redis through bb8-redis and redis-rs; `RedlockBackend` over several masters |
//! | `axum` | no | `key::path_param`, route namespacing by axum's `MatchedPath`, `IntoResponse` for [`LockRejection`] |
//! | `keyed-hash` | no | `LockClientBuilder::keyed_hash`: lock names hashed under a secret (HMAC-SHA256) |
//! | `metrics` | no | counters and histograms through the `metrics` facade ([`metrics`] lists them) |
//! | `sentinel` | no | `RedisBackend::sentinel`: the master found through Redis Sentinel, followed across failovers |
//! | `cluster` | no | `RedisBackend::cluster`: Redis Cluster, with sharded pub/sub |
//! | `tls` | no | `rediss://` URLs and custom CAs for the Redis backend (rustls) |
//! | `macros` | no | the `#[locked(...)]` attribute and `AnyLockClient` (implies `axum`) |
//! | `serde` | no | `Serialize` and `Deserialize` for [`LockInfo`] and its parts |
//! | `grpc` | no | `grpc::GrpcRejection`: rejections as gRPC statuses with a retry pushback, `key::grpc_method`; no gRPC library needed |
//! | `tonic` | no | implies `grpc`: `LockError` and `LockRejection` into `tonic::Status` (tonic 0.14), `NamedService` for a layered service, `grpc::MethodLocks` (a lock layer per gRPC method) |
//! | `retry` | no | `retry::RetryAfterPolicy`: a `tower::retry` policy for clients (hyper, a tonic `Channel`) that honours `Retry-After` and `grpc-retry-pushback-ms` within a cap and a retry budget |
//! | `idempotency` | no | `IdempotencyLayer` (module `idempotency`): a write with an `Idempotency-Key` runs once across instances, its answer kept and replayed |
//!
//! The minimum supported Rust version is 1.88.

#![cfg_attr(docsrs, feature(doc_cfg))]

// The unit tests share the integration tests' fixture, which names this crate by its name.
#[cfg(all(test, feature = "redis"))]
extern crate self as tower_lock;
/// The integration tests' fixture: real `redis-server` processes for the unit tests.
#[cfg(all(test, feature = "redis"))]
#[path = "../tests/support/mod.rs"]
mod test_support;

pub mod backend;
mod client;
mod clock;
mod engine;
pub mod error;
#[cfg(feature = "grpc")]
pub mod grpc;
mod guard;
pub mod guide;
mod holder;
#[cfg(feature = "idempotency")]
pub mod idempotency;
pub mod inspect;
pub mod key;
mod lease;
mod lock_key;
pub mod metrics;
pub mod middleware;
mod multi_guard;
#[cfg(feature = "retry")]
pub mod retry;
mod scratch;

#[cfg(feature = "redis")]
pub use backend::redis::{RedisBackend, RedisBackendBuilder};
#[cfg(feature = "redis")]
pub use backend::redlock::{RedlockBackend, RedlockBackendBuilder};
pub use backend::{Backend, LockKind, memory::MemoryBackend};
pub use client::{
    LockClient, LockClientBuilder, LockRequest, MultiLockError, MultiLockRequest, ReadWriteLock,
};
pub use error::{BackendError, ConfigError, LockError};
pub use guard::{LockGuard, Lost};
pub use holder::Holder;
#[cfg(feature = "idempotency")]
pub use idempotency::IdempotencyLayer;
pub use inspect::{HolderInfo, LockInfo, Permits};
pub use lease::Lease;
pub use lock_key::LockKey;
#[cfg(feature = "macros")]
pub use middleware::AnyLockClient;
pub use middleware::{LockContext, LockLayer, LockRejection, LockService};
pub use multi_guard::MultiGuard;

/// Holds a distributed lock while an axum handler runs (feature `macros`).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use axum::{Extension, Router, body::Body, extract::Path, routing::post};
/// use http::{Request, StatusCode};
/// use tower::ServiceExt;
/// use tower_lock::{AnyLockClient, LockClient, LockContext, locked};
///
/// #[locked(key = "account:{id}", wait = "2s", fencing)]
/// async fn withdraw(Path(id): Path<u64>, lock: LockContext) -> String {
///     format!("account {id}, token {:?}", lock.fencing_token())
/// }
///
/// let app = Router::new()
///     .route("/accounts/{id}/withdraw", post(withdraw))
///     .layer(Extension(AnyLockClient::from(LockClient::in_memory())));
/// let request = Request::post("/accounts/7/withdraw").body(Body::empty())?;
/// assert_eq!(app.oneshot(request).await?.status(), StatusCode::OK);
/// # Ok(())
/// # }
/// ```
///
/// More in the `attribute` guide (`tower_lock::guide::attribute`).
///
/// # Reference
///
#[cfg(feature = "macros")]
pub use tower_lock_macros::locked;

/// Support code that the `#[locked]` expansion calls; not a public API.
#[cfg(feature = "macros")]
#[doc(hidden)]
pub mod __private {
    pub use crate::middleware::attribute::*;
    pub use crate::{Lease, LockContext, LockKind};
    pub use std::{format, time::Duration};
}
