//! An in-process fake Kubernetes API server for tests (no real API server can run on these
//! machines). It speaks the API over plain HTTP on 127.0.0.1: namespaced CRUD of Pods,
//! Secrets, ConfigMaps and NetworkPolicies as real Kubernetes JSON (every write is checked
//! against the `k8s-openapi` types), `409 AlreadyExists` / `404 NotFound` as `Status` objects,
//! lists by label and field selector, watches of `WatchEvent` lines with increasing
//! resourceVersions (410 Gone past its bounded history), deletes with `propagationPolicy` and
//! the garbage collector's ownerReference cascade, and `pods/{name}/portforward` over
//! WebSocket (`v4.channel.k8s.io`). Its own kubelet runs each Pod's container as a real
//! `berth-agent` process on a Pod IP of its own in 127.0.0.0/8 (see [`kubelet`]).
//!
//! Tests inspect it directly: the objects stored, the requests seen, each Pod's agent pid
//! and root; and act on it: [`kill_pod`](FakeApiServer::kill_pod),
//! [`fail_pod`](FakeApiServer::fail_pod), [`hold_pending`](FakeApiServer::hold_pending),
//! [`compact`](FakeApiServer::compact).
//!
//! It runs on a runtime of its own (its own threads), so a test blocked in a synchronous call
//! never stalls it, and it outlives any controller process the test restarts.

pub mod kubelet;
pub mod store;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path as UrlPath, RawQuery, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use futures_util::{SinkExt, StreamExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use kubelet::PodRuntime;
use store::{ApiError, ApiResult, FieldSelector, Key, Kind, Propagation, Selector, Store};

/// One request the fake answered.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestRecord {
    pub method: String,
    pub path: String,
    /// The decoded query parameters, in order.
    pub query: Vec<(String, String)>,
    /// The JSON body of a write, when it had one.
    pub body: Option<Value>,
}

impl RequestRecord {
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// `METHOD /path?query` as logged.
    pub fn line(&self) -> String {
        let q: Vec<String> = self.query.iter().map(|(k, v)| format!("{k}={v}")).collect();
        match q.is_empty() {
            true => format!("{} {}", self.method, self.path),
            false => format!("{} {}?{}", self.method, self.path, q.join("&")),
        }
    }

    pub fn is_watch(&self) -> bool {
        self.param("watch").is_some_and(|w| w == "true" || w == "1")
    }
}

pub struct Shared {
    pub store: Mutex<Store>,
    pub pods: Mutex<BTreeMap<Key, PodRuntime>>,
    pub hold_pending: AtomicBool,
    pub held: Mutex<Vec<Key>>,
    pub requests: Mutex<Vec<RequestRecord>>,
    pub agent_bin: PathBuf,
    /// Where Pod roots live.
    pub root: PathBuf,
    runtime: Mutex<Option<tokio::runtime::Handle>>,
}

pub struct FakeApiServer {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    shared: Arc<Shared>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    dir: tempfile::TempDir,
}

impl FakeApiServer {
    /// Starts a fake API server whose kubelet runs the workspace's `berth-agent`.
    pub fn start() -> FakeApiServer {
        FakeApiServer::start_with_agent(crate::workspace_bin("berth-agent"))
    }

    pub fn start_with_agent(agent_bin: PathBuf) -> FakeApiServer {
        let dir = tempfile::Builder::new()
            .prefix("berth-fake-apiserver-")
            .tempdir()
            .expect("tempdir");
        let (kubelet_tx, kubelet_rx) = tokio::sync::mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::new(kubelet_tx)),
            pods: Mutex::new(BTreeMap::new()),
            hold_pending: AtomicBool::new(false),
            held: Mutex::new(Vec::new()),
            requests: Mutex::new(Vec::new()),
            agent_bin,
            root: dir.path().join("pods"),
            runtime: Mutex::new(None),
        });
        std::fs::create_dir_all(&shared.root).unwrap();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (shutdown_tx, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
        let s = shared.clone();
        std::thread::Builder::new()
            .name("fake-apiserver".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async move {
                    *s.runtime.lock().unwrap() = Some(tokio::runtime::Handle::current());
                    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                    let addr = listener.local_addr().unwrap();
                    tokio::spawn(kubelet::run(s.clone(), kubelet_rx));
                    let app = axum::Router::new()
                        .route(
                            "/api/v1/namespaces/{ns}/pods/{name}/portforward",
                            axum::routing::get(portforward),
                        )
                        .fallback(handle)
                        .with_state(s.clone());
                    ready_tx.send(addr).unwrap();
                    let server = axum::serve(listener, app);
                    tokio::select! {
                        _ = server => {}
                        _ = shutdown_rx => {}
                    }
                });
                rt.shutdown_timeout(Duration::from_secs(1));
            })
            .expect("fake apiserver thread");
        let addr = ready_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the fake API server starts");
        FakeApiServer {
            url: format!("http://{addr}"),
            shared,
            shutdown: Some(shutdown_tx),
            dir,
        }
    }

    /// A kubeconfig for this server (plain HTTP, no credentials) with `namespace` as the
    /// context's namespace.
    pub fn kubeconfig(&self, namespace: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake-apiserver\n  cluster:\n    \
             server: {}\ncontexts:\n- name: fake-apiserver\n  context:\n    cluster: \
             fake-apiserver\n    user: fake-apiserver\n    namespace: {namespace}\n\
             current-context: fake-apiserver\nusers:\n- name: fake-apiserver\n  user: {{}}\n",
            self.url
        )
    }

    /// Writes [`kubeconfig`](Self::kubeconfig) to `path`.
    pub fn write_kubeconfig(&self, path: &Path, namespace: &str) {
        std::fs::write(path, self.kubeconfig(namespace)).unwrap();
    }

    /// Every stored object of `K`'s kind (all namespaces), by namespace and name.
    pub fn objects<K: k8s_openapi::Resource + DeserializeOwned>(&self) -> Vec<K> {
        let kind = Kind::from_kind(K::KIND).expect("a kind the fake serves");
        self.shared
            .store
            .lock()
            .unwrap()
            .all()
            .filter(|(k, _)| k.kind == kind)
            .map(|(_, v)| serde_json::from_value(v.clone()).expect("stored objects are valid"))
            .collect()
    }

    /// The stored JSON of every object of `kind` (`"Pod"`, `"Secret"`, …).
    pub fn objects_json(&self, kind: &str) -> Vec<Value> {
        let kind = Kind::from_kind(kind).expect("a kind the fake serves");
        self.shared
            .store
            .lock()
            .unwrap()
            .all()
            .filter(|(k, _)| k.kind == kind)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// The object of `K`'s kind named `name` (any namespace).
    pub fn get<K: k8s_openapi::Resource + DeserializeOwned>(&self, name: &str) -> Option<K> {
        let kind = Kind::from_kind(K::KIND).expect("a kind the fake serves");
        self.shared
            .store
            .lock()
            .unwrap()
            .all()
            .find(|(k, _)| k.kind == kind && k.name == name)
            .map(|(_, v)| serde_json::from_value(v.clone()).expect("stored objects are valid"))
    }

    /// Every request answered so far, in order.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// Forgets the requests seen so far.
    pub fn clear_requests(&self) {
        self.shared.requests.lock().unwrap().clear();
    }

    /// The resourceVersion of the last write.
    pub fn resource_version(&self) -> u64 {
        self.shared.store.lock().unwrap().resource_version()
    }

    fn runtime_of(&self, name: &str) -> Option<(Key, PodRuntime)> {
        self.shared
            .pods
            .lock()
            .unwrap()
            .iter()
            .find(|(k, _)| k.name == name)
            .map(|(k, r)| (k.clone(), r.clone()))
    }

    /// The pid of the agent a Pod's container runs (`None` before it starts, once it ended).
    pub fn agent_pid(&self, pod: &str) -> Option<u32> {
        self.runtime_of(pod).and_then(|(_, r)| r.pid)
    }

    /// Pod name → agent pid, for every Pod whose agent runs.
    pub fn agent_pids(&self) -> BTreeMap<String, u32> {
        self.shared
            .pods
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(k, r)| Some((k.name.clone(), r.pid?)))
            .collect()
    }

    /// Every live process of a Pod (its agent and all it started).
    pub fn pod_processes(&self, pod: &str) -> Vec<u32> {
        self.runtime_of(pod)
            .map(|(_, r)| crate::processes_matching(&r.root.display().to_string()))
            .unwrap_or_default()
    }

    /// The live processes of every Pod, started by this fake's kubelet.
    pub fn all_pod_processes(&self) -> Vec<u32> {
        crate::processes_matching(&self.shared.root.display().to_string())
    }

    /// Where a Pod's container runs: `state/`, `home/`, `volumes/<name>/`, `container.log`.
    pub fn pod_root(&self, pod: &str) -> Option<PathBuf> {
        self.runtime_of(pod).map(|(_, r)| r.root)
    }

    /// The Pod IP the kubelet gave a Pod.
    pub fn pod_ip(&self, pod: &str) -> Option<std::net::Ipv4Addr> {
        self.runtime_of(pod).map(|(_, r)| r.ip)
    }

    /// Kills a Pod's container as a crash would (SIGKILL to everything in it): the Pod turns
    /// `Failed` with exit code 137, reason `Error`.
    pub fn kill_pod(&self, pod: &str) {
        let (_, rt) = self.runtime_of(pod).expect("a running Pod");
        kubelet::kill_all(&rt.root);
    }

    /// Kills a Pod's container and reports `reason` (`OOMKilled`) as its termination reason.
    pub fn fail_pod(&self, pod: &str, reason: &str) {
        let (key, rt) = self.runtime_of(pod).expect("a running Pod");
        if let Some(r) = self.shared.pods.lock().unwrap().get_mut(&key) {
            r.forced_reason = Some(reason.to_string());
        }
        kubelet::kill_all(&rt.root);
    }

    /// While held, created Pods stay `Pending` (unscheduled); released, they start.
    pub fn hold_pending(&self, hold: bool) {
        use std::sync::atomic::Ordering;
        self.shared.hold_pending.store(hold, Ordering::SeqCst);
        if !hold {
            let held: Vec<Key> = std::mem::take(&mut *self.shared.held.lock().unwrap());
            let rt = self.shared.runtime.lock().unwrap().clone();
            if let Some(rt) = rt {
                for k in held {
                    rt.spawn(kubelet::start(self.shared.clone(), k));
                }
            }
        }
    }

    /// Forgets the watch history: a watch from an earlier resourceVersion is answered
    /// `410 Gone` (the client must list again).
    pub fn compact(&self) {
        self.shared.store.lock().unwrap().compact();
    }

    /// The temp dir holding every Pod root.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        kubelet::kill_all(&self.shared.root);
    }
}

fn error_response(e: &ApiError) -> Response {
    let code = StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        code,
        [("content-type", "application/json")],
        e.status().to_string(),
    )
        .into_response()
}

fn json_response(code: StatusCode, v: &Value) -> Response {
    (code, [("content-type", "application/json")], v.to_string()).into_response()
}

fn parse_query(raw: Option<&str>) -> Vec<(String, String)> {
    raw.map(url_decode_pairs).unwrap_or_default()
}

fn url_decode_pairs(q: &str) -> Vec<(String, String)> {
    fn dec(s: &str) -> String {
        let s = s.replace('+', " ");
        let b = s.as_bytes();
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'%'
                && i + 2 < b.len()
                && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16)
            {
                out.push(v);
                i += 3;
                continue;
            }
            out.push(b[i]);
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (dec(k), dec(v)),
            None => (dec(p), String::new()),
        })
        .collect()
}

fn param<'a>(q: &'a [(String, String)], name: &str) -> Option<&'a str> {
    q.iter()
        .rev()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// What a request path names.
enum Target {
    Version,
    Discovery,
    Namespace(String),
    Collection {
        kind: Kind,
        namespace: Option<String>,
    },
    Object {
        key: Key,
        sub: Option<String>,
    },
}

fn target(path: &str) -> ApiResult<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let not_found = || {
        ApiError::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    };
    let (group, rest) = match segs.as_slice() {
        ["version"] => return Ok(Target::Version),
        ["api"] | ["apis"] | ["api", "v1"] => return Ok(Target::Discovery),
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", group, "v1", rest @ ..] => (*group, rest),
        _ => return Err(not_found()),
    };
    match rest {
        ["namespaces", ns] if group.is_empty() => Ok(Target::Namespace(ns.to_string())),
        [plural] => Ok(Target::Collection {
            kind: Kind::from_path(group, "v1", plural).ok_or_else(not_found)?,
            namespace: None,
        }),
        ["namespaces", ns, plural, tail @ ..] => {
            let kind = Kind::from_path(group, "v1", plural).ok_or_else(not_found)?;
            match tail {
                [] => Ok(Target::Collection {
                    kind,
                    namespace: Some(ns.to_string()),
                }),
                [name] | [name, _] => Ok(Target::Object {
                    key: Key {
                        kind,
                        namespace: ns.to_string(),
                        name: name.to_string(),
                    },
                    sub: tail.get(1).map(|s| s.to_string()),
                }),
                _ => Err(not_found()),
            }
        }
        _ => Err(not_found()),
    }
}

async fn handle(
    State(s): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let query = parse_query(uri.query());
    let body_json: Option<Value> = serde_json::from_slice(&body).ok();
    s.requests.lock().unwrap().push(RequestRecord {
        method: method.to_string(),
        path: uri.path().to_string(),
        query: query.clone(),
        body: body_json.clone(),
    });
    let request = ApiRequest {
        method: method.as_str(),
        path: uri.path(),
        query: &query,
        headers: &headers,
        body: body_json,
        raw: &body,
    };
    match serve(&s, &request).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
}

/// A request to the API as the routes see it.
struct ApiRequest<'a> {
    method: &'a str,
    path: &'a str,
    query: &'a [(String, String)],
    headers: &'a HeaderMap,
    /// The body, when it is JSON.
    body: Option<Value>,
    /// The body as sent.
    raw: &'a [u8],
}

impl ApiRequest<'_> {
    /// The JSON body a write needs; a 400 when it is not JSON.
    fn need_body(&self) -> ApiResult<Value> {
        self.body.clone().ok_or_else(|| {
            ApiError::bad_request(format!(
                "the request body is not JSON ({} bytes)",
                self.raw.len()
            ))
        })
    }

    /// The 405 for a method its target does not take.
    fn not_allowed(&self) -> ApiError {
        ApiError::new(
            405,
            "MethodNotAllowed",
            format!(
                "the server does not allow this method on the requested resource ({} {})",
                self.method, self.path
            ),
        )
    }
}

async fn serve(s: &Arc<Shared>, req: &ApiRequest<'_>) -> ApiResult<Response> {
    match (target(req.path)?, req.method) {
        (Target::Version, "GET") => Ok(json_response(StatusCode::OK, &version_info())),
        (Target::Discovery, "GET") => Ok(json_response(
            StatusCode::OK,
            &json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}),
        )),
        (Target::Namespace(ns), "GET") => Ok(json_response(
            StatusCode::OK,
            &json!({
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": ns, "uid": format!("ns-{ns}")},
                "status": {"phase": "Active"},
            }),
        )),
        (Target::Namespace(ns), "DELETE") => Ok(delete_namespace(s, &ns)),
        (Target::Collection { kind, namespace }, _) => serve_collection(s, kind, namespace, req),
        (Target::Object { key, sub }, _) => serve_object(s, key, sub, req),
        _ => Err(req.not_allowed()),
    }
}

/// A collection's routes: list (or watch), create, delete by selectors.
fn serve_collection(
    s: &Arc<Shared>,
    kind: Kind,
    namespace: Option<String>,
    req: &ApiRequest<'_>,
) -> ApiResult<Response> {
    let query = req.query;
    match (namespace, req.method) {
        (namespace, "GET") => {
            let labels = Selector::parse(param(query, "labelSelector").unwrap_or(""))?;
            let fields = FieldSelector::parse(param(query, "fieldSelector").unwrap_or(""))?;
            if param(query, "watch").is_some_and(|w| w == "true" || w == "1") {
                return watch(s, kind, namespace, labels, fields, query);
            }
            Ok(list_collection(
                s,
                kind,
                namespace.as_deref(),
                &labels,
                &fields,
                query,
            ))
        }
        (Some(ns), "POST") => {
            let obj = req.need_body()?;
            let created = s.store.lock().unwrap().create(kind, &ns, obj)?;
            Ok(json_response(StatusCode::CREATED, &created))
        }
        (Some(ns), "DELETE") => delete_collection(s, kind, &ns, query, req.body.as_ref()),
        _ => Err(req.not_allowed()),
    }
}

/// An object's routes: get (and its `status`, and a Pod's `log`), replace, patch, delete.
fn serve_object(
    s: &Arc<Shared>,
    key: Key,
    sub: Option<String>,
    req: &ApiRequest<'_>,
) -> ApiResult<Response> {
    match (sub.as_deref(), req.method) {
        (None, "GET") => {
            let o = s.store.lock().unwrap().get(&key)?;
            Ok(json_response(StatusCode::OK, &o))
        }
        (Some("status"), "GET") => {
            let o = s.store.lock().unwrap().get(&key)?;
            Ok(json_response(StatusCode::OK, &o))
        }
        (Some("log"), "GET") if key.kind == Kind::Pod => pod_log(s, &key, req.query),
        (None, "PUT") => {
            let o = s.store.lock().unwrap().replace(&key, req.need_body()?)?;
            Ok(json_response(StatusCode::OK, &o))
        }
        (None, "PATCH") => {
            let ct = req
                .headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            patch_object(s, &key, &ct, req.need_body()?)
        }
        (None, "DELETE") => {
            let (propagation, grace) = delete_options(req.query, req.body.as_ref())?;
            let o = s.store.lock().unwrap().delete(&key, propagation, grace)?;
            Ok(json_response(StatusCode::OK, &o))
        }
        _ => Err(req.not_allowed()),
    }
}

/// `/version`: the fake's build, as a real API server reports its own.
fn version_info() -> Value {
    json!({
        "major": "1", "minor": "37", "gitVersion": "v1.37.0-fake-apiserver",
        "gitCommit": "", "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go", "compiler": "gc", "platform": "linux/amd64",
    })
}

/// `DELETE` of a namespace: every object in it is deleted (in the background); the answer is
/// the namespace, `Terminating`.
fn delete_namespace(s: &Shared, ns: &str) -> Response {
    let mut store = s.store.lock().unwrap();
    let keys: Vec<Key> = store
        .all()
        .filter(|(k, _)| k.namespace == ns)
        .map(|(k, _)| k.clone())
        .collect();
    for k in keys {
        let _ = store.delete(&k, Some(Propagation::Background), None);
    }
    json_response(
        StatusCode::OK,
        &json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ns}, "status": {"phase": "Terminating"},
        }),
    )
}

/// A list of a collection, paged by `limit` and `continue` (the token is the last item's
/// `namespace/name`).
fn list_collection(
    s: &Shared,
    kind: Kind,
    namespace: Option<&str>,
    labels: &Selector,
    fields: &FieldSelector,
    query: &[(String, String)],
) -> Response {
    let store = s.store.lock().unwrap();
    let mut items = store.list(kind, namespace, labels, fields);
    let mut meta = json!({"resourceVersion": store.resource_version().to_string()});
    drop(store);
    if let Some(after) = param(query, "continue").filter(|c| !c.is_empty()) {
        let after = after.to_string();
        items.retain(|o| {
            let k = format!(
                "{}/{}",
                o["metadata"]["namespace"].as_str().unwrap_or_default(),
                o["metadata"]["name"].as_str().unwrap_or_default()
            );
            k > after
        });
    }
    if let Some(limit) = param(query, "limit").and_then(|l| l.parse::<usize>().ok())
        && limit > 0
        && items.len() > limit
    {
        let rest = items.len() - limit;
        items.truncate(limit);
        let last = items.last().unwrap();
        meta["continue"] = json!(format!(
            "{}/{}",
            last["metadata"]["namespace"].as_str().unwrap_or_default(),
            last["metadata"]["name"].as_str().unwrap_or_default()
        ));
        meta["remainingItemCount"] = json!(rest);
    }
    json_response(
        StatusCode::OK,
        &json!({
            "kind": format!("{}List", kind.name()),
            "apiVersion": kind.api_version(),
            "metadata": meta,
            "items": items,
        }),
    )
}

/// `DELETE` of a collection: every object in `ns` the selectors match; the answer lists the
/// objects as deleted.
fn delete_collection(
    s: &Shared,
    kind: Kind,
    ns: &str,
    query: &[(String, String)],
    body: Option<&Value>,
) -> ApiResult<Response> {
    let labels = Selector::parse(param(query, "labelSelector").unwrap_or(""))?;
    let fields = FieldSelector::parse(param(query, "fieldSelector").unwrap_or(""))?;
    let (propagation, grace) = delete_options(query, body)?;
    let mut store = s.store.lock().unwrap();
    let items = store.list(kind, Some(ns), &labels, &fields);
    let mut out = Vec::new();
    for o in items {
        let key = Key {
            kind,
            namespace: ns.to_string(),
            name: o["metadata"]["name"].as_str().unwrap_or_default().into(),
        };
        if let Ok(d) = store.delete(&key, propagation, grace) {
            out.push(d);
        }
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "kind": format!("{}List", kind.name()),
            "apiVersion": kind.api_version(),
            "metadata": {"resourceVersion": store.resource_version().to_string()},
            "items": out,
        }),
    ))
}

/// `pods/{name}/log`: the container's log, its last `tailLines` lines when asked.
fn pod_log(s: &Shared, key: &Key, query: &[(String, String)]) -> ApiResult<Response> {
    s.store.lock().unwrap().get(key)?;
    let root = s.pods.lock().unwrap().get(key).map(|r| r.root.clone());
    let text = root
        .and_then(|r| std::fs::read_to_string(r.join("container.log")).ok())
        .unwrap_or_default();
    let text = match param(query, "tailLines").and_then(|n| n.parse::<usize>().ok()) {
        Some(n) => {
            let lines: Vec<&str> = text.lines().collect();
            let from = lines.len().saturating_sub(n);
            lines[from..].iter().map(|l| format!("{l}\n")).collect()
        }
        None => text,
    };
    Ok((StatusCode::OK, [("content-type", "text/plain")], text).into_response())
}

/// `PATCH` of an object by its content type: a server-side apply creates the object when
/// missing; a merge or strategic-merge patch merges (both as a JSON merge patch here).
fn patch_object(s: &Shared, key: &Key, content_type: &str, patch: Value) -> ApiResult<Response> {
    let mut store = s.store.lock().unwrap();
    let o = match content_type {
        "application/apply-patch+yaml" => match store.get(key) {
            Ok(_) => store.merge_patch(key, &patch)?,
            Err(_) => store.create(key.kind, &key.namespace, patch)?,
        },
        "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
            store.merge_patch(key, &patch)?
        }
        other => {
            return Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!("the fake API server does not take {other:?} patches"),
            ));
        }
    };
    Ok(json_response(StatusCode::OK, &o))
}

/// `propagationPolicy` and `gracePeriodSeconds` from the query or a `DeleteOptions` body.
fn delete_options(
    query: &[(String, String)],
    body: Option<&Value>,
) -> ApiResult<(Option<Propagation>, Option<u64>)> {
    let from_body = |k: &str| body.and_then(|b| b[k].as_str().map(String::from));
    let propagation = param(query, "propagationPolicy")
        .map(String::from)
        .or_else(|| from_body("propagationPolicy"))
        .map(|p| Propagation::parse(&p))
        .transpose()?;
    let grace = param(query, "gracePeriodSeconds")
        .and_then(|g| g.parse().ok())
        .or_else(|| body.and_then(|b| b["gracePeriodSeconds"].as_u64()));
    Ok((propagation, grace))
}

fn watch_line(typ: &str, object: &Value) -> Bytes {
    let mut line = json!({"type": typ, "object": object}).to_string();
    line.push('\n');
    Bytes::from(line)
}

/// Which events and objects a watch sends: its kind, namespace (all when `None`) and
/// selectors.
struct WatchFilter {
    kind: Kind,
    namespace: Option<String>,
    labels: Selector,
    fields: FieldSelector,
}

impl WatchFilter {
    fn matches(&self, k: Kind, ns: &str, o: &Value) -> bool {
        k == self.kind
            && self.namespace.as_deref().is_none_or(|n| n == ns)
            && self.labels.matches(o)
            && self.fields.matches(o)
    }
}

fn watch(
    s: &Arc<Shared>,
    kind: Kind,
    namespace: Option<String>,
    labels: Selector,
    fields: FieldSelector,
    query: &[(String, String)],
) -> ApiResult<Response> {
    let timeout = param(query, "timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .unwrap_or(1800);
    let initial_events = param(query, "sendInitialEvents") == Some("true");
    let rv = param(query, "resourceVersion").filter(|r| !r.is_empty());
    let filter = WatchFilter {
        kind,
        namespace,
        labels,
        fields,
    };
    let store = s.store.lock().unwrap();
    let rx = store.events.subscribe();
    let current = store.resource_version();
    let (initial, expired) = watch_start(&store, &filter, rv, initial_events, current)?;
    drop(store);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
    let head = futures_util::stream::iter(initial.into_iter().map(Ok::<_, std::io::Error>));
    let live = watch_live(rx, filter, expired, current, deadline);
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(Body::from_stream(head.chain(live)))
        .unwrap())
}

/// The lines a watch sends first, by where it starts: the current objects (and the
/// initial-events bookmark when asked), or the history after `rv`; past the history, a 410
/// `Expired` error line, and `true` (the watch then ends).
fn watch_start(
    store: &Store,
    filter: &WatchFilter,
    rv: Option<&str>,
    initial_events: bool,
    current: u64,
) -> ApiResult<(Vec<Bytes>, bool)> {
    let mut initial: Vec<Bytes> = Vec::new();
    let mut expired = false;
    let listed = || {
        store
            .list(
                filter.kind,
                filter.namespace.as_deref(),
                &filter.labels,
                &filter.fields,
            )
            .iter()
            .map(|o| watch_line("ADDED", o))
            .collect::<Vec<_>>()
    };
    match rv {
        _ if initial_events => {
            initial = listed();
            initial.push(watch_line(
                "BOOKMARK",
                &initial_events_end(filter.kind, current),
            ));
        }
        None | Some("0") => initial = listed(),
        Some(n) => {
            let n: u64 = n.parse().map_err(|_| {
                ApiError::bad_request(format!("resourceVersion {n:?} is not a number"))
            })?;
            match store.events_since(n) {
                Some(events) => {
                    initial = events
                        .iter()
                        .filter(|e| filter.matches(e.kind, &e.namespace, &e.object))
                        .map(|e| watch_line(e.typ, &e.object))
                        .collect()
                }
                None => {
                    expired = true;
                    let e = ApiError::new(
                        410,
                        "Expired",
                        format!("too old resource version: {n} ({})", store.compacted() + 1),
                    );
                    initial.push(watch_line("ERROR", &e.status()));
                }
            }
        }
    }
    Ok((initial, expired))
}

/// The bookmark that ends a watch's initial events, at resourceVersion `current`.
fn initial_events_end(kind: Kind, current: u64) -> Value {
    json!({
        "kind": kind.name(), "apiVersion": kind.api_version(),
        "metadata": {
            "resourceVersion": current.to_string(),
            "annotations": {"k8s.io/initial-events-end": "true"},
        },
    })
}

/// The lines of the events after `current` that `filter` matches, as they happen, until the
/// deadline, a lag or the store's end; nothing when the watch `expired`.
fn watch_live(
    rx: tokio::sync::broadcast::Receiver<Arc<store::Event>>,
    filter: WatchFilter,
    expired: bool,
    current: u64,
    deadline: tokio::time::Instant,
) -> impl futures_util::Stream<Item = std::io::Result<Bytes>> {
    futures_util::stream::unfold(
        (rx, filter, expired),
        move |(mut rx, filter, expired)| async move {
            if expired {
                return None;
            }
            loop {
                let got = tokio::time::timeout_at(deadline, rx.recv()).await;
                match got {
                    Ok(Ok(e))
                        if e.rv > current && filter.matches(e.kind, &e.namespace, &e.object) =>
                    {
                        let line = watch_line(e.typ, &e.object);
                        return Some((Ok(line), (rx, filter, expired)));
                    }
                    Ok(Ok(_)) => continue,
                    // Lagged, closed, or past timeoutSeconds: the watch ends (the client
                    // watches again from its last resourceVersion).
                    _ => return None,
                }
            }
        },
    )
}

/// `pods/{name}/portforward`: one WebSocket carries one connection per requested port, on
/// channels `2i` (data) and `2i+1` (error); the first frame of each channel is its port.
async fn portforward(
    State(s): State<Arc<Shared>>,
    UrlPath((ns, name)): UrlPath<(String, String)>,
    RawQuery(raw): RawQuery,
    ws: WebSocketUpgrade,
) -> Response {
    let query = parse_query(raw.as_deref());
    s.requests.lock().unwrap().push(RequestRecord {
        method: "GET".into(),
        path: format!("/api/v1/namespaces/{ns}/pods/{name}/portforward"),
        query: query.clone(),
        body: None,
    });
    let key = Key {
        kind: Kind::Pod,
        namespace: ns,
        name: name.clone(),
    };
    if let Err(e) = s.store.lock().unwrap().get(&key) {
        return error_response(&e);
    }
    let ports: Vec<u16> = query
        .iter()
        .filter(|(k, _)| k == "ports")
        .flat_map(|(_, v)| {
            v.split(',')
                .map(|p| p.trim().parse::<u16>())
                .collect::<Vec<_>>()
        })
        .collect::<Result<_, _>>()
        .unwrap_or_default();
    if ports.is_empty() {
        return error_response(&ApiError::bad_request(
            "ports: at least one port is required",
        ));
    }
    let ip =
        s.pods.lock().unwrap().get(&key).and_then(|r| {
            matches!(r.state, kubelet::ContainerState::Running { .. }).then_some(r.ip)
        });
    let Some(ip) = ip else {
        return error_response(&ApiError::bad_request(format!(
            "unable to upgrade connection: pod {name} is not running"
        )));
    };
    ws.protocols(["v4.channel.k8s.io"])
        .on_upgrade(move |socket| relay(socket, ip, ports))
}

async fn relay(socket: WebSocket, ip: std::net::Ipv4Addr, ports: Vec<u16>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut sink, mut stream) = socket.split();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Message>(64);
    let writer = tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            let close = matches!(m, Message::Close(_));
            if sink.send(m).await.is_err() || close {
                break;
            }
        }
        let _ = sink.close().await;
    });
    let mut writers = Vec::new();
    let mut readers = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let ch = 2 * i as u8;
        let p = port.to_le_bytes();
        for c in [ch, ch + 1] {
            let _ = tx.send(Message::Binary(vec![c, p[0], p[1]].into())).await;
        }
        match tokio::net::TcpStream::connect((ip, *port)).await {
            Ok(conn) => {
                let (mut r, w) = conn.into_split();
                writers.push(Some(w));
                let tx = tx.clone();
                readers.push(tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        match r.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                let mut m = Vec::with_capacity(n + 1);
                                m.push(ch);
                                m.extend_from_slice(&buf[..n]);
                                if tx.send(Message::Binary(m.into())).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                    let _ = tx.send(Message::Close(None)).await;
                }));
            }
            Err(e) => {
                writers.push(None);
                let msg = format!("error forwarding port {port} to pod: {e}");
                let mut m = vec![ch + 1];
                m.extend_from_slice(msg.as_bytes());
                let _ = tx.send(Message::Binary(m.into())).await;
            }
        }
    }
    while let Some(Ok(m)) = stream.next().await {
        match m {
            Message::Binary(b) if b.len() > 1 && b[0] % 2 == 0 => {
                let i = (b[0] / 2) as usize;
                if let Some(Some(w)) = writers.get_mut(i)
                    && w.write_all(&b[1..]).await.is_err()
                {
                    writers[i] = None;
                }
            }
            Message::Close(_) => break,
            _ => {}
        }
    }
    for w in writers.iter_mut().flatten() {
        let _ = w.shutdown().await;
    }
    for r in readers {
        r.abort();
    }
    drop(tx);
    let _ = writer.await;
}
