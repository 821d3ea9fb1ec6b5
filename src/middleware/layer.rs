//! [`LockLayer`] and its settings.

use std::{fmt, sync::Arc, time::Duration};

use tower_layer::Layer;

use super::{
    DefaultRejection, LockService, MakeKeyUnset,
    body::{UntilBodyEnds, UntilResponse},
    service::LayerParts,
};
use crate::{Backend, LockClient, key::MakeKey, lease::Lease};

/// Which lock a request takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Exclusive,
    Fair,
    /// Read lock for GET, HEAD and OPTIONS; write lock otherwise.
    ReadWrite,
    /// A permit of a semaphore of this many permits.
    Permits(u32),
}

/// Settings shared by every service the layer makes; `Default` states every default.
#[derive(Clone, Debug)]
pub(crate) struct LayerConfig {
    /// `None`: the client's.
    pub(crate) wait: Option<Duration>,
    /// `None`: the client's.
    pub(crate) lease: Option<Lease>,
    pub(crate) mode: Mode,
    pub(crate) fencing: bool,
    pub(crate) name: Option<Arc<str>>,
    pub(crate) skip_missing: bool,
    pub(crate) continue_on_lost: bool,
    pub(crate) release_in_background: bool,
    /// The routes whose lock names the layer announced.
    pub(crate) announced: Arc<super::names::Announced>,
    /// The layer's client for `#[locked]` handlers (through their [`LockContext`]), made once.
    ///
    /// [`LockContext`]: super::LockContext
    #[cfg(feature = "macros")]
    pub(crate) client: Option<super::AnyLockClient>,
}

impl Default for LayerConfig {
    fn default() -> Self {
        Self {
            wait: None,
            lease: None,
            mode: Mode::Exclusive,
            fencing: false,
            name: None,
            skip_missing: false,
            continue_on_lost: false,
            release_in_background: false,
            announced: Arc::default(),
            #[cfg(feature = "macros")]
            client: None,
        }
    }
}

/// Serializes requests per resource: each request takes the lock named by its key, runs while
/// holding it, and releases it when its response is ready. See the [module docs](super).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::{convert::Infallible, time::Duration};
///
/// use http::{Request, Response, StatusCode};
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
/// use tower_lock::{LockClient, LockLayer, key};
///
/// let service = ServiceBuilder::new()
///     .layer(
///         LockLayer::new(LockClient::in_memory())
///             .key(key::query("account").prefixed("account:"))
///             .wait(Duration::from_secs(2)),
///     )
///     .service(service_fn(|_: Request<String>| async {
///         Ok::<_, Infallible>(Response::new(String::from("done")))
///     }));
///
/// let request = Request::get("/balance?account=7").body(String::new())?;
/// assert_eq!(service.oneshot(request).await?.status(), StatusCode::OK);
/// # Ok(())
/// # }
/// ```
///
/// The last type parameter says how long a request's lock is held: [`UntilResponse`] (the
/// default) or [`UntilBodyEnds`] ([`hold_until_body_ends`](Self::hold_until_body_ends)).
#[must_use]
pub struct LockLayer<B: Backend, K = MakeKeyUnset, R = DefaultRejection, H = UntilResponse> {
    pub(crate) locks: LockClient<B>,
    pub(crate) key: K,
    pub(crate) on_rejected: R,
    pub(crate) config: Arc<LayerConfig>,
    pub(crate) hold: H,
}

impl<B: Backend> LockLayer<B> {
    /// A layer taking locks from `locks`. Set the key with [`key`](Self::key).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// use tower_lock::{Lease, LockClient, LockLayer, key};
    ///
    /// let layer = LockLayer::new(LockClient::in_memory())
    ///     .key(key::header("x-tenant-id").prefixed("tenant:"))
    ///     .wait(Duration::from_secs(2))
    ///     .lease(Lease::watchdog(Duration::from_secs(10)))
    ///     .fencing();
    /// # let _ = layer;
    /// ```
    pub fn new(locks: LockClient<B>) -> Self {
        let config = LayerConfig {
            #[cfg(feature = "macros")]
            client: Some(locks.clone().into()),
            ..LayerConfig::default()
        };
        Self {
            locks,
            key: MakeKeyUnset::default(),
            on_rejected: DefaultRejection,
            config: Arc::new(config),
            hold: UntilResponse,
        }
    }
}

impl<B: Backend, K, R, H> LockLayer<B, K, R, H> {
    fn config(mut self, f: impl FnOnce(&mut LayerConfig)) -> Self {
        f(Arc::make_mut(&mut self.config));
        self
    }

    /// Where the lock key comes from: an extractor from [`key`](crate::key).
    pub fn key<K2: MakeKey>(self, key: K2) -> LockLayer<B, K2, R, H> {
        LockLayer {
            locks: self.locks,
            key,
            on_rejected: self.on_rejected,
            config: self.config,
            hold: self.hold,
        }
    }

    /// Builds the response for rejected requests (default: the status, `Retry-After` where
    /// known, and a one-line text body where the body type can carry one).
    pub fn on_rejected<R2>(self, on_rejected: R2) -> LockLayer<B, K, R2, H> {
        LockLayer {
            locks: self.locks,
            key: self.key,
            on_rejected,
            config: self.config,
            hold: self.hold,
        }
    }

    /// Hold each request's lock until its response body ends, instead of releasing it when
    /// the response is ready: for a body made while it is sent (a streamed download,
    /// server-sent events, a gRPC server stream). The body is a
    /// [`LockBody`](super::body::LockBody), which releases the lock when it ends (before its
    /// last frame is sent), fails, or is dropped (the client went away); the watchdog renews
    /// the lock while it streams. A response that has no body to stream is released before it
    /// is handed back, as by default. See [`body`](super::body).
    ///
    /// ```
    /// # #[cfg(feature = "axum")] {
    /// use axum::{Router, routing::get};
    /// use tower_lock::{LockClient, LockLayer, key};
    ///
    /// async fn export() -> &'static str { "a body streamed while the lock is held" }
    ///
    /// // One export per tenant at a time, for as long as the download lasts.
    /// let app: Router = Router::new().route("/export", get(export)).route_layer(
    ///     LockLayer::new(LockClient::in_memory())
    ///         .key(key::header("x-tenant-id").prefixed("export:"))
    ///         .hold_until_body_ends(),
    /// );
    /// # }
    /// ```
    pub fn hold_until_body_ends(self) -> LockLayer<B, K, R, UntilBodyEnds> {
        LockLayer {
            locks: self.locks,
            key: self.key,
            on_rejected: self.on_rejected,
            config: self.config,
            hold: UntilBodyEnds,
        }
    }

    /// How long a request may wait for its lock before it is answered 423. Zero means try
    /// once. Defaults to the client's wait ([`LockClientBuilder::wait`](crate::LockClientBuilder::wait),
    /// 5 seconds unless set).
    pub fn wait(self, wait: Duration) -> Self {
        self.config(|c| c.wait = Some(wait))
    }

    /// The lease to hold locks with. Defaults to the client's lease
    /// ([`LockClientBuilder::lease`](crate::LockClientBuilder::lease), `Lease::watchdog(5 s)`
    /// unless set: renewed while the request runs, freed within 5 s if the instance dies).
    pub fn lease(self, lease: Lease) -> Self {
        self.config(|c| c.lease = Some(lease))
    }

    /// Take the fair lock: requests get it in the order they arrived, across instances.
    pub fn fair(self) -> Self {
        self.config(|c| c.mode = Mode::Fair)
    }

    /// Take a read-write lock: a read lock for GET, HEAD and OPTIONS (they run together), a
    /// write lock for every other method.
    pub fn read_write(self) -> Self {
        self.config(|c| c.mode = Mode::ReadWrite)
    }

    /// Let up to `permits` requests per key run at once, across instances, instead of one: each
    /// request takes a permit of the key's [semaphore](crate::LockClient::semaphore), leased
    /// and renewed like a lock, given back when the response is ready. A request that finds
    /// every permit taken waits, then is answered 423 with `Retry-After` as for a lock.
    /// Permits carry no fencing token: with [`fencing`](Self::fencing) too, requests are
    /// answered 500 (a misconfiguration, logged).
    ///
    /// ```
    /// use tower_lock::{LockClient, LockLayer, key};
    ///
    /// // At most four exports per tenant at once.
    /// let layer = LockLayer::new(LockClient::in_memory())
    ///     .key(key::header("x-tenant-id").prefixed("exports:"))
    ///     .permits(4);
    /// # let _ = layer;
    /// ```
    ///
    /// # Panics
    /// When `permits` is 0: nobody could ever run (a programming error, caught when the layer
    /// is built).
    pub fn permits(self, permits: u32) -> Self {
        assert!(permits > 0, "a LockLayer needs at least one permit");
        self.config(|c| c.mode = Mode::Permits(permits))
    }

    /// Put a fencing token into the request's [`LockContext`](super::LockContext).
    pub fn fencing(self) -> Self {
        self.config(|c| c.fencing = true)
    }

    /// The namespace of this layer's keys: the resource they name. Without it, the key says
    /// ([`MakeKey::namespace`](crate::key::MakeKey::namespace)): a path parameter's resource is
    /// the route up to it, so `/accounts/{id}/withdraw` and `/accounts/{id}/deposit` share one
    /// lock per account while `/orders/{id}` never shares one with them; a
    /// [`prefixed`](crate::key::MakeKey::prefixed) key names its resource itself; other keys
    /// (a header, a query parameter, a closure) lock per matched route. Without a router (plain
    /// hyper) a path segment's resource is the path before it.
    pub fn name(self, name: impl Into<Arc<str>>) -> Self {
        self.config(|c| c.name = Some(name.into()))
    }

    /// Run requests that carry no key without a lock instead of answering 400.
    pub fn skip_missing_key(self) -> Self {
        self.config(|c| c.skip_missing = true)
    }

    /// When the lock is lost mid-request, let the request finish (the handler can watch
    /// `LockContext::lost`) instead of cancelling it and answering 503. Without it, a handler
    /// that finishes after its lease's deadline, before the loss was noticed (a stalled
    /// process), is answered 503 as well: its response was not made under the lock.
    pub fn continue_on_lost(self) -> Self {
        self.config(|c| c.continue_on_lost = true)
    }

    /// Hand the response back at once and release the lock in the background, instead of
    /// releasing before the response leaves (one backend round trip less of latency; the next
    /// request may briefly find the lock still held).
    pub fn release_in_background(self) -> Self {
        self.config(|c| c.release_in_background = true)
    }
}

impl<B: Backend, K: Clone, R: Clone, H: Clone> Clone for LockLayer<B, K, R, H> {
    fn clone(&self) -> Self {
        Self {
            locks: self.locks.clone(),
            key: self.key.clone(),
            on_rejected: self.on_rejected.clone(),
            config: self.config.clone(),
            hold: self.hold.clone(),
        }
    }
}

impl<B: Backend, K: fmt::Debug, R, H> fmt::Debug for LockLayer<B, K, R, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockLayer")
            .field("key", &self.key)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<S, B: Backend, K: MakeKey, R: Clone, H: Copy> Layer<S> for LockLayer<B, K, R, H> {
    type Service = LockService<S, B, K, R, H>;

    fn layer(&self, inner: S) -> Self::Service {
        LockService {
            inner,
            hold: self.hold,
            layer: Arc::new(LayerParts {
                announced: super::names::Announced::new(),
                locks: self.locks.clone(),
                key: self.key.clone(),
                on_rejected: self.on_rejected.clone(),
                config: self.config.clone(),
            }),
        }
    }
}
