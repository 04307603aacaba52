#![no_main]
//! Fuzz target for the LLC decoder.
//!
//! Oracle: nothing panics; a message that parses re-emits (buffer_len bytes) to bytes that
//! parse to the same value; the header view agrees with the parsed type and flags; a parsed
//! v2 message (ADD_LINK with its rkey extension, DELETE_RKEY with its rkey list) never
//! claims more bytes than its header's length.
use libfuzzer_sys::fuzz_target;
use smc_proto::llc::{LlcMessage, LlcPacket, MsgKind, classify};

fuzz_target!(|data: &[u8]| {
    if let Some(&b0) = data.first() {
        let _: MsgKind = classify(b0);
    }
    let Ok(p) = LlcPacket::new_checked(data) else {
        assert!(LlcMessage::parse(data).is_err());
        return;
    };
    let _ = (p.llc_type(), p.flags(), p.message_len(), p.length_v2(), p.v1_byte2());
    if let Ok(m) = LlcMessage::parse(data) {
        assert_eq!(m.llc_type(), p.llc_type());
        assert_eq!(m.flags(), p.flags());
        assert!(m.buffer_len() <= p.message_len());
        let bytes = m.to_bytes();
        assert_eq!(bytes.len(), m.buffer_len());
        assert_eq!(LlcMessage::parse(&bytes), Ok(m));
    }
});
