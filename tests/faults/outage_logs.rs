//! What an outage of the lock store logs (captured for the test's thread by the binary's one
//! subscriber, `support::logs`).

use crate::support;

use std::time::{Duration, Instant};

use axum::{Router, routing::post};
use http::StatusCode;
use support::{
    RedisServer,
    http::{http, send, serve},
    logs::Logs,
};
use tower_lock::{LockClient, LockLayer, key};

/// An outage is one warning naming the server and its cause, however many requests fail
/// meanwhile, and one line when it ends; the requests' 503s are not warnings of their own.
#[tokio::test(flavor = "current_thread")]
async fn an_outage_is_one_warning_naming_the_server() {
    let (logs, _capturing) = Logs::capture();
    let mut server = RedisServer::start();
    let address = format!("127.0.0.1:{}", server.port());
    let backend = support::redis_backend(server.url())
        .connect()
        .await
        .unwrap();
    let locks = LockClient::builder(backend).build().unwrap();
    let app = Router::new()
        .route("/docs/{id}", post(|| async { "ok" }))
        .route_layer(
            LockLayer::new(locks)
                .key(key::path_param("id"))
                .wait(Duration::from_secs(20)),
        );
    let url = format!("{}/docs/7", serve(app).await);
    assert_eq!(send(&http(), "POST", &url).await.0, StatusCode::OK);
    server.kill();
    for _ in 0..5 {
        let (status, _, _) = send(&http(), "POST", &url).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    }
    server.restart();
    let back = Instant::now();
    while send(&http(), "POST", &url).await.0 != StatusCode::OK {
        assert!(back.elapsed() < Duration::from_secs(5), "{}", logs.text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let text = logs.text();
    let warnings: Vec<&str> = text
        .lines()
        .filter(|line| line.contains(" WARN "))
        .collect();
    println!(
        "outage of 5 requests: {} warning(s): {warnings:#?}",
        warnings.len()
    );
    assert_eq!(warnings.len(), 1, "one warning per outage:\n{text}");
    assert!(
        warnings[0].contains(&address) && warnings[0].contains("refused"),
        "the warning names the server and the cause:\n{text}"
    );
    let ended: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("lock store answers again"))
        .collect();
    assert_eq!(ended.len(), 1, "one line when it ends:\n{text}");
    assert!(ended[0].contains(&address), "{text}");
}
