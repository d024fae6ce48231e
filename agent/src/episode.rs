//! The episode: every computer-use and input action the agent ran (`/v1/computer`, each
//! action of a batch, `/v1/input`, the MCP `computer` tool), with its wall-clock time, the
//! media time of every live recording at its start and at the screenshot it answered, its
//! settle, and that screenshot's exact bytes.
//!
//! Kept under `<state>/episode/`: `actions.jsonl` (one entry a line, appended) and
//! `screenshots/<seq>.<ext>`, readable by the agent only. One task writes both, fed by a
//! bounded queue an action never waits on: a full queue drops the entry and the next one
//! that gets in says how many went (`dropped_before`). Bounded: the oldest entries go past
//! [`Limits::max_entries`] (the file is rewritten), the oldest screenshots past
//! [`Limits::max_screenshot_bytes`] (their entries then say `screenshot_dropped`). A new agent
//! reads the log back and continues its sequence.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use berth_protocol::sync::Locked;
use serde_json::{Map, Value, json};
use tokio::sync::{mpsc, oneshot};

use crate::display::Shot;
use crate::record::Recorder;

/// How much the log keeps.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_entries: usize,
    pub max_screenshot_bytes: u64,
    /// Entries waiting for the writer.
    pub queue: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_entries: 20_000,
            max_screenshot_bytes: 512 << 20,
            queue: 256,
        }
    }
}

/// Where an action came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Computer,
    Input,
    Mcp,
    /// Anthropic's computer toolset (`/v1/toolsets/computer`).
    Toolset,
    /// A person took or handed back the controls.
    Control,
}

impl Source {
    fn as_str(self) -> &'static str {
        match self {
            Source::Computer => "computer",
            Source::Input => "input",
            Source::Mcp => "mcp",
            Source::Toolset => "toolset",
            Source::Control => "control",
        }
    }
}

/// One action as a handler reports it.
pub struct Action {
    pub source: Source,
    /// `anthropic`, `openai` or `native`.
    pub dialect: Option<&'static str>,
    /// The action object as received.
    pub action: Value,
    pub started: Instant,
    pub duration: Duration,
    pub settled: Option<(Duration, bool)>,
    pub error: Option<String>,
    pub cursor: Option<(i32, i32)>,
    /// The screenshot the action answered and when it was taken.
    pub screenshot: Option<(Shot, Instant)>,
    /// A batch's action: its index and the batch's size.
    pub batch: Option<(usize, usize)>,
    /// Per live recording: id, media time at the start, at the screenshot.
    pub media: Vec<(String, u64, Option<u64>)>,
}

impl Action {
    /// Fills in the media times of the live recordings for this action's moments.
    pub fn with_media(mut self, recorder: &Recorder) -> Action {
        let at_start = recorder.media_times(self.started);
        let at_shot = self
            .screenshot
            .as_ref()
            .map(|(_, t)| recorder.media_times(*t))
            .unwrap_or_default();
        self.media = at_start
            .into_iter()
            .map(|(id, m)| {
                let shot = at_shot.iter().find(|(i, _)| *i == id).map(|(_, m)| *m);
                (id, m, shot)
            })
            .collect();
        self
    }
}

/// The dialect of one computer-use action object, by its key.
fn dialect_of(v: &Value) -> Option<&'static str> {
    if v.get("action").is_some() {
        Some("anthropic")
    } else if v.get("type").is_some() {
        Some("openai")
    } else {
        None
    }
}

/// The log entries of one `/v1/computer` (or MCP `computer`) call: one per action that ran
/// (every action of a batch up to the one that failed), each with its own start and length;
/// the last one carries the settle, the screenshot the call answered, the error and the
/// pointer. A body that never ran is one entry with its error.
pub fn computer_actions(
    source: Source,
    body: &Value,
    trace: &crate::display::computer::Trace,
    error: Option<String>,
    cursor: Option<(i32, i32)>,
    called: Instant,
) -> Vec<Action> {
    let one = |action: Value, started: Instant, duration: Duration, batch| Action {
        source,
        dialect: dialect_of(&action),
        action,
        started,
        duration,
        settled: None,
        error: None,
        cursor: None,
        screenshot: None,
        batch,
        media: Vec::new(),
    };
    let mut out: Vec<Action> = match body.get("actions").and_then(Value::as_array) {
        Some(items) if !trace.steps.is_empty() => items
            .iter()
            .zip(&trace.steps)
            .enumerate()
            .map(|(i, (a, (start, d)))| one(a.clone(), *start, *d, Some((i, items.len()))))
            .collect(),
        _ => {
            let (start, d) = trace
                .steps
                .first()
                .copied()
                .unwrap_or((called, called.elapsed()));
            vec![one(body.clone(), start, d, None)]
        }
    };
    if let Some(last) = out.last_mut() {
        if body.get("actions").is_some() && last.batch.is_none() {
            last.dialect = None;
        }
        last.settled = trace.settled;
        last.error = error;
        last.cursor = cursor;
        last.screenshot = trace.shot.clone().zip(trace.shot_at);
        // The last action lasts until its answer: the settle and the screenshot are its.
        last.duration = last.started.elapsed();
    }
    out
}

enum Msg {
    Log(Box<Action>, u64),
    Clear(oneshot::Sender<usize>),
    Flush(oneshot::Sender<()>),
}

/// A screenshot file the log keeps.
struct Kept {
    seq: u64,
    name: String,
    bytes: u64,
}

struct State {
    dir: PathBuf,
    entries: VecDeque<Value>,
    shots: VecDeque<Kept>,
    shot_bytes: u64,
    next_seq: u64,
    /// The log, open for appending.
    file: Option<File>,
}

pub struct Episode {
    tx: mpsc::Sender<Msg>,
    state: Arc<Mutex<State>>,
    dropped: AtomicU64,
    /// Every drop since the agent started.
    dropped_total: AtomicU64,
}

fn mkdir_private(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

fn open_private(path: &Path, append: bool) -> std::io::Result<File> {
    let f = OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .mode(0o600)
        .open(path)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    Ok(f)
}

/// A screenshot's file name as the log names it: `000012.png`. Anything else (a path, a
/// dot-file, another extension) is refused.
pub fn valid_name(name: &str) -> bool {
    let Some((stem, ext)) = name.split_once('.') else {
        return false;
    };
    (6..=20).contains(&stem.len())
        && stem.bytes().all(|b| b.is_ascii_digit())
        && matches!(ext, "png" | "jpg" | "webp")
}

pub fn content_type(name: &str) -> &'static str {
    match name.rsplit('.').next() {
        Some("jpg") => "image/jpeg",
        Some("webp") => "image/webp",
        _ => "image/png",
    }
}

fn extension(mime: &str) -> &'static str {
    match mime {
        "image/jpeg" => "jpg",
        "image/webp" => "webp",
        _ => "png",
    }
}

impl State {
    fn log_path(&self) -> PathBuf {
        self.dir.join("actions.jsonl")
    }

    fn shots_dir(&self) -> PathBuf {
        self.dir.join("screenshots")
    }

    /// Reads back what an earlier agent logged (a torn last line is left out).
    fn load(dir: PathBuf) -> std::io::Result<State> {
        mkdir_private(&dir)?;
        mkdir_private(&dir.join("screenshots"))?;
        let mut st = State {
            dir,
            entries: VecDeque::new(),
            shots: VecDeque::new(),
            shot_bytes: 0,
            next_seq: 1,
            file: None,
        };
        let path = st.log_path();
        if let Ok(f) = File::open(&path) {
            for line in BufReader::new(f).lines() {
                let Ok(line) = line else { break };
                let Ok(mut v) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                let Some(seq) = v.get("seq").and_then(Value::as_u64) else {
                    continue;
                };
                if seq < st.next_seq {
                    continue;
                }
                st.next_seq = seq + 1;
                if let Some(name) = v.get("screenshot").and_then(Value::as_str) {
                    match std::fs::metadata(st.shots_dir().join(name)) {
                        Ok(m) if valid_name(name) => {
                            st.shot_bytes += m.len();
                            st.shots.push_back(Kept {
                                seq,
                                name: name.to_string(),
                                bytes: m.len(),
                            });
                        }
                        _ => {
                            v["screenshot_dropped"] = json!(true);
                        }
                    }
                }
                st.entries.push_back(v);
            }
        }
        // Rewritten once: a torn line goes, the permissions are the agent's.
        st.rewrite()?;
        Ok(st)
    }

    /// Writes the kept entries as the whole log (atomically) and appends from there.
    fn rewrite(&mut self) -> std::io::Result<()> {
        self.file = None;
        let tmp = self.dir.join("actions.jsonl.tmp");
        {
            let mut f = std::io::BufWriter::new(open_private(&tmp, false)?);
            for e in &self.entries {
                serde_json::to_writer(&mut f, e)?;
                f.write_all(b"\n")?;
            }
            f.flush()?;
        }
        std::fs::rename(&tmp, self.log_path())?;
        self.file = Some(open_private(&self.log_path(), true)?);
        Ok(())
    }

    fn append(
        &mut self,
        limits: &Limits,
        mut a: Action,
        dropped_before: u64,
    ) -> std::io::Result<()> {
        let seq = self.next_seq;
        self.next_seq += 1;
        let screenshot = a.screenshot.take();
        let mut e = entry(seq, a, dropped_before);
        if let Some((shot, _)) = &screenshot {
            self.keep_screenshot(limits, &mut e, seq, shot)?;
        }
        let v = Value::Object(e);
        let line = format!("{v}\n");
        self.entries.push_back(v);
        let rewrite = self.enforce_limits(limits);
        if rewrite {
            self.rewrite()
        } else {
            match self.file.as_mut() {
                Some(f) => f.write_all(line.as_bytes()),
                None => self.rewrite(),
            }
        }
    }

    /// Names the entry's screenshot and writes it to the screenshots dir, or marks it dropped
    /// when it alone is over the byte limit.
    fn keep_screenshot(
        &mut self,
        limits: &Limits,
        e: &mut Map<String, Value>,
        seq: u64,
        shot: &Shot,
    ) -> std::io::Result<()> {
        let name = format!("{seq:06}.{}", extension(shot.mime));
        e.insert("screenshot".into(), json!(name));
        e.insert("screenshot_size".into(), json!([shot.width, shot.height]));
        let len = shot.bytes.len() as u64;
        if len <= limits.max_screenshot_bytes {
            let path = self.shots_dir().join(&name);
            let mut f = open_private(&path, false)?;
            f.write_all(&shot.bytes)?;
            self.shots.push_back(Kept {
                seq,
                name,
                bytes: len,
            });
            self.shot_bytes += len;
        } else {
            e.insert("screenshot_dropped".into(), json!(true));
        }
        Ok(())
    }

    /// Drops the oldest entries (a tenth more than the excess) and screenshots over the
    /// limits; says whether the log must be rewritten (entries went).
    fn enforce_limits(&mut self, limits: &Limits) -> bool {
        let mut rewrite = false;
        if self.entries.len() > limits.max_entries {
            // A tenth at a time, so the rewrite is rare.
            let excess = self.entries.len() - limits.max_entries + limits.max_entries / 10;
            for _ in 0..excess.min(self.entries.len() - 1) {
                self.entries.pop_front();
            }
            let oldest = self.entries.front().and_then(|e| e["seq"].as_u64());
            while let Some(k) = self.shots.front() {
                if oldest.is_some_and(|o| k.seq >= o) {
                    break;
                }
                self.drop_oldest_shot();
            }
            rewrite = true;
        }
        while self.shot_bytes > limits.max_screenshot_bytes && self.shots.len() > 1 {
            self.drop_oldest_shot();
        }
        rewrite
    }

    fn drop_oldest_shot(&mut self) {
        let Some(k) = self.shots.pop_front() else {
            return;
        };
        let _ = std::fs::remove_file(self.shots_dir().join(&k.name));
        self.shot_bytes -= k.bytes;
        if let Some(e) = self
            .entries
            .iter_mut()
            .find(|e| e["seq"].as_u64() == Some(k.seq))
        {
            e["screenshot_dropped"] = json!(true);
        }
    }

    fn clear(&mut self) -> std::io::Result<usize> {
        let n = self.entries.len();
        self.entries.clear();
        while !self.shots.is_empty() {
            self.drop_oldest_shot();
        }
        if let Ok(rd) = std::fs::read_dir(self.shots_dir()) {
            for f in rd.flatten() {
                let _ = std::fs::remove_file(f.path());
            }
        }
        self.shot_bytes = 0;
        self.next_seq = 1;
        self.rewrite()?;
        Ok(n)
    }
}

/// An action's log entry but for its screenshot: `seq`, when it started, what it was and
/// how it went.
fn entry(seq: u64, a: Action, dropped_before: u64) -> Map<String, Value> {
    let at = SystemTime::now() - a.started.elapsed();
    let mut e = Map::new();
    e.insert("seq".into(), json!(seq));
    e.insert("at".into(), json!(crate::time::rfc3339(at)));
    let at_ms = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    e.insert("at_ms".into(), json!(at_ms));
    e.insert("source".into(), json!(a.source.as_str()));
    if let Some(d) = a.dialect {
        e.insert("dialect".into(), json!(d));
    }
    e.insert("action".into(), a.action);
    if let Some((i, n)) = a.batch {
        e.insert("batch".into(), json!({"index": i, "size": n}));
    }
    e.insert("duration_ms".into(), json!(a.duration.as_millis() as u64));
    if let Some((waited, timed_out)) = a.settled {
        e.insert("settled_ms".into(), json!(waited.as_millis() as u64));
        e.insert("settle_timed_out".into(), json!(timed_out));
    }
    if let Some(err) = a.error {
        e.insert("error".into(), json!(err));
    }
    if let Some((x, y)) = a.cursor {
        e.insert("cursor".into(), json!([x, y]));
    }
    if dropped_before > 0 {
        e.insert("dropped_before".into(), json!(dropped_before));
    }
    if !a.media.is_empty() {
        e.insert("recordings".into(), recordings(&a.media));
    }
    e
}

/// The live recordings' media times of an action: at its start and at its screenshot.
fn recordings(media: &[(String, u64, Option<u64>)]) -> Value {
    let recs: Vec<Value> = media
        .iter()
        .map(|(id, m, s)| {
            let mut r = json!({"id": id, "media_ms": m});
            if let Some(s) = s {
                r["screenshot_media_ms"] = json!(s);
            }
            r
        })
        .collect();
    Value::Array(recs)
}

/// A page of the log.
pub struct Page {
    pub actions: Vec<Value>,
    pub next_seq: u64,
}

impl Episode {
    /// Opens `<state>/episode`, reading back an earlier agent's log, and starts the writer.
    pub fn open(state_dir: &Path, limits: Limits) -> std::io::Result<Arc<Episode>> {
        let state = Arc::new(Mutex::new(State::load(state_dir.join("episode"))?));
        let (tx, mut rx) = mpsc::channel::<Msg>(limits.queue.max(1));
        let writer = state.clone();
        tokio::spawn(async move {
            while let Some(msg) = rx.recv().await {
                let st = writer.clone();
                let done = tokio::task::spawn_blocking(move || {
                    let mut st = st.locked();
                    match msg {
                        Msg::Log(a, dropped) => {
                            if let Err(e) = st.append(&limits, *a, dropped) {
                                tracing::warn!(error = %e, "episode: cannot log an action");
                            }
                        }
                        Msg::Clear(reply) => {
                            let n = st.clear().unwrap_or_else(|e| {
                                tracing::warn!(error = %e, "episode: cannot clear the log");
                                0
                            });
                            let _ = reply.send(n);
                        }
                        Msg::Flush(reply) => {
                            let _ = reply.send(());
                        }
                    }
                })
                .await;
                if done.is_err() {
                    tracing::warn!("episode: the writer failed");
                }
            }
        });
        Ok(Arc::new(Episode {
            tx,
            state,
            dropped: AtomicU64::new(0),
            dropped_total: AtomicU64::new(0),
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.locked()
    }

    /// Queues an action for the log; never waits (a full queue counts a drop).
    pub fn log(&self, a: Action) {
        let dropped = self.dropped.swap(0, Ordering::SeqCst);
        if let Err(e) = self.tx.try_send(Msg::Log(Box::new(a), dropped)) {
            // Not sent: this one and those before it are still untold.
            self.dropped.fetch_add(dropped + 1, Ordering::SeqCst);
            self.dropped_total.fetch_add(1, Ordering::SeqCst);
            if matches!(e, mpsc::error::TrySendError::Full(_)) {
                tracing::debug!("episode: the queue is full; an action was not logged");
            }
        }
    }

    /// Entries from `from_seq` on, at most `limit`.
    pub fn page(&self, from_seq: u64, limit: usize) -> Page {
        let st = self.lock();
        let actions: Vec<Value> = st
            .entries
            .iter()
            .filter(|e| e["seq"].as_u64().is_some_and(|s| s >= from_seq))
            .take(limit)
            .cloned()
            .collect();
        let next_seq = actions
            .last()
            .and_then(|e| e["seq"].as_u64())
            .map(|s| s + 1)
            .unwrap_or(from_seq.min(st.next_seq).max(1));
        Page { actions, next_seq }
    }

    pub fn dropped_total(&self) -> u64 {
        self.dropped_total.load(Ordering::SeqCst)
    }

    /// A kept screenshot's bytes; None for a bad name or one not (or no longer) kept.
    pub fn screenshot(&self, name: &str) -> Option<Vec<u8>> {
        if !valid_name(name) {
            return None;
        }
        let st = self.lock();
        if !st.shots.iter().any(|k| k.name == name) {
            return None;
        }
        std::fs::read(st.shots_dir().join(name)).ok()
    }

    /// Starts a new episode: the log and its screenshots go, the sequence starts at 1 again.
    /// Waits for what was queued before it.
    pub async fn clear(&self) -> usize {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Msg::Clear(tx)).await.is_err() {
            return 0;
        }
        rx.await.unwrap_or(0)
    }

    /// Waits until everything queued so far is written (for tests and shutdown).
    pub async fn flush(&self, timeout: Duration) {
        let (tx, rx) = oneshot::channel();
        let _ = tokio::time::timeout(timeout, async {
            if self.tx.send(Msg::Flush(tx)).await.is_ok() {
                let _ = rx.await;
            }
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shot(bytes: usize) -> Shot {
        Shot {
            bytes: Arc::new(vec![7u8; bytes]),
            mime: "image/png",
            width: 10,
            height: 10,
            screen: (10, 10),
            scale: 1.0,
            cached: false,
        }
    }

    fn action(n: u64, with_shot: Option<usize>) -> Action {
        let now = Instant::now();
        Action {
            source: Source::Computer,
            dialect: Some("anthropic"),
            action: json!({"action": "key", "text": format!("k{n}")}),
            started: now,
            duration: Duration::from_millis(3),
            settled: Some((Duration::from_millis(150), false)),
            error: None,
            cursor: Some((1, 2)),
            screenshot: with_shot.map(|b| (shot(b), now)),
            batch: None,
            media: vec![("rec_1".into(), 100 * n, Some(100 * n + 50))],
        }
    }

    fn tmp() -> PathBuf {
        let mut b = [0u8; 8];
        getrandom::fill(&mut b).unwrap();
        let d = std::env::temp_dir().join(format!(
            "berth-episode-{}",
            b.iter().map(|x| format!("{x:02x}")).collect::<String>()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn names_are_the_logs_own() {
        assert!(valid_name("000012.png"));
        assert!(valid_name("1234567.jpg"));
        assert!(valid_name("000001.webp"));
        for bad in [
            "../000012.png",
            "000012.png/..",
            "00012.png",
            "000012.exe",
            ".000012.png",
            "000012",
            "abcdef.png",
            "000012.png.png",
            "",
        ] {
            assert!(!valid_name(bad), "{bad}");
        }
        assert_eq!(content_type("000001.jpg"), "image/jpeg");
        assert_eq!(content_type("000001.png"), "image/png");
    }

    #[test]
    fn entries_carry_their_fields_and_screenshots_their_bytes() {
        let dir = tmp();
        let limits = Limits::default();
        let mut st = State::load(dir.join("episode")).unwrap();
        st.append(&limits, action(1, Some(20)), 0).unwrap();
        st.append(&limits, action(2, None), 3).unwrap();
        let e = &st.entries[0];
        assert_eq!(e["seq"], 1);
        assert_eq!(e["source"], "computer");
        assert_eq!(e["dialect"], "anthropic");
        assert_eq!(e["action"]["text"], "k1");
        assert_eq!(e["settled_ms"], 150);
        assert_eq!(e["cursor"], json!([1, 2]));
        assert_eq!(e["screenshot"], "000001.png");
        assert_eq!(e["recordings"][0]["media_ms"], 100);
        assert_eq!(e["recordings"][0]["screenshot_media_ms"], 150);
        assert!(e["at"].as_str().unwrap().ends_with('Z'));
        assert_eq!(st.entries[1]["dropped_before"], 3);
        assert!(st.entries[1].get("screenshot").is_none());
        let bytes = std::fs::read(dir.join("episode/screenshots/000001.png")).unwrap();
        assert_eq!(bytes, vec![7u8; 20]);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir.join("episode")), 0o700);
        assert_eq!(mode(&dir.join("episode/actions.jsonl")), 0o600);
        assert_eq!(mode(&dir.join("episode/screenshots/000001.png")), 0o600);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_oldest_screenshots_go_first_and_entries_say_so() {
        let dir = tmp();
        let limits = Limits {
            max_entries: 1000,
            max_screenshot_bytes: 250,
            queue: 8,
        };
        let mut st = State::load(dir.join("episode")).unwrap();
        for n in 1..=5 {
            st.append(&limits, action(n, Some(100)), 0).unwrap();
        }
        assert!(st.shot_bytes <= 250);
        let kept: Vec<u64> = st.shots.iter().map(|k| k.seq).collect();
        assert_eq!(kept, vec![4, 5]);
        assert_eq!(st.entries[0]["screenshot_dropped"], true);
        assert!(st.entries[4].get("screenshot_dropped").is_none());
        assert!(!dir.join("episode/screenshots/000001.png").exists());
        assert!(dir.join("episode/screenshots/000005.png").exists());
        // A restart reads the drops back from the files.
        drop(st);
        let st = State::load(dir.join("episode")).unwrap();
        assert_eq!(st.entries.len(), 5);
        assert_eq!(st.entries[1]["screenshot_dropped"], true);
        assert_eq!(st.shots.len(), 2);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_log_keeps_its_newest_entries() {
        let dir = tmp();
        let limits = Limits {
            max_entries: 10,
            max_screenshot_bytes: 1 << 20,
            queue: 8,
        };
        let mut st = State::load(dir.join("episode")).unwrap();
        for n in 1..=25 {
            st.append(&limits, action(n, Some(10)), 0).unwrap();
        }
        assert!(st.entries.len() <= 10);
        assert_eq!(st.entries.back().unwrap()["seq"], 25);
        let oldest = st.entries.front().unwrap()["seq"].as_u64().unwrap();
        assert!(st.shots.iter().all(|k| k.seq >= oldest));
        let lines = std::fs::read_to_string(dir.join("episode/actions.jsonl")).unwrap();
        assert_eq!(lines.lines().count(), st.entries.len());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_restart_resumes_the_sequence_and_leaves_a_torn_line_out() {
        let dir = tmp();
        let limits = Limits::default();
        let mut st = State::load(dir.join("episode")).unwrap();
        for n in 1..=3 {
            st.append(&limits, action(n, Some(5)), 0).unwrap();
        }
        drop(st);
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.join("episode/actions.jsonl"))
            .unwrap();
        f.write_all(b"{\"seq\": 4, \"act").unwrap();
        drop(f);
        let mut st = State::load(dir.join("episode")).unwrap();
        assert_eq!(st.entries.len(), 3);
        assert_eq!(st.next_seq, 4);
        st.append(&limits, action(4, None), 0).unwrap();
        assert_eq!(st.entries[3]["seq"], 4);
        let text = std::fs::read_to_string(dir.join("episode/actions.jsonl")).unwrap();
        assert_eq!(text.lines().count(), 4);
        assert!(
            text.lines()
                .all(|l| serde_json::from_str::<Value>(l).is_ok())
        );
        assert_eq!(st.clear().unwrap(), 4);
        assert!(st.entries.is_empty());
        assert_eq!(st.next_seq, 1);
        assert!(!dir.join("episode/screenshots/000001.png").exists());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_the_next_entry_counts_it() {
        let dir = tmp();
        let ep = Episode::open(
            &dir,
            Limits {
                queue: 1,
                ..Limits::default()
            },
        )
        .unwrap();
        // The writer does not run between these calls (one thread): the queue fills.
        for n in 1..=6 {
            ep.log(action(n, None));
        }
        ep.flush(Duration::from_secs(5)).await;
        let dropped = ep.dropped_total();
        assert!(dropped >= 1, "nothing was dropped");
        ep.log(action(7, None));
        ep.flush(Duration::from_secs(5)).await;
        let page = ep.page(1, 100);
        let told: u64 = page
            .actions
            .iter()
            .filter_map(|e| e["dropped_before"].as_u64())
            .sum();
        assert_eq!(told, dropped);
        assert_eq!(page.actions.len() as u64 + dropped, 7);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
