//! The lock client behind a pointer: the layer's types do not name the backend.

use std::{future::Future, pin::Pin, time::Duration};

use crate::{
    Backend, Lease, LockClient, LockContext, LockError, LockGuard, LockKey, LockKind,
    clock::BootInstant,
    guard::{FinishOnDrop, Lost},
    lock_key::KeyError,
};

/// An acquire in flight. `Send`, holding only the client's parts, never a body.
pub(crate) type Acquire = Pin<Box<dyn Future<Output = Result<Box<dyn Guard>, LockError>> + Send>>;

/// What the layer asks of its lock client.
pub(crate) trait Locks: Send + Sync + 'static {
    /// The lock name of `key` in `namespace`, as the client names it (prefix, escaping, keyed
    /// hashing, the length limit).
    fn name(&self, namespace: &str, key: &[u8]) -> Result<LockKey, KeyError>;

    /// Acquires `key` as a fresh holder, with a fencing token.
    fn acquire(&self, key: LockKey, wait: Duration, lease: Option<Lease>) -> Acquire;
}

impl<B: Backend> Locks for LockClient<B> {
    fn name(&self, namespace: &str, key: &[u8]) -> Result<LockKey, KeyError> {
        self.key_in(namespace, key, LockKind::Exclusive)
    }

    fn acquire(&self, key: LockKey, wait: Duration, lease: Option<Lease>) -> Acquire {
        // A fresh holder: the key's lock is never re-entered, not even by a request that
        // carries the holder of a lock layer around this one.
        let acquire = self
            .request_for(key, LockKind::Exclusive)
            .with_holder(self.holder())
            .configured(Some(wait), lease, true)
            .acquire();
        Box::pin(async move { Ok(Box::new(acquire.await?) as Box<dyn Guard>) })
    }
}

/// A held lock of the layer: dropping it releases the lock in the background.
pub(crate) trait Guard: Send {
    fn fencing_token(&self) -> Option<u64>;
    fn is_lost(&self) -> bool;
    fn lost(&self) -> Lost;
    fn context(&self) -> LockContext;
    /// The release, as a future that finishes on the runtime if it is dropped.
    fn release(self: Box<Self>) -> FinishOnDrop;
}

impl<B: Backend> Guard for LockGuard<B> {
    fn fencing_token(&self) -> Option<u64> {
        Self::fencing_token(self)
    }

    fn is_lost(&self) -> bool {
        Self::is_lost(self)
    }

    fn lost(&self) -> Lost {
        Self::lost(self)
    }

    fn context(&self) -> LockContext {
        LockContext::of(self)
    }

    fn release(self: Box<Self>) -> FinishOnDrop {
        self.into_release(BootInstant::now())
    }
}
