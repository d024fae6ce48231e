//! Bring your own image: berth-agent put into images it was not built with — a Debian root
//! file system (bookworm, minbase), a newer glibc with a merged /usr standing
//! in for Ubuntu's (Debian trixie; Ubuntu's archive is not reachable here) and an Alpine-shaped
//! one (musl and busybox, no glibc at all) — and into a Dockerfile's build; each runs exec,
//! files and a terminal through the controller. Equal inputs name the same image, another
//! agent another one, and bad inputs fail naming why.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use berth_protocol::controller::{BuildImage, CreateSandbox};
use berth_protocol::exec::ExecRequest;
use berth_protocol::{PtyControl, PtyRequest};
use berth_tests::controller::{ControllerProcess, Provider, build_image};
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

/// Where the test's root file systems are kept between runs.
const CACHE: &str = "/var/cache/berth/test-rootfs";

fn docker(args: &[&str]) -> std::process::Output {
    Command::new("docker").args(args).output().unwrap()
}

fn has_image(name: &str) -> bool {
    docker(&["image", "inspect", name]).status.success()
}

/// `docker import` of `rootfs` as `name` (once).
fn import(rootfs: &Path, name: &str) -> String {
    if !has_image(name) {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "tar -C '{}' --numeric-owner --exclude=./proc/* --exclude=./sys/* --exclude=./dev/* \
                 -cf - . | docker import - {name}",
                rootfs.display()
            ))
            .output()
            .unwrap();
        assert!(out.status.success(), "import {name}: {out:?}");
    }
    name.to_string()
}

/// Debian bookworm, minbase: the agent's own glibc.
fn debian() -> String {
    minbase("bookworm")
}

/// Debian trixie, minbase: glibc 2.41 (newer than the agent's) and a merged /usr.
fn newer_glibc() -> String {
    minbase("trixie")
}

/// A `debootstrap --variant=minbase` of `suite`, imported (both cached between runs).
pub(crate) fn minbase(suite: &str) -> String {
    let name = format!("berth-test-rootfs/{suite}:minbase");
    if has_image(&name) {
        return name;
    }
    let dir = PathBuf::from(CACHE).join(suite);
    if !dir.join("etc/debian_version").exists() {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(CACHE).unwrap();
        let out = Command::new("timeout")
            .args(["600", "debootstrap", "--variant=minbase", suite])
            .arg(&dir)
            .arg("http://deb.debian.org/debian")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "debootstrap {suite}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    import(&dir, &name)
}

/// Alpine-shaped: busybox (static) for every command and musl's loader; no glibc anywhere.
fn alpine_shaped() -> String {
    let name = "berth-test-rootfs/alpine-shaped:busybox";
    if has_image(name) {
        return name.into();
    }
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    for d in ["bin", "lib", "etc", "tmp", "root", "home/app"] {
        std::fs::create_dir_all(r.join(d)).unwrap();
    }
    std::fs::copy("/bin/busybox", r.join("bin/busybox")).unwrap();
    for c in [
        "sh", "ls", "cat", "echo", "id", "env", "mkdir", "rm", "sleep", "stty", "uname", "tty",
    ] {
        std::os::unix::fs::symlink("busybox", r.join("bin").join(c)).unwrap();
    }
    std::fs::copy(
        "/lib/ld-musl-x86_64.so.1",
        r.join("lib/ld-musl-x86_64.so.1"),
    )
    .unwrap();
    let files = [
        ("etc/os-release", "NAME=\"Alpine Linux\"\nID=alpine\n"),
        ("etc/alpine-release", "3.20.0\n"),
        (
            "etc/passwd",
            "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\n",
        ),
        ("etc/group", "root:x:0:\napp:x:1000:\n"),
    ];
    for (f, text) in files {
        std::fs::write(r.join(f), text).unwrap();
    }
    Command::new("chown")
        .args(["1000:1000"])
        .arg(r.join("home/app"))
        .status()
        .unwrap();
    let image = import(r, "berth-test-rootfs/alpine-shaped:plain");
    // The image's USER is the account commands run as.
    let ctx = tempfile::tempdir().unwrap();
    std::fs::write(
        ctx.path().join("Dockerfile"),
        format!("FROM {image}\nUSER app\nWORKDIR /home/app\n"),
    )
    .unwrap();
    let out = docker(&["build", "-q", "-t", name, &ctx.path().to_string_lossy()]);
    assert!(out.status.success(), "{out:?}");
    name.into()
}

/// `berth image build ARGS --json`: the image_ref, or the error text.
fn bring(args: &[&str]) -> Result<String, String> {
    build_image(args).map(|v| v["image_ref"].as_str().unwrap().to_string())
}

/// Exec, files and a terminal in a sandbox of `image` through the controller; the exec's
/// output (the system's name and the account).
async fn drive(c: &ControllerProcess, image: &str) -> String {
    let cl = c.client();
    let sb = cl
        .create(&CreateSandbox {
            profile: "custom".into(),
            image_ref: Some(image.into()),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("{image}: {e}\n{}", c.log_text()));
    let agent = cl.agent(&sb.id);
    let run = shell(&agent, "cat /etc/os-release | head -2; id -un; echo $HOME").await;
    // Files: written, read back.
    agent
        .upload("/tmp/berth-byo.txt", b"brought\n".to_vec(), None)
        .await
        .unwrap();
    let back = agent.download("/tmp/berth-byo.txt").await.unwrap();
    assert_eq!(back.bytes().await.unwrap().as_ref(), b"brought\n");
    // A terminal: a shell that answers.
    let pty = agent
        .pty_create(&PtyRequest {
            cmd: Some(vec!["/bin/sh".into()]),
            cols: Some(90),
            rows: Some(20),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut ws = agent.pty_attach(&pty.id).await.unwrap();
    ws.send(Message::Binary(
        b"echo pty-$((6*7)); stty size; exit 3\n".to_vec().into(),
    ))
    .await
    .unwrap();
    let (mut text, mut code) = (String::new(), None);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while code.is_none() {
        match tokio::time::timeout_at(deadline, ws.next()).await {
            Ok(Some(Ok(Message::Binary(b)))) => text.push_str(&String::from_utf8_lossy(&b)),
            Ok(Some(Ok(Message::Text(t)))) => {
                if let Ok(PtyControl::Exit { exit_code }) = serde_json::from_str(&t) {
                    code = Some(exit_code);
                }
            }
            Ok(Some(Ok(_))) => {}
            other => panic!("{image}: the terminal ended without an exit: {other:?} {text:?}"),
        }
    }
    assert!(
        text.contains("pty-42") && text.contains("20 90"),
        "{text:?}"
    );
    assert_eq!(code, Some(3));
    // No desktop was added: a screenshot is the named 503.
    let shot = cl.screenshot(&sb.id).await.unwrap_err().to_string();
    assert!(shot.contains("503"), "{shot}");
    cl.delete(&sb.id).await.unwrap();
    run
}

/// A shell line's output (it must exit 0).
async fn shell(agent: &berth_protocol::client::AgentClient, line: &str) -> String {
    let run = agent
        .exec(&ExecRequest {
            shell: Some(line.into()),
            timeout_ms: Some(30_000),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(run.exit_code, 0, "{line}: {run:?}");
    run.stdout.unwrap_or_default()
}

#[tokio::test]
async fn any_local_image_or_dockerfile_becomes_a_sandbox_with_exec_files_and_a_terminal() {
    let c =
        ControllerProcess::start_on(Provider::Process, "[providers]\ncustom = \"docker\"\n").await;
    let sources = [
        ("debian", debian()),
        ("newer glibc", newer_glibc()),
        ("alpine-shaped", alpine_shaped()),
    ];
    for (what, source) in &sources {
        let t = std::time::Instant::now();
        let image = bring(&["--from", source]).unwrap_or_else(|e| panic!("{what}: {e}"));
        println!("{what}: {source} → {image} in {:?}", t.elapsed());
        assert!(image.starts_with("berth-byo-"), "{image}");
        // Equal inputs, the same image (found, not built again).
        assert_eq!(bring(&["--from", source]).unwrap(), image);
        let out = drive(&c, &image).await;
        println!("{what}: {out}");
        match *what {
            "alpine-shaped" => assert!(
                out.contains("ID=alpine") && out.contains("app\n/home/app"),
                "{out}"
            ),
            "newer glibc" => assert!(out.contains("trixie"), "{out}"),
            _ => assert!(out.contains("bookworm") && out.contains("root\n"), "{out}"),
        }
    }

    // A Dockerfile of the test's own, through the image-job API.
    let ctx = tempfile::tempdir().unwrap();
    std::fs::write(
        ctx.path().join("Dockerfile"),
        format!(
            "FROM {}\nUSER root\nRUN mkdir -p /app && echo 'made by the Dockerfile' > /app/built.txt\nUSER app\nWORKDIR /app\n",
            sources[2].1
        ),
    )
    .unwrap();
    let cl = c.client();
    let job = cl
        .build_image(&BuildImage {
            dockerfile: Some(ctx.path().to_string_lossy().into_owned()),
            ..Default::default()
        })
        .await
        .unwrap();
    let pending = job.image_ref.clone();
    let job = berth_tests::wait_for("the Dockerfile's build", Duration::from_secs(180), || {
        let (cl, pending) = (cl.clone(), pending.clone());
        async move {
            let j = cl.image_job(&pending).await.ok()?;
            (j.status.as_str() != "building").then_some(j)
        }
    })
    .await;
    assert_eq!(job.status.as_str(), "ready", "{job:?}");
    assert!(job.image_ref.starts_with("berth-byo-"), "{job:?}");
    let sb = cl
        .create(&CreateSandbox {
            profile: "byo".into(),
            image_ref: Some(job.image_ref.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    // Its commands run in its WORKDIR, as its USER; as root when asked, through the controller.
    let built = shell(&cl.agent(&sb.id), "cat built.txt; id -un; pwd").await;
    assert_eq!(built, "made by the Dockerfile\napp\n/app\n");
    let as_root = cl
        .exec(
            &sb.id,
            &berth_protocol::controller::RunRequest {
                user: Some("root".into()),
                ..berth_tests::controller::shell("id -un; pwd")
            },
        )
        .await
        .unwrap();
    assert_eq!(
        (as_root.exit_code, as_root.stdout.as_str()),
        (Some(0), "root\n/app\n")
    );
    // A bare id, as `docker exec -u 54321:7` takes it (no account has it).
    let bare = cl
        .exec(
            &sb.id,
            &berth_protocol::controller::RunRequest {
                user: Some("54321:7".into()),
                ..berth_tests::controller::shell("echo $(id -u) $(id -g)")
            },
        )
        .await
        .unwrap();
    assert_eq!(bare.stdout, "54321 7\n", "{bare:?}");
    cl.delete(&sb.id).await.unwrap();
    // Named after a temporary directory: not kept (its untagged parent goes with it).
    docker(&["rmi", "-f", &job.image_ref]);
}

#[tokio::test]
async fn bad_images_fail_naming_why_and_leave_nothing() {
    // No such image.
    let e = bring(&["--from", "berth-test-rootfs/none:1"]).unwrap_err();
    assert!(e.contains("no image berth-test-rootfs/none:1"), "{e}");
    // Another architecture: an arm64 image loaded from an archive made here (one file).
    let arm = tempfile::tempdir().unwrap();
    let a = arm.path();
    std::fs::create_dir(a.join("l")).unwrap();
    std::fs::write(a.join("l/f"), "x").unwrap();
    let script = "tar -C l -cf layer.tar f && d=$(sha256sum layer.tar | cut -d' ' -f1) && \
        printf '{\"architecture\":\"arm64\",\"os\":\"linux\",\"config\":{},\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[\"sha256:%s\"]}}' $d > config.json && \
        printf '[{\"Config\":\"config.json\",\"RepoTags\":[\"berth-test-rootfs/arm:1\"],\"Layers\":[\"layer.tar\"]}]' > manifest.json && \
        tar -cf image.tar manifest.json config.json layer.tar && docker load -q -i image.tar";
    let out = Command::new("sh")
        .current_dir(a)
        .args(["-c", script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let e = bring(&["--from", "berth-test-rootfs/arm:1"]).unwrap_err();
    assert!(e.contains("\"arm64\"") && e.contains("\"amd64\""), "{e}");
    // No shell: the file alone.
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "tar -C '{}' -cf - . | docker import - berth-test-rootfs/noshell:1",
            a.join("l").display()
        ))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let e = bring(&["--from", "berth-test-rootfs/noshell:1"]).unwrap_err();
    assert!(e.contains("no shell (/bin/sh)"), "{e}");
    // A Dockerfile that does not build: its error.
    let ctx = tempfile::tempdir().unwrap();
    std::fs::write(
        ctx.path().join("Dockerfile"),
        format!(
            "FROM {}\nRUN echo the-step-that-fails && exit 7\n",
            alpine_shaped()
        ),
    )
    .unwrap();
    let e = bring(&["--dockerfile", &ctx.path().to_string_lossy()]).unwrap_err();
    println!("{e}");
    assert!(
        e.contains("does not build") && e.contains("the-step-that-fails"),
        "{e}"
    );
    // A directory without one.
    let e = bring(&["--dockerfile", "/tmp"]).unwrap_err();
    assert!(e.contains("has no Dockerfile"), "{e}");
    // Nothing half-made: no image of any of these names.
    let slug = ctx
        .path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .to_lowercase();
    let slug = slug.trim_start_matches('.');
    for name in ["none", "arm", "noshell", "tmp", slug] {
        let made = docker(&[
            "images",
            "-q",
            "--filter",
            &format!("reference=berth-byo-{name}:*"),
        ]);
        assert!(made.stdout.is_empty(), "berth-byo-{name}: {made:?}");
    }
    for i in ["berth-test-rootfs/arm:1", "berth-test-rootfs/noshell:1"] {
        docker(&["rmi", "-f", i]);
    }
}

/// The image's name follows the agent: another agent binary, another image.
#[test]
fn another_agent_names_another_image() {
    let source = alpine_shaped();
    let a = bring(&["--from", &source]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("berth-agent");
    let mut bin = std::fs::read(berth_tests::workspace_bin("berth-agent")).unwrap();
    // One more byte after the ELF's end: the same program, another file.
    bin.push(0);
    std::fs::write(&other, bin).unwrap();
    let b = bring(&["--from", &source, "--agent-bin", &other.to_string_lossy()]).unwrap();
    assert_ne!(a, b);
    assert_eq!(a.split(':').next(), b.split(':').next());
    docker(&["rmi", "-f", &b]);
}
