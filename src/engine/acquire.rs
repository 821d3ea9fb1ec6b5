//! Acquiring: re-entry, the local waiter queue, contending in the backend, waiting for a
//! release, and resolving attempts whose outcome is unknown.

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use super::{
    Engine, Held, Loss,
    held::Reentry,
    table::{Found, Ticket, Turn, Want},
};
use crate::{
    backend::{
        Backend, LockKind,
        store::{AcquireReply, Extend, ExtendReply, Grant, Listen},
    },
    clock::BootInstant,
    error::{BackendError, BackendErrorKind, LockError},
    lock_key::LockKey,
};

/// A granted acquire: the entry, the new hold's id in it, and when the grant was heard of
/// (where the hold's own time starts).
pub(crate) struct Acquired {
    pub(crate) held: Arc<Held>,
    pub(crate) hold: u64,
    pub(crate) at: BootInstant,
}

/// A validated acquire.
pub(crate) struct Request {
    pub(crate) key: LockKey,
    pub(crate) want: Arc<Want>,
    pub(crate) wait: Duration,
}

/// A waiter of the client (counted against `max_waiters`) in its key's queue, given up when
/// the acquire future ends, however it ends.
struct QueueGuard<'a, B: Backend> {
    shared: &'a Arc<Engine<B>>,
    request: &'a Request,
    id: u64,
    /// The waiter has a place in the backend's queue to give up.
    in_backend: bool,
}

impl<'a, B: Backend> QueueGuard<'a, B> {
    /// Counts the waiter and queues it (with a place in the backend's queue kept for `queue`).
    fn join(
        shared: &'a Arc<Engine<B>>,
        request: &'a Request,
        queue: Option<Duration>,
    ) -> Result<(Self, Ticket), LockError> {
        let config = &shared.config;
        if shared.waiting.fetch_add(1, Ordering::AcqRel) >= config.max_waiters {
            shared.waiting.fetch_sub(1, Ordering::AcqRel);
            tracing::debug!(max = config.max_waiters, "too many waiters in this client");
            return Err(LockError::TooManyWaiters);
        }
        crate::metrics::waiting(true);
        let id = shared.next_id();
        let guard = Self { shared, request, id, in_backend: false };
        let (key, want) = (&request.key, request.want.clone());
        let ticket = shared.table.join(id, key, want, queue, config.max_waiters_per_key)?;
        Ok((guard, ticket))
    }
}

impl<B: Backend> Drop for QueueGuard<'_, B> {
    fn drop(&mut self) {
        self.shared.waiting.fetch_sub(1, Ordering::AcqRel);
        crate::metrics::waiting(false);
        self.shared.table.leave(&self.request.key, self.id);
        if self.in_backend
            && let Some(runtime) = self.shared.runtime()
        {
            // Leave at once rather than wait to be purged, passing the wake-up on if first.
            let (shared, key, want) =
                (self.shared.clone(), self.request.key.clone(), self.request.want.clone());
            runtime.spawn(async move { shared.leave_queue(&key, &want).await });
        }
    }
}

/// An attempt sent to the store whose answer has not been dealt with. Dropped unsettled (the
/// acquire was cancelled mid-call, or its reply was lost and not resolved at once), it is
/// resolved in the background like any lost reply: undone if it took the lock, voided if it
/// has not arrived yet.
struct InFlight<'a, B: Backend> {
    shared: &'a Arc<Engine<B>>,
    key: &'a LockKey,
    want: &'a Arc<Want>,
    settled: bool,
}

impl<B: Backend> Drop for InFlight<'_, B> {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let Some(runtime) = self.shared.runtime() else {
            return;
        };
        let (shared, key, want) = (self.shared.clone(), self.key.clone(), self.want.clone());
        tracing::debug!(key = %key, attempt = %want.attempt, "acquire unanswered; resolving it in the background");
        runtime.spawn(async move {
            shared.resolve_until_done(&key, &want).await;
            // The attempt may have queued its holder (fair locks, writers): leave the queue
            // rather than stay in the way until the place times out.
            if want.kind.queues() {
                shared.leave_queue(&key, &want).await;
            }
        });
    }
}

/// A re-entry whose extend is on its way: reported as failed if its future is dropped, so the
/// entry does not wait for it for ever.
struct PendingExtend<'a, B: Backend> {
    shared: &'a Arc<Engine<B>>,
    held: &'a Arc<Held>,
    done: bool,
}

impl<B: Backend> Drop for PendingExtend<'_, B> {
    fn drop(&mut self) {
        if !self.done && self.held.extend_failed() {
            self.shared.end_quietly(self.held);
        }
    }
}

impl<B: Backend> Engine<B> {
    /// Acquires for `request`: a re-entry of a grant its holder holds here (no round trip,
    /// unless the grant needs more lease or a token), and otherwise a wait for the lock.
    pub(crate) async fn acquire(self: &Arc<Self>, request: Request) -> Result<Acquired, LockError> {
        let want = &request.want;
        match self.table.find(&request.key, &want.holder, want.kind) {
            Some(Found::Reenter(held)) => {
                if let Some(reentered) = self.reenter(&request, held).await? {
                    return Ok(reentered);
                }
                // The grant is over: acquire afresh.
            }
            Some(Found::Upgrade) => return Err(LockError::UpgradeRefused),
            Some(Found::Within(grant)) => {
                let want = Arc::new(Want { within: Some(grant), ..(**want).clone() });
                return self.wait_and_acquire(&Request { want, ..request }).await;
            }
            None => {}
        }
        self.wait_and_acquire(&request).await
    }

    /// Re-enters `held`, which the holder holds here: a hold added at once, or after one extend
    /// naming the grant. `None` when the grant is over (lost, or its holds ended): the caller
    /// acquires afresh.
    async fn reenter(
        self: &Arc<Self>,
        request: &Request,
        held: Arc<Held>,
    ) -> Result<Option<Acquired>, LockError> {
        let want = &request.want;
        let now = BootInstant::now();
        let lease = match held.reenter(want.lease, want.fencing, now) {
            Reentry::Local(hold) => {
                self.watch(held.next_event());
                return Ok(Some(Acquired { held, hold, at: now }));
            }
            Reentry::Ended => return Ok(None),
            Reentry::Extend(lease) => lease,
        };
        let mut pending = PendingExtend { shared: self, held: &held, done: false };
        let extend = Extend {
            key: &held.key,
            kind: held.kind,
            grant: held.grant(),
            lease,
            fencing: want.fencing,
        };
        let reply = self.backend.extend(extend).await;
        pending.done = true;
        match reply {
            Ok(ExtendReply::Extended { token }) => match held.extended(want.lease, token, now) {
                Ok(hold) => {
                    self.watch(held.next_event());
                    Ok(Some(Acquired { held: held.clone(), hold, at: BootInstant::now() }))
                }
                // The grant was lost while the extend was on its way (the new hold would be lost
                // from the start), or the extend came after the re-entry's own lease.
                Err(ended) => {
                    if ended {
                        self.end_quietly(&held);
                    }
                    Err(LockError::Lost)
                }
            },
            Ok(ExtendReply::NotHeld) => {
                held.extend_failed();
                self.lose(&held, Loss::Taken("extend found the grant gone"));
                Ok(None)
            }
            Err(error) => {
                // The record may have been extended: the grant's delete still covers it.
                if held.extend_failed() {
                    self.end_quietly(&held);
                }
                Err(LockError::Backend(error.with_key(request.key.as_str())))
            }
        }
    }

    /// Queues behind local waiters, contends in the backend when first, and waits for a
    /// release notification, a hand-off or the holder's lease to run out.
    async fn wait_and_acquire(self: &Arc<Self>, request: &Request) -> Result<Acquired, LockError> {
        let mut want = request.want.clone();
        // Fair waiters and waiting writers keep a place in the backend's queue while waiting.
        let queue =
            (want.kind.queues() && !request.wait.is_zero()).then_some(self.config.waiter_timeout);
        let (mut queued, mut ticket) = QueueGuard::join(self, request, queue)?;
        let id = queued.id;
        let started = tokio::time::Instant::now();
        let deadline = crate::clock::after(started, request.wait);
        let mut listener = None;
        // The current holder's remaining lease, as last seen: the hint for a caller timed out.
        let mut behind = Behind::default();
        // Whether an attempt of this acquisition found the lock held.
        let mut contended = false;
        loop {
            // When to try again at the latest (the holder's lease runs out).
            let retry_in = match self.table.turn(&request.key, id) {
                Turn::Contend(renamed) => {
                    if let Some(renamed) = renamed {
                        want = renamed;
                    }
                    let grant = Grant { contended, ..want.grant(&request.key, queue) };
                    let sent_at = BootInstant::now();
                    let mut in_flight =
                        InFlight { shared: self, key: &request.key, want: &want, settled: false };
                    let reply = self.backend.acquire(grant).await;
                    let replied_at = BootInstant::now();
                    let late = matches!(reply, Ok(AcquireReply::Acquired { .. }))
                        && want.lease.valid_until(sent_at) <= replied_at;
                    // Settled now unless something is still to be undone below.
                    if !late && !matches!(&reply, Err(error) if error.outcome_unknown()) {
                        in_flight.settled = true;
                    }
                    match reply {
                        Ok(AcquireReply::Acquired { token }) => {
                            // The backend took it out of its queue in the same step.
                            queued.in_backend = false;
                            if late {
                                // Granted, but the reply came after the lease ran out: the
                                // lock may be someone else's already. Undo it and say so.
                                Box::pin(self.resolve_attempt(&request.key, &want)).await;
                                in_flight.settled = true;
                                let error = BackendError::new(
                                    BackendErrorKind::Timeout,
                                    "the lock was granted, but the reply came after its lease ran out",
                                );
                                return Err(LockError::Backend(
                                    error.with_key(request.key.as_str()),
                                ));
                            }
                            let (held, hold) = Held::new(
                                request.key.clone(),
                                want.holder.clone(),
                                want.kind,
                                (want.attempt.clone(), token),
                                want.lease,
                                sent_at,
                                self.config.max_hold,
                            );
                            self.table.acquired(&request.key, id, held.clone());
                            self.watch(held.next_event());
                            return Ok(Acquired { held, hold, at: replied_at });
                        }
                        Ok(reply @ (AcquireReply::Held { ttl } | AcquireReply::Spent { ttl })) => {
                            behind.saw(ttl, replied_at);
                            contended = true;
                            if matches!(reply, AcquireReply::Spent { .. }) {
                                // Undone on part of the store, where its id is now refused.
                                drop(in_flight);
                                want = self.next_attempt(&want);
                                self.table.set_want(&request.key, id, want.clone());
                            }
                            if let Some(place) = &ticket.queued {
                                // The watchdog keeps the place alive from now on.
                                self.watch(place.joined(sent_at));
                                queued.in_backend = true;
                            }
                            if request.wait.is_zero() || tokio::time::Instant::now() >= deadline {
                                return Err(behind.timed_out(started));
                            }
                            if listener.is_none() {
                                let (shared_listener, fresh) =
                                    Box::pin(self.listen(&request.key, &want)).await?;
                                listener = Some(shared_listener);
                                if fresh {
                                    // Check again now that releases can no longer be missed.
                                    continue;
                                }
                            }
                            ttl
                        }
                        Err(error) => {
                            let retry_in = if let Some(ends) = error.quarantine_ends() {
                                // Nothing was sent: come back when the quarantine ends, or
                                // answer now if the wait ends first.
                                in_flight.settled = true;
                                drop(in_flight);
                                if request.wait.is_zero() || ends >= deadline {
                                    let error = error.with_key(request.key.as_str());
                                    return Err(LockError::Backend(error));
                                }
                                ends.saturating_duration_since(tokio::time::Instant::now())
                            } else {
                                let unknown = error.outcome_unknown();
                                // The attempt may have queued its holder: leave when done.
                                queued.in_backend |= unknown && queue.is_some();
                                if unknown {
                                    Box::pin(self.resolve_attempt(&request.key, &want)).await;
                                }
                                let error =
                                    LockError::Backend(error.with_key(request.key.as_str()));
                                in_flight.settled = true;
                                drop(in_flight);
                                // An attempt that could not end before the deadline is not
                                // started: the caller hears of the failure within its wait.
                                let took = BootInstant::now().duration_since(sent_at);
                                let next_ends = tokio::time::Instant::now() + RETRY_PAUSE + took;
                                if !worth_retrying(&error) || next_ends >= deadline {
                                    return Err(error);
                                }
                                tracing::debug!(key = %request.key, error = %format_args!("{error:#}"), "backend error while waiting; trying again");
                                // The failed attempt may have been recorded as given up on:
                                // retry under a new id.
                                want = self.next_attempt(&want);
                                self.table.set_want(&request.key, id, want.clone());
                                RETRY_PAUSE
                            };
                            Some(retry_in)
                        }
                    }
                }
                Turn::Park(remaining) => {
                    if remaining.is_some() {
                        behind.saw(remaining, BootInstant::now());
                    }
                    if request.wait.is_zero() {
                        return Err(behind.timed_out(started));
                    }
                    None
                }
                Turn::Yield(pause) => {
                    if request.wait.is_zero() {
                        behind.saw(Some(pause), BootInstant::now());
                        return Err(behind.timed_out(started));
                    }
                    Some(pause)
                }
                Turn::AwaitHandoff => None,
            };
            tracing::trace!(?retry_in, "waiting for the lock");
            let listening = listener.clone();
            // Boxed, like every step the uncontended path skips: the acquire future stays small
            // for the common case, which moves it into place on every request.
            // The outcome, if the wake-up decided it; otherwise the lock is looked at again.
            let outcome = Box::pin(async {
                tokio::select! {
                    biased;
                    () = self.stop.cancelled() => Some(Err(LockError::ShutDown)),
                    handed = &mut ticket.handoff => Some(match handed {
                        Ok(handoff) => {
                            let (held, hold) = handoff.take();
                            Ok(Acquired { held, hold, at: BootInstant::now() })
                        }
                        // Only a dropped table could drop the sender.
                        Err(_) => Err(LockError::ShutDown),
                    }),
                    () = ticket.wake.notified() => None,
                    () = notified(listening.as_deref()) => None,
                    () = sleep_opt(retry_in) => None,
                    () = tokio::time::sleep_until(deadline) => Some(Err(behind.timed_out(started))),
                }
            })
            .await;
            if let Some(outcome) = outcome {
                return outcome;
            }
        }
    }

    /// The release listener for a waiter of `key`, and whether it is new (the lock is then
    /// checked again). Exclusive waiters share one per key (only the head contends); a fair
    /// waiter listens for its own name; readers, writers and a semaphore's contenders each listen.
    async fn listen(
        &self,
        key: &LockKey,
        want: &Want,
    ) -> Result<(Arc<B::Listener>, bool), LockError> {
        let exclusive = want.kind == LockKind::Exclusive;
        if exclusive && let Some(listener) = self.table.listener(key) {
            return Ok((listener, false));
        }
        let only_for = (want.kind == LockKind::Fair).then(|| want.holder.id());
        let listener = self
            .backend
            .listen(key, only_for)
            .await
            .map_err(|e| LockError::Backend(e.with_key(key.as_str())))?;
        let listener = match exclusive {
            true => self.table.set_listener(key, listener),
            false => Arc::new(listener),
        };
        Ok((listener, true))
    }

    /// Gives up `want`'s place in the backend's wait queue (its entry times out otherwise).
    async fn leave_queue(&self, key: &LockKey, want: &Want) {
        if let Err(error) = self.backend.leave(key, want.holder.id(), want.kind).await {
            tracing::debug!(key = %key, error = %format_args!("{error:#}"), "leaving the wait queue failed; the entry times out");
        }
    }

    /// Makes sure an attempt of `want` whose reply was lost holds nothing: once now, and while
    /// the backend cannot be reached, again in the background until it answers or the
    /// attempt's lease has run out anyway.
    pub(crate) async fn resolve_attempt(self: &Arc<Self>, key: &LockKey, want: &Arc<Want>) {
        if self.try_resolve(key, want).await.is_err()
            && let Some(runtime) = self.runtime()
        {
            let (shared, key, want) = (self.clone(), key.clone(), want.clone());
            runtime.spawn(async move { shared.resolve_until_done(&key, &want).await });
        }
    }

    /// Resolves an attempt whose reply was lost, trying until the store answers, the attempt's
    /// lease has run out (it then holds nothing anyway) or the client stops; each try no sooner
    /// than the store is expected back. Logged at debug: the store's incident is logged by its
    /// backend, and an unresolved attempt holds the lock no longer than a crashed holder.
    async fn resolve_until_done(&self, key: &LockKey, want: &Want) {
        let give_up = tokio::time::Instant::now() + want.lease.duration();
        let mut pause = RETRY_PAUSE;
        let mut tries = 1u32;
        while let Err(error) = self.try_resolve(key, want).await {
            let next =
                tokio::time::Instant::now() + pause.max(error.retry_after().unwrap_or_default());
            if next >= give_up || !self.stop.allows_cleanup() {
                tracing::debug!(key = %key, attempt = %want.attempt, tries, "stopped resolving an attempt whose reply was lost: its lease is over");
                return;
            }
            tokio::time::sleep_until(next).await;
            pause = (pause * 2).min(Duration::from_secs(1));
            tries += 1;
        }
    }

    /// One try at resolving an attempt of `want` whose reply was lost: `Ok` once the backend
    /// has undone or voided it.
    async fn try_resolve(&self, key: &LockKey, want: &Want) -> Result<(), BackendError> {
        let outcome = self.backend.abandon(want.grant(key, None)).await;
        let error = outcome.as_ref().err().map(|error| format!("{error:#}"));
        tracing::debug!(key = %key, attempt = %want.attempt, undone = ?outcome.as_ref().ok(), error, "resolving an attempt whose reply was lost");
        outcome.map(drop)
    }
}

/// The pause before an acquire whose attempt failed tries again.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Whether an acquire that failed with `error` tries again within its wait: when the store could
/// not be reached or did not answer in time, unless it is known to be down (it refuses
/// connections and says when it is probed next): then the caller hears at once.
fn worth_retrying(error: &LockError) -> bool {
    matches!(error, LockError::Backend(e)
        if (e.is_unavailable() || e.is_timeout()) && e.retry_after().is_none())
}

/// What an acquire knows of the holder it waited behind.
#[derive(Default)]
struct Behind {
    /// The holder's remaining lease as last heard, and when.
    lease: Option<(Duration, BootInstant)>,
}

impl Behind {
    /// The store said the holder's lease has `ttl` left, at `at`.
    fn saw(&mut self, ttl: Option<Duration>, at: BootInstant) {
        self.lease = ttl.map(|ttl| (ttl, at));
    }

    /// The error for a wait that started at `started` and ran out now: the holder's lease left
    /// now, and how long the acquire waited.
    fn timed_out(&self, started: tokio::time::Instant) -> LockError {
        let now = BootInstant::now();
        LockError::WaitTimeout {
            retry_after: self.lease.map(|(ttl, at)| ttl.saturating_sub(now.duration_since(at))),
            waited: started.elapsed(),
        }
    }
}

async fn notified<L: Listen>(listener: Option<&L>) {
    match listener {
        Some(listener) => listener.notified().await,
        None => std::future::pending().await,
    }
}

async fn sleep_opt(duration: Option<Duration>) {
    match duration {
        Some(duration) => tokio::time::sleep(duration).await,
        None => std::future::pending().await,
    }
}
