//! `density`: Docker desktops started one by one through a real `berth serve`, each
//! strict-ready with a page served inside it (`python3 -m http.server`) open in its Chromium,
//! until memory or latency gives out or `--max` is reached. For each count it prints the host
//! memory per desktop (the sum of every container process's PSS, and MemAvailable's drop), the
//! p50 of an input round trip (`/v1/input`, a pointer move) and of the `/screenshot` after it
//! (a changed screen), both through the controller as a client calls them, across every desktop
//! in turn, and the new desktop's create-to-ready while the others run. The page is a still
//! document, as an agent's task leaves most screens between its steps; `--animated` makes every
//! page redraw itself ten times a second instead (every desktop busy at once). KSM's state and
//! what it merged are printed before and after; `--memory-merge` starts the controller with
//! `memory_merge = true` (the host's KSM is the host's to turn on).

use std::process::Command;
use std::time::{Duration, Instant};

use berth_protocol::controller::{ControllerClient, CreateSandbox, RunRequest, Sandbox};
use berth_tests::controller::{ControllerProcess, build_desktop_image, shell};
use berth_tests::wait_for;
use serde_json::json;

use crate::percentiles;

/// A still page: a document's worth of text.
const STILL: &str = "<!doctype html><title>density</title><body style='font:18px serif;\
margin:40px'><h1>density</h1><p>The quick brown fox jumps over the lazy dog. \
Pack my box with five dozen liquor jugs. How vexingly quick daft zebras jump.</p>\
<ol><li>one<li>two<li>three</ol><table border=1><tr><td>a<td>b<td>c<tr><td>1<td>2<td>3\
</table>";

/// A page that redraws itself ten times a second.
const ANIMATED: &str = "<!doctype html><title>density</title><body style=margin:0>\
<div id=d style='font:bold 160px sans-serif;height:100vh'></div><script>\
let n=0;setInterval(()=>{n++;d.textContent=n;\
d.style.background='hsl('+(n*7%360)+',60%,70%)'},100)</script>";

/// Stop once less than this much memory is available.
const MEMORY_FLOOR_MB: f64 = 1024.0;
/// Stop once screenshots are this slow (p50).
const SCREENSHOT_CEILING_MS: f64 = 500.0;

/// `/proc/meminfo`'s `key`, in MB.
fn meminfo_mb(key: &str) -> f64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// KSM's `run` and the MB it saves now (`pages_sharing`).
fn ksm() -> (String, f64) {
    let read = |f: &str| std::fs::read_to_string(format!("/sys/kernel/mm/ksm/{f}")).ok();
    let run = read("run").map_or("absent".into(), |r| r.trim().to_string());
    let sharing: f64 = read("pages_sharing")
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0.0);
    (run, sharing * 4096.0 / 1e6)
}

/// The PSS of every process of a sandbox's container, in MB (host pids from `docker top`).
fn container_pss_mb(sandbox_id: &str) -> f64 {
    let out = Command::new("docker")
        .args(["top", &format!("berth-{sandbox_id}"), "-eo", "pid"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    out.lines()
        .skip(1)
        .filter_map(|l| l.trim().parse::<u32>().ok())
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok())
        .filter_map(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Pss:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        })
        .sum::<f64>()
        / 1024.0
}

/// Serves the page inside the sandbox and opens it in its browser (a new tab over its CDP
/// endpoint); returns once the tab has the page.
async fn open_page(cl: &ControllerClient, sb: &Sandbox, page: &str) {
    let write =
        format!("mkdir -p /tmp/density && cat > /tmp/density/index.html <<'EOF'\n{page}\nEOF");
    let run = cl.exec(&sb.id, &shell(&write)).await.unwrap();
    assert_eq!(run.exit_code, Some(0), "{run:?}");
    let serve = RunRequest {
        wait: Some(false),
        ..shell("exec python3 -m http.server 8000 --bind 127.0.0.1 --directory /tmp/density")
    };
    cl.exec(&sb.id, &serve).await.unwrap();
    wait_for("the page's server", Duration::from_secs(30), || async {
        let r = cl
            .exec(
                &sb.id,
                &shell("python3 -c \"import urllib.request as u; u.urlopen('http://127.0.0.1:8000/')\""),
            )
            .await
            .ok()?;
        (r.exit_code == Some(0)).then_some(())
    })
    .await;
    let cdp = sb.endpoints.cdp.clone().expect("a desktop's CDP endpoint");
    let http = reqwest::Client::new();
    http.put(format!("{cdp}/json/new?http://127.0.0.1:8000/"))
        .send()
        .await
        .unwrap();
    wait_for(
        "the page in the browser",
        Duration::from_secs(30),
        || async {
            let list: serde_json::Value = http
                .get(format!("{cdp}/json/list"))
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            list.as_array()?
                .iter()
                .any(|t| t["title"] == "density")
                .then_some(())
        },
    )
    .await;
}

/// One count's figures.
struct Row {
    n: usize,
    ready_ms: f64,
    pss_mb: f64,
    available_drop_mb: f64,
    shot: (f64, f64),
    input: (f64, f64),
    available_mb: f64,
}

/// Screenshots and input round trips across every desktop, round robin, through the controller.
async fn latencies(cl: &ControllerClient, ids: &[String], rounds: usize) -> Row {
    let (mut shots, mut inputs) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        let id = &ids[i % ids.len()];
        let body = json!({"actions": [{"type": "move", "x": 300 + (i % 500) as i32, "y": 400}]});
        let t = Instant::now();
        let r = cl
            .agent(id)
            .request(reqwest::Method::POST, "/v1/input")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.status());
        r.bytes().await.unwrap();
        inputs.push(t.elapsed());
        let t = Instant::now();
        let png = cl.screenshot(id).await.unwrap();
        shots.push(t.elapsed());
        assert_eq!(&png[1..4], b"PNG");
    }
    Row {
        n: ids.len(),
        ready_ms: 0.0,
        pss_mb: 0.0,
        available_drop_mb: 0.0,
        shot: percentiles(shots),
        input: percentiles(inputs),
        available_mb: meminfo_mb("MemAvailable"),
    }
}

fn print_row(r: &Row) {
    println!(
        "| {:>3} | {:>8.0} | {:>7.0} | {:>8.0} | {:>6.1} / {:>6.1} | {:>6.1} / {:>6.1} | {:>7.0} |",
        r.n,
        r.ready_ms,
        r.pss_mb,
        r.available_drop_mb,
        r.shot.0,
        r.shot.1,
        r.input.0,
        r.input.1,
        r.available_mb
    );
}

/// Why the next desktop is not started (`None`: go on).
fn stop_reason(r: &Row, max: usize) -> Option<String> {
    if r.available_mb < MEMORY_FLOOR_MB {
        return Some(format!(
            "memory: {:.0} MB available, under the {MEMORY_FLOOR_MB:.0} MB floor",
            r.available_mb
        ));
    }
    if r.shot.0 > SCREENSHOT_CEILING_MS {
        return Some(format!(
            "latency: screenshot p50 {:.0} ms, over {SCREENSHOT_CEILING_MS:.0} ms",
            r.shot.0
        ));
    }
    (r.n >= max).then(|| format!("--max {max} reached"))
}

pub async fn bench(max: usize, animated: bool, memory_merge: bool) {
    let page = if animated { ANIMATED } else { STILL };
    let image = build_desktop_image().expect("the desktop image");
    let image = image["image_ref"].as_str().unwrap().to_string();
    let c = ControllerProcess::start(&format!(
        "docker_image = \"{image}\"\ncreate_timeout_secs = 300\nmemory_merge = {memory_merge}\n\
         [providers]\ndesktop = \"docker\"\n"
    ))
    .await;
    let cl = c.client();
    let (ksm_run, ksm_before) = ksm();
    let base_available = meminfo_mb("MemAvailable");
    println!(
        "\n## density: Docker desktops, each with a {} page\n\
         host: {:.0} MB total, {base_available:.0} MB available at start, {} cores; KSM run={ksm_run} \
         ({ksm_before:.0} MB merged at start); memory_merge = {memory_merge}\n",
        if animated {
            "redrawing (10x a second)"
        } else {
            "still"
        },
        meminfo_mb("MemTotal"),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "| desktops | ready ms | PSS MB/desktop | MemAvailable drop MB/desktop | screenshot after a move p50 / p99 ms | input p50 / p99 ms | MB available |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut ids: Vec<String> = Vec::new();
    let stopped = loop {
        let t = Instant::now();
        let sb = match cl
            .create(&CreateSandbox {
                profile: "desktop".into(),
                ..Default::default()
            })
            .await
        {
            Ok(sb) => sb,
            Err(e) => break format!("create {} failed: {e}", ids.len() + 1),
        };
        let ready_ms = t.elapsed().as_secs_f64() * 1000.0;
        ids.push(sb.id.clone());
        open_page(&cl, &sb, page).await;
        let mut row = latencies(&cl, &ids, 20.max(ids.len() * 2)).await;
        let pss: f64 = ids.iter().map(|id| container_pss_mb(id)).sum();
        row.ready_ms = ready_ms;
        row.pss_mb = pss / ids.len() as f64;
        row.available_drop_mb = (base_available - row.available_mb) / ids.len() as f64;
        print_row(&row);
        if let Some(why) = stop_reason(&row, max) {
            break why;
        }
    };
    let (_, ksm_after) = ksm();
    println!(
        "\nstopped at {} desktops: {stopped}; KSM merged {ksm_after:.0} MB at the end",
        ids.len()
    );
    for id in &ids {
        let _ = cl.delete(id).await;
    }
}
