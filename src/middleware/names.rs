//! Says which locks a layer's or a `#[locked]` handler's requests take, once, when the first
//! request comes through: two routes that should exclude each other but name their locks
//! differently (`/accounts/{id}` + the id under a layer, `account:{id}` under an attribute)
//! show in the log before they run side by side. Logged as information on target
//! `tower_lock::names`.

use std::sync::{
    Mutex, PoisonError,
    atomic::{AtomicBool, Ordering},
};

/// What a layer or a handler has announced already.
#[derive(Debug, Default)]
#[doc(hidden)]
// Public for the attribute's generated code only (feature `macros`).
#[cfg_attr(not(feature = "macros"), allow(unreachable_pub, dead_code))]
pub struct Announced {
    /// Set once something was announced: after that, a request pays one atomic load.
    any: AtomicBool,
    /// The routes announced, at most [`MAX_ROUTES`] (a layer serves several routes).
    routes: Mutex<Vec<String>>,
}

/// Routes announced per layer at most: a layer used on many routes says which locks the
/// first ones take.
const MAX_ROUTES: usize = 64;

impl Announced {
    /// Nothing announced yet (a `const fn`, for a handler's `static` options).
    #[cfg_attr(not(feature = "macros"), allow(unreachable_pub, dead_code))]
    pub const fn new() -> Self {
        Self { any: AtomicBool::new(false), routes: Mutex::new(Vec::new()) }
    }

    /// Whether nothing was announced yet: the first request, checked with one load.
    pub(crate) fn is_first(&self) -> bool {
        !self.any.load(Ordering::Relaxed) && !self.any.swap(true, Ordering::Relaxed)
    }

    /// Whether `route` was not announced yet (it is from now on).
    pub(crate) fn first_for(&self, route: &str) -> bool {
        self.any.store(true, Ordering::Relaxed);
        let mut routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        if routes.len() >= MAX_ROUTES || routes.iter().any(|seen| seen == route) {
            return false;
        }
        routes.push(route.to_owned());
        true
    }
}

/// A layer's requests on `route` lock `namespace` + their key.
pub(crate) fn layer_takes(route: &str, namespace: &str, mode: &dyn std::fmt::Debug) {
    if namespace.is_empty() {
        tracing::info!(target: "tower_lock::names", route = %route, ?mode, "LockLayer: each request locks its key alone, which names its resource (a prefixed key, e.g. `account:` + the id)");
    } else {
        tracing::info!(target: "tower_lock::names", route = %route, namespace = %namespace, ?mode, "LockLayer: each request locks `{namespace}` + its key: only locks of this namespace exclude it");
    }
}

/// A `#[locked]` handler's requests on `route` lock `template` (under `namespace`, if any).
#[cfg(feature = "macros")]
pub(crate) fn handler_takes(route: &str, template: &str, namespace: &str, kind: crate::LockKind) {
    if namespace.is_empty() {
        tracing::info!(target: "tower_lock::names", route = %route, template = %template, ?kind, "#[locked]: each request locks `{template}`");
    } else {
        tracing::info!(target: "tower_lock::names", route = %route, template = %template, namespace = %namespace, ?kind, "#[locked]: each request locks `{namespace}` + `{template}`: only locks of this namespace exclude it");
    }
}
