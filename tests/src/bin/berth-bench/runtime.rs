//! `runtime`: what a second kernel costs. Sandboxes of the `ide` profile on Docker (the desktop
//! image without its desktop), through a real `berth serve`, under the daemon's default
//! runtime (runc) and under gVisor (`[runtime] ide = "runsc"`) in the same run, side by side:
//! create → ready as the client sees it (one at a time, the first of each not counted), an exec
//! round trip through the controller, a 1 MiB file up and down through the controller, and the
//! container's memory once ready (`docker stats`).

use std::time::{Duration, Instant};

use berth_protocol::controller::{Command, RunRequest};
use berth_tests::controller::{ControllerProcess, Provider, ide};

struct Figures {
    create: Vec<Duration>,
    exec: Vec<Duration>,
    upload: Vec<Duration>,
    download: Vec<Duration>,
    memory_mib: Vec<f64>,
}

/// A container's memory use in MiB (`docker stats`' first figure).
fn memory_mib(container: &str) -> Option<f64> {
    let out = std::process::Command::new("docker")
        .args([
            "stats",
            "--no-stream",
            "--format",
            "{{.MemUsage}}",
            container,
        ])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let used = text.split('/').next()?.trim();
    let (num, unit) = used.split_at(used.find(|c: char| c.is_ascii_alphabetic())?);
    let n: f64 = num.parse().ok()?;
    Some(match unit {
        "GiB" => n * 1024.0,
        "KiB" => n / 1024.0,
        "B" => n / (1024.0 * 1024.0),
        _ => n,
    })
}

async fn measure(config: &str, runs: usize, requests: usize) -> Result<Figures, String> {
    let c = ControllerProcess::start_on(Provider::Docker, config).await;
    let cl = c.client();
    let mut f = Figures {
        create: Vec::new(),
        exec: Vec::new(),
        upload: Vec::new(),
        download: Vec::new(),
        memory_mib: Vec::new(),
    };
    let mut kept = None;
    for i in 0..=runs {
        let t = Instant::now();
        let sb = cl.create(&ide()).await.map_err(|e| e.to_string())?;
        if i > 0 {
            f.create.push(t.elapsed());
        }
        if let Some(m) = memory_mib(&format!("berth-{}", sb.id)) {
            f.memory_mib.push(m);
        }
        match kept {
            None => kept = Some(sb.id),
            Some(_) => {
                cl.delete(&sb.id).await.map_err(|e| e.to_string())?;
            }
        }
    }
    let id = kept.expect("one sandbox kept");
    let echo = RunRequest {
        command: Command::Argv(vec!["echo".into(), "hi".into()]),
        ..Default::default()
    };
    for _ in 0..requests {
        let t = Instant::now();
        let run = cl.exec(&id, &echo).await.map_err(|e| e.to_string())?;
        f.exec.push(t.elapsed());
        if run.stdout != "hi\n" {
            return Err(format!("echo answered {run:?}"));
        }
    }
    let agent = cl.agent(&id);
    let body = vec![42u8; 1 << 20];
    for _ in 0..requests.min(50) {
        let t = Instant::now();
        agent
            .upload("~/bench.bin", reqwest::Body::from(body.clone()), None)
            .await
            .map_err(|e| e.to_string())?;
        f.upload.push(t.elapsed());
        let t = Instant::now();
        let got = agent
            .download("~/bench.bin")
            .await
            .map_err(|e| e.to_string())?
            .bytes()
            .await
            .map_err(|e| e.to_string())?;
        f.download.push(t.elapsed());
        if got.len() != body.len() {
            return Err(format!("{} bytes came back", got.len()));
        }
    }
    cl.delete(&id).await.map_err(|e| e.to_string())?;
    Ok(f)
}

pub async fn bench(runs: usize, requests: usize) {
    println!(
        "\n== runtime: ide sandboxes under runc and under gVisor (runsc), side by side \
         ({runs} creates, {requests} execs each) =="
    );
    let runc = measure("", runs, requests).await;
    let runsc = measure("[runtime]\nide = \"runsc\"\n", runs, requests).await;
    let (runc, runsc) = match (runc, runsc) {
        (Ok(a), Ok(b)) => (a, b),
        (a, b) => {
            println!(
                "(not measured: runc {:?}, runsc {:?}; tests/setup.sh registers runsc)",
                a.err(),
                b.err()
            );
            return;
        }
    };
    let pp = |v: &[Duration]| {
        let (p50, p99) = crate::percentiles(v.to_vec());
        format!("{p50:.1} / {p99:.1} ms")
    };
    let mem = |v: &[f64]| {
        let mut v = v.to_vec();
        format!("{:.0} MiB", crate::pct(&mut v, 0.5))
    };
    println!(
        "{:<34} {:>20} {:>20}",
        "p50 / p99", "runc", "runsc (gVisor)"
    );
    for (what, a, b) in [
        ("create -> ready", &runc.create, &runsc.create),
        ("exec `echo hi` via the controller", &runc.exec, &runsc.exec),
        ("1 MiB file up", &runc.upload, &runsc.upload),
        ("1 MiB file down", &runc.download, &runsc.download),
    ] {
        println!("{what:<34} {:>20} {:>20}", pp(a), pp(b));
    }
    println!(
        "{:<34} {:>20} {:>20}",
        "memory once ready (p50)",
        mem(&runc.memory_mib),
        mem(&runsc.memory_mib)
    );
}
