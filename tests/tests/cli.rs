//! The `berth sandbox` client commands against a real controller (`ide` profile, on every
//! provider): `shell` driven under a real pseudo-terminal (typed input, output read back, resize,
//! Ctrl-C, exit code, the terminal restored), piped `shell`, `cp` both ways with multi-MiB files
//! and directories, `events --follow`, `port-forward` to a server inside the sandbox, and help
//! text on every subcommand and flag.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth_tests::controller::{API_KEY, ControllerProcess, Provider, ide, shell};
use berth_tests::{on_every_provider, wait_until, workspace_bin, write_pattern_file};
use nix::sys::termios::{self, LocalFlags};

fn berth(c: &ControllerProcess) -> Command {
    let mut cmd = Command::new(workspace_bin("berth"));
    cmd.env("BERTH_URL", &c.base)
        .env("BERTH_API_KEY", API_KEY)
        .env_remove("SANDBOX_GATEWAY_URL")
        .env_remove("SANDBOX_API_KEY")
        .env("BERTH_LOG", "warn");
    cmd
}

/// Runs to the end; (exit code, stdout, stderr).
fn output(mut cmd: Command) -> (Option<i32>, String, String) {
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn sandbox(c: &ControllerProcess) -> String {
    c.client().create(&ide()).await.unwrap().id
}

/// Waits for a child's exit (bounded).
fn wait_exit(child: &mut Child, timeout: Duration) -> std::process::ExitStatus {
    let mut status = None;
    wait_until("the CLI to exit", timeout, || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    status.unwrap()
}

/// Waits for a child and returns (exit code, peak resident set in KiB) from `wait4`.
fn wait_rusage(child: Child) -> (i32, i64) {
    let mut status = 0;
    // SAFETY: a zeroed rusage is valid; wait4 fills it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = child.id() as libc::pid_t;
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(r, pid, "wait4");
    std::mem::forget(child);
    (libc::WEXITSTATUS(status), usage.ru_maxrss)
}

fn set_size(fd: &OwnedFd, rows: u16, cols: u16) {
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
    assert_eq!(r, 0, "TIOCSWINSZ");
}

/// A process on the slave side of a new pseudo-terminal (its controlling terminal, so the
/// kernel sends it SIGWINCH); the test holds the master.
struct Terminal {
    master: std::fs::File,
    slave: OwnedFd,
    screen: Arc<Mutex<Vec<u8>>>,
    child: Child,
}

impl Terminal {
    fn spawn(mut cmd: Command, rows: u16, cols: u16) -> Terminal {
        let pty = nix::pty::openpty(None, None).unwrap();
        set_size(&pty.master, rows, cols);
        let slave = pty.slave;
        let io = |fd: &OwnedFd| Stdio::from(fd.try_clone().unwrap());
        cmd.stdin(io(&slave)).stdout(io(&slave)).stderr(io(&slave));
        // SAFETY: setsid and TIOCSCTTY are async-signal-safe.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().unwrap();
        let master = std::fs::File::from(pty.master);
        let screen = Arc::new(Mutex::new(Vec::new()));
        let (mut reader, sink) = (master.try_clone().unwrap(), screen.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Terminal {
            master,
            slave,
            screen,
            child,
        }
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.screen.lock().unwrap()).into_owned()
    }

    fn type_in(&mut self, keys: &str) {
        self.master.write_all(keys.as_bytes()).unwrap();
        self.master.flush().unwrap();
    }

    fn wait_for(&self, what: &str) {
        let started = Instant::now();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.screen().contains(what) {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what:?} on the terminal; it shows:\n{}",
                self.screen()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        println!("{what:?} seen after {:?}", started.elapsed());
    }

    fn lflags(&self) -> LocalFlags {
        termios::tcgetattr(&self.slave).unwrap().local_flags
    }
}

async fn shell_under_a_real_terminal_types_resizes_interrupts_and_exits_with_the_code(
    provider: Provider,
) {
    let c = ControllerProcess::start_on(provider, "").await;
    let id = sandbox(&c).await;
    let mut cmd = berth(&c);
    cmd.args(["sandbox", "shell", &id]).env("TERM", "xterm");
    let cooked = {
        let pty = nix::pty::openpty(None, None).unwrap();
        termios::tcgetattr(&pty.slave).unwrap().local_flags
    };
    assert!(cooked.contains(LocalFlags::ICANON | LocalFlags::ECHO | LocalFlags::ISIG));
    let mut t = Terminal::spawn(cmd, 30, 100);

    // Typed in, read back: the shell computes the marker, so the echo of the line is not it.
    t.type_in("stty size; echo ready-$((20+22)) $TERM\r");
    t.wait_for("ready-42 xterm");
    assert!(t.screen().contains("30 100"), "{}", t.screen());
    // The CLI's side of the terminal is raw while the shell runs.
    wait_until("raw mode", Duration::from_secs(5), || {
        !t.lflags()
            .intersects(LocalFlags::ICANON | LocalFlags::ECHO | LocalFlags::ISIG)
    });

    // A window change reaches the sandbox's terminal.
    set_size(&t.master.try_clone().unwrap().into(), 41, 123);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut tries = 0;
    while !t.screen().contains("41 123") {
        assert!(
            Instant::now() < deadline,
            "resize not seen:\n{}",
            t.screen()
        );
        tries += 1;
        t.type_in("stty size\r");
        std::thread::sleep(Duration::from_millis(200));
    }
    println!("resize seen after {tries} stty call(s)");

    // Ctrl-C interrupts the program inside, not the CLI.
    // The marker comes from the job itself, so when it shows the job holds the terminal's
    // foreground (a Ctrl-C before that would reach the shell, not the sleep).
    t.type_in("sh -c 'echo sleeping-$((3*3)); exec sleep 60' && echo slept-$((4*4))\r");
    t.wait_for("sleeping-9");
    let interrupted = Instant::now();
    t.type_in("\x03");
    t.type_in("echo alive-$((5*5))\r");
    t.wait_for("alive-25");
    assert!(
        interrupted.elapsed() < Duration::from_secs(30),
        "sleep was not interrupted"
    );
    assert!(!t.screen().contains("slept-16"));
    assert!(
        t.child.try_wait().unwrap().is_none(),
        "Ctrl-C ended the CLI"
    );

    // The program's exit code is the CLI's, and the terminal is cooked again.
    t.type_in("exit 7\r");
    let status = wait_exit(&mut t.child, Duration::from_secs(20));
    assert_eq!(status.code(), Some(7), "{}", t.screen());
    assert_eq!(t.lflags(), cooked, "terminal settings not restored");

    // SIGTERM to the CLI: 128+15, the terminal restored, the sandbox's terminal closed.
    let before = c.client().agent(&id).pty_list().await.unwrap().ptys.len();
    let mut cmd = berth(&c);
    cmd.args(["sandbox", "shell", &id]);
    let mut t = Terminal::spawn(cmd, 24, 80);
    t.type_in("echo up-$((7*7))\r");
    t.wait_for("up-49");
    let pid = nix::unistd::Pid::from_raw(t.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = wait_exit(&mut t.child, Duration::from_secs(20));
    assert_eq!(status.code(), Some(143), "{}", t.screen());
    assert_eq!(
        t.lflags(),
        cooked,
        "terminal settings not restored after SIGTERM"
    );
    let agent = c.client().agent(&id);
    berth_tests::wait_for(
        "the sandbox's terminal to end",
        Duration::from_secs(20),
        || {
            let agent = agent.clone();
            async move {
                let list = agent.pty_list().await.ok()?;
                let running = list
                    .ptys
                    .iter()
                    .filter(|p| p.state == berth_protocol::PtyState::Running)
                    .count();
                (running == 0).then_some(())
            }
        },
    )
    .await;
    println!("{before} terminal(s) before the SIGTERM session, none running after");

    // The sandbox deleted under a running shell: an error exit, the terminal restored.
    let mut cmd = berth(&c);
    cmd.args(["sandbox", "shell", &id]);
    let mut t = Terminal::spawn(cmd, 24, 80);
    t.type_in("echo last-$((8*8))\r");
    t.wait_for("last-64");
    c.client().delete(&id).await.unwrap();
    let status = wait_exit(&mut t.child, Duration::from_secs(30));
    assert_ne!(status.code(), Some(0), "{}", t.screen());
    assert_eq!(
        t.lflags(),
        cooked,
        "terminal settings not restored after the error"
    );
    println!(
        "deleted under the shell: exit {:?}, {:?}",
        status.code(),
        t.screen().lines().last()
    );
}

async fn shell_with_piped_stdin_or_a_command_exits_with_its_code(provider: Provider) {
    let c = ControllerProcess::start_on(provider, "").await;
    let id = sandbox(&c).await;
    // Piped input is typed into the terminal; the end of it is Ctrl-D.
    let mut child = berth(&c)
        .args(["sandbox", "shell", &id])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"echo piped-$((6*7))\nexit 3\n")
        .unwrap();
    let status = wait_exit(&mut child, Duration::from_secs(30));
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert_eq!(status.code(), Some(3), "{out}");
    assert!(out.contains("piped-42"), "{out}");

    // A command after `--`, stdin at its end at once: its code.
    let mut cmd = berth(&c);
    cmd.args([
        "sandbox",
        "shell",
        &id,
        "--",
        "sh",
        "-c",
        "echo cmd-$((2*3)); exit 5",
    ]);
    let (code, out, err) = output(cmd);
    assert_eq!(code, Some(5), "{out} {err}");
    assert!(out.contains("cmd-6"), "{out}");

    // The seed's variable names, with no BERTH_ ones.
    let out = Command::new(workspace_bin("berth"))
        .args(["sandbox", "get", &id, "--json"])
        .env_remove("BERTH_URL")
        .env_remove("BERTH_API_KEY")
        .env("SANDBOX_GATEWAY_URL", &c.base)
        .env("SANDBOX_API_KEY", API_KEY)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sb: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(sb["id"], id.as_str());

    // An unknown sandbox: a clear error, exit 1, no terminal left behind.
    let mut cmd = berth(&c);
    cmd.args(["sandbox", "shell", "sb_nope"]);
    let (code, _, err) = output(cmd);
    assert_eq!(code, Some(1));
    assert!(err.contains("no sandbox"), "{err}");
    c.client().delete(&id).await.unwrap();
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

async fn cp_copies_files_and_directories_both_ways_streamed(provider: Provider) {
    let c = ControllerProcess::start_on(provider, "").await;
    let id = sandbox(&c).await;
    let local = tempfile::tempdir().unwrap();
    let big = local.path().join("big.bin");
    let len = 24u64 << 20;
    write_pattern_file(&big, len);
    let want = sha256(&big);

    // Up: into a directory that does not exist yet, under a given name.
    let started = Instant::now();
    let mut cmd = berth(&c);
    cmd.args(["sandbox", "cp", "--json"])
        .arg(&big)
        .arg(format!("{id}:cp-test/up.bin"));
    let (code, out, err) = output(cmd);
    assert_eq!(code, Some(0), "{out} {err}");
    let up: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(up["bytes"], len);
    println!(
        "up: {} MiB in {:.2} s",
        len >> 20,
        started.elapsed().as_secs_f64()
    );
    let run = c
        .client()
        .exec(
            &id,
            &shell("sha256sum cp-test/up.bin; stat -c %s cp-test/up.bin"),
        )
        .await
        .unwrap();
    assert!(run.stdout.starts_with(&want), "{}", run.stdout);
    assert!(run.stdout.contains(&len.to_string()), "{}", run.stdout);
    // No progress lines when stderr is not a terminal.
    assert!(err.is_empty(), "{err}");

    // Down: into an existing local directory, under the file's own name.
    let back = local.path().join("back");
    std::fs::create_dir(&back).unwrap();
    let started = Instant::now();
    let mut cmd = berth(&c);
    cmd.args(["sandbox", "cp", &format!("{id}:cp-test/up.bin")])
        .arg(&back);
    let (code, out, err) = output(cmd);
    assert_eq!(code, Some(0), "{out} {err}");
    println!(
        "down: {} MiB in {:.2} s",
        len >> 20,
        started.elapsed().as_secs_f64()
    );
    assert_eq!(sha256(&back.join("up.bin")), want);
    // The download went through a temporary file, now gone.
    let names: Vec<_> = std::fs::read_dir(&back)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("up.bin")]);

    // A directory tree up and back, permission bits kept.
    let tree = local.path().join("tree");
    std::fs::create_dir_all(tree.join("a/b")).unwrap();
    std::fs::write(tree.join("top.txt"), "top\n").unwrap();
    std::fs::write(tree.join("a/b/deep.sh"), "#!/bin/sh\necho deep\n").unwrap();
    write_pattern_file(&tree.join("a/mid.bin"), 3 << 20);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        tree.join("a/b/deep.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let mut cmd = berth(&c);
    cmd.args(["sandbox", "cp", "--json"])
        .arg(&tree)
        .arg(format!("{id}:cp-test/"));
    let (code, out, err) = output(cmd);
    assert_eq!(code, Some(0), "{out} {err}");
    let up: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (up["files"].as_u64(), up["dirs"].as_u64()),
        (Some(3), Some(3))
    );
    let run = c
        .client()
        .exec(
            &id,
            &shell("cp-test/tree/a/b/deep.sh && cat cp-test/tree/top.txt"),
        )
        .await
        .unwrap();
    assert_eq!(run.stdout, "deep\ntop\n", "{run:?}");
    let down = local.path().join("down");
    let mut cmd = berth(&c);
    cmd.args(["sandbox", "cp", &format!("{id}:cp-test/tree")])
        .arg(&down);
    let (code, out, err) = output(cmd);
    assert_eq!(code, Some(0), "{out} {err}");
    for f in ["top.txt", "a/b/deep.sh", "a/mid.bin"] {
        assert_eq!(sha256(&down.join(f)), sha256(&tree.join(f)), "{f}");
    }
    let mode = std::fs::metadata(down.join("a/b/deep.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755);

    // Streamed: a copy of 96 MiB each way stays far below that in the CLI's peak memory.
    let huge = local.path().join("huge.bin");
    write_pattern_file(&huge, 96 << 20);
    for (src, dst) in [
        (huge.display().to_string(), format!("{id}:cp-test/huge.bin")),
        (
            format!("{id}:cp-test/huge.bin"),
            local.path().join("huge-back.bin").display().to_string(),
        ),
    ] {
        let child = berth(&c)
            .args(["sandbox", "cp", &src, &dst])
            .spawn()
            .unwrap();
        let (code, max_rss_kib) = wait_rusage(child);
        println!("cp {src} -> {dst}: peak RSS {} MiB", max_rss_kib >> 10);
        assert_eq!(code, 0);
        assert!(
            max_rss_kib < 48 << 10,
            "peak RSS {max_rss_kib} KiB for a 96 MiB copy"
        );
    }
    assert_eq!(sha256(&local.path().join("huge-back.bin")), sha256(&huge));

    // Progress on stderr when it is a terminal (and only on stderr).
    let mut cmd = berth(&c);
    cmd.args(["sandbox", "cp", &format!("{id}:cp-test/huge.bin")])
        .arg(local.path().join("huge-tty.bin"));
    let mut t = Terminal::spawn(cmd, 24, 120);
    let status = wait_exit(&mut t.child, Duration::from_secs(60));
    assert_eq!(status.code(), Some(0), "{}", t.screen());
    t.wait_for("100%");
    t.wait_for("96.0 MiB");

    // `-`: stdout and stdin.
    let mut cmd = berth(&c);
    cmd.args(["sandbox", "cp", &format!("{id}:cp-test/tree/top.txt"), "-"]);
    let (code, out, _) = output(cmd);
    assert_eq!((code, out.as_str()), (Some(0), "top\n"));
    let mut child = berth(&c)
        .args([
            "sandbox",
            "cp",
            "-",
            &format!("{id}:cp-test/from-stdin.txt"),
        ])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"via stdin\n")
        .unwrap();
    assert_eq!(
        wait_exit(&mut child, Duration::from_secs(30)).code(),
        Some(0)
    );
    let run = c
        .client()
        .exec(&id, &shell("cat cp-test/from-stdin.txt"))
        .await
        .unwrap();
    assert_eq!(run.stdout, "via stdin\n");

    // Errors: clear, exit 1.
    for (src, dst, needle) in [
        (
            format!("{id}:cp-test/missing"),
            "x".to_string(),
            "no such file",
        ),
        (
            "/nonexistent/file".into(),
            format!("{id}:x"),
            "/nonexistent/file",
        ),
        ("a".into(), "b".into(), "neither"),
    ] {
        let mut cmd = berth(&c);
        cmd.args(["sandbox", "cp", &src, &dst])
            .current_dir(local.path());
        let (code, _, err) = output(cmd);
        assert_eq!(code, Some(1), "{src} {dst}: {err}");
        assert!(err.contains(needle), "{src} {dst}: {err}");
    }
    c.client().delete(&id).await.unwrap();
}

/// Collects a child's stdout lines on a thread.
fn lines_of(child: &mut Child) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = lines.clone();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            sink.lock().unwrap().push(line);
        }
    });
    lines
}

async fn events_prints_the_timeline_and_follow_sees_new_events(provider: Provider) {
    let c = ControllerProcess::start_on(provider, "").await;
    let id = sandbox(&c).await;
    let mut cmd = berth(&c);
    cmd.args(["sandbox", "events", &id, "--json"]);
    let (code, out, err) = output(cmd);
    assert_eq!(code, Some(0), "{err}");
    let events: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(!events.is_empty());
    let last = events.last().unwrap()["seq"].as_u64().unwrap();
    println!("{} events before following", events.len());

    let mut child = berth(&c)
        .args(["sandbox", "events", &id, "--follow", "--json"])
        .args(["--from-seq", &(last + 1).to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = lines_of(&mut child);
    // Let the follower reach its wait: a first new event proves it is following.
    let path = format!("events-{}.txt", std::process::id());
    let put = c
        .client()
        .request(
            reqwest::Method::PUT,
            &format!("/sandbox/sandboxes/v1/{id}/files?path={path}"),
        )
        .body("x")
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success());
    let started = Instant::now();
    wait_until("the uploaded file's event", Duration::from_secs(20), || {
        lines.lock().unwrap().iter().any(|l| l.contains(&path))
    });
    println!("followed event after {:?}", started.elapsed());
    for l in lines.lock().unwrap().iter() {
        let e: serde_json::Value = serde_json::from_str(l).unwrap();
        assert!(e["seq"].as_u64().unwrap() > last, "{l}");
    }
    // Text output: one line per event.
    let mut cmd = berth(&c);
    cmd.args(["sandbox", "events", &id]);
    let (_, text, _) = output(cmd);
    assert_eq!(
        text.lines().count(),
        lines.lock().unwrap().len() + events.len()
    );
    // Ctrl-C stops it, cleanly.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    assert_eq!(
        wait_exit(&mut child, Duration::from_secs(10)).code(),
        Some(0)
    );

    // A follow ends by itself once the sandbox is deleted, after printing its last events.
    let mut child = berth(&c)
        .args(["sandbox", "events", &id, "--follow", "--json"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = lines_of(&mut child);
    wait_until("the replayed timeline", Duration::from_secs(20), || {
        lines.lock().unwrap().iter().any(|l| l.contains(&path))
    });
    c.client().delete(&id).await.unwrap();
    let deleted = Instant::now();
    let status = wait_exit(&mut child, Duration::from_secs(30));
    assert_eq!(status.code(), Some(0));
    println!("follow ended {:?} after the delete", deleted.elapsed());
    let all = lines.lock().unwrap().clone();
    let stored = c.client().events(&id, 0).await.unwrap()["events"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(all.len(), stored, "the follow missed events: {all:#?}");
    println!("{stored} events, all printed by the follow");
}

async fn port_forward_reaches_an_http_server_inside_the_sandbox(provider: Provider) {
    let c = ControllerProcess::start_on(provider, "").await;
    let id = sandbox(&c).await;
    // The process provider shares the host's network: pick a free port (any port does in a
    // container).
    let port = berth_tests::free_port();
    let marker = format!("served-from-the-sandbox-{}", std::process::id());
    let line = format!(
        "mkdir -p pf/sub && cd pf && echo {marker} > index.html && \
         exec python3 -m http.server {port} --bind 127.0.0.1"
    );
    let mut bg = shell(&line);
    bg.wait = Some(false);
    c.client().exec(&id, &bg).await.unwrap();

    let mut child = berth(&c)
        .args([
            "sandbox",
            "port-forward",
            &id,
            &format!(":{port}"),
            "--json",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = lines_of(&mut child);
    wait_until("the local URL", Duration::from_secs(20), || {
        !lines.lock().unwrap().is_empty()
    });
    let first: serde_json::Value = serde_json::from_str(&lines.lock().unwrap()[0]).unwrap();
    let url = first["url"].as_str().unwrap().to_string();
    assert_eq!(first["remote_port"], port);
    let http = reqwest::Client::new();
    let started = Instant::now();
    let body = berth_tests::wait_for(
        "the server through the forward",
        Duration::from_secs(30),
        || {
            let (http, url) = (http.clone(), url.clone());
            async move {
                let r = http.get(&url).send().await.ok()?;
                r.status().is_success().then_some(())?;
                r.text().await.ok()
            }
        },
    )
    .await;
    println!(
        "first answer through the forward after {:?}",
        started.elapsed()
    );
    assert_eq!(body.trim(), marker);
    // Paths, statuses and a second connection.
    let r = http
        .get(format!("{url}index.html?q=1"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap().trim(), marker);
    let r = http.get(format!("{url}nothing-here")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    // A redirect of the server inside points at the local root, not the preview route.
    let no_redirects = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = no_redirects.get(format!("{url}sub")).send().await.unwrap();
    assert_eq!(r.status(), 301);
    assert_eq!(r.headers()["location"], "/sub/");
    let r = http.get(format!("{url}sub")).send().await.unwrap();
    assert_eq!((r.status().as_u16(), r.url().path()), (200, "/sub/"));

    // A WebSocket upgrade through the forward: an echo server inside the sandbox.
    let ws_port = berth_tests::free_port();
    let script = std::env::temp_dir().join(format!("berth-ws-echo-{}.py", std::process::id()));
    std::fs::write(&script, WS_ECHO).unwrap();
    let mut cmd = berth(&c);
    cmd.args(["sandbox", "cp"])
        .arg(&script)
        .arg(format!("{id}:pf/ws_echo.py"));
    assert_eq!(output(cmd).0, Some(0));
    let _ = std::fs::remove_file(&script);
    let mut bg = shell(&format!("exec python3 pf/ws_echo.py {ws_port}"));
    bg.wait = Some(false);
    c.client().exec(&id, &bg).await.unwrap();
    let mut ws_child = berth(&c)
        .args([
            "sandbox",
            "port-forward",
            &id,
            &format!(":{ws_port}"),
            "--json",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let ws_lines = lines_of(&mut ws_child);
    wait_until("the second local URL", Duration::from_secs(20), || {
        !ws_lines.lock().unwrap().is_empty()
    });
    let first: serde_json::Value = serde_json::from_str(&ws_lines.lock().unwrap()[0]).unwrap();
    let ws_url = first["url"].as_str().unwrap().replacen("http", "ws", 1) + "echo";
    let mut ws = berth_tests::wait_for("the echo server", Duration::from_secs(30), || {
        let u = ws_url.clone();
        async move {
            tokio_tungstenite::connect_async(u)
                .await
                .ok()
                .map(|(ws, _)| ws)
        }
    })
    .await;
    use futures_util::{SinkExt, StreamExt};
    for i in 0..3 {
        let text = format!("hello-{i}");
        ws.send(tokio_tungstenite::tungstenite::Message::text(text.clone()))
            .await
            .unwrap();
        let back = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("echo within 10 s")
            .unwrap()
            .unwrap();
        assert_eq!(back.into_text().unwrap().as_str(), text);
    }
    println!("3 WebSocket messages echoed through the forward");
    let _ = ws.close(None).await;
    let _ = ws_child.kill();
    let _ = ws_child.wait();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    assert_eq!(
        wait_exit(&mut child, Duration::from_secs(10)).code(),
        Some(0)
    );
    c.client().delete(&id).await.unwrap();
}

on_every_provider!(
    shell_under_a_real_terminal_types_resizes_interrupts_and_exits_with_the_code,
    shell_with_piped_stdin_or_a_command_exits_with_its_code,
    cp_copies_files_and_directories_both_ways_streamed,
    events_prints_the_timeline_and_follow_sees_new_events,
    port_forward_reaches_an_http_server_inside_the_sandbox,
);

/// A WebSocket echo server (RFC 6455, text and binary frames up to 64 KiB) in the standard
/// library only, for `python3 ws_echo.py PORT`.
const WS_ECHO: &str = r#"
import base64, hashlib, socket, struct, sys, threading
GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
def recv_exact(c, n):
    b = b""
    while len(b) < n:
        d = c.recv(n - len(b))
        if not d:
            raise EOFError
        b += d
    return b
def serve(c):
    try:
        head = b""
        while b"\r\n\r\n" not in head:
            d = c.recv(4096)
            if not d:
                return
            head += d
        key = ""
        for line in head.decode().split("\r\n"):
            if line.lower().startswith("sec-websocket-key:"):
                key = line.split(":", 1)[1].strip()
        accept = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
        c.sendall(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                   "Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + "\r\n\r\n").encode())
        while True:
            b0, b1 = recv_exact(c, 2)
            op, n = b0 & 15, b1 & 127
            if n == 126:
                n = struct.unpack(">H", recv_exact(c, 2))[0]
            elif n == 127:
                n = struct.unpack(">Q", recv_exact(c, 8))[0]
            mask = recv_exact(c, 4) if b1 & 128 else b"\0\0\0\0"
            data = bytes(x ^ mask[i % 4] for i, x in enumerate(recv_exact(c, n)))
            if op == 8:
                c.sendall(b"\x88\x00")
                return
            if op in (1, 2):
                hdr = bytes([128 | op]) + (bytes([len(data)]) if len(data) < 126
                                           else bytes([126]) + struct.pack(">H", len(data)))
                c.sendall(hdr + data)
    except (EOFError, OSError):
        pass
    finally:
        c.close()
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(16)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// Every entry of a clap `-h` section (`Options:`, `Arguments:`, `Commands:`) has its text,
/// on its line or (clap's layout when some text is long) indented on the next.
fn undocumented(help: &str) -> Vec<String> {
    let lines: Vec<&str> = help.lines().collect();
    let mut missing = Vec::new();
    let mut in_section = false;
    for (i, line) in lines.iter().enumerate() {
        if line.ends_with(':') && !line.starts_with(' ') {
            in_section = matches!(*line, "Options:" | "Arguments:" | "Commands:");
            continue;
        }
        let is_entry = line.starts_with("  ") && !line.starts_with("   ");
        if !in_section || !is_entry {
            continue;
        }
        let entry = line.trim_start();
        let same_line = entry
            .split_once("  ")
            .is_some_and(|(_, d)| !d.trim().is_empty());
        let next_line = lines
            .get(i + 1)
            .is_some_and(|n| n.starts_with("   ") && !n.trim().is_empty());
        if !same_line && !next_line {
            missing.push(entry.to_string());
        }
    }
    missing
}

#[test]
fn every_subcommand_and_flag_has_help_text() {
    let commands: &[&[&str]] = &[
        &[],
        &["serve"],
        &["demo"],
        &["sandbox"],
        &["sandbox", "create"],
        &["sandbox", "get"],
        &["sandbox", "list"],
        &["sandbox", "rm"],
        &["sandbox", "exec"],
        &["sandbox", "shell"],
        &["sandbox", "cp"],
        &["sandbox", "events"],
        &["sandbox", "port-forward"],
        &["sandbox", "screenshot"],
        &["sandbox", "viewer"],
        &["lease"],
        &["lease", "acquire"],
        &["lease", "renew"],
        &["lease", "release"],
        &["image"],
        &["image", "build"],
        &["image", "push"],
        &["image", "lock"],
        &["verify"],
        &["verify", "desktop-osworld"],
    ];
    let mut entries = 0;
    let mut problems = Vec::new();
    for path in commands {
        let out = Command::new(workspace_bin("berth"))
            .args(*path)
            .arg("-h")
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{path:?}: {help}");
        entries += help
            .lines()
            .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
            .count();
        for m in undocumented(&help) {
            problems.push(format!("berth {}: {m}", path.join(" ")));
        }
    }
    println!(
        "{} commands, {entries} help entries checked",
        commands.len()
    );
    assert!(
        problems.is_empty(),
        "without help text:\n{}",
        problems.join("\n")
    );
    // The client commands that print data all take --json.
    for cmd in [
        "create",
        "get",
        "list",
        "rm",
        "exec",
        "cp",
        "events",
        "port-forward",
        "screenshot",
        "viewer",
    ] {
        let out = Command::new(workspace_bin("berth"))
            .args(["sandbox", cmd, "--help"])
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("--json"),
            "sandbox {cmd}"
        );
    }
}
