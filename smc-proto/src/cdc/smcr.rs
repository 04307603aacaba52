//! The SMC-R CDC message: 44 bytes, big endian, sent as an RDMA SEND (`struct smc_cdc_msg`).

use super::{CDC_MSG_TYPE, CdcError, ConnStateFlags, Cursor, ProducerFlags};
use crate::wire::{Field, be16, be32, put_be16, put_be32};

/// Length of an SMC-R CDC message, and the value of its length byte.
pub const SMCR_CDC_LEN: usize = 44;

/// The kernel drops a CDC shorter than this (`offsetof(struct smc_cdc_msg, reserved)`): the
/// message up to and including the connection-state flags.
pub const SMCR_CDC_MIN_LEN: usize = 26;

mod field {
    use crate::wire::Field;

    pub const TYPE: usize = 0;
    pub const LEN: usize = 1;
    pub const SEQNO: Field = 2..4;
    pub const TOKEN: Field = 4..8;
    /// `union smc_cdc_cursor`: reserved(2) wrap(2) count(4).
    pub const PROD: usize = 8;
    pub const CONS: usize = 16;
    pub const PROD_FLAGS: usize = 24;
    pub const CONN_FLAGS: usize = 25;
    pub const RESERVED: Field = 26..44;

    pub const CURS_RESERVED: Field = 0..2;
    pub const CURS_WRAP: usize = 2;
    pub const CURS_COUNT: usize = 4;
}

/// A checked view over the bytes of an SMC-R CDC message.
///
/// [`SmcrCdc::new_checked`] makes sure the buffer holds the first [`SMCR_CDC_MIN_LEN`] bytes, the
/// part the kernel reads; after that no getter can panic. Setters need the same length;
/// [`SmcrCdcRepr::emit`] needs the full [`SMCR_CDC_LEN`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmcrCdc<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> SmcrCdc<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> SmcrCdc<T> {
        SmcrCdc { buffer }
    }

    /// Wraps a buffer and checks that it holds at least [`SMCR_CDC_MIN_LEN`] bytes.
    pub fn new_checked(buffer: T) -> Result<SmcrCdc<T>, CdcError> {
        let v = Self::new_unchecked(buffer);
        v.check_len()?;
        Ok(v)
    }

    /// Checks the buffer length as the kernel's receive handler does.
    pub fn check_len(&self) -> Result<(), CdcError> {
        let have = self.buffer.as_ref().len();
        if have < SMCR_CDC_MIN_LEN {
            Err(CdcError::Truncated {
                need: SMCR_CDC_MIN_LEN,
                have,
            })
        } else {
            Ok(())
        }
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Byte 0: message type, 0xFE for CDC.
    pub fn msg_type(&self) -> u8 {
        self.buffer.as_ref()[field::TYPE]
    }

    /// Byte 1: message length, 44.
    pub fn length(&self) -> u8 {
        self.buffer.as_ref()[field::LEN]
    }

    /// Per-connection sequence number.
    pub fn seqno(&self) -> u16 {
        be16(self.buffer.as_ref(), field::SEQNO.start)
    }

    /// Alert token of the receiving connection.
    pub fn token(&self) -> u32 {
        be32(self.buffer.as_ref(), field::TOKEN.start)
    }

    fn cursor_at(&self, at: usize) -> Cursor {
        let b = self.buffer.as_ref();
        Cursor::new(
            be16(b, at + field::CURS_WRAP),
            be32(b, at + field::CURS_COUNT),
        )
    }

    /// Producer cursor: where the sender's next write lands in the receiver's RMBE.
    pub fn prod_cursor(&self) -> Cursor {
        self.cursor_at(field::PROD)
    }

    /// Consumer cursor: how far the sender has read its own RMBE (the piggy-backed ack).
    pub fn cons_cursor(&self) -> Cursor {
        self.cursor_at(field::CONS)
    }

    /// The two reserved bytes in front of the producer cursor (ignored by the kernel).
    pub fn prod_cursor_reserved(&self) -> u16 {
        be16(
            self.buffer.as_ref(),
            field::PROD + field::CURS_RESERVED.start,
        )
    }

    /// The two reserved bytes in front of the consumer cursor (ignored by the kernel).
    pub fn cons_cursor_reserved(&self) -> u16 {
        be16(
            self.buffer.as_ref(),
            field::CONS + field::CURS_RESERVED.start,
        )
    }

    /// Producer flags byte.
    pub fn prod_flags(&self) -> ProducerFlags {
        ProducerFlags::from_bits_retain(self.buffer.as_ref()[field::PROD_FLAGS])
    }

    /// Connection-state flags byte.
    pub fn conn_flags(&self) -> ConnStateFlags {
        ConnStateFlags::from_bits_retain(self.buffer.as_ref()[field::CONN_FLAGS])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> SmcrCdc<T> {
    /// Sets byte 0.
    pub fn set_msg_type(&mut self, v: u8) {
        self.buffer.as_mut()[field::TYPE] = v;
    }

    /// Sets byte 1.
    pub fn set_length(&mut self, v: u8) {
        self.buffer.as_mut()[field::LEN] = v;
    }

    /// Sets the sequence number.
    pub fn set_seqno(&mut self, v: u16) {
        put_be16(self.buffer.as_mut(), field::SEQNO.start, v);
    }

    /// Sets the alert token.
    pub fn set_token(&mut self, v: u32) {
        put_be32(self.buffer.as_mut(), field::TOKEN.start, v);
    }

    fn set_cursor_at(&mut self, at: usize, c: Cursor) {
        let b = self.buffer.as_mut();
        // The kernel leaves "reserved" to the caller, which zeroes the whole message first.
        put_be16(b, at + field::CURS_RESERVED.start, 0);
        put_be16(b, at + field::CURS_WRAP, c.wrap);
        put_be32(b, at + field::CURS_COUNT, c.count);
    }

    /// Sets the producer cursor (and zeroes its reserved bytes).
    pub fn set_prod_cursor(&mut self, c: Cursor) {
        self.set_cursor_at(field::PROD, c);
    }

    /// Sets the consumer cursor (and zeroes its reserved bytes).
    pub fn set_cons_cursor(&mut self, c: Cursor) {
        self.set_cursor_at(field::CONS, c);
    }

    /// Sets the producer flags byte.
    pub fn set_prod_flags(&mut self, f: ProducerFlags) {
        self.buffer.as_mut()[field::PROD_FLAGS] = f.bits();
    }

    /// Sets the connection-state flags byte.
    pub fn set_conn_flags(&mut self, f: ConnStateFlags) {
        self.buffer.as_mut()[field::CONN_FLAGS] = f.bits();
    }

    /// Zeroes the 18 trailing reserved bytes. Needs a buffer of [`SMCR_CDC_LEN`] bytes.
    pub fn clear_reserved(&mut self) {
        let r: Field = field::RESERVED;
        self.buffer.as_mut()[r].fill(0);
    }
}

/// The contents of an SMC-R CDC message.
///
/// Reserved bytes are ignored on parse and written as zero on emit, as the kernel does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SmcrCdcRepr {
    /// Per-connection sequence number (the kernel increments it for every CDC it sends).
    pub seqno: u16,
    /// Alert token of the *receiving* connection (the value the peer sent in its CLC
    /// Accept/Confirm).
    pub token: u32,
    /// Producer cursor in the receiver's RMBE.
    pub prod: Cursor,
    /// Consumer cursor of the sender's own RMBE.
    pub cons: Cursor,
    /// Producer flags.
    pub prod_flags: ProducerFlags,
    /// Connection-state flags.
    pub conn_flags: ConnStateFlags,
}

impl SmcrCdcRepr {
    /// Parses a message with the kernel's receive checks (`smc_cdc_rx_handler`): at least
    /// [`SMCR_CDC_MIN_LEN`] bytes, type 0xFE, length byte 44. Token lookup and the sequence
    /// number check need connection state and are the caller's (see [`seqno_before`]).
    pub fn parse<T: AsRef<[u8]>>(msg: &SmcrCdc<T>) -> Result<SmcrCdcRepr, CdcError> {
        msg.check_len()?;
        if msg.msg_type() != CDC_MSG_TYPE {
            return Err(CdcError::BadType {
                found: msg.msg_type(),
            });
        }
        if msg.length() as usize != SMCR_CDC_LEN {
            return Err(CdcError::BadLength {
                found: msg.length(),
            });
        }
        Ok(SmcrCdcRepr {
            seqno: msg.seqno(),
            token: msg.token(),
            prod: msg.prod_cursor(),
            cons: msg.cons_cursor(),
            prod_flags: msg.prod_flags(),
            conn_flags: msg.conn_flags(),
        })
    }

    /// Parses from a byte slice.
    pub fn parse_bytes(bytes: &[u8]) -> Result<SmcrCdcRepr, CdcError> {
        Self::parse(&SmcrCdc::new_checked(bytes)?)
    }

    /// Bytes [`SmcrCdcRepr::emit`] writes: always [`SMCR_CDC_LEN`].
    pub const fn buffer_len(&self) -> usize {
        SMCR_CDC_LEN
    }

    /// Writes the whole 44-byte message, reserved bytes zeroed.
    ///
    /// # Panics
    /// If the buffer is shorter than [`SMCR_CDC_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, msg: &mut SmcrCdc<T>) {
        assert!(
            msg.buffer.as_ref().len() >= SMCR_CDC_LEN,
            "SMC-R CDC emit needs {SMCR_CDC_LEN} bytes"
        );
        msg.set_msg_type(CDC_MSG_TYPE);
        msg.set_length(SMCR_CDC_LEN as u8);
        msg.set_seqno(self.seqno);
        msg.set_token(self.token);
        msg.set_prod_cursor(self.prod);
        msg.set_cons_cursor(self.cons);
        msg.set_prod_flags(self.prod_flags);
        msg.set_conn_flags(self.conn_flags);
        msg.clear_reserved();
    }

    /// The 44 bytes of the message.
    pub fn to_bytes(&self) -> [u8; SMCR_CDC_LEN] {
        let mut b = [0u8; SMCR_CDC_LEN];
        self.emit(&mut SmcrCdc::new_unchecked(&mut b[..]));
        b
    }
}

/// `smc_cdc_before`: true if sequence number `a` is older than `b` in 16-bit serial arithmetic
/// (`(s16)(a - b) < 0`). The kernel drops a received CDC whose seqno is before the last one seen
/// (unless it carries `failover_validation`, which is checked separately).
#[inline]
pub const fn seqno_before(a: u16, b: u16) -> bool {
    (a.wrapping_sub(b) as i16) < 0
}
