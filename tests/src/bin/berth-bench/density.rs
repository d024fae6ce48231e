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
//! `memory_merge = true` (the host's KSM is the host's to turn on). `--osworld` runs the GNOME
//! osworld image instead, each desktop with the page in its browser and a document open in
//! LibreOffice Writer, opened as OSWorld's task setups open one (`/setup/open_file` on the
//! sandbox's compat endpoint, answered once the document's window is up).

use std::process::Command;
use std::time::{Duration, Instant};

use berth_protocol::controller::{ControllerClient, RunRequest, Sandbox};
use berth_tests::controller::{
    ControllerProcess, build_desktop_image, build_image, desktop, shell,
};
use berth_tests::poll_until;
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

/// Writes a Word document (a heading, two paragraphs, a table) to `/tmp/density/report.docx`
/// with the sandbox's Python, as the files OSWorld's tasks open are: a `.docx` that the desktop's
/// file associations give to LibreOffice Writer.
const WRITE_DOCUMENT: &str = r#"import zipfile
W = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'
p = lambda t: '<w:p><w:r><w:t>%s</w:t></w:r></w:p>' % t
cell = lambda t: '<w:tc>%s</w:tc>' % p(t)
row = lambda *c: '<w:tr>%s</w:tr>' % ''.join(cell(x) for x in c)
body = (p('Quarterly report')
    + p('The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.')
    + p('How vexingly quick daft zebras jump. Sphinx of black quartz, judge my vow.')
    + '<w:tbl>' + row('region', 'q1', 'q2') + row('north', '12', '15') + '</w:tbl>')
with zipfile.ZipFile('/tmp/density/report.docx', 'w', zipfile.ZIP_DEFLATED) as z:
    z.writestr('[Content_Types].xml', '<?xml version="1.0" encoding="UTF-8"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types"><Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/><Default Extension="xml" ContentType="application/xml"/><Override PartName="/word/document.xml" ContentType="application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/></Types>')
    z.writestr('_rels/.rels', '<?xml version="1.0" encoding="UTF-8"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships"><Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument" Target="word/document.xml"/></Relationships>')
    z.writestr('word/document.xml', '<?xml version="1.0" encoding="UTF-8"?><w:document %s><w:body>%s</w:body></w:document>' % (W, body))
"#;

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

/// Runs `line` in the sandbox; an error unless it exits 0.
async fn run_ok(cl: &ControllerClient, sb: &Sandbox, line: &str) -> Result<(), String> {
    let run = cl
        .exec(&sb.id, &shell(line))
        .await
        .map_err(|e| e.to_string())?;
    match run.exit_code {
        Some(0) => Ok(()),
        _ => Err(format!(
            "`{}` ended {:?}",
            line.lines().next().unwrap_or(""),
            run.exit_code
        )),
    }
}

/// Serves the page inside the sandbox and opens it in its browser (a new tab over its CDP
/// endpoint); returns once the tab has the page, or why it did not within 30 s.
async fn open_page(cl: &ControllerClient, sb: &Sandbox, page: &str) -> Result<(), String> {
    let write =
        format!("mkdir -p /tmp/density && cat > /tmp/density/index.html <<'EOF'\n{page}\nEOF");
    run_ok(cl, sb, &write).await?;
    let serve = RunRequest {
        wait: Some(false),
        ..shell("exec python3 -m http.server 8000 --bind 127.0.0.1 --directory /tmp/density")
    };
    cl.exec(&sb.id, &serve).await.map_err(|e| e.to_string())?;
    let fetch = "python3 -c \"import urllib.request as u; u.urlopen('http://127.0.0.1:8000/')\"";
    poll_until(Duration::from_secs(30), || async {
        run_ok(cl, sb, fetch).await.ok()
    })
    .await
    .ok_or("the page's server did not answer within 30 s")?;
    let cdp = sb.endpoints.cdp.clone().ok_or("no CDP endpoint")?;
    let http = reqwest::Client::new();
    http.put(format!("{cdp}/json/new?http://127.0.0.1:8000/"))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    poll_until(Duration::from_secs(30), || async {
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
    })
    .await
    .ok_or_else(|| "the page was not in the browser within 30 s".to_string())
}

/// Writes the document into the sandbox and opens it as an OSWorld task's setup does
/// (`/setup/open_file` on the compat endpoint, which answers once its window is up).
async fn open_document(cl: &ControllerClient, sb: &Sandbox) -> Result<(), String> {
    let write = format!("mkdir -p /tmp/density && python3 - <<'EOF'\n{WRITE_DOCUMENT}EOF");
    run_ok(cl, sb, &write).await?;
    let compat = sb.endpoints.compat.clone().ok_or("no compat endpoint")?;
    let r = reqwest::Client::new()
        .post(format!("{compat}/setup/open_file"))
        .json(&json!({"path": "/tmp/density/report.docx"}))
        .timeout(Duration::from_secs(300))
        .send()
        .await
        .map_err(|e| format!("open_file: {e}"))?;
    let status = r.status();
    let body = r.text().await.unwrap_or_default();
    match status.is_success() {
        true => Ok(()),
        false => Err(format!("open_file: {status} {body}")),
    }
}

/// The first desktop's screen after its first rounds of input (its page and document open),
/// for a look at what an agent sees: `target/bench/density-first.png`.
async fn save_first_screen(cl: &ControllerClient, id: &str) {
    let png = cl.screenshot(id).await.unwrap();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("density-first.png");
    std::fs::write(&path, png).unwrap();
    eprintln!("the first desktop's screen: {}", path.display());
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

/// What the run is, on what host, and the table's head.
fn print_header(osworld: bool, animated: bool, memory_merge: bool, base_available: f64) {
    let (ksm_run, ksm_before) = ksm();
    let image = match osworld {
        true => "the GNOME osworld image",
        false => "the XFCE desktop image",
    };
    let page = match animated {
        true => "redrawing (10x a second)",
        false => "still",
    };
    let document = match osworld {
        true => " and a document open in LibreOffice Writer",
        false => "",
    };
    println!(
        "\n## density: Docker desktops ({image}), each with a {page} page{document}\n\
         host: {:.0} MB total, {base_available:.0} MB available at start, {} cores; KSM run={ksm_run} \
         ({ksm_before:.0} MB merged at start); memory_merge = {memory_merge}\n",
        meminfo_mb("MemTotal"),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "| desktops | ready ms | PSS MB/desktop | MemAvailable drop MB/desktop | screenshot after a move p50 / p99 ms | input p50 / p99 ms | MB available |"
    );
    println!("|---|---|---|---|---|---|---|");
}

pub async fn bench(max: usize, animated: bool, memory_merge: bool, osworld: bool) {
    let page = if animated { ANIMATED } else { STILL };
    let image = if osworld {
        build_image(&["--profile", "desktop", "--bundle", "osworld"])
    } else {
        build_desktop_image()
    }
    .expect("the image");
    let image = image["image_ref"].as_str().unwrap().to_string();
    let c = ControllerProcess::start(&format!(
        "docker_image = \"{image}\"\ncreate_timeout_secs = 300\nmemory_merge = {memory_merge}\n\
         [providers]\ndesktop = \"docker\"\n"
    ))
    .await;
    let cl = c.client();
    let base_available = meminfo_mb("MemAvailable");
    print_header(osworld, animated, memory_merge, base_available);
    let mut ids: Vec<String> = Vec::new();
    let stopped = loop {
        let t = Instant::now();
        let sb = match cl.create(&desktop()).await {
            Ok(sb) => sb,
            Err(e) => break format!("create {} failed: {e}", ids.len() + 1),
        };
        let ready_ms = t.elapsed().as_secs_f64() * 1000.0;
        ids.push(sb.id.clone());
        let opened = match open_page(&cl, &sb, page).await {
            Ok(()) if osworld => open_document(&cl, &sb).await,
            other => other,
        };
        if let Err(e) = opened {
            break format!("desktop {}: {e}", ids.len());
        }
        let mut row = latencies(&cl, &ids, 20.max(ids.len() * 2)).await;
        if ids.len() == 1 {
            save_first_screen(&cl, &sb.id).await;
        }
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
