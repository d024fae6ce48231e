//! Test harness for berth's end-to-end tests and benchmarks: starts real berth-agent
//! processes on private state dirs and ports, and waits on conditions with deadlines (never on
//! bare sleeps).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use berth_protocol::AgentClient;

pub mod controller;
pub mod egress;
pub mod kube_fake;
pub mod layout;
#[cfg(test)]
mod lengths;
pub mod readme;
pub mod video;
pub mod x;

pub const TOKEN: &str = "test-token-0123456789";

/// A binary of this workspace, built in the same profile as the running test.
pub fn workspace_bin(name: &str) -> PathBuf {
    if let Ok(p) = std::env::var(format!(
        "BERTH_TEST_{}",
        name.to_uppercase().replace('-', "_")
    )) {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test> or target/<profile>/<bin>
    let mut dir = exe.parent().expect("exe dir").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build the workspace binaries first (cargo build --workspace --bins)",
        path.display()
    );
    path
}

/// A port nothing uses right now, for TCP and UDP alike on every address, that a server
/// started later (or again after a restart) can take: drawn at random from below the
/// kernel's ephemeral range, so no client connection of a test running beside this one is
/// handed it in the meantime (a port the kernel gave out and took back once was, and a
/// controller restarted onto it found it taken).
pub fn free_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (low, high) = (10_000u16, ephemeral_low.max(10_001));
    let mut seed = std::collections::hash_map::RandomState::new().build_hasher();
    seed.write_u32(std::process::id());
    let mut x = seed.finish() | 1;
    for _ in 0..1_000 {
        // xorshift: a fresh candidate each round.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let port = low + (x % u64::from(high - low)) as u16;
        let tcp = std::net::TcpListener::bind(("0.0.0.0", port));
        let udp = std::net::UdpSocket::bind(("0.0.0.0", port));
        if tcp.is_ok() && udp.is_ok() {
            return port;
        }
    }
    panic!("no free port in {low}..{high} after 1000 tries");
}

/// Polls `cond` until it yields `Some` or `timeout` passes (then panics naming `what`).
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, cond: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    match poll_until(timeout, cond).await {
        Some(v) => v,
        None => panic!("timed out after {timeout:?} waiting for {what}"),
    }
}

/// Polls `cond` until it yields `Some`; `None` once `timeout` passes.
pub async fn poll_until<T, F, Fut>(timeout: Duration, mut cond: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = cond().await {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What an agent sees first on an XFCE desktop: Chromium maximised right under the top panel,
/// focused, in its own frame. Started before the panel, Chrome took the window manager's title
/// bar, sat below it and lost the focus (tests/screenshots/xfce-browser-started-before-the-panel.png).
/// Waits (30 s at most) for the panel and a focused Chromium window, then asserts where it is.
pub async fn assert_browser_under_the_panel(agent: &AgentClient) {
    let (panel, chrome) = wait_for(
        "the top panel and a focused Chromium window",
        Duration::from_secs(30),
        || async {
            let windows = agent.desktop_state().await.ok()?.windows;
            let panel = windows
                .iter()
                .filter(|w| w.class == "Xfce4-panel" && w.y == 0)
                .max_by_key(|w| w.width)?
                .clone();
            let chrome = windows
                .into_iter()
                .find(|w| w.class == "Google-chrome" && w.focused)?;
            Some((panel, chrome))
        },
    )
    .await;
    assert!(chrome.maximized, "{chrome:?}");
    assert_eq!(
        (chrome.x, chrome.y, chrome.width),
        (0, panel.height as i32, panel.width),
        "Chromium not right under the panel (a title bar above it?): {chrome:?}, panel {panel:?}"
    );
}

/// Milliseconds since the epoch of an RFC 3339 time (the API's and Docker's timestamps).
pub fn epoch_ms(rfc3339: &str) -> Option<i64> {
    let t = humantime::parse_rfc3339_weak(rfc3339).ok()?;
    Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() as i64)
}

/// Blocking flavour of `wait_for` for synchronous checks.
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until command `id` reaches `state` (a deadline of `timeout`) and returns its record.
pub async fn wait_state(
    c: &AgentClient,
    id: &str,
    state: berth_protocol::CommandState,
    timeout: Duration,
) -> berth_protocol::CommandInfo {
    wait_for(
        &format!("command {id} to be {state:?}"),
        timeout,
        || async { c.command(id).await.ok().filter(|i| i.state == state) },
    )
    .await
}

/// A local account for tests that switch identity (created once; needs root). `None` when
/// the test cannot run as root, after saying so.
pub fn test_account(name: &str) -> Option<nix::unistd::User> {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("skipped: needs root to create an account and switch to it");
        return None;
    }
    let home = format!("/home/{name}");
    let _ = Command::new("useradd")
        .args([
            "--create-home",
            "--home-dir",
            &home,
            "--shell",
            "/bin/sh",
            name,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let user = nix::unistd::User::from_name(name)
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("could not create the test account {name}"));
    Some(user)
}

/// Options for starting an agent.
#[derive(Clone, Default)]
pub struct AgentOptions {
    pub extra_args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// The sandbox home (default: a fresh directory beside the state dir).
    pub home: Option<PathBuf>,
    /// A command the agent runs under (`exec`s the agent with its arguments appended), e.g.
    /// a mount namespace with a tiny file system.
    pub wrapper: Vec<String>,
}

/// A running berth-agent with its own state dir, home and port. Dropping it shuts it down
/// fully and kills anything it left.
pub struct AgentProcess {
    pub child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub state_dir: PathBuf,
    pub home: PathBuf,
    pub base: String,
    pub opts: AgentOptions,
}

impl AgentProcess {
    pub async fn start() -> AgentProcess {
        Self::start_with(AgentOptions::default()).await
    }

    pub async fn start_with(opts: AgentOptions) -> AgentProcess {
        let dir = tempfile::Builder::new()
            .prefix("berth-test-")
            .tempdir()
            .expect("tempdir");
        Self::start_in(dir, opts).await
    }

    /// Starts in a directory the test prepared (state in `dir/state`, home in `dir/home`).
    pub async fn start_in(dir: tempfile::TempDir, opts: AgentOptions) -> AgentProcess {
        let state_dir = dir.path().join("state");
        let home = opts.home.clone().unwrap_or_else(|| dir.path().join("home"));
        std::fs::create_dir_all(&home).unwrap();
        let mut a = AgentProcess {
            child: None,
            dir,
            state_dir,
            home,
            base: String::new(),
            opts,
        };
        a.launch().await;
        a
    }

    /// Starts (again) on the same state dir and home: what a restart looks like.
    pub async fn launch(&mut self) {
        let _ = std::fs::remove_file(self.state_dir.join("endpoints.json"));
        let mut cmd = match self.opts.wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(workspace_bin("berth-agent"));
                c
            }
            None => Command::new(workspace_bin("berth-agent")),
        };
        cmd.arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--state-dir")
            .arg(&self.state_dir)
            .arg("--home")
            .arg(&self.home)
            .args(&self.opts.extra_args)
            .env("BERTH_AGENT_TOKEN", TOKEN)
            .env("BERTH_AGENT_LOG", "warn")
            .envs(self.opts.env.iter().cloned())
            .stdin(Stdio::null());
        let child = cmd.spawn().expect("spawn berth-agent");
        self.child = Some(child);
        let endpoints = self.state_dir.join("endpoints.json");
        let mut listen = String::new();
        wait_until("the agent to bind", Duration::from_secs(20), || {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                panic!("berth-agent exited during start-up: {status}");
            }
            match std::fs::read(&endpoints)
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            {
                Some(v) => {
                    listen = v["listen"].as_str().unwrap_or_default().to_string();
                    true
                }
                None => false,
            }
        });
        self.base = format!("http://{listen}");
    }

    pub fn client(&self) -> AgentClient {
        AgentClient::new(self.base.clone(), Some(TOKEN.to_string()))
    }

    /// A client without a token (for the compat surface and auth tests).
    pub fn anonymous(&self) -> AgentClient {
        AgentClient::new(self.base.clone(), None)
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// GET a native route with the token: the JSON body of a 2xx answer (panics otherwise).
    pub async fn get_json(&self, path: &str) -> serde_json::Value {
        let r = self
            .client()
            .request(reqwest::Method::GET, path)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{path}: {}", r.status());
        r.json().await.unwrap()
    }

    /// GET a compat route (no token): the JSON body, whatever the status.
    pub async fn compat_json(&self, path: &str) -> serde_json::Value {
        reqwest::get(self.url(path))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("agent running").id()
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid() as i32), sig);
    }

    /// Waits for the agent process to exit and returns its status.
    pub fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("agent running");
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = child.try_wait().expect("try_wait") {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "agent did not exit in {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `kill -9` of the agent, as a crash.
    pub fn kill9(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGKILL);
        self.wait_exit(Duration::from_secs(10));
    }

    /// Shims recorded in the state dir that are still the same processes (pid + start time).
    pub fn live_supervisors(&self) -> Vec<u32> {
        let mut pids = Vec::new();
        if let Ok(rd) = std::fs::read_dir(self.state_dir.join("commands")) {
            for e in rd.flatten() {
                if let Some(v) = std::fs::read(e.path().join("proc.json"))
                    .ok()
                    .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                    && let (Some(pid), Some(start)) =
                        (v["supervisor_pid"].as_u64(), v["supervisor_start"].as_u64())
                    && start_time(pid as u32) == Some(start)
                    && pid_alive(pid as u32)
                {
                    pids.push(pid as u32);
                }
            }
        }
        pids
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGINT,
            );
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        // Whatever a crashed agent left behind (tests that kill -9) is killed here.
        for pid in self.live_supervisors() {
            for p in processes_with_root(pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

/// A process's start time (`/proc/<pid>/stat` field 22), which tells a recycled pid apart.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether a process exists (and is not a zombie).
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rsplit_once(')')
            .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
            .unwrap_or(false),
        Err(_) => false,
    }
}

/// `pid` and all its live descendants.
pub fn processes_with_root(pid: u32) -> Vec<u32> {
    let mut parent_of = std::collections::HashMap::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat"))
                && let Some((_, rest)) = stat.rsplit_once(')')
            {
                let f: Vec<&str> = rest.split_whitespace().collect();
                if f.first() != Some(&"Z")
                    && let Some(pp) = f.get(1).and_then(|s| s.parse::<u32>().ok())
                {
                    parent_of.insert(p, pp);
                }
            }
        }
    }
    let mut out = Vec::new();
    if parent_of.contains_key(&pid) {
        out.push(pid);
    }
    let mut grew = true;
    while grew {
        grew = false;
        for (&p, &pp) in &parent_of {
            if out.contains(&pp) && !out.contains(&p) {
                out.push(p);
                grew = true;
            }
        }
    }
    out
}

/// Live processes whose command line contains `needle` (a marker a test put in its command).
pub fn processes_matching(needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if p == std::process::id() {
                continue;
            }
            if let Ok(cmd) = std::fs::read(format!("/proc/{p}/cmdline")) {
                let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
                if cmd.contains(needle) && pid_alive(p) {
                    out.push(p);
                }
            }
        }
    }
    out
}

/// An `AgentOptions::wrapper` that starts the agent in its own mount namespace with a `size`
/// tmpfs (`1m`, `2m`, …) mounted on `mount_point` — a small disk only the agent sees, for
/// disk-full tests. Uses a user namespace when not root.
pub fn tmpfs_wrapper(mount_point: &Path, size: &str) -> Vec<String> {
    let root = nix::unistd::geteuid().is_root();
    vec![
        "unshare".into(),
        if root { "-m" } else { "-rm" }.into(),
        "sh".into(),
        "-c".into(),
        format!(
            "mount -t tmpfs -o size={size} tmpfs {} && exec \"$0\" \"$@\"",
            mount_point.display()
        ),
    ]
}

/// A `sleep` argument unique to one test (`<secs>.<random digits>`), so the test can find
/// exactly its own processes in the process table.
pub fn unique_sleep(secs: u32) -> String {
    let mut b = [0u8; 6];
    getrandom_bytes(&mut b);
    let digits: String = b.iter().map(|x| format!("{:03}", x)).collect();
    format!("{secs}.{digits}")
}

fn getrandom_bytes(b: &mut [u8]) {
    use std::io::Read;
    let _ = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(b));
}

/// GET through a client, `None` on any failure (for conditions polled until they hold).
pub async fn try_json(c: &AgentClient, path: &str) -> Option<serde_json::Value> {
    c.request(reqwest::Method::GET, path)
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()
}

/// Sends one raw HTTP/1.1 request on a new connection and reads the whole answer.
pub async fn raw_http(addr: &str, request: &[u8]) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(request).await.expect("write");
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.expect("read");
    out
}

/// The `host:port` of a base URL.
pub fn host_port(base: &str) -> &str {
    base.trim_start_matches("http://")
}

/// Reads the VmHWM (peak resident set) of a process in KiB.
pub fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Current resident set of a process in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Writes `len` bytes of a deterministic pattern to `path` without holding them in memory.
pub fn write_pattern_file(path: &Path, len: u64) {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let block: Vec<u8> = (0..65536u32).map(|i| (i * 7 + i / 251) as u8).collect();
    let mut left = len;
    let mut n: u8 = 0;
    while left > 0 {
        let take = left.min(block.len() as u64) as usize;
        let mut b = block[..take].to_vec();
        b[0] = n; // every block differs, so a misplaced block is caught
        n = n.wrapping_add(1);
        f.write_all(&b).unwrap();
        left -= take as u64;
    }
    f.flush().unwrap();
}

/// CPU time (user + system) a live process has used so far, in seconds.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces): state is 3rd, utime 14th,
    // stime 15th of the whole line.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (ticks(11) + ticks(12)) as f64 / hz
}

/// A finished command's stdout, then its stderr, as text.
pub fn output_text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs a Playwright for Python script (`python3 -c`) with `args`, killed after `secs`: its
/// stdout; panics with its stderr when it fails.
pub fn playwright(script: &str, args: &[&str], secs: u32) -> String {
    let out = Command::new("timeout")
        .arg(secs.to_string())
        .args(["python3", "-c", script])
        .args(args)
        .output()
        .expect("python3 with playwright (tests/setup.sh installs it)");
    assert!(
        out.status.success(),
        "playwright: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Reads a terminal's binary frames until their text holds `needle` (20 s at most): everything
/// read so far.
pub async fn read_terminal_until(
    ws: &mut berth_protocol::client::WebSocket,
    needle: &str,
) -> String {
    use futures_util::StreamExt;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut text = String::new();
    while !text.contains(needle) {
        let msg = tokio::time::timeout_at(deadline, ws.next())
            .await
            .unwrap_or_else(|_| panic!("{needle:?} never came; the terminal said {text:?}"))
            .expect("the terminal stayed open")
            .expect("a frame");
        if let tokio_tungstenite::tungstenite::Message::Binary(b) = msg {
            text.push_str(&String::from_utf8_lossy(&b));
        }
    }
    text
}

/// The exit code of terminal `id`'s program, once it has ended (20 s at most).
pub async fn terminal_exit_code(agent: &AgentClient, id: &str) -> i32 {
    wait_for(
        "the terminal's program to end",
        Duration::from_secs(20),
        || async move { agent.pty(id).await.ok()?.exit_code },
    )
    .await
}

/// Where a test saves a screenshot named `name`: `tests/screenshots/` with
/// `BERTH_UPDATE_SCREENSHOTS=1` (committed, looked at), else the test's own `tmp`.
pub fn screenshot_path(name: &str, tmp: &std::path::Path) -> std::path::PathBuf {
    match std::env::var("BERTH_UPDATE_SCREENSHOTS").is_ok_and(|v| v == "1") {
        true => std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("screenshots")
            .join(name),
        false => tmp.join(name),
    }
}
