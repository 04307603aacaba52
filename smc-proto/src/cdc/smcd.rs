//! The SMC-D CDC header: 32 bytes in **host byte order** at the start of the peer's DMB
//! (`struct smcd_cdc_msg`, `union smcd_cdc_cursor`).
//!
//! Each 8-byte cursor slot is, in the kernel, a union of
//! `struct { u16 wrap; u32 count; u8 prod_flags; u8 conn_state_flags; } __packed` with an
//! `atomic64_t`, and it is copied as one 64-bit word. [`SmcdCursorWord`] gives that word for a
//! cursor and flags, so the engine can store and load the slots with `AtomicU64`. The flags
//! travel in the **consumer** slot; the producer slot's two flag bytes are zero.

use super::{CDC_MSG_TYPE, CdcError, ConnStateFlags, Cursor, ProducerFlags};

/// Length of the SMC-D CDC header; the ring in a DMB starts after it.
pub const SMCD_CDC_LEN: usize = 32;
/// Offset of the producer cursor slot (an 8-byte word).
pub const PROD_OFFSET: usize = 8;
/// Offset of the consumer cursor slot (an 8-byte word, also carrying the flags).
pub const CONS_OFFSET: usize = 16;
/// Offset of the producer flags byte (inside the consumer slot).
pub const PROD_FLAGS_OFFSET: usize = CONS_OFFSET + 6;
/// Offset of the connection-state flags byte (inside the consumer slot).
pub const CONN_FLAGS_OFFSET: usize = CONS_OFFSET + 7;
/// Offset of the 8 bytes the kernel calls `res3`: always zero from the kernel, never read by it.
///
/// Our engine keeps its own reader-waiting word here (an 8-byte aligned `AtomicU64`). The
/// parsers in this module neither validate nor interpret these bytes, and
/// [`SmcdCdcRepr::emit`] leaves them untouched.
pub const ENGINE_WORD_OFFSET: usize = 24;

/// A producer or consumer slot as the 64-bit word the kernel loads and stores atomically.
///
/// The word is the slot's 8 bytes read in host order: bytes 0..2 `wrap` (host order), 2..6
/// `count` (host order), byte 6 producer flags, byte 7 connection-state flags. So
/// `encode(..) == u64::from_ne_bytes(the 8 bytes)`, which is endian-correct on any host: on a
/// little-endian host the word is `wrap | count << 16 | prod << 48 | conn << 56`, on a
/// big-endian one `wrap << 48 | count << 16 | prod << 8 | conn`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SmcdCursorWord {
    /// The cursor.
    pub cursor: Cursor,
    /// Producer flags (meaningful in the consumer slot only; zero in the producer slot).
    pub prod_flags: ProducerFlags,
    /// Connection-state flags (meaningful in the consumer slot only).
    pub conn_flags: ConnStateFlags,
}

impl SmcdCursorWord {
    /// The slot's 8 bytes in memory order.
    #[inline]
    pub const fn to_bytes(self) -> [u8; 8] {
        let w = self.cursor.wrap.to_ne_bytes();
        let c = self.cursor.count.to_ne_bytes();
        [
            w[0],
            w[1],
            c[0],
            c[1],
            c[2],
            c[3],
            self.prod_flags.bits(),
            self.conn_flags.bits(),
        ]
    }

    /// A slot from its 8 bytes in memory order.
    #[inline]
    pub const fn from_bytes(b: [u8; 8]) -> SmcdCursorWord {
        SmcdCursorWord {
            cursor: Cursor::new(
                u16::from_ne_bytes([b[0], b[1]]),
                u32::from_ne_bytes([b[2], b[3], b[4], b[5]]),
            ),
            prod_flags: ProducerFlags::from_bits_retain(b[6]),
            conn_flags: ConnStateFlags::from_bits_retain(b[7]),
        }
    }

    /// The 64-bit word for `cursor` and flags, as an `AtomicU64` at the slot would hold it.
    /// (Shifts rather than a byte array: this runs on every send of the data path.)
    #[inline]
    pub const fn encode(
        cursor: Cursor,
        prod_flags: ProducerFlags,
        conn_flags: ConnStateFlags,
    ) -> u64 {
        let (w, c) = (cursor.wrap as u64, cursor.count as u64);
        let (p, f) = (prod_flags.bits() as u64, conn_flags.bits() as u64);
        if cfg!(target_endian = "little") {
            w | c << 16 | p << 48 | f << 56
        } else {
            w << 48 | c << 16 | p << 8 | f
        }
    }

    /// Splits a word loaded from a slot. Every word is valid (all 64 bits are fields); the
    /// cursor still has to be checked against the ring before use.
    #[inline]
    pub const fn decode(word: u64) -> SmcdCursorWord {
        let (w, c, p, f) = if cfg!(target_endian = "little") {
            (
                word as u16,
                (word >> 16) as u32,
                (word >> 48) as u8,
                (word >> 56) as u8,
            )
        } else {
            (
                (word >> 48) as u16,
                (word >> 16) as u32,
                (word >> 8) as u8,
                word as u8,
            )
        };
        SmcdCursorWord {
            cursor: Cursor::new(w, c),
            prod_flags: ProducerFlags::from_bits_retain(p),
            conn_flags: ConnStateFlags::from_bits_retain(f),
        }
    }

    /// This slot as a word.
    #[inline]
    pub const fn to_word(self) -> u64 {
        u64::from_ne_bytes(self.to_bytes())
    }
}

/// A checked view over an SMC-D CDC header (the first 32 bytes of a DMB).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmcdCdc<T: AsRef<[u8]>> {
    buffer: T,
}

fn slot(b: &[u8], at: usize) -> [u8; 8] {
    crate::wire::array::<8>(b, at)
}

impl<T: AsRef<[u8]>> SmcdCdc<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> SmcdCdc<T> {
        SmcdCdc { buffer }
    }

    /// Wraps a buffer and checks that it holds at least [`SMCD_CDC_LEN`] bytes.
    pub fn new_checked(buffer: T) -> Result<SmcdCdc<T>, CdcError> {
        let v = Self::new_unchecked(buffer);
        v.check_len()?;
        Ok(v)
    }

    /// Checks the buffer length.
    pub fn check_len(&self) -> Result<(), CdcError> {
        let have = self.buffer.as_ref().len();
        if have < SMCD_CDC_LEN {
            Err(CdcError::Truncated {
                need: SMCD_CDC_LEN,
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

    /// Byte 0: 0xFE as written by the kernel. The kernel's receiver never reads it.
    pub fn msg_type(&self) -> u8 {
        self.buffer.as_ref()[0]
    }

    /// The producer slot as a word.
    pub fn prod_word(&self) -> u64 {
        u64::from_ne_bytes(slot(self.buffer.as_ref(), PROD_OFFSET))
    }

    /// The consumer slot (with the flags) as a word.
    pub fn cons_word(&self) -> u64 {
        u64::from_ne_bytes(slot(self.buffer.as_ref(), CONS_OFFSET))
    }

    /// The producer slot, decoded. Its flag bytes are zero from the kernel and not read.
    pub fn prod_slot(&self) -> SmcdCursorWord {
        SmcdCursorWord::from_bytes(slot(self.buffer.as_ref(), PROD_OFFSET))
    }

    /// The consumer slot, decoded.
    pub fn cons_slot(&self) -> SmcdCursorWord {
        SmcdCursorWord::from_bytes(slot(self.buffer.as_ref(), CONS_OFFSET))
    }

    /// Producer cursor.
    pub fn prod_cursor(&self) -> Cursor {
        self.prod_slot().cursor
    }

    /// Consumer cursor.
    pub fn cons_cursor(&self) -> Cursor {
        self.cons_slot().cursor
    }

    /// Producer flags, read from the consumer slot as the kernel does.
    pub fn prod_flags(&self) -> ProducerFlags {
        ProducerFlags::from_bits_retain(self.buffer.as_ref()[PROD_FLAGS_OFFSET])
    }

    /// Connection-state flags, read from the consumer slot as the kernel does.
    pub fn conn_flags(&self) -> ConnStateFlags {
        ConnStateFlags::from_bits_retain(self.buffer.as_ref()[CONN_FLAGS_OFFSET])
    }

    /// The engine's 8 bytes at [`ENGINE_WORD_OFFSET`] as a host-order word.
    pub fn engine_word(&self) -> u64 {
        u64::from_ne_bytes(slot(self.buffer.as_ref(), ENGINE_WORD_OFFSET))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> SmcdCdc<T> {
    /// Writes the producer slot.
    pub fn set_prod_word(&mut self, w: u64) {
        self.buffer.as_mut()[PROD_OFFSET..PROD_OFFSET + 8].copy_from_slice(&w.to_ne_bytes());
    }

    /// Writes the consumer slot.
    pub fn set_cons_word(&mut self, w: u64) {
        self.buffer.as_mut()[CONS_OFFSET..CONS_OFFSET + 8].copy_from_slice(&w.to_ne_bytes());
    }
}

/// The contents of an SMC-D CDC header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SmcdCdcRepr {
    /// Producer cursor: where the writer's next byte lands in this DMB's ring.
    pub prod: Cursor,
    /// Consumer cursor: how far the writer has read its own DMB.
    pub cons: Cursor,
    /// Producer flags.
    pub prod_flags: ProducerFlags,
    /// Connection-state flags.
    pub conn_flags: ConnStateFlags,
}

impl SmcdCdcRepr {
    /// Reads the header as the kernel's `smcd_cdc_msg_to_host` does: cursors from both slots,
    /// flags from the consumer slot. Like the kernel it checks neither the type byte, nor the
    /// producer slot's flag bytes, nor the reserved bytes; only the length can fail.
    pub fn parse<T: AsRef<[u8]>>(msg: &SmcdCdc<T>) -> Result<SmcdCdcRepr, CdcError> {
        msg.check_len()?;
        let cons = msg.cons_slot();
        Ok(SmcdCdcRepr {
            prod: msg.prod_cursor(),
            cons: cons.cursor,
            prod_flags: cons.prod_flags,
            conn_flags: cons.conn_flags,
        })
    }

    /// Parses from a byte slice.
    pub fn parse_bytes(bytes: &[u8]) -> Result<SmcdCdcRepr, CdcError> {
        Self::parse(&SmcdCdc::new_checked(bytes)?)
    }

    /// Bytes of the header: [`SMCD_CDC_LEN`] (emit writes the first 24 of them).
    pub const fn buffer_len(&self) -> usize {
        SMCD_CDC_LEN
    }

    /// The producer slot word.
    pub const fn prod_word(&self) -> u64 {
        SmcdCursorWord::encode(self.prod, ProducerFlags::EMPTY, ConnStateFlags::EMPTY)
    }

    /// The consumer slot word (carrying the flags).
    pub const fn cons_word(&self) -> u64 {
        SmcdCursorWord::encode(self.cons, self.prod_flags, self.conn_flags)
    }

    /// Writes bytes 0..24 as `smcd_cdc_msg_send` does (type 0xFE, zero reserved bytes, the two
    /// slots). Bytes 24..32 ([`ENGINE_WORD_OFFSET`]) are left as they are: into a zeroed
    /// buffer this gives exactly the kernel's 32 bytes.
    ///
    /// # Panics
    /// If the buffer is shorter than [`SMCD_CDC_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, msg: &mut SmcdCdc<T>) {
        assert!(
            msg.buffer.as_ref().len() >= SMCD_CDC_LEN,
            "SMC-D CDC emit needs {SMCD_CDC_LEN} bytes"
        );
        let b = msg.buffer.as_mut();
        b[0] = CDC_MSG_TYPE;
        b[1..PROD_OFFSET].fill(0);
        msg.set_prod_word(self.prod_word());
        msg.set_cons_word(self.cons_word());
    }

    /// The 32 bytes of the header with a zero engine word (what the kernel writes).
    pub fn to_bytes(&self) -> [u8; SMCD_CDC_LEN] {
        let mut b = [0u8; SMCD_CDC_LEN];
        self.emit(&mut SmcdCdc::new_unchecked(&mut b[..]));
        b
    }
}
