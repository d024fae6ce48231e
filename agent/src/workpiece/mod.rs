//! Workpieces in the guest: the engine that knows the formats (`engine.py`: LibreOffice over
//! UNO for decks, sheets and documents, PyMuPDF for PDFs) run as the sandbox user, the
//! workpiece file read and replaced with that user's rights, and the desktop's editors.
//!
//! The controller owns workpieces (rows, versions, proposals); the agent only answers what it
//! is asked about one file at a time, so nothing here keeps state.

use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::http::StatusCode;
use berth_protocol::workpiece::{MAX_FILE_BYTES, SCRATCH, WorkpieceKind};
use serde_json::{Map, Value};

use crate::Agent;
use crate::exec::{Background, ExecError};
use crate::http::error::ApiError;

/// The engine, written to [`engine_file`] and run with `python3 -I`.
pub const ENGINE: &str = include_str!("engine.py");

/// The engine's requests, by `op`.
pub const OPS: &[&str] = &[
    "inspect", "create", "read", "apply", "render", "open", "discard",
];

/// How long one engine call may take (LibreOffice's first start included).
const ENGINE_TIMEOUT: Duration = Duration::from_secs(180);
/// The most an engine answer may print (rendered pages are base64 PNGs).
const ENGINE_OUTPUT: usize = 64 << 20;

/// The engine as a file the sandbox user can read and not change: under `/usr/local/lib/berth`
/// when the agent runs as root, else in its state dir; named by its content, written once.
fn engine_file(agent: &Agent) -> std::io::Result<PathBuf> {
    use sha2::Digest;
    use std::os::unix::fs::PermissionsExt;
    let digest = sha2::Sha256::digest(ENGINE.as_bytes());
    let tag: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    let dir = if nix::unistd::Uid::effective().is_root() {
        PathBuf::from("/usr/local/lib/berth")
    } else {
        agent.state_dir.join("workpiece")
    };
    let file = dir.join(format!("workpiece-{tag}.py"));
    if std::fs::read(&file).is_ok_and(|b| b == ENGINE.as_bytes()) {
        return Ok(file);
    }
    std::fs::create_dir_all(&dir)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
    let tmp = dir.join(format!(".workpiece-{tag}.{}", std::process::id()));
    std::fs::write(&tmp, ENGINE)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))?;
    std::fs::rename(&tmp, &file)?;
    Ok(file)
}

/// The interpreter the engine runs under (Debian's: `uno` and `fitz` are its modules).
fn python() -> Option<&'static str> {
    ["/usr/bin/python3", "/usr/local/bin/python3"]
        .into_iter()
        .find(|p| Path::new(p).exists())
}

/// Runs one engine request as the sandbox user: `op` is checked, its paths resolved against
/// the home; the answer is the engine's, or its refusal as an API error.
pub async fn run(agent: &Agent, mut req: Map<String, Value>) -> Result<Value, ApiError> {
    let op = req
        .get("op")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "\"op\" names the request: one of {}",
                OPS.join(", ")
            ))
        })?;
    if !OPS.contains(&op.as_str()) {
        return Err(ApiError::bad_request(format!(
            "op {op:?}: one of {}",
            OPS.join(", ")
        )));
    }
    for key in ["path", "out"] {
        if let Some(v) = req.get(key) {
            let s = v
                .as_str()
                .ok_or_else(|| ApiError::bad_request(format!("{key}: a path string")))?;
            let resolved = agent.files.resolve(s)?;
            req.insert(key.into(), resolved.to_string_lossy().into_owned().into());
        }
    }
    match op.as_str() {
        "open" => return open(agent, &req).await,
        "discard" => return discard(agent, &req).await,
        _ => {}
    }
    let python = python().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "no_engine",
            "this image has no python3: workpieces need python3 with LibreOffice (python3-uno) \
             and PyMuPDF (python3-fitz)",
        )
    })?;
    let path = req.get("path").cloned();
    let stdin = serde_json::to_vec(&Value::Object(req))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let script = engine_file(agent).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "engine",
            format!("writing the workpiece engine: {e}"),
        )
    })?;
    let program = vec![
        python.into(),
        "-I".into(),
        script.to_string_lossy().into_owned(),
    ];
    let out = agent
        .commands
        .tool_output(program, Some(stdin), ENGINE_TIMEOUT, ENGINE_OUTPUT)
        .await
        .map_err(ApiError::from)?;
    if out.timed_out {
        return Err(ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "timeout",
            format!(
                "the workpiece engine's {op} took longer than {} s",
                ENGINE_TIMEOUT.as_secs()
            ),
        ));
    }
    let mut v = answer(&op, &out.stdout, &out.stderr)?;
    // The resolved path, for a caller that gave one relative to the home.
    if let (Value::Object(m), Some(p)) = (&mut v, path) {
        m.entry("path").or_insert(p);
    }
    Ok(v)
}

/// The engine's printed answer as the route's.
pub fn answer(op: &str, stdout: &[u8], stderr: &[u8]) -> Result<Value, ApiError> {
    let v: Value = match serde_json::from_slice(stdout) {
        Ok(v @ Value::Object(_)) => v,
        _ => {
            let tail = String::from_utf8_lossy(stderr);
            let tail: String = tail
                .lines()
                .rev()
                .take(6)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join(" | ");
            return Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "engine",
                format!("the workpiece engine's {op} failed: {tail}"),
            ));
        }
    };
    if v.get("ok") == Some(&Value::Bool(true)) {
        return Ok(v);
    }
    let status = v
        .get("status")
        .and_then(Value::as_u64)
        .and_then(|s| StatusCode::from_u16(s as u16).ok())
        .filter(|s| s.is_client_error() || s.is_server_error())
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let code = match v.get("code").and_then(Value::as_str).unwrap_or("engine") {
        "not_found" => "not_found",
        "forbidden" => "forbidden",
        "wrong_kind" => "wrong_kind",
        "too_large" => "too_large",
        "exists" => "exists",
        "bad_operation" => "bad_operation",
        "bad_formula" => "bad_formula",
        "bad_request" => "invalid_request",
        "no_engine" => "no_engine",
        _ => "engine",
    };
    let message = v
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("the workpiece engine refused the request");
    let message = match (
        v.get("index").and_then(Value::as_u64),
        v.get("operation").and_then(Value::as_str),
    ) {
        (Some(i), Some(name)) => format!("operation {i} ({name}): {message}"),
        (Some(i), None) => format!("operation {i}: {message}"),
        _ => message.to_string(),
    };
    Err(ApiError::new(status, code, message))
}

/// The editor a workpiece of `kind` opens in, among what the image has.
fn editor(kind: WorkpieceKind) -> Option<Vec<String>> {
    let has = |p: &str| {
        std::env::var_os("PATH")
            .map(|paths| std::env::split_paths(&paths).any(|d| d.join(p).is_file()))
            .unwrap_or(false)
            || Path::new("/usr/bin").join(p).is_file()
    };
    let office = |flag: &str| {
        ["libreoffice", "soffice"]
            .into_iter()
            .find(|p| has(p))
            .map(|p| vec![p.to_string(), flag.to_string()])
    };
    match kind {
        WorkpieceKind::Deck => office("--impress"),
        WorkpieceKind::Sheet => office("--calc"),
        WorkpieceKind::Document => office("--writer"),
        WorkpieceKind::Pdf => ["evince", "atril", "okular", "mupdf", "xdg-open"]
            .into_iter()
            .find(|p| has(p))
            .map(|p| vec![p.to_string()]),
    }
}

/// Opens the file in the desktop's editor for its kind, as a tracked background command.
async fn open(agent: &Agent, req: &Map<String, Value>) -> Result<Value, ApiError> {
    if agent.desktop.is_none() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "no_desktop",
            "this sandbox has no desktop to open an editor on",
        ));
    }
    let kind: WorkpieceKind = req
        .get("kind")
        .cloned()
        .and_then(|k| serde_json::from_value(k).ok())
        .ok_or_else(|| ApiError::bad_request("kind: deck, sheet, document or pdf"))?;
    let path = req
        .get("path")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::bad_request("path is required"))?;
    let mut program = editor(kind).ok_or_else(|| {
        ApiError::new(
            StatusCode::CONFLICT,
            "no_editor",
            format!("this image has no editor for a {kind}"),
        )
    })?;
    program.push(path.to_string());
    let p = agent.commands.for_sandbox(program.clone(), None)?;
    let started = agent
        .commands
        .start_background(p, Background::default())
        .await
        .map_err(|e| match e {
            ExecError::Spawn(f) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "spawn_failed",
                f.message(),
            ),
            e => ApiError::from(e),
        })?;
    Ok(serde_json::json!({
        "ok": true,
        "opened": path,
        "editor": program[0],
        "command": started.0.id,
    }))
}

/// Removes a staged result under the scratch directory, as the sandbox user.
async fn discard(agent: &Agent, req: &Map<String, Value>) -> Result<Value, ApiError> {
    let path = PathBuf::from(
        req.get("path")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::bad_request("path is required"))?,
    );
    if !path.starts_with(agent.home.join(SCRATCH)) {
        return Err(ApiError::bad_request(format!(
            "discard removes only files under ~/{SCRATCH}"
        )));
    }
    let removed = agent
        .files
        .as_user(move || match std::fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        })
        .await?;
    Ok(serde_json::json!({"ok": true, "removed": removed}))
}

/// Opens `path` for reading with the sandbox user's rights: a regular file within the size
/// limit.
pub async fn open_for_read(agent: &Agent, path: PathBuf) -> Result<(std::fs::File, u64), ApiError> {
    let shown = path.clone();
    let opened = agent
        .files
        .as_user(move || {
            let f = std::fs::File::open(&path)?;
            let meta = f.metadata()?;
            Ok((f, meta))
        })
        .await
        .map_err(|e| crate::fs::FsError::from_io(&shown, e))?;
    let (f, meta) = opened;
    if !meta.is_file() {
        return Err(ApiError::bad_request(format!(
            "{} is not a regular file",
            shown.display()
        )));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!(
                "{} is {} bytes; a workpiece is at most {MAX_FILE_BYTES}",
                shown.display(),
                meta.len()
            ),
        ));
    }
    Ok((f, meta.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engine_answer_becomes_the_route_answer() {
        let ok = answer("read", br#"{"ok": true, "pages": 1}"#, b"").unwrap();
        assert_eq!(ok["pages"], 1);
        let e = answer(
            "apply",
            br#"{"ok": false, "status": 400, "code": "bad_operation", "index": 2,
                 "operation": "set_cells", "message": "sheet 'X' does not exist"}"#,
            b"",
        )
        .unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.code, "bad_operation");
        assert_eq!(
            e.message,
            "operation 2 (set_cells): sheet 'X' does not exist"
        );
        let e = answer(
            "read",
            br#"{"ok": false, "status": 403, "code": "forbidden",
                                   "message": "no"}"#,
            b"",
        )
        .unwrap_err();
        assert_eq!(e.status, StatusCode::FORBIDDEN);
        // A crash: the stderr's tail, a 500.
        let e = answer("render", b"", b"Traceback\n  File x\nValueError: boom\n").unwrap_err();
        assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(e.message.contains("ValueError: boom"), "{}", e.message);
        // A status that is no error is not trusted.
        let e = answer("read", br#"{"ok": false, "status": 200}"#, b"").unwrap_err();
        assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
    }
}
