//! The Lua scripts, one per file, hashed once per process, and how one call of a script is
//! sent.
//!
//! Release notifications go through a `publish` helper that comes in two variants: `PUBLISH`
//! for a single node (`SCRIPTS`) and `SPUBLISH` for Redis Cluster (`SHARDED_SCRIPTS`), so a
//! single node runs exactly the commands it always did.
//!
//! A call goes out as `EVALSHA`. When the server answers `NOSCRIPT` (after a restart or a
//! `SCRIPT FLUSH`), the same call is sent again as `EVAL` with the script's body, which runs it
//! and caches it in one step: unlike "load, then retry by hash", it cannot fail again when
//! flushes keep coming, and it works the same inside a pipeline.

use std::{borrow::Cow, sync::LazyLock};

use redis::{Arg, Cmd, Script, ToRedisArgs};

/// One script: its body and its SHA1.
pub(super) struct Lua {
    code: String,
    script: Script,
}

/// Where a script wants the shared helpers: a script whose common case needs none puts them
/// after it, so that case does not pay for defining them (a closure each, on every call).
const HELPERS_HERE: &str = "-- @helpers\n";

impl Lua {
    /// The script of `file`, with the `publish` helper of `publish` in front and the helpers of
    /// `prelude` where the file asks for them (in front, when it does not say).
    fn new(prelude: &str, publish: &str, file: &str) -> Self {
        let code = match file.split_once(HELPERS_HERE) {
            Some((common, rest)) => format!("{publish}{common}{prelude}{rest}"),
            None => format!("{publish}{prelude}{file}"),
        };
        Self {
            script: Script::new(&code),
            code,
        }
    }

    /// The SHA1 that `EVALSHA` names the script by.
    pub(super) fn hash(&self) -> &str {
        self.script.get_hash()
    }

    /// A call of this script with `keys` keys: the keys go in first, then the arguments.
    pub(super) fn prepare_invoke(&'static self, keys: usize) -> Call {
        let mut cmd = Cmd::with_capacity(keys + 16, 256);
        cmd.arg("EVALSHA").arg(self.hash()).arg(keys);
        Call {
            lua: self,
            cmd,
            keys_left: keys,
        }
    }
}

/// One call of a script, written once as the `EVALSHA` command that is sent, keys first.
pub(super) struct Call {
    lua: &'static Lua,
    cmd: Cmd,
    /// Keys still to come before the arguments.
    keys_left: usize,
}

impl Call {
    /// Appends to `KEYS`.
    pub(super) fn key(&mut self, key: impl ToRedisArgs) -> &mut Self {
        let count = key.num_of_args();
        debug_assert!(count <= self.keys_left, "more keys than the call declared");
        self.keys_left = self.keys_left.saturating_sub(count);
        self.cmd.arg(key);
        self
    }

    /// Appends to `ARGV`.
    pub(super) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        debug_assert_eq!(self.keys_left, 0, "an argument before the declared keys");
        self.cmd.arg(arg);
        self
    }

    /// The command: the `EVALSHA` as written, or the same call as `EVAL` with the script's
    /// body (after the server answered `NOSCRIPT`).
    pub(super) fn cmd(&self, by_hash: bool) -> Cow<'_, Cmd> {
        debug_assert_eq!(self.keys_left, 0, "fewer keys than the call declared");
        if by_hash {
            return Cow::Borrowed(&self.cmd);
        }
        let mut cmd = Cmd::with_capacity(self.cmd.args_iter().len(), self.lua.code.len() + 256);
        cmd.arg("EVAL").arg(self.lua.code.as_str());
        // After `EVALSHA` and the hash: the key count, the keys and the arguments.
        for item in self.cmd.args_iter().skip(2) {
            if let Arg::Simple(bytes) = item {
                cmd.arg(bytes);
            }
        }
        Cow::Owned(cmd)
    }

    /// [`cmd`](Self::cmd), owned: for a pipeline.
    pub(super) fn into_cmd(self, by_hash: bool) -> Cmd {
        if by_hash {
            debug_assert_eq!(self.keys_left, 0, "fewer keys than the call declared");
            return self.cmd;
        }
        self.cmd(false).into_owned()
    }
}

/// Every script the backend runs.
pub(super) struct Scripts {
    pub(super) acquire: Lua,
    pub(super) release: Lua,
    pub(super) renew: Lua,
    pub(super) renew_many: Lua,
    pub(super) abandon: Lua,
    pub(super) fair_acquire: Lua,
    pub(super) fair_release: Lua,
    pub(super) fair_wait: Lua,
    pub(super) rw_acquire: Lua,
    pub(super) rw_release: Lua,
    pub(super) rw_renew: Lua,
    pub(super) rw_wait: Lua,
    pub(super) sem_acquire: Lua,
    pub(super) sem_release: Lua,
    pub(super) inspect: Lua,
    pub(super) force_unlock: Lua,
}

/// Builds the script set whose release notifications go through the `publish` helper of the
/// file `$publish`; each script is sent with that helper in front of it and the shared helpers
/// of `lua/prelude.lua` where it asks for them.
macro_rules! scripts {
    ($publish:literal) => {
        Scripts {
            acquire: scripts!(@one $publish, "lua/acquire.lua"),
            release: scripts!(@one $publish, "lua/release.lua"),
            renew: scripts!(@one $publish, "lua/renew.lua"),
            renew_many: scripts!(@one $publish, "lua/renew_many.lua"),
            abandon: scripts!(@one $publish, "lua/abandon.lua"),
            fair_acquire: scripts!(@one $publish, "lua/fair_acquire.lua"),
            fair_release: scripts!(@one $publish, "lua/fair_release.lua"),
            fair_wait: scripts!(@one $publish, "lua/fair_wait.lua"),
            rw_acquire: scripts!(@one $publish, "lua/rw_acquire.lua"),
            rw_release: scripts!(@one $publish, "lua/rw_release.lua"),
            rw_renew: scripts!(@one $publish, "lua/rw_renew.lua"),
            rw_wait: scripts!(@one $publish, "lua/rw_wait.lua"),
            sem_acquire: scripts!(@one $publish, "lua/sem_acquire.lua"),
            sem_release: scripts!(@one $publish, "lua/sem_release.lua"),
            inspect: scripts!(@snapshot $publish, "lua/inspect.lua"),
            force_unlock: scripts!(@snapshot $publish, "lua/force_unlock.lua"),
        }
    };
    // A script that reads a lock through `lua/snapshot.lua`, sent in front of it.
    (@snapshot $publish:literal, $file:literal) => {
        Lua::new(
            include_str!("lua/prelude.lua"),
            include_str!($publish),
            concat!(include_str!("lua/snapshot.lua"), include_str!($file)),
        )
    };
    (@one $publish:literal, $file:literal) => {
        Lua::new(
            include_str!("lua/prelude.lua"),
            include_str!($publish),
            include_str!($file),
        )
    };
}

/// The scripts for a single node, publishing releases with `PUBLISH`. Built on first use, when
/// each script's SHA1 is computed.
pub(super) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| scripts!("lua/publish.lua"));

/// The scripts for Redis Cluster, publishing releases with `SPUBLISH` so the notification stays
/// on the shard that owns the lock's slot.
#[cfg(feature = "cluster")]
pub(super) static SHARDED_SCRIPTS: LazyLock<Scripts> =
    LazyLock::new(|| scripts!("lua/spublish.lua"));

#[cfg(test)]
mod tests {
    use super::*;

    /// Each script is hashed from its own file, so the hashes differ and are stable SHA1s.
    #[test]
    fn hashes_are_distinct_sha1s() {
        hashes_are_distinct(&SCRIPTS);
    }

    /// The cluster variants are scripts of their own: a node never runs the wrong publish.
    #[cfg(feature = "cluster")]
    #[test]
    fn sharded_scripts_differ() {
        hashes_are_distinct(&SHARDED_SCRIPTS);
        assert_ne!(SCRIPTS.release.hash(), SHARDED_SCRIPTS.release.hash());
        assert!(SHARDED_SCRIPTS.release.code.contains("'SPUBLISH'"));
        assert!(!SCRIPTS.release.code.contains("SPUBLISH"));
    }

    fn hashes_are_distinct(scripts: &Scripts) {
        let hashes = [
            scripts.acquire.hash(),
            scripts.release.hash(),
            scripts.renew.hash(),
            scripts.renew_many.hash(),
            scripts.abandon.hash(),
            scripts.fair_acquire.hash(),
            scripts.fair_release.hash(),
            scripts.fair_wait.hash(),
            scripts.rw_acquire.hash(),
            scripts.rw_release.hash(),
            scripts.rw_renew.hash(),
            scripts.rw_wait.hash(),
            scripts.sem_acquire.hash(),
            scripts.sem_release.hash(),
            scripts.inspect.hash(),
            scripts.force_unlock.hash(),
        ];
        for (i, hash) in hashes.iter().enumerate() {
            assert_eq!(hash.len(), 40);
            assert!(hash.bytes().all(|b| b.is_ascii_hexdigit()));
            assert!(hashes[i + 1..].iter().all(|other| other != hash));
        }
    }
}
