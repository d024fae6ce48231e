//! The computer toolset's members as MCP tools (`computer_left_click`, …): each runs one
//! member as `/v1/toolsets/computer` does and answers its `tool_result` content (text blocks
//! as text, the image as an image), `isError` when the member refused or failed.

use std::sync::Arc;

use berth_protocol::toolset::{COMPUTER_FAMILY, COMPUTER_MEMBERS};
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
    let point = |what: &str| {
        json!({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2,
               "description": format!("{what}: [x, y] in screenshot pixels")})
    };
    let held = json!({"type": "string",
        "description": "Keys held during the action (\"shift\", \"ctrl+shift\")"});
    let (description, properties, required): (&str, Value, &[&str]) = match member {
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
        // The clicks.
        _ => (
            "Click at a point (or where the cursor is).",
            json!({"coordinate": point("Where"), "text": held}),
            &[],
        ),
    };
    let required: &[&str] = if member == "zoom" {
        &["region"]
    } else {
        required
    };
    let schema = json!({"type": "object", "properties": properties, "required": required});
    let schema: JsonObject = match schema {
        Value::Object(m) => m,
        _ => JsonObject::new(),
    };
    Tool::new(
        tool_name(member),
        format!("Anthropic's computer toolset, member `{member}`: {description}"),
        Arc::new(schema),
    )
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
                        if !answer.ran.is_empty() {
                            crate::api::episode::log_computer(
                                &agent,
                                crate::episode::Source::Mcp,
                                &json!({"actions": answer.ran}),
                                &answer.trace,
                                answer.error.clone(),
                                called,
                            )
                            .await;
                        }
                        let result = answer.content.into_iter().next().unwrap_or_default();
                        Ok(CallToolResponse::Complete(to_mcp(&result)))
                    })
                },
            )
        })
        .collect()
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
        let err = to_mcp(&json!({"content": "Not executed", "is_error": true}));
        assert_eq!(err.is_error, Some(true));
    }
}
