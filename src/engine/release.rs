//! Releasing: the synchronous half (renewal stops, a local waiter is picked for a hand-off),
//! the backend half with its retries, and losing a lock.

use std::{sync::Arc, time::Duration};

use super::{
    Engine, Held,
    table::{Handoff, Slot},
};
use crate::{
    backend::{Backend, Release, ReleaseReply},
    clock::BootInstant,
    error::{BackendError, BackendErrorKind, LockError},
};

/// How long a release that failed without an answer is retried before its caller hears of
/// the failure (the retries go on in the background while the lock may still be held).
const RELEASE_RETRY_INLINE: Duration = Duration::from_secs(1);

/// Why a held lock was lost.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Loss {
    /// Its deadline passed without a successful renewal: the backend may still have it.
    Expired,
    /// The backend said another owner has it (the reason says how it was found).
    Taken(&'static str),
}

/// A release decided locally (renewal already stopped), with its backend call still to make.
pub(crate) struct Releasing {
    held: Arc<Held>,
    /// The attempt that took the hold given back.
    hold: Arc<str>,
    handoff: Option<Slot>,
    /// The hand-off streak ended: local waiters let other processes go first.
    yield_turn: bool,
    /// Set once the release was tried at once: when, and the answer if there was one.
    sent: Option<Sent>,
}

/// A release tried at once: done, or to finish with [`Engine::finish_release`].
pub(crate) enum AtOnce {
    Done(Result<(), LockError>),
    Later(Releasing),
}

/// When a release was sent (read once, before its first try), and the backend's reply.
struct Sent {
    /// When a hand-off was asked for: the hand-off's lease counts from here.
    sent_at: Option<BootInstant>,
    /// When a release that ended a streak was sent: how long it took sets the yield.
    started: Option<tokio::time::Instant>,
    reply: Option<Result<ReleaseReply, BackendError>>,
}

impl Releasing {
    /// The backend call.
    fn request(&self) -> Release<'_> {
        Release {
            handoff: self
                .handoff
                .as_ref()
                .map(|slot| slot.want.grant(&self.held.key, None)),
            ..self.held.release_one(&self.hold)
        }
    }

    /// The clock readings the reply is judged by, taken just before the call (a reading only
    /// when it is needed).
    fn send(&self) -> Sent {
        Sent {
            sent_at: self.handoff.as_ref().map(|_| BootInstant::now()),
            started: self.yield_turn.then(tokio::time::Instant::now),
            reply: None,
        }
    }
}

impl<B: Backend> Engine<B> {
    /// Marks `held` lost and stops renewing it. A hold whose deadline passed is also freed in
    /// the backend, if it is still there for this very entry, when it is renewed or when the
    /// backend may keep it for longer than the lease that set the deadline.
    pub(crate) fn lose(self: &Arc<Self>, held: &Arc<Held>, loss: Loss) {
        // A released entry has ended: a late reply about it is no loss.
        if held.is_released() || !held.mark_lost() {
            return;
        }
        self.table.remove_held(held);
        crate::metrics::lost(held.kind);
        let reason = match loss {
            Loss::Expired => "lease deadline passed before a renewal succeeded",
            Loss::Taken(reason) => reason,
        };
        tracing::warn!(key = %held.key, holder = %held.holder, reason, "lock lost");
        // The backend may still have it for us (it was unreachable past our deadline): free it
        // now rather than leave it for a whole lease, but only if it is still this entry's
        // hold, never one the holder took anew since. A fixed lease is not cut short: the
        // store lets it run out, as `Lease::fixed` says (the deadline is a little earlier).
        // Unless a re-entry gave it a lease the deadline did not count (its reply came after
        // the deadline, or it was undone): the store would keep a lock reported lost.
        if let (Loss::Expired, Some(runtime)) = (loss, self.runtime())
            && (held.lease.is_renewed() || held.kept_past(BootInstant::now()))
        {
            let shared = self.clone();
            let held = held.clone();
            runtime.spawn(async move {
                let _ = shared.backend.release(held.release_if_granted()).await;
            });
        }
    }

    /// The synchronous half of the release at `now` of the hold `hold` took: stop renewing (at
    /// the entry's last guard) and pick a waiter to hand off to. The hold's lease no longer
    /// keeps the entry: the guards left hold it until the latest of their own leases ends.
    pub(crate) fn begin_release(
        self: &Arc<Self>,
        held: Arc<Held>,
        hold: Arc<str>,
        now: BootInstant,
    ) -> Result<Releasing, LockError> {
        if held.is_lost_at(now) {
            // Its deadline may have passed before the watchdog saw it: mark it lost now, so
            // the entry leaves the table (waiters here contend again).
            self.lose(&held, Loss::Expired);
            held.drop_ref();
            return Err(LockError::Lost);
        }
        if held.end_hold(&hold) {
            self.watch(held.next_event());
        }
        let (handoff, yield_turn) = self.table.release_ref(&held, self.config.handoff_streak);
        Ok(Releasing {
            held,
            hold,
            handoff,
            yield_turn,
            sent: None,
        })
    }

    /// The backend half of a release, done at once when the backend answers without waiting
    /// (the in-memory backend) and its answer needs no retry: then no future is made for it.
    /// Otherwise `releasing` comes back, for [`finish_release`](Self::finish_release).
    pub(crate) fn release_at_once(self: &Arc<Self>, mut releasing: Releasing) -> AtOnce {
        let sent = releasing.send();
        match self.backend.release_now(releasing.request()) {
            Some(Ok(reply)) => {
                let Releasing { held, handoff, .. } = releasing;
                let (sent_at, started) = (sent.sent_at, sent.started);
                AtOnce::Done(self.settle_release(&held, handoff, sent_at, started, Ok(reply)))
            }
            // An error needs retries; no answer, the backend's call.
            reply => {
                releasing.sent = Some(Sent { reply, ..sent });
                AtOnce::Later(releasing)
            }
        }
    }

    /// The backend half of a release, with its retries.
    pub(crate) async fn finish_release(
        self: &Arc<Self>,
        mut releasing: Releasing,
    ) -> Result<(), LockError> {
        let Sent {
            sent_at,
            started,
            reply,
        } = match releasing.sent.take() {
            Some(sent) => sent,
            None => releasing.send(),
        };
        let mut reply = match reply {
            Some(reply) => reply,
            None => self.backend.release(releasing.request()).await,
        };
        let Releasing {
            held,
            hold,
            handoff,
            ..
        } = releasing;
        let handoff = match (&reply, handoff) {
            (Err(error), Some(mut slot)) => {
                if error.outcome_unknown() {
                    // The hand-off may have happened: undo it before the waiter retries, and
                    // have the waiter retry under a new attempt id that takes over the hold
                    // should the undo still be on its way (an id that may be undone is never
                    // granted again).
                    self.resolve_attempt(&held.key, &slot.want).await;
                    let want = self.next_attempt(&slot.want, true);
                    slot.rename(want);
                }
                self.table.restore(&held.key, slot);
                None
            }
            (_, handoff) => handoff,
        };
        if handoff.is_none()
            && let Err(error) = &reply
        {
            // Other guards share the entry: this was the release of one hold. Sent again only
            // if it certainly was not sent: a second one would give back a hold still held.
            let last = held.is_released();
            let retry = match last {
                true => error.is_unavailable() || error.outcome_unknown(),
                false => certainly_unsent(error),
            };
            if retry {
                reply = self
                    .release_again(&held, &hold, error.outcome_unknown(), last)
                    .await;
            }
            if let Err(error) = &reply
                && !last
                && !certainly_unsent(error)
            {
                tracing::warn!(key = %held.key, holder = %held.holder, "the release of a re-entered hold may not have been applied: the last guard's release gives back what is left");
                held.mark_count_unsure();
            }
        }
        // The backend still counts a hold of this entry after its last guard's release: one
        // whose release may not have been applied.
        if matches!(reply, Ok(ReleaseReply::Decremented { .. }))
            && held.is_released()
            && let Some(all) = self.give_back_leftover(&held).await
        {
            reply = Ok(all);
        }
        self.settle_release(&held, handoff, sent_at, started, reply)
    }

    /// What the backend's final `reply` to a release means here: the hand-off delivered or the
    /// waiters told, and the caller's result.
    fn settle_release(
        self: &Arc<Self>,
        held: &Arc<Held>,
        handoff: Option<Slot>,
        sent_at: Option<BootInstant>,
        started: Option<tokio::time::Instant>,
        reply: Result<ReleaseReply, BackendError>,
    ) -> Result<(), LockError> {
        if let Ok(ReleaseReply::Released { .. } | ReleaseReply::HandedOff { .. }) = reply {
            crate::metrics::released(held.kind, held.acquired_at);
        }
        // Whether listeners elsewhere heard the release (this client's own listener, if it
        // has one, is looked up only when somebody heard it).
        let others_heard = match reply {
            Ok(ReleaseReply::Released { notified: Some(0) }) => false,
            Ok(ReleaseReply::Released { notified }) => {
                let own = u64::from(self.table.listener(&held.key).is_some());
                notified.is_none_or(|n| n > own)
            }
            _ => false,
        };
        // They learn of it about when we do and need one more round trip to reach the
        // backend: hold local waiters back for two.
        let yield_for = started.filter(|_| others_heard).map(|started| {
            (started.elapsed() * 2).clamp(Duration::from_micros(200), Duration::from_millis(20))
        });
        let outcome = match (reply, handoff) {
            (Ok(ReleaseReply::HandedOff { token }), Some(slot)) => {
                let next = Held::new(
                    held.key.clone(),
                    slot.want.holder.clone(),
                    slot.want.kind,
                    (slot.want.lease, token, &slot.want.attempt, true),
                    // A hand-off is a hold with a lease of its own.
                    0,
                    sent_at.unwrap_or_else(BootInstant::now),
                    self.config.max_hold,
                );
                self.table.handed_off(next.clone());
                self.watch(next.next_event());
                tracing::debug!(key = %held.key, "lock handed to a local waiter");
                let engine = self.clone();
                slot.deliver(Handoff::new(next, move |orphan| {
                    let hold = orphan.grant_attempt().clone();
                    engine.release_detached(orphan, hold);
                }));
                Ok(())
            }
            (reply, slot) => {
                // The backend did not hand the lock over: the waiter looks again.
                if let Some(slot) = slot {
                    self.table.restore(&held.key, slot);
                }
                // Unless holds remain, the head waiter looks again, whatever happened. Once the
                // entry has ended here, its key's state goes too (when idle) whatever the
                // backend still counts.
                if held.is_released() || !matches!(reply, Ok(ReleaseReply::Decremented { .. })) {
                    self.table.released(&held.key, others_heard, yield_for);
                }
                match reply {
                    Ok(
                        ReleaseReply::Released { .. }
                        | ReleaseReply::Decremented { .. }
                        | ReleaseReply::HandedOff { .. },
                    ) => Ok(()),
                    Ok(ReleaseReply::NotHeld) => Err(LockError::NotHeld),
                    Err(error) => Err(LockError::Backend(error.with_key(held.key.as_str()))),
                }
            }
        };
        tracing::debug!(key = %held.key, ok = outcome.is_ok(), "lock released");
        outcome
    }

    /// Gives back what the backend may still count of `held`'s holds once its last guard is
    /// gone, when the release of one of them may not have been applied: every hold, but only
    /// while the backend's record is still this entry's attempt. The reply, when it freed
    /// something.
    pub(crate) async fn give_back_leftover(&self, held: &Held) -> Option<ReleaseReply> {
        if !held.count_unsure() {
            return None;
        }
        match self.backend.release(held.release_if_granted()).await {
            Ok(ReleaseReply::NotHeld) | Err(_) => None,
            Ok(freed) => {
                tracing::info!(key = %held.key, "gave back a hold whose release may not have been applied");
                Some(freed)
            }
        }
    }

    /// Sends a release of `held` again after it failed without an answer: while the lock may
    /// still be held, with a growing pause, first for up to [`RELEASE_RETRY_INLINE`] and then
    /// in the background. For the `last` guard, after a failure whose outcome is unknown, the
    /// retry releases every hold, but only while the backend's last record is still this
    /// entry's attempt, so it never frees a hold taken anew. A one-hold release of another
    /// guard is retried only while it certainly was not applied. Returns the reply of the last
    /// try made here.
    async fn release_again(
        self: &Arc<Self>,
        held: &Arc<Held>,
        hold: &Arc<str>,
        unknown: bool,
        last: bool,
    ) -> Result<ReleaseReply, BackendError> {
        let inline_until = tokio::time::Instant::now() + RELEASE_RETRY_INLINE;
        let pause = Duration::from_millis(10);
        let (unknown, pause) = match self
            .retry_release((held, hold), unknown, last, pause, Some(inline_until))
            .await
        {
            Retried::Answered(reply) => return reply,
            Retried::StillFailing { unknown, pause } => (unknown, pause),
        };
        // Go on on the runtime until the lock's deadline.
        if let Some(runtime) = self.runtime() {
            let (shared, held, hold) = (self.clone(), held.clone(), hold.clone());
            runtime.spawn(async move {
                let retried = shared.retry_release((&held, &hold), unknown, last, pause, None);
                match retried.await {
                    Retried::Answered(Ok(reply)) => {
                        tracing::info!(key = %held.key, ?reply, "released after retrying");
                    }
                    Retried::Answered(Err(error)) => {
                        tracing::warn!(key = %held.key, error = %format_args!("{error:#}"), "release failed; the lease frees the lock");
                    }
                    Retried::StillFailing { .. } => {}
                }
            });
        }
        Err(BackendError::from_kind(BackendErrorKind::Unavailable))
    }

    /// The retries of [`release_again`](Self::release_again), with a growing pause from
    /// `pause`, until an answer, the lock's deadline, shutdown, or (with `until`) the time to
    /// hand over to the background.
    async fn retry_release(
        &self,
        (held, hold): (&Arc<Held>, &str),
        mut unknown: bool,
        last: bool,
        mut pause: Duration,
        until: Option<tokio::time::Instant>,
    ) -> Retried {
        let max_pause = Duration::from_millis(if until.is_some() { 500 } else { 1000 });
        loop {
            // Past the deadline the lease runs out on its own: stop.
            if held.remaining().is_zero() || self.stop.is_cancelled() {
                let error = BackendError::from_kind(BackendErrorKind::Unavailable);
                return Retried::Answered(Err(error));
            }
            if until.is_some_and(|until| tokio::time::Instant::now() + pause >= until) {
                return Retried::StillFailing { unknown, pause };
            }
            tokio::time::sleep(pause).await;
            // A try that may have gone through is followed by one for every hold the entry's
            // grant still has; otherwise the same one-hold release is sent again.
            let release = match unknown {
                true => held.release_if_granted(),
                false => held.release_one(hold),
            };
            match self.backend.release(release).await {
                Err(error) if !last && !certainly_unsent(&error) => {
                    return Retried::Answered(Err(error));
                }
                Err(error) if error.is_unavailable() || error.outcome_unknown() => {
                    unknown |= error.outcome_unknown();
                    tracing::debug!(key = %held.key, error = %format_args!("{error:#}"), "release failed; retrying");
                }
                // After a try whose outcome is unknown, "not held" says that try went through
                // (or the lease ran out): either way the lock is free of this hold.
                Ok(ReleaseReply::NotHeld) if unknown => {
                    return Retried::Answered(Ok(ReleaseReply::Released { notified: None }));
                }
                other => return Retried::Answered(other),
            }
            pause = (pause * 2).min(max_pause);
        }
    }

    /// Releases the hold of `held` that `hold` took without a caller to tell: a dropped guard,
    /// or a lock handed to a waiter that gave up before taking it. Renewal stops now; a backend
    /// call that must wait runs on the runtime (without one, the lease frees the lock).
    pub(crate) fn release_detached(self: &Arc<Self>, held: Arc<Held>, hold: Arc<str>) {
        let Ok(releasing) = self.begin_release(held, hold, BootInstant::now()) else {
            return;
        };
        let releasing = match self.release_at_once(releasing) {
            AtOnce::Done(outcome) => return background_outcome(outcome),
            AtOnce::Later(releasing) => releasing,
        };
        match self.runtime() {
            Some(runtime) => {
                let engine = self.clone();
                runtime.spawn(async move {
                    background_outcome(engine.finish_release(releasing).await);
                });
            }
            None => self.abort_release(releasing),
        }
    }

    /// A release that cannot run (no runtime): put its waiter back; the lease frees the lock.
    pub(crate) fn abort_release(&self, releasing: Releasing) {
        if let Some(slot) = releasing.handoff {
            self.table.restore(&releasing.held.key, slot);
        }
        self.table.released(&releasing.held.key, false, None);
    }
}

/// Whether a failed call certainly did not reach the backend (no connection could be had),
/// rather than maybe (a timeout, a connection dropped mid-call, a quorum of nodes silent).
fn certainly_unsent(error: &BackendError) -> bool {
    *error.kind() == BackendErrorKind::Unavailable
}

/// Where the retries of a release got to.
enum Retried {
    /// The backend answered (or the lock's deadline passed: the error says so).
    Answered(Result<ReleaseReply, BackendError>),
    /// Still failing when the time to retry inline was up.
    StillFailing { unknown: bool, pause: Duration },
}

/// The end of a release nobody waits for.
fn background_outcome(outcome: Result<(), LockError>) {
    if let Err(error) = outcome {
        tracing::debug!(error = %format_args!("{error:#}"), "background release failed");
    }
}
