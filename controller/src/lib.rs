//! The berth controller: provisions sandboxes through providers, tracks them in SQLite, hands
//! them out by lease, keeps warm pools, proxies runs, files and the viewer to each sandbox's
//! berth-agent, and reconciles with the world after its own restart.

pub mod api;
pub mod artifact;
pub mod atif;
pub mod catalog;
pub mod cli;
pub mod config;
pub mod control;
pub mod controller;
pub mod ctx;
#[cfg(test)]
mod deploy_manifests;
pub mod egress;
pub mod episode;
pub mod error;
pub mod follow;
pub mod github;
pub mod http;
pub mod image;
pub mod image_job;
pub mod lease;
pub mod lifecycle;
pub mod limits;
pub mod login;
pub mod mcp;
pub mod metrics;
pub mod panes;
pub mod pool;
pub mod provider;
pub mod reconcile;
pub mod recovery;
pub mod run;
pub mod sandbox;
pub mod seal;
pub mod serve;
pub mod session;
pub mod store;
pub mod timeline;
pub mod util;
pub mod verify;
pub mod viewer;
pub mod warm;
pub mod workpiece;
