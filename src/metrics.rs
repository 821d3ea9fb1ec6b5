//! The names of the metrics the crate records through the `metrics` facade when built with the
//! `metrics` feature (install any `metrics` recorder, e.g. a Prometheus exporter, to see them).
//! Without the feature nothing is recorded.
//!
//! Labels take values from fixed sets, never a user key (request data as a label would let
//! clients grow the series without bound):
//! - `kind`: `exclusive`, `fair`, `read`, `write`, `semaphore`;
//! - `outcome` of a wait: `acquired`, `timeout`, `error`; of a renewal: `renewed`, `not_held`,
//!   `failed`; of a renewal batch: `ok`, `failed`;
//! - `reason` of an acquire error: `invalid_key`, `invalid_lease`, `invalid_permits`, `too_many_waiters`,
//!   `backend`, `upgrade_refused`, `lost`, `not_held`, `shut_down`, `other`; of a rejection:
//!   `missing_key`, `invalid_key`, `locked`, `conflict`, `misconfigured`, `too_many_waiters`,
//!   `unavailable`, `lost`, `shut_down`.

use std::time::Duration;

use crate::{
    backend::{LockKind, store::RenewReply},
    error::LockError,
};

/// Locks acquired (re-entries included). Label `kind`.
pub const ACQUISITIONS: &str = "tower_lock_acquisitions_total";
/// Acquires that gave up because the wait ran out. Label `kind`.
pub const TIMEOUTS: &str = "tower_lock_timeouts_total";
/// Acquires that failed for another reason. Labels `kind`, `reason`.
pub const ACQUIRE_ERRORS: &str = "tower_lock_acquire_errors_total";
/// Seconds from asking for a lock to getting it or giving up. Labels `kind`, `outcome`.
pub const WAIT_SECONDS: &str = "tower_lock_wait_seconds";
/// Seconds a lock was held, recorded when a release frees it or hands it on. Label `kind`.
pub const HOLD_SECONDS: &str = "tower_lock_hold_seconds";
/// Held locks found lost (lease ran out, or another owner). Label `kind`.
pub const LOSSES: &str = "tower_lock_losses_total";
/// Lease renewals by the watchdog. Labels `kind`, `outcome`.
pub const RENEWALS: &str = "tower_lock_renewals_total";
/// Seconds one watchdog tick's renewals took: every lease and queue place due at once goes to
/// the backend in one call (one round trip per node), so the sample count is the number of
/// round trips the watchdog made. Label `outcome`: `ok` or `failed`.
pub const RENEWAL_BATCH_SECONDS: &str = "tower_lock_renewal_batch_seconds";
/// Requests the lock layer answered without running them. Label `reason`. (Recorded by the
/// middleware itself: the engine knows nothing of rejections.)
pub const REJECTIONS: &str = "tower_lock_rejections_total";
/// Acquires waiting right now, across clients.
pub const WAITERS: &str = "tower_lock_waiters";
/// Locks an operator freed with `LockClient::force_unlock` while someone held them. Label
/// `kind` (of the hold cleared).
pub const FORCE_UNLOCKS: &str = "tower_lock_force_unlocks_total";

/// An acquire of a `kind` lock ended after `waited`.
pub(crate) fn acquire_finished(kind: LockKind, result: Result<(), &LockError>, waited: Duration) {
    #[cfg(feature = "metrics")]
    {
        let kind = kind_label(kind);
        let outcome = match result {
            Ok(()) => {
                ::metrics::counter!(ACQUISITIONS, "kind" => kind).increment(1);
                "acquired"
            }
            Err(LockError::WaitTimeout { .. }) => {
                ::metrics::counter!(TIMEOUTS, "kind" => kind).increment(1);
                "timeout"
            }
            Err(error) => {
                let reason = error_reason(error);
                ::metrics::counter!(ACQUIRE_ERRORS, "kind" => kind, "reason" => reason)
                    .increment(1);
                "error"
            }
        };
        ::metrics::histogram!(WAIT_SECONDS, "kind" => kind, "outcome" => outcome)
            .record(waited.as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (kind, result, waited);
}

/// A lock of `kind` taken at `acquired_at` was freed or handed on: how long it was held.
pub(crate) fn released(kind: LockKind, acquired_at: crate::clock::BootInstant) {
    #[cfg(feature = "metrics")]
    {
        let held_for = crate::clock::BootInstant::now().duration_since(acquired_at);
        ::metrics::histogram!(HOLD_SECONDS, "kind" => kind_label(kind))
            .record(held_for.as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (kind, acquired_at);
}

/// A held lock of `kind` was found lost.
pub(crate) fn lost(kind: LockKind) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(LOSSES, "kind" => kind_label(kind)).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = kind;
}

/// The watchdog renewed a `kind` lock with `reply`, or failed to reach the backend (`None`).
pub(crate) fn renewal(kind: LockKind, reply: Option<RenewReply>) {
    #[cfg(feature = "metrics")]
    {
        let outcome = match reply {
            Some(RenewReply::NotHeld) => "not_held",
            Some(_) => "renewed",
            None => "failed",
        };
        ::metrics::counter!(RENEWALS, "kind" => kind_label(kind), "outcome" => outcome)
            .increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (kind, reply);
}

/// The watchdog sent one batch of renewals, which took `took` and reached the backend (`ok`)
/// or not.
pub(crate) fn renewal_batch(took: Duration, ok: bool) {
    #[cfg(feature = "metrics")]
    {
        let outcome = if ok { "ok" } else { "failed" };
        ::metrics::histogram!(RENEWAL_BATCH_SECONDS, "outcome" => outcome)
            .record(took.as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (took, ok);
}

/// One more acquire waits (`true`), or one stopped waiting (`false`).
pub(crate) fn waiting(started: bool) {
    #[cfg(feature = "metrics")]
    {
        let gauge = ::metrics::gauge!(WAITERS);
        if started {
            gauge.increment(1.0);
        } else {
            gauge.decrement(1.0);
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = started;
}

/// A lock held as `kind` was force-unlocked.
pub(crate) fn force_unlocked(kind: LockKind) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(FORCE_UNLOCKS, "kind" => kind_label(kind)).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = kind;
}

#[cfg(feature = "metrics")]
fn kind_label(kind: LockKind) -> &'static str {
    match kind {
        LockKind::Exclusive => "exclusive",
        LockKind::Fair => "fair",
        LockKind::Read => "read",
        LockKind::Write => "write",
        LockKind::Semaphore => "semaphore",
    }
}

#[cfg(feature = "metrics")]
fn error_reason(error: &LockError) -> &'static str {
    match error {
        LockError::InvalidKey(_) => "invalid_key",
        LockError::TooManyWaiters => "too_many_waiters",
        LockError::Backend(_) => "backend",
        LockError::ShutDown => "shut_down",
        LockError::UpgradeRefused => "upgrade_refused",
        LockError::Lost => "lost",
        LockError::NotHeld => "not_held",
        LockError::InvalidLease(_) => "invalid_lease",
        LockError::InvalidPermits => "invalid_permits",
        _ => "other",
    }
}
