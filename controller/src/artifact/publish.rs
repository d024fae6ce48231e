//! `POST …/{id}/artifacts`: a file or directory of a running sandbox, fetched from its agent
//! (`GET /v1/files`, `GET /v1/fs/list`) into the artifact store. A directory becomes a zip.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use berth_protocol::controller::PublishArtifact;
use berth_protocol::sync::Locked;
use berth_protocol::{AgentClient, ClientError, EntryType};
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;

use super::Artifacts;
use super::{ArtifactKind, check_name, content_type_for};
use crate::error::{Error, Result};
use crate::store::ArtifactRow;

/// One agent call that answers at once (stat, list, the head of a download).
const AGENT_CALL: Duration = Duration::from_secs(30);
/// A download that delivers nothing this long fails.
const BODY_IDLE: Duration = Duration::from_secs(30);
/// The deepest a published directory is walked (the agent's own limit).
const MAX_DEPTH: u32 = 32;

/// An agent error as the caller's: its 4xx keep their class, the rest are the agent's fault.
pub(crate) fn agent_error(what: &str, e: ClientError) -> Error {
    match e.status() {
        Some(404) => Error::NotFound(format!("{what}: {e}")),
        Some(413) => Error::TooLarge(format!("{what}: {e}")),
        Some(400) | Some(409) | Some(422) => Error::BadRequest(format!("{what}: {e}")),
        Some(403) => Error::Unprocessable(format!("{what}: {e}")),
        _ => Error::Agent(format!("{what}: {e}")),
    }
}

/// Streams a response body into `dest`, at most `max` bytes (413 past it), failing when it
/// stalls. Answers the bytes written.
pub(crate) async fn body_to_file(resp: reqwest::Response, dest: &Path, max: u64) -> Result<u64> {
    if let Some(n) = resp.content_length()
        && n > max
    {
        return Err(too_large(max));
    }
    let mut f = tokio::fs::File::create(dest)
        .await
        .map_err(|e| Error::Internal(format!("{}: {e}", dest.display())))?;
    let mut body = resp.bytes_stream();
    let mut n = 0u64;
    loop {
        let next = tokio::time::timeout(BODY_IDLE, body.next())
            .await
            .map_err(|_| Error::Agent("the agent's download stalled".into()))?;
        let Some(chunk) = next else { break };
        let chunk = chunk.map_err(|e| Error::Agent(format!("downloading from the agent: {e}")))?;
        n += chunk.len() as u64;
        if n > max {
            drop(f);
            let _ = tokio::fs::remove_file(dest).await;
            return Err(too_large(max));
        }
        f.write_all(&chunk)
            .await
            .map_err(|e| Error::Internal(format!("{}: {e}", dest.display())))?;
    }
    f.flush()
        .await
        .map_err(|e| Error::Internal(format!("{}: {e}", dest.display())))?;
    Ok(n)
}

fn too_large(max: u64) -> Error {
    Error::TooLarge(format!(
        "the artifact is larger than artifact_max_file_bytes ({max} bytes)"
    ))
}

/// The last component of an absolute path (`/` itself is `root`).
fn base_name(path: &str) -> String {
    Path::new(path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "root".into())
}

/// Removes its file when dropped unless it was handed on.
struct Scratch(Option<PathBuf>);

impl Scratch {
    fn path(&self) -> &Path {
        self.0.as_deref().unwrap_or(Path::new(""))
    }
    fn take(mut self) -> PathBuf {
        self.0.take().unwrap_or_default()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Artifacts {
    /// `POST /sandbox/sandboxes/v1/{id}/artifacts`.
    pub async fn publish_path(
        self: &Arc<Self>,
        sandbox_id: &str,
        req: PublishArtifact,
    ) -> Result<ArtifactRow> {
        if !req.path.starts_with('/') || req.path.contains('\0') {
            return Err(Error::BadRequest(format!(
                "path {:?}: use an absolute path in the sandbox",
                req.path
            )));
        }
        if let Some(n) = &req.name {
            check_name(n)?;
        }
        let (row, agent) = self.ctx.running_agent(sandbox_id)?;
        if let Some(run) = &req.run
            && self.ctx.store.run(&row.id, run)?.is_none()
        {
            return Err(Error::NotFound(format!(
                "no run {run} in sandbox {sandbox_id}"
            )));
        }
        let entry = tokio::time::timeout(AGENT_CALL, agent.stat(&req.path))
            .await
            .map_err(|_| Error::Agent("the agent's stat timed out".into()))?
            .map_err(|e| agent_error(&req.path, e))?;
        let is_dir = match entry.kind {
            EntryType::Dir => true,
            EntryType::File => false,
            // A link is what it points at.
            EntryType::Symlink => tokio::time::timeout(AGENT_CALL, agent.list(&req.path, 1))
                .await
                .is_ok_and(|r| r.is_ok()),
            EntryType::Other => {
                return Err(Error::BadRequest(format!(
                    "{} is neither a file nor a directory",
                    req.path
                )));
            }
        };
        let me = self.clone();
        let sid = row.id.clone();
        // Its own task: a caller that leaves does not leave a half-made artifact behind.
        tokio::spawn(async move {
            if is_dir {
                me.publish_dir(&sid, &agent, &req).await
            } else {
                me.publish_one_file(&sid, &agent, &req).await
            }
        })
        .await
        .map_err(|e| Error::Internal(format!("publish task: {e}")))?
    }

    async fn publish_one_file(
        &self,
        sandbox_id: &str,
        agent: &AgentClient,
        req: &PublishArtifact,
    ) -> Result<ArtifactRow> {
        let name = req.name.clone().unwrap_or_else(|| base_name(&req.path));
        check_name(&name)?;
        let scratch = Scratch(Some(self.artifact_scratch()?));
        let resp = tokio::time::timeout(AGENT_CALL, agent.download(&req.path))
            .await
            .map_err(|_| Error::Agent("the agent's download timed out".into()))?
            .map_err(|e| agent_error(&req.path, e))?;
        body_to_file(
            resp,
            scratch.path(),
            self.ctx.config.artifact_max_file_bytes,
        )
        .await?;
        let ct = content_type_for(&name);
        let file = scratch.take();
        self.publish_file(
            sandbox_id,
            req.run.as_deref(),
            &name,
            &ct,
            ArtifactKind::File,
            Some(&req.path),
            &file,
        )
        .await
    }

    async fn publish_dir(
        &self,
        sandbox_id: &str,
        agent: &AgentClient,
        req: &PublishArtifact,
    ) -> Result<ArtifactRow> {
        let name = req
            .name
            .clone()
            .unwrap_or_else(|| format!("{}.zip", base_name(&req.path)));
        check_name(&name)?;
        let list = self.listing(agent, &req.path).await?;
        let max = self.ctx.config.artifact_max_file_bytes;
        let root = list.path.trim_end_matches('/').to_string();
        let zip_path = Scratch(Some(self.artifact_scratch()?));
        let part = Scratch(Some(self.artifact_scratch()?));
        let zip_file = std::fs::File::create(zip_path.path())
            .map_err(|e| Error::Internal(format!("zip: {e}")))?;
        let zip = Arc::new(std::sync::Mutex::new(Some(zip::ZipWriter::new(zip_file))));
        let mut written = 0u64;
        for e in &list.entries {
            let rel = e
                .path
                .strip_prefix(&root)
                .unwrap_or(&e.path)
                .trim_start_matches('/')
                .to_string();
            if rel.is_empty() {
                continue;
            }
            let mode = e.mode & 0o7777;
            match e.kind {
                EntryType::Dir => zip_dir(&zip, rel, mode).await?,
                EntryType::File => {
                    // Gone or unreadable since the listing: left out.
                    let Some(resp) = download(agent, &e.path).await? else {
                        continue;
                    };
                    let n = body_to_file(resp, part.path(), max - written).await?;
                    written += n;
                    zip_entry(&zip, part.path(), rel, mode, n).await?;
                }
                // Links and special files are not followed (no loops, nothing outside).
                EntryType::Symlink | EntryType::Other => {}
            }
        }
        let z = zip.clone();
        blocking(move || {
            let w = z.locked().take();
            if let Some(w) = w {
                let f = w.finish()?;
                f.sync_all()?;
            }
            Ok(())
        })
        .await?;
        drop(part);
        let file = zip_path.take();
        self.publish_file(
            sandbox_id,
            req.run.as_deref(),
            &name,
            "application/zip",
            ArtifactKind::Directory,
            Some(&req.path),
            &file,
        )
        .await
    }

    /// The agent's listing of directory `path` for a publish, refused (413) past
    /// `artifact_max_entries` entries or `artifact_max_file_bytes` of files.
    async fn listing(
        &self,
        agent: &AgentClient,
        path: &str,
    ) -> Result<berth_protocol::ListResponse> {
        let list = tokio::time::timeout(AGENT_CALL, agent.list(path, MAX_DEPTH))
            .await
            .map_err(|_| Error::Agent("the agent's listing timed out".into()))?
            .map_err(|e| agent_error(path, e))?;
        let max_entries = self.ctx.config.artifact_max_entries;
        if list.entries.len() > max_entries {
            return Err(Error::TooLarge(format!(
                "{path} holds more than artifact_max_entries ({max_entries}) entries"
            )));
        }
        let max = self.ctx.config.artifact_max_file_bytes;
        let total: u64 = list
            .entries
            .iter()
            .filter(|e| e.kind == EntryType::File)
            .map(|e| e.size)
            .sum();
        if total > max {
            return Err(too_large(max));
        }
        Ok(list)
    }
}

type SharedZip = Arc<std::sync::Mutex<Option<zip::ZipWriter<std::fs::File>>>>;

/// Adds directory `rel` to the zip.
async fn zip_dir(zip: &SharedZip, rel: String, mode: u32) -> Result<()> {
    let z = zip.clone();
    blocking(move || {
        let opts = zip::write::SimpleFileOptions::default().unix_permissions(mode);
        with_zip(&z, |w| w.add_directory(format!("{rel}/"), opts))
    })
    .await
}

/// Adds the `n` bytes of `src` to the zip as file `rel`, deflated.
async fn zip_entry(zip: &SharedZip, src: &Path, rel: String, mode: u32, n: u64) -> Result<()> {
    let z = zip.clone();
    let src = src.to_path_buf();
    blocking(move || {
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated)
            .unix_permissions(mode)
            .large_file(n >= u32::MAX as u64);
        let mut f = std::fs::File::open(&src)?;
        with_zip(&z, |w| {
            w.start_file(rel, opts)?;
            std::io::copy(&mut f, w)?;
            Ok(())
        })
    })
    .await
}

/// A file's bytes from the agent; `None` when it is gone or unreadable (403, 404).
async fn download(agent: &AgentClient, path: &str) -> Result<Option<reqwest::Response>> {
    match tokio::time::timeout(AGENT_CALL, agent.download(path)).await {
        Ok(Ok(r)) => Ok(Some(r)),
        Ok(Err(err)) if matches!(err.status(), Some(403 | 404)) => Ok(None),
        Ok(Err(err)) => Err(agent_error(path, err)),
        Err(_) => Err(Error::Agent("the agent's download timed out".into())),
    }
}

fn with_zip(
    z: &std::sync::Mutex<Option<zip::ZipWriter<std::fs::File>>>,
    f: impl FnOnce(&mut zip::ZipWriter<std::fs::File>) -> zip::result::ZipResult<()>,
) -> std::io::Result<()> {
    let mut g = z.locked();
    let w = g
        .as_mut()
        .ok_or_else(|| std::io::Error::other("the zip is finished"))?;
    f(w).map_err(std::io::Error::other)
}

async fn blocking(f: impl FnOnce() -> std::io::Result<()> + Send + 'static) -> Result<()> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Internal(format!("zip task: {e}")))?
        .map_err(|e| Error::Internal(format!("zip: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_the_paths_last_component() {
        assert_eq!(base_name("/home/user/out.txt"), "out.txt");
        assert_eq!(base_name("/home/user/dir/"), "dir");
        assert_eq!(base_name("/"), "root");
    }
}
