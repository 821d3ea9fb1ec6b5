//! The first baseline: a minimal Redis lock as one would write it by hand.
//!
//! - acquire: `SET key token NX PX lease`; when taken, subscribe to `key:released`, try again
//!   (`SET` + `PTTL` in one round trip) and wait for a message or the holder's remaining TTL;
//! - release: `EVALSHA` of a script that deletes the key only if it still holds our token and
//!   then `PUBLISH`es on `key:released`;
//! - renew: `EVALSHA` of a script that `PEXPIRE`s the key only if it still holds our token.
//!
//! One multiplexed connection for commands and one pub/sub connection per client. A message
//! wakes one waiting task of the process (the others keep waiting for the next release).
//! Not reentrant, no watchdog, no fencing, no queue.
#![allow(dead_code)]

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use futures_util::StreamExt;
use tokio::sync::{Mutex, Notify};
use tower_lock::backend::redis::redis::{self, aio};

const RELEASE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
    redis.call('DEL', KEYS[1]) redis.call('PUBLISH', ARGV[2], '') return 1 end return 0";
const RENEW: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
    return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0";

static NEXT_TOKEN: AtomicU64 = AtomicU64::new(0);

/// Why an acquire or release failed.
#[derive(Debug)]
pub(crate) enum HandError {
    Redis(redis::RedisError),
    WaitTimeout,
    NotHeld,
}

impl From<redis::RedisError> for HandError {
    fn from(e: redis::RedisError) -> Self {
        Self::Redis(e)
    }
}

/// A held lock: its key and token.
#[derive(Debug)]
pub(crate) struct HandGuard {
    pub(crate) key: String,
    token: String,
}

/// Per channel: the notifier of this process's waiters and how many wait.
type Waiting = Arc<Mutex<HashMap<String, (Arc<Notify>, usize)>>>;

/// A client of the hand-written lock.
#[derive(Clone)]
pub(crate) struct HandLock {
    conn: aio::MultiplexedConnection,
    subscriptions: aio::PubSubSink,
    waiting: Waiting,
    release_sha: String,
    renew_sha: String,
    lease_ms: u64,
}

impl HandLock {
    pub(crate) async fn connect(url: &str, lease: Duration) -> redis::RedisResult<Self> {
        let client = redis::Client::open(url)?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        let (subscriptions, mut messages) = client.get_async_pubsub().await?.split();
        let load = |body: &str| redis::cmd("SCRIPT").arg("LOAD").arg(body).clone();
        let (release_sha, renew_sha) = (load(RELEASE), load(RENEW));
        let waiting = Waiting::default();
        let dispatch = Arc::downgrade(&waiting);
        tokio::spawn(async move {
            while let Some(message) = messages.next().await {
                let Some(waiting) = dispatch.upgrade() else {
                    break;
                };
                if let Some((notify, _)) = waiting.lock().await.get(message.get_channel_name()) {
                    notify.notify_one();
                }
            }
        });
        Ok(Self {
            release_sha: release_sha.query_async(&mut conn).await?,
            renew_sha: renew_sha.query_async(&mut conn).await?,
            conn,
            subscriptions,
            waiting,
            lease_ms: lease.as_millis() as u64,
        })
    }

    /// Takes `key`, waiting at most `wait` for it.
    pub(crate) async fn acquire(&self, key: &str, wait: Duration) -> Result<HandGuard, HandError> {
        let deadline = Instant::now() + wait;
        let token =
            format!("{}:{}", std::process::id(), NEXT_TOKEN.fetch_add(1, Ordering::Relaxed));
        let set =
            redis::cmd("SET").arg(key).arg(&token).arg("NX").arg("PX").arg(self.lease_ms).clone();
        let mut conn = self.conn.clone();
        let guard = HandGuard { key: key.to_owned(), token };
        if set.query_async::<Option<String>>(&mut conn).await?.is_some() {
            return Ok(guard);
        }
        let channel = format!("{key}:released");
        let notify = self.enter(&channel).await?;
        let result = async {
            loop {
                let notified = notify.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let (taken, ttl): (Option<String>, i64) = redis::pipe()
                    .add_command(set.clone())
                    .cmd("PTTL")
                    .arg(key)
                    .query_async(&mut conn)
                    .await?;
                if taken.is_some() {
                    return Ok(());
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(HandError::WaitTimeout);
                }
                let ttl = match ttl {
                    -2 => continue, // released in between: try again at once
                    -1 => self.lease_ms,
                    ms => ms as u64,
                };
                let _ = tokio::time::timeout(Duration::from_millis(ttl).min(left), notified).await;
            }
        }
        .await;
        self.leave(&channel).await;
        result.map(|()| guard)
    }

    /// Releases `guard`'s lock if it still holds it, and wakes a waiter.
    pub(crate) async fn release(&self, guard: HandGuard) -> Result<(), HandError> {
        let channel = format!("{}:released", guard.key);
        let released: i64 = redis::cmd("EVALSHA")
            .arg(&self.release_sha)
            .arg(1)
            .arg(&guard.key)
            .arg(&guard.token)
            .arg(channel)
            .query_async(&mut self.conn.clone())
            .await?;
        if released == 1 { Ok(()) } else { Err(HandError::NotHeld) }
    }

    /// Renews every lock of `guards` in one pipeline; how many were still held.
    pub(crate) async fn renew(&self, guards: &[HandGuard]) -> Result<usize, HandError> {
        let mut pipe = redis::pipe();
        for guard in guards {
            pipe.cmd("EVALSHA")
                .arg(&self.renew_sha)
                .arg(1)
                .arg(&guard.key)
                .arg(&guard.token)
                .arg(self.lease_ms);
        }
        let renewed: Vec<i64> = pipe.query_async(&mut self.conn.clone()).await?;
        Ok(renewed.iter().filter(|r| **r == 1).count())
    }

    /// One pipeline of a bare `PEXPIRE` per lock: no owner check, so not a renewal one could
    /// ship, but the least Redis work that moves every lock's own expiry, which any per-lock
    /// renewal pays (W4's floor).
    pub(crate) async fn expire_all(&self, guards: &[HandGuard]) -> Result<(), HandError> {
        let mut pipe = redis::pipe();
        for guard in guards {
            pipe.cmd("PEXPIRE").arg(&guard.key).arg(self.lease_ms).ignore();
        }
        pipe.query_async::<()>(&mut self.conn.clone()).await?;
        Ok(())
    }

    /// Counts a waiter on `channel`, subscribing for the first one.
    async fn enter(&self, channel: &str) -> Result<Arc<Notify>, HandError> {
        let mut waiting = self.waiting.lock().await;
        if let Some((notify, n)) = waiting.get_mut(channel) {
            *n += 1;
            return Ok(notify.clone());
        }
        self.subscriptions.clone().subscribe(channel).await?;
        let notify = Arc::new(Notify::new());
        waiting.insert(channel.to_owned(), (notify.clone(), 1));
        Ok(notify)
    }

    /// Uncounts a waiter on `channel`, unsubscribing after the last one.
    async fn leave(&self, channel: &str) {
        let mut waiting = self.waiting.lock().await;
        if let Some((_, n)) = waiting.get_mut(channel) {
            *n -= 1;
            if *n == 0 {
                waiting.remove(channel);
                let _ = self.subscriptions.clone().unsubscribe(channel).await;
            }
        }
    }
}
