//! berth's benchmarks, each figure printed beside the peer it is compared with, measured in
//! the same run on the same machine.
//!
//!   cargo run -p berth-tests --bin berth-bench -- [exec] [display] [record] [workstation] [controller] [mcp]
//!                                                 [osworld] [settle] [--requests N] [--seconds S] [--runs R]
//!                                                 [browser] [--envs N] [--rounds N]
//!                                                 [density] [--max N] [--animated] [--memory-merge] [--osworld]
//!                                                 [coldstart] [--runs R] [--process-only]
//!                                                 [egress] [--requests N]
//!                                                 [runtime] [--runs R] [--requests N]
//!
//! `exec`: `/execute` round trip for `echo hi`, a new TCP connection per request as OSWorld's
//! `requests.post` makes them, against berth-agent and against a Flask + `subprocess.run`
//! server, timed by a client that reads the answer by its Content-Length (not to the server's
//! close) and by `requests` itself from Python.
//! `display`: screenshots, input and settle on a 1920x1080 XFCE desktop, against scrot +
//! Pillow, Pillow's ImageGrab and xdotool.
//! `record`: CPU per recorded minute against OSWorld's and Daytona's ffmpeg commands.
//! `workstation`: `--desktop` cold start to strict readiness, agent and desktop memory.
//! `controller`: warm-pool claim latency and cold create-to-ready through `berth serve`.
//! `mcp`: a `computer` click answered with the settled screenshot over MCP (rmcp's client, one
//! session) beside the same through `POST /v1/computer`.
//! `osworld`: the GNOME osworld image beside the XFCE desktop (cold start, memory, idle CPU) and
//! OSWorld's episode reset through `berth.osworld`, cold, pooled and several envs at once (only
//! when named: it builds both images).
//! `browser`: a browser-toolset turn (a click, then `screenshot`) beside Playwright for Python
//! doing the same over CDP to the same browser (only when named).
//! `density`: Docker desktops one by one, each with a page served inside it (`--animated`:
//! redrawing), until memory or latency gives out or `--max N` (default 40): memory per desktop,
//! screenshot and input p50, create-to-ready beside the others; `--osworld`: the GNOME osworld
//! image, each with a document open in LibreOffice too (only when named).
//! `coldstart`: a cold desktop's create-to-ready step by step (the container's start, each
//! component up, ready) on the process provider and on Docker (`--process-only`: the process
//! provider alone) (only when named).
//! `egress`: a request from inside a Docker sandbox through the egress proxy beside the same
//! request on a direct route, HTTP and HTTPS, a new connection each (only when named).
//! `runtime`: ide sandboxes on Docker under runc and under gVisor (`[runtime] ide = "runsc"`)
//! side by side: create to ready, an exec and a 1 MiB file each way through the controller, and
//! memory once ready (only when named).
//! `settle`: a computer-toolset turn (an action, then `screenshot`) to its answer, and whether
//! the answer equals the screen a second later, for a window opening, a menu, a page navigation
//! and typing, under the agent's `quiet` and `idle` rules in one run (only when named).

mod browser;
mod coldstart;
mod controller;
mod density;
mod desktop;
mod display;
mod egress;
mod exec;
mod gateway;
mod mcp;
mod osworld;
mod record;
mod runtime;
mod settle;
mod workstation;
/// The `p` quantile (0–1) of `v`, nearest rank (sorts `v`).
pub(crate) fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// p50 and p99 of `v`, in milliseconds.
pub(crate) fn percentiles(mut v: Vec<std::time::Duration>) -> (f64, f64) {
    v.sort();
    let at = |p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1000.0;
    (at(0.5), at(0.99))
}

/// A toolset turn (`content`: `tool_use` blocks) posted to `route`: the answer's `tool_result`
/// blocks.
pub(crate) async fn toolset_turn(
    c: &berth_protocol::AgentClient,
    route: &str,
    content: Vec<serde_json::Value>,
) -> Vec<serde_json::Value> {
    let v: serde_json::Value = c
        .request(reqwest::Method::POST, route)
        .json(&serde_json::json!({ "content": content }))
        .send()
        .await
        .expect("the turn")
        .json()
        .await
        .expect("its answer");
    v["content"].as_array().cloned().unwrap_or_default()
}

/// The value after `--name` in `args`, or `default` when it is missing or does not parse.
fn flag<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let requests: usize = flag(&args, "--requests", 1000);
    let which: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| !a.starts_with("--") && a.parse::<usize>().is_err())
        .collect();
    if which.is_empty() || which.contains(&"exec") {
        exec::bench(requests).await;
    }
    if which.is_empty() || which.contains(&"display") {
        display::bench(requests.min(200)).await;
    }
    if which.is_empty() || which.contains(&"record") {
        record::bench(flag(&args, "--seconds", 20)).await;
    }
    if which.is_empty() || which.contains(&"workstation") {
        workstation::bench(flag(&args, "--runs", 5)).await;
    }
    if which.is_empty() || which.contains(&"gateway") {
        gateway::bench(requests.min(2000)).await;
    }
    if which.is_empty() || which.contains(&"mcp") {
        mcp::bench(requests.min(100)).await;
    }
    if which.contains(&"osworld") {
        osworld::bench(flag(&args, "--runs", 5), flag(&args, "--envs", 4)).await;
    }
    if which.contains(&"browser") {
        browser::bench(flag(&args, "--rounds", 100)).await;
    }
    if which.contains(&"density") {
        let has = |f: &str| args.iter().any(|a| a == f);
        density::bench(
            flag(&args, "--max", 40),
            has("--animated"),
            has("--memory-merge"),
            has("--osworld"),
        )
        .await;
    }
    if which.contains(&"coldstart") {
        coldstart::bench(
            flag(&args, "--runs", 5),
            args.iter().any(|a| a == "--process-only"),
        )
        .await;
    }
    if which.contains(&"egress") {
        egress::bench(requests.min(500)).await;
    }
    if which.contains(&"runtime") {
        runtime::bench(flag(&args, "--runs", 5), requests.min(200)).await;
    }
    if which.contains(&"settle") {
        settle::bench(flag(&args, "--rounds", 50)).await;
    }
    if which.is_empty() || which.contains(&"controller") {
        controller::bench(flag(&args, "--runs", 5)).await;
    }
}
