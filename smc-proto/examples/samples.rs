//! Prints one sample of every message kind the crate emits, one line each: `NAME HEX`
//! (upper-case name without spaces, lowercase contiguous hex).
//!
//! ```text
//! cargo run -p smc-proto --example samples
//! ```
//!
//! Families, in this order: CDC (SMC-R and SMC-D), LLC (every type, requests and responses),
//! CLC (Proposals for SMC-R/SMC-D v1 and v2, Accept and Confirm for SMC-R/SMC-D v1 and v2,
//! Declines v1 and v2).
//!
//! Every line is built from a repr and the crate's own emit function, so it shows what the
//! crate really puts on the wire. The SMC-D CDC line is host byte order by design, so it
//! differs between little- and big-endian machines (so does the REQ_ADD_LINK length); every
//! CLC line is big endian everywhere.
//!
//! Layout for whoever adds a family: one `fn <family>_samples() -> Vec<Sample>` per message
//! family, listed in [`all_samples`], and one [`SampleRepr`] variant holding that family's repr.
//! `tests/tshark_decode.rs` includes this file (`#[path]`) and checks each sample's bytes against
//! Wireshark's decode field by field, so keep the repr next to the bytes.

use core::net::{Ipv4Addr, Ipv6Addr};

use smc_proto::cdc::{ConnStateFlags, Cursor, ProducerFlags, SmcdCdcRepr, SmcrCdcRepr};
use smc_proto::clc::{
    AcceptConfirm, ClcMessage, Decline, Eid, FirstContactExt, Hostname, IpPrefixArea, Ipv6Prefix,
    LOOPBACK_CHID, Proposal, ProposalBuilder, ReasonCode, SMC_FEATURE_MASK, SMC_RELEASE_1, SMC_V1,
    SMC_V2, SmcType, SmcdAcceptConfirm, SmcdDevice, SmcrAcceptConfirm, SmcrV1Offer, SmcrV2Offer,
};
use smc_proto::llc::{
    AddLink, AddLinkCont, AddLinkContRkey, AddLinkRejectReason, AddLinkV2, AddLinkV2Ext,
    ConfirmLink, ConfirmRkey, ConfirmRkeyCont, DeleteLink, DeleteLinkReason, DeleteRkey,
    DeleteRkeyV2, LlcFlags, LlcMessage, ReqAddLink, Rtoken, TestLink,
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
    /// A CLC message (TCP payload, big endian).
    Clc(ClcMessage),
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
    v.extend(clc_samples());
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
        // SMC-Rv2 link groups (`smc_llc_init_msg_hdr`): the same bodies behind a v2 header
        // with a host-order 16-bit length; ADD_LINK with its rkey extension; DELETE_RKEY v2.
        (
            "LLC_V2_CONFIRM_LINK",
            LlcMessage::ConfirmLinkV2(ConfirmLink {
                max_conns: 255,
                ..confirm_link
            }),
        ),
        (
            "LLC_V2_CONFIRM_LINK_RESP",
            LlcMessage::ConfirmLinkV2(ConfirmLink {
                flags: resp | LlcFlags::NO_RMBE_EYECATCHER,
                max_conns: 255,
                ..confirm_link
            }),
        ),
        (
            "LLC_V2_ADD_LINK",
            LlcMessage::AddLinkV2(AddLinkV2 {
                link: AddLink {
                    gid: V2_GID_B,
                    ..add_link
                },
                ext: Some(AddLinkV2Ext {
                    v2_direct: true,
                    client_target_gid: V2_GID_B,
                    rkeys: vec![
                        AddLinkContRkey {
                            rkey: 0x0000_1234,
                            rkey_new: 0x0000_5678,
                            vaddr_new: 0x0000_7f00_dead_0000,
                        },
                        AddLinkContRkey {
                            rkey: 0x0000_1235,
                            rkey_new: 0x0000_5679,
                            vaddr_new: 0x0000_7f00_beef_0000,
                        },
                        AddLinkContRkey {
                            rkey: 0x0000_1236,
                            rkey_new: 0x0000_567a,
                            vaddr_new: 0x0000_7f00_f00d_0000,
                        },
                    ],
                }),
            }),
        ),
        (
            "LLC_V2_ADD_LINK_RESP",
            LlcMessage::AddLinkV2(AddLinkV2 {
                link: AddLink {
                    flags: resp,
                    gid: V2_GID_A,
                    ..add_link
                },
                ext: Some(AddLinkV2Ext {
                    v2_direct: false,
                    client_target_gid: V2_GID_A,
                    rkeys: vec![AddLinkContRkey {
                        rkey: 0x0000_4321,
                        rkey_new: 0x0000_8765,
                        vaddr_new: 0x0000_7f11_0000_0000,
                    }],
                }),
            }),
        ),
        (
            "LLC_V2_ADD_LINK_REJECT",
            LlcMessage::AddLinkV2(AddLinkV2 {
                link: AddLink {
                    flags: resp | LlcFlags::ADD_LINK_REJECT,
                    reject_reason: AddLinkRejectReason::NoReason,
                    gid: V2_GID_B,
                    ..add_link
                },
                ext: None,
            }),
        ),
        (
            "LLC_V2_DELETE_LINK",
            LlcMessage::DeleteLinkV2(DeleteLink {
                flags: LlcFlags::DELETE_LINK_ORDERLY,
                link_num: 2,
                reason: DeleteLinkReason::LostPath,
            }),
        ),
        (
            "LLC_V2_CONFIRM_RKEY",
            LlcMessage::ConfirmRkeyV2(confirm_rkey),
        ),
        (
            "LLC_V2_CONFIRM_RKEY_RESP",
            LlcMessage::ConfirmRkeyV2(ConfirmRkey {
                flags: resp,
                ..confirm_rkey
            }),
        ),
        ("LLC_V2_TEST_LINK", LlcMessage::TestLinkV2(test_link)),
        (
            "LLC_V2_TEST_LINK_RESP",
            LlcMessage::TestLinkV2(TestLink {
                flags: resp,
                ..test_link
            }),
        ),
        (
            "LLC_V2_DELETE_RKEY",
            LlcMessage::DeleteRkeyV2(DeleteRkeyV2 {
                flags: LlcFlags::EMPTY,
                num_inval_rkeys: 0,
                rkeys: vec![0x0000_1234],
            }),
        ),
        (
            "LLC_V2_DELETE_RKEY_MANY",
            LlcMessage::DeleteRkeyV2(DeleteRkeyV2 {
                flags: LlcFlags::EMPTY,
                num_inval_rkeys: 0,
                rkeys: (0..12).map(|i| 0x0000_1200 + i).collect(),
            }),
        ),
        (
            "LLC_V2_DELETE_RKEY_RESP_NEG",
            LlcMessage::DeleteRkeyV2(DeleteRkeyV2 {
                flags: resp | LlcFlags::RKEY_NEGATIVE,
                num_inval_rkeys: 1,
                rkeys: vec![0],
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

/// SMC-R system ids as Linux builds them: two random bytes, then the MAC of the first active
/// RoCE port.
const CLIENT_PEER_ID: [u8; 8] = [0x5a, 0x3c, 0x02, 0x00, 0x00, 0x00, 0x00, 0x02];
const SERVER_PEER_ID: [u8; 8] = [0xa7, 0x19, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01];
/// RoCEv2 GID of the server (IPv4-mapped 10.0.0.1); the client's is [`V2_GID_A`] (10.0.0.2).
const V2_GID_SERVER: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1];
/// Native ISM devices (s390): GIDs and PCHIDs.
const CLIENT_ISM_GID: u64 = 0x0100_0000_a1b2_c3d4;
const SERVER_ISM_GID: u64 = 0x0100_0000_e5f6_0718;
const ISM_CHID: u16 = 0x07c1;
const ISM2_GID: u64 = 0x0100_0000_5e6f_7a8b;
const ISM2_CHID: u16 = 0x07c5;
/// loopback-ism: one 128-bit GID (a random UUID) shared by both ends of a connection.
const LO_GID: u64 = 0x3f2a_91c4_5be0_4d17;
const LO_GID_EXT: u64 = 0x8e6b_02d9_f4a3_715c;

fn ueid(s: &str) -> Eid {
    Eid::new(s).expect("EIDs here are at most 32 bytes")
}

/// The CLC samples: Proposals (SMC-R v1, SMC-D v1, both v1 over IPv6, SMC-D v2 with SEID and
/// UEIDs, SMC-D v2 with loopback-ism only, SMC-R v2, and a version-1 header as pre-v2 kernels
/// sent it), Accept and Confirm for SMC-R and SMC-D in v1 and v2, and Declines v1 (28 bytes)
/// and v2 (44 bytes). Every Proposal but the legacy one is built as `smc_clc_send_proposal()`
/// builds it (header version 2; v1-only offers have `typev2` N).
pub fn clc_samples() -> Vec<Sample> {
    let smcr_client = SmcrV1Offer {
        peer_id: CLIENT_PEER_ID,
        gid: CLIENT_GID,
        mac: CLIENT_MAC,
    };
    let ipv4_area = IpPrefixArea::ipv4(Ipv4Addr::new(10, 0, 0, 0), 24);
    let ipv6_area = IpPrefixArea {
        ipv4_subnet: Ipv4Addr::UNSPECIFIED,
        ipv4_prefix_len: 0,
        ipv6_prefixes: vec![
            Ipv6Prefix {
                prefix: Ipv6Addr::new(0xfd00, 0x0a0b, 0, 0, 0, 0, 0, 0),
                prefix_len: 64,
            },
            Ipv6Prefix {
                prefix: Ipv6Addr::new(0x2001, 0x0db8, 0x0c0d, 0, 0, 0, 0, 0),
                prefix_len: 48,
            },
        ],
    };
    let built = |b: ProposalBuilder| b.build().expect("sample proposals are valid");

    let prop_smcr_v1 = built(
        ProposalBuilder::new()
            .smcr_v1(smcr_client)
            .ip_prefix(ipv4_area.clone()),
    );
    // Linux fills the CHID of the SMC-D area only for v2 offers.
    let prop_smcd_v1 = built(
        ProposalBuilder::new()
            .smcd_v1(CLIENT_ISM_GID, 0)
            .ip_prefix(ipv4_area.clone()),
    );
    let prop_both_v1 = built(
        ProposalBuilder::new()
            .smcr_v1(smcr_client)
            .smcd_v1(CLIENT_ISM_GID, 0)
            .ip_prefix(ipv6_area),
    );
    // s390 with a native ISMv2 device (in the SMC-D area, also offered for v1), a second ISM
    // device and loopback-ism (two entries), two user EIDs and the system EID.
    let prop_smcd_v2 = built(
        ProposalBuilder::new()
            .smcd_v1(CLIENT_ISM_GID, ISM_CHID)
            .ip_prefix(ipv4_area.clone())
            .smcd_v2_device(SmcdDevice {
                gid: ISM2_GID,
                gid_ext: None,
                chid: ISM2_CHID,
            })
            .smcd_v2_device(SmcdDevice::loopback(LO_GID, LO_GID_EXT))
            .user_eid(ueid("SMC-PROTO.UEID1"))
            .user_eid(ueid("SMC-PROTO.UEID2"))
            .system_eid(ueid("IBM-SYSZ-ISMSEID00000000000A1B2C")),
    );
    // A host whose only SMC-D device is loopback-ism: v2 only, so no IP prefix area.
    let prop_smcd_v2_lo = built(
        ProposalBuilder::smcd_v2_loopback(LO_GID, LO_GID_EXT).user_eid(ueid("SMC-PROTO.UEID1")),
    );
    // SMC-R v1 and v2 (RoCEv2 GID IPv4-mapped, v2.1 limits from the default sysctls).
    let prop_smcr_v2 = built(
        ProposalBuilder::new()
            .smcr_v1(smcr_client)
            .ip_prefix(ipv4_area.clone())
            .smcr_v2(SmcrV2Offer {
                roce_gid: V2_GID_A,
                max_conns: 255,
                max_links: 2,
            })
            .user_eid(ueid("SMC-PROTO.UEID1")),
    );
    // What kernels before v2 sent for SMC-R only: header version 1, no SMC-D area
    // (iparea_offset 0), the IP prefix area right after the base.
    let prop_legacy = Proposal {
        version: SMC_V1,
        typev1: SmcType::R,
        typev2: SmcType::R,
        peer_id: CLIENT_PEER_ID,
        ib_gid: CLIENT_GID,
        ib_mac: CLIENT_MAC,
        smcd: None,
        ip_prefix: Some(ipv4_area),
        v2: None,
    };
    prop_legacy
        .validate()
        .expect("the legacy proposal is valid");

    // SMC-R: the server's Accept and the client's Confirm of a first contact; QPs, GIDs and
    // MACs are those of the LLC CONFIRM_LINK samples. RMBE index 1 is what Linux sends.
    let acc_smcr = SmcrAcceptConfirm {
        peer_id: SERVER_PEER_ID,
        gid: SERVER_GID,
        mac: SERVER_MAC,
        qpn: 0x00_0107,
        rmb_rkey: 0x0001_a2b3,
        rmbe_idx: 1,
        rmbe_alert_token: 0x0000_0b01,
        rmbe_size: 2, // 64 KiB
        qp_mtu: 4,    // 2048: the server's path MTU
        rmb_dma_addr: 0x0000_0001_2345_6000,
        psn: 0x0054_3210,
        ..SmcrAcceptConfirm::default()
    };
    let conf_smcr = SmcrAcceptConfirm {
        peer_id: CLIENT_PEER_ID,
        gid: CLIENT_GID,
        mac: CLIENT_MAC,
        qpn: 0x00_0109,
        rmb_rkey: 0x0001_c4d5,
        rmbe_idx: 1,
        rmbe_alert_token: 0x0000_0c02,
        rmbe_size: 1, // 32 KiB
        qp_mtu: 3,    // 1024 = min(client path MTU, the server's 2048)
        rmb_dma_addr: 0x0000_0007_89ab_c000,
        psn: 0x0087_6543,
        ..SmcrAcceptConfirm::default()
    };
    let eid = ueid("SMC-PROTO.UEID1");
    let acc_smcr_v2 = SmcrAcceptConfirm {
        gid: V2_GID_SERVER,
        eid,
        ..acc_smcr.clone()
    };
    let conf_smcr_v2 = SmcrAcceptConfirm {
        gid: V2_GID_A,
        eid,
        gid_list: Some(vec![V2_GID_A, V2_GID_B]),
        ..conf_smcr.clone()
    };
    let fce_smcr = |host: &str| {
        FirstContactExt::linux_smcr(
            SMC_RELEASE_1,
            Hostname::new(host),
            true,
            255,
            2,
            SMC_FEATURE_MASK,
        )
    };

    // SMC-D v1: a second connection in an existing link group (no first contact). DMBE
    // index 0 is what Linux sends.
    let acc_smcd_v1 = SmcdAcceptConfirm {
        gid: SERVER_ISM_GID,
        token: 0x0000_2e10_0000_0a01,
        dmbe_idx: 0,
        dmbe_size: 2, // 64 KiB
        link_id: [0x00, 0x2c, 0x00, 0x00],
        ..SmcdAcceptConfirm::default()
    };
    let conf_smcd_v1 = SmcdAcceptConfirm {
        gid: CLIENT_ISM_GID,
        token: 0x0000_2e10_0000_0b02,
        dmbe_size: 1, // 32 KiB
        ..acc_smcd_v1
    };
    // SMC-D v2 over loopback-ism, first contact: both ends have the same device.
    let acc_smcd_v2 = SmcdAcceptConfirm {
        gid: LO_GID,
        token: 0x9c41_7be2_05d3_aa18,
        dmbe_idx: 0,
        dmbe_size: 3, // 128 KiB
        link_id: [0x00, 0x2d, 0x00, 0x00],
        chid: LOOPBACK_CHID,
        eid,
        gid_ext: LO_GID_EXT,
    };
    let conf_smcd_v2 = SmcdAcceptConfirm {
        token: 0x2b8e_d047_61fc_3905,
        dmbe_size: 2, // 64 KiB
        ..acc_smcd_v2
    };
    let fce_smcd = |host: &str| {
        FirstContactExt::linux_smcd(SMC_RELEASE_1, Hostname::new(host), SMC_FEATURE_MASK)
    };

    // Declines, all from the server: v1, the prefixes differ (it has an SMC-R system id, so it
    // fills the peer id); v2, no usable device, with four more diagnosis codes (Linux sends
    // zeros there; the samples do not, so a misplaced code shows); v2, its link group is out of
    // sync (the 0x08 header bit goes with SYNCERR).
    let decl_v1 = Decline {
        peer_id: SERVER_PEER_ID,
        ..Decline::new(ReasonCode::DIFFPREFIX, SMC_V1)
    };
    let decl_v2 = Decline {
        peer_id: SERVER_PEER_ID,
        diag_v2: [
            ReasonCode::NOSMCDDEV,
            ReasonCode::NOSMCRDEV,
            ReasonCode::NOV2DEXT,
            ReasonCode::NOUEID,
        ],
        ..Decline::new(ReasonCode::NOSMCDEV, SMC_V2)
    };
    let decl_sync = Decline {
        peer_id: SERVER_PEER_ID,
        ..Decline::new(ReasonCode::SYNCERR, SMC_V2)
    };

    let msgs: Vec<(&'static str, ClcMessage)> = vec![
        ("CLC_PROPOSAL_SMCR_V1", ClcMessage::Proposal(prop_smcr_v1)),
        ("CLC_PROPOSAL_SMCD_V1", ClcMessage::Proposal(prop_smcd_v1)),
        (
            "CLC_PROPOSAL_SMCR_SMCD_V1_IPV6",
            ClcMessage::Proposal(prop_both_v1),
        ),
        ("CLC_PROPOSAL_SMCD_V2", ClcMessage::Proposal(prop_smcd_v2)),
        (
            "CLC_PROPOSAL_SMCD_V2_LOOPBACK",
            ClcMessage::Proposal(prop_smcd_v2_lo),
        ),
        ("CLC_PROPOSAL_SMCR_V2", ClcMessage::Proposal(prop_smcr_v2)),
        (
            "CLC_PROPOSAL_SMCR_V1_LEGACY",
            ClcMessage::Proposal(prop_legacy),
        ),
        (
            "CLC_ACCEPT_SMCR_V1",
            ClcMessage::Accept(AcceptConfirm::smcr(SMC_V1, true, acc_smcr, None)),
        ),
        (
            "CLC_CONFIRM_SMCR_V1",
            ClcMessage::Confirm(AcceptConfirm::smcr(SMC_V1, true, conf_smcr, None)),
        ),
        (
            "CLC_ACCEPT_SMCR_V2",
            ClcMessage::Accept(AcceptConfirm::smcr(
                SMC_V2,
                true,
                acc_smcr_v2,
                Some(fce_smcr("smc-server.example")),
            )),
        ),
        (
            "CLC_CONFIRM_SMCR_V2",
            ClcMessage::Confirm(AcceptConfirm::smcr(
                SMC_V2,
                true,
                conf_smcr_v2,
                Some(fce_smcr("smc-client.example")),
            )),
        ),
        (
            "CLC_ACCEPT_SMCD_V1",
            ClcMessage::Accept(AcceptConfirm::smcd_v1(acc_smcd_v1, false)),
        ),
        (
            "CLC_CONFIRM_SMCD_V1",
            ClcMessage::Confirm(AcceptConfirm::smcd_v1(conf_smcd_v1, false)),
        ),
        (
            "CLC_ACCEPT_SMCD_V2",
            ClcMessage::Accept(AcceptConfirm::smcd_v2(
                acc_smcd_v2,
                Some(fce_smcd("smc-server.example")),
            )),
        ),
        (
            "CLC_CONFIRM_SMCD_V2",
            ClcMessage::Confirm(AcceptConfirm::smcd_v2(
                conf_smcd_v2,
                Some(fce_smcd("smc-client.example")),
            )),
        ),
        ("CLC_DECLINE_V1", ClcMessage::Decline(decl_v1)),
        ("CLC_DECLINE_V2", ClcMessage::Decline(decl_v2)),
        ("CLC_DECLINE_V2_OUT_OF_SYNC", ClcMessage::Decline(decl_sync)),
    ];
    msgs.into_iter()
        .map(|(name, m)| {
            m.validate().expect("sample CLC messages are valid");
            Sample {
                name,
                bytes: m.to_vec(),
                repr: SampleRepr::Clc(m),
            }
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
