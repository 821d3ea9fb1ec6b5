//! `LockLayer` on a plain hyper server, no axum: the lock key comes from the `x-account`
//! header, with the prefix `account:` naming the resource it locks.
//!
//! ```text
//! cargo run --example hyper
//! ```

use std::{
    convert::Infallible,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::{
    client::legacy::Client,
    rt::{TokioExecutor, TokioIo},
    service::TowerToHyperService,
};
use tower::ServiceBuilder;
use tower_lock::{LockClient, LockLayer, key};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let locks = LockClient::in_memory();
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));

    let (now_inside, seen_overlaps) = (inside.clone(), overlaps.clone());
    let handler = tower::service_fn(move |_request: Request<Incoming>| {
        let (inside, overlaps) = (now_inside.clone(), seen_overlaps.clone());
        async move {
            if inside.fetch_add(1, Ordering::SeqCst) > 0 {
                overlaps.fetch_add(1, Ordering::SeqCst);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
            inside.fetch_sub(1, Ordering::SeqCst);
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"done"))))
        }
    });
    let service = ServiceBuilder::new()
        .layer(
            LockLayer::new(locks)
                // The lock "account:<id>", on whatever path: a prefixed key names its resource.
                .key(key::header("x-account").prefixed("account:"))
                .wait(Duration::from_secs(10)),
        )
        .service(handler);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    println!("serving on http://{addr}");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let service = TowerToHyperService::new(service.clone());
            tokio::spawn(async move {
                let connection = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service);
                if let Err(error) = connection.await {
                    eprintln!("connection error: {error}");
                }
            });
        }
    });

    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut requests = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let client = client.clone();
        let url = format!("http://{addr}/withdraw");
        requests.spawn(async move {
            let request = Request::post(url)
                .header("x-account", "42")
                .body(Empty::new())
                .expect("valid request");
            let response = client.request(request).await.expect("response");
            let status = response.status();
            let _ = response.into_body().collect().await;
            status
        });
    }
    let mut ok = 0;
    while let Some(status) = requests.join_next().await {
        ok += usize::from(status? == StatusCode::OK);
    }
    let missing = client
        .request(Request::post(format!("http://{addr}/withdraw")).body(Empty::new())?)
        .await?
        .status();
    println!(
        "50 requests on account 42: {ok} ok, {} ran at the same time as another; no key: {missing}",
        overlaps.load(Ordering::SeqCst)
    );
    Ok(())
}
