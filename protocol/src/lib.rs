//! The berth wire contract: request and response types for the agent's native `/v1` API, the
//! one error body, event records, and a typed async client.
//!
//! Field names here are frozen by `API.md`; anything added beyond it is optional on the wire so
//! older clients keep working.

pub mod cgroup;
pub mod client;
pub mod control;
pub mod controller;
pub mod desktop;
pub mod display;
pub mod egress;
pub mod error;
pub mod events;
pub mod exec;
pub mod fs;
pub mod image;
pub mod lifecycle;
pub mod login;
pub mod openapi;
pub mod ops;
pub mod pty;
pub mod range;
pub mod record;
#[cfg(feature = "server")]
pub mod relay;
pub mod routes;
#[cfg(feature = "server")]
pub mod serve;
pub mod sync;
pub mod toolset;
pub mod workpiece;
pub mod workspace;

pub use client::{AgentClient, Auth, ClientError};
pub use desktop::*;
pub use display::*;
pub use error::{ErrorBody, ErrorDetail};
pub use events::{Event, EventKind, EventsPage};
pub use exec::*;
pub use fs::*;
pub use pty::*;
pub use record::*;

/// Header carrying the native API's bearer token.
pub const AUTHORIZATION: &str = routes::header::AUTHORIZATION;
