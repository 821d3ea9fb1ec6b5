//! Every kind of lock by name, for tests that check one property on each.

use tower_lock::{Backend, Holder, LockClient, LockError, LockGuard, LockRequest};

/// The kinds of lock, as [`request`] names them.
pub const KINDS: [&str; 5] = ["plain", "fair", "read", "write", "semaphore"];

/// A request for `key` of `kind` (one of [`KINDS`]; a semaphore of one permit).
pub fn request<'a, B: Backend>(
    client: &'a LockClient<B>,
    key: &str,
    kind: &str,
) -> LockRequest<'a, B> {
    match kind {
        "fair" => client.fair_lock(key),
        "read" => client.read_write_lock(key).read(),
        "write" => client.read_write_lock(key).write(),
        "semaphore" => client.semaphore(key, 1),
        _ => client.lock(key),
    }
}

/// Takes `key` as `kind` for `holder` through `client`, waiting as long as the request's
/// default wait.
pub async fn hold<B: Backend>(
    client: &LockClient<B>,
    key: &str,
    kind: &str,
    holder: &Holder,
) -> LockGuard<B> {
    request(client, key, kind)
        .holder(holder)
        .acquire()
        .await
        .unwrap_or_else(|error| panic!("{kind}: {error:?}"))
}

/// Asserts that `other` cannot take `key`, held as `kind`, at once (a read hold: its write
/// side).
pub async fn assert_refused_to<B: Backend>(other: &LockClient<B>, key: &str, kind: &str) {
    let kind = if kind == "read" { "write" } else { kind };
    match request(other, key, kind).try_acquire().await {
        Err(LockError::WaitTimeout { .. }) => {}
        result => panic!("{kind}: another holder got in while it was held: {result:?}"),
    }
}

/// Asserts that `other` takes `key` as `kind` at once, and releases it.
pub async fn assert_free_for<B: Backend>(other: &LockClient<B>, key: &str, kind: &str) {
    let guard = request(other, key, kind)
        .try_acquire()
        .await
        .unwrap_or_else(|error| panic!("{kind}: still held: {error:?}"));
    guard.release().await.expect("released");
}
