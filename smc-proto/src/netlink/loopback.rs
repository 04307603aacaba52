//! The `SMCD_LOOPBACK` generic-netlink family: the device channel between an engine (a process
//! that links `smcd-engine`) and the `smcd` daemon that owns the loopback ISM device.
//!
//! In the kernel, `net/smc/smc_loopback.c` is called through the `smcd_ops` table (register,
//! attach, unregister DMB, move data) and `af_smc.c` learns about SMC-capable peers from the TCP
//! option in the SYN. User space has neither, so an engine asks `smcd` over its control socket:
//! this family carries those requests. It is not a kernel format and has no kernel numbering to
//! respect; it lives here so every message on the daemon's socket uses one framing (netlink +
//! genetlink + attributes) and one set of fuzzed decoders.
//!
//! File descriptors (DMB memory, doorbells, a listener's status page) travel as `SCM_RIGHTS`
//! beside the message; each command's doc says which and in what order.
//!
//! The daemon serves this family under the fixed id [`LOOPBACK_FAMILY_ID`] (it also answers
//! `CTRL_CMD_GETFAMILY` for it by name), so an engine needs no resolution round trip.

use netlink_packet_core::{
    DecodeError, DefaultNla, Emitable, NLA_F_NESTED, Nla, NlaBuffer, NlasIterator, Parseable,
    ParseableParametrized,
};
use netlink_packet_generic::{GenlFamily, GenlHeader};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Family name, as resolved through nlctrl.
pub const LOOPBACK_FAMILY_NAME: &str = "SMCD_LOOPBACK";
/// Family version.
pub const LOOPBACK_FAMILY_VERSION: u8 = 1;
/// The id `smcd` always serves this family under.
pub const LOOPBACK_FAMILY_ID: u16 = 0x22;

/// Commands of the `SMCD_LOOPBACK` family. Requests and their replies share the number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LoopbackCmd {
    /// Engine → smcd, do. Attrs: `Version`, `Pid`, `SessionKey`, `Netns`. Every channel of one
    /// engine sends the same `SessionKey`; the session lives until its last channel closes.
    /// The first HELLO of a session may carry one fd: the engine's status area.
    /// Reply: `Gid`, `EngineId`, `Seid`, `Hostname`, `Chid`, `Netns` (as smcd sees it); fds:
    /// the namespace's sysctl page, then the host's listener table.
    Hello,
    /// Engine → smcd, do, on a channel dedicated to one listener. Attrs: `LocalAddr`,
    /// `Backlog`, `HsLimit`. One fd: the listener's page (its congestion state).
    /// Reply: `ListenerId`. Afterwards smcd sends `Intent` and `IntentCancel` notifications on
    /// this channel; the registration ends when the channel closes.
    Listen,
    /// Engine → smcd, do: "I am about to connect from `LocalAddr` to `RemoteAddr`; may I
    /// propose SMC?" (the TCP SYN option's role). Reply: `Verdict`, `Reason`, `IntentId`.
    Connect,
    /// smcd → listener channel, notification: a client registered `RemoteAddr` (the client's
    /// address as the listener will see it) with `Gid` and `IntentId`.
    Intent,
    /// Engine → smcd, one-way: the TCP connect of `IntentId` finished (`Ok` = 1) or failed.
    IntentDone,
    /// smcd → listener channel, notification: forget the intent `IntentId`.
    IntentCancel,
    /// Engine → smcd, do: register a DMB of `Size` bytes that only `PeerGid` may attach.
    /// Reply: `Token`, `Size`; fds: the DMB memfd, then its doorbell eventfd.
    DmbRegister,
    /// Engine → smcd, do: attach the DMB `Token`. Reply: `Size`, `Gid` (the owner); fds: the
    /// memfd, then the doorbell.
    DmbAttach,
    /// Engine → smcd, one-way: the owner no longer uses DMB `Token`.
    DmbUnregister,
    /// Engine → smcd, do: the page of listener `ListenerId` (its congestion state), so a
    /// client can see without asking whether that listener takes SMC handshakes now. Reply:
    /// `ListenerId`; one fd, the page (read-only for the receiver).
    ListenerPage,
    /// A command this version does not know.
    Unknown(u8),
}

impl LoopbackCmd {
    /// The command number.
    pub fn number(self) -> u8 {
        match self {
            Self::Hello => 1,
            Self::Listen => 2,
            Self::Connect => 3,
            Self::Intent => 4,
            Self::IntentDone => 5,
            Self::IntentCancel => 6,
            Self::DmbRegister => 7,
            Self::DmbAttach => 8,
            Self::DmbUnregister => 9,
            Self::ListenerPage => 10,
            Self::Unknown(n) => n,
        }
    }
}

impl From<u8> for LoopbackCmd {
    fn from(n: u8) -> Self {
        match n {
            1 => Self::Hello,
            2 => Self::Listen,
            3 => Self::Connect,
            4 => Self::Intent,
            5 => Self::IntentDone,
            6 => Self::IntentCancel,
            7 => Self::DmbRegister,
            8 => Self::DmbAttach,
            9 => Self::DmbUnregister,
            10 => Self::ListenerPage,
            n => Self::Unknown(n),
        }
    }
}

/// What smcd answers to `Connect`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// No SMC: connect plain TCP and record `Reason` as the fallback.
    Tcp,
    /// An SMC listener expects this connection: connect and send a CLC Proposal.
    Smc,
    /// Kept as received.
    Unknown(u8),
}

impl Verdict {
    fn number(self) -> u8 {
        match self {
            Self::Tcp => 0,
            Self::Smc => 1,
            Self::Unknown(n) => n,
        }
    }
}

impl From<u8> for Verdict {
    fn from(n: u8) -> Self {
        match n {
            0 => Self::Tcp,
            1 => Self::Smc,
            n => Self::Unknown(n),
        }
    }
}

mod attr {
    pub const VERSION: u16 = 1;
    pub const PID: u16 = 2;
    pub const SESSION_KEY: u16 = 3;
    pub const NETNS: u16 = 4;
    pub const GID: u16 = 5;
    pub const ENGINE_ID: u16 = 6;
    pub const SEID: u16 = 7;
    pub const HOSTNAME: u16 = 8;
    pub const CHID: u16 = 9;
    pub const LOCAL_ADDR: u16 = 10;
    pub const REMOTE_ADDR: u16 = 11;
    pub const BACKLOG: u16 = 12;
    pub const HS_LIMIT: u16 = 13;
    pub const LISTENER_ID: u16 = 14;
    pub const VERDICT: u16 = 15;
    pub const REASON: u16 = 16;
    pub const INTENT_ID: u16 = 17;
    pub const OK: u16 = 18;
    pub const TOKEN: u16 = 19;
    pub const SIZE: u16 = 20;
    pub const PEER_GID: u16 = 21;
}

/// One attribute of the `SMCD_LOOPBACK` family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoopbackAttr {
    /// Protocol version the engine speaks (u32).
    Version(u32),
    /// The sender's process id (u32); smcd checks it against `SO_PEERCRED`.
    Pid(u32),
    /// Random per-engine key grouping the channels of one engine (u64).
    SessionKey(u64),
    /// Inode of the sender's network namespace (u64).
    Netns(u64),
    /// A 128-bit loopback GID (16 bytes, big endian: first 8 = gid, last 8 = gid_ext).
    Gid(u128),
    /// smcd's small id for an engine (u32).
    EngineId(u32),
    /// The host's system EID (string).
    Seid(String),
    /// The host name (string).
    Hostname(String),
    /// The device's CHID (u16).
    Chid(u16),
    /// A local socket address.
    LocalAddr(SocketAddr),
    /// A remote socket address.
    RemoteAddr(SocketAddr),
    /// Listen backlog (u32).
    Backlog(u32),
    /// Handshake limitation evaluated at listen (u8 0/1).
    HsLimit(bool),
    /// smcd's id for a listener (u32).
    ListenerId(u32),
    /// The answer to `Connect` (u8).
    Verdict(Verdict),
    /// A CLC reason code (u32).
    Reason(u32),
    /// smcd's id for a connect intent (u64).
    IntentId(u64),
    /// Success flag (u8 0/1).
    Ok(bool),
    /// A DMB token (u64).
    Token(u64),
    /// A DMB size in bytes (u32).
    Size(u32),
    /// The GID that may attach a DMB (16 bytes).
    PeerGid(u128),
    /// Anything else, kept as received.
    Other(DefaultNla),
}

/// Encodes a socket address as family (1: 4 or 6), reserved (1), port (2, big endian), then 4
/// or 16 address bytes.
fn sockaddr_bytes(a: &SocketAddr) -> Vec<u8> {
    let mut v = Vec::with_capacity(20);
    match a.ip() {
        IpAddr::V4(ip) => {
            v.extend_from_slice(&[4, 0]);
            v.extend_from_slice(&a.port().to_be_bytes());
            v.extend_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            v.extend_from_slice(&[6, 0]);
            v.extend_from_slice(&a.port().to_be_bytes());
            v.extend_from_slice(&ip.octets());
        }
    }
    v
}

fn parse_sockaddr(b: &[u8]) -> Result<SocketAddr, DecodeError> {
    let port = |b: &[u8]| u16::from_be_bytes([b[2], b[3]]);
    match (b.first(), b.len()) {
        (Some(4), 8) => {
            let ip = Ipv4Addr::new(b[4], b[5], b[6], b[7]);
            Ok(SocketAddr::new(ip.into(), port(b)))
        }
        (Some(6), 20) => {
            let mut o = [0u8; 16];
            o.copy_from_slice(&b[4..20]);
            Ok(SocketAddr::new(Ipv6Addr::from(o).into(), port(b)))
        }
        _ => Err(DecodeError::from(format!(
            "bad socket address attribute ({} bytes)",
            b.len()
        ))),
    }
}

fn fixed<const N: usize>(b: &[u8], what: &str) -> Result<[u8; N], DecodeError> {
    b.try_into()
        .map_err(|_| DecodeError::from(format!("{what}: need {N} bytes, got {}", b.len())))
}

fn parse_str(b: &[u8], what: &str) -> Result<String, DecodeError> {
    let b = b.strip_suffix(&[0]).unwrap_or(b);
    String::from_utf8(b.to_vec()).map_err(|_| DecodeError::from(format!("{what}: not UTF-8")))
}

impl Nla for LoopbackAttr {
    fn value_len(&self) -> usize {
        use LoopbackAttr::*;
        match self {
            Version(_) | Pid(_) | EngineId(_) | Backlog(_) | ListenerId(_) | Reason(_)
            | Size(_) => 4,
            SessionKey(_) | Netns(_) | IntentId(_) | Token(_) => 8,
            Gid(_) | PeerGid(_) => 16,
            Seid(s) | Hostname(s) => s.len() + 1,
            Chid(_) => 2,
            LocalAddr(a) | RemoteAddr(a) => sockaddr_bytes(a).len(),
            HsLimit(_) | Verdict(_) | Ok(_) => 1,
            Other(o) => o.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        use LoopbackAttr::*;
        match self {
            Version(_) => attr::VERSION,
            Pid(_) => attr::PID,
            SessionKey(_) => attr::SESSION_KEY,
            Netns(_) => attr::NETNS,
            Gid(_) => attr::GID,
            EngineId(_) => attr::ENGINE_ID,
            Seid(_) => attr::SEID,
            Hostname(_) => attr::HOSTNAME,
            Chid(_) => attr::CHID,
            LocalAddr(_) => attr::LOCAL_ADDR,
            RemoteAddr(_) => attr::REMOTE_ADDR,
            Backlog(_) => attr::BACKLOG,
            HsLimit(_) => attr::HS_LIMIT,
            ListenerId(_) => attr::LISTENER_ID,
            Verdict(_) => attr::VERDICT,
            Reason(_) => attr::REASON,
            IntentId(_) => attr::INTENT_ID,
            Ok(_) => attr::OK,
            Token(_) => attr::TOKEN,
            Size(_) => attr::SIZE,
            PeerGid(_) => attr::PEER_GID,
            Other(o) => o.kind(),
        }
    }

    fn emit_value(&self, buf: &mut [u8]) {
        use LoopbackAttr::*;
        match self {
            Version(v) | Pid(v) | EngineId(v) | Backlog(v) | ListenerId(v) | Reason(v)
            | Size(v) => buf.copy_from_slice(&v.to_ne_bytes()),
            SessionKey(v) | Netns(v) | IntentId(v) | Token(v) => {
                buf.copy_from_slice(&v.to_ne_bytes())
            }
            Gid(g) | PeerGid(g) => buf.copy_from_slice(&g.to_be_bytes()),
            Seid(s) | Hostname(s) => {
                buf[..s.len()].copy_from_slice(s.as_bytes());
                buf[s.len()] = 0;
            }
            Chid(c) => buf.copy_from_slice(&c.to_ne_bytes()),
            LocalAddr(a) | RemoteAddr(a) => buf.copy_from_slice(&sockaddr_bytes(a)),
            HsLimit(b) | Ok(b) => buf[0] = u8::from(*b),
            Verdict(v) => buf[0] = v.number(),
            Other(o) => o.emit_value(buf),
        }
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&'a T>> for LoopbackAttr {
    fn parse(nla: &NlaBuffer<&'a T>) -> Result<Self, DecodeError> {
        let v = nla.value();
        let u32v = |what| fixed::<4>(v, what).map(u32::from_ne_bytes);
        let u64v = |what| fixed::<8>(v, what).map(u64::from_ne_bytes);
        let u8v = |what| fixed::<1>(v, what).map(|b| b[0]);
        Ok(match nla.kind() & !NLA_F_NESTED {
            attr::VERSION => Self::Version(u32v("version")?),
            attr::PID => Self::Pid(u32v("pid")?),
            attr::SESSION_KEY => Self::SessionKey(u64v("session key")?),
            attr::NETNS => Self::Netns(u64v("netns")?),
            attr::GID => Self::Gid(u128::from_be_bytes(fixed::<16>(v, "gid")?)),
            attr::ENGINE_ID => Self::EngineId(u32v("engine id")?),
            attr::SEID => Self::Seid(parse_str(v, "seid")?),
            attr::HOSTNAME => Self::Hostname(parse_str(v, "hostname")?),
            attr::CHID => Self::Chid(u16::from_ne_bytes(fixed::<2>(v, "chid")?)),
            attr::LOCAL_ADDR => Self::LocalAddr(parse_sockaddr(v)?),
            attr::REMOTE_ADDR => Self::RemoteAddr(parse_sockaddr(v)?),
            attr::BACKLOG => Self::Backlog(u32v("backlog")?),
            attr::HS_LIMIT => Self::HsLimit(u8v("hs limit")? != 0),
            attr::LISTENER_ID => Self::ListenerId(u32v("listener id")?),
            attr::VERDICT => Self::Verdict(u8v("verdict")?.into()),
            attr::REASON => Self::Reason(u32v("reason")?),
            attr::INTENT_ID => Self::IntentId(u64v("intent id")?),
            attr::OK => Self::Ok(u8v("ok")? != 0),
            attr::TOKEN => Self::Token(u64v("token")?),
            attr::SIZE => Self::Size(u32v("size")?),
            attr::PEER_GID => Self::PeerGid(u128::from_be_bytes(fixed::<16>(v, "peer gid")?)),
            _ => Self::Other(DefaultNla::parse(nla)?),
        })
    }
}

/// A message of the `SMCD_LOOPBACK` family: a command and its attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopbackMessage {
    /// The command.
    pub cmd: LoopbackCmd,
    /// Its attributes, in order.
    pub attrs: Vec<LoopbackAttr>,
}

macro_rules! getter {
    ($(#[$m:meta])* $name:ident, $variant:ident, $ty:ty) => {
        $(#[$m])*
        pub fn $name(&self) -> Option<$ty> {
            self.attrs.iter().find_map(|a| match a {
                LoopbackAttr::$variant(v) => Some(v.clone()),
                _ => None,
            })
        }
    };
}

impl LoopbackMessage {
    /// A message with `cmd` and `attrs`.
    pub fn new(cmd: LoopbackCmd, attrs: Vec<LoopbackAttr>) -> Self {
        Self { cmd, attrs }
    }

    getter!(/// The `Version` attribute.
        version, Version, u32);
    getter!(/// The `Pid` attribute.
        pid, Pid, u32);
    getter!(/// The `SessionKey` attribute.
        session_key, SessionKey, u64);
    getter!(/// The `Netns` attribute.
        netns, Netns, u64);
    getter!(/// The `Gid` attribute.
        gid, Gid, u128);
    getter!(/// The `EngineId` attribute.
        engine_id, EngineId, u32);
    getter!(/// The `Seid` attribute.
        seid, Seid, String);
    getter!(/// The `Hostname` attribute.
        hostname, Hostname, String);
    getter!(/// The `Chid` attribute.
        chid, Chid, u16);
    getter!(/// The `LocalAddr` attribute.
        local_addr, LocalAddr, SocketAddr);
    getter!(/// The `RemoteAddr` attribute.
        remote_addr, RemoteAddr, SocketAddr);
    getter!(/// The `Backlog` attribute.
        backlog, Backlog, u32);
    getter!(/// The `HsLimit` attribute.
        hs_limit, HsLimit, bool);
    getter!(/// The `ListenerId` attribute.
        listener_id, ListenerId, u32);
    getter!(/// The `Verdict` attribute.
        verdict, Verdict, Verdict);
    getter!(/// The `Reason` attribute.
        reason, Reason, u32);
    getter!(/// The `IntentId` attribute.
        intent_id, IntentId, u64);
    getter!(/// The `Ok` attribute.
        ok, Ok, bool);
    getter!(/// The `Token` attribute.
        token, Token, u64);
    getter!(/// The `Size` attribute.
        size, Size, u32);
    getter!(/// The `PeerGid` attribute.
        peer_gid, PeerGid, u128);
}

impl GenlFamily for LoopbackMessage {
    fn family_name() -> &'static str {
        LOOPBACK_FAMILY_NAME
    }

    fn family_id(&self) -> u16 {
        LOOPBACK_FAMILY_ID
    }

    fn command(&self) -> u8 {
        self.cmd.number()
    }

    fn version(&self) -> u8 {
        LOOPBACK_FAMILY_VERSION
    }
}

impl Emitable for LoopbackMessage {
    fn buffer_len(&self) -> usize {
        self.attrs.as_slice().buffer_len()
    }

    fn emit(&self, buffer: &mut [u8]) {
        self.attrs.as_slice().emit(buffer)
    }
}

impl ParseableParametrized<[u8], GenlHeader> for LoopbackMessage {
    fn parse_with_param(buf: &[u8], header: GenlHeader) -> Result<Self, DecodeError> {
        let mut attrs = Vec::new();
        for nla in NlasIterator::new(buf) {
            attrs.push(LoopbackAttr::parse(&nla?)?);
        }
        Ok(Self {
            cmd: header.cmd.into(),
            attrs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::{NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload};
    use netlink_packet_generic::GenlMessage;

    fn round_trip(msg: LoopbackMessage) -> Vec<u8> {
        let mut nl = NetlinkMessage::from(GenlMessage::from_payload(msg.clone()));
        nl.header.flags = NLM_F_REQUEST;
        nl.header.sequence_number = 7;
        nl.finalize();
        let mut buf = vec![0u8; nl.buffer_len()];
        nl.serialize(&mut buf);
        let back = NetlinkMessage::<GenlMessage<LoopbackMessage>>::deserialize(&buf).unwrap();
        assert_eq!(back.header.message_type, LOOPBACK_FAMILY_ID);
        match back.payload {
            NetlinkPayload::InnerMessage(g) => assert_eq!(g.payload, msg),
            other => panic!("unexpected payload {other:?}"),
        }
        buf
    }

    #[test]
    fn connect_request_bytes() {
        let msg = LoopbackMessage::new(
            LoopbackCmd::Connect,
            vec![
                LoopbackAttr::LocalAddr("127.0.0.1:40000".parse().unwrap()),
                LoopbackAttr::RemoteAddr("127.0.0.1:5000".parse().unwrap()),
            ],
        );
        let buf = round_trip(msg);
        // nlmsghdr (16) + genlmsghdr (4) + two 12-byte attributes.
        assert_eq!(buf.len(), 16 + 4 + 12 + 12);
        assert_eq!(&buf[4..6], &LOOPBACK_FAMILY_ID.to_ne_bytes());
        assert_eq!(buf[16], 3, "command CONNECT");
        assert_eq!(buf[17], LOOPBACK_FAMILY_VERSION);
        // First attribute: len 12, type LOCAL_ADDR, family 4, port 40000 BE, 127.0.0.1.
        assert_eq!(
            &buf[20..32],
            &[12, 0, 10, 0, 4, 0, 0x9c, 0x40, 127, 0, 0, 1]
        );
    }

    #[test]
    fn every_attribute_round_trips() {
        let attrs = vec![
            LoopbackAttr::Version(1),
            LoopbackAttr::Pid(42),
            LoopbackAttr::SessionKey(u64::MAX - 3),
            LoopbackAttr::Netns(4026531840),
            LoopbackAttr::Gid(0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10),
            LoopbackAttr::EngineId(9),
            LoopbackAttr::Seid("IBM-SYSZ-ISMSEID00000000".into()),
            LoopbackAttr::Hostname("host".into()),
            LoopbackAttr::Chid(0xffff),
            LoopbackAttr::LocalAddr("[::1]:7".parse().unwrap()),
            LoopbackAttr::RemoteAddr("10.0.0.1:65535".parse().unwrap()),
            LoopbackAttr::Backlog(128),
            LoopbackAttr::HsLimit(true),
            LoopbackAttr::ListenerId(3),
            LoopbackAttr::Verdict(Verdict::Smc),
            LoopbackAttr::Verdict(Verdict::Unknown(9)),
            LoopbackAttr::Reason(0x0301_0000),
            LoopbackAttr::IntentId(77),
            LoopbackAttr::Ok(false),
            LoopbackAttr::Token(0xdead_beef_0000_0001),
            LoopbackAttr::Size(65536),
            LoopbackAttr::PeerGid(5),
            LoopbackAttr::Other(DefaultNla::new(200, vec![1, 2, 3])),
        ];
        let msg = LoopbackMessage::new(LoopbackCmd::Hello, attrs);
        round_trip(msg.clone());
        assert_eq!(msg.gid(), Some(0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10));
        assert_eq!(msg.verdict(), Some(Verdict::Smc));
        assert_eq!(msg.token(), Some(0xdead_beef_0000_0001));
    }

    #[test]
    fn bad_attributes_are_errors_not_panics() {
        for (kind, value) in [
            (attr::GID, vec![1u8; 15]),
            (attr::LOCAL_ADDR, vec![4, 0, 0, 1]),
            (attr::LOCAL_ADDR, vec![9; 8]),
            (attr::SEID, vec![0xff, 0xfe]),
            (attr::TOKEN, vec![]),
        ] {
            let attrs = [DefaultNla::new(kind, value)];
            let mut buf = vec![0u8; attrs.as_slice().buffer_len()];
            attrs.as_slice().emit(&mut buf);
            let header = GenlHeader { cmd: 1, version: 1 };
            assert!(LoopbackMessage::parse_with_param(&buf[..], header).is_err());
        }
        let _ = NetlinkHeader::default();
    }
}
