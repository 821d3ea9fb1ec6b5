//! A held set of locks: [`MultiGuard`].

use std::fmt;

use crate::{
    backend::Backend, error::LockError, guard::LockGuard, guard::Lost, holder::Holder,
    lock_key::LockKey,
};

/// One lock of a set: the key as the caller gave it, and its guard.
pub(crate) struct Member<B: Backend> {
    pub(crate) user_key: Vec<u8>,
    pub(crate) guard: LockGuard<B>,
}

/// A held set of locks, made by [`MultiLockRequest::acquire`](crate::MultiLockRequest::acquire).
///
/// Each lock is an ordinary hold of its own: the watchdog renews each one, each has its own
/// fencing token and its own loss detection. The set is lost as soon as any lock of it is.
/// [`release`](Self::release) releases them all together; dropping the guard releases them all
/// in the background.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let locks = tower_lock::LockClient::in_memory();
/// let set = locks.lock_all(["account:7", "account:3"]).fencing().acquire().await?;
///
/// // In the canonical order, not the order given.
/// let names: Vec<_> = set.keys().map(|key| key.user_key()).collect();
/// assert_eq!(names, [b"account:3".to_vec(), b"account:7".to_vec()]);
///
/// let token = set.fencing_token("account:7"); // send it with the write to account 7
/// # assert!(token.is_some());
/// tokio::select! {
///     () = async { /* move money from 7 to 3 */ } => {}
///     () = set.lost() => return Err("lost a lock mid-transfer".into()),
/// }
/// set.release().await?;
/// # Ok(())
/// # }
/// ```
#[must_use = "dropping the guard releases the locks at once"]
pub struct MultiGuard<B: Backend> {
    /// In the canonical order; never empty.
    members: Vec<Member<B>>,
}

impl<B: Backend> MultiGuard<B> {
    pub(crate) fn new(mut members: Vec<Member<B>>) -> Self {
        debug_assert!(!members.is_empty(), "a lock set is never empty");
        // The set is held from now: the waits for its later members are not hold time of its
        // earlier ones (the `Retry-After` of those who find them busy).
        let now = crate::clock::BootInstant::now();
        for member in &mut members {
            member.guard.held_from(now);
        }
        Self { members }
    }

    /// The guard of each lock, in the canonical order (the byte order of the lock names).
    pub fn guards(&self) -> impl ExactSizeIterator<Item = &LockGuard<B>> {
        self.members.iter().map(|member| &member.guard)
    }

    /// The guard of the lock of `key`, named as it was given to
    /// [`lock_all`](crate::LockClient::lock_all) (or as the layer's extractor found it).
    pub fn guard(&self, key: impl AsRef<[u8]>) -> Option<&LockGuard<B>> {
        let key = key.as_ref();
        self.members.iter().find(|member| member.user_key == key).map(|member| &member.guard)
    }

    /// The lock names, in the canonical order.
    pub fn keys(&self) -> impl ExactSizeIterator<Item = &LockKey> {
        self.guards().map(LockGuard::key)
    }

    /// The fencing token of the lock of `key` (as given), when the set was acquired with
    /// [`fencing`](crate::MultiLockRequest::fencing). `None` too for a key not in the set.
    pub fn fencing_token(&self, key: impl AsRef<[u8]>) -> Option<u64> {
        self.guard(key)?.fencing_token()
    }

    /// The holder the set is held by (one for every lock of it).
    pub fn holder(&self) -> &Holder {
        self.members[0].guard.holder()
    }

    /// Whether any lock of the set is lost (see [`LockGuard::is_lost`]).
    pub fn is_lost(&self) -> bool {
        self.guards().any(LockGuard::is_lost)
    }

    /// Resolves when any lock of the set is lost while held.
    pub fn lost(&self) -> Lost {
        Lost::any(self.guards().map(|guard| (guard.entry().clone(), guard.hold())))
    }

    /// Each lock's user key and guard, for what the middleware tells a handler.
    pub(crate) fn members(&self) -> &[Member<B>] {
        &self.members
    }

    /// Releases every lock of the set, all at once (a release never waits for anyone, so no
    /// order is needed: the releases are sent together, and the set is free after about one
    /// round trip rather than one per lock). Every lock is released even when one release
    /// fails.
    ///
    /// # Errors
    /// The first error, in the canonical order, of the releases, as [`LockGuard::release`]
    /// reports it.
    pub async fn release(self) -> Result<(), LockError> {
        let releases = self.members.into_iter().map(|member| member.guard.release());
        // Cancelled midway, each release not yet done finishes on the runtime, as a dropped
        // guard's does.
        let results = futures_util::future::join_all(releases).await;
        results.into_iter().collect()
    }
}

impl<B: Backend> fmt::Debug for MultiGuard<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiGuard").field("guards", &self.guards().collect::<Vec<_>>()).finish()
    }
}
