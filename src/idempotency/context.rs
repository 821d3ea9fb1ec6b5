//! What a handler can learn about the idempotency key its request runs under.

use std::sync::Arc;

use crate::{LockContext, guard::Lost};

/// The idempotency key a request runs under, and the lock held on it: in the request's
/// extensions while the handler runs (an axum extractor too, with feature `axum`).
///
/// The fencing token is the one the answer is stored with. A handler whose writes must not be
/// repeated (a charge) sends it with them to a store that refuses a token lower than the
/// highest it has seen: then even a handler that ran on after its lock was lost (a paused
/// process) cannot overwrite the work of the request that took the key after it.
///
/// ```
/// # #[cfg(feature = "axum")] {
/// use axum::{Router, routing::post};
/// use tower_lock::{LockClient, idempotency::{IdempotencyContext, IdempotencyLayer, MemoryAnswerStore}};
///
/// async fn charge(key: IdempotencyContext) -> String {
///     format!("charge for key {} under token {}", key.key(), key.fencing_token())
/// }
///
/// let app: Router = Router::new()
///     .route("/charges", post(charge))
///     .route_layer(IdempotencyLayer::new(LockClient::in_memory(), MemoryAnswerStore::new()));
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct IdempotencyContext {
    key: Arc<str>,
    token: u64,
    lock: LockContext,
}

impl IdempotencyContext {
    pub(crate) fn new(key: Arc<str>, token: u64, lock: LockContext) -> Self {
        Self { key, token, lock }
    }

    /// The idempotency key, as the request sent it.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The fencing token of the key's lock, which the answer is stored with.
    pub fn fencing_token(&self) -> u64 {
        self.token
    }

    /// Resolves if the key's lock is lost while the handler runs (the layer then cancels the
    /// handler and keeps no answer).
    pub fn lost(&self) -> Lost {
        self.lock.lost()
    }

    /// Whether the key's lock is lost, checked against the clock.
    pub fn is_lost(&self) -> bool {
        self.lock.is_lost()
    }

    /// The key's lock, as a lock layer's handler sees its own.
    pub fn lock(&self) -> &LockContext {
        &self.lock
    }
}

/// A handler asked for an [`IdempotencyContext`] on a request the layer did not run under a
/// key (no key, a method the layer leaves alone, or no layer): answered 500 with a log line.
#[cfg(feature = "axum")]
impl<S: Send + Sync> axum::extract::FromRequestParts<S> for IdempotencyContext {
    type Rejection = (http::StatusCode, &'static str);

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        if let Some(context) = parts.extensions.get::<Self>() {
            return Ok(context.clone());
        }
        tracing::error!(
            target: "tower_lock::rejection",
            path = parts.uri.path(),
            "a handler takes `IdempotencyContext` but its request runs under no idempotency key: \
             add an IdempotencyLayer with `.required(true)`, or take `Option<IdempotencyContext>`"
        );
        Err((
            http::StatusCode::INTERNAL_SERVER_ERROR,
            "this route takes an idempotency context but its request runs under no key",
        ))
    }
}

/// `Option<IdempotencyContext>`: `None` when the request runs under no key.
#[cfg(feature = "axum")]
impl<S: Send + Sync> axum::extract::OptionalFromRequestParts<S> for IdempotencyContext {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _state: &S,
    ) -> Result<Option<Self>, Self::Rejection> {
        Ok(parts.extensions.get::<Self>().cloned())
    }
}
