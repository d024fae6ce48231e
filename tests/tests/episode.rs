//! The episode: the agent's action log (every `/v1/computer` action, `/v1/input` call and MCP
//! `computer` call, with wall-clock and media times and the screenshot each answered) on a
//! real X server, surviving a restart; and, on a Docker desktop sandbox through the
//! controller, the episode bundle whose screenshots are the recording's frames at their
//! media times, kept as an artifact past the sandbox's deletion.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use base64::Engine;
use berth_protocol::controller::CreateSandbox;
use berth_tests::controller::{ControllerProcess, Provider};
use berth_tests::x::{XServer, decode_png, pixel};
use berth_tests::{AgentOptions, AgentProcess, TOKEN, wait_for};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};

async fn post(a: &AgentProcess, path: &str, body: &Value) -> Value {
    let r = a
        .client()
        .request(reqwest::Method::POST, path)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let text = r.text().await.unwrap();
    assert!(status.is_success(), "{path} {body}: {status} {text}");
    serde_json::from_str(&text).unwrap()
}

async fn actions(a: &AgentProcess, want: usize) -> Vec<Value> {
    wait_for(
        "the actions in the log",
        Duration::from_secs(10),
        || async {
            let v = a.get_json("/v1/episode/actions?from_seq=1").await;
            let list = v["actions"].as_array().cloned().unwrap_or_default();
            (list.len() >= want).then_some(list)
        },
    )
    .await
}

#[tokio::test]
async fn every_action_route_logs_and_the_log_survives_a_restart() {
    let x = XServer::start(640, 480);
    let mut a = AgentProcess::start_with(AgentOptions {
        extra_args: vec!["--display".into(), x.display.clone()],
        ..Default::default()
    })
    .await;
    let rec = post(&a, "/v1/recordings", &json!({"fps": 10})).await;
    let rec_id = rec["id"].as_str().unwrap().to_string();

    // Anthropic, one action.
    let clicked = post(
        &a,
        "/v1/computer",
        &json!({"action": "left_click", "coordinate": [100, 120]}),
    )
    .await;
    let answered = base64::engine::general_purpose::STANDARD
        .decode(clicked["base64_image"].as_str().unwrap())
        .unwrap();
    // OpenAI, a batch of two.
    post(
        &a,
        "/v1/computer",
        &json!({"actions": [
            {"type": "move", "x": 10, "y": 20},
            {"type": "keypress", "keys": ["A"]},
        ]}),
    )
    .await;
    // Native input with a screenshot after.
    let input = post(
        &a,
        "/v1/input",
        &json!({"actions": [{"type": "move", "x": 33, "y": 44}], "screenshot_after": {}}),
    )
    .await;
    assert_eq!(input["cursor"], json!([33, 44]));
    // A bad body is logged with its error.
    let r = a
        .client()
        .request(reqwest::Method::POST, "/v1/computer")
        .json(&json!({"action": "left_click", "coordinate": [9999, 0]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    // MCP's computer tool.
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(a.url("/mcp")).auth_header(TOKEN),
    );
    let client = ().serve(transport).await.expect("an MCP session");
    let r = client
        .call_tool(
            CallToolRequestParams::new("computer").with_arguments(
                json!({"action": "mouse_move", "coordinate": [200, 210]})
                    .as_object()
                    .unwrap()
                    .clone(),
            ),
        )
        .await
        .unwrap();
    assert_eq!(r.is_error, Some(false), "{r:?}");
    client.cancel().await.ok();

    let log = actions(&a, 6).await;
    assert_eq!(log.len(), 6, "{log:#?}");
    let seqs: Vec<u64> = log.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5, 6]);
    let sources: Vec<&str> = log.iter().map(|e| e["source"].as_str().unwrap()).collect();
    assert_eq!(
        sources,
        [
            "computer", "computer", "computer", "input", "computer", "mcp"
        ]
    );
    let dialects: Vec<&str> = log
        .iter()
        .map(|e| e["dialect"].as_str().unwrap_or("-"))
        .collect();
    assert_eq!(
        dialects,
        [
            "anthropic",
            "openai",
            "openai",
            "native",
            "anthropic",
            "anthropic"
        ]
    );
    // The click: its action as received, its settle, its screenshot's exact bytes, its media
    // times in the live recording (the screenshot after the action started).
    let click = &log[0];
    assert_eq!(click["action"]["coordinate"], json!([100, 120]));
    assert_eq!(click["cursor"], json!([100, 120]));
    assert!(click["settled_ms"].is_u64() && click["settle_timed_out"].is_boolean());
    assert!(click["at"].as_str().unwrap().ends_with('Z'));
    assert!(click["at_ms"].as_u64().unwrap() > 1_700_000_000_000);
    let r0 = &click["recordings"][0];
    assert_eq!(r0["id"], rec_id);
    let (m, s) = (
        r0["media_ms"].as_u64().unwrap(),
        r0["screenshot_media_ms"].as_u64().unwrap(),
    );
    assert!(s >= m, "{click}");
    let name = click["screenshot"].as_str().unwrap();
    assert_eq!(name, "000001.png");
    let r = a
        .client()
        .request(
            reqwest::Method::GET,
            &format!("/v1/episode/screenshots/{name}"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "image/png");
    assert_eq!(r.bytes().await.unwrap().as_ref(), answered.as_slice());
    // The batch: one entry per action, the screenshot and settle on the last.
    assert_eq!(log[1]["batch"], json!({"index": 0, "size": 2}));
    assert_eq!(log[1]["action"]["type"], "move");
    assert!(log[1].get("screenshot").is_none());
    assert_eq!(log[2]["batch"], json!({"index": 1, "size": 2}));
    assert_eq!(log[2]["action"]["keys"], json!(["A"]));
    assert_eq!(log[2]["screenshot"], "000003.png");
    assert!(log[2]["settled_ms"].is_u64());
    assert_eq!(log[3]["screenshot"], "000004.png");
    assert_eq!(log[3]["action"]["actions"][0]["x"], 33);
    assert!(
        log[4]["error"].as_str().unwrap().contains("9999"),
        "{}",
        log[4]
    );
    assert!(log[4].get("screenshot").is_none());
    assert_eq!(log[5]["action"]["coordinate"], json!([200, 210]));
    assert!(log[5]["screenshot"].is_string());

    // Names are the log's own.
    for (bad, status) in [
        ("..%2F..%2Ftoken", 400),
        ("abc.png", 400),
        ("000001.exe", 400),
        ("000099.png", 404),
    ] {
        let r = a
            .client()
            .request(
                reqwest::Method::GET,
                &format!("/v1/episode/screenshots/{bad}"),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), status, "{bad}");
        let body: Value = r.json().await.unwrap();
        assert!(body["error"]["code"].is_string(), "{body}");
    }
    // Pages.
    let page = a.get_json("/v1/episode/actions?from_seq=3&limit=2").await;
    assert_eq!(page["actions"].as_array().unwrap().len(), 2);
    assert_eq!(page["actions"][0]["seq"], 3);
    assert_eq!(page["next_seq"], 5);

    // The agent's own: the desktop user cannot rewrite it.
    let ep = a.state_dir.join("episode");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&ep), 0o700);
    assert_eq!(mode(&ep.join("actions.jsonl")), 0o600);
    assert_eq!(mode(&ep.join("screenshots/000001.png")), 0o600);

    // A restart (SIGTERM) keeps the log and continues its sequence.
    a.signal(nix::sys::signal::Signal::SIGTERM);
    a.wait_exit(Duration::from_secs(20));
    a.launch().await;
    let again = actions(&a, 6).await;
    assert_eq!(again, log);
    post(
        &a,
        "/v1/computer",
        &json!({"action": "mouse_move", "coordinate": [5, 5]}),
    )
    .await;
    let after = actions(&a, 7).await;
    assert_eq!(after[6]["seq"], 7);
    assert!(
        after[6].get("recordings").is_none(),
        "no live recording now"
    );

    // A new episode.
    let r = a
        .client()
        .request(reqwest::Method::DELETE, "/v1/episode")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let cleared: Value = r.json().await.unwrap();
    assert_eq!(cleared["cleared"], 7);
    let empty = a.get_json("/v1/episode/actions").await;
    assert_eq!(empty["actions"], json!([]));
    assert!(!ep.join("screenshots/000001.png").exists());
}

/// A frame or screenshot brought to a small grey-free RGB thumbnail by ffmpeg (the same
/// scaler for both), so they compare pixel by pixel.
const THUMB: (u32, u32) = (160, 90);

fn thumbs(input: &Path) -> Vec<Vec<u8>> {
    let out = std::process::Command::new("ffmpeg")
        .args(["-v", "error", "-i"])
        .arg(input)
        .args([
            "-fps_mode",
            "passthrough",
            "-enc_time_base",
            "1:90000",
            "-vf",
            &format!("scale={}:{}:flags=area", THUMB.0, THUMB.1),
            "-f",
            "rawvideo",
            "-pix_fmt",
            "rgb24",
            "-",
        ])
        .output()
        .expect("ffmpeg");
    assert!(
        out.status.success(),
        "ffmpeg {}: {}",
        input.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let n = (THUMB.0 * THUMB.1 * 3) as usize;
    assert_eq!(out.stdout.len() % n, 0);
    out.stdout.chunks(n).map(<[u8]>::to_vec).collect()
}

/// Mean absolute difference per channel, 0-255.
fn mad(a: &[u8], b: &[u8]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (*x as i32 - *y as i32).unsigned_abs() as u64)
        .sum::<u64>() as f64
        / a.len() as f64
}

fn page(color: &str) -> String {
    format!(
        "data:text/html,<body style=\"margin:0;background:%23{color}\"><h1 style=\"font-size:200px\">{color}</h1>"
    )
}

#[tokio::test]
async fn docker_the_episode_bundle_matches_its_video_and_outlives_the_sandbox() {
    let c = ControllerProcess::start_on(Provider::Docker, "").await;
    let cl = c.client();
    let sb = cl
        .create(&CreateSandbox {
            profile: "desktop".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(sb.status, "running");
    let base = format!("/sandbox/sandboxes/v1/{}", sb.id);
    let call = |method: reqwest::Method, path: String, body: Option<Value>| {
        let cl = cl.clone();
        async move {
            let mut r = cl.request(method, &path);
            if let Some(b) = body {
                r = r.json(&b);
            }
            let r = r.send().await.unwrap();
            let status = r.status();
            let text = r.text().await.unwrap();
            assert!(status.is_success(), "{path}: {status} {text}");
            serde_json::from_str::<Value>(&text).unwrap_or(Value::Null)
        }
    };
    // The desktop is ready and Chromium shows its blank page (white where the page is).
    wait_for("Chromium's blank page", Duration::from_secs(120), || {
        let cl = cl.clone();
        let base = base.clone();
        async move {
            let r = cl
                .request(reqwest::Method::GET, &format!("{base}/v1/ready"))
                .send()
                .await
                .ok()?;
            let ready: Value = r.json().await.ok()?;
            if ready["ready"] != true {
                return None;
            }
            let png = cl.screenshot(&sb_id(&base)).await.ok()?;
            let img = decode_png(&png);
            let p = pixel(&img, img.0 / 2, img.1 * 2 / 3);
            p.iter().all(|c| *c > 240).then_some(())
        }
    })
    .await;
    let rec = call(
        reqwest::Method::POST,
        format!("{base}/v1/recordings"),
        Some(json!({"fps": 15})),
    )
    .await;
    let rec_id = rec["id"].as_str().unwrap().to_string();
    let computer = |body: Value| {
        call(
            reqwest::Method::POST,
            format!("{base}/v1/computer"),
            Some(body),
        )
    };
    // Actions whose screens differ: Chromium (maximized) shows a page of one colour, then
    // another. A click on the page first gives it the keyboard. Each entry the log should
    // have is counted, and each screenshot an answer carried.
    let mut entries = 0usize;
    let mut answered = 0usize;
    computer(json!({"action": "left_click", "coordinate": [960, 600]})).await;
    (entries, answered) = (entries + 1, answered + 1);
    let colours = [
        ("d01010", [0xd0, 0x10, 0x10]),
        ("10b030", [0x10, 0xb0, 0x30]),
        ("1030e0", [0x10, 0x30, 0xe0]),
    ];
    for (i, (color, rgb)) in colours.into_iter().enumerate() {
        if i < 2 {
            computer(json!({"action": "key", "text": "ctrl+l"})).await;
            computer(json!({"action": "type", "text": format!("{}\n", page(color))})).await;
            (entries, answered) = (entries + 2, answered + 2);
        } else {
            // OpenAI's batch: three entries, one screenshot.
            computer(json!({"actions": [
                {"type": "keypress", "keys": ["CTRL", "L"]},
                {"type": "type", "text": page(color)},
                {"type": "keypress", "keys": ["ENTER"]},
            ]}))
            .await;
            (entries, answered) = (entries + 3, answered + 1);
        }
        // The page may paint after the settle: screenshot actions until it shows.
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        loop {
            let shot = computer(json!({"action": "screenshot"})).await;
            (entries, answered) = (entries + 1, answered + 1);
            let img = decode_png(
                &base64::engine::general_purpose::STANDARD
                    .decode(shot["base64_image"].as_str().unwrap())
                    .unwrap(),
            );
            let p = pixel(&img, img.0 / 2, img.1 * 2 / 3);
            if berth_tests::video::near(p, rgb, 12) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the page is not #{color} after typing its URL: {p:?}"
            );
        }
        // A settled screenshot of the page.
        computer(json!({"action": "mouse_move", "coordinate": [900 + 10 * i as i64, 650]})).await;
        (entries, answered) = (entries + 1, answered + 1);
    }
    computer(json!({"action": "left_click", "coordinate": [960, 700]})).await;
    (entries, answered) = (entries + 1, answered + 1);
    call(
        reqwest::Method::POST,
        format!("{base}/v1/recordings/{rec_id}/stop"),
        None,
    )
    .await;

    // The bundle.
    let r = cl
        .request(reqwest::Method::GET, &format!("{base}/episode"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/zip");
    let art_id = r.headers()["x-artifact-id"].to_str().unwrap().to_string();
    let zip_bytes = r.bytes().await.unwrap().to_vec();
    let dir = tempfile::tempdir().unwrap();
    let mut z = zip::ZipArchive::new(std::io::Cursor::new(zip_bytes.clone())).unwrap();
    let mut read = |name: &str| {
        let mut f = z
            .by_name(name)
            .unwrap_or_else(|_| panic!("{name} in the bundle"));
        let mut b = Vec::new();
        f.read_to_end(&mut b).unwrap();
        b
    };
    let video = dir.path().join("recording.mp4");
    std::fs::write(&video, read("recording.mp4")).unwrap();
    let meta: Value = serde_json::from_slice(&read("episode.json")).unwrap();
    assert_eq!(meta["sandbox"], sb.id);
    assert_eq!(meta["recording"]["id"], rec_id);
    let timeline = String::from_utf8(read("timeline.jsonl")).unwrap();
    assert!(timeline.lines().count() > 1);
    assert!(timeline.contains("sandbox.created") || timeline.contains("\"kind\""));
    let lines: Vec<Value> = String::from_utf8(read("actions.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), entries, "{lines:#?}");
    let probe = berth_tests::video::probe(&video);
    assert!(probe.duration > 1.0, "{probe:?}");
    let duration_ms = probe.duration * 1000.0;
    let frames = thumbs(&video);
    assert_eq!(frames.len(), probe.frames.len());
    let mut shots = Vec::new();
    let mut shot_count = 0;
    for l in &lines {
        assert_eq!(l["recording"], rec_id, "{l}");
        let m = l["media_ms"].as_f64().unwrap();
        assert!(
            (0.0..=duration_ms).contains(&m),
            "{m} outside 0..{duration_ms}"
        );
        let Some(name) = l["screenshot"].as_str() else {
            continue;
        };
        let s = l["screenshot_media_ms"].as_f64().unwrap();
        assert!((m..=duration_ms).contains(&s), "{s}");
        shot_count += 1;
        // Compared where the screen had settled: a bare screenshot may catch it mid-change,
        // between two of the recorder's captures.
        if l["settle_timed_out"] != false {
            continue;
        }
        let path = dir.path().join(name);
        std::fs::write(&path, read(&format!("screenshots/{name}"))).unwrap();
        let shot = thumbs(&path).remove(0);
        // The frame a player shows at that media time: the last at or before it.
        let at = s / 1000.0 + 0.0005;
        let idx = probe
            .frames
            .iter()
            .rposition(|(t, _)| *t <= at)
            .expect("a frame at or before the screenshot");
        shots.push((name.to_string(), l["seq"].as_u64().unwrap(), shot, idx));
    }
    assert_eq!(shot_count, answered, "every call answered one screenshot");
    assert!(shots.len() >= 9, "{} settled screenshots", shots.len());
    let mut distinct_pairs = 0;
    for (name, seq, shot, idx) in &shots {
        let own = mad(shot, &frames[*idx]);
        assert!(
            own < 6.0,
            "{name} (seq {seq}) differs from its frame by {own}"
        );
        for (other, oseq, oshot, _) in &shots {
            // Another step's screen that looks different: the frame must not match it.
            if mad(shot, oshot) > 20.0 {
                distinct_pairs += 1;
                let theirs = mad(oshot, &frames[*idx]);
                assert!(
                    theirs > own * 3.0 && theirs > 15.0,
                    "{name} (seq {seq})'s frame matches {other} (seq {oseq}) too: {own} vs {theirs}"
                );
            }
        }
    }
    assert!(
        distinct_pairs >= 6,
        "the steps' screens differ ({distinct_pairs} pairs)"
    );

    // As ATIF: the trajectory beside it in the bundle, and `?format=atif`, name the same steps.
    let in_bundle: Value = serde_json::from_slice(&read("trajectory.json")).unwrap();
    assert_eq!(in_bundle["steps"].as_array().unwrap().len(), entries);
    let r = cl
        .request(reqwest::Method::GET, &format!("{base}/episode?format=atif"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/json");
    assert_eq!(r.headers()["x-artifact-id"].to_str().unwrap(), art_id);
    let answered_atif: Value = r.json().await.unwrap();
    assert_eq!(answered_atif["steps"], in_bundle["steps"]);
    assert_eq!(answered_atif["extra"]["bundle_artifact"], art_id.as_str());
    let r = cl
        .request(reqwest::Method::GET, &format!("{base}/episode?format=tar"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("atif"));
    // Deleted: the bundle is still served and listed.
    cl.delete(&sb.id).await.unwrap();
    assert_eq!(cl.get(&sb.id).await.unwrap().status, "stopped");
    let r = cl
        .request(reqwest::Method::GET, &format!("{base}/episode"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let kept_id = r.headers()["x-artifact-id"].to_str().unwrap().to_string();
    let kept = r.bytes().await.unwrap();
    let mut kz = zip::ZipArchive::new(std::io::Cursor::new(kept.to_vec())).unwrap();
    let n = String::from_utf8({
        let mut b = Vec::new();
        kz.by_name("actions.jsonl")
            .unwrap()
            .read_to_end(&mut b)
            .unwrap();
        b
    })
    .unwrap()
    .lines()
    .count();
    assert_eq!(n, entries);
    // The bundle asked for before and the one kept at deletion hold the same episode.
    assert_eq!(kept_id, art_id, "the same episode is one artifact");
    atif_export(&c, &sb.id, entries, answered);
    let list = call(
        reqwest::Method::GET,
        format!("/sandbox/v1/artifacts?sandbox={}", sb.id),
        None,
    )
    .await;
    let episodes: Vec<&Value> = list["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| {
            a["kind"] == "episode"
                || a["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("episode-"))
        })
        .collect();
    assert_eq!(episodes.len(), 1, "{list}");
    assert_eq!(episodes[0]["id"], art_id);
    assert_eq!(episodes[0]["content_type"], "application/zip");
    let art = cl
        .request(
            reqwest::Method::GET,
            &format!("/sandbox/v1/artifacts/{art_id}"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(art.status(), 200);
    assert_eq!(art.bytes().await.unwrap().len(), zip_bytes.len());
}

/// `berth sandbox episode ID --format atif` of a deleted sandbox (its kept bundle): a
/// `trajectory.json` that the `atif` package's models validate (as they validate the golden
/// small episode), one agent step per logged action with its call and media time, and every
/// screenshot it names beside it.
fn atif_export(c: &ControllerProcess, id: &str, entries: usize, answered: usize) {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(berth_tests::workspace_bin("berth"))
        .args(["sandbox", "episode", id, "--format", "atif", "--json", "-o"])
        .arg(dir.path())
        .args([
            "--url",
            &c.base,
            "--api-key",
            berth_tests::controller::API_KEY,
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let said: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(said["steps"], entries, "{said}");
    let script = r#"
import json, os, sys, atif
d, golden = sys.argv[1], sys.argv[2]
atif.Trajectory.model_validate(json.load(open(golden)))
t = atif.Trajectory.model_validate(json.load(open(os.path.join(d, "trajectory.json"))))
images = [p.source.path for s in t.steps for r in (s.observation.results if s.observation else [])
          for p in (r.content if isinstance(r.content, list) else []) if p.type == "image"]
missing = [p for p in images if not os.path.exists(os.path.join(d, p))]
calls = sum(len(s.tool_calls or []) for s in t.steps)
timed = sum(1 for s in t.steps if s.timestamp and "media_ms" in (s.extra or {}))
print(json.dumps({"steps": len(t.steps), "images": len(images), "missing": missing,
                  "calls": calls, "timed": timed, "version": t.schema_version}))
"#;
    let golden = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/golden/atif-small-episode.json"
    );
    let out = std::process::Command::new("/opt/berth/harbor-venv/bin/python")
        .args(["-c", script])
        .arg(dir.path())
        .arg(golden)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    println!("ATIF export: {v}");
    assert_eq!(v["version"], "ATIF-v1.8");
    assert_eq!(v["steps"], entries);
    assert_eq!(v["calls"], entries);
    assert_eq!(
        v["timed"], entries,
        "every step has its time and media time"
    );
    assert_eq!(v["images"], answered, "{v}");
    assert_eq!(v["missing"], json!([]), "{v}");
}

/// The sandbox id at the end of `…/sandboxes/v1/{id}`.
fn sb_id(base: &str) -> String {
    base.rsplit('/').next().unwrap().to_string()
}
