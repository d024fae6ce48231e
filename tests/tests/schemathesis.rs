//! schemathesis (PyPI, pinned by `tests/setup.sh`) against a live agent and a live controller,
//! each from its own `GET /openapi.json`: every operation gets a bounded number of generated
//! requests, and the checks `not_a_server_error` and `response_schema_conformance` must pass
//! (no 5xx; every answer matches the schema of its status).
//!
//! Safety: schemathesis sends random input to every operation, so the agent under test is a
//! Docker sandbox of the desktop image created through the controller, never an agent on the
//! host. Left out even there: `POST /v1/shutdown` (ends the sandbox the rest of the run needs),
//! `POST /setup/download_file` (would fetch random URLs: no traffic leaves this machine),
//! `POST /v1/browser/restart` (each call waits for a new Chromium: minutes on 2 cores) and the
//! endless `GET /v1/stream.mp4` (and the controller's), the controller's pushes of a control
//! lease and of request settings (`PUT /v1/control`, `PUT /v1/control/settings`: a random lease
//! would refuse the rest of the run's input); and the relays (tag `relay`: preview of a port, the agent
//! through the controller), whose answers are the upstream's (a random port: 502). On the controller the operations that create containers or
//! build images (sandbox create, lease acquire, image build) are left out; the rest meet
//! unknown ids. Follows are pinned off (`follow=false`) and waits short (`timeout_ms=1000`) so a
//! request never long-polls for its full default.
//!
//! Before the runs, every documented operation is sent once and must not meet the router's
//! fallback (the document lists no route the server lacks; `protocol::openapi`'s unit test
//! checks the other direction).

use std::process::Command;
use std::time::{Duration, Instant};

use berth_protocol::controller::CreateSandbox;
use berth_tests::controller::{API_KEY, ControllerProcess, Provider};
use serde_json::Value;

/// Generated requests per operation.
const EXAMPLES: &str = "8";

const AGENT_EXCLUDED: [&str; 7] = [
    "shutdown",
    "compat_download_file",
    "browser_restart",
    "stream_mp4",
    // A person holding the controls (a random grant) refuses the rest of the run's input and
    // observations for up to an hour; enabling requests lets `control_request` wait 600 s.
    "control_put",
    "control_settings",
    // A random claim of the controls' key would hold for the agent's life (its state dir).
    "control_key_put",
];
const CONTROLLER_EXCLUDED: [&str; 4] = [
    "sandbox_create",
    "lease_acquire",
    "image_build",
    "sandbox_stream_mp4",
];

/// Follows off and waits short (a request never long-polls for its full default); the compat
/// surface's documented 500s (the reference server's, which the compat spec freezes: `{}` to
/// `/execute` is `list index out of range`) are expected there, and nowhere else.
const CONFIG: &str = r#"
[parameters]
"query.follow" = "false"
"query.timeout_ms" = 1000
"query.settle_ms" = 0

[[operations]]
include-tag = "compat"
checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "500"]
"#;

/// What each server's fallback says for a route it does not have.
const FALLBACK: [&str; 3] = [
    "no route ",
    "The requested URL was not found on the server",
    "no such route",
];

fn schemathesis_installed() -> bool {
    Command::new("python3")
        .args(["-m", "schemathesis.cli", "--version"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The agent token of a Docker sandbox (the controller passes it in the container's env).
fn container_token(container: &str) -> String {
    let out = Command::new("docker")
        .args([
            "inspect",
            "--format",
            "{{range .Config.Env}}{{println .}}{{end}}",
            container,
        ])
        .output()
        .expect("docker inspect");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("BERTH_AGENT_TOKEN="))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no BERTH_AGENT_TOKEN in {container}'s env"))
}

/// Sends every documented operation once (path parameters filled, no body) and returns those
/// that met the server's fallback, i.e. are documented but not routed.
async fn unrouted(base: &str, doc: &Value, auth: (&str, &str), skip: &[&str]) -> Vec<String> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let mut out = Vec::new();
    let mut sent = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            if skip.contains(&op["operationId"].as_str().unwrap_or("")) {
                continue;
            }
            let filled = path
                .split('/')
                .map(|seg| match seg {
                    "{port}" => "8080".to_string(),
                    s if s.starts_with('{') => "x".to_string(),
                    s => s.to_string(),
                })
                .collect::<Vec<_>>()
                .join("/");
            let m = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let resp = http
                .request(m, format!("{base}{filled}"))
                .header(auth.0, auth.1)
                .send()
                .await;
            sent += 1;
            let Ok(resp) = resp else { continue };
            let status = resp.status();
            let body = resp.text().await.unwrap_or_default();
            if status == 404 && FALLBACK.iter().any(|f| body.contains(f)) {
                out.push(format!("{method} {path}: {body}"));
            }
        }
    }
    println!("routing probe of {base}: {sent} operations sent once");
    out
}

/// Runs schemathesis against `base`'s `/openapi.json`; returns (success, its summary lines).
fn run_schemathesis(name: &str, base: &str, header: &str, excluded: &[&str]) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("schemathesis.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let junit = dir.path().join("junit.xml");
    let mut cmd = Command::new("python3");
    cmd.args(["-m", "schemathesis.cli", "--no-color", "--config-file"])
        .arg(&config)
        .arg("run")
        .arg(format!("{base}/openapi.json"))
        .args(["--checks", "not_a_server_error,response_schema_conformance"])
        .args(["--phases", "examples,coverage,fuzzing"])
        .args(["--max-examples", EXAMPLES])
        // One worker: Python 3.11's `ast.parse`, which Hypothesis calls to describe its
        // strategies, is not safe across threads ("AST constructor recursion depth
        // mismatch" failed a run with two).
        .args(["--workers", "1", "--request-timeout", "20", "--seed", "13"])
        .args(["--suppress-health-check", "all", "--no-shrink"])
        .args(["--report", "junit", "--report-junit-path"])
        .arg(&junit)
        .args(["--header", header]);
    for id in excluded {
        cmd.args(["--exclude-operation-id", id]);
    }
    // The relays (preview, the agent through the controller) answer for what is behind them:
    // a random port has nothing listening, a 502 by design.
    cmd.args(["--exclude-tag", "relay"]);
    cmd.current_dir(dir.path());
    let started = Instant::now();
    let out = cmd.output().expect("running schemathesis");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let junit = std::fs::read_to_string(&junit).unwrap_or_default();
    let cases = junit.matches("<testcase").count();
    let failures = junit.matches("<failure").count();
    let errors = junit.matches("<error").count();
    println!(
        "schemathesis {name}: exit {:?} in {:.1} s; {cases} operations tested, {failures} failed, \
         {errors} errored ({} excluded)",
        out.status.code(),
        started.elapsed().as_secs_f64(),
        excluded.len()
    );
    // Its own summary: the lines from the last "SUMMARY" heading on.
    let summary = match stdout.rfind("SUMMARY") {
        Some(at) => stdout[at..].to_string(),
        None => stdout.clone(),
    };
    println!("{summary}");
    if !out.status.success() {
        let cut = stdout.len().saturating_sub(20_000);
        println!(
            "--- schemathesis {name} output ---\n{}\n{stderr}",
            &stdout[cut..]
        );
    }
    (
        out.status.success() && failures == 0 && errors == 0,
        summary,
    )
}

#[tokio::test]
async fn schemathesis_finds_no_server_error_and_no_schema_mismatch_on_either_api() {
    assert!(
        schemathesis_installed(),
        "schemathesis is missing: run tests/setup.sh (it installs the pinned version)"
    );
    let c = ControllerProcess::start_on(Provider::Docker, "").await;
    let cl = c.client();
    let sb = cl
        .create(&CreateSandbox {
            profile: "desktop".into(),
            ..Default::default()
        })
        .await
        .expect("a desktop sandbox");
    let agent = sb
        .endpoints
        .compat
        .clone()
        .expect("the agent's published port");
    let token = container_token(&format!("berth-{}", sb.id));
    let http = reqwest::Client::new();

    // Both documents are served without credentials and declare OpenAPI 3.1.
    let agent_doc: Value = http
        .get(format!("{agent}/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let controller_doc: Value = http
        .get(format!("{}/openapi.json", c.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(agent_doc, berth_protocol::openapi::agent());
    assert_eq!(controller_doc, berth_protocol::openapi::controller());
    for d in [&agent_doc, &controller_doc] {
        assert_eq!(d["openapi"], "3.1.0");
    }

    // Every documented operation is routed.
    let bearer = format!("Bearer {token}");
    let mut missing = unrouted(
        &agent,
        &agent_doc,
        ("authorization", &bearer),
        &AGENT_EXCLUDED,
    )
    .await;
    missing.extend(
        unrouted(
            &c.base,
            &controller_doc,
            ("x-api-key", API_KEY),
            &CONTROLLER_EXCLUDED,
        )
        .await,
    );
    assert!(
        missing.is_empty(),
        "documented but not routed: {missing:#?}"
    );

    let (agent_ok, _) = run_schemathesis(
        "agent",
        &agent,
        &format!("Authorization: {bearer}"),
        &AGENT_EXCLUDED,
    );
    // The agent outlived its run (nothing in it shut the agent down).
    // (A fresh client: the pooled connection of the first requests was closed idle.)
    let alive = reqwest::get(format!("{agent}/healthz")).await;
    assert!(
        alive.as_ref().is_ok_and(|r| r.status() == 200),
        "the agent died during its run: {alive:?}"
    );
    let (controller_ok, _) = run_schemathesis(
        "controller",
        &c.base,
        &format!("X-Api-Key: {API_KEY}"),
        &CONTROLLER_EXCLUDED,
    );
    // schemathesis may find the sandbox's id in a listing and delete it itself.
    let after = cl.get(&sb.id).await.expect("the sandbox after the runs");
    println!("sandbox {} after the runs: {:?}", sb.id, after.status);
    cl.delete(&sb.id).await.unwrap();
    assert!(
        agent_ok,
        "schemathesis found failures on the agent (output above)"
    );
    assert!(
        controller_ok,
        "schemathesis found failures on the controller (output above)"
    );
}

/// What schemathesis found on `POST /wallpaper`: a handler that ignores a small request body
/// lost the end of its large answer (hyper closed the connection with the body's bytes unread,
/// and the kernel's reset cut the answer in flight). The body is now drained, the connection
/// stays open, and every answer arrives whole. Raw TCP, the body sent after the head as HTTP
/// clients do; a read-only download from an agent on the host.
#[tokio::test]
async fn a_handler_that_ignores_a_small_body_still_delivers_its_whole_answer() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let a = berth_tests::AgentProcess::start().await;
    let file = a.home.join("big.bin");
    berth_tests::write_pattern_file(&file, 3_000_000);
    let addr = berth_tests::host_port(&a.base).to_string();
    let head = format!(
        "GET /v1/files?path={} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
         Content-Length: 2\r\n\r\n",
        file.display(),
        berth_tests::TOKEN
    );
    const ROUNDS: usize = 60;
    let (mut whole, mut kept_open) = (0, 0);
    for _ in 0..ROUNDS {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        s.write_all(head.as_bytes()).await.unwrap();
        // The body after the head, once the agent has read the head.
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(2)).await;
        s.write_all(b"{}").await.unwrap();
        let mut data = Vec::new();
        let mut buf = vec![0u8; 1 << 20];
        let got = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => data.extend_from_slice(&buf[..n]),
                }
                if let Some(at) = data.windows(4).position(|w| w == b"\r\n\r\n")
                    && data.len() - at - 4 >= 3_000_000
                {
                    break;
                }
            }
        })
        .await;
        assert!(got.is_ok(), "the answer did not arrive within 20 s");
        let at = data.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let head = String::from_utf8_lossy(&data[..at]).to_ascii_lowercase();
        whole += usize::from(data.len() - at == 3_000_000);
        kept_open += usize::from(!head.contains("connection: close"));
    }
    println!("{whole}/{ROUNDS} answers whole, {kept_open}/{ROUNDS} connections kept open");
    assert_eq!(whole, ROUNDS, "answers cut short");
    assert_eq!(kept_open, ROUNDS, "connections closed with the body unread");
}
