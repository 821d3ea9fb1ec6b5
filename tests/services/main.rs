//! `LockLayer` and `#[locked]` in front of services: a tonic gRPC service over HTTP/2, and
//! which locks a layer and a handler say they take.

#[path = "../support/mod.rs"]
mod support;

mod grpc;
mod lock_names;
