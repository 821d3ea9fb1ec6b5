//! Idempotency keys: a retried write runs its handler once, across every instance, and gets
//! the kept answer replayed (feature `idempotency`).
//!
//! A client that lost the response to a `POST` cannot tell whether it was carried out; it
//! sends the request again with the same `Idempotency-Key` header (the IETF httpapi draft
//! `draft-ietf-httpapi-idempotency-key-header`, after Stripe). [`IdempotencyLayer`] answers
//! it the way that draft describes:
//!
//! | the request | the answer |
//! |---|---|
//! | first with its key | the handler runs under the key's lock; its response is kept (24 h by default) |
//! | the same key again, the same request | the kept response, with `Idempotent-Replayed: true`; the handler does not run |
//! | the same key while the first still runs (on any instance) | `409 Conflict` with `Retry-After` (or, with [`wait`](IdempotencyLayerBuilder::wait), the first one's answer once it is kept) |
//! | the same key, another request (method, path, query or body) | `422 Unprocessable Content` |
//! | no key, where one is [`required`](IdempotencyLayerBuilder::required) | `400 Bad Request` naming the header |
//! | an empty key, one over 255 bytes, one with bytes other than visible ASCII and spaces, the header twice | `400 Bad Request` |
//! | a key with nothing to scope it by (no `Authorization` header, by default) | `400 Bad Request` |
//! | a body over the limit read to fingerprint it (1 MiB) | `413 Content Too Large` |
//! | the lock or answer store down, or in its restart quarantine | `503` with `Retry-After` where known |
//! | a method the layer leaves alone (by default, all but POST and PATCH), or no key where none is required | runs as it is |
//!
//! ```
//! # #[cfg(feature = "axum")] {
//! use axum::{Router, routing::post};
//! use tower_lock::{LockClient, idempotency::{IdempotencyLayer, MemoryAnswerStore}};
//!
//! async fn charge() -> &'static str { "charged" }
//!
//! let locks = LockClient::in_memory();
//! let layer = IdempotencyLayer::builder(locks, MemoryAnswerStore::new())
//!     .required(true) // 400 for a charge without a key
//!     .build()
//!     .expect("valid settings");
//! let app: Router = Router::new().route("/charges", post(charge)).route_layer(layer);
//! # }
//! ```
//!
//! On Redis, the locks and the answers share the server (or the Cluster): every instance
//! built this way answers for every other.
//!
//! ```no_run
//! # #[cfg(feature = "redis")]
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use tower_lock::{LockClient, RedisBackend, idempotency::{IdempotencyLayer, RedisAnswerStore}};
//!
//! let backend = RedisBackend::connect("redis://127.0.0.1:6379").await?;
//! let locks = LockClient::builder(backend.clone()).build()?;
//! let layer = IdempotencyLayer::new(locks, RedisAnswerStore::new(backend));
//! # let _ = layer;
//! # Ok(()) }
//! ```
//!
//! # What a request with a key goes through
//!
//! 1. The key is checked, and scoped to the caller: by default by the `Authorization`
//!    header (hashed), so one client never gets another's answer; by anything else with
//!    [`scope_by`](IdempotencyLayerBuilder::scope_by) (a user id an authentication layer
//!    found); not at all only with [`unscoped(true)`](IdempotencyLayerBuilder::unscoped).
//! 2. The body is read (up to [`max_request_body`](IdempotencyLayerBuilder::max_request_body))
//!    and the request's [`Fingerprint`] taken.
//! 3. The [`AnswerStore`] is asked for the key's answer: a kept answer is replayed at once,
//!    without a lock (one round trip).
//! 4. Otherwise the key's lock is taken (try once, or [`wait`](IdempotencyLayerBuilder::wait)),
//!    with a fencing token; held elsewhere, the request is answered 409.
//! 5. The store is asked again, the lock held: another instance may have answered between
//!    steps 3 and 4.
//! 6. The handler runs. The watchdog renews the lock while it does; if the lock is lost (a
//!    store that restarted, a paused instance) the handler is dropped and the request is
//!    answered 503, nothing kept.
//! 7. A response that can be kept is kept, fenced by the lock's token: the store refuses it
//!    if a later holder of the key (after this one lost its lock) kept an answer already.
//! 8. The lock is released (in the background once the answer is kept: a retry finds the
//!    answer).
//!
//! A fresh key so costs five round trips to the stores (look, acquire, look again, keep,
//! release), four before the response leaves; a replay costs one. See the `idempotency`
//! guide for what it would take to do better.
//!
//! # What is kept
//!
//! A response whose body is all there when the handler answers (a `String`, JSON, a unary
//! gRPC reply: the layer reads it frame by frame while each frame is ready) and within
//! [`max_response_body`](IdempotencyLayerBuilder::max_response_body) (256 KiB): its status,
//! its headers but those of the connection (`connection`, `keep-alive`, `transfer-encoding`,
//! `upgrade`, `te`, `trailer`, `proxy-authenticate`, `proxy-connection`), `content-length`
//! (set again from the body), `date` and `set-cookie`; its body; its trailers (a gRPC call's
//! status).
//!
//! Nothing is kept, and the key is free again for a retry, for: a server error (5xx), an
//! answer that says "not now" (408, 409, 423, 425, 429), a gRPC status other than a client's
//! mistake (`CANCELLED`, `UNKNOWN`, `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED`, `ABORTED`,
//! `INTERNAL`, `UNAVAILABLE`, `DATA_LOSS`), the inner service's `Err`, a panic (caught above
//! the layer, by `tower_http::catch_panic`), a handler cancelled (the client went away), a
//! lost lock, a body that streams (a frame not ready at once) or that outgrows the limit
//! (both are passed on as they come).
//!
//! # gRPC
//!
//! A call with `content-type: application/grpc…` carries its key as `idempotency-key`
//! metadata and gets the layer's refusals as gRPC statuses, trailers-only: 400 as
//! `INVALID_ARGUMENT`, 409 as `ABORTED` with `grpc-retry-pushback-ms`, 413 as
//! `RESOURCE_EXHAUSTED`, 422 as `FAILED_PRECONDITION`, 503 as `UNAVAILABLE`. A unary reply is
//! kept with its trailers and replayed whole. The request's body is a [`RequestBody`]: a
//! service made by `tonic-build` takes it as it is; one fixed on `tonic::body::Body` (tonic's
//! `Routes`, behind `Server::builder().layer(..)`) gets it mapped back (the `grpc` section of
//! the `idempotency` guide shows it).
//!
//! # The handler
//!
//! The request carries an [`IdempotencyContext`]: the key and the fencing token of its lock.
//! A handler whose process dies after its side effects are committed and before the answer
//! is kept runs again on the retry, so its own writes should still be idempotent, or fenced
//! with that token. The `idempotency` guide says what is promised and what is not.

mod answer;
mod body;
mod context;
pub mod future;
mod layer;
mod locks;
#[cfg(feature = "redis")]
mod redis;
mod rejection;
mod service;
mod store;

pub use body::{RequestBody, ResponseBody};
pub use context::IdempotencyContext;
pub use future::ResponseFuture;
pub use layer::{Fingerprint, IdempotencyLayer, IdempotencyLayerBuilder};
#[cfg(feature = "redis")]
pub use redis::RedisAnswerStore;
pub use service::IdempotencyService;
pub use store::{AnswerStore, FencingBackend, MemoryAnswerStore, Put, Record};
