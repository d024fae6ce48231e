//! The `docker` provider: one container per sandbox from a berth image (berth-agent as PID 1),
//! on a private bridge network without traffic between its containers (no sandbox reaches
//! another), addressed by its IP from the host. Containers carry the identity labels from
//! creation on, so a restarted controller finds exactly what it owns. Docker's die/oom events
//! are passed up at once.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::models::{
    ContainerCreateBody, HostConfig, Network, NetworkCreateRequest, PortBinding,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, EventsOptionsBuilder, InspectContainerOptions,
    ListContainersOptionsBuilder, RemoveContainerOptionsBuilder, StartContainerOptions,
};
use futures_util::StreamExt;

use berth_protocol::controller::Limits;

use super::{Death, Endpoint, Identity, Observed, Provider, ProviderError, Result, Spec};
use super::{LABEL_CONTROLLER, LABEL_IMAGE, LABEL_PROFILE, LABEL_SANDBOX};

/// The private network every sandbox container without an egress policy joins: a route out,
/// none to another container (inter-container traffic off), so sandboxes reach the host and
/// the internet but not each other. One for every controller on the host.
pub const NETWORK: &str = "berth";
/// The prefix of a controller's internal network for sandboxes with an egress policy
/// (`berth-egress-<controller id>`): no route out; that controller's egress proxy and DNS, on
/// its gateway address, are their only way out. A network per controller gives each its own
/// gateway, so two controllers on one host each serve their own sandboxes' DNS on port 53.
pub const EGRESS_NETWORK: &str = "berth-egress";
/// Docker's bridge option that lets (`true`, its default) or stops containers of one network
/// talking to each other.
const ICC: &str = "com.docker.network.bridge.enable_icc";
pub use super::LABEL_EGRESS;
const AGENT_PORT: u16 = 5000;
const CDP_PORT: u16 = 9222;
/// The image label naming the ports its apps serve, as JSON: `{"vlc": 8080}`. Each is published
/// on 127.0.0.1 like the compat and CDP ports and listed in the sandbox's endpoints by name.
pub const PORTS_LABEL: &str = "berth.ports";
/// Every Docker API call: a daemon that hangs must not hang the controller.
const CALL: Duration = Duration::from_secs(60);
/// Containers created and started at once. The daemon does a start's work (its network
/// namespace, its firewall rules, a proxy per published port) under locks of its own, so fifty
/// starts at once all finish late and the last past [`CALL`]; in turn, each start is quick and
/// the timeout measures the daemon, not the queue in front of it.
const MAX_CONCURRENT_STARTS: usize = 4;

pub struct DockerProvider {
    docker: Docker,
    default_image: Option<String>,
    /// The private network's id once known (`ensure_network`).
    network: tokio::sync::Mutex<Option<String>>,
    /// This controller's egress network (`berth-egress-<controller id>`).
    egress_network: String,
    /// The OCI runtime each profile's containers run under (`[runtime]`; else the daemon's
    /// default), each checked against the daemon's runtimes at connect.
    runtimes: BTreeMap<String, String>,
    /// The limits the daemon says its kernel can enforce.
    support: Support,
    /// The egress proxy's settings, and its address once it listens.
    egress: Egress,
    /// One permit per create-and-start in flight ([`MAX_CONCURRENT_STARTS`]).
    starts: tokio::sync::Semaphore,
}

/// The egress proxy of the Docker provider: served on the internal network's gateway address,
/// started with the first sandbox that needs it.
pub struct Egress {
    pub book: Arc<crate::egress::Book>,
    /// Credentials added at the edge, and the CA sandboxes behind the proxy trust.
    pub edge: Arc<crate::egress::edge::Edge>,
    pub hosts: crate::egress::proxy::Hosts,
    pub port: u16,
    /// The internal network's id and where the proxy listens, once both exist.
    running: tokio::sync::Mutex<Option<(String, SocketAddr)>>,
    /// Whether the sandboxes' DNS serves (port 53 on the gateway: one controller per host).
    dns: std::sync::atomic::AtomicBool,
}

impl Egress {
    pub fn new(
        book: Arc<crate::egress::Book>,
        edge: Arc<crate::egress::edge::Edge>,
        hosts: crate::egress::proxy::Hosts,
        port: u16,
    ) -> Egress {
        Egress {
            book,
            edge,
            hosts,
            port,
            running: tokio::sync::Mutex::new(None),
            dns: Default::default(),
        }
    }
}

/// What the daemon reports it can limit (`docker info`): a limit it cannot is applied anyway
/// (Docker drops it with a warning) and reported unenforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Support {
    pub memory: bool,
    pub swap: bool,
    pub cpu_quota: bool,
    pub cpu_shares: bool,
    pub pids: bool,
}

impl Support {
    fn of(info: &bollard::models::SystemInfo) -> Support {
        Support {
            memory: info.memory_limit.unwrap_or(false),
            swap: info.swap_limit.unwrap_or(false),
            cpu_quota: info.cpu_cfs_quota.unwrap_or(false),
            cpu_shares: info.cpu_shares.unwrap_or(false),
            pids: info.pids_limit.unwrap_or(false),
        }
    }

    /// The limits set in `limits` this daemon cannot enforce. Swap the kernel does not account
    /// is still none when the host has no swap to give.
    pub fn unenforced(&self, limits: &Limits, host_swap: bool) -> BTreeMap<String, String> {
        let no = |what: &str| format!("the Docker daemon's kernel cannot limit {what}");
        let checks = [
            ("cpus", self.cpu_quota, no("CPU time (no CFS quota)")),
            ("cpu_shares", self.cpu_shares, no("CPU shares")),
            ("memory_mb", self.memory, no("memory")),
            (
                "swap_mb",
                self.swap || !host_swap,
                no("swap (no swap accounting)"),
            ),
            ("pids", self.pids, no("processes (no pids controller)")),
        ];
        let set = limits.names();
        checks
            .into_iter()
            .filter(|(name, able, _)| !able && set.contains(name))
            .map(|(name, _, why)| (name.to_string(), why))
            .collect()
    }
}

/// Whether the machine has swap to give (`/proc/meminfo`'s SwapTotal above 0).
fn host_has_swap() -> bool {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("SwapTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .is_some_and(|kb| kb > 0)
}

fn failed(what: &str, e: impl std::fmt::Display) -> ProviderError {
    ProviderError::Failed(format!("docker {what}: {e}"))
}

fn name(sandbox_id: &str) -> String {
    format!("berth-{sandbox_id}")
}

/// The ports an image (or a container, which carries its image's labels) declares; names that
/// would shadow the fixed endpoints, and values that are not ports, are left out.
fn declared_ports(labels: &HashMap<String, String>) -> BTreeMap<String, u16> {
    let Some(raw) = labels.get(PORTS_LABEL) else {
        return BTreeMap::new();
    };
    let parsed: BTreeMap<String, serde_json::Value> = match serde_json::from_str(raw) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(label = %raw, error = %e, "{PORTS_LABEL} is not a JSON object");
            return BTreeMap::new();
        }
    };
    parsed
        .into_iter()
        .filter(|(name, _)| !matches!(name.as_str(), "compat" | "cdp"))
        .filter_map(|(name, v)| Some((name, u16::try_from(v.as_u64()?).ok()?)))
        .filter(|(_, port)| *port != 0)
        .collect()
}

/// Why a network found by the name berth gives its sandboxes' network must not hold them (one
/// made by hand, or by an older berth): its containers reach each other, or (`internal`: an
/// egress network) it has a route out. None when it is as berth makes it.
fn network_problem(net: &Network, internal: bool) -> Option<String> {
    let name = net.name.as_deref().unwrap_or(NETWORK);
    let icc = net
        .options
        .as_ref()
        .and_then(|o| o.get(ICC))
        .map(String::as_str);
    let fix = format!(
        "remove it (delete its sandboxes, then `docker network rm {name}`) and berth makes it again"
    );
    if internal && net.internal != Some(true) {
        return Some(format!("{name} exists but is not internal: {fix}"));
    }
    if icc != Some("false") {
        return Some(format!(
            "{name} exists with traffic between its containers allowed, so its sandboxes \
             would reach each other: {fix}"
        ));
    }
    None
}

/// Why the `[runtime]` of a profile cannot be used: the daemon does not have it (`known`: its
/// runtimes), with how to register it.
fn runtimes_problem(wanted: &BTreeMap<String, String>, known: &[String]) -> Option<String> {
    let (profile, runtime) = wanted.iter().find(|(_, r)| !known.contains(r))?;
    Some(format!(
        "[runtime] {profile} = {runtime:?}, but the Docker daemon has no runtime of that name \
         (it has {}): register it in /etc/docker/daemon.json (\"runtimes\": {{\"{runtime}\": \
         {{\"path\": \"/usr/bin/{runtime}\"}}}}) and reload the daemon (kill -HUP $(pidof dockerd))",
        known.join(", ")
    ))
}

/// A container's address on the network named `net`.
fn address_on(c: &bollard::models::ContainerInspectResponse, net: &str) -> Option<String> {
    c.network_settings
        .as_ref()?
        .networks
        .as_ref()?
        .get(net)?
        .ip_address
        .clone()
        .filter(|ip| !ip.is_empty())
}

fn identity(labels: &HashMap<String, String>) -> Option<Identity> {
    Some(Identity {
        controller_id: labels.get(LABEL_CONTROLLER)?.clone(),
        sandbox_id: labels.get(LABEL_SANDBOX)?.clone(),
        profile: labels.get(LABEL_PROFILE)?.clone(),
        image_ref: labels.get(LABEL_IMAGE).cloned().unwrap_or_default(),
    })
}

async fn timed<T, E: std::fmt::Display>(
    what: &str,
    f: impl std::future::Future<Output = std::result::Result<T, E>>,
) -> Result<T> {
    tokio::time::timeout(CALL, f)
        .await
        .map_err(|_| failed(what, "timed out"))?
        .map_err(|e| failed(what, e))
}

impl DockerProvider {
    /// Connects to the local daemon (its socket), speaking the daemon's API version. `runtimes`
    /// (profile to OCI runtime) must each be one the daemon has.
    pub async fn connect(
        default_image: Option<String>,
        controller_id: &str,
        runtimes: BTreeMap<String, String>,
        egress: Egress,
    ) -> anyhow::Result<DockerProvider> {
        let docker = Docker::connect_with_socket_defaults()?;
        let docker = tokio::time::timeout(CALL, docker.negotiate_version())
            .await
            .map_err(|_| anyhow::anyhow!("the Docker daemon did not answer"))??;
        let info = tokio::time::timeout(CALL, docker.info())
            .await
            .map_err(|_| anyhow::anyhow!("the Docker daemon did not answer"))??;
        let known: Vec<String> = info
            .runtimes
            .as_ref()
            .map(|r| r.keys().cloned().collect())
            .unwrap_or_default();
        if let Some(problem) = runtimes_problem(&runtimes, &known) {
            anyhow::bail!(problem);
        }
        Ok(DockerProvider {
            docker,
            default_image,
            network: tokio::sync::Mutex::new(None),
            egress_network: format!("{EGRESS_NETWORK}-{controller_id}"),
            runtimes,
            support: Support::of(&info),
            egress,
            starts: tokio::sync::Semaphore::new(MAX_CONCURRENT_STARTS),
        })
    }

    /// A turn to create and start a container: at most [`MAX_CONCURRENT_STARTS`] at once, and
    /// a named failure when the starts ahead do not make room within [`CALL`].
    async fn start_permit(&self) -> Result<tokio::sync::SemaphorePermit<'_>> {
        match tokio::time::timeout(CALL, self.starts.acquire()).await {
            Ok(Ok(permit)) => Ok(permit),
            Ok(Err(e)) => Err(failed("start", e)),
            Err(_) => Err(failed(
                "start",
                format!(
                    "the {MAX_CONCURRENT_STARTS} starts ahead of this one did not finish within {} s",
                    CALL.as_secs()
                ),
            )),
        }
    }

    /// A sandbox behind the proxy: the proxy knows it by its address on the internal network
    /// (again, after a restart of the controller).
    async fn register_egress(
        &self,
        labels: &HashMap<String, String>,
        addr: Option<String>,
        sandbox_id: &str,
    ) -> Result<()> {
        if let (Some(policy), Some(addr)) = (labels.get(LABEL_EGRESS), addr)
            && let (Ok(policy), Ok(addr)) = (serde_json::from_str(policy), addr.parse())
        {
            self.ensure_egress().await?;
            self.egress.book.register(addr, sandbox_id, policy);
        }
        Ok(())
    }

    /// The internal network and its proxy, made once: the network's id and the proxy's
    /// address (its gateway's).
    async fn ensure_egress(&self) -> Result<(String, SocketAddr)> {
        let mut running = self.egress.running.lock().await;
        if let Some(r) = running.as_ref() {
            // A DNS whose port was taken (another controller on this host, or one still
            // stopping) is tried again with each sandbox.
            if !self.egress.dns.load(std::sync::atomic::Ordering::Relaxed) {
                self.serve_dns(r.1.ip()).await;
            }
            return Ok(r.clone());
        }
        let net = self.named_network(&self.egress_network, true).await?;
        if let Some(problem) = network_problem(&net, true) {
            return Err(failed("the egress network", problem));
        }
        let id = net.id.clone().unwrap_or_default();
        let gateway: IpAddr = net
            .ipam
            .as_ref()
            .and_then(|i| i.config.as_ref())
            .and_then(|c| c.iter().find_map(|c| c.gateway.as_deref()?.parse().ok()))
            .ok_or_else(|| failed("the egress network", "it has no gateway address"))?;
        let listener = tokio::net::TcpListener::bind((gateway, self.egress.port))
            .await
            .map_err(|e| failed("the egress proxy's listener", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| failed("the egress proxy's listener", e))?;
        let proxy = crate::egress::proxy::Proxy::new(
            self.egress.book.clone() as Arc<dyn crate::egress::proxy::Sandboxes>,
            self.egress.hosts.clone(),
            Some(self.egress.edge.clone()),
        );
        tokio::spawn(proxy.serve(listener));
        tracing::info!(%addr, network = %self.egress_network, "egress proxy serving");
        self.serve_dns(gateway).await;
        *running = Some((id.clone(), addr));
        Ok((id, addr))
    }

    /// The sandboxes' DNS on the gateway's port 53 (UDP and TCP). Without it (the port is
    /// taken, or the controller may not bind it) names do not resolve inside, which the log
    /// says, and the next sandbox behind the proxy tries again; the proxy still serves.
    async fn serve_dns(&self, gateway: IpAddr) {
        let dns = crate::egress::dns::Dns::new(
            self.egress.book.clone() as Arc<dyn crate::egress::proxy::Sandboxes>,
            self.egress.hosts.clone(),
        );
        let at = SocketAddr::new(gateway, 53);
        match dns.listen(at).await {
            Ok(()) => {
                self.egress
                    .dns
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                tracing::info!(%at, "egress DNS serving");
            }
            Err(e) => tracing::warn!(
                %at, error = %e,
                "egress DNS not served: names will not resolve inside egress sandboxes \
                 (give the controller port 53 there: root or CAP_NET_BIND_SERVICE)"
            ),
        }
    }

    /// The id of the private network, created once (`named_network`).
    async fn ensure_network(&self) -> Result<String> {
        let mut known = self.network.lock().await;
        if let Some(id) = known.as_ref() {
            return Ok(id.clone());
        }
        let net = self.named_network(NETWORK, false).await?;
        if let Some(problem) = network_problem(&net, false) {
            return Err(failed("the sandboxes' network", problem));
        }
        let id = net.id.unwrap_or_default();
        *known = Some(id.clone());
        Ok(id)
    }

    /// The bridge network `name`, created when missing (`internal`: without a route out).
    /// Docker allows two networks of one name, and concurrent first creates (a pool filling
    /// on a fresh engine) made several, after which the name no longer resolved: creates here
    /// are serialised by the caller, and where duplicates exist the one with the smallest id is
    /// used by every controller and the others removed.
    async fn named_network(&self, name: &str, internal: bool) -> Result<Network> {
        if let Some(n) = self.find_network(name).await? {
            return Ok(n);
        }
        let create = NetworkCreateRequest {
            name: name.into(),
            driver: Some("bridge".into()),
            internal: Some(internal),
            labels: Some(HashMap::from([("berth.managed".into(), "true".into())])),
            // No sandbox reaches another, behind the proxy or not.
            options: Some(HashMap::from([(ICC.into(), "false".into())])),
            ..Default::default()
        };
        timed("network create", self.docker.create_network(create)).await?;
        // Another controller may have made one meanwhile: settle on the same one.
        self.find_network(name)
            .await?
            .ok_or_else(|| failed("creating the network", "it is not listed"))
    }

    /// The network named `name` with the smallest id; duplicates are removed (in use ones
    /// stay until their containers go).
    async fn find_network(&self, name: &str) -> Result<Option<Network>> {
        let options = bollard::query_parameters::ListNetworksOptionsBuilder::default()
            .filters(&HashMap::from([("name", vec![name])]))
            .build();
        let list = timed("network list", self.docker.list_networks(Some(options))).await?;
        let mut found: Vec<Network> = list
            .into_iter()
            .filter(|n| n.name.as_deref() == Some(name) && n.id.is_some())
            .collect();
        found.sort_by(|a, b| a.id.cmp(&b.id));
        for extra in found.iter().skip(1).filter_map(|n| n.id.as_deref()) {
            if let Err(e) = self.docker.remove_network(extra).await {
                tracing::debug!(network = %extra, error = %e, "a duplicate network stays for now");
            }
        }
        Ok(found.into_iter().next())
    }

    async fn observe(&self, sandbox_id: &str) -> Result<Option<Observed>> {
        let c = match self
            .docker
            .inspect_container(&name(sandbox_id), None::<InspectContainerOptions>)
            .await
        {
            Ok(c) => c,
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => {
                return Ok(None);
            }
            Err(e) => return Err(failed("inspect", e)),
        };
        let labels = c
            .config
            .as_ref()
            .and_then(|c| c.labels.clone())
            .unwrap_or_default();
        let Some(identity) = identity(&labels) else {
            return Ok(None);
        };
        let alive = c.state.as_ref().and_then(|s| s.running).unwrap_or(false);
        let on = |net: &str| address_on(&c, net);
        let ip = on(NETWORK).or_else(|| on(&self.egress_network));
        if alive {
            self.register_egress(&labels, on(&self.egress_network), &identity.sandbox_id)
                .await?;
        }
        let created_at_ms = c
            .created
            .as_deref()
            .and_then(|t| humantime::parse_rfc3339_weak(t).ok())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        let desktop = c
            .config
            .as_ref()
            .and_then(|c| c.cmd.as_ref())
            .is_some_and(|cmd| cmd.iter().any(|a| a == "--desktop"));
        // The ports published on 127.0.0.1 for harnesses on the host.
        let published = |port: u16| -> Option<String> {
            let bindings = c.network_settings.as_ref()?.ports.as_ref()?;
            let b = bindings.get(&format!("{port}/tcp"))?.as_ref()?.first()?;
            Some(format!(
                "http://{}:{}",
                b.host_ip
                    .clone()
                    .filter(|h| !h.is_empty() && h != "0.0.0.0")
                    .unwrap_or("127.0.0.1".into()),
                b.host_port.clone()?
            ))
        };
        let declared = declared_ports(&labels);
        Ok(Some(Observed {
            identity,
            alive,
            endpoint: ip.filter(|_| alive).map(|ip| Endpoint {
                ports: declared
                    .iter()
                    .map(|(name, &port)| {
                        let url = published(port);
                        (
                            name.clone(),
                            url.unwrap_or_else(|| format!("http://{ip}:{port}")),
                        )
                    })
                    .collect(),
                agent_url: format!("http://{ip}:{AGENT_PORT}"),
                compat_url: published(AGENT_PORT)
                    .unwrap_or_else(|| format!("http://{ip}:{AGENT_PORT}")),
                cdp_url: desktop.then(|| {
                    published(CDP_PORT).unwrap_or_else(|| format!("http://{ip}:{CDP_PORT}"))
                }),
            }),
            created_at_ms,
        }))
    }

    /// The ports a sandbox's container publishes: the agent's, CDP's on a desktop, and those
    /// its image declares.
    async fn container_ports(&self, spec: &Spec) -> Result<Vec<u16>> {
        let mut ports: Vec<u16> = match spec.desktop {
            true => vec![AGENT_PORT, CDP_PORT],
            false => vec![AGENT_PORT],
        };
        // The image's declared ports (its apps' servers, e.g. VLC's HTTP interface).
        let image = timed(
            "inspecting the image",
            self.docker.inspect_image(&spec.identity.image_ref),
        )
        .await?;
        let image_labels = image.config.and_then(|c| c.labels).unwrap_or_default();
        for port in declared_ports(&image_labels).into_values() {
            if !ports.contains(&port) {
                ports.push(port);
            }
        }
        Ok(ports)
    }

    /// Waits until the agent in a just-started container accepts connections (30 s at most);
    /// its endpoint then.
    async fn wait_for_agent(&self, sandbox_id: &str, container: &str) -> Result<Endpoint> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let o = self.observe(sandbox_id).await?;
            match o {
                Some(o) if !o.alive => {
                    return Err(ProviderError::Failed(format!(
                        "container {container} exited at start"
                    )));
                }
                Some(Observed {
                    endpoint: Some(ep), ..
                }) => {
                    let addr = ep.agent_url.trim_start_matches("http://").to_string();
                    if tokio::net::TcpStream::connect(&addr).await.is_ok() {
                        return Ok(ep);
                    }
                }
                _ => {}
            }
            if Instant::now() >= deadline {
                return Err(ProviderError::Failed(format!(
                    "the agent in {container} did not accept connections within 30 s"
                )));
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

/// A sandbox's container: its image running the agent with `cmd`, on `network`, every port in
/// `ports` published on a loopback port Docker picks.
fn container_body(
    spec: &Spec,
    network: String,
    runtime: Option<String>,
    cmd: Vec<String>,
    labels: HashMap<String, String>,
    ports: &[u16],
) -> ContainerCreateBody {
    ContainerCreateBody {
        image: Some(spec.identity.image_ref.clone()),
        cmd: Some(cmd),
        env: Some(vec![format!("BERTH_AGENT_TOKEN={}", spec.agent_token)]),
        labels: Some(labels),
        exposed_ports: Some(ports.iter().map(|p| format!("{p}/tcp")).collect()),
        host_config: Some(HostConfig {
            network_mode: Some(network),
            runtime,
            // Harnesses on the host reach the compat surface and CDP through loopback
            // ports Docker picks; the controller uses the container's IP.
            port_bindings: Some(
                ports
                    .iter()
                    .map(|p| {
                        (
                            format!("{p}/tcp"),
                            Some(vec![PortBinding {
                                host_ip: Some("127.0.0.1".into()),
                                host_port: Some(String::new()),
                            }]),
                        )
                    })
                    .collect(),
            ),
            // Chromium keeps its own sandbox (user namespaces): see `seccomp`.
            security_opt: Some(vec![format!("seccomp={}", super::seccomp::profile())]),
            ..limits(&spec.limits)
        }),
        ..Default::default()
    }
}

/// The host settings of a sandbox's limits. Swap off is memory and swap together at the
/// memory limit; no limit is Docker's default (`/dev/shm`: Docker's 64 MiB, too little for
/// Chromium, so a profile sets one).
fn limits(l: &Limits) -> HostConfig {
    let mib = |m: u64| (m << 20) as i64;
    HostConfig {
        nano_cpus: l.cpus.map(|c| (c * 1e9) as i64),
        cpu_shares: l.cpu_shares.map(|s| s as i64),
        memory: l.memory_mb.map(mib),
        memory_swap: l.memory_mb.map(|m| mib(m + l.swap_mb.unwrap_or(0))),
        pids_limit: l.pids.map(|p| p as i64),
        shm_size: l.shm_mb.map(mib),
        ..Default::default()
    }
}

#[async_trait::async_trait]
impl Provider for DockerProvider {
    fn name(&self) -> &'static str {
        "docker"
    }

    fn default_image(&self, profile: &str) -> Result<String> {
        self.default_image.clone().ok_or_else(|| {
            ProviderError::Unsupported(format!(
                "profile {profile:?} runs on Docker but no image is configured: build one with \
                 `berth image build --profile desktop` and set docker_image in the config"
            ))
        })
    }

    fn check_image(&self, _profile: &str, image_ref: &str) -> Result<()> {
        if image_ref.starts_with("berth-") {
            return Ok(());
        }
        Err(ProviderError::Unsupported(format!(
            "{image_ref} is not a berth image (berth image build names them berth-<name>:<hash>)"
        )))
    }

    async fn create(&self, spec: &Spec) -> Result<Endpoint> {
        let mut labels: HashMap<String, String> = spec.identity.labels().into_iter().collect();
        labels.insert("berth.managed".into(), "true".into());
        let behind_proxy = spec.egress != berth_protocol::egress::Egress::default();
        let (network, proxy) = match behind_proxy {
            false => (self.ensure_network().await?, None),
            true => {
                let (net, proxy) = self.ensure_egress().await?;
                let policy = serde_json::to_string(&spec.egress)
                    .map_err(|e| failed("the egress policy", e))?;
                labels.insert(LABEL_EGRESS.into(), policy);
                (net, Some(proxy))
            }
        };
        let mut cmd = vec!["--listen".to_string(), format!("0.0.0.0:{AGENT_PORT}")];
        if spec.desktop {
            cmd.extend([
                "--cdp-listen".into(),
                format!("0.0.0.0:{CDP_PORT}"),
                "--desktop".into(),
            ]);
        }
        cmd.extend(spec.agent_args());
        let ports = self.container_ports(spec).await?;
        let runtime = self.runtimes.get(&spec.identity.profile).cloned();
        let mut body = container_body(spec, network, runtime, cmd, labels, &ports);
        if let (Some(proxy), Some(env)) = (proxy, body.env.as_mut()) {
            env.extend(crate::egress::proxy_env(&proxy.to_string()));
            env.extend(crate::egress::trust_env(self.egress.edge.ca().pem()));
            // Docker's own resolver asks the egress DNS (on the gateway, beside the proxy),
            // and no search domain of the host's turns a name into another.
            if let Some(h) = body.host_config.as_mut() {
                h.dns = Some(vec![proxy.ip().to_string()]);
                h.dns_search = Some(vec![".".into()]);
            }
        }
        let container = name(&spec.identity.sandbox_id);
        let options = CreateContainerOptionsBuilder::default()
            .name(&container)
            .build();
        let permit = self.start_permit().await?;
        timed("create", self.docker.create_container(Some(options), body)).await?;
        timed(
            "start",
            self.docker
                .start_container(&container, None::<StartContainerOptions>),
        )
        .await?;
        drop(permit);
        // Answer once the agent accepts connections.
        self.wait_for_agent(&spec.identity.sandbox_id, &container)
            .await
    }

    async fn inspect(&self, sandbox_id: &str) -> Result<Option<Observed>> {
        self.observe(sandbox_id).await
    }

    async fn list(&self, controller_id: &str) -> Result<Vec<Observed>> {
        let filters = HashMap::from([(
            "label".to_string(),
            vec![format!("{LABEL_CONTROLLER}={controller_id}")],
        )]);
        let options = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        let list = timed("list", self.docker.list_containers(Some(options))).await?;
        let mut out = Vec::new();
        for c in list {
            let labels = c.labels.unwrap_or_default();
            if let Some(id) = labels.get(LABEL_SANDBOX)
                && let Some(o) = self.observe(id).await?
            {
                out.push(o);
            }
        }
        Ok(out)
    }

    async fn destroy(&self, sandbox_id: &str) -> Result<()> {
        self.egress.book.forget(sandbox_id);
        self.egress.edge.forget(sandbox_id);
        let options = RemoveContainerOptionsBuilder::default()
            .force(true)
            .v(true)
            .build();
        match tokio::time::timeout(
            CALL,
            self.docker
                .remove_container(&name(sandbox_id), Some(options)),
        )
        .await
        {
            Err(_) => Err(failed("remove", "timed out")),
            Ok(Ok(())) => Ok(()),
            Ok(Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            })) => Ok(()),
            // Already being removed by a concurrent destroy.
            Ok(Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 409, ..
            })) => Ok(()),
            Ok(Err(e)) => Err(failed("remove", e)),
        }
    }

    fn unenforced(&self, limits: &Limits) -> BTreeMap<String, String> {
        self.support.unenforced(limits, host_has_swap())
    }

    fn enforces_egress(&self) -> bool {
        true
    }

    fn deaths(&self, controller_id: &str) -> Option<tokio::sync::mpsc::Receiver<Death>> {
        let (tx, rx) = tokio::sync::mpsc::channel(256);
        let docker = self.docker.clone();
        let filters = HashMap::from([
            ("type".to_string(), vec!["container".to_string()]),
            (
                "event".to_string(),
                vec!["die".to_string(), "oom".to_string()],
            ),
            (
                "label".to_string(),
                vec![format!("{LABEL_CONTROLLER}={controller_id}")],
            ),
        ]);
        tokio::spawn(async move {
            loop {
                let options = EventsOptionsBuilder::default().filters(&filters).build();
                let mut events = docker.events(Some(options));
                while let Some(Ok(e)) = events.next().await {
                    let attrs = e.actor.and_then(|a| a.attributes).unwrap_or_default();
                    let Some(id) = attrs.get(LABEL_SANDBOX) else {
                        continue;
                    };
                    let reason = match e.action.as_deref() {
                        Some("oom") => berth_protocol::controller::oom_killed_reason(None),
                        _ => format!(
                            "its container died (exit code {})",
                            attrs.get("exitCode").map(String::as_str).unwrap_or("?")
                        ),
                    };
                    if tx
                        .send(Death {
                            sandbox_id: id.clone(),
                            reason,
                        })
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                // The stream ended (daemon restart): listen again.
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        Some(rx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_networks_without_inter_container_traffic_hold_sandboxes_and_egress_ones_are_internal() {
        let net = |name: &str, internal: Option<bool>, icc: Option<&str>| Network {
            name: Some(name.into()),
            internal,
            options: icc.map(|v| HashMap::from([(ICC.into(), v.into())])),
            ..Default::default()
        };
        let egress = "berth-egress-ctl_1";
        assert_eq!(
            network_problem(&net(egress, Some(true), Some("false")), true),
            None
        );
        assert_eq!(
            network_problem(&net(NETWORK, Some(false), Some("false")), false),
            None
        );
        let open = network_problem(&net(egress, Some(false), Some("false")), true).unwrap();
        assert!(
            open.contains("is not internal")
                && open.contains("docker network rm berth-egress-ctl_1"),
            "{open}"
        );
        assert!(network_problem(&net(egress, None, Some("false")), true).is_some());
        for icc in [None, Some("true")] {
            for (name, internal) in [(egress, true), (NETWORK, false)] {
                let p = network_problem(&net(name, Some(internal), icc), internal).unwrap();
                assert!(
                    p.contains("traffic between its containers")
                        && p.contains(&format!("docker network rm {name}")),
                    "{p}"
                );
            }
        }
    }

    #[test]
    fn a_runtime_the_daemon_lacks_is_named_with_how_to_register_it() {
        let known = ["runc".to_string(), "runsc".to_string()];
        let wanted = |r: &str| BTreeMap::from([("desktop".to_string(), r.to_string())]);
        assert_eq!(runtimes_problem(&wanted("runsc"), &known), None);
        assert_eq!(runtimes_problem(&BTreeMap::new(), &known), None);
        let p = runtimes_problem(&wanted("kata"), &known).unwrap();
        assert!(
            p.contains("desktop = \"kata\"")
                && p.contains("runc, runsc")
                && p.contains("daemon.json"),
            "{p}"
        );
    }

    #[test]
    fn a_limit_the_daemon_cannot_set_is_named_and_swap_counts_only_where_there_is_swap() {
        let l = Limits {
            cpus: Some(1.0),
            memory_mb: Some(100),
            swap_mb: Some(0),
            pids: Some(10),
            ..Default::default()
        };
        let all = Support {
            memory: true,
            swap: true,
            cpu_quota: true,
            cpu_shares: true,
            pids: true,
        };
        assert!(all.unenforced(&l, true).is_empty());
        let weak = Support {
            swap: false,
            pids: false,
            ..all
        };
        let names = |s: &Support, host_swap| {
            s.unenforced(&l, host_swap)
                .into_keys()
                .collect::<Vec<String>>()
        };
        assert_eq!(names(&weak, true), ["pids", "swap_mb"]);
        // No swap on the host: nothing to limit, so swap off holds.
        assert_eq!(names(&weak, false), ["pids"]);
        // cpu_shares is not set, so its support does not matter.
        let no_shares = Support {
            cpu_shares: false,
            ..all
        };
        assert!(no_shares.unenforced(&l, true).is_empty());
    }
}
