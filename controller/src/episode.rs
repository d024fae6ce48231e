//! Episode bundles: one zip of what an agent run did in a sandbox — `recording.mp4` (the
//! recording most of the actions fall in), `actions.jsonl` (the agent's action log, each line
//! with the bundled recording's media times at its top level), `screenshots/` (the exact
//! bytes each action answered), `timeline.jsonl` (the sandbox's controller timeline) and
//! `episode.json` (what the bundle holds). Built into a scratch file and kept as an `episode`
//! artifact, so it outlives the sandbox; [`KeepWork`] keeps one before a sandbox
//! with logged actions goes.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;
use berth_protocol::events::EventKind;
use berth_protocol::routes::{fill, native};
use berth_protocol::{AgentClient, RecordingInfo};
use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::artifact::{ArtifactKind, Artifacts, body_to_file};
use crate::ctx::{Ctx, KeepWork};
use crate::error::{Error, Result};
use crate::lifecycle::SandboxStatus;
use crate::store::{ArtifactRow, SandboxRow};
use crate::timeline::Timeline;
use crate::util::now_ms;

/// Every agent call (a page of actions, a screenshot, the recording's record).
const AGENT_CALL: Duration = Duration::from_secs(15);
/// The most actions a bundle holds (the agent keeps fewer).
const MAX_ACTIONS: usize = 100_000;
const PAGE: usize = 10_000;
/// The most timeline events a bundle holds.
const MAX_EVENTS: usize = 100_000;

/// The recording a bundle carries: the one asked for, else the one most actions fall in
/// (the latest of equals); None when no action fell in any.
pub fn choose_recording(actions: &[Value], asked: Option<&str>) -> Option<String> {
    if let Some(a) = asked {
        return Some(a.to_string());
    }
    // id -> (actions in it, the last seq in it)
    let mut counts: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    for e in actions {
        let seq = e["seq"].as_u64().unwrap_or(0);
        for r in e["recordings"].as_array().into_iter().flatten() {
            if let Some(id) = r["id"].as_str() {
                let c = counts.entry(id.to_string()).or_default();
                c.0 += 1;
                c.1 = c.1.max(seq);
            }
        }
    }
    counts.into_iter().max_by_key(|(_, c)| *c).map(|(id, _)| id)
}

/// An action log entry as the bundle writes it: the agent's entry with the bundled
/// recording's `media_ms` and `screenshot_media_ms` (and its id, `recording`) at the top
/// level, absent when the action fell outside it.
pub fn bundle_line(entry: &Value, recording: Option<&str>) -> Value {
    let mut out = entry.clone();
    let Some(rec) = recording else {
        return out;
    };
    if let Some(r) = entry["recordings"]
        .as_array()
        .and_then(|rs| rs.iter().find(|r| r["id"].as_str() == Some(rec)))
    {
        out["recording"] = json!(rec);
        out["media_ms"] = r["media_ms"].clone();
        if let Some(s) = r.get("screenshot_media_ms") {
            out["screenshot_media_ms"] = s.clone();
        }
    }
    out
}

/// What goes in a bundle, on local disk.
pub struct Parts {
    pub actions: Vec<Value>,
    /// `screenshots/<name>` and the file holding its bytes.
    pub screenshots: Vec<(String, PathBuf)>,
    pub recording: Option<PathBuf>,
    pub timeline: Vec<Value>,
    pub meta: Value,
}

fn jsonl(lines: &[Value]) -> Vec<u8> {
    let mut out = Vec::new();
    for l in lines {
        out.extend_from_slice(l.to_string().as_bytes());
        out.push(b'\n');
    }
    out
}

/// Writes the zip: media stored as they are (already compressed), text deflated. Fails past
/// `max` bytes.
pub fn write_zip(dest: &Path, parts: &Parts, max: u64) -> std::io::Result<u64> {
    use zip::CompressionMethod;
    use zip::write::SimpleFileOptions;
    let file = std::fs::File::create(dest)?;
    let mut z = zip::ZipWriter::new(std::io::BufWriter::new(file));
    let stored = SimpleFileOptions::default()
        .compression_method(CompressionMethod::Stored)
        .large_file(true);
    let deflated = SimpleFileOptions::default().compression_method(CompressionMethod::Deflated);
    let too_large = || {
        std::io::Error::new(
            std::io::ErrorKind::FileTooLarge,
            format!("the episode bundle passes {max} bytes"),
        )
    };
    let mut total: u64 = 0;
    let mut add = |z: &mut zip::ZipWriter<_>, n: u64| -> std::io::Result<()> {
        total += n;
        let _ = z;
        if total > max {
            Err(too_large())
        } else {
            Ok(())
        }
    };
    z.start_file("episode.json", deflated)?;
    let meta = serde_json::to_vec_pretty(&parts.meta)?;
    add(&mut z, meta.len() as u64)?;
    z.write_all(&meta)?;
    z.start_file("actions.jsonl", deflated)?;
    let actions = jsonl(&parts.actions);
    add(&mut z, actions.len() as u64)?;
    z.write_all(&actions)?;
    z.start_file(crate::atif::FILE, deflated)?;
    let trajectory = serde_json::to_vec_pretty(&crate::atif::trajectory(
        &parts.meta,
        &parts.actions,
        env!("CARGO_PKG_VERSION"),
        None,
    ))?;
    add(&mut z, trajectory.len() as u64)?;
    z.write_all(&trajectory)?;
    z.start_file("timeline.jsonl", deflated)?;
    let timeline = jsonl(&parts.timeline);
    add(&mut z, timeline.len() as u64)?;
    z.write_all(&timeline)?;
    if let Some(rec) = &parts.recording {
        add(&mut z, std::fs::metadata(rec)?.len())?;
        z.start_file("recording.mp4", stored)?;
        std::io::copy(&mut std::fs::File::open(rec)?, &mut z)?;
    }
    z.add_directory("screenshots/", deflated)?;
    for (name, path) in &parts.screenshots {
        add(&mut z, std::fs::metadata(path)?.len())?;
        z.start_file(format!("screenshots/{name}"), stored)?;
        std::io::copy(&mut std::fs::File::open(path)?, &mut z)?;
    }
    let mut w = z.finish()?;
    w.flush()?;
    drop(w);
    Ok(std::fs::metadata(dest)?.len())
}

/// One file of a kept bundle.
fn read_bundle_file(zip_path: &Path, name: &str) -> std::io::Result<Vec<u8>> {
    let mut z = zip::ZipArchive::new(std::fs::File::open(zip_path)?)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let mut f = z
        .by_name(name)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let mut out = Vec::new();
    f.read_to_end(&mut out)?;
    Ok(out)
}

/// `actions.jsonl` of a kept bundle.
fn read_bundle_actions(zip_path: &Path) -> std::io::Result<Vec<Value>> {
    let text = String::from_utf8_lossy(&read_bundle_file(zip_path, "actions.jsonl")?).into_owned();
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

async fn agent_get(agent: &AgentClient, path: &str) -> Result<reqwest::Response> {
    let resp = tokio::time::timeout(AGENT_CALL, agent.request(reqwest::Method::GET, path).send())
        .await
        .map_err(|_| Error::Agent(format!("GET {path} timed out")))?
        .map_err(|e| Error::Agent(format!("GET {path}: {e}")))?;
    berth_protocol::client::check(resp)
        .await
        .map_err(|e| match e.status() {
            Some(404) => Error::NotFound(format!("{path}: {e}")),
            _ => Error::Agent(format!("{path}: {e}")),
        })
}

/// The agent's whole action log, oldest first.
async fn agent_actions(agent: &AgentClient) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    let mut from = 1u64;
    loop {
        let path = format!("{}?from_seq={from}&limit={PAGE}", native::EPISODE_ACTIONS);
        let page: Value = tokio::time::timeout(AGENT_CALL, agent_get(agent, &path).await?.json())
            .await
            .map_err(|_| Error::Agent("reading the action log timed out".into()))?
            .map_err(|e| Error::Agent(format!("reading the action log: {e}")))?;
        let items = page["actions"].as_array().cloned().unwrap_or_default();
        let next = page["next_seq"].as_u64().unwrap_or(from);
        let n = items.len();
        out.extend(items);
        if n < PAGE || next <= from || out.len() >= MAX_ACTIONS {
            break;
        }
        from = next;
    }
    out.truncate(MAX_ACTIONS);
    Ok(out)
}

/// What the agent says of recording `r`.
async fn recording_info(agent: &AgentClient, r: &str) -> Result<RecordingInfo> {
    tokio::time::timeout(AGENT_CALL, agent.recording(r))
        .await
        .map_err(|_| Error::Agent("asking for the recording timed out".into()))?
        .map_err(|e| match e.status() {
            Some(404) => Error::NotFound(format!("no recording {r} in the sandbox")),
            _ => Error::Agent(format!("recording {r}: {e}")),
        })
}

/// The screenshots the agent still keeps of `actions`, into `dir`, within `max` bytes in all.
async fn bundle_screenshots(
    agent: &AgentClient,
    actions: &[Value],
    dir: &Path,
    max: u64,
) -> Result<Vec<(String, PathBuf)>> {
    let mut screenshots = Vec::new();
    let mut shot_bytes = 0u64;
    for e in actions {
        let Some(name) = e["screenshot"].as_str() else {
            continue;
        };
        if e["screenshot_dropped"].as_bool() == Some(true) {
            continue;
        }
        let dest = dir.join(format!("shot-{name}"));
        match agent_get(agent, &fill(native::EPISODE_SCREENSHOT, &[name])).await {
            Ok(resp) => {
                shot_bytes += body_to_file(resp, &dest, max.saturating_sub(shot_bytes)).await?;
                screenshots.push((name.to_string(), dest));
            }
            Err(Error::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(screenshots)
}

/// The bundle's `episode.json`: what it holds and where it comes from.
fn bundle_meta(
    row: &SandboxRow,
    rec: Option<&RecordingInfo>,
    parts: &Parts,
    first: u64,
    last: u64,
) -> Value {
    let in_recording = parts
        .actions
        .iter()
        .filter(|l| l.get("media_ms").is_some())
        .count();
    json!({
        "sandbox": row.id,
        "profile": row.profile,
        "image": row.image_ref,
        "screen": row.screen,
        "recording": rec.map(|i| json!({
            "id": i.id,
            "state": i.state,
            "duration_ms": i.duration_ms,
            "fps": i.fps,
            "width": i.width,
            "height": i.height,
            "bytes": i.bytes,
            "started_at": i.started_at,
            "in_bundle": parts.recording.is_some(),
        })),
        "actions": parts.actions.len(),
        "actions_in_recording": in_recording,
        "screenshots": parts.screenshots.len(),
        "timeline_events": parts.timeline.len(),
        "first_seq": first,
        "last_seq": last,
        "created_at": crate::util::rfc3339(now_ms()),
    })
}

/// The bundle's action lines: each action with the recording's media times, marked
/// `screenshot_dropped` when its screenshot is not in the bundle.
fn bundle_lines(
    actions: &[Value],
    rec_id: Option<&str>,
    shots: &[(String, PathBuf)],
) -> Vec<Value> {
    let kept: std::collections::HashSet<&str> = shots.iter().map(|(n, _)| n.as_str()).collect();
    actions
        .iter()
        .map(|e| {
            let mut l = bundle_line(e, rec_id);
            if let Some(n) = e["screenshot"].as_str()
                && !kept.contains(n)
            {
                l["screenshot_dropped"] = json!(true);
            }
            l
        })
        .collect()
}

/// Removes a scratch directory when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Removes a scratch file when dropped.
struct ScratchFile(PathBuf);

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// What `GET …/{id}/episode` answers: the bundle (zip), or its ATIF trajectory (JSON).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EpisodeFormat {
    #[default]
    Bundle,
    Atif,
}

impl std::str::FromStr for EpisodeFormat {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "bundle" | "zip" => Ok(EpisodeFormat::Bundle),
            "atif" => Ok(EpisodeFormat::Atif),
            other => Err(Error::BadRequest(format!(
                "format {other:?}: give bundle (the zip) or atif (its ATIF trajectory)"
            ))),
        }
    }
}

/// Episode bundles of sandboxes, kept as artifacts.
pub struct Episodes {
    ctx: Arc<Ctx>,
    artifacts: Arc<Artifacts>,
    timeline: Arc<Timeline>,
    workpieces: Arc<crate::workpiece::Workpieces>,
    panes: Arc<crate::panes::Panes>,
}

impl KeepWork for Episodes {
    fn keep_work<'a>(&'a self, row: &'a SandboxRow) -> futures_util::future::BoxFuture<'a, ()> {
        Box::pin(self.keep_work_within(row))
    }
}

impl Episodes {
    pub fn new(
        ctx: Arc<Ctx>,
        artifacts: Arc<Artifacts>,
        timeline: Arc<Timeline>,
        workpieces: Arc<crate::workpiece::Workpieces>,
        panes: Arc<crate::panes::Panes>,
    ) -> Episodes {
        Episodes {
            ctx,
            artifacts,
            timeline,
            workpieces,
            panes,
        }
    }

    /// Keeps a sandbox's work before it is destroyed: stops its live recordings and publishes
    /// every recording not yet published, within `keep_work_timeout_secs`. Called on every
    /// destroy of a sandbox that was running (`Sandboxes::destroy_now`, through [`KeepWork`]).
    async fn keep_work_within(&self, row: &SandboxRow) {
        let bound = std::time::Duration::from_secs(self.ctx.config.keep_work_timeout_secs);
        let work = async {
            self.artifacts.keep_recordings(row).await;
            self.keep_episode(row).await;
            self.workpieces.keep(row).await;
            self.panes.keep(row).await;
            // Extension point: further work kept before the sandbox goes is added here, each
            // step bounded by the same deadline.
        };
        if tokio::time::timeout(bound, work).await.is_err() {
            tracing::warn!(
                sandbox = %row.id,
                secs = self.ctx.config.keep_work_timeout_secs,
                "keeping the sandbox's work ran out of time; destroying it anyway"
            );
            self.ctx.event(
                &row.id,
                EventKind::ArtifactKeepTimeout,
                json!({"timeout_secs": self.ctx.config.keep_work_timeout_secs}),
            );
        }
    }

    /// The sandbox's newest kept episode bundle.
    fn last_episode(&self, sandbox_id: &str) -> Result<Option<ArtifactRow>> {
        Ok(self
            .artifacts
            .artifacts(Some(sandbox_id), None)?
            .into_iter()
            .filter(|a| a.kind == ArtifactKind::Episode)
            .max_by_key(|a| (a.created_at, a.id.clone())))
    }

    /// `GET …/{id}/episode`: builds and keeps the bundle of a running sandbox (the same
    /// episode again answers the bundle kept for it), or answers the last kept one once the
    /// sandbox is gone (404 when none). The artifact's bytes, with `X-Artifact-Id`.
    pub async fn episode_response(
        &self,
        id: &str,
        recording: Option<&str>,
        format: EpisodeFormat,
        headers: &HeaderMap,
    ) -> Result<Response> {
        let row = self.ctx.visible_row(id)?;
        let art = if row.status == SandboxStatus::Running {
            self.build_episode(&row, recording).await?
        } else {
            self.last_episode(id)?.ok_or_else(|| {
                Error::NotFound(format!(
                    "sandbox {id} is {} and no episode of it was kept",
                    row.status
                ))
            })?
        };
        let mut resp = match format {
            EpisodeFormat::Bundle => self.artifacts.artifact_response(&art.id, headers).await?,
            EpisodeFormat::Atif => axum::response::IntoResponse::into_response(axum::Json(
                self.bundle_trajectory(&art).await?,
            )),
        };
        if let Ok(v) = HeaderValue::from_str(&art.id) {
            resp.headers_mut().insert("x-artifact-id", v);
        }
        Ok(resp)
    }

    /// Keeps the episode of a sandbox about to go, when it logged any action (from
    /// `Episodes::keep_work_within`, the context's `KeepWork`, after its recordings were published).
    pub async fn keep_episode(&self, row: &SandboxRow) {
        let Ok(agent) = self.ctx.agent(row) else {
            return;
        };
        match agent_actions(&agent).await {
            Ok(a) if a.is_empty() => return,
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(sandbox = %row.id, error = %e, "no action log to keep");
                return;
            }
        }
        if let Err(e) = self.build_episode(row, None).await {
            tracing::warn!(sandbox = %row.id, error = %e, "keeping the episode");
        }
    }

    /// The episode's actions with their media times (each line as `actions.jsonl` has it,
    /// `recording` naming the bundled recording): from the live agent, else from the last
    /// kept bundle.
    pub async fn episode_actions(&self, sandbox_id: &str) -> Result<Vec<Value>> {
        let row = self.ctx.visible_row(sandbox_id)?;
        if row.status == SandboxStatus::Running
            && let Ok(agent) = self.ctx.agent(&row)
            && let Ok(actions) = agent_actions(&agent).await
        {
            let rec = choose_recording(&actions, None);
            return Ok(actions
                .iter()
                .map(|e| bundle_line(e, rec.as_deref()))
                .collect());
        }
        let Some(art) = self.last_episode(sandbox_id)? else {
            return Ok(Vec::new());
        };
        let scratch = self.bundle_copy(&art).await?;
        let path = scratch.0.clone();
        let out = tokio::task::spawn_blocking(move || read_bundle_actions(&path))
            .await
            .map_err(|e| Error::Internal(e.to_string()))?;
        out.map_err(|e| Error::Internal(format!("reading the kept episode: {e}")))
    }

    /// A kept bundle's bytes in a scratch file (removed when the answer is dropped).
    async fn bundle_copy(&self, art: &ArtifactRow) -> Result<ScratchFile> {
        let scratch = ScratchFile(self.artifacts.artifact_scratch()?);
        let (mut stream, _) = self
            .artifacts
            .blobs
            .open(&art.id, None)
            .await
            .map_err(|e| Error::Internal(format!("artifact {}: {e}", art.id)))?;
        let mut f = tokio::fs::File::create(&scratch.0)
            .await
            .map_err(|e| Error::Internal(format!("{}: {e}", scratch.0.display())))?;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| Error::Internal(format!("artifact: {e}")))?;
            tokio::io::AsyncWriteExt::write_all(&mut f, &chunk)
                .await
                .map_err(|e| Error::Internal(e.to_string()))?;
        }
        // Tokio's file writes its last buffer in the background: the copy is whole only once
        // flushed (a reader opening it at once found the zip cut short).
        tokio::io::AsyncWriteExt::flush(&mut f)
            .await
            .map_err(|e| Error::Internal(e.to_string()))?;
        Ok(scratch)
    }

    /// A kept bundle as an ATIF trajectory ([`crate::atif`]), made from its `episode.json`
    /// and `actions.jsonl`.
    async fn bundle_trajectory(&self, art: &ArtifactRow) -> Result<Value> {
        let scratch = self.bundle_copy(art).await?;
        let path = scratch.0.clone();
        let read = tokio::task::spawn_blocking(move || {
            let meta: Value = serde_json::from_slice(&read_bundle_file(&path, "episode.json")?)
                .map_err(std::io::Error::other)?;
            Ok::<_, std::io::Error>((meta, read_bundle_actions(&path)?))
        })
        .await
        .map_err(|e| Error::Internal(e.to_string()))?;
        let (meta, lines) =
            read.map_err(|e| Error::Internal(format!("reading the kept episode: {e}")))?;
        Ok(crate::atif::trajectory(
            &meta,
            &lines,
            env!("CARGO_PKG_VERSION"),
            Some(&art.id),
        ))
    }

    /// Builds the bundle of a running sandbox and keeps it as an `episode` artifact; the
    /// same episode (actions, recording, its length) answers the artifact kept for it.
    async fn build_episode(&self, row: &SandboxRow, asked: Option<&str>) -> Result<ArtifactRow> {
        let agent = self.ctx.agent(row)?;
        let actions = agent_actions(&agent).await?;
        let rec_id = choose_recording(&actions, asked);
        let rec_info = match &rec_id {
            Some(r) => Some(recording_info(&agent, r).await?),
            None => None,
        };
        let first = actions.first().and_then(|e| e["seq"].as_u64()).unwrap_or(0);
        let last = actions.last().and_then(|e| e["seq"].as_u64()).unwrap_or(0);
        let source = format!(
            "{}:{}:{first}-{last}:{}",
            rec_id.as_deref().unwrap_or("-"),
            rec_info.as_ref().map(|i| i.bytes).unwrap_or(0),
            actions.len()
        );
        if let Some(a) = self
            .ctx
            .store
            .artifact_from(&row.id, ArtifactKind::Episode, &source)?
        {
            return Ok(a);
        }
        let max = self.ctx.config.artifact_max_file_bytes;
        let dir = self.artifacts.artifact_scratch()?;
        std::fs::create_dir_all(&dir).map_err(|e| Error::Internal(format!("scratch: {e}")))?;
        let guard = Scratch(dir.clone());
        let recording = match (&rec_id, &rec_info) {
            (Some(r), Some(info)) if info.bytes > 0 => {
                let dest = dir.join("recording.mp4");
                self.bundle_recording(row, &agent, r, &dest).await?;
                Some(dest)
            }
            _ => None,
        };
        let screenshots = bundle_screenshots(&agent, &actions, &dir, max).await?;
        let lines = bundle_lines(&actions, rec_id.as_deref(), &screenshots);
        let timeline = self.whole_timeline(row).await?;
        let mut parts = Parts {
            actions: lines,
            screenshots,
            recording,
            timeline,
            meta: Value::Null,
        };
        parts.meta = bundle_meta(row, rec_info.as_ref(), &parts, first, last);
        let zip = self.zip(parts, max).await;
        drop(guard);
        let name = format!("episode-{}.zip", row.id);
        self.artifacts
            .publish_file(
                &row.id,
                None,
                &name,
                "application/zip",
                ArtifactKind::Episode,
                Some(&source),
                &zip?,
            )
            .await
    }

    /// The recording `r` into `dest`: the published artifact when there is one, else its
    /// complete part from the agent.
    async fn bundle_recording(
        &self,
        row: &SandboxRow,
        agent: &AgentClient,
        r: &str,
        dest: &Path,
    ) -> Result<()> {
        let Some(a) = self
            .ctx
            .store
            .artifact_from(&row.id, ArtifactKind::Recording, r)?
        else {
            let resp = agent_get(agent, &fill(native::RECORDING_FILE, &[r])).await?;
            let max = self.ctx.config.artifact_max_file_bytes;
            return body_to_file(resp, dest, max).await.map(|_| ());
        };
        let (mut s, _) = self
            .artifacts
            .blobs
            .open(&a.id, None)
            .await
            .map_err(|e| Error::Internal(format!("artifact {}: {e}", a.id)))?;
        let mut f = tokio::fs::File::create(dest)
            .await
            .map_err(|e| Error::Internal(e.to_string()))?;
        while let Some(chunk) = s.next().await {
            let chunk = chunk.map_err(|e| Error::Internal(e.to_string()))?;
            tokio::io::AsyncWriteExt::write_all(&mut f, &chunk)
                .await
                .map_err(|e| Error::Internal(e.to_string()))?;
        }
        // Whole before the zip reads it (see `bundle_copy`).
        tokio::io::AsyncWriteExt::flush(&mut f)
            .await
            .map_err(|e| Error::Internal(e.to_string()))
    }

    /// The sandbox's controller timeline, brought up to date first, up to `MAX_EVENTS`.
    async fn whole_timeline(&self, row: &SandboxRow) -> Result<Vec<Value>> {
        if let Err(e) = self.timeline.import_agent_events(row).await {
            tracing::debug!(sandbox = %row.id, error = %e, "agent events not imported");
        }
        let mut timeline = Vec::new();
        let mut from = 0u64;
        loop {
            let page = self.ctx.store.events(&row.id, from, 10_000)?;
            let n = page.len();
            from = page
                .last()
                .and_then(|e| e["seq"].as_u64())
                .map(|s| s + 1)
                .unwrap_or(from);
            timeline.extend(page);
            if n < 10_000 || timeline.len() >= MAX_EVENTS {
                return Ok(timeline);
            }
        }
    }

    /// The bundle's zip, written to a scratch file (removed again when it fails).
    async fn zip(&self, parts: Parts, max: u64) -> Result<PathBuf> {
        let zip_path = self.artifacts.artifact_scratch()?;
        let zp = zip_path.clone();
        let written = tokio::task::spawn_blocking(move || write_zip(&zp, &parts, max))
            .await
            .map_err(|e| Error::Internal(e.to_string()))?;
        match written {
            Ok(_) => Ok(zip_path),
            Err(e) => {
                let _ = std::fs::remove_file(&zip_path);
                Err(if e.kind() == std::io::ErrorKind::FileTooLarge {
                    Error::TooLarge(e.to_string())
                } else {
                    Error::Internal(format!("writing the episode bundle: {e}"))
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(seq: u64, recs: &[(&str, u64)]) -> Value {
        json!({
            "seq": seq,
            "action": {"action": "key", "text": "a"},
            "recordings": recs.iter().map(|(id, m)| json!({"id": id, "media_ms": m, "screenshot_media_ms": m + 10})).collect::<Vec<_>>(),
        })
    }

    #[test]
    fn the_recording_is_the_one_most_actions_fall_in() {
        let a = vec![
            entry(1, &[]),
            entry(2, &[("rec_a", 10)]),
            entry(3, &[("rec_a", 20), ("rec_b", 5)]),
            entry(4, &[("rec_b", 15)]),
            entry(5, &[("rec_b", 25)]),
        ];
        assert_eq!(choose_recording(&a, None).as_deref(), Some("rec_b"));
        assert_eq!(
            choose_recording(&a, Some("rec_a")).as_deref(),
            Some("rec_a")
        );
        // Equal counts: the one with the later actions.
        let b = vec![entry(1, &[("rec_x", 1)]), entry(2, &[("rec_y", 1)])];
        assert_eq!(choose_recording(&b, None).as_deref(), Some("rec_y"));
        assert_eq!(choose_recording(&[entry(1, &[])], None), None);
    }

    #[test]
    fn a_line_carries_the_bundled_recordings_times() {
        let e = entry(3, &[("rec_a", 20), ("rec_b", 5)]);
        let l = bundle_line(&e, Some("rec_b"));
        assert_eq!(l["media_ms"], 5);
        assert_eq!(l["screenshot_media_ms"], 15);
        assert_eq!(l["recording"], "rec_b");
        assert_eq!(l["recordings"], e["recordings"]);
        let outside = bundle_line(&entry(1, &[]), Some("rec_b"));
        assert!(outside.get("media_ms").is_none());
        assert!(bundle_line(&e, None).get("media_ms").is_none());
    }

    #[test]
    fn the_zip_holds_its_parts_media_stored_text_deflated() {
        let dir = std::env::temp_dir().join(format!("berth-episode-zip-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let rec = dir.join("r.mp4");
        std::fs::write(&rec, vec![1u8; 5000]).unwrap();
        let shot = dir.join("s.png");
        std::fs::write(&shot, vec![2u8; 300]).unwrap();
        let parts = Parts {
            actions: vec![entry(1, &[("rec_a", 10)]), entry(2, &[])],
            screenshots: vec![("000001.png".into(), shot.clone())],
            recording: Some(rec.clone()),
            timeline: vec![json!({"seq": 1, "kind": "sandbox.created"})],
            meta: json!({"sandbox": "sbx_1"}),
        };
        let out = dir.join("e.zip");
        write_zip(&out, &parts, 1 << 20).unwrap();
        let mut z = zip::ZipArchive::new(std::fs::File::open(&out).unwrap()).unwrap();
        let mut names: Vec<String> = z.file_names().map(|n| n.unwrap().to_string()).collect();
        names.sort();
        assert_eq!(
            names,
            [
                "actions.jsonl",
                "episode.json",
                "recording.mp4",
                "screenshots/",
                "screenshots/000001.png",
                "timeline.jsonl",
                "trajectory.json"
            ]
        );
        {
            let t: Value = serde_json::from_reader(z.by_name("trajectory.json").unwrap()).unwrap();
            assert_eq!(t["schema_version"], crate::atif::SCHEMA_VERSION);
        }
        {
            let f = z.by_name("recording.mp4").unwrap();
            assert_eq!(f.compression(), zip::CompressionMethod::Stored);
            assert_eq!(f.size(), 5000);
        }
        {
            let f = z.by_name("actions.jsonl").unwrap();
            assert_eq!(f.compression(), zip::CompressionMethod::Deflated);
        }
        let mut shot_bytes = Vec::new();
        z.by_name("screenshots/000001.png")
            .unwrap()
            .read_to_end(&mut shot_bytes)
            .unwrap();
        assert_eq!(shot_bytes, vec![2u8; 300]);
        let actions = read_bundle_actions(&out).unwrap();
        assert_eq!(actions.len(), 2);
        assert_eq!(actions[0]["seq"], 1);
        // Past the bound the bundle is refused.
        let e = write_zip(&out, &parts, 1000).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::FileTooLarge);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
