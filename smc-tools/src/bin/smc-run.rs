//! `smc-run [-d] [-r SIZE] [-t SIZE] PROGRAM ARGS...`: runs an unmodified program with its TCP
//! sockets on SMC, as smc-tools' `smc_run` does, by preloading `libsmc_preload.so`.
//!
//! - `-d`: debug messages of the library on stderr (`SMC_DEBUG=1`);
//! - `-r SIZE` / `-t SIZE`: receive / send buffer size for every TCP socket the program makes
//!   (`SMC_RCVBUF` / `SMC_SNDBUF`; a number with an optional k/K/m/M; `net.core.rmem_max` /
//!   `wmem_max` are raised to it when smaller, as `smc_run` does, if we may);
//! - the library: `$SMC_PRELOAD_LIB`, else `libsmc_preload.so` next to this program (the build
//!   tree: `cargo build -p smc-preload`), else `../lib/smc-userspace/` from it.
//!
//! smcd is found as by every engine: `$SMCD_SOCKET`, else the default socket.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

const LIB: &str = "libsmc_preload.so";

fn usage() -> ExitCode {
    eprintln!(
        "usage: smc-run [-d] [-r SIZE] [-t SIZE] [-v] [-h] PROGRAM [ARGS...]\n\
         \x20 -d       debug messages (SMC_DEBUG=1)\n\
         \x20 -r SIZE  receive buffer size (SMC_RCVBUF), e.g. 256k\n\
         \x20 -t SIZE  send buffer size (SMC_SNDBUF), e.g. 1M\n\
         \x20 -v       version\n\
         \x20 -h       this help"
    );
    ExitCode::from(2)
}

/// smc_run's check: `^[0-9]+[kKmM]?$`; the size in bytes.
fn size(s: &str) -> Option<u64> {
    let (num, mult) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 1024),
        b'm' | b'M' => (&s[..s.len() - 1], 1024 * 1024),
        _ => (s, 1),
    };
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    num.parse::<u64>().ok()?.checked_mul(mult)
}

/// Raises `net.core.<name>` to `v` if it is smaller (root only; otherwise left alone).
fn raise_max(name: &str, v: u64) {
    let path = format!("/proc/sys/net/core/{name}");
    let cur = std::fs::read_to_string(&path)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    if cur.is_some_and(|c| c < v) {
        let _ = std::fs::write(&path, v.to_string());
    }
}

fn find_lib() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SMC_PRELOAD_LIB") {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [dir.join(LIB), dir.join("../lib/smc-userspace").join(LIB)]
        .into_iter()
        .find(|p| p.is_file())
}

fn main() -> ExitCode {
    let mut args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let mut cmd_env: Vec<(&str, String)> = Vec::new();
    while let Some(a) = args.first().and_then(|a| a.to_str()).map(str::to_owned) {
        if a == "--" {
            args.remove(0);
            break;
        }
        if !a.starts_with('-') || a == "-" {
            break;
        }
        args.remove(0);
        match a.as_str() {
            "-d" => cmd_env.push(("SMC_DEBUG", "1".into())),
            "-h" | "--help" => {
                usage();
                return ExitCode::SUCCESS;
            }
            "-v" | "--version" => {
                println!("smc-run {}", env!("CARGO_PKG_VERSION"));
                return ExitCode::SUCCESS;
            }
            "-r" | "-t" => {
                let Some(v) = (!args.is_empty()).then(|| args.remove(0)) else {
                    eprintln!("smc-run: {a} needs a SIZE");
                    return usage();
                };
                let v = v.to_string_lossy().into_owned();
                let Some(n) = size(&v) else {
                    eprintln!(
                        "smc-run: invalid size '{v}' (a number with an optional k, K, m or M)"
                    );
                    return usage();
                };
                if a == "-r" {
                    raise_max("rmem_max", n);
                    cmd_env.push(("SMC_RCVBUF", n.to_string()));
                } else {
                    raise_max("wmem_max", n);
                    cmd_env.push(("SMC_SNDBUF", n.to_string()));
                }
            }
            _ => {
                eprintln!("smc-run: unknown option {a}");
                return usage();
            }
        }
    }
    if args.is_empty() {
        return usage();
    }
    let Some(lib) = find_lib() else {
        eprintln!(
            "smc-run: {LIB} not found next to {} (build it: cargo build -p smc-preload; or set SMC_PRELOAD_LIB)",
            std::env::current_exe().map_or_else(|_| "smc-run".into(), |p| p.display().to_string())
        );
        return ExitCode::from(127);
    };
    let lib = std::fs::canonicalize(&lib).unwrap_or(lib);
    // Appended, as smc_run does: preloads the user set come first.
    let preload = match std::env::var_os("LD_PRELOAD") {
        Some(p) if !p.is_empty() => {
            let mut s = p;
            s.push(":");
            s.push(lib.as_os_str());
            s
        }
        _ => lib.into_os_string(),
    };
    let mut cmd = Command::new(&args[0]);
    cmd.args(&args[1..]).env("LD_PRELOAD", preload);
    for (k, v) in cmd_env {
        cmd.env(k, v);
    }
    let e = cmd.exec();
    eprintln!("smc-run: {}: {e}", args[0].to_string_lossy());
    ExitCode::from(if e.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    })
}
