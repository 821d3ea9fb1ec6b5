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

use tokio_util::sync::CancellationToken;

use crate::{
    backend::{Backend, Renew, RenewReply},
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
    pub(crate) lease: Lease,
    pub(crate) token: Option<u64>,
    pub(crate) lost: CancellationToken,
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
        lease: Lease,
        token: Option<u64>,
        sent_at: BootInstant,
        max_hold: Option<Duration>,
    ) -> Arc<Self> {
        Arc::new(Self {
            key,
            holder,
            lease,
            token,
            lost: CancellationToken::new(),
            state: Mutex::new(HeldState {
                refs: 1,
                deadline: sent_at + lease.duration() - lease.drift(),
                next_renew: sent_at + lease.renew_interval(),
                renewing: false,
                renew_until: max_hold.map(|max| sent_at + max),
            }),
        })
    }

    /// Whether the lock is known to be lost, or its deadline has passed.
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.is_cancelled() || self.state().deadline <= BootInstant::now()
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
        state.deadline = state
            .deadline
            .max(sent_at + self.lease.duration() - self.lease.drift());
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
        state.deadline = state
            .deadline
            .max(sent_at + self.lease.duration() - self.lease.drift());
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
        if !scan.due.is_empty() {
            tokio::spawn(renew(shared.clone(), scan.due, now));
        }
        let sleep = scan
            .next
            .map_or(IDLE, |next| next.saturating_duration_until(now));
        tokio::select! {
            () = shared.stop.cancelled() => return,
            () = shared.watchdog_wake.notified() => {}
            () = tokio::time::sleep(sleep) => {}
        }
    }
}

/// Renews one batch of entries whose renewals were sent at `sent_at`.
async fn renew<B: Backend>(shared: Arc<Shared<B>>, due: Vec<Arc<Held>>, sent_at: BootInstant) {
    let renewals: Vec<Renew<'_>> = due
        .iter()
        .map(|held| Renew {
            key: &held.key,
            holder: held.holder.id(),
            lease: held.lease,
        })
        .collect();
    let result = shared.backend.renew(&renewals).await;
    match result {
        Ok(replies) if replies.len() == due.len() => {
            tracing::trace!(locks = due.len(), "leases renewed");
            for (held, reply) in due.iter().zip(replies) {
                match reply {
                    RenewReply::Renewed => held.renewed(sent_at),
                    RenewReply::NotHeld => shared.lose(held, "renewal found another owner"),
                }
            }
        }
        Ok(_) => {
            tracing::warn!("lease renewal returned the wrong number of replies");
            due.iter()
                .for_each(|held| held.renew_failed(BootInstant::now()));
        }
        Err(error) => {
            tracing::warn!(%error, locks = due.len(), "lease renewal failed; retrying until the deadline");
            due.iter()
                .for_each(|held| held.renew_failed(BootInstant::now()));
        }
    }
    shared.watchdog_wake.notify_one();
}

/// What a scan of the table found.
#[derive(Default)]
pub(crate) struct Scan {
    pub(crate) lost: Vec<Arc<Held>>,
    pub(crate) due: Vec<Arc<Held>>,
    pub(crate) next: Option<BootInstant>,
}

impl Scan {
    pub(crate) fn add(&mut self, held: &Arc<Held>, now: BootInstant) {
        match held.check(now) {
            Check::Lost => self.lost.push(held.clone()),
            Check::Due(deadline) => {
                // The renewal may hang: wake at the deadline whatever it does.
                self.due.push(held.clone());
                self.next = Some(self.next.map_or(deadline, |next| next.min(deadline)));
            }
            Check::Later(at) => self.next = Some(self.next.map_or(at, |next| next.min(at))),
        }
    }
}
