//! The `berth` command line: `serve`, `demo`, and clients for sandboxes and leases.

mod cp;
mod events;
mod forward;
mod shell;
mod through;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use berth_protocol::controller::{
    AcquireLease, Command, ControllerClient, CreateSandbox, RunRequest, Sandbox,
};
use berth_protocol::routes::controller::DEFAULT_URL;
use clap::{Args, Parser, Subcommand};

use crate::config::Config;
use crate::lifecycle::SandboxStatus;
use crate::serve;

#[derive(Parser, Debug)]
#[command(
    name = "berth",
    version,
    about = "berth controller: isolated Linux workstations for computer-use agents"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Top,
}

#[derive(Subcommand, Debug)]
pub enum Top {
    /// Run the controller service.
    Serve(ServeArgs),
    /// Run the controller in-process on embedded defaults, create a desktop sandbox, save a
    /// screenshot and print a one-time viewer URL; stays up until Ctrl-C.
    Demo(DemoArgs),
    /// Sandboxes on a running controller.
    #[command(subcommand)]
    Sandbox(SandboxCmd),
    /// Leases on a running controller.
    #[command(subcommand)]
    Lease(LeaseCmd),
    /// Sandbox images: build (content-addressed, cached), push to a registry, and lock.
    #[command(subcommand)]
    Image(ImageCmd),
    /// Check a live deployment against what a harness needs of it.
    #[command(subcommand)]
    Verify(crate::verify::VerifyCmd),
}

#[derive(Args, Debug, Clone)]
pub struct ImageArgs {
    /// The profile whose image to build (`desktop`, `ide`, …).
    #[arg(long, default_value = "desktop")]
    pub profile: String,
    /// A catalog bundle of apps to add.
    #[arg(long)]
    pub bundle: Option<String>,
    /// A catalog app to add, repeatable.
    #[arg(long = "app")]
    pub apps: Vec<String>,
    /// The berth-agent binary put in the image (default: the one beside `berth`).
    #[arg(long, env = "BERTH_AGENT_BIN")]
    pub agent_bin: Option<PathBuf>,
    /// The recipes and lock files (default: the repository's images/).
    #[arg(long, env = "BERTH_IMAGES_DIR")]
    pub images_dir: Option<PathBuf>,
    /// Where intermediate root file systems are kept between builds.
    #[arg(
        long,
        env = "BERTH_IMAGE_CACHE",
        default_value = "/var/cache/berth/images"
    )]
    pub cache_dir: PathBuf,
}

#[derive(Subcommand, Debug)]
pub enum ImageCmd {
    /// Build the image (or find it: same inputs, same image_ref) and print its name.
    Build {
        #[command(flatten)]
        args: ImageArgs,
        /// Print only {"image_ref", "size_bytes", "built", "seconds"} on stdout.
        #[arg(long)]
        json: bool,
        /// Build nothing: print {"image_ref", "exists"}, the name this build would have (the
        /// lock files fix it before building).
        #[arg(long, conflicts_with = "json")]
        plan: bool,
        /// Build the controller's own image instead (`berth-controller:…`: the base rootfs
        /// with `berth` and `berth-agent`, running `berth serve`; deploy/kubernetes runs it).
        #[arg(long, conflicts_with_all = ["plan", "profile", "bundle", "apps"])]
        controller: bool,
        /// Once the image is imported, remove its packages stage from the cache (gigabytes; a
        /// later build of other inputs starts again from the base stage, which stays).
        #[arg(long, conflicts_with_all = ["plan", "controller"])]
        drop_stage: bool,
        /// Bring your own image: put the agent (with its libraries) into IMAGE, an image in the
        /// local engine, as PID 1 (`berth-byo-<name>:<hash>`; its sandboxes run exec, files,
        /// terminals and ports).
        #[arg(long, value_name = "IMAGE", conflicts_with_all = ["plan", "controller", "profile", "bundle", "apps", "drop_stage", "dockerfile"])]
        from: Option<String>,
        /// Bring your own image: build DIR's Dockerfile first, then put the agent into it as
        /// --from does.
        #[arg(long, value_name = "DIR", conflicts_with_all = ["plan", "controller", "profile", "bundle", "apps", "drop_stage"])]
        dockerfile: Option<PathBuf>,
    },
    /// Push a built image to a registry a cluster pulls from; prints the pushed reference and
    /// its digest (`HOST/PATH/<name>@sha256:…`, what `[kubernetes] image` should name).
    #[command(after_help = "\
The image is tagged HOST[:PORT]/PATH/<name>:<tag> (its name and tag as `berth image build` \
printed them) and pushed by the local Docker daemon, which speaks HTTPS to a registry, and plain \
HTTP to 127.0.0.0/8 and to its insecure-registries. Credentials: --username with the password on \
stdin (--password-stdin), else the registry's `auths` entry in $DOCKER_CONFIG/config.json or \
~/.docker/config.json (auth, username/password or identitytoken), else none; credential helpers \
(credsStore, credHelpers) are not run. Progress is shown on a terminal only.")]
    Push {
        /// The local image: an image_ref `berth image build` printed (`berth-desktop:…`).
        image_ref: String,
        /// Where to push: HOST[:PORT]/PATH (registry.example.com/berth, 127.0.0.1:5000/berth).
        #[arg(long)]
        registry: String,
        /// The registry user; the password is read from stdin (--password-stdin).
        #[arg(long, requires = "password_stdin")]
        username: Option<String>,
        /// Read the registry password from stdin (with --username).
        #[arg(long, requires = "username")]
        password_stdin: bool,
        /// Print only {"image_ref", "pushed", "digest", "digest_ref", "image_id", "seconds"}.
        #[arg(long)]
        json: bool,
    },
    /// Resolve the packages afresh and rewrite images/<profile>.lock.
    Lock {
        #[command(flatten)]
        args: ImageArgs,
        /// Print {"lock": path} instead of the path.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// The address the API listens on.
    #[arg(long, env = "BERTH_LISTEN", default_value = "127.0.0.1:8780")]
    pub listen: SocketAddr,
    /// Where the SQLite store, the secret key and the process provider's sandboxes live.
    #[arg(long, env = "BERTH_DATA_DIR", default_value = "/var/lib/berth")]
    pub data_dir: PathBuf,
    /// TOML configuration (API keys, pools, timeouts).
    #[arg(long, env = "BERTH_CONFIG")]
    pub config: Option<PathBuf>,
    /// The berth-agent binary the process provider runs (default: the one beside `berth`).
    #[arg(long, env = "BERTH_AGENT_BIN")]
    pub agent_bin: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// The address the demo controller listens on.
    #[arg(long, default_value = "127.0.0.1:8780")]
    pub listen: SocketAddr,
    /// Where the demo controller keeps its store and sandboxes.
    #[arg(long, default_value = "berth-demo-data")]
    pub data_dir: PathBuf,
    /// The berth-agent binary the process provider runs (default: the one beside `berth`).
    #[arg(long, env = "BERTH_AGENT_BIN")]
    pub agent_bin: Option<PathBuf>,
    /// Where the screenshot goes.
    #[arg(long, default_value = "berth-demo.png")]
    pub screenshot: PathBuf,
    /// Delete the sandbox and exit after showing it works (instead of waiting for Ctrl-C).
    #[arg(long)]
    pub once: bool,
}

/// Which controller to talk to, and how to print.
#[derive(Args, Debug, Clone)]
pub struct Remote {
    /// The controller's URL. Default: $BERTH_URL, else $SANDBOX_GATEWAY_URL, else
    /// http://localhost:8780 (where `berth serve` listens by default).
    #[arg(long, global = true)]
    pub url: Option<String>,
    /// The controller's API key, sent as X-Api-Key. Default: $BERTH_API_KEY, else
    /// $SANDBOX_API_KEY.
    #[arg(long, global = true)]
    pub api_key: Option<String>,
    /// Machine-readable output: JSON on stdout (one object per line for streams).
    #[arg(long, global = true)]
    pub json: bool,
}

fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The URL and key from flags and the environment: the BERTH_ names first, then the seed's
/// SANDBOX_GATEWAY_URL / SANDBOX_API_KEY.
fn resolve(
    url: Option<String>,
    key: Option<String>,
    env: impl Fn(&str) -> Option<String>,
) -> (String, Option<String>) {
    let url = url
        .or_else(|| env("BERTH_URL"))
        .or_else(|| env("SANDBOX_GATEWAY_URL"))
        .unwrap_or_else(|| DEFAULT_URL.into());
    let key = key
        .or_else(|| env("BERTH_API_KEY"))
        .or_else(|| env("SANDBOX_API_KEY"));
    (url, key)
}

impl Remote {
    pub fn url(&self) -> String {
        resolve(self.url.clone(), self.api_key.clone(), env_var).0
    }

    pub fn key(&self) -> Option<String> {
        resolve(self.url.clone(), self.api_key.clone(), env_var).1
    }
}

#[derive(Subcommand, Debug)]
pub enum SandboxCmd {
    /// Create a sandbox, wait until it is ready and print it.
    Create {
        /// The catalog profile: desktop-ubuntu, ide-ubuntu, … (`desktop` and `ide` are
        /// aliases; `GET /sandbox/v1/catalog` lists them).
        #[arg(long, default_value = "desktop-ubuntu")]
        profile: String,
        /// A specific image instead of the profile's default.
        #[arg(long)]
        image_ref: Option<String>,
        /// A label `key=value` to attach; repeatable.
        #[arg(long = "label", value_parser = parse_label)]
        labels: Vec<(String, String)>,
        /// Delete the sandbox after this many seconds.
        #[arg(long)]
        ttl: Option<u64>,
        /// The desktop's screen, `WIDTHxHEIGHT` (e.g. 1280x800).
        #[arg(long)]
        screen: Option<String>,
        /// Where its programs may connect: `open`, `none`, or a policy as JSON
        /// (`{"allow": ["github.com"], "deny_private": true}`).
        #[arg(long, value_parser = parse_egress)]
        egress: Option<berth_protocol::egress::Egress>,
        /// A credential the egress proxy adds to the sandbox's requests to HOST:
        /// `HOST=VAR` (`Authorization: Bearer` the secret in environment variable VAR, read
        /// here, never on the command line) or `HOST:HEADER=VAR`; repeatable.
        #[arg(long = "credential", value_parser = parse_credential)]
        credentials: Vec<berth_protocol::controller::SandboxCredential>,
        /// A `[[login]]` site of the controller's config its run may sign its browser in to
        /// (the `login` tool); repeatable.
        #[arg(long = "login")]
        logins: Vec<String>,
        #[command(flatten)]
        remote: Remote,
    },
    /// Print one sandbox: status, viewer, endpoints, labels.
    Get {
        /// The sandbox's id.
        id: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// List sandboxes, one a line (id, profile, status, created).
    List {
        /// Only sandboxes with this label `key=value`; repeatable (all must match).
        #[arg(long = "label", value_parser = parse_label)]
        labels: Vec<(String, String)>,
        #[command(flatten)]
        remote: Remote,
    },
    /// Delete a sandbox (its processes, files and container).
    Rm {
        /// The sandbox's id.
        id: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Run a command (argv after `--`) and print its output; exits with its exit code.
    Exec {
        /// The sandbox's id.
        id: String,
        /// Kill the command after this many milliseconds.
        #[arg(long)]
        timeout_ms: Option<u64>,
        /// A client-chosen run id: repeating the call with it returns the same run.
        #[arg(long)]
        run_id: Option<String>,
        /// The program and its arguments, after `--`.
        #[arg(required = true, last = true)]
        command: Vec<String>,
        #[command(flatten)]
        remote: Remote,
    },
    /// An interactive terminal in the sandbox, like `docker exec -it`: exits with the
    /// program's exit code.
    #[command(after_help = "\
The local terminal is put in raw mode (restored on every exit) and its size followed; Ctrl-C, \
Ctrl-Z and Ctrl-D go to the program in the sandbox. With stdin not a terminal (piped), its bytes \
are typed into the sandbox's terminal and its end sends Ctrl-D. SIGTERM or SIGHUP to `berth` \
closes the sandbox's terminal and exits 128+signal.")]
    Shell(shell::ShellArgs),
    /// Copy files or directories between this machine and a sandbox (`ID:PATH` names the
    /// sandbox side), streamed.
    Cp(cp::CpArgs),
    /// Print a sandbox's timeline (the controller's and the agent's events); `--follow` keeps
    /// printing new ones.
    Events(events::EventsArgs),
    /// Forward a local port to a port inside the sandbox (HTTP and WebSocket, through the
    /// controller's preview route).
    PortForward(forward::ForwardArgs),
    /// Save a screenshot of the sandbox's display as PNG.
    Screenshot {
        /// The sandbox's id.
        id: String,
        /// The PNG file to write.
        #[arg(short, long, default_value = "screenshot.png")]
        output: PathBuf,
        #[command(flatten)]
        remote: Remote,
    },
    /// Save the sandbox's episode: the bundle (zip: recording, actions, screenshots,
    /// timeline), or with `--format atif` its ATIF trajectory as `trajectory.json` with the
    /// screenshots it names beside it in `screenshots/`.
    Episode {
        /// The sandbox's id.
        id: String,
        /// `bundle` (a zip) or `atif` (a directory).
        #[arg(long, default_value = "bundle", value_parser = ["bundle", "atif"])]
        format: String,
        /// The zip to write (bundle), or the directory (atif). Default: `episode-<id>.zip`, or
        /// `episode-<id>/`.
        #[arg(short, long)]
        output: Option<PathBuf>,
        #[command(flatten)]
        remote: Remote,
    },
    /// A one-time viewer URL for a browser.
    Viewer {
        /// The sandbox's id.
        id: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// A one-time URL for the sandbox's session view (desktop, terminal, files, timeline,
    /// artifacts, episode) in a browser; `--json` prints `{"url", "expires_at"}`.
    Open {
        /// The sandbox's id.
        id: String,
        #[command(flatten)]
        remote: Remote,
    },
}

#[derive(Subcommand, Debug)]
pub enum LeaseCmd {
    /// Lease a sandbox for a thread: the one it holds, else a warm one, else a new one.
    Acquire {
        /// The thread (conversation, episode) the lease is for.
        #[arg(long)]
        thread: String,
        /// The catalog profile of the sandbox (desktop-ubuntu, ide-ubuntu, …).
        #[arg(long, default_value = "desktop-ubuntu")]
        profile: String,
        /// A label `key=value` the sandbox must have; repeatable.
        #[arg(long = "label", value_parser = parse_label)]
        labels: Vec<(String, String)>,
        /// The lease's time to live in seconds.
        #[arg(long)]
        ttl: Option<u64>,
        #[command(flatten)]
        remote: Remote,
    },
    /// Extend a lease.
    Renew {
        /// The lease's id.
        lease_id: String,
        /// The new time to live in seconds, from now.
        #[arg(long)]
        ttl: u64,
        #[command(flatten)]
        remote: Remote,
    },
    /// Give a lease up (its sandbox is deleted or returned to its pool).
    Release {
        /// The lease's id.
        lease_id: String,
        #[command(flatten)]
        remote: Remote,
    },
}

/// `--egress`: `open`, `none`, or a policy as JSON.
fn parse_egress(s: &str) -> Result<berth_protocol::egress::Egress, String> {
    let t = s.trim();
    let json = match t.starts_with('{') || t.starts_with('"') {
        true => t.to_string(),
        false => format!("{t:?}"),
    };
    let e: berth_protocol::egress::Egress = serde_json::from_str(&json).map_err(|e| {
        format!("give open, none, or {{\"allow\": [\"host\", ...], \"deny_private\": true}}: {e}")
    })?;
    berth_protocol::egress::validate(&e)?;
    Ok(e)
}

/// `--credential HOST[:HEADER]=VAR`: the secret from this process's environment.
fn parse_credential(s: &str) -> Result<berth_protocol::controller::SandboxCredential, String> {
    parse_credential_with(s, |v| std::env::var(v).ok())
}

fn parse_credential_with(
    s: &str,
    env: impl Fn(&str) -> Option<String>,
) -> Result<berth_protocol::controller::SandboxCredential, String> {
    let (target, var) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: give HOST=VAR or HOST:HEADER=VAR"))?;
    let (host, header) = match target.split_once(':') {
        Some((h, header)) => (h, Some(header.to_string())),
        None => (target, None),
    };
    let secret = env(var)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| format!("--credential {s}: the environment variable {var} is not set"))?;
    Ok(berth_protocol::controller::SandboxCredential {
        host: host.to_string(),
        header,
        value: None,
        basic_user: None,
        secret,
    })
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s:?}: use key=value"))
}

pub async fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Top::Serve(a) => serve_forever(a).await,
        Top::Demo(a) => demo(a).await,
        Top::Sandbox(c) => sandbox(c).await,
        Top::Lease(c) => lease(c).await,
        Top::Image(c) => image(c).await,
        Top::Verify(c) => crate::verify::run(c).await,
    }
}

async fn serve_forever(a: ServeArgs) -> anyhow::Result<i32> {
    let config = match &a.config {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    let running = serve::start(serve::Options {
        listen: a.listen,
        data_dir: a.data_dir,
        config,
        agent_bin: a.agent_bin,
        env_keys: std::env::var("BERTH_API_KEYS").ok(),
    })
    .await?;
    if let Some(k) = &running.generated_key {
        println!("No API key was configured; generated one (shown only this once, stored hashed):");
        println!("  X-Api-Key: {k}");
    }
    println!("controller id {}", running.controller.ctx.controller_id);
    println!("berth serving on http://{}", running.addr);
    shutdown_signal().await;
    Ok(0)
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

async fn demo(a: DemoArgs) -> anyhow::Result<i32> {
    let key = format!("demo_{}", crate::util::random_hex(16));
    let running = serve::start(serve::Options {
        listen: a.listen,
        data_dir: a.data_dir.clone(),
        config: Config::default(),
        agent_bin: a.agent_bin,
        env_keys: Some(key.clone()),
    })
    .await?;
    let base = format!("http://{}", running.addr);
    println!(
        "berth controller on {base} (process provider, SQLite in {})",
        a.data_dir.display()
    );
    let client = ControllerClient::new(&base, Some(key.clone()));
    let started = Instant::now();
    let created = client
        .create_nowait(&CreateSandbox {
            profile: "desktop-ubuntu".into(),
            labels: BTreeMap::from([("purpose".into(), "demo".into())]),
            ..Default::default()
        })
        .await?;
    println!(
        "sandbox {} created; waiting for strict readiness…",
        created.id
    );
    let sb = wait_running(&client, &created.id, true).await?;
    println!(
        "  running after {:.1} s (X server, VNC, window manager, panel, Chromium and both CDP relays checked)",
        started.elapsed().as_secs_f64()
    );
    demo_screenshot(&client, &sb, &a.screenshot).await?;
    demo_exec(&client, &sb).await?;
    print_demo_access(&client, &sb, &key, &base).await?;
    if !a.once {
        println!("\nCtrl-C deletes the sandbox and stops.");
        shutdown_signal().await;
    }
    client.delete(&sb.id).await?;
    println!("sandbox {} deleted", sb.id);
    Ok(0)
}

/// The demo's screenshot of the sandbox's desktop, saved to `path`.
async fn demo_screenshot(
    client: &ControllerClient,
    sb: &Sandbox,
    path: &std::path::Path,
) -> anyhow::Result<()> {
    // Once the screen has been still for half a second: Chromium's first paint lands after
    // its DevTools endpoint answers.
    let shot = client
        .request(
            reqwest::Method::GET,
            &format!(
                "/sandbox/sandboxes/v1/{}/screenshot?settle_ms=500&timeout_ms=5000",
                sb.id
            ),
        )
        .send()
        .await?;
    let png = berth_protocol::client::check(shot)
        .await?
        .bytes()
        .await?
        .to_vec();
    std::fs::write(path, &png).with_context(|| format!("writing {}", path.display()))?;
    println!("  screenshot: {} ({} bytes)", path.display(), png.len());
    Ok(())
}

/// The demo's command in the sandbox: who and where it runs.
async fn demo_exec(client: &ControllerClient, sb: &Sandbox) -> anyhow::Result<()> {
    let run = client
        .exec(
            &sb.id,
            &RunRequest {
                command: Command::Line(
                    "echo \"hello from $(hostname) as $(id -un)\"; uname -sr".into(),
                ),
                ..Default::default()
            },
        )
        .await?;
    println!(
        "  exec: exit {} — {}",
        run.exit_code.unwrap_or(-1),
        run.stdout.trim().replace('\n', " | ")
    );
    Ok(())
}

/// How to reach the demo's sandbox: a one-time viewer link, CDP, the compat API and the
/// controller's API with the demo's key.
async fn print_demo_access(
    client: &ControllerClient,
    sb: &Sandbox,
    key: &str,
    base: &str,
) -> anyhow::Result<()> {
    let viewer = client.viewer(&sb.id).await?;
    println!(
        "\nWatch the desktop (one-time link, sets a viewer cookie):\n  {}",
        viewer.url
    );
    if let Some(cdp) = &sb.endpoints.cdp {
        println!("Chromium over CDP (Playwright connect_over_cdp): {cdp}");
    }
    if let Some(compat) = &sb.endpoints.compat {
        println!("OSWorld-compatible API: {compat}/screenshot, {compat}/execute, …");
    }
    println!(
        "API: curl -H 'X-Api-Key: {key}' {base}/sandbox/sandboxes/v1/{}",
        sb.id
    );
    Ok(())
}

/// Polls a sandbox until it runs, printing status changes; an error when it fails.
async fn wait_running(
    client: &ControllerClient,
    id: &str,
    progress: bool,
) -> anyhow::Result<Sandbox> {
    let mut last = None;
    let started = Instant::now();
    loop {
        let sb = client.get(id).await?;
        if progress && Some(sb.status) != last {
            eprintln!(
                "  [{:>5.1} s] {}",
                started.elapsed().as_secs_f64(),
                sb.status
            );
            last = Some(sb.status);
        }
        match sb.status {
            SandboxStatus::Running => return Ok(sb),
            SandboxStatus::Pending | SandboxStatus::Starting => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            other => anyhow::bail!("sandbox {id} is {other}: {}", sb.error.unwrap_or_default()),
        }
    }
}

fn client(r: &Remote) -> ControllerClient {
    ControllerClient::new(r.url(), r.key())
}

fn show_sandbox(sb: &Sandbox, json: bool) {
    if json {
        println!("{}", serde_json::to_string_pretty(sb).unwrap_or_default());
        return;
    }
    println!("{}  {}  {}", sb.id, sb.profile, sb.status);
    if let Some(e) = &sb.error {
        println!("  error: {e}");
    }
    if let Some(u) = &sb.viewer.url {
        println!(
            "  viewer: {u} (needs auth: `berth sandbox viewer {}` for a one-time link)",
            sb.id
        );
    }
    if let Some(c) = &sb.endpoints.compat {
        println!("  compat: {c}");
    }
    if let Some(c) = &sb.endpoints.cdp {
        println!("  cdp:    {c}");
    }
    if !sb.labels.is_empty() {
        let l: Vec<String> = sb.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!("  labels: {}", l.join(" "));
    }
    println!("  image:  {}", sb.image_ref);
}

async fn sandbox(c: SandboxCmd) -> anyhow::Result<i32> {
    match c {
        SandboxCmd::Create {
            profile,
            image_ref,
            labels,
            ttl,
            screen,
            egress,
            credentials,
            logins,
            remote,
        } => {
            let request = CreateSandbox {
                profile,
                image_ref,
                labels: labels.into_iter().collect(),
                ttl_seconds: ttl,
                screen,
                egress,
                credentials,
                human_control: None,
                logins,
                limits: None,
            };
            create_sandbox(&request, &remote).await?;
        }
        SandboxCmd::Get { id, remote } => {
            show_sandbox(&client(&remote).get(&id).await?, remote.json)
        }
        SandboxCmd::List { labels, remote } => list_sandboxes(&labels, &remote).await?,
        SandboxCmd::Rm { id, remote } => {
            let answer = client(&remote).delete(&id).await?;
            match remote.json {
                true => println!("{}", serde_json::to_string_pretty(&answer)?),
                false => println!("deleted {id}"),
            }
        }
        SandboxCmd::Shell(a) => return shell::run(a).await,
        SandboxCmd::Cp(a) => return cp::run(a).await,
        SandboxCmd::Events(a) => return events::run(a).await,
        SandboxCmd::PortForward(a) => return forward::run(a).await,
        SandboxCmd::Exec {
            id,
            timeout_ms,
            run_id,
            command,
            remote,
        } => {
            let request = RunRequest {
                command: Command::Argv(command),
                timeout_ms,
                run_id,
                ..Default::default()
            };
            return exec_command(&id, &request, &remote).await;
        }
        SandboxCmd::Episode {
            id,
            format,
            output,
            remote,
        } => save_episode(&id, format == "atif", output, &remote).await?,
        SandboxCmd::Screenshot { id, output, remote } => {
            save_screenshot(&id, &output, &remote).await?
        }
        SandboxCmd::Viewer { id, remote } => {
            let v = client(&remote).viewer(&id).await?;
            print_link(&v, &v.url, remote.json)?;
        }
        SandboxCmd::Open { id, remote } => {
            let v = client(&remote).session(&id).await?;
            print_link(&v, &v.url, remote.json)?;
        }
    }
    Ok(0)
}

/// A one-time link's answer: as JSON, or its URL alone.
fn print_link(answer: &impl serde::Serialize, url: &str, json: bool) -> anyhow::Result<()> {
    match json {
        true => println!("{}", serde_json::to_string(answer)?),
        false => println!("{url}"),
    }
    Ok(())
}

/// `berth sandbox create`: creates the sandbox, waits until it runs and prints it.
async fn create_sandbox(request: &CreateSandbox, remote: &Remote) -> anyhow::Result<()> {
    let cl = client(remote);
    let sb = cl.create_nowait(request).await?;
    if !remote.json {
        eprintln!("sandbox {} created; waiting until ready", sb.id);
    }
    let sb = wait_running(&cl, &sb.id, !remote.json).await?;
    show_sandbox(&sb, remote.json);
    Ok(())
}

/// `berth sandbox list`: the sandboxes with all of `labels`, one a line.
async fn list_sandboxes(labels: &[(String, String)], remote: &Remote) -> anyhow::Result<()> {
    let list = client(remote).list(labels).await?;
    if remote.json {
        println!("{}", serde_json::to_string_pretty(&list)?);
    } else {
        for sb in &list.sandboxes {
            println!(
                "{}  {:<8} {:<9} {}",
                sb.id, sb.profile, sb.status, sb.created_at
            );
        }
    }
    Ok(())
}

/// `berth sandbox exec`: runs the command and prints its output; the exit status is the
/// command's (1 for one that ended without a code, 0 for one still running).
async fn exec_command(id: &str, request: &RunRequest, remote: &Remote) -> anyhow::Result<i32> {
    let run = client(remote).exec(id, request).await?;
    if remote.json {
        println!("{}", serde_json::to_string_pretty(&run)?);
    } else {
        print!("{}", run.stdout);
        eprint!("{}", run.stderr);
        if !run.done() {
            eprintln!(
                "run {} still running; `GET …/runs/{}` reads it later",
                run.id, run.id
            );
        }
        if let Some(e) = &run.error {
            eprintln!("run {}: {e}", run.status);
        }
    }
    Ok(run.exit_code.unwrap_or(if run.done() { 1 } else { 0 }))
}

/// `berth sandbox screenshot`: the sandbox's display saved as PNG to `output`.
/// `berth sandbox episode`: the bundle as a zip, or its ATIF trajectory with the screenshots
/// it names (from the bundle) beside it.
async fn save_episode(
    id: &str,
    atif: bool,
    output: Option<PathBuf>,
    remote: &Remote,
) -> anyhow::Result<()> {
    let c = client(remote);
    let (path, summary) = if atif {
        let dir = output.unwrap_or_else(|| PathBuf::from(format!("episode-{id}")));
        let trajectory = c.episode_atif(id).await?;
        let zip = c.episode_bundle(id).await?;
        let shots = write_atif(&dir, &trajectory, &zip)
            .with_context(|| format!("writing {}", dir.display()))?;
        let steps = trajectory["steps"].as_array().map_or(0, Vec::len);
        (
            dir,
            serde_json::json!({"steps": steps, "screenshots": shots}),
        )
    } else {
        let file = output.unwrap_or_else(|| PathBuf::from(format!("episode-{id}.zip")));
        let zip = c.episode_bundle(id).await?;
        std::fs::write(&file, &zip).with_context(|| format!("writing {}", file.display()))?;
        (file, serde_json::json!({"bytes": zip.len()}))
    };
    match remote.json {
        true => {
            let mut v = summary;
            v["path"] = path.display().to_string().into();
            println!("{v}");
        }
        false => println!("{} ({summary})", path.display()),
    }
    Ok(())
}

/// `dir/trajectory.json` and the bundle's `screenshots/`; answers how many screenshots.
fn write_atif(dir: &Path, trajectory: &serde_json::Value, zip: &[u8]) -> anyhow::Result<usize> {
    std::fs::create_dir_all(dir.join("screenshots"))?;
    std::fs::write(
        dir.join(crate::atif::FILE),
        serde_json::to_vec_pretty(trajectory)?,
    )?;
    let mut z = zip::ZipArchive::new(std::io::Cursor::new(zip))?;
    let mut n = 0;
    for i in 0..z.len() {
        let mut f = z.by_index(i)?;
        let Some(name) = f
            .enclosed_name()
            .filter(|p| p.starts_with("screenshots") && f.is_file())
        else {
            continue;
        };
        let mut out = std::fs::File::create(dir.join(name))?;
        std::io::copy(&mut f, &mut out)?;
        n += 1;
    }
    Ok(n)
}

async fn save_screenshot(
    id: &str,
    output: &std::path::Path,
    remote: &Remote,
) -> anyhow::Result<()> {
    let png = client(remote).screenshot(id).await?;
    std::fs::write(output, &png).with_context(|| format!("writing {}", output.display()))?;
    match remote.json {
        true => println!(
            "{}",
            serde_json::json!({"path": output.display().to_string(), "bytes": png.len()})
        ),
        false => println!("{} ({} bytes)", output.display(), png.len()),
    }
    Ok(())
}

async fn lease(c: LeaseCmd) -> anyhow::Result<i32> {
    match c {
        LeaseCmd::Acquire {
            thread,
            profile,
            labels,
            ttl,
            remote,
        } => {
            let l = client(&remote)
                .acquire(&AcquireLease {
                    thread_id: thread,
                    profile,
                    image_ref: None,
                    labels: labels.into_iter().collect(),
                    ttl_seconds: ttl,
                    screen: None,
                    egress: None,
                    human_control: None,
                    logins: Vec::new(),
                })
                .await?;
            match remote.json {
                true => println!("{}", serde_json::to_string_pretty(&l)?),
                false => {
                    println!(
                        "lease {} ({}) until {}",
                        l.lease_id,
                        l.how.clone().unwrap_or_default(),
                        l.expires_at.clone().unwrap_or_default()
                    );
                    show_sandbox(&l.sandbox, false);
                }
            }
        }
        LeaseCmd::Renew {
            lease_id,
            ttl,
            remote,
        } => {
            let l = client(&remote).renew(&lease_id, ttl).await?;
            match remote.json {
                true => println!("{}", serde_json::to_string_pretty(&l)?),
                false => println!(
                    "lease {} until {}",
                    l.lease_id,
                    l.expires_at.unwrap_or_default()
                ),
            }
        }
        LeaseCmd::Release { lease_id, remote } => {
            let answer = client(&remote).release(&lease_id).await?;
            match remote.json {
                true => println!("{}", serde_json::to_string_pretty(&answer)?),
                false => println!("released {lease_id}"),
            }
        }
    }
    Ok(0)
}

async fn image(c: ImageCmd) -> anyhow::Result<i32> {
    match c {
        ImageCmd::Build {
            args,
            json,
            from,
            dockerfile,
            ..
        } if from.is_some() || dockerfile.is_some() => {
            bring_image(args, json, from, dockerfile).await?
        }
        ImageCmd::Build {
            args, plan: true, ..
        } => {
            let req = build_request(args)?;
            let (image_ref, exists) = crate::image::plan(&req)?;
            println!(
                "{}",
                serde_json::json!({"image_ref": image_ref, "exists": exists})
            );
        }
        ImageCmd::Build {
            args,
            json,
            controller: true,
            ..
        } => {
            let req = controller_build(args)?;
            let built =
                tokio::task::spawn_blocking(move || crate::image::build_controller(&req)).await??;
            print_built(&built, json)?;
        }
        ImageCmd::Build {
            args,
            json,
            drop_stage,
            ..
        } => {
            let req = build_request(args)?;
            let built =
                tokio::task::spawn_blocking(move || crate::image::build_keeping(&req, !drop_stage))
                    .await??;
            print_built(&built, json)?;
        }
        ImageCmd::Push {
            image_ref,
            registry,
            username,
            password_stdin,
            json,
        } => {
            let registry: crate::image::push::Registry = registry.parse()?;
            let auth = push_auth(username, password_stdin)?;
            let p = crate::image::push::push(&image_ref, &registry, &auth).await?;
            match json {
                true => println!("{}", serde_json::to_string(&p)?),
                false => {
                    println!("pushed {} in {:.1} s", p.pushed, p.seconds);
                    println!("digest {}", p.digest_ref);
                }
            }
        }
        ImageCmd::Lock { args, json } => {
            let req = build_request(args)?;
            let path = tokio::task::spawn_blocking(move || crate::image::relock(&req)).await??;
            match json {
                true => println!(
                    "{}",
                    serde_json::json!({"lock": path.display().to_string()})
                ),
                false => println!("{}", path.display()),
            }
        }
    }
    Ok(0)
}

/// `berth image build --from IMAGE | --dockerfile DIR`: the agent put into the user's image.
async fn bring_image(
    args: ImageArgs,
    json: bool,
    from: Option<String>,
    dockerfile: Option<PathBuf>,
) -> anyhow::Result<()> {
    let source = match (from, dockerfile) {
        (Some(image), _) => crate::image::byo::Source::Image(image),
        (None, Some(dir)) => crate::image::byo::Source::Dockerfile(dir),
        (None, None) => anyhow::bail!("give --from IMAGE or --dockerfile DIR"),
    };
    let req = crate::image::byo::ByoRequest {
        source,
        agent_bin: serve::agent_bin(args.agent_bin, &Config::default())?,
    };
    let built = tokio::task::spawn_blocking(move || crate::image::byo::build(&req)).await??;
    print_built(&built, json)
}

/// What `berth image build` (and `plan`, `lock`) builds, from its flags.
fn build_request(a: ImageArgs) -> anyhow::Result<crate::image::BuildRequest> {
    Ok(crate::image::BuildRequest {
        profile: a.profile,
        bundle: a.bundle,
        apps: a.apps,
        agent_bin: serve::agent_bin(a.agent_bin, &Config::default())?,
        images_dir: a
            .images_dir
            .unwrap_or_else(crate::image::default_images_dir),
        cache_dir: a.cache_dir,
    })
}

/// What `berth image build --controller` builds: this `berth` and its agent.
fn controller_build(args: ImageArgs) -> anyhow::Result<crate::image::ControllerBuild> {
    Ok(crate::image::ControllerBuild {
        berth_bin: std::env::current_exe().context("locating the berth binary")?,
        agent_bin: serve::agent_bin(args.agent_bin, &Config::default())?,
        images_dir: args
            .images_dir
            .unwrap_or_else(crate::image::default_images_dir),
        cache_dir: args.cache_dir,
    })
}

/// A build's result: JSON, or a line naming the image, its size and whether it was built.
fn print_built(built: &crate::image::Built, json: bool) -> anyhow::Result<()> {
    match json {
        true => println!("{}", serde_json::to_string(built)?),
        false => println!(
            "{} ({:.0} MB, {} in {:.1} s)",
            built.image_ref,
            built.size_bytes as f64 / 1e6,
            if built.built {
                "built"
            } else {
                "already built"
            },
            built.seconds
        ),
    }
    Ok(())
}

/// The registry credentials of `berth image push`: `--username` with the password read from
/// stdin, else the Docker CLI's config.
fn push_auth(
    username: Option<String>,
    password_stdin: bool,
) -> anyhow::Result<crate::image::push::Auth> {
    Ok(match (username, password_stdin) {
        (Some(username), true) => {
            let mut password = String::new();
            std::io::stdin()
                .read_line(&mut password)
                .context("reading the password from stdin")?;
            let password = password.trim_end_matches(['\r', '\n']).to_string();
            if password.is_empty() {
                anyhow::bail!("--password-stdin: stdin held no password");
            }
            crate::image::push::Auth::Given { username, password }
        }
        _ => crate::image::push::Auth::DockerConfig,
    })
}

#[cfg(test)]
mod tests {
    use super::{parse_credential_with, parse_egress, resolve};

    #[test]
    fn credential_flags_name_the_variable_holding_the_secret() {
        let env = |v: &str| (v == "TOKEN").then(|| "s3cret".to_string());
        let c = parse_credential_with("api.test=TOKEN", env).unwrap();
        assert_eq!(
            (c.host.as_str(), c.header, c.secret.as_str()),
            ("api.test", None, "s3cret")
        );
        let c = parse_credential_with("*.corp.test:X-Key=TOKEN", env).unwrap();
        assert_eq!(c.header.as_deref(), Some("X-Key"));
        assert!(
            parse_credential_with("api.test", env)
                .unwrap_err()
                .contains("HOST=VAR")
        );
        let e = parse_credential_with("api.test=NOPE", env).unwrap_err();
        assert!(
            e.contains("NOPE is not set") && !e.contains("s3cret"),
            "{e}"
        );
    }

    #[test]
    fn egress_flags_take_a_mode_or_a_policy() {
        use berth_protocol::egress::{Egress, EgressMode};
        assert_eq!(parse_egress("none"), Ok(Egress::Mode(EgressMode::None)));
        assert_eq!(parse_egress(" open "), Ok(Egress::Mode(EgressMode::Open)));
        let p = parse_egress(r#"{"allow": ["github.com"]}"#).unwrap();
        assert!(matches!(p, Egress::Rules(r) if r.deny_private && r.allow == ["github.com"]));
        assert!(
            parse_egress("closed")
                .unwrap_err()
                .contains("give open, none")
        );
        assert!(
            parse_egress(r#"{"allow": ["a b"]}"#)
                .unwrap_err()
                .contains("allow entry")
        );
    }

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |n| {
            vars.iter()
                .find(|(k, _)| *k == n)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn berth_names_come_first_then_the_seeds() {
        let r = |url: Option<&str>, vars: &[(&str, &str)]| {
            resolve(url.map(Into::into), None, env(vars))
        };
        assert_eq!(r(None, &[]), ("http://localhost:8780".into(), None));
        assert_eq!(
            r(None, &[("SANDBOX_API_KEY", "k")]),
            ("http://localhost:8780".into(), Some("k".into()))
        );
        assert_eq!(
            r(
                None,
                &[
                    ("SANDBOX_GATEWAY_URL", "http://g:1"),
                    ("BERTH_API_KEY", "b")
                ]
            ),
            ("http://g:1".into(), Some("b".into()))
        );
        assert_eq!(
            r(None, &[("BERTH_API_KEY", "b"), ("SANDBOX_API_KEY", "s")]),
            ("http://localhost:8780".into(), Some("b".into()))
        );
        assert_eq!(
            r(
                Some("http://flag:2"),
                &[
                    ("BERTH_URL", "http://b:3"),
                    ("SANDBOX_GATEWAY_URL", "http://g:1")
                ]
            ),
            ("http://flag:2".into(), None)
        );
        assert_eq!(
            r(
                None,
                &[
                    ("BERTH_URL", "http://b:3"),
                    ("SANDBOX_GATEWAY_URL", "http://g:1")
                ]
            )
            .0,
            "http://b:3"
        );
    }
}
