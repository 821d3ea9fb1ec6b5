//! Guides: how to use tower-lock, what each option does and what it costs.
//!
//! Each guide is a page of prose with examples that are compiled, and run where they need no
//! Redis server, as part of the crate's tests. Guides whose subject needs a cargo feature are
//! only built with it (docs.rs builds every feature).
//!
//! | guide | about | feature |
//! |---|---|---|
//! | `layer` | `LockLayer`: its options, how a request's lock lives, rejections, lock names | |
//! | `attribute` | `#[locked(...)]` on an axum handler, and how it maps to the layer | `macros` |
//! | `locks` | the lock engine: leases and the watchdog, guards, reentrancy, fair and read-write locks, fencing tokens, who holds a lock and force-unlocking it | |
//! | `backends` | choosing a backend; one Redis node; sharing an application's pool | `redis` |
//! | `failover` | Sentinel, replica acknowledgement (`WAIT`, `WAITAOF`), the quarantine after a restart | `redis` |
//! | `redlock` | one lock over several independent Redis masters | `redis` |
//! | `cluster` | Redis Cluster | `cluster` |
//! | `security` | untrusted keys, keyed hashing, caps, the Redis ACL, TLS | |
//! | `errors` | what each error means and what the layer answers | |
//! | `metrics` | the metrics recorded through the `metrics` facade | `metrics` |
//! | `grpc` | a tonic gRPC service: rejections as gRPC statuses, keys from metadata, the method or the message, server streams | `grpc` |
//! | `idempotency` | idempotency keys: a retried write runs once across instances and gets its kept answer; what is promised, what is kept, the cost | `idempotency` |
//! | `testing` | testing code that takes locks; how the crate itself is tested | |

#[doc = include_str!("layer.md")]
pub mod layer {}

#[cfg(feature = "macros")]
#[doc = include_str!("attribute.md")]
pub mod attribute {}

#[doc = include_str!("locks.md")]
pub mod locks {}

#[cfg(feature = "redis")]
#[doc = include_str!("backends.md")]
pub mod backends {}

#[cfg(feature = "redis")]
#[doc = include_str!("failover.md")]
pub mod failover {}

#[cfg(feature = "redis")]
#[doc = include_str!("redlock.md")]
pub mod redlock {}

#[cfg(feature = "cluster")]
#[doc = include_str!("cluster.md")]
pub mod cluster {}

#[doc = include_str!("security.md")]
pub mod security {}

#[doc = include_str!("errors.md")]
pub mod errors {}

#[cfg(feature = "metrics")]
#[doc = include_str!("metrics.md")]
pub mod metrics {}

#[cfg(feature = "grpc")]
#[doc = include_str!("grpc.md")]
pub mod grpc {}

#[cfg(feature = "idempotency")]
#[doc = include_str!("idempotency.md")]
pub mod idempotency {}

#[doc = include_str!("testing.md")]
pub mod testing {}
