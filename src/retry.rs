//! The client side of a busy answer: a `tower::retry` policy that waits as long as the server
//! said (feature `retry`).
//!
//! A lock layer answers a busy lock with `423 Locked` and `Retry-After`, an outage with `503`
//! and `Retry-After`, and a gRPC call with `UNAVAILABLE` and `grpc-retry-pushback-ms`.
//! [`RetryAfterPolicy`] sends the request again after that long: no sooner (which would find
//! the lock still busy) and, past a cap, not at all (the answer goes back to the caller). A
//! retry budget shared by every clone of the policy keeps retries a small share of the traffic,
//! so that a service in trouble is not buried under them.
//!
//! It retries only answers that say nothing was done: `423`, `429` and `503` with a
//! `Retry-After` in seconds, and gRPC `UNAVAILABLE` or `RESOURCE_EXHAUSTED` with a pushback
//! (an answer without a hint is not retried, nor is a lock lost mid-call, `ABORTED`, where the
//! handler may have done part of its work). A retried request runs again: keep it to
//! operations that may, or send an idempotency key (see the `idempotency` guide).
//!
//! With a hyper client (any service taking `http::Request<B>` with a `Clone` body, such as
//! `Full<Bytes>` or `String`):
//!
//! ```
//! use std::time::Duration;
//!
//! use tower::{ServiceBuilder, retry::RetryLayer};
//! use tower_lock::retry::RetryAfterPolicy;
//!
//! let policy = RetryAfterPolicy::new()
//!     .max_delay(Duration::from_secs(5))
//!     .max_retries(3);
//! let layer = ServiceBuilder::new().layer(RetryLayer::new(policy));
//! // let client = layer.service(hyper_util::client::legacy::Client::builder(..).build_http());
//! # let _ = layer;
//! ```
//!
//! With tonic, whose request bodies are streams that cannot be cloned,
//! [`BufferRequestLayer`] first collects each request's body (a unary call's message) into a
//! [`Buffered`] body that can be sent again; the `grpc` guide shows the whole stack around a
//! `Channel`. (tonic has no retry policy of its own.)

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http::{Request, Response, StatusCode, header::RETRY_AFTER};
use http_body::{Body, Frame, SizeHint};
use tower::retry::{
    Policy,
    budget::{Budget, TpsBudget},
};
use tower_layer::Layer;
use tower_service::Service;

use crate::error::BoxError;

/// A `tower::retry::Policy` that sends a request again after the `Retry-After` (or
/// `grpc-retry-pushback-ms`) its answer named, within a cap, a number of retries and a retry
/// budget. See the [module docs](self).
#[derive(Clone, Debug)]
pub struct RetryAfterPolicy {
    max_delay: Duration,
    max_retries: u32,
    /// Retries made for this request so far (each request works on a clone of the policy).
    retries: u32,
    budget: Arc<TpsBudget>,
}

impl Default for RetryAfterPolicy {
    fn default() -> Self {
        Self {
            max_delay: Duration::from_secs(10),
            max_retries: 3,
            retries: 0,
            budget: Arc::new(TpsBudget::default()),
        }
    }
}

impl RetryAfterPolicy {
    /// A policy with the defaults: hints up to 10 s are waited for, 3 retries per request,
    /// and retries at most 20 % of requests over 10 s (plus 10 a second), tower's
    /// `TpsBudget::default()`.
    pub fn new() -> Self {
        Self::default()
    }

    /// The longest hint waited for: an answer that asks for a longer wait goes back to the
    /// caller. Defaults to 10 seconds.
    #[must_use]
    pub fn max_delay(mut self, max_delay: Duration) -> Self {
        self.max_delay = max_delay;
        self
    }

    /// How many times one request is sent again at most. Defaults to 3.
    #[must_use]
    pub fn max_retries(mut self, max_retries: u32) -> Self {
        self.max_retries = max_retries;
        self
    }

    /// The retry budget, shared by every clone of the policy. Defaults to
    /// `TpsBudget::default()`.
    #[must_use]
    pub fn budget(mut self, budget: TpsBudget) -> Self {
        self.budget = Arc::new(budget);
        self
    }

    /// How long to wait before sending again, when the answer asks for a retry this policy
    /// honours.
    fn delay<B>(&self, response: &Response<B>) -> Option<Duration> {
        let headers = response.headers();
        if let Some(grpc_status) = headers.get("grpc-status") {
            // A trailers-only gRPC answer: UNAVAILABLE (14) or RESOURCE_EXHAUSTED (8), with a
            // pushback (gRPC: a malformed or negative one means "do not retry").
            if !matches!(grpc_status.as_bytes(), b"14" | b"8") {
                return None;
            }
            let ms: u64 = headers.get("grpc-retry-pushback-ms")?.to_str().ok()?.parse().ok()?;
            return Some(Duration::from_millis(ms));
        }
        let status = response.status();
        if !matches!(
            status,
            StatusCode::LOCKED | StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
        ) {
            return None;
        }
        // Delta-seconds only: a date would need the client's clock to agree with the server's.
        let secs: u64 = headers.get(RETRY_AFTER)?.to_str().ok()?.trim().parse().ok()?;
        Some(Duration::from_secs(secs))
    }
}

impl<B: Clone, ResBody, E> Policy<Request<B>, Response<ResBody>, E> for RetryAfterPolicy {
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        _request: &mut Request<B>,
        result: &mut Result<Response<ResBody>, E>,
    ) -> Option<Self::Future> {
        let delay = self.delay(result.as_ref().ok()?)?;
        if delay > self.max_delay || self.retries >= self.max_retries {
            return None;
        }
        if !self.budget.withdraw() {
            tracing::debug!(
                delay_ms = delay.as_millis() as u64,
                "retry budget spent: the busy answer goes back to the caller"
            );
            return None;
        }
        self.retries += 1;
        Some(tokio::time::sleep(delay))
    }

    fn clone_request(&mut self, request: &Request<B>) -> Option<Request<B>> {
        // Called once before the first attempt (then the budget earns the request's share) and
        // once before each retry.
        if self.retries == 0 {
            self.budget.deposit();
        }
        let mut clone = Request::new(request.body().clone());
        *clone.method_mut() = request.method().clone();
        *clone.uri_mut() = request.uri().clone();
        *clone.version_mut() = request.version();
        *clone.headers_mut() = request.headers().clone();
        Some(clone)
    }
}

/// A request body kept in memory, so that it can be sent again: what [`BufferRequestLayer`]
/// makes of a request's body. Its trailers, if any, are dropped (gRPC requests have none).
#[derive(Clone, Debug, Default)]
pub struct Buffered {
    data: Option<Bytes>,
}

impl Buffered {
    /// A body of `data`.
    pub fn new(data: impl Into<Bytes>) -> Self {
        let data = data.into();
        Self { data: (!data.is_empty()).then_some(data) }
    }
}

impl Body for Buffered {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.data.take().map(|data| Ok(Frame::data(data))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |data| data.len() as u64))
    }
}

/// Collects each request's body into a [`Buffered`] body before the services under it see the
/// request, so that a [`RetryAfterPolicy`] under it can send the request again. Bodies are
/// read whole: put it in front of calls with small bodies (unary gRPC calls), not uploads.
#[derive(Clone, Copy, Debug, Default)]
pub struct BufferRequestLayer;

impl BufferRequestLayer {
    /// The layer.
    pub fn new() -> Self {
        Self
    }
}

impl<S> Layer<S> for BufferRequestLayer {
    type Service = BufferRequest<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BufferRequest { inner }
    }
}

/// The service of [`BufferRequestLayer`].
#[derive(Clone, Debug)]
pub struct BufferRequest<S> {
    inner: S,
}

impl<S, B> Service<Request<B>> for BufferRequest<S>
where
    S: Service<Request<Buffered>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The ready service goes with this request; the clone waits for the next poll_ready.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let data = collect(body).await?;
            inner.call(Request::from_parts(parts, Buffered::new(data))).await.map_err(Into::into)
        })
    }
}

/// The data of `body`, whole.
async fn collect<B>(body: B) -> Result<Bytes, BoxError>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    use bytes::{Buf, BufMut};

    let mut body = std::pin::pin!(body);
    let mut data = bytes::BytesMut::new();
    while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        if let Ok(mut chunk) = frame.map_err(Into::into)?.into_data() {
            while chunk.has_remaining() {
                let part = chunk.chunk();
                data.put_slice(part);
                let n = part.len();
                chunk.advance(n);
            }
        }
    }
    Ok(data.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, headers: &[(&str, &str)]) -> Response<()> {
        let mut response = Response::builder().status(status);
        for (name, value) in headers {
            response = response.header(*name, *value);
        }
        response.body(()).unwrap()
    }

    /// The hints honoured: a 423, 429 or 503 with `Retry-After` in seconds, a gRPC
    /// `UNAVAILABLE` or `RESOURCE_EXHAUSTED` with a pushback; nothing else.
    #[test]
    fn delays() {
        let policy = RetryAfterPolicy::new();
        let s = Duration::from_secs;
        assert_eq!(policy.delay(&answer(423, &[("retry-after", "2")])), Some(s(2)));
        assert_eq!(policy.delay(&answer(503, &[("retry-after", "1")])), Some(s(1)));
        assert_eq!(policy.delay(&answer(503, &[])), None);
        assert_eq!(policy.delay(&answer(500, &[("retry-after", "1")])), None);
        let grpc = |status, pushback| {
            answer(200, &[("grpc-status", status), ("grpc-retry-pushback-ms", pushback)])
        };
        assert_eq!(policy.delay(&grpc("14", "250")), Some(Duration::from_millis(250)));
        assert_eq!(policy.delay(&grpc("8", "1000")), Some(s(1)));
        assert_eq!(policy.delay(&grpc("10", "1000")), None, "ABORTED");
        assert_eq!(policy.delay(&grpc("14", "-1")), None);
        assert_eq!(policy.delay(&answer(200, &[("grpc-status", "14")])), None);
        assert_eq!(policy.delay(&answer(200, &[])), None);
    }

    /// Past the cap or the retries allowed, the answer goes back.
    #[tokio::test]
    async fn cap_and_retries() {
        let mut policy = RetryAfterPolicy::new().max_delay(Duration::from_secs(2)).max_retries(1);
        let mut request = Request::new(String::from("body"));
        let _ = Policy::<_, Response<()>, ()>::clone_request(&mut policy, &request);
        let mut long: Result<_, ()> = Ok(answer(423, &[("retry-after", "3")]));
        assert!(policy.retry(&mut request, &mut long).is_none());
        let mut short: Result<_, ()> = Ok(answer(423, &[("retry-after", "1")]));
        assert!(policy.retry(&mut request, &mut short).is_some());
        assert!(policy.retry(&mut request, &mut short).is_none());
    }
}
