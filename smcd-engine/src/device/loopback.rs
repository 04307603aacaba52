//! The loopback ISM device as an engine sees it (the kernel's `smc_loopback.c`): DMBs that
//! `smcd` creates and hands out over the engine's session, each with its channel.

use super::shm::DmbMap;
use super::{BufferProvider, Dmb, Gid};
use crate::ipc::SmcdSession;
use smc_proto::netlink::loopback::{LoopbackAttr, LoopbackCmd, LoopbackMessage};
use std::io;
use std::sync::Arc;

/// The loopback-ism device of an engine registered with `smcd`.
#[derive(Debug)]
pub struct LoopbackDevice {
    session: Arc<SmcdSession>,
}

impl LoopbackDevice {
    /// The device behind `session`.
    pub fn new(session: Arc<SmcdSession>) -> Self {
        Self { session }
    }

    fn dmb_from_reply(
        r: &LoopbackMessage,
        mut fds: Vec<rustix::fd::OwnedFd>,
        token: u64,
    ) -> io::Result<Dmb> {
        let size = r
            .size()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "DMB reply lacks size"))?
            as usize;
        if fds.len() != 2 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("DMB reply carried {} descriptors, expected 2", fds.len()),
            ));
        }
        let chan = fds.pop().expect("two fds");
        let memfd = fds.pop().expect("two fds");
        let map = DmbMap::map(&memfd, size)?;
        Ok(Dmb { token, map, chan })
    }
}

impl BufferProvider for LoopbackDevice {
    fn gid(&self) -> Gid {
        self.session.info().gid
    }

    fn chid(&self) -> u16 {
        self.session.info().chid
    }

    fn register_dmb(&self, len: usize, peer: Gid) -> io::Result<Dmb> {
        self.session.with_channel(|ch| {
            let (r, fds) = ch.request(
                LoopbackMessage::new(
                    LoopbackCmd::DmbRegister,
                    vec![LoopbackAttr::Size(len as u32), LoopbackAttr::PeerGid(peer)],
                ),
                &[],
            )?;
            let token = r.token().ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidData, "DMB reply lacks token")
            })?;
            let dmb = Self::dmb_from_reply(&r, fds, token)?;
            dmb.map.reset();
            Ok(dmb)
        })
    }

    fn attach_dmb(&self, token: u64) -> io::Result<Dmb> {
        self.session.with_channel(|ch| {
            let (r, fds) = ch.request(
                LoopbackMessage::new(LoopbackCmd::DmbAttach, vec![LoopbackAttr::Token(token)]),
                &[],
            )?;
            Self::dmb_from_reply(&r, fds, token)
        })
    }

    fn unregister_dmb(&self, token: u64) {
        let _ = self.session.with_channel(|ch| {
            ch.notify(
                LoopbackMessage::new(LoopbackCmd::DmbUnregister, vec![LoopbackAttr::Token(token)]),
                &[],
            )
        });
    }
}

/// The ISM devices `smcd` provides to an engine (today: loopback-ism).
pub fn smcd_devices(session: &Arc<SmcdSession>) -> Vec<Arc<dyn BufferProvider>> {
    vec![Arc::new(LoopbackDevice::new(Arc::clone(session)))]
}
