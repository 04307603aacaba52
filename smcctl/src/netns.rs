//! `--netns NAME|PATH|PID`: which network namespace a command is about.
//!
//! Requests of the engine family (`SMCD_ENGINE`: sysctl, ss, stats reset) name the namespace
//! with the `NETNS` selector attribute, so `smcd` answers for it without privileges on our
//! side. The kernel's `SMC_GEN_NETLINK` requests carry no such attribute: the answer is about
//! the namespace of the requesting socket (the kernel) or of the requesting process (`smcd`
//! reads `/proc/<pid>/ns/net` of its peer). For those smcctl enters the namespace first, as
//! `ip netns exec` does (`setns`, needs `CAP_SYS_ADMIN`).

use std::path::PathBuf;

use rustix::fs::{Mode, OFlags};
use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};
use smc_proto::netlink::engine::NetnsSelector;

use crate::error::{Error, errno_text};

/// A parsed `--netns` argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetnsArg {
    /// A name under `/run/netns` (as `ip netns add` creates).
    Name(String),
    /// A path to a namespace file.
    Path(PathBuf),
    /// The namespace of this process.
    Pid(u32),
}

impl NetnsArg {
    /// All digits: a pid; contains `/`: a path; otherwise a name under `/run/netns`.
    pub fn parse(s: &str) -> Result<Self, Error> {
        if s.is_empty() {
            return Err(Error::usage("--netns needs a name, a path or a pid"));
        }
        if s.bytes().all(|b| b.is_ascii_digit()) {
            return s
                .parse::<u32>()
                .map(NetnsArg::Pid)
                .map_err(|_| Error::usage(format!("--netns {s}: not a valid pid")));
        }
        if s.contains('/') {
            return Ok(NetnsArg::Path(PathBuf::from(s)));
        }
        if s == "." || s == ".." {
            return Err(Error::usage(format!("--netns {s}: not a namespace name")));
        }
        Ok(NetnsArg::Name(s.to_owned()))
    }

    /// The namespace file.
    pub fn path(&self) -> PathBuf {
        match self {
            NetnsArg::Name(n) => PathBuf::from("/run/netns").join(n),
            NetnsArg::Path(p) => p.clone(),
            NetnsArg::Pid(p) => PathBuf::from(format!("/proc/{p}/ns/net")),
        }
    }

    /// The selector attribute for `SMCD_ENGINE` requests.
    pub fn selector(&self) -> NetnsSelector {
        match self {
            NetnsArg::Name(n) => NetnsSelector::Name(n.clone()),
            NetnsArg::Path(p) => NetnsSelector::Path(p.to_string_lossy().into_owned()),
            NetnsArg::Pid(p) => NetnsSelector::Pid(*p),
        }
    }

    /// Moves this (single-threaded) process into the namespace. `command` names what needs
    /// it, for the error message.
    pub fn enter(&self, command: &str) -> Result<(), Error> {
        let path = self.path();
        let fd = rustix::fs::open(&path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).map_err(
            |e| match e {
                rustix::io::Errno::NOENT => Error::failed(format!(
                    "no network namespace {} ({} does not exist)",
                    self.describe(),
                    path.display()
                )),
                rustix::io::Errno::ACCESS | rustix::io::Errno::PERM => Error::failed(format!(
                    "`{command}` with --netns needs root: cannot open {}",
                    path.display()
                )),
                e => Error::failed(format!(
                    "cannot open {}: {}",
                    path.display(),
                    errno_text(e.raw_os_error())
                )),
            },
        )?;
        move_into_link_name_space(
            std::os::fd::AsFd::as_fd(&fd),
            Some(LinkNameSpaceType::Network),
        )
        .map_err(|e| match e {
            rustix::io::Errno::PERM => Error::failed(format!(
                "`{command}` with --netns needs root: entering network namespace {} \
                 (setns) was refused",
                self.describe()
            )),
            rustix::io::Errno::INVAL => {
                Error::failed(format!("{} is not a network namespace", path.display()))
            }
            e => Error::failed(format!(
                "cannot enter network namespace {}: {}",
                self.describe(),
                errno_text(e.raw_os_error())
            )),
        })
    }

    /// As the user wrote it.
    pub fn describe(&self) -> String {
        match self {
            NetnsArg::Name(n) => n.clone(),
            NetnsArg::Path(p) => p.display().to_string(),
            NetnsArg::Pid(p) => format!("of pid {p}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_forms() {
        assert_eq!(NetnsArg::parse("1234").unwrap(), NetnsArg::Pid(1234));
        assert_eq!(
            NetnsArg::parse("/proc/1/ns/net").unwrap(),
            NetnsArg::Path("/proc/1/ns/net".into())
        );
        assert_eq!(
            NetnsArg::parse("blue").unwrap(),
            NetnsArg::Name("blue".into())
        );
        assert_eq!(
            NetnsArg::parse("blue").unwrap().path(),
            PathBuf::from("/run/netns/blue")
        );
        assert_eq!(NetnsArg::Pid(7).path(), PathBuf::from("/proc/7/ns/net"));
        assert!(NetnsArg::parse("").is_err());
        assert!(NetnsArg::parse("..").is_err());
        assert!(NetnsArg::parse("99999999999").is_err());
        assert_eq!(
            NetnsArg::Name("x".into()).selector(),
            NetnsSelector::Name("x".into())
        );
    }

    #[test]
    fn missing_namespace_is_one_line() {
        let e = NetnsArg::Name("smcctl-unit-test-does-not-exist".into())
            .enter("stats")
            .unwrap_err();
        assert!(e.message.contains("does not exist"), "{}", e.message);
    }
}
