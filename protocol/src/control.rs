//! A person taking the controls: the control lease the controller holds for a person, the
//! state it pushes to the agent, the agent's request for a person (`request_human_control`),
//! and the pure rules both programs share (lease lengths, what a control token opens).
//!
//! While a person holds control the agent refuses its own input and observation routes with
//! `409 human_in_control` to every caller but the holder (refused, not queued); on hand-back
//! the next toolset answer says the screen changed and carries a fresh screenshot.

use serde::{Deserialize, Serialize};

/// The error code of a route refused while a person holds the controls.
pub const HUMAN_IN_CONTROL: &str = "human_in_control";
/// The error code of a take refused because another person holds the controls.
pub const CONTROL_HELD: &str = "control_held";
/// The error code of a hand-back from someone who does not hold the controls.
pub const NOT_HOLDER: &str = "not_holder";
/// The error code of a request for a person in a sandbox that does not enable it.
pub const REQUESTS_DISABLED: &str = "requests_disabled";
/// The error code of a request for a person while one is already waiting.
pub const REQUEST_PENDING: &str = "request_pending";
/// A push of the controls without the controller's key (403), or a second, different key (409).
pub const NOT_THE_CONTROLLER: &str = "not_the_controller";
pub const CONTROL_KEY_SET: &str = "control_key_set";

/// A control lease's length when the taker names none (seconds).
pub const DEFAULT_TTL_SECONDS: u64 = 120;
/// The shortest and longest control lease (seconds).
pub const MIN_TTL_SECONDS: u64 = 10;
pub const MAX_TTL_SECONDS: u64 = 3600;
/// How long `request_human_control` waits by default and at most (seconds).
pub const DEFAULT_REQUEST_WAIT_SECONDS: u64 = 600;
pub const MAX_REQUEST_WAIT_SECONDS: u64 = 900;
/// The longest reason a request for a person carries (characters).
pub const MAX_REASON_CHARS: usize = 500;
/// The most clipboard text the holder pastes in or copies out (bytes).
pub const MAX_CLIPBOARD_BYTES: usize = 1 << 20;
/// The text a toolset answer starts with after a hand-back.
pub const SCREEN_CHANGED: &str = "The screen changed: a person had the controls";

/// `POST …/{id}/control`: take the controls, or renew them (the holder).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TakeControl {
    /// How long the lease lasts before it hands back by itself (10–3600 s; default 120).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
}

/// The lease length `ttl_seconds` asks for, or why it cannot be had.
pub fn lease_seconds(ttl_seconds: Option<u64>) -> Result<u64, String> {
    let ttl = ttl_seconds.unwrap_or(DEFAULT_TTL_SECONDS);
    if !(MIN_TTL_SECONDS..=MAX_TTL_SECONDS).contains(&ttl) {
        return Err(format!(
            "ttl_seconds must be {MIN_TTL_SECONDS}-{MAX_TTL_SECONDS}, not {ttl}"
        ));
    }
    Ok(ttl)
}

/// Who holds the controls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Holder {
    /// A person in the session view (its cookie).
    Session,
    /// A person using the API key (with the control token the take answered).
    ApiKey,
}

impl Holder {
    pub fn as_str(self) -> &'static str {
        match self {
            Holder::Session => "session",
            Holder::ApiKey => "api_key",
        }
    }

    pub fn parse(s: &str) -> Option<Holder> {
        match s {
            "session" => Some(Holder::Session),
            "api_key" => Some(Holder::ApiKey),
            _ => None,
        }
    }
}

/// A pending request for a person.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct PendingRequest {
    pub id: String,
    pub reason: String,
    /// RFC 3339.
    pub since: String,
}

/// The controls of a sandbox, as the controller answers them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct ControlView {
    pub held: bool,
    /// The caller holds them.
    pub you: bool,
    pub holder: Option<Holder>,
    /// RFC 3339.
    pub taken_at: Option<String>,
    /// RFC 3339: when the lease hands back by itself unless renewed.
    pub expires_at: Option<String>,
    /// The lease length a take without `ttl_seconds` gets.
    pub ttl_seconds: u64,
    /// The agent may ask for a person (`request_human_control`).
    pub requests_enabled: bool,
    pub request: Option<PendingRequest>,
    /// The control token: answered once, to an API-key taker. Send it as `x-berth-control`
    /// with input while holding, to renew, and to hand back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// `PUT /v1/control` (the controller's push): a person holds the controls.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ControlGrant {
    /// SHA-256 (hex) of the holder's control token: requests carrying the token pass.
    pub holder_sha256: String,
    /// How long from now the agent keeps refusing if it hears nothing more (ms).
    pub ttl_ms: u64,
}

/// `PUT /v1/control/key`: the controller claims the controls' pushes for itself, once, before
/// the sandbox is handed out. From then on `PUT`/`DELETE /v1/control`, `…/settings` and
/// `…/decline` need the key in `x-berth-control-key`: the agent token alone (which an engine
/// may hold) no longer moves the controls. The agent keeps only the key's SHA-256.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ControlKey {
    /// SHA-256 (hex) of the key.
    pub key_sha256: String,
}

/// Whether `s` is a SHA-256 in hex (pure).
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `PUT /v1/control/settings`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ControlSettings {
    pub requests_enabled: bool,
    /// The `[[login]]` sites the run enables: the agent's MCP server lists the `login` tool
    /// (served through the controller) only when there are some.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub logins: Vec<String>,
}

/// `GET /v1/control`: the agent's side.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct AgentControl {
    pub held: bool,
    pub expires_in_ms: Option<u64>,
    pub requests_enabled: bool,
    pub request: Option<PendingRequest>,
    /// The login sites the run enables (names only).
    #[serde(default)]
    pub logins: Vec<String>,
}

/// `POST /v1/control/request`: the agent asks for a person.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HumanRequest {
    /// What the person is needed for (a password, a 2FA code, a CAPTCHA, a payment).
    pub reason: String,
    /// How long to wait for a person (1–900 s; default 600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
}

impl HumanRequest {
    /// The reason, trimmed, and the wait, or why the request cannot be made.
    pub fn checked(&self) -> Result<(String, u64), String> {
        let reason = self.reason.trim();
        if reason.is_empty() || reason.chars().count() > MAX_REASON_CHARS {
            return Err(format!(
                "reason must be 1-{MAX_REASON_CHARS} characters saying what a person is needed for"
            ));
        }
        let wait = self.timeout_seconds.unwrap_or(DEFAULT_REQUEST_WAIT_SECONDS);
        if !(1..=MAX_REQUEST_WAIT_SECONDS).contains(&wait) {
            return Err(format!(
                "timeout_seconds must be 1-{MAX_REQUEST_WAIT_SECONDS}, not {wait}"
            ));
        }
        Ok((reason.to_string(), wait))
    }
}

/// How a request for a person ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// A person took the controls and handed them back.
    Returned,
    /// A person declined.
    Declined,
    /// Nobody came within the wait.
    TimedOut,
}

/// `POST /v1/control/request`'s answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct HumanRequestAnswer {
    pub id: String,
    pub outcome: Outcome,
    /// A sentence for the model, starting with the outcome.
    pub message: String,
}

impl HumanRequestAnswer {
    pub fn new(id: String, outcome: Outcome, waited_s: u64) -> HumanRequestAnswer {
        let message = match outcome {
            Outcome::Returned => format!(
                "returned: a person took the controls and handed them back after {waited_s} s; \
                 the screen may have changed, take a screenshot before acting"
            ),
            Outcome::Declined => {
                "declined: a person declined to take the controls; carry on without them or \
                 stop"
                    .to_string()
            }
            Outcome::TimedOut => format!(
                "timed_out: no person took the controls within {waited_s} s; carry on without \
                 them or stop"
            ),
        };
        HumanRequestAnswer {
            id,
            outcome,
            message,
        }
    }
}

/// The text of a refusal while a person holds the controls.
pub fn refusal(expires_in_ms: u64) -> String {
    format!(
        "a person has the controls of this desktop (for up to {} s more); the agent's actions and \
         observations are refused, not queued: wait and try again after they hand back",
        expires_in_ms.div_ceil(1000)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_lengths_are_bounded() {
        assert_eq!(lease_seconds(None), Ok(DEFAULT_TTL_SECONDS));
        assert_eq!(lease_seconds(Some(10)), Ok(10));
        assert!(lease_seconds(Some(9)).unwrap_err().contains("10-3600"));
        assert!(lease_seconds(Some(3601)).is_err());
    }

    #[test]
    fn requests_name_what_is_wrong() {
        let r = |reason: &str, t| HumanRequest {
            reason: reason.into(),
            timeout_seconds: t,
        };
        assert_eq!(r(" 2FA ", None).checked(), Ok(("2FA".into(), 600)));
        assert!(r("  ", None).checked().unwrap_err().contains("reason"));
        assert!(r(&"x".repeat(501), None).checked().is_err());
        assert!(r("x", Some(0)).checked().unwrap_err().contains("1-900"));
        assert!(r("x", Some(901)).checked().is_err());
    }

    #[test]
    fn answers_start_with_their_outcome() {
        for (o, w) in [
            (Outcome::Returned, "returned:"),
            (Outcome::Declined, "declined:"),
            (Outcome::TimedOut, "timed_out:"),
        ] {
            assert!(
                HumanRequestAnswer::new("r".into(), o, 3)
                    .message
                    .starts_with(w)
            );
        }
        assert!(refusal(1500).contains("2 s"));
    }
}
