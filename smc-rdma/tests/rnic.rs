//! The conformance suite (`common/`) on a real RNIC or rxe, through feature `rnic`:
//! `cargo test -p smc-rdma --features rnic --test rnic`.
//!
//! The device: the one `SMC_RDMA_RNIC=<name>` names (then a missing or unusable device fails
//! the tests), else the first one libibverbs lists with a RoCE port. Each check opens it twice
//! and connects two QPs on port 1 in loopback (RoCE loops back on one port), with GID index 0.
//!
//! Where there is no device (no libibverbs, no RNIC, no rxe, port 1 down) the checks print
//! `SKIPPED rnic: <why>` and pass, **also under `CI=true`**, unlike this crate's other tests
//! that skip: CI machines have no RNIC and nothing CI can install makes one (rxe needs a
//! kernel module the CI kernel may not have), so failing there would only make CI red. What
//! CI does get from this file: it builds and passes clippy with the feature, and
//! [`a_missing_device_is_a_clear_error`] runs everywhere, through libibverbs if it is installed.
//!
//! Two checks are not run on hardware by default (`--include-ignored` runs them): they assert
//! [`Wc::solicited`](smc_rdma::verbs::Wc::solicited) on received SENDs, which no verbs provider
//! reports (`struct ibv_wc` has no solicited flag; see `smc_rdma::rnic`).

#![cfg(feature = "rnic")]

mod common;

use smc_rdma::rnic::{RnicDevice, RnicError};
use smc_rdma::verbs::{Device, GidType, PortState};

/// The name of the device to test, or why there is none.
fn pick() -> Result<String, String> {
    let named = std::env::var("SMC_RDMA_RNIC").unwrap_or_default();
    if !named.is_empty() {
        // Asked for by name: anything wrong with it is a failure, not a skip.
        let d = RnicDevice::open(&named).unwrap_or_else(|e| panic!("SMC_RDMA_RNIC={named}: {e}"));
        if let Err(why) = usable(&d) {
            panic!("SMC_RDMA_RNIC={named}: {why}");
        }
        return Ok(named);
    }
    let d = RnicDevice::open_first().map_err(|e| e.to_string())?;
    usable(&d)?;
    Ok(d.name().to_string())
}

/// What the checks need of a device: port 1 up, with a RoCE GID at index 0.
fn usable(d: &RnicDevice) -> Result<(), String> {
    let info = d.info();
    let Some(p) = info.ports.first() else {
        return Err(format!("{} has no ports", d.name()));
    };
    if p.state != PortState::Active {
        return Err(format!("port 1 of {} is down", d.name()));
    }
    match p.gids.first() {
        Some((0, _, _)) => Ok(()),
        _ => Err(format!(
            "port 1 of {} has no RoCE GID at index 0 (an InfiniBand port?)",
            d.name()
        )),
    }
}

/// Two handles on the device (two contexts, as two processes would have), or `None` after
/// printing why the check is skipped.
fn pair(test: &str) -> Option<(RnicDevice, RnicDevice)> {
    match pick() {
        Ok(name) => {
            let open = || RnicDevice::open(&name).unwrap_or_else(|e| panic!("{name}: {e}"));
            Some((open(), open()))
        }
        Err(why) => {
            eprintln!("SKIPPED rnic: {why} ({test}; no RNIC here, which passes also under CI)");
            None
        }
    }
}

macro_rules! rnic {
    ($($(#[$attr:meta])* $name:ident),* $(,)?) => {$(
        #[test]
        $(#[$attr])*
        fn $name() {
            let Some((a, b)) = super::pair(stringify!($name)) else {
                return;
            };
            crate::common::$name(&a, &b);
        }
    )*};
}

mod rnic_device {
    rnic!(
        #[ignore = "asserts Wc::solicited, which struct ibv_wc does not carry"]
        send_inline_and_write_two_sges,
        unsignaled_writes_complete_silently_and_in_order,
        remote_access_errors_fail_the_request_and_flush_the_rest,
        a_send_without_a_receive_waits_for_one,
        a_burst_into_an_empty_receive_queue_waits_without_using_up_retries,
        a_send_longer_than_the_receive_fails_both_ends,
        a_send_scatters_over_two_receive_sges,
        a_silent_peer_exhausts_the_retries,
        the_state_machine_refuses_out_of_order_steps,
        #[ignore = "asserts Wc::solicited, which struct ibv_wc does not carry"]
        solicited_only_notification_skips_unsolicited_receives,
        an_armed_completion_runs_the_handler_instead_of_the_channel,
        a_waiting_thread_serves_the_device,
        served_requests_are_answered,
    );
}

/// The soft device's lease check: an RNIC cannot be served, so the check declines at once
/// (there is no lease to set).
#[test]
fn datagrams_between_two_serves_wait_for_the_next() {
    let Some((a, b)) = pair("datagrams_between_two_serves_wait_for_the_next") else {
        return;
    };
    common::datagrams_between_two_serves_wait_for_the_next(&a, &b, &|_| {});
}

/// The device lists itself as `ibv_devinfo` and `show_gids` would: its name, port 1 with a
/// netdev and its MAC, GIDs typed RoCE v1 or v2.
#[test]
fn the_device_lists_its_ports_and_gids() {
    let Some((d, _)) = pair("the_device_lists_its_ports_and_gids") else {
        return;
    };
    let info = d.info();
    assert_eq!(info.name, d.name());
    let p = &info.ports[0];
    assert_eq!(p.port, 1);
    assert!(!p.netdev.is_empty(), "a RoCE port has a netdev: {p:?}");
    assert_ne!(p.mac, [0; 6], "{p:?}");
    assert!(
        p.gids
            .iter()
            .all(|g| matches!(g.2, GidType::RoceV1 | GidType::RoceV2))
    );
    let names = smc_rdma::rnic::device_names().unwrap();
    assert!(names.iter().any(|n| n == d.name()), "{names:?}");
    for (i, g, t) in &p.gids {
        eprintln!("{} port 1 GID {i}: {g} {t:?} ({})", d.name(), p.netdev);
    }
}

/// Opening a device that is not there fails with an error that says what is missing: no
/// libibverbs, no device at all, or which devices there are. Runs everywhere.
#[test]
fn a_missing_device_is_a_clear_error() {
    let name = "smc-rdma-no-such-device";
    let e = RnicDevice::open(name).expect_err("no such device");
    let msg = e.to_string();
    eprintln!("open({name:?}): {msg}");
    match &e {
        RnicError::NoLibibverbs => assert!(msg.contains("libibverbs.so.1"), "{msg}"),
        RnicError::NoDevices => assert!(msg.contains("no RDMA device"), "{msg}"),
        RnicError::NotFound { name: n, available } => {
            assert_eq!(n, name);
            assert!(!available.is_empty() && msg.contains(name), "{msg}");
        }
        RnicError::NoKernelVerbs(_) => assert!(msg.contains("ib_uverbs"), "{msg}"),
        e => panic!("unexpected error: {e}"),
    }
}
