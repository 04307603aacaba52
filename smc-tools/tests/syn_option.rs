//! The SMC TCP option through the BPF `sock_ops` program (`smcd_engine::bpf`), on real
//! sockets over 127.0.0.1 with the real kernel: which segments carry `fe 06 e2 d4 c3 d9`
//! (a raw `AF_PACKET` capture on `lo`) and what each side reads back.
//!
//! Isolation: this test process moves itself into a cgroup of its own under the cgroup2
//! mount, and each test attaches its own program instance (with maps of its own) there, so
//! no other process on the host runs it; the tests of this binary share the cgroup, and one
//! test's program acts only on the sockets and listeners marked in its own maps. Needs root
//! and BPF: otherwise the tests skip, and under CI=true they fail.

use rustix::fd::{AsFd, AsRawFd, OwnedFd};
use smc_tests::{Smcd, bins, skip_unless};
use smcd_engine::bpf::{Maps, SockOption, loader};
use smcd_engine::ipc::session::SmcdSession;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const SMC_OPT: [u8; 6] = [0xfe, 0x06, 0xe2, 0xd4, 0xc3, 0xd9];

/// This process's own cgroup, or why there is none.
fn test_cgroup() -> &'static Result<PathBuf, String> {
    smc_tests::test_cgroup(loader::default_cgroup(), "bpf")
}

/// The program attached to this process's cgroup, or `None` after a skip.
fn attached(test: &str) -> Option<loader::Attached> {
    let cg = match test_cgroup() {
        Ok(cg) => cg,
        Err(why) => {
            skip_unless(test, false, why);
            return None;
        }
    };
    match loader::attach(cg) {
        Ok(a) => Some(a),
        Err(e) => {
            skip_unless(test, false, format_args!("cannot attach the program: {e}"));
            None
        }
    }
}

/// One TCP segment seen on `lo`.
#[derive(Debug, Clone)]
struct Seg {
    sport: u16,
    dport: u16,
    flags: u8,
    opts: Vec<u8>,
}

impl Seg {
    fn syn(&self) -> bool {
        self.flags & 0x12 == 0x02
    }
    fn syn_ack(&self) -> bool {
        self.flags & 0x12 == 0x12
    }
    fn fin(&self) -> bool {
        self.flags & 0x01 != 0
    }
    fn has_smc_opt(&self) -> bool {
        self.opts.windows(6).any(|w| w == SMC_OPT)
    }
}

/// A raw capture of every frame on `lo`, opened before the connection it watches.
struct Capture(OwnedFd);

impl Capture {
    fn open() -> Capture {
        const ETH_P_ALL: u16 = 0x0003;
        // SAFETY: plain socket/bind calls on a sockaddr_ll we own; the descriptor is wrapped
        // in an OwnedFd at once.
        let fd = unsafe {
            let fd = libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                i32::from(ETH_P_ALL.to_be()),
            );
            assert!(
                fd >= 0,
                "AF_PACKET socket: {}",
                std::io::Error::last_os_error()
            );
            let fd = <OwnedFd as rustix::fd::FromRawFd>::from_raw_fd(fd);
            let mut sll: libc::sockaddr_ll = std::mem::zeroed();
            sll.sll_family = libc::AF_PACKET as u16;
            sll.sll_protocol = ETH_P_ALL.to_be();
            sll.sll_ifindex = libc::if_nametoindex(c"lo".as_ptr()) as i32;
            let r = libc::bind(
                fd.as_raw_fd(),
                (&raw const sll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            );
            assert_eq!(r, 0, "bind to lo: {}", std::io::Error::last_os_error());
            fd
        };
        let _ = rustix::net::sockopt::set_socket_recv_buffer_size(&fd, 4 << 20);
        Capture(fd)
    }

    /// The TCP segments to or from `port` (each as the receiving side saw it), read until
    /// both directions' FINs are in (so every segment of the exchange is): no timing decides,
    /// the deadline only bounds a broken run.
    fn segments(&self, port: u16) -> Vec<Seg> {
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut buf = vec![0u8; 65536];
        loop {
            let fins = out
                .iter()
                .filter(|s: &&Seg| s.fin())
                .map(|s| s.sport)
                .collect::<Vec<_>>();
            let both = fins.contains(&port) && fins.iter().any(|&p| p != port);
            match rustix::net::recvfrom(&self.0, &mut buf, rustix::net::RecvFlags::empty()) {
                Ok((n, _, addr)) => {
                    // Outgoing copies on lo duplicate the incoming ones: keep one of each.
                    let outgoing = addr.as_ref().is_some_and(|a| {
                        let b = a.as_ptr().cast::<libc::sockaddr_ll>();
                        // SAFETY: an AF_PACKET socket's source address is a sockaddr_ll.
                        unsafe { (*b).sll_pkttype == libc::PACKET_OUTGOING }
                    });
                    if !outgoing
                        && let Some(s) = parse(&buf[..n.min(buf.len())])
                        && (s.sport == port || s.dport == port)
                    {
                        out.push(s);
                    }
                }
                Err(rustix::io::Errno::AGAIN) if both => return out,
                Err(rustix::io::Errno::AGAIN) => {
                    assert!(
                        Instant::now() < deadline,
                        "no FINs on lo for port {port}: {out:?}"
                    );
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => panic!("capture: {e}"),
            }
        }
    }
}

/// An Ethernet frame on lo (zero MACs) with IPv4 or IPv6 and TCP.
fn parse(f: &[u8]) -> Option<Seg> {
    let eth = f.get(..14)?;
    let ethertype = u16::from_be_bytes([eth[12], eth[13]]);
    let ip = &f[14..];
    let tcp = match ethertype {
        0x0800 => {
            let ihl = usize::from(ip.first()? & 0x0f) * 4;
            (*ip.get(9)? == 6).then_some(ip.get(ihl..)?)?
        }
        0x86dd => (*ip.get(6)? == 6).then_some(ip.get(40..)?)?,
        _ => return None,
    };
    let doff = usize::from(tcp.get(12)? >> 4) * 4;
    Some(Seg {
        sport: u16::from_be_bytes([tcp[0], tcp[1]]),
        dport: u16::from_be_bytes([tcp[2], tcp[3]]),
        flags: *tcp.get(13)?,
        opts: tcp.get(20..doff)?.to_vec(),
    })
}

/// A TCP socket, made before `connect` so it can be marked first.
fn tcp_socket(to: SocketAddr) -> OwnedFd {
    let fam = if to.is_ipv4() {
        rustix::net::AddressFamily::INET
    } else {
        rustix::net::AddressFamily::INET6
    };
    rustix::net::socket(fam, rustix::net::SocketType::STREAM, None).expect("socket")
}

fn connect(sock: OwnedFd, to: SocketAddr) -> TcpStream {
    rustix::net::connect(&sock, &to).expect("connect");
    TcpStream::from(sock)
}

/// A few bytes each way, then both sides close: the capture then ends with both FINs.
fn exchange(mut c: TcpStream, mut s: TcpStream) {
    c.write_all(b"ping").unwrap();
    let mut b = [0u8; 4];
    s.read_exact(&mut b).unwrap();
    s.write_all(b"pong").unwrap();
    c.read_exact(&mut b).unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).unwrap();
    s.read_to_end(&mut rest).unwrap();
}

/// What the segments of one connection to `port` carried: (SYN had it, SYN-ACK had it,
/// any other segment had it).
fn option_in(segs: &[Seg]) -> (bool, bool, bool) {
    assert!(segs.iter().any(Seg::syn), "no SYN captured: {segs:?}");
    assert!(
        segs.iter().any(Seg::syn_ack),
        "no SYN-ACK captured: {segs:?}"
    );
    let syn = segs.iter().filter(|s| s.syn()).all(Seg::has_smc_opt);
    let syn_ack = segs.iter().filter(|s| s.syn_ack()).all(Seg::has_smc_opt);
    let other = segs
        .iter()
        .filter(|s| !s.syn() && !s.syn_ack())
        .any(Seg::has_smc_opt);
    (syn, syn_ack, other)
}

struct Conn {
    client: SockOption,
    server: SockOption,
    segs: Vec<Seg>,
}

/// One connection from a client socket (marked as SMC client or not) to `l`.
fn run(maps: &Maps, l: &TcpListener, mark: bool) -> Conn {
    run_to(maps, l, l.local_addr().unwrap(), mark)
}

/// [`run`] to the address `to` of `l` (a wildcard listener's).
fn run_to(maps: &Maps, l: &TcpListener, to: SocketAddr, mark: bool) -> Conn {
    let cap = Capture::open();
    let sock = tcp_socket(to);
    if mark {
        maps.mark_client(&sock).unwrap();
        assert!(maps.sock_option(&sock).unwrap().marked_client());
    }
    let c = connect(sock, to);
    let (s, _) = l.accept().unwrap();
    let client = maps.sock_option(&c).unwrap();
    let server = maps.sock_option(&s).unwrap();
    exchange(c, s);
    Conn {
        client,
        server,
        segs: cap.segments(to.port()),
    }
}

fn smc_listener(maps: &Maps) -> (TcpListener, Vec<smcd_engine::bpf::ListenerKey>) {
    smc_listener_at(maps, "127.0.0.1:0")
}

fn smc_listener_at(maps: &Maps, at: &str) -> (TcpListener, Vec<smcd_engine::bpf::ListenerKey>) {
    let l = TcpListener::bind(at).unwrap();
    let keys = maps.register_listening_socket(&l).unwrap();
    (l, keys)
}

#[test]
fn marked_client_to_smc_listener_both_see_the_option() {
    let Some(a) = attached("marked_client_to_smc_listener_both_see_the_option") else {
        return;
    };
    let (l, _keys) = smc_listener(a.maps());
    let c = run(a.maps(), &l, true);
    assert_eq!(option_in(&c.segs), (true, true, false), "{:?}", c.segs);
    // Byte for byte the kernel's option: kind 254, length 6, E2 D4 C3 D9 (two NOPs pad it to
    // 8; the kernel puts them first, a BPF program can only put them after).
    let syn = c.segs.iter().find(|s| s.syn()).unwrap();
    let at = syn.opts.windows(6).position(|w| w == SMC_OPT).unwrap();
    assert_eq!(&syn.opts[at..], &[0xfe, 6, 0xe2, 0xd4, 0xc3, 0xd9, 1, 1]);
    assert!(c.client.syn_sent() && c.client.peer_had(), "{:?}", c.client);
    assert_eq!(c.client.clc_runs(), Some(true));
    assert!(
        c.server.passive() && c.server.peer_had() && c.server.echoed(),
        "{:?}",
        c.server
    );
    assert_eq!(c.server.clc_runs(), Some(true));
}

/// An nftables table of this test (`nft -f` of `rules`), deleted when dropped.
struct NftTable(String);

impl NftTable {
    fn add(name: &str, rules: &str) -> NftTable {
        let script = format!("table inet {name} {{\n{rules}\n}}\n");
        let out = std::process::Command::new("nft")
            .args(["-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                c.stdin.take().unwrap().write_all(script.as_bytes())?;
                c.wait_with_output()
            })
            .expect("nft");
        assert!(
            out.status.success(),
            "nft -f: {}\n{script}",
            String::from_utf8_lossy(&out.stderr)
        );
        NftTable(name.to_owned())
    }

    /// The packets counted by the table's counters, in order.
    fn counted(&self) -> Vec<u64> {
        let out = std::process::Command::new("nft")
            .args(["list", "table", "inet", &self.0])
            .output()
            .expect("nft list");
        let text = String::from_utf8_lossy(&out.stdout);
        text.split("counter packets ")
            .skip(1)
            .filter_map(|t| t.split_whitespace().next()?.parse().ok())
            .collect()
    }
}

impl Drop for NftTable {
    fn drop(&mut self) {
        let _ = std::process::Command::new("nft")
            .args(["delete", "table", "inet", &self.0])
            .status();
    }
}

/// The accepted socket is made by a segment that comes after the client's first data, not
/// by the ACK that ended the handshake. Under load that is the accept queue: the ACK and the
/// Proposal are dropped while it is full, the server sends its SYN-ACK again, and the
/// client's answer (an ACK whose sequence number is the ISN + 1 + the Proposal's length)
/// makes the child. Here `TCP_DEFER_ACCEPT` ignores the first ACK and nftables drops the
/// client's data until the child exists. The record of the SYN-ACK's decision must still be
/// found (the program keys it by the child's `rcv_nxt`, not by the segment): before that fix
/// the accepted side read "plain client" while the client had seen the echo and sent its
/// Proposal, which the application then read as data (crr at 4,096 connections: 7 to 152
/// per 3 s run).
#[test]
fn a_child_made_by_a_later_segment_keeps_the_decision() {
    let test = "a_child_made_by_a_later_segment_keeps_the_decision";
    if smc_tests::skip_unless_tool(test, "nft") {
        return;
    }
    let Some(a) = attached(test) else {
        return;
    };
    let (l, _keys) = smc_listener(a.maps());
    // The handshake's ACK makes no child: the kernel waits for data, and after a second
    // sends the SYN-ACK again.
    let secs: libc::c_int = 1;
    // SAFETY: setsockopt on a socket we own with an int of the right size.
    let r = unsafe {
        libc::setsockopt(
            l.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&raw const secs).cast(),
            std::mem::size_of::<libc::c_int>() as u32,
        )
    };
    assert_eq!(
        r,
        0,
        "TCP_DEFER_ACCEPT: {}",
        std::io::Error::last_os_error()
    );
    let to = l.local_addr().unwrap();
    let sock = tcp_socket(to);
    rustix::net::bind(&sock, &"127.0.0.1:0".parse::<SocketAddr>().unwrap()).unwrap();
    let cport = rustix::net::getsockname(&sock)
        .ok()
        .and_then(|a| SocketAddr::try_from(a).ok())
        .unwrap()
        .port();
    a.maps().mark_client(&sock).unwrap();
    // Every client segment with data (not SYN, FIN or RST; longer than a bare ACK with
    // timestamps, 52 bytes) is dropped until the table goes.
    let nft = NftTable::add(
        &format!("smc_test_{}_{cport}", std::process::id()),
        &format!(
            "chain in {{ type filter hook input priority 0; \
             ip saddr 127.0.0.1 tcp sport {cport} tcp dport {} tcp flags & (syn | fin | rst) == 0 \
             ip length > 52 counter drop; }}",
            to.port()
        ),
    );
    let mut c = connect(sock, to);
    assert_eq!(a.maps().sock_option(&c).unwrap().clc_runs(), Some(true));
    c.write_all(b"a").unwrap();
    // Made by the client's ACK of the second SYN-ACK (its sequence number the ISN + 2).
    let (mut s, _) = l.accept().unwrap();
    assert!(nft.counted()[0] >= 1, "the data segment was dropped");
    drop(nft);
    let server = a.maps().sock_option(&s).unwrap();
    assert!(
        server.passive() && server.peer_had() && server.echoed(),
        "{server:?}"
    );
    assert_eq!(server.clc_runs(), Some(true));
    // "a" comes by retransmission once the table is gone: the stream is whole.
    let mut b = [0u8; 1];
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"a");
}

/// IPv6, and a dual-stack `[::]` listener reached over IPv4: the request is IPv4, the
/// accepted socket IPv6 with a mapped address, and both give the same keys.
#[test]
fn ipv6_and_dual_stack_listeners_echo() {
    let Some(a) = attached("ipv6_and_dual_stack_listeners_echo") else {
        return;
    };
    let (l, keys) = smc_listener_at(a.maps(), "[::1]:0");
    assert_eq!(keys.len(), 1);
    let c = run(a.maps(), &l, true);
    assert_eq!(option_in(&c.segs), (true, true, false), "{:?}", c.segs);
    assert_eq!(
        (c.client.clc_runs(), c.server.clc_runs()),
        (Some(true), Some(true))
    );

    let (l, keys) = smc_listener_at(a.maps(), "[::]:0");
    assert_eq!(keys.len(), 2, "dual stack: both wildcards");
    let port = l.local_addr().unwrap().port();
    for to in [format!("127.0.0.1:{port}"), format!("[::1]:{port}")] {
        let c = run_to(a.maps(), &l, to.parse().unwrap(), true);
        assert_eq!(
            option_in(&c.segs),
            (true, true, false),
            "{to}: {:?}",
            c.segs
        );
        assert_eq!(
            (c.client.clc_runs(), c.server.clc_runs()),
            (Some(true), Some(true)),
            "{to}"
        );
    }
}

#[test]
fn marked_client_to_plain_listener_sees_no_echo() {
    let Some(a) = attached("marked_client_to_plain_listener_sees_no_echo") else {
        return;
    };
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = run(a.maps(), &l, true);
    assert_eq!(option_in(&c.segs), (true, false, false), "{:?}", c.segs);
    assert!(
        c.client.syn_sent() && !c.client.peer_had(),
        "{:?}",
        c.client
    );
    assert_eq!(c.client.clc_runs(), Some(false), "peer lacks it: plain TCP");
    assert_eq!(
        c.server,
        SockOption::default(),
        "nothing recorded for a plain listener"
    );
}

#[test]
fn marked_client_to_python_http_server_sees_no_echo() {
    let test = "marked_client_to_python_http_server_sees_no_echo";
    if smc_tests::skip_unless_tool(test, "python3") {
        return;
    }
    let Some(a) = attached(test) else {
        return;
    };
    // A free port, then let python listen on it (a plain listener: never registered).
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut py = std::process::Command::new("python3")
        .args([
            "-m",
            "http.server",
            "--bind",
            "127.0.0.1",
            &port.to_string(),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let to: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let sock = loop {
        let sock = tcp_socket(to);
        a.maps().mark_client(&sock).unwrap();
        let cap = Capture::open();
        if rustix::net::connect(&sock, &to).is_ok() {
            break (sock, cap);
        }
        assert!(
            py.try_wait().unwrap().is_none(),
            "python3 http.server exited"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let (sock, cap) = sock;
    let mut c = TcpStream::from(sock);
    assert_eq!(a.maps().sock_option(&c).unwrap().clc_runs(), Some(false));
    c.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut reply = Vec::new();
    c.read_to_end(&mut reply).unwrap();
    assert!(
        reply.starts_with(b"HTTP/1.0 200"),
        "{:?}",
        String::from_utf8_lossy(&reply)
    );
    drop(c);
    let segs = cap.segments(port);
    let _ = py.kill();
    let _ = py.wait();
    assert_eq!(option_in(&segs), (true, false, false), "{segs:?}");
}

#[test]
fn congested_listener_does_not_echo() {
    let Some(a) = attached("congested_listener_does_not_echo") else {
        return;
    };
    let (l, keys) = smc_listener(a.maps());
    a.maps().set_congested(&keys, true).unwrap();
    assert_eq!(a.maps().listener(&keys[0]).unwrap(), Some(true));
    let c = run(a.maps(), &l, true);
    assert_eq!(option_in(&c.segs), (true, false, false), "{:?}", c.segs);
    assert_eq!(c.client.clc_runs(), Some(false));
    assert!(
        c.server.passive() && c.server.peer_had() && !c.server.echoed(),
        "{:?}",
        c.server
    );
    assert_eq!(c.server.clc_runs(), Some(false));
    // The congestion ends: the next connection is SMC again.
    a.maps().set_congested(&keys, false).unwrap();
    let c = run(a.maps(), &l, true);
    assert_eq!(option_in(&c.segs), (true, true, false), "{:?}", c.segs);
    assert_eq!(c.server.clc_runs(), Some(true));
}

#[test]
fn unmarked_client_sends_no_option() {
    let Some(a) = attached("unmarked_client_sends_no_option") else {
        return;
    };
    let (l, _keys) = smc_listener(a.maps());
    let c = run(a.maps(), &l, false);
    assert_eq!(option_in(&c.segs), (false, false, false), "{:?}", c.segs);
    assert_eq!(c.client, SockOption::default());
    assert_eq!(c.client.clc_runs(), None);
    assert!(c.server.passive() && !c.server.peer_had(), "{:?}", c.server);
    assert_eq!(
        c.server.clc_runs(),
        Some(false),
        "a plain client of an SMC listener"
    );
}

#[test]
fn unregistered_listener_is_not_echoed_after_unregister() {
    let Some(a) = attached("unregistered_listener_is_not_echoed_after_unregister") else {
        return;
    };
    let (l, keys) = smc_listener(a.maps());
    a.maps().unregister_listener(&keys).unwrap();
    assert_eq!(a.maps().listener(&keys[0]).unwrap(), None);
    let e = a.maps().set_congested(&keys, true).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
    let c = run(a.maps(), &l, true);
    assert_eq!(option_in(&c.segs), (true, false, false), "{:?}", c.segs);
}

#[test]
fn map_calls_on_bad_sockets_are_errors() {
    let Some(a) = attached("map_calls_on_bad_sockets_are_errors") else {
        return;
    };
    // Not a socket: errors with a message, no panic.
    let f = std::fs::File::open("/dev/null").unwrap();
    let e = a.maps().mark_client(f.as_fd()).unwrap_err();
    assert!(e.to_string().contains("marking the socket"), "{e}");
    assert!(a.maps().sock_option(f.as_fd()).is_err());
    assert!(a.maps().unmark_client(f.as_fd()).is_err());
    // A socket nobody marked reads as "nothing recorded"; unmarking it is no error.
    let u = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    assert_eq!(a.maps().sock_option(&u).unwrap(), SockOption::default());
    a.maps().unmark_client(&u).unwrap();
}

/// (e) The program smcd attached goes with smcd, even when smcd is SIGKILLed; the maps an
/// engine got stay valid descriptors but mark nothing any more.
#[test]
fn smcd_sigkilled_detaches_the_program() {
    let test = "smcd_sigkilled_detaches_the_program";
    let cg = match test_cgroup() {
        Ok(cg) => cg.clone(),
        Err(why) => {
            skip_unless(test, false, why);
            return;
        }
    };
    let arg = format!("--bpf-cgroup={}", cg.display());
    let mut smcd = Smcd::start_with(bins!(), &[&arg]);
    let session = SmcdSession::open(&smcd.socket).expect("HELLO");
    let Some(maps) = session.syn_option.as_ref() else {
        skip_unless(test, false, "smcd did not attach the program (see its log)");
        return;
    };
    assert!(session.info().syn_option);
    let info = smcd.ctl("--json info").json();
    assert_eq!(info["syn_option"]["path"], "bpf", "{info}");
    assert_eq!(
        info["syn_option"]["cgroup"],
        cg.display().to_string(),
        "{info}"
    );
    assert!(
        smcd.ctl("info")
            .ok()
            .contains("SMC Option:       TCP option (BPF, cgroup")
    );
    let (l, _keys) = smc_listener(maps);
    let c = run(maps, &l, true);
    assert_eq!(option_in(&c.segs), (true, true, false), "{:?}", c.segs);
    assert_eq!(c.client.clc_runs(), Some(true));

    smcd.kill();
    let c = run(maps, &l, true);
    assert_eq!(option_in(&c.segs), (false, false, false), "{:?}", c.segs);
    assert!(
        c.client.marked_client() && !c.client.syn_sent(),
        "{:?}",
        c.client
    );
    assert_eq!(
        c.client.clc_runs(),
        None,
        "no program: the option path cannot decide"
    );
}

/// `--no-bpf`: HELLO hands out no maps, the engine knows it is on intents.
#[test]
fn smcd_without_bpf_gives_no_maps() {
    let mut smcd = Smcd::start_with(bins!(), &["--no-bpf"]);
    let session = SmcdSession::open(&smcd.socket).expect("HELLO");
    assert!(!session.info().syn_option);
    assert!(session.syn_option.is_none());
    let info = smcd.ctl("--json info").json();
    assert_eq!(info["syn_option"]["path"], "intents", "{info}");
    assert_eq!(info["syn_option"]["status"], "off (--no-bpf)", "{info}");
    let text = smcd.ctl("info");
    assert!(
        text.ok().contains("SMC Option:       intents (same host)"),
        "{text:?}"
    );
    // A cgroup that is none: smcd says why and serves on intents.
    let mut smcd2 = Smcd::start_with(bins!(), &["--bpf-cgroup=/proc"]);
    let info = smcd2.ctl("--json info").json();
    assert_eq!(info["syn_option"]["path"], "intents", "{info}");
    let why = info["syn_option"]["status"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(why.contains("not a cgroup v2 directory"), "{why}");
    assert!(!SmcdSession::open(&smcd2.socket).unwrap().info().syn_option);
    smcd2.stop();
    smcd.stop();
}

// ------------------------------------------------------------------------------------------
// Part B: the engine's connect and accept on the option path (a real smcd attached to this
// process's cgroup, real engines).

/// An smcd with the program attached to this process's cgroup, or `None` after a skip.
fn option_smcd(test: &str) -> Option<Smcd> {
    let cg = match test_cgroup() {
        Ok(cg) => cg.clone(),
        Err(why) => {
            skip_unless(test, false, why);
            return None;
        }
    };
    let smcd = Smcd::start_with(bins!(), &[&format!("--bpf-cgroup={}", cg.display())]);
    let attached = SmcdSession::open(&smcd.socket).is_ok_and(|s| s.info().syn_option);
    if skip_unless(
        test,
        attached,
        "smcd did not attach the program (see its log)",
    ) {
        return None;
    }
    Some(smcd)
}

fn pingpong(c: &smcd_engine::SmcStream, s: &smcd_engine::SmcStream) {
    (&*c).write_all(b"from the client").unwrap();
    let mut b = [0u8; 15];
    (&*s).read_exact(&mut b).unwrap();
    assert_eq!(&b, b"from the client");
    (&*s).write_all(b"and back").unwrap();
    let mut b = [0u8; 8];
    (&*c).read_exact(&mut b).unwrap();
    assert_eq!(&b, b"and back");
}

/// Client and listener engines on the option path: SMC-D, and the SYN and SYN-ACK carried
/// the option (an intent-path client's SYN never does).
#[test]
fn engines_connect_smc_d_by_the_option() {
    let Some(smcd) = option_smcd("engines_connect_smc_d_by_the_option") else {
        return;
    };
    let (se, ce) = (smcd.engine(), smcd.engine());
    let l = smc_tests::listen(&se);
    let port = l.local_addr().unwrap().port();
    let cap = Capture::open();
    let c = smcd_engine::SmcStream::connect_with(&ce, ("127.0.0.1", port)).unwrap();
    let (s, _) = l.accept().unwrap();
    assert!(c.is_smc(), "{}", c.mode());
    assert!(s.is_smc(), "{}", s.mode());
    pingpong(&c, &s);
    drop(c);
    drop(s);
    let segs = cap.segments(port);
    assert_eq!(option_in(&segs), (true, true, false), "{segs:?}");
    // Counted by path, one connection on each side.
    let stats = smcd.ctl("--json stats").json();
    let p = &stats["capability_path"];
    assert_eq!(p["option"]["client"], 1, "{stats}");
    assert_eq!(p["option"]["server"], 1, "{stats}");
    assert_eq!(p["intents"]["total"], 0, "{stats}");
    let text = smcd.ctl("-d stats");
    let text = text.ok();
    assert!(text.contains("Capability Path\n"), "{text}");
    assert!(
        text.contains("  TCP option                            2 (client 1, server 1)\n"),
        "{text}"
    );
    assert!(!smcd.ctl("stats").ok().contains("Capability Path"));
}

/// An option-path client of a plain TCP server: plain at once with PEERNOSMC, and the server
/// sees exactly the application's bytes (no CLC).
#[test]
fn option_client_of_a_plain_server_goes_tcp_without_clc() {
    let Some(smcd) = option_smcd("option_client_of_a_plain_server_goes_tcp_without_clc") else {
        return;
    };
    let ce = smcd.engine();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let cap = Capture::open();
    let c = smcd_engine::SmcStream::connect_with(&ce, ("127.0.0.1", port)).unwrap();
    assert_eq!(
        c.mode(),
        smcd_engine::Mode::Tcp(smcd_engine::Fallback::local(
            smc_proto::clc::ReasonCode::PEERNOSMC
        ))
    );
    let (mut s, _) = l.accept().unwrap();
    (&c).write_all(b"GET /").unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"GET /", "not a CLC byte before the application's");
    drop(s);
    drop(c);
    let segs = cap.segments(port);
    assert_eq!(option_in(&segs), (true, false, false), "{segs:?}");
}

/// A plain TCP client of an option-path listener: plain TCP, every byte intact.
#[test]
fn plain_client_of_an_option_listener_stays_tcp() {
    let Some(smcd) = option_smcd("plain_client_of_an_option_listener_stays_tcp") else {
        return;
    };
    let se = smcd.engine();
    let l = smc_tests::listen(&se);
    let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    c.write_all(b"plain bytes").unwrap();
    let (s, _) = l.accept().unwrap();
    assert_eq!(
        s.mode(),
        smcd_engine::Mode::Tcp(smcd_engine::Fallback::local(
            smc_proto::clc::ReasonCode::PEERNOSMC
        ))
    );
    let mut b = [0u8; 11];
    (&s).read_exact(&mut b).unwrap();
    assert_eq!(&b, b"plain bytes");
}

/// Handshake limitation on the option path: while the listener's flag in the program's map
/// says congested, its SYN-ACKs go out without the option and clients go plain (PEERNOSMC);
/// once it clears, SMC-D again.
#[test]
fn congested_option_listener_sends_clients_plain() {
    let Some(smcd) = option_smcd("congested_option_listener_sends_clients_plain") else {
        return;
    };
    let (se, ce) = (smcd.engine(), smcd.engine());
    let l = smc_tests::listen(&se);
    let addr = l.local_addr().unwrap();
    // The same maps the engines got, from a session of our own.
    let session = SmcdSession::open(&smcd.socket).unwrap();
    let maps = session.syn_option.as_ref().unwrap();
    let probe = TcpListener::bind("127.0.0.1:0").unwrap();
    let keys = smcd_engine::bpf::ListenerKey::for_addr(
        smcd_engine::bpf::netns_cookie(&probe).unwrap(),
        addr,
        false,
    );
    assert_eq!(maps.listener(&keys[0]).unwrap(), Some(false), "registered");
    maps.set_congested(&keys, true).unwrap();
    let c = smcd_engine::SmcStream::connect_with(&ce, addr).unwrap();
    let (s, _) = l.accept().unwrap();
    assert_eq!(
        c.mode(),
        smcd_engine::Mode::Tcp(smcd_engine::Fallback::local(
            smc_proto::clc::ReasonCode::PEERNOSMC
        ))
    );
    assert!(!s.is_smc(), "{}", s.mode());
    pingpong(&c, &s);
    maps.set_congested(&keys, false).unwrap();
    let c = smcd_engine::SmcStream::connect_with(&ce, addr).unwrap();
    let (s, _) = l.accept().unwrap();
    assert!(c.is_smc() && s.is_smc(), "{} / {}", c.mode(), s.mode());
    pingpong(&c, &s);
    // Closing the listener unregisters it.
    drop(l);
    assert!(
        smc_tests::eventually(Duration::from_secs(5), || maps
            .listener(&keys[0])
            .is_ok_and(|r| r.is_none())),
        "still registered after close"
    );
}

/// Handshake limitation on the option path with a listener that is really congested (not a
/// flag set by hand): stalled handshakes hold every worker, the listener marks itself
/// congested in the map, its SYN-ACKs go out without the option, and a new client is plain
/// TCP with PEERNOSMC at once. `accept` hands it over while the stalled handshakes are still
/// in progress, and neither side waited on a timer. Once the stalled clients leave, clients
/// get SMC-D again.
#[test]
fn stalled_handshakes_congest_an_option_listener_and_new_clients_go_plain_at_once() {
    let test = "stalled_handshakes_congest_an_option_listener_and_new_clients_go_plain_at_once";
    let Some(smcd) = option_smcd(test) else {
        return;
    };
    let (se, ce) = (smcd.engine(), smcd.engine());
    // As in fallback.rs: the stalled handshakes' work ends SERVE_WITHIN after their accept
    // at the latest; a set-up that took longer (a loaded machine) proves nothing and is made
    // again with a fresh listener.
    let (l, stalled, c, stalled_n) = smc_tests::retry_set_up(
        5,
        "no attempt congested the listener within SERVE_WITHIN",
        || congest_by_option(&smcd, &se, &ce),
    );
    let plain = smcd_engine::Mode::Tcp(smcd_engine::Fallback::local(
        smc_proto::clc::ReasonCode::PEERNOSMC,
    ));
    // No echo, so no CLC: PEERNOSMC, not a handshake that ran into a deadline.
    assert_eq!(c.mode(), plain);
    // The plain client that found the listener congested comes first, then ours; both are
    // handed over while the stalled handshakes are still in progress.
    let s = smc_tests::accept_from(&l, c.local_addr().unwrap(), |s| {
        assert_eq!(s.mode(), plain);
    });
    assert_eq!(l.handshakes_in_progress(), stalled_n, "accept did not wait");
    pingpong(&c, &s);
    drop(stalled);
    assert!(
        smc_tests::eventually(Duration::from_secs(10), || l.handshakes_in_progress() == 0),
        "{} handshakes in progress",
        l.handshakes_in_progress()
    );
    let c2 = smcd_engine::SmcStream::connect_with(&ce, l.local_addr().unwrap()).unwrap();
    assert!(c2.is_smc(), "{}", c2.mode());
    let s2 = smc_tests::accept_from(&l, c2.local_addr().unwrap(), |_| {});
    assert!(s2.is_smc(), "{}", s2.mode());
    pingpong(&c2, &s2);
}

/// The option path's version of fallback.rs's `congest`: clients of a fake engine mark their
/// sockets, connect and propose while their SYN-ACKs carry the option; the first gets its
/// Accept and never confirms, so its link group stays in first contact, and every later
/// Proposal of that engine waits for it on a worker. The first SYN-ACK without the option
/// means the listener is congested. Returns the listener, the stalled clients (and last the
/// plain one that found it congested), an engine client connected then, and the number of
/// stalled handshakes; `None` when the set-up outlasted the stalled handshakes' work or
/// stalled more clients than the workers hold without congestion.
#[allow(clippy::type_complexity)]
fn congest_by_option(
    smcd: &Smcd,
    se: &std::sync::Arc<smcd_engine::Engine>,
    ce: &std::sync::Arc<smcd_engine::Engine>,
) -> Option<(
    smcd_engine::SmcListener,
    Vec<TcpStream>,
    smcd_engine::SmcStream,
    usize,
)> {
    use smc_proto::clc::ClcMessage;
    let l = smc_tests::local_listener(se, 128, true);
    let to = l.local_addr().unwrap();
    let fake = smcd.engine();
    let a = fake.attached().expect("smcd is up");
    let maps = a.session.option_path().expect("the option path");
    let proposal = ClcMessage::from(smc_core::handshake::decide::client_proposal(
        &fake.caps(a.ism.as_ref()),
    ))
    .to_vec();
    let mut stalled: Vec<TcpStream> = Vec::new();
    let mut first: Option<Instant> = None;
    loop {
        // Past SERVE_WITHIN the first stalled handshakes' work ends (declined), workers come
        // free, and more clients prove nothing: a busy machine made the set-up too slow. So
        // does an attempt that stalled more clients than workers could hold without the
        // listener saying so (on a busy machine a stalled one can end before the next
        // arrives). The caller tries again; a listener that never marks itself congested
        // fails every attempt.
        if first.is_some_and(|t| t.elapsed() >= smcd_engine::driver::handshake::SERVE_WITHIN)
            || stalled.len() > 2 * smcd_engine::driver::listener::max_workers() + 4
        {
            return None;
        }
        let sock = tcp_socket(to);
        maps.mark_client(&sock).unwrap();
        let mut s = connect(sock, to);
        if maps.sock_option(&s).unwrap().clc_runs() != Some(true) {
            // No echo: congested. This one is a plain connection the listener hands to
            // `accept`; it stays open with the stalled ones.
            stalled.push(s);
            break;
        }
        first.get_or_insert_with(Instant::now);
        s.write_all(&proposal).unwrap();
        if stalled.is_empty() {
            // The first contact: its Accept comes, its Confirm never does.
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let answer = smc_tests::read_clc(&s).unwrap().unwrap();
            assert!(matches!(answer, ClcMessage::Accept(_)), "{answer:?}");
        }
        stalled.push(s);
        let n = stalled.len();
        assert!(
            smc_tests::eventually(Duration::from_secs(5), || l.handshakes_in_progress() >= n),
            "{} handshakes in progress, {n} clients",
            l.handshakes_in_progress()
        );
    }
    let stalled_n = stalled.len() - 1;
    assert!(stalled_n >= 2, "congested after {stalled_n} handshakes");
    let c = smcd_engine::SmcStream::connect_with(ce, to).unwrap();
    if first.is_some_and(|t| t.elapsed() >= smcd_engine::driver::handshake::SERVE_WITHIN) {
        return None;
    }
    Some((l, stalled, c, stalled_n))
}

/// The program attached to a cgroup this process is not in: engines get the maps, but their
/// marked SYNs go out without the option. The first such connect is plain (PEERNOSMC, as its
/// SYN-ACK had nothing), and the engine goes back to intents: the next one is SMC-D.
#[test]
fn option_path_that_does_not_cover_us_falls_back_to_intents() {
    let test = "option_path_that_does_not_cover_us_falls_back_to_intents";
    if test_cgroup().is_err() {
        skip_unless(test, false, "needs root and a cgroup2 mount");
        return;
    }
    let root = loader::default_cgroup().unwrap();
    let other = root.join(format!("smc-test-bpf-{}-empty", std::process::id()));
    std::fs::create_dir_all(&other).unwrap();
    let mut smcd = Smcd::start_with(bins!(), &[&format!("--bpf-cgroup={}", other.display())]);
    let attached = SmcdSession::open(&smcd.socket).is_ok_and(|s| s.info().syn_option);
    if !skip_unless(test, attached, "smcd did not attach the program") {
        let (se, ce) = (smcd.engine(), smcd.engine());
        let l = smc_tests::listen(&se);
        let addr = l.local_addr().unwrap();
        let c = smcd_engine::SmcStream::connect_with(&ce, addr).unwrap();
        let (s, _) = l.accept().unwrap();
        assert!(!c.is_smc() && !s.is_smc(), "{} / {}", c.mode(), s.mode());
        pingpong(&c, &s);
        let c = smcd_engine::SmcStream::connect_with(&ce, addr).unwrap();
        let (s, _) = l.accept().unwrap();
        assert!(c.is_smc() && s.is_smc(), "{} / {}", c.mode(), s.mode());
        pingpong(&c, &s);
    }
    smcd.stop();
    let _ = std::fs::remove_dir(&other);
}

/// The kernel's listen work: an option client's connect finishes while the application is
/// not in `accept()`, also right after a thread that waited in `accept()` left it (a few
/// rounds: whether the acceptor was asleep without the listener in its set then varies).
#[test]
fn option_client_is_served_while_nobody_accepts() {
    let Some(smcd) = option_smcd("option_client_is_served_while_nobody_accepts") else {
        return;
    };
    let (se, ce) = (smcd.engine(), smcd.engine());
    let l = smc_tests::listen(&se);
    let addr = l.local_addr().unwrap();
    for _ in 0..20 {
        // A thread waits in accept() until it takes a plain connection, then leaves.
        std::thread::scope(|t| {
            let waiter = t.spawn(|| l.accept().unwrap().0);
            let mut clients = Vec::new();
            while !waiter.is_finished() {
                clients.push(TcpStream::connect(addr).unwrap());
                std::thread::sleep(Duration::from_millis(2));
            }
            assert!(!waiter.join().unwrap().is_smc());
        });
        // Nobody in accept(): the blocking connect must still finish its CLC handshake.
        let c = smcd_engine::SmcStream::connect_with(&ce, addr).unwrap();
        assert!(c.is_smc(), "{}", c.mode());
        // Plain clients the waiter did not take come first; then the SMC one, ready.
        let s = loop {
            let (s, _) = l.accept().unwrap();
            if s.is_smc() {
                break s;
            }
        };
        pingpong(&c, &s);
    }
}

/// One TCP segment as tshark decoded it (`tshark -T fields`, see [`Tshark::start`]).
#[derive(Debug)]
struct Decoded {
    sport: u16,
    dport: u16,
    syn: bool,
    ack: bool,
    /// tshark named the experimental option the kernel's SMC one (exid `0xe2d4`).
    smc_option: bool,
    /// CLC message types tshark's SMC dissector found in the segment.
    clc: Vec<u8>,
    /// TCP payload bytes.
    len: usize,
}

/// tshark capturing on `lo`, printing every decoded segment as it comes (`-l`).
struct Tshark {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    /// Segments of the warm-up connections (still arriving) are left out.
    warm_port: u16,
}

impl Tshark {
    const FIELDS: [&str; 7] = [
        "tcp.srcport",
        "tcp.dstport",
        "tcp.flags.syn",
        "tcp.flags.ack",
        "tcp.options.experimental.exid",
        "smc.clc_msg",
        "tcp.len",
    ];

    /// Starts it on the segments of `ports` and of a warm-up listener of its own, and
    /// returns once it prints what it captures: dumpcap says "Capturing on" a little before
    /// it does, so connections to the warm-up listener are made until one shows up.
    fn start(ports: &[u16]) -> Tshark {
        let warm = TcpListener::bind("127.0.0.1:0").unwrap();
        let warm_port = warm.local_addr().unwrap().port();
        let mut ports = ports.to_vec();
        ports.push(warm_port);
        let filter = ports
            .iter()
            .map(|p| format!("tcp port {p}"))
            .collect::<Vec<_>>()
            .join(" or ");
        let mut cmd = std::process::Command::new("tshark");
        cmd.args(["-i", "lo", "-n", "-l", "-f", &filter, "-T", "fields"]);
        cmd.args([
            "-E",
            "separator=/t",
            "-E",
            "occurrence=a",
            "-E",
            "aggregator=,",
        ]);
        for f in Self::FIELDS {
            cmd.args(["-e", f]);
        }
        let mut child = cmd
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("tshark");
        // dumpcap says "Capturing on 'Loopback: lo'" once the capture is open.
        let stderr = child.stderr.take().unwrap();
        let (ready_tx, ready) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            let mut said = Vec::new();
            for l in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if l.contains("Capturing on") {
                    let _ = ready_tx.send(Ok(()));
                }
                said.push(l);
            }
            let _ = ready_tx.send(Err(said.join("\n")));
        });
        match ready.recv_timeout(Duration::from_secs(60)) {
            Ok(Ok(())) => {}
            other => panic!("tshark did not start capturing: {other:?}"),
        }
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for l in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        let warm_line = format!("{warm_port}\t");
        'live: loop {
            assert!(Instant::now() < deadline, "tshark captures nothing on lo");
            let _c = TcpStream::connect(warm.local_addr().unwrap()).unwrap();
            while let Ok(l) = lines.recv_timeout(Duration::from_millis(200)) {
                if l.starts_with(&warm_line) || l.contains(&format!("\t{warm_port}\t")) {
                    break 'live;
                }
            }
        }
        Tshark {
            child,
            lines,
            warm_port,
        }
    }

    /// Every segment decoded until (and with) the SYN to `sentinel`: a connection made after
    /// everything else, so all segments before it have been captured and printed (lo
    /// delivers in order; no timing decides, the deadline only bounds a broken run).
    fn until_syn_to(mut self, sentinel: u16) -> Vec<Decoded> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut out = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|e| panic!("tshark: no SYN to {sentinel} ({e}): {out:#?}"));
            let f: Vec<&str> = line.split('\t').collect();
            assert_eq!(f.len(), Self::FIELDS.len(), "{line:?}");
            let flag = |s: &str| s == "1" || s == "True";
            let d = Decoded {
                sport: f[0].parse().unwrap(),
                dport: f[1].parse().unwrap(),
                syn: flag(f[2]),
                ack: flag(f[3]),
                smc_option: f[4].split(',').any(|x| x == "0xe2d4"),
                clc: f[5]
                    .split(',')
                    .filter(|x| !x.is_empty())
                    .map(|x| x.parse().unwrap())
                    .collect(),
                len: f[6].parse().unwrap_or(0),
            };
            if d.sport == self.warm_port || d.dport == self.warm_port {
                continue;
            }
            let done = d.syn && !d.ack && d.dport == sentinel;
            out.push(d);
            if done {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return out;
            }
        }
    }
}

/// The capture test, decoded by Wireshark's dissectors (tshark on `lo`): an SMC-D
/// connection between engines has the option in its SYN and SYN-ACK, and its CLC Proposal,
/// Accept and Confirm follow; an engine client of `python3 -m http.server` has it in its SYN,
/// not in the SYN-ACK, and sends no CLC byte (its first payload is the HTTP request).
#[test]
fn tshark_shows_the_option_and_clc_only_where_both_sides_had_it() {
    let test = "tshark_shows_the_option_and_clc_only_where_both_sides_had_it";
    if smc_tests::skip_unless_tool(test, "tshark") || smc_tests::skip_unless_tool(test, "python3") {
        return;
    }
    let Some(smcd) = option_smcd(test) else {
        return;
    };
    let (se, ce) = (smcd.engine(), smcd.engine());
    let l = smc_tests::listen(&se);
    let smc_port = l.local_addr().unwrap().port();
    let free_port = || {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let py_port = free_port();
    let mut py = std::process::Command::new("python3")
        .args(["-m", "http.server", "--bind", "127.0.0.1"])
        .arg(py_port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let sentinel = TcpListener::bind("127.0.0.1:0").unwrap();
    let sentinel_port = sentinel.local_addr().unwrap().port();
    // python is up once a plain connect succeeds (before the capture starts).
    while TcpStream::connect(("127.0.0.1", py_port)).is_err() {
        assert!(
            py.try_wait().unwrap().is_none(),
            "python3 http.server exited"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let tshark = Tshark::start(&[smc_port, py_port, sentinel_port]);

    let c = smcd_engine::SmcStream::connect_with(&ce, ("127.0.0.1", smc_port)).unwrap();
    let (s, _) = l.accept().unwrap();
    assert!(c.is_smc() && s.is_smc(), "{} / {}", c.mode(), s.mode());
    pingpong(&c, &s);
    drop(c);
    drop(s);

    let http = smcd_engine::SmcStream::connect_with(&ce, ("127.0.0.1", py_port)).unwrap();
    assert!(!http.is_smc(), "{}", http.mode());
    (&http).write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut reply = Vec::new();
    (&http).read_to_end(&mut reply).unwrap();
    assert!(reply.starts_with(b"HTTP/1.0 200"), "{reply:?}");
    drop(http);

    let _sentinel = TcpStream::connect(sentinel.local_addr().unwrap()).unwrap();
    let segs = tshark.until_syn_to(sentinel_port);
    let _ = py.kill();
    let _ = py.wait();

    let of = |port: u16| -> Vec<&Decoded> {
        segs.iter()
            .filter(|d| d.sport == port || d.dport == port)
            .collect()
    };
    let (smc, web) = (of(smc_port), of(py_port));
    let syn = |v: &[&Decoded]| v.iter().find(|d| d.syn && !d.ack).map(|d| d.smc_option);
    let syn_ack = |v: &[&Decoded]| v.iter().find(|d| d.syn && d.ack).map(|d| d.smc_option);
    let clc = |v: &[&Decoded]| v.iter().flat_map(|d| d.clc.clone()).collect::<Vec<u8>>();
    // SMC-D: option both ways, then Proposal (1), Accept (2), Confirm (3), in that order.
    assert_eq!(syn(&smc), Some(true), "{smc:#?}");
    assert_eq!(syn_ack(&smc), Some(true), "{smc:#?}");
    let types = clc(&smc);
    assert_eq!(types.get(..3), Some(&[1u8, 2, 3][..]), "{smc:#?}");
    // No other segment of the connection carries the option.
    assert_eq!(smc.iter().filter(|d| d.smc_option).count(), 2, "{smc:#?}");
    // python: the option in the SYN only, no CLC byte: the client's first payload is the
    // request itself (19 bytes), and tshark finds no SMC message anywhere in the stream.
    assert_eq!(syn(&web), Some(true), "{web:#?}");
    assert_eq!(syn_ack(&web), Some(false), "{web:#?}");
    assert!(clc(&web).is_empty(), "{web:#?}");
    let first = web
        .iter()
        .find(|d| d.len > 0)
        .unwrap_or_else(|| panic!("{web:#?}"));
    assert_eq!((first.dport, first.len), (py_port, 18), "{web:#?}");
    // The sentinel is a plain TCP client: no option.
    assert_eq!(syn(&of(sentinel_port)), Some(false));
}
