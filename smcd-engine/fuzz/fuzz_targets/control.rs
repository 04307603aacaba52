#![no_main]
//! Fuzz target for smcd's request handling: a fresh daemon state receives a sequence of
//! records from two clients (root and an unprivileged one), each handled as the server
//! dispatches it: the `SMCD_LOOPBACK` family by the device handler, everything else by
//! `genl::handle`. Nothing may panic; every reply record must fit a record and frame.
//!
//! Input: byte 0 holds flags (bit 0: wrap each chunk in a well-formed netlink + genetlink
//! header, so the fuzzer reaches command and attribute handling without guessing lengths);
//! then chunks of `[len: u8][bytes]`. A wrapped chunk is `[family selector][cmd][flags
//! selector][client][attributes..]`.
use libfuzzer_sys::fuzz_target;
use netlink_packet_core::{NetlinkMessage, NetlinkPayload};
use netlink_packet_generic::GenlMessage;
use smc_proto::netlink::framing::{self, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST};
use smc_proto::netlink::loopback::{LOOPBACK_FAMILY_ID, LoopbackMessage};
use smcd_engine::control::daemon::Daemon;
use smcd_engine::control::device::{ClientCtx, DeviceState};
use smcd_engine::control::genl;
use smcd_engine::ipc::channel::{self, MAX_RECORD};

const FAMILIES: [u16; 5] = [0x10, 0x20, 0x21, LOOPBACK_FAMILY_ID, 0x33];
const FLAGS: [u16; 4] = [
    NLM_F_REQUEST | NLM_F_DUMP,
    NLM_F_REQUEST | NLM_F_ACK,
    NLM_F_REQUEST,
    NLM_F_ACK,
];

fn wrap(chunk: &[u8]) -> (usize, Vec<u8>) {
    let get = |i: usize| chunk.get(i).copied().unwrap_or(0);
    let family = FAMILIES[get(0) as usize % FAMILIES.len()];
    let flags = FLAGS[get(2) as usize % FLAGS.len()];
    let attrs = chunk.get(4..).unwrap_or(&[]);
    let len = 20 + attrs.len();
    let mut b = Vec::with_capacity(len);
    b.extend_from_slice(&(len as u32).to_ne_bytes());
    b.extend_from_slice(&family.to_ne_bytes());
    b.extend_from_slice(&flags.to_ne_bytes());
    b.extend_from_slice(&1u32.to_ne_bytes());
    b.extend_from_slice(&0u32.to_ne_bytes());
    b.extend_from_slice(&[get(1), 1, 0, 0]);
    b.extend_from_slice(attrs);
    (get(3) as usize % 2, b)
}

fn check_replies(records: &[Vec<u8>]) {
    for r in records {
        assert!(r.len() <= MAX_RECORD, "reply record of {} bytes", r.len());
        let msgs = framing::split_messages(r).expect("reply records frame");
        assert!(!msgs.is_empty());
        for m in msgs {
            assert!(matches!(m.header.message_type, 2 | 3 | 0x10 | 0x20 | 0x21));
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, mut rest)) = data.split_first() else {
        return;
    };
    let Ok(device) = DeviceState::new("SEID".into(), "fuzz".into()) else {
        return;
    };
    let mut daemon = Daemon::new(device);
    // pid 1 so that a HELLO can name its sender; uid 0 and an unprivileged one.
    let mut clients = [
        ClientCtx { pid: 1, uid: 0, gid: 0, session: None, netns: 0 },
        ClientCtx { pid: 1, uid: 65534, gid: 65534, session: None, netns: 0 },
    ];
    let mut n = 0;
    while let Some((&len, tail)) = rest.split_first() {
        let take = (len as usize).min(tail.len());
        let (chunk, next) = tail.split_at(take);
        rest = next;
        n += 1;
        if n > 16 {
            break;
        }
        let (who, record) = if mode & 1 == 1 {
            wrap(chunk)
        } else {
            (n % 2, chunk.to_vec())
        };
        let is_loopback = channel::peek_header(&record)
            .is_some_and(|h| h.message_type == LOOPBACK_FAMILY_ID);
        if is_loopback {
            let msg = match channel::decode::<GenlMessage<LoopbackMessage>>(&record) {
                Ok(NetlinkMessage {
                    payload: NetlinkPayload::InnerMessage(g),
                    ..
                }) => g.payload,
                _ => continue,
            };
            let out = daemon.device.handle(who as u64 + 1, &mut clients[who], msg, Vec::new());
            for r in out.fds {
                let _ = daemon.device.fd(r);
            }
            for note in out.notes {
                daemon.device.undeliverable(&note.msg);
            }
        } else {
            check_replies(&genl::handle(&mut daemon, &clients[who], &record));
        }
    }
    for (i, c) in clients.iter().enumerate() {
        let (_, session) = daemon.device.client_gone(i as u64 + 1, c);
        if let Some(s) = session {
            daemon.session_gone(s);
        }
    }
});
