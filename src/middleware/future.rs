//! [`ResponseFuture`]: wait for the lock, run the inner service while holding it, release.

use std::{
    fmt,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
};

use http::{Request, Response};
use pin_project::pin_project;
use tokio::task::futures::TaskLocalFuture;
use tower_service::Service;

use super::{
    LockRejection, OnRejected,
    body::LockBody,
    hold::{Hold, HoldRelease},
    layer::LayerConfig,
};
use crate::{Backend, LockError, clock::BootInstant, guard::Lost, holder::Holder};

// The box is `Send` so that the response future can be: it holds only the lock client's parts,
// never the inner service or a body (as does a release in flight).
pub(crate) type Acquire<B> = Pin<Box<dyn Future<Output = Result<Hold<B>, LockError>> + Send>>;

/// The response future of [`LockService`](super::LockService).
///
/// Dropping it at any point releases what it holds: a waiting acquire leaves the queue, a held
/// lock is released in the background. It is `Send` when the inner service, its future, the
/// request and the rejection hook are.
// The bounds are the ones the fields need: `S: Service` for `S::Future` and `S::Response`,
// `B: Backend` for `Hold<B>`.
#[pin_project]
pub struct ResponseFuture<S, B, ReqBody, R>
where
    S: Service<Request<ReqBody>>,
    B: Backend,
{
    #[pin]
    state: State<S, B, ReqBody>,
    on_rejected: Option<R>,
    /// Whether the request is a gRPC call, answered in gRPC form.
    grpc: bool,
    config: Option<Arc<LayerConfig>>,
    span: tracing::Span,
    /// When the request began waiting; read only for an enabled span (`waited_ms`).
    started: Option<BootInstant>,
    /// When its acquire resolved: its hold time counts from here.
    acquired: Option<BootInstant>,
    /// Whether a response's lock goes with its body (`hold_until_body_ends`) rather than
    /// being released before the response is handed back.
    hand_over: bool,
    /// The lock of a response whose body holds it, for [`BodyResponseFuture`] to take.
    handed: Option<Hold<B>>,
}

#[pin_project(project = StateProj)]
enum State<S, B, ReqBody>
where
    S: Service<Request<ReqBody>>,
    B: Backend,
{
    Acquiring {
        acquire: Acquire<B>,
        inner: Option<S>,
        request: Option<Request<ReqBody>>,
    },
    Running {
        #[pin]
        future: TaskLocalFuture<Holder, S::Future>,
        guard: Option<Hold<B>>,
        lost: Option<Lost>,
    },
    Releasing {
        #[pin]
        release: HoldRelease,
        result: Option<Result<S::Response, S::Error>>,
    },
    Unlocked {
        #[pin]
        future: S::Future,
    },
    Rejected {
        response: Option<S::Response>,
    },
}

impl<S, B, ReqBody, R, ResBody> ResponseFuture<S, B, ReqBody, R>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    B: Backend,
    R: OnRejected<ResBody>,
{
    pub(crate) fn acquiring(
        acquire: Acquire<B>,
        inner: S,
        request: Request<ReqBody>,
        on_rejected: R,
        config: Arc<LayerConfig>,
        span: tracing::Span,
        (hand_over, grpc): (bool, bool),
    ) -> Self {
        Self {
            state: State::Acquiring { acquire, inner: Some(inner), request: Some(request) },
            on_rejected: Some(on_rejected),
            grpc,
            config: Some(config),
            started: (!span.is_disabled()).then(BootInstant::now),
            span,
            acquired: None,
            hand_over,
            handed: None,
        }
    }

    pub(crate) fn rejected(on_rejected: &R, rejection: LockRejection, grpc: bool) -> Self {
        Self::finished(State::Rejected {
            response: Some(super::rejection::answer(on_rejected, rejection, grpc)),
        })
    }

    pub(crate) fn unlocked(mut inner: S, request: Request<ReqBody>) -> Self {
        Self::finished(State::Unlocked { future: inner.call(request) })
    }

    fn finished(state: State<S, B, ReqBody>) -> Self {
        Self {
            state,
            on_rejected: None,
            grpc: false,
            config: None,
            span: tracing::Span::none(),
            started: None,
            acquired: None,
            hand_over: false,
            handed: None,
        }
    }
}

impl<S, B, ReqBody, R, ResBody> Future for ResponseFuture<S, B, ReqBody, R>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    B: Backend,
    R: OnRejected<ResBody>,
{
    type Output = Result<Response<ResBody>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let _entered = this.span.enter();
        loop {
            let next = match this.state.as_mut().project() {
                StateProj::Acquiring { acquire, inner, request } => {
                    match ready!(acquire.as_mut().poll(cx)) {
                        Ok(guard) => {
                            let now = guard.acquired_at();
                            *this.acquired = Some(now);
                            if let Some(started) = *this.started {
                                this.span.record("waited_ms", millis(now.duration_since(started)));
                            }
                            let mut request = request.take().expect("polled after completion");
                            let context = guard.context().under(this.config.as_deref());
                            request.extensions_mut().insert(context);
                            let mut inner = inner.take().expect("polled after completion");
                            let holder = guard.holder().clone();
                            // `call` runs synchronously now; the future runs at every poll.
                            let future = holder.clone().sync_scope(|| inner.call(request));
                            let abort_on_lost =
                                this.config.as_ref().is_some_and(|c| !c.continue_on_lost);
                            State::Running {
                                future: holder.scope(future),
                                lost: abort_on_lost.then(|| guard.lost()),
                                guard: Some(guard),
                            }
                        }
                        Err(error) => reject(this.on_rejected, *this.grpc, this.span, error.into()),
                    }
                }
                StateProj::Running { future, guard, lost } => {
                    // Checked before every poll, against the clock too: a handler resumed after
                    // a stall past the lease must not run on before the watchdog notices.
                    // `None`: the lock was lost and the handler stops.
                    let finished = if lost.is_some()
                        && guard.as_ref().is_some_and(|guard| guard.is_lost_at(BootInstant::now()))
                    {
                        None
                    } else {
                        match future.poll(cx) {
                            Poll::Ready(result) => Some(result),
                            // Only a handler that waits needs waking at a loss: the watch
                            // registers then, and sees a loss marked since the check above.
                            Poll::Pending
                                if lost
                                    .as_mut()
                                    .is_some_and(|lost| Pin::new(lost).poll(cx).is_ready()) =>
                            {
                                None
                            }
                            Poll::Pending => return Poll::Pending,
                        }
                    };
                    if let Some(result) = finished {
                        // One clock reading for the hold's time and the deadline check below.
                        let now = BootInstant::now();
                        let acquired = *this.acquired;
                        if *this.hand_over && result.is_ok() && !guard_lost_at(guard, lost, now) {
                            // The body holds the lock from here; it records the hold's time.
                            *this.handed = guard.take();
                            this.span.record("outcome", "streaming");
                            return Poll::Ready(result);
                        }
                        this.span.record("held_ms", held_ms(acquired, now));
                        this.span.record("outcome", if result.is_ok() { "ok" } else { "error" });
                        let guard = guard.take().expect("polled after completion");
                        let background =
                            this.config.as_ref().is_some_and(|c| c.release_in_background);
                        if lost.is_some() && guard.is_lost_at(now) {
                            // The handler finished after the lease's deadline, before the
                            // watchdog said so (e.g. the process was stalled): its response
                            // was not made under the lock.
                            drop(guard);
                            reject(this.on_rejected, *this.grpc, this.span, LockRejection::Lost)
                        } else if background {
                            drop(guard);
                            return Poll::Ready(result);
                        } else {
                            State::Releasing { release: guard.release(now), result: Some(result) }
                        }
                    } else {
                        // The inner future is dropped with this state: the handler stops.
                        this.span.record("held_ms", held_ms(*this.acquired, BootInstant::now()));
                        reject(this.on_rejected, *this.grpc, this.span, LockRejection::Lost)
                    }
                }
                StateProj::Releasing { release, result } => {
                    if let Err(error) = ready!(release.poll(cx)) {
                        tracing::debug!(error = %format_args!("{error:#}"), "release after the response failed");
                    }
                    return Poll::Ready(result.take().expect("polled after completion"));
                }
                StateProj::Unlocked { future } => return future.poll(cx),
                StateProj::Rejected { response } => {
                    return Poll::Ready(Ok(response.take().expect("polled after completion")));
                }
            };
            this.state.set(next);
        }
    }
}

fn reject<S, B, ReqBody, R, ResBody>(
    on_rejected: &Option<R>,
    grpc: bool,
    span: &tracing::Span,
    rejection: LockRejection,
) -> State<S, B, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    B: Backend,
    R: OnRejected<ResBody>,
{
    span.record("outcome", tracing::field::display(rejection.answer(grpc)));
    let on_rejected = on_rejected.as_ref().expect("rejection hook set while locking");
    State::Rejected { response: Some(super::rejection::answer(on_rejected, rejection, grpc)) }
}

/// Whether the hold is watched for a loss (`lost` set) and is lost by `now`.
fn guard_lost_at<B: Backend>(
    guard: &Option<Hold<B>>,
    lost: &Option<Lost>,
    now: BootInstant,
) -> bool {
    lost.is_some() && guard.as_ref().is_some_and(|guard| guard.is_lost_at(now))
}

fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn held_ms(acquired: Option<BootInstant>, now: BootInstant) -> u64 {
    acquired.map_or(0, |at| millis(now.duration_since(at)))
}

impl<S, B, ReqBody, R> fmt::Debug for ResponseFuture<S, B, ReqBody, R>
where
    S: Service<Request<ReqBody>>,
    B: Backend,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

/// The response future of a [`LockService`](super::LockService) whose layer holds the lock
/// until the response body ends ([`LockLayer::hold_until_body_ends`](super::LockLayer::hold_until_body_ends)):
/// it waits for the lock and runs the inner service as [`ResponseFuture`] does, then hands the
/// lock to the response's [`LockBody`] instead of releasing it.
///
/// Dropping it releases what it holds, as dropping [`ResponseFuture`] does.
#[pin_project]
pub struct BodyResponseFuture<S, B, ReqBody, R>
where
    S: Service<Request<ReqBody>>,
    B: Backend,
{
    #[pin]
    future: ResponseFuture<S, B, ReqBody, R>,
    /// The release of a body that was over before it began, as without the option (a body
    /// that is over may never be polled), and the response handed back after it.
    release: Option<(HoldRelease, Option<S::Response>)>,
}

impl<S, B, ReqBody, R> BodyResponseFuture<S, B, ReqBody, R>
where
    S: Service<Request<ReqBody>>,
    B: Backend,
{
    pub(crate) fn new(future: ResponseFuture<S, B, ReqBody, R>) -> Self {
        Self { future, release: None }
    }
}

impl<S, B, ReqBody, R, ResBody> Future for BodyResponseFuture<S, B, ReqBody, R>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    B: Backend,
    R: OnRejected<ResBody>,
    ResBody: http_body::Body,
{
    type Output = Result<Response<LockBody<ResBody, B, R>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            if let Some((release, response)) = this.release.as_mut() {
                if let Err(error) = ready!(Pin::new(release).poll(cx)) {
                    tracing::debug!(error = %format_args!("{error:#}"), "release after the response failed");
                }
                let response = response.take().expect("polled after completion");
                return Poll::Ready(Ok(response.map(LockBody::unlocked)));
            }
            // An `Err` never hands its lock over: it was released as without the option.
            let response = ready!(this.future.as_mut().poll(cx))?;
            let future = this.future.as_mut().project();
            let Some(hold) = future.handed.take() else {
                return Poll::Ready(Ok(response.map(LockBody::unlocked)));
            };
            let config = future.config.clone().expect("set while locking");
            if !response.body().is_end_stream() {
                let on_rejected = future.on_rejected.take().expect("set while locking");
                let grpc = *future.grpc;
                return Poll::Ready(Ok(
                    response.map(|body| LockBody::holding(body, hold, (on_rejected, grpc), config))
                ));
            }
            let now = BootInstant::now();
            if config.release_in_background {
                drop(hold);
                return Poll::Ready(Ok(response.map(LockBody::unlocked)));
            }
            *this.release = Some((hold.release(now), Some(response)));
        }
    }
}

impl<S, B, ReqBody, R> fmt::Debug for BodyResponseFuture<S, B, ReqBody, R>
where
    S: Service<Request<ReqBody>>,
    B: Backend,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BodyResponseFuture").finish_non_exhaustive()
    }
}
