//! What a redis-rs error means for the engine, and the errors of a first connection.

use std::{fmt, time::Duration};

use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::error::{BackendError, BackendErrorKind};

/// Maps a redis-rs error to what the engine needs to know.
pub(super) fn redis_error(error: RedisError) -> BackendError {
    let message = error.to_string();
    let kind = if error.is_timeout() {
        BackendErrorKind::Timeout
    } else if error.is_connection_refusal() || is_read_only(&error) || is_slot_unserved(&error) {
        // The command did not run: a demoted master refuses writes, a cluster slot without a
        // master refuses everything. Look for the new one.
        BackendErrorKind::Unavailable
    } else if error.is_io_error() || error.is_connection_dropped() {
        BackendErrorKind::Interrupted
    } else if message.contains("WRONGTYPE") {
        // The scripts name what they found: "WRONGTYPE <key> holds a <type>, not ...".
        let found = message
            .split_once(" holds a ")
            .map_or("", |(_, rest)| rest.split([',', ' ']).next().unwrap_or_default());
        BackendErrorKind::WrongType { found: found.to_owned() }
    } else if error.kind() == ErrorKind::Server(ServerErrorKind::NoPerm)
        || message.contains("NOPERM")
        // An ACL denial inside a script comes back as a plain ERR with this wording.
        || message.contains("The user executing the script can't")
    {
        BackendErrorKind::NoPermission
    } else {
        BackendErrorKind::Other
    };
    BackendError::new(kind, error)
}

/// The error of a first connection to `server` (its address, or the URL without password): a
/// configuration that cannot work is `Misconfigured` and says what to fix; otherwise the
/// server could not be reached.
pub(super) fn connect_error(error: RedisError, server: &str) -> BackendError {
    let message = error.to_string();
    let what = if error.kind() == ErrorKind::InvalidClientConfig {
        if server.starts_with("rediss://") && !cfg!(feature = "tls") {
            "a `rediss://` URL needs tower-lock's `tls` feature".to_owned()
        } else {
            let tls = if cfg!(feature = "tls") { " or `rediss://…`" } else { "" };
            format!(
                "the Redis URL `{server}`: expected `redis://[user:password@]host:port[/db]`{tls}"
            )
        }
    } else if error.kind() == ErrorKind::AuthenticationFailed
        || message.contains("WRONGPASS")
        || message.contains("NOAUTH")
    {
        format!("Redis at {server} refused the user or password: check the URL and the ACL user")
    } else if message.contains("DB index") {
        format!("Redis at {server} has no such database: check the database index in the URL")
    } else {
        let failed = ConnectFailed { server: server.to_owned(), cause: error };
        return BackendError::new(BackendErrorKind::Unavailable, failed);
    };
    BackendError::new(BackendErrorKind::Misconfigured { what }, error)
}

/// A first connection that failed: names the server, with redis-rs's error as the source.
#[derive(Debug)]
struct ConnectFailed {
    server: String,
    cause: RedisError,
}

impl fmt::Display for ConnectFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "could not connect to Redis at {}", self.server)
    }
}

impl std::error::Error for ConnectFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        // redis-rs's message repeats its I/O cause: name that cause alone.
        self.cause.source().or(Some(&self.cause))
    }
}

/// An acquire refused while the server run is in quarantine, for `left` more: reported (the
/// quarantine logs it), saying when to come back.
pub(super) fn quarantined(left: Duration) -> BackendError {
    BackendError::from_kind(BackendErrorKind::Quarantined)
        .back_at(tokio::time::Instant::now() + left)
        .reported()
}

pub(super) fn protocol_error(what: &'static str) -> BackendError {
    BackendError::new(BackendErrorKind::Protocol, what)
}

/// Whether a Redis Cluster did not run the command because its slot is not served right now
/// (moving, its master failed over) and redis-rs ran out of retries: trying again later can
/// succeed.
fn is_slot_unserved(error: &RedisError) -> bool {
    use ServerErrorKind::{Ask, ClusterDown, MasterDown, Moved, TryAgain};
    matches!(
        error.kind(),
        ErrorKind::Server(Moved | Ask | TryAgain | ClusterDown | MasterDown)
            | ErrorKind::ClusterConnectionNotFound
    )
}

/// Whether a connection could not be opened because the server refused it (nothing listens
/// on its port, or Sentinel names no master), rather than being slow to answer.
pub(super) fn is_refusal(error: &BackendError) -> bool {
    let mut cause = std::error::Error::source(error);
    while let Some(error) = cause {
        let redis = error.downcast_ref::<RedisError>();
        let io = error.downcast_ref::<std::io::Error>();
        if redis.is_some_and(RedisError::is_connection_refusal)
            || io.is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        cause = error.source();
    }
    false
}

pub(super) fn is_noscript(error: &RedisError) -> bool {
    error.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

/// The server is a replica now (a failover demoted it).
pub(super) fn is_read_only(error: &RedisError) -> bool {
    error.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
}
