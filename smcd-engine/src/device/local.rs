//! An SMC-D device whose DMBs live in this process only: several [`LocalDevice`] instances
//! made from one [`LocalFabric`] play the engines of different hosts' processes. Used by unit
//! tests and data-path benchmarks that should not depend on a running `smcd`; it follows the
//! same rules as the loopback device (sealed memfds, only the named peer attaches).

use super::shm::{DmbMap, create_dmb_memfd, random_u64};
use super::{BufferProvider, Dmb, Gid, LOOPBACK_CHID, dmb_channel};
use rustix::fd::OwnedFd;
use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};

#[derive(Debug)]
struct Registered {
    memfd: OwnedFd,
    /// The attacher's end of the DMB's channel.
    chan: OwnedFd,
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

    fn register_dmb(&self, len: usize, peer: Gid) -> io::Result<Dmb> {
        let memfd = create_dmb_memfd(len)?;
        let map = DmbMap::map(&memfd, len)?;
        map.reset();
        let (owner_chan, chan) = dmb_channel()?;
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
                chan,
                len,
                peer,
            },
        );
        Ok(Dmb {
            token,
            map,
            chan: owner_chan,
        })
    }

    fn attach_dmb(&self, token: u64) -> io::Result<Dmb> {
        let dmbs = self.fabric.dmbs.lock().unwrap_or_else(|e| e.into_inner());
        let r = dmbs.get(&token).ok_or_else(|| {
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
        let chan = rustix::io::fcntl_dupfd_cloexec(&r.chan, 0)?;
        Ok(Dmb { token, map, chan })
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
