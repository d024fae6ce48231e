//! `berth`: the controller and its command line. The controller itself (sandboxes, leases,
//! warm pools, providers) is built on top of berth-agent; until it lands this binary only
//! reports what it is.

use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    name = "berth",
    version,
    about = "berth controller: provisions workstation sandboxes running berth-agent"
)]
struct Cli {}

fn main() {
    let _ = Cli::parse();
    println!(
        "berth {}: the controller is not built yet; run berth-agent (see the README)",
        env!("CARGO_PKG_VERSION")
    );
}
