//! Between absolute byte positions and the `(wrap, count)` cursors of a CDC
//! (`union smc_host_cursor` in `smc_cdc.h`).
//!
//! A cursor on the wire is `(wrap: u16, count: u32)` with `count < ring_len`: a position modulo
//! `65536 × ring_len`. The engine keeps absolute `u64` positions and turns a received cursor
//! back into one relative to the last position it accepted, rejecting anything that moves
//! backwards or further than the ring allows (ARCHITECTURE rule 4: the peer is untrusted).

use core::fmt;
use smc_proto::cdc::Cursor;

/// The wire cursor for absolute position `pos` in a ring of `ring_len` bytes.
pub fn to_cursor(pos: u64, ring_len: usize) -> Cursor {
    let ring = ring_len as u64;
    Cursor {
        wrap: ((pos / ring) & 0xffff) as u16,
        count: (pos % ring) as u32,
    }
}

/// Why a received cursor was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CursorError {
    /// `count` was not inside the ring.
    CountOutOfRing {
        /// The count received.
        count: u32,
        /// The ring length.
        ring_len: usize,
    },
    /// The cursor moved further than the peer could have moved it.
    TooFar {
        /// How far it moved.
        advance: u64,
        /// How far it could have moved.
        max: u64,
    },
}

impl fmt::Display for CursorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::CountOutOfRing { count, ring_len } => {
                write!(f, "cursor count {count} outside a ring of {ring_len} bytes")
            }
            Self::TooFar { advance, max } => {
                write!(
                    f,
                    "cursor advanced by {advance} bytes, at most {max} possible"
                )
            }
        }
    }
}

impl core::error::Error for CursorError {}

/// The absolute position a received cursor stands for, given the last accepted position
/// `last` and the furthest position the peer could legitimately have reached (`limit`).
/// A cursor equal to `last` gives `last`; anything that would move backwards shows up as an
/// advance of almost `65536 × ring_len` and is refused as too far.
pub fn from_cursor(c: Cursor, ring_len: usize, last: u64, limit: u64) -> Result<u64, CursorError> {
    let ring = ring_len as u64;
    if u64::from(c.count) >= ring {
        return Err(CursorError::CountOutOfRing {
            count: c.count,
            ring_len,
        });
    }
    let modulus = ring * 65536;
    let encoded = u64::from(c.wrap) * ring + u64::from(c.count);
    let advance = (encoded + modulus - last % modulus) % modulus;
    let max = limit.saturating_sub(last);
    if advance > max {
        return Err(CursorError::TooFar { advance, max });
    }
    Ok(last + advance)
}

/// The wire cursor `n` bytes after `c` in a ring of `ring_len` bytes, without a division
/// (the data path keeps cursors next to positions and moves both).
#[inline]
pub fn advance(mut c: Cursor, n: u64, ring_len: usize) -> Cursor {
    let ring = ring_len as u64;
    let mut count = u64::from(c.count) + n;
    while count >= ring {
        count -= ring;
        c.wrap = c.wrap.wrapping_add(1);
    }
    c.count = count as u32;
    c
}

/// [`from_cursor`] relative to the last accepted position `last` whose cursor is `last_c`,
/// without a division: the same result for every input.
#[inline]
pub fn from_cursor_at(
    c: Cursor,
    ring_len: usize,
    last: u64,
    last_c: Cursor,
    limit: u64,
) -> Result<u64, CursorError> {
    if c == last_c {
        // Unmoved (the other word of a CDC whose one word changed): `last_c` was checked.
        return Ok(last);
    }
    let ring = ring_len as u64;
    if u64::from(c.count) >= ring {
        return Err(CursorError::CountOutOfRing {
            count: c.count,
            ring_len,
        });
    }
    let max = limit.saturating_sub(last);
    let wraps = u64::from(c.wrap.wrapping_sub(last_c.wrap));
    // Same wrap and a smaller count is a step backwards: modulo 2^16 wraps that is almost a
    // whole cycle forwards, which no window allows.
    let advance = (wraps * ring + u64::from(c.count))
        .checked_sub(u64::from(last_c.count))
        .unwrap_or_else(|| ring * 65536 - (u64::from(last_c.count) - u64::from(c.count)));
    if advance > max {
        return Err(CursorError::TooFar { advance, max });
    }
    Ok(last + advance)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip_and_refusals() {
        let ring = 65504;
        for pos in [
            0u64,
            1,
            65503,
            65504,
            65505,
            10 * 65504 + 7,
            (65536u64 * 65504) + 3,
        ] {
            let c = to_cursor(pos, ring);
            // Any position reachable from `last` within the window decodes back.
            let last = pos.saturating_sub(100);
            assert_eq!(from_cursor(c, ring, last, last + ring as u64), Ok(pos));
        }
        assert!(matches!(
            from_cursor(
                Cursor {
                    wrap: 0,
                    count: 65504
                },
                ring,
                0,
                65504
            ),
            Err(CursorError::CountOutOfRing { .. })
        ));
        // Backwards is refused (it looks like almost a full 2^16 wraps forward).
        let c = to_cursor(100, ring);
        assert!(matches!(
            from_cursor(c, ring, 200, 200 + ring as u64),
            Err(CursorError::TooFar { .. })
        ));
        // Further than the window is refused.
        let c = to_cursor(ring as u64 + 1, ring);
        assert!(from_cursor(c, ring, 0, ring as u64).is_err());
    }

    proptest! {
        /// Whatever a peer writes, the decoded position is either refused or lies in
        /// [last, limit]; a position the peer could legitimately have written decodes exactly.
        #[test]
        fn never_outside_the_window(wrap: u16, count: u32, last in 0u64..1 << 40, win in 0u64..1 << 20, ring in 16352usize..1 << 20) {
            let limit = last + win;
            if let Ok(p) = from_cursor(Cursor { wrap, count }, ring, last, limit) {
                prop_assert!(p >= last && p <= limit);
            }
            let legit = last + win / 2;
            prop_assert_eq!(from_cursor(to_cursor(legit, ring), ring, last, limit), Ok(legit));
        }

        /// The division-free forms agree with the plain ones for every input.
        #[test]
        fn division_free_forms_agree(wrap: u16, count: u32, last in 0u64..1 << 40, win in 0u64..1 << 21,
                                     ring in 16352usize..1 << 20, n in 0u64..1 << 21) {
            let c = Cursor { wrap, count: count % (ring as u32 + 5) };
            let limit = last + win;
            prop_assert_eq!(
                from_cursor_at(c, ring, last, to_cursor(last, ring), limit),
                from_cursor(c, ring, last, limit)
            );
            prop_assert_eq!(advance(to_cursor(last, ring), n, ring), to_cursor(last + n, ring));
        }
    }
}
