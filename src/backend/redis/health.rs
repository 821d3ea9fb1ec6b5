//! What the backend knows of its server's health, so that an outage fails fast and is logged
//! once. A server that **refuses connections** is probed in the background; until a probe
//! reaches it, every command fails at once as `Unavailable`, saying when the next probe looks.
//! A server that **does not answer** in time is not down: callers try again within their
//! waits. Either is an incident, logged as a warning when it begins and as information when the
//! probe (or a command) reaches the server again; the failures in between at debug, their
//! errors marked as reported.

use std::{
    sync::{
        Arc, Mutex, PoisonError, Weak,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use tokio::time::Instant;

use super::{Inner, RedisBackend};
use crate::error::{BackendError, BackendErrorKind};

/// How long after a refused connection the server is first probed (a restart is ridden out).
pub(super) const FIRST_PROBE: Duration = Duration::from_millis(100);
/// How often a server that is down is probed, at most.
pub(super) const PROBE_EVERY: Duration = Duration::from_secs(1);

/// The health of one server, shared by every command of a backend.
pub(super) struct Health {
    /// The server, for logs and errors.
    server: String,
    /// An incident is open: read by every command that succeeds, so that only the first
    /// success after an incident takes the lock.
    troubled: AtomicBool,
    /// The server refused connections and a probe confirmed it: commands fail at once.
    down: AtomicBool,
    incident: Mutex<Option<Incident>>,
}

/// What went wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Trouble {
    /// The server refused a connection.
    Refused,
    /// The server did not answer within the command timeout.
    Silent,
}

struct Incident {
    trouble: Trouble,
    since: Instant,
    /// Commands that failed during it.
    failures: u64,
    /// When the probe looks next.
    next_probe: Option<Instant>,
}

impl Health {
    pub(super) fn new(server: String) -> Self {
        Self {
            server,
            troubled: AtomicBool::new(false),
            down: AtomicBool::new(false),
            incident: Mutex::new(None),
        }
    }

    fn incident(&self) -> std::sync::MutexGuard<'_, Option<Incident>> {
        self.incident.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Fails a command at once while the server is down.
    pub(super) fn check(&self) -> Result<(), BackendError> {
        if !self.down.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut incident = self.incident();
        let Some(open) = incident.as_mut() else {
            return Ok(());
        };
        open.failures += 1;
        let ms = open.since.elapsed().as_millis();
        let down = format!("Redis at {} has refused connections for {ms} ms", self.server);
        let error = BackendError::new(BackendErrorKind::Unavailable, down);
        Err(error.back_at(open.next_probe.unwrap_or_else(Instant::now)).reported())
    }

    /// Records a failed command, and tells whether the probe must start (the command opened
    /// an incident). Returns the error marked as reported.
    pub(super) fn failed(&self, trouble: Trouble, error: BackendError) -> (BackendError, bool) {
        let mut incident = self.incident();
        let probe = match incident.as_mut() {
            Some(open) => {
                open.failures += 1;
                tracing::debug!(server = %self.server, error = %format_args!("{error:#}"), "lock store still failing");
                if trouble == Trouble::Refused {
                    open.trouble = Trouble::Refused;
                }
                false
            }
            None => {
                *incident = Some(Incident {
                    trouble,
                    since: Instant::now(),
                    failures: 1,
                    next_probe: None,
                });
                self.troubled.store(true, Ordering::Release);
                let what = match trouble {
                    Trouble::Refused => {
                        "lock store refuses connections: acquires fail at once until a probe \
                         reaches it again"
                    }
                    Trouble::Silent => {
                        "lock store does not answer in time: commands are retried within each \
                         request's wait"
                    }
                };
                tracing::warn!(server = %self.server, error = %format_args!("{error:#}"), "{what}");
                true
            }
        };
        (error.reported(), probe)
    }

    /// Records a command that succeeded: ends the open incident, if any (one atomic load when
    /// there is none).
    pub(super) fn succeeded(&self) {
        if !self.troubled.load(Ordering::Acquire) {
            return;
        }
        let Some(ended) = self.incident().take() else {
            return;
        };
        self.troubled.store(false, Ordering::Release);
        self.down.store(false, Ordering::Release);
        tracing::info!(
            server = %self.server,
            lasted_ms = u64::try_from(ended.since.elapsed().as_millis()).unwrap_or(u64::MAX),
            failed = ended.failures,
            "lock store answers again"
        );
    }

    /// The probe did not reach the server; it looks again at `next`. A server that refuses
    /// connections is down until then. False when something reached it meanwhile.
    fn still_failing(&self, next: Instant) -> bool {
        let mut incident = self.incident();
        let Some(open) = incident.as_mut() else {
            return false;
        };
        open.next_probe = Some(next);
        if open.trouble == Trouble::Refused {
            self.down.store(true, Ordering::Release);
        }
        true
    }
}

impl RedisBackend {
    /// Probes the server in the background (a connection and a `PING`) until it answers, or
    /// the backend goes: an incident ends when the server is back, not at the next command.
    pub(super) fn start_probe(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let inner: Weak<Inner> = Arc::downgrade(&self.inner);
        let stop = self.inner.stop.clone();
        runtime.spawn(async move {
            let mut pause = FIRST_PROBE;
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(pause) => {}
                }
                let Some(inner) = inner.upgrade() else { return };
                let health = &inner.health;
                if !health.troubled.load(Ordering::Acquire) {
                    return;
                }
                match (Self { inner: inner.clone() }).probe().await {
                    Ok(()) => return health.succeeded(),
                    Err(error) => {
                        tracing::debug!(server = %health.server, error = %format_args!("{error:#}"), "lock store probe failed");
                        pause = (pause * 2).min(PROBE_EVERY);
                        if !health.still_failing(Instant::now() + pause) {
                            return;
                        }
                    }
                }
            }
        });
    }

    /// One probe within the command timeout, past the check that fails commands while the
    /// server is down.
    async fn probe(&self) -> Result<(), BackendError> {
        let attempt = async {
            let mut conn = self.inner.transport.get().await?;
            let pong: Result<String, _> = redis::cmd("PING").query_async(&mut conn).await;
            if pong.is_err() {
                conn.mark_broken();
            }
            pong.map(drop).map_err(super::errors::redis_error)
        };
        tokio::time::timeout(self.inner.command_timeout, attempt)
            .await
            .unwrap_or_else(|_| Err(BackendError::from_kind(BackendErrorKind::Timeout)))
    }
}
