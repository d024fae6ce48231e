//! `/v1/git/*`: the git repositories under the sandbox user's working directory and what
//! changed in each since its base (the upstream's merge base, else `HEAD`): commits, files
//! changed with their line counts, and one file's unified diff at a time. Git runs as the
//! sandbox user, bounded in time and output.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{Query, State};
use berth_protocol::workspace::{
    DiffQuery, FileDiff, GitCommit, GitFile, GitRepo, GitRepos, MAX_COMMITS, MAX_FILES, MAX_REPOS,
    REPO_DEPTH, repo_relative,
};

use crate::Agent;
use crate::http::error::ApiError;

const GIT_TIMEOUT: Duration = Duration::from_secs(10);
const GIT_OUTPUT: usize = 8 << 20;

/// One git (or find) run as the sandbox user: its stdout, or its stderr as the error.
async fn run(agent: &Agent, args: &[&str]) -> Result<String, String> {
    let program = args.iter().map(|s| s.to_string()).collect();
    let out = agent
        .commands
        .tool_output(program, None, GIT_TIMEOUT, GIT_OUTPUT)
        .await
        .map_err(|e| e.to_string())?;
    if out.timed_out {
        return Err(format!("{} timed out", args.join(" ")));
    }
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if stdout.is_empty() && !out.stderr.is_empty() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    Ok(stdout)
}

async fn git(agent: &Agent, repo: &str, args: &[&str]) -> Result<String, String> {
    let mut all = vec!["git", "-C", repo, "-c", "core.quotepath=off"];
    all.extend_from_slice(args);
    run(agent, &all).await
}

/// The repositories below `root` (its `.git` directories' parents), nearest first.
async fn discover(agent: &Agent, root: &Path) -> Vec<String> {
    let depth = (REPO_DEPTH + 1).to_string();
    let root_s = root.display().to_string();
    let found = run(
        agent,
        &[
            "find",
            &root_s,
            "-maxdepth",
            &depth,
            "(",
            "-name",
            "node_modules",
            "-o",
            "-name",
            ".cache",
            ")",
            "-prune",
            "-o",
            "-name",
            ".git",
            "-print",
        ],
    )
    .await
    .unwrap_or_default();
    let mut repos: Vec<String> = found
        .lines()
        .filter_map(|l| l.strip_suffix("/.git"))
        .map(str::to_string)
        .collect();
    repos.sort_by_key(|r| (r.matches('/').count(), r.clone()));
    repos.truncate(MAX_REPOS);
    repos
}

/// The base the changes are measured from: the upstream's merge base, else `HEAD`.
async fn base(agent: &Agent, repo: &str) -> (Option<String>, String) {
    if let Ok(up) = git(agent, repo, &["rev-parse", "--abbrev-ref", "@{upstream}"]).await {
        let up = up.trim().to_string();
        if let Ok(b) = git(agent, repo, &["merge-base", "HEAD", "@{upstream}"]).await
            && !b.trim().is_empty()
        {
            return (Some(b.trim().to_string()), up);
        }
    }
    let head = git(agent, repo, &["rev-parse", "--verify", "-q", "HEAD"])
        .await
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty());
    (head, "HEAD".into())
}

/// `git diff --name-status -z` and `--numstat -z` from `base`, and the untracked files, as
/// the pane's file list (pure).
pub fn files_of(name_status: &str, numstat: &str, untracked: &str) -> Vec<GitFile> {
    let mut counts = std::collections::HashMap::new();
    let mut it = numstat.split('\0');
    while let Some(rec) = it.next() {
        let mut f = rec.splitn(3, '\t');
        let (Some(a), Some(r), Some(p)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        // A rename's record is `a\tr\t` followed by the old and the new path.
        let path = if p.is_empty() {
            it.next();
            it.next().unwrap_or_default()
        } else {
            p
        };
        counts.insert(path.to_string(), (a.parse().ok(), r.parse().ok(), a == "-"));
    }
    let mut out = Vec::new();
    let mut it = name_status.split('\0').filter(|s| !s.is_empty());
    while let Some(code) = it.next() {
        let status = match code.chars().next() {
            Some('A') => "added",
            Some('D') => "deleted",
            Some('R') | Some('C') => {
                it.next();
                "renamed"
            }
            _ => "modified",
        };
        let Some(path) = it.next() else { break };
        let (added, removed, binary) = counts.get(path).cloned().unwrap_or((None, None, false));
        out.push(GitFile {
            path: path.to_string(),
            status: status.into(),
            added,
            removed,
            binary,
            bytes: None,
        });
    }
    for p in untracked.split('\0').filter(|s| !s.is_empty()) {
        out.push(GitFile {
            path: p.to_string(),
            status: "untracked".into(),
            added: None,
            removed: None,
            binary: false,
            bytes: None,
        });
    }
    out.truncate(MAX_FILES);
    out
}

/// `git log` records (`%H %s %an %aI`, unit-separated) as commits (pure).
pub fn commits_of(log: &str) -> Vec<GitCommit> {
    log.lines()
        .filter_map(|l| {
            let mut f = l.split('\u{1f}');
            Some(GitCommit {
                sha: f.next()?.to_string(),
                subject: f.next()?.to_string(),
                author: f.next()?.to_string(),
                at: f.next()?.to_string(),
            })
        })
        .take(MAX_COMMITS)
        .collect()
}

async fn repo(agent: &Agent, path: String) -> GitRepo {
    let (base_sha, base_name) = base(agent, &path).await;
    let trimmed = |r: Result<String, String>| {
        r.ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    let branch = trimmed(git(agent, &path, &["rev-parse", "--abbrev-ref", "HEAD"]).await);
    let head = trimmed(git(agent, &path, &["rev-parse", "--verify", "-q", "HEAD"]).await);
    let remote = trimmed(git(agent, &path, &["config", "--get", "remote.origin.url"]).await);
    let b = base_sha.clone().unwrap_or_else(|| "HEAD".into());
    let mut error = None;
    let commits = match (&base_sha, &head) {
        (Some(bs), Some(h)) if bs != h => {
            let range = format!("{bs}..HEAD");
            let log = git(
                agent,
                &path,
                &["log", "--format=%H%x1f%s%x1f%an%x1f%aI", "-n", "50", &range],
            )
            .await;
            commits_of(&log.unwrap_or_default())
        }
        _ => Vec::new(),
    };
    let (ns, num, untracked) = if base_sha.is_some() {
        let ns = git(agent, &path, &["diff", "--name-status", "-z", "-M", &b]).await;
        let num = git(agent, &path, &["diff", "--numstat", "-z", "-M", &b]).await;
        (
            ns,
            num,
            git(
                agent,
                &path,
                &["ls-files", "--others", "--exclude-standard", "-z"],
            )
            .await,
        )
    } else {
        // No commit yet: everything is untracked or staged.
        let st = git(
            agent,
            &path,
            &[
                "ls-files",
                "--others",
                "--cached",
                "--exclude-standard",
                "-z",
            ],
        )
        .await;
        (Ok(String::new()), Ok(String::new()), st)
    };
    if let Err(e) = ns.as_ref().and(num.as_ref()).and(untracked.as_ref()) {
        error = Some(e.clone());
    }
    let mut files = files_of(
        &ns.unwrap_or_default(),
        &num.unwrap_or_default(),
        &untracked.unwrap_or_default(),
    );
    for f in &mut files {
        f.bytes = std::fs::metadata(Path::new(&path).join(&f.path))
            .ok()
            .map(|m| m.len());
    }
    GitRepo {
        path,
        branch,
        head,
        base: base_sha,
        base_name,
        remote,
        commits,
        files,
        error,
    }
}

/// `GET /v1/git/repos`.
pub async fn repos(State(agent): State<Arc<Agent>>) -> Json<GitRepos> {
    let root = agent.home.clone();
    let mut repos = Vec::new();
    for path in discover(&agent, &root).await {
        repos.push(repo(&agent, path).await);
    }
    Json(GitRepos {
        root: root.display().to_string(),
        repos,
    })
}

/// A repository the caller names: a directory below the home holding `.git`.
fn checked_repo(home: &Path, repo: &str) -> Result<PathBuf, ApiError> {
    let p = PathBuf::from(repo);
    let inside = p.is_absolute()
        && p.starts_with(home)
        && !p
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir));
    if !inside || !p.join(".git").exists() {
        return Err(ApiError::not_found(format!(
            "no repository {repo:?} under {}",
            home.display()
        )));
    }
    Ok(p)
}

/// `GET /v1/git/diff?repo=&path=`.
pub async fn diff(
    State(agent): State<Arc<Agent>>,
    Query(q): Query<DiffQuery>,
) -> Result<Json<FileDiff>, ApiError> {
    let repo_dir = checked_repo(&agent.home, &q.repo)?;
    let file = repo_relative(&q.path).map_err(ApiError::bad_request)?;
    let repo_s = repo_dir.display().to_string();
    let (base_sha, _) = base(&agent, &repo_s).await;
    let tracked = git(
        &agent,
        &repo_s,
        &["ls-files", "--error-unmatch", "--", file],
    )
    .await
    .is_ok();
    let text = match (&base_sha, tracked) {
        (Some(b), true) => {
            git(
                &agent,
                &repo_s,
                &["diff", "--no-color", "-M", b, "--", file],
            )
            .await
        }
        _ => {
            git(
                &agent,
                &repo_s,
                &["diff", "--no-color", "--no-index", "--", "/dev/null", file],
            )
            .await
        }
    }
    .map_err(|e| ApiError::bad_request(format!("git diff: {e}")))?;
    let binary = text
        .lines()
        .take(8)
        .any(|l| l.starts_with("Binary files ") || l == "GIT binary patch");
    let blank = FileDiff {
        repo: repo_s,
        path: file.to_string(),
        binary,
        huge: false,
        bytes: 0,
        diff: None,
        truncated: text.len() >= GIT_OUTPUT,
        preview: None,
        offset: None,
    };
    Ok(Json(blank.shown(&text, &q).map_err(ApiError::bad_request)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_status_numstat_and_untracked_make_the_file_list() {
        let ns = "M\0a.txt\0A\0bin.dat\0R100\0old.txt\0new.txt\0D\0gone.txt\0";
        let num =
            "2\t1\ta.txt\x00-\t-\tbin.dat\x000\t0\t\x00old.txt\x00new.txt\x000\t3\tgone.txt\x00";
        let files = files_of(ns, num, "notes.txt\0");
        let view: Vec<_> = files
            .iter()
            .map(|f| {
                (
                    f.path.as_str(),
                    f.status.as_str(),
                    f.added,
                    f.removed,
                    f.binary,
                )
            })
            .collect();
        assert_eq!(
            view,
            [
                ("a.txt", "modified", Some(2), Some(1), false),
                ("bin.dat", "added", None, None, true),
                ("new.txt", "renamed", Some(0), Some(0), false),
                ("gone.txt", "deleted", Some(0), Some(3), false),
                ("notes.txt", "untracked", None, None, false),
            ]
        );
    }

    #[test]
    fn log_lines_become_commits() {
        let log = "abc\u{1f}Add x\u{1f}Ada\u{1f}2026-12-07T01:00:00+00:00\nbroken line\n";
        let c = commits_of(log);
        assert_eq!(c.len(), 1);
        assert_eq!((c[0].sha.as_str(), c[0].subject.as_str()), ("abc", "Add x"));
    }

    #[test]
    fn only_repositories_below_the_home_are_read() {
        let home = tempfile::tempdir().unwrap();
        let r = home.path().join("work/demo");
        std::fs::create_dir_all(r.join(".git")).unwrap();
        assert!(checked_repo(home.path(), &r.display().to_string()).is_ok());
        assert!(checked_repo(home.path(), "/etc").is_err());
        let up = format!("{}/work/../..", home.path().display());
        assert!(checked_repo(home.path(), &up).is_err());
        assert!(
            checked_repo(home.path(), &home.path().join("work").display().to_string()).is_err()
        );
    }
}
