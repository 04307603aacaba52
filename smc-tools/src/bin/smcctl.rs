//! `smcctl` binary: see the library docs. A panic never reaches the user as a Rust panic
//! message or backtrace: it becomes one line on stderr and exit status 1.

use std::process::ExitCode;

fn main() -> ExitCode {
    std::panic::set_hook(Box::new(|info| {
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown".to_owned());
        let what = what.replace('\n', " ");
        eprintln!("smcctl: internal error ({what}); please report it");
    }));
    let args: Vec<_> = std::env::args_os().collect();
    let code = std::panic::catch_unwind(|| smcctl::run(args)).unwrap_or(1);
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
