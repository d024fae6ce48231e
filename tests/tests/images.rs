//! The `desktop` image: built from images/recipes.toml with berth-agent baked in as PID 1,
//! named by content, and working inside a real Docker container the way OSWorld's harness uses
//! it. `tests/test.sh` builds the image once before the tests; here a build finds it.

use std::process::Command;
use std::time::Duration;

use berth_tests::{TOKEN, wait_for};
use serde_json::Value;

fn build() -> Value {
    berth_tests::controller::build_desktop_image().unwrap()
}

/// A detached container of the image, removed on drop.
struct Container(String);

impl Container {
    fn run(image: &str, cmd: &[&str]) -> Container {
        let out = Command::new("docker")
            .args(["run", "-d", "--label", "berth.test=images"])
            .args(["-p", "127.0.0.1::5000", "-p", "127.0.0.1::9222"])
            .args([
                "-e",
                &format!("BERTH_AGENT_TOKEN={TOKEN}"),
                "--shm-size",
                "512m",
            ])
            .arg(image)
            .args(cmd)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Container(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    fn port(&self, inner: u16) -> String {
        let out = Command::new("docker")
            .args(["port", &self.0, &inner.to_string()])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        format!("http://{}", text.lines().next().unwrap().trim())
    }

    fn logs(&self) -> String {
        let out = Command::new("docker")
            .args(["logs", &self.0])
            .output()
            .unwrap();
        berth_tests::output_text(&out)
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rm", "-f", &self.0]).output();
    }
}

#[tokio::test]
async fn identical_inputs_give_the_identical_image_ref_and_a_built_image_is_found_in_seconds() {
    let a = build();
    let b = build();
    assert_eq!(a["image_ref"], b["image_ref"]);
    assert_eq!(b["built"], false);
    assert!(b["seconds"].as_f64().unwrap() < 10.0, "{b}");
    assert!(
        a["image_ref"]
            .as_str()
            .unwrap()
            .starts_with("berth-desktop:")
    );
    assert!(b["size_bytes"].as_u64().unwrap() > 100_000_000);
    // The seed's name builds the same recipe: the same image, found.
    let seed = berth_tests::controller::build_image(&["--profile", "desktop-ubuntu"]).unwrap();
    assert_eq!(seed["image_ref"], a["image_ref"], "{seed}");
    assert_eq!(seed["built"], false, "{seed}");
}

#[tokio::test]
async fn a_desktop_container_is_strictly_ready_and_serves_osworld_and_cdp_through_its_ports() {
    let image = build()["image_ref"].as_str().unwrap().to_string();
    let c = Container::run(&image, &[]);
    let api = c.port(5000);
    let http = reqwest::Client::new();
    wait_for(
        "strict readiness inside the container",
        Duration::from_secs(90),
        || async {
            let r = http
                .get(format!("{api}/v1/ready?wait=5s"))
                .bearer_auth(TOKEN)
                .send()
                .await
                .ok()?;
            (r.status() == 200).then_some(())
        },
    )
    .await;
    // OSWorld's harness: a screenshot of the container's desktop…
    let png = http
        .get(format!("{api}/screenshot"))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let info = png::Decoder::new(std::io::Cursor::new(png))
        .read_info()
        .unwrap()
        .info()
        .clone();
    assert_eq!((info.width, info.height), (1920, 1080));
    // … pyautogui through /execute, as its harness sends it …
    let r: Value = http
        .post(format!("{api}/execute"))
        .json(&serde_json::json!({"command": ["python", "-c", "import pyautogui; pyautogui.click(10, 10)"], "shell": false}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["returncode"], 0, "{r}\n{}", c.logs());
    let pos: Value = http
        .get(format!("{api}/cursor_position"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(pos, serde_json::json!([10, 10]));
    // … and Chromium's CDP through the published relay port.
    let v: Value = http
        .get(format!("{}/json/version", c.port(9222)))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(v["Browser"].as_str().unwrap().contains("Chrome"), "{v}");
    // The sandbox user runs the commands, with `python` on the PATH.
    let r: Value = http
        .post(format!("{api}/execute"))
        .json(&serde_json::json!({"command": "id -un; python --version", "shell": true}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        r["output"].as_str().unwrap().starts_with("user\nPython 3"),
        "{r}"
    );
}

#[tokio::test]
async fn the_ide_profile_runs_from_the_desktop_image_without_a_desktop() {
    let image = build()["image_ref"].as_str().unwrap().to_string();
    let c = Container::run(&image, &["--listen", "0.0.0.0:5000"]);
    let api = c.port(5000);
    let http = reqwest::Client::new();
    wait_for(
        "the agent in the container",
        Duration::from_secs(30),
        || async {
            let r = http.get(format!("{api}/healthz")).send().await.ok()?;
            (r.status() == 200).then_some(())
        },
    )
    .await;
    let r = http
        .get(format!("{api}/v1/ready"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v["components"],
        serde_json::json!({}),
        "no desktop components"
    );
    let r: Value = http
        .post(format!("{api}/execute"))
        .json(&serde_json::json!({"command": "git --version >/dev/null 2>&1 || echo no-git; pgrep -c Xvnc || true", "shell": true}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["output"], "0\n", "{r}");
}

#[tokio::test]
async fn the_controller_answers_an_image_build_with_the_content_addressed_ref() {
    let expected = build()["image_ref"].as_str().unwrap().to_string();
    let c = berth_tests::controller::ControllerProcess::start("").await;
    let cl = c.client();
    let r = cl
        .request(reqwest::Method::POST, "/sandbox/sandboxes/v1/images/build")
        .json(&serde_json::json!({"profile": "desktop"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "an existing image is ready at once");
    let job: Value = r.json().await.unwrap();
    assert_eq!(job["image_ref"], expected.as_str());
    assert_eq!(job["image_uri"], expected.as_str());
    assert_eq!(job["status"], "ready");
    // Typed, under the seed's profile name: the same image.
    let typed = cl
        .build_image(&berth_protocol::controller::BuildImage {
            profile: "desktop-ubuntu".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        (typed.image_ref.as_str(), typed.status.as_str()),
        (expected.as_str(), "ready")
    );
    let again: Value = cl
        .request(
            reqwest::Method::GET,
            &format!("/sandbox/sandboxes/v1/images/{expected}"),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(again["status"], "ready");
    for (body, status) in [
        (serde_json::json!({"profile": "nope"}), 400),
        (
            serde_json::json!({"profile": "desktop", "apps": ["nope"]}),
            400,
        ),
        (
            serde_json::json!({"profile": "desktop", "bundle": "nope"}),
            400,
        ),
        (serde_json::json!({"profile": 3}), 400),
    ] {
        let r = cl
            .request(reqwest::Method::POST, "/sandbox/sandboxes/v1/images/build")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status, "{body}");
    }
    let r = cl
        .request(
            reqwest::Method::GET,
            "/sandbox/sandboxes/v1/images/berth-desktop:nope",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

/// A recipes dir with the real base (so debootstrap's stage is the cached one) and one small
/// profile, `name`, of `packages`.
fn probe_recipes(name: &str, packages: &[&str]) -> tempfile::TempDir {
    let real = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../images/recipes.toml");
    let real = std::fs::read_to_string(real).unwrap();
    let base = &real[..real.find("[profiles.").unwrap()];
    let dir = tempfile::tempdir().unwrap();
    let list: Vec<String> = packages.iter().map(|p| format!("{p:?}")).collect();
    std::fs::write(
        dir.path().join("recipes.toml"),
        format!(
            "{base}[profiles.{name}]\ndescription = \"a probe\"\ndesktop = false\n\
             packages = [{}]\npip = []\n",
            list.join(", ")
        ),
    )
    .unwrap();
    dir
}

/// `berth image build` on another recipes dir: exit status, stdout, stderr.
fn build_in(images: &std::path::Path, name: &str, agent: Option<&str>) -> (bool, String, String) {
    build_in_with(images, name, agent, &[])
}

/// The same, with more flags.
fn build_in_with(
    images: &std::path::Path,
    name: &str,
    agent: Option<&str>,
    flags: &[&str],
) -> (bool, String, String) {
    let mut cmd = Command::new(berth_tests::workspace_bin("berth"));
    cmd.args([
        "image",
        "build",
        "--profile",
        name,
        "--json",
        "--images-dir",
    ])
    .arg(images)
    .args(flags)
    .env("BERTH_LOG", "warn");
    if let Some(a) = agent {
        cmd.args(["--agent-bin", a]);
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Removes a probe's cached stages and images.
fn forget_probe(name: &str) {
    let cache = std::env::var("BERTH_IMAGE_CACHE").unwrap_or("/var/cache/berth/images".into());
    for e in std::fs::read_dir(&cache).into_iter().flatten().flatten() {
        if e.file_name()
            .to_string_lossy()
            .starts_with(&format!("{name}-"))
        {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
    let out = Command::new("docker")
        .args(["images", "-q", &format!("berth-{name}")])
        .output()
        .unwrap();
    for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        let _ = Command::new("docker").args(["rmi", "-f", id]).output();
    }
}

#[tokio::test]
async fn a_locked_version_gone_from_the_mirror_is_re_resolved_and_the_lock_rewritten() {
    build(); // the base stage is cached
    let name = "relockprobe";
    forget_probe(name);
    let images = probe_recipes(name, &["hello"]);
    let lock = images.path().join(format!("{name}.lock"));
    std::fs::write(&lock, "hello=0.0-gone-from-the-mirror\n").unwrap();
    // A one-off build: its packages stage leaves the cache once the image is imported.
    let (ok, stdout, stderr) = build_in_with(images.path(), name, None, &["--drop-stage"]);
    let cache = std::env::var("BERTH_IMAGE_CACHE").unwrap_or("/var/cache/berth/images".into());
    let stages: Vec<String> = std::fs::read_dir(&cache)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    forget_probe(name);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("==> base rootfs (cached)"), "{stderr}");
    assert!(stderr.contains("removed the stage"), "{stderr}");
    assert!(
        !stages.iter().any(|s| s.starts_with(&format!("{name}-"))),
        "{stages:?}"
    );
    assert!(stages.iter().any(|s| s.starts_with("base-")), "{stages:?}");
    assert!(
        stderr.contains("warning: a locked version is gone from the mirror"),
        "{stderr}"
    );
    let first: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(first["built"], true);
    let rewritten = std::fs::read_to_string(&lock).unwrap();
    let pin = rewritten
        .lines()
        .find_map(|l| l.strip_prefix("hello="))
        .unwrap_or_else(|| panic!("{rewritten}"));
    assert_ne!(pin, "0.0-gone-from-the-mirror");
    // The name follows the lock it was built from: the old lock names another image.
    std::fs::write(&lock, "hello=0.0-gone-from-the-mirror\n").unwrap();
    let (_, old_ref) = plan_ref(images.path(), name);
    std::fs::write(&lock, &rewritten).unwrap();
    let (_, new_ref) = plan_ref(images.path(), name);
    assert_eq!(new_ref, first["image_ref"].as_str().unwrap());
    assert_ne!(old_ref, new_ref);
}

/// The `image_ref` a build of these recipes would have, without building (`--plan`).
fn plan_ref(images: &std::path::Path, name: &str) -> (bool, String) {
    let out = Command::new(berth_tests::workspace_bin("berth"))
        .args([
            "image",
            "build",
            "--plan",
            "--profile",
            name,
            "--images-dir",
        ])
        .arg(images)
        .env("BERTH_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    (
        v["exists"].as_bool().unwrap(),
        v["image_ref"].as_str().unwrap().to_string(),
    )
}

#[tokio::test]
async fn a_failing_build_names_its_step_and_package_and_resumes_from_its_cache() {
    build();
    let name = "brokenprobe";
    let images = probe_recipes(name, &["hello", "berth-no-such-package"]);
    let (ok, stdout, stderr) = build_in(images.path(), name, None);
    forget_probe(name);
    assert!(!ok);
    assert!(stdout.is_empty(), "{stdout}");
    assert!(stderr.contains("==> base rootfs (cached)"), "{stderr}");
    assert!(stderr.contains("install 2 packages failed"), "{stderr}");
    assert!(
        stderr.contains("Unable to locate package berth-no-such-package"),
        "{stderr}"
    );
    // Without an agent binary: which file, and the cargo command that makes it.
    let (ok, _, stderr) = build_in(images.path(), name, Some("/nonexistent/berth-agent"));
    assert!(!ok);
    assert!(stderr.contains("/nonexistent/berth-agent"), "{stderr}");
    assert!(stderr.contains("cargo build -p berth-agent"), "{stderr}");
}
