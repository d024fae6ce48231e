//! Artifacts through a real `berth serve`: files and directories published from a sandbox,
//! served by range and kept past the sandbox's deletion and a controller restart; run output
//! past the inline bound; retention; and (Docker, the desktop image) recordings published as
//! they stop and when their sandbox is deleted, ffprobe-valid after it is gone.

use std::io::Read;
use std::time::Duration;

use berth_protocol::controller::{ControllerClient, CreateSandbox};
use berth_tests::controller::{ControllerProcess, Provider, ide, shell};
use berth_tests::wait_for;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sha2::Digest;

fn sha256_hex(b: &[u8]) -> String {
    sha2::Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

async fn publish(cl: &ControllerClient, id: &str, body: Value) -> (StatusCode, Value) {
    let r = cl
        .request(
            Method::POST,
            &format!("/sandbox/sandboxes/v1/{id}/artifacts"),
        )
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn list(cl: &ControllerClient, query: &str) -> Vec<Value> {
    let r = cl
        .request(Method::GET, &format!("/sandbox/v1/artifacts{query}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{query}");
    let v: Value = r.json().await.unwrap();
    v["artifacts"].as_array().unwrap().clone()
}

async fn bytes(cl: &ControllerClient, id: &str) -> Vec<u8> {
    let r = cl
        .request(Method::GET, &format!("/sandbox/v1/artifacts/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap().to_vec()
}

async fn timeline_kinds(cl: &ControllerClient, id: &str) -> Vec<Value> {
    let ev = cl.events(id, 0).await.unwrap();
    ev["events"].as_array().unwrap().clone()
}

/// A directory in the sandbox with a random file, a text file and a tree.
const MAKE_FILES: &str = "set -e; d=$(mktemp -d); head -c 300000 /dev/urandom > $d/blob.bin; \
    printf 'hello artifact\\n' > $d/note.txt; mkdir -p $d/tree/sub/deeper; \
    printf one > $d/tree/a.txt; printf two > $d/tree/sub/b.txt; head -c 5000 /dev/urandom \
    > $d/tree/sub/deeper/c.bin; printf %s $d";

#[tokio::test]
async fn files_and_directories_are_published_served_by_range_and_outlive_their_sandbox() {
    let mut c = ControllerProcess::start(
        "artifact_max_file_bytes = 250000\nrun_output_inline_bytes = 4096\n",
    )
    .await;
    let cl = c.client();
    let sb = cl.create(&ide()).await.unwrap();
    let dir = cl.exec(&sb.id, &shell(MAKE_FILES)).await.unwrap();
    assert_eq!(dir.exit_code, Some(0), "{dir:?}");
    let dir = dir.stdout;

    // A file: its bytes, hash, type; served whole and by range.
    let (st, note) = publish(&cl, &sb.id, json!({"path": format!("{dir}/note.txt")})).await;
    assert_eq!(st, 201, "{note}");
    assert_eq!(note["name"], "note.txt");
    assert_eq!(note["kind"], "file");
    assert_eq!(note["content_type"], "text/plain");
    assert_eq!(note["size"], 15);
    assert_eq!(note["sandbox"], sb.id.as_str());
    assert_eq!(note["sha256"], sha256_hex(b"hello artifact\n"));
    assert!(note["id"].as_str().unwrap().starts_with("art_"));
    assert!(note["created_at"].as_str().unwrap().ends_with('Z'));
    let note_id = note["id"].as_str().unwrap().to_string();
    let r = cl
        .request(Method::GET, &format!("/sandbox/v1/artifacts/{note_id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let h = r.headers().clone();
    assert_eq!(h["content-type"], "text/plain");
    assert_eq!(h["content-length"], "15");
    assert_eq!(h["accept-ranges"], "bytes");
    assert_eq!(
        h["etag"].to_str().unwrap(),
        format!("\"{}\"", sha256_hex(b"hello artifact\n"))
    );
    assert!(
        h["content-disposition"]
            .to_str()
            .unwrap()
            .contains("filename=\"note.txt\""),
        "{h:?}"
    );
    assert_eq!(r.bytes().await.unwrap().as_ref(), b"hello artifact\n");
    let ranged = |range: &'static str| {
        cl.request(Method::GET, &format!("/sandbox/v1/artifacts/{note_id}"))
            .header("range", range)
            .send()
    };
    let r = ranged("bytes=6-13").await.unwrap();
    assert_eq!(r.status(), 206);
    assert_eq!(r.headers()["content-range"], "bytes 6-13/15");
    assert_eq!(r.bytes().await.unwrap().as_ref(), b"artifact");
    let r = ranged("bytes=-3").await.unwrap();
    assert_eq!(r.status(), 206);
    assert_eq!(r.bytes().await.unwrap().as_ref(), b"ct\n");
    let r = ranged("bytes=15-").await.unwrap();
    assert_eq!(r.status(), 416);
    assert_eq!(r.headers()["content-range"], "bytes */15");
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "range_not_satisfiable", "{e}");
    // A matching If-None-Match: not modified.
    let r = cl
        .request(Method::GET, &format!("/sandbox/v1/artifacts/{note_id}"))
        .header("if-none-match", h["etag"].clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 304);

    // A directory becomes a zip of its tree.
    let (st, tree) = publish(&cl, &sb.id, json!({"path": format!("{dir}/tree")})).await;
    assert_eq!(st, 201, "{tree}");
    assert_eq!(tree["name"], "tree.zip");
    assert_eq!(tree["kind"], "directory");
    assert_eq!(tree["content_type"], "application/zip");
    let zip_bytes = bytes(&cl, tree["id"].as_str().unwrap()).await;
    assert_eq!(zip_bytes.len() as u64, tree["size"].as_u64().unwrap());
    assert_eq!(sha256_hex(&zip_bytes), tree["sha256"]);
    let mut z = zip::ZipArchive::new(std::io::Cursor::new(zip_bytes)).unwrap();
    let mut names: Vec<String> = z.file_names().map(|n| n.unwrap().into_owned()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "a.txt",
            "sub/",
            "sub/b.txt",
            "sub/deeper/",
            "sub/deeper/c.bin"
        ]
    );
    let mut b = String::new();
    z.by_name("sub/b.txt")
        .unwrap()
        .read_to_string(&mut b)
        .unwrap();
    assert_eq!(b, "two");
    assert_eq!(z.by_name("sub/deeper/c.bin").unwrap().size(), 5000);

    // A named one in a run.
    let run = cl.exec(&sb.id, &shell("true")).await.unwrap();
    let (st, named) = publish(
        &cl,
        &sb.id,
        json!({"path": format!("{dir}/note.txt"), "run": run.id, "name": "renamed.md"}),
    )
    .await;
    assert_eq!(st, 201, "{named}");
    assert_eq!(named["run"], run.id.as_str());
    assert_eq!(named["name"], "renamed.md");
    assert_eq!(named["content_type"], "text/markdown");

    // Refusals, each with the error body.
    let bad = [
        (json!({"path": "relative/x"}), 400),
        (json!({"path": format!("{dir}/missing")}), 404),
        (
            json!({"path": format!("{dir}/note.txt"), "run": "no-such-run"}),
            404,
        ),
        (
            json!({"path": format!("{dir}/note.txt"), "name": "a/b"}),
            400,
        ),
        (
            json!({"path": format!("{dir}/note.txt"), "colour": "red"}),
            400,
        ),
        (json!({"path": format!("{dir}/blob.bin")}), 413),
    ];
    for (body, want) in bad {
        let (st, e) = publish(&cl, &sb.id, body.clone()).await;
        assert_eq!(st.as_u16(), want, "{body} → {e}");
        assert!(e["error"]["code"].is_string(), "{e}");
    }
    let (st, _) = publish(&cl, "sb_nope", json!({"path": "/tmp"})).await;
    assert_eq!(st, 404);
    let r = cl
        .request(Method::GET, "/sandbox/v1/artifacts?colour=red")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = cl
        .request(Method::GET, "/sandbox/v1/artifacts/art_nope")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(
        c.anonymous()
            .request(Method::GET, "/sandbox/v1/artifacts")
            .send()
            .await
            .unwrap()
            .status(),
        401
    );

    // Output past the inline bound: a preview in the record, the whole output an artifact.
    let big = cl.exec(&sb.id, &shell("seq 1 30000")).await.unwrap();
    let want: String = (1..=30000).map(|i| format!("{i}\n")).collect();
    let run_json: Value = serde_json::to_value(&big).unwrap();
    assert_eq!(run_json["truncated"], true, "{run_json}");
    assert!(
        big.stdout.len() <= 4096 && want.starts_with(&big.stdout),
        "{}",
        big.stdout.len()
    );
    assert!(!big.stdout.is_empty());
    let out_id = run_json["output_artifact"].as_str().unwrap().to_string();
    let out = list(&cl, &format!("?run={}", big.id)).await;
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0]["id"], out_id.as_str());
    assert_eq!(out[0]["kind"], "output");
    assert_eq!(out[0]["name"], format!("{}.log", big.id));
    assert!(
        out[0]["content_type"]
            .as_str()
            .unwrap()
            .starts_with("text/plain")
    );
    assert_eq!(bytes(&cl, &out_id).await, want.as_bytes());
    // Its preview: the first and last lines and the bytes between them.
    let p = big.output_preview.as_ref().expect("a preview of both ends");
    let lines = |a: usize, b: usize| -> String { (a..=b).map(|i| format!("{i}\n")).collect() };
    assert_eq!(p.bytes, want.len() as u64);
    assert_eq!(p.head, lines(1, 20));
    assert_eq!(p.tail, lines(29961, 30000));
    assert_eq!(
        p.omitted_bytes,
        (want.len() - p.head.len() - p.tail.len()) as u64
    );
    // The rest by range, as a pane asks for it.
    let from = p.head.len();
    let r = cl
        .request(Method::GET, &format!("/sandbox/v1/artifacts/{out_id}"))
        .header("range", format!("bytes={from}-{}", from + 99))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 206);
    assert_eq!(r.bytes().await.unwrap(), want.as_bytes()[from..from + 100]);
    // A small one stays inline.
    let small = cl.exec(&sb.id, &shell("echo small")).await.unwrap();
    let small_json = serde_json::to_value(&small).unwrap();
    assert_eq!(small.stdout, "small\n");
    assert!(small_json.get("output_artifact").is_none(), "{small_json}");
    assert!(small_json.get("output_preview").is_none(), "{small_json}");

    // Every artifact is on the timeline.
    let published: Vec<Value> = timeline_kinds(&cl, &sb.id)
        .await
        .into_iter()
        .filter(|e| e["kind"] == "artifact.published")
        .collect();
    assert_eq!(published.len(), 4, "{published:?}");
    assert_eq!(published[0]["artifact_id"], note_id.as_str());
    assert_eq!(published[0]["size"], 15);
    assert_eq!(published[0]["artifact_kind"], "file");

    // After the sandbox is deleted: listed, served, and its run's output paged from the artifact.
    cl.delete(&sb.id).await.unwrap();
    assert_eq!(cl.get(&sb.id).await.unwrap().status, "stopped");
    let all = list(&cl, &format!("?sandbox={}", sb.id)).await;
    assert_eq!(all.len(), 4);
    assert_eq!(bytes(&cl, &note_id).await, b"hello artifact\n");
    let paged = page_output(&cl, &sb.id, &big.id).await;
    assert_eq!(paged, want);
    let per_sandbox: Value = cl
        .request(
            Method::GET,
            &format!("/sandbox/sandboxes/v1/{}/artifacts", sb.id),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(per_sandbox["artifacts"].as_array().unwrap().len(), 4);

    // And after a controller restart.
    c.kill9();
    c.launch();
    let cl = c.client();
    let again = list(&cl, &format!("?sandbox={}", sb.id)).await;
    assert_eq!(again, all);
    assert_eq!(bytes(&cl, &out_id).await, want.as_bytes());
    assert_eq!(page_output(&cl, &sb.id, &big.id).await, want);

    // DELETE ends one: row, bytes, and an event.
    let r = cl
        .request(Method::DELETE, &format!("/sandbox/v1/artifacts/{note_id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = cl
        .request(Method::GET, &format!("/sandbox/v1/artifacts/{note_id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(list(&cl, &format!("?sandbox={}", sb.id)).await.len(), 3);
    let blobs = c.data_dir().join("artifacts/blobs");
    assert!(!blobs.join(&note_id).exists());
    assert!(blobs.join(&out_id).exists());
    assert!(
        timeline_kinds(&cl, &sb.id)
            .await
            .iter()
            .any(|e| e["kind"] == "artifact.deleted" && e["artifact_id"] == note_id.as_str())
    );
    let metrics = cl.metrics().await.unwrap();
    assert!(metrics.contains("berth_artifacts "), "{metrics}");
}

/// Every chunk of a run's output, paged from seq 0.
async fn page_output(cl: &ControllerClient, sandbox: &str, run: &str) -> String {
    let mut out = String::new();
    let mut seq = 0;
    for _ in 0..1000 {
        let page: Value = cl
            .request(
                Method::GET,
                &format!("/sandbox/sandboxes/v1/{sandbox}/runs/{run}/output?from_seq={seq}"),
            )
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let chunks = page["chunks"].as_array().unwrap();
        if chunks.is_empty() {
            return out;
        }
        for c in chunks {
            out.push_str(c["data"].as_str().unwrap());
        }
        let next = page["next_seq"].as_u64().unwrap();
        assert!(next > seq, "{page}");
        seq = next;
    }
    panic!("the output never ended");
}

#[tokio::test]
async fn retention_deletes_an_expired_artifact() {
    let c = ControllerProcess::start("artifact_retention_secs = 3\n").await;
    let cl = c.client();
    let sb = cl.create(&ide()).await.unwrap();
    let f = cl
        .exec(
            &sb.id,
            &shell("f=$(mktemp); printf kept > $f; printf %s $f"),
        )
        .await
        .unwrap()
        .stdout;
    let (st, a) = publish(&cl, &sb.id, json!({"path": f})).await;
    assert_eq!(st, 201, "{a}");
    let id = a["id"].as_str().unwrap().to_string();
    assert_eq!(bytes(&cl, &id).await, b"kept");
    wait_for(
        "retention to delete it",
        Duration::from_secs(30),
        || async { list(&cl, "").await.is_empty().then_some(()) },
    )
    .await;
    let r = cl
        .request(Method::GET, &format!("/sandbox/v1/artifacts/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    // The row goes with its event, at once; the bytes follow it.
    let blob = c.data_dir().join("artifacts/blobs").join(&id);
    let deleted: Vec<Value> = timeline_kinds(&cl, &sb.id)
        .await
        .into_iter()
        .filter(|e| e["kind"] == "artifact.deleted")
        .collect();
    assert_eq!(deleted.len(), 1, "{deleted:?}");
    assert_eq!(deleted[0]["reason"], "retention");
    wait_for("its bytes to go", Duration::from_secs(10), || async {
        (!blob.exists()).then_some(())
    })
    .await;
}

async fn recording_info(cl: &ControllerClient, sb: &str, rec: &str) -> Value {
    cl.request(
        Method::GET,
        &format!("/sandbox/sandboxes/v1/{sb}/v1/recordings/{rec}"),
    )
    .send()
    .await
    .unwrap()
    .json()
    .await
    .unwrap()
}

/// Moves the pointer until the recording has encoded at least `frames` pictures and lasts
/// `ms` (the screen changes each time, so each is a new picture).
async fn record_for(cl: &ControllerClient, sb: &str, rec: &str, ms: u64) {
    let mut i = 0u64;
    wait_for("the recording to run", Duration::from_secs(60), || {
        i += 1;
        let x = 100 + (i * 37) % 900;
        async move {
            let r = cl
                .request(
                    Method::POST,
                    &format!("/sandbox/sandboxes/v1/{sb}/computer"),
                )
                .json(&json!({"action": "mouse_move", "coordinate": [x, 200 + x / 3]}))
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success(), "{}", r.text().await.unwrap());
            let info = recording_info(cl, sb, rec).await;
            (info["duration_ms"].as_u64().unwrap_or(0) >= ms
                && info["frames_encoded"].as_u64().unwrap_or(0) >= 5)
                .then_some(())
        }
    })
    .await;
}

async fn start_recording(cl: &ControllerClient, sb: &str, id: &str) {
    let r = cl
        .request(
            Method::POST,
            &format!("/sandbox/sandboxes/v1/{sb}/v1/recordings"),
        )
        .json(&json!({"id": id, "fps": 10}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
}

/// The must-show: a recording in a Docker sandbox of the desktop image is published when it
/// stops, another left running is stopped and kept when the sandbox is deleted, and both
/// download as valid MP4s after the sandbox is gone.
#[tokio::test]
async fn docker_recordings_are_published_and_outlive_their_sandbox() {
    let c = ControllerProcess::start_on(Provider::Docker, "").await;
    let cl = c.client();
    let sb = cl
        .create(&CreateSandbox {
            profile: "desktop".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    start_recording(&cl, &sb.id, "first").await;
    record_for(&cl, &sb.id, "first", 2000).await;
    let r = cl
        .request(
            Method::POST,
            &format!("/sandbox/sandboxes/v1/{}/v1/recordings/first/stop", sb.id),
        )
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    // Published promptly, without asking.
    let first = wait_for(
        "the stopped recording's artifact",
        Duration::from_secs(20),
        || async {
            list(&cl, &format!("?sandbox={}", sb.id))
                .await
                .into_iter()
                .find(|a| a["source"] == "first")
        },
    )
    .await;
    assert_eq!(first["kind"], "recording");
    assert_eq!(first["name"], "first.mp4");
    assert_eq!(first["content_type"], "video/mp4");
    // A second one is left running when the sandbox is deleted.
    start_recording(&cl, &sb.id, "second").await;
    record_for(&cl, &sb.id, "second", 1500).await;
    cl.delete(&sb.id).await.unwrap();
    assert_eq!(cl.get(&sb.id).await.unwrap().status, "stopped");
    // The delete also keeps the episode (the pointer moves above were logged actions): only the
    // recordings are compared here.
    let kept: Vec<Value> = list(&cl, &format!("?sandbox={}", sb.id))
        .await
        .into_iter()
        .filter(|a| a["kind"] == "recording")
        .collect();
    let sources: Vec<&str> = kept.iter().filter_map(|a| a["source"].as_str()).collect();
    assert_eq!(sources, ["first", "second"], "{kept:?}");
    let dir = tempfile::tempdir().unwrap();
    for a in &kept {
        let mp4 = bytes(&cl, a["id"].as_str().unwrap()).await;
        assert_eq!(mp4.len() as u64, a["size"].as_u64().unwrap());
        assert_eq!(sha256_hex(&mp4), a["sha256"]);
        let path = dir.path().join(a["name"].as_str().unwrap());
        std::fs::write(&path, &mp4).unwrap();
        let p = berth_tests::video::probe(&path);
        assert_eq!(p.codec, "h264", "{}", a["name"]);
        assert!(p.duration > 1.0, "{}: {} s", a["name"], p.duration);
        assert!(
            p.frames.len() >= 5,
            "{}: {} frames",
            a["name"],
            p.frames.len()
        );
        // The video element's range requests work on it.
        let r = cl
            .request(
                Method::GET,
                &format!("/sandbox/v1/artifacts/{}", a["id"].as_str().unwrap()),
            )
            .header("range", "bytes=0-7")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 206);
        assert_eq!(r.headers()["content-type"], "video/mp4");
        assert_eq!(&r.bytes().await.unwrap()[4..8], b"ftyp");
    }
    let events = timeline_kinds(&cl, &sb.id).await;
    let published = events
        .iter()
        .filter(|e| e["kind"] == "artifact.published" && e["content_type"] == "video/mp4")
        .count();
    assert_eq!(published, 2, "{events:?}");
    // Published before the sandbox was deleted.
    let pos = |k: &str| events.iter().rposition(|e| e["kind"] == k).unwrap();
    assert!(pos("artifact.published") < pos("sandbox.deleted"));
}
