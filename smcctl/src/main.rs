//! `smcctl`: the operator CLI (issue 5). Not yet implemented.

fn main() {
    eprintln!("smcctl: not implemented yet (see README status table)");
    std::process::exit(1);
}
