//! `/file`, `/setup/upload`, `/list_directory`, `/desktop_path`, `/setup/download_file`.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::multipart::MultipartError;
use axum::extract::{FromRequest, Multipart, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use berth_protocol::events::EventKind;
use serde_json::{Value, json};

use super::python::{self, truthy};
use super::{CompatJson, FormFields, error, flask, multipart_status, text};
use crate::Agent;
use crate::text::py_os_error;

const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(300);
const DOWNLOAD_ATTEMPTS: usize = 3;
/// `/list_directory` follows symlinked directories like the reference server, but stops at
/// loops and at this depth instead of crashing.
const MAX_TREE_DEPTH: usize = 256;

/// `os.path.expandvars(os.path.expanduser(p))` with the sandbox environment.
fn expand(agent: &Agent, p: &str) -> String {
    let p = python::expanduser(p, &agent.home, &agent.account_name);
    python::expandvars(&p, &|k| {
        agent.commands.config().env.get(k).map(str::to_string)
    })
}

pub async fn file(State(agent): State<Arc<Agent>>, FormFields(fields): FormFields) -> Response {
    let Some(raw) = fields.get("file_path").filter(|p| !p.is_empty()) else {
        return flask(
            StatusCode::BAD_REQUEST,
            &json!({"error": "file_path is required"}),
        );
    };
    if raw.contains('\0') {
        return flask(
            StatusCode::BAD_REQUEST,
            &json!({"error": "file_path contains a NUL byte"}),
        );
    }
    let path = PathBuf::from(expand(&agent, raw));
    let failed = |e: std::io::Error| {
        let msg = match e.raw_os_error() {
            Some(errno) => py_os_error(errno, &path.to_string_lossy()),
            None => e.to_string(),
        };
        flask(
            StatusCode::INTERNAL_SERVER_ERROR,
            &json!({"error": format!("Failed to serve file: {msg}")}),
        )
    };
    // Opened with the sandbox user's rights: this route needs no token (see Files::as_user).
    let at = path.clone();
    let opened = agent
        .files
        .as_user(move || {
            let f = std::fs::File::open(&at)?;
            let meta = f.metadata()?;
            Ok((f, meta))
        })
        .await;
    let (file, meta) = match opened {
        Ok(o) => o,
        Err(e)
            if e.raw_os_error() == Some(libc::ENOENT)
                || e.raw_os_error() == Some(libc::ENOTDIR) =>
        {
            return flask(StatusCode::NOT_FOUND, &json!({"error": "File not found"}));
        }
        Err(e) => return failed(e),
    };
    if meta.is_dir() {
        return failed(std::io::Error::from_raw_os_error(libc::EISDIR));
    }
    let file = tokio::fs::File::from_std(file);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mime = mime_guess::from_path(&path).first_or_octet_stream();
    let mime = if mime.type_() == mime_guess::mime::TEXT {
        format!("{}; charset=utf-8", mime.essence_str())
    } else {
        mime.essence_str().to_string()
    };
    let body = Body::from_stream(tokio_util::io::ReaderStream::with_capacity(file, 256 << 10));
    let mut resp = (StatusCode::OK, body).into_response();
    let h = resp.headers_mut();
    set(h, header::CONTENT_TYPE, &mime);
    set(h, header::CONTENT_LENGTH, &meta.len().to_string());
    set(
        h,
        header::CONTENT_DISPOSITION,
        &content_disposition("attachment", &name),
    );
    set(h, header::CACHE_CONTROL, "no-cache");
    if let Ok(modified) = meta.modified() {
        set(h, header::LAST_MODIFIED, &httpdate::fmt_http_date(modified));
    }
    set(
        h,
        header::ETAG,
        &format!("\"{}-{}-{}\"", meta.mtime(), meta.len(), meta.ino()),
    );
    resp
}

fn set(h: &mut axum::http::HeaderMap, name: header::HeaderName, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        h.insert(name, v);
    }
}

/// Werkzeug's `Content-Disposition`: a bare token filename when it is one, quoted otherwise,
/// with an RFC 5987 `filename*` for non-ASCII names.
pub fn content_disposition(kind: &str, name: &str) -> String {
    let is_token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
    };
    let quote = |s: &str| {
        if is_token(s) {
            s.to_string()
        } else {
            format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
        }
    };
    if name.is_ascii() {
        format!("{kind}; filename={}", quote(name))
    } else {
        use unicode_normalization::UnicodeNormalization;
        let simple: String = name.nfkd().filter(char::is_ascii).collect();
        let encoded: String = name
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"!#$&+-.^_`|~".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        format!(
            "{kind}; filename={}; filename*=UTF-8''{encoded}",
            quote(&simple)
        )
    }
}

/// Streams the multipart `file_data` part into place; `file_path` may come before or after
/// it. Nothing is held in memory whole.
pub async fn upload(State(agent): State<Arc<Agent>>, req: Request) -> Response {
    let is_multipart = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().starts_with("multipart/form-data"));
    if !is_multipart {
        return upload_fields_required();
    }
    let mut mp = match Multipart::from_request(req, &()).await {
        Ok(m) => m,
        Err(_) => return upload_fields_required(),
    };
    let mut form = UploadForm::default();
    if let Err(resp) = read_upload_form(&agent, &mut mp, &mut form).await {
        // The client may still be sending: read the rest (bounded) so it gets the answer.
        discard_rest(&mut mp).await;
        return resp;
    }
    if form.nul_path {
        return flask(
            StatusCode::BAD_REQUEST,
            &json!({"error": "file_path contains a NUL byte"}),
        );
    }
    let (Some(target), Some((tmp, n))) = (form.target, form.staged) else {
        return upload_fields_required();
    };
    let moved = match tmp {
        // Staged beside the target, as the user: renamed onto it, as the user.
        Staged::Beside(tmp) => rename_as_user(&agent, tmp, &target).await,
        // Staged in the agent's state dir (the data came before the path): copied beside
        // the target as the user, then renamed onto it, so the target is replaced whole or
        // not at all.
        Staged::InState(tmp) => copy_into_place(&agent, &tmp, &target).await,
    };
    if let Err(e) = moved {
        let msg = match e.raw_os_error() {
            Some(errno) => py_os_error(errno, &target.to_string_lossy()),
            None => e.to_string(),
        };
        return upload_failed(msg);
    }
    agent.events.emit(
        EventKind::FileUploaded,
        json!({"path": target.to_string_lossy(), "bytes": n}),
    );
    text(StatusCode::OK, format!("File Uploaded: {n} bytes"))
}

/// What an upload's multipart form brought.
#[derive(Default)]
struct UploadForm {
    target: Option<PathBuf>,
    /// Where the data went: (temp file, bytes). The temp file goes when `staged` is dropped,
    /// also when the client resets the request mid-body and the handler's future is dropped.
    staged: Option<(Staged, u64)>,
    /// A NUL in file_path: the rest of the body is read and dropped, then a 400 (the client is
    /// still sending; answering mid-body would reset its connection).
    nul_path: bool,
}

/// `/setup/upload`'s answer when a field is missing (or the body is not a form).
fn upload_fields_required() -> Response {
    flask(
        StatusCode::BAD_REQUEST,
        &json!({"error": "file_path and file_data are required"}),
    )
}

/// `/setup/upload`'s answer when the data cannot be written or put in place.
fn upload_failed(msg: String) -> Response {
    flask(
        StatusCode::INTERNAL_SERVER_ERROR,
        &json!({"error": format!("Failed to upload file: {msg}")}),
    )
}

/// A body that ends early or does not parse is the client's fault: a 400 (413 kept), as
/// Werkzeug's form parser answers it, in the compat error shape.
fn upload_malformed(e: MultipartError) -> Response {
    error(multipart_status(&e), e.body_text())
}

/// Reads the form's fields into `form`, staging the first `file_data` part in a temp file;
/// stops at the body's end or at the first error (answered with its response).
async fn read_upload_form(
    agent: &Agent,
    mp: &mut Multipart,
    form: &mut UploadForm,
) -> Result<(), Response> {
    loop {
        let field = match mp.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => return Ok(()),
            Err(e) => return Err(upload_malformed(e)),
        };
        match field.name() {
            Some("file_path") if form.target.is_none() => {
                let raw = match field.text().await {
                    Ok(raw) => raw,
                    Err(e) => return Err(upload_malformed(e)),
                };
                if raw.is_empty() {
                    continue;
                }
                if raw.contains('\0') {
                    form.nul_path = true;
                    continue;
                }
                form.target = Some(PathBuf::from(expand(agent, &raw)));
            }
            Some("file_data")
                if form.staged.is_none() && !form.nul_path && field.file_name().is_some() =>
            {
                form.staged = Some(stage_file_data(agent, form.target.as_deref(), field).await?);
            }
            _ => {} // other fields are ignored, as the reference server does
        }
    }
}

/// Where an upload's data waits for its rename: beside the target (made as the sandbox user),
/// or in the agent's state dir when the data came before the path.
enum Staged {
    Beside(crate::fs::TempFile),
    InState(crate::fs::TempFile),
}

/// A new file at `tmp` (beside `target`, its missing parents made first), created with the
/// sandbox user's rights and so the user's.
pub(crate) async fn create_as_user(
    agent: &Agent,
    target: &Path,
    tmp: &Path,
) -> std::io::Result<tokio::fs::File> {
    let files = agent.files.clone();
    let (target, tmp) = (target.to_path_buf(), tmp.to_path_buf());
    let f = agent
        .files
        .as_user(move || {
            files
                .create_parents(&target)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)
        })
        .await?;
    Ok(tokio::fs::File::from_std(f))
}

/// Streams the `file_data` part into a temp file and answers it with its size.
async fn stage_file_data(
    agent: &Agent,
    target: Option<&Path>,
    field: axum::extract::multipart::Field<'_>,
) -> Result<(Staged, u64), Response> {
    // Stage beside the target when it is known (rename stays atomic), else in the
    // state dir until file_path arrives.
    let (tmp, file) = match target {
        Some(t) => {
            let tmp = crate::fs::TempFile::beside(t);
            match create_as_user(agent, t, tmp.path()).await {
                Ok(f) => (Staged::Beside(tmp), f),
                Err(e) => return Err(upload_failed(opening_error(&e, tmp.path()))),
            }
        }
        None => {
            let staging_dir = agent.state_dir.join("uploads");
            let _ = std::fs::create_dir_all(&staging_dir);
            let tmp = crate::fs::TempFile::beside(&staging_dir.join("upload"));
            match tokio::fs::File::create(tmp.path()).await {
                Ok(f) => (Staged::InState(tmp), f),
                Err(e) => return Err(upload_failed(opening_error(&e, tmp.path()))),
            }
        }
    };
    match write_stream(file, field).await {
        Ok(n) => Ok((tmp, n)),
        Err(e) => Err(match e {
            StreamError::Read(e) => upload_malformed(e),
            StreamError::Write(m) => upload_failed(m),
        }),
    }
}

/// Renames `tmp` onto `target` with the sandbox user's rights; the temp file is kept once it
/// is in place (removed otherwise, when dropped).
pub(crate) async fn rename_as_user(
    agent: &Agent,
    tmp: crate::fs::TempFile,
    target: &Path,
) -> std::io::Result<()> {
    let (from, to) = (tmp.path().to_path_buf(), target.to_path_buf());
    agent
        .files
        .as_user(move || std::fs::rename(&from, &to))
        .await?;
    tmp.keep();
    Ok(())
}

/// Copies the staged file beside the target, then renames the copy onto it (both as the
/// sandbox user), so the target is replaced whole or not at all.
async fn copy_into_place(
    agent: &Agent,
    tmp: &crate::fs::TempFile,
    target: &Path,
) -> std::io::Result<()> {
    let mut source = std::fs::File::open(tmp.path())?;
    let beside = crate::fs::TempFile::beside(target);
    let dest = create_as_user(agent, target, beside.path()).await?;
    let mut dest = dest.into_std().await;
    let (from, to) = (beside.path().to_path_buf(), target.to_path_buf());
    let copied = agent
        .files
        .as_user(move || {
            std::io::copy(&mut source, &mut dest)?;
            std::fs::rename(&from, &to)
        })
        .await;
    if copied.is_ok() {
        beside.keep();
    }
    copied
}

/// An error opening `path`, as Python words it (`[Errno 13] Permission denied: '…'`).
fn opening_error(e: &std::io::Error, path: &Path) -> String {
    match e.raw_os_error() {
        Some(errno) => py_os_error(errno, &path.to_string_lossy()),
        None => e.to_string(),
    }
}

/// Reads and drops what remains of a rejected multipart body, for at most 10 s.
async fn discard_rest(mp: &mut Multipart) {
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while let Ok(Some(field)) = mp.next_field().await {
            drop(field);
        }
    })
    .await;
}

/// Why streaming to a file stopped: the source failed (`Read`), or the file (`Write`, as
/// Python words it).
enum StreamError<E> {
    Read(E),
    Write(String),
}

async fn write_stream<S, E>(mut f: tokio::fs::File, mut stream: S) -> Result<u64, StreamError<E>>
where
    S: futures_util::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
{
    use futures_util::StreamExt;
    use tokio::io::AsyncWriteExt;
    // As Python words it: a failed write (a full disk) names no file.
    let writing = |e: std::io::Error| match e.raw_os_error() {
        Some(errno) => format!("[Errno {errno}] {}", crate::text::errno_message(errno)),
        None => e.to_string(),
    };
    let mut n = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(StreamError::Read)?;
        f.write_all(&chunk)
            .await
            .map_err(|e| StreamError::Write(writing(e)))?;
        n += chunk.len() as u64;
    }
    f.flush()
        .await
        .map_err(|e| StreamError::Write(writing(e)))?;
    Ok(n)
}

pub async fn list_directory(
    State(agent): State<Arc<Agent>>,
    CompatJson(data): CompatJson,
) -> Response {
    let path = match data.get("path") {
        Some(Value::String(p)) if !p.is_empty() => p.clone(),
        Some(v) if truthy(v) => {
            return flask(
                StatusCode::BAD_REQUEST,
                &json!({"error": format!("'path' must be a string, not {}", python::type_name(v))}),
            );
        }
        _ => {
            return flask(
                StatusCode::BAD_REQUEST,
                &json!({"error": "Missing 'path' parameter"}),
            );
        }
    };
    if path.contains('\0') {
        return flask(
            StatusCode::BAD_REQUEST,
            &json!({"error": "path contains a NUL byte"}),
        );
    }
    // Walked with the sandbox user's rights: this route needs no token (see Files::as_user).
    let tree = agent
        .files
        .as_user(move || {
            if !Path::new(&path).is_dir() {
                return Ok(None);
            }
            let mut ancestors = HashSet::new();
            Ok(Some(tree_node(&path, &mut ancestors, 0)))
        })
        .await
        .unwrap_or_else(|e| Some(json!({"error": e.to_string()})));
    match tree {
        Some(tree) => flask(StatusCode::OK, &json!({"directory_tree": tree})),
        None => flask(
            StatusCode::BAD_REQUEST,
            &json!({"error": "The provided path is not a directory"}),
        ),
    }
}

/// One node of the reference server's tree: `os.listdir` order, directories (symlinks
/// followed) recursed into, any OSError replacing the node with `{"error": …}`.
fn tree_node(dir: &str, ancestors: &mut HashSet<(u64, u64)>, depth: usize) -> Value {
    let name = dir.rsplit('/').next().unwrap_or("").to_string();
    let meta = match std::fs::metadata(dir) {
        Ok(m) => m,
        Err(e) => return json!({"error": py_os_error(e.raw_os_error().unwrap_or(libc::EIO), dir)}),
    };
    let key = (meta.dev(), meta.ino());
    if depth >= MAX_TREE_DEPTH || !ancestors.insert(key) {
        return json!({"error": py_os_error(libc::ELOOP, dir)});
    }
    let result = (|| -> Result<Vec<Value>, std::io::Error> {
        let mut children = Vec::new();
        for ent in std::fs::read_dir(dir)? {
            let ent = ent?;
            let child_name = ent.file_name().to_string_lossy().into_owned();
            let full = if dir.ends_with('/') {
                format!("{dir}{child_name}")
            } else {
                format!("{dir}/{child_name}")
            };
            if Path::new(&full).is_dir() {
                children.push(tree_node(&full, ancestors, depth + 1));
            } else {
                children.push(json!({"type": "file", "name": child_name}));
            }
        }
        Ok(children)
    })();
    ancestors.remove(&key);
    match result {
        Ok(children) => json!({"type": "directory", "name": name, "children": children}),
        Err(e) => json!({"error": py_os_error(e.raw_os_error().unwrap_or(libc::EIO), dir)}),
    }
}

pub async fn desktop_path(State(agent): State<Arc<Agent>>) -> Response {
    let desktop = agent.home.join("Desktop");
    if desktop.is_dir() {
        flask(
            StatusCode::OK,
            &json!({"desktop_path": desktop.to_string_lossy()}),
        )
    } else {
        flask(
            StatusCode::NOT_FOUND,
            &json!({"error": "Unsupported operating system or desktop path not found"}),
        )
    }
}

pub async fn download_file(
    State(agent): State<Arc<Agent>>,
    CompatJson(data): CompatJson,
) -> Response {
    let (Some(Value::String(url)), Some(Value::String(path))) = (data.get("url"), data.get("path"))
    else {
        return text(StatusCode::BAD_REQUEST, "Path or URL not supplied!");
    };
    if url.is_empty() || path.is_empty() {
        return text(StatusCode::BAD_REQUEST, "Path or URL not supplied!");
    }
    // Checked before any attempt: no retry can make such a path valid.
    if path.contains('\0') {
        return text(StatusCode::BAD_REQUEST, "path contains a NUL byte");
    }
    let target = PathBuf::from(python::expanduser(path, &agent.home, &agent.account_name));
    let mut last_error = String::new();
    for _ in 0..DOWNLOAD_ATTEMPTS {
        match fetch(&agent, url, &target).await {
            Ok(n) => {
                return text(
                    StatusCode::OK,
                    format!("File downloaded successfully: {n} bytes"),
                );
            }
            Err(e) => last_error = e,
        }
    }
    text(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("Failed to download {url}. No retries left. Error: {last_error}"),
    )
}

/// One download attempt: streamed to a temp file beside the target, length-checked, renamed.
async fn fetch(agent: &Agent, url: &str, target: &Path) -> Result<u64, String> {
    let client = reqwest::Client::builder()
        .timeout(DOWNLOAD_TIMEOUT)
        .build()
        .map_err(|e| e.to_string())?;
    let resp = client.get(url).send().await.map_err(|e| e.to_string())?;
    let status = resp.status();
    if !status.is_success() {
        return Err(format!("{status} for url: {url}"));
    }
    let expected = resp.content_length();
    let tmp = crate::fs::TempFile::beside(target);
    let file = create_as_user(agent, target, tmp.path())
        .await
        .map_err(|e| opening_error(&e, tmp.path()))?;
    let n = match write_stream(file, Box::pin(resp.bytes_stream())).await {
        Ok(n) => n,
        Err(e) => {
            return Err(match e {
                StreamError::Read(e) => e.to_string(),
                StreamError::Write(m) => m,
            });
        }
    };
    if let Some(len) = expected
        && len != n
    {
        return Err(format!(
            "Download incomplete: expected {len} bytes, got {n}"
        ));
    }
    rename_as_user(agent, tmp, target)
        .await
        .map_err(|e| e.to_string())?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_disposition_matches_werkzeug() {
        assert_eq!(
            content_disposition("attachment", "screenshot.png"),
            "attachment; filename=screenshot.png"
        );
        assert_eq!(
            content_disposition("attachment", "my file.txt"),
            "attachment; filename=\"my file.txt\""
        );
        assert_eq!(
            content_disposition("attachment", "é.txt"),
            "attachment; filename=e.txt; filename*=UTF-8''%C3%A9.txt"
        );
    }
}
