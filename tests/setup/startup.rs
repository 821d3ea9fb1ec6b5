//! A misconfigured or unreachable Redis fails at start-up (`connect`), with an error that
//! names what to fix and the host it tried, each cause printed once by an error reporter.

use crate::support;

use std::{error::Error, fmt::Write as _, net::TcpListener};

use support::RedisServer;
use tower_lock::{RedisBackend, error::BackendErrorKind};

/// The error and its sources, one per line, as `anyhow` prints them.
fn report(error: &dyn Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let _ = write!(text, "\ncaused by: {cause}");
        source = cause.source();
    }
    text
}

/// The report of `error`, which must be a misconfiguration.
fn misconfigured(error: &tower_lock::BackendError) -> String {
    let text = report(error);
    println!("{text}");
    assert!(matches!(error.kind(), BackendErrorKind::Misconfigured { .. }), "{text}");
    text
}

/// A port nothing listens on.
fn refused_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

#[tokio::test]
async fn a_refused_port_names_the_host() {
    let port = refused_port();
    let error = RedisBackend::connect(&format!("redis://127.0.0.1:{port}"))
        .await
        .expect_err("nothing listens there");
    let text = report(&error);
    println!("{text}");
    assert_eq!(*error.kind(), BackendErrorKind::Unavailable, "{text}");
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert_eq!(text.matches("refused").count(), 1, "the cause repeats: {text}");
}

#[tokio::test]
async fn a_bad_url_scheme_is_a_misconfiguration() {
    let error = RedisBackend::connect("http://127.0.0.1:6379").await.expect_err("not a Redis URL");
    let text = misconfigured(&error);
    assert!(text.contains("redis://"), "does not say what a URL looks like: {text}");
}

#[tokio::test]
async fn a_wrong_password_is_a_misconfiguration() {
    let server = RedisServer::start();
    server.acl_setuser("service", &["on", ">right", "~*", "+@all"]);
    let url = server.url_as("service", "wrong");
    let error = RedisBackend::connect(&url).await.expect_err("wrong password");
    let text = misconfigured(&error);
    assert!(text.contains(&format!("127.0.0.1:{}", server.port())), "{text}");
    assert!(!text.contains("wrong"), "the password leaked: {text}");
}

#[tokio::test]
async fn a_bad_database_index_is_a_misconfiguration() {
    let server = RedisServer::start();
    let url = format!("redis://127.0.0.1:{}/99", server.port());
    let error = RedisBackend::connect(&url).await.expect_err("no database 99");
    let text = misconfigured(&error);
    assert!(text.contains("database"), "{text}");
}

/// An application's pool: `connect` checks that it reaches Redis, so a refused port fails at
/// start-up naming the host, not later as unexplained 503s.
#[tokio::test]
async fn an_application_pool_that_reaches_nothing_fails_at_start_up() {
    use tower_lock::backend::redis::{bb8, bb8_redis::RedisConnectionManager};

    let url = format!("redis://127.0.0.1:{}", refused_port());
    let manager = RedisConnectionManager::new(url.as_str()).expect("manager");
    let pool = bb8::Pool::builder()
        .connection_timeout(std::time::Duration::from_millis(300))
        .build_unchecked(manager);
    let error =
        RedisBackend::builder(&url).pool(pool).connect().await.expect_err("nothing listens there");
    let text = report(&error);
    println!("{text}");
    assert_eq!(error.kind(), &BackendErrorKind::Unavailable, "{text}");
    assert!(text.contains(&url["redis://".len()..]), "{text}");
}

/// An application's pool takes the builder's settings: its commands time out after the
/// builder's command timeout (here against a server frozen with SIGSTOP).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_pool_keeps_the_command_timeout() {
    use std::time::{Duration, Instant};
    use tower_lock::{
        LockClient, LockError,
        backend::redis::{bb8, bb8_redis::RedisConnectionManager},
    };

    let server = RedisServer::start();
    let manager = RedisConnectionManager::new(server.url()).expect("manager");
    let pool = bb8::Pool::builder().test_on_check_out(false).build(manager).await.expect("pool");
    let backend = support::redis_backend(server.url())
        .pool(pool)
        .command_timeout(Duration::from_millis(200))
        .connect()
        .await
        .expect("connect");
    let locks = LockClient::builder(backend).build().expect("client");
    server.pause();
    let started = Instant::now();
    let result = locks.lock("k").try_acquire().await;
    server.resume();
    assert!(
        matches!(&result, Err(LockError::Backend(error)) if error.kind() == &BackendErrorKind::Timeout),
        "{result:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
}
