//! The Lua scripts, one per file, hashed once per process, and how one call of a script is
//! sent.
//!
//! A call goes out as `EVALSHA`. When the server answers `NOSCRIPT` (after a restart or a
//! `SCRIPT FLUSH`), the same call is sent again as `EVAL` with the script's body, which runs it
//! and caches it in one step: unlike "load, then retry by hash", it cannot fail again when
//! flushes keep coming, and it works the same inside a pipeline.

use std::sync::LazyLock;

use redis::{Cmd, Script, ToRedisArgs};

/// One script: its body and its SHA1.
pub(super) struct Lua {
    code: &'static str,
    script: Script,
}

impl Lua {
    fn new(code: &'static str) -> Self {
        Self {
            code,
            script: Script::new(code),
        }
    }

    /// The SHA1 that `EVALSHA` names the script by.
    pub(super) fn hash(&self) -> &str {
        self.script.get_hash()
    }

    /// A call of this script, to fill with keys and arguments.
    pub(super) fn prepare_invoke(&'static self) -> Call {
        Call {
            lua: self,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }
}

/// One call of a script: `KEYS` and `ARGV` in order.
pub(super) struct Call {
    lua: &'static Lua,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl Call {
    /// Appends to `KEYS`.
    pub(super) fn key(&mut self, key: impl ToRedisArgs) -> &mut Self {
        key.write_redis_args(&mut self.keys);
        self
    }

    /// Appends to `ARGV`.
    pub(super) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        arg.write_redis_args(&mut self.args);
        self
    }

    /// The command: `EVALSHA` by hash, or `EVAL` with the body.
    pub(super) fn cmd(&self, by_hash: bool) -> Cmd {
        let mut cmd = if by_hash {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(self.lua.hash());
            cmd
        } else {
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(self.lua.code);
            cmd
        };
        cmd.arg(self.keys.len());
        for item in self.keys.iter().chain(&self.args) {
            cmd.arg(item.as_slice());
        }
        cmd
    }
}

/// Every script the backend runs.
pub(super) struct Scripts {
    pub(super) acquire: Lua,
    pub(super) release: Lua,
    pub(super) renew: Lua,
    pub(super) abandon: Lua,
    pub(super) fair_acquire: Lua,
    pub(super) fair_release: Lua,
    pub(super) fair_wait: Lua,
    pub(super) rw_acquire: Lua,
    pub(super) rw_release: Lua,
    pub(super) rw_renew: Lua,
    pub(super) rw_wait: Lua,
}

/// Built on first use, when each script's SHA1 is computed. Each is sent with the shared
/// helpers of `lua/prelude.lua` in front of it.
pub(super) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    acquire: Lua::new(concat!(
        include_str!("lua/prelude.lua"),
        include_str!("lua/acquire.lua")
    )),
    release: Lua::new(concat!(
        include_str!("lua/prelude.lua"),
        include_str!("lua/release.lua")
    )),
    renew: Lua::new(concat!(
        include_str!("lua/prelude.lua"),
        include_str!("lua/renew.lua")
    )),
    abandon: Lua::new(concat!(
        include_str!("lua/prelude.lua"),
        include_str!("lua/abandon.lua")
    )),
    fair_acquire: Lua::new(concat!(
        include_str!("lua/prelude.lua"),
        include_str!("lua/fair_acquire.lua")
    )),
    fair_release: Lua::new(concat!(
        include_str!("lua/prelude.lua"),
        include_str!("lua/fair_release.lua")
    )),
    fair_wait: Lua::new(concat!(
        include_str!("lua/prelude.lua"),
        include_str!("lua/fair_wait.lua")
    )),
    rw_acquire: Lua::new(concat!(
        include_str!("lua/prelude.lua"),
        include_str!("lua/rw_acquire.lua")
    )),
    rw_release: Lua::new(concat!(
        include_str!("lua/prelude.lua"),
        include_str!("lua/rw_release.lua")
    )),
    rw_renew: Lua::new(concat!(
        include_str!("lua/prelude.lua"),
        include_str!("lua/rw_renew.lua")
    )),
    rw_wait: Lua::new(concat!(
        include_str!("lua/prelude.lua"),
        include_str!("lua/rw_wait.lua")
    )),
});

#[cfg(test)]
mod tests {
    use super::*;

    /// Each script is hashed from its own file, so the hashes differ and are stable SHA1s.
    #[test]
    fn hashes_are_distinct_sha1s() {
        let hashes = [
            SCRIPTS.acquire.hash(),
            SCRIPTS.release.hash(),
            SCRIPTS.renew.hash(),
            SCRIPTS.abandon.hash(),
            SCRIPTS.fair_acquire.hash(),
            SCRIPTS.fair_release.hash(),
            SCRIPTS.fair_wait.hash(),
            SCRIPTS.rw_acquire.hash(),
            SCRIPTS.rw_release.hash(),
            SCRIPTS.rw_renew.hash(),
            SCRIPTS.rw_wait.hash(),
        ];
        for (i, hash) in hashes.iter().enumerate() {
            assert_eq!(hash.len(), 40);
            assert!(hash.bytes().all(|b| b.is_ascii_hexdigit()));
            assert!(hashes[i + 1..].iter().all(|other| other != hash));
        }
    }

    /// The argument order the backend sends matches what each script documents.
    #[test]
    fn documented_arguments() {
        let acquire = include_str!("lua/acquire.lua");
        for line in ["KEYS[1]", "KEYS[2]", "ARGV[1]", "ARGV[4]"] {
            assert!(acquire.contains(line), "acquire.lua documents {line}");
        }
        let release = include_str!("lua/release.lua");
        assert!(release.contains("-- ARGV[7]"));
        let abandon = include_str!("lua/abandon.lua");
        assert!(abandon.contains("-- ARGV[3]"));
    }
}
