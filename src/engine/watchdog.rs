//! The watchdog that keeps held leases (and waiters' places) alive.
//!
//! One task per client wakes when the earliest entry needs it, renews every entry that is due in
//! one renewal call to the store (a pipelined round trip per node), and marks an entry lost the
//! moment its deadline passes, whether or not a renewal is in flight.

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use super::{Engine, Held, Loss, place::Queued};
use crate::{
    backend::{
        Backend,
        store::{Renew, RenewReply},
    },
    clock::BootInstant,
    lease::Lease,
};

/// Starts the watchdog of `engine` on the current runtime, once.
pub(crate) fn start<B: Backend>(engine: &Arc<Engine<B>>) {
    if engine.runtime.get().is_some() {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    if engine.runtime.set(runtime.clone()).is_ok() {
        runtime.spawn(run(engine.clone()));
    }
}

/// How long the watchdog sleeps when it holds nothing.
const IDLE: Duration = Duration::from_secs(3600);

/// The watchdog task of one client. Runs until the client stops.
pub(crate) async fn run<B: Backend>(shared: Arc<Engine<B>>) {
    loop {
        // While the scan runs, every entry added wakes the watchdog and records when it needs
        // it: one added just after the scan looked would otherwise compare its time with the
        // previous plan, which may be earlier than the one stored below, and never be renewed.
        shared.watchdog_due.store(u64::MAX, Ordering::SeqCst);
        shared.watch_earliest.store(u64::MAX, Ordering::SeqCst);
        let now = BootInstant::now();
        let scan = shared.table.scan(now);
        #[cfg(test)]
        shared.scans.fetch_add(1, Ordering::Relaxed);
        for held in scan.lost {
            shared.lose(&held, Loss::Expired);
        }
        for held in scan.expired {
            shared.end_quietly(&held);
        }
        if !scan.due.is_empty() || !scan.due_waits.is_empty() {
            tokio::spawn(renew(shared.clone(), scan.due, scan.due_waits, now));
        }
        #[cfg(test)]
        {
            let pause =
                shared.scan_pause.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
            if let Some(pause) = pause {
                tokio::time::sleep(pause).await;
            }
        }
        let added = BootInstant::from_nanos(shared.watch_earliest.load(Ordering::SeqCst));
        let mut plan = scan.next.map_or(added, |next| next.min(added)).min(now + IDLE);
        loop {
            // Entries added from now on only wake the watchdog when they need it sooner.
            shared.watchdog_due.store(plan.as_nanos(), Ordering::SeqCst);
            let until =
                tokio::time::Instant::now() + plan.saturating_duration_until(BootInstant::now());
            tokio::select! {
                () = shared.stop.cancelled() => return,
                () = tokio::time::sleep_until(until) => break,
                () = shared.watchdog_wake.notified() => {}
            }
            // Woken early by an entry that needs the watchdog before the plan: move the plan
            // rather than scan now. Under load a scan finds the holds of the moment, soon
            // released, and scanning again for every new one would keep the watchdog busy.
            let added = BootInstant::from_nanos(shared.watch_earliest.load(Ordering::SeqCst));
            plan = plan.min(added);
            if plan <= BootInstant::now() {
                break;
            }
        }
    }
}

/// Renews one batch of leases and waiter places, sent at `sent_at`, in one backend call.
async fn renew<B: Backend>(
    shared: Arc<Engine<B>>,
    due: Vec<Arc<Held>>,
    waits: Vec<Arc<Queued>>,
    sent_at: BootInstant,
) {
    // An entry whose last watchdog hold went since the scan has nothing to renew.
    let mut renewed = Vec::with_capacity(due.len());
    let mut renewals: Vec<Renew<'_>> = Vec::with_capacity(due.len() + waits.len());
    for held in &due {
        match held.renewal() {
            Some(renewal) => {
                renewed.push(held);
                renewals.push(renewal);
            }
            None => held.renew_failed(sent_at),
        }
    }
    let leases: Vec<Lease> = renewals.iter().filter_map(Renew::lease).collect();
    renewals.extend(waits.iter().map(|wait| Renew::Place {
        key: &wait.key,
        kind: wait.kind,
        holder: wait.holder.id(),
        timeout: wait.timeout,
    }));
    let result = shared.backend.renew(&renewals).await;
    crate::metrics::renewal_batch(BootInstant::now().duration_since(sent_at), result.is_ok());
    let replies = match result {
        Ok(replies) if replies.len() == renewals.len() => Some(replies),
        Ok(_) => {
            tracing::warn!("lease renewal returned the wrong number of replies");
            None
        }
        // A failure of an incident the backend logged already: once is enough.
        Err(error) if error.is_reported() => {
            tracing::debug!(error = %format_args!("{error:#}"), locks = due.len(), "lease renewal failed; retrying until the deadline");
            None
        }
        Err(error) => {
            tracing::warn!(error = %format_args!("{error:#}"), locks = due.len(), "lease renewal failed; retrying until the deadline");
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
    for (held, lease) in renewed.into_iter().zip(leases) {
        let reply = replies.as_mut().and_then(Iterator::next);
        crate::metrics::renewal(held.kind, reply);
        match reply {
            // Ended while the renewal was in flight: the reply is about a grant that is over
            // (and the holder may hold the lock anew), not a loss.
            Some(RenewReply::NotHeld) if held.is_ended() => {}
            Some(RenewReply::NotHeld) => {
                shared.lose(held, Loss::Taken("renewal found the grant gone"))
            }
            Some(_) => held.renewed(lease, sent_at),
            None => held.renew_failed(BootInstant::now()),
        }
    }
    for wait in &waits {
        wait.refreshed(sent_at, replies.as_mut().and_then(Iterator::next));
    }
    // The entries' next times have moved: plan again.
    shared.watch(BootInstant::now());
}
