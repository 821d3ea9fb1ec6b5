//! F28: lock names from arbitrary bytes. Property tests over any `Vec<u8>` (braces, `%`, NUL,
//! invalid UTF-8, empty, 10 000 bytes) through every extractor and the name encoding:
//! distinct (namespace, key) pairs never share a backend key, every backend key of one lock
//! (and its release channel) is in the lock's Redis Cluster slot, and refused keys send
//! nothing to Redis.
//!
//! `TOWER_LOCK_PROPTEST_CASES` sets the number of cases per property (default 256).

use crate::support;

use std::collections::HashSet;

use http::{Request, request::Parts};
use percent_encoding::{NON_ALPHANUMERIC, percent_encode};
use proptest::{collection::vec, prelude::*};
use support::{RedisServer, RespValue};
use tower_lock::{
    LockClient, LockError, LockKind, MemoryBackend,
    key::{self, KeyError, MakeKey},
};

/// The suffixes the Redis backend appends to a lock's name (its other keys and its channel).
const SUFFIXES: [&str; 7] =
    [":fence", ":void", ":released", ":queue", ":timeouts", ":readers", ":writers"];

/// Keys long enough for the 10 000-byte cases.
const MAX_KEY_LEN: usize = 16 * 1024;

fn config() -> ProptestConfig {
    let cases = std::env::var("TOWER_LOCK_PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(256);
    ProptestConfig::with_cases(cases)
}

/// The clients whose encodings are checked: escaped names, and keyed-hash names if built in.
fn clients() -> Vec<LockClient<MemoryBackend>> {
    let escaped = LockClient::builder(MemoryBackend::new()).max_key_len(MAX_KEY_LEN);
    #[allow(unused_mut)]
    let mut clients = vec![escaped.build().expect("valid configuration")];
    #[cfg(feature = "keyed-hash")]
    clients.push(
        LockClient::builder(MemoryBackend::new())
            .max_key_len(MAX_KEY_LEN)
            .keyed_hash(b"fuzz secret")
            .build()
            .expect("valid configuration"),
    );
    clients
}

/// Arbitrary bytes, biased towards the ones the encoding must escape, with a few near the
/// 10 000-byte mark.
fn bytes() -> impl Strategy<Value = Vec<u8>> {
    let hostile = prop::sample::select(b"{}%\0\x7f\xff:/ +a".to_vec());
    prop_oneof![
        4 => vec(any::<u8>(), 0..48),
        4 => vec(hostile, 0..24),
        1 => vec(any::<u8>(), 9_990..=10_000),
    ]
}

/// Namespaces: route templates with braces, and arbitrary text.
fn namespace() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("/orders/{id}".to_owned()),
        Just("/accounts/{id}".to_owned()),
        ".{0,12}",
    ]
}

/// CRC16-XMODEM, the checksum behind Redis Cluster slots.
fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |crc, &byte| {
        (0..8).fold(crc ^ (u16::from(byte) << 8), |crc, _| {
            if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 }
        })
    })
}

/// The hash tag of a Redis key per the Cluster spec: the bytes between the first `{` and the
/// first `}` after it, if not empty; otherwise the whole key.
fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{')
        && let Some(len) = key[open + 1..].iter().position(|&b| b == b'}')
        && len > 0
    {
        return &key[open + 1..open + 1 + len];
    }
    key
}

fn slot(key: &str) -> u16 {
    crc16(hash_tag(key.as_bytes())) % 16384
}

/// The slot helpers agree with the Cluster spec's examples and the CRC16 check value.
#[test]
fn slot_helpers_follow_the_spec() {
    assert_eq!(crc16(b"123456789"), 0x31c3);
    assert_eq!(hash_tag(b"{user1000}.following"), b"user1000");
    assert_eq!(hash_tag(b"foo{}{bar}"), b"foo{}{bar}");
    assert_eq!(hash_tag(b"foo{{bar}}zap"), b"{bar");
    assert_eq!(slot("{a}x"), slot("{a}y"));
}

/// Every backend key and channel name of the locks of every kind for `key` in `namespace`,
/// after checking they all hash to one slot. `None` for a refused key.
fn names(client: &LockClient<MemoryBackend>, namespace: &str, key: &[u8]) -> Option<Vec<String>> {
    let mut all = Vec::new();
    for kind in [LockKind::Exclusive, LockKind::Read] {
        let lock = match client.lock_key(namespace, key, kind) {
            Ok(lock) => lock,
            Err(KeyError::Empty) => {
                assert!(key.is_empty());
                return None;
            }
            Err(other) => panic!("unexpected refusal {other:?}"),
        };
        let name = lock.as_str();
        let tag = hash_tag(name.as_bytes());
        assert_ne!(tag, name.as_bytes(), "{name} has no hash tag");
        assert_eq!(name.matches('{').count(), 1, "{name}");
        assert_eq!(name.matches('}').count(), 1, "{name}");
        let home = slot(name);
        all.push(name.to_owned());
        for suffix in SUFFIXES {
            let derived = lock.derived(suffix);
            assert_eq!(slot(&derived), home, "{derived} left the slot of {name}");
            all.push(derived);
        }
    }
    let unique: HashSet<&String> = all.iter().collect();
    assert_eq!(unique.len(), all.len(), "one lock's names overlap: {all:?}");
    Some(all)
}

proptest! {
    #![proptest_config(config())]

    /// Distinct (namespace, key) pairs share no backend key or channel, in every encoding.
    #[test]
    fn names_are_injective_and_slot_stable(
        (ns_a, a) in (namespace(), bytes()),
        (ns_b, b) in (namespace(), bytes()),
    ) {
        for client in clients() {
            let (Some(first), Some(second)) = (names(&client, &ns_a, &a), names(&client, &ns_b, &b))
            else {
                continue;
            };
            let first: HashSet<String> = first.into_iter().collect();
            let shared = second.iter().filter(|name| first.contains(*name)).count();
            if (&ns_a, &a) == (&ns_b, &b) {
                prop_assert_eq!(shared, second.len());
            } else {
                prop_assert_eq!(shared, 0, "{:?}/{:?} and {:?}/{:?} collide", ns_a, a, ns_b, b);
            }
        }
    }

    /// Escaped names decode back to the exact key.
    #[test]
    fn escaped_names_round_trip(key in bytes(), ns in namespace()) {
        let client = &clients()[0];
        if let Ok(lock) = client.lock_key(&ns, &key, LockKind::Exclusive) {
            prop_assert_eq!(lock.user_key(), key);
        } else {
            prop_assert!(key.is_empty());
        }
    }

    /// Every extractor gives back exactly the bytes the request carried (or none, where the
    /// request cannot carry them), so the name encoding's injectivity carries over.
    #[test]
    fn extractors_pass_bytes_through(key in bytes(), text in ".{0,24}") {
        let encoded = encode(&key);
        let uri = format!("/x/{encoded}?k={encoded}&other=1");
        let header = http::HeaderValue::from_bytes(&key).ok();
        let mut builder = Request::get(uri.as_str());
        if let Some(value) = &header {
            builder = builder.header("x-key", value.clone());
        }
        let (mut parts, ()) = builder.body(()).expect("valid request").into_parts();

        prop_assert_eq!(key::query("k").make_key(&mut parts), Some(key.clone()));
        let prefixed = key::query("k").prefixed("kind:").make_key(&mut parts);
        prop_assert_eq!(prefixed, Some([b"kind:".as_slice(), &key].concat()));
        let segment = key::path_segment(1).make_key(&mut parts);
        prop_assert_eq!(segment, (!key.is_empty()).then(|| key.clone()));

        // Headers: only visible ASCII (and tabs) are taken, never a lossy conversion.
        let visible = key.iter().all(|&b| b == b'\t' || (0x20..0x7f).contains(&b));
        let from_header = key::header("x-key").make_key(&mut parts);
        match &header {
            Some(_) if visible => prop_assert_eq!(from_header, Some(key.clone())),
            _ => prop_assert_eq!(from_header, None),
        }

        let owned = text.clone();
        let from_fn = key::from_fn(move |_: &Parts| Some(owned.clone()));
        prop_assert_eq!(from_fn.make_key(&mut parts), Some(text.into_bytes()));

        #[cfg(feature = "axum")]
        {
            let expected = std::str::from_utf8(&key).ok().filter(|s| !s.is_empty());
            prop_assert_eq!(path_param(&encoded), expected.map(|s| s.as_bytes().to_vec()));
        }
    }
}

/// Percent-encodes every byte but ASCII letters and digits.
fn encode(bytes: &[u8]) -> String {
    percent_encode(bytes, NON_ALPHANUMERIC).to_string()
}

/// What `key::path_param("id")` finds in `/r/{id}` for the encoded path segment, as routed by
/// axum; `None` when the route does not match or axum refuses the parameter.
#[cfg(feature = "axum")]
fn path_param(encoded: &str) -> Option<Vec<u8>> {
    use axum::{Router, body::Body, http::StatusCode, routing::get};
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    async fn handler(mut parts: Parts) -> (StatusCode, Vec<u8>) {
        match key::path_param("id").make_key(&mut parts) {
            Some(key) => (StatusCode::OK, key),
            None => (StatusCode::NO_CONTENT, Vec::new()),
        }
    }

    let router = Router::new().route("/r/{id}", get(handler));
    let request = Request::get(format!("/r/{encoded}")).body(Body::empty()).expect("valid request");
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    runtime.block_on(async move {
        let response = router.oneshot(request).await.expect("infallible");
        if response.status() != StatusCode::OK {
            return None;
        }
        let body = response.into_body().collect().await.expect("body");
        Some(body.to_bytes().to_vec())
    })
}

/// Refused keys fail before any command reaches Redis, for every kind of lock.
#[tokio::test]
async fn refused_keys_send_no_command() {
    let server = RedisServer::start();
    let backend = support::redis_backend(server.url()).connect().await.expect("connect");
    let locks = LockClient::builder(backend).max_key_len(16).build().expect("valid configuration");
    assert_eq!(server.cmd(&["CONFIG", "RESETSTAT"]), RespValue::Simple("OK".into()));

    for key in [Vec::new(), vec![b'k'; 17], vec![b'{'; 10_000]] {
        let results = [
            locks.lock(&key).acquire().await.map(drop),
            locks.fair_lock(&key).acquire().await.map(drop),
            locks.read_write_lock(&key).read().acquire().await.map(drop),
            locks.read_write_lock(&key).write().acquire().await.map(drop),
            locks.lock_in_namespace("/orders/{id}", &key).acquire().await.map(drop),
        ];
        for result in results {
            assert!(
                matches!(result, Err(LockError::InvalidKey(_))),
                "{} bytes: {result:?}",
                key.len()
            );
        }
    }

    let stats = server.cmd(&["INFO", "commandstats"]).as_str().expect("text");
    let commands: Vec<&str> = stats
        .lines()
        .filter_map(|line| line.strip_prefix("cmdstat_"))
        .filter_map(|line| line.split(':').next())
        .collect();
    assert!(
        commands.iter().all(|c| *c == "config|resetstat" || *c == "info"),
        "commands sent for refused keys: {commands:?}"
    );
}
