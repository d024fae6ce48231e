use serde::{Deserialize, Serialize};

/// `PUT /v1/display`: the screen's new size, set through RandR.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DisplaySize {
    pub width: u32,
    pub height: u32,
}

/// `GET /v1/display`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct DisplayInfo {
    pub display: Option<String>,
    pub width: u32,
    pub height: u32,
    pub depth: u8,
    pub user: String,
    pub home: String,
    /// X extensions the agent uses and whether the server has them.
    pub extensions: Vec<String>,
    pub listen: String,
}

/// A mouse button by name or number (`left`, `middle`, `right`, `back`, `forward`, 1–9).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(untagged)]
pub enum Button {
    Name(String),
    Number(u8),
}

impl Default for Button {
    fn default() -> Self {
        Button::Name("left".into())
    }
}

/// One step of `POST /v1/input`. Coordinates are screen pixels; 0 is a real coordinate.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum InputAction {
    Move {
        x: i32,
        y: i32,
    },
    /// Presses and releases `count` times (2 = double click), at x/y if given.
    Click {
        #[serde(default)]
        x: Option<i32>,
        #[serde(default)]
        y: Option<i32>,
        #[serde(default)]
        button: Button,
        #[serde(default)]
        count: Option<u32>,
        /// Keys held during the click (`shift`, `ctrl`…).
        #[serde(default)]
        modifiers: Vec<String>,
    },
    ButtonDown {
        #[serde(default)]
        button: Button,
    },
    ButtonUp {
        #[serde(default)]
        button: Button,
    },
    /// Presses at the first point, moves through the rest, releases at the last.
    Drag {
        path: Vec<[i32; 2]>,
        #[serde(default)]
        button: Button,
        #[serde(default)]
        modifiers: Vec<String>,
    },
    Scroll {
        #[serde(default)]
        x: Option<i32>,
        #[serde(default)]
        y: Option<i32>,
        /// `up`, `down`, `left` or `right`.
        direction: String,
        #[serde(default)]
        amount: Option<u32>,
        #[serde(default)]
        modifiers: Vec<String>,
    },
    /// A key or chord (`Return`, `ctrl+shift+t`), pressed and released.
    Key {
        keys: String,
        #[serde(default)]
        repeat: Option<u32>,
    },
    KeyDown {
        key: String,
    },
    KeyUp {
        key: String,
    },
    /// Holds a key or chord for `duration_ms`.
    Hold {
        keys: String,
        duration_ms: u64,
    },
    /// Types text exactly (any Unicode, whatever the layout; `\n` is Return, `\t` Tab).
    Type {
        text: String,
    },
    Wait {
        ms: u64,
    },
}

/// Settled screenshot wanted after the actions.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScreenshotAfter {
    #[serde(default)]
    pub format: Option<String>,
    #[serde(default)]
    pub quality: Option<u8>,
    #[serde(default)]
    pub scale: Option<f64>,
    #[serde(default)]
    pub settle_ms: Option<u64>,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InputRequest {
    pub actions: Vec<InputAction>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub screenshot_after: Option<ScreenshotAfter>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct InputResponse {
    pub cursor: [i32; 2],
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub screenshot_b64: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settle_timed_out: Option<bool>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct Clipboard {
    /// `null` when no application holds the clipboard.
    pub text: Option<String>,
}

/// `POST /v1/computer`: the computer-use tool input engines emit.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct ComputerRequest {
    pub action: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coordinate: Option<[i64; 2]>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_coordinate: Option<[i64; 2]>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scroll_direction: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scroll_amount: Option<u32>,
    /// Seconds, for `wait` and `hold_key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<f64>,
    /// `zoom`: `[x1, y1, x2, y2]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<[i64; 4]>,
    /// The size the engine believes the screen is: screenshots are scaled to it and its
    /// coordinates mapped back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_width_px: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_height_px: Option<u32>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct ComputerResponse {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base64_image: Option<String>,
    /// After an action: how long the screen took to settle before the screenshot (as
    /// `/v1/input` reports it), and whether it gave up waiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settle_timed_out: Option<bool>,
    /// A batch that stopped at an action that failed: which one and why (the actions before
    /// it ran; `error` says the same in one line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<ComputerFailure>,
}

/// The action a batch stopped at.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct ComputerFailure {
    /// Its index in `actions` (those before it ran).
    pub index: usize,
    /// Its name (`click`, `left_click`, …).
    pub action: String,
    pub error: String,
}

/// `POST /v1/computer`'s body, recognised by its key: `action` is Anthropic's computer-use
/// tool input, `type` OpenAI's computer-use action (a Responses API `computer_call.action`),
/// `actions` a batch of either.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(untagged)]
pub enum ComputerBody {
    Anthropic(ComputerRequest),
    OpenAi(OpenAiComputerRequest),
    Batch(ComputerBatch),
}

/// One OpenAI computer-use action, with the size the engine believes the screen is (as for
/// Anthropic's actions: screenshots are scaled to it and its coordinates mapped back).
/// (Parsed by the agent, which dispatches on the keys itself for clear errors.)
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
#[schemars(transform = display_size_in_each_variant)]
pub struct OpenAiComputerRequest {
    #[serde(flatten)]
    pub action: OpenAiAction,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_width_px: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_height_px: Option<u32>,
}

/// `{"actions": [...]}`: actions of either dialect run in order, all checked before the
/// first runs, answered once with the screen settled after the last.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ComputerBatch {
    /// 1-100 actions; their `wait`s and `hold_key`s add up to at most 60 s.
    pub actions: Vec<ComputerAction>,
    /// The engine's screen size, for every action of the batch (not given per action).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_width_px: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_height_px: Option<u32>,
}

/// One action of a batch: Anthropic's (`action`) or OpenAI's (`type`).
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(untagged)]
pub enum ComputerAction {
    Anthropic(ComputerRequest),
    OpenAi(OpenAiAction),
}

/// OpenAI's mouse buttons; `wheel` is the middle one.
#[derive(
    Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum OpenAiButton {
    #[default]
    Left,
    Right,
    Wheel,
    Back,
    Forward,
}

/// A point of an OpenAI `drag` path.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenAiPoint {
    pub x: i64,
    pub y: i64,
}

/// OpenAI's computer-use action (the Responses API's `computer_call.action`), by `type`.
/// Coordinates are the engine's pixels. Keys of the call itself (`call_id`,
/// `pending_safety_checks`) are not part of it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OpenAiAction {
    Click(OpenAiClick),
    DoubleClick(OpenAiAt),
    Drag(OpenAiDrag),
    Keypress(OpenAiKeypress),
    Move(OpenAiAt),
    Screenshot(OpenAiNothing),
    Scroll(OpenAiScroll),
    Type(OpenAiType),
    Wait(OpenAiWait),
}

impl OpenAiAction {
    /// The action's `type`.
    pub fn name(&self) -> &'static str {
        match self {
            OpenAiAction::Click(_) => "click",
            OpenAiAction::DoubleClick(_) => "double_click",
            OpenAiAction::Drag(_) => "drag",
            OpenAiAction::Keypress(_) => "keypress",
            OpenAiAction::Move(_) => "move",
            OpenAiAction::Screenshot(_) => "screenshot",
            OpenAiAction::Scroll(_) => "scroll",
            OpenAiAction::Type(_) => "type",
            OpenAiAction::Wait(_) => "wait",
        }
    }
}

/// `click`: `button` defaults to `left`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenAiClick {
    pub x: i64,
    pub y: i64,
    #[serde(default)]
    pub button: OpenAiButton,
}

/// `double_click` and `move`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenAiAt {
    pub x: i64,
    pub y: i64,
}

/// `drag`: presses at the first point, moves through the rest, releases at the last.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenAiDrag {
    /// At least two points.
    pub path: Vec<OpenAiPoint>,
}

/// `keypress`: the keys pressed together as one chord (`["CTRL", "SHIFT", "T"]`), released in
/// reverse; OpenAI's key names (`CTRL`, `ENTER`, `ARROWLEFT`, `PAGEDOWN`, single characters),
/// any case.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenAiKeypress {
    pub keys: Vec<String>,
}

/// `scroll`: moves the pointer to `x`, `y`, then scrolls `scroll_y` pixels down (negative:
/// up) and `scroll_x` right (negative: left), as wheel clicks of 120 pixels each (what one
/// click scrolls in the desktop's Chromium), rounded, at least one for any non-zero amount,
/// at most 100 a direction.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenAiScroll {
    pub x: i64,
    pub y: i64,
    #[serde(default)]
    pub scroll_x: i64,
    #[serde(default)]
    pub scroll_y: i64,
}

/// `type`: the text typed exactly.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenAiType {
    pub text: String,
}

/// `wait`: OpenAI sends no duration; berth waits 1 s, or `ms` (berth's own, 0-60000).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenAiWait {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ms: Option<u64>,
}

/// `screenshot`: no fields.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenAiNothing {}

/// The `type` of OpenAI's answer: always `computer_screenshot`.
#[derive(
    Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum OpenAiOutputType {
    #[default]
    ComputerScreenshot,
}

/// The answer to an OpenAI request (one OpenAI action, or a batch of only OpenAI actions):
/// OpenAI's `computer_call_output.output` (`type`, `image_url`), plus berth's own fields.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct OpenAiComputerResponse {
    #[serde(rename = "type")]
    pub kind: OpenAiOutputType,
    /// `data:image/png;base64,…`: the settled screen, in the engine's size. Absent when the
    /// request failed before a screenshot could be taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settle_timed_out: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<ComputerFailure>,
}

/// What `POST /v1/computer` answers: Anthropic's shape for Anthropic and mixed requests,
/// OpenAI's for OpenAI ones.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(untagged)]
pub enum ComputerAnswer {
    Anthropic(ComputerResponse),
    OpenAi(OpenAiComputerResponse),
}

/// The display size beside an OpenAI action, as JSON Schema: the two fields go into every
/// action variant, each closed again (`additionalProperties: false`, which flattening drops)
/// as the agent takes no other field.
fn display_size_in_each_variant(schema: &mut schemars::Schema) {
    let Some(obj) = schema.as_object_mut() else {
        return;
    };
    let Some(serde_json::Value::Object(size)) = obj.remove("properties") else {
        return;
    };
    if let Some(serde_json::Value::Array(variants)) = obj.get_mut("oneOf") {
        for v in variants {
            if let Some(serde_json::Value::Object(props)) = v.get_mut("properties") {
                props.extend(size.clone());
            }
            if let Some(v) = v.as_object_mut() {
                v.insert("additionalProperties".into(), false.into());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_openai_actions_schema_admits_the_display_size_beside_it() {
        let s = serde_json::to_value(schemars::schema_for!(OpenAiComputerRequest)).unwrap();
        let variants = s["oneOf"].as_array().unwrap();
        assert_eq!(variants.len(), 9);
        for v in variants {
            assert_eq!(v["additionalProperties"], false, "{v}");
            assert!(v["properties"]["display_width_px"].is_object(), "{v}");
            assert!(v["properties"]["display_height_px"].is_object(), "{v}");
        }
        assert!(s.get("properties").is_none(), "{s}");
    }
}
