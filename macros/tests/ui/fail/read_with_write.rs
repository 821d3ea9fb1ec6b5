use axum::extract::Path;
use tower_lock::locked;

#[locked(key = "report:{id}", read, write)]
async fn report(Path(id): Path<u64>) -> String {
    id.to_string()
}

#[locked(key = "report:{id}", fair, read)]
async fn fair_read(Path(id): Path<u64>) -> String {
    id.to_string()
}

fn main() {}
