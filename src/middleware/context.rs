//! What a handler can learn about the lock its request holds.

use std::sync::Arc;

use crate::{Backend, LockGuard, LockKey, engine::Held, guard::Lost, holder::Holder};

/// The lock held for the current request: an axum extractor (`lock: LockContext`) under a
/// [`LockLayer`](super::LockLayer), which puts it into the request's extensions (so
/// `Extension<LockContext>` works too), and under `#[locked]`, which supplies it.
///
/// ```
/// # #[cfg(feature = "axum")] {
/// use axum::{Router, routing::post};
/// use tower_lock::{LockClient, LockContext, LockLayer, key};
///
/// async fn withdraw(lock: LockContext) -> String {
///     format!("holding {}", lock.key())
/// }
///
/// let app: Router = Router::new()
///     .route("/accounts/{id}/withdraw", post(withdraw))
///     .route_layer(LockLayer::new(LockClient::in_memory()).key(key::path_param("id")));
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct LockContext {
    pub(crate) key: LockKey,
    pub(crate) holder: Holder,
    pub(crate) fencing_token: Option<u64>,
    pub(crate) held: Arc<Held>,
}

impl LockContext {
    /// What a request handler may know of the lock `guard` holds.
    pub(crate) fn of<B: Backend>(guard: &LockGuard<B>) -> Self {
        let held = guard.entry();
        Self {
            key: held.key.clone(),
            holder: held.holder.clone(),
            fencing_token: held.token,
            held: held.clone(),
        }
    }

    /// The lock's name in the backend.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// The request's holder.
    pub fn holder(&self) -> &Holder {
        &self.holder
    }

    /// The fencing token, when the layer was configured with `fencing()`: send it with every
    /// write to a store that rejects writes carrying an older token than it has seen.
    pub fn fencing_token(&self) -> Option<u64> {
        self.fencing_token
    }

    /// Resolves if the lock is lost while the request runs (useful with
    /// `LockLayer::continue_on_lost`; by default the layer cancels the handler itself).
    pub fn lost(&self) -> Lost {
        Lost::new(self.held.lost.clone())
    }

    /// Whether the lock is lost: reported lost, or its lease deadline has passed without a
    /// successful renewal. Checked against the clock, like
    /// [`LockGuard::is_lost`](crate::LockGuard::is_lost), so a handler resumed after a stall
    /// learns of it before its next write even if the watchdog has not run yet.
    pub fn is_lost(&self) -> bool {
        self.held.is_lost()
    }
}

/// A handler asked for a [`LockContext`] on a route no [`LockLayer`](super::LockLayer) runs on:
/// a mistake in the router, answered with 500 and a log line that says how to fix it.
#[cfg(feature = "axum")]
impl<S: Send + Sync> axum::extract::FromRequestParts<S> for LockContext {
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
            "a handler takes `LockContext` but no LockLayer runs on its route: add one with \
             `Router::route_layer`, or put `#[locked(...)]` on the handler"
        );
        Err((
            http::StatusCode::INTERNAL_SERVER_ERROR,
            "this route takes a lock context but runs under no lock layer",
        ))
    }
}
