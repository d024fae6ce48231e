//! The workstation benchmark: `berth-agent --desktop` on a 1920x1080 screen, started cold (fresh
//! state and home) several times: time from exec to strict readiness (`/v1/ready` 200: noVNC,
//! RFB through the relay, window manager and panel, Chromium's CDP and both relays), when each
//! component came up, the agent's resident memory and CPU once idle, and the desktop's
//! proportional memory (PSS, shared pages split fairly between processes). Each figure is printed
//! beside its target or its peer measured in the same run: the raw start of Xvnc, xfwm4 and
//! Chromium, each started alone and timed until it is usable.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
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
    let mut last: Option<(AgentProcess, Value)> = None;
    for _ in 0..runs {
        drop(last.take());
        let (a, report, took) = cold_start().await;
        totals.push(took);
        last = Some((a, report));
    }
    let (a, report) = last.unwrap();
    // Idle: nothing asks anything but the agent's own readiness checks (every 5 s).
    let idle = Duration::from_secs(30);
    let cpu_before = cpu_ticks(a.pid());
    tokio::time::sleep(idle).await;
    let agent_cpu = (cpu_ticks(a.pid()) - cpu_before) as f64 / clock_ticks() / idle.as_secs_f64();
    let agent_rss = berth_tests::rss_kib(a.pid());
    let (ours, peer, nodes) = accessibility(&a, runs).await;
    let terminal = terminal(&a, runs.max(20)).await;
    let raw = raw_starts(runs).await;
    let (pss, total_pss) = desktop_pss(&report);
    totals.sort_by(f64::total_cmp);
    println!();
    println!("`berth-agent --desktop`, 1920x1080, cold start (fresh state and home) x{runs}");
    println!("| measurement | value | target / peer (same run) |");
    println!("|---|---|---|");
    let [xvnc, xfwm4, chromium] = raw.map(|v| percentile(&v, 0.5));
    println!(
        "| exec to strict-ready (`/v1/ready` 200), p50 of {runs} | {:.0} ms | target ≤ 4000 ms; raw starts, each alone, p50 of {runs}: Xvnc {xvnc:.0} ms, xfwm4 {xfwm4:.0} ms, Chromium to a DevTools answer {chromium:.0} ms (sum {:.0} ms) |",
        percentile(&totals, 0.5),
        xvnc + xfwm4 + chromium
    );
    println!(
        "| exec to strict-ready, slowest of {runs} | {:.0} ms | target ≤ 4000 ms |",
        totals.last().unwrap()
    );
    println!(
        "| agent RSS, idle with the desktop up | {:.1} MB | target ≤ 30 MB |",
        agent_rss as f64 / 1024.0
    );
    println!(
        "| agent CPU, idle with the desktop up ({} s, readiness re-checked every 5 s) | {:.2} % of a core | — |",
        idle.as_secs(),
        agent_cpu * 100.0
    );
    println!(
        "| `/accessibility`, the desktop + a local page ({nodes} elements in the tree), p50 of {runs} | {ours:.0} ms | pyatspi + lxml as OSWorld builds it (`tests/bench/pyatspi_tree.py`), same desktop: {peer:.0} ms ({:.1}x slower); target < 1000 ms |",
        peer / ours
    );
    println!(
        "| `/terminal` with no terminal focused (the same desktop), p50 of {} | {terminal:.1} ms | the whole tree it read before, `/accessibility` above: {ours:.0} ms |",
        runs.max(20)
    );
    println!(
        "| desktop PSS (every component's process tree) | {:.0} MB | — |",
        total_pss as f64 / 1024.0
    );
    for (name, procs, kib) in pss {
        println!(
            "| PSS of {name} ({procs} processes) | {:.1} MB | — |",
            kib as f64 / 1024.0
        );
    }
}

/// `berth-agent --desktop` started cold: the agent, its readiness report, and the time from
/// exec to strict readiness in milliseconds.
async fn cold_start() -> (AgentProcess, Value, f64) {
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
    (a, report, took)
}

/// Each component's proportional memory (its process tree's PSS, KiB) with its number of
/// processes, from a readiness report's pids; and their sum.
fn desktop_pss(report: &Value) -> (Vec<(String, usize, u64)>, u64) {
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
    (pss, total_pss)
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at the state, field 3.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0)
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf reads a constant.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

/// A process in its own process group, killed with the group when dropped.
struct Started(Child);

impl Drop for Started {
    fn drop(&mut self) {
        let pgid = nix::unistd::Pid::from_raw(-(self.0.id() as i32));
        let _ = nix::sys::signal::kill(pgid, nix::sys::signal::Signal::SIGKILL);
        let _ = self.0.wait();
    }
}

fn start(argv: &[&str], env: &[(&str, &str)]) -> Started {
    Started(
        Command::new(argv[0])
            .args(&argv[1..])
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", argv[0])),
    )
}

fn wm_selection_owned(display: &str) -> bool {
    use x11rb::protocol::xproto::ConnectionExt as _;
    let Ok((c, _)) = x11rb::rust_connection::RustConnection::connect(Some(display)) else {
        return false;
    };
    let Ok(Ok(atom)) = c.intern_atom(false, b"WM_S0").map(|r| r.reply()) else {
        return false;
    };
    matches!(c.get_selection_owner(atom.atom).map(|r| r.reply()), Ok(Ok(r)) if r.owner != 0)
}

/// The peers of the cold start: Xvnc, xfwm4 and Chromium started by hand, each timed alone
/// until it is usable (the X server accepts a client; xfwm4 owns `WM_S0`; Chromium's DevTools
/// answers `/json/version`), with the flags the agent gives them. Milliseconds, sorted.
async fn raw_starts(runs: usize) -> [Vec<f64>; 3] {
    let mut out = [Vec::new(), Vec::new(), Vec::new()];
    let deadline = Duration::from_secs(30);
    for _ in 0..runs {
        let dir = tempfile::tempdir().unwrap();
        let display = free_display();
        let (_x, xvnc_ms) = time_xvnc(&display, deadline).await;
        out[0].push(xvnc_ms);

        let home = dir.path().to_string_lossy().to_string();
        let env = [("DISPLAY", display.as_str()), ("HOME", home.as_str())];
        out[1].push(time_xfwm4(&display, &env, deadline).await);

        let profile = dir.path().join("chromium");
        let (_browser, chromium_ms) = time_chromium(&profile, &env, deadline).await;
        out[2].push(chromium_ms);
    }
    for v in &mut out {
        v.sort_by(f64::total_cmp);
    }
    out
}

/// An X display (`:N`, from 200) with neither a socket nor a lock file.
fn free_display() -> String {
    let number = (200..400)
        .find(|n| {
            !std::path::Path::new(&format!("/tmp/.X11-unix/X{n}")).exists()
                && !std::path::Path::new(&format!("/tmp/.X{n}-lock")).exists()
        })
        .expect("a free display number");
    format!(":{number}")
}

/// Xvnc started on `display` as the agent starts it, and its time until it accepts a client
/// (ms).
async fn time_xvnc(display: &str, deadline: Duration) -> (Started, f64) {
    let t0 = Instant::now();
    let x = start(
        &[
            "Xvnc",
            display,
            "-geometry",
            "1920x1080",
            "-depth",
            "24",
            "-rfbport",
            "-1",
            "-SecurityTypes",
            "None",
            "-nolisten",
            "tcp",
            "-noreset",
        ],
        &[],
    );
    berth_tests::wait_for("the raw Xvnc", deadline, || async {
        x11rb::rust_connection::RustConnection::connect(Some(display))
            .is_ok()
            .then_some(())
    })
    .await;
    (x, t0.elapsed().as_secs_f64() * 1000.0)
}

/// xfwm4's time from its start until it owns `WM_S0` on `display` (ms); it is stopped then.
async fn time_xfwm4(display: &str, env: &[(&str, &str)], deadline: Duration) -> f64 {
    let t0 = Instant::now();
    let wm = start(&["xfwm4", "--compositor=off", "--replace"], env);
    berth_tests::wait_for("the raw xfwm4", deadline, || async {
        wm_selection_owned(display).then_some(())
    })
    .await;
    let took = t0.elapsed().as_secs_f64() * 1000.0;
    drop(wm);
    took
}

/// Chromium started with `profile` as the agent starts it, and its time until its DevTools
/// answers `/json/version` (ms).
async fn time_chromium(
    profile: &std::path::Path,
    env: &[(&str, &str)],
    deadline: Duration,
) -> (Started, f64) {
    let t0 = Instant::now();
    let browser = start(
        &[
            "chromium",
            &format!("--user-data-dir={}", profile.display()),
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            "--password-store=basic",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",
            "--force-renderer-accessibility",
            "--no-sandbox",
            "about:blank",
        ],
        env,
    );
    let http = reqwest::Client::new();
    berth_tests::wait_for("the raw Chromium's DevTools", deadline, || async {
        let text = std::fs::read_to_string(profile.join("DevToolsActivePort")).ok()?;
        let port: u16 = text.lines().next()?.trim().parse().ok()?;
        let r = http
            .get(format!("http://127.0.0.1:{port}/json/version"))
            .send()
            .await
            .ok()?;
        r.status().is_success().then_some(())
    })
    .await;
    (browser, t0.elapsed().as_secs_f64() * 1000.0)
}

/// `/terminal` on the same desktop with no terminal focused (the browser in front): the p50 of
/// `runs` calls in milliseconds, each answered `null`.
async fn terminal(a: &AgentProcess, runs: usize) -> f64 {
    let mut took = Vec::new();
    for _ in 0..runs {
        let t0 = Instant::now();
        let v: Value = reqwest::get(a.url("/terminal"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        took.push(t0.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(v["output"], Value::Null, "{v}");
    }
    took.sort_by(f64::total_cmp);
    percentile(&took, 0.5)
}

/// `/accessibility` against OSWorld's way (pyatspi walked from Python, one thread per
/// application, lxml), on the same desktop with a local page of about 200 elements open.
/// Returns the two medians in milliseconds and the number of elements in the tree.
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
    let xml = fetch().await.1;
    // Element start tags (not `</…>` end tags).
    let elements = xml.matches('<').count() - xml.matches("</").count();
    (percentile(&ours, 0.5), percentile(&peer, 0.5), elements)
}
