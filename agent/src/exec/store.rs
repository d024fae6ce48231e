//! Where finished foreground commands live: time-bucketed segment pairs in the state dir,
//! `fg/<n>.out` (their output bytes, back to back) and `fg/<n>.log` (one JSON line per record,
//! pointing into `<n>.out`). Keeping a record costs two appends instead of a directory and its
//! files; a whole segment is deleted once everything in it is past the TTL, so nothing is ever
//! rewritten.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use berth_protocol::Stream;
use berth_protocol::sync::Locked;
use serde::{Deserialize, Serialize};

use super::record::{ExitRecord, Meta};

/// One finished foreground command as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Stored {
    pub meta: Meta,
    pub exit: ExitRecord,
    /// Where its output starts in the segment's `.out` file, and how long it is.
    pub offset: u64,
    pub len: u64,
    /// Stream switches (seq, stream); empty means all stdout.
    #[serde(default)]
    pub streams: Vec<(u64, Stream)>,
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Line {
    Record(Box<Stored>),
    Forget { forget: String },
}

pub struct ForegroundStore {
    dir: PathBuf,
    span: u64,
    ttl: Duration,
    open: Mutex<Option<Segment>>,
}

struct Segment {
    index: u64,
    log: File,
    out: File,
    out_len: u64,
}

impl ForegroundStore {
    /// Opens the store, dropping expired segments, and returns the records still alive with
    /// the output file each one's offset refers to.
    pub fn open(
        dir: &Path,
        ttl: Duration,
    ) -> std::io::Result<(ForegroundStore, Vec<(Stored, PathBuf)>)> {
        std::fs::create_dir_all(dir)?;
        let span = (ttl.as_secs() / 4).clamp(1, 3600);
        let store = ForegroundStore {
            dir: dir.to_path_buf(),
            span,
            ttl,
            open: Mutex::new(None),
        };
        store.drop_expired();
        let mut indexes: Vec<u64> = std::fs::read_dir(dir)?
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.strip_suffix(".log")?.parse().ok()
            })
            .collect();
        indexes.sort();
        let mut live: HashMap<String, (Stored, PathBuf)> = HashMap::new();
        let mut order = Vec::new();
        for i in indexes {
            let Ok(f) = File::open(store.log_path(i)) else {
                continue;
            };
            for line in BufReader::new(f).lines() {
                let Ok(line) = line else { break };
                // A torn last line from a crash is skipped.
                match serde_json::from_str::<Line>(&line) {
                    Ok(Line::Record(r)) => {
                        order.push(r.meta.id.clone());
                        live.insert(r.meta.id.clone(), (*r, store.out_path(i)));
                    }
                    Ok(Line::Forget { forget }) => {
                        live.remove(&forget);
                    }
                    Err(_) => {}
                }
            }
        }
        let records = order
            .into_iter()
            .filter_map(|id| live.remove(&id))
            .collect();
        Ok((store, records))
    }

    fn log_path(&self, i: u64) -> PathBuf {
        self.dir.join(format!("{i}.log"))
    }

    fn out_path(&self, i: u64) -> PathBuf {
        self.dir.join(format!("{i}.out"))
    }

    fn current_index(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs()
            / self.span
    }

    fn segment<'a>(&self, slot: &'a mut Option<Segment>) -> std::io::Result<&'a mut Segment> {
        let i = self.current_index();
        if slot.as_ref().is_none_or(|s| s.index != i) {
            let append = |p: PathBuf| OpenOptions::new().create(true).append(true).open(p);
            let out = append(self.out_path(i))?;
            let out_len = out.metadata()?.len();
            *slot = Some(Segment {
                index: i,
                log: append(self.log_path(i))?,
                out,
                out_len,
            });
        }
        Ok(slot.as_mut().expect("just opened"))
    }

    /// Stores a finished command's output and record. Returns the output file and offset its
    /// bytes now live at.
    pub fn put(
        &self,
        meta: &Meta,
        exit: &ExitRecord,
        bytes: &[u8],
        streams: &[(u64, Stream)],
    ) -> std::io::Result<(PathBuf, u64)> {
        let mut slot = self.open.locked();
        let seg = self.segment(&mut slot)?;
        let offset = seg.out_len;
        seg.out.write_all(bytes)?;
        seg.out_len += bytes.len() as u64;
        let rec = Line::Record(Box::new(Stored {
            meta: meta.clone(),
            exit: exit.clone(),
            offset,
            len: bytes.len() as u64,
            streams: streams.to_vec(),
        }));
        let mut line = serde_json::to_vec(&rec).map_err(std::io::Error::other)?;
        line.push(b'\n');
        seg.log.write_all(&line)?;
        Ok((self.out_path(seg.index), offset))
    }

    /// Records a deletion, so the record does not come back after a restart.
    pub fn forget(&self, id: &str) {
        let mut slot = self.open.locked();
        if let Ok(seg) = self.segment(&mut slot) {
            let mut line = serde_json::to_vec(&Line::Forget {
                forget: id.to_string(),
            })
            .unwrap_or_default();
            line.push(b'\n');
            let _ = seg.log.write_all(&line);
        }
    }

    /// Deletes segments whose every record is past the TTL.
    pub fn drop_expired(&self) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(i) = name
                .rsplit_once('.')
                .and_then(|(stem, _)| stem.parse::<u64>().ok())
            else {
                continue;
            };
            // Segment i holds records that ended before (i + 1) * span.
            if (i + 1) * self.span + self.ttl.as_secs() < now {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}
