//! Tower middleware that serializes requests per resource.
//!
//! [`LockLayer`] takes a key from each request ([`key`](crate::key) extractors), acquires the
//! lock of that key (waiting up to `wait`), calls the inner service only once the lock is held,
//! keeps it renewed while the response future runs, and releases it when that future completes,
//! before the response is handed back. On every other path it is released too: an `Err`, a
//! panic caught by a layer above, a dropped future (client disconnect, an outer timeout). A
//! request that gives up while waiting leaves nothing behind.
//!
//! ```
//! # #[cfg(feature = "axum")] {
//! use std::time::Duration;
//! use axum::{Router, routing::post};
//! use tower_lock::{LockClient, LockLayer, key};
//!
//! async fn withdraw() -> &'static str { "ok" }
//!
//! let locks = LockClient::in_memory();
//! let app: Router = Router::new()
//!     .route("/accounts/{id}/withdraw", post(withdraw))
//!     .route_layer(
//!         LockLayer::new(locks.clone())
//!             .key(key::path_param("id").prefixed("account:"))
//!             .wait(Duration::from_secs(2)),
//!     );
//! # }
//! ```
//!
//! # How the lock's lifetime maps to the request's
//!
//! | request | lock |
//! |---|---|
//! | arrives | key extracted; a missing or invalid key is answered 400 at once |
//! | waits | queued behind other waiters; 423 with `Retry-After` after `wait` |
//! | runs | held, renewed by the watchdog; in the request: [`LockContext`], the holder |
//! | response ready (`Ok` or `Err`) | released, then the response is handed back |
//! | lock lost while running | the handler's future is dropped, 503 (or it continues, if configured) |
//! | future dropped (client gone, timeout) | released in the background |
//! | response body streams | with [`LockLayer::hold_until_body_ends`]: held and renewed until the body ends, fails or is dropped ([`body`]) |
//!
//! # Rejections
//!
//! See [`LockRejection`] for the status of each. Bodies are one line of text where the body
//! type carries text, unless [`LockLayer::on_rejected`] builds them; rejections are logged on
//! target `tower_lock::rejection` (a client's mistake as a warning, a busy lock at debug and in
//! the metrics). A gRPC call is answered as a gRPC status by default (feature `grpc`).
//!
//! # Keys and namespaces
//!
//! A lock is named by the resource it protects, not by the endpoint: the layer's
//! [`name`](LockLayer::name) when set, else what the key says of its resource
//! ([`MakeKey::namespace`](crate::key::MakeKey::namespace)), plus the extracted key.
//! `key::path_param("id")` on `/accounts/{id}/withdraw` and on `/accounts/{id}/deposit` both
//! lock `/accounts/:id` + the id, and `#[locked(key = "{id}")]` on either route takes the same
//! lock; `/orders/{id}` with the same id never shares it. A key with text of its own
//! (`path_param("id").prefixed("account:")`, `#[locked(key = "account:{id}")]`) names its
//! resource and takes the same lock on every route: `account:7` for account 7, as
//! `locks.lock("account:7")`; beside it, a bare key's lock for the same account is another lock,
//! which does not exclude it. A header, query or closure key without a
//! prefix locks per matched route, so two resources never share a lock by accident. Each request has one [`Holder`](crate::Holder), stored in
//! its extensions and current while the inner service runs, so a nested layer or a direct
//! [`LockClient`](crate::LockClient) call on the same lock re-enters it. With feature `macros`
//! the request's [`LockContext`] also carries the layer's client, which a `#[locked]` handler
//! under it uses, re-entering the layer's lock when it names the same.

#[cfg(feature = "macros")]
pub(crate) mod attribute;
pub mod body;
mod context;
#[cfg(feature = "macros")]
mod erased;
pub mod future;
mod hold;
mod layer;
mod names;
mod rejection;
mod service;

pub use context::LockContext;
#[cfg(feature = "macros")]
pub use erased::AnyLockClient;
pub use layer::LockLayer;
#[cfg(feature = "grpc")]
pub(crate) use rejection::pushback_ms;
pub use rejection::{DefaultRejection, LockRejection, OnRejected};
pub use service::LockService;
#[cfg(feature = "axum")]
pub(crate) use service::route;

/// The key slot of a [`LockLayer`] before [`LockLayer::key`] is called; such a layer cannot be
/// used. (`T` only carries the compile error that says so.)
#[derive(Clone, Copy, Debug, Default)]
pub struct MakeKeyUnset<T = ()>(std::marker::PhantomData<T>);

/// Never implemented: a layer used without a key fails to compile with this message, rather
/// than with the closure bound of `MakeKey`'s blanket implementation.
#[diagnostic::on_unimplemented(
    message = "this `LockLayer` has no key: call `.key(..)` on it",
    label = "a `LockLayer` without `.key(..)`",
    note = "for example `.key(key::path_param(\"id\"))`; see `tower_lock::key` for the others"
)]
#[doc(hidden)]
pub trait KeyIsSet {}

impl<T: KeyIsSet + Clone + Send + Sync + 'static> crate::key::MakeKey for MakeKeyUnset<T> {
    fn make_key(&self, _parts: &mut http::request::Parts) -> Option<Vec<u8>> {
        None
    }
}
