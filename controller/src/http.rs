//! The HTTP layer under the controller's surfaces (the REST API and MCP): the one error
//! funnel and extractors whose rejections carry the native error body. Neither surface
//! imports the other.

use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use berth_protocol::ErrorBody;

use crate::error::Error;

/// JSON bodies are small; file uploads stream past this limit.
pub const JSON_LIMIT: usize = 4 << 20;

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
            Error::Conflict(_) | Error::ConflictCode(..) => StatusCode::CONFLICT,
            Error::Forbidden(..) => StatusCode::FORBIDDEN,
            Error::Unprocessable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Error::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Error::Agent(_) | Error::Upstream(_) => StatusCode::BAD_GATEWAY,
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
