//! The fault suite: what a crash or a vanishing client does to work in flight. Real `berth
//! serve` killed with `kill -9` at random points of creates, execs and deletes (on every
//! provider), real clients resetting their connections at random points of the agent's mutating
//! routes. Every case is bounded; each prints its counts. The seed of the random points is
//! printed, and `BERTH_FAULT_SEED` replays one.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use berth_protocol::controller::{CreateSandbox, RunRequest};
use berth_protocol::lifecycle::SandboxStatus;
use berth_tests::controller::{ControllerProcess, Provider, ide, shell};
use berth_tests::{AgentProcess, host_port, wait_for};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

/// A small deterministic generator for the random points (xorshift64*).
struct Points(u64);

impl Points {
    fn new(what: &str) -> Points {
        let seed = std::env::var("BERTH_FAULT_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
                    | 1
            });
        println!("{what}: BERTH_FAULT_SEED={seed}");
        Points(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A delay in `0..max_ms` milliseconds.
    fn delay(&mut self, max_ms: u64) -> Duration {
        Duration::from_micros(self.next() % (max_ms * 1000))
    }
}

/// What a client does after its request to a controller that died: it asks again with the same
/// id until the (restarted) controller answers.
async fn exec_until_answered(c: &ControllerProcess, sandbox: &str, req: &RunRequest) -> Value {
    wait_for(
        "the restarted controller to take the run",
        Duration::from_secs(60),
        || async {
            let r = c
                .client()
                .request(
                    reqwest::Method::POST,
                    &format!("/sandbox/sandboxes/v1/{sandbox}/exec"),
                )
                .json(&RunRequest {
                    wait: Some(false),
                    ..req.clone()
                })
                .send()
                .await
                .ok()?;
            assert!(
                r.status().is_success(),
                "a retried exec answered {}",
                r.status()
            );
            r.json::<Value>().await.ok()
        },
    )
    .await
}

/// 20 `kill -9`s of the controller while an exec is in flight (before the agent has it, while
/// the agent starts it, while it runs, as it answers), each followed by a restart and the
/// client's retry under the same run id: every run ends `exited` with its own exit code and
/// output, and ran exactly once.
async fn controller_kill_9_during_execs_loses_no_run_and_runs_none_twice(provider: Provider) {
    const KILLS: usize = 20;
    let mut points = Points::new("controller kill -9 during execs");
    let mut c = ControllerProcess::start_on(provider, "").await;
    let sb = c.client().create(&ide()).await.unwrap();
    let mut at_restart: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..KILLS {
        let req = RunRequest {
            run_id: Some(format!("k{i}")),
            ..shell(&format!(
                "echo {i} >> \"$HOME/runs.log\"; sleep 0.2; echo out-{i}; exit {}",
                i % 7
            ))
        };
        let cl = c.client();
        let (id, r) = (sb.id.clone(), req.clone());
        let call = tokio::spawn(async move { cl.exec(&id, &r).await });
        tokio::time::sleep(points.delay(400)).await;
        c.kill9();
        let answered = call.await.unwrap().is_ok();
        c.launch();
        // How the restarted controller found it (before the client asks again).
        let seen = match c.client().run(&sb.id, &format!("k{i}")).await {
            Ok(r) => r.status.to_string(),
            Err(_) => "unknown".into(),
        };
        *at_restart
            .entry(if answered {
                format!("answered, {seen}")
            } else {
                format!("unanswered, {seen}")
            })
            .or_default() += 1;
        exec_until_answered(&c, &sb.id, &req).await;
    }
    let cl = c.client();
    let (mut exited, mut lost) = (0, 0);
    for i in 0..KILLS {
        let run = wait_for("the run to end", Duration::from_secs(60), || async {
            let r = cl.run(&sb.id, &format!("k{i}")).await.ok()?;
            r.done().then_some(r)
        })
        .await;
        if (run.status.as_str(), run.exit_code) == ("exited", Some((i % 7) as i32))
            && run.stdout == format!("out-{i}\n")
        {
            exited += 1;
        } else {
            lost += 1;
            eprintln!("run k{i}: {run:?}");
        }
    }
    let log = cl
        .exec(&sb.id, &shell("cat \"$HOME/runs.log\""))
        .await
        .unwrap();
    let mut times = [0usize; KILLS];
    for line in log.stdout.lines() {
        times[line.parse::<usize>().unwrap()] += 1;
    }
    let twice = times.iter().filter(|&&n| n > 1).count();
    let never = times.iter().filter(|&&n| n == 0).count();
    let delivered = c
        .log_text()
        .matches("delivering a run the agent has no record of")
        .count();
    println!(
        "{KILLS} controller kills during execs: {exited} runs exited with their code and output, \
         {lost} lost, {twice} executed twice, {never} never executed; \
         {delivered} delivered by a restarted controller; at restart: {at_restart:?}"
    );
    assert_eq!((exited, lost, twice, never), (KILLS, 0, 0, 0));
    cl.delete(&sb.id).await.unwrap();
}

/// `kill -9` at random points of creates and deletes: after the restart every sandbox settles
/// (running, or failed with nothing left of it), every delete finishes, and no orphan remains.
async fn controller_kill_9_during_creates_and_deletes_leaves_no_orphan(provider: Provider) {
    const ROUNDS: usize = 6;
    let mut points = Points::new("controller kill -9 during creates and deletes");
    let mut c = ControllerProcess::start_on(provider, "orphan_grace_secs = 0\n").await;
    let mut settled: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..ROUNDS {
        // A create in flight.
        let cl = c.client();
        let create = tokio::spawn(async move { cl.create(&ide()).await });
        tokio::time::sleep(points.delay(1500)).await;
        c.kill9();
        let _ = create.await;
        c.launch();
        // A delete in flight, of a sandbox that is running.
        let victim = c.client().create(&ide()).await.unwrap();
        let cl = c.client();
        let id = victim.id.clone();
        let delete = tokio::spawn(async move { cl.delete(&id).await });
        tokio::time::sleep(points.delay(300)).await;
        c.kill9();
        let _ = delete.await;
        c.launch();
        // The client asks again; a delete is idempotent.
        let r = c
            .client()
            .request(
                reqwest::Method::DELETE,
                &format!("/sandbox/sandboxes/v1/{}", victim.id),
            )
            .send()
            .await
            .unwrap();
        assert!(
            r.status().is_success() || r.status() == 404,
            "{}",
            r.status()
        );
        let cl = c.client();
        wait_for(
            "the deleted sandbox to be gone",
            Duration::from_secs(60),
            || async {
                let sb = cl.get(&victim.id).await.ok()?;
                let left = c.leftovers(&victim.id);
                let gone = matches!(sb.status.as_str(), "stopped" | "failed") && left.is_empty();
                if !gone {
                    eprintln!("deleted sandbox {}: {} {left:?}", sb.id, sb.status);
                }
                gone.then_some(())
            },
        )
        .await;
        // Every sandbox the store knows settles.
        for sb in cl.list(&[]).await.unwrap().sandboxes {
            let sb = wait_for("a sandbox to settle", Duration::from_secs(90), || async {
                let sb = cl.get(&sb.id).await.ok()?;
                use SandboxStatus::*;
                (!matches!(sb.status, Pending | Starting | Stopping)).then_some(sb)
            })
            .await;
            if sb.id != victim.id {
                *settled.entry(sb.status.to_string()).or_default() += 1;
            }
            if sb.status == SandboxStatus::Running {
                cl.delete(&sb.id).await.unwrap();
            }
        }
    }
    let cl = c.client();
    wait_for("nothing to be left", Duration::from_secs(60), || async {
        c.all_leftovers().is_empty().then_some(())
    })
    .await;
    let live = cl
        .list(&[])
        .await
        .unwrap()
        .sandboxes
        .iter()
        .filter(|s| matches!(s.status.as_str(), "pending" | "starting" | "running"))
        .count();
    println!(
        "{} controller kills during creates and deletes: creates settled {settled:?}, \
         {ROUNDS} deletes finished, 0 orphans, {live} live",
        2 * ROUNDS
    );
    assert_eq!(live, 0);
}

/// A run started without waiting shows its end at once, with the reconcile interval at a
/// minute: the controller follows the agent's events. Unloaded the lag is 4-22 ms; the bound is
/// the agent's own fallback (it re-reads its commands every second when a file event is late)
/// with room for a loaded machine, far below the reconcile.
async fn a_run_that_was_not_waited_for_shows_its_end_long_before_the_next_reconcile(
    provider: Provider,
) {
    let c = ControllerProcess::start_on(provider, "reconcile_interval_secs = 60.0\n").await;
    let cl = c.client();
    let sb = cl.create(&ide()).await.unwrap();
    let mut lags = Vec::new();
    for i in 0..5 {
        let run = cl
            .exec(
                &sb.id,
                &RunRequest {
                    wait: Some(false),
                    ..shell(&format!("sleep 0.5; date +%s%3N; exit {}", i + 1))
                },
            )
            .await
            .unwrap();
        assert_eq!(run.status, "running");
        let done = wait_for(
            "the run to show exited",
            Duration::from_secs(10),
            || async {
                let r = cl.run(&sb.id, &run.id).await.ok()?;
                r.done().then_some((r, now_ms()))
            },
        )
        .await;
        let (r, seen_at) = done;
        assert_eq!((r.status.as_str(), r.exit_code), ("exited", Some(i + 1)));
        let ended_at: i64 = r.stdout.trim().parse().unwrap();
        lags.push(seen_at - ended_at);
    }
    println!("a run's end seen through the controller after (ms): {lags:?}");
    for lag in &lags {
        assert!(*lag < 5000, "a run's end took {lag} ms to show: {lags:?}");
    }
    cl.delete(&sb.id).await.unwrap();
}

/// A pool resized up and down while claims race it: every claim gets its own running sandbox,
/// no claimed sandbox is destroyed by a shrink, and the pool settles at its last size.
async fn a_pool_resized_under_claims_spares_every_claimed_sandbox(provider: Provider) {
    const CLAIMS: usize = 12;
    let c = ControllerProcess::start_on(provider, "[[pools]]\nprofile = \"ide\"\nsize = 4\n").await;
    let cl = c.client();
    let pool = || async { c.client().pools().await.unwrap()["pools"][0].clone() };
    wait_for("the pool to fill", Duration::from_secs(90), || async {
        (pool().await["ready"] == 4).then_some(())
    })
    .await;
    let claims = futures_util::future::join_all((0..CLAIMS).map(|i| {
        let cl = cl.clone();
        async move {
            cl.create(&CreateSandbox {
                labels: BTreeMap::from([("caller".into(), i.to_string())]),
                ..ide()
            })
            .await
            .unwrap()
        }
    }));
    let resizes = async {
        for size in [0, 6, 1, 3, 2] {
            cl.adjust_pool("ide", None, Some(size)).await.unwrap();
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    };
    let (got, ()) = tokio::join!(claims, resizes);
    let ids: std::collections::BTreeSet<&str> = got.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids.len(), CLAIMS, "a sandbox was handed out twice");
    let warm = got
        .iter()
        .filter(|s| s.claim.as_deref() == Some("warm"))
        .count();
    let p = wait_for(
        "the pool to settle at 2",
        Duration::from_secs(90),
        || async {
            let p = pool().await;
            (p["size"] == 2 && p["ready"] == 2 && p["starting"] == 0).then_some(p)
        },
    )
    .await;
    for s in &got {
        assert!(c.sandbox_alive(&s.id), "claimed {} was destroyed", s.id);
        let r = cl.exec(&s.id, &shell("echo alive")).await.unwrap();
        assert_eq!(r.stdout, "alive\n");
    }
    wait_for(
        "only claimed and pool sandboxes to run",
        Duration::from_secs(60),
        || async { (c.live_sandboxes() == CLAIMS + 2).then_some(()) },
    )
    .await;
    println!(
        "{CLAIMS} claims during 5 resizes (4→0→6→1→3→2): {warm} warm, {} cold, 0 handed out \
         twice, 0 claimed destroyed; pool settled {p}",
        CLAIMS - warm
    );
    for s in &got {
        cl.delete(&s.id).await.unwrap();
    }
}

/// A run whose request never reached the agent (the agent stopped, then killed, while the
/// controller was killed waiting on it) is delivered by the restarted controller and runs once.
/// Docker only: there `berth-agent init` brings the agent back in the same sandbox.
#[tokio::test]
async fn docker_a_run_that_never_reached_the_agent_is_delivered_after_a_restart_and_runs_once() {
    let mut c = ControllerProcess::start_on(Provider::Docker, "").await;
    let sb = c.client().create(&ide()).await.unwrap();
    let container = format!("berth-{}", sb.id);
    let in_container = |script: &str| {
        std::process::Command::new("docker")
            .args(["exec", "-u", "0", &container, "sh", "-c", script])
            .output()
            .unwrap()
    };
    let agent_pids = || {
        String::from_utf8_lossy(&in_container("pgrep -f 'berth-agent [-]-listen'").stdout)
            .split_whitespace()
            .map(String::from)
            .collect::<Vec<_>>()
    };
    let before = agent_pids();
    assert_eq!(before.len(), 1, "{before:?}");
    assert!(
        in_container(&format!("kill -STOP {}", before[0]))
            .status
            .success()
    );
    let req = RunRequest {
        run_id: Some("undelivered".into()),
        ..shell("echo ran >> \"$HOME/undelivered.log\"; exit 5")
    };
    let cl = c.client();
    let (id, r) = (sb.id.clone(), req.clone());
    let call = tokio::spawn(async move { cl.exec(&id, &r).await });
    // The controller has the run and is waiting on the stopped agent.
    wait_for(
        "the run to be recorded",
        Duration::from_secs(10),
        || async {
            let r = c.client().run(&sb.id, "undelivered").await.ok()?;
            (r.status == "pending").then_some(())
        },
    )
    .await;
    c.kill9();
    let _ = call.await;
    // The agent dies with the request unread; init starts a new one.
    assert!(
        in_container(&format!("kill -KILL {}", before[0]))
            .status
            .success()
    );
    wait_for("a new agent to answer", Duration::from_secs(30), || async {
        let pids = agent_pids();
        let up = pids.len() == 1
            && pids != before
            && in_container("wget -q -O- http://127.0.0.1:5000/healthz || curl -sf http://127.0.0.1:5000/healthz")
                .status
                .success();
        up.then_some(())
    })
    .await;
    c.launch();
    let cl = c.client();
    let run = wait_for("the run to end", Duration::from_secs(60), || async {
        let r = cl.run(&sb.id, "undelivered").await.ok()?;
        r.done().then_some(r)
    })
    .await;
    assert_eq!(
        (run.status.as_str(), run.exit_code),
        ("exited", Some(5)),
        "{run:?}"
    );
    let log = cl
        .exec(&sb.id, &shell("cat \"$HOME/undelivered.log\""))
        .await
        .unwrap();
    assert_eq!(log.stdout, "ran\n", "ran exactly once");
    assert!(
        c.log_text()
            .contains("delivering a run the agent has no record of"),
        "delivered by the restarted controller"
    );
    println!(
        "a run the agent never received: delivered after the controller restart, ran once, exit 5"
    );
    cl.delete(&sb.id).await.unwrap();
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

berth_tests::on_every_provider!(
    controller_kill_9_during_execs_loses_no_run_and_runs_none_twice,
    controller_kill_9_during_creates_and_deletes_leaves_no_orphan,
    a_run_that_was_not_waited_for_shows_its_end_long_before_the_next_reconcile,
    a_pool_resized_under_claims_spares_every_claimed_sandbox,
);

/// Sends the first `cut_at` bytes of `request` on a fresh connection, waits `after`, and resets
/// the connection (RST, not FIN): a client that vanished.
async fn send_and_reset(addr: &str, request: &[u8], cut_at: usize, after: Duration) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.set_nodelay(true).unwrap();
    let _ = s.write_all(&request[..cut_at.min(request.len())]).await;
    tokio::time::sleep(after).await;
    let std = s.into_std().unwrap();
    let sock = socket_linger_zero(std);
    drop(sock);
}

fn socket_linger_zero(s: std::net::TcpStream) -> std::net::TcpStream {
    use std::os::fd::AsRawFd;
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket and a correctly sized option value.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &linger as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    s
}

fn http_request(method: &str, path: &str, content_type: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "{method} {path} HTTP/1.1\r\nHost: agent\r\nAuthorization: Bearer {}\r\n\
         Content-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
        berth_tests::TOKEN,
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

/// A background exec whose client resets 0–9 ms after sending it: the command runs at most
/// once, the agent has its record whenever it ran, and the client's retry under the same id
/// gets that command (202), never a 409.
#[tokio::test]
async fn a_client_reset_after_a_background_exec_leaves_one_command_under_its_id() {
    const TRIES: usize = 40;
    let mut points = Points::new("client resets after a background exec");
    let a = AgentProcess::start().await;
    let addr = host_port(&a.base).to_string();
    let client = a.client();
    let (mut ran_before_retry, mut started_by_retry) = (0, 0);
    for i in 0..TRIES {
        let id = format!("reset-{i}");
        let marker = a.home.join(format!("ran-{i}"));
        let body = json!({
            "shell": format!("echo x >> '{}'", marker.display()),
            "background": true,
            "id": id,
        })
        .to_string();
        let req = http_request("POST", "/v1/exec", "application/json", body.as_bytes());
        send_and_reset(&addr, &req, req.len(), points.delay(10)).await;
        // Whether the agent had it: its record exists (now or once the creation it accepted
        // finishes) or it never ran.
        let known = client.command(&id).await.is_ok();
        let retry = client
            .request(reqwest::Method::POST, "/v1/exec")
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(
            retry.status(),
            202,
            "try {i}: the retry answered {}",
            retry.status()
        );
        let v: Value = retry.json().await.unwrap();
        assert_eq!(v["id"], id);
        if known {
            ran_before_retry += 1;
        } else {
            started_by_retry += 1;
        }
        wait_for("the command to end", Duration::from_secs(10), || async {
            let info = client.command(&id).await.ok()?;
            (info.state != berth_protocol::CommandState::Running).then_some(())
        })
        .await;
        let ran = std::fs::read_to_string(&marker).unwrap_or_default();
        assert_eq!(
            ran,
            "x\n",
            "try {i}: the command ran {} times",
            ran.len() / 2
        );
    }
    println!(
        "{TRIES} client resets after a background exec: each command ran once \
         ({ran_before_retry} known to the agent before the retry, {started_by_retry} started by it), \
         0 answered 409"
    );
}

/// Client resets at random points (mid-head, mid-body, after the body) of every mutating agent
/// route: the agent stays up and the same request then succeeds; a cut upload leaves neither a
/// partial file nor a temp file.
#[tokio::test]
async fn client_resets_at_random_points_of_every_mutating_route_break_nothing() {
    const ROUNDS: usize = 6;
    let mut points = Points::new("client resets on mutating routes");
    let a = AgentProcess::start().await;
    let addr = host_port(&a.base).to_string();
    let client = a.client();
    let home = a.home.display().to_string();
    let upload = vec![b'u'; 256 << 10];
    let mut multipart = format!(
        "--XyZ\r\nContent-Disposition: form-data; name=\"file_path\"\r\n\r\n{home}/compat.bin\r\n\
         --XyZ\r\nContent-Disposition: form-data; name=\"file_data\"; filename=\"compat.bin\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    multipart.extend(vec![b'c'; 128 << 10]);
    multipart.extend(b"\r\n--XyZ--\r\n");
    std::fs::write(a.home.join("mv.txt"), "moved").unwrap();
    // A command reading its stdin, for the stdin route.
    let cat = "reset-stdin-cat";
    let started = client
        .request(reqwest::Method::POST, "/v1/exec")
        .json(&json!({"argv": ["cat"], "background": true, "stdin_open": true, "id": cat}))
        .send()
        .await
        .unwrap();
    assert_eq!(started.status(), 202);
    let routes: Vec<(&str, String, &str, Vec<u8>)> = vec![
        (
            "POST",
            "/v1/exec".into(),
            "application/json",
            json!({"shell": "echo fg"}).to_string().into_bytes(),
        ),
        (
            "PUT",
            format!("/v1/files?path={home}/up.bin"),
            "application/octet-stream",
            upload.clone(),
        ),
        (
            "POST",
            "/v1/fs/mkdir".into(),
            "application/json",
            json!({"path": format!("{home}/dir"), "parents": true})
                .to_string()
                .into_bytes(),
        ),
        (
            "POST",
            "/v1/pty".into(),
            "application/json",
            json!({"cmd": ["sh"]}).to_string().into_bytes(),
        ),
        (
            "POST",
            "/execute".into(),
            "application/json",
            json!({"command": "echo compat", "shell": true})
                .to_string()
                .into_bytes(),
        ),
        (
            "POST",
            "/setup/upload".into(),
            "multipart/form-data; boundary=XyZ",
            multipart.clone(),
        ),
        (
            "POST",
            format!("/v1/commands/{cat}/stdin"),
            "application/json",
            json!({"data": "line\n"}).to_string().into_bytes(),
        ),
        (
            "POST",
            "/v1/fs/move".into(),
            "application/json",
            json!({"from": format!("{home}/mv.txt"), "to": format!("{home}/mv.txt"), "overwrite": true})
                .to_string()
                .into_bytes(),
        ),
    ];
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for round in 0..ROUNDS {
        for (method, path, ct, body) in &routes {
            let req = http_request(method, path, ct, body);
            let head_len = req.len() - body.len();
            let cut = match round % 3 {
                0 => (points.next() as usize) % head_len,
                1 => head_len + (points.next() as usize) % body.len().max(1),
                _ => req.len(),
            };
            send_and_reset(&addr, &req, cut, points.delay(5)).await;
            *counts
                .entry(["mid-head", "mid-body", "after the body"][round % 3])
                .or_default() += 1;
            let r = client
                .request(method.parse().unwrap(), path)
                .header("content-type", *ct)
                .body(body.clone())
                .send()
                .await
                .unwrap();
            assert!(
                r.status().is_success(),
                "{method} {path} after a reset: {}",
                r.status()
            );
        }
    }
    // The uploads are whole, and no temp file stayed behind.
    assert_eq!(std::fs::read(a.home.join("up.bin")).unwrap(), upload);
    assert_eq!(
        std::fs::read(a.home.join("compat.bin")).unwrap(),
        vec![b'c'; 128 << 10]
    );
    assert_eq!(
        std::fs::read_to_string(a.home.join("mv.txt")).unwrap(),
        "moved"
    );
    assert!(client.command(cat).await.unwrap().state == berth_protocol::CommandState::Running);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let temps: Vec<String> = std::fs::read_dir(&a.home)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        if temps.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "temp files left: {temps:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    client.healthz().await.unwrap();
    println!(
        "{} client resets on {} mutating routes: {counts:?}; the agent answered every retry",
        ROUNDS * routes.len(),
        routes.len()
    );
}
