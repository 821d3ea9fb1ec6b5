//! What the backend knows of its server's health, so that an outage fails fast and is logged
//! once.
//!
//! - A server that **refuses connections** is probed in the background. Until a probe reaches
//!   it again it is *down*: every command fails at once with
//!   [`Unavailable`](crate::error::BackendErrorKind::Unavailable), saying when the next probe
//!   looks ([`BackendError::retry_after`]), instead of each request spending its wait on
//!   connections that cannot open. The first probe looks [`FIRST_PROBE`] after the refusal, so
//!   a server restarting on its port (refusing for a few milliseconds) is ridden out; later
//!   probes back off to one every [`PROBE_EVERY`].
//! - A server that **does not answer** within the command timeout (paused, busy with a slow
//!   command, failing over) is not down: its callers try again within their waits.
//!
//! Either is an *incident*: logged as a warning when it begins, naming the server and the
//! cause, and as information when the server answers again, with how long it lasted and how
//! many commands failed meanwhile. The failures in between are logged at debug, and their
//! errors are marked as reported, so that a rejection does not log them again.

use std::{
    fmt,
    sync::{
        Arc, Mutex, PoisonError, Weak,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use tokio::time::Instant;

use super::{Inner, RedisBackend};
use crate::error::{BackendError, BackendErrorKind};

/// How long after a refused connection the server is first probed.
pub(super) const FIRST_PROBE: Duration = Duration::from_millis(100);
/// How often a server that is down is probed, at most.
pub(super) const PROBE_EVERY: Duration = Duration::from_secs(1);

/// The health of one server, shared by every command of a backend.
pub(super) struct Health {
    /// The server, for logs and errors (`host:port`, or the Sentinel group).
    server: String,
    /// An incident is open: checked by every command that succeeds, so that only the first
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
    /// When the probe looks next (a server that refused connections).
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
        let next_probe = open.next_probe.unwrap_or_else(Instant::now);
        let error = BackendError::new(
            BackendErrorKind::Unavailable,
            Down {
                server: self.server.clone(),
                since: open.since.elapsed(),
            },
        );
        Err(error.back_at(next_probe).reported())
    }

    /// Records a failed command of `trouble`, and tells whether it opened an incident (a
    /// refusal that did must start the probe). The first failure of an incident is logged as
    /// a warning, the others at debug. Returns the error marked as reported.
    pub(super) fn failed(&self, trouble: Trouble, error: BackendError) -> (BackendError, bool) {
        let mut incident = self.incident();
        let opened = match incident.as_mut() {
            Some(open) => {
                open.failures += 1;
                tracing::debug!(server = %self.server, error = %format_args!("{error:#}"), "lock store still failing");
                // A refusal during a silent spell: the server went away; probe it.
                let escalated = trouble == Trouble::Refused && open.trouble == Trouble::Silent;
                if escalated {
                    open.trouble = Trouble::Refused;
                    tracing::debug!(server = %self.server, "lock store refuses connections now; probing it");
                }
                escalated
            }
            None => {
                *incident = Some(Incident {
                    trouble,
                    since: Instant::now(),
                    failures: 1,
                    next_probe: None,
                });
                self.troubled.store(true, Ordering::Release);
                match trouble {
                    Trouble::Refused => tracing::warn!(
                        server = %self.server,
                        error = %format_args!("{error:#}"),
                        "lock store refuses connections: acquires fail at once until a probe \
                         reaches it again"
                    ),
                    Trouble::Silent => tracing::warn!(
                        server = %self.server,
                        error = %format_args!("{error:#}"),
                        "lock store does not answer in time: commands are retried within each \
                         request's wait"
                    ),
                }
                true
            }
        };
        (error.reported(), opened && trouble == Trouble::Refused)
    }

    /// Records a command that succeeded: ends the open incident, if any. One atomic load when
    /// there is none.
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

    /// The probe found the server still refusing: it is down until the next one, at `next`.
    fn still_down(&self, next: Instant) -> bool {
        let mut incident = self.incident();
        let Some(open) = incident.as_mut() else {
            // Something else reached it meanwhile.
            return false;
        };
        open.next_probe = Some(next);
        if !self.down.swap(true, Ordering::AcqRel) {
            tracing::debug!(server = %self.server, "lock store down: failing acquires at once");
        }
        true
    }

    /// Whether an incident is open and is a refusal (the probe's work is not done).
    fn refusing(&self) -> bool {
        self.incident()
            .as_ref()
            .is_some_and(|open| open.trouble == Trouble::Refused)
    }
}

impl fmt::Debug for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Health")
            .field("server", &self.server)
            .field("down", &self.down.load(Ordering::Relaxed))
            .finish()
    }
}

/// The cause of a command failed at once because its server is down.
#[derive(Debug)]
struct Down {
    server: String,
    since: Duration,
}

impl fmt::Display for Down {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Redis at {} has refused connections for {} ms",
            self.server,
            self.since.as_millis()
        )
    }
}

impl std::error::Error for Down {}

impl RedisBackend {
    /// Probes the server in the background until it answers (or the backend goes): a
    /// connection and a `PING`, first [`FIRST_PROBE`] after the refusal, then backing off to
    /// one every [`PROBE_EVERY`].
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
                let backend = Self { inner };
                if !backend.inner.health.refusing() {
                    return;
                }
                match backend.probe().await {
                    Ok(()) => {
                        backend.inner.health.succeeded();
                        return;
                    }
                    Err(error) => {
                        tracing::debug!(server = %backend.inner.health.server, error = %format_args!("{error:#}"), "lock store probe failed");
                        pause = (pause * 2).min(PROBE_EVERY);
                        if !backend.inner.health.still_down(Instant::now() + pause) {
                            return;
                        }
                    }
                }
            }
        });
    }

    /// One probe: a connection (a new one, if the last broke) and a `PING` on it, within the
    /// command timeout, past the check that fails commands while the server is down.
    async fn probe(&self) -> Result<(), BackendError> {
        let timeout = self.inner.command_timeout;
        let attempt = async {
            let mut conn = self.inner.transport.get().await?;
            let pong: Result<String, _> = redis::cmd("PING").query_async(&mut conn).await;
            if pong.is_err() {
                conn.mark_broken();
            }
            pong.map(drop).map_err(super::errors::redis_error)
        };
        tokio::time::timeout(timeout, attempt)
            .await
            .unwrap_or_else(|_| Err(BackendError::from_kind(BackendErrorKind::Timeout)))
    }
}
