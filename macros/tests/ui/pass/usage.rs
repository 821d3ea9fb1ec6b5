//! The forms the documentation shows, routed as axum handlers.

use axum::{
    Json, Router,
    extract::{FromRef, FromRequestParts, Path, State},
    http::{StatusCode, request::Parts},
    response::IntoResponse,
    routing::{get, post},
};
use serde::{Deserialize, Serialize};
use tower_lock::{AnyLockClient, LockClient, LockContext, MemoryBackend, locked};

#[derive(Deserialize)]
struct Withdrawal {
    amount: u64,
}

#[derive(Serialize)]
struct Balance {
    amount: u64,
}

struct AppError;

impl IntoResponse for AppError {
    fn into_response(self) -> axum::response::Response {
        StatusCode::CONFLICT.into_response()
    }
}

#[locked(key = "account:{id}", wait = "2s")]
async fn withdraw(Path(id): Path<u64>, Json(w): Json<Withdrawal>) -> Result<Json<Balance>, AppError> {
    let amount = w.amount.checked_sub(id).ok_or(AppError)?;
    Ok(Json(Balance { amount }))
}

#[derive(Clone, FromRef)]
struct App {
    locks: LockClient<MemoryBackend>,
}

struct User {
    tenant: String,
}

impl<S: Send + Sync> FromRequestParts<S> for User {
    type Rejection = StatusCode;

    async fn from_request_parts(_: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Self { tenant: "acme".to_owned() })
    }
}

#[locked(key = "doc:{doc_id}:{user.tenant}", fair, lease = "10s", fencing)]
async fn edit(
    State(app): State<App>,
    Path((doc_id, _)): Path<(u64, String)>,
    user: User,
    lock: LockContext,
) -> impl IntoResponse {
    let _ = (app, lock.fencing_token());
    format!("{doc_id} {}", user.tenant)
}

#[locked(key = "report:{id}", read, lease = "watchdog(5s)", on_lost = "continue", name = "reports")]
async fn read_report(Path(id): Path<u64>) -> String {
    id.to_string()
}

#[locked(key = "{{literal}}", write, wait = "250ms", lease = "watchdog")]
async fn no_arguments() {}

// At most four exports per tenant at once, across instances.
#[locked(key = "exports:{tenant}", permits = 4, wait = "1s")]
async fn export(Path(tenant): Path<String>) -> String {
    tenant
}

#[derive(Deserialize)]
struct Transfer {
    from: u64,
    to: u64,
    amount: u64,
}

// The body's fields name the locks: the `Json` binding is visible to the templates.
#[locked(keys = ["account:{t.from}", "account:{t.to}"], wait = "2s", fencing)]
async fn transfer(lock: LockContext, Json(t): Json<Transfer>) -> String {
    let from = format!("account:{}", t.from);
    format!("{} {:?}", t.amount, lock.fencing_token_of(from))
}

fn main() {
    let app = App { locks: LockClient::in_memory() };
    let _: Router = Router::new()
        .route("/accounts/{id}/withdraw", post(withdraw))
        .route("/docs/{doc_id}/{rev}", post(edit))
        .route("/reports/{id}", get(read_report))
        .route("/literal", post(no_arguments))
        .route("/exports/{tenant}", post(export))
        .route("/transfers", post(transfer))
        .layer(axum::Extension(AnyLockClient::from(app.locks.clone())))
        .with_state(app);
}
