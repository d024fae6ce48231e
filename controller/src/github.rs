//! GitHub without tokens in the sandbox: `github_repositories` asks GitHub (from the
//! controller) which repositories the configured token reads; `github_clone_repository` runs
//! `git clone` in a sandbox behind the egress proxy after granting that sandbox the token for
//! that repository's paths alone (git over HTTPS and the repository's REST routes), so the
//! clone, later fetches, pushes and pull-request reads carry it and nothing else does.

use std::sync::Arc;
use std::time::Duration;

use berth_protocol::controller::{
    Command, GITHUB_INLINE_BYTES, GITHUB_MAX_ITEMS, GithubClone, GithubCloned, GithubComment,
    GithubFile, GithubIssue, GithubIssueList, GithubIssueSummary, GithubListQuery, GithubPull,
    GithubPullList, GithubPullSummary, GithubRepository, GithubRepositoryList, GithubText,
    RunRequest,
};
use berth_protocol::egress::{self, Egress, HostVerdict};
use serde_json::Value;

use crate::artifact::Artifacts;
use crate::config::GithubConfig;
use crate::ctx::Ctx;
use crate::egress::edge::{Credential, Edge};
use crate::error::{Error, Result};
use crate::run::Runs;
use crate::store::ArtifactKind;

/// One GitHub call's bound.
const CALL: Duration = Duration::from_secs(30);
/// Pages of 100 repositories read at most.
const PAGES: usize = 10;
/// How long a clone may run.
const CLONE_TIMEOUT_MS: u64 = 15 * 60 * 1000;
/// The error code of a read of a repository the sandbox did not clone.
pub const NOT_CLONED: &str = "github_repository_not_cloned";
/// The largest diff read (past it GitHub's answer is cut and the reader told).
const MAX_DIFF_BYTES: usize = 64 << 20;
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
        Ok(self.get_page(url).await?.0)
    }

    /// A JSON answer and whether GitHub has a next page (its `Link` header).
    async fn get_page<T: serde::de::DeserializeOwned>(&self, url: &str) -> Result<(T, bool)> {
        let resp = self.send(url, "application/vnd.github+json").await?;
        let next = resp
            .headers()
            .get_all(reqwest::header::LINK)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.contains("rel=\"next\""));
        let v = resp
            .json()
            .await
            .map_err(|e| Error::Upstream(format!("GitHub ({}): {}", self.api, plain(&e))))?;
        Ok((v, next))
    }

    /// A request's answer once it is a success: a 404 is `NotFound`, any other failure
    /// `Upstream`, each with the start of GitHub's message.
    async fn send(&self, url: &str, accept: &str) -> Result<reqwest::Response> {
        let resp = self
            .http
            .get(url)
            .bearer_auth(&self.token)
            .header("accept", accept)
            .header("x-github-api-version", "2022-11-28")
            .send()
            .await
            .map_err(|e| Error::Upstream(format!("GitHub ({}): {}", self.api, plain(&e))))?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let body = resp.text().await.unwrap_or_default();
        let body: String = body.chars().take(300).collect();
        let msg = format!("GitHub ({}) answered {status}: {body}", self.api);
        Err(match status {
            reqwest::StatusCode::NOT_FOUND => Error::NotFound(msg),
            _ => Error::Upstream(msg),
        })
    }

    /// A text answer (a diff) read up to [`MAX_DIFF_BYTES`]: its text and whether it was cut.
    async fn get_text(&self, url: &str, accept: &str) -> Result<(String, bool)> {
        let mut resp = self.send(url, accept).await?;
        let mut buf = Vec::new();
        let mut cut = false;
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| Error::Upstream(format!("GitHub ({}): {}", self.api, plain(&e))))?
        {
            if buf.len() + chunk.len() > MAX_DIFF_BYTES {
                buf.extend_from_slice(&chunk[..MAX_DIFF_BYTES - buf.len()]);
                cut = true;
                break;
            }
            buf.extend_from_slice(&chunk);
        }
        Ok((String::from_utf8_lossy(&buf).into_owned(), cut))
    }

    /// Every item of a list route, pages of 100, at most [`GITHUB_MAX_ITEMS`]; and whether
    /// there were more.
    async fn all(&self, url: &str) -> Result<(Vec<Value>, bool)> {
        let mut items = Vec::new();
        let pages = GITHUB_MAX_ITEMS.div_ceil(100);
        for page in 1..=pages {
            let (got, next): (Vec<Value>, bool) = self
                .get_page(&format!("{url}?per_page=100&page={page}"))
                .await?;
            items.extend(got);
            if !next {
                return Ok((items, false));
            }
        }
        let more = items.len() >= GITHUB_MAX_ITEMS;
        items.truncate(GITHUB_MAX_ITEMS);
        Ok((items, more))
    }

    /// `owner/name` when sandbox `id` cloned it (`github_clone_repository`), else 403.
    fn bound<'r>(ctx: &Ctx, id: &str, repository: &'r str) -> Result<(&'r str, &'r str)> {
        let (owner, name) = parse_repository(repository)?;
        let row = ctx.visible_row(id)?;
        let cloned = row
            .egress
            .as_ref()
            .map(|e| e.repositories.clone())
            .unwrap_or_default();
        let full = format!("{owner}/{name}");
        if !cloned.iter().any(|r| r.eq_ignore_ascii_case(&full)) {
            let have = match cloned.is_empty() {
                true => "none yet".to_string(),
                false => cloned.join(", "),
            };
            return Err(Error::Forbidden(
                NOT_CLONED,
                format!(
                    "sandbox {id} reads pull requests and issues only of the repositories cloned \
                     into it with github_clone_repository ({have}); {full} is not one"
                ),
            ));
        }
        Ok((owner, name))
    }

    fn repo_url(&self, owner: &str, name: &str) -> String {
        format!("{}/repos/{owner}/{name}", self.api)
    }

    /// A page of a bound repository's `what` (`pulls`, `issues`): the repository, the page,
    /// its size, the items and whether GitHub has a next page.
    async fn list(
        &self,
        ctx: &Ctx,
        id: &str,
        q: &GithubListQuery,
        what: &str,
    ) -> Result<(String, u32, u32, Vec<Value>, Option<u32>)> {
        let (owner, name) = Self::bound(ctx, id, &q.repository)?;
        let (state, page, per_page) = list_params(q)?;
        let url = format!(
            "{}/{what}?state={state}&page={page}&per_page={per_page}",
            self.repo_url(owner, name)
        );
        let (items, next): (Vec<Value>, bool) = self.get_page(&url).await?;
        let next = next.then_some(page + 1);
        Ok((format!("{owner}/{name}"), page, per_page, items, next))
    }

    /// `GET …/{id}/github/pulls`.
    pub async fn pulls(&self, ctx: &Ctx, id: &str, q: &GithubListQuery) -> Result<GithubPullList> {
        let (repository, page, per_page, items, next_page) = self.list(ctx, id, q, "pulls").await?;
        Ok(GithubPullList {
            repository,
            page,
            per_page,
            pulls: items.iter().map(pull_summary).collect(),
            next_page,
        })
    }

    /// `GET …/{id}/github/issues`.
    pub async fn issues(
        &self,
        ctx: &Ctx,
        id: &str,
        q: &GithubListQuery,
    ) -> Result<GithubIssueList> {
        let (repository, page, per_page, items, next_page) =
            self.list(ctx, id, q, "issues").await?;
        Ok(GithubIssueList {
            repository,
            page,
            per_page,
            issues: items.iter().map(issue_summary).collect(),
            next_page,
        })
    }

    /// `GET …/{id}/github/pulls/{number}`: the pull request, its diff, files, reviews and
    /// review comments; a large text kept as an artifact of the sandbox.
    pub async fn pull(
        &self,
        ctx: &Ctx,
        artifacts: &Artifacts,
        id: &str,
        repository: &str,
        number: u64,
    ) -> Result<GithubPull> {
        let (owner, name) = Self::bound(ctx, id, repository)?;
        let base = format!("{}/pulls/{number}", self.repo_url(owner, name));
        let v: Value = self.get(&base).await?;
        let (diff, diff_cut) = self.get_text(&base, "application/vnd.github.diff").await?;
        let (files, files_more) = self.all(&format!("{base}/files")).await?;
        let (reviews, reviews_more) = self.all(&format!("{base}/reviews")).await?;
        let (comments, comments_more) = self.all(&format!("{base}/comments")).await?;
        let full = format!("{owner}/{name}");
        let key = v["head"]["sha"]
            .as_str()
            .or(v["updated_at"].as_str())
            .unwrap_or_default()
            .to_string();
        let t = Texts {
            artifacts,
            sandbox: id,
            source: format!("github:{full}#pull/{number}@{key}"),
        };
        let mut truncated = Vec::new();
        for (cut, what) in [
            (diff_cut, "diff"),
            (files_more, "files"),
            (reviews_more, "reviews"),
            (comments_more, "review_comments"),
        ] {
            if cut {
                truncated.push(what.to_string());
            }
        }
        let mut out = GithubPull {
            repository: full,
            summary: pull_summary(&v),
            body: t.text("body", str_of(&v["body"])).await?,
            diff: t.text("diff", diff).await?,
            files: files.iter().map(file_of).collect(),
            reviews: Vec::with_capacity(reviews.len()),
            review_comments: Vec::with_capacity(comments.len()),
            truncated,
        };
        for r in &reviews {
            out.reviews.push(t.comment("review", r).await?);
        }
        for c in &comments {
            out.review_comments
                .push(t.comment("review-comment", c).await?);
        }
        Ok(out)
    }

    /// `GET …/{id}/github/issues/{number}`: the issue and its comments.
    pub async fn issue(
        &self,
        ctx: &Ctx,
        artifacts: &Artifacts,
        id: &str,
        repository: &str,
        number: u64,
    ) -> Result<GithubIssue> {
        let (owner, name) = Self::bound(ctx, id, repository)?;
        let base = format!("{}/issues/{number}", self.repo_url(owner, name));
        let v: Value = self.get(&base).await?;
        let (comments, more) = self.all(&format!("{base}/comments")).await?;
        let full = format!("{owner}/{name}");
        let t = Texts {
            artifacts,
            sandbox: id,
            source: format!(
                "github:{full}#issue/{number}@{}",
                v["updated_at"].as_str().unwrap_or_default()
            ),
        };
        let mut out = GithubIssue {
            repository: full,
            summary: issue_summary(&v),
            body: t.text("body", str_of(&v["body"])).await?,
            comment_list: Vec::with_capacity(comments.len()),
            truncated: if more {
                vec!["comments".into()]
            } else {
                vec![]
            },
        };
        for c in &comments {
            out.comment_list.push(t.comment("comment", c).await?);
        }
        Ok(out)
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

/// Where the large texts of one read go: artifacts of the sandbox, one per source (the same
/// pull request at the same head is kept once).
struct Texts<'a> {
    artifacts: &'a Artifacts,
    sandbox: &'a str,
    source: String,
}

impl Texts<'_> {
    /// `text` inline when small, else kept as an artifact with a preview.
    async fn text(&self, what: &str, text: String) -> Result<GithubText> {
        if text.len() <= GITHUB_INLINE_BYTES {
            return Ok(GithubText {
                text: Some(text),
                ..Default::default()
            });
        }
        let file = self.artifacts.artifact_scratch()?;
        let bytes = text.into_bytes();
        let preview = berth_protocol::exec::OutputPreview::of(&bytes, &bytes, bytes.len() as u64);
        tokio::fs::write(&file, &bytes)
            .await
            .map_err(|e| Error::Internal(format!("keeping a GitHub text: {e}")))?;
        let name = format!(
            "{}-{what}.{}",
            self.source
                .trim_start_matches("github:")
                .split('@')
                .next()
                .unwrap_or_default()
                .replace(['/', '#'], "-"),
            if what == "diff" { "diff" } else { "md" }
        );
        let row = self
            .artifacts
            .publish_file(
                self.sandbox,
                None,
                &name,
                "text/plain; charset=utf-8",
                ArtifactKind::Output,
                Some(&format!("{}/{what}", self.source)),
                &file,
            )
            .await?;
        Ok(GithubText {
            text: None,
            preview: Some(preview),
            href: Some(berth_protocol::routes::fill(
                berth_protocol::routes::controller::ARTIFACT,
                &[&row.id],
            )),
            artifact_id: Some(row.id),
        })
    }

    async fn comment(&self, what: &str, v: &Value) -> Result<GithubComment> {
        let id = v["id"].as_u64().unwrap_or_default();
        Ok(GithubComment {
            id,
            user: v["user"]["login"].as_str().map(str::to_string),
            body: self
                .text(&format!("{what}-{id}"), str_of(&v["body"]))
                .await?,
            state: v["state"].as_str().map(str::to_string),
            path: v["path"].as_str().map(str::to_string),
            line: v["line"].as_u64().or(v["original_line"].as_u64()),
            created_at: v["created_at"]
                .as_str()
                .or(v["submitted_at"].as_str())
                .map(str::to_string),
        })
    }
}

fn str_of(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

fn opt(v: &Value) -> Option<String> {
    v.as_str().map(str::to_string)
}

/// A list read's state, page and page size, checked (pure).
pub fn list_params(q: &GithubListQuery) -> Result<(&str, u32, u32)> {
    let state = q.state.as_deref().unwrap_or("open");
    if !matches!(state, "open" | "closed" | "all") {
        return Err(Error::BadRequest(format!(
            "state {state:?}: give open, closed or all"
        )));
    }
    let page = q.page.unwrap_or(1);
    let per_page = q.per_page.unwrap_or(30);
    if !(1..=1000).contains(&page) || !(1..=100).contains(&per_page) {
        return Err(Error::BadRequest(
            "page must be 1-1000 and per_page 1-100".into(),
        ));
    }
    Ok((state, page, per_page))
}

/// A pull request of GitHub's JSON as a list shows it (pure).
pub fn pull_summary(v: &Value) -> GithubPullSummary {
    GithubPullSummary {
        number: v["number"].as_u64().unwrap_or_default(),
        title: str_of(&v["title"]),
        state: str_of(&v["state"]),
        merged: v["merged"].as_bool().unwrap_or(false) || v["merged_at"].is_string(),
        draft: v["draft"].as_bool().unwrap_or(false),
        user: opt(&v["user"]["login"]),
        head: opt(&v["head"]["ref"]),
        base: opt(&v["base"]["ref"]),
        created_at: opt(&v["created_at"]),
        updated_at: opt(&v["updated_at"]),
        html_url: opt(&v["html_url"]),
    }
}

/// An issue of GitHub's JSON as a list shows it (pure).
pub fn issue_summary(v: &Value) -> GithubIssueSummary {
    GithubIssueSummary {
        number: v["number"].as_u64().unwrap_or_default(),
        title: str_of(&v["title"]),
        state: str_of(&v["state"]),
        user: opt(&v["user"]["login"]),
        labels: v["labels"]
            .as_array()
            .map(|ls| {
                ls.iter()
                    .filter_map(|l| l["name"].as_str().or(l.as_str()).map(str::to_string))
                    .collect()
            })
            .unwrap_or_default(),
        comments: v["comments"].as_u64().unwrap_or_default(),
        is_pull_request: v.get("pull_request").is_some_and(|p| !p.is_null()),
        created_at: opt(&v["created_at"]),
        updated_at: opt(&v["updated_at"]),
        html_url: opt(&v["html_url"]),
    }
}

fn file_of(v: &Value) -> GithubFile {
    GithubFile {
        filename: str_of(&v["filename"]),
        status: str_of(&v["status"]),
        additions: v["additions"].as_u64().unwrap_or_default(),
        deletions: v["deletions"].as_u64().unwrap_or_default(),
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
    fn github_json_reads_as_the_wire_shapes() {
        let pr = serde_json::json!({"number": 7, "title": "Fix", "state": "closed",
            "merged_at": "2026-01-01T00:00:00Z", "user": {"login": "octo"},
            "head": {"ref": "fix", "sha": "abc"}, "base": {"ref": "main"}});
        let s = pull_summary(&pr);
        assert_eq!(
            (s.number, s.merged, s.head.as_deref()),
            (7, true, Some("fix"))
        );
        let issue = serde_json::json!({"number": 3, "title": "Bug", "state": "open",
            "labels": [{"name": "bug"}], "comments": 2, "pull_request": {"url": "x"}});
        let i = issue_summary(&issue);
        assert!(i.is_pull_request);
        assert_eq!(i.labels, vec!["bug"]);
        let plain = issue_summary(&serde_json::json!({"number": 4, "pull_request": null}));
        assert!(!plain.is_pull_request);
        let q = |state: Option<&str>, page, per| GithubListQuery {
            repository: "o/r".into(),
            state: state.map(str::to_string),
            page,
            per_page: per,
        };
        assert_eq!(list_params(&q(None, None, None)).unwrap(), ("open", 1, 30));
        assert!(list_params(&q(Some("merged"), None, None)).is_err());
        assert!(list_params(&q(None, Some(0), None)).is_err());
        assert!(list_params(&q(None, None, Some(101))).is_err());
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
