#![no_main]
//! Fuzz target for the CLC decoders (`smc_proto::clc`).
//!
//! Oracle: `peek_message_len` and `ClcMessage::parse` never panic; whatever parses is valid,
//! re-emits to a message whose framing length matches, and parses back to the same value.
use libfuzzer_sys::fuzz_target;
use smc_proto::clc::{ClcMessage, peek_message_len};

fuzz_target!(|data: &[u8]| {
    let peeked = peek_message_len(data);
    match ClcMessage::parse(data) {
        Ok(msg) => {
            // A message that parses has a header the stream framer accepts, for its length.
            assert_eq!(peeked, Ok(data.len()));
            msg.validate().expect("parsed value must be valid");
            let bytes = msg.to_vec();
            assert_eq!(bytes.len(), msg.buffer_len());
            assert_eq!(peek_message_len(&bytes), Ok(bytes.len()));
            let again = ClcMessage::parse(&bytes).expect("re-emitted message must parse");
            assert_eq!(again, msg);
        }
        Err(e) => {
            let _ = (e.to_string(), e.decline_reason());
        }
    }
});
