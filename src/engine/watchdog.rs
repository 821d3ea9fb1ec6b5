//! The watchdog that keeps held leases (and waiters' places) alive.
//!
//! One background task per client wakes when the earliest entry needs attention, renews every
//! entry that is due in one [`Backend::renew`] call (one pipelined round trip per Redis node),
//! and marks an entry lost the moment its validity deadline passes, whether or not a renewal is
//! still in flight.

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
            let pause = shared
                .scan_pause
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
            if let Some(pause) = pause {
                tokio::time::sleep(pause).await;
            }
        }
        let added = BootInstant::from_nanos(shared.watch_earliest.load(Ordering::SeqCst));
        let mut plan = scan
            .next
            .map_or(added, |next| next.min(added))
            .min(now + IDLE);
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
            Some(RenewReply::NotHeld) => shared.lose(held, Loss::Taken("renewal found the grant gone")),
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{Lease, LockClient, MemoryBackend};

    /// Short holds taken and given back one after another (each needing the watchdog 10 s
    /// later, each gone when it looks) move its plan but are not scanned for: a scan per
    /// acquire would keep it busy under load.
    #[tokio::test(flavor = "current_thread")]
    async fn a_stream_of_short_holds_is_not_scanned_for_each() {
        let locks = LockClient::builder(MemoryBackend::new()).build().unwrap();
        for _ in 0..200 {
            let guard = locks.lock("key").acquire().await.unwrap();
            guard.release().await.unwrap();
            // The watchdog runs here, when woken.
            tokio::task::yield_now().await;
        }
        let scans = locks
            .inner
            .engine
            .scans
            .load(std::sync::atomic::Ordering::Relaxed);
        assert!(scans <= 3, "{scans} scans for 200 short holds");
    }

    /// A hold with a fixed lease whose guard lives past the lease is reported lost at its
    /// deadline (a little before the lease ends), and its client deletes the grant then: the
    /// lock is free at once, for the guard that held it knows it lost it.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_fixed_lease_that_ran_out_frees_the_lock_when_its_guard_learns_it() {
        let lease = Lease::fixed(Duration::from_secs(2));
        let backend = MemoryBackend::new();
        let holder = LockClient::builder(backend.clone()).build().unwrap();
        let other = LockClient::builder(backend).build().unwrap();
        let granted = tokio::time::Instant::now();
        let guard = holder.lock("report").lease(lease).acquire().await.unwrap();
        let refused = other.lock("report").try_acquire().await;
        assert!(refused.is_err(), "held within its lease");
        guard.lost().await;
        let lost_after = granted.elapsed();
        assert!(lost_after < lease.duration(), "lost at {lost_after:?}");
        // The watchdog and the delete it sent have run.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        other
            .lock("report")
            .try_acquire()
            .await
            .expect("free once its holder knows its lease ran out")
            .release()
            .await
            .unwrap();
        assert!(matches!(
            guard.release().await,
            Err(crate::LockError::Lost)
        ));
    }

    /// An entry added while the watchdog scans (after it looked at the table, before it stored
    /// when it plans to wake) still wakes it: the lock is renewed, not left to run out.
    #[tokio::test(flavor = "current_thread")]
    async fn an_entry_added_during_a_scan_is_renewed() {
        let locks = LockClient::builder(MemoryBackend::new())
            .lease(Lease::watchdog(Duration::from_millis(300)))
            .build()
            .unwrap();
        *locks.inner.engine.scan_pause.lock().unwrap() = Some(Duration::from_millis(100));
        // The first acquire starts the watchdog; once released, its next scan finds nothing.
        locks
            .lock("warm-up")
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        tokio::task::yield_now().await;
        // The watchdog is now paused after that scan.
        let guard = locks.lock("order:1").acquire().await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!guard.is_lost(), "the lock was not renewed");
        guard.release().await.unwrap();
    }
}
