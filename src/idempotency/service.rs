//! [`IdempotencyService`]: what is decided before anything is awaited.

use std::{
    fmt, mem,
    sync::Arc,
    task::{Context, Poll},
};

use http::{HeaderValue, Request, Response, header::CONTENT_LENGTH, request::Parts};
use tower_service::Service;

use super::{
    RequestBody, ResponseBody, ResponseFuture,
    layer::{Scope, Shared},
    rejection::{InvalidKey, Rejection},
};

/// The service made by [`IdempotencyLayer`](super::IdempotencyLayer).
///
/// ```
/// use std::convert::Infallible;
///
/// use http::{Request, Response};
/// use tower::{Layer, service_fn};
/// use tower_lock::{LockClient, idempotency::{IdempotencyLayer, MemoryAnswerStore, RequestBody}};
///
/// let layer = IdempotencyLayer::new(LockClient::in_memory(), MemoryAnswerStore::new());
/// let service = layer.layer(service_fn(|_: Request<RequestBody<String>>| async {
///     Ok::<_, Infallible>(Response::new(String::from("created")))
/// }));
/// let inner = service.into_inner(); // the service without the layer
/// # let _ = inner;
/// ```
pub struct IdempotencyService<S> {
    pub(crate) inner: S,
    pub(crate) shared: Arc<Shared>,
}

impl<S> IdempotencyService<S> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, without the layer.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

/// No `Send` or `'static` bounds on the inner service, its future or the bodies: what is boxed
/// (a store call, an acquire) holds neither. `S: Clone`: the ready service goes with the
/// request, a clone stays for the next `poll_ready`.
impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for IdempotencyService<S>
where
    S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>> + Clone,
    ReqBody: http_body::Body,
    ResBody: http_body::Body,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let clone = self.inner.clone();
        let inner = mem::replace(&mut self.inner, clone);
        let shared = &self.shared;
        let config = &shared.config;
        let (parts, body) = request.into_parts();
        let grpc = is_grpc(&parts);
        let reject = |rejection: Rejection| {
            ResponseFuture::rejected(rejection.into_response(&config.header_text, grpc))
        };
        if !config.methods.contains(&parts.method) {
            return ResponseFuture::passed(inner, Request::from_parts(parts, body));
        }
        let key = match key(&parts, config) {
            Ok(Some(key)) => key,
            Ok(None) if config.required => return reject(Rejection::MissingKey),
            Ok(None) => return ResponseFuture::passed(inner, Request::from_parts(parts, body)),
            Err(invalid) => return reject(Rejection::InvalidKey(invalid)),
        };
        let scope = match &config.scope {
            Scope::Authorization => parts
                .headers
                .get(http::header::AUTHORIZATION)
                .map(|value| value.as_bytes().to_vec()),
            Scope::By(scope) => scope(&parts),
            Scope::Unscoped => None,
        };
        let scope = match scope {
            Some(scope) if !scope.is_empty() => Some(scope),
            _ if matches!(config.scope, Scope::Unscoped) => None,
            _ => return reject(Rejection::NoScope),
        };
        let lock_key = match shared.lock_key(scope.as_deref(), key.as_bytes()) {
            Ok(lock_key) => lock_key,
            // Only a key too long for the lock client, which the build-time check rules out
            // unless the client hashes names (then it never refuses).
            Err(_) => {
                return reject(Rejection::InvalidKey(InvalidKey::TooLong {
                    max: config.max_key_len,
                }));
            }
        };
        if config.fingerprint.covers_body()
            && content_length(&parts).is_some_and(|len| len > config.max_request_body as u64)
        {
            return reject(Rejection::TooLarge { limit: config.max_request_body });
        }
        ResponseFuture::keyed(inner, parts, body, key.into(), lock_key, grpc, shared.clone())
    }
}

/// The request's key: `None` when it has none, an error when it has one the layer refuses.
fn key(parts: &Parts, config: &super::layer::Config) -> Result<Option<String>, InvalidKey> {
    let mut values = parts.headers.get_all(&config.header).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(InvalidKey::Repeated);
    }
    valid_key(value, config.max_key_len).map(Some)
}

/// The key a header value carries, as sent: visible ASCII and spaces, not empty, at most `max`
/// bytes. (A quoted string of the IETF draft's form keeps its quotes: a client that sends its
/// keys one way always finds them.)
fn valid_key(value: &HeaderValue, max: usize) -> Result<String, InvalidKey> {
    let bytes = value.as_bytes();
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(InvalidKey::Empty);
    }
    if bytes.len() > max {
        return Err(InvalidKey::TooLong { max });
    }
    if !bytes.iter().all(|&b| b == b' ' || b.is_ascii_graphic()) {
        return Err(InvalidKey::Bytes);
    }
    // Only visible ASCII and spaces: valid UTF-8.
    String::from_utf8(bytes.to_vec()).map_err(|_| InvalidKey::Bytes)
}

/// Whether the request is a gRPC call (`content-type: application/grpc…`): its refusals are
/// answered as gRPC statuses.
fn is_grpc(parts: &Parts) -> bool {
    parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/grpc"))
}

fn content_length(parts: &Parts) -> Option<u64> {
    parts.headers.get(CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

impl<S: Clone> Clone for IdempotencyService<S> {
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone(), shared: self.shared.clone() }
    }
}

impl<S: fmt::Debug> fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("inner", &self.inner)
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

/// A layered tonic service keeps the name it is routed by:
/// `Server::builder().add_service(layer.layer(GreeterServer::new(greeter)))`.
#[cfg(feature = "tonic")]
impl<S: tonic::server::NamedService> tonic::server::NamedService for IdempotencyService<S> {
    const NAME: &'static str = S::NAME;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys are taken as sent when they are visible ASCII (spaces inside allowed), within the
    /// length limit and not empty.
    #[test]
    fn keys() {
        let check = |value: &[u8]| valid_key(&HeaderValue::from_bytes(value).unwrap(), 8);
        assert_eq!(check(b"order-7").as_deref(), Ok("order-7"));
        assert_eq!(check(b"\"a b\"").as_deref(), Ok("\"a b\""));
        assert_eq!(check(b""), Err(InvalidKey::Empty));
        assert_eq!(check(b"   "), Err(InvalidKey::Empty));
        assert_eq!(check(b"123456789"), Err(InvalidKey::TooLong { max: 8 }));
        assert_eq!(check(b"a\tb"), Err(InvalidKey::Bytes));
        assert_eq!(check("é".as_bytes()), Err(InvalidKey::Bytes));
        assert_eq!(check(b"\x80"), Err(InvalidKey::Bytes));
    }
}
