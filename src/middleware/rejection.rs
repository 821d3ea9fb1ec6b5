//! What the layer answers when a request cannot hold its lock.

use std::time::Duration;

use http::{HeaderValue, Response, StatusCode, header::RETRY_AFTER};

use crate::{
    error::{BackendError, LockError},
    key::KeyError,
};

/// Why a request was answered without running the inner service, or was cut short.
///
/// | rejection | status | `Retry-After` |
/// |---|---|---|
/// | [`MissingKey`](Self::MissingKey), [`InvalidKey`](Self::InvalidKey) | 400 | |
/// | [`Locked`](Self::Locked) (wait timed out) | 423 | the holder's remaining lease |
/// | [`TooManyWaiters`](Self::TooManyWaiters) | 503 | 1 s |
/// | [`Unavailable`](Self::Unavailable) (backend down), [`Lost`](Self::Lost), [`ShutDown`](Self::ShutDown) | 503 | |
/// | [`Conflict`](Self::Conflict) (a read lock asked for a write lock) | 409 | |
/// | [`Misconfigured`](Self::Misconfigured) (lease too short, a lock kind the backend refuses) | 500 | |
#[derive(Debug)]
#[non_exhaustive]
pub enum LockRejection {
    /// The request carries no key.
    MissingKey,
    /// The key was refused (empty, too long).
    InvalidKey(KeyError),
    /// Another holder kept the lock for the whole wait.
    Locked {
        /// The holder's remaining lease, when known.
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

    /// When the client may try again, for the `Retry-After` header.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Locked { retry_after } => Some(retry_after.unwrap_or(Duration::from_secs(1))),
            Self::TooManyWaiters => Some(Duration::from_secs(1)),
            _ => None,
        }
    }

    /// A response with this rejection's status, `Retry-After` where known, and `body`.
    pub fn into_response_with<B>(self, body: B) -> Response<B> {
        let mut response = Response::new(body);
        *response.status_mut() = self.status();
        if let Some(after) = self.retry_after() {
            // Whole seconds, rounded up, at least one.
            let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(secs.max(1)));
        }
        response
    }

    /// Logs the rejection on target `tower_lock::rejection` (never more than the reason) and
    /// counts it.
    pub(crate) fn trace(&self) {
        crate::metrics::rejected(self);
        match self {
            Self::Misconfigured => {
                tracing::error!(target: "tower_lock::rejection", "lock layer misconfigured: its lease is too short, or its backend refuses the lock kind");
            }
            Self::Unavailable(error) => {
                tracing::warn!(target: "tower_lock::rejection", %error, status = %self.status(), "lock backend unavailable");
            }
            other => {
                tracing::debug!(target: "tower_lock::rejection", rejection = ?other, status = %other.status(), "request rejected");
            }
        }
    }
}

impl From<LockError> for LockRejection {
    fn from(error: LockError) -> Self {
        match error {
            LockError::WaitTimeout { retry_after } => Self::Locked { retry_after },
            LockError::InvalidKey(key) => Self::InvalidKey(key),
            LockError::TooManyWaiters => Self::TooManyWaiters,
            // A lock kind the backend refuses is a deployment mistake, not an outage.
            LockError::Backend(backend) if backend.is_unsupported() => Self::Misconfigured,
            LockError::Backend(backend) => Self::Unavailable(backend),
            LockError::UpgradeRefused => Self::Conflict,
            LockError::ShutDown => Self::ShutDown,
            LockError::InvalidLease(_) => Self::Misconfigured,
            _ => Self::Lost,
        }
    }
}

impl std::fmt::Display for LockRejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::MissingKey => f.write_str("request has no lock key"),
            Self::InvalidKey(error) => write!(f, "invalid lock key: {error}"),
            Self::Locked { .. } => f.write_str("resource is locked"),
            Self::TooManyWaiters => f.write_str("too many requests wait for this resource"),
            Self::Unavailable(error) => write!(f, "{error}"),
            Self::Lost => f.write_str("lock lost while the request ran"),
            Self::Conflict => f.write_str("lock request would deadlock"),
            Self::ShutDown => f.write_str("lock client shut down"),
            Self::Misconfigured => f.write_str("lock layer misconfigured"),
        }
    }
}

/// Builds the response for a rejection. Closures `Fn(LockRejection) -> Response<B>` implement
/// it; the default, [`DefaultRejection`], answers with an empty body.
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

/// Answers rejections with their status, `Retry-After` where known, and an empty body.
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultRejection;

impl<B: Default> OnRejected<B> for DefaultRejection {
    fn on_rejected(&self, rejection: LockRejection) -> Response<B> {
        rejection.into_response_with(B::default())
    }
}

#[cfg(feature = "axum")]
impl axum::response::IntoResponse for LockRejection {
    fn into_response(self) -> axum::response::Response {
        self.into_response_with(axum::body::Body::empty())
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
}
