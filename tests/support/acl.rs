//! The crate's Redis ACL user, as the security guide documents it: its key and channel
//! prefixes, the commands it sends and the commands its Lua scripts call (Redis checks those
//! too).
//!
//! With `TOWER_LOCK_TEST_ACL=1` in the environment, every `RedisServer` the fixture starts (or
//! restarts) is started with this user (so it exists before any client connects), granted the
//! prefixes of [`TEST_PREFIXES`], and its `url` logs in as the user; `cmd`, the tests' admin
//! channel, stays the unrestricted `default` user. Before a server is killed (by `kill`, a
//! restart or drop) its `ACL LOG` must be empty: a denial is a missing grant or a command the
//! test should send through `cmd`, and fails the test.

/// The environment variable that switches the mode on (value `1`).
pub const ENV: &str = "TOWER_LOCK_TEST_ACL";
/// The limited user's name.
pub const USER: &str = "towerlock";
/// The limited user's password.
pub const PASSWORD: &str = "lock-password";

/// The commands the crate sends and its scripts call, on every Redis version it supports.
pub const COMMANDS: &[&str] = &[
    "+ping",
    "+info",
    "+evalsha",
    "+eval",
    "+type",
    "+subscribe",
    "+unsubscribe",
    "+publish",
    "+time",
    "+exists",
    "+del",
    "+pttl",
    "+pexpire",
    "+get",
    "+set",
    "+lindex",
    "+lpop",
    "+lrem",
    "+rpush",
    "+sadd",
    "+sismember",
    "+zadd",
    "+zcard",
    "+zcount",
    "+zrange",
    "+zrangebyscore",
    "+zrem",
    "+zremrangebyscore",
    "+zscore",
];

/// The commands options add: `RedisBackendBuilder::min_replicas` sends `WAIT`
/// (`RedisBackendBuilder::wait_aof`'s `WAITAOF` is in [`rules`] on the versions that have it),
/// and the idempotency layer's Redis answer store reads and writes hashes.
pub const OPTION_COMMANDS: &[&str] = &["+wait", "+hget", "+hmget", "+hset"];

/// The commands a Redis Cluster client adds: sharded pub/sub (the scripts' `SPUBLISH`, the
/// waiters' `SSUBSCRIBE`), and what the cluster client sends to learn the slot map and follow
/// a slot being migrated.
pub const CLUSTER_COMMANDS: &[&str] =
    &["+spublish", "+ssubscribe", "+sunsubscribe", "+cluster|slots", "+asking"];

/// The key prefixes the tests run the crate with: the default and the ones the test files pass
/// to `LockClientBuilder::prefix`.
pub const TEST_PREFIXES: &[&str] = &[
    "tower-lock:",
    "tl:",
    "rl:",
    "shop:",
    "t:",
    "t5:",
    "t10:",
    "t14:",
    "t14b:",
    "t14c:",
    "t14d:",
    "t16:",
    "t17:",
    "t18:",
    "t19f:",
    "t19p:",
    "fo:",
    "frw:",
    "mig:",
    "mx:",
    "ns:",
    "sh:",
    "sem:",
];

/// Whether `TOWER_LOCK_TEST_ACL=1` is set.
pub fn enabled() -> bool {
    std::env::var_os(ENV).is_some_and(|value| value == "1")
}

/// The `ACL SETUSER <name>` arguments for the crate's user on a server of `version`, with
/// `password`, granted keys `~<p>*` and channels `&<p>*` for each of `prefixes`.
///
/// On Redis 7.2 and newer this adds `+client|setinfo`: redis-rs sends it at connect. Older
/// servers have no such command (they reject the rule, and answer the command with an error
/// that redis-rs ignores). It also adds `+waitaof` there, for `RedisBackendBuilder::wait_aof`
/// (a `WAITAOF` after each grant, and one that waits for nothing at connect) and
/// `RedisBackend::supports_wait_aof`; an older server has no such command.
pub fn rules(version: &[u32], password: &str, prefixes: &[&str]) -> Vec<String> {
    let mut rules = vec![
        "on".to_owned(),
        format!(">{password}"),
        "resetkeys".to_owned(),
        "resetchannels".to_owned(),
    ];
    for prefix in prefixes {
        rules.push(format!("~{prefix}*"));
        rules.push(format!("&{prefix}*"));
    }
    rules.push("-@all".to_owned());
    rules.extend(COMMANDS.iter().map(|&command| command.to_owned()));
    if version >= &[7, 2][..] {
        rules.push("+client|setinfo".to_owned());
        rules.push("+waitaof".to_owned());
    }
    rules
}

/// In the ACL mode, the `redis-server` arguments that create the test user at start-up:
/// [`USER`] with [`PASSWORD`], the [`rules`] for [`TEST_PREFIXES`], the [`OPTION_COMMANDS`]
/// (the tests use every option) and the [`CLUSTER_COMMANDS`] (cluster nodes are started by
/// the same fixture). Outside it, none.
pub fn startup_args(version: &[u32]) -> Vec<String> {
    if !enabled() {
        return Vec::new();
    }
    let rules = rules(version, PASSWORD, TEST_PREFIXES);
    let extra = OPTION_COMMANDS.iter().chain(CLUSTER_COMMANDS);
    ["--user", USER]
        .into_iter()
        .map(str::to_owned)
        .chain(rules)
        .chain(extra.map(|&command| command.to_owned()))
        .collect()
}
