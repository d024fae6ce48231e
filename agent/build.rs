//! Links the agent's binary with packed relative relocations (DT_RELR): the loader applies
//! them from a few kilobytes instead of reading 1.7 MB of `.rela.dyn`, page by page. The agent
//! starts again for every background command (as its shim), so its start is on that path.
fn main() {
    println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
}
