//! [`RedisAnswerStore`]: answers kept in Redis, beside the keys' locks.

use std::{fmt, sync::LazyLock, time::Duration};

use bytes::Bytes;
use redis::{RedisError, Script};

use super::{AnswerStore, Put, Record};
use crate::{
    LockKey, RedisBackend,
    error::{BackendError, BackendErrorKind},
};

/// The suffix of an answer's key after its lock's name.
const SUFFIX: &str = ":answer";

/// The body of the fenced put (`put.lua`).
const PUT_LUA: &str = include_str!("put.lua");

/// The fenced put, hashed once.
static PUT: LazyLock<Script> = LazyLock::new(|| Script::new(PUT_LUA));

/// Answers kept in Redis, through a [`RedisBackend`]'s connections (its pool, its command
/// timeout, its view of the server's health; on a Cluster, its routing).
///
/// An answer lives at its lock's name plus `:answer` (`tower-lock:idempotency:{…}:answer`): in
/// the lock's hash slot on a Cluster, under the lock client's prefix (so the crate's ACL grant
/// covers it). It is a hash of the fencing `token` and the encoded `answer`, written by one
/// script that compares the tokens and sets the TTL in the same step, and read with one
/// `HMGET`. Nothing is written without a TTL.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use tower_lock::{LockClient, RedisBackend, idempotency::{IdempotencyLayer, RedisAnswerStore}};
///
/// let backend = RedisBackend::connect("redis://127.0.0.1:6379").await?;
/// let layer = IdempotencyLayer::new(
///     LockClient::builder(backend.clone()).build()?,
///     RedisAnswerStore::new(backend),
/// );
/// # let _ = layer;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisAnswerStore {
    backend: RedisBackend,
}

impl RedisAnswerStore {
    /// A store on `backend`'s server (usually the lock client's own backend, or a clone of it).
    pub fn new(backend: RedisBackend) -> Self {
        Self { backend }
    }

    /// The Redis key the answer to the key locked by `key` is kept at.
    ///
    /// ```
    /// use tower_lock::{LockClient, LockKind, idempotency::RedisAnswerStore};
    ///
    /// let name = LockClient::in_memory().lock_key("idempotency:", "-:k", LockKind::Exclusive)?;
    /// assert_eq!(RedisAnswerStore::key_of(&name), "tower-lock:idempotency:{-:k}:answer");
    /// # Ok::<_, tower_lock::key::KeyError>(())
    /// ```
    pub fn key_of(key: &LockKey) -> String {
        key.derived(SUFFIX)
    }
}

impl fmt::Debug for RedisAnswerStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisAnswerStore").finish_non_exhaustive()
    }
}

impl AnswerStore for RedisAnswerStore {
    async fn get(&self, key: &LockKey) -> Result<Option<Record>, BackendError> {
        let name = Self::key_of(key);
        let (token, answer): (Option<String>, Option<Vec<u8>>) = self
            .backend
            .with_conn(Some(key), async |conn| {
                redis::cmd("HMGET").arg(&name).arg("token").arg("answer").query_async(conn).await
            })
            .await?;
        match (token, answer) {
            (Some(token), Some(answer)) => Ok(Some(Record {
                token: token.parse().map_err(|_| protocol("a kept answer's token"))?,
                answer: Bytes::from(answer),
            })),
            (None, None) => Ok(None),
            _ => Err(protocol("a kept answer without its token")),
        }
    }

    async fn put(&self, key: &LockKey, record: Record, ttl: Duration) -> Result<Put, BackendError> {
        let name = Self::key_of(key);
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let call = |by_hash: bool| {
            let mut cmd = if by_hash {
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(PUT.get_hash());
                cmd
            } else {
                let mut cmd = redis::cmd("EVAL");
                cmd.arg(PUT_LUA);
                cmd
            };
            cmd.arg(1).arg(&name).arg(record.token).arg(record.answer.as_ref()).arg(ttl_ms);
            cmd
        };
        let kept: String = self
            .backend
            .with_conn(Some(key), async |conn| {
                // By hash; by body when the server lost the script (a restart, `SCRIPT
                // FLUSH`): `EVAL` caches it again, and needs no `SCRIPT LOAD` grant.
                match call(true).query_async(conn).await {
                    Err(error) if is_noscript(&error) => call(false).query_async(conn).await,
                    other => other,
                }
            })
            .await?;
        let kept: u64 = kept.parse().map_err(|_| protocol("the token of a kept answer"))?;
        Ok(if kept == record.token { Put::Stored } else { Put::Stale { kept } })
    }
}

fn is_noscript(error: &RedisError) -> bool {
    error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

fn protocol(what: &'static str) -> BackendError {
    BackendError::new(BackendErrorKind::Protocol, format!("unexpected reply for {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The script is named by a SHA1 of its body, and documents the keys and arguments the
    /// store sends, in that order. (The integration tests run it on a real server, by hash
    /// and, after `SCRIPT FLUSH`, by body.)
    #[test]
    fn script_hash_and_arguments() {
        let hash = PUT.get_hash();
        assert_eq!(hash.len(), 40);
        assert!(hash.bytes().all(|b| b.is_ascii_hexdigit()));
        let documented: Vec<usize> = ["KEYS[1]", "ARGV[1]", "ARGV[2]", "ARGV[3]"]
            .iter()
            .map(|name| PUT_LUA.find(name).expect("documented"))
            .collect();
        assert!(documented.is_sorted(), "documented in the order they are sent");
    }
}
