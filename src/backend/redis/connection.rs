//! How a command reaches the server: a connection for it, the time budget around it, and what
//! a connection that failed or stayed silent means for the next command.

use std::time::Duration;

use redis::{FromRedisValue, RedisError};

use super::{
    RedisBackend,
    errors::{is_read_only, is_refusal, redis_error},
    health::Trouble,
    pool::Pool,
    run_call,
    scripts::Call,
    transport::{Conn, Transport},
};
use crate::{
    error::{BackendError, BackendErrorKind},
    lock_key::LockKey,
};

impl RedisBackend {
    /// Opens every connection of the backend's own now (bounded by the command timeout), so
    /// the first commands do not pay for connecting.
    pub(super) async fn open_pool(&self) {
        if let Transport::Node {
            pool: Pool::Own(connections),
            ..
        } = &self.inner.transport
        {
            let _ = tokio::time::timeout(self.inner.command_timeout, connections.open_all()).await;
        }
    }

    /// Runs one command with the command timeout.
    pub(super) async fn query<T: FromRedisValue>(
        &self,
        cmd: &mut redis::Cmd,
        key: Option<&LockKey>,
    ) -> Result<T, BackendError> {
        self.with_conn(key, async |conn| cmd.query_async(conn).await)
            .await
    }

    /// Runs one script call with the command timeout; by body when the server lost the
    /// script.
    pub(super) async fn invoke<T: FromRedisValue>(
        &self,
        call: &Call,
        key: &LockKey,
    ) -> Result<T, BackendError> {
        let result = self
            .with_conn(Some(key), async |conn| run_call(call, conn).await)
            .await;
        self.name_wrong_type_in(result, key).await
    }

    /// Replaces a wrong-type error with one naming the type found at `key`.
    pub(super) async fn name_wrong_type_in<T>(
        &self,
        result: Result<T, BackendError>,
        key: &LockKey,
    ) -> Result<T, BackendError> {
        match result {
            Err(error) if error.is_wrong_type() => Err(self.name_wrong_type(key).await),
            other => other,
        }
    }

    /// Checks out a connection and runs `op` on it, all within the command timeout. A
    /// connection that failed at the connection level, ran out of time, or whose server is no
    /// longer a master, is not put back.
    pub(crate) async fn with_conn<T>(
        &self,
        key: Option<&LockKey>,
        op: impl AsyncFnOnce(&mut Conn) -> Result<T, RedisError>,
    ) -> Result<T, BackendError> {
        self.with_conn_within(key, self.inner.command_timeout, op)
            .await
    }

    /// [`with_conn`](Self::with_conn) with a time budget other than the command timeout.
    pub(super) async fn with_conn_within<T>(
        &self,
        key: Option<&LockKey>,
        budget: Duration,
        op: impl AsyncFnOnce(&mut Conn) -> Result<T, RedisError>,
    ) -> Result<T, BackendError> {
        // A server known to be down: fail at once rather than wait for a connection.
        let health = &self.inner.health;
        health.check().map_err(|error| name_key(error, key))?;
        // One timer for both steps; it is registered only if a step has to wait.
        let out_of_time = tokio::time::sleep(budget);
        tokio::pin!(out_of_time);
        let result = async {
            // No connection in time: nothing was sent, so the outcome is known.
            let mut conn = tokio::select! {
                biased;
                conn = self.inner.transport.get() => conn.map_err(|error| match is_refusal(&error) {
                    true => Failure::Refused(error),
                    false => Failure::Other(error),
                })?,
                () = &mut out_of_time => {
                    return Err(Failure::Silent(BackendError::new(
                        BackendErrorKind::Unavailable,
                        format!("no connection within {budget:?}"),
                    )));
                }
            };
            let result = tokio::select! {
                biased;
                result = op(&mut conn) => result,
                () = &mut out_of_time => {
                    // A connection that stayed silent for the whole budget may be half-open or
                    // cut off: a fresh one is cheaper than finding out on the next command.
                    conn.mark_broken();
                    return Err(Failure::Silent(BackendError::new(
                        BackendErrorKind::Timeout,
                        format!("no reply within {budget:?}"),
                    )));
                }
            };
            if let Err(error) = &result
                && (error.is_io_error()
                    || error.is_connection_dropped()
                    || error.is_timeout()
                    || is_read_only(error))
            {
                conn.mark_broken();
            }
            result.map_err(|error| Failure::Other(redis_error(error)))
        }
        .await;
        let error = match result {
            Ok(value) => {
                health.succeeded();
                return Ok(value);
            }
            Err(Failure::Other(error)) => error,
            Err(Failure::Refused(error)) => {
                let (error, opened) = health.failed(Trouble::Refused, error);
                if opened {
                    self.start_probe();
                }
                error
            }
            Err(Failure::Silent(error)) => health.failed(Trouble::Silent, error).0,
        };
        Err(name_key(error, key))
    }

    /// Builds the error for a key of a foreign type, naming the type found there.
    pub(super) async fn name_wrong_type(&self, key: &LockKey) -> BackendError {
        let found: String = self
            .query(redis::cmd("TYPE").arg(key.as_str()), Some(key))
            .await
            .unwrap_or_else(|_| "unknown".to_owned());
        tracing::warn!(key = %key, found, "lock key holds a value of another type");
        BackendError::from_kind(BackendErrorKind::WrongType { found }).with_key(key.as_str())
    }
}

/// How a command failed, for the server's [health](super::health).
enum Failure {
    /// No connection could be opened: the server refused it.
    Refused(BackendError),
    /// No connection or no reply within the time budget.
    Silent(BackendError),
    /// Anything else (the server answered, or the connection broke mid-command).
    Other(BackendError),
}

fn name_key(error: BackendError, key: Option<&LockKey>) -> BackendError {
    match key {
        Some(key) => error.with_key(key.as_str()),
        None => error,
    }
}
