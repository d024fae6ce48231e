//! The containment suite: what an agent inside a sandbox can and cannot reach, probed from the
//! inside the way a hostile program would, on the real images behind the controller (Docker
//! provider, default and egress settings). Every check has a control that finds what it must,
//! so a probe that cannot see anything does not pass for a fence:
//!
//! - neighbours: every port a desktop neighbour listens on (its agent's :5000 with OSWorld's
//!   open `/execute`, its Chrome's CDP, whatever else) is unreachable from another sandbox, with
//!   or without an egress policy, and through the host's published ports too; the sandbox
//!   reaches its own agent, and the test host reaches the neighbour, from outside;
//! - the agent's token: found in no environment, command line or file the sandbox user can
//!   read, nor through the agent's own open compat routes (`/file`, `/list_directory`,
//!   `/setup/upload` act with the user's rights); root in the same container finds it;
//! - the user holds no capabilities, sees no Docker socket and no host path but the three
//!   files Docker writes (`/etc/hosts`, `/etc/hostname`, `/etc/resolv.conf`), and cannot
//!   signal the agent or any root process;
//! - in the osworld image, where the user may `sudo` by OSWorld's contract, what still holds.
//!
//! Every probe has a timeout; traffic goes only between the test's own containers and the host.

use std::collections::BTreeSet;

use berth_protocol::controller::{
    Command as RunCommand, ControllerClient, CreateSandbox, RunRequest, Sandbox,
};
use berth_protocol::egress::{Egress, EgressMode};
use berth_tests::controller::{ControllerProcess, Provider, build_image};
use berth_tests::egress::docker;
use sha2::Digest;

/// Connects to each `host:port` argument (2 s each): `host:port open|refused|timeout|<errno>`.
const PROBE: &str = r#"
import socket, sys
for a in sys.argv[1:]:
    h, p = a.rsplit(":", 1)
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect((h, int(p)))
        r = "open"
    except socket.timeout:
        r = "timeout"
    except ConnectionRefusedError:
        r = "refused"
    except OSError as e:
        r = "errno%d" % e.errno
    finally:
        s.close()
    print(a, r)
"#;

/// Searches for a secret known only by its SHA-256 (argv[1]: hex; it never enters the
/// sandbox), as 48 hex digits anywhere: every readable process environment and command line,
/// every readable file changed since argv[2] (epoch seconds: nothing older can hold a token
/// made at create), and the answers of the agent's open compat routes at 127.0.0.1:5000 for
/// root's files. Prints one JSON object.
const SEARCH: &str = r#"
import hashlib, json, os, re, stat, sys, urllib.request, urllib.parse
digest, cutoff = sys.argv[1], float(sys.argv[2])
hexrun = re.compile(rb"[0-9a-f]{48,}")
def holds(data):
    for m in hexrun.finditer(data):
        run = m.group(0)
        for i in range(len(run) - 47):
            if hashlib.sha256(run[i:i + 48]).hexdigest() == digest:
                return True
    return False
out = {"found": [], "proc_read": 0, "proc_denied": 0, "files": 0, "sockets": [], "routes": {}}
agent_pids = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        if open("/proc/%s/cmdline" % pid, "rb").read().startswith(b"/usr/local/bin/berth-agent"):
            agent_pids.append(pid)
    except OSError:
        pass
    for part in ("environ", "cmdline"):
        p = "/proc/%s/%s" % (pid, part)
        try:
            data = open(p, "rb").read()
            out["proc_read"] += 1
        except OSError:
            out["proc_denied"] += 1
            continue
        if holds(data):
            out["found"].append(p)
for top, dirs, files in os.walk("/"):
    if top == "/":
        dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev")]
    for name in files:
        p = os.path.join(top, name)
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if stat.S_ISSOCK(st.st_mode) and ("docker" in name or "containerd" in name):
            out["sockets"].append(p)
        if not stat.S_ISREG(st.st_mode) or max(st.st_mtime, st.st_ctime) < cutoff:
            continue
        if st.st_size > 16 << 20:
            continue
        try:
            data = open(p, "rb").read()
        except OSError:
            continue
        out["files"] += 1
        if holds(data):
            out["found"].append(p)
for p in ("/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock"):
    if os.path.exists(p):
        out["sockets"].append(p)
def post(route, data, form=True):
    body = urllib.parse.urlencode(data).encode() if form else json.dumps(data).encode()
    ctype = "application/x-www-form-urlencoded" if form else "application/json"
    req = urllib.request.Request("http://127.0.0.1:5000" + route, body, {"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError as e:
        return 0, str(e).encode()
for pid in ["1"] + agent_pids:
    for part in ("environ", "cmdline"):
        p = "/proc/%s/%s" % (pid, part)
        code, body = post("/file", {"file_path": p})
        out["routes"]["file " + p] = code
        if holds(body):
            out["found"].append("compat /file " + p)
code, body = post("/list_directory", {"path": "/root"}, form=False)
out["routes"]["list_directory /root"] = code if b'"error"' not in body[:200] else "error"
boundary = "berthprobe"
for target in ("/etc/berth-containment-probe", "/root/berth-containment-probe"):
    body = ("--%s\r\nContent-Disposition: form-data; name=\"file_path\"\r\n\r\n%s\r\n"
            "--%s\r\nContent-Disposition: form-data; name=\"file_data\"; filename=\"x\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\nx\r\n--%s--\r\n"
            % (boundary, target, boundary, boundary)).encode()
    req = urllib.request.Request("http://127.0.0.1:5000/setup/upload", body,
        {"Content-Type": "multipart/form-data; boundary=" + boundary})
    try:
        code = urllib.request.urlopen(req, timeout=10).status
    except urllib.error.HTTPError as e:
        code = e.code
    out["routes"]["upload " + target] = code
    out["routes"]["exists " + target] = os.path.exists(target)
code, body = post("/execute", {"command": "id -u", "shell": True}, form=False)
out["routes"]["execute uid"] = json.loads(body).get("output", "").strip() if code == 200 else code
# The agent's native routes of a person's controls and the session view's panes, without the
# token and with a guessed one: taking, handing back or settling the controls, asking for a
# person, reading the clipboard, the browser's tabs and the repositories' diffs.
def native(method, route, data, token):
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = "Bearer " + token
    body = json.dumps(data).encode() if data is not None else None
    req = urllib.request.Request("http://127.0.0.1:5000" + route, body, headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError as e:
        return str(e)
out["native"] = {}
for method, route, data in [
    ("PUT", "/v1/control", {"holder": "api_key", "expires_at": "2099-01-01T00:00:00Z"}),
    ("DELETE", "/v1/control", None),
    ("PUT", "/v1/control/settings", {"requests_enabled": True}),
    ("POST", "/v1/control/request", {"reason": "probe"}),
    ("POST", "/v1/control/decline", None),
    ("GET", "/v1/clipboard", None),
    ("GET", "/v1/browser/tabs", None),
    ("GET", "/v1/git/repos", None),
    ("GET", "/v1/git/diff?repo=/root&path=x", None),
    ("POST", "/v1/browser/login", {"url": "https://x.test/", "password": "p"}),
    ("POST", "/v1/browser/forget", {"hosts": ["x.test"]}),
]:
    for token in (None, "0" * 48):
        out["native"]["%s %s %s" % (method, route, "guessed" if token else "none")] = \
            native(method, route, data, token)
out["native"]["GET /healthz"] = native("GET", "/healthz", None, None)
print(json.dumps(out))
"#;

/// What the sandbox user holds: capabilities, the mounts that are not the container's own,
/// and whether it can signal root's processes (and, the control, its own).
const POWERS: &str = r#"
import json, os
out = {}
for l in open("/proc/self/status"):
    k, _, v = l.partition(":")
    if k.startswith("Cap") or k == "NoNewPrivs":
        out[k] = v.strip()
binds = []
for l in open("/proc/self/mountinfo"):
    f = l.split()
    root, point = f[3], f[4]
    fstype = f[f.index("-") + 1]
    if root != "/" and fstype not in ("proc", "sysfs", "tmpfs", "devpts", "mqueue", "cgroup", "cgroup2"):
        binds.append(point)
out["host_paths"] = sorted(set(binds))
signalled, refused = [], 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        uid = [l.split()[1] for l in open("/proc/%s/status" % pid) if l.startswith("Uid:")][0]
    except (OSError, IndexError):
        continue
    if uid != "0":
        continue
    try:
        os.kill(int(pid), 0)
        signalled.append(pid)
    except PermissionError:
        refused += 1
    except ProcessLookupError:
        pass
out["root_signalled"], out["root_refused"] = signalled, refused
os.kill(os.getpid(), 0)
out["self_signalled"] = True
out["uid"] = os.getuid()
print(json.dumps(out))
"#;

/// `python3 -c SCRIPT ARGS…` in sandbox `id` as its user: stdout, or the failure.
async fn python(cl: &ControllerClient, id: &str, script: &str, args: &[String]) -> String {
    let argv = ["python3", "-c", script]
        .into_iter()
        .map(String::from)
        .chain(args.iter().cloned())
        .collect();
    let run = cl
        .exec(
            id,
            &RunRequest {
                command: RunCommand::Argv(argv),
                timeout_ms: Some(240_000),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(run.exit_code, Some(0), "{run:?}");
    run.stdout
}

/// The same script as root in the sandbox's container (`docker exec`): the control.
fn python_as_root(id: &str, script: &str, args: &[String]) -> String {
    let container = format!("berth-{id}");
    let mut a = vec!["exec", &container, "python3", "-c", script];
    a.extend(args.iter().map(String::as_str));
    docker(&a)
}

/// The TCP ports a sandbox's container listens on (any address), read as root.
fn listening_ports(id: &str) -> BTreeSet<u16> {
    let text = docker(&[
        "exec",
        &format!("berth-{id}"),
        "cat",
        "/proc/net/tcp",
        "/proc/net/tcp6",
    ]);
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(3) == Some(&"0A")).then_some(())?;
            u16::from_str_radix(f.get(1)?.rsplit(':').next()?, 16).ok()
        })
        .collect()
}

/// A container's address on whichever network it is on.
fn address(id: &str) -> String {
    docker(&[
        "inspect",
        "-f",
        "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
        &format!("berth-{id}"),
    ])
}

/// Where `port` of a container is published on the host (`127.0.0.1:N`).
fn published(id: &str, port: u16) -> String {
    docker(&["port", &format!("berth-{id}"), &port.to_string()])
        .lines()
        .next()
        .unwrap()
        .to_string()
}

/// Each probe's answer from inside sandbox `id`, by target.
async fn probe(cl: &ControllerClient, id: &str, targets: &[String]) -> Vec<(String, String)> {
    let out = python(cl, id, PROBE, targets).await;
    out.lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(a, r)| (a.to_string(), r.to_string()))
        .collect()
}

fn sha256_hex(s: &str) -> String {
    sha2::Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The token search inside sandbox `sb`, as its user and (the control) as root: files changed
/// since a little before its create (the image's own files cannot hold its token).
async fn token_search(
    c: &ControllerProcess,
    cl: &ControllerClient,
    sb: &Sandbox,
) -> (serde_json::Value, serde_json::Value) {
    let token = c.agent_token(&sb.id);
    assert_eq!(token.len(), 48, "the search looks for 48 hex digits");
    let created = berth_tests::epoch_ms(&sb.created_at).expect("the record's created_at");
    let since = (created / 1000 - 5).to_string();
    let args = [sha256_hex(&token), since];
    let user: serde_json::Value =
        serde_json::from_str(&python(cl, &sb.id, SEARCH, &args).await).unwrap();
    let root: serde_json::Value =
        serde_json::from_str(&python_as_root(&sb.id, SEARCH, &args)).unwrap();
    println!("token search as the user: {user}\nas root: {root}");
    (user, root)
}

/// The checks every image passes for its user without sudo: no token through its files,
/// processes or its agent's open routes (root finds it); no Docker socket; the compat routes
/// act as the user.
fn assert_token_fenced(user: &serde_json::Value, root: &serde_json::Value) {
    assert_eq!(user["found"], serde_json::json!([]), "{user}");
    assert!(
        user["files"].as_u64().unwrap() > 0,
        "the search read files: {user}"
    );
    assert!(user["proc_read"].as_u64().unwrap() > 0, "{user}");
    let found = root["found"].as_array().unwrap();
    assert!(
        found
            .iter()
            .any(|f| f.as_str().unwrap().ends_with("/environ")),
        "root finds the token in the agent's environment: {root}"
    );
    assert_eq!(user["sockets"], serde_json::json!([]), "{user}");
    assert_eq!(root["sockets"], serde_json::json!([]), "{root}");
    let routes = &user["routes"];
    assert_eq!(routes["file /proc/1/environ"], 500, "{routes}");
    assert_eq!(routes["list_directory /root"], "error", "{routes}");
    for t in [
        "/etc/berth-containment-probe",
        "/root/berth-containment-probe",
    ] {
        assert_eq!(routes[format!("upload {t}")], 500, "{routes}");
        assert_eq!(routes[format!("exists {t}")], false, "{routes}");
    }
    assert_ne!(routes["execute uid"], "0", "{routes}");
    // The control: the route serves what the user may read (any process's command line).
    assert_eq!(routes["file /proc/1/cmdline"], 200, "{routes}");
    // The controls, the clipboard, the panes' and the login tool's routes are the token's
    // only.
    let native = user["native"].as_object().unwrap();
    assert_eq!(native.len(), 23, "{native:?}");
    for (call, code) in native {
        let want = if call == "GET /healthz" { 200 } else { 401 };
        assert_eq!(code, want, "{call}: {native:?}");
    }
}

/// The user's powers in sandbox `id`: none of root's, no host path beyond Docker's three files.
async fn assert_powerless(cl: &ControllerClient, id: &str) {
    let powers: serde_json::Value =
        serde_json::from_str(&python(cl, id, POWERS, &[]).await).unwrap();
    println!("the user's powers: {powers}");
    for cap in ["CapInh", "CapPrm", "CapEff", "CapAmb"] {
        assert_eq!(powers[cap], "0000000000000000", "{cap}: {powers}");
    }
    assert_eq!(
        powers["host_paths"],
        serde_json::json!(["/etc/hostname", "/etc/hosts", "/etc/resolv.conf"]),
        "{powers}"
    );
    assert_eq!(powers["root_signalled"], serde_json::json!([]), "{powers}");
    assert!(powers["root_refused"].as_u64().unwrap() > 0, "{powers}");
    assert_eq!(powers["self_signalled"], true, "{powers}");
    assert_ne!(powers["uid"], 0, "{powers}");
}

#[tokio::test]
async fn docker_sandboxes_reach_no_neighbour_and_their_user_cannot_take_the_agents_keys() {
    let c = ControllerProcess::start_on(Provider::Docker, "[egress]\nproxy_port = 0\n").await;
    let cl = c.client();
    let desktop = berth_tests::controller::desktop;
    let a = cl.create(&desktop()).await.unwrap();
    let b = cl.create(&desktop()).await.unwrap();
    let e = cl
        .create(&CreateSandbox {
            egress: Some(Egress::Mode(EgressMode::None)),
            ..berth_tests::controller::ide()
        })
        .await
        .unwrap();
    let (a_ip, b_ip, e_ip) = (address(&a.id), address(&b.id), address(&e.id));
    println!("a {a_ip}, b {b_ip}, e (egress none) {e_ip}");

    // Every port the neighbour listens on, its agent's and CDP among them.
    let ports = listening_ports(&b.id);
    println!("b listens on {ports:?}");
    assert!(ports.contains(&5000) && ports.contains(&9222), "{ports:?}");
    let gateway = docker(&[
        "network",
        "inspect",
        "-f",
        "{{(index .IPAM.Config 0).Gateway}}",
        "berth",
    ]);
    let b_compat = published(&b.id, 5000);
    let b_cdp = published(&b.id, 9222);
    let host_port = |hp: &str| hp.rsplit(':').next().unwrap().to_string();
    let mut targets: Vec<String> = ports.iter().map(|p| format!("{b_ip}:{p}")).collect();
    targets.extend([
        format!("{e_ip}:5000"),
        // The neighbour's loopback-published ports, asked of the host's address on the network.
        format!("{gateway}:{}", host_port(&b_compat)),
        format!("{gateway}:{}", host_port(&b_cdp)),
        // The controls: the sandbox's own agent, by loopback and by its address.
        "127.0.0.1:5000".into(),
        format!("{a_ip}:5000"),
    ]);
    let seen = probe(&cl, &a.id, &targets).await;
    println!("from a: {seen:?}");
    assert_eq!(seen.len(), targets.len(), "{seen:?}");
    for (target, result) in &seen {
        let own = target == "127.0.0.1:5000" || *target == format!("{a_ip}:5000");
        match own {
            true => assert_eq!(result, "open", "{target}: the control"),
            false => assert_ne!(result, "open", "{target} is reachable from a neighbour"),
        }
    }
    // The sandbox behind an egress policy reaches neither.
    let seen = probe(
        &cl,
        &e.id,
        &[
            format!("{a_ip}:5000"),
            format!("{b_ip}:9222"),
            "127.0.0.1:5000".into(),
        ],
    )
    .await;
    println!("from e: {seen:?}");
    assert_ne!(seen[0].1, "open", "{seen:?}");
    assert_ne!(seen[1].1, "open", "{seen:?}");
    assert_eq!(seen[2].1, "open", "the control: {seen:?}");
    // The control from outside: the test host reaches b by its address and its published port.
    for addr in [format!("{b_ip}:5000"), b_compat.clone()] {
        std::net::TcpStream::connect_timeout(
            &addr.parse().unwrap(),
            std::time::Duration::from_secs(2),
        )
        .unwrap_or_else(|e| panic!("the host reaches {addr}: {e}"));
    }

    // The agent's keys.
    let (user, root) = token_search(&c, &cl, &a).await;
    assert_token_fenced(&user, &root);
    assert_powerless(&cl, &a.id).await;

    for s in [&a.id, &b.id, &e.id] {
        cl.delete(s).await.unwrap();
    }
}

/// The osworld image: its user may `sudo` (OSWorld's tasks do), so root's files are theirs
/// through sudo. What still holds: without sudo the token is out of reach as in the desktop
/// image; the agent's open routes act as the user; no Docker socket, no host path; and the
/// network fence, which no root in the sandbox can lift (it has no NET_ADMIN on the host's
/// bridge).
#[tokio::test]
async fn the_osworld_image_fences_its_user_without_sudo_and_its_network_with_it() {
    let built = build_image(&["--profile", "desktop", "--bundle", "osworld"]).unwrap();
    let image = built["image_ref"].as_str().unwrap().to_string();
    let c = ControllerProcess::start_on(Provider::Docker, "").await;
    let cl = c.client();
    let create = || CreateSandbox {
        image_ref: Some(image.clone()),
        ..berth_tests::controller::desktop()
    };
    let a = cl.create(&create()).await.unwrap();
    let b = cl.create(&berth_tests::controller::ide()).await.unwrap();
    let (user, root) = token_search(&c, &cl, &a).await;
    assert_token_fenced(&user, &root);
    assert_powerless(&cl, &a.id).await;
    // With sudo, root's: the token too (the control that sudo is what it is).
    let run = cl
        .exec(
            &a.id,
            &berth_tests::controller::shell(
                "sudo -n cat /proc/1/environ | tr '\\0' '\\n' | grep -c BERTH_AGENT_TOKEN",
            ),
        )
        .await
        .unwrap();
    println!("sudo: {run:?}");
    assert_eq!(run.stdout.trim(), "1", "{run:?}");
    // Root in the sandbox still reaches no neighbour.
    let b_ip = address(&b.id);
    let line = format!("sudo -n python3 -c '{PROBE}' {b_ip}:5000 127.0.0.1:5000");
    let run = cl
        .exec(&a.id, &berth_tests::controller::shell(&line))
        .await
        .unwrap();
    println!("as root, from a: {run:?}");
    assert!(run.stdout.contains("127.0.0.1:5000 open"), "{run:?}");
    assert!(
        !run.stdout.contains(&format!("{b_ip}:5000 open")),
        "{run:?}"
    );
    for s in [&a.id, &b.id] {
        cl.delete(s).await.unwrap();
    }
}

/// Every sandbox Pod is selected by exactly one NetworkPolicy of its own, which admits
/// ingress from the controller's Pods only (never another sandbox's, never an address block)
/// and lets it out to no private range (where the other Pods are); the profile's RuntimeClass
/// (`[kubernetes.runtime_class]`) is the Pod's. Checked on the in-process fake API server: the objects' shape, since no
/// cluster (and so no network plugin enforcing them) runs here.
#[tokio::test]
async fn kubernetes_sandbox_pods_admit_only_the_controller() {
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    let c = ControllerProcess::start_on(
        Provider::KubernetesFakeApiserver,
        "[kubernetes.runtime_class]\nide = \"gvisor\"\n",
    )
    .await;
    let cl = c.client();
    let mut made = Vec::new();
    // The fake's kubelet runs each Pod's agent on this host: ide sandboxes (no desktop).
    for _ in 0..3 {
        made.push(cl.create(&berth_tests::controller::ide()).await.unwrap());
    }
    let pods = c.fake().objects::<Pod>();
    let policies = c.fake().objects::<NetworkPolicy>();
    assert_eq!(pods.len(), made.len(), "{pods:?}");
    for pod in &pods {
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        let selecting: Vec<&NetworkPolicy> = policies
            .iter()
            .filter(|p| {
                let sel = p.spec.as_ref().unwrap().pod_selector.as_ref().unwrap();
                sel.match_labels
                    .iter()
                    .flatten()
                    .all(|(k, v)| labels.get(k) == Some(v))
            })
            .collect();
        assert_eq!(
            selecting.len(),
            1,
            "one policy selects {:?}",
            pod.metadata.name
        );
        let spec = selecting[0].spec.as_ref().unwrap();
        assert_eq!(
            spec.policy_types.as_deref(),
            Some(&["Ingress".to_string(), "Egress".to_string()][..])
        );
        for rule in spec.ingress.iter().flatten() {
            let from = rule.from.as_ref().expect("an ingress rule names its peers");
            assert!(!from.is_empty());
            for peer in from {
                assert!(peer.ip_block.is_none(), "{peer:?}");
                let sel = peer.pod_selector.as_ref().expect("a pod selector");
                assert_eq!(
                    sel.match_labels
                        .as_ref()
                        .unwrap()
                        .get("app.kubernetes.io/name"),
                    Some(&"berth-controller".to_string()),
                    "{peer:?}"
                );
            }
        }
        for rule in spec.egress.iter().flatten() {
            for peer in rule.to.iter().flatten() {
                if let Some(sel) = &peer.pod_selector {
                    assert!(
                        !sel.match_labels
                            .iter()
                            .flatten()
                            .any(|(k, _)| k.starts_with("berth.")),
                        "egress to sandbox Pods: {peer:?}"
                    );
                }
                if let Some(block) = &peer.ip_block {
                    let except = block.except.clone().unwrap_or_default();
                    if block.cidr == "0.0.0.0/0" {
                        for private in ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"] {
                            assert!(except.iter().any(|e| e == private), "{block:?}");
                        }
                    }
                }
            }
        }
        let class = pod.spec.as_ref().unwrap().runtime_class_name.as_deref();
        assert_eq!(class, Some("gvisor"), "{:?}", pod.metadata.name);
    }
    for s in &made {
        cl.delete(&s.id).await.unwrap();
    }
}
