//! `controller`: claim latency from a warm pool (p50/p99) and cold create-to-ready, for the
//! `ide` and `desktop` profiles, through a real `berth serve` with the process provider; beside
//! them the same agents started directly (what the controller adds) and the published targets.

use std::time::{Duration, Instant};

use berth_protocol::controller::CreateSandbox;
use berth_tests::controller::ControllerProcess;
use berth_tests::{AgentOptions, AgentProcess, wait_for};
use serde_json::Value;

use crate::pct;

async fn pools(c: &ControllerProcess) -> Vec<Value> {
    c.client().pools().await.unwrap()["pools"]
        .as_array()
        .unwrap()
        .clone()
}

async fn set_size(c: &ControllerProcess, profile: &str, size: usize) {
    c.client()
        .adjust_pool(profile, None, Some(size))
        .await
        .unwrap();
}

async fn wait_filled(c: &ControllerProcess, profile: &str, size: u64) {
    wait_for("the pool to fill", Duration::from_secs(180), || async {
        pools(c)
            .await
            .iter()
            .any(|p| p["profile"] == profile && p["ready"] == size && p["starting"] == 0)
            .then_some(())
    })
    .await;
}

/// Client-side create latencies (ms) and whether each was warm.
async fn creates(c: &ControllerProcess, profile: &str, n: usize) -> Vec<(f64, bool)> {
    let cl = c.client();
    let mut out = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        let sb = cl
            .create(&CreateSandbox {
                profile: profile.into(),
                ..Default::default()
            })
            .await
            .unwrap();
        out.push((
            t.elapsed().as_secs_f64() * 1000.0,
            sb.claim.as_deref() == Some("warm"),
        ));
        cl.delete(&sb.id).await.unwrap();
    }
    out
}

async fn direct_start(desktop: bool) -> f64 {
    let t = Instant::now();
    let a = AgentProcess::start_with(AgentOptions {
        extra_args: if desktop {
            vec!["--desktop".into()]
        } else {
            vec![]
        },
        ..Default::default()
    })
    .await;
    if desktop {
        let r = a
            .client()
            .request(reqwest::Method::GET, "/v1/ready?wait=60s")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    } else {
        a.client().healthz().await.unwrap();
    }
    t.elapsed().as_secs_f64() * 1000.0
}

pub async fn bench(runs: usize) {
    println!("\n== controller: claim latency and create-to-ready (process provider) ==");
    measure(runs, "", true).await;
    let image = berth_tests::controller::build_desktop_image()
        .ok()
        .and_then(|v| v["image_ref"].as_str().map(String::from));
    match image {
        Some(image) => {
            println!("\n== controller: the same on the Docker provider ({image}) ==");
            let docker = format!(
                "docker_image = \"{image}\"\n[providers]\ndesktop = \"docker\"\nide = \"docker\"\n"
            );
            measure(runs, &docker, false).await;
        }
        None => println!(
            "(no desktop image: `berth image build --profile desktop` for the Docker figures)"
        ),
    }
}

/// `config` is prepended to the pools; `direct`: also start agents directly for comparison.
async fn measure(runs: usize, config: &str, direct: bool) {
    let (head, tables) = match config.find("[providers]") {
        Some(i) => config.split_at(i),
        None => (config, ""),
    };
    let c = ControllerProcess::start(&format!(
        "{head}[[pools]]\nprofile = \"ide\"\nsize = 0\n[[pools]]\nprofile = \"desktop\"\nsize = 0\n{tables}"
    ))
    .await;
    // Cold: no member waits.
    let mut ide_cold: Vec<f64> = creates(&c, "ide", runs * 2)
        .await
        .iter()
        .map(|x| x.0)
        .collect();
    let mut desk_cold: Vec<f64> = creates(&c, "desktop", runs)
        .await
        .iter()
        .map(|x| x.0)
        .collect();
    let mut ide_direct = Vec::new();
    let mut desk_direct = Vec::new();
    for _ in 0..if direct { runs } else { 0 } {
        ide_direct.push(direct_start(false).await);
        desk_direct.push(direct_start(true).await);
    }
    let beside = |v: &mut Vec<f64>, what: &str| match v.is_empty() {
        true => String::new(),
        false => format!("| {what} started directly: p50 {:>7.1} ms", pct(v, 0.5)),
    };
    let ide_beside = beside(&mut ide_direct, "the agent");
    let desk_beside = beside(&mut desk_direct, "the agent --desktop");
    // Warm: claims from full pools, each claimed member replaced before the next round.
    let mut ide_warm = Vec::new();
    set_size(&c, "ide", 10).await;
    for _ in 0..5 {
        wait_filled(&c, "ide-ubuntu", 10).await;
        for (ms, warm) in creates(&c, "ide", 10).await {
            assert!(warm, "a claim from a full pool was cold");
            ide_warm.push(ms);
        }
    }
    let mut desk_warm = Vec::new();
    set_size(&c, "desktop", 2).await;
    for _ in 0..runs.div_ceil(2) {
        wait_filled(&c, "desktop-ubuntu", 2).await;
        for (ms, warm) in creates(&c, "desktop", 2).await {
            assert!(warm, "a claim from a full pool was cold");
            desk_warm.push(ms);
        }
    }
    set_size(&c, "ide", 0).await;
    set_size(&c, "desktop", 0).await;
    println!(
        "warm claim, ide ({} claims):      p50 {:>7.1} ms   p99 {:>7.1} ms   (targets: agent-sandbox roadmap 50 ms, Daytona < 90 ms)",
        ide_warm.len(),
        pct(&mut ide_warm, 0.5),
        pct(&mut ide_warm, 0.99)
    );
    println!(
        "warm claim, desktop ({} claims):   p50 {:>7.1} ms   p99 {:>7.1} ms   (strict /v1/ready probe at claim)",
        desk_warm.len(),
        pct(&mut desk_warm, 0.5),
        pct(&mut desk_warm, 0.99)
    );
    println!(
        "cold create-to-ready, ide:        p50 {:>7.1} ms   max {:>7.1} ms   {ide_beside}",
        pct(&mut ide_cold, 0.5),
        pct(&mut ide_cold, 1.0),
    );
    println!(
        "cold create-to-ready, desktop:    p50 {:>7.1} ms   max {:>7.1} ms   {desk_beside} (target 5 s; OSWorld's Docker provider polls up to 300 s)",
        pct(&mut desk_cold, 0.5),
        pct(&mut desk_cold, 1.0),
    );
}
