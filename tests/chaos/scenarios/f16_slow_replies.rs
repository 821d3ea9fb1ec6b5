//! F16 (K3): replies take longer than the lease (600 ms against 500 ms). An acquire whose
//! answer comes back after its lease ran out must not report success, and the key it took must
//! be cleaned up.

use std::time::Duration;

use tower_lock::Lease;

use super::{Bed, Topology};
use crate::{
    checker,
    proxy::{Mode, Proxy},
    run,
};

const LEASE: Duration = Duration::from_millis(500);
const DELAY: Duration = Duration::from_millis(600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f16_late_acquire_reply_is_not_success() {
    let mut bed = Bed::new("F16", Topology::Single).await;
    let runs = run::count(5, 100);
    let proxy = Proxy::start(bed.redis.url()).await;
    let client = bed.client_via(&proxy.url(), Duration::from_secs(2)).await;
    let warm = client.lock("warm").acquire().await.expect("warm-up");
    warm.release().await.expect("warm-up release");

    let mut false_successes = 0;
    let mut cleanup = Vec::new();
    for run in 0..runs {
        let key = format!("k{run}");
        let name = bed.lock_key(&key);
        proxy.set(Mode::Delay { up: Duration::ZERO, down: DELAY });
        let outcome = client
            .lock(&key)
            .lease(Lease::watchdog(LEASE))
            .wait(Duration::from_secs(1))
            .acquire()
            .await;
        let answered = tokio::time::Instant::now();
        proxy.set(Mode::Pass);
        match outcome {
            Ok(guard) => {
                false_successes += 1;
                drop(guard);
            }
            Err(error) => assert!(
                matches!(error, tower_lock::LockError::Backend(_) | tower_lock::LockError::Lost),
                "run {run}: {error:?}"
            ),
        }
        let node = bed.redis.clone();
        let gone = super::eventually(Duration::from_secs(2), || {
            node.cmd(&["EXISTS", &name]).as_int() == 0
        })
        .await;
        assert!(gone, "run {run}: the late acquire's key stayed");
        cleanup.push(answered.elapsed());
    }
    let leaks = checker::server_settled(&bed.redis, &bed.prefix).await;
    let s = &mut bed.scenario;
    s.figure("runs", runs);
    s.figure("false_successes", format!("{false_successes}/{runs}"));
    s.figure_ms("key_gone_after_answer_p99_ms", &cleanup, 0.99);
    s.figure("leaked_keys", leaks.count());
    s.report();
    assert_eq!(false_successes, 0, "an acquire answered after its lease reported success");
    assert_eq!(leaks.count(), 0, "{leaks:?}");
}
