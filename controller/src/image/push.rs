//! `berth image push`: a built image tagged `HOST[:PORT]/PATH/<name>:<tag>` and pushed through
//! the Docker daemon, answered with the registry's digest (`HOST/PATH/<name>@sha256:…`), the
//! reference a cluster should pull (a tag can move; a digest cannot).
//!
//! Credentials: `--username` with the password on stdin, else the `auths` entry for the host in
//! the Docker CLI's `config.json` (`$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`:
//! `auth` = base64 `user:password`, `username`/`password`, or `identitytoken`), else none.
//! Credential helpers (`credsStore`, `credHelpers`) are not run.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use base64::Engine;
use bollard::Docker;
use bollard::auth::DockerCredentials;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

/// Where images go: a registry host (with its port, if any) and a path under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registry {
    /// `registry.example.com`, `127.0.0.1:5000`, `[::1]:5000`.
    pub host: String,
    /// `berth`, `team/berth`, or empty (images at the registry's top level).
    pub path: String,
}

/// A path component of a Docker repository name: lowercase letters and digits, with single
/// `.`, `_`, `__` or runs of `-` between them.
fn valid_component(c: &str) -> bool {
    let b = c.as_bytes();
    if b.is_empty() || !b[0].is_ascii_alphanumeric() || !b[b.len() - 1].is_ascii_alphanumeric() {
        return false;
    }
    if c.bytes()
        .any(|x| !(x.is_ascii_lowercase() || x.is_ascii_digit() || b".-_".contains(&x)))
    {
        return false;
    }
    // Separators: ".", "_", "__" or "-"+; never ".." or "._" or "___".
    let mut sep = String::new();
    for ch in c.chars() {
        if ch.is_ascii_alphanumeric() {
            if !(sep.is_empty()
                || sep == "."
                || sep == "_"
                || sep == "__"
                || sep.chars().all(|x| x == '-'))
            {
                return false;
            }
            sep.clear();
        } else {
            sep.push(ch);
        }
    }
    true
}

fn valid_host(host: &str) -> bool {
    let (name, port) = match host.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((v6, port)) => {
                if v6.parse::<std::net::Ipv6Addr>().is_err() {
                    return false;
                }
                (None, port)
            }
            None => return false,
        },
        None => match host.rsplit_once(':') {
            Some((n, _)) => (Some(n), &host[n.len()..]),
            None => (Some(host), ""),
        },
    };
    if !port.is_empty() {
        match port.strip_prefix(':') {
            Some(p) if !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()) => {
                if p.parse::<u32>().map_or(true, |n| n == 0 || n > 65535) {
                    return false;
                }
            }
            _ => return false,
        }
    }
    match name {
        None => true,
        Some(n) => {
            !n.is_empty()
                && n.split('.').all(|label| {
                    let b = label.as_bytes();
                    !b.is_empty()
                        && b.len() <= 63
                        && b[0].is_ascii_alphanumeric()
                        && b[b.len() - 1].is_ascii_alphanumeric()
                        && b.iter().all(|x| x.is_ascii_alphanumeric() || *x == b'-')
                })
        }
    }
}

impl std::str::FromStr for Registry {
    type Err = anyhow::Error;

    /// `HOST[:PORT][/PATH]`. The host must read as a registry to Docker (a dot, a port, or
    /// `localhost`): otherwise Docker would take it for a namespace on Docker Hub.
    fn from_str(s: &str) -> anyhow::Result<Registry> {
        let hint = "give the registry as HOST[:PORT]/PATH, e.g. registry.example.com/berth or \
                    127.0.0.1:5000/berth";
        let s = s.trim();
        if s.is_empty() {
            bail!("the registry is empty: {hint}");
        }
        if let Some((scheme, _)) = s.split_once("://") {
            bail!(
                "registry {s:?}: no scheme ({scheme}://) — Docker speaks HTTPS to a registry, \
                 and plain HTTP to 127.0.0.0/8 and to the daemon's insecure-registries; {hint}"
            );
        }
        let s = s.trim_end_matches('/');
        let (host, path) = s.split_once('/').unwrap_or((s, ""));
        if !valid_host(host) {
            bail!(
                "registry {s:?}: {host:?} is not a host name or address with an optional port; {hint}"
            );
        }
        let bare = host.split(':').next().unwrap_or(host);
        if !(host.contains('.') || host.contains(':') || bare == "localhost") {
            bail!(
                "registry {s:?}: Docker would read {host:?} as a Docker Hub namespace, not a \
                 registry host — name one with a dot or a port (localhost:5000, \
                 registry.example.com); {hint}"
            );
        }
        if path.contains('@') || path.contains(':') {
            bail!(
                "registry {s:?}: the path {path:?} holds a tag or digest; the image's own tag is \
                 kept — {hint}"
            );
        }
        if let Some(bad) = path.split('/').find(|c| !valid_component(c))
            && !path.is_empty()
        {
            bail!(
                "registry {s:?}: path component {bad:?} is not a repository name component \
                 (lowercase letters and digits, `.`, `_` or `-` between them)"
            );
        }
        Ok(Registry {
            host: host.to_string(),
            path: path.to_string(),
        })
    }
}

/// `HOST/PATH/<name>` and `<tag>` for a local image: its last path component's name, its tag
/// (`latest` when it has none).
pub fn target(registry: &Registry, image_ref: &str) -> anyhow::Result<(String, String)> {
    if image_ref.contains('@') {
        bail!(
            "{image_ref:?} names a digest: push a tagged local image (as `berth image build` names it)"
        );
    }
    let last = image_ref.rsplit('/').next().unwrap_or(image_ref);
    let (name, tag) = match last.split_once(':') {
        Some((n, t)) => (n, t),
        None => (last, "latest"),
    };
    if !valid_component(name) {
        bail!("{image_ref:?}: {name:?} cannot be a repository name");
    }
    let tag_ok = !tag.is_empty()
        && tag.len() <= 128
        && tag.as_bytes()[0] != b'.'
        && tag.as_bytes()[0] != b'-'
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if !tag_ok {
        bail!("{image_ref:?}: {tag:?} is not a valid tag");
    }
    let repo = match registry.path.as_str() {
        "" => format!("{}/{name}", registry.host),
        p => format!("{}/{p}/{name}", registry.host),
    };
    if repo.len() > 255 {
        bail!("{repo}: a repository name is at most 255 characters");
    }
    Ok((repo, tag.to_string()))
}

/// The manifest digest in the daemon's last push status, `<tag>: digest: sha256:<hex> size: <n>`.
pub fn digest_in_status(status: &str) -> Option<String> {
    let rest = status.split_once("digest: ")?.1;
    let d = rest.split_whitespace().next()?;
    let hex = d.strip_prefix("sha256:")?;
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then(|| d.to_string())
}

/// The Docker CLI's `config.json`, the parts read here.
#[derive(Debug, Default, Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
    #[serde(default, rename = "credsStore")]
    creds_store: Option<String>,
    #[serde(default, rename = "credHelpers")]
    cred_helpers: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    identitytoken: Option<String>,
}

/// The host an `auths` key names: `https://host/v1/`, `http://host` and `host` are all `host`.
fn auths_host(key: &str) -> &str {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    k.split('/').next().unwrap_or(k)
}

/// Credentials for `host` from a `config.json`'s text. `Ok(None)`: none there (a credential
/// helper named for it is reported as a warning by the caller).
fn credentials_in(
    text: &str,
    host: &str,
) -> anyhow::Result<(Option<DockerCredentials>, Option<String>)> {
    let cfg: DockerConfig = serde_json::from_str(text).context("not a Docker config.json")?;
    let helper = cfg
        .cred_helpers
        .get(host)
        .cloned()
        .or(cfg.creds_store.clone());
    let Some((_, e)) = cfg.auths.iter().find(|(k, _)| auths_host(k) == host) else {
        return Ok((None, helper));
    };
    let mut c = DockerCredentials {
        serveraddress: Some(host.to_string()),
        ..Default::default()
    };
    if let Some(t) = e.identitytoken.as_ref().filter(|t| !t.is_empty()) {
        c.identitytoken = Some(t.clone());
        return Ok((Some(c), None));
    }
    if let Some(a) = e.auth.as_ref().filter(|a| !a.is_empty()) {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(a.trim())
            .context("the auth entry is not base64")?;
        let raw = String::from_utf8(raw).context("the auth entry is not UTF-8")?;
        let (u, p) = raw
            .split_once(':')
            .context("the auth entry is not user:password")?;
        c.username = Some(u.to_string());
        c.password = Some(p.to_string());
        return Ok((Some(c), None));
    }
    if let (Some(u), Some(p)) = (&e.username, &e.password) {
        c.username = Some(u.clone());
        c.password = Some(p.clone());
        return Ok((Some(c), None));
    }
    Ok((None, helper))
}

/// The Docker CLI's config file: `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`.
pub fn docker_config_path() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("DOCKER_CONFIG") {
        return Some(PathBuf::from(d).join("config.json"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".docker/config.json"))
}

/// How the push authenticates.
#[derive(Debug, Clone)]
pub enum Auth {
    /// `--username` and the password read from stdin.
    Given { username: String, password: String },
    /// The host's entry in the Docker CLI's config file, if any.
    DockerConfig,
}

fn credentials(auth: &Auth, host: &str) -> anyhow::Result<Option<DockerCredentials>> {
    match auth {
        Auth::Given { username, password } => Ok(Some(DockerCredentials {
            username: Some(username.clone()),
            password: Some(password.clone()),
            serveraddress: Some(host.to_string()),
            ..Default::default()
        })),
        Auth::DockerConfig => {
            let Some(path) = docker_config_path() else {
                return Ok(None);
            };
            let text = match std::fs::read_to_string(&path) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
            };
            let (c, helper) =
                credentials_in(&text, host).with_context(|| format!("{}", path.display()))?;
            if let (None, Some(h)) = (&c, helper) {
                eprintln!(
                    "warning: {} names the credential helper docker-credential-{h} for {host}; \
                     berth does not run credential helpers and pushes without credentials \
                     (use --username and --password-stdin)",
                    path.display()
                );
            }
            Ok(c)
        }
    }
}

/// What a push did.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Pushed {
    /// The local image pushed.
    pub image_ref: String,
    /// `HOST/PATH/<name>:<tag>`.
    pub pushed: String,
    /// `sha256:…`, the manifest's digest in the registry.
    pub digest: String,
    /// `HOST/PATH/<name>@sha256:…`: what a cluster should pull (`[kubernetes] image`).
    pub digest_ref: String,
    /// The local image's id (its config's digest, the same after a pull).
    pub image_id: String,
    pub seconds: f64,
}

/// Per-layer progress on one rewritten terminal line.
struct Progress {
    tty: bool,
    layers: BTreeMap<String, String>,
}

impl Progress {
    fn show(&mut self, id: Option<&str>, status: &str, detail: Option<(i64, i64)>) {
        if !self.tty {
            return;
        }
        let line = match detail {
            Some((cur, total)) if total > 0 => format!(
                "{status} {:.0}/{:.0} MB",
                cur as f64 / 1e6,
                total as f64 / 1e6
            ),
            _ => status.to_string(),
        };
        if let Some(id) = id {
            self.layers.insert(id.to_string(), line.clone());
        }
        let done = self
            .layers
            .values()
            .filter(|s| s.starts_with("Pushed") || s.starts_with("Layer already exists"))
            .count();
        let shown: String = format!(
            "  [{done}/{} layers] {}{line}",
            self.layers.len(),
            id.map(|i| format!("{i}: ")).unwrap_or_default()
        )
        .chars()
        .take(100)
        .collect();
        eprint!("\r\x1b[2K{shown}");
        let _ = std::io::stderr().flush();
    }

    fn end(&self) {
        if self.tty {
            eprint!("\r\x1b[2K");
            let _ = std::io::stderr().flush();
        }
    }
}

/// Tags `image_ref` into the registry and pushes it; the answer names the pushed digest.
pub async fn push(image_ref: &str, registry: &Registry, auth: &Auth) -> anyhow::Result<Pushed> {
    let started = Instant::now();
    let (repo, tag) = target(registry, image_ref)?;
    let creds = credentials(auth, &registry.host)?;
    let docker = connect().await?;
    let image_id = local_image_id(&docker, image_ref).await?;
    docker
        .tag_image(
            image_ref,
            Some(bollard::query_parameters::TagImageOptions {
                repo: Some(repo.clone()),
                tag: Some(tag.clone()),
            }),
        )
        .await
        .with_context(|| format!("tagging {image_ref} as {repo}:{tag}"))?;
    let digest = push_tagged(&docker, &repo, &tag, creds).await?;
    // The daemon records the digest on the image too (RepoDigests): the answer when the
    // status line did not carry it.
    let digest = match digest {
        Some(d) => d,
        None => docker
            .inspect_image(image_ref)
            .await
            .ok()
            .and_then(|i| i.repo_digests)
            .unwrap_or_default()
            .iter()
            .find_map(|r| r.strip_prefix(&format!("{repo}@")).map(str::to_string))
            .with_context(|| format!("the push of {repo}:{tag} ended without naming its digest"))?,
    };
    Ok(Pushed {
        image_ref: image_ref.to_string(),
        pushed: format!("{repo}:{tag}"),
        digest_ref: format!("{repo}@{digest}"),
        digest,
        image_id,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The local Docker daemon, speaking its API version.
async fn connect() -> anyhow::Result<Docker> {
    let docker = Docker::connect_with_socket_defaults().context("the Docker daemon's socket")?;
    let docker = tokio::time::timeout(Duration::from_secs(10), docker.negotiate_version())
        .await
        .map_err(|_| anyhow::anyhow!("the Docker daemon did not answer within 10 s"))?
        .context("the Docker daemon")?;
    Ok(docker)
}

/// The id of the local image `image_ref`; an error saying how to build it when there is none.
async fn local_image_id(docker: &Docker, image_ref: &str) -> anyhow::Result<String> {
    let local = match docker.inspect_image(image_ref).await {
        Ok(i) => i,
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => bail!(
            "no local image {image_ref}: build it with `berth image build` (its image_ref is \
             what to push)"
        ),
        Err(e) => return Err(e).context(format!("inspecting {image_ref}")),
    };
    Ok(local.id.unwrap_or_default())
}

/// Pushes `repo:tag`, showing its progress; the digest when a status line named it.
async fn push_tagged(
    docker: &Docker,
    repo: &str,
    tag: &str,
    creds: Option<DockerCredentials>,
) -> anyhow::Result<Option<String>> {
    let mut progress = Progress {
        tty: std::io::stderr().is_terminal(),
        layers: BTreeMap::new(),
    };
    let mut stream = docker.push_image(
        repo,
        Some(bollard::query_parameters::PushImageOptions {
            tag: Some(tag.to_string()),
            platform: None,
        }),
        creds,
    );
    let mut digest = None;
    while let Some(item) = stream.next().await {
        match item {
            Ok(info) => {
                let status = info.status.unwrap_or_default();
                if let Some(d) = digest_in_status(&status) {
                    digest = Some(d);
                }
                let detail = info
                    .progress_detail
                    .and_then(|d| Some((d.current?, d.total?)));
                progress.show(None, &status, detail);
            }
            Err(e) => {
                progress.end();
                let msg = match e {
                    bollard::errors::Error::DockerStreamError { error } => error,
                    bollard::errors::Error::DockerResponseServerError { message, .. } => message,
                    other => other.to_string(),
                };
                bail!("pushing {repo}:{tag}: {msg}");
            }
        }
    }
    progress.end();
    Ok(digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(s: &str) -> anyhow::Result<Registry> {
        s.parse()
    }

    #[test]
    fn registries_parse_or_say_why_not() {
        assert_eq!(
            reg("127.0.0.1:5000/berth").unwrap(),
            Registry {
                host: "127.0.0.1:5000".into(),
                path: "berth".into()
            }
        );
        assert_eq!(reg("registry.example.com/a/b-c/").unwrap().path, "a/b-c");
        assert_eq!(reg("localhost:5000").unwrap().path, "");
        assert_eq!(reg("localhost/x").unwrap().host, "localhost");
        assert_eq!(reg("[::1]:5000/x").unwrap().host, "[::1]:5000");
        for (bad, why) in [
            ("", "empty"),
            ("http://127.0.0.1:5000/berth", "no scheme"),
            ("berth/images", "Docker Hub namespace"),
            ("127.0.0.1:70000/x", "not a host"),
            ("127.0.0.1:/x", "not a host"),
            ("reg.example.com/Upper", "path component"),
            ("reg.example.com/a//b", "path component"),
            ("reg.example.com/a:tag", "tag or digest"),
            ("reg.example.com/a@sha256:00", "tag or digest"),
            ("-bad.example.com/x", "not a host"),
            ("[zz]:5000/x", "not a host"),
        ] {
            let e = reg(bad).expect_err(bad).to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }

    #[test]
    fn the_target_keeps_the_images_name_and_tag() {
        let r = reg("127.0.0.1:5000/team/berth").unwrap();
        assert_eq!(
            target(&r, "berth-desktop:0123abcd").unwrap(),
            (
                "127.0.0.1:5000/team/berth/berth-desktop".into(),
                "0123abcd".into()
            )
        );
        assert_eq!(
            target(&r, "other.example.com/x/berth-ide").unwrap(),
            (
                "127.0.0.1:5000/team/berth/berth-ide".into(),
                "latest".into()
            )
        );
        assert!(target(&r, "berth-ide@sha256:00").is_err());
        assert!(target(&r, "Berth:1").is_err());
        assert!(target(&r, "berth:-x").is_err());
    }

    #[test]
    fn the_digest_is_read_from_the_final_status() {
        let hex = "a".repeat(64);
        assert_eq!(
            digest_in_status(&format!("0123: digest: sha256:{hex} size: 528")),
            Some(format!("sha256:{hex}"))
        );
        assert_eq!(digest_in_status("Pushed"), None);
        assert_eq!(digest_in_status("x: digest: sha256:abc size: 1"), None);
    }

    #[test]
    fn docker_config_auths_are_read_by_host() {
        let b64 = base64::engine::general_purpose::STANDARD.encode("alice:s3cret");
        let text = format!(
            r#"{{"auths": {{"https://reg.example.com/v1/": {{"auth": "{b64}"}},
                "tok.example.com": {{"identitytoken": "T"}}}},
               "credHelpers": {{"gcr.io": "gcloud"}}}}"#
        );
        let (c, _) = credentials_in(&text, "reg.example.com").unwrap();
        let c = c.unwrap();
        assert_eq!(c.username.as_deref(), Some("alice"));
        assert_eq!(c.password.as_deref(), Some("s3cret"));
        assert_eq!(c.serveraddress.as_deref(), Some("reg.example.com"));
        let (c, _) = credentials_in(&text, "tok.example.com").unwrap();
        assert_eq!(c.unwrap().identitytoken.as_deref(), Some("T"));
        assert_eq!(
            credentials_in(&text, "gcr.io")
                .map(|(c, h)| (c.is_none(), h))
                .unwrap(),
            (true, Some("gcloud".into()))
        );
        assert!(credentials_in(&text, "127.0.0.1:5000").unwrap().0.is_none());
        assert!(credentials_in("{\"auths\": {\"h.io\": {\"auth\": \"!!\"}}}", "h.io").is_err());
        assert!(credentials_in("not json", "h.io").is_err());
    }
}
