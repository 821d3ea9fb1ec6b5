//! [`LockClientBuilder`]: every setting of a client, checked once at build time.

use std::{sync::Arc, time::Duration};

use super::LockClient;
use crate::{
    backend::Backend,
    engine::{Config, Engine, EngineRef, MIN_LEASE},
    error::ConfigError,
    lease::Lease,
    lock_key,
};

/// Builds a [`LockClient`]. Made by [`LockClient::builder`].
#[derive(Debug)]
#[must_use]
pub struct LockClientBuilder<B> {
    pub(super) backend: B,
    pub(super) config: Config,
}

impl<B: Backend> LockClientBuilder<B> {
    /// The name this client's holder ids start with, so that
    /// [`inspect`](LockClient::inspect) and the logs say which instance holds a lock: ids read
    /// `<name>@<host>/<pid>/<random>:<sequence>`, such as `billing@web-1/4242/3f2a…:17`.
    /// Characters other than ASCII letters, digits, `.`, `-` and `_` become `_`, and the name
    /// is cut to 40 bytes (the host name too). The random part keeps the ids of two clients
    /// of the same name apart. Defaults to the environment's `OTEL_SERVICE_NAME` when set,
    /// else the executable's file name.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use tower_lock::{LockClient, MemoryBackend};
    ///
    /// let locks = LockClient::builder(MemoryBackend::new()).name("billing").build()?;
    /// let guard = locks.lock("account:7").acquire().await?;
    /// let info = locks.inspect("account:7").await?;
    /// let client = info.holders[0].client().expect("a holder of this crate");
    /// assert!(client.starts_with("billing@")); // billing@<host>/<pid>
    /// # guard.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.config.name = Some(name.into());
        self
    }

    /// The prefix of every backend key this client uses. Must not contain `{` or `}`.
    /// Defaults to `"tower-lock:"`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.config.prefix = prefix.into();
        self
    }

    /// The lease used when a request does not set one, 3 ms to 365 days. Defaults to
    /// `Lease::watchdog(Duration::from_secs(5))` ([`Lease::DEFAULT`]).
    pub fn lease(mut self, lease: Lease) -> Self {
        self.config.lease = lease;
        self
    }

    /// How long [`LockRequest::acquire`](crate::LockRequest::acquire) waits when a request does not say. Zero means try
    /// once; `Duration::MAX` waits without limit. Defaults to 5 seconds.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.config.wait = wait;
        self
    }

    /// The longest user key accepted, in bytes. Defaults to 512.
    pub fn max_key_len(mut self, max: usize) -> Self {
        self.config.max_key_len = max;
        self
    }

    /// The longest the watchdog keeps renewing one lock; after that the lease runs out and the
    /// guard reports itself lost. Defaults to no limit.
    pub fn max_hold(mut self, max: Duration) -> Self {
        self.config.max_hold = Some(max);
        self
    }

    /// How many acquires may wait for one key in this client at once; one more fails at once
    /// with [`LockError::TooManyWaiters`](crate::LockError::TooManyWaiters). Defaults to 1024.
    pub fn max_waiters_per_key(mut self, max: usize) -> Self {
        self.config.max_waiters_per_key = max;
        self
    }

    /// How many acquires may wait in this client at once, over all keys; one more fails at
    /// once with [`LockError::TooManyWaiters`](crate::LockError::TooManyWaiters) (the layer answers 503 with `Retry-After`).
    /// Each waiter costs a task, and for a new key a subscription. Defaults to 10 000.
    pub fn max_waiters(mut self, max: usize) -> Self {
        self.config.max_waiters = max;
        self
    }

    /// Names locks by `base64url(HMAC-SHA256(secret, namespace and key))` instead of the
    /// escaped key: every name is as long whatever the key, and nobody without the secret can
    /// choose keys that crowd one Redis Cluster slot. Clients sharing locks must share the
    /// secret (and prefix); switching it on or off, or changing the secret, renames every lock,
    /// so do it only while no old-style holder runs. Off by default. The secret never appears
    /// in `Debug` output.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use tower_lock::{LockClient, LockKind, MemoryBackend};
    ///
    /// let locks = LockClient::builder(MemoryBackend::new())
    ///     .keyed_hash(b"a secret from your configuration")
    ///     .build()?;
    /// let name = locks.lock_key("", "order:42", LockKind::Exclusive)?;
    /// assert_eq!(name.as_str().len(), "tower-lock:{}".len() + 43);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "keyed-hash")]
    pub fn keyed_hash(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.config.keyed_hash = Some(lock_key::KeyedHash::new(secret.as_ref()));
        self
    }

    /// How many times in a row a release may hand the lock straight to a waiter of this client
    /// before it releases for real, giving waiters in other processes their turn. While no
    /// other process was seen waiting for the key in the last second, the streak may run eight
    /// times longer.
    /// Zero disables hand-off. Defaults to 3.
    pub fn handoff_streak(mut self, max: u32) -> Self {
        self.config.handoff_streak = max;
        self
    }

    /// How long a waiter's place in a fair lock's queue (or a waiting writer's claim on a
    /// read-write lock) survives without being kept alive. A live waiter's client keeps it
    /// alive; a crashed waiter is purged after this and the next waiter moves up. 3 ms to 365
    /// days; defaults to 5 seconds.
    pub fn waiter_timeout(mut self, timeout: Duration) -> Self {
        self.config.waiter_timeout = timeout;
        self
    }

    /// Builds the client. Its watchdog starts with the first lock it takes, on that caller's
    /// tokio runtime.
    ///
    /// # Errors
    /// [`ConfigError`] naming the setting that cannot work: a prefix with braces, a zero lease,
    /// a zero `max_key_len`.
    pub fn build(self) -> Result<LockClient<B>, ConfigError> {
        let config = self.config;
        if !lock_key::valid_prefix(&config.prefix) {
            return Err(ConfigError::PrefixBraces(config.prefix));
        }
        if config.lease.duration() < MIN_LEASE {
            return Err(ConfigError::LeaseTooShort);
        }
        if !config.lease.is_valid() {
            return Err(ConfigError::Invalid {
                setting: "lease",
                reason: "must be at most 365 days",
            });
        }
        if config.max_key_len == 0 {
            return Err(ConfigError::ZeroMaxKeyLen);
        }
        if !Lease::fixed(config.waiter_timeout).is_valid() {
            return Err(ConfigError::Invalid {
                setting: "waiter_timeout",
                reason: "must be 3 ms (so it can be kept alive) to 365 days",
            });
        }
        let engine = Engine::new(self.backend, config);
        Ok(LockClient { inner: Arc::new(EngineRef { engine }), holds: Arc::default() })
    }
}
