//! CDC messages both ways from hand-written bytes, receive checks, and proptests
//! (round trip of valid values; mutated/truncated messages never panic and re-emit consistently).

use proptest::prelude::*;
use smc_proto::cdc::{
    CONS_OFFSET, CdcError, ConnStateFlags, Cursor, ENGINE_WORD_OFFSET, PROD_OFFSET, ProducerFlags,
    SMCD_CDC_LEN, SMCR_CDC_LEN, SmcdCdc, SmcdCdcRepr, SmcdCursorWord, SmcrCdc, SmcrCdcRepr,
    seqno_before,
};

/// An SMC-R CDC written out from the layout (facts §2.1 / `struct smc_cdc_msg`).
#[rustfmt::skip]
const SMCR_BYTES: [u8; 44] = [
    0xfe,                   // type
    0x2c,                   // length 44
    0x12, 0x34,             // seqno 0x1234
    0xde, 0xad, 0xbe, 0xef, // token
    0x00, 0x00,             // prod: reserved
    0x00, 0x07,             //       wrap 7
    0x00, 0x01, 0x00, 0x00, //       count 0x10000
    0x00, 0x00,             // cons: reserved
    0xff, 0xff,             //       wrap 0xffff
    0x00, 0x00, 0x3f, 0xff, //       count 0x3fff
    0x98,                   // prod flags: write_blocked | cons_curs_upd_req | failover_validation
    0x60,                   // conn flags: peer_conn_closed | peer_conn_abort
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // reserved 18
];

fn smcr_repr() -> SmcrCdcRepr {
    SmcrCdcRepr {
        seqno: 0x1234,
        token: 0xdead_beef,
        prod: Cursor::new(7, 0x1_0000),
        cons: Cursor::new(0xffff, 0x3fff),
        prod_flags: ProducerFlags::WRITE_BLOCKED
            | ProducerFlags::CONS_CURS_UPD_REQ
            | ProducerFlags::FAILOVER_VALIDATION,
        conn_flags: ConnStateFlags::PEER_CONN_CLOSED | ConnStateFlags::PEER_CONN_ABORT,
    }
}

#[test]
fn smcr_bytes_to_repr_and_back() {
    assert_eq!(SmcrCdcRepr::parse_bytes(&SMCR_BYTES), Ok(smcr_repr()));
    assert_eq!(smcr_repr().to_bytes(), SMCR_BYTES);
    let mut buf = [0xaau8; 44];
    smcr_repr().emit(&mut SmcrCdc::new_unchecked(&mut buf[..]));
    assert_eq!(buf, SMCR_BYTES, "emit must zero every reserved byte");
}

#[test]
fn smcr_view_getters() {
    let v = SmcrCdc::new_checked(&SMCR_BYTES[..]).unwrap();
    assert_eq!(v.msg_type(), 0xfe);
    assert_eq!(v.length(), 44);
    assert!(v.prod_flags().failover_validation());
    assert!(v.conn_flags().peer_conn_abort());
    assert_eq!(v.prod_cursor_reserved(), 0);
}

#[test]
fn smcr_receive_checks() {
    // The kernel reads only up to the flags: 26 bytes are enough.
    assert_eq!(SmcrCdcRepr::parse_bytes(&SMCR_BYTES[..26]), Ok(smcr_repr()));
    assert_eq!(
        SmcrCdcRepr::parse_bytes(&SMCR_BYTES[..25]),
        Err(CdcError::Truncated { need: 26, have: 25 })
    );
    let mut b = SMCR_BYTES;
    b[1] = 43;
    assert_eq!(
        SmcrCdcRepr::parse_bytes(&b),
        Err(CdcError::BadLength { found: 43 })
    );
    let mut b = SMCR_BYTES;
    b[0] = 0x01;
    assert_eq!(
        SmcrCdcRepr::parse_bytes(&b),
        Err(CdcError::BadType { found: 0x01 })
    );
    // Reserved bytes in the cursors and the tail are ignored, as by the kernel.
    let mut b = SMCR_BYTES;
    b[8] = 0xff;
    b[17] = 0x01;
    b[43] = 0x55;
    assert_eq!(SmcrCdcRepr::parse_bytes(&b), Ok(smcr_repr()));
}

#[test]
fn seqno_serial_compare() {
    assert!(seqno_before(1, 2));
    assert!(!seqno_before(2, 1));
    assert!(!seqno_before(5, 5));
    assert!(seqno_before(0xffff, 0));
    assert!(!seqno_before(0, 0xffff));
    assert!(!seqno_before(0x8000, 0x0001)); // 0x7fff ahead: newer
    assert!(seqno_before(0x0003, 0x8002)); // 0x7fff behind: older
    // exactly half way: (s16)(0 - 0x8000) = -32768 < 0
    assert!(seqno_before(0, 0x8000));
}

/// The SMC-D header for `smcd_repr()` on this host (host byte order, facts §2.3).
fn smcd_bytes() -> [u8; 32] {
    #[cfg(target_endian = "little")]
    #[rustfmt::skip]
    let b = [
        0xfe, 0, 0, 0, 0, 0, 0, 0,      // type, reserved 7
        0x05, 0x00,                     // prod wrap 5
        0x00, 0x80, 0x01, 0x00,         // prod count 0x18000
        0x00, 0x00,                     // prod slot flag bytes: zero
        0x02, 0x01,                     // cons wrap 0x0102
        0x78, 0x56, 0x00, 0x00,         // cons count 0x5678
        0x40,                           // prod flags (in the consumer slot): urg_data_pending
        0x80,                           // conn flags (in the consumer slot): peer_done_writing
        0, 0, 0, 0, 0, 0, 0, 0,         // reserved / engine word
    ];
    #[cfg(target_endian = "big")]
    #[rustfmt::skip]
    let b = [
        0xfe, 0, 0, 0, 0, 0, 0, 0,
        0x00, 0x05,
        0x00, 0x01, 0x80, 0x00,
        0x00, 0x00,
        0x01, 0x02,
        0x00, 0x00, 0x56, 0x78,
        0x40,
        0x80,
        0, 0, 0, 0, 0, 0, 0, 0,
    ];
    b
}

fn smcd_repr() -> SmcdCdcRepr {
    SmcdCdcRepr {
        prod: Cursor::new(5, 0x1_8000),
        cons: Cursor::new(0x0102, 0x5678),
        prod_flags: ProducerFlags::URG_DATA_PENDING,
        conn_flags: ConnStateFlags::PEER_DONE_WRITING,
    }
}

#[test]
fn smcd_bytes_to_repr_and_back() {
    assert_eq!(SmcdCdcRepr::parse_bytes(&smcd_bytes()), Ok(smcd_repr()));
    assert_eq!(smcd_repr().to_bytes(), smcd_bytes());
}

#[test]
fn smcd_emit_leaves_engine_word_alone() {
    let mut buf = [0xaau8; 32];
    smcd_repr().emit(&mut SmcdCdc::new_unchecked(&mut buf[..]));
    assert_eq!(
        buf[..ENGINE_WORD_OFFSET],
        smcd_bytes()[..ENGINE_WORD_OFFSET]
    );
    assert_eq!(buf[ENGINE_WORD_OFFSET..], [0xaa; 8]);
    // and parse does not look at it, nor at the type byte or the producer slot's flag bytes
    buf[0] = 0x00;
    buf[14] = 0xff;
    buf[15] = 0xff;
    assert_eq!(SmcdCdcRepr::parse_bytes(&buf), Ok(smcd_repr()));
    let v = SmcdCdc::new_checked(&buf[..]).unwrap();
    assert_eq!(v.engine_word(), u64::from_ne_bytes([0xaa; 8]));
}

#[test]
fn smcd_truncated() {
    assert_eq!(
        SmcdCdcRepr::parse_bytes(&smcd_bytes()[..31]),
        Err(CdcError::Truncated { need: 32, have: 31 })
    );
}

#[test]
fn smcd_words_are_the_slot_bytes_in_host_order() {
    let b = smcd_bytes();
    let prod = u64::from_ne_bytes(b[PROD_OFFSET..PROD_OFFSET + 8].try_into().unwrap());
    let cons = u64::from_ne_bytes(b[CONS_OFFSET..CONS_OFFSET + 8].try_into().unwrap());
    assert_eq!(smcd_repr().prod_word(), prod);
    assert_eq!(smcd_repr().cons_word(), cons);
    let view = SmcdCdc::new_checked(&b[..]).unwrap();
    assert_eq!(view.prod_word(), prod);
    assert_eq!(view.cons_word(), cons);
    // The documented shift form for each endianness.
    let w = SmcdCursorWord::encode(
        Cursor::new(0x0102, 0x0304_0506),
        ProducerFlags::from_bits_retain(0x07),
        ConnStateFlags::from_bits_retain(0x08),
    );
    #[cfg(target_endian = "little")]
    assert_eq!(w, 0x0807_0304_0506_0102);
    #[cfg(target_endian = "big")]
    assert_eq!(w, 0x0102_0304_0506_0708);
    let d = SmcdCursorWord::decode(w);
    assert_eq!(d.cursor, Cursor::new(0x0102, 0x0304_0506));
    assert_eq!(d.prod_flags.bits(), 0x07);
    assert_eq!(d.conn_flags.bits(), 0x08);
    assert_eq!(SMCD_CDC_LEN, 32);
    assert_eq!(SMCR_CDC_LEN, 44);
}

fn arb_cursor() -> impl Strategy<Value = Cursor> {
    (any::<u16>(), any::<u32>()).prop_map(|(w, c)| Cursor::new(w, c))
}

fn arb_smcr() -> impl Strategy<Value = SmcrCdcRepr> {
    (
        any::<u16>(),
        any::<u32>(),
        arb_cursor(),
        arb_cursor(),
        any::<u8>(),
        any::<u8>(),
    )
        .prop_map(|(seqno, token, prod, cons, p, c)| SmcrCdcRepr {
            seqno,
            token,
            prod,
            cons,
            prod_flags: ProducerFlags::from_bits_retain(p),
            conn_flags: ConnStateFlags::from_bits_retain(c),
        })
}

fn arb_smcd() -> impl Strategy<Value = SmcdCdcRepr> {
    (arb_cursor(), arb_cursor(), any::<u8>(), any::<u8>()).prop_map(|(prod, cons, p, c)| {
        SmcdCdcRepr {
            prod,
            cons,
            prod_flags: ProducerFlags::from_bits_retain(p),
            conn_flags: ConnStateFlags::from_bits_retain(c),
        }
    })
}

proptest! {
    #[test]
    fn smcr_round_trip(r in arb_smcr()) {
        prop_assert_eq!(SmcrCdcRepr::parse_bytes(&r.to_bytes()), Ok(r));
    }

    #[test]
    fn smcd_round_trip(r in arb_smcd()) {
        prop_assert_eq!(SmcdCdcRepr::parse_bytes(&r.to_bytes()), Ok(r));
    }

    #[test]
    fn smcd_word_round_trip(w in any::<u64>()) {
        let d = SmcdCursorWord::decode(w);
        prop_assert_eq!(SmcdCursorWord::encode(d.cursor, d.prod_flags, d.conn_flags), w);
        prop_assert_eq!(d.to_word(), w);
        // The shift forms agree with the slot's memory layout.
        prop_assert_eq!(d, SmcdCursorWord::from_bytes(w.to_ne_bytes()));
    }

    #[test]
    fn smcr_mutations_never_panic(
        r in arb_smcr(),
        flips in proptest::collection::vec((0usize..44, any::<u8>()), 0..6),
        cut in 0usize..=44,
    ) {
        let mut b = r.to_bytes().to_vec();
        for (i, x) in flips { b[i] ^= x; }
        b.truncate(cut);
        if let Ok(v) = SmcrCdcRepr::parse_bytes(&b) {
            prop_assert_eq!(SmcrCdcRepr::parse_bytes(&v.to_bytes()), Ok(v));
        }
    }

    #[test]
    fn smcd_mutations_never_panic(
        r in arb_smcd(),
        flips in proptest::collection::vec((0usize..32, any::<u8>()), 0..6),
        cut in 0usize..=32,
    ) {
        let mut b = r.to_bytes().to_vec();
        for (i, x) in flips { b[i] ^= x; }
        b.truncate(cut);
        if let Ok(v) = SmcdCdcRepr::parse_bytes(&b) {
            prop_assert_eq!(SmcdCdcRepr::parse_bytes(&v.to_bytes()), Ok(v));
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..64)) {
        let _ = SmcrCdcRepr::parse_bytes(&b);
        let _ = SmcdCdcRepr::parse_bytes(&b);
    }
}
