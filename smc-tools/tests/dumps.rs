//! Issue 10, item 2 (and item 6's link-group cap): what dumps cost smcd.
//!
//! `smcctl stats`, `ss -a` and `linkgroup show` used to read every slot of every engine's
//! status area. The areas are memfds, and a read fault on a hole of a memfd allocates a
//! page: 8.3 MiB of smcd's memory per engine, on the thread that also serves connection
//! setup. These tests hold smcd to memory in proportion to what the engines use, to pages
//! (netlink dump continuation) for big tables, to connection setup being served while a
//! dump is in progress, and to a hostile status area costing nothing but its own records.
//!
//! No test here measures time: the dump in progress is held by a client that stops
//! reading, and what is asserted is what smcd did meanwhile.

mod common;

use common::{BINS, Smcd, within};
use rustix::fd::{AsFd, OwnedFd};
use rustix::net::RecvFlags;
use smc_proto::netlink::engine::EngineMessage;
use smc_proto::netlink::framing::{self, NLM_F_DUMP, NLM_F_REQUEST, split_messages};
use smc_proto::netlink::loopback::{LoopbackAttr, LoopbackCmd, LoopbackMessage};
use smcd_engine::ipc::channel::{self, Channel, MAX_RECORD};
use smcd_engine::layout::region::Region;
use smcd_engine::layout::status::{
    CONN_SLOT, CONN_SLOTS, ConnIdentity, LGR_SLOT, LGR_SLOTS, LgrRecord, STATUS_LEN, StatusArea,
    VERSION,
};
use smcd_engine::{SmcListener, SmcStream};
use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The family id smcd serves `SMCD_ENGINE` under.
const ENGINE: u16 = 0x21;
/// `NLMSG_DONE`.
const NLMSG_DONE: u16 = 3;

/// Inodes of the fake engine's sockets start here (real sockets' are smaller).
const FAKE: u64 = 1 << 60;

#[test]
#[ignore = "entry point of child processes"]
fn child_entry() {
    common::child_main()
}

/// A kB value from `/proc/PID/status` (`VmRSS`, `RssShmem`).
fn status_kb(pid: u32, key: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim_start_matches(':').split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
}

/// Registers like an engine (HELLO with `fd` as its status area) under session key `key`;
/// the channel must stay open for the session to live.
fn register(smcd: &Smcd, key: u64, fd: OwnedFd) -> Channel {
    let netns = std::fs::metadata("/proc/self/ns/net").unwrap();
    let mut ch = Channel::connect(&smcd.socket).unwrap();
    let (reply, _) = ch
        .request(
            LoopbackMessage::new(
                LoopbackCmd::Hello,
                vec![
                    LoopbackAttr::Version(1),
                    LoopbackAttr::Pid(std::process::id()),
                    LoopbackAttr::SessionKey(key),
                    LoopbackAttr::Netns(std::os::unix::fs::MetadataExt::ino(&netns)),
                ],
            ),
            &[fd.as_fd()],
        )
        .unwrap();
    assert!(reply.gid().is_some(), "HELLO answered: {reply:?}");
    ch
}

/// A raw client of the control socket, to hold a dump in progress by not reading.
struct Raw {
    sock: OwnedFd,
    buf: Vec<u8>,
}

impl Raw {
    fn connect(path: &Path) -> Raw {
        let sock = common::control_socket(path, Duration::from_secs(60)).unwrap();
        Raw {
            sock,
            buf: vec![0; MAX_RECORD],
        }
    }

    fn sock_dump(&self) {
        let req = framing::to_bytes(&framing::message(
            ENGINE,
            EngineMessage::sock_dump(None, None),
            NLM_F_REQUEST | NLM_F_DUMP,
            1,
            0,
        ))
        .unwrap();
        channel::send_record(self.sock.as_fd(), &req, &[]).unwrap();
    }

    /// The messages of the next record: (sockets' inodes, whether it held NLMSG_DONE).
    fn record(&mut self) -> (Vec<u64>, bool) {
        let (n, _) =
            channel::recv_record(self.sock.as_fd(), &mut self.buf, RecvFlags::empty()).unwrap();
        assert!(n > 0, "smcd closed the connection mid-dump");
        let mut inodes = Vec::new();
        let mut done = false;
        for m in split_messages(&self.buf[..n]).unwrap() {
            if m.header.message_type == NLMSG_DONE {
                done = true;
                continue;
            }
            let bytes = m.to_bytes();
            let raw = split_messages(&bytes).unwrap();
            let msg = framing::parse_message::<EngineMessage>(&raw[0]).expect("reply parses");
            let b = framing::collect_replies([msg]);
            assert!(b.end.is_none(), "an error mid-dump: {:?}", b.end);
            inodes.extend(b.payloads.iter().filter_map(|p| p.sock()).map(|s| s.inode));
        }
        (inodes, done)
    }
}

/// Many engines with few connections each: a cold `stats`, `ss -a`, `linkgroup show` and
/// `device` grow smcd by far less than the 8.3 MiB per engine it took when it read every
/// slot (32 engines: +265 MiB then), and show every connection and link group.
#[test]
fn dumps_cost_memory_in_proportion_to_what_engines_use() {
    const ENGINES: usize = 32;
    let smcd = Smcd::start(BINS);
    smcd.require_control_plane();
    // smcd's own first-time costs (code pages, allocator arenas) before the baseline.
    for cmd in ["stats", "ss -a", "linkgroup show", "device"] {
        smcd.ctl(cmd).ok();
    }
    let mut keep = Vec::new();
    for _ in 0..ENGINES {
        let e = smcd.engine();
        let l = common::listen(&e);
        let c = SmcStream::connect_with(&e, l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        assert!(c.is_smc() && s.is_smc(), "{:?}", c.mode());
        keep.push((e, l, c, s));
    }
    let pid = smcd.pid();
    let before = status_kb(pid, "VmRSS");
    let st = smcd.ctl("--json stats").json();
    let ss = smcd.ctl("--json ss -a").json();
    let lg = smcd.ctl("--json linkgroup show").json();
    smcd.ctl("device").ok();
    let after = status_kb(pid, "VmRSS");
    let socks = ss["sockets"].as_array().unwrap();
    let smc = socks.iter().filter(|s| s["mode"] == "SMCD").count();
    assert_eq!(smc, 2 * ENGINES, "{ss}");
    let listening = socks.iter().filter(|s| s["state"] == "LISTEN").count();
    assert_eq!(listening, ENGINES);
    assert_eq!(
        lg["linkgroups"].as_array().unwrap().len(),
        2 * ENGINES,
        "a client and a server link group per engine: {lg}"
    );
    assert_eq!(st["connections"]["smc"]["total"], 2 * ENGINES, "{st}");
    // A live engine here has written four pages of its area (header, one page each of
    // connections, link groups, listeners); smcd maps at most those. 256 KiB per engine
    // and 8 MiB for smcd's own heap are generous.
    let grown = after.saturating_sub(before);
    let bound = 8 * 1024 + 256 * ENGINES as u64;
    assert!(
        grown < bound,
        "smcd grew {grown} kB over {ENGINES} engines during the dumps (bound {bound} kB; \
         RssShmem now {} kB)",
        status_kb(pid, "RssShmem")
    );
    drop(keep);
}

/// More sockets and link groups than one reply holds: `ss -a` lists 1,200 real SMC-D
/// sockets and `linkgroup show` 5,000 link groups of one engine (the server, where
/// it showed about 1,024), each exactly once.
#[test]
fn big_tables_are_listed_whole_in_pages() {
    const CONNS: usize = 600;
    common::raise_nofile();
    let smcd = Smcd::start(BINS);
    let conns = common::Conns::open(&smcd, None, CONNS, 0, 0);
    let ss = smcd.ctl("--json ss -a").json();
    let socks = ss["sockets"].as_array().unwrap();
    let smc: Vec<u64> = socks
        .iter()
        .filter(|s| s["mode"] == "SMCD")
        .map(|s| s["inode"].as_u64().unwrap())
        .collect();
    assert_eq!(smc.len(), 2 * CONNS);
    let unique: HashSet<_> = smc.iter().collect();
    assert_eq!(unique.len(), smc.len(), "a socket listed twice");
    // The reply really was several records: far more than 64 KiB of messages.
    assert!(ss.to_string().len() > 2 * MAX_RECORD);
    drop(conns);

    const GROUPS: u32 = 5000;
    let (area, fd) = StatusArea::shared().unwrap();
    let _ch = register(&smcd, 0x1d, fd);
    let groups: Vec<_> = (0..GROUPS)
        .map(|i| {
            let g = area.lgr_slot();
            g.publish(&LgrRecord {
                id: 0x1000 + i,
                version: 2,
                conns: 1,
                ..LgrRecord::default()
            });
            g
        })
        .collect();
    let lg = smcd.ctl("--json linkgroup show").json();
    let ids: HashSet<u64> = lg["linkgroups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids.len(), GROUPS as usize, "every link group, once");
    assert!(ids.contains(&0x1000) && ids.contains(&u64::from(0x1000 + GROUPS - 1)));
    drop(groups);
}

/// A connect while a big dump is in progress: the dump is held by its client, which reads
/// one record and then nothing; an engine that starts after the request connects (SMC-D)
/// meanwhile; when the client reads on, the dump lists every socket once, and the new
/// engine's sockets too, because the dump had not got there yet. smcd that built the whole
/// reply at the request (and stalled everyone else meanwhile) could not list them.
#[test]
fn connection_setup_is_served_while_a_dump_is_in_progress() {
    let smcd = Smcd::start(BINS);
    smcd.require_control_plane();
    // Enough sockets that their messages are many times what smcd's socket buffer holds,
    // so the dump cannot have finished into the buffer before the client stops reading.
    let wmem: usize = std::fs::read_to_string("/proc/sys/net/core/wmem_default")
        .map(|s| s.trim().parse().unwrap_or(212_992))
        .unwrap_or(212_992);
    let n = (8 * wmem / 200).clamp(8000, CONN_SLOTS - 1);
    assert!(
        n * 200 >= 4 * wmem,
        "wmem_default {wmem} holds the whole dump; this test needs a smaller one"
    );
    let (area, fd) = StatusArea::shared().unwrap();
    let _ch = register(&smcd, 0xd0, fd);
    let slots: Vec<_> = (0..n as u64)
        .map(|i| {
            let c = area.conn_slot();
            c.publish(&ConnIdentity {
                state: 1,
                mode: 2,
                inode: FAKE + i,
                local: Some("127.0.0.1:1".parse().unwrap()),
                peer: Some("127.0.0.1:2".parse().unwrap()),
                ..ConnIdentity::default()
            });
            c
        })
        .collect();
    let mut raw = Raw::connect(&smcd.socket);
    raw.sock_dump();
    let (mut seen, done) = raw.record();
    assert!(!done, "the dump ended in its first record");
    // The dump is in progress and its client reads nothing. A new engine connects.
    let socket = smcd.socket.clone();
    let late = within(Duration::from_secs(120), move || {
        let e = smcd_engine::Engine::new(smcd_engine::EngineConfig {
            socket,
            ..smcd_engine::EngineConfig::default()
        });
        let l = SmcListener::bind_with(&e, "127.0.0.1:0").unwrap();
        let c = SmcStream::connect_with(&e, l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (e, l, c, s)
    })
    .expect("a connect while a dump was in progress never completed");
    let (_e, _l, c, s) = &late;
    assert!(c.is_smc() && s.is_smc(), "fell back: {:?}", c.mode());
    // The client reads on.
    loop {
        let (inodes, done) = raw.record();
        seen.extend(inodes);
        if done {
            break;
        }
    }
    let fake: Vec<u64> = seen.iter().copied().filter(|&i| i >= FAKE).collect();
    let unique: HashSet<_> = fake.iter().collect();
    assert_eq!(
        (fake.len(), unique.len()),
        (n, n),
        "every socket of the dump exactly once"
    );
    let others = seen.len() - fake.len();
    assert_eq!(
        others, 3,
        "the engine that connected during the dump: its listener and two sockets"
    );
    drop(slots);
}

/// A hostile status area: garbage in the header and in a few slots at the far ends of the
/// tables, nothing else written. Dumps list what the garbage decodes to, smcd keeps
/// serving, and it maps no page of the area the engine did not write.
#[test]
fn hostile_status_area_costs_only_its_own_records() {
    let smcd = Smcd::start(BINS);
    smcd.require_control_plane();
    for cmd in ["stats", "ss -a", "linkgroup show", "device"] {
        smcd.ctl(cmd).ok();
    }
    let (r, fd) = Region::create("smc-status", STATUS_LEN).unwrap();
    r.u64_at(0)
        .store(u64::from_le_bytes(*b"SMCSTAT1"), Ordering::Relaxed);
    r.u32_at(8).store(VERSION, Ordering::Relaxed); // the layout version
    for off in (12..64).step_by(4) {
        r.u32_at(off).store(u32::MAX, Ordering::Relaxed); // pid, slot counts, sequence
    }
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut garbage = |base: usize, len: usize| {
        for w in (0..len).step_by(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            r.u64_at(base + w).store(x, Ordering::Relaxed);
        }
        r.u32_at(base).store(0, Ordering::Relaxed); // an even sequence word
        r.u32_at(base + 4).store(1, Ordering::Relaxed); // in use
    };
    // The status area's layout: connection slots from 4096, then the link-group slots.
    let conn = |i: usize| 4096 + i * CONN_SLOT;
    let lgr = |i: usize| 4096 + CONN_SLOTS * CONN_SLOT + i * LGR_SLOT;
    garbage(conn(CONN_SLOTS - 1), CONN_SLOT);
    garbage(conn(CONN_SLOTS / 2), CONN_SLOT);
    garbage(lgr(LGR_SLOTS - 1), LGR_SLOT);
    garbage(lgr(LGR_SLOTS - 2), LGR_SLOT);
    // A slot's kind is its byte 136: an SMC-D group, and an SMC-R one whose link count and
    // links are garbage.
    let kind = |i: usize, k: u64| {
        let w = r.u64_at(lgr(i) + 136);
        w.store(w.load(Ordering::Relaxed) & !0xff | k, Ordering::Relaxed);
    };
    kind(LGR_SLOTS - 1, 0);
    kind(LGR_SLOTS - 2, 1);
    let _ch = register(&smcd, 0xbad, fd);
    let pid = smcd.pid();
    let before = status_kb(pid, "VmRSS");
    let ss = smcd.ctl("--json ss -a").json();
    let lg = smcd.ctl("--json linkgroup show").json();
    let lr = smcd.ctl("--json linkgroup show --smcr").json();
    let links = smcd.ctl("--json linkgroup links").json();
    smcd.ctl("stats").ok();
    smcd.ctl("stats --smcr").ok();
    smcd.ctl("device").ok();
    smcd.ctl("device show --smcr").ok();
    let after = status_kb(pid, "VmRSS");
    assert_eq!(ss["sockets"].as_array().unwrap().len(), 2, "{ss}");
    assert_eq!(lg["linkgroups"].as_array().unwrap().len(), 1, "{lg}");
    assert_eq!(lr["linkgroups"].as_array().unwrap().len(), 1, "{lr}");
    assert!(links["links"].as_array().unwrap().len() <= 3, "{links}");
    let grown = after.saturating_sub(before);
    assert!(
        grown < 2048,
        "a hostile area with 5 pages written grew smcd by {grown} kB"
    );
    smcd.require_control_plane();
    drop(r);
}
