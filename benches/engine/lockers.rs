//! The locks the engine bench compares, behind one enum so every workload runs the very same
//! code on each: tower-lock on Redis (plain, fair, or with the client lease), tower-lock in memory (a floor), the
//! hand-written lock, and rslock.

use std::time::Duration;

use tower_lock::{Lease, LockClient, LockError, LockGuard, MemoryBackend, RedisBackend};

use crate::{
    handwritten::{HandError, HandGuard, HandLock},
    measure::error_kind,
    support,
};

/// Every lock's lease: tower-lock's watchdog lease (its default is 5 s), and the TTL of the
/// baselines' keys (they have no watchdog).
pub(crate) const LEASE: Duration = Duration::from_secs(30);
/// How long one acquire may wait before it counts as an error.
pub(crate) const WAIT: Duration = Duration::from_secs(30);
/// rslock's retries per `lock()` call (its default, 3); `acquire()` loops over `lock()`.
pub(crate) const RSLOCK_RETRY_COUNT: u32 = 3;
/// rslock's retry delay: each retry sleeps a random time below it (its default is 200 ms).
pub(crate) fn rslock_retry_delay() -> Duration {
    std::env::var("RSLOCK_RETRY_MS")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .map_or(Duration::from_millis(10), Duration::from_millis)
}

/// Which lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Impl {
    Tower,
    TowerFair,
    Memory,
    Hand,
    Rslock,
}

impl Impl {
    /// The name in reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Tower => "tower-lock",
            Self::TowerFair => "tower-lock fair",
            Self::Memory => "tower-lock memory",
            Self::Hand => "hand-written",
            Self::Rslock => "rslock",
        }
    }

    /// The short tag in keys and in a worker's environment.
    pub(crate) fn tag(self) -> &'static str {
        match self {
            Self::Tower => "tower",
            Self::TowerFair => "fair",
            Self::Memory => "memory",
            Self::Hand => "hand",
            Self::Rslock => "rslock",
        }
    }

    /// The lock with tag `tag`.
    pub(crate) fn from_tag(tag: &str) -> Option<Self> {
        [Self::Tower, Self::TowerFair, Self::Memory, Self::Hand, Self::Rslock]
            .into_iter()
            .find(|i| i.tag() == tag)
    }

    /// Whether it is one of the two baselines.
    pub(crate) fn is_peer(self) -> bool {
        matches!(self, Self::Hand | Self::Rslock)
    }
}

/// The locks of `all` that `BENCH_LOCKS` selects by tag (`BENCH_LOCKS=tower,rslock`; all
/// without it): for profiling one lock at a time.
pub(crate) fn chosen(all: &[Impl]) -> Vec<Impl> {
    all.iter().copied().filter(|lock| crate::measure::lock_selected(lock.tag())).collect()
}

/// A failed acquire or release: its kind (the error's variant) and message.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) kind: String,
    pub(crate) message: String,
}

impl Failure {
    fn of(what: &str, error: &impl std::fmt::Debug) -> Self {
        Self { kind: format!("{what} {}", error_kind(error)), message: format!("{error:?}") }
    }
}

/// A client of one lock, cloned into every task of a process.
#[derive(Clone)]
pub(crate) enum Locker {
    Tower(LockClient<RedisBackend>, bool),
    Memory(LockClient<MemoryBackend>),
    Hand(HandLock),
    Rslock(rslock::LockManager),
}

/// A held lock.
pub(crate) enum Held {
    Tower(LockGuard<RedisBackend>),
    Memory(LockGuard<MemoryBackend>),
    Hand(HandGuard),
    Rslock(rslock::LockGuard),
}

impl Locker {
    /// A fresh client of `which` on the server at `url` (memory: a fresh in-process table).
    pub(crate) async fn connect(which: Impl, url: &str) -> Result<Self, String> {
        Ok(match which {
            Impl::Tower | Impl::TowerFair => {
                let backend = support::redis_backend(url)
                    .connect()
                    .await
                    .map_err(|e| format!("tower-lock connect: {e:#}"))?;
                let client = LockClient::builder(backend)
                    .lease(Lease::watchdog(LEASE))
                    .build()
                    .map_err(|e| format!("tower-lock client: {e}"))?;
                Self::Tower(client, which == Impl::TowerFair)
            }
            Impl::Memory => Self::Memory(
                LockClient::builder(MemoryBackend::new())
                    .lease(Lease::watchdog(LEASE))
                    .build()
                    .map_err(|e| format!("memory client: {e}"))?,
            ),
            Impl::Hand => Self::Hand(
                HandLock::connect(url, LEASE)
                    .await
                    .map_err(|e| format!("hand-written connect: {e}"))?,
            ),
            Impl::Rslock => {
                let mut manager = rslock::LockManager::new(vec![url.to_owned()]);
                manager.set_retry(RSLOCK_RETRY_COUNT, rslock_retry_delay());
                Self::Rslock(manager)
            }
        })
    }

    /// Takes `key`, waiting up to [`WAIT`].
    pub(crate) async fn acquire(&self, key: &str) -> Result<Held, Failure> {
        let tower = |e: LockError| Failure::of("acquire", &e);
        match self {
            Self::Tower(client, fair) => {
                let request = if *fair { client.fair_lock(key) } else { client.lock(key) };
                request.wait(WAIT).acquire().await.map(Held::Tower).map_err(tower)
            }
            Self::Memory(client) => {
                client.lock(key).wait(WAIT).acquire().await.map(Held::Memory).map_err(tower)
            }
            Self::Hand(lock) => lock
                .acquire(key, WAIT)
                .await
                .map(Held::Hand)
                .map_err(|e: HandError| Failure::of("acquire", &e)),
            Self::Rslock(manager) => {
                match tokio::time::timeout(WAIT, manager.acquire(key, LEASE)).await {
                    Ok(Ok(guard)) => Ok(Held::Rslock(guard)),
                    Ok(Err(e)) => Err(Failure::of("acquire", &e)),
                    Err(_) => Err(Failure {
                        kind: "acquire WaitTimeout".to_owned(),
                        message: format!("not acquired within {WAIT:?}"),
                    }),
                }
            }
        }
    }

    /// Releases `held` (rslock's release reports nothing: it is best effort).
    pub(crate) async fn release(&self, held: Held) -> Result<(), Failure> {
        let tower = |e: LockError| Failure::of("release", &e);
        match (self, held) {
            (_, Held::Tower(guard)) => guard.release().await.map_err(tower),
            (_, Held::Memory(guard)) => guard.release().await.map_err(tower),
            (Self::Hand(lock), Held::Hand(guard)) => {
                lock.release(guard).await.map_err(|e| Failure::of("release", &e))
            }
            (_, Held::Rslock(guard)) => {
                guard.release().await;
                Ok(())
            }
            (_, Held::Hand(_)) => Err(Failure {
                kind: "release Mismatch".to_owned(),
                message: "a hand-written guard released through another lock".to_owned(),
            }),
        }
    }

    /// Stops the client's background work (tower-lock's watchdog and subscriptions).
    pub(crate) async fn shutdown(&self) {
        match self {
            Self::Tower(client, _) => client.shutdown().await,
            Self::Memory(client) => client.shutdown().await,
            Self::Hand(_) | Self::Rslock(_) => {}
        }
    }
}
