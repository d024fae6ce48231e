//! Ready-made command directories. Creating a directory and its files costs hundreds of
//! microseconds on a journaling file system, more than running `echo` itself; renaming a
//! prepared one costs tens. A background task keeps a few prepared so starting a command
//! touches the disk only with renames and writes to existing files.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::log::{OUTPUT, STREAMS};
use super::record::{EXIT, META, PROC};

const KEEP: usize = 16;
const PREFIX: &str = ".spare-";

pub struct SpareDirs {
    root: PathBuf,
    ready: Mutex<Vec<PathBuf>>,
    refilling: Mutex<bool>,
}

impl SpareDirs {
    /// Removes spares an earlier agent left and starts filling the pool.
    pub fn start(root: &Path) -> Arc<SpareDirs> {
        if let Ok(rd) = std::fs::read_dir(root) {
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().starts_with(PREFIX) {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        let pool = Arc::new(SpareDirs {
            root: root.to_path_buf(),
            ready: Mutex::new(Vec::new()),
            refilling: Mutex::new(false),
        });
        pool.refill();
        pool
    }

    /// Moves a prepared directory to `dir` (or creates `dir` when none is ready).
    pub fn take(self: &Arc<Self>, dir: &Path) -> std::io::Result<()> {
        let spare = self.ready.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let left = self.ready.lock().unwrap_or_else(|p| p.into_inner()).len();
        if left < KEEP / 2 {
            self.refill();
        }
        if let Some(s) = spare
            && std::fs::rename(&s, dir).is_ok()
        {
            return Ok(());
        }
        std::fs::create_dir(dir)
    }

    fn refill(self: &Arc<Self>) {
        {
            let mut busy = self.refilling.lock().unwrap_or_else(|p| p.into_inner());
            if *busy {
                return;
            }
            *busy = true;
        }
        let pool = self.clone();
        let work = move || {
            loop {
                let have = pool.ready.lock().unwrap_or_else(|p| p.into_inner()).len();
                if have >= KEEP {
                    break;
                }
                match pool.prepare() {
                    Ok(p) => pool.ready.lock().unwrap_or_else(|p| p.into_inner()).push(p),
                    Err(e) => {
                        tracing::debug!(error = %e, "cannot prepare a command directory");
                        break;
                    }
                }
            }
            *pool.refilling.lock().unwrap_or_else(|p| p.into_inner()) = false;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn_blocking(work);
            }
            Err(_) => work(),
        }
    }

    fn prepare(&self) -> std::io::Result<PathBuf> {
        let mut b = [0u8; 8];
        getrandom::fill(&mut b).map_err(std::io::Error::other)?;
        let name: String = b.iter().map(|x| format!("{x:02x}")).collect();
        let dir = self.root.join(format!("{PREFIX}{name}"));
        std::fs::create_dir(&dir)?;
        // The files the agent and the shim write first; existing files open fast.
        for f in [
            format!(".{META}.tmp"),
            format!(".{PROC}.tmp"),
            format!(".{EXIT}.tmp"),
            OUTPUT.to_string(),
            STREAMS.to_string(),
            "shim.log".to_string(),
        ] {
            std::fs::File::create(dir.join(f))?;
        }
        Ok(dir)
    }
}
