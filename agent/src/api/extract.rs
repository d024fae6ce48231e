//! Request extractors that answer bad input with the native error body: JSON with the
//! offending field named (never axum's 422), explicit body limits (413), content type (415).

use axum::body::Body;
use axum::extract::{FromRequest, Request};
use axum::http::{StatusCode, header};
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// Native JSON bodies are small; uploads stream elsewhere.
pub const JSON_LIMIT: usize = 4 << 20;

pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, ApiError> {
        // Any content type is accepted (curl's `-d` says form-urlencoded); the body must be JSON.
        let bytes = read_body(req, JSON_LIMIT, false).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(ApiError::bad_request(
                "the request body is empty; expected a JSON object",
            ));
        }
        let de = &mut serde_json::Deserializer::from_slice(&bytes);
        match serde_path_to_error::deserialize(de) {
            Ok(v) => Ok(ApiJson(v)),
            Err(e) => {
                let path = e.path().to_string();
                let inner = e.into_inner();
                let msg = if path == "." || path.is_empty() {
                    format!("invalid JSON body: {inner}")
                } else {
                    format!("invalid field `{path}`: {inner}")
                };
                Err(ApiError::bad_request(msg))
            }
        }
    }
}

/// Reads a whole body up to `limit` bytes (413 beyond), checking for a JSON content type when
/// asked (absent is accepted; anything else is 415).
pub async fn read_body(req: Request, limit: usize, json: bool) -> Result<bytes::Bytes, ApiError> {
    if json
        && let Some(ct) = req.headers().get(header::CONTENT_TYPE)
        && !is_json(ct.to_str().unwrap_or(""))
    {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "send the body as application/json",
        ));
    }
    if let Some(len) = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        && len > limit as u64
    {
        return Err(too_large(limit));
    }
    let body: Body = req.into_body();
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        if is_length_limit(&e) {
            too_large(limit)
        } else {
            ApiError::bad_request(format!("cannot read the request body: {e}"))
        }
    })
}

fn is_length_limit(e: &axum::Error) -> bool {
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = src {
        if s.to_string().contains("length limit exceeded") {
            return true;
        }
        src = s.source();
    }
    false
}

fn too_large(limit: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
        format!("the request body exceeds {limit} bytes"),
    )
}

/// `application/json` or `application/*+json`, parameters ignored.
pub fn is_json(content_type: &str) -> bool {
    let mime = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json"))
}
