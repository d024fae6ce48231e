//! The runnable blocks of the README and of the book (`docs/src/`), for the tests that run them
//! as written: a README section's or a chapter's fenced blocks, and `berth serve` started from
//! the README's own command line.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{wait_for, workspace_bin};

pub const README: &str = include_str!("../../README.md");

/// The text of the README's section headed `## {heading}`, to the next `## `.
pub fn section(heading: &str) -> &'static str {
    README
        .split(&format!("\n## {heading}\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("the README has a section {heading:?}"))
        .split("\n## ")
        .next()
        .unwrap()
}

/// The book's chapter `docs/src/{path}` (e.g. `controller/workpieces.md`), as it is on disk
/// when the test runs: the text a reader of the book runs.
pub fn chapter(path: &str) -> &'static str {
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs/src")
        .join(path);
    let text = std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("the book's chapter {}: {e}", file.display()));
    Box::leak(text.into_boxed_str())
}

/// The first fenced block of language `lang` in `text`, or after `<!-- {marker} -->` in it.
pub fn block(text: &str, lang: &str, marker: Option<&str>) -> String {
    let text = match marker {
        Some(m) => text
            .split(&format!("<!-- {m} -->"))
            .nth(1)
            .unwrap_or_else(|| panic!("the text marks a block {m:?}")),
        None => text,
    };
    let open = format!("```{lang}\n");
    let start = text.find(&open).unwrap_or_else(|| panic!("a {lang} block")) + open.len();
    let len = text[start..].find("\n```").expect("the block ends");
    text[start..start + len].to_string()
}

/// `berth serve` run by bash from the README's command line (the workspace's binaries first on
/// `PATH`), in its own process group. Dropped: deletes what it holds, then stops.
pub struct Served {
    child: Child,
    pub base: String,
    key: String,
}

impl Served {
    /// Runs `command` (a README line like `BERTH_API_KEYS=change-me berth serve --listen
    /// 127.0.0.1:8780`) with its data in `data`, and waits for `base`'s health.
    pub async fn start(command: &str, data: &Path, base: &str, key: &str) -> Served {
        let bin_dir = workspace_bin("berth").parent().unwrap().to_path_buf();
        let path = format!(
            "{}:{}",
            bin_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        std::fs::create_dir_all(data).unwrap();
        let log = std::fs::File::create(data.join("serve.log")).unwrap();
        use std::os::unix::process::CommandExt;
        let child = Command::new("bash")
            .args(["-c", command])
            .env("PATH", &path)
            .env("BERTH_DATA_DIR", data.join("data"))
            .env("BERTH_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("bash");
        let served = Served {
            child,
            base: base.to_string(),
            key: key.to_string(),
        };
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        wait_for(
            &format!("the controller at {base}"),
            Duration::from_secs(60),
            || async {
                let r = http.get(format!("{base}/healthz")).send().await.ok()?;
                r.status().is_success().then_some(())
            },
        )
        .await;
        served
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        // Whatever the test left (it may have failed half-way) is deleted before the controller
        // stops: a stopped controller leaves its sandboxes running for the next one to adopt.
        let script = format!(
            "k='X-Api-Key: {}'; u={}/sandbox/sandboxes/v1; \
             for id in $(curl -s -H \"$k\" $u | jq -r '.sandboxes[].id'); do \
             curl -s -o /dev/null -H \"$k\" -X DELETE $u/$id; done",
            self.key, self.base
        );
        let _ = Command::new("timeout")
            .args(["60", "bash", "-c", &script])
            .status();
        let pgid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
    }
}
