//! What the benches share: the measuring window, the runtime, and the Redis round trip every
//! figure is compared with.

use std::time::{Duration, Instant};

use tower_lock::backend::redis::redis;

/// The window of each workload: `BENCH_SECS` seconds (fractions allowed, e.g. `0.5`), 2 by
/// default.
pub(crate) fn window() -> Duration {
    std::env::var("BENCH_SECS")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|secs| secs.is_finite() && *secs > 0.0)
        .map_or(Duration::from_secs(2), Duration::from_secs_f64)
}

/// A two-worker runtime, the size of the machines these run on.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// The median round trip of `PING` on a multiplexed connection, as the engine uses.
pub(crate) async fn ping_rtt(url: &str) -> Duration {
    let client = redis::Client::open(url).expect("url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
    let mut samples = Vec::with_capacity(2000);
    for _ in 0..2000 {
        let start = Instant::now();
        let _: String = redis::cmd("PING").query_async(&mut conn).await.expect("ping");
        samples.push(start.elapsed());
    }
    samples.sort();
    samples[samples.len() / 2]
}
