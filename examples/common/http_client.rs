//! A tiny HTTP client on hyper, enough for the demos (each uses part of it).
#![allow(dead_code)]

use http_body_util::Full;
use hyper::body::Bytes;
use hyper_util::{
    client::legacy::{Client as Legacy, connect::HttpConnector},
    rt::TokioExecutor,
};

/// The error a request can end with.
pub(crate) type Error = Box<dyn std::error::Error + Send + Sync>;

#[derive(Clone)]
pub(crate) struct Client(Legacy<HttpConnector, Full<Bytes>>);

impl Client {
    pub(crate) fn new() -> Self {
        Self(Legacy::builder(TokioExecutor::new()).build_http())
    }

    /// POSTs to `url` without a body; returns the status code.
    pub(crate) async fn post(&self, url: &str) -> Result<u16, Error> {
        let request = http::Request::post(url).body(Full::default())?;
        Ok(self.0.request(request).await?.status().as_u16())
    }

    /// POSTs `body` as JSON to `url`; returns the status code.
    pub(crate) async fn post_json(&self, url: &str, body: String) -> Result<u16, Error> {
        let request = http::Request::post(url)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))?;
        Ok(self.0.request(request).await?.status().as_u16())
    }
}
