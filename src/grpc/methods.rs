//! [`MethodLocks`]: a lock layer per gRPC method of a tonic service (feature `tonic`).

use std::{
    convert::Infallible,
    fmt,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;
use http::{Request, Response};
use tower_layer::Layer;
use tower_service::Service;

/// The request and response bodies of a tonic service.
type Body = tonic::body::Body;
/// What a boxed route's call returns.
type RouteFuture = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

/// Locks each gRPC method of a tonic service its own way: one [`LockLayer`](crate::LockLayer)
/// per method (its key, wait, lease, and whether a server stream holds the lock until it ends),
/// and methods without a rule left alone, explicitly.
///
/// A rule names a method by its name (`"Withdraw"`) or its full path
/// (`"/bank.Bank/Withdraw"`). A call to a method with a rule goes through that rule's layer,
/// so a call whose key is missing or refused is answered `INVALID_ARGUMENT` and never runs
/// unlocked (unless the rule's layer says [`skip_missing_key`](crate::LockLayer::skip_missing_key)).
/// A call to any other method runs as it is, without a lock: list the methods whose keys come
/// from the decoded message with [`unlocked`](Self::unlocked), where they take their lock in the
/// method through the client (see the `grpc` guide), so the layer says which methods run
/// unlocked and a reader sees every method's rule in one place. Each method's rejections are
/// gRPC statuses (a gRPC call is answered in gRPC form by default).
///
/// ```
/// # use std::{convert::Infallible, future::{Ready, ready}, task::{Context, Poll}};
/// # /// Stands for the server tonic's code generator makes for the `bank.Bank` service.
/// # #[derive(Clone)]
/// # struct BankServer;
/// # impl tonic::server::NamedService for BankServer {
/// #     const NAME: &'static str = "bank.Bank";
/// # }
/// # impl tower::Service<http::Request<tonic::body::Body>> for BankServer {
/// #     type Response = http::Response<tonic::body::Body>;
/// #     type Error = Infallible;
/// #     type Future = Ready<Result<Self::Response, Infallible>>;
/// #     fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
/// #         Poll::Ready(Ok(()))
/// #     }
/// #     fn call(&mut self, _: http::Request<tonic::body::Body>) -> Self::Future {
/// #         ready(Ok(http::Response::new(tonic::body::Body::empty())))
/// #     }
/// # }
/// use std::time::Duration;
///
/// use tonic::transport::Server;
/// use tower::Layer;
/// use tower_lock::{LockClient, LockLayer, grpc::MethodLocks, key};
///
/// let locks = LockClient::in_memory();
/// let account = || key::header("account-id").prefixed("account:");
/// let layer = MethodLocks::new()
///     // The account from the call's metadata; a call without it is INVALID_ARGUMENT.
///     .method(
///         "Withdraw",
///         LockLayer::new(locks.clone())
///             .key(account())
///             .wait(Duration::from_secs(2)),
///     )
///     // A server stream holds its account's lock until the stream ends.
///     .method(
///         "Statement",
///         LockLayer::new(locks.clone())
///             .key(account())
///             .hold_until_body_ends(),
///     )
///     // Takes `account:<id>` itself, from the decoded message.
///     .unlocked("Deposit");
/// let router = Server::builder().add_service(layer.layer(BankServer));
/// // router.serve(addr).await?;
/// # let _ = router;
/// ```
pub struct MethodLocks<S> {
    rules: Vec<Rule<S>>,
    unlocked: Vec<Arc<str>>,
}

/// One method's layer, kept as the function that wraps a service in it.
struct Rule<S> {
    method: Arc<str>,
    wrap: Arc<dyn Fn(S) -> BoxRoute + Send + Sync>,
}

impl<S> Clone for Rule<S> {
    fn clone(&self) -> Self {
        Self { method: self.method.clone(), wrap: self.wrap.clone() }
    }
}

impl<S> Default for MethodLocks<S> {
    fn default() -> Self {
        Self { rules: Vec::new(), unlocked: Vec::new() }
    }
}

impl<S> Clone for MethodLocks<S> {
    fn clone(&self) -> Self {
        Self { rules: self.rules.clone(), unlocked: self.unlocked.clone() }
    }
}

impl<S> fmt::Debug for MethodLocks<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MethodLocks")
            .field("locked", &self.rules.iter().map(|r| &*r.method).collect::<Vec<_>>())
            .field("unlocked", &self.unlocked)
            .finish()
    }
}

impl<S> MethodLocks<S> {
    /// A layer with no rule yet: every method runs unlocked until [`method`](Self::method)
    /// gives it one.
    pub fn new() -> Self {
        Self::default()
    }

    /// Locks calls to `method` (a method name, `"Withdraw"`, or a full path,
    /// `"/bank.Bank/Withdraw"`) with `layer`: usually a [`LockLayer`](crate::LockLayer), with
    /// this method's key, wait, lease and hold. A later rule for the same method replaces the
    /// earlier one.
    ///
    /// # Panics
    /// When `method` is empty, or was listed as [`unlocked`](Self::unlocked): a method is
    /// either locked by the layer or not, and saying both is a mistake.
    #[must_use]
    pub fn method<L, RB>(mut self, method: &str, layer: L) -> Self
    where
        L: Layer<S> + Send + Sync + 'static,
        L::Service: Service<Request<Body>, Response = Response<RB>, Error = Infallible>
            + Clone
            + Send
            + Sync
            + 'static,
        <L::Service as Service<Request<Body>>>::Future: Send + 'static,
        RB: http_body::Body<Data = Bytes> + Send + 'static,
        RB::Error: Into<crate::error::BoxError>,
    {
        assert!(!method.is_empty(), "a gRPC method name is not empty");
        assert!(
            !self.unlocked.iter().any(|m| &**m == method),
            "gRPC method {method} is listed as unlocked and given a lock rule"
        );
        self.rules.retain(|rule| &*rule.method != method);
        self.rules.push(Rule {
            method: method.into(),
            wrap: Arc::new(move |inner| BoxRoute(Box::new(layer.layer(inner)))),
        });
        self
    }

    /// Says that calls to `method` run without a lock from this layer: a method that takes its
    /// lock itself (its key is in the decoded message), or needs none. Methods not named at
    /// all run unlocked too; naming them makes the choice visible, and a lock rule for a
    /// method named here panics.
    ///
    /// # Panics
    /// When `method` already has a lock rule.
    #[must_use]
    pub fn unlocked(mut self, method: &str) -> Self {
        assert!(
            !self.rules.iter().any(|rule| &*rule.method == method),
            "gRPC method {method} has a lock rule and is listed as unlocked"
        );
        self.unlocked.push(method.into());
        self
    }
}

impl<S: Clone> Layer<S> for MethodLocks<S> {
    type Service = MethodLockService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        MethodLockService {
            routes: self
                .rules
                .iter()
                .map(|rule| (rule.method.clone(), (rule.wrap)(inner.clone())))
                .collect::<Vec<_>>()
                .into(),
            inner,
        }
    }
}

/// The service made by [`MethodLocks`]: each call goes to its method's lock layer, or, for a
/// method without a rule, straight to the inner service.
pub struct MethodLockService<S> {
    inner: S,
    routes: Arc<[(Arc<str>, BoxRoute)]>,
}

impl<S: Clone> Clone for MethodLockService<S> {
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone(), routes: self.routes.clone() }
    }
}

impl<S: fmt::Debug> fmt::Debug for MethodLockService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MethodLockService")
            .field("inner", &self.inner)
            .field("locked", &self.routes.iter().map(|(m, _)| &**m).collect::<Vec<_>>())
            .finish()
    }
}

/// Whether the request path `/package.Service/Method` is that of `method` (a name or a path).
fn matches(path: &str, method: &str) -> bool {
    if method.starts_with('/') {
        return path == method;
    }
    path.rsplit_once('/').is_some_and(|(_, name)| name == method)
}

impl<S, RB> Service<Request<Body>> for MethodLockService<S>
where
    S: Service<Request<Body>, Response = Response<RB>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
    RB: http_body::Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<crate::error::BoxError>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = RouteFuture;

    /// Always ready: each call waits for the readiness of the service it goes to (its route,
    /// or a clone of the inner service), as tower's `Steer` does.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let path = request.uri().path();
        if let Some((_, route)) = self.routes.iter().find(|(method, _)| matches(path, method)) {
            return route.0.oneshot(request);
        }
        let mut inner = self.inner.clone();
        Box::pin(async move {
            std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
            let response = inner.call(request).await?;
            Ok(response.map(Body::new))
        })
    }
}

/// A layered service of one method, with its body and future boxed.
struct BoxRoute(Box<dyn Route>);

trait Route: Send + Sync {
    /// Calls a clone of the service once it is ready.
    fn oneshot(&self, request: Request<Body>) -> RouteFuture;
}

impl<T, RB> Route for T
where
    T: Service<Request<Body>, Response = Response<RB>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    T::Future: Send + 'static,
    RB: http_body::Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<crate::error::BoxError>,
{
    fn oneshot(&self, request: Request<Body>) -> RouteFuture {
        let mut service = self.clone();
        Box::pin(async move {
            std::future::poll_fn(|cx| service.poll_ready(cx)).await?;
            let response = service.call(request).await?;
            Ok(response.map(Body::new))
        })
    }
}

/// A layered service keeps the name it is routed by.
impl<S: tonic::server::NamedService> tonic::server::NamedService for MethodLockService<S> {
    const NAME: &'static str = S::NAME;
}

#[cfg(test)]
mod tests {
    use super::matches;

    /// A rule names a method by its name or by its full path.
    #[test]
    fn method_names_and_paths() {
        assert!(matches("/bank.Bank/Withdraw", "Withdraw"));
        assert!(matches("/bank.Bank/Withdraw", "/bank.Bank/Withdraw"));
        assert!(!matches("/bank.Bank/Withdraw", "/other.Bank/Withdraw"));
        assert!(!matches("/bank.Bank/WithdrawAll", "Withdraw"));
        assert!(!matches("/bank.Bank/Withdraw", "draw"));
    }
}
