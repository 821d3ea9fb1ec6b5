//! Holding a request's lock until its response body ends: [`LockBody`], and the markers that
//! say how long a layer holds its locks.
//!
//! By default a [`LockLayer`](super::LockLayer) releases the lock when the inner service's
//! response is ready, before the response is handed back: the lock covers the work that made
//! the response. A streamed body (a download, server-sent events, a gRPC server stream) is
//! made while it is sent, after that. With
//! [`hold_until_body_ends`](super::LockLayer::hold_until_body_ends) the response's body is a
//! [`LockBody`] that holds the lock until the body ends:
//!
//! | the body | the lock |
//! |---|---|
//! | streams | held, renewed by the watchdog |
//! | ends (its last frame, or its trailers) | released, then the last frame is sent |
//! | fails | released, then the error is passed on |
//! | is dropped (the client went away, the connection broke) | released in the background |
//! | is over before it began (an empty body, a gRPC trailers-only status) | released before the response is handed back, as without the option |
//! | the lock is lost while it streams | the body ends: with the rejection's gRPC trailers (`ABORTED`) when the layer answers in gRPC (`grpc::GrpcRejection`), else with an error, which cuts the response short so that the client sees it incomplete; with [`continue_on_lost`](super::LockLayer::continue_on_lost), it streams on |

use std::{
    fmt,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
};

use http::header::CONTENT_TYPE;
use http_body::{Frame, SizeHint};
use pin_project::pin_project;

use super::{
    LockRejection, OnRejected,
    hold::{Hold, HoldRelease},
    layer::LayerConfig,
};
use crate::{Backend, clock::BootInstant, guard::Lost};

/// The error type of a [`LockBody`]: the inner body's error, or the [`LockRejection::Lost`]
/// that cut it short.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A layer whose locks are released when the response is ready, before it is handed back (the
/// default).
#[derive(Clone, Copy, Debug, Default)]
pub struct UntilResponse;

/// A layer whose locks are held until the response body ends
/// ([`LockLayer::hold_until_body_ends`](super::LockLayer::hold_until_body_ends)).
#[derive(Clone, Copy, Debug, Default)]
pub struct UntilBodyEnds;

/// A response body that holds its request's lock until it ends, fails or is dropped. See the
/// [module docs](self).
#[pin_project]
pub struct LockBody<Body: http_body::Body, B: Backend, R> {
    #[pin]
    inner: Body,
    /// `None` when the body holds no lock (any more).
    holding: Option<Holding<B, R>>,
    /// The frame to send once the release is done (`None` inside: the end of the body).
    then: Option<Option<Result<Frame<Body::Data>, BoxError>>>,
    /// Whether the body is over: its last frame was sent, or it was cut short.
    ended: bool,
}

struct Holding<B: Backend, R> {
    /// `None` once its release began.
    hold: Option<Hold<B>>,
    release: Option<HoldRelease>,
    /// Watched while the body streams, unless the layer lets requests continue on a loss.
    lost: Option<Lost>,
    on_rejected: R,
    /// Whether the request is a gRPC call, answered in gRPC form.
    grpc: bool,
    config: Arc<LayerConfig>,
}

impl<Body: http_body::Body, B: Backend, R> LockBody<Body, B, R> {
    /// A body that holds no lock: a rejection's, or one whose lock was released already.
    pub(crate) fn unlocked(inner: Body) -> Self {
        Self { inner, holding: None, then: None, ended: false }
    }

    /// A body that holds `hold` until it ends.
    pub(crate) fn holding(
        inner: Body,
        hold: Hold<B>,
        (on_rejected, grpc): (R, bool),
        config: Arc<LayerConfig>,
    ) -> Self {
        let lost = (!config.continue_on_lost).then(|| hold.lost());
        Self {
            inner,
            holding: Some(Holding {
                hold: Some(hold),
                release: None,
                lost,
                on_rejected,
                grpc,
                config,
            }),
            then: None,
            ended: false,
        }
    }

    /// Whether the body holds its lock still (it is released when the body ends).
    pub fn is_holding(&self) -> bool {
        self.holding.as_ref().is_some_and(|holding| holding.hold.is_some())
    }

    /// The inner body.
    pub fn get_ref(&self) -> &Body {
        &self.inner
    }
}

impl<Body, B, R> http_body::Body for LockBody<Body, B, R>
where
    Body: http_body::Body,
    Body::Error: Into<BoxError>,
    B: Backend,
    R: OnRejected<Body>,
{
    type Data = Body::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        if *this.ended {
            return Poll::Ready(None);
        }
        let Some(holding) = this.holding.as_mut() else {
            return this.inner.poll_frame(cx).map_err(Into::into);
        };
        loop {
            if let Some(release) = holding.release.as_mut() {
                if let Err(error) = ready!(Pin::new(release).poll(cx)) {
                    tracing::debug!(error = %format_args!("{error:#}"), "release at the end of the body failed");
                }
                *this.holding = None;
                *this.ended = true;
                return Poll::Ready(this.then.take().expect("set with the release"));
            }
            let watched = holding.lost.is_some();
            if watched
                && holding.hold.as_ref().is_some_and(|hold| hold.is_lost_at(BootInstant::now()))
            {
                return Poll::Ready(lost(this.holding, this.ended));
            }
            let last = match this.inner.as_mut().poll_frame(cx) {
                Poll::Pending => {
                    if holding.lost.as_mut().is_some_and(|lost| Pin::new(lost).poll(cx).is_ready())
                    {
                        return Poll::Ready(lost(this.holding, this.ended));
                    }
                    return Poll::Pending;
                }
                Poll::Ready(Some(Ok(frame))) => {
                    // A body's trailers are its last frame; a data frame is when the body says
                    // it is over after it.
                    if !frame.is_trailers() && !this.inner.is_end_stream() {
                        return Poll::Ready(Some(Ok(frame)));
                    }
                    Some(Ok(frame))
                }
                Poll::Ready(Some(Err(error))) => Some(Err(error.into())),
                Poll::Ready(None) => None,
            };
            // The body is over: release, then send its last frame (so that a client that sees
            // the end and calls again finds the lock free).
            let now = BootInstant::now();
            let hold = holding.hold.take().expect("held until the body ends");
            if holding.config.release_in_background {
                drop(hold);
                *this.holding = None;
                *this.ended = true;
                return Poll::Ready(last);
            }
            holding.release = Some(hold.release(now));
            *this.then = Some(last);
        }
    }

    fn is_end_stream(&self) -> bool {
        // While it holds the lock the body is polled to its end, where the lock is released.
        self.ended || (self.holding.is_none() && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        if self.ended { SizeHint::with_exact(0) } else { self.inner.size_hint() }
    }
}

/// The end of a body whose lock was lost while it streamed: the rejection's gRPC status as
/// trailers, when the layer answers in gRPC, else an error that cuts the response short.
fn lost<Body, B, R, D>(
    holding: &mut Option<Holding<B, R>>,
    ended: &mut bool,
) -> Option<Result<Frame<D>, BoxError>>
where
    B: Backend,
    R: OnRejected<Body>,
{
    let holding = holding.take().expect("holding while streaming");
    *ended = true;
    let response =
        super::rejection::answer(&holding.on_rejected, LockRejection::Lost, holding.grpc);
    if response.headers().contains_key("grpc-status") {
        let mut trailers = response.into_parts().0.headers;
        trailers.remove(CONTENT_TYPE);
        return Some(Ok(Frame::trailers(trailers)));
    }
    Some(Err(Box::new(LockRejection::Lost)))
}

impl<Body: http_body::Body + fmt::Debug, B: Backend, R> fmt::Debug for LockBody<Body, B, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockBody")
            .field("inner", &self.inner)
            .field("holding", &self.is_holding())
            .finish_non_exhaustive()
    }
}
