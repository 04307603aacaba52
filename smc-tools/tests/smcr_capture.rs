//! A live capture of the soft RoCEv2 device carrying SMC-R traffic, decoded by tshark (an
//! independent implementation of RoCEv2 and SMC-R): two soft devices on the loopback of a
//! fresh network namespace, one RC QP pair, and on it what an SMC-R first contact sends: an LLC
//! CONFIRM_LINK request and its response, a CDC, an RDMA WRITE of three packets, and a
//! 1512-byte SMC-Rv2 ADD_LINK (two SEND packets) received as an SMC-Rv2 link receives, over a
//! 44-byte slot and the 8 KiB spill buffer (tshark leaves it undissected: it reads the
//! host-order v2 length big endian). tshark,
//! capturing on `lo` while it happens, must show RoCEv2 framing (opcodes, destination QPs,
//! PSNs in sequence, AckReq, RETH, ACKs with AETH) and SMC-R messages with our values, and no
//! malformed packet. (Wireshark does not verify the ICRC; `smc-rdma/tests/wire_vectors.rs`
//! checks ours against scapy.)
//!
//! Needs root, `ip` and `tshark`; without them SKIPPED, and a failure under `CI=true`.

use smc_proto::cdc::{ConnStateFlags, Cursor, ProducerFlags, SmcrCdcRepr};
use smc_proto::llc::{
    AddLink, AddLinkContRkey, AddLinkV2, AddLinkV2Ext, ConfirmLink, LlcFlags, LlcMessage,
};
use smc_rdma::soft::{SoftConfig, SoftCq, SoftDevice, SoftMr, SoftQp};
use smc_rdma::verbs::*;
use smc_tests::{Netns, skip_unless_root, skip_unless_tool};
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct End {
    qp: SoftQp,
    cq: Arc<SoftCq>,
    mr: SoftMr,
}

fn end(d: &SoftDevice) -> End {
    let pd = d.alloc_pd();
    let cq = d.create_cq(64).unwrap();
    let qp = d
        .create_qp(
            pd,
            QpInit {
                send_cq: Arc::clone(&cq),
                recv_cq: Arc::clone(&cq),
                caps: QpCaps {
                    max_send_wr: 16,
                    max_recv_wr: 16,
                    max_send_sge: 2,
                    max_recv_sge: 2,
                    max_inline_data: 64,
                },
                sq_sig_all: false,
            },
        )
        .unwrap();
    let mr = d
        .reg_mr(
            pd,
            Memory::new(1 << 16).unwrap(),
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .unwrap();
    End { qp, cq, mr }
}

/// Where the receives' shared spill buffer lies in the region (an SMC-Rv2 link's v2 buffer).
const SPILL: u64 = 0x8000;

/// Posts eight receives as an SMC-Rv2 link posts them (`smc_wr_init_sge`): 44 bytes in a slot
/// of their own, the rest in one 8 KiB buffer (the QP is in INIT or later).
fn receives(e: &End) {
    for i in 0..8u64 {
        e.qp.post_recv(&RecvWr {
            wr_id: i,
            sge: Sge {
                addr: e.mr.addr() + i * 64,
                len: 44,
                lkey: e.mr.lkey(),
            },
            spill: Some(Sge {
                addr: e.mr.addr() + SPILL + 44,
                len: 8192 - 44,
                lkey: e.mr.lkey(),
            }),
        })
        .unwrap();
    }
}

/// An SMC-Rv2 ADD_LINK response carrying 90 rkeys: 72 + 90 × 16 = 1512 bytes, two packets at
/// MTU 1024.
fn long_add_link(qpn: u32) -> Vec<u8> {
    let rkeys = (0..90u32)
        .map(|i| AddLinkContRkey {
            rkey: 0x100 + i,
            rkey_new: 0x200 + i,
            vaddr_new: 0x7f00_0000_0000 + u64::from(i) * 0x10000,
        })
        .collect();
    LlcMessage::AddLinkV2(AddLinkV2 {
        link: AddLink {
            flags: LlcFlags::RESPONSE,
            mac: [2, 0, 0, 0, 0, 2],
            gid: Gid::from_ipv4(Ipv4Addr::new(127, 0, 0, 2)).0,
            qpn,
            link_num: 2,
            qp_mtu: 3,
            initial_psn: 0x1234,
            ..AddLink::default()
        },
        ext: Some(AddLinkV2Ext {
            v2_direct: true,
            client_target_gid: Gid::from_ipv4(Ipv4Addr::new(127, 0, 0, 2)).0,
            rkeys,
        }),
    })
    .to_bytes()
}

fn wait(cq: &SoftCq, n: usize) -> Vec<Wc> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    let mut buf = [Wc::EMPTY; 8];
    while got.len() < n {
        let k = cq.poll(&mut buf);
        got.extend_from_slice(&buf[..k]);
        assert!(
            Instant::now() < deadline,
            "{} of {n} completions",
            got.len()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    got
}

fn send(e: &End, bytes: &[u8]) {
    e.qp.post_send(&SendWr {
        wr_id: 1,
        op: SendOp::Send,
        data: Payload::Inline(bytes),
        signaled: true,
        solicited: true,
    })
    .unwrap();
}

/// Sends the traffic inside the namespace; returns the QPNs of the two ends and where the
/// WRITE went (address, rkey).
fn traffic(ns: &str) -> (u32, u32, u64, u32) {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let f = std::fs::File::open(&path).unwrap();
        rustix::thread::move_into_link_name_space(
            std::os::fd::AsFd::as_fd(&f),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )
        .unwrap();
        let open = |h| {
            SoftDevice::open(SoftConfig {
                name: format!("sroce{h}"),
                addr: Ipv4Addr::new(127, 0, 0, h),
                netdev: Some("lo".into()),
                steering: None,
            })
            .unwrap()
        };
        let (da, db) = (open(1), open(2));
        let (a, b) = (end(&da), end(&db));
        let path = RcPath {
            timeout: 14,
            min_rnr_timer: 1,
            ..RcPath::default()
        };
        for (e, p, host, rq, sq) in [(&a, &b, 2, 2000, 1000), (&b, &a, 1, 1000, 2000)] {
            let g = Gid::from_ipv4(Ipv4Addr::new(127, 0, 0, host));
            bring_up(&e.qp, &path, p.qp.qp_num(), g, rq, sq).unwrap();
            receives(e);
        }
        // Server → client: CONFIRM_LINK request; client → server: the response.
        let req = LlcMessage::ConfirmLink(ConfirmLink {
            flags: LlcFlags::NO_RMBE_EYECATCHER,
            mac: [2, 0, 0, 0, 0, 1],
            gid: Gid::from_ipv4(Ipv4Addr::new(127, 0, 0, 1)).0,
            qpn: a.qp.qp_num(),
            link_num: 1,
            link_uid: 0x0102_0301,
            max_links: 2,
            max_conns: 0,
        });
        send(&a, &req.to_bytes());
        wait(&a.cq, 1); // its send completed: b has it
        wait(&b.cq, 1); // b's receive
        let resp = LlcMessage::ConfirmLink(ConfirmLink {
            flags: LlcFlags::RESPONSE | LlcFlags::NO_RMBE_EYECATCHER,
            mac: [2, 0, 0, 0, 0, 2],
            gid: Gid::from_ipv4(Ipv4Addr::new(127, 0, 0, 2)).0,
            qpn: b.qp.qp_num(),
            link_num: 1,
            link_uid: 0x0102_0301,
            max_links: 2,
            max_conns: 0,
        });
        send(&b, &resp.to_bytes());
        wait(&b.cq, 1);
        wait(&a.cq, 1);
        // An RDMA WRITE of 3000 bytes (three packets at MTU 1024), then its CDC.
        a.mr.memory().write(4096, &[0x5a; 3000]);
        a.qp.post_send(&SendWr {
            wr_id: 2,
            op: SendOp::Write {
                remote_addr: b.mr.addr() + 8192,
                rkey: b.mr.rkey(),
            },
            data: Payload::Sges(&[Sge {
                addr: a.mr.addr() + 4096,
                len: 3000,
                lkey: a.mr.lkey(),
            }]),
            signaled: false,
            solicited: false,
        })
        .unwrap();
        let cdc = SmcrCdcRepr {
            seqno: 1,
            token: 0x0000_beef,
            prod: Cursor::new(0, 3000),
            cons: Cursor::ZERO,
            prod_flags: ProducerFlags::EMPTY,
            conn_flags: ConnStateFlags::EMPTY,
        };
        send(&a, &cdc.to_bytes());
        wait(&a.cq, 1); // the CDC's send (the WRITE before it is unsignaled)
        wait(&b.cq, 1); // b's receive of the CDC
        // Client → server: a long SMC-Rv2 ADD_LINK from registered memory (as from the v2
        // send buffer), SEND FIRST + SEND LAST; a receives it over its slot and the spill.
        let long = long_add_link(b.qp.qp_num());
        b.mr.memory().write(16384, &long);
        b.qp.post_send(&SendWr {
            wr_id: 3,
            op: SendOp::Send,
            data: Payload::Sges(&[Sge {
                addr: b.mr.addr() + 16384,
                len: long.len() as u32,
                lkey: b.mr.lkey(),
            }]),
            signaled: true,
            solicited: true,
        })
        .unwrap();
        wait(&b.cq, 1);
        let r = wait(&a.cq, 1);
        assert_eq!((r[0].status, r[0].byte_len), (WcStatus::Success, 1512));
        let mut got = vec![0u8; long.len()];
        a.mr.memory().read(r[0].wr_id as usize * 64, &mut got[..44]);
        a.mr.memory().read(SPILL as usize + 44, &mut got[44..]);
        assert!(got == long, "the long message arrived whole");
        let va = b.mr.addr() + 8192;
        let rkey = b.mr.rkey();
        let (qa, qb) = (a.qp.qp_num(), b.qp.qp_num());
        // Let the last ACKs go out before the devices close.
        std::thread::sleep(Duration::from_millis(50));
        (qa, qb, va, rkey)
    })
    .join()
    .unwrap()
}

const FIELDS: [&str; 19] = [
    "ip.src",
    "udp.dstport",
    "infiniband.bth.opcode",
    "infiniband.bth.destqp",
    "infiniband.bth.psn",
    "infiniband.bth.a",
    "infiniband.reth.va",
    "infiniband.reth.r_key",
    "infiniband.reth.dmalen",
    "infiniband.aeth.syndrome",
    "smc.llc_msg",
    "smc.confirm.link.response",
    "smc.confirm.link.sender.qp.number",
    "smc.confirm.link.number",
    "smc.confirm.link.sender.link.userid",
    "smc.rmbe.ctrl.seqno",
    "smc.rmbe.ctrl.alert.token",
    "data.data",
    "_ws.malformed",
];

/// The ports of the probes that tell us the capture runs, and that it has shown all of the
/// traffic (discard, daytime): not RoCE, not counted.
const PROBE_PORT: u16 = 9;
const END_PORT: u16 = 13;

#[test]
fn tshark_decodes_smcr_llc_and_cdc_over_the_soft_device_as_rocev2() {
    use std::io::BufRead;
    let test = "tshark_decodes_smcr_llc_and_cdc_over_the_soft_device_as_rocev2";
    if skip_unless_root(test) || skip_unless_tool(test, "tshark") {
        return;
    }
    let Some(ns) = Netns::create(test) else {
        return;
    };
    // The soft device sends a run of packets as one UDP GSO send, which a capture on `lo`
    // shows as one large frame (as it shows a TCP stream's 64 KiB segments); with
    // `gso_max_segs 1` the kernel cuts it into the datagrams a wire carries, one RoCEv2
    // packet each, which is what this test decodes.
    let st = Command::new("ip")
        .args(["-n", &ns.name, "link", "set", "lo", "gso_max_segs", "1"])
        .status()
        .expect("ip");
    assert!(st.success(), "ip link set lo gso_max_segs 1");
    // tshark decodes live and prints one line per packet (-l: at once).
    let mut args: Vec<String> = ["netns", "exec", &ns.name, "tshark", "-l", "-i", "lo", "-f"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push(format!(
        "udp port 4791 or udp port {PROBE_PORT} or udp port {END_PORT}"
    ));
    // The SMC-Rv2 ADD_LINK's little-endian length makes Wireshark's SMC heuristic reject it;
    // its RPC-over-RDMA heuristic would claim it and call it malformed.
    args.extend(["--disable-heuristic", "rpcrdma_infiniband"].map(String::from));
    args.extend(["-T", "fields", "-E", "separator=|"].map(String::from));
    for f in FIELDS {
        args.extend(["-e".to_string(), f.to_string()]);
    }
    let mut cap = Command::new("ip")
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run tshark");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let out = cap.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    // Probe until tshark shows a probe: then it captures for sure, however busy the machine.
    let probe = {
        let path = format!("/run/netns/{}", ns.name);
        std::thread::spawn(move || {
            let f = std::fs::File::open(&path).unwrap();
            rustix::thread::move_into_link_name_space(
                std::os::fd::AsFd::as_fd(&f),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .unwrap();
            std::net::UdpSocket::bind("127.0.0.1:0").unwrap()
        })
        .join()
        .unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    'ready: loop {
        assert!(Instant::now() < deadline, "tshark never showed a probe");
        let _ = probe.send_to(b"probe", ("127.0.0.1", PROBE_PORT));
        while let Ok(l) = rx.recv_timeout(Duration::from_millis(100)) {
            if l.split('|').nth(1) == Some(&PROBE_PORT.to_string()) {
                break 'ready;
            }
        }
    }
    let (qa, qb, va, rkey) = traffic(&ns.name);
    // The last probe after the traffic marks the end of what tshark has to show.
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let port = |l: &str| l.split('|').nth(1).map(str::to_owned);
    let _ = probe.send_to(b"end", ("127.0.0.1", END_PORT));
    loop {
        assert!(
            Instant::now() < deadline,
            "tshark never showed the end probe"
        );
        match rx.recv_timeout(Duration::from_millis(500)) {
            Ok(l) if port(&l) == Some(END_PORT.to_string()) => break,
            Ok(l) if port(&l) == Some(PROBE_PORT.to_string()) => {}
            Ok(l) => lines.push(l),
            Err(_) => {
                let _ = probe.send_to(b"end", ("127.0.0.1", END_PORT));
            }
        }
    }
    let _ = rustix::process::kill_process(
        rustix::process::Pid::from_child(&cap),
        rustix::process::Signal::INT,
    );
    let _ = cap.wait();
    let _ = reader.join();
    let text = lines.join("\n");
    let rows: Vec<Vec<&str>> = lines
        .iter()
        .map(|l| l.split('|').collect())
        .filter(|r: &Vec<&str>| r.len() == FIELDS.len())
        .collect();
    let col =
        |r: &Vec<&str>, name: &str| r[FIELDS.iter().position(|f| *f == name).unwrap()].to_string();
    let num = |s: &str| -> u64 {
        let s = s.trim();
        s.strip_prefix("0x").map_or_else(
            || s.parse().unwrap_or(u64::MAX),
            |h| u64::from_str_radix(h, 16).unwrap_or(u64::MAX),
        )
    };
    let yes = |s: String| matches!(s.as_str(), "1" | "True" | "true");
    assert!(
        rows.iter().all(|r| col(r, "_ws.malformed").is_empty()),
        "malformed packets:\n{text}"
    );
    let from = |r: &Vec<&str>, host: u8| col(r, "ip.src") == format!("127.0.0.{host}");
    // Requests: SEND ONLY (4) and WRITE FIRST/MIDDLE/LAST (6, 7, 8); responses: ACK (17).
    let by_op = |op: u64| {
        rows.iter()
            .filter(move |r| num(&col(r, "infiniband.bth.opcode")) == op)
    };
    let sends: Vec<_> = by_op(4).collect();
    assert_eq!(sends.len(), 3, "request, response, CDC:\n{text}");
    let (from_a, from_b): (Vec<_>, Vec<_>) = sends.iter().partition(|r| from(r, 1));
    assert_eq!((from_a.len(), from_b.len()), (2, 1), "{text}");
    let (req, cdc, resp) = (from_a[0], from_a[1], from_b[0]);
    assert_eq!(num(&col(req, "infiniband.bth.destqp")), u64::from(qb));
    assert_eq!(num(&col(req, "infiniband.bth.psn")), 1000);
    assert_eq!(num(&col(req, "smc.llc_msg")), 1, "CONFIRM_LINK:\n{text}");
    assert_eq!(
        num(&col(req, "smc.confirm.link.sender.qp.number")),
        u64::from(qa)
    );
    assert_eq!(num(&col(req, "smc.confirm.link.number")), 1);
    assert_eq!(
        num(&col(req, "smc.confirm.link.sender.link.userid")),
        0x0102_0301
    );
    assert!(!yes(col(req, "smc.confirm.link.response")));
    assert_eq!(num(&col(resp, "infiniband.bth.destqp")), u64::from(qa));
    assert_eq!(num(&col(resp, "infiniband.bth.psn")), 2000);
    assert!(yes(col(resp, "smc.confirm.link.response")), "response flag");
    assert_eq!(
        num(&col(resp, "smc.confirm.link.sender.qp.number")),
        u64::from(qb)
    );
    assert_eq!(num(&col(cdc, "smc.rmbe.ctrl.seqno")), 1);
    assert_eq!(num(&col(cdc, "smc.rmbe.ctrl.alert.token")), 0xbeef);
    assert_eq!(
        num(&col(cdc, "infiniband.bth.psn")),
        1004,
        "after the request and the three WRITE packets"
    );
    let first: Vec<_> = by_op(6).collect();
    assert_eq!(first.len(), 1, "{text}");
    assert_eq!(num(&col(first[0], "infiniband.bth.psn")), 1001);
    assert_eq!(num(&col(first[0], "infiniband.reth.va")), va);
    assert_eq!(
        num(&col(first[0], "infiniband.reth.r_key")),
        u64::from(rkey)
    );
    assert_eq!(num(&col(first[0], "infiniband.reth.dmalen")), 3000);
    assert_eq!(by_op(7).count(), 1);
    let last: Vec<_> = by_op(8).collect();
    assert_eq!(last.len(), 1);
    assert_eq!(num(&col(last[0], "infiniband.bth.psn")), 1003);
    assert!(
        yes(col(last[0], "infiniband.bth.a")),
        "AckReq on a message's last packet"
    );
    assert!(by_op(17).count() >= 3, "the responders' ACKs:\n{text}");
    // The long SMC-Rv2 ADD_LINK: SEND FIRST (0) and SEND LAST (2) from b, AckReq on the last;
    // not SMC for tshark (length read big endian), its first bytes as the kernel writes them.
    let (sf, sl): (Vec<_>, Vec<_>) = (by_op(0).collect(), by_op(2).collect());
    assert_eq!((sf.len(), sl.len()), (1, 1), "SEND FIRST/LAST:\n{text}");
    assert!(from(sf[0], 2) && from(sl[0], 2));
    assert_eq!(num(&col(sf[0], "infiniband.bth.psn")), 2001);
    assert_eq!(num(&col(sl[0], "infiniband.bth.psn")), 2002);
    assert!(yes(col(sl[0], "infiniband.bth.a")));
    assert!(col(sf[0], "smc.llc_msg").is_empty());
    let head = col(sf[0], "data.data").replace(':', "");
    let len = 1512u16.to_ne_bytes();
    assert!(
        head.starts_with(&format!("22{:02x}{:02x}80", len[0], len[1])),
        "ADD_LINK v2 header: {}",
        &head[..head.len().min(16)]
    );
}
