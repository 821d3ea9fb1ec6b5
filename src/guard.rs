//! Held locks, as the caller sees them.

use std::{
    fmt,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use crate::{
    backend::Backend,
    client::holds::HoldStats,
    clock::BootInstant,
    engine::{AtOnce, EngineRef, Held},
    error::LockError,
    holder::Holder,
    lock_key::LockKey,
};

/// A held lock. Release it with [`release`](Self::release) to learn the outcome, or drop it to
/// release in the background.
///
/// While the guard exists the client's watchdog renews a [`Lease::watchdog`](crate::Lease::watchdog)
/// lease. Dropping the guard stops the renewal at once, even before the release reaches the
/// backend, so a release that fails leaves a lock that expires within one lease.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use tower_lock::LockClient;
///
/// let locks = LockClient::in_memory();
/// let guard = locks.lock("order:42").fencing().acquire().await?;
/// assert!(!guard.is_lost());
/// let token = guard.fencing_token(); // send it with every write
/// # let _ = token;
///
/// tokio::select! {
///     () = async { /* the work */ } => {}
///     () = guard.lost() => return Err("lost the lock mid-work".into()),
/// }
/// guard.release().await?; // or drop it: released in the background
/// # Ok(())
/// # }
/// ```
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard<B: Backend> {
    client: Arc<EngineRef<B>>,
    /// The client's hold times, where this hold's is recorded when it ends.
    holds: Arc<HoldStats>,
    held: Option<Arc<Held>>,
    /// This guard's hold of the grant.
    hold: u64,
    count: u64,
    /// When the acquire heard of the grant.
    acquired_at: BootInstant,
}

impl<B: Backend> LockGuard<B> {
    pub(crate) fn new(
        (client, holds): (Arc<EngineRef<B>>, Arc<HoldStats>),
        (held, hold): (Arc<Held>, u64),
        count: u64,
        acquired_at: BootInstant,
    ) -> Self {
        Self { client, holds, held: Some(held), hold, count, acquired_at }
    }

    /// When the acquire heard of the grant: this hold's time counts from here.
    pub(crate) fn acquired_at(&self) -> BootInstant {
        self.acquired_at
    }

    /// Counts this hold's time from `at` (a set's, from when its last lock was taken).
    pub(crate) fn held_from(&mut self, at: BootInstant) {
        self.acquired_at = at;
    }

    fn held(&self) -> &Held {
        self.held.as_deref().expect("guard used after release")
    }

    /// The lock's name in the backend.
    pub fn key(&self) -> &LockKey {
        &self.held().key
    }

    /// The holder the lock is held by.
    pub fn holder(&self) -> &Holder {
        &self.held().holder
    }

    /// How many times the holder held the lock when this guard was made (1 unless re-entered).
    pub fn hold_count(&self) -> u64 {
        self.count
    }

    /// The fencing token, when the lock was acquired with
    /// [`fencing`](crate::LockRequest::fencing). Tokens of one lock name rise strictly from one
    /// owner to the next, across a restart of the lock store and a failover too (under the
    /// clock assumption [`LockRequest::fencing`](crate::LockRequest::fencing) states); a store
    /// that rejects writes carrying a lower token than the highest it has seen is safe even
    /// against a holder that paused past its lease. Re-entries share their hold's token.
    pub fn fencing_token(&self) -> Option<u64> {
        self.held().token()
    }

    /// Whether the lock is lost: the store no longer has the grant, the lease deadline passed
    /// without a successful renewal, or this guard's own fixed lease ended (a re-entry's lease
    /// ends its own hold only). Checked against the clock, so it is accurate even when the
    /// watchdog has not run yet.
    pub fn is_lost(&self) -> bool {
        self.held().hold_lost_at(self.hold, BootInstant::now())
    }

    /// How long the lock is certainly still held without another renewal.
    pub fn remaining(&self) -> Duration {
        let held = self.held();
        let own = held
            .hold_until(self.hold)
            .map(|until| until.saturating_duration_until(BootInstant::now()));
        own.map_or(held.remaining(), |own| own.min(held.remaining()))
    }

    /// Resolves when the lock is lost while held (see [`is_lost`](Self::is_lost)). Never
    /// resolves for a lock that is released normally.
    pub fn lost(&self) -> Lost {
        Lost::new(self.entry().clone(), self.hold)
    }

    /// This guard's hold of its entry.
    pub(crate) fn hold(&self) -> u64 {
        self.hold
    }

    /// The entry this guard holds, for what the middleware tells a request handler.
    pub(crate) fn entry(&self) -> &Arc<Held> {
        self.held.as_ref().expect("guard used after release")
    }

    /// Releases one hold of the lock.
    ///
    /// # Errors
    /// [`LockError::Lost`] when the lock was lost while held, [`LockError::NotHeld`] when the
    /// backend no longer had it for this holder, [`LockError::Backend`] when the release could not
    /// be confirmed (the lock then expires within one lease, since renewal has stopped).
    pub async fn release(self) -> Result<(), LockError> {
        self.into_release(BootInstant::now()).await
    }

    /// The release at `now` as a future that owns what it needs: its synchronous half (renewal
    /// stopped, a hand-off chosen) done now.
    pub(crate) fn into_release(mut self, now: BootInstant) -> FinishOnDrop {
        let held = self.held.take().expect("guard released twice");
        self.record(&held, now);
        let shared = self.client.engine.clone();
        let releasing = match shared.begin_release(held, self.hold, now) {
            Ok(Some(releasing)) => shared.release_at_once(releasing),
            Ok(None) => AtOnce::Done(Ok(())),
            Err(error) => AtOnce::Done(Err(error)),
        };
        match releasing {
            AtOnce::Done(outcome) => {
                FinishOnDrop { future: None, runtime: None, outcome: Some(outcome) }
            }
            AtOnce::Later(releasing) => FinishOnDrop {
                runtime: shared.runtime(),
                future: Some(Box::pin(async move { shared.finish_release(releasing).await })),
                outcome: None,
            },
        }
    }
}

impl<B: Backend> LockGuard<B> {
    /// Records how long the lock was held, for the `Retry-After` of those who find it busy: the
    /// first hold of a grant only (a re-entry's is part of it), and not a lock that was lost.
    fn record(&self, held: &Held, now: BootInstant) {
        if self.count == 1 && !held.hold_lost_at(self.hold, now) {
            self.holds.record(&held.key, now.duration_since(self.acquired_at));
        }
    }
}

impl<B: Backend> Drop for LockGuard<B> {
    fn drop(&mut self) {
        let Some(held) = self.held.take() else {
            return;
        };
        self.record(&held, BootInstant::now());
        // Renewal stops here, synchronously; only the backend call is spawned.
        self.client.engine.release_detached(held, self.hold);
    }
}

impl<B: Backend> fmt::Debug for LockGuard<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("LockGuard");
        if let Some(held) = &self.held {
            s.field("key", &held.key)
                .field("holder", &held.holder)
                .field("fencing_token", &held.token())
                .field("lost", &held.hold_lost_at(self.hold, BootInstant::now()));
        }
        s.finish_non_exhaustive()
    }
}

/// The backend half of a release, boxed so it can be handed to the runtime.
type Releasing = Pin<Box<dyn Future<Output = Result<(), LockError>> + Send>>;

/// A release in flight that, if its caller is cancelled (a dropped response future, say),
/// finishes on the runtime instead of leaving the lock held until its lease runs out.
pub(crate) struct FinishOnDrop {
    future: Option<Releasing>,
    runtime: Option<tokio::runtime::Handle>,
    /// The release's outcome, when it was known at once: it failed before reaching the
    /// backend (the lock was lost), or the backend answered without waiting.
    outcome: Option<Result<(), LockError>>,
}

impl Future for FinishOnDrop {
    type Output = Result<(), LockError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Some(outcome) = self.outcome.take() {
            return Poll::Ready(outcome);
        }
        let future = self.future.as_mut().expect("polled after completion");
        let result = std::task::ready!(future.as_mut().poll(cx));
        self.future = None;
        Poll::Ready(result)
    }
}

impl Drop for FinishOnDrop {
    fn drop(&mut self) {
        if let (Some(future), Some(runtime)) = (self.future.take(), &self.runtime) {
            runtime.spawn(future);
        }
    }
}

/// Resolves when a held lock is lost. Made by [`LockGuard::lost`]; for a set of locks
/// ([`MultiGuard::lost`](crate::MultiGuard::lost)), when any of them is lost. Once resolved, it
/// stays resolved: polled again, it is ready again.
pub struct Lost(Watching);

enum Watching {
    One(Watch),
    Any(Vec<Watch>),
}

/// One hold's wait for its loss: boxed, since it borrows the lock's entry, which it owns too.
/// The box is made at the first poll that finds the hold live, so a watch that is made but never
/// has to wait (a request whose handler finishes at once) costs no allocation. A wait ends only
/// once its hold is lost, which [`Watch::poll`] checks first: an ended wait is never resumed.
struct Watch {
    held: Arc<Held>,
    hold: u64,
    wait: Option<Pin<Box<dyn Future<Output = ()> + Send + Sync>>>,
}

impl Watch {
    fn new(held: Arc<Held>, hold: u64) -> Self {
        Self { held, hold, wait: None }
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> bool {
        let now = BootInstant::now();
        if self.held.is_marked_lost()
            || self.held.hold_until(self.hold).is_some_and(|until| until <= now)
        {
            return true;
        }
        let (held, until) = (&self.held, self.held.hold_until(self.hold));
        self.wait
            .get_or_insert_with(|| {
                let watched = held.clone();
                Box::pin(async move {
                    let Some(until) = until else {
                        return watched.until_lost().await;
                    };
                    // A fixed hold also ends at its own lease's end.
                    let ends = tokio::time::Instant::now()
                        + until.saturating_duration_until(BootInstant::now());
                    tokio::select! {
                        () = watched.until_lost() => {}
                        () = tokio::time::sleep_until(ends) => {}
                    }
                })
            })
            .as_mut()
            .poll(cx)
            .is_ready()
    }
}

impl Lost {
    /// Resolves when hold `hold` of `held` is lost.
    pub(crate) fn new(held: Arc<Held>, hold: u64) -> Self {
        Self(Watching::One(Watch::new(held, hold)))
    }

    /// Resolves when any of `holds` is lost.
    pub(crate) fn any(holds: impl IntoIterator<Item = (Arc<Held>, u64)>) -> Self {
        Self(Watching::Any(holds.into_iter().map(|(held, hold)| Watch::new(held, hold)).collect()))
    }
}

impl Future for Lost {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let lost = match &mut self.0 {
            Watching::One(watch) => watch.poll(cx),
            // Every one is polled (until one is found lost), so each has registered the waker.
            Watching::Any(watches) => watches.iter_mut().any(|watch| watch.poll(cx)),
        };
        if lost { Poll::Ready(()) } else { Poll::Pending }
    }
}

impl fmt::Debug for Lost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lost").finish_non_exhaustive()
    }
}
