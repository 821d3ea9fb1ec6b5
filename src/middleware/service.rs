//! [`LockService`]: the per-request work done before the lock is waited for.

use std::{
    fmt, mem,
    sync::Arc,
    task::{Context, Poll},
};

use futures_util::FutureExt as _;
use http::{Method, Request, Response};
use tower_service::Service;

use super::{
    LockRejection, OnRejected,
    body::{LockBody, UntilBodyEnds, UntilResponse},
    future::{Acquire, BodyResponseFuture, ResponseFuture},
    hold::Hold,
    layer::{LayerConfig, Mode},
};
use crate::{
    Backend, LockClient, LockKind,
    holder::Holder,
    key::{Keys, MakeKey},
};

/// The service made by [`LockLayer`](super::LockLayer). `H` says how long a request's lock
/// is held ([`UntilResponse`], the default, or [`UntilBodyEnds`]).
pub struct LockService<S, B: Backend, K, R, H = UntilResponse> {
    pub(crate) inner: S,
    pub(crate) hold: H,
    /// The layer's parts, behind one pointer: routers clone the service for every request, and
    /// a clone then touches one shared count instead of one per part.
    pub(crate) layer: Arc<LayerParts<B, K, R>>,
}

/// What a [`LockService`] has from its layer.
pub(crate) struct LayerParts<B: Backend, K, R> {
    /// Whether this service said which locks its requests take.
    pub(crate) announced: super::names::Announced,
    pub(crate) locks: LockClient<B>,
    pub(crate) key: K,
    pub(crate) on_rejected: R,
    pub(crate) config: Arc<LayerConfig>,
}

/// No `Send` or `'static` bounds on the inner service, its future or the bodies: nothing of
/// theirs is spawned or boxed (the boxed acquire holds only the client, the key and the
/// holder), so the response future is `Send` exactly when they are. `S: Clone` is needed: the
/// ready service goes with the request and a clone stays for the next `poll_ready`.
impl<S, B, K, R, ReqBody, ResBody> Service<Request<ReqBody>> for LockService<S, B, K, R>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    B: Backend,
    K: MakeKey,
    R: OnRejected<ResBody>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S, B, ReqBody, R>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        self.start(request, false)
    }
}

/// As without the option, but the response's body holds the lock until it ends.
impl<S, B, K, R, ReqBody, ResBody> Service<Request<ReqBody>>
    for LockService<S, B, K, R, UntilBodyEnds>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    B: Backend,
    K: MakeKey,
    R: OnRejected<ResBody>,
    ResBody: http_body::Body,
{
    type Response = Response<LockBody<ResBody, B, R>>;
    type Error = S::Error;
    type Future = BodyResponseFuture<S, B, ReqBody, R>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        BodyResponseFuture::new(self.start(request, true))
    }
}

impl<S, B, K, R, H> LockService<S, B, K, R, H>
where
    B: Backend,
    K: MakeKey,
{
    /// The request's response future: its key taken and named, its acquire started.
    fn start<ReqBody, ResBody>(
        &mut self,
        request: Request<ReqBody>,
        hand_over: bool,
    ) -> ResponseFuture<S, B, ReqBody, R>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
        R: OnRejected<ResBody>,
    {
        // The ready service goes with this request; the clone waits for the next poll_ready.
        let clone = self.inner.clone();
        let inner = mem::replace(&mut self.inner, clone);
        let layer = &*self.layer;
        let config = &layer.config;
        let (mut parts, body) = request.into_parts();
        let grpc = super::rejection::is_grpc(&parts.headers);

        let Some(user_keys) = layer.key.make_keys(&mut parts) else {
            let request = Request::from_parts(parts, body);
            if config.skip_missing {
                return ResponseFuture::unlocked(inner, request);
            }
            return ResponseFuture::rejected(&layer.on_rejected, LockRejection::MissingKey, grpc);
        };
        let namespace = config
            .name
            .as_deref()
            .map_or_else(|| layer.key.namespace(&parts, route(&parts)), str::to_owned);
        // Once per service (per route under a router), and once per route for the layer.
        if layer.announced.is_first() && config.announced.first_for(route(&parts)) {
            super::names::layer_takes(route(&parts), &namespace, &config.mode);
        }
        let kind = match config.mode {
            Mode::Exclusive => LockKind::Exclusive,
            Mode::Fair => LockKind::Fair,
            Mode::ReadWrite if is_read(&parts.method) => LockKind::Read,
            Mode::ReadWrite => LockKind::Write,
            Mode::Permits(_) => LockKind::Semaphore,
        };
        // Every key is named (and refused if invalid) before anything is waited for.
        let named = match user_keys {
            Keys::One(key) => layer.locks.key_in(&namespace, &key, kind).map(Named::One),
            // Base names: the set's request adds the read-write (or semaphore) suffix for its
            // kind.
            Keys::Set(keys) => keys
                .into_iter()
                .map(|key| {
                    let name = layer.locks.key_in(&namespace, &key, LockKind::Exclusive)?;
                    Ok((key, name))
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Named::Set),
        };
        let named = match named {
            Ok(named) => named,
            Err(error) => {
                return ResponseFuture::rejected(
                    &layer.on_rejected,
                    LockRejection::InvalidKey(error),
                    grpc,
                );
            }
        };
        // One holder per request: a nested layer (or handler code) re-enters its locks.
        let holder =
            parts.extensions.get::<Holder>().cloned().unwrap_or_else(|| layer.locks.holder());
        parts.extensions.insert(holder.clone());
        let (wait, lease, fencing) = (config.wait, config.lease, config.fencing);
        let permits = match config.mode {
            Mode::Permits(permits) => permits,
            _ => 0,
        };
        let span = tracing::debug_span!(
            "locked_request",
            key = tracing::field::Empty,
            keys = tracing::field::Empty,
            waited_ms = tracing::field::Empty,
            held_ms = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        let acquire: Acquire<B> = match named {
            Named::One(key) => {
                span.record("key", tracing::field::display(&key));
                let acquire = layer
                    .locks
                    .request_for(key, kind)
                    .with_permits(permits)
                    .with_holder(holder)
                    .configured(wait, lease, fencing)
                    .acquire();
                // A combinator, not an async block, which would hold the future twice.
                Box::pin(acquire.map(|guard| guard.map(Hold::One)))
            }
            Named::Set(keys) => {
                span.record("keys", keys.len());
                let locks = layer.locks.clone();
                Box::pin(async move {
                    let request =
                        locks.request_all_for(keys, kind).with_permits(permits).holder(&holder);
                    let guard = request.configured(wait, lease, fencing).acquire().await?;
                    Ok(Hold::Set(guard))
                })
            }
        };
        ResponseFuture::acquiring(
            acquire,
            inner,
            Request::from_parts(parts, body),
            layer.on_rejected.clone(),
            config.clone(),
            span,
            (hand_over, grpc),
        )
    }
}

/// The lock names of a request's keys.
enum Named {
    One(crate::LockKey),
    /// Each user key with its name.
    Set(Vec<(Vec<u8>, crate::LockKey)>),
}

/// Methods that only read: they take the read side of a read-write lock.
fn is_read(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// The route the request matched, when a router recorded it.
pub(crate) fn route(parts: &http::request::Parts) -> &str {
    #[cfg(feature = "axum")]
    if let Some(path) = parts.extensions.get::<axum::extract::MatchedPath>() {
        return path.as_str();
    }
    let _ = parts;
    ""
}

impl<S: Clone, B: Backend, K, R, H: Copy> Clone for LockService<S, B, K, R, H> {
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone(), hold: self.hold, layer: self.layer.clone() }
    }
}

impl<S: fmt::Debug, B: Backend, K: fmt::Debug, R, H> fmt::Debug for LockService<S, B, K, R, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockService")
            .field("inner", &self.inner)
            .field("key", &self.layer.key)
            .field("config", &self.layer.config)
            .finish_non_exhaustive()
    }
}
