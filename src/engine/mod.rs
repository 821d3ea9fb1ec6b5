//! The lock engine behind [`LockClient`](crate::LockClient): what one client holds and waits
//! for, and how attempts, holds and releases play out against the [`Backend`].
//!
//! Each thing that can race has one owner: an attempt on its way is an `InFlight` value
//! ([`acquire`]; dropped unanswered, it is resolved in the background like a lost reply); a
//! grant is one [`Held`] entry, whose holds (its holder's guards) are counted under its own
//! lock, so it ends once, with one delete naming the grant; the [`watchdog`] reports to the
//! entries and to [`Engine::lose`]; releases go through [`release`].
//!
//! Dependencies point one way: `held` and `place` know nothing of the rest, `table` keeps
//! them, `Engine` owns a table, and `acquire`, `release` and `watchdog` work on an `Engine`.

use std::{
    sync::{
        Arc, OnceLock,
        atomic::{AtomicU64, AtomicUsize, Ordering},
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
pub(crate) use release::{AtOnce, Loss};
pub(crate) use table::{Table, Want};

/// The shortest lease that can be kept: renewals run every third of it.
pub(crate) const MIN_LEASE: Duration = Duration::from_millis(3);

/// Settings of a [`LockClient`](crate::LockClient); `Default` states every default in one place.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    /// The name in the client's holder ids; `None` for the service's or executable's.
    pub(crate) name: Option<String>,
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
            name: None,
            prefix: "tower-lock:".to_owned(),
            lease: Lease::DEFAULT,
            wait: Duration::from_secs(5),
            max_key_len: lock_key::DEFAULT_MAX_KEY_LEN,
            max_hold: None,
            max_waiters_per_key: 1024,
            max_waiters: 10_000,
            handoff_streak: 3,
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

/// How long after the client stops a release or an undo it started is still tried again: a
/// lock it was giving back when it stopped is not left to its lease over one failed try.
pub(crate) const CLEANUP_GRACE: Duration = Duration::from_secs(1);

/// The engine's stop signal. Checked on every acquire and release, so the check is one atomic
/// load (the time of the stop being set), not a cancellation token's mutex.
#[derive(Default)]
pub(crate) struct Stop {
    token: CancellationToken,
    at: OnceLock<tokio::time::Instant>,
}

impl Stop {
    pub(crate) fn cancel(&self) {
        let _ = self.at.set(tokio::time::Instant::now());
        self.token.cancel();
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        self.at.get().is_some()
    }

    /// Whether a release or an undo may still be tried again: while running, and for
    /// [`CLEANUP_GRACE`] after the stop.
    pub(crate) fn allows_cleanup(&self) -> bool {
        self.at.get().is_none_or(|at| at.elapsed() < CLEANUP_GRACE)
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
    /// The numbers handed out by [`next_id`](Self::next_id).
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
            id: crate::holder::client_id(config.name.as_deref()),
            backend,
            config,
            table: Table::default(),
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

    pub(crate) fn new_holder(self: &Arc<Self>) -> Holder {
        let weak: std::sync::Weak<Self> = Arc::downgrade(self);
        let client: std::sync::Weak<dyn crate::holder::HeldLocks> = weak;
        Holder::of(&self.id, self.next_id(), client)
    }

    /// Wakes the watchdog if it must act at `at`, before it planned to wake (or while it
    /// scans). Called after the entry is in the table.
    pub(crate) fn watch(&self, at: BootInstant) {
        // Written only when earlier: every acquire calls this, usually with a later time. A
        // scan that begins after the load below sees the entry in the table; one that began
        // before it left the value the load read, no later than `at`, to wake the watchdog.
        if at.as_nanos() < self.watch_earliest.load(Ordering::SeqCst) {
            self.watch_earliest.fetch_min(at.as_nanos(), Ordering::SeqCst);
        }
        if at.as_nanos() < self.watchdog_due.load(Ordering::SeqCst) {
            self.watchdog_wake.notify_one();
        }
    }

    /// A number no other call of this engine returns.
    pub(crate) fn next_id(&self) -> u64 {
        self.sequence.fetch_add(1, Ordering::Relaxed)
    }

    /// A new attempt id of `holder`.
    pub(crate) fn attempt_id(&self, holder: &Holder) -> Arc<str> {
        crate::holder::numbered(holder.id(), b'#', self.next_id())
    }

    /// `want` under a new attempt id, after its attempt failed or was spent.
    pub(crate) fn next_attempt(&self, want: &Want) -> Arc<Want> {
        Arc::new(want.retry(self.attempt_id(&want.holder)))
    }

    /// The runtime to spawn background releases on.
    pub(crate) fn runtime(&self) -> Option<Handle> {
        Handle::try_current().ok().or_else(|| self.runtime.get().cloned())
    }
}

impl<B: Backend> crate::holder::HeldLocks for Engine<B> {
    fn holds(&self, holder: &Holder, key: &lock_key::LockKey) -> bool {
        self.table.holds(key, holder)
    }
}

#[cfg(test)]
mod tests;
