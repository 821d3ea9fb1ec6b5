//! A store that remembers the grants it answered, for tests that call a store directly about a
//! guard's grant (a renewal naming it): the store names a grant by the attempt that won it,
//! which a guard does not show.

use std::sync::{Arc, Mutex, PoisonError};

use tower_lock::{
    BackendError,
    backend::store::{AcquireReply, Extend, ExtendReply, Grant, Release, ReleaseReply, Store},
    key::LockKey,
};

/// A grant as answered: the lock's name, the holder, the attempt that won it.
type Answered = (String, String, String);

/// `inner` with a record of every grant it answered (acquires and hand-offs).
#[derive(Clone, Default)]
pub struct Granted<B> {
    inner: B,
    grants: Arc<Mutex<Vec<Answered>>>,
}

impl<B> Granted<B> {
    pub fn new(inner: B) -> Self {
        Self { inner, grants: Arc::default() }
    }

    /// The store underneath.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// The latest grant of the lock `key` answered to `holder` (a holder id).
    pub fn grant(&self, key: &LockKey, holder: &str) -> Option<String> {
        let grants = self.grants.lock().unwrap_or_else(PoisonError::into_inner);
        grants
            .iter()
            .rev()
            .find(|(name, by, _)| name == key.as_str() && by == holder)
            .map(|(_, _, attempt)| attempt.clone())
    }

    fn record(&self, grant: &Grant<'_>) {
        let answered =
            (grant.key.as_str().to_owned(), grant.holder.to_owned(), grant.attempt.to_owned());
        let mut grants = self.grants.lock().unwrap_or_else(PoisonError::into_inner);
        grants.push(answered);
    }

    fn released(&self, release: &Release<'_>, reply: &Result<ReleaseReply, BackendError>) {
        if let (Some(handoff), Ok(ReleaseReply::HandedOff { .. })) = (&release.handoff, reply) {
            self.record(handoff);
        }
    }
}

impl<B: Store> Store for Granted<B> {
    type Listener = B::Listener;

    async fn acquire(&self, grant: Grant<'_>) -> Result<AcquireReply, BackendError> {
        let reply = self.inner.acquire(grant).await;
        if let Ok(AcquireReply::Acquired { .. }) = reply {
            self.record(&grant);
        }
        reply
    }

    async fn extend(&self, extend: Extend<'_>) -> Result<ExtendReply, BackendError> {
        self.inner.extend(extend).await
    }

    async fn release(&self, release: Release<'_>) -> Result<ReleaseReply, BackendError> {
        let reply = self.inner.release(release).await;
        self.released(&release, &reply);
        reply
    }

    fn release_now(&self, release: Release<'_>) -> Option<Result<ReleaseReply, BackendError>> {
        let reply = self.inner.release_now(release)?;
        self.released(&release, &reply);
        Some(reply)
    }

    forward_to_inner!(renew, abandon, leave, listen, inspect, force_unlock);

    async fn shutdown(&self) {
        self.inner.shutdown().await;
    }
}
