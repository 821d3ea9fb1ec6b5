//! How long a client's locks are typically held, for the `Retry-After` of a busy lock.
//!
//! A watchdog lease says nothing of when its holder finishes: it is renewed for as long as the
//! holder works. What does say it is how long holders of like locks held them before. So every
//! guard of a client records its hold time here when it is released (or dropped), under the
//! lock's *family*: its name without the last `:`-separated part of the key (`account:7` and
//! `account:9` are one family, `account:`; a layer's bare keys share their namespace's). Every
//! path that answers a busy lock (a layer, `#[locked]`, `?` on a [`LockError`] in a tonic
//! method) reads the same figure, because the client puts it into the error itself.
//!
//! [`LockError`]: crate::LockError

use std::{
    collections::HashMap,
    sync::atomic::{AtomicUsize, Ordering::Relaxed},
    time::Duration,
};

use crate::lock_key::{LockKey, Shards};

/// How many families a client keeps figures for. Keys come from requests, so the families
/// are capped: a family first seen once the cap is reached gets no figure of its own (its busy
/// answers use the bounded guess).
const MAX_FAMILIES: usize = 4096;

/// With no hold seen yet in a family, the guess is the wait the request had, at least this...
const MIN_GUESS: Duration = Duration::from_millis(100);
/// ... and at most this: never the holder's whole (watchdog) lease merely because nothing else
/// is known.
const MAX_GUESS: Duration = Duration::from_secs(5);
/// The shortest hint ever given: a client told 0 would try again at once, in a loop.
pub(crate) const MIN_RETRY: Duration = Duration::from_millis(10);

/// Average hold times in milliseconds, by family.
type Averages = HashMap<Box<str>, u64>;

/// Running averages of hold times per lock family, spread over the shards every client table
/// uses (every release records one; two releases of different families rarely share a mutex).
#[derive(Default)]
pub(crate) struct HoldStats {
    shards: Shards<Averages>,
    families: AtomicUsize,
}

impl std::fmt::Debug for HoldStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HoldStats").field("families", &self.families.load(Relaxed)).finish()
    }
}

impl HoldStats {
    /// Adds one hold of the lock `key` (weight 1/8: recent holds count most).
    pub(crate) fn record(&self, key: &LockKey, held: Duration) {
        let family = family(key.as_str());
        let sample = u64::try_from(held.as_millis()).unwrap_or(u64::MAX).max(1);
        let mut shard = self.shards.of_name(family);
        if let Some(average) = shard.get_mut(family) {
            *average = *average - *average / 8 + sample / 8;
            return;
        }
        // Counted before it is added, so that two threads cannot both take the last place.
        if self.families.fetch_add(1, Relaxed) >= MAX_FAMILIES {
            self.families.fetch_sub(1, Relaxed);
            return;
        }
        shard.insert(family.into(), sample);
    }

    /// How long holds of `key`'s family typically last, once one was recorded.
    pub(crate) fn typical(&self, key: &LockKey) -> Option<Duration> {
        let family = family(key.as_str());
        self.shards.of_name(family).get(family).map(|&ms| Duration::from_millis(ms))
    }

    /// When a request that waited `waited` for `key` may try again: see [`likely_free_in`].
    pub(crate) fn retry_after(
        &self,
        key: &LockKey,
        lease_left: Option<Duration>,
        waited: Duration,
    ) -> Duration {
        likely_free_in(self.typical(key), lease_left, waited)
    }
}

/// When a request whose wait for a busy lock ran out may try again.
///
/// - With a `typical` hold known: that, but never less than the request `waited` (its holder
///   has held the lock at least that long already).
/// - With none: the wait the request had, within 100 ms to 5 s (never the holder's lease).
/// - Either way no later than `lease_left`, the holder's lease left as last heard, when some of
///   it is left (by then the lock is free, unless renewed), but not below the wait either: a
///   lease left shorter than the wait may well have been renewed during it (a watchdog lease
///   is renewed every third of its length), so it says nothing of this holder's end; a lease
///   that ran out while the request waited caps nothing.
/// - Never under 10 ms.
pub(crate) fn likely_free_in(
    typical: Option<Duration>,
    lease_left: Option<Duration>,
    waited: Duration,
) -> Duration {
    let estimate = match typical {
        Some(typical) => typical.max(waited),
        None => waited.clamp(MIN_GUESS, MAX_GUESS),
    };
    let estimate = match lease_left {
        Some(left) if !left.is_zero() => estimate.min(left.max(waited)),
        _ => estimate,
    };
    estimate.max(MIN_RETRY)
}

/// The family of the lock named `name`: the name up to the last `:` inside its braces (the
/// user key's last part dropped), or up to its opening brace when the key has no `:`.
fn family(name: &str) -> &str {
    let Some(open) = name.find('{') else {
        return name;
    };
    let close = name[open..].find('}').map_or(name.len(), |at| open + at);
    match name[open..close].rfind(':') {
        Some(colon) => &name[..=open + colon],
        None => &name[..=open],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys of one resource share a family; other resources and namespaces do not.
    #[test]
    fn families() {
        assert_eq!(family("p:{account:7}"), "p:{account:");
        assert_eq!(family("p:{account:7}:rw"), "p:{account:");
        assert_eq!(family("p:/accounts/:id{7}"), "p:/accounts/:id{");
        assert_eq!(family("p:{a:b:c}"), "p:{a:b:");
        assert_eq!(family("plain"), "plain");
    }

    /// The hint: the typical hold raised to the wait; with no history the wait, bounded; capped
    /// by a lease that has some left; never 0.
    #[test]
    fn likely_free_in_is_bounded() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        assert_eq!(likely_free_in(Some(ms(35)), Some(s(43)), s(2)), s(2));
        assert_eq!(likely_free_in(Some(s(5)), Some(s(43)), s(2)), s(5));
        assert_eq!(likely_free_in(Some(s(50)), Some(s(43)), s(2)), s(43));
        // No history: the wait, not the 28 s of lease left.
        assert_eq!(likely_free_in(None, Some(s(28)), s(2)), s(2));
        assert_eq!(likely_free_in(None, None, s(30)), s(5));
        assert_eq!(likely_free_in(None, None, Duration::ZERO), ms(100));
        // A lease seen running out while the request waited was renewed: not 0.
        assert_eq!(likely_free_in(None, Some(Duration::ZERO), s(10)), s(5));
        assert_eq!(likely_free_in(Some(ms(1)), Some(Duration::ZERO), ms(0)), ms(10));
        // A lease left shorter than the wait may have been renewed during it: the wait stands.
        assert_eq!(likely_free_in(None, Some(ms(500)), s(2)), s(2));
        // A lease about to end when nothing was waited for caps the guess.
        assert_eq!(likely_free_in(None, Some(ms(20)), Duration::ZERO), ms(20));
    }

    /// Recorded holds average per family, and a new family past the cap is not kept.
    #[test]
    fn records_per_family() {
        let stats = HoldStats::default();
        let seven = LockKey::new("p:", b"account:7", 512).unwrap();
        let nine = LockKey::new("p:", b"account:9", 512).unwrap();
        let order = LockKey::new("p:", b"order:1", 512).unwrap();
        assert_eq!(stats.typical(&seven), None);
        stats.record(&seven, Duration::from_millis(800));
        assert_eq!(stats.typical(&nine), Some(Duration::from_millis(800)));
        assert_eq!(stats.typical(&order), None);
        stats.record(&nine, Duration::from_millis(0));
        assert_eq!(stats.typical(&seven), Some(Duration::from_millis(700)));
        stats.families.store(MAX_FAMILIES, Relaxed);
        stats.record(&order, Duration::from_millis(5));
        assert_eq!(stats.typical(&order), None);
    }
}
