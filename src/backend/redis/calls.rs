//! One typed call per script: the only place each script's `KEYS` and `ARGV` are put in order,
//! next to the header of its Lua file that says what each position means. The round trip of
//! every call against a real server is tested in `tests.rs`.

use std::io::Write as _;

use redis::{RedisWrite, ToRedisArgs};

use super::scripts::{Call, Scripts};
use crate::{
    backend::{
        LockKind,
        store::{Grant, Release, Renew},
    },
    holder::Decimal,
    lease::Lease,
    lock_key::LockKey,
};

/// The last token issued for the lock.
pub(super) const FENCE: &str = ":fence";
/// The attempts given up on.
pub(super) const VOID: &str = ":void";
/// A fair lock's (or the writers') waiter queue.
pub(super) const QUEUE: &str = ":queue";
/// The waiters' places: holder -> server ms it lives until.
pub(super) const TIMEOUTS: &str = ":timeouts";
/// A read-write lock's reader grants.
pub(super) const READERS: &str = ":readers";
/// The release channel.
pub(super) const CHANNEL: &str = ":released";

/// One argument (or key) written from parts straight into the command, with no `String` made
/// first.
pub(super) struct Cat<'a, const N: usize>(pub(super) [&'a [u8]; N]);

impl<const N: usize> ToRedisArgs for Cat<'_, N> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut arg = out.writer_for_next_arg();
        for part in self.0 {
            // Writing into a command's buffer cannot fail.
            let _ = arg.write_all(part);
        }
    }
}

/// `K` followed by `suffix`.
fn derived<'a>(key: &'a LockKey, suffix: &'static str) -> Cat<'a, 2> {
    Cat([key.as_str().as_bytes(), suffix.as_bytes()])
}

/// The key of a grant of `kind`: `K:readers` for a reader, `K` for the others (the owner
/// record, or a semaphore's sorted set of permits).
fn record_key(key: &LockKey, kind: LockKind) -> Cat<'_, 2> {
    derived(key, if kind == LockKind::Read { READERS } else { "" })
}

/// A number, or `''` for none.
struct Or(Option<u64>);

impl ToRedisArgs for Or {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        match self.0 {
            Some(n) => out.write_arg(Decimal::new(n).as_bytes()),
            None => out.write_arg(b""),
        }
    }
}

fn flag(on: bool) -> &'static str {
    if on { "1" } else { "0" }
}

/// The quarantine check an acquire sends (`quarantined` in `lua/prelude.lua`): the
/// quarantine's length, the run its connection saw (`''` when not known), and the lock, whose
/// prefix names the run marker.
#[derive(Clone, Copy)]
pub(super) struct Check<'a> {
    pub(super) ms: u64,
    pub(super) run: &'a str,
}

/// The run marker of the locks named like `key`: `<prefix>{}:run`, one per prefix, never a
/// lock's key (a lock's hash tag is never empty).
pub(super) fn marker(key: &LockKey) -> Cat<'_, 2> {
    let name = key.as_str();
    Cat([
        &name.as_bytes()[..name.find('{').unwrap_or(name.len())],
        b"{}:run",
    ])
}

/// `lua/acquire.lua` (plain, fair, write) or `lua/share.lua` (read, permit) for `grant`, sent
/// on a connection whose clock says it may act until `not_after` (server ms). With `extend`,
/// extends the grant `grant.attempt` instead (no quarantine check, no queue).
pub(super) fn acquire(
    scripts: &'static Scripts,
    grant: &Grant<'_>,
    extend: bool,
    not_after: Option<u64>,
    check: Option<Check<'_>>,
) -> Call {
    let (key, kind) = (grant.key, grant.kind);
    let extending = if extend { grant.attempt } else { "" };
    let ms = check.map(|check| Decimal::new(check.ms));
    let check_arg = Cat([
        ms.as_ref().map_or(&b""[..], Decimal::as_bytes),
        if check.is_some() { b":" } else { b"" },
        check.map_or(&b""[..], |check| check.run.as_bytes()),
    ]);
    let checked = usize::from(check.is_some());
    if kind.owns() {
        let sides = match kind {
            _ if extend => 0,
            LockKind::Fair => 2,
            LockKind::Write => 3,
            _ => 0,
        };
        let mut call = scripts.acquire.call(3 + sides + checked);
        call.key(key.as_str())
            .key(derived(key, FENCE))
            .key(derived(key, VOID));
        if sides > 0 {
            call.key(derived(key, QUEUE)).key(derived(key, TIMEOUTS));
        }
        if sides > 2 {
            call.key(derived(key, READERS));
        }
        if checked > 0 {
            call.key(marker(key));
        }
        call.arg(grant.attempt)
            .arg(grant.lease.millis())
            .arg(flag(grant.fencing))
            .arg(Or(not_after))
            .arg(check_arg)
            .arg(extending)
            .arg(match kind {
                LockKind::Fair => "f",
                LockKind::Write => "w",
                _ => "x",
            });
        if sides > 0 {
            let queue = grant.queue.map_or(0, |wait| Lease::fixed(wait).millis());
            call.arg(grant.holder).arg(queue);
        }
        return call;
    }
    let read = kind == LockKind::Read && !extend;
    let mut call = scripts.share.call(2 + 3 * usize::from(read) + checked);
    call.key(record_key(key, kind)).key(derived(key, VOID));
    if read {
        call.key(key.as_str())
            .key(derived(key, QUEUE))
            .key(derived(key, TIMEOUTS));
    }
    if checked > 0 {
        call.key(marker(key));
    }
    call.arg(grant.attempt)
        .arg(grant.lease.millis())
        .arg(Or(not_after))
        .arg(check_arg)
        .arg(extending);
    if read {
        call.arg("")
            .arg(grant.holder)
            .arg(grant.within.unwrap_or(""));
    } else if !extend {
        call.arg(grant.permits);
    }
    call
}

/// `lua/release.lua` for an owner record (handing it to `handoff` when given), or
/// `lua/unshare.lua` for a shared grant.
pub(super) fn release(
    scripts: &'static Scripts,
    release: &Release<'_>,
    handoff: Option<&Grant<'_>>,
) -> Call {
    let key = release.key;
    if !release.kind.owns() {
        return unshare(scripts, key, release.kind, release.grant, None);
    }
    // The whole record when the token is known: the common case compares it as it is.
    let token = release.token.map(Decimal::new);
    let record = Cat([
        release.grant.as_bytes(),
        if token.is_some() { b"~" } else { b"" },
        token.as_ref().map_or(&b""[..], Decimal::as_bytes),
    ]);
    match (handoff, release.kind) {
        (Some(next), _) => {
            let mut call = scripts.release.call(3);
            call.key(key.as_str())
                .key(derived(key, VOID))
                .key(derived(key, FENCE))
                .arg(record)
                .arg("h")
                .arg(next.attempt)
                .arg(next.lease.millis())
                .arg(flag(next.fencing));
            call
        }
        // The queue's head is woken by name.
        (None, LockKind::Fair) => {
            let mut call = fair_release(scripts, key);
            call.arg(record).arg("r");
            call
        }
        (None, _) => {
            let mut call = scripts.release.call(1);
            call.key(key.as_str()).arg(record);
            call
        }
    }
}

fn fair_release(scripts: &'static Scripts, key: &LockKey) -> Call {
    let mut call = scripts.release.call(5);
    call.key(key.as_str())
        .key(derived(key, VOID))
        .key(derived(key, FENCE))
        .key(derived(key, QUEUE))
        .key(derived(key, TIMEOUTS));
    call
}

/// `lua/unshare.lua`: gives back the shared grant `grant`, or with `undo_ms` undoes it,
/// remembering it as given up on for that long when it holds nothing.
fn unshare(
    scripts: &'static Scripts,
    key: &LockKey,
    kind: LockKind,
    grant: &str,
    undo_ms: Option<u64>,
) -> Call {
    let mut call = scripts.unshare.call(2);
    call.key(record_key(key, kind))
        .key(derived(key, VOID))
        .arg(grant)
        .arg(derived(key, CHANNEL))
        .arg(Or(undo_ms));
    call
}

/// The undo of `grant.attempt` (`release.lua` mode `u`, or `unshare.lua`): deletes its record
/// if it won one, and otherwise remembers it as given up on for its lease.
pub(super) fn abandon(scripts: &'static Scripts, grant: &Grant<'_>) -> Call {
    let (key, kind, ms) = (grant.key, grant.kind, grant.lease.millis());
    if !kind.owns() {
        return unshare(scripts, key, kind, grant.attempt, Some(ms));
    }
    let mut call = if kind == LockKind::Fair {
        fair_release(scripts, key)
    } else {
        let mut call = scripts.release.call(2);
        call.key(key.as_str()).key(derived(key, VOID));
        call
    };
    call.arg(grant.attempt).arg("u").arg(ms);
    call
}

/// The calls that renew `renewals`: `lua/renew.lua` for up to `chunk` grants each, then
/// `lua/wait.lua` for each place; each with the indexes of the renewals it answers for.
pub(super) fn renewals(
    scripts: &'static Scripts,
    renewals: &[Renew<'_>],
    chunk: usize,
) -> Vec<(Vec<usize>, Call)> {
    let grants: Vec<_> = (renewals.iter().enumerate())
        .filter_map(|(i, renew)| match *renew {
            Renew::Grant {
                key,
                kind,
                grant,
                lease,
            } => Some((i, key, kind, grant, lease)),
            Renew::Place { .. } => None,
        })
        .collect();
    let mut calls: Vec<_> = (grants.chunks(chunk))
        .map(|chunk| {
            let mut call = scripts.renew.call(chunk.len());
            for &(_, key, kind, ..) in chunk {
                call.key(record_key(key, kind));
            }
            for &(_, _, kind, grant, lease) in chunk {
                let side = if kind.owns() { b"o" } else { b"s" };
                call.arg(Cat([side, grant.as_bytes()])).arg(lease.millis());
            }
            (chunk.iter().map(|&(i, ..)| i).collect(), call)
        })
        .collect();
    for (i, renew) in renewals.iter().enumerate() {
        if let Renew::Place {
            key,
            kind,
            holder,
            timeout,
        } = *renew
        {
            let ms = Lease::fixed(timeout).millis();
            calls.push((vec![i], wait(scripts, key, kind, holder, ms)));
        }
    }
    calls
}

/// `lua/wait.lua`: keeps `holder`'s place in the queue of `key` for `ms`, or with `0` takes
/// it out.
pub(super) fn wait(
    scripts: &'static Scripts,
    key: &LockKey,
    kind: LockKind,
    holder: &str,
    ms: u64,
) -> Call {
    let write = kind == LockKind::Write;
    let mut call = scripts.wait.call(3 + usize::from(write));
    call.key(derived(key, QUEUE))
        .key(derived(key, TIMEOUTS))
        .key(key.as_str());
    if write {
        call.key(derived(key, READERS));
    }
    call.arg(holder).arg(ms).arg(derived(key, CHANNEL));
    call
}

/// `lua/inspect.lua` on the layout of `kind`: reads the lock, or with `clear` clears it.
pub(super) fn inspect(
    scripts: &'static Scripts,
    key: &LockKey,
    kind: LockKind,
    clear: bool,
) -> Call {
    let layout = match kind {
        LockKind::Semaphore => "s",
        LockKind::Read | LockKind::Write => "rw",
        _ => "x",
    };
    let keys = match layout {
        "s" => 1,
        "rw" => 4,
        _ => 3,
    };
    let mut call = scripts.inspect.call(keys);
    call.key(key.as_str());
    if layout == "rw" {
        call.key(derived(key, READERS));
    }
    if layout != "s" {
        call.key(derived(key, QUEUE)).key(derived(key, TIMEOUTS));
    }
    call.arg(layout);
    if clear {
        call.arg(derived(key, CHANNEL));
    } else {
        call.arg("");
    }
    call
}
