//! The record domain: the screen as H.264 in fragmented MP4, in-process. Recordings are files
//! under `<state>/recordings/` that play up to their last fragment even if the agent is
//! killed; live streams send the same fragments to viewers. Everything shares one capture,
//! and consumers with the same settings share one encoder.

pub mod file;
pub mod h264;
pub mod mp4;
pub mod pipeline;
pub mod source;
pub mod stream;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_protocol::sync::Locked;
use berth_protocol::{RecordingInfo, RecordingRequest, RecordingState};
use bytes::Bytes;
use tokio::sync::mpsc;

use crate::display::{Display, DisplayError};
use crate::events::EventLog;
use file::Recording;
use pipeline::{Pipeline, Settings, Sink};
use source::FrameSource;

pub const DEFAULT_FPS: u32 = 15;
pub const DEFAULT_BITRATE_KBPS: u32 = 4_000;
pub const DEFAULT_KEYFRAME_MS: u32 = 10_000;
/// Without a `scale`, the output fits in this box (never enlarged).
const DEFAULT_BOX: (u32, u32) = (1920, 1080);
/// openh264's limit (level 5.2).
const MAX_SIDE: (u32, u32) = (3840, 2160);
const MAX_LIVE_RECORDINGS: usize = 8;
const MAX_PIPELINES: usize = 4;
const MAX_STREAMS: usize = 16;
/// How long a stop waits for the screen's last picture.
const CATCH_UP: Duration = Duration::from_millis(500);
/// How long a start may wait for its first picture.
const FIRST_FRAME_WAIT: Duration = Duration::from_secs(15);

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error(transparent)]
    Display(#[from] DisplayError),
    #[error("{0}")]
    Invalid(String),
    #[error("no recording {0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Busy(String),
    #[error("{0}")]
    Failed(String),
    #[error("{0}")]
    DiskFull(String),
    #[error("{0}")]
    Io(String),
}

impl RecordError {
    fn io(what: &str, e: std::io::Error) -> RecordError {
        if e.raw_os_error() == Some(libc::ENOSPC) {
            RecordError::DiskFull(format!("{what}: {e}"))
        } else {
            RecordError::Io(format!("{what}: {e}"))
        }
    }
}

/// What a stream viewer asks for (the recording knobs that make sense live).
#[derive(Debug, Clone, Copy, Default)]
pub struct StreamRequest {
    pub fps: Option<u32>,
    pub scale: Option<f64>,
    pub bitrate_kbps: Option<u32>,
    pub cursor: Option<bool>,
}

#[derive(Default)]
struct Inner {
    pipelines: Vec<Arc<Pipeline>>,
    /// Recordings of this agent, live or ended.
    recordings: HashMap<String, Arc<Recording>>,
    /// Recordings earlier agents left (ended; their records read back).
    past: HashMap<String, RecordingInfo>,
    /// The recording `/start_recording` made, until `/end_recording`.
    compat: Option<String>,
}

pub struct Recorder {
    dir: PathBuf,
    events: Arc<EventLog>,
    source: Option<Arc<FrameSource>>,
    inner: Mutex<Inner>,
    streams: Arc<AtomicUsize>,
    /// Held through a whole `/start_recording` or `/end_recording`: the "already recording"
    /// check and the start it guards are one step, so of two concurrent starts one answers
    /// 400.
    compat_op: tokio::sync::Mutex<()>,
}

/// Holds a stream's place in the stream limit while it is being served.
pub struct StreamGuard(Arc<AtomicUsize>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The id a recording request asks for, checked, or a new one.
fn recording_id(id: Option<String>) -> Result<String, RecordError> {
    match id {
        Some(id) if !valid_id(&id) => Err(RecordError::Invalid(format!(
            "id {id:?} must be 1-128 characters of A-Z a-z 0-9 _ - . (not starting with .)"
        ))),
        Some(id) => Ok(id),
        None => Ok(new_id()),
    }
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

fn new_id() -> String {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).expect("OS randomness");
    format!(
        "rec_{}",
        b.iter().map(|x| format!("{x:02x}")).collect::<String>()
    )
}

impl Recorder {
    /// Opens `<state>/recordings`, reading back what earlier agents recorded.
    pub fn open(
        display: &Display,
        state_dir: &Path,
        events: Arc<EventLog>,
    ) -> std::io::Result<Arc<Recorder>> {
        let dir = state_dir.join("recordings");
        std::fs::create_dir_all(&dir)?;
        let mut past = HashMap::new();
        for entry in std::fs::read_dir(&dir)?.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "json")
                && let Some(info) = file::load_record(&path)
                && valid_id(&info.id)
                && path.file_stem().is_some_and(|s| *s == *info.id)
            {
                past.insert(info.id.clone(), info);
            }
        }
        let source = display
            .target_for_recording()
            .map(|(t, w)| Arc::new(FrameSource::new(t, w)));
        if source.is_some() {
            tracing::info!(kernels = %h264::kernels(), "H.264 encoder (openh264)");
        }
        Ok(Arc::new(Recorder {
            dir,
            events,
            source,
            inner: Mutex::new(Inner {
                past,
                ..Inner::default()
            }),
            streams: Arc::new(AtomicUsize::new(0)),
            compat_op: tokio::sync::Mutex::new(()),
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.locked()
    }

    fn source(&self) -> Result<&Arc<FrameSource>, RecordError> {
        self.source
            .as_ref()
            .ok_or(RecordError::Display(DisplayError::NoDisplay))
    }

    /// Validates the knobs and works out the encoder's size from the screen's.
    async fn settings(
        &self,
        fps: Option<u32>,
        scale: Option<f64>,
        bitrate_kbps: Option<u32>,
        keyframe_interval_ms: Option<u32>,
        cursor: Option<bool>,
    ) -> Result<Settings, RecordError> {
        let fps = fps.unwrap_or(DEFAULT_FPS);
        if !(1..=60).contains(&fps) {
            return Err(RecordError::Invalid(format!("fps must be 1-60, not {fps}")));
        }
        let bitrate_kbps = bitrate_kbps.unwrap_or(DEFAULT_BITRATE_KBPS);
        if !(100..=50_000).contains(&bitrate_kbps) {
            return Err(RecordError::Invalid(format!(
                "bitrate_kbps must be 100-50000, not {bitrate_kbps}"
            )));
        }
        let keyframe_interval_ms = keyframe_interval_ms.unwrap_or(DEFAULT_KEYFRAME_MS);
        if !(1_000..=60_000).contains(&keyframe_interval_ms) {
            return Err(RecordError::Invalid(format!(
                "keyframe_interval_ms must be 1000-60000, not {keyframe_interval_ms}"
            )));
        }
        if let Some(s) = scale
            && !(s > 0.0 && s <= 1.0)
        {
            return Err(RecordError::Invalid(format!(
                "scale must be in (0, 1], not {s}"
            )));
        }
        let source = self.source()?.clone();
        let (sw, sh) = tokio::task::spawn_blocking(move || source.screen_size())
            .await
            .map_err(|e| RecordError::Io(e.to_string()))??;
        let scale = scale.unwrap_or_else(|| {
            (DEFAULT_BOX.0 as f64 / sw as f64)
                .min(DEFAULT_BOX.1 as f64 / sh as f64)
                .min(1.0)
        });
        // Even sides (4:2:0 chroma); an odd screen loses its last column or row.
        let even = |v: f64| ((v.floor() as u32) & !1).max(2);
        let (width, height) = (even(sw as f64 * scale), even(sh as f64 * scale));
        if width < 16 || height < 16 {
            return Err(RecordError::Invalid(format!(
                "scale {scale} makes the {sw}x{sh} screen {width}x{height}; the least is 16x16"
            )));
        }
        if width.max(height) > MAX_SIDE.0 || width.min(height) > MAX_SIDE.1 {
            return Err(RecordError::Invalid(format!(
                "{width}x{height} is larger than H.264 level 5.2 allows (3840x2160); pass a scale"
            )));
        }
        // Past about 4 bits a pixel nothing gets sharper, and openh264's per-frame buffers
        // overflow on hard content (seen: noise at 320x240, 30 fps, 20 Mbit/s).
        let ceiling = (width as u64 * height as u64 * fps as u64 * 4 / 1000).max(100) as u32;
        let bitrate_kbps = bitrate_kbps.min(ceiling);
        Ok(Settings {
            width,
            height,
            fps,
            bitrate_kbps,
            keyframe_interval_ms,
            cursor: cursor.unwrap_or(true),
        })
    }

    /// Adds a consumer to the pipeline with its settings, starting one when none runs.
    fn attach(&self, settings: Settings, sink: Arc<dyn Sink>) -> Result<(), RecordError> {
        let source = self.source()?.clone();
        let mut inner = self.lock();
        inner.pipelines.retain(|p| !p.is_closed());
        if let Some(p) = inner.pipelines.iter().find(|p| p.settings == settings)
            && p.add(sink.clone())
        {
            return Ok(());
        }
        if inner.pipelines.len() >= MAX_PIPELINES {
            return Err(RecordError::Busy(format!(
                "{MAX_PIPELINES} encoders are running already; reuse the settings of a running \
                 recording or stream"
            )));
        }
        let p = Pipeline::start(settings, source, sink)
            .map_err(|e| RecordError::Io(format!("starting the encoder thread: {e}")))?;
        inner.pipelines.push(p);
        Ok(())
    }

    /// Starts a recording and answers once its first picture is in the file.
    pub async fn start(
        &self,
        req: RecordingRequest,
        compat: bool,
    ) -> Result<Arc<Recording>, RecordError> {
        let id = recording_id(req.id)?;
        if req.max_duration_ms == Some(0) {
            return Err(RecordError::Invalid(
                "max_duration_ms must be above 0".into(),
            ));
        }
        let settings = self
            .settings(
                req.fps,
                req.scale,
                req.bitrate_kbps,
                req.keyframe_interval_ms,
                req.cursor,
            )
            .await?;
        let max_duration = req.max_duration_ms.map(Duration::from_millis);
        let rec = self.register(&id, compat, settings, max_duration)?;
        if let Err(e) = self.attach_until_started(settings, &rec).await {
            // A start that failed leaves nothing behind.
            let rec2 = rec.clone();
            let _ = tokio::task::spawn_blocking(move || {
                rec2.finish("start_failed");
                rec2.delete_files();
            })
            .await;
            self.lock().recordings.remove(&id);
            return Err(e);
        }
        Ok(rec)
    }

    /// Creates the recording `id` and its file and lists it, unless the id is taken or
    /// [`MAX_LIVE_RECORDINGS`] run already.
    fn register(
        &self,
        id: &str,
        compat: bool,
        settings: Settings,
        max_duration: Option<Duration>,
    ) -> Result<Arc<Recording>, RecordError> {
        let mut inner = self.lock();
        if inner.recordings.contains_key(id) || inner.past.contains_key(id) {
            return Err(RecordError::Conflict(format!("recording {id} exists")));
        }
        let live = inner.recordings.values().filter(|r| r.is_live()).count();
        if live >= MAX_LIVE_RECORDINGS {
            return Err(RecordError::Busy(format!(
                "{MAX_LIVE_RECORDINGS} recordings are running already"
            )));
        }
        let rec = Recording::create(
            &self.dir,
            id.to_string(),
            compat,
            settings,
            max_duration,
            self.events.clone(),
        )
        .map_err(|e| RecordError::io("creating the recording file", e))?;
        inner.recordings.insert(id.to_string(), rec.clone());
        Ok(rec)
    }

    /// Attaches `rec` to a pipeline and waits, at most [`FIRST_FRAME_WAIT`], until its first
    /// picture is in the file or it failed.
    async fn attach_until_started(
        &self,
        settings: Settings,
        rec: &Arc<Recording>,
    ) -> Result<(), RecordError> {
        let mut started = rec.started();
        self.attach(settings, rec.clone())?;
        match tokio::time::timeout(FIRST_FRAME_WAIT, started.wait_for(Option::is_some)).await {
            Ok(Ok(r)) => match r.clone() {
                Some(Ok(())) => Ok(()),
                Some(Err(e)) if e.contains("No space left") => Err(RecordError::DiskFull(e)),
                Some(Err(e)) => Err(RecordError::Failed(e)),
                None => unreachable!("waited for Some"),
            },
            Ok(Err(_)) => Err(RecordError::Failed("the recorder went away".into())),
            Err(_) => Err(RecordError::Failed(format!(
                "no frame was encoded within {}s",
                FIRST_FRAME_WAIT.as_secs()
            ))),
        }
    }

    pub fn list(&self) -> Vec<RecordingInfo> {
        let inner = self.lock();
        let mut all: Vec<RecordingInfo> = inner
            .recordings
            .values()
            .map(|r| r.info())
            .chain(inner.past.values().cloned())
            .collect();
        all.sort_by(|a, b| a.started_at.cmp(&b.started_at).then(a.id.cmp(&b.id)));
        all
    }

    pub fn get(&self, id: &str) -> Result<RecordingInfo, RecordError> {
        let inner = self.lock();
        if let Some(r) = inner.recordings.get(id) {
            return Ok(r.info());
        }
        inner
            .past
            .get(id)
            .cloned()
            .ok_or_else(|| RecordError::NotFound(id.to_string()))
    }

    /// Stops a live recording; a recording that already ended is a conflict.
    pub async fn stop(&self, id: &str) -> Result<RecordingInfo, RecordError> {
        let rec = {
            let inner = self.lock();
            match inner.recordings.get(id) {
                Some(r) => r.clone(),
                None if inner.past.contains_key(id) => {
                    return Err(RecordError::Conflict(format!(
                        "recording {id} already ended"
                    )));
                }
                None => return Err(RecordError::NotFound(id.to_string())),
            }
        };
        if !rec.is_live() {
            let info = rec.info();
            return Err(RecordError::Conflict(format!(
                "recording {id} already ended ({})",
                info.end_reason.unwrap_or_else(|| "stopped".into())
            )));
        }
        let pipeline = self.pipeline_of(&rec);
        let info = tokio::task::spawn_blocking(move || {
            if let Some(p) = pipeline {
                p.catch_up(CATCH_UP);
            }
            rec.finish("stopped")
        })
        .await
        .map_err(|e| RecordError::Io(e.to_string()))?;
        Ok(info)
    }

    /// The running pipeline a recording is fed by.
    fn pipeline_of(&self, rec: &Recording) -> Option<Arc<Pipeline>> {
        self.lock()
            .pipelines
            .iter()
            .find(|p| p.settings == rec.settings && !p.is_closed())
            .cloned()
    }

    /// Stops (if live) and removes a recording and its file.
    pub async fn delete(&self, id: &str) -> Result<(), RecordError> {
        let (rec, past) = {
            let mut inner = self.lock();
            let rec = inner.recordings.remove(id);
            let past = inner.past.remove(id);
            if inner.compat.as_deref() == Some(id) {
                inner.compat = None;
            }
            (rec, past)
        };
        match (rec, past) {
            (Some(rec), _) => {
                tokio::task::spawn_blocking(move || {
                    rec.finish("deleted");
                    rec.delete_files();
                })
                .await
                .map_err(|e| RecordError::Io(e.to_string()))?;
                Ok(())
            }
            (None, Some(_)) => {
                let _ = std::fs::remove_file(self.dir.join(format!("{id}.mp4")));
                let _ = std::fs::remove_file(self.dir.join(format!("{id}.json")));
                Ok(())
            }
            (None, None) => Err(RecordError::NotFound(id.to_string())),
        }
    }

    /// The file and how much of it is complete (all of it once the recording ended).
    pub fn file(&self, id: &str) -> Result<(PathBuf, u64), RecordError> {
        let inner = self.lock();
        if let Some(r) = inner.recordings.get(id) {
            return Ok((r.path.clone(), r.committed_len()));
        }
        if let Some(info) = inner.past.get(id) {
            return Ok((self.dir.join(format!("{id}.mp4")), info.bytes));
        }
        Err(RecordError::NotFound(id.to_string()))
    }

    /// A live stream: the receiver yields the init segment, then one fragment per picture.
    pub async fn stream(
        &self,
        req: StreamRequest,
    ) -> Result<(mpsc::Receiver<Bytes>, StreamGuard), RecordError> {
        let settings = self
            .settings(req.fps, req.scale, req.bitrate_kbps, None, req.cursor)
            .await?;
        if self.streams.fetch_add(1, Ordering::SeqCst) >= MAX_STREAMS {
            self.streams.fetch_sub(1, Ordering::SeqCst);
            return Err(RecordError::Busy(format!(
                "{MAX_STREAMS} live streams are open already"
            )));
        }
        let guard = StreamGuard(self.streams.clone());
        let (sink, rx) = stream::StreamSink::new(settings.fps);
        self.attach(settings, Arc::new(sink))?;
        Ok((rx, guard))
    }

    /// `/start_recording`: one recording at a time, replacing the previous compat file.
    pub async fn compat_start(&self) -> Result<(), CompatError> {
        let _op = self.compat_op.lock().await;
        let previous = {
            let inner = self.lock();
            match inner.compat.as_ref() {
                Some(id) if inner.recordings.get(id).is_some_and(|r| r.is_live()) => {
                    return Err(CompatError::AlreadyRecording);
                }
                other => other.cloned(),
            }
        };
        if let Some(id) = previous {
            let _ = self.delete(&id).await;
        }
        let rec = self
            .start(RecordingRequest::default(), true)
            .await
            .map_err(CompatError::Failed)?;
        self.lock().compat = Some(rec.id.clone());
        Ok(())
    }

    /// `/end_recording`: stops the compat recording and returns its file.
    pub async fn compat_end(&self) -> Result<(PathBuf, RecordingInfo), CompatError> {
        let _op = self.compat_op.lock().await;
        let rec = {
            let inner = self.lock();
            match inner
                .compat
                .as_ref()
                .and_then(|id| inner.recordings.get(id))
            {
                Some(r) if r.is_live() => r.clone(),
                _ => return Err(CompatError::NotRecording),
            }
        };
        let path = rec.path.clone();
        let pipeline = self.pipeline_of(&rec);
        let info = tokio::task::spawn_blocking(move || {
            if let Some(p) = pipeline {
                p.catch_up(CATCH_UP);
            }
            rec.finish("stopped")
        })
        .await
        .map_err(|e| CompatError::Failed(RecordError::Io(e.to_string())))?;
        Ok((path, info))
    }

    /// The agent is leaving: every recording is finished properly and the encoders stop.
    pub fn shutdown(&self) {
        let (recs, pipes) = {
            let inner = self.lock();
            (
                inner.recordings.values().cloned().collect::<Vec<_>>(),
                inner.pipelines.clone(),
            )
        };
        for r in recs {
            if r.is_live() {
                r.finish("shutdown");
            }
        }
        for p in pipes {
            p.shut();
        }
        if let Some(s) = &self.source {
            s.idle();
        }
    }

    /// The media clock of every live file recording at `at`: each recording's id and the
    /// media time (ms) at which its file shows the screen of that moment (see
    /// [`Recording::media_ms_at`]), ordered by id.
    pub fn media_times(&self, at: std::time::Instant) -> Vec<(String, u64)> {
        let recs: Vec<Arc<Recording>> = self.lock().recordings.values().cloned().collect();
        let mut out: Vec<(String, u64)> = recs
            .iter()
            .filter_map(|r| r.media_ms_at(at).map(|m| (r.id.clone(), m)))
            .collect();
        out.sort();
        out
    }

    pub fn live_count(&self) -> usize {
        self.lock()
            .recordings
            .values()
            .filter(|r| r.info().state == RecordingState::Recording)
            .count()
    }
}

#[derive(Debug)]
pub enum CompatError {
    AlreadyRecording,
    NotRecording,
    Failed(RecordError),
}
