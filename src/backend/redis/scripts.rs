//! The Lua scripts, one per file, hashed once per process, and how one call is sent.
//!
//! Each script has the `publish` helper of its transport in front (`PUBLISH` on a node,
//! `SPUBLISH` on a Cluster) and the helpers of `lua/prelude.lua` where it says `-- @helpers`
//! (else in front): a script whose common case needs no helper does not pay for defining them.
//! A call goes out as `EVALSHA`; on `NOSCRIPT` the same call goes again as `EVAL` with the
//! body, which runs and caches it in one step, also inside a pipeline.

use std::{borrow::Cow, sync::LazyLock};

use redis::{Arg, Cmd, FromRedisValue, RedisError, Script, ToRedisArgs, aio::ConnectionLike};

use super::errors::is_noscript;

/// One script: its body and its SHA1.
pub(super) struct Lua {
    pub(super) code: String,
    pub(super) script: Script,
}

impl Lua {
    fn new(publish: &str, file: &str) -> Self {
        let prelude = include_str!("lua/prelude.lua");
        let code = match file.split_once("-- @helpers\n") {
            Some((common, rest)) => format!("{publish}{common}{prelude}{rest}"),
            None => format!("{publish}{prelude}{file}"),
        };
        Self { script: Script::new(&code), code }
    }

    /// A call of this script with `keys` keys: the keys go in first, then the arguments.
    pub(super) fn call(&'static self, keys: usize) -> Call {
        let mut cmd = Cmd::with_capacity(keys + 12, 256);
        cmd.arg("EVALSHA").arg(self.script.get_hash()).arg(keys);
        Call { lua: self, cmd, keys_left: keys }
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
        debug_assert!(self.keys_left > 0, "more keys than the call declared");
        self.keys_left -= 1;
        self.cmd.arg(key);
        self
    }

    /// Appends to `ARGV`.
    pub(super) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        debug_assert_eq!(self.keys_left, 0, "an argument before the declared keys");
        self.cmd.arg(arg);
        self
    }

    /// The command: the `EVALSHA` as written, or the same call as `EVAL` with the body.
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

    /// Runs the call on `conn`: by hash, and by body when the server lost the script.
    pub(super) async fn run<T: FromRedisValue>(
        &self,
        conn: &mut impl ConnectionLike,
    ) -> Result<T, RedisError> {
        match self.cmd(true).query_async(conn).await {
            Err(error) if is_noscript(&error) => self.cmd(false).query_async(conn).await,
            other => other,
        }
    }
}

/// Every script the backend runs.
pub(super) struct Scripts {
    pub(super) acquire: Lua,
    pub(super) release: Lua,
    pub(super) share: Lua,
    pub(super) unshare: Lua,
    pub(super) renew: Lua,
    pub(super) wait: Lua,
    pub(super) inspect: Lua,
}

/// The `publish` helper of a single node.
pub(super) const PUBLISH: &str = "local function publish(channel, message)
  return redis.call('PUBLISH', channel, message)
end
";

/// The `publish` helper of a Redis Cluster: to the subscribers of the shard that owns the
/// lock's slot (the channel carries the lock's hash tag).
#[cfg(feature = "cluster")]
const SPUBLISH: &str = "local function publish(channel, message)
  return redis.call('SPUBLISH', channel, message)
end
";

fn scripts(publish: &str) -> Scripts {
    Scripts {
        acquire: Lua::new(publish, include_str!("lua/acquire.lua")),
        release: Lua::new(publish, include_str!("lua/release.lua")),
        share: Lua::new(publish, include_str!("lua/share.lua")),
        unshare: Lua::new(publish, include_str!("lua/unshare.lua")),
        renew: Lua::new(publish, include_str!("lua/renew.lua")),
        wait: Lua::new(publish, include_str!("lua/wait.lua")),
        inspect: Lua::new(publish, include_str!("lua/inspect.lua")),
    }
}

/// The scripts of a single node, hashed on first use.
pub(super) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| scripts(PUBLISH));

/// The scripts of a Redis Cluster.
#[cfg(feature = "cluster")]
pub(super) static SHARDED_SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| scripts(SPUBLISH));
