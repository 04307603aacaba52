//! The device conformance suite: what every `Device` must do, run here against the soft
//! RoCEv2 device. Two devices talk over real UDP on loopback addresses (each test its own
//! pair of 127.0.x.y addresses, so tests run in parallel), or inside a fresh network namespace
//! where nftables drops packets.
//!
//! The same checks run against the soft device's RoCE v1 mode (`soft_roce_v1`): each test in a
//! fresh network namespace with a veth pair, a device on each end, Ethernet frames of
//! Ethertype 0x8915 between them. That needs root and `ip`: without them those tests say
//! SKIPPED, and fail under `CI=true`.
//!
//! Each check is a function generic over the device (in `common/`), so a hardware backend runs
//! the same ones where an RNIC exists (`rnic.rs`, feature `rnic`).

mod common;

use smc_rdma::soft::{SoftConfig, SoftDevice};
use std::net::Ipv4Addr;
use std::process::Command;
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
        a_send_scatters_over_two_receive_sges,
        a_silent_peer_exhausts_the_retries,
        the_state_machine_refuses_out_of_order_steps,
        solicited_only_notification_skips_unsolicited_receives,
        an_armed_completion_runs_the_handler_instead_of_the_channel,
        a_waiting_thread_serves_the_device,
        served_requests_are_answered,
    );
}

/// On the soft device the serving thread takes the datagrams itself (counted apart from the
/// receive thread's batches): while a thread serves, the receive thread leaves the socket alone.
#[test]
fn a_serving_thread_takes_the_datagrams_itself() {
    let (a, b) = soft_pair();
    common::a_waiting_thread_serves_the_device(&a, &b);
    let served = b.stats().rx_served.load(Ordering::Relaxed);
    assert!(served > 0, "no batch was taken by a serving thread");
}

/// On the soft device an ACK held back by the serving thread leaves with the answer, in one
/// system call: fewer sends than packets (before, every ACK had a `sendmsg` of its own).
#[test]
fn a_held_ack_leaves_with_the_answer() {
    let (a, b) = soft_pair();
    let st = b.stats();
    let (packets, sends) = (
        st.tx_packets.load(Ordering::Relaxed),
        st.tx_sends.load(Ordering::Relaxed),
    );
    common::served_requests_are_answered(&a, &b);
    let packets = st.tx_packets.load(Ordering::Relaxed) - packets;
    let sends = st.tx_sends.load(Ordering::Relaxed) - sends;
    // An ACK for each request and each answer; an ACK the serving thread held back longer
    // than the hold (a descheduled thread) goes alone, so not all 20 need to pair up.
    assert!(packets >= 40, "{packets} packets");
    assert!(
        sends < packets,
        "{sends} system calls for {packets} packets"
    );
}

/// On the soft device a thread that served leaves the socket to the next serve for a while
/// (`SoftDevice::set_serve_lease`), and gives it back at once while another thread waits
/// unserved.
#[test]
fn datagrams_between_two_serves_wait_for_the_next() {
    let (a, b) = soft_pair();
    common::datagrams_between_two_serves_wait_for_the_next(&a, &b, &|d| b.set_serve_lease(d));
}

// ---- the soft device's RoCE v1 mode ----

fn sh(args: &[&str]) -> bool {
    Command::new(args[0])
        .args(&args[1..])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether the RoCE v1 tests can run here (root, `ip`); otherwise SKIPPED, or a failure
/// under `CI=true`.
fn can_run_v1(test: &str) -> bool {
    let root = rustix::process::geteuid().is_root();
    let ip = sh(&["ip", "-V"]);
    if root && ip {
        return true;
    }
    let why = format!("needs root ({root}) and ip ({ip})");
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test}: {why}");
    }
    eprintln!("SKIPPED {test}: {why}");
    false
}

/// A network namespace with a veth pair `v1a` ↔ `v1b`, deleted on drop.
struct VethNs(String);

impl VethNs {
    fn new() -> Self {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("smcv1-{n}-{}", std::process::id());
        let _ = sh(&["ip", "netns", "del", &name]);
        assert!(sh(&["ip", "netns", "add", &name]), "ip netns add {name}");
        let ip = |args: &str| {
            let mut v = vec!["ip", "-n", &name];
            v.extend(args.split(' '));
            assert!(sh(&v), "ip -n {name} {args}");
        };
        ip("link add v1a type veth peer name v1b");
        ip("link set v1a up");
        ip("link set v1b up");
        Self(name)
    }

    /// Opens a RoCE v1 device on each end of the pair (inside the namespace).
    fn devices(&self) -> (SoftDevice, SoftDevice) {
        self.run(|| {
            let a = SoftDevice::open_roce_v1("sroce1a".into(), "v1a").expect("open v1a");
            let b = SoftDevice::open_roce_v1("sroce1b".into(), "v1b").expect("open v1b");
            (a, b)
        })
    }

    /// Runs `f` on a thread inside the namespace (sockets made there stay there).
    fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/run/netns/{}", self.0);
        std::thread::spawn(move || {
            let fd = std::fs::File::open(&path).expect("open netns");
            rustix::thread::move_into_link_name_space(
                std::os::fd::AsFd::as_fd(&fd),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .expect("setns");
            f()
        })
        .join()
        .expect("namespace thread")
    }
}

impl Drop for VethNs {
    fn drop(&mut self) {
        let _ = sh(&["ip", "netns", "del", &self.0]);
    }
}

macro_rules! soft_v1 {
    ($($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            if !super::can_run_v1(stringify!($name)) {
                return;
            }
            let ns = super::VethNs::new();
            let (a, b) = ns.devices();
            assert!(a.is_roce_v1());
            crate::common::$name(&a, &b);
            drop((a, b));
            drop(ns);
        }
    )*};
}

mod soft_roce_v1 {
    soft_v1!(
        send_inline_and_write_two_sges,
        unsignaled_writes_complete_silently_and_in_order,
        remote_access_errors_fail_the_request_and_flush_the_rest,
        a_send_without_a_receive_waits_for_one,
        a_burst_into_an_empty_receive_queue_waits_without_using_up_retries,
        a_send_longer_than_the_receive_fails_both_ends,
        a_send_scatters_over_two_receive_sges,
        a_silent_peer_exhausts_the_retries,
        the_state_machine_refuses_out_of_order_steps,
        solicited_only_notification_skips_unsolicited_receives,
        an_armed_completion_runs_the_handler_instead_of_the_channel,
        a_waiting_thread_serves_the_device,
        served_requests_are_answered,
    );
}

/// Two RoCE v1 devices on one netdev (as two processes would have) each get the frames of
/// their own QPs only: each claims its own QPN slot, and each talks to its own peer device on
/// the other end of the veth. Both pairs pass a conformance check at the same time; a third
/// device takes a third slot, and a slot is free again once its device is gone.
#[test]
fn roce_v1_devices_on_one_netdev_divide_it_by_qpn_slot() {
    let test = "roce_v1_devices_on_one_netdev_divide_it_by_qpn_slot";
    if !can_run_v1(test) {
        return;
    }
    let ns = VethNs::new();
    let (a1, a2, b1, b2) = ns.run(|| {
        let o = |n: &str, d: &str| SoftDevice::open_roce_v1(n.into(), d).expect("open");
        (
            o("a1", "v1a"),
            o("a2", "v1a"),
            o("b1", "v1b"),
            o("b2", "v1b"),
        )
    });
    assert_eq!(a1.gid(), a2.gid(), "one netdev, one GID");
    let slot = |d: &SoftDevice| {
        use smc_rdma::verbs::{Device, QpCaps, QpInit};
        let cq = d.create_cq(4).unwrap();
        let qp = d
            .create_qp(
                d.alloc_pd(),
                QpInit {
                    send_cq: std::sync::Arc::clone(&cq),
                    recv_cq: cq,
                    caps: QpCaps {
                        max_send_wr: 1,
                        max_recv_wr: 1,
                        max_send_sge: 1,
                        max_recv_sge: 1,
                        max_inline_data: 0,
                    },
                    sq_sig_all: false,
                },
            )
            .unwrap();
        smc_rdma::verbs::QueuePair::qp_num(&qp) >> 12
    };
    assert_ne!(slot(&a1), slot(&a2));
    let t1 = std::thread::spawn(move || {
        common::send_inline_and_write_two_sges(&a1, &b1);
        (a1, b1)
    });
    let t2 = std::thread::spawn(move || {
        common::send_inline_and_write_two_sges(&a2, &b2);
        (a2, b2)
    });
    let (a1, b1) = t1.join().expect("pair 1");
    let (a2, _b2) = t2.join().expect("pair 2");
    let s2 = slot(&a2);
    drop(a2);
    let a3 = ns.run(|| SoftDevice::open_roce_v1("a3".into(), "v1a").expect("open"));
    // Slots are tried from the same hint: a1's is taken, a2's is free again.
    assert_eq!(slot(&a3), s2);
    drop((a1, b1, a3));
}
