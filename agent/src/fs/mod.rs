//! Files: stat, list, mkdir, move, remove, streaming atomic upload, and watch. Paths are
//! absolute or relative to the sandbox home (`~/` expands to it); whatever the agent creates
//! is owned by the sandbox user. Errors name the path and the reason.

pub mod watch;

use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use berth_protocol::{EntryType, FileEntry, ListResponse};
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use tokio::io::AsyncWriteExt;

/// `/v1/fs/list` refuses to build answers larger than this many entries.
pub const MAX_LIST_ENTRIES: usize = 100_000;
pub const MAX_LIST_DEPTH: u32 = 32;

#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("{0}")]
    Invalid(String),
    #[error("{}: not found", .0.display())]
    NotFound(PathBuf),
    #[error("{}: not a directory", .0.display())]
    NotADirectory(PathBuf),
    #[error("{}: is a directory", .0.display())]
    IsADirectory(PathBuf),
    #[error("{}: permission denied", .0.display())]
    PermissionDenied(PathBuf),
    #[error("{}: disk full", .0.display())]
    DiskFull(PathBuf),
    #[error("{}: already exists", .0.display())]
    Exists(PathBuf),
    #[error("{}: directory not empty (pass recursive=true)", .0.display())]
    NotEmpty(PathBuf),
    #[error("{}: {}", .0.display(), .1)]
    TooLarge(PathBuf, String),
    #[error("{}: {}", .0.display(), .1)]
    Io(PathBuf, std::io::Error),
    #[error("upload of {} interrupted: {}", .0.display(), .1)]
    Body(PathBuf, String),
}

impl FsError {
    pub fn from_io(path: &Path, e: std::io::Error) -> FsError {
        let p = path.to_path_buf();
        match e.raw_os_error() {
            Some(libc::ENOENT) => FsError::NotFound(p),
            Some(libc::ENOTDIR) => FsError::NotADirectory(p),
            Some(libc::EISDIR) => FsError::IsADirectory(p),
            Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS) => {
                FsError::PermissionDenied(p)
            }
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => FsError::DiskFull(p),
            Some(libc::EEXIST) => FsError::Exists(p),
            Some(libc::ENOTEMPTY) => FsError::NotEmpty(p),
            _ => match e.kind() {
                ErrorKind::NotFound => FsError::NotFound(p),
                ErrorKind::PermissionDenied => FsError::PermissionDenied(p),
                _ => FsError::Io(p, e),
            },
        }
    }
}

/// File operations on behalf of the sandbox user.
#[derive(Clone)]
pub struct Files {
    home: PathBuf,
    uid: u32,
    gid: u32,
    /// The sandbox user's supplementary groups (for [`Files::as_user`]).
    groups: Vec<u32>,
}

impl Files {
    pub fn new(home: PathBuf, uid: u32, gid: u32) -> Files {
        Files {
            home,
            uid,
            gid,
            groups: Vec::new(),
        }
    }

    /// The same, with the sandbox user's supplementary groups.
    pub fn for_account(home: PathBuf, account: &crate::account::Account) -> Files {
        Files {
            groups: account.groups.clone(),
            ..Files::new(home, account.uid, account.gid)
        }
    }

    /// Runs `f` with the sandbox user's rights and nothing more: on a thread of its own that
    /// takes the user's uid, gid and groups (and so loses every capability) before `f` runs,
    /// and ends with it. The kernel then checks every path `f` opens, creates or renames as
    /// it would for the user's own programs — root's files and other processes' `/proc`
    /// entries (the agent's environment) included — and what `f` creates is the user's.
    /// Used by the routes anyone reaching the agent may call without its token (OSWorld's
    /// open compat surface, which the sandbox's own programs reach too), so they grant no
    /// more than the user already has. An agent not running as root, or serving root, runs
    /// `f` as it is. File descriptors `f` returns stay usable after the thread is gone.
    pub async fn as_user<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
    ) -> std::io::Result<T> {
        let switch = nix::unistd::Uid::effective().is_root() && self.uid != 0;
        let (uid, gid, groups) = (self.uid, self.gid, self.groups.clone());
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("berth-as-user".into())
            .spawn(move || {
                let r = match switch {
                    true => {
                        crate::account::become_on_this_thread(uid, gid, &groups).and_then(|()| f())
                    }
                    false => f(),
                };
                let _ = tx.send(r);
            })?;
        rx.await
            .unwrap_or_else(|_| Err(std::io::Error::other("the file operation's thread died")))
    }

    /// An API path as a file system path.
    pub fn resolve(&self, path: &str) -> Result<PathBuf, FsError> {
        if path.is_empty() {
            return Err(FsError::Invalid("path is required".into()));
        }
        if path.contains('\0') {
            return Err(FsError::Invalid(format!(
                "path {} contains a NUL byte",
                crate::text::py_repr_str(path)
            )));
        }
        Ok(crate::exec::resolve_path(&self.home, path))
    }

    /// Hands a path the agent created to the sandbox user.
    pub fn chown(&self, path: &Path) {
        if nix::unistd::Uid::effective().is_root() && self.uid != 0 {
            let _ = std::os::unix::fs::lchown(path, Some(self.uid), Some(self.gid));
        }
    }

    pub fn stat(&self, path: &Path) -> Result<FileEntry, FsError> {
        let meta = std::fs::symlink_metadata(path).map_err(|e| FsError::from_io(path, e))?;
        Ok(entry(path, &meta, None))
    }

    pub fn list(&self, path: &Path, depth: u32) -> Result<ListResponse, FsError> {
        if depth == 0 || depth > MAX_LIST_DEPTH {
            return Err(FsError::Invalid(format!(
                "depth must be between 1 and {MAX_LIST_DEPTH}"
            )));
        }
        let meta = std::fs::metadata(path).map_err(|e| FsError::from_io(path, e))?;
        if !meta.is_dir() {
            return Err(FsError::NotADirectory(path.to_path_buf()));
        }
        let mut entries = Vec::new();
        self.walk(path, 1, depth, &mut entries)?;
        Ok(ListResponse {
            path: path.to_string_lossy().into_owned(),
            entries,
        })
    }

    fn walk(
        &self,
        dir: &Path,
        level: u32,
        depth: u32,
        out: &mut Vec<FileEntry>,
    ) -> Result<(), FsError> {
        let rd = std::fs::read_dir(dir).map_err(|e| FsError::from_io(dir, e))?;
        let mut children: Vec<(PathBuf, std::fs::Metadata)> = Vec::new();
        for ent in rd {
            let ent = ent.map_err(|e| FsError::from_io(dir, e))?;
            let p = ent.path();
            // An entry deleted between readdir and lstat is simply gone.
            if let Ok(m) = std::fs::symlink_metadata(&p) {
                children.push((p, m));
            }
        }
        children.sort_by(|a, b| a.0.cmp(&b.0));
        for (p, m) in children {
            if out.len() >= MAX_LIST_ENTRIES {
                return Err(FsError::TooLarge(
                    dir.to_path_buf(),
                    format!("more than {MAX_LIST_ENTRIES} entries; list with a smaller depth"),
                ));
            }
            let is_dir = m.is_dir();
            out.push(entry(&p, &m, Some(level)));
            // Symlinked directories are listed but not followed: no loops.
            if is_dir && level < depth {
                match self.walk(&p, level + 1, depth, out) {
                    Ok(()) | Err(FsError::PermissionDenied(_)) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    pub fn mkdir(
        &self,
        path: &Path,
        parents: bool,
        mode: Option<u32>,
    ) -> Result<FileEntry, FsError> {
        if parents {
            if let Ok(m) = std::fs::metadata(path) {
                return if m.is_dir() {
                    self.stat(path)
                } else {
                    Err(FsError::Exists(path.to_path_buf()))
                };
            }
            self.create_parents(path)?;
        }
        std::fs::create_dir(path).map_err(|e| FsError::from_io(path, e))?;
        if let Some(mode) = mode {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o7777))
                .map_err(|e| FsError::from_io(path, e))?;
        }
        self.chown(path);
        self.stat(path)
    }

    /// Creates the missing ancestors of `path`, each owned by the sandbox user.
    pub fn create_parents(&self, path: &Path) -> Result<(), FsError> {
        let mut missing = Vec::new();
        let mut cur = path.parent();
        while let Some(p) = cur {
            if p.as_os_str().is_empty() || p.exists() {
                break;
            }
            missing.push(p.to_path_buf());
            cur = p.parent();
        }
        for p in missing.into_iter().rev() {
            match std::fs::create_dir(&p) {
                Ok(()) => self.chown(&p),
                Err(e) if e.kind() == ErrorKind::AlreadyExists && p.is_dir() => {}
                Err(e) => return Err(FsError::from_io(&p, e)),
            }
        }
        Ok(())
    }

    pub fn rename(&self, from: &Path, to: &Path, overwrite: bool) -> Result<FileEntry, FsError> {
        std::fs::symlink_metadata(from).map_err(|e| FsError::from_io(from, e))?;
        if !overwrite && std::fs::symlink_metadata(to).is_ok() {
            return Err(FsError::Exists(to.to_path_buf()));
        }
        match std::fs::rename(from, to) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
                // Another file system: copy, then remove the source.
                copy_tree(from, to).map_err(|e| FsError::from_io(to, e))?;
                remove_tree(from).map_err(|e| FsError::from_io(from, e))?;
            }
            Err(e) => {
                let blame = if e.raw_os_error() == Some(libc::ENOENT) {
                    to.parent().unwrap_or(to)
                } else {
                    to
                };
                return Err(FsError::from_io(blame, e));
            }
        }
        self.stat(to)
    }

    pub fn remove(&self, path: &Path, recursive: bool) -> Result<(), FsError> {
        let meta = std::fs::symlink_metadata(path).map_err(|e| FsError::from_io(path, e))?;
        let r = if meta.is_dir() {
            if recursive {
                std::fs::remove_dir_all(path)
            } else {
                std::fs::remove_dir(path)
            }
        } else {
            std::fs::remove_file(path)
        };
        r.map_err(|e| FsError::from_io(path, e))
    }

    /// Streams `body` into `path` atomically: a temp file beside it, renamed over it once
    /// complete. Parents are created. A failed upload leaves nothing behind. Returns the bytes
    /// written.
    pub async fn upload<S, E>(
        &self,
        path: &Path,
        mut body: S,
        mode: Option<u32>,
    ) -> Result<u64, FsError>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        if path.file_name().is_none() {
            return Err(FsError::Invalid(format!(
                "{}: not a file path",
                path.display()
            )));
        }
        if std::fs::metadata(path).is_ok_and(|m| m.is_dir()) {
            return Err(FsError::IsADirectory(path.to_path_buf()));
        }
        self.create_parents(path)?;
        let tmp = TempFile::beside(path);
        let mut file = tokio::fs::File::create(tmp.path())
            .await
            .map_err(|e| FsError::from_io(path, e))?;
        let mut n = 0u64;
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| FsError::Body(path.to_path_buf(), e.to_string()))?;
            file.write_all(&chunk)
                .await
                .map_err(|e| FsError::from_io(path, e))?;
            n += chunk.len() as u64;
        }
        file.flush().await.map_err(|e| FsError::from_io(path, e))?;
        drop(file);
        let mode = mode.unwrap_or(0o644) & 0o7777;
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(mode))
            .map_err(|e| FsError::from_io(path, e))?;
        self.chown(tmp.path());
        std::fs::rename(tmp.path(), path).map_err(|e| FsError::from_io(path, e))?;
        tmp.keep();
        Ok(n)
    }
}

/// A temp file that is removed when dropped unless [`keep`](Self::keep) was called: an upload
/// whose request is dropped mid-body (the client reset it) leaves nothing behind.
#[derive(Debug)]
pub struct TempFile {
    path: PathBuf,
    keep: bool,
}

impl TempFile {
    /// A fresh name beside `target` ([`temp_beside`]); nothing is created yet.
    pub fn beside(target: &Path) -> TempFile {
        TempFile {
            path: temp_beside(target),
            keep: false,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file was renamed into place (or must stay): it is no longer removed on drop.
    pub fn keep(mut self) {
        self.keep = true;
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// `.name.berth-XXXXXXXX.tmp` in the same directory, so the final rename is atomic.
pub fn temp_beside(path: &Path) -> PathBuf {
    let mut b = [0u8; 4];
    let _ = getrandom::fill(&mut b);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let suffix: String = b.iter().map(|x| format!("{x:02x}")).collect();
    path.with_file_name(format!(".{name}.berth-{suffix}.tmp"))
}

fn entry(path: &Path, meta: &std::fs::Metadata, depth: Option<u32>) -> FileEntry {
    let ft = meta.file_type();
    let kind = if ft.is_symlink() {
        EntryType::Symlink
    } else if ft.is_dir() {
        EntryType::Dir
    } else if ft.is_file() {
        EntryType::File
    } else {
        EntryType::Other
    };
    FileEntry {
        name: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.to_string_lossy().into_owned()),
        path: path.to_string_lossy().into_owned(),
        kind,
        size: meta.len(),
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
        modified_at: meta
            .modified()
            .map(crate::time::rfc3339)
            .unwrap_or_default(),
        symlink_target: ft
            .is_symlink()
            .then(|| std::fs::read_link(path).ok())
            .flatten()
            .map(|t| t.to_string_lossy().into_owned()),
        depth,
    }
}

fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(from)?;
    if meta.file_type().is_symlink() {
        std::os::unix::fs::symlink(std::fs::read_link(from)?, to)
    } else if meta.is_dir() {
        std::fs::create_dir(to)?;
        std::fs::set_permissions(to, meta.permissions())?;
        for ent in std::fs::read_dir(from)? {
            let ent = ent?;
            copy_tree(&ent.path(), &to.join(ent.file_name()))?;
        }
        Ok(())
    } else {
        std::fs::copy(from, to).map(|_| ())
    }
}

fn remove_tree(p: &Path) -> std::io::Result<()> {
    if std::fs::symlink_metadata(p)?.is_dir() {
        std::fs::remove_dir_all(p)
    } else {
        std::fs::remove_file(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(dir: &Path) -> Files {
        Files::new(
            dir.to_path_buf(),
            nix::unistd::getuid().as_raw(),
            nix::unistd::getgid().as_raw(),
        )
    }

    #[test]
    fn paths_resolve_against_home_and_nul_is_refused() {
        let f = Files::new(PathBuf::from("/home/u"), 0, 0);
        assert_eq!(f.resolve("~/a").unwrap(), PathBuf::from("/home/u/a"));
        assert_eq!(f.resolve("b/c").unwrap(), PathBuf::from("/home/u/b/c"));
        assert_eq!(f.resolve("/etc").unwrap(), PathBuf::from("/etc"));
        assert!(matches!(f.resolve("a\0b"), Err(FsError::Invalid(_))));
        assert!(matches!(f.resolve(""), Err(FsError::Invalid(_))));
    }

    #[test]
    fn list_walks_to_the_requested_depth_in_name_order() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("b/inner")).unwrap();
        std::fs::write(d.path().join("a.txt"), b"x").unwrap();
        std::fs::write(d.path().join("b/inner/deep.txt"), b"y").unwrap();
        let f = files(d.path());
        let one = f.list(d.path(), 1).unwrap();
        let names: Vec<&str> = one.entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, vec!["a.txt", "b"]);
        let three = f.list(d.path(), 3).unwrap();
        assert!(
            three
                .entries
                .iter()
                .any(|e| e.name == "deep.txt" && e.depth == Some(3))
        );
        assert!(matches!(
            f.list(&d.path().join("a.txt"), 1),
            Err(FsError::NotADirectory(_))
        ));
    }

    #[test]
    fn errors_name_the_reason() {
        let d = tempfile::tempdir().unwrap();
        let f = files(d.path());
        let missing = d.path().join("nope");
        assert!(matches!(f.stat(&missing), Err(FsError::NotFound(p)) if p == missing));
        std::fs::create_dir(d.path().join("full")).unwrap();
        std::fs::write(d.path().join("full/x"), b"").unwrap();
        assert!(matches!(
            f.remove(&d.path().join("full"), false),
            Err(FsError::NotEmpty(_))
        ));
        f.remove(&d.path().join("full"), true).unwrap();
        std::fs::write(d.path().join("a"), b"1").unwrap();
        std::fs::write(d.path().join("b"), b"2").unwrap();
        assert!(matches!(
            f.rename(&d.path().join("a"), &d.path().join("b"), false),
            Err(FsError::Exists(_))
        ));
        f.rename(&d.path().join("a"), &d.path().join("b"), true)
            .unwrap();
        assert_eq!(std::fs::read(d.path().join("b")).unwrap(), b"1");
    }

    #[tokio::test]
    async fn upload_is_atomic_and_a_failed_one_leaves_nothing() {
        let d = tempfile::tempdir().unwrap();
        let f = files(d.path());
        let target = d.path().join("new/dir/file.bin");
        let body = futures_util::stream::iter(vec![
            Ok::<_, std::io::Error>(Bytes::from_static(b"hello ")),
            Ok(Bytes::from_static(b"world")),
        ]);
        let n = f.upload(&target, body, Some(0o600)).await.unwrap();
        assert_eq!(n, 11);
        assert_eq!(std::fs::read(&target).unwrap(), b"hello world");
        assert_eq!(std::fs::metadata(&target).unwrap().mode() & 0o777, 0o600);
        let broken = futures_util::stream::iter(vec![
            Ok(Bytes::from_static(b"partial")),
            Err(std::io::Error::other("client went away")),
        ]);
        let err = f.upload(&target, broken, None).await.unwrap_err();
        assert!(matches!(err, FsError::Body(..)));
        assert_eq!(
            std::fs::read(&target).unwrap(),
            b"hello world",
            "old content kept"
        );
        let leftovers: Vec<_> = std::fs::read_dir(target.parent().unwrap())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty());
    }

    /// A request dropped mid-body (the client reset its connection) drops the upload's future
    /// while it waits for the next chunk: its temp file goes with it.
    #[tokio::test]
    async fn an_upload_dropped_mid_body_leaves_no_temp_file() {
        let d = tempfile::tempdir().unwrap();
        let f = files(d.path());
        let target = d.path().join("dropped.bin");
        let first = futures_util::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from_static(
            b"partial",
        ))]);
        let body = first.chain(futures_util::stream::pending());
        let temps = || -> Vec<String> {
            std::fs::read_dir(d.path())
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".tmp"))
                .collect()
        };
        let upload = f.upload(&target, body, None);
        let mut upload = Box::pin(upload);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        // Poll until the first chunk is written (the temp file exists) and it waits for more.
        while temps().is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "no temp file appeared"
            );
            let polled =
                tokio::time::timeout(std::time::Duration::from_millis(20), upload.as_mut()).await;
            assert!(
                polled.is_err(),
                "the upload cannot finish: its body never ends"
            );
        }
        drop(upload);
        assert_eq!(temps(), Vec::<String>::new());
        assert!(!target.exists());
    }
}
