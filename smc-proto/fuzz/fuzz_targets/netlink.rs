#![no_main]
//! Fuzz target for the netlink decoders: the framing, `SMC_GEN_NETLINK`, `SMCD_ENGINE`,
//! `SMCD_LOOPBACK` and nlctrl. The input is parsed as a buffer of netlink messages of each
//! family (and with a couple of expected family ids), and, so that the fuzzer reaches
//! attribute parsing without first having to guess a valid header, also as the attributes of
//! one generic netlink message whose command is the first input byte. Whatever parses must
//! re-emit and parse back to the same value.
use libfuzzer_sys::fuzz_target;
use smc_proto::netlink::ctrl::CtrlMessage;
use smc_proto::netlink::engine::EngineMessage;
use smc_proto::netlink::framing::{self, GenlPayload};
use smc_proto::netlink::loopback::LoopbackMessage;
use smc_proto::netlink::smc::SmcGenlMessage;

fn check<T: GenlPayload + Clone + PartialEq>(data: &[u8]) {
    let Ok(first) = framing::parse_messages::<T>(data) else {
        return;
    };
    let bytes = framing::to_bytes_many(&first).expect("a parsed message re-emits");
    let second = framing::parse_messages::<T>(&bytes).expect("re-emitted bytes parse");
    assert_eq!(first.len(), second.len());
    for (a, b) in first.iter().zip(&second) {
        assert_eq!(a.payload, b.payload);
        assert_eq!(
            (a.header.message_type, a.header.flags, a.header.sequence_number, a.header.port_number),
            (b.header.message_type, b.header.flags, b.header.sequence_number, b.header.port_number)
        );
    }
}

fn all(data: &[u8]) {
    check::<SmcGenlMessage>(data);
    check::<EngineMessage>(data);
    check::<CtrlMessage>(data);
    check::<LoopbackMessage>(data);
    for id in [0x10, 0x1c, 0x20, 0x21] {
        let _ = framing::parse_family_messages::<SmcGenlMessage>(data, id);
        let _ = framing::parse_family_messages::<EngineMessage>(data, id);
    }
}

fuzz_target!(|data: &[u8]| {
    all(data);
    if let Some((&cmd, attrs)) = data.split_first() {
        let attrs = &attrs[..attrs.len().min(framing::MAX_MESSAGE_LEN - 20)];
        let mut msg = Vec::with_capacity(20 + attrs.len());
        msg.extend_from_slice(&((20 + attrs.len()) as u32).to_ne_bytes());
        msg.extend_from_slice(&0x1cu16.to_ne_bytes());
        msg.extend_from_slice(&[2, 0, 1, 0, 0, 0, 0, 0, 0, 0]);
        msg.extend_from_slice(&[cmd, 1, 0, 0]);
        msg.extend_from_slice(attrs);
        all(&msg);
    }
});
