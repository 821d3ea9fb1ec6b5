use axum::extract::Path;
use tower_lock::locked;

#[locked(key = "account:{id}", wait = "2 seconds")]
async fn withdraw(Path(id): Path<u64>) -> String {
    id.to_string()
}

#[locked(key = "account:{id}", lease = "1ms")]
async fn too_short(Path(id): Path<u64>) -> String {
    id.to_string()
}

fn main() {}
