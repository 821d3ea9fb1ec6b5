//! Held locks and the watchdog that keeps their leases alive.
//!
//! Every lock a client holds is one [`Held`] entry (shared by the guards of a holder that
//! re-entered it). One background task per client wakes when the earliest entry needs attention,
//! renews every entry that is due in one [`Backend::renew`] call (one pipelined round trip per
//! Redis node), and marks an entry lost the moment its validity deadline passes, whether or not a
//! renewal is still in flight. The deadline counts from when the last successful acquire or
//! renewal was *sent*, minus a drift margin, on a clock that keeps counting through suspend; so a
//! holder whose process or network stalled learns about it from its own clock, not from a reply
//! that may never come.

use std::{
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::{
    backend::{Backend, LockKind, Release, Renew, RenewReply},
    client::Shared,
    clock::BootInstant,
    holder::Holder,
    key::LockKey,
    lease::Lease,
};

/// One lock held by one holder in this client.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) key: LockKey,
    pub(crate) holder: Holder,
    pub(crate) kind: LockKind,
    pub(crate) lease: Lease,
    pub(crate) token: Option<u64>,
    pub(crate) lost: CancellationToken,
    /// When the request that acquired it was sent, for the hold-time metric.
    pub(crate) acquired_at: BootInstant,
    state: Mutex<HeldState>,
}

#[derive(Debug)]
struct HeldState {
    /// Guards sharing this entry (re-entries of the same holder).
    refs: usize,
    /// When the lock must be considered gone unless a renewal succeeds first.
    deadline: BootInstant,
    /// When the next renewal is due.
    next_renew: BootInstant,
    /// A renewal for this entry is in flight.
    renewing: bool,
    /// With `max_hold`: no renewals after this.
    renew_until: Option<BootInstant>,
}

impl Held {
    /// A new entry for a lock acquired by a request sent at `sent_at`.
    pub(crate) fn new(
        key: LockKey,
        holder: Holder,
        kind: LockKind,
        (lease, token): (Lease, Option<u64>),
        sent_at: BootInstant,
        max_hold: Option<Duration>,
    ) -> Arc<Self> {
        Arc::new(Self {
            key,
            holder,
            kind,
            lease,
            token,
            lost: CancellationToken::new(),
            acquired_at: sent_at,
            state: Mutex::new(HeldState {
                refs: 1,
                deadline: lease.valid_until(sent_at),
                next_renew: sent_at + lease.renew_interval(),
                renewing: false,
                renew_until: max_hold.map(|max| sent_at + max),
            }),
        })
    }

    /// A release of every hold of this entry.
    pub(crate) fn release_all(&self) -> Release<'_> {
        Release {
            key: &self.key,
            holder: self.holder.id(),
            all: true,
            handoff: None,
            kind: self.kind,
        }
    }

    /// Whether the lock is known to be lost, or its deadline has passed.
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.is_cancelled() || self.state().deadline <= BootInstant::now()
    }

    /// When the watchdog must look at this entry next.
    pub(crate) fn next_event(&self) -> BootInstant {
        let state = self.state();
        if self.lease.is_renewed() {
            state.next_renew.min(state.deadline)
        } else {
            state.deadline
        }
    }

    /// Time left before the deadline.
    pub(crate) fn remaining(&self) -> Duration {
        self.state()
            .deadline
            .saturating_duration_until(BootInstant::now())
    }

    /// One more guard shares this entry; a re-entry sent at `sent_at` also refreshed the lease.
    pub(crate) fn add_ref(&self, sent_at: BootInstant) {
        let mut state = self.state();
        state.refs += 1;
        state.deadline = state.deadline.max(self.lease.valid_until(sent_at));
    }

    /// One guard fewer; returns how many remain.
    pub(crate) fn drop_ref(&self) -> usize {
        let mut state = self.state();
        state.refs = state.refs.saturating_sub(1);
        state.refs
    }

    /// Looks at the entry at `now`: what it needs and when it next needs attention.
    fn check(&self, now: BootInstant) -> Check {
        let mut state = self.state();
        if state.deadline <= now {
            return Check::Lost;
        }
        let renewable = self.lease.is_renewed()
            && !state.renewing
            && state.renew_until.is_none_or(|until| now < until);
        // Renew a little early so entries due at nearly the same time share one round trip.
        let slack = self.lease.renew_interval() / 4;
        if renewable && state.next_renew <= now + slack {
            state.renewing = true;
            return Check::Due(state.deadline);
        }
        let next = if renewable {
            state.next_renew.min(state.deadline)
        } else {
            state.deadline
        };
        Check::Later(next)
    }

    fn renewed(&self, sent_at: BootInstant) {
        let mut state = self.state();
        state.renewing = false;
        state.deadline = state.deadline.max(self.lease.valid_until(sent_at));
        state.next_renew = sent_at + self.lease.renew_interval();
    }

    fn renew_failed(&self, now: BootInstant) {
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

/// A waiter's place in a backend wait queue (fair locks, waiting writers), kept alive by the
/// watchdog while the waiter waits, so that only a waiter that died is ever purged.
#[derive(Debug)]
pub(crate) struct Queued {
    pub(crate) key: LockKey,
    pub(crate) holder: Holder,
    pub(crate) kind: LockKind,
    timeout: Duration,
    /// Wakes the waiter when its turn came or its place was lost.
    pub(crate) wake: Arc<Notify>,
    state: Mutex<QueuedState>,
}

#[derive(Debug)]
struct QueuedState {
    /// The backend has a place for this waiter.
    active: bool,
    next_refresh: BootInstant,
    refreshing: bool,
}

impl Queued {
    pub(crate) fn new(
        key: LockKey,
        holder: Holder,
        kind: LockKind,
        timeout: Duration,
        wake: Arc<Notify>,
    ) -> Arc<Self> {
        Arc::new(Self {
            key,
            holder,
            kind,
            timeout,
            wake,
            state: Mutex::new(QueuedState {
                active: false,
                next_refresh: BootInstant::now(),
                refreshing: false,
            }),
        })
    }

    /// The waiter's place was (re)taken by a request sent at `sent_at`. Returns when it next
    /// needs a refresh.
    pub(crate) fn joined(&self, sent_at: BootInstant) -> BootInstant {
        let mut state = self.state();
        state.active = true;
        state.next_refresh = state.next_refresh.max(sent_at + self.timeout / 3);
        state.next_refresh
    }

    /// Whether the backend has a place for this waiter.
    pub(crate) fn is_active(&self) -> bool {
        self.state().active
    }

    fn check(&self, now: BootInstant) -> Option<Check> {
        let mut state = self.state();
        if !state.active || state.refreshing {
            return None;
        }
        if state.next_refresh <= now {
            state.refreshing = true;
            return Some(Check::Due(state.next_refresh + self.timeout));
        }
        Some(Check::Later(state.next_refresh))
    }

    fn refreshed(&self, sent_at: BootInstant, reply: Option<RenewReply>) {
        let mut state = self.state();
        state.refreshing = false;
        match reply {
            Some(RenewReply::Renewed) => state.next_refresh = sent_at + self.timeout / 3,
            Some(RenewReply::Ready | RenewReply::NotHeld) => {
                // Its turn, or its place is gone: either way the waiter tries again now.
                state.active = false;
                self.wake.notify_one();
            }
            None => state.next_refresh = BootInstant::now() + self.timeout / 10,
        }
    }

    fn state(&self) -> MutexGuard<'_, QueuedState> {
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

/// How long the watchdog sleeps when it holds nothing.
const IDLE: Duration = Duration::from_secs(3600);

/// The watchdog task of one client. Runs until the client stops.
pub(crate) async fn run<B: Backend>(shared: Arc<Shared<B>>) {
    loop {
        let now = BootInstant::now();
        let scan = shared.table.scan(now);
        for held in scan.lost {
            shared.lose(&held, "lease deadline passed before a renewal succeeded");
        }
        if !scan.due.is_empty() || !scan.due_waits.is_empty() {
            tokio::spawn(renew(shared.clone(), scan.due, scan.due_waits, now));
        }
        let sleep = scan
            .next
            .map_or(IDLE, |next| next.saturating_duration_until(now));
        // Entries added later only wake the watchdog when they need it sooner than this.
        shared.watchdog_due.store(
            (now + sleep).as_nanos(),
            std::sync::atomic::Ordering::Release,
        );
        tokio::select! {
            () = shared.stop.cancelled() => return,
            () = shared.watchdog_wake.notified() => {}
            () = tokio::time::sleep(sleep) => {}
        }
    }
}

/// Renews one batch of leases and waiter places, sent at `sent_at`, in one backend call.
async fn renew<B: Backend>(
    shared: Arc<Shared<B>>,
    due: Vec<Arc<Held>>,
    waits: Vec<Arc<Queued>>,
    sent_at: BootInstant,
) {
    let holds = due
        .iter()
        .map(|held| Renew::hold(&held.key, held.holder.id(), held.lease, held.kind));
    let places = waits
        .iter()
        .map(|wait| Renew::place(&wait.key, wait.holder.id(), wait.timeout, wait.kind));
    let renewals: Vec<Renew<'_>> = holds.chain(places).collect();
    let result = shared.backend.renew(&renewals).await;
    crate::metrics::renewal_batch(BootInstant::now().duration_since(sent_at), result.is_ok());
    let replies = match result {
        Ok(replies) if replies.len() == renewals.len() => Some(replies),
        Ok(_) => {
            tracing::warn!("lease renewal returned the wrong number of replies");
            None
        }
        Err(error) => {
            tracing::warn!(%error, locks = due.len(), "lease renewal failed; retrying until the deadline");
            None
        }
    };
    drop(renewals);
    tracing::trace!(
        locks = due.len(),
        waiters = waits.len(),
        ok = replies.is_some(),
        "leases renewed"
    );
    let mut replies = replies.map(Vec::into_iter);
    for held in &due {
        let reply = replies.as_mut().and_then(Iterator::next);
        crate::metrics::renewal(held.kind, reply);
        match reply {
            Some(RenewReply::NotHeld) => shared.lose(held, "renewal found another owner"),
            Some(_) => held.renewed(sent_at),
            None => held.renew_failed(BootInstant::now()),
        }
    }
    for wait in &waits {
        wait.refreshed(sent_at, replies.as_mut().and_then(Iterator::next));
    }
    shared.watchdog_wake.notify_one();
}

/// What a scan of the table found.
#[derive(Default)]
pub(crate) struct Scan {
    pub(crate) lost: Vec<Arc<Held>>,
    pub(crate) due: Vec<Arc<Held>>,
    pub(crate) due_waits: Vec<Arc<Queued>>,
    pub(crate) next: Option<BootInstant>,
}

impl Scan {
    pub(crate) fn add(&mut self, held: &Arc<Held>, now: BootInstant) {
        match held.check(now) {
            Check::Lost => self.lost.push(held.clone()),
            Check::Due(deadline) => {
                // The renewal may hang: wake at the deadline whatever it does.
                self.due.push(held.clone());
                self.later(deadline);
            }
            Check::Later(at) => self.later(at),
        }
    }

    pub(crate) fn add_wait(&mut self, wait: &Arc<Queued>, now: BootInstant) {
        match wait.check(now) {
            Some(Check::Due(_)) => self.due_waits.push(wait.clone()),
            Some(Check::Later(at)) => self.later(at),
            _ => {}
        }
    }

    fn later(&mut self, at: BootInstant) {
        self.next = Some(self.next.map_or(at, |next| next.min(at)));
    }
}
