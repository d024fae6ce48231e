//! The OSWorld-compatible file routes against a real agent and real files: `/file`,
//! `/setup/upload`, `/list_directory`, `/desktop_path`, `/setup/download_file`.

use std::time::Duration;

use berth_tests::{AgentProcess, peak_rss_kib, write_pattern_file};
use serde_json::{Value, json};

async fn post_form(a: &AgentProcess, path: &str, form: &[(&str, &str)]) -> reqwest::Response {
    reqwest::Client::new()
        .post(a.url(path))
        .form(form)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn file_serves_bytes_as_an_attachment_with_flask_headers() {
    let a = AgentProcess::start().await;
    let bytes: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    std::fs::write(a.home.join("data.bin"), &bytes).unwrap();
    let r = post_form(&a, "/file", &[("file_path", "~/data.bin")]).await;
    assert_eq!(r.status(), 200);
    let h = r.headers().clone();
    assert_eq!(h["content-disposition"], "attachment; filename=data.bin");
    assert_eq!(h["content-type"], "application/octet-stream");
    assert_eq!(h["content-length"], "100000");
    assert_eq!(h["cache-control"], "no-cache");
    assert!(h.contains_key("last-modified") && h.contains_key("etag"));
    assert_eq!(r.bytes().await.unwrap().as_ref(), bytes.as_slice());

    std::fs::write(a.home.join("notes.txt"), "hello").unwrap();
    let r = post_form(&a, "/file", &[("file_path", "$HOME/notes.txt")]).await;
    assert_eq!(r.headers()["content-type"], "text/plain; charset=utf-8");
    assert_eq!(r.text().await.unwrap(), "hello");
}

#[tokio::test]
async fn file_accepts_a_multipart_form_too() {
    let a = AgentProcess::start().await;
    std::fs::write(a.home.join("m.txt"), "multi").unwrap();
    let form = reqwest::multipart::Form::new().text(
        "file_path",
        a.home.join("m.txt").to_string_lossy().into_owned(),
    );
    let r = reqwest::Client::new()
        .post(a.url("/file"))
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "multi");
}

#[tokio::test]
async fn file_errors_are_the_reference_json_bodies() {
    let a = AgentProcess::start().await;
    let r = post_form(&a, "/file", &[]).await;
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"error": "file_path is required"})
    );
    let r = post_form(&a, "/file", &[("file_path", "/no/such/file")]).await;
    assert_eq!(r.status(), 404);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"error": "File not found"})
    );
    let dir = a.home.to_string_lossy().into_owned();
    let r = post_form(&a, "/file", &[("file_path", &dir)]).await;
    assert_eq!(r.status(), 500);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"error": format!("Failed to serve file: [Errno 21] Is a directory: '{dir}'")})
    );
    let r = post_form(&a, "/file", &[("file_path", "a\0b")]).await;
    assert_eq!(r.status(), 400);
}

#[tokio::test]
async fn upload_creates_parents_and_answers_the_size() {
    let a = AgentProcess::start().await;
    let form = reqwest::multipart::Form::new()
        .text("file_path", "~/deep/er/doc.txt")
        .part(
            "file_data",
            reqwest::multipart::Part::bytes(b"contents".to_vec()).file_name("ignored.txt"),
        );
    let r = reqwest::Client::new()
        .post(a.url("/setup/upload"))
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/html; charset=utf-8");
    assert_eq!(r.text().await.unwrap(), "File Uploaded: 8 bytes");
    assert_eq!(
        std::fs::read(a.home.join("deep/er/doc.txt")).unwrap(),
        b"contents"
    );
}

#[tokio::test]
async fn upload_accepts_the_file_part_before_the_path() {
    let a = AgentProcess::start().await;
    let form = reqwest::multipart::Form::new()
        .part(
            "file_data",
            reqwest::multipart::Part::bytes(b"early".to_vec()).file_name("x"),
        )
        .text("file_path", "~/late.txt");
    let r = reqwest::Client::new()
        .post(a.url("/setup/upload"))
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(std::fs::read(a.home.join("late.txt")).unwrap(), b"early");
    // Nothing is left in the staging area.
    let staged = std::fs::read_dir(a.state_dir.join("uploads"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(staged, 0);
}

#[tokio::test]
async fn upload_without_both_fields_is_400() {
    let a = AgentProcess::start().await;
    let form = reqwest::multipart::Form::new().text("file_path", "~/x");
    let r = reqwest::Client::new()
        .post(a.url("/setup/upload"))
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"error": "file_path and file_data are required"})
    );
    let r = reqwest::Client::new()
        .post(a.url("/setup/upload"))
        .json(&json!({"file_path": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
}

#[tokio::test]
async fn upload_into_an_impossible_place_is_500_and_leaves_nothing() {
    let a = AgentProcess::start().await;
    std::fs::write(a.home.join("plainfile"), "x").unwrap();
    let before = entries(&a.home);
    let form = reqwest::multipart::Form::new()
        .text("file_path", "~/plainfile/child.txt")
        .part(
            "file_data",
            reqwest::multipart::Part::bytes(vec![1, 2, 3]).file_name("f"),
        );
    let r = reqwest::Client::new()
        .post(a.url("/setup/upload"))
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 500);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .starts_with("Failed to upload file: "),
        "{v}"
    );
    assert_eq!(entries(&a.home), before);
    assert_eq!(entries(&a.state_dir.join("uploads")), Vec::<String>::new());
}

/// The names in `dir` (none when it does not exist), sorted.
fn entries(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// An agent whose home is a `size` tmpfs in its own mount namespace (only the agent sees it).
async fn agent_with_a_small_disk(size: &str) -> AgentProcess {
    let dir = tempfile::Builder::new()
        .prefix("berth-test-")
        .tempdir()
        .unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let wrapper = berth_tests::tmpfs_wrapper(&home, size);
    AgentProcess::start_in(
        dir,
        berth_tests::AgentOptions {
            wrapper,
            ..Default::default()
        },
    )
    .await
}

/// The names `/list_directory` sees in the agent's home.
async fn home_names(a: &AgentProcess) -> Vec<String> {
    let r = reqwest::Client::new()
        .post(a.url("/list_directory"))
        .json(&json!({"path": a.home}))
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    let mut names: Vec<String> = v["directory_tree"]["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn upload_onto_a_full_disk_is_the_errno_28_500_and_leaves_nothing() {
    let a = agent_with_a_small_disk("1m").await;
    let mut expected = home_names(&a).await;
    let upload = |path: &'static str, len: usize| {
        let form = reqwest::multipart::Form::new()
            .text("file_path", path)
            .part(
                "file_data",
                reqwest::multipart::Part::bytes(vec![7u8; len]).file_name("f"),
            );
        reqwest::Client::new()
            .post(a.url("/setup/upload"))
            .multipart(form)
            .send()
    };
    let r = upload("~/small.bin", 1000).await.unwrap();
    assert_eq!(r.status(), 200);
    // Four times the disk: the write fails part-way; the answer still reaches the client.
    let r = upload("~/big.bin", 4 << 20).await.unwrap();
    assert_eq!(r.status(), 500);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"error": "Failed to upload file: [Errno 28] No space left on device"})
    );
    expected.push("small.bin".into());
    expected.sort();
    assert_eq!(home_names(&a).await, expected);
}

#[tokio::test]
async fn upload_with_a_nul_in_the_path_is_400_and_stages_nothing() {
    let a = AgentProcess::start().await;
    let before = entries(&a.home);
    // Either order: the data part is dropped (before) or removed (after) the bad path.
    for data_first in [false, true] {
        let data = reqwest::multipart::Part::bytes(b"x".to_vec()).file_name("f");
        let form = reqwest::multipart::Form::new();
        let form = if data_first {
            form.part("file_data", data).text("file_path", "~/a\0b")
        } else {
            form.text("file_path", "~/a\0b").part("file_data", data)
        };
        let r = reqwest::Client::new()
            .post(a.url("/setup/upload"))
            .multipart(form)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400);
        assert_eq!(
            r.json::<Value>().await.unwrap(),
            json!({"error": "file_path contains a NUL byte"})
        );
    }
    assert_eq!(entries(&a.home), before);
    assert_eq!(entries(&a.state_dir.join("uploads")), Vec::<String>::new());
}

#[tokio::test]
async fn a_form_past_the_compat_limit_is_413() {
    let a = AgentProcess::start().await;
    // A `/file` form naming /etc/hostname, padded with a file part of `pad` bytes.
    let post = |pad: usize| {
        let form = reqwest::multipart::Form::new()
            .text("file_path", "/etc/hostname")
            .part(
                "pad",
                reqwest::multipart::Part::bytes(vec![b'x'; pad]).file_name("pad"),
            );
        reqwest::Client::new()
            .post(a.url("/file"))
            .multipart(form)
            .send()
    };
    let r = post(17 << 20).await.unwrap();
    assert_eq!(r.status(), 413);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"message": "the request body exceeds 16777216 bytes", "status": "error"})
    );
    // Under the limit, a form with a large file part is still read (the part is skipped).
    let r = post(4 << 20).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.bytes().await.unwrap(),
        std::fs::read("/etc/hostname").unwrap()
    );
}

#[tokio::test]
async fn a_large_upload_streams_to_disk_without_growing_the_agent() {
    // On tmpfs: this test is about the agent's memory, not the disk's speed.
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let a = AgentProcess::start_with(berth_tests::AgentOptions {
        home: Some(shm.path().join("home")),
        ..Default::default()
    })
    .await;
    let src = shm.path().join("big.bin");
    let len: u64 = 128 << 20;
    write_pattern_file(&src, len);
    let before = peak_rss_kib(a.pid());
    let file = tokio::fs::File::open(&src).await.unwrap();
    let part = reqwest::multipart::Part::stream_with_length(reqwest::Body::from(file), len)
        .file_name("big.bin");
    let form = reqwest::multipart::Form::new()
        .text("file_path", "~/big.bin")
        .part("file_data", part);
    let r = reqwest::Client::new()
        .post(a.url("/setup/upload"))
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.text().await.unwrap(),
        format!("File Uploaded: {len} bytes")
    );
    let grew = peak_rss_kib(a.pid()).saturating_sub(before);
    assert!(
        grew < 64 * 1024,
        "agent peak RSS grew by {grew} KiB for a {len}-byte upload"
    );
    assert!(files_equal(&src, &a.home.join("big.bin")));
}

fn files_equal(a: &std::path::Path, b: &std::path::Path) -> bool {
    use std::io::Read;
    let (mut fa, mut fb) = (
        std::fs::File::open(a).unwrap(),
        std::fs::File::open(b).unwrap(),
    );
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let na = fa.read(&mut ba).unwrap();
        let mut nb = 0;
        while nb < na {
            let n = fb.read(&mut bb[nb..na]).unwrap();
            if n == 0 {
                return false;
            }
            nb += n;
        }
        if na == 0 {
            return fb.read(&mut bb).unwrap() == 0;
        }
        if ba[..na] != bb[..na] {
            return false;
        }
    }
}

#[tokio::test]
async fn list_directory_builds_the_reference_tree() {
    let a = AgentProcess::start().await;
    let root = a.home.join("tree");
    std::fs::create_dir_all(root.join("sub/inner")).unwrap();
    std::fs::write(root.join("a.txt"), "").unwrap();
    std::fs::write(root.join("sub/b.txt"), "").unwrap();
    std::os::unix::fs::symlink(&root, root.join("sub/loop")).unwrap();
    let r = reqwest::Client::new()
        .post(a.url("/list_directory"))
        .json(&json!({"path": root}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let tree = &v["directory_tree"];
    assert_eq!(tree["type"], "directory");
    assert_eq!(tree["name"], "tree");
    let children = tree["children"].as_array().unwrap();
    assert!(children.contains(&json!({"type": "file", "name": "a.txt"})));
    let sub = children.iter().find(|c| c["name"] == "sub").unwrap();
    let sub_children = sub["children"].as_array().unwrap();
    assert!(sub_children.contains(&json!({"type": "directory", "name": "inner", "children": []})));
    // A symlink loop ends in an error node instead of crashing the server.
    assert!(sub_children.iter().any(|c| {
        c["error"]
            .as_str()
            .is_some_and(|e| e.contains("[Errno 40]"))
    }));
}

#[tokio::test]
async fn list_directory_errors_are_the_reference_bodies() {
    let a = AgentProcess::start().await;
    let http = reqwest::Client::new();
    let r = http
        .post(a.url("/list_directory"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"error": "Missing 'path' parameter"})
    );
    let r = http
        .post(a.url("/list_directory"))
        .json(&json!({"path": "/etc/hostname"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"error": "The provided path is not a directory"})
    );
    let r = http
        .post(a.url("/list_directory"))
        .json(&json!({"path": "/tmp\u{0}x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"error": "path contains a NUL byte"})
    );
}

#[tokio::test]
async fn desktop_path_is_404_until_the_desktop_dir_exists() {
    let a = AgentProcess::start().await;
    let http = reqwest::Client::new();
    let r = http.post(a.url("/desktop_path")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"error": "Unsupported operating system or desktop path not found"})
    );
    std::fs::create_dir(a.home.join("Desktop")).unwrap();
    let r = http.post(a.url("/desktop_path")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"desktop_path": a.home.join("Desktop")})
    );
}

/// A one-shot HTTP server on loopback serving `body` once per connection.
async fn serve_bytes(body: Vec<u8>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let _ = s.read(&mut buf).await;
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(&body).await;
            });
        }
    });
    format!("http://{addr}/file.bin")
}

#[tokio::test]
async fn download_file_fetches_a_url_into_place() {
    let a = AgentProcess::start().await;
    let url = serve_bytes(b"downloaded bytes".to_vec()).await;
    let r = reqwest::Client::new()
        .post(a.url("/setup/download_file"))
        .json(&json!({"url": url, "path": "~/dl/out.bin"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.text().await.unwrap(),
        "File downloaded successfully: 16 bytes"
    );
    assert_eq!(
        std::fs::read(a.home.join("dl/out.bin")).unwrap(),
        b"downloaded bytes"
    );
    let r = reqwest::Client::new()
        .post(a.url("/setup/download_file"))
        .json(&json!({"url": url}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(r.text().await.unwrap(), "Path or URL not supplied!");
    let r = reqwest::Client::new()
        .post(a.url("/setup/download_file"))
        .json(&json!({"url": "http://127.0.0.1:1/x", "path": "~/never"}))
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 500);
    let t = r.text().await.unwrap();
    assert!(
        t.starts_with("Failed to download http://127.0.0.1:1/x. No retries left. Error: "),
        "{t}"
    );
    assert!(!a.home.join("never").exists());
}

#[tokio::test]
async fn download_file_with_a_nul_in_the_path_is_400_before_any_attempt() {
    let a = AgentProcess::start().await;
    let before = entries(&a.home);
    let url = serve_bytes(b"never fetched".to_vec()).await;
    let r = reqwest::Client::new()
        .post(a.url("/setup/download_file"))
        .json(&json!({"url": url, "path": "~/a\u{0}b"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(r.headers()["content-type"], "text/html; charset=utf-8");
    assert_eq!(r.text().await.unwrap(), "path contains a NUL byte");
    assert_eq!(entries(&a.home), before);
}

#[tokio::test]
async fn open_file_with_a_nul_in_the_path_is_400_and_the_agent_lives() {
    let a = AgentProcess::start().await;
    std::fs::write(a.home.join("a"), b"x").unwrap();
    for path in ["~/a\0b", "true\0"] {
        let r = reqwest::Client::new()
            .post(a.url("/setup/open_file"))
            .json(&json!({ "path": path }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{path:?}");
        assert_eq!(
            r.json::<Value>().await.unwrap(),
            json!({"message": "path contains a NUL byte", "status": "error"})
        );
        assert!(berth_tests::pid_alive(a.pid()), "agent died on {path:?}");
    }
    assert!(a.client().commands().await.unwrap().commands.is_empty());
}

/// Posts `body` to `/setup/upload` over a raw connection declaring `content_length`; when
/// `close_write`, the write side is then closed (a client that stopped short). The status
/// and JSON body, or `None` if the connection closed without an answer.
async fn raw_upload(
    a: &AgentProcess,
    content_length: usize,
    body: &[u8],
    close_write: bool,
) -> Option<(u16, Value)> {
    raw_multipart(a, "/setup/upload", content_length, body, close_write).await
}

/// As `raw_upload`, to any compat route taking a multipart form.
async fn raw_multipart(
    a: &AgentProcess,
    route: &str,
    content_length: usize,
    body: &[u8],
    close_write: bool,
) -> Option<(u16, Value)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let head = format!(
        "POST {route} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
         Content-Type: multipart/form-data; boundary=XyZ\r\nContent-Length: {content_length}\r\n\r\n"
    );
    let mut s = tokio::net::TcpStream::connect(berth_tests::host_port(&a.base))
        .await
        .unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    if close_write {
        s.shutdown().await.unwrap();
    }
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut out))
        .await
        .expect("an answer or a close")
        .unwrap();
    let text = String::from_utf8_lossy(&out);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    Some((status, serde_json::from_str(body).unwrap_or(Value::Null)))
}

#[tokio::test]
async fn a_truncated_or_malformed_upload_is_400_and_stages_nothing() {
    let a = AgentProcess::start().await;
    let before = entries(&a.home);
    let path_part =
        "--XyZ\r\nContent-Disposition: form-data; name=\"file_path\"\r\n\r\n~/up.bin\r\n";
    let data_part = "--XyZ\r\nContent-Disposition: form-data; name=\"file_data\"; \
                     filename=\"f\"\r\nContent-Type: application/octet-stream\r\n\r\nsome bytes";
    let whole = format!("{path_part}{data_part}\r\n--XyZ--\r\n");
    // Multipart bodies cut short inside their declared length.
    for (name, body) in [
        ("ends in the data part", format!("{path_part}{data_part}")),
        ("ends in the path part", path_part[..40].to_string()),
        ("no closing boundary", format!("{path_part}{data_part}\r\n")),
    ] {
        let answer = raw_upload(&a, body.len(), body.as_bytes(), false).await;
        let (status, v) = answer.unwrap_or_else(|| panic!("{name}: no answer"));
        assert_eq!(status, 400, "{name}: {v}");
        assert_eq!(v["status"], "error", "{name}: {v}");
        assert!(v["message"].is_string(), "{name}: {v}");
        assert!(berth_tests::pid_alive(a.pid()), "agent died on {name}");
    }
    // A client that stops before its declared length and closes its side: hyper may drop the
    // connection unanswered (it does not keep half-closed connections), but an answer is a 400.
    for cut in [whole.len() - 20, 40] {
        if let Some((status, v)) = raw_upload(&a, whole.len(), &whole.as_bytes()[..cut], true).await
        {
            assert_eq!(status, 400, "cut at {cut}: {v}");
            assert_eq!(v["status"], "error", "cut at {cut}: {v}");
        }
        assert!(berth_tests::pid_alive(a.pid()), "agent died, cut at {cut}");
    }
    assert_eq!(entries(&a.home), before);
    assert_eq!(entries(&a.state_dir.join("uploads")), Vec::<String>::new());
    // A whole upload still works afterwards.
    let answer = raw_upload(&a, whole.len(), whole.as_bytes(), false).await;
    assert_eq!(answer.map(|(s, _)| s), Some(200));
    assert_eq!(std::fs::read(a.home.join("up.bin")).unwrap(), b"some bytes");
}

#[tokio::test]
async fn a_truncated_or_malformed_form_is_400_and_the_agent_lives() {
    let a = AgentProcess::start().await;
    std::fs::write(a.home.join("f.txt"), b"hello").unwrap();
    let path_part = "--XyZ\r\nContent-Disposition: form-data; name=\"file_path\"\r\n\r\n~/f.txt";
    let file_part = "--XyZ\r\nContent-Disposition: form-data; name=\"other\"; \
                     filename=\"f\"\r\nContent-Type: application/octet-stream\r\n\r\nbytes";
    // Multipart bodies cut short inside their declared length, and malformed ones.
    for (name, body) in [
        ("ends in the path value", path_part.to_string()),
        ("ends in the part headers", path_part[..40].to_string()),
        ("ends in a file part", format!("{file_part}\r\n")),
        ("no closing boundary", format!("{path_part}\r\n--XyZ\r\n")),
        (
            "a part without headers' end",
            "--XyZ\r\nContent-Disposition: form-data; name=\"file_path\"\r\n".to_string(),
        ),
    ] {
        let answer = raw_multipart(&a, "/file", body.len(), body.as_bytes(), false).await;
        let (status, v) = answer.unwrap_or_else(|| panic!("{name}: no answer"));
        assert_eq!(status, 400, "{name}: {v}");
        assert_eq!(v["status"], "error", "{name}: {v}");
        assert!(v["message"].is_string(), "{name}: {v}");
        assert!(berth_tests::pid_alive(a.pid()), "agent died on {name}");
    }
    // A client that stops before its declared length and closes its side (a 500 "failed to read
    // stream" before): hyper may drop such a connection unanswered, but these were answered,
    // and every answer must be a 400.
    let whole = format!("{path_part}\r\n--XyZ--\r\n");
    let mut answered = 0;
    for cut in [whole.len() - 10, 60, 30] {
        if let Some((status, v)) =
            raw_multipart(&a, "/file", whole.len(), &whole.as_bytes()[..cut], true).await
        {
            assert_eq!(status, 400, "cut at {cut}: {v}");
            assert_eq!(v["status"], "error", "cut at {cut}: {v}");
            assert!(v["message"].is_string(), "cut at {cut}: {v}");
            answered += 1;
        }
        assert!(berth_tests::pid_alive(a.pid()), "agent died, cut at {cut}");
    }
    assert!(answered > 0, "no cut-short form was answered");
    // A whole form still works afterwards.
    let answer = raw_multipart(&a, "/file", whole.len(), whole.as_bytes(), false).await;
    assert_eq!(answer.map(|(s, _)| s), Some(200));
}
