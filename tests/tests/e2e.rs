//! berth's end-to-end suites, one module per file of this directory, in one test binary, so
//! their dependencies are compiled and linked once rather than once per suite. A test is named
//! `<suite>::<test>`: `cargo nextest run --workspace -E 'test(/^faults::/)'` runs one suite.

mod artifacts;
mod auth_events;
mod byo;
mod cli;
mod compat_exec;
mod compat_files;
mod computer;
mod connections;
mod containment;
mod controller;
mod controller_desktop;
mod desktop;
mod display;
mod docker;
mod docs;
mod egress;
mod egress_credentials;
mod engines;
mod episode;
mod faults;
mod gateway;
mod golden;
mod guest;
mod gvisor;
mod harbor;
mod hostile;
mod ide_viewer;
mod images;
mod init;
mod kubernetes_fake_apiserver;
mod lifecycle;
mod limits;
mod login;
mod mcp;
mod mcp_controller;
mod native_exec;
mod native_files;
mod one_door;
mod osworld;
mod osworld_gnome;
mod pty;
mod quickstart;
mod record;
mod registry;
mod resize;
mod schemathesis;
mod session_control;
mod session_view;
mod verify;
mod workpieces;

/// Every `.rs` file beside this one is one of the modules above: a suite left out would not be
/// compiled, and its tests would silently never run.
#[test]
fn every_suite_file_is_a_module_of_this_binary() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let this = include_str!("e2e.rs");
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if let Some(suite) = name.strip_suffix(".rs")
            && suite != "e2e"
            && !this.contains(&format!("\nmod {suite};\n"))
        {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "not modules of tests/tests/e2e.rs: {missing:?}"
    );
}
