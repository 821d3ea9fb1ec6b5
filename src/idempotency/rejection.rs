//! What the layer answers itself: the refusals, in HTTP or in gRPC form.

use std::{fmt, time::Duration};

use bytes::Bytes;
use http::{
    HeaderValue, Response, StatusCode,
    header::{CONTENT_TYPE, RETRY_AFTER},
};
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};

use super::ResponseBody;
use crate::error::{BackendError, BackendErrorKind};

/// Why the layer answered a request itself, or cut it short.
#[derive(Debug)]
pub(crate) enum Rejection {
    /// The key is required and the request has none.
    MissingKey,
    /// The key is not one the layer takes.
    InvalidKey(InvalidKey),
    /// Nothing to scope the key by (no `Authorization` header, or the scope closure found
    /// nothing), and the layer is not unscoped.
    NoScope,
    /// The request body is over the limit to fingerprint it.
    TooLarge { limit: usize },
    /// The request body failed while it was read (the client went away mid-body, say).
    BodyUnreadable,
    /// A request with the same key runs (here or in another instance).
    InFlight { retry_after: Duration },
    /// The key was used with another request.
    Mismatch,
    /// The lock or answer store failed, or is in its restart quarantine.
    Unavailable(BackendError),
    /// The key's lock was lost while the request ran: its answer is not kept.
    Lost,
    /// The backend refused what the layer asked (a lease it cannot hold), or gave no fencing
    /// token.
    Misconfigured,
}

/// Why a key was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InvalidKey {
    Empty,
    TooLong {
        max: usize,
    },
    /// A byte outside visible ASCII and space.
    Bytes,
    /// The header appears more than once.
    Repeated,
}

impl Rejection {
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Self::MissingKey | Self::InvalidKey(_) | Self::NoScope | Self::BodyUnreadable => {
                StatusCode::BAD_REQUEST
            }
            Self::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::InFlight { .. } => StatusCode::CONFLICT,
            Self::Mismatch => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Unavailable(_) | Self::Lost => StatusCode::SERVICE_UNAVAILABLE,
            Self::Misconfigured => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The gRPC status code (gRPC's numbering) of the same answer.
    pub(crate) fn grpc_code(&self) -> u16 {
        match self {
            // INVALID_ARGUMENT: a request a client must change before it is sent again.
            Self::MissingKey | Self::InvalidKey(_) | Self::NoScope | Self::BodyUnreadable => 3,
            // RESOURCE_EXHAUSTED, as for a message over a server's size limit.
            Self::TooLarge { .. } => 8,
            // ABORTED: a concurrency conflict, to retry (after the pushback).
            Self::InFlight { .. } | Self::Lost => 10,
            // FAILED_PRECONDITION: the key is taken by another request, a state of the
            // server's; the same request with a fresh key would succeed.
            Self::Mismatch => 9,
            Self::Unavailable(_) => 14,
            Self::Misconfigured => 13,
        }
    }

    /// When the client may try again.
    pub(crate) fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::InFlight { retry_after } => Some(*retry_after),
            Self::Unavailable(error) => error.retry_after(),
            _ => None,
        }
    }

    /// What happened, in one line naming the key's `header`.
    fn message(&self, header: &str) -> String {
        let mut text = match self {
            Self::MissingKey => format!("this request needs an {header} header"),
            Self::InvalidKey(InvalidKey::Empty) => format!("the {header} header is empty"),
            Self::InvalidKey(InvalidKey::TooLong { max }) => {
                format!("the {header} header is longer than {max} bytes")
            }
            Self::InvalidKey(InvalidKey::Bytes) => {
                format!("the {header} header holds bytes other than visible ASCII and spaces")
            }
            Self::InvalidKey(InvalidKey::Repeated) => {
                format!("the {header} header appears more than once")
            }
            Self::NoScope => format!(
                "the request carries nothing to scope its {header} by (such as an Authorization header)"
            ),
            Self::TooLarge { limit } => {
                format!("the request body is over the {limit} bytes an {header} request may carry")
            }
            Self::BodyUnreadable => "the request body could not be read".to_owned(),
            Self::InFlight { .. } => {
                format!("a request with this {header} is in progress")
            }
            Self::Mismatch => {
                format!("this {header} was used with another request")
            }
            Self::Unavailable(error) if *error.kind() == BackendErrorKind::Quarantined => {
                "the lock store restarted recently and grants no lock yet".to_owned()
            }
            Self::Unavailable(_) => format!("the {header} store is unavailable"),
            Self::Lost => format!(
                "the lock on this {header} was lost while the request ran; its answer was not kept"
            ),
            Self::Misconfigured => "idempotency layer misconfigured".to_owned(),
        };
        if let Some(secs) = self.retry_after().map(whole_secs) {
            text.push_str(&format!("; retry in about {secs} s"));
        }
        text
    }

    /// Logs the rejection on target `tower_lock::rejection`, never with request data: a
    /// client's mistake as a warning, a request that is in progress as debug (retries are
    /// what the layer is for), a broken store or setup for operators.
    pub(crate) fn trace(&self) {
        let status = self.status();
        match self {
            Self::InFlight { .. } => {
                tracing::debug!(target: "tower_lock::rejection", %status, "idempotent request in progress");
            }
            Self::Unavailable(error) if error.is_reported() => {
                tracing::debug!(target: "tower_lock::rejection", error = %format_args!("{error:#}"), %status, "idempotency store unavailable");
            }
            Self::Unavailable(error) => {
                tracing::warn!(target: "tower_lock::rejection", error = %format_args!("{error:#}"), %status, "idempotency store unavailable");
            }
            Self::Misconfigured => {
                tracing::error!(target: "tower_lock::rejection", %status, "idempotency layer misconfigured: its backend refused the lease or gave no fencing token");
            }
            _ => {
                tracing::warn!(target: "tower_lock::rejection", rejection = ?self, %status, "idempotent request rejected");
            }
        }
    }

    /// The response: in gRPC form (trailers-only) when `grpc`, else the status, `Retry-After`
    /// where known and the one-line text.
    pub(crate) fn into_response<B>(self, header: &str, grpc: bool) -> Response<ResponseBody<B>>
    where
        B: http_body::Body,
    {
        self.trace();
        let message = self.message(header);
        if grpc {
            let mut response = Response::new(ResponseBody::full(Bytes::new(), None));
            let headers = response.headers_mut();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
            headers.insert("grpc-status", HeaderValue::from(self.grpc_code()));
            let encoded = utf8_percent_encode(&message, MESSAGE_ENCODE).to_string();
            if let Ok(value) = HeaderValue::try_from(encoded) {
                headers.insert("grpc-message", value);
            }
            if let Some(after) = self.retry_after() {
                let ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX).max(1);
                headers.insert("grpc-retry-pushback-ms", HeaderValue::from(ms));
            }
            return response;
        }
        let mut text = message;
        text.push('\n');
        let mut response = Response::new(ResponseBody::full(Bytes::from(text), None));
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
        if let Some(after) = self.retry_after() {
            headers.insert(RETRY_AFTER, HeaderValue::from(whole_secs(after)));
        }
        response
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message("Idempotency-Key"))
    }
}

/// What `grpc-message` may carry as it is: printable ASCII but `%`.
const MESSAGE_ENCODE: &AsciiSet = &CONTROLS.add(b'%');

/// Seconds, rounded up, at least one.
fn whole_secs(after: Duration) -> u64 {
    (after.as_secs() + u64::from(after.subsec_nanos() > 0)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    type Body = ResponseBody<String>;

    /// Each refusal has its status, and a 409 its `Retry-After` rounded up.
    #[test]
    fn http_form() {
        let response: Response<Body> =
            Rejection::InFlight { retry_after: Duration::from_millis(1200) }
                .into_response("Idempotency-Key", false);
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(response.headers()[RETRY_AFTER], "2");
        let missing: Response<Body> = Rejection::MissingKey.into_response("Idempotency-Key", false);
        assert_eq!(missing.status(), StatusCode::BAD_REQUEST);
        assert_eq!(Rejection::Mismatch.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(Rejection::TooLarge { limit: 1 }.status(), StatusCode::PAYLOAD_TOO_LARGE);
    }

    /// The gRPC form: 200, trailers-only, the code, the message and the pushback.
    #[test]
    fn grpc_form() {
        let response: Response<Body> =
            Rejection::InFlight { retry_after: Duration::from_millis(1500) }
                .into_response("idempotency-key", true);
        assert_eq!(response.status(), StatusCode::OK);
        let headers = response.headers();
        assert_eq!(headers[CONTENT_TYPE], "application/grpc");
        assert_eq!(headers["grpc-status"], "10");
        assert_eq!(headers["grpc-retry-pushback-ms"], "1500");
        assert_eq!(
            headers["grpc-message"],
            "a request with this idempotency-key is in progress; retry in about 2 s"
        );
        assert_eq!(Rejection::Mismatch.grpc_code(), 9);
        assert_eq!(Rejection::MissingKey.grpc_code(), 3);
    }
}
