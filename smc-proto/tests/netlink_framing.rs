//! Netlink framing: several messages in one buffer, `NLMSG_DONE`, `NLMSG_ERROR` (ACK and
//! errno), the reply builders, and typed errors for truncated or garbage input.
#![cfg(target_endian = "little")]

use netlink_packet_core::NetlinkPayload;
use smc_proto::netlink::NlError;
use smc_proto::netlink::framing::*;
use smc_proto::netlink::smc::{SmcCmd, SmcGenlMessage};

const FAMILY: u16 = 0x1c;

/// A `GET_STATS` dump request from pid 77, seq 5.
#[rustfmt::skip]
const REQ: [u8; 20] = [
    20, 0, 0, 0,  0x1c, 0,  0x01, 0x03,  5, 0, 0, 0,  77, 0, 0, 0,
    7, 1, 0, 0,
];

/// The answer to a dump with two `DUMP_HS_LIMITATION`-style messages and DONE, as the kernel
/// lays them out in one read.
#[rustfmt::skip]
const DUMP: [u8; 76] = [
    28, 0, 0, 0,  0x1c, 0,  2, 0,  5, 0, 0, 0,  77, 0, 0, 0,  16, 1, 0, 0,  5, 0, 1, 0, 1, 0, 0, 0,
    28, 0, 0, 0,  0x1c, 0,  2, 0,  5, 0, 0, 0,  77, 0, 0, 0,  16, 1, 0, 0,  5, 0, 1, 0, 0, 0, 0, 0,
    20, 0, 0, 0,  3, 0,     2, 0,  5, 0, 0, 0,  77, 0, 0, 0,  0, 0, 0, 0, // NLMSG_DONE, NLM_F_MULTI, 0
];

#[test]
fn dump_reply_sequence_both_ways() {
    let req = split_messages(&REQ).unwrap()[0];
    assert_eq!(req.header.flags, NLM_F_REQUEST | NLM_F_DUMP);
    let msgs = parse_family_messages::<SmcGenlMessage>(&DUMP, FAMILY).unwrap();
    assert_eq!(msgs.len(), 3);
    let flags: Vec<bool> = msgs
        .iter()
        .map(|m| match &m.payload {
            NetlinkPayload::InnerMessage(g) => g.payload.hs_limitation().unwrap(),
            NetlinkPayload::Done(d) => {
                assert_eq!(d.code, 0);
                false
            }
            _ => panic!(),
        })
        .collect();
    assert_eq!(flags, [true, false, false]);
    let built = dump_reply(
        FAMILY,
        &req.header,
        [
            SmcGenlMessage::hs_limitation_reply(true),
            SmcGenlMessage::hs_limitation_reply(false),
        ],
    );
    assert_eq!(to_bytes_many(&built).unwrap(), DUMP);
}

#[test]
fn ack_and_error_both_ways() {
    let req = split_messages(&REQ).unwrap()[0];
    // ACK: error 0, NLM_F_CAPPED, the request's 16-byte header only.
    let mut ack_bytes = vec![36, 0, 0, 0, 2, 0, 0, 1, 5, 0, 0, 0, 77, 0, 0, 0, 0, 0, 0, 0];
    ack_bytes.extend_from_slice(&REQ[..16]);
    assert_eq!(
        to_bytes(&ack::<SmcGenlMessage>(&req.header)).unwrap(),
        ack_bytes
    );
    // Error: -EINVAL (22), flags 0, the whole request echoed.
    let mut err_bytes = vec![40, 0, 0, 0, 2, 0, 0, 0, 5, 0, 0, 0, 77, 0, 0, 0];
    err_bytes.extend_from_slice(&(-22i32).to_le_bytes());
    err_bytes.extend_from_slice(&REQ);
    assert_eq!(
        to_bytes(&error_reply::<SmcGenlMessage>(&req, 22)).unwrap(),
        err_bytes
    );
    assert_eq!(
        to_bytes(&error_reply::<SmcGenlMessage>(&req, -22)).unwrap(),
        err_bytes
    );
    assert_eq!(
        to_bytes(&error_reply::<SmcGenlMessage>(&req, 0)).unwrap(),
        ack_bytes
    );

    for (bytes, errno) in [(&ack_bytes, 0), (&err_bytes, -22)] {
        let m = parse_messages::<SmcGenlMessage>(bytes).unwrap().remove(0);
        let NetlinkPayload::Error(e) = &m.payload else {
            panic!()
        };
        assert_eq!(errno_of(e), errno);
        let echoed = echoed_header(e).unwrap();
        assert_eq!(echoed, req.header);
    }
    let capped = to_bytes(&error_reply_capped::<SmcGenlMessage>(&req.header, 2)).unwrap();
    assert_eq!(capped.len(), 36);
    assert_eq!(&capped[6..8], &NLM_F_CAPPED.to_le_bytes());
}

#[test]
fn requests_and_do_reply() {
    let m = dump_request(FAMILY, SmcGenlMessage::request(SmcCmd::GetStats), 5, false);
    let mut b = to_bytes(&m).unwrap();
    b[12] = 77; // the kernel fills in the sender's port id
    assert_eq!(b, REQ);
    let d = do_request(FAMILY, SmcGenlMessage::request(SmcCmd::FlushUeid), 9, true);
    let b = to_bytes(&d).unwrap();
    assert_eq!(&b[6..8], &(NLM_F_REQUEST | NLM_F_ACK).to_le_bytes());
    let req = split_messages(&REQ).unwrap()[0];
    let r = do_reply(
        FAMILY,
        &req.header,
        SmcGenlMessage::request(SmcCmd::GetStats),
    );
    let b = to_bytes(&r).unwrap();
    assert_eq!(&b[6..16], &[0, 0, 5, 0, 0, 0, 77, 0, 0, 0]);
}

#[test]
fn empty_done_and_noop_parse() {
    // The kernel allows an NLMSG_DONE without payload.
    let done = [16, 0, 0, 0, 3, 0, 2, 0, 1, 0, 0, 0, 0, 0, 0, 0];
    let m = parse_messages::<SmcGenlMessage>(&done).unwrap();
    assert!(matches!(m[0].payload, NetlinkPayload::Done(_)));
    let noop = [16, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0];
    let m = parse_messages::<SmcGenlMessage>(&noop).unwrap();
    assert!(matches!(m[0].payload, NetlinkPayload::Noop));
}

#[test]
fn garbage_gives_typed_errors() {
    use NlError::*;
    let p = parse_messages::<SmcGenlMessage>;
    assert_eq!(
        p(&DUMP[..10]),
        Err(Truncated {
            what: "netlink header",
            need: 16,
            have: 10
        })
    );
    assert_eq!(
        p(&DUMP[..27]),
        Err(Truncated {
            what: "netlink message",
            need: 28,
            have: 27
        })
    );
    // Second message cut short.
    assert!(matches!(p(&DUMP[..40]), Err(Truncated { .. })));
    let mut short_len = DUMP;
    short_len[0] = 8;
    assert_eq!(p(&short_len), Err(BadMessageLength { declared: 8 }));
    // A declared length of 4 GiB is refused before anything is read or allocated.
    let mut huge = DUMP;
    huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(
        p(&huge),
        Err(TooLarge {
            declared: u32::MAX as usize,
            max: MAX_MESSAGE_LEN
        })
    );
    let mut reserved = DUMP;
    reserved[4] = 7;
    assert_eq!(p(&reserved), Err(ReservedMessageType(7)));
    // A family message too short for its genetlink header.
    let no_genl = [18, 0, 0, 0, 0x1c, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1];
    assert!(matches!(
        p(&no_genl),
        Err(Truncated {
            what: "genetlink header",
            ..
        })
    ));
    // A broken top-level attribute stream.
    let mut bad_attr = DUMP;
    bad_attr[20] = 200;
    assert!(matches!(p(&bad_attr), Err(Attributes { offset: 0, .. })));
    // NLMSG_ERROR too short for its code.
    let err = [18, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1];
    assert!(matches!(
        p(&err),
        Err(Truncated {
            what: "NLMSG_ERROR",
            ..
        })
    ));
    // Another family where one was expected.
    assert_eq!(
        parse_family_messages::<SmcGenlMessage>(&DUMP, 0x1d),
        Err(UnexpectedFamily {
            got: 0x1c,
            expected: 0x1d
        })
    );
    assert_eq!(peek_header(&REQ).unwrap().length, 20);
}

#[test]
fn unaligned_message_lengths_frame_on_4_bytes() {
    // An error echoing a 17-byte "request" is 37 bytes long; the next message starts at 40.
    let mut buf = vec![37, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    buf.extend_from_slice(&(-1i32).to_le_bytes());
    buf.extend_from_slice(&[9; 17]);
    buf.extend_from_slice(&[0, 0, 0]);
    buf.extend_from_slice(&[16, 0, 0, 0, 3, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    let m = parse_messages::<SmcGenlMessage>(&buf).unwrap();
    assert_eq!(m.len(), 2);
    assert_eq!(to_bytes_many(&m).unwrap()[..40], buf[..40]);
}

#[test]
fn collect_replies_sorts_a_dump_and_an_error() {
    let b = collect_replies(parse_messages::<SmcGenlMessage>(&DUMP).unwrap());
    assert_eq!(b.payloads.len(), 2);
    assert_eq!(b.end, Some(ReplyEnd::Done(0)));
    let req = split_messages(&REQ).unwrap()[0];
    let err = to_bytes(&error_reply::<SmcGenlMessage>(&req, 95)).unwrap();
    let b = collect_replies(parse_messages::<SmcGenlMessage>(&err).unwrap());
    assert_eq!(b.end, Some(ReplyEnd::Error(-95)));
    let b = collect_replies(parse_messages::<SmcGenlMessage>(&DUMP[..56]).unwrap());
    assert_eq!((b.payloads.len(), b.end), (2, None));
}
