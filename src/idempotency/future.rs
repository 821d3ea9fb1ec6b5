//! [`ResponseFuture`]: look for a kept answer, take the key's lock, look again, run the
//! handler, keep its answer, release.

use std::{
    fmt,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
};

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, request, response};
use http_body::{Body, Frame};
use pin_project::pin_project;
use tower_service::Service;

use super::{
    IdempotencyContext, Put, Record, RequestBody, ResponseBody,
    answer::{Answer, Digest, is_kept},
    body::into_bytes,
    layer::Shared,
    locks::{Acquire, Guard},
    rejection::Rejection,
    store::StoreFuture,
};
use crate::{
    LockError, LockKey,
    clock::BootInstant,
    error::{BackendError, BackendErrorKind},
    guard::{FinishOnDrop, Lost},
};

/// The header a replayed answer carries (Stripe's).
const REPLAYED: &str = "idempotent-replayed";

/// The response future of [`IdempotencyService`](super::IdempotencyService).
///
/// Dropping it at any point (the client went away, a timeout above) keeps nothing and releases
/// the key's lock in the background: a retry finds the key free. It is `Send` when the inner
/// service, its future and the bodies are.
#[pin_project]
pub struct ResponseFuture<S, ReqBody, ResBody>
where
    S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>>,
    ResBody: Body,
{
    #[pin]
    state: State<S, ReqBody, ResBody>,
    /// What a request with a key carries from one step to the next; `None` for the others.
    keyed: Option<Keyed<S, ReqBody>>,
}

/// A request with a key, between the steps of its future.
struct Keyed<S, ReqBody> {
    shared: Arc<Shared>,
    inner: Option<S>,
    /// The request's head while its body is read.
    parts: Option<request::Parts>,
    /// The request, once its body is read (or left as it is).
    request: Option<Request<RequestBody<ReqBody>>>,
    key: Arc<str>,
    lock_key: LockKey,
    grpc: bool,
    fingerprint: Digest,
}

type Answered<ResBody, E> = Result<Response<ResponseBody<ResBody>>, E>;

#[pin_project(project = StateProj)]
enum State<S, ReqBody, ResBody>
where
    S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>>,
    ResBody: Body,
{
    /// Reading the request body, to fingerprint it.
    Reading {
        #[pin]
        body: ReqBody,
        data: BytesMut,
        trailers: Option<HeaderMap>,
    },
    /// The first look for a kept answer, before any lock.
    Looking { lookup: StoreFuture<Option<Record>> },
    /// Taking the key's lock.
    Acquiring { acquire: Acquire },
    /// Looking again with the lock held: another instance may have answered between the first
    /// look and the grant.
    Rechecking { lookup: StoreFuture<Option<Record>>, guard: Option<Box<dyn Guard>> },
    /// The handler runs, the lock held.
    Running {
        #[pin]
        future: S::Future,
        guard: Option<Box<dyn Guard>>,
        lost: Lost,
        started: BootInstant,
    },
    /// Reading the response body as far as it is ready: a body that is all there is kept, one
    /// that makes the layer wait (it streams) or outgrows the limit is passed on.
    Collecting {
        /// Boxed: it is polled here and may move into the response.
        body: Option<Pin<Box<ResBody>>>,
        parts: Option<response::Parts>,
        frames: Vec<Frame<Bytes>>,
        size: usize,
        guard: Option<Box<dyn Guard>>,
    },
    /// Keeping the answer, fenced by the lock's token.
    Storing {
        put: StoreFuture<Put>,
        guard: Option<Box<dyn Guard>>,
        response: Option<Response<ResponseBody<ResBody>>>,
    },
    /// Releasing the lock of an answer not kept, so that a retry finds the key free.
    Releasing { release: FinishOnDrop, result: Option<Answered<ResBody, S::Error>> },
    /// A request the layer leaves alone.
    Passed {
        #[pin]
        future: S::Future,
    },
    /// Answered without the handler (a refusal, a replay), or after it.
    Ready { result: Option<Answered<ResBody, S::Error>> },
}

impl<S, ReqBody, ResBody> ResponseFuture<S, ReqBody, ResBody>
where
    S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>>,
    ReqBody: Body,
    ResBody: Body,
{
    /// A request the layer leaves alone: it runs as it is.
    pub(crate) fn passed(mut inner: S, request: Request<ReqBody>) -> Self {
        let future = inner.call(request.map(RequestBody::as_is));
        Self { state: State::Passed { future }, keyed: None }
    }

    /// A request answered at once.
    pub(crate) fn rejected(response: Response<ResponseBody<ResBody>>) -> Self {
        Self { state: State::Ready { result: Some(Ok(response)) }, keyed: None }
    }

    /// A request with a valid, scoped key: its body read if the fingerprint covers it, then the
    /// first look for its answer.
    pub(crate) fn keyed(
        inner: S,
        parts: request::Parts,
        body: ReqBody,
        key: Arc<str>,
        lock_key: LockKey,
        grpc: bool,
        shared: Arc<Shared>,
    ) -> Self {
        let mut keyed = Keyed {
            inner: Some(inner),
            parts: None,
            request: None,
            key,
            lock_key,
            grpc,
            fingerprint: [0; 32],
            shared,
        };
        let state = if keyed.shared.config.fingerprint.covers_body() {
            keyed.parts = Some(parts);
            State::Reading { body, data: BytesMut::new(), trailers: None }
        } else {
            keyed.fingerprint = keyed.shared.config.fingerprint.of(&parts, &[]);
            keyed.request = Some(Request::from_parts(parts, RequestBody::as_is(body)));
            State::Looking { lookup: keyed.lookup() }
        };
        Self { state, keyed: Some(keyed) }
    }
}

impl<S, ReqBody> Keyed<S, ReqBody> {
    fn lookup(&self) -> StoreFuture<Option<Record>> {
        self.shared.store.clone().get(self.lock_key.clone())
    }

    /// The layer's answer instead of the handler's.
    fn reject<B: Body, E>(&self, rejection: Rejection) -> Option<Answered<B, E>> {
        Some(Ok(rejection.into_response(&self.shared.config.header_text, self.grpc)))
    }

    /// The answer to a request whose key has `record` kept: the kept response, or 422 when
    /// the request is not the one it answered.
    fn replay<B: Body, E>(&self, record: &Record) -> Option<Answered<B, E>> {
        let Some(answer) = Answer::decode(&record.answer) else {
            tracing::error!(key = %self.lock_key, "a kept answer cannot be read (written by another version?)");
            return self.reject(Rejection::Unavailable(BackendError::new(
                BackendErrorKind::Protocol,
                "the kept answer cannot be read",
            )));
        };
        if answer.fingerprint != self.fingerprint {
            return self.reject(Rejection::Mismatch);
        }
        tracing::debug!(key = %self.lock_key, status = %answer.status, "replaying a kept answer");
        let mut response = Response::new(ResponseBody::full(answer.body, answer.trailers));
        *response.status_mut() = answer.status;
        *response.headers_mut() = answer.headers;
        response.headers_mut().insert(REPLAYED, HeaderValue::from_static("true"));
        Some(Ok(response))
    }
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody, ResBody>
where
    S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>>,
    ReqBody: Body,
    ResBody: Body,
{
    type Output = Answered<ResBody, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let next = match this.state.as_mut().project() {
                StateProj::Passed { future } => {
                    return future
                        .poll(cx)
                        .map(|result| result.map(|response| response.map(ResponseBody::as_is)));
                }
                StateProj::Ready { result } => {
                    return Poll::Ready(result.take().expect("polled after completion"));
                }
                StateProj::Releasing { release, result } => {
                    if let Err(error) = ready!(Pin::new(release).poll(cx)) {
                        tracing::debug!(error = %format_args!("{error:#}"), "release of an idempotency key failed");
                    }
                    return Poll::Ready(result.take().expect("polled after completion"));
                }
                StateProj::Reading { mut body, data, trailers } => {
                    let keyed = this.keyed.as_mut().expect("a keyed request");
                    let limit = keyed.shared.config.max_request_body;
                    let read = loop {
                        if body.is_end_stream() {
                            break Ok(());
                        }
                        match ready!(body.as_mut().poll_frame(cx)) {
                            None => break Ok(()),
                            Some(Err(_)) => break Err(Rejection::BodyUnreadable),
                            Some(Ok(frame)) => match frame.into_data() {
                                Ok(chunk) => {
                                    let chunk = into_bytes(chunk);
                                    if data.len().saturating_add(chunk.len()) > limit {
                                        break Err(Rejection::TooLarge { limit });
                                    }
                                    data.put(chunk);
                                }
                                Err(frame) => {
                                    if let Ok(more) = frame.into_trailers() {
                                        trailers.get_or_insert_with(HeaderMap::new).extend(more);
                                    }
                                }
                            },
                        }
                    };
                    match read {
                        Err(rejection) => State::Ready { result: keyed.reject(rejection) },
                        Ok(()) => {
                            let parts = keyed.parts.take().expect("read once");
                            let data = std::mem::take(data).freeze();
                            keyed.fingerprint = keyed.shared.config.fingerprint.of(&parts, &data);
                            let body = RequestBody::read(data, trailers.take());
                            keyed.request = Some(Request::from_parts(parts, body));
                            State::Looking { lookup: keyed.lookup() }
                        }
                    }
                }
                StateProj::Looking { lookup } => {
                    let keyed = this.keyed.as_mut().expect("a keyed request");
                    match ready!(lookup.as_mut().poll(cx)) {
                        Err(error) => {
                            State::Ready { result: keyed.reject(Rejection::Unavailable(error)) }
                        }
                        Ok(Some(record)) => State::Ready { result: keyed.replay(&record) },
                        Ok(None) => {
                            let config = &keyed.shared.config;
                            let acquire = keyed.shared.locks.acquire(
                                keyed.lock_key.clone(),
                                config.wait,
                                config.lease,
                            );
                            State::Acquiring { acquire }
                        }
                    }
                }
                StateProj::Acquiring { acquire } => {
                    let keyed = this.keyed.as_mut().expect("a keyed request");
                    match ready!(acquire.as_mut().poll(cx)) {
                        Ok(guard) if guard.fencing_token().is_none() => {
                            State::Ready { result: keyed.reject(Rejection::Misconfigured) }
                        }
                        Ok(guard) => {
                            State::Rechecking { lookup: keyed.lookup(), guard: Some(guard) }
                        }
                        Err(error) => {
                            State::Ready { result: keyed.reject(refused(error, &keyed.shared)) }
                        }
                    }
                }
                StateProj::Rechecking { lookup, guard } => {
                    let keyed = this.keyed.as_mut().expect("a keyed request");
                    match ready!(lookup.as_mut().poll(cx)) {
                        // The lock goes with the guard, released in the background.
                        Err(error) => {
                            State::Ready { result: keyed.reject(Rejection::Unavailable(error)) }
                        }
                        Ok(Some(record)) => State::Ready { result: keyed.replay(&record) },
                        Ok(None) => {
                            let guard = guard.take().expect("held while looking again");
                            let token = guard.fencing_token().expect("checked at the grant");
                            let mut request = keyed.request.take().expect("made once");
                            request.extensions_mut().insert(IdempotencyContext::new(
                                keyed.key.clone(),
                                token,
                                guard.context(),
                            ));
                            let mut inner = keyed.inner.take().expect("called once");
                            State::Running {
                                future: inner.call(request),
                                lost: guard.lost(),
                                guard: Some(guard),
                                started: BootInstant::now(),
                            }
                        }
                    }
                }
                StateProj::Running { future, guard, lost, started } => {
                    let keyed = this.keyed.as_mut().expect("a keyed request");
                    // Checked before every poll, against the clock too: a handler resumed after
                    // a stall past the lease must not run on before the watchdog notices.
                    if guard.as_ref().is_some_and(|guard| guard.is_lost()) {
                        State::Ready { result: keyed.reject(Rejection::Lost) }
                    } else {
                        match future.poll(cx) {
                            Poll::Pending => {
                                if Pin::new(lost).poll(cx).is_pending() {
                                    return Poll::Pending;
                                }
                                // The handler's future is dropped with this state.
                                State::Ready { result: keyed.reject(Rejection::Lost) }
                            }
                            Poll::Ready(result) => {
                                keyed
                                    .shared
                                    .runs
                                    .record(BootInstant::now().duration_since(*started));
                                let guard = guard.take().expect("held while running");
                                match result {
                                    Err(error) => State::Releasing {
                                        release: guard.release(),
                                        result: Some(Err(error)),
                                    },
                                    Ok(_) if guard.is_lost() => {
                                        State::Ready { result: keyed.reject(Rejection::Lost) }
                                    }
                                    Ok(response) => {
                                        let (parts, body) = response.into_parts();
                                        if is_kept_status(parts.status, &parts.headers) {
                                            State::Collecting {
                                                body: Some(Box::pin(body)),
                                                parts: Some(parts),
                                                frames: Vec::new(),
                                                size: 0,
                                                guard: Some(guard),
                                            }
                                        } else {
                                            let response = Response::from_parts(
                                                parts,
                                                ResponseBody::as_is(body),
                                            );
                                            State::Releasing {
                                                release: guard.release(),
                                                result: Some(Ok(response)),
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
                StateProj::Collecting { body, parts, frames, size, guard } => {
                    let keyed = this.keyed.as_mut().expect("a keyed request");
                    let limit = keyed.shared.config.max_response_body;
                    let inner = body.as_mut().expect("collected once");
                    // `Err`: the body streams, fails or outgrows the limit, and is passed on.
                    let collected = loop {
                        if inner.is_end_stream() {
                            break Ok(());
                        }
                        match inner.as_mut().poll_frame(cx) {
                            Poll::Pending => break Err(None),
                            Poll::Ready(None) => break Ok(()),
                            Poll::Ready(Some(Err(error))) => break Err(Some(error)),
                            Poll::Ready(Some(Ok(frame))) => {
                                let frame = frame.map_data(into_bytes);
                                if let Some(data) = frame.data_ref() {
                                    *size = size.saturating_add(data.len());
                                }
                                frames.push(frame);
                                if *size > limit {
                                    break Err(None);
                                }
                            }
                        }
                    };
                    let parts = parts.take().expect("collected once");
                    let guard = guard.take().expect("held while collecting");
                    match collected {
                        Err(error) => {
                            // Nothing is kept; the key is free again once the lock is released.
                            let rest = if error.is_some() { None } else { body.take() };
                            let frames = std::mem::take(frames);
                            let body = ResponseBody::resumed(frames, error, rest);
                            State::Releasing {
                                release: guard.release(),
                                result: Some(Ok(Response::from_parts(parts, body))),
                            }
                        }
                        Ok(()) => {
                            let (data, trailers) = gather(std::mem::take(frames), *size);
                            if trailers
                                .as_ref()
                                .is_some_and(|trailers| !is_kept_status(StatusCode::OK, trailers))
                            {
                                // A gRPC call that failed in its trailers: not kept.
                                let response =
                                    Response::from_parts(parts, ResponseBody::full(data, trailers));
                                State::Releasing {
                                    release: guard.release(),
                                    result: Some(Ok(response)),
                                }
                            } else if guard.is_lost() {
                                State::Ready { result: keyed.reject(Rejection::Lost) }
                            } else {
                                let token = guard.fencing_token().expect("checked at the grant");
                                let answer = Answer {
                                    fingerprint: keyed.fingerprint,
                                    status: parts.status,
                                    headers: parts
                                        .headers
                                        .iter()
                                        .filter(|(name, _)| is_kept(name))
                                        .map(|(name, value)| (name.clone(), value.clone()))
                                        .collect(),
                                    body: data.clone(),
                                    trailers: trailers.clone(),
                                };
                                let record = Record { token, answer: answer.encode() };
                                let put = keyed.shared.store.clone().put(
                                    keyed.lock_key.clone(),
                                    record,
                                    keyed.shared.config.ttl,
                                );
                                let body = ResponseBody::full(data, trailers);
                                State::Storing {
                                    put,
                                    guard: Some(guard),
                                    response: Some(Response::from_parts(parts, body)),
                                }
                            }
                        }
                    }
                }
                StateProj::Storing { put, guard, response } => {
                    let keyed = this.keyed.as_mut().expect("a keyed request");
                    let outcome = ready!(put.as_mut().poll(cx));
                    let guard = guard.take().expect("held while storing");
                    let response = response.take().expect("stored once");
                    match outcome {
                        // Any retry finds the answer now: the lock is released in the
                        // background, and the response is not held back for it.
                        Ok(Put::Stored) => {
                            drop(guard);
                            return Poll::Ready(Ok(response));
                        }
                        Ok(Put::Stale { kept }) => {
                            tracing::warn!(key = %keyed.lock_key, token = guard.fencing_token(), kept, "a later holder of the key answered first: this answer is not kept");
                            State::Ready { result: keyed.reject(Rejection::Lost) }
                        }
                        Err(error) => {
                            tracing::warn!(key = %keyed.lock_key, error = %format_args!("{error:#}"), "answer not kept: the answer store failed");
                            State::Releasing {
                                release: guard.release(),
                                result: Some(Ok(response)),
                            }
                        }
                    }
                }
            };
            this.state.set(next);
        }
    }
}

/// The refusal for an acquire that failed.
fn refused(error: LockError, shared: &Shared) -> Rejection {
    match error {
        LockError::WaitTimeout { retry_after, waited } => {
            Rejection::InFlight { retry_after: shared.runs.retry_after(waited, retry_after) }
        }
        LockError::TooManyWaiters => Rejection::InFlight {
            retry_after: shared.runs.retry_after(std::time::Duration::ZERO, None),
        },
        LockError::Backend(error) if error.is_unsupported() => Rejection::Misconfigured,
        LockError::Backend(error) => Rejection::Unavailable(error),
        LockError::ShutDown => Rejection::Unavailable(BackendError::new(
            BackendErrorKind::Unavailable,
            "the lock client was shut down",
        )),
        LockError::InvalidLease(_)
        | LockError::InvalidPermits
        | LockError::UpgradeRefused
        | LockError::ForeignHolder
        | LockError::HeldThroughOtherClient => Rejection::Misconfigured,
        LockError::InvalidKey(_) | LockError::Lost | LockError::NotHeld => Rejection::Lost,
    }
}

/// Whether a response with this status and these headers (or trailers) is kept: not a server
/// error, not an answer that says "not now" (408, 409, 423, 425, 429: a retry may succeed),
/// not an informational one; for gRPC, not a status that says the same (`CANCELLED`,
/// `UNKNOWN`, `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED`, `ABORTED`, `INTERNAL`,
/// `UNAVAILABLE`, `DATA_LOSS`).
pub(crate) fn is_kept_status(status: StatusCode, headers: &HeaderMap) -> bool {
    if status.is_server_error()
        || status.is_informational()
        || matches!(status.as_u16(), 408 | 409 | 423 | 425 | 429)
    {
        return false;
    }
    let grpc = headers
        .get("grpc-status")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u16>().ok());
    !matches!(grpc, Some(1 | 2 | 4 | 8 | 10 | 13 | 14 | 15))
}

/// The data of `frames` in one piece, and their trailers.
fn gather(frames: Vec<Frame<Bytes>>, size: usize) -> (Bytes, Option<HeaderMap>) {
    let mut data = BytesMut::with_capacity(size);
    let mut trailers: Option<HeaderMap> = None;
    let mut single: Option<Bytes> = None;
    let mut pieces = 0;
    for frame in frames {
        match frame.into_data() {
            Ok(chunk) => {
                pieces += 1;
                if pieces == 1 {
                    single = Some(chunk.clone());
                }
                data.put(chunk);
            }
            Err(frame) => {
                if let Ok(more) = frame.into_trailers() {
                    trailers.get_or_insert_with(HeaderMap::new).extend(more);
                }
            }
        }
    }
    // One chunk (the usual body) is kept as it is, without a copy.
    let data = match (pieces, single) {
        (1, Some(chunk)) => chunk,
        _ => data.freeze(),
    };
    (data, trailers)
}

impl<S, ReqBody, ResBody> fmt::Debug for ResponseFuture<S, ReqBody, ResBody>
where
    S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>>,
    ResBody: Body,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Server errors, "not now" answers and failed gRPC calls are not kept.
    #[test]
    fn kept_statuses() {
        let none = HeaderMap::new();
        for kept in [200, 201, 204, 302, 400, 402, 404, 422] {
            assert!(is_kept_status(StatusCode::from_u16(kept).unwrap(), &none), "{kept}");
        }
        for not in [101, 408, 409, 423, 425, 429, 500, 502, 503] {
            assert!(!is_kept_status(StatusCode::from_u16(not).unwrap(), &none), "{not}");
        }
        let grpc = |code: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert("grpc-status", HeaderValue::from_static(code));
            is_kept_status(StatusCode::OK, &headers)
        };
        assert!(grpc("0") && grpc("3") && grpc("5") && grpc("9"));
        assert!(!grpc("14") && !grpc("13") && !grpc("2") && !grpc("10"));
    }
}
