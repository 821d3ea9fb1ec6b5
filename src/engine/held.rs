//! One grant held by one holder in a client, with the holds of that holder's guards in it.
//!
//! The store keeps one record per grant and no counts: a re-entry is one more hold here. Each
//! hold keeps its own lease (a fixed one ends that hold only; watchdog holds are renewed with
//! the grant, by the longest of their leases), and a re-entry that needs more than the record
//! is known to have (lease or token) extends it first. When the last live hold ends, the entry
//! ends once, and one delete naming the grant is sent.
//!
//! Leases count from when the write that set them was *sent*, less a drift margin, on a clock
//! that counts through suspend: a stalled holder learns of it from its own clock.

use std::{
    sync::{
        Arc, Mutex, MutexGuard, OnceLock, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::sync::Notify;

use crate::{
    backend::{
        LockKind,
        store::{Release, Renew},
    },
    clock::BootInstant,
    holder::Holder,
    lease::Lease,
    lock_key::LockKey,
};

/// One grant held by one holder in this client.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) key: LockKey,
    pub(crate) holder: Holder,
    pub(crate) kind: LockKind,
    /// The attempt that won the record: every write about the grant names it.
    grant: Arc<str>,
    /// The grant's fencing token: issued with it, or by the first extend that asked for one.
    token: OnceLock<u64>,
    /// Set when the grant is lost (see [`mark_lost`](Self::mark_lost)).
    marked_lost: AtomicBool,
    /// Wakes what waits for the loss ([`until_lost`](Self::until_lost)).
    lost_wake: Notify,
    /// Until when the record certainly lives (boot-clock nanoseconds): the latest sent time plus
    /// lease less drift of the grant's writes. Outside the mutex: every poll of a request reads it.
    deadline: AtomicU64,
    /// The latest sent time plus lease of any write naming the grant, answered or not: until
    /// then the store may keep the record, and its delete is worth sending.
    kept_until: AtomicU64,
    /// When the request that acquired it was sent, for the hold-time metric.
    pub(crate) acquired_at: BootInstant,
    state: Mutex<HeldState>,
}

#[derive(Debug)]
struct HeldState {
    holds: Vec<Hold>,
    next_hold: u64,
    /// The longest watchdog lease of the live holds, which renewals use; none if all are fixed.
    renew: Option<Lease>,
    next_renew: BootInstant,
    renewing: bool,
    /// With `max_hold`: no renewals after this.
    renew_until: Option<BootInstant>,
    /// Re-entries whose extend is on its way: the entry does not end meanwhile.
    pending: usize,
    /// The entry ended: it is out of the table, and its delete was sent (or is not needed).
    ended: bool,
}

/// One guard's hold of the grant.
#[derive(Debug)]
struct Hold {
    id: u64,
    lease: Lease,
    /// A fixed lease's end (sent time plus lease less drift); none for a watchdog lease.
    until: Option<BootInstant>,
}

impl Hold {
    fn is_live(&self, now: BootInstant) -> bool {
        self.until.is_none_or(|until| now < until)
    }
}

/// What a re-entry of an entry needs.
#[derive(Debug)]
pub(crate) enum Reentry {
    /// Added at once: the hold's id.
    Local(u64),
    /// The grant must first be extended to this lease (and given a token, when asked for);
    /// report with [`Held::extended`] or [`Held::extend_failed`].
    Extend(Lease),
    /// The grant is lost, over or past its deadline: acquire afresh.
    Ended,
}

/// What an entry needs now.
pub(crate) enum Check {
    /// Its deadline passed without a renewal.
    Lost,
    /// Every hold's own lease ended: the entry ended with them, its delete is to be sent.
    Expired,
    /// A renewal is due; the entry is lost at the deadline unless it succeeds first.
    Due(BootInstant),
    Later(BootInstant),
}

impl Held {
    /// A new entry for the grant `grant` (with `token`) of a request sent at `sent_at` with
    /// `lease`, and the id of its first hold.
    pub(crate) fn new(
        key: LockKey,
        holder: Holder,
        kind: LockKind,
        (grant, token): (Arc<str>, Option<u64>),
        lease: Lease,
        sent_at: BootInstant,
        max_hold: Option<Duration>,
    ) -> (Arc<Self>, u64) {
        let until = lease.valid_until(sent_at);
        let held = Arc::new(Self {
            key,
            holder,
            kind,
            grant,
            token: token.map_or_else(OnceLock::new, OnceLock::from),
            marked_lost: AtomicBool::new(false),
            lost_wake: Notify::new(),
            deadline: AtomicU64::new(until.as_nanos()),
            kept_until: AtomicU64::new((sent_at + lease.duration()).as_nanos()),
            acquired_at: sent_at,
            state: Mutex::new(HeldState {
                holds: vec![Hold { id: 0, lease, until: (!lease.is_renewed()).then_some(until) }],
                next_hold: 1,
                renew: lease.is_renewed().then_some(lease),
                next_renew: sent_at + lease.renew_interval(),
                renewing: false,
                renew_until: max_hold.map(|max| sent_at + max),
                pending: 0,
                ended: false,
            }),
        });
        (held, 0)
    }

    /// The attempt that won the grant.
    pub(crate) fn grant(&self) -> &Arc<str> {
        &self.grant
    }

    /// The grant's fencing token, if one was asked for by its grant or an extend.
    pub(crate) fn token(&self) -> Option<u64> {
        self.token.get().copied()
    }

    /// The delete of this grant.
    pub(crate) fn release(&self) -> Release<'_> {
        Release {
            key: &self.key,
            kind: self.kind,
            grant: &self.grant,
            token: self.token(),
            handoff: None,
        }
    }

    /// The renewal of this grant with the lease of its live watchdog holds.
    pub(crate) fn renewal(&self) -> Option<Renew<'_>> {
        let lease = self.state().renew?;
        Some(Renew::Grant { key: &self.key, kind: self.kind, grant: &self.grant, lease })
    }

    /// Adds a hold with `lease` (a token asked for with `fencing`) at `now`, locally if the
    /// grant covers it; see [`Reentry`]. A re-entry that must extend is pending until
    /// reported.
    pub(crate) fn reenter(&self, lease: Lease, fencing: bool, now: BootInstant) -> Reentry {
        let mut state = self.state();
        if state.ended || self.is_lost_at(now) {
            return Reentry::Ended;
        }
        let until = lease.valid_until(now);
        let covered = match lease.is_renewed() {
            // Renewed with it (or longer) already, or the record outlives its first renewal.
            true => state.renew.is_some_and(|renew| renew.duration() >= lease.duration()),
            false => false,
        } || until <= self.deadline();
        if covered && (!fencing || self.token().is_some()) {
            return Reentry::Local(self.add_hold(&mut state, lease, now));
        }
        state.pending += 1;
        self.kept_until.fetch_max((now + lease.duration()).as_nanos(), Ordering::SeqCst);
        Reentry::Extend(lease)
    }

    /// An extend sent at `sent_at` for a re-entry with `lease` came back extended, with the
    /// grant's `token`: the re-entry's hold is added; its id. `Err` when the grant was lost (or
    /// ended) while the extend was on its way, or the re-entry's own lease ran out meanwhile: no
    /// hold is added, and `true` says that left the entry with no live hold (it ends now; its
    /// delete is the caller's to send).
    pub(crate) fn extended(
        &self,
        lease: Lease,
        token: Option<u64>,
        sent_at: BootInstant,
    ) -> Result<u64, bool> {
        let now = BootInstant::now();
        let mut state = self.state();
        state.pending -= 1;
        let late = !lease.is_renewed() && lease.valid_until(sent_at) <= now;
        if state.ended || self.is_lost_at(now) || late {
            return Err(Self::end_if_idle(&mut state, now));
        }
        if let Some(token) = token {
            // One token per grant: one already known is the same.
            let _ = self.token.set(token);
        }
        self.deadline.fetch_max(lease.valid_until(sent_at).as_nanos(), Ordering::AcqRel);
        Ok(self.add_hold(&mut state, lease, sent_at))
    }

    /// An extend did not happen (or its outcome is unknown). True when that leaves the entry
    /// with no live hold: it ends now, and its delete is the caller's to send.
    pub(crate) fn extend_failed(&self) -> bool {
        let mut state = self.state();
        state.pending -= 1;
        Self::end_if_idle(&mut state, BootInstant::now())
    }

    fn add_hold(&self, state: &mut HeldState, lease: Lease, now: BootInstant) -> u64 {
        let id = state.next_hold;
        state.next_hold += 1;
        let until = (!lease.is_renewed()).then(|| lease.valid_until(now));
        if lease.is_renewed() && state.renew.is_none_or(|renew| renew.duration() < lease.duration())
        {
            if state.renew.is_none() {
                state.next_renew = now + lease.renew_interval();
            }
            state.renew = Some(lease);
        }
        state.holds.push(Hold { id, lease, until });
        id
    }

    /// The guard of hold `id` is given back at `now`. True when that ended the entry (no live
    /// hold is left and no re-entry is on its way): its delete is the caller's to send.
    pub(crate) fn end_hold(&self, id: u64, now: BootInstant) -> bool {
        let mut state = self.state();
        state.holds.retain(|hold| hold.id != id);
        state.renew = state
            .holds
            .iter()
            .filter(|hold| hold.lease.is_renewed())
            .map(|hold| hold.lease)
            .max_by_key(|lease| lease.duration());
        Self::end_if_idle(&mut state, now)
    }

    fn end_if_idle(state: &mut HeldState, now: BootInstant) -> bool {
        let idle = state.pending == 0 && !state.holds.iter().any(|hold| hold.is_live(now));
        if idle && !state.ended {
            state.ended = true;
            return true;
        }
        false
    }

    /// Ends the entry whatever its holds (a loss, a shutdown). True when this call ended it.
    pub(crate) fn end(&self) -> bool {
        !std::mem::replace(&mut self.state().ended, true)
    }

    /// Whether the entry ended.
    pub(crate) fn is_ended(&self) -> bool {
        self.state().ended
    }

    /// How many live holds the entry has.
    pub(crate) fn hold_count(&self) -> usize {
        let now = BootInstant::now();
        self.state().holds.iter().filter(|hold| hold.is_live(now)).count()
    }

    /// When hold `id`'s own lease ends, if it is fixed.
    pub(crate) fn hold_until(&self, id: u64) -> Option<BootInstant> {
        let state = self.state();
        state.holds.iter().find(|hold| hold.id == id)?.until
    }

    /// Whether hold `id` is lost by `now`: the grant is, or the hold's own lease ended.
    pub(crate) fn hold_lost_at(&self, id: u64, now: BootInstant) -> bool {
        self.is_lost_at(now) || self.hold_until(id).is_some_and(|until| until <= now)
    }

    /// Whether the grant is known to be lost, or its deadline has passed by `now`.
    pub(crate) fn is_lost_at(&self, now: BootInstant) -> bool {
        self.is_marked_lost() || self.deadline() <= now
    }

    /// Whether the grant was marked lost ([`mark_lost`](Self::mark_lost)).
    pub(crate) fn is_marked_lost(&self) -> bool {
        self.marked_lost.load(Ordering::Acquire)
    }

    /// Marks the grant lost and wakes whoever waits for that; false if it already was.
    pub(crate) fn mark_lost(&self) -> bool {
        let first = !self.marked_lost.swap(true, Ordering::AcqRel);
        self.lost_wake.notify_waiters();
        first
    }

    /// Resolves once the grant is marked lost.
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

    /// Time left before the deadline.
    pub(crate) fn remaining(&self) -> Duration {
        self.deadline().saturating_duration_until(BootInstant::now())
    }

    /// Whether the store may keep the record past `now`.
    pub(crate) fn kept_past(&self, now: BootInstant) -> bool {
        BootInstant::from_nanos(self.kept_until.load(Ordering::SeqCst)) > now
    }

    /// When the watchdog must look at this entry next.
    pub(crate) fn next_event(&self) -> BootInstant {
        Self::next(&self.state(), self.deadline(), true)
    }

    /// When an entry whose record lives until `deadline` next needs the watchdog: its next
    /// renewal if `renewable`, or while only fixed holds live, the last one's end.
    fn next(state: &HeldState, deadline: BootInstant, renewable: bool) -> BootInstant {
        match state.renew {
            Some(_) if renewable => deadline.min(state.next_renew),
            Some(_) => deadline,
            None => state
                .holds
                .iter()
                .filter_map(|hold| hold.until)
                .max()
                .map_or(deadline, |end| end.min(deadline)),
        }
    }

    /// Looks at the entry at `now`: what it needs and when it next needs attention.
    pub(crate) fn check(&self, now: BootInstant) -> Check {
        let mut state = self.state();
        // Every hold's own lease ran out (the last of them ends no later than the deadline):
        // the grant is over, not lost.
        if Self::end_if_idle(&mut state, now) {
            return Check::Expired;
        }
        let deadline = self.deadline();
        if deadline <= now {
            return Check::Lost;
        }
        let renewable = state.renew.is_some()
            && !state.renewing
            && state.renew_until.is_none_or(|until| now < until);
        // Renew up to half an interval early, so grants due at nearly the same time share one
        // round trip: groups taken in bursts merge within two ticks and stay together.
        if let Some(renew) = state.renew.filter(|_| renewable)
            && state.next_renew <= now + renew.renew_interval() / 2
        {
            state.renewing = true;
            self.kept_until.fetch_max((now + renew.duration()).as_nanos(), Ordering::SeqCst);
            return Check::Due(deadline);
        }
        Check::Later(Self::next(&state, deadline, renewable))
    }

    /// A renewal with `lease`, sent at `sent_at`, succeeded.
    pub(crate) fn renewed(&self, lease: Lease, sent_at: BootInstant) {
        let mut state = self.state();
        state.renewing = false;
        self.deadline.fetch_max(lease.valid_until(sent_at).as_nanos(), Ordering::AcqRel);
        state.next_renew = sent_at + lease.renew_interval();
    }

    /// A renewal failed at `now`: it is tried again soon, until the deadline.
    pub(crate) fn renew_failed(&self, now: BootInstant) {
        let mut state = self.state();
        state.renewing = false;
        let interval = state.renew.map_or(Duration::from_secs(1), |r| r.renew_interval());
        state.next_renew = now + (interval / 4).min(Duration::from_secs(1));
    }

    // A std mutex: a few field updates, never held across an await.
    fn state(&self) -> MutexGuard<'_, HeldState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
