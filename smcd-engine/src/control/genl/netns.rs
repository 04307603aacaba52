//! Which network namespace a request is about.
//!
//! The kernel answers every `SMC_GEN_NETLINK` request for the namespace of the netlink socket
//! it came in on (`sock_net(skb->sk)`); smcd uses the namespace of the calling process
//! (`/proc/<SO_PEERCRED pid>/ns/net`). `SMCD_ENGINE` requests may name another one with the
//! selector nest: an inode, a path to a namespace file, a process, or a name under
//! `/run/netns` (as `ip netns` creates them). A selector that names no network namespace is
//! `ENOENT`; a path that exists but is not a network namespace file `EINVAL`.
//!
//! smcd runs as root and must not be tricked into opening arbitrary files for a client: a
//! path is only opened (to ask the kernel its namespace type) after `stat` has shown that it
//! lives on nsfs, and then without blocking.

use super::{Ctx, Errno};
use crate::control::daemon::Daemon;
use smc_proto::netlink::engine::NetnsSelector;
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Where `ip netns` keeps named namespaces.
pub const RUN_NETNS: &str = "/run/netns";

/// The namespace a request selects (`None`: the caller's own).
pub(crate) fn resolve(ctx: &Ctx<'_>, sel: Option<&NetnsSelector>) -> Result<u64, Errno> {
    match sel {
        None => ctx.caller_netns(),
        Some(NetnsSelector::Inode(i)) => {
            let i = *i;
            if known(ctx.daemon).contains(&i)
                || ctx.caller_netns().ok() == Some(i)
                || names().contains_key(&i)
            {
                Ok(i)
            } else {
                Err(libc::ENOENT)
            }
        }
        Some(NetnsSelector::Pid(p)) => {
            if *p == 0 {
                return Err(libc::ENOENT);
            }
            crate::control::device::netns_of_pid(*p).map_err(|_| libc::ENOENT)
        }
        Some(NetnsSelector::Path(p)) => netns_of_path(Path::new(p)),
        Some(NetnsSelector::Name(n)) => {
            if n.is_empty() || n.contains('/') || n == "." || n == ".." || n.contains('\0') {
                return Err(libc::EINVAL);
            }
            netns_of_path(&Path::new(RUN_NETNS).join(n))
        }
    }
}

/// The inode of the network namespace file at `path`.
pub fn netns_of_path(path: &Path) -> Result<u64, Errno> {
    let io_errno = |e: std::io::Error| match e.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ENOTDIR) | None => libc::ENOENT,
        Some(n) => n,
    };
    let nsfs = std::fs::metadata("/proc/self/ns/net")
        .map_err(io_errno)?
        .dev();
    let md = std::fs::metadata(path).map_err(io_errno)?;
    if md.dev() != nsfs {
        return Err(libc::EINVAL);
    }
    // On nsfs now; open it (without blocking, should it have been swapped since) and ask.
    let fd = rustix::fs::open(
        path,
        rustix::fs::OFlags::RDONLY
            | rustix::fs::OFlags::CLOEXEC
            | rustix::fs::OFlags::NONBLOCK
            | rustix::fs::OFlags::NOCTTY,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| e.raw_os_error())?;
    let st = rustix::fs::fstat(&fd).map_err(|e| e.raw_os_error())?;
    if st.st_dev != nsfs {
        return Err(libc::EINVAL);
    }
    if ns_type(&fd) != Some(libc::CLONE_NEWNET) {
        return Err(libc::EINVAL);
    }
    Ok(st.st_ino)
}

/// `NS_GET_NSTYPE` (`_IO(0xb7, 0x3)`): the `CLONE_NEW*` type of a namespace file.
fn ns_type(fd: &rustix::fd::OwnedFd) -> Option<i32> {
    use rustix::fd::AsRawFd;
    const NS_GET_NSTYPE: libc::c_ulong = 0xb703;
    // SAFETY: NS_GET_NSTYPE takes no argument and only returns an int; `fd` is a descriptor
    // we own for the duration of the call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), NS_GET_NSTYPE) };
    (r >= 0).then_some(r)
}

/// Namespaces smcd knows: those it has state for, and those of live engines and listeners.
pub fn known(daemon: &Daemon) -> BTreeSet<u64> {
    let mut s: BTreeSet<u64> = daemon.namespaces.keys().copied().collect();
    s.extend(daemon.device.sessions().map(|x| x.netns));
    s.extend(daemon.device.listeners().map(|l| l.netns));
    s.remove(&0);
    s
}

/// Named namespaces (`/run/netns/NAME`), by inode.
pub fn names() -> BTreeMap<u64, String> {
    let mut m = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(RUN_NETNS) else {
        return m;
    };
    for e in dir.flatten() {
        let Some(name) = e.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if let Ok(md) = std::fs::metadata(e.path()) {
            m.entry(md.ino()).or_insert(name);
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_namespace_by_path() {
        let own = std::fs::metadata("/proc/self/ns/net").unwrap().ino();
        assert_eq!(netns_of_path(Path::new("/proc/self/ns/net")), Ok(own));
        let pid = format!("/proc/{}/ns/net", std::process::id());
        assert_eq!(netns_of_path(Path::new(&pid)), Ok(own));
    }

    #[test]
    fn other_files_are_refused() {
        // Another namespace type on nsfs.
        assert_eq!(
            netns_of_path(Path::new("/proc/self/ns/uts")),
            Err(libc::EINVAL)
        );
        // Not nsfs at all (never opened).
        assert_eq!(netns_of_path(Path::new("/dev/null")), Err(libc::EINVAL));
        assert_eq!(
            netns_of_path(Path::new("/nonexistent/ns")),
            Err(libc::ENOENT)
        );
    }
}
