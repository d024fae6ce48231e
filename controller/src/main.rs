//! `berth`: the controller service and its command line.

use clap::Parser;

fn main() {
    let cli = berth_controller::cli::Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("BERTH_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    match rt.block_on(berth_controller::cli::run(cli)) {
        Ok(code) => {
            rt.shutdown_timeout(std::time::Duration::from_secs(1));
            std::process::exit(code)
        }
        Err(e) => {
            eprintln!("berth: {e:#}");
            std::process::exit(1)
        }
    }
}
