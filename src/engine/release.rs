//! Releasing: a guard's hold given back (locally, unless it was the grant's last), the grant's
//! one delete with its retries (or a hand-off to a local waiter), and losing a grant.

use std::{sync::Arc, time::Duration};

use super::{
    Engine, Held,
    table::{Handoff, Slot},
};
use crate::{
    backend::{
        Backend,
        store::{Release, ReleaseReply},
    },
    clock::BootInstant,
    error::{BackendError, LockError},
};

/// How long a delete that failed without an answer is retried before its caller hears of the
/// failure (the retries go on in the background while the store may keep the record).
const RELEASE_RETRY_INLINE: Duration = Duration::from_secs(1);

/// Why a grant was lost.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Loss {
    /// Its deadline passed without a successful renewal: the store may still have it.
    Expired,
    /// The store said the grant is not held (the reason says how it was found).
    Taken(&'static str),
}

/// The end of a grant decided here (renewal already stopped), with its delete still to send.
pub(crate) struct Releasing {
    held: Arc<Held>,
    handoff: Option<Slot>,
    /// The hand-off streak ended: local waiters let other processes go first.
    yield_turn: bool,
    /// When the delete was first sent (a hand-off's lease counts from there, and how long it
    /// took sets a yield), and the store's answer if it came at once.
    sent: Option<(BootInstant, Option<Result<ReleaseReply, BackendError>>)>,
}

/// A release tried at once: done, or to finish with [`Engine::finish_release`].
pub(crate) enum AtOnce {
    Done(Result<(), LockError>),
    Later(Releasing),
}

impl Releasing {
    /// The store call.
    fn request(&self) -> Release<'_> {
        Release {
            handoff: self.handoff.as_ref().map(|slot| slot.want.grant(&self.held.key, None)),
            ..self.held.release()
        }
    }
}

impl<B: Backend> Engine<B> {
    /// Marks `held` lost, ends it here and, when its deadline passed while the store may still
    /// keep the record, deletes it (naming the grant, so nothing newer goes).
    pub(crate) fn lose(self: &Arc<Self>, held: &Arc<Held>, loss: Loss) {
        if held.is_ended() && !held.is_marked_lost() {
            // Ended normally before the loss was seen: a late reply about it is no loss.
            return;
        }
        if !held.mark_lost() {
            return;
        }
        crate::metrics::lost(held.kind);
        let reason = match loss {
            Loss::Expired => "lease deadline passed before a renewal succeeded",
            Loss::Taken(reason) => reason,
        };
        tracing::warn!(key = %held.key, holder = %held.holder, reason, "lock lost");
        if held.end() {
            self.table.remove_held(held);
            if matches!(loss, Loss::Expired) {
                self.delete_in_background(held.clone());
            }
        }
    }

    /// The entry `held` ended with no release to report to (holds ran out, a loss, a shutdown):
    /// out of the table, its delete sent in the background while the store may keep the record.
    pub(crate) fn end_quietly(self: &Arc<Self>, held: &Arc<Held>) {
        self.table.remove_held(held);
        self.delete_in_background(held.clone());
    }

    fn delete_in_background(self: &Arc<Self>, held: Arc<Held>) {
        if !held.kept_past(BootInstant::now()) {
            return;
        }
        self.finish_in_background(Releasing { held, handoff: None, yield_turn: false, sent: None });
    }

    /// Finishes `releasing` on the runtime (without one, the lease frees the lock).
    fn finish_in_background(self: &Arc<Self>, releasing: Releasing) {
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

    /// The synchronous half of giving back hold `hold` of `held` at `now`: `None` when other
    /// holds keep the grant (nothing goes to the store); otherwise the grant ended, renewal
    /// stopped, and a waiter may be picked for a hand-off.
    ///
    /// # Errors
    /// [`LockError::Lost`] when the hold was lost (the grant, or the hold's own lease).
    pub(crate) fn begin_release(
        self: &Arc<Self>,
        held: Arc<Held>,
        hold: u64,
        now: BootInstant,
    ) -> Result<Option<Releasing>, LockError> {
        if held.is_lost_at(now) {
            // The deadline may have passed before the watchdog saw it.
            self.lose(&held, Loss::Expired);
        }
        let lost = held.hold_lost_at(hold, now);
        let last = held.end_hold(hold, now);
        if lost {
            if last {
                self.end_quietly(&held);
            }
            return Err(LockError::Lost);
        }
        if !last {
            return Ok(None);
        }
        let (handoff, yield_turn) = self.table.ended(&held, self.config.handoff_streak);
        Ok(Some(Releasing { held, handoff, yield_turn, sent: None }))
    }

    /// The store half of a release, done at once when the store answers without waiting (the
    /// in-memory one); otherwise `releasing` comes back, for [`Self::finish_release`].
    pub(crate) fn release_at_once(self: &Arc<Self>, mut releasing: Releasing) -> AtOnce {
        let sent_at = BootInstant::now();
        match self.backend.release_now(releasing.request()) {
            Some(Ok(reply)) => AtOnce::Done(self.settle_release(releasing, sent_at, Ok(reply))),
            reply => {
                releasing.sent = Some((sent_at, reply));
                AtOnce::Later(releasing)
            }
        }
    }

    /// The store half of a release, with its retries.
    pub(crate) async fn finish_release(
        self: &Arc<Self>,
        mut releasing: Releasing,
    ) -> Result<(), LockError> {
        let (sent_at, reply) = releasing.sent.take().unwrap_or((BootInstant::now(), None));
        let reply = match reply {
            Some(reply) => reply,
            None => self.backend.release(releasing.request()).await,
        };
        let (held, handoff) = (&releasing.held, releasing.handoff.take());
        let (reply, handoff) = match (reply, handoff) {
            (Err(error), Some(mut slot)) => {
                if error.outcome_unknown() {
                    // The hand-off may have happened: undo it before the waiter tries again,
                    // under a new attempt id (one that may be undone is never granted again).
                    self.resolve_attempt(&held.key, &slot.want).await;
                    slot.rename(self.next_attempt(&slot.want));
                }
                self.table.restore(&held.key, slot);
                // The grant's own delete: sent again like any other.
                (self.release_again(held, error).await, None)
            }
            (Err(error), None) => (self.release_again(held, error).await, None),
            (reply, handoff) => (reply, handoff),
        };
        releasing.handoff = handoff;
        self.settle_release(releasing, sent_at, reply)
    }

    /// What the store's final `reply` to a release means here: the hand-off delivered or the
    /// waiters told, and the caller's result.
    fn settle_release(
        self: &Arc<Self>,
        releasing: Releasing,
        sent_at: BootInstant,
        reply: Result<ReleaseReply, BackendError>,
    ) -> Result<(), LockError> {
        let Releasing { held, handoff, yield_turn, .. } = releasing;
        let held = &held;
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
        // They learn of it about when we do and need one more round trip to reach the store:
        // hold local waiters back for two.
        let yield_for = (yield_turn && others_heard).then(|| {
            let took = BootInstant::now().duration_since(sent_at);
            (took * 2).clamp(Duration::from_micros(200), Duration::from_millis(20))
        });
        let outcome = match (reply, handoff) {
            (Ok(ReleaseReply::HandedOff { token }), Some(slot)) => {
                let (next, hold) = Held::new(
                    held.key.clone(),
                    slot.want.holder.clone(),
                    slot.want.kind,
                    (slot.want.attempt.clone(), token),
                    slot.want.lease,
                    sent_at,
                    self.config.max_hold,
                );
                self.table.handed_off(next.clone());
                self.watch(next.next_event());
                tracing::debug!(key = %held.key, "lock handed to a local waiter");
                let engine = self.clone();
                slot.deliver(Handoff::new((next, hold), move |(orphan, hold)| {
                    engine.release_detached(orphan, hold);
                }));
                Ok(())
            }
            (reply, slot) => {
                // The store did not hand the lock over: the waiter looks again.
                if let Some(slot) = slot {
                    self.table.restore(&held.key, slot);
                }
                self.table.released(&held.key, others_heard, yield_for);
                match reply {
                    Ok(ReleaseReply::Released { .. } | ReleaseReply::HandedOff { .. }) => Ok(()),
                    Ok(ReleaseReply::NotHeld) => Err(LockError::NotHeld),
                    Err(error) => Err(LockError::Backend(error.with_key(held.key.as_str()))),
                }
            }
        };
        tracing::debug!(key = %held.key, ok = outcome.is_ok(), "lock released");
        outcome
    }

    /// Sends the grant's delete again after `error` while the store may keep the record (and,
    /// once the client stopped, for its clean-up grace): here for up to
    /// [`RELEASE_RETRY_INLINE`], then in the background. A repeat is safe: it names the grant,
    /// and finds nothing once one copy got through. The reply of the last try made here.
    pub(crate) async fn release_again(
        self: &Arc<Self>,
        held: &Arc<Held>,
        error: BackendError,
    ) -> Result<ReleaseReply, BackendError> {
        // An answer the store gave (no permission, foreign data at the key) would be the same.
        let worth_repeating =
            |error: &BackendError| error.is_unavailable() || error.outcome_unknown();
        if !worth_repeating(&error) {
            return Err(error);
        }
        let inline_until = tokio::time::Instant::now() + RELEASE_RETRY_INLINE;
        let mut unknown = error.outcome_unknown();
        let mut last = Err(error);
        let mut pause = Duration::from_millis(10);
        while tokio::time::Instant::now() + pause < inline_until {
            match self.delete_after(held, pause).await {
                None => return last,
                Some(Err(error)) if worth_repeating(&error) => {
                    unknown |= error.outcome_unknown();
                    last = Err(error);
                }
                // After a try whose outcome is unknown, "not held" says that one went through
                // (or the lease ran out): either way the grant is gone.
                Some(Ok(ReleaseReply::NotHeld)) if unknown => {
                    return Ok(ReleaseReply::Released { notified: None });
                }
                Some(reply) => return reply,
            }
            pause = (pause * 2).min(Duration::from_millis(500));
        }
        if let Some(runtime) = self.runtime() {
            let (engine, held) = (self.clone(), held.clone());
            runtime.spawn(async move {
                while let Some(Err(error)) = engine.delete_after(&held, pause).await {
                    tracing::debug!(key = %held.key, error = %format_args!("{error:#}"), "release failed; retrying while the store may keep the lock");
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
            });
        }
        last
    }

    /// Sends the grant's delete after `pause`, unless by then the store cannot keep the record
    /// any more or the client's clean-up grace is over (`None`).
    async fn delete_after(
        &self,
        held: &Held,
        pause: Duration,
    ) -> Option<Result<ReleaseReply, BackendError>> {
        tokio::time::sleep(pause).await;
        if !held.kept_past(BootInstant::now()) || !self.stop.allows_cleanup() {
            return None;
        }
        Some(self.backend.release(held.release()).await)
    }

    /// Gives back hold `hold` of `held` with no caller to tell (a dropped guard, an untaken
    /// hand-off); a store call that must wait runs on the runtime.
    pub(crate) fn release_detached(self: &Arc<Self>, held: Arc<Held>, hold: u64) {
        let Ok(Some(releasing)) = self.begin_release(held, hold, BootInstant::now()) else {
            return;
        };
        match self.release_at_once(releasing) {
            AtOnce::Done(outcome) => background_outcome(outcome),
            AtOnce::Later(releasing) => self.finish_in_background(releasing),
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

/// The end of a release nobody waits for.
fn background_outcome(outcome: Result<(), LockError>) {
    if let Err(error) = outcome {
        tracing::debug!(error = %format_args!("{error:#}"), "background release failed");
    }
}
