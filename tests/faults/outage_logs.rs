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
    let backend = support::redis_backend(server.url()).connect().await.unwrap();
    let locks = LockClient::builder(backend).build().unwrap();
    let app = Router::new().route("/docs/{id}", post(|| async { "ok" })).route_layer(
        LockLayer::new(locks).key(key::path_param("id")).wait(Duration::from_secs(20)),
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
    let warnings: Vec<&str> = text.lines().filter(|line| line.contains(" WARN ")).collect();
    println!("outage of 5 requests: {} warning(s): {warnings:#?}", warnings.len());
    assert_eq!(warnings.len(), 1, "one warning per outage:\n{text}");
    assert!(
        warnings[0].contains(&address) && warnings[0].contains("refused"),
        "the warning names the server and the cause:\n{text}"
    );
    let ended: Vec<&str> =
        text.lines().filter(|line| line.contains("lock store answers again")).collect();
    assert_eq!(ended.len(), 1, "one line when it ends:\n{text}");
    assert!(ended[0].contains(&address), "{text}");
}

/// A server that stops answering on an idle client is one incident, ended by the background
/// probe once the server answers again, not by the client's next command (none is sent).
#[tokio::test(flavor = "current_thread")]
async fn a_pause_on_an_idle_client_ends_when_the_server_is_back() {
    let (logs, _capturing) = Logs::capture();
    let server = RedisServer::start();
    let backend = support::redis_backend(server.url())
        .command_timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let locks = LockClient::builder(backend).build().unwrap();
    server.pause();
    let refused = locks.lock("doc").try_acquire().await;
    assert!(refused.is_err(), "a paused server grants nothing");
    let paused = Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    server.resume();
    let resumed = Instant::now();
    let ended = loop {
        let text = logs.text();
        if let Some(line) = text.lines().find(|l| l.contains("lock store answers again")) {
            break line.to_owned();
        }
        assert!(resumed.elapsed() < Duration::from_secs(20), "the incident never ended:\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let lasted: u64 = ended
        .split("lasted_ms=")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("no lasted_ms in {ended}"));
    // The probe looks at least every second, each look bounded by the command timeout: the
    // incident ends within about that of the resume, while the client sent nothing.
    let bound = paused.elapsed() + Duration::from_secs(1);
    assert!(
        Duration::from_millis(lasted) <= bound,
        "lasted_ms={lasted}, the pause and the probe's look {bound:?}"
    );
    let warnings = logs.text().lines().filter(|l| l.contains(" WARN ")).count();
    assert_eq!(warnings, 1, "one warning per incident:\n{}", logs.text());
}

/// A quarantine after a restart is one warning naming the server, however many acquires it
/// holds back.
#[tokio::test(flavor = "current_thread")]
async fn a_quarantine_is_one_warning_naming_the_server() {
    let (logs, _capturing) = Logs::capture();
    let mut server = RedisServer::start();
    let address = format!("127.0.0.1:{}", server.port());
    let backend = tower_lock::RedisBackend::builder(server.url())
        .quarantine(Duration::from_secs(3))
        .connect()
        .await
        .unwrap();
    let locks = LockClient::builder(backend)
        .lease(tower_lock::Lease::watchdog(Duration::from_secs(2)))
        .build()
        .unwrap();
    server.kill();
    server.restart();
    let mut held_back = 0;
    let started = Instant::now();
    while held_back < 5 {
        assert!(started.elapsed() < Duration::from_secs(3), "{}", logs.text());
        if let Err(tower_lock::LockError::Backend(error)) =
            locks.lock(format!("doc{held_back}")).try_acquire().await
            && error.retry_after().is_some()
        {
            held_back += 1;
        }
    }
    let text = logs.text();
    let warnings: Vec<&str> =
        text.lines().filter(|l| l.contains(" WARN ") && l.contains("forgotten grants")).collect();
    assert_eq!(warnings.len(), 1, "one warning per quarantine:\n{text}");
    assert!(warnings[0].contains(&address), "the warning names the server:\n{text}");
}
