//! The checks of `berth verify desktop-osworld`: each call OSWorld's `PythonController` and
//! `SetupController` make, sent to the sandbox's compat surface as they send it (paths,
//! methods, bodies, the harness's timeouts), and its answer held to what the harness and
//! OSWorld's getters rely on. Each check answers its row's detail: a note, or why it failed.

use std::time::Duration;

use reqwest::header::CONTENT_TYPE;
use serde_json::{Value, json};

use super::{CALL_TIMEOUT, chain};

/// What `PythonController.execute_python_command` puts before every command (`pkgs_prefix`).
const PKGS_PREFIX: &str = "import pyautogui; import time; pyautogui.FAILSAFE = False; ";
/// The application name OSWorld's selectors and Chrome getters expect of the browser.
const BROWSER_APP: &str = "Google Chrome";
/// The harness's `get_screenshot` timeout.
const SCREENSHOT_TIMEOUT: Duration = Duration::from_secs(10);
/// The harness's `execute_python_command` timeout.
pub(super) const EXECUTE_TIMEOUT: Duration = Duration::from_secs(90);
/// Larger answers are refused rather than buffered.
const BODY_CAP: usize = 256 << 20;
/// How much of an unexpected answer a failed row quotes.
const QUOTE: usize = 300;

/// A check's outcome: what it found for later checks and its note, or why it failed.
pub(super) type Outcome<T = ()> = Result<(T, String), String>;

/// An answer from the guest, read whole (up to `BODY_CAP`).
struct Answer {
    status: u16,
    body: Vec<u8>,
}

impl Answer {
    /// The body as text, cut for quoting.
    fn quote(&self) -> String {
        quote(&String::from_utf8_lossy(&self.body))
    }

    /// A 200, or the status and what came with it.
    fn ok(self) -> Result<Answer, String> {
        match self.status {
            200 => Ok(self),
            s => Err(format!("HTTP {s}: {}", self.quote())),
        }
    }

    fn json(&self) -> Result<Value, String> {
        serde_json::from_slice(&self.body).map_err(|e| format!("not JSON ({e}): {}", self.quote()))
    }
}

pub(super) fn quote(s: &str) -> String {
    let mut q: String = s.chars().take(QUOTE).collect();
    if q.len() < s.len() {
        q.push('…');
    }
    q
}

/// The sandbox's OSWorld-compatible surface, called as the harness calls it.
pub(super) struct Guest {
    base: String,
    http: reqwest::Client,
}

impl Guest {
    pub(super) fn new(base: &str, http: reqwest::Client) -> Guest {
        Guest {
            base: base.trim_end_matches('/').to_string(),
            http,
        }
    }

    fn get(&self, path: &str) -> reqwest::RequestBuilder {
        self.http.get(format!("{}{path}", self.base))
    }

    fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.http.post(format!("{}{path}", self.base))
    }

    async fn send(&self, rb: reqwest::RequestBuilder, limit: Duration) -> Result<Answer, String> {
        let call = async {
            let mut resp = rb.timeout(limit).send().await.map_err(|e| chain(&e))?;
            let status = resp.status().as_u16();
            let mut body = Vec::new();
            while let Some(chunk) = resp.chunk().await.map_err(|e| chain(&e))? {
                if body.len() + chunk.len() > BODY_CAP {
                    return Err(format!("the answer is larger than {} MiB", BODY_CAP >> 20));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(Answer { status, body })
        };
        tokio::time::timeout(limit, call)
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {} s", limit.as_secs())))
    }

    /// `POST /execute` with a JSON body, as `PythonController` and the getters send it.
    pub(super) async fn execute(&self, body: Value) -> Result<Value, String> {
        let rb = self
            .post("/execute")
            .header(CONTENT_TYPE, "application/json")
            .body(body.to_string());
        self.send(rb, EXECUTE_TIMEOUT).await?.ok()?.json()
    }

    /// `execute_python_command(code)`: `python -c` with the harness's prefix.
    async fn python(&self, code: &str) -> Result<Executed, String> {
        let v = self
            .execute(json!({
                "command": ["python", "-c", format!("{PKGS_PREFIX}{code}")],
                "shell": false,
            }))
            .await?;
        match (v["status"].as_str(), v["output"].as_str()) {
            (Some("success"), Some(out)) => Ok(Executed {
                stdout: out.to_string(),
                stderr: v["error"].as_str().unwrap_or_default().to_string(),
                returncode: v["returncode"].as_i64(),
            }),
            _ => Err(format!(
                "unexpected /execute answer: {}",
                quote(&v.to_string())
            )),
        }
    }
}

/// A `/execute` answer: the harness reads `output` and ignores the rest.
struct Executed {
    stdout: String,
    stderr: String,
    returncode: Option<i64>,
}

impl Executed {
    /// Holds stdout to exactly `want`; a mismatch quotes what came instead, and why.
    fn exact_stdout(&self, want: &str) -> Outcome {
        if self.stdout == want {
            return Ok(((), format!("stdout {want:?}")));
        }
        Err(format!(
            "stdout {:?}, expected exactly {want:?} ({})",
            quote(&self.stdout),
            self.why()
        ))
    }

    fn why(&self) -> String {
        format!(
            "exit {}, stderr {:?}",
            self.returncode.map_or("?".into(), |c| c.to_string()),
            quote(self.stderr.trim_end())
        )
    }
}

pub(super) async fn platform(g: &Guest) -> Outcome {
    let a = g.send(g.get("/platform"), CALL_TIMEOUT).await?.ok()?;
    match a.body == b"Linux" {
        true => Ok(((), "Linux".into())),
        false => Err(format!("{:?}, expected exactly \"Linux\"", a.quote())),
    }
}

pub(super) async fn screen_size(g: &Guest) -> Outcome<(u32, u32)> {
    let v = g
        .send(g.post("/screen_size"), CALL_TIMEOUT)
        .await?
        .ok()?
        .json()?;
    let dim = |k: &str| {
        v[k].as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| *n > 0)
    };
    match (dim("width"), dim("height")) {
        (Some(w), Some(h)) => Ok(((w, h), format!("{w}x{h}"))),
        _ => Err(format!(
            "no positive width and height: {}",
            quote(&v.to_string())
        )),
    }
}

pub(super) async fn screenshot(g: &Guest, screen: Option<(u32, u32)>) -> Outcome {
    let a = g
        .send(g.get("/screenshot"), SCREENSHOT_TIMEOUT)
        .await?
        .ok()?;
    if !a.body.starts_with(b"\x89PNG\r\n\x1a\n") {
        return Err(format!("not a PNG: {}", a.quote()));
    }
    let (w, h) = decode_png(&a.body)?;
    let kb = a.body.len() / 1024;
    match screen {
        Some(s) if s != (w, h) => Err(format!("a {w}x{h} PNG, but the screen is {}x{}", s.0, s.1)),
        Some(_) => Ok(((), format!("{w}x{h} PNG, {kb} KiB"))),
        None => Ok(((), format!("{w}x{h} PNG, {kb} KiB (screen size unknown)"))),
    }
}

/// Decodes a whole PNG (every row, not only its header): its size.
pub(super) fn decode_png(bytes: &[u8]) -> Result<(u32, u32), String> {
    let limits = png::Limits { bytes: 512 << 20 };
    let decoder = png::Decoder::new_with_limits(std::io::Cursor::new(bytes), limits);
    let mut reader = decoder.read_info().map_err(|e| format!("PNG: {e}"))?;
    let size = reader
        .output_buffer_size()
        .ok_or("PNG: too large to decode")?;
    let mut buf = vec![0; size];
    let info = reader
        .next_frame(&mut buf)
        .map_err(|e| format!("PNG does not decode: {e}"))?;
    Ok((info.width, info.height))
}

/// `get_vm_platform()`: the harness asks Python, not `/platform`.
pub(super) async fn python_platform(g: &Guest) -> Outcome {
    g.python("import platform; print(platform.system())")
        .await?
        .exact_stdout("Linux\n")
}

pub(super) async fn move_to(g: &Guest, (x, y): (u32, u32)) -> Outcome {
    g.python(&format!(
        "pyautogui.moveTo({x}, {y}); print(pyautogui.position())"
    ))
    .await?
    .exact_stdout(&format!("Point(x={x}, y={y})\n"))
}

pub(super) async fn cursor_position(g: &Guest, (x, y): (u32, u32)) -> Outcome {
    let v = g
        .send(g.get("/cursor_position"), CALL_TIMEOUT)
        .await?
        .ok()?
        .json()?;
    let point = v.as_array().map(|a| {
        let at = |i: usize| a.get(i).and_then(Value::as_u64);
        (a.len(), at(0), at(1))
    });
    match point {
        Some((2, Some(gx), Some(gy))) if (gx, gy) == (x.into(), y.into()) => {
            Ok(((), format!("[{x}, {y}]")))
        }
        _ => Err(format!("{}, expected [{x}, {y}]", quote(&v.to_string()))),
    }
}

/// `SetupController`'s upload: multipart `file_path` + `file_data`.
pub(super) async fn upload(g: &Guest, path: &str, content: &[u8]) -> Outcome {
    let form = reqwest::multipart::Form::new()
        .text("file_path", path.to_string())
        .part(
            "file_data",
            reqwest::multipart::Part::bytes(content.to_vec()).file_name("probe.bin"),
        );
    let a = g
        .send(g.post("/setup/upload").multipart(form), CALL_TIMEOUT)
        .await?
        .ok()?;
    Ok((
        (),
        format!("{} bytes to {path}: {}", content.len(), a.quote()),
    ))
}

/// `get_file(path)`: a form-encoded `file_path`; the bytes must be the ones uploaded.
pub(super) async fn download(g: &Guest, path: &str, content: &[u8]) -> Outcome {
    let a = g
        .send(g.post("/file").form(&[("file_path", path)]), CALL_TIMEOUT)
        .await?
        .ok()?;
    if a.body == content {
        return Ok(((), format!("{} bytes, identical", content.len())));
    }
    let first = a.body.iter().zip(content).position(|(x, y)| x != y);
    Err(format!(
        "{} bytes back for {} sent, first difference at byte {}",
        a.body.len(),
        content.len(),
        first.unwrap_or(a.body.len().min(content.len()))
    ))
}

pub(super) async fn list_directory(g: &Guest, dir: &str, file: &str) -> Outcome {
    let rb = g
        .post("/list_directory")
        .header(CONTENT_TYPE, "application/json")
        .body(json!({ "path": dir }).to_string());
    let v = g.send(rb, CALL_TIMEOUT).await?.ok()?.json()?;
    let tree = &v["directory_tree"];
    let name = file.rsplit('/').next().unwrap_or(file);
    let listed = tree["children"]
        .as_array()
        .is_some_and(|c| c.iter().any(|n| n["type"] == "file" && n["name"] == name));
    match tree["type"] == "directory" && listed {
        true => Ok(((), format!("{dir} lists {name}"))),
        false => Err(format!("{name} not in {}", quote(&v.to_string()))),
    }
}

/// `start_recording`, input through `/execute`, `end_recording`: an MP4 with its `ftyp` box.
pub(super) async fn recording(g: &Guest, (w, h): (u32, u32)) -> Outcome {
    g.send(g.post("/start_recording"), CALL_TIMEOUT)
        .await?
        .ok()
        .map_err(|e| format!("/start_recording: {e}"))?;
    let input = g
        .python(&format!(
            "pyautogui.moveTo({}, {}, duration=0.5); pyautogui.moveTo({}, {}, duration=0.5)",
            w / 4,
            h / 4,
            w / 2,
            h / 2
        ))
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Ended whatever the input did: a recording left running would refuse the next start.
    let end = g.send(g.post("/end_recording"), CALL_TIMEOUT).await;
    let a = end?.ok().map_err(|e| format!("/end_recording: {e}"))?;
    // The input's own failure is the pyautogui rows' to report; here it only explains a
    // recording of a still screen.
    let input = match input {
        Ok(e) if e.returncode == Some(0) => "the pointer moved".to_string(),
        Ok(e) => format!("the input failed: {}", e.why()),
        Err(e) => format!("the input failed: {e}"),
    };
    match a.body.len() >= 8 && &a.body[4..8] == b"ftyp" {
        true => Ok(((), format!("MP4, {} KiB; {input}", a.body.len() / 1024))),
        false => Err(format!(
            "{} bytes without an ftyp box: {}",
            a.body.len(),
            quote(&String::from_utf8_lossy(&a.body[..a.body.len().min(64)]))
        )),
    }
}

/// The application a fresh desktop always shows in the tree: XFCE's runs the browser from the
/// start; GNOME's starts it on demand (OSWorld's desktop has no browser open), and its shell is
/// there instead.
const ALWAYS_THERE: [&str; 2] = [BROWSER_APP, "gnome-shell"];

/// `get_accessibility_tree()`: XML that parses, its applications, the browser (or GNOME's
/// shell) among them.
pub(super) async fn accessibility(g: &Guest) -> Outcome {
    let v = g
        .send(g.get("/accessibility"), CALL_TIMEOUT)
        .await?
        .ok()?
        .json()?;
    let xml = v["AT"]
        .as_str()
        .ok_or_else(|| format!("no \"AT\" string: {}", quote(&v.to_string())))?;
    let apps = applications(xml)?;
    match apps.iter().any(|a| ALWAYS_THERE.contains(&a.as_str())) {
        true => Ok(((), format!("applications: {}", apps.join(", ")))),
        false if apps.is_empty() => Err("the tree lists no application".into()),
        false => Err(format!(
            "neither {BROWSER_APP:?} nor GNOME's shell among the applications: {}",
            apps.join(", ")
        )),
    }
}

/// The names of the applications (the root's children) in OSWorld's tree.
pub(super) fn applications(xml: &str) -> Result<Vec<String>, String> {
    let doc =
        roxmltree::Document::parse(xml).map_err(|e| format!("the XML does not parse: {e}"))?;
    let root = doc.root_element();
    if root.tag_name().name() != "desktop-frame" {
        return Err(format!(
            "the root is <{}>, not <desktop-frame>",
            root.tag_name().name()
        ));
    }
    Ok(root
        .children()
        .filter(|n| n.is_element())
        .map(|n| n.attribute("name").unwrap_or_default().to_string())
        .collect())
}

/// What Playwright's `connect_over_cdp` reads first.
pub(super) async fn cdp_version(http: &reqwest::Client, cdp: Option<String>) -> Outcome {
    let base = cdp.ok_or("the sandbox record has no endpoints.cdp")?;
    let g = Guest::new(&base, http.clone());
    let v = g
        .send(g.get("/json/version"), CALL_TIMEOUT)
        .await?
        .ok()?
        .json()?;
    match (v["Browser"].as_str(), v["webSocketDebuggerUrl"].as_str()) {
        (Some(b), Some(_)) => Ok(((), b.to_string())),
        _ => Err(format!(
            "no Browser and webSocketDebuggerUrl: {}",
            quote(&v.to_string())
        )),
    }
}

/// A file no text transform leaves alone: every byte value, then pseudo-random bytes.
pub(super) fn probe_bytes(tag: &str) -> Vec<u8> {
    let mut seed = tag.bytes().fold(0x9e37_79b9_7f4a_7c15u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    }) | 1;
    let mut out: Vec<u8> = (0..=255).collect();
    while out.len() < 300 * 1024 {
        // xorshift64
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        out.extend_from_slice(&seed.to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: &str = "xmlns:st=\"https://accessibility.ubuntu.example.org/ns/state\"";

    #[test]
    fn the_applications_are_the_root_children_of_a_desktop_frame() {
        let xml = format!(
            "<desktop-frame {NS} name=\"\"><application name=\"xfce4-panel\"><frame name=\"p\" \
             st:showing=\"true\"/></application><application name=\"Google Chrome\"/></desktop-frame>"
        );
        assert_eq!(
            applications(&xml).unwrap(),
            ["xfce4-panel", "Google Chrome"]
        );
    }

    #[test]
    fn a_tree_that_does_not_parse_or_has_another_root_is_an_error_not_a_panic() {
        assert!(
            applications("<desktop-frame><application")
                .unwrap_err()
                .contains("parse")
        );
        assert!(
            applications("<a st:x=\"1\"/>")
                .unwrap_err()
                .contains("parse")
        );
        assert!(
            applications("<desktop/>")
                .unwrap_err()
                .contains("<desktop>")
        );
        assert!(applications("").is_err());
    }

    #[test]
    fn a_truncated_or_garbage_png_is_an_error_not_a_panic() {
        assert!(decode_png(b"\x89PNG\r\n\x1a\n").is_err());
        assert!(
            decode_png(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\xff\xff\xff\xff\xff\xff\xff\xff").is_err()
        );
        let mut png = Vec::new();
        {
            let mut enc = png::Encoder::new(&mut png, 3, 2);
            enc.set_color(png::ColorType::Rgb);
            let mut w = enc.write_header().unwrap();
            w.write_image_data(&[7; 18]).unwrap();
        }
        assert_eq!(decode_png(&png).unwrap(), (3, 2));
        assert!(decode_png(&png[..png.len() - 20]).is_err());
    }

    #[test]
    fn the_probe_file_holds_every_byte_value_and_differs_per_run() {
        let a = probe_bytes("aaaaaa");
        assert!((0..=255u8).all(|b| a.contains(&b)));
        assert!(String::from_utf8(a.clone()).is_err());
        assert_ne!(a, probe_bytes("aaaaab"));
        assert_eq!(a, probe_bytes("aaaaaa"));
    }

    #[tokio::test]
    async fn odd_answers_fail_their_checks_without_a_panic() {
        use axum::http::StatusCode;
        use axum::routing::{get, post};
        let odd = axum::Router::new()
            .route("/platform", get(|| async { "Linux\n" }))
            .route(
                "/screen_size",
                post(|| async { axum::Json(json!({"width": "wide", "height": -1})) }),
            )
            .route(
                "/screenshot",
                get(|| async { b"\x89PNG\r\n\x1a\nnot really".to_vec() }),
            )
            .route("/execute", post(|| async { axum::Json(json!([1, 2])) }))
            .route(
                "/cursor_position",
                get(|| async { axum::Json(json!({"x": 1})) }),
            )
            .route(
                "/setup/upload",
                post(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "<html>boom</html>") }),
            )
            .route("/file", post(|| async { "short" }))
            .route(
                "/list_directory",
                post(|| async { axum::Json(json!({"directory_tree": null})) }),
            )
            .route("/start_recording", post(|| async { "ok" }))
            .route("/end_recording", post(|| async { "RIFF" }))
            .route(
                "/accessibility",
                get(|| async { axum::Json(json!({"AT": "<desktop-frame><application>"})) }),
            )
            .route("/json/version", get(|| async { "{" }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, odd).await });
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let g = Guest::new(&base, http.clone());
        let fails = |r: Outcome<()>| r.unwrap_err();
        assert!(fails(platform(&g).await).contains("expected exactly"));
        assert!(screen_size(&g).await.unwrap_err().contains("width"));
        assert!(fails(screenshot(&g, None).await).contains("PNG"));
        assert!(fails(python_platform(&g).await).contains("unexpected /execute"));
        assert!(fails(move_to(&g, (1, 2)).await).contains("unexpected /execute"));
        assert!(fails(cursor_position(&g, (1, 2)).await).contains("expected [1, 2]"));
        assert!(fails(upload(&g, "/tmp/x", b"abc").await).contains("HTTP 500"));
        assert!(fails(download(&g, "/tmp/x", b"abc").await).contains("first difference"));
        assert!(fails(list_directory(&g, "/tmp", "/tmp/x").await).contains("not in"));
        assert!(fails(recording(&g, (8, 8)).await).contains("ftyp"));
        assert!(fails(accessibility(&g).await).contains("parse"));
        assert!(fails(cdp_version(&http, Some(base.clone())).await).contains("not JSON"));
        assert!(fails(cdp_version(&http, None).await).contains("endpoints.cdp"));
        // Nothing listens there any more: a refused connection is a failed row too.
        let gone = Guest::new("http://127.0.0.1:9", http);
        assert!(fails(platform(&gone).await).contains("error"));
    }
}
