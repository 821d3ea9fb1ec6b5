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
    let request = http::Request::builder()
        .method(method)
        .uri(url)
        .body(Empty::new())
        .unwrap();
    let response = http.request(request).await.unwrap();
    let status = response.status();
    let retry = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, retry, String::from_utf8_lossy(&body).into_owned())
}
