//! The loopback ISM device as an engine sees it (the kernel's `smc_loopback.c`): DMBs that
//! `smcd` creates and hands out over the engine's session.

use super::shm::DmbMap;
use super::{BufferProvider, Dmb, Gid};
use crate::ipc::SmcdSession;
use rustix::fd::{BorrowedFd, OwnedFd};
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

    /// The DMB a reply describes: its memfd, then (`chan`: an attach reply may carry one)
    /// the bell channel end its owner handed over.
    fn dmb_from_reply(
        r: &LoopbackMessage,
        fds: Vec<OwnedFd>,
        token: u64,
        chan: bool,
    ) -> io::Result<(Dmb, Option<OwnedFd>)> {
        let size = r
            .size()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "DMB reply lacks size"))?
            as usize;
        let most = 1 + usize::from(chan);
        if fds.is_empty() || fds.len() > most {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "DMB reply carried {} descriptors, expected 1 to {most}",
                    fds.len()
                ),
            ));
        }
        let mut fds = fds.into_iter();
        let memfd = fds.next().expect("one fd");
        let map = DmbMap::map(&memfd, size)?;
        let owner_uid = r.owner_uid();
        Ok((
            Dmb {
                token,
                map,
                owner_uid,
            },
            fds.next(),
        ))
    }
}

impl BufferProvider for LoopbackDevice {
    fn gid(&self) -> Gid {
        self.session.info().gid
    }

    fn chid(&self) -> u16 {
        self.session.info().chid
    }

    fn register_dmb(
        &self,
        len: usize,
        peer: Gid,
        handover: Option<BorrowedFd<'_>>,
    ) -> io::Result<Dmb> {
        self.session.with_channel(|ch| {
            let (r, fds) = ch.request(
                LoopbackMessage::new(
                    LoopbackCmd::DmbRegister,
                    vec![LoopbackAttr::Size(len as u32), LoopbackAttr::PeerGid(peer)],
                ),
                handover.as_slice(),
            )?;
            let token = r.token().ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidData, "DMB reply lacks token")
            })?;
            let (dmb, _) = Self::dmb_from_reply(&r, fds, token, false)?;
            dmb.map.reset();
            Ok(dmb)
        })
    }

    fn attach_dmb(&self, token: u64) -> io::Result<(Dmb, Option<OwnedFd>)> {
        self.session.with_channel(|ch| {
            let (r, fds) = ch.request(
                LoopbackMessage::new(LoopbackCmd::DmbAttach, vec![LoopbackAttr::Token(token)]),
                &[],
            )?;
            Self::dmb_from_reply(&r, fds, token, true)
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
