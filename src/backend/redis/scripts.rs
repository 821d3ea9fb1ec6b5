//! The Lua scripts, one [`Script`] per file, hashed once per process.

use std::sync::LazyLock;

use redis::Script;

/// Every script the backend runs.
pub(super) struct Scripts {
    pub(super) acquire: Script,
    pub(super) release: Script,
    pub(super) renew: Script,
    pub(super) abandon: Script,
    pub(super) fair_acquire: Script,
    pub(super) fair_release: Script,
    pub(super) fair_wait: Script,
    pub(super) rw_acquire: Script,
    pub(super) rw_release: Script,
    pub(super) rw_renew: Script,
    pub(super) rw_wait: Script,
}

/// Built on first use; `Script::new` computes the SHA1 used by `EVALSHA`.
pub(super) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    acquire: Script::new(include_str!("lua/acquire.lua")),
    release: Script::new(include_str!("lua/release.lua")),
    renew: Script::new(include_str!("lua/renew.lua")),
    abandon: Script::new(include_str!("lua/abandon.lua")),
    fair_acquire: Script::new(include_str!("lua/fair_acquire.lua")),
    fair_release: Script::new(include_str!("lua/fair_release.lua")),
    fair_wait: Script::new(include_str!("lua/fair_wait.lua")),
    rw_acquire: Script::new(include_str!("lua/rw_acquire.lua")),
    rw_release: Script::new(include_str!("lua/rw_release.lua")),
    rw_renew: Script::new(include_str!("lua/rw_renew.lua")),
    rw_wait: Script::new(include_str!("lua/rw_wait.lua")),
});

#[cfg(test)]
mod tests {
    use super::*;

    /// Each script is hashed from its own file, so the hashes differ and are stable SHA1s.
    #[test]
    fn hashes_are_distinct_sha1s() {
        let hashes = [
            SCRIPTS.acquire.get_hash(),
            SCRIPTS.release.get_hash(),
            SCRIPTS.renew.get_hash(),
            SCRIPTS.abandon.get_hash(),
            SCRIPTS.fair_acquire.get_hash(),
            SCRIPTS.fair_release.get_hash(),
            SCRIPTS.fair_wait.get_hash(),
            SCRIPTS.rw_acquire.get_hash(),
            SCRIPTS.rw_release.get_hash(),
            SCRIPTS.rw_renew.get_hash(),
            SCRIPTS.rw_wait.get_hash(),
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
