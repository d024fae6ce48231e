//! The lifecycles of sandboxes, runs, leases and image jobs as types: each status, its wire string, and
//! the moves allowed between statuses, decided here and nowhere else. The store refuses a
//! status change these tables do not allow (a compare-and-set on the status it read).
//!
//! Sandbox:
//!
//! ```text
//!   pending ──► starting ──► running
//!      │            │  ▲         │
//!      │            └──┘ (endpoint seen again)
//!      ▼            ▼            ▼
//!   stopping / stopped / failed (from any live status)
//!   stopping ──► stopped | failed
//!   stopped, failed: final (a failed sandbox keeps its status and reason once destroyed)
//! ```
//!
//! Run: `pending ──► running`, and `pending | running ──► exited | failed | lost` (final).
//! Lease: `active ──► released | expired` (final).

use std::fmt;
use std::str::FromStr;

/// A string that names no status of its kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} status {value:?}")]
pub struct UnknownStatus {
    pub kind: &'static str,
    pub value: String,
}

macro_rules! status_enum {
    ($(#[$m:meta])* $name:ident, $kind:literal, { $($(#[$vm:meta])* $v:ident => $s:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $name {
            $($(#[$vm])* $v),+
        }

        impl $name {
            /// Every status, in lifecycle order.
            pub const ALL: &'static [$name] = &[$($name::$v),+];

            /// The wire and store string.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$v => $s),+
                }
            }
        }

        impl FromStr for $name {
            type Err = UnknownStatus;
            fn from_str(s: &str) -> Result<Self, UnknownStatus> {
                match s {
                    $($s => Ok($name::$v),)+
                    _ => Err(UnknownStatus { kind: $kind, value: s.to_string() }),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }

        impl schemars::JsonSchema for $name {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }

            fn inline_schema() -> bool {
                true
            }

            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({"type": "string", "enum": [$($s),+]})
            }
        }

        #[cfg(feature = "sql")]
        impl rusqlite::ToSql for $name {
            fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
                Ok(rusqlite::types::ToSqlOutput::from(self.as_str()))
            }
        }

        #[cfg(feature = "sql")]
        impl rusqlite::types::FromSql for $name {
            fn column_result(v: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Self> {
                v.as_str()?
                    .parse()
                    .map_err(|e: UnknownStatus| rusqlite::types::FromSqlError::Other(Box::new(e)))
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }
    };
}

status_enum!(
    /// Where a sandbox is in its life.
    SandboxStatus, "sandbox", {
        /// Recorded; the provider has not made it yet.
        Pending => "pending",
        /// The provider made it; its agent is not ready yet.
        Starting => "starting",
        /// Ready: its agent answered its readiness probe.
        Running => "running",
        /// Being destroyed.
        Stopping => "stopping",
        /// Destroyed.
        Stopped => "stopped",
        /// Failed, with its reason (destroyed or being destroyed).
        Failed => "failed",
    }
);

status_enum!(
    /// Where a run is in its life.
    RunStatus, "run", {
        /// Recorded; the agent is not known to have started it.
        Pending => "pending",
        /// The agent runs it.
        Running => "running",
        /// It ended with an exit code.
        Exited => "exited",
        /// It could not start, or its agent stayed unreachable.
        Failed => "failed",
        /// Its end is unknown (its sandbox or the agent's record of it is gone).
        Lost => "lost",
    }
);

status_enum!(
    /// Where an image build job is.
    ImageJobStatus, "image job", {
        /// The image is being built.
        Building => "building",
        /// The image exists.
        Ready => "ready",
        /// The build failed (`error` says why); asking again starts a new job.
        Failed => "failed",
    }
);

status_enum!(
    /// Where a lease is in its life.
    LeaseStatus, "lease", {
        /// Held by its thread.
        Active => "active",
        /// Released by its holder (or its sandbox was deleted).
        Released => "released",
        /// Its time ran out.
        Expired => "expired",
    }
);

impl SandboxStatus {
    /// Whether `self → to` is a move a sandbox may make: the one transition table.
    ///
    /// `starting → starting` is allowed: a restarted controller records the endpoint it
    /// observes for a sandbox whose start was under way. No other status moves to itself.
    pub fn can_move(self, to: SandboxStatus) -> bool {
        use SandboxStatus::*;
        match (self, to) {
            (Pending, Starting) => true,
            // A restarted controller records the endpoint it observes (a provider that reaches
            // agents through the controller's own listeners, port-forward, has new ones).
            (Starting, Starting | Running) | (Running, Running) => true,
            // Any live sandbox may be deleted, destroyed or fail.
            (Pending | Starting | Running, Stopping | Stopped | Failed) => true,
            // A delete finishes, or the sandbox fails while it is being deleted.
            (Stopping, Stopped | Failed) => true,
            _ => false,
        }
    }

    /// Provisioned or being provisioned: the sandbox counts as existing.
    pub fn live(self) -> bool {
        matches!(
            self,
            SandboxStatus::Pending | SandboxStatus::Starting | SandboxStatus::Running
        )
    }

    /// No move leads out of it.
    pub fn is_final(self) -> bool {
        SandboxStatus::ALL.iter().all(|&to| !self.can_move(to))
    }

    /// The statuses from which a sandbox may move to `to`.
    pub fn sources(to: SandboxStatus) -> Vec<SandboxStatus> {
        SandboxStatus::ALL
            .iter()
            .copied()
            .filter(|f| f.can_move(to))
            .collect()
    }
}

impl RunStatus {
    /// Whether `self → to` is a move a run may make: the one transition table.
    pub fn can_move(self, to: RunStatus) -> bool {
        use RunStatus::*;
        matches!(
            (self, to),
            (Pending, Running) | (Pending | Running, Exited | Failed | Lost)
        )
    }

    /// It ended (no move leads out of it).
    pub fn done(self) -> bool {
        RunStatus::ALL.iter().all(|&to| !self.can_move(to))
    }

    /// The statuses from which a run may move to `to`.
    pub fn sources(to: RunStatus) -> Vec<RunStatus> {
        RunStatus::ALL
            .iter()
            .copied()
            .filter(|f| f.can_move(to))
            .collect()
    }
}

impl LeaseStatus {
    /// Whether `self → to` is a move a lease may make: the one transition table.
    pub fn can_move(self, to: LeaseStatus) -> bool {
        use LeaseStatus::*;
        matches!((self, to), (Active, Released | Expired))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_read_and_write_as_the_wire_strings() {
        let sandbox = [
            "pending", "starting", "running", "stopping", "stopped", "failed",
        ];
        assert_eq!(
            SandboxStatus::ALL
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>(),
            sandbox
        );
        for s in SandboxStatus::ALL {
            assert_eq!(s.as_str().parse::<SandboxStatus>(), Ok(*s));
            assert_eq!(
                serde_json::to_value(s).unwrap(),
                serde_json::json!(s.as_str())
            );
            assert_eq!(
                serde_json::from_value::<SandboxStatus>(serde_json::json!(s.as_str())).unwrap(),
                *s
            );
            assert_eq!(s.to_string(), s.as_str());
        }
        let run = ["pending", "running", "exited", "failed", "lost"];
        assert_eq!(
            RunStatus::ALL
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>(),
            run
        );
        for s in RunStatus::ALL {
            assert_eq!(s.as_str().parse::<RunStatus>(), Ok(*s));
        }
        for s in LeaseStatus::ALL {
            assert_eq!(s.as_str().parse::<LeaseStatus>(), Ok(*s));
        }
        let e = "deleted".parse::<SandboxStatus>().unwrap_err();
        assert_eq!(e.to_string(), "unknown sandbox status \"deleted\"");
        assert!("Running".parse::<SandboxStatus>().is_err());
        assert!(serde_json::from_value::<RunStatus>(serde_json::json!("done")).is_err());
    }

    #[test]
    fn every_sandbox_move_is_as_the_table_says() {
        use SandboxStatus::*;
        // (from, to) pairs allowed; every other pair of the 36 is refused.
        let allowed = [
            (Pending, Starting),
            (Pending, Stopping),
            (Pending, Stopped),
            (Pending, Failed),
            (Starting, Starting),
            (Starting, Running),
            (Starting, Stopping),
            (Starting, Stopped),
            (Starting, Failed),
            (Running, Running),
            (Running, Stopping),
            (Running, Stopped),
            (Running, Failed),
            (Stopping, Stopped),
            (Stopping, Failed),
        ];
        let mut checked = 0;
        for &from in SandboxStatus::ALL {
            for &to in SandboxStatus::ALL {
                assert_eq!(
                    from.can_move(to),
                    allowed.contains(&(from, to)),
                    "{from} → {to}"
                );
                checked += 1;
            }
        }
        assert_eq!(checked, 36);
        // What the table implies.
        assert!(
            !Stopping.can_move(Running),
            "a deleted sandbox never runs again"
        );
        assert!(
            !Failed.can_move(Stopped),
            "a failed sandbox keeps its reason"
        );
        assert!(!Pending.can_move(Running), "readiness needs an endpoint");
        assert_eq!(
            SandboxStatus::ALL
                .iter()
                .filter(|s| s.is_final())
                .collect::<Vec<_>>(),
            [&Stopped, &Failed]
        );
        assert_eq!(
            SandboxStatus::ALL
                .iter()
                .filter(|s| s.live())
                .collect::<Vec<_>>(),
            [&Pending, &Starting, &Running]
        );
        assert_eq!(SandboxStatus::sources(Running), [Starting, Running]);
        assert_eq!(
            SandboxStatus::sources(Failed),
            [Pending, Starting, Running, Stopping]
        );
    }

    #[test]
    fn every_run_and_lease_move_is_as_the_table_says() {
        use RunStatus::*;
        let allowed = [
            (Pending, Running),
            (Pending, Exited),
            (Pending, Failed),
            (Pending, Lost),
            (Running, Exited),
            (Running, Failed),
            (Running, Lost),
        ];
        for &from in RunStatus::ALL {
            for &to in RunStatus::ALL {
                assert_eq!(
                    from.can_move(to),
                    allowed.contains(&(from, to)),
                    "{from} → {to}"
                );
            }
        }
        assert_eq!(
            RunStatus::ALL
                .iter()
                .filter(|s| s.done())
                .collect::<Vec<_>>(),
            [&Exited, &Failed, &Lost]
        );
        assert_eq!(RunStatus::sources(Exited), [Pending, Running]);
        use LeaseStatus::*;
        for &from in LeaseStatus::ALL {
            for &to in LeaseStatus::ALL {
                assert_eq!(
                    from.can_move(to),
                    from == Active && to != Active,
                    "{from} → {to}"
                );
            }
        }
    }
}
