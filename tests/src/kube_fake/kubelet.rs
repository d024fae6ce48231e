//! The fake API server's kubelet: a created Pod gets a node, an IP of its own in 127.0.0.0/8
//! (Linux routes all of it to loopback, so the agent binds `<podIP>:5000` like in a cluster),
//! its volumes materialised under a per-Pod root, and a real `berth-agent` process for its
//! container. Readiness is the container's probe; an agent that exits turns the Pod `Failed`
//! (restartPolicy Never); deleting a Pod stops its agent, removes its root and the object.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::Shared;
use super::store::{Key, KubeletWork, now_rfc3339};

/// The node every Pod is scheduled on.
pub const NODE: &str = "fake-apiserver-node";

/// A Pod's one container, as the kubelet runs it. Transitions: `Waiting → Running →
/// Terminated`, `Waiting → Terminated` (it could not start); never back.
#[derive(Clone, Debug, PartialEq)]
pub enum ContainerState {
    Waiting {
        reason: String,
    },
    Running {
        started_at: String,
    },
    Terminated {
        exit_code: i32,
        reason: String,
        started_at: Option<String>,
        finished_at: String,
    },
}

impl ContainerState {
    fn json(&self) -> Value {
        match self {
            ContainerState::Waiting { reason } => json!({"waiting": {"reason": reason}}),
            ContainerState::Running { started_at } => {
                json!({"running": {"startedAt": started_at}})
            }
            ContainerState::Terminated {
                exit_code,
                reason,
                started_at,
                finished_at,
            } => json!({"terminated": {
                "exitCode": exit_code,
                "reason": reason,
                "startedAt": started_at,
                "finishedAt": finished_at,
            }}),
        }
    }
}

/// What the kubelet knows of a Pod it runs.
#[derive(Clone, Debug)]
pub struct PodRuntime {
    pub ip: Ipv4Addr,
    pub root: PathBuf,
    pub pid: Option<u32>,
    pub state: ContainerState,
    pub ready: bool,
    /// The reason the next termination reports (`OOMKilled`), set by `fail_pod`.
    pub forced_reason: Option<String>,
    pub stopping: bool,
    pub start_time: String,
}

impl PodRuntime {
    /// The Pod's `status`, as a real kubelet writes it.
    pub fn status(&self, pod: &Value) -> Value {
        let phase = match &self.state {
            ContainerState::Waiting { .. } => "Pending",
            ContainerState::Running { .. } => "Running",
            ContainerState::Terminated { exit_code: 0, .. } => "Succeeded",
            ContainerState::Terminated { .. } => "Failed",
        };
        let running = matches!(self.state, ContainerState::Running { .. });
        let ready = running && self.ready;
        let now = now_rfc3339();
        let cond = |t: &str, ok: bool| json!({"type": t, "status": if ok { "True" } else { "False" }, "lastTransitionTime": now});
        let containers: Vec<Value> = pod["spec"]["containers"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|c| {
                json!({
                    "name": c["name"],
                    "image": c["image"],
                    "imageID": format!("fake-apiserver://{}", c["image"].as_str().unwrap_or_default()),
                    "containerID": self.pid.map(|p| format!("fake-apiserver://{p}")),
                    "ready": ready,
                    "started": running,
                    "restartCount": 0,
                    "state": self.state.json(),
                })
            })
            .collect();
        let ip = self.ip.to_string();
        json!({
            "phase": phase,
            "conditions": [
                cond("PodScheduled", true),
                cond("Initialized", true),
                cond("ContainersReady", ready),
                cond("Ready", ready),
            ],
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": self.start_time,
            "qosClass": pod["status"]["qosClass"],
            "containerStatuses": containers,
        })
    }
}

/// A Pod IP no live Pod of any fake (in any process) holds: random in 127.16–250.x.y,
/// checked free on the agent's port.
fn allocate_ip(port: u16) -> Ipv4Addr {
    static USED: std::sync::Mutex<Vec<Ipv4Addr>> = std::sync::Mutex::new(Vec::new());
    use std::hash::{BuildHasher, Hasher};
    loop {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos(),
        );
        let r = h.finish();
        let ip = Ipv4Addr::new(
            127,
            16 + (r % 235) as u8,
            1 + ((r >> 8) % 254) as u8,
            1 + ((r >> 16) % 254) as u8,
        );
        let mut used = USED.lock().unwrap();
        if used.contains(&ip) {
            continue;
        }
        if std::net::TcpListener::bind((ip, port)).is_ok() {
            used.push(ip);
            return ip;
        }
    }
}

/// The kubelet's loop: starts created Pods, stops deleted ones.
pub async fn run(shared: Arc<Shared>, mut work: tokio::sync::mpsc::UnboundedReceiver<KubeletWork>) {
    while let Some(w) = work.recv().await {
        match w {
            KubeletWork::Start(key) => {
                if shared
                    .hold_pending
                    .load(std::sync::atomic::Ordering::SeqCst)
                {
                    shared.held.lock().unwrap().push(key);
                } else {
                    tokio::spawn(start(shared.clone(), key));
                }
            }
            KubeletWork::Stop(key, grace) => {
                tokio::spawn(stop(shared.clone(), key, grace));
            }
        }
    }
}

fn pod(shared: &Shared, key: &Key) -> Option<Value> {
    shared.store.lock().unwrap().get(key).ok()
}

/// Writes the Pod's status from its runtime.
fn publish(shared: &Shared, key: &Key) {
    let rt = shared.pods.lock().unwrap().get(key).cloned();
    let Some(rt) = rt else { return };
    let mut store = shared.store.lock().unwrap();
    if let Ok(p) = store.get(key) {
        let status = rt.status(&p);
        store.set_pod_status(key, status);
    }
}

fn container_port(container: &Value, port: &Value) -> Option<u16> {
    match port {
        Value::Number(n) => n.as_u64().map(|p| p as u16),
        Value::String(name) => name.parse().ok().or_else(|| {
            container["ports"]
                .as_array()?
                .iter()
                .find(|p| p["name"] == *name)?["containerPort"]
                .as_u64()
                .map(|p| p as u16)
        }),
        _ => None,
    }
}

/// The path a container path is materialised at: under its volume's directory when a mount
/// covers it, else under the Pod root's `fs/`.
fn map_path(root: &Path, mounts: &[(String, PathBuf)], p: &str) -> PathBuf {
    let path = Path::new(p);
    let best = mounts
        .iter()
        .filter(|(m, _)| path.starts_with(m))
        .max_by_key(|(m, _)| m.len());
    match best {
        Some((m, dir)) => dir.join(path.strip_prefix(m).unwrap_or(path)),
        None => root.join("fs").join(p.trim_start_matches('/')),
    }
}

fn rewrite(value: &str, ip: Ipv4Addr, root: &Path, mounts: &[(String, PathBuf)]) -> String {
    if let Some(port) = value.strip_prefix("0.0.0.0:") {
        return format!("{ip}:{port}");
    }
    if value.starts_with('/') && !value.starts_with("/dev/") {
        return map_path(root, mounts, value).display().to_string();
    }
    value.to_string()
}

fn decode(b64: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap_or_default()
}

/// Writes a Secret or ConfigMap volume's files; `None` while the object does not exist yet.
fn project(
    shared: &Shared,
    key: &Key,
    kind: super::store::Kind,
    name: &str,
    spec: &Value,
    dir: &Path,
) -> Option<()> {
    let obj = shared
        .store
        .lock()
        .unwrap()
        .get(&Key {
            kind,
            namespace: key.namespace.clone(),
            name: name.to_string(),
        })
        .ok()?;
    let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    if let Some(d) = obj["data"].as_object() {
        for (k, v) in d {
            let v = v.as_str().unwrap_or_default();
            files.insert(
                k.clone(),
                match kind {
                    super::store::Kind::Secret => decode(v),
                    _ => v.as_bytes().to_vec(),
                },
            );
        }
    }
    let mode = spec["defaultMode"].as_u64().unwrap_or(0o644) as u32;
    let items = spec["items"].as_array();
    let mut out: Vec<(String, Vec<u8>, u32)> = Vec::new();
    match items {
        Some(items) => {
            for it in items {
                let k = it["key"].as_str().unwrap_or_default();
                let data = files.get(k)?.clone();
                let m = it["mode"].as_u64().map(|m| m as u32).unwrap_or(mode);
                out.push((it["path"].as_str().unwrap_or(k).to_string(), data, m));
            }
        }
        None => out.extend(files.into_iter().map(|(k, v)| (k, v, mode))),
    }
    use std::os::unix::fs::PermissionsExt;
    for (path, data, m) in out {
        let p = dir.join(path);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).ok()?;
        }
        std::fs::write(&p, data).ok()?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(m)).ok()?;
    }
    Some(())
}

fn env_value(shared: &Shared, key: &Key, pod: &Value, ip: Ipv4Addr, e: &Value) -> Option<String> {
    if let Some(v) = e["value"].as_str() {
        return Some(v.to_string());
    }
    let from = &e["valueFrom"];
    let lookup = |kind, r: &Value| -> Option<String> {
        let o = shared
            .store
            .lock()
            .unwrap()
            .get(&Key {
                kind,
                namespace: key.namespace.clone(),
                name: r["name"].as_str()?.to_string(),
            })
            .ok()?;
        let v = o["data"][r["key"].as_str()?].as_str()?.to_string();
        Some(match kind {
            super::store::Kind::Secret => String::from_utf8_lossy(&decode(&v)).into_owned(),
            _ => v,
        })
    };
    if from["secretKeyRef"].is_object() {
        return lookup(super::store::Kind::Secret, &from["secretKeyRef"]);
    }
    if from["configMapKeyRef"].is_object() {
        return lookup(super::store::Kind::ConfigMap, &from["configMapKeyRef"]);
    }
    match from["fieldRef"]["fieldPath"].as_str()? {
        "status.podIP" => Some(ip.to_string()),
        "metadata.name" => pod["metadata"]["name"].as_str().map(String::from),
        "metadata.namespace" => Some(key.namespace.clone()),
        "metadata.uid" => pod["metadata"]["uid"].as_str().map(String::from),
        "spec.nodeName" => Some(NODE.to_string()),
        _ => Some(String::new()),
    }
}

/// Schedules and starts a Pod: node, IP, volumes, the agent, then its readiness probe.
pub async fn start(shared: Arc<Shared>, key: Key) {
    let Some(pod) = pod(&shared, &key) else {
        return;
    };
    let container = pod["spec"]["containers"][0].clone();
    let agent_port = container["ports"][0]["containerPort"]
        .as_u64()
        .unwrap_or(5000) as u16;
    let ip = allocate_ip(agent_port);
    let root = pod_root(&shared, &key, &pod);
    schedule(&shared, &key, ip, &root);
    // Volumes: a Secret or ConfigMap not there yet keeps the Pod ContainerCreating.
    if !project_volumes(&shared, &key, &pod, &root).await {
        return;
    }
    let mounts = volume_mounts(&container, &root);
    // The image: the fake pulls nothing, but a reference no registry could serve is the
    // kubelet's InvalidImageName (the Pod stays Pending).
    let image = container["image"].as_str().unwrap_or_default();
    if !berth_protocol::image::valid_reference(image) {
        if let Some(rt) = shared.pods.lock().unwrap().get_mut(&key) {
            rt.state = ContainerState::Waiting {
                reason: "InvalidImageName".into(),
            };
        }
        publish(&shared, &key);
        return;
    }
    let argv = agent_argv(&container, agent_port, ip, &root, &mounts);
    let mut cmd = agent_command(&shared.agent_bin, &argv, &root);
    for (name, value) in container_env(&shared, &key, &pod, &container, ip, &root, &mounts) {
        cmd.env(name, value);
    }
    let mut child = match spawn_agent(&mut cmd, &root) {
        Ok(c) => c,
        Err(e) => {
            terminate(&shared, &key, 128, &format!("StartError: {e}"));
            return;
        }
    };
    if !mark_running(&shared, &key, &mut child, &root) {
        return;
    }
    publish(&shared, &key);
    watch_exit(shared.clone(), key.clone(), child);
    probe_until_ready(&shared, &key, &container, ip, agent_port).await;
}

/// The directory a Pod's container runs in: `<namespace>_<name>_<uid prefix>` under the
/// kubelet's root.
fn pod_root(shared: &Shared, key: &Key, pod: &Value) -> PathBuf {
    let uid = pod["metadata"]["uid"].as_str().unwrap_or("uid").to_string();
    shared.root.join(format!(
        "{}_{}_{}",
        key.namespace,
        key.name,
        &uid[..8.min(uid.len())]
    ))
}

/// Binds the Pod to the node with a `ContainerCreating` runtime at `ip` and `root` (its
/// directories made), and publishes that status.
fn schedule(shared: &Shared, key: &Key, ip: Ipv4Addr, root: &Path) {
    for d in ["state", "home", "volumes", "fs"] {
        let _ = std::fs::create_dir_all(root.join(d));
    }
    shared.pods.lock().unwrap().insert(
        key.clone(),
        PodRuntime {
            ip,
            root: root.to_path_buf(),
            pid: None,
            state: ContainerState::Waiting {
                reason: "ContainerCreating".into(),
            },
            ready: false,
            forced_reason: None,
            stopping: false,
            start_time: now_rfc3339(),
        },
    );
    shared.store.lock().unwrap().bind_pod(key, NODE);
    publish(shared, key);
}

/// Makes every volume's directory under `root/volumes` and writes its Secret or ConfigMap
/// files, waiting for an object that does not exist yet. `false` when the Pod went away (or
/// is being deleted) while it waited.
async fn project_volumes(shared: &Shared, key: &Key, pod: &Value, root: &Path) -> bool {
    let volumes = pod["spec"]["volumes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for v in &volumes {
        let name = v["name"].as_str().unwrap_or_default();
        let dir = root.join("volumes").join(name);
        let _ = std::fs::create_dir_all(&dir);
        let source = [
            ("secret", super::store::Kind::Secret, "secretName"),
            ("configMap", super::store::Kind::ConfigMap, "name"),
        ]
        .into_iter()
        .find(|(field, _, _)| v[*field].is_object());
        if let Some((field, kind, name_field)) = source {
            let obj_name = v[field][name_field]
                .as_str()
                .unwrap_or_default()
                .to_string();
            loop {
                if project(shared, key, kind, &obj_name, &v[field], &dir).is_some() {
                    break;
                }
                if pod_gone_or_stopping(shared, key) {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    true
}

/// The container's mounts: each mount path with the host directory it maps to (its volume's
/// directory, or its `subPath` in it).
fn volume_mounts(container: &Value, root: &Path) -> Vec<(String, PathBuf)> {
    let mut mounts: Vec<(String, PathBuf)> = Vec::new();
    for m in container["volumeMounts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        let dir = root
            .join("volumes")
            .join(m["name"].as_str().unwrap_or_default())
            .join(m["subPath"].as_str().unwrap_or_default());
        if let Some(path) = m["mountPath"].as_str() {
            mounts.push((path.to_string(), dir));
        }
    }
    mounts
}

/// The container's command line, run as the host's berth-agent: its paths and listen
/// addresses rewritten to the Pod's, and the agent's state, home and CDP address added when
/// it does not name them.
fn agent_argv(
    container: &Value,
    agent_port: u16,
    ip: Ipv4Addr,
    root: &Path,
    mounts: &[(String, PathBuf)],
) -> Vec<String> {
    let mut argv: Vec<String> = container["command"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(container["args"].as_array().into_iter().flatten())
        .filter_map(|a| a.as_str().map(String::from))
        .collect();
    if argv.first().is_some_and(|a| a.ends_with("berth-agent")) {
        argv.remove(0);
    }
    if argv.first().is_some_and(|a| a == "init") {
        argv.remove(0);
    }
    if argv.is_empty() {
        // The image's CMD.
        argv = vec!["--listen".into(), format!("0.0.0.0:{agent_port}")];
    }
    let mut argv: Vec<String> = argv.iter().map(|a| rewrite(a, ip, root, mounts)).collect();
    let has = |argv: &[String], flag: &str| {
        argv.iter()
            .any(|a| a == flag || a.starts_with(&format!("{flag}=")))
    };
    for (flag, value) in [
        ("--state-dir", root.join("state").display().to_string()),
        ("--home", root.join("home").display().to_string()),
        ("--cdp-listen", format!("{ip}:9222")),
    ] {
        if !has(&argv, flag) {
            argv.extend([flag.to_string(), value]);
        }
    }
    argv
}

/// The agent's command with a clean environment: `PATH`, the Pod's home, the agent's log
/// level, and the host's `LANG` and `TZ`.
fn agent_command(agent_bin: &Path, argv: &[String], root: &Path) -> std::process::Command {
    let mut cmd = std::process::Command::new(agent_bin);
    cmd.args(argv)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", root.join("home"))
        .env("BERTH_AGENT_LOG", "info");
    for keep in ["LANG", "TZ"] {
        if let Some(v) = std::env::var_os(keep) {
            cmd.env(keep, v);
        }
    }
    cmd
}

/// Variables a fake Pod's agent is not given (see [`container_env`]).
const HOST_WIDE: [&str; 7] = [
    "http_proxy",
    "https_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "no_proxy",
    "NO_PROXY",
    "BERTH_EGRESS_CA",
];

/// The container's `env`, in order, its values resolved and rewritten to the Pod's paths and
/// IP; a variable without a name or whose source is missing is left out.
fn container_env(
    shared: &Shared,
    key: &Key,
    pod: &Value,
    container: &Value,
    ip: Ipv4Addr,
    root: &Path,
    mounts: &[(String, PathBuf)],
) -> Vec<(String, String)> {
    let mut env = Vec::new();
    for e in container["env"].as_array().cloned().unwrap_or_default() {
        let (Some(name), Some(value)) = (e["name"].as_str(), env_value(shared, key, pod, ip, &e))
        else {
            continue;
        };
        // The agent installs the egress proxy and its CA system-wide when it has them: a
        // fake Pod shares the host's files, so it is not given them (tests read them in the
        // Pod's spec, and name the proxy themselves).
        if HOST_WIDE.contains(&name) {
            continue;
        }
        env.push((name.to_string(), rewrite(&value, ip, root, mounts)));
    }
    env
}

/// Starts the agent with its output appended to `root/container.log`, in a session of its
/// own.
fn spawn_agent(
    cmd: &mut std::process::Command,
    root: &Path,
) -> std::io::Result<std::process::Child> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(root.join("container.log"));
    log.and_then(|log| {
        let log2 = log.try_clone()?;
        cmd.stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log2);
        use std::os::unix::process::CommandExt;
        // Its own session, like a container's PID namespace: signals to the test's process
        // group do not reach it.
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        cmd.spawn()
    })
}

/// Records the started agent as the Pod's running container. `false` when the Pod was
/// deleted while it started: the agent is killed and never runs.
fn mark_running(shared: &Shared, key: &Key, child: &mut std::process::Child, root: &Path) -> bool {
    let pid = child.id();
    let mut pods = shared.pods.lock().unwrap();
    let rt = pods.get_mut(key).filter(|rt| !rt.stopping);
    let Some(rt) = rt else {
        // Deleted while it started: it never runs.
        drop(pods);
        let _ = child.kill();
        let _ = child.wait();
        kill_all(root);
        return false;
    };
    rt.pid = Some(pid);
    rt.state = ContainerState::Running {
        started_at: now_rfc3339(),
    };
    true
}

/// Waits for the agent on a thread of its own and reports its exit code to [`exited`].
fn watch_exit(shared: Arc<Shared>, key: Key, mut child: std::process::Child) {
    std::thread::spawn(move || {
        use std::os::unix::process::ExitStatusExt;
        let code = match child.wait() {
            Ok(st) => st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(9)),
            Err(_) => 255,
        };
        exited(&shared, &key, code);
    });
}

/// Readiness: the container's probe, tried every 100 ms until it answers (then the Pod is
/// ready) or the container stops running.
async fn probe_until_ready(
    shared: &Shared,
    key: &Key,
    container: &Value,
    ip: Ipv4Addr,
    agent_port: u16,
) {
    let probe = container["readinessProbe"].clone();
    loop {
        let ok = probe_once(&probe, container, ip, agent_port).await;
        {
            let mut pods = shared.pods.lock().unwrap();
            let Some(rt) = pods.get_mut(key) else { return };
            if !matches!(rt.state, ContainerState::Running { .. }) || rt.stopping {
                return;
            }
            if ok {
                rt.ready = true;
            }
        }
        if ok {
            publish(shared, key);
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One try of a readiness probe (`httpGet` answering 2xx/3xx, or `tcpSocket` accepting); a
/// container without one is ready at once.
async fn probe_once(probe: &Value, container: &Value, ip: Ipv4Addr, agent_port: u16) -> bool {
    match (&probe["httpGet"], &probe["tcpSocket"]) {
        (h, _) if h.is_object() => {
            let port = container_port(container, &h["port"]).unwrap_or(agent_port);
            let path = h["path"].as_str().unwrap_or("/");
            reqwest::Client::new()
                .get(format!("http://{ip}:{port}{path}"))
                .timeout(Duration::from_secs(1))
                .send()
                .await
                .is_ok_and(|r| (200..400).contains(&r.status().as_u16()))
        }
        (_, t) if t.is_object() => {
            let port = container_port(container, &t["port"]).unwrap_or(agent_port);
            tokio::net::TcpStream::connect((ip, port)).await.is_ok()
        }
        _ => true,
    }
}

fn pod_gone_or_stopping(shared: &Shared, key: &Key) -> bool {
    pod(shared, key).is_none()
        || shared
            .pods
            .lock()
            .unwrap()
            .get(key)
            .is_none_or(|rt| rt.stopping)
}

/// The container ended (`code`): the Pod is Failed (or Succeeded on 0), unless it is being
/// deleted. Whatever else ran in the container dies with it.
fn exited(shared: &Shared, key: &Key, code: i32) {
    let (stopping, forced, root) = {
        let pods = shared.pods.lock().unwrap();
        let Some(rt) = pods.get(key) else { return };
        (rt.stopping, rt.forced_reason.clone(), rt.root.clone())
    };
    kill_all(&root);
    let reason = forced.unwrap_or_else(|| if code == 0 { "Completed" } else { "Error" }.into());
    if stopping {
        if let Some(rt) = shared.pods.lock().unwrap().get_mut(key) {
            rt.pid = None;
        }
        return;
    }
    terminate(shared, key, code, &reason);
}

fn terminate(shared: &Shared, key: &Key, code: i32, reason: &str) {
    {
        let mut pods = shared.pods.lock().unwrap();
        let Some(rt) = pods.get_mut(key) else { return };
        let started_at = match &rt.state {
            ContainerState::Running { started_at } => Some(started_at.clone()),
            _ => None,
        };
        rt.state = ContainerState::Terminated {
            exit_code: code,
            reason: reason.to_string(),
            started_at,
            finished_at: now_rfc3339(),
        };
        rt.ready = false;
        rt.pid = None;
    }
    publish(shared, key);
}

/// SIGKILLs every process of a Pod (those whose command line names its root, and the process
/// groups they lead) until none is left.
pub fn kill_all(root: &Path) {
    let needle = root.display().to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = crate::processes_matching(&needle);
        if left.is_empty() || Instant::now() > deadline {
            return;
        }
        for p in left {
            let pid = nix::unistd::Pid::from_raw(p as i32);
            let _ = nix::sys::signal::killpg(pid, nix::sys::signal::Signal::SIGKILL);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A deleted Pod: its agent gets a full shutdown (SIGINT; SIGKILL past the grace period,
/// at most 10 s here), its root is removed, then the object.
pub async fn stop(shared: Arc<Shared>, key: Key, grace: u64) {
    shared.held.lock().unwrap().retain(|k| *k != key);
    let rt = {
        let mut pods = shared.pods.lock().unwrap();
        pods.get_mut(&key).map(|rt| {
            rt.stopping = true;
            rt.clone()
        })
    };
    if let Some(rt) = rt {
        if let Some(pid) = rt.pid {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGINT,
            );
            let deadline = Instant::now() + Duration::from_secs(grace.min(10));
            while crate::pid_alive(pid) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let root = rt.root.clone();
        let _ = tokio::task::spawn_blocking(move || {
            kill_all(&root);
            let _ = std::fs::remove_dir_all(&root);
        })
        .await;
    }
    loop {
        let done = shared.store.lock().unwrap().finalizers_done(&key);
        if done {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shared.pods.lock().unwrap().remove(&key);
    shared.store.lock().unwrap().remove(&key);
}

#[cfg(test)]
mod tests {}
