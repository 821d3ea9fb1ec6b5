//! §4.4 TLS and passwords: `rediss://` against a TLS `redis-server` whose CA is made at test
//! start works with that CA; another CA, or plain text to the TLS port, fails fast with a
//! typed error; passwords appear neither in `Debug` output nor in the crate's logs.
use crate::support;
#[path = "../support/tls.rs"]
mod tls_support;

use std::{
    io::Write,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use tls_support::{TlsFiles, start_tls_server, start_tls_server_with};
use tokio::time::{Instant, timeout};
use tower_lock::{BackendError, LockClient, RedisBackend, backend::redis::redis::TlsCertificates};

fn trusting(root_cert: Vec<u8>) -> TlsCertificates {
    TlsCertificates { client_tls: None, root_cert: Some(root_cert) }
}

async fn connect(url: String, roots: Option<Vec<u8>>) -> Result<RedisBackend, BackendError> {
    let mut builder = support::redis_backend(url);
    if let Some(roots) = roots {
        builder = builder.tls_certificates(trusting(roots));
    }
    builder.connect().await
}

/// With the test CA trusted, locks work over TLS, waits through pub/sub included.
#[tokio::test]
async fn right_ca_works() {
    let files = TlsFiles::generate();
    let (server, tls_port) = start_tls_server(&files);
    let url = format!("rediss://127.0.0.1:{tls_port}");
    let a = LockClient::builder(connect(url.clone(), Some(files.read("ca.crt"))).await.expect("a"))
        .build()
        .unwrap();
    let b = LockClient::builder(connect(url, Some(files.read("ca.crt"))).await.expect("b"))
        .build()
        .unwrap();
    let held = a.lock("k").acquire().await.expect("acquire over TLS");
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.lock("k").acquire().await })
    };
    while b.waiters() != 1 {
        tokio::task::yield_now().await;
    }
    held.release().await.expect("release");
    waiter.await.unwrap().expect("woken over TLS").release().await.unwrap();
    let clients = server.cmd(&["INFO", "clients"]).as_str().unwrap();
    assert!(clients.contains("connected_clients:"), "{clients}");
}

/// A server certificate from another CA (or with only the system roots) is refused at
/// connect, fast, with an `Unavailable` error.
#[tokio::test]
async fn wrong_ca_fails_fast() {
    let files = TlsFiles::generate();
    let (_server, tls_port) = start_tls_server(&files);
    let url = format!("rediss://127.0.0.1:{tls_port}");
    for roots in [Some(files.make_ca("other")), None] {
        let started = Instant::now();
        let result =
            timeout(Duration::from_secs(2), connect(url.clone(), roots)).await.expect("no hang");
        let error = result.expect_err("an untrusted server certificate is refused");
        assert!(error.is_unavailable(), "{error:?}");
        assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
    }
}

/// Plain text to the TLS port fails within the command timeout rather than hanging.
#[tokio::test]
async fn plain_text_to_the_tls_port_fails() {
    let files = TlsFiles::generate();
    let (_server, tls_port) = start_tls_server(&files);
    let started = Instant::now();
    let result =
        timeout(Duration::from_secs(3), connect(format!("redis://127.0.0.1:{tls_port}"), None))
            .await
            .expect("no hang");
    let error = result.expect_err("plain text is not TLS");
    assert!(error.is_unavailable() || error.is_timeout(), "{error:?}");
    assert!(started.elapsed() < Duration::from_millis(1500), "{:?}", started.elapsed());
}

/// A server that requires client certificates refuses a client without one, at once.
#[tokio::test]
async fn missing_client_certificate_fails_fast() {
    let files = TlsFiles::generate();
    let (_server, tls_port) = start_tls_server_with(&files, "yes");
    let started = Instant::now();
    let result = timeout(
        Duration::from_secs(3),
        connect(format!("rediss://127.0.0.1:{tls_port}"), Some(files.read("ca.crt"))),
    )
    .await
    .expect("no hang");
    let error = result.expect_err("no client certificate");
    assert!(error.is_unavailable(), "{error:?}");
    assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
}

/// A log sink for this test's thread.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Passwords in URLs show in no `Debug` output, error or log line (TRACE level), on success
/// and on failure.
#[tokio::test]
async fn passwords_are_redacted() {
    const PASSWORD: &str = "pw-b5e1d0c7";
    let captured = Captured::default();
    let sink = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || sink.clone())
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);

    let server = support::RedisServer::start();
    server.acl_setuser("app", &["on", &format!(">{PASSWORD}"), "~*", "&*", "+@all"]);
    let url = server.url_as("app", PASSWORD);
    let builder = support::redis_backend(url.clone());
    let mut shown = vec![format!("{builder:?}")];
    let backend = builder.connect().await.expect("connect with the password");
    shown.push(format!("{backend:?}"));
    let locks = LockClient::builder(backend).build().unwrap();
    shown.push(format!("{locks:?}"));
    let held = locks.lock("k").acquire().await.unwrap();
    let busy = locks.lock("k").wait(Duration::from_millis(50)).acquire().await;
    shown.push(format!("{busy:?}"));
    held.release().await.unwrap();

    let wrong = url.replace(PASSWORD, &format!("{PASSWORD}-wrong"));
    let failed = RedisBackend::connect(&wrong).await.expect_err("wrong password");
    tracing::error!(error = %failed, "connect failed");
    shown.push(format!("{failed:?}"));
    shown.push(failed.to_string());
    shown.push(format!("{:?}", support::redis_backend(wrong)));

    let logs = String::from_utf8_lossy(&captured.0.lock().unwrap()).into_owned();
    assert!(logs.contains("connect failed"), "the capture works: {logs}");
    for text in shown.iter().chain([&logs]) {
        assert!(!text.contains(PASSWORD), "password shown: {text}");
    }
    assert!(shown[0].contains("app:***@127.0.0.1"), "{}", shown[0]);
}
