//! The judges of our MP4s: real `ffprobe` and `ffmpeg`, and a few ISO-BMFF box readers for
//! what they do not print (fragment boundaries, sample flags).

use std::path::Path;
use std::process::Command;

/// What ffprobe says about a file's video stream.
#[derive(Debug, Clone)]
pub struct Probe {
    pub codec: String,
    pub width: u32,
    pub height: u32,
    pub pix_fmt: String,
    /// The container's duration, seconds.
    pub duration: f64,
    /// Every decoded frame: (presentation time, picture type `I`/`P`).
    pub frames: Vec<(f64, String)>,
}

/// Runs ffprobe; panics with its stderr when it cannot read the file.
pub fn probe(path: &Path) -> Probe {
    let out = Command::new("ffprobe")
        .args([
            "-v",
            "error",
            "-of",
            "json",
            "-show_format",
            "-show_streams",
        ])
        .args(["-show_entries", "frame=pts_time,pict_type"])
        .args(["-show_frames"])
        .arg(path)
        .output()
        .expect("ffprobe (apt install ffmpeg)");
    assert!(
        out.status.success(),
        "ffprobe cannot read {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ffprobe JSON");
    let s = &v["streams"][0];
    let frames = v["frames"]
        .as_array()
        .map(|fs| {
            fs.iter()
                .map(|f| {
                    (
                        f["pts_time"]
                            .as_str()
                            .and_then(|t| t.parse().ok())
                            .unwrap_or(f64::NAN),
                        f["pict_type"].as_str().unwrap_or("?").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    Probe {
        codec: s["codec_name"].as_str().unwrap_or_default().to_string(),
        width: s["width"].as_u64().unwrap_or(0) as u32,
        height: s["height"].as_u64().unwrap_or(0) as u32,
        pix_fmt: s["pix_fmt"].as_str().unwrap_or_default().to_string(),
        duration: v["format"]["duration"]
            .as_str()
            .and_then(|d| d.parse().ok())
            .unwrap_or(0.0),
        frames,
    }
}

/// Decodes every frame (no frame-rate conversion) to RGB; also asserts ffmpeg reports no
/// decoding error at all.
pub fn decode_rgb(path: &Path, width: u32, height: u32) -> Vec<Vec<u8>> {
    let out = Command::new("ffmpeg")
        .args(["-v", "error", "-i"])
        .arg(path)
        .args([
            "-fps_mode",
            "passthrough",
            // The files' own 90 kHz clock: in the default 1/fps time base, two pictures of a
            // loaded recorder taken under one frame interval apart collide (ffmpeg errors).
            "-enc_time_base",
            "1:90000",
            "-f",
            "rawvideo",
            "-pix_fmt",
            "rgb24",
            "-",
        ])
        .output()
        .expect("ffmpeg (apt install ffmpeg)");
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "ffmpeg could not decode {} cleanly: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let frame = (width * height * 3) as usize;
    assert_eq!(out.stdout.len() % frame, 0, "a whole number of frames");
    out.stdout.chunks(frame).map(|c| c.to_vec()).collect()
}

/// The RGB pixel at (x, y) of a decoded frame.
pub fn rgb_at(frame: &[u8], width: u32, x: u32, y: u32) -> [u8; 3] {
    let i = ((y * width + x) * 3) as usize;
    [frame[i], frame[i + 1], frame[i + 2]]
}

/// Whether two colours match within a per-channel tolerance (compression moves them a bit).
pub fn near(a: [u8; 3], b: [u8; 3], tolerance: u8) -> bool {
    a.iter().zip(b).all(|(x, y)| x.abs_diff(y) <= tolerance)
}

/// Top-level boxes: (type, offset, size).
pub fn boxes(buf: &[u8]) -> Vec<([u8; 4], usize, usize)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 8 <= buf.len() {
        let size = u32::from_be_bytes(buf[at..at + 4].try_into().unwrap()) as usize;
        let kind: [u8; 4] = buf[at + 4..at + 8].try_into().unwrap();
        if size < 8 || at + size > buf.len() {
            break;
        }
        out.push((kind, at, size));
        at += size;
    }
    out
}

/// The first sample's flags in a `moof` (from its `trun`): whether it is a sync sample.
pub fn first_sample_is_sync(moof: &[u8]) -> bool {
    let trun = moof
        .windows(4)
        .position(|w| w == b"trun")
        .expect("a trun box");
    // trun: type, version/flags, sample count, data offset, then duration, size, flags.
    let at = trun + 4;
    let flags = u32::from_be_bytes(moof[at..at + 4].try_into().unwrap()) & 0xff_ffff;
    assert_eq!(flags & 0x701, 0x701, "duration, size and flags per sample");
    let first = at + 4 + 4 + 4 + 4 + 4;
    let sample_flags = u32::from_be_bytes(moof[first..first + 4].try_into().unwrap());
    sample_flags & 0x0001_0000 == 0
}
