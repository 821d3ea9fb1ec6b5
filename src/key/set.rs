//! Extractors of several keys: a request that touches several resources takes all their locks.

use std::{borrow::Cow, sync::Arc};

use http::request::Parts;

use super::extract::{Keys, MakeKey, Prefixed};

/// Several keys, one from each extractor. Made by [`all`].
#[derive(Clone, Debug)]
pub struct All<K>(Arc<[K]>);

/// One key from each of `keys`, locked together: a request that touches several resources
/// (a transfer between two accounts) holds all their locks while it runs. The layer takes them
/// as [`LockClient::lock_all`](crate::LockClient::lock_all) does: in one canonical order, so
/// that two requests naming the same accounts in opposite orders cannot deadlock, all or
/// nothing within the layer's wait. A key found twice is one lock. If any extractor finds no
/// key, the request has none (400, or no lock with `skip_missing_key`).
///
/// The locks' namespace is the one all the extractors agree on, else the matched route: give
/// the set a prefix (or the layer a [`name`](crate::LockLayer::name)) to share its locks with
/// other routes, as below, where `account:<id>` is the lock of an account on every route.
/// Extractors of different types go through [`from_fn_many`].
///
/// ```
/// # #[cfg(feature = "axum")] {
/// use axum::{Router, routing::post};
/// use tower_lock::{LockClient, LockLayer, key};
///
/// async fn transfer() {}
///
/// let app: Router = Router::new()
///     .route("/transfers/{from}/{to}", post(transfer))
///     .route_layer(
///         LockLayer::new(LockClient::in_memory())
///             .key(key::all([key::path_param("from"), key::path_param("to")]).prefixed("account:")),
///     );
/// # }
/// ```
///
/// # Panics
/// When `keys` is empty: a programming error, caught when the layer is built.
pub fn all<K: MakeKey>(keys: impl IntoIterator<Item = K>) -> All<K> {
    let keys: Arc<[K]> = keys.into_iter().collect();
    assert!(!keys.is_empty(), "key::all: no extractors given");
    All(keys)
}

impl<K: MakeKey> MakeKey for All<K> {
    /// A set has no single key: the layer asks [`make_keys`](MakeKey::make_keys).
    fn make_key(&self, _parts: &mut Parts) -> Option<Vec<u8>> {
        None
    }

    fn make_keys(&self, parts: &mut Parts) -> Option<Keys> {
        let mut keys = Vec::with_capacity(self.0.len());
        for extractor in self.0.iter() {
            match extractor.make_keys(parts)? {
                Keys::One(key) => keys.push(key),
                Keys::Set(set) => keys.extend(set),
            }
        }
        Some(Keys::Set(keys))
    }

    /// The namespace every extractor names, when they agree; else the matched route.
    fn namespace(&self, parts: &Parts, route: &str) -> String {
        let mut namespaces = self.0.iter().map(|key| key.namespace(parts, route));
        let first = namespaces.next().unwrap_or_default();
        if namespaces.all(|namespace| namespace == first) { first } else { route.to_owned() }
    }
}

impl<K: MakeKey> All<K> {
    /// See [`MakeKey::prefixed`]: every key of the set with `prefix` in front of it, which
    /// also names the resource the locks are for.
    pub fn prefixed(self, prefix: impl Into<Cow<'static, str>>) -> Prefixed<Self> {
        MakeKey::prefixed(self, prefix)
    }
}

/// Several keys computed by a function. Made by [`from_fn_many`].
#[derive(Clone)]
pub struct FromFnMany<F>(F);

impl<F> std::fmt::Debug for FromFnMany<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FromFnMany").finish_non_exhaustive()
    }
}

/// Several keys computed from the request head by `f`, locked together as [`all`]'s are.
/// `None`, or no keys at all, means the request has none. The locks' namespace is the matched
/// route unless the set is [`prefixed`](FromFnMany::prefixed) or the layer has a
/// [`name`](crate::LockLayer::name).
///
/// ```
/// use tower_lock::{LockClient, LockLayer, key};
///
/// // `POST /merge?into=7` with `x-from: 3`: lock documents 7 and 3.
/// let merge = key::from_fn_many(|req: &http::request::Parts| {
///     let into = req.uri.query()?.strip_prefix("into=")?.to_owned();
///     let from = req.headers.get("x-from")?.to_str().ok()?.to_owned();
///     Some(vec![into, from])
/// });
/// let layer = LockLayer::new(LockClient::in_memory()).key(merge.prefixed("doc:"));
/// # let _ = layer;
/// ```
///
/// A JSON body is not part of the request head: to lock on fields of the body, use
/// `#[locked(keys = [...])]` on the handler, whose templates see its `Json` binding (see the
/// `attribute` guide).
pub fn from_fn_many<F>(f: F) -> FromFnMany<F>
where
    F: Fn(&Parts) -> Option<Vec<String>> + Clone + Send + Sync + 'static,
{
    FromFnMany(f)
}

impl<F> MakeKey for FromFnMany<F>
where
    F: Fn(&Parts) -> Option<Vec<String>> + Clone + Send + Sync + 'static,
{
    /// A set has no single key: the layer asks [`make_keys`](MakeKey::make_keys).
    fn make_key(&self, _parts: &mut Parts) -> Option<Vec<u8>> {
        None
    }

    fn make_keys(&self, parts: &mut Parts) -> Option<Keys> {
        let keys = (self.0)(parts)?;
        if keys.is_empty() {
            return None;
        }
        Some(Keys::Set(keys.into_iter().map(String::into_bytes).collect()))
    }
}

impl<F> FromFnMany<F>
where
    F: Fn(&Parts) -> Option<Vec<String>> + Clone + Send + Sync + 'static,
{
    /// See [`MakeKey::prefixed`]: every key of the set with `prefix` in front of it, which
    /// also names the resource the locks are for.
    pub fn prefixed(self, prefix: impl Into<Cow<'static, str>>) -> Prefixed<Self> {
        MakeKey::prefixed(self, prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{header, query};

    /// A set finds every member's key, none when one is missing, and prefixes each.
    #[test]
    fn sets_find_every_key() {
        let (mut parts, ()) =
            http::Request::get("/t?from=1&to=2").header("x-a", "9").body(()).unwrap().into_parts();
        let set = all([query("from"), query("to")]);
        assert_eq!(set.make_key(&mut parts), None);
        assert_eq!(set.make_keys(&mut parts), Some(Keys::Set(vec![b"1".to_vec(), b"2".to_vec()])));
        assert_eq!(all([query("from"), query("nope")]).make_keys(&mut parts), None);
        assert_eq!(
            all([header("x-a")]).prefixed("k:").make_keys(&mut parts),
            Some(Keys::Set(vec![b"k:9".to_vec()]))
        );
        assert_eq!(
            query("from").prefixed("k:").make_keys(&mut parts),
            Some(Keys::One(b"k:1".to_vec()))
        );
        let none = from_fn_many(|_: &Parts| Some(Vec::new()));
        assert_eq!(none.make_keys(&mut parts), None, "an empty set is no key");
    }
}
