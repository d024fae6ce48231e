//! An episode as an ATIF trajectory (the Agent Trajectory Interchange Format, `ATIF-v1.8`):
//! what harnesses and trainers exchange. Made from an episode bundle's `episode.json` and its
//! action lines (pure), so a bundle kept before the sandbox went converts as well as a live one.
//!
//! What maps:
//! - each logged action → an `agent` step: its time (`timestamp`), one tool call (`computer`,
//!   or `input` for the native input route; the route or tool it came through in the call's
//!   `extra`), the action object as the call's `arguments`, and an observation whose result is
//!   the screenshot the
//!   action answered (`screenshots/<name>` beside `trajectory.json` in the bundle) with the
//!   error, the pointer and the settle as text;
//! - a person taking or handing back the controls → a `user` step saying so;
//! - the media times of the bundled recording (`media_ms`, `screenshot_media_ms`), the action's
//!   sequence number, its length, its batch and dialect → the step's and call's `extra`;
//! - the sandbox, its image, the recording and the bundle → the trajectory's `extra`.
//!
//! What does not: berth sees the tools' calls, not the model behind them — no messages, no
//! reasoning, no token counts (`message` is empty, `llm_call_count` and `metrics` absent), and
//! the agent's name is the engine's, which berth is not told (`unknown`, with berth's version
//! in `extra`).

use serde_json::{Map, Value, json};

/// The ATIF version written.
pub const SCHEMA_VERSION: &str = "ATIF-v1.8";
/// Its file name in a bundle.
pub const FILE: &str = "trajectory.json";

/// The image media type of a screenshot file name (pure).
fn media_type(name: &str) -> &'static str {
    match name.rsplit('.').next() {
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("webp") => "image/webp",
        Some("gif") => "image/gif",
        _ => "image/png",
    }
}

/// What the observation says in text: the error, else `ok`; the pointer; the settle.
fn result_text(line: &Value) -> String {
    let mut parts = vec![match line["error"].as_str() {
        Some(e) => format!("error: {e}"),
        None => "ok".to_string(),
    }];
    if let Some([x, y]) = line["cursor"].as_array().map(Vec::as_slice) {
        parts.push(format!("pointer at ({x}, {y})"));
    }
    if let Some(ms) = line["settled_ms"].as_u64() {
        let late = line["settle_timed_out"].as_bool() == Some(true);
        parts.push(format!(
            "screen settled after {ms} ms{}",
            if late { " (timed out)" } else { "" }
        ));
    }
    parts.join("; ")
}

/// The fields of `line` named in `keys`, where present.
fn pick(line: &Value, keys: &[&str]) -> Map<String, Value> {
    keys.iter()
        .filter_map(|k| line.get(*k).map(|v| (k.to_string(), v.clone())))
        .collect()
}

/// One action line as an ATIF step numbered `step_id`.
pub fn step(step_id: usize, line: &Value) -> Value {
    let source = line["source"].as_str().unwrap_or("computer");
    let timestamp = line["at"].clone();
    let extra = pick(
        line,
        &[
            "seq",
            "at_ms",
            "duration_ms",
            "recording",
            "media_ms",
            "screenshot_media_ms",
            "screenshot_dropped",
            "dropped_before",
        ],
    );
    if source == "control" {
        return json!({
            "step_id": step_id,
            "timestamp": timestamp,
            "source": "user",
            "message": format!("a person at the controls: {}", line["action"]),
            "extra": extra,
        });
    }
    let call_id = format!("call-{}", line["seq"].as_u64().unwrap_or(step_id as u64));
    let arguments = match &line["action"] {
        Value::Object(o) => Value::Object(o.clone()),
        Value::Null => json!({}),
        other => json!({ "value": other }),
    };
    let mut content = vec![json!({"type": "text", "text": result_text(line)})];
    if let Some(name) = line["screenshot"].as_str()
        && line["screenshot_dropped"].as_bool() != Some(true)
    {
        content.push(json!({
            "type": "image",
            "source": {"media_type": media_type(name), "path": format!("screenshots/{name}")},
        }));
    }
    let result_extra = pick(line, &["error", "cursor", "settled_ms", "settle_timed_out"]);
    let mut result = json!({"source_call_id": call_id, "content": content});
    if !result_extra.is_empty() {
        result["extra"] = Value::Object(result_extra);
    }
    let call_extra = pick(line, &["source", "dialect", "batch"]);
    json!({
        "step_id": step_id,
        "timestamp": timestamp,
        "source": "agent",
        "message": "",
        "tool_calls": [{
            "tool_call_id": call_id,
            "function_name": if source == "input" { "input" } else { "computer" },
            "arguments": arguments,
            "extra": call_extra,
        }],
        "observation": {"results": [result]},
        "extra": extra,
    })
}

/// The trajectory of a bundle: its `episode.json` (`meta`) and action lines (pure).
/// `version` is berth's.
pub fn trajectory(meta: &Value, lines: &[Value], version: &str, artifact: Option<&str>) -> Value {
    let steps: Vec<Value> = lines
        .iter()
        .enumerate()
        .map(|(i, l)| step(i + 1, l))
        .collect();
    let mut extra = pick(
        meta,
        &[
            "sandbox",
            "profile",
            "image",
            "screen",
            "recording",
            "first_seq",
            "last_seq",
        ],
    );
    extra.insert("recorded_by".into(), json!(format!("berth {version}")));
    if let Some(a) = artifact {
        extra.insert("bundle_artifact".into(), json!(a));
    }
    json!({
        "schema_version": SCHEMA_VERSION,
        "session_id": meta["sandbox"],
        "agent": {"name": "unknown", "version": "unknown", "extra": {"tools_served_by": "berth"}},
        "steps": steps,
        "notes": "Recorded by berth from the tool calls it served: the engine's messages, \
                  reasoning and token counts are not seen by it. Screenshot paths are \
                  relative to the episode bundle, which holds this file beside screenshots/.",
        "final_metrics": {"total_steps": lines.len()},
        "extra": extra,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn click() -> Value {
        json!({
            "seq": 7, "at": "2026-12-07T10:00:00.250Z", "at_ms": 1, "source": "computer",
            "dialect": "anthropic", "action": {"action": "left_click", "coordinate": [10, 20]},
            "duration_ms": 40, "settled_ms": 120, "settle_timed_out": false, "cursor": [10, 20],
            "screenshot": "7.png", "recording": "rec-1", "media_ms": 1500,
            "screenshot_media_ms": 1660,
        })
    }

    #[test]
    fn an_action_is_an_agent_step_with_its_call_and_its_screenshot() {
        let s = step(1, &click());
        assert_eq!(s["source"], "agent");
        assert_eq!(s["timestamp"], "2026-12-07T10:00:00.250Z");
        let call = &s["tool_calls"][0];
        assert_eq!(call["tool_call_id"], "call-7");
        assert_eq!(call["function_name"], "computer");
        assert_eq!(call["arguments"]["action"], "left_click");
        assert_eq!(call["extra"]["dialect"], "anthropic");
        let r = &s["observation"]["results"][0];
        assert_eq!(r["source_call_id"], "call-7");
        assert_eq!(
            r["content"][0]["text"],
            "ok; pointer at (10, 20); screen settled after 120 ms"
        );
        assert_eq!(r["content"][1]["source"]["path"], "screenshots/7.png");
        assert_eq!(r["content"][1]["source"]["media_type"], "image/png");
        assert_eq!(s["extra"]["media_ms"], 1500);
        assert_eq!(s["extra"]["screenshot_media_ms"], 1660);
    }

    #[test]
    fn a_dropped_screenshot_an_error_and_a_person_map_too() {
        let mut l = click();
        l["screenshot_dropped"] = json!(true);
        l["error"] = json!("no display");
        let s = step(2, &l);
        let content = s["observation"]["results"][0]["content"]
            .as_array()
            .unwrap();
        assert_eq!(content.len(), 1, "{content:?}");
        assert!(
            content[0]["text"]
                .as_str()
                .unwrap()
                .starts_with("error: no display")
        );
        let person = step(
            3,
            &json!({"seq": 9, "source": "control", "action": {"took": true}}),
        );
        assert_eq!(person["source"], "user");
        assert!(person.get("tool_calls").is_none());
        let other = step(4, &json!({"seq": 10, "source": "input", "action": "x"}));
        assert_eq!(other["tool_calls"][0]["function_name"], "input");
        assert_eq!(other["tool_calls"][0]["arguments"], json!({"value": "x"}));
    }

    /// A small episode (a click, a person at the controls, a batch's two keys, a screenshot
    /// lost to the log's bound) as its trajectory: `tests/golden/atif-small-episode.json`,
    /// which `episode::docker_…` also validates with the `atif` package's models.
    /// `BERTH_BLESS=1` rewrites it.
    #[test]
    fn a_small_episode_is_its_golden_trajectory() {
        let meta = json!({
            "sandbox": "sb_0123", "profile": "desktop-ubuntu", "image": "berth-desktop:0f1e",
            "screen": "1280x800", "first_seq": 1, "last_seq": 5,
            "recording": {"id": "rec-1", "state": "stopped", "duration_ms": 4200, "fps": 15,
                          "width": 1280, "height": 800, "bytes": 81234,
                          "started_at": "2026-12-07T10:00:00.000Z", "in_bundle": true},
        });
        let lines = [
            click(),
            json!({"seq": 8, "at": "2026-12-07T10:00:01.000Z", "at_ms": 2, "source": "control",
                   "action": {"control": "taken", "by": "a person"}, "recording": "rec-1",
                   "media_ms": 2250}),
            json!({"seq": 9, "at": "2026-12-07T10:00:02.000Z", "at_ms": 3, "source": "computer",
                   "dialect": "openai", "action": {"type": "keypress", "keys": ["CTRL", "L"]},
                   "batch": {"index": 0, "size": 2}, "duration_ms": 12, "recording": "rec-1",
                   "media_ms": 3250}),
            json!({"seq": 10, "at": "2026-12-07T10:00:02.020Z", "at_ms": 4, "source": "computer",
                   "dialect": "openai", "action": {"type": "type", "text": "example.test\n"},
                   "batch": {"index": 1, "size": 2}, "duration_ms": 30, "settled_ms": 400,
                   "settle_timed_out": true, "cursor": [640, 400], "screenshot": "10.jpeg",
                   "screenshot_dropped": true, "recording": "rec-1", "media_ms": 3270,
                   "screenshot_media_ms": 3700}),
            json!({"seq": 11, "at": "2026-12-07T10:00:03.000Z", "at_ms": 5, "source": "mcp",
                   "dialect": "native", "action": {"action": "screenshot"}, "duration_ms": 20,
                   "error": "the display is gone", "recording": "rec-1", "media_ms": 4000}),
        ];
        let got = trajectory(&meta, &lines, "0.1.0", Some("art_0123"));
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/golden/atif-small-episode.json"
        );
        let text = serde_json::to_string_pretty(&got).unwrap() + "\n";
        if std::env::var("BERTH_BLESS").is_ok() {
            std::fs::write(path, &text).unwrap();
        }
        let want = std::fs::read_to_string(path).unwrap();
        assert_eq!(text, want, "the trajectory differs from {path}");
    }

    #[test]
    fn the_trajectory_numbers_its_steps_and_names_the_sandbox() {
        let meta = json!({"sandbox": "sb-1", "image": "i", "first_seq": 7});
        let t = trajectory(&meta, &[click(), click()], "0.1.0", Some("art-1"));
        assert_eq!(t["schema_version"], SCHEMA_VERSION);
        assert_eq!(t["session_id"], "sb-1");
        assert_eq!(t["steps"][1]["step_id"], 2);
        assert_eq!(t["final_metrics"]["total_steps"], 2);
        assert_eq!(t["extra"]["bundle_artifact"], "art-1");
        assert_eq!(t["extra"]["recorded_by"], "berth 0.1.0");
    }
}
