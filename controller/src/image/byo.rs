//! Bring your own image: any image in the local engine (`--from`), or the image a build
//! context's Dockerfile makes (`--dockerfile`), with berth-agent as PID 1. The agent carries its
//! own libraries (its dynamic loader and the shared objects it links, under `/opt/berth/lib`,
//! found through its `RPATH`), so it runs on whatever C library the image has, or none. The
//! result is named by a content hash of the input image's id and the agent's files, like every
//! berth image; what its sandboxes offer follows from what is in it (exec, files, a PTY and
//! ports always; no desktop).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail};
use serde::Deserialize;

use super::{Built, PORTS_LABEL, SESSION_LABEL, docker_has, run_step};
use crate::util::sha256_hex;

/// Where the agent's libraries go in the image.
const LIB_DIR: &str = "/opt/berth/lib";
/// How the builder lays a brought image out: part of its `image_ref`.
const LAYOUT: u32 = 1;
/// The Docker label naming the image a brought image was made from.
pub const FROM_LABEL: &str = "berth.from";

/// What the image is made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// An image in the local engine, by name or id.
    Image(String),
    /// A build context holding a `Dockerfile`.
    Dockerfile(PathBuf),
}

/// A brought image to build.
#[derive(Debug, Clone)]
pub struct ByoRequest {
    pub source: Source,
    pub agent_bin: PathBuf,
}

/// What `docker image inspect` says of the input image.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct Inspected {
    pub id: String,
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub config: Option<ImageConfig>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct ImageConfig {
    #[serde(default)]
    pub user: String,
    #[serde(default)]
    pub working_dir: String,
}

/// Docker's name for this machine's architecture.
pub fn host_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "arm" => "arm",
        other => other,
    }
}

/// Why the input image cannot carry the agent (pure): another OS or architecture.
pub fn refusal(source: &str, i: &Inspected, host_arch: &str) -> Option<String> {
    if i.os != "linux" {
        return Some(format!(
            "{source} is a {:?} image; berth-agent runs in Linux images only",
            i.os
        ));
    }
    if i.architecture != host_arch {
        return Some(format!(
            "{source} is built for {:?}, not this machine's {host_arch:?}: its commands would not run",
            i.architecture
        ));
    }
    None
}

/// The account commands run as (pure): the image's `USER` when it names an account other than
/// root; a numeric one or none leaves the agent's default.
pub fn account(i: &Inspected) -> Option<String> {
    let user = i.config.as_ref()?.user.split(':').next()?.trim();
    let named = !user.is_empty() && user != "root" && !user.chars().all(|c| c.is_ascii_digit());
    named.then(|| user.to_string())
}

/// Where the image's commands run (pure): its `WORKDIR` when it sets one other than `/`
/// (which the agent would otherwise replace with the account's home).
pub fn workdir(i: &Inspected) -> Option<String> {
    let w = i.config.as_ref()?.working_dir.trim();
    (w.starts_with('/') && w != "/").then(|| w.to_string())
}

/// The agent's shared objects from `ldd`'s output (pure): the dynamic loader and every library
/// resolved to a path. `None` for a static binary; an error when one is not found.
pub fn parse_ldd(out: &str) -> anyhow::Result<Option<Vec<PathBuf>>> {
    if out.contains("not a dynamic executable") || out.contains("statically linked") {
        return Ok(None);
    }
    let mut libs = Vec::new();
    for line in out.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.contains("=> not found") {
            bail!("the agent binary needs a library this machine lacks: {line}");
        }
        let path = match line.split_once("=>") {
            Some((_, to)) => to.trim().split(" (").next().unwrap_or_default(),
            None => line.split(" (").next().unwrap_or_default(),
        };
        // linux-vdso has no file.
        if path.starts_with('/') {
            libs.push(PathBuf::from(path));
        }
    }
    if !libs.iter().any(|p| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("ld-"))
    }) {
        bail!("ldd named no dynamic loader for the agent binary:\n{out}");
    }
    Ok(Some(libs))
}

/// The `image_ref` (pure): a name from the source, a hash of every input.
pub fn byo_ref(source: &Source, base_id: &str, agent: &str, user: Option<&str>) -> String {
    let h = sha256_hex(format!("byo {LAYOUT}\n{base_id}\n{agent}\n{user:?}").as_bytes());
    format!("berth-byo-{}:{}", slug(source), &h[..24])
}

/// A Docker-name-safe slug of the source: the image's repository, or the context's directory.
fn slug(source: &Source) -> String {
    let raw = match source {
        Source::Image(r) => {
            let repo = r.rsplit('/').next().unwrap_or(r);
            repo.split([':', '@']).next().unwrap_or(repo).to_string()
        }
        Source::Dockerfile(d) => d
            .canonicalize()
            .unwrap_or_else(|_| d.clone())
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    };
    let s: String = raw
        .to_lowercase()
        .chars()
        .map(|c| match c.is_ascii_alphanumeric() {
            true => c,
            false => '-',
        })
        .collect();
    let s = s.trim_matches('-').chars().take(40).collect::<String>();
    match s.is_empty() || s.starts_with("sha256") {
        true => "image".into(),
        false => s,
    }
}

/// The Dockerfile that puts the agent in (pure): the agent's files, a check that it runs, and
/// the agent as PID 1; the image's account and `WORKDIR` ([`account`], [`workdir`]) are its
/// commands'.
pub fn dockerfile(i: &Inspected, image: &str, from: &str) -> String {
    let base_id = &i.id;
    let quoted = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let mut d = format!(
        "FROM {base_id}\n\
         COPY lib/ {LIB_DIR}/\n\
         COPY berth-agent /usr/local/bin/berth-agent\n\
         USER root\n\
         RUN [\"/usr/local/bin/berth-agent\", \"--version\"]\n\
         ENTRYPOINT [\"/usr/local/bin/berth-agent\", \"init\"]\n\
         CMD [\"--listen\", \"0.0.0.0:5000\"]\n\
         EXPOSE 5000\n\
         LABEL berth.image_ref={image} {SESSION_LABEL}=none {PORTS_LABEL}=\"{{}}\" {FROM_LABEL}={}\n",
        quoted(from)
    );
    if let Some(u) = account(i) {
        d.push_str(&format!("ENV BERTH_AGENT_USER={u}\n"));
    }
    if let Some(w) = workdir(i) {
        d.push_str(&format!("ENV BERTH_AGENT_WORKDIR={}\n", quoted(&w)));
    }
    d
}

/// The `image_ref` a build of `req` will produce and whether it exists: known before building
/// for an image; for a Dockerfile (whose image is not built yet) a name for the job that the
/// build replaces (`…:pending-<hash>`), never existing.
pub fn plan(req: &ByoRequest) -> anyhow::Result<(String, bool)> {
    match &req.source {
        Source::Image(r) => {
            let inspected = inspect(r)?;
            if let Some(why) = refusal(r, &inspected, host_architecture()) {
                bail!(why);
            }
            let files = agent_files(&req.agent_bin)?.1;
            let image = byo_ref(
                &req.source,
                &inspected.id,
                &files,
                account(&inspected).as_deref(),
            );
            let exists = docker_has(&image);
            Ok((image, exists))
        }
        Source::Dockerfile(dir) => {
            if !dir.join("Dockerfile").is_file() {
                bail!("{} has no Dockerfile", dir.display());
            }
            let at = dir.canonicalize().unwrap_or_else(|_| dir.clone());
            let h = sha256_hex(at.to_string_lossy().as_bytes());
            Ok((
                format!("berth-byo-{}:pending-{}", slug(&req.source), &h[..12]),
                false,
            ))
        }
    }
}

/// The agent's libraries, and a digest of the agent and each of them.
fn agent_files(bin: &Path) -> anyhow::Result<(Vec<PathBuf>, String)> {
    let agent = std::fs::read(bin)
        .with_context(|| format!("reading the agent binary {}", bin.display()))?;
    let libs = agent_libraries(bin)?;
    let mut files = sha256_hex(&agent);
    for l in &libs {
        files.push_str(&sha256_hex(
            &std::fs::read(l).with_context(|| format!("reading {}", l.display()))?,
        ));
    }
    Ok((libs, files))
}

/// Builds (or finds) the image.
pub fn build(req: &ByoRequest) -> anyhow::Result<Built> {
    let started = Instant::now();
    let (base, from) = match &req.source {
        Source::Image(r) => (r.clone(), r.clone()),
        Source::Dockerfile(dir) => (build_context(dir)?, dir.display().to_string()),
    };
    let inspected = inspect(&base)?;
    if let Some(why) = refusal(&from, &inspected, host_architecture()) {
        bail!(why);
    }
    let (libs, files) = agent_files(&req.agent_bin)?;
    let user = account(&inspected);
    let image = byo_ref(&req.source, &inspected.id, &files, user.as_deref());
    if docker_has(&image) {
        return Ok(Built::of(image, false, started));
    }
    check_shell(&from, &inspected.id)?;
    let ctx = tempfile::tempdir().context("a build context for the agent")?;
    stage_agent(ctx.path(), &req.agent_bin, &libs)?;
    std::fs::write(
        ctx.path().join("Dockerfile"),
        dockerfile(&inspected, &image, &from),
    )?;
    let mut b = Command::new("docker");
    b.args(["build", "--force-rm", "-t", &image])
        .arg(ctx.path());
    run_step("docker build (the agent put in)", &mut b)
        .with_context(|| format!("berth-agent does not run in {from}"))?;
    Ok(Built::of(image, true, started))
}

/// Builds a context's Dockerfile: the image's id. Its build error says why not.
fn build_context(dir: &Path) -> anyhow::Result<String> {
    if !dir.join("Dockerfile").is_file() {
        bail!("{} has no Dockerfile", dir.display());
    }
    let ids = tempfile::tempdir()?;
    let iid = ids.path().join("id");
    let mut b = Command::new("docker");
    b.args(["build", "--force-rm", "--iidfile"])
        .arg(&iid)
        .arg(dir);
    run_step("docker build (the Dockerfile)", &mut b)
        .with_context(|| format!("the Dockerfile in {} does not build", dir.display()))?;
    let id = std::fs::read_to_string(&iid).context("docker build wrote no image id")?;
    Ok(id.trim().to_string())
}

fn inspect(image: &str) -> anyhow::Result<Inspected> {
    let out = Command::new("docker")
        .args(["image", "inspect", "--format", "{{json .}}", image])
        .output()
        .context("docker image inspect")?;
    if !out.status.success() {
        bail!(
            "no image {image} in the local engine: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    serde_json::from_slice(&out.stdout).context("reading docker image inspect's answer")
}

/// The agent runs commands through `/bin/sh`: an image without one is refused.
fn check_shell(from: &str, id: &str) -> anyhow::Result<()> {
    let ok = Command::new("docker")
        .args([
            "run",
            "--rm",
            "--network",
            "none",
            "--entrypoint",
            "/bin/sh",
        ])
        .args([id, "-c", "exit 0"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("docker run")?;
    if !ok.success() {
        bail!("{from} has no shell (/bin/sh), which the agent runs commands with");
    }
    Ok(())
}

/// The agent's shared objects, as `ldd` resolves them here.
fn agent_libraries(bin: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let out = Command::new("ldd").arg(bin).output().context("ldd")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(parse_ldd(&text)?.unwrap_or_default())
}

/// The agent and its libraries in the context: the binary's loader and `RPATH` pointed at
/// [`LIB_DIR`] (an `RPATH`, not a `RUNPATH`: the libraries' own dependencies are found there
/// too, never in the image).
fn stage_agent(ctx: &Path, bin: &Path, libs: &[PathBuf]) -> anyhow::Result<()> {
    let lib = ctx.join("lib");
    std::fs::create_dir_all(&lib)?;
    let agent = ctx.join("berth-agent");
    std::fs::copy(bin, &agent).context("copying the agent binary")?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755))?;
    }
    let mut loader = None;
    for l in libs {
        let name = l.file_name().context("a library without a name")?;
        std::fs::copy(l, lib.join(name)).with_context(|| format!("copying {}", l.display()))?;
        if name.to_string_lossy().starts_with("ld-") {
            loader = Some(format!("{LIB_DIR}/{}", name.to_string_lossy()));
        }
    }
    let Some(loader) = loader else {
        // A static agent needs nothing beside it.
        return Ok(());
    };
    let mut p = Command::new("patchelf");
    p.args([
        "--set-interpreter",
        &loader,
        "--force-rpath",
        "--set-rpath",
        LIB_DIR,
    ])
    .arg(&agent);
    run_step("patchelf (the agent's loader and libraries)", &mut p)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inspected(arch: &str, os: &str, user: &str) -> Inspected {
        Inspected {
            id: "sha256:abc".into(),
            architecture: arch.into(),
            os: os.into(),
            config: Some(ImageConfig {
                user: user.into(),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn another_architecture_or_os_is_refused_naming_it() {
        assert_eq!(
            refusal("x", &inspected("amd64", "linux", ""), "amd64"),
            None
        );
        let arm = refusal("x:1", &inspected("arm64", "linux", ""), "amd64").unwrap();
        assert!(
            arm.contains("\"arm64\"") && arm.contains("\"amd64\""),
            "{arm}"
        );
        let win = refusal("x", &inspected("amd64", "windows", ""), "amd64").unwrap();
        assert!(win.contains("Linux"), "{win}");
    }

    #[test]
    fn the_images_user_is_the_account_when_it_names_one() {
        assert_eq!(account(&inspected("amd64", "linux", "")), None);
        assert_eq!(account(&inspected("amd64", "linux", "root")), None);
        assert_eq!(account(&inspected("amd64", "linux", "1000:1000")), None);
        assert_eq!(
            account(&inspected("amd64", "linux", "app:app")).as_deref(),
            Some("app")
        );
        assert_eq!(account(&Inspected::default()), None);
    }

    #[test]
    fn ldd_output_gives_the_loader_and_the_libraries() {
        let out = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                   \tlibstdc++.so.6 => /lib/x86_64-linux-gnu/libstdc++.so.6 (0x00007f)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        let libs = parse_ldd(out).unwrap().unwrap();
        assert_eq!(
            libs,
            [
                "/lib/x86_64-linux-gnu/libstdc++.so.6",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
        assert_eq!(parse_ldd("\tnot a dynamic executable\n").unwrap(), None);
        assert_eq!(parse_ldd("\tstatically linked\n").unwrap(), None);
        let missing = parse_ldd("\tlibfoo.so.1 => not found\n").unwrap_err();
        assert!(missing.to_string().contains("libfoo"), "{missing}");
        assert!(parse_ldd("\tlibc.so.6 => /lib/libc.so.6 (0x1)\n").is_err());
    }

    #[test]
    fn the_ref_follows_every_input_and_names_the_source() {
        let s = Source::Image("registry.test/team/Ubuntu_Like:22.04".into());
        let a = byo_ref(&s, "sha256:1", "agent", None);
        assert!(a.starts_with("berth-byo-ubuntu-like:"), "{a}");
        assert_eq!(a, byo_ref(&s, "sha256:1", "agent", None));
        assert_ne!(a, byo_ref(&s, "sha256:2", "agent", None));
        assert_ne!(a, byo_ref(&s, "sha256:1", "agent2", None));
        assert_ne!(a, byo_ref(&s, "sha256:1", "agent", Some("app")));
        let by_id = byo_ref(&Source::Image("sha256:0123".into()), "sha256:1", "a", None);
        assert!(by_id.starts_with("berth-byo-image:"), "{by_id}");
    }

    #[test]
    fn the_dockerfile_runs_the_agent_as_pid_1_and_checks_it_runs() {
        let mut app = inspected("amd64", "linux", "app");
        app.id = "sha256:1".into();
        app.config.as_mut().unwrap().working_dir = "/srv/app dir".into();
        let d = dockerfile(&app, "berth-byo-x:h", "x:1");
        assert!(d.starts_with("FROM sha256:1\n"), "{d}");
        assert!(d.contains("RUN [\"/usr/local/bin/berth-agent\", \"--version\"]"));
        assert!(d.contains("ENTRYPOINT [\"/usr/local/bin/berth-agent\", \"init\"]"));
        assert!(d.contains("berth.from=\"x:1\""), "{d}");
        assert!(d.contains("ENV BERTH_AGENT_USER=app"));
        assert!(
            d.contains("ENV BERTH_AGENT_WORKDIR=\"/srv/app dir\""),
            "{d}"
        );
        let plain = dockerfile(&inspected("amd64", "linux", ""), "i", "x");
        assert!(!plain.contains("BERTH_AGENT_USER"), "{plain}");
        assert!(!plain.contains("WORKDIR"), "{plain}");
    }
}
