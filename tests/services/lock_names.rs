//! Which locks a layer and a `#[locked]` handler say they take, as their log lines (captured
//! for the test's thread by the binary's one subscriber, `support::logs`) show.
use crate::support;

use axum::{Extension, Router, extract::Path, routing::post};
use http::StatusCode;
use support::{
    http::{http, send, serve},
    logs::Logs,
};
use tower_lock::{AnyLockClient, LockClient, LockLayer, key, locked};

/// Deposits under `account:{id}`.
#[locked(key = "account:{id}")]
async fn deposit_named(Path(id): Path<u64>) -> String {
    format!("deposited to {id}")
}

/// Each layer and each handler says, with their first request, which locks it takes: a
/// layer's bare `path_param("id")` locks `/accounts/{id}` + the id, a handler's
/// `account:{id}` locks that name, so the two do not exclude each other, and the log shows it.
#[tokio::test(flavor = "current_thread")]
async fn layers_and_handlers_say_which_locks_they_take() {
    let (logs, _capturing) = Logs::capture();
    let locks = LockClient::in_memory();
    let app = Router::new()
        .route("/accounts/{id}/withdraw", post(|| async { "withdrawn" }))
        .route_layer(LockLayer::new(locks.clone()).key(key::path_param("id")))
        .route("/accounts/{id}/deposit", post(deposit_named))
        .layer(Extension(AnyLockClient::from(locks)));
    let base = serve(app).await;
    for _ in 0..2 {
        for route in ["withdraw", "deposit"] {
            let (status, _, _) = send(&http(), "POST", &format!("{base}/accounts/7/{route}")).await;
            assert_eq!(status, StatusCode::OK);
        }
    }
    let text = logs.text();
    let lines: Vec<&str> = text.lines().filter(|line| line.contains("tower_lock::names")).collect();
    println!("{lines:#?}");
    assert_eq!(lines.len(), 2, "one line each, at the first request:\n{text}");
    assert!(
        lines.iter().any(|line| line.contains("LockLayer")
            && line.contains("namespace=/accounts/{id}")
            && line.contains("route=/accounts/{id}/withdraw")),
        "the layer names its namespace:\n{text}"
    );
    assert!(
        lines.iter().any(|line| line.contains("#[locked]") && line.contains("`account:{id}`")),
        "the handler names its key:\n{text}"
    );
}
