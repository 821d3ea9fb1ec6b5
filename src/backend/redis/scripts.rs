//! The Lua scripts, one [`Script`] per file, hashed once per process.

use std::sync::LazyLock;

use redis::Script;

/// Every script the backend runs.
pub(super) struct Scripts {
    pub(super) acquire: Script,
    pub(super) release: Script,
    pub(super) renew: Script,
    pub(super) abandon: Script,
}

/// Built on first use; `Script::new` computes the SHA1 used by `EVALSHA`.
pub(super) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    acquire: Script::new(include_str!("lua/acquire.lua")),
    release: Script::new(include_str!("lua/release.lua")),
    renew: Script::new(include_str!("lua/renew.lua")),
    abandon: Script::new(include_str!("lua/abandon.lua")),
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
