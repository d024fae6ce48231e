//! Harbor on berth: Harbor's own CLI (PyPI `harbor` 0.26 in the virtual environment
//! tests/setup.sh makes, unchanged) runs local tasks in Harbor's format through
//! `berth.harbor:BerthEnvironment` against a controller whose `custom` profile runs on Docker.
//! Each task's `environment/Dockerfile` starts FROM a Debian minbase built here; its oracle
//! solution and its tests run in the berth sandbox:
//!
//! - `writes-hello` passes: its solution writes a file relative to the image's `WORKDIR`, which
//!   its tests read; its two trials are claimed from a warm pool of its image;
//! - `writes-wrong` is meant to fail and does (reward 0);
//! - `allowlist` runs under an allow-list (`network_mode = "allowlist"`): its solution reaches the
//!   allowed host through the controller's egress proxy and is refused the other one (the test
//!   hosts are containers of the test's own network; no traffic leaves the machine);
//! - a Docker Compose task and one asking for GPUs are refused before any sandbox starts.

use std::path::Path;
use std::process::Command;

use berth_protocol::controller::{ControllerClient, SANDBOXES, Sandbox, SandboxList};
use berth_tests::controller::{
    API_KEY, ControllerProcess, Provider, build_desktop_image, build_image,
};
use berth_tests::egress::TestHosts;

const VENV: &str = "/opt/berth/harbor-venv";

/// Writes one task in Harbor's format under `root/name`.
fn task(root: &Path, name: &str, toml_extra: &str, dockerfile: &str, solve: &str, test: &str) {
    let dir = root.join(name);
    for d in ["environment", "solution", "tests"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    let files = [
        (
            "task.toml",
            format!(
                "schema_version = \"1.4\"\n[metadata]\n[verifier]\ntimeout_sec = 120.0\n\
                 [agent]\ntimeout_sec = 120.0\n[environment]\nbuild_timeout_sec = 600.0\n{toml_extra}"
            ),
        ),
        ("instruction.md", format!("Solve {name}.\n")),
        ("environment/Dockerfile", dockerfile.to_string()),
        (
            "solution/solve.sh",
            format!("#!/bin/bash\nset -e\n{solve}\n"),
        ),
        ("tests/test.sh", format!("#!/bin/bash\n{test}\n")),
    ];
    for (f, text) in files {
        std::fs::write(dir.join(f), text).unwrap();
    }
}

/// A reward from a test's condition (bash).
fn reward_if(condition: &str) -> String {
    format!(
        "mkdir -p /logs/verifier\nif {condition}; then echo 1 > /logs/verifier/reward.txt; \
         else echo 0 > /logs/verifier/reward.txt; fi"
    )
}

/// A GET through the sandbox's egress proxy in bash alone (`/dev/tcp`): the minbase image has
/// no HTTP client. Prints the answer's body, or `refused <status line>`.
const PROXY_GET: &str = r#"get() {
  local p=${http_proxy#http://}; p=${p%/}
  exec 3<>/dev/tcp/${p%:*}/${p##*:} || { echo "no proxy"; return; }
  printf 'GET http://%s/ HTTP/1.0\r\nHost: %s\r\n\r\n' "$1" "$1" >&3
  local status; IFS= read -r status <&3
  case "$status" in *" 200 "*) sed '1,/^\r$/d' <&3 ;; *) echo "refused $status" ;; esac
  exec 3<&-
}"#;

/// `harbor run ARGS` in the venv: its exit status and its output.
fn harbor(c: &ControllerProcess, args: &[&str], cwd: &Path) -> (bool, String) {
    let out = Command::new(format!("{VENV}/bin/harbor"))
        .arg("run")
        .args(args)
        .args(["-e", "berth.harbor:BerthEnvironment", "-y"])
        // The key from the environment, as a user would give it: Harbor saves its `--ek`
        // values in the job's config.
        .env("BERTH_URL", &c.base)
        .env("BERTH_API_KEY", API_KEY)
        .current_dir(cwd)
        .env("NO_COLOR", "1")
        .env("COLUMNS", "200")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Each trial's task name and reward in a job's directory (its `result.json` files).
fn rewards(job: &Path) -> Vec<(String, Option<f64>, Option<String>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(job).unwrap().flatten() {
        let result = entry.path().join("result.json");
        let Ok(text) = std::fs::read_to_string(&result) else {
            continue;
        };
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let reward = v["verifier_result"]["rewards"]["reward"].as_f64();
        let error = v["exception_info"]["exception_message"]
            .as_str()
            .map(String::from);
        out.push((
            v["task_name"].as_str().unwrap_or("?").to_string(),
            reward,
            error,
        ));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The controller's sandboxes, the stopped ones with `stopped`.
async fn sandboxes(cl: &ControllerClient, stopped: bool) -> Vec<Sandbox> {
    let status: &[(&str, &str)] = if stopped {
        &[("status", "stopped")]
    } else {
        &[]
    };
    let list: SandboxList = cl
        .request(reqwest::Method::GET, SANDBOXES)
        .query(status)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    list.sandboxes
}

/// What a task's trials printed: the oracle's and the verifier's output, for a failure's message.
fn trial_logs(job: &Path, task: &str) -> String {
    let mut out = String::new();
    for entry in std::fs::read_dir(job).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with(&format!("{task}__")) {
            continue;
        }
        for f in ["agent/oracle.txt", "verifier/test-stdout.txt"] {
            let text = std::fs::read_to_string(entry.path().join(f)).unwrap_or_default();
            out.push_str(&format!("--- {name}/{f}\n{text}\n"));
        }
    }
    out
}

#[tokio::test]
async fn harbors_own_harbor_run_passes_and_fails_the_right_tasks_on_berth() {
    let base = super::byo::minbase("bookworm");
    let desktop = build_desktop_image().unwrap()["image_ref"]
        .as_str()
        .unwrap()
        .to_string();
    let hosts = TestHosts::start(&desktop);
    let work = tempfile::tempdir().unwrap();
    let tasks = work.path().join("tasks");
    let dockerfile = format!("FROM {base}\nWORKDIR /app\n");
    task(
        &tasks,
        "writes-hello",
        "",
        &dockerfile,
        "echo hello > out.txt",
        &reward_if("[ \"$(cat /app/out.txt)\" = hello ]"),
    );
    task(
        &tasks,
        "writes-wrong",
        "",
        // Another image than the passing task's, whose pool is the passing task's alone.
        &format!("{dockerfile}ENV TASK=writes-wrong\n"),
        "echo goodbye > out.txt",
        &reward_if("[ \"$(cat /app/out.txt)\" = hello ]"),
    );
    task(
        &tasks,
        "allowlist",
        "network_mode = \"allowlist\"\nallowed_hosts = [\"allowed.test\"]\n",
        &dockerfile,
        &format!(
            "{PROXY_GET}\nget allowed.test:8000 > allowed.txt\nget refused.test:8000 > refused.txt\n\
             echo \"proxy: $http_proxy\"; cat allowed.txt refused.txt"
        ),
        &reward_if(
            "grep -q 'egress-ok allowed.test' /app/allowed.txt && grep -q '^refused' /app/refused.txt",
        ),
    );
    // The passing task's image, made first, so that the controller keeps a pool of it.
    let image = build_image(&[
        "--dockerfile",
        &tasks.join("writes-hello/environment").to_string_lossy(),
    ])
    .unwrap()["image_ref"]
        .as_str()
        .unwrap()
        .to_string();
    let config = format!(
        "[providers]\ncustom = \"docker\"\n[egress]\nproxy_port = 0\n[egress.hosts]\n\
         \"allowed.test\" = [\"{}\"]\n\"refused.test\" = [\"{}\"]\n\
         [[pools]]\nprofile = \"custom\"\nimage_ref = \"{image}\"\nsize = 2\n",
        hosts.ip(0),
        hosts.ip(1)
    );
    let c = ControllerProcess::start_on(Provider::Process, &config).await;
    let cl = c.client();
    berth_tests::wait_for(
        "the pool of the task's image",
        std::time::Duration::from_secs(120),
        || {
            let cl = cl.clone();
            async move {
                let pools = cl.pool_list().await.ok()?;
                pools.pools.iter().any(|p| p.ready == 2).then_some(())
            }
        },
    )
    .await;

    let jobs = work.path().join("jobs");
    let started = std::time::Instant::now();
    let (ok, out) = harbor(
        &c,
        &[
            "-p",
            &tasks.to_string_lossy(),
            "-a",
            "oracle",
            "-k",
            "2",
            "-n",
            "3",
            "-o",
            &jobs.to_string_lossy(),
            "--job-name",
            "berth",
        ],
        work.path(),
    );
    println!("harbor run: {:?}\n{out}", started.elapsed());
    assert!(ok, "harbor run failed:\n{out}\n{}", c.log_text());
    let got = rewards(&jobs.join("berth"));
    println!("trials: {got:?}");
    let by_task = |name: &str| -> Vec<Option<f64>> {
        got.iter().filter(|t| t.0 == name).map(|t| t.1).collect()
    };
    assert_eq!(by_task("writes-hello"), [Some(1.0), Some(1.0)], "{got:?}");
    assert_eq!(by_task("writes-wrong"), [Some(0.0), Some(0.0)], "{got:?}");
    assert_eq!(
        by_task("allowlist"),
        [Some(1.0), Some(1.0)],
        "{got:?}\n{}",
        trial_logs(&jobs.join("berth"), "allowlist")
    );

    // Every sandbox went with its trial; the passing task's were claimed warm.
    let all = sandboxes(&cl, true).await;
    let of = |task: &str| -> Vec<String> {
        all.iter()
            .filter(|s| s.labels.get("harbor.task").map(String::as_str) == Some(task))
            .map(|s| s.claim.clone().unwrap_or_default())
            .collect()
    };
    assert_eq!(of("writes-hello"), ["warm", "warm"], "{all:?}");
    assert_eq!(of("allowlist").len(), 2, "{all:?}");
    let live = sandboxes(&cl, false).await;
    assert!(
        live.iter().all(|s| !s.labels.contains_key("harbor.task")),
        "a trial's sandbox outlived it: {live:?}"
    );
    // Harbor's resource overrides are the sandbox's limits (another pool key: served cold).
    let (ok, out) = harbor(
        &c,
        &[
            "-p",
            &tasks.join("writes-hello").to_string_lossy(),
            "-a",
            "oracle",
            "--override-cpus",
            "0.5",
            "--override-memory-mb",
            "300",
            "-o",
            &jobs.to_string_lossy(),
            "--job-name",
            "limits",
        ],
        work.path(),
    );
    assert!(ok, "{out}");
    assert_eq!(rewards(&jobs.join("limits")).len(), 1, "{out}");
    assert_eq!(rewards(&jobs.join("limits"))[0].1, Some(1.0), "{out}");
    let sized: Vec<Sandbox> = sandboxes(&cl, true)
        .await
        .into_iter()
        .filter(|s| s.limits.as_ref().and_then(|l| l.memory_mb) == Some(300))
        .collect();
    assert_eq!(sized.len(), 1, "{sized:?}");
    let l = sized[0].limits.clone().unwrap();
    assert_eq!(
        (l.cpus, l.memory_mb, l.swap_mb),
        (Some(0.5), Some(300), Some(0))
    );
    assert_eq!(sized[0].claim.as_deref(), Some("cold"));

    // Refused before start: Docker Compose, and GPUs.
    let bad = work.path().join("bad");
    task(&bad, "compose", "", &dockerfile, "true", &reward_if("true"));
    std::fs::write(
        bad.join("compose/environment/docker-compose.yaml"),
        "services: {}\n",
    )
    .unwrap();
    task(
        &bad,
        "gpus",
        "gpus = 1\n",
        &dockerfile,
        "true",
        &reward_if("true"),
    );
    let before = sandboxes(&cl, true).await.len();
    let (ok, out) = harbor(
        &c,
        &[
            "-p",
            &bad.to_string_lossy(),
            "-a",
            "oracle",
            "-o",
            &jobs.to_string_lossy(),
            "--job-name",
            "bad",
        ],
        work.path(),
    );
    // Harbor stops the job as it makes the trials, with each environment's reason.
    assert!(!ok, "{out}");
    let flat = out.split_whitespace().collect::<Vec<_>>().join(" ");
    for why in [
        "Docker Compose environments are not supported",
        "does not support GPU allocation",
    ] {
        assert!(flat.contains(why), "{why:?} not in:\n{out}");
    }
    assert_eq!(
        sandboxes(&cl, true).await.len(),
        before,
        "a refused task started a sandbox"
    );
    drop(hosts);
}
