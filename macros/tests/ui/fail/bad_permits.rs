use axum::extract::Path;
use tower_lock::locked;

#[locked(key = "exports:{tenant}", permits = 0)]
async fn none(Path(tenant): Path<String>) -> String {
    tenant
}

#[locked(key = "exports:{tenant}", permits = 4, fencing)]
async fn fenced(Path(tenant): Path<String>) -> String {
    tenant
}

#[locked(key = "exports:{tenant}", fair, permits = 4)]
async fn fair(Path(tenant): Path<String>) -> String {
    tenant
}

#[locked(key = "exports:{tenant}", permits = "4")]
async fn quoted(Path(tenant): Path<String>) -> String {
    tenant
}

fn main() {}
