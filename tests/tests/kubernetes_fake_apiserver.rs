//! The in-process fake Kubernetes API server (no real API server can run on these machines):
//! first checked on its own with the real `kube` client — create, list by label, watch,
//! delete with the ownerReference cascade, Pods that become Running with a real agent,
//! failures the watch delivers, 410 Gone, port-forward — then `berth serve`'s `kubernetes`
//! provider driven against it, asserting the requests it makes.

use std::collections::BTreeMap;
use std::time::Duration;

use berth_tests::kube_fake::FakeApiServer;
use berth_tests::wait_for;
use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

const NS: &str = "berth-fake";
const TOKEN: &str = "fake-apiserver-token-0123456789";

async fn client(fake: &FakeApiServer) -> kube::Client {
    let kc = kube::config::Kubeconfig::from_yaml(&fake.kubeconfig(NS)).unwrap();
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .unwrap();
    kube::Client::try_from(config).unwrap()
}

fn owner() -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": "owner", "labels": {"berth.managed": "true"}},
        "data": {"controller": "c1"},
    }))
    .unwrap()
}

fn owner_ref(owner: &ConfigMap) -> serde_json::Value {
    json!([{
        "apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
        "uid": owner.metadata.uid.clone().unwrap(), "controller": true,
    }])
}

fn token_secret(name: &str, owner: &ConfigMap) -> Secret {
    serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-token"), "ownerReferences": owner_ref(owner)},
        "stringData": {"token": TOKEN},
    }))
    .unwrap()
}

/// A Pod running the agent as the provider's would: token from a Secret volume, the path in
/// the environment, a readiness probe on `/healthz`.
fn agent_pod(name: &str, owner: &ConfigMap) -> Pod {
    serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": {"berth.controller": "c1", "berth.sandbox": name, "berth.managed": "true"},
            "ownerReferences": owner_ref(owner),
        },
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "agent",
                "image": "registry.invalid/berth/desktop:test",
                "args": ["--listen", "0.0.0.0:5000"],
                "env": [{"name": "BERTH_AGENT_TOKEN_FILE", "value": "/run/berth/token/token"}],
                "ports": [{"name": "agent", "containerPort": 5000}],
                "readinessProbe": {"httpGet": {"path": "/healthz", "port": "agent"}, "periodSeconds": 1},
                "volumeMounts": [
                    {"name": "token", "mountPath": "/run/berth/token", "readOnly": true},
                    {"name": "shm", "mountPath": "/dev/shm"},
                ],
            }],
            "volumes": [
                {"name": "token", "secret": {"secretName": format!("{name}-token"), "defaultMode": 0o400}},
                {"name": "shm", "emptyDir": {"medium": "Memory"}},
            ],
        },
    }))
    .unwrap()
}

fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn phase(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

fn api_error(e: kube::Error) -> (u16, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.reason.clone()),
        other => panic!("not an API error: {other}"),
    }
}

/// Creates the owner, the token Secret and the Pod, and waits (on a watch) for it to be Ready.
async fn ready_pod(client: &kube::Client, name: &str) -> (ConfigMap, Pod) {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let owner = match cms.get_opt("owner").await.unwrap() {
        Some(o) => o,
        None => cms.create(&PostParams::default(), &owner()).await.unwrap(),
    };
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    secrets
        .create(&PostParams::default(), &token_secret(name, &owner))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let created = pods
        .create(&PostParams::default(), &agent_pod(name, &owner))
        .await
        .unwrap();
    assert_eq!(phase(&created), "Pending");
    let rv = created.metadata.resource_version.clone().unwrap();
    let mut events = pods
        .watch(
            &WatchParams::default()
                .fields(&format!("metadata.name={name}"))
                .timeout(60),
            &rv,
        )
        .await
        .unwrap()
        .boxed();
    let mut last_rv: u64 = rv.parse().unwrap();
    let pod = loop {
        let e = tokio::time::timeout(Duration::from_secs(60), events.try_next())
            .await
            .expect("the Pod becomes Ready within 60 s")
            .unwrap()
            .expect("the watch stays open");
        let WatchEvent::Modified(p) = e else {
            panic!("only MODIFIED events for a starting Pod: {e:?}");
        };
        let this_rv: u64 = p
            .metadata
            .resource_version
            .clone()
            .unwrap()
            .parse()
            .unwrap();
        assert!(this_rv > last_rv, "resourceVersions increase");
        last_rv = this_rv;
        if is_ready(&p) {
            break p;
        }
    };
    assert_eq!(phase(&pod), "Running");
    (owner, pod)
}

#[tokio::test]
async fn fake_apiserver_runs_a_pod_as_a_real_agent_reached_at_its_pod_ip() {
    let fake = FakeApiServer::start();
    let client = client(&fake).await;
    let (owner, pod) = ready_pod(&client, "p1").await;
    let ip = pod.status.as_ref().unwrap().pod_ip.clone().unwrap();
    assert!(ip.starts_with("127.") && ip != "127.0.0.1", "{ip}");
    assert_eq!(ip, fake.pod_ip("p1").unwrap().to_string());
    // The agent took its token from the Secret file: the native API answers it, not others.
    let agent = berth_protocol::AgentClient::new(format!("http://{ip}:5000"), Some(TOKEN.into()));
    let echo = berth_protocol::ExecRequest {
        shell: Some("echo in-pod".into()),
        ..Default::default()
    };
    let run = agent.exec(&echo).await.unwrap();
    assert_eq!(run.stdout.as_deref(), Some("in-pod\n"));
    let wrong = berth_protocol::AgentClient::new(format!("http://{ip}:5000"), Some("nope".into()));
    assert!(wrong.exec(&echo).await.is_err());
    let root = fake.pod_root("p1").unwrap();
    let token_file = root.join("volumes/token/token");
    assert_eq!(std::fs::read_to_string(&token_file).unwrap(), TOKEN);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&token_file).unwrap().permissions().mode() & 0o777,
        0o400
    );
    // The token is nowhere in the agent's environment or command line: only its path.
    let pid = fake.agent_pid("p1").unwrap();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    for b in [&environ, &cmdline] {
        assert!(!String::from_utf8_lossy(b).contains(TOKEN));
    }
    assert!(
        String::from_utf8_lossy(&environ)
            .contains(&format!("BERTH_AGENT_TOKEN_FILE={}", token_file.display()))
    );
    // Conflicts and misses are Status objects.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let e = pods
        .create(&PostParams::default(), &agent_pod("p1", &owner))
        .await
        .unwrap_err();
    assert_eq!(api_error(e), (409, "AlreadyExists".into()));
    let e = pods.get("nope").await.unwrap_err();
    assert_eq!(api_error(e), (404, "NotFound".into()));
    assert!(secrets.get_opt("nope").await.unwrap().is_none());
    // Lists by label selector, equality and set-based.
    for (sel, n) in [
        ("berth.controller=c1", 1),
        ("berth.controller in (c0,c1),berth.managed=true", 1),
        ("berth.controller=c2", 0),
        ("berth.controller notin (c1)", 0),
    ] {
        let l = pods.list(&ListParams::default().labels(sel)).await.unwrap();
        assert_eq!(l.items.len(), n, "{sel}");
        assert!(l.metadata.resource_version.is_some());
    }
    let e = pods
        .list(&ListParams::default().labels("a in b"))
        .await
        .unwrap_err();
    assert_eq!(api_error(e).0, 400);
    // Invalid objects are refused before anything runs.
    let bad: Pod = serde_json::from_value(json!({"metadata": {"name": "Bad_Name"}})).unwrap();
    let e = pods.create(&PostParams::default(), &bad).await.unwrap_err();
    assert_eq!(api_error(e).0, 422);
    // Deleting the Pod stops its agent and removes its root.
    pods.delete("p1", &DeleteParams::default()).await.unwrap();
    wait_for("the Pod to be gone", Duration::from_secs(20), || async {
        pods.get_opt("p1").await.unwrap().is_none().then_some(())
    })
    .await;
    assert!(!berth_tests::pid_alive(pid));
    assert!(!root.exists());
    assert!(fake.all_pod_processes().is_empty());
    // The requests, as seen.
    let reqs = fake.requests();
    assert!(
        reqs.iter()
            .any(|r| r.method == "POST" && r.path == format!("/api/v1/namespaces/{NS}/pods")),
        "{:?}",
        reqs.iter().map(|r| r.line()).collect::<Vec<_>>()
    );
    assert!(
        reqs.iter()
            .any(|r| r.is_watch() && r.param("fieldSelector") == Some("metadata.name=p1"))
    );
}

#[tokio::test]
async fn fake_apiserver_deleting_the_owner_cascades_to_pods_secrets_and_their_agents() {
    let fake = FakeApiServer::start();
    let client = client(&fake).await;
    let (_, a) = ready_pod(&client, "a").await;
    ready_pod(&client, "b").await;
    let pids = fake.agent_pids();
    assert_eq!(pids.len(), 2, "{pids:?}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut events = pods
        .watch(
            &WatchParams::default()
                .labels("berth.controller=c1")
                .timeout(60),
            a.metadata.resource_version.as_deref().unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    cms.delete("owner", &DeleteParams::foreground())
        .await
        .unwrap();
    let mut deleted = std::collections::BTreeSet::new();
    while deleted.len() < 2 {
        let e = tokio::time::timeout(Duration::from_secs(30), events.try_next())
            .await
            .expect("DELETED events within 30 s")
            .unwrap()
            .unwrap();
        if let WatchEvent::Deleted(p) = e {
            deleted.insert(p.metadata.name.unwrap());
        }
    }
    assert_eq!(deleted, ["a".to_string(), "b".to_string()].into());
    wait_for("the owner to be gone", Duration::from_secs(20), || async {
        cms.get_opt("owner").await.unwrap().is_none().then_some(())
    })
    .await;
    assert!(fake.objects::<Secret>().is_empty());
    assert!(fake.objects::<Pod>().is_empty());
    for pid in pids.values() {
        assert!(
            !berth_tests::pid_alive(*pid),
            "agent {pid} outlived its Pod"
        );
    }
    assert!(fake.all_pod_processes().is_empty());
}

#[tokio::test]
async fn fake_apiserver_a_dead_container_fails_its_pod_and_the_watch_delivers_it() {
    let fake = FakeApiServer::start();
    let client = client(&fake).await;
    let (_, oom) = ready_pod(&client, "oom").await;
    ready_pod(&client, "crash").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut events = pods
        .watch(
            &WatchParams::default()
                .labels("berth.managed=true")
                .timeout(60),
            oom.metadata.resource_version.as_deref().unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    fake.fail_pod("oom", "OOMKilled");
    fake.kill_pod("crash");
    let mut failed = BTreeMap::new();
    while failed.len() < 2 {
        let e = tokio::time::timeout(Duration::from_secs(30), events.try_next())
            .await
            .expect("the failures within 30 s")
            .unwrap()
            .unwrap();
        if let WatchEvent::Modified(p) = e
            && phase(&p) == "Failed"
        {
            let t = p
                .status
                .as_ref()
                .unwrap()
                .container_statuses
                .as_ref()
                .unwrap()[0]
                .state
                .as_ref()
                .unwrap()
                .terminated
                .clone()
                .unwrap();
            assert!(!is_ready(&p));
            failed.insert(p.metadata.name.unwrap(), (t.reason.unwrap(), t.exit_code));
        }
    }
    assert_eq!(failed["oom"], ("OOMKilled".into(), 137));
    assert_eq!(failed["crash"], ("Error".into(), 137));
    assert!(
        fake.all_pod_processes().is_empty(),
        "a dead container's processes die with it"
    );
    // A failed Pod stays until deleted (restartPolicy Never).
    assert_eq!(phase(&pods.get("oom").await.unwrap()), "Failed");
}

#[tokio::test]
async fn fake_apiserver_holds_pods_pending_when_asked_and_answers_410_for_a_compacted_version() {
    let fake = FakeApiServer::start();
    let client = client(&fake).await;
    fake.hold_pending(true);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let owner = cms.create(&PostParams::default(), &owner()).await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    secrets
        .create(&PostParams::default(), &token_secret("held", &owner))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let p = pods
        .create(&PostParams::default(), &agent_pod("held", &owner))
        .await
        .unwrap();
    let old_rv = p.metadata.resource_version.clone().unwrap();
    // Held: still Pending, no IP, no agent, while other writes happen.
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "other"}})).unwrap(),
    )
    .await
    .unwrap();
    let p = pods.get("held").await.unwrap();
    assert_eq!(phase(&p), "Pending");
    assert!(p.status.unwrap().pod_ip.is_none());
    assert!(fake.agent_pid("held").is_none());
    fake.hold_pending(false);
    wait_for(
        "the released Pod to be Ready",
        Duration::from_secs(60),
        || async { is_ready(&pods.get("held").await.unwrap()).then_some(()) },
    )
    .await;
    // A watch from before a compaction is told 410 Gone (Expired): list again.
    fake.compact();
    let mut events = pods
        .watch(&WatchParams::default().timeout(10), &old_rv)
        .await
        .unwrap()
        .boxed();
    match events.try_next().await.unwrap() {
        Some(WatchEvent::Error(s)) => assert_eq!((s.code, s.reason.as_str()), (410, "Expired")),
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    // A watch from "now" ends after its timeoutSeconds.
    let rv = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let started = std::time::Instant::now();
    let rest: Vec<_> = pods
        .watch(&WatchParams::default().timeout(1), &rv)
        .await
        .unwrap()
        .collect()
        .await;
    assert!(rest.is_empty(), "{rest:?}");
    assert!(started.elapsed() >= Duration::from_millis(900));
}

#[tokio::test]
async fn fake_apiserver_port_forwards_a_connection_to_the_pods_agent() {
    let fake = FakeApiServer::start();
    let client = client(&fake).await;
    ready_pod(&client, "pf").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut pf = pods.portforward("pf", &[5000]).await.unwrap();
    let mut stream = pf.take_stream(5000).unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: pf\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut got))
        .await
        .expect("the agent answers through the forward")
        .unwrap();
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    drop(stream);
    // A Pod that does not exist is a 404 Status before any upgrade.
    let Err(e) = pods.portforward("nope", &[5000]).await else {
        panic!("a port-forward to a missing Pod is refused");
    };
    assert_eq!(api_error(e).0, 404);
    assert!(fake.requests().iter().any(|r| {
        r.path == format!("/api/v1/namespaces/{NS}/pods/pf/portforward")
            && r.param("ports") == Some("5000")
    }));
}

// ---- `berth serve` with every profile on `kubernetes`, against the fake ----

use berth_tests::controller::{
    ControllerProcess, FAKE_APISERVER_IMAGE, FAKE_APISERVER_NAMESPACE, Provider, ide, shell,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;

fn labelled<'a, K: kube::Resource>(items: &'a [K], label: &str, value: &str) -> Vec<&'a K> {
    items
        .iter()
        .filter(|o| {
            o.meta()
                .labels
                .as_ref()
                .and_then(|l| l.get(label))
                .is_some_and(|v| v == value)
        })
        .collect()
}

fn owners<K: kube::Resource>(o: &K) -> Vec<(String, String)> {
    o.meta()
        .owner_references
        .iter()
        .flatten()
        .map(|r| (r.kind.clone(), r.uid.clone()))
        .collect()
}

/// What the requests after `from` were, as `METHOD path` (watches and reads of a starting Pod
/// left out).
fn writes(fake: &FakeApiServer, from: usize) -> Vec<String> {
    fake.requests()[from..]
        .iter()
        .filter(|r| r.method != "GET")
        .map(|r| format!("{} {}", r.method, r.path))
        .collect()
}

#[tokio::test]
async fn kubernetes_fake_apiserver_a_create_makes_one_owned_pod_secret_and_policy_and_a_delete_leaves_none()
 {
    let c = ControllerProcess::start_on(Provider::KubernetesFakeApiserver, "").await;
    let fake = c.fake();
    let cl = c.client();
    // At start: the controller's owner ConfigMap, its Pods listed by label and watched.
    let owner = wait_for("the owner ConfigMap", Duration::from_secs(20), || async {
        let cms = fake.objects::<ConfigMap>();
        labelled(&cms, "berth.controller", &c.id)
            .first()
            .map(|o| (*o).clone())
    })
    .await;
    let owner_uid = owner.metadata.uid.clone().unwrap();
    let selector = format!("berth.controller={}", c.id);
    let pods_path = format!("/api/v1/namespaces/{FAKE_APISERVER_NAMESPACE}/pods");
    wait_for(
        "a list and a watch by label",
        Duration::from_secs(20),
        || async {
            let reqs = fake.requests();
            let by_label = |r: &&berth_tests::kube_fake::RequestRecord| {
                r.method == "GET"
                    && r.path == pods_path
                    && r.param("labelSelector") == Some(selector.as_str())
            };
            (reqs.iter().filter(by_label).any(|r| !r.is_watch())
                && reqs.iter().filter(by_label).any(|r| r.is_watch()))
            .then_some(())
        },
    )
    .await;
    let from = fake.requests().len();
    let sb = cl.create(&ide()).await.unwrap();
    assert_eq!(sb.status, "running");
    assert_eq!(sb.image_ref, FAKE_APISERVER_IMAGE);
    let made = writes(fake, from);
    let ns = FAKE_APISERVER_NAMESPACE;
    for path in [
        format!("POST /api/v1/namespaces/{ns}/pods"),
        format!("POST /api/v1/namespaces/{ns}/secrets"),
        format!("POST /apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies"),
    ] {
        assert_eq!(
            made.iter().filter(|w| **w == path).count(),
            1,
            "{path} once: {made:?}"
        );
    }
    assert_eq!(made.len(), 3, "{made:?}");
    let pods = fake.objects::<Pod>();
    let secrets = fake.objects::<Secret>();
    let policies = fake.objects::<NetworkPolicy>();
    let (pod, secret, policy) = (
        labelled(&pods, "berth.sandbox", &sb.id),
        labelled(&secrets, "berth.sandbox", &sb.id),
        labelled(&policies, "berth.sandbox", &sb.id),
    );
    assert_eq!((pod.len(), secret.len(), policy.len()), (1, 1, 1));
    let (pod, secret, policy) = (pod[0], secret[0], policy[0]);
    let pod_uid = pod.metadata.uid.clone().unwrap();
    assert_eq!(owners(pod), [("ConfigMap".to_string(), owner_uid.clone())]);
    for o in [owners(secret), owners(policy)] {
        assert!(
            o == [("Pod".to_string(), pod_uid.clone())]
                || o == [("ConfigMap".to_string(), owner_uid.clone())],
            "{o:?}"
        );
    }
    // The token: in the Secret, mounted as a file whose path the agent gets; nowhere in the Pod.
    let token = c.agent_token(&sb.id);
    let pod_json = serde_json::to_string(pod).unwrap();
    assert!(!pod_json.contains(&token), "the token is in the Pod");
    let container = &pod.spec.as_ref().unwrap().containers[0];
    let env = container.env.as_ref().unwrap();
    let file = env
        .iter()
        .find(|e| e.name == "BERTH_AGENT_TOKEN_FILE")
        .and_then(|e| e.value.clone())
        .expect("BERTH_AGENT_TOKEN_FILE");
    let mount = container
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| file.starts_with(&m.mount_path))
        .expect("the token file is on a mount");
    let volume = pod
        .spec
        .as_ref()
        .unwrap()
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .unwrap();
    assert_eq!(
        volume.secret.as_ref().unwrap().secret_name.as_deref(),
        secret.metadata.name.as_deref()
    );
    let run = cl.exec(&sb.id, &shell("echo from-the-pod")).await.unwrap();
    assert_eq!(run.stdout, "from-the-pod\n");
    // The agent is reached at the Pod IP.
    let ip = fake.pod_ip(pod.metadata.name.as_deref().unwrap()).unwrap();
    assert_eq!(
        sb.endpoints.compat.as_deref(),
        Some(format!("http://{ip}:5000").as_str())
    );
    // Delete: the Pod, its Secret and NetworkPolicy deleted; the kubelet then stops the agent.
    let from = fake.requests().len();
    let pid = c.agent_pid(&sb.id) as u32;
    cl.delete(&sb.id).await.unwrap();
    assert!(c.leftovers(&sb.id).is_empty(), "{:?}", c.leftovers(&sb.id));
    let deletes = writes(fake, from);
    let name = pod.metadata.name.clone().unwrap();
    for path in [
        format!("DELETE /api/v1/namespaces/{ns}/pods/{name}"),
        format!(
            "DELETE /api/v1/namespaces/{ns}/secrets/{}",
            secret.metadata.name.as_deref().unwrap()
        ),
        format!("DELETE /apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/{name}"),
    ] {
        assert!(deletes.contains(&path), "{path} missing: {deletes:?}");
    }
    wait_for(
        "nothing left on the fake",
        Duration::from_secs(20),
        || async {
            (fake.objects::<Pod>().is_empty()
                && fake.objects::<Secret>().is_empty()
                && fake.objects::<NetworkPolicy>().is_empty()
                && !berth_tests::pid_alive(pid)
                && fake.all_pod_processes().is_empty())
            .then_some(())
        },
    )
    .await;
    // The owner stays: it is the controller's, not the sandbox's.
    assert_eq!(fake.objects::<ConfigMap>().len(), 1);
}

#[tokio::test]
async fn kubernetes_fake_apiserver_oomkilled_and_deleted_pods_fail_their_sandboxes_with_the_reason()
{
    let c = ControllerProcess::start_on(Provider::KubernetesFakeApiserver, "").await;
    let cl = c.client();
    let oom = cl.create(&ide()).await.unwrap();
    let gone = cl.create(&ide()).await.unwrap();
    let pod_of = |id: &str| {
        let pods = c.fake().objects::<Pod>();
        labelled(&pods, "berth.sandbox", id)[0]
            .metadata
            .name
            .clone()
            .unwrap()
    };
    c.fake().fail_pod(&pod_of(&oom.id), "OOMKilled");
    // Deleted behind the controller's back, as `kubectl delete pod` would.
    let client = kube_client_for(c.fake()).await;
    let pods: Api<Pod> = Api::namespaced(client, FAKE_APISERVER_NAMESPACE);
    pods.delete(&pod_of(&gone.id), &DeleteParams::default())
        .await
        .unwrap();
    for (id, word) in [(&oom.id, "OOMKilled"), (&gone.id, "deleted")] {
        let s = wait_for("the sandbox to fail", Duration::from_secs(20), || async {
            let s = cl.get(id).await.unwrap();
            (s.status == "failed").then_some(s)
        })
        .await;
        let error = s.error.unwrap_or_default();
        assert!(error.contains(word), "{id}: {error}");
    }
}

async fn kube_client_for(fake: &FakeApiServer) -> kube::Client {
    let kc =
        kube::config::Kubeconfig::from_yaml(&fake.kubeconfig(FAKE_APISERVER_NAMESPACE)).unwrap();
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .unwrap();
    kube::Client::try_from(config).unwrap()
}

#[tokio::test]
async fn kubernetes_fake_apiserver_a_restarted_controller_lists_by_label_and_adopts_its_pods() {
    let mut c = ControllerProcess::start_on(Provider::KubernetesFakeApiserver, "").await;
    let sb = c.client().create(&ide()).await.unwrap();
    let pid = c.agent_pid(&sb.id);
    c.kill9();
    assert!(c.sandbox_alive(&sb.id), "the Pod outlives the controller");
    let from = c.fake().requests().len();
    c.launch();
    let cl = c.client();
    assert_eq!(cl.get(&sb.id).await.unwrap().status, "running");
    let selector = format!("berth.controller={}", c.id);
    let listed = c.fake().requests()[from..].iter().any(|r| {
        r.method == "GET"
            && r.path == format!("/api/v1/namespaces/{FAKE_APISERVER_NAMESPACE}/pods")
            && !r.is_watch()
            && r.param("labelSelector") == Some(selector.as_str())
    });
    assert!(listed, "no list by label after the restart");
    // Adopted, not re-made: the same Pod and agent; nothing created.
    assert_eq!(c.agent_pid(&sb.id), pid);
    assert!(
        writes(c.fake(), from)
            .iter()
            .all(|w| !w.starts_with("POST")),
        "{:?}",
        writes(c.fake(), from)
    );
    let run = cl.exec(&sb.id, &shell("echo adopted")).await.unwrap();
    assert_eq!(run.stdout, "adopted\n");
    cl.delete(&sb.id).await.unwrap();
}

#[tokio::test]
async fn kubernetes_fake_apiserver_port_forward_reach_runs_commands_and_survives_a_restart() {
    let mut c = ControllerProcess::start_on(Provider::KubernetesFakeApiserverPortForward, "").await;
    let cl = c.client();
    let sb = cl.create(&ide()).await.unwrap();
    let compat = sb.endpoints.compat.clone().unwrap();
    assert!(compat.starts_with("http://127.0.0.1:"), "{compat}");
    let run = cl.exec(&sb.id, &shell("echo forwarded")).await.unwrap();
    assert_eq!(run.stdout, "forwarded\n");
    // The compat surface through the local forward, as a harness on this host reaches it.
    let r: serde_json::Value = reqwest::Client::new()
        .post(format!("{compat}/execute"))
        .json(&json!({"command": "echo compat", "shell": true}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["output"], "compat\n");
    let forwards = |c: &ControllerProcess| {
        c.fake()
            .requests()
            .iter()
            .filter(|r| r.path.ends_with("/portforward") && r.param("ports") == Some("5000"))
            .count()
    };
    assert!(forwards(&c) > 0);
    // A restarted controller makes its forwards again.
    c.kill9();
    let before = forwards(&c);
    c.launch();
    let cl = c.client();
    let run = cl.exec(&sb.id, &shell("echo again")).await.unwrap();
    assert_eq!(run.stdout, "again\n");
    assert!(forwards(&c) > before);
    cl.delete(&sb.id).await.unwrap();
    assert!(c.leftovers(&sb.id).is_empty(), "{:?}", c.leftovers(&sb.id));
}

/// An HTTP server on 127.0.0.1 answering every request with `egress-ok <its Host>`, on a
/// thread of its own (the test's runtime is blocked while `curl` runs).
fn egress_test_host() -> u16 {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16384 {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let text = String::from_utf8_lossy(&head).to_string();
            let host = text
                .lines()
                .find_map(|l| l.strip_prefix("Host: "))
                .unwrap_or_default()
                .to_string();
            let body = format!("egress-ok {host}");
            let out = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = s.write_all(out.as_bytes());
        }
    });
    port
}

/// `curl` from `source` (a Pod IP: the fake's Pods share the host's loopback, where a
/// connection would otherwise come from 127.0.0.1) through the proxy at `proxy`: the status
/// line and body, or curl's error.
fn curl_from(source: &str, proxy: &str, url: &str) -> String {
    let out = std::process::Command::new("curl")
        .args([
            "-sS",
            "-m",
            "10",
            "-i",
            "--interface",
            source,
            "-x",
            proxy,
            url,
        ])
        .output()
        .unwrap();
    berth_tests::output_text(&out)
}

/// Asks the DNS at `server` for `name`'s A record from `source`: `rcode=<n> answers=<n>`.
fn dns_from(source: &str, server: &str, name: &str) -> String {
    let script = r#"
import random, socket, struct, sys
src, host, port, name = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
qid = random.randrange(65536)
q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
q += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
q += struct.pack(">HH", 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((src, 0))
s.settimeout(5)
s.sendto(q, (host, port))
r = s.recv(4096)
rid, flags, _, an = struct.unpack(">HHHH", r[:8])
print("rcode=%d answers=%d" % (flags & 0xF, an) if rid == qid else "wrong id")
"#;
    let (host, port) = server.rsplit_once(':').unwrap();
    let out = std::process::Command::new("python3")
        .args(["-c", script, source, host, port, name])
        .output()
        .unwrap();
    berth_tests::output_text(&out).trim().to_string()
}

#[tokio::test]
async fn kubernetes_fake_apiserver_a_sandbox_with_a_policy_goes_out_through_the_controllers_proxy_and_dns()
 {
    use berth_protocol::egress::{Egress, EgressRules};
    use k8s_openapi::api::core::v1::Service;
    let up = egress_test_host();
    // A fixed port, as a Service forwards one: the Pods keep it across restarts.
    let port = berth_tests::free_port();
    let mut c = ControllerProcess::start_on(
        Provider::KubernetesFakeApiserver,
        &format!(
            "[egress]\nproxy_port = {port}\n[egress.hosts]\n\"allowed.test\" = [\"127.0.0.1\"]\n\
             \"refused.test\" = [\"127.0.0.1\"]\n"
        ),
    )
    .await;
    let policy = Egress::Rules(EgressRules {
        allow: vec!["allowed.test".into()],
        deny_private: false,
    });
    let with_policy = berth_protocol::controller::CreateSandbox {
        egress: Some(policy.clone()),
        ..ide()
    };
    // Without its Service the controller has no address to give sandboxes: refused, named.
    let err = c
        .client()
        .create(&with_policy)
        .await
        .unwrap_err()
        .to_string();
    println!("{err}");
    assert!(err.contains("cannot enforce an egress policy"), "{err}");
    // The Service (a real API server gives it its ClusterIP; the fake's is loopback), then
    // a restart: the controller reads it at start.
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "berth-controller"},
        "spec": {"clusterIP": "127.0.0.1", "ports": [{"name": "http", "port": 8780}]},
    }))
    .unwrap();
    let services: Api<Service> =
        Api::namespaced(kube_client_for(c.fake()).await, FAKE_APISERVER_NAMESPACE);
    services
        .create(&PostParams::default(), &service)
        .await
        .unwrap();
    c.kill9();
    c.launch();
    let cl = c.client();
    let sb = cl.create(&with_policy).await.unwrap();
    assert_eq!(sb.egress.as_ref().map(|e| &e.policy), Some(&policy));
    let pods = c.fake().objects::<Pod>();
    let pod = labelled(&pods, "berth.sandbox", &sb.id)[0].clone();
    let name = pod.metadata.name.clone().unwrap();
    let ip = c.fake().pod_ip(&name).unwrap().to_string();
    // The Pod: its programs find the proxy and the CA in their environment, and ask the
    // controller's DNS, nothing else.
    let spec = pod.spec.clone().unwrap();
    let env: BTreeMap<String, String> = spec.containers[0]
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect();
    let proxy = env["http_proxy"].clone();
    assert!(proxy.starts_with("http://127.0.0.1:"), "{env:?}");
    assert_eq!(env["https_proxy"], proxy);
    assert!(env["BERTH_EGRESS_CA"].starts_with("-----BEGIN CERTIFICATE-----"));
    assert_eq!(spec.dns_policy.as_deref(), Some("None"));
    let dns = spec.dns_config.clone().unwrap();
    assert_eq!(dns.nameservers, Some(vec!["127.0.0.1".to_string()]));
    // Its NetworkPolicy: out to the controller's Pods on the proxy's and the DNS's ports only.
    let policies = c.fake().objects::<NetworkPolicy>();
    let np = labelled(&policies, "berth.sandbox", &sb.id)[0].clone();
    let out = np.spec.unwrap().egress.unwrap();
    println!("egress rules: {}", serde_json::to_string(&out).unwrap());
    assert_eq!(out.len(), 1);
    let to = &out[0].to.as_ref().unwrap()[0];
    assert!(to.ip_block.is_none() && to.pod_selector.is_some());
    let ports: Vec<(String, i32)> = out[0]
        .ports
        .iter()
        .flatten()
        .map(|p| match p.port.clone().unwrap() {
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n) => {
                (p.protocol.clone().unwrap(), n)
            }
            other => panic!("{other:?}"),
        })
        .collect();
    let proxy_port: i32 = proxy.rsplit(':').next().unwrap().parse().unwrap();
    assert_eq!(ports[0], ("TCP".to_string(), proxy_port));
    let dns_port = ports[1].1;
    assert_eq!(
        ports[1..],
        [("UDP".into(), dns_port), ("TCP".into(), dns_port)]
    );
    let dns_at = format!("127.0.0.1:{dns_port}");

    // From the Pod's IP: the allowed host answers through the proxy, the other is refused at
    // once with the reason; its DNS answers the allowed name only.
    let ok = curl_from(&ip, &proxy, &format!("http://allowed.test:{up}/a"));
    println!("allowed: {ok}");
    assert!(ok.contains(&format!("egress-ok allowed.test:{up}")), "{ok}");
    let no = curl_from(&ip, &proxy, &format!("http://refused.test:{up}/b"));
    println!("refused: {no}");
    assert!(
        no.contains("not_allowed") && !no.contains("egress-ok"),
        "{no}"
    );
    assert_eq!(dns_from(&ip, &dns_at, "allowed.test"), "rcode=0 answers=1");
    assert_eq!(dns_from(&ip, &dns_at, "refused.test"), "rcode=3 answers=0");
    // Any other address is no sandbox of the proxy's.
    let stranger = curl_from("127.0.0.1", &proxy, &format!("http://allowed.test:{up}/c"));
    assert!(!stranger.contains("egress-ok"), "{stranger}");
    assert_eq!(
        dns_from("127.0.0.1", &dns_at, "allowed.test"),
        "rcode=5 answers=0"
    );
    let denied = |cl: berth_protocol::controller::ControllerClient, id: String| async move {
        let v = cl.events(&id, 0).await.unwrap();
        let events = v["events"].as_array().cloned().unwrap_or_default();
        let kinds: Vec<String> = events
            .iter()
            .filter(|e| e["kind"] == "egress.denied")
            .map(|e| format!("{} {} {}", e["host"], e["reason"], e["via"]))
            .collect();
        kinds
    };
    let want = [
        "\"refused.test\" \"not_allowed\" \"proxy\"",
        "\"refused.test\" \"not_allowed\" \"dns\"",
    ];
    let got = wait_for(
        "the denials on the timeline",
        Duration::from_secs(10),
        || {
            let (cl, id) = (c.client(), sb.id.clone());
            async move {
                let d = denied(cl, id).await;
                want.iter().all(|w| d.iter().any(|g| g == w)).then_some(d)
            }
        },
    )
    .await;
    println!("denials: {got:?}");
    let report = cl.get(&sb.id).await.unwrap().egress.unwrap();
    assert_eq!(report.hosts.get("allowed.test"), Some(&1), "{report:?}");

    // A restarted controller knows the Pod again by its annotation.
    c.kill9();
    c.launch();
    let again = wait_for("the proxy after a restart", Duration::from_secs(30), || {
        let (ip, proxy) = (ip.clone(), proxy.clone());
        async move {
            let out = curl_from(&ip, &proxy, &format!("http://allowed.test:{up}/d"));
            out.contains("egress-ok").then_some(out)
        }
    })
    .await;
    println!("after a restart: {again}");
    c.client().delete(&sb.id).await.unwrap();
    let gone = curl_from(&ip, &proxy, &format!("http://allowed.test:{up}/e"));
    assert!(!gone.contains("egress-ok"), "{gone}");
}
