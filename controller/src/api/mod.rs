//! The controller's HTTP surface. Handlers are thin: parse, call the domain, map the error.

mod control;
mod proxy;
mod routes;
mod session;
pub(crate) mod workpieces;

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use berth_protocol::ErrorBody;
use berth_protocol::ops::Routes;
use berth_protocol::routes::header::API_KEY as API_KEY_HEADER;
use subtle::ConstantTimeEq;

use crate::controller::Controller;
use crate::error::Error;
use crate::http::{ApiError, JSON_LIMIT};

#[derive(Clone)]
pub struct ApiState {
    pub c: Arc<Controller>,
    /// SHA-256 of every accepted API key.
    pub key_hashes: Arc<Vec<[u8; 32]>>,
}

impl ApiState {
    /// Constant-time check of a presented key against every accepted one.
    pub fn key_ok(&self, headers: &HeaderMap) -> bool {
        let Some(key) = headers.get(API_KEY_HEADER).and_then(|v| v.to_str().ok()) else {
            return false;
        };
        let presented = hash(key);
        let mut ok = subtle::Choice::from(0u8);
        for h in self.key_hashes.iter() {
            ok |= h.ct_eq(&presented);
        }
        ok.into()
    }
}

pub fn hash(key: &str) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(key.as_bytes()).into()
}

pub fn router(state: ApiState) -> Router {
    let keyed = routes::keyed()
        .merge(workpieces::keyed())
        .merge(control::keyed())
        .merge(crate::mcp::router(state.c.clone()))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_key,
        ));
    Routes::new()
        .merge(routes::open())
        .merge(proxy::viewer_routes())
        .merge(session::routes())
        .merge(keyed)
        .fallback(|| async {
            ApiError(Error::NotFound(
                "no such route (see docs/src/controller/api.md for the API)".into(),
            ))
        })
        .layer(axum::extract::DefaultBodyLimit::max(JSON_LIMIT))
        .layer(axum::middleware::from_fn(fill_errors))
        .finish(&berth_protocol::ops::CONTROLLER)
        .with_state(state)
}

/// Errors axum answers itself — an empty body (405 with its `Allow`) or its `text/plain`
/// rejection text (a path segment that is not UTF-8, …) — get the error body too, keeping the
/// status, headers and axum's message.
async fn fill_errors(req: Request, next: Next) -> Response {
    match berth_protocol::serve::FrameworkError::take(next.run(req).await).await {
        Ok(e) => {
            let body =
                serde_json::to_string(&ErrorBody::new(e.code(), e.message())).unwrap_or_default();
            e.answer(body)
        }
        Err(resp) => resp,
    }
}

async fn require_key(State(s): State<ApiState>, req: Request, next: Next) -> Response {
    if !s.key_ok(req.headers()) {
        return ApiError(Error::Unauthorized(
            "missing or wrong X-Api-Key header".into(),
        ))
        .into_response();
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::fake::FakeProvider;

    /// `Routes::finish` refuses a router that serves an operation twice, at the wrong path, or
    /// not at all: building the controller's proves it serves its document exactly.
    #[tokio::test]
    async fn the_router_serves_the_controllers_document_exactly() {
        let d = tempfile::tempdir().unwrap();
        let fake = FakeProvider::new("process");
        let c = crate::controller::controller_on(d.path(), &fake, Default::default());
        let served = berth_protocol::ops::CONTROLLER.operations().count();
        let _router = router(ApiState {
            c,
            key_hashes: Arc::new(vec![hash("k")]),
        });
        println!("the controller's router serves its {served} documented operations");
        assert!(served > 40, "{served} operations");
    }
}
