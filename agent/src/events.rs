//! The agent's timeline: every observed action as a sequence-numbered event, appended to
//! `events.log` (JSON lines) so it survives restarts, and replayable from any sequence number.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use berth_protocol::sync::Locked;
use berth_protocol::{Event, EventKind, EventsPage};
use serde_json::{Map, Value};
use tokio::sync::watch;

/// Events kept in memory (and re-read from the log at start-up).
const KEEP: usize = 50_000;
/// The log is rewritten down to the kept events once it grows past this.
const MAX_LOG_BYTES: u64 = 64 << 20;

pub struct EventLog {
    path: PathBuf,
    inner: Mutex<Inner>,
    changed: watch::Sender<u64>,
}

struct Inner {
    events: VecDeque<Event>,
    next_seq: u64,
    file: Option<File>,
    file_bytes: u64,
}

impl EventLog {
    pub fn open(path: &Path) -> std::io::Result<EventLog> {
        let mut events = VecDeque::new();
        let mut next_seq = 0;
        if let Ok(f) = File::open(path) {
            for line in BufReader::new(f).lines() {
                let Ok(line) = line else { break };
                // A torn last line from a crash is skipped, not fatal.
                if let Ok(e) = serde_json::from_str::<Event>(&line) {
                    next_seq = e.seq + 1;
                    events.push_back(e);
                    if events.len() > KEEP {
                        events.pop_front();
                    }
                }
            }
        }
        let mut file = OpenOptions::new().create(true).append(true).open(path)?;
        let file_bytes = file.metadata()?.len();
        if file_bytes > 0 && !ends_with_newline(path) {
            // Terminate a torn line so the next event starts on a line of its own.
            file.write_all(b"\n")?;
        }
        let (changed, _) = watch::channel(next_seq);
        Ok(EventLog {
            path: path.to_path_buf(),
            inner: Mutex::new(Inner {
                events,
                next_seq,
                file: Some(file),
                file_bytes,
            }),
            changed,
        })
    }

    /// Appends one event. `data` must be a JSON object (its fields are flattened).
    pub fn emit(&self, kind: EventKind, data: Value) {
        let data = match data {
            Value::Object(m) => m,
            Value::Null => Map::new(),
            other => {
                let mut m = Map::new();
                m.insert("value".into(), other);
                m
            }
        };
        let mut inner = self.inner.locked();
        let event = Event {
            seq: inner.next_seq,
            at: crate::time::now_rfc3339(),
            kind,
            data,
        };
        inner.next_seq += 1;
        if let Ok(mut line) = serde_json::to_vec(&event) {
            line.push(b'\n');
            if let Some(f) = inner.file.as_mut() {
                if let Err(e) = f.write_all(&line) {
                    tracing::warn!(error = %e, "cannot append to the event log");
                } else {
                    inner.file_bytes += line.len() as u64;
                }
            }
        }
        inner.events.push_back(event);
        if inner.events.len() > KEEP {
            inner.events.pop_front();
        }
        if inner.file_bytes > MAX_LOG_BYTES {
            self.compact(&mut inner);
        }
        let seq = inner.next_seq;
        drop(inner);
        self.changed.send_replace(seq);
    }

    fn compact(&self, inner: &mut Inner) {
        let tmp = self.path.with_extension("log.tmp");
        let result = (|| -> std::io::Result<File> {
            let mut f = File::create(&tmp)?;
            for e in &inner.events {
                let mut line = serde_json::to_vec(e).map_err(std::io::Error::other)?;
                line.push(b'\n');
                f.write_all(&line)?;
            }
            std::fs::rename(&tmp, &self.path)?;
            OpenOptions::new().append(true).open(&self.path)
        })();
        match result {
            Ok(f) => {
                inner.file_bytes = f.metadata().map(|m| m.len()).unwrap_or(0);
                inner.file = Some(f);
            }
            Err(e) => tracing::warn!(error = %e, "cannot compact the event log"),
        }
    }

    /// Events from `from_seq`, at most `limit` of them.
    pub fn page(&self, from_seq: u64, limit: usize) -> EventsPage {
        let inner = self.inner.locked();
        let first = inner
            .events
            .front()
            .map(|e| e.seq)
            .unwrap_or(inner.next_seq);
        let start = from_seq.max(first);
        let skip = (start - first) as usize;
        let events: Vec<Event> = inner
            .events
            .iter()
            .skip(skip)
            .take(limit)
            .cloned()
            .collect();
        let next_seq = events
            .last()
            .map(|e| e.seq + 1)
            .unwrap_or(start.min(inner.next_seq));
        EventsPage {
            events,
            next_seq,
            truncated_before_seq: (from_seq < first).then_some(first),
        }
    }

    pub fn next_seq(&self) -> u64 {
        self.inner.locked().next_seq
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

fn ends_with_newline(path: &Path) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let mut last = [0u8; 1];
    File::open(path)
        .and_then(|mut f| {
            f.seek(SeekFrom::End(-1))?;
            f.read_exact(&mut last)
        })
        .map(|_| last[0] == b'\n')
        .unwrap_or(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_are_numbered_and_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.log");
        {
            let log = EventLog::open(&path).unwrap();
            log.emit(EventKind::parse("command.started"), json!({"id": "a"}));
            log.emit(
                EventKind::parse("command.exited"),
                json!({"id": "a", "exit_code": 0}),
            );
        }
        let log = EventLog::open(&path).unwrap();
        log.emit(EventKind::parse("pty.opened"), json!({"id": "p"}));
        let page = log.page(0, 100);
        let seqs: Vec<u64> = page.events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, vec![0, 1, 2]);
        assert_eq!(page.next_seq, 3);
        assert_eq!(page.events[1].data["exit_code"], json!(0));
        let tail = log.page(2, 100);
        assert_eq!(tail.events.len(), 1);
        assert_eq!(tail.events[0].kind, "pty.opened");
        assert_eq!(log.page(3, 10).events.len(), 0);
        assert_eq!(log.page(3, 10).next_seq, 3);
    }

    #[test]
    fn a_torn_last_line_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.log");
        {
            let log = EventLog::open(&path).unwrap();
            log.emit(EventKind::parse("command.started"), json!({"id": "a"}));
        }
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"{\"seq\":1,\"at\":")
            .unwrap();
        let log = EventLog::open(&path).unwrap();
        assert_eq!(log.next_seq(), 1);
        log.emit(EventKind::parse("command.exited"), json!({"id": "a"}));
        drop(log);
        let log = EventLog::open(&path).unwrap();
        assert_eq!(log.next_seq(), 2);
    }
}
