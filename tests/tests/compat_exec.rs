//! The OSWorld-compatible command routes against a real agent and real processes:
//! `/execute`, `/setup/execute`, `/execute_with_verification`, `/setup/launch`, `/run_python`,
//! `/run_bash_script`, and the transport-level errors (404, 405, 415, 400).

use std::time::Duration;

use berth_tests::{AgentProcess, processes_matching, unique_sleep, wait_for};
use serde_json::{Value, json};

async fn post(a: &AgentProcess, path: &str, body: Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(a.url(path))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, v)
}

async fn post_text(a: &AgentProcess, path: &str, body: Value) -> (u16, String, String) {
    let resp = reqwest::Client::new()
        .post(a.url(path))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let ct = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (status, ct, resp.text().await.unwrap())
}

#[tokio::test]
async fn execute_runs_an_argv_and_answers_the_exact_four_keys() {
    let a = AgentProcess::start().await;
    let (status, ct, body) = post_text(&a, "/execute", json!({"command": ["echo", "hi"]})).await;
    assert_eq!(status, 200);
    assert_eq!(ct, "application/json");
    assert_eq!(
        body,
        "{\"error\":\"\",\"output\":\"hi\\n\",\"returncode\":0,\"status\":\"success\"}\n"
    );
}

#[tokio::test]
async fn execute_reports_success_status_whatever_the_exit_code() {
    let a = AgentProcess::start().await;
    let (status, v) = post(
        &a,
        "/execute",
        json!({"command": "echo oops >&2; exit 3", "shell": true}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(v["returncode"], 3);
    assert_eq!(v["status"], "success");
    assert_eq!(v["error"], "oops\n");
}

#[tokio::test]
async fn execute_splits_strings_like_shlex_without_a_shell() {
    let a = AgentProcess::start().await;
    let (_, v) = post(&a, "/execute", json!({"command": "printf '%s|' 'a  b' c"})).await;
    assert_eq!(v["output"], "a  b|c|");
    let (status, v) = post(&a, "/execute", json!({"command": "echo 'open"})).await;
    assert_eq!(status, 500);
    assert_eq!(
        v,
        json!({"message": "No closing quotation", "status": "error"})
    );
}

#[tokio::test]
async fn execute_with_a_list_and_shell_passes_the_rest_as_positional_args() {
    let a = AgentProcess::start().await;
    // Python hands list[0] to `sh -c` and the rest become $0, $1 …
    let (_, v) = post(
        &a,
        "/execute",
        json!({"command": ["echo \"$0-$1\"", "x", "y"], "shell": true}),
    )
    .await;
    assert_eq!(v["output"], "x-y\n");
}

#[tokio::test]
async fn execute_expands_tilde_slash_only_at_the_start_of_list_items() {
    let a = AgentProcess::start().await;
    std::fs::write(a.home.join("note.txt"), "in home\n").unwrap();
    let (_, v) = post(&a, "/execute", json!({"command": ["cat", "~/note.txt"]})).await;
    assert_eq!(v["output"], "in home\n");
    let (_, v) = post(&a, "/execute", json!({"command": ["echo", "x~/y", "~"]})).await;
    assert_eq!(v["output"], "x~/y ~\n");
}

#[tokio::test]
async fn execute_runs_in_the_sandbox_home_with_the_documented_environment() {
    let a = AgentProcess::start_with(berth_tests::AgentOptions {
        env: vec![("BERTH_AGENT_SECRET_PROBE".into(), "leak".into())],
        ..Default::default()
    })
    .await;
    let (_, v) = post(
        &a,
        "/execute",
        json!({"command": "pwd; env", "shell": true}),
    )
    .await;
    let out = v["output"].as_str().unwrap();
    let mut lines = out.lines();
    assert_eq!(lines.next().unwrap(), a.home.to_str().unwrap());
    let env: Vec<&str> = lines.collect();
    for key in [
        "HOME=",
        "USER=",
        "LOGNAME=",
        "XAUTHORITY=",
        "XDG_RUNTIME_DIR=",
        "LANG=C.UTF-8",
        "PATH=",
    ] {
        assert!(
            env.iter().any(|l| l.starts_with(key)),
            "{key} missing in {env:?}"
        );
    }
    assert!(
        env.iter().all(|l| !l.starts_with("BERTH_AGENT_")),
        "agent variables leaked: {env:?}"
    );
    let xauth = env.iter().find(|l| l.starts_with("XAUTHORITY=")).unwrap();
    assert!(
        std::path::Path::new(&xauth["XAUTHORITY=".len()..]).exists(),
        "Xauthority file exists"
    );
}

#[tokio::test]
async fn execute_spawn_failure_is_the_python_500_body() {
    let a = AgentProcess::start().await;
    let (status, v) = post(
        &a,
        "/execute",
        json!({"command": ["definitely-not-a-program"]}),
    )
    .await;
    assert_eq!(status, 500);
    assert_eq!(
        v,
        json!({"message": "[Errno 2] No such file or directory: 'definitely-not-a-program'", "status": "error"})
    );
}

#[tokio::test]
async fn execute_with_an_empty_body_object_is_list_index_out_of_range() {
    let a = AgentProcess::start().await;
    let (status, v) = post(&a, "/execute", json!({})).await;
    assert_eq!(status, 500);
    assert_eq!(
        v,
        json!({"message": "list index out of range", "status": "error"})
    );
}

#[tokio::test]
async fn execute_timeout_kills_the_whole_process_group_and_says_so() {
    let a = AgentProcess::start().await;
    let m = unique_sleep(300);
    let script = format!("sleep {m} & sleep {m}");
    let started = std::time::Instant::now();
    let (status, v) = post(
        &a,
        "/execute",
        json!({"command": ["sh", "-c", script], "timeout": 1}),
    )
    .await;
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(status, 500);
    assert_eq!(
        v["message"],
        format!("Command '['sh', '-c', '{script}']' timed out after 1 seconds")
    );
    // The grandchild `sleep 300 &` was in the same group: it is gone too.
    wait_for(
        "the command tree to die",
        Duration::from_secs(5),
        || async { processes_matching(&m).is_empty().then_some(()) },
    )
    .await;
    let (status, v) = post(
        &a,
        "/execute",
        json!({"command": "sleep 5", "shell": true, "timeout": 0.2}),
    )
    .await;
    assert_eq!(status, 500);
    assert_eq!(
        v["message"],
        "Command 'sleep 5' timed out after 0.2 seconds"
    );
}

/// `str(subprocess.TimeoutExpired)` as Python 3 prints it: `Command '%s' timed out after %s
/// seconds`, a string command inserted verbatim, a list as its `str()`, the timeout as sent.
#[tokio::test]
async fn execute_timeout_message_is_pythons_timeout_expired_text() {
    let a = AgentProcess::start().await;
    let cases = [
        // A shell string with quotes and a newline: inserted as is, nothing escaped.
        (
            json!({"command": "sleep 5; echo 'it'\\''s'\nx", "shell": true, "timeout": 0.2}),
            "Command 'sleep 5; echo 'it'\\''s'\nx' timed out after 0.2 seconds",
        ),
        // A string without a shell is shlex-split first, so the list is shown; a float
        // timeout keeps its fraction.
        (
            json!({"command": "sh -c 'sleep 5'", "timeout": 1.0}),
            "Command '['sh', '-c', 'sleep 5']' timed out after 1.0 seconds",
        ),
        // A list item with an apostrophe is repr'd in double quotes.
        (
            json!({"command": ["sh", "-c", "sleep 5 # it's"], "timeout": 0.2}),
            "Command '['sh', '-c', \"sleep 5 # it's\"]' timed out after 0.2 seconds",
        ),
    ];
    for (body, message) in cases {
        let (status, v) = post(&a, "/execute", body).await;
        assert_eq!(status, 500);
        assert_eq!(v, json!({"message": message, "status": "error"}));
    }
}

#[tokio::test]
async fn execute_replaces_invalid_utf8_and_translates_newlines_like_python() {
    let a = AgentProcess::start().await;
    let (_, v) = post(
        &a,
        "/execute",
        json!({"command": ["printf", "a\\377b\\r\\nc\\rd"]}),
    )
    .await;
    assert_eq!(v["output"], "a\u{fffd}b\nc\nd");
}

#[tokio::test]
async fn setup_execute_is_the_same_handler() {
    let a = AgentProcess::start().await;
    let (status, v) = post(&a, "/setup/execute", json!({"command": ["echo", "setup"]})).await;
    assert_eq!(status, 200);
    assert_eq!(v["output"], "setup\n");
}

#[tokio::test]
async fn execute_rejects_bad_bodies_with_json_errors() {
    let a = AgentProcess::start().await;
    let http = reqwest::Client::new();
    // Form body: 415.
    let r = http
        .post(a.url("/execute"))
        .form(&[("command", "ls")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    assert_eq!(r.json::<Value>().await.unwrap()["status"], "error");
    // Malformed JSON: 400.
    let r = http
        .post(a.url("/execute"))
        .header("content-type", "application/json")
        .body("{\"command\": [")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .starts_with("Failed to decode JSON object")
    );
    // A JSON body that is not an object: 400 (the reference server crashed).
    let (status, v) = post(&a, "/execute", json!(["ls"])).await;
    assert_eq!(status, 400);
    assert_eq!(v["status"], "error");
    // A non-string list item: 400 naming the type.
    let (status, v) = post(&a, "/execute", json!({"command": ["echo", 5]})).await;
    assert_eq!(status, 400);
    assert!(v["message"].as_str().unwrap().contains("not int"));
    // A bad timeout: 400.
    let (status, _) = post(&a, "/execute", json!({"command": ["true"], "timeout": "x"})).await;
    assert_eq!(status, 400);
    // A body past the compat limit (16 MiB): 413, answered after draining what was sent.
    let huge = format!(
        r#"{{"command": ["true"], "pad": "{}"}}"#,
        "x".repeat(17 << 20)
    );
    let r = http
        .post(a.url("/execute"))
        .header("content-type", "application/json")
        .body(huge)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    assert_eq!(r.json::<Value>().await.unwrap()["status"], "error");
    // An argument with a NUL byte: the reference server's ValueError.
    let (status, v) = post(&a, "/execute", json!({"command": ["echo", "a\u{0}b"]})).await;
    assert_eq!(status, 500);
    assert_eq!(v["message"], "embedded null byte");
}

#[tokio::test]
async fn unknown_paths_are_404_and_wrong_methods_405_with_allow() {
    let a = AgentProcess::start().await;
    let http = reqwest::Client::new();
    let r = http.get(a.url("/")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let r = http.get(a.url("/nope")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await.unwrap()["status"], "error");
    let r = http.get(a.url("/execute")).send().await.unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()["allow"], "POST");
    let r = http.post(a.url("/platform")).send().await.unwrap();
    assert_eq!(r.status(), 405);
}

#[tokio::test]
async fn platform_is_linux_as_text_html() {
    let a = AgentProcess::start().await;
    let r = reqwest::get(a.url("/platform")).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/html; charset=utf-8");
    assert_eq!(r.text().await.unwrap(), "Linux");
}

#[tokio::test]
async fn verification_by_command_success_passes_with_a_float_wait_time() {
    let a = AgentProcess::start().await;
    let flag = a.home.join("flag");
    let (status, v) = post(
        &a,
        "/setup/execute_with_verification",
        json!({
            "command": format!("sleep 0.3; touch {}", flag.display()),
            "shell": true,
            "verification": {"command_success": format!("test -e {}", flag.display())},
            "max_wait_time": 5,
            "check_interval": 0.1,
        }),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["verification"], "passed");
    assert_eq!(v["status"], "success");
    assert!(v["wait_time"].is_f64());
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        [
            "error",
            "output",
            "returncode",
            "status",
            "verification",
            "wait_time"
        ]
    );
}

#[tokio::test]
async fn verification_failure_is_500_with_max_wait_time_verbatim() {
    let a = AgentProcess::start().await;
    let (status, v) = post(
        &a,
        "/execute_with_verification",
        json!({
            "command": ["true"],
            "verification": {"command_success": "false"},
            "max_wait_time": 1,
            "check_interval": 0.2,
        }),
    )
    .await;
    assert_eq!(status, 500);
    assert_eq!(v["status"], "verification_failed");
    assert_eq!(v["verification"], "failed");
    assert_eq!(v["wait_time"], json!(1));
    // No display yet: a window never exists.
    let (status, v) = post(
        &a,
        "/execute_with_verification",
        json!({"command": ["true"], "verification": {"window_exists": "x"}, "max_wait_time": 0.3}),
    )
    .await;
    assert_eq!(status, 500);
    assert_eq!(v["wait_time"], json!(0.3));
    // Without verification: the plain four keys.
    let (status, v) = post(
        &a,
        "/execute_with_verification",
        json!({"command": ["echo", "x"]}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(v.as_object().unwrap().len(), 4);
}

#[tokio::test]
async fn launch_starts_a_tracked_background_program_and_answers_text() {
    let a = AgentProcess::start().await;
    let m = unique_sleep(60);
    let (status, ct, body) = post_text(
        &a,
        "/setup/launch",
        json!({"command": ["sh", "-c", format!("echo started; sleep {m}")]}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(ct, "text/html; charset=utf-8");
    assert_eq!(
        body,
        format!("sh -c echo started; sleep {m} launched successfully")
    );
    wait_for("the launched program", Duration::from_secs(5), || async {
        (!processes_matching(&m).is_empty()).then_some(())
    })
    .await;
    // It is a background command on the native surface, output included.
    let list = a.client().commands().await.unwrap();
    let cmd = list
        .commands
        .iter()
        .find(|c| c.background)
        .expect("launched command listed");
    let page = a.client().output(&cmd.id, 0).await.unwrap();
    assert_eq!(page.chunks[0].data.as_deref(), Some("started\n"));
    // List + shell prints the list's repr; a spawn failure is the Python 500 body.
    let (_, _, body) = post_text(
        &a,
        "/setup/launch",
        json!({"command": ["true"], "shell": true}),
    )
    .await;
    assert_eq!(body, "['true'] launched successfully");
    let (status, v) = post(
        &a,
        "/setup/launch",
        json!({"command": ["no-such-binary-x"]}),
    )
    .await;
    assert_eq!(status, 500);
    assert_eq!(
        v["message"],
        "[Errno 2] No such file or directory: 'no-such-binary-x'"
    );
}

#[tokio::test]
async fn run_python_answers_the_exact_key_set() {
    let a = AgentProcess::start().await;
    let (status, v) = post(&a, "/run_python", json!({"code": "print('hi')"})).await;
    assert_eq!(status, 200);
    assert_eq!(
        v,
        json!({"error": "", "message": "hi\n", "need_more": false, "output": "hi\n", "return_code": 0, "status": "success"})
    );
    let (status, v) = post(
        &a,
        "/run_python",
        json!({"code": "import sys; sys.exit(4)"}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(v["status"], "error");
    assert_eq!(v["return_code"], 4);
    assert_eq!(v["error"], "Process exited with code 4");
    assert_eq!(v["message"], "Process exited with code 4");
    let (_, v) = post(
        &a,
        "/run_python",
        json!({"code": "print('a'); raise SystemExit('boom')"}),
    )
    .await;
    assert_eq!(v["output"], "a\n");
    assert_eq!(v["message"], "a\n\nboom\n");
    let (status, v) = post(&a, "/run_python", json!({})).await;
    assert_eq!(status, 400);
    assert_eq!(
        v,
        json!({"message": "Code not supplied!", "status": "error"})
    );
    // The temp script is gone afterwards.
    let (_, v) = post(&a, "/run_python", json!({"code": "print(__file__)"})).await;
    let script = v["output"].as_str().unwrap().trim().to_string();
    assert!(script.starts_with("/tmp/python_exec_"), "{script}");
    assert!(!std::path::Path::new(&script).exists(), "{script} was left");
}

/// The reference's fixed 30 s limit: this test waits it out.
#[tokio::test]
async fn run_python_past_its_30_s_limit_is_the_reference_500_and_leaves_nothing_running() {
    let a = AgentProcess::start().await;
    let m = unique_sleep(300);
    let dir = tempfile::tempdir().unwrap();
    let told = dir.path().join("script-path");
    let code = format!(
        "import subprocess, time\nopen('{}', 'w').write(__file__)\n\
         subprocess.Popen(['sleep', '{m}'])\ntime.sleep(300)\n",
        told.display()
    );
    let started = std::time::Instant::now();
    let (status, v) = post(&a, "/run_python", json!({ "code": code })).await;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(30) && took < Duration::from_secs(60),
        "{took:?}"
    );
    assert_eq!(status, 500);
    assert_eq!(
        v,
        json!({"error": "TimeoutExpired", "message": "Execution timeout: Code took too long to execute", "need_more": false, "output": null, "status": "error"})
    );
    // The script's child went with it, and so did the temp script.
    wait_for(
        "the script's tree to die",
        Duration::from_secs(5),
        || async { processes_matching(&m).is_empty().then_some(()) },
    )
    .await;
    let script = std::fs::read_to_string(&told).unwrap();
    assert!(script.starts_with("/tmp/python_exec_"), "{script}");
    assert!(!std::path::Path::new(&script).exists(), "{script} was left");
}

#[tokio::test]
async fn run_bash_script_merges_stderr_and_answers_200() {
    let a = AgentProcess::start().await;
    let (status, v) = post(
        &a,
        "/run_bash_script",
        json!({"script": "echo out; echo err >&2; echo $BASH_VERSION | cut -c1; exit 2", "working_dir": "~"}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(v["status"], "error");
    assert_eq!(v["returncode"], 2);
    assert_eq!(v["error"], "");
    let out = v["output"].as_str().unwrap();
    assert!(out.starts_with("out\nerr\n"), "{out}");
    let (status, v) = post(
        &a,
        "/run_bash_script",
        json!({"script": "pwd", "working_dir": "/nonexistent-dir"}),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(
        v["output"],
        "Working directory does not exist: /nonexistent-dir"
    );
    assert_eq!(v["returncode"], -1);
    let (status, v) = post(&a, "/run_bash_script", json!({"script": ""})).await;
    assert_eq!(status, 400);
    assert_eq!(v["output"], "Script not supplied!");
    let (status, v) = post(
        &a,
        "/run_bash_script",
        json!({"script": "sleep 5", "timeout": 0.3}),
    )
    .await;
    assert_eq!(status, 500);
    assert_eq!(v["output"], "Script execution timed out after 0.3 seconds");
}

#[tokio::test]
async fn launch_with_a_nul_in_an_argument_is_400_and_the_agent_lives() {
    let a = AgentProcess::start().await;
    for body in [
        json!({"command": ["echo", "a\u{0}b"]}),
        json!({"command": "echo a\u{0}b"}),
        json!({"command": "echo a\u{0}b", "shell": true}),
    ] {
        let (status, v) = post(&a, "/setup/launch", body.clone()).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(
            v,
            json!({"message": "embedded null byte", "status": "error"}),
            "{body}"
        );
        assert!(berth_tests::pid_alive(a.pid()), "agent died on {body}");
    }
    // Nothing was started.
    assert!(a.client().commands().await.unwrap().commands.is_empty());
}
