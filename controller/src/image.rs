//! The image builder: `images/recipes.toml` → a Debian rootfs (debootstrap, then the profile's
//! packages, cached per stage so a failed build resumes) → berth-agent baked in as PID 1
//! (`berth-agent init`) → `docker import`. The result is named by a content hash of the recipe
//! selection, its lock file and the agent binary, so the name is known before building and the
//! same inputs always give the same `image_ref`.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use crate::catalog::{Catalog, DesktopEntry, Download};
use crate::util::sha256_hex;

pub mod byo;
pub mod push;

const BUILTIN_RECIPES: &str = include_str!("../../images/recipes.toml");

/// Files the builder puts into a desktop image: (path in the image, contents, mode).
const GUEST_FILES: &[(&str, &str, u32)] = &[
    // Chromium presented as Google Chrome (window titles, a `chrome` process); run once.
    (
        "tmp/berth-brand-chrome.py",
        include_str!("../../images/brand-chrome.py"),
        0o644,
    ),
    // No "unsupported command-line flag" bar where the browser must run unsandboxed.
    (
        "etc/chromium/policies/managed/berth.json",
        include_str!("../../images/chromium-policy.json"),
        0o644,
    ),
    // XFCE's X settings: GTK's animations off (a screenshot never catches one halfway).
    (
        "etc/xdg/xfce4/xfconf/xfce-perchannel-xml/xsettings.xml",
        include_str!("../../images/xfce/xsettings.xml"),
        0o644,
    ),
    // XFCE's panel: its default layout without the plugins the image lacks and the action
    // buttons (less to start: the panel is the longest step of a cold start).
    (
        "etc/xdg/xfce4/xfconf/xfce-perchannel-xml/xfce4-panel.xml",
        include_str!("../../images/xfce/xfce4-panel.xml"),
        0o644,
    ),
    // LibreOffice (the workpieces' editors) opens documents without its first-run dialogs.
    (
        "etc/libreoffice/registry/berth.xcd",
        include_str!("../../images/libreoffice/berth.xcd"),
        0o644,
    ),
    // There is no systemd to answer `timedatectl`.
    (
        "usr/local/bin/timedatectl",
        include_str!("../../images/timedatectl"),
        0o755,
    ),
];

/// The GNOME session's files (`images/gnome/`): (path in the image, contents, mode). Those under
/// `tmp/berth-gnome/` are the setup script and what it installs, removed after it runs.
const GNOME_FILES: &[(&str, &str, u32)] = &[
    (
        "usr/share/gnome-shell/modes/ubuntu.json",
        include_str!("../../images/gnome/ubuntu.json"),
        0o644,
    ),
    (
        "usr/share/glib-2.0/schemas/90_berth-ubuntu.gschema.override",
        include_str!("../../images/gnome/90_berth-ubuntu.gschema.override"),
        0o644,
    ),
    (
        "usr/share/gnome-shell/extensions/berth-windows@berth/metadata.json",
        include_str!("../../images/gnome/berth-windows/metadata.json"),
        0o644,
    ),
    (
        "usr/share/gnome-shell/extensions/berth-windows@berth/extension.js",
        include_str!("../../images/gnome/berth-windows/extension.js"),
        0o644,
    ),
    (
        "etc/polkit-1/rules.d/49-berth.rules",
        include_str!("../../images/gnome/49-berth.rules"),
        0o644,
    ),
    (
        "etc/dconf/profile/user",
        include_str!("../../images/gnome/dconf-profile-user"),
        0o644,
    ),
    (
        "etc/dconf/db/local.d/00-berth",
        include_str!("../../images/gnome/dconf-berth"),
        0o644,
    ),
    (
        "etc/thunderbird/pref/berth.js",
        include_str!("../../images/gnome/thunderbird-berth.js"),
        0o644,
    ),
    (
        "etc/xdg/mimeapps.list",
        include_str!("../../images/gnome/mimeapps.list"),
        0o644,
    ),
    (
        "usr/share/applications/google-chrome.desktop",
        include_str!("../../images/gnome/google-chrome.desktop"),
        0o644,
    ),
    (
        "etc/pulse/default.pa.d/berth.pa",
        include_str!("../../images/gnome/berth.pa"),
        0o644,
    ),
    (
        EXPECTED_DESKTOP,
        include_str!("../../images/gnome/desktop-expected.json"),
        0o644,
    ),
    (
        "tmp/berth-gnome/setup.sh",
        include_str!("../../images/gnome/setup.sh"),
        0o755,
    ),
    (
        "tmp/berth-gnome/registrymodifications.xcu",
        include_str!("../../images/gnome/registrymodifications.xcu"),
        0o644,
    ),
    (
        "tmp/berth-gnome/Bookmarks",
        include_str!("../../images/gnome/Bookmarks"),
        0o644,
    ),
];

/// Where an image states its expected desktop state (the agent's `/v1/desktop/state` compares
/// the live session with it).
const EXPECTED_DESKTOP: &str = "usr/share/berth/desktop-expected.json";

/// A session's files, by its recipe name.
fn session_files(session: &str) -> &'static [(&'static str, &'static str, u32)] {
    match session {
        "gnome" => GNOME_FILES,
        _ => &[],
    }
}

/// The digest of files baked into an image (what changes it, changes the `image_ref`).
fn files_digest(files: &[(&str, &str, u32)]) -> String {
    sha256_hex(
        files
            .iter()
            .map(|(path, text, mode)| format!("{path}\n{mode:o}\n{text}\n"))
            .collect::<String>()
            .as_bytes(),
    )
}

/// Writes `files` into the root file system.
fn write_files(rootfs: &Path, files: &[(&str, &str, u32)]) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for (path, text, mode) in files {
        let dest = rootfs.join(path);
        if let Some(dir) = dest.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&dest, text)?;
        std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(*mode))?;
    }
    Ok(())
}

/// How the builder lays an image out: part of every `image_ref`, raised when that changes (a
/// label's encoding, say), so an image built the old way is never taken for a new one.
const LAYOUT: u32 = 3;

/// The Docker label naming the ports an image's apps serve (`{"vlc": 8080}`).
pub const PORTS_LABEL: &str = "berth.ports";
/// The Docker label naming the desktop session an image runs (`xfce`, `gnome`, `none`).
pub const SESSION_LABEL: &str = "berth.session";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recipes {
    pub suite: String,
    pub mirror: String,
    pub base_packages: Vec<String>,
    pub profiles: std::collections::BTreeMap<String, ProfileRecipe>,
    /// Desktop sessions a bundle may pick instead of the profile's XFCE.
    #[serde(default)]
    pub sessions: std::collections::BTreeMap<String, SessionRecipe>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionRecipe {
    pub description: String,
    pub packages: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileRecipe {
    pub description: String,
    pub desktop: bool,
    pub packages: Vec<String>,
    #[serde(default)]
    pub pip: Vec<String>,
}

/// What to build.
#[derive(Debug, Clone)]
pub struct BuildRequest {
    pub profile: String,
    pub bundle: Option<String>,
    pub apps: Vec<String>,
    pub agent_bin: PathBuf,
    /// Holds `recipes.toml` and the lock files.
    pub images_dir: PathBuf,
    /// Intermediate root file systems, reused across builds.
    pub cache_dir: PathBuf,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Built {
    pub image_ref: String,
    pub size_bytes: u64,
    pub built: bool,
    pub seconds: f64,
}

impl Built {
    /// The image as the engine has it now: its size, whether this call built it, how long
    /// the call took.
    pub fn of(image_ref: String, built: bool, started: Instant) -> Built {
        Built {
            size_bytes: docker_size(&image_ref),
            image_ref,
            built,
            seconds: started.elapsed().as_secs_f64(),
        }
    }
}

/// The resolved selection: every input of the image but the agent.
#[derive(Debug, Clone, Serialize)]
struct Selection {
    name: String,
    suite: String,
    mirror: String,
    base_packages: Vec<String>,
    packages: Vec<String>,
    pip: Vec<String>,
    desktop: bool,
    /// The apps' servers, by name (the image's `berth.ports` label).
    ports: std::collections::BTreeMap<String, u16>,
    /// The sandbox user's password and sudo (from the bundle).
    user_password: Option<String>,
    sudo: bool,
    /// A digest of the guest files baked in (`GUEST_FILES`).
    guest_files: String,
    /// The desktop session the image runs, when not the profile's XFCE, and a digest of its
    /// files.
    session: Option<String>,
    session_files: String,
    /// Releases downloaded into the image, with the launchers written for them.
    downloads: Vec<(Download, Option<DesktopEntry>)>,
    layout: u32,
}

/// The default images dir: the repository's when this binary was built from one.
pub fn default_images_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("BERTH_IMAGES_DIR") {
        return PathBuf::from(d);
    }
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../images"))
}

fn load_recipes(images_dir: &Path) -> anyhow::Result<Recipes> {
    let text = std::fs::read_to_string(images_dir.join("recipes.toml"))
        .unwrap_or_else(|_| BUILTIN_RECIPES.to_string());
    toml::from_str(&text).context("images/recipes.toml")
}

fn select(req: &BuildRequest, recipes: &Recipes) -> anyhow::Result<Selection> {
    let catalog = Catalog::builtin();
    let req = &BuildRequest {
        profile: recipe_name(&catalog, &req.profile, recipes).to_string(),
        ..req.clone()
    };
    let p = profile_recipe(recipes, &req.profile)?;
    let mut packages: BTreeSet<String> = p.packages.iter().cloned().collect();
    let mut apps: BTreeSet<String> = req.apps.iter().cloned().collect();
    let mut user_password = None;
    let mut sudo = false;
    let mut session = None;
    if let Some(b) = &req.bundle {
        let bundle = catalog
            .bundles
            .iter()
            .find(|x| &x.name == b)
            .with_context(|| format!("no bundle {b:?} in the catalog"))?;
        apps.extend(bundle.apps.iter().cloned());
        packages.extend(bundle.packages.iter().cloned());
        user_password = bundle.user_password.clone();
        sudo = bundle.sudo;
        session = bundle.session.clone();
    }
    if let Some(name) = &session {
        packages.extend(
            session_packages(recipes, p, &req.profile, name)?
                .iter()
                .cloned(),
        );
    }
    let (ports, downloads) = add_apps(&catalog, &apps, &mut packages)?;
    let guest_files = match p.desktop {
        true => files_digest(GUEST_FILES),
        false => String::new(),
    };
    let session_files = session
        .as_deref()
        .map(|s| files_digest(session_files(s)))
        .unwrap_or_default();
    Ok(Selection {
        name: selection_name(req),
        suite: recipes.suite.clone(),
        mirror: recipes.mirror.clone(),
        base_packages: recipes.base_packages.clone(),
        packages: packages.into_iter().collect(),
        pip: p.pip.clone(),
        desktop: p.desktop,
        ports,
        user_password,
        sudo,
        guest_files,
        session,
        session_files,
        downloads,
        layout: LAYOUT,
    })
}

/// The recipe `profile` builds: a catalog profile's is keyed by its name or one of its aliases
/// (`desktop-ubuntu` builds the `desktop` recipe, the same image as `--profile desktop`); any
/// other name is its own.
fn recipe_name<'a>(catalog: &'a Catalog, profile: &'a str, recipes: &Recipes) -> &'a str {
    catalog
        .profile(profile)
        .and_then(|p| {
            std::iter::once(&p.name)
                .chain(&p.aliases)
                .find(|n| recipes.profiles.contains_key(n.as_str()))
        })
        .map_or(profile, String::as_str)
}

/// The recipe named `name`; the error lists the recipes there are.
fn profile_recipe<'a>(recipes: &'a Recipes, name: &str) -> anyhow::Result<&'a ProfileRecipe> {
    recipes.profiles.get(name).with_context(|| {
        format!(
            "no recipe for profile {:?} (recipes: {})",
            name,
            recipes
                .profiles
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

/// The packages desktop session `name` adds to profile `profile` (recipe `p`), which must be a
/// desktop one.
fn session_packages<'a>(
    recipes: &'a Recipes,
    p: &ProfileRecipe,
    profile: &str,
    name: &str,
) -> anyhow::Result<&'a [String]> {
    anyhow::ensure!(
        p.desktop,
        "session {name} needs a desktop profile, not {}",
        profile
    );
    let recipe = recipes
        .sessions
        .get(name)
        .with_context(|| format!("no recipe for session {name:?} in images/recipes.toml"))?;
    Ok(&recipe.packages)
}

/// Releases downloaded into an image, each with the launcher written for it (if any).
type Downloads = Vec<(Download, Option<DesktopEntry>)>;

/// Adds the catalog apps' packages to `packages`; their ports, and the releases to download
/// with their launchers (each checked: a download is installed only with its digest pinned).
fn add_apps(
    catalog: &Catalog,
    apps: &BTreeSet<String>,
    packages: &mut BTreeSet<String>,
) -> anyhow::Result<(std::collections::BTreeMap<String, u16>, Downloads)> {
    let mut downloads = Vec::new();
    let mut ports = std::collections::BTreeMap::new();
    for a in apps {
        let app = catalog
            .apps
            .iter()
            .find(|x| &x.name == a)
            .with_context(|| format!("no app {a:?} in the catalog"))?;
        packages.extend(app.packages.iter().cloned());
        ports.extend(app.ports.clone());
        if let Some(d) = &app.download {
            // A release fetched at build time is installed only with its digest pinned.
            d.check()
                .map_err(|e| anyhow::anyhow!("app {}: {e}", app.name))?;
            if let Some(entry) = &app.desktop_entry {
                entry
                    .check()
                    .map_err(|e| anyhow::anyhow!("app {}: {e}", app.name))?;
            }
            downloads.push((d.clone(), app.desktop_entry.clone()));
        }
    }
    Ok((ports, downloads))
}

/// The selection's name: the profile's recipe, then the bundle and the apps asked for, joined
/// by `-` (`desktop-osworld-vlc`).
fn selection_name(req: &BuildRequest) -> String {
    let mut name = req.profile.clone();
    if let Some(b) = &req.bundle {
        name.push('-');
        name.push_str(b);
    }
    for a in &req.apps {
        name.push('-');
        name.push_str(a);
    }
    name
}

/// `pkg=version` lines for the top-level packages.
fn read_lock(path: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(p, v)| (p.trim().to_string(), v.trim().to_string()))
        .collect()
}

fn image_ref(sel: &Selection, lock: &str, agent_digest: &str) -> String {
    let recipe = serde_json::to_string(sel).unwrap_or_default();
    let h = sha256_hex(format!("{recipe}\n{lock}\n{agent_digest}").as_bytes());
    format!("berth-{}:{}", sel.name, &h[..24])
}

thread_local! {
    /// Where a build running as a controller job also reports its steps.
    static STEPS: std::cell::RefCell<Option<std::sync::mpsc::Sender<String>>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs `f` (a build on this thread) with its step messages also sent to `to`.
pub fn with_steps<T>(to: std::sync::mpsc::Sender<String>, f: impl FnOnce() -> T) -> T {
    STEPS.with(|s| *s.borrow_mut() = Some(to));
    let out = f();
    STEPS.with(|s| *s.borrow_mut() = None);
    out
}

fn report(msg: String) {
    STEPS.with(|s| {
        if let Some(tx) = s.borrow().as_ref() {
            let _ = tx.send(msg);
        }
    });
}

/// Progress for the long steps on stderr: one rewritten line on a terminal, a line per step
/// otherwise.
struct Progress {
    tty: bool,
    step: String,
    started: Instant,
}

impl Progress {
    fn step(step: &str) -> Progress {
        eprintln!("==> {step}");
        report(format!("{step}: started"));
        Progress {
            tty: std::io::stderr().is_terminal(),
            step: step.to_string(),
            started: Instant::now(),
        }
    }

    fn line(&self, n: usize, line: &str) {
        if self.tty {
            let mut l: String = line.chars().take(70).collect();
            l = l.replace('\r', "");
            eprint!(
                "\r\x1b[2K  [{:>5.1} s, {n} lines] {l}",
                self.started.elapsed().as_secs_f64()
            );
            let _ = std::io::stderr().flush();
        }
    }

    fn done(&self) {
        if self.tty {
            eprint!("\r\x1b[2K");
        }
        eprintln!(
            "    {} done in {:.1} s",
            self.step,
            self.started.elapsed().as_secs_f64()
        );
    }
}

/// Runs a command with its output shown as progress; on failure the error names the step and
/// carries the output's last lines.
fn run_step(step: &str, cmd: &mut Command) -> anyhow::Result<Vec<String>> {
    let p = Progress::step(step);
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("{step}: cannot start {:?}", cmd.get_program()))?;
    let stderr = child.stderr.take().expect("piped");
    let err_lines = std::thread::spawn(move || {
        BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });
    let mut lines = Vec::new();
    for line in BufReader::new(child.stdout.take().expect("piped"))
        .lines()
        .map_while(Result::ok)
    {
        p.line(lines.len(), &line);
        lines.push(line);
    }
    let status = child.wait()?;
    let errs = err_lines.join().unwrap_or_default();
    lines.extend(errs);
    if !status.success() {
        if p.tty {
            eprintln!();
        }
        let tail: Vec<&String> = lines
            .iter()
            .rev()
            .take(12)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let problems: Vec<&String> = lines.iter().filter(|l| l.starts_with("E:")).collect();
        bail!(
            "{step} failed ({status}){}\n{}",
            if problems.is_empty() {
                String::new()
            } else {
                format!(
                    ": {}",
                    problems
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join("; ")
                )
            },
            tail.iter()
                .map(|s| format!("  | {s}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    p.done();
    Ok(lines)
}

fn docker_has(image: &str) -> bool {
    Command::new("docker")
        .args(["image", "inspect", "--format", "{{.Id}}", image])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn docker_size(image: &str) -> u64 {
    Command::new("docker")
        .args(["image", "inspect", "--format", "{{.Size}}", image])
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(0)
}

/// Holds an exclusive lock on the cache while building (two builds never share a stage dir).
fn lock_cache(dir: &Path) -> anyhow::Result<nix::fcntl::Flock<std::fs::File>> {
    std::fs::create_dir_all(dir)?;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(".lock"))?;
    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| anyhow::anyhow!("locking the image cache {}: {e}", dir.display()))
}

/// The `image_ref` a build of `req` will produce (unless the lock must be re-resolved), and
/// whether that image exists already.
pub fn plan(req: &BuildRequest) -> anyhow::Result<(String, bool)> {
    let recipes = load_recipes(&req.images_dir)?;
    let sel = select(req, &recipes)?;
    let agent = std::fs::read(&req.agent_bin)
        .with_context(|| format!("reading the agent binary {}", req.agent_bin.display()))?;
    let lock = std::fs::read_to_string(req.images_dir.join(format!("{}.lock", sel.name)))
        .unwrap_or_default();
    let image = image_ref(&sel, &lock, &sha256_hex(&agent));
    let exists = docker_has(&image);
    Ok((image, exists))
}

/// Builds (or finds) the image, its stages kept in the cache for the next build.
pub fn build(req: &BuildRequest) -> anyhow::Result<Built> {
    build_keeping(req, true)
}

/// Builds (or finds) the image; `keep_stage` false removes its packages stage from the cache
/// once the image is imported (a one-off build: the image itself is found by its name; the
/// base stage stays). A failed build keeps it, to resume from.
pub fn build_keeping(req: &BuildRequest, keep_stage: bool) -> anyhow::Result<Built> {
    let started = Instant::now();
    let recipes = load_recipes(&req.images_dir)?;
    let sel = select(req, &recipes)?;
    let agent = std::fs::read(&req.agent_bin).with_context(|| {
        format!(
            "the berth-agent binary {} cannot be read; build it with `cargo build -p berth-agent` \
             (same profile as berth) or pass --agent-bin",
            req.agent_bin.display()
        )
    })?;
    let agent_digest = sha256_hex(&agent);
    let lock_path = req.images_dir.join(format!("{}.lock", sel.name));
    let lock_text = std::fs::read_to_string(&lock_path).unwrap_or_default();
    let mut image = image_ref(&sel, &lock_text, &agent_digest);
    if docker_has(&image) {
        return Ok(Built::of(image, false, started));
    }
    let _guard = lock_cache(&req.cache_dir)?;
    let rootfs = packages_stage(req, &sel, &lock_path, false)?;
    // A re-resolved lock changes the name.
    let new_lock = std::fs::read_to_string(&lock_path).unwrap_or_default();
    if new_lock != lock_text {
        image = image_ref(&sel, &new_lock, &agent_digest);
    }
    let bin = rootfs.join("usr/local/bin/berth-agent");
    std::fs::write(&bin, &agent).context("installing berth-agent into the image")?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755))?;
    }
    import(&rootfs, &image, &sel)?;
    if docker_size(&image) == 0 {
        bail!("docker import produced an empty image {image}");
    }
    if !keep_stage && let Some(stage) = rootfs.parent() {
        std::fs::remove_dir_all(stage)
            .with_context(|| format!("removing the stage {}", stage.display()))?;
        eprintln!("==> removed the stage {} from the cache", stage.display());
    }
    Ok(Built::of(image, true, started))
}

/// `docker import` of a stage's root file system as `image`: the agent its entrypoint, the
/// selection's session and ports in its environment and labels.
fn import(rootfs: &Path, image: &str, sel: &Selection) -> anyhow::Result<()> {
    let cmd = match sel.desktop {
        true => r#"CMD ["--listen", "0.0.0.0:5000", "--cdp-listen", "0.0.0.0:9222", "--desktop"]"#,
        false => r#"CMD ["--listen", "0.0.0.0:5000"]"#,
    };
    // The session is the image's, whoever starts its agent (a provider passes its own
    // arguments): the agent reads it from its environment.
    let session = sel.session.as_deref().unwrap_or("xfce");
    let ports = format!(
        // Dockerfile syntax: a double-quoted value, its own quotes escaped.
        "LABEL {PORTS_LABEL}=\"{}\"",
        serde_json::to_string(&sel.ports)
            .unwrap_or_default()
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
    );
    docker_import(
        rootfs,
        image,
        &[
            r#"ENTRYPOINT ["/usr/local/bin/berth-agent", "init"]"#,
            cmd,
            "ENV LANG=C.UTF-8",
            &format!("ENV BERTH_AGENT_SESSION={session}"),
            "EXPOSE 5000 9222",
            &format!("LABEL berth.image_ref={image}"),
            &format!(
                "LABEL {SESSION_LABEL}={}",
                if sel.desktop { session } else { "none" }
            ),
            &ports,
        ],
    )
}

/// What `berth image build --controller` puts together: the base rootfs (the sandbox images'
/// first stage, cached) with `berth` and `berth-agent` (which `berth serve` expects beside
/// it) in /usr/local/bin, running `berth serve` — the image deploy/kubernetes runs.
#[derive(Debug, Clone)]
pub struct ControllerBuild {
    pub berth_bin: PathBuf,
    pub agent_bin: PathBuf,
    pub images_dir: PathBuf,
    pub cache_dir: PathBuf,
}

/// Debian packages whose files alone the controller image holds: the session view's viewers
/// (noVNC and xterm.js, static files served by `berth serve`). Unpacked, not installed: their
/// dependencies (a Node.js, websockify) are the sandbox's business, not the controller's.
const CONTROLLER_VENDOR: [&str; 3] = ["novnc", "libjs-xterm", "node-xterm"];

/// The controller image's name: the base's inputs, the vendored packages' versions, both
/// binaries and the layout.
fn controller_ref(
    recipes: &Recipes,
    vendor: &[(String, String)],
    berth_digest: &str,
    agent_digest: &str,
) -> String {
    let h = sha256_hex(
        format!(
            "controller|{}|{}|{:?}|{vendor:?}|{berth_digest}|{agent_digest}|{LAYOUT}",
            recipes.suite, recipes.mirror, recipes.base_packages
        )
        .as_bytes(),
    );
    format!("berth-controller:{}", &h[..24])
}

/// Builds (or finds) the controller's image.
pub fn build_controller(req: &ControllerBuild) -> anyhow::Result<Built> {
    let started = Instant::now();
    let recipes = load_recipes(&req.images_dir)?;
    let read = |p: &Path| {
        std::fs::read(p).with_context(|| format!("reading {} for the image", p.display()))
    };
    let berth = read(&req.berth_bin)?;
    let agent = read(&req.agent_bin)?;
    let lock_path = req.images_dir.join("controller.lock");
    let vendor = read_lock(&lock_path);
    let image = controller_ref(&recipes, &vendor, &sha256_hex(&berth), &sha256_hex(&agent));
    if docker_has(&image) {
        return Ok(Built::of(image, false, started));
    }
    let _guard = lock_cache(&req.cache_dir)?;
    let base = controller_base_stage(req, &recipes)?;
    let dir = req.cache_dir.join("controller-staging");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let rootfs = dir.join("rootfs");
    let result = (|| -> anyhow::Result<()> {
        run_step(
            "copy the base rootfs",
            Command::new("cp").arg("-a").arg(&base).arg(&rootfs),
        )?;
        unpack_vendor(&rootfs, &vendor, &lock_path)?;
        install_controller_binaries(&rootfs, &berth, &agent)?;
        import_controller_image(&rootfs, &image)
    })();
    // The staging copy is not a cache: the image is the result.
    let _ = std::fs::remove_dir_all(&dir);
    result?;
    if docker_size(&image) == 0 {
        bail!("docker import produced an empty image {image}");
    }
    Ok(Built::of(image, true, started))
}

/// The base rootfs the controller's image starts from: the sandbox images' first stage
/// (cached), for a selection of nothing but the base.
fn controller_base_stage(req: &ControllerBuild, recipes: &Recipes) -> anyhow::Result<PathBuf> {
    // The base stage is all a selection's base needs.
    let sel = Selection {
        name: "controller".into(),
        suite: recipes.suite.clone(),
        mirror: recipes.mirror.clone(),
        base_packages: recipes.base_packages.clone(),
        packages: vec![],
        pip: vec![],
        desktop: false,
        ports: Default::default(),
        user_password: None,
        sudo: false,
        guest_files: String::new(),
        session: None,
        session_files: String::new(),
        downloads: vec![],
        layout: LAYOUT,
    };
    base_stage(
        &BuildRequest {
            profile: "controller".into(),
            bundle: None,
            apps: vec![],
            agent_bin: req.agent_bin.clone(),
            images_dir: req.images_dir.clone(),
            cache_dir: req.cache_dir.clone(),
        },
        &sel,
    )
}

/// Puts `berth` and `berth-agent` in the rootfs's /usr/local/bin, and the directories
/// `berth serve` is pointed at.
fn install_controller_binaries(rootfs: &Path, berth: &[u8], agent: &[u8]) -> anyhow::Result<()> {
    for (name, bytes) in [("berth", berth), ("berth-agent", agent)] {
        let bin = rootfs.join("usr/local/bin").join(name);
        std::fs::write(&bin, bytes).with_context(|| format!("installing {name}"))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755))?;
    }
    for d in ["var/lib/berth", "etc/berth"] {
        std::fs::create_dir_all(rootfs.join(d))?;
    }
    Ok(())
}

/// Imports the controller's rootfs as `image`, running `berth serve`.
fn import_controller_image(rootfs: &Path, image: &str) -> anyhow::Result<()> {
    docker_import(
        rootfs,
        image,
        &[
            r#"ENTRYPOINT ["/usr/local/bin/berth"]"#,
            r#"CMD ["serve", "--listen", "0.0.0.0:8780", "--config", "/etc/berth/berth.toml", "--data-dir", "/var/lib/berth"]"#,
            "ENV LANG=C.UTF-8",
            "EXPOSE 8780",
            &format!("LABEL berth.image_ref={image}"),
        ],
    )
}

/// Runs `script` with `/bin/sh` in `rootfs` (a clean environment, no terminal) as one step.
fn chroot(rootfs: &Path, step: &str, script: &str) -> anyhow::Result<Vec<String>> {
    run_step(
        step,
        Command::new("chroot")
            .stdin(Stdio::null())
            .arg(rootfs)
            .args(["/bin/sh", "-c", script])
            .env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .env("DEBIAN_FRONTEND", "noninteractive")
            .env("LANG", "C.UTF-8"),
    )
}

/// Each package as `name=version` where the lock has it, else by name alone.
fn pinned<'a>(packages: impl Iterator<Item = &'a str>, lock: &[(String, String)]) -> Vec<String> {
    packages
        .map(|p| match lock.iter().find(|(n, _)| n == p) {
            Some((_, v)) => format!("{p}={v}"),
            None => p.to_string(),
        })
        .collect()
}

/// Writes a lock file when its text changed.
fn write_lock(lock_path: &Path, text: &str) -> anyhow::Result<()> {
    if std::fs::read_to_string(lock_path).unwrap_or_default() != text {
        std::fs::write(lock_path, text)
            .with_context(|| format!("writing {}", lock_path.display()))?;
        eprintln!("    wrote {}", lock_path.display());
    }
    Ok(())
}

/// Downloads [`CONTROLLER_VENDOR`] at their locked versions (the current ones when there is no
/// lock, or a locked one is gone from the mirror) and unpacks their files into `rootfs`; the
/// lock follows what was unpacked.
fn unpack_vendor(rootfs: &Path, lock: &[(String, String)], lock_path: &Path) -> anyhow::Result<()> {
    let chroot = |step: &str, script: &str| chroot(rootfs, step, script);
    let pinned = pinned(CONTROLLER_VENDOR.iter().copied(), lock);
    let download = |pkgs: &[String]| {
        chroot(
            "download the session view's viewers",
            &format!(
                "apt-get update -qq && mkdir -p /tmp/vendor && cd /tmp/vendor && \
                 apt-get download -qq {}",
                pkgs.join(" ")
            ),
        )
    };
    if let Err(e) = download(&pinned) {
        if lock.is_empty() {
            return Err(e);
        }
        eprintln!(
            "warning: a locked version is gone from the mirror ({e}); re-resolving and rewriting {}",
            lock_path.display()
        );
        let current: Vec<String> = CONTROLLER_VENDOR.iter().map(|p| p.to_string()).collect();
        download(&current)?;
    }
    let versions = chroot(
        "unpack the session view's viewers",
        "cd /tmp/vendor && for d in *.deb; do dpkg-deb -x \"$d\" / && \
         dpkg-deb -f \"$d\" Package Version | paste -sd= | sed 's/^Package: //; s/=Version: /=/'; \
         done && rm -rf /tmp/vendor /var/lib/apt/lists/* /var/cache/apt/*.bin",
    )?;
    let mut out =
        "# Resolved versions of the controller image's vendored packages (its build rewrites this file).\n"
            .to_string();
    for l in vendored_versions(&versions) {
        out.push_str(l);
        out.push('\n');
    }
    write_lock(lock_path, &out)
}

/// The `package=version` lines among what the unpack step printed, sorted.
fn vendored_versions(lines: &[String]) -> Vec<&str> {
    let mut out: Vec<&str> = lines
        .iter()
        .map(|l| l.trim())
        .filter(|l| {
            l.split_once('=').is_some_and(|(p, v)| {
                !p.is_empty()
                    && p.bytes().all(|b| {
                        b.is_ascii_lowercase() || b.is_ascii_digit() || b"+-.".contains(&b)
                    })
                    && !v.is_empty()
                    && !v.contains(char::is_whitespace)
            })
        })
        .collect();
    out.sort();
    out
}

/// `berth image lock`: resolves the selection afresh and rewrites its lock file.
pub fn relock(req: &BuildRequest) -> anyhow::Result<PathBuf> {
    let recipes = load_recipes(&req.images_dir)?;
    let sel = select(req, &recipes)?;
    let lock_path = req.images_dir.join(format!("{}.lock", sel.name));
    let _guard = lock_cache(&req.cache_dir)?;
    packages_stage(req, &sel, &lock_path, true)?;
    Ok(lock_path)
}

fn base_stage(req: &BuildRequest, sel: &Selection) -> anyhow::Result<PathBuf> {
    let key =
        sha256_hex(format!("{}|{}|{:?}", sel.suite, sel.mirror, sel.base_packages).as_bytes());
    let dir = req.cache_dir.join(format!("base-{}", &key[..16]));
    let rootfs = dir.join("rootfs");
    if dir.join(".done").exists() {
        eprintln!("==> base rootfs (cached)");
        return Ok(rootfs);
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    run_step(
        &format!("debootstrap {}", sel.suite),
        Command::new("debootstrap")
            .stdin(Stdio::null())
            .args([
                "--variant=minbase",
                &format!("--include={}", sel.base_packages.join(",")),
            ])
            .arg(&sel.suite)
            .arg(&rootfs)
            .arg(&sel.mirror),
    )?;
    std::fs::write(dir.join(".done"), "")?;
    Ok(rootfs)
}

/// The base plus the profile's packages (pinned to the lock when it has them). `relock`: ignore
/// the pins and write the lock from what got installed.
fn packages_stage(
    req: &BuildRequest,
    sel: &Selection,
    lock_path: &Path,
    relock: bool,
) -> anyhow::Result<PathBuf> {
    let base = base_stage(req, sel)?;
    let lock = if relock {
        Vec::new()
    } else {
        read_lock(lock_path)
    };
    let key = packages_key(&base, sel, &lock);
    let dir = req.cache_dir.join(format!("{}-{}", sel.name, &key[..16]));
    let rootfs = dir.join("rootfs");
    if dir.join(".done").exists() && !relock {
        eprintln!("==> {} packages (cached)", sel.name);
        return Ok(rootfs);
    }
    // An interrupted build may have left its /proc mounted: never recurse into it.
    let _ = Command::new("umount")
        .arg(rootfs.join("proc"))
        .stderr(Stdio::null())
        .status();
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    run_step(
        "copy the base rootfs",
        Command::new("cp").arg("-a").arg(&base).arg(&rootfs),
    )?;
    forbid_service_starts(&rootfs)?;
    let proc_dir = rootfs.join("proc");
    let mounted = Command::new("mount")
        .args(["-t", "proc", "proc"])
        .arg(&proc_dir)
        .status()
        .is_ok_and(|s| s.success());
    let result = provision_packages(req, sel, &rootfs, &lock, lock_path);
    if mounted {
        let _ = Command::new("umount").arg(&proc_dir).status();
    }
    result?;
    std::fs::write(dir.join(".done"), "")?;
    Ok(rootfs)
}

/// The packages stage's cache key: every input of the stage (its base, the selection's
/// packages, files and downloads, and the lock's pins).
fn packages_key(base: &Path, sel: &Selection, lock: &[(String, String)]) -> String {
    sha256_hex(
        format!(
            "{}|{:?}|{:?}|{:?}|{}|{:?}|{}|{:?}|{}|{:?}",
            base.display(),
            sel.packages,
            sel.pip,
            lock,
            sel.guest_files,
            sel.user_password,
            sel.sudo,
            sel.session,
            sel.session_files,
            sel.downloads,
        )
        .as_bytes(),
    )
}

/// Writes a `policy-rc.d` that refuses every service start: packages installed in the chroot
/// must not start daemons on the build host.
fn forbid_service_starts(rootfs: &Path) -> anyhow::Result<()> {
    std::fs::write(rootfs.join("usr/sbin/policy-rc.d"), "#!/bin/sh\nexit 101\n")?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            rootfs.join("usr/sbin/policy-rc.d"),
            std::fs::Permissions::from_mode(0o755),
        )?;
    }
    Ok(())
}

/// Everything the packages stage does inside the copied rootfs (its /proc mounted): packages,
/// pip's, downloads, the guest's and session's files and setup, then the lock from what got
/// installed.
fn provision_packages(
    req: &BuildRequest,
    sel: &Selection,
    rootfs: &Path,
    lock: &[(String, String)],
    lock_path: &Path,
) -> anyhow::Result<()> {
    chroot(rootfs, "apt-get update", "apt-get update")?;
    install_packages(rootfs, sel, lock, lock_path)?;
    if !sel.pip.is_empty() {
        pip_install(rootfs, &sel.pip)?;
    }
    for (download, entry) in &sel.downloads {
        install_download(
            rootfs,
            &req.cache_dir.join("downloads"),
            download,
            entry.as_ref(),
        )?;
    }
    if sel.desktop {
        write_files(rootfs, GUEST_FILES)?;
    }
    if let Some(session) = &sel.session {
        write_files(rootfs, session_files(session))?;
        expect_downloaded_commands(rootfs, &sel.downloads)?;
    }
    chroot(rootfs, "the sandbox user and the guest", &guest_script(sel))?;
    if let Some(session) = &sel.session {
        chroot(
            rootfs,
            &format!("the {session} session and first-run state"),
            &format!("sh /tmp/berth-{session}/setup.sh && rm -rf /tmp/berth-{session}"),
        )?;
    }
    write_packages_lock(rootfs, sel, lock_path)
}

/// Installs the selection's packages at their locked versions; when a locked one is gone from
/// the mirror, at the current ones (the lock then follows).
fn install_packages(
    rootfs: &Path,
    sel: &Selection,
    lock: &[(String, String)],
    lock_path: &Path,
) -> anyhow::Result<()> {
    let pinned = pinned(sel.packages.iter().map(String::as_str), lock);
    let install = |pkgs: &[String]| {
        chroot(
            rootfs,
            &format!("install {} packages", pkgs.len()),
            &format!(
                "apt-get install -y --no-install-recommends {}",
                pkgs.join(" ")
            ),
        )
    };
    if let Err(e) = install(&pinned) {
        if lock.is_empty() {
            return Err(e);
        }
        // The mirror keeps only current versions: re-resolve, and the lock follows.
        eprintln!(
            "warning: a locked version is gone from the mirror ({e}); re-resolving and rewriting {}",
            lock_path.display()
        );
        install(&sel.packages)?;
    }
    Ok(())
}

/// Installs the profile's pip packages into the rootfs's system Python.
fn pip_install(rootfs: &Path, pip: &[String]) -> anyhow::Result<()> {
    // Downloads trust what the build host trusts (a proxy's CA, say); the bundle is
    // used for this step only and not left in the image.
    let host_ca = std::env::var_os("SSL_CERT_FILE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/etc/ssl/certs/ca-certificates.crt"));
    let ca = rootfs.join("tmp/berth-build-ca.crt");
    let cert = match std::fs::copy(&host_ca, &ca) {
        Ok(_) => "PIP_CERT=/tmp/berth-build-ca.crt",
        Err(_) => "",
    };
    // Debian's setuptools and wheel build the sdists: no second download round.
    let r = chroot(
        rootfs,
        "pip install",
        &format!(
            "{cert} pip install --no-cache-dir --break-system-packages \
             --no-build-isolation {}",
            pip.join(" ")
        ),
    );
    let _ = std::fs::remove_file(&ca);
    r?;
    Ok(())
}

/// Writes the lock file from the versions installed of the selection's packages.
fn write_packages_lock(rootfs: &Path, sel: &Selection, lock_path: &Path) -> anyhow::Result<()> {
    let versions = chroot(
        rootfs,
        "read the installed versions",
        "dpkg-query -W -f '${Package}=${Version}\\n'",
    )?;
    let wanted: BTreeSet<&str> = sel.packages.iter().map(String::as_str).collect();
    let mut out = format!(
        "# Resolved versions of {}'s packages (berth image lock rewrites this file).\n",
        sel.name
    );
    for l in versions {
        if let Some((p, _)) = l.split_once('=')
            && wanted.contains(p)
        {
            out.push_str(&l);
            out.push('\n');
        }
    }
    write_lock(lock_path, &out)
}

/// The commands a downloaded release links (`code`) join the programs the image's expected
/// desktop state promises.
fn expect_downloaded_commands(
    rootfs: &Path,
    downloads: &[(Download, Option<DesktopEntry>)],
) -> anyhow::Result<()> {
    let path = rootfs.join(EXPECTED_DESKTOP);
    if !path.exists() {
        return Ok(());
    }
    let mut expected: berth_protocol::desktop::ExpectedDesktop =
        serde_json::from_slice(&std::fs::read(&path)?)
            .with_context(|| format!("{EXPECTED_DESKTOP} in the image"))?;
    for name in downloads.iter().flat_map(|(d, _)| d.bin.keys()) {
        if !expected.programs.contains(name) {
            expected.programs.push(name.clone());
        }
    }
    std::fs::write(&path, serde_json::to_vec_pretty(&expected)?)?;
    Ok(())
}

/// The largest release the builder downloads.
const DOWNLOAD_LIMIT: u64 = 4 << 30;

/// Fetches `d` into `cache` (once per sha256: a cached file is checked again), answering its
/// path. The URL must answer within 30 s and keep sending (60 s without a byte fails); what
/// arrives is refused unless its sha256 is the pinned one.
pub fn fetch_download(cache: &Path, d: &Download) -> anyhow::Result<PathBuf> {
    use sha2::Digest;
    d.check().map_err(|e| anyhow::anyhow!("{e}"))?;
    std::fs::create_dir_all(cache)?;
    let path = cache.join(format!("{}.download", d.sha256.to_ascii_lowercase()));
    let hash_file = |p: &Path| -> std::io::Result<String> {
        let mut f = std::fs::File::open(p)?;
        let mut h = sha2::Sha256::new();
        std::io::copy(&mut f, &mut h)?;
        Ok(hex(&h.finalize()))
    };
    if path.exists() {
        if hash_file(&path)?.eq_ignore_ascii_case(&d.sha256) {
            eprintln!("==> download {} (cached)", d.url);
            return Ok(path);
        }
        std::fs::remove_file(&path)?;
    }
    let progress = Progress::step(&format!("download {}", d.url));
    let tmp = cache.join(format!(".{}.part", d.sha256.to_ascii_lowercase()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let fetched: anyhow::Result<String> = runtime.block_on(async {
        use tokio::io::AsyncWriteExt;
        let client = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(30))
            .read_timeout(std::time::Duration::from_secs(60))
            .build()?;
        let mut resp = client
            .get(&d.url)
            .send()
            .await
            .with_context(|| format!("cannot reach {} from this build host", d.url))?;
        if !resp.status().is_success() {
            bail!("{} answered HTTP {}", d.url, resp.status());
        }
        let mut out = tokio::fs::File::create(&tmp).await?;
        let mut h = sha2::Sha256::new();
        let mut got: u64 = 0;
        while let Some(chunk) = resp
            .chunk()
            .await
            .with_context(|| format!("downloading {}", d.url))?
        {
            got += chunk.len() as u64;
            if got > DOWNLOAD_LIMIT {
                bail!("{} is larger than {} bytes", d.url, DOWNLOAD_LIMIT);
            }
            h.update(&chunk);
            out.write_all(&chunk).await?;
        }
        out.flush().await?;
        Ok(hex(&h.finalize()))
    });
    let digest = match fetched {
        Ok(digest) => digest,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    if !digest.eq_ignore_ascii_case(&d.sha256) {
        let _ = std::fs::remove_file(&tmp);
        bail!(
            "{}: sha256 {digest}, not the pinned {}; nothing was installed",
            d.url,
            d.sha256
        );
    }
    std::fs::rename(&tmp, &path)?;
    progress.done();
    Ok(path)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Fetches a release and installs it in the root file system: unpacked into its directory (the
/// archive's top directory stripped), its commands linked into /usr/bin, its launcher written.
pub fn install_download(
    rootfs: &Path,
    cache: &Path,
    d: &Download,
    entry: Option<&DesktopEntry>,
) -> anyhow::Result<()> {
    let archive = fetch_download(cache, d)?;
    let dir = rootfs.join(d.dir.trim_start_matches('/'));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    run_step(
        &format!("unpack {} into {}", d.url, d.dir),
        Command::new("tar")
            .arg("-xaf")
            .arg(&archive)
            .arg("-C")
            .arg(&dir)
            .args(["--strip-components=1", "--no-same-owner"]),
    )?;
    let bin = rootfs.join("usr/bin");
    std::fs::create_dir_all(&bin)?;
    for (name, target) in &d.bin {
        let link = bin.join(name);
        let _ = std::fs::remove_file(&link);
        let to = Path::new(&d.dir).join(target);
        if !rootfs.join(to.strip_prefix("/").unwrap_or(&to)).exists() {
            bail!(
                "{}: the archive has no {target} for the command {name}",
                d.url
            );
        }
        std::os::unix::fs::symlink(&to, &link)?;
    }
    if let Some(entry) = entry {
        let apps = rootfs.join("usr/share/applications");
        std::fs::create_dir_all(&apps)?;
        std::fs::write(apps.join(&entry.file), entry.render())?;
    }
    Ok(())
}

/// The sandbox user (uid 1000, its runtime dir), the bundle's password and sudo, and the
/// desktop's Chromium presented as Google Chrome.
fn guest_script(sel: &Selection) -> String {
    let mut script = String::from(
        "id user >/dev/null 2>&1 || useradd -m -u 1000 -s /bin/bash user; \
         install -d -m 0700 -o user -g user /run/user/1000; ",
    );
    if let Some(pw) = &sel.user_password {
        // chpasswd reads `user:password` lines; the password is the catalog's, not a secret.
        script.push_str(&format!(
            "echo 'user:{}' | chpasswd; ",
            pw.replace('\'', "")
        ));
    }
    if sel.sudo {
        script.push_str(
            "usermod -aG sudo user; \
             echo 'user ALL=(ALL:ALL) NOPASSWD: ALL' > /etc/sudoers.d/berth-user; \
             chmod 0440 /etc/sudoers.d/berth-user; ",
        );
    }
    if sel.desktop {
        script.push_str(
            "if [ -x /usr/lib/chromium/chromium ]; then \
               python3 /tmp/berth-brand-chrome.py /usr/lib/chromium || exit 1; fi; \
             rm -f /tmp/berth-brand-chrome.py; ",
        );
    }
    script.push_str("apt-get clean; rm -rf /var/lib/apt/lists/*");
    script
}

/// `tar` of `rootfs` piped into `docker import` as `image`, with Dockerfile `changes`.
fn docker_import(rootfs: &Path, image: &str, changes: &[&str]) -> anyhow::Result<()> {
    let mut tar = Command::new("tar")
        .arg("-C")
        .arg(rootfs)
        .args([
            "--numeric-owner",
            "--exclude=./proc/*",
            "--exclude=./sys/*",
            "--exclude=./dev/*",
            "-cf",
            "-",
            ".",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .context("docker import: tar")?;
    let mut import = Command::new("docker");
    import.arg("import");
    for c in changes {
        import.args(["--change", c]);
    }
    import
        .args(["-", image])
        .stdin(tar.stdout.take().expect("piped"));
    run_step("docker import", &mut import)?;
    let tar_status = tar.wait()?;
    if !tar_status.success() {
        bail!("docker import: tar of the rootfs failed ({tar_status})");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_controller_image_ref_follows_its_binaries_the_base_and_the_vendored_versions() {
        let recipes: Recipes = toml::from_str(BUILTIN_RECIPES).unwrap();
        let v = |ver: &str| vec![("novnc".to_string(), ver.to_string())];
        let a = controller_ref(&recipes, &v("1"), "b1", "a1");
        assert!(a.starts_with("berth-controller:"), "{a}");
        assert_eq!(a, controller_ref(&recipes, &v("1"), "b1", "a1"));
        assert_ne!(a, controller_ref(&recipes, &v("1"), "b2", "a1"));
        assert_ne!(a, controller_ref(&recipes, &v("1"), "b1", "a2"));
        assert_ne!(a, controller_ref(&recipes, &v("2"), "b1", "a1"));
        let mut other = recipes.clone();
        other.base_packages.push("jq".into());
        assert_ne!(a, controller_ref(&other, &v("1"), "b1", "a1"));
    }

    #[test]
    fn vendored_versions_are_read_from_the_unpack_lines_only() {
        let lines = [
            "novnc=1:1.3.0-1",
            "W: Download is performed unsandboxed as root",
            "node-xterm=3.8.1+~cs0.9.0-1+deb12u1",
            "a = b",
        ]
        .map(String::from);
        assert_eq!(
            vendored_versions(&lines),
            vec!["node-xterm=3.8.1+~cs0.9.0-1+deb12u1", "novnc=1:1.3.0-1"]
        );
    }

    #[test]
    fn the_image_ref_follows_every_input_and_nothing_else() {
        let recipes: Recipes = toml::from_str(BUILTIN_RECIPES).unwrap();
        let req = BuildRequest {
            profile: "desktop".into(),
            bundle: None,
            apps: vec![],
            agent_bin: PathBuf::new(),
            images_dir: PathBuf::new(),
            cache_dir: PathBuf::new(),
        };
        let sel = select(&req, &recipes).unwrap();
        let a = image_ref(&sel, "x=1\n", "d1");
        assert_eq!(a, image_ref(&sel, "x=1\n", "d1"));
        assert!(a.starts_with("berth-desktop:"));
        assert_ne!(a, image_ref(&sel, "x=2\n", "d1"));
        assert_ne!(a, image_ref(&sel, "x=1\n", "d2"));
        let with_app = select(
            &BuildRequest {
                apps: vec!["gimp".into()],
                ..req.clone()
            },
            &recipes,
        )
        .unwrap();
        assert!(with_app.packages.contains(&"gimp".to_string()));
        assert_ne!(a, image_ref(&with_app, "x=1\n", "d1"));
        // A download without its sha256 pinned is refused before anything is fetched.
        let e = select(
            &BuildRequest {
                apps: vec!["openvscode".into()],
                ..req.clone()
            },
            &recipes,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("app openvscode") && e.contains("sha256 pinned"),
            "{e}"
        );
        assert!(
            select(
                &BuildRequest {
                    profile: "nope".into(),
                    ..req.clone()
                },
                &recipes
            )
            .is_err()
        );
        assert!(
            select(
                &BuildRequest {
                    bundle: Some("nope".into()),
                    ..req
                },
                &recipes
            )
            .is_err()
        );
    }

    #[test]
    fn the_osworld_bundle_runs_gnome_with_its_packages_files_and_downloads() {
        let recipes: Recipes = toml::from_str(BUILTIN_RECIPES).unwrap();
        let req = BuildRequest {
            profile: "desktop".into(),
            bundle: Some("osworld".into()),
            apps: vec![],
            agent_bin: PathBuf::new(),
            images_dir: PathBuf::new(),
            cache_dir: PathBuf::new(),
        };
        let sel = select(&req, &recipes).unwrap();
        assert_eq!(sel.session.as_deref(), Some("gnome"));
        for p in [
            "gnome-shell",
            "gnome-control-center",
            "bc",
            "zip",
            "unzip",
            "nautilus",
            "evince",
        ] {
            assert!(sel.packages.iter().any(|x| x == p), "{p} missing");
        }
        assert!(
            sel.downloads.is_empty(),
            "VS Code is not in the bundle by default"
        );
        assert_eq!(sel.session_files, files_digest(GNOME_FILES));
        let with_code = select(
            &BuildRequest {
                apps: vec!["vscode".into()],
                ..req.clone()
            },
            &recipes,
        )
        .unwrap();
        assert_eq!(with_code.downloads.len(), 1);
        assert_ne!(
            image_ref(&sel, "", "d"),
            image_ref(&with_code, "", "d"),
            "a download changes the image"
        );
        // The plain desktop stays XFCE.
        let xfce = select(
            &BuildRequest {
                bundle: None,
                ..req
            },
            &recipes,
        )
        .unwrap();
        assert_eq!(xfce.session, None);
        assert!(!xfce.packages.iter().any(|x| x == "gnome-shell"));
    }

    /// A server on loopback that answers every request with `body` (once per connection).
    fn serve(body: Vec<u8>) -> (String, std::thread::JoinHandle<()>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/release.tar.gz", listener.local_addr().unwrap());
        let handle = std::thread::spawn(move || {
            for conn in listener.incoming().take(2) {
                let Ok(mut conn) = conn else { continue };
                use std::io::{Read, Write};
                let mut head = [0u8; 4096];
                let _ = conn.read(&mut head);
                let _ = write!(
                    conn,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = conn.write_all(&body);
            }
        });
        (url, handle)
    }

    #[test]
    fn a_pinned_release_is_fetched_checked_unpacked_and_linked_and_a_wrong_one_refused() {
        // A release as VS Code ships one: a top directory holding bin/code.
        let src = tempfile::tempdir().unwrap();
        let top = src.path().join("VSCode-linux-x64");
        std::fs::create_dir_all(top.join("bin")).unwrap();
        std::fs::write(top.join("bin/code"), "#!/bin/sh\necho code\n").unwrap();
        std::fs::write(top.join("code.png"), "png").unwrap();
        let archive = src.path().join("release.tar.gz");
        let ok = Command::new("tar")
            .arg("-czf")
            .arg(&archive)
            .arg("-C")
            .arg(src.path())
            .arg("VSCode-linux-x64")
            .status()
            .unwrap();
        assert!(ok.success());
        let body = std::fs::read(&archive).unwrap();
        use sha2::Digest;
        let sha = hex(&sha2::Sha256::digest(&body));
        let (url, server) = serve(body);
        let download = Download {
            url: url.clone(),
            sha256: sha.clone(),
            dir: "/opt/VSCode-linux-x64".into(),
            bin: [("code".to_string(), "bin/code".to_string())].into(),
        };
        let entry = DesktopEntry {
            file: "code.desktop".into(),
            name: "Visual Studio Code".into(),
            exec: "/usr/bin/code %F".into(),
            icon: "/opt/VSCode-linux-x64/code.png".into(),
            wm_class: Some("Code".into()),
            categories: "Development;".into(),
        };
        let rootfs = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        install_download(rootfs.path(), cache.path(), &download, Some(&entry)).unwrap();
        let r = rootfs.path();
        assert_eq!(
            std::fs::read_to_string(r.join("opt/VSCode-linux-x64/bin/code")).unwrap(),
            "#!/bin/sh\necho code\n"
        );
        assert_eq!(
            std::fs::read_link(r.join("usr/bin/code")).unwrap(),
            Path::new("/opt/VSCode-linux-x64/bin/code")
        );
        let desktop =
            std::fs::read_to_string(r.join("usr/share/applications/code.desktop")).unwrap();
        assert!(desktop.contains("Exec=/usr/bin/code %F"), "{desktop}");
        // The second install takes the cached release (the server answers no more than twice).
        install_download(rootfs.path(), cache.path(), &download, None).unwrap();

        // The wrong digest: refused, nothing installed, nothing cached.
        let (url, server2) = serve(b"not the release".to_vec());
        let wrong = Download {
            url: url.clone(),
            dir: "/opt/other".into(),
            ..download.clone()
        };
        let fresh_cache = tempfile::tempdir().unwrap();
        let e = install_download(rootfs.path(), fresh_cache.path(), &wrong, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not the pinned") && e.contains(&url), "{e}");
        assert!(!r.join("opt/other").exists());
        assert_eq!(std::fs::read_dir(fresh_cache.path()).unwrap().count(), 0);

        // Nothing listening: the error names the URL.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let gone = format!("http://{}/x.tar.gz", closed.local_addr().unwrap());
        drop(closed);
        let e = install_download(
            rootfs.path(),
            fresh_cache.path(),
            &Download {
                url: gone.clone(),
                ..wrong
            },
            None,
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains(&gone), "{e:#}");
        drop(server);
        drop(server2);
    }

    /// The expected state an image states is what its own files configure: the dock's
    /// favourites of the schema override, the handlers of mimeapps.list, and programs the agent
    /// reports.
    #[test]
    fn the_gnome_expected_state_agrees_with_the_files_that_make_it() {
        let file = |dest: &str| {
            GNOME_FILES
                .iter()
                .find(|(p, _, _)| *p == dest)
                .map(|(_, text, _)| *text)
                .unwrap_or_else(|| panic!("{dest} not in GNOME_FILES"))
        };
        let expected: berth_protocol::desktop::ExpectedDesktop =
            serde_json::from_str(file(EXPECTED_DESKTOP)).unwrap();
        let overrides = file("usr/share/glib-2.0/schemas/90_berth-ubuntu.gschema.override");
        let favorites = overrides
            .lines()
            .find_map(|l| l.strip_prefix("favorite-apps="))
            .unwrap();
        let listed: Vec<String> = favorites
            .trim_matches(|c| c == '[' || c == ']')
            .split(',')
            .map(|x| x.trim().trim_matches('\'').to_string())
            .collect();
        assert_eq!(listed, expected.favorites);
        assert!(overrides.contains(&format!(
            "gtk-theme='{}'",
            expected.theme.as_deref().unwrap()
        )));
        assert!(overrides.contains(&format!(
            "icon-theme='{}'",
            expected.icon_theme.as_deref().unwrap()
        )));
        let mime = file("etc/xdg/mimeapps.list");
        for (m, app) in &expected.handlers {
            assert!(mime.lines().any(|l| l == format!("{m}={app}")), "{m}={app}");
        }
        for p in &expected.programs {
            assert!(
                berth_protocol::desktop::OSWORLD_PROGRAMS.contains(&p.as_str()),
                "{p}: the agent does not report it"
            );
        }
        // Downloads' commands join the promise.
        let dir = tempfile::tempdir().unwrap();
        write_files(dir.path(), GNOME_FILES).unwrap();
        let vscode = Catalog::builtin()
            .apps
            .into_iter()
            .find(|a| a.name == "vscode")
            .unwrap();
        expect_downloaded_commands(dir.path(), &[(vscode.download.unwrap(), None)]).unwrap();
        let written: berth_protocol::desktop::ExpectedDesktop =
            serde_json::from_slice(&std::fs::read(dir.path().join(EXPECTED_DESKTOP)).unwrap())
                .unwrap();
        assert_eq!(written.programs.last().map(String::as_str), Some("code"));
    }
}
