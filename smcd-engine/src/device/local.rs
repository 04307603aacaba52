//! An SMC-D device whose DMBs live in this process only: several [`LocalDevice`] instances
//! made from one [`LocalFabric`] play the engines of different hosts' processes. Used by unit
//! tests and data-path benchmarks that should not depend on a running `smcd`; it follows the
//! same rules as the loopback device (sealed memfds, only the named peer attaches).

use super::shm::{DmbMap, create_dmb_memfd, random_u64};
use super::{BufferProvider, Dmb, Gid, LOOPBACK_CHID};
use rustix::fd::{BorrowedFd, OwnedFd};
use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};

#[derive(Debug)]
struct Registered {
    memfd: OwnedFd,
    /// The bell channel end handed over with it, until the first attach.
    handover: Option<OwnedFd>,
    len: usize,
    peer: Gid,
}

/// The shared registry several local device instances attach through.
#[derive(Debug, Default, Clone)]
pub struct LocalFabric {
    dmbs: Arc<Mutex<HashMap<u64, Registered>>>,
}

impl LocalFabric {
    /// An empty fabric.
    pub fn new() -> Self {
        Self::default()
    }

    /// A device instance with a fresh random GID.
    pub fn device(&self) -> LocalDevice {
        LocalDevice {
            fabric: self.clone(),
            gid: (u128::from(random_u64()) << 64) | u128::from(random_u64()),
        }
    }

    /// How many DMBs are registered.
    pub fn registered(&self) -> usize {
        self.dmbs.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// One instance of the in-process device.
#[derive(Debug, Clone)]
pub struct LocalDevice {
    fabric: LocalFabric,
    gid: Gid,
}

impl BufferProvider for LocalDevice {
    fn gid(&self) -> Gid {
        self.gid
    }

    fn chid(&self) -> u16 {
        LOOPBACK_CHID
    }

    fn register_dmb(
        &self,
        len: usize,
        peer: Gid,
        handover: Option<BorrowedFd<'_>>,
    ) -> io::Result<Dmb> {
        let memfd = create_dmb_memfd(len)?;
        let map = DmbMap::map(&memfd, len)?;
        map.reset();
        let handover = handover
            .map(|fd| rustix::io::fcntl_dupfd_cloexec(fd, 0))
            .transpose()?;
        let mut dmbs = self.fabric.dmbs.lock().unwrap_or_else(|e| e.into_inner());
        let token = loop {
            let t = random_u64();
            if !dmbs.contains_key(&t) {
                break t;
            }
        };
        dmbs.insert(
            token,
            Registered {
                memfd,
                handover,
                len,
                peer,
            },
        );
        Ok(Dmb {
            token,
            map,
            owner_uid: None,
        })
    }

    fn attach_dmb(&self, token: u64) -> io::Result<(Dmb, Option<OwnedFd>)> {
        let mut dmbs = self.fabric.dmbs.lock().unwrap_or_else(|e| e.into_inner());
        let r = dmbs.get_mut(&token).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("no DMB with token {token:#x}"),
            )
        })?;
        if r.peer != self.gid {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "DMB belongs to another peer",
            ));
        }
        let map = DmbMap::map(&r.memfd, r.len)?;
        // Every device of the in-process fabric serves this process.
        let owner_uid = Some(rustix::process::geteuid().as_raw());
        Ok((
            Dmb {
                token,
                map,
                owner_uid,
            },
            r.handover.take(),
        ))
    }

    fn unregister_dmb(&self, token: u64) {
        self.fabric
            .dmbs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conformance() {
        let fabric = LocalFabric::new();
        let (a, b, c) = (fabric.device(), fabric.device(), fabric.device());
        super::super::conformance::run(&a, &b, &c);
        assert_eq!(fabric.registered(), 0);
    }
}
