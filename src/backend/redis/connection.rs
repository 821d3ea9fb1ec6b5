//! How a command reaches the server: a connection for it, the time budget around it, and what
//! a connection that failed or stayed silent means for the next command.

use std::time::Duration;

use redis::{FromRedisValue, RedisError};

use super::{
    RedisBackend,
    errors::{is_read_only, is_refusal, redis_error},
    health::Trouble,
    pool::Pool,
    scripts::Call,
    transport::{Conn, Transport},
};
use crate::{
    error::{BackendError, BackendErrorKind},
    lock_key::LockKey,
};

impl RedisBackend {
    /// Opens every connection of the backend's own now (within the command timeout), so the
    /// first commands do not pay for connecting.
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
        cmd: &redis::Cmd,
        key: Option<&LockKey>,
    ) -> Result<T, BackendError> {
        self.with_conn(key, async |conn| cmd.query_async(conn).await)
            .await
    }

    /// Runs one script call with the command timeout.
    pub(super) async fn invoke<T: FromRedisValue>(
        &self,
        call: &Call,
        key: &LockKey,
    ) -> Result<T, BackendError> {
        let result = self.with_conn(Some(key), async |conn| call.run(conn).await);
        self.name_wrong_type_in(result.await, key).await
    }

    /// Names the type found at `key` in a wrong-type error that does not (a command's own, not
    /// a script's).
    pub(super) async fn name_wrong_type_in<T>(
        &self,
        result: Result<T, BackendError>,
        key: &LockKey,
    ) -> Result<T, BackendError> {
        let Err(error) = result else { return result };
        if !matches!(error.kind(), BackendErrorKind::WrongType { found } if found.is_empty()) {
            return Err(error);
        }
        let found: String = (self
            .query(redis::cmd("TYPE").arg(key.as_str()), Some(key))
            .await)
            .unwrap_or_else(|_| "unknown".to_owned());
        tracing::warn!(key = %key, found, "lock key holds a value of another type");
        Err(BackendError::from_kind(BackendErrorKind::WrongType { found }).with_key(key.as_str()))
    }

    /// Checks out a connection and runs `op` on it, all within the command timeout; for the
    /// modules of the crate that run commands of their own on the lock store. A connection
    /// that failed at the connection level, ran out of time, or whose server is no longer a
    /// master, is not used again.
    pub(crate) async fn with_conn<T>(
        &self,
        key: Option<&LockKey>,
        op: impl AsyncFnOnce(&mut Conn) -> Result<T, RedisError>,
    ) -> Result<T, BackendError> {
        self.with_conn_within(key, self.inner.command_timeout, op)
            .await
    }

    /// [`with_conn`](Self::with_conn) within `budget`.
    pub(super) async fn with_conn_within<T>(
        &self,
        key: Option<&LockKey>,
        budget: Duration,
        op: impl AsyncFnOnce(&mut Conn) -> Result<T, RedisError>,
    ) -> Result<T, BackendError> {
        let name_key = |error: BackendError| match key {
            Some(key) => error.with_key(key.as_str()),
            None => error,
        };
        // A server known to be down: fail at once rather than wait for a connection.
        let health = &self.inner.health;
        health.check().map_err(name_key)?;
        // One timer for both steps; it is registered only if a step has to wait.
        let out_of_time = tokio::time::sleep(budget);
        tokio::pin!(out_of_time);
        let silent = |kind, what| {
            let error = BackendError::new(kind, format!("no {what} within {budget:?}"));
            (Some(Trouble::Silent), error)
        };
        let result = async {
            // No connection in time: nothing was sent, so the outcome is known.
            let mut conn = tokio::select! {
                biased;
                conn = self.inner.transport.get() => conn.map_err(|error| {
                    (is_refusal(&error).then_some(Trouble::Refused), error)
                })?,
                () = &mut out_of_time => {
                    return Err(silent(BackendErrorKind::Unavailable, "connection"));
                }
            };
            let result = tokio::select! {
                biased;
                result = op(&mut conn) => result,
                () = &mut out_of_time => {
                    // Silent for the whole budget, it may be half-open or cut off: a fresh
                    // one is cheaper than finding out on the next command.
                    conn.mark_broken();
                    return Err(silent(BackendErrorKind::Timeout, "reply"));
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
            result.map_err(|error| (None, redis_error(error)))
        }
        .await;
        let error = match result {
            Ok(value) => {
                health.succeeded();
                return Ok(value);
            }
            Err((None, error)) => error,
            Err((Some(trouble), error)) => {
                let (error, probe) = health.failed(trouble, error);
                if probe {
                    self.start_probe();
                }
                error
            }
        };
        Err(name_key(error))
    }
}
