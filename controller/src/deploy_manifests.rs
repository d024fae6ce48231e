//! deploy/kubernetes checked without a cluster (none runs on these machines): every document
//! parses into its `k8s-openapi` type with no field left over, the ConfigMap's berth.toml is a
//! valid controller `Config`, the Role grants exactly the provider's `RBAC`, and the
//! StatefulSet runs the real `berth serve` flags with its store on a claimed volume.
//! tests/kubernetes/verify.sh runs against a real cluster.
//!
//! YAML: serde-saphyr, the parser kube itself reads kubeconfigs with (already in the build;
//! maintained, panic-free), into `serde_json::Value` first so each document can be dispatched
//! on its `kind` and compared with its typed round trip.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::config::{Config, KubeReach};
use crate::provider::kubernetes::RBAC;
use crate::provider::kubernetes::objects::CONTROLLER_POD_LABEL;
use clap::Parser;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes")
}

/// Every YAML file of the directory: its name and its documents.
fn documents() -> BTreeMap<String, Vec<Value>> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(dir()).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !(name.ends_with(".yaml") || name.ends_with(".yml")) {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("{name} is not YAML: {e}"));
        let docs: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
        assert!(!docs.is_empty(), "{name} holds no document");
        out.insert(name, docs);
    }
    out
}

/// The first place `doc` holds what `back` (its typed round trip) lost: a field the type does
/// not know. `back` may add only what the type always writes (a nested object's apiVersion
/// and kind).
fn lost(doc: &Value, back: &Value, at: &str) -> Option<String> {
    match (doc, back) {
        (Value::Object(d), Value::Object(b)) => d.iter().find_map(|(k, v)| match b.get(k) {
            Some(bv) => lost(v, bv, &format!("{at}.{k}")),
            None if v.is_null() => None,
            None => Some(format!("{at}.{k}")),
        }),
        (Value::Array(d), Value::Array(b)) if d.len() == b.len() => d
            .iter()
            .zip(b)
            .enumerate()
            .find_map(|(i, (d, b))| lost(d, b, &format!("{at}[{i}]"))),
        (d, b) if d == b => None,
        _ => Some(format!("{at} (read as {back})")),
    }
}

/// Parses `doc` as `T`; its serialisation must give the document back, so no field was
/// misspelt or misplaced (k8s-openapi ignores unknown fields when reading).
fn typed<T>(file: &str, doc: &Value) -> T
where
    T: serde::de::DeserializeOwned + serde::Serialize + k8s_openapi::Resource,
{
    assert_eq!(doc["apiVersion"], T::API_VERSION, "{file}");
    assert_eq!(doc["kind"], T::KIND, "{file}");
    let t: T = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{file}: not a {}: {e}", T::KIND));
    let back = serde_json::to_value(&t).unwrap();
    if let Some(path) = lost(doc, &back, "") {
        panic!(
            "{file}: {} has no field {path} (misspelt or misplaced)",
            T::KIND
        );
    }
    t
}

/// The manifests, each as its type.
struct Manifests {
    namespace: Namespace,
    service_account: ServiceAccount,
    role: Role,
    role_binding: RoleBinding,
    config_map: ConfigMap,
    service: Service,
    stateful_set: StatefulSet,
}

fn manifests() -> Manifests {
    let docs = documents();
    let one = |file: &str| -> Value {
        let d = docs
            .get(file)
            .unwrap_or_else(|| panic!("deploy/kubernetes/{file} is missing"));
        assert_eq!(d.len(), 1, "{file}: one object a file");
        d[0].clone()
    };
    Manifests {
        namespace: typed("namespace.yaml", &one("namespace.yaml")),
        service_account: typed("serviceaccount.yaml", &one("serviceaccount.yaml")),
        role: typed("role.yaml", &one("role.yaml")),
        role_binding: typed("rolebinding.yaml", &one("rolebinding.yaml")),
        config_map: typed("configmap.yaml", &one("configmap.yaml")),
        service: typed("service.yaml", &one("service.yaml")),
        stateful_set: typed("statefulset.yaml", &one("statefulset.yaml")),
    }
}

#[test]
fn manifests_parse_as_kubernetes_objects_no_cluster_here() {
    let m = manifests();
    let ns = m.namespace.metadata.name.clone().unwrap();
    assert_eq!(ns, "berth");
    for (kind, meta) in [
        ("ServiceAccount", &m.service_account.metadata),
        ("Role", &m.role.metadata),
        ("RoleBinding", &m.role_binding.metadata),
        ("ConfigMap", &m.config_map.metadata),
        ("Service", &m.service.metadata),
        ("StatefulSet", &m.stateful_set.metadata),
    ] {
        assert_eq!(meta.namespace.as_deref(), Some(ns.as_str()), "{kind}");
        assert!(meta.name.is_some(), "{kind} has a name");
    }
    // Every YAML file but the kustomization is one of these objects.
    let files: BTreeSet<String> = documents().into_keys().collect();
    let expected: BTreeSet<String> = [
        "namespace.yaml",
        "serviceaccount.yaml",
        "role.yaml",
        "rolebinding.yaml",
        "configmap.yaml",
        "service.yaml",
        "statefulset.yaml",
        "kustomization.yaml",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(files, expected);
}

#[test]
fn the_configmaps_berth_toml_is_a_valid_controller_config_no_cluster_here() {
    let m = manifests();
    let text = m.config_map.data.as_ref().unwrap()["berth.toml"].clone();
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("berth.toml");
    std::fs::write(&path, &text).unwrap();
    // `load` is what `berth serve --config` calls: it parses and validates.
    let c = Config::load(&path).unwrap_or_else(|e| panic!("berth.toml: {e:#}"));
    assert_eq!(c.providers["desktop"], "kubernetes");
    assert_eq!(c.providers["ide"], "kubernetes");
    let k = c.kubernetes.expect("a [kubernetes] section");
    assert_eq!(
        k.reach,
        Some(KubeReach::PodIp),
        "the controller runs in the cluster"
    );
    assert_eq!(
        k.namespace.as_deref(),
        m.namespace.metadata.name.as_deref(),
        "sandboxes go where the Role grants"
    );
    let image = k.image.clone().expect("an image");
    assert!(berth_protocol::image::valid_reference(&image), "{image}");
    let (_, digest) = image.split_once("@sha256:").expect("the image by digest");
    assert!(
        digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()),
        "{image}"
    );
    assert!(
        c.api_keys.is_empty(),
        "API keys come from a Secret, not the ConfigMap"
    );
    // Sandboxes with an egress policy reach the proxy and their DNS through the Service the
    // controller reads: its name, the proxy's port unchanged, 53 to the DNS's port in the Pod.
    assert_eq!(m.service.metadata.name.as_deref(), Some(k.egress_service()));
    let ports = m.service.spec.clone().unwrap().ports.unwrap();
    let container = &m
        .stateful_set
        .spec
        .clone()
        .template
        .spec
        .unwrap()
        .containers[0];
    let target = |name: &str| {
        let p = ports
            .iter()
            .find(|p| p.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("the Service's {name} port"));
        let IntOrString::String(t) = p.target_port.clone().unwrap() else {
            panic!("{name}: a named target port");
        };
        let cp = container
            .ports
            .iter()
            .flatten()
            .find(|cp| cp.name.as_deref() == Some(&t));
        let cp = cp.unwrap_or_else(|| panic!("the container's {t} port"));
        assert_eq!(cp.protocol, p.protocol, "{name}");
        (p.port, cp.container_port, p.protocol.clone().unwrap())
    };
    let proxy = i32::from(c.egress.proxy_port);
    assert_eq!(target("egress"), (proxy, proxy, "TCP".to_string()));
    let dns = i32::from(k.egress_dns_port());
    assert_eq!(target("dns"), (53, dns, "UDP".to_string()));
    assert_eq!(target("dns-tcp"), (53, dns, "TCP".to_string()));
}

/// (api group, resource, verb) triples.
fn triples<'a>(
    rules: impl IntoIterator<Item = (&'a [String], &'a [String], &'a [String])>,
) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for (groups, resources, verbs) in rules {
        for g in groups {
            for r in resources {
                for v in verbs {
                    out.insert((g.clone(), r.clone(), v.clone()));
                }
            }
        }
    }
    out
}

#[test]
fn the_role_grants_exactly_what_the_provider_calls_no_cluster_here() {
    let m = manifests();
    let rules = m.role.rules.clone().unwrap_or_default();
    for r in &rules {
        assert!(r.resource_names.is_none() && r.non_resource_urls.is_none());
        for s in r
            .api_groups
            .iter()
            .flatten()
            .chain(r.resources.iter().flatten())
            .chain(&r.verbs)
        {
            assert_ne!(s, "*", "no wildcard in a least Role");
        }
    }
    let granted = triples(rules.iter().map(|r| {
        (
            r.api_groups.as_deref().unwrap_or_default(),
            r.resources.as_deref().unwrap_or_default(),
            r.verbs.as_slice(),
        )
    }));
    let needed: BTreeSet<(String, String, String)> = RBAC
        .iter()
        .flat_map(|p| {
            p.verbs.iter().map(|v| {
                (
                    p.api_group.to_string(),
                    p.resource.to_string(),
                    v.to_string(),
                )
            })
        })
        .collect();
    let extra: Vec<_> = granted.difference(&needed).collect();
    let missing: Vec<_> = needed.difference(&granted).collect();
    assert!(
        extra.is_empty(),
        "granted beyond the provider's calls: {extra:?}"
    );
    assert!(
        missing.is_empty(),
        "the provider calls what is not granted: {missing:?}"
    );
    // Bound to the controller's account, in its namespace.
    let b = &m.role_binding;
    assert_eq!(b.role_ref.kind, "Role");
    assert_eq!(Some(&b.role_ref.name), m.role.metadata.name.as_ref());
    let subjects = b.subjects.clone().unwrap_or_default();
    assert_eq!(subjects.len(), 1);
    assert_eq!(subjects[0].kind, "ServiceAccount");
    assert_eq!(
        Some(&subjects[0].name),
        m.service_account.metadata.name.as_ref()
    );
    assert_eq!(subjects[0].namespace, m.service_account.metadata.namespace);
}

#[test]
fn the_statefulset_runs_one_controller_on_its_claimed_store_no_cluster_here() {
    let m = manifests();
    let spec = m.stateful_set.spec.clone();
    assert_eq!(spec.replicas, Some(1), "one controller owns the store");
    assert_eq!(spec.service_name, m.service.metadata.name);
    let pod = spec.template.spec.clone().unwrap();
    let labels = spec.template.metadata.clone().unwrap().labels.unwrap();
    // The sandboxes' NetworkPolicies admit the controller by this label.
    assert_eq!(
        labels.get(CONTROLLER_POD_LABEL.0).map(String::as_str),
        Some(CONTROLLER_POD_LABEL.1)
    );
    for (k, v) in spec.selector.match_labels.clone().unwrap() {
        assert_eq!(labels.get(&k), Some(&v), "the selector picks the template");
    }
    for (k, v) in m.service.spec.clone().unwrap().selector.unwrap() {
        assert_eq!(labels.get(&k), Some(&v), "the Service picks the controller");
    }
    assert_eq!(
        pod.service_account_name, m.service_account.metadata.name,
        "the bound ServiceAccount"
    );
    assert_ne!(pod.automount_service_account_token, Some(false));
    assert!(pod.termination_grace_period_seconds.is_some_and(|s| s > 0));
    let containers = &pod.containers;
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    let image = c.image.clone().unwrap();
    assert!(
        berth_protocol::image::valid_reference(&image) && image.contains("@sha256:"),
        "the controller's image by digest: {image}"
    );
    // The real command line: berth's own parser reads the args.
    let mut argv = vec!["berth".to_string()];
    argv.extend(c.args.clone().unwrap());
    let cli = crate::cli::Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    let crate::cli::Top::Serve(serve) = cli.command else {
        panic!("{argv:?} is not `berth serve`")
    };
    assert!(
        serve.listen.ip().is_unspecified(),
        "the Service reaches the Pod"
    );
    let mounts = c.volume_mounts.clone().unwrap();
    let mount_at = |p: &Path| {
        mounts
            .iter()
            .find(|m| Path::new(&m.mount_path) == p)
            .unwrap_or_else(|| panic!("nothing mounted at {}", p.display()))
    };
    // The store on a claimed volume (volumeClaimTemplates), not the Pod's own disk.
    let data = mount_at(&serve.data_dir);
    let claims = spec.volume_claim_templates.clone().unwrap();
    assert!(
        claims
            .iter()
            .any(|t| t.metadata.name.as_ref() == Some(&data.name)),
        "{} is a claim",
        data.name
    );
    assert_ne!(data.read_only, Some(true));
    // The config file is the ConfigMap's key, mounted where --config looks.
    let config = serve.config.clone().expect("--config");
    let config_mount = mount_at(config.parent().unwrap());
    let volume = pod
        .volumes
        .clone()
        .unwrap()
        .into_iter()
        .find(|v| v.name == config_mount.name)
        .unwrap();
    assert_eq!(
        volume.config_map.unwrap().name,
        m.config_map.metadata.name.clone().unwrap()
    );
    let key = config.file_name().unwrap().to_str().unwrap();
    assert!(m.config_map.data.as_ref().unwrap().contains_key(key));
    // The API keys from a Secret, as BERTH_API_KEYS.
    let env = c.env.clone().unwrap();
    let keys = env.iter().find(|e| e.name == "BERTH_API_KEYS").unwrap();
    assert!(keys.value.is_none());
    assert!(keys.value_from.as_ref().unwrap().secret_key_ref.is_some());
    // The port berth listens on is the one the Service and the probes name.
    let ports = c.ports.clone().unwrap();
    let http = ports
        .iter()
        .find(|p| p.name.as_deref() == Some("http"))
        .unwrap();
    assert_eq!(http.container_port, i32::from(serve.listen.port()));
    let svc_port = &m.service.spec.clone().unwrap().ports.unwrap()[0];
    assert_eq!(
        svc_port.target_port,
        Some(IntOrString::String("http".into()))
    );
    for (what, probe) in [
        ("readiness", c.readiness_probe.clone()),
        ("liveness", c.liveness_probe.clone()),
    ] {
        let get = probe
            .unwrap_or_else(|| panic!("a {what} probe"))
            .http_get
            .unwrap();
        assert_eq!(
            get.path.as_deref(),
            Some(berth_protocol::routes::controller::HEALTHZ),
            "{what}: the route that needs no key"
        );
        assert_eq!(get.port, IntOrString::String("http".into()));
    }
}

#[test]
fn the_kustomization_lists_every_file_no_cluster_here() {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Kustomization {
        api_version: String,
        kind: String,
        namespace: String,
        resources: Vec<String>,
    }
    let text = std::fs::read_to_string(dir().join("kustomization.yaml")).unwrap();
    let k: Kustomization = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(k.api_version, "kustomize.config.k8s.io/v1beta1");
    assert_eq!(k.kind, "Kustomization");
    assert_eq!(
        Some(k.namespace.as_str()),
        manifests().namespace.metadata.name.as_deref()
    );
    let listed: BTreeSet<String> = k.resources.iter().cloned().collect();
    assert_eq!(listed.len(), k.resources.len(), "a file listed twice");
    let files: BTreeSet<String> = documents()
        .into_keys()
        .filter(|f| f != "kustomization.yaml")
        .collect();
    assert_eq!(listed, files);
}
