fn main() {
    std::process::exit(berth_agent::cli::main());
}
