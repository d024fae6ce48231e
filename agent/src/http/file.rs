//! Serving a file's bytes over HTTP with one `Range` honoured.

use std::path::Path;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use berth_protocol::range::parse_range;
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use super::error::ApiError;

/// Serves the first `len` bytes of `path` as `video/mp4`, honouring one `Range: bytes=` range.
pub async fn serve_prefix(
    path: &Path,
    len: u64,
    headers: &HeaderMap,
    filename: &str,
) -> Result<Response, ApiError> {
    let mut f = tokio::fs::File::open(path).await.map_err(|e| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("{}: {e}", path.display()),
        )
    })?;
    let range = match headers.get(header::RANGE).and_then(|v| v.to_str().ok()) {
        None => None,
        Some(r) => match parse_range(r, len) {
            Some(r) => Some(r),
            None => {
                let mut resp = ApiError::new(
                    StatusCode::RANGE_NOT_SATISFIABLE,
                    "range_not_satisfiable",
                    format!("cannot serve {r} of {len} bytes"),
                )
                .into_response();
                if let Ok(v) = HeaderValue::from_str(&format!("bytes */{len}")) {
                    resp.headers_mut().insert(header::CONTENT_RANGE, v);
                }
                return Ok(resp);
            }
        },
    };
    let (start, end) = range.unwrap_or((0, len.saturating_sub(1)));
    let count = if len == 0 { 0 } else { end - start + 1 };
    f.seek(std::io::SeekFrom::Start(start)).await?;
    let body = Body::from_stream(tokio_util::io::ReaderStream::new(f.take(count)));
    let mut resp = Response::new(body);
    *resp.status_mut() = if range.is_some() {
        StatusCode::PARTIAL_CONTENT
    } else {
        StatusCode::OK
    };
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("video/mp4"));
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(count));
    if range.is_some()
        && let Ok(v) = HeaderValue::from_str(&format!("bytes {start}-{end}/{len}"))
    {
        h.insert(header::CONTENT_RANGE, v);
    }
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename={filename}")) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    Ok(resp)
}
