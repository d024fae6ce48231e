//! The compat display routes: `/screenshot`, `/screen_size`, `/cursor_position`,
//! `/window_size`, `/setup/activate_window`, `/setup/close_window`, `/setup/open_file`,
//! `/wallpaper`, `/setup/change_wallpaper`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::python::{self, truthy};
use super::{CompatJson, FormFields, error, flask, text};
use crate::Agent;
use crate::display::blocking;
use crate::display::windows::Match;
use crate::display::{DisplayError, ShotRequest};
use crate::exec::Background;

/// How long `/setup/open_file` waits for the window, as the reference server does.
const OPEN_FILE_TIMEOUT: Duration = Duration::from_secs(1800);
const OPEN_FILE_POLL: Duration = Duration::from_millis(250);

/// A display failure as the reference server's v2 answers it: 503 JSON.
fn unavailable(e: DisplayError) -> Response {
    let status = match e {
        DisplayError::Invalid(_) => StatusCode::BAD_REQUEST,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    error(status, e.to_string())
}

pub async fn screenshot(State(agent): State<Arc<Agent>>) -> Response {
    let d = agent.display.clone();
    match blocking(move || d.screenshot(&ShotRequest::default())).await {
        Ok(shot) => {
            let mut resp = (StatusCode::OK, shot.bytes.as_ref().clone()).into_response();
            let h = resp.headers_mut();
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static("image/png"));
            h.insert(
                header::CONTENT_DISPOSITION,
                HeaderValue::from_static("inline; filename=screenshot.png"),
            );
            h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            resp
        }
        Err(e) => unavailable(e),
    }
}

pub async fn screen_size(State(agent): State<Arc<Agent>>) -> Response {
    let d = agent.display.clone();
    match blocking(move || d.screen_size()).await {
        Ok((w, h)) => flask(StatusCode::OK, &json!({"width": w, "height": h})),
        Err(e) => unavailable(e),
    }
}

pub async fn cursor_position(State(agent): State<Arc<Agent>>) -> Response {
    let d = agent.display.clone();
    match blocking(move || d.pointer()).await {
        Ok((x, y)) => flask(StatusCode::OK, &json!([x, y])),
        Err(e) => unavailable(e),
    }
}

pub async fn window_size(
    State(agent): State<Arc<Agent>>,
    FormFields(fields): FormFields,
) -> Response {
    let Some(class) = fields
        .get("app_class_name")
        .filter(|c| !c.is_empty())
        .cloned()
    else {
        return flask(
            StatusCode::BAD_REQUEST,
            &json!({"error": "app_class_name is required"}),
        );
    };
    let d = agent.display.clone();
    let want = class.to_lowercase();
    match blocking(move || d.windows()).await {
        Ok(list) => match list
            .iter()
            .find(|w| w.instance.to_lowercase() == want || w.class.to_lowercase() == want)
        {
            Some(w) => flask(
                StatusCode::OK,
                &json!({"width": w.width, "height": w.height}),
            ),
            None => error(
                StatusCode::NOT_FOUND,
                format!(
                    "No window with WM_CLASS {}",
                    crate::text::py_repr_str(&class)
                ),
            ),
        },
        Err(e) => unavailable(e),
    }
}

/// `window_name`, `strict`, `by_class` of the activate/close routes.
fn window_args(data: &serde_json::Map<String, Value>) -> Option<(String, Match)> {
    let name = match data.get("window_name") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        _ => return None,
    };
    let how = Match {
        strict: data.get("strict").is_some_and(truthy),
        by_class: data.get("by_class").is_some_and(truthy),
    };
    Some((name, how))
}

pub async fn activate_window(
    State(agent): State<Arc<Agent>>,
    CompatJson(data): CompatJson,
) -> Response {
    let Some((name, how)) = window_args(&data) else {
        return text(StatusCode::BAD_REQUEST, "window_name required");
    };
    let d = agent.display.clone();
    // The reference ignores wmctrl's result: the answer is the same either way.
    let _ = blocking(move || d.activate(&name, how)).await;
    text(StatusCode::OK, "Window activated successfully")
}

pub async fn close_window(
    State(agent): State<Arc<Agent>>,
    CompatJson(data): CompatJson,
) -> Response {
    let Some((name, how)) = window_args(&data) else {
        return text(StatusCode::BAD_REQUEST, "window_name required");
    };
    let d = agent.display.clone();
    let _ = blocking(move || d.close(&name, how)).await;
    text(StatusCode::OK, "Window closed successfully.")
}

/// Whether a window's line in `wmctrl -l` contains `needle` (case-insensitively), the
/// reference's `window_exists` check.
pub async fn window_exists(agent: &Agent, needle: &str) -> bool {
    let d = agent.display.clone();
    let needle = needle.to_lowercase();
    match blocking(move || d.windows()).await {
        Ok(list) => list
            .iter()
            .any(|w| w.wmctrl_line().to_lowercase().contains(&needle)),
        Err(_) => false,
    }
}

pub async fn open_file(State(agent): State<Arc<Agent>>, CompatJson(data): CompatJson) -> Response {
    let Some(Value::String(raw)) = data.get("path").filter(|p| truthy(p)) else {
        return text(StatusCode::BAD_REQUEST, "Path not supplied!");
    };
    // Checked before any lookup: a NUL makes neither a file nor a program name.
    if raw.contains('\0') {
        return error(StatusCode::BAD_REQUEST, "path contains a NUL byte");
    }
    let Some((program, name)) = open_target(&agent, raw) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("Application/file not found: {raw}"),
        );
    };
    let p = match agent.commands.for_sandbox(program, None) {
        Ok(p) => p,
        Err(e) => {
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("Failed to open {raw}. Error: {e}"),
            );
        }
    };
    let started = agent
        .commands
        .start_background(p, Background::default())
        .await;
    if let Err(e) = started {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("Failed to open {raw}. Error: {e}"),
        );
    }
    activate_window_named(&agent, &name).await
}

/// What opens `raw` and the name its window's title should show: `xdg-open` and the file's
/// name for an existing file (after `~` and `$VAR` expansion), else the program itself when
/// it is on the PATH. `None` when it is neither.
fn open_target(agent: &Agent, raw: &str) -> Option<(Vec<String>, String)> {
    let expanded = python::expandvars(
        &python::expanduser(raw, &agent.home, &agent.account_name),
        &|k| agent.commands.config().env.get(k).map(str::to_string),
    );
    let path = PathBuf::from(&expanded);
    if path.exists() {
        let stem = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Some((vec!["xdg-open".to_string(), expanded.clone()], stem))
    } else if crate::account::find_in_path(
        agent.commands.config().env.get("PATH").unwrap_or_default(),
        raw,
    )
    .is_some()
    {
        Some((vec![raw.to_string()], raw.to_string()))
    } else {
        None
    }
}

/// Waits for a window whose title names the file (with or without its extension) and
/// activates it; a 500 when none comes within OPEN_FILE_TIMEOUT.
async fn activate_window_named(agent: &Agent, name: &str) -> Response {
    let stem = Path::new(name)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| name.to_string());
    let deadline = Instant::now() + OPEN_FILE_TIMEOUT;
    while Instant::now() < deadline {
        let d = agent.display.clone();
        if let Ok(list) = blocking(move || d.windows()).await
            && let Some(w) = list
                .iter()
                .find(|w| w.title.contains(name) || w.title.contains(&stem))
        {
            let (d, id) = (agent.display.clone(), w.id);
            let _ = blocking(move || d.activate_id(id)).await;
            return text(
                StatusCode::OK,
                "File opened and window activated successfully",
            );
        }
        tokio::time::sleep(OPEN_FILE_POLL).await;
    }
    text(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!(
            "Failed to find window for {name} within {} seconds.",
            OPEN_FILE_TIMEOUT.as_secs()
        ),
    )
}

/// Runs a short helper program as the sandbox user and returns its stdout when it succeeds.
async fn helper(agent: &Agent, argv: &[&str]) -> Option<String> {
    let program: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
    let p = agent.commands.for_sandbox(program, None).ok()?;
    let out = agent
        .commands
        .run_foreground(
            p,
            crate::exec::Foreground {
                stdin: None,
                timeout: Some(Duration::from_secs(10)),
                merge_stderr: false,
            },
        )
        .await
        .ok()?;
    (out.exit.code == Some(0)).then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The wallpaper file: XFCE's backdrop property, else GNOME's picture-uri.
async fn current_wallpaper(agent: &Agent) -> Option<String> {
    if let Some(list) = helper(agent, &["xfconf-query", "-c", "xfce4-desktop", "-l"]).await {
        for prop in list.lines().filter(|l| l.ends_with("/last-image")) {
            if let Some(v) =
                helper(agent, &["xfconf-query", "-c", "xfce4-desktop", "-p", prop]).await
            {
                let v = v.trim();
                if !v.is_empty() {
                    return Some(v.to_string());
                }
            }
        }
    }
    let v = helper(
        agent,
        &[
            "gsettings",
            "get",
            "org.gnome.desktop.background",
            "picture-uri",
        ],
    )
    .await?;
    // An unset picture-uri reads `''`: no wallpaper is set.
    let path = v
        .trim()
        .trim_matches('\'')
        .trim_start_matches("file://")
        .to_string();
    (!path.is_empty()).then_some(path)
}

pub async fn wallpaper(State(agent): State<Arc<Agent>>) -> Response {
    let Some(path) = current_wallpaper(&agent).await else {
        return error(StatusCode::NOT_FOUND, "Wallpaper file not found");
    };
    match tokio::fs::read(&path).await {
        Ok(bytes) => {
            let name = Path::new(&path)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let mut resp = (StatusCode::OK, bytes).into_response();
            let h = resp.headers_mut();
            // The reference always says image/png, whatever the file is.
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static("image/png"));
            if let Ok(v) =
                HeaderValue::from_str(&super::files::content_disposition("inline", &name))
            {
                h.insert(header::CONTENT_DISPOSITION, v);
            }
            resp
        }
        Err(_) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Unable to serve the wallpaper file",
        ),
    }
}

pub async fn change_wallpaper(
    State(agent): State<Arc<Agent>>,
    CompatJson(data): CompatJson,
) -> Response {
    let Some(Value::String(raw)) = data.get("path").filter(|p| truthy(p)) else {
        return text(StatusCode::BAD_REQUEST, "Path not supplied!");
    };
    // A NUL names no file (deviation 10 in docs/src/agent/osworld-api.md), as on `/setup/open_file`.
    if raw.contains('\0') {
        return error(StatusCode::BAD_REQUEST, "path contains a NUL byte");
    }
    let path = python::expanduser(raw, &agent.home, &agent.account_name);
    let abs = std::path::absolute(&path).unwrap_or_else(|_| PathBuf::from(&path));
    if !abs.exists() {
        return text(
            StatusCode::NOT_FOUND,
            format!("File not found: {}", abs.display()),
        );
    }
    let abs = abs.to_string_lossy().into_owned();
    let mut changed = set_xfce_wallpaper(&agent, &abs).await;
    changed |= set_gnome_wallpaper(&agent, &abs).await;
    if changed {
        text(StatusCode::OK, "Wallpaper changed successfully")
    } else {
        text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Failed to change wallpaper. Error: neither xfconf-query nor gsettings could set it",
        )
    }
}

/// XFCE: sets every monitor's first workspace backdrop (creating monitor 0's when none could
/// be set). Answers whether any was set; false without xfconf.
async fn set_xfce_wallpaper(agent: &Agent, abs: &str) -> bool {
    let mut changed = false;
    if let Some(list) = helper(agent, &["xfconf-query", "-c", "xfce4-desktop", "-l"]).await {
        for prop in list.lines().filter(|l| l.ends_with("/last-image")) {
            changed |= helper(
                agent,
                &["xfconf-query", "-c", "xfce4-desktop", "-p", prop, "-s", abs],
            )
            .await
            .is_some();
        }
        if !changed {
            changed = helper(
                agent,
                &[
                    "xfconf-query",
                    "-c",
                    "xfce4-desktop",
                    "-p",
                    "/backdrop/screen0/monitor0/workspace0/last-image",
                    "-n",
                    "-t",
                    "string",
                    "-s",
                    abs,
                ],
            )
            .await
            .is_some();
        }
    }
    changed
}

/// GNOME: sets the background's picture-uri. Answers whether gsettings did.
async fn set_gnome_wallpaper(agent: &Agent, abs: &str) -> bool {
    let uri = format!("file://{abs}");
    helper(
        agent,
        &[
            "gsettings",
            "set",
            "org.gnome.desktop.background",
            "picture-uri",
            &uri,
        ],
    )
    .await
    .is_some()
}
