//! Artifacts: files the controller keeps of a sandbox past its end — its recordings, files and
//! directories published from it, run output past the inline bound, episode bundles. The bytes
//! go to a blob store ([`blob::BlobStore`], local under `<data dir>/artifacts/`), the metadata
//! to the store's `artifacts` table; every artifact is on its sandbox's timeline
//! (`artifact.published`, `artifact.deleted`) and lives until the retention setting ends it.

pub mod blob;
mod publish;
pub(crate) use publish::body_to_file;
mod recordings;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use berth_protocol::events::EventKind;
use berth_protocol::sync::Locked;
use serde_json::json;

use crate::ctx::Ctx;
use crate::error::{Error, Result};
pub use crate::store::ArtifactKind;
use crate::store::ArtifactRow;
use crate::util::{new_id, now_ms};
use blob::{BlobStore, LocalBlobs};

/// The controller's artifact machinery: the blob store and who is working on what.
/// Artifacts: what is published from sandboxes (files, directories, recordings, outputs,
/// episodes), their blob store and their retention.
pub struct Artifacts {
    ctx: Arc<Ctx>,
    pub blobs: Arc<dyn BlobStore>,
    /// Blobs put whose row is not written yet (the orphan sweep leaves them alone).
    in_flight: Mutex<HashSet<String>>,
    /// One publish at a time per (sandbox, source), so a source is fetched once.
    pub(crate) source_locks: crate::util::KeyedLocks,
    /// When retention last ran.
    last_sweep_ms: std::sync::atomic::AtomicI64,
}

impl Artifacts {
    /// The local blob store under `root` (`<data dir>/artifacts`).
    pub fn open_local(ctx: Arc<Ctx>, root: &Path) -> Result<Artifacts> {
        let blobs = LocalBlobs::open(root)
            .map_err(|e| Error::Internal(format!("artifacts at {}: {e}", root.display())))?;
        Ok(Artifacts {
            ctx,
            blobs: Arc::new(blobs),
            in_flight: Default::default(),
            source_locks: Default::default(),
            last_sweep_ms: Default::default(),
        })
    }
}

/// How often retention runs (from the controller's sweep).
const RETENTION_EVERY_MS: i64 = 5_000;

/// Which artifacts retention deletes, oldest first: those older than `retention_secs` (0:
/// none), then the oldest until the rest fit in `max_bytes` (0: no bound). `rows` is
/// `(id, created_at ms, size)` in any order.
pub fn retention_victims(
    rows: &[(String, i64, u64)],
    now_ms: i64,
    retention_secs: u64,
    max_bytes: u64,
) -> Vec<String> {
    let mut rows: Vec<&(String, i64, u64)> = rows.iter().collect();
    rows.sort_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)));
    let expired = |at: i64| retention_secs > 0 && at + (retention_secs as i64) * 1000 <= now_ms;
    let mut out = Vec::new();
    let mut kept = Vec::new();
    for r in rows {
        if expired(r.1) {
            out.push(r.0.clone());
        } else {
            kept.push(r);
        }
    }
    if max_bytes > 0 {
        let mut total: u64 = kept.iter().map(|r| r.2).sum();
        for r in kept {
            if total <= max_bytes {
                break;
            }
            total -= r.2;
            out.push(r.0.clone());
        }
    }
    out
}

/// The content type an artifact name suggests.
pub fn content_type_for(name: &str) -> String {
    mime_guess::from_path(name)
        .first_or_octet_stream()
        .essence_str()
        .to_string()
}

/// An artifact name: one path component, 1–255 bytes, no control characters.
pub fn check_name(name: &str) -> Result<()> {
    if name.is_empty()
        || name.len() > 255
        || name == "."
        || name == ".."
        || name.contains('/')
        || name.chars().any(char::is_control)
    {
        return Err(Error::BadRequest(format!(
            "artifact name {name:?}: use 1-255 bytes, no '/' or control characters"
        )));
    }
    Ok(())
}

/// `Content-Disposition` naming the file: ASCII fallback plus RFC 5987 UTF-8.
fn disposition(name: &str, inline: bool) -> String {
    let ascii: String = name
        .chars()
        .map(|c| {
            if (c.is_ascii_graphic() && c != '"' && c != '\\') || c == ' ' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let encoded: String = name
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    let how = if inline { "inline" } else { "attachment" };
    format!("{how}; filename=\"{ascii}\"; filename*=UTF-8''{encoded}")
}

impl Artifacts {
    /// A fresh temp path on the artifacts' file system for building a file to publish.
    pub fn artifact_scratch(&self) -> Result<PathBuf> {
        self.blobs
            .scratch()
            .map_err(|e| Error::Internal(format!("artifact scratch: {e}")))
    }

    /// Publishes `file` (taken over: it is moved into the blob store) as an artifact of the
    /// sandbox, and puts it on its timeline. For a kind with one artifact per source
    /// (`ArtifactKind::one_per_source`), publishing the same source again answers the
    /// artifact published first.
    #[allow(clippy::too_many_arguments)]
    pub async fn publish_file(
        &self,
        sandbox_id: &str,
        run_id: Option<&str>,
        name: &str,
        content_type: &str,
        kind: ArtifactKind,
        source: Option<&str>,
        file: &Path,
    ) -> Result<ArtifactRow> {
        check_name(name)?;
        if let Some(src) = source.filter(|_| kind.one_per_source())
            && let Some(a) = self.ctx.store.artifact_from(sandbox_id, kind, src)?
        {
            let _ = std::fs::remove_file(file);
            return Ok(a);
        }
        let id = new_id("art");
        let (size, sha256) = hash_off_thread(file).await?;
        let row = ArtifactRow {
            id: id.clone(),
            sandbox_id: sandbox_id.to_string(),
            run_id: run_id.map(str::to_string),
            name: name.to_string(),
            content_type: content_type.to_string(),
            size,
            sha256,
            kind,
            source: source.map(str::to_string),
            created_at: now_ms(),
        };
        match self.store_published(&row, file).await {
            Ok(true) => {}
            Ok(false) => {
                // Another publish of this source won the race: answer its artifact.
                let _ = self.blobs.delete(&id).await;
                let src = source.unwrap_or_default();
                return self
                    .ctx
                    .store
                    .artifact_from(sandbox_id, kind, src)?
                    .ok_or_else(|| Error::Internal("the artifact vanished".into()));
            }
            Err(e) => {
                let _ = self.blobs.delete(&id).await;
                let _ = std::fs::remove_file(file);
                return Err(e);
            }
        }
        self.ctx.metrics.artifact_published(size);
        self.announce_published(&row);
        Ok(row)
    }

    /// Puts a published file's bytes in the blob store, then its row in the store; the blob is
    /// in flight meanwhile (the orphan sweep leaves it alone). False when another publish of
    /// the same source won the race.
    async fn store_published(&self, row: &ArtifactRow, file: &Path) -> Result<bool> {
        self.in_flight.locked().insert(row.id.clone());
        let inserted = match self.blobs.put(&row.id, file).await {
            Ok(()) => self
                .ctx
                .store
                .insert_artifact(row)
                .map_err(|e| Error::Internal(e.to_string())),
            Err(e) => Err(Error::Internal(format!("storing the artifact: {e}"))),
        };
        self.in_flight.locked().remove(&row.id);
        inserted
    }

    /// Puts a published artifact on its sandbox's timeline (`artifact.published`).
    fn announce_published(&self, row: &ArtifactRow) {
        let mut data = json!({
            "artifact_id": row.id,
            "name": row.name,
            "artifact_kind": row.kind.as_str(),
            "size": row.size,
            "content_type": row.content_type,
        });
        if let Some(r) = &row.run_id {
            data["run"] = r.as_str().into();
        }
        if let Some(s) = &row.source {
            data["artifact_source"] = s.as_str().into();
        }
        self.ctx
            .event(&row.sandbox_id, EventKind::ArtifactPublished, data);
    }

    /// One artifact; `Error::NotFound` when absent.
    /// An artifact's last `n` bytes at most (a preview's tail).
    pub async fn read_tail(&self, id: &str, size: u64, n: u64) -> Result<Vec<u8>> {
        use futures_util::StreamExt;
        if size == 0 {
            return Ok(Vec::new());
        }
        let start = size.saturating_sub(n);
        let (mut stream, _) = self
            .blobs
            .open(id, Some((start, size - 1)))
            .await
            .map_err(|e| Error::NotFound(format!("artifact {id}: {e}")))?;
        let mut out = Vec::new();
        while let Some(chunk) = stream.next().await {
            out.extend(chunk.map_err(|e| Error::Internal(format!("artifact {id}: {e}")))?);
        }
        Ok(out)
    }

    /// A small artifact's bytes whole (records the controller kept; at most 64 MiB).
    pub async fn read_all(&self, id: &str) -> Result<Vec<u8>> {
        use futures_util::StreamExt;
        const MAX: u64 = 64 << 20;
        let (mut stream, size) = self
            .blobs
            .open(id, None)
            .await
            .map_err(|e| Error::NotFound(format!("artifact {id}: {e}")))?;
        if size > MAX {
            return Err(Error::TooLarge(format!("artifact {id} is {size} bytes")));
        }
        let mut out = Vec::with_capacity(size as usize);
        while let Some(chunk) = stream.next().await {
            out.extend(chunk.map_err(|e| Error::Internal(format!("artifact {id}: {e}")))?);
        }
        Ok(out)
    }

    pub fn artifact(&self, id: &str) -> Result<ArtifactRow> {
        self.ctx
            .store
            .artifact(id)?
            .ok_or_else(|| Error::NotFound(format!("no artifact {id}")))
    }

    /// Artifacts, oldest first, of a sandbox and/or run when given.
    pub fn artifacts(&self, sandbox: Option<&str>, run: Option<&str>) -> Result<Vec<ArtifactRow>> {
        Ok(self.ctx.store.artifacts(sandbox, run)?)
    }

    /// Deletes an artifact: its row with its `artifact.deleted` event (one transaction), then
    /// its bytes; `Error::NotFound` when absent.
    pub async fn delete_artifact(&self, id: &str, reason: &str) -> Result<ArtifactRow> {
        let row = self.artifact(id)?;
        let data = crate::ctx::controller_event_data(json!({
            "artifact_id": row.id, "name": row.name, "artifact_kind": row.kind.as_str(),
            "reason": reason}));
        if !self.ctx.store.delete_artifact(
            id,
            now_ms(),
            EventKind::ArtifactDeleted.as_str(),
            &data,
        )? {
            return Err(Error::NotFound(format!("no artifact {id}")));
        }
        if let Err(e) = self.blobs.delete(id).await {
            tracing::warn!(artifact = id, error = %e, "deleting an artifact's bytes");
        }
        self.ctx.metrics.artifact_deleted(row.size);
        Ok(row)
    }

    /// The bytes of an artifact as an HTTP answer: streamed, one `Range` honoured (206, or
    /// 416 when unsatisfiable), with its content type, length, name and `ETag` (its SHA-256).
    pub async fn artifact_response(&self, id: &str, headers: &HeaderMap) -> Result<Response> {
        let row = self.artifact(id)?;
        let etag = format!("\"{}\"", row.sha256);
        let len = row.size;
        if headers
            .get(header::IF_NONE_MATCH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"))
        {
            let mut resp = StatusCode::NOT_MODIFIED.into_response();
            if let Ok(v) = HeaderValue::from_str(&etag) {
                resp.headers_mut().insert(header::ETAG, v);
            }
            return Ok(resp);
        }
        // A Range under an If-Range naming another version is ignored (the whole answer).
        let if_range_ok = headers
            .get(header::IF_RANGE)
            .and_then(|v| v.to_str().ok())
            .is_none_or(|v| v.trim() == etag);
        let range = match headers.get(header::RANGE).and_then(|v| v.to_str().ok()) {
            Some(r) if if_range_ok => match berth_protocol::range::parse_range(r, len) {
                Some(r) => Some(r),
                None => {
                    let body = berth_protocol::ErrorBody::new(
                        "range_not_satisfiable",
                        format!("cannot serve {r} of {len} bytes"),
                    );
                    let mut resp =
                        (StatusCode::RANGE_NOT_SATISFIABLE, axum::Json(body)).into_response();
                    if let Ok(v) = HeaderValue::from_str(&format!("bytes */{len}")) {
                        resp.headers_mut().insert(header::CONTENT_RANGE, v);
                    }
                    return Ok(resp);
                }
            },
            _ => None,
        };
        let (stream, count) = self
            .blobs
            .open(id, if len == 0 { None } else { range })
            .await
            .map_err(|e| Error::Internal(format!("artifact {id}: {e}")))?;
        let mut resp = Response::new(Body::from_stream(stream));
        *resp.status_mut() = if range.is_some() {
            StatusCode::PARTIAL_CONTENT
        } else {
            StatusCode::OK
        };
        let h = resp.headers_mut();
        if let Ok(v) = HeaderValue::from_str(&row.content_type) {
            h.insert(header::CONTENT_TYPE, v);
        }
        h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(count));
        if let Ok(v) = HeaderValue::from_str(&etag) {
            h.insert(header::ETAG, v);
        }
        if let Some((start, end)) = range
            && let Ok(v) = HeaderValue::from_str(&format!("bytes {start}-{end}/{len}"))
        {
            h.insert(header::CONTENT_RANGE, v);
        }
        let inline = ["video/", "image/", "text/"]
            .iter()
            .any(|p| row.content_type.starts_with(p));
        if let Ok(v) = HeaderValue::from_str(&disposition(&row.name, inline)) {
            h.insert(header::CONTENT_DISPOSITION, v);
        }
        Ok(resp)
    }

    /// Retention (from the controller's sweep, at most every few seconds): deletes expired
    /// artifacts and, past `artifact_max_bytes`, the oldest; then blobs no row names.
    pub async fn sweep_artifacts(&self) {
        use std::sync::atomic::Ordering;
        let now = now_ms();
        let last = self.last_sweep_ms.load(Ordering::Relaxed);
        if now - last < RETENTION_EVERY_MS {
            return;
        }
        self.last_sweep_ms.store(now, Ordering::Relaxed);
        let rows = match self.ctx.store.artifacts(None, None) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "cannot list artifacts");
                return;
            }
        };
        self.ctx
            .metrics
            .set_artifacts(rows.len() as u64, rows.iter().map(|r| r.size).sum::<u64>());
        // A workpiece's versions and proposals live as long as it does.
        let held = self.ctx.store.workpiece_artifact_ids().unwrap_or_default();
        let keys: Vec<(String, i64, u64)> = rows
            .iter()
            .filter(|r| r.kind != ArtifactKind::Workpiece || !held.contains(&r.id))
            .map(|r| (r.id.clone(), r.created_at, r.size))
            .collect();
        let victims = retention_victims(
            &keys,
            now,
            self.ctx.config.artifact_retention_secs,
            self.ctx.config.artifact_max_bytes,
        );
        for id in victims {
            if let Err(e) = self.delete_artifact(&id, "retention").await {
                tracing::warn!(artifact = %id, error = %e, "retention could not delete it");
            }
        }
        self.remove_orphan_blobs().await;
    }

    /// Blobs without a row (a crash between the blob's put and the row's insert).
    async fn remove_orphan_blobs(&self) {
        let Ok(keys) = self.blobs.keys().await else {
            return;
        };
        let Ok(known) = self.ctx.store.artifact_ids() else {
            return;
        };
        for k in keys {
            let busy = self.in_flight.locked().contains(&k);
            // Read again: a publish may have finished since the ids were read.
            if !busy
                && !known.contains(&k)
                && self.ctx.store.artifact(&k).ok().flatten().is_none()
                && !self.in_flight.locked().contains(&k)
            {
                tracing::info!(blob = %k, "removing an artifact blob no row names");
                let _ = self.blobs.delete(&k).await;
            }
        }
    }
}

/// The size and SHA-256 of `file`, read on a blocking thread.
pub(crate) async fn hash_off_thread(file: &Path) -> Result<(u64, String)> {
    let f = file.to_path_buf();
    tokio::task::spawn_blocking(move || hash_file(&f))
        .await
        .map_err(|e| Error::Internal(format!("hashing: {e}")))?
        .map_err(|e| Error::Internal(format!("reading {}: {e}", file.display())))
}

/// Size and hex SHA-256 of a file.
fn hash_file(path: &Path) -> std::io::Result<(u64, String)> {
    use sha2::Digest;
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 256 << 10];
    let mut n = 0u64;
    loop {
        let k = f.read(&mut buf)?;
        if k == 0 {
            break;
        }
        n += k as u64;
        h.update(&buf[..k]);
    }
    Ok((n, crate::util::hex(&h.finalize())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows() -> Vec<(String, i64, u64)> {
        vec![
            ("c".into(), 3_000, 30),
            ("a".into(), 1_000, 10),
            ("b".into(), 2_000, 20),
        ]
    }

    #[test]
    fn retention_deletes_the_expired_then_the_oldest_past_the_budget() {
        // Nothing set: nothing goes.
        assert!(retention_victims(&rows(), 1_000_000, 0, 0).is_empty());
        // 2 s retention at t = 4 s: made at 1 s and 2 s are expired, 3 s is not.
        assert_eq!(retention_victims(&rows(), 4_000, 2, 0), ["a", "b"]);
        // Exactly at the bound is expired.
        assert_eq!(retention_victims(&rows(), 3_000, 2, 0), ["a"]);
        // A 35-byte budget: the oldest go until the rest fit.
        assert_eq!(retention_victims(&rows(), 0, 0, 35), ["a", "b"]);
        assert_eq!(retention_victims(&rows(), 0, 0, 60), Vec::<String>::new());
        assert_eq!(retention_victims(&rows(), 0, 0, 59), ["a"]);
        // Both: the expired first, then the budget over what is left.
        assert_eq!(retention_victims(&rows(), 3_500, 2, 25), ["a", "b", "c"]);
        assert_eq!(retention_victims(&rows(), 3_500, 2, 50), ["a"]);
    }

    #[test]
    fn kinds_round_trip_and_names_are_one_component() {
        for k in ArtifactKind::ALL {
            assert_eq!(k.as_str().parse::<ArtifactKind>().unwrap(), *k);
        }
        assert!("video".parse::<ArtifactKind>().is_err());
        for ok in ["a.mp4", "run 1.log", "résumé.pdf"] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".", "..", "a/b", "a\nb", &"x".repeat(256)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert_eq!(content_type_for("x.mp4"), "video/mp4");
        assert_eq!(content_type_for("x.zip"), "application/zip");
        assert_eq!(content_type_for("noext"), "application/octet-stream");
        assert_eq!(
            disposition("a \"b\"é.txt", false),
            "attachment; filename=\"a _b__.txt\"; filename*=UTF-8''a%20%22b%22%C3%A9.txt"
        );
    }
}
