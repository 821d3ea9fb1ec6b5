use axum::{Router, routing::post};
use tower_lock::{LockClient, LockLayer};

async fn withdraw() {}

fn main() {
    let _app: Router = Router::new()
        .route("/accounts/{id}/withdraw", post(withdraw))
        .route_layer(LockLayer::new(LockClient::in_memory()));
}
