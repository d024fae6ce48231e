//! Request extractors that answer bad input with the native error body: JSON with the
//! offending field named (never axum's 422), explicit body limits (413), content type (415).

use axum::body::Body;
use axum::extract::{FromRequest, Request};
use axum::http::{StatusCode, header};
use futures_util::StreamExt;
use serde::de::DeserializeOwned;

use crate::http::error::ApiError;

/// Native JSON bodies are small; uploads stream elsewhere.
pub const JSON_LIMIT: usize = 4 << 20;

pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, ApiError> {
        // The body must be declared JSON (`application/json` or `application/*+json`) or come
        // as `curl -d` sends it (labelled a form, or with no type: read as JSON, as the
        // controller, which relays such bodies here, reads its own); any other content type is
        // a 415 and the body is not parsed.
        let bytes = read_body(req, JSON_LIMIT, true).await?;
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
/// asked (JSON, a form or none; anything else is a 415, the body drained so the client reads
/// it).
pub async fn read_body(req: Request, limit: usize, json: bool) -> Result<bytes::Bytes, ApiError> {
    let json_declared = req
        .headers()
        .get(header::CONTENT_TYPE)
        .is_none_or(|ct| read_as_json(ct.to_str().unwrap_or("")));
    if json && !json_declared {
        drain(req.into_body()).await;
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "send the body as application/json",
        ));
    }
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let body: Body = req.into_body();
    if declared.is_some_and(|len| len > limit as u64) {
        drain(body).await;
        return Err(too_large(limit));
    }
    let mut stream = body.into_data_stream();
    let mut buf = bytes::BytesMut::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk
            .map_err(|e| ApiError::bad_request(format!("cannot read the request body: {e}")))?;
        if buf.len() + chunk.len() > limit {
            drain(Body::from_stream(stream)).await;
            return Err(too_large(limit));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}

/// Reads and discards a rejected body (up to a bound) so the client, still sending, can read
/// the error instead of hitting a reset connection.
pub(crate) async fn drain(body: Body) {
    const DRAIN_MAX: usize = 64 << 20;
    let mut stream = body.into_data_stream();
    let mut seen = 0;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while let Ok(Some(Ok(chunk))) = tokio::time::timeout_at(deadline, stream.next()).await {
        seen += chunk.len();
        if seen > DRAIN_MAX {
            break;
        }
    }
}

fn too_large(limit: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
        format!("the request body exceeds {limit} bytes"),
    )
}

/// A JSON body's declared type as `curl -d` sends it: JSON, or a form.
fn read_as_json(content_type: &str) -> bool {
    is_json(content_type)
        || content_type
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .eq_ignore_ascii_case("application/x-www-form-urlencoded")
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
