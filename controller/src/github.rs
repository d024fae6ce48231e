//! GitHub without tokens in the sandbox: `github_repositories` asks GitHub (from the
//! controller) which repositories the configured token reads; `github_clone_repository` runs
//! `git clone` in a sandbox behind the egress proxy after granting that sandbox the token for
//! that repository's paths alone (git over HTTPS and the repository's REST routes), so the
//! clone, later fetches, pushes and pull-request reads carry it and nothing else does.

use std::sync::Arc;
use std::time::Duration;

use berth_protocol::controller::{
    Command, GithubClone, GithubCloned, GithubRepository, GithubRepositoryList, RunRequest,
};
use berth_protocol::egress::{self, Egress, HostVerdict};

use crate::config::GithubConfig;
use crate::ctx::Ctx;
use crate::egress::edge::{Credential, Edge};
use crate::error::{Error, Result};
use crate::run::Runs;

/// One GitHub call's bound.
const CALL: Duration = Duration::from_secs(30);
/// Pages of 100 repositories read at most.
const PAGES: usize = 10;
/// How long a clone may run.
const CLONE_TIMEOUT_MS: u64 = 15 * 60 * 1000;
/// The user name GitHub takes with a token for git over HTTPS.
const GIT_USER: &str = "x-access-token";

pub struct Github {
    host: String,
    api: String,
    token: String,
    edge: Arc<Edge>,
    http: reqwest::Client,
}

impl std::fmt::Debug for Github {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Github")
            .field("host", &self.host)
            .field("api", &self.api)
            .finish_non_exhaustive()
    }
}

impl Github {
    /// From `[egress.github]`: the token read now; the controller's own calls resolve
    /// `[egress.hosts]` names and trust `[egress] upstream_ca` like the proxy does.
    pub fn new(
        config: &GithubConfig,
        egress: &crate::config::EgressConfig,
        edge: Arc<Edge>,
    ) -> anyhow::Result<Github> {
        let token = crate::config::read_secret(
            config.secret.as_deref(),
            config.secret_file.as_deref(),
            "[egress.github]",
        )?;
        let api = config.api_base();
        anyhow::ensure!(
            api.starts_with("https://"),
            "[egress.github] api: {api} is not an https:// URL"
        );
        let mut b = reqwest::Client::builder().timeout(CALL).user_agent("berth");
        for (name, ips) in &egress.hosts {
            for ip in ips {
                b = b.resolve(name, std::net::SocketAddr::new(*ip, 443));
            }
        }
        for f in &egress.upstream_ca {
            let pem = std::fs::read(f)
                .map_err(|e| anyhow::anyhow!("[egress] upstream_ca: {}: {e}", f.display()))?;
            b = b.add_root_certificate(reqwest::Certificate::from_pem(&pem)?);
        }
        Ok(Github {
            host: egress::normalise(&config.host),
            api,
            token,
            edge,
            http: b.build()?,
        })
    }

    /// The repositories the token reads, by `owner/name`.
    pub async fn repositories(&self) -> Result<GithubRepositoryList> {
        let mut repositories = Vec::new();
        for page in 1..=PAGES {
            let url = format!(
                "{}/user/repos?per_page=100&page={page}&sort=full_name",
                self.api
            );
            let got: Vec<GithubRepository> = self.get(&url).await?;
            let last = got.len() < 100;
            repositories.extend(got);
            if last {
                break;
            }
        }
        Ok(GithubRepositoryList { repositories })
    }

    async fn get<T: serde::de::DeserializeOwned>(&self, url: &str) -> Result<T> {
        let resp = self
            .http
            .get(url)
            .bearer_auth(&self.token)
            .header("accept", "application/vnd.github+json")
            .header("x-github-api-version", "2022-11-28")
            .send()
            .await
            .map_err(|e| Error::Upstream(format!("GitHub ({}): {}", self.api, plain(&e))))?;
        let status = resp.status();
        if !status.is_success() {
            let body = resp.text().await.unwrap_or_default();
            let body: String = body.chars().take(300).collect();
            return Err(Error::Upstream(format!(
                "GitHub ({}) answered {status}: {body}",
                self.api
            )));
        }
        resp.json()
            .await
            .map_err(|e| Error::Upstream(format!("GitHub ({}): {}", self.api, plain(&e))))
    }

    /// Clones `req.repository` into sandbox `id` through the proxy, with the token added there.
    pub async fn clone_repository(
        &self,
        ctx: &Ctx,
        runs: &Arc<Runs>,
        id: &str,
        req: GithubClone,
    ) -> Result<GithubCloned> {
        let (owner, name) = parse_repository(&req.repository)?;
        let path = clone_path(req.path.as_deref(), name)?;
        let row = ctx.visible_row(id)?;
        let policy = row.egress.as_ref().map(|e| e.policy.clone());
        if let Some(why) = not_through_proxy(policy.as_ref(), &self.host) {
            return Err(Error::Conflict(format!("sandbox {id}: {why}")));
        }
        let full = format!("{owner}/{name}");
        self.grant(id, owner, name);
        ctx.store.edit_egress(id, |r| {
            if !r.repositories.iter().any(|x| x.eq_ignore_ascii_case(&full)) {
                r.repositories.push(full.clone());
            }
        })?;
        let url = format!("https://{}/{owner}/{name}.git", self.host);
        let mut argv = vec!["git".to_string(), "clone".into()];
        if let Some(b) = &req.branch {
            check_ref(b)?;
            argv.extend(["--branch".into(), b.clone()]);
        }
        if let Some(d) = req.depth {
            argv.extend(["--depth".into(), d.max(1).to_string()]);
        }
        argv.extend(["--".into(), url, path.clone()]);
        let run = runs
            .exec(
                id,
                RunRequest {
                    command: Command::Argv(argv),
                    env: [("GIT_TERMINAL_PROMPT".to_string(), "0".to_string())].into(),
                    timeout_ms: Some(CLONE_TIMEOUT_MS),
                    wait: Some(true),
                    ..Default::default()
                },
            )
            .await?;
        if run.exit_code != Some(0) {
            let tail: String = run
                .stderr
                .chars()
                .rev()
                .take(2000)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            return Err(Error::Upstream(format!(
                "git clone of {full} failed ({}, run {}): {}",
                run.exit_code
                    .map_or("no exit code".to_string(), |c| format!("exit {c}")),
                run.id,
                tail.trim()
            )));
        }
        Ok(GithubCloned {
            repository: full,
            path,
            run,
        })
    }

    /// The token for `owner/name`'s git paths (basic authentication, as GitHub takes it for
    /// git) and its REST routes (a bearer token), for sandbox `id` only.
    pub fn grant(&self, id: &str, owner: &str, name: &str) {
        let git = crate::egress::basic(GIT_USER, &self.token);
        let mut creds = Vec::new();
        if let Ok(mut c) = Credential::new(&self.host, "Authorization", &git) {
            c.paths = git_paths(owner, name);
            creds.push(c);
        }
        if let Some((api_host, base)) = split_api(&self.api)
            && let Ok(mut c) = Credential::new(
                &api_host,
                "Authorization",
                &format!("Bearer {}", self.token),
            )
        {
            c.paths = vec![format!("{base}/repos/{owner}/{name}/")];
            creds.push(c);
        }
        self.edge.grant(id, creds);
    }
}

/// A reqwest error's chain without the URL repeated.
fn plain(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(x) = src {
        s = format!("{s}: {x}");
        src = x.source();
    }
    s
}

/// The paths of a repository's git smart-HTTP protocol (with and without `.git`).
pub fn git_paths(owner: &str, name: &str) -> Vec<String> {
    vec![
        format!("/{owner}/{name}.git/"),
        format!("/{owner}/{name}/info/refs"),
        format!("/{owner}/{name}/git-upload-pack"),
        format!("/{owner}/{name}/git-receive-pack"),
    ]
}

/// The API's host and path (`https://h/api/v3` → `h`, `/api/v3`).
fn split_api(api: &str) -> Option<(String, String)> {
    let rest = api.strip_prefix("https://")?;
    let (host, base) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    let host = egress::host_of(host);
    Some((host.to_string(), base.to_string()))
}

fn name_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 100
        && !s.starts_with(['.', '-'])
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// `owner/name` (a trailing `.git` dropped).
pub fn parse_repository(r: &str) -> Result<(&str, &str)> {
    let bad = || {
        Error::BadRequest(format!(
            "repository {r:?}: give owner/name (letters, digits, '-', '_', '.')"
        ))
    };
    let (owner, name) = r.trim().split_once('/').ok_or_else(bad)?;
    let name = name.strip_suffix(".git").unwrap_or(name);
    if !name_ok(owner) || !name_ok(name) {
        return Err(bad());
    }
    Ok((owner, name))
}

/// Where a clone goes: `path` as given (no `..`, no leading `-`), else the repository's name.
fn clone_path(path: Option<&str>, name: &str) -> Result<String> {
    let Some(p) = path else {
        return Ok(name.to_string());
    };
    if p.is_empty() || p.starts_with('-') || p.split('/').any(|s| s == "..") || p.contains('\0') {
        return Err(Error::BadRequest(format!(
            "path {p:?}: give a directory (relative to the sandbox's working directory, or \
             absolute) without '..'"
        )));
    }
    Ok(p.to_string())
}

fn check_ref(b: &str) -> Result<()> {
    if b.is_empty() || b.starts_with('-') || b.contains("..") || b.bytes().any(|c| c <= b' ') {
        return Err(Error::BadRequest(format!("branch {b:?} is not a ref name")));
    }
    Ok(())
}

/// Why a sandbox's traffic to `host` would not pass the proxy (so no token could be added).
pub fn not_through_proxy(policy: Option<&Egress>, host: &str) -> Option<String> {
    match policy {
        None | Some(Egress::Mode(egress::EgressMode::Open)) => Some(format!(
            "its egress is open: its traffic does not pass the egress proxy, so the token \
             cannot be added there; create it with an egress allow list naming {host}"
        )),
        Some(p) => match egress::host_verdict(p, host) {
            HostVerdict::Deny(d) => Some(format!(
                "its egress policy refuses {host} ({}); allow it to clone from it",
                d.as_str()
            )),
            _ => None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::edge::path_under;

    #[test]
    fn repositories_are_owner_and_name() {
        assert_eq!(parse_repository("o/r.git").unwrap(), ("o", "r"));
        assert_eq!(
            parse_repository("Org-1/re_po.x").unwrap(),
            ("Org-1", "re_po.x")
        );
        for bad in [
            "o", "/r", "o/", "o/r/x", "../r", "o/..", "o/.r", "o r/x", "o/r?x",
        ] {
            assert!(parse_repository(bad).is_err(), "{bad}");
        }
        assert!(clone_path(Some("../x"), "r").is_err());
        assert!(clone_path(Some("-x"), "r").is_err());
        assert_eq!(clone_path(None, "r").unwrap(), "r");
        assert!(check_ref("--upload-pack=x").is_err());
        assert!(check_ref("main").is_ok());
    }

    #[test]
    fn the_token_is_bound_to_the_repository_cloned() {
        let paths = git_paths("o", "r");
        let under = |p: &str| paths.iter().any(|x| path_under(p, x));
        assert!(under("/o/r.git/info/refs?service=git-upload-pack"));
        assert!(under("/O/R.git/git-receive-pack"));
        assert!(under("/o/r/info/refs"));
        assert!(!under("/o/r2.git/info/refs"));
        assert!(!under("/o/r.git2/info/refs"));
        assert!(!under("/o/r.git/../../x/y.git/info/refs"));
        assert!(!under("/o/r.git/%2e%2e/%2e%2e/x/y.git/info/refs"));
        assert!(!under("/other/r.git/info/refs"));
        assert_eq!(
            split_api("https://api.github.com"),
            Some(("api.github.com".into(), String::new()))
        );
        assert_eq!(
            split_api("https://ghe.test:8443/api/v3/"),
            Some(("ghe.test".into(), "/api/v3".into()))
        );
    }

    #[test]
    fn a_clone_needs_the_host_through_the_proxy() {
        use berth_protocol::egress::{EgressMode, EgressRules};
        let rules = |a: &[&str]| {
            Egress::Rules(EgressRules {
                allow: a.iter().map(|s| s.to_string()).collect(),
                deny_private: true,
            })
        };
        assert!(not_through_proxy(None, "github.com").is_some());
        assert!(not_through_proxy(Some(&Egress::Mode(EgressMode::Open)), "github.com").is_some());
        assert!(not_through_proxy(Some(&Egress::Mode(EgressMode::None)), "github.com").is_some());
        assert!(not_through_proxy(Some(&rules(&["pypi.org"])), "github.com").is_some());
        assert!(not_through_proxy(Some(&rules(&["github.com"])), "github.com").is_none());
    }
}
