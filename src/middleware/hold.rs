//! What a request holds: one lock, or a set of them.

use super::LockContext;
use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use crate::{
    Backend, LockError, LockGuard, MultiGuard,
    clock::BootInstant,
    guard::{FinishOnDrop, Lost},
    holder::Holder,
};

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

    /// When the hold began: one lock's grant, or now for a set (its last member's grant).
    pub(crate) fn acquired_at(&self) -> BootInstant {
        match self {
            Self::One(guard) => guard.acquired_at(),
            Self::Set(_) => BootInstant::now(),
        }
    }

    /// Whether a lock is known to be lost, or its deadline has passed by `now`.
    pub(crate) fn is_lost_at(&self, now: BootInstant) -> bool {
        match self {
            Self::One(guard) => guard.entry().hold_lost_at(guard.hold(), now),
            Self::Set(guard) => guard.guards().any(|one| one.entry().hold_lost_at(one.hold(), now)),
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

    /// The release at `now`, started: one lock's needs no further box.
    pub(crate) fn release(self, now: BootInstant) -> HoldRelease {
        match self {
            Self::One(guard) => HoldRelease::One(guard.into_release(now)),
            Self::Set(guard) => HoldRelease::Set(Box::pin(guard.release())),
        }
    }
}

/// A [`Hold`]'s release in flight.
pub(crate) enum HoldRelease {
    One(FinishOnDrop),
    Set(Pin<Box<dyn Future<Output = Result<(), LockError>> + Send>>),
}

impl Future for HoldRelease {
    type Output = Result<(), LockError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Self::One(release) => Pin::new(release).poll(cx),
            Self::Set(release) => release.as_mut().poll(cx),
        }
    }
}
