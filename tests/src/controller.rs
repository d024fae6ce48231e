//! A real `berth serve` for end-to-end tests: its own data dir and port, the test's API key,
//! a config file. Dropping it stops the controller and every agent it started.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use berth_protocol::controller::ControllerClient;

use crate::{processes_matching, workspace_bin};

pub const API_KEY: &str = "test-api-key-0123456789";

/// `berth image build --profile desktop --json`: the build's answer (`image_ref`, `built`, …).
/// `tests/test.sh` builds the image once, so here a build finds it in under a second.
pub fn build_desktop_image() -> Result<serde_json::Value, String> {
    let out = Command::new(workspace_bin("berth"))
        .args(["image", "build", "--profile", "desktop", "--json"])
        .env("BERTH_LOG", "warn")
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("only JSON on stdout: {e}"))
}

pub struct ControllerProcess {
    pub child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub base: String,
    pub config: String,
    /// Where the controller's stderr (its log) goes.
    pub log: PathBuf,
    /// The controller's id (its provider labels carry it).
    pub id: String,
}

impl ControllerProcess {
    /// A controller with `config` (TOML) added to the test defaults: runs reconciled every
    /// second, orphans reaped without a grace period.
    pub async fn start(config: &str) -> ControllerProcess {
        let dir = tempfile::Builder::new()
            .prefix("berth-ctl-")
            .tempdir()
            .expect("tempdir");
        let mut c = ControllerProcess {
            child: None,
            log: dir.path().join("controller.log"),
            dir,
            base: String::new(),
            id: String::new(),
            config: format!("reconcile_interval_secs = 1.0\n{config}"),
        };
        c.launch();
        c
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Starts (again) on the same data dir: what a restart looks like.
    pub fn launch(&mut self) {
        let config = self.dir.path().join("berth.toml");
        std::fs::write(&config, &self.config).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut child = Command::new(workspace_bin("berth"))
            .arg("serve")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--data-dir")
            .arg(self.data_dir())
            .arg("--config")
            .arg(&config)
            .env("BERTH_API_KEYS", API_KEY)
            .env("BERTH_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("spawn berth serve");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut id = String::new();
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(i) = line.strip_prefix("controller id ") {
                    id = i.trim().to_string();
                }
                if let Some(url) = line.strip_prefix("berth serving on ") {
                    let _ = tx.send((url.trim().to_string(), id.clone()));
                }
            }
        });
        let (url, id) = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("berth serve did not start: {}", self.log_text()));
        self.base = url;
        self.id = id;
        self.child = Some(child);
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn client(&self) -> ControllerClient {
        ControllerClient::new(self.base.clone(), Some(API_KEY.to_string()))
    }

    pub fn anonymous(&self) -> ControllerClient {
        ControllerClient::new(self.base.clone(), None)
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The live processes that belong to a sandbox (its agent and everything under it).
    pub fn sandbox_processes(&self, sandbox_id: &str) -> Vec<u32> {
        let dir = self.data_dir().join("sandboxes").join(sandbox_id);
        processes_matching(&dir.to_string_lossy())
    }

    /// Every live process started for any sandbox of this controller.
    pub fn all_sandbox_processes(&self) -> Vec<u32> {
        processes_matching(&self.data_dir().join("sandboxes").to_string_lossy())
    }

    /// The ids of every container labelled with this controller's id.
    pub fn containers(&self) -> Vec<String> {
        let out = Command::new("docker")
            .args(["ps", "-aq", "--filter"])
            .arg(format!("label=berth.controller={}", self.id))
            .output();
        match out {
            Ok(o) => String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .map(String::from)
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    /// The pid of a sandbox's agent.
    pub fn agent_pid(&self, sandbox_id: &str) -> i32 {
        let p = self
            .data_dir()
            .join("sandboxes")
            .join(sandbox_id)
            .join("state/endpoints.json");
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
        v["pid"].as_i64().unwrap() as i32
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        self.kill9();
        let containers = self.containers();
        if !containers.is_empty() {
            let _ = Command::new("docker")
                .args(["rm", "-f", "-v"])
                .args(&containers)
                .output();
        }
        // The agents outlive the controller by design: stop them (SIGINT = full shutdown).
        let pids = self.all_sandbox_processes();
        for p in &pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*p as i32),
                nix::sys::signal::Signal::SIGINT,
            );
        }
        let sandboxes = self.data_dir().join("sandboxes");
        let gone = |_: ()| processes_matching(&sandboxes.to_string_lossy()).is_empty();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !gone(()) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        for p in processes_matching(&sandboxes.to_string_lossy()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}
