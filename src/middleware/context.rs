//! What a handler can learn about the lock its request holds.

use std::sync::Arc;

use crate::{Backend, LockGuard, LockKey, engine::Held, guard::Lost, holder::Holder};

/// The lock held for the current request, put into the request's extensions by
/// [`LockLayer`](super::LockLayer) (with axum: `Extension<LockContext>`).
#[derive(Clone, Debug)]
pub struct LockContext {
    pub(crate) key: LockKey,
    pub(crate) holder: Holder,
    pub(crate) fencing_token: Option<u64>,
    pub(crate) held: Arc<Held>,
}

impl LockContext {
    /// What a request handler may know of the lock `guard` holds.
    pub(crate) fn of<B: Backend>(guard: &LockGuard<B>) -> Self {
        let held = guard.entry();
        Self {
            key: held.key.clone(),
            holder: held.holder.clone(),
            fencing_token: held.token,
            held: held.clone(),
        }
    }

    /// The lock's name in the backend.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// The request's holder.
    pub fn holder(&self) -> &Holder {
        &self.holder
    }

    /// The fencing token, when the layer was configured with `fencing()`: send it with every
    /// write to a store that rejects writes carrying an older token than it has seen.
    pub fn fencing_token(&self) -> Option<u64> {
        self.fencing_token
    }

    /// Resolves if the lock is lost while the request runs (useful with
    /// `LockLayer::continue_on_lost`; by default the layer cancels the handler itself).
    pub fn lost(&self) -> Lost {
        Lost::new(self.held.lost.clone())
    }

    /// Whether the lock is lost: reported lost, or its lease deadline has passed without a
    /// successful renewal. Checked against the clock, like
    /// [`LockGuard::is_lost`](crate::LockGuard::is_lost), so a handler resumed after a stall
    /// learns of it before its next write even if the watchdog has not run yet.
    pub fn is_lost(&self) -> bool {
        self.held.is_lost()
    }
}
