//! One typed call per script: the only place each script's `KEYS` and `ARGV` are put in order,
//! next to the header of its Lua file that says what each position means. Every call's round
//! trip against a real server is tested in `tests.rs`.

use std::io::Write as _;

use redis::{RedisWrite, ToRedisArgs};

use super::scripts::{Call, Lua, Scripts};
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

/// One argument written from parts straight into the command, with no `String` made first.
struct Cat<'a, const N: usize>([&'a [u8]; N]);

impl<const N: usize> ToRedisArgs for Cat<'_, N> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut arg = out.writer_for_next_arg();
        for part in self.0 {
            // Writing into a command's buffer cannot fail.
            let _ = arg.write_all(part);
        }
    }
}

/// `K` followed by `suffix` (`""`: `K` itself).
fn derived<'a>(key: &'a LockKey, suffix: &'a str) -> Cat<'a, 2> {
    Cat([key.as_str().as_bytes(), suffix.as_bytes()])
}

/// A number, or `''` for none.
struct Or(Option<u64>);

impl ToRedisArgs for Or {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        out.write_arg(self.0.map(Decimal::new).as_ref().map_or(&[], Decimal::as_bytes));
    }
}

/// The suffix of the key that holds a grant of `kind`: `K:readers` for a reader, `K` for the
/// others (an owner record, or a semaphore's permits).
fn record(kind: LockKind) -> &'static str {
    if kind == LockKind::Read { READERS } else { "" }
}

/// A call of `lua` whose `KEYS` are `K` with each of `suffixes`, then, with `marker`, the run
/// marker of the locks named like `K`: `<prefix>{}:run`, never a lock's key (its hash tag is
/// never empty).
fn call(lua: &'static Lua, key: &LockKey, suffixes: &[&str], marker: bool) -> Call {
    let mut call = lua.call(suffixes.len() + usize::from(marker));
    for suffix in suffixes {
        call.key(derived(key, suffix));
    }
    if marker {
        let name = key.as_str();
        let prefix = &name.as_bytes()[..name.find('{').unwrap_or(name.len())];
        call.key(Cat([prefix, b"{}:run"]));
    }
    call
}

/// `lua/acquire.lua` (plain, fair, write) or `lua/share.lua` (read, permit) for `grant`, which
/// may act until `not_after` (server ms), with the quarantine `check` (see `quarantined` in
/// `lua/prelude.lua`). With `extend`, extends the grant `grant.attempt` instead.
pub(super) fn acquire(
    scripts: &'static Scripts,
    grant: &Grant<'_>,
    extend: bool,
    not_after: Option<u64>,
    check: Option<&str>,
) -> Call {
    let (key, kind) = (grant.key, grant.kind);
    let extending = if extend { grant.attempt } else { "" };
    if kind.owns() {
        let (suffixes, letter): (&[&str], _) = match kind {
            _ if extend => (&["", FENCE, VOID], "x"),
            LockKind::Fair => (&["", FENCE, VOID, QUEUE, TIMEOUTS], "f"),
            LockKind::Write => (&["", FENCE, VOID, QUEUE, TIMEOUTS, READERS], "w"),
            _ => (&["", FENCE, VOID], "x"),
        };
        let mut call = call(&scripts.acquire, key, suffixes, check.is_some());
        call.arg(grant.attempt)
            .arg(grant.lease.millis())
            .arg(u8::from(grant.fencing))
            .arg(Or(not_after))
            .arg(check.unwrap_or(""))
            .arg(extending)
            .arg(letter);
        if suffixes.len() > 3 {
            let queue = grant.queue.map_or(0, |wait| Lease::fixed(wait).millis());
            call.arg(grant.holder).arg(queue);
        }
        return call;
    }
    let suffixes: &[&str] = match kind {
        LockKind::Read if !extend => &[READERS, VOID, "", QUEUE, TIMEOUTS],
        _ => &[record(kind), VOID],
    };
    let mut call = call(&scripts.share, key, suffixes, check.is_some());
    call.arg(grant.attempt)
        .arg(grant.lease.millis())
        .arg(Or(not_after))
        .arg(check.unwrap_or(""))
        .arg(extending);
    if suffixes.len() > 2 {
        call.arg("").arg(grant.holder).arg(grant.within.unwrap_or(""));
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
    let (key, kind) = (release.key, release.kind);
    if !kind.owns() {
        return unshare(scripts, key, kind, release.grant, None);
    }
    // The whole record when the token is known: the common case compares it as it is.
    let token = release.token.map(Decimal::new);
    let record = match &token {
        Some(token) => Cat([release.grant.as_bytes(), b"~", token.as_bytes()]),
        None => Cat([release.grant.as_bytes(), b"", b""]),
    };
    let lua = &scripts.release;
    match (handoff, kind) {
        (Some(next), _) => {
            let mut call = call(lua, key, &["", VOID, FENCE], false);
            call.arg(record)
                .arg("h")
                .arg(next.attempt)
                .arg(next.lease.millis())
                .arg(u8::from(next.fencing));
            call
        }
        // The queue's head is woken by name.
        (None, LockKind::Fair) => {
            let mut call = call(lua, key, &["", VOID, FENCE, QUEUE, TIMEOUTS], false);
            call.arg(record).arg("r");
            call
        }
        (None, _) => {
            let mut call = call(lua, key, &[""], false);
            call.arg(record);
            call
        }
    }
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
    let mut call = call(&scripts.unshare, key, &[record(kind), VOID], false);
    call.arg(grant).arg(derived(key, CHANNEL)).arg(Or(undo_ms));
    call
}

/// The undo of `grant.attempt` (`release.lua` mode `u`, or `unshare.lua`): deletes its record
/// if it won one, and otherwise remembers it as given up on for its lease.
pub(super) fn abandon(scripts: &'static Scripts, grant: &Grant<'_>) -> Call {
    let (key, kind, ms) = (grant.key, grant.kind, grant.lease.millis());
    if !kind.owns() {
        return unshare(scripts, key, kind, grant.attempt, Some(ms));
    }
    let suffixes: &[&str] = match kind {
        // A fair undo that frees the lock wakes the queue's head by name.
        LockKind::Fair => &["", VOID, FENCE, QUEUE, TIMEOUTS],
        _ => &["", VOID],
    };
    let mut call = call(&scripts.release, key, suffixes, false);
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
            Renew::Grant { key, kind, grant, lease } => Some((i, key, kind, grant, lease)),
            Renew::Place { .. } => None,
        })
        .collect();
    let mut calls: Vec<_> = (grants.chunks(chunk))
        .map(|chunk| {
            let mut call = scripts.renew.call(chunk.len());
            for &(_, key, kind, ..) in chunk {
                call.key(derived(key, record(kind)));
            }
            for &(_, _, kind, grant, lease) in chunk {
                let side = if kind.owns() { b"o" } else { b"s" };
                call.arg(Cat([side, grant.as_bytes()])).arg(lease.millis());
            }
            (chunk.iter().map(|&(i, ..)| i).collect(), call)
        })
        .collect();
    for (i, renew) in renewals.iter().enumerate() {
        if let Renew::Place { key, kind, holder, timeout } = *renew {
            let ms = Lease::fixed(timeout).millis();
            calls.push((vec![i], wait(scripts, key, kind, holder, ms)));
        }
    }
    calls
}

/// `lua/wait.lua`: keeps `holder`'s place in the queue of `key` for `ms`, or with `0` takes it
/// out.
pub(super) fn wait(
    scripts: &'static Scripts,
    key: &LockKey,
    kind: LockKind,
    holder: &str,
    ms: u64,
) -> Call {
    let suffixes: &[&str] = match kind {
        LockKind::Write => &[QUEUE, TIMEOUTS, "", READERS],
        _ => &[QUEUE, TIMEOUTS, ""],
    };
    let mut call = call(&scripts.wait, key, suffixes, false);
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
    let (layout, suffixes): (_, &[&str]) = match kind {
        LockKind::Semaphore => ("s", &[""]),
        LockKind::Read | LockKind::Write => ("rw", &["", READERS, QUEUE, TIMEOUTS]),
        _ => ("x", &["", QUEUE, TIMEOUTS]),
    };
    let mut call = call(&scripts.inspect, key, suffixes, false);
    call.arg(layout);
    match clear {
        true => call.arg(derived(key, CHANNEL)),
        false => call.arg(""),
    };
    call
}
