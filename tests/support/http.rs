//! Loopback HTTP for end-to-end tests: serve an axum router on a free port and send it
//! requests with a hyper client.

use axum::Router;
use http::StatusCode;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::{client::legacy::Client as HttpClient, rt::TokioExecutor};

/// A plain HTTP/1 client.
pub type Http = HttpClient<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>;

/// A new client.
pub fn http() -> Http {
    HttpClient::builder(TokioExecutor::new()).build_http()
}

/// Serves `app` on a free loopback port; returns its base URL.
pub async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// Sends a request; returns the status, the `Retry-After` header and the body.
pub async fn send(http: &Http, method: &str, url: &str) -> (StatusCode, Option<String>, String) {
    let request = http::Request::builder().method(method).uri(url).body(Empty::new()).unwrap();
    let response = http.request(request).await.unwrap();
    let status = response.status();
    let retry = response.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, retry, String::from_utf8_lossy(&body).into_owned())
}

/// POSTs `body` as JSON to `url`; returns the status and the body.
pub async fn post_json(url: &str, body: impl Into<Bytes>) -> (StatusCode, String) {
    let request = http::Request::post(url)
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(body.into()))
        .unwrap();
    let client = HttpClient::builder(TokioExecutor::new()).build_http();
    let response = client.request(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// Tells a test that a handler was entered (so it runs under its lock): the handler takes
/// `Extension<Entered>` and calls [`Entered::signal`]; the test awaits the receiver instead of
/// polling for the lock.
#[derive(Clone, Debug)]
pub struct Entered(tokio::sync::mpsc::UnboundedSender<()>);

impl Entered {
    /// A signal and the receiver its entries arrive on.
    pub fn channel() -> (Self, tokio::sync::mpsc::UnboundedReceiver<()>) {
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        (Self(sender), receiver)
    }

    /// Says the handler is in.
    pub fn signal(&self) {
        let _ = self.0.send(());
    }
}

/// Sends one request to `url` that finishes (so the route has seen a whole hold), then one
/// that holds the lock while a third waits for it in vain, and asserts what the third hears:
/// 423 with `Retry-After: 2` and a text body saying so (the handler holds for 1.5 s under a
/// longer lease), while the holder answers 200. The handler signals each entry on `entries`.
pub async fn assert_told_the_likely_wait(
    url: &str,
    entries: &mut tokio::sync::mpsc::UnboundedReceiver<()>,
) {
    let (status, _, _) = send(&http(), "POST", url).await;
    assert_eq!(status, StatusCode::OK, "the first request");
    entries.recv().await.expect("the first request entered");
    let holder = tokio::spawn({
        let url = url.to_owned();
        async move { send(&http(), "POST", &url).await }
    });
    entries.recv().await.expect("the holder entered");
    let (status, retry_after, body) = send(&http(), "POST", url).await;
    assert_eq!(status, StatusCode::LOCKED);
    assert_eq!(retry_after.as_deref(), Some("2"), "body: {body}");
    assert_eq!(body, "locked; retry in about 2 s\n");
    assert_eq!(holder.await.unwrap().0, StatusCode::OK, "the holder");
}
