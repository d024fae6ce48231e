//! `osworld`: the GNOME osworld image beside the XFCE desktop image on the Docker provider —
//! cold create-to-strict-ready through the controller, and a ready desktop's memory and idle CPU
//! (its container's cgroup) — then OSWorld's episode reset through `berth.osworld`
//! (`tests/bench/osworld_resets.py`: `DesktopEnv` from PyPI, stepped once and reset), cold and
//! from a warm pool, and `--envs N` envs resetting at once.

use std::process::Command;
use std::time::{Duration, Instant};

use berth_protocol::controller::CreateSandbox;
use berth_tests::controller::{API_KEY, ControllerProcess, Provider, build_image};
use serde_json::Value;

use crate::pct;

fn docker_exec(container: &str, cmd: &str) -> String {
    let out = Command::new("docker")
        .args(["exec", container, "sh", "-c", cmd])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The container's memory in use, page cache excluded (as `docker stats` counts it), from its
/// cgroup (v2, else v1).
fn memory_mb(container: &str) -> f64 {
    let out = docker_exec(
        container,
        "if [ -f /sys/fs/cgroup/memory.current ]; then cat /sys/fs/cgroup/memory.current; \
         grep '^inactive_file ' /sys/fs/cgroup/memory.stat; else \
         cat /sys/fs/cgroup/memory/memory.usage_in_bytes; \
         grep '^total_inactive_file ' /sys/fs/cgroup/memory/memory.stat; fi",
    );
    let mut lines = out.lines();
    let current: f64 = lines
        .next()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(0.0);
    let inactive: f64 = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0.0);
    (current - inactive) / 1e6
}

/// CPU the container used over `secs` of idling, in percent of one core (cgroup v2, else v1).
async fn idle_cpu(container: &str, secs: u64) -> f64 {
    let usage_us = || {
        let out = docker_exec(
            container,
            "if [ -f /sys/fs/cgroup/cpu.stat ]; then grep '^usage_usec ' /sys/fs/cgroup/cpu.stat \
             | cut -d' ' -f2; else echo $(( $(cat /sys/fs/cgroup/cpuacct/cpuacct.usage) / 1000 )); fi",
        );
        out.trim().parse::<f64>().unwrap_or(0.0)
    };
    let (u0, t0) = (usage_us(), Instant::now());
    tokio::time::sleep(Duration::from_secs(secs)).await;
    (usage_us() - u0) / (t0.elapsed().as_secs_f64() * 1e6) * 100.0
}

struct Desktop {
    cold_ms: Vec<f64>,
    memory_mb: f64,
    idle_cpu_pct: f64,
}

async fn desktop(image: &str, runs: usize) -> Desktop {
    let c = ControllerProcess::start_on(Provider::Docker, "").await;
    let cl = c.client();
    let mut cold_ms = Vec::new();
    let mut last = None;
    for i in 0..runs {
        let t = Instant::now();
        let sb = cl
            .create(&CreateSandbox {
                profile: "desktop".into(),
                image_ref: Some(image.into()),
                ..Default::default()
            })
            .await
            .unwrap();
        cold_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        if i + 1 < runs {
            cl.delete(&sb.id).await.unwrap();
        } else {
            last = Some(sb);
        }
    }
    let sb = last.unwrap();
    let container = format!("berth-{}", sb.id);
    // Settled: what starts after readiness (indexers, the shell's extensions) has run.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let idle_cpu_pct = idle_cpu(&container, 30).await;
    let memory_mb = memory_mb(&container);
    cl.delete(&sb.id).await.unwrap();
    Desktop {
        cold_ms,
        memory_mb,
        idle_cpu_pct,
    }
}

/// `resets` resets on each of `envs` envs through `berth.osworld`, with a pool of `pool`.
fn resets(
    image: &str,
    pool: usize,
    resets: usize,
    envs: usize,
) -> impl std::future::Future<Output = (Vec<f64>, f64)> {
    let image = image.to_string();
    async move {
        let config =
            format!("[[pools]]\nprofile = \"desktop\"\nimage_ref = \"{image}\"\nsize = {pool}\n");
        let c = ControllerProcess::start_on(Provider::Docker, &config).await;
        if pool > 0 {
            berth_tests::wait_for("the pool to fill", Duration::from_secs(300), || async {
                let p = c.client().pools().await.ok()?;
                p["pools"]
                    .as_array()?
                    .iter()
                    .any(|p| p["image_ref"] == image.as_str() && p["ready"] == pool as u64)
                    .then_some(())
            })
            .await;
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf();
        let out = tokio::process::Command::new("python3")
            .arg(root.join("bench/osworld_resets.py"))
            .args([
                &c.base,
                API_KEY,
                &image,
                &resets.to_string(),
                &envs.to_string(),
            ])
            .output()
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let v: Value = serde_json::from_str(text.lines().last().unwrap_or_default())
            .unwrap_or_else(|e| panic!("{e}: {text}\n{}", String::from_utf8_lossy(&out.stderr)));
        let times = v["resets"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_f64)
            .map(|s| s * 1000.0)
            .collect();
        (times, v["wall"].as_f64().unwrap_or(0.0))
    }
}

pub async fn bench(runs: usize, envs: usize) {
    let xfce = berth_tests::controller::build_desktop_image().unwrap()["image_ref"]
        .as_str()
        .unwrap()
        .to_string();
    let gnome = build_image(&["--profile", "desktop", "--bundle", "osworld"]).unwrap()["image_ref"]
        .as_str()
        .unwrap()
        .to_string();
    println!(
        "\n== osworld: the GNOME osworld image beside the XFCE desktop (Docker, {runs} cold creates each) =="
    );
    for (name, image) in [("XFCE desktop", &xfce), ("GNOME osworld", &gnome)] {
        let mut d = desktop(image, runs).await;
        println!(
            "{name:<14} create to strict-ready p50 {:>6.0} ms (max {:>6.0}) | memory {:>5.0} MB | idle CPU {:>4.1} % of a core",
            pct(&mut d.cold_ms, 0.5),
            pct(&mut d.cold_ms, 1.0),
            d.memory_mb,
            d.idle_cpu_pct
        );
    }
    println!("\n== osworld: DesktopEnv.reset through berth.osworld on the GNOME image ==");
    let (mut cold, _) = resets(&gnome, 0, runs, 1).await;
    let (mut warm, _) = resets(&gnome, 2, runs, 1).await;
    println!(
        "one env, no pool      reset p50 {:>6.0} ms (max {:>6.0})",
        pct(&mut cold, 0.5),
        pct(&mut cold, 1.0)
    );
    println!(
        "one env, pool of 2    reset p50 {:>6.0} ms (max {:>6.0})",
        pct(&mut warm, 0.5),
        pct(&mut warm, 1.0)
    );
    let (mut par, wall) = resets(&gnome, envs, 2, envs).await;
    println!(
        "{envs} envs at once, pool of {envs}: reset p50 {:>6.0} ms (max {:>6.0}), {} resets in {:.1} s",
        pct(&mut par, 0.5),
        pct(&mut par, 1.0),
        par.len(),
        wall
    );
}
