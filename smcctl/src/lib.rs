//! `smcctl`: the operator CLI for SMC, modelled on smc-tools (`smcd`, `smcr`, `smcss`).
//!
//! It speaks only netlink: the kernel's `SMC_GEN_NETLINK` family and smcd's `SMCD_ENGINE`
//! family, resolved by name through nlctrl, over smcd's control socket or (`--kernel`) the
//! kernel's `NETLINK_GENERIC` socket. Layers:
//!
//! | module | what |
//! |---|---|
//! | [`cli`] | clap definitions (prefix matching and the default verb are clap's), usage errors |
//! | [`transport`] | the two ways to the server (one trait, two implementations) |
//! | [`client`] | family lookup, dump and do requests, reply collection |
//! | [`session`] | per-run options, lazy connection, refusal messages |
//! | [`cmd`] | one module per object: views (serde, `--json`) and smc-tools text |
//! | [`fmt`] | number formats and borderless tables |
//! | [`netns`] | `--netns` |
//! | [`error`] | one-line errors and exit codes |

pub mod cli;
pub mod client;
pub mod cmd;
pub mod error;
pub mod fmt;
pub mod netns;
pub mod session;
pub mod transport;

use std::ffi::OsString;
use std::io::Write;

use crate::error::EXIT_USAGE;

/// Runs smcctl with these arguments (`args[0]` the program name); returns the exit code.
/// Output goes to stdout, one-line errors to stderr.
pub fn run(args: Vec<OsString>) -> i32 {
    let parsed = match cli::parse(args) {
        Ok(c) => c,
        Err(cli::ParseError::Clap(e)) => {
            // Help and version go to stdout with status 0, real errors to stderr with 2.
            let _ = e.print();
            return if e.use_stderr() { EXIT_USAGE } else { 0 };
        }
        Err(cli::ParseError::Usage(e)) => {
            eprintln!("smcctl: {e}");
            return e.code;
        }
    };
    match cmd::execute(&parsed) {
        Ok(out) => {
            let mut stdout = std::io::stdout().lock();
            match stdout
                .write_all(out.as_bytes())
                .and_then(|()| stdout.flush())
            {
                Ok(()) => 0,
                // `smcctl ss | head`: the reader left; not an error of ours.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
                Err(e) => {
                    eprintln!("smcctl: cannot write the output: {e}");
                    error::EXIT_FAILED
                }
            }
        }
        Err(e) => {
            eprintln!("smcctl: {e}");
            e.code
        }
    }
}
