//! Where answers are kept: the [`AnswerStore`] trait, and [`MemoryAnswerStore`].

use std::{
    collections::HashMap,
    fmt,
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use bytes::Bytes;
use tokio::time::Instant;

use crate::{Backend, LockKey, MemoryBackend, error::BackendError};

/// An answer as a store keeps it: the fencing token of the lock it was made under, and the
/// encoded response (opaque to the store).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
///
/// use tower_lock::{LockClient, LockKind, idempotency::{AnswerStore, MemoryAnswerStore, Put, Record}};
///
/// let store = MemoryAnswerStore::new();
/// let key = LockClient::in_memory().lock_key("idempotency:", "-:k", LockKind::Exclusive)?;
/// let record = |token| Record { token, answer: "an encoded answer".into() };
/// let day = Duration::from_secs(86_400);
/// assert_eq!(store.put(&key, record(20), day).await?, Put::Stored);
/// // A put under an older lock (a holder that lost it) changes nothing.
/// assert_eq!(store.put(&key, record(10), day).await?, Put::Stale { kept: 20 });
/// assert_eq!(store.get(&key).await?.map(|kept| kept.token), Some(20));
/// # Ok(())
/// # }
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Record {
    /// The fencing token of the lock held while the answer was made. A store refuses to
    /// replace a record with one carrying a lower token.
    pub token: u64,
    /// The answer, encoded by the layer: status, headers, body, trailers and the request's
    /// fingerprint.
    pub answer: Bytes,
}

impl fmt::Debug for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Record")
            .field("token", &self.token)
            .field("answer_len", &self.answer.len())
            .finish()
    }
}

/// What became of a [`put`](AnswerStore::put).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Put {
    /// The record is kept (it replaced a record with a lower or equal token, or none).
    Stored,
    /// The store keeps a record with a higher token, made by a later holder of the key's lock:
    /// the put changed nothing.
    Stale {
        /// The token of the record the store keeps.
        kept: u64,
    },
}

/// A store of answers: one [`Record`] per idempotency key, each kept for a time and replaced
/// only by a record carrying a token at least as high (a fenced write).
///
/// The key is the name of the key's lock ([`LockKey`]); a store derives its own key from it
/// (the Redis store appends `:answer`, so that the record shares the lock's Redis Cluster hash
/// slot). [`MemoryAnswerStore`] and, with feature `redis`, `RedisAnswerStore` implement it;
/// another store implements the two methods with the same contract.
///
/// ```
/// use std::{collections::HashMap, sync::Mutex, time::Duration};
///
/// use tower_lock::{
///     LockKey, error::BackendError,
///     idempotency::{AnswerStore, Put, Record},
/// };
///
/// /// Keeps answers forever, in one map: enough for a test.
/// #[derive(Default)]
/// struct MapStore(Mutex<HashMap<String, Record>>);
///
/// impl AnswerStore for MapStore {
///     async fn get(&self, key: &LockKey) -> Result<Option<Record>, BackendError> {
///         Ok(self.0.lock().unwrap().get(key.as_str()).cloned())
///     }
///
///     async fn put(&self, key: &LockKey, record: Record, _ttl: Duration) -> Result<Put, BackendError> {
///         let mut map = self.0.lock().unwrap();
///         match map.get(key.as_str()) {
///             Some(kept) if kept.token > record.token => Ok(Put::Stale { kept: kept.token }),
///             _ => {
///                 map.insert(key.as_str().to_owned(), record);
///                 Ok(Put::Stored)
///             }
///         }
///     }
/// }
/// # let _ = MapStore::default();
/// ```
pub trait AnswerStore: Send + Sync + 'static {
    /// The record kept for `key`, if any (and not expired).
    ///
    /// # Errors
    /// The store's failures: the layer then answers 503 rather than guess.
    fn get(
        &self,
        key: &LockKey,
    ) -> impl Future<Output = Result<Option<Record>, BackendError>> + Send;

    /// Keeps `record` for `key` for `ttl`, in one atomic step with the check: unless the record
    /// kept for `key` carries a higher token, in which case nothing changes and the answer is
    /// [`Put::Stale`].
    ///
    /// # Errors
    /// The store's failures (the answer is then not known to be kept).
    fn put(
        &self,
        key: &LockKey,
        record: Record,
        ttl: Duration,
    ) -> impl Future<Output = Result<Put, BackendError>> + Send;
}

/// A lock backend whose locks carry fencing tokens, which the idempotency layer needs: every
/// answer it stores is fenced by the token of the lock held while it was made. The in-memory
/// and the Redis backends issue them; Redlock does not (it refuses fencing), so an
/// [`IdempotencyLayer`](super::IdempotencyLayer) cannot be built on it. A backend of one's own
/// (feature `unstable-backend`) that issues fencing tokens implements this trait to be used
/// with the layer.
///
/// ```
/// use tower_lock::{Backend, LockClient, idempotency::FencingBackend};
///
/// fn takes_keys<B: FencingBackend>(locks: LockClient<B>) -> LockClient<B> { locks }
/// let locks = takes_keys(LockClient::in_memory());
/// # let _ = locks;
/// ```
pub trait FencingBackend: Backend {}

impl FencingBackend for MemoryBackend {}

#[cfg(feature = "redis")]
impl FencingBackend for crate::RedisBackend {}

/// Answers kept in this process: for tests, and for a service that runs as one instance.
///
/// Cheap to clone; clones share the answers. Expired answers are dropped when they are read,
/// and all of them every 1024 puts. Its clock is tokio's, so a test that pauses it
/// (`tokio::time::pause`) sees answers expire with it.
///
/// ```
/// use tower_lock::{LockClient, idempotency::{IdempotencyLayer, MemoryAnswerStore}};
///
/// let layer = IdempotencyLayer::new(LockClient::in_memory(), MemoryAnswerStore::new());
/// # let _ = layer;
/// ```
#[derive(Clone, Default)]
pub struct MemoryAnswerStore {
    inner: Arc<Mutex<Answers>>,
}

#[derive(Default)]
struct Answers {
    records: HashMap<Arc<str>, (Record, Instant)>,
    /// Puts since the last sweep of expired records.
    puts: u32,
}

/// How many puts pass between two sweeps of expired records.
const SWEEP_EVERY: u32 = 1024;

impl MemoryAnswerStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many answers the store keeps (expired ones not swept yet included).
    pub fn len(&self) -> usize {
        self.lock().records.len()
    }

    /// Whether the store keeps no answer.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    // A std mutex: each critical section is a map operation, never an await.
    fn lock(&self) -> std::sync::MutexGuard<'_, Answers> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl fmt::Debug for MemoryAnswerStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryAnswerStore").field("answers", &self.len()).finish()
    }
}

impl AnswerStore for MemoryAnswerStore {
    async fn get(&self, key: &LockKey) -> Result<Option<Record>, BackendError> {
        let now = Instant::now();
        let mut answers = self.lock();
        match answers.records.get(key.as_str()) {
            Some((record, expires)) if *expires > now => Ok(Some(record.clone())),
            Some(_) => {
                answers.records.remove(key.as_str());
                Ok(None)
            }
            None => Ok(None),
        }
    }

    async fn put(&self, key: &LockKey, record: Record, ttl: Duration) -> Result<Put, BackendError> {
        let now = Instant::now();
        let mut answers = self.lock();
        answers.puts += 1;
        if answers.puts >= SWEEP_EVERY {
            answers.puts = 0;
            answers.records.retain(|_, (_, expires)| *expires > now);
        }
        if let Some((kept, expires)) = answers.records.get(key.as_str())
            && *expires > now
            && kept.token > record.token
        {
            return Ok(Put::Stale { kept: kept.token });
        }
        let expires = now.checked_add(ttl).unwrap_or_else(far_future);
        answers.records.insert(key.as_str().into(), (record, expires));
        Ok(Put::Stored)
    }
}

/// An instant no TTL reaches: about 30 years from now.
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(30 * 365 * 24 * 60 * 60)
}

/// A boxed store call, `Send` so that the response future can be.
pub(crate) type StoreFuture<T> = Pin<Box<dyn Future<Output = Result<T, BackendError>> + Send>>;

/// A store behind a pointer, its futures boxed: the layer's types do not name the store.
pub(crate) trait DynStore: Send + Sync + 'static {
    fn get(self: Arc<Self>, key: LockKey) -> StoreFuture<Option<Record>>;
    fn put(self: Arc<Self>, key: LockKey, record: Record, ttl: Duration) -> StoreFuture<Put>;
}

impl<S: AnswerStore> DynStore for S {
    fn get(self: Arc<Self>, key: LockKey) -> StoreFuture<Option<Record>> {
        Box::pin(async move { AnswerStore::get(&*self, &key).await })
    }

    fn put(self: Arc<Self>, key: LockKey, record: Record, ttl: Duration) -> StoreFuture<Put> {
        Box::pin(async move { AnswerStore::put(&*self, &key, record, ttl).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> LockKey {
        crate::LockClient::in_memory()
            .lock_key("idempotency:", name, crate::LockKind::Exclusive)
            .unwrap()
    }

    fn record(token: u64, answer: &'static str) -> Record {
        Record { token, answer: Bytes::from_static(answer.as_bytes()) }
    }

    /// A put with a lower token than the kept one changes nothing; an equal or higher one
    /// replaces it.
    #[tokio::test]
    async fn puts_are_fenced_by_token() {
        let store = MemoryAnswerStore::new();
        let k = key("a");
        let ttl = Duration::from_secs(60);
        assert_eq!(store.put(&k, record(5, "five"), ttl).await.unwrap(), Put::Stored);
        assert_eq!(store.put(&k, record(4, "four"), ttl).await.unwrap(), Put::Stale { kept: 5 });
        assert_eq!(store.get(&k).await.unwrap(), Some(record(5, "five")));
        assert_eq!(store.put(&k, record(5, "again"), ttl).await.unwrap(), Put::Stored);
        assert_eq!(store.put(&k, record(9, "nine"), ttl).await.unwrap(), Put::Stored);
        assert_eq!(store.get(&k).await.unwrap(), Some(record(9, "nine")));
    }

    /// Records expire after their TTL, on tokio's clock; an expired record fences nothing.
    #[tokio::test(start_paused = true)]
    async fn records_expire() {
        let store = MemoryAnswerStore::new();
        let k = key("b");
        store.put(&k, record(7, "x"), Duration::from_secs(2)).await.unwrap();
        tokio::time::advance(Duration::from_millis(1999)).await;
        assert!(store.get(&k).await.unwrap().is_some());
        tokio::time::advance(Duration::from_millis(2)).await;
        assert_eq!(store.get(&k).await.unwrap(), None);
        assert!(store.is_empty());
        store.put(&k, record(7, "x"), Duration::from_secs(2)).await.unwrap();
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(
            store.put(&k, record(1, "y"), Duration::from_secs(2)).await.unwrap(),
            Put::Stored
        );
    }
}
