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
    for (name, procs, kib) in pss {
        println!(
            "| PSS of {name} ({procs} processes) | {:.1} MB |",
            kib as f64 / 1024.0
        );
    }
}
