//! The workstation benchmark: `berth-agent --desktop` on a 1920x1080 screen, started cold (fresh
//! state and home) several times: time from exec to strict readiness (`/v1/ready` 200: noVNC,
//! RFB through the relay, window manager and panel, Chromium's CDP and both relays), when each
//! component came up, the agent's resident memory once idle, and the desktop's proportional
//! memory (PSS, shared pages split fairly between processes).

use std::time::{Duration, Instant};

use berth_tests::{AgentOptions, AgentProcess};
use serde_json::Value;

fn pss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Pss:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

pub async fn bench(runs: usize) {
    let mut totals = Vec::new();
    let mut last: Option<(AgentProcess, Value, f64)> = None;
    for _ in 0..runs {
        drop(last.take());
        let t0 = Instant::now();
        let a = AgentProcess::start_with(AgentOptions {
            extra_args: vec![
                "--desktop".into(),
                "--cdp-listen".into(),
                "127.0.0.1:0".into(),
            ],
            ..Default::default()
        })
        .await;
        let r = a
            .client()
            .request(reqwest::Method::GET, "/v1/ready?wait=60s")
            .send()
            .await
            .unwrap();
        let took = t0.elapsed().as_secs_f64() * 1000.0;
        assert_eq!(r.status(), 200, "not ready");
        let report: Value = r.json().await.unwrap();
        totals.push(took);
        last = Some((a, report, took));
    }
    let (a, report, _) = last.unwrap();
    // Idle: nothing asks anything for a while but the agent's own readiness checks.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let agent_rss = berth_tests::rss_kib(a.pid());
    let (ours, peer, nodes) = accessibility(&a, runs).await;
    let mut pss = Vec::new();
    let comps = report["components"].as_object().unwrap();
    let mut total_pss = 0;
    for (name, c) in comps {
        let Some(pid) = c["pid"].as_u64() else {
            continue;
        };
        let pid = pid as u32;
        let mut tree = berth_tests::processes_with_root(pid);
        tree.push(pid);
        tree.sort();
        tree.dedup();
        let kib: u64 = tree.iter().map(|p| pss_kib(*p)).sum();
        total_pss += kib;
        pss.push((name.clone(), tree.len(), kib));
    }
    totals.sort_by(f64::total_cmp);
    println!();
    println!("`berth-agent --desktop`, 1920x1080, cold start (fresh state and home) x{runs}");
    println!("| measurement | value |");
    println!("|---|---|");
    println!(
        "| exec to strict-ready (`/v1/ready` 200), p50 | {:.0} ms |",
        percentile(&totals, 0.5)
    );
    println!(
        "| exec to strict-ready, slowest of {runs} | {:.0} ms |",
        totals.last().unwrap()
    );
    println!(
        "| agent RSS, idle with the desktop up | {:.1} MB |",
        agent_rss as f64 / 1024.0
    );
    println!(
        "| desktop PSS (every component's process tree) | {:.0} MB |",
        total_pss as f64 / 1024.0
    );
    println!(
        "| `/accessibility`, desktop + a page of ~{nodes} elements, p50 of {runs} | {:.0} ms (pyatspi + lxml as OSWorld does it, same desktop: {:.0} ms, {:.1}x) |",
        ours,
        peer,
        peer / ours
    );
    for (name, procs, kib) in pss {
        println!(
            "| PSS of {name} ({procs} processes) | {:.1} MB |",
            kib as f64 / 1024.0
        );
    }
}

/// `/accessibility` against OSWorld's way (pyatspi walked from Python, one thread per
/// application, lxml), on the same desktop with a local page of about 200 elements open.
/// Returns the two medians in milliseconds and the page's element count.
async fn accessibility(a: &AgentProcess, runs: usize) -> (f64, f64, usize) {
    let page = a.home.join("bench.html");
    let items: String = (0..190)
        .map(|i| format!("<li><a href='#l{i}'>link {i}</a></li>"))
        .collect();
    std::fs::write(
        &page,
        format!(
            "<!doctype html><title>bench</title><h1>Bench</h1><button>Go</button><ul>{items}</ul>"
        ),
    )
    .unwrap();
    let info = a.get_json("/v1/browser").await;
    let cdp = info["cdp_listen"].as_str().unwrap().to_string();
    reqwest::Client::new()
        .put(format!("http://{cdp}/json/new?file://{}", page.display()))
        .send()
        .await
        .unwrap();
    let fetch = || async {
        let t0 = Instant::now();
        let v: Value = reqwest::get(a.url("/accessibility"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        (
            t0.elapsed().as_secs_f64() * 1000.0,
            v["AT"].as_str().unwrap_or_default().to_string(),
        )
    };
    berth_tests::wait_for("the page in the tree", Duration::from_secs(30), || async {
        fetch().await.1.contains("link 189").then_some(())
    })
    .await;
    let mut ours = Vec::new();
    for _ in 0..runs {
        ours.push(fetch().await.0);
    }
    ours.sort_by(f64::total_cmp);
    let display = a.get_json("/v1/display").await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/pyatspi_tree.py");
    let out = std::process::Command::new("/usr/bin/python3")
        .arg(script)
        .arg(runs.to_string())
        .env("DISPLAY", display["display"].as_str().unwrap())
        .env(
            "DBUS_SESSION_BUS_ADDRESS",
            format!("unix:path={}", a.state_dir.join("session/bus").display()),
        )
        .env("HOME", &a.home)
        .output()
        .expect("python3-pyatspi (tests/setup.sh installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut peer: Vec<f64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.parse::<f64>().ok())
        .map(|s| s * 1000.0)
        .collect();
    peer.sort_by(f64::total_cmp);
    (percentile(&ours, 0.5), percentile(&peer, 0.5), 195)
}
