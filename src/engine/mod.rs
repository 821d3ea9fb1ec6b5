//! The lock engine behind [`LockClient`](crate::LockClient): what one client holds and waits
//! for, and how attempts, holds and releases play out against the [`Backend`].
//!
//! Each thing that can race has one owner, and the watchdog and the guards talk to that owner:
//! - an attempt on its way to the backend is an `InFlight` value ([`acquire`]): dropped before
//!   its answer was dealt with (a cancelled acquire), it resolves the attempt in the background,
//!   undoing or voiding it, like an attempt whose reply was lost;
//! - a hold is one [`Held`] entry, shared by the guards of a holder that re-entered it; its
//!   references are taken and given back only in the [`Table`], under the table's lock, so a
//!   re-entry and a release of the same holder cannot pass each other, and an entry whose last
//!   guard went is marked released, after which nothing said about it (a late renewal reply)
//!   counts as a loss;
//! - the [`watchdog`] reads the table and reports back to the entries and to
//!   [`Engine::lose`]; releases go through [`release`].
//!
//! Dependencies point one way: `held` and `place` know nothing of the rest, `table` keeps
//! them, `Engine` owns a table, and `acquire`, `release` and `watchdog` work on an `Engine`.

use std::{
    sync::{
        Arc, OnceLock,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::{runtime::Handle, sync::Notify};
use tokio_util::sync::CancellationToken;

use crate::{backend::Backend, clock::BootInstant, holder::Holder, lease::Lease, lock_key};

pub(crate) mod acquire;
pub(crate) mod held;
pub(crate) mod place;
pub(crate) mod release;
pub(crate) mod table;
pub(crate) mod watchdog;

pub(crate) use acquire::{Acquired, Request};
pub(crate) use held::Held;
pub(crate) use release::Loss;
pub(crate) use table::{Table, Want};

/// The shortest lease that can be kept: renewals run every third of it.
pub(crate) const MIN_LEASE: Duration = Duration::from_millis(3);

/// Settings of a [`LockClient`]; `Default` states every default in one place.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) prefix: String,
    pub(crate) lease: Lease,
    pub(crate) wait: Duration,
    pub(crate) max_key_len: usize,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) max_waiters_per_key: usize,
    pub(crate) max_waiters: usize,
    pub(crate) handoff_streak: u32,
    pub(crate) waiter_timeout: Duration,
    #[cfg(feature = "keyed-hash")]
    pub(crate) keyed_hash: Option<lock_key::KeyedHash>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            prefix: "tower-lock:".to_owned(),
            lease: Lease::DEFAULT,
            wait: Duration::from_secs(5),
            max_key_len: lock_key::DEFAULT_MAX_KEY_LEN,
            max_hold: None,
            max_waiters_per_key: 1024,
            max_waiters: 10_000,
            handoff_streak: 4,
            waiter_timeout: Duration::from_secs(5),
            #[cfg(feature = "keyed-hash")]
            keyed_hash: None,
        }
    }
}

/// One owner of a running engine: every client clone and every guard has one. The last to go
/// stops the background work.
pub(crate) struct EngineRef<B: Backend> {
    pub(crate) engine: Arc<Engine<B>>,
}

impl<B: Backend> Drop for EngineRef<B> {
    fn drop(&mut self) {
        self.engine.stop.cancel();
    }
}

/// The engine's stop signal. Checked on every acquire and release, so the check is one atomic
/// load: a cancellation token's takes a mutex shared by every thread.
#[derive(Default)]
pub(crate) struct Stop {
    stopped: AtomicBool,
    token: CancellationToken,
}

impl Stop {
    pub(crate) fn cancel(&self) {
        self.stopped.store(true, Ordering::Release);
        self.token.cancel();
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Resolves once stopped.
    pub(crate) fn cancelled(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.token.cancelled()
    }
}

/// State shared by the client, its guards and its watchdog task.
pub(crate) struct Engine<B: Backend> {
    pub(crate) backend: B,
    pub(crate) config: Config,
    pub(crate) table: Table<B::Listener>,
    pub(crate) id: String,
    pub(crate) sequence: AtomicU64,
    /// Acquires waiting right now, for the `max_waiters` cap.
    pub(crate) waiting: AtomicUsize,
    pub(crate) stop: Stop,
    pub(crate) watchdog_wake: Notify,
    /// When the watchdog plans to wake next (boot-clock nanoseconds).
    pub(crate) watchdog_due: AtomicU64,
    /// The earliest time an entry added since the watchdog's last scan began needs it
    /// (boot-clock nanoseconds): what the scan may have missed.
    pub(crate) watch_earliest: AtomicU64,
    pub(crate) runtime: OnceLock<Handle>,
    /// Test hook: the watchdog pauses this long after its next scan, widening the window in
    /// which an entry added after the scan must still wake it.
    #[cfg(test)]
    pub(crate) scan_pause: std::sync::Mutex<Option<Duration>>,
    /// Test hook: the watchdog's scans so far.
    #[cfg(test)]
    pub(crate) scans: AtomicUsize,
}

impl<B: Backend> Engine<B> {
    /// A new engine on `backend` with `config`; its watchdog starts with the first lock.
    pub(crate) fn new(backend: B, config: Config) -> Arc<Self> {
        Arc::new(Self {
            backend,
            config,
            table: Table::default(),
            id: uuid::Uuid::new_v4().simple().to_string(),
            sequence: AtomicU64::new(0),
            waiting: AtomicUsize::new(0),
            stop: Stop::default(),
            watchdog_wake: Notify::new(),
            watchdog_due: AtomicU64::new(0),
            watch_earliest: AtomicU64::new(u64::MAX),
            runtime: OnceLock::new(),
            #[cfg(test)]
            scan_pause: std::sync::Mutex::new(None),
            #[cfg(test)]
            scans: AtomicUsize::new(0),
        })
    }

    pub(crate) fn new_holder(&self) -> Holder {
        Holder::new(&self.id, self.sequence.fetch_add(1, Ordering::Relaxed))
    }

    /// Wakes the watchdog if it must act at `at`, before it planned to wake (or while it
    /// scans). Called after the entry is in the table.
    pub(crate) fn watch(&self, at: BootInstant) {
        self.watch_earliest
            .fetch_min(at.as_nanos(), Ordering::SeqCst);
        if at.as_nanos() < self.watchdog_due.load(Ordering::SeqCst) {
            self.watchdog_wake.notify_one();
        }
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.sequence.fetch_add(1, Ordering::Relaxed)
    }

    /// A new attempt id of `holder`.
    pub(crate) fn attempt_id(&self, holder: &Holder) -> Arc<str> {
        crate::holder::numbered(holder.id(), b'#', self.next_id())
    }

    /// The runtime to spawn background releases on.
    pub(crate) fn runtime(&self) -> Option<Handle> {
        Handle::try_current()
            .ok()
            .or_else(|| self.runtime.get().cloned())
    }
}
