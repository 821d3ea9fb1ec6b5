//! Lock names: how an untrusted user key becomes the name of a lock in the backend. (How a
//! key is taken from a request is the [`key`](crate::key) module's part.)
//!
//! A lock named `order:42` under the prefix `tower-lock:` lives at the Redis key
//! `tower-lock:{order:42}`; every other key of the same lock (its fencing counter, its release
//! channel) appends a suffix after the closing brace. The braces make the user key the Redis
//! Cluster hash tag, so all keys of one lock share a hash slot.
//!
//! The user key usually comes from request data, so it is escaped before it is placed between
//! the braces: `%`, `{`, `}`, control bytes, DEL and every byte outside ASCII are
//! percent-encoded. The encoding is injective (two different user keys never name the same
//! lock), keeps the hash tag intact, and keeps backend keys printable. Empty keys and keys longer
//! than the configured maximum (512 bytes by default) are refused before any backend call.
//!
//! With the `keyed-hash` feature, a client built with
//! `LockClientBuilder::keyed_hash` puts `base64url(HMAC-SHA256(secret,
//! namespace and key))` between the braces instead: 43 characters whatever the key, in a hash
//! slot nobody without the secret can predict.

use std::{
    fmt,
    hash::{BuildHasher, BuildHasherDefault, Hash, Hasher, RandomState},
    sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError},
};

use std::borrow::Cow;

use percent_encoding::{AsciiSet, CONTROLS, percent_decode, percent_encode};

#[cfg(feature = "keyed-hash")]
mod hashed;

#[cfg(feature = "keyed-hash")]
pub(crate) use hashed::KeyedHash;

/// A namespace as lock names and logs show it: a route's parameters are written `:id` rather
/// than `{id}`, so no brace (the hash tag's delimiter) needs escaping.
pub(crate) fn readable(namespace: &str) -> Cow<'_, str> {
    if !namespace.contains(['{', '}']) {
        return Cow::Borrowed(namespace);
    }
    Cow::Owned(
        namespace
            .chars()
            .filter_map(|c| match c {
                '{' => Some(':'),
                '}' => None,
                c => Some(c),
            })
            .collect(),
    )
}

/// Bytes escaped inside the hash tag. Non-ASCII bytes are always escaped by `percent_encode`.
const ESCAPED: &AsciiSet = &CONTROLS.add(b'%').add(b'{').add(b'}');

/// The default maximum length of a user key, in bytes.
pub const DEFAULT_MAX_KEY_LEN: usize = 512;

/// Why a user key was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The key is empty.
    #[error("key is empty")]
    Empty,
    /// The key is longer than the configured maximum.
    #[error("key is {len} bytes long, over the maximum of {max}")]
    TooLong {
        /// The key's length in bytes.
        len: usize,
        /// The configured maximum.
        max: usize,
    },
}

/// A validated, escaped lock name, as the backend stores it.
///
/// Backends receive a `LockKey` and derive the names of their own keys from
/// [`as_str`](Self::as_str) by appending a suffix (see [`derived`](Self::derived)).
#[derive(Clone)]
pub struct LockKey {
    // Shared: a lock's name is cloned into every attempt, hold and log line that names it.
    name: Arc<str>,
    // The name's hash under this process's random keys, taken once: every table lookup of an
    // acquire and a release hashes the key.
    hash: u64,
}

/// The keys every lock name is hashed with in this process: random, so names chosen by a
/// client cannot be made to collide.
static NAME_HASHER: LazyLock<RandomState> = LazyLock::new(RandomState::new);

impl PartialEq for LockKey {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.name == other.name
    }
}

impl Eq for LockKey {}

impl Hash for LockKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// A map keyed by lock names that hashes each by the hash it carries (computed once, when the
/// key was made).
pub(crate) type KeyMap<V> = std::collections::HashMap<LockKey, V, BuildHasherDefault<NameHash>>;

/// Values spread over a fixed number of mutexes by lock name, so that threads working on
/// different locks rarely wait for one another (or share the cache lines of one map). Each
/// critical section is a few map operations, never an await: std mutexes.
#[derive(Debug)]
pub(crate) struct Shards<T>(Box<[Shard<T>]>);

/// One shard, on cache lines of its own: threads at work on different shards do not take
/// each other's lines (128 bytes: CPUs fetch lines in pairs).
#[derive(Debug)]
#[repr(align(128))]
struct Shard<T>(Mutex<T>);

impl<T> Shards<T> {
    /// How many shards there are.
    const COUNT: usize = 16;

    /// Shards made by `make`.
    pub(crate) fn new(mut make: impl FnMut() -> T) -> Self {
        Self((0..Self::COUNT).map(|_| Shard(Mutex::new(make()))).collect())
    }

    /// The shard that keeps what concerns the lock `key`.
    pub(crate) fn of(&self, key: &LockKey) -> MutexGuard<'_, T> {
        self.by_hash(key.name_hash())
    }

    /// The shard that keeps what concerns `name` (a lock's name, or a part of one).
    pub(crate) fn of_name(&self, name: &str) -> MutexGuard<'_, T> {
        self.by_hash(NAME_HASHER.hash_one(name))
    }

    fn by_hash(&self, hash: u64) -> MutexGuard<'_, T> {
        // The remainder is below COUNT: the cast cannot truncate.
        let shard = &self.0[(hash % Self::COUNT as u64) as usize];
        shard.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every shard in turn, for what looks at all locks.
    pub(crate) fn each(&self) -> impl Iterator<Item = MutexGuard<'_, T>> {
        self.0.iter().map(|shard| shard.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl<T: Default> Default for Shards<T> {
    fn default() -> Self {
        Self::new(T::default)
    }
}

/// Hashes a [`LockKey`] by the hash it carries.
#[derive(Default)]
pub(crate) struct NameHash(u64);

impl Hasher for NameHash {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is expected; anything else still hashes correctly.
        for &byte in bytes {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn write_u64(&mut self, hash: u64) {
        self.0 = hash;
    }
}

impl LockKey {
    /// Builds the lock name for `user_key` under `prefix`.
    ///
    /// # Errors
    /// [`KeyError::Empty`] for an empty key, [`KeyError::TooLong`] for a key over `max_len` bytes.
    #[cfg(test)]
    pub(crate) fn new(prefix: &str, user_key: &[u8], max_len: usize) -> Result<Self, KeyError> {
        Self::namespaced(prefix, "", user_key, max_len)
    }

    /// Builds the lock name for `user_key` in `namespace` (a route, say) under `prefix`:
    /// `prefix` + escaped namespace + `{escaped key}`. Keys of different namespaces never
    /// collide, and the hash tag is still the user key alone.
    ///
    /// # Errors
    /// [`KeyError::Empty`] for an empty key, [`KeyError::TooLong`] for a key over `max_len` bytes.
    pub(crate) fn namespaced(
        prefix: &str,
        namespace: &str,
        user_key: &[u8],
        max_len: usize,
    ) -> Result<Self, KeyError> {
        check_len(user_key, max_len)?;
        Ok(Self::with_tag(prefix, namespace, percent_encode(user_key, ESCAPED)))
    }

    /// `prefix` + escaped namespace + `{tag}`; `tag` must be non-empty and free of braces.
    fn with_tag<'t>(prefix: &str, namespace: &str, tag: impl Iterator<Item = &'t str>) -> Self {
        let namespace = readable(namespace);
        Self::shared(crate::scratch::shared(|name| {
            name.push_str(prefix);
            name.extend(percent_encode(namespace.as_bytes(), ESCAPED));
            name.push('{');
            name.extend(tag);
            name.push('}');
        }))
    }

    /// The same lock name with `suffix` appended: another lock with the same hash slot.
    pub(crate) fn with_suffix(&self, suffix: &str) -> Self {
        Self::named(self.derived(suffix))
    }

    fn named(name: String) -> Self {
        Self::shared(name.into())
    }

    fn shared(name: Arc<str>) -> Self {
        Self { hash: NAME_HASHER.hash_one(&*name), name }
    }

    /// The name's hash under this process's random keys (equal names, equal hashes).
    pub(crate) fn name_hash(&self) -> u64 {
        self.hash
    }

    /// The lock's name in the backend, `prefix{escaped key}`.
    pub fn as_str(&self) -> &str {
        &self.name
    }

    /// The name of another key of the same lock: `prefix{escaped key}suffix`. It shares the
    /// lock's Redis Cluster hash slot.
    pub fn derived(&self, suffix: &str) -> String {
        let mut name = String::with_capacity(self.name.len() + suffix.len());
        name.push_str(&self.name);
        name.push_str(suffix);
        name
    }

    /// The user key this lock was built from, decoded back to its original bytes. In keyed-hash
    /// mode the key is not kept: this is the hash tag's text.
    pub fn user_key(&self) -> Vec<u8> {
        let start = self.name.find('{').map_or(0, |i| i + 1);
        let end = self.name.rfind('}').unwrap_or(self.name.len());
        let inner = &self.name[start..end];
        percent_decode(inner.as_bytes()).collect()
    }
}

/// Shows the escaped name, cut to a bounded length so a long key cannot flood a log line.
impl fmt::Debug for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 96;
        match self.name.get(..SHOWN) {
            Some(head) if self.name.len() > SHOWN => write!(f, "{head}…"),
            _ => f.write_str(&self.name),
        }
    }
}

/// Refuses empty keys and keys over `max_len` bytes.
fn check_len(user_key: &[u8], max_len: usize) -> Result<(), KeyError> {
    if user_key.is_empty() {
        return Err(KeyError::Empty);
    }
    if user_key.len() > max_len {
        return Err(KeyError::TooLong { len: user_key.len(), max: max_len });
    }
    Ok(())
}

/// Checks a key prefix: braces in it would move the Redis Cluster hash tag.
pub(crate) fn valid_prefix(prefix: &str) -> bool {
    !prefix.contains(['{', '}'])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(raw: &[u8]) -> LockKey {
        LockKey::new("p:", raw, DEFAULT_MAX_KEY_LEN).unwrap()
    }

    /// Plain keys are kept readable inside the hash tag.
    #[test]
    fn plain_key_layout() {
        assert_eq!(key(b"order:42").as_str(), "p:{order:42}");
        assert_eq!(key(b"order:42").derived(":fence"), "p:{order:42}:fence");
    }

    /// Braces, percent signs, control bytes and non-ASCII bytes cannot escape the hash tag.
    #[test]
    fn hostile_bytes_are_escaped() {
        let k = key(b"42}:q{x%\x00\x7f\xff");
        assert_eq!(k.as_str(), "p:{42%7D:q%7Bx%25%00%7F%FF}");
        assert_eq!(k.as_str().matches('{').count(), 1);
        assert_eq!(k.as_str().matches('}').count(), 1);
    }

    /// Decoding the stored name gives back the exact user key.
    #[test]
    fn escaping_round_trips() {
        for raw in [&b"a"[..], b"{}", b"%25", b"\x00\x01", "ünï".as_bytes(), b"a b"] {
            assert_eq!(key(raw).user_key(), raw);
        }
    }

    /// Distinct user keys give distinct names, including keys that look like escapes.
    #[test]
    fn escaping_is_injective_on_lookalikes() {
        assert_ne!(key(b"%7B"), key(b"{"));
        assert_ne!(key(b"a}"), key(b"a%7D"));
    }

    /// Empty and oversized keys are refused with the reason.
    #[test]
    fn refuses_empty_and_long_keys() {
        assert_eq!(LockKey::new("p:", b"", 8), Err(KeyError::Empty));
        assert_eq!(LockKey::new("p:", b"123456789", 8), Err(KeyError::TooLong { len: 9, max: 8 }));
        assert!(LockKey::new("p:", b"12345678", 8).is_ok());
    }

    /// Namespaces (route templates, their parameters written `:id`) stay outside the hash tag
    /// and apart.
    #[test]
    fn namespaces_keep_routes_apart() {
        let orders = LockKey::namespaced("p:", "/orders/{id}", b"42", 512).unwrap();
        let accounts = LockKey::namespaced("p:", "/accounts/{id}", b"42", 512).unwrap();
        assert_eq!(orders.as_str(), "p:/orders/:id{42}");
        assert_ne!(orders, accounts);
        assert_eq!(orders.user_key(), b"42");
    }

    /// Prefixes with braces are refused because they would move the hash tag.
    #[test]
    fn prefix_validation() {
        assert!(valid_prefix("tower-lock:"));
        assert!(!valid_prefix("a{b"));
        assert!(!valid_prefix("a}b"));
    }
}
