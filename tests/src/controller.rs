//! A real `berth serve` for end-to-end tests: its own data dir and port, the test's API key,
//! a config file. Dropping it stops the controller and every agent it started.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use berth_protocol::controller::{
    Command as RunCommand, ControllerClient, CreateSandbox, RunRequest,
};

use crate::kube_fake::FakeApiServer;
use crate::{processes_matching, workspace_bin};

pub const API_KEY: &str = "test-api-key-0123456789";

/// A create of the `desktop` profile.
pub fn desktop() -> CreateSandbox {
    CreateSandbox {
        profile: "desktop".into(),
        ..Default::default()
    }
}

/// A create of the `ide` profile (no desktop).
pub fn ide() -> CreateSandbox {
    CreateSandbox {
        profile: "ide".into(),
        ..Default::default()
    }
}

/// A run of one shell line.
pub fn shell(line: &str) -> RunRequest {
    RunRequest {
        command: RunCommand::Line(line.into()),
        ..Default::default()
    }
}

/// `berth image build --profile desktop --json`: the build's answer (`image_ref`, `built`, …).
/// `tests/test.sh` builds the image once, so here a build finds it in under a second.
pub fn build_desktop_image() -> Result<serde_json::Value, String> {
    build_image(&["--profile", "desktop"])
}

/// `berth image build <selection> --json`.
pub fn build_image(selection: &[&str]) -> Result<serde_json::Value, String> {
    let out = Command::new(workspace_bin("berth"))
        .args(["image", "build"])
        .args(selection)
        .arg("--json")
        .env("BERTH_LOG", "warn")
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("only JSON on stdout: {e}"))
}

/// Where a test controller runs its sandboxes. The provider-neutral suite runs once per provider
/// (see [`on_every_provider!`](crate::on_every_provider)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provider {
    /// Local agent processes under the controller's data dir.
    Process,
    /// Containers of the desktop image (`tests/test.sh` builds it).
    Docker,
    /// Pods on the in-process fake Kubernetes API server ([`FakeApiServer`]; no real API
    /// server runs here), whose kubelet runs each Pod's agent as a real process; the
    /// controller reaches agents at their Pod IPs (`reach = "pod-ip"`).
    KubernetesFakeApiserver,
    /// The same, reached through the fake API server's port-forward.
    KubernetesFakeApiserverPortForward,
}

/// The image the Kubernetes runs' Pods name (the fake kubelet runs the workspace's agent
/// whatever the image).
pub const FAKE_APISERVER_IMAGE: &str = "registry.fake-apiserver.invalid/berth/desktop:test";
/// The namespace the Kubernetes runs use.
pub const FAKE_APISERVER_NAMESPACE: &str = "berth-test";

impl Provider {
    /// How the `image_ref` of this provider's sandboxes begins.
    pub fn image_prefix(self) -> &'static str {
        match self {
            Provider::Process => "process:",
            Provider::Docker => "berth-desktop:",
            Provider::KubernetesFakeApiserver | Provider::KubernetesFakeApiserverPortForward => {
                "registry.fake-apiserver.invalid/berth/"
            }
        }
    }

    /// Whether sandboxes run as Pods on the fake API server.
    pub fn is_kubernetes(self) -> bool {
        matches!(
            self,
            Provider::KubernetesFakeApiserver | Provider::KubernetesFakeApiserverPortForward
        )
    }

    /// The provider's name in `[providers]` and the catalog's `driver_hint`.
    pub fn name(self) -> &'static str {
        match self {
            Provider::Process => "process",
            Provider::Docker => "docker",
            _ => "kubernetes",
        }
    }

    /// A word the `error` of a sandbox this provider saw die must hold.
    pub fn death_word(self) -> &'static str {
        match self {
            Provider::Process => "agent",
            Provider::Docker => "container died",
            _ => "agent exited",
        }
    }

    /// `config` with every profile placed on this provider (`dir`: the controller's dir,
    /// where a kubeconfig is).
    fn config(self, config: &str, dir: &std::path::Path) -> String {
        match self {
            Provider::Process => config.to_string(),
            Provider::Docker => {
                let image = build_desktop_image().unwrap_or_else(|e| panic!("{e}"));
                let image = image["image_ref"].as_str().unwrap();
                format!(
                    "docker_image = \"{image}\"\n{config}\n[providers]\ndesktop = \"docker\"\nide = \"docker\"\n"
                )
            }
            Provider::KubernetesFakeApiserver | Provider::KubernetesFakeApiserverPortForward => {
                let reach = match self {
                    Provider::KubernetesFakeApiserver => "pod-ip",
                    _ => "port-forward",
                };
                // The egress DNS binds only once the controller's Service exists (a test
                // makes it): on a port of its own, so controllers run side by side.
                let dns_port = crate::free_port();
                format!(
                    "{config}\n[providers]\ndesktop = \"kubernetes\"\nide = \"kubernetes\"\n\
                     [kubernetes]\nnamespace = \"{FAKE_APISERVER_NAMESPACE}\"\nkubeconfig = \"{}\"\n\
                     reach = \"{reach}\"\nimage = \"{FAKE_APISERVER_IMAGE}\"\n\
                     egress_dns_port = {dns_port}\n",
                    dir.join("kubeconfig").display()
                )
            }
        }
    }
}

/// Runs each named `async fn(Provider)` as a test on every provider: `process::<name>` and
/// `docker::<name>`; the cases listed after `; kubernetes_fake_apiserver:` also as
/// `kubernetes_fake_apiserver::<name>` (Pods on the in-process fake API server).
#[macro_export]
macro_rules! on_every_provider {
    ($($name:ident),+ ; kubernetes_fake_apiserver: $($k:ident),+ $(,)?) => {
        $crate::on_every_provider!($($name),+);
        mod kubernetes_fake_apiserver {
            $(#[tokio::test]
            async fn $k() {
                super::$k($crate::controller::Provider::KubernetesFakeApiserver).await
            })+
        }
    };
    ($($name:ident),+ $(,)?) => {
        mod process {
            $(#[tokio::test]
            async fn $name() {
                super::$name($crate::controller::Provider::Process).await
            })+
        }
        mod docker {
            $(#[tokio::test]
            async fn $name() {
                super::$name($crate::controller::Provider::Docker).await
            })+
        }
    };
}

/// How much of the controller's log a failing test prints.
const LOG_TAIL_LINES: usize = 200;

pub struct ControllerProcess {
    pub provider: Provider,
    pub child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub base: String,
    pub config: String,
    /// Where the controller's stderr (its log) goes.
    pub log: PathBuf,
    /// The controller's id (its provider labels carry it).
    pub id: String,
    /// The fake Kubernetes API server of the Kubernetes runs (it outlives restarts).
    pub kube: Option<FakeApiServer>,
}

impl ControllerProcess {
    /// A controller with `config` (TOML) added to the test defaults: runs reconciled every
    /// second (unless `config` sets the interval), orphans reaped without a grace period.
    pub async fn start(config: &str) -> ControllerProcess {
        ControllerProcess::start_on(Provider::Process, config).await
    }

    /// [`start`](Self::start) with every profile on `provider`.
    pub async fn start_on(provider: Provider, config: &str) -> ControllerProcess {
        let dir = tempfile::Builder::new()
            .prefix("berth-ctl-")
            .tempdir()
            .expect("tempdir");
        let config = provider.config(config, dir.path());
        let kube = provider.is_kubernetes().then(|| {
            let fake = FakeApiServer::start();
            fake.write_kubeconfig(&dir.path().join("kubeconfig"), FAKE_APISERVER_NAMESPACE);
            fake
        });
        let mut c = ControllerProcess {
            provider,
            kube,
            child: None,
            log: dir.path().join("controller.log"),
            dir,
            base: String::new(),
            id: String::new(),
            config: if config.contains("reconcile_interval_secs") {
                config
            } else {
                format!("reconcile_interval_secs = 1.0\n{config}")
            },
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
            // Never the machine's own cluster, if it has one.
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBECONFIG")
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

    /// The fake API server of a Kubernetes run.
    pub fn fake(&self) -> &FakeApiServer {
        self.kube
            .as_ref()
            .expect("a Kubernetes run has its fake API server")
    }

    /// The stored objects (`Pod`, `Secret`, `NetworkPolicy`) labelled with `label=value`;
    /// `live` keeps only those not being deleted.
    fn kube_objects(&self, label: &str, value: &str, live: bool) -> Vec<serde_json::Value> {
        ["Pod", "Secret", "NetworkPolicy"]
            .into_iter()
            .flat_map(|k| self.fake().objects_json(k))
            .filter(|o| o["metadata"]["labels"][label] == value)
            .filter(|o| !live || o["metadata"]["deletionTimestamp"].is_null())
            .collect()
    }

    /// The names of a sandbox's Pods not being deleted.
    fn kube_pods(&self, sandbox_id: &str) -> Vec<String> {
        self.kube_objects("berth.sandbox", sandbox_id, true)
            .iter()
            .filter(|o| o["kind"] == "Pod")
            .filter_map(|o| o["metadata"]["name"].as_str().map(String::from))
            .collect()
    }

    /// `Kind/name` of each object, and `pid N` of each process of the Pods among them.
    fn kube_leftovers(&self, objects: &[serde_json::Value]) -> Vec<String> {
        let mut left = Vec::new();
        for o in objects {
            let name = o["metadata"]["name"].as_str().unwrap_or_default();
            left.push(format!("{}/{name}", o["kind"].as_str().unwrap_or_default()));
            if o["kind"] == "Pod" {
                left.extend(
                    self.fake()
                        .pod_processes(name)
                        .iter()
                        .map(|p| format!("pid {p}")),
                );
            }
        }
        left
    }

    /// The live processes that belong to a sandbox (its agent and everything under it).
    pub fn sandbox_processes(&self, sandbox_id: &str) -> Vec<u32> {
        if self.provider.is_kubernetes() {
            return self
                .kube_pods(sandbox_id)
                .iter()
                .flat_map(|p| self.fake().pod_processes(p))
                .collect();
        }
        let dir = self.data_dir().join("sandboxes").join(sandbox_id);
        processes_matching(&dir.to_string_lossy())
    }

    /// Every live process started for any sandbox of this controller.
    pub fn all_sandbox_processes(&self) -> Vec<u32> {
        if let Some(k) = &self.kube {
            return k.all_pod_processes();
        }
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

    /// What is left of a sandbox on its provider: its processes, its directory, its container.
    /// Empty once it is deleted.
    pub fn leftovers(&self, sandbox_id: &str) -> Vec<String> {
        match self.provider {
            Provider::Process => {
                let mut left: Vec<String> = self
                    .sandbox_processes(sandbox_id)
                    .iter()
                    .map(|p| format!("pid {p}"))
                    .collect();
                let dir = self.data_dir().join("sandboxes").join(sandbox_id);
                if dir.exists() {
                    left.push(dir.display().to_string());
                }
                left
            }
            Provider::Docker => docker_names(&format!("label=berth.sandbox={sandbox_id}")),
            // A Pod being deleted is the kubelet's to finish (its grace period): what is left
            // is what no delete was asked for.
            _ => self.kube_leftovers(&self.kube_objects("berth.sandbox", sandbox_id, true)),
        }
    }

    /// What is left of every sandbox this controller started.
    pub fn all_leftovers(&self) -> Vec<String> {
        match self.provider {
            Provider::Process => self
                .all_sandbox_processes()
                .iter()
                .map(|p| format!("pid {p}"))
                .collect(),
            Provider::Docker => docker_names(&format!("label=berth.controller={}", self.id)),
            _ => self.kube_leftovers(&self.kube_objects("berth.controller", &self.id, true)),
        }
    }

    /// How many sandboxes live on the provider (running processes' sandboxes, containers).
    pub fn live_sandboxes(&self) -> usize {
        match self.provider {
            Provider::Process => std::fs::read_dir(self.data_dir().join("sandboxes"))
                .map(|d| {
                    d.flatten()
                        .filter(|e| {
                            !self
                                .sandbox_processes(&e.file_name().to_string_lossy())
                                .is_empty()
                        })
                        .count()
                })
                .unwrap_or(0),
            Provider::Docker => self.containers().len(),
            _ => self
                .kube_objects("berth.controller", &self.id, true)
                .iter()
                .filter(|o| o["kind"] == "Pod")
                .filter(|o| {
                    o["metadata"]["name"]
                        .as_str()
                        .and_then(|n| self.fake().agent_pid(n))
                        .is_some_and(crate::pid_alive)
                })
                .count(),
        }
    }

    /// Whether the sandbox's agent (process) or container is running.
    pub fn sandbox_alive(&self, sandbox_id: &str) -> bool {
        match self.provider {
            Provider::Process => crate::pid_alive(self.agent_pid(sandbox_id) as u32),
            Provider::Docker => Command::new("docker")
                .args(["inspect", "-f", "{{.State.Running}}"])
                .arg(format!("berth-{sandbox_id}"))
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "true"),
            _ => self
                .kube_pods(sandbox_id)
                .iter()
                .any(|p| self.fake().agent_pid(p).is_some_and(crate::pid_alive)),
        }
    }

    /// Kills what the sandbox runs on, as a crash would: its agent with SIGKILL (process), its
    /// container with `docker kill`.
    pub fn kill_sandbox(&self, sandbox_id: &str) {
        match self.provider {
            Provider::Process => nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.agent_pid(sandbox_id)),
                nix::sys::signal::Signal::SIGKILL,
            )
            .unwrap(),
            Provider::Docker => {
                let out = Command::new("docker")
                    .arg("kill")
                    .arg(format!("berth-{sandbox_id}"))
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            // Everything in the Pod's container, SIGKILLed: the Pod turns Failed.
            _ => {
                let pods = self.kube_pods(sandbox_id);
                assert!(!pods.is_empty(), "{sandbox_id} has no Pod");
                for p in pods {
                    self.fake().kill_pod(&p);
                }
            }
        }
    }

    /// The places in a sandbox that hold `needle`: the agent's state (command records, output,
    /// events), its log, the user's home and /tmp.
    pub fn state_files_containing(&self, sandbox_id: &str, needle: &str) -> Vec<String> {
        match self.provider {
            Provider::Process
            | Provider::KubernetesFakeApiserver
            | Provider::KubernetesFakeApiserverPortForward => {
                let mut found = Vec::new();
                // A Pod's root holds its agent's state, home, volumes and container log.
                let mut stack = match self.provider.is_kubernetes() {
                    true => self
                        .kube_pods(sandbox_id)
                        .iter()
                        .filter_map(|p| self.fake().pod_root(p))
                        .collect(),
                    false => vec![self.data_dir().join("sandboxes").join(sandbox_id)],
                };
                while let Some(p) = stack.pop() {
                    if p.is_dir() {
                        stack.extend(std::fs::read_dir(&p).unwrap().flatten().map(|e| e.path()));
                    } else if std::fs::read(&p)
                        .is_ok_and(|b| String::from_utf8_lossy(&b).contains(needle))
                    {
                        found.push(p.display().to_string());
                    }
                }
                found
            }
            Provider::Docker => {
                let out = Command::new("docker")
                    .args(["exec", &format!("berth-{sandbox_id}")])
                    .args([
                        "grep",
                        "-rlF",
                        "--",
                        needle,
                        "/var/lib/berth-agent",
                        "/home",
                        "/tmp",
                    ])
                    .output()
                    .unwrap();
                // grep: 0 = found, 1 = none; anything else means the search itself failed.
                assert!(
                    matches!(out.status.code(), Some(0 | 1)),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let mut found: Vec<String> = String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .map(String::from)
                    .collect();
                // The agent's log is the container's output.
                let logs = Command::new("docker")
                    .args(["logs", &format!("berth-{sandbox_id}")])
                    .output()
                    .unwrap();
                if String::from_utf8_lossy(&logs.stdout).contains(needle)
                    || String::from_utf8_lossy(&logs.stderr).contains(needle)
                {
                    found.push("docker logs".into());
                }
                found
            }
        }
    }

    /// The sandbox agent's bearer token, read where the provider hands it to the agent (its
    /// environment; for Docker, the container's configuration; on Kubernetes, the Secret
    /// mounted as the agent's token file).
    pub fn agent_token(&self, sandbox_id: &str) -> String {
        if self.provider.is_kubernetes() {
            let secret = self
                .kube_objects("berth.sandbox", sandbox_id, true)
                .into_iter()
                .find(|o| o["kind"] == "Secret")
                .expect("the sandbox's token Secret");
            use base64::Engine as _;
            let b = base64::engine::general_purpose::STANDARD
                .decode(secret["data"]["token"].as_str().expect("a token key"))
                .unwrap();
            return String::from_utf8(b).unwrap();
        }
        let env = match self.provider {
            Provider::Process => {
                let pid = self.agent_pid(sandbox_id);
                String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/environ")).unwrap())
                    .replace('\0', "\n")
            }
            Provider::Docker => {
                let out = Command::new("docker")
                    .args([
                        "inspect",
                        "--format",
                        "{{range .Config.Env}}{{println .}}{{end}}",
                        &format!("berth-{sandbox_id}"),
                    ])
                    .output()
                    .unwrap();
                String::from_utf8_lossy(&out.stdout).into_owned()
            }
            _ => unreachable!(),
        };
        env.lines()
            .find_map(|l| l.strip_prefix("BERTH_AGENT_TOKEN="))
            .expect("the agent's environment holds its token")
            .to_string()
    }

    /// The pid of a sandbox's agent.
    pub fn agent_pid(&self, sandbox_id: &str) -> i32 {
        if self.provider.is_kubernetes() {
            let pods = self.kube_pods(sandbox_id);
            return pods
                .iter()
                .find_map(|p| self.fake().agent_pid(p))
                .expect("the sandbox's Pod runs an agent") as i32;
        }
        let p = self
            .data_dir()
            .join("sandboxes")
            .join(sandbox_id)
            .join("state/endpoints.json");
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
        v["pid"].as_i64().unwrap() as i32
    }
}

/// The names of the containers (any state) matching a `docker ps` filter.
fn docker_names(filter: &str) -> Vec<String> {
    match Command::new("docker")
        .args(["ps", "-a", "--format", "{{.Names}}", "--filter", filter])
        .output()
    {
        Ok(o) => String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .map(String::from)
            .collect(),
        Err(_) => Vec::new(),
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        self.kill9();
        // A failing test shows what the controller said (nextest prints a failure's stderr).
        if std::thread::panicking() {
            let log = self.log_text();
            let lines: Vec<&str> = log.lines().collect();
            let from = lines.len().saturating_sub(LOG_TAIL_LINES);
            eprintln!(
                "--- the controller's log, its last {} of {} lines ---",
                lines.len() - from,
                lines.len()
            );
            for l in &lines[from..] {
                eprintln!("{l}");
            }
        }
        // The fake API server's kubelet kills every Pod's processes as it goes.
        if let Some(k) = self.kube.take() {
            drop(k);
            return;
        }
        let containers = self.containers();
        if !containers.is_empty() {
            let _ = Command::new("docker")
                .args(["rm", "-f", "-v"])
                .args(&containers)
                .output();
        }
        // Its egress network, kept by a controller for its next start (one per controller id):
        // a test's controller has none, and Docker's address pools hold about 30 networks.
        let _ = Command::new("docker")
            .args(["network", "rm", &format!("berth-egress-{}", self.id)])
            .stderr(Stdio::null())
            .output();
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
