//! Cursor arithmetic against a 64-bit reference model: a cursor is the position
//! `wrap * N + count` modulo `2^16 * N`, and advancing is addition modulo that.

use proptest::prelude::*;
use smc_proto::cdc::{Cursor, CursorError, Ring};

/// The model: position of a cursor, and the cursor at a position.
fn pos(c: Cursor, n: u32) -> u64 {
    c.wrap as u64 * n as u64 + c.count as u64
}

fn at(p: u64, n: u32) -> Cursor {
    let m = (n as u64) << 16;
    let p = p % m;
    Cursor::new((p / n as u64) as u16, (p % n as u64) as u32)
}

fn arb_ring() -> impl Strategy<Value = u32> {
    prop_oneof![1u32..=64, 1u32..=(1 << 20), (Ring::MAX - 64)..=Ring::MAX]
}

/// A ring size and a valid cursor on it.
fn ring_and_cursor() -> impl Strategy<Value = (u32, Cursor)> {
    arb_ring()
        .prop_flat_map(|n| (Just(n), any::<u16>(), 0..n))
        .prop_map(|(n, w, c)| (n, Cursor::new(w, c)))
}

proptest! {
    #[test]
    fn add_is_modular_addition((n, c) in ring_and_cursor(), step_frac in 0.0f64..=1.0) {
        let ring = Ring::new(n).unwrap();
        let step = ((n as f64) * step_frac) as u32;
        let got = ring.add(c, step).unwrap();
        let m = (n as u64) << 16;
        prop_assert_eq!(got, at((pos(c, n) + step as u64) % m, n));
        prop_assert_eq!(Cursor::from_position(pos(c, n) + step as u64, ring), got);
        prop_assert_eq!(got.position(ring).unwrap(), (pos(c, n) + step as u64) % m);
        prop_assert!(got.count < n);
    }

    #[test]
    fn diff_recovers_the_step((n, c) in ring_and_cursor(), step_frac in 0.0f64..=1.0) {
        let ring = Ring::new(n).unwrap();
        let step = ((n as f64) * step_frac) as u32;
        let new = ring.add(c, step).unwrap();
        prop_assert_eq!(ring.diff(c, new), Ok(step));
        prop_assert_eq!(ring.diff_large(c, new), Ok(step));
        // Backwards within one ring the kernel's diff clamps to 0 only with equal wraps.
        if new.wrap == c.wrap {
            prop_assert_eq!(ring.diff(new, c), Ok(0));
        }
    }

    #[test]
    fn comp_is_signed_distance_without_rollover(
        (n, c) in ring_and_cursor(), step_frac in 0.0f64..=1.0
    ) {
        let ring = Ring::new(n).unwrap();
        let step = ((n as f64) * step_frac) as u32;
        let new = ring.add(c, step).unwrap();
        // The kernel compares wraps plainly, so the 0xffff -> 0 roll-over is excluded here
        // (see comp_at_rollover for what happens there).
        prop_assume!(new.wrap >= c.wrap);
        prop_assert_eq!(ring.comp(c, new), Ok(step as i64));
        prop_assert_eq!(ring.comp(new, c), Ok(-(step as i64)));
    }

    #[test]
    fn diff_large_is_distance_capped_at_ring(
        (n, c) in ring_and_cursor(), d_frac in 0.0f64..1.0
    ) {
        let ring = Ring::new(n).unwrap();
        // distances up to 65535 rings, where the wrap counter alone still tells them apart
        let d = ((65535.0 * n as f64) * d_frac) as u64;
        let new = at(pos(c, n) + d, n);
        prop_assert_eq!(ring.diff_large(c, new), Ok(d.min(n as u64) as u32));
    }

    #[test]
    fn newer_supersedes_older_does_not((n, c) in ring_and_cursor(), step_frac in 0.0f64..=1.0) {
        let ring = Ring::new(n).unwrap();
        let step = ((n as f64) * step_frac) as u32;
        let new = ring.add(c, step).unwrap();
        prop_assert!(new.supersedes(c));
        // An older cursor is refused, except the kernel's wrap-0 cases: a wrap of 0 is taken as
        // a roll-over and accepted.
        if step > 0 && c.wrap != 0 && new.wrap >= c.wrap {
            prop_assert!(!c.supersedes(new));
        }
    }

    #[test]
    fn invalid_inputs_are_errors_never_panics(
        n in any::<u32>(), w1 in any::<u16>(), c1 in any::<u32>(),
        w2 in any::<u16>(), c2 in any::<u32>(), step in any::<u32>(),
    ) {
        let a = Cursor::new(w1, c1);
        let b = Cursor::new(w2, c2);
        match Ring::new(n) {
            Err(e) => prop_assert_eq!(e, CursorError::BadRingSize { size: n }),
            Ok(ring) => {
                let r = ring.add(a, step);
                if c1 >= n {
                    prop_assert_eq!(r, Err(CursorError::CountOutOfRange { count: c1, ring: n }));
                } else if step > n {
                    prop_assert_eq!(r, Err(CursorError::StepTooLarge { step, ring: n }));
                } else {
                    prop_assert!(r.is_ok());
                }
                let valid = c1 < n && c2 < n;
                prop_assert_eq!(ring.diff(a, b).is_ok(), valid);
                prop_assert_eq!(ring.diff_large(a, b).is_ok(), valid);
                prop_assert_eq!(ring.comp(a, b).is_ok(), valid);
                if let Ok(d) = ring.diff(a, b) {
                    prop_assert!((d as u64) < 2 * n as u64);
                }
                if let Ok(d) = ring.diff_large(a, b) {
                    prop_assert!(d <= n);
                }
                let _ = a.supersedes(b);
            }
        }
    }
}

#[test]
fn comp_at_rollover() {
    // Plain wrap comparison, as smc_curs_comp: 0xffff looks "ahead" of 0.
    let ring = Ring::new(100).unwrap();
    let old = Cursor::new(0xffff, 90);
    let new = ring.add(old, 20).unwrap();
    assert_eq!(new, Cursor::new(0, 10));
    assert_eq!(ring.comp(old, new), Ok(-180));
    // diff and diff_large handle it.
    assert_eq!(ring.diff(old, new), Ok(20));
    assert_eq!(ring.diff_large(old, new), Ok(20));
    assert!(new.supersedes(old));
}

#[test]
fn older_with_wrap_zero_is_accepted_like_the_kernel() {
    let stored = Cursor::new(1, 10);
    assert!(Cursor::new(0, 50).supersedes(stored));
}

#[test]
fn one_byte_ring() {
    let ring = Ring::new(1).unwrap();
    let c = ring.add(Cursor::ZERO, 1).unwrap();
    assert_eq!(c, Cursor::new(1, 0));
    assert_eq!(ring.diff(Cursor::ZERO, c), Ok(1));
    assert_eq!(
        ring.add(c, 2),
        Err(CursorError::StepTooLarge { step: 2, ring: 1 })
    );
}
