//! Prints one sample of every message kind the crate emits, one line each: `NAME HEX`
//! (upper-case name without spaces, lowercase contiguous hex).
//!
//! ```text
//! cargo run -p smc-proto --example samples
//! ```
//!
//! Every line is built from a repr and the crate's own emit function, so it shows what the
//! crate really puts on the wire. The SMC-D CDC line is host byte order by design, so it
//! differs between little- and big-endian machines.
//!
//! Layout for whoever adds a family: one `fn <family>_samples() -> Vec<Sample>` per message
//! family, listed in [`all_samples`], and one [`SampleRepr`] variant holding that family's repr.
//! `tests/tshark_decode.rs` includes this file (`#[path]`) and checks each sample's bytes against
//! Wireshark's decode field by field, so keep the repr next to the bytes.

use smc_proto::cdc::{ConnStateFlags, Cursor, ProducerFlags, SmcdCdcRepr, SmcrCdcRepr};
use smc_proto::llc::{
    AddLink, AddLinkCont, AddLinkContRkey, AddLinkRejectReason, ConfirmLink, ConfirmRkey,
    ConfirmRkeyCont, DeleteLink, DeleteLinkReason, DeleteRkey, LlcFlags, LlcMessage, ReqAddLink,
    Rtoken, TestLink,
};

/// The typed value a sample was emitted from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SampleRepr {
    /// SMC-R CDC (44 bytes, big endian).
    SmcrCdc(SmcrCdcRepr),
    /// SMC-D CDC (32-byte DMB header, host order).
    SmcdCdc(SmcdCdcRepr),
    /// An LLC message.
    Llc(LlcMessage),
}

/// One sample: its printed name, the repr, and the bytes the crate emitted for it.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Upper-case name without spaces.
    pub name: &'static str,
    /// What was emitted.
    pub repr: SampleRepr,
    /// The emitted bytes.
    pub bytes: Vec<u8>,
}

/// Every sample, family by family.
pub fn all_samples() -> Vec<Sample> {
    let mut v = cdc_samples();
    v.extend(llc_samples());
    v
}

/// The CDC samples: one SMC-R CDC with flags set, one SMC-D CDC.
pub fn cdc_samples() -> Vec<Sample> {
    let smcr = SmcrCdcRepr {
        seqno: 0x0102,
        token: 0x0a0b_0c0d,
        prod: Cursor::new(3, 0x4000),
        cons: Cursor::new(2, 0x0100),
        prod_flags: ProducerFlags::WRITE_BLOCKED | ProducerFlags::CONS_CURS_UPD_REQ,
        conn_flags: ConnStateFlags::PEER_DONE_WRITING,
    };
    let smcd = SmcdCdcRepr {
        prod: Cursor::new(1, 0x2000),
        cons: Cursor::new(0, 0x0080),
        prod_flags: ProducerFlags::URG_DATA_PENDING | ProducerFlags::URG_DATA_PRESENT,
        conn_flags: ConnStateFlags::PEER_CONN_CLOSED,
    };
    vec![
        Sample {
            name: "SMCR_CDC",
            repr: SampleRepr::SmcrCdc(smcr),
            bytes: smcr.to_bytes().to_vec(),
        },
        Sample {
            name: "SMCD_CDC",
            repr: SampleRepr::SmcdCdc(smcd),
            bytes: smcd.to_bytes().to_vec(),
        },
    ]
}

const SERVER_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x00, 0x01];
const CLIENT_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x00, 0x02];
/// RoCE GIDs as a Linux RoCEv1/v2 GID table holds them (link-local, from the MAC).
const SERVER_GID: [u8; 16] = [
    0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x00, 0x00, 0x00, 0xff, 0xfe, 0x00, 0x00, 0x01,
];
const CLIENT_GID: [u8; 16] = [
    0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x00, 0x00, 0x00, 0xff, 0xfe, 0x00, 0x00, 0x02,
];
/// RoCEv2 IPv4-mapped GIDs, as an SMC-Rv2 client lists them in REQUEST_ADD_LINK.
const V2_GID_A: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2];
const V2_GID_B: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 1, 2];

/// The LLC samples: each type as a request and, where Linux answers, a response.
pub fn llc_samples() -> Vec<Sample> {
    let resp = LlcFlags::RESPONSE;
    let confirm_link = ConfirmLink {
        flags: LlcFlags::NO_RMBE_EYECATCHER,
        mac: SERVER_MAC,
        gid: SERVER_GID,
        qpn: 0x00_0107,
        link_num: 1,
        link_uid: 0x1122_3345,
        max_links: 2,
        max_conns: 0,
    };
    let add_link = AddLink {
        flags: LlcFlags::EMPTY,
        reject_reason: AddLinkRejectReason::NoReason,
        mac: SERVER_MAC,
        gid: SERVER_GID,
        qpn: 0x00_0208,
        link_num: 2,
        qp_mtu: 3,
        initial_psn: 0x00ab_cdef,
    };
    let add_link_cont = AddLinkCont {
        flags: LlcFlags::EMPTY,
        link_num: 2,
        num_rkeys: 3,
        rkeys: [
            AddLinkContRkey {
                rkey: 0x0000_1001,
                rkey_new: 0x0000_2001,
                vaddr_new: 0x0000_7f00_1000_0000,
            },
            AddLinkContRkey {
                rkey: 0x0000_1002,
                rkey_new: 0x0000_2002,
                vaddr_new: 0x0000_7f00_2000_0000,
            },
        ],
    };
    let confirm_rkey = ConfirmRkey {
        flags: LlcFlags::EMPTY,
        num_others: 1,
        rkey: 0x0000_3003,
        vaddr: 0x0000_7f00_3000_0000,
        others: [
            Rtoken {
                link_id: 2,
                rkey: 0x0000_4004,
                vaddr: 0x0000_7f00_4000_0000,
            },
            Rtoken::default(),
        ],
    };
    let confirm_rkey_cont = ConfirmRkeyCont {
        flags: LlcFlags::EMPTY,
        num_rkeys: 2,
        rtokens: [
            Rtoken {
                link_id: 1,
                rkey: 0x0000_5005,
                vaddr: 0x0000_7f00_5000_0000,
            },
            Rtoken {
                link_id: 2,
                rkey: 0x0000_6006,
                vaddr: 0x0000_7f00_6000_0000,
            },
            Rtoken::default(),
        ],
    };
    let test_link = TestLink {
        flags: LlcFlags::EMPTY,
        user_data: *b"smc-proto tlink!",
    };
    let delete_rkey = DeleteRkey {
        flags: LlcFlags::EMPTY,
        num_rkeys: 2,
        err_mask: 0,
        rkeys: [0x0000_3003, 0x0000_4004, 0, 0, 0, 0, 0, 0],
    };

    let msgs: Vec<(&'static str, LlcMessage)> = vec![
        ("LLC_CONFIRM_LINK", LlcMessage::ConfirmLink(confirm_link)),
        (
            "LLC_CONFIRM_LINK_RESP",
            LlcMessage::ConfirmLink(ConfirmLink {
                flags: resp | LlcFlags::NO_RMBE_EYECATCHER,
                mac: CLIENT_MAC,
                gid: CLIENT_GID,
                qpn: 0x00_0109,
                link_uid: 0x1122_3345,
                ..confirm_link
            }),
        ),
        ("LLC_ADD_LINK", LlcMessage::AddLink(add_link)),
        (
            "LLC_ADD_LINK_RESP",
            LlcMessage::AddLink(AddLink {
                flags: resp,
                mac: CLIENT_MAC,
                gid: CLIENT_GID,
                qpn: 0x00_020a,
                initial_psn: 0x0012_3456,
                ..add_link
            }),
        ),
        (
            "LLC_ADD_LINK_RESP_REJECT",
            LlcMessage::AddLink(AddLink {
                flags: resp | LlcFlags::ADD_LINK_REJECT,
                reject_reason: AddLinkRejectReason::NoAlternatePath,
                ..add_link
            }),
        ),
        ("LLC_ADD_LINK_CONT", LlcMessage::AddLinkCont(add_link_cont)),
        (
            "LLC_ADD_LINK_CONT_RESP",
            LlcMessage::AddLinkCont(AddLinkCont {
                flags: resp,
                num_rkeys: 1,
                rkeys: [
                    AddLinkContRkey {
                        rkey: 0x0000_1101,
                        rkey_new: 0x0000_2101,
                        vaddr_new: 0x0000_7f10_1000_0000,
                    },
                    AddLinkContRkey::default(),
                ],
                ..add_link_cont
            }),
        ),
        (
            "LLC_DELETE_LINK",
            LlcMessage::DeleteLink(DeleteLink {
                flags: LlcFlags::DELETE_LINK_ALL | LlcFlags::DELETE_LINK_ORDERLY,
                link_num: 0,
                reason: DeleteLinkReason::ProgramInitiated,
            }),
        ),
        (
            "LLC_DELETE_LINK_RESP",
            LlcMessage::DeleteLink(DeleteLink {
                flags: resp,
                link_num: 2,
                reason: DeleteLinkReason::UnknownLink,
            }),
        ),
        (
            "LLC_REQ_ADD_LINK",
            LlcMessage::ReqAddLink(ReqAddLink {
                flags: LlcFlags::EMPTY,
                gids: vec![V2_GID_A, V2_GID_B],
            }),
        ),
        (
            "LLC_REQ_ADD_LINK_RESP",
            LlcMessage::ReqAddLink(ReqAddLink {
                flags: resp,
                gids: vec![],
            }),
        ),
        ("LLC_CONFIRM_RKEY", LlcMessage::ConfirmRkey(confirm_rkey)),
        (
            "LLC_CONFIRM_RKEY_RESP",
            LlcMessage::ConfirmRkey(ConfirmRkey {
                flags: resp,
                ..confirm_rkey
            }),
        ),
        (
            "LLC_CONFIRM_RKEY_RESP_NEG",
            LlcMessage::ConfirmRkey(ConfirmRkey {
                flags: resp | LlcFlags::RKEY_NEGATIVE | LlcFlags::RKEY_RETRY,
                ..confirm_rkey
            }),
        ),
        ("LLC_TEST_LINK", LlcMessage::TestLink(test_link)),
        (
            "LLC_TEST_LINK_RESP",
            LlcMessage::TestLink(TestLink {
                flags: resp,
                ..test_link
            }),
        ),
        (
            "LLC_CONFIRM_RKEY_CONT",
            LlcMessage::ConfirmRkeyCont(confirm_rkey_cont),
        ),
        (
            "LLC_CONFIRM_RKEY_CONT_RESP",
            LlcMessage::ConfirmRkeyCont(ConfirmRkeyCont {
                flags: resp,
                ..confirm_rkey_cont
            }),
        ),
        ("LLC_DELETE_RKEY", LlcMessage::DeleteRkey(delete_rkey)),
        (
            "LLC_DELETE_RKEY_RESP_NEG",
            LlcMessage::DeleteRkey(DeleteRkey {
                flags: resp | LlcFlags::RKEY_NEGATIVE,
                err_mask: 0x40,
                ..delete_rkey
            }),
        ),
    ];
    msgs.into_iter()
        .map(|(name, m)| Sample {
            name,
            bytes: m.to_bytes(),
            repr: SampleRepr::Llc(m),
        })
        .collect()
}

/// Lowercase contiguous hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn main() {
    for s in all_samples() {
        println!("{} {}", s.name, hex(&s.bytes));
    }
}
