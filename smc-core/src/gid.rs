//! SMC-D GIDs: 128 bits for an emulated ISM device such as loopback-ism (`gid` in the CLC GID
//! fields, `gid_ext` in the v2 extensions), 64 for a native ISM device.

/// A 128-bit SMC-D GID: `gid` in the high half, `gid_ext` in the low half.
pub type Gid = u128;

/// The first 64 bits of a GID (what the CLC GID fields and the SMC-D area carry).
pub const fn gid_hi(g: Gid) -> u64 {
    (g >> 64) as u64
}

/// The last 64 bits of a GID (`gid_ext` in CLC v2).
pub const fn gid_lo(g: Gid) -> u64 {
    g as u64
}

/// Joins `gid` and `gid_ext` into a 128-bit GID.
pub const fn gid_join(hi: u64, lo: u64) -> Gid {
    ((hi as u128) << 64) | lo as u128
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves() {
        let g = gid_join(0x1122, 0x3344);
        assert_eq!((gid_hi(g), gid_lo(g)), (0x1122, 0x3344));
    }
}
