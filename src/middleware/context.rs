//! What a handler can learn about the lock its request holds.

use tokio_util::sync::CancellationToken;

use crate::{LockKey, guard::Lost, holder::Holder};

/// The lock held for the current request, put into the request's extensions by
/// [`LockLayer`](super::LockLayer) (with axum: `Extension<LockContext>`).
#[derive(Clone, Debug)]
pub struct LockContext {
    pub(crate) key: LockKey,
    pub(crate) holder: Holder,
    pub(crate) fencing_token: Option<u64>,
    pub(crate) lost: CancellationToken,
}

impl LockContext {
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
        Lost::new(self.lost.clone())
    }

    /// Whether the lock has been reported lost.
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }
}
