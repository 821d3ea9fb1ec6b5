//! Checkers run over a finished scenario: the overlap sweep over a history, token order, and
//! the leak check once everything is quiet.

use std::{collections::HashMap, time::Duration};

use tower_lock::{LockClient, RedisBackend};

use crate::{
    clock,
    history::{Outcome, Section},
    run::Node,
    support::RespValue,
};

/// What the sweep found.
#[derive(Clone, Debug, Default)]
pub(crate) struct Sweep {
    /// Sections that got the lock.
    pub(crate) held: usize,
    /// Overlapping believed holds of different holders, not explained by fencing.
    pub(crate) violations: usize,
    /// Overlaps where the earlier holder had lost the lock and held an older token: a paused
    /// holder that fencing must stop.
    pub(crate) fenced_overlaps: usize,
    /// Tokens that did not rise strictly from one holder to the next.
    pub(crate) token_errors: usize,
    /// The first few problems, for the failure message.
    pub(crate) examples: Vec<String>,
}

impl Sweep {
    fn note(&mut self, what: String) {
        if self.examples.len() < 5 {
            self.examples.push(what);
        }
    }
}

/// Sweeps each key's believed-hold intervals `[t_ok, min(t_rel_inv, t_lost)]` in start order;
/// re-entries of one holder merge, and any other start inside the furthest-reaching interval
/// so far is an overlap.
pub(crate) fn sweep(sections: &[Section]) -> Sweep {
    let mut result = Sweep::default();
    let mut by_key: HashMap<&str, Vec<&Section>> = HashMap::new();
    for section in sections.iter().filter(|s| s.t_ok.is_some()) {
        by_key.entry(&section.key).or_default().push(section);
    }
    for (key, mut held) in by_key {
        result.held += held.len();
        held.sort_by_key(|s| s.t_ok);
        let mut furthest: Option<&Section> = None;
        for &section in &held {
            let start = section.t_ok.expect("filtered");
            if let Some(earlier) = furthest
                && start < earlier.believed_until()
                && earlier.holder != section.holder
            {
                let fenced = earlier.t_lost.is_some()
                    && matches!((earlier.token, section.token), (Some(a), Some(b)) if a < b);
                if fenced {
                    result.fenced_overlaps += 1;
                } else {
                    result.violations += 1;
                    result.note(format!("{key}: {earlier:?} overlaps {section:?}"));
                }
            }
            if furthest.is_none_or(|f| section.believed_until() > f.believed_until()) {
                furthest = Some(section);
            }
        }
        check_tokens(key, &held, &mut result);
    }
    result
}

/// The most holders believed inside a key's permits at once (for a semaphore; 1 for a lock).
#[derive(Clone, Debug, Default)]
pub(crate) struct Crowd {
    /// Holds that got a permit.
    pub(crate) held: usize,
    /// The most distinct holders believed inside one key at any instant.
    pub(crate) max: usize,
    /// Entries that took a key past its permits.
    pub(crate) excess: usize,
    /// The first few of those, for the failure message.
    pub(crate) examples: Vec<String>,
}

/// One holder's believed hold: `[start, end)` on the history's clock.
#[derive(Clone, Copy, Debug)]
struct Hold<'a> {
    holder: &'a str,
    pid: u32,
    start: u64,
    end: u64,
}

/// Each key's believed holds `[t_ok, believed_until)`, start and end events in time order (an
/// end before a start at the same instant). A section recorded more than once (a permit
/// section: when granted, when its release is called, at its end) counts by its latest record.
fn hold_events(sections: &[Section]) -> HashMap<&str, Vec<(u64, bool, Hold<'_>)>> {
    let progress = |s: &Section| (s.t_rel_ok.is_some(), !s.is_open());
    let mut latest: HashMap<(&str, &str), &Section> = HashMap::new();
    for section in sections.iter().filter(|s| s.t_ok.is_some()) {
        let key = (section.key.as_str(), section.holder.as_str());
        let slot = latest.entry(key).or_insert(section);
        if progress(section) >= progress(slot) {
            *slot = section;
        }
    }
    let mut events: HashMap<&str, Vec<(u64, bool, Hold<'_>)>> = HashMap::new();
    for section in latest.into_values() {
        let hold = Hold {
            holder: &section.holder,
            pid: section.pid,
            start: section.t_ok.expect("filtered"),
            end: section.believed_until(),
        };
        if hold.end > hold.start {
            let key = events.entry(&section.key).or_default();
            key.push((hold.start, true, hold));
            key.push((hold.end, false, hold));
        }
    }
    for key in events.values_mut() {
        key.sort_by_key(|&(at, starts, _)| (at, starts));
    }
    events
}

/// Sweeps each key's believed holds and counts the distinct holders inside at every instant:
/// the most at once, and each entry that made them more than `permits`.
pub(crate) fn max_holders(sections: &[Section], permits: usize) -> Crowd {
    let mut crowd = Crowd::default();
    for (key, events) in hold_events(sections) {
        let mut inside: HashMap<&str, (u32, usize)> = HashMap::new();
        for (at, starts, hold) in events {
            if starts {
                crowd.held += 1;
                inside.entry(hold.holder).or_insert((hold.pid, 0)).1 += 1;
                crowd.max = crowd.max.max(inside.len());
                if inside.len() > permits {
                    crowd.excess += 1;
                    if crowd.examples.len() < 5 {
                        let mut who: Vec<_> =
                            inside.iter().map(|(h, (pid, _))| format!("{h}@{pid}")).collect();
                        who.sort_unstable();
                        crowd.examples.push(format!(
                            "{key}: {} holders of {permits} permits at {at}: {}",
                            inside.len(),
                            who.join(", ")
                        ));
                    }
                }
            } else if let Some((_, n)) = inside.get_mut(hold.holder) {
                *n -= 1;
                if *n == 0 {
                    inside.remove(hold.holder);
                }
            }
        }
    }
    crowd
}

/// The first instant at or after `after` when the holders of processes other than `excluded`
/// fill all `permits` of `key`; `None` when they never do.
pub(crate) fn first_full(
    sections: &[Section],
    key: &str,
    permits: usize,
    after: u64,
    excluded: &[u32],
) -> Option<u64> {
    let events = hold_events(sections).remove(key)?;
    let mut inside: HashMap<&str, usize> = HashMap::new();
    for (at, starts, hold) in events {
        if excluded.contains(&hold.pid) {
            continue;
        }
        if at >= after && inside.len() >= permits {
            return Some(after);
        }
        if starts {
            *inside.entry(hold.holder).or_default() += 1;
            if at >= after && inside.len() >= permits {
                return Some(at);
            }
        } else if let Some(n) = inside.get_mut(hold.holder) {
            *n -= 1;
            if *n == 0 {
                inside.remove(hold.holder);
            }
        }
    }
    None
}

/// Release-to-acquire gaps on `key`, where the next holder was already waiting.
pub(crate) fn handoffs(sections: &[Section], key: &str) -> Vec<Duration> {
    let mut held: Vec<&Section> = sections
        .iter()
        .filter(|s| s.key == key && s.t_ok.is_some() && s.t_rel_ok.is_some())
        .collect();
    held.sort_by_key(|s| s.t_ok);
    held.windows(2)
        .filter(|pair| pair[1].t_inv < pair[0].believed_until())
        .map(|pair| clock::between(pair[0].believed_until(), pair[1].t_ok.expect("held")))
        .collect()
}

/// Tokens, in grant order, rise strictly whenever the holder changes.
fn check_tokens(key: &str, held: &[&Section], result: &mut Sweep) {
    let tokened: Vec<_> = held.iter().filter(|s| s.token.is_some()).collect();
    for pair in tokened.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if a.holder != b.holder && b.token <= a.token {
            result.token_errors += 1;
            result.note(format!(
                "{key}: token {:?} of {} after {:?} of {}",
                b.token, b.holder, a.token, a.holder
            ));
        }
    }
}

/// Sections that completed normally.
pub(crate) fn completed(sections: &[Section]) -> usize {
    sections.iter().filter(|s| s.result == Outcome::Ok).count()
}

/// State left in Redis under `prefix` once everything is quiet.
#[derive(Clone, Debug, Default)]
pub(crate) struct Leaks {
    /// Keys other than the fencing counters (which never expire, by design).
    pub(crate) keys: Vec<String>,
    /// Release channels still subscribed.
    pub(crate) channels: Vec<String>,
}

impl Leaks {
    pub(crate) fn count(&self) -> usize {
        self.keys.len() + self.channels.len()
    }

    /// These leaks less the records of attempts given up on (`…:void`) that expire on their
    /// own within `lease` (an undo records its attempt whether or not it held the lock, and the
    /// record lives the lease of the last attempt added), and how many those were. A `:void`
    /// key without a TTL, or with a longer one, stays a leak.
    pub(crate) fn less_bounded_voids(self, node: &Node, lease: Duration) -> (Self, usize) {
        let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
        let (voids, keys): (Vec<String>, Vec<String>) = self.keys.into_iter().partition(|key| {
            key.ends_with(":void") && {
                let ttl = node.cmd(&["PTTL", key]).as_int();
                ttl > 0 && ttl <= lease_ms
            }
        });
        let leaks = Self { keys, channels: self.channels };
        (leaks, voids.len())
    }
}

/// `SCAN 0 MATCH <prefix>*` and `PUBSUB CHANNELS <prefix>*` on `node`. Every kind's keys and
/// channels start with the prefix: a semaphore's `:sem`, `:sem:void` and `:sem:released` as
/// much as a lock's.
pub(crate) fn server_leaks(node: &Node, prefix: &str) -> Leaks {
    let pattern = format!("{prefix}*");
    let mut keys = Vec::new();
    let mut cursor = "0".to_owned();
    loop {
        let reply = node.cmd(&["SCAN", &cursor, "MATCH", &pattern, "COUNT", "1000"]);
        let RespValue::Array(Some(parts)) = reply else {
            panic!("unexpected SCAN reply {reply:?}");
        };
        cursor = parts[0].as_str().expect("SCAN cursor");
        if let RespValue::Array(Some(found)) = &parts[1] {
            keys.extend(found.iter().filter_map(RespValue::as_str));
        }
        if cursor == "0" {
            break;
        }
    }
    keys.retain(|key| !key.ends_with(":fence"));
    let channels = match node.cmd(&["PUBSUB", "CHANNELS", &pattern]) {
        RespValue::Array(Some(found)) => found.iter().filter_map(RespValue::as_str).collect(),
        other => panic!("unexpected PUBSUB CHANNELS reply {other:?}"),
    };
    Leaks { keys, channels }
}

/// [`server_leaks`] once no release channel under `prefix` is subscribed, waiting up to 5 s:
/// a client unsubscribes from its own task after its last waiter leaves, so a check made right
/// after the last acquire can still see the channel. Keys are not waited for: one left behind
/// counts even if it would expire.
pub(crate) async fn server_settled(node: &Node, prefix: &str) -> Leaks {
    let first = server_leaks(node, prefix);
    if first.channels.is_empty() {
        return first;
    }
    crate::scenarios::eventually(Duration::from_secs(5), || {
        server_leaks(node, prefix).channels.is_empty()
    })
    .await;
    Leaks { channels: server_leaks(node, prefix).channels, ..first }
}

/// What a client still tracks: keys, waiters, queue places and subscribed channels (all 0
/// once it is quiet).
pub(crate) fn client_leaks(client: &LockClient<RedisBackend>) -> usize {
    client.active_keys()
        + client.waiters()
        + client.queued()
        + client.backend().subscribed_channels()
}

/// Waits up to `within` for the lock store `node` to hold nothing under `prefix`; what is
/// left then.
pub(crate) async fn server_drains(node: &Node, prefix: &str, within: Duration) -> Leaks {
    crate::scenarios::eventually(within, || server_leaks(node, prefix).count() == 0).await;
    server_leaks(node, prefix)
}

/// Waits up to `within` for `client` to track nothing; whether it got there.
pub(crate) async fn client_settles(client: &LockClient<RedisBackend>, within: Duration) -> bool {
    crate::scenarios::eventually(within, || client_leaks(client) == 0).await
}

/// Fails the test, naming what `client` still tracks, unless it `settled`.
pub(crate) fn assert_settled(settled: bool, client: &LockClient<RedisBackend>) {
    assert!(settled, "the client still tracks state: {}", client_state(client));
}

/// The counts behind [`client_leaks`], for failure messages.
pub(crate) fn client_state(client: &LockClient<RedisBackend>) -> String {
    format!(
        "active_keys={} waiters={} queued={} subscribed_channels={}",
        client.active_keys(),
        client.waiters(),
        client.queued(),
        client.backend().subscribed_channels()
    )
}

/// Tasks alive on the current runtime, to compare with a baseline.
pub(crate) fn tasks() -> usize {
    tokio::runtime::Handle::current().metrics().num_alive_tasks()
}
