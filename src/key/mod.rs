//! Where a request's lock key comes from: [`MakeKey`] and the extractors that build one from a
//! path segment, a route parameter, a query parameter, a header or a closure; and the
//! extractors of several keys ([`all`], [`from_fn_many`]) for requests that touch several
//! resources at once.
//!
//! What a key becomes in the backend (escaping, the hash tag, the length limit) is
//! [`LockKey`]'s part.

mod extract;
mod set;

pub use extract::{
    FromFn, Header, Keys, MakeKey, PathSegment, Prefixed, Query, from_fn, header, path_segment,
    query,
};
#[cfg(feature = "grpc")]
pub use extract::{GrpcMethod, grpc_method};
#[cfg(feature = "axum")]
pub use extract::{PathParam, path_param};
#[cfg(feature = "macros")]
pub(crate) use extract::{RouteReports, route_through_param};

pub use set::{All, FromFnMany, all, from_fn_many};

pub use crate::lock_key::{DEFAULT_MAX_KEY_LEN, KeyError, LockKey};
