//! Starting the controller: data dir, keys, store, providers, reconciliation, loops, listener.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;

use crate::api::{self, ApiState};
use crate::config::Config;
use crate::controller::Controller;
use crate::provider::Provider;
use crate::provider::process::ProcessProvider;
use crate::store::Store;

const KEY_HASH_FILE: &str = "api-key.sha256";

pub struct Options {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    pub config: Config,
    pub agent_bin: Option<PathBuf>,
    /// `BERTH_API_KEYS`, comma-separated.
    pub env_keys: Option<String>,
}

pub struct Running {
    pub addr: SocketAddr,
    pub controller: Arc<Controller>,
    /// A key generated because none was configured: shown once, stored only hashed.
    pub generated_key: Option<String>,
    pub server: tokio::task::JoinHandle<()>,
}

/// The agent binary: the flag, the config, else the `berth-agent` beside this `berth`.
pub fn agent_bin(flag: Option<PathBuf>, config: &Config) -> anyhow::Result<PathBuf> {
    if let Some(p) = flag.or_else(|| config.agent_bin.clone()) {
        return Ok(p);
    }
    let me = std::env::current_exe().context("locating the berth binary")?;
    let beside = me.with_file_name("berth-agent");
    if !beside.exists() {
        anyhow::bail!(
            "no berth-agent beside {} — build it with `cargo build -p berth-agent` in the same \
             profile as berth, or pass --agent-bin / BERTH_AGENT_BIN",
            me.display()
        );
    }
    Ok(beside)
}

fn key_hashes(opts: &Options, data_dir: &Path) -> anyhow::Result<(Vec<[u8; 32]>, Option<String>)> {
    let mut keys: Vec<String> = opts.config.api_keys.clone();
    if let Some(env) = &opts.env_keys {
        keys.extend(
            env.split(',')
                .map(str::trim)
                .filter(|k| !k.is_empty())
                .map(String::from),
        );
    }
    if !keys.is_empty() {
        return Ok((keys.iter().map(|k| api::hash(k)).collect(), None));
    }
    let file = data_dir.join(KEY_HASH_FILE);
    if let Ok(text) = std::fs::read_to_string(&file) {
        let hashes: Vec<[u8; 32]> = text
            .lines()
            .filter_map(|l| {
                let l = l.trim();
                (l.len() == 64)
                    .then(|| {
                        (0..32)
                            .map(|i| u8::from_str_radix(&l[2 * i..2 * i + 2], 16))
                            .collect::<Result<Vec<u8>, _>>()
                            .ok()
                    })
                    .flatten()
                    .and_then(|v| v.try_into().ok())
            })
            .collect();
        anyhow::ensure!(!hashes.is_empty(), "{} holds no key hash", file.display());
        return Ok((hashes, None));
    }
    let key = format!("bk_{}", crate::util::random_hex(24));
    let hash = api::hash(&key);
    write_private(&file, format!("{}\n", crate::util::hex(&hash)).as_bytes())?;
    Ok((vec![hash], Some(key)))
}

fn write_private(path: &Path, data: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(data)?;
    Ok(())
}

pub async fn start(opts: Options) -> anyhow::Result<Running> {
    opts.config.validate()?;
    let data_dir = opts.data_dir.clone();
    std::fs::create_dir_all(&data_dir)
        .with_context(|| format!("creating {}", data_dir.display()))?;
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&data_dir, std::fs::Permissions::from_mode(0o700));
    }
    let (hashes, generated_key) = key_hashes(&opts, &data_dir)?;
    let key_file = opts
        .config
        .secret_key_file
        .clone()
        .unwrap_or_else(|| data_dir.join("secret.key"));
    let sealer = crate::seal::Sealer::load_or_create(&key_file)?;
    let store = Store::open(&data_dir.join("berth.db"), sealer).context("opening the store")?;
    let bin = agent_bin(opts.agent_bin.clone(), &opts.config)?;
    let (book, notes) = crate::egress::Book::new();
    let name = store.meta_init("controller_id", &crate::util::new_id("ctl"))?;
    let edge = crate::egress::edge_from_config(&opts.config.egress, &data_dir, &name)?;
    let providers = connect_providers(&opts.config, &data_dir, &bin, &book, &edge, &name).await?;
    let listener = tokio::net::TcpListener::bind(opts.listen)
        .await
        .with_context(|| format!("binding {}", opts.listen))?;
    let addr = listener.local_addr()?;
    let public_url = opts
        .config
        .public_url
        .clone()
        .unwrap_or_else(|| default_public_url(addr));
    let controller = Controller::new(opts.config.clone(), store, data_dir, public_url, providers)?;
    let _ = controller.images.settings.set(image_settings(bin));
    tokio::spawn(record_egress_notes(controller.ctx.clone(), notes));
    let _ = controller.ctx.edge.set(edge.clone());
    crate::sandbox::regrant_credentials(&controller.ctx);
    if let Some(g) = &opts.config.egress.github {
        let github = crate::github::Github::new(g, &opts.config.egress, edge.clone())
            .context("[egress.github]")?;
        regrant(&controller, &github);
        let _ = controller.github.set(Arc::new(github));
    }
    start_background(&controller).await?;
    let app = api::router(ApiState {
        c: controller.clone(),
        key_hashes: Arc::new(hashes),
    });
    let server = tokio::spawn(berth_protocol::serve::serve(
        listener,
        app,
        opts.config.http_limits(),
    ));
    tracing::info!(listen = %addr, controller_id = %controller.ctx.controller_id, "berth controller serving");
    let unfenced = unfenced_process_profiles(&controller.ctx);
    if !addr.ip().is_loopback() && !unfenced.is_empty() {
        tracing::warn!(
            listen = %addr,
            profiles = %unfenced.join(", "),
            "process sandboxes are not fenced: they share this host's kernel, user and network, \
             and any of them (or any local user) reaches another's agent on 127.0.0.1; a listener \
             others can reach hands them out to other people: route these profiles to docker or \
             kubernetes ([providers]) or listen on loopback"
        );
    }
    let ksm = std::fs::read_to_string("/sys/kernel/mm/ksm/run")
        .map_or("absent".into(), |r| r.trim().to_string());
    tracing::info!(
        host_ksm_run = %ksm,
        memory_merge = controller.ctx.config.memory_merge,
        "memory merging: sandboxes ask for it when memory_merge is on; the host merges when KSM's run is 1"
    );
    Ok(Running {
        addr,
        controller,
        generated_key,
        server,
    })
}

/// The providers by name: `process` always, `docker` and `kubernetes` when the config routes
/// profiles to them (connected now: a daemon or cluster that does not answer stops the start).
async fn connect_providers(
    config: &Config,
    data_dir: &Path,
    bin: &Path,
    book: &Arc<crate::egress::Book>,
    edge: &Arc<crate::egress::edge::Edge>,
    controller_id: &str,
) -> anyhow::Result<BTreeMap<String, Arc<dyn Provider>>> {
    let process: Arc<dyn Provider> = Arc::new(ProcessProvider::new(
        data_dir.join("sandboxes"),
        bin.to_path_buf(),
    )?);
    let mut providers = BTreeMap::from([("process".to_string(), process)]);
    let wants_docker =
        config.docker_image.is_some() || config.providers.values().any(|p| p == "docker");
    if wants_docker {
        let egress = crate::provider::docker::Egress::new(
            book.clone(),
            edge.clone(),
            config.egress.hosts.clone(),
            config.egress.proxy_port,
        );
        let docker = crate::provider::docker::DockerProvider::connect(
            config.docker_image.clone(),
            controller_id,
            Config::by_profile_name(&config.runtime),
            egress,
        )
        .await
        .context("connecting to Docker (the config routes profiles to it)")?;
        providers.insert("docker".to_string(), Arc::new(docker) as Arc<dyn Provider>);
    }
    let wants_kubernetes =
        config.kubernetes.is_some() || config.providers.values().any(|p| p == "kubernetes");
    if wants_kubernetes {
        let parts = crate::provider::kubernetes::EgressParts {
            gate: crate::provider::kubernetes::Gate {
                book: book.clone(),
                edge: edge.clone(),
            },
            hosts: config.egress.hosts.clone(),
            proxy_port: config.egress.proxy_port,
        };
        let kube = crate::provider::kubernetes::KubernetesProvider::connect(
            &config.kubernetes.clone().unwrap_or_default(),
            parts,
        )
        .await
        .context("connecting to Kubernetes (the config routes profiles to it)")?;
        providers.insert(
            "kubernetes".to_string(),
            Arc::new(kube) as Arc<dyn Provider>,
        );
    }
    Ok(providers)
}

/// The enabled profiles the process provider serves (which cannot fence one sandbox from
/// another).
fn unfenced_process_profiles(ctx: &crate::ctx::Ctx) -> Vec<String> {
    ctx.catalog
        .profiles
        .iter()
        .filter(|p| p.enabled && ctx.provider_name_for(p) == "process")
        .map(|p| p.name.clone())
        .collect()
}

/// The URL the controller is reached at when the config names none: where it listens, with
/// 127.0.0.1 for an unspecified address.
fn default_public_url(addr: SocketAddr) -> String {
    let host = match addr.ip().is_unspecified() {
        true => "127.0.0.1".to_string(),
        false => addr.ip().to_string(),
    };
    format!("http://{host}:{}", addr.port())
}

/// Where the controller's image jobs find the agent, the recipes and their stage cache
/// (`BERTH_IMAGE_CACHE`, else /var/cache/berth/images).
fn image_settings(agent_bin: PathBuf) -> crate::image_job::ImageSettings {
    crate::image_job::ImageSettings {
        agent_bin,
        images_dir: crate::image::default_images_dir(),
        cache_dir: std::env::var_os("BERTH_IMAGE_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/var/cache/berth/images")),
    }
}

/// The repositories granted before a restart, granted again (the grants live in memory; the
/// sandboxes' records keep them).
fn regrant(controller: &Controller, github: &crate::github::Github) {
    let rows = controller.ctx.store.sandboxes(&[]).unwrap_or_default();
    for row in rows.into_iter().filter(|r| r.status.live()) {
        for full in row.egress.iter().flat_map(|e| e.repositories.iter()) {
            if let Ok((owner, name)) = crate::github::parse_repository(full) {
                github.grant(&row.id, owner, name);
            }
        }
    }
}

/// Writes what the proxy and the DNS saw: each refusal an `egress.denied` event on the
/// sandbox's timeline, each connection and refusal counted in its record.
async fn record_egress_notes(
    ctx: Arc<crate::ctx::Ctx>,
    mut notes: tokio::sync::mpsc::Receiver<crate::egress::Note>,
) {
    while let Some(n) = notes.recv().await {
        let counted = match &n {
            crate::egress::Note::Denied {
                sandbox,
                host,
                port,
                reason,
                via,
            } => {
                ctx.event(
                    sandbox,
                    berth_protocol::events::EventKind::EgressDenied,
                    serde_json::json!({
                        "host": host, "port": port, "reason": reason, "via": via.as_str()
                    }),
                );
                ctx.store.count_egress(sandbox, None, true)
            }
            crate::egress::Note::Connected { sandbox, host } => {
                ctx.store.count_egress(sandbox, Some(host), false)
            }
        };
        if let Err(e) = counted {
            tracing::warn!(error = %e, "egress: a count was not stored");
        }
    }
}
/// Recovers the store's state, then starts the pools, the reconciler's loops and the control
/// leases' sweep.
async fn start_background(controller: &Arc<Controller>) -> anyhow::Result<()> {
    controller.reconciler.recover().await?;
    controller.pools.start_pools()?;
    controller.reconciler.start_loops();
    controller.controls.spawn();
    Ok(())
}
