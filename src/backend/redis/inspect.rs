//! Reading and clearing a lock for operators: `lua/inspect.lua` and `lua/force_unlock.lua`,
//! whose replies (`lua/snapshot.lua`'s layout) become a [`LockInfo`] here.

use std::time::Duration;

use redis::{FromRedisValue, Value};

use super::{RedisBackend, calls, errors::protocol_error};
use crate::{
    backend::LockKind,
    error::BackendError,
    inspect::{HolderInfo, LockInfo, Permits},
    lock_key::LockKey,
};

impl RedisBackend {
    /// What the lock `key` of `kind`'s layout holds.
    pub(super) async fn inspect_lock(
        &self,
        key: &LockKey,
        kind: LockKind,
    ) -> Result<LockInfo, BackendError> {
        let call = calls::inspect(self.scripts(), key, kind);
        let value: Value = self.invoke(&call, key).await?;
        snapshot(value).map_err(|error| error.with_key(key.as_str()))
    }

    /// Frees the lock `key` of `kind`'s layout; what it held before.
    pub(super) async fn force_unlock_lock(
        &self,
        key: &LockKey,
        kind: LockKind,
    ) -> Result<LockInfo, BackendError> {
        let call = calls::force_unlock(self.scripts(), key, kind);
        let value: Value = self.invoke(&call, key).await?;
        snapshot(value).map_err(|error| error.with_key(key.as_str()))
    }
}

/// Reads `{fair, queued, limit, holder, side, count, lease, ...}` (see `lua/snapshot.lua`).
pub(super) fn snapshot(value: Value) -> Result<LockInfo, BackendError> {
    let bad = |_| protocol_error("lock snapshot reply");
    let items: Vec<Value> = FromRedisValue::from_redis_value(value).map_err(bad)?;
    let mut items = items.into_iter();
    let mut next = || {
        items
            .next()
            .ok_or_else(|| protocol_error("short lock snapshot"))
    };
    let fair = i64::from_redis_value(next()?).map_err(bad)? == 1;
    let queued = i64::from_redis_value(next()?).map_err(bad)?;
    let limit = i64::from_redis_value(next()?).map_err(bad)?;
    let mut info = LockInfo::free().with_queue_len(u64::try_from(queued).unwrap_or(0));
    while let Ok(id) = next() {
        let id = String::from_redis_value(id).map_err(bad)?;
        let kind = match String::from_redis_value(next()?).map_err(bad)?.as_str() {
            "x" if fair => LockKind::Fair,
            "x" => LockKind::Exclusive,
            "r" => LockKind::Read,
            "w" => LockKind::Write,
            "s" => LockKind::Semaphore,
            _ => return Err(protocol_error("lock snapshot side")),
        };
        let count = i64::from_redis_value(next()?).map_err(bad)?;
        let lease = i64::from_redis_value(next()?).map_err(bad)?;
        // -1: the key has no expiry.
        let lease = u64::try_from(lease).ok().map(Duration::from_millis);
        let count = u64::try_from(count).unwrap_or(0);
        info = info.with_holder(HolderInfo::new(id, kind, count, lease));
    }
    // -1: not a semaphore. A semaphore nobody holds has no permits to show.
    if let Ok(limit) = u64::try_from(limit)
        && info.is_locked()
    {
        let permits = Permits::new(info.holders.len() as u64, limit);
        info = info.with_permits(permits);
    }
    Ok(info)
}
