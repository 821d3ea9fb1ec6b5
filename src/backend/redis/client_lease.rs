//! The client lease: one key per client whose expiry every watchdog hold of its exclusive locks
//! lives on (see [`RedisBackendBuilder::client_lease`](super::RedisBackendBuilder::client_lease)).
//!
//! A hold on the lease records the lease key's name in the lock; the scripts treat a lock whose
//! lease key is gone as free. One `PEXPIRE` of the lease key then renews every such hold, and the
//! locks' own keys, which live [`KEY_LEASES`] leases, are refreshed only now and then. A lease
//! key that ran out is never brought back: the client starts a new one (a new *session*, by
//! number), and holds of an old session are over.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, OnceLock, PoisonError},
    time::Duration,
};

use crate::{
    backend::{Grant, LockKind, Renew},
    clock::BootInstant,
    lease::Lease,
    lock_key::LockKey,
};

/// How many client leases a lock's own key lives: its key is refreshed (owner-checked, one call
/// per lock) once half of that has passed (less the spread of [`spread`]), so one in about
/// twenty renewals of a lock touches it.
pub(super) const KEY_LEASES: u32 = 20;

/// The client lease of one backend.
pub(super) struct ClientLease {
    /// The client's id in the lease key's name.
    id: String,
    /// The lease's length, in milliseconds: that of the first watchdog lease it serves. Holds
    /// with a watchdog lease of another length keep a lease of their own.
    millis: OnceLock<u64>,
    state: Mutex<State>,
    /// Serializes the start of a session, which takes a round trip.
    starting: tokio::sync::Mutex<()>,
}

struct State {
    /// The current session's number; sessions count from 1 (0 means no session).
    session: u64,
    /// Its lease key, once named (from the first lock's prefix).
    key: Option<Arc<str>>,
    /// Whether the key was created on the server.
    started: bool,
    /// For each lock of the current session, a time no later than the command that last made
    /// its key live [`KEY_LEASES`] leases.
    refreshed: HashMap<Box<str>, BootInstant>,
    /// When `refreshed` was last pruned of entries too old to matter.
    pruned: Option<BootInstant>,
    /// Until when the lease key certainly lives: a lease after the latest extension that
    /// succeeded was sent. Every hold on it has its deadline by then.
    alive_until: Option<BootInstant>,
}

impl State {
    /// Moves on to a new session, not yet named nor started.
    fn next_session(&mut self) {
        self.session += 1;
        self.key = None;
        self.started = false;
        self.refreshed.clear();
        self.alive_until = None;
    }
}

/// The session a grant is to live on: its number and lease key.
#[derive(Clone)]
pub(super) struct Session {
    pub(super) number: u64,
    pub(super) key: Arc<str>,
    pub(super) millis: u64,
    /// Nothing extended the lease key for a whole lease: it may have run out while idle, and a
    /// grant had better find out before it writes a lock that names it.
    pub(super) idle: bool,
}

impl Session {
    /// How long a lock's key on this session lives.
    pub(super) fn key_lease(&self) -> Lease {
        key_lease(self.millis)
    }

    /// `renew` as the owner-checked refresh of its lock's own key, for the key's life.
    pub(super) fn refresh<'a>(&self, renew: &Renew<'a>) -> Renew<'a> {
        Renew {
            lease: self.key_lease(),
            ..*renew
        }
    }
}

/// How long a lock's key lives on a client lease of `millis`: [`KEY_LEASES`] of them.
fn key_lease(millis: u64) -> Lease {
    Lease::watchdog(Duration::from_millis(millis) * KEY_LEASES)
}

/// What one renewal batch does about the client lease.
pub(super) struct LeasePlan {
    /// The session whose lease key to extend, when some renewals live on it.
    pub(super) session: Option<Session>,
    /// Renewals (by index) that need their lock's key refreshed, owner-checked, in this batch.
    pub(super) refresh: Vec<usize>,
    /// Renewals (by index) whose session ended: not held.
    pub(super) ended: Vec<usize>,
    /// Renewals (by index) answered by the lease key's extension alone.
    pub(super) on_lease: Vec<usize>,
}

impl ClientLease {
    pub(super) fn new() -> Self {
        Self {
            id: uuid::Uuid::new_v4().simple().to_string(),
            millis: OnceLock::new(),
            state: Mutex::new(State {
                session: 1,
                key: None,
                started: false,
                refreshed: HashMap::new(),
                pruned: None,
                alive_until: None,
            }),
            starting: tokio::sync::Mutex::new(()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `grant` lives on the client lease: an exclusive lock with a watchdog lease of
    /// the client lease's length (the first such grant sets it).
    pub(super) fn serves(&self, grant: &Grant<'_>) -> bool {
        grant.kind == LockKind::Exclusive
            && grant.lease.is_renewed()
            && *self.millis.get_or_init(|| grant.lease.millis()) == grant.lease.millis()
    }

    /// The current session, started on the server first if it is not yet: `start` runs the
    /// command that creates the lease key `name` for `millis` (`SET name 1 NX PX millis`).
    pub(super) async fn session<E>(
        &self,
        key: &LockKey,
        start: impl AsyncFnOnce(&str, u64) -> Result<(), E>,
    ) -> Result<Session, E> {
        let millis = self.millis.get().copied().unwrap_or(1);
        if let Some(session) = self.started(key, millis) {
            return Ok(session);
        }
        let _starting = self.starting.lock().await;
        if let Some(session) = self.started(key, millis) {
            return Ok(session);
        }
        let (number, name) = {
            let state = self.state();
            (state.session, state.key.clone())
        };
        let name = name.expect("named by `started`");
        let sent_at = BootInstant::now();
        start(&name, millis).await?;
        let mut state = self.state();
        if state.session == number {
            state.started = true;
            state.alive_until = Some(sent_at + Duration::from_millis(millis));
            tracing::debug!(lease = %name, "client lease started");
        }
        Ok(Session {
            number,
            key: name,
            millis,
            idle: false,
        })
    }

    /// How long a lock's key on the client lease lives.
    pub(super) fn key_lease(&self) -> Lease {
        key_lease(self.millis.get().copied().unwrap_or(1))
    }

    /// The current session when it has started; names its key (from `key`'s prefix) if that
    /// is not done yet.
    fn started(&self, key: &LockKey, millis: u64) -> Option<Session> {
        let mut state = self.state();
        if state.key.is_none() {
            let name = key.as_str();
            let prefix = &name[..name.rfind('{').unwrap_or(name.len())];
            state.key = Some(format!("{prefix}~lease:{}:{}", self.id, state.session).into());
        }
        let idle = state
            .alive_until
            .is_some_and(|until| until <= BootInstant::now());
        state.started.then(|| Session {
            number: state.session,
            key: state.key.clone().expect("named above"),
            millis,
            idle,
        })
    }

    /// Records that an extension of `session`'s lease key sent at `sent_at` succeeded.
    pub(super) fn extended(&self, session: u64, sent_at: BootInstant) {
        let Some(millis) = self.millis.get().copied() else {
            return;
        };
        let mut state = self.state();
        if state.session == session {
            let until = sent_at + Duration::from_millis(millis);
            state.alive_until = Some(state.alive_until.map_or(until, |at| at.max(until)));
        }
    }

    /// Ends `session` after a command sent at `sent_at` found its lease key gone: every hold on
    /// it is over, and the next grant starts a new session.
    pub(super) fn ended(&self, session: u64, sent_at: BootInstant) {
        let mut state = self.state();
        if state.session != session {
            return;
        }
        // Gone while it should have lived: a stall, a restart, an eviction. Otherwise it ran out
        // while nothing was held on it (nothing renews an idle lease), and nothing is lost.
        if state.alive_until.is_some_and(|until| until > sent_at) {
            if let Some(key) = &state.key {
                tracing::warn!(lease = %key, "client lease ran out: every hold on it is lost");
            }
            crate::metrics::client_lease_ended();
        } else {
            tracing::debug!("client lease ran out while idle; starting a new one");
        }
        state.next_session();
    }

    /// Sorts the renewals of one batch sent at `now`: those on the current session are answered
    /// by extending its lease key, and the few whose lock's key is due for a refresh are also
    /// renewed one by one; those on an ended session are over. A lock's key lives
    /// [`KEY_LEASES`] leases from its grant, so its first renewal needs no refresh.
    pub(super) fn plan(&self, renewals: &[Renew<'_>], now: BootInstant) -> LeasePlan {
        let mut plan = LeasePlan {
            session: None,
            refresh: Vec::new(),
            ended: Vec::new(),
            on_lease: Vec::new(),
        };
        let mut state = self.state();
        let Some(millis) = self.millis.get().copied() else {
            plan.ended = (0..renewals.len())
                .filter(|&i| renewals[i].session != 0)
                .collect();
            return plan;
        };
        let key_lease = Duration::from_millis(millis) * KEY_LEASES;
        if state.pruned.is_none_or(|at| now >= at + key_lease / 4) {
            state
                .refreshed
                .retain(|_, at| now.duration_since(*at) < key_lease);
            state.pruned = Some(now);
        }
        let current = state.session;
        for (i, renew) in renewals.iter().enumerate() {
            if renew.session == 0 || renew.queued {
                continue;
            }
            if renew.session != current || !state.started {
                plan.ended.push(i);
                continue;
            }
            let at = match state.refreshed.get(renew.key.as_str()) {
                Some(at) => *at,
                None => {
                    let at = first_seen(renew.key, now, Duration::from_millis(millis));
                    state.refreshed.insert(renew.key.as_str().into(), at);
                    at
                }
            };
            if now.duration_since(at) >= key_lease / 2 {
                plan.refresh.push(i);
            } else {
                plan.on_lease.push(i);
            }
        }
        if !plan.refresh.is_empty() || !plan.on_lease.is_empty() {
            plan.session = Some(Session {
                number: current,
                key: state.key.clone().expect("a started session is named"),
                millis,
                idle: false,
            });
        }
        plan
    }

    /// Records that the lock `key`'s own key was refreshed by a renewal sent at `sent_at`.
    pub(super) fn refreshed(&self, session: u64, key: &LockKey, sent_at: BootInstant) {
        let Some(millis) = self.millis.get().copied() else {
            return;
        };
        let at = sent_at - spread(key, Duration::from_millis(millis));
        let mut state = self.state();
        if state.session == session {
            state.refreshed.insert(key.as_str().into(), at);
        }
    }
}

/// A time no later than the grant that made the key of a lock first renewed at `now` live
/// [`KEY_LEASES`] leases: that grant was less than one lease before (else the hold would be
/// over, and not renewed); two leases are allowed, and the spread.
fn first_seen(key: &LockKey, now: BootInstant, lease: Duration) -> BootInstant {
    now - lease * 2 - spread(key, lease)
}

/// How much earlier than it happened a refresh of `key` is recorded: up to a quarter of a
/// key's life, by the key's hash, so that locks taken together spread their refreshes over
/// many renewals. Earlier is safe: the key is only refreshed sooner.
fn spread(key: &LockKey, lease: Duration) -> Duration {
    (lease * KEY_LEASES / 4).mul_f64((key.name_hash() % 1024) as f64 / 1024.0)
}
