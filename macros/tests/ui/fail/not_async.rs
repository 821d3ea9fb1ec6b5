use axum::extract::Path;
use tower_lock::locked;

#[locked(key = "account:{id}")]
fn withdraw(Path(id): Path<u64>) -> String {
    id.to_string()
}

fn main() {}
