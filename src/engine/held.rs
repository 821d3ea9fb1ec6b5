//! One lock held by one holder in a client, shared by the guards of a holder that re-entered
//! it.
//!
//! Each guard's hold has its own lease; the entry's deadline is the latest of them. A hold's
//! lease counts from when its acquire or the last renewal was *sent*, minus a drift margin, on
//! a clock that keeps counting through suspend; so a holder whose process or network stalled
//! learns about it from its own clock, not from a reply that may never come.

use std::{
    sync::{
        Arc, Mutex, MutexGuard, OnceLock, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::sync::Notify;

use crate::{
    backend::{LockKind, Release, Renew},
    clock::BootInstant,
    holder::Holder,
    lease::Lease,
    lock_key::LockKey,
};

/// One lock held by one holder in this client.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) key: LockKey,
    pub(crate) holder: Holder,
    pub(crate) kind: LockKind,
    pub(crate) lease: Lease,
    /// The hold's fencing token: issued at its grant, or by the first re-entry that asked for
    /// one (the store keeps one token per hold, so it never changes once known).
    token: OnceLock<u64>,
    /// The backend's shared lease the hold lives on (`0`: a lease of its own); see
    /// [`AcquireReply::Acquired`](crate::backend::AcquireReply::Acquired).
    pub(crate) session: u64,
    /// Set when the lock is lost (see [`mark_lost`](Self::mark_lost)).
    marked_lost: AtomicBool,
    /// Wakes what waits for the loss ([`until_lost`](Self::until_lost)).
    lost_wake: Notify,
    /// When the lock must be considered gone unless a renewal succeeds first
    /// ([`BootInstant::as_nanos`]): the latest end of its holds' leases, so moved earlier only
    /// when a guard whose hold ended last is released. Written under the state's mutex, read
    /// outside it: every poll of a locked request reads it.
    deadline: AtomicU64,
    /// The latest [`Lease::valid_until`] of the grant and of every re-entry sent for this
    /// entry, answered or not: a re-entry whose reply came after the loss, or that was undone
    /// (which leaves its lease in the store), may keep the hold in the backend past the
    /// deadline. Only ever moved later.
    kept_until: AtomicU64,
    /// The attempt that granted the hold (or handed it over): the backend records it with the
    /// hold, so a release meant for this entry alone can check that the hold is still its.
    grant_attempt: Arc<str>,
    /// The hold was granted as the holder's first (not joined to holds the backend already
    /// counted for it, taken through another client): the backend's record is this entry's
    /// attempt.
    first_hold: bool,
    /// Signalled when a re-entry of this entry has been answered or resolved.
    reentry_ended: Notify,
    /// When the request that acquired it was sent, for the hold-time metric.
    pub(crate) acquired_at: BootInstant,
    state: Mutex<HeldState>,
}

#[derive(Debug)]
struct HeldState {
    /// Guards sharing this entry (re-entries of the same holder).
    refs: usize,
    /// When the next renewal is due.
    next_renew: BootInstant,
    /// A renewal for this entry is in flight.
    renewing: bool,
    /// With `max_hold`: no renewals after this.
    renew_until: Option<BootInstant>,
    /// The release of one of this entry's holds may not have been applied (its reply was
    /// lost): the backend may count one more hold than the entry has guards.
    count_unsure: bool,
    /// Every guard of this entry has been released: the entry is out of the table, and a
    /// late renewal reply says nothing about the lock any more.
    released: bool,
    /// A re-entry of this entry is on its way to the backend, or one whose reply was lost is
    /// still being resolved there. Meanwhile no other re-entry is sent: the backend records
    /// only a hold's last re-entry, and a resolution needs that record to undo its attempt.
    reentering: bool,
    /// The holds of this entry's guards. A renewal extends those the store had when it got
    /// there: the ones known here when it was sent.
    holds: Vec<Hold>,
    /// Numbers the holds in the order they became known here.
    next_hold: u64,
    /// The holds numbered below this were known when the renewal in flight was sent.
    renewal_covers: u64,
}

/// One hold of an entry.
#[derive(Debug)]
struct Hold {
    /// The attempt that took it: what its release names.
    attempt: Arc<str>,
    /// Until when its lease may be trusted.
    until: BootInstant,
    /// Its number in the order the holds became known here.
    number: u64,
}

impl Held {
    /// The renewal that extends this hold's lease. It names the grant (where the backend's
    /// record is this entry's), so a renewal that arrives after the entry ended extends
    /// nothing of the holder's next hold.
    pub(crate) fn renewal(&self) -> Renew<'_> {
        let renew = Renew::hold(&self.key, self.holder.id(), self.lease, self.kind)
            .in_session(self.session);
        match self.release_check() {
            Some(attempt) => renew.granted_by(attempt),
            None => renew,
        }
    }

    /// A new entry for a lock acquired by a request sent at `sent_at`, on the backend's shared
    /// lease `session` (0: a lease of its own).
    pub(crate) fn new(
        key: LockKey,
        holder: Holder,
        kind: LockKind,
        (lease, token, attempt, first_hold): (Lease, Option<u64>, &Arc<str>, bool),
        session: u64,
        sent_at: BootInstant,
        max_hold: Option<Duration>,
    ) -> Arc<Self> {
        Arc::new(Self {
            key,
            holder,
            kind,
            lease,
            token: token.map_or_else(OnceLock::new, OnceLock::from),
            session,
            marked_lost: AtomicBool::new(false),
            lost_wake: Notify::new(),
            deadline: AtomicU64::new(lease.valid_until(sent_at).as_nanos()),
            kept_until: AtomicU64::new(lease.valid_until(sent_at).as_nanos()),
            grant_attempt: attempt.clone(),
            first_hold,
            reentry_ended: Notify::new(),
            acquired_at: sent_at,
            state: Mutex::new(HeldState {
                refs: 1,
                next_renew: sent_at + lease.renew_interval(),
                renewing: false,
                renew_until: max_hold.map(|max| sent_at + max),
                count_unsure: false,
                released: false,
                reentering: false,
                holds: vec![Hold {
                    attempt: attempt.clone(),
                    until: lease.valid_until(sent_at),
                    number: 0,
                }],
                next_hold: 1,
                renewal_covers: 0,
            }),
        })
    }

    /// The attempt that granted the entry's first hold (or handed it over).
    pub(crate) fn grant_attempt(&self) -> &Arc<str> {
        &self.grant_attempt
    }

    /// The hold's fencing token, if one was asked for by its grant or a re-entry.
    pub(crate) fn token(&self) -> Option<u64> {
        self.token.get().copied()
    }

    /// The attempt a release of this entry names, so that it gives back nothing of a hold the
    /// holder took anew (this entry's lease ran out in the backend before the release got
    /// there): the grant's, which the backend recorded, unless the entry joined holds taken
    /// through another client.
    pub(crate) fn release_check(&self) -> Option<&str> {
        self.first_hold.then_some(&*self.grant_attempt)
    }

    /// A release of one hold of this entry, the one `hold` took, naming
    /// [`release_check`](Self::release_check).
    pub(crate) fn release_one<'a>(&'a self, hold: &'a str) -> Release<'a> {
        Release {
            all: false,
            attempt: self.release_check(),
            hold: Some(hold),
            ..self.release_all()
        }
    }

    /// A release of every hold of this entry (at shutdown).
    pub(crate) fn release_all(&self) -> Release<'_> {
        Release {
            key: &self.key,
            holder: self.holder.id(),
            all: true,
            handoff: None,
            kind: self.kind,
            attempt: None,
            hold: None,
        }
    }

    /// A release of every hold of this entry that changes nothing unless the backend's hold
    /// is still the one this entry's attempt granted: it never frees a hold the holder took
    /// anew.
    pub(crate) fn release_if_granted(&self) -> Release<'_> {
        Release {
            attempt: Some(&self.grant_attempt),
            ..self.release_all()
        }
    }

    /// Claims the right to send a re-entry of this entry: false while another re-entry is on
    /// its way or being resolved (wait with [`until_reentry_ends`](Self::until_reentry_ends)).
    pub(crate) fn begin_reentry(&self) -> bool {
        !std::mem::replace(&mut self.state().reentering, true)
    }

    /// The re-entry claimed with [`begin_reentry`](Self::begin_reentry) has been answered or
    /// resolved.
    pub(crate) fn end_reentry(&self) {
        self.state().reentering = false;
        self.reentry_ended.notify_waiters();
    }

    /// Waits until no re-entry of this entry is on its way or being resolved.
    pub(crate) async fn until_reentry_ends(&self) {
        loop {
            let ended = self.reentry_ended.notified();
            let mut ended = std::pin::pin!(ended);
            ended.as_mut().enable();
            if !self.state().reentering {
                return;
            }
            ended.await;
        }
    }

    /// The release of one of this entry's holds may not have been applied.
    pub(crate) fn mark_count_unsure(&self) {
        self.state().count_unsure = true;
    }

    /// Whether the backend may count more holds than this entry has guards.
    pub(crate) fn count_unsure(&self) -> bool {
        self.state().count_unsure
    }

    /// Whether every guard of this entry has been released.
    pub(crate) fn is_released(&self) -> bool {
        self.state().released
    }

    /// Whether the lock is known to be lost, or its deadline has passed.
    pub(crate) fn is_lost(&self) -> bool {
        self.is_lost_at(BootInstant::now())
    }

    /// Whether the lock is known to be lost, or its deadline has passed by `now`.
    pub(crate) fn is_lost_at(&self, now: BootInstant) -> bool {
        self.is_marked_lost() || self.deadline() <= now
    }

    /// Whether the lock was marked lost ([`mark_lost`](Self::mark_lost)).
    pub(crate) fn is_marked_lost(&self) -> bool {
        self.marked_lost.load(Ordering::Acquire)
    }

    /// Marks the lock lost and wakes whoever waits for that; false if it already was.
    pub(crate) fn mark_lost(&self) -> bool {
        // Sequentially consistent with `reentry_sent`: a loss either sees a re-entry's lease
        // or stops the re-entry from being sent.
        let first = !self.marked_lost.swap(true, Ordering::SeqCst);
        self.lost_wake.notify_waiters();
        first
    }

    /// Resolves once the lock is marked lost.
    pub(crate) async fn until_lost(&self) {
        loop {
            let notified = self.lost_wake.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the flag is read: a loss marked in between still wakes it.
            notified.as_mut().enable();
            if self.is_marked_lost() {
                return;
            }
            notified.await;
        }
    }

    fn deadline(&self) -> BootInstant {
        BootInstant::from_nanos(self.deadline.load(Ordering::Acquire))
    }

    /// Moves the deadline to `until` unless it is later already (under the state's mutex).
    fn extend_deadline(&self, until: BootInstant) {
        self.deadline.fetch_max(until.as_nanos(), Ordering::AcqRel);
    }

    /// The guard whose hold `hold` took is being released: where the store keeps a lease per
    /// hold ([`LockKind::lease_per_hold`]), its lease no longer counts, and the entry lives
    /// until the latest lease of the holds left. Returns true when that moved the deadline
    /// earlier (the watchdog must look at the entry sooner). The store keeps a plain or fair
    /// lock as long as the longest lease any of its holds had, and holds on a shared lease all
    /// end with it: their deadline stays.
    pub(crate) fn end_hold(&self, hold: &str) -> bool {
        let mut state = self.state();
        if let Some(at) = state.holds.iter().position(|h| *h.attempt == *hold) {
            state.holds.remove(at);
        }
        self.settle_deadline(&state)
    }

    /// Where each hold keeps its own lease, makes the deadline the latest of the live holds'
    /// (under the state's mutex, passed in); returns true when that moved it earlier. While no
    /// hold is known (a re-entry is on its way after the other guards went) it stays.
    fn settle_deadline(&self, state: &HeldState) -> bool {
        let Some(latest) = state.holds.iter().map(|hold| hold.until).max() else {
            return false;
        };
        if !self.kind.lease_per_hold() || self.session != 0 {
            return false;
        }
        let earlier = latest < self.deadline();
        self.deadline.store(latest.as_nanos(), Ordering::Release);
        earlier
    }

    /// A re-entry with `lease` is about to be sent at `sent_at`: the backend may keep the hold
    /// that long whatever becomes of the reply. False when the entry was lost already: the
    /// re-entry must not be sent (the loss may not have seen its lease, see
    /// [`kept_past`](Self::kept_past)).
    pub(crate) fn reentry_sent(&self, lease: Lease, sent_at: BootInstant) -> bool {
        let until = lease.valid_until(sent_at).as_nanos();
        self.kept_until.fetch_max(until, Ordering::SeqCst);
        !self.marked_lost.load(Ordering::SeqCst)
    }

    /// Whether the backend may keep the hold past `now` by more than the drift margin of the
    /// lease that keeps it there: a grant or re-entry sent for this entry has a lease that
    /// runs past `now` (after a loss, the deadline did not count it).
    pub(crate) fn kept_past(&self, now: BootInstant) -> bool {
        BootInstant::from_nanos(self.kept_until.load(Ordering::SeqCst)) > now
    }

    /// When the watchdog must look at this entry next.
    pub(crate) fn next_event(&self) -> BootInstant {
        let state = self.state();
        if self.lease.is_renewed() {
            state.next_renew.min(self.deadline())
        } else {
            self.deadline()
        }
    }

    /// Time left before the deadline.
    pub(crate) fn remaining(&self) -> Duration {
        self.deadline()
            .saturating_duration_until(BootInstant::now())
    }

    /// One more guard will share this entry: a re-entry about to be sent. Taken before the
    /// backend call, so a release of the other guards meanwhile does not end the entry.
    pub(crate) fn add_ref(&self) {
        self.state().refs += 1;
    }

    /// A re-entry by `attempt`, sent at `sent_at` with `lease`, was granted, on the backend's
    /// shared lease `session` (0: none), with the fencing token it asked for: the backend keeps
    /// the new hold that long, and the lock at least that long (a re-entry never shortens a
    /// lease). A hold that lives on a shared lease lives as long as that lease, whose length is
    /// the hold's own, and only a re-entry on the same one extended it. A hold taken without a
    /// token has the one its re-entry was issued. Returns true when the deadline moved earlier:
    /// where each hold keeps its own lease, the guards released while the re-entry was on its
    /// way took theirs with them.
    pub(crate) fn reentered(
        &self,
        attempt: &Arc<str>,
        (lease, token): (Lease, Option<u64>),
        session: u64,
        sent_at: BootInstant,
    ) -> bool {
        if let Some(token) = token {
            // The store has one token per hold: one already known is the same.
            let _ = self.token.set(token);
        }
        let mut state = self.state();
        let until = if self.session == 0 {
            lease.valid_until(sent_at)
        } else if session == self.session {
            self.lease.valid_until(sent_at)
        } else {
            // Not known to live any longer than the entry's holds: it ends with them.
            self.deadline()
        };
        self.extend_deadline(until);
        let number = state.next_hold;
        state.next_hold += 1;
        state.holds.push(Hold {
            attempt: attempt.clone(),
            until,
            number,
        });
        self.settle_deadline(&state)
    }

    /// One guard fewer; returns how many remain. The last one marks the entry released.
    pub(crate) fn drop_ref(&self) -> usize {
        let mut state = self.state();
        state.refs = state.refs.saturating_sub(1);
        if state.refs == 0 {
            state.released = true;
        }
        state.refs
    }

    /// Looks at the entry at `now`: what it needs and when it next needs attention.
    pub(crate) fn check(&self, now: BootInstant) -> Check {
        let mut state = self.state();
        let deadline = self.deadline();
        if deadline <= now {
            return Check::Lost;
        }
        let renewable = self.lease.is_renewed()
            && !state.renewing
            && state.renew_until.is_none_or(|until| now < until);
        // Renew up to half an interval early, so entries due at nearly the same time share one
        // round trip: groups taken in bursts merge within two ticks (the later group takes the
        // earlier one along) and stay together, however long the burst that made them.
        let slack = self.lease.renew_interval() / 2;
        if renewable && state.next_renew <= now + slack {
            state.renewing = true;
            state.renewal_covers = state.next_hold;
            return Check::Due(deadline);
        }
        let next = if renewable {
            state.next_renew.min(deadline)
        } else {
            deadline
        };
        Check::Later(next)
    }

    /// A renewal sent at `sent_at` succeeded: it extended the holds known when it was sent.
    pub(crate) fn renewed(&self, sent_at: BootInstant) {
        let mut state = self.state();
        state.renewing = false;
        let until = self.lease.valid_until(sent_at);
        // A re-entry answered after the renewal was sent may have reached the store after it:
        // it keeps its own lease.
        let covers = state.renewal_covers;
        for hold in state.holds.iter_mut().filter(|hold| hold.number < covers) {
            hold.until = hold.until.max(until);
        }
        if self.kind.lease_per_hold() && self.session == 0 {
            // The entry lives as long as the latest of its holds' leases.
            self.settle_deadline(&state);
        } else {
            self.extend_deadline(until);
        }
        state.next_renew = sent_at + self.lease.renew_interval();
    }

    pub(crate) fn renew_failed(&self, now: BootInstant) {
        let mut state = self.state();
        state.renewing = false;
        let retry = (self.lease.renew_interval() / 4).min(Duration::from_secs(1));
        state.next_renew = now + retry;
    }

    // A std mutex: a few field updates, never held across an await.
    fn state(&self) -> MutexGuard<'_, HeldState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What an entry needs.
pub(crate) enum Check {
    Lost,
    /// A renewal is due; the entry is lost at the deadline unless it succeeds first.
    Due(BootInstant),
    Later(BootInstant),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A renewal names the grant when the store's record is the entry's own, and no grant for
    /// an entry joined to holds taken through another client (whose record is not its).
    #[test]
    fn a_renewal_names_the_grant_the_store_recorded_for_the_entry() {
        let key = LockKey::new("test:", b"named", 512).unwrap();
        let grant: Arc<str> = "h:1#1".into();
        let lease = Lease::watchdog(Duration::from_secs(30));
        for (first_hold, named) in [(true, Some("h:1#1")), (false, None)] {
            let held = Held::new(
                key.clone(),
                Holder::new("h", 1),
                LockKind::Exclusive,
                (lease, None, &grant, first_hold),
                0,
                BootInstant::now(),
                None,
            );
            assert_eq!(held.renewal().attempt, named, "first hold: {first_hold}");
        }
    }

    /// A renewal in flight while a re-entry with a short lease is answered and the hold it
    /// nests in is released: the store may have seen the renewal before the re-entry, so the
    /// renewal's reply does not extend the re-entry's own lease, and the entry ends with it.
    #[test]
    fn a_renewal_does_not_extend_a_hold_it_may_have_overtaken() {
        for kind in [LockKind::Semaphore, LockKind::Read] {
            let key = LockKey::new("test:", b"overtaken", 512).unwrap();
            let first: Arc<str> = "h:1#1".into();
            let start = BootInstant::now();
            let lease = Lease::watchdog(Duration::from_millis(300));
            let held = Held::new(
                key,
                Holder::new("h", 1),
                kind,
                (lease, None, &first, true),
                0,
                start,
                None,
            );
            let due = start + lease.renew_interval();
            assert!(matches!(held.check(due), Check::Due(_)), "{kind:?}");
            // The re-entry is answered after the renewal went out; then the first hold goes.
            let reentry: Arc<str> = "h:1#2".into();
            let short = Lease::fixed(Duration::from_millis(80));
            held.reentered(&reentry, (short, None), 0, due);
            held.end_hold(&first);
            held.renewed(due);
            let reentry_ends = short.valid_until(due);
            assert!(
                held.is_lost_at(reentry_ends + Duration::from_millis(1)),
                "{kind:?}: the renewal extended a hold the store may not have had"
            );
            // A hold known before a renewal was sent is extended by it.
            let due = due + lease.renew_interval() / 2;
            assert!(matches!(held.check(due), Check::Due(_)), "{kind:?}");
            held.renewed(due);
            assert!(
                !held.is_lost_at(reentry_ends + Duration::from_millis(1)),
                "{kind:?}"
            );
        }
    }
}
