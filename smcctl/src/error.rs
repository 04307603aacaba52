//! One error type for the whole CLI: a one-line message and the exit code (1 a request failed,
//! 2 a usage error). Every failure the user can meet ends up here; nothing else reaches
//! stderr (no panics, no backtraces: see `main.rs`).

use std::fmt;

/// Exit code of a failed request.
pub const EXIT_FAILED: i32 = 1;
/// Exit code of a usage error (as clap uses).
pub const EXIT_USAGE: i32 = 2;

/// A failure, already phrased for the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// One line, without the `smcctl:` prefix.
    pub message: String,
    /// The process exit code.
    pub code: i32,
}

impl Error {
    /// A request failed (exit 1).
    pub fn failed(message: impl Into<String>) -> Self {
        Self {
            message: one_line(message.into()),
            code: EXIT_FAILED,
        }
    }

    /// The command line is wrong (exit 2).
    pub fn usage(message: impl Into<String>) -> Self {
        Self {
            message: one_line(message.into()),
            code: EXIT_USAGE,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// Messages come from the system and from the peer; keep them to one line whatever they hold.
fn one_line(s: String) -> String {
    if s.contains(['\n', '\r']) {
        s.split(['\n', '\r'])
            .filter(|p| !p.is_empty())
            .collect::<Vec<_>>()
            .join(" ")
    } else {
        s
    }
}

/// `strerror` text without Rust's " (os error N)" suffix, plus the symbolic name when known:
/// `"Operation not permitted (EPERM)"`.
pub fn errno_text(errno: i32) -> String {
    let errno = errno.abs();
    let text = std::io::Error::from_raw_os_error(errno).to_string();
    let text = match text.find(" (os error") {
        Some(i) => text[..i].to_owned(),
        None => text,
    };
    match errno_name(errno) {
        Some(n) => format!("{text} ({n})"),
        None => format!("{text} (errno {errno})"),
    }
}

/// Symbolic names of the errnos the control families answer with.
pub fn errno_name(errno: i32) -> Option<&'static str> {
    Some(match errno.abs() {
        1 => "EPERM",
        2 => "ENOENT",
        3 => "ESRCH",
        5 => "EIO",
        11 => "EAGAIN",
        12 => "ENOMEM",
        13 => "EACCES",
        16 => "EBUSY",
        17 => "EEXIST",
        19 => "ENODEV",
        22 => "EINVAL",
        34 => "ERANGE",
        71 => "EPROTO",
        90 => "EMSGSIZE",
        95 => "EOPNOTSUPP",
        110 => "ETIMEDOUT",
        111 => "ECONNREFUSED",
        _ => return None,
    })
}

/// `EPERM`.
pub const EPERM: i32 = 1;
/// `ENOENT`.
pub const ENOENT: i32 = 2;
/// `EAGAIN`.
pub const EAGAIN: i32 = 11;
/// `EACCES`.
pub const EACCES: i32 = 13;
/// `EEXIST`.
pub const EEXIST: i32 = 17;
/// `EINVAL`.
pub const EINVAL: i32 = 22;
/// `ERANGE`.
pub const ERANGE: i32 = 34;
/// `EOPNOTSUPP`.
pub const EOPNOTSUPP: i32 = 95;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_text_is_clean() {
        assert_eq!(errno_text(1), "Operation not permitted (EPERM)");
        assert_eq!(errno_text(-22), "Invalid argument (EINVAL)");
        assert!(errno_text(4095).ends_with("(errno 4095)"));
    }

    #[test]
    fn messages_are_one_line() {
        assert_eq!(Error::failed("a\nb\r\nc").message, "a b c");
        assert_eq!(Error::usage("x").code, EXIT_USAGE);
        assert_eq!(Error::failed("x").code, EXIT_FAILED);
    }
}
