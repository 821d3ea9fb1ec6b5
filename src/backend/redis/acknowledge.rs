//! What a grant must be acknowledged by before it counts: replicas that applied it (`WAIT`,
//! [`min_replicas`](super::RedisBackendBuilder::min_replicas)) and append-only files that
//! fsynced it (`WAITAOF`, [`wait_aof`](super::RedisBackendBuilder::wait_aof)). Both wait for
//! the writes made earlier on their own connection: they follow the grant on it.

use std::time::Duration;

use redis::{RedisError, aio::ConnectionLike};

use crate::{error::BackendErrorKind, lease::Lease};

/// The acknowledgements every grant waits for; none by default.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Acknowledgement {
    pub(super) replicas: Option<MinReplicas>,
    pub(super) aof: Option<WaitAof>,
}

/// How many replicas must have applied a grant, and how long to wait for them.
#[derive(Clone, Copy, Debug)]
pub(super) struct MinReplicas {
    pub(super) replicas: u32,
    pub(super) timeout: Duration,
}

/// Whether this server, and how many replicas, must have fsynced a grant, and how long to
/// wait for them.
#[derive(Clone, Copy, Debug)]
pub(super) struct WaitAof {
    pub(super) local: bool,
    pub(super) replicas: u32,
    pub(super) timeout: Duration,
}

impl Acknowledgement {
    pub(super) fn is_wanted(&self) -> bool {
        self.replicas.is_some() || self.aof.is_some()
    }

    /// The longest the waits after one grant may take.
    pub(super) fn timeout(&self) -> Duration {
        self.replicas.map_or(Duration::ZERO, |m| m.timeout)
            + self.aof.map_or(Duration::ZERO, |w| w.timeout)
    }

    /// Waits on `conn`, right after a grant on it, for every acknowledgement wanted; what fell
    /// short, as the kind of the error the acquire fails with.
    pub(super) async fn shortfall(
        &self,
        conn: &mut impl ConnectionLike,
    ) -> Result<Option<BackendErrorKind>, RedisError> {
        if let Some(wanted) = self.replicas {
            let acknowledged: u32 = redis::cmd("WAIT")
                .arg(wanted.replicas)
                .arg(Lease::fixed(wanted.timeout).millis())
                .query_async(conn)
                .await?;
            if acknowledged < wanted.replicas {
                return Ok(Some(BackendErrorKind::ReplicasNotAcknowledged {
                    wanted: wanted.replicas,
                    acknowledged,
                }));
            }
        }
        if let Some(wanted) = self.aof {
            let (local, acknowledged): (u32, u32) = redis::cmd("WAITAOF")
                .arg(u32::from(wanted.local))
                .arg(wanted.replicas)
                .arg(Lease::fixed(wanted.timeout).millis())
                .query_async(conn)
                .await?;
            let local = local > 0;
            if (wanted.local && !local) || acknowledged < wanted.replicas {
                return Ok(Some(BackendErrorKind::AofNotAcknowledged {
                    local_wanted: wanted.local,
                    local,
                    wanted: wanted.replicas,
                    acknowledged,
                }));
            }
        }
        Ok(None)
    }
}

/// The probe that tells whether the server has `WAITAOF`: one that waits 1 ms for nothing but
/// the local fsync when `local` is asked for (a server without `appendonly` refuses it).
pub(super) fn wait_aof_probe(local: bool) -> redis::Cmd {
    let mut cmd = redis::cmd("WAITAOF");
    cmd.arg(u32::from(local)).arg(0).arg(1);
    cmd
}

/// What the server's answer to [`wait_aof_probe`] says.
pub(super) enum Probed {
    Supported,
    /// The server does not know the command (before Redis 7.2).
    Unknown,
    /// The command exists but the server refused it as sent (an ACL, no `appendonly`).
    Refused(RedisError),
}

impl Probed {
    /// Classifies the probe's outcome; `Err` when the server gave no answer at all.
    pub(super) fn of<T>(result: Result<T, RedisError>) -> Result<Self, RedisError> {
        match result {
            Ok(_) => Ok(Self::Supported),
            // A server checks that a command exists before anything else (ACL included).
            Err(error)
                if error.code() == Some("ERR")
                    && (error.detail()).is_some_and(|detail| {
                        detail.to_ascii_lowercase().contains("unknown command")
                    }) =>
            {
                Ok(Self::Unknown)
            }
            Err(error) if error.code().is_some() => Ok(Self::Refused(error)),
            Err(error) => Err(error),
        }
    }
}
