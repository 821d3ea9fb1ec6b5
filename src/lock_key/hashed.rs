//! Keyed-hash lock names: the hash tag is `base64url(HMAC-SHA256(secret, namespace, key))`.
//!
//! CRC16 slots are public knowledge, so an attacker who controls keys can pick keys that all
//! land in one Redis Cluster slot. Under a secret the slot of a key cannot be predicted, and
//! every name has the same bounded length whatever the key.

use std::fmt;

use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::{KeyError, LockKey, check_len};

/// The secret of keyed-hash mode, kept as a ready HMAC state. Its `Debug` never shows the
/// secret.
#[derive(Clone)]
pub(crate) struct KeyedHash(Hmac<Sha256>);

impl KeyedHash {
    /// A keyed hash under `secret` (HMAC accepts keys of any length).
    pub(crate) fn new(secret: &[u8]) -> Self {
        Self(Hmac::new_from_slice(secret).unwrap_or_else(|_| unreachable!("HMAC takes any key")))
    }

    /// The lock name of `user_key` in `namespace` under `prefix`:
    /// `prefix` + escaped namespace + `{` + base64url(HMAC) + `}`.
    ///
    /// # Errors
    /// As [`LockKey::namespaced`]: the user key is checked before it is hashed.
    pub(crate) fn name(
        &self,
        prefix: &str,
        namespace: &str,
        user_key: &[u8],
        max_len: usize,
    ) -> Result<LockKey, KeyError> {
        check_len(user_key, max_len)?;
        let mut mac = self.0.clone();
        // As the lock name shows it, so `/r/{id}` and `/r/:id` name one lock, as in plain names.
        let namespace = super::readable(namespace);
        // The namespace's length first, so (namespace, key) pairs cannot run into each other.
        mac.update(&(namespace.len() as u64).to_be_bytes());
        mac.update(namespace.as_bytes());
        mac.update(user_key);
        let tag = base64url(&mac.finalize().into_bytes());
        Ok(LockKey::with_tag(prefix, &namespace, std::iter::once(tag.as_str())))
    }
}

impl fmt::Debug for KeyedHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyedHash(<secret>)")
    }
}

/// Unpadded base64 with the URL-safe alphabet (RFC 4648 §5): no braces, no `%`. The tag is
/// part of every lock name, so this encoding must never change (see `names_are_stable`).
fn base64url(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The RFC 4648 test vectors, without padding.
    #[test]
    fn base64url_vectors() {
        let cases = [
            ("", ""),
            ("f", "Zg"),
            ("fo", "Zm8"),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg"),
            ("fooba", "Zm9vYmE"),
            ("foobar", "Zm9vYmFy"),
        ];
        for (raw, encoded) in cases {
            assert_eq!(base64url(raw.as_bytes()), encoded);
        }
        assert_eq!(base64url(&[0xfb, 0xff, 0xfe]), "-__-");
    }

    /// The HMAC is RFC 4231's test case 2, so the name is the standard keyed hash.
    #[test]
    fn hmac_sha256_vector() {
        let hash = KeyedHash::new(b"Jefe");
        let mut mac = hash.0;
        mac.update(b"what do ya want for nothing?");
        let digest = mac.finalize().into_bytes();
        let expected = [
            0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75, 0x4e, 0x6a, 0x04, 0x24, 0x26, 0x08, 0x95,
            0x75, 0xc7, 0x5a, 0x00, 0x3f, 0x08, 0x9d, 0x27, 0x39, 0x83, 0x9d, 0xec, 0x58, 0xb9,
            0x64, 0xec, 0x38, 0x43,
        ];
        assert_eq!(digest.as_slice(), expected);
    }

    /// Lock names must not change between versions (a rolling upgrade would run two names of
    /// one lock side by side): one name, written out (computed with an independent HMAC-SHA256
    /// and base64url implementation).
    #[test]
    fn names_are_stable() {
        let hash = KeyedHash::new(b"tower-lock keyed-hash test");
        let name = hash.name("tower-lock:", "/accounts/{id}", b"42", 512).unwrap();
        assert_eq!(
            name.as_str(),
            "tower-lock:/accounts/:id{j54I2btNEsaDyOZz2dSogGHzKIARZUrEgE91gy5tx1U}"
        );
    }

    /// Names have a fixed-size hash tag, and depend on the secret, the namespace and the key.
    #[test]
    fn names_are_bounded_and_keyed() {
        let a = KeyedHash::new(b"secret a");
        let b = KeyedHash::new(b"secret b");
        let name = a.name("p:", "/r/{id}", &[0xff; 512], 512).unwrap();
        assert_eq!(name.as_str().len(), "p:/r/:id{}".len() + 43);
        assert_ne!(a.name("p:", "", b"k", 8), b.name("p:", "", b"k", 8));
        assert_ne!(a.name("p:", "n", b"k", 8), a.name("p:", "", b"nk", 8));
        assert_eq!(a.name("p:", "", b"", 8), Err(KeyError::Empty));
        assert!(format!("{a:?}").contains("<secret>"));
    }
}
