//! What the session view's panes show of a sandbox's workspace: its browser's tabs and the
//! changes in its git repositories (the agent's `/v1/browser/tabs` and `/v1/git/*`), live or
//! as the controller kept them when the sandbox ended.

use serde::{Deserialize, Serialize};

/// How deep below the working directory the agent looks for repositories.
pub const REPO_DEPTH: usize = 4;
/// The most repositories one answer lists.
pub const MAX_REPOS: usize = 20;
/// The most changed files one repository lists.
pub const MAX_FILES: usize = 500;
/// The most commits one repository lists.
pub const MAX_COMMITS: usize = 50;
/// A file's diff past this many bytes is named, not shown.
pub const MAX_FILE_DIFF_BYTES: usize = 512 << 10;
/// The most tabs an answer lists.
pub const MAX_TABS: usize = 100;

/// One tab of the sandbox's browser.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct BrowserTab {
    pub id: String,
    pub title: String,
    pub url: String,
    /// The tab the browser shows (its page is visible).
    pub active: bool,
}

/// `GET /v1/browser/tabs`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct BrowserTabs {
    pub tabs: Vec<BrowserTab>,
}

/// A commit of a repository past its base.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct GitCommit {
    pub sha: String,
    pub subject: String,
    pub author: String,
    /// RFC 3339.
    pub at: String,
}

/// A file changed since the base (committed or not).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct GitFile {
    pub path: String,
    /// `added`, `modified`, `deleted`, `renamed` or `untracked`.
    pub status: String,
    pub added: Option<u64>,
    pub removed: Option<u64>,
    pub binary: bool,
    /// The file's size in the working tree (absent when deleted).
    pub bytes: Option<u64>,
}

/// One repository under the working directory.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct GitRepo {
    /// Its directory, absolute.
    pub path: String,
    pub branch: Option<String>,
    pub head: Option<String>,
    /// What the changes are measured from: the upstream's merge base, else `HEAD`.
    pub base: Option<String>,
    /// `origin/main` or `HEAD`.
    pub base_name: String,
    pub remote: Option<String>,
    pub commits: Vec<GitCommit>,
    pub files: Vec<GitFile>,
    /// Set when the repository could not be read whole.
    pub error: Option<String>,
}

/// `GET /v1/git/repos`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct GitRepos {
    /// The directory searched (the sandbox user's working directory).
    pub root: String,
    pub repos: Vec<GitRepo>,
}

/// `GET /v1/git/diff?repo=&path=`: one file's unified diff from its repository's base.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct FileDiff {
    pub repo: String,
    pub path: String,
    pub binary: bool,
    /// Past [`MAX_FILE_DIFF_BYTES`]: named, not shown.
    pub huge: bool,
    /// The diff's size in bytes.
    pub bytes: u64,
    pub diff: Option<String>,
    pub truncated: bool,
}

/// A path below a repository, checked: relative, no `..`, no NUL.
pub fn repo_relative(path: &str) -> Result<&str, String> {
    let ok = !path.is_empty()
        && !path.starts_with('/')
        && !path.contains('\0')
        && path
            .split('/')
            .all(|s| !s.is_empty() && s != "." && s != "..");
    if ok {
        Ok(path)
    } else {
        Err(format!(
            "path {path:?} must be a file's path inside the repository"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_paths_stay_inside() {
        assert_eq!(repo_relative("src/a.rs"), Ok("src/a.rs"));
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a//b",
            "a\0b",
            "./a",
        ] {
            assert!(repo_relative(bad).is_err(), "{bad:?}");
        }
    }
}
