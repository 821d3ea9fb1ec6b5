//! What a request holds: one lock, or a set of them.

use super::LockContext;
use crate::{Backend, LockError, LockGuard, MultiGuard, guard::Lost, holder::Holder};

/// The locks a request holds while its inner service runs. One enum rather than a type
/// parameter, so the response future's type is the same for one key and for a set.
pub(crate) enum Hold<B: Backend> {
    One(LockGuard<B>),
    Set(MultiGuard<B>),
}

impl<B: Backend> Hold<B> {
    pub(crate) fn holder(&self) -> &Holder {
        match self {
            Self::One(guard) => guard.holder(),
            Self::Set(guard) => guard.holder(),
        }
    }

    pub(crate) fn is_lost(&self) -> bool {
        match self {
            Self::One(guard) => guard.is_lost(),
            Self::Set(guard) => guard.is_lost(),
        }
    }

    pub(crate) fn lost(&self) -> Lost {
        match self {
            Self::One(guard) => guard.lost(),
            Self::Set(guard) => guard.lost(),
        }
    }

    pub(crate) fn context(&self) -> LockContext {
        match self {
            Self::One(guard) => LockContext::of(guard),
            Self::Set(guard) => LockContext::of_set(guard),
        }
    }

    pub(crate) async fn release(self) -> Result<(), LockError> {
        match self {
            Self::One(guard) => guard.release().await,
            Self::Set(guard) => guard.release().await,
        }
    }
}
