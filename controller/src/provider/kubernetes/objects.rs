//! The objects a sandbox is made of, built from its `Spec` without the cluster: the
//! controller's owner ConfigMap, the sandbox's Pod, its token Secret and its NetworkPolicy;
//! and what a Pod read back from the API means (`pod_state`, `identity`).
//!
//! Ownership: every Pod is owned by the controller's ConfigMap (deleting it, or the namespace,
//! garbage-collects every sandbox of that controller); the Secret and the NetworkPolicy are
//! owned by their Pod, so they go whenever the Pod goes, however it goes.
//!
//! Labels: the identity's controller id, sandbox id and profile are labels (values that a
//! label cannot hold are left out); the image reference is no label (a label value is at most
//! 63 characters of `[A-Za-z0-9._-]`; `registry:5000/berth/desktop:tag` is not one) but the
//! annotation `berth.image_ref`, read back from there.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, HTTPGetAction,
    LocalObjectReference, Pod, PodDNSConfig, PodSecurityContext, PodSpec, Probe,
    ResourceRequirements, SeccompProfile, Secret, SecretVolumeSource, SecurityContext, Volume,
    VolumeMount,
};
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::config::{KubeEgress, KubeReach};
use crate::provider::{
    Identity, LABEL_CONTROLLER, LABEL_EGRESS, LABEL_IMAGE, LABEL_PROFILE, LABEL_SANDBOX, Spec,
};

/// Every object berth makes carries it.
pub const LABEL_MANAGED: &str = "berth.managed";
/// The annotation holding the image reference (no label can).
pub const ANNOTATION_IMAGE: &str = LABEL_IMAGE;
/// The labels the controller's own Pod carries (the deploy manifests set them): sandboxes
/// accept connections from Pods with these only.
pub const CONTROLLER_POD_LABEL: (&str, &str) = ("app.kubernetes.io/name", "berth-controller");
/// The agent's container.
pub const CONTAINER: &str = "agent";
/// Where the token Secret is mounted; the agent reads `TOKEN_DIR/TOKEN_KEY`.
pub const TOKEN_DIR: &str = "/run/berth/token";
pub const TOKEN_KEY: &str = "token";
pub const CDP_PORT: u16 = crate::config::KubernetesConfig::CDP_PORT;
/// `/dev/shm` when the limits set none: Chromium needs more than the runtime's 64 MiB.
pub const SHM_LIMIT: &str = "512Mi";
/// Ranges `egress = "public"` denies: private, CGNAT, link-local (cloud metadata at
/// 169.254.169.254), loopback and "this network", and their IPv6 counterparts.
pub const DENIED_V4: &[&str] = &[
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.168.0.0/16",
];
pub const DENIED_V6: &[&str] = &["::1/128", "fc00::/7", "fe80::/10"];

/// What the builders need besides the `Spec`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub namespace: String,
    pub agent_port: u16,
    pub reach: KubeReach,
    pub egress: KubeEgress,
    pub image_pull_secrets: Vec<String>,
    pub seccomp_localhost_profile: Option<String>,
    /// The RuntimeClass of each profile's Pods (`[kubernetes.runtime_class]`, by profile name).
    pub runtime_class: std::collections::BTreeMap<String, String>,
    /// The controller's own namespace when it runs in the cluster: the NetworkPolicy admits
    /// the controller's Pods from there.
    pub controller_namespace: Option<String>,
    /// Where sandboxes with an egress policy find the egress proxy and their DNS (`None`:
    /// the provider cannot hold a sandbox to one).
    pub egress_route: Option<EgressRoute>,
}

/// The way out of a sandbox with an egress policy: the controller's Service address, where
/// the proxy listens (the Service forwards `proxy_port` unchanged) and where its DNS does in
/// the controller's Pods (the Service's port 53 forwards there); and the CA the sandbox trusts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressRoute {
    pub address: std::net::IpAddr,
    pub proxy_port: u16,
    pub dns_port: u16,
    pub ca_pem: String,
}

/// The route a sandbox of `spec` takes out: `Some` when it has a policy other than `"open"`
/// (and the provider a route to give it).
pub fn behind_proxy<'a>(spec: &Spec, s: &'a Settings) -> Option<&'a EgressRoute> {
    (spec.egress != berth_protocol::egress::Egress::default())
        .then_some(s.egress_route.as_ref())
        .flatten()
}

/// The owner object a sandbox's Pod points at (its uid is known once it exists).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
}

impl Owner {
    fn reference(&self) -> OwnerReference {
        OwnerReference {
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            // Deletion of the owner is not blocked on its dependents (that would need the
            // finalizers permission on the owner).
            controller: Some(true),
            block_owner_deletion: None,
        }
    }

    /// The owner a made object names (`None` when the API left out its name or uid).
    pub fn of(api_version: &str, kind: &str, meta: &ObjectMeta) -> Option<Owner> {
        Some(Owner {
            api_version: api_version.into(),
            kind: kind.into(),
            name: meta.name.clone()?,
            uid: meta.uid.clone()?,
        })
    }
}

/// An id as a DNS-1123 label part: lowercase, anything else than `[a-z0-9-]` as `-`.
fn dns_part(id: &str) -> String {
    id.chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-') => c,
            _ => '-',
        })
        .collect()
}

/// `berth-<sandbox id>` (`sb_0a1b…` → `berth-sb-0a1b…`): the Pod's and NetworkPolicy's name.
pub fn pod_name(sandbox_id: &str) -> String {
    let mut n = format!("berth-{}", dns_part(sandbox_id));
    n.truncate(63 - "-token".len());
    n.trim_end_matches('-').to_string()
}

pub fn secret_name(sandbox_id: &str) -> String {
    format!("{}-token", pod_name(sandbox_id))
}

/// `berth-controller-<controller id>`: the controller's owner ConfigMap.
pub fn owner_name(controller_id: &str) -> String {
    let mut n = format!("berth-controller-{}", dns_part(controller_id));
    n.truncate(253);
    n.trim_end_matches('-').to_string()
}

/// Whether a label can hold `v`: at most 63 of `[A-Za-z0-9._-]`, alphanumeric at both ends.
pub fn is_label_value(v: &str) -> bool {
    v.is_empty()
        || (v.len() <= 63
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && v.as_bytes()[0].is_ascii_alphanumeric()
            && v.as_bytes()[v.len() - 1].is_ascii_alphanumeric())
}

/// The label selector of one controller's objects.
pub fn controller_selector(controller_id: &str) -> String {
    format!("{LABEL_CONTROLLER}={controller_id}")
}

/// The identity labels a label can hold, and `berth.managed=true`.
pub fn labels(identity: &Identity) -> BTreeMap<String, String> {
    let mut l: BTreeMap<String, String> = identity
        .labels()
        .into_iter()
        .filter(|(k, v)| k != LABEL_IMAGE && is_label_value(v))
        .collect();
    l.insert(LABEL_MANAGED.into(), "true".into());
    l
}

fn annotations(identity: &Identity) -> BTreeMap<String, String> {
    BTreeMap::from([(ANNOTATION_IMAGE.to_string(), identity.image_ref.clone())])
}

/// The controller-scoped owner: a ConfigMap whose deletion takes every sandbox with it.
pub fn owner_config_map(controller_id: &str, namespace: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(owner_name(controller_id)),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([
                (LABEL_CONTROLLER.to_string(), controller_id.to_string()),
                (LABEL_MANAGED.to_string(), "true".to_string()),
            ])),
            annotations: Some(BTreeMap::from([(
                "berth.note".to_string(),
                "Owns the Pods of this berth controller's sandboxes: deleting it deletes them."
                    .to_string(),
            )])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "controller_id".to_string(),
            controller_id.to_string(),
        )])),
        ..Default::default()
    }
}

fn meta(name: String, spec: &Spec, s: &Settings, owner: &Owner) -> ObjectMeta {
    let mut annotations = annotations(&spec.identity);
    if behind_proxy(spec, s).is_some()
        && let Ok(policy) = serde_json::to_string(&spec.egress)
    {
        annotations.insert(LABEL_EGRESS.to_string(), policy);
    }
    ObjectMeta {
        name: Some(name),
        namespace: Some(s.namespace.clone()),
        labels: Some(labels(&spec.identity)),
        annotations: Some(annotations),
        owner_references: Some(vec![owner.reference()]),
        ..Default::default()
    }
}

/// The Secret holding the agent's token (key `token`), owned by the Pod.
pub fn token_secret(spec: &Spec, s: &Settings, pod: &Owner) -> Secret {
    Secret {
        metadata: meta(secret_name(&spec.identity.sandbox_id), spec, s, pod),
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([(
            TOKEN_KEY.to_string(),
            ByteString(spec.agent_token.clone().into_bytes()),
        )])),
        immutable: Some(true),
        ..Default::default()
    }
}

/// The agent's arguments: what the Docker provider passes.
pub fn agent_args(desktop: bool, agent_port: u16) -> Vec<String> {
    let mut args = vec!["--listen".to_string(), format!("0.0.0.0:{agent_port}")];
    if desktop {
        args.extend([
            "--cdp-listen".into(),
            format!("0.0.0.0:{CDP_PORT}"),
            "--desktop".into(),
        ]);
    }
    args
}

/// The limits a Pod cannot carry: its CPU weight follows its CPU request, and its process
/// limit is the kubelet's (`podPidsLimit`), the same for every Pod of a node. Memory, CPUs and
/// `/dev/shm` are the Pod's; swap is off for a Guaranteed Pod on every swap setting.
pub fn unenforced(l: &berth_protocol::controller::Limits) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if l.cpu_shares.is_some() {
        out.insert(
            "cpu_shares".into(),
            "a Pod's CPU weight follows its CPU request (cpus x 1024)".into(),
        );
    }
    if l.pids.is_some() {
        out.insert(
            "pids".into(),
            "a Pod's process limit is the kubelet's podPidsLimit, set per node".into(),
        );
    }
    out
}

/// Requests and limits alike (the Guaranteed QoS class: a benchmark's desktop is not
/// throttled or evicted first because a neighbour is busy).
fn resources(cpus: Option<f64>, memory_mb: Option<u64>) -> Option<ResourceRequirements> {
    let mut r = BTreeMap::new();
    if let Some(c) = cpus.filter(|c| c.is_finite() && *c > 0.0) {
        r.insert(
            "cpu".to_string(),
            Quantity(format!("{}m", (c * 1000.0).round() as u64)),
        );
    }
    if let Some(m) = memory_mb.filter(|m| *m > 0) {
        r.insert("memory".to_string(), Quantity(format!("{m}Mi")));
    }
    (!r.is_empty()).then(|| ResourceRequirements {
        requests: Some(r.clone()),
        limits: Some(r),
        ..Default::default()
    })
}

/// The sandbox's Pod, owned by the controller's ConfigMap.
pub fn pod(spec: &Spec, s: &Settings, owner: &Owner) -> Pod {
    let sid = &spec.identity.sandbox_id;
    Pod {
        metadata: meta(pod_name(sid), spec, s, owner),
        spec: Some(PodSpec {
            containers: vec![agent_container(spec, s)],
            // A second kernel (gVisor, Kata) where the profile asks for one.
            runtime_class_name: s.runtime_class.get(&spec.identity.profile).cloned(),
            restart_policy: Some("Never".into()),
            automount_service_account_token: Some(false),
            // No Service addresses of the namespace in the sandbox's environment.
            enable_service_links: Some(false),
            termination_grace_period_seconds: Some(15),
            image_pull_secrets: (!s.image_pull_secrets.is_empty()).then(|| {
                s.image_pull_secrets
                    .iter()
                    .map(|n| LocalObjectReference { name: n.clone() })
                    .collect()
            }),
            security_context: Some(PodSecurityContext {
                seccomp_profile: Some(seccomp_profile(s)),
                ..Default::default()
            }),
            volumes: Some(pod_volumes(sid, spec.limits.shm_mb)),
            // Behind the proxy, names are asked of the controller's DNS, which answers those
            // the policy allows (the cluster's DNS is not reachable).
            dns_policy: behind_proxy(spec, s).map(|_| "None".to_string()),
            dns_config: behind_proxy(spec, s).map(|r| PodDNSConfig {
                nameservers: Some(vec![r.address.to_string()]),
                searches: Some(vec![]),
                options: None,
            }),
            ..Default::default()
        }),
        status: None,
    }
}

/// The environment of a sandbox behind the proxy: where the proxy is, and the CA to trust.
fn egress_env(r: &EgressRoute) -> Vec<EnvVar> {
    let proxy = std::net::SocketAddr::new(r.address, r.proxy_port).to_string();
    crate::egress::proxy_env(&proxy)
        .into_iter()
        .chain(crate::egress::trust_env(&r.ca_pem))
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some(EnvVar {
                name: k.to_string(),
                value: Some(v.to_string()),
                ..Default::default()
            })
        })
        .collect()
}

/// The Pod's seccomp profile: the configured localhost one, else the runtime's default.
fn seccomp_profile(s: &Settings) -> SeccompProfile {
    match &s.seccomp_localhost_profile {
        Some(p) => SeccompProfile {
            type_: "Localhost".into(),
            localhost_profile: Some(p.clone()),
        },
        None => SeccompProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        },
    }
}

/// The Pod's volumes: the token Secret (root's only) and a memory-backed `/dev/shm`.
fn pod_volumes(sid: &str, shm_mb: Option<u64>) -> Vec<Volume> {
    let shm = shm_mb.map_or_else(|| SHM_LIMIT.to_string(), |m| format!("{m}Mi"));
    vec![
        Volume {
            name: "token".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret_name(sid)),
                // Root's only: the sandbox user cannot read the token.
                default_mode: Some(0o400),
                ..Default::default()
            }),
            ..Default::default()
        },
        Volume {
            name: "dshm".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".into()),
                size_limit: Some(Quantity(shm)),
                ..Default::default()
            }),
            ..Default::default()
        },
    ]
}

/// The agent's ports: its API, and CDP on a desktop.
fn container_ports(desktop: bool, agent_port: u16) -> Vec<ContainerPort> {
    let mut ports = vec![ContainerPort {
        name: Some("agent".into()),
        container_port: agent_port.into(),
        protocol: Some("TCP".into()),
        ..Default::default()
    }];
    if desktop {
        ports.push(ContainerPort {
            name: Some("cdp".into()),
            container_port: CDP_PORT.into(),
            protocol: Some("TCP".into()),
            ..Default::default()
        });
    }
    ports
}

/// The agent's container: the sandbox's image, its token by path, ready once `/healthz`
/// answers.
fn agent_container(spec: &Spec, s: &Settings) -> Container {
    Container {
        name: CONTAINER.into(),
        image: Some(spec.identity.image_ref.clone()),
        image_pull_policy: Some("IfNotPresent".into()),
        // The image's entrypoint (`berth-agent init`) stays; these replace its CMD.
        args: Some({
            let mut args = agent_args(spec.desktop, s.agent_port);
            args.extend(spec.agent_args());
            args
        }),
        // The token's path, never the token.
        env: Some({
            let mut env = vec![EnvVar {
                name: "BERTH_AGENT_TOKEN_FILE".into(),
                value: Some(format!("{TOKEN_DIR}/{TOKEN_KEY}")),
                ..Default::default()
            }];
            env.extend(behind_proxy(spec, s).map(egress_env).unwrap_or_default());
            env
        }),
        ports: Some(container_ports(spec.desktop, s.agent_port)),
        resources: resources(spec.limits.cpus, spec.limits.memory_mb),
        // /healthz needs no token.
        readiness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some(berth_protocol::routes::native::HEALTHZ.into()),
                port: IntOrString::Int(s.agent_port.into()),
                scheme: Some("HTTP".into()),
                ..Default::default()
            }),
            period_seconds: Some(2),
            timeout_seconds: Some(2),
            failure_threshold: Some(3),
            ..Default::default()
        }),
        volume_mounts: Some(vec![
            VolumeMount {
                name: "token".into(),
                mount_path: TOKEN_DIR.into(),
                read_only: Some(true),
                ..Default::default()
            },
            VolumeMount {
                name: "dshm".into(),
                mount_path: "/dev/shm".into(),
                ..Default::default()
            },
        ]),
        // The agent runs as root and switches to the sandbox user for commands (sudo, when
        // a bundle grants it, needs privilege escalation); raw sockets are not needed.
        security_context: Some(SecurityContext {
            privileged: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["NET_RAW".into()]),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn port(p: u16, protocol: &str) -> NetworkPolicyPort {
    NetworkPolicyPort {
        port: Some(IntOrString::Int(p.into())),
        protocol: Some(protocol.into()),
        end_port: None,
    }
}

fn ip_block(cidr: &str, except: &[&str]) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        ip_block: Some(IPBlock {
            cidr: cidr.into(),
            except: (!except.is_empty()).then(|| except.iter().map(|e| e.to_string()).collect()),
        }),
        ..Default::default()
    }
}

fn selector(pairs: &[(&str, &str)]) -> LabelSelector {
    LabelSelector {
        match_labels: Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        match_expressions: None,
    }
}

/// The controller's Pods (in its namespace when that is another).
fn controller_pods(s: &Settings) -> NetworkPolicyPeer {
    let mut peer = NetworkPolicyPeer {
        pod_selector: Some(selector(&[CONTROLLER_POD_LABEL])),
        ..Default::default()
    };
    if let Some(ns) = s
        .controller_namespace
        .as_ref()
        .filter(|ns| **ns != s.namespace)
    {
        peer.namespace_selector = Some(selector(&[("kubernetes.io/metadata.name", ns.as_str())]));
    }
    peer
}

/// The sandbox's NetworkPolicy, owned by the Pod. Ingress: from the controller's Pods to the
/// agent and CDP ports when they reach the Pod IP; none when agents are reached through the
/// API server's port-forward (which enters through the kubelet, not the Pod network).
/// Egress: behind the egress proxy, the controller's Pods on the proxy's and the DNS's ports
/// only; otherwise per `[kubernetes] egress`, with the cluster's DNS unless it is `none`.
pub fn network_policy(spec: &Spec, s: &Settings, pod: &Owner) -> NetworkPolicy {
    let sid = &spec.identity.sandbox_id;
    let ingress = match s.reach {
        KubeReach::PortForward => vec![],
        KubeReach::PodIp => {
            let from = controller_pods(s);
            let mut ports = vec![port(s.agent_port, "TCP")];
            if spec.desktop {
                ports.push(port(CDP_PORT, "TCP"));
            }
            vec![NetworkPolicyIngressRule {
                from: Some(vec![from]),
                ports: Some(ports),
            }]
        }
    };
    let dns = NetworkPolicyEgressRule {
        to: Some(vec![NetworkPolicyPeer {
            namespace_selector: Some(selector(&[("kubernetes.io/metadata.name", "kube-system")])),
            pod_selector: Some(selector(&[("k8s-app", "kube-dns")])),
            ..Default::default()
        }]),
        ports: Some(vec![port(53, "UDP"), port(53, "TCP")]),
    };
    let egress = match (behind_proxy(spec, s), &s.egress) {
        (Some(r), _) => vec![NetworkPolicyEgressRule {
            to: Some(vec![controller_pods(s)]),
            ports: Some(vec![
                port(r.proxy_port, "TCP"),
                port(r.dns_port, "UDP"),
                port(r.dns_port, "TCP"),
            ]),
        }],
        (None, KubeEgress::None) => vec![],
        (None, KubeEgress::Public) => vec![
            dns,
            NetworkPolicyEgressRule {
                to: Some(vec![
                    ip_block("0.0.0.0/0", DENIED_V4),
                    ip_block("::/0", DENIED_V6),
                ]),
                ports: None,
            },
        ],
        (None, KubeEgress::Allow(cidrs)) => vec![
            dns,
            NetworkPolicyEgressRule {
                to: Some(cidrs.iter().map(|c| ip_block(c, &[])).collect()),
                ports: None,
            },
        ],
    };
    NetworkPolicy {
        metadata: meta(pod_name(sid), spec, s, pod),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(selector(&[
                (LABEL_CONTROLLER, spec.identity.controller_id.as_str()),
                (LABEL_SANDBOX, sid.as_str()),
            ])),
            policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
            ingress: Some(ingress),
            egress: Some(egress),
        }),
    }
}

/// The egress policy a Pod behind the proxy was made with (its annotation).
pub fn egress_of(pod: &Pod) -> Option<berth_protocol::egress::Egress> {
    let a = pod.metadata.annotations.as_ref()?.get(LABEL_EGRESS)?;
    serde_json::from_str(a).ok()
}

/// The identity a Pod carries (`None` for a Pod that is not a berth sandbox).
pub fn identity(pod: &Pod) -> Option<Identity> {
    let labels = pod.metadata.labels.as_ref()?;
    Some(Identity {
        controller_id: labels.get(LABEL_CONTROLLER)?.clone(),
        sandbox_id: labels.get(LABEL_SANDBOX)?.clone(),
        profile: labels.get(LABEL_PROFILE)?.clone(),
        image_ref: pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_IMAGE))
            .cloned()
            .unwrap_or_default(),
    })
}

/// Whether the Pod runs the desktop (its agent was started with `--desktop`).
pub fn is_desktop(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.iter().find(|c| c.name == CONTAINER))
        .and_then(|c| c.args.as_ref())
        .is_some_and(|a| a.iter().any(|a| a == "--desktop"))
}

/// A Pod as the provider sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodState {
    /// Scheduling, pulling or creating; the agent container's waiting reason and message, or
    /// why the Pod is not scheduled, when known.
    Starting {
        waiting: Option<(String, String)>,
    },
    Running {
        ip: Option<String>,
        ready: bool,
    },
    /// Ended, or ending (being deleted): the reason, as a sandbox's failure says it.
    Dead(String),
}

fn agent_status(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::ContainerStatus> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == CONTAINER)
}

/// What a Pod read from the API means.
pub fn pod_state(pod: &Pod) -> PodState {
    if pod.metadata.deletion_timestamp.is_some() {
        return PodState::Dead("its Pod is being deleted".into());
    }
    let status = pod.status.as_ref();
    let agent = agent_status(pod);
    if let Some(t) = agent
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.as_ref())
    {
        return PodState::Dead(match t.reason.as_deref() {
            Some("OOMKilled") => "OOMKilled".into(),
            reason => format!(
                "its agent exited (exit code {}{})",
                t.exit_code,
                reason.map(|r| format!(", {r}")).unwrap_or_default()
            ),
        });
    }
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    match phase {
        "Failed" | "Succeeded" => {
            let reason = status.and_then(|s| s.reason.clone());
            let message = status.and_then(|s| s.message.clone());
            PodState::Dead(match (reason, message) {
                (Some(r), Some(m)) => format!("its Pod {}: {r}: {m}", phase.to_lowercase()),
                (Some(r), None) => format!("its Pod {}: {r}", phase.to_lowercase()),
                (None, Some(m)) => format!("its Pod {}: {m}", phase.to_lowercase()),
                (None, None) => format!("its Pod {}", phase.to_lowercase()),
            })
        }
        "Running" => PodState::Running {
            ip: status
                .and_then(|s| s.pod_ip.clone())
                .filter(|ip| !ip.is_empty()),
            ready: agent.is_some_and(|c| c.ready),
        },
        _ => {
            let waiting = agent
                .and_then(|c| c.state.as_ref())
                .and_then(|s| s.waiting.as_ref())
                .and_then(|w| Some((w.reason.clone()?, w.message.clone().unwrap_or_default())))
                .or_else(|| {
                    status?
                        .conditions
                        .as_ref()?
                        .iter()
                        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
                        .map(|c| {
                            (
                                c.reason.clone().unwrap_or_else(|| "Unschedulable".into()),
                                c.message.clone().unwrap_or_default(),
                            )
                        })
                });
            PodState::Starting { waiting }
        }
    }
}

/// Waiting reasons that never resolve on their own.
const FATAL_AT_ONCE: &[&str] = &[
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];
/// Waiting reasons that fail a create once they last past the pull bound.
const PULL_FAILURES: &[&str] = &["ErrImagePull", "ImagePullBackOff"];

/// What a create does next, given the Pod as read and how long it has waited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartStep {
    /// Keep waiting.
    Wait,
    /// The Pod runs at this IP: probe its agent.
    Probe(String),
    Fail(String),
}

pub fn start_step(
    state: &PodState,
    waited: std::time::Duration,
    pull_bound: std::time::Duration,
    start_bound: std::time::Duration,
) -> StartStep {
    let reason = match state {
        PodState::Dead(r) => return StartStep::Fail(r.clone()),
        PodState::Running { ip: Some(ip), .. } => return StartStep::Probe(ip.clone()),
        PodState::Starting {
            waiting: Some((reason, message)),
        } => {
            let said = match message.is_empty() {
                true => reason.clone(),
                false => format!("{reason}: {message}"),
            };
            if FATAL_AT_ONCE.contains(&reason.as_str())
                || (PULL_FAILURES.contains(&reason.as_str()) && waited >= pull_bound)
            {
                return StartStep::Fail(format!("its Pod cannot start: {said}"));
            }
            said
        }
        PodState::Running { ip: None, .. } => "it runs but has no Pod IP yet".to_string(),
        PodState::Starting { waiting: None } => "it is starting".to_string(),
    };
    match waited >= start_bound {
        true => StartStep::Fail(format!(
            "its Pod did not start within {} s ({reason})",
            start_bound.as_secs()
        )),
        false => StartStep::Wait,
    }
}

/// `http://ip:port`, with IPv6 addresses in brackets.
pub fn url(ip: &str, port: u16) -> String {
    match ip.contains(':') {
        true => format!("http://[{ip}]:{port}"),
        false => format!("http://{ip}:{port}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    pub(crate) fn spec(desktop: bool) -> Spec {
        Spec {
            identity: Identity {
                controller_id: "ctl_0123456789abcdef".into(),
                sandbox_id: "sb_00aa11bb22cc33dd".into(),
                profile: "desktop-ubuntu".into(),
                image_ref: "registry.local:5000/berth/desktop:4f2a".into(),
            },
            desktop,
            ide: None,
            agent_token: "tok-SECRET-4711".into(),
            browser_toolset_enable: vec!["javascript_exec".into()],
            memory_merge: false,
            egress: Default::default(),
            limits: berth_protocol::controller::Limits {
                cpus: Some(1.5),
                memory_mb: Some(3072),
                shm_mb: Some(256),
                ..Default::default()
            },
        }
    }

    pub(crate) fn settings(reach: KubeReach) -> Settings {
        Settings {
            namespace: "berth".into(),
            agent_port: 5000,
            reach,
            egress: KubeEgress::Public,
            image_pull_secrets: vec!["pull".into()],
            seccomp_localhost_profile: None,
            runtime_class: Default::default(),
            controller_namespace: Some("berth".into()),
            egress_route: None,
        }
    }

    fn owner() -> Owner {
        Owner {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: "berth-controller-ctl-0123456789abcdef".into(),
            uid: "uid-owner".into(),
        }
    }

    #[test]
    fn names_are_dns_labels_from_ids() {
        assert_eq!(pod_name("sb_00aa11bb22cc33dd"), "berth-sb-00aa11bb22cc33dd");
        assert_eq!(
            secret_name("sb_00aa11bb22cc33dd"),
            "berth-sb-00aa11bb22cc33dd-token"
        );
        assert_eq!(
            owner_name("ctl_0123456789abcdef"),
            "berth-controller-ctl-0123456789abcdef"
        );
        let long = "x".repeat(100);
        assert!(secret_name(&long).len() <= 63);
        assert!(crate::config::is_dns_label(&pod_name("Weird_ID!")));
    }

    #[test]
    fn labels_hold_what_a_label_can_and_the_image_is_an_annotation() {
        let s = spec(true);
        let l = labels(&s.identity);
        assert_eq!(l[LABEL_CONTROLLER], "ctl_0123456789abcdef");
        assert_eq!(l[LABEL_SANDBOX], "sb_00aa11bb22cc33dd");
        assert_eq!(l[LABEL_PROFILE], "desktop-ubuntu");
        assert_eq!(l[LABEL_MANAGED], "true");
        assert!(!l.contains_key(LABEL_IMAGE));
        assert!(l.values().all(|v| is_label_value(v)));
        assert!(!is_label_value("registry.local:5000/berth/desktop:4f2a"));
        assert!(!is_label_value(&"a".repeat(64)));
        assert!(!is_label_value("-a"));
        let p = pod(&s, &settings(KubeReach::PodIp), &owner());
        assert_eq!(identity(&p), Some(s.identity.clone()));
        assert!(is_desktop(&p));
    }

    #[test]
    fn the_pod_mounts_the_token_as_a_file_and_never_carries_it() {
        let s = spec(true);
        let p = pod(&s, &settings(KubeReach::PodIp), &owner());
        let json = serde_json::to_string(&p).unwrap();
        assert!(!json.contains("tok-SECRET-4711"), "{json}");
        let ps = p.spec.as_ref().unwrap();
        let c = &ps.containers[0];
        assert_eq!(c.name, "agent");
        assert_eq!(
            c.args.as_deref().unwrap(),
            [
                "--listen",
                "0.0.0.0:5000",
                "--cdp-listen",
                "0.0.0.0:9222",
                "--desktop",
                "--browser-toolset-enable",
                "javascript_exec"
            ]
        );
        let env = c.env.as_ref().unwrap();
        assert_eq!(env.len(), 1);
        assert_eq!(env[0].name, "BERTH_AGENT_TOKEN_FILE");
        assert_eq!(env[0].value.as_deref(), Some("/run/berth/token/token"));
        let mount = c
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.mount_path == TOKEN_DIR)
            .unwrap();
        assert_eq!(mount.read_only, Some(true));
        let vol = ps
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == mount.name)
            .unwrap();
        let secret = vol.secret.as_ref().unwrap();
        assert_eq!(
            secret.secret_name.as_deref(),
            Some("berth-sb-00aa11bb22cc33dd-token")
        );
        assert_eq!(secret.default_mode, Some(0o400));
        assert_eq!(ps.automount_service_account_token, Some(false));
        assert_eq!(ps.restart_policy.as_deref(), Some("Never"));
        let r = c.resources.as_ref().unwrap();
        assert_eq!(r.limits.as_ref().unwrap()["cpu"].0, "1500m");
        assert_eq!(r.limits.as_ref().unwrap()["memory"].0, "3072Mi");
        assert_eq!(r.requests, r.limits);
        let owners = p.metadata.owner_references.as_ref().unwrap();
        assert_eq!(owners[0].kind, "ConfigMap");
        assert_eq!(owners[0].uid, "uid-owner");

        let secret = token_secret(&s, &settings(KubeReach::PodIp), &owner());
        assert_eq!(secret.data.as_ref().unwrap()["token"].0, b"tok-SECRET-4711");
        assert_eq!(
            secret.metadata.name.as_deref(),
            Some("berth-sb-00aa11bb22cc33dd-token")
        );
    }

    #[test]
    fn a_profile_with_a_runtime_class_runs_its_pods_under_it_and_the_others_under_the_default() {
        let mut st = settings(KubeReach::PodIp);
        st.runtime_class = [("desktop-ubuntu".to_string(), "gvisor".to_string())].into();
        let class = |s: &Spec| pod(s, &st, &owner()).spec.unwrap().runtime_class_name;
        assert_eq!(class(&spec(true)).as_deref(), Some("gvisor"));
        let mut ide = spec(false);
        ide.identity.profile = "ide-ubuntu".into();
        assert_eq!(class(&ide), None);
    }

    #[test]
    fn shm_is_memory_the_probe_needs_no_token_and_seccomp_is_chosen() {
        let mut st = settings(KubeReach::PodIp);
        let p = pod(&spec(false), &st, &owner());
        let ps = p.spec.as_ref().unwrap();
        let shm = ps
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == "dshm")
            .unwrap();
        assert_eq!(
            shm.empty_dir.as_ref().unwrap().medium.as_deref(),
            Some("Memory")
        );
        // The limits' /dev/shm size (the test spec's 256 MiB).
        assert_eq!(
            shm.empty_dir.as_ref().unwrap().size_limit,
            Some(Quantity("256Mi".into()))
        );
        let c = &ps.containers[0];
        assert_eq!(c.args.as_deref().unwrap(), ["--listen", "0.0.0.0:5000"]);
        // An IDE profile's agent serves the IDE under the controller's path of its ports.
        let mut ide = spec(false);
        ide.ide = Some("jupyterlab".into());
        let p = pod(&ide, &st, &owner());
        assert_eq!(
            p.spec.as_ref().unwrap().containers[0]
                .args
                .as_deref()
                .unwrap(),
            [
                "--listen",
                "0.0.0.0:5000",
                "--ide",
                "jupyterlab",
                "--ports-prefix",
                "/sandbox/sandboxes/v1/sb_00aa11bb22cc33dd/ports/"
            ]
        );
        let probe = c
            .readiness_probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap();
        assert_eq!(probe.path.as_deref(), Some("/healthz"));
        assert!(probe.http_headers.is_none());
        assert_eq!(probe.port, IntOrString::Int(5000));
        let sc = ps.security_context.as_ref().unwrap();
        assert_eq!(sc.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");
        st.seccomp_localhost_profile = Some("berth.json".into());
        let p = pod(&spec(false), &st, &owner());
        let sc = p
            .spec
            .unwrap()
            .security_context
            .unwrap()
            .seccomp_profile
            .unwrap();
        assert_eq!(
            (sc.type_.as_str(), sc.localhost_profile.as_deref()),
            ("Localhost", Some("berth.json"))
        );
        let mut s = spec(false);
        s.limits = Default::default();
        let p = pod(&s, &settings(KubeReach::PodIp), &owner());
        assert!(p.spec.unwrap().containers[0].resources.is_none());
    }

    #[test]
    fn a_sandbox_with_a_policy_goes_out_through_the_controller_only() {
        let mut st = settings(KubeReach::PodIp);
        st.controller_namespace = Some("berth-system".into());
        st.egress_route = Some(EgressRoute {
            address: "10.96.0.40".parse().unwrap(),
            proxy_port: 3128,
            dns_port: 5353,
            ca_pem: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".into(),
        });
        let mut s = spec(true);
        let policy = berth_protocol::egress::Egress::Rules(berth_protocol::egress::EgressRules {
            allow: vec!["github.com".into()],
            deny_private: true,
        });
        s.egress = policy.clone();
        let p = pod(&s, &st, &owner());
        assert_eq!(egress_of(&p), Some(policy));
        let ps = p.spec.as_ref().unwrap();
        assert_eq!(ps.dns_policy.as_deref(), Some("None"));
        let dns = ps.dns_config.as_ref().unwrap();
        assert_eq!(dns.nameservers, Some(vec!["10.96.0.40".to_string()]));
        assert_eq!(dns.searches, Some(vec![]));
        let env: BTreeMap<String, String> = ps.containers[0]
            .env
            .as_ref()
            .unwrap()
            .iter()
            .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
            .collect();
        assert_eq!(env["https_proxy"], "http://10.96.0.40:3128");
        assert_eq!(env["HTTP_PROXY"], "http://10.96.0.40:3128");
        assert!(env["BERTH_EGRESS_CA"].contains("BEGIN CERTIFICATE"));
        assert_eq!(env["GIT_SSL_CAINFO"], "/etc/ssl/certs/ca-certificates.crt");
        assert_eq!(env["BERTH_AGENT_TOKEN_FILE"], "/run/berth/token/token");

        let np = network_policy(&s, &st, &owner());
        let ns = np.spec.unwrap();
        let egress = ns.egress.unwrap();
        assert_eq!(egress.len(), 1, "{egress:?}");
        let to = &egress[0].to.as_ref().unwrap()[0];
        assert!(to.ip_block.is_none());
        let pods = to
            .pod_selector
            .as_ref()
            .unwrap()
            .match_labels
            .clone()
            .unwrap();
        assert_eq!(pods["app.kubernetes.io/name"], "berth-controller");
        let nss = to
            .namespace_selector
            .as_ref()
            .unwrap()
            .match_labels
            .clone()
            .unwrap();
        assert_eq!(nss["kubernetes.io/metadata.name"], "berth-system");
        let ports: Vec<(IntOrString, String)> = egress[0]
            .ports
            .as_ref()
            .unwrap()
            .iter()
            .map(|p| (p.port.clone().unwrap(), p.protocol.clone().unwrap()))
            .collect();
        assert_eq!(
            ports,
            [
                (IntOrString::Int(3128), "TCP".to_string()),
                (IntOrString::Int(5353), "UDP".to_string()),
                (IntOrString::Int(5353), "TCP".to_string()),
            ]
        );

        // "open" keeps the cluster's DNS and the configured egress; so does every policy on a
        // provider without a route.
        for (open, route) in [(true, true), (false, false)] {
            let mut s2 = spec(true);
            if !open {
                s2.egress = s.egress.clone();
            }
            let mut st2 = st.clone();
            if !route {
                st2.egress_route = None;
            }
            let p = pod(&s2, &st2, &owner());
            let ps = p.spec.as_ref().unwrap();
            assert!(ps.dns_policy.is_none() && ps.dns_config.is_none());
            assert!(egress_of(&p).is_none());
            assert_eq!(ps.containers[0].env.as_ref().unwrap().len(), 1);
            let np = network_policy(&s2, &st2, &owner());
            assert_eq!(np.spec.unwrap().egress.unwrap().len(), 2);
        }
    }

    #[test]
    fn the_network_policy_admits_the_controller_only_and_denies_private_ranges() {
        let s = spec(true);
        let pod_owner = Owner {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: "berth-sb-00aa11bb22cc33dd".into(),
            uid: "uid-pod".into(),
        };
        let np = network_policy(&s, &settings(KubeReach::PodIp), &pod_owner);
        assert_eq!(
            np.metadata.owner_references.as_ref().unwrap()[0].kind,
            "Pod"
        );
        let spec_ = np.spec.as_ref().unwrap();
        assert_eq!(
            spec_
                .pod_selector
                .as_ref()
                .unwrap()
                .match_labels
                .as_ref()
                .unwrap()[LABEL_SANDBOX],
            "sb_00aa11bb22cc33dd"
        );
        let ingress = spec_.ingress.as_ref().unwrap();
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
        assert!(from.namespace_selector.is_none());
        assert_eq!(ingress[0].ports.as_ref().unwrap().len(), 2);
        let egress = spec_.egress.as_ref().unwrap();
        assert_eq!(
            egress[0].ports.as_ref().unwrap()[0].port,
            Some(IntOrString::Int(53))
        );
        let v4 = egress[1].to.as_ref().unwrap()[0].ip_block.as_ref().unwrap();
        assert_eq!(v4.cidr, "0.0.0.0/0");
        let except = v4.except.as_ref().unwrap();
        for r in [
            "10.0.0.0/8",
            "172.16.0.0/12",
            "192.168.0.0/16",
            "169.254.0.0/16",
        ] {
            assert!(except.iter().any(|e| e == r), "{r}");
        }

        let mut st = settings(KubeReach::PortForward);
        st.egress = KubeEgress::None;
        let np = network_policy(&s, &st, &pod_owner);
        let spec_ = np.spec.unwrap();
        assert_eq!(spec_.ingress, Some(vec![]));
        assert_eq!(spec_.egress, Some(vec![]));
        assert_eq!(
            spec_.policy_types,
            Some(vec!["Ingress".to_string(), "Egress".to_string()])
        );

        let mut st = settings(KubeReach::PodIp);
        st.controller_namespace = Some("ops".into());
        st.egress = KubeEgress::Allow(vec!["203.0.113.0/24".into()]);
        let np = network_policy(&spec(false), &st, &pod_owner);
        let spec_ = np.spec.unwrap();
        let from = &spec_.ingress.as_ref().unwrap()[0].from.as_ref().unwrap()[0];
        assert_eq!(
            from.namespace_selector
                .as_ref()
                .unwrap()
                .match_labels
                .as_ref()
                .unwrap()["kubernetes.io/metadata.name"],
            "ops"
        );
        assert_eq!(
            spec_.ingress.as_ref().unwrap()[0]
                .ports
                .as_ref()
                .unwrap()
                .len(),
            1
        );
        let egress = spec_.egress.unwrap();
        assert_eq!(
            egress[1].to.as_ref().unwrap()[0]
                .ip_block
                .as_ref()
                .unwrap()
                .cidr,
            "203.0.113.0/24"
        );
    }

    fn pod_with(status: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "berth-sb-1"},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn pod_states_and_start_steps() {
        let second = Duration::from_secs(1);
        let pull = Duration::from_secs(120);
        let start = Duration::from_secs(300);
        let running = pod_with(serde_json::json!({
            "phase": "Running", "podIP": "10.1.2.3",
            "containerStatuses": [{"name": "agent", "image": "i", "imageID": "", "ready": true,
                                   "restartCount": 0, "state": {"running": {}}}]
        }));
        assert_eq!(
            pod_state(&running),
            PodState::Running {
                ip: Some("10.1.2.3".into()),
                ready: true
            }
        );
        assert_eq!(
            start_step(&pod_state(&running), second, pull, start),
            StartStep::Probe("10.1.2.3".into())
        );
        let oom = pod_with(serde_json::json!({
            "phase": "Failed",
            "containerStatuses": [{"name": "agent", "image": "i", "imageID": "", "ready": false,
                                   "restartCount": 0,
                                   "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]
        }));
        assert_eq!(pod_state(&oom), PodState::Dead("OOMKilled".into()));
        let evicted = pod_with(serde_json::json!({
            "phase": "Failed", "reason": "Evicted", "message": "low on memory"
        }));
        assert_eq!(
            pod_state(&evicted),
            PodState::Dead("its Pod failed: Evicted: low on memory".into())
        );
        let backoff = pod_with(serde_json::json!({
            "phase": "Pending",
            "containerStatuses": [{"name": "agent", "image": "i", "imageID": "", "ready": false,
                                   "restartCount": 0,
                                   "state": {"waiting": {"reason": "ImagePullBackOff",
                                                         "message": "Back-off pulling image"}}}]
        }));
        let st = pod_state(&backoff);
        assert_eq!(start_step(&st, second, pull, start), StartStep::Wait);
        match start_step(&st, pull, pull, start) {
            StartStep::Fail(r) => assert!(r.contains("ImagePullBackOff"), "{r}"),
            other => panic!("{other:?}"),
        }
        let invalid = pod_with(serde_json::json!({
            "phase": "Pending",
            "containerStatuses": [{"name": "agent", "image": "i", "imageID": "", "ready": false,
                                   "restartCount": 0,
                                   "state": {"waiting": {"reason": "InvalidImageName"}}}]
        }));
        assert!(matches!(
            start_step(&pod_state(&invalid), second, pull, start),
            StartStep::Fail(_)
        ));
        let unschedulable = pod_with(serde_json::json!({
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                            "message": "0/3 nodes are available: 3 Insufficient cpu."}]
        }));
        let st = pod_state(&unschedulable);
        assert_eq!(start_step(&st, second, pull, start), StartStep::Wait);
        match start_step(&st, start, pull, start) {
            StartStep::Fail(r) => assert!(r.contains("Insufficient cpu"), "{r}"),
            other => panic!("{other:?}"),
        }
        let mut deleting = running.clone();
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-01-01T00:00:00Z".parse().unwrap(),
            ));
        assert!(matches!(pod_state(&deleting), PodState::Dead(_)));
        assert_eq!(url("10.1.2.3", 5000), "http://10.1.2.3:5000");
        assert_eq!(url("fd00::5", 5000), "http://[fd00::5]:5000");
    }
}
