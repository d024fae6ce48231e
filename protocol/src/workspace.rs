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

/// `GET /v1/git/diff` (and the session view's `api/diff/file`): one file's diff. With
/// `offset`, the part of it from that byte, at most `max_bytes` (default and at most
/// [`MAX_FILE_DIFF_BYTES`]) — how a huge diff is read.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DiffQuery {
    pub repo: String,
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
}

/// `GET /v1/git/diff?repo=&path=`: one file's unified diff from its repository's base.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct FileDiff {
    pub repo: String,
    pub path: String,
    pub binary: bool,
    /// Past [`MAX_FILE_DIFF_BYTES`]: not shown whole; `preview` holds its first and last
    /// lines and the rest is read by range (`offset`).
    pub huge: bool,
    /// The diff's size in bytes.
    pub bytes: u64,
    /// The whole diff, or with `offset` asked, its part from there.
    pub diff: Option<String>,
    /// The diff was longer than the agent reads (8 MiB): `bytes` counts what was read.
    pub truncated: bool,
    /// A huge diff's first and last lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview: Option<crate::exec::OutputPreview>,
    /// Where `diff`'s part starts when a range was asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
}

impl FileDiff {
    /// The diff of `text` as one answer shows it (pure): whole when small, a preview when
    /// huge, or the part `q` asks for (cut back to whole characters). A range that starts past
    /// the end is refused.
    pub fn shown(mut self, text: &str, q: &DiffQuery) -> Result<FileDiff, String> {
        self.bytes = text.len() as u64;
        if self.binary {
            return Ok(self);
        }
        self.huge = text.len() > MAX_FILE_DIFF_BYTES;
        let Some(offset) = q.offset else {
            match self.huge {
                true => {
                    self.preview = Some(crate::exec::OutputPreview::of(
                        text.as_bytes(),
                        text.as_bytes(),
                        self.bytes,
                    ))
                }
                false => self.diff = Some(text.to_string()),
            }
            return Ok(self);
        };
        if offset > self.bytes {
            return Err(format!(
                "offset {offset} is past the end of the diff ({} bytes)",
                self.bytes
            ));
        }
        let max = q
            .max_bytes
            .unwrap_or(MAX_FILE_DIFF_BYTES as u64)
            .clamp(1, MAX_FILE_DIFF_BYTES as u64);
        let mut start = offset as usize;
        while !text.is_char_boundary(start) {
            start -= 1;
        }
        let mut end = (start as u64 + max).min(self.bytes) as usize;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        self.diff = Some(text[start..end].to_string());
        self.offset = Some(start as u64);
        Ok(self)
    }
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

#[cfg(test)]
mod diff_tests {
    use super::*;

    fn blank() -> FileDiff {
        FileDiff {
            repo: "/home/u/r".into(),
            path: "a".into(),
            binary: false,
            huge: false,
            bytes: 0,
            diff: None,
            truncated: false,
            preview: None,
            offset: None,
        }
    }

    #[test]
    fn a_small_diff_is_whole_a_huge_one_a_preview_and_its_parts_read_by_range() {
        let q = DiffQuery::default();
        let small = blank().shown("+a\n", &q).unwrap();
        assert_eq!((small.diff.as_deref(), small.huge), (Some("+a\n"), false));
        let text: String = (0..100_000).map(|i| format!("+{i}\n")).collect();
        let huge = blank().shown(&text, &q).unwrap();
        assert!(huge.huge && huge.diff.is_none());
        assert_eq!(huge.preview.as_ref().unwrap().bytes, text.len() as u64);
        // Read whole by range, part after part.
        let mut read = String::new();
        while (read.len() as u64) < huge.bytes {
            let part = blank()
                .shown(
                    &text,
                    &DiffQuery {
                        offset: Some(read.len() as u64),
                        ..q.clone()
                    },
                )
                .unwrap();
            read += part.diff.as_deref().unwrap();
        }
        assert_eq!(read, text);
        let past = DiffQuery {
            offset: Some(text.len() as u64 + 1),
            ..q.clone()
        };
        assert!(
            blank()
                .shown(&text, &past)
                .unwrap_err()
                .contains("past the end")
        );
    }

    #[test]
    fn a_range_is_cut_to_whole_characters() {
        let q = DiffQuery {
            offset: Some(1),
            max_bytes: Some(2),
            ..Default::default()
        };
        // "é" is two bytes at 1..3: offset 1 is its start; 2 bytes end at 3.
        let d = blank().shown("aéb", &q).unwrap();
        assert_eq!((d.diff.as_deref(), d.offset), (Some("é"), Some(1)));
        let q = DiffQuery {
            offset: Some(2),
            max_bytes: Some(1),
            ..Default::default()
        };
        let d = blank().shown("aéb", &q).unwrap();
        assert_eq!((d.diff.as_deref(), d.offset), (Some(""), Some(1)));
        let bin = FileDiff {
            binary: true,
            ..blank()
        }
        .shown("Binary files", &q)
        .unwrap();
        assert!(bin.diff.is_none());
    }
}
