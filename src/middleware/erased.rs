//! [`AnyLockClient`]: a lock client whose backend type is not part of its type.

use std::{fmt, future::Future, pin::Pin, sync::Arc, time::Duration};

use super::LockContext;
use crate::{
    Backend, Holder, Lease, LockClient, LockError, LockGuard, LockKey, LockKind, MultiGuard,
    key::KeyError,
};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A [`LockClient`] of any backend, for code that cannot name the backend type: the
/// `#[locked]` attribute finds its client as an `AnyLockClient` in the request's extensions
/// (where every [`LockLayer`](super::LockLayer) puts one) or in the router's state.
///
/// Cheap to clone; it shares everything with the client it was made from.
///
/// ```
/// use tower_lock::{AnyLockClient, LockClient};
///
/// let locks = LockClient::in_memory();
/// let any = AnyLockClient::from(locks);
/// # let _ = any;
/// ```
#[derive(Clone)]
pub struct AnyLockClient {
    inner: Arc<dyn ErasedClient>,
}

impl<B: Backend> From<LockClient<B>> for AnyLockClient {
    fn from(client: LockClient<B>) -> Self {
        Self { inner: Arc::new(client) }
    }
}

impl fmt::Debug for AnyLockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnyLockClient").finish_non_exhaustive()
    }
}

/// One acquire, with every setting stated.
pub(crate) struct Acquire {
    pub(crate) key: LockKey,
    pub(crate) kind: LockKind,
    /// `None`: the client's.
    pub(crate) wait: Option<Duration>,
    /// `None`: the client's.
    pub(crate) lease: Option<Lease>,
    pub(crate) fencing: bool,
    /// A semaphore's permits (0 for the other kinds).
    pub(crate) permits: u32,
}

/// One acquire of a set of locks, with every setting stated.
pub(crate) struct AcquireAll {
    /// Each user key with its name in `key_in(.., Exclusive)`.
    pub(crate) keys: Vec<(Vec<u8>, LockKey)>,
    pub(crate) kind: LockKind,
    /// `None`: the client's.
    pub(crate) wait: Option<Duration>,
    /// `None`: the client's.
    pub(crate) lease: Option<Lease>,
    pub(crate) fencing: bool,
    /// Each key's semaphore permits (0 for the other kinds).
    pub(crate) permits: u32,
}

impl AnyLockClient {
    /// The lock name of `key` in `namespace`, as a layer on that namespace names it.
    pub(crate) fn key_in(
        &self,
        namespace: &str,
        key: &[u8],
        kind: LockKind,
    ) -> Result<LockKey, KeyError> {
        self.inner.key_in(namespace, key, kind)
    }

    /// Acquires as the current holder scope (when the client made it) or a fresh holder.
    pub(crate) fn acquire(&self, acquire: Acquire) -> BoxFuture<Result<AnyGuard, LockError>> {
        self.inner.acquire(acquire)
    }

    /// Acquires a set of locks as [`acquire`](Self::acquire) acquires one.
    pub(crate) fn acquire_all(
        &self,
        acquire: AcquireAll,
    ) -> BoxFuture<Result<AnyGuard, LockError>> {
        self.inner.acquire_all(acquire)
    }
}

/// A held lock of an [`AnyLockClient`]; dropping it releases the lock in the background, as
/// dropping a [`LockGuard`] does.
pub(crate) struct AnyGuard(Box<dyn ErasedGuard>);

impl AnyGuard {
    pub(crate) fn context(&self) -> LockContext {
        self.0.context()
    }

    pub(crate) fn holder(&self) -> Holder {
        self.0.context().holder().clone()
    }

    pub(crate) async fn release(self) -> Result<(), LockError> {
        self.0.release().await
    }
}

trait ErasedClient: Send + Sync + 'static {
    fn key_in(&self, namespace: &str, key: &[u8], kind: LockKind) -> Result<LockKey, KeyError>;
    fn acquire(&self, acquire: Acquire) -> BoxFuture<Result<AnyGuard, LockError>>;
    fn acquire_all(&self, acquire: AcquireAll) -> BoxFuture<Result<AnyGuard, LockError>>;
}

impl<B: Backend> ErasedClient for LockClient<B> {
    fn key_in(&self, namespace: &str, key: &[u8], kind: LockKind) -> Result<LockKey, KeyError> {
        Self::key_in(self, namespace, key, kind)
    }

    fn acquire(&self, acquire: Acquire) -> BoxFuture<Result<AnyGuard, LockError>> {
        let locks = self.clone();
        Box::pin(async move {
            let request =
                locks.request_for(acquire.key, acquire.kind).with_permits(acquire.permits);
            let request = request.configured(acquire.wait, acquire.lease, acquire.fencing);
            let guard = request.acquire().await?;
            Ok(AnyGuard(Box::new(guard)))
        })
    }

    fn acquire_all(&self, acquire: AcquireAll) -> BoxFuture<Result<AnyGuard, LockError>> {
        let locks = self.clone();
        Box::pin(async move {
            let request =
                locks.request_all_for(acquire.keys, acquire.kind).with_permits(acquire.permits);
            let request = request.configured(acquire.wait, acquire.lease, acquire.fencing);
            let guard = request.acquire().await?;
            Ok(AnyGuard(Box::new(guard)))
        })
    }
}

trait ErasedGuard: Send {
    fn context(&self) -> LockContext;
    fn release(self: Box<Self>) -> BoxFuture<Result<(), LockError>>;
}

impl<B: Backend> ErasedGuard for LockGuard<B> {
    fn context(&self) -> LockContext {
        LockContext::of(self)
    }

    fn release(self: Box<Self>) -> BoxFuture<Result<(), LockError>> {
        Box::pin(Self::release(*self))
    }
}

impl<B: Backend> ErasedGuard for MultiGuard<B> {
    fn context(&self) -> LockContext {
        LockContext::of_set(self)
    }

    fn release(self: Box<Self>) -> BoxFuture<Result<(), LockError>> {
        Box::pin(Self::release(*self))
    }
}
