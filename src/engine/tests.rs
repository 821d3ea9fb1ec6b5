//! The engine's unit tests, by the module they exercise.

mod held {
    use std::{sync::Arc, time::Duration};

    use crate::{
        backend::LockKind, clock::BootInstant, engine::held::*, holder::Holder, lease::Lease,
        lock_key::LockKey,
    };

    fn entry(lease: Lease, now: BootInstant) -> Arc<Held> {
        let key = LockKey::new("test:", b"held", 512).unwrap();
        let grant: Arc<str> = "h:1#1".into();
        Held::new(key, Holder::new("h", 1), LockKind::Exclusive, (grant, None), lease, now, None).0
    }

    /// A re-entry with the grant's own watchdog lease, or a fixed lease the record outlives,
    /// costs no round trip; a longer one, or a token the grant lacks, extends first.
    #[test]
    fn a_reentry_goes_to_the_store_only_for_more_than_the_grant_has() {
        let now = BootInstant::now();
        let watchdog = Lease::watchdog(Duration::from_secs(30));
        let held = entry(watchdog, now);
        assert!(matches!(held.reenter(watchdog, false, now), Reentry::Local(_)));
        let short = Lease::fixed(Duration::from_secs(1));
        assert!(matches!(held.reenter(short, false, now), Reentry::Local(_)));
        let longer = Lease::watchdog(Duration::from_secs(60));
        assert!(
            matches!(held.reenter(longer, false, now), Reentry::Extend(lease) if lease == longer)
        );
        assert!(matches!(held.reenter(watchdog, true, now), Reentry::Extend(_)));
        // Both extends end unanswered; the holds taken so far keep the entry.
        assert!(!held.extend_failed());
        assert!(!held.extend_failed());
        assert_eq!(held.hold_count(), 3);
    }

    /// Each hold keeps its own lease: a re-entry's shorter fixed lease ends that hold only, and
    /// the entry ends with the last live hold, once.
    #[test]
    fn a_shorter_reentry_ends_alone_and_the_last_hold_ends_the_entry() {
        let now = BootInstant::now();
        let held = entry(Lease::watchdog(Duration::from_secs(30)), now);
        let Reentry::Local(short) = held.reenter(Lease::fixed(Duration::from_secs(1)), false, now)
        else {
            panic!("covered by the grant");
        };
        let later = now + Duration::from_secs(2);
        assert!(held.hold_lost_at(short, later));
        assert!(!held.hold_lost_at(0, later));
        assert!(!held.end_hold(0, now), "the short hold still lives");
        assert!(held.end_hold(short, now), "the last hold ends the entry");
        assert!(!held.end(), "it ended once");
    }

    /// Once every hold left has a fixed lease that ran out, the watchdog's look ends the entry
    /// (its delete is then sent), and a re-entry acquires afresh.
    #[test]
    fn an_entry_whose_holds_all_ran_out_ends_at_the_watchdogs_look() {
        let now = BootInstant::now();
        let held = entry(Lease::fixed(Duration::from_millis(500)), now);
        assert!(matches!(held.check(now), Check::Later(_)));
        let after = now + Duration::from_millis(496);
        assert!(matches!(held.check(after), Check::Expired));
        assert!(matches!(
            held.reenter(Lease::fixed(Duration::from_secs(1)), false, after),
            Reentry::Ended
        ));
    }
}

mod table {
    use std::sync::Arc;

    use crate::{
        backend::LockKind,
        clock::BootInstant,
        engine::{Held, table::*},
        holder::Holder,
        lease::Lease,
        lock_key::LockKey,
    };

    fn want(n: u64) -> Arc<Want> {
        Arc::new(Want {
            holder: Holder::new("client", n),
            attempt: Arc::from(format!("attempt:{n}")),
            kind: LockKind::Exclusive,
            lease: Lease::DEFAULT,
            fencing: false,
            permits: 0,
            within: None,
        })
    }

    fn hold(key: &LockKey, want: &Want) -> Arc<Held> {
        let grant = (want.attempt.clone(), None);
        let now = BootInstant::now();
        Held::new(key.clone(), want.holder.clone(), want.kind, grant, want.lease, now, None).0
    }

    /// Hands the lock from `held` to the head waiter until the table says to release for
    /// real; returns how many hand-offs that was and the last hold.
    fn streak(table: &Table<()>, key: &LockKey, mut held: Arc<Held>) -> (u32, Arc<Held>) {
        let mut handoffs = 0;
        loop {
            match table.ended(&held, 4) {
                (Some(slot), false) => {
                    handoffs += 1;
                    held = hold(key, &slot.want);
                    table.handed_off(held.clone());
                }
                (None, true) => return (handoffs, held),
                other => panic!("unexpected release: {:?}", other.1),
            }
        }
    }

    /// The streak is short (4) once a release reached waiters elsewhere, and stays short
    /// through a release that reached none for a second; then it may run eight times longer.
    #[tokio::test(start_paused = true)]
    async fn waiters_elsewhere_keep_the_streak_short_for_a_while() {
        let table = Table::<()>::default();
        let key = LockKey::new("test:", b"streak", 512).unwrap();
        let first = want(0);
        table.acquired(&key, 0, hold(&key, &first));
        let mut tickets = Vec::new();
        for n in 1..=200 {
            tickets.push(table.join(n, &key, want(n), None, usize::MAX).unwrap());
        }
        let held = table.held_entries(&key)[0].clone();
        let (handoffs, held) = streak(&table, &key, held);
        assert_eq!(handoffs, 32, "nobody seen elsewhere yet");

        let mut held = held;
        for (elsewhere, expected) in [(true, 4), (false, 4), (false, 4)] {
            table.released(&key, elsewhere, None);
            let (id, head) = table.head(&key).unwrap();
            table.acquired(&key, id, hold(&key, &head));
            let fresh = table.held_entries(&key).last().unwrap().clone();
            drop(held);
            let (handoffs, last) = streak(&table, &key, fresh);
            assert_eq!(handoffs, expected, "after a release heard elsewhere: {elsewhere}");
            held = last;
        }

        tokio::time::advance(CONTENDED_FOR).await;
        table.released(&key, false, None);
        let (id, head) = table.head(&key).unwrap();
        table.acquired(&key, id, hold(&key, &head));
        let fresh = table.held_entries(&key).last().unwrap().clone();
        let (handoffs, _) = streak(&table, &key, fresh);
        assert_eq!(handoffs, 32, "a second without waiters elsewhere");
        drop((held, tickets));
    }
}

mod watchdog {
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
        let scans = locks.inner.engine.scans.load(std::sync::atomic::Ordering::Relaxed);
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
        assert!(matches!(guard.release().await, Err(crate::LockError::Lost)));
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
        locks.lock("warm-up").acquire().await.unwrap().release().await.unwrap();
        tokio::task::yield_now().await;
        // The watchdog is now paused after that scan.
        let guard = locks.lock("order:1").acquire().await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!guard.is_lost(), "the lock was not renewed");
        guard.release().await.unwrap();
    }
}
