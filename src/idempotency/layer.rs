//! [`IdempotencyLayer`], its builder and its settings.

use std::{
    fmt,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use http::{HeaderName, Method, request::Parts};
use sha2::{Digest as _, Sha256};
use tower_layer::Layer;

use super::{
    AnswerStore, FencingBackend, IdempotencyService, answer::Digest, locks::Locks, store::DynStore,
};
use crate::{ConfigError, Lease, LockClient, LockKey, key::KeyError};

/// A `scope_by` closure, behind a pointer.
pub(crate) type ScopeFn = Arc<dyn Fn(&Parts) -> Option<Vec<u8>> + Send + Sync>;

/// What a request's key is scoped by.
#[derive(Clone)]
pub(crate) enum Scope {
    /// The `Authorization` header's value.
    Authorization,
    /// What the closure finds in the request.
    By(ScopeFn),
    /// Nothing: one key space for every caller.
    Unscoped,
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Authorization => "Authorization",
            Self::By(_) => "By(..)",
            Self::Unscoped => "Unscoped",
        })
    }
}

/// What makes two requests with one key the same request: a request whose fingerprint differs
/// from the kept answer's is answered 422 instead of the answer. By default the method, the
/// path, the query and the body, byte for byte.
///
/// ```
/// use http::header::CONTENT_TYPE;
/// use tower_lock::idempotency::Fingerprint;
///
/// // The body, its content type and the path; another query string is the same request.
/// let fingerprint = Fingerprint::new().query(false).header(CONTENT_TYPE);
/// # let _ = fingerprint;
/// ```
#[derive(Clone, Debug)]
pub struct Fingerprint {
    method_and_path: bool,
    query: bool,
    body: bool,
    headers: Vec<HeaderName>,
}

impl Default for Fingerprint {
    fn default() -> Self {
        Self { method_and_path: true, query: true, body: true, headers: Vec::new() }
    }
}

impl Fingerprint {
    /// The method, the path, the query and the body (the default).
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the method and the path count. Defaults to `true`.
    #[must_use]
    pub fn method_and_path(mut self, on: bool) -> Self {
        self.method_and_path = on;
        self
    }

    /// Whether the query string counts. Defaults to `true`.
    #[must_use]
    pub fn query(mut self, on: bool) -> Self {
        self.query = on;
        self
    }

    /// Whether the body counts. Defaults to `true`: the layer then reads the body before the
    /// handler runs (up to [`max_request_body`](IdempotencyLayerBuilder::max_request_body)).
    /// Without it the body streams to the handler unread, whatever its size.
    #[must_use]
    pub fn body(mut self, on: bool) -> Self {
        self.body = on;
        self
    }

    /// Counts the values of the header `name` too (every value, in order; a missing header is
    /// a value of its own). None by default.
    #[must_use]
    pub fn header(mut self, name: HeaderName) -> Self {
        self.headers.push(name);
        self
    }

    /// Whether the body counts.
    pub(crate) fn covers_body(&self) -> bool {
        self.body
    }

    /// The fingerprint of a request with `parts` and `body` (read when the body counts).
    pub(crate) fn of(&self, parts: &Parts, body: &[u8]) -> Digest {
        let mut hash = Sha256::new();
        // Which parts count, so that two settings never give one fingerprint.
        hash.update(b"tower-lock idempotency fingerprint 1");
        hash.update([u8::from(self.method_and_path), u8::from(self.query), u8::from(self.body)]);
        if self.method_and_path {
            field(&mut hash, parts.method.as_str().as_bytes());
            field(&mut hash, parts.uri.path().as_bytes());
        }
        if self.query {
            field(&mut hash, parts.uri.query().unwrap_or("").as_bytes());
        }
        for name in &self.headers {
            field(&mut hash, name.as_str().as_bytes());
            let values = parts.headers.get_all(name);
            hash.update((values.iter().count() as u64).to_be_bytes());
            for value in values {
                field(&mut hash, value.as_bytes());
            }
        }
        if self.body {
            field(&mut hash, body);
        }
        hash.finalize().into()
    }
}

/// One field of a hash, with its length: two requests never hash alike by moving bytes from
/// one field to the next.
fn field(hash: &mut Sha256, bytes: &[u8]) {
    hash.update((bytes.len() as u64).to_be_bytes());
    hash.update(bytes);
}

/// Settings shared by every service the layer makes; [`Config::default`] states every default.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) header: HeaderName,
    /// The header's name as messages show it.
    pub(crate) header_text: Arc<str>,
    pub(crate) methods: Vec<Method>,
    pub(crate) required: bool,
    pub(crate) max_key_len: usize,
    pub(crate) scope: Scope,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) max_request_body: usize,
    pub(crate) max_response_body: usize,
    pub(crate) ttl: Duration,
    pub(crate) wait: Duration,
    /// `None`: the client's.
    pub(crate) lease: Option<Lease>,
    pub(crate) namespace: Arc<str>,
}

/// The header of the IETF httpapi draft and of Stripe.
pub(crate) const DEFAULT_HEADER: &str = "Idempotency-Key";
/// Stripe's limit on a key's length.
pub(crate) const DEFAULT_MAX_KEY_LEN: usize = 255;

impl Default for Config {
    fn default() -> Self {
        Self {
            header: HeaderName::from_static("idempotency-key"),
            header_text: DEFAULT_HEADER.into(),
            methods: vec![Method::POST, Method::PATCH],
            required: false,
            max_key_len: DEFAULT_MAX_KEY_LEN,
            scope: Scope::Authorization,
            fingerprint: Fingerprint::default(),
            max_request_body: 1024 * 1024,
            max_response_body: 256 * 1024,
            ttl: Duration::from_secs(24 * 60 * 60),
            wait: Duration::ZERO,
            lease: None,
            namespace: "idempotency:".into(),
        }
    }
}

/// A running average of how long handlers ran, for the `Retry-After` of a duplicate.
#[derive(Debug, Default)]
pub(crate) struct RunTimes {
    /// Milliseconds; 0 before the first run.
    average_ms: AtomicU64,
}

impl RunTimes {
    /// Adds one run (weight 1/8: recent runs count most).
    pub(crate) fn record(&self, ran: Duration) {
        let sample = u64::try_from(ran.as_millis()).unwrap_or(u64::MAX).max(1);
        let _ = self.average_ms.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |average| {
            let next = match average {
                0 => sample,
                average => average - average / 8 + sample / 8,
            };
            (next != average).then_some(next)
        });
    }

    /// When a duplicate of a request in progress may come back: the typical run, never less
    /// than `waited` (the first has run at least that long), never more than `lease_left`
    /// (by then its lock is free, or renewed), and one second when nothing is known.
    pub(crate) fn retry_after(&self, waited: Duration, lease_left: Option<Duration>) -> Duration {
        let average = self.average_ms.load(Ordering::Relaxed);
        let typical = (average > 0).then(|| Duration::from_millis(average));
        let estimate =
            typical.unwrap_or(Duration::from_secs(1)).max(waited).max(Duration::from_millis(100));
        lease_left.map_or(estimate, |left| estimate.min(left.max(Duration::from_millis(100))))
    }
}

/// What every service of a layer shares.
pub(crate) struct Shared {
    pub(crate) locks: Arc<dyn Locks>,
    pub(crate) store: Arc<dyn DynStore>,
    pub(crate) config: Config,
    pub(crate) runs: RunTimes,
}

impl Shared {
    /// The lock name of `key` scoped by `scope` (`None`: unscoped): the key's lock, and the
    /// name its answer is kept under.
    pub(crate) fn lock_key(&self, scope: Option<&[u8]>, key: &[u8]) -> Result<LockKey, KeyError> {
        // A scope of any length and content becomes 64 hex digits, so the name is bounded and
        // unambiguous: the key begins after the first `:`, and no scope is `-`.
        let mut name = Vec::with_capacity(65 + key.len());
        match scope {
            Some(scope) => {
                let digest: [u8; 32] = Sha256::new()
                    .chain_update(b"tower-lock idempotency scope 1")
                    .chain_update(scope)
                    .finalize()
                    .into();
                const HEX: &[u8; 16] = b"0123456789abcdef";
                for byte in digest {
                    name.extend_from_slice(&[
                        HEX[usize::from(byte >> 4)],
                        HEX[usize::from(byte & 15)],
                    ]);
                }
            }
            None => name.push(b'-'),
        }
        name.push(b':');
        name.extend_from_slice(key);
        self.locks.name(&self.config.namespace, &name)
    }
}

/// Runs each write that carries an idempotency key once: a retry gets the kept answer
/// replayed, a duplicate while the first runs gets 409, across every instance that shares the
/// lock store and the answer store. See the [module docs](super).
///
/// One type whatever its settings (the lock backend and the store are behind pointers); cheap
/// to clone.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::convert::Infallible;
///
/// use http::{Request, Response, StatusCode};
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
/// use tower_lock::{LockClient, idempotency::{IdempotencyLayer, MemoryAnswerStore}};
///
/// let layer = IdempotencyLayer::builder(LockClient::in_memory(), MemoryAnswerStore::new())
///     .required(true)
///     .build()?;
/// let service = ServiceBuilder::new()
///     .layer(layer)
///     .service(service_fn(|_: Request<_>| async {
///         Ok::<_, Infallible>(Response::new(String::from("charged")))
///     }));
///
/// let charge = || {
///     Request::post("/charges")
///         .header("idempotency-key", "order-7")
///         .header("authorization", "Bearer alice")
///         .body(String::from("{\"amount\":100}"))
/// };
/// let first = service.clone().oneshot(charge()?).await?;
/// assert_eq!(first.status(), StatusCode::OK);
/// let again = service.oneshot(charge()?).await?;
/// assert_eq!(again.headers()["idempotent-replayed"], "true");
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
#[must_use]
pub struct IdempotencyLayer {
    pub(crate) shared: Arc<Shared>,
}

impl IdempotencyLayer {
    /// A layer with the default settings (each stated on the builder's setter): keys from
    /// optional `Idempotency-Key` headers of POST and PATCH requests, scoped by the
    /// `Authorization` header, answers kept 24 hours in `store`, the key's lock taken from
    /// `locks`.
    pub fn new<B: FencingBackend, St: AnswerStore>(locks: LockClient<B>, store: St) -> Self {
        Self::builder(locks, store)
            .build()
            .unwrap_or_else(|_| unreachable!("the default settings are valid"))
    }

    /// A builder of a layer taking its locks from `locks` (with fencing tokens, which is why
    /// the backend must be a [`FencingBackend`]) and keeping answers in `store`.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// use http::Method;
    /// use tower_lock::{LockClient, idempotency::{IdempotencyLayer, MemoryAnswerStore}};
    ///
    /// let layer = IdempotencyLayer::builder(LockClient::in_memory(), MemoryAnswerStore::new())
    ///     .required(true)
    ///     .methods([Method::POST])
    ///     .ttl(Duration::from_secs(3600))
    ///     .wait(Duration::from_secs(2))
    ///     .build()
    ///     .expect("valid settings");
    /// # let _ = layer;
    /// ```
    pub fn builder<B: FencingBackend, St: AnswerStore>(
        locks: LockClient<B>,
        store: St,
    ) -> IdempotencyLayerBuilder {
        let max_lock_key_len = locks.inner.engine.config.max_key_len;
        IdempotencyLayerBuilder {
            locks: Arc::new(locks),
            store: Arc::new(store),
            config: Config::default(),
            scope_by: None,
            unscoped: false,
            max_lock_key_len,
        }
    }

    /// The name of the lock held while a request with `key` runs, scoped by `scope` (the bytes
    /// the layer scopes by: the `Authorization` header's value, or what
    /// [`scope_by`](IdempotencyLayerBuilder::scope_by) returned; `None` for an unscoped
    /// layer). The answer is kept under the same name (the Redis store appends `:answer`):
    /// for an operator who looks at a key ([`LockClient::inspect`](crate::LockClient::inspect))
    /// or clears one.
    ///
    /// ```
    /// use tower_lock::{LockClient, idempotency::{IdempotencyLayer, MemoryAnswerStore}};
    ///
    /// let layer = IdempotencyLayer::new(LockClient::in_memory(), MemoryAnswerStore::new());
    /// let name = layer.lock_key(Some(b"Bearer alice"), "order-7").unwrap();
    /// assert!(name.as_str().starts_with("tower-lock:idempotency:{"));
    /// assert!(name.as_str().ends_with(":order-7}"));
    /// ```
    ///
    /// # Errors
    /// [`KeyError`] when the key is empty or too long for the lock client.
    pub fn lock_key(&self, scope: Option<&[u8]>, key: &str) -> Result<LockKey, KeyError> {
        self.shared.lock_key(scope, key.as_bytes())
    }
}

impl fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService { inner, shared: self.shared.clone() }
    }
}

/// Settings of an [`IdempotencyLayer`]; [`build`](Self::build) checks them. Each setter states
/// its default.
///
/// ```
/// use std::time::Duration;
///
/// use tower_lock::{ConfigError, LockClient, idempotency::{IdempotencyLayer, MemoryAnswerStore}};
///
/// let built = IdempotencyLayer::builder(LockClient::in_memory(), MemoryAnswerStore::new())
///     .ttl(Duration::ZERO)
///     .build();
/// assert!(matches!(built, Err(ConfigError::Invalid { setting: "ttl", .. })));
/// ```
#[must_use]
pub struct IdempotencyLayerBuilder {
    locks: Arc<dyn Locks>,
    store: Arc<dyn DynStore>,
    config: Config,
    scope_by: Option<ScopeFn>,
    unscoped: bool,
    max_lock_key_len: usize,
}

impl IdempotencyLayerBuilder {
    /// The header that carries the key. Defaults to `Idempotency-Key` (the IETF httpapi
    /// draft's, and Stripe's); a gRPC call sends it as `idempotency-key` metadata, the same
    /// header on HTTP/2.
    pub fn header(mut self, header: HeaderName) -> Self {
        self.config.header_text = header.as_str().into();
        self.config.header = header;
        self
    }

    /// The methods whose requests are run once per key; others pass through untouched.
    /// Defaults to POST and PATCH (PUT and DELETE are idempotent by their definition).
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.config.methods = methods.into_iter().collect();
        self
    }

    /// Whether a request of one of the [`methods`](Self::methods) without a key is answered
    /// 400 (a one-line text body naming the header) rather than run as it is. Defaults to
    /// `false`.
    pub fn required(mut self, required: bool) -> Self {
        self.config.required = required;
        self
    }

    /// The longest key taken, in bytes; a longer one is answered 400. Defaults to 255 (as
    /// Stripe). At most the lock client's `max_key_len` less 65 bytes (the scope's hash).
    pub fn max_key_len(mut self, max: usize) -> Self {
        self.config.max_key_len = max;
        self
    }

    /// Scope each key by what `scope` finds in the request (a user or tenant id that an
    /// authentication layer in front put into the extensions, an API key header): two callers
    /// with one key never share an answer. A request for which it finds nothing is answered
    /// 400. Defaults to the value of the `Authorization` header (the same answer for the same
    /// credentials), and a request without one is answered 400.
    ///
    /// Scopes are hashed (SHA-256) into the lock name, never stored as they are.
    ///
    /// ```
    /// use tower_lock::{LockClient, idempotency::{IdempotencyLayer, MemoryAnswerStore}};
    ///
    /// #[derive(Clone)]
    /// struct UserId(u64); // put into the extensions by an authentication layer
    ///
    /// let layer = IdempotencyLayer::builder(LockClient::in_memory(), MemoryAnswerStore::new())
    ///     .scope_by(|parts: &http::request::Parts| {
    ///         parts.extensions.get::<UserId>().map(|user| user.0.to_string())
    ///     })
    ///     .build()
    ///     .expect("valid settings");
    /// # let _ = layer;
    /// ```
    pub fn scope_by<F, T>(mut self, scope: F) -> Self
    where
        F: Fn(&Parts) -> Option<T> + Send + Sync + 'static,
        T: AsRef<[u8]>,
    {
        self.scope_by =
            Some(Arc::new(move |parts: &Parts| scope(parts).map(|scope| scope.as_ref().to_vec())));
        self
    }

    /// Whether keys are not scoped at all: every caller shares one key space, and a caller
    /// who learns another's key gets that caller's answer. Only for a service whose callers
    /// are one (another service of one's own, say). Defaults to `false`; cannot be set with
    /// [`scope_by`](Self::scope_by).
    pub fn unscoped(mut self, unscoped: bool) -> Self {
        self.unscoped = unscoped;
        self
    }

    /// What makes two requests with one key the same. Defaults to [`Fingerprint::default`]:
    /// the method, path, query and body.
    pub fn fingerprint(mut self, fingerprint: Fingerprint) -> Self {
        self.config.fingerprint = fingerprint;
        self
    }

    /// The largest request body read to fingerprint it, in bytes; a request whose body is
    /// larger is answered 413 (`RESOURCE_EXHAUSTED` to a gRPC call), before its handler runs.
    /// Defaults to 1 MiB. Without the body in the [`fingerprint`](Self::fingerprint), bodies are
    /// not read.
    pub fn max_request_body(mut self, max: usize) -> Self {
        self.config.max_request_body = max;
        self
    }

    /// The largest response body kept, in bytes; a larger response is passed on as it comes and
    /// not kept, and its key is free again once the handler has answered. Defaults to 256 KiB.
    pub fn max_response_body(mut self, max: usize) -> Self {
        self.config.max_response_body = max;
        self
    }

    /// How long an answer is kept (and replayed). Defaults to 24 hours.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.config.ttl = ttl;
        self
    }

    /// How long a duplicate of a request in progress waits for it to finish, to be answered
    /// with its answer, before it is answered 409. Defaults to zero: 409 at once, with
    /// `Retry-After`.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.config.wait = wait;
        self
    }

    /// The lease of the key's lock. Defaults to the lock client's
    /// ([`LockClientBuilder::lease`](crate::LockClientBuilder::lease), a watchdog lease
    /// renewed while the handler runs unless set otherwise).
    pub fn lease(mut self, lease: Lease) -> Self {
        self.config.lease = Some(lease);
        self
    }

    /// The namespace of the keys' lock names (and answers). Defaults to `idempotency:`: two
    /// layers on one store with other names never share a key.
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.config.namespace = name.into();
        self
    }

    /// Checks the settings and builds the layer.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the setting: no [`methods`](Self::methods), a
    /// [`max_key_len`](Self::max_key_len) of zero or over the lock client's less 65, a zero
    /// [`ttl`](Self::ttl), a [`lease`](Self::lease) under 3 ms or over 365 days,
    /// [`unscoped`](Self::unscoped) together with [`scope_by`](Self::scope_by).
    pub fn build(self) -> Result<IdempotencyLayer, ConfigError> {
        let mut config = self.config;
        let invalid = |setting, reason| Err(ConfigError::Invalid { setting, reason });
        if config.methods.is_empty() {
            return invalid("methods", "must name at least one method");
        }
        if config.max_key_len == 0 {
            return invalid("max_key_len", "must be at least 1");
        }
        if config.max_key_len.saturating_add(65) > self.max_lock_key_len {
            return invalid(
                "max_key_len",
                "must leave 65 bytes (the scope's hash) within the lock client's max_key_len",
            );
        }
        if config.ttl < Duration::from_millis(1) {
            return invalid("ttl", "must be at least 1 ms");
        }
        if let Some(lease) = config.lease
            && (lease.duration() < Duration::from_millis(3) || !lease.is_valid())
        {
            return invalid("lease", "must be 3 ms to 365 days");
        }
        config.scope = match (self.scope_by, self.unscoped) {
            (Some(_), true) => {
                return invalid("unscoped", "cannot be set together with scope_by");
            }
            (Some(scope), false) => Scope::By(scope),
            (None, true) => Scope::Unscoped,
            (None, false) => Scope::Authorization,
        };
        Ok(IdempotencyLayer {
            shared: Arc::new(Shared {
                locks: self.locks,
                store: self.store,
                config,
                runs: RunTimes::default(),
            }),
        })
    }
}

impl fmt::Debug for IdempotencyLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayerBuilder")
            .field("config", &self.config)
            .field("scope_by", &self.scope_by.is_some())
            .field("unscoped", &self.unscoped)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idempotency::MemoryAnswerStore;

    fn builder() -> IdempotencyLayerBuilder {
        IdempotencyLayer::builder(crate::LockClient::in_memory(), MemoryAnswerStore::new())
    }

    fn invalid(result: Result<IdempotencyLayer, ConfigError>) -> &'static str {
        match result {
            Err(ConfigError::Invalid { setting, .. }) => setting,
            other => panic!("expected an invalid setting, got {other:?}"),
        }
    }

    /// Each setting that cannot work is named when the layer is built.
    #[test]
    fn misconfigurations_name_the_setting() {
        assert_eq!(invalid(builder().methods([]).build()), "methods");
        assert_eq!(invalid(builder().max_key_len(0).build()), "max_key_len");
        assert_eq!(invalid(builder().max_key_len(448).build()), "max_key_len");
        assert!(builder().max_key_len(447).build().is_ok());
        assert_eq!(invalid(builder().ttl(Duration::ZERO).build()), "ttl");
        assert_eq!(
            invalid(builder().lease(Lease::fixed(Duration::from_millis(1))).build()),
            "lease"
        );
        assert_eq!(
            invalid(builder().unscoped(true).scope_by(|_: &Parts| Some("x")).build()),
            "unscoped"
        );
        assert!(builder().unscoped(true).build().is_ok());
    }

    /// Scopes and keys cannot be told apart by moving bytes between them, and two scopes
    /// never share a name.
    #[test]
    fn lock_names_are_unambiguous() {
        let layer = IdempotencyLayer::new(crate::LockClient::in_memory(), MemoryAnswerStore::new());
        let name = |scope: Option<&[u8]>, key: &str| layer.lock_key(scope, key).unwrap();
        assert_ne!(name(Some(b"a:b"), "c"), name(Some(b"a"), "b:c"));
        assert_ne!(name(Some(b"alice"), "k"), name(Some(b"bob"), "k"));
        assert_ne!(name(None, "k"), name(Some(b""), "k"));
        assert_eq!(name(None, "k").as_str(), "tower-lock:idempotency:{-:k}");
        assert_eq!(name(Some(b"alice"), "k"), name(Some(b"alice"), "k"));
    }

    /// Each part the fingerprint covers changes it; a part it leaves out does not.
    #[test]
    fn fingerprints() {
        let parts = |uri: &str, method: Method| {
            http::Request::builder()
                .method(method)
                .uri(uri)
                .header("content-type", "application/json")
                .body(())
                .unwrap()
                .into_parts()
                .0
        };
        let all = Fingerprint::default();
        let base = all.of(&parts("/charges?x=1", Method::POST), b"{}");
        assert_ne!(base, all.of(&parts("/charges?x=2", Method::POST), b"{}"));
        assert_ne!(base, all.of(&parts("/refunds?x=1", Method::POST), b"{}"));
        assert_ne!(base, all.of(&parts("/charges?x=1", Method::PATCH), b"{}"));
        assert_ne!(base, all.of(&parts("/charges?x=1", Method::POST), b"{ }"));
        let no_query = Fingerprint::new().query(false);
        assert_eq!(
            no_query.of(&parts("/charges?x=1", Method::POST), b"{}"),
            no_query.of(&parts("/charges?x=2", Method::POST), b"{}")
        );
        let with_type = Fingerprint::new().header(http::header::CONTENT_TYPE);
        assert_ne!(base, with_type.of(&parts("/charges?x=1", Method::POST), b"{}"));
    }

    /// A duplicate's hint: one second before any run, then the typical run, within the lease.
    #[test]
    fn retry_after_hints() {
        let runs = RunTimes::default();
        assert_eq!(runs.retry_after(Duration::ZERO, None), Duration::from_secs(1));
        runs.record(Duration::from_secs(4));
        assert_eq!(runs.retry_after(Duration::ZERO, None), Duration::from_secs(4));
        assert_eq!(
            runs.retry_after(Duration::ZERO, Some(Duration::from_secs(2))),
            Duration::from_secs(2)
        );
        assert_eq!(runs.retry_after(Duration::from_secs(6), None), Duration::from_secs(6));
    }
}
