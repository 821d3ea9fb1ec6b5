//! What a redis-rs error means for the engine, and the errors of a first connection.

use std::fmt;

use redis::RedisError;

use crate::error::{BackendError, BackendErrorKind};

/// Maps a redis-rs error to what the engine needs to know.
pub(super) fn redis_error(error: RedisError) -> BackendError {
    let kind = if error.is_timeout() {
        BackendErrorKind::Timeout
    } else if error.is_connection_refusal() || is_read_only(&error) || is_slot_unserved(&error) {
        // The command did not run: a demoted master refuses writes, a cluster slot without a
        // master refuses everything. Look for the new one.
        BackendErrorKind::Unavailable
    } else if error.is_io_error() || error.is_connection_dropped() {
        BackendErrorKind::Interrupted
    } else if error.code() == Some("WRONGTYPE") || error.to_string().contains("WRONGTYPE") {
        // The scripts name what they found: "WRONGTYPE <key> holds a <type>, not ...".
        let message = error.to_string();
        let found = message.split_once(" holds a ").map_or("", |(_, rest)| {
            rest.split([',', ' ']).next().unwrap_or_default()
        });
        BackendErrorKind::WrongType {
            found: found.to_owned(),
        }
    } else if error.code() == Some("NOPERM")
        || error.to_string().contains("NOPERM")
        // An ACL denial inside a script comes back as a plain ERR with this wording.
        || error.to_string().contains("The user executing the script can't")
    {
        BackendErrorKind::NoPermission
    } else {
        BackendErrorKind::Other
    };
    BackendError::new(kind, error)
}

/// The error of a first connection to `server` (its address, or the URL without password):
/// a configuration that cannot work is [`BackendErrorKind::Misconfigured`] and says what to
/// fix; a server that cannot be reached is `Unavailable`, naming it.
pub(super) fn connect_error(error: RedisError, server: &str) -> BackendError {
    let message = error.to_string();
    let what = if error.kind() == redis::ErrorKind::InvalidClientConfig {
        if server.starts_with("rediss://") && !cfg!(feature = "tls") {
            Some("a `rediss://` URL needs tower-lock's `tls` feature".to_owned())
        } else {
            Some(format!(
                "the Redis URL `{server}`: expected `redis://[user:password@]host:port[/db]`{}",
                if cfg!(feature = "tls") {
                    " or `rediss://…`"
                } else {
                    ""
                }
            ))
        }
    } else if error.kind() == redis::ErrorKind::AuthenticationFailed
        || message.contains("WRONGPASS")
        || message.contains("NOAUTH")
    {
        Some(format!(
            "Redis at {server} refused the user or password: check the URL's credentials and \
             the ACL user"
        ))
    } else if message.contains("DB index") {
        Some(format!(
            "Redis at {server} has no such database: check the database index in the URL"
        ))
    } else {
        None
    };
    match what {
        Some(what) => BackendError::new(BackendErrorKind::Misconfigured { what }, error),
        None => BackendError::new(
            BackendErrorKind::Unavailable,
            ConnectFailed {
                server: server.to_owned(),
                cause: error,
            },
        ),
    }
}

/// A first connection that failed: names the server, with the client library's error as the
/// source.
#[derive(Debug)]
pub(super) struct ConnectFailed {
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

/// The answer of a server in its restart quarantine, which ends in `left`: reported (the
/// quarantine logs it) and saying when to come back.
pub(super) fn quarantined(left: std::time::Duration) -> BackendError {
    BackendError::from_kind(BackendErrorKind::Quarantined)
        .back_at(tokio::time::Instant::now() + left)
        .reported()
}

/// An acquire that reached the server after the time it may act (its lease from when it was
/// sent), twice: it did nothing, and the caller learns that the server answers too slowly for
/// the lease, as from a timeout.
pub(super) fn arrived_late(lease: std::time::Duration) -> BackendError {
    BackendError::new(
        BackendErrorKind::Timeout,
        format!(
            "the acquire reached the server after its lease of {lease:?} had run out; nothing was done"
        ),
    )
}

pub(super) fn protocol_error(what: &'static str) -> BackendError {
    BackendError::new(BackendErrorKind::Protocol, what)
}

/// Whether a Redis Cluster could not run the command because its slot is not served right now
/// (moving, or its master failed and no replica took over yet, or no connection to the slot's
/// node) and redis-rs ran out of redirects and retries: the script did not run, and trying
/// again a little later can succeed.
pub(super) fn is_slot_unserved(error: &RedisError) -> bool {
    use redis::ServerErrorKind::{Ask, ClusterDown, MasterDown, Moved, TryAgain};
    matches!(
        error.kind(),
        redis::ErrorKind::Server(Moved | Ask | TryAgain | ClusterDown | MasterDown)
            | redis::ErrorKind::ClusterConnectionNotFound
    )
}

/// Whether a connection could not be opened because the server refused it (nothing listens
/// on its port, or the Sentinel group's master cannot be found), as opposed to a server that
/// is slow to answer.
pub(super) fn is_refusal(error: &BackendError) -> bool {
    let mut cause = std::error::Error::source(error);
    while let Some(error) = cause {
        if let Some(redis) = error.downcast_ref::<RedisError>()
            && redis.is_connection_refusal()
        {
            return true;
        }
        if let Some(io) = error.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionRefused
        {
            return true;
        }
        cause = error.source();
    }
    false
}

pub(super) fn is_noscript(error: &RedisError) -> bool {
    error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// The server is a replica now (a failover demoted it).
pub(super) fn is_read_only(error: &RedisError) -> bool {
    error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
}
