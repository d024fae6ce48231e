//! The provider against a mock service (`mock::pair` below + `kube::Client::new`):
//! no Kubernetes API server runs on the machines these tests run on, so every request the
//! provider makes is checked here (method, path, query, body as the real `k8s_openapi` type)
//! and answered with real `k8s_openapi` objects. Port-forward needs an HTTP upgrade, which a
//! mock service cannot give: it runs against a small in-process API server over plain HTTP,
//! reached through a kubeconfig, like a real one.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Request, Response};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::client::Body;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::objects::{self, Settings};
use super::{KubernetesProvider, RBAC};
use crate::config::{KubeEgress, KubeReach, KubernetesConfig};
use crate::provider::{Identity, Provider, Spec};

type Handle = mock::Handle<Request<Body>, Response<Body>>;

/// A tower service over a channel: each request the client makes arrives at the test's
/// `Handle`, which answers it (or drops it: the client's call fails).
mod mock {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use tokio::sync::{mpsc, oneshot};

    type Error = Box<dyn std::error::Error + Send + Sync>;

    pub struct SendResponse<T>(oneshot::Sender<T>);

    impl<T> SendResponse<T> {
        pub fn send_response(self, response: T) {
            let _ = self.0.send(response);
        }
    }

    pub struct Handle<Req, Resp>(mpsc::UnboundedReceiver<(Req, SendResponse<Resp>)>);

    impl<Req, Resp> Handle<Req, Resp> {
        /// The next request, or None once the client is gone.
        pub async fn next_request(&mut self) -> Option<(Req, SendResponse<Resp>)> {
            self.0.recv().await
        }
    }

    pub struct Mock<Req, Resp>(mpsc::UnboundedSender<(Req, SendResponse<Resp>)>);

    pub fn pair<Req, Resp>() -> (Mock<Req, Resp>, Handle<Req, Resp>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Mock(tx), Handle(rx))
    }

    impl<Req: Send + 'static, Resp: Send + 'static> tower::Service<Req> for Mock<Req, Resp> {
        type Response = Resp;
        type Error = Error;
        type Future = Pin<Box<dyn Future<Output = Result<Resp, Error>> + Send>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: Req) -> Self::Future {
            let (tx, rx) = oneshot::channel();
            let sent = self.0.send((req, SendResponse(tx))).is_ok();
            Box::pin(async move {
                if !sent {
                    return Err("the test's handle is gone".into());
                }
                rx.await
                    .map_err(|_| "the test dropped the request unanswered".into())
            })
        }
    }
}

const NS: &str = "berth";
const CTL: &str = "ctl_0123456789abcdef";
const SB: &str = "sb_00aa11bb22cc33dd";
const POD: &str = "berth-sb-00aa11bb22cc33dd";
const TOKEN: &str = "tok-SECRET-4711";

fn spec(desktop: bool) -> Spec {
    Spec {
        identity: Identity {
            controller_id: CTL.into(),
            sandbox_id: SB.into(),
            profile: "desktop-ubuntu".into(),
            image_ref: "registry.local:5000/berth/desktop:4f2a".into(),
        },
        desktop,
        ide: None,
        agent_token: TOKEN.into(),
        browser_toolset_enable: Vec::new(),
        memory_merge: false,
        egress: Default::default(),
        limits: berth_protocol::controller::Limits {
            cpus: Some(2.0),
            memory_mb: Some(4096),
            ..Default::default()
        },
    }
}

/// The controller's egress book and edge (its CA in a temporary dir, kept while it lives).
pub(super) fn egress_parts() -> (super::EgressParts, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let ca = Arc::new(crate::egress::ca::Ca::load_or_create(dir.path(), "test").unwrap());
    let edge = Arc::new(crate::egress::edge::Edge::new(ca, Vec::new(), &[]).unwrap());
    let (book, _notes) = crate::egress::Book::new();
    let gate = super::Gate { book, edge };
    let parts = super::EgressParts {
        gate,
        hosts: Default::default(),
        proxy_port: 0,
    };
    (parts, dir)
}

fn settings(reach: KubeReach, agent_port: u16) -> Settings {
    Settings {
        namespace: NS.into(),
        agent_port,
        reach,
        egress: KubeEgress::Public,
        image_pull_secrets: vec!["regcred".into()],
        seccomp_localhost_profile: None,
        runtime_class: Default::default(),
        controller_namespace: Some(NS.into()),
        egress_route: None,
    }
}

fn provider(
    reach: KubeReach,
    agent_port: u16,
    cfg: &KubernetesConfig,
) -> (Arc<KubernetesProvider>, Handle) {
    let (svc, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(svc, NS);
    let p = KubernetesProvider::new(client, settings(reach, agent_port), cfg)
        .with_poll(Duration::from_millis(10));
    (Arc::new(p), handle)
}

/// A request as the API server would see it.
struct Got {
    method: Method,
    path: String,
    query: BTreeMap<String, String>,
    raw: Vec<u8>,
}

impl Got {
    fn json<T: serde::de::DeserializeOwned>(&self) -> T {
        serde_json::from_slice(&self.raw).unwrap_or_else(|e| {
            panic!(
                "{} {}: the body is no such object ({e}): {}",
                self.method,
                self.path,
                String::from_utf8_lossy(&self.raw)
            )
        })
    }
}

/// The (API group, resource, verb) a request is authorized as.
fn permission_of(
    method: &Method,
    path: &str,
    query: &BTreeMap<String, String>,
) -> (String, String, String) {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (group, rest) = match parts[0] {
        "api" => ("", &parts[2..]),
        "apis" => (parts[1], &parts[3..]),
        other => panic!("not an API path: {other}"),
    };
    assert_eq!(rest[0], "namespaces", "{path}: every call is namespaced");
    assert_eq!(rest[1], NS, "{path}");
    let resource = match rest.get(4) {
        Some(sub) => format!("{}/{sub}", rest[2]),
        None => rest[2].to_string(),
    };
    let named = rest.len() > 3;
    let verb = match (method.as_str(), named) {
        ("GET", true) => "get",
        ("GET", false) if query.get("watch").is_some_and(|w| w == "true") => "watch",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("DELETE", _) => "delete",
        (m, _) => panic!("unexpected method {m}"),
    };
    (group.to_string(), resource, verb.to_string())
}

fn assert_allowed(method: &Method, path: &str, query: &BTreeMap<String, String>) {
    let (group, resource, verb) = permission_of(method, path, query);
    assert!(
        RBAC.iter().any(|p| p.api_group == group
            && p.resource == resource
            && p.verbs.contains(&verb.as_str())),
        "{method} {path} ({group}/{resource} {verb}) is not in RBAC"
    );
}

async fn next(h: &mut Handle) -> (Got, mock::SendResponse<Response<Body>>) {
    let (req, send) = tokio::time::timeout(Duration::from_secs(20), h.next_request())
        .await
        .expect("the provider made no request within 20 s")
        .expect("the client went away");
    let (parts, body) = req.into_parts();
    let raw = body.collect_bytes().await.unwrap().to_vec();
    let query: BTreeMap<String, String> = parts
        .uri
        .query()
        .map(|q| serde_urlencoded::from_str(q).unwrap())
        .unwrap_or_default();
    let path = parts.uri.path().to_string();
    assert_allowed(&parts.method, &path, &query);
    (
        Got {
            method: parts.method,
            path,
            query,
            raw,
        },
        send,
    )
}

fn reply(send: mock::SendResponse<Response<Body>>, status: u16, body: impl serde::Serialize) {
    send.send_response(
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap(),
    );
}

fn status(code: u16, reason: &str, message: &str) -> serde_json::Value {
    serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                       "message": message, "reason": reason, "code": code})
}

fn not_found(send: mock::SendResponse<Response<Body>>) {
    reply(send, 404, status(404, "NotFound", "not found"));
}

/// The object as the API server gives it back: a uid, a creation time.
fn made<T: serde::Serialize + serde::de::DeserializeOwned>(obj: &T, uid: &str) -> T {
    let mut v = serde_json::to_value(obj).unwrap();
    v["metadata"]["uid"] = uid.into();
    v["metadata"]["creationTimestamp"] = "2026-12-01T10:00:00Z".into();
    v["metadata"]["resourceVersion"] = "7".into();
    serde_json::from_value(v).unwrap()
}

fn pod_status(pod: &Pod, status: serde_json::Value) -> Pod {
    let mut v = serde_json::to_value(pod).unwrap();
    v["status"] = status;
    serde_json::from_value(v).unwrap()
}

fn running(ip: &str) -> serde_json::Value {
    serde_json::json!({
        "phase": "Running", "podIP": ip,
        "containerStatuses": [{"name": "agent", "image": "i", "imageID": "", "ready": true,
                               "restartCount": 0, "state": {"running": {}}}]
    })
}

fn oom_killed() -> serde_json::Value {
    serde_json::json!({
        "phase": "Failed",
        "containerStatuses": [{"name": "agent", "image": "i", "imageID": "", "ready": false,
                               "restartCount": 0,
                               "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]
    })
}

/// The Pod the provider makes for `spec`, as the API server holds it.
fn stored_pod(spec: &Spec, reach: KubeReach, port: u16, status: serde_json::Value) -> Pod {
    let owner = objects::Owner {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: objects::owner_name(CTL),
        uid: "uid-owner".into(),
    };
    let pod = made(
        &objects::pod(spec, &settings(reach, port), &owner),
        "uid-pod",
    );
    pod_status(&pod, status)
}

/// A stand-in agent: answers every request `200 {"ok":true}` and records the request heads.
struct FakeAgent {
    port: u16,
    heads: Arc<Mutex<Vec<String>>>,
}

impl FakeAgent {
    async fn start() -> FakeAgent {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let seen = heads.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    seen.lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&buf).into_owned());
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{\"ok\":true}")
                        .await;
                });
            }
        });
        FakeAgent { port, heads }
    }
}

#[tokio::test]
async fn mock_apiserver_create_makes_owner_pod_policy_and_secret_and_probes_the_pod_ip() {
    let agent = FakeAgent::start().await;
    let (p, mut h) = provider(KubeReach::PodIp, agent.port, &KubernetesConfig::default());
    let s = spec(true);
    let task = tokio::spawn({
        let (p, s) = (p.clone(), s.clone());
        async move { p.create(&s).await }
    });

    // The owner ConfigMap: looked for, then made.
    let (g, tx) = next(&mut h).await;
    assert_eq!(g.method, Method::GET);
    assert_eq!(
        g.path,
        "/api/v1/namespaces/berth/configmaps/berth-controller-ctl-0123456789abcdef"
    );
    not_found(tx);
    let (g, tx) = next(&mut h).await;
    assert_eq!(
        (&g.method, g.path.as_str()),
        (&Method::POST, "/api/v1/namespaces/berth/configmaps")
    );
    let cm: ConfigMap = g.json();
    let labels = cm.metadata.labels.clone().unwrap();
    assert_eq!(labels["berth.controller"], CTL);
    assert_eq!(labels["berth.managed"], "true");
    reply(tx, 201, made(&cm, "uid-owner"));

    // The Pod.
    let (g, tx) = next(&mut h).await;
    assert_eq!(
        (&g.method, g.path.as_str()),
        (&Method::POST, "/api/v1/namespaces/berth/pods")
    );
    assert!(
        !String::from_utf8_lossy(&g.raw).contains(TOKEN),
        "the token is in the Pod"
    );
    let pod: Pod = g.json();
    let m = &pod.metadata;
    assert_eq!(m.name.as_deref(), Some(POD));
    assert_eq!(m.namespace.as_deref(), Some(NS));
    let labels = m.labels.clone().unwrap();
    assert_eq!(labels["berth.controller"], CTL);
    assert_eq!(labels["berth.sandbox"], SB);
    assert_eq!(labels["berth.profile"], "desktop-ubuntu");
    assert_eq!(labels["berth.managed"], "true");
    assert!(!labels.contains_key("berth.image_ref"));
    assert_eq!(
        m.annotations.as_ref().unwrap()["berth.image_ref"],
        "registry.local:5000/berth/desktop:4f2a"
    );
    let owner = &m.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
        (
            "ConfigMap",
            "berth-controller-ctl-0123456789abcdef",
            "uid-owner"
        )
    );
    let ps = pod.spec.as_ref().unwrap();
    assert_eq!(ps.automount_service_account_token, Some(false));
    assert_eq!(ps.restart_policy.as_deref(), Some("Never"));
    assert_eq!(ps.image_pull_secrets.as_ref().unwrap()[0].name, "regcred");
    let c = &ps.containers[0];
    assert_eq!(
        c.image.as_deref(),
        Some("registry.local:5000/berth/desktop:4f2a")
    );
    let args = c.args.clone().unwrap();
    assert_eq!(
        args,
        [
            "--listen".to_string(),
            format!("0.0.0.0:{}", agent.port),
            "--cdp-listen".into(),
            "0.0.0.0:9222".into(),
            "--desktop".into()
        ]
    );
    let env = c.env.clone().unwrap();
    assert_eq!(env.len(), 1);
    assert_eq!(
        (env[0].name.as_str(), env[0].value.as_deref()),
        ("BERTH_AGENT_TOKEN_FILE", Some("/run/berth/token/token"))
    );
    let volumes = ps.volumes.clone().unwrap();
    let mounts = c.volume_mounts.clone().unwrap();
    let token_mount = mounts
        .iter()
        .find(|m| m.mount_path == "/run/berth/token")
        .unwrap();
    assert_eq!(token_mount.read_only, Some(true));
    let token_vol = volumes.iter().find(|v| v.name == token_mount.name).unwrap();
    assert_eq!(
        token_vol.secret.as_ref().unwrap().secret_name.as_deref(),
        Some("berth-sb-00aa11bb22cc33dd-token")
    );
    let shm_mount = mounts.iter().find(|m| m.mount_path == "/dev/shm").unwrap();
    let shm = volumes.iter().find(|v| v.name == shm_mount.name).unwrap();
    assert_eq!(
        shm.empty_dir.as_ref().unwrap().medium.as_deref(),
        Some("Memory")
    );
    let r = c.resources.as_ref().unwrap();
    for q in [r.requests.as_ref().unwrap(), r.limits.as_ref().unwrap()] {
        assert_eq!(q["cpu"].0, "2000m");
        assert_eq!(q["memory"].0, "4096Mi");
    }
    let probe = c
        .readiness_probe
        .as_ref()
        .unwrap()
        .http_get
        .as_ref()
        .unwrap();
    assert_eq!(probe.path.as_deref(), Some("/healthz"));
    assert_eq!(probe.port, IntOrString::Int(agent.port.into()));
    assert!(probe.http_headers.is_none(), "the probe carries no token");
    assert_eq!(
        ps.security_context
            .as_ref()
            .unwrap()
            .seccomp_profile
            .as_ref()
            .unwrap()
            .type_,
        "RuntimeDefault"
    );
    let pod = made(&pod, "uid-pod");
    reply(tx, 201, &pod);

    // The NetworkPolicy, owned by the Pod.
    let (g, tx) = next(&mut h).await;
    assert_eq!(
        (&g.method, g.path.as_str()),
        (
            &Method::POST,
            "/apis/networking.k8s.io/v1/namespaces/berth/networkpolicies"
        )
    );
    let np: NetworkPolicy = g.json();
    assert_eq!(np.metadata.name.as_deref(), Some(POD));
    let owner = &np.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Pod", "uid-pod")
    );
    assert_eq!(np.metadata.labels.as_ref().unwrap()["berth.sandbox"], SB);
    let nps = np.spec.as_ref().unwrap();
    assert_eq!(
        nps.pod_selector
            .as_ref()
            .unwrap()
            .match_labels
            .as_ref()
            .unwrap()["berth.sandbox"],
        SB
    );
    let ingress = nps.ingress.as_ref().unwrap();
    assert_eq!(ingress.len(), 1);
    let from = &ingress[0].from.as_ref().unwrap()[0];
    assert_eq!(
        from.pod_selector
            .as_ref()
            .unwrap()
            .match_labels
            .as_ref()
            .unwrap()["app.kubernetes.io/name"],
        "berth-controller"
    );
    let ports: Vec<_> = ingress[0]
        .ports
        .as_ref()
        .unwrap()
        .iter()
        .map(|p| p.port.clone().unwrap())
        .collect();
    assert_eq!(
        ports,
        [IntOrString::Int(agent.port.into()), IntOrString::Int(9222)]
    );
    let egress = nps.egress.as_ref().unwrap();
    let dns = &egress[0];
    assert_eq!(
        dns.to.as_ref().unwrap()[0]
            .pod_selector
            .as_ref()
            .unwrap()
            .match_labels
            .as_ref()
            .unwrap()["k8s-app"],
        "kube-dns"
    );
    let public = egress[1].to.as_ref().unwrap()[0].ip_block.as_ref().unwrap();
    assert_eq!(public.cidr, "0.0.0.0/0");
    assert!(
        public
            .except
            .as_ref()
            .unwrap()
            .contains(&"169.254.0.0/16".to_string())
    );
    assert!(
        public
            .except
            .as_ref()
            .unwrap()
            .contains(&"10.0.0.0/8".to_string())
    );
    reply(tx, 201, made(&np, "uid-np"));

    // The token Secret, owned by the Pod, last.
    let (g, tx) = next(&mut h).await;
    assert_eq!(
        (&g.method, g.path.as_str()),
        (&Method::POST, "/api/v1/namespaces/berth/secrets")
    );
    let secret: Secret = g.json();
    assert_eq!(
        secret.metadata.name.as_deref(),
        Some("berth-sb-00aa11bb22cc33dd-token")
    );
    assert_eq!(secret.data.as_ref().unwrap()["token"].0, TOKEN.as_bytes());
    let owner = &secret.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Pod", "uid-pod")
    );
    reply(tx, 201, made(&secret, "uid-secret"));

    // Read until Running with an IP, then the agent is probed there.
    let (g, tx) = next(&mut h).await;
    assert_eq!(
        (&g.method, g.path.as_str()),
        (
            &Method::GET,
            "/api/v1/namespaces/berth/pods/berth-sb-00aa11bb22cc33dd"
        )
    );
    reply(
        tx,
        200,
        pod_status(
            &pod,
            serde_json::json!({"phase": "Pending", "containerStatuses": [{
                "name": "agent", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": "ContainerCreating"}}}]}),
        ),
    );
    let (g, tx) = next(&mut h).await;
    assert_eq!(g.method, Method::GET);
    assert_eq!(g.path, format!("/api/v1/namespaces/berth/pods/{POD}"));
    reply(tx, 200, pod_status(&pod, running("127.0.0.1")));

    let ep = tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .expect("create did not answer")
        .unwrap()
        .unwrap();
    assert_eq!(ep.agent_url, format!("http://127.0.0.1:{}", agent.port));
    assert_eq!(ep.compat_url, ep.agent_url);
    assert_eq!(ep.cdp_url.as_deref(), Some("http://127.0.0.1:9222"));
    let heads = agent.heads.lock().unwrap().clone();
    assert!(
        heads.iter().any(|h| h.starts_with("GET /healthz ")),
        "{heads:?}"
    );
    assert!(
        heads
            .iter()
            .all(|h| !h.to_lowercase().contains("authorization")),
        "{heads:?}"
    );
}

/// Answers the provider's create requests the way an API server would, with the Pod in
/// `status` whenever it is read.
fn answer_create(mut h: Handle, status: serde_json::Value) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let mut reads = 0;
        loop {
            let Ok(Some((req, send))) =
                tokio::time::timeout(Duration::from_secs(20), h.next_request()).await
            else {
                return reads;
            };
            let (parts, body) = req.into_parts();
            let raw = body.collect_bytes().await.unwrap();
            let path = parts.uri.path().to_string();
            match (parts.method.as_str(), path.rsplit('/').nth(1).unwrap_or("")) {
                ("GET", "configmaps") => {
                    let cm = objects::owner_config_map(CTL, NS);
                    reply(send, 200, made(&cm, "uid-owner"));
                }
                ("POST", _) => {
                    let v: serde_json::Value = serde_json::from_slice(&raw).unwrap();
                    reply(send, 201, made(&v, "uid-made"));
                }
                ("GET", "pods") => {
                    reads += 1;
                    let pod = stored_pod(&spec(false), KubeReach::PodIp, 5000, status.clone());
                    reply(send, 200, pod);
                }
                (m, _) => panic!("unexpected {m} {path}"),
            }
        }
    })
}

#[tokio::test]
async fn mock_apiserver_create_fails_naming_oom_and_a_pull_that_never_succeeds() {
    let (p, h) = provider(KubeReach::PodIp, 5000, &KubernetesConfig::default());
    let answering = answer_create(h, oom_killed());
    let e = p.create(&spec(false)).await.unwrap_err().to_string();
    assert_eq!(e, "OOMKilled");
    drop(p);
    answering.abort();

    let cfg = KubernetesConfig {
        start_timeout_secs: Some(1),
        ..Default::default()
    };
    let (p, h) = provider(KubeReach::PodIp, 5000, &cfg);
    let answering = answer_create(
        h,
        serde_json::json!({"phase": "Pending", "containerStatuses": [{
            "name": "agent", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ImagePullBackOff",
                                  "message": "Back-off pulling image \"registry.local:5000/x\""}}}]}),
    );
    let e = tokio::time::timeout(Duration::from_secs(20), p.create(&spec(false)))
        .await
        .expect("a pull that never succeeds is bounded")
        .unwrap_err()
        .to_string();
    assert!(e.contains("ImagePullBackOff"), "{e}");
    assert!(e.contains("Back-off pulling image"), "{e}");
    drop(p);
    assert!(
        answering.await.unwrap() > 1,
        "the Pod was read until the bound"
    );

    // Running, but nothing answers at the Pod IP: bounded too, saying where it looked.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let (p, h) = provider(KubeReach::PodIp, closed, &cfg);
    let answering = answer_create(h, running("127.0.0.1"));
    let e = tokio::time::timeout(Duration::from_secs(20), p.create(&spec(false)))
        .await
        .expect("an agent that never answers is bounded")
        .unwrap_err()
        .to_string();
    assert!(e.contains("did not answer within 1 s"), "{e}");
    assert!(e.contains(&format!("http://127.0.0.1:{closed}")), "{e}");
    assert!(e.contains("app.kubernetes.io/name=berth-controller"), "{e}");
    drop(p);
    answering.abort();
}

#[tokio::test]
async fn mock_apiserver_inspect_list_and_destroy() {
    let (p, mut h) = provider(KubeReach::PodIp, 5000, &KubernetesConfig::default());

    // inspect: by name.
    let task = tokio::spawn({
        let p = p.clone();
        async move { p.inspect(SB).await }
    });
    let (g, tx) = next(&mut h).await;
    assert_eq!(
        (&g.method, g.path.as_str()),
        (
            &Method::GET,
            "/api/v1/namespaces/berth/pods/berth-sb-00aa11bb22cc33dd"
        )
    );
    reply(
        tx,
        200,
        stored_pod(&spec(true), KubeReach::PodIp, 5000, running("10.4.0.7")),
    );
    let o = task.await.unwrap().unwrap().unwrap();
    assert_eq!(o.identity, spec(true).identity);
    assert!(o.alive);
    let ep = o.endpoint.unwrap();
    assert_eq!(ep.agent_url, "http://10.4.0.7:5000");
    assert_eq!(ep.cdp_url.as_deref(), Some("http://10.4.0.7:9222"));
    assert_eq!(o.created_at_ms, 1_796_119_200_000);

    let task = tokio::spawn({
        let p = p.clone();
        async move { p.inspect("sb_gone").await }
    });
    let (g, tx) = next(&mut h).await;
    assert_eq!(g.path, "/api/v1/namespaces/berth/pods/berth-sb-gone");
    not_found(tx);
    assert!(task.await.unwrap().unwrap().is_none());

    // list: the owner is adopted, then the Pods by label.
    let task = tokio::spawn({
        let p = p.clone();
        async move { p.list(CTL).await }
    });
    let (g, tx) = next(&mut h).await;
    assert_eq!(
        (&g.method, g.path.as_str()),
        (
            &Method::GET,
            "/api/v1/namespaces/berth/configmaps/berth-controller-ctl-0123456789abcdef"
        )
    );
    reply(
        tx,
        200,
        made(&objects::owner_config_map(CTL, NS), "uid-owner"),
    );
    let (g, tx) = next(&mut h).await;
    assert_eq!(
        (&g.method, g.path.as_str()),
        (&Method::GET, "/api/v1/namespaces/berth/pods")
    );
    assert_eq!(
        g.query["labelSelector"],
        "berth.controller=ctl_0123456789abcdef"
    );
    assert!(!g.query.contains_key("watch"));
    let mut dead_spec = spec(false);
    dead_spec.identity.sandbox_id = "sb_dead".into();
    reply(
        tx,
        200,
        serde_json::json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "42"},
            "items": [stored_pod(&spec(true), KubeReach::PodIp, 5000, running("10.4.0.7")),
                      stored_pod(&dead_spec, KubeReach::PodIp, 5000, oom_killed())]}),
    );
    let list = task.await.unwrap().unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(list[0].identity.sandbox_id, SB);
    assert!(list[0].alive);
    assert_eq!(list[1].identity.sandbox_id, "sb_dead");
    assert!(!list[1].alive && list[1].endpoint.is_none());

    // destroy: Pod, NetworkPolicy, Secret, in the background; 404s are fine.
    let task = tokio::spawn({
        let p = p.clone();
        async move { p.destroy(SB).await }
    });
    for (path, answer) in [
        (
            "/api/v1/namespaces/berth/pods/berth-sb-00aa11bb22cc33dd",
            200,
        ),
        (
            "/apis/networking.k8s.io/v1/namespaces/berth/networkpolicies/berth-sb-00aa11bb22cc33dd",
            404,
        ),
        (
            "/api/v1/namespaces/berth/secrets/berth-sb-00aa11bb22cc33dd-token",
            200,
        ),
    ] {
        let (g, tx) = next(&mut h).await;
        assert_eq!((&g.method, g.path.as_str()), (&Method::DELETE, path));
        let options: serde_json::Value = g.json();
        assert_eq!(options["propagationPolicy"], "Background", "{path}");
        match answer {
            200 => reply(
                tx,
                200,
                serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                                                      "status": "Success", "code": 200}),
            ),
            _ => not_found(tx),
        }
    }
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn mock_apiserver_deaths_come_from_a_watch_that_relists_on_410() {
    let (p, mut h) = provider(KubeReach::PodIp, 5000, &KubernetesConfig::default());
    let mut deaths = p.deaths(CTL).unwrap();

    // The first list: what runs now (nothing dead).
    let (g, tx) = next(&mut h).await;
    assert_eq!(
        (&g.method, g.path.as_str()),
        (&Method::GET, "/api/v1/namespaces/berth/pods")
    );
    assert_eq!(
        g.query["labelSelector"],
        "berth.controller=ctl_0123456789abcdef"
    );
    assert!(!g.query.contains_key("watch"));
    let live = stored_pod(&spec(true), KubeReach::PodIp, 5000, running("10.4.0.7"));
    let mut other = spec(false);
    other.identity.sandbox_id = "sb_other".into();
    let mut other_pod = stored_pod(&other, KubeReach::PodIp, 5000, running("10.4.0.8"));
    other_pod.metadata.uid = Some("uid-other".into());
    reply(
        tx,
        200,
        serde_json::json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "100"},
                           "items": [live, other_pod]}),
    );

    // The watch from that version: an OOM kill (twice: reported once), a deletion by
    // someone else, then "too old", which makes it list again.
    let (g, tx) = next(&mut h).await;
    assert_eq!(
        (&g.method, g.path.as_str()),
        (&Method::GET, "/api/v1/namespaces/berth/pods")
    );
    assert_eq!(g.query["watch"], "true");
    assert_eq!(g.query["resourceVersion"], "100");
    assert_eq!(
        g.query["labelSelector"],
        "berth.controller=ctl_0123456789abcdef"
    );
    assert_eq!(g.query["timeoutSeconds"], "290");
    assert_eq!(g.query["allowWatchBookmarks"], "true");
    let oom = stored_pod(&spec(true), KubeReach::PodIp, 5000, oom_killed());
    let events = [
        serde_json::json!({"type": "MODIFIED", "object": stored_pod(&spec(true), KubeReach::PodIp, 5000, running("10.4.0.7"))}),
        serde_json::json!({"type": "MODIFIED", "object": oom}),
        serde_json::json!({"type": "MODIFIED", "object": oom}),
        serde_json::json!({"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1",
                                                          "metadata": {"resourceVersion": "120"}}}),
        serde_json::json!({"type": "DELETED", "object": other_pod_json(&other)}),
        serde_json::json!({"type": "ERROR", "object": status(410, "Expired", "too old resource version: 100 (130)")}),
    ];
    let body: Vec<u8> = events
        .iter()
        .flat_map(|e| {
            let mut line = serde_json::to_vec(e).unwrap();
            line.push(b'\n');
            line
        })
        .collect();
    tx.send_response(
        Response::builder()
            .status(200)
            .body(Body::from(body))
            .unwrap(),
    );

    let d = tokio::time::timeout(Duration::from_secs(20), deaths.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (d.sandbox_id.as_str(), d.reason.as_str()),
        (SB, "OOMKilled")
    );
    let d = tokio::time::timeout(Duration::from_secs(20), deaths.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (d.sandbox_id.as_str(), d.reason.as_str()),
        ("sb_other", "its Pod was deleted")
    );

    // 410: a fresh list (no version), not a watch from a version the server forgot.
    let (g, tx) = next(&mut h).await;
    assert_eq!(g.path, "/api/v1/namespaces/berth/pods");
    assert!(!g.query.contains_key("watch"), "{:?}", g.query);
    assert!(!g.query.contains_key("resourceVersion"), "{:?}", g.query);
    reply(
        tx,
        200,
        serde_json::json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "130"},
                           "items": []}),
    );
    let (g, _tx) = next(&mut h).await;
    assert_eq!(g.query["watch"], "true");
    assert_eq!(g.query["resourceVersion"], "130");
    assert!(deaths.try_recv().is_err(), "the OOM kill was reported once");
}

fn other_pod_json(other: &Spec) -> Pod {
    let mut p = stored_pod(other, KubeReach::PodIp, 5000, running("10.4.0.8"));
    p.metadata.uid = Some("uid-other".into());
    p
}

/// A small API server over plain HTTP: the Pod reads as Running, port-forward upgrades to
/// the v4 channel protocol and answers each byte upper-cased; everything else is 404.
async fn fake_apiserver(seen: Arc<Mutex<Vec<String>>>) -> std::net::SocketAddr {
    use axum::extract::ws::{Message, WebSocketUpgrade};
    use axum::extract::{Path, RawQuery};
    use axum::routing::get;

    let pods = {
        let seen = seen.clone();
        move |Path((_ns, name)): Path<(String, String)>, headers: http::HeaderMap| {
            let seen = seen.clone();
            async move {
                let auth = headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                seen.lock().unwrap().push(format!("GET pod {name} {auth}"));
                let pod = stored_pod(
                    &spec(true),
                    KubeReach::PortForward,
                    5000,
                    running("10.9.9.9"),
                );
                axum::Json(pod)
            }
        }
    };
    let forward = {
        let seen = seen.clone();
        move |Path((_ns, name)): Path<(String, String)>,
              RawQuery(q): RawQuery,
              ws: WebSocketUpgrade| {
            let seen = seen.clone();
            async move {
                seen.lock()
                    .unwrap()
                    .push(format!("portforward {name} {:?}", {
                        let q: BTreeMap<String, String> =
                            serde_urlencoded::from_str(&q.unwrap_or_default()).unwrap();
                        q
                    }));
                ws.protocols(["v4.channel.k8s.io"])
                    .on_upgrade(|mut ws| async move {
                        let port = 5000u16.to_le_bytes();
                        for ch in [0u8, 1] {
                            if ws
                                .send(Message::Binary(vec![ch, port[0], port[1]].into()))
                                .await
                                .is_err()
                            {
                                return;
                            }
                        }
                        while let Some(Ok(m)) = ws.recv().await {
                            if let Message::Binary(b) = m
                                && b.len() > 1
                                && b[0] == 0
                            {
                                let mut out = vec![0u8];
                                out.extend(b[1..].to_ascii_uppercase());
                                if ws.send(Message::Binary(out.into())).await.is_err() {
                                    return;
                                }
                            }
                        }
                    })
            }
        }
    };
    let app = axum::Router::new()
        .route(
            "/api/v1/namespaces/{ns}/pods/{name}",
            get(pods).delete(|| async {
                (
                    http::StatusCode::NOT_FOUND,
                    axum::Json(status(404, "NotFound", "not found")),
                )
            }),
        )
        .route(
            "/api/v1/namespaces/{ns}/pods/{name}/portforward",
            get(forward),
        )
        .fallback(|| async {
            (
                http::StatusCode::NOT_FOUND,
                axum::Json(status(404, "NotFound", "not found")),
            )
        });
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    addr
}

#[tokio::test]
async fn mock_apiserver_port_forward_over_a_plain_http_kubeconfig() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let addr = fake_apiserver(seen.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{addr}\n\
             users:\n- name: fake\n  user:\n    token: kube-token-1\ncontexts:\n- name: fake\n  context:\n    \
             cluster: fake\n    user: fake\n    namespace: berth\ncurrent-context: fake\n"
        ),
    )
    .unwrap();
    let cfg = KubernetesConfig {
        kubeconfig: Some(kubeconfig),
        reach: Some(KubeReach::PortForward),
        ..Default::default()
    };
    let (parts, _ca_dir) = egress_parts();
    let p = KubernetesProvider::connect(&cfg, parts).await.unwrap();
    assert!(
        !p.enforces_egress(),
        "out of the Pod network there is no way to the proxy"
    );
    assert_eq!(
        p.settings().namespace,
        "berth",
        "the kubeconfig context's namespace"
    );
    assert_eq!(p.settings().reach, KubeReach::PortForward);

    let o = p.inspect(SB).await.unwrap().unwrap();
    let ep = o.endpoint.unwrap();
    assert!(
        ep.agent_url.starts_with("http://127.0.0.1:"),
        "{}",
        ep.agent_url
    );
    let cdp = ep.cdp_url.clone().unwrap();
    assert!(
        cdp.starts_with("http://127.0.0.1:") && cdp != ep.agent_url,
        "{cdp}"
    );
    // The same forwards on a second look.
    assert_eq!(p.inspect(SB).await.unwrap().unwrap().endpoint.unwrap(), ep);

    let local = ep.agent_url.trim_start_matches("http://").to_string();
    for word in ["ping", "berth"] {
        let mut c = tokio::net::TcpStream::connect(&local).await.unwrap();
        c.write_all(word.as_bytes()).await.unwrap();
        let mut buf = vec![0u8; word.len()];
        tokio::time::timeout(Duration::from_secs(20), c.read_exact(&mut buf))
            .await
            .expect("nothing came back through the port-forward")
            .unwrap();
        assert_eq!(buf, word.to_uppercase().as_bytes());
    }
    let seen_now = seen.lock().unwrap().clone();
    assert!(
        seen_now
            .iter()
            .any(|s| s == &format!("GET pod {POD} Bearer kube-token-1")),
        "{seen_now:?}"
    );
    assert_eq!(
        seen_now
            .iter()
            .filter(|s| s.starts_with("portforward"))
            .count(),
        2,
        "one port-forward per connection: {seen_now:?}"
    );
    assert!(
        seen_now
            .iter()
            .any(|s| s == &format!("portforward {POD} {{\"ports\": \"5000\"}}")),
        "{seen_now:?}"
    );

    // destroy: deletes that find nothing are fine; the listeners close.
    p.destroy(SB).await.unwrap();
    let gone = berth_tests_free_wait(|| {
        let local = local.clone();
        async move { tokio::net::TcpStream::connect(&local).await.is_err() }
    })
    .await;
    assert!(gone, "the forward still listens after destroy");
}

/// Waits (bounded) for a condition.
async fn berth_tests_free_wait<F, Fut>(mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::Instant::now() < deadline {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[test]
fn rbac_lists_each_resource_once_with_only_known_verbs() {
    let mut seen = std::collections::BTreeSet::new();
    for p in RBAC {
        assert!(seen.insert((p.api_group, p.resource)), "{p:?} twice");
        for v in p.verbs {
            assert!(
                ["get", "list", "watch", "create", "delete"].contains(v),
                "{v}"
            );
        }
    }
    // No update/patch anywhere: the provider never changes an object it made.
    assert!(
        RBAC.iter()
            .all(|p| !p.verbs.contains(&"update") && !p.verbs.contains(&"patch"))
    );
}
