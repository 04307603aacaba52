//! The control plane over smcd's real socket: nlctrl, every `SMC_GEN_NETLINK` and
//! `SMCD_ENGINE` command, errors, permissions (requests from uid 65534), two network
//! namespaces (`unshare -n` and `ip netns`), and clients that misbehave (garbage, oversized
//! records, thousands of connections, a client that never reads).
//!
//! Each test runs its own `smcd`; children are this test binary re-executed with a role
//! (`control_child`), under `setpriv`, `unshare -n` or `ip netns exec`.

mod common;

use common::{BINS, Smcd, eventually, say};
use rustix::fd::{AsFd, OwnedFd};
use rustix::net::{AddressFamily, RecvFlags, SocketAddrUnix, SocketFlags, SocketType};
use smc_proto::clc::ReasonCode;
use smc_proto::netlink::GenlPayload;
use smc_proto::netlink::ctrl::{CtrlMessage, FamilyInfo};
use smc_proto::netlink::engine::{
    DiagMode, EngineMessage, NetnsSelector, SockInfo, SysctlInfo, SysctlValue,
};
use smc_proto::netlink::framing::{
    self, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, ReplyBatch, ReplyEnd, split_messages,
};
use smc_proto::netlink::loopback::{LoopbackAttr, LoopbackCmd, LoopbackMessage};
use smc_proto::netlink::smc::{FbackStats, SmcCmd, SmcGenlMessage, Ueid};
use smcd_engine::ipc::channel::{self, Channel, MAX_RECORD};
use smcd_engine::layout::status::{
    ConnIdentity, Curs, LgrRecord, LstRecord, StatusArea, T_SRV_FBACK, T_TX_BYTES, fback_index,
};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const SMC: u16 = 0x20;
const ENGINE: u16 = 0x21;
const NLCTRL: u16 = 0x10;

// ------------------------------------------------------------------------------------------
// A netlink client over the seqpacket socket.

/// A control-socket client: sends one request per record, reads reply records until the
/// exchange ends (NLMSG_DONE, an ACK or an error).
struct Ctl {
    sock: OwnedFd,
    seq: u32,
    buf: Vec<u8>,
}

impl Ctl {
    fn connect(path: &Path) -> Ctl {
        let sock = common::control_socket(path, Duration::from_secs(20)).unwrap();
        Ctl {
            sock,
            seq: 100,
            buf: vec![0; MAX_RECORD],
        }
    }

    fn send_raw(&self, bytes: &[u8]) {
        channel::send_record(self.sock.as_fd(), bytes, &[]).unwrap();
    }

    /// Every message of the next reply record.
    fn recv_messages(&mut self) -> Vec<Vec<u8>> {
        let (n, _) =
            channel::recv_record(self.sock.as_fd(), &mut self.buf, RecvFlags::empty()).unwrap();
        assert!(n > 0, "smcd closed the connection");
        split_messages(&self.buf[..n])
            .expect("reply records frame")
            .iter()
            .map(|m| m.to_bytes())
            .collect()
    }

    /// Reads until the exchange ends; payloads parsed as `T`.
    fn collect<T: GenlPayload>(&mut self) -> ReplyBatch<T> {
        let mut payloads = Vec::new();
        loop {
            for m in self.recv_messages() {
                let raw = split_messages(&m).unwrap();
                let msg = framing::parse_message::<T>(&raw[0]).expect("reply parses");
                let b = framing::collect_replies([msg]);
                payloads.extend(b.payloads);
                if b.end.is_some() {
                    return ReplyBatch {
                        payloads,
                        end: b.end,
                    };
                }
            }
        }
    }

    fn request<T: GenlPayload>(&mut self, family: u16, p: T, flags: u16) -> ReplyBatch<T> {
        self.seq += 1;
        let bytes = framing::to_bytes(&framing::message(family, p, flags, self.seq, 0)).unwrap();
        self.send_raw(&bytes);
        self.collect()
    }

    fn dump<T: GenlPayload>(&mut self, family: u16, p: T) -> ReplyBatch<T> {
        self.request(family, p, NLM_F_REQUEST | NLM_F_DUMP)
    }

    fn doit<T: GenlPayload>(&mut self, family: u16, p: T) -> ReplyBatch<T> {
        self.request(family, p, NLM_F_REQUEST | NLM_F_ACK)
    }

    fn smc(&mut self, cmd: SmcCmd) -> ReplyBatch<SmcGenlMessage> {
        if cmd.is_dump() {
            self.dump(SMC, SmcGenlMessage::request(cmd))
        } else {
            self.doit(SMC, SmcGenlMessage::request(cmd))
        }
    }

    fn resolve(&mut self, name: &str) -> Result<u16, i32> {
        let r = self.doit(NLCTRL, CtrlMessage::get_family_by_name(name));
        match r.end {
            Some(ReplyEnd::Ack) => Ok(FamilyInfo::from_reply(&r.payloads[0]).unwrap().id),
            Some(ReplyEnd::Error(e)) => Err(e),
            e => panic!("unexpected end {e:?}"),
        }
    }

    fn sysctl(&mut self, sel: Option<&NetnsSelector>, name: &str) -> Result<SysctlInfo, i32> {
        let r = self.doit(ENGINE, EngineMessage::sysctl_get(sel, name));
        match r.end {
            Some(ReplyEnd::Ack) => Ok(r.payloads[0].sysctl().unwrap()),
            Some(ReplyEnd::Error(e)) => Err(e),
            e => panic!("unexpected end {e:?}"),
        }
    }

    fn set(&mut self, sel: Option<&NetnsSelector>, name: &str, v: u64) -> Option<ReplyEnd> {
        self.doit(
            ENGINE,
            EngineMessage::sysctl_set(sel, name, SysctlValue::Num(v)),
        )
        .end
    }

    fn num(&mut self, sel: Option<&NetnsSelector>, name: &str) -> u64 {
        match self.sysctl(sel, name).unwrap().value {
            Some(SysctlValue::Num(v)) => v,
            v => panic!("{name} = {v:?}"),
        }
    }

    /// `GET_FBACK_STATS`: every fallback reason with its count.
    fn fallbacks(&mut self) -> Vec<FbackStats> {
        self.smc(SmcCmd::GetFbackStats)
            .payloads
            .iter()
            .map(|m| m.fback_stats().unwrap())
            .collect()
    }

    fn sockets(&mut self, sel: Option<&NetnsSelector>) -> Vec<SockInfo> {
        let r = self.dump(ENGINE, EngineMessage::sock_dump(sel, None));
        assert_eq!(r.end, DONE);
        r.payloads.iter().map(|m| m.sock().unwrap()).collect()
    }
}

const DONE: Option<ReplyEnd> = Some(ReplyEnd::Done(0));
const ACK: Option<ReplyEnd> = Some(ReplyEnd::Ack);

fn err(e: i32) -> Option<ReplyEnd> {
    Some(ReplyEnd::Error(-e))
}

fn own_netns() -> u64 {
    std::fs::metadata("/proc/self/ns/net").unwrap().ino()
}

// ------------------------------------------------------------------------------------------
// Children.

/// Runs this test binary's `control_child` with `role` under `wrapper` (a command prefix).
fn child(
    smcd: &Smcd,
    wrapper: &[&str],
    role: &str,
    args: &[&str],
) -> std::collections::HashMap<String, String> {
    let exe = std::env::current_exe().unwrap();
    let (prog, pre) = match wrapper.split_first() {
        Some((p, rest)) => (p.to_string(), rest.iter().map(|s| s.to_string()).collect()),
        None => (exe.to_string_lossy().into_owned(), Vec::<String>::new()),
    };
    let mut cmd = Command::new(prog);
    cmd.args(pre);
    if !wrapper.is_empty() {
        cmd.arg(&exe);
    }
    let out = cmd
        .args([
            "--ignored",
            "--exact",
            "control_child",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .env("SMC_CTL_ROLE", role)
        .env("SMC_CTL_ARGS", args.join(" "))
        .env("SMCD_SOCKET", &smcd.socket)
        .stdin(Stdio::null())
        .output()
        .expect("spawn child");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child {role} failed: {}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn end_name(e: Option<ReplyEnd>) -> String {
    match e {
        Some(ReplyEnd::Ack) => "ACK".into(),
        Some(ReplyEnd::Done(_)) => "DONE".into(),
        Some(ReplyEnd::Error(n)) => format!("E{}", -n),
        None => "NONE".into(),
    }
}

#[test]
#[ignore = "entry point of child processes"]
fn control_child() {
    let Ok(role) = std::env::var("SMC_CTL_ROLE") else {
        return;
    };
    let args: Vec<String> = std::env::var("SMC_CTL_ARGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(String::from)
        .collect();
    let path = std::path::PathBuf::from(std::env::var("SMCD_SOCKET").unwrap());
    let mut c = Ctl::connect(&path);
    say("UID", rustix::process::getuid().as_raw());
    say("NETNS", own_netns());
    match role.as_str() {
        // What an unprivileged user may and may not do.
        "nobody" => {
            say("SYSINFO", end_name(c.smc(SmcCmd::GetSysInfo).end));
            say("STATS", end_name(c.smc(SmcCmd::GetStats).end));
            say("UEIDS", end_name(c.smc(SmcCmd::DumpUeid).end));
            let add = SmcGenlMessage::add_ueid(&Ueid::new("NOBODY").unwrap());
            say("ADD_UEID", end_name(c.doit(SMC, add).end));
            say("FLUSH_UEID", end_name(c.smc(SmcCmd::FlushUeid).end));
            say("ENABLE_SEID", end_name(c.smc(SmcCmd::EnableSeid).end));
            say("HS_ON", end_name(c.smc(SmcCmd::EnableHsLimitation).end));
            say("WMEM", c.num(None, "wmem"));
            say("SET_WMEM", end_name(c.set(None, "wmem", 32768)));
            let reset = EngineMessage::stats_reset(None, None);
            say("RESET", end_name(c.doit(ENGINE, reset).end));
            let list = c.dump(ENGINE, EngineMessage::sysctl_list(None));
            say("LIST", list.payloads.len());
        }
        // Sets knobs in its own namespace.
        "set" => {
            say(
                "SET_WMEM",
                end_name(c.set(None, "wmem", args[0].parse().unwrap())),
            );
            say("HS_ON", end_name(c.smc(SmcCmd::EnableHsLimitation).end));
            say("WMEM", c.num(None, "wmem"));
        }
        // Reads knobs of its own namespace.
        "get" => {
            say("WMEM", c.num(None, "wmem"));
            say("RMEM", c.num(None, "rmem"));
            let hs = c.smc(SmcCmd::DumpHsLimitation).payloads[0].hs_limitation();
            say("HS", hs.unwrap());
        }
        r => panic!("unknown role {r}"),
    }
}

// ------------------------------------------------------------------------------------------
// Tests.

#[test]
fn families_resolve_by_name() {
    let smcd = Smcd::start(BINS);
    let mut c = Ctl::connect(&smcd.socket);
    assert_eq!(c.resolve("SMC_GEN_NETLINK"), Ok(SMC));
    assert_eq!(c.resolve("SMCD_ENGINE"), Ok(ENGINE));
    assert_eq!(c.resolve("SMCD_LOOPBACK"), Ok(0x22));
    assert_eq!(c.resolve("nlctrl"), Ok(NLCTRL));
    assert_eq!(c.resolve("SMC_PNETID"), Err(-libc::ENOENT));
    let r = c.doit(NLCTRL, CtrlMessage::get_family_by_id(SMC));
    let f = FamilyInfo::from_reply(&r.payloads[0]).unwrap();
    assert_eq!(f, FamilyInfo::smc_gen_netlink(SMC));
    assert_eq!(f.ops.len(), 18);
}

#[test]
fn every_smc_command() {
    let smcd = Smcd::start(BINS);
    let mut c = Ctl::connect(&smcd.socket);
    let info = c.smc(SmcCmd::GetSysInfo).payloads[0].sys_info().unwrap();
    assert_eq!((info.ver, info.rel, info.is_ism_v2), (2, 1, true));
    let seid = info.seid.clone().unwrap();
    assert!(seid.starts_with("SMCD-USERSPACE-SEID-"), "{seid}");
    assert_eq!(
        info.local_host.unwrap(),
        rustix::system::uname().nodename().to_string_lossy()
    );
    let dev = c.smc(SmcCmd::GetDevSmcd);
    assert_eq!(dev.end, DONE);
    let dev = dev.payloads[0].dev_smcd().unwrap();
    assert_eq!(dev.pci_id.as_deref(), Some("loopback-ism"));
    assert_eq!(
        (dev.pci_chid, dev.use_cnt, dev.is_crit),
        (Some(0xffff), Some(0), false)
    );
    for cmd in [
        SmcCmd::GetLgrSmcr,
        SmcCmd::GetLinkSmcr,
        SmcCmd::GetDevSmcr,
        SmcCmd::GetLgrSmcd,
        SmcCmd::GetFbackStats,
        SmcCmd::DumpUeid,
    ] {
        let r = c.smc(cmd);
        assert_eq!((r.payloads.len(), r.end), (0, DONE), "{cmd:?}");
    }
    let st = c.smc(SmcCmd::GetStats).payloads[0].stats().unwrap();
    assert_eq!(st.smcd.clnt_v2_succ + st.smcd.srv_v2_succ, 0);
    // EIDs.
    let s = c.smc(SmcCmd::DumpSeid).payloads[0].seid().unwrap();
    assert_eq!((s.seid.as_str(), s.enabled), (seid.as_str(), true));
    assert_eq!(c.smc(SmcCmd::DisableSeid).end, err(libc::ENOENT));
    let u = Ueid::new("SMCD-TEST.1").unwrap();
    assert_eq!(c.doit(SMC, SmcGenlMessage::add_ueid(&u)).end, ACK);
    assert_eq!(
        c.doit(SMC, SmcGenlMessage::add_ueid(&u)).end,
        err(libc::EEXIST)
    );
    let list = c.smc(SmcCmd::DumpUeid);
    assert_eq!(list.payloads[0].ueid(), Some(Ok(u)));
    assert_eq!(c.smc(SmcCmd::DisableSeid).end, ACK);
    assert!(!c.smc(SmcCmd::DumpSeid).payloads[0].seid().unwrap().enabled);
    assert_eq!(c.smc(SmcCmd::EnableSeid).end, ACK);
    assert_eq!(c.smc(SmcCmd::DisableSeid).end, ACK);
    assert_eq!(
        c.doit(SMC, SmcGenlMessage::remove_ueid(&u)).end,
        err(libc::EAGAIN),
        "removing the last UEID re-enables the SEID"
    );
    assert!(c.smc(SmcCmd::DumpSeid).payloads[0].seid().unwrap().enabled);
    assert_eq!(
        c.doit(SMC, SmcGenlMessage::remove_ueid(&u)).end,
        err(libc::ENOENT)
    );
    for i in 0..4 {
        let u = Ueid::new(&format!("U{i}")).unwrap();
        assert_eq!(c.doit(SMC, SmcGenlMessage::add_ueid(&u)).end, ACK);
    }
    let fifth = Ueid::new("U5").unwrap();
    assert_eq!(
        c.doit(SMC, SmcGenlMessage::add_ueid(&fifth)).end,
        err(libc::ERANGE)
    );
    assert_eq!(c.smc(SmcCmd::FlushUeid).end, ACK);
    assert!(c.smc(SmcCmd::DumpUeid).payloads.is_empty());
    // Handshake limitation = the namespace's limit_smc_hs.
    let hs = |c: &mut Ctl| c.smc(SmcCmd::DumpHsLimitation).payloads[0].hs_limitation();
    assert_eq!(hs(&mut c), Some(false));
    assert_eq!(c.smc(SmcCmd::EnableHsLimitation).end, ACK);
    assert_eq!(hs(&mut c), Some(true));
    assert_eq!(c.num(None, "limit_smc_hs"), 1);
    assert_eq!(c.set(None, "limit_smc_hs", 0), ACK);
    assert_eq!(hs(&mut c), Some(false));
    assert_eq!(c.smc(SmcCmd::EnableHsLimitation).end, ACK);
    assert_eq!(c.smc(SmcCmd::DisableHsLimitation).end, ACK);
    assert_eq!(hs(&mut c), Some(false));
}

/// A listener takes the namespace's `limit_smc_hs` when it listens, as the kernel copies the
/// sysctl into the socket at creation: a change afterwards applies to later listeners only.
/// Each listener is the first thing a fresh engine does, as in a freshly started server.
#[test]
fn listener_takes_limit_smc_hs_when_it_listens() {
    let smcd = Smcd::start(BINS);
    let mut c = Ctl::connect(&smcd.socket);
    assert_eq!(c.smc(SmcCmd::EnableHsLimitation).end, ACK);
    let on = common::listen(&smcd.engine());
    assert!(on.limit_hs(), "listener created while limit_smc_hs = 1");
    assert_eq!(c.smc(SmcCmd::DisableHsLimitation).end, ACK);
    let off = common::listen(&smcd.engine());
    assert!(!off.limit_hs(), "listener created while limit_smc_hs = 0");
    assert!(on.limit_hs(), "an existing listener keeps its setting");
    // The per-listener option overrides the namespace either way.
    let forced = smc_tests::local_listener(&smcd.engine(), 16, true);
    assert!(forced.limit_hs());
}

#[test]
fn engine_family_commands() {
    let smcd = Smcd::start(BINS);
    let mut c = Ctl::connect(&smcd.socket);
    let list = c.dump(ENGINE, EngineMessage::sysctl_list(None));
    assert_eq!(list.end, DONE);
    let names: Vec<_> = list
        .payloads
        .iter()
        .map(|m| m.sysctl().unwrap().name)
        .collect();
    for n in [
        "autocorking_size",
        "smcr_buf_type",
        "smcr_testlink_time",
        "wmem",
        "rmem",
        "smcr_max_links_per_lgr",
        "smcr_max_conns_per_lgr",
        "smcr_max_send_wr",
        "smcr_max_recv_wr",
        "limit_smc_hs",
        "hs_ctrl",
        "autosplit_size",
        "busy_poll_us",
        "lgr_idle_time",
        "tx_chunk",
        "wnd_update_rule",
    ] {
        assert!(names.iter().any(|x| x == n), "{n} missing");
    }
    for m in &list.payloads {
        let s = m.sysctl().unwrap();
        assert!(
            s.description.is_some() && s.kind.is_some() && s.default.is_some(),
            "{s:?}"
        );
    }
    // Set, get, range checks with the old value kept.
    assert_eq!(c.set(None, "smcr_max_conns_per_lgr", 16), ACK);
    assert_eq!(c.set(None, "smcr_max_conns_per_lgr", 15), err(libc::EINVAL));
    assert_eq!(
        c.set(None, "smcr_max_conns_per_lgr", 256),
        err(libc::EINVAL)
    );
    assert_eq!(c.num(None, "smcr_max_conns_per_lgr"), 16);
    assert_eq!(c.set(None, "tx_chunk", 100), err(libc::EINVAL));
    assert_eq!(c.set(None, "nosuch", 1), err(libc::ENOENT));
    let hs = |v: &str| EngineMessage::sysctl_set(None, "hs_ctrl", SysctlValue::Str(v.into()));
    assert_eq!(c.doit(ENGINE, hs("prog")).end, err(libc::EINVAL));
    assert_eq!(c.doit(ENGINE, hs("")).end, ACK);
    // Namespace list holds ours once smcd has state for it.
    let ns = c.dump(ENGINE, EngineMessage::netns_list());
    assert!(
        ns.payloads
            .iter()
            .any(|m| m.netns_entry().unwrap().inode == own_netns())
    );
    // No engines: no sockets; stats reset acknowledged.
    assert!(c.sockets(None).is_empty());
    assert_eq!(
        c.doit(ENGINE, EngineMessage::stats_reset(None, None)).end,
        ACK
    );
    // Selectors naming nothing.
    for sel in [
        NetnsSelector::Inode(12345),
        NetnsSelector::Pid(u32::MAX - 1),
        NetnsSelector::Path("/nonexistent".into()),
        NetnsSelector::Name("smcd-test-missing".into()),
    ] {
        assert_eq!(
            c.sysctl(Some(&sel), "wmem").err(),
            Some(-libc::ENOENT),
            "{sel:?}"
        );
    }
    assert_eq!(
        c.sysctl(Some(&NetnsSelector::Path("/etc/hostname".into())), "wmem")
            .err(),
        Some(-libc::EINVAL)
    );
}

#[test]
fn unprivileged_callers_may_only_look() {
    let smcd = Smcd::start(BINS);
    let kv = child(&smcd, common::AS_NOBODY, "nobody", &[]);
    assert_eq!(kv["UID"], "65534");
    for k in ["SYSINFO", "STATS", "UEIDS"] {
        assert_eq!(kv[k], "DONE", "{k}");
    }
    for k in [
        "ADD_UEID",
        "FLUSH_UEID",
        "ENABLE_SEID",
        "HS_ON",
        "SET_WMEM",
        "RESET",
    ] {
        assert_eq!(kv[k], format!("E{}", libc::EPERM), "{k}");
    }
    assert_eq!(kv["WMEM"], "65536");
    assert!(kv["LIST"].parse::<usize>().unwrap() >= 16);
    // Nothing changed.
    let mut c = Ctl::connect(&smcd.socket);
    assert_eq!(c.num(None, "wmem"), 65536);
    assert!(c.smc(SmcCmd::DumpUeid).payloads.is_empty());
}

#[test]
fn admin_group_may_change_state() {
    let smcd = Smcd::start_with(BINS, &["--admin-group", "4321"]);
    let kv = child(
        &smcd,
        &[
            "setpriv", "--reuid", "65534", "--regid", "65534", "--groups", "4321",
        ],
        "nobody",
        &[],
    );
    assert_eq!(kv["SET_WMEM"], "ACK");
    assert_eq!(kv["ADD_UEID"], "ACK");
    let mut c = Ctl::connect(&smcd.socket);
    assert_eq!(c.num(None, "wmem"), 32768);
}

/// Deletes an `ip netns` namespace when dropped.
struct NamedNetns(String);

impl NamedNetns {
    fn new() -> NamedNetns {
        Self::tagged("")
    }

    fn tagged(tag: &str) -> NamedNetns {
        let name = format!("smcd-test-{}{tag}", std::process::id());
        let st = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .unwrap();
        assert!(st.success(), "ip netns add {name}");
        NamedNetns(name)
    }
}

impl Drop for NamedNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

#[test]
fn namespaces_are_separate() {
    let smcd = Smcd::start(BINS);
    let mut c = Ctl::connect(&smcd.socket);
    let mine = own_netns();
    // A child in a fresh namespace changes its knobs... The namespace is kept until the end:
    // smcd keys namespaces by inode, and a namespace that died could hand its inode (and so
    // its knobs) to the named one below (see the issue-10 note: smcd forgets no namespace).
    let first = NamedNetns::tagged("-a");
    let kv = child(&smcd, &["ip", "netns", "exec", &first.0], "set", &["32768"]);
    let other: u64 = kv["NETNS"].parse().unwrap();
    assert_ne!(other, mine);
    assert_eq!(
        (kv["SET_WMEM"].as_str(), kv["HS_ON"].as_str()),
        ("ACK", "ACK")
    );
    assert_eq!(kv["WMEM"], "32768");
    // ...ours are untouched, and smcd still knows the other one by inode.
    assert_eq!(c.num(None, "wmem"), 65536);
    assert_eq!(
        c.smc(SmcCmd::DumpHsLimitation).payloads[0].hs_limitation(),
        Some(false)
    );
    let by_inode = NetnsSelector::Inode(other);
    assert_eq!(c.num(Some(&by_inode), "wmem"), 32768);
    assert_eq!(c.num(Some(&by_inode), "limit_smc_hs"), 1);
    let list = c.dump(ENGINE, EngineMessage::netns_list());
    let inodes: Vec<_> = list
        .payloads
        .iter()
        .map(|m| m.netns_entry().unwrap().inode)
        .collect();
    assert!(
        inodes.contains(&mine) && inodes.contains(&other),
        "{inodes:?}"
    );

    // A named namespace, set from outside by name and read from inside.
    let named = NamedNetns::new();
    let sel = NetnsSelector::Name(named.0.clone());
    assert_eq!(c.set(Some(&sel), "rmem", 131072), ACK);
    assert_eq!(c.num(Some(&sel), "rmem"), 131072);
    let path = NetnsSelector::Path(format!("/run/netns/{}", named.0));
    assert_eq!(c.num(Some(&path), "rmem"), 131072);
    assert_eq!(c.num(None, "rmem"), 65536);
    let kv = child(&smcd, &["ip", "netns", "exec", &named.0], "get", &[]);
    assert_eq!(
        (kv["RMEM"].as_str(), kv["WMEM"].as_str(), kv["HS"].as_str()),
        ("131072", "65536", "false")
    );
    let list = c.dump(ENGINE, EngineMessage::netns_list());
    let entry = list
        .payloads
        .iter()
        .map(|m| m.netns_entry().unwrap())
        .find(|n| n.name.as_deref() == Some(named.0.as_str()))
        .expect("named namespace listed");
    assert_eq!(entry.inode.to_string(), kv["NETNS"]);
    drop(named);
}

/// Registers like an engine (HELLO with a status area) and returns the area; the channel
/// must stay open for the session to live.
fn fake_engine(smcd: &Smcd) -> (Channel, std::sync::Arc<StatusArea>) {
    let (area, fd) = StatusArea::shared().unwrap();
    let mut ch = Channel::connect(&smcd.socket).unwrap();
    ch.request(
        LoopbackMessage::new(
            LoopbackCmd::Hello,
            vec![
                LoopbackAttr::Version(1),
                LoopbackAttr::Pid(std::process::id()),
                LoopbackAttr::SessionKey(0x5eed),
                LoopbackAttr::Netns(own_netns()),
            ],
        ),
        &[fd.as_fd()],
    )
    .unwrap();
    (ch, area)
}

#[test]
fn status_areas_over_the_socket() {
    let smcd = Smcd::start(BINS);
    let (ch, area) = fake_engine(&smcd);
    let g = area.lgr_slot();
    g.publish(&LgrRecord {
        id: 7,
        version: 2,
        release: 1,
        os: 2,
        conns: 1,
        gid: 1 << 64 | 2,
        peer_gid: 3 << 64 | 4,
        sndbuf: 16384,
        dmb: 65536,
        peer_host: "there".into(),
        eid: "EID".into(),
        smcr: None,
        ..LgrRecord::default()
    });
    let conn = area.conn_slot();
    conn.publish(&ConnIdentity {
        state: 1,
        mode: 2,
        local: Some("[::1]:1000".parse().unwrap()),
        peer: Some("[::1]:2000".parse().unwrap()),
        inode: 99,
        lgr: 7,
        rmbe: 65536,
        peer_rmbe: 65536,
        sndbuf: 65504,
        ..ConnIdentity::default()
    });
    conn.set_cursor(Curs::RxCons, 65504 * 2 + 1);
    let lst = area.listener_slot();
    lst.publish(&LstRecord {
        addr: "[::]:2000".parse().unwrap(),
        inode: 98,
        backlog: 16,
        hs_limit: true,
    });
    area.add(T_TX_BYTES, 12345);
    area.add(T_SRV_FBACK + fback_index(ReasonCode::PEERNOSMC), 2);

    let mut c = Ctl::connect(&smcd.socket);
    let lgr = c.smc(SmcCmd::GetLgrSmcd).payloads[0].lgr_smcd().unwrap();
    assert_eq!(
        (lgr.id, lgr.gid, lgr.ext_gid, lgr.dmb_alloc),
        (7, 1, Some(2), Some(65536))
    );
    let dev = c.smc(SmcCmd::GetDevSmcd).payloads[0].dev_smcd().unwrap();
    assert_eq!(dev.use_cnt, Some(1));
    let socks = c.sockets(None);
    assert_eq!(socks.len(), 2);
    assert_eq!((socks[0].state, socks[0].inode), (10, 98));
    let s = &socks[1];
    assert_eq!(
        (s.mode, s.inode, s.peer),
        (DiagMode::Smcd, 99, Some("[::1]:2000".parse().unwrap()))
    );
    let ci = s.conn.unwrap();
    assert_eq!((ci.rx_cons.wrap, ci.rx_cons.count), (2, 1));
    let st = c.smc(SmcCmd::GetStats).payloads[0].stats().unwrap();
    assert_eq!(st.smcd.tx_bytes, 12345);
    let fb = c.smc(SmcCmd::GetFbackStats).payloads[0]
        .fback_stats()
        .unwrap();
    assert_eq!(
        (fb.rsn_code, fb.rsn_cnt, fb.srv_cnt),
        (ReasonCode::PEERNOSMC.0, 2, Some(2))
    );
    // The engine goes away: its counters stay with the namespace, its objects do not.
    drop((g, conn, lst));
    drop(ch);
    assert!(eventually(Duration::from_secs(5), || c
        .sockets(None)
        .is_empty()));
    let st = c.smc(SmcCmd::GetStats).payloads[0].stats().unwrap();
    assert_eq!(st.smcd.tx_bytes, 12345);
    assert!(c.smc(SmcCmd::GetLgrSmcd).payloads.is_empty());
}

#[test]
fn bad_input_gets_errors_and_smcd_keeps_serving() {
    let smcd = Smcd::start(BINS);
    let mut c = Ctl::connect(&smcd.socket);
    let mut rng = common::Rng::new(common::Rng::seed());
    let mut req = |family: u16, cmd: u8, flags: u16, attrs: &[u8]| {
        let len = 20 + attrs.len();
        let mut b = Vec::new();
        b.extend_from_slice(&(len as u32).to_ne_bytes());
        b.extend_from_slice(&family.to_ne_bytes());
        b.extend_from_slice(&flags.to_ne_bytes());
        b.extend_from_slice(&1u32.to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes());
        b.extend_from_slice(&[cmd, 1, 0, 0]);
        b.extend_from_slice(attrs);
        c.send_raw(&b);
        c.collect::<SmcGenlMessage>().end
    };
    let dump = NLM_F_REQUEST | NLM_F_DUMP;
    assert_eq!(req(0x7777, 1, dump, &[]), err(libc::ENOENT));
    assert_eq!(req(SMC, 200, dump, &[]), err(libc::EOPNOTSUPP));
    assert_eq!(
        req(SMC, 1, dump, &[8, 0, 1, 0, 0, 0, 0, 0]),
        err(libc::EINVAL)
    );
    assert_eq!(
        req(ENGINE, 2, NLM_F_REQUEST | NLM_F_ACK, &[4, 0, 3, 0]),
        err(libc::EINVAL)
    );
    assert_eq!(req(ENGINE, 1, dump, &[0xff, 0xff, 1, 0]), err(libc::EINVAL));
    // Records that are not netlink at all, and one that is cut by the kernel.
    for junk in [&[1u8][..], &[0; 15], &[0xff; 16]] {
        c.send_raw(junk);
        assert_eq!(
            c.collect::<SmcGenlMessage>().end,
            err(libc::EINVAL),
            "{junk:?}"
        );
    }
    c.send_raw(&vec![0u8; MAX_RECORD + 100]);
    assert_eq!(c.collect::<SmcGenlMessage>().end, err(libc::EMSGSIZE));
    // Random bytes: whatever comes back frames, and the daemon stays up.
    for _ in 0..300 {
        let n = rng.range(1, 300);
        let mut b: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
        if b.len() >= 20 && rng.range(0, 1) == 0 {
            b[0..4].copy_from_slice(&(n as u32).to_ne_bytes());
            b[4..6].copy_from_slice(&[0x20u16, 0x21, 0x10][rng.range(0, 2)].to_ne_bytes());
            b[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
        }
        if b.len() >= 6 && b[4..6] == 0x22u16.to_ne_bytes() {
            continue; // the loopback family is the engines'
        }
        c.send_raw(&b);
        let _ = c.recv_messages_nowait();
    }
    let mut fresh = Ctl::connect(&smcd.socket);
    assert_eq!(fresh.smc(SmcCmd::GetSysInfo).end, DONE);
}

impl Ctl {
    /// Drains whatever replies are queued (random requests may get none).
    fn recv_messages_nowait(&mut self) -> usize {
        let mut n = 0;
        while let Ok((len, _)) =
            channel::recv_record(self.sock.as_fd(), &mut self.buf, RecvFlags::DONTWAIT)
        {
            if len == 0 {
                break;
            }
            assert!(split_messages(&self.buf[..len]).is_ok());
            n += 1;
        }
        n
    }
}

#[test]
fn many_clients_and_one_that_never_reads() {
    common::raise_nofile();
    let smcd = Smcd::start(BINS);
    // Thousands of idle connections.
    let idle: Vec<Ctl> = (0..2000).map(|_| Ctl::connect(&smcd.socket)).collect();
    // A client that sends dumps and never reads its replies.
    let hog = Ctl::connect(&smcd.socket);
    let dump = framing::to_bytes(&framing::message(
        ENGINE,
        EngineMessage::sysctl_list(None),
        NLM_F_REQUEST | NLM_F_DUMP,
        1,
        0,
    ))
    .unwrap();
    rustix::net::sockopt::set_socket_timeout(
        &hog.sock,
        rustix::net::sockopt::Timeout::Send,
        Some(Duration::from_millis(200)),
    )
    .unwrap();
    let mut sent = 0;
    while sent < 5000 {
        if channel::send_record(hog.sock.as_fd(), &dump, &[]).is_err() {
            break; // dropped by smcd, or our send buffer is full
        }
        sent += 1;
    }
    // Everyone else is still served, promptly.
    let mut c = Ctl::connect(&smcd.socket);
    for _ in 0..20 {
        assert_eq!(c.smc(SmcCmd::GetSysInfo).end, DONE);
    }
    for (i, mut x) in idle.into_iter().enumerate().step_by(97) {
        assert_eq!(x.smc(SmcCmd::DumpHsLimitation).end, DONE, "client {i}");
    }
    drop(hog);
    assert_eq!(c.smc(SmcCmd::GetStats).end, DONE);
}

/// With real engines: connections, link groups and counters appear in the dumps.
#[test]
fn real_connections_show_up() {
    use smcd_engine::{SmcListener, SmcStream};
    use std::io::{Read, Write};
    let smcd = Smcd::start(BINS);
    let engine = smcd.engine();
    let l = SmcListener::bind_with(&engine, "127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let a = SmcStream::connect_with(&engine, ("127.0.0.1", port)).unwrap();
    let (b, _) = l.accept().unwrap();
    assert!(a.is_smc());
    // More than a DMB holds: the reader must run while the writer writes.
    let w = a.try_clone().unwrap();
    let writer = std::thread::spawn(move || (&w).write_all(&[7u8; 100_000]));
    let mut got = vec![0u8; 100_000];
    (&b).read_exact(&mut got).unwrap();
    writer.join().unwrap().unwrap();
    // A fallback: an SMC client of a plain TCP server.
    let plain = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let t = SmcStream::connect_with(&engine, plain.local_addr().unwrap()).unwrap();
    assert!(!t.is_smc());
    let mut c = Ctl::connect(&smcd.socket);
    let socks = c.sockets(None);
    let smc: Vec<_> = socks.iter().filter(|s| s.mode == DiagMode::Smcd).collect();
    assert_eq!(smc.len(), 2, "{socks:?}");
    let me = std::process::id();
    for s in &smc {
        assert_eq!((s.state, s.uid, s.pid), (1, 0, Some(me)));
        assert_ne!(s.inode, 0);
        assert!(s.smcd.is_some() && s.conn.is_some() && s.lgr_id.is_some());
    }
    // The writer's producer cursor and the reader's view of it agree: 100000 bytes.
    let ring = u64::from(smc[0].conn.unwrap().rmbe_size);
    let pos = |c: smc_proto::netlink::engine::Cursor| u64::from(c.wrap) * ring + u64::from(c.count);
    let client = smc
        .iter()
        .find(|s| s.role == Some(0))
        .unwrap()
        .conn
        .unwrap();
    let server = smc
        .iter()
        .find(|s| s.role == Some(1))
        .unwrap()
        .conn
        .unwrap();
    assert_eq!(pos(client.tx_prod), 100_000);
    assert_eq!(pos(server.rx_prod), 100_000);
    assert!(
        socks
            .iter()
            .any(|s| s.state == 10 && s.local.map(|a| a.port()) == Some(port))
    );
    let tcp = socks
        .iter()
        .find(|s| s.mode == DiagMode::Tcp)
        .expect("fallback socket");
    assert_eq!(tcp.fallback_reason, ReasonCode::PEERNOSMC.0);
    let lgrs: Vec<_> = c
        .smc(SmcCmd::GetLgrSmcd)
        .payloads
        .iter()
        .map(|m| m.lgr_smcd().unwrap())
        .collect();
    assert_eq!(lgrs.len(), 2, "client and server link groups: {lgrs:?}");
    for s in &smc {
        assert!(lgrs.iter().any(|g| Some(g.id) == s.lgr_id));
    }
    let st = c.smc(SmcCmd::GetStats).payloads[0].stats().unwrap();
    assert!(st.smcd.tx_bytes >= 100_000, "{st:?}");
    assert_eq!(st.smcd.clnt_v2_succ + st.smcd.clnt_v1_succ, 1);
    assert_eq!(st.smcd.srv_v2_succ + st.smcd.srv_v1_succ, 1);
    let fb = c.fallbacks();
    assert!(
        fb.iter()
            .any(|f| !f.is_server && f.rsn_code == ReasonCode::PEERNOSMC.0),
        "{fb:?}"
    );
    let ns = c.dump(ENGINE, EngineMessage::netns_list());
    let mine = ns
        .payloads
        .iter()
        .map(|m| m.netns_entry().unwrap())
        .find(|n| n.inode == own_netns())
        .unwrap();
    assert_eq!((mine.sock_cnt, mine.listen_cnt), (4, 1));
    // Closed connections leave the socket dump; their bytes stay counted.
    drop((a, b, t));
    assert!(eventually(Duration::from_secs(10), || {
        c.sockets(None).iter().all(|s| s.state == 10)
    }));
    let st = c.smc(SmcCmd::GetStats).payloads[0].stats().unwrap();
    assert!(st.smcd.tx_bytes >= 100_000);
}

/// A connect that is the first thing an engine does (a client process making one connection)
/// is counted where smcd sees it, SMC-D or fallback: it opens the device on the way.
#[test]
fn first_connect_of_an_engine_is_counted() {
    use smcd_engine::{SmcListener, SmcStream};
    let smcd = Smcd::start(BINS);
    let l = SmcListener::bind_with(&smcd.engine(), "127.0.0.1:0").unwrap();
    let a = SmcStream::connect_with(&smcd.engine(), l.local_addr().unwrap()).unwrap();
    let (b, _) = l.accept().unwrap();
    assert!(a.is_smc() && b.is_smc());
    let plain = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let t = SmcStream::connect_with(&smcd.engine(), plain.local_addr().unwrap()).unwrap();
    assert!(!t.is_smc());
    let mut c = Ctl::connect(&smcd.socket);
    let st = c.smc(SmcCmd::GetStats).payloads[0].stats().unwrap();
    assert_eq!(st.smcd.clnt_v2_succ, 1, "{st:?}");
    assert_eq!(st.smcd.srv_v2_succ, 1, "{st:?}");
    let fb = c.fallbacks();
    assert!(
        fb.iter()
            .any(|f| !f.is_server && f.rsn_code == ReasonCode::PEERNOSMC.0 && f.rsn_cnt == 1),
        "{fb:?}"
    );
}

/// CPU ticks (user + system) a process has used.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// Kills a process when dropped (a failing test must not leave its daemon behind).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Out of descriptors: smcd keeps serving the clients it has, does not spin on the listening
/// socket, and takes the waiting clients as others leave.
#[test]
fn out_of_descriptors() {
    let dir = std::env::temp_dir().join(format!("smcd-nofile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("smcd.sock");
    let daemon = KillOnDrop(
        Command::new("prlimit")
            .arg("--nofile=40:40")
            .arg(env!("CARGO_BIN_EXE_smcd"))
            .arg("--socket")
            .arg(&socket)
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(eventually(Duration::from_secs(10), || socket.exists()));
    let mut clients: Vec<Ctl> = (0..80).map(|_| Ctl::connect(&socket)).collect();
    assert_eq!(clients[0].smc(SmcCmd::GetSysInfo).end, DONE);
    // The waiting clients cost no CPU (a spinning daemon would use ~100 ticks a second).
    let before = cpu_ticks(daemon.0.id());
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        cpu_ticks(daemon.0.id()) - before < 50,
        "smcd spins at its descriptor limit"
    );
    // Everyone else leaves; the last one to connect is taken and answered.
    let mut last = clients.pop().unwrap();
    drop(clients);
    assert_eq!(last.smc(SmcCmd::GetSysInfo).end, DONE);
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 10, item 5: smcd's socket file appears only once it listens. It used to bind, set
/// the permissions and then listen, so a client that saw the file and connected at once got
/// `ECONNREFUSED` (five of 25 runs of some tests failed that way beside two CPU hogs). The
/// window is a few microseconds, so the test widens it: smcd runs under `strace`, which holds
/// every `listen` call for 300 ms before it enters the kernel; a client that connects as soon
/// as the file exists must be accepted.
#[test]
fn socket_file_appears_only_when_listening() {
    if common::skip_unless_tool("socket_file_appears_only_when_listening", "strace") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("smcd-listen-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("smcd.sock");
    for round in 0..3 {
        let daemon = StraceOnDrop(
            Command::new("strace")
                .args(["-f", "-qq", "-o", "/dev/null", "-e", "trace=listen"])
                .args(["-e", "inject=listen:delay_enter=300000"])
                .arg(env!("CARGO_BIN_EXE_smcd"))
                .arg("--socket")
                .arg(&socket)
                .env("RUST_LOG", "error")
                .stdin(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        assert!(
            eventually(Duration::from_secs(20), || socket.exists()),
            "smcd did not create its socket"
        );
        let sock = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        let r = rustix::net::connect(&sock, &SocketAddrUnix::new(&socket).unwrap());
        assert!(
            r.is_ok(),
            "round {round}: connect as soon as the file exists: {r:?}"
        );
        drop(sock);
        drop(daemon);
        // The killed daemon leaves its file behind; the next one must not be taken for it.
        let _ = std::fs::remove_file(&socket);
    }
    // No temporary names are left behind (smcd removes its socket when it exits cleanly).
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A `strace` whose tracee is killed with it (strace killed alone detaches and leaves it).
struct StraceOnDrop(std::process::Child);

impl Drop for StraceOnDrop {
    fn drop(&mut self) {
        let pid = self.0.id();
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        for child in children
            .split_whitespace()
            .filter_map(|c| c.parse::<i32>().ok())
        {
            if let Some(p) = rustix::process::Pid::from_raw(child) {
                let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
            }
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
