//! `/v1/workpiece` (the engine) and `/v1/workpiece/file` (a workpiece file read or replaced
//! with the sandbox user's rights): what the controller's workpieces call.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Query, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use berth_protocol::UploadResult;
use berth_protocol::workpiece::MAX_FILE_BYTES;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{Map, Value};
use sha2::Digest;
use tokio::io::AsyncWriteExt;

use crate::Agent;
use crate::http::error::ApiError;
use crate::http::extract::ApiJson;

pub async fn engine(
    State(agent): State<Arc<Agent>>,
    ApiJson(req): ApiJson<Map<String, Value>>,
) -> Result<Response, ApiError> {
    Ok(Json(crate::workpiece::run(&agent, req).await?).into_response())
}

#[derive(Deserialize)]
pub struct FileQuery {
    path: Option<String>,
    sha256: Option<String>,
}

fn path_of(agent: &Agent, q: &FileQuery) -> Result<std::path::PathBuf, ApiError> {
    let p = q
        .path
        .as_deref()
        .ok_or_else(|| ApiError::bad_request("the `path` query parameter is required"))?;
    Ok(agent.files.resolve(p)?)
}

pub async fn read(State(agent): State<Arc<Agent>>, req: Request) -> Result<Response, ApiError> {
    let Query(q): Query<FileQuery> = Query::try_from_uri(req.uri()).map_err(ApiError::from)?;
    let path = path_of(&agent, &q)?;
    let (f, len) = crate::workpiece::open_for_read(&agent, path).await?;
    let stream = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(f));
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_LENGTH, len.to_string()),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

pub async fn write(State(agent): State<Arc<Agent>>, req: Request) -> Result<Response, ApiError> {
    let Query(q): Query<FileQuery> = Query::try_from_uri(req.uri()).map_err(ApiError::from)?;
    let path = path_of(&agent, &q)?;
    let want = q
        .sha256
        .as_deref()
        .filter(|s| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(str::to_ascii_lowercase)
        .ok_or_else(|| ApiError::bad_request("sha256: the body's hex SHA-256"))?;
    let tmp = crate::fs::TempFile::beside(&path);
    let file = crate::compat::files::create_as_user(&agent, &path, tmp.path())
        .await
        .map_err(|e| crate::fs::FsError::from_io(&path, e))?;
    let mut file = file;
    let mut body = req.into_body().into_data_stream();
    let mut hash = sha2::Sha256::new();
    let mut n = 0u64;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| ApiError::bad_request(format!("reading the body: {e}")))?;
        n += chunk.len() as u64;
        if n > MAX_FILE_BYTES {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!("a workpiece is at most {MAX_FILE_BYTES} bytes"),
            ));
        }
        hash.update(&chunk);
        file.write_all(&chunk)
            .await
            .map_err(|e| crate::fs::FsError::from_io(tmp.path(), e))?;
    }
    file.sync_all()
        .await
        .map_err(|e| crate::fs::FsError::from_io(tmp.path(), e))?;
    drop(file);
    let got: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    if got != want {
        return Err(ApiError::bad_request(format!(
            "the body's SHA-256 is {got}, not {want}"
        )));
    }
    crate::compat::files::rename_as_user(&agent, tmp, &path)
        .await
        .map_err(|e| crate::fs::FsError::from_io(&path, e))?;
    Ok((
        StatusCode::CREATED,
        Json(UploadResult {
            path: path.to_string_lossy().into_owned(),
            bytes: n,
        }),
    )
        .into_response())
}
