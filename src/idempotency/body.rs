//! The bodies the layer hands on: [`RequestBody`] to the inner service, [`ResponseBody`] to the
//! client.

use std::{
    collections::VecDeque,
    fmt,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::{Buf, Bytes};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project::pin_project;

/// The request body the inner service gets: the body as it came, or the bytes the layer read
/// to fingerprint it (and its trailers).
///
/// Its data is [`Bytes`] and its error the original body's, so an axum router, a tonic
/// server made by `tonic-build` or a hyper service generic over its body takes it as it is. A
/// service written for one body type (tonic's `Routes` behind `Server::builder().layer(..)`,
/// say) gets it mapped: `ServiceBuilder::new().layer(idempotency).map_request(|r:
/// http::Request<_>| r.map(tonic::body::Body::new))`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::convert::Infallible;
///
/// use http::{Request, Response};
/// use http_body_util::BodyExt;
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
/// use tower_lock::{
///     LockClient,
///     idempotency::{IdempotencyLayer, MemoryAnswerStore, RequestBody},
/// };
///
/// // A plain service, written for the layer's request body over any body.
/// async fn echo<B: http_body::Body>(
///     request: Request<RequestBody<B>>,
/// ) -> Result<Response<String>, Infallible> {
///     let read = request.body().is_read(); // the layer read it to fingerprint it
///     let bytes = match request.into_body().collect().await {
///         Ok(body) => body.to_bytes(),
///         Err(_) => Default::default(),
///     };
///     Ok(Response::new(format!("{} bytes, read first: {read}", bytes.len())))
/// }
///
/// let service = ServiceBuilder::new()
///     .layer(IdempotencyLayer::new(LockClient::in_memory(), MemoryAnswerStore::new()))
///     .service(service_fn(echo));
/// let request = Request::post("/echo")
///     .header("idempotency-key", "k-1")
///     .header("authorization", "Bearer alice")
///     .body(String::from("hello"))?;
/// let response = service.oneshot(request).await?;
/// let text = response.into_body().collect().await?.to_bytes();
/// assert_eq!(text, "5 bytes, read first: true");
/// # Ok(())
/// # }
/// ```
#[pin_project]
pub struct RequestBody<B> {
    #[pin]
    kind: RequestKind<B>,
}

#[pin_project(project = RequestKindProj)]
enum RequestKind<B> {
    AsIs {
        #[pin]
        inner: B,
    },
    Read {
        data: Option<Bytes>,
        trailers: Option<HeaderMap>,
    },
}

impl<B> RequestBody<B> {
    /// The body as it came.
    pub(crate) fn as_is(inner: B) -> Self {
        Self { kind: RequestKind::AsIs { inner } }
    }

    /// A body of bytes read already.
    pub(crate) fn read(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        Self { kind: RequestKind::Read { data: (!data.is_empty()).then_some(data), trailers } }
    }

    /// Whether the layer read the body (to fingerprint it) before handing it on.
    pub fn is_read(&self) -> bool {
        matches!(self.kind, RequestKind::Read { .. })
    }
}

impl<B: Body> Body for RequestBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            RequestKindProj::AsIs { inner } => inner
                .poll_frame(cx)
                .map(|frame| frame.map(|frame| frame.map(|frame| frame.map_data(into_bytes)))),
            RequestKindProj::Read { data, trailers } => Poll::Ready(next_frame(data, trailers)),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            RequestKind::AsIs { inner } => inner.is_end_stream(),
            RequestKind::Read { data, trailers } => data.is_none() && trailers.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            RequestKind::AsIs { inner } => inner.size_hint(),
            RequestKind::Read { data, .. } => exact(data.as_ref()),
        }
    }
}

impl<B> fmt::Debug for RequestBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestBody").field("read", &self.is_read()).finish_non_exhaustive()
    }
}

/// The response body the layer answers with: the inner service's body as it comes (a request
/// the layer does not handle, a body that streams), or a body of kept bytes and trailers (an
/// answer kept or replayed, a refusal).
///
/// Its data is [`Bytes`] and its error the inner body's: axum and tonic serve it as it is.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::convert::Infallible;
///
/// use http::{Request, Response};
/// use http_body_util::BodyExt;
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
/// use tower_lock::{LockClient, idempotency::{IdempotencyLayer, MemoryAnswerStore}};
///
/// let service = ServiceBuilder::new()
///     .layer(IdempotencyLayer::new(LockClient::in_memory(), MemoryAnswerStore::new()))
///     .service(service_fn(|_: Request<_>| async {
///         Ok::<_, Infallible>(Response::new(String::from("created")))
///     }));
/// // A GET is left alone: its body is the handler's, as it comes.
/// let response = service.oneshot(Request::get("/").body(String::new())?).await?;
/// assert!(!response.body().is_full());
/// assert_eq!(response.into_body().collect().await?.to_bytes(), "created");
/// # Ok(())
/// # }
/// ```
#[pin_project]
pub struct ResponseBody<B: Body> {
    #[pin]
    kind: ResponseKind<B>,
}

#[pin_project(project = ResponseKindProj)]
enum ResponseKind<B: Body> {
    AsIs {
        #[pin]
        inner: B,
    },
    Full {
        data: Option<Bytes>,
        trailers: Option<HeaderMap>,
    },
    /// A body the layer began to read, and found streaming: the frames it read, then the rest.
    Resumed {
        frames: VecDeque<Frame<Bytes>>,
        /// The error the inner body ended with while it was read, after those frames.
        error: Option<B::Error>,
        /// Boxed: it was polled inside the response future, and moves into the response.
        inner: Option<Pin<Box<B>>>,
    },
}

impl<B: Body> ResponseBody<B> {
    /// The inner body as it comes.
    pub(crate) fn as_is(inner: B) -> Self {
        Self { kind: ResponseKind::AsIs { inner } }
    }

    /// A body of `data` and `trailers`.
    pub(crate) fn full(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        Self { kind: ResponseKind::Full { data: (!data.is_empty()).then_some(data), trailers } }
    }

    /// `frames` read from `inner` already, then the rest of it (`None`: it is over), or the
    /// `error` it failed with.
    pub(crate) fn resumed(
        frames: Vec<Frame<Bytes>>,
        error: Option<B::Error>,
        inner: Option<Pin<Box<B>>>,
    ) -> Self {
        Self { kind: ResponseKind::Resumed { frames: frames.into(), error, inner } }
    }

    /// Whether the body is made of bytes the layer holds (an answer kept or replayed, or a
    /// refusal), rather than streamed from the inner service.
    pub fn is_full(&self) -> bool {
        matches!(self.kind, ResponseKind::Full { .. })
    }
}

impl<B: Body> Body for ResponseBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            ResponseKindProj::AsIs { inner } => inner
                .poll_frame(cx)
                .map(|frame| frame.map(|frame| frame.map(|frame| frame.map_data(into_bytes)))),
            ResponseKindProj::Full { data, trailers } => Poll::Ready(next_frame(data, trailers)),
            ResponseKindProj::Resumed { frames, error, inner } => {
                if let Some(frame) = frames.pop_front() {
                    return Poll::Ready(Some(Ok(frame)));
                }
                if let Some(error) = error.take() {
                    *inner = None;
                    return Poll::Ready(Some(Err(error)));
                }
                let Some(body) = inner.as_mut() else {
                    return Poll::Ready(None);
                };
                let next = std::task::ready!(body.as_mut().poll_frame(cx));
                if next.is_none() {
                    *inner = None;
                }
                Poll::Ready(next.map(|frame| frame.map(|frame| frame.map_data(into_bytes))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            ResponseKind::AsIs { inner } => inner.is_end_stream(),
            ResponseKind::Full { data, trailers } => data.is_none() && trailers.is_none(),
            ResponseKind::Resumed { frames, error, inner } => {
                frames.is_empty()
                    && error.is_none()
                    && inner.as_ref().is_none_or(|inner| inner.is_end_stream())
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            ResponseKind::AsIs { inner } => inner.size_hint(),
            ResponseKind::Full { data, .. } => exact(data.as_ref()),
            ResponseKind::Resumed { frames, inner, .. } => {
                let read: u64 =
                    frames.iter().filter_map(Frame::data_ref).map(|data| data.len() as u64).sum();
                let rest = inner
                    .as_ref()
                    .map_or_else(|| SizeHint::with_exact(0), |inner| inner.size_hint());
                let mut hint = SizeHint::new();
                hint.set_lower(rest.lower().saturating_add(read));
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper.saturating_add(read));
                }
                hint
            }
        }
    }
}

impl<B: Body> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseBody").field("full", &self.is_full()).finish_non_exhaustive()
    }
}

/// The data of a frame as [`Bytes`] (without a copy when it is `Bytes` already).
pub(crate) fn into_bytes<D: Buf>(mut data: D) -> Bytes {
    data.copy_to_bytes(data.remaining())
}

/// The next frame of a body of `data` then `trailers`.
fn next_frame<E>(
    data: &mut Option<Bytes>,
    trailers: &mut Option<HeaderMap>,
) -> Option<Result<Frame<Bytes>, E>> {
    if let Some(data) = data.take() {
        return Some(Ok(Frame::data(data)));
    }
    trailers.take().map(|trailers| Ok(Frame::trailers(trailers)))
}

fn exact(data: Option<&Bytes>) -> SizeHint {
    SizeHint::with_exact(data.map_or(0, |data| data.len() as u64))
}
