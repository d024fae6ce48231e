//! The recording benchmark: a 1920x1080 XFCE desktop with continuous activity (a window
//! scrolling a page of text at 30 Hz), idle (only the text fields' carets blink) and fully
//! static (a full-screen page drawn once), recorded by berth (in-process openh264,
//! 15 fps, damage-aware) and by the peers' exact ffmpeg commands. CPU is the recorder
//! process's user + system time; the X server's share (both capture through MIT-SHM) is shown
//! beside it.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use berth_protocol::RecordingRequest;
use berth_tests::video::probe;
use berth_tests::{AgentOptions, AgentProcess, cpu_seconds};
use x11rb::connection::Connection;
use x11rb::protocol::xproto::{
    ConnectionExt as _, CreateGCAux, CreateWindowAux, ImageFormat, WindowClass,
};

use crate::desktop::Desktop;

const DOC_W: u16 = 800;
const DOC_H: u16 = 600;
const PAGE_H: usize = 2400;

/// A window scrolling a page of pseudo-text by 4 pixels a frame at 30 Hz until dropped.
struct Scroller {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Scroller {
    fn start(display: &str) -> Scroller {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let display = display.to_string();
        let thread = std::thread::spawn(move || {
            let (c, screen) = x11rb::connect(Some(&display)).expect("connect");
            let root = c.setup().roots[screen].root;
            let w = c.generate_id().unwrap();
            c.create_window(
                0,
                w,
                root,
                520,
                240,
                DOC_W,
                DOC_H,
                0,
                WindowClass::INPUT_OUTPUT,
                0,
                &CreateWindowAux::new()
                    .background_pixel(0xffffff)
                    .override_redirect(1),
            )
            .unwrap();
            c.map_window(w).unwrap();
            let gc = c.generate_id().unwrap();
            c.create_gc(gc, w, &CreateGCAux::new()).unwrap();
            let page = pseudo_text(DOC_W as usize, PAGE_H);
            let row = DOC_W as usize * 4;
            let mut offset = 0usize;
            let mut next = Instant::now();
            while !flag.load(Ordering::SeqCst) {
                let mut y = 0usize;
                while y < DOC_H as usize {
                    let rows = 64.min(DOC_H as usize - y);
                    let from = (offset + y) * row;
                    c.put_image(
                        ImageFormat::Z_PIXMAP,
                        w,
                        gc,
                        DOC_W,
                        rows as u16,
                        0,
                        y as i16,
                        0,
                        24,
                        &page[from..from + rows * row],
                    )
                    .unwrap();
                    y += rows;
                }
                c.get_input_focus().unwrap().reply().unwrap();
                offset = (offset + 4) % (PAGE_H - DOC_H as usize);
                next += Duration::from_millis(33);
                if let Some(wait) = next.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
            let _ = c.destroy_window(w);
            let _ = c.flush();
        });
        Scroller {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Scroller {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A full-screen window of pseudo-text drawn once: a screen where nothing changes at all
/// (the desktop under it has text fields whose carets blink).
struct Cover {
    c: x11rb::rust_connection::RustConnection,
    w: u32,
}

impl Cover {
    fn start(display: &str, width: u16, height: u16) -> Cover {
        let (c, screen) = x11rb::connect(Some(display)).expect("connect");
        let root = c.setup().roots[screen].root;
        let w = c.generate_id().unwrap();
        c.create_window(
            0,
            w,
            root,
            0,
            0,
            width,
            height,
            0,
            WindowClass::INPUT_OUTPUT,
            0,
            &CreateWindowAux::new()
                .background_pixel(0xffffff)
                .override_redirect(1),
        )
        .unwrap();
        c.map_window(w).unwrap();
        let gc = c.generate_id().unwrap();
        c.create_gc(gc, w, &CreateGCAux::new()).unwrap();
        let page = pseudo_text(width as usize, height as usize);
        let row = width as usize * 4;
        for y in (0..height as usize).step_by(32) {
            let rows = 32.min(height as usize - y);
            c.put_image(
                ImageFormat::Z_PIXMAP,
                w,
                gc,
                width,
                rows as u16,
                0,
                y as i16,
                0,
                24,
                &page[y * row..(y + rows) * row],
            )
            .unwrap();
        }
        c.get_input_focus().unwrap().reply().unwrap();
        Cover { c, w }
    }
}

impl Drop for Cover {
    fn drop(&mut self) {
        let _ = self.c.destroy_window(self.w);
        let _ = self.c.flush();
    }
}

/// Black "words" on white lines, BGRX.
fn pseudo_text(w: usize, h: usize) -> Vec<u8> {
    let mut img = vec![0xffu8; w * h * 4];
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rand = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for line in (8..h - 14).step_by(18) {
        let mut x = 16usize;
        while x < w - 80 {
            let word = 12 + rand(60) as usize;
            let shade = rand(90) as u8;
            for y in line..line + 11 {
                for px in x..(x + word).min(w - 16) {
                    // Glyph-like texture inside the word box.
                    if !(px + y + rand(3) as usize).is_multiple_of(3) {
                        let i = (y * w + px) * 4;
                        img[i..i + 3].copy_from_slice(&[shade, shade, shade]);
                    }
                }
            }
            x += word + 8;
        }
    }
    img
}

struct Run {
    cpu: f64,
    x_cpu: f64,
    seconds: f64,
    /// Looks at the screen per second: berth's ticks (a picture encoded, or skipped because
    /// nothing changed); ffmpeg's grabbed frames (output frames − duplicates + drops).
    sampled_fps: f64,
    /// Pictures through the encoder per second: berth's encoded pictures; every frame ffmpeg
    /// writes (libx264 encodes the duplicates too).
    encoded_fps: f64,
    dropped: u64,
    bytes: u64,
}

impl Run {
    fn percent(&self) -> f64 {
        self.cpu / self.seconds * 100.0
    }
}

async fn berth(a: &AgentProcess, x_pid: u32, seconds: u64) -> Run {
    let c = a.client();
    let (cpu0, x0) = (cpu_seconds(a.pid()), cpu_seconds(x_pid));
    let rec = c
        .start_recording(&RecordingRequest::default())
        .await
        .expect("start a recording");
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let info = c.stop_recording(&rec.id).await.expect("stop");
    let (cpu1, x1) = (cpu_seconds(a.pid()), cpu_seconds(x_pid));
    let path = a.dir.path().join(format!("{}.mp4", rec.id));
    std::fs::write(&path, c.recording_file(&rec.id).await.unwrap()).unwrap();
    let p = probe(&path);
    assert_eq!((p.width, p.height), (1920, 1080));
    c.delete_recording(&rec.id).await.unwrap();
    let _ = std::fs::remove_file(&path);
    Run {
        cpu: cpu1 - cpu0,
        x_cpu: x1 - x0,
        seconds: info.duration_ms as f64 / 1000.0,
        sampled_fps: info.achieved_fps,
        encoded_fps: info.encoded_fps,
        dropped: info.frames_dropped,
        bytes: info.bytes,
    }
}

/// Runs an ffmpeg recorder for `seconds`, stops it with SIGINT as OSWorld does, and takes its
/// CPU time from the kernel's accounting of the finished child.
fn ffmpeg(args: &[&str], x_pid: u32, seconds: u64, out: &std::path::Path) -> Run {
    let x0 = cpu_seconds(x_pid);
    let mut child: Child = Command::new("ffmpeg")
        .args(args)
        .arg(out)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ffmpeg (apt install ffmpeg)");
    // Drain stderr all along (the pipe must never fill) and keep the last progress line.
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut last = String::new();
        let mut r = BufReader::new(stderr);
        let mut buf = Vec::new();
        while r
            .read_until(b'\r', &mut buf)
            .map(|n| n > 0)
            .unwrap_or(false)
        {
            let text = String::from_utf8_lossy(&buf);
            for part in text.split('\n') {
                if part.contains("frame=") {
                    last = part.trim().to_string();
                }
            }
            buf.clear();
        }
        last
    });
    std::thread::sleep(Duration::from_secs(seconds));
    let children_cpu = || {
        // SAFETY: a zeroed rusage is a valid out-parameter.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: valid out-pointer; RUSAGE_CHILDREN covers children already waited for.
        unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
        let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        tv(usage.ru_utime) + tv(usage.ru_stime)
    };
    // Nothing else of this process is waited for meanwhile, so the growth of the waited
    // children's total is ffmpeg's own CPU time, its finishing work after SIGINT included.
    let before = children_cpu();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    child.wait().expect("wait for ffmpeg");
    let cpu = children_cpu() - before;
    let x1 = cpu_seconds(x_pid);
    let progress = reader.join().unwrap_or_default();
    let field = |name: &str| -> u64 {
        progress
            .split(name)
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let (frames, dup, drop) = (field("frame="), field("dup="), field("drop="));
    let p = probe(out);
    let bytes = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    let _ = std::fs::remove_file(out);
    Run {
        cpu,
        x_cpu: x1 - x0,
        seconds: p.duration,
        sampled_fps: (frames.saturating_sub(dup) + drop) as f64 / p.duration.max(0.001),
        encoded_fps: frames as f64 / p.duration.max(0.001),
        dropped: drop + dup,
        bytes,
    }
}

/// OSWorld's recording command (its arguments before the output file).
fn osworld_command<'a>(size: &'a str, display: &'a str) -> [&'a str; 13] {
    [
        "-y",
        "-f",
        "x11grab",
        "-draw_mouse",
        "1",
        "-s",
        size,
        "-i",
        display,
        "-c:v",
        "libx264",
        "-r",
        "30",
    ]
}

/// Daytona's recording command (its arguments before the output file).
fn daytona_command<'a>(size: &'a str, display: &'a str) -> [&'a str; 15] {
    [
        "-y",
        "-f",
        "x11grab",
        "-framerate",
        "30",
        "-s",
        size,
        "-i",
        display,
        "-c:v",
        "libx264",
        "-preset",
        "ultrafast",
        "-pix_fmt",
        "yuv420p",
    ]
}

/// The screens recorded, in order.
const SCREENS: [&str; 3] = [
    "continuous activity",
    "idle desktop, carets blinking",
    "static screen",
];

pub async fn bench(seconds: u64) {
    let desk = Desktop::start();
    let x = &desk.x;
    let a = AgentProcess::start_with(AgentOptions {
        extra_args: vec!["--display".into(), x.display.clone()],
        ..Default::default()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let size = format!("{}x{}", x.width, x.height);
    let osworld = osworld_command(&size, &x.display);
    let daytona = daytona_command(&size, &x.display);
    let out = a.dir.path().join("peer.mp4");
    let mut rows = Vec::new();
    for scenario in SCREENS {
        let scroller = (scenario == "continuous activity").then(|| Scroller::start(&x.display));
        let cover =
            (scenario == "static screen").then(|| Cover::start(&x.display, x.width, x.height));
        tokio::time::sleep(Duration::from_secs(2)).await;
        let ours = berth(&a, x.pid(), seconds).await;
        let xp = x.pid();
        let o = ffmpeg_blocking(&osworld, xp, seconds, &out).await;
        let d = ffmpeg_blocking(&daytona, xp, seconds, &out).await;
        drop(scroller);
        drop(cover);
        rows.push((scenario, ours, o, d));
    }
    print_table(seconds, &rows);
    print_targets(&rows);
}

/// [`ffmpeg`] on a blocking thread.
async fn ffmpeg_blocking(args: &[&str], x_pid: u32, seconds: u64, out: &Path) -> Run {
    let out = out.to_path_buf();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        ffmpeg(&args, x_pid, seconds, &out)
    })
    .await
    .unwrap()
}

/// Each screen's runs: berth's, OSWorld's and Daytona's, with their CPU relative to berth's.
fn print_table(seconds: u64, rows: &[(&str, Run, Run, Run)]) {
    println!();
    println!(
        "Recording a 1920x1080 XFCE desktop for {seconds} s (CPU: the recorder's own process; \
         X server: Xvfb's CPU during the run)"
    );
    println!(
        "| screen | recorder | CPU % of one core | CPU s per recorded minute | X server CPU % | screen samples per s | pictures encoded per s | dropped | MB per minute | CPU vs berth |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (scenario, ours, o, d) in rows {
        for (name, r) in [
            ("berth (openh264, 15 fps, damage-aware)", ours),
            ("OSWorld: `ffmpeg -f x11grab … -c:v libx264 -r 30`", o),
            ("Daytona: `… -framerate 30 … -preset ultrafast`", d),
        ] {
            println!(
                "| {scenario} | {name} | {:.1} | {:.2} | {:.1} | {:.1} | {:.1} | {} | {:.1} | {:.1}x |",
                r.percent(),
                r.cpu / r.seconds * 60.0,
                r.x_cpu / r.seconds * 100.0,
                r.sampled_fps,
                r.encoded_fps,
                r.dropped,
                r.bytes as f64 / r.seconds * 60.0 / 1e6,
                r.percent() / ours.percent().max(0.01),
            );
        }
    }
    println!();
    println!(
        "Screen samples per s: berth's ticks (a picture encoded, or skipped because nothing \
         changed); ffmpeg's grabbed frames (frames − dup + drop). Pictures encoded per s: \
         berth's encoded pictures; every frame ffmpeg writes (duplicates are encoded too). \
         Dropped: berth's missed ticks; ffmpeg's dup + drop."
    );
}

/// Whether berth meets issue 4's targets on these figures.
fn print_targets(rows: &[(&str, Run, Run, Run)]) {
    println!();
    println!("Targets (issue 4) against these figures:");
    let check = |ok: bool| if ok { "met" } else { "NOT met" };
    for (scenario, ours, o, _) in rows {
        let (limit, fps_target) = match *scenario {
            "continuous activity" => (35.0, true),
            "static screen" => (5.0, false),
            _ => continue,
        };
        println!(
            "- {scenario}: berth {:.1} % of one core (target ≤ {limit} %): {}",
            ours.percent(),
            check(ours.percent() <= limit)
        );
        if fps_target {
            println!(
                "- {scenario}: berth samples {:.1} per s (target 15 sustained): {}",
                ours.sampled_fps,
                check(ours.sampled_fps >= 14.8)
            );
            let ratio = o.percent() / ours.percent().max(0.01);
            println!(
                "- {scenario}: OSWorld's command uses {ratio:.1}x berth's CPU (target ≥ 3x): {}",
                check(ratio >= 3.0)
            );
        }
    }
    let dropped: u64 = rows.iter().map(|r| r.1.dropped).sum();
    println!(
        "- every screen: berth dropped {dropped} frames (target 0): {}",
        check(dropped == 0)
    );
}
