//! Recording and live streams against a real X server, judged by real ffprobe and ffmpeg:
//! what was drawn is what decodes, at the right size and times; a SIGKILL or a full disk
//! leaves a playable file; streams start at a keyframe; consumers share capture and encoders.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use berth_protocol::{RecordingInfo, RecordingRequest, RecordingState, ViewerTokenRequest};
use berth_tests::video::{boxes, decode_rgb, first_sample_is_sync, near, probe, rgb_at};
use berth_tests::x::{XServer, paint_noise, recolour, solid_window};
use berth_tests::{AgentOptions, AgentProcess, wait_for};
use futures_util::StreamExt;
use serde_json::{Value, json};
use x11rb::protocol::xproto::EventMask;

const RED: u32 = 0xdd2222;
const GREEN: u32 = 0x22bb22;
const BLUE: u32 = 0x2233dd;

fn rgb(c: u32) -> [u8; 3] {
    [(c >> 16) as u8, (c >> 8) as u8, c as u8]
}

async fn agent_on(x: &XServer) -> AgentProcess {
    AgentProcess::start_with(AgentOptions {
        extra_args: vec!["--display".into(), x.display.clone()],
        ..Default::default()
    })
    .await
}

async fn post(a: &AgentProcess, path: &str, body: Value) -> reqwest::Response {
    a.client()
        .request(reqwest::Method::POST, path)
        .json(&body)
        .send()
        .await
        .unwrap()
}

async fn save_file(a: &AgentProcess, id: &str, name: &str) -> PathBuf {
    let bytes = a.client().recording_file(id).await.unwrap();
    let path = a.dir.path().join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

async fn wait_ended(a: &AgentProcess, id: &str) -> RecordingInfo {
    let c = a.client();
    wait_for("the recording to end", Duration::from_secs(20), || {
        let c = c.clone();
        async move {
            let info = c.recording(id).await.ok()?;
            (info.state != RecordingState::Recording).then_some(info)
        }
    })
    .await
}

/// Encoder threads of the agent (one per distinct set of recording settings).
fn encoder_threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.trim() == "berth-record")
                })
                .count()
        })
        .unwrap_or(0)
}

#[tokio::test]
async fn a_recorded_animation_decodes_with_its_size_times_and_colours() {
    let x = XServer::start(640, 480);
    let (c, w) = solid_window(&x, (0, 0, 640, 480), RED, EventMask::NO_EVENT);
    let a = agent_on(&x).await;
    let client = a.client();
    let before_start = Instant::now();
    let rec = client
        .start_recording(&RecordingRequest {
            fps: Some(15),
            cursor: Some(false),
            ..Default::default()
        })
        .await
        .unwrap();
    let started = Instant::now();
    // "Started" means the first frame is in the file already.
    assert_eq!(rec.state, RecordingState::Recording);
    assert_eq!((rec.width, rec.height), (640, 480));
    assert!(rec.frames_encoded >= 1 && rec.keyframes >= 1, "{rec:?}");

    // The animation: red, then green for one second, then blue for one second.
    let t_green = started + Duration::from_millis(700);
    tokio::time::sleep_until(t_green.into()).await;
    recolour(&c, w, GREEN);
    let t_blue = t_green + Duration::from_secs(1);
    tokio::time::sleep_until(t_blue.into()).await;
    recolour(&c, w, BLUE);
    let t_stop = t_blue + Duration::from_secs(1);
    tokio::time::sleep_until(t_stop.into()).await;
    let stop_sent = Instant::now();
    let info = client.stop_recording(&rec.id).await.unwrap();
    let stopped = Instant::now();
    assert_eq!(info.state, RecordingState::Stopped);
    assert_eq!(info.end_reason.as_deref(), Some("stopped"));
    assert_eq!(info.frames_dropped, 0, "{info:?}");

    let path = save_file(&a, &rec.id, "anim.mp4").await;
    let p = probe(&path);
    assert_eq!(p.codec, "h264");
    assert_eq!((p.width, p.height), (640, 480));
    assert_eq!(p.pix_fmt, "yuv420p");
    let interval = 1.0 / 15.0;
    // The file's duration is the recording's, to within one frame interval, and it is the
    // wall-clock time between the first frame and the stop.
    assert!(
        (p.duration - info.duration_ms as f64 / 1000.0).abs() <= interval,
        "ffprobe {} s vs {} ms",
        p.duration,
        info.duration_ms
    );
    let shortest = (stop_sent - started).as_secs_f64() - interval;
    let longest = (stopped - before_start).as_secs_f64() + interval;
    assert!(
        p.duration >= shortest && p.duration <= longest,
        "duration {} outside [{shortest}, {longest}]",
        p.duration
    );
    assert_eq!(p.frames.first().map(|f| f.1.as_str()), Some("I"));

    // Content: the colour of each decoded frame, in order, with its time.
    let frames = decode_rgb(&path, 640, 480);
    assert_eq!(frames.len(), p.frames.len());
    let colour_of = |f: &[u8]| {
        let px = rgb_at(f, 640, 320, 240);
        [RED, GREEN, BLUE]
            .into_iter()
            .find(|&c| near(px, rgb(c), 24))
            .unwrap_or_else(|| panic!("frame colour {px:?} is none of those drawn"))
    };
    let timeline: Vec<(f64, u32)> = p
        .frames
        .iter()
        .zip(&frames)
        .map(|((t, _), f)| (*t, colour_of(f)))
        .collect();
    let mut runs: Vec<(u32, f64)> = Vec::new();
    for &(t, c) in &timeline {
        if runs.last().is_none_or(|r| r.0 != c) {
            runs.push((c, t));
        }
    }
    let order: Vec<u32> = runs.iter().map(|r| r.0).collect();
    assert_eq!(order, vec![RED, GREEN, BLUE], "{timeline:?}");
    // Green lasted one second on screen and lasts one second in the video (a change is
    // picked up at the next tick, so each edge may move by up to one interval).
    let green_len = runs[2].1 - runs[1].1;
    assert!(
        (green_len - 1.0).abs() <= interval + 0.02,
        "green lasted {green_len} s: {timeline:?}"
    );
    // Blue lasts until the stop.
    let blue_len = p.duration - runs[2].1;
    let blue_wall = (stop_sent - t_blue).as_secs_f64();
    assert!(
        (blue_len - blue_wall).abs() <= interval + 0.05,
        "blue lasted {blue_len} s in the file vs {blue_wall} s on screen"
    );

    // Both ends are on the timeline, the end with its statistics.
    let events = client.events(0).await.unwrap().events;
    let started_ev = events
        .iter()
        .find(|e| e.kind == "recording.started" && e.data["id"] == rec.id.as_str())
        .expect("recording.started");
    assert_eq!(started_ev.data["width"], 640);
    let stopped_ev = events
        .iter()
        .find(|e| e.kind == "recording.stopped" && e.data["id"] == rec.id.as_str())
        .expect("recording.stopped");
    assert_eq!(stopped_ev.data["frames_encoded"], info.frames_encoded);
    assert_eq!(stopped_ev.data["bytes"], info.bytes);
    assert_eq!(stopped_ev.data["reason"], "stopped");
    drop(c);
}

#[tokio::test]
async fn a_still_screen_costs_almost_no_frames_and_keeps_true_time() {
    let x = XServer::start(320, 240);
    let _win = solid_window(&x, (0, 0, 320, 240), GREEN, EventMask::NO_EVENT);
    let a = agent_on(&x).await;
    let client = a.client();
    let rec = client
        .start_recording(&RecordingRequest {
            fps: Some(30),
            ..Default::default()
        })
        .await
        .unwrap();
    let info = wait_for(
        "three seconds of a still screen",
        Duration::from_secs(10),
        || {
            let c = client.clone();
            let id = rec.id.clone();
            async move {
                let i = c.recording(&id).await.ok()?;
                (i.duration_ms >= 3000).then_some(i)
            }
        },
    )
    .await;
    // Ninety ticks, of which only the first picture and once-a-second refreshes were encoded.
    assert!(info.frames_encoded <= 6, "{info:?}");
    assert!(info.frames_skipped >= 75, "{info:?}");
    let info = client.stop_recording(&rec.id).await.unwrap();
    let path = save_file(&a, &rec.id, "still.mp4").await;
    let p = probe(&path);
    assert!(
        (p.duration - info.duration_ms as f64 / 1000.0).abs() <= 1.0 / 30.0,
        "{} vs {}",
        p.duration,
        info.duration_ms
    );
    assert!(
        p.frames.len() as u64 == info.frames_encoded,
        "{p:?} {info:?}"
    );
    decode_rgb(&path, 320, 240);
}

#[tokio::test]
async fn sigkill_mid_recording_leaves_a_file_with_every_fragment_written() {
    let x = XServer::start(320, 240);
    let (c, w) = solid_window(&x, (0, 0, 320, 240), RED, EventMask::NO_EVENT);
    let mut a = agent_on(&x).await;
    let client = a.client();
    let rec = client
        .start_recording(&RecordingRequest {
            fps: Some(20),
            ..Default::default()
        })
        .await
        .unwrap();
    let file = a
        .state_dir
        .join("recordings")
        .join(format!("{}.mp4", rec.id));
    // Keep the screen busy until at least three fragments are in the file.
    let mut seed = 0;
    let committed = loop {
        seed += 1;
        paint_noise(&c, w, 320, 240, seed);
        tokio::time::sleep(Duration::from_millis(40)).await;
        let info = client.recording(&rec.id).await.unwrap();
        let data = std::fs::read(&file).unwrap();
        let fragments = boxes(&data[..info.bytes as usize])
            .iter()
            .filter(|b| &b.0 == b"moof")
            .count();
        if fragments >= 3 {
            break data[..info.bytes as usize].to_vec();
        }
        assert!(seed < 500, "no three fragments after {seed} paints");
    };
    let before = a.dir.path().join("before-kill.mp4");
    std::fs::write(&before, &committed).unwrap();
    let frames_before = probe(&before).frames.len();
    assert!(frames_before >= 2);

    a.kill9();
    // The file as the killed agent left it plays, with every frame it had written.
    let left = probe(&file);
    assert_eq!((left.width, left.height), (320, 240));
    assert!(
        left.frames.len() >= frames_before,
        "{} frames after the kill, {frames_before} before",
        left.frames.len()
    );

    // The next agent reports it interrupted, trimmed to complete boxes, and serves it.
    a.launch().await;
    let info = a.client().recording(&rec.id).await.unwrap();
    assert_eq!(info.state, RecordingState::Interrupted);
    assert_eq!(info.end_reason.as_deref(), Some("agent_died"));
    assert!(info.bytes >= committed.len() as u64);
    let served = save_file(&a, &rec.id, "after.mp4").await;
    let after = probe(&served);
    assert!(after.frames.len() >= frames_before);
    decode_rgb(&served, 320, 240);
    let err = a.client().stop_recording(&rec.id).await.unwrap_err();
    assert_eq!(err.status(), Some(409), "{err}");
}

#[tokio::test]
async fn a_recording_killed_right_after_its_start_holds_its_first_frame() {
    let x = XServer::start(320, 240);
    let _win = solid_window(&x, (0, 0, 320, 240), GREEN, EventMask::NO_EVENT);
    let mut a = agent_on(&x).await;
    let rec = a
        .client()
        .start_recording(&RecordingRequest::default())
        .await
        .unwrap();
    // No time for a second picture or a timed flush: the start's own picture must be there.
    a.kill9();
    let file = a
        .state_dir
        .join("recordings")
        .join(format!("{}.mp4", rec.id));
    let p = probe(&file);
    assert_eq!((p.width, p.height), (320, 240));
    assert!(!p.frames.is_empty(), "{p:?}");
    assert_eq!(p.frames[0].1, "I");
    let frames = decode_rgb(&file, 320, 240);
    assert!(near(rgb_at(&frames[0], 320, 40, 40), rgb(GREEN), 24));
}

#[tokio::test]
async fn a_restart_finishes_recordings_properly() {
    let x = XServer::start(320, 240);
    let _win = solid_window(&x, (0, 0, 320, 240), BLUE, EventMask::NO_EVENT);
    let mut a = agent_on(&x).await;
    let rec = a
        .client()
        .start_recording(&RecordingRequest::default())
        .await
        .unwrap();
    a.signal(nix::sys::signal::Signal::SIGTERM);
    a.wait_exit(Duration::from_secs(20));
    a.launch().await;
    let info = a.client().recording(&rec.id).await.unwrap();
    assert_eq!(info.state, RecordingState::Stopped);
    assert_eq!(info.end_reason.as_deref(), Some("shutdown"));
    let path = save_file(&a, &rec.id, "restart.mp4").await;
    let p = probe(&path);
    assert!((p.duration - info.duration_ms as f64 / 1000.0).abs() <= 1.0 / 15.0);
    decode_rgb(&path, 320, 240);
}

#[tokio::test]
async fn bad_recording_requests_are_clear_4xx() {
    let x = XServer::start(320, 240);
    let a = agent_on(&x).await;
    let client = a.client();
    for (body, needle) in [
        (json!({"fps": 0}), "fps"),
        (json!({"fps": 500}), "fps"),
        (json!({"scale": 0}), "scale"),
        (json!({"scale": 1.5}), "scale"),
        (json!({"scale": 0.01}), "16x16"),
        (json!({"bitrate_kbps": 1}), "bitrate_kbps"),
        (json!({"keyframe_interval_ms": 10}), "keyframe_interval_ms"),
        (json!({"fps": "fast"}), "fps"),
        (json!({"id": "../x"}), "id"),
        (json!({"max_duration_ms": 0}), "max_duration_ms"),
        (json!({"colour": "red"}), "colour"),
    ] {
        let r = post(&a, "/v1/recordings", body.clone()).await;
        assert_eq!(r.status(), 400, "{body}");
        let v: Value = r.json().await.unwrap();
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{body}: {msg}");
    }
    // Start twice with one id, stop twice, unknown ids.
    let req = RecordingRequest {
        id: Some("mine".into()),
        ..Default::default()
    };
    client.start_recording(&req).await.unwrap();
    let err = client.start_recording(&req).await.unwrap_err();
    assert_eq!(err.status(), Some(409), "{err}");
    client.stop_recording("mine").await.unwrap();
    let err = client.stop_recording("mine").await.unwrap_err();
    assert_eq!(err.status(), Some(409), "{err}");
    assert!(err.to_string().contains("already ended"), "{err}");
    for e in [
        client.recording("nope").await.unwrap_err(),
        client.stop_recording("nope").await.unwrap_err(),
        client
            .delete_recording("nope")
            .await
            .map(|_| ())
            .unwrap_err(),
    ] {
        assert_eq!(e.status(), Some(404), "{e}");
    }
    let r = client
        .request(reqwest::Method::GET, "/v1/recordings/nope/file")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    // Ranges: a bad one is a 416, a good one a 206.
    let r = client
        .request(reqwest::Method::GET, "/v1/recordings/mine/file")
        .header("range", "bytes=999999999-")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 416);
    let r = client
        .request(reqwest::Method::GET, "/v1/recordings/mine/file")
        .header("range", "bytes=4-11")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 206);
    assert_eq!(&r.bytes().await.unwrap()[..], b"ftypisom");
    // Deleting removes the record and the file.
    client.delete_recording("mine").await.unwrap();
    assert_eq!(
        client.recording("mine").await.unwrap_err().status(),
        Some(404)
    );
    assert!(!a.state_dir.join("recordings/mine.mp4").exists());
    // No token, no recording.
    let r = a
        .anonymous()
        .request(reqwest::Method::POST, "/v1/recordings")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);

    // An agent without a display says so.
    let headless = AgentProcess::start().await;
    let err = headless
        .client()
        .start_recording(&RecordingRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(503), "{err}");
}

#[tokio::test]
async fn the_compat_routes_answer_like_the_reference_server() {
    let x = XServer::start(320, 240);
    let (c, w) = solid_window(&x, (0, 0, 320, 240), RED, EventMask::NO_EVENT);
    let a = agent_on(&x).await;
    let http = reqwest::Client::new();
    let url = |p: &str| a.url(p);

    let r = http.post(url("/end_recording")).send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.text().await.unwrap(),
        "{\"message\":\"No recording in progress to stop.\",\"status\":\"error\"}\n"
    );
    let r = http.post(url("/start_recording")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.text().await.unwrap(),
        "{\"message\":\"Started recording successfully.\",\"status\":\"success\"}\n"
    );
    let r = http.post(url("/start_recording")).send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.text().await.unwrap(),
        "{\"message\":\"Recording is already in progress.\",\"status\":\"error\"}\n"
    );
    recolour(&c, w, GREEN);
    let r = http.post(url("/end_recording")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "video/mp4");
    assert_eq!(
        r.headers()["content-disposition"],
        "attachment; filename=recording.mp4"
    );
    let path = a.dir.path().join("compat.mp4");
    std::fs::write(&path, r.bytes().await.unwrap()).unwrap();
    let frames = decode_rgb(&path, 320, 240);
    assert!(near(rgb_at(&frames[0], 320, 100, 100), rgb(RED), 24));
    assert!(near(
        rgb_at(frames.last().unwrap(), 320, 100, 100),
        rgb(GREEN),
        24
    ));
    // The compat recording is listed too, and a new one replaces it.
    let list = a.client().recordings().await.unwrap().recordings;
    assert_eq!(list.len(), 1);
    assert!(list[0].compat);
    let first = list[0].id.clone();
    let r = http.post(url("/start_recording")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let list = a.client().recordings().await.unwrap().recordings;
    assert_eq!(list.len(), 1);
    assert_ne!(list[0].id, first);
    let r = http.post(url("/end_recording")).send().await.unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn concurrent_compat_starts_make_one_recording_and_the_end_returns_it() {
    let x = XServer::start(320, 240);
    let _win = solid_window(&x, (0, 0, 320, 240), RED, EventMask::NO_EVENT);
    let a = agent_on(&x).await;
    let http = reqwest::Client::new();
    let starts = (0..6).map(|_| {
        let http = http.clone();
        let url = a.url("/start_recording");
        async move {
            let r = http.post(url).send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    });
    let answers = futures_util::future::join_all(starts).await;
    let ok = answers.iter().filter(|(s, _)| *s == 200).count();
    assert_eq!(ok, 1, "{answers:?}");
    for (status, body) in answers.iter().filter(|(s, _)| *s != 200) {
        assert_eq!(*status, 400, "{body}");
        assert!(body.contains("Recording is already in progress."), "{body}");
    }
    // One recording runs, and the end stops it and returns it.
    let list = a.client().recordings().await.unwrap().recordings;
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0].state, RecordingState::Recording);
    let r = http.post(a.url("/end_recording")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let path = a.dir.path().join("compat-race.mp4");
    std::fs::write(&path, r.bytes().await.unwrap()).unwrap();
    let frames = decode_rgb(&path, 320, 240);
    assert!(near(rgb_at(&frames[0], 320, 100, 100), rgb(RED), 24));
    let list = a.client().recordings().await.unwrap().recordings;
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0].state, RecordingState::Stopped);
    let r = http.post(a.url("/end_recording")).send().await.unwrap();
    assert_eq!(r.status(), 400);
}

#[tokio::test]
async fn an_odd_sized_screen_records_unshifted_with_the_cursor_drawn_in() {
    // Four quadrants meeting at (160, 120); the 321x241 screen loses its last column and row.
    let x = XServer::start(321, 241);
    const WHITE: u32 = 0xeeeeee;
    let _wins = [
        solid_window(&x, (0, 0, 160, 120), RED, EventMask::NO_EVENT),
        solid_window(&x, (160, 0, 161, 120), GREEN, EventMask::NO_EVENT),
        solid_window(&x, (0, 120, 160, 121), BLUE, EventMask::NO_EVENT),
        solid_window(&x, (160, 120, 161, 121), WHITE, EventMask::NO_EVENT),
    ];
    let a = agent_on(&x).await;
    let client = a.client();
    let r = client
        .request(reqwest::Method::POST, "/v1/input")
        .json(&json!({"actions": [{"type": "move", "x": 80, "y": 60}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut last = Vec::new();
    for cursor in [false, true] {
        let rec = client
            .start_recording(&RecordingRequest {
                cursor: Some(cursor),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!((rec.width, rec.height), (320, 240));
        client.stop_recording(&rec.id).await.unwrap();
        let path = save_file(&a, &rec.id, &format!("odd-{cursor}.mp4")).await;
        let frames = decode_rgb(&path, 320, 240);
        last.push(frames.last().unwrap().clone());
    }
    let (plain, with_cursor) = (&last[0], &last[1]);
    // Each quadrant's colour right up to the seams and in the corners: nothing moved.
    for (px, py, c) in [
        (2, 2, RED),
        (159, 100, RED),
        (100, 119, RED),
        (160, 100, GREEN),
        (317, 2, GREEN),
        (200, 119, GREEN),
        (2, 237, BLUE),
        (100, 120, BLUE),
        (159, 200, BLUE),
        (160, 120, WHITE),
        (160, 200, WHITE),
        (317, 237, WHITE),
    ] {
        for frame in [plain, with_cursor] {
            let got = rgb_at(frame, 320, px, py);
            assert!(
                near(got, rgb(c), 40),
                "({px}, {py}) is {got:?}, not {c:06x}"
            );
        }
    }
    // The cursor is in the picture near the pointer, and only there.
    let differs = |x: u32, y: u32| {
        let (p, q) = (rgb_at(plain, 320, x, y), rgb_at(with_cursor, 320, x, y));
        !near(p, q, 60)
    };
    let near_pointer = (60..110).flat_map(|y| (70..120).map(move |x| (x, y)));
    assert!(
        near_pointer.into_iter().any(|(x, y)| differs(x, y)),
        "no cursor near the pointer"
    );
    for (x, y) in [(20, 20), (250, 60), (60, 200), (250, 200)] {
        assert!(!differs(x, y), "({x}, {y}) changed with the cursor");
    }
}

#[cfg(target_arch = "x86_64")]
#[tokio::test]
async fn the_encoder_runs_openh264s_assembly_kernels() {
    // openh264 quietly builds from C alone when nasm is missing (about twice as slow); the
    // agent's start-up log says which kernels it has.
    let x = XServer::start(320, 240);
    let dir = tempfile::Builder::new()
        .prefix("berth-test-")
        .tempdir()
        .unwrap();
    let log = dir.path().join("agent.log");
    let a = AgentProcess::start_in(
        dir,
        AgentOptions {
            extra_args: vec!["--display".into(), x.display.clone()],
            env: vec![
                ("BERTH_AGENT_LOG".into(), "info".into()),
                ("BERTH_AGENT_LOG_FORMAT".into(), "json".into()),
            ],
            wrapper: vec![
                "sh".into(),
                "-c".into(),
                format!("exec \"$0\" \"$@\" 2>>'{}'", log.display()),
            ],
            ..Default::default()
        },
    )
    .await;
    let kernels = wait_for(
        "the encoder's start-up line",
        Duration::from_secs(10),
        || {
            let log = log.clone();
            async move {
                let text = std::fs::read_to_string(&log).ok()?;
                text.lines()
                    .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                    .find(|v| v["fields"]["message"] == "H.264 encoder (openh264)")
                    .map(|v| v["fields"]["kernels"].as_str().unwrap_or("").to_string())
            }
        },
    )
    .await;
    assert!(kernels.starts_with("x86 assembly ("), "{kernels}");
    assert!(kernels.contains("SSE2"), "{kernels}");
    drop(a);
}

#[tokio::test]
async fn recordings_share_one_capture_and_matching_settings_one_encoder() {
    let x = XServer::start(321, 241); // odd sides: cropped to even
    let (c, w) = solid_window(&x, (0, 0, 321, 241), RED, EventMask::NO_EVENT);
    let a = agent_on(&x).await;
    let client = a.client();
    let one = client
        .start_recording(&RecordingRequest::default())
        .await
        .unwrap();
    let two = client
        .start_recording(&RecordingRequest::default())
        .await
        .unwrap();
    let small = client
        .start_recording(&RecordingRequest {
            scale: Some(0.5),
            fps: Some(5),
            max_duration_ms: Some(1500),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!((one.width, one.height), (320, 240));
    assert_eq!((small.width, small.height), (160, 120));
    assert_eq!(
        encoder_threads(a.pid()),
        2,
        "equal settings share an encoder"
    );
    recolour(&c, w, GREEN);
    let small_end = wait_ended(&a, &small.id).await;
    assert_eq!(small_end.state, RecordingState::Stopped);
    assert_eq!(small_end.end_reason.as_deref(), Some("max_duration"));
    assert!(
        (small_end.duration_ms as i64 - 1500).abs() <= 250,
        "{small_end:?}"
    );
    recolour(&c, w, BLUE);
    let one_end = client.stop_recording(&one.id).await.unwrap();
    let two_end = client.stop_recording(&two.id).await.unwrap();
    wait_for("the encoders to stop", Duration::from_secs(5), || async {
        (encoder_threads(a.pid()) == 0).then_some(())
    })
    .await;
    for (info, w, h) in [
        (&one_end, 320, 240),
        (&two_end, 320, 240),
        (&small_end, 160, 120),
    ] {
        let path = save_file(&a, &info.id, &format!("{}.mp4", info.id)).await;
        let p = probe(&path);
        assert_eq!((p.width, p.height), (w, h));
        let frames = decode_rgb(&path, w, h);
        assert!(near(rgb_at(&frames[0], w, w / 8, h / 8), rgb(RED), 24));
    }
    for info in [&one_end, &two_end] {
        let path = a.dir.path().join(format!("{}.mp4", info.id));
        let frames = decode_rgb(&path, 320, 240);
        assert!(near(
            rgb_at(frames.last().unwrap(), 320, 40, 30),
            rgb(BLUE),
            24
        ));
    }
}

#[tokio::test]
async fn a_full_disk_stops_the_recording_with_an_error_and_keeps_what_was_written() {
    let x = XServer::start(320, 240);
    let (c, w) = solid_window(&x, (0, 0, 320, 240), RED, EventMask::NO_EVENT);
    // The recordings directory is a 2 MiB tmpfs in the agent's own mount namespace.
    let dir = tempfile::Builder::new()
        .prefix("berth-test-")
        .tempdir()
        .unwrap();
    let recordings = dir.path().join("state/recordings");
    std::fs::create_dir_all(&recordings).unwrap();
    let root = nix::unistd::geteuid().is_root();
    let mut wrapper = vec!["unshare".to_string()];
    wrapper.push(if root { "-m" } else { "-rm" }.into());
    wrapper.extend([
        "sh".into(),
        "-c".into(),
        format!(
            "mount -t tmpfs -o size=2m tmpfs {} && exec \"$0\" \"$@\"",
            recordings.display()
        ),
    ]);
    let a = AgentProcess::start_in(
        dir,
        AgentOptions {
            extra_args: vec!["--display".into(), x.display.clone()],
            wrapper,
            ..Default::default()
        },
    )
    .await;
    let client = a.client();
    let rec = client
        .start_recording(&RecordingRequest {
            fps: Some(30),
            bitrate_kbps: Some(50_000),
            ..Default::default()
        })
        .await
        .unwrap();
    let fill = |id: String| {
        let client = client.clone();
        let (c, w) = (&c, w);
        async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut seed = 0;
            loop {
                seed += 1;
                paint_noise(c, w, 320, 240, seed);
                tokio::time::sleep(Duration::from_millis(20)).await;
                let info = client.recording(&id).await.unwrap();
                if info.state != RecordingState::Recording {
                    break info;
                }
                assert!(Instant::now() < deadline, "the disk never filled: {info:?}");
            }
        }
    };
    let info = fill(rec.id.clone()).await;
    assert_eq!(info.state, RecordingState::Failed);
    assert_eq!(info.end_reason.as_deref(), Some("error"));
    let error = info.error.clone().unwrap();
    assert!(error.contains("No space left on device"), "{error}");
    let events = client.events(0).await.unwrap().events;
    let ev = events
        .iter()
        .find(|e| e.kind == "recording.stopped" && e.data["id"] == rec.id.as_str())
        .expect("recording.stopped");
    assert_eq!(ev.data["reason"], "error");
    assert!(ev.data["error"].as_str().unwrap().contains("No space left"));
    // What was written plays to its end.
    let path = save_file(&a, &rec.id, "full.mp4").await;
    assert_eq!(std::fs::metadata(&path).unwrap().len(), info.bytes);
    let p = probe(&path);
    assert!(p.frames.len() >= 2, "{p:?}");
    decode_rgb(&path, 320, 240);
    // A new recording on the full disk fails cleanly: at once (507), or as soon as its first
    // fragment does not fit.
    match client.start_recording(&RecordingRequest::default()).await {
        Err(e) => assert_eq!(e.status(), Some(507), "{e}"),
        Ok(again) => {
            let info = fill(again.id.clone()).await;
            assert_eq!(info.state, RecordingState::Failed);
            assert!(info.error.unwrap().contains("No space left"));
        }
    }
}

/// Reads WebSocket binary messages until `n` arrived.
async fn ws_messages(ws: &mut berth_protocol::client::WebSocket, n: usize) -> Vec<Vec<u8>> {
    use tokio_tungstenite::tungstenite::Message;
    let mut out = Vec::new();
    while out.len() < n {
        let msg = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("a stream message within 10 s")
            .expect("stream open")
            .expect("a message");
        if let Message::Binary(b) = msg {
            out.push(b.to_vec());
        }
    }
    out
}

#[tokio::test]
async fn a_stream_viewer_that_joins_late_starts_at_a_keyframe() {
    let x = XServer::start(320, 240);
    let (c, w) = solid_window(&x, (0, 0, 320, 240), RED, EventMask::NO_EVENT);
    let a = agent_on(&x).await;
    let client = a.client();
    // A recording with the stream's default settings: they share the encoder.
    let rec = client
        .start_recording(&RecordingRequest::default())
        .await
        .unwrap();
    for seed in 0..20 {
        paint_noise(&c, w, 320, 240, seed);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Joining a busy encoder: the first fragment is a keyframe.
    let mut ws = client.websocket("/v1/stream").await.unwrap();
    assert_eq!(encoder_threads(a.pid()), 1);
    for seed in 100..104 {
        paint_noise(&c, w, 320, 240, seed);
    }
    let msgs = ws_messages(&mut ws, 4).await;
    let init = boxes(&msgs[0]);
    assert_eq!(
        init.iter().map(|b| b.0).collect::<Vec<_>>(),
        vec![*b"ftyp", *b"moov"]
    );
    for m in &msgs[1..] {
        let b = boxes(m);
        assert_eq!(
            b.iter().map(|b| b.0).collect::<Vec<_>>(),
            vec![*b"moof", *b"mdat"]
        );
    }
    assert!(
        first_sample_is_sync(&msgs[1]),
        "the first fragment is a keyframe"
    );
    let joined = a.dir.path().join("joined.mp4");
    std::fs::write(&joined, msgs.concat()).unwrap();
    let p = probe(&joined);
    assert_eq!(p.frames[0].1, "I");
    decode_rgb(&joined, 320, 240);
    drop(ws);
    client.stop_recording(&rec.id).await.unwrap();

    // Joining a still screen: a keyframe arrives at once anyway, over plain HTTP too.
    recolour(&c, w, BLUE);
    // The X server has drawn it; wait until the agent has seen that damage too, so the
    // joiner's keyframe is of the blue screen (not the last noise frame it knew).
    wait_for(
        "the agent to see the blue screen",
        Duration::from_secs(10),
        || {
            let client = client.clone();
            async move {
                let r = client
                    .request(reqwest::Method::GET, "/v1/screenshot?cursor=false")
                    .send()
                    .await
                    .ok()?;
                let img = berth_tests::x::decode_png(&r.bytes().await.ok()?);
                (berth_tests::x::pixel(&img, 50, 50) == rgb(BLUE)).then_some(())
            }
        },
    )
    .await;
    let resp = client
        .request(reqwest::Method::GET, "/v1/stream.mp4")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "video/mp4");
    let mut body = resp.bytes_stream();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while boxes(&got).iter().filter(|b| &b.0 == b"mdat").count() < 1 {
        let chunk = tokio::time::timeout_at(deadline.into(), body.next())
            .await
            .expect("a keyframe fragment on a still screen")
            .unwrap()
            .unwrap();
        got.extend_from_slice(&chunk);
    }
    let still = a.dir.path().join("still-stream.mp4");
    std::fs::write(&still, &got).unwrap();
    let frames = decode_rgb(&still, 320, 240);
    assert!(near(rgb_at(&frames[0], 320, 50, 50), rgb(BLUE), 24));
}

#[tokio::test]
async fn browser_routes_take_a_one_time_viewer_url_and_its_cookie() {
    let x = XServer::start(320, 240);
    let _win = solid_window(&x, (0, 0, 320, 240), GREEN, EventMask::NO_EVENT);
    let a = agent_on(&x).await;
    let token = a
        .client()
        .viewer_token(&ViewerTokenRequest {
            path: Some("/v1/stream.mp4".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(token.url.starts_with("/v1/stream.mp4?t="), "{token:?}");
    let browser = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    // Without anything: 401.
    let r = browser.get(a.url("/v1/stream.mp4")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    // The one-time URL sets an HttpOnly cookie and redirects to the clean URL.
    let r = browser.get(a.url(&token.url)).send().await.unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(r.headers()["location"], "/v1/stream.mp4");
    let cookie = r.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("Path=/v1"),
        "{cookie}"
    );
    let pair = cookie.split(';').next().unwrap().to_string();
    // Single use.
    let r = browser.get(a.url(&token.url)).send().await.unwrap();
    assert_eq!(r.status(), 401);
    // The cookie opens the stream …
    let r = browser
        .get(a.url("/v1/stream.mp4"))
        .header("cookie", &pair)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "video/mp4");
    drop(r);
    // … and nothing else.
    let r = browser
        .get(a.url("/v1/recordings"))
        .header("cookie", &pair)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    // Viewer URLs only lead to browser routes.
    let r = post(&a, "/v1/viewer-tokens", json!({"path": "/v1/exec"})).await;
    assert_eq!(r.status(), 400);
    let r = post(&a, "/v1/viewer-tokens", json!({"ttl_seconds": 0})).await;
    assert_eq!(r.status(), 400);
    // A plain GET of the WebSocket route says what to do.
    let r = a
        .client()
        .request(reqwest::Method::GET, "/v1/stream")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
}

/// Milliseconds since the epoch of an API timestamp (`YYYY-MM-DDTHH:MM:SS.mmmZ`).
fn epoch_ms(t: &str) -> i64 {
    let n = |r: std::ops::Range<usize>| -> i64 { t[r].parse().unwrap_or_else(|_| panic!("{t}")) };
    let (y, m, d) = (n(0..4), n(5..7), n(8..10));
    // Days from the civil date (proleptic Gregorian).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    let ms = if t.len() > 20 { n(20..23) } else { 0 };
    ((days * 24 + n(11..13)) * 60 + n(14..16)) * 60_000 + n(17..19) * 1000 + ms
}

#[tokio::test]
async fn a_recording_killed_mid_way_is_rebuilt_from_its_file_by_the_next_agent() {
    let x = XServer::start(320, 240);
    let (c, w) = solid_window(&x, (0, 0, 320, 240), RED, EventMask::NO_EVENT);
    let mut a = agent_on(&x).await;
    let fps = 20;
    let frame = 1.0 / fps as f64;
    let mut rebuilt = Vec::new();
    let mut seed = 0;
    for round in 1..=3u64 {
        let client = a.client();
        let rec = client
            .start_recording(&RecordingRequest {
                fps: Some(fps),
                ..Default::default()
            })
            .await
            .unwrap();
        // A changing screen until the recording has encoded a few seconds' worth (more each
        // round), so the kill lands mid-recording with several fragments and a picture or
        // more waiting.
        let want = 20 * round + 10;
        let deadline = Instant::now() + Duration::from_secs(30);
        let live = loop {
            seed += 1;
            paint_noise(&c, w, 320, 240, seed);
            let info = client.recording(&rec.id).await.unwrap();
            if info.frames_encoded >= want {
                break info;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: {} frames encoded, not {want}, within 30 s",
                info.frames_encoded
            );
            // The animation's pace: a new picture every 40 ms.
            tokio::time::sleep(Duration::from_millis(40)).await;
        };
        a.kill9();

        // The next agent on the same state dir rebuilds the record from what the file holds.
        a.launch().await;
        let info = a.client().recording(&rec.id).await.unwrap();
        assert_eq!(info.state, RecordingState::Interrupted, "{info:?}");
        assert_eq!(info.end_reason.as_deref(), Some("agent_died"));
        let served = save_file(&a, &rec.id, &format!("killed-{round}.mp4")).await;
        let on_disk = std::fs::metadata(&served).unwrap().len();
        let p = probe(&served);
        decode_rgb(&served, 320, 240);
        println!(
            "round {round}: live record {} frames {} ms; rebuilt {} frames {} ms {} bytes \
             ({} keyframes); ffprobe {} frames {:.3} s, file {on_disk} bytes",
            live.frames_encoded,
            live.duration_ms,
            info.frames_encoded,
            info.duration_ms,
            info.bytes,
            info.keyframes,
            p.frames.len(),
            p.duration
        );
        assert!(
            (p.frames.len() as i64 - info.frames_encoded as i64).abs() <= 1,
            "round {round}: ffprobe {} frames, the record {info:?}",
            p.frames.len()
        );
        assert!(
            (p.duration - info.duration_ms as f64 / 1000.0).abs() <= frame,
            "round {round}: ffprobe {} s, the record {info:?}",
            p.duration
        );
        assert_eq!(info.bytes, on_disk, "{info:?}");
        // At most the unflushed second or two was lost.
        assert!(
            info.frames_encoded + 2 * fps as u64 >= live.frames_encoded,
            "{live:?} {info:?}"
        );
        assert!(info.keyframes >= 1 && info.keyframes <= info.frames_encoded);
        let p_sync = p.frames.iter().filter(|f| f.1 == "I").count() as u64;
        assert_eq!(info.keyframes, p_sync, "{p:?}");
        // It ended when the file's last picture did.
        let span =
            epoch_ms(info.ended_at.as_deref().expect("ended_at")) - epoch_ms(&info.started_at);
        assert!(
            span >= info.duration_ms as i64 && span <= info.duration_ms as i64 + 1000,
            "{span} ms from start to end, {} ms in the file",
            info.duration_ms
        );
        assert!(info.encoded_fps > 0.0, "{info:?}");
        rebuilt.push(info);
    }

    // The rebuilt records are kept as they are: another crash and start changes nothing.
    a.kill9();
    a.launch().await;
    let list = a.client().recordings().await.unwrap().recordings;
    for info in &rebuilt {
        let again = list.iter().find(|r| r.id == info.id).expect("still listed");
        assert_eq!(again, info);
    }
    println!("3 of 3 rebuilt records match ffprobe and survive another restart");
}
