//! The controller's HTTP surface. Handlers are thin: parse, call the domain, map the error.

mod proxy;
mod routes;
mod session;

pub(crate) use routes::sandbox_request;

use std::sync::Arc;

use axum::Router;
use axum::extract::{FromRequest, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use berth_protocol::ErrorBody;
use berth_protocol::routes::header::API_KEY as API_KEY_HEADER;
use subtle::ConstantTimeEq;

use crate::error::Error;
use crate::sandbox::Controller;

/// JSON bodies are small; file uploads stream past this limit.
pub const JSON_LIMIT: usize = 4 << 20;

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
        .merge(crate::mcp::router(state.c.clone()))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_key,
        ));
    Router::new()
        .merge(routes::open())
        .merge(proxy::viewer_routes())
        .merge(session::routes())
        .merge(keyed)
        .fallback(|| async {
            ApiError(Error::NotFound(
                "no such route (see the README for the API)".into(),
            ))
        })
        .layer(axum::extract::DefaultBodyLimit::max(JSON_LIMIT))
        .layer(axum::middleware::from_fn(fill_errors))
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

/// The one error funnel: the domain error's class becomes the status.
pub struct ApiError(pub Error);

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        ApiError(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = match &self.0 {
            Error::BadRequest(_) => StatusCode::BAD_REQUEST,
            Error::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Error::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Error::NotFound(_) => StatusCode::NOT_FOUND,
            Error::Conflict(_) => StatusCode::CONFLICT,
            Error::Unprocessable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Error::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Error::Agent(_) => StatusCode::BAD_GATEWAY,
            Error::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        if status.is_server_error() {
            tracing::warn!(status = %status, error = %self.0, "request failed");
        }
        (
            status,
            axum::Json(ErrorBody::new(self.0.code(), self.0.to_string())),
        )
            .into_response()
    }
}

/// `axum::Json` whose rejections (bad JSON, wrong types, wrong content type) are 400s with
/// the native error body, never axum's 422 text.
pub struct Json<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequest<S> for Json<T> {
    type Rejection = ApiError;

    async fn from_request(mut req: Request, state: &S) -> Result<Self, Self::Rejection> {
        // `curl -d '{…}'` (the seed's own quick start) labels its JSON a form; a body without a
        // type is read as JSON too. Any other declared type is refused.
        let declared = req
            .headers()
            .get(axum::http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| {
                v.split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase()
            });
        if declared
            .as_deref()
            .is_none_or(|t| t == "application/x-www-form-urlencoded")
        {
            req.headers_mut().insert(
                axum::http::header::CONTENT_TYPE,
                axum::http::HeaderValue::from_static("application/json"),
            );
        }
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(Json(v)),
            Err(e) => {
                let status = e.status();
                let msg = e.body_text();
                if status == StatusCode::PAYLOAD_TOO_LARGE {
                    return Err(ApiError(Error::TooLarge(format!(
                        "body larger than {JSON_LIMIT} bytes"
                    ))));
                }
                Err(ApiError(Error::BadRequest(msg)))
            }
        }
    }
}

/// `axum::extract::Query` with the native error body on a bad query string.
pub struct Query<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> axum::extract::FromRequestParts<S>
    for Query<T>
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| Query(q.0))
            .map_err(|e| ApiError(Error::BadRequest(e.body_text())))
    }
}
