use axum::extract::Path;
use tower_lock::locked;

#[locked(key = "account:{from}", keys = ["account:{from}", "account:{to}"])]
async fn both(Path((from, to)): Path<(u64, u64)>) -> String {
    format!("{from} {to}")
}

#[locked(keys = ["account:{from}"], key = "account:{from}")]
async fn both_other_order(Path((from, to)): Path<(u64, u64)>) -> String {
    format!("{from} {to}")
}

#[locked(keys = [])]
async fn empty(Path(id): Path<u64>) -> String {
    id.to_string()
}

#[locked(keys = ["account:{from}", 7])]
async fn not_a_template(Path(from): Path<u64>) -> String {
    from.to_string()
}

#[locked(keys = ["account:{from}", "account:{too}"])]
async fn unknown_binding(Path((from, to)): Path<(u64, u64)>) -> String {
    format!("{from} {to}")
}

fn main() {}
