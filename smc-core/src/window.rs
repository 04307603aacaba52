//! Send and receive rules of `net/smc/smc_tx.c` and `smc_rx.c`, as pure functions over byte
//! positions.
//!
//! Positions are absolute 64-bit byte counts (bytes ever produced into, or consumed from, a
//! ring); a 64-bit count does not wrap in the life of a connection. The wire's
//! `(wrap, count)` cursors are produced from and validated against these at the shared-memory
//! boundary ([`super::cursor`]).

/// `SOCK_MIN_SNDBUF / 2`: the floor of the window-update limit.
pub const WND_UPDATE_FLOOR: usize = smc_proto::cdc::RMBE_UPDATE_LIMIT_MIN as usize;

/// Which window-update limit to use. The kernel used `min()` until the 2022 fix "net/smc:
/// correct settings of RMB window update limit"; `Min` is kept only so the benchmark can show
/// what the fix bought.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WndUpdateRule {
    /// `max(rmbe_len / 10, 2304)` (current kernels).
    #[default]
    Max,
    /// `min(rmbe_len / 10, 2304)` (before the fix).
    Min,
}

/// `smc_rmb_wnd_update_limit`: how many consumed bytes the reader may leave unreported.
pub fn rmbe_update_limit(rmbe_len: usize, rule: WndUpdateRule) -> usize {
    match rule {
        WndUpdateRule::Max => {
            smc_proto::cdc::rmbe_update_limit(u32::try_from(rmbe_len).unwrap_or(u32::MAX)) as usize
        }
        WndUpdateRule::Min => (rmbe_len / 10).min(WND_UPDATE_FLOOR),
    }
}

/// What the reader knows when it decides whether to publish its consumer cursor
/// (`smc_tx_consumer_update`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumerView {
    /// Length of the receive ring.
    pub ring_len: usize,
    /// Consumer position last published to the peer (`rx_curs_confirmed`).
    pub confirmed: u64,
    /// Current local consumer position.
    pub consumed: u64,
    /// Latest producer position seen from the peer.
    pub produced: u64,
    /// The peer said it is blocked for space (`write_blocked`).
    pub peer_write_blocked: bool,
    /// The peer asked for a consumer update (`cons_curs_upd_req`).
    pub peer_requested: bool,
}

/// Whether the reader must publish its consumer cursor now. `force` is the kernel's `force`
/// argument (urgent data, close).
pub fn should_update_consumer(v: &ConsumerView, limit: usize, force: bool) -> bool {
    let to_confirm = v.consumed.saturating_sub(v.confirmed);
    if v.peer_requested || force {
        return true;
    }
    if to_confirm <= limit as u64 {
        return false;
    }
    // The free space the peer believes it has: ring minus everything it wrote that we have
    // not yet confirmed.
    let unconfirmed = v.produced.saturating_sub(v.confirmed);
    let sender_free = (v.ring_len as u64).saturating_sub(unconfirmed);
    sender_free <= (v.ring_len / 2) as u64 || v.peer_write_blocked
}

/// How many bytes of a send of `len` to copy before publishing (the autosplit patch,
/// "net/smc: introduce autosplit for smc"): a chunk of at least 4/3 × `autosplit_size` is cut
/// to `autosplit_size` and published at once, so the reader copies out while the writer copies
/// in. `autosplit_size` of 0 disables it.
pub fn autosplit_chunk(len: usize, autosplit_size: usize) -> usize {
    if autosplit_size == 0 || len < autosplit_size {
        return len;
    }
    let threshold = autosplit_size.saturating_mul(4) / 3;
    if len >= threshold {
        autosplit_size
    } else {
        len
    }
}

/// The kernel's autocork test (`smc_should_autocork`): hold back a small send while a CDC send
/// is still in flight; the completion of that send pushes it (`smc_cdc_tx_handler`).
///
/// Only a transport whose CDC sends complete later (SMC-R: a work request) ever has one in
/// flight. An SMC-D CDC is a store into the peer's memory and is complete when it is made, so
/// the kernel's SMC-D path never autocorks, and neither does a connection configured without
/// completions. `unsent` is the prepared bytes not yet sent (`smc_tx_prepared_sends`).
pub fn should_autocork(
    inflight_cdcs: u32,
    unsent: usize,
    sndbuf_len: usize,
    autocorking_size: usize,
) -> bool {
    inflight_cdcs > 0 && unsent <= (sndbuf_len / 2).min(autocorking_size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn update_limit_uses_max_since_the_fix() {
        assert_eq!(rmbe_update_limit(65536 - 32, WndUpdateRule::Max), 6550);
        assert_eq!(rmbe_update_limit(16384 - 32, WndUpdateRule::Max), 2304);
        assert_eq!(rmbe_update_limit(65536 - 32, WndUpdateRule::Min), 2304);
        assert_eq!(rmbe_update_limit(16384 - 32, WndUpdateRule::Min), 1635);
    }

    fn view(confirmed: u64, consumed: u64, produced: u64) -> ConsumerView {
        ConsumerView {
            ring_len: 1000,
            confirmed,
            consumed,
            produced,
            peer_write_blocked: false,
            peer_requested: false,
        }
    }

    #[test]
    fn consumer_update_rule() {
        // Little consumed: never.
        assert!(!should_update_consumer(&view(0, 100, 1000), 100, false));
        // Enough consumed and the peer thinks the ring is full: yes.
        assert!(should_update_consumer(&view(0, 200, 1000), 100, false));
        // Enough consumed but the peer still sees more than half free: no.
        assert!(!should_update_consumer(&view(0, 200, 300), 100, false));
        // ... unless it is blocked.
        let mut v = view(0, 200, 300);
        v.peer_write_blocked = true;
        assert!(should_update_consumer(&v, 100, false));
        // A request or force always answers.
        let mut v = view(0, 1, 1);
        v.peer_requested = true;
        assert!(should_update_consumer(&v, 100, false));
        assert!(should_update_consumer(&view(5, 5, 5), 100, true));
    }

    /// The rule never leaves a writer that sees a full ring without an update once the reader
    /// has consumed everything (the liveness argument the kernel relies on).
    #[test]
    fn a_fully_blocked_writer_always_gets_an_update() {
        // Real rings are at least SMC_BUF_MIN_SIZE - 32 bytes, so the limit is below the ring.
        for ring in [16352usize, 65504, 1048544] {
            let limit = rmbe_update_limit(ring, WndUpdateRule::Max);
            for confirmed in [0u64, 17, 5000] {
                let produced = confirmed + ring as u64; // writer sees zero free space
                let v = ConsumerView {
                    ring_len: ring,
                    confirmed,
                    consumed: produced,
                    produced,
                    peer_write_blocked: false,
                    peer_requested: false,
                };
                assert!(should_update_consumer(&v, limit, false));
            }
        }
    }

    #[test]
    fn autosplit_four_thirds() {
        let a = 128 * 1024;
        assert_eq!(autosplit_chunk(a, a), a);
        assert_eq!(autosplit_chunk(a * 4 / 3 - 1, a), a * 4 / 3 - 1);
        assert_eq!(autosplit_chunk(a * 4 / 3, a), a);
        assert_eq!(autosplit_chunk(1 << 20, a), a);
        assert_eq!(autosplit_chunk(1 << 20, 0), 1 << 20);
    }

    #[test]
    fn autocork_needs_inflight() {
        assert!(!should_autocork(0, 10, 65536, 65536));
        assert!(should_autocork(1, 10, 65536, 65536));
        assert!(!should_autocork(1, 40000, 65536, 65536));
        assert!(!should_autocork(1, 10, 65536, 0));
        assert!(
            should_autocork(1, 0, 65536, 0),
            "nothing unsent: nothing to push yet"
        );
    }
}
