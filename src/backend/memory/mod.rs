//! The in-process backend.
//!
//! The same protocol as the Redis backend, for one process: one record per grant, named by the
//! attempt that won it (an owner record for a plain, fair or write lock; a lease per reader and
//! per permit), leases that expire, fencing tokens that never go back, hand-off, fair queues
//! with waiter timeouts, release notifications. Clones share the same locks, so two
//! [`LockClient`](crate::LockClient)s built on clones of one `MemoryBackend` contend exactly
//! as two processes would on one Redis.
//!
//! Each operation does what the Lua script of the same name does, step by step, and answers
//! alike: the differential test runs the same programs on both stores. Nothing arrives late
//! here, so there is no "not after" and no quarantine. With the feature `test-util`, time is
//! tokio's clock, which tests can pause.

use std::sync::{Arc, atomic::AtomicU64};

use tokio::time::Instant;

use self::lock::{Lock, Publish};
use super::{
    Listener, Listeners, LockKind,
    store::{
        AcquireReply, Extend, ExtendReply, Grant, Release, ReleaseReply, Renew, RenewReply, Store,
    },
};
use crate::{
    error::BackendError,
    inspect::LockInfo,
    lock_key::{KeyMap, LockKey, Shards},
};

mod inspect;
mod lock;
mod owner;
mod queue;
mod shared;
#[cfg(test)]
mod tests;

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
    /// The locks, spread over shards by name.
    shards: Arc<Shards<Shard>>,
    /// The last fencing token issued, for any lock of any shard.
    fence: Arc<AtomicU64>,
    listeners: Arc<Listeners>,
}

/// One shard of the locks.
#[derive(Debug, Default)]
struct Shard {
    locks: KeyMap<Lock>,
    /// How many locks were kept after the last sweep.
    swept: usize,
}

impl Shard {
    /// Drops the locks whose records all expired once the shard doubled since the last sweep:
    /// a lock nobody touches again (a fixed lease left to run out) does not stay forever, at a
    /// cost that stays constant per operation.
    fn sweep(&mut self, now: Instant) {
        if self.locks.len() > 2 * self.swept + 64 {
            self.locks.retain(|_, lock| {
                lock.expire(now);
                !lock.is_empty()
            });
            self.swept = self.locks.len();
        }
    }
}

impl MemoryBackend {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many locks are currently held (expired ones not counted).
    pub fn held_count(&self) -> usize {
        let now = Instant::now();
        let held = |lock: &&Lock| {
            lock.owner.as_ref().is_some_and(|owner| owner.expires > now)
                || lock.grants.items.iter().any(|(_, end)| *end > now)
        };
        self.shards.each().map(|shard| shard.locks.values().filter(held).count()).sum()
    }

    /// Runs `op` on the records of `key`, as one script runs on a Redis node: atomically, at
    /// one instant, after what expired went.
    fn at<R>(&self, key: &LockKey, op: impl FnOnce(&mut Lock, Instant) -> R) -> R {
        let now = Instant::now();
        let mut shard = self.shards.of(key);
        shard.sweep(now);
        let lock = shard.locks.entry(key.clone()).or_default();
        lock.expire(now);
        let result = op(lock, now);
        if lock.is_empty() {
            shard.locks.remove(key);
        }
        result
    }

    /// Publishes on the release channel of `key`: how many listeners it reached.
    fn publish(&self, key: &LockKey, publish: Publish) -> Option<u64> {
        let message = publish?;
        // Nobody listens on any lock (the uncontended case): no channel name to build.
        if self.listeners.is_empty() {
            return Some(0);
        }
        Some(self.listeners.notify(&channel(key), &message))
    }

    /// A release, done at once: the in-memory store never waits.
    fn release_sync(&self, release: &Release<'_>) -> ReleaseReply {
        let (reply, publish) = self.at(release.key, |lock, now| {
            if release.kind.owns() {
                lock.release_owner(release, now, &self.fence)
            } else {
                let publish = lock.unshare(release.grant);
                let reply = match publish {
                    Some(_) => ReleaseReply::Released { notified: None },
                    None => ReleaseReply::NotHeld,
                };
                (reply, publish)
            }
        });
        let notified = self.publish(release.key, publish);
        match reply {
            ReleaseReply::Released { .. } => ReleaseReply::Released { notified },
            other => other,
        }
    }
}

/// The channel a lock's releases are announced on (the same name for every backend).
fn channel(key: &LockKey) -> String {
    key.derived(":released")
}

impl Store for MemoryBackend {
    type Listener = Listener;

    async fn acquire(&self, grant: Grant<'_>) -> Result<AcquireReply, BackendError> {
        Ok(self.at(grant.key, |lock, now| match grant.kind.owns() {
            true => lock.acquire(&grant, now, &self.fence),
            false => lock.share(&grant, now),
        }))
    }

    async fn extend(&self, extend: Extend<'_>) -> Result<ExtendReply, BackendError> {
        Ok(self.at(extend.key, |lock, now| match extend.kind.owns() {
            true => lock.extend_owner(&extend, now, &self.fence),
            false => lock.extend_shared(&extend, now),
        }))
    }

    async fn release(&self, release: Release<'_>) -> Result<ReleaseReply, BackendError> {
        Ok(self.release_sync(&release))
    }

    fn release_now(&self, release: Release<'_>) -> Option<Result<ReleaseReply, BackendError>> {
        Some(Ok(self.release_sync(&release)))
    }

    async fn renew(&self, renewals: &[Renew<'_>]) -> Result<Vec<RenewReply>, BackendError> {
        // One lock at a time, as the batch's commands run one after the other on Redis.
        let renew = |renewal: &Renew<'_>| match *renewal {
            Renew::Grant { key, kind, grant, lease } => self.at(key, |lock, now| {
                let renewed = match kind.owns() {
                    true => lock.renew_owner(grant, lease.duration(), now).is_some(),
                    false => lock.renew_shared(grant, lease.duration(), now),
                };
                match renewed {
                    true => RenewReply::Renewed,
                    false => RenewReply::NotHeld,
                }
            }),
            Renew::Place { key, kind, holder, timeout } => {
                // A timeout of zero leaves the queue, as '0' does in `wait.lua`.
                let timeout = Some(timeout).filter(|timeout| !timeout.is_zero());
                let (reply, publish) =
                    self.at(key, |lock, now| lock.wait(holder, kind, timeout, now));
                self.publish(key, publish);
                reply
            }
        };
        Ok(renewals.iter().map(renew).collect())
    }

    async fn abandon(&self, grant: Grant<'_>) -> Result<bool, BackendError> {
        let (undone, publish) = self.at(grant.key, |lock, now| match grant.kind.owns() {
            true => lock.abandon_owner(&grant, now),
            false => lock.abandon_shared(&grant, now),
        });
        self.publish(grant.key, publish);
        Ok(undone)
    }

    async fn leave(&self, key: &LockKey, holder: &str, kind: LockKind) -> Result<(), BackendError> {
        // Only a fair waiter or a writer keeps a place (the Redis backend sends nothing for the
        // others): a reader leaving must not take its holder's place as a writer.
        if !kind.queues() {
            return Ok(());
        }
        let (_, publish) = self.at(key, |lock, now| lock.wait(holder, kind, None, now));
        self.publish(key, publish);
        Ok(())
    }

    async fn listen(
        &self,
        key: &LockKey,
        only_for: Option<&str>,
    ) -> Result<Listener, BackendError> {
        Ok(self.listeners.add(channel(key), only_for).0)
    }

    async fn inspect(&self, key: &LockKey, kind: LockKind) -> Result<LockInfo, BackendError> {
        Ok(self.at(key, |lock, now| lock.inspect(kind, now)))
    }

    async fn force_unlock(&self, key: &LockKey, kind: LockKind) -> Result<LockInfo, BackendError> {
        let (before, publish) = self.at(key, |lock, now| lock.force_unlock(kind, now));
        self.publish(key, publish);
        Ok(before)
    }
}
