//! Each sandbox fenced by its limits, through the controller: the limits in the record and on
//! the container (`docker inspect`, the cgroup files inside); a fork bomb and a memory hog in
//! their own sandboxes while a desktop beside them is driven — the hog's sandbox fails with
//! `oom_killed`, the bombed one reports `sandbox.pids_limit`, keeps running and answers again
//! once the bomb is killed, and the desktop and the controller keep answering. The same on the
//! process provider, whose agents the controller fences in cgroups of their own.
//!
//! The bomb is bounded (1,000 `sleep`s, far below the host's pid_max) and ended through the
//! API, so a fence that failed would cost the host 1,000 idle processes, not its process table.

use std::process::Command;
use std::time::{Duration, Instant};

use berth_protocol::controller::{ControllerClient, CreateSandbox, RunRequest, Sandbox};
use berth_tests::controller::{ControllerProcess, shell};
use berth_tests::wait_for;

/// The bounded fork bomb: more `sleep`s than the bombed sandbox's 256 pids, each forked by one
/// shell (which gives up at the limit, leaving its `sleep`s behind); ended with its run.
const BOMB: &str = "for i in $(seq 1000); do sleep 120 & done; wait";
/// Grows one line of zeros in `tail`'s memory until the kernel kills it (no newline ever comes).
const HOG: &str = "head -c 4G /dev/zero | tail -n 1 > /dev/null";

/// The limits the bombed and the hogging sandboxes (profile `ide`) get.
const FENCED: &str = "[limits.ide]\npids = 256\nmemory_mb = 256\n";

fn image() -> String {
    let built = berth_tests::controller::build_desktop_image().unwrap();
    built["image_ref"].as_str().unwrap().to_string()
}

/// A controller on Docker: `top` holds top-level keys, `tables` whole tables.
async fn on_docker(top: &str, tables: &str) -> ControllerProcess {
    ControllerProcess::start(&format!(
        "{top}docker_image = \"{}\"\n[providers]\ndesktop = \"docker\"\nide = \"docker\"\n{tables}",
        image()
    ))
    .await
}

fn ide() -> CreateSandbox {
    berth_tests::controller::ide()
}

/// A run started and not waited for, killed by the agent after `timeout_ms` at the latest.
fn background(line: &str, timeout_ms: u64) -> RunRequest {
    RunRequest {
        wait: Some(false),
        timeout_ms: Some(timeout_ms),
        ..shell(line)
    }
}

/// `docker inspect -f FORMAT` of a sandbox's container.
fn inspect(sandbox_id: &str, format: &str) -> String {
    let out = Command::new("docker")
        .args(["inspect", "-f", format, &format!("berth-{sandbox_id}")])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

async fn stdout(cl: &ControllerClient, id: &str, line: &str) -> String {
    let run = cl.exec(id, &shell(line)).await.unwrap();
    assert_eq!(run.exit_code, Some(0), "{line}: {run:?}");
    run.stdout.trim().to_string()
}

#[tokio::test]
async fn docker_limits_from_the_profile_and_config_are_in_the_record_and_on_the_container() {
    let c = on_docker(
        "memory_merge = true\n",
        "[limits.\"*\"]\ncpu_shares = 512\n[limits.ide]\npids = 300\nmemory_mb = 700\n",
    )
    .await;
    let cl = c.client();
    let sb = cl.create(&ide()).await.unwrap();
    let l = sb.limits.clone().expect("the record carries its limits");
    println!("record: {}", serde_json::to_string(&l).unwrap());
    assert_eq!(
        (
            l.cpus,
            l.cpu_shares,
            l.memory_mb,
            l.swap_mb,
            l.pids,
            l.shm_mb
        ),
        (
            Some(1.0),
            Some(512),
            Some(700),
            Some(0),
            Some(300),
            Some(64)
        )
    );
    assert!(l.unenforced.is_empty(), "{:?}", l.unenforced);
    assert_eq!(cl.get(&sb.id).await.unwrap().limits, Some(l));
    let host = inspect(
        &sb.id,
        "{{.HostConfig.NanoCpus}} {{.HostConfig.CpuShares}} {{.HostConfig.Memory}} \
         {{.HostConfig.MemorySwap}} {{.HostConfig.PidsLimit}} {{.HostConfig.ShmSize}}",
    );
    let mib = 1u64 << 20;
    assert_eq!(
        host,
        format!(
            "1000000000 512 {} {} 300 {}",
            700 * mib,
            700 * mib,
            64 * mib
        )
    );
    // Inside, as the sandbox's user sees it: its process limit and /dev/shm's size.
    let inside = stdout(
        &cl,
        &sb.id,
        "cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max; \
         df -m --output=size /dev/shm | tail -1; grep ksm_merge_any /proc/self/ksm_stat",
    )
    .await;
    // With `memory_merge`, what runs in the sandbox may be merged (inherited from the agent).
    assert_eq!(
        inside.split_whitespace().collect::<Vec<_>>(),
        ["300", "64", "ksm_merge_any:", "yes"],
        "{inside}"
    );
    cl.delete(&sb.id).await.unwrap();
}

/// p50 of a list of durations, in ms.
fn p50(mut d: Vec<Duration>) -> f64 {
    d.sort();
    d[d.len() / 2].as_secs_f64() * 1000.0
}

/// `rounds` screenshots and execs of `id`, each timed; every one must succeed.
async fn drive(cl: &ControllerClient, id: &str, rounds: usize) -> (Vec<Duration>, Vec<Duration>) {
    let (mut shots, mut execs) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        let t = Instant::now();
        let png = cl.screenshot(id).await.unwrap();
        shots.push(t.elapsed());
        assert_eq!(&png[1..4], b"PNG");
        let t = Instant::now();
        let out = stdout(cl, id, &format!("echo {i}")).await;
        execs.push(t.elapsed());
        assert_eq!(out, i.to_string());
    }
    (shots, execs)
}

/// The sandbox's timeline holds an event of `kind`; its data.
async fn event_of(cl: &ControllerClient, id: &str, kind: &str) -> Option<serde_json::Value> {
    let page = cl.events(id, 0).await.ok()?;
    page["events"]
        .as_array()?
        .iter()
        .find(|e| e["kind"] == kind)
        .cloned()
}

/// Waits for the bombed sandbox to report its limit; a command started then fails with the
/// limit's reason; the bomb's run is ended through the controller's door to the agent
/// (`DELETE …/{id}/v1/commands/{run_id}`, its whole tree), and the sandbox runs commands again.
async fn bomb_reported_and_recovered(cl: &ControllerClient, bombed: &Sandbox, bomb_run: &str) {
    let e = wait_for(
        "the bombed sandbox to report sandbox.pids_limit",
        Duration::from_secs(60),
        || event_of(cl, &bombed.id, "sandbox.pids_limit"),
    )
    .await;
    println!("bombed: {e}");
    assert_eq!(
        (&e["limit"], &e["reason"]),
        (&256.into(), &"pids_limit".into()),
        "{e}"
    );
    assert!(e["hits"].as_u64().unwrap() >= 1, "{e}");
    assert_eq!(cl.get(&bombed.id).await.unwrap().status, "running");
    let refused = cl.exec(&bombed.id, &shell("echo refused")).await.unwrap();
    println!("a command while bombed: {:?}", refused.error);
    assert!(
        refused.exit_code.is_none()
            && refused
                .error
                .as_deref()
                .is_some_and(|e| e.contains("process limit")),
        "{refused:?}"
    );
    let t = Instant::now();
    cl.agent(&bombed.id).delete_command(bomb_run).await.unwrap();
    let ok = wait_for(
        "the bombed sandbox to run a command once the bomb is killed",
        Duration::from_secs(30),
        || async {
            let run = cl.exec(&bombed.id, &shell("echo back")).await.ok()?;
            (run.exit_code == Some(0) && run.stdout.trim() == "back").then_some(run)
        },
    )
    .await;
    println!(
        "bombed sandbox answered again {:.1} s after the bomb's delete: {}",
        t.elapsed().as_secs_f64(),
        ok.stdout.trim()
    );
    assert_eq!(cl.get(&bombed.id).await.unwrap().status, "running");
}

/// Waits for the hog's sandbox to fail with `oom_killed`.
async fn hog_failed(cl: &ControllerClient, hog: &Sandbox) {
    let failed = wait_for(
        "the hog's sandbox to fail",
        Duration::from_secs(60),
        || async {
            let s = cl.get(&hog.id).await.ok()?;
            (s.status == "failed").then_some(s)
        },
    )
    .await;
    let reason = failed.error.unwrap_or_default();
    println!("hog: {reason}");
    assert!(reason.starts_with("oom_killed: "), "{reason}");
}

#[tokio::test]
async fn a_fork_bomb_and_a_memory_hog_in_docker_sandboxes_leave_the_desktop_beside_them_answering()
{
    let c = on_docker("", FENCED).await;
    let cl = c.client();
    let desktop = cl
        .create(&CreateSandbox {
            profile: "desktop".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let bombed = cl.create(&ide()).await.unwrap();
    let hog = cl.create(&ide()).await.unwrap();
    let (shots0, execs0) = drive(&cl, &desktop.id, 10).await;
    let bomb = cl
        .exec(&bombed.id, &background(BOMB, 600_000))
        .await
        .unwrap();
    cl.exec(&hog.id, &background(HOG, 120_000)).await.unwrap();
    // Driven while both run: every call answers.
    let (shots1, execs1) = drive(&cl, &desktop.id, 20).await;
    println!(
        "desktop beside them, p50 before → during: screenshot {:.1} → {:.1} ms, exec {:.1} → \
         {:.1} ms",
        p50(shots0),
        p50(shots1),
        p50(execs0),
        p50(execs1)
    );
    hog_failed(&cl, &hog).await;
    bomb_reported_and_recovered(&cl, &bombed, &bomb.id).await;
    // The controller answers, and the desktop still does.
    assert_eq!(cl.list(&[]).await.unwrap().sandboxes.len(), 3);
    drive(&cl, &desktop.id, 3).await;
    for id in [&desktop.id, &bombed.id] {
        cl.delete(id).await.unwrap();
    }
    wait_for("every container to go", Duration::from_secs(60), || async {
        c.containers().is_empty().then_some(())
    })
    .await;
}

#[tokio::test]
async fn process_sandboxes_are_fenced_in_cgroups_and_a_fork_bomb_and_a_memory_hog_stay_in_theirs() {
    let c = ControllerProcess::start(FENCED).await;
    let cl = c.client();
    let bombed = cl.create(&ide()).await.unwrap();
    let l = bombed.limits.clone().unwrap();
    println!("process record: {}", serde_json::to_string(&l).unwrap());
    if l.unenforced.contains_key("pids") || l.unenforced.contains_key("memory_mb") {
        // A host without a cgroup the controller may write: the record says so, and nothing
        // here can be fenced, so no bomb is set off.
        println!("this host does not let the controller fence processes: {l:?}");
        assert!(l.unenforced["pids"].contains("cgroup"), "{l:?}");
        return;
    }
    assert!(l.unenforced.contains_key("shm_mb"), "{l:?}");
    // The agent is in its sandbox's cgroup, at its limit.
    let pid = c.agent_pid(&bombed.id);
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(
        cgroups.contains(&format!("/berth/{}", bombed.id)),
        "{cgroups}"
    );
    let inside = stdout(
        &cl,
        &bombed.id,
        "d=$(grep -E ':pids:|^0::' /proc/self/cgroup | head -1 | cut -d: -f3); \
         cat /sys/fs/cgroup/pids$d/pids.max 2>/dev/null || cat /sys/fs/cgroup$d/pids.max",
    )
    .await;
    assert_eq!(inside, "256");
    // Memory merging is off unless the config asks for it.
    let merge = stdout(&cl, &bombed.id, "grep ksm_merge_any /proc/self/ksm_stat").await;
    assert_eq!(merge, "ksm_merge_any: no");
    let other = cl.create(&ide()).await.unwrap();
    let hog = cl.create(&ide()).await.unwrap();
    let bomb = cl
        .exec(&bombed.id, &background(BOMB, 600_000))
        .await
        .unwrap();
    cl.exec(&hog.id, &background(HOG, 120_000)).await.unwrap();
    // The sandbox beside them answers throughout.
    let mut execs = Vec::new();
    for i in 0..20 {
        let t = Instant::now();
        assert_eq!(
            stdout(&cl, &other.id, &format!("echo {i}")).await,
            i.to_string()
        );
        execs.push(t.elapsed());
    }
    println!("the sandbox beside them: exec p50 {:.1} ms", p50(execs));
    hog_failed(&cl, &hog).await;
    bomb_reported_and_recovered(&cl, &bombed, &bomb.id).await;
    for id in [&bombed.id, &other.id] {
        cl.delete(id).await.unwrap();
    }
    // Their cgroups go with them.
    for id in [&bombed.id, &other.id, &hog.id] {
        let left = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter(|l| l.contains(" - cgroup"))
            .filter_map(|l| l.split(' ').nth(4).map(String::from))
            .filter(|m| walk_has(std::path::Path::new(m), id))
            .collect::<Vec<_>>();
        assert!(left.is_empty(), "{id}'s cgroup stays under {left:?}");
    }
}

/// Whether a directory named `name` is under `root`, three levels deep at most.
fn walk_has(root: &std::path::Path, name: &str) -> bool {
    fn walk(d: &std::path::Path, name: &str, depth: u8) -> bool {
        let Ok(entries) = std::fs::read_dir(d) else {
            return false;
        };
        entries.flatten().any(|e| {
            e.file_type().is_ok_and(|t| t.is_dir())
                && (e.file_name() == name || (depth > 0 && walk(&e.path(), name, depth - 1)))
        })
    }
    walk(root, name, 3)
}
