//! `/v1/files` and `/v1/fs/…` against a real agent and real files: streaming round trips far
//! past any body limit, Range, atomic replace, listing, errors that name path and reason, and
//! watching.

use std::time::Duration;

use berth_protocol::{EntryType, MkdirRequest, MoveRequest, WatchKind, WatchMessage};
use berth_tests::{AgentProcess, peak_rss_kib, write_pattern_file};
use futures_util::StreamExt;
use sha2_free::digest_file;
use tokio_tungstenite::tungstenite::Message;

/// A tiny content fingerprint (FNV-1a over the stream) so big files are compared without
/// holding them.
mod sha2_free {
    use std::io::Read;

    pub fn digest_file(p: &std::path::Path) -> (u64, u64) {
        let mut f = std::fs::File::open(p).unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let mut h: u64 = 0xcbf29ce484222325;
        let mut n = 0u64;
        loop {
            let k = f.read(&mut buf).unwrap();
            if k == 0 {
                return (h, n);
            }
            n += k as u64;
            for b in &buf[..k] {
                h ^= *b as u64;
                h = h.wrapping_mul(0x100000001b3);
            }
        }
    }
}

#[tokio::test]
async fn a_file_far_larger_than_any_body_limit_round_trips_streamed() {
    // On tmpfs: this test is about the agent's memory, not the disk's speed.
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let a = AgentProcess::start_with(berth_tests::AgentOptions {
        home: Some(shm.path().join("home")),
        ..Default::default()
    })
    .await;
    let c = a.client();
    let src = shm.path().join("src.bin");
    let len: u64 = 256 << 20;
    write_pattern_file(&src, len);
    let before = peak_rss_kib(a.pid());

    let body = reqwest::Body::from(tokio::fs::File::open(&src).await.unwrap());
    let up = c
        .upload("~/big/upload.bin", body, Some(0o640))
        .await
        .unwrap();
    assert_eq!(up.bytes, len);
    let stat = c.stat("~/big/upload.bin").await.unwrap();
    assert_eq!(stat.size, len);
    assert_eq!(stat.mode, 0o640);
    assert_eq!(stat.kind, EntryType::File);

    let resp = c.download("~/big/upload.bin").await.unwrap();
    assert_eq!(resp.headers()["content-length"], len.to_string().as_str());
    let dst = shm.path().join("dst.bin");
    let mut out = tokio::fs::File::create(&dst).await.unwrap();
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        tokio::io::AsyncWriteExt::write_all(&mut out, &chunk.unwrap())
            .await
            .unwrap();
    }
    drop(out);
    assert_eq!(digest_file(&src), digest_file(&dst));
    let grew = peak_rss_kib(a.pid()).saturating_sub(before);
    assert!(
        grew < 64 * 1024,
        "agent peak RSS grew by {grew} KiB moving 2 x {len} bytes"
    );
}

#[tokio::test]
async fn downloads_honour_range_requests() {
    let a = AgentProcess::start().await;
    std::fs::write(a.home.join("r.txt"), "0123456789").unwrap();
    let resp = a
        .client()
        .request(reqwest::Method::GET, "/v1/files")
        .query(&[("path", "~/r.txt")])
        .header("range", "bytes=2-5")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 206);
    assert_eq!(resp.headers()["content-range"], "bytes 2-5/10");
    assert_eq!(resp.text().await.unwrap(), "2345");
}

#[tokio::test]
async fn an_interrupted_upload_leaves_the_old_file_untouched() {
    let a = AgentProcess::start().await;
    let target = a.home.join("keep.txt");
    std::fs::write(&target, "original").unwrap();
    // Claim more bytes than are sent, then hang up.
    let addr = berth_tests::host_port(&a.base).to_string();
    let head = format!(
        "PUT /v1/files?path=~/keep.txt HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Length: 1000000\r\n\r\npartial",
        berth_tests::TOKEN
    );
    let temps = || {
        std::fs::read_dir(&a.home)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .count()
    };
    {
        use tokio::io::AsyncWriteExt;
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        s.write_all(head.as_bytes()).await.unwrap();
        berth_tests::wait_until("the upload to start", Duration::from_secs(10), || {
            temps() == 1
        });
        s.shutdown().await.unwrap();
    }
    berth_tests::wait_until(
        "the temp file to be cleaned",
        Duration::from_secs(10),
        || temps() == 0,
    );
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "original");
}

#[tokio::test]
async fn an_upload_onto_a_full_disk_is_507_naming_the_path_and_leaves_the_old_file() {
    let dir = tempfile::Builder::new()
        .prefix("berth-test-")
        .tempdir()
        .unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    // The home is a 1 MiB tmpfs only the agent sees: the test looks through the agent.
    let a = AgentProcess::start_in(
        dir,
        berth_tests::AgentOptions {
            wrapper: berth_tests::tmpfs_wrapper(&home, "1m"),
            ..Default::default()
        },
    )
    .await;
    let c = a.client();
    let names = || async {
        let mut names: Vec<String> = c
            .list("~", 1)
            .await
            .unwrap()
            .entries
            .into_iter()
            .map(|e| e.name)
            .collect();
        names.sort();
        names
    };
    c.upload("~/keep.txt", "original", None).await.unwrap();
    let before = names().await;
    // Four times the disk: the write fails part-way; the answer still reaches the client.
    let e = c
        .upload("~/keep.txt", vec![7u8; 4 << 20], None)
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(507), "{e}");
    assert_eq!(e.code(), Some("disk_full"));
    let target = home.join("keep.txt");
    assert!(
        e.to_string()
            .contains(&format!("{}: disk full", target.display())),
        "{e}"
    );
    assert_eq!(names().await, before);
    let kept = c
        .download("~/keep.txt")
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(kept, "original");
}

#[tokio::test]
async fn list_stat_mkdir_move_and_remove_work_and_fail_clearly() {
    let a = AgentProcess::start().await;
    let c = a.client();
    let made = c
        .mkdir(&MkdirRequest {
            path: "~/a/b/c".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(made.kind, EntryType::Dir);
    std::fs::write(a.home.join("a/b/file.txt"), "x").unwrap();
    let list = c.list("~/a", 3).await.unwrap();
    let names: Vec<(&str, u32)> = list
        .entries
        .iter()
        .map(|e| (e.name.as_str(), e.depth.unwrap()))
        .collect();
    assert_eq!(names, vec![("b", 1), ("c", 2), ("file.txt", 2)]);
    let moved = c
        .move_path(&MoveRequest {
            from: "~/a/b/file.txt".into(),
            to: "~/a/moved.txt".into(),
            overwrite: None,
        })
        .await
        .unwrap();
    assert_eq!(moved.name, "moved.txt");
    std::fs::write(a.home.join("a/other.txt"), "y").unwrap();
    let e = c
        .move_path(&MoveRequest {
            from: "~/a/other.txt".into(),
            to: "~/a/moved.txt".into(),
            overwrite: None,
        })
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(409));
    let e = c.remove("~/a", false).await.unwrap_err();
    assert_eq!(e.status(), Some(409));
    assert!(e.to_string().contains("not empty"));
    c.remove("~/a", true).await.unwrap();
    let e = c.stat("~/a").await.unwrap_err();
    assert_eq!(e.status(), Some(404));
    assert!(
        e.to_string()
            .contains(&a.home.join("a").display().to_string()),
        "{e}"
    );
    assert!(e.to_string().contains("not found"));
    let e = c.list("/etc/hostname", 1).await.unwrap_err();
    assert_eq!(e.status(), Some(400));
    assert!(e.to_string().contains("not a directory"));
    let e = c.download("/no/such").await.unwrap_err();
    assert_eq!(e.status(), Some(404));
    let e = c.download("~").await.unwrap_err();
    assert!(e.to_string().contains("is a directory"));
}

#[tokio::test]
async fn paths_with_nul_and_bad_parameters_are_400() {
    let a = AgentProcess::start().await;
    let c = a.client();
    assert_eq!(c.stat("a\0b").await.unwrap_err().status(), Some(400));
    assert_eq!(c.list("~", 0).await.unwrap_err().status(), Some(400));
    let r = c
        .request(reqwest::Method::GET, "/v1/fs/stat")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = c
        .request(reqwest::Method::PUT, "/v1/files")
        .query(&[("path", "~/x"), ("mode", "99z")])
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = c
        .request(reqwest::Method::GET, "/v1/fs/list?path=~&depth=many")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
}

#[tokio::test]
async fn permission_problems_name_the_path() {
    let a = AgentProcess::start().await;
    // Even root may not create files in sysfs.
    let e = a
        .client()
        .upload("/sys/kernel/berth-test", reqwest::Body::from("x"), None)
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(403), "{e}");
    assert_eq!(e.code(), Some("permission_denied"));
    assert!(
        e.to_string()
            .contains("/sys/kernel/berth-test: permission denied"),
        "{e}"
    );
}

#[tokio::test]
async fn watch_reports_changes_under_a_directory() {
    let a = AgentProcess::start().await;
    let c = a.client();
    std::fs::create_dir(a.home.join("watched")).unwrap();
    let mut ws = c
        .websocket("/v1/fs/watch?path=~/watched&recursive=true")
        .await
        .unwrap();
    let file = a.home.join("watched/new.txt");
    // The watch is armed once the upgrade completes; create until an event shows up.
    std::fs::write(&file, "hello").unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut kinds = Vec::new();
    while !kinds.contains(&WatchKind::Create) {
        let msg = tokio::time::timeout_at(deadline, ws.next())
            .await
            .expect("a watch event")
            .unwrap()
            .unwrap();
        if let Message::Text(t) = msg
            && let WatchMessage::Event { kind, paths } = serde_json::from_str(&t).unwrap()
        {
            assert!(
                paths
                    .iter()
                    .all(|p| p.starts_with(a.home.join("watched").to_str().unwrap()))
            );
            kinds.push(kind);
        }
    }
    std::fs::remove_file(&file).unwrap();
    loop {
        let msg = tokio::time::timeout_at(deadline, ws.next())
            .await
            .expect("a remove event")
            .unwrap()
            .unwrap();
        if let Message::Text(t) = msg
            && let WatchMessage::Event {
                kind: WatchKind::Remove,
                ..
            } = serde_json::from_str(&t).unwrap()
        {
            break;
        }
    }
    let e = c.websocket("/v1/fs/watch?path=~/nope").await.unwrap_err();
    assert!(e.to_string().contains("404"), "{e}");
}

#[tokio::test]
async fn uploads_are_on_the_timeline() {
    let a = AgentProcess::start().await;
    let c = a.client();
    c.upload("~/t.txt", reqwest::Body::from("abc"), None)
        .await
        .unwrap();
    let events = c.events(0).await.unwrap().events;
    let e = events.iter().find(|e| e.kind == "file.uploaded").unwrap();
    assert_eq!(e.data["bytes"], 3);
    assert_eq!(e.data["path"], a.home.join("t.txt").to_str().unwrap());
}
