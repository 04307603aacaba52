//! `smcctl ss`: smcss over smcd's `SOCK_DUMP` (the engine family's counterpart of the
//! kernel's sock_diag for `AF_SMC`). Default: connected sockets (not LISTEN, not INIT);
//! `-a` all, `-l` listening only; `-d` the connection columns, `-D`/`-R` the SMC-D/SMC-R
//! columns (and only sockets of that kind); `-W` keeps addresses untruncated.

use std::net::SocketAddr;

use serde::Serialize;
use smc_proto::clc::ReasonCode;
use smc_proto::netlink::engine::{Cursor, DiagMode, EngineMessage, SockInfo};

use crate::cli::SsArgs;
use crate::error::Error;
use crate::fmt::{Align, gid128, json, table};
use crate::session::Session;

/// `enum smc_state` values smcss names.
pub const SMC_ACTIVE: u8 = 1;
/// Not connected yet.
pub const SMC_INIT: u8 = 2;
/// Listening.
pub const SMC_LISTEN: u8 = 10;

/// smcss' state names.
pub fn state_name(s: u8) -> String {
    match s {
        1 => "ACTIVE".to_owned(),
        2 => "INIT".to_owned(),
        7 => "CLOSED".to_owned(),
        10 => "LISTEN".to_owned(),
        20 => "PEERCLOSEWAIT1".to_owned(),
        21 => "PEERCLOSEWAIT2".to_owned(),
        22 => "APPCLOSEWAIT1".to_owned(),
        23 => "APPCLOSEWAIT2".to_owned(),
        24 => "APPFINCLOSEWAIT1".to_owned(),
        25 => "PEERFINCLOSEWAIT".to_owned(),
        26 => "PEERABORTWAIT".to_owned(),
        27 => "PROCESSABORT".to_owned(),
        x => format!("{x:#x}?"),
    }
}

/// A cursor in JSON.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct JsonCursor {
    /// Wrap count.
    pub wrap: u16,
    /// Offset.
    pub count: u32,
}

impl From<Cursor> for JsonCursor {
    fn from(c: Cursor) -> Self {
        JsonCursor {
            wrap: c.wrap,
            count: c.count,
        }
    }
}

fn cursor_text(c: &JsonCursor) -> String {
    format!("{:04x}:{:08x}", c.wrap, c.count)
}

/// Connection details (`-d`).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Conn {
    /// Connection token.
    pub token: u32,
    /// Send buffer bytes.
    pub sndbuf: u32,
    /// Own receive buffer (RMB/DMB element) bytes.
    pub rcvbuf: u32,
    /// Peer receive buffer bytes.
    pub peerbuf: u32,
    /// Producer cursor received from the peer.
    pub rx_prod: JsonCursor,
    /// Consumer cursor received from the peer.
    pub rx_cons: JsonCursor,
    /// Producer flags received.
    pub rx_prod_flags: u8,
    /// Connection state flags received.
    pub rx_conn_state_flags: u8,
    /// Producer cursor sent.
    pub tx_prod: JsonCursor,
    /// Consumer cursor sent.
    pub tx_cons: JsonCursor,
    /// Producer flags sent.
    pub tx_prod_flags: u8,
    /// Connection state flags sent.
    pub tx_conn_state_flags: u8,
    /// Send buffer: prepared.
    pub tx_prep: JsonCursor,
    /// Send buffer: sent.
    pub tx_sent: JsonCursor,
    /// Send buffer: confirmed.
    pub tx_fin: JsonCursor,
}

/// SMC-D details (`-D`); ids as 16 hex digits (32 with a 128-bit emulated-ISM GID).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Smcd {
    /// Local GID.
    pub gid: String,
    /// Own DMB token.
    pub token: String,
    /// Peer GID.
    pub peer_gid: String,
    /// Peer DMB token.
    pub peer_token: String,
    /// Link group id, 8 hex digits.
    pub linkid: String,
}

/// SMC-R details (`-R`).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Smcr {
    /// `CLNT` or `SERV`.
    pub role: String,
    /// RDMA device.
    pub ib_device: String,
    /// RDMA port.
    pub port: u8,
    /// Link id.
    pub linkid: u8,
    /// Local GID.
    pub gid: String,
    /// Peer GID.
    pub peer_gid: String,
}

/// A fallback code with its name.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Code {
    /// The `SMC_CLC_DECL_*` value (or a negative errno, as the kernel stores them).
    pub code: u32,
    /// smc-tools' name, when it has one.
    pub name: Option<String>,
}

fn code(c: u32) -> Option<Code> {
    (c != 0).then(|| Code {
        code: c,
        name: ReasonCode(c).smc_tools_name().map(str::to_owned),
    })
}

/// One socket (`--json` element).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Socket {
    /// smcss' state name.
    pub state: String,
    /// `enum smc_state` number.
    pub state_code: u8,
    /// Owner uid.
    pub uid: u32,
    /// Inode (or the engine's socket id).
    pub inode: u64,
    /// Local `address:port`.
    pub local: Option<String>,
    /// Peer `address:port`.
    pub peer: Option<String>,
    /// Interface index the socket is bound to (0: none).
    pub intf: u32,
    /// `SMCD`, `SMCR` or `TCP` (fallback).
    pub mode: String,
    /// Local fallback reason.
    pub fallback: Option<Code>,
    /// The peer's decline reason.
    pub peer_fallback: Option<Code>,
    /// Shutdown state as smcss shows it: `<->`, `R->`, `<-W`, `R-W`.
    pub shutdown: String,
    /// Owning process, when known.
    pub pid: Option<u32>,
    /// The socket's network namespace (inode).
    pub netns_inode: u64,
    /// Connection details (SMC sockets).
    pub conn: Option<Conn>,
    /// SMC-D details.
    pub smcd: Option<Smcd>,
    /// SMC-R details.
    pub smcr: Option<Smcr>,
}

fn shutdown_text(mask: u8) -> String {
    format!(
        "{}-{}",
        if mask & 1 != 0 { 'R' } else { '<' },
        if mask & 2 != 0 { 'W' } else { '>' }
    )
}

impl Socket {
    /// From a `SOCK_DUMP` reply.
    pub fn from(s: &SockInfo) -> Self {
        let mode = match s.mode {
            DiagMode::Smcd => "SMCD".to_owned(),
            DiagMode::Smcr => "SMCR".to_owned(),
            DiagMode::Tcp => "TCP".to_owned(),
            DiagMode::Unknown(x) => format!("{x:#x}?"),
        };
        let conn = s.conn.map(|c| Conn {
            token: c.token,
            sndbuf: c.sndbuf_size,
            rcvbuf: c.rmbe_size,
            peerbuf: c.peer_rmbe_size,
            rx_prod: c.rx_prod.into(),
            rx_cons: c.rx_cons.into(),
            rx_prod_flags: c.rx_prod_flags,
            rx_conn_state_flags: c.rx_conn_state_flags,
            tx_prod: c.tx_prod.into(),
            tx_cons: c.tx_cons.into(),
            tx_prod_flags: c.tx_prod_flags,
            tx_conn_state_flags: c.tx_conn_state_flags,
            tx_prep: c.tx_prep.into(),
            tx_sent: c.tx_sent.into(),
            tx_fin: c.tx_fin.into(),
        });
        let smcd = s.smcd.map(|d| Smcd {
            gid: gid128(d.gid, Some(d.gid_ext)),
            token: format!("{:016x}", d.token),
            peer_gid: gid128(d.peer_gid, Some(d.peer_gid_ext)),
            peer_token: format!("{:016x}", d.peer_token),
            linkid: format!("{:08x}", s.lgr_id.unwrap_or(0)),
        });
        let smcr = s.smcr.as_ref().map(|r| Smcr {
            role: if s.role == Some(1) { "SERV" } else { "CLNT" }.to_owned(),
            ib_device: r.ib_dev.clone(),
            port: r.ib_port,
            linkid: r.link_id,
            gid: r.gid.clone(),
            peer_gid: r.peer_gid.clone(),
        });
        Socket {
            state: state_name(s.state),
            state_code: s.state,
            uid: s.uid,
            inode: s.inode,
            local: s.local.map(|a| addr_text(&a, true)),
            peer: s.peer.map(|a| addr_text(&a, true)),
            intf: s.ifindex,
            mode,
            fallback: code(s.fallback_reason),
            peer_fallback: code(s.peer_diagnosis),
            shutdown: shutdown_text(s.shutdown),
            pid: s.pid,
            netns_inode: s.netns_inode,
            conn,
            smcd,
            smcr,
        }
    }

    fn is_tcp(&self) -> bool {
        self.mode == "TCP"
    }

    /// smcss' Mode column: `SMCD`, `SMCR`, or `TCP 0x<local>[/0x<peer>]`.
    pub fn mode_text(&self) -> String {
        if !self.is_tcp() {
            return self.mode.clone();
        }
        let mut m = "TCP".to_owned();
        if let Some(f) = &self.fallback {
            m.push_str(&format!(" 0x{:08x}", f.code));
            if let Some(p) = &self.peer_fallback {
                m.push_str(&format!("/0x{:08x}", p.code));
            }
        }
        m
    }
}

/// `address:port` (IPv6 without brackets, as smcss prints).
fn addr_text(a: &SocketAddr, _wide: bool) -> String {
    format!("{}:{}", a.ip(), a.port())
}

/// smcss' 23-character address column: a longer address is cut and marked with `..`
/// before the port.
pub fn truncate_addr(s: &str, wide: bool) -> String {
    const SHORT: usize = 23;
    if wide || s.len() <= SHORT {
        return s.to_owned();
    }
    let Some((addr, port)) = s.rsplit_once(':') else {
        return s.to_owned();
    };
    let keep = SHORT.saturating_sub(1 + port.len() + 2).min(addr.len());
    format!("{}..:{port}", &addr[..keep])
}

/// Which sockets smcss shows for these options.
pub fn wanted(s: &Socket, o: &SsArgs) -> bool {
    let state_ok = if o.listening {
        s.state_code == SMC_LISTEN
    } else {
        o.all || (s.state_code != SMC_LISTEN && s.state_code != SMC_INIT)
    };
    let mode_ok = if o.smcd {
        s.mode == "SMCD"
    } else if o.smcr {
        s.mode == "SMCR"
    } else {
        true
    };
    state_ok && mode_ok
}

/// The states to ask smcd for (`SOCK_STATES` bit mask; `None` = all).
pub fn state_mask(o: &SsArgs) -> Option<u32> {
    if o.listening {
        Some(1 << SMC_LISTEN)
    } else if o.all {
        None
    } else {
        // Every state smcss shows by default: all but INIT and LISTEN.
        Some(!((1u32 << SMC_INIT) | (1u32 << SMC_LISTEN)))
    }
}

/// The smcss table.
pub fn text(socks: &[Socket], o: &SsArgs, details: u8) -> String {
    let mut cols = vec![
        ("State", Align::Left),
        ("UID", Align::Left),
        ("Inode", Align::Left),
        ("Local Address", Align::Left),
        ("Peer Address", Align::Left),
        ("Intf", Align::Left),
        ("Mode", Align::Left),
    ];
    let d = details > 0;
    if d {
        cols.extend([
            ("Shutd", Align::Left),
            ("Token", Align::Left),
            ("Sndbuf", Align::Left),
            ("Rcvbuf", Align::Left),
            ("Peerbuf", Align::Left),
            ("rxprod-Cursor", Align::Left),
            ("rxcons-Cursor", Align::Left),
            ("rxFlags", Align::Left),
            ("txprod-Cursor", Align::Left),
            ("txcons-Cursor", Align::Left),
            ("txFlags", Align::Left),
            ("txprep-Cursor", Align::Left),
            ("txsent-Cursor", Align::Left),
            ("txfin-Cursor", Align::Left),
        ]);
    }
    if o.smcr {
        cols.extend([
            ("Role", Align::Left),
            ("IB-device", Align::Left),
            ("Port", Align::Left),
            ("Linkid", Align::Left),
            ("GID", Align::Left),
            ("Peer-GID", Align::Left),
        ]);
    }
    if o.smcd {
        cols.extend([
            ("GID", Align::Left),
            ("Token", Align::Left),
            ("Peer-GID", Align::Left),
            ("Peer-Token", Align::Left),
            ("Linkid", Align::Left),
        ]);
    }
    if o.processes {
        cols.push(("Process", Align::Left));
    }
    let rows: Vec<Vec<String>> = socks
        .iter()
        .map(|s| {
            let mut r = row(s, o, d);
            if o.processes {
                // The column is the last one: rows cut short (listeners, fallbacks) are padded.
                r.resize(cols.len() - 1, String::new());
                r.push(s.pid.map_or_else(String::new, process_text));
            }
            r
        })
        .collect();
    table(&cols, &rows)
}

/// `ss -p`'s form of the owner: `users:(("comm",pid=N))`; the pid alone when the process is
/// gone or in another pid namespace.
fn process_text(pid: u32) -> String {
    match std::fs::read_to_string(format!("/proc/{pid}/comm")) {
        Ok(c) => format!("users:((\"{}\",pid={pid}))", c.trim_end()),
        Err(_) => format!("users:((pid={pid}))"),
    }
}

fn row(s: &Socket, o: &SsArgs, d: bool) -> Vec<String> {
    let mut r = vec![
        s.state.clone(),
        format!("{:05}", s.uid),
        format!("{:07}", s.inode),
    ];
    if s.state_code == SMC_INIT {
        return r;
    }
    r.push(truncate_addr(s.local.as_deref().unwrap_or(""), o.wide));
    if s.state_code == SMC_LISTEN {
        return r;
    }
    r.push(truncate_addr(s.peer.as_deref().unwrap_or(""), o.wide));
    r.push(format!("{:04x}", s.intf));
    r.push(s.mode_text());
    if s.is_tcp() {
        return r;
    }
    if d {
        r.push(s.shutdown.clone());
        match &s.conn {
            Some(c) => r.extend([
                format!("{:08x}", c.token),
                format!("{:08x}", c.sndbuf),
                format!("{:08x}", c.rcvbuf),
                format!("{:08x}", c.peerbuf),
                cursor_text(&c.rx_prod),
                cursor_text(&c.rx_cons),
                format!("{:02x}:{:02x}", c.rx_prod_flags, c.rx_conn_state_flags),
                cursor_text(&c.tx_prod),
                cursor_text(&c.tx_cons),
                format!("{:02x}:{:02x}", c.tx_prod_flags, c.tx_conn_state_flags),
                cursor_text(&c.tx_prep),
                cursor_text(&c.tx_sent),
                cursor_text(&c.tx_fin),
            ]),
            None => r.extend(std::iter::repeat_n(String::new(), 13)),
        }
    }
    if o.smcr
        && let Some(x) = &s.smcr
    {
        r.extend([
            x.role.clone(),
            x.ib_device.clone(),
            format!("{:02x}", x.port),
            format!("{:02x}", x.linkid),
            x.gid.clone(),
            x.peer_gid.clone(),
        ]);
    }
    if o.smcd
        && let Some(x) = &s.smcd
    {
        r.extend([
            x.gid.clone(),
            x.token.clone(),
            x.peer_gid.clone(),
            x.peer_token.clone(),
            x.linkid.clone(),
        ]);
    }
    r
}

/// `--json` of `ss`.
#[derive(Debug, Clone, Serialize)]
pub struct Sockets {
    /// The sockets shown, in smcd's order.
    pub sockets: Vec<Socket>,
}

/// Runs `ss`.
pub fn run(s: &mut Session, o: &SsArgs) -> Result<String, Error> {
    let sel = s.selector();
    let socks: Vec<Socket> = s
        .engine_dump(EngineMessage::sock_dump(sel.as_ref(), state_mask(o)))
        .map_err(|f| s.refused("SMCD_ENGINE SOCK_DUMP", f))?
        .iter()
        .filter_map(EngineMessage::sock)
        .map(|i| Socket::from(&i))
        .filter(|x| wanted(x, o))
        .collect();
    Ok(if s.json {
        json(&Sockets { sockets: socks })
    } else {
        text(&socks, o, s.details)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::testutil::roundtrip_engine;
    use smc_proto::netlink::engine::{ConnInfo, SmcdSockInfo};

    fn opts() -> SsArgs {
        SsArgs {
            all: false,
            listening: false,
            smcd: false,
            smcr: false,
            wide: false,
            processes: false,
        }
    }

    fn smcd_sock() -> SockInfo {
        SockInfo {
            state: SMC_ACTIVE,
            uid: 0,
            inode: 4242,
            local: Some("127.0.0.1:5000".parse().unwrap()),
            peer: Some("127.0.0.1:40000".parse().unwrap()),
            ifindex: 0,
            mode: DiagMode::Smcd,
            shutdown: 0,
            netns_inode: 4026531840,
            pid: Some(77),
            role: Some(1),
            lgr_id: Some(0x100),
            conn: Some(ConnInfo {
                token: 5,
                sndbuf_size: 65536,
                rmbe_size: 65504,
                peer_rmbe_size: 65504,
                rx_prod: Cursor { wrap: 1, count: 16 },
                ..Default::default()
            }),
            smcd: Some(SmcdSockInfo {
                gid: 0xaa,
                gid_ext: 0,
                peer_gid: 0xbb,
                peer_gid_ext: 0,
                token: 0x1234,
                peer_token: 0x5678,
            }),
            ..Default::default()
        }
    }

    fn wire(s: &SockInfo) -> Socket {
        Socket::from(
            &roundtrip_engine(EngineMessage::sock_reply(s))
                .sock()
                .unwrap(),
        )
    }

    #[test]
    fn default_table() {
        let fb = SockInfo {
            state: SMC_ACTIVE,
            inode: 7,
            uid: 1000,
            local: Some("10.0.0.1:22".parse().unwrap()),
            peer: Some("10.0.0.2:50000".parse().unwrap()),
            mode: DiagMode::Tcp,
            fallback_reason: 0x0503_0000,
            peer_diagnosis: 0x0303_0001,
            ..Default::default()
        };
        let socks = [wire(&smcd_sock()), wire(&fb)];
        assert_eq!(
            text(&socks, &opts(), 0),
            "State   UID    Inode    Local Address   Peer Address     Intf  Mode\n\
             ACTIVE  00000  0004242  127.0.0.1:5000  127.0.0.1:40000  0000  SMCD\n\
             ACTIVE  01000  0000007  10.0.0.1:22     10.0.0.2:50000   0000  TCP 0x05030000/0x03030001\n"
        );
    }

    #[test]
    fn details_and_smcd_columns() {
        let o = SsArgs {
            smcd: true,
            ..opts()
        };
        let t = text(&[wire(&smcd_sock())], &o, 1);
        let mut lines = t.lines();
        let head = lines.next().unwrap();
        assert!(
            head.contains("Shutd  Token") && head.ends_with("Peer-Token        Linkid"),
            "{head}"
        );
        let row = lines.next().unwrap();
        assert!(
            row.contains("SMCD  <->    00000005  00010000  0000ffe0  0000ffe0  0001:00000010  "),
            "{row}"
        );
        assert!(
            row.ends_with(
                "00000000000000aa  0000000000001234  00000000000000bb  0000000000005678  00000100"
            ),
            "{row}"
        );
    }

    #[test]
    fn process_column_names_the_owner() {
        let mut s = wire(&smcd_sock());
        s.pid = Some(std::process::id());
        let o = SsArgs {
            processes: true,
            ..opts()
        };
        let t = text(&[s.clone()], &o, 0);
        let me = std::fs::read_to_string("/proc/self/comm").unwrap();
        assert!(
            t.contains(&format!(
                "users:((\"{}\",pid={}))",
                me.trim_end(),
                std::process::id()
            )),
            "{t}"
        );
        s.pid = None;
        assert!(
            text(&[s], &o, 0)
                .lines()
                .nth(1)
                .is_some_and(|l| !l.contains("users"))
        );
    }

    #[test]
    fn filters() {
        let listen = wire(&SockInfo {
            state: SMC_LISTEN,
            local: Some("0.0.0.0:5000".parse().unwrap()),
            mode: DiagMode::Smcd,
            ..Default::default()
        });
        let act = wire(&smcd_sock());
        assert!(!wanted(&listen, &opts()));
        assert!(wanted(&act, &opts()));
        let l = SsArgs {
            listening: true,
            ..opts()
        };
        assert!(wanted(&listen, &l) && !wanted(&act, &l));
        let a = SsArgs {
            all: true,
            ..opts()
        };
        assert!(wanted(&listen, &a) && wanted(&act, &a));
        assert!(!wanted(
            &act,
            &SsArgs {
                smcr: true,
                ..opts()
            }
        ));
        assert_eq!(state_mask(&l), Some(1 << 10));
        assert_eq!(state_mask(&a), None);
        assert_eq!(state_mask(&opts()).unwrap() & (1 << 2 | 1 << 10), 0);
        assert_eq!(
            text(&[listen], &l, 0).lines().nth(1).unwrap(),
            "LISTEN  00000  0000000  0.0.0.0:5000"
        );
    }

    #[test]
    fn addresses_truncate_like_smcss() {
        let long = "2001:db8:aaaa:bbbb:cccc:dddd:eeee:ffff:443";
        let t = truncate_addr(long, false);
        assert_eq!(t, "2001:db8:aaaa:bbb..:443");
        assert_eq!(t.len(), 23);
        assert_eq!(truncate_addr(long, true), long);
        assert_eq!(truncate_addr("1.2.3.4:5", false), "1.2.3.4:5");
    }

    #[test]
    fn json_schema() {
        let j: serde_json::Value = serde_json::from_str(&json(&Sockets {
            sockets: vec![wire(&smcd_sock())],
        }))
        .unwrap();
        let s = &j["sockets"][0];
        assert_eq!(s["state"], "ACTIVE");
        assert_eq!(s["mode"], "SMCD");
        assert_eq!(s["local"], "127.0.0.1:5000");
        assert_eq!(s["conn"]["rx_prod"]["wrap"], 1);
        assert_eq!(s["smcd"]["linkid"], "00000100");
        assert_eq!(s["pid"], 77);
        assert_eq!(s["fallback"], serde_json::Value::Null);
    }
}
