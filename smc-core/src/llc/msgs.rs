//! The messages the flows send, filled as the kernel's `smc_llc_send_*` fill them.

use super::{Link, LocalPort};
use alloc::vec::Vec;
use smc_proto::llc::{
    AddLink, AddLinkCont, AddLinkContRkey, AddLinkRejectReason, AddLinkV2, AddLinkV2Ext,
    ConfirmLink, ConfirmRkey, DeleteLink, DeleteLinkReason, DeleteRkey, LlcFlags, LlcMessage,
    ReqAddLink, Rtoken, TestLink,
};

/// `smc_llc_send_confirm_link`: flags 0x03 (no RMBE eyecatchers), 0x83 as a response;
/// `max_conns` is 0 unless an SMC-Rv2.1 group negotiated it.
pub(super) fn confirm_link(link: &Link, resp: bool, max_links: u8, max_conns: u8) -> LlcMessage {
    let mut flags = LlcFlags::NO_RMBE_EYECATCHER;
    if resp {
        flags |= LlcFlags::RESPONSE;
    }
    LlcMessage::ConfirmLink(ConfirmLink {
        flags,
        mac: link.port.mac,
        gid: link.port.gid,
        qpn: link.qpn,
        link_num: link.link_id,
        link_uid: link.link_uid,
        max_links,
        max_conns,
    })
}

/// `smc_llc_send_add_link` for a new link: the request announces our path MTU, the response
/// the smaller of ours and the peer's.
pub(super) fn add_link(new: &Link, resp: bool) -> LlcMessage {
    let qp_mtu = match (resp, new.peer) {
        (true, Some(p)) => new.port.path_mtu.min(p.mtu),
        _ => new.port.path_mtu,
    };
    LlcMessage::AddLink(AddLink {
        flags: if resp {
            LlcFlags::RESPONSE
        } else {
            LlcFlags::EMPTY
        },
        reject_reason: AddLinkRejectReason::NoReason,
        mac: new.port.mac,
        gid: new.port.gid,
        qpn: new.qpn,
        link_num: new.link_id,
        qp_mtu,
        initial_psn: new.psn,
    })
}

/// `smc_llc_send_add_link` in a v2 group: the base message and the extension with the new
/// link's GID and, for each RMB, its rkey on the old link and its rkey and address on the new
/// one (`smc_llc_fill_ext_v2`).
pub(super) fn add_link_v2(
    new: &Link,
    resp: bool,
    v2_direct: bool,
    rkeys: Vec<AddLinkContRkey>,
) -> LlcMessage {
    let LlcMessage::AddLink(link) = add_link(new, resp) else {
        unreachable!("add_link builds an ADD_LINK")
    };
    LlcMessage::AddLinkV2(AddLinkV2 {
        link,
        ext: Some(AddLinkV2Ext {
            v2_direct,
            client_target_gid: new.port.gid,
            rkeys,
        }),
    })
}

/// `smc_llc_send_request_add_link`: the GIDs the client could use for a new link, its
/// current one first.
pub(super) fn req_add_link(gids: Vec<[u8; 16]>) -> LlcMessage {
    LlcMessage::ReqAddLink(ReqAddLink {
        flags: LlcFlags::EMPTY,
        gids,
    })
}

/// An ADD_LINK's base message and, for a v2 ADD_LINK with the extension, its rkeys.
pub(super) fn add_link_parts(msg: &LlcMessage) -> Option<(AddLink, Option<Vec<AddLinkContRkey>>)> {
    match msg {
        LlcMessage::AddLink(a) => Some((*a, None)),
        LlcMessage::AddLinkV2(a) => Some((a.link, a.ext.as_ref().map(|e| e.rkeys.clone()))),
        _ => None,
    }
}

/// The client's invite (`smc_llc_cli_add_link_invite`): a request naming only the alternate
/// port.
pub(super) fn add_link_invite(port: &LocalPort) -> LlcMessage {
    LlcMessage::AddLink(AddLink {
        mac: port.mac,
        gid: port.gid,
        ..AddLink::default()
    })
}

/// `smc_llc_cli_add_link_reject`: the server's request sent back with the response and
/// reject flags and reason "no alternate path".
pub(super) fn add_link_reject(req: &AddLink) -> LlcMessage {
    LlcMessage::AddLink(AddLink {
        flags: req.flags | LlcFlags::RESPONSE | LlcFlags::ADD_LINK_REJECT,
        reject_reason: AddLinkRejectReason::NoAlternatePath,
        ..*req
    })
}

/// `smc_llc_is_local_add_link`: an ADD_LINK whose body is all zeros is the group's own
/// trigger, not a server's request (the kernel looks at the 40 body bytes; the reserved ones
/// are not kept by the codec).
pub(super) fn is_empty_add_link(a: &AddLink) -> bool {
    a.mac == [0; 6]
        && a.gid == [0; 16]
        && a.qpn == 0
        && a.link_num == 0
        && a.qp_mtu == 0
        && a.initial_psn == 0
}

/// One ADD_LINK_CONT (`smc_llc_add_link_cont`): `num_rkeys` is what is still to send
/// including this message's entries; the client sets the response flag.
pub(super) fn add_link_cont(
    link_num: u8,
    num_rkeys: u8,
    rkeys: [AddLinkContRkey; 2],
    resp: bool,
) -> LlcMessage {
    LlcMessage::AddLinkCont(AddLinkCont {
        flags: if resp {
            LlcFlags::RESPONSE
        } else {
            LlcFlags::EMPTY
        },
        link_num,
        num_rkeys,
        rkeys,
    })
}

/// `smc_llc_send_delete_link`: link id 0 means all links (flag 0x40).
pub(super) fn delete_link(
    link_num: u8,
    resp: bool,
    orderly: bool,
    reason: DeleteLinkReason,
) -> LlcMessage {
    let mut flags = LlcFlags::EMPTY;
    if resp {
        flags |= LlcFlags::RESPONSE;
    }
    if orderly {
        flags |= LlcFlags::DELETE_LINK_ORDERLY;
    }
    if link_num == 0 {
        flags |= LlcFlags::DELETE_LINK_ALL;
    }
    LlcMessage::DeleteLink(DeleteLink {
        flags,
        link_num,
        reason,
    })
}

/// `smc_llc_send_test_link`.
pub(super) fn test_link(flags: LlcFlags, user_data: [u8; 16]) -> LlcMessage {
    LlcMessage::TestLink(TestLink { flags, user_data })
}

/// `smc_llc_send_confirm_rkey`: the sending link's key first, its first byte counting the
/// other links' rtokens.
pub(super) fn confirm_rkey(own: super::RmbKey, others: &[Rtoken]) -> LlcMessage {
    let mut o = [Rtoken::default(); 2];
    for (slot, r) in o.iter_mut().zip(others) {
        *slot = *r;
    }
    LlcMessage::ConfirmRkey(ConfirmRkey {
        flags: LlcFlags::EMPTY,
        num_others: others.len().min(2) as u8,
        rkey: own.rkey,
        vaddr: own.vaddr,
        others: o,
    })
}

/// `smc_llc_send_delete_rkey`: one rkey.
pub(super) fn delete_rkey(rkey: u32) -> LlcMessage {
    let mut rkeys = [0u32; 8];
    rkeys[0] = rkey;
    LlcMessage::DeleteRkey(DeleteRkey {
        flags: LlcFlags::EMPTY,
        num_rkeys: 1,
        err_mask: 0,
        rkeys,
    })
}

/// The same message with the response flag (the kernel answers many requests by setting
/// 0x80 on the received buffer and sending it back).
pub(super) fn with_response(msg: LlcMessage) -> LlcMessage {
    let r = LlcFlags::RESPONSE;
    match msg {
        LlcMessage::ConfirmLink(mut m) => {
            m.flags |= r;
            LlcMessage::ConfirmLink(m)
        }
        LlcMessage::AddLink(mut m) => {
            m.flags |= r;
            LlcMessage::AddLink(m)
        }
        LlcMessage::AddLinkCont(mut m) => {
            m.flags |= r;
            LlcMessage::AddLinkCont(m)
        }
        LlcMessage::DeleteLink(mut m) => {
            m.flags |= r;
            LlcMessage::DeleteLink(m)
        }
        LlcMessage::ReqAddLink(mut m) => {
            m.flags |= r;
            LlcMessage::ReqAddLink(m)
        }
        LlcMessage::ConfirmRkey(mut m) => {
            m.flags |= r;
            LlcMessage::ConfirmRkey(m)
        }
        LlcMessage::TestLink(mut m) => {
            m.flags |= r;
            LlcMessage::TestLink(m)
        }
        LlcMessage::ConfirmRkeyCont(mut m) => {
            m.flags |= r;
            LlcMessage::ConfirmRkeyCont(m)
        }
        LlcMessage::DeleteRkey(mut m) => {
            m.flags |= r;
            LlcMessage::DeleteRkey(m)
        }
        LlcMessage::ConfirmLinkV2(mut m) => {
            m.flags |= r;
            LlcMessage::ConfirmLinkV2(m)
        }
        LlcMessage::AddLinkV2(mut m) => {
            m.link.flags |= r;
            LlcMessage::AddLinkV2(m)
        }
        LlcMessage::DeleteLinkV2(mut m) => {
            m.flags |= r;
            LlcMessage::DeleteLinkV2(m)
        }
        LlcMessage::ConfirmRkeyV2(mut m) => {
            m.flags |= r;
            LlcMessage::ConfirmRkeyV2(m)
        }
        LlcMessage::TestLinkV2(mut m) => {
            m.flags |= r;
            LlcMessage::TestLinkV2(m)
        }
        LlcMessage::DeleteRkeyV2(mut m) => {
            m.flags |= r;
            LlcMessage::DeleteRkeyV2(m)
        }
        other @ LlcMessage::Raw(_) => other,
    }
}
