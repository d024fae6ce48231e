//! Golden JSON: each wire type serialised from a fixed value must be exactly the literal here
//! (field names, order, which optional fields are left out), and the literal must parse back
//! to the same value. The literals are the frozen bodies of `API.md`; a change here is a wire
//! change.

use std::collections::BTreeMap;
use std::fmt::Debug;

use berth_protocol::controller::{
    AcquireLease, AdjustPool, BuildImage, CatalogList, Command, CreateQuery, CreateSandbox,
    CredentialView, EgressReport, Endpoints, ImageJob, Lease, Limits, LimitsOverride, PoolList,
    PoolStatus, PortPreview, PortUrl, PortUrlRequest, Run, RunRequest, Sandbox, SandboxCredential,
    Viewer, ViewerUrl,
};
use berth_protocol::egress::{Egress, EgressMode, EgressRules};
use berth_protocol::lifecycle::{ImageJobStatus, RunStatus, SandboxStatus};
use berth_protocol::{
    ComponentStatus, ErrorBody, Event, EventsPage, ExecResult, OutputChunk, OutputPage,
    ReadyReport, RecordingInfo, RecordingState, Stream,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Removes the whitespace outside strings, so literals can be laid out for reading.
fn minify(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in json.chars() {
        if in_string {
            out.push(c);
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
        } else if c == '"' {
            in_string = true;
            out.push(c);
        } else if !c.is_whitespace() {
            out.push(c);
        }
    }
    out
}

/// Serialises `value` to exactly `literal` and parses `literal` back to `value`.
fn golden<T: Serialize + DeserializeOwned + PartialEq + Debug>(value: &T, literal: &str) {
    let want = minify(literal);
    let got = serde_json::to_string(value).unwrap();
    assert_eq!(
        got,
        want,
        "{} serialises differently",
        std::any::type_name::<T>()
    );
    let back: T = serde_json::from_str(&want).unwrap_or_else(|e| {
        panic!(
            "{} does not parse its golden JSON: {e}",
            std::any::type_name::<T>()
        )
    });
    assert_eq!(&back, value, "{} round trip", std::any::type_name::<T>());
}

/// `literal` is refused (`deny_unknown_fields`, wrong types): a 400 on the wire.
fn refused<T: DeserializeOwned + Debug>(literal: &str) {
    let r = serde_json::from_str::<T>(literal);
    assert!(
        r.is_err(),
        "{} accepted {literal}: {r:?}",
        std::any::type_name::<T>()
    );
}

const AT: &str = "2026-12-01T16:00:00.000Z";
const LATER: &str = "2026-12-01T16:00:02.500Z";
const EXPIRES: &str = "2026-12-01T17:00:00.000Z";

fn desktop_sandbox() -> Sandbox {
    let base = "http://controller:8780/sandbox/sandboxes/v1/sb_0123";
    Sandbox {
        id: "sb_0123".into(),
        profile: "desktop-ubuntu".into(),
        status: SandboxStatus::Running,
        viewer: Viewer {
            kind: "novnc".into(),
            url: Some(format!("{base}/vnc/")),
        },
        endpoints: Endpoints {
            compat: Some("http://127.0.0.1:40001".into()),
            cdp: Some("http://127.0.0.1:40002".into()),
            preview: BTreeMap::from([(
                "vlc".into(),
                PortPreview {
                    port: 8080,
                    url: format!("{base}/ports/8080/"),
                },
            )]),
            ports: BTreeMap::from([("vlc".into(), "http://127.0.0.1:40003".into())]),
        },
        labels: BTreeMap::from([("team".into(), "a".into())]),
        image_ref: "berth-desktop:0f1e2d".into(),
        created_at: AT.into(),
        ready_at: Some(LATER.into()),
        expires_at: Some(EXPIRES.into()),
        error: None,
        claim: Some("warm".into()),
        lease_id: Some("ls_0456".into()),
        screen: Some("1280x800".into()),
        limits: Some(Limits {
            cpus: Some(2.0),
            cpu_shares: Some(1024),
            memory_mb: Some(4096),
            swap_mb: Some(0),
            pids: Some(2048),
            shm_mb: Some(512),
            unenforced: BTreeMap::from([(
                "pids".into(),
                "a Pod's process limit is the kubelet's podPidsLimit, set per node".into(),
            )]),
        }),
        egress: Some(EgressReport {
            policy: Egress::Rules(EgressRules {
                allow: vec!["github.com".into(), "*.pypi.org".into()],
                deny_private: true,
            }),
            hosts: BTreeMap::from([("github.com".into(), 3)]),
            denied: 1,
            repositories: vec!["acme/app".into()],
            credentials: vec![CredentialView {
                host: "api.example.com".into(),
                header: "Authorization".into(),
            }],
        }),
    }
}

const DESKTOP_SANDBOX: &str = r#"{
    "id": "sb_0123",
    "profile": "desktop-ubuntu",
    "status": "running",
    "viewer": {"kind": "novnc", "url": "http://controller:8780/sandbox/sandboxes/v1/sb_0123/vnc/"},
    "endpoints": {
        "compat": "http://127.0.0.1:40001",
        "cdp": "http://127.0.0.1:40002",
        "preview": {
            "vlc": {"port": 8080, "url": "http://controller:8780/sandbox/sandboxes/v1/sb_0123/ports/8080/"}
        },
        "vlc": "http://127.0.0.1:40003"
    },
    "labels": {"team": "a"},
    "image_ref": "berth-desktop:0f1e2d",
    "created_at": "2026-12-01T16:00:00.000Z",
    "ready_at": "2026-12-01T16:00:02.500Z",
    "expires_at": "2026-12-01T17:00:00.000Z",
    "error": null,
    "claim": "warm",
    "lease_id": "ls_0456",
    "screen": "1280x800",
    "limits": {
        "cpus": 2.0, "cpu_shares": 1024, "memory_mb": 4096, "swap_mb": 0, "pids": 2048,
        "shm_mb": 512,
        "unenforced": {"pids": "a Pod's process limit is the kubelet's podPidsLimit, set per node"}
    },
    "egress": {
        "policy": {"allow": ["github.com", "*.pypi.org"], "deny_private": true},
        "hosts": {"github.com": 3},
        "denied": 1,
        "repositories": ["acme/app"],
        "credentials": [{"host": "api.example.com", "header": "Authorization"}]
    }
}"#;

#[test]
fn sandbox() {
    golden(&desktop_sandbox(), DESKTOP_SANDBOX);
    // A headless sandbox still starting: every frozen field present, nulls and all; no
    // preview, no declared ports, no claim or lease.
    let ide = Sandbox {
        id: "sb_0789".into(),
        profile: "ide-ubuntu".into(),
        status: SandboxStatus::Starting,
        viewer: Viewer {
            kind: "none".into(),
            url: None,
        },
        endpoints: Endpoints {
            compat: None,
            cdp: None,
            ..Default::default()
        },
        labels: BTreeMap::new(),
        image_ref: "process:abc".into(),
        created_at: AT.into(),
        ready_at: None,
        expires_at: None,
        error: None,
        claim: None,
        lease_id: None,
        screen: None,
        limits: None,
        egress: None,
    };
    golden(
        &ide,
        r#"{"id": "sb_0789", "profile": "ide-ubuntu", "status": "starting",
            "viewer": {"kind": "none", "url": null},
            "endpoints": {"compat": null, "cdp": null},
            "labels": {}, "image_ref": "process:abc", "created_at": "2026-12-01T16:00:00.000Z",
            "ready_at": null, "expires_at": null, "error": null}"#,
    );
}

#[test]
fn sandbox_requests() {
    golden(
        &CreateSandbox {
            profile: "desktop-ubuntu".into(),
            image_ref: Some("berth-desktop:0f1e2d".into()),
            labels: BTreeMap::from([("k".into(), "v".into())]),
            ttl_seconds: Some(600),
            screen: Some("1280x800".into()),
            egress: Some(Egress::Mode(EgressMode::None)),
            credentials: Vec::new(),
            human_control: None,
            logins: Vec::new(),
            limits: Some(LimitsOverride {
                cpus: Some(1.5),
                memory_mb: Some(2048),
                ..Default::default()
            }),
        },
        r#"{"profile": "desktop-ubuntu", "image_ref": "berth-desktop:0f1e2d",
            "labels": {"k": "v"}, "ttl_seconds": 600, "screen": "1280x800", "egress": "none",
            "limits": {"cpus": 1.5, "memory_mb": 2048}}"#,
    );
    golden(
        &CreateSandbox {
            profile: "ide".into(),
            egress: Some(Egress::Rules(EgressRules {
                allow: vec!["api.example.com".into()],
                deny_private: true,
            })),
            credentials: vec![SandboxCredential {
                host: "api.example.com".into(),
                header: Some("X-Api-Key".into()),
                value: Some("Key {secret}".into()),
                basic_user: None,
                secret: "s3cret".into(),
            }],
            ..Default::default()
        },
        r#"{"profile": "ide", "egress": {"allow": ["api.example.com"], "deny_private": true},
            "credentials": [{"host": "api.example.com", "header": "X-Api-Key",
                             "value": "Key {secret}", "secret": "s3cret"}]}"#,
    );
    refused::<CreateSandbox>(
        r#"{"profile": "ide", "credentials": [{"host": "a.test", "secret": "s", "x": 1}]}"#,
    );
    golden(
        &CreateSandbox {
            profile: "desktop".into(),
            ..Default::default()
        },
        r#"{"profile": "desktop"}"#,
    );
    refused::<CreateSandbox>(r#"{"profile": "desktop", "screen_size": "1x1"}"#);
    golden(&CreateQuery { wait: Some(false) }, r#"{"wait": false}"#);
    refused::<CreateQuery>(r#"{"wait": false, "x": 1}"#);
}

#[test]
fn run() {
    golden(
        &RunRequest {
            command: Command::Line("echo hi".into()),
            env: BTreeMap::from([("A".into(), "1".into())]),
            secrets: BTreeMap::from([("TOKEN".into(), "s3cret".into())]),
            timeout_ms: Some(5000),
            wait: Some(true),
            run_id: Some("r1".into()),
            ..Default::default()
        },
        r#"{"command": "echo hi", "env": {"A": "1"}, "secrets": {"TOKEN": "s3cret"},
            "timeout_ms": 5000, "wait": true, "run_id": "r1"}"#,
    );
    golden(
        &RunRequest {
            command: Command::Argv(vec!["ls".into(), "-la".into()]),
            shell: Some(false),
            cwd: Some("/app".into()),
            user: Some("root".into()),
            ..Default::default()
        },
        r#"{"command": ["ls", "-la"], "shell": false, "cwd": "/app", "user": "root"}"#,
    );
    refused::<RunRequest>(r#"{"command": "ls", "argv": ["ls"]}"#);
    golden(
        &Run {
            id: "r1".into(),
            sandbox_id: "sb_0123".into(),
            status: RunStatus::Exited,
            exit_code: Some(3),
            stdout: "out\n".into(),
            stderr: "err\n".into(),
            started_at: Some(AT.into()),
            ended_at: Some(LATER.into()),
            error: None,
            output_truncated: false,
            output_artifact: None,
            truncated: false,
            output_preview: None,
        },
        r#"{"id": "r1", "sandbox_id": "sb_0123", "status": "exited", "exit_code": 3,
            "stdout": "out\n", "stderr": "err\n", "started_at": "2026-12-01T16:00:00.000Z",
            "ended_at": "2026-12-01T16:00:02.500Z", "error": null}"#,
    );
}

#[test]
fn lease() {
    golden(
        &AcquireLease {
            thread_id: "thread-1".into(),
            profile: "ide-ubuntu".into(),
            ttl_seconds: Some(60),
            ..Default::default()
        },
        r#"{"thread_id": "thread-1", "profile": "ide-ubuntu", "ttl_seconds": 60}"#,
    );
    let lease = Lease {
        lease_id: "ls_0456".into(),
        sandbox: desktop_sandbox(),
        thread_id: "thread-1".into(),
        expires_at: Some(EXPIRES.into()),
        how: Some("warm".into()),
    };
    golden(
        &lease,
        &format!(
            r#"{{"lease_id": "ls_0456", "sandbox": {DESKTOP_SANDBOX}, "thread_id": "thread-1",
                "expires_at": "2026-12-01T17:00:00.000Z", "how": "warm"}}"#
        ),
    );
}

#[test]
fn catalog_viewer_pools_images_and_previews() {
    let profile = serde_json::json!({
        "name": "desktop-ubuntu", "aliases": ["desktop"], "description": "Linux workstation",
        "driver_hint": "process", "viewer": "novnc", "desktop": true, "enabled": true,
    });
    golden(
        &CatalogList {
            kind: "profile".into(),
            items: vec![profile],
        },
        // serde_json's maps without preserve_order sort their keys.
        r#"{"kind": "profile", "items": [{"aliases": ["desktop"], "description": "Linux workstation",
            "desktop": true, "driver_hint": "process", "enabled": true, "name": "desktop-ubuntu",
            "viewer": "novnc"}]}"#,
    );
    golden(
        &ViewerUrl {
            url: "http://controller:8780/sandbox/sandboxes/v1/sb_0123/vnc/?t=abc".into(),
        },
        r#"{"url": "http://controller:8780/sandbox/sandboxes/v1/sb_0123/vnc/?t=abc"}"#,
    );
    golden(
        &PortUrlRequest {
            ttl_seconds: Some(300),
        },
        r#"{"ttl_seconds": 300}"#,
    );
    golden(&PortUrlRequest::default(), r#"{}"#);
    golden(
        &PortUrl {
            url: "http://controller:8780/sandbox/sandboxes/v1/sb_0123/ports/8080/?t=abc".into(),
            expires_at: EXPIRES.into(),
        },
        r#"{"url": "http://controller:8780/sandbox/sandboxes/v1/sb_0123/ports/8080/?t=abc",
            "expires_at": "2026-12-01T17:00:00.000Z"}"#,
    );
    golden(
        &PoolList {
            pools: vec![PoolStatus {
                pool: "ide-ubuntu@process:abc".into(),
                profile: "ide-ubuntu".into(),
                image_ref: "process:abc".into(),
                size: 3,
                ready: 2,
                starting: 1,
                paused: false,
                failing: None,
                screen: None,
                egress: None,
            }],
        },
        r#"{"pools": [{"pool": "ide-ubuntu@process:abc", "profile": "ide-ubuntu",
            "image_ref": "process:abc", "size": 3, "ready": 2, "starting": 1, "paused": false,
            "failing": null}]}"#,
    );
    golden(
        &AdjustPool {
            paused: Some(true),
            size: None,
        },
        r#"{"paused": true}"#,
    );
    refused::<AdjustPool>(r#"{"size": -1}"#);
    refused::<AdjustPool>(r#"{"sizes": 1}"#);
    golden(
        &BuildImage {
            profile: "desktop-ubuntu".into(),
            bundle: Some("osworld".into()),
            apps: vec!["gimp".into()],
            ..Default::default()
        },
        r#"{"profile": "desktop-ubuntu", "bundle": "osworld", "apps": ["gimp"]}"#,
    );
    golden(
        &BuildImage {
            from: Some("team/app:1".into()),
            ..Default::default()
        },
        r#"{"from": "team/app:1"}"#,
    );
    golden(
        &BuildImage {
            dockerfile: Some("/srv/app".into()),
            ..Default::default()
        },
        r#"{"dockerfile": "/srv/app"}"#,
    );
    refused::<BuildImage>(r#"{"profile": "desktop", "app": "gimp"}"#);
    golden(
        &ImageJob {
            image_ref: "berth-desktop:0f1e2d".into(),
            image_uri: "berth-desktop:0f1e2d".into(),
            status: ImageJobStatus::Building,
            steps: vec!["debootstrap".into()],
            error: None,
            started_at: AT.into(),
            ended_at: None,
        },
        r#"{"image_ref": "berth-desktop:0f1e2d", "image_uri": "berth-desktop:0f1e2d",
            "status": "building", "steps": ["debootstrap"], "error": null,
            "started_at": "2026-12-01T16:00:00.000Z", "ended_at": null}"#,
    );
}

#[test]
fn error_body() {
    golden(
        &ErrorBody::new("not_found", "no sandbox sb_x"),
        r#"{"error": {"code": "not_found", "message": "no sandbox sb_x"}}"#,
    );
}

#[test]
fn exec_and_output() {
    golden(
        &ExecResult {
            id: "cmd_1".into(),
            exit_code: 0,
            signal: None,
            stdout: Some("hi\n".into()),
            stdout_b64: None,
            stderr: Some(String::new()),
            stderr_b64: None,
            duration_ms: 3,
            timed_out: false,
            output_truncated: false,
            stdout_preview: None,
            stderr_preview: None,
            output_href: None,
        },
        r#"{"id": "cmd_1", "exit_code": 0, "stdout": "hi\n", "stderr": "", "duration_ms": 3,
            "timed_out": false}"#,
    );
    golden(
        &ExecResult {
            id: "cmd_2".into(),
            exit_code: 137,
            signal: Some("KILL".into()),
            stdout: None,
            stdout_b64: Some("/w==".into()),
            stderr: Some(String::new()),
            stderr_b64: None,
            duration_ms: 1000,
            timed_out: true,
            output_truncated: true,
            stdout_preview: None,
            stderr_preview: None,
            output_href: None,
        },
        r#"{"id": "cmd_2", "exit_code": 137, "signal": "KILL", "stdout_b64": "/w==",
            "stderr": "", "duration_ms": 1000, "timed_out": true, "output_truncated": true}"#,
    );
    // Output past the inline bound: a preview of its ends and where the rest is read.
    golden(
        &ExecResult {
            id: "cmd_3".into(),
            exit_code: 0,
            signal: None,
            stdout: None,
            stdout_b64: None,
            stderr: Some(String::new()),
            stderr_b64: None,
            duration_ms: 40,
            timed_out: false,
            output_truncated: true,
            stdout_preview: Some(berth_protocol::OutputPreview {
                bytes: 2_000_000,
                head: "1\n".into(),
                tail: "400000\n".into(),
                omitted_bytes: 1_999_991,
            }),
            stderr_preview: None,
            output_href: Some("/v1/commands/cmd_3/output".into()),
        },
        r#"{"id": "cmd_3", "exit_code": 0, "stderr": "", "duration_ms": 40, "timed_out": false,
            "output_truncated": true, "stdout_preview": {"bytes": 2000000, "head": "1\n",
            "tail": "400000\n", "omitted_bytes": 1999991},
            "output_href": "/v1/commands/cmd_3/output"}"#,
    );
    golden(
        &OutputPage {
            chunks: vec![
                OutputChunk {
                    seq: 0,
                    stream: Stream::Stdout,
                    data: Some("hi\n".into()),
                    data_b64: None,
                },
                OutputChunk {
                    seq: 3,
                    stream: Stream::Stderr,
                    data: None,
                    data_b64: Some("/w==".into()),
                },
            ],
            next_seq: 4,
            done: true,
            exit_code: Some(0),
            truncated_before_seq: None,
        },
        r#"{"chunks": [{"seq": 0, "stream": "stdout", "data": "hi\n"},
                       {"seq": 3, "stream": "stderr", "data_b64": "/w=="}],
            "next_seq": 4, "done": true, "exit_code": 0}"#,
    );
    golden(
        &OutputPage {
            chunks: vec![],
            next_seq: 1 << 20,
            done: false,
            exit_code: None,
            truncated_before_seq: Some(1024),
        },
        r#"{"chunks": [], "next_seq": 1048576, "done": false, "truncated_before_seq": 1024}"#,
    );
}

#[test]
fn events() {
    let mut data = serde_json::Map::new();
    data.insert("id".into(), "cmd_1".into());
    data.insert("exit_code".into(), 0.into());
    golden(
        &EventsPage {
            events: vec![Event {
                seq: 7,
                at: AT.into(),
                kind: berth_protocol::EventKind::CommandExited,
                data,
            }],
            next_seq: 8,
            truncated_before_seq: None,
        },
        r#"{"events": [{"seq": 7, "at": "2026-12-01T16:00:00.000Z", "kind": "command.exited",
                        "exit_code": 0, "id": "cmd_1"}],
            "next_seq": 8}"#,
    );
}

#[test]
fn ready_report() {
    golden(
        &ReadyReport {
            ready: false,
            components: BTreeMap::from([
                (
                    "vnc".into(),
                    ComponentStatus {
                        ok: true,
                        state: "up".into(),
                        reason: String::new(),
                        since: AT.into(),
                        pid: Some(42),
                        restarts: 0,
                    },
                ),
                (
                    "chromium".into(),
                    ComponentStatus {
                        ok: false,
                        state: "down".into(),
                        reason: "exited with 1".into(),
                        since: LATER.into(),
                        pid: None,
                        restarts: 2,
                    },
                ),
            ]),
        },
        r#"{"ready": false, "components": {
            "chromium": {"ok": false, "state": "down", "reason": "exited with 1",
                         "since": "2026-12-01T16:00:02.500Z", "restarts": 2},
            "vnc": {"ok": true, "state": "up", "reason": "", "since": "2026-12-01T16:00:00.000Z",
                    "pid": 42, "restarts": 0}}}"#,
    );
}

#[test]
fn recording_info() {
    golden(
        &RecordingInfo {
            id: "rec_1".into(),
            state: RecordingState::Stopped,
            compat: false,
            width: 1280,
            height: 720,
            fps: 15,
            bitrate_kbps: 4000,
            keyframe_interval_ms: 10000,
            cursor: true,
            frames_encoded: 30,
            frames_skipped: 15,
            frames_dropped: 0,
            keyframes: 1,
            bytes: 65536,
            duration_ms: 3000,
            achieved_fps: 15.0,
            encoded_fps: 10.0,
            started_at: AT.into(),
            ended_at: Some(LATER.into()),
            end_reason: Some("stopped".into()),
            error: None,
        },
        r#"{"id": "rec_1", "state": "stopped", "compat": false, "width": 1280, "height": 720,
            "fps": 15, "bitrate_kbps": 4000, "keyframe_interval_ms": 10000, "cursor": true,
            "frames_encoded": 30, "frames_skipped": 15, "frames_dropped": 0, "keyframes": 1,
            "bytes": 65536, "duration_ms": 3000, "achieved_fps": 15.0, "encoded_fps": 10.0,
            "started_at": "2026-12-01T16:00:00.000Z", "ended_at": "2026-12-01T16:00:02.500Z",
            "end_reason": "stopped"}"#,
    );
}

#[test]
fn the_minifier_keeps_strings_whole() {
    assert_eq!(
        minify(r#"{ "a b": "c \" d", "e": [1, 2] }"#),
        r#"{"a b":"c \" d","e":[1,2]}"#
    );
}
