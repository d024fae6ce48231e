//! `coldstart`: where a cold desktop's create-to-ready goes. Desktops created one at a time
//! through a real `berth serve` (no pool), on the process provider and on Docker with the
//! desktop image; each create is timed as the client sees it, and its timeline says when each
//! step was reached: the Docker container's start (`docker inspect`), then every component's
//! `component.up`, then `sandbox.ready`, each as an offset from `sandbox.created`. The p50 of
//! every step is printed per provider, side by side.

use std::collections::BTreeMap;
use std::time::Instant;

use berth_tests::controller::{ControllerProcess, build_desktop_image, desktop};
use serde_json::Value;

/// Milliseconds since the epoch of an RFC 3339 time.
fn ms(at: &str) -> Option<f64> {
    berth_tests::epoch_ms(at).map(|t| t as f64)
}

fn p50(v: &[f64]) -> f64 {
    crate::pct(&mut v.to_vec(), 0.5)
}

/// One create's steps: name → ms after `sandbox.created`.
type Steps = BTreeMap<String, f64>;

/// When the Docker container of `id` started, in ms since the epoch.
fn container_started(id: &str) -> Option<f64> {
    let out = std::process::Command::new("docker")
        .args([
            "inspect",
            "-f",
            "{{.State.StartedAt}}",
            &format!("berth-{id}"),
        ])
        .output()
        .ok()?;
    ms(String::from_utf8_lossy(&out.stdout).trim())
}

async fn one(c: &ControllerProcess, docker: bool) -> (f64, Steps) {
    let cl = c.client();
    let t = Instant::now();
    let sb = cl.create(&desktop()).await.unwrap();
    let total = t.elapsed().as_secs_f64() * 1000.0;
    let started = if docker {
        container_started(&sb.id)
    } else {
        None
    };
    let v = cl.events(&sb.id, 0).await.unwrap();
    let events = v["events"].as_array().cloned().unwrap_or_default();
    let at = |e: &Value| e["at"].as_str().and_then(ms);
    let created = events
        .iter()
        .find(|e| e["kind"] == "sandbox.created")
        .and_then(at)
        .expect("a sandbox.created event");
    let mut steps = Steps::new();
    if let Some(s) = started {
        steps.insert("container started".into(), s - created);
    }
    for e in &events {
        let Some(t) = at(e) else { continue };
        let name = match e["kind"].as_str() {
            Some("component.up") => format!("up: {}", e["component"].as_str().unwrap_or("?")),
            Some("sandbox.ready") => "sandbox.ready".into(),
            _ => continue,
        };
        steps.entry(name).or_insert(t - created);
    }
    cl.delete(&sb.id).await.unwrap();
    (total, steps)
}

async fn measure(
    runs: usize,
    config: &str,
    docker: bool,
) -> (Vec<f64>, BTreeMap<String, Vec<f64>>) {
    let c = ControllerProcess::start(config).await;
    // One create first, not counted: the first start of anything reads it from disk.
    one(&c, docker).await;
    let mut totals = Vec::new();
    let mut steps: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for _ in 0..runs {
        let (total, s) = one(&c, docker).await;
        totals.push(total);
        for (k, v) in s {
            steps.entry(k).or_default().push(v);
        }
    }
    (totals, steps)
}

pub async fn bench(runs: usize, process_only: bool) {
    println!(
        "\n== coldstart: a cold desktop's create-to-ready, step by step ({runs} creates each) =="
    );
    let process = measure(runs, "", false).await;
    let image = match process_only {
        true => None,
        false => build_desktop_image()
            .ok()
            .and_then(|v| v["image_ref"].as_str().map(String::from)),
    };
    let docker = match &image {
        Some(image) => Some(
            measure(
                runs,
                &format!("docker_image = \"{image}\"\n[providers]\ndesktop = \"docker\"\n"),
                true,
            )
            .await,
        ),
        None if process_only => None,
        None => {
            println!("(no desktop image: `berth image build --profile desktop` for Docker)");
            None
        }
    };
    let mut names: std::collections::BTreeSet<&String> = process.1.keys().collect();
    if let Some(d) = &docker {
        names.extend(d.1.keys());
    }
    let mut names: Vec<&String> = names.into_iter().collect();
    // In the order reached (Docker's when there).
    let order = |n: &String| {
        docker
            .as_ref()
            .and_then(|d| d.1.get(n))
            .or_else(|| process.1.get(n))
            .map_or(f64::MAX, |v| p50(v))
    };
    names.sort_by(|a, b| order(a).total_cmp(&order(b)));
    let cell = |m: &BTreeMap<String, Vec<f64>>, n: &String| {
        m.get(n)
            .map_or("-".to_string(), |v| format!("{:.0} ms", p50(v)))
    };
    println!(
        "{:<28} {:>12} {:>12}",
        "step (p50 after created)", "process", "docker"
    );
    for n in names {
        println!(
            "{:<28} {:>12} {:>12}",
            n,
            cell(&process.1, n),
            docker.as_ref().map_or("-".into(), |d| cell(&d.1, n))
        );
    }
    let total = |v: &[f64]| {
        let mut s = v.to_vec();
        format!("{:.0} ms (max {:.0})", p50(&s), crate::pct(&mut s, 1.0))
    };
    println!(
        "{:<28} {:>12} {:>12}   (targets: process 1.5 s, Docker 3 s)",
        "create → ready, client",
        total(&process.0),
        docker.as_ref().map_or("-".into(), |d| total(&d.0))
    );
}
