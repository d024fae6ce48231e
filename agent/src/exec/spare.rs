//! Ready-made command directories. Creating a directory and its files costs hundreds of
//! microseconds on a journaling file system, more than running `echo` itself; renaming a
//! prepared one costs tens. One idle-priority thread keeps a few prepared, so starting a
//! command touches the disk only with renames and writes to existing files, and preparing the
//! next ones never competes with running commands for a CPU.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};

use berth_protocol::sync::Locked;

use super::log::OUTPUT;
use super::record::{EXIT, META};

const KEEP: usize = 32;
const PREFIX: &str = ".spare-";

pub struct SpareDirs {
    root: PathBuf,
    ready: Mutex<Vec<PathBuf>>,
    wanted: Condvar,
}

impl SpareDirs {
    /// Removes spares an earlier agent left and starts the preparing thread.
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
            wanted: Condvar::new(),
        });
        let weak = Arc::downgrade(&pool);
        let spawned = std::thread::Builder::new()
            .name("berth-spare-dirs".into())
            .spawn(move || {
                lower_priority();
                while let Some(pool) = weak.upgrade() {
                    if !pool.top_up() {
                        break;
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the spare-directory thread");
        }
        pool
    }

    /// Moves a prepared directory to `dir` (or creates `dir` when none is ready).
    pub fn take(&self, dir: &Path) -> std::io::Result<()> {
        let spare = {
            let mut ready = self.ready.locked();
            let s = ready.pop();
            self.wanted.notify_one();
            s
        };
        if let Some(s) = spare
            && std::fs::rename(&s, dir).is_ok()
        {
            return Ok(());
        }
        std::fs::create_dir(dir)
    }

    /// Prepares directories until the pool is full, then waits to be asked for more.
    /// Returns false when preparing fails (the pool then stays as it is).
    fn top_up(&self) -> bool {
        {
            let ready = self.ready.locked();
            let _unused = berth_protocol::sync::unpoisoned(
                self.wanted.wait_while(ready, |r| r.len() >= KEEP),
            );
        }
        match self.prepare() {
            Ok(p) => {
                self.ready.locked().push(p);
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot prepare command directories; creating them on demand");
                false
            }
        }
    }

    fn prepare(&self) -> std::io::Result<PathBuf> {
        let mut b = [0u8; 8];
        getrandom::fill(&mut b).map_err(std::io::Error::other)?;
        let name: String = b.iter().map(|x| format!("{x:02x}")).collect();
        let dir = self.root.join(format!("{PREFIX}{name}"));
        std::fs::create_dir(&dir)?;
        // The files every command writes; existing files open fast. The rest (the stream
        // index on the first stderr byte, a shim's files) are created when needed.
        for f in [
            format!(".{META}.tmp"),
            format!(".{EXIT}.tmp"),
            OUTPUT.to_string(),
        ] {
            std::fs::File::create(dir.join(f))?;
        }
        Ok(dir)
    }
}

/// Runs this thread only when a CPU would otherwise idle (SCHED_IDLE).
fn lower_priority() {
    // SAFETY: sched_setscheduler on the calling thread (pid 0) with a valid parameter.
    unsafe {
        let param = libc::sched_param { sched_priority: 0 };
        libc::sched_setscheduler(0, libc::SCHED_IDLE, &param);
    }
}
