//! Loads the SMC option program ([`super::OBJECT`]) and attaches it to a cgroup v2 (smcd's
//! part; feature `loader`).
//!
//! The loader is `aya` (pure Rust, no libbpf, no C toolchain at build time): it reads the ELF,
//! fixes up and loads its BTF (which `SK_STORAGE` maps require), creates the BTF-defined maps,
//! relocates the program's map references and attaches with `BPF_LINK_CREATE`. The
//! attachment is a `bpf_link` whose only descriptor smcd holds: when smcd ends, however it
//! ends (SIGKILL too), the kernel closes it and the program is detached. `docs/syn-option.md`
//! says why aya and not libbpf-rs.

use super::{MAP_LISTENERS, MAP_SK, Maps, OBJECT, PROGRAM};
use aya::Ebpf;
use aya::maps::{Map, MapData};
use aya::programs::links::CgroupAttachMode;
use aya::programs::sock_ops::SockOpsLink;
use aya::programs::{Program, SockOps};
use rustix::fd::{AsFd, OwnedFd};
use std::io;
use std::path::{Path, PathBuf};

/// The program, attached; dropping it detaches.
#[derive(Debug)]
pub struct Attached {
    /// The attachment (a `bpf_link`; dropped first, so the program stops running before the
    /// maps go).
    link: Option<SockOpsLink>,
    maps: Maps,
    cgroup: PathBuf,
    _ebpf: Ebpf,
}

impl Attached {
    /// The maps (smcd hands duplicates of them to engines).
    pub fn maps(&self) -> &Maps {
        &self.maps
    }

    /// The cgroup the program is attached to.
    pub fn cgroup(&self) -> &Path {
        &self.cgroup
    }

    /// Detaches the program now (also what dropping does).
    pub fn detach(mut self) {
        self.link.take();
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        self.link.take();
    }
}

/// `what: e: its source: ...` (aya's errors keep the errno in their sources).
fn err(what: &str, e: impl std::error::Error) -> io::Error {
    let mut msg = format!("{what}: {e}");
    let mut src = e.source();
    while let Some(s) = src {
        msg.push_str(&format!(": {s}"));
        src = s.source();
    }
    io::Error::other(msg)
}

fn err_msg(what: &str, m: String) -> io::Error {
    io::Error::other(format!("{what}: {m}"))
}

/// A duplicate of map `name`'s descriptor (aya keeps its own: the loaded program refers to
/// the map by it, so the map stays in `ebpf`).
fn map_fd(ebpf: &Ebpf, name: &str) -> io::Result<OwnedFd> {
    let data: &MapData = match ebpf.map(name) {
        Some(Map::SkStorage(m)) | Some(Map::HashMap(m)) => m,
        Some(_) => return Err(err_msg("map", format!("{name} has an unexpected type"))),
        None => return Err(err_msg("map", format!("{name} missing from the object"))),
    };
    let fd = rustix::io::fcntl_dupfd_cloexec(data.fd().as_fd(), 0)?;
    Ok(fd)
}

/// Loads the program and attaches it to the cgroup v2 directory `cgroup` (every TCP socket
/// created by a process in it or below runs it). Errors say which step failed and why
/// (no privilege, no BTF, an old kernel, no such cgroup).
pub fn attach(cgroup: &Path) -> io::Result<Attached> {
    let dir = std::fs::File::open(cgroup).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("opening cgroup {}: {e}", cgroup.display()),
        )
    })?;
    if !is_cgroup2(cgroup) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a cgroup v2 directory", cgroup.display()),
        ));
    }
    // aya reads sections with alignment it does not check for itself: give it a heap copy.
    let object = OBJECT.to_vec();
    let mut ebpf = aya::EbpfLoader::new()
        .load(&object)
        .map_err(|e| err("loading the BPF object", e))?;
    let maps = Maps::from_fds(map_fd(&ebpf, MAP_SK)?, map_fd(&ebpf, MAP_LISTENERS)?)?;
    let prog: &mut SockOps = match ebpf.program_mut(PROGRAM) {
        Some(p @ Program::SockOps(_)) => p.try_into().map_err(|e| err("program", e))?,
        _ => {
            return Err(err_msg(
                "program",
                format!("{PROGRAM} missing from the object"),
            ));
        }
    };
    prog.load()
        .map_err(|e| err("loading the sock_ops program", e))?;
    // A bpf_link (kernels from 5.7; the header-option helpers need 5.10 anyway) always runs
    // beside the cgroup's other sock_ops programs and other smcd instances' (each with maps of
    // its own); `Single` is the link's flags word 0, which BPF_LINK_CREATE requires.
    let id = prog
        .attach(&dir, CgroupAttachMode::Single)
        .map_err(|e| err(&format!("attaching to {}", cgroup.display()), e))?;
    let link = prog.take_link(id).map_err(|e| err("taking the link", e))?;
    Ok(Attached {
        link: Some(link),
        maps,
        cgroup: cgroup.to_owned(),
        _ebpf: ebpf,
    })
}

/// Whether `path` is on a cgroup2 file system.
pub fn is_cgroup2(path: &Path) -> bool {
    const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
    // f_type is i64 here, a narrower type on other targets.
    #[allow(clippy::unnecessary_cast)]
    rustix::fs::statfs(path).is_ok_and(|s| s.f_type as i64 == CGROUP2_SUPER_MAGIC)
}

/// The first cgroup2 mount of this process's mount namespace (`/proc/self/mountinfo`):
/// `/sys/fs/cgroup` on a unified host, `/sys/fs/cgroup/unified` on a hybrid one.
pub fn default_cgroup() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        // "id parent major:minor root mountpoint options [optional...] - fstype source ..."
        let (pre, post) = l.split_once(" - ")?;
        let fstype = post.split(' ').next()?;
        let mountpoint = pre.split(' ').nth(4)?;
        (fstype == "cgroup2").then(|| PathBuf::from(unescape(mountpoint)))
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape(r"/a\040b"), "/a b");
        assert_eq!(unescape(r"/plain"), "/plain");
        assert_eq!(unescape(r"/x\04"), r"/x\04");
    }

    #[test]
    fn not_a_cgroup() {
        let e = attach(Path::new("/proc")).unwrap_err();
        assert!(e.to_string().contains("not a cgroup v2"), "{e}");
        let e = attach(Path::new("/nonexistent/cgroup")).unwrap_err();
        assert!(e.to_string().contains("opening cgroup"), "{e}");
    }
}
