//! CDC (Connection Data Control), mirroring the Linux kernel's `net/smc/smc_cdc.[ch]`.
//!
//! A CDC message tells the peer how far the sender has written into the peer's receive buffer
//! (producer cursor) and how far it has read its own (consumer cursor), plus a few flags. It
//! comes in two forms:
//!
//! * **SMC-R** ([`SmcrCdc`], [`SmcrCdcRepr`]): a 44-byte big-endian RDMA SEND with type 0xFE,
//!   length 44, sequence number and alert token.
//! * **SMC-D** ([`SmcdCdc`], [`SmcdCdcRepr`], [`SmcdCursorWord`]): 32 bytes in *host* byte
//!   order written into the first 32 bytes of the peer's DMB; no length, sequence number or
//!   token, and the flags travel in the *consumer* cursor slot.
//!
//! Cursor arithmetic ([`Cursor`], [`Ring`]) and the window-update threshold
//! ([`rmbe_update_limit`]) live here too, because the data path needs them on every send.
//! See `docs/cdc.md` for the byte layouts and the kernel's quirks.
//!
//! # Panic contract
//!
//! As for the whole crate: views check lengths in `new_checked`, after which getters cannot
//! panic; parsers return a [`CdcError`]; cursor operations return a [`CursorError`] for
//! invalid inputs. `emit` panics only if given a buffer shorter than `buffer_len()`.

mod cursor;
pub(crate) mod flags;
mod smcd;
mod smcr;

pub use cursor::{Cursor, CursorError, Ring};
pub use smcd::{
    CONN_FLAGS_OFFSET, CONS_OFFSET, ENGINE_WORD_OFFSET, PROD_FLAGS_OFFSET, PROD_OFFSET,
    SMCD_CDC_LEN, SmcdCdc, SmcdCdcRepr, SmcdCursorWord,
};
pub use smcr::{SMCR_CDC_LEN, SMCR_CDC_MIN_LEN, SmcrCdc, SmcrCdcRepr, seqno_before};

use flags::flag_byte;
use thiserror::Error;

/// Byte 0 of every CDC message (`SMC_CDC_MSG_TYPE`). LLC messages use other values, so this
/// byte demultiplexes the two on an SMC-R link (see [`crate::llc::classify`]).
pub const CDC_MSG_TYPE: u8 = 0xFE;

/// What was wrong with a CDC message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum CdcError {
    /// The buffer is shorter than the part that has to be read.
    #[error("CDC message truncated: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// Byte 0 is not 0xFE.
    #[error("not a CDC message: type byte {found:#04x}, expected 0xfe")]
    BadType {
        /// The type byte found.
        found: u8,
    },
    /// The SMC-R length byte is not 44 (the kernel drops such a message).
    #[error("SMC-R CDC length byte is {found}, expected 44")]
    BadLength {
        /// The length byte found.
        found: u8,
    },
}

bitflags::bitflags! {
    /// The producer flags byte (`struct smc_cdc_producer_flags`), bit 7 first. Bits without a
    /// name are kept (see the `flags` module): build one from a wire byte with
    /// `from_bits_retain` or `From<u8>`.
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct ProducerFlags: u8 {
        /// The sender has more data than the receiver's window allows.
        const WRITE_BLOCKED = 0x80;
        /// Urgent data is pending (MSG_OOB queued, not yet all written).
        const URG_DATA_PENDING = 0x40;
        /// The write this CDC announces ends with the urgent byte.
        const URG_DATA_PRESENT = 0x20;
        /// Asks the peer to send its consumer cursor.
        const CONS_CURS_UPD_REQ = 0x10;
        /// SMC-R: replay check after a link switch (`smc_cdc_msg_validate`), not a normal CDC.
        const FAILOVER_VALIDATION = 0x08;
        // The kernel's reserved bits: kept, so they survive a parse/emit round trip.
        const _ = !0;
    }
}

flag_byte!(ProducerFlags);

impl ProducerFlags {
    /// True if [`Self::WRITE_BLOCKED`] is set.
    #[inline]
    pub const fn write_blocked(self) -> bool {
        self.contains(Self::WRITE_BLOCKED)
    }

    /// True if [`Self::URG_DATA_PENDING`] is set.
    #[inline]
    pub const fn urg_data_pending(self) -> bool {
        self.contains(Self::URG_DATA_PENDING)
    }

    /// True if [`Self::URG_DATA_PRESENT`] is set.
    #[inline]
    pub const fn urg_data_present(self) -> bool {
        self.contains(Self::URG_DATA_PRESENT)
    }

    /// True if [`Self::CONS_CURS_UPD_REQ`] is set.
    #[inline]
    pub const fn cons_curs_upd_req(self) -> bool {
        self.contains(Self::CONS_CURS_UPD_REQ)
    }

    /// True if [`Self::FAILOVER_VALIDATION`] is set.
    #[inline]
    pub const fn failover_validation(self) -> bool {
        self.contains(Self::FAILOVER_VALIDATION)
    }
}

bitflags::bitflags! {
    /// The connection-state flags byte (`struct smc_cdc_conn_state_flags`), bit 7 first. Bits
    /// without a name are kept, as for [`ProducerFlags`].
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct ConnStateFlags: u8 {
        /// The peer called shutdown(SHUT_WR).
        const PEER_DONE_WRITING = 0x80;
        /// The peer closed the connection.
        const PEER_CONN_CLOSED = 0x40;
        /// The peer aborted the connection (abnormal close, unread data discarded).
        const PEER_CONN_ABORT = 0x20;
        // The kernel's reserved bits: kept, so they survive a parse/emit round trip.
        const _ = !0;
    }
}

flag_byte!(ConnStateFlags);

impl ConnStateFlags {
    /// True if [`Self::PEER_DONE_WRITING`] is set.
    #[inline]
    pub const fn peer_done_writing(self) -> bool {
        self.contains(Self::PEER_DONE_WRITING)
    }

    /// True if [`Self::PEER_CONN_CLOSED`] is set.
    #[inline]
    pub const fn peer_conn_closed(self) -> bool {
        self.contains(Self::PEER_CONN_CLOSED)
    }

    /// True if [`Self::PEER_CONN_ABORT`] is set.
    #[inline]
    pub const fn peer_conn_abort(self) -> bool {
        self.contains(Self::PEER_CONN_ABORT)
    }
}

/// Half of the kernel's `SOCK_MIN_SNDBUF` on x86-64 (2 × (2048 + 256) / 2): the floor of the
/// window-update limit.
pub const RMBE_UPDATE_LIMIT_MIN: u32 = 2304;

/// The kernel's `smc_rmb_wnd_update_limit`: the receiver reports its consumer cursor once more
/// than this many consumed bytes are unreported (and the peer's view of free space is at most
/// half the buffer, or the peer said it is write-blocked). It is
/// `max(rmbe_size / 10, SOCK_MIN_SNDBUF / 2)` = `max(rmbe_size / 10, 2304)`; it was `min()`
/// before the 2022 fix "net/smc: correct settings of RMB window update limit".
///
/// `rmbe_size` is the receive ring's data length: the RMB size for SMC-R, the DMB size minus the
/// 32-byte CDC header for SMC-D (the kernel's `buf_desc->len` in both cases).
#[inline]
pub const fn rmbe_update_limit(rmbe_size: u32) -> u32 {
    let tenth = rmbe_size / 10;
    if tenth > RMBE_UPDATE_LIMIT_MIN {
        tenth
    } else {
        RMBE_UPDATE_LIMIT_MIN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn update_limit_uses_max() {
        assert_eq!(rmbe_update_limit(16384), 2304);
        assert_eq!(rmbe_update_limit(65536), 6553);
        assert_eq!(rmbe_update_limit(1 << 20), 104857);
        assert_eq!(rmbe_update_limit((1 << 20) - 32), 104854);
        assert_eq!(rmbe_update_limit(0), 2304);
    }

    #[test]
    fn flags_keep_unknown_bits() {
        let f = ProducerFlags::from_bits_retain(0x87);
        assert!(f.write_blocked());
        assert_eq!(f.unknown_bits(), 0x07);
        assert_eq!(f.bits(), 0x87);
        assert_eq!(
            format!("{f:?}"),
            "ProducerFlags(0x87: WRITE_BLOCKED | unknown 0x07)"
        );
        let c = ConnStateFlags::PEER_CONN_CLOSED | ConnStateFlags::PEER_DONE_WRITING;
        assert_eq!(c.bits(), 0xC0);
        assert!(c.contains(ConnStateFlags::PEER_CONN_CLOSED));
        assert!(!c.peer_conn_abort());
    }

    #[test]
    fn unknown_flag_bits_survive_parse_and_emit() {
        // An SMC-R CDC with every reserved bit of both flag bytes set, next to named ones.
        let mut wire = SmcrCdcRepr {
            seqno: 1,
            token: 2,
            prod: Cursor::new(3, 4),
            cons: Cursor::new(5, 6),
            prod_flags: ProducerFlags::EMPTY,
            conn_flags: ConnStateFlags::EMPTY,
        }
        .to_bytes();
        wire[24] = 0x87;
        wire[25] = 0x5f;
        let r = SmcrCdcRepr::parse_bytes(&wire).unwrap();
        assert_eq!(r.prod_flags.bits(), 0x87);
        assert_eq!(r.prod_flags.unknown_bits(), 0x07);
        assert_eq!(r.conn_flags.bits(), 0x5f);
        assert_eq!(r.conn_flags.unknown_bits(), 0x1f);
        assert!(r.conn_flags.peer_conn_closed());
        assert_eq!(r.to_bytes(), wire);

        // SMC-D: the flags travel in the consumer cursor word.
        let w = SmcdCursorWord::encode(
            Cursor::new(1, 2),
            ProducerFlags::from(0xff),
            ConnStateFlags::from(0xff),
        );
        let d = SmcdCursorWord::decode(w);
        assert_eq!(u8::from(d.prod_flags), 0xff);
        assert_eq!(u8::from(d.conn_flags), 0xff);
    }

    #[test]
    fn bitflags_operations_keep_unknown_bits() {
        // `const _ = !0`: every bit counts as known to bitflags, none is truncated.
        assert_eq!(ProducerFlags::from_bits(0x07).map(|f| f.bits()), Some(0x07));
        assert_eq!(ProducerFlags::from_bits_truncate(0x07).bits(), 0x07);
        assert_eq!((!ProducerFlags::WRITE_BLOCKED).bits(), 0x7f);
        assert_eq!(ProducerFlags::all().bits(), 0xff);
        let mut f = ConnStateFlags::from_bits_retain(0x21);
        f.set(ConnStateFlags::PEER_CONN_ABORT, false);
        f |= ConnStateFlags::PEER_DONE_WRITING;
        assert_eq!(f.bits(), 0x81);
        // KNOWN is only the named bits.
        assert_eq!(ProducerFlags::KNOWN.bits(), 0xf8);
        assert_eq!(ConnStateFlags::KNOWN.bits(), 0xe0);
        assert_eq!(ProducerFlags::EMPTY, ProducerFlags::default());
        assert_eq!(
            format!("{:?}", ConnStateFlags::EMPTY),
            "ConnStateFlags(0x00)"
        );
    }
}
