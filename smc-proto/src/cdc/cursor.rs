//! Ring cursors and their wrap arithmetic, as `net/smc/smc_cdc.h` does it
//! (`smc_curs_add`, `smc_curs_diff`, `smc_curs_comp`, `smc_curs_diff_large`) and as
//! `smc_cdc_cursor_to_host` decides whether a received cursor replaces the stored one.
//!
//! A cursor is `(wrap, count)` over a ring of `N` bytes: `count` is the offset in the ring
//! (`0 <= count < N`) and `wrap` counts how often the ring was passed, modulo 2^16. Seen as one
//! number it is the position `wrap * N + count` modulo `2^16 * N`.
//!
//! The kernel trusts its inputs here. We do not: every operation takes the ring size as a
//! [`Ring`] and rejects a cursor whose `count` is not inside the ring, or a step larger than the
//! ring, with a [`CursorError`], so a cursor read from a peer's shared memory can never make the
//! arithmetic overflow, panic, or return a silently wrong number.

use thiserror::Error;

/// What was wrong with a cursor operation's input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum CursorError {
    /// A ring must hold at least one byte and, as in the kernel's `int` arithmetic, fewer than
    /// 2^31.
    #[error("ring size {size} is not in 1..=2^31-1")]
    BadRingSize {
        /// The size asked for.
        size: u32,
    },
    /// The cursor's count is not an offset inside the ring.
    #[error("cursor count {count} is outside the ring of {ring} bytes")]
    CountOutOfRange {
        /// The cursor's count.
        count: u32,
        /// The ring size.
        ring: u32,
    },
    /// A cursor can advance by at most one ring at a time.
    #[error("cannot advance a cursor by {step} bytes on a ring of {ring} bytes")]
    StepTooLarge {
        /// The step asked for.
        step: u32,
        /// The ring size.
        ring: u32,
    },
}

/// A position in a ring buffer: `wrap` (how often the ring was passed, modulo 2^16) and `count`
/// (offset inside the ring).
///
/// The kernel's host cursor is `union smc_host_cursor { struct { u16 reserved; u16 wrap;
/// u32 count; }; atomic64_t acurs; }`. On the SMC-R wire the same fields are big endian after
/// two reserved bytes; in an SMC-D DMB they are host order without the reserved bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Cursor {
    /// Number of times the ring was passed, modulo 2^16.
    pub wrap: u16,
    /// Offset inside the ring.
    pub count: u32,
}

impl Cursor {
    /// The cursor at the start of a new connection.
    pub const ZERO: Cursor = Cursor { wrap: 0, count: 0 };

    /// A cursor from its two fields (not yet checked against a ring).
    #[inline]
    pub const fn new(wrap: u16, count: u32) -> Cursor {
        Cursor { wrap, count }
    }

    /// Returns `self` if its count lies inside `ring`.
    #[inline]
    pub const fn check(self, ring: Ring) -> Result<Cursor, CursorError> {
        if self.count < ring.0 {
            Ok(self)
        } else {
            Err(CursorError::CountOutOfRange {
                count: self.count,
                ring: ring.0,
            })
        }
    }

    /// The cursor as one number, `wrap * N + count` (in `0 .. 2^16 * N`).
    #[inline]
    pub const fn position(self, ring: Ring) -> Result<u64, CursorError> {
        match self.check(ring) {
            Ok(c) => Ok(c.wrap as u64 * ring.0 as u64 + c.count as u64),
            Err(e) => Err(e),
        }
    }

    /// The cursor at position `pos` (taken modulo `2^16 * N`). Inverse of [`Cursor::position`].
    #[inline]
    pub const fn from_position(pos: u64, ring: Ring) -> Cursor {
        let n = ring.0 as u64;
        let pos = pos % (n << 16);
        Cursor {
            wrap: (pos / n) as u16,
            count: (pos % n) as u32,
        }
    }

    /// The kernel's rule for a cursor received from the peer (`smc_cdc_cursor_to_host`): the
    /// received cursor replaces `stored` unless it is older, where older means the same wrap and
    /// a smaller count, or a smaller wrap that is not 0 (a received wrap of 0 is taken as the
    /// wrap counter having rolled over from 0xffff). Equal cursors are accepted.
    ///
    /// This needs no ring size: it compares fields only, exactly as the kernel does.
    #[inline]
    pub const fn supersedes(self, stored: Cursor) -> bool {
        if stored.wrap > self.wrap && self.wrap != 0 {
            return false;
        }
        !(stored.wrap == self.wrap && stored.count > self.count)
    }
}

/// The size of a ring buffer in bytes, `1 ..= i32::MAX` (the kernel does cursor arithmetic in
/// `int`). All cursor arithmetic is done through it so each input is checked against it.
///
/// For SMC-R this is the RMBE size; for SMC-D it is the DMB size less the 32-byte CDC header
/// ([`crate::cdc::SMCD_CDC_LEN`]), as the kernel's `buf_desc->len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ring(u32);

impl Ring {
    /// Largest ring size: the kernel's cursor arithmetic is `int`.
    pub const MAX: u32 = i32::MAX as u32;

    /// A ring of `size` bytes.
    #[inline]
    pub const fn new(size: u32) -> Result<Ring, CursorError> {
        if size == 0 || size > Self::MAX {
            Err(CursorError::BadRingSize { size })
        } else {
            Ok(Ring(size))
        }
    }

    /// The size in bytes.
    #[inline]
    pub const fn size(self) -> u32 {
        self.0
    }

    /// `smc_curs_add`: advances `cur` by `step` bytes (`step <= N`). When the count reaches the
    /// ring size it is reduced by `N` and the wrap goes up by one (wrapping at 16 bits).
    #[inline]
    pub const fn add(self, cur: Cursor, step: u32) -> Result<Cursor, CursorError> {
        if let Err(e) = cur.check(self) {
            return Err(e);
        }
        if step > self.0 {
            return Err(CursorError::StepTooLarge { step, ring: self.0 });
        }
        // count < N <= 2^31 and step <= N, so the sum fits a u32 and one subtraction suffices.
        let sum = cur.count + step;
        if sum >= self.0 {
            Ok(Cursor {
                wrap: cur.wrap.wrapping_add(1),
                count: sum - self.0,
            })
        } else {
            Ok(Cursor {
                wrap: cur.wrap,
                count: sum,
            })
        }
    }

    /// `smc_curs_diff`: bytes from `old` to `new`, for `old <= new` at most one ring apart.
    ///
    /// Exactly the kernel's formula: with equal wraps `max(0, new.count - old.count)`, with
    /// different wraps `(N - old.count) + new.count`. The kernel does not look at which wrap is
    /// larger, so outside its precondition the result is the kernel's (possibly more than `N`,
    /// never more than `2N - 1`), not an error. Use [`Ring::diff_large`] when the distance may
    /// exceed one ring.
    #[inline]
    pub const fn diff(self, old: Cursor, new: Cursor) -> Result<u32, CursorError> {
        if let Err(e) = old.check(self) {
            return Err(e);
        }
        if let Err(e) = new.check(self) {
            return Err(e);
        }
        if old.wrap != new.wrap {
            // < 2N <= 2^32 - 2: fits.
            Ok((self.0 - old.count) + new.count)
        } else {
            Ok(new.count.saturating_sub(old.count))
        }
    }

    /// `smc_curs_comp`: signed distance from `old` to `new`, negative when `old` is ahead
    /// (`old.wrap > new.wrap`, or equal wraps and `old.count > new.count`; a plain, not serial,
    /// comparison of the wraps, as in the kernel).
    #[inline]
    pub const fn comp(self, old: Cursor, new: Cursor) -> Result<i64, CursorError> {
        if old.wrap > new.wrap || (old.wrap == new.wrap && old.count > new.count) {
            match self.diff(new, old) {
                Ok(d) => Ok(-(d as i64)),
                Err(e) => Err(e),
            }
        } else {
            match self.diff(old, new) {
                Ok(d) => Ok(d as i64),
                Err(e) => Err(e),
            }
        }
    }

    /// `smc_curs_diff_large`: bytes from `old` to `new` when `new` may be several rings ahead,
    /// capped at `N`. With equal wraps it is `max(0, new.count - old.count)`; a smaller `new`
    /// wrap is taken as the 16-bit wrap counter having rolled over.
    ///
    /// Computed in 64 bits: where the kernel's 32-bit product `wraps * size` would overflow
    /// (a wrap distance times the ring size of 2^32 or more) we return the intended value, `N`.
    #[inline]
    pub const fn diff_large(self, old: Cursor, new: Cursor) -> Result<u32, CursorError> {
        if let Err(e) = old.check(self) {
            return Err(e);
        }
        if let Err(e) = new.check(self) {
            return Err(e);
        }
        let n = self.0 as u64;
        let partial = (n - old.count as u64) + new.count as u64;
        let full_rings = if old.wrap < new.wrap {
            (new.wrap - old.wrap - 1) as u64
        } else if old.wrap > new.wrap {
            // wrap rolled over from 0xffff to 0x0000 (kernel: new.wrap + 0xffff - old.wrap).
            new.wrap as u64 + 0xffff - old.wrap as u64
        } else {
            return Ok(new.count.saturating_sub(old.count));
        };
        let d = partial + full_rings * n;
        Ok(if d < n { d as u32 } else { self.0 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(n: u32) -> Ring {
        Ring::new(n).unwrap()
    }

    #[test]
    fn add_wraps_count_and_wrap() {
        let r = ring(100);
        assert_eq!(r.add(Cursor::new(0, 90), 10), Ok(Cursor::new(1, 0)));
        assert_eq!(r.add(Cursor::new(0, 90), 9), Ok(Cursor::new(0, 99)));
        assert_eq!(r.add(Cursor::new(0xffff, 99), 1), Ok(Cursor::new(0, 0)));
        assert_eq!(r.add(Cursor::new(3, 5), 100), Ok(Cursor::new(4, 5)));
    }

    #[test]
    fn bad_inputs_are_errors() {
        assert_eq!(Ring::new(0), Err(CursorError::BadRingSize { size: 0 }));
        assert_eq!(
            Ring::new(1 << 31),
            Err(CursorError::BadRingSize { size: 1 << 31 })
        );
        let r = ring(100);
        assert_eq!(
            r.add(Cursor::new(0, 100), 1),
            Err(CursorError::CountOutOfRange {
                count: 100,
                ring: 100
            })
        );
        assert_eq!(
            r.add(Cursor::new(0, 0), 101),
            Err(CursorError::StepTooLarge {
                step: 101,
                ring: 100
            })
        );
        assert!(r.diff(Cursor::new(0, 0), Cursor::new(0, u32::MAX)).is_err());
        assert!(
            r.diff_large(Cursor::new(0, 200), Cursor::new(0, 0))
                .is_err()
        );
        assert!(r.comp(Cursor::new(9, 200), Cursor::new(0, 0)).is_err());
    }

    #[test]
    fn diff_is_the_kernel_formula() {
        let r = ring(100);
        assert_eq!(r.diff(Cursor::new(0, 10), Cursor::new(0, 30)), Ok(20));
        assert_eq!(r.diff(Cursor::new(0, 30), Cursor::new(0, 10)), Ok(0));
        assert_eq!(r.diff(Cursor::new(0, 90), Cursor::new(1, 5)), Ok(15));
        assert_eq!(r.diff(Cursor::new(0xffff, 90), Cursor::new(0, 5)), Ok(15));
        // Outside the precondition (more than one ring): the kernel's number, 2N - 1 at most.
        assert_eq!(r.diff(Cursor::new(0, 0), Cursor::new(1, 99)), Ok(199));
    }

    #[test]
    fn comp_and_diff_large() {
        let r = ring(100);
        assert_eq!(r.comp(Cursor::new(1, 10), Cursor::new(0, 90)), Ok(-20));
        assert_eq!(r.comp(Cursor::new(0, 90), Cursor::new(1, 10)), Ok(20));
        assert_eq!(r.diff_large(Cursor::new(0, 90), Cursor::new(1, 5)), Ok(15));
        assert_eq!(r.diff_large(Cursor::new(0, 90), Cursor::new(2, 5)), Ok(100));
        assert_eq!(
            r.diff_large(Cursor::new(0xffff, 90), Cursor::new(0, 5)),
            Ok(15)
        );
        assert_eq!(r.diff_large(Cursor::new(5, 50), Cursor::new(5, 40)), Ok(0));
        // Huge wrap distance on a huge ring: 64-bit math, no overflow.
        let big = ring(Ring::MAX);
        assert_eq!(
            big.diff_large(Cursor::new(0, 0), Cursor::new(0x8000, 0)),
            Ok(Ring::MAX)
        );
    }

    #[test]
    fn supersedes_is_smc_cdc_cursor_to_host() {
        let stored = Cursor::new(5, 50);
        assert!(Cursor::new(5, 50).supersedes(stored));
        assert!(Cursor::new(5, 51).supersedes(stored));
        assert!(!Cursor::new(5, 49).supersedes(stored));
        assert!(!Cursor::new(4, 99).supersedes(stored));
        assert!(Cursor::new(6, 0).supersedes(stored));
        // wrap 0 is taken as a roll-over and accepted
        assert!(Cursor::new(0, 0).supersedes(Cursor::new(0xffff, 3)));
    }
}
