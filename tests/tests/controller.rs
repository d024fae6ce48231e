//! The controller end to end: real `berth serve`, real agents, real SQLite, restarts with
//! `kill -9`. One suite, run on every provider (`process::…` local agent processes,
//! `docker::…` containers of the desktop image, `kubernetes_fake_apiserver::…` Pods on the
//! tests' in-process fake API server, whose kubelet runs real agents); it uses the `ide`
//! profile (no desktop).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use berth_protocol::controller::{AcquireLease, Command, CreateSandbox, RunRequest};
use berth_tests::controller::{API_KEY, ControllerProcess, Provider, ide, shell};
use berth_tests::wait_for;
use serde_json::Value;

async fn events(c: &ControllerProcess, id: &str) -> Vec<Value> {
    let v = c.client().events(id, 0).await.unwrap();
    v["events"].as_array().unwrap().clone()
}

async fn an_ide_sandbox_runs_commands_and_its_delete_leaves_nothing_running(provider: Provider) {
    let c = ControllerProcess::start_on(provider, "").await;
    let cl = c.client();
    let sb = cl.create(&ide()).await.unwrap();
    assert_eq!(sb.status, "running");
    // Created under the alias `ide`: stored and reported under the seed's name.
    assert_eq!(sb.profile, "ide-ubuntu");
    assert_eq!(cl.get(&sb.id).await.unwrap().profile, "ide-ubuntu");
    assert_eq!(sb.viewer.kind, "jupyterlab");
    assert!(
        sb.image_ref.starts_with(provider.image_prefix()),
        "{}",
        sb.image_ref
    );
    assert_eq!(sb.claim.as_deref(), Some("cold"));
    let run = cl
        .exec(&sb.id, &shell("echo out; echo err >&2; exit 3"))
        .await
        .unwrap();
    assert_eq!((run.status.as_str(), run.exit_code), ("exited", Some(3)));
    assert_eq!(
        (run.stdout.as_str(), run.stderr.as_str()),
        ("out\n", "err\n")
    );
    // An argv runs directly, without a shell.
    let run = cl
        .exec(
            &sb.id,
            &RunRequest {
                command: Command::Argv(vec![
                    "printf".into(),
                    "%s|".into(),
                    "a b".into(),
                    "$HOME".into(),
                ]),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(run.stdout, "a b|$HOME|");
    // The compat surface answers directly.
    let compat = sb.endpoints.compat.clone().unwrap();
    let r: Value = reqwest::Client::new()
        .post(format!("{compat}/execute"))
        .json(&serde_json::json!({"command": "echo compat", "shell": true}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["output"], "compat\n");
    // Files through the controller, both ways, streamed.
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let put = cl
        .request(
            reqwest::Method::PUT,
            &format!("/sandbox/sandboxes/v1/{}/files?path=~/in/data.bin", sb.id),
        )
        .body(data.clone())
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success(), "{}", put.status());
    let sum = cl
        .exec(&sb.id, &shell("wc -c < ~/in/data.bin"))
        .await
        .unwrap();
    assert_eq!(sum.stdout.trim(), "300000");
    let got = cl
        .request(
            reqwest::Method::GET,
            &format!("/sandbox/sandboxes/v1/{}/files?path=~/in/data.bin", sb.id),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(got.status(), 200);
    assert_eq!(got.bytes().await.unwrap().to_vec(), data);
    // A background command that would outlive a careless delete.
    cl.exec(
        &sb.id,
        &RunRequest {
            wait: Some(false),
            ..shell("sleep 300")
        },
    )
    .await
    .unwrap();
    assert!(!c.leftovers(&sb.id).is_empty());
    cl.delete(&sb.id).await.unwrap();
    assert!(c.leftovers(&sb.id).is_empty(), "{:?}", c.leftovers(&sb.id));
    let after = cl.get(&sb.id).await.unwrap();
    assert_eq!(after.status, "stopped");
    // Deleting twice is fine; the record stays readable; a stopped sandbox runs nothing.
    cl.delete(&sb.id).await.unwrap();
    let e = cl.exec(&sb.id, &shell("true")).await.unwrap_err();
    assert_eq!(e.status(), Some(409));
    let kinds: Vec<String> = events(&c, &sb.id)
        .await
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .collect();
    for k in [
        "sandbox.created",
        "sandbox.ready",
        "run.started",
        "command.started",
        "command.exited",
        "sandbox.deleted",
    ] {
        assert!(kinds.iter().any(|x| x == k), "{k} missing from {kinds:?}");
    }
}

async fn runs_are_idempotent_by_id_and_secrets_stay_out_of_every_answer_and_log(
    provider: Provider,
) {
    let c = ControllerProcess::start_on(provider, "").await;
    let cl = c.client();
    let sb = cl.create(&ide()).await.unwrap();
    let secret = "s3cr3t-value-8d1f";
    let req = RunRequest {
        run_id: Some("run-once".into()),
        env: BTreeMap::from([("PLAIN".into(), "p".into())]),
        secrets: BTreeMap::from([("API_TOKEN".into(), secret.into())]),
        ..shell("echo $PLAIN >> ~/count; test \"${API_TOKEN#s3cr3t-}\" = value-8d1f && echo match")
    };
    let first = cl.exec(&sb.id, &req).await.unwrap();
    assert_eq!(first.stdout, "match\n");
    let again = cl.exec(&sb.id, &req).await.unwrap();
    assert_eq!(again, first);
    let count = cl.exec(&sb.id, &shell("cat ~/count")).await.unwrap();
    assert_eq!(count.stdout, "p\n", "the run ran once");
    let timeline = events(&c, &sb.id).await;
    let injected: Vec<&Value> = timeline
        .iter()
        .filter(|e| e["kind"] == "secrets.injected")
        .collect();
    assert_eq!(injected.len(), 1);
    assert_eq!(injected[0]["names"], serde_json::json!(["API_TOKEN"]));
    let everything = format!(
        "{}{}{}",
        serde_json::to_string(&timeline).unwrap(),
        serde_json::to_string(&cl.run(&sb.id, "run-once").await.unwrap()).unwrap(),
        c.log_text()
    );
    assert!(!everything.contains(secret), "a secret value leaked");
    // Nor does the agent keep it (command records, events, logs).
    let holders = c.state_files_containing(&sb.id, secret);
    assert!(holders.is_empty(), "{holders:?} hold the secret");
    // Bad input is a clear 4xx.
    for (body, status) in [
        (serde_json::json!({"command": []}), 400),
        (serde_json::json!({"command": "x", "run_id": "../x"}), 400),
        (serde_json::json!({"command": 5}), 400),
        (serde_json::json!({"cmd": "x"}), 400),
    ] {
        let r = cl
            .request(
                reqwest::Method::POST,
                &format!("/sandbox/sandboxes/v1/{}/exec", sb.id),
            )
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status, "{body}");
        let e: Value = r.json().await.unwrap();
        assert!(
            e["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{e}"
        );
    }
}

#[tokio::test]
async fn every_authenticated_route_without_a_key_is_401() {
    let c = ControllerProcess::start("").await;
    let anon = c.anonymous();
    let wrong =
        berth_protocol::controller::ControllerClient::new(c.base.clone(), Some("wrong".into()));
    let routes = [
        ("POST", "/sandbox/sandboxes/v1"),
        ("GET", "/sandbox/sandboxes/v1"),
        ("GET", "/sandbox/sandboxes/v1/sb_x"),
        ("DELETE", "/sandbox/sandboxes/v1/sb_x"),
        ("POST", "/sandbox/sandboxes/v1/sb_x/viewer"),
        ("POST", "/sandbox/sandboxes/v1/sb_x/exec"),
        ("GET", "/sandbox/sandboxes/v1/sb_x/runs/r"),
        ("GET", "/sandbox/sandboxes/v1/sb_x/runs/r/output"),
        ("GET", "/sandbox/sandboxes/v1/sb_x/events"),
        ("GET", "/sandbox/sandboxes/v1/sb_x/screenshot"),
        ("POST", "/sandbox/sandboxes/v1/sb_x/computer"),
        ("GET", "/sandbox/sandboxes/v1/sb_x/files?path=/etc/hostname"),
        ("PUT", "/sandbox/sandboxes/v1/sb_x/files?path=/tmp/x"),
        ("GET", "/sandbox/sandboxes/v1/sb_x/vnc/"),
        ("GET", "/sandbox/sandboxes/v1/sb_x/vnc/vnc.html"),
        ("GET", "/sandbox/sandboxes/v1/sb_x/vnc/websockify"),
        ("GET", "/sandbox/sandboxes/v1/sb_x/stream.mp4"),
        ("GET", "/sandbox/sandboxes/v1/sb_x/stream"),
        ("POST", "/sandbox/v1/leases"),
        ("POST", "/sandbox/v1/leases/ls_x/renew"),
        ("DELETE", "/sandbox/v1/leases/ls_x"),
        ("GET", "/sandbox/v1/catalog?kind=profile"),
        ("GET", "/sandbox/v1/pools"),
        ("PUT", "/sandbox/v1/pools/ide"),
    ];
    for client in [&anon, &wrong] {
        for (method, path) in routes {
            let r = client
                .request(
                    reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
                    path,
                )
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), 401, "{method} {path}");
            let e: Value = r.json().await.unwrap();
            assert_eq!(e["error"]["code"], "unauthorized", "{method} {path}");
        }
    }
    // Open routes.
    assert_eq!(
        reqwest::get(format!("{}/healthz", c.base))
            .await
            .unwrap()
            .status(),
        200
    );
    let metrics = c.client().metrics().await.unwrap();
    for series in [
        "berth_sandboxes{state=\"running\"}",
        "berth_claim_latency_seconds_bucket{claim=\"warm\"",
        "berth_claim_latency_seconds_bucket{claim=\"cold\"",
        "berth_provider_errors_total",
        "berth_runs_reconciling",
    ] {
        assert!(metrics.contains(series), "{series} missing:\n{metrics}");
    }
}

async fn the_catalog_lists_profiles_apps_and_bundles_and_disabled_profiles_are_422(
    provider: Provider,
) {
    let c = ControllerProcess::start_on(provider, "").await;
    let cl = c.client();
    let profiles = cl.catalog("profile").await.unwrap().items;
    let by_name = |n: &str| profiles.iter().find(|p| p["name"] == n).unwrap().clone();
    // The seed's names, the older ones as aliases; driver_hint is the provider serving it here.
    let names: Vec<&str> = profiles.iter().filter_map(|p| p["name"].as_str()).collect();
    assert_eq!(
        names,
        [
            "desktop-ubuntu",
            "ide-ubuntu",
            "custom",
            "desktop-windows",
            "desktop-macos"
        ]
    );
    assert_eq!(by_name("desktop-ubuntu")["viewer"], "novnc");
    assert_eq!(
        by_name("desktop-ubuntu")["aliases"],
        serde_json::json!(["desktop"])
    );
    assert_eq!(by_name("ide-ubuntu")["viewer"], "jupyterlab");
    assert_eq!(by_name("ide-ubuntu")["aliases"], serde_json::json!(["ide"]));
    // The Docker runs map the aliases (`ide = "docker"`) in `[providers]`: still honoured.
    let serving = provider.name();
    assert_eq!(by_name("ide-ubuntu")["driver_hint"], serving);
    assert_eq!(by_name("desktop-ubuntu")["driver_hint"], serving);
    assert_eq!(by_name("desktop-windows")["enabled"], false);
    assert_eq!(by_name("desktop-macos")["enabled"], false);
    for p in &profiles {
        for k in ["name", "driver_hint", "viewer", "enabled", "description"] {
            assert!(p.get(k).is_some(), "{k} missing from {p}");
        }
    }
    let bundles = cl.catalog("desktop_app_bundle").await.unwrap().items;
    assert!(bundles.iter().any(|b| b["name"] == "osworld"));
    assert!(!cl.catalog("desktop_app").await.unwrap().items.is_empty());
    assert_eq!(cl.catalog("nope").await.unwrap_err().status(), Some(400));
    for disabled in ["desktop-windows", "desktop-macos", "windows", "macos"] {
        let e = cl
            .create(&CreateSandbox {
                profile: disabled.into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.status(), Some(422), "{disabled}: {e}");
    }
    let e = cl
        .create(&CreateSandbox {
            profile: "nope".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(400), "{e}");
    assert!(
        e.to_string()
            .contains("known: desktop-ubuntu (alias desktop), ide-ubuntu (alias ide)"),
        "{e}"
    );
    let e = cl
        .create(&CreateSandbox {
            image_ref: Some("docker:sha256:abc".into()),
            ..ide()
        })
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(422), "{e}");
    assert_eq!(cl.get("sb_nope").await.unwrap_err().status(), Some(404));
    assert!(c.all_leftovers().is_empty(), "{:?}", c.all_leftovers());
}

async fn leases_reuse_their_sandbox_and_reprovision_on_label_mismatch_or_a_dead_agent(
    provider: Provider,
) {
    let c = ControllerProcess::start_on(provider, "").await;
    let cl = c.client();
    let acquire = |labels: &[(&str, &str)]| AcquireLease {
        thread_id: "thread-1".into(),
        profile: "ide".into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ttl_seconds: Some(600),
        ..Default::default()
    };
    let a = cl.acquire(&acquire(&[("team", "x")])).await.unwrap();
    assert_eq!(a.sandbox.labels.get("team").map(String::as_str), Some("x"));
    // Idempotent: the same lease and sandbox; an acquire does not move the expiry.
    let again = cl.acquire(&acquire(&[("team", "x")])).await.unwrap();
    assert_eq!(
        (again.lease_id.as_str(), again.sandbox.id.as_str()),
        (a.lease_id.as_str(), a.sandbox.id.as_str())
    );
    assert_eq!(again.how.as_deref(), Some("reused"));
    assert_eq!(again.expires_at, a.expires_at);
    // Another thread never shares it.
    let other = cl
        .acquire(&AcquireLease {
            thread_id: "thread-2".into(),
            ..acquire(&[])
        })
        .await
        .unwrap();
    assert_ne!(other.sandbox.id, a.sandbox.id);
    assert_ne!(other.lease_id, a.lease_id);
    // A lease may let its agent ask for a person: the reused sandbox's agent hears it; the
    // other thread's does not.
    let asking = cl
        .acquire(&AcquireLease {
            human_control: Some(true),
            logins: Vec::new(),
            ..acquire(&[("team", "x")])
        })
        .await
        .unwrap();
    assert_eq!(asking.sandbox.id, a.sandbox.id);
    assert!(
        cl.agent(&a.sandbox.id)
            .control()
            .await
            .unwrap()
            .requests_enabled
    );
    assert!(
        !cl.agent(&other.sandbox.id)
            .control()
            .await
            .unwrap()
            .requests_enabled
    );
    // A required label the sandbox lacks: same lease, a new sandbox, the old one gone.
    let b = cl.acquire(&acquire(&[("gpu", "yes")])).await.unwrap();
    assert_eq!(b.lease_id, a.lease_id);
    assert_ne!(b.sandbox.id, a.sandbox.id);
    wait_for(
        "the old sandbox to stop",
        Duration::from_secs(20),
        || async { (cl.get(&a.sandbox.id).await.unwrap().status == "stopped").then_some(()) },
    )
    .await;
    assert!(c.leftovers(&a.sandbox.id).is_empty());
    // Its agent (or container) killed: the store notices, and the next acquire re-provisions.
    c.kill_sandbox(&b.sandbox.id);
    let d = cl.acquire(&acquire(&[("gpu", "yes")])).await.unwrap();
    assert_eq!(d.lease_id, a.lease_id);
    assert_ne!(d.sandbox.id, b.sandbox.id);
    assert_eq!(d.sandbox.status, "running");
    let dead = cl.get(&b.sandbox.id).await.unwrap();
    assert_eq!(dead.status, "failed", "{dead:?}");
    assert!(dead.error.is_some());
    // Renew only extends, clamped.
    let shorter = cl.renew(&a.lease_id, 1).await.unwrap();
    assert_eq!(shorter.expires_at, d.expires_at);
    let longer = cl.renew(&a.lease_id, 10_000_000).await.unwrap();
    assert!(longer.expires_at > d.expires_at);
    // Release destroys; a released lease cannot be renewed; the thread may start afresh.
    cl.release(&a.lease_id).await.unwrap();
    assert_eq!(cl.get(&d.sandbox.id).await.unwrap().status, "stopped");
    assert!(c.leftovers(&d.sandbox.id).is_empty());
    assert_eq!(
        cl.renew(&a.lease_id, 60).await.unwrap_err().status(),
        Some(409)
    );
    let fresh = cl.acquire(&acquire(&[])).await.unwrap();
    assert_ne!(fresh.lease_id, a.lease_id);
    // Concurrent acquires for one thread get one lease and one sandbox.
    let many = futures_util::future::join_all((0..5).map(|_| {
        let cl = cl.clone();
        async move {
            cl.acquire(&AcquireLease {
                thread_id: "thread-3".into(),
                ..acquire(&[])
            })
            .await
            .unwrap()
        }
    }))
    .await;
    let ids: BTreeSet<_> = many
        .iter()
        .map(|l| (l.lease_id.clone(), l.sandbox.id.clone()))
        .collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
}

async fn a_lease_past_its_ttl_is_released_and_its_sandbox_destroyed(provider: Provider) {
    let c = ControllerProcess::start_on(provider, "").await;
    let cl = c.client();
    let l = cl
        .acquire(&AcquireLease {
            thread_id: "short".into(),
            profile: "ide".into(),
            ttl_seconds: Some(1),
            ..Default::default()
        })
        .await
        .unwrap();
    wait_for(
        "the expired lease's sandbox to stop",
        Duration::from_secs(20),
        || async { (cl.get(&l.sandbox.id).await.unwrap().status == "stopped").then_some(()) },
    )
    .await;
    assert!(c.leftovers(&l.sandbox.id).is_empty());
    assert_eq!(
        cl.renew(&l.lease_id, 60).await.unwrap_err().status(),
        Some(409)
    );
    let kinds: Vec<Value> = events(&c, &l.sandbox.id)
        .await
        .iter()
        .map(|e| e["kind"].clone())
        .collect();
    assert!(kinds.contains(&"lease.released".into()), "{kinds:?}");
}

async fn a_run_survives_a_kill_9_of_the_controller_with_its_exit_code_and_full_output(
    provider: Provider,
) {
    let mut c = ControllerProcess::start_on(provider, "").await;
    let cl = c.client();
    let sb = cl.create(&ide()).await.unwrap();
    // Half a minute: the controller is killed and back (a few seconds) well before it ends.
    let script = "for i in $(seq 1 30); do echo line $i; sleep 1; done; echo finished >&2; exit 7";
    let run = cl
        .exec(
            &sb.id,
            &RunRequest {
                wait: Some(false),
                run_id: Some("long".into()),
                ..shell(script)
            },
        )
        .await
        .unwrap();
    assert_eq!(run.status, "running");
    // Let it get going, then kill the controller mid-run.
    wait_for("some output", Duration::from_secs(20), || async {
        let v: Value = cl
            .request(
                reqwest::Method::GET,
                &format!(
                    "/sandbox/sandboxes/v1/{}/runs/long/output?from_seq=0",
                    sb.id
                ),
            )
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        (v["next_seq"].as_u64()? > 0).then_some(())
    })
    .await;
    c.kill9();
    assert!(
        c.sandbox_alive(&sb.id),
        "the sandbox outlives the controller"
    );
    c.launch();
    let cl = c.client();
    assert_eq!(cl.get(&sb.id).await.unwrap().status, "running", "adopted");
    let done = wait_for("the run to end", Duration::from_secs(120), || async {
        let r = cl.run(&sb.id, "long").await.unwrap();
        r.done().then_some(r)
    })
    .await;
    assert_eq!(
        (done.status.as_str(), done.exit_code),
        ("exited", Some(7)),
        "{done:?}"
    );
    let expected: String = (1..=30).map(|i| format!("line {i}\n")).collect();
    assert_eq!(done.stdout, expected);
    assert_eq!(done.stderr, "finished\n");
    let kinds: Vec<Value> = events(&c, &sb.id)
        .await
        .iter()
        .map(|e| e["kind"].clone())
        .collect();
    assert!(kinds.contains(&"run.reconciling".into()), "{kinds:?}");
    assert!(kinds.contains(&"run.adopted".into()), "{kinds:?}");
    assert!(kinds.contains(&"sandbox.adopted".into()), "{kinds:?}");
    // The stored output answers once the sandbox is gone too.
    cl.delete(&sb.id).await.unwrap();
    assert_eq!(cl.run(&sb.id, "long").await.unwrap().stdout, expected);
}

async fn a_controller_killed_during_creates_adopts_or_reaps_them_and_leaks_nothing(
    provider: Provider,
) {
    let mut c = ControllerProcess::start_on(provider, "orphan_grace_secs = 0\n").await;
    let cl = c.client();
    // Creates in flight (answered at once), then kill -9 before they are ready.
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(cl.create_nowait(&ide()).await.unwrap().id);
    }
    c.kill9();
    // And one the store never heard of: its row removed behind the controller's back.
    let orphan = ids.pop().unwrap();
    let db = c.data_dir().join("berth.db");
    let status = std::process::Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(format!(
            "import sqlite3; c = sqlite3.connect('{}'); c.execute(\"DELETE FROM sandboxes WHERE id = '{orphan}'\"); c.commit()",
            db.display()
        ))
        .status()
        .unwrap();
    assert!(status.success());
    c.launch();
    let cl = c.client();
    for id in &ids {
        let sb = wait_for("the sandbox to settle", Duration::from_secs(60), || async {
            let sb = cl.get(id).await.unwrap();
            matches!(sb.status.as_str(), "running" | "failed").then_some(sb)
        })
        .await;
        if sb.status == "failed" {
            assert!(c.leftovers(id).is_empty(), "a failed sandbox leaks");
        }
        cl.delete(id).await.unwrap();
    }
    wait_for(
        "the orphan to be reaped",
        Duration::from_secs(30),
        || async { c.leftovers(&orphan).is_empty().then_some(()) },
    )
    .await;
    assert!(c.all_leftovers().is_empty(), "{:?}", c.all_leftovers());
    assert!(
        c.log_text()
            .contains("reaping a sandbox the store does not know")
    );
}

async fn a_sandbox_whose_agent_dies_is_marked_failed_not_running(provider: Provider) {
    let c = ControllerProcess::start_on(provider, "").await;
    let cl = c.client();
    let sb = cl.create(&ide()).await.unwrap();
    c.kill_sandbox(&sb.id);
    let failed = wait_for(
        "the sandbox to be marked failed",
        Duration::from_secs(20),
        || async {
            let s = cl.get(&sb.id).await.unwrap();
            (s.status == "failed").then_some(s)
        },
    )
    .await;
    let error = failed.error.unwrap();
    assert!(error.contains(provider.death_word()), "{error}");
    let kinds: Vec<Value> = events(&c, &sb.id)
        .await
        .iter()
        .map(|e| e["kind"].clone())
        .collect();
    assert!(kinds.contains(&"sandbox.failed".into()));
}

/// Claims from a pool of 10 while `concurrent` creates race: how many were warm, and checks
/// that no sandbox went to two callers.
async fn burst(c: &ControllerProcess, n: usize) -> (usize, usize) {
    let cl = c.client();
    let got = futures_util::future::join_all((0..n).map(|i| {
        let cl = cl.clone();
        async move {
            cl.create(&CreateSandbox {
                labels: BTreeMap::from([("caller".into(), i.to_string())]),
                ..ide()
            })
            .await
            .unwrap()
        }
    }))
    .await;
    let ids: BTreeSet<&str> = got.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids.len(), n, "a sandbox was handed out twice");
    for (i, s) in got.iter().enumerate() {
        assert_eq!(
            s.labels.get("caller"),
            Some(&i.to_string()),
            "labels applied at claim"
        );
        assert_eq!(s.status, "running");
    }
    let warm = got
        .iter()
        .filter(|s| s.claim.as_deref() == Some("warm"))
        .count();
    let cold = got
        .iter()
        .filter(|s| s.claim.as_deref() == Some("cold"))
        .count();
    for s in &got {
        cl.delete(&s.id).await.unwrap();
        assert!(c.leftovers(&s.id).is_empty());
    }
    (warm, cold)
}

async fn pool(c: &ControllerProcess) -> Value {
    c.client().pools().await.unwrap()["pools"][0].clone()
}

async fn set_pool(c: &ControllerProcess, paused: bool) {
    c.client()
        .adjust_pool("ide", Some(paused), None)
        .await
        .unwrap();
}

async fn fifty_concurrent_claims_against_a_pool_of_ten_are_exactly_ten_warm(provider: Provider) {
    let c =
        ControllerProcess::start_on(provider, "[[pools]]\nprofile = \"ide\"\nsize = 10\n").await;
    wait_for("the pool to fill", Duration::from_secs(60), || async {
        (pool(&c).await["ready"] == 10).then_some(())
    })
    .await;
    // Refill paused: exactly the ten members are warm, the rest cold.
    set_pool(&c, true).await;
    assert_eq!(burst(&c, 50).await, (10, 40));
    let p = pool(&c).await;
    assert_eq!(
        (p["ready"].as_u64(), p["starting"].as_u64()),
        (Some(0), Some(0)),
        "{p}"
    );
    // Refill on: at least the ten warm, and the pool refills to its size, never beyond.
    set_pool(&c, false).await;
    wait_for("the pool to refill", Duration::from_secs(60), || async {
        (pool(&c).await["ready"] == 10).then_some(())
    })
    .await;
    // (Twenty this time: the first burst showed the fifty; the point here is the refill.)
    let (warm, cold) = burst(&c, 20).await;
    assert!(warm >= 10 && warm + cold == 20, "{warm} warm, {cold} cold");
    wait_for(
        "the pool to refill again",
        Duration::from_secs(60),
        || async { (pool(&c).await["ready"] == 10).then_some(()) },
    )
    .await;
    let p = pool(&c).await;
    assert_eq!(p["starting"], 0, "{p}");
    // Only the ten members run: nothing leaked and nothing over-created.
    assert_eq!(c.live_sandboxes(), 10);
    let warm_claim: u64 = c
        .client()
        .metrics()
        .await
        .unwrap()
        .lines()
        .find(|l| l.starts_with("berth_claim_latency_seconds_count{claim=\"warm\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap();
    assert_eq!(warm_claim as usize, 10 + warm);
}

/// A pool shrinks: its idle members (ready or still starting) are destroyed down to the new
/// size, a claimed one keeps running; grown again, it refills.
async fn a_pool_resized_to_zero_destroys_its_idle_members_and_spares_the_claimed_one(
    provider: Provider,
) {
    let c = ControllerProcess::start_on(provider, "[[pools]]\nprofile = \"ide\"\nsize = 3\n").await;
    let cl = c.client();
    wait_for("the pool to fill", Duration::from_secs(60), || async {
        (pool(&c).await["ready"] == 3).then_some(())
    })
    .await;
    let claimed = cl.create(&ide()).await.unwrap();
    assert_eq!(claimed.claim.as_deref(), Some("warm"));
    // Resized at once: the refill the claim set off may still be starting a member.
    cl.adjust_pool("ide", None, Some(0)).await.unwrap();
    wait_for(
        "the pool to shrink to 0",
        Duration::from_secs(30),
        || async {
            let p = pool(&c).await;
            (p["size"] == 0 && p["ready"] == 0 && p["starting"] == 0 && c.live_sandboxes() == 1)
                .then_some(())
        },
    )
    .await;
    assert!(
        c.sandbox_alive(&claimed.id),
        "the claimed sandbox still runs"
    );
    assert_eq!(cl.get(&claimed.id).await.unwrap().status, "running");
    let run = cl.exec(&claimed.id, &shell("exit 0")).await.unwrap();
    assert_eq!((run.status.as_str(), run.exit_code), ("exited", Some(0)));
    // Grown again, it refills to the new size and no further.
    cl.adjust_pool("ide", None, Some(2)).await.unwrap();
    wait_for(
        "the pool to refill to 2",
        Duration::from_secs(60),
        || async {
            let p = pool(&c).await;
            (p["ready"] == 2 && p["starting"] == 0).then_some(())
        },
    )
    .await;
    assert_eq!(c.live_sandboxes(), 3);
    cl.delete(&claimed.id).await.unwrap();
}

async fn the_cli_creates_execs_lists_and_removes_sandboxes(provider: Provider) {
    let c = ControllerProcess::start_on(provider, "").await;
    let berth = |args: &[&str]| {
        let out = std::process::Command::new(berth_tests::workspace_bin("berth"))
            .args(args)
            .env("BERTH_URL", &c.base)
            .env("BERTH_API_KEY", API_KEY)
            .env("BERTH_LOG", "warn")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, out) = berth(&[
        "sandbox",
        "create",
        "--profile",
        "ide",
        "--label",
        "who=cli",
        "--json",
    ]);
    assert_eq!(code, Some(0), "{out}");
    let sb: Value = serde_json::from_str(&out).unwrap();
    let id = sb["id"].as_str().unwrap();
    assert_eq!(sb["status"], "running");
    let (code, out) = berth(&["sandbox", "exec", id, "--", "sh", "-c", "echo hi; exit 4"]);
    assert_eq!((code, out.as_str()), (Some(4), "hi\n"));
    let (_, out) = berth(&["sandbox", "list", "--label", "who=cli"]);
    assert!(out.contains(id), "{out}");
    let (_, out) = berth(&["sandbox", "list", "--label", "who=nobody"]);
    assert!(!out.contains(id), "{out}");
    let (code, _) = berth(&["sandbox", "rm", id]);
    assert_eq!(code, Some(0));
    assert!(c.leftovers(id).is_empty());
    let (code, out) = berth(&[
        "lease",
        "acquire",
        "--thread",
        "t",
        "--profile",
        "ide",
        "--json",
    ]);
    assert_eq!(code, Some(0), "{out}");
    let lease: Value = serde_json::from_str(&out).unwrap();
    let (code, _) = berth(&["lease", "release", lease["lease_id"].as_str().unwrap()]);
    assert_eq!(code, Some(0));
    assert!(c.all_leftovers().is_empty());
    // Without a key: a clear error and a non-zero exit.
    let out = std::process::Command::new(berth_tests::workspace_bin("berth"))
        .args(["sandbox", "list"])
        .env("BERTH_URL", &c.base)
        .env_remove("BERTH_API_KEY")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("X-Api-Key"));
}

#[tokio::test]
async fn without_configured_keys_one_is_generated_printed_once_and_stored_hashed() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let start = || {
        let mut child = std::process::Command::new(berth_tests::workspace_bin("berth"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path())
            .env_remove("BERTH_API_KEYS")
            .env("BERTH_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut key = None;
        let mut url = String::new();
        for line in BufReader::new(child.stdout.take().unwrap())
            .lines()
            .map_while(Result::ok)
        {
            if let Some(k) = line.trim().strip_prefix("X-Api-Key: ") {
                key = Some(k.to_string());
            }
            if let Some(u) = line.strip_prefix("berth serving on ") {
                url = u.to_string();
                break;
            }
        }
        (child, key, url)
    };
    let (mut first, key, url) = start();
    let key = key.expect("a generated key is printed");
    let stored = std::fs::read_to_string(dir.path().join("api-key.sha256")).unwrap();
    assert!(!stored.contains(&key), "only the hash is stored");
    let cl = berth_protocol::controller::ControllerClient::new(url.clone(), Some(key.clone()));
    assert!(cl.list(&[]).await.is_ok());
    first.kill().unwrap();
    first.wait().unwrap();
    let (mut second, again, url) = start();
    assert_eq!(again, None, "printed only once");
    let cl = berth_protocol::controller::ControllerClient::new(url, Some(key));
    assert!(cl.list(&[]).await.is_ok(), "the same key still works");
    second.kill().unwrap();
    second.wait().unwrap();
}

/// A TTL counts from readiness: a desktop that takes longer to start than its TTL is not
/// destroyed mid-start (the sweep once answered such a create with 503), it runs for its TTL
/// once ready, and then it goes.
#[tokio::test]
async fn a_ttl_shorter_than_the_start_counts_from_readiness() {
    let c = ControllerProcess::start("").await;
    let cl = c.client();
    let sb = cl
        .create(&CreateSandbox {
            ttl_seconds: Some(1),
            ..berth_tests::controller::desktop()
        })
        .await
        .unwrap();
    assert_eq!(sb.status, "running");
    let ms = |t: Option<&str>| berth_tests::epoch_ms(t.unwrap()).unwrap();
    let (created, ready, expires) = (
        ms(Some(&sb.created_at)),
        ms(sb.ready_at.as_deref()),
        ms(sb.expires_at.as_deref()),
    );
    println!(
        "started in {} ms; expires {} ms after ready",
        ready - created,
        expires - ready
    );
    assert!(expires >= ready + 950, "{sb:#?}");
    wait_for("the sandbox to stop", Duration::from_secs(20), || async {
        (cl.get(&sb.id).await.unwrap().status == "stopped").then_some(())
    })
    .await;
}

berth_tests::on_every_provider!(
    an_ide_sandbox_runs_commands_and_its_delete_leaves_nothing_running,
    runs_are_idempotent_by_id_and_secrets_stay_out_of_every_answer_and_log,
    the_catalog_lists_profiles_apps_and_bundles_and_disabled_profiles_are_422,
    leases_reuse_their_sandbox_and_reprovision_on_label_mismatch_or_a_dead_agent,
    a_lease_past_its_ttl_is_released_and_its_sandbox_destroyed,
    a_run_survives_a_kill_9_of_the_controller_with_its_exit_code_and_full_output,
    a_controller_killed_during_creates_adopts_or_reaps_them_and_leaks_nothing,
    a_sandbox_whose_agent_dies_is_marked_failed_not_running,
    fifty_concurrent_claims_against_a_pool_of_ten_are_exactly_ten_warm,
    a_pool_resized_to_zero_destroys_its_idle_members_and_spares_the_claimed_one,
    the_cli_creates_execs_lists_and_removes_sandboxes;
    kubernetes_fake_apiserver:
    an_ide_sandbox_runs_commands_and_its_delete_leaves_nothing_running,
    runs_are_idempotent_by_id_and_secrets_stay_out_of_every_answer_and_log,
    the_catalog_lists_profiles_apps_and_bundles_and_disabled_profiles_are_422,
    leases_reuse_their_sandbox_and_reprovision_on_label_mismatch_or_a_dead_agent,
    a_lease_past_its_ttl_is_released_and_its_sandbox_destroyed,
    a_run_survives_a_kill_9_of_the_controller_with_its_exit_code_and_full_output,
    a_controller_killed_during_creates_adopts_or_reaps_them_and_leaks_nothing,
    a_sandbox_whose_agent_dies_is_marked_failed_not_running,
    fifty_concurrent_claims_against_a_pool_of_ten_are_exactly_ten_warm,
    a_pool_resized_to_zero_destroys_its_idle_members_and_spares_the_claimed_one,
    the_cli_creates_execs_lists_and_removes_sandboxes,
);
