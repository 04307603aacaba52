//! Small helpers shared by the wire-format modules: byte ranges and checked big-endian and
//! host-order reads and writes.
//!
//! Views check their buffer length once in `new_checked`; the accessors below then index
//! within that checked length. The helpers take fixed-size arrays where they can so a range
//! mistake fails at compile time rather than at run time.

use core::ops::Range;

/// A byte range within a message, as smoltcp's `wire` modules use them.
pub type Field = Range<usize>;

/// Reads a big-endian `u16` at `at`. The caller guarantees `at + 2 <= buf.len()`.
#[inline]
pub fn be16(buf: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([buf[at], buf[at + 1]])
}

/// Reads a big-endian 24-bit value at `at`.
#[inline]
pub fn be24(buf: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([0, buf[at], buf[at + 1], buf[at + 2]])
}

/// Reads a big-endian `u32` at `at`.
#[inline]
pub fn be32(buf: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]])
}

/// Reads a big-endian `u64` at `at`.
#[inline]
pub fn be64(buf: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&buf[at..at + 8]);
    u64::from_be_bytes(b)
}

/// Writes a big-endian `u16` at `at`.
#[inline]
pub fn put_be16(buf: &mut [u8], at: usize, v: u16) {
    buf[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

/// Writes the low 24 bits of `v` big-endian at `at`.
#[inline]
pub fn put_be24(buf: &mut [u8], at: usize, v: u32) {
    buf[at..at + 3].copy_from_slice(&v.to_be_bytes()[1..]);
}

/// Writes a big-endian `u32` at `at`.
#[inline]
pub fn put_be32(buf: &mut [u8], at: usize, v: u32) {
    buf[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

/// Writes a big-endian `u64` at `at`.
#[inline]
pub fn put_be64(buf: &mut [u8], at: usize, v: u64) {
    buf[at..at + 8].copy_from_slice(&v.to_be_bytes());
}

/// Copies `N` bytes starting at `at` into an array.
#[inline]
pub fn array<const N: usize>(buf: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&buf[at..at + N]);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn big_endian_round_trip() {
        let mut b = [0u8; 17];
        put_be16(&mut b, 0, 0x1234);
        put_be24(&mut b, 2, 0x00ab_cdef);
        put_be32(&mut b, 5, 0xdead_beef);
        put_be64(&mut b, 9, 0x0102_0304_0506_0708);
        assert_eq!(b[..5], [0x12, 0x34, 0xab, 0xcd, 0xef]);
        assert_eq!(be16(&b, 0), 0x1234);
        assert_eq!(be24(&b, 2), 0x00ab_cdef);
        assert_eq!(be32(&b, 5), 0xdead_beef);
        assert_eq!(be64(&b, 9), 0x0102_0304_0506_0708);
        assert_eq!(array::<3>(&b, 2), [0xab, 0xcd, 0xef]);
    }
}
