//! Checks of the test fixture itself (`tests/support`): the `redis-server` it starts answers,
//! comes back empty on the same port after a restart, keeps extra options, and can be paused and
//! resumed.

use crate::support;

use std::{
    io::{self, BufRead, BufReader, Write},
    net::TcpStream,
    time::Duration,
};

use support::{RedisServer, RespValue};

/// Connects, sends an inline `PING` and returns the reply line, waiting at most `timeout` for it.
fn raw_ping(port: u16, timeout: Duration) -> io::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.write_all(b"PING\r\n")?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line)?;
    Ok(line.trim_end().to_owned())
}

#[test]
fn starts_and_answers_ping() {
    let server = RedisServer::start();
    assert_ne!(server.port(), 0);
    assert_eq!(server.url(), format!("redis://127.0.0.1:{}", server.port()));
    assert_eq!(server.cmd(&["PING"]), RespValue::Simple("PONG".to_owned()));
    assert_eq!(raw_ping(server.port(), Duration::from_secs(5)).expect("raw PING"), "+PONG");
    assert_eq!(server.cmd(&["INCR", "n"]).as_int(), 1);
    // `DEBUG` is allowed from loopback, for tests that need it.
    assert_eq!(server.cmd(&["DEBUG", "SLEEP", "0"]), RespValue::Simple("OK".to_owned()));
}

#[test]
fn restart_keeps_the_port_and_loses_the_data() {
    let mut server = RedisServer::start();
    let port = server.port();
    assert_eq!(server.cmd(&["SET", "k", "v"]).as_str().as_deref(), Some("OK"));
    assert_eq!(server.cmd(&["GET", "k"]), RespValue::Bulk(Some(b"v".to_vec())));

    server.restart();

    assert_eq!(server.port(), port);
    assert_eq!(server.cmd(&["GET", "k"]), RespValue::Bulk(None));
    assert_eq!(server.cmd(&["DBSIZE"]).as_int(), 0);
}

#[test]
fn pause_stops_answers_until_resume() {
    let server = RedisServer::start();
    server.pause();
    let err = raw_ping(server.port(), Duration::from_millis(200))
        .expect_err("a paused server must not answer");
    assert!(
        matches!(err.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut),
        "expected a read timeout, got {err:?}"
    );

    server.resume();
    assert_eq!(
        raw_ping(server.port(), Duration::from_secs(5)).expect("PING after resume"),
        "+PONG"
    );
}

/// The value of one configuration parameter.
fn config_get(server: &RedisServer, name: &str) -> Option<String> {
    match server.cmd(&["CONFIG", "GET", name]) {
        RespValue::Array(Some(items)) if items.len() == 2 => items[1].as_str(),
        other => panic!("unexpected CONFIG GET reply {other:?}"),
    }
}

#[test]
fn extra_options_apply_and_survive_a_restart() {
    let mut server = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    assert_eq!(config_get(&server, "maxmemory-policy").as_deref(), Some("allkeys-lru"));
    assert!(server.dir().join("redis.log").exists());

    server.restart();
    assert_eq!(config_get(&server, "maxmemory-policy").as_deref(), Some("allkeys-lru"));
}
