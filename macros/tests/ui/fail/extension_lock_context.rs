use axum::{Extension, extract::Path};
use tower_lock::{LockContext, locked};

#[locked(key = "account:{id}")]
async fn withdraw(Path(id): Path<u64>, Extension(lock): Extension<LockContext>) -> String {
    format!("{id} {}", lock.key())
}

fn main() {}
