//! A recording: a fragmented MP4 on disk, written a fragment at a time (each one a complete
//! `moof` + `mdat`, so the file plays up to its last fragment whatever happens next), with
//! live statistics and a record beside it that survives the agent.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant, SystemTime};

use berth_protocol::events::EventKind;
use berth_protocol::sync::Locked;
use berth_protocol::{RecordingInfo, RecordingState};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::watch;

use super::mp4::{self, Sample, TIMESCALE};
use super::pipeline::{Picture, Settings, Sink, Tick, Verdict};
use crate::events::EventLog;

/// A fragment is written at least this often while pictures arrive.
const FRAGMENT_EVERY: Duration = Duration::from_secs(1);
/// …or when this many bytes wait.
const FRAGMENT_BYTES: usize = 8 << 20;

/// How a start-up went: still waiting for the first picture, or its outcome.
pub type Started = Option<Result<(), String>>;

struct Writer {
    /// Shared with the syncing thread.
    file: Arc<File>,
    syncer: Option<Syncer>,
    /// Bytes of complete boxes in the file.
    committed: u64,
    mehd_at: Option<usize>,
    sequence: u32,
    /// Decode time of the first buffered sample (90 kHz).
    decode: u64,
    /// The latest picture: its duration is known when the next one comes.
    pending: Option<(u64, Vec<u8>, bool)>,
    /// Where the first picture's provisional duration sits in the file, until the next
    /// picture (or the end) tells the true one.
    provisional: Option<u64>,
    buffered: Vec<Sample>,
    buffered_bytes: usize,
    last_flush: Instant,
}

#[derive(Default)]
struct Counts {
    encoded: u64,
    skipped: u64,
    dropped: u64,
    keyframes: u64,
}

struct Inner {
    state: RecordingState,
    writer: Option<Writer>,
    t0: Option<Instant>,
    counts: Counts,
    bytes: u64,
    duration_ms: u64,
    ended_at: Option<String>,
    end_reason: Option<String>,
    error: Option<String>,
    /// When the first picture was on screen: the file's time 0.
    first_frame_at: Option<String>,
}

/// The record as kept beside the file: the API's record, and what the next agent needs to
/// rebuild it from the file should this one die.
#[derive(Serialize, Deserialize)]
struct Stored {
    #[serde(flatten)]
    info: RecordingInfo,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    first_frame_at: Option<String>,
}

pub struct Recording {
    pub id: String,
    pub compat: bool,
    pub settings: Settings,
    pub path: PathBuf,
    record_path: PathBuf,
    max_duration: Option<Duration>,
    started_at: String,
    events: Arc<EventLog>,
    inner: Mutex<Inner>,
    started: watch::Sender<Started>,
}

/// Ticks of the 90 kHz clock in `d`.
fn ticks(d: Duration) -> u64 {
    (d.as_nanos() * TIMESCALE as u128 / 1_000_000_000) as u64
}

impl Recording {
    /// Creates the (empty) file and the record beside it; pictures come once a pipeline has
    /// it as a consumer.
    pub fn create(
        dir: &Path,
        id: String,
        compat: bool,
        settings: Settings,
        max_duration: Option<Duration>,
        events: Arc<EventLog>,
    ) -> std::io::Result<Arc<Recording>> {
        let path = dir.join(format!("{id}.mp4"));
        let file = Arc::new(File::options().write(true).create_new(true).open(&path)?);
        let rec = Arc::new(Recording {
            record_path: dir.join(format!("{id}.json")),
            id,
            compat,
            settings,
            path,
            max_duration,
            started_at: crate::time::now_rfc3339(),
            events,
            inner: Mutex::new(Inner {
                state: RecordingState::Recording,
                writer: Some(Writer {
                    syncer: Syncer::start(file.clone()),
                    file,
                    committed: 0,
                    mehd_at: None,
                    sequence: 1,
                    decode: 0,
                    pending: None,
                    provisional: None,
                    buffered: Vec::new(),
                    buffered_bytes: 0,
                    last_flush: Instant::now(),
                }),
                t0: None,
                counts: Counts::default(),
                bytes: 0,
                duration_ms: 0,
                ended_at: None,
                end_reason: None,
                error: None,
                first_frame_at: None,
            }),
            started: watch::channel(None).0,
        });
        if let Err(e) = rec.save_locked(&rec.lock(), true) {
            let _ = std::fs::remove_file(&rec.path);
            return Err(e);
        }
        Ok(rec)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.locked()
    }

    /// Resolves when the first picture is in the file (or the start failed).
    pub fn started(&self) -> watch::Receiver<Started> {
        self.started.subscribe()
    }

    pub fn info(&self) -> RecordingInfo {
        let inner = self.lock();
        self.info_locked(&inner)
    }

    fn info_locked(&self, inner: &Inner) -> RecordingInfo {
        let duration_ms = match (inner.state, inner.t0) {
            (RecordingState::Recording, Some(t0)) => t0.elapsed().as_millis() as u64,
            _ => inner.duration_ms,
        };
        let per_second = |n: u64| per_second(n, duration_ms);
        let c = &inner.counts;
        RecordingInfo {
            id: self.id.clone(),
            state: inner.state,
            compat: self.compat,
            width: self.settings.width,
            height: self.settings.height,
            fps: self.settings.fps,
            bitrate_kbps: self.settings.bitrate_kbps,
            keyframe_interval_ms: self.settings.keyframe_interval_ms,
            cursor: self.settings.cursor,
            frames_encoded: c.encoded,
            frames_skipped: c.skipped,
            frames_dropped: c.dropped,
            keyframes: c.keyframes,
            bytes: inner.bytes,
            duration_ms,
            achieved_fps: per_second(c.encoded + c.skipped),
            encoded_fps: per_second(c.encoded),
            started_at: self.started_at.clone(),
            ended_at: inner.ended_at.clone(),
            end_reason: inner.end_reason.clone(),
            error: inner.error.clone(),
        }
    }

    /// Where in this file a player shows the screen as it was at `at`, in milliseconds of
    /// media time: every picture is stamped with its capture time less the first picture's
    /// (on the 90 kHz clock, starting at 0), and a player at media time `m` shows the last
    /// picture stamped at or before `m`, so a moment maps to its offset from the first
    /// picture. None while no picture is in the file, for a moment before it, and once the
    /// recording ended.
    pub fn media_ms_at(&self, at: Instant) -> Option<u64> {
        let inner = self.lock();
        if inner.state != RecordingState::Recording {
            return None;
        }
        let t0 = inner.t0?;
        let since = at.checked_duration_since(t0)?;
        Some(ticks(since) * 1000 / TIMESCALE as u64)
    }

    /// The file's complete part: what a download may serve while recording.
    pub fn committed_len(&self) -> u64 {
        self.lock().bytes
    }

    pub fn is_live(&self) -> bool {
        self.lock().state == RecordingState::Recording
    }

    /// Writes the record beside the file (atomically); `durable` also waits for the disk.
    fn save_locked(&self, inner: &Inner, durable: bool) -> std::io::Result<()> {
        let stored = Stored {
            info: self.info_locked(inner),
            first_frame_at: inner.first_frame_at.clone(),
        };
        save_record(&self.record_path, &stored, durable)
    }

    /// While recording, the record follows the file (at its first picture and each
    /// fragment): what the next agent starts from should this one die. Best effort: the
    /// file is what counts.
    fn save_live(&self, inner: &Inner) {
        if let Err(e) = self.save_locked(inner, false) {
            tracing::debug!(id = %self.id, error = %e, "cannot update the recording's record");
        }
    }

    /// Ends the recording: the last picture lasts until now, the remaining pictures are
    /// written, the total duration goes into the header. No-op when already ended.
    pub fn finish(&self, reason: &str) -> RecordingInfo {
        let mut inner = self.lock();
        if inner.state != RecordingState::Recording {
            return self.info_locked(&inner);
        }
        let now = Instant::now();
        let result = match (inner.t0, inner.writer.as_mut()) {
            (Some(t0), Some(w)) => close(w, ticks(now - t0)),
            _ => Ok(()),
        };
        match result {
            Ok(()) => {
                inner.state = RecordingState::Stopped;
                inner.end_reason = Some(reason.to_string());
                if inner.t0.is_none() {
                    // Stopped before its first picture: nothing to play.
                    inner.end_reason = Some(format!("{reason} before the first frame"));
                    self.started.send_replace(Some(Err(format!(
                        "the recording ended ({reason}) before its first frame"
                    ))));
                }
            }
            Err(e) => {
                inner.state = RecordingState::Failed;
                inner.end_reason = Some("error".into());
                inner.error = Some(format!("writing {}: {e}", self.path.display()));
            }
        }
        self.ended(&mut inner);
        self.info_locked(&inner)
    }

    /// Common end: totals, the record, the event.
    fn ended(&self, inner: &mut Inner) {
        if let Some(w) = inner.writer.take() {
            inner.bytes = w.committed;
            inner.duration_ms = w.decode * 1000 / TIMESCALE as u64;
            let _ = w.file.sync_data();
        }
        inner.ended_at = Some(crate::time::now_rfc3339());
        let info = self.info_locked(inner);
        if let Err(e) = self.save_locked(inner, true) {
            tracing::warn!(id = %self.id, error = %e, "cannot save the recording's record");
        }
        self.events.emit(
            EventKind::RecordingStopped,
            json!({
                "id": info.id,
                "state": info.state,
                "reason": info.end_reason,
                "error": info.error,
                "frames_encoded": info.frames_encoded,
                "frames_skipped": info.frames_skipped,
                "frames_dropped": info.frames_dropped,
                "keyframes": info.keyframes,
                "bytes": info.bytes,
                "duration_ms": info.duration_ms,
            }),
        );
    }

    /// A write failed: keep the complete fragments, end with the error.
    fn failed(&self, inner: &mut Inner, error: String) {
        if let Some(w) = inner.writer.as_mut() {
            // Drop a partly written fragment so the file stays playable to its end.
            let _ = w.file.set_len(w.committed);
        }
        inner.state = RecordingState::Failed;
        inner.end_reason = Some("error".into());
        inner.error = Some(error.clone());
        if inner.t0.is_none() {
            self.started.send_replace(Some(Err(error)));
        }
        self.ended(inner);
    }

    /// Writes the init segment and the first picture, as a fragment of one frame interval
    /// whose duration is patched once the next picture comes.
    fn write_first(&self, w: &mut Writer, pic: &Picture<'_>) -> std::io::Result<()> {
        let init = mp4::init_segment(pic.track, true);
        let interval = TIMESCALE / self.settings.fps.max(1);
        let first = mp4::fragment(
            w.sequence,
            0,
            &[Sample {
                data: pic.data.to_vec(),
                duration: interval,
                sync: pic.sync,
            }],
        );
        let head = [init.bytes.as_slice(), first.as_slice()].concat();
        (&*w.file).write_all(&head)?;
        w.committed = head.len() as u64;
        w.mehd_at = init.mehd_duration_offset;
        w.provisional = Some((init.bytes.len() + mp4::FIRST_SAMPLE_DURATION_AT) as u64);
        w.sequence += 1;
        w.decode = interval as u64;
        w.last_flush = Instant::now();
        w.sync_soon();
        Ok(())
    }

    /// The first picture, `committed` bytes into the file, is in: counts it, stamps the
    /// start, saves the record and tells the waiters and the event log the recording started.
    fn note_started(&self, inner: &mut Inner, committed: u64, pic: &Picture<'_>) {
        inner.bytes = committed;
        inner.counts.encoded += 1;
        if pic.sync {
            inner.counts.keyframes += 1;
        }
        inner.t0 = Some(pic.at);
        let wall = SystemTime::now() - pic.at.elapsed();
        inner.first_frame_at = Some(crate::time::rfc3339(wall));
        self.save_live(inner);
        self.events.emit(
            EventKind::RecordingStarted,
            json!({
                "id": self.id,
                "width": self.settings.width,
                "height": self.settings.height,
                "fps": self.settings.fps,
                "compat": self.compat,
            }),
        );
        self.started.send_replace(Some(Ok(())));
    }

    /// Writing the file failed with `e`: the recording ends with that error.
    fn write_failed(&self, inner: &mut Inner, e: std::io::Error) -> Verdict {
        let msg = format!("writing {}: {e}", self.path.display());
        self.failed(inner, msg);
        Verdict::Done
    }

    pub fn delete_files(&self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_file(&self.record_path);
    }
}

impl Sink for Recording {
    fn push(&self, pic: &Picture<'_>) -> Verdict {
        let mut guard = self.lock();
        let inner = &mut *guard;
        if inner.state != RecordingState::Recording {
            return Verdict::Done;
        }
        let Some(w) = inner.writer.as_mut() else {
            return Verdict::Done;
        };
        let t0 = match inner.t0 {
            Some(t) => t,
            None if !pic.sync => return Verdict::Keep, // a keyframe was asked for on joining
            None => {
                // "Started" means the first picture is in the file: it goes in at once, as a
                // fragment of its own lasting one frame interval until the next picture
                // tells its true duration (patched in place, so the file is valid at every
                // moment).
                if let Err(e) = self.write_first(w, pic) {
                    return self.write_failed(inner, e);
                }
                let committed = w.committed;
                self.note_started(inner, committed, pic);
                return Verdict::Keep;
            }
        };
        let due = match queue_picture(w, t0, pic) {
            Ok(due) => due,
            Err(e) => return self.write_failed(inner, e),
        };
        let result = if due { flush(w) } else { Ok(()) };
        inner.bytes = w.committed;
        inner.counts.encoded += 1;
        if pic.sync {
            inner.counts.keyframes += 1;
        }
        if let Err(e) = result {
            return self.write_failed(inner, e);
        }
        if due {
            self.save_live(inner);
        }
        Verdict::Keep
    }

    fn tick(&self, now: Instant, tick: Tick) -> Verdict {
        let mut guard = self.lock();
        let inner = &mut *guard;
        if inner.state != RecordingState::Recording {
            return Verdict::Done;
        }
        let Some(t0) = inner.t0 else {
            return Verdict::Keep;
        };
        match tick {
            Tick::Encoded => {}
            Tick::Skipped => inner.counts.skipped += 1,
            Tick::Dropped(n) => inner.counts.dropped += n,
        }
        if self.max_duration.is_some_and(|m| now - t0 >= m) {
            drop(guard);
            self.finish("max_duration");
            return Verdict::Done;
        }
        let w = inner
            .writer
            .as_mut()
            .expect("live recordings have a writer");
        if !w.buffered.is_empty() && w.last_flush.elapsed() >= FRAGMENT_EVERY {
            if let Err(e) = flush(w) {
                let msg = format!("writing {}: {e}", self.path.display());
                self.failed(inner, msg);
                return Verdict::Done;
            }
            inner.bytes = w.committed;
            self.save_live(inner);
        }
        Verdict::Keep
    }

    fn fail(&self, error: &str) {
        let mut inner = self.lock();
        if inner.state == RecordingState::Recording {
            self.failed(&mut inner, error.to_string());
        }
    }
}

/// Holds `pic` back until the next picture tells its duration, moving the one held before
/// into the fragment being buffered; the first picture's provisional duration is settled on
/// the way. Whether the buffered fragment is due to be flushed.
fn queue_picture(w: &mut Writer, t0: Instant, pic: &Picture<'_>) -> std::io::Result<bool> {
    let mut pts = ticks(pic.at.saturating_duration_since(t0));
    if w.provisional.is_some() {
        pts = pts.max(1);
        settle_first(w, pts)?;
    }
    if let Some((prev, data, sync)) = w.pending.take() {
        pts = pts.max(prev + 1);
        w.buffered_bytes += data.len();
        w.buffered.push(Sample {
            data,
            duration: (pts - prev).min(u32::MAX as u64) as u32,
            sync,
        });
    }
    w.pending = Some((pts, pic.data.to_vec(), pic.sync));
    Ok(w.last_flush.elapsed() >= FRAGMENT_EVERY || w.buffered_bytes >= FRAGMENT_BYTES)
}

/// Writes the buffered pictures as one fragment.
fn flush(w: &mut Writer) -> std::io::Result<()> {
    w.last_flush = Instant::now();
    if w.buffered.is_empty() {
        return Ok(());
    }
    let frag = mp4::fragment(w.sequence, w.decode, &w.buffered);
    if let Err(e) = (&*w.file).write_all(&frag) {
        let _ = w.file.set_len(w.committed);
        return Err(e);
    }
    w.committed += frag.len() as u64;
    w.sequence += 1;
    w.decode += w.buffered.iter().map(|s| s.duration as u64).sum::<u64>();
    w.buffered.clear();
    w.buffered_bytes = 0;
    w.sync_soon();
    Ok(())
}

/// The first picture lasts until `end` (90 kHz): its provisional duration is overwritten in
/// place, and the next fragment starts there.
fn settle_first(w: &mut Writer, end: u64) -> std::io::Result<()> {
    let Some(at) = w.provisional.take() else {
        return Ok(());
    };
    let duration = end.clamp(1, u32::MAX as u64);
    w.file.write_all_at(&(duration as u32).to_be_bytes(), at)?;
    w.decode = duration;
    Ok(())
}

/// The recording's own thread that `fdatasync`s its file: a fragment survives a machine crash
/// too, not just the agent's, and the encoding thread never waits on the disk.
struct Syncer {
    /// One slot: a request made while one is queued is covered by that one's sync.
    tx: mpsc::SyncSender<()>,
}

impl Syncer {
    fn start(file: Arc<File>) -> Option<Syncer> {
        let (tx, rx) = mpsc::sync_channel::<()>(1);
        std::thread::Builder::new()
            .name("berth-rec-sync".into())
            .spawn(move || {
                // Ends when the writer (and its sender) is dropped.
                while rx.recv().is_ok() {
                    if let Err(e) = file.sync_data() {
                        tracing::warn!(error = %e, "recording: fdatasync failed");
                    }
                }
            })
            .map_err(|e| tracing::warn!(error = %e, "recording: no syncing thread"))
            .ok()?;
        Some(Syncer { tx })
    }
}

impl Writer {
    /// Asks for the file to be synced soon. A fragment is flushed at most about once a
    /// second, so this costs little.
    fn sync_soon(&self) {
        if let Some(s) = &self.syncer {
            let _ = s.tx.try_send(());
        }
    }
}

/// The last picture lasts until `end`; everything is written and the total duration goes
/// into the header.
fn close(w: &mut Writer, end: u64) -> std::io::Result<()> {
    settle_first(w, end)?;
    if let Some((pts, data, sync)) = w.pending.take() {
        w.buffered.push(Sample {
            data,
            duration: end.saturating_sub(pts).clamp(1, u32::MAX as u64) as u32,
            sync,
        });
    }
    flush(w)?;
    if let Some(at) = w.mehd_at {
        w.file
            .write_all_at(&mp4::mehd_duration(w.decode), at as u64)?;
    }
    Ok(())
}

/// Pictures per second over `duration_ms`, to two decimals.
fn per_second(n: u64, duration_ms: u64) -> f64 {
    if duration_ms > 0 {
        (n as f64 * 1000.0 / duration_ms as f64 * 100.0).round() / 100.0
    } else {
        0.0
    }
}

/// Writes a record atomically (a temporary file renamed over it); `durable` syncs the file and
/// the directory, so the record survives the machine too.
fn save_record(path: &Path, stored: &Stored, durable: bool) -> std::io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    let mut f = File::create(&tmp)?;
    f.write_all(&serde_json::to_vec_pretty(stored)?)?;
    if durable {
        f.sync_all()?;
    }
    drop(f);
    std::fs::rename(&tmp, path)?;
    if durable && let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// A recording left by an earlier agent: its record. One that was still running when its agent
/// died is rebuilt from its file (cut back to its last complete fragment), marked
/// interrupted and written back, so the next start reads it as it is.
pub fn load_record(record: &Path) -> Option<RecordingInfo> {
    let stored: Stored = serde_json::from_slice(&std::fs::read(record).ok()?).ok()?;
    if stored.info.state != RecordingState::Recording {
        return Some(stored.info);
    }
    let mp4 = record.with_extension("mp4");
    let contents = match settle_file(&mp4) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(file = %mp4.display(), error = %e, "cannot read an interrupted recording");
            mp4::Contents::default()
        }
    };
    let info = rebuilt(stored, &contents);
    let stored = Stored {
        info,
        first_frame_at: None,
    };
    if let Err(e) = save_record(record, &stored, true) {
        tracing::warn!(record = %record.display(), error = %e, "cannot save the rebuilt record");
    }
    Some(stored.info)
}

/// The record of a recording whose agent died, from what its file holds: pictures, keyframes,
/// bytes and length are the file's; it ended when its last picture did. Ticks skipped and
/// dropped are the last saved ones (saved with each fragment, so as of the file's end).
fn rebuilt(stored: Stored, contents: &mp4::Contents) -> RecordingInfo {
    let mut info = stored.info;
    info.state = RecordingState::Interrupted;
    info.end_reason = Some("agent_died".into());
    info.bytes = contents.len;
    info.frames_encoded = contents.samples;
    info.keyframes = contents.sync_samples;
    info.duration_ms = contents.duration * 1000 / TIMESCALE as u64;
    info.encoded_fps = per_second(info.frames_encoded, info.duration_ms);
    info.achieved_fps = per_second(info.frames_encoded + info.frames_skipped, info.duration_ms);
    let t0 = stored
        .first_frame_at
        .as_deref()
        .and_then(crate::time::parse_rfc3339)
        .or_else(|| crate::time::parse_rfc3339(&info.started_at));
    info.ended_at = t0.map(|t| crate::time::rfc3339(t + Duration::from_millis(info.duration_ms)));
    info
}

/// Cuts an interrupted recording's file back to its init segment and complete fragments and
/// writes its length into the header, as a finished recording's; what remains is returned.
fn settle_file(path: &Path) -> std::io::Result<mp4::Contents> {
    let file = match File::options().read(true).write(true).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(mp4::Contents::default()),
        Err(e) => return Err(e),
    };
    let contents = mp4::read_contents(&file)?;
    if file.metadata()?.len() != contents.len {
        file.set_len(contents.len)?;
    }
    if contents.fragments > 0
        && let Some(at) = contents.mehd_duration_offset
    {
        file.write_all_at(&mp4::mehd_duration(contents.duration), at)?;
    }
    file.sync_all()?;
    Ok(contents)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live_record(id: &str) -> Stored {
        Stored {
            info: RecordingInfo {
                id: id.into(),
                state: RecordingState::Recording,
                compat: false,
                width: 64,
                height: 48,
                fps: 10,
                bitrate_kbps: 1000,
                keyframe_interval_ms: 10_000,
                cursor: true,
                frames_encoded: 1,
                frames_skipped: 7,
                frames_dropped: 0,
                keyframes: 1,
                bytes: 0,
                duration_ms: 400,
                achieved_fps: 0.0,
                encoded_fps: 0.0,
                started_at: "2026-01-02T03:04:05.000Z".into(),
                ended_at: None,
                end_reason: None,
                error: None,
            },
            first_frame_at: Some("2026-01-02T03:04:05.250Z".into()),
        }
    }

    #[test]
    fn a_record_left_recording_is_rebuilt_from_its_file_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let track = mp4::TrackInfo {
            width: 64,
            height: 48,
            sps: vec![0x67, 0x42, 0xc0, 0x0a],
            pps: vec![0x68, 0xce],
        };
        let sample = |sync, duration| Sample {
            data: vec![0, 0, 0, 2, 0x65, 0x88],
            duration,
            sync,
        };
        let init = mp4::init_segment(&track, true);
        let mut bytes = init.bytes.clone();
        bytes.extend(mp4::fragment(1, 0, &[sample(true, 45_000)]));
        bytes.extend(mp4::fragment(
            2,
            45_000,
            &[sample(false, 9_000), sample(false, 90_000)],
        ));
        let whole = bytes.len() as u64;
        // A third fragment the kill tore.
        let torn = mp4::fragment(3, 144_000, &[sample(true, 9_000)]);
        bytes.extend(&torn[..torn.len() - 3]);
        std::fs::write(dir.path().join("r1.mp4"), &bytes).unwrap();
        let record = dir.path().join("r1.json");
        save_record(&record, &live_record("r1"), false).unwrap();

        let info = load_record(&record).unwrap();
        assert_eq!(info.state, RecordingState::Interrupted);
        assert_eq!(info.end_reason.as_deref(), Some("agent_died"));
        assert_eq!(info.frames_encoded, 3);
        assert_eq!(info.keyframes, 1);
        assert_eq!(info.duration_ms, 1600);
        assert_eq!(info.bytes, whole);
        assert_eq!(info.frames_skipped, 7);
        assert_eq!(info.encoded_fps, 1.88);
        assert_eq!(info.achieved_fps, 6.25);
        // The file's time 0 plus its length.
        assert_eq!(info.ended_at.as_deref(), Some("2026-01-02T03:04:06.850Z"));
        // The file: cut back to its complete fragments, its length in the header.
        let left = std::fs::read(dir.path().join("r1.mp4")).unwrap();
        let mut want = bytes[..whole as usize].to_vec();
        let at = init.mehd_duration_offset.unwrap();
        want[at..at + 8].copy_from_slice(&1600u64.to_be_bytes());
        assert_eq!(left, want);
        // Written back: the next start reads the same record and leaves the file alone.
        let on_disk: RecordingInfo =
            serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
        assert_eq!(on_disk, info);
        assert_eq!(load_record(&record).unwrap(), info);
        assert_eq!(std::fs::read(dir.path().join("r1.mp4")).unwrap(), left);
    }

    #[test]
    fn a_recording_killed_before_its_file_had_anything_is_empty_and_interrupted() {
        let dir = tempfile::tempdir().unwrap();
        // The init segment only partly written.
        let init = mp4::init_segment(
            &mp4::TrackInfo {
                width: 64,
                height: 48,
                sps: vec![0x67],
                pps: vec![0x68],
            },
            true,
        );
        std::fs::write(dir.path().join("r2.mp4"), &init.bytes[..40]).unwrap();
        let record = dir.path().join("r2.json");
        let mut stored = live_record("r2");
        stored.first_frame_at = None;
        save_record(&record, &stored, false).unwrap();
        let info = load_record(&record).unwrap();
        assert_eq!(info.state, RecordingState::Interrupted);
        assert_eq!(
            (info.frames_encoded, info.bytes, info.duration_ms),
            (0, 0, 0)
        );
        assert_eq!(info.ended_at.as_deref(), Some("2026-01-02T03:04:05.000Z"));
        assert_eq!(
            std::fs::metadata(dir.path().join("r2.mp4")).unwrap().len(),
            0
        );
        // No file at all reads the same.
        let record3 = dir.path().join("r3.json");
        save_record(&record3, &live_record("r3"), false).unwrap();
        assert_eq!(load_record(&record3).unwrap().frames_encoded, 0);
    }
}
