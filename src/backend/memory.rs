//! The in-process backend.
//!
//! Same semantics as the Redis backend (owner-checked reentrant holds, leases that expire,
//! fencing counters that never go back, hand-off, release notifications) for one process. Clones
//! share the same locks, so two [`LockClient`](crate::LockClient)s built on clones of one
//! `MemoryBackend` contend exactly as two processes would on one Redis.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use tokio::time::Instant;

use super::{
    AcquireReply, Backend, Grant, Listener, Listeners, Release, ReleaseReply, Renew, RenewReply,
};
use crate::{error::BackendError, key::LockKey};

/// Locks held in this process. See the [module docs](self).
///
/// ```
/// use tower_lock::{LockClient, MemoryBackend};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_lock::LockError> {
/// let locks = LockClient::builder(MemoryBackend::new()).build().unwrap();
/// let guard = locks.lock("order:42").acquire().await?;
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, Default)]
pub struct MemoryBackend {
    state: Arc<Mutex<State>>,
    listeners: Arc<Listeners>,
}

#[derive(Debug, Default)]
struct State {
    locks: HashMap<String, Entry>,
    /// Fencing counters outlive their locks, as the Redis counter key does.
    fences: HashMap<String, u64>,
}

#[derive(Debug)]
struct Entry {
    owner: String,
    count: u64,
    expires: Instant,
    attempt: String,
    token: Option<u64>,
}

impl MemoryBackend {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many locks are currently held (expired ones not counted).
    pub fn held_count(&self) -> usize {
        let now = Instant::now();
        self.lock()
            .locks
            .values()
            .filter(|e| e.expires > now)
            .count()
    }

    // A std mutex: every critical section is a few map operations, never an await.
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl State {
    /// The live entry for `key`, dropping it first if its lease ran out.
    fn live(&mut self, key: &str, now: Instant) -> Option<&mut Entry> {
        if self.locks.get(key).is_some_and(|e| e.expires <= now) {
            self.locks.remove(key);
        }
        self.locks.get_mut(key)
    }

    fn grant(&mut self, grant: Grant<'_>, now: Instant) -> Option<u64> {
        let name = grant.key.as_str();
        let token = grant.fencing.then(|| {
            let fence = self.fences.entry(name.to_owned()).or_default();
            *fence += 1;
            *fence
        });
        self.locks.insert(
            name.to_owned(),
            Entry {
                owner: grant.holder.to_owned(),
                count: 1,
                expires: now + grant.lease.duration(),
                attempt: grant.attempt.to_owned(),
                token,
            },
        );
        token
    }

    fn next_token(&mut self, name: &str) -> u64 {
        let fence = self.fences.entry(name.to_owned()).or_default();
        *fence += 1;
        *fence
    }
}

impl Backend for MemoryBackend {
    type Listener = Listener;

    async fn acquire(&self, grant: Grant<'_>) -> Result<AcquireReply, BackendError> {
        let now = Instant::now();
        let mut state = self.lock();
        let name = grant.key.as_str();
        let Some(entry) = state.live(name, now) else {
            let token = state.grant(grant, now);
            return Ok(AcquireReply::Acquired { count: 1, token });
        };
        if entry.owner != grant.holder {
            let ttl = entry.expires.saturating_duration_since(now);
            return Ok(AcquireReply::Held { ttl: Some(ttl) });
        }
        entry.count += 1;
        entry.expires = now + grant.lease.duration();
        grant.attempt.clone_into(&mut entry.attempt);
        let count = entry.count;
        let token = match (grant.fencing, entry.token) {
            (false, _) => None,
            (true, Some(token)) => Some(token),
            (true, None) => {
                let token = state.next_token(name);
                if let Some(entry) = state.locks.get_mut(name) {
                    entry.token = Some(token);
                }
                Some(token)
            }
        };
        Ok(AcquireReply::Acquired { count, token })
    }

    async fn release(&self, release: Release<'_>) -> Result<ReleaseReply, BackendError> {
        let now = Instant::now();
        let mut state = self.lock();
        let name = release.key.as_str();
        let Some(entry) = state.live(name, now).filter(|e| e.owner == release.holder) else {
            return Ok(ReleaseReply::NotHeld);
        };
        entry.count = if release.all { 0 } else { entry.count - 1 };
        if entry.count > 0 {
            return Ok(ReleaseReply::Decremented {
                remaining: entry.count,
            });
        }
        state.locks.remove(name);
        if let Some(next) = release.handoff {
            let token = state.grant(next, now);
            return Ok(ReleaseReply::HandedOff { token });
        }
        drop(state);
        let notified = self.listeners.notify(name);
        Ok(ReleaseReply::Released {
            notified: Some(notified),
        })
    }

    async fn renew(&self, renewals: &[Renew<'_>]) -> Result<Vec<RenewReply>, BackendError> {
        let now = Instant::now();
        let mut state = self.lock();
        Ok(renewals
            .iter()
            .map(|renew| match state.live(renew.key.as_str(), now) {
                Some(entry) if entry.owner == renew.holder => {
                    entry.expires = now + renew.lease.duration();
                    RenewReply::Renewed
                }
                _ => RenewReply::NotHeld,
            })
            .collect())
    }

    async fn abandon(&self, grant: Grant<'_>) -> Result<bool, BackendError> {
        // Calls here are never in flight when they fail, so there is no late arrival to refuse.
        let (key, holder, attempt) = (grant.key, grant.holder, grant.attempt);
        let now = Instant::now();
        let mut state = self.lock();
        let name = key.as_str();
        let Some(entry) = state
            .live(name, now)
            .filter(|e| e.owner == holder && e.attempt == attempt)
        else {
            return Ok(false);
        };
        entry.count -= 1;
        entry.attempt.clear();
        if entry.count == 0 {
            state.locks.remove(name);
            drop(state);
            self.listeners.notify(name);
        }
        Ok(true)
    }

    async fn listen(&self, key: &LockKey) -> Result<Listener, BackendError> {
        Ok(self.listeners.add(key.as_str().to_owned()).0)
    }
}

/// The remaining lease of a lock in a memory backend, for tests and diagnostics.
impl MemoryBackend {
    /// The remaining lease of `key`'s lock (by its full name), or `None` when it is free.
    pub fn ttl(&self, name: &str) -> Option<Duration> {
        let now = Instant::now();
        self.lock()
            .live(name, now)
            .map(|e| e.expires.saturating_duration_since(now))
    }
}
