//! The 4-bit compressed buffer size of Accept/Confirm (`smc_compress_bufsize()` /
//! `smc_uncompress_bufsize()` in `net/smc/smc_core.c`): code `c` means `2^(c+14)` bytes.

/// Smallest buffer (`SMC_BUF_MIN_SIZE`), code 0.
pub const SMC_BUF_MIN_SIZE: usize = 16384;
/// Largest code for an SMC-R RMB (`SMCR_RMBE_SIZES`): 512 KiB.
pub const SMCR_MAX_BUFSIZE_CODE: u8 = 5;
/// Largest code for an SMC-D DMB (`SMCD_DMBE_SIZES`): 1 MiB.
pub const SMCD_MAX_BUFSIZE_CODE: u8 = 6;
/// The first 32 bytes of an SMC-D DMB hold the CDC message the peer writes; the ring behind
/// it is `size - 32` bytes, both for the owner and in the peer's view.
pub const SMCD_DMB_HEADER_LEN: usize = 32;

/// Encodes a buffer size, rounding **up** to the next power of two (anything up to 16 KiB is
/// code 0) and capping at `max_code` ([`SMCR_MAX_BUFSIZE_CODE`] or
/// [`SMCD_MAX_BUFSIZE_CODE`]; anything above 15 is treated as 15, the nibble's limit).
pub fn compress_bufsize(size: usize, max_code: u8) -> u8 {
    let max_code = max_code.min(15);
    if size <= SMC_BUF_MIN_SIZE {
        return 0;
    }
    // (size - 1) >> 14 is at least 1 here, so ilog2 is defined.
    let units = (size - 1) >> 14;
    let code = units.ilog2() + 1;
    u8::try_from(code).unwrap_or(u8::MAX).min(max_code)
}

/// Decodes a code: `2^(code+14)` bytes. Only the low nibble is used, as on the wire.
pub fn uncompress_bufsize(code: u8) -> usize {
    1usize << (u32::from(code & 0x0f) + 14)
}

/// Usable ring size of an SMC-D DMB of `dmb_size` bytes (`dmb_size - 32`, saturating).
pub fn smcd_dmb_data_len(dmb_size: usize) -> usize {
    dmb_size.saturating_sub(SMCD_DMB_HEADER_LEN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let kib = 1024;
        for (code, size) in [
            (0, 16),
            (1, 32),
            (2, 64),
            (3, 128),
            (4, 256),
            (5, 512),
            (6, 1024),
        ] {
            assert_eq!(uncompress_bufsize(code), size * kib);
            assert_eq!(compress_bufsize(size * kib, 6), code);
        }
    }

    #[test]
    fn rounds_up_and_caps() {
        assert_eq!(compress_bufsize(0, 5), 0);
        assert_eq!(compress_bufsize(1, 5), 0);
        assert_eq!(compress_bufsize(16384, 5), 0);
        assert_eq!(compress_bufsize(16385, 5), 1);
        assert_eq!(compress_bufsize(65537, 5), 3);
        assert_eq!(compress_bufsize(1 << 20, SMCR_MAX_BUFSIZE_CODE), 5);
        assert_eq!(compress_bufsize(1 << 20, SMCD_MAX_BUFSIZE_CODE), 6);
        assert_eq!(compress_bufsize(usize::MAX, 200), 15);
        assert_eq!(uncompress_bufsize(0xf6), uncompress_bufsize(6));
        assert_eq!(smcd_dmb_data_len(65536), 65504);
        assert_eq!(smcd_dmb_data_len(3), 0);
    }

    #[test]
    fn never_rounds_down() {
        for size in (1..(2 << 20)).step_by(997) {
            let c = compress_bufsize(size, 15);
            assert!(uncompress_bufsize(c) >= size);
            if c > 0 {
                assert!(uncompress_bufsize(c - 1) < size);
            }
        }
    }
}
