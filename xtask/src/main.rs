//! `cargo xtask`: developer workflows (issue 6). Not yet implemented.

fn main() {
    eprintln!("cargo xtask: not implemented yet (see README status table)");
    std::process::exit(1);
}
