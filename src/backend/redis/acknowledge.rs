//! What a grant must be acknowledged by before it counts: replicas that applied it (`WAIT`,
//! [`min_replicas`](super::RedisBackendBuilder::min_replicas)) and append-only files that
//! fsynced it (`WAITAOF`, [`wait_aof`](super::RedisBackendBuilder::wait_aof)). Both wait for
//! the writes made earlier on their own connection: they follow the grant on it.

use std::time::Duration;

use redis::{RedisError, aio::ConnectionLike};

use super::{RedisBackend, errors::redis_error};
use crate::{
    error::{BackendError, BackendErrorKind},
    lease::Lease,
};

/// The acknowledgements every grant waits for; none by default.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Acknowledgement {
    pub(super) replicas: Option<MinReplicas>,
    pub(super) aof: Option<WaitAof>,
}

/// How many replicas must have applied a grant, waited for at most `timeout`.
#[derive(Clone, Copy, Debug)]
pub(super) struct MinReplicas {
    pub(super) replicas: u32,
    pub(super) timeout: Duration,
}

/// Whether this server, and how many replicas, must have fsynced a grant.
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

impl RedisBackend {
    /// Asks the server whether it has `WAITAOF` (Redis 7.2 and newer), with a `WAITAOF` that
    /// waits for nothing. An ACL user without `+waitaof` is refused (counted as supported).
    ///
    /// # Errors
    /// The backend's errors when the server cannot be asked.
    pub async fn supports_wait_aof(&self) -> Result<bool, BackendError> {
        Ok(self.probe_wait_aof(false).await?.is_some())
    }

    /// With [`wait_aof`](super::RedisBackendBuilder::wait_aof) set, checks the server runs
    /// `WAITAOF` as configured, so that a missing feature fails `connect`, not an acquire.
    pub(super) async fn check_wait_aof(&self) -> Result<(), BackendError> {
        let Some(wanted) = self.inner.acknowledgement.aof else {
            return Ok(());
        };
        match self.probe_wait_aof(wanted.local).await? {
            Some(Ok(())) => Ok(()),
            Some(Err(refused)) => Err(redis_error(refused)),
            None => Err(BackendError::from_kind(BackendErrorKind::Unsupported {
                feature: "WAITAOF (wait_aof), which needs Redis 7.2 or newer",
            })),
        }
    }

    /// Sends a `WAITAOF` that waits 1 ms for nothing (but the local fsync with `local`):
    /// `None` when the server does not know the command, else whether it ran or what the
    /// server refused (an ACL, a local fsync without `appendonly`).
    async fn probe_wait_aof(
        &self,
        local: bool,
    ) -> Result<Option<Result<(), RedisError>>, BackendError> {
        let mut probe = redis::cmd("WAITAOF");
        probe.arg(u32::from(local)).arg(0).arg(1);
        let unknown = |error: &RedisError| {
            let detail = error.detail().unwrap_or_default().to_ascii_lowercase();
            error.code() == Some("ERR") && detail.contains("unknown command")
        };
        self.with_conn(None, async |conn| {
            match probe.query_async::<redis::Value>(conn).await {
                Ok(_) => Ok(Some(Ok(()))),
                // A server checks that a command exists before anything else (ACL included).
                Err(error) if unknown(&error) => Ok(None),
                Err(error) if error.code().is_some() => Ok(Some(Err(error))),
                Err(error) => Err(error),
            }
        })
        .await
    }
}
