//! The independent witness: a `redis-server` that no fault ever touches, told about every
//! critical section in real time. It hosts three oracles:
//!
//! - entry/exit: `INCR` on entry must return 1 (anything else is two holders inside at once);
//! - lost updates (Jepsen's `lock-set`): read a counter, sleep, write it back plus one; the
//!   final counters must add up to the number of completed sections;
//! - fencing: a check-and-set that accepts a write only with the highest token seen so far (or
//!   the same token from the same holder), like a store that rejects stale writers.

use std::{sync::LazyLock, time::Duration};

use tower_lock::backend::redis::redis::{self, AsyncCommands, Script, aio::MultiplexedConnection};

/// Entry: counts the section in and records an overlap when someone else is already in.
static ENTER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "local n = redis.call('INCR', KEYS[1])
         if n ~= 1 then redis.call('INCR', KEYS[2]) end
         return n",
    )
});

/// A write to the fenced store: KEYS = max token, its owner, stale-rejected counter,
/// stale-accepted counter; ARGV = holder, token, '1' to enforce the check ('0' = fencing off).
static FENCED_WRITE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "local max = tonumber(redis.call('GET', KEYS[1]) or '0')
         local token = tonumber(ARGV[2])
         if token > max or (token == max and redis.call('GET', KEYS[2]) == ARGV[1]) then
           redis.call('SET', KEYS[1], token)
           redis.call('SET', KEYS[2], ARGV[1])
           return 1
         end
         if ARGV[3] == '1' then
           redis.call('INCR', KEYS[3])
           return 0
         end
         redis.call('INCR', KEYS[4])
         return 1",
    )
});

const OVERLAPS: &str = "w:overlaps";
const STALE_REJECTED: &str = "w:stale_rejected";
const STALE_ACCEPTED: &str = "w:stale_accepted";

/// What the witness saw, at the end of a scenario.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Seen {
    /// Entries that found another holder inside.
    pub(crate) overlaps: u64,
    /// Sum of the lost-update counters over every key.
    pub(crate) counted: u64,
    /// Writes with a stale token that the fenced store refused.
    pub(crate) stale_rejected: u64,
    /// Writes with a stale token that went through (fencing off).
    pub(crate) stale_accepted: u64,
}

/// A connection to the witness. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Witness {
    conn: MultiplexedConnection,
}

impl std::fmt::Debug for Witness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Witness")
    }
}

impl Witness {
    pub(crate) async fn connect(url: &str) -> Self {
        let client = redis::Client::open(url).expect("witness url");
        let conn = client.get_multiplexed_async_connection().await.expect("connect to the witness");
        Self { conn }
    }

    /// A section on `key` begins; false when another holder is already inside.
    pub(crate) async fn enter(&self, key: &str) -> bool {
        let n: i64 = ENTER
            .key(format!("w:in:{key}"))
            .key(OVERLAPS)
            .invoke_async(&mut self.conn.clone())
            .await
            .expect("witness enter");
        n == 1
    }

    /// The section on `key` ends.
    pub(crate) async fn exit(&self, key: &str) {
        let _: i64 = self.conn.clone().decr(format!("w:in:{key}"), 1).await.expect("witness exit");
    }

    /// Read-modify-write of `key`'s counter with `pause` in between: two holders inside at
    /// once lose an update.
    pub(crate) async fn increment_slowly(&self, key: &str, pause: Duration) {
        let mut conn = self.conn.clone();
        let counter = format!("w:count:{key}");
        let value: Option<u64> = conn.get(&counter).await.expect("witness read");
        tokio::time::sleep(pause).await;
        let _: () = conn.set(&counter, value.unwrap_or(0) + 1).await.expect("witness write");
    }

    /// A write to the fenced store for `key` carrying `token`; returns whether it was accepted.
    /// With `enforce` false the store accepts everything but counts stale writes.
    pub(crate) async fn fenced_write(
        &self,
        key: &str,
        holder: &str,
        token: u64,
        enforce: bool,
    ) -> bool {
        let accepted: i64 = FENCED_WRITE
            .key(format!("w:max:{key}"))
            .key(format!("w:owner:{key}"))
            .key(STALE_REJECTED)
            .key(STALE_ACCEPTED)
            .arg(holder)
            .arg(token)
            .arg(if enforce { "1" } else { "0" })
            .invoke_async(&mut self.conn.clone())
            .await
            .expect("witness fenced write");
        accepted == 1
    }

    /// The totals so far.
    pub(crate) async fn seen(&self) -> Seen {
        let mut conn = self.conn.clone();
        let get = |counter: &'static str| {
            let mut conn = self.conn.clone();
            async move {
                let value: Option<u64> = conn.get(counter).await.expect("witness read");
                value.unwrap_or(0)
            }
        };
        let keys: Vec<String> = conn.keys("w:count:*").await.expect("witness keys");
        let mut counted = 0;
        for key in keys {
            let value: u64 = conn.get(&key).await.expect("witness read");
            counted += value;
        }
        Seen {
            overlaps: get(OVERLAPS).await,
            counted,
            stale_rejected: get(STALE_REJECTED).await,
            stale_accepted: get(STALE_ACCEPTED).await,
        }
    }
}
