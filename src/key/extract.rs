//! Key extractors: where in a request the lock key comes from.
//!
//! Request data is untrusted: every extractor returns the raw bytes it found and the engine
//! escapes, length-checks and namespaces them ([module docs](super)). An extractor that finds
//! nothing returns `None`, and the layer answers 400 (or runs the request without a lock, if
//! configured so); it never falls back to a shared key.

use std::{borrow::Cow, sync::Arc};

use http::{HeaderName, request::Parts};
use percent_encoding::percent_decode_str;

/// Takes the lock key from a request. Closures `Fn(&Parts) -> Option<String>` implement it.
#[diagnostic::on_unimplemented(
    message = "`{Self}` takes no lock key from a request: a `LockLayer` without `.key(..)`?",
    label = "call `.key(..)` on the `LockLayer` first",
    note = "for example `.key(key::path_param(\"id\"))`; `key::header`, `key::query`, \
            `key::path_segment` and `key::from_fn` are the others"
)]
pub trait MakeKey: Clone + Send + Sync + 'static {
    /// The key for this request, or `None` when the request carries none.
    fn make_key(&self, parts: &mut Parts) -> Option<Vec<u8>>;

    /// The resource this key names a member of, when the layer has no
    /// [`name`](crate::LockLayer::name): the namespace of its locks. Requests for one resource
    /// share a lock whichever endpoint they come through; different resources never do.
    ///
    /// By default the matched route (`route`, with its parameters written `:id`; empty outside
    /// axum), so a key that says nothing of its resource locks per endpoint. A
    /// [`prefixed`](Self::prefixed) key names its resource itself (no namespace), a path
    /// parameter's resource is the route up to it (`/accounts/:id` for both
    /// `/accounts/{id}/withdraw` and `/accounts/{id}/deposit`), a path segment's is the path
    /// before it (`/accounts/*`).
    fn namespace(&self, parts: &Parts, route: &str) -> String {
        let _ = parts;
        route.to_owned()
    }

    /// The keys for this request: by default the one [`make_key`](Self::make_key) finds.
    /// Extractors of several keys ([`all`](super::all), [`from_fn_many`](super::from_fn_many))
    /// return [`Keys::Set`], and the layer takes all of their locks together
    /// ([`LockClient::lock_all`](crate::LockClient::lock_all)).
    fn make_keys(&self, parts: &mut Parts) -> Option<Keys> {
        self.make_key(parts).map(Keys::One)
    }

    /// The same key with `prefix` in front of it, to tell keys of different kinds apart.
    /// Keys with one prefix stay as distinct as before; keys with different prefixes stay apart
    /// only if no prefix starts another (end each with `:` and use no other `:` in it).
    fn prefixed(self, prefix: impl Into<Cow<'static, str>>) -> Prefixed<Self> {
        Prefixed { prefix: prefix.into(), inner: self }
    }
}

impl<F> MakeKey for F
where
    F: Fn(&Parts) -> Option<String> + Clone + Send + Sync + 'static,
{
    fn make_key(&self, parts: &mut Parts) -> Option<Vec<u8>> {
        self(parts).map(String::into_bytes)
    }
}

/// What a [`MakeKey`] found in a request: one key, or a set of keys to lock together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Keys {
    /// One lock, as every single-key extractor finds.
    One(Vec<u8>),
    /// Several locks, taken together in the canonical order; never empty.
    Set(Vec<Vec<u8>>),
}

/// The value of a request header, which must be visible ASCII. Made by [`header`].
#[derive(Clone, Debug)]
pub struct Header(HeaderName);

/// The value of the header `name` (any case: `X-Tenant-Id` and `x-tenant-id` are one header).
/// A header that is missing, or has bytes outside visible ASCII, gives no key. Trust it only if
/// your proxy sets or checks it. In a gRPC call, this is the call's metadata entry of that name
/// (metadata travel as headers); a binary (`-bin`) entry's key is its base64 text.
///
/// # Examples
///
/// ```
/// use tower_lock::{LockClient, LockLayer, key};
///
/// // One lock per tenant, named `tenant:<header value>` on every route.
/// let layer = LockLayer::new(LockClient::in_memory())
///     .key(key::header("x-tenant-id").prefixed("tenant:"));
/// # let _ = layer;
/// ```
///
/// # Panics
/// When `name` is not a valid header name (empty, or with a space or other separator): a
/// programming error, caught when the layer is built.
pub fn header(name: &'static str) -> Header {
    match HeaderName::from_bytes(name.as_bytes()) {
        Ok(name) => Header(name),
        Err(_) => panic!("key::header({name:?}): not a valid HTTP header name"),
    }
}

impl MakeKey for Header {
    fn make_key(&self, parts: &mut Parts) -> Option<Vec<u8>> {
        let value = parts.headers.get(&self.0)?.to_str().ok()?;
        Some(value.as_bytes().to_vec())
    }
}

/// The value of a query parameter. Made by [`query`].
#[derive(Clone, Debug)]
pub struct Query(Arc<str>);

/// The first value of the query parameter `name`, percent-decoded (`+` is a space).
///
/// # Examples
///
/// ```
/// use tower_lock::{LockClient, LockLayer, key};
///
/// // `/reports?job=nightly%20sync` locks `job:nightly sync`.
/// let layer = LockLayer::new(LockClient::in_memory()).key(key::query("job").prefixed("job:"));
/// # let _ = layer;
/// ```
pub fn query(name: &str) -> Query {
    Query(name.into())
}

impl MakeKey for Query {
    /// Pairs are split at `&`, a pair at its first `=` (a pair without one has an empty value),
    /// and both halves are percent-decoded (`+` as a space) before the name is compared.
    fn make_key(&self, parts: &mut Parts) -> Option<Vec<u8>> {
        let query = parts.uri.query()?;
        query.split('&').find_map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(name) == self.0.as_bytes()).then(|| decode(value))
        })
    }
}

/// One name or value of a query string, decoded as an HTML form encodes it: `+` is a space,
/// then `%XX` is the byte `XX` (so `%2B` is a `+`); a `%` not followed by two hex digits is kept
/// as it is.
///
/// Hand-written on `percent-encoding` rather than using `form_urlencoded::parse`, although that
/// crate is in the tree (through `redis` and `url`): it returns `str`s, decoding invalid UTF-8
/// lossily, so `?id=%FF` and `?id=%FE` would both become `U+FFFD` and share one lock, and keys
/// that are not UTF-8 would name different locks than they do now. Keys are bytes here, passed
/// on unchanged (`tests/locks/key_fuzz.rs` checks this for arbitrary bytes).
fn decode(raw: &str) -> Vec<u8> {
    if raw.contains('+') {
        percent_decode_str(&raw.replace('+', " ")).collect()
    } else {
        percent_decode_str(raw).collect()
    }
}

/// One segment of the request path. Made by [`path_segment`].
#[derive(Clone, Copy, Debug)]
pub struct PathSegment(usize);

/// The path segment at `index` (zero-based, counting non-empty segments), percent-decoded:
/// for `/accounts/42/withdraw`, `path_segment(1)` is `42`.
pub fn path_segment(index: usize) -> PathSegment {
    PathSegment(index)
}

impl MakeKey for PathSegment {
    fn make_key(&self, parts: &mut Parts) -> Option<Vec<u8>> {
        let segment =
            parts.uri.path().split('/').filter(|segment| !segment.is_empty()).nth(self.0)?;
        Some(percent_decode_str(segment).collect())
    }

    /// The request path's segments before the key's, then `*`: `/accounts/*`.
    fn namespace(&self, parts: &Parts, _route: &str) -> String {
        let mut namespace: String = parts
            .uri
            .path()
            .split('/')
            .filter(|segment| !segment.is_empty())
            .take(self.0)
            .flat_map(|segment| ["/", segment])
            .collect();
        namespace.push_str("/*");
        namespace
    }
}

/// The gRPC method of a call. Made by [`grpc_method`].
#[cfg(feature = "grpc")]
#[derive(Clone, Copy, Debug)]
pub struct GrpcMethod;

/// The gRPC method the call is for, as its request path says: `/bank.Bank/Withdraw`. One lock
/// per method, across every instance: for a method that must never run twice at once (a
/// nightly reindex), whatever its message says. The key names its resource itself (the
/// method), so [`LockClient::lock`](crate::LockClient::lock) on the same path takes the same
/// lock; [`prefixed`](MakeKey::prefixed) sets it apart from other keys.
///
/// ```
/// use tower_lock::{LockClient, LockLayer, grpc::GrpcRejection, key};
///
/// // Each method of the service runs one call at a time, across instances.
/// let layer = LockLayer::new(LockClient::in_memory())
///     .key(key::grpc_method())
///     .on_rejected(GrpcRejection);
/// # let _ = layer;
/// ```
#[cfg(feature = "grpc")]
pub fn grpc_method() -> GrpcMethod {
    GrpcMethod
}

#[cfg(feature = "grpc")]
impl MakeKey for GrpcMethod {
    /// The request path, which gRPC sets to `/package.Service/Method`.
    fn make_key(&self, parts: &mut Parts) -> Option<Vec<u8>> {
        let path = parts.uri.path();
        (path.len() > 1).then(|| path.as_bytes().to_vec())
    }

    /// None: the method names its resource, wherever the layer runs.
    fn namespace(&self, _parts: &Parts, _route: &str) -> String {
        String::new()
    }
}

/// `prefixed` as an inherent method too, so it needs no `use tower_lock::key::MakeKey`.
macro_rules! prefixed_without_import {
    ($($ty:ty),* $(,)?) => {$(
        impl $ty {
            /// See [`MakeKey::prefixed`]: the same key with `prefix` in front of it, which
            /// also names the resource the lock is for.
            pub fn prefixed(self, prefix: impl Into<Cow<'static, str>>) -> Prefixed<Self> {
                MakeKey::prefixed(self, prefix)
            }
        }
    )*};
}

prefixed_without_import!(Header, Query, PathSegment);
#[cfg(feature = "grpc")]
prefixed_without_import!(GrpcMethod);

impl<F> FromFn<F>
where
    F: Fn(&Parts) -> Option<String> + Clone + Send + Sync + 'static,
{
    /// See [`MakeKey::prefixed`]: the same key with `prefix` in front of it, which also names
    /// the resource the lock is for.
    pub fn prefixed(self, prefix: impl Into<Cow<'static, str>>) -> Prefixed<Self> {
        MakeKey::prefixed(self, prefix)
    }
}
#[cfg(feature = "axum")]
prefixed_without_import!(PathParam);

/// A key computed by a function. Made by [`from_fn`].
#[derive(Clone)]
pub struct FromFn<F>(F);

impl<F> std::fmt::Debug for FromFn<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FromFn").finish_non_exhaustive()
    }
}

/// A key computed from the request head by `f`.
///
/// ```
/// use tower_lock::key;
///
/// let by_tenant_and_order = key::from_fn(|req: &http::request::Parts| {
///     let tenant = req.headers.get("x-tenant-id")?.to_str().ok()?;
///     let order = req.uri.path().rsplit('/').next()?;
///     Some(format!("{tenant}/{order}"))
/// });
/// # let _ = by_tenant_and_order;
/// ```
pub fn from_fn<F>(f: F) -> FromFn<F>
where
    F: Fn(&Parts) -> Option<String> + Clone + Send + Sync + 'static,
{
    FromFn(f)
}

impl<F> MakeKey for FromFn<F>
where
    F: Fn(&Parts) -> Option<String> + Clone + Send + Sync + 'static,
{
    fn make_key(&self, parts: &mut Parts) -> Option<Vec<u8>> {
        (self.0)(parts).map(String::into_bytes)
    }
}

/// A key with a fixed prefix. Made by [`MakeKey::prefixed`].
#[derive(Clone, Debug)]
pub struct Prefixed<K> {
    prefix: Cow<'static, str>,
    inner: K,
}

impl<K> Prefixed<K> {
    fn prefix_key(&self, key: &[u8]) -> Vec<u8> {
        let mut prefixed = Vec::with_capacity(self.prefix.len() + key.len());
        prefixed.extend_from_slice(self.prefix.as_bytes());
        prefixed.extend_from_slice(key);
        prefixed
    }
}

impl<K: MakeKey> MakeKey for Prefixed<K> {
    fn make_key(&self, parts: &mut Parts) -> Option<Vec<u8>> {
        let key = self.inner.make_key(parts)?;
        Some(self.prefix_key(&key))
    }

    /// Each key of a set prefixed too.
    fn make_keys(&self, parts: &mut Parts) -> Option<Keys> {
        Some(match self.inner.make_keys(parts)? {
            Keys::One(key) => Keys::One(self.prefix_key(&key)),
            Keys::Set(keys) => Keys::Set(keys.iter().map(|key| self.prefix_key(key)).collect()),
        })
    }

    /// None: the prefix names the resource (`account:` + the id), wherever the request came.
    fn namespace(&self, _parts: &Parts, _route: &str) -> String {
        String::new()
    }
}

/// An axum path parameter. Made by [`path_param`].
#[cfg(feature = "axum")]
#[derive(Clone, Debug)]
pub struct PathParam {
    name: Arc<str>,
}

/// The value of the axum path parameter `name` (`{id}` in the route `/accounts/{id}`), as axum
/// decoded it. Requires the layer to run inside the router (`Router::route_layer`).
///
/// # Examples
///
/// ```
/// use axum::{Router, routing::post};
/// use tower_lock::{LockClient, LockLayer, key};
///
/// async fn withdraw() {}
/// async fn deposit() {}
///
/// // Both routes take the same lock per account: `account:` plus the id (without the
/// // prefix, `/accounts/{id}` plus the id: a lock of its own, see the `layer` guide).
/// let app: Router = Router::new()
///     .route("/accounts/{id}/withdraw", post(withdraw))
///     .route("/accounts/{id}/deposit", post(deposit))
///     .route_layer(
///         LockLayer::new(LockClient::in_memory()).key(key::path_param("id").prefixed("account:")),
///     );
/// ```
#[cfg(feature = "axum")]
pub fn path_param(name: &str) -> PathParam {
    PathParam { name: name.into() }
}

#[cfg(feature = "axum")]
impl MakeKey for PathParam {
    fn make_key(&self, parts: &mut Parts) -> Option<Vec<u8>> {
        use axum::extract::{FromRequestParts, RawPathParams};
        use futures_util::FutureExt;
        // The extractor reads the router's extensions only; it is ready at once.
        let params = RawPathParams::from_request_parts(parts, &()).now_or_never()?.ok();
        let value = params.as_ref().and_then(|params| {
            params
                .iter()
                .find(|(name, _)| *name == &*self.name)
                .map(|(_, value)| value.as_bytes().to_vec())
        });
        if value.is_none() {
            self.report_missing(parts);
        }
        value
    }

    /// The route up to this parameter: `/accounts/:id` for `/accounts/{id}/withdraw`.
    fn namespace(&self, _parts: &Parts, route: &str) -> String {
        route_through_param(route, &self.name).unwrap_or_else(|| route.to_owned())
    }
}

#[cfg(feature = "axum")]
impl PathParam {
    /// Says once per route that the route has no such parameter: a misspelt name would
    /// otherwise show only as a 400 (or, with `skip_missing_key`, as no lock at all).
    fn report_missing(&self, parts: &Parts) {
        static REPORTED: RouteReports = RouteReports::new();
        let route = crate::middleware::route(parts);
        if REPORTED.first(route) {
            tracing::warn!(
                param = %self.name,
                route,
                "key::path_param: the matched route has no such path parameter (run the layer with `Router::route_layer`, and check the name)"
            );
        }
    }
}

/// The routes a misconfiguration was reported for, so that each is reported once (up to a
/// bound: routes are few, but a log line per request would drown the log).
#[cfg(feature = "axum")]
pub(crate) struct RouteReports(std::sync::Mutex<Vec<String>>);

#[cfg(feature = "axum")]
impl RouteReports {
    pub(crate) const fn new() -> Self {
        Self(std::sync::Mutex::new(Vec::new()))
    }

    /// Whether `route` is reported for the first time (and not past the bound).
    pub(crate) fn first(&self, route: &str) -> bool {
        let mut reported = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if reported.len() >= 64 || reported.iter().any(|seen| seen == route) {
            return false;
        }
        reported.push(route.to_owned());
        true
    }
}

/// `route` up to and including its `{param}` segment (`/accounts/{id}`); `None` when it has no
/// such segment.
#[cfg(feature = "axum")]
pub(crate) fn route_through_param(route: &str, param: &str) -> Option<String> {
    let segment = format!("{{{param}}}");
    let mut through = String::with_capacity(route.len());
    for part in route.split('/').filter(|part| !part.is_empty()) {
        through.push('/');
        through.push_str(part);
        if part == segment {
            return Some(through);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(uri: &str) -> Parts {
        let (parts, ()) =
            http::Request::get(uri).header("x-tenant-id", "acme").body(()).unwrap().into_parts();
        parts
    }

    /// Each extractor finds its key, and gives none when the request has none.
    #[test]
    fn extractors_find_their_keys() {
        let mut p = parts("/accounts/4%202/withdraw?id=a%2Bb+c&x=1");
        assert_eq!(header("x-tenant-id").make_key(&mut p), Some(b"acme".to_vec()));
        assert_eq!(
            header("X-Tenant-Id").make_key(&mut p),
            Some(b"acme".to_vec()),
            "a header name in any case"
        );
        assert_eq!(header("x-other").make_key(&mut p), None);
        assert_eq!(query("id").make_key(&mut p), Some(b"a+b c".to_vec()));
        assert_eq!(query("missing").make_key(&mut p), None);
        assert_eq!(path_segment(1).make_key(&mut p), Some(b"4 2".to_vec()));
        assert_eq!(path_segment(3).make_key(&mut p), None);
        let prefixed = path_segment(0).prefixed("kind:");
        assert_eq!(prefixed.make_key(&mut p), Some(b"kind:accounts".to_vec()));
        let f = from_fn(|p: &Parts| Some(p.uri.path().to_owned()));
        assert_eq!(f.make_key(&mut p), Some(b"/accounts/4%202/withdraw".to_vec()));
    }

    /// The query string is decoded as a form: `+` is a space and `%2B` a plus, in names too;
    /// the first of repeated parameters counts; a name without `=` has an empty value (which
    /// the engine then refuses as an empty key); malformed escapes are kept as they are.
    #[test]
    fn query_decoding() {
        let key = |name: &str, uri: &str| query(name).make_key(&mut parts(uri));
        let bytes = |s: &str| Some(s.as_bytes().to_vec());
        assert_eq!(key("id", "/?id=a%20b+c%2Bd"), bytes("a b c+d"));
        assert_eq!(key("my id", "/?my+id=1"), bytes("1"));
        assert_eq!(key("my id", "/?my%20id=1"), bytes("1"));
        assert_eq!(key("id", "/?i%64=1"), bytes("1"), "an escaped name");
        assert_eq!(key("a+b", "/?a%2Bb=1&a+b=2"), bytes("1"));
        assert_eq!(key("id", "/?id=1&id=2"), bytes("1"), "the first of repeated params");
        assert_eq!(key("id", "/?id=&id=2"), bytes(""), "an empty first value counts");
        assert_eq!(key("id", "/?id"), bytes(""));
        assert_eq!(key("id", "/?&&id=1&"), bytes("1"), "empty pairs are skipped");
        assert_eq!(key("id", "/?id=a=b"), bytes("a=b"), "split at the first `=`");
        assert_eq!(key("id", "/?x=1&y=id"), None);
        assert_eq!(key("id", "/?ID=1"), None, "names are case-sensitive");
        assert_eq!(key("id", "/"), None);
        assert_eq!(key("id", "/?"), None);
        assert_eq!(key("id", "/?id=%G1%4"), bytes("%G1%4"), "malformed escapes kept");
        assert_eq!(key("id", "/?id=%c3%a9"), bytes("é"));
    }

    /// Bytes that are not UTF-8 are passed on as they are, not replaced by `U+FFFD`: two such
    /// keys never collapse into one lock.
    #[test]
    fn query_keeps_invalid_utf8() {
        let key = |uri: &str| query("id").make_key(&mut parts(uri));
        assert_eq!(key("/?id=%FF"), Some(vec![0xff]));
        assert_eq!(key("/?id=%FE"), Some(vec![0xfe]));
        assert_eq!(key("/?id=caf%E9+x"), Some(b"caf\xe9 x".to_vec()));
        let mut p = parts("/?%FF=1&%FE=2");
        let name = String::from_utf8_lossy(&[0xfe]).into_owned();
        assert_eq!(query(&name).make_key(&mut p), None, "no lossy match on the name");
    }

    /// A header value outside visible ASCII gives no key rather than a lossy one.
    #[test]
    fn non_ascii_header_gives_no_key() {
        let (mut p, ()) = http::Request::get("/")
            .header("x-k", http::HeaderValue::from_bytes(b"caf\xe9").unwrap())
            .body(())
            .unwrap()
            .into_parts();
        assert_eq!(header("x-k").make_key(&mut p), None);
    }
}
