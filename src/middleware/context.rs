//! What a handler can learn about the lock its request holds.

use std::sync::Arc;

use crate::{
    Backend, LockGuard, LockKey, MultiGuard, clock::BootInstant, engine::Held, guard::Lost,
    holder::Holder,
};

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
///     .route_layer(
///         LockLayer::new(LockClient::in_memory()).key(key::path_param("id").prefixed("account:")),
///     );
/// # }
/// ```
///
/// Its `Debug` shows what a handler may use: the key (or a set's keys), the holder, the fencing
/// token, how long the lock is certainly held without another renewal (`deadline`), and
/// whether it is lost.
#[derive(Clone)]
pub struct LockContext {
    /// The lock's entry (a set's first lock's), which names its key, holder and token.
    pub(crate) held: Arc<Held>,
    /// The request's hold of that grant.
    pub(crate) hold: u64,
    /// Every lock of a set, in the canonical order; `None` for one lock.
    pub(crate) set: Option<Arc<[SetMember]>>,
    /// The layer's client, for `#[locked]` handlers under it.
    #[cfg(feature = "macros")]
    pub(crate) client: Option<super::AnyLockClient>,
}

/// One lock of a set, as a handler sees it.
#[derive(Debug)]
pub(crate) struct SetMember {
    user_key: Vec<u8>,
    held: Arc<Held>,
    hold: u64,
}

impl LockContext {
    /// What a request handler may know of the lock `guard` holds.
    pub(crate) fn of<B: Backend>(guard: &LockGuard<B>) -> Self {
        Self {
            held: guard.entry().clone(),
            hold: guard.hold(),
            set: None,
            #[cfg(feature = "macros")]
            client: None,
        }
    }

    /// What a request handler may know of the locks `guard` holds: the first lock's as the
    /// context's own, and every lock's by its key.
    pub(crate) fn of_set<B: Backend>(guard: &MultiGuard<B>) -> Self {
        let members: Arc<[SetMember]> = guard
            .members()
            .iter()
            .map(|member| SetMember {
                user_key: member.user_key.clone(),
                held: member.guard.entry().clone(),
                hold: member.guard.hold(),
            })
            .collect();
        Self {
            held: members[0].held.clone(),
            hold: members[0].hold,
            set: Some(members),
            #[cfg(feature = "macros")]
            client: None,
        }
    }

    /// The context as the layer configured by `config` hands it on: with the layer's client,
    /// for `#[locked]` handlers under it.
    pub(crate) fn under(self, config: Option<&super::layer::LayerConfig>) -> Self {
        #[cfg(feature = "macros")]
        return Self { client: config.and_then(|config| config.client.clone()), ..self };
        #[cfg(not(feature = "macros"))]
        {
            let _ = config;
            self
        }
    }

    /// The lock names the request holds: the one lock's, or each lock's of a set, in the
    /// canonical order.
    pub fn keys(&self) -> impl Iterator<Item = &LockKey> {
        let one = self.set.is_none().then_some(&self.held.key);
        let set = self.set.iter().flat_map(|set| set.iter().map(|member| &member.held.key));
        one.into_iter().chain(set)
    }

    /// The fencing token of the lock of `key` in a set of locks (the key as the layer's
    /// extractor found it, or as the attribute's `keys` template made it), when fencing was
    /// asked for. For one lock, its token whatever `key` is.
    pub fn fencing_token_of(&self, key: impl AsRef<[u8]>) -> Option<u64> {
        match &self.set {
            None => self.held.token(),
            Some(set) => set
                .iter()
                .find(|member| member.user_key == key.as_ref())
                .and_then(|member| member.held.token()),
        }
    }

    /// The lock's name in the backend (of a set's first lock in the canonical order: see
    /// [`keys`](Self::keys)).
    pub fn key(&self) -> &LockKey {
        &self.held.key
    }

    /// The request's holder.
    pub fn holder(&self) -> &Holder {
        &self.held.holder
    }

    /// The fencing token, when the layer was configured with `fencing()`: send it with every
    /// write to a store that rejects writes carrying an older token than it has seen. For a
    /// set of locks, the first lock's: ask [`fencing_token_of`](Self::fencing_token_of) for
    /// each resource's.
    pub fn fencing_token(&self) -> Option<u64> {
        self.held.token()
    }

    /// Resolves if the lock (any lock of a set) is lost while the request runs (useful with
    /// `LockLayer::continue_on_lost`; by default the layer cancels the handler itself).
    pub fn lost(&self) -> Lost {
        match &self.set {
            None => Lost::new(self.held.clone(), self.hold),
            Some(set) => Lost::any(set.iter().map(|member| (member.held.clone(), member.hold))),
        }
    }

    /// Whether the lock (any lock of a set) is lost: reported lost, or its lease deadline has passed without a
    /// successful renewal. Checked against the clock, like
    /// [`LockGuard::is_lost`](crate::LockGuard::is_lost), so a handler resumed after a stall
    /// learns of it before its next write even if the watchdog has not run yet.
    pub fn is_lost(&self) -> bool {
        let now = BootInstant::now();
        match &self.set {
            None => self.held.hold_lost_at(self.hold, now),
            Some(set) => set.iter().any(|member| member.held.hold_lost_at(member.hold, now)),
        }
    }
}

impl std::fmt::Debug for LockContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut s = f.debug_struct("LockContext");
        match &self.set {
            None => s.field("key", &self.held.key),
            Some(_) => s.field("keys", &self.keys().collect::<Vec<_>>()),
        };
        let own = self
            .held
            .hold_until(self.hold)
            .map(|until| until.saturating_duration_until(BootInstant::now()));
        let left = own.map_or(self.held.remaining(), |own| own.min(self.held.remaining()));
        s.field("holder", &self.held.holder)
            .field("fencing_token", &self.fencing_token())
            .field("deadline", &format_args!("in {left:?}"))
            .field("lost", &self.is_lost())
            .finish()
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

#[cfg(test)]
mod tests {
    /// `Debug` names the key, holder, token and deadline, and no internals.
    #[tokio::test]
    async fn debug_shows_what_a_handler_uses() {
        let locks = crate::LockClient::in_memory();
        let guard = locks.lock("account:7").fencing().acquire().await.unwrap();
        let text = format!("{:?}", super::LockContext::of(&guard));
        assert!(
            text.starts_with("LockContext { key: tower-lock:{account:7}, holder: Holder("),
            "{text}"
        );
        assert!(text.contains("fencing_token: Some("), "{text}");
        assert!(text.contains("deadline: in "), "{text}");
        assert!(text.ends_with("lost: false }"), "{text}");
        assert!(!text.contains("Notify") && !text.contains("OnceLock"), "{text}");
        guard.release().await.unwrap();
    }
}
