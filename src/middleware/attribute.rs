//! Run-time support of the `#[locked]` attribute. Its expansion calls only what is here, through
//! `tower_lock::__private`; none of it is meant to be used directly.

use std::{convert::Infallible, future::Future, time::Duration};

pub use super::names::Announced;

use axum::{
    extract::{FromRef, FromRequestParts},
    response::IntoResponse,
};
use http::{StatusCode, request::Parts};
use tracing::Instrument;

use super::{
    LockContext, LockRejection,
    erased::{Acquire, AcquireAll, AnyLockClient},
};
use crate::{Holder, Lease, LockKind};

pub use axum::response::Response;

/// The attribute's options, checked at compile time.
#[derive(Debug)]
pub struct Options {
    /// How long to wait for the lock before answering 423; `None`: the client's.
    pub wait: Option<Duration>,
    /// The lease to hold it with; `None`: the client's.
    pub lease: Option<Lease>,
    /// Which lock to take.
    pub kind: LockKind,
    /// A semaphore's permits (`permits = N`; 0 for the other kinds).
    pub permits: u32,
    /// Whether to issue a fencing token.
    pub fencing: bool,
    /// The namespace of the key; from `resource` when `None`.
    pub name: Option<&'static str>,
    /// What the key template says of the resource it names.
    pub resource: Resource,
    /// Whether a lost lock cancels the handler (503) instead of letting it finish.
    pub abort_on_lost: bool,
    /// The key template (or templates, comma-separated), as written.
    pub template: &'static str,
    /// Whether the handler said which lock it takes.
    pub announced: Announced,
}

/// What a key template says of the resource it names, which decides the namespace of its lock
/// when the attribute has no `name`, the way a [`LockLayer`](super::LockLayer)'s key does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resource {
    /// The template has text of its own (`account:{id}`): it names the resource; no namespace.
    Named,
    /// The template is one path parameter (`{id}`): the route up to it (`/accounts/:id`).
    PathParam(&'static str),
    /// Anything else: the matched route, one lock per endpoint.
    Route,
}

/// What the attribute reads from the request before the handler's own extractors run.
#[derive(Debug)]
pub struct LockParts<P> {
    client: Option<AnyLockClient>,
    holder: Option<Holder>,
    route: String,
    /// The handler's state, when it has a `State<T>` argument.
    pub state: P,
}

/// A handler without a `State` argument: the client comes from the extensions only.
#[derive(Debug)]
pub struct Stateless;

/// The state type `T` of the handler's `State<T>` argument, extracted the same way.
#[derive(Debug)]
pub struct WithState<T>(pub T);

/// How [`LockParts`] gets its state part.
pub trait FromState<S> {
    /// Takes it from the router's state.
    fn from_state(state: &S) -> Self;
}

impl<S> FromState<S> for Stateless {
    fn from_state(_: &S) -> Self {
        Self
    }
}

impl<S, T: FromRef<S>> FromState<S> for WithState<T> {
    fn from_state(state: &S) -> Self {
        Self(T::from_ref(state))
    }
}

impl<S, P> FromRequestParts<S> for LockParts<P>
where
    S: Send + Sync,
    P: FromState<S> + Send,
{
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        // Under a `LockLayer`, its client: the one whose locks the request's holder holds.
        let layers =
            parts.extensions.get::<LockContext>().and_then(|context| context.client.as_ref());
        Ok(Self {
            client: layers.or_else(|| parts.extensions.get::<AnyLockClient>()).cloned(),
            holder: parts.extensions.get::<Holder>().cloned(),
            route: super::service::route(parts).to_owned(),
            state: P::from_state(state),
        })
    }
}

/// Finds a lock client in a state value of a concrete type, if the type provides one through
/// `FromRef`, or, for an `Arc<S>`, if `S` does, without making a missing implementation a
/// compile error: the expansion calls `(&&&&&&Probe(&state)).lock_client()` and method
/// resolution picks the first trait below whose bound holds.
pub mod probe {
    use std::sync::Arc;

    use axum::extract::FromRef;

    use super::AnyLockClient;
    use crate::{LockClient, MemoryBackend};

    /// The state is an `Arc<S>` whose `S` provides an [`AnyLockClient`].
    pub trait ViaSharedAny {
        /// The client.
        fn lock_client(self) -> Option<AnyLockClient>;
    }

    impl<S> ViaSharedAny for &&&&&&Probe<'_, Arc<S>>
    where
        AnyLockClient: FromRef<S>,
    {
        fn lock_client(self) -> Option<AnyLockClient> {
            Some(AnyLockClient::from_ref(&**self.0))
        }
    }

    /// The state is an `Arc<S>` whose `S` provides a `LockClient<MemoryBackend>`.
    pub trait ViaSharedMemory {
        /// The client.
        fn lock_client(self) -> Option<AnyLockClient>;
    }

    impl<S> ViaSharedMemory for &&&&&Probe<'_, Arc<S>>
    where
        LockClient<MemoryBackend>: FromRef<S>,
    {
        fn lock_client(self) -> Option<AnyLockClient> {
            Some(LockClient::<MemoryBackend>::from_ref(&**self.0).into())
        }
    }

    /// The state is an `Arc<S>` whose `S` provides a `LockClient<RedisBackend>`.
    pub trait ViaSharedRedis {
        /// The client.
        fn lock_client(self) -> Option<AnyLockClient>;
    }

    #[cfg(feature = "redis")]
    impl<S> ViaSharedRedis for &&&&Probe<'_, Arc<S>>
    where
        LockClient<crate::RedisBackend>: FromRef<S>,
    {
        fn lock_client(self) -> Option<AnyLockClient> {
            Some(LockClient::<crate::RedisBackend>::from_ref(&**self.0).into())
        }
    }

    /// A state value to look for a lock client in.
    #[derive(Debug)]
    pub struct Probe<'a, T>(pub &'a T);

    impl<T> Clone for Probe<'_, T> {
        fn clone(&self) -> Self {
            *self
        }
    }

    impl<T> Copy for Probe<'_, T> {}

    /// The state provides an [`AnyLockClient`].
    pub trait ViaAny {
        /// The client.
        fn lock_client(self) -> Option<AnyLockClient>;
    }

    impl<T> ViaAny for &&&Probe<'_, T>
    where
        AnyLockClient: FromRef<T>,
    {
        fn lock_client(self) -> Option<AnyLockClient> {
            Some(AnyLockClient::from_ref(self.0))
        }
    }

    /// The state provides a `LockClient<MemoryBackend>`.
    pub trait ViaMemory {
        /// The client.
        fn lock_client(self) -> Option<AnyLockClient>;
    }

    impl<T> ViaMemory for &&Probe<'_, T>
    where
        LockClient<MemoryBackend>: FromRef<T>,
    {
        fn lock_client(self) -> Option<AnyLockClient> {
            Some(LockClient::<MemoryBackend>::from_ref(self.0).into())
        }
    }

    /// The state provides a `LockClient<RedisBackend>`.
    pub trait ViaRedis {
        /// The client.
        fn lock_client(self) -> Option<AnyLockClient>;
    }

    #[cfg(feature = "redis")]
    impl<T> ViaRedis for &Probe<'_, T>
    where
        LockClient<crate::RedisBackend>: FromRef<T>,
    {
        fn lock_client(self) -> Option<AnyLockClient> {
            Some(LockClient::<crate::RedisBackend>::from_ref(self.0).into())
        }
    }

    /// The state provides no lock client.
    pub trait ViaNone {
        /// No client.
        fn lock_client(self) -> Option<AnyLockClient>;
    }

    impl<T> ViaNone for Probe<'_, T> {
        fn lock_client(self) -> Option<AnyLockClient> {
            None
        }
    }
}

/// Runs a handler body under its lock: finds the client, acquires the lock of `key` as the
/// request's holder, runs `body` in that holder's scope, and releases the lock before the
/// response is handed back. Lock failures answer as a [`LockLayer`](super::LockLayer) would.
pub async fn run<P, F, Fut, R>(
    parts: LockParts<P>,
    from_state: Option<AnyLockClient>,
    options: &'static Options,
    key: String,
    body: F,
) -> Response
where
    F: FnOnce(LockContext) -> Fut,
    Fut: Future<Output = R>,
    R: IntoResponse,
{
    run_with(parts, from_state, options, Keys::One(key), body).await
}

/// [`run`] for the set of locks of `keys` (`#[locked(keys = [...])]`), taken together as
/// [`LockClient::lock_all`](crate::LockClient::lock_all) takes them.
pub async fn run_all<P, F, Fut, R>(
    parts: LockParts<P>,
    from_state: Option<AnyLockClient>,
    options: &'static Options,
    keys: Vec<String>,
    body: F,
) -> Response
where
    F: FnOnce(LockContext) -> Fut,
    Fut: Future<Output = R>,
    R: IntoResponse,
{
    run_with(parts, from_state, options, Keys::Set(keys), body).await
}

/// The handler's key or keys.
enum Keys {
    One(String),
    Set(Vec<String>),
}

/// Says once per route that a `key = "{param}"` names no segment of the matched route: its lock
/// is then the route's, not shared with the other routes of the resource.
fn report_route_without(param: &str, route: &str) {
    static REPORTED: crate::key::RouteReports = crate::key::RouteReports::new();
    if !route.is_empty() && REPORTED.first(route) {
        tracing::warn!(
            param,
            route,
            "#[locked]: the key is one binding, but the route has no path parameter of that name: the lock is per route; name the resource instead (`key = \"account:{{id}}\"`) or match the route's name"
        );
    }
}

async fn run_with<P, F, Fut, R>(
    parts: LockParts<P>,
    from_state: Option<AnyLockClient>,
    options: &'static Options,
    keys: Keys,
    body: F,
) -> Response
where
    F: FnOnce(LockContext) -> Fut,
    Fut: Future<Output = R>,
    R: IntoResponse,
{
    let Some(locks) = parts.client.or(from_state) else {
        tracing::error!(
            target: "tower_lock::rejection",
            "#[locked] handler found no lock client: run it under a `LockLayer`, add an \
             extension (`.layer(Extension(AnyLockClient::from(locks)))`), or give it a \
             `State<T>` argument where `AnyLockClient` or `LockClient<_>` implements `FromRef<T>` \
             (or `FromRef<S>`, for a `State<Arc<S>>`)"
        );
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            "lock misconfigured on the server (see its log)",
        )
            .into_response();
    };
    let namespace = match (options.name, options.resource) {
        (Some(name), _) => name.to_owned(),
        (None, Resource::Named) => String::new(),
        (None, Resource::PathParam(param)) => crate::key::route_through_param(&parts.route, param)
            .unwrap_or_else(|| {
                report_route_without(param, &parts.route);
                parts.route.clone()
            }),
        (None, Resource::Route) => parts.route.clone(),
    };
    if options.announced.is_first() {
        super::names::handler_takes(&parts.route, options.template, &namespace, options.kind);
    }
    let (span, acquire) = match keys {
        Keys::One(key) => {
            let key = match locks.key_in(&namespace, key.as_bytes(), options.kind) {
                Ok(key) => key,
                Err(error) => return rejected(LockRejection::InvalidKey(error)),
            };
            let span = tracing::debug_span!("locked_handler", key = %key);
            let acquire = locks.acquire(Acquire {
                key,
                kind: options.kind,
                wait: options.wait,
                lease: options.lease,
                fencing: options.fencing,
                permits: options.permits,
            });
            (span, acquire)
        }
        Keys::Set(keys) => {
            let named = keys
                .into_iter()
                .map(|key| {
                    // Base names: the set's request adds the read-write (or semaphore) suffix
                    // for its kind.
                    let name = locks.key_in(&namespace, key.as_bytes(), LockKind::Exclusive)?;
                    Ok((key.into_bytes(), name))
                })
                .collect::<Result<Vec<_>, _>>();
            let keys = match named {
                Ok(keys) => keys,
                Err(error) => return rejected(LockRejection::InvalidKey(error)),
            };
            let span = tracing::debug_span!("locked_handler", keys = keys.len());
            let acquire = locks.acquire_all(AcquireAll {
                keys,
                kind: options.kind,
                wait: options.wait,
                lease: options.lease,
                fencing: options.fencing,
                permits: options.permits,
            });
            (span, acquire)
        }
    };
    async move {
        // The request's holder (set by a `LockLayer`) re-enters what the layer holds.
        let acquired = match parts.holder.or_else(Holder::current) {
            Some(holder) => holder.scope(acquire).await,
            None => acquire.await,
        };
        let guard = match acquired {
            Ok(guard) => guard,
            Err(error) => return rejected(error.into()),
        };
        let context = guard.context();
        let lost = context.lost();
        let watch = context.clone();
        let body = guard.holder().scope(body(context));
        let response = if options.abort_on_lost {
            // The lock is checked before every poll of the body, against the clock too: a
            // body resumed after a stall past the lease must not run on before the watchdog
            // notices. `None`: lost; the body is dropped and the guard releases in the
            // background.
            let mut body = std::pin::pin!(body);
            let mut lost = std::pin::pin!(lost);
            let finished = std::future::poll_fn(|cx| {
                if watch.is_lost() || lost.as_mut().poll(cx).is_ready() {
                    return std::task::Poll::Ready(None);
                }
                body.as_mut().poll(cx).map(Some)
            })
            .await;
            // Finished after the lease's deadline, before the watchdog said so: the response
            // was not made under the lock.
            match finished {
                Some(result) if !watch.is_lost() => result.into_response(),
                _ => {
                    drop(guard);
                    return rejected(LockRejection::Lost);
                }
            }
        } else {
            body.await.into_response()
        };
        if let Err(error) = guard.release().await {
            tracing::debug!(error = %format_args!("{error:#}"), "release after the handler failed");
        }
        response
    }
    .instrument(span)
    .await
}

fn rejected(rejection: LockRejection) -> Response {
    rejection.trace(false);
    rejection.into_response()
}
