//! Error types: [`LockError`] for lock outcomes, [`BackendError`] for the store underneath.

use std::{error::Error as StdError, fmt, time::Duration};

use tokio::time::Instant;

use crate::lock_key::KeyError;

/// A boxed error from a backend's client library, kept as the source of a [`BackendError`].
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Why a lock operation did not succeed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The lock stayed held by another holder for the whole wait.
    #[error("lock wait timed out")]
    WaitTimeout {
        /// When the lock is likely free, as the client estimated it when the wait ended: how
        /// long its holds of like locks (the same name up to the key's last `:`) typically
        /// last, never less than this acquire waited; with no hold seen yet, the wait (100 ms
        /// to 5 s), never the holder's whole lease; capped by the holder's lease left, when
        /// some was, but not below the wait; never under 10 ms. `None` only in an error made
        /// outside the client.
        retry_after: Option<Duration>,
        /// How long this acquire waited: its holder has held the lock at least that long.
        waited: Duration,
    },
    /// The lock was lost while held: its lease ran out, or another owner took it.
    #[error("lock lost")]
    Lost,
    /// The lock is not held by this holder (released after its lease expired, or twice).
    #[error("lock not held")]
    NotHeld,
    /// The key was refused before any backend call.
    #[error("invalid lock key: {0}")]
    InvalidKey(#[from] KeyError),
    /// The backend failed or could not be reached.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A holder of the read side asked for the write side of the same read-write lock; waiting
    /// would deadlock, so it fails at once.
    #[error("cannot upgrade a read lock to a write lock")]
    UpgradeRefused,
    /// The request's lease cannot be held: under 3 ms, or over 365 days.
    #[error("lease of {0:?} is out of range: a lease is 3 ms to 365 days")]
    InvalidLease(Duration),
    /// A semaphore was asked for with no permits: nobody could ever hold it.
    #[error("a semaphore needs at least one permit")]
    InvalidPermits,
    /// Too many requests are already waiting in this client, for this key
    /// (`max_waiters_per_key`) or over all keys (`max_waiters`).
    #[error("too many waiters for this lock")]
    TooManyWaiters,
    /// The client was shut down.
    #[error("lock client shut down")]
    ShutDown,
    /// The holder named with [`LockRequest::holder`](crate::LockRequest::holder) was made by
    /// another client: a holder belongs to the client that made it (and its clones).
    #[error(
        "the holder belongs to another lock client: a holder is used only by the client that made it"
    )]
    ForeignHolder,
    /// The request already holds this lock through another client (a layer and an attribute,
    /// or two layers, built on different clients): it would wait for itself, so it fails at
    /// once. Re-entry works within one client: build them on the same `LockClient`.
    #[error(
        "the request already holds this lock through another lock client; re-entry works within one client"
    )]
    HeldThroughOtherClient,
}

/// How soon to try again after a failure that may pass by itself (a store that did not
/// answer, too many waiters, a lock lost mid-request) when nothing better is known.
pub(crate) const RETRY_SOON: Duration = Duration::from_secs(1);

impl LockError {
    /// When trying again may succeed, for a `Retry-After` (gRPC: `grpc-retry-pushback-ms`)
    /// hint, measured now; the same figure the [`LockRejection`](crate::LockRejection) this
    /// error becomes answers with, on every path (a layer, `#[locked]`, `?` into a
    /// `tonic::Status`).
    ///
    /// - A wait that ran out: when the lock is likely free (see [`WaitTimeout`](Self::WaitTimeout)).
    /// - A store in its restart quarantine, or known to be down:
    ///   [`BackendError::retry_after`]; any other store failure but an unsupported lock kind:
    ///   that, else 1 s.
    /// - Too many waiters, a lock lost, a client shut down: 1 s.
    /// - Otherwise (a bad key or setting, a deadlock refused): `None`; trying again will not help.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::WaitTimeout { retry_after, waited } => Some(
                retry_after
                    .unwrap_or_else(|| crate::client::holds::likely_free_in(None, None, *waited)),
            ),
            Self::Backend(error) if error.is_unsupported() => None,
            Self::Backend(error) => Some(error.retry_hint()),
            Self::TooManyWaiters | Self::Lost | Self::NotHeld | Self::ShutDown => Some(RETRY_SOON),
            _ => None,
        }
    }
}

/// What kind of failure a [`BackendError`] is.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendErrorKind {
    /// The backend could not be reached (connection refused or dropped, pool exhausted).
    Unavailable,
    /// The backend did not answer within the command timeout. The operation may or may not
    /// have taken effect on the server.
    Timeout,
    /// The connection failed while the command was in flight. The operation may or may not
    /// have taken effect on the server.
    Interrupted,
    /// The key exists but holds data of another type, which is never overwritten.
    WrongType {
        /// The type found at the key, as the backend names it (for Redis: `string`, `list`, ...).
        found: String,
    },
    /// The backend refused the command for lack of permission (for Redis: an ACL `NOPERM`).
    NoPermission,
    /// Fewer replicas than configured acknowledged a grant in time, so it was undone (see
    /// `RedisBackendBuilder::min_replicas`).
    ReplicasNotAcknowledged {
        /// How many replicas were required.
        wanted: u32,
        /// How many acknowledged within the timeout.
        acknowledged: u32,
    },
    /// The grant did not reach the append-only files configured in time, so it was undone (see
    /// `RedisBackendBuilder::wait_aof`).
    AofNotAcknowledged {
        /// Whether the server that granted it had to fsync it.
        local_wanted: bool,
        /// Whether that server fsynced it within the timeout.
        local: bool,
        /// How many replicas had to fsync it.
        wanted: u32,
        /// How many fsynced it within the timeout.
        acknowledged: u32,
    },
    /// The backend answered something the crate does not understand.
    Protocol,
    /// Fewer nodes of a Redlock backend answered than a majority: no lock can be taken, kept
    /// or released with certainty until more of them are back.
    QuorumUnavailable {
        /// How many nodes answered.
        reachable: usize,
        /// How many must answer (a majority of all nodes).
        needed: usize,
    },
    /// The backend cannot offer what was asked without weakening a guarantee (for Redlock:
    /// fair and read-write locks, fencing tokens). Refused before any node is contacted.
    Unsupported {
        /// What was asked for.
        feature: &'static str,
    },
    /// The backend is set up in a way that cannot work (a URL that is not a Redis URL, a
    /// password or ACL user the server refuses, a database it does not have, a `rediss://` URL
    /// without the `tls` feature): fix the configuration; retrying will not help.
    Misconfigured {
        /// What to fix.
        what: String,
    },
    /// The store started less than a lease ago: it grants no new lock until every lease it
    /// may have forgotten has run out (see `RedisBackendBuilder::quarantine`).
    /// [`BackendError::retry_after`] says when that is.
    Quarantined,
    /// Any other backend failure.
    Other,
}

/// A failure of the store behind the locks, with the key it concerned and the client library's
/// error as its source.
#[derive(Debug)]
pub struct BackendError {
    kind: BackendErrorKind,
    key: Option<String>,
    source: Option<BoxError>,
    /// When the store is expected to answer again, when the backend knows.
    back_at: Option<Instant>,
    /// The backend already logged the incident this failure belongs to.
    reported: bool,
}

impl BackendError {
    /// A new error of `kind`, with the underlying error as its source.
    pub fn new(kind: BackendErrorKind, source: impl Into<BoxError>) -> Self {
        Self { kind, key: None, source: Some(source.into()), back_at: None, reported: false }
    }

    /// A new error of `kind` with no underlying error.
    pub fn from_kind(kind: BackendErrorKind) -> Self {
        Self { kind, key: None, source: None, back_at: None, reported: false }
    }

    /// Says when the store is expected to answer again (a quarantine's end, the next probe of
    /// a store that refuses connections).
    #[must_use]
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn back_at(mut self, at: Instant) -> Self {
        self.back_at = Some(at);
        self
    }

    /// Marks the failure as part of an incident the backend already logged.
    #[must_use]
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn reported(mut self) -> Self {
        self.reported = true;
        self
    }

    /// Whether the backend already logged the incident this failure belongs to (a store
    /// refusing connections, or not answering): a rejection need not log it again.
    pub(crate) fn is_reported(&self) -> bool {
        self.reported
    }

    /// When the store is expected to answer again, measured now: the time left of its restart
    /// quarantine, or, for a store that refuses connections, until it is next probed. `None`
    /// when the backend does not know.
    pub fn retry_after(&self) -> Option<Duration> {
        self.back_at.map(|at| at.saturating_duration_since(Instant::now()))
    }

    /// When to try again after this failure: [`retry_after`](Self::retry_after) when known,
    /// else 1 s; never under 10 ms.
    pub(crate) fn retry_hint(&self) -> Duration {
        self.retry_after().unwrap_or(RETRY_SOON).max(crate::client::holds::MIN_RETRY)
    }

    /// When the quarantine of a store that restarted recently ends.
    pub(crate) fn quarantine_ends(&self) -> Option<Instant> {
        match self.kind {
            BackendErrorKind::Quarantined => self.back_at,
            _ => None,
        }
    }

    /// Names the backend key the failed operation concerned.
    #[must_use]
    pub fn with_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> &BackendErrorKind {
        &self.kind
    }

    /// The backend key the failed operation concerned, if any.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// Whether the backend could not be reached, before or during the command (for Redlock:
    /// not enough of its nodes), or grants nothing yet (its restart quarantine).
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self.kind,
            BackendErrorKind::Unavailable
                | BackendErrorKind::Interrupted
                | BackendErrorKind::QuorumUnavailable { .. }
                | BackendErrorKind::Quarantined
        )
    }

    /// Whether the backend refused a lock kind or option it does not support.
    pub fn is_unsupported(&self) -> bool {
        matches!(self.kind, BackendErrorKind::Unsupported { .. })
    }

    /// Whether the backend did not answer in time.
    pub fn is_timeout(&self) -> bool {
        self.kind == BackendErrorKind::Timeout
    }

    /// Whether the key holds data of another type.
    pub fn is_wrong_type(&self) -> bool {
        matches!(self.kind, BackendErrorKind::WrongType { .. })
    }

    /// Whether the backend refused the command for lack of permission.
    pub fn is_no_permission(&self) -> bool {
        self.kind == BackendErrorKind::NoPermission
    }

    /// Whether the operation may have taken effect even though it failed (its reply was lost).
    pub(crate) fn outcome_unknown(&self) -> bool {
        matches!(
            self.kind,
            BackendErrorKind::Timeout | BackendErrorKind::Interrupted | BackendErrorKind::Other
        )
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            BackendErrorKind::Unavailable => f.write_str("lock backend unavailable")?,
            BackendErrorKind::Timeout => f.write_str("lock backend timed out")?,
            BackendErrorKind::Interrupted => {
                f.write_str("lock backend connection failed mid-command")?;
            }
            BackendErrorKind::WrongType { found } => {
                write!(f, "lock key holds a value of type `{found}`, not a lock")?;
            }
            BackendErrorKind::NoPermission => f.write_str("lock backend denied permission")?,
            BackendErrorKind::ReplicasNotAcknowledged { wanted, acknowledged } => write!(
                f,
                "{acknowledged} of {wanted} required replicas acknowledged the lock; it was undone"
            )?,
            BackendErrorKind::AofNotAcknowledged { local_wanted, local, wanted, acknowledged } => {
                let here = match (local_wanted, local) {
                    (false, _) => "not required",
                    (true, true) => "done",
                    (true, false) => "missing",
                };
                write!(
                    f,
                    "the lock did not reach the append-only files in time (local fsync {here}, \
                     {acknowledged} of {wanted} required replicas); it was undone"
                )?;
            }
            BackendErrorKind::Protocol => f.write_str("unexpected reply from lock backend")?,
            BackendErrorKind::QuorumUnavailable { reachable, needed } => write!(
                f,
                "lock backend quorum unavailable: {reachable} nodes answered, {needed} needed"
            )?,
            BackendErrorKind::Unsupported { feature } => {
                write!(f, "lock backend does not support {feature}")?;
            }
            BackendErrorKind::Misconfigured { what } => {
                write!(f, "lock backend misconfigured: {what}")?;
            }
            BackendErrorKind::Quarantined => f.write_str(
                "lock store restarted less than a lease ago; it grants no new lock yet",
            )?,
            BackendErrorKind::Other => f.write_str("lock backend error")?,
        }
        if let Some(key) = &self.key {
            write!(f, " (key `{key}`)")?;
        }
        // The cause is the source, not part of this message: error reporters print each
        // cause once (use `{:#}` for the whole chain on one line).
        if f.alternate() {
            let mut source = self.source.as_deref().map(|s| s as &dyn StdError);
            let mut last = String::new();
            while let Some(cause) = source {
                let text = cause.to_string();
                // Client libraries often repeat their own source in their message.
                if !last.contains(&text) {
                    write!(f, ": {text}")?;
                }
                last = text;
                source = cause.source();
            }
        }
        Ok(())
    }
}

impl StdError for BackendError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn StdError + 'static))
    }
}

/// A setting that cannot work, named by the builder method that set it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The key prefix contains `{` or `}`, which would change the Redis Cluster hash slot of
    /// every lock key.
    #[error("prefix must not contain `{{` or `}}`: {0:?}")]
    PrefixBraces(String),
    /// A lease under 3 ms would expire before it could be used or renewed.
    #[error("lease must be at least 3 ms")]
    LeaseTooShort,
    /// The maximum key length must leave room for at least one byte.
    #[error("max_key_len must be at least 1")]
    ZeroMaxKeyLen,
    /// Some other setting is out of range.
    #[error("invalid setting `{setting}`: {reason}")]
    Invalid {
        /// The builder method that set it.
        setting: &'static str,
        /// Why it cannot work.
        reason: &'static str,
    },
}
