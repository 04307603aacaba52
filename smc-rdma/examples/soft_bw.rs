//! Bandwidth of the soft RoCEv2 device beside TCP, in one run, on this host's loopback:
//! RDMA WRITEs of `CHUNK` bytes through a window of `WINDOW` bytes (the shape of an SMC-R
//! stream: the sender may have one receive buffer in flight), and one TCP stream with the
//! same writes. Medians of `RUNS` runs of `SECS` seconds each.
//!
//! ```text
//! cargo run --release -p smc-rdma --example soft_bw [MTU_BYTES]
//! ```
//!
//! The device binds 127.0.0.1:4791 and 127.0.0.2:4791, so nothing else may use them.

use smc_rdma::soft::{SoftConfig, SoftDevice};
use smc_rdma::verbs::*;
use std::io::{Read, Write};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const CHUNK: usize = 64 << 10;
const WINDOW: usize = 1 << 20;
const SECS: f64 = 2.0;
const RUNS: usize = 5;

fn device(host: u8) -> SoftDevice {
    SoftDevice::open(SoftConfig {
        name: format!("sroce{host}"),
        addr: Ipv4Addr::new(127, 0, 0, host),
        netdev: Some("lo".into()),
        steering: None,
    })
    .expect("open soft device (is 127.0.0.x:4791 free?)")
}

struct End {
    qp: smc_rdma::soft::SoftQp,
    cq: Arc<smc_rdma::soft::SoftCq>,
    mr: smc_rdma::soft::SoftMr,
}

fn end(d: &SoftDevice) -> End {
    let pd = d.alloc_pd();
    let cq = d.create_cq(4096).unwrap();
    let qp = d
        .create_qp(
            pd,
            QpInit {
                send_cq: Arc::clone(&cq),
                recv_cq: Arc::clone(&cq),
                caps: QpCaps {
                    max_send_wr: 256,
                    max_recv_wr: 16,
                    max_send_sge: 2,
                    max_recv_sge: 1,
                    max_inline_data: 64,
                },
                sq_sig_all: false,
            },
        )
        .unwrap();
    let mr = d
        .reg_mr(
            pd,
            Memory::new(WINDOW).unwrap(),
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .unwrap();
    End { qp, cq, mr }
}

fn connect(a: &End, b: &End, ga: Gid, gb: Gid, mtu: Mtu) {
    let path = RcPath {
        mtu,
        timeout: 14,
        ..RcPath::default()
    };
    for (e, p, g) in [(a, b, gb), (b, a, ga)] {
        bring_up(&e.qp, &path, p.qp.qp_num(), g, 100, 100).unwrap();
    }
}

/// Bytes per second of RDMA WRITEs: the window is refilled chunk by chunk, each chunk's
/// write signaled, at most a window's worth outstanding.
fn soft_run(a: &End, b: &End) -> f64 {
    let per_window = WINDOW / CHUNK;
    let mut wc = [Wc::EMPTY; 64];
    let t = Instant::now();
    let (mut posted, mut done) = (0u64, 0u64);
    while t.elapsed().as_secs_f64() < SECS {
        while posted - done < per_window as u64 {
            let slot = (posted as usize % per_window) * CHUNK;
            a.qp.post_send(&SendWr {
                wr_id: posted,
                op: SendOp::Write {
                    remote_addr: b.mr.addr() + slot as u64,
                    rkey: b.mr.rkey(),
                },
                data: Payload::Sges(&[Sge {
                    addr: a.mr.addr() + slot as u64,
                    len: CHUNK as u32,
                    lkey: a.mr.lkey(),
                }]),
                signaled: true,
                solicited: false,
            })
            .unwrap();
            posted += 1;
        }
        let n = a.cq.poll(&mut wc);
        for w in &wc[..n] {
            assert_eq!(w.status, WcStatus::Success);
        }
        done += n as u64;
        if n == 0 {
            std::thread::yield_now();
        }
    }
    // Drain.
    while done < posted {
        done += a.cq.poll(&mut wc) as u64;
    }
    (done as usize * CHUNK) as f64 / t.elapsed().as_secs_f64()
}

fn tcp_run() -> f64 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let rx = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = vec![0u8; CHUNK];
        let mut n = 0usize;
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => return n,
                Ok(k) => n += k,
            }
        }
    });
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let buf = vec![7u8; CHUNK];
    let t = Instant::now();
    while t.elapsed().as_secs_f64() < SECS {
        s.write_all(&buf).unwrap();
    }
    drop(s);
    let n = rx.join().unwrap();
    n as f64 / t.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (v[0], v[v.len() / 2], v[v.len() - 1])
}

fn main() {
    let mtu = match std::env::args().nth(1).as_deref() {
        Some("1024") => Mtu::M1024,
        Some("2048") => Mtu::M2048,
        _ => Mtu::M4096,
    };
    let (da, db) = (device(1), device(2));
    let (a, b) = (end(&da), end(&db));
    connect(
        &a,
        &b,
        Gid::from_ipv4(Ipv4Addr::new(127, 0, 0, 1)),
        Gid::from_ipv4(Ipv4Addr::new(127, 0, 0, 2)),
        mtu,
    );
    let mut soft = Vec::new();
    let mut tcp = Vec::new();
    for _ in 0..RUNS {
        soft.push(soft_run(&a, &b));
        tcp.push(tcp_run());
        std::thread::sleep(Duration::from_millis(100));
    }
    let (s0, s, s1) = median(soft);
    let (t0, t, t1) = median(tcp);
    let st = da.stats();
    println!(
        "host: {} cpus; path MTU {} B, {} KiB writes, {} KiB window, {RUNS} runs of {SECS} s",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        mtu.bytes(),
        CHUNK >> 10,
        WINDOW >> 10
    );
    println!(
        "soft RoCEv2 WRITE  MB/s  min {:8.1}  median {:8.1}  max {:8.1}",
        s0 / 1e6,
        s / 1e6,
        s1 / 1e6
    );
    println!(
        "TCP stream         MB/s  min {:8.1}  median {:8.1}  max {:8.1}",
        t0 / 1e6,
        t / 1e6,
        t1 / 1e6
    );
    println!("ratio soft/TCP (medians): {:.2}", s / t);
    println!(
        "sender: {} packets in {} sends, {} retransmitted, {} timeouts, {} dropped at send",
        st.tx_packets.load(Ordering::Relaxed),
        st.tx_sends.load(Ordering::Relaxed),
        st.retransmits.load(Ordering::Relaxed),
        st.timeouts.load(Ordering::Relaxed),
        st.tx_dropped.load(Ordering::Relaxed)
    );
}
