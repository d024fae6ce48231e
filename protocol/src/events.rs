use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// One observed action on the agent's sequence-numbered timeline.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct Event {
    pub seq: u64,
    /// RFC 3339 wall-clock time with milliseconds.
    pub at: String,
    /// One of the kinds in `API.md` (`command.started`, `pty.closed`, `file.uploaded`, …).
    pub kind: EventKind,
    /// Kind-specific fields, flattened into the event object.
    #[serde(flatten)]
    pub data: Map<String, Value>,
}

/// `GET /v1/events` answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct EventsPage {
    pub events: Vec<Event>,
    pub next_seq: u64,
    /// Present when events older than this sequence number are no longer kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated_before_seq: Option<u64>,
}

/// A message on a followed stream that is not a record: the follower fell too far behind.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct Lagged {
    pub lagged: bool,
    pub resume_from_seq: u64,
}

macro_rules! event_kinds {
    ($($(#[$m:meta])* $v:ident => $s:literal,)+) => {
        /// What an event on a timeline records: the agent's kinds and the controller's, each
        /// written as its wire string; a kind this build does not know is kept as [`Other`]
        /// (a newer agent or controller may add kinds).
        ///
        /// [`Other`]: EventKind::Other
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub enum EventKind {
            $($(#[$m])* $v,)+
            /// A kind this build does not know, as written.
            Other(String),
        }

        impl EventKind {
            /// Every kind this build knows.
            pub const KNOWN: &'static [EventKind] = &[$(EventKind::$v),+];

            /// The wire string.
            pub fn as_str(&self) -> &str {
                match self {
                    $(EventKind::$v => $s,)+
                    EventKind::Other(s) => s,
                }
            }

            /// The kind a wire string names (`Other` when this build does not know it).
            pub fn parse(s: &str) -> EventKind {
                match s {
                    $($s => EventKind::$v,)+
                    other => EventKind::Other(other.to_string()),
                }
            }
        }
    };
}

event_kinds! {
    /// The agent started a command.
    CommandStarted => "command.started",
    /// A command ended (`exit_code`, or the signal).
    CommandExited => "command.exited",
    PtyOpened => "pty.opened",
    PtyClosed => "pty.closed",
    FileUploaded => "file.uploaded",
    RecordingStarted => "recording.started",
    RecordingStopped => "recording.stopped",
    ComponentUp => "component.up",
    ComponentDown => "component.down",
    ComponentRestarted => "component.restarted",
    ComponentGaveUp => "component.gave_up",
    BrowserRestarted => "browser.restarted",
    /// The desktop took over a browser the user started on its profile (after `pkill chrome`).
    BrowserAdopted => "browser.adopted",
    /// The controller recorded a new sandbox.
    SandboxCreated => "sandbox.created",
    /// Its agent answered the readiness probe.
    SandboxReady => "sandbox.ready",
    /// A warm pool member was handed out.
    SandboxClaimed => "sandbox.claimed",
    /// A restarted controller found it running.
    SandboxAdopted => "sandbox.adopted",
    /// The desktop's screen was set (`screen`).
    SandboxScreen => "sandbox.screen",
    SandboxExpired => "sandbox.expired",
    /// It failed (`reason`).
    SandboxFailed => "sandbox.failed",
    SandboxDeleted => "sandbox.deleted",
    /// Its processes and threads reached its `pids` limit: a fork or a thread failed
    /// (`limit`, `current`, `hits`: how many times so far). It keeps running.
    SandboxPidsLimit => "sandbox.pids_limit",
    /// The kernel killed a process in it for memory (`limit_bytes`, `oom_kills`); the controller
    /// fails it with reason `oom_killed`.
    SandboxOomKill => "sandbox.oom_kill",
    /// Its egress proxy refused a connection (`host`, `port`, `reason`: `not_allowed`,
    /// `ip_literal`, `private_address`, `sni_mismatch`, `unreadable_client_hello`,
    /// `host_mismatch`, `unresolved`, `egress_none`).
    EgressDenied => "egress.denied",
    LeaseAcquired => "lease.acquired",
    LeaseRenewed => "lease.renewed",
    LeaseReleased => "lease.released",
    RunStarted => "run.started",
    /// A run's secrets were handed to its command (names only, never values).
    SecretsInjected => "secrets.injected",
    /// A run the controller could not follow to its end (`reason`).
    RunFailed => "run.failed",
    /// A restarted controller took over a run in flight.
    RunAdopted => "run.adopted",
    /// A run in flight is being checked against its agent.
    RunReconciling => "run.reconciling",
    ArtifactPublished => "artifact.published",
    ArtifactDeleted => "artifact.deleted",
    /// Keeping the sandbox's work before its destroy ran out of time.
    ArtifactKeepTimeout => "artifact.keep_timeout",
    /// A workpiece was made or registered (`workpiece`, `kind`, `path`, `title`).
    WorkpieceCreated => "workpiece.created",
    /// A workpiece has a new version (`workpiece`, `version`, `author`: `creator`, `proposal`
    /// or `sandbox`, `sha256`).
    WorkpieceVersion => "workpiece.version",
    /// Edits to a workpiece were proposed (`workpiece`, `proposal`, `base_version`,
    /// `operations`: their count, `summary`).
    WorkpieceProposed => "workpiece.proposed",
    /// A person accepted a proposal (`workpiece`, `proposal`, `version`).
    WorkpieceAccepted => "workpiece.accepted",
    /// A person rejected a proposal (`workpiece`, `proposal`, `reason`).
    WorkpieceRejected => "workpiece.rejected",
    /// A person took the controls of the desktop (`holder`, `expires_at`); the agent's input
    /// and observations are refused until they hand back.
    ControlTaken => "control.taken",
    /// The controls came back to the agent (`reason`: `handed_back`, `expired`, `forced`,
    /// `sandbox_ended`; `held_ms`).
    ControlReturned => "control.returned",
    /// The agent asked for a person (`id`, `reason`, `timeout_seconds`).
    ControlRequested => "control.requested",
    /// A person declined the agent's request (`id`).
    ControlDeclined => "control.declined",
    /// The agent's request for a person ended (`id`, `outcome`, `waited_ms`).
    ControlRequestEnded => "control.request_ended",
    /// The login tool signed the sandbox's browser in, or tried (`site`, `outcome`, `run`,
    /// `uses`): names only, never a value.
    LoginUsed => "login.used",
    /// A run's login sites were forgotten at its end: their cookies and storage cleared
    /// (`run`, `sites`, `cookies`).
    LoginForgotten => "login.forgotten",
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for EventKind {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl Serialize for EventKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for EventKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Ok(EventKind::parse(&s))
    }
}

impl schemars::JsonSchema for EventKind {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "EventKind".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let known: Vec<&str> = EventKind::KNOWN.iter().map(|k| k.as_str()).collect();
        schemars::json_schema!({
            "type": "string",
            "description": "the event's kind: one of `examples`, or a kind a newer build added",
            "examples": known,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_kind_reads_back_as_itself_and_an_unknown_one_is_kept() {
        for k in EventKind::KNOWN {
            assert_eq!(EventKind::parse(k.as_str()), *k);
            let v = serde_json::to_value(k).unwrap();
            assert_eq!(v, serde_json::json!(k.as_str()));
            assert_eq!(serde_json::from_value::<EventKind>(v).unwrap(), *k);
        }
        let odd: EventKind = serde_json::from_value(serde_json::json!("lamp.lit")).unwrap();
        assert_eq!(odd, EventKind::Other("lamp.lit".into()));
        assert_eq!(serde_json::to_value(&odd).unwrap(), "lamp.lit");
        let distinct: std::collections::HashSet<&str> =
            EventKind::KNOWN.iter().map(|k| k.as_str()).collect();
        assert_eq!(distinct.len(), EventKind::KNOWN.len());
    }
}
