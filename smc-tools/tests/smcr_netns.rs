//! SMC-R between two simulated hosts: two network namespaces joined by a veth pair, an
//! [`SmcrEndpoint`] in each (its own soft RoCEv2 device on its own address, UDP 4791 on the
//! veth), the CLC handshake over TCP across the veth, LLC CONFIRM_LINK and CONFIRM_RKEY over
//! the new RC link, and the streams by RDMA WRITE and CDC SENDs: first contact, then
//! connections that reuse the group, every byte checked both ways.
//!
//! The capability test attaches the SYN-option program twice, once per "host" (two
//! instances with maps of their own, as two smcds would), and checks that only a pair of
//! SMC-R endpoints runs CLC: an SMC-R client of a plain server and a plain client of an SMC-R
//! listener see exactly the TCP bytes the application wrote.
//!
//! With two veth pairs (two paths): two links per group, symmetric when both endpoints have
//! two ports, asymmetric when one has one (its second link on the same device), failover,
//! and what `smcctl` shows of them.
//!
//! Needs root, `ip`, for the capability test BPF and cgroup v2, for the loss and
//! asymmetric-path tests nftables, for the capture tests tshark: otherwise SKIPPED, and a
//! failure under `CI=true`.

use smc_core::llc::LgrType;
use smc_proto::clc::ReasonCode;
use smc_tests::{Netns, Rng, skip_unless, skip_unless_root};
use smcd_engine::bpf::{Maps, loader};
use smcd_engine::smcr::{Capability, SmcrConfig, SmcrEndpoint, SmcrListener, SmcrMode, SmcrStream};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::Duration;

const UEID: &str = "SMCR-NETNS-TEST";

fn ip(args: &[&str]) {
    let ok = Command::new("ip")
        .args(args)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "ip {}", args.join(" "));
}

/// Two namespaces joined by a veth pair: `a` holds 10.N.0.1/24, `b` 10.N.0.2/24 (with
/// [`Hosts::two_paths`] also a second pair, 10.N.1.1/24 and 10.N.1.2/24).
struct Hosts {
    a: Netns,
    b: Netns,
    net: u8,
}

impl Hosts {
    /// With a second veth pair between the namespaces: a second path for a second link.
    fn two_paths(test: &str) -> Option<Hosts> {
        let h = Self::new(test)?;
        let (wa, wb) = (h.veth(1, 2), h.veth(2, 2));
        ip(&[
            "link", "add", &wa, "netns", &h.a.name, "type", "veth", "peer", "name", &wb, "netns",
            &h.b.name,
        ]);
        for (ns, dev, host) in [(&h.a, &wa, 1), (&h.b, &wb, 2)] {
            let addr = format!("10.{}.1.{host}/24", h.net);
            ip(&["-n", &ns.name, "addr", "add", &addr, "dev", dev]);
            ip(&["-n", &ns.name, "link", "set", dev, "mtu", "9000", "up"]);
        }
        h.wait_carrier(&[(1, &wa), (2, &wb)]);
        Some(h)
    }

    /// Waits until each `(host, dev)` has its carrier (operstate UP): the kernel reports it
    /// a little after both ends are up (linkwatch), and a soft device's port is ACTIVE only
    /// with it (the state an endpoint publishes when a link comes or goes).
    fn wait_carrier(&self, devs: &[(u8, &str)]) {
        for (host, dev) in devs {
            let ns = self.ns(*host).name.clone();
            smc_tests::wait_for("the veth's carrier", || {
                let out = Command::new("ip")
                    .args(["-n", &ns, "-o", "link", "show", "dev", dev])
                    .output()
                    .ok()?;
                String::from_utf8_lossy(&out.stdout)
                    .contains("state UP")
                    .then_some(())
            });
        }
    }

    /// The veth of host `host` on path `path` (1 or 2).
    fn veth(&self, host: u8, path: u8) -> String {
        let side = if host == 1 { 'a' } else { 'b' };
        let kind = if path == 1 { 'v' } else { 'w' };
        format!("{kind}{side}{}", std::process::id())
    }

    /// Host `host`'s address on path 2.
    fn addr2(&self, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, self.net, 1, host)
    }

    /// Takes path `path` down or up at host 1's end.
    fn set_path(&self, path: u8, up: bool) {
        let dev = self.veth(1, path);
        ip(&[
            "-n",
            &self.a.name,
            "link",
            "set",
            &dev,
            if up { "up" } else { "down" },
        ]);
    }

    fn new(test: &str) -> Option<Hosts> {
        if skip_unless_root(test) {
            return None;
        }
        let a = Netns::create(test)?;
        let b = Netns::create(test)?;
        // A subnet of its own per test process (the namespaces are ours; only tidiness).
        let net = 100 + (std::process::id() % 100) as u8;
        let (va, vb) = (
            format!("va{}", std::process::id()),
            format!("vb{}", std::process::id()),
        );
        ip(&[
            "link", "add", &va, "netns", &a.name, "type", "veth", "peer", "name", &vb, "netns",
            &b.name,
        ]);
        for (ns, dev, host) in [(&a, &va, 1), (&b, &vb, 2)] {
            let addr = format!("10.{net}.0.{host}/24");
            ip(&["-n", &ns.name, "addr", "add", &addr, "dev", dev]);
            // A second address for a second endpoint on the same "host".
            let second = format!("10.{net}.0.{}/24", host + 10);
            ip(&["-n", &ns.name, "addr", "add", &second, "dev", dev]);
            ip(&["-n", &ns.name, "link", "set", dev, "mtu", "9000", "up"]);
        }
        let h = Hosts { a, b, net };
        h.wait_carrier(&[(1, &va), (2, &vb)]);
        Some(h)
    }

    fn addr(&self, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, self.net, 0, host)
    }

    fn ns(&self, host: u8) -> &Netns {
        if host == 1 { &self.a } else { &self.b }
    }

    /// An SMC-R listener of `ep` on `at`, in host 1's namespace.
    fn listen(&self, ep: &SmcrEndpoint, at: SocketAddr) -> SmcrListener {
        let ep = ep.clone();
        self.on(1, move || ep.listen(at))
            .join()
            .unwrap()
            .expect("listen")
    }

    /// Runs `f` on a thread inside host `host`'s namespace (its sockets stay there).
    fn on<T: Send + 'static>(
        &self,
        host: u8,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> JoinHandle<T> {
        let path = format!("/run/netns/{}", self.ns(host).name);
        std::thread::spawn(move || {
            let fd = std::fs::File::open(&path).expect("open netns");
            rustix::thread::move_into_link_name_space(
                std::os::fd::AsFd::as_fd(&fd),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .expect("setns");
            f()
        })
    }
}

fn endpoint(hosts: &Hosts, host: u8, cap: Capability) -> SmcrEndpoint {
    endpoint_with(hosts, host, SmcrConfig::new(hosts.addr(host), UEID, cap))
}

fn endpoint_with(hosts: &Hosts, host: u8, cfg: SmcrConfig) -> SmcrEndpoint {
    // Link failures and LLC decisions are logged: a failing run shows why.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
    hosts
        .on(host, move || SmcrEndpoint::open(cfg))
        .join()
        .unwrap()
        .expect("open the SMC-R endpoint")
}

fn byte(seed: u64, i: u64) -> u8 {
    (i.wrapping_mul(0x9e37_79b9) >> 7) as u8 ^ seed as u8
}

/// Writes `total` pattern bytes in pieces of random size, then shuts writing down.
fn send(s: &mut SmcrStream, seed: u64, total: u64) {
    let mut rng = Rng::new(seed);
    let mut at = 0u64;
    let mut buf = vec![0u8; 96 << 10];
    while at < total {
        let n = (rng.range(1, buf.len()) as u64).min(total - at) as usize;
        for (k, b) in buf[..n].iter_mut().enumerate() {
            *b = byte(seed, at + k as u64);
        }
        s.write_all(&buf[..n]).expect("write");
        at += n as u64;
    }
    s.shutdown(Shutdown::Write).expect("shutdown");
}

/// Reads to the end, checking every byte; returns the count.
fn recv(s: &mut SmcrStream, seed: u64) -> u64 {
    recv_counting(s, seed, &std::sync::atomic::AtomicU64::new(0))
}

/// `total` bytes of `seed_out` one way, then (the peer echoes what it counted) `seed_in` back.
fn exchange(mut s: SmcrStream, seed_out: u64, seed_in: u64, total: u64) -> SmcrMode {
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mode = s.mode();
    send(&mut s, seed_out, total);
    assert_eq!(recv(&mut s, seed_in), total, "stream {seed_in} came short");
    mode
}

fn smcr_lgr(m: &SmcrMode) -> u32 {
    match m {
        SmcrMode::SmcR { lgr_id, .. } => *lgr_id,
        SmcrMode::Tcp(f) => panic!("fell back to TCP: {f:?}"),
    }
}

/// First contact, then two connections that reuse the group (one at a time and two at
/// once), each moving 4 MiB both ways byte-exact over the veth.
#[test]
fn smcr_first_contact_and_reuse_between_two_namespaces() {
    let test = "smcr_first_contact_and_reuse_between_two_namespaces";
    let Some(hosts) = Hosts::new(test) else {
        return;
    };
    const TOTAL: u64 = 4 << 20;
    const CONNS: u64 = 4;
    let srv = endpoint(&hosts, 1, Capability::Assume);
    let cli = endpoint(&hosts, 2, Capability::Assume);
    let at = SocketAddr::from((hosts.addr(1), 7001));
    let l = hosts.listen(&srv, at);
    let server = hosts.on(1, move || {
        let mut modes = Vec::new();
        let mut peers = Vec::new();
        for _ in 0..CONNS {
            let (s, _) = l.accept().expect("accept");
            // Each connection echoes on a thread of its own (two run at once below).
            peers.push(std::thread::spawn(move || {
                let mut s = s;
                s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                let mode = s.mode();
                let mut seed = [0u8; 8];
                s.read_exact(&mut seed).unwrap();
                let seed = u64::from_le_bytes(seed);
                let got = recv(&mut s, seed);
                // Back: the pattern of seed + 1, as long as what came.
                send(&mut s, seed + 1, got);
                (mode, got)
            }));
        }
        for p in peers {
            modes.push(p.join().unwrap());
        }
        modes
    });
    let one = |cli: SmcrEndpoint, seed: u64| {
        hosts.on(2, move || {
            let mut s = cli.connect(at).expect("connect");
            s.write_all(&seed.to_le_bytes()).unwrap();
            // The seed's 8 bytes are not part of the pattern: the server reads them first.
            exchange(s, seed, seed + 1, TOTAL)
        })
    };
    let m1 = one(cli.clone(), 10).join().unwrap();
    let m2 = one(cli.clone(), 20).join().unwrap();
    let (t3, t4) = (one(cli.clone(), 30), one(cli.clone(), 40));
    let (m3, m4) = (t3.join().unwrap(), t4.join().unwrap());
    let lgr = smcr_lgr(&m1);
    for m in [&m2, &m3, &m4] {
        assert_eq!(
            smcr_lgr(m),
            lgr,
            "a later connection made a group of its own"
        );
    }
    let served = server.join().unwrap();
    for (m, got) in &served {
        smcr_lgr(m);
        assert_eq!(*got, TOTAL);
    }
    for ep in [&srv, &cli] {
        let st = ep.stats();
        assert_eq!(st.first_contacts.load(Ordering::Relaxed), 1);
        assert_eq!(st.reused.load(Ordering::Relaxed), CONNS - 1);
        assert_eq!(st.fallbacks.load(Ordering::Relaxed), 0);
        let groups = ep.link_groups();
        assert_eq!(groups.len(), 1, "{groups:?}");
        assert!(groups[0].up);
    }
    // The bytes crossed the veth as RoCEv2 (each stream 4 MiB each way in ≤ 4 KiB packets).
    let rx = srv.device().stats().rx_packets.load(Ordering::Relaxed);
    assert!(
        rx > CONNS * TOTAL / 4096,
        "only {rx} RoCEv2 packets arrived"
    );
    assert_eq!(srv.device().stats().rx_dropped.load(Ordering::Relaxed), 0);
    let (sg, cg) = (&srv.link_groups()[0], &cli.link_groups()[0]);
    assert_eq!(
        (sg.links[0].qpn, sg.links[0].peer_qpn),
        (cg.links[0].peer_qpn, cg.links[0].qpn)
    );
    assert_eq!(sg.peer_gid, cli.gid());
    assert!(!sg.client && cg.client);
}

/// This process's own cgroup, or why there is none.
fn test_cgroup() -> &'static Result<PathBuf, String> {
    smc_tests::test_cgroup(loader::default_cgroup(), "smcr")
}

/// The cgroup an option program of `test` attaches to, or `None` after saying why there is
/// none (SKIPPED, a failure under `CI=true`).
fn option_cgroup(test: &str) -> Option<PathBuf> {
    match test_cgroup() {
        Ok(cg) => Some(cg.clone()),
        Err(why) => {
            skip_unless(test, false, why);
            None
        }
    }
}

/// One round of the capability test: the server endpoint uses `srv_maps`, the client
/// `cli_maps` (the same maps: one smcd serving both namespaces), on the hosts' addresses plus
/// `offset`.
fn capability_round(hosts: &Hosts, srv_maps: &Maps, cli_maps: &Maps, offset: u8) {
    let (sa, ca) = (hosts.addr(1), hosts.addr(2));
    let (sa, ca) = (
        Ipv4Addr::from(u32::from(sa) + u32::from(offset)),
        Ipv4Addr::from(u32::from(ca) + u32::from(offset)),
    );
    let on = |host: u8, a: Ipv4Addr, m: &Maps| {
        let cfg = SmcrConfig::new(a, UEID, Capability::Option(m.try_clone().unwrap()));
        endpoint_with(hosts, host, cfg)
    };
    let srv = on(1, sa, srv_maps);
    let cli = on(2, ca, cli_maps);
    let smc_at = SocketAddr::from((sa, 7002));
    let plain_at = SocketAddr::from((sa, 7003));
    let l = hosts.listen(&srv, smc_at);
    let plain = hosts
        .on(1, move || TcpListener::bind(plain_at))
        .join()
        .unwrap()
        .expect("bind plain");
    // The SMC-R listener: an SMC-R client, then a plain one.
    let server = hosts.on(1, move || {
        let mut out = Vec::new();
        for _ in 0..2 {
            let (mut s, _) = l.accept().expect("accept");
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let mut got = [0u8; 5];
            s.read_exact(&mut got).unwrap();
            s.write_all(b"world").unwrap();
            out.push((s.mode(), got));
        }
        out
    });
    // The plain listener sees exactly what the SMC-R client's application wrote.
    let plain_server = hosts.on(1, move || {
        let (mut s, _) = plain.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut got = [0u8; 5];
        s.read_exact(&mut got).unwrap();
        s.write_all(b"plain").unwrap();
        got
    });
    let client = hosts.on(2, move || {
        let mut s = cli.connect(smc_at).expect("connect");
        s.write_all(b"hello").unwrap();
        let mut back = [0u8; 5];
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.read_exact(&mut back).unwrap();
        let smc = (s.mode(), back);
        // A plain client of the SMC-R listener.
        let mut t = TcpStream::connect(smc_at).unwrap();
        t.write_all(b"howdy").unwrap();
        t.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut back = [0u8; 5];
        t.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"world");
        // The SMC-R client of a plain server.
        let mut p = cli.connect(plain_at).expect("connect plain");
        p.write_all(b"hi-tc").unwrap();
        p.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut back = [0u8; 5];
        p.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"plain");
        (smc, p.mode(), cli.stats().fallbacks.load(Ordering::Relaxed))
    });
    let ((smc_mode, smc_back), plain_mode, cli_fallbacks) = client.join().unwrap();
    assert_eq!(&smc_back, b"world");
    smcr_lgr(&smc_mode);
    assert!(
        matches!(plain_mode, SmcrMode::Tcp(f) if f.local == smc_proto::clc::ReasonCode::PEERNOSMC),
        "{plain_mode:?}"
    );
    assert_eq!(cli_fallbacks, 1);
    assert_eq!(&plain_server.join().unwrap(), b"hi-tc");
    let served = server.join().unwrap();
    smcr_lgr(&served[0].0);
    assert_eq!(&served[0].1, b"hello");
    assert!(
        matches!(served[1].0, SmcrMode::Tcp(f) if f.local == smc_proto::clc::ReasonCode::PEERNOSMC),
        "{:?}",
        served[1].0
    );
    assert_eq!(&served[1].1, b"howdy");
}

/// The SYN-option path between the two hosts, each with its own program instance: SMC-R only
/// where both ends are SMC-R endpoints, and no CLC byte on the wire otherwise.
#[test]
fn smcr_capability_by_the_syn_option_between_two_namespaces() {
    let test = "smcr_capability_by_the_syn_option_between_two_namespaces";
    let Some(hosts) = Hosts::new(test) else {
        return;
    };
    let Some(cg) = option_cgroup(test) else {
        return;
    };
    let attach = || match loader::attach(&cg) {
        Ok(a) => Some(a),
        Err(e) => {
            skip_unless(test, false, format_args!("cannot attach the program: {e}"));
            None
        }
    };
    // "Host" 1's smcd and host 2's: two instances, maps of their own.
    let (Some(pa), Some(pb)) = (attach(), attach()) else {
        return;
    };
    // Two smcds (maps of their own each), then one smcd serving both namespaces.
    capability_round(&hosts, pa.maps(), pb.maps(), 0);
    capability_round(&hosts, pa.maps(), pa.maps(), 10);
    drop((pa, pb));
}

/// Two hosts, each with its own smcd: an smcd runs inside each namespace with an SMC option
/// program of its own (no shared listener table, no shared maps), and each host's endpoint
/// takes the option's maps from its smcd (`Capability::Smcd`). The client's SYN carries the
/// option, the server's program echoes it for the SMC-R listener, and the connection is
/// SMC-R, byte-exact both ways; a plain TCP client gets plain TCP with no CLC byte (no option
/// in its SYN); each smcd counts its own side. An endpoint whose smcd has no option program
/// is refused with `Capability::Smcd`.
#[test]
fn smcr_two_hosts_each_with_its_own_smcd() {
    let test = "smcr_two_hosts_each_with_its_own_smcd";
    let Some(hosts) = Hosts::new(test) else {
        return;
    };
    let Some(cg) = option_cgroup(test) else {
        return;
    };
    let arg = format!("--bpf-cgroup={}", cg.display());
    let smcd =
        |host: u8| smc_tests::Smcd::start_in(smc_tests::bins!(), &hosts.ns(host).name, &[&arg]);
    let (da, db) = (smcd(1), smcd(2));
    let netns_of = |pid: u32| std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap();
    let own = netns_of(std::process::id());
    let (na, nb) = (netns_of(da.pid()), netns_of(db.pid()));
    assert!(na != nb && na != own && nb != own, "{na:?} {nb:?} {own:?}");
    let cfg = |host: u8, d: &smc_tests::Smcd| SmcrConfig {
        smcd: Some(d.socket.clone()),
        ..SmcrConfig::new(hosts.addr(host), UEID, Capability::Smcd)
    };
    let srv = endpoint_with(&hosts, 1, cfg(1, &da));
    let cli = endpoint_with(&hosts, 2, cfg(2, &db));
    let at = SocketAddr::from((hosts.addr(1), 7013));
    let l = hosts.listen(&srv, at);
    let server = hosts.on(1, move || {
        let (s, _) = l.accept().expect("accept");
        let smc = (s.mode(), echo(s));
        let (mut p, _) = l.accept().expect("accept the plain client");
        let mode = p.mode();
        let mut b = [0u8; 5];
        p.read_exact(&mut b).expect("read");
        p.write_all(&b).expect("write");
        (smc, mode)
    });
    let c = cli.clone();
    let mode = hosts
        .on(2, move || {
            let mut s = c.connect(at).expect("connect");
            s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
            let mode = s.mode();
            round_trip(&mut s, 7, 100_000);
            close_all([s]);
            mode
        })
        .join()
        .unwrap();
    smcr_lgr(&mode);
    let plain = hosts
        .on(2, move || {
            let mut t = TcpStream::connect(at).expect("connect");
            t.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            t.write_all(b"hello").unwrap();
            let mut b = [0u8; 5];
            t.read_exact(&mut b).unwrap();
            b
        })
        .join()
        .unwrap();
    assert_eq!(
        &plain, b"hello",
        "the plain client got something else first"
    );
    let ((smc_mode, echoed), plain_mode) = server.join().unwrap();
    smcr_lgr(&smc_mode);
    assert_eq!(echoed, 100_000);
    assert!(
        matches!(plain_mode, SmcrMode::Tcp(f) if f.local == ReasonCode::PEERNOSMC),
        "{plain_mode:?}"
    );
    // Each smcd has its own side: the server's a server connection and the plain fallback,
    // the client's a client connection.
    let sa = da.ctl("--json stats --smcr").json();
    let sb = db.ctl("--json stats --smcr").json();
    assert_eq!(sa["connections"]["smc"]["server"], 1, "{sa}");
    assert_eq!(sa["connections"]["smc"]["client"], 0, "{sa}");
    assert_eq!(sa["fallback"]["server"], 1, "{sa}");
    assert_eq!(sb["connections"]["smc"]["client"], 1, "{sb}");
    assert_eq!(sb["connections"]["smc"]["server"], 0, "{sb}");
    // An smcd without the option program cannot serve `Capability::Smcd`.
    let bare = smc_tests::Smcd::start(smc_tests::bins!());
    let refused = hosts
        .on(2, {
            let c = SmcrConfig {
                smcd: Some(bare.socket.clone()),
                ..SmcrConfig::new(Ipv4Addr::LOCALHOST, UEID, Capability::Smcd)
            };
            move || SmcrEndpoint::open(c).map(|_| ())
        })
        .join()
        .unwrap();
    assert_eq!(
        refused.map_err(|e| e.kind()),
        Err(std::io::ErrorKind::Unsupported)
    );
}

/// Non-blocking SMC-R as an event loop uses it: a non-blocking listener says `WouldBlock` with
/// nothing there, and its readiness descriptor turns readable once a handshake has ended; four
/// connects started at once return at once and are finished by polling their descriptors;
/// each is SMC-R and echoes byte-exact. A connect to a port nobody listens on ends in
/// `ConnectionRefused`.
#[test]
fn smcr_nonblocking_connect_and_accept_from_event_loops() {
    use rustix::event::{PollFd, PollFlags, poll};
    let test = "smcr_nonblocking_connect_and_accept_from_event_loops";
    let Some(hosts) = Hosts::new(test) else {
        return;
    };
    const N: usize = 4;
    let srv = endpoint(&hosts, 1, Capability::Assume);
    let cli = endpoint(&hosts, 2, Capability::Assume);
    let at = SocketAddr::from((hosts.addr(1), 7014));
    let nobody = SocketAddr::from((hosts.addr(1), 7015));
    let l = hosts.listen(&srv, at);
    l.set_nonblocking(true).unwrap();
    assert_eq!(
        l.accept().map(|_| ()).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock
    );
    let ts = rustix::time::Timespec {
        tv_sec: 20,
        tv_nsec: 0,
    };
    let server = hosts.on(1, move || {
        let mut echoes = Vec::new();
        while echoes.len() < N {
            let fd = l.readiness().expect("a non-blocking listener's readiness");
            let mut fds = [PollFd::from_borrowed_fd(fd, PollFlags::IN)];
            assert_eq!(poll(&mut fds, Some(&ts)).unwrap(), 1, "no handshake ended");
            loop {
                match l.accept() {
                    Ok((s, _)) => echoes.push(std::thread::spawn(move || echo(s))),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => panic!("accept: {e}"),
                }
            }
        }
        echoes
            .into_iter()
            .map(|e| e.join().unwrap())
            .collect::<Vec<_>>()
    });
    let c = cli.clone();
    let modes = hosts
        .on(2, move || {
            let pending: Vec<_> = (0..N)
                .map(|_| c.connect_nonblocking(at).expect("connect"))
                .collect();
            let mut done: Vec<Option<SmcrStream>> = (0..N).map(|_| None).collect();
            while done.iter().any(Option::is_none) {
                let open: Vec<usize> = (0..N).filter(|&i| done[i].is_none()).collect();
                let mut fds: Vec<_> = open
                    .iter()
                    .map(|&i| PollFd::new(&pending[i], PollFlags::IN))
                    .collect();
                assert!(poll(&mut fds, Some(&ts)).unwrap() > 0, "no connect ended");
                let ready: Vec<usize> = open
                    .iter()
                    .zip(&fds)
                    .filter(|(_, f)| f.revents().contains(PollFlags::IN))
                    .map(|(&i, _)| i)
                    .collect();
                for i in ready {
                    done[i] = pending[i].try_finish().expect("the connect");
                }
            }
            let mut conns: Vec<SmcrStream> = done.into_iter().map(Option::unwrap).collect();
            let modes: Vec<SmcrMode> = conns.iter().map(SmcrStream::mode).collect();
            for (i, s) in conns.iter_mut().enumerate() {
                s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                round_trip(s, 300 + i as u64, 50_000);
            }
            close_all(conns);
            let refused = c
                .connect_nonblocking(nobody)
                .expect("start")
                .wait(Some(Duration::from_secs(20)));
            (modes, refused.map(|_| ()).map_err(|e| e.kind()))
        })
        .join()
        .unwrap();
    let (modes, refused) = modes;
    for m in &modes {
        smcr_lgr(m);
    }
    assert_eq!(refused, Err(std::io::ErrorKind::ConnectionRefused));
    assert_eq!(server.join().unwrap(), vec![50_000; N]);
}

/// What tshark prints of each packet (one line, `|` between fields). `data.data` is the
/// payload of a RoCEv2 SEND no dissector took: an SMC-Rv2 LLC message, whose host-order
/// (little-endian) length Wireshark's SMC heuristic reads big endian and rejects.
const FIELDS: [&str; 26] = [
    "ip.src",
    "udp.dstport",
    "tcp.dstport",
    "infiniband.bth.opcode",
    "infiniband.bth.destqp",
    "smc.clc_msg",
    "smc.proposal.rocev2.gid.ipv4",
    "smc.accept.flags",
    "smc.accept.server.qp.number",
    "smc.accept.server.rmb.rkey",
    "smc.accept.initial.psn",
    "smc.confirm.first.contact",
    "smc.confirm.client.qp.number",
    "smc.confirm.client.rmb.rkey",
    "smc.llc_msg",
    "smc.confirm.link.response",
    "smc.confirm.link.sender.qp.number",
    "smc.confirm.rkey.response",
    "smc.rmbe.ctrl.alert.token",
    "smc.add.link.sender.qp.number",
    "smc.add.link.response",
    "smc.add.link.response.rejected",
    "smc.delete.link.reason.code",
    "smc.rmbe.ctrl.failover.validation",
    "data.data",
    "_ws.malformed",
];

/// Probe ports (discard, daytime): a probe seen means tshark captures; the end probe seen
/// means it has shown everything before it.
const PROBE_PORT: u16 = 9;
const END_PORT: u16 = 13;

/// A live tshark on host 1's veth.
struct Capture {
    fields: &'static [&'static str],
    child: std::process::Child,
    rx: std::sync::mpsc::Receiver<String>,
    probe: std::net::UdpSocket,
    to: SocketAddr,
}

impl Capture {
    fn start(hosts: &Hosts, port: u16) -> Capture {
        Self::start_with(hosts, port, "", &FIELDS)
    }

    /// With `more` added to the capture filter (`or ...`), printing `fields` (the second
    /// must be `udp.dstport`: the probes are found by it).
    fn start_with(
        hosts: &Hosts,
        port: u16,
        more: &str,
        fields: &'static [&'static str],
    ) -> Capture {
        use std::io::BufRead;
        let dev = format!("va{}", std::process::id());
        // The soft devices send runs of packets as UDP GSO sends, which a capture on a veth
        // shows as one large frame each (as it shows a TCP stream's 64 KiB segments); with
        // `gso_max_segs 1` on both ends the kernel cuts them into the datagrams a wire
        // carries, one RoCEv2 packet each, which is what these tests decode.
        for host in [1, 2] {
            let ns = &hosts.ns(host).name;
            ip(&[
                "-n",
                ns,
                "link",
                "set",
                &hosts.veth(host, 1),
                "gso_max_segs",
                "1",
            ]);
        }
        let filter = format!(
            "tcp port {port} or udp port 4791 or udp port {PROBE_PORT} or udp port {END_PORT}{more}"
        );
        let mut args: Vec<String> = ["netns", "exec", &hosts.a.name, "tshark", "-l", "-i", &dev]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(["-f".into(), filter]);
        // Wireshark's RPC-over-RDMA heuristic claims some SEND payloads the SMC heuristic
        // rejects (the SMC-Rv2 LLC messages of a little-endian host) and calls them
        // malformed; without it they stay data.
        args.extend(["--disable-heuristic", "rpcrdma_infiniband"].map(String::from));
        args.extend(["-T", "fields", "-E", "separator=|"].map(String::from));
        for f in fields {
            args.extend(["-e".to_string(), f.to_string()]);
        }
        let mut child = Command::new("ip")
            .args(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("run tshark");
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        let probe = hosts
            .on(2, || std::net::UdpSocket::bind("0.0.0.0:0").unwrap())
            .join()
            .unwrap();
        let c = Capture {
            fields,
            child,
            rx,
            probe,
            to: SocketAddr::from((hosts.addr(1), PROBE_PORT)),
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        'ready: loop {
            assert!(
                std::time::Instant::now() < deadline,
                "tshark never showed a probe"
            );
            let _ = c.probe.send_to(b"probe", c.to);
            while let Ok(l) = c.rx.recv_timeout(Duration::from_millis(100)) {
                if l.split('|').nth(1) == Some(&PROBE_PORT.to_string()) {
                    break 'ready;
                }
            }
        }
        c
    }

    /// Everything shown up to the end probe, as rows of fields.
    fn finish(mut self) -> Vec<Vec<String>> {
        let end = SocketAddr::from((self.to.ip(), END_PORT));
        let _ = self.probe.send_to(b"end", end);
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut rows = Vec::new();
        loop {
            assert!(
                std::time::Instant::now() < deadline,
                "tshark never showed the end probe"
            );
            match self.rx.recv_timeout(Duration::from_millis(500)) {
                Ok(l) => {
                    let r: Vec<String> = l.split('|').map(str::to_owned).collect();
                    if r.len() != self.fields.len() {
                        continue;
                    }
                    if r[1] == END_PORT.to_string() {
                        break;
                    }
                    if r[1] != PROBE_PORT.to_string() {
                        rows.push(r);
                    }
                }
                Err(_) => {
                    let _ = self.probe.send_to(b"end", end);
                }
            }
        }
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_child(&self.child),
            rustix::process::Signal::INT,
        );
        let _ = self.child.wait();
        rows
    }
}

fn col<'a>(r: &'a [String], name: &str) -> &'a str {
    &r[FIELDS.iter().position(|f| *f == name).unwrap()]
}

/// The SMC-Rv2 LLC messages of type `ty` (0x21 CONFIRM_LINK, 0x22 ADD_LINK, 0x24
/// DELETE_LINK, 0x26 CONFIRM_RKEY, 0x29 DELETE_RKEY, ...) in the RoCEv2 SENDs that `from`
/// selects, as their bytes: tshark shows them as data (see [`FIELDS`]). Each one's 16-bit
/// length (bytes 1..3, little endian as an x86 kernel writes it) must be its size.
fn llc_v2(rows: &[Vec<String>], ty: u8, from: impl Fn(&[String]) -> bool) -> Vec<Vec<u8>> {
    rows.iter()
        // RC SEND Only: what LLC travels as (RDMA WRITE payloads are data too).
        .filter(|r| num(col(r, "udp.dstport")) == 4791 && from(r))
        .filter(|r| num(col(r, "infiniband.bth.opcode")) == 4)
        .filter_map(|r| {
            let hex = col(r, "data.data").replace(':', "");
            let b: Vec<u8> = (0..hex.len() / 2)
                .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
                .collect();
            (b.len() >= 44 && b[0] == ty).then_some(b)
        })
        .inspect(|b| {
            assert_eq!(
                usize::from(u16::from_le_bytes([b[1], b[2]])),
                b.len(),
                "v2 length of an LLC message starting {:02x?}",
                &b[..8]
            );
        })
        .collect()
}

fn be24_at(b: &[u8], at: usize) -> u64 {
    u64::from(u32::from_be_bytes([0, b[at], b[at + 1], b[at + 2]]))
}

fn num(s: &str) -> u64 {
    let s = s.split(',').next().unwrap_or("").trim();
    s.strip_prefix("0x").map_or_else(
        || s.parse().unwrap_or(u64::MAX),
        |h| u64::from_str_radix(h, 16).unwrap_or(u64::MAX),
    )
}

/// tshark, capturing on the veth, decodes a first-contact SMC-R connection and one that
/// reuses its group: the CLC Proposal, Accept and Confirm with their SMC-R fields (our GID,
/// QPNs, rkeys, first-contact bits), the LLC CONFIRM_LINK request and response on the new
/// link, CONFIRM_RKEY both ways for the second connection's RMBs, CDC messages, and DELETE_RKEY
/// both ways when the connections have closed, all over RoCEv2; no packet is malformed.
#[test]
fn tshark_decodes_smcr_first_contact_and_reuse_on_the_veth() {
    let test = "tshark_decodes_smcr_first_contact_and_reuse_on_the_veth";
    if smc_tests::skip_unless_tool(test, "tshark") {
        return;
    }
    let Some(hosts) = Hosts::new(test) else {
        return;
    };
    let srv = endpoint(&hosts, 1, Capability::Assume);
    let cli = endpoint(&hosts, 2, Capability::Assume);
    let at = SocketAddr::from((hosts.addr(1), 7004));
    let l = hosts.listen(&srv, at);
    let cap = Capture::start(&hosts, 7004);
    let server = hosts.on(1, move || {
        let mut tokens = Vec::new();
        for _ in 0..2 {
            let (mut s, _) = l.accept().expect("accept");
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let got = recv(&mut s, 5);
            send(&mut s, 6, got);
            tokens.push(s.mode());
        }
        tokens
    });
    let c = cli.clone();
    let modes = hosts
        .on(2, move || {
            let mut modes = Vec::new();
            for _ in 0..2 {
                let s = c.connect(at).expect("connect");
                modes.push(exchange(s, 5, 6, 20_000));
            }
            modes
        })
        .join()
        .unwrap();
    let served = server.join().unwrap();
    // Both closes finish (the linger sweep runs at least once a second): each side's RMBs
    // leave the group with DELETE_RKEY.
    let idle = |ep: &SmcrEndpoint| ep.link_groups().iter().all(|g| g.conns == 0);
    assert!(
        smc_tests::eventually(Duration::from_secs(30), || idle(&srv) && idle(&cli)),
        "the connections never finished closing: {:?} {:?}",
        srv.link_groups(),
        cli.link_groups()
    );
    // Their DELETE_RKEY exchanges, once the RKEY flow was free.
    std::thread::sleep(Duration::from_millis(500));
    let rows = cap.finish();
    let text: String = rows.iter().map(|r| r.join("|") + "\n").collect();
    assert!(
        rows.iter().all(|r| col(r, "_ws.malformed").is_empty()),
        "malformed packets:\n{text}"
    );
    let from = |r: &[String], host: u8| col(r, "ip.src") == hosts.addr(host).to_string();
    let clc = |t: u64| -> Vec<&Vec<String>> {
        rows.iter()
            .filter(|r| !col(r, "tcp.dstport").is_empty() && num(col(r, "smc.clc_msg")) == t)
            .collect()
    };
    let (props, accs, confs) = (clc(1), clc(2), clc(3));
    assert_eq!(
        (props.len(), accs.len(), confs.len()),
        (2, 2, 2),
        "CLC:\n{text}"
    );
    assert!(
        props
            .iter()
            .all(|r| from(r, 2)
                && col(r, "smc.proposal.rocev2.gid.ipv4") == hosts.addr(2).to_string())
    );
    let (sg, cg) = (&srv.link_groups()[0], &cli.link_groups()[0]);
    for (i, a) in accs.iter().enumerate() {
        assert!(from(a, 1));
        assert_eq!(
            num(col(a, "smc.accept.server.qp.number")),
            u64::from(sg.links[0].qpn),
            "{text}"
        );
        // Wireshark shows the first-contact bit (0x08) of an SMC-Rv2 Accept only in its
        // flags byte.
        assert_eq!(
            num(col(a, "smc.accept.flags")) & 0x08 != 0,
            i == 0,
            "{text}"
        );
    }
    for (i, c) in confs.iter().enumerate() {
        assert!(from(c, 2));
        assert_eq!(
            num(col(c, "smc.confirm.client.qp.number")),
            u64::from(cg.links[0].qpn),
            "{text}"
        );
        assert_eq!(
            num(col(c, "smc.confirm.first.contact")),
            u64::from(i == 0),
            "{text}"
        );
    }
    // LLC over RoCEv2 (UDP 4791) to the peer's QP. The group is SMC-Rv2: every LLC message
    // is a v2 one (type 0x2N, 16-bit length), none of the v1 types (which tshark would
    // decode as SMC-R LLC).
    assert!(
        rows.iter()
            .all(|r| !(1..=9).contains(&num(col(r, "smc.llc_msg")))),
        "v1 LLC in a v2 group:\n{text}"
    );
    let llc = |t: u8, host: u8| llc_v2(&rows, t, |r| from(r, host));
    let (req, resp) = (llc(0x21, 1), llc(0x21, 2));
    assert_eq!((req.len(), resp.len()), (1, 1), "CONFIRM_LINK:\n{text}");
    // flags (3), sender QPN (26), link number (29), max_links (34); max_conns (35) is the
    // negotiated one (both ends are release 1: SMC-Rv2.1).
    assert_eq!(req[0][3], 0x03);
    assert_eq!(be24_at(&req[0], 26), u64::from(sg.links[0].qpn));
    assert_eq!((req[0][29], req[0][34]), (1, 2));
    assert_eq!((req[0][35], resp[0][35]), (sg.max_conns, sg.max_conns));
    assert_eq!(resp[0][3], 0x83);
    assert_eq!(be24_at(&resp[0], 26), u64::from(cg.links[0].qpn));
    let conf_dst = rows
        .iter()
        .find(|r| col(r, "data.data").replace(':', "").starts_with("212c00"))
        .map(|r| num(col(r, "infiniband.bth.destqp")));
    assert_eq!(conf_dst, Some(u64::from(cg.links[0].qpn)));
    // Both ends have one port: the server still asks for a second link on its one device
    // (ADD_LINK v2 with its rkey extension: the one RMB's keys, 72 + 16 bytes, as
    // `smc_llc_srv_add_link` does with no alternate device), and the client, with no other
    // device either, rejects it: its request sent back, 44 bytes, flags 0xc0
    // (`smc_llc_cli_add_link_reject`). The group keeps its one link; no ADD_LINK_CONT.
    let (add_req, add_resp) = (llc(0x22, 1), llc(0x22, 2));
    assert_eq!((add_req.len(), add_resp.len()), (1, 1), "ADD_LINK:\n{text}");
    assert_eq!(
        (add_req[0].len(), add_req[0][3]),
        (88, 0x00),
        "{:02x?}",
        add_req[0]
    );
    assert_eq!(u16::from_le_bytes([add_req[0][70], add_req[0][71]]), 1);
    assert_eq!((add_resp[0].len(), add_resp[0][3]), (44, 0xc0));
    assert!(llc(0x03, 1).is_empty() && llc(0x23, 1).is_empty());
    assert!(
        [sg, cg]
            .iter()
            .all(|g| g.links.len() == 1 && g.lgr_type == LgrType::Single),
        "{sg:#?} {cg:#?}"
    );
    // The second connection's RMBs: each side's CONFIRM_RKEY and the other's response.
    let (rk1, rk2) = (llc(0x26, 1), llc(0x26, 2));
    assert_eq!((rk1.len(), rk2.len()), (2, 2), "CONFIRM_RKEY:\n{text}");
    // The RMBs of both connections leave both groups: DELETE_RKEY v2 requests (one rkey, 44
    // bytes) and responses both ways.
    let (dk1, dk2) = (llc(0x29, 1), llc(0x29, 2));
    assert!(
        dk1.len() >= 2 && dk2.len() >= 2,
        "DELETE_RKEY ({} from the server, {} from the client):\n{text}",
        dk1.len(),
        dk2.len()
    );
    assert!(dk1.iter().chain(&dk2).all(|b| b.len() == 44 && b[4] == 1));
    // CDCs both ways, naming the tokens of both connections.
    let mut tokens: Vec<u64> = rows
        .iter()
        .filter(|r| num(col(r, "smc.llc_msg")) == 0xfe)
        .map(|r| num(col(r, "smc.rmbe.ctrl.alert.token")))
        .collect();
    tokens.sort_unstable();
    tokens.dedup();
    for m in modes.iter().chain(&served) {
        let SmcrMode::SmcR { local_token, .. } = m else {
            panic!("fell back: {m:?}");
        };
        assert!(
            tokens.contains(&u64::from(*local_token)),
            "no CDC for {local_token:#x}:\n{text}"
        );
    }
}

/// nftables in host `host`'s namespace: drop `percent` % of the RoCEv2 datagrams arriving
/// (`numgen random`), or all of them with 100.
fn drop_rocev2(hosts: &Hosts, host: u8, percent: u32) {
    let rule = format!("udp dport 4791 numgen random mod 100 lt {percent} counter drop");
    for cmd in [
        "add table inet smcrloss".to_string(),
        "add chain inet smcrloss input { type filter hook input priority 0; }".to_string(),
        format!("add rule inet smcrloss input {rule}"),
    ] {
        let ok = Command::new("ip")
            .args(["netns", "exec", &hosts.ns(host).name, "nft", &cmd])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "nft {cmd}");
    }
}

fn nft_available(test: &str) -> bool {
    !smc_tests::skip_unless_tool(test, "nft")
}

/// One SMC-R connection between the hosts; the server side runs `srv` on its stream, the
/// client side `cli`, each on a thread in its namespace.
fn one_connection<S, C>(
    hosts: &Hosts,
    port: u16,
    testlink: Duration,
    ring: usize,
    srv: impl FnOnce(SmcrStream) -> S + Send + 'static,
    cli: impl FnOnce(SmcrStream) -> C + Send + 'static,
) -> (JoinHandle<S>, JoinHandle<C>, SmcrEndpoint, SmcrEndpoint)
where
    S: Send + 'static,
    C: Send + 'static,
{
    let cfg = |host| SmcrConfig {
        testlink_time: testlink,
        ring,
        ..SmcrConfig::new(hosts.addr(host), UEID, Capability::Assume)
    };
    let se = endpoint_with(hosts, 1, cfg(1));
    let ce = endpoint_with(hosts, 2, cfg(2));
    let at = SocketAddr::from((hosts.addr(1), port));
    let l = hosts.listen(&se, at);
    let s = hosts.on(1, move || {
        let (s, _) = l.accept().expect("accept");
        srv(s)
    });
    let c2 = ce.clone();
    let c = hosts.on(2, move || cli(c2.connect(at).expect("connect")));
    (s, c, se, ce)
}

/// 5 % of the RoCEv2 datagrams into the server are dropped at random: a 256 MiB stream still
/// arrives byte-exact (sequence NAKs and go-back-N retransmission), the connection stays SMC-R.
#[test]
fn smcr_stream_is_byte_exact_under_random_loss() {
    let test = "smcr_stream_is_byte_exact_under_random_loss";
    if !nft_available(test) {
        return;
    }
    let Some(hosts) = Hosts::new(test) else {
        return;
    };
    drop_rocev2(&hosts, 1, 5);
    const TOTAL: u64 = 256 << 20;
    let (s, c, se, _ce) = one_connection(
        &hosts,
        7005,
        smc_core::llc::SMC_LLC_TESTLINK_DEFAULT_TIME,
        // 64 KiB buffers: a lost last packet of a burst often waits for the QP's timeout
        // (134 ms), which costs time but no CPU (larger buffers make go-back-N resend more:
        // the same time, all of it CPU).
        64 << 10,
        |mut s| {
            s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
            (recv(&mut s, 77), s.mode())
        },
        |mut c| {
            send(&mut c, 77, TOTAL);
            c.mode()
        },
    );
    let cm = c.join().unwrap();
    let (got, sm) = s.join().unwrap();
    assert_eq!(got, TOTAL);
    smcr_lgr(&cm);
    smcr_lgr(&sm);
    let st = se.device().stats();
    assert!(
        st.seq_naks_sent.load(Ordering::Relaxed) > 0,
        "no loss was seen: the rule did not apply"
    );
}

/// The veth goes down mid-stream: the reader's QP exhausts its retries (the kernel's timeout
/// 15 and retry count 7, about a second) on its next CDC, the writer's when its TEST_LINK
/// (`smcr_testlink_time`, 2 s here) goes unanswered; both links fail, both ends see the
/// connection reset, and nothing hangs.
#[test]
fn smcr_connection_resets_when_the_path_goes_away() {
    let test = "smcr_connection_resets_when_the_path_goes_away";
    let Some(hosts) = Hosts::new(test) else {
        return;
    };
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (s, c, _se, _ce) = one_connection(
        &hosts,
        7006,
        // The writer waits for window with nothing in flight: only TEST_LINK notices.
        Duration::from_secs(2),
        64 << 10,
        |mut s| {
            s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
            let mut buf = vec![0u8; 64 << 10];
            let mut n = 0u64;
            loop {
                match s.read(&mut buf) {
                    Ok(0) => return Err(n),
                    Ok(k) => n += k as u64,
                    Err(e) => return Ok((e.kind(), n)),
                }
            }
        },
        move |mut c| {
            let buf = vec![7u8; 64 << 10];
            let mut sent = 0u64;
            loop {
                if sent == 8 << 20 {
                    let _ = tx.send(());
                }
                match c.write(&buf) {
                    Ok(k) => sent += k as u64,
                    Err(e) => return (e.kind(), sent),
                }
            }
        },
    );
    rx.recv_timeout(Duration::from_secs(120))
        .expect("the stream never got going");
    let started = std::time::Instant::now();
    ip(&[
        "-n",
        &hosts.a.name,
        "link",
        "set",
        &format!("va{}", std::process::id()),
        "down",
    ]);
    let (ck, sent) = c.join().unwrap();
    let sr = s.join().unwrap();
    let took = started.elapsed();
    eprintln!("link down: writer saw {ck:?} after {sent} bytes; reader {sr:?}; {took:?}");
    let (sk, got) = sr.expect("the reader saw an end of stream, not a reset");
    assert_eq!(sk, std::io::ErrorKind::ConnectionReset, "reader");
    assert!(
        matches!(
            ck,
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted
        ),
        "writer: {ck:?}"
    );
    assert!(got <= sent);
}

/// Waits (at most `within`) until `ok` holds for both endpoints' only group.
fn wait_groups(
    eps: [&SmcrEndpoint; 2],
    within: Duration,
    what: &str,
    ok: impl Fn(&smcd_engine::smcr::LinkGroupInfo) -> bool,
) {
    let deadline = std::time::Instant::now() + within;
    loop {
        let groups: Vec<_> = eps.iter().map(|e| e.link_groups()).collect();
        if groups.iter().all(|g| g.len() == 1 && ok(&g[0])) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within {within:?}: {groups:#?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn active_links(g: &smcd_engine::smcr::LinkGroupInfo) -> usize {
    g.links.iter().filter(|l| l.active && !l.failed).count()
}

/// Two veth pairs between the namespaces, an endpoint with two ports on each side: the
/// group gets its second link by ADD_LINK (symmetric), connections spread over both links,
/// and when one path goes down mid-stream every connection on it moves to the other link
/// (failover-validation CDC, rewrite) with no byte lost or duplicated; the link is deleted,
/// and added again once the path is back. Then the path the TCP connections use goes down
/// under a second round of streams: they finish over the other link all the same.
#[test]
fn smcr_two_links_and_failover_between_two_namespaces() {
    let test = "smcr_two_links_and_failover_between_two_namespaces";
    let Some(hosts) = Hosts::two_paths(test) else {
        return;
    };
    const TOTAL: u64 = 24 << 20;
    const CONNS: u64 = 4;
    let cfg = |host: u8| SmcrConfig {
        alt: Some((hosts.addr2(host), None)),
        // An idle link is noticed by TEST_LINK; a busy one by its retries.
        testlink_time: Duration::from_secs(2),
        ..SmcrConfig::new(hosts.addr(host), UEID, Capability::Assume)
    };
    let srv = endpoint_with(&hosts, 1, cfg(1));
    let cli = endpoint_with(&hosts, 2, cfg(2));
    let at = SocketAddr::from((hosts.addr(1), 7007));
    let l = hosts.listen(&srv, at);
    let l = std::sync::Arc::new(l);
    // One round: CONNS connections at once, each TOTAL bytes both ways at the same time;
    // `mid` runs once every connection has moved a quarter of its bytes.
    let round = |seed: u64, mid: &dyn Fn()| {
        let l = std::sync::Arc::clone(&l);
        let server = hosts.on(1, move || {
            let mut peers = Vec::new();
            for _ in 0..CONNS {
                let (s, _) = l.accept().expect("accept");
                peers.push(std::thread::spawn(move || {
                    let mut s = s;
                    s.set_read_timeout(Some(Duration::from_secs(90))).unwrap();
                    let mut seed = [0u8; 8];
                    s.read_exact(&mut seed).unwrap();
                    let seed = u64::from_le_bytes(seed);
                    let mode = s.mode();
                    let mut w = s.try_clone().expect("clone");
                    let back = std::thread::spawn(move || send(&mut w, seed + 1, TOTAL));
                    let got = recv(&mut s, seed);
                    back.join().unwrap();
                    (mode, got)
                }));
            }
            peers
                .into_iter()
                .map(|p| p.join().unwrap())
                .collect::<Vec<_>>()
        });
        let progress = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let clients: Vec<_> = (0..CONNS)
            .map(|k| {
                let cli = cli.clone();
                let progress = std::sync::Arc::clone(&progress);
                hosts.on(2, move || {
                    let seed = seed + 10 * k;
                    let mut s = cli.connect(at).expect("connect");
                    s.set_read_timeout(Some(Duration::from_secs(90))).unwrap();
                    s.write_all(&seed.to_le_bytes()).unwrap();
                    let mode = s.mode();
                    let mut w = s.try_clone().expect("clone");
                    let out = std::thread::spawn(move || send(&mut w, seed, TOTAL));
                    let got = recv_counting(&mut s, seed + 1, &progress);
                    out.join().unwrap();
                    (mode, got)
                })
            })
            .collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while progress.load(Ordering::Relaxed) < CONNS * TOTAL / 4 {
            assert!(
                std::time::Instant::now() < deadline,
                "the streams never got going"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        mid();
        for c in clients {
            let (m, got) = c.join().unwrap();
            smcr_lgr(&m);
            assert_eq!(got, TOTAL, "client got short");
        }
        for (m, got) in server.join().unwrap() {
            smcr_lgr(&m);
            assert_eq!(got, TOTAL, "server got short");
        }
    };

    // Round 1: two links, two connections on each; path 2 goes down mid-stream.
    let spread = std::sync::Mutex::new(None);
    let ids = std::sync::Mutex::new(Vec::new());
    round(100, &|| {
        let g = &srv.link_groups()[0];
        assert_eq!(active_links(g), 2, "no second link: {g:#?}");
        *spread.lock().unwrap() = Some(g.links.iter().map(|l| l.conns).collect::<Vec<_>>());
        *ids.lock().unwrap() = g.links.iter().map(|l| l.link_id).collect();
        hosts.set_path(2, false);
    });
    assert_eq!(
        spread.into_inner().unwrap(),
        Some(vec![2, 2]),
        "connections were not spread"
    );
    // The lost link is gone on both sides (a link the server's ADD_LINK retry over the dead
    // path is setting up has a new id, and may be there as well).
    let ids = ids.into_inner().unwrap();
    wait_groups(
        [&srv, &cli],
        Duration::from_secs(30),
        "one link left",
        |g| {
            active_links(g) == 1
                && g.links.iter().filter(|l| ids.contains(&l.link_id)).count() == 1
                && g.up
        },
    );
    // The path returns: the server adds the link again.
    hosts.set_path(2, true);
    wait_groups(
        [&srv, &cli],
        Duration::from_secs(40),
        "the second link again",
        |g| active_links(g) == 2,
    );
    // Round 2: the first path (the TCP connections' and the first link's) goes down.
    round(200, &|| hosts.set_path(1, false));
    hosts.set_path(1, true);
    for ep in [&srv, &cli] {
        let st = ep.stats();
        assert_eq!(st.first_contacts.load(Ordering::Relaxed), 1);
        assert_eq!(st.reused.load(Ordering::Relaxed), 2 * CONNS - 1);
        assert_eq!(st.fallbacks.load(Ordering::Relaxed), 0);
    }
}

/// [`recv`], adding what arrives to `progress`.
fn recv_counting(s: &mut SmcrStream, seed: u64, progress: &std::sync::atomic::AtomicU64) -> u64 {
    let mut buf = vec![0u8; 70 << 10];
    let mut at = 0u64;
    loop {
        let n = s.read(&mut buf).expect("read");
        if n == 0 {
            return at;
        }
        for (k, &b) in buf[..n].iter().enumerate() {
            assert_eq!(
                b,
                byte(seed, at + k as u64),
                "byte {} of stream {seed}",
                at + k as u64
            );
        }
        at += n as u64;
        progress.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// Echoes what it reads until the end of stream, then ends its own.
fn echo(mut s: SmcrStream) -> u64 {
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut buf = vec![0u8; 64 << 10];
    let mut n = 0u64;
    loop {
        let k = s.read(&mut buf).expect("read");
        if k == 0 {
            s.shutdown(Shutdown::Write).expect("shutdown");
            return n;
        }
        s.write_all(&buf[..k]).expect("write");
        n += k as u64;
    }
}

/// Host 1 accepts `n` connections on `l` and echoes each on a thread of its own; the handle
/// gives what each echoed.
fn echo_server(hosts: &Hosts, l: SmcrListener, n: usize) -> JoinHandle<Vec<u64>> {
    hosts.on(1, move || {
        let peers: Vec<_> = (0..n)
            .map(|_| {
                let (s, _) = l.accept().expect("accept");
                std::thread::spawn(move || echo(s))
            })
            .collect();
        peers.into_iter().map(|p| p.join().unwrap()).collect()
    })
}

/// Ends each stream's writing and reads to its end, which must come with no byte more (an
/// [`echo`] has sent back everything already read, and then ends its own).
fn close_all(conns: impl IntoIterator<Item = SmcrStream>) {
    for mut s in conns {
        s.shutdown(Shutdown::Write).unwrap();
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "{} bytes after the echo", rest.len());
    }
}

/// `len` pattern bytes of `seed` out and the same back from [`echo`]: at most what the buffers
/// on the way hold (four of 64 KiB), since the echo writes back before this side reads.
fn round_trip(s: &mut SmcrStream, seed: u64, len: u64) {
    if let Err(e) = try_round_trip(s, seed, len) {
        panic!("{e}");
    }
}

/// `n` connections from host 2 to `at`, each SMC-R and each through one round trip of `len`
/// bytes with an [`echo`] (seeds `seed`, `seed + 1`, ...).
fn connect_echoing(
    hosts: &Hosts,
    cli: &SmcrEndpoint,
    at: SocketAddr,
    n: usize,
    seed: u64,
    len: u64,
) -> Vec<SmcrStream> {
    let c = cli.clone();
    hosts
        .on(2, move || {
            (0..n as u64)
                .map(|i| {
                    let mut s = c.connect(at).expect("connect");
                    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                    smcr_lgr(&s.mode());
                    round_trip(&mut s, seed + i, len);
                    s
                })
                .collect()
        })
        .join()
        .unwrap()
}

/// [`round_trip`], saying what failed instead of panicking.
fn try_round_trip(s: &mut SmcrStream, seed: u64, len: u64) -> Result<(), String> {
    let out: Vec<u8> = (0..len).map(|i| byte(seed, i)).collect();
    s.write_all(&out).map_err(|e| format!("write: {e:?}"))?;
    let mut back = vec![0u8; len as usize];
    s.read_exact(&mut back)
        .map_err(|e| format!("read the echo: {e:?}"))?;
    if back != out {
        return Err(format!("the echo of stream {seed} differs"));
    }
    Ok(())
}

/// A link group keeps the buffers of a connection that closed for its next one, as the
/// kernel's does (`smcr_buf_unuse`: DELETE_RKEY, cleared; `smc_buf_get_slot` on the next
/// connection, which confirms the key again): on both sides the second connection runs on
/// the first one's buffers, byte-exact, and is counted as a reuse; two connections at once
/// then take the one spare and one new pair, and the group keeps both pairs after.
#[test]
fn smcr_buffers_are_reused_within_a_link_group() {
    let test = "smcr_buffers_are_reused_within_a_link_group";
    let Some(hosts) = Hosts::new(test) else {
        return;
    };
    // Both publish to one smcd: its statistics count the reuses as the kernel's do.
    let smcd = smc_tests::Smcd::start(smc_tests::bins!());
    let cfg = |host: u8| SmcrConfig {
        smcd: Some(smcd.socket.clone()),
        ..SmcrConfig::new(hosts.addr(host), UEID, Capability::Assume)
    };
    let srv = endpoint_with(&hosts, 1, cfg(1));
    let cli = endpoint_with(&hosts, 2, cfg(2));
    let at = SocketAddr::from((hosts.addr(1), 7011));
    let server = echo_server(&hosts, hosts.listen(&srv, at), 4);
    let reused = |ep: &SmcrEndpoint| ep.stats().bufs_reused.load(Ordering::Relaxed);
    let spare = |ep: &SmcrEndpoint| ep.link_groups().first().map_or(0, |g| g.spare_bufs);
    let until_spare = |n: usize, what: &str| {
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        while spare(&srv) != n || spare(&cli) != n {
            assert!(
                std::time::Instant::now() < deadline,
                "{what}: spares {} and {}, not {n}",
                spare(&srv),
                spare(&cli)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let connect = |seed: u64| {
        let c = cli.clone();
        hosts
            .on(2, move || {
                let mut s = c.connect(at).expect("connect");
                s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                smcr_lgr(&s.mode());
                round_trip(&mut s, seed, 200 << 10);
                s
            })
            .join()
            .unwrap()
    };
    // The first connection makes its buffers (first contact), and leaves them to the group.
    let first = connect(1);
    assert_eq!((reused(&srv), reused(&cli)), (0, 0));
    close_all([first]);
    until_spare(1, "after the first connection");
    // The second runs on them, on both sides.
    let second = connect(2);
    assert_eq!((reused(&srv), reused(&cli)), (1, 1));
    assert_eq!((spare(&srv), spare(&cli)), (0, 0));
    close_all([second]);
    until_spare(1, "after the second connection");
    // Two at once: one takes the spare, the other gets new ones; both give theirs back.
    let (a, b) = (connect(3), connect(4));
    assert_eq!((reused(&srv), reused(&cli)), (2, 2));
    close_all([a, b]);
    until_spare(2, "after two at once");
    let echoed = server.join().unwrap();
    assert_eq!(echoed, vec![200 << 10; 4]);
    // Both sides: the first and the fourth connection's buffers were made, the second's and
    // the third's reused (`SMC_STAT_RMB_REUSE` / `_ALLOC`, RMB and send buffer alike).
    let st = smcd.ctl("--json stats --smcr").json();
    for dir in ["rx", "tx"] {
        assert_eq!(st[dir]["buffer_allocs"], 4, "{st}");
        assert_eq!(st[dir]["buffer_reuses"], 4, "{st}");
    }
    for ep in [&srv, &cli] {
        assert_eq!(ep.stats().first_contacts.load(Ordering::Relaxed), 1);
        assert_eq!(ep.stats().fallbacks.load(Ordering::Relaxed), 0);
        assert_eq!(ep.link_groups().len(), 1);
    }
}

/// SMC-Rv2 puts every rkey of a new link into the ADD_LINK pair (no ADD_LINK_CONT): with the
/// second path down, 40 connections join the group on its one link; once the path is back the
/// server's ADD_LINK and the client's response each carry the keys of all 40 RMBs on the new
/// link (72 + 16 × 40 = 712 bytes: sent from the v2 send buffer, received over a receive's
/// 44-byte slot and the link's 8 KiB v2 buffer). Then the first path goes down: every
/// connection moves to the new link and still echoes byte-exact, writing with the rkeys those
/// two messages carried.
#[test]
fn smcr_v2_add_link_carries_the_rkeys_of_every_connection() {
    let test = "smcr_v2_add_link_carries_the_rkeys_of_every_connection";
    let Some(hosts) = Hosts::two_paths(test) else {
        return;
    };
    const N: usize = 40;
    let cfg = |host: u8| SmcrConfig {
        alt: Some((hosts.addr2(host), None)),
        testlink_time: Duration::from_secs(2),
        ..SmcrConfig::new(hosts.addr(host), UEID, Capability::Assume)
    };
    hosts.set_path(2, false);
    let srv = endpoint_with(&hosts, 1, cfg(1));
    let cli = endpoint_with(&hosts, 2, cfg(2));
    let at = SocketAddr::from((hosts.addr(1), 7009));
    let l = hosts.listen(&srv, at);
    let server = echo_server(&hosts, l, N);
    let conns = connect_echoing(&hosts, &cli, at, N, 100, 1000);
    let g = srv.link_groups().remove(0);
    assert_eq!((active_links(&g), g.conns), (1, N as u32), "{g:#?}");
    // The path returns: the server's ADD_LINK retry brings the second link up.
    hosts.set_path(2, true);
    wait_groups(
        [&srv, &cli],
        Duration::from_secs(40),
        "the second link",
        |g| active_links(g) == 2,
    );
    // Every connection is on the first link; the first path goes: all move to the new one.
    hosts.set_path(1, false);
    let (conns, failed) = hosts
        .on(2, move || {
            let mut conns = conns;
            let failed: Vec<(usize, String, SmcrMode)> = conns
                .iter_mut()
                .enumerate()
                .filter_map(|(i, s)| {
                    let r = try_round_trip(s, 200 + i as u64, 20_000);
                    r.err().map(|e| (i, e, s.mode()))
                })
                .collect();
            (conns, failed)
        })
        .join()
        .unwrap();
    // An intermittent failure here (twice on 2026-12-07: once in the whole suite, once run
    // alone just after; none in some 20 runs since, alone, beside CPU hogs and in the suite)
    // is to be diagnosed from this: which connections, how, and what both groups looked like
    // after.
    assert!(
        failed.is_empty(),
        "{} of {N} connections failed after the failover: {failed:?}\nserver: {:#?}\nclient: {:#?}\nserver device: {:?}\nclient device: {:?}",
        failed.len(),
        srv.link_groups(),
        cli.link_groups(),
        srv.device().stats(),
        cli.device().stats(),
    );
    hosts.set_path(1, true);
    close_all(conns);
    let echoed = server.join().unwrap();
    assert_eq!(echoed, vec![21_000; N]);
}

/// The second link and a failover as tshark sees them on the first path: ADD_LINK request
/// and response and ADD_LINK_CONT (the rkey exchange) over the first link, then, once the
/// second path is down, DELETE_LINK (reason LOST_PATH) and the failover-validation CDC of the
/// connection that moved; nothing malformed.
#[test]
fn tshark_decodes_smcr_add_link_delete_link_and_failover_on_the_veth() {
    let test = "tshark_decodes_smcr_add_link_delete_link_and_failover_on_the_veth";
    if smc_tests::skip_unless_tool(test, "tshark") {
        return;
    }
    let Some(hosts) = Hosts::two_paths(test) else {
        return;
    };
    let cfg = |host: u8| SmcrConfig {
        alt: Some((hosts.addr2(host), None)),
        testlink_time: Duration::from_secs(2),
        ..SmcrConfig::new(hosts.addr(host), UEID, Capability::Assume)
    };
    let srv = endpoint_with(&hosts, 1, cfg(1));
    let cli = endpoint_with(&hosts, 2, cfg(2));
    let at = SocketAddr::from((hosts.addr(1), 7008));
    let l = hosts.listen(&srv, at);
    let cap = Capture::start(&hosts, 7008);
    let server = echo_server(&hosts, l, 2);
    let c = cli.clone();
    let mut conns = hosts
        .on(2, move || {
            let mut a = c.connect(at).expect("connect");
            a.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
            round_trip(&mut a, 1, 10_000);
            let mut b = c.connect(at).expect("connect");
            b.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
            round_trip(&mut b, 2, 10_000);
            vec![a, b]
        })
        .join()
        .unwrap();
    let sg = srv.link_groups().remove(0);
    assert_eq!(active_links(&sg), 2, "{sg:#?}");
    assert_eq!(
        sg.links.iter().map(|l| l.conns).collect::<Vec<_>>(),
        vec![1, 1],
        "one connection on each link: {sg:#?}"
    );
    hosts.set_path(2, false);
    // The connection on the second link notices on its next CDC (or TEST_LINK) and moves.
    let mut b = conns.pop().unwrap();
    let a = conns.pop().unwrap();
    let (b, a) = hosts
        .on(2, move || {
            round_trip(&mut b, 3, 200_000);
            (b, a)
        })
        .join()
        .unwrap();
    wait_groups(
        [&srv, &cli],
        Duration::from_secs(30),
        "one link left",
        // Active ones: the server retries ADD_LINK over the dead path now and then
        // (`retry_add_link`), so a link on its way up may be there as well.
        |g| active_links(g) == 1,
    );
    close_all([a, b]);
    assert_eq!(server.join().unwrap(), vec![10_000, 210_000]);
    let rows = cap.finish();
    let text: String = rows
        .iter()
        .filter(|r| {
            num(col(r, "smc.llc_msg")) != 0xfe
                || !col(r, "smc.rmbe.ctrl.failover.validation").starts_with('0')
        })
        .map(|r| r.join("|") + "\n")
        .collect();
    assert!(
        rows.iter().all(|r| col(r, "_ws.malformed").is_empty()),
        "malformed packets:\n{text}"
    );
    let from = |r: &[String], host: u8| col(r, "ip.src") == hosts.addr(host).to_string();
    let llc = |t: u8, host: u8| llc_v2(&rows, t, |r| from(r, host));
    assert!(
        rows.iter()
            .all(|r| !(1..=9).contains(&num(col(r, "smc.llc_msg")))),
        "v1 LLC in a v2 group:\n{text}"
    );
    // ADD_LINK v2: the server's request, the client's response, each naming the QP of its
    // end of the new link (byte 28) and carrying the rkeys of the RMBs in use in its
    // extension (count at 70, host order): no ADD_LINK_CONT.
    let (add_req, add_resp) = (llc(0x22, 1), llc(0x22, 2));
    assert!(
        !add_req.is_empty() && !add_resp.is_empty(),
        "ADD_LINK:\n{text}"
    );
    for (b, flags) in add_req
        .iter()
        .map(|b| (b, 0x00))
        .chain(add_resp.iter().map(|b| (b, 0x80)))
    {
        assert_eq!(b[3], flags, "{b:02x?}");
        assert_ne!(be24_at(b, 28), 0, "{b:02x?}");
        let n = usize::from(u16::from_le_bytes([b[70], b[71]]));
        assert!(n >= 1 && b.len() == 72 + 16 * n, "{b:02x?}");
    }
    assert!(
        llc(0x03, 1).is_empty() && llc(0x03, 2).is_empty(),
        "ADD_LINK_CONT in a v2 group:\n{text}"
    );
    // DELETE_LINK v2 for the lost path (reason LOST_PATH 0x00010000 at byte 5), from either
    // side.
    let dels: Vec<_> = llc(0x24, 1).into_iter().chain(llc(0x24, 2)).collect();
    assert!(!dels.is_empty(), "DELETE_LINK:\n{text}");
    assert!(dels.iter().any(|b| b[5..9] == [0, 1, 0, 0]), "{text}");
    let truthy = |v: &str| matches!(v, "1" | "True");
    eprintln!(
        "ADD_LINK {}/{}, DELETE_LINK {:02x?}",
        add_req.len(),
        add_resp.len(),
        dels.iter().map(|b| &b[5..9]).collect::<Vec<_>>()
    );
    // The moved connection's failover-validation CDC.
    assert!(
        rows.iter().any(|r| num(col(r, "smc.llc_msg")) == 0xfe
            && truthy(col(r, "smc.rmbe.ctrl.failover.validation"))),
        "no failover-validation CDC:\n{text}"
    );
}

/// What a tool in this process's mount namespace prints for the ifindex of `dev` in host
/// `host`'s namespace: the name sysfs here has for that index (another interface's: sysfs
/// is the test namespace's), or the number.
fn ifindex(hosts: &Hosts, host: u8, dev: &str) -> String {
    let out = Command::new("ip")
        .args(["-n", &hosts.ns(host).name, "-o", "link", "show", "dev", dev])
        .output()
        .expect("ip link show");
    let text = String::from_utf8_lossy(&out.stdout);
    let index = text
        .split(':')
        .next()
        .unwrap_or_default()
        .trim()
        .to_string();
    std::fs::read_dir("/sys/class/net")
        .into_iter()
        .flatten()
        .flatten()
        .find(|e| {
            std::fs::read_to_string(e.path().join("ifindex")).is_ok_and(|s| s.trim() == index)
        })
        .map_or(index, |e| e.file_name().to_string_lossy().into_owned())
}

/// smcd looks up the host's RDMA devices when it starts and for each `GET_DEV_SMCR` dump
/// (built with the feature `rnic`; without it the list is empty): on a machine with no RDMA
/// in its kernel (these: no `ib_uverbs`, no rxe) it starts, answers, lists the soft device
/// port an endpoint publishes exactly as before, in smc-tools' columns, and logs nothing
/// worse than the line that says why there is no RDMA device.
#[test]
fn smcd_lists_soft_ports_and_no_rnic_where_there_is_none() {
    let test = "smcd_lists_soft_ports_and_no_rnic_where_there_is_none";
    let Some(hosts) = Hosts::new(test) else {
        return;
    };
    let bins = smc_tests::bins!();
    let dir = std::env::temp_dir().join(smc_tests::unique("rnic"));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("smcd.sock");
    let log = dir.join("smcd.log");
    let mut smcd = Command::new(bins.smcd)
        .args(["--no-bpf", "--socket"])
        .arg(&socket)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start smcd");
    // Killed if an assertion below fails first.
    struct Reap(u32);
    impl Drop for Reap {
        fn drop(&mut self) {
            if let Some(pid) = rustix::process::Pid::from_raw(self.0 as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
    let reap = Reap(smcd.id());
    smc_tests::wait_for("smcd's socket", || socket.exists().then_some(()));
    let ctl = |args: &str| bins.smcctl(Some(&socket), args);
    // Nothing published yet, no RNIC: an empty table, and a second dump the same.
    for _ in 0..2 {
        let dev = ctl("--json device show --smcr").json();
        assert_eq!(dev["ports"].as_array().map(Vec::len), Some(0), "{dev}");
    }
    let cfg = SmcrConfig {
        smcd: Some(socket.clone()),
        ..SmcrConfig::new(hosts.addr(1), UEID, Capability::Assume)
    };
    let ep = endpoint_with(&hosts, 1, cfg);
    let name = format!("sroce-{}", hosts.addr(1));
    let dev = smc_tests::wait_for("the endpoint's port in the dump", || {
        let dev = ctl("--json device show --smcr").json();
        (dev["ports"].as_array().map(Vec::len) == Some(1)).then_some(dev)
    });
    let p = &dev["ports"][0];
    assert_eq!(p["ib_dev"], name.as_str(), "{dev}");
    assert_eq!(p["ib_port"], 1, "{dev}");
    assert_eq!(p["ib_state"], "ACTIVE", "{dev}");
    assert_eq!(p["link_count"], 0, "{dev}");
    let text = ctl("device show --smcr");
    let text = text.ok();
    let mut lines = text.lines();
    let head: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
    assert_eq!(
        head,
        [
            "Net-Dev", "IB-Dev", "IB-P", "IB-State", "Type", "Crit", "#Links", "PNET-ID"
        ],
        "{text}"
    );
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), 1, "{text}");
    assert!(rows[0].contains(&name), "{text}");
    drop(ep);
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(smcd.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    assert!(smcd.wait().unwrap().success(), "smcd exits cleanly");
    std::mem::forget(reap);
    let log = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    for bad in ["WARN", "ERROR", "panicked"] {
        assert!(!log.contains(bad), "smcd logged {bad}:\n{log}");
    }
    let line = log
        .lines()
        .find(|l| l.contains("RDMA devices:"))
        .unwrap_or_else(|| panic!("no RDMA devices line:\n{log}"));
    if cfg!(feature = "rnic") {
        // With the feature the look-up ran (and says what it found, or why nothing).
        assert!(!line.contains("without the feature"), "{line}");
    } else {
        assert!(line.contains("without the feature `rnic`"), "{line}");
    }
}

/// One smcd, an endpoint with two ports in each namespace publishing to it: `smcctl
/// linkgroup show --smcr`, `linkgroup links` and `device show --smcr` show both sides' groups
/// (role, type SYM, connections), their links (state, connections on each, the device and
/// netdev, the GIDs in the kernel's format) and the four device ports with one link each;
/// after the second path goes down each group shows one link carrying both connections.
///
/// smcd files an engine under its process's network namespace as the kernel reports it for
/// the pid (`/proc/PID/ns/net`), not the namespace a thread of it moved to: both endpoints of
/// this test process are the test's namespace's, so smcctl asks from there (and prints the
/// veths' ifindexes, whose names live in the test namespaces).
#[test]
fn smcctl_shows_smcr_link_groups_links_and_devices() {
    let test = "smcctl_shows_smcr_link_groups_links_and_devices";
    let Some(hosts) = Hosts::two_paths(test) else {
        return;
    };
    let smcd = smc_tests::Smcd::start(smc_tests::bins!());
    let cfg = |host: u8| SmcrConfig {
        alt: Some((hosts.addr2(host), None)),
        testlink_time: Duration::from_secs(2),
        smcd: Some(smcd.socket.clone()),
        ..SmcrConfig::new(hosts.addr(host), UEID, Capability::Assume)
    };
    let srv = endpoint_with(&hosts, 1, cfg(1));
    let cli = endpoint_with(&hosts, 2, cfg(2));
    let at = SocketAddr::from((hosts.addr(1), 7009));
    let l = hosts.listen(&srv, at);
    let server = echo_server(&hosts, l, 2);
    let c = cli.clone();
    let conns = hosts
        .on(2, move || {
            (0..2)
                .map(|k| {
                    let mut s = c.connect(at).expect("connect");
                    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                    round_trip(&mut s, k, 50_000);
                    s
                })
                .collect::<Vec<_>>()
        })
        .join()
        .unwrap();
    let gid = |a: Ipv4Addr| {
        let o = a.octets();
        format!(
            "0000:0000:0000:0000:0000:ffff:{:02x}{:02x}:{:02x}{:02x}",
            o[0], o[1], o[2], o[3]
        )
    };
    let lg = smcd.ctl("--json linkgroup show --smcr").json();
    let groups = lg["linkgroups"].as_array().expect("linkgroups");
    assert_eq!(groups.len(), 2, "{lg}");
    let links = smcd.ctl("--json linkgroup links").json();
    let ls = links["links"].as_array().expect("links");
    assert_eq!(ls.len(), 4, "{links}");
    for (host, role) in [(1u8, "SERV"), (2, "CLNT")] {
        let peer = 3 - host;
        let g = groups
            .iter()
            .find(|g| g["role"] == role)
            .unwrap_or_else(|| panic!("no {role} group: {lg}"));
        assert_eq!(g["lgr_type"], "SYM", "{lg}");
        assert_eq!(g["conns"], 2, "{lg}");
        assert_eq!(g["version"], 2, "{lg}");
        let mine: Vec<_> = ls.iter().filter(|l| l["role"] == role).collect();
        assert_eq!(mine.len(), 2, "{links}");
        for (k, l) in mine.iter().enumerate() {
            let path = k as u8 + 1;
            let (own, theirs) = if path == 1 {
                (hosts.addr(host), hosts.addr(peer))
            } else {
                (hosts.addr2(host), hosts.addr2(peer))
            };
            assert_eq!(l["state"], "LINK_ACTIVE", "{links}");
            assert_eq!(l["conns"], 1, "one connection on each link: {links}");
            assert_eq!(l["lgr_id"], g["id"]);
            assert_eq!(
                l["net_dev"],
                ifindex(&hosts, host, &hosts.veth(host, path)),
                "{links}"
            );
            assert_eq!(l["ib_dev"], format!("sroce-{own}"), "{links}");
            assert_eq!(l["gid"], gid(own), "{links}");
            assert_eq!(l["peer_gid"], gid(theirs), "{links}");
        }
    }
    let dev = smcd.ctl("--json device show --smcr").json();
    let ports = dev["ports"].as_array().expect("ports");
    assert_eq!(ports.len(), 4, "{dev}");
    for p in ports {
        assert_eq!(p["link_count"], 1, "{dev}");
        assert_eq!(p["ib_state"], "ACTIVE", "{dev}");
    }
    // SMC-D's dump does not list SMC-R groups.
    let d = smcd.ctl("--json linkgroup show --smcd").json();
    assert_eq!(d["linkgroups"].as_array().map(Vec::len), Some(0), "{d}");
    // smcss -R: the four connections, mode SMCR, each with the link it sends on.
    let ss = smcd.ctl("--json ss -R").json();
    let socks = ss.as_array().or(ss["sockets"].as_array()).expect("sockets");
    assert_eq!(socks.len(), 4, "{ss}");
    for k in socks {
        assert_eq!(k["mode"], "SMCR", "{ss}");
        let r = &k["smcr"];
        let id = r["linkid"].as_u64().unwrap_or(0);
        assert!(id == 1 || id == 2, "no link: {ss}");
        let own = if id == 1 {
            hosts.addr(1)
        } else {
            hosts.addr2(1)
        };
        let own2 = if id == 1 {
            hosts.addr(2)
        } else {
            hosts.addr2(2)
        };
        assert!(
            r["gid"] == gid(own) || r["gid"] == gid(own2),
            "the GID of link {id}: {ss}"
        );
        assert!(
            r["ib_device"]
                .as_str()
                .is_some_and(|d| d.starts_with("sroce-"))
        );
    }
    // smcstat --smcr: both sides' handshakes and bytes, as SMC-R's (SMC-D's stay zero).
    let st = smcd.ctl("--json stats --smcr").json();
    assert_eq!(st["connections"]["smc"]["client"], 2, "{st}");
    assert_eq!(st["connections"]["smc"]["server"], 2, "{st}");
    assert_eq!(st["connections"]["v2"], 4, "{st}");
    // Each connection's 50,000 bytes and their echo, counted on both sides.
    assert!(
        st["tx"]["bytes"].as_u64().unwrap_or(0) >= 4 * 50_000,
        "{st}"
    );
    assert!(
        st["rx"]["bytes"].as_u64().unwrap_or(0) >= 4 * 50_000,
        "{st}"
    );
    assert_eq!(st["rx"]["buffer_allocs"], 4, "{st}");
    let sd = smcd.ctl("--json stats --smcd").json();
    assert_eq!(sd["connections"]["smc"]["total"], 0, "{sd}");
    assert_eq!(sd["tx"]["bytes"], 0, "{sd}");
    // The second path goes; once the connection on it has moved, one link is left.
    hosts.set_path(2, false);
    let mut conns = conns;
    let b = conns.pop().unwrap();
    let b = hosts
        .on(2, move || {
            let mut b = b;
            round_trip(&mut b, 9, 50_000);
            b
        })
        .join()
        .unwrap();
    let left = || smcd.ctl("--json linkgroup links").json();
    // Active: one link per group, carrying both connections. (A group missing its second
    // link tries ADD_LINK again every few seconds: such a link may be listed ACTIVATING on
    // the path that is down, with no connection.)
    let settled = |links: &serde_json::Value| {
        let all = links["links"].as_array().cloned().unwrap_or_default();
        let active: Vec<_> = all.iter().filter(|l| l["state"] == "LINK_ACTIVE").collect();
        active.len() == 2
            && active.iter().all(|l| l["conns"] == 2)
            && all.iter().all(|l| {
                l["state"] == "LINK_ACTIVE" || (l["state"] == "LINK_ACTIVATING" && l["conns"] == 0)
            })
    };
    assert!(
        smc_tests::eventually(Duration::from_secs(30), || settled(&left())),
        "the lost links are still listed, or the connections did not move: {}",
        left()
    );
    close_all(conns.into_iter().chain([b]));
    server.join().unwrap();
}

/// The namespace's SMC-R sysctls, set with smcctl, shape what an endpoint that publishes to
/// smcd makes next: `smcr_max_links_per_lgr` 1 keeps two-port endpoints to one link,
/// `smcr_max_conns_per_lgr` 16 puts the 17th connection into a second group,
/// `smcr_max_send_wr` 8 and `smcr_max_recv_wr` 20 size the QPs (24 send work requests: three
/// a slot), `smcr_buf_type` 1 is what the groups report, and `rmem` 128 KiB and `wmem`
/// 32 KiB size every connection's RMB and send buffer (the statistics' buffer sizes).
#[test]
fn smcr_sysctls_take_effect() {
    let test = "smcr_sysctls_take_effect";
    let Some(hosts) = Hosts::two_paths(test) else {
        return;
    };
    let smcd = smc_tests::Smcd::start(smc_tests::bins!());
    // The endpoints of this process are filed under its namespace (see the smcctl test).
    for set in [
        "smcr_max_links_per_lgr=1",
        "smcr_max_conns_per_lgr=16",
        "smcr_max_send_wr=8",
        "smcr_max_recv_wr=20",
        "smcr_buf_type=1",
        "rmem=131072",
        "wmem=32768",
    ] {
        smcd.ctl(&format!("sysctl set {set}")).ok();
    }
    let cfg = |host: u8| SmcrConfig {
        alt: Some((hosts.addr2(host), None)),
        smcd: Some(smcd.socket.clone()),
        ..SmcrConfig::new(hosts.addr(host), UEID, Capability::Assume)
    };
    let srv = endpoint_with(&hosts, 1, cfg(1));
    let cli = endpoint_with(&hosts, 2, cfg(2));
    let at = SocketAddr::from((hosts.addr(1), 7010));
    let l = hosts.listen(&srv, at);
    const CONNS: u64 = 17;
    let server = echo_server(&hosts, l, CONNS as usize);
    let c = cli.clone();
    let conns = hosts
        .on(2, move || {
            (0..CONNS)
                .map(|k| {
                    let mut s = c.connect(at).expect("connect");
                    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                    // The first through both buffers several times over.
                    round_trip(&mut s, k, if k == 0 { 100_000 } else { 2_000 });
                    smcr_lgr(&s.mode());
                    s
                })
                .collect::<Vec<_>>()
        })
        .join()
        .unwrap();
    for ep in [&srv, &cli] {
        let mut groups = ep.link_groups();
        groups.sort_by_key(|g| std::cmp::Reverse(g.conns));
        assert_eq!(
            groups.iter().map(|g| g.conns).collect::<Vec<_>>(),
            vec![16, 1],
            "smcr_max_conns_per_lgr 16: {groups:#?}"
        );
        for g in &groups {
            assert_eq!((g.max_conns, g.max_links, g.buf_type), (16, 1, 1), "{g:#?}");
            assert_eq!(g.links.len(), 1, "smcr_max_links_per_lgr 1: {g:#?}");
            assert_eq!(g.links[0].queue_sizes, (24, 20), "{g:#?}");
        }
    }
    // Both sides' connections, filed under this process's namespace: RMBs of rmem, send
    // buffers of wmem.
    let st = smcd.ctl("--json stats --smcr").json();
    assert_eq!(st["rx"]["buffer_sizes"]["128K"], 2 * CONNS, "{st}");
    assert_eq!(st["tx"]["buffer_sizes"]["32K"], 2 * CONNS, "{st}");
    close_all(conns);
    let mut want = vec![2_000; CONNS as usize];
    want[0] = 100_000;
    assert_eq!(server.join().unwrap(), want);
}

/// SMC-R handshakes that end in TCP are counted where smc-tools reads fallbacks (the kernel's
/// table is not per technology): a client whose user EID the server does not share gets a
/// Decline (server NOUEID, client PEERDECL), and a peer that sends no Proposal at all is
/// declined as what it sent; `smcctl stats` lists both sides' reasons.
#[test]
fn smcr_fallbacks_are_counted_in_the_statistics() {
    let test = "smcr_fallbacks_are_counted_in_the_statistics";
    let Some(hosts) = Hosts::new(test) else {
        return;
    };
    let smcd = smc_tests::Smcd::start(smc_tests::bins!());
    let cfg = |host: u8, ueid: &str| SmcrConfig {
        smcd: Some(smcd.socket.clone()),
        ..SmcrConfig::new(hosts.addr(host), ueid, Capability::Assume)
    };
    let srv = endpoint_with(&hosts, 1, cfg(1, UEID));
    let cli = endpoint_with(&hosts, 2, cfg(2, "SMCR-NETNS-OTHER"));
    let at = SocketAddr::from((hosts.addr(1), 7012));
    let l = hosts.listen(&srv, at);
    let server = hosts.on(1, move || {
        (0..2)
            .map(|_| {
                let (mut s, _) = l.accept().expect("accept");
                let mode = s.mode();
                // Over TCP all the same: what comes goes back.
                let mut b = [0u8; 5];
                s.read_exact(&mut b).expect("read");
                s.write_all(&b).expect("write");
                mode
            })
            .collect::<Vec<_>>()
    });
    let c = cli.clone();
    let client = hosts
        .on(2, move || {
            let mut s = c.connect(at).expect("connect");
            s.write_all(b"hello").unwrap();
            let mut b = [0u8; 5];
            s.read_exact(&mut b).unwrap();
            assert_eq!(&b, b"hello");
            s.mode()
        })
        .join()
        .unwrap();
    assert!(
        matches!(&client, SmcrMode::Tcp(f) if f.local == ReasonCode::PEERDECL && f.peer == ReasonCode::NOUEID),
        "{client:?}"
    );
    // No Proposal: a plain client's first bytes are no CLC message.
    let plain = hosts
        .on(2, move || {
            let mut t = TcpStream::connect(at).expect("connect");
            t.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let sent = b"hello, not a proposal of any kind";
            t.write_all(sent).unwrap();
            let mut decline = [0u8; 8];
            t.read_exact(&mut decline).unwrap();
            // The rest of the Decline, then the server's echo of five bytes it read (those
            // after the eight it took for a CLC header): a close with them unread would reset
            // the connection under the server's write.
            let len = usize::from(u16::from_be_bytes([decline[5], decline[6]]));
            let mut rest = vec![0u8; len.saturating_sub(8) + 5];
            t.read_exact(&mut rest).unwrap();
            let echo = &rest[rest.len() - 5..];
            assert!(
                sent.windows(5).any(|w| w == echo),
                "the echo after the Decline: {echo:?}"
            );
            decline
        })
        .join()
        .unwrap();
    assert_eq!(&plain[..4], &[0xe2, 0xd4, 0xc3, 0xd9], "not a CLC message");
    assert_eq!(plain[4], 0x04, "not a Decline");
    let modes = server.join().unwrap();
    assert!(
        matches!(&modes[0], SmcrMode::Tcp(f) if f.local == ReasonCode::NOUEID),
        "{modes:?}"
    );
    let SmcrMode::Tcp(second) = &modes[1] else {
        panic!("{modes:?}");
    };
    let st = smcd.ctl("--json stats --smcr").json();
    let fb = &st["fallback"];
    assert_eq!(
        (&fb["client"], &fb["server"]),
        (&1.into(), &2.into()),
        "{st}"
    );
    let codes = |side: &str| -> Vec<u64> {
        fb[side]
            .as_array()
            .map(|a| a.iter().filter_map(|r| r["code"].as_u64()).collect())
            .unwrap_or_default()
    };
    assert_eq!(
        codes("client_reasons"),
        vec![u64::from(ReasonCode::PEERDECL.0)],
        "{st}"
    );
    let mut srv_codes = codes("server_reasons");
    srv_codes.sort_unstable();
    let mut want = vec![u64::from(ReasonCode::NOUEID.0), u64::from(second.local.0)];
    want.sort_unstable();
    assert_eq!(srv_codes, want, "{st}");
    assert_eq!(st["connections"]["smc"]["total"], 0, "{st}");
    for ep in [&srv, &cli] {
        assert!(ep.link_groups().is_empty());
    }
}

/// With inline sends off (`SmcrConfig::inline`, the inline ablation's baseline) CDCs go
/// from each connection's registered CDC slots and small writes from the send buffer: the
/// streams are the same, byte-exact, both ways, over enough CDCs to go round the slots.
#[test]
fn smcr_streams_without_inline_sends() {
    let test = "smcr_streams_without_inline_sends";
    let Some(hosts) = Hosts::new(test) else {
        return;
    };
    let cfg = |host: u8| SmcrConfig {
        inline: false,
        ..SmcrConfig::new(hosts.addr(host), UEID, Capability::Assume)
    };
    let srv = endpoint_with(&hosts, 1, cfg(1));
    let cli = endpoint_with(&hosts, 2, cfg(2));
    let at = SocketAddr::from((hosts.addr(1), 7011));
    let l = hosts.listen(&srv, at);
    let server = hosts.on(1, move || {
        let (s, _) = l.accept().expect("accept");
        echo(s)
    });
    let c = cli.clone();
    hosts
        .on(2, move || {
            let mut s = c.connect(at).expect("connect");
            s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
            smcr_lgr(&s.mode());
            // Small pieces (inline-sized writes) and a large one (no larger than what the
            // four buffers on the way hold: the echo writes back before this side reads):
            // more CDCs than the connection has slots (48, one per send-queue entry).
            for (k, len) in [(1u64, 1u64), (2, 40), (3, 64), (4, 65), (5, 200_000)] {
                for r in 0..if len < 100 { 60 } else { 1 } {
                    round_trip(&mut s, k * 1000 + r, len);
                }
            }
            s.shutdown(Shutdown::Write).unwrap();
            let mut rest = Vec::new();
            s.read_to_end(&mut rest).unwrap();
            assert!(rest.is_empty());
        })
        .join()
        .unwrap();
    assert_eq!(server.join().unwrap(), 60 * (1 + 40 + 64 + 65) + 200_000);
}

/// Routing for an asymmetric group over [`Hosts::two_paths`]: host `two` has an endpoint
/// with two ports (its path-1 and path-2 addresses), the other host one with one port (its
/// path-1 address only). The first link joins the two path-1 addresses and goes over
/// path 1 both ways. The second one joins `two`'s path-2 address to the other's path-1
/// address: by the main table `two` would send it over path 1 (the route to that subnet),
/// so a rule sends what leaves from its path-2 address over path 2 (on-link: the other host
/// answers ARP for any of its addresses), and the other host's answers to the path-2
/// address go over path 2 by its connected route. So each link has a path of its own, both
/// ways, and cutting path 2 takes only the second link (without this rule, the test below
/// that cuts path 2 fails: the second link's requests then come over path 1).
fn route_second_port_over_path2(hosts: &Hosts, two: u8) {
    let ns = &hosts.ns(two).name;
    let from = hosts.addr2(two).to_string();
    let rules = Command::new("ip")
        .args(["-n", ns, "rule", "show", "from", &from])
        .output()
        .expect("ip rule show");
    if !String::from_utf8_lossy(&rules.stdout).contains("lookup 100") {
        ip(&["-n", ns, "rule", "add", "from", &from, "lookup", "100"]);
    }
    let to = format!("{}/32", hosts.addr(3 - two));
    ip(&[
        "-n",
        ns,
        "route",
        "replace",
        &to,
        "dev",
        &hosts.veth(two, 2),
        "table",
        "100",
    ]);
}

/// Endpoints for an asymmetric group: host `two` with two ports, the other with one; each
/// side's `smcr_testlink_time` as given (host 1, host 2).
fn asymmetric_pair(
    hosts: &Hosts,
    two: u8,
    testlink: (Duration, Duration),
    smcd: Option<&smc_tests::Smcd>,
) -> (SmcrEndpoint, SmcrEndpoint) {
    route_second_port_over_path2(hosts, two);
    let cfg = |host: u8, testlink_time| SmcrConfig {
        alt: (host == two).then(|| (hosts.addr2(host), None)),
        testlink_time,
        smcd: smcd.map(|d| d.socket.clone()),
        ..SmcrConfig::new(hosts.addr(host), UEID, Capability::Assume)
    };
    (
        endpoint_with(hosts, 1, cfg(1, testlink.0)),
        endpoint_with(hosts, 2, cfg(2, testlink.1)),
    )
}

/// `conns` connections to the echo server at `at`, each with `rounds` round trips of
/// 100,000 pattern bytes (four at once: every connection on a thread of its own).
fn stream_round_trips(
    hosts: &Hosts,
    cli: &SmcrEndpoint,
    at: SocketAddr,
    conns: u64,
    rounds: u64,
) -> Vec<SmcrStream> {
    let threads: Vec<_> = (0..conns)
        .map(|k| {
            let c = cli.clone();
            hosts.on(2, move || {
                let mut s = c.connect(at).expect("connect");
                s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                smcr_lgr(&s.mode());
                for r in 0..rounds {
                    round_trip(&mut s, 1000 * k + r, 100_000);
                }
                s
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// Checks an asymmetric group as both ends report it: the server's type `srv_type`, the
/// client's the other asymmetric one, two active links on each side, the asymmetric one
/// tagged and carrying no connection, the other carrying all `conns`; the links' GIDs as the
/// ports say (`two`: the host with two ports). Returns the asymmetric links' QPNs (server,
/// client).
fn check_asymmetric(
    hosts: &Hosts,
    srv: &SmcrEndpoint,
    cli: &SmcrEndpoint,
    two: u8,
    conns: u32,
) -> (u32, u32) {
    let mut asym_qpns = Vec::new();
    for (host, ep) in [(1u8, srv), (2, cli)] {
        let groups = ep.link_groups();
        assert_eq!(groups.len(), 1, "{groups:#?}");
        let g = &groups[0];
        let want = if host == two {
            LgrType::AsymmetricPeer
        } else {
            LgrType::AsymmetricLocal
        };
        assert_eq!(g.lgr_type, want, "host {host}: {g:#?}");
        assert_eq!((g.max_links, g.conns), (2, conns), "{g:#?}");
        assert_eq!(active_links(g), 2, "{g:#?}");
        let (asym, other): (Vec<_>, Vec<_>) = g.links.iter().partition(|l| l.asym);
        assert_eq!(
            (asym.len(), other.len()),
            (1, 1),
            "one asymmetric link: {g:#?}"
        );
        let (asym, other) = (asym[0], other[0]);
        assert_eq!(asym.conns, 0, "a connection on the asymmetric link: {g:#?}");
        assert_eq!(other.conns, conns, "{g:#?}");
        let gid = |a: Ipv4Addr| smc_rdma::verbs::Gid::from_ipv4(a);
        let peer = 3 - host;
        // The first link joins the path-1 addresses; the asymmetric one starts (or ends) on
        // the two-port host's path-2 address and ends (or starts) on the other's only one.
        assert_eq!(
            (other.gid, other.peer_gid),
            (gid(hosts.addr(host)), gid(hosts.addr(peer)))
        );
        let (own, theirs) = if host == two {
            (hosts.addr2(host), hosts.addr(peer))
        } else {
            (hosts.addr(host), hosts.addr2(peer))
        };
        assert_eq!((asym.gid, asym.peer_gid), (gid(own), gid(theirs)), "{g:#?}");
        asym_qpns.push(asym.qpn);
    }
    (asym_qpns[0], asym_qpns[1])
}

/// smc-tools' notation of the RoCEv2 GID of `a`.
fn gid_text(a: Ipv4Addr) -> String {
    let o = a.octets();
    format!(
        "0000:0000:0000:0000:0000:ffff:{:02x}{:02x}:{:02x}{:02x}",
        o[0], o[1], o[2], o[3]
    )
}

/// The server has two ports, the client one (one soft device): `max_links` 2 is negotiated
/// all the same, the server's ADD_LINK offers its second port, the client makes its end on
/// its one device (a second QP there) and the group is ASYMMETRIC_PEER on the server,
/// ASYMMETRIC_LOCAL on the client. Four connections stream round trips byte-exact at once,
/// all on the first link: none goes on the asymmetric one. `smcctl linkgroup show --smcr`
/// shows the types (ASYMP, ASYML) and `linkgroup links` both links of each side, the
/// client's two on its one GID.
#[test]
fn smcr_asymmetric_group_when_the_client_has_one_port() {
    let test = "smcr_asymmetric_group_when_the_client_has_one_port";
    let Some(hosts) = Hosts::two_paths(test) else {
        return;
    };
    let smcd = smc_tests::Smcd::start(smc_tests::bins!());
    let t = smc_core::llc::SMC_LLC_TESTLINK_DEFAULT_TIME;
    let (srv, cli) = asymmetric_pair(&hosts, 1, (t, t), Some(&smcd));
    let at = SocketAddr::from((hosts.addr(1), 7012));
    let l = hosts.listen(&srv, at);
    const CONNS: u64 = 4;
    let server = echo_server(&hosts, l, CONNS as usize);
    let conns = stream_round_trips(&hosts, &cli, at, CONNS, 8);
    check_asymmetric(&hosts, &srv, &cli, 1, CONNS as u32);
    // smcd files both endpoints under this process's namespace (see the smcctl test).
    let lg = smcd.ctl("--json linkgroup show --smcr").json();
    let groups = lg["linkgroups"].as_array().expect("linkgroups");
    assert_eq!(groups.len(), 2, "{lg}");
    let links = smcd.ctl("--json linkgroup links").json();
    let ls = links["links"].as_array().expect("links");
    assert_eq!(ls.len(), 4, "{links}");
    for (role, ty) in [("SERV", "ASYMP"), ("CLNT", "ASYML")] {
        let g = groups
            .iter()
            .find(|g| g["role"] == role)
            .unwrap_or_else(|| panic!("no {role} group: {lg}"));
        assert_eq!(g["lgr_type"], ty, "{lg}");
        assert_eq!(g["conns"], CONNS, "{lg}");
        let mine: Vec<_> = ls.iter().filter(|l| l["role"] == role).collect();
        assert_eq!(mine.len(), 2, "{links}");
        assert!(mine.iter().all(|l| l["state"] == "LINK_ACTIVE"), "{links}");
        let mut conns: Vec<_> = mine.iter().map(|l| l["conns"].as_u64()).collect();
        conns.sort_unstable();
        assert_eq!(conns, vec![Some(0), Some(CONNS)], "{links}");
        // The client's one device is both links' local end, the server's peer end.
        let client_gid = gid_text(hosts.addr(2));
        let side = if role == "CLNT" { "gid" } else { "peer_gid" };
        assert!(mine.iter().all(|l| l[side] == client_gid), "{links}");
    }
    // `device show --smcr`: the client's one port carries both of its links, each of the
    // server's ports one.
    let dev = smcd.ctl("--json device show --smcr").json();
    let ports = dev["ports"].as_array().expect("ports");
    let mut counts: Vec<_> = ports
        .iter()
        .map(|p| {
            (
                p["ib_dev"].as_str().unwrap_or_default().to_string(),
                p["link_count"].as_u64(),
            )
        })
        .collect();
    counts.sort();
    let mut want = vec![
        (format!("sroce-{}", hosts.addr(1)), Some(1)),
        (format!("sroce-{}", hosts.addr2(1)), Some(1)),
        (format!("sroce-{}", hosts.addr(2)), Some(2)),
    ];
    want.sort();
    assert_eq!(counts, want, "{dev}");
    close_all(conns);
    assert_eq!(server.join().unwrap(), vec![8 * 100_000; CONNS as usize]);
}

/// The mirror: the server has one port, the client two. The server's ADD_LINK names its one
/// device again, the client answers from its second port: ASYMMETRIC_LOCAL on the server,
/// ASYMMETRIC_PEER on the client, and the connections all on the first link.
#[test]
fn smcr_asymmetric_group_when_the_server_has_one_port() {
    let test = "smcr_asymmetric_group_when_the_server_has_one_port";
    let Some(hosts) = Hosts::two_paths(test) else {
        return;
    };
    let t = smc_core::llc::SMC_LLC_TESTLINK_DEFAULT_TIME;
    let (srv, cli) = asymmetric_pair(&hosts, 2, (t, t), None);
    let at = SocketAddr::from((hosts.addr(1), 7013));
    let l = hosts.listen(&srv, at);
    const CONNS: u64 = 4;
    let server = echo_server(&hosts, l, CONNS as usize);
    let conns = stream_round_trips(&hosts, &cli, at, CONNS, 8);
    check_asymmetric(&hosts, &srv, &cli, 2, CONNS as u32);
    close_all(conns);
    assert_eq!(server.join().unwrap(), vec![8 * 100_000; CONNS as usize]);
    for ep in [&srv, &cli] {
        let st = ep.stats();
        assert_eq!(st.first_contacts.load(Ordering::Relaxed), 1);
        assert_eq!(st.fallbacks.load(Ordering::Relaxed), 0);
    }
}

/// Cuts (or restores) path 2, the asymmetric link's (see [`route_second_port_over_path2`]):
/// nftables at the one-port host `one` drops the RoCEv2 requests that arrive on its path-2
/// veth, and lets the ACKs through. (By interface, not address: a link whose packets came
/// over path 1 would not notice.)
///
/// Why not the veth: the side with one port has both links on its one device, and a link
/// failing there ends the whole group, as in the kernel (`smcr_link_down` calls
/// `smc_switch_conns` as for a device error, which skips links on the same device port).
/// A cut that lost the ACK of a message that side had just sent on the asymmetric link (its
/// echo of the peer's TEST_LINK) would fail its QP and race with the other side's
/// DELETE_LINK. This cut leaves that side nothing outstanding: it gets no request to answer
/// and every ACK of what it sent before. The other side's TEST_LINK goes unanswered, its QP
/// fails, and it deletes the link.
fn cut_asymmetric_path(hosts: &Hosts, one: u8, cut: bool) {
    let cmds = if cut {
        vec![
            "add table inet smcrasym".to_string(),
            "add chain inet smcrasym input { type filter hook input priority 0; }".to_string(),
            // Byte 0 of the UDP payload is the BTH opcode; 0x11 is ACKNOWLEDGE.
            format!(
                "add rule inet smcrasym input iifname {} udp dport 4791 \
                 @th,64,8 != 0x11 counter drop",
                hosts.veth(one, 2)
            ),
        ]
    } else {
        vec!["delete table inet smcrasym".to_string()]
    };
    for cmd in cmds {
        let ok = Command::new("ip")
            .args(["netns", "exec", &hosts.ns(one).name, "nft", &cmd])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "nft {cmd}");
    }
}

/// An asymmetric group (`two`: the host with two ports) loses the asymmetric link's path
/// ([`cut_asymmetric_path`]) while its connections stream round trips over the first link:
/// the side with two ports notices (its TEST_LINK fails), deletes the link (DELETE_LINK,
/// LOST_PATH), both sides report a SINGLE group with one active link carrying every
/// connection, and round trips go on byte-exact. Once the path is back the server adds the
/// asymmetric link again (a new QP on each side) and the connections stay where they are.
///
/// The side with one port keeps `smcr_testlink_time` at its default (30 s): it learns of the
/// loss from the other side's DELETE_LINK (a few seconds), not by a TEST_LINK of its own,
/// which would fail its link and so end the group (see [`cut_asymmetric_path`]).
fn asymmetric_link_lost_and_added_again(test: &str, two: u8, port: u16) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64};
    if !nft_available(test) {
        return;
    }
    let Some(hosts) = Hosts::two_paths(test) else {
        return;
    };
    let (short, long) = (
        Duration::from_secs(2),
        smc_core::llc::SMC_LLC_TESTLINK_DEFAULT_TIME,
    );
    let testlink = if two == 1 {
        (short, long)
    } else {
        (long, short)
    };
    let (srv, cli) = asymmetric_pair(&hosts, two, testlink, None);
    let at = SocketAddr::from((hosts.addr(1), port));
    let l = hosts.listen(&srv, at);
    const CONNS: u64 = 2;
    let server = echo_server(&hosts, l, CONNS as usize);
    let conns = stream_round_trips(&hosts, &cli, at, CONNS, 2);
    let before = check_asymmetric(&hosts, &srv, &cli, two, CONNS as u32);
    // Round trips on every connection until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    let streams: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(k, mut s)| {
            let (stop, rounds) = (Arc::clone(&stop), Arc::clone(&rounds));
            hosts.on(2, move || {
                let mut r = 0;
                while !stop.load(Ordering::Relaxed) {
                    round_trip(&mut s, 500_000 + 1000 * k as u64 + r, 100_000);
                    r += 1;
                    rounds.fetch_add(1, Ordering::Relaxed);
                }
                s
            })
        })
        .collect();
    let one = 3 - two;
    cut_asymmetric_path(&hosts, one, true);
    wait_groups(
        [&srv, &cli],
        Duration::from_secs(60),
        "the asymmetric link deleted",
        |g| {
            g.up && g.lgr_type == LgrType::Single
                && active_links(g) == 1
                && g.links
                    .iter()
                    .any(|l| l.active && !l.asym && l.conns == CONNS as u32)
        },
    );
    // The connections go on over the first link while the path stays down, longer than
    // the server's attempts to add the link again take to fail (CONFIRM_LINK on the new
    // link unanswered: 5 s, then DELETE_LINK) and to come again (every 5 s).
    let seen = rounds.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_secs(12));
    assert!(
        smc_tests::eventually(Duration::from_secs(60), || {
            rounds.load(Ordering::Relaxed) >= seen + 2 * CONNS
        }),
        "the round trips stopped with the asymmetric link"
    );
    for ep in [&srv, &cli] {
        let g = &ep.link_groups()[0];
        assert!(g.up && active_links(g) >= 1, "{g:#?}");
    }
    cut_asymmetric_path(&hosts, one, false);
    wait_groups(
        [&srv, &cli],
        Duration::from_secs(90),
        "the asymmetric link again",
        |g| g.lgr_type.is_asymmetric() && active_links(g) == 2,
    );
    stop.store(true, Ordering::Relaxed);
    let conns: Vec<_> = streams.into_iter().map(|t| t.join().unwrap()).collect();
    let after = check_asymmetric(&hosts, &srv, &cli, two, CONNS as u32);
    assert!(
        after.0 != before.0 && after.1 != before.1,
        "the asymmetric link is not a new one: QPNs {before:?} then {after:?}"
    );
    close_all(conns);
    let echoed = server.join().unwrap();
    assert!(echoed.iter().all(|&n| n >= 2 * 100_000), "{echoed:?}");
    for ep in [&srv, &cli] {
        let st = ep.stats();
        assert_eq!(st.first_contacts.load(Ordering::Relaxed), 1);
        assert_eq!(st.fallbacks.load(Ordering::Relaxed), 0);
    }
}

/// [`asymmetric_link_lost_and_added_again`] with two ports on the server: it notices.
#[test]
fn smcr_asymmetric_link_lost_and_added_again_when_the_client_has_one_port() {
    asymmetric_link_lost_and_added_again(
        "smcr_asymmetric_link_lost_and_added_again_when_the_client_has_one_port",
        1,
        7014,
    );
}

/// [`asymmetric_link_lost_and_added_again`] with two ports on the client: it notices and
/// asks the server to delete the link; the server (one port) adds it again because the
/// client's first Confirm listed two GIDs.
#[test]
fn smcr_asymmetric_link_lost_and_added_again_when_the_server_has_one_port() {
    asymmetric_link_lost_and_added_again(
        "smcr_asymmetric_link_lost_and_added_again_when_the_server_has_one_port",
        2,
        7015,
    );
}

// ---------------------------------------------------------------------------- SMC-R v1

/// An endpoint on host `host`'s address `addr` that speaks SMC-R v1 (over a RoCE v1 device on
/// the veth), and v2 too when `v2`.
fn v1_endpoint(hosts: &Hosts, host: u8, addr: Ipv4Addr, v2: bool) -> SmcrEndpoint {
    endpoint_with(
        hosts,
        host,
        SmcrConfig {
            roce_v1: true,
            roce_v2: v2,
            ..SmcrConfig::new(addr, UEID, Capability::Assume)
        },
    )
}

/// SMC-R v1 over two RoCE v1 ports on each side (a RoCE v1 device on each veth): the group
/// gets its second link (ADD_LINK, the rkeys by ADD_LINK_CONT), connections are placed on
/// both, and when the first path goes every connection moves to the second link and still
/// echoes byte-exact. Both sides' devices number their QPs alike, so a CLC message names a
/// link by its QPN and its port's GID (`smcr_lgr_match`); by QPN alone the reuse connections
/// on the second link were taken for the first's and fell back (`ERR_RTOK`).
#[test]
fn smcr_v1_second_port_carries_a_second_link() {
    let test = "smcr_v1_second_port_carries_a_second_link";
    let Some(hosts) = Hosts::two_paths(test) else {
        return;
    };
    const N: usize = 4;
    let cfg = |host: u8| SmcrConfig {
        roce_v1: true,
        roce_v2: false,
        alt: Some((hosts.addr2(host), None)),
        testlink_time: Duration::from_secs(2),
        ..SmcrConfig::new(hosts.addr(host), UEID, Capability::Assume)
    };
    let srv = endpoint_with(&hosts, 1, cfg(1));
    let cli = endpoint_with(&hosts, 2, cfg(2));
    let at = SocketAddr::from((hosts.addr(1), 7102));
    let server = echo_server(&hosts, hosts.listen(&srv, at), N);
    let conns = connect_echoing(&hosts, &cli, at, N, 400, 10_000);
    wait_groups(
        [&srv, &cli],
        Duration::from_secs(40),
        "the second v1 link",
        |g| g.version == 1 && active_links(g) == 2,
    );
    hosts.set_path(1, false);
    let conns = hosts
        .on(2, move || {
            let mut conns = conns;
            for (i, s) in conns.iter_mut().enumerate() {
                round_trip(s, 500 + i as u64, 30_000);
            }
            conns
        })
        .join()
        .unwrap();
    hosts.set_path(1, true);
    close_all(conns);
    assert_eq!(server.join().unwrap(), vec![40_000; N]);
}

/// The link group `m` runs in, as `ep` lists it.
fn group_of(ep: &SmcrEndpoint, m: &SmcrMode) -> smcd_engine::smcr::LinkGroupInfo {
    let id = smcr_lgr(m);
    ep.link_groups()
        .into_iter()
        .find(|g| g.lgr_id == id)
        .unwrap_or_else(|| panic!("no group {id:#x} in {:?}", ep.link_groups()))
}

/// The link-local EUI-64 GID of a RoCE v1 port (`fe80::...`), as tshark prints it.
fn v1_gid_text(g: smc_rdma::verbs::Gid) -> String {
    std::net::Ipv6Addr::from(g.0).to_string()
}

/// SMC-R v1 between two v1-only endpoints: first contact, then three connections that reuse
/// the group (one alone, two at once), 4 MiB both ways each, byte exact. The group is a v1
/// group on both sides, its link between the two RoCE v1 GIDs (link-local EUI-64 of the veths'
/// MACs), and the bytes crossed the veth as RoCE v1 frames.
#[test]
fn smcr_v1_first_contact_and_reuse_between_two_namespaces() {
    let test = "smcr_v1_first_contact_and_reuse_between_two_namespaces";
    let Some(hosts) = Hosts::new(test) else {
        return;
    };
    const TOTAL: u64 = 4 << 20;
    let srv = v1_endpoint(&hosts, 1, hosts.addr(1), false);
    let cli = v1_endpoint(&hosts, 2, hosts.addr(2), false);
    assert!(srv.device().is_roce_v1() && cli.device().is_roce_v1());
    assert_eq!(srv.v1_gid(), Some(srv.gid()));
    assert!(srv.gid().to_mac().is_some(), "a link-local EUI-64 GID");
    let at = SocketAddr::from((hosts.addr(1), 7101));
    let l = hosts.listen(&srv, at);
    let server = hosts.on(1, move || {
        let mut peers = Vec::new();
        for _ in 0..4 {
            let (mut s, _) = l.accept().expect("accept");
            peers.push(std::thread::spawn(move || {
                s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                let mode = s.mode();
                let mut seed = [0u8; 8];
                s.read_exact(&mut seed).unwrap();
                let seed = u64::from_le_bytes(seed);
                let got = recv(&mut s, seed);
                send(&mut s, seed + 1, got);
                (mode, got)
            }));
        }
        peers
            .into_iter()
            .map(|p| p.join().unwrap())
            .collect::<Vec<_>>()
    });
    let one = |cli: SmcrEndpoint, seed: u64| {
        hosts.on(2, move || {
            let mut s = cli.connect(at).expect("connect");
            s.write_all(&seed.to_le_bytes()).unwrap();
            exchange(s, seed, seed + 1, TOTAL)
        })
    };
    let m1 = one(cli.clone(), 10).join().unwrap();
    let m2 = one(cli.clone(), 20).join().unwrap();
    let (t3, t4) = (one(cli.clone(), 30), one(cli.clone(), 40));
    let (m3, m4) = (t3.join().unwrap(), t4.join().unwrap());
    for m in [&m2, &m3, &m4] {
        assert_eq!(
            smcr_lgr(m),
            smcr_lgr(&m1),
            "a later connection made a group"
        );
    }
    for (m, got) in server.join().unwrap() {
        smcr_lgr(&m);
        assert_eq!(got, TOTAL);
    }
    for ep in [&srv, &cli] {
        let st = ep.stats();
        assert_eq!(st.first_contacts.load(Ordering::Relaxed), 1);
        assert_eq!(st.reused.load(Ordering::Relaxed), 3);
        assert_eq!(st.fallbacks.load(Ordering::Relaxed), 0);
        let groups = ep.link_groups();
        assert_eq!(groups.len(), 1, "{groups:?}");
        assert!(groups[0].up);
        assert_eq!(groups[0].version, 1, "{groups:?}");
        assert_eq!((groups[0].max_conns, groups[0].max_links), (255, 2));
    }
    let (sg, cg) = (&srv.link_groups()[0], group_of(&cli, &m1));
    assert_eq!(sg.peer_gid, cli.gid());
    assert_eq!(cg.peer_gid, srv.gid());
    assert_eq!(
        (sg.links[0].gid, sg.links[0].peer_gid),
        (srv.gid(), cli.gid())
    );
    assert_eq!(
        (sg.links[0].qpn, sg.links[0].peer_qpn),
        (cg.links[0].peer_qpn, cg.links[0].qpn)
    );
    let rx = srv.device().stats().rx_packets.load(Ordering::Relaxed);
    assert!(rx > 4 * TOTAL / 4096, "only {rx} RoCE v1 frames arrived");
    assert_eq!(srv.device().stats().rx_dropped.load(Ordering::Relaxed), 0);
}

/// One connection from `cli` to `at` (served by `l` on host 1): 1 MiB both ways byte exact;
/// the modes of both ends.
fn v1_round(
    hosts: &Hosts,
    l: SmcrListener,
    cli: &SmcrEndpoint,
    at: SocketAddr,
    seed: u64,
) -> (SmcrMode, SmcrMode, SmcrListener) {
    let server = hosts.on(1, move || {
        let (mut s, _) = l.accept().expect("accept");
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mode = s.mode();
        let got = recv(&mut s, seed);
        send(&mut s, seed + 1, got);
        (mode, got, l)
    });
    let c = cli.clone();
    let cm = hosts
        .on(2, move || {
            exchange(c.connect(at).expect("connect"), seed, seed + 1, 1 << 20)
        })
        .join()
        .unwrap();
    let (sm, got, l) = server.join().unwrap();
    assert_eq!(got, 1 << 20);
    (sm, cm, l)
}

/// A v1-only endpoint and one that speaks both: the client that offers only v1 gets v1 from
/// a server that has both; a client that offers both gets v2 from that server (v2 first, as
/// `smc_listen_find_device`) and v1 from a v1-only server. Each connection is byte exact and
/// each group is of the version chosen, on both sides.
#[test]
fn smcr_v1_only_endpoints_meet_v1_and_v2_endpoints() {
    let test = "smcr_v1_only_endpoints_meet_v1_and_v2_endpoints";
    let Some(hosts) = Hosts::new(test) else {
        return;
    };
    let both_srv = v1_endpoint(&hosts, 1, hosts.addr(1), true);
    let v1_srv = v1_endpoint(&hosts, 1, hosts.addr(11), false);
    let v1_cli = v1_endpoint(&hosts, 2, hosts.addr(2), false);
    let both_cli = v1_endpoint(&hosts, 2, hosts.addr(12), true);
    assert!(
        !both_srv.device().is_roce_v1(),
        "the first device is the RoCEv2 one"
    );
    assert!(both_srv.v1_gid().is_some_and(|g| g.to_mac().is_some()));
    let at_both = SocketAddr::from((hosts.addr(1), 7102));
    let at_v1 = SocketAddr::from((hosts.addr(11), 7103));
    let l_both = hosts.listen(&both_srv, at_both);
    let l_v1 = hosts.listen(&v1_srv, at_v1);
    let version = |ep: &SmcrEndpoint, m: &SmcrMode| group_of(ep, m).version;

    // v1 only → v1 and v2: v1.
    let (sm, cm, l_both) = v1_round(&hosts, l_both, &v1_cli, at_both, 1);
    assert_eq!((version(&both_srv, &sm), version(&v1_cli, &cm)), (1, 1));
    assert_eq!(group_of(&both_srv, &sm).peer_gid, v1_cli.gid());
    // v1 and v2 → v1 and v2: v2.
    let (sm, cm, _l) = v1_round(&hosts, l_both, &both_cli, at_both, 3);
    assert_eq!((version(&both_srv, &sm), version(&both_cli, &cm)), (2, 2));
    assert_eq!(group_of(&both_srv, &sm).peer_gid, both_cli.gid());
    // v1 and v2 → v1 only: v1.
    let (sm, cm, _l) = v1_round(&hosts, l_v1, &both_cli, at_v1, 5);
    assert_eq!((version(&v1_srv, &sm), version(&both_cli, &cm)), (1, 1));
    assert_eq!(Some(group_of(&v1_srv, &sm).peer_gid), both_cli.v1_gid());
    // The server with both has one group of each version now; nobody fell back.
    let mut versions: Vec<u8> = both_srv.link_groups().iter().map(|g| g.version).collect();
    versions.sort_unstable();
    assert_eq!(versions, [1, 2]);
    for ep in [&both_srv, &v1_srv, &v1_cli, &both_cli] {
        assert_eq!(ep.stats().fallbacks.load(Ordering::Relaxed), 0);
    }
}

/// What the SMC-R v1 capture prints of each packet.
const V1_FIELDS: [&str; 25] = [
    "eth.type",
    "udp.dstport",
    "tcp.dstport",
    "smc.clc_msg",
    "smc.proposal.smc.version",
    "smc.proposal.smc.type",
    "smc.proposal.smcv2.type",
    "smc.proposal.client.preferred.gid",
    "smc.proposal.client.preferred.mac",
    "smc.outgoing.interface.subnet.mask",
    "smc.outgoing.interface.subnet.mask.number.of.significant.bits",
    "smc.accept.smc.version.relnum",
    "smc.accept.server.preferred.gid",
    "smc.accept.server.qp.number",
    "smc.accept.flags",
    "smc.confirm.smc.version.relnum",
    "smc.client.gid",
    "smc.confirm.client.qp.number",
    "smc.confirm.first.contact",
    "smc.llc_msg",
    "smc.confirm.link.response",
    "smc.confirm.link.sender.qp.number",
    "infiniband.grh.sgid",
    "infiniband.bth.destqp",
    "_ws.malformed",
];

fn v1_col<'a>(r: &'a [String], name: &str) -> &'a str {
    &r[V1_FIELDS.iter().position(|f| *f == name).unwrap()]
}

/// tshark, capturing on the veth, decodes an SMC-R v1 first contact and a connection that
/// reuses its group between two v1-only endpoints: the Proposal offers SMC-R v1 only (typev1
/// R, typev2 N) with the client's RoCE v1 GID and MAC and its subnet, Accept and Confirm are
/// SMC-R v1 messages naming the two v1 GIDs and QPs with the first-contact bit on the first
/// only, and the LLC CONFIRM_LINK request and response travel as RoCE v1 frames (Ethertype
/// 0x8915, GRH source GIDs the two v1 GIDs); nothing is malformed and no RoCEv2 datagram is
/// sent.
#[test]
fn tshark_decodes_smcr_v1_clc_and_confirm_link_over_roce_v1() {
    let test = "tshark_decodes_smcr_v1_clc_and_confirm_link_over_roce_v1";
    if smc_tests::skip_unless_tool(test, "tshark") {
        return;
    }
    let Some(hosts) = Hosts::new(test) else {
        return;
    };
    let srv = v1_endpoint(&hosts, 1, hosts.addr(1), false);
    let cli = v1_endpoint(&hosts, 2, hosts.addr(2), false);
    let at = SocketAddr::from((hosts.addr(1), 7104));
    let mut l = hosts.listen(&srv, at);
    let cap = Capture::start_with(&hosts, 7104, " or ether proto 0x8915", &V1_FIELDS);
    let mut modes = Vec::new();
    for seed in [7, 9] {
        let (sm, cm, back) = v1_round(&hosts, l, &cli, at, seed);
        l = back;
        modes.push((sm, cm));
    }
    let rows = cap.finish();
    let text: String = rows.iter().map(|r| r.join("|") + "\n").collect();
    let col = v1_col;
    assert!(
        rows.iter().all(|r| col(r, "_ws.malformed").is_empty()),
        "malformed packets:\n{text}"
    );
    assert!(
        rows.iter().all(|r| num(col(r, "udp.dstport")) != 4791),
        "RoCEv2 datagrams between v1-only endpoints:\n{text}"
    );
    let (sg, cg) = (&srv.link_groups()[0], &cli.link_groups()[0]);
    assert_eq!((sg.version, cg.version), (1, 1));
    for (sm, cm) in &modes {
        assert_eq!((smcr_lgr(sm), smcr_lgr(cm)), (sg.lgr_id, cg.lgr_id));
    }
    let (sgid, cgid) = (v1_gid_text(srv.gid()), v1_gid_text(cli.gid()));
    let mac = smc_rdma::verbs::Device::info(cli.device()).ports[0].mac;
    let mac = mac.map(|b| format!("{b:02x}")).join(":");
    let clc = |t: u64| -> Vec<&Vec<String>> {
        rows.iter()
            .filter(|r| !col(r, "tcp.dstport").is_empty() && num(col(r, "smc.clc_msg")) == t)
            .collect()
    };
    let (props, accs, confs) = (clc(1), clc(2), clc(3));
    assert_eq!(
        (props.len(), accs.len(), confs.len()),
        (2, 2, 2),
        "CLC:\n{text}"
    );
    // Proposal: a Linux-style version 2 header offering SMC-R v1 only (typev1 R = 0, typev2
    // N = 2), the client's v1 GID and MAC, its subnet.
    let subnet = Ipv4Addr::new(10, hosts.net, 0, 0).to_string();
    for p in &props {
        assert_eq!(num(col(p, "smc.proposal.smc.version")), 2, "{text}");
        assert_eq!(num(col(p, "smc.proposal.smc.type")), 0, "{text}");
        assert_eq!(num(col(p, "smc.proposal.smcv2.type")), 2, "{text}");
        assert_eq!(col(p, "smc.proposal.client.preferred.gid"), cgid, "{text}");
        assert_eq!(col(p, "smc.proposal.client.preferred.mac"), mac, "{text}");
        assert_eq!(
            col(p, "smc.outgoing.interface.subnet.mask"),
            subnet,
            "{text}"
        );
        assert_eq!(
            num(col(
                p,
                "smc.outgoing.interface.subnet.mask.number.of.significant.bits"
            )),
            24
        );
    }
    // Accept and Confirm: version 1 (Wireshark shows every CLC header's version in the
    // Proposal's field), the v1 GIDs and QPs, first contact on the first only.
    for (i, a) in accs.iter().enumerate() {
        assert_eq!(num(col(a, "smc.proposal.smc.version")), 1, "{text}");
        assert_eq!(col(a, "smc.accept.server.preferred.gid"), sgid, "{text}");
        assert_eq!(
            num(col(a, "smc.accept.server.qp.number")),
            u64::from(sg.links[0].qpn)
        );
        assert_eq!(
            num(col(a, "smc.accept.flags")) & 0x08 != 0,
            i == 0,
            "{text}"
        );
    }
    for (i, c) in confs.iter().enumerate() {
        assert_eq!(num(col(c, "smc.proposal.smc.version")), 1, "{text}");
        assert_eq!(col(c, "smc.client.gid"), cgid, "{text}");
        assert_eq!(
            num(col(c, "smc.confirm.client.qp.number")),
            u64::from(cg.links[0].qpn)
        );
        assert_eq!(num(col(c, "smc.confirm.first.contact")), u64::from(i == 0));
    }
    // LLC over RoCE v1: CONFIRM_LINK request from the server, response from the client.
    let llc = |t: u64, from: &str| -> Vec<&Vec<String>> {
        rows.iter()
            .filter(|r| num(col(r, "eth.type")) == 0x8915)
            .filter(|r| col(r, "infiniband.grh.sgid") == from)
            .filter(|r| num(col(r, "smc.llc_msg")) == t)
            .collect()
    };
    let (req, resp) = (llc(1, &sgid), llc(1, &cgid));
    assert_eq!((req.len(), resp.len()), (1, 1), "CONFIRM_LINK:\n{text}");
    assert_eq!(
        num(col(req[0], "smc.confirm.link.sender.qp.number")),
        u64::from(sg.links[0].qpn)
    );
    assert_eq!(
        num(col(req[0], "infiniband.bth.destqp")),
        u64::from(cg.links[0].qpn)
    );
    assert!(matches!(
        col(req[0], "smc.confirm.link.response"),
        "0" | "False"
    ));
    assert!(matches!(
        col(resp[0], "smc.confirm.link.response"),
        "1" | "True"
    ));
    assert_eq!(
        num(col(resp[0], "smc.confirm.link.sender.qp.number")),
        u64::from(cg.links[0].qpn)
    );
    // ADD_LINK (one port each side: asked and rejected, as over RoCEv2), CONFIRM_RKEY of the
    // second connection's RMBs both ways, CDCs: all as RoCE v1 frames.
    assert_eq!((llc(2, &sgid).len(), llc(2, &cgid).len()), (1, 1), "{text}");
    assert!(
        !llc(6, &sgid).is_empty() && !llc(6, &cgid).is_empty(),
        "{text}"
    );
    assert!(
        !llc(0xfe, &sgid).is_empty() && !llc(0xfe, &cgid).is_empty(),
        "{text}"
    );
}
