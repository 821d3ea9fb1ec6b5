//! A waiter's place in a backend wait queue (fair locks, waiting writers), kept alive by the
//! watchdog while the waiter waits.

use std::{
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use tokio::sync::Notify;

use super::held::Check;
use crate::{
    backend::{LockKind, store::RenewReply},
    clock::BootInstant,
    holder::Holder,
    lock_key::LockKey,
};

/// A waiter's place in a backend wait queue (fair locks, waiting writers), kept alive by the
/// watchdog while the waiter waits, so that only a waiter that died is ever purged.
pub(crate) struct Queued {
    pub(crate) key: LockKey,
    pub(crate) holder: Holder,
    pub(crate) kind: LockKind,
    pub(crate) timeout: Duration,
    /// Wakes the waiter when its turn came or its place was lost.
    pub(crate) wake: Arc<Notify>,
    state: Mutex<QueuedState>,
}

struct QueuedState {
    /// The backend has a place for this waiter.
    active: bool,
    next_refresh: BootInstant,
    refreshing: bool,
}

impl Queued {
    pub(crate) fn new(
        key: LockKey,
        holder: Holder,
        kind: LockKind,
        timeout: Duration,
        wake: Arc<Notify>,
    ) -> Arc<Self> {
        Arc::new(Self {
            key,
            holder,
            kind,
            timeout,
            wake,
            state: Mutex::new(QueuedState {
                active: false,
                next_refresh: BootInstant::now(),
                refreshing: false,
            }),
        })
    }

    /// The waiter's place was (re)taken by a request sent at `sent_at`. Returns when it next
    /// needs a refresh.
    pub(crate) fn joined(&self, sent_at: BootInstant) -> BootInstant {
        let mut state = self.state();
        state.active = true;
        state.next_refresh = state.next_refresh.max(sent_at + self.timeout / 3);
        state.next_refresh
    }

    /// Whether the backend has a place for this waiter.
    pub(crate) fn is_active(&self) -> bool {
        self.state().active
    }

    pub(crate) fn check(&self, now: BootInstant) -> Option<Check> {
        let mut state = self.state();
        if !state.active || state.refreshing {
            return None;
        }
        if state.next_refresh <= now {
            state.refreshing = true;
            return Some(Check::Due(state.next_refresh + self.timeout));
        }
        Some(Check::Later(state.next_refresh))
    }

    pub(crate) fn refreshed(&self, sent_at: BootInstant, reply: Option<RenewReply>) {
        let mut state = self.state();
        state.refreshing = false;
        match reply {
            Some(RenewReply::Renewed) => state.next_refresh = sent_at + self.timeout / 3,
            Some(RenewReply::Ready | RenewReply::NotHeld) => {
                // Its turn, or its place is gone: either way the waiter tries again now.
                state.active = false;
                self.wake.notify_one();
            }
            None => state.next_refresh = BootInstant::now() + self.timeout / 10,
        }
    }

    fn state(&self) -> MutexGuard<'_, QueuedState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
