//! gRPC: rejections as gRPC statuses, and the status codes chosen for them (feature `grpc`).
//!
//! A gRPC server built on tower (tonic) is a tower service, so [`LockLayer`](crate::LockLayer)
//! runs in front of it as it does in front of an axum router. What changes is how a refusal is
//! told: a gRPC client reads an HTTP 423 with a text body as `UNKNOWN`, with no message and no
//! hint of when to try again. So a call whose `content-type` starts with `application/grpc` is
//! answered in gRPC's own terms by default (and by [`GrpcRejection`], whatever the request): a
//! *trailers-only* response (HTTP 200, `content-type: application/grpc`, the status in the
//! `grpc-status` and `grpc-message` headers, no body), with the `Retry-After` hint as
//! `grpc-retry-pushback-ms`, which a gRPC retry policy acts on.
//!
//! ```
//! use std::time::Duration;
//!
//! use tower_lock::{LockClient, LockLayer, key};
//!
//! // One lock per account, from the `account-id` metadata; gRPC calls refused with a status.
//! let layer = LockLayer::new(LockClient::in_memory())
//!     .key(key::header("account-id").prefixed("account:"))
//!     .wait(Duration::from_secs(2));
//! # let _ = layer;
//! ```
//!
//! A gRPC response is only HTTP headers, so nothing here depends on a gRPC library: the layer
//! works under any tonic version. Feature `tonic` adds what needs tonic's types: `LockError` and
//! [`LockRejection`] into `tonic::Status` (for `?` in a service method that takes its lock from
//! the decoded message), `NamedService` for a layered service, and `MethodLocks`, a lock layer
//! per gRPC method. The [`guide::grpc`] page
//! says how the codes were chosen, how keys are taken from gRPC calls, and what a streaming
//! call holds.
//!
//! [`guide::grpc`]: crate::guide::grpc

#[cfg(feature = "tonic")]
mod methods;
#[cfg(feature = "tonic")]
pub use methods::{MethodLockService, MethodLocks};

use std::{fmt, time::Duration};

use http::{HeaderMap, HeaderValue, Response, header::CONTENT_TYPE};
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};

use crate::{
    LockError,
    middleware::{LockRejection, OnRejected, pushback_ms},
};

/// The header (or trailer) that carries a gRPC status code.
pub const GRPC_STATUS: &str = "grpc-status";
/// The header (or trailer) that carries a gRPC status message, percent-encoded.
pub const GRPC_MESSAGE: &str = "grpc-message";
/// The header (or trailer) that tells a client's retry policy how long to wait before its next
/// attempt, in milliseconds (gRPC's server pushback).
pub const GRPC_RETRY_PUSHBACK_MS: &str = "grpc-retry-pushback-ms";

/// The gRPC status codes a lock outcome maps to (gRPC's numbering).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Code {
    /// `INVALID_ARGUMENT` (3): the call carries no key, or one that is refused.
    InvalidArgument,
    /// `RESOURCE_EXHAUSTED` (8): too many calls already wait for the key in this instance.
    ResourceExhausted,
    /// `FAILED_PRECONDITION` (9): the call holds the read side of a lock it asks to write.
    FailedPrecondition,
    /// `ABORTED` (10): the lock was lost while the call ran.
    Aborted,
    /// `INTERNAL` (13): the layer is configured with settings that cannot work.
    Internal,
    /// `UNAVAILABLE` (14): the lock stayed busy, the lock store is down, or the client shut down.
    Unavailable,
}

impl Code {
    /// The code's number, as `grpc-status` carries it.
    pub fn as_i32(self) -> i32 {
        match self {
            Self::InvalidArgument => 3,
            Self::ResourceExhausted => 8,
            Self::FailedPrecondition => 9,
            Self::Aborted => 10,
            Self::Internal => 13,
            Self::Unavailable => 14,
        }
    }
}

impl From<Code> for i32 {
    fn from(code: Code) -> Self {
        code.as_i32()
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::InvalidArgument => "INVALID_ARGUMENT",
            Self::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Self::FailedPrecondition => "FAILED_PRECONDITION",
            Self::Aborted => "ABORTED",
            Self::Internal => "INTERNAL",
            Self::Unavailable => "UNAVAILABLE",
        })
    }
}

/// What `grpc-message` may carry as it is: printable ASCII but `%` (gRPC's HTTP/2 mapping
/// percent-encodes every other byte).
const MESSAGE_ENCODE: &AsciiSet = &CONTROLS.add(b'%');

impl LockRejection {
    /// The gRPC status code of this rejection.
    ///
    /// | rejection | code | `grpc-retry-pushback-ms` |
    /// |---|---|---|
    /// | [`MissingKey`](Self::MissingKey), [`InvalidKey`](Self::InvalidKey) | `INVALID_ARGUMENT` | |
    /// | [`Locked`](Self::Locked) (wait timed out) | `UNAVAILABLE` | as `Retry-After`, in milliseconds |
    /// | [`TooManyWaiters`](Self::TooManyWaiters) | `RESOURCE_EXHAUSTED` | 1000 |
    /// | [`Unavailable`](Self::Unavailable) (store down, or in its restart quarantine) | `UNAVAILABLE` | when the store is expected back, when known |
    /// | [`ShutDown`](Self::ShutDown) | `UNAVAILABLE` | |
    /// | [`Lost`](Self::Lost) | `ABORTED` | |
    /// | [`Conflict`](Self::Conflict) (a read lock asked for a write lock) | `FAILED_PRECONDITION` | |
    /// | [`Misconfigured`](Self::Misconfigured) | `INTERNAL` | |
    ///
    /// Why these: see "Status codes" in [`guide::grpc`](crate::guide::grpc).
    pub fn grpc_code(&self) -> Code {
        match self {
            Self::MissingKey | Self::InvalidKey(_) => Code::InvalidArgument,
            Self::Locked { .. } | Self::Unavailable(_) | Self::ShutDown => Code::Unavailable,
            Self::TooManyWaiters => Code::ResourceExhausted,
            Self::Lost => Code::Aborted,
            Self::Conflict => Code::FailedPrecondition,
            Self::Misconfigured => Code::Internal,
        }
    }

    /// The gRPC server pushback of this rejection: how long a retry policy should wait before
    /// its next attempt ([`retry_after`](Self::retry_after), to the millisecond).
    pub fn grpc_pushback(&self) -> Option<Duration> {
        self.retry_after()
    }

    /// The message of this rejection's gRPC status, with `pushback` as
    /// `grpc-retry-pushback-ms` says it: `locked; retry in about 2501 ms`.
    pub(crate) fn grpc_message(&self, pushback: Option<Duration>) -> String {
        self.message(pushback, true)
    }

    /// The `grpc-status`, `grpc-message` and, where known, `grpc-retry-pushback-ms` of this
    /// rejection, as headers (a trailers-only response's) or trailers (a stream cut short).
    /// The message names the same number of milliseconds as the pushback.
    pub fn grpc_headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::with_capacity(3);
        headers.insert(GRPC_STATUS, HeaderValue::from(self.grpc_code().as_i32()));
        // Measured once: the message and the header say the same.
        let pushback = self.grpc_pushback();
        let message = self.grpc_message(pushback);
        let encoded = utf8_percent_encode(&message, MESSAGE_ENCODE).to_string();
        if let Ok(value) = HeaderValue::try_from(encoded) {
            headers.insert(GRPC_MESSAGE, value);
        }
        if let Some(pushback) = pushback {
            headers.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from(pushback_ms(pushback)));
        }
        headers
    }

    /// A trailers-only gRPC response for this rejection: HTTP 200, `content-type:
    /// application/grpc`, the [`grpc_headers`](Self::grpc_headers), and an empty body.
    pub fn into_grpc_response<B: Default>(self) -> Response<B> {
        let mut response = Response::new(B::default());
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.extend(self.grpc_headers());
        response
    }
}

impl LockError {
    /// The gRPC status code a layer answers this outcome with (that of the [`LockRejection`]
    /// it becomes): for a service method that takes its lock itself and answers as a layer
    /// would.
    pub fn grpc_code(&self) -> Code {
        match self {
            // The one mapping that looks at the error's parts: a backend refusing the lock kind
            // is a misconfiguration, other backend errors an outage.
            Self::Backend(error) if error.is_unsupported() => Code::Internal,
            Self::Backend(_) => Code::Unavailable,
            Self::WaitTimeout { .. } | Self::ShutDown => Code::Unavailable,
            Self::InvalidKey(_) => Code::InvalidArgument,
            Self::TooManyWaiters => Code::ResourceExhausted,
            Self::UpgradeRefused => Code::FailedPrecondition,
            Self::InvalidLease(_)
            | Self::InvalidPermits
            | Self::ForeignHolder
            | Self::HeldThroughOtherClient => Code::Internal,
            Self::Lost | Self::NotHeld => Code::Aborted,
        }
    }
}

/// Answers rejections as gRPC statuses: a trailers-only response
/// ([`LockRejection::into_grpc_response`]) whatever the body type, as long as it has a
/// `Default` (tonic's body has). For a layer in front of a gRPC service; HTTP routes keep
/// [`DefaultRejection`](crate::middleware::DefaultRejection).
#[derive(Clone, Copy, Debug, Default)]
pub struct GrpcRejection;

impl<B: Default> OnRejected<B> for GrpcRejection {
    fn on_rejected(&self, rejection: LockRejection) -> Response<B> {
        rejection.into_grpc_response()
    }
}

#[cfg(feature = "tonic")]
mod tonic_status {
    use super::{LockError, LockRejection, pushback_ms};
    use crate::{Backend, LockService};

    /// A layered service keeps the name it is routed by, so
    /// `Server::builder().add_service(layer.layer(BankServer::new(bank)))` serves it.
    impl<S, B, K, R, H> tonic::server::NamedService for LockService<S, B, K, R, H>
    where
        S: tonic::server::NamedService,
        B: Backend,
    {
        const NAME: &'static str = S::NAME;
    }

    fn status(
        code: super::Code,
        message: String,
        pushback: Option<std::time::Duration>,
    ) -> tonic::Status {
        let mut metadata = tonic::metadata::MetadataMap::new();
        if let Some(pushback) = pushback {
            metadata.insert(super::GRPC_RETRY_PUSHBACK_MS, pushback_ms(pushback).into());
        }
        tonic::Status::with_metadata(tonic::Code::from_i32(code.as_i32()), message, metadata)
    }

    /// The status a [`GrpcRejection`](super::GrpcRejection) answers: the same code, message and
    /// pushback (in the status's metadata, which tonic sends with the status).
    impl From<LockRejection> for tonic::Status {
        fn from(rejection: LockRejection) -> Self {
            let pushback = rejection.grpc_pushback();
            status(rejection.grpc_code(), rejection.grpc_message(pushback), pushback)
        }
    }

    /// The status a layer answers for this outcome (see [`LockRejection`]'s): `?` on an
    /// acquire in a tonic service method answers as a layer would, with the same pushback
    /// ([`LockError::retry_after`]: from the client's hold times for a busy lock). The
    /// rejection is logged and counted as a layer's is.
    impl From<LockError> for tonic::Status {
        fn from(error: LockError) -> Self {
            let rejection = LockRejection::from(error);
            rejection.trace(true);
            rejection.into()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::StatusCode;

    use super::*;
    use crate::{
        error::{BackendError, BackendErrorKind},
        lock_key::KeyError,
    };

    /// Every rejection has its documented code; a layer's rejection and the engine outcome it
    /// comes from agree.
    #[test]
    fn codes() {
        let cases = [
            (LockError::InvalidKey(KeyError::Empty), Code::InvalidArgument),
            (
                LockError::WaitTimeout { retry_after: None, waited: Duration::from_millis(5) },
                Code::Unavailable,
            ),
            (LockError::TooManyWaiters, Code::ResourceExhausted),
            (
                LockError::Backend(BackendError::from_kind(BackendErrorKind::Unavailable)),
                Code::Unavailable,
            ),
            (
                LockError::Backend(BackendError::from_kind(BackendErrorKind::Unsupported {
                    feature: "fencing",
                })),
                Code::Internal,
            ),
            (LockError::ShutDown, Code::Unavailable),
            (LockError::Lost, Code::Aborted),
            (LockError::NotHeld, Code::Aborted),
            (LockError::UpgradeRefused, Code::FailedPrecondition),
            (LockError::InvalidLease(Duration::ZERO), Code::Internal),
            (LockError::InvalidPermits, Code::Internal),
        ];
        for (error, code) in cases {
            assert_eq!(error.grpc_code(), code, "{error:?}");
            assert_eq!(LockRejection::from(error).grpc_code(), code);
        }
        assert_eq!(LockRejection::MissingKey.grpc_code(), Code::InvalidArgument);
        assert_eq!(LockRejection::Conflict.grpc_code(), Code::FailedPrecondition);
    }

    /// A trailers-only response: 200, `application/grpc`, the status, the message
    /// percent-encoded, the pushback in milliseconds rounded up, an empty body.
    #[test]
    fn trailers_only_response() {
        let locked = LockRejection::Locked { retry_after: Some(Duration::from_micros(2_500_100)) };
        let response: Response<String> = GrpcRejection.on_rejected(locked);
        assert_eq!(response.status(), StatusCode::OK);
        let headers = response.headers();
        assert_eq!(headers[CONTENT_TYPE], "application/grpc");
        assert_eq!(headers[GRPC_STATUS], "14");
        assert_eq!(headers[GRPC_MESSAGE], "locked; retry in about 2501 ms");
        assert_eq!(headers[GRPC_RETRY_PUSHBACK_MS], "2501");
        assert!(!headers.contains_key(http::header::RETRY_AFTER));
        assert_eq!(response.body(), "");

        let missing: Response<()> = GrpcRejection.on_rejected(LockRejection::MissingKey);
        assert_eq!(missing.headers()[GRPC_STATUS], "3");
        assert_eq!(missing.headers()[GRPC_MESSAGE], "request has no lock key");
        assert!(!missing.headers().contains_key(GRPC_RETRY_PUSHBACK_MS));
    }

    /// `%` and bytes outside printable ASCII are percent-encoded in `grpc-message`.
    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(
            utf8_percent_encode("100% busy\u{e9}\n", MESSAGE_ENCODE).to_string(),
            "100%25 busy%C3%A9%0A"
        );
    }
}
