//! The book's "Engines: five ways in" chapter, run as written against `berth serve` started from
//! the README quick start's own command line (on another port): the curl block (Anthropic's and
//! OpenAI's action objects, a mixed batch, a resize) by bash, then the MCP block by Python with
//! the official MCP SDK, then the toolset block with the `anthropic` SDK's toolset class and
//! berth's driver, each output checked, and the sandbox's screen read back through the API.

use std::process::Command;

use berth_protocol::controller::ControllerClient;
use berth_tests::readme::{Served, block, chapter, section};

const BASE: &str = "http://localhost:8781";

#[tokio::test]
async fn the_engines_chapter_examples_run_verbatim() {
    let server = block(section("Quick start: the gateway API"), "sh", None);
    assert!(server.contains("127.0.0.1:8780"), "{server}");
    let server = server.replace("127.0.0.1:8780", "127.0.0.1:8781");
    let text = chapter("engines.md");
    let curl = block(text, "sh", Some("engines"));
    let python = block(text, "python", Some("engines-mcp"));
    let toolset = block(text, "python", Some("engines-toolset"));
    let dir = tempfile::tempdir().unwrap();
    let _served = Served::start(&server, dir.path(), BASE, "change-me").await;

    // The curl block in a directory of its own (it writes after-click.png there), with the two
    // variables the quick start exports.
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let script = format!("{curl}\necho \"ID=$ID\"");
    let cwd = work.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("timeout")
            .args(["300", "bash", "-e", "-o", "pipefail", "-c", &script])
            .current_dir(cwd)
            .env("SANDBOX_GATEWAY_URL", BASE)
            .env("SANDBOX_API_KEY", "change-me")
            .output()
            .expect("bash")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let log = || std::fs::read_to_string(dir.path().join("serve.log")).unwrap_or_default();
    assert!(
        out.status.success(),
        "the curl block failed ({}): {stdout}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        log()
    );
    println!("curl block:\n{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines.len(),
        4,
        "one line per printing command, then the id: {stdout:?}"
    );
    assert_eq!(lines[0], "computer_screenshot", "OpenAI's answer type");
    assert_eq!(
        lines[1], "X=20,Y=20",
        "the batch ran in order and ended where it moved"
    );
    assert_eq!(lines[2], r#"{"width":1024,"height":768}"#, "the resize");
    let id = lines[3].strip_prefix("ID=").expect("the id").to_string();
    let png = std::fs::read(work.join("after-click.png")).expect("after-click.png");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "a PNG");
    let size = (
        u32::from_be_bytes(png[16..20].try_into().unwrap()),
        u32::from_be_bytes(png[20..24].try_into().unwrap()),
    );
    assert_eq!(
        size,
        (1280, 800),
        "the click's screen is the one asked at create"
    );

    // The MCP block, with the sandbox's id.
    let stdout = python_block("MCP", &python, &id, &log).await;
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout:?}");
    for tool in [
        "'computer'",
        "'screenshot'",
        "'exec'",
        "'read_file'",
        "'list_dir'",
    ] {
        assert!(lines[0].contains(tool), "{tool} listed: {}", lines[0]);
    }
    let (mime, rest) = lines[1].split_once(' ').unwrap();
    assert_eq!(mime, "image/png");
    let bytes: usize = rest.trim_end_matches(" bytes").parse().unwrap();
    assert!(bytes > 1000, "a real screenshot: {bytes} bytes");
    assert!(
        lines[2].contains("'exit_code': 3") && lines[2].contains("'stdout': 'hi\\n'"),
        "the exec's structured answer: {}",
        lines[2]
    );

    // The toolset block: the SDK's class, berth's driver, a turn that stops at its first failure.
    let stdout = python_block("toolset", &toolset, &id, &log).await;
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        [
            "{'type': 'computer_toolset_20260801'} 1024",
            "[{'type': 'text', 'text': 'Clicked.'}]",
            // The agent's JSON objects come with their keys sorted.
            "[[{'text': \"invalid input for computer member 'mouse_move': \
             coordinate: (5000, 1) is outside the 1024x768 screenshot\", 'type': 'text'}], 'Not \
             executed: an earlier computer action in this turn failed.']",
        ],
        "{stdout}"
    );

    // The screen the examples left, through the API.
    let display: serde_json::Value = reqwest::Client::new()
        .get(format!("{BASE}/sandbox/sandboxes/v1/{id}/v1/display"))
        .header("x-api-key", "change-me")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (display["width"].as_u64(), display["height"].as_u64()),
        (Some(1024), Some(768))
    );
    let c = ControllerClient::new(BASE, Some("change-me".to_string()));
    c.delete(&id).await.unwrap();
}

/// Runs a Python block of the chapter with the quick start's variables and the sandbox's `ID`; its
/// stdout (printed), or a failure with its stderr and the controller's log.
async fn python_block(name: &str, code: &str, id: &str, log: &dyn Fn() -> String) -> String {
    let (code, id) = (code.to_string(), id.to_string());
    let out = tokio::task::spawn_blocking(move || {
        Command::new("timeout")
            .args(["180", "python3", "-c", &code])
            .env("SANDBOX_GATEWAY_URL", BASE)
            .env("SANDBOX_API_KEY", "change-me")
            .env("ID", id)
            .output()
            .expect("python3 (tests/setup.sh installs mcp and anthropic)")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the {name} block failed ({}): {stdout}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        log()
    );
    println!("{name} block:\n{stdout}");
    stdout
}
