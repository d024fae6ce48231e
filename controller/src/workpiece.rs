//! Workpieces: documents of a sandbox (decks, sheets, documents, PDFs) the controller knows.
//!
//! The controller owns the rows, the versions (artifacts of kind `workpiece`), the proposals
//! and their review (`berth_protocol::workpiece::review`, a pure rule); the agent owns the
//! file and the formats (`POST /v1/workpiece`: the engine run as the sandbox user, and
//! `/v1/workpiece/file`: the file read or replaced whole with that user's rights).
//!
//! - A proposal is applied at once to a copy of its base version (so a bad operation is a 400
//!   then, not at review), and its result kept as an artifact with its rendered pages.
//! - Accepting makes that artifact the next version and the proposal `accepted` in one store
//!   transaction, then puts the file in place; a controller killed between the two finds the
//!   file still at the version before (`observe` says `InstallPending`) and finishes.
//! - A change made in the sandbox by other means becomes a version (author `sandbox`) at the
//!   next look: every workpiece call, the sweep every few seconds, and before the sandbox is
//!   destroyed.
//! - Rendered pages and the first page of a version's content are kept under
//!   `<data dir>/workpiece-previews/<sha256>/`, so the editor pane shows them after the sandbox
//!   is gone.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use base64::Engine as _;
use berth_protocol::events::EventKind;
use berth_protocol::routes::native;
use berth_protocol::workpiece::{
    CreateWorkpiece, Decision, MAX_PER_SANDBOX, MAX_SUMMARY_BYTES, Observed, PREVIEW_PAGES,
    ProposalStatus, ProposeEdits, Review, ReviewOutcome, VersionAuthor, WorkpieceKind,
    check_operations, format_of, observe, review, stale_message,
};
use berth_protocol::{AgentClient, ClientError};
use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::artifact::{ArtifactKind, Artifacts};
use crate::ctx::Ctx;
use crate::error::{Error, Result};
use crate::lifecycle::SandboxStatus;
use crate::store::{ProposalRow, SandboxRow, VersionRow, WorkpieceRow};
use crate::util::{KeyedLocks, new_id, now_ms, rfc3339};

/// One engine call (LibreOffice's first start in a sandbox takes a few seconds).
const ENGINE_CALL: Duration = Duration::from_secs(200);
/// A look at a file (inspect), or a file's transfer.
const QUICK_CALL: Duration = Duration::from_secs(60);
/// How often the sweep looks at running sandboxes' workpieces.
const SWEEP_EVERY_MS: i64 = 5_000;
/// The resolution previews are rendered at.
const PREVIEW_DPI: u32 = 60;

pub struct Workpieces {
    ctx: Arc<Ctx>,
    artifacts: Arc<Artifacts>,
    /// One change at a time per workpiece (a look, a proposal, a review).
    locks: KeyedLocks,
    last_sweep_ms: AtomicI64,
    /// A sweep is running (the next waits for it to end).
    sweeping: std::sync::atomic::AtomicBool,
}

/// A workpiece's place: its row, its versions, the sandbox's status.
struct Held {
    row: WorkpieceRow,
    versions: Vec<VersionRow>,
}

impl Held {
    fn latest(&self) -> &VersionRow {
        self.versions
            .last()
            .expect("a workpiece has a first version")
    }
}

impl Workpieces {
    pub fn new(ctx: Arc<Ctx>, artifacts: Arc<Artifacts>) -> Workpieces {
        Workpieces {
            ctx,
            artifacts,
            locks: KeyedLocks::default(),
            last_sweep_ms: AtomicI64::new(0),
            sweeping: Default::default(),
        }
    }

    fn previews_dir(&self, sha256: &str) -> PathBuf {
        self.ctx.data_dir.join("workpiece-previews").join(sha256)
    }

    fn held(&self, sandbox_id: &str, wid: &str) -> Result<Held> {
        self.ctx.visible_row(sandbox_id)?;
        let row = self
            .ctx
            .store
            .workpiece(wid)?
            .filter(|w| w.sandbox_id == sandbox_id)
            .ok_or_else(|| {
                Error::NotFound(format!("no workpiece {wid} in sandbox {sandbox_id}"))
            })?;
        let versions = self.ctx.store.workpiece_versions(wid)?;
        if versions.is_empty() {
            return Err(Error::Internal(format!("workpiece {wid} has no version")));
        }
        Ok(Held { row, versions })
    }

    // The agent's engine and file routes.

    async fn engine(&self, agent: &AgentClient, req: Value) -> Result<Value> {
        let op = req["op"].as_str().unwrap_or("?").to_string();
        let call = async {
            let resp = agent
                .request(reqwest::Method::POST, native::WORKPIECE)
                .json(&req)
                .send()
                .await
                .map_err(ClientError::from)?;
            let resp = berth_protocol::client::check(resp).await?;
            resp.json::<Value>()
                .await
                .map_err(|e| ClientError::Decode(e.to_string()))
        };
        tokio::time::timeout(ENGINE_CALL, call)
            .await
            .map_err(|_| Error::Agent(format!("the workpiece engine's {op} timed out")))?
            .map_err(|e| engine_error(&e))
    }

    /// The file at `path`, read as the sandbox user, into a scratch file: its path, size and
    /// SHA-256.
    async fn fetch(&self, agent: &AgentClient, path: &str) -> Result<(PathBuf, u64, String)> {
        let scratch = self.artifacts.artifact_scratch()?;
        let got = async {
            let resp = agent
                .request(reqwest::Method::GET, native::WORKPIECE_FILE)
                .query(&[("path", path)])
                .send()
                .await
                .map_err(|e| engine_error(&ClientError::from(e)))?;
            let resp = berth_protocol::client::check(resp)
                .await
                .map_err(|e| engine_error(&e))?;
            crate::artifact::body_to_file(resp, &scratch, berth_protocol::workpiece::MAX_FILE_BYTES)
                .await
        };
        match tokio::time::timeout(QUICK_CALL, got).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                let _ = std::fs::remove_file(&scratch);
                return Err(e);
            }
            Err(_) => {
                let _ = std::fs::remove_file(&scratch);
                return Err(Error::Agent(format!(
                    "reading {path} from the sandbox timed out"
                )));
            }
        }
        let (size, sha) = crate::artifact::hash_off_thread(&scratch).await?;
        Ok((scratch, size, sha))
    }

    /// Writes an artifact's bytes at `path` in the sandbox, whole, as the sandbox user.
    async fn put(
        &self,
        agent: &AgentClient,
        artifact_id: &str,
        sha256: &str,
        path: &str,
    ) -> Result<()> {
        let (mut stream, _) = self
            .artifacts
            .blobs
            .open(artifact_id, None)
            .await
            .map_err(|e| Error::Internal(format!("artifact {artifact_id}: {e}")))?;
        let mut bytes = Vec::new();
        while let Some(chunk) = stream.next().await {
            bytes.extend_from_slice(
                &chunk.map_err(|e| Error::Internal(format!("artifact {artifact_id}: {e}")))?,
            );
        }
        let call = async {
            let resp = agent
                .request(reqwest::Method::PUT, native::WORKPIECE_FILE)
                .query(&[("path", path), ("sha256", sha256)])
                .body(bytes)
                .send()
                .await
                .map_err(ClientError::from)?;
            berth_protocol::client::check(resp).await.map(drop)
        };
        tokio::time::timeout(QUICK_CALL, call)
            .await
            .map_err(|_| Error::Agent(format!("writing {path} in the sandbox timed out")))?
            .map_err(|e| engine_error(&e))
    }

    async fn discard(&self, agent: &AgentClient, path: &str) {
        let _ = self
            .engine(agent, json!({"op": "discard", "path": path}))
            .await;
    }

    // Creating.

    /// `POST …/{id}/workpieces`.
    pub async fn create(
        self: &Arc<Self>,
        sandbox_id: &str,
        req: CreateWorkpiece,
    ) -> Result<berth_protocol::workpiece::Workpiece> {
        let kind = req
            .kind
            .ok_or_else(|| Error::BadRequest("kind: one of deck, sheet, document, pdf".into()))?;
        if req.path.is_empty() || req.path.contains('\0') {
            return Err(Error::BadRequest("path: a file path in the sandbox".into()));
        }
        let format = format_of(kind, &req.path).map_err(Error::BadRequest)?;
        if let Some(t) = &req.title
            && t.len() > MAX_SUMMARY_BYTES
        {
            return Err(Error::BadRequest(format!(
                "title: at most {MAX_SUMMARY_BYTES} bytes"
            )));
        }
        let (sb, agent) = self.ctx.running_agent(sandbox_id)?;
        if let Some(run) = &req.run
            && self.ctx.store.run(&sb.id, run)?.is_none()
        {
            return Err(Error::NotFound(format!(
                "no run {run} in sandbox {sandbox_id}"
            )));
        }
        if self.ctx.store.workpieces(Some(&sb.id))?.len() >= MAX_PER_SANDBOX {
            return Err(Error::Conflict(format!(
                "sandbox {sandbox_id} has {MAX_PER_SANDBOX} workpieces, the most it may hold"
            )));
        }
        let me = self.clone();
        let sid = sb.id.clone();
        // Its own task: a caller that leaves does not leave a file without its row.
        detached("create", async move {
            me.create_in(&sid, &agent, kind, format, req).await
        })
        .await
    }

    async fn create_in(
        &self,
        sandbox_id: &str,
        agent: &AgentClient,
        kind: WorkpieceKind,
        format: &str,
        req: CreateWorkpiece,
    ) -> Result<berth_protocol::workpiece::Workpiece> {
        let made = self.make_or_inspect(agent, kind, &req).await?;
        let path = made["path"]
            .as_str()
            .ok_or_else(|| Error::Agent("the engine did not name the path".into()))?
            .to_string();
        if self
            .ctx
            .store
            .workpieces(Some(sandbox_id))?
            .iter()
            .any(|w| w.path == path)
        {
            return Err(Error::Conflict(format!(
                "{path} is a workpiece of this sandbox already"
            )));
        }
        let (file, size, sha) = self.fetch(agent, &path).await?;
        let id = new_id("wp");
        let name = base_name(&path);
        let art = self
            .artifacts
            .publish_file(
                sandbox_id,
                req.run.as_deref(),
                &name,
                WorkpieceKind::content_type(format),
                ArtifactKind::Workpiece,
                Some(&path),
                &file,
            )
            .await?;
        let title = req.title.clone().unwrap_or_else(|| stem(&name));
        let row = WorkpieceRow {
            id: id.clone(),
            sandbox_id: sandbox_id.to_string(),
            kind,
            path: path.clone(),
            title: title.clone(),
            format: format.to_string(),
            run_id: req.run.clone(),
            created_at: now_ms(),
            missing_since: None,
        };
        let first = VersionRow {
            workpiece_id: id.clone(),
            version: 1,
            artifact_id: art.id.clone(),
            sha256: sha.clone(),
            size,
            author: VersionAuthor::Creator,
            proposal_id: None,
            created_at: now_ms(),
            preview_pages: 0,
            installed: true,
        };
        if !self.ctx.store.insert_workpiece(&row, &first)? {
            let _ = self
                .artifacts
                .delete_artifact(&art.id, "workpiece exists")
                .await;
            return Err(Error::Conflict(format!(
                "{path} is a workpiece of this sandbox already"
            )));
        }
        self.created_events(&row, &first);
        self.preview_version(agent, &row, &first, &path).await;
        self.show(sandbox_id, &id)
    }

    fn created_events(&self, w: &WorkpieceRow, first: &VersionRow) {
        let mut data = json!({"workpiece": w.id, "kind": w.kind, "path": w.path, "title": w.title});
        if let Some(r) = &w.run_id {
            data["run"] = r.as_str().into();
        }
        self.ctx
            .event(&w.sandbox_id, EventKind::WorkpieceCreated, data);
        self.version_event(&w.sandbox_id, first);
    }

    /// The engine makes the new document (titled when a title is given), or checks the file
    /// already there is of its kind.
    async fn make_or_inspect(
        &self,
        agent: &AgentClient,
        kind: WorkpieceKind,
        req: &CreateWorkpiece,
    ) -> Result<Value> {
        if req.existing {
            return self
                .engine(
                    agent,
                    json!({"op": "inspect", "path": req.path, "kind": kind}),
                )
                .await;
        }
        let mut r = json!({"op": "create", "path": req.path, "kind": kind,
                           "template": if req.title.is_some() { "titled" } else { "empty" }});
        if let Some(t) = &req.title {
            r["title"] = t.as_str().into();
        }
        self.engine(agent, r).await
    }

    fn version_event(&self, sandbox_id: &str, v: &VersionRow) {
        let mut data = json!({"workpiece": v.workpiece_id, "version": v.version,
                              "author": v.author.as_str(), "sha256": v.sha256, "size": v.size});
        if let Some(p) = &v.proposal_id {
            data["proposal"] = p.as_str().into();
        }
        self.ctx
            .event(sandbox_id, EventKind::WorkpieceVersion, data);
    }

    /// Renders a version's pages and reads its first page of content from `file` (a path in
    /// the sandbox holding exactly that version), keeping both under its SHA-256.
    async fn preview_version(
        &self,
        agent: &AgentClient,
        w: &WorkpieceRow,
        v: &VersionRow,
        file: &str,
    ) {
        match self.render(agent, w.kind, file, &v.sha256).await {
            Ok(pages) => {
                let _ = self.ctx.store.set_version_previews(&w.id, v.version, pages);
            }
            Err(e) => tracing::warn!(workpiece = %w.id, version = v.version, error = %e,
                                     "rendering a version"),
        }
        self.keep_content(agent, w.kind, file, &v.sha256).await;
    }

    /// Renders `file` into the previews of `sha256` (once): the number of pages kept.
    async fn render(
        &self,
        agent: &AgentClient,
        kind: WorkpieceKind,
        file: &str,
        sha256: &str,
    ) -> Result<u32> {
        let dir = self.previews_dir(sha256);
        if let Ok(n) = std::fs::read_to_string(dir.join("pages")) {
            return Ok(n.trim().parse().unwrap_or(0));
        }
        let out = self
            .engine(
                agent,
                json!({"op": "render", "path": file, "kind": kind,
                       "max_pages": PREVIEW_PAGES, "dpi": PREVIEW_DPI}),
            )
            .await?;
        let pages = out["pages"].as_array().cloned().unwrap_or_default();
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::Internal(format!("{}: {e}", dir.display())))?;
        let mut n = 0u32;
        for (i, p) in pages.iter().enumerate().take(PREVIEW_PAGES as usize) {
            let png = p["png"]
                .as_str()
                .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
                .ok_or_else(|| Error::Agent("the engine's page is not base64".into()))?;
            if !png.starts_with(b"\x89PNG") {
                return Err(Error::Agent("the engine's page is not a PNG".into()));
            }
            write_atomic(&dir.join(format!("{}.png", i + 1)), &png)?;
            n += 1;
        }
        write_atomic(&dir.join("pages"), n.to_string().as_bytes())?;
        Ok(n)
    }

    // Looking at the file.

    /// Looks at one workpiece's file and records what changed: a new version by the sandbox,
    /// the install an accept left to do, the file gone. Called under the workpiece's lock.
    async fn sync_one(&self, agent: &AgentClient, wid: &str) -> Result<()> {
        let Some(w) = self.ctx.store.workpiece(wid)? else {
            return Ok(());
        };
        let versions = self.ctx.store.workpiece_versions(wid)?;
        let Some(latest) = versions.last() else {
            return Ok(());
        };
        let before = versions
            .iter()
            .rev()
            .nth(1)
            .filter(|_| !latest.installed)
            .map(|v| v.sha256.as_str());
        let seen = self
            .engine(
                agent,
                json!({"op": "inspect", "path": w.path, "kind": w.kind}),
            )
            .await;
        let file_sha = match &seen {
            Ok(v) => v["sha256"].as_str().map(str::to_string),
            Err(Error::NotFound(_)) => None,
            // Unreadable or not of its kind just now (a save in progress): look again later.
            Err(e) => {
                tracing::debug!(workpiece = wid, error = %e, "cannot look at the workpiece");
                return Ok(());
            }
        };
        match observe(file_sha.as_deref(), &latest.sha256, before) {
            Observed::Unchanged => {
                if !latest.installed {
                    self.ctx.store.set_version_installed(wid, latest.version)?;
                }
                if w.missing_since.is_some() {
                    self.ctx.store.set_workpiece_missing(wid, None)?;
                }
            }
            Observed::InstallPending => {
                self.put(agent, &latest.artifact_id, &latest.sha256, &w.path)
                    .await?;
                self.ctx.store.set_version_installed(wid, latest.version)?;
                tracing::info!(
                    workpiece = wid,
                    version = latest.version,
                    "put an accepted version in place"
                );
            }
            Observed::Missing => {
                if w.missing_since.is_none() {
                    self.ctx.store.set_workpiece_missing(wid, Some(now_ms()))?;
                }
            }
            Observed::Changed => {
                self.record_sandbox_version(agent, &w, latest, file_sha.as_deref())
                    .await?;
            }
        }
        Ok(())
    }

    /// The file changed by other means: its bytes become a version by `sandbox` (unless it
    /// changed again while read: the next look takes it).
    async fn record_sandbox_version(
        &self,
        agent: &AgentClient,
        w: &WorkpieceRow,
        latest: &VersionRow,
        seen_sha: Option<&str>,
    ) -> Result<()> {
        let wid = w.id.as_str();
        let (file, size, sha) = self.fetch(agent, &w.path).await?;
        if Some(sha.as_str()) != seen_sha {
            let _ = std::fs::remove_file(&file);
            return Ok(());
        }
        let art = self
            .artifacts
            .publish_file(
                &w.sandbox_id,
                None,
                &base_name(&w.path),
                WorkpieceKind::content_type(&w.format),
                ArtifactKind::Workpiece,
                Some(&w.path),
                &file,
            )
            .await?;
        let v = VersionRow {
            workpiece_id: wid.to_string(),
            version: latest.version + 1,
            artifact_id: art.id.clone(),
            sha256: sha,
            size,
            author: VersionAuthor::Sandbox,
            proposal_id: None,
            created_at: now_ms(),
            preview_pages: 0,
            installed: true,
        };
        if !self.ctx.store.insert_version(&v)? {
            let _ = self.artifacts.delete_artifact(&art.id, "superseded").await;
            return Ok(());
        }
        if !latest.installed {
            // A hand edit landed before the accepted version was put in place: it is newer,
            // and the accepted one stays a version.
            self.ctx.store.set_version_installed(wid, latest.version)?;
        }
        if w.missing_since.is_some() {
            self.ctx.store.set_workpiece_missing(wid, None)?;
        }
        self.version_event(&w.sandbox_id, &v);
        self.preview_version(agent, w, &v, &w.path).await;
        Ok(())
    }

    /// Looks at a running sandbox's workpiece (under its lock); a sandbox not running is left.
    async fn sync(&self, sandbox_id: &str, wid: &str) -> Result<()> {
        let Ok((_, agent)) = self.ctx.running_agent(sandbox_id) else {
            return Ok(());
        };
        let lock = self.locks.get(wid);
        let _held = lock.lock().await;
        self.sync_one(&agent, wid).await
    }

    /// Every workpiece of every running sandbox, at most every few seconds (the controller's
    /// sweep).
    pub async fn sweep(&self) {
        let now = now_ms();
        if now - self.last_sweep_ms.load(Ordering::Relaxed) < SWEEP_EVERY_MS {
            return;
        }
        if self
            .sweeping
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        self.sweep_all().await;
        self.last_sweep_ms.store(now_ms(), Ordering::Relaxed);
        self.sweeping.store(false, Ordering::Release);
    }

    async fn sweep_all(&self) {
        let Ok(all) = self.ctx.store.workpieces(None) else {
            return;
        };
        for w in all {
            let running = self
                .ctx
                .store
                .sandbox(&w.sandbox_id)
                .ok()
                .flatten()
                .is_some_and(|s| s.status == SandboxStatus::Running);
            if running && let Err(e) = self.sync(&w.sandbox_id, &w.id).await {
                tracing::debug!(workpiece = %w.id, error = %e, "the sweep's look failed");
            }
        }
    }

    /// Before a sandbox is destroyed (already `stopping`, its agent still up): its workpieces'
    /// last changes become versions, and an accepted version not yet in place is put there.
    pub async fn keep(&self, row: &SandboxRow) {
        let Ok(all) = self.ctx.store.workpieces(Some(&row.id)) else {
            return;
        };
        let Ok(agent) = self.ctx.agent(row) else {
            return;
        };
        for w in all {
            let lock = self.locks.get(&w.id);
            let _held = lock.lock().await;
            if let Err(e) = self.sync_one(&agent, &w.id).await {
                tracing::warn!(workpiece = %w.id, error = %e, "keeping the workpiece's last change");
            }
        }
    }

    // Reading.

    /// One workpiece as the wire shows it.
    pub fn show(
        &self,
        sandbox_id: &str,
        wid: &str,
    ) -> Result<berth_protocol::workpiece::Workpiece> {
        let h = self.held(sandbox_id, wid)?;
        let sb = self.ctx.get_row(sandbox_id)?;
        let pending = self
            .ctx
            .store
            .proposals(wid)?
            .iter()
            .filter(|p| p.status == ProposalStatus::Pending)
            .count() as u32;
        Ok(to_wire(&h, pending, sb.status != SandboxStatus::Running))
    }

    /// `GET …/workpieces/{wid}`: looked at first when the sandbox runs.
    pub async fn get(
        &self,
        sandbox_id: &str,
        wid: &str,
    ) -> Result<berth_protocol::workpiece::Workpiece> {
        self.held(sandbox_id, wid)?;
        self.sync(sandbox_id, wid).await?;
        self.show(sandbox_id, wid)
    }

    /// `GET …/workpieces`.
    pub async fn list(&self, sandbox_id: &str) -> Result<berth_protocol::workpiece::WorkpieceList> {
        self.ctx.visible_row(sandbox_id)?;
        let rows = self.ctx.store.workpieces(Some(sandbox_id))?;
        let mut out = Vec::with_capacity(rows.len());
        for w in rows {
            self.sync(sandbox_id, &w.id).await?;
            out.push(self.show(sandbox_id, &w.id)?);
        }
        Ok(berth_protocol::workpiece::WorkpieceList { workpieces: out })
    }

    /// `GET …/workpieces/{wid}/content`: a version's structured content, one page of it.
    pub async fn content(
        &self,
        sandbox_id: &str,
        wid: &str,
        version: Option<u32>,
        page: u32,
        sheet: Option<String>,
    ) -> Result<Value> {
        self.held(sandbox_id, wid)?;
        self.sync(sandbox_id, wid).await?;
        let h = self.held(sandbox_id, wid)?;
        let v = match version {
            None => h.latest().clone(),
            Some(n) => h
                .versions
                .iter()
                .find(|v| v.version == n)
                .cloned()
                .ok_or_else(|| Error::NotFound(format!("workpiece {wid} has no version {n}")))?,
        };
        let mut answer = match self.ctx.running_agent(sandbox_id) {
            Ok((_, agent)) => self.read_live(&agent, &h, &v, page, sheet).await?,
            Err(_) => {
                // A record: the first page kept when the version was made.
                let kept = self.previews_dir(&v.sha256).join("content.json");
                match (page, sheet.as_deref(), std::fs::read(&kept)) {
                    (0, None, Ok(b)) => {
                        let mut c: Value = serde_json::from_slice(&b)
                            .map_err(|e| Error::Internal(format!("{}: {e}", kept.display())))?;
                        c["record"] = true.into();
                        c
                    }
                    _ => {
                        return Err(Error::Conflict(format!(
                            "sandbox {sandbox_id} is not running: only the first page of each \
                             version's content is kept (page=0, no sheet)"
                        )));
                    }
                }
            }
        };
        if let Value::Object(m) = &mut answer {
            m.remove("ok");
            m.insert("workpiece".into(), wid.into());
            m.insert("version".into(), v.version.into());
        }
        Ok(answer)
    }

    /// One page of a version's content read in the running sandbox: the file itself when it is
    /// the latest version in place, else a copy of the version staged for the read.
    async fn read_live(
        &self,
        agent: &AgentClient,
        h: &Held,
        v: &VersionRow,
        page: u32,
        sheet: Option<String>,
    ) -> Result<Value> {
        let lock = self.locks.get(&h.row.id);
        let _held = lock.lock().await;
        let is_latest = v.version == h.latest().version && h.latest().installed;
        let (file, staged) = if is_latest {
            (h.row.path.clone(), false)
        } else {
            let staged = scratch_path(&new_id("read"), &h.row.format);
            self.put(agent, &v.artifact_id, &v.sha256, &staged).await?;
            (staged, true)
        };
        let mut req = json!({"op": "read", "path": file, "kind": h.row.kind, "page": page});
        if let Some(s) = &sheet {
            req["sheet"] = s.as_str().into();
        }
        let read = self.engine(agent, req).await;
        if staged {
            self.discard(agent, &file).await;
        }
        let mut read = read?;
        // The file may have changed between the look and the read.
        if is_latest
            && let Ok(now) = self
                .engine(
                    agent,
                    json!({"op": "inspect", "path": file, "kind": h.row.kind}),
                )
                .await
            && now["sha256"].as_str() != Some(v.sha256.as_str())
        {
            read["changed_since"] = true.into();
        }
        Ok(read)
    }

    /// A rendered page of a version (`page` from 1): rendered now when not kept and the
    /// sandbox runs.
    pub async fn version_page(
        &self,
        sandbox_id: &str,
        wid: &str,
        version: u32,
        page: u32,
    ) -> Result<Vec<u8>> {
        let h = self.held(sandbox_id, wid)?;
        let v = h
            .versions
            .iter()
            .find(|v| v.version == version)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("workpiece {wid} has no version {version}")))?;
        let png = self.previews_dir(&v.sha256).join(format!("{page}.png"));
        if !png.exists()
            && !self.previews_dir(&v.sha256).join("pages").exists()
            && let Ok((_, agent)) = self.ctx.running_agent(sandbox_id)
        {
            let staged = scratch_path(&new_id("render"), &h.row.format);
            self.put(&agent, &v.artifact_id, &v.sha256, &staged).await?;
            let pages = self.render(&agent, h.row.kind, &staged, &v.sha256).await;
            self.discard(&agent, &staged).await;
            self.ctx.store.set_version_previews(wid, version, pages?)?;
        }
        std::fs::read(&png).map_err(|_| {
            Error::NotFound(format!(
                "version {version} of {wid} has no rendered page {page}"
            ))
        })
    }

    /// A rendered page of a proposal's result (`page` from 1).
    pub fn proposal_page(
        &self,
        sandbox_id: &str,
        wid: &str,
        pid: &str,
        page: u32,
    ) -> Result<Vec<u8>> {
        let p = self.proposal_row(sandbox_id, wid, pid)?;
        std::fs::read(
            self.previews_dir(&p.preview_sha256)
                .join(format!("{page}.png")),
        )
        .map_err(|_| Error::NotFound(format!("proposal {pid} has no rendered page {page}")))
    }

    /// The first page of a proposal's result as structured content (kept when it was
    /// proposed): what the editor pane compares with its base.
    pub fn proposal_content(&self, sandbox_id: &str, wid: &str, pid: &str) -> Result<Value> {
        let p = self.proposal_row(sandbox_id, wid, pid)?;
        let kept = self.previews_dir(&p.preview_sha256).join("content.json");
        let bytes = std::fs::read(&kept)
            .map_err(|_| Error::NotFound(format!("proposal {pid} has no kept content")))?;
        let mut c: Value = serde_json::from_slice(&bytes)
            .map_err(|e| Error::Internal(format!("{}: {e}", kept.display())))?;
        if let Value::Object(m) = &mut c {
            m.remove("ok");
            m.remove("path");
            m.insert("workpiece".into(), wid.into());
            m.insert("proposal".into(), pid.into());
        }
        Ok(c)
    }

    /// `POST …/workpieces/{wid}/open`.
    pub async fn open(&self, sandbox_id: &str, wid: &str) -> Result<Value> {
        let h = self.held(sandbox_id, wid)?;
        let (_, agent) = self.ctx.running_agent(sandbox_id)?;
        let mut out = self
            .engine(
                &agent,
                json!({"op": "open", "path": h.row.path, "kind": h.row.kind}),
            )
            .await?;
        if let Value::Object(m) = &mut out {
            m.remove("ok");
            m.insert("workpiece".into(), wid.into());
        }
        Ok(out)
    }

    // Proposals.

    fn proposal_row(&self, sandbox_id: &str, wid: &str, pid: &str) -> Result<ProposalRow> {
        self.held(sandbox_id, wid)?;
        self.ctx
            .store
            .proposal(pid)?
            .filter(|p| p.workpiece_id == wid)
            .ok_or_else(|| Error::NotFound(format!("no proposal {pid} of workpiece {wid}")))
    }

    fn proposal_wire(&self, p: &ProposalRow) -> Result<berth_protocol::workpiece::Proposal> {
        let latest = self
            .ctx
            .store
            .workpiece_versions(&p.workpiece_id)?
            .last()
            .map(|v| v.version)
            .unwrap_or(0);
        Ok(proposal_to_wire(p, latest))
    }

    /// `POST …/workpieces/{wid}/proposals`.
    pub async fn propose(
        self: &Arc<Self>,
        sandbox_id: &str,
        wid: &str,
        req: ProposeEdits,
    ) -> Result<berth_protocol::workpiece::Proposal> {
        let h = self.held(sandbox_id, wid)?;
        let ops = check_operations(h.row.kind, &req.operations)
            .map_err(|r| Error::BadRequest(r.message))?;
        let mut req = req;
        // Kept as the typed operations say them (no nulls, no unknown fields).
        req.operations = ops
            .iter()
            .map(|o| serde_json::to_value(o).unwrap_or_default())
            .collect();
        if req.summary.trim().is_empty() || req.summary.len() > MAX_SUMMARY_BYTES {
            return Err(Error::BadRequest(format!(
                "summary: what the edits do, 1-{MAX_SUMMARY_BYTES} bytes"
            )));
        }
        if let Some(run) = &req.run
            && self.ctx.store.run(sandbox_id, run)?.is_none()
        {
            return Err(Error::NotFound(format!(
                "no run {run} in sandbox {sandbox_id}"
            )));
        }
        let (_, agent) = self.ctx.running_agent(sandbox_id)?;
        let me = self.clone();
        let (sid, wid) = (sandbox_id.to_string(), wid.to_string());
        detached("proposal", async move {
            me.propose_in(&sid, &wid, &agent, req).await
        })
        .await
    }

    async fn propose_in(
        &self,
        sandbox_id: &str,
        wid: &str,
        agent: &AgentClient,
        req: ProposeEdits,
    ) -> Result<berth_protocol::workpiece::Proposal> {
        let lock = self.locks.get(wid);
        let _held = lock.lock().await;
        self.sync_one(agent, wid).await?;
        let h = self.held(sandbox_id, wid)?;
        let latest = h.latest().clone();
        if req.base_version != latest.version {
            return Err(Error::Conflict(stale_message(
                req.base_version,
                latest.version,
            )));
        }
        let id = new_id("wpp");
        let (artifact, size, sha, pages) = self
            .stage_proposal(agent, sandbox_id, &h.row, &latest, &id, &req)
            .await?;
        let row = ProposalRow {
            id: id.clone(),
            workpiece_id: wid.to_string(),
            base_version: latest.version,
            summary: req.summary.clone(),
            operations: serde_json::to_string(&req.operations).unwrap_or_else(|_| "[]".into()),
            status: ProposalStatus::Pending,
            preview_artifact: artifact,
            preview_sha256: sha,
            preview_size: size,
            preview_pages: pages,
            result_version: None,
            run_id: req.run.clone(),
            created_at: now_ms(),
            decided_at: None,
            reason: None,
        };
        self.ctx.store.insert_proposal(&row)?;
        let mut data = json!({"workpiece": wid, "proposal": id, "base_version": latest.version,
                              "operations": req.operations.len(), "summary": req.summary});
        if let Some(r) = &req.run {
            data["run"] = r.as_str().into();
        }
        self.ctx
            .event(sandbox_id, EventKind::WorkpieceProposed, data);
        self.proposal_wire(&row)
    }

    /// Applies a proposal's operations to a copy of exactly its base version in the sandbox and
    /// keeps the result as an artifact with its rendered pages and first content page: the
    /// artifact, its size and SHA-256, and the pages rendered.
    async fn stage_proposal(
        &self,
        agent: &AgentClient,
        sandbox_id: &str,
        w: &WorkpieceRow,
        base_version: &VersionRow,
        id: &str,
        req: &ProposeEdits,
    ) -> Result<(String, u64, String, u32)> {
        let base = scratch_path(&format!("{id}-base"), &w.format);
        let out = scratch_path(id, &w.format);
        let result = async {
            self.put(
                agent,
                &base_version.artifact_id,
                &base_version.sha256,
                &base,
            )
            .await?;
            self.engine(
                agent,
                json!({"op": "apply", "path": base, "out": out, "kind": w.kind,
                       "ops": req.operations}),
            )
            .await?;
            let (file, size, sha) = self.fetch(agent, &out).await?;
            let pages = self.render(agent, w.kind, &out, &sha).await.unwrap_or(0);
            self.keep_content(agent, w.kind, &out, &sha).await;
            let name = format!("{}.proposal-{id}{}", stem(&base_name(&w.path)), w.format);
            let art = self
                .artifacts
                .publish_file(
                    sandbox_id,
                    req.run.as_deref(),
                    &name,
                    WorkpieceKind::content_type(&w.format),
                    ArtifactKind::Workpiece,
                    Some(&format!("{}#{id}", w.path)),
                    &file,
                )
                .await?;
            Ok::<_, Error>((art.id, size, sha, pages))
        }
        .await;
        self.discard(agent, &base).await;
        self.discard(agent, &out).await;
        result
    }

    /// Keeps the first page of `file`'s content (a version or a proposal's result, `sha256`)
    /// for when the sandbox is gone.
    async fn keep_content(
        &self,
        agent: &AgentClient,
        kind: WorkpieceKind,
        file: &str,
        sha256: &str,
    ) {
        let kept = self.previews_dir(sha256).join("content.json");
        if kept.exists() {
            return;
        }
        if let Ok(c) = self
            .engine(
                agent,
                json!({"op": "read", "path": file, "kind": kind, "page": 0}),
            )
            .await
        {
            let _ = write_atomic(&kept, c.to_string().as_bytes());
        }
    }

    /// `GET …/workpieces/{wid}/proposals`.
    pub fn proposals(
        &self,
        sandbox_id: &str,
        wid: &str,
        status: Option<&str>,
    ) -> Result<berth_protocol::workpiece::ProposalList> {
        self.held(sandbox_id, wid)?;
        let want = match status {
            None => None,
            Some(s) => Some(ProposalStatus::parse(s).ok_or_else(|| {
                Error::BadRequest(format!("status {s:?}: pending, accepted or rejected"))
            })?),
        };
        let rows = self.ctx.store.proposals(wid)?;
        let proposals = rows
            .iter()
            .filter(|p| want.is_none_or(|w| p.status == w))
            .map(|p| self.proposal_wire(p))
            .collect::<Result<_>>()?;
        Ok(berth_protocol::workpiece::ProposalList { proposals })
    }

    /// `GET …/proposals/{pid}`.
    pub fn proposal(
        &self,
        sandbox_id: &str,
        wid: &str,
        pid: &str,
    ) -> Result<berth_protocol::workpiece::Proposal> {
        let p = self.proposal_row(sandbox_id, wid, pid)?;
        self.proposal_wire(&p)
    }

    /// `POST …/proposals/{pid}/accept`: a person's act.
    pub async fn accept(
        self: &Arc<Self>,
        sandbox_id: &str,
        wid: &str,
        pid: &str,
    ) -> Result<berth_protocol::workpiece::Proposal> {
        self.proposal_row(sandbox_id, wid, pid)?;
        let (_, agent) = self.ctx.running_agent(sandbox_id)?;
        let me = self.clone();
        let (sid, wid, pid) = (sandbox_id.to_string(), wid.to_string(), pid.to_string());
        // Its own task: a reviewer who leaves mid-accept does not stop it halfway.
        detached("accept", async move {
            me.accept_in(&sid, &wid, &pid, &agent).await
        })
        .await
    }

    async fn accept_in(
        &self,
        sandbox_id: &str,
        wid: &str,
        pid: &str,
        agent: &AgentClient,
    ) -> Result<berth_protocol::workpiece::Proposal> {
        let lock = self.locks.get(wid);
        let _held = lock.lock().await;
        // A change made by hand first becomes a version (and makes this proposal stale).
        self.sync_one(agent, wid).await?;
        let h = self.held(sandbox_id, wid)?;
        let p = self.proposal_row(sandbox_id, wid, pid)?;
        match review(p.status, Review::Accept, p.base_version, h.latest().version) {
            ReviewOutcome::AlreadyDone => return self.proposal_wire(&p),
            ReviewOutcome::Conflict(m) => return Err(Error::Conflict(m)),
            ReviewOutcome::Reject => unreachable!("an accept never rejects"),
            ReviewOutcome::Apply { new_version } => {
                if !self.ctx.store.accept_proposal(&p, now_ms())? {
                    let latest = self.held(sandbox_id, wid)?.latest().version;
                    return Err(Error::Conflict(stale_message(p.base_version, latest)));
                }
                self.ctx.event(
                    sandbox_id,
                    EventKind::WorkpieceAccepted,
                    json!({"workpiece": wid, "proposal": pid, "version": new_version}),
                );
                let h = self.held(sandbox_id, wid)?;
                let v = h.latest().clone();
                self.version_event(sandbox_id, &v);
                // Then in place; if this fails the sweep finishes it (the file is still the
                // version before).
                match self
                    .put(agent, &v.artifact_id, &v.sha256, &h.row.path)
                    .await
                {
                    Ok(()) => self.ctx.store.set_version_installed(wid, v.version)?,
                    Err(e) => tracing::warn!(workpiece = wid, version = v.version, error = %e,
                                             "the accepted version is not in place yet"),
                }
            }
        }
        let p = self.proposal_row(sandbox_id, wid, pid)?;
        self.proposal_wire(&p)
    }

    /// `POST …/proposals/{pid}/reject`: a person's act; the file stays as it is.
    pub async fn reject(
        &self,
        sandbox_id: &str,
        wid: &str,
        pid: &str,
        d: Decision,
    ) -> Result<berth_protocol::workpiece::Proposal> {
        if let Some(r) = &d.reason
            && r.len() > MAX_SUMMARY_BYTES
        {
            return Err(Error::BadRequest(format!(
                "reason: at most {MAX_SUMMARY_BYTES} bytes"
            )));
        }
        let lock = self.locks.get(wid);
        let _held = lock.lock().await;
        let h = self.held(sandbox_id, wid)?;
        let p = self.proposal_row(sandbox_id, wid, pid)?;
        match review(p.status, Review::Reject, p.base_version, h.latest().version) {
            ReviewOutcome::AlreadyDone => {}
            ReviewOutcome::Conflict(m) => return Err(Error::Conflict(m)),
            ReviewOutcome::Apply { .. } => unreachable!("a reject never applies"),
            ReviewOutcome::Reject => {
                if self
                    .ctx
                    .store
                    .reject_proposal(pid, now_ms(), d.reason.as_deref())?
                {
                    let mut data = json!({"workpiece": wid, "proposal": pid});
                    if let Some(r) = &d.reason {
                        data["reason"] = r.as_str().into();
                    }
                    self.ctx
                        .event(sandbox_id, EventKind::WorkpieceRejected, data);
                }
            }
        }
        let p = self.proposal_row(sandbox_id, wid, pid)?;
        self.proposal_wire(&p)
    }
}

/// An agent's answer to a workpiece call as the controller's error: the engine's refusals keep
/// their class.
fn engine_error(e: &ClientError) -> Error {
    let msg = match e {
        ClientError::Api { body, .. } => body.error.message.clone(),
        e => e.to_string(),
    };
    match e.status() {
        Some(400) => Error::BadRequest(msg),
        Some(403) => Error::Unprocessable(format!("the sandbox user cannot reach it: {msg}")),
        Some(404) => Error::NotFound(msg),
        Some(409) => Error::Conflict(msg),
        Some(413) => Error::TooLarge(msg),
        Some(503) => Error::Unprocessable(msg),
        _ => Error::Agent(format!("the workpiece engine: {msg}")),
    }
}

/// A staged file of a proposal or read, under the sandbox user's scratch directory.
fn scratch_path(name: &str, format: &str) -> String {
    format!("~/{}/{name}{format}", berth_protocol::workpiece::SCRATCH)
}

/// Runs `f` in its own task, so a caller that leaves mid-call does not stop it halfway (a file
/// without its row, an accept without its install).
async fn detached<T: Send + 'static>(
    what: &str,
    f: impl std::future::Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    tokio::spawn(f)
        .await
        .map_err(|e| Error::Internal(format!("the {what}'s task: {e}")))?
}

fn base_name(path: &str) -> String {
    Path::new(path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "workpiece".into())
}

fn stem(name: &str) -> String {
    Path::new(name)
        .file_stem()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| name.to_string())
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::Internal(format!("{}: {e}", dir.display())))?;
    }
    let tmp = path.with_extension(format!("tmp{}", crate::util::random_hex(4)));
    std::fs::write(&tmp, bytes)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            Error::Internal(format!("{}: {e}", path.display()))
        })
}

fn to_wire(h: &Held, pending: u32, record: bool) -> berth_protocol::workpiece::Workpiece {
    berth_protocol::workpiece::Workpiece {
        id: h.row.id.clone(),
        sandbox: h.row.sandbox_id.clone(),
        kind: h.row.kind,
        path: h.row.path.clone(),
        title: h.row.title.clone(),
        format: h.row.format.clone(),
        run: h.row.run_id.clone(),
        created_at: rfc3339(h.row.created_at),
        latest_version: h.latest().version,
        versions: h
            .versions
            .iter()
            .map(|v| berth_protocol::workpiece::WorkpieceVersion {
                version: v.version,
                sha256: v.sha256.clone(),
                size: v.size,
                author: v.author,
                proposal: v.proposal_id.clone(),
                artifact_id: v.artifact_id.clone(),
                created_at: rfc3339(v.created_at),
                preview_pages: v.preview_pages,
            })
            .collect(),
        pending_proposals: pending,
        missing: h.row.missing_since.is_some(),
        record,
    }
}

fn proposal_to_wire(p: &ProposalRow, latest: u32) -> berth_protocol::workpiece::Proposal {
    berth_protocol::workpiece::Proposal {
        id: p.id.clone(),
        workpiece: p.workpiece_id.clone(),
        base_version: p.base_version,
        summary: p.summary.clone(),
        operations: serde_json::from_str(&p.operations).unwrap_or_default(),
        status: p.status,
        result_version: p.result_version,
        stale: p.status == ProposalStatus::Pending && p.base_version != latest,
        run: p.run_id.clone(),
        created_at: rfc3339(p.created_at),
        decided_at: p.decided_at.map(rfc3339),
        preview_pages: p.preview_pages,
        preview_artifact_id: p.preview_artifact.clone(),
        preview_sha256: p.preview_sha256.clone(),
    }
}
