//! OSWorld's own harness on berth, through the controller on the Docker provider:
//! `clients/python`'s pytest suite (the typed client, and `berth.osworld` driving
//! `desktop_env.DesktopEnv` from PyPI through reset, step and evaluate) against a real
//! `berth serve`; and the image's declared ports published as the sandbox's endpoints.
//! `tests/setup.sh` installs the Python side (desktop-env --no-deps, the modules it imports,
//! pytest, the berth package).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use berth_protocol::controller::{Command as RunCommand, CreateSandbox, RunRequest};
use berth_tests::controller::{API_KEY, ControllerProcess, Provider, build_desktop_image};
use berth_tests::wait_for;

pub(crate) fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// The pytest summary line (`8 passed, 1 warning in 95.12s`).
pub(crate) fn summary(lines: &[String]) -> String {
    lines
        .iter()
        .rev()
        .find(|l| {
            let l = l.trim_matches(|c: char| c == '=' || c.is_whitespace());
            [" passed", " failed", " skipped", " error", " no tests ran"]
                .iter()
                .any(|w| l.contains(w))
                && l.contains(" in ")
        })
        .cloned()
        .unwrap_or_default()
}

/// `python3 -m pytest ARGS` from the repository's root with `env`, bounded at 25 minutes, its
/// output printed as it comes (and kept): its exit status and stdout's lines.
pub(crate) fn pytest(
    args: &[&str],
    env: &[(&str, &std::ffi::OsStr)],
) -> (std::process::ExitStatus, Vec<String>) {
    // Bounded: a setup step that waits on a window the guest never shows must not hang the run.
    let mut cmd = Command::new("timeout");
    cmd.args(["--kill-after=10", "1500", "python3", "-m", "pytest"])
        .args(["-q", "-rs", "-p", "no:cacheprovider"])
        .args(args)
        .current_dir(repo_root())
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .spawn()
        .expect("python3 with pytest (tests/setup.sh installs it)");
    let stderr = child.stderr.take().unwrap();
    let err_thread = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("pytest: {line}");
        }
    });
    let mut lines = Vec::new();
    for line in BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
    {
        println!("pytest: {line}");
        lines.push(line);
    }
    let status = child.wait().unwrap();
    let _ = err_thread.join();
    (status, lines)
}

#[tokio::test]
async fn the_python_client_and_osworlds_desktop_env_pass_against_a_docker_controller() {
    // Two optional browser toolset members on (the suite checks both served, the others not).
    let c = ControllerProcess::start_on(
        Provider::Docker,
        "browser_toolset_enable = [\"javascript_exec\", \"read_console\"]",
    )
    .await;
    let (status, lines) = pytest(
        // The GNOME image's suite runs on its own (osworld_gnome.rs).
        &[
            "clients/python/tests",
            "--ignore=clients/python/tests/gnome",
        ],
        &[
            ("BERTH_URL", c.base.as_ref()),
            ("BERTH_API_KEY", API_KEY.as_ref()),
            (
                "BERTH_BROWSER_TOOLSET_ENABLED",
                "javascript_exec,read_console".as_ref(),
            ),
        ],
    );
    let summary = summary(&lines);
    assert!(
        status.success(),
        "pytest failed ({status}): {summary}\ncontroller log:\n{}",
        c.log_text()
    );
    assert!(summary.contains(" passed"), "no pytest summary: {lines:?}");
    // The DesktopEnv tests skip only without a controller or without OSWorld's code: here both
    // are present, so a skip is a failure of the setup.
    assert!(
        !summary.contains("skipped") && !summary.contains("deselected"),
        "pytest skipped tests: {summary}\n{}",
        lines.join("\n")
    );
}

/// An image that declares `{"vlc": 8080}` in its `berth.ports` label: the desktop image with the
/// label added (what the image builder writes for apps that serve a port). Removed on drop (it
/// shares the desktop image's layers: only the tag goes).
struct PortsImage(String);

impl Drop for PortsImage {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rmi", &self.0]).output();
    }
}

fn image_declaring_vlc() -> PortsImage {
    let base = build_desktop_image().unwrap_or_else(|e| panic!("{e}"));
    let base = base["image_ref"].as_str().unwrap().to_string();
    let tag = format!(
        "berth-ports-test:{}",
        base.rsplit(':').next().unwrap_or("latest")
    );
    {
        let mut build = Command::new("docker")
            .args(["build", "-q", "-t", &tag, "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("docker build");
        use std::io::Write;
        build
            .stdin
            .take()
            .unwrap()
            .write_all(
                format!("FROM {base}\nLABEL \"berth.ports\"=\"{{\\\"vlc\\\": 8080}}\"\n")
                    .as_bytes(),
            )
            .unwrap();
        let out = build.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "docker build: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    PortsImage(tag)
}

#[tokio::test]
async fn an_images_declared_ports_are_published_and_listed_in_the_endpoints() {
    let image = image_declaring_vlc();
    let mut c = ControllerProcess::start_on(Provider::Docker, "").await;
    let cl = c.client();
    let sb = cl
        .create(&CreateSandbox {
            profile: "ide".into(),
            image_ref: Some(image.0.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(sb.status, "running", "{sb:?}");
    let vlc = sb
        .endpoints
        .ports
        .get("vlc")
        .unwrap_or_else(|| panic!("no vlc endpoint: {:?}", sb.endpoints))
        .clone();
    assert!(vlc.starts_with("http://127.0.0.1:"), "{vlc}");
    let compat = sb.endpoints.compat.clone().unwrap();
    assert_ne!(vlc, compat);
    // The wire form: the declared port sits beside compat and cdp.
    let raw: serde_json::Value = cl
        .request(
            reqwest::Method::GET,
            &format!("/sandbox/sandboxes/v1/{}", sb.id),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(raw["endpoints"]["vlc"], vlc.as_str(), "{raw}");

    // Something listening on 8080 inside is reached through the published port.
    let run = cl
        .exec(
            &sb.id,
            &RunRequest {
                command: RunCommand::Line(
                    "mkdir -p /tmp/vlc && echo vlc-here > /tmp/vlc/index.html && \
                     cd /tmp/vlc && exec python3 -m http.server 8080 --bind 0.0.0.0"
                        .into(),
                ),
                wait: Some(false),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(!run.done(), "{run:?}");
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let body = wait_for("the port-8080 server", Duration::from_secs(30), || {
        let http = http.clone();
        let url = format!("{vlc}/index.html");
        async move {
            let r = http.get(&url).send().await.ok()?;
            r.status().is_success().then_some(())?;
            r.text().await.ok()
        }
    })
    .await;
    assert_eq!(body, "vlc-here\n");

    // A restarted controller still lists it (the endpoints are stored).
    c.kill9();
    c.launch();
    let again = c.client().get(&sb.id).await.unwrap();
    assert_eq!(again.endpoints.ports.get("vlc"), Some(&vlc), "{again:?}");
    // And its preview through the controller: the port inside, the route's URL.
    let preview = again.endpoints.preview.get("vlc").expect("a vlc preview");
    assert_eq!(preview.port, 8080, "{again:?}");
    assert_eq!(
        preview.url,
        format!("{}/sandbox/sandboxes/v1/{}/ports/8080/", c.base, sb.id)
    );
    let through = http
        .get(format!("{}index.html", preview.url))
        .header(berth_protocol::routes::header::API_KEY, API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(through.status(), 200);
    assert_eq!(through.text().await.unwrap(), "vlc-here\n");

    // An image without the label declares nothing.
    let plain = c
        .client()
        .create(&CreateSandbox {
            profile: "ide".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(plain.endpoints.ports.is_empty(), "{:?}", plain.endpoints);
    assert!(plain.endpoints.preview.is_empty(), "{:?}", plain.endpoints);
}
