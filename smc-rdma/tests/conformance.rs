//! The device conformance suite: what every `Device` must do, run here against the soft
//! RoCEv2 device. Two devices talk over real UDP on loopback addresses (each test its own
//! pair of 127.0.x.y addresses, so tests run in parallel), or inside a fresh network namespace
//! where nftables drops packets.
//!
//! Each check is a function generic over the device (in `common/`), so a hardware backend runs
//! the same ones where an RNIC exists (`rnic.rs`, feature `rnic`).

mod common;

use smc_rdma::soft::{SoftConfig, SoftDevice};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU32, Ordering};

static NEXT: AtomicU32 = AtomicU32::new(1);

/// Two soft devices on fresh loopback addresses.
fn soft_pair() -> (SoftDevice, SoftDevice) {
    let n = NEXT.fetch_add(1, Ordering::Relaxed) as u8;
    let open = |host: u8| {
        SoftDevice::open(SoftConfig {
            name: format!("sroce{n}{host}"),
            addr: Ipv4Addr::new(127, 0, n, host),
            netdev: Some("lo".into()),
            steering: None,
        })
        .expect("open soft device")
    };
    (open(1), open(2))
}

// ---- the soft device ----

macro_rules! soft {
    ($($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            let (a, b) = super::soft_pair();
            crate::common::$name(&a, &b);
        }
    )*};
}

mod soft_device {
    soft!(
        send_inline_and_write_two_sges,
        unsignaled_writes_complete_silently_and_in_order,
        remote_access_errors_fail_the_request_and_flush_the_rest,
        a_send_without_a_receive_waits_for_one,
        a_burst_into_an_empty_receive_queue_waits_without_using_up_retries,
        a_send_longer_than_the_receive_fails_both_ends,
        a_silent_peer_exhausts_the_retries,
        the_state_machine_refuses_out_of_order_steps,
        solicited_only_notification_skips_unsolicited_receives,
        an_armed_completion_runs_the_handler_instead_of_the_channel,
    );
}
