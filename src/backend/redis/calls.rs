//! One typed call per script: the only place each script's `KEYS` and `ARGV` are put in order,
//! next to the comment at the top of its Lua file that says what each position means. The
//! round trip of every call against a real server is tested in `tests.rs`.

use std::io::Write as _;

use redis::{RedisWrite, ToRedisArgs};

use super::{
    CHANNEL, FENCE, QUEUE, READERS, TIMEOUTS, VOID, WRITERS,
    scripts::{Call, Lua, Scripts},
};
use crate::{
    backend::{Grant, LockKind, Release, Renew},
    holder::Decimal,
    lease::Lease,
    lock_key::LockKey,
};

/// A name derived from a lock's (its fencing record, its queue, its channel, …), written
/// straight into the command rather than built as a `String` first.
struct Derived<'a>(&'a LockKey, &'static str);

impl ToRedisArgs for Derived<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut arg = out.writer_for_next_arg();
        // Writing into a command's buffer cannot fail.
        let _ = arg.write_all(self.0.as_str().as_bytes());
        let _ = arg.write_all(self.1.as_bytes());
    }
}

/// The "time to remember a given-up attempt" of a read-write or semaphore release, which names
/// the hold's grant (it undoes nothing): an attempt that does not match is not remembered.
const RELEASE_NAMES_GRANT: u64 = 0;

/// The script argument of a flag.
fn flag(on: bool) -> &'static str {
    if on { "1" } else { "0" }
}

/// The side argument of the read-write scripts.
fn side(kind: LockKind) -> &'static str {
    if kind == LockKind::Write { "w" } else { "r" }
}

/// The milliseconds a waiter keeps its place in a queue (`0` without a queue).
fn queue_millis(grant: &Grant<'_>) -> u64 {
    grant
        .queue
        .map_or(0, |timeout| Lease::fixed(timeout).millis())
}

/// The value of a single hold (see `lua/acquire.lua`): the holder, prefixed by its length so
/// that no holder's name can pass for another's, then the attempt, then a newline and the
/// client lease the hold lives on, if any; written straight into the command. With an empty
/// attempt and no lease, how any single hold of the holder starts.
pub(super) struct SingleHold<'a> {
    pub(super) holder: &'a str,
    pub(super) attempt: &'a str,
    pub(super) lease: Option<&'a str>,
}

impl<'a> SingleHold<'a> {
    /// How every single hold of `holder` starts: the owner prefix the scripts match.
    pub(super) fn owner(holder: &'a str) -> Self {
        Self {
            holder,
            attempt: "",
            lease: None,
        }
    }

    /// The hold `renew` names: its holder's owner prefix and the attempt that granted it, if
    /// named (how the renewal scripts take it).
    fn renewed(renew: &Renew<'a>) -> Self {
        Self {
            attempt: renew.attempt.unwrap_or(""),
            ..Self::owner(renew.holder)
        }
    }
}

impl ToRedisArgs for SingleHold<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut arg = out.writer_for_next_arg();
        // Writing into a command's buffer cannot fail.
        let _ = arg.write_all(Decimal::new(self.holder.len() as u64).as_bytes());
        let _ = arg.write_all(b":");
        let _ = arg.write_all(self.holder.as_bytes());
        let _ = arg.write_all(self.attempt.as_bytes());
        if let Some(lease) = self.lease {
            let _ = arg.write_all(b"\n");
            let _ = arg.write_all(lease.as_bytes());
        }
    }
}

/// The acquire scripts' last argument: the latest server time (ms) at which the request may
/// act, or `''` for no bound.
#[derive(Clone, Copy)]
struct NotAfter(Option<u64>);

impl ToRedisArgs for NotAfter {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        match self.0 {
            Some(ms) => ms.write_redis_args(out),
            None => out.write_arg(b""),
        }
    }
}

/// `lua/acquire.lua`, `lua/fair_acquire.lua`, `lua/rw_acquire.lua` or `lua/sem_acquire.lua`,
/// by the grant's kind;
/// `marker` is the server's boot check (see `quarantine::boot_check`), or `''`; `lease` the
/// client lease an exclusive hold is to live on, by name and length in milliseconds (the
/// grant's lease is then how long the lock's key lives); `not_after` the latest server time
/// (ms) at which the request may still act (see [`ServerClock::expiry`]), when known.
///
/// [`ServerClock::expiry`]: super::server_clock::ServerClock::expiry
pub(super) fn acquire(
    scripts: &'static Scripts,
    grant: &Grant<'_>,
    marker: &str,
    lease: Option<(&str, u64)>,
    not_after: Option<u64>,
) -> Call {
    let key = grant.key;
    let supersedes = grant.supersedes.unwrap_or("");
    let not_after = NotAfter(not_after);
    match grant.kind {
        LockKind::Fair => {
            let mut call = scripts.fair_acquire.prepare_invoke(5);
            call.key(key.as_str())
                .key(Derived(key, QUEUE))
                .key(Derived(key, TIMEOUTS))
                .key(Derived(key, FENCE))
                .key(Derived(key, VOID))
                .arg(grant.holder)
                .arg(grant.lease.millis())
                .arg(grant.attempt)
                .arg(flag(grant.fencing))
                .arg(queue_millis(grant))
                .arg(supersedes)
                .arg(grant.reentry.as_arg())
                .arg(marker)
                .arg(not_after);
            call
        }
        LockKind::Read | LockKind::Write => {
            let mut call = scripts.rw_acquire.prepare_invoke(5);
            call.key(key.as_str())
                .key(Derived(key, READERS))
                .key(Derived(key, WRITERS))
                .key(Derived(key, FENCE))
                .key(Derived(key, VOID))
                .arg(grant.holder)
                .arg(side(grant.kind))
                .arg(grant.lease.millis())
                .arg(grant.attempt)
                .arg(flag(grant.fencing))
                .arg(queue_millis(grant))
                .arg(supersedes)
                .arg(grant.reentry.as_arg())
                .arg(marker)
                .arg(not_after);
            call
        }
        LockKind::Semaphore => {
            let mut call = scripts.sem_acquire.prepare_invoke(3);
            call.key(key.as_str())
                .key(Derived(key, READERS))
                .key(Derived(key, VOID))
                .arg(grant.holder)
                .arg(grant.lease.millis())
                .arg(grant.attempt)
                .arg(grant.permits)
                .arg(supersedes)
                .arg(grant.reentry.as_arg())
                .arg(marker)
                .arg(not_after);
            call
        }
        _ => {
            let mut call = scripts
                .acquire
                .prepare_invoke(3 + usize::from(lease.is_some()));
            call.key(key.as_str())
                .key(Derived(key, FENCE))
                .key(Derived(key, VOID));
            if let Some((name, _)) = lease {
                call.key(name);
            }
            call.arg(grant.holder)
                .arg(grant.lease.millis())
                .arg(grant.attempt)
                .arg(flag(grant.fencing))
                .arg(supersedes)
                .arg(grant.reentry.as_arg())
                .arg(marker);
            match lease {
                Some((_, millis)) => call.arg(millis),
                None => call.arg(""),
            };
            call.arg(not_after);
            call
        }
    }
}

/// `lua/release.lua`, `lua/fair_release.lua`, `lua/rw_release.lua` or `lua/sem_release.lua`,
/// by the release's kind;
/// `handoff` is the grant to a waiter made in the same step (exclusive locks only).
pub(super) fn release(
    scripts: &'static Scripts,
    release: &Release<'_>,
    handoff: Option<&Grant<'_>>,
) -> Call {
    let key = release.key;
    let attempt = release.attempt.unwrap_or("");
    match release.kind {
        LockKind::Fair => {
            let mut call = scripts.fair_release.prepare_invoke(3);
            call.key(key.as_str())
                .key(Derived(key, QUEUE))
                .key(Derived(key, TIMEOUTS))
                .arg(release.holder)
                .arg(Derived(key, CHANNEL))
                .arg(flag(release.all))
                .arg(attempt);
            call
        }
        LockKind::Read | LockKind::Write => rw_release(
            scripts,
            key,
            (release.holder, release.kind),
            release.all,
            (attempt, RELEASE_NAMES_GRANT),
            release.hold.unwrap_or(""),
        ),
        LockKind::Semaphore => sem_release(
            scripts,
            key,
            (release.holder, release.all),
            (attempt, RELEASE_NAMES_GRANT),
            release.hold.unwrap_or(""),
        ),
        // One hold, no hand-off: the common call, in the compact form (the attempt, if any,
        // written after the holder, as in a single hold).
        _ if handoff.is_none() && !release.all => {
            let mut call = scripts.release.prepare_invoke(1);
            call.key(key.as_str()).arg(SingleHold {
                holder: release.holder,
                attempt,
                lease: None,
            });
            call
        }
        // Without a hand-off the script needs the lock's key alone.
        _ => {
            let mut call = scripts
                .release
                .prepare_invoke(if handoff.is_some() { 3 } else { 1 });
            call.key(key.as_str());
            if handoff.is_some() {
                call.key(Derived(key, FENCE)).key(Derived(key, VOID));
            }
            call.arg(release.holder)
                .arg(Derived(key, CHANNEL))
                .arg(flag(release.all))
                .arg(attempt)
                .arg(SingleHold::owner(release.holder));
            if let Some(next) = handoff {
                call.arg(next.holder)
                    .arg(next.lease.millis())
                    .arg(next.attempt)
                    .arg(flag(next.fencing));
            }
            call
        }
    }
}

/// `lua/rw_release.lua`: gives back the hold of `holder` on its side, for one attempt when
/// `attempt` is not `''`: an undo, where a non-matching attempt is remembered as given up for
/// `void_ms`, or with `void_ms` 0 a release of the hold that attempt granted. The lease of
/// the hold `hold` took goes with it (`''`: the one that ends first).
fn rw_release(
    scripts: &'static Scripts,
    key: &LockKey,
    (holder, kind): (&str, LockKind),
    all: bool,
    (attempt, void_ms): (&str, u64),
    hold: &str,
) -> Call {
    let mut call = scripts.rw_release.prepare_invoke(3);
    call.key(key.as_str())
        .key(Derived(key, READERS))
        .key(Derived(key, VOID))
        .arg(holder)
        .arg(side(kind))
        .arg(Derived(key, CHANNEL))
        .arg(flag(all))
        .arg(attempt)
        .arg(void_ms)
        .arg(hold);
    call
}

/// `lua/sem_release.lua`: gives back `holder`'s permit (every hold of it with `all`), for one
/// attempt when `attempt` is not `''`: an undo, where a non-matching attempt is remembered as
/// given up for `void_ms`, or with `void_ms` 0 a release of the permit that attempt granted.
/// The lease of the hold `hold` took goes with it (`''`: the one that ends first).
fn sem_release(
    scripts: &'static Scripts,
    key: &LockKey,
    (holder, all): (&str, bool),
    (attempt, void_ms): (&str, u64),
    hold: &str,
) -> Call {
    let mut call = scripts.sem_release.prepare_invoke(3);
    call.key(key.as_str())
        .key(Derived(key, READERS))
        .key(Derived(key, VOID))
        .arg(holder)
        .arg(Derived(key, CHANNEL))
        .arg(flag(all))
        .arg(attempt)
        .arg(void_ms)
        .arg(hold);
    call
}

/// `lua/abandon.lua` (or, for a read-write lock or a semaphore, its release script for that
/// attempt only): undoes the grant's attempt if it took the lock, else records it as given up,
/// for its lease and, with `pxat`, at least until then (server ms: when the attempt's single
/// hold, should its `SET` still arrive, would end).
/// A fair lock's undo names its queue, whose head it wakes.
pub(super) fn abandon(scripts: &'static Scripts, grant: &Grant<'_>, pxat: Option<u64>) -> Call {
    let key = grant.key;
    match grant.kind {
        LockKind::Read | LockKind::Write => rw_release(
            scripts,
            key,
            (grant.holder, grant.kind),
            false,
            (grant.attempt, grant.lease.millis()),
            grant.attempt,
        ),
        LockKind::Semaphore => sem_release(
            scripts,
            key,
            (grant.holder, false),
            (grant.attempt, grant.lease.millis()),
            grant.attempt,
        ),
        kind => {
            let fair = kind == LockKind::Fair;
            let mut call = scripts.abandon.prepare_invoke(if fair { 4 } else { 2 });
            call.key(key.as_str()).key(Derived(key, VOID));
            if fair {
                call.key(Derived(key, QUEUE)).key(Derived(key, TIMEOUTS));
            }
            call.arg(grant.holder)
                .arg(grant.attempt)
                .arg(Derived(key, CHANNEL))
                .arg(grant.lease.millis());
            match pxat {
                Some(pxat) => call.arg(pxat),
                None => call.arg(""),
            };
            call
        }
    }
}

/// `lua/fair_wait.lua` or `lua/rw_wait.lua` with a timeout of 0: gives up `holder`'s place in
/// the queue of a fair lock or of a read-write lock's writers. `None` for kinds without one.
pub(super) fn leave(
    scripts: &'static Scripts,
    key: &LockKey,
    holder: &str,
    kind: LockKind,
) -> Option<Call> {
    match kind {
        LockKind::Fair => {
            let mut call = scripts.fair_wait.prepare_invoke(3);
            call.key(key.as_str())
                .key(Derived(key, QUEUE))
                .key(Derived(key, TIMEOUTS))
                .arg(holder)
                .arg(0)
                .arg(Derived(key, CHANNEL));
            Some(call)
        }
        LockKind::Write => {
            let mut call = scripts.rw_wait.prepare_invoke(1);
            call.key(Derived(key, WRITERS))
                .arg(holder)
                .arg(0)
                .arg(Derived(key, CHANNEL));
            Some(call)
        }
        _ => None,
    }
}

/// Whether `renew` goes into a [`renew_many`] call: a held plain or fair lock.
pub(super) fn renews_with_many(renew: &Renew<'_>) -> bool {
    !renew.queued && matches!(renew.kind, LockKind::Exclusive | LockKind::Fair)
}

/// `lua/renew_many.lua`: renews the holds of `renewals` (plain and fair locks) in one call.
pub(super) fn renew_many<'a>(
    scripts: &'static Scripts,
    renewals: impl Clone + ExactSizeIterator<Item = &'a Renew<'a>>,
) -> Call {
    let mut call = scripts.renew_many.prepare_invoke(renewals.len());
    for renew in renewals.clone() {
        call.key(renew.key.as_str());
    }
    for renew in renewals {
        call.arg(SingleHold::renewed(renew))
            .arg(renew.lease.millis());
    }
    call
}

/// The call that renews one hold, or keeps one waiter's place: `lua/fair_wait.lua`,
/// `lua/rw_wait.lua`, `lua/rw_renew.lua` (also a semaphore's permit, laid out as a reader) or
/// `lua/renew.lua`.
pub(super) fn renew(scripts: &'static Scripts, renew: &Renew<'_>) -> Call {
    let key = renew.key;
    let millis = renew.lease.millis();
    match (renew.kind, renew.queued) {
        (LockKind::Fair, true) => {
            let mut call = scripts.fair_wait.prepare_invoke(3);
            call.key(key.as_str())
                .key(Derived(key, QUEUE))
                .key(Derived(key, TIMEOUTS))
                .arg(renew.holder)
                .arg(millis)
                .arg(Derived(key, CHANNEL));
            call
        }
        (LockKind::Write, true) => {
            let mut call = scripts.rw_wait.prepare_invoke(1);
            call.key(Derived(key, WRITERS))
                .arg(renew.holder)
                .arg(millis)
                .arg(Derived(key, CHANNEL));
            call
        }
        (LockKind::Read | LockKind::Write | LockKind::Semaphore, _) => {
            let mut call = scripts.rw_renew.prepare_invoke(2);
            call.key(key.as_str())
                .key(Derived(key, READERS))
                .arg(renew.holder)
                .arg(side(renew.kind))
                .arg(millis)
                .arg(renew.attempt.unwrap_or(""));
            call
        }
        _ => {
            let mut call = scripts.renew.prepare_invoke(1);
            call.key(key.as_str())
                .arg(SingleHold::renewed(renew))
                .arg(millis);
            call
        }
    }
}

/// A call of `lua` reading the lock `key` through `lua/snapshot.lua`: the keys it reads and
/// the layout argument, by `kind`.
fn snapshot(lua: &'static Lua, key: &LockKey, kind: LockKind) -> Call {
    let keys = match kind {
        LockKind::Read | LockKind::Write => 3,
        LockKind::Semaphore => 2,
        _ => 4,
    };
    let mut call = lua.prepare_invoke(keys);
    call.key(key.as_str());
    match kind {
        LockKind::Read | LockKind::Write => {
            call.key(Derived(key, READERS))
                .key(Derived(key, WRITERS))
                .arg("rw");
        }
        LockKind::Semaphore => {
            call.key(Derived(key, READERS)).arg("sem");
        }
        _ => {
            call.key(Derived(key, QUEUE))
                .key(Derived(key, TIMEOUTS))
                .key(Derived(key, VOID))
                .arg("x");
        }
    }
    call
}

/// `lua/inspect.lua`: what the lock `key` of `kind`'s layout holds.
pub(super) fn inspect(scripts: &'static Scripts, key: &LockKey, kind: LockKind) -> Call {
    snapshot(&scripts.inspect, key, kind)
}

/// `lua/force_unlock.lua`: frees the lock `key` of `kind`'s layout whoever holds it.
pub(super) fn force_unlock(scripts: &'static Scripts, key: &LockKey, kind: LockKind) -> Call {
    let mut call = snapshot(&scripts.force_unlock, key, kind);
    call.arg(Derived(key, CHANNEL));
    call
}
