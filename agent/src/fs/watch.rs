//! `GET /v1/fs/watch`: file system events for a path, through a bounded queue. A watcher that
//! falls behind is told so (`{"lagged": true}`) and its stream ends; it never blocks the
//! notification thread or other watchers.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use berth_protocol::{WatchKind, WatchMessage};
use notify::event::{EventKind, ModifyKind};
use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

use super::FsError;

const QUEUE: usize = 1024;

pub struct FsWatch {
    // Dropping the watcher stops the notifications.
    _watcher: notify::RecommendedWatcher,
    rx: mpsc::Receiver<WatchMessage>,
    lagged: Arc<AtomicBool>,
    ended: bool,
}

impl FsWatch {
    pub fn start(path: &Path, recursive: bool) -> Result<FsWatch, FsError> {
        std::fs::metadata(path).map_err(|e| FsError::from_io(path, e))?;
        let (tx, rx) = mpsc::channel(QUEUE);
        let lagged = Arc::new(AtomicBool::new(false));
        let flag = lagged.clone();
        let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            let Ok(ev) = res else { return };
            let kind = match ev.kind {
                EventKind::Create(_) => WatchKind::Create,
                EventKind::Modify(ModifyKind::Name(_)) => WatchKind::Rename,
                EventKind::Modify(_) => WatchKind::Modify,
                EventKind::Remove(_) => WatchKind::Remove,
                EventKind::Access(_) => return,
                _ => WatchKind::Other,
            };
            let paths = ev
                .paths
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect();
            if tx.try_send(WatchMessage::Event { kind, paths }).is_err() {
                flag.store(true, Ordering::SeqCst);
            }
        })
        .map_err(|e| FsError::Io(path.to_path_buf(), std::io::Error::other(e)))?;
        let mode = if recursive {
            RecursiveMode::Recursive
        } else {
            RecursiveMode::NonRecursive
        };
        watcher
            .watch(path, mode)
            .map_err(|e| FsError::Io(path.to_path_buf(), std::io::Error::other(e)))?;
        Ok(FsWatch {
            _watcher: watcher,
            rx,
            lagged,
            ended: false,
        })
    }

    /// The next message; after a `Lagged` message the stream ends.
    pub async fn next(&mut self) -> Option<WatchMessage> {
        if self.ended {
            return None;
        }
        if self.lagged.load(Ordering::SeqCst) {
            self.ended = true;
            return Some(WatchMessage::Lagged { lagged: true });
        }
        let msg = self.rx.recv().await;
        if self.lagged.load(Ordering::SeqCst) {
            self.ended = true;
            return Some(WatchMessage::Lagged { lagged: true });
        }
        msg
    }
}
