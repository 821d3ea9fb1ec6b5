//! Holder identity: who owns a lock, and how code finds the holder it runs for.
//!
//! Redis-based locks in other ecosystems name the owner after the calling thread. Async tasks
//! move between threads and one task can drive several unrelated futures (`join!`), so here the
//! owner is an explicit [`Holder`], made by a [`LockClient`](crate::LockClient) and never taken
//! from request data. Its id says which instance holds the lock:
//! `<name>@<host>/<pid>/<random>:<sequence>`, such as `billing@web-1/4242/3f2a…:17` (see
//! [`LockClientBuilder::name`](crate::LockClientBuilder::name)). Code that runs inside
//! [`Holder::scope`] acquires locks as that holder, and so re-enters locks the holder already has
//! instead of deadlocking on them. Outside any scope, every acquire uses a fresh holder. A
//! scope only applies to the client that made its holder: two clients never re-enter each
//! other's locks through a scope.

use std::{
    fmt,
    future::Future,
    hash::{Hash, Hasher},
    sync::{Arc, Weak},
};

use tokio::task::futures::TaskLocalFuture;

use crate::lock_key::LockKey;

tokio::task_local! {
    static CURRENT: Holder;
}

/// The identity a lock is held under. Cheap to clone.
#[derive(Clone)]
pub struct Holder {
    id: Arc<str>,
    /// The client that made it, asked by another client whether this holder holds a lock (a
    /// request that would wait for a lock it holds through another client).
    client: Option<Weak<dyn HeldLocks>>,
}

/// What a client tells of its holders' locks.
pub(crate) trait HeldLocks: Send + Sync {
    /// Whether `holder` holds the lock `key` in this client.
    fn holds(&self, holder: &Holder, key: &LockKey) -> bool;
}

impl PartialEq for Holder {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for Holder {}

impl Hash for Holder {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.id.hash(state);
    }
}

impl Holder {
    /// Made only by the client, from its random id and a sequence number.
    pub(crate) fn new(client_id: &str, sequence: u64) -> Self {
        Self { id: numbered(client_id, b':', sequence), client: None }
    }

    /// A holder of `client`, which answers whether it holds a lock.
    pub(crate) fn of(client_id: &str, sequence: u64, client: Weak<dyn HeldLocks>) -> Self {
        Self { client: Some(client), ..Self::new(client_id, sequence) }
    }

    /// Whether this holder holds the lock `key` in the client that made it.
    pub(crate) fn holds(&self, key: &LockKey) -> bool {
        let client = self.client.as_ref().and_then(Weak::upgrade);
        client.is_some_and(|client| client.holds(self, key))
    }

    /// Whether this holder was made by the client with id `client_id`.
    pub(crate) fn is_from(&self, client_id: &str) -> bool {
        self.id.strip_prefix(client_id).is_some_and(|rest| rest.starts_with(':'))
    }

    /// The id stored in the backend as the lock's owner:
    /// `<name>@<host>/<pid>/<random>:<sequence>`, where `<name>@<host>/<pid>` is the
    /// [`client`](Self::client) that made it.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The instance that made this holder: `<name>@<host>/<pid>`, as
    /// [`HolderInfo::client`](crate::HolderInfo::client) reads it from a lock's holder.
    ///
    /// ```
    /// use tower_lock::{LockClient, MemoryBackend};
    ///
    /// let locks = LockClient::builder(MemoryBackend::new()).name("billing").build().unwrap();
    /// let client = locks.holder().client().to_owned();
    /// assert!(client.starts_with("billing@"));
    /// assert!(client.ends_with(&format!("/{}", std::process::id())));
    /// ```
    pub fn client(&self) -> &str {
        client_of(&self.id).unwrap_or_default()
    }

    /// The holder of the current scope, if any.
    pub fn current() -> Option<Self> {
        CURRENT.try_with(Self::clone).ok()
    }

    /// Runs `future` with `self` as the current holder: every acquire inside it that does not
    /// name a holder uses this one.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_lock::LockError> {
    /// use tower_lock::{LockClient, MemoryBackend};
    ///
    /// let locks = LockClient::builder(MemoryBackend::new()).build().unwrap();
    /// let holder = locks.holder();
    /// holder
    ///     .scope(async {
    ///         let outer = locks.lock("order:42").acquire().await?;
    ///         // Same holder, same key: re-enters instead of waiting for itself.
    ///         let inner = locks.lock("order:42").try_acquire().await?;
    ///         inner.release().await?;
    ///         outer.release().await
    ///     })
    ///     .await
    /// # }
    /// ```
    pub fn scope<F: Future>(self, future: F) -> TaskLocalFuture<Self, F> {
        CURRENT.scope(self, future)
    }

    /// Runs the synchronous `f` with `self` as the current holder (for code that runs before the
    /// first poll, such as a tower service's `call`).
    pub fn sync_scope<R>(self, f: impl FnOnce() -> R) -> R {
        CURRENT.sync_scope(self, f)
    }
}

impl fmt::Debug for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Holder").field(&&*self.id).finish()
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id)
    }
}

/// The longest name, and the longest host name, a client id keeps: ids travel with every
/// acquire and renewal, and are stored with every hold.
const MAX_PART: usize = 40;

/// The id of a new client: `<name>@<host>/<pid>/<random>`. The random part keeps two clients
/// of one name (in one process, or a restarted one with its pid reused) apart; the rest is for
/// the people reading `inspect` and the logs. Name and host are sanitised: none of `@`, `/` or
/// `:` appears in them, so the id reads back unambiguously, nor a newline (the store separates
/// a holder from a lock name with one) or `~` (the start of a lock record's own fields), and
/// the id stays ASCII, as pub/sub payloads are read; and cut to [`MAX_PART`].
pub(crate) fn client_id(name: Option<&str>) -> String {
    let name = match name {
        Some(name) => sanitised(name),
        None => sanitised(&default_name()),
    };
    format!(
        "{name}@{host}/{pid}/{random}",
        host = sanitised(&host_name()),
        pid = std::process::id(),
        random = uuid::Uuid::new_v4().simple(),
    )
}

/// The instance part of a holder id, `<name>@<host>/<pid>`, or `None` for an id not made by a
/// client of this crate.
pub(crate) fn client_of(id: &str) -> Option<&str> {
    let (name, rest) = id.split_once('@')?;
    let host = rest.find('/')?;
    let pid = rest[host + 1..].find('/')?;
    Some(&id[..name.len() + 1 + host + 1 + pid])
}

/// `text` with every character outside ASCII letters, digits, `.`, `-` and `_` replaced by `_`,
/// cut to [`MAX_PART`] bytes; `unnamed` when empty.
fn sanitised(text: &str) -> String {
    let clean: String = text
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '-' | '_' => c,
            _ => '_',
        })
        .take(MAX_PART)
        .collect();
    if clean.is_empty() { "unnamed".to_owned() } else { clean }
}

/// The service's name when the environment states it (`OTEL_SERVICE_NAME`), else the
/// executable's file name.
fn default_name() -> String {
    std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|name| !name.trim().is_empty())
        .or_else(|| {
            let exe = std::env::current_exe().ok()?;
            Some(exe.file_stem()?.to_string_lossy().into_owned())
        })
        .unwrap_or_default()
}

/// This machine's host name, or `unknown-host`.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .map(|host| host.trim().to_owned())
        .filter(|host| !host.is_empty())
        .unwrap_or_else(|| "unknown-host".to_owned())
}

/// `head`, `separator` and `n` in decimal: the ids of holders and attempts, made for every
/// acquire, so without the formatting machinery, and in one allocation.
pub(crate) fn numbered(head: &str, separator: u8, n: u64) -> Arc<str> {
    crate::scratch::shared(|id| {
        id.push_str(head);
        id.push(char::from(separator));
        id.extend(Decimal::new(n).as_bytes().iter().map(|&digit| char::from(digit)));
    })
}

/// A number's decimal digits, written without allocating.
pub(crate) struct Decimal {
    digits: [u8; 20],
    start: usize,
}

impl Decimal {
    pub(crate) fn new(mut n: u64) -> Self {
        let mut digits = [0; 20];
        let mut start = digits.len();
        loop {
            start -= 1;
            // `n % 10` is below 10: the cast cannot truncate.
            digits[start] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        Self { digits, start }
    }

    /// The digits, in ASCII.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.digits[self.start..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_ids_read_as_formatted() {
        for n in [0, 7, 10, 99, 1_000_001, u64::MAX] {
            assert_eq!(&*numbered("client", b':', n), format!("client:{n}"));
            let long = "c".repeat(200);
            assert_eq!(&*numbered(&long, b'#', n), format!("{long}#{n}"));
            assert_eq!(Decimal::new(n).as_bytes(), n.to_string().as_bytes());
        }
        assert_eq!(Holder::new("c", 12).id(), "c:12");
    }

    #[test]
    fn client_ids_name_the_instance_and_read_back() {
        let id = client_id(Some("billing"));
        let client = client_of(&id).expect("an id of this crate");
        assert!(client.starts_with("billing@"), "{id}");
        assert!(client.ends_with(&format!("/{}", std::process::id())), "{id}");
        let random = &id[client.len() + 1..];
        assert!(random.len() == 32 && random.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
        let holder = Holder::new(&id, 7);
        assert_eq!(holder.client(), client);
        assert!(holder.is_from(&id));
        assert_ne!(client_id(Some("billing")), id, "the same name, another client");
    }

    #[test]
    fn names_are_sanitised_and_bounded() {
        assert_eq!(sanitised("billing-v2.eu_1"), "billing-v2.eu_1");
        assert_eq!(sanitised("a:b@c/d e#f~g{h}"), "a_b_c_d_e_f_g_h_");
        assert_eq!(sanitised("dépôt"), "d_p_t");
        assert_eq!(sanitised(""), "unnamed");
        assert_eq!(sanitised(&"x".repeat(500)), "x".repeat(MAX_PART));
        let id = client_id(Some("odd:name@host/x"));
        assert!(id.starts_with("odd_name_host_x@"), "{id}");
        assert_eq!(client_of(&id).map(|c| c.split('/').count()), Some(2), "{id}");
        assert!(id.len() <= 2 * MAX_PART + 1 + 1 + 10 + 1 + 32, "{id}");
        assert_eq!(client_of("3f2a:7"), None);
    }
}
