#![no_main]
//! Fuzz target for the CDC decoders and cursor arithmetic.
//!
//! Oracle: nothing panics; whatever parses re-emits to bytes that parse to the same value;
//! SMC-D cursor words round-trip exactly; cursor operations either fail with a typed error or
//! agree with a 64-bit position model.
use libfuzzer_sys::fuzz_target;
use smc_proto::cdc::{
    Cursor, CursorError, Ring, SmcdCdc, SmcdCdcRepr, SmcdCursorWord, SmcrCdc, SmcrCdcRepr,
    rmbe_update_limit, seqno_before,
};

fn word(data: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    for (i, x) in b.iter_mut().enumerate() {
        *x = data.get(at + i).copied().unwrap_or(0);
    }
    u64::from_le_bytes(b)
}

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = SmcrCdc::new_checked(data) {
        let _ = (v.seqno(), v.token(), v.prod_cursor(), v.cons_cursor(), v.prod_flags());
        if let Ok(r) = SmcrCdcRepr::parse(&v) {
            let b = r.to_bytes();
            assert_eq!(SmcrCdcRepr::parse_bytes(&b), Ok(r));
        }
    }
    if let Ok(v) = SmcdCdc::new_checked(data) {
        let _ = (v.prod_word(), v.cons_word(), v.engine_word(), v.msg_type());
        let r = SmcdCdcRepr::parse(&v).expect("any 32 bytes are an SMC-D header");
        assert_eq!(SmcdCdcRepr::parse_bytes(&r.to_bytes()), Ok(r));
    }

    // Cursor words: every u64 is a valid slot and round-trips.
    let w = word(data, 0);
    let d = SmcdCursorWord::decode(w);
    assert_eq!(SmcdCursorWord::encode(d.cursor, d.prod_flags, d.conn_flags), w);

    // Cursor arithmetic on arbitrary inputs.
    let n = (word(data, 8) & 0xffff_ffff) as u32;
    let a = SmcdCursorWord::decode(word(data, 16)).cursor;
    let b = SmcdCursorWord::decode(word(data, 24)).cursor;
    let step = (word(data, 32) & 0xffff_ffff) as u32;
    let _ = seqno_before(a.wrap, b.wrap);
    let _ = rmbe_update_limit(n);
    let _ = a.supersedes(b);
    match Ring::new(n) {
        Err(e) => assert_eq!(e, CursorError::BadRingSize { size: n }),
        Ok(ring) => {
            if let Ok(c) = ring.add(a, step) {
                let m = (n as u64) << 16;
                let want = (a.wrap as u64 * n as u64 + a.count as u64 + step as u64) % m;
                assert_eq!(c.position(ring), Ok(want));
                assert_eq!(ring.diff(a, c), Ok(step));
                assert_eq!(ring.diff_large(a, c), Ok(step));
            }
            if let Ok(x) = ring.diff(a, b) {
                assert!((x as u64) < 2 * n as u64);
            }
            if let Ok(x) = ring.diff_large(a, b) {
                assert!(x <= n);
            }
            let _ = ring.comp(a, b);
            let _ = Cursor::from_position(word(data, 40), ring);
        }
    }
});
