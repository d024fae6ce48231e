//! `berth image push` into a real registry: Debian's `docker-registry` (tests/setup.sh installs
//! it), started here on a free loopback port with its own storage, and the pushed image pulled
//! back by digest through the real Docker daemon. Docker speaks plain HTTP to 127.0.0.0/8.
//!
//! The image pushed is the controller's own (`berth image build --controller`: the base rootfs
//! and the two binaries), the smallest the builder makes and the one deploy/kubernetes runs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use berth_tests::{wait_for, workspace_bin};
use serde_json::Value;
use sha2::Digest;

/// A registry process on 127.0.0.1:<free port>, killed on drop.
struct Registry {
    child: Child,
    addr: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Registry {
    async fn start() -> Registry {
        Registry::start_with(None).await
    }

    /// With `user:password` (bcrypt, htpasswd), every call needs basic auth.
    async fn start_with(password: Option<(&str, &str)>) -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let port = berth_tests::free_port();
        let addr = format!("127.0.0.1:{port}");
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\n  \
                 delete:\n    enabled: true\nhttp:\n  addr: {addr}\n",
                dir.path().join("storage").display()
            ),
        )
        .unwrap();
        if let Some((user, pass)) = password {
            let file = dir.path().join("htpasswd");
            let ok = Command::new("htpasswd")
                .args(["-Bbc"])
                .arg(&file)
                .args([user, pass])
                .output()
                .expect("htpasswd (tests/setup.sh installs apache2-utils)");
            assert!(ok.status.success());
            let mut c = std::fs::read_to_string(&config).unwrap();
            c.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: berth-test\n    path: {}\n",
                file.display()
            ));
            std::fs::write(&config, c).unwrap();
        }
        let log = dir.path().join("registry.log");
        let child = Command::new("/usr/bin/docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(Stdio::from(
                std::fs::OpenOptions::new().append(true).open(&log).unwrap(),
            ))
            .spawn()
            .expect("/usr/bin/docker-registry (tests/setup.sh installs docker-registry)");
        let mut r = Registry {
            child,
            addr,
            log,
            _dir: dir,
        };
        let url = format!("http://{}/v2/", r.addr);
        let http = reqwest::Client::new();
        let locked = password.is_some();
        wait_for(
            "the registry's GET /v2/ to answer 200",
            Duration::from_secs(30),
            || {
                let (http, url) = (http.clone(), url.clone());
                let exited = r.child.try_wait().unwrap();
                assert!(
                    exited.is_none(),
                    "docker-registry exited ({exited:?}): {}",
                    std::fs::read_to_string(&r.log).unwrap_or_default()
                );
                async move {
                    match http.get(&url).send().await {
                        // 401: up, and asking for the password.
                        Ok(a) if a.status() == 200 || (locked && a.status() == 401) => Some(()),
                        _ => None,
                    }
                }
            },
        )
        .await;
        r
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn docker(args: &[&str]) -> std::process::Output {
    Command::new("docker").args(args).output().unwrap()
}

/// `berth image build --controller --json`: found when built before.
fn controller_image() -> Value {
    let out = Command::new(workspace_bin("berth"))
        .args(["image", "build", "--controller", "--json"])
        .env("BERTH_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "berth image build --controller: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("only JSON on stdout")
}

fn push(image: &str, registry: &str) -> std::process::Output {
    // No credentials file of this machine's user is read.
    push_with(image, registry, &[], None, Path::new("/nonexistent"))
}

fn push_with(
    image: &str,
    registry: &str,
    args: &[&str],
    stdin: Option<&str>,
    docker_config: &Path,
) -> std::process::Output {
    let mut child = Command::new(workspace_bin("berth"))
        .args(["image", "push", image, "--registry", registry, "--json"])
        .args(args)
        .env("BERTH_LOG", "warn")
        .env("DOCKER_CONFIG", docker_config)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(s) = stdin {
        std::io::Write::write_all(&mut input, s.as_bytes()).unwrap();
    }
    drop(input);
    child.wait_with_output().unwrap()
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{:x}", sha2::Sha256::digest(bytes))
}

const MANIFEST_TYPES: &str = "application/vnd.docker.distribution.manifest.v2+json, \
                              application/vnd.oci.image.manifest.v1+json";

#[tokio::test]
async fn push_then_pull_back_by_digest() {
    let built = controller_image();
    let image = built["image_ref"].as_str().unwrap().to_string();
    // The session view's viewers are where `[session]`'s defaults look for them.
    let files = [
        "/usr/share/novnc/core/rfb.js",
        "/usr/share/nodejs/xterm/lib/public/Terminal.js",
        "/usr/share/javascript/xterm/xterm.css",
    ];
    let script = files.map(|f| format!("test -s {f}")).join(" && ");
    let out = docker(&[
        "run",
        "--rm",
        "--entrypoint",
        "/bin/sh",
        &image,
        "-c",
        &script,
    ]);
    assert!(
        out.status.success(),
        "the controller image lacks a session view file ({files:?}): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (name, tag) = image.split_once(':').unwrap();
    let image_id =
        String::from_utf8(docker(&["image", "inspect", "--format", "{{.Id}}", &image]).stdout)
            .unwrap()
            .trim()
            .to_string();
    assert!(image_id.starts_with("sha256:"), "{image_id:?}");

    let reg = Registry::start().await;
    let registry = format!("{}/berth-test", reg.addr);
    let started = Instant::now();
    let out = push(&image, &registry);
    let push_secs = started.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "push: {}\nregistry log: {}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(&reg.log).unwrap_or_default()
    );
    let pushed: Value = serde_json::from_slice(&out.stdout).expect("only JSON on stdout");
    let repo = format!("{registry}/{name}");
    assert_eq!(pushed["pushed"], format!("{repo}:{tag}"));
    assert_eq!(pushed["image_ref"], image);
    assert_eq!(pushed["image_id"], image_id);
    let digest = pushed["digest"].as_str().unwrap().to_string();
    assert!(
        digest.starts_with("sha256:") && digest.len() == 71,
        "{digest}"
    );
    let digest_ref = format!("{repo}@{digest}");
    assert_eq!(pushed["digest_ref"], digest_ref);
    eprintln!(
        "pushed {} ({:.0} MB) in {push_secs:.1} s",
        pushed["pushed"],
        built["size_bytes"].as_f64().unwrap_or(0.0) / 1e6
    );

    // The registry lists it, and answers the tag with the digest the push printed: the
    // manifest's bytes hash to it, and the config they name is the local image's (its id).
    let http = reqwest::Client::new();
    let catalog: Value = http
        .get(reg.url("/v2/_catalog"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let path = format!("berth-test/{name}");
    assert!(
        catalog["repositories"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r == &path),
        "{catalog}"
    );
    let tags: Value = http
        .get(reg.url(&format!("/v2/{path}/tags/list")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(tags["tags"], serde_json::json!([tag]), "{tags}");
    let manifest = http
        .get(reg.url(&format!("/v2/{path}/manifests/{tag}")))
        .header("Accept", MANIFEST_TYPES)
        .send()
        .await
        .unwrap();
    assert_eq!(manifest.status(), 200);
    assert_eq!(
        manifest.headers()["docker-content-digest"]
            .to_str()
            .unwrap(),
        digest
    );
    let body = manifest.bytes().await.unwrap();
    assert_eq!(sha256(&body), digest, "the manifest's bytes are the digest");
    let manifest: Value = serde_json::from_slice(&body).unwrap();
    let config_digest = manifest["config"]["digest"].as_str().unwrap();
    assert_eq!(
        config_digest, image_id,
        "the manifest names the image's config"
    );
    let config = http
        .get(reg.url(&format!("/v2/{path}/blobs/{config_digest}")))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(sha256(&config), image_id);
    let config: Value = serde_json::from_slice(&config).unwrap();
    assert_eq!(
        config["config"]["Entrypoint"],
        serde_json::json!(["/usr/local/bin/berth"])
    );
    assert_eq!(config["config"]["Labels"]["berth.image_ref"], image);

    // Gone from this machine (every name and the image itself), then pulled by digest.
    let rm = docker(&["rmi", "-f", &image_id]);
    assert!(
        rm.status.success(),
        "{}",
        String::from_utf8_lossy(&rm.stderr)
    );
    assert!(!docker(&["image", "inspect", &image_id]).status.success());
    let started = Instant::now();
    let pull = docker(&["pull", &digest_ref]);
    let pull_secs = started.elapsed().as_secs_f64();
    assert!(
        pull.status.success(),
        "docker pull {digest_ref}: {}",
        String::from_utf8_lossy(&pull.stderr)
    );
    let inspect: Value = serde_json::from_slice(&docker(&["image", "inspect", &digest_ref]).stdout)
        .expect("the pulled image inspects");
    let pulled = &inspect[0];
    assert_eq!(pulled["Id"], image_id, "the same image came back");
    assert!(
        pulled["RepoDigests"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d == &digest_ref),
        "{}",
        pulled["RepoDigests"]
    );
    assert_eq!(
        pulled["Config"]["Cmd"],
        serde_json::json!([
            "serve",
            "--listen",
            "0.0.0.0:8780",
            "--config",
            "/etc/berth/berth.toml",
            "--data-dir",
            "/var/lib/berth"
        ])
    );
    eprintln!("pulled {digest_ref} in {pull_secs:.1} s");
    // The builder's name again, so the next build finds it.
    let tagged = docker(&["tag", &digest_ref, &image]);
    assert!(tagged.status.success());
    let again = controller_image();
    assert_eq!(again["built"], false, "{again}");
    assert_eq!(again["image_ref"], image);
    // The registry's names go with the registry (its port is new each run): only the
    // builder's name stays on this machine.
    let _ = docker(&["rmi", &digest_ref]);
}

/// An empty image of this test's own (`docker import` of an empty tar): the push test removes
/// the controller image while it runs.
fn tiny_image(name: &str) -> String {
    let mut tar = Command::new("tar")
        .args(["-cf", "-", "--files-from", "/dev/null"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = Command::new("docker")
        .args(["import", "-", name])
        .stdin(tar.stdout.take().unwrap())
        .output()
        .unwrap();
    assert!(tar.wait().unwrap().success());
    assert!(
        out.status.success(),
        "docker import: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    name.to_string()
}

#[tokio::test]
async fn a_push_to_a_registry_that_is_down_fails_clearly_and_soon() {
    let image = tiny_image("berth-test-tiny:down");
    // A port a registry answered on a moment ago, closed now.
    let reg = Registry::start().await;
    let addr = reg.addr.clone();
    drop(reg);
    let started = Instant::now();
    let out = push(&image, &format!("{addr}/berth-test"));
    let secs = started.elapsed().as_secs_f64();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a push to nothing succeeded");
    assert!(out.stdout.is_empty(), "no JSON for a failed push");
    assert!(
        err.contains(&format!("pushing {addr}/berth-test/")) && err.contains(&addr),
        "{err}"
    );
    assert!(
        err.contains("connection refused"),
        "the daemon's reason: {err}"
    );
    assert!(secs < 60.0, "took {secs:.1} s");
    eprintln!("failed in {secs:.1} s: {}", err.trim());
    let _ = docker(&["rmi", &format!("{addr}/berth-test/{image}"), &image]);
}

#[test]
fn bad_registries_and_images_are_clear_errors() {
    for (registry, why) in [
        ("http://127.0.0.1:5000/berth", "no scheme"),
        ("berth", "Docker Hub namespace"),
        ("127.0.0.1:5000/Berth", "path component"),
        ("127.0.0.1:99999/berth", "not a host"),
    ] {
        let started = Instant::now();
        let out = push("berth-controller:x", registry);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{registry}");
        assert!(err.contains(why), "{registry}: {err}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }
    let out = push("berth-no-such-image:0", "127.0.0.1:5000/berth");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("no local image berth-no-such-image:0") && err.contains("berth image build"),
        "{err}"
    );
}

#[tokio::test]
async fn a_registry_with_a_password_takes_it_from_stdin_or_the_docker_config() {
    let image = tiny_image("berth-test-tiny:auth");
    let reg = Registry::start_with(Some(("alice", "s3cret-pw"))).await;
    let registry = format!("{}/berth-test", reg.addr);
    let target = format!("{registry}/berth-test-tiny:auth");
    let fails = |out: &std::process::Output, what: &str| {
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{what} was let in");
        assert!(err.contains(&format!("pushing {target}")), "{what}: {err}");
        err
    };
    let err = fails(&push(&image, &registry), "no password");
    assert!(
        err.contains("no basic auth credentials") || err.contains("unauthorized"),
        "the registry's reason: {err}"
    );
    let none = Path::new("/nonexistent");
    let user = ["--username", "alice", "--password-stdin"];
    fails(
        &push_with(&image, &registry, &user, Some("wrong\n"), none),
        "a wrong password",
    );
    let empty = push_with(&image, &registry, &user, Some(""), none);
    assert!(!empty.status.success());
    assert!(String::from_utf8_lossy(&empty.stderr).contains("stdin held no password"));

    let ok = push_with(&image, &registry, &user, Some("s3cret-pw\n"), none);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let first: Value = serde_json::from_slice(&ok.stdout).unwrap();
    assert_eq!(first["pushed"], target);

    // The Docker CLI's config.json, its auths entry for the host.
    use base64::Engine;
    let cfg = tempfile::tempdir().unwrap();
    std::fs::write(
        cfg.path().join("config.json"),
        serde_json::json!({"auths": {format!("http://{}", reg.addr): {
            "auth": base64::engine::general_purpose::STANDARD.encode("alice:s3cret-pw")
        }}})
        .to_string(),
    )
    .unwrap();
    let ok = push_with(&image, &registry, &[], None, cfg.path());
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let second: Value = serde_json::from_slice(&ok.stdout).unwrap();
    assert_eq!(
        second["digest"], first["digest"],
        "the same image, the same digest"
    );
    let _ = docker(&["rmi", &target, &image]);
}
