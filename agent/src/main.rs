//! The agent's binary: parses the command line and starts the mode it names.

use berth_agent::cli::{AgentArgs, Cli, LogFormat, Mode};

fn main() {
    std::process::exit(run());
}

fn run() -> i32 {
    let cli = <Cli as clap::Parser>::parse();
    match cli.command {
        Some(Mode::Shim { dir }) => berth_agent::exec::shim::main(&dir),
        Some(Mode::ShimSpare) => berth_agent::exec::shim::spare_main(),
        Some(Mode::Init { args }) => berth_agent::init::main(&args),
        Some(Mode::ExecAs {
            uid,
            gid,
            groups,
            argv,
        }) => exec_as(uid, gid, &groups, &argv),
        None => {
            init_logging(&cli.agent);
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .thread_name("berth-agent")
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("berth-agent: cannot start the runtime: {e}");
                    return 1;
                }
            };
            match rt.block_on(berth_agent::server::run(cli.agent)) {
                Ok(()) => 0,
                Err(e) => {
                    tracing::error!("{e:#}");
                    eprintln!("berth-agent: {e:#}");
                    1
                }
            }
        }
    }
}

fn init_logging(args: &AgentArgs) {
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

fn exec_as(uid: u32, gid: u32, groups: &[String], argv: &[String]) -> i32 {
    use std::os::unix::process::CommandExt;
    let groups: Vec<u32> = groups.iter().filter_map(|g| g.parse().ok()).collect();
    // SAFETY: we are about to exec; nothing else runs in this process.
    if let Err(e) = unsafe { berth_agent::account::switch_identity(uid, gid, &groups) } {
        eprintln!("berth-agent exec-as: cannot switch to {uid}:{gid}: {e}");
        return 126;
    }
    let err = std::process::Command::new(&argv[0]).args(&argv[1..]).exec();
    eprintln!("berth-agent exec-as: cannot run {}: {err}", argv[0]);
    127
}
