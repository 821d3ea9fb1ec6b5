use axum::extract::Path;
use tower_lock::locked;

#[locked(key = "account:{id}", timeout = "2s")]
async fn withdraw(Path(id): Path<u64>) -> String {
    id.to_string()
}

#[locked(key = "account:{id}", on_lost = "retry")]
async fn bad_on_lost(Path(id): Path<u64>) -> String {
    id.to_string()
}

#[locked(wait = "2s")]
async fn no_key(Path(id): Path<u64>) -> String {
    id.to_string()
}

fn main() {}
