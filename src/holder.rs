//! Holder identity: who owns a lock, and how code finds the holder it runs for.
//!
//! Redis-based locks in other ecosystems name the owner after the calling thread. Async tasks
//! move between threads and one task can drive several unrelated futures (`join!`), so here the
//! owner is an explicit [`Holder`]: `client-uuid:sequence`, made by a
//! [`LockClient`](crate::LockClient) and never taken from request data. Code that runs inside
//! [`Holder::scope`] acquires locks as that holder, and so re-enters locks the holder already has
//! instead of deadlocking on them. Outside any scope, every acquire uses a fresh holder. A
//! scope only applies to the client that made its holder: two clients never re-enter each
//! other's locks through a scope.

use std::{fmt, future::Future, sync::Arc};

use tokio::task::futures::TaskLocalFuture;

tokio::task_local! {
    static CURRENT: Holder;
}

/// The identity a lock is held under. Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Holder {
    id: Arc<str>,
}

impl Holder {
    /// Made only by the client, from its random id and a sequence number.
    pub(crate) fn new(client_id: &str, sequence: u64) -> Self {
        Self {
            id: numbered(client_id, b':', sequence),
        }
    }

    /// Whether this holder was made by the client with id `client_id`.
    pub(crate) fn is_from(&self, client_id: &str) -> bool {
        self.id
            .strip_prefix(client_id)
            .is_some_and(|rest| rest.starts_with(':'))
    }

    /// The id stored in the backend as the lock's owner.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The holder of the current scope, if any.
    pub fn current() -> Option<Self> {
        CURRENT.try_with(Self::clone).ok()
    }

    /// Runs `future` with `self` as the current holder: every acquire inside it that does not
    /// name a holder uses this one.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_lock::LockError> {
    /// use tower_lock::{LockClient, MemoryBackend};
    ///
    /// let locks = LockClient::builder(MemoryBackend::new()).build().unwrap();
    /// let holder = locks.holder();
    /// holder
    ///     .scope(async {
    ///         let outer = locks.lock("order:42").acquire().await?;
    ///         // Same holder, same key: re-enters instead of waiting for itself.
    ///         let inner = locks.lock("order:42").try_acquire().await?;
    ///         inner.release().await?;
    ///         outer.release().await
    ///     })
    ///     .await
    /// # }
    /// ```
    pub fn scope<F: Future>(self, future: F) -> TaskLocalFuture<Self, F> {
        CURRENT.scope(self, future)
    }

    /// Runs the synchronous `f` with `self` as the current holder (for code that runs before the
    /// first poll, such as a tower service's `call`).
    pub fn sync_scope<R>(self, f: impl FnOnce() -> R) -> R {
        CURRENT.sync_scope(self, f)
    }
}

impl fmt::Debug for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Holder").field(&&*self.id).finish()
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id)
    }
}

/// `head`, `separator` and `n` in decimal: the ids of holders and attempts, made for every
/// acquire, so without the formatting machinery, and in one allocation.
pub(crate) fn numbered(head: &str, separator: u8, n: u64) -> Arc<str> {
    crate::scratch::shared(|id| {
        id.push_str(head);
        id.push(char::from(separator));
        id.extend(
            Decimal::new(n)
                .as_bytes()
                .iter()
                .map(|&digit| char::from(digit)),
        );
    })
}

/// A number's decimal digits, written without allocating.
pub(crate) struct Decimal {
    digits: [u8; 20],
    start: usize,
}

impl Decimal {
    pub(crate) fn new(mut n: u64) -> Self {
        let mut digits = [0; 20];
        let mut start = digits.len();
        loop {
            start -= 1;
            // `n % 10` is below 10: the cast cannot truncate.
            digits[start] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        Self { digits, start }
    }

    /// The digits, in ASCII.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.digits[self.start..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_ids_read_as_formatted() {
        for n in [0, 7, 10, 99, 1_000_001, u64::MAX] {
            assert_eq!(&*numbered("client", b':', n), format!("client:{n}"));
            let long = "c".repeat(200);
            assert_eq!(&*numbered(&long, b'#', n), format!("{long}#{n}"));
            assert_eq!(Decimal::new(n).as_bytes(), n.to_string().as_bytes());
        }
        assert_eq!(Holder::new("c", 12).id(), "c:12");
    }
}
