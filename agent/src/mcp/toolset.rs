//! The computer and browser toolsets' members as MCP tools (`computer_left_click`,
//! `browser_navigate`, …): each runs one member as `/v1/toolsets/{family}` does and answers its
//! `tool_result` content (text blocks as text, the image as an image, the browser's
//! `browser_state` block as a line of JSON), `isError` when the member refused or failed.

use std::sync::Arc;

use berth_protocol::toolset::{BROWSER_FAMILY, COMPUTER_FAMILY, COMPUTER_MEMBERS};
use rmcp::handler::server::router::tool::ToolRoute;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock, JsonObject, Tool};
use serde_json::{Value, json};

use super::tools::BerthMcp;
use crate::display::computer::toolset;

/// The MCP tool name of a member.
pub fn tool_name(member: &str) -> String {
    format!("{COMPUTER_FAMILY}_{member}")
}

/// A member's description and input schema (the SDK's input types, coordinates in the
/// toolset's screenshot pixels: `GET /v1/toolsets/computer` gives their size).
fn member_tool(member: &str) -> Tool {
    let (description, properties, required) = keyboard_member(member)
        .or_else(|| screen_member(member))
        .unwrap_or_else(|| pointer_member(member));
    let required: &[&str] = if member == "zoom" {
        &["region"]
    } else {
        required
    };
    tool(
        tool_name(member),
        format!("Anthropic's computer toolset, member `{member}`: {description}"),
        properties,
        required,
    )
}

/// A member's description, input properties and required fields.
type MemberSpec = (&'static str, Value, &'static [&'static str]);

/// The MCP tool of a member: its name, description and an object schema of `properties`.
fn tool(name: String, description: String, properties: Value, required: &[&str]) -> Tool {
    let schema = json!({"type": "object", "properties": properties, "required": required});
    let schema: JsonObject = match schema {
        Value::Object(m) => m,
        _ => JsonObject::new(),
    };
    Tool::new(name, description, Arc::new(schema))
}

/// A point property of the computer toolset: `[x, y]` in screenshot pixels.
fn point(what: &str) -> Value {
    json!({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2,
           "description": format!("{what}: [x, y] in screenshot pixels")})
}

/// The computer toolset's keyboard members.
fn keyboard_member(member: &str) -> Option<MemberSpec> {
    Some(match member {
        "key" => (
            "Press a key or key combination (\"ctrl+s\", \"alt+Tab\", \"Return\").",
            json!({"text": {"type": "string"},
                   "repeat": {"type": "integer", "minimum": 1, "maximum": 100}}),
            &["text"],
        ),
        "hold_key" => (
            "Hold a key or key combination for `duration` seconds.",
            json!({"text": {"type": "string"},
                   "duration": {"type": "integer", "minimum": 0, "maximum": 60}}),
            &["text", "duration"],
        ),
        "type" => (
            "Type a string of text on the keyboard.",
            json!({"text": {"type": "string"}}),
            &["text"],
        ),
        _ => return None,
    })
}

/// The computer toolset's members that wait or look at the screen.
fn screen_member(member: &str) -> Option<MemberSpec> {
    Some(match member {
        "wait" => (
            "Wait `duration` seconds.",
            json!({"duration": {"type": "integer", "minimum": 0, "maximum": 60}}),
            &["duration"],
        ),
        "screenshot" => (
            "The screen, fitted to the model's image limits (PNG).",
            json!({}),
            &[],
        ),
        "zoom" => (
            "A region of the screen captured at display resolution and scaled up to fill the \
             image budget.",
            json!({"region": {"type": "array", "items": {"type": "integer"}, "minItems": 4,
                   "maxItems": 4, "description": "[x0, y0, x1, y1] in screenshot pixels"}}),
            &[],
        ),
        _ => return None,
    })
}

/// The computer toolset's pointer members; any other name is a click.
fn pointer_member(member: &str) -> MemberSpec {
    let held = json!({"type": "string",
        "description": "Keys held during the action (\"shift\", \"ctrl+shift\")"});
    match member {
        "cursor_position" => (
            "The cursor's position in screenshot pixels (X=..,Y=..).",
            json!({}),
            &[],
        ),
        "mouse_move" => (
            "Move the cursor to a point.",
            json!({"coordinate": point("Where")}),
            &["coordinate"],
        ),
        "left_mouse_down" => (
            "Press and hold the left button where the cursor is.",
            json!({}),
            &[],
        ),
        "left_mouse_up" => ("Release the left button.", json!({}), &[]),
        "left_click_drag" => (
            "Drag with the left button from `start_coordinate` to `coordinate`.",
            json!({"start_coordinate": point("From"), "coordinate": point("To"), "text": held}),
            &["start_coordinate", "coordinate"],
        ),
        "scroll" => (
            "Scroll `scroll_amount` wheel clicks at a point (or where the cursor is).",
            json!({"scroll_direction": {"type": "string", "enum": ["up", "down", "left", "right"]},
                   "scroll_amount": {"type": "integer", "minimum": 1, "maximum": 100},
                   "coordinate": point("Where"), "text": held}),
            &["scroll_direction", "scroll_amount"],
        ),
        // The clicks.
        _ => (
            "Click at a point (or where the cursor is).",
            json!({"coordinate": point("Where"), "text": held}),
            &[],
        ),
    }
}

/// One route per member.
pub fn routes() -> Vec<ToolRoute<BerthMcp>> {
    COMPUTER_MEMBERS
        .iter()
        .map(|(member, _)| {
            let member = *member;
            ToolRoute::new_dyn(
                member_tool(member),
                move |ctx: ToolCallContext<'_, BerthMcp>| {
                    let agent = ctx.service.agent().clone();
                    let input = Value::Object(ctx.arguments.clone().unwrap_or_default());
                    Box::pin(async move {
                        if let Some(r) = super::tools::refused(&agent) {
                            return Ok(CallToolResponse::Complete(r));
                        }
                        let called = std::time::Instant::now();
                        let call = json!({"type": "tool_use", "id": "mcp", "name": member,
                                      "toolset_name": COMPUTER_FAMILY, "input": input});
                        let answer = match toolset::run_turn(&agent.display, &[call]).await {
                            Ok(a) => a,
                            Err(e) => {
                                return Ok(CallToolResponse::Complete(CallToolResult::error(
                                    vec![ContentBlock::text(e.to_string())],
                                )));
                            }
                        };
                        agent
                            .log_toolset_turn(crate::episode::Source::Mcp, &answer, called)
                            .await;
                        let result = answer.content.into_iter().next().unwrap_or_default();
                        Ok(CallToolResponse::Complete(to_mcp(&result)))
                    })
                },
            )
        })
        .collect()
}

/// A browser member's description and input schema (coordinates in the toolset's screenshot
/// pixels: `GET /v1/toolsets/browser` gives their size; `ref` from `read_page` or `find`).
fn browser_tool(member: &str) -> Tool {
    let (description, properties, required) = browser_pointer_member(member)
        .or_else(|| browser_input_member(member))
        .or_else(|| browser_reading_member(member))
        .or_else(|| browser_tab_member(member))
        .unwrap_or(("", json!({}), &[]));
    tool(
        format!("{BROWSER_FAMILY}_{member}"),
        format!("Anthropic's browser toolset, member `{member}`: {description}"),
        properties,
        required,
    )
}

/// The `tab_id` property every browser member but the tab ones takes.
fn tab_field() -> Value {
    json!({"type": "string", "description": "The tab to act in (default: the active tab)"})
}

/// A point target in screenshot pixels.
fn coordinate_field() -> Value {
    json!({"type": "object", "description": "A point in screenshot pixels",
        "properties": {"type": {"const": "coordinate"}, "x": {"type": "integer"},
                       "y": {"type": "integer"}},
        "required": ["type", "x", "y"]})
}

/// An element target by its reference (`ref_<n>`).
fn reference_field() -> Value {
    json!({"type": "object", "description": "An element by its reference (ref_<n>)",
        "properties": {"type": {"const": "ref"}, "ref": {"type": "string"}},
        "required": ["type", "ref"]})
}

/// A duration in seconds, at most a minute.
fn seconds_field() -> Value {
    json!({"type": "number", "minimum": 0, "maximum": 60})
}

/// The browser toolset's pointer members: clicks, hover, drags, presses and scrolls.
fn browser_pointer_member(member: &str) -> Option<MemberSpec> {
    let tab = tab_field();
    let coordinate = coordinate_field();
    let reference = reference_field();
    let either = json!({"oneOf": [coordinate.clone(), reference.clone()]});
    let modifiers =
        json!({"type": "string", "description": "Keys held (\"shift\", \"ctrl+shift\")"});
    Some(match member {
        "left_click" | "right_click" | "middle_click" | "double_click" | "triple_click" => (
            "Click a point or an element.",
            json!({"target": either, "modifiers": modifiers, "tab_id": tab}),
            &["target"],
        ),
        "hover" => (
            "Move the pointer over a point or an element.",
            json!({"target": either, "tab_id": tab}),
            &["target"],
        ),
        "left_click_drag" => (
            "Drag with the left button from `from` to `target`.",
            json!({"from": coordinate, "target": coordinate, "tab_id": tab}),
            &["from", "target"],
        ),
        "left_mouse_down" | "left_mouse_up" | "mouse_move" => (
            "Press, release or move the pointer at a point.",
            json!({"target": coordinate, "tab_id": tab}),
            &["target"],
        ),
        "scroll" => (
            "Scroll at a point (`scroll_amount` wheel ticks, 3 by default).",
            json!({"scroll_direction": {"type": "string", "enum": ["up", "down", "left", "right"]},
                   "scroll_amount": {"type": "integer", "minimum": 1, "maximum": 100},
                   "target": coordinate, "tab_id": tab}),
            &["scroll_direction", "target"],
        ),
        "scroll_to" => (
            "Scroll an element into view.",
            json!({"target": reference, "tab_id": tab}),
            &["target"],
        ),
        _ => return None,
    })
}

/// The browser toolset's keyboard and form members.
fn browser_input_member(member: &str) -> Option<MemberSpec> {
    let tab = tab_field();
    let reference = reference_field();
    Some(match member {
        "type" => (
            "Type text where the focus is.",
            json!({"text": {"type": "string"}, "tab_id": tab}),
            &["text"],
        ),
        "key" => (
            "Press keys (\"ctrl+a\", \"Return\"; space-separated for a sequence).",
            json!({"text": {"type": "string"},
                   "repeat": {"type": "integer", "minimum": 1, "maximum": 100}, "tab_id": tab}),
            &["text"],
        ),
        "hold_key" => (
            "Hold keys for `duration` seconds.",
            json!({"text": {"type": "string"}, "duration": seconds_field(), "tab_id": tab}),
            &["text", "duration"],
        ),
        "form_input" => (
            "Set a form element's value (a boolean for a checkbox, an option's value or text \
             for a select).",
            json!({"target": reference, "value": {"type": ["string", "number", "boolean"]},
                   "tab_id": tab}),
            &["target", "value"],
        ),
        "file_upload" => (
            "Set a file input's files (absolute paths in the sandbox).",
            json!({"target": reference, "paths": {"type": "array", "items": {"type": "string"}},
                   "tab_id": tab}),
            &["target", "paths"],
        ),
        _ => return None,
    })
}

/// The browser toolset's members that read the page: its tree, text, logs, a script's value.
fn browser_reading_member(member: &str) -> Option<MemberSpec> {
    let tab = tab_field();
    Some(match member {
        "read_page" => (
            "The page's accessibility tree, one element a line with its reference.",
            json!({"depth": {"type": "integer", "minimum": 1},
                   "filter": {"type": "string", "enum": ["interactive", "all"]},
                   "ref": {"type": "string"}, "tab_id": tab}),
            &[],
        ),
        "find" => (
            "Elements matching a description, with their references.",
            json!({"query": {"type": "string"}, "tab_id": tab}),
            &["query"],
        ),
        "get_page_text" => ("The page's visible text.", json!({"tab_id": tab}), &[]),
        "read_console" => (
            "Console entries since the last read.",
            json!({"tab_id": tab}),
            &[],
        ),
        "read_network" => ("Requests since the last read.", json!({"tab_id": tab}), &[]),
        "javascript_exec" => (
            "Run JavaScript in the page; the last expression's value.",
            json!({"text": {"type": "string"}, "tab_id": tab}),
            &["text"],
        ),
        _ => return None,
    })
}

/// The browser toolset's navigation, capture, wait and tab members.
fn browser_tab_member(member: &str) -> Option<MemberSpec> {
    let tab = tab_field();
    Some(match member {
        "navigate" => (
            "Go to a URL (https:// when no scheme is given), or `back`, `forward`, `reload`.",
            json!({"url": {"type": "string"}, "tab_id": tab}),
            &["url"],
        ),
        "screenshot" => ("The tab's viewport (PNG).", json!({"tab_id": tab}), &[]),
        "zoom" => (
            "A region of the viewport, scaled up.",
            json!({"region": {"type": "array", "items": {"type": "integer"}, "minItems": 4,
                   "maxItems": 4, "description": "[x0, y0, x1, y1] in screenshot pixels"},
                   "tab_id": tab}),
            &["region"],
        ),
        "wait" => (
            "Wait `duration` seconds.",
            json!({"duration": seconds_field(), "tab_id": tab}),
            &["duration"],
        ),
        "new_tab" => ("Open a blank tab and make it active.", json!({}), &[]),
        "list_tabs" => ("The open tabs.", json!({}), &[]),
        "switch_tab" | "close_tab" => (
            "Make a tab active, or close it.",
            json!({"tab_id": {"type": "string"}}),
            &["tab_id"],
        ),
        _ => return None,
    })
}

/// One route per browser member served.
pub fn browser_routes(members: &[String]) -> Vec<ToolRoute<BerthMcp>> {
    members
        .iter()
        .map(|member| {
            let member = member.clone();
            ToolRoute::new_dyn(
                browser_tool(&member),
                move |ctx: ToolCallContext<'_, BerthMcp>| {
                    let agent = ctx.service.agent().clone();
                    let input = Value::Object(ctx.arguments.clone().unwrap_or_default());
                    let member = member.clone();
                    Box::pin(async move {
                        if let Some(r) = super::tools::refused(&agent) {
                            return Ok(CallToolResponse::Complete(r));
                        }
                        let Some(desktop) = agent.desktop.clone() else {
                            return Ok(CallToolResponse::Complete(CallToolResult::error(vec![
                                ContentBlock::text("The browser is not running."),
                            ])));
                        };
                        let call = json!({"type": "tool_use", "id": "mcp", "name": member,
                                          "toolset_name": BROWSER_FAMILY, "input": input});
                        let answer = agent.browser_toolset.run_turn(&desktop, &[call]).await;
                        let result = answer.content.into_iter().next().unwrap_or_default();
                        Ok(CallToolResponse::Complete(to_mcp(&result)))
                    })
                },
            )
        })
        .collect()
}

/// `request_human_control`: listed only in sessions opened while the sandbox enables it.
pub fn request_route() -> ToolRoute<BerthMcp> {
    let t = tool(
        "request_human_control".into(),
        "Ask for a person to take the controls of the desktop: a password, a 2FA code, a \
         CAPTCHA, a payment, anything the agent must not or cannot do. The session view shows \
         the reason with a Take control button; this call waits (up to 600 s) and answers \
         `returned: …` once a person took the controls and handed them back (take a \
         screenshot then: the screen changed), `declined: …` or `timed_out: …`."
            .into(),
        json!({"reason": {"type": "string", "description": "What the person is needed for (1-500 characters)."}}),
        &["reason"],
    );
    ToolRoute::new_dyn(t, move |ctx: ToolCallContext<'_, BerthMcp>| {
        let agent = ctx.service.agent().clone();
        let reason = ctx
            .arguments
            .as_ref()
            .and_then(|a| a.get("reason"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        Box::pin(async move {
            let req = berth_protocol::control::HumanRequest {
                reason,
                timeout_seconds: None,
            };
            let result = match crate::api::control::ask(&agent, &req).await {
                Ok(a) => CallToolResult::success(vec![ContentBlock::text(a.message)]),
                Err(e) => CallToolResult::error(vec![ContentBlock::text(format!(
                    "{}: {}",
                    e.code, e.message
                ))]),
            };
            Ok(CallToolResponse::Complete(result))
        })
    })
}

/// `login`: listed only in sessions opened while the run enables login sites. The controller
/// answers its calls (it holds the sites' values) when the agent is reached through the
/// sandbox's MCP URL; reached directly, the agent says so.
pub fn login_route(sites: &[String]) -> ToolRoute<BerthMcp> {
    let t = tool(
        berth_protocol::login::TOOL.into(),
        berth_protocol::login::tool_description(sites),
        json!({"site": {"type": "string", "enum": sites,
                        "description": "The site's name."}}),
        &["site"],
    );
    ToolRoute::new_dyn(t, |_ctx: ToolCallContext<'_, BerthMcp>| {
        Box::pin(async move {
            Ok(CallToolResponse::Complete(CallToolResult::error(vec![
                ContentBlock::text(
                    "login runs through the controller: call it through the sandbox's MCP URL \
                     on the controller (…/sandbox/sandboxes/v1/{id}/mcp)",
                ),
            ])))
        })
    })
}

/// A `tool_result` as an MCP answer.
pub fn to_mcp(result: &Value) -> CallToolResult {
    let blocks: Vec<ContentBlock> = match &result["content"] {
        Value::String(s) => vec![ContentBlock::text(s.clone())],
        Value::Array(items) => items
            .iter()
            .filter_map(|b| match b["type"].as_str() {
                Some("text") => Some(ContentBlock::text(b["text"].as_str().unwrap_or_default())),
                Some("image") => Some(ContentBlock::image(
                    b["source"]["data"].as_str().unwrap_or_default(),
                    b["source"]["media_type"].as_str().unwrap_or("image/png"),
                )),
                Some("browser_state") => Some(ContentBlock::text(b.to_string())),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    if result["is_error"] == json!(true) {
        CallToolResult::error(blocks)
    } else {
        CallToolResult::success(blocks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_member_is_a_tool_with_an_object_schema() {
        let names: Vec<String> = routes().iter().map(|r| r.name().to_string()).collect();
        assert_eq!(names.len(), 17);
        assert!(names.contains(&"computer_left_click".to_string()));
        let zoom = member_tool("zoom");
        assert_eq!(zoom.input_schema["required"], json!(["region"]));
        let browser: Vec<String> = browser_routes(&["navigate".into(), "find".into()])
            .iter()
            .map(|r| r.name().to_string())
            .collect();
        assert_eq!(browser, ["browser_navigate", "browser_find"]);
        for (m, _, _) in berth_protocol::toolset::BROWSER_MEMBERS {
            let t = browser_tool(m);
            assert!(
                !t.description.as_deref().unwrap_or_default().ends_with(": "),
                "{m}"
            );
        }
        let err = to_mcp(&json!({"content": "Not executed", "is_error": true}));
        assert_eq!(err.is_error, Some(true));
    }
}
