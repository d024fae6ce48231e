//! The workstation: `GET /v1/ready`, `GET /v1/browser` (and `POST /v1/browser/restart`, which
//! answers the same once the new browser is up), `GET /v1/a11y`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `GET /v1/ready[?wait=30s]`: 200 when `ready`, 503 otherwise, the same body either way.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default, schemars::JsonSchema)]
pub struct ReadyReport {
    pub ready: bool,
    /// The desktop's components and the end-to-end checks, by name.
    pub components: BTreeMap<String, ComponentStatus>,
}

/// One component's or check's condition.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct ComponentStatus {
    pub ok: bool,
    /// `starting`, `up`, `down`, `gave_up`, `stopped`.
    pub state: String,
    pub reason: String,
    /// RFC 3339: when `ok`, `state` or `reason` last changed.
    pub since: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    pub restarts: u32,
}

/// `GET /v1/browser`, `POST /v1/browser/restart`. Fields are alphabetical: the order the agent
/// has always sent them in.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct BrowserInfo {
    /// The TCP relay's bound address (`--cdp-listen`), when it has one.
    pub cdp_listen: Option<String>,
    pub pid: Option<u32>,
    pub protocol_version: Option<String>,
    pub targets: Vec<BrowserTarget>,
    pub user_agent: Option<String>,
    /// `Chrome/…`.
    pub version: Option<String>,
    /// The browser target through this surface's WebSocket relay.
    pub ws_url: String,
}

/// One CDP target, reached through the WebSocket relay at `ws_url`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct BrowserTarget {
    pub id: Option<String>,
    pub title: Option<String>,
    /// `page`, `browser`, `service_worker`, …
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub url: Option<String>,
    pub ws_url: String,
}

/// `GET /v1/a11y`: every application on the AT-SPI bus with its tree.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default, schemars::JsonSchema)]
pub struct A11yTree {
    pub applications: Vec<A11yNode>,
}

/// One accessible object.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default, schemars::JsonSchema)]
pub struct A11yNode {
    /// The role name with spaces as dashes (`push-button`), `unknown` when empty.
    pub role: String,
    pub name: String,
    /// pyatspi's `STATE_*` names, lowercased (`enabled`, `showing`, …).
    pub states: Vec<String>,
    pub attributes: BTreeMap<String, String>,
    /// Screen position and size, for nodes that are visible and showing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub screencoord: Option<(i32, i32)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<(i32, i32)>,
    pub image: bool,
    pub selection: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<A11yValue>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub actions: Vec<A11yAction>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<A11yNode>,
}

impl A11yNode {
    pub fn has_state(&self, s: &str) -> bool {
        self.states.iter().any(|x| x == s)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default, schemars::JsonSchema)]
pub struct A11yAction {
    pub name: String,
    pub description: String,
    pub keybinding: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default, schemars::JsonSchema)]
pub struct A11yValue {
    pub current: f64,
    pub min: f64,
    pub max: f64,
    pub step: f64,
}
