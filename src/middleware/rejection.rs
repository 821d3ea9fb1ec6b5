//! What the layer answers when a request cannot hold its lock.

use std::{any::Any, time::Duration};

use http::{
    HeaderValue, Response, StatusCode,
    header::{CONTENT_TYPE, RETRY_AFTER},
};

use crate::{
    error::{BackendError, BackendErrorKind, LockError, RETRY_SOON},
    lock_key::KeyError,
};

/// Why a request was answered without running the inner service, or was cut short.
///
/// | rejection | status | `Retry-After` |
/// |---|---|---|
/// | [`MissingKey`](Self::MissingKey), [`InvalidKey`](Self::InvalidKey) | 400 | |
/// | [`Locked`](Self::Locked) (wait timed out) | 423 | when the lock is likely free: how long the client's holds of like locks typically last, never less than the request waited; with no hold seen yet, the wait (100 ms to 5 s), never the holder's whole lease ([`LockError::WaitTimeout`]) |
/// | [`TooManyWaiters`](Self::TooManyWaiters) | 503 | 1 s |
/// | [`Unavailable`](Self::Unavailable) (store down or not answering, or in its restart quarantine) | 503 | when the store is expected back (the quarantine's end, the next probe of a store that refuses connections), else 1 s |
/// | [`Lost`](Self::Lost), [`ShutDown`](Self::ShutDown) | 503 | 1 s |
/// | [`Conflict`](Self::Conflict) (a read lock asked for a write lock) | 409 | |
/// | [`Misconfigured`](Self::Misconfigured) (lease too short, a lock kind the backend refuses) | 500 | |
///
/// With feature `grpc` (which `tonic` implies), a gRPC call (`content-type: application/grpc…`)
/// is answered as a gRPC status instead, by default (`LockRejection::grpc_code` lists them; the
/// `grpc` guide says why). The hint is one figure, [`LockError::retry_after`]'s for the error
/// the rejection comes from, whichever path answers.
#[derive(Debug)]
#[non_exhaustive]
pub enum LockRejection {
    /// The request carries no key.
    MissingKey,
    /// The key was refused (empty, too long).
    InvalidKey(KeyError),
    /// Another holder kept the lock for the whole wait.
    Locked {
        /// When the lock is likely free: the [`LockError::WaitTimeout`]'s estimate, made by
        /// the client from its hold times. `None` (answered as 1 s) only for a rejection made
        /// by hand.
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

    /// When the client may try again, for the `Retry-After` header (gRPC:
    /// `grpc-retry-pushback-ms`), measured now: every 423 and 503 (gRPC `UNAVAILABLE`) has one.
    /// For a rejection made from a [`LockError`], the error's
    /// [`retry_after`](LockError::retry_after).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Locked { retry_after } => Some(retry_after.unwrap_or(RETRY_SOON)),
            Self::TooManyWaiters | Self::Lost | Self::ShutDown => Some(RETRY_SOON),
            Self::Unavailable(error) => Some(error.retry_hint()),
            _ => None,
        }
    }

    /// A response with this rejection's status, `Retry-After` where known, and `body`.
    pub fn into_response_with<B>(self, body: B) -> Response<B> {
        let hint = self.retry_after();
        self.response_with(body, hint)
    }

    /// [`into_response_with`](Self::into_response_with), with the hint measured once.
    fn response_with<B>(self, body: B, hint: Option<Duration>) -> Response<B> {
        let mut response = Response::new(body);
        *response.status_mut() = self.status();
        if let Some(secs) = hint.map(retry_after_secs) {
            response.headers_mut().insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }

    /// A response with this rejection's status, `Retry-After` where known, and a one-line
    /// text body saying what happened when `B` can carry text (axum's `Body`, `String`,
    /// `Vec<u8>`); an empty body otherwise.
    pub fn into_text_response<B: Default + 'static>(self) -> Response<B> {
        // Measured once: the header and the text say the same.
        let hint = self.retry_after();
        let mut text = self.message(hint, false);
        text.push('\n');
        let body = text_body(text);
        let carries_text = body.is_some();
        let mut response = self.response_with(body.unwrap_or_default(), hint);
        if carries_text {
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
        }
        response
    }

    /// What happened, in one line, with the number its `hint` header carries: for HTTP
    /// `Retry-After`'s seconds (`locked; retry in about 3 s`), or the milliseconds of a hint
    /// under a second (`retry in about 250 ms`); for gRPC `grpc-retry-pushback-ms`'s
    /// milliseconds (`retry in about 2501 ms`).
    pub(crate) fn message(&self, hint: Option<Duration>, grpc: bool) -> String {
        let mut text = self.to_string();
        match hint {
            Some(hint) if grpc || hint < Duration::from_secs(1) => {
                text.push_str(&format!("; retry in about {} ms", pushback_ms(hint)));
            }
            Some(hint) => {
                text.push_str(&format!("; retry in about {} s", retry_after_secs(hint)));
            }
            None => {}
        }
        text
    }

    /// Logs the rejection on target `tower_lock::rejection` (never more than the reason: no
    /// key, no request data) and counts it; under gRPC (`grpc`) it names the gRPC code the
    /// call is answered with, else the HTTP status. A client's mistake or a broken setup is a
    /// warning or an error an operator sees; a lock that stayed busy is a normal outcome
    /// (debug, and the `reason="locked"` counter).
    pub(crate) fn trace(&self, grpc: bool) {
        self.count();
        let status = self.answer(grpc);
        let retry_after_ms =
            self.retry_after().map(|after| u64::try_from(after.as_millis()).unwrap_or(u64::MAX));
        match self {
            Self::Misconfigured => {
                tracing::error!(target: "tower_lock::rejection", %status, "lock layer misconfigured: its lease is too short, or its backend refuses the lock kind");
            }
            // The backend logged the incident once when it began: one line per request would
            // bury it.
            Self::Unavailable(error) if error.is_reported() => {
                tracing::debug!(target: "tower_lock::rejection", error = %format_args!("{error:#}"), %status, retry_after_ms, "lock backend unavailable");
            }
            Self::Unavailable(error) => {
                tracing::warn!(target: "tower_lock::rejection", error = %format_args!("{error:#}"), %status, retry_after_ms, "lock backend unavailable");
            }
            Self::MissingKey | Self::InvalidKey(_) | Self::Lost | Self::Conflict => {
                tracing::warn!(target: "tower_lock::rejection", rejection = %self, %status, "request rejected");
            }
            Self::Locked { .. } | Self::TooManyWaiters | Self::ShutDown => {
                tracing::debug!(target: "tower_lock::rejection", rejection = %self, %status, retry_after_ms, "request rejected");
            }
        }
    }

    /// The answer as logs name it: the gRPC code under gRPC, else the HTTP status.
    pub(crate) fn answer(&self, grpc: bool) -> Answer {
        #[cfg(feature = "grpc")]
        if grpc {
            return Answer::Grpc(self.grpc_code());
        }
        let _ = grpc;
        Answer::Http(self.status())
    }
}

/// A rejection's answer, as logs and spans name it: `423 Locked`, or `UNAVAILABLE`.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Answer {
    Http(StatusCode),
    #[cfg(feature = "grpc")]
    Grpc(crate::grpc::Code),
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Http(status) => status.fmt(f),
            #[cfg(feature = "grpc")]
            Self::Grpc(code) => code.fmt(f),
        }
    }
}

/// `Retry-After` in whole seconds, rounded up, at least one.
fn retry_after_secs(after: Duration) -> u64 {
    (after.as_secs() + u64::from(after.subsec_nanos() > 0)).max(1)
}

/// Milliseconds, rounded up: a client that waits exactly this long finds what was promised.
pub(crate) fn pushback_ms(pushback: Duration) -> u64 {
    let ms = pushback.as_millis() + u128::from(!pushback.subsec_nanos().is_multiple_of(1_000_000));
    u64::try_from(ms).unwrap_or(u64::MAX)
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
            LockError::WaitTimeout { .. } => Self::Locked { retry_after: error.retry_after() },
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
/// type carries text, and a gRPC call in gRPC form (feature `grpc`).
pub trait OnRejected<B>: Clone + Send + Sync + 'static {
    /// The response for `rejection`.
    fn on_rejected(&self, rejection: LockRejection) -> Response<B>;

    /// The response for `rejection` of a gRPC call (one whose `content-type` starts with
    /// `application/grpc`). Defaults to [`on_rejected`](Self::on_rejected): a hook that builds
    /// its own answers builds them for gRPC calls too. [`DefaultRejection`] answers a gRPC
    /// status here (with feature `grpc`).
    fn on_rejected_grpc(&self, rejection: LockRejection) -> Response<B> {
        self.on_rejected(rejection)
    }
}

/// Logs and counts `rejection`, then builds its answer with `on_rejected`: in gRPC form for a
/// gRPC call (`grpc`).
pub(crate) fn answer<B, R: OnRejected<B>>(
    on_rejected: &R,
    rejection: LockRejection,
    grpc: bool,
) -> Response<B> {
    rejection.trace(grpc);
    if grpc { on_rejected.on_rejected_grpc(rejection) } else { on_rejected.on_rejected(rejection) }
}

/// Whether a request is a gRPC call: its `content-type` starts with `application/grpc`
/// (`application/grpc`, `application/grpc+proto`, `application/grpc-web`...).
pub(crate) fn is_grpc(headers: &http::HeaderMap) -> bool {
    headers.get(CONTENT_TYPE).is_some_and(|value| value.as_bytes().starts_with(b"application/grpc"))
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
/// ([`LockRejection::into_text_response`]): `locked; retry in about 3 s`. With feature `grpc`,
/// a gRPC call gets a gRPC status instead (`LockRejection::into_grpc_response`: trailers-only,
/// `grpc-status`, `grpc-message`, `grpc-retry-pushback-ms`), as `grpc::GrpcRejection` answers.
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultRejection;

impl<B: Default + 'static> OnRejected<B> for DefaultRejection {
    fn on_rejected(&self, rejection: LockRejection) -> Response<B> {
        rejection.into_text_response()
    }

    fn on_rejected_grpc(&self, rejection: LockRejection) -> Response<B> {
        #[cfg(feature = "grpc")]
        return rejection.into_grpc_response();
        #[cfg(not(feature = "grpc"))]
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
        assert_eq!(LockRejection::from(LockError::Lost).status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(LockRejection::from(LockError::UpgradeRefused).status(), StatusCode::CONFLICT);
    }

    /// An error and the rejection it becomes give the same hint; every 503 has one.
    #[test]
    fn one_hint_per_outcome() {
        let backend = |kind| LockError::Backend(BackendError::from_kind(kind));
        let cases = [
            LockError::WaitTimeout {
                retry_after: Some(Duration::from_millis(1500)),
                waited: Duration::from_millis(200),
            },
            LockError::WaitTimeout { retry_after: None, waited: Duration::from_secs(2) },
            LockError::TooManyWaiters,
            LockError::Lost,
            LockError::NotHeld,
            LockError::ShutDown,
            LockError::UpgradeRefused,
            LockError::InvalidKey(KeyError::Empty),
            backend(BackendErrorKind::Timeout),
            backend(BackendErrorKind::Unavailable),
            backend(BackendErrorKind::NoPermission),
            backend(BackendErrorKind::Unsupported { feature: "x" }),
        ];
        for error in cases {
            let hint = error.retry_after();
            let rejection = LockRejection::from(error);
            assert_eq!(rejection.retry_after(), hint, "{rejection:?}");
            if rejection.status() == StatusCode::SERVICE_UNAVAILABLE
                || rejection.status() == StatusCode::LOCKED
            {
                assert!(hint.is_some_and(|hint| !hint.is_zero()), "{rejection:?}");
            }
        }
    }

    /// The text says the header's number: seconds, or milliseconds under a second.
    #[test]
    fn messages_say_the_headers_number() {
        let locked = |ms| LockRejection::Locked { retry_after: Some(Duration::from_millis(ms)) };
        let text: Response<String> = DefaultRejection.on_rejected(locked(50));
        assert_eq!(text.body(), "locked; retry in about 50 ms\n");
        assert_eq!(text.headers()[RETRY_AFTER], "1");
        let text: Response<String> = DefaultRejection.on_rejected(locked(2100));
        assert_eq!(text.body(), "locked; retry in about 3 s\n");
        assert_eq!(text.headers()[RETRY_AFTER], "3");
        let timeout = LockRejection::from(LockError::Backend(BackendError::from_kind(
            BackendErrorKind::Timeout,
        )));
        let text: Response<String> = DefaultRejection.on_rejected(timeout);
        assert_eq!(text.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(text.headers()[RETRY_AFTER], "1");
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
                rejection.trace(false);
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
        let locked = || LockRejection::Locked { retry_after: Some(Duration::from_millis(2500)) };
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
