//! Clients that contend as separate processes would on one lock store: clones of one
//! `MemoryBackend`, or each with its own connections to a `redis-server` the fixture started.
//! Tests that check one semantics on every store build their clients here.

use std::{future::Future, pin::Pin};

use tower_lock::{Backend, LockClient, MemoryBackend, RedisBackend};

use super::RedisServer;

/// Builds another client on the same store (another "process").
pub type MoreClients<B> = Box<dyn Fn() -> Pin<Box<dyn Future<Output = LockClient<B>>>>>;

/// Two clients on one store, a way to make more, and what keeps the store alive.
pub struct Env<B: Backend> {
    pub a: LockClient<B>,
    pub b: LockClient<B>,
    pub more: MoreClients<B>,
    /// The Redis server behind the clients, if any; dropped last, after them.
    pub server: Option<RedisServer>,
}

/// Clients on clones of one `MemoryBackend`, each made by `build`.
pub async fn in_memory(
    build: fn(MemoryBackend) -> LockClient<MemoryBackend>,
) -> Env<MemoryBackend> {
    let backend = MemoryBackend::new();
    let more = backend.clone();
    Env {
        a: build(backend.clone()),
        b: build(backend),
        more: Box::new(move || {
            let backend = more.clone();
            Box::pin(async move { build(backend) })
        }),
        server: None,
    }
}

/// Clients on a fresh `redis-server`, each with its own connections, made by `build`.
pub async fn on_redis(build: fn(RedisBackend) -> LockClient<RedisBackend>) -> Env<RedisBackend> {
    let server = RedisServer::start();
    let url = server.url();
    let connect = move || {
        let url = url.clone();
        Box::pin(async move { build(super::redis_backend(&url).connect().await.unwrap()) })
            as Pin<Box<dyn Future<Output = _>>>
    };
    Env { a: connect().await, b: connect().await, more: Box::new(connect), server: Some(server) }
}
