//! What the layer answers when a request cannot hold its lock.

use std::{any::Any, time::Duration};

use http::{
    HeaderValue, Response, StatusCode,
    header::{CONTENT_TYPE, RETRY_AFTER},
};

use crate::{
    error::{BackendError, BackendErrorKind, LockError},
    lock_key::KeyError,
};

/// Why a request was answered without running the inner service, or was cut short.
///
/// | rejection | status | `Retry-After` |
/// |---|---|---|
/// | [`MissingKey`](Self::MissingKey), [`InvalidKey`](Self::InvalidKey) | 400 | |
/// | [`Locked`](Self::Locked) (wait timed out) | 423 | how long the layer's requests typically hold the lock, never less than the request waited, never more than the holder's remaining lease |
/// | [`TooManyWaiters`](Self::TooManyWaiters) | 503 | 1 s |
/// | [`Unavailable`](Self::Unavailable) (store down, or in its restart quarantine) | 503 | when the store is expected back (the quarantine's end, the next probe of a store that refuses connections), when known |
/// | [`Lost`](Self::Lost), [`ShutDown`](Self::ShutDown) | 503 | |
/// | [`Conflict`](Self::Conflict) (a read lock asked for a write lock) | 409 | |
/// | [`Misconfigured`](Self::Misconfigured) (lease too short, a lock kind the backend refuses) | 500 | |
///
/// With feature `grpc`, `grpc::GrpcRejection` answers each as a gRPC status instead
/// (`LockRejection::grpc_code` lists them; the `grpc` guide says why).
#[derive(Debug)]
#[non_exhaustive]
pub enum LockRejection {
    /// The request carries no key.
    MissingKey,
    /// The key was refused (empty, too long).
    InvalidKey(KeyError),
    /// Another holder kept the lock for the whole wait.
    Locked {
        /// When the lock is likely free: under a layer, the running average of how long its
        /// requests held their locks (the holder's remaining lease before any request
        /// finished), raised to how long this request waited (the holder has held the lock at
        /// least that long already), and capped by the holder's remaining lease when the wait
        /// ended (the latest it is free, unless renewed).
        retry_after: Option<Duration>,
    },
    /// Too many requests already wait for this key in this instance.
    TooManyWaiters,
    /// The lock backend failed or could not be reached.
    Unavailable(BackendError),
    /// The lock was lost while the request ran.
    Lost,
    /// The request asked for a lock it cannot wait for without deadlocking.
    Conflict,
    /// The lock client was shut down.
    ShutDown,
    /// The layer is configured with settings that cannot work (a lease too short to hold, a lock
    /// kind or option its backend refuses).
    Misconfigured,
}

impl LockRejection {
    /// The HTTP status of this rejection.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::MissingKey | Self::InvalidKey(_) => StatusCode::BAD_REQUEST,
            Self::Locked { .. } => StatusCode::LOCKED,
            Self::Conflict => StatusCode::CONFLICT,
            Self::Misconfigured => StatusCode::INTERNAL_SERVER_ERROR,
            Self::TooManyWaiters | Self::Unavailable(_) | Self::Lost | Self::ShutDown => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        }
    }

    /// When the client may try again, for the `Retry-After` header, measured now (for a
    /// store in its quarantine or known to be down, the time left until it is expected back).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Locked { retry_after } => Some(retry_after.unwrap_or(Duration::from_secs(1))),
            Self::TooManyWaiters => Some(Duration::from_secs(1)),
            Self::Unavailable(error) => error.retry_after(),
            _ => None,
        }
    }

    /// A response with this rejection's status, `Retry-After` where known, and `body`.
    pub fn into_response_with<B>(self, body: B) -> Response<B> {
        let mut response = Response::new(body);
        *response.status_mut() = self.status();
        if let Some(secs) = self.retry_after_secs() {
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }

    /// A response with this rejection's status, `Retry-After` where known, and a one-line
    /// text body saying what happened when `B` can carry text (axum's `Body`, `String`,
    /// `Vec<u8>`); an empty body otherwise.
    pub fn into_text_response<B: Default + 'static>(self) -> Response<B> {
        let mut text = self.message();
        text.push('\n');
        let body = text_body(text);
        let carries_text = body.is_some();
        let mut response = self.into_response_with(body.unwrap_or_default());
        if carries_text {
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
        }
        response
    }

    /// What happened, in one line: `locked; retry in about 3 s`.
    pub(crate) fn message(&self) -> String {
        let mut text = self.to_string();
        if let Some(secs) = self.retry_after_secs() {
            text.push_str(&format!("; retry in about {secs} s"));
        }
        text
    }

    /// `Retry-After` in whole seconds, rounded up, at least one.
    fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after()
            .map(|after| (after.as_secs() + u64::from(after.subsec_nanos() > 0)).max(1))
    }

    /// Logs the rejection on target `tower_lock::rejection` (never more than the reason: no
    /// key, no request data) and counts it. A client's mistake or a broken setup is a warning
    /// or an error an operator sees; a lock that stayed busy is information.
    pub(crate) fn trace(&self) {
        self.count();
        let status = self.status();
        match self {
            Self::Misconfigured => {
                tracing::error!(target: "tower_lock::rejection", %status, "lock layer misconfigured: its lease is too short, or its backend refuses the lock kind");
            }
            // The backend logged the incident once when it began: one line per request would
            // bury it.
            Self::Unavailable(error) if error.is_reported() => {
                tracing::debug!(target: "tower_lock::rejection", error = %format_args!("{error:#}"), %status, retry_after_s = self.retry_after_secs(), "lock backend unavailable");
            }
            Self::Unavailable(error) => {
                tracing::warn!(target: "tower_lock::rejection", error = %format_args!("{error:#}"), %status, retry_after_s = self.retry_after_secs(), "lock backend unavailable");
            }
            Self::MissingKey | Self::InvalidKey(_) | Self::Lost | Self::Conflict => {
                tracing::warn!(target: "tower_lock::rejection", rejection = %self, %status, "request rejected");
            }
            Self::Locked { .. } | Self::TooManyWaiters | Self::ShutDown => {
                tracing::info!(target: "tower_lock::rejection", rejection = %self, %status, retry_after_s = self.retry_after_secs(), "request rejected");
            }
        }
    }
}

impl LockRejection {
    /// Counts the rejection in [`REJECTIONS`](crate::metrics::REJECTIONS), labelled by its
    /// reason (one of a fixed set, never request data).
    fn count(&self) {
        #[cfg(feature = "metrics")]
        ::metrics::counter!(crate::metrics::REJECTIONS, "reason" => self.reason()).increment(1);
    }

    /// The `reason` label of this rejection.
    #[cfg(feature = "metrics")]
    fn reason(&self) -> &'static str {
        match self {
            Self::MissingKey => "missing_key",
            Self::InvalidKey(_) => "invalid_key",
            Self::Locked { .. } => "locked",
            Self::Conflict => "conflict",
            Self::Misconfigured => "misconfigured",
            Self::TooManyWaiters => "too_many_waiters",
            Self::Unavailable(_) => "unavailable",
            Self::Lost => "lost",
            Self::ShutDown => "shut_down",
        }
    }
}

impl From<LockError> for LockRejection {
    fn from(error: LockError) -> Self {
        match error {
            LockError::WaitTimeout {
                retry_after,
                waited,
            } => Self::Locked {
                retry_after: Some(locked_retry_after(None, retry_after, waited)),
            },
            LockError::InvalidKey(key) => Self::InvalidKey(key),
            LockError::TooManyWaiters => Self::TooManyWaiters,
            // A lock kind the backend refuses is a deployment mistake, not an outage.
            LockError::Backend(backend) if backend.is_unsupported() => Self::Misconfigured,
            LockError::Backend(backend) => Self::Unavailable(backend),
            LockError::UpgradeRefused => Self::Conflict,
            LockError::ShutDown => Self::ShutDown,
            LockError::InvalidLease(_)
            | LockError::InvalidPermits
            | LockError::ForeignHolder
            | LockError::HeldThroughOtherClient => Self::Misconfigured,
            LockError::Lost | LockError::NotHeld => Self::Lost,
        }
    }
}

impl std::fmt::Display for LockRejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::MissingKey => f.write_str("request has no lock key"),
            Self::InvalidKey(error) => write!(f, "invalid lock key: {error}"),
            Self::Locked { .. } => f.write_str("locked"),
            Self::TooManyWaiters => f.write_str("too many requests wait for this resource"),
            // The cause is the source: error reporters print it once, and clients see no more.
            Self::Unavailable(error) if *error.kind() == BackendErrorKind::Quarantined => {
                f.write_str("lock store restarted recently and grants no lock yet")
            }
            Self::Unavailable(_) => f.write_str("lock backend unavailable"),
            Self::Lost => f.write_str("lock lost while the request ran"),
            Self::Conflict => f.write_str("lock request would deadlock"),
            Self::ShutDown => f.write_str("lock client shut down"),
            Self::Misconfigured => f.write_str("lock layer misconfigured"),
        }
    }
}

/// When a request whose wait ran out may try again: the `typical` hold when known, else the
/// holder's remaining lease (`lease_left`, measured when the wait ended); never less than what
/// the request `waited` (the holder has held the lock at least that long), never more than
/// `lease_left` (by then the lock is free, or its holder renewed it).
pub(crate) fn locked_retry_after(
    typical: Option<Duration>,
    lease_left: Option<Duration>,
    waited: Duration,
) -> Duration {
    let estimate = typical.or(lease_left).unwrap_or(waited).max(waited);
    lease_left.map_or(estimate, |left| estimate.min(left))
}

/// `text` as a body of type `B`, when `B` is one that carries text.
fn text_body<B: 'static>(text: String) -> Option<B> {
    let mut slot: Option<B> = None;
    let any: &mut dyn Any = &mut slot;
    if let Some(slot) = any.downcast_mut::<Option<String>>() {
        *slot = Some(text);
    } else if let Some(slot) = any.downcast_mut::<Option<Vec<u8>>>() {
        *slot = Some(text.into_bytes());
    } else {
        #[cfg(feature = "axum")]
        if let Some(slot) = any.downcast_mut::<Option<axum::body::Body>>() {
            *slot = Some(axum::body::Body::from(text));
        }
    }
    slot
}

/// Builds the response for a rejection. Closures `Fn(LockRejection) -> Response<B>` implement
/// it; the default, [`DefaultRejection`], answers with a one-line text body where the body
/// type carries text.
pub trait OnRejected<B>: Clone + Send + Sync + 'static {
    /// The response for `rejection`.
    fn on_rejected(&self, rejection: LockRejection) -> Response<B>;
}

impl<B, F> OnRejected<B> for F
where
    F: Fn(LockRejection) -> Response<B> + Clone + Send + Sync + 'static,
{
    fn on_rejected(&self, rejection: LockRejection) -> Response<B> {
        self(rejection)
    }
}

/// Answers rejections with their status, `Retry-After` where known, and a one-line text body
/// ([`LockRejection::into_text_response`]): `locked; retry in about 3 s`.
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultRejection;

impl<B: Default + 'static> OnRejected<B> for DefaultRejection {
    fn on_rejected(&self, rejection: LockRejection) -> Response<B> {
        rejection.into_text_response()
    }
}

#[cfg(feature = "axum")]
impl axum::response::IntoResponse for LockRejection {
    fn into_response(self) -> axum::response::Response {
        self.into_text_response()
    }
}

impl std::error::Error for LockRejection {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Unavailable(error) => Some(error),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each engine outcome maps to its documented status, with `Retry-After` in whole seconds.
    #[test]
    fn statuses_and_retry_after() {
        let locked = LockRejection::from(LockError::WaitTimeout {
            retry_after: Some(Duration::from_millis(1500)),
            waited: Duration::from_millis(200),
        });
        let response = locked.into_response_with(());
        assert_eq!(response.status(), StatusCode::LOCKED);
        assert_eq!(response.headers()[RETRY_AFTER], "2");
        let busy = DefaultRejection.on_rejected(LockRejection::TooManyWaiters);
        let busy: Response<String> = busy;
        assert_eq!(busy.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(busy.headers()[RETRY_AFTER], "1");
        assert_eq!(LockRejection::MissingKey.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            LockRejection::from(LockError::Lost).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            LockRejection::from(LockError::UpgradeRefused).status(),
            StatusCode::CONFLICT
        );
    }

    /// A 423's hint: the typical hold (else the lease left), never under the wait, never over
    /// the lease left.
    #[test]
    fn locked_retry_after_is_bounded_by_the_wait_and_the_lease() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        // A typical hold of milliseconds is raised to the 2 s waited.
        assert_eq!(locked_retry_after(Some(ms(35)), Some(s(43)), s(2)), s(2));
        // A typical hold longer than the wait stands, within the lease.
        assert_eq!(locked_retry_after(Some(s(5)), Some(s(43)), s(2)), s(5));
        assert_eq!(locked_retry_after(Some(s(50)), Some(s(43)), s(2)), s(43));
        // No history: the lease left.
        assert_eq!(locked_retry_after(None, Some(s(19)), s(2)), s(19));
        // The lease left caps even the wait: the lock is free (or renewed) by then.
        assert_eq!(locked_retry_after(None, Some(ms(500)), s(2)), ms(500));
        // Nothing known but the wait.
        assert_eq!(locked_retry_after(None, None, s(2)), s(2));
    }

    /// Every rejection is counted under its documented `reason` label.
    #[cfg(feature = "metrics")]
    #[test]
    fn rejections_are_counted_by_reason() {
        use crate::error::{BackendError, BackendErrorKind};
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};

        let cases = [
            (LockRejection::MissingKey, "missing_key"),
            (LockRejection::InvalidKey(KeyError::Empty), "invalid_key"),
            (LockRejection::Locked { retry_after: None }, "locked"),
            (LockRejection::Conflict, "conflict"),
            (LockRejection::Misconfigured, "misconfigured"),
            (LockRejection::TooManyWaiters, "too_many_waiters"),
            (
                LockRejection::Unavailable(BackendError::from_kind(BackendErrorKind::Unavailable)),
                "unavailable",
            ),
            (LockRejection::Lost, "lost"),
            (LockRejection::ShutDown, "shut_down"),
        ];
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            for (rejection, _) in &cases {
                rejection.trace();
            }
        });
        let mut counted: Vec<(String, String, u64)> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, _, _, value)| {
                let labels: Vec<String> = key
                    .key()
                    .labels()
                    .map(|label| format!("{}={}", label.key(), label.value()))
                    .collect();
                let DebugValue::Counter(n) = value else {
                    panic!("{key:?} is not a counter");
                };
                (key.key().name().to_owned(), labels.join(","), n)
            })
            .collect();
        counted.sort();
        let mut expected: Vec<(String, String, u64)> = cases
            .iter()
            .map(|(_, reason)| {
                let name = crate::metrics::REJECTIONS.to_owned();
                (name, format!("reason={reason}"), 1)
            })
            .collect();
        expected.sort();
        assert_eq!(counted, expected);
    }

    /// Bodies that carry text get one line saying what happened; others stay empty.
    #[test]
    fn text_bodies_where_the_body_type_allows() {
        let locked = || LockRejection::Locked {
            retry_after: Some(Duration::from_millis(2500)),
        };
        let text: Response<String> = DefaultRejection.on_rejected(locked());
        assert_eq!(text.body(), "locked; retry in about 3 s\n");
        assert_eq!(text.headers()[CONTENT_TYPE], "text/plain; charset=utf-8");
        let bytes: Response<Vec<u8>> = DefaultRejection.on_rejected(LockRejection::MissingKey);
        assert_eq!(bytes.body(), b"request has no lock key\n");
        let empty: Response<()> = DefaultRejection.on_rejected(locked());
        assert!(!empty.headers().contains_key(CONTENT_TYPE));
        assert_eq!(empty.headers()[RETRY_AFTER], "3");
    }
}
