//! The sans-IO rules now live in the `smc-core` crate; these names stay until the driver is
//! rewired onto its connection and handshake machines.

pub use smc_core::handshake::decide as handshake;
pub use smc_core::{close, window};

/// Cursor conversions, plus the SMC-D words built from them.
pub mod cursor {
    pub use smc_core::cursor::*;
    use smc_proto::cdc::{ConnStateFlags, ProducerFlags, SmcdCursorWord};

    /// A producer-cursor word (flags bytes zero).
    pub fn prod_word(pos: u64, ring_len: usize) -> u64 {
        SmcdCursorWord::encode(
            to_cursor(pos, ring_len),
            ProducerFlags::default(),
            ConnStateFlags::default(),
        )
    }

    /// A consumer-cursor word carrying the sender's producer and connection-state flags.
    pub fn cons_word(
        pos: u64,
        ring_len: usize,
        pflags: ProducerFlags,
        cflags: ConnStateFlags,
    ) -> u64 {
        SmcdCursorWord::encode(to_cursor(pos, ring_len), pflags, cflags)
    }
}
