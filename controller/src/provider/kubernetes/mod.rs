//! The `kubernetes` provider: one Pod per sandbox from its image reference (a registry the
//! cluster pulls from), in one namespace, labelled with the fixed identity and owned by a
//! ConfigMap scoped to the controller; the agent's token in a per-sandbox Secret mounted as a
//! file; a NetworkPolicy per sandbox. Agents are reached at the Pod IP when the controller runs
//! in the cluster, through the API server's port-forward when it does not. Deaths come from a
//! watch on the controller's Pods.
//!
//! Bare Pods, not agent-sandbox `Sandbox` objects: the controller already owns pooling,
//! leases and recovery, a Pod is what every cluster runs without extra CRDs, and the objects
//! (and so the Role) stay the few listed in `RBAC`.
//!
//! Create order: the Pod (owned by the controller's ConfigMap), then its NetworkPolicy and
//! token Secret (owned by the Pod). The kubelet starts no container before the Secret volume
//! can be mounted, so the agent never runs without its token, and its policy is made first.

pub mod objects;
pub mod portforward;
pub mod watch;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

use super::{Death, Endpoint, Observed, Provider, ProviderError, Result, Spec};
use crate::config::{KubeReach, KubernetesConfig};
use objects::{Owner, PodState, Settings, StartStep};

/// One rule of the Role the provider needs: exactly the API calls it makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permission {
    /// `""` for the core group.
    pub api_group: &'static str,
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
}

/// Every API call the provider makes, as Role rules.
pub const RBAC: &[Permission] = &[
    // The controller's owner object: read (adopted) or made at start and before a create.
    Permission {
        api_group: "",
        resource: "configmaps",
        verbs: &["get", "create"],
    },
    // Sandboxes: made, read while starting and by inspect, listed by label at start and
    // when a watch must start over, watched for deaths, deleted.
    Permission {
        api_group: "",
        resource: "pods",
        verbs: &["get", "list", "watch", "create", "delete"],
    },
    // `reach = "port-forward"`: the WebSocket upgrade is a GET, which API servers authorize
    // as `get` (older) or `create` (newer).
    Permission {
        api_group: "",
        resource: "pods/portforward",
        verbs: &["get", "create"],
    },
    Permission {
        api_group: "",
        resource: "secrets",
        verbs: &["create", "delete"],
    },
    Permission {
        api_group: "networking.k8s.io",
        resource: "networkpolicies",
        verbs: &["create", "delete"],
    },
    // The controller's own Service, read at start: its ClusterIP is where sandboxes with an
    // egress policy find the proxy and their DNS.
    Permission {
        api_group: "",
        resource: "services",
        verbs: &["get"],
    },
];

/// The service account's files in a Pod.
const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Any one API call: an API server that hangs must not hang the controller (watches are
/// bounded by the server and re-issued).
const CALL: Duration = Duration::from_secs(60);
/// How long an image may fail to pull (ErrImagePull / ImagePullBackOff) before a create fails.
const PULL_BOUND: Duration = Duration::from_secs(120);

/// Whether this process runs in a Pod with a service account (the in-cluster configuration).
pub fn in_cluster() -> bool {
    std::env::var_os("KUBERNETES_SERVICE_HOST").is_some_and(|h| !h.is_empty())
        && std::path::Path::new(SERVICE_ACCOUNT_DIR)
            .join("token")
            .exists()
}

fn failed(what: &str, e: impl std::fmt::Display) -> ProviderError {
    ProviderError::Failed(format!("kubernetes {what}: {e}"))
}

async fn timed<T>(what: &str, f: impl std::future::Future<Output = kube::Result<T>>) -> Result<T> {
    tokio::time::timeout(CALL, f)
        .await
        .map_err(|_| failed(what, "the API server did not answer in time"))?
        .map_err(|e| failed(what, e))
}

/// A 404 is fine: deletes are idempotent.
async fn delete_quietly<K>(api: &Api<K>, what: &str, name: &str) -> Result<()>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match tokio::time::timeout(CALL, api.delete(name, &DeleteParams::background())).await {
        Err(_) => Err(failed(what, "the API server did not answer in time")),
        Ok(Ok(_)) => Ok(()),
        Ok(Err(kube::Error::Api(s))) if s.code == 404 => Ok(()),
        Ok(Err(e)) => Err(failed(what, e)),
    }
}

/// The per-sandbox loopback listeners of `reach = "port-forward"`.
struct Forwards {
    agent: portforward::Forward,
    cdp: Option<portforward::Forward>,
}

pub struct KubernetesProvider {
    client: kube::Client,
    settings: Settings,
    default_image: Option<String>,
    start_bound: Duration,
    pull_bound: Duration,
    /// How often a starting Pod is read again.
    poll: Duration,
    /// The owner ConfigMap per controller id, once made or adopted.
    owners: tokio::sync::Mutex<HashMap<String, Owner>>,
    forwards: tokio::sync::Mutex<HashMap<String, Forwards>>,
    destroying: Arc<watch::Destroying>,
    /// Which sandbox each Pod IP is, for the egress proxy and DNS, and the credentials they
    /// were granted (`None`: no sandbox is behind the proxy here).
    gate: Option<Gate>,
}

/// The egress proxy's book and edge, shared with every provider of the controller.
#[derive(Clone)]
pub struct Gate {
    pub book: Arc<crate::egress::Book>,
    pub edge: Arc<crate::egress::edge::Edge>,
}

/// What the egress proxy and DNS of Kubernetes sandboxes are made of.
pub struct EgressParts {
    pub gate: Gate,
    pub hosts: crate::egress::proxy::Hosts,
    pub proxy_port: u16,
}

impl KubernetesProvider {
    /// The client from the configuration: the kubeconfig named, else the in-cluster
    /// configuration in a Pod, else `KUBECONFIG` / `~/.kube/config`.
    pub async fn connect(
        cfg: &KubernetesConfig,
        egress: EgressParts,
    ) -> anyhow::Result<KubernetesProvider> {
        let in_cluster = in_cluster();
        let config = match &cfg.kubeconfig {
            Some(path) => {
                let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| {
                    anyhow::anyhow!("reading the kubeconfig {}: {e}", path.display())
                })?;
                kube::Config::from_custom_kubeconfig(kc, &Default::default())
                    .await
                    .map_err(|e| anyhow::anyhow!("the kubeconfig {}: {e}", path.display()))?
            }
            None if in_cluster => kube::Config::incluster()
                .map_err(|e| anyhow::anyhow!("the in-cluster configuration: {e}"))?,
            None => kube::Config::infer().await.map_err(|e| {
                anyhow::anyhow!(
                    "no Kubernetes configuration (not in a cluster, and no KUBECONFIG or \
                     ~/.kube/config; or set [kubernetes] kubeconfig): {e}"
                )
            })?,
        };
        let namespace = cfg
            .namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        let controller_namespace = in_cluster
            .then(|| std::fs::read_to_string(format!("{SERVICE_ACCOUNT_DIR}/namespace")).ok())
            .flatten()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty());
        let reach = cfg.reach.unwrap_or(match in_cluster {
            true => KubeReach::PodIp,
            false => KubeReach::PortForward,
        });
        let client = kube::Client::try_from(config)
            .map_err(|e| anyhow::anyhow!("building the Kubernetes client: {e}"))?;
        tracing::info!(%namespace, ?reach, in_cluster, "kubernetes provider");
        // The proxy needs the controller on the Pod network, where sandboxes reach it.
        let egress_route = match reach {
            KubeReach::PodIp => {
                let ns = controller_namespace.as_deref().unwrap_or(&namespace);
                serve_egress(&client, ns, cfg, &egress).await
            }
            KubeReach::PortForward => None,
        };
        Ok(Self::new(
            client,
            Settings {
                namespace,
                agent_port: cfg.agent_port(),
                reach,
                egress: cfg.egress.clone(),
                image_pull_secrets: cfg.image_pull_secrets.clone(),
                seccomp_localhost_profile: cfg.seccomp_localhost_profile.clone(),
                runtime_class: crate::config::Config::by_profile_name(&cfg.runtime_class),
                controller_namespace,
                egress_route,
            },
            cfg,
        )
        .with_gate(egress.gate))
    }

    /// Sandboxes behind the proxy are registered in `gate`'s book by Pod IP.
    pub fn with_gate(mut self, gate: Gate) -> Self {
        self.gate = Some(gate);
        self
    }

    /// A sandbox behind the proxy is known by its Pod IP from the moment it has one (again
    /// after a restart of the controller: the policy is the Pod's annotation).
    fn register(&self, sandbox_id: &str, ip: &str, pod: &Pod) {
        let policy = objects::egress_of(pod);
        let (Some(gate), Some(policy), Ok(ip)) = (&self.gate, policy, ip.parse()) else {
            return;
        };
        // A Pod being deleted (by this controller or another) is forgotten, not known again.
        let going =
            pod.metadata.deletion_timestamp.is_some() || self.destroying.contains(sandbox_id);
        if self.settings.egress_route.is_some() && !going {
            gate.book.register(ip, sandbox_id, policy);
        }
    }

    /// A provider on a client made elsewhere (a test's mock service).
    pub fn new(
        client: kube::Client,
        settings: Settings,
        cfg: &KubernetesConfig,
    ) -> KubernetesProvider {
        let start_bound = cfg.start_timeout();
        KubernetesProvider {
            client,
            settings,
            default_image: cfg.image.clone(),
            start_bound,
            pull_bound: PULL_BOUND.min(start_bound),
            poll: Duration::from_millis(500),
            owners: Default::default(),
            forwards: Default::default(),
            destroying: Default::default(),
            gate: None,
        }
    }

    #[cfg(test)]
    fn with_poll(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.settings.namespace)
    }

    /// The controller's owner ConfigMap: adopted when it exists, made otherwise.
    async fn owner(&self, controller_id: &str) -> Result<Owner> {
        let mut owners = self.owners.lock().await;
        if let Some(o) = owners.get(controller_id) {
            return Ok(o.clone());
        }
        let api: Api<ConfigMap> = self.api();
        let name = objects::owner_name(controller_id);
        let found = match timed("reading the owner ConfigMap", api.get_opt(&name)).await? {
            Some(cm) => cm,
            None => {
                let cm = objects::owner_config_map(controller_id, &self.settings.namespace);
                match tokio::time::timeout(CALL, api.create(&PostParams::default(), &cm)).await {
                    Ok(Ok(cm)) => cm,
                    // Made meanwhile by another replica or an earlier attempt.
                    Ok(Err(kube::Error::Api(s))) if s.code == 409 => {
                        timed("reading the owner ConfigMap", api.get(&name)).await?
                    }
                    Ok(Err(e)) => return Err(failed("creating the owner ConfigMap", e)),
                    Err(_) => return Err(failed("creating the owner ConfigMap", "timed out")),
                }
            }
        };
        let owner = Owner::of("v1", "ConfigMap", &found.metadata)
            .ok_or_else(|| failed("the owner ConfigMap", "it has no name or uid"))?;
        owners.insert(controller_id.to_string(), owner.clone());
        Ok(owner)
    }

    /// The endpoint of a running Pod at `ip`: the Pod IP itself, or this sandbox's loopback
    /// forwards (made when missing: after a restart of the controller too).
    async fn endpoint(&self, pod: &Pod, sandbox_id: &str, ip: &str) -> Result<Endpoint> {
        let port = self.settings.agent_port;
        let desktop = objects::is_desktop(pod);
        let (agent_url, cdp_url) = match self.settings.reach {
            KubeReach::PodIp => (
                objects::url(ip, port),
                desktop.then(|| objects::url(ip, objects::CDP_PORT)),
            ),
            KubeReach::PortForward => {
                let mut forwards = self.forwards.lock().await;
                if !forwards.contains_key(sandbox_id) {
                    let name = objects::pod_name(sandbox_id);
                    let listen = |p| portforward::listen(self.api(), name.clone(), p);
                    let agent = listen(port)
                        .await
                        .map_err(|e| failed("listening for the port-forward", e))?;
                    let cdp = match desktop {
                        true => Some(
                            listen(objects::CDP_PORT)
                                .await
                                .map_err(|e| failed("listening for the port-forward", e))?,
                        ),
                        false => None,
                    };
                    forwards.insert(sandbox_id.to_string(), Forwards { agent, cdp });
                }
                let f = &forwards[sandbox_id];
                (
                    format!("http://{}", f.agent.addr),
                    f.cdp.as_ref().map(|c| format!("http://{}", c.addr)),
                )
            }
        };
        Ok(Endpoint {
            compat_url: agent_url.clone(),
            agent_url,
            cdp_url,
            ports: Default::default(),
        })
    }

    async fn observe(&self, pod: &Pod) -> Result<Option<Observed>> {
        let Some(identity) = objects::identity(pod) else {
            return Ok(None);
        };
        let state = objects::pod_state(pod);
        let endpoint = match &state {
            PodState::Running { ip: Some(ip), .. } => {
                self.register(&identity.sandbox_id, ip, pod);
                Some(self.endpoint(pod, &identity.sandbox_id, ip).await?)
            }
            _ => None,
        };
        Ok(Some(Observed {
            alive: matches!(state, PodState::Running { .. }),
            endpoint,
            created_at_ms: pod
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.as_millisecond())
                .unwrap_or(0),
            identity,
        }))
    }

    async fn wait_started(&self, spec: &Spec) -> Result<Endpoint> {
        let sid = &spec.identity.sandbox_id;
        let name = objects::pod_name(sid);
        let pods: Api<Pod> = self.api();
        let started = Instant::now();
        loop {
            let Some(pod) = timed("reading the Pod", pods.get_opt(&name)).await? else {
                return Err(ProviderError::Failed(format!(
                    "its Pod {name} was deleted while starting"
                )));
            };
            let state = objects::pod_state(&pod);
            match objects::start_step(&state, started.elapsed(), self.pull_bound, self.start_bound)
            {
                StartStep::Wait => {}
                StartStep::Fail(reason) => return Err(ProviderError::Failed(reason)),
                StartStep::Probe(ip) => {
                    self.register(sid, &ip, &pod);
                    let ep = self.endpoint(&pod, sid, &ip).await?;
                    if healthz(&ep.agent_url).await {
                        return Ok(ep);
                    }
                    if started.elapsed() >= self.start_bound {
                        let hint = match self.settings.reach {
                            KubeReach::PodIp => format!(
                                " at {} (the NetworkPolicy admits Pods labelled {}={} only)",
                                ep.agent_url,
                                objects::CONTROLLER_POD_LABEL.0,
                                objects::CONTROLLER_POD_LABEL.1
                            ),
                            KubeReach::PortForward => " through the port-forward".to_string(),
                        };
                        return Err(ProviderError::Failed(format!(
                            "the agent in {name} did not answer within {} s{hint}",
                            self.start_bound.as_secs()
                        )));
                    }
                }
            }
            tokio::time::sleep(self.poll).await;
        }
    }
}

/// The egress proxy and DNS for sandbox Pods, served on the controller's Pod network
/// (every address: the proxy on `[egress] proxy_port`, the DNS on `[kubernetes]
/// egress_dns_port`), and the route to them: the controller's Service's ClusterIP. `None`,
/// with the reason logged, when either cannot be had; sandboxes then get no policy here.
async fn serve_egress(
    client: &kube::Client,
    namespace: &str,
    cfg: &KubernetesConfig,
    parts: &EgressParts,
) -> Option<objects::EgressRoute> {
    use k8s_openapi::api::core::v1::Service;
    let name = cfg.egress_service();
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let unserved = |why: String| {
        tracing::warn!(
            service = name, %namespace, reason = %why,
            "kubernetes: no egress proxy for sandboxes; a policy other than \"open\" is refused"
        );
        None
    };
    let service = match timed("reading the controller's Service", services.get_opt(name)).await {
        Ok(Some(s)) => s,
        Ok(None) => return unserved(format!("the Service {name} does not exist")),
        Err(e) => return unserved(e.to_string()),
    };
    let address = match service
        .spec
        .and_then(|s| s.cluster_ip)
        .and_then(|ip| ip.parse::<std::net::IpAddr>().ok())
    {
        Some(ip) => ip,
        None => return unserved(format!("the Service {name} has no ClusterIP")),
    };
    // Sandboxes reach it from the Service's address family.
    let any: std::net::IpAddr = match address {
        std::net::IpAddr::V4(_) => std::net::Ipv4Addr::UNSPECIFIED.into(),
        std::net::IpAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
    };
    let proxy = match tokio::net::TcpListener::bind((any, parts.proxy_port)).await {
        Ok(l) => l,
        Err(e) => return unserved(format!("listening for the proxy: {e}")),
    };
    let proxy_port = proxy
        .local_addr()
        .map(|a| a.port())
        .unwrap_or(parts.proxy_port);
    let dns_port = cfg.egress_dns_port();
    let book = parts.gate.book.clone() as Arc<dyn crate::egress::proxy::Sandboxes>;
    let dns = crate::egress::dns::Dns::new(book.clone(), parts.hosts.clone());
    if let Err(e) = dns.listen((any, dns_port).into()).await {
        return unserved(format!("listening for the DNS: {e}"));
    }
    let server =
        crate::egress::proxy::Proxy::new(book, parts.hosts.clone(), Some(parts.gate.edge.clone()));
    tokio::spawn(server.serve(proxy));
    tracing::info!(%address, proxy_port, dns_port, "kubernetes: egress proxy and DNS serving");
    Some(objects::EgressRoute {
        address,
        proxy_port,
        dns_port,
        ca_pem: parts.gate.edge.ca().pem().to_string(),
    })
}

/// Whether the agent at `url` answers `GET /healthz` (no token) with 200.
async fn healthz(url: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = url.trim_start_matches("http://").to_string();
    let probe = async {
        let mut s = tokio::net::TcpStream::connect(&addr).await.ok()?;
        let req = format!(
            "GET {} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n",
            berth_protocol::routes::native::HEALTHZ
        );
        s.write_all(req.as_bytes()).await.ok()?;
        let mut head = [0u8; 12];
        s.read_exact(&mut head).await.ok()?;
        Some(head.starts_with(b"HTTP/1.") && &head[9..12] == b"200")
    };
    tokio::time::timeout(Duration::from_secs(3), probe)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

#[async_trait::async_trait]
impl Provider for KubernetesProvider {
    fn name(&self) -> &'static str {
        "kubernetes"
    }

    fn default_image(&self, profile: &str) -> Result<String> {
        self.default_image.clone().ok_or_else(|| {
            ProviderError::Unsupported(format!(
                "profile {profile:?} runs on Kubernetes but no image is configured: push one \
                 with `berth image push --registry HOST/PATH` and set image in [kubernetes]"
            ))
        })
    }

    fn check_image(&self, _profile: &str, image_ref: &str) -> Result<()> {
        if image_ref.starts_with("process:") || !berth_protocol::image::valid_reference(image_ref) {
            return Err(ProviderError::Unsupported(format!(
                "{image_ref:?} is not an image a cluster can pull (a registry reference such \
                 as registry.example:5000/berth/desktop:TAG)"
            )));
        }
        Ok(())
    }

    fn unenforced(&self, limits: &berth_protocol::controller::Limits) -> BTreeMap<String, String> {
        objects::unenforced(limits)
    }

    async fn create(&self, spec: &Spec) -> Result<Endpoint> {
        let owner = self.owner(&spec.identity.controller_id).await?;
        let pods: Api<Pod> = self.api();
        let pod = timed(
            "creating the Pod",
            pods.create(
                &PostParams::default(),
                &objects::pod(spec, &self.settings, &owner),
            ),
        )
        .await?;
        let pod_owner = Owner::of("v1", "Pod", &pod.metadata)
            .ok_or_else(|| failed("the Pod", "it came back with no name or uid"))?;
        let policies: Api<NetworkPolicy> = self.api();
        timed(
            "creating the NetworkPolicy",
            policies.create(
                &PostParams::default(),
                &objects::network_policy(spec, &self.settings, &pod_owner),
            ),
        )
        .await?;
        let secrets: Api<Secret> = self.api();
        timed(
            "creating the token Secret",
            secrets.create(
                &PostParams::default(),
                &objects::token_secret(spec, &self.settings, &pod_owner),
            ),
        )
        .await?;
        self.wait_started(spec).await
    }

    async fn inspect(&self, sandbox_id: &str) -> Result<Option<Observed>> {
        let pods: Api<Pod> = self.api();
        match timed(
            "reading the Pod",
            pods.get_opt(&objects::pod_name(sandbox_id)),
        )
        .await?
        {
            Some(pod) => Ok(self
                .observe(&pod)
                .await?
                .filter(|o| o.identity.sandbox_id == sandbox_id)),
            None => Ok(None),
        }
    }

    async fn list(&self, controller_id: &str) -> Result<Vec<Observed>> {
        // Adopted (or made) at start: a controller's first list is its recovery.
        self.owner(controller_id).await?;
        let pods: Api<Pod> = self.api();
        let list = timed(
            "listing Pods",
            pods.list(&ListParams::default().labels(&objects::controller_selector(controller_id))),
        )
        .await?;
        let mut out = Vec::new();
        for pod in &list.items {
            if let Some(o) = self.observe(pod).await?
                && o.identity.controller_id == controller_id
            {
                out.push(o);
            }
        }
        Ok(out)
    }

    fn enforces_egress(&self) -> bool {
        self.settings.egress_route.is_some() && self.gate.is_some()
    }

    async fn destroy(&self, sandbox_id: &str) -> Result<()> {
        self.destroying.mark(sandbox_id);
        self.forwards.lock().await.remove(sandbox_id);
        if let Some(g) = &self.gate {
            g.book.forget(sandbox_id);
            g.edge.forget(sandbox_id);
        }
        let name = objects::pod_name(sandbox_id);
        delete_quietly(&self.api::<Pod>(), "deleting the Pod", &name).await?;
        delete_quietly(
            &self.api::<NetworkPolicy>(),
            "deleting the NetworkPolicy",
            &name,
        )
        .await?;
        delete_quietly(
            &self.api::<Secret>(),
            "deleting the token Secret",
            &objects::secret_name(sandbox_id),
        )
        .await
    }

    fn deaths(&self, controller_id: &str) -> Option<tokio::sync::mpsc::Receiver<Death>> {
        let (tx, rx) = tokio::sync::mpsc::channel(256);
        tokio::spawn(watch::run(
            self.api(),
            controller_id.to_string(),
            self.destroying.clone(),
            tx,
        ));
        Some(rx)
    }
}
