//! F18 (foreign data): a string already sits at the lock's key. Every kind of lock must fail
//! with a typed error naming the key and the type, leave the data alone, and not hang.

use std::time::Duration;

use tower_lock::{LockError, error::BackendErrorKind};

use super::{Bed, Topology};

const WAIT: Duration = Duration::from_millis(500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f18_foreign_data_is_reported_not_overwritten() {
    let mut bed = Bed::new("F18", Topology::Single).await;
    let client = bed.client().await;
    let plain = bed.lock_key("plain");
    let fair = bed.lock_key("fair");
    let rw = format!("{}:rw", bed.lock_key("rw"));
    for name in [&plain, &fair, &rw] {
        bed.redis.cmd(&["SET", name, "foreign"]);
    }
    let attempts = [
        (&plain, client.lock("plain").wait(WAIT).acquire().await),
        (&fair, client.fair_lock("fair").wait(WAIT).acquire().await),
        (&rw, client.read_write_lock("rw").write().wait(WAIT).acquire().await),
        (&rw, client.read_write_lock("rw").read().wait(WAIT).acquire().await),
    ];
    let (mut typed, mut overwrites) = (0, 0);
    let mut kinds = Vec::new();
    for (name, outcome) in attempts {
        match outcome {
            Err(LockError::Backend(error)) => {
                kinds.push(format!("{:?}", error.kind()));
                let names_type = matches!(error.kind(), BackendErrorKind::WrongType { found } if found == "string");
                if names_type && error.key() == Some(name.as_str()) {
                    typed += 1;
                }
            }
            other => panic!("{name}: foreign data gave {other:?}"),
        }
        if bed.redis.cmd(&["GET", name]).as_str().as_deref() != Some("foreign") {
            overwrites += 1;
        }
    }
    let s = &mut bed.scenario;
    s.figure("attempts", 4);
    s.figure("typed_errors", format!("{typed}/4"));
    s.figure("overwrites", overwrites);
    s.figure("error_kinds", kinds.join(","));
    s.report();
    assert_eq!(typed, 4, "errors must say wrong type `string` and name the key: {kinds:?}");
    assert_eq!(overwrites, 0, "foreign data was overwritten");
}
