//! `berth sandbox cp`: files and directories between this machine and a sandbox, through the
//! controller's pass-through to the agent (`/v1/files`, `/v1/fs/…`), streamed in both
//! directions: no file is held in memory whole.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use berth_protocol::{ClientError, EntryType, FileEntry, MkdirRequest};
use clap::Args;
use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::Remote;
use super::through::Through;

const CHUNK: usize = 256 << 10;

#[derive(Args, Debug)]
#[command(after_help = "\
SRC and DST: a local path, `-` (stdin or stdout, one file's bytes), or `ID:PATH` for a path in \
sandbox ID (relative paths start at the sandbox user's home). Exactly one side is a sandbox.

Like `docker cp`: when DST is an existing directory (or ends with `/`) the source is copied into \
it under its own name; otherwise it is copied to DST. A directory is copied recursively (regular \
files and directories, with their permission bits; symbolic links and special files are skipped \
with a warning). Uploads replace each file atomically. Progress is shown on stderr when stderr is \
a terminal.")]
pub struct CpArgs {
    /// What to copy: a local path, `-` for stdin, or `ID:PATH` in a sandbox.
    pub src: String,
    /// Where to copy it: a local path, `-` for stdout, or `ID:PATH` in a sandbox.
    pub dst: String,
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Debug, Clone, PartialEq)]
enum Side {
    Stdio,
    Local(PathBuf),
    Sandbox { id: String, path: String },
}

fn parse_side(s: &str) -> Side {
    if s == "-" {
        return Side::Stdio;
    }
    // `ID:PATH`, where ID has no slash and is not `.`-relative: `./a:b` stays a local path.
    if let Some((id, path)) = s.split_once(':')
        && !id.is_empty()
        && !id.contains('/')
        && !id.starts_with('.')
    {
        return Side::Sandbox {
            id: id.to_string(),
            path: if path.is_empty() {
                ".".into()
            } else {
                path.into()
            },
        };
    }
    Side::Local(PathBuf::from(s))
}

/// What was copied, for the summary and `--json`.
#[derive(Default)]
struct Totals {
    files: u64,
    dirs: u64,
    bytes: u64,
    skipped: u64,
}

pub async fn run(a: CpArgs) -> anyhow::Result<i32> {
    let (src, dst) = (parse_side(&a.src), parse_side(&a.dst));
    let mut totals = Totals::default();
    let started = Instant::now();
    let to = match (&src, &dst) {
        (Side::Sandbox { id, path }, Side::Local(dst)) => {
            let t = Through::new(&a.remote, id);
            download(&t, path, dst, &mut totals).await?
        }
        (Side::Sandbox { id, path }, Side::Stdio) => {
            let t = Through::new(&a.remote, id);
            to_stdout(&t, path, &mut totals).await?;
            "-".into()
        }
        (Side::Local(src), Side::Sandbox { id, path }) => {
            let t = Through::new(&a.remote, id);
            upload(&t, src, path, &mut totals).await?
        }
        (Side::Stdio, Side::Sandbox { id, path }) => {
            let t = Through::new(&a.remote, id);
            from_stdin(&t, path, &mut totals).await?
        }
        (Side::Sandbox { .. }, Side::Sandbox { .. }) => {
            bail!("both SRC and DST name a sandbox: copy through a local file")
        }
        _ => bail!("neither SRC nor DST names a sandbox (`ID:PATH`)"),
    };
    if a.remote.json {
        println!(
            "{}",
            serde_json::json!({
                "from": a.src, "to": to, "files": totals.files, "dirs": totals.dirs,
                "bytes": totals.bytes, "skipped": totals.skipped,
                "seconds": started.elapsed().as_secs_f64(),
            })
        );
    } else if std::io::stderr().is_terminal() {
        eprintln!(
            "copied {} in {} file(s) to {to} in {:.1} s",
            human(totals.bytes),
            totals.files,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(0)
}

/// The sandbox's entry at `path`; `None` when nothing is there (an unknown sandbox, or a
/// controller without the route, is an error).
async fn stat(t: &Through, path: &str) -> anyhow::Result<Option<FileEntry>> {
    match t.agent().stat(path).await {
        Ok(e) => Ok(Some(e)),
        Err(ClientError::Api { status: 404, body })
            if !body.error.message.starts_with("no sandbox ")
                && !body.error.message.starts_with("no route ") =>
        {
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

fn base_name(path: &str) -> anyhow::Result<String> {
    Path::new(path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| anyhow!("{path:?} has no file name to copy under"))
}

fn join_remote(dir: &str, name: &str) -> String {
    format!("{}/{name}", dir.trim_end_matches('/'))
}

// ---- upload ----

async fn upload(t: &Through, src: &Path, dst: &str, totals: &mut Totals) -> anyhow::Result<String> {
    let meta = std::fs::symlink_metadata(src)
        .or_else(|_| std::fs::metadata(src))
        .with_context(|| format!("{}", src.display()))?;
    let meta = if meta.file_type().is_symlink() {
        std::fs::metadata(src).with_context(|| format!("{}", src.display()))?
    } else {
        meta
    };
    let name = src
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .ok_or_else(|| anyhow!("{}: no file name to copy under", src.display()))?;
    let target = match stat(t, dst).await? {
        Some(e) if e.kind == EntryType::Dir => join_remote(&e.path, &name),
        Some(_) if meta.is_dir() => bail!("{dst}: exists and is not a directory"),
        Some(e) => e.path,
        None if dst.ends_with('/') => join_remote(dst, &name),
        None => dst.to_string(),
    };
    if meta.is_dir() {
        upload_dir(t, src, &target, totals).await?;
    } else if meta.is_file() {
        upload_file(t, src, &target, totals).await?;
    } else {
        bail!("{}: not a regular file or directory", src.display());
    }
    Ok(target)
}

async fn upload_dir(
    t: &Through,
    src: &Path,
    target: &str,
    totals: &mut Totals,
) -> anyhow::Result<()> {
    // Depth-first with an explicit stack: (local dir, remote dir).
    let mut stack = vec![(src.to_path_buf(), target.to_string())];
    while let Some((dir, remote)) = stack.pop() {
        let mode = std::fs::metadata(&dir)
            .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777)
            .ok();
        t.agent()
            .mkdir(&MkdirRequest {
                path: remote.clone(),
                parents: Some(true),
                mode,
            })
            .await
            .with_context(|| format!("creating {remote} in the sandbox"))?;
        totals.dirs += 1;
        let mut entries: Vec<_> = std::fs::read_dir(&dir)
            .with_context(|| format!("{}", dir.display()))?
            .filter_map(Result::ok)
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            let ft = e.file_type()?;
            if ft.is_dir() {
                stack.push((p, join_remote(&remote, &name)));
            } else if ft.is_file() {
                upload_file(t, &p, &join_remote(&remote, &name), totals).await?;
            } else {
                eprintln!("berth: skipped {} (not a regular file)", p.display());
                totals.skipped += 1;
            }
        }
    }
    Ok(())
}

async fn upload_file(
    t: &Through,
    src: &Path,
    target: &str,
    totals: &mut Totals,
) -> anyhow::Result<()> {
    let file = tokio::fs::File::open(src)
        .await
        .with_context(|| format!("{}", src.display()))?;
    let meta = file.metadata().await?;
    let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777;
    let progress = Progress::new(target, Some(meta.len()));
    let body = read_stream(file, progress);
    let done = t
        .agent()
        .upload(target, reqwest::Body::wrap_stream(body), Some(mode))
        .await
        .with_context(|| format!("uploading {} to {target}", src.display()))?;
    totals.files += 1;
    totals.bytes += done.bytes;
    Ok(())
}

/// A file (or stdin) as a stream of chunks, counted by `progress`.
fn read_stream<R: tokio::io::AsyncRead + Unpin + Send + 'static>(
    reader: R,
    progress: Progress,
) -> impl futures_util::Stream<Item = std::io::Result<Vec<u8>>> + Send + 'static {
    futures_util::stream::unfold(
        (reader, progress, false),
        |(mut r, mut p, ended)| async move {
            if ended {
                return None;
            }
            let mut buf = vec![0u8; CHUNK];
            match r.read(&mut buf).await {
                Ok(0) => {
                    p.finish();
                    None
                }
                Ok(n) => {
                    buf.truncate(n);
                    p.add(n as u64);
                    Some((Ok(buf), (r, p, false)))
                }
                Err(e) => Some((Err(e), (r, p, true))),
            }
        },
    )
}

async fn from_stdin(t: &Through, dst: &str, totals: &mut Totals) -> anyhow::Result<String> {
    let target = match stat(t, dst).await? {
        Some(e) if e.kind == EntryType::Dir => {
            bail!("{dst} is a directory: name the file to write stdin to")
        }
        Some(e) => e.path,
        None => dst.to_string(),
    };
    let body = read_stream(tokio::io::stdin(), Progress::new(&target, None));
    let done = t
        .agent()
        .upload(&target, reqwest::Body::wrap_stream(body), None)
        .await?;
    totals.files += 1;
    totals.bytes += done.bytes;
    Ok(target)
}

// ---- download ----

async fn download(
    t: &Through,
    src: &str,
    dst: &Path,
    totals: &mut Totals,
) -> anyhow::Result<String> {
    let entry = stat(t, src)
        .await?
        .ok_or_else(|| anyhow!("{src}: no such file or directory in the sandbox"))?;
    let dst_is_dir = dst.is_dir() || dst.to_string_lossy().ends_with('/');
    let target = match dst_is_dir {
        true => dst.join(base_name(&entry.path)?),
        false => dst.to_path_buf(),
    };
    match entry.kind {
        EntryType::Dir => download_dir(t, &entry, &target, totals).await?,
        EntryType::File => download_file(t, &entry.path, &target, entry.mode, totals).await?,
        _ => bail!("{src}: not a regular file or directory"),
    }
    Ok(target.display().to_string())
}

async fn download_dir(
    t: &Through,
    root: &FileEntry,
    target: &Path,
    totals: &mut Totals,
) -> anyhow::Result<()> {
    let list = t
        .agent()
        .list(&root.path, 32)
        .await
        .with_context(|| format!("listing {}", root.path))?;
    make_dir(target, root.mode)?;
    totals.dirs += 1;
    // The listing is sorted, so every directory comes before what it holds.
    let prefix = format!("{}/", root.path.trim_end_matches('/'));
    for e in &list.entries {
        let Some(rel) = e.path.strip_prefix(&prefix) else {
            continue;
        };
        if rel.split('/').any(|c| c == ".." || c.is_empty()) {
            bail!("the sandbox listed an unsafe path {:?}", e.path);
        }
        let local = target.join(rel);
        match e.kind {
            EntryType::Dir => {
                make_dir(&local, e.mode)?;
                totals.dirs += 1;
            }
            EntryType::File => download_file(t, &e.path, &local, e.mode, totals).await?,
            _ => {
                eprintln!("berth: skipped {} (not a regular file)", e.path);
                totals.skipped += 1;
            }
        }
    }
    Ok(())
}

fn make_dir(path: &Path, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::create_dir(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && path.is_dir() => {}
        Err(e) => return Err(anyhow!(e).context(format!("creating {}", path.display()))),
    }
    // Keep the directory writable for the files still to come.
    let _ = std::fs::set_permissions(
        path,
        std::fs::Permissions::from_mode((mode & 0o7777) | 0o700),
    );
    Ok(())
}

async fn download_file(
    t: &Through,
    src: &str,
    target: &Path,
    mode: u32,
    totals: &mut Totals,
) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let resp = t
        .agent()
        .download(src)
        .await
        .with_context(|| format!("downloading {src}"))?;
    let dir = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".into());
    let tmp = dir.join(format!(".{name}.berth-{}", crate::util::random_hex(6)));
    let result = async {
        let mut file = tokio::fs::File::create(&tmp)
            .await
            .with_context(|| format!("creating {}", tmp.display()))?;
        let mut progress = Progress::new(&target.display().to_string(), resp.content_length());
        let mut body = resp.bytes_stream();
        let mut n = 0u64;
        while let Some(chunk) = body.next().await {
            let chunk = chunk.with_context(|| format!("downloading {src}"))?;
            file.write_all(&chunk).await?;
            n += chunk.len() as u64;
            progress.add(chunk.len() as u64);
        }
        file.flush().await?;
        file.sync_all().await?;
        progress.finish();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode & 0o7777))?;
        std::fs::rename(&tmp, target)
            .with_context(|| format!("moving the download to {}", target.display()))?;
        anyhow::Ok(n)
    }
    .await;
    match result {
        Ok(n) => {
            totals.files += 1;
            totals.bytes += n;
            Ok(())
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

async fn to_stdout(t: &Through, src: &str, totals: &mut Totals) -> anyhow::Result<()> {
    let resp = t
        .agent()
        .download(src)
        .await
        .with_context(|| format!("downloading {src}"))?;
    let mut progress = Progress::new(src, resp.content_length());
    let mut out = tokio::io::stdout();
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.with_context(|| format!("downloading {src}"))?;
        out.write_all(&chunk).await?;
        totals.bytes += chunk.len() as u64;
        progress.add(chunk.len() as u64);
    }
    out.flush().await?;
    progress.finish();
    totals.files += 1;
    Ok(())
}

// ---- progress ----

/// One file's progress line on stderr, redrawn at most ten times a second; silent when stderr
/// is not a terminal.
struct Progress {
    label: String,
    total: Option<u64>,
    done: u64,
    shown: Option<Instant>,
    enabled: bool,
    started: Instant,
}

impl Progress {
    fn new(label: &str, total: Option<u64>) -> Progress {
        Progress {
            label: label.to_string(),
            total,
            done: 0,
            shown: None,
            enabled: std::io::stderr().is_terminal(),
            started: Instant::now(),
        }
    }

    fn add(&mut self, n: u64) {
        self.done += n;
        if self.enabled
            && self
                .shown
                .is_none_or(|t| t.elapsed() >= Duration::from_millis(100))
        {
            self.draw();
        }
    }

    fn draw(&mut self) {
        self.shown = Some(Instant::now());
        let rate = self.done as f64 / self.started.elapsed().as_secs_f64().max(1e-3);
        let line = match self.total {
            Some(t) if t > 0 => format!(
                "{}  {} / {}  {:>3}%  {}/s",
                self.label,
                human(self.done),
                human(t),
                self.done * 100 / t,
                human(rate as u64)
            ),
            _ => format!(
                "{}  {}  {}/s",
                self.label,
                human(self.done),
                human(rate as u64)
            ),
        };
        let mut err = std::io::stderr();
        let _ = write!(err, "\r\x1b[2K{line}");
        let _ = err.flush();
    }

    fn finish(&mut self) {
        if self.enabled && !self.label.is_empty() {
            self.draw();
            eprintln!();
            self.enabled = false;
        }
    }
}

fn human(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    match u {
        0 => format!("{n} B"),
        _ => format!("{v:.1} {}", UNITS[u]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sides_are_told_apart_by_an_id_before_a_colon() {
        assert_eq!(parse_side("-"), Side::Stdio);
        assert_eq!(
            parse_side("sb_1:/tmp/x"),
            Side::Sandbox {
                id: "sb_1".into(),
                path: "/tmp/x".into()
            }
        );
        assert_eq!(
            parse_side("sb_1:"),
            Side::Sandbox {
                id: "sb_1".into(),
                path: ".".into()
            }
        );
        assert_eq!(parse_side("./a:b"), Side::Local("./a:b".into()));
        assert_eq!(parse_side("/tmp/a:b"), Side::Local("/tmp/a:b".into()));
        assert_eq!(parse_side("plain"), Side::Local("plain".into()));
        assert_eq!(human(5), "5 B");
        assert_eq!(human(3 << 20), "3.0 MiB");
    }
}
