//! Helpers for checking our encoders against an independent decoder (tshark).
//!
//! * [`pcap`]: a hand-written pcap writer (LINKTYPE_RAW: each record is an IPv4 packet) and
//!   packet builders: RoCEv2 (IPv4/UDP 4791/InfiniBand BTH SEND-only/payload/ICRC) for SMC-R
//!   CDC and LLC, and IPv4/TCP or IPv6/TCP for CLC.
//! * [`tshark`]: runs `tshark -T pdml` once over a file, parses the PDML into packets, protocols
//!   and fields, and compares a protocol's fields against expectations.
//! * [`skip`]: what a test does when a tool or file it needs is missing (fail under `CI=true`).
//!   smc-proto cannot use the workspace's harness (`smc-tests` depends on it), so it has its own.
#![allow(dead_code)]

/// Whether this is a CI run: `CI` is set to anything but empty, `0` or `false` (CI systems
/// set `CI=true`; `.ci/run` does too).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false"))
}

/// `test` cannot run here because of `why`: under CI that fails the test (a missing tool must
/// not pass as a success); otherwise it prints `SKIPPED test: why` and the caller returns.
#[track_caller]
pub fn skip(test: &str, why: impl std::fmt::Display) {
    if in_ci() {
        panic!("{test}: {why}; under CI this fails instead of skipping (see .ci/run)");
    }
    // Straight to the descriptor: the test harness captures `eprintln!` of passing tests, and
    // a skip must be seen.
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test}: {why} (under CI=true this fails)"
    );
}

pub mod pcap {
    /// LINKTYPE_RAW: records are raw IPv4/IPv6 packets (told apart by the version nibble).
    pub const LINKTYPE_RAW: u32 = 101;
    /// RoCEv2 UDP destination port.
    pub const ROCE_V2_PORT: u16 = 4791;
    /// InfiniBand BTH opcode "RC SEND Only".
    pub const BTH_RC_SEND_ONLY: u8 = 0x04;
    /// Offset of a RoCEv2 payload inside the IPv4 packet built by [`roce_v2_send`]
    /// (IPv4 20 + UDP 8 + BTH 12).
    pub const ROCE_PAYLOAD_OFFSET: usize = 40;
    /// Offset of a TCP payload inside the IPv4 packet built by [`ipv4_tcp`] (IPv4 20 + TCP 20).
    pub const TCP_PAYLOAD_OFFSET: usize = 40;
    /// Offset of a TCP payload inside the IPv6 packet built by [`ipv6_tcp`] (IPv6 40 + TCP 20).
    pub const TCP6_PAYLOAD_OFFSET: usize = 60;

    /// A pcap file being built in memory (classic pcap, microsecond timestamps, little endian).
    pub struct PcapWriter {
        buf: Vec<u8>,
        count: u32,
    }

    impl PcapWriter {
        /// A file whose records are raw IP packets.
        pub fn new_raw_ip() -> PcapWriter {
            let mut buf = Vec::new();
            buf.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes()); // magic
            buf.extend_from_slice(&2u16.to_le_bytes()); // version major
            buf.extend_from_slice(&4u16.to_le_bytes()); // version minor
            buf.extend_from_slice(&0i32.to_le_bytes()); // thiszone
            buf.extend_from_slice(&0u32.to_le_bytes()); // sigfigs
            buf.extend_from_slice(&65535u32.to_le_bytes()); // snaplen
            buf.extend_from_slice(&LINKTYPE_RAW.to_le_bytes());
            PcapWriter { buf, count: 0 }
        }

        /// Appends one packet; timestamps are 1 s apart so frames stay in order.
        pub fn add(&mut self, packet: &[u8]) {
            self.count += 1;
            self.buf.extend_from_slice(&self.count.to_le_bytes()); // ts_sec
            self.buf.extend_from_slice(&0u32.to_le_bytes()); // ts_usec
            self.buf
                .extend_from_slice(&(packet.len() as u32).to_le_bytes()); // incl_len
            self.buf
                .extend_from_slice(&(packet.len() as u32).to_le_bytes()); // orig_len
            self.buf.extend_from_slice(packet);
        }

        /// Number of packets added.
        pub fn len(&self) -> usize {
            self.count as usize
        }

        /// The file's bytes.
        pub fn into_bytes(self) -> Vec<u8> {
            self.buf
        }
    }

    fn checksum(data: &[u8]) -> u16 {
        let mut sum: u32 = 0;
        for c in data.chunks(2) {
            let w = if c.len() == 2 {
                u16::from_be_bytes([c[0], c[1]])
            } else {
                u16::from_be_bytes([c[0], 0])
            };
            sum += w as u32;
        }
        while sum >> 16 != 0 {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    /// An IPv4 packet (no options, DF set, header checksum filled in).
    pub fn ipv4(proto: u8, src: [u8; 4], dst: [u8; 4], payload: &[u8]) -> Vec<u8> {
        let total = (20 + payload.len()) as u16;
        let mut h = vec![0x45, 0x00];
        h.extend_from_slice(&total.to_be_bytes());
        h.extend_from_slice(&[0x00, 0x01, 0x40, 0x00, 64, proto, 0, 0]);
        h.extend_from_slice(&src);
        h.extend_from_slice(&dst);
        let c = checksum(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        h.extend_from_slice(payload);
        h
    }

    /// IPv4/UDP with a zero (absent) UDP checksum, as RoCEv2 allows.
    pub fn ipv4_udp(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
        let mut u = Vec::with_capacity(8 + payload.len());
        u.extend_from_slice(&sport.to_be_bytes());
        u.extend_from_slice(&dport.to_be_bytes());
        u.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        u.extend_from_slice(&[0, 0]);
        u.extend_from_slice(payload);
        ipv4(17, src, dst, &u)
    }

    /// A RoCEv2 packet carrying `payload` as an RC SEND-only: IPv4/UDP to port 4791, a 12-byte
    /// BTH (opcode 0x04, P_Key 0xffff, destination QP, PSN), the payload, and a 4-byte ICRC
    /// (zero: Wireshark shows it but does not validate it).
    pub fn roce_v2_send(dest_qp: u32, psn: u32, payload: &[u8]) -> Vec<u8> {
        let mut b = vec![BTH_RC_SEND_ONLY, 0x00, 0xff, 0xff];
        b.extend_from_slice(&(dest_qp & 0xff_ffff).to_be_bytes());
        b.extend_from_slice(&(psn & 0xff_ffff).to_be_bytes());
        b.extend_from_slice(payload);
        b.extend_from_slice(&[0; 4]);
        ipv4_udp([10, 0, 0, 1], [10, 0, 0, 2], 49152, ROCE_V2_PORT, &b)
    }

    /// A TCP header (no options, PSH|ACK, window 65535, checksum 0: Wireshark does not
    /// validate TCP checksums by default) followed by `payload`.
    fn tcp(sport: u16, dport: u16, seq: u32, ack: u32, payload: &[u8]) -> Vec<u8> {
        let mut t = Vec::with_capacity(20 + payload.len());
        t.extend_from_slice(&sport.to_be_bytes());
        t.extend_from_slice(&dport.to_be_bytes());
        t.extend_from_slice(&seq.to_be_bytes());
        t.extend_from_slice(&ack.to_be_bytes());
        t.extend_from_slice(&[0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0]);
        t.extend_from_slice(payload);
        t
    }

    /// IPv4/TCP segment carrying `payload` (see [`tcp`]). For CLC messages, which tshark finds
    /// by their eyecatcher; the payload starts at [`TCP_PAYLOAD_OFFSET`].
    pub fn ipv4_tcp(
        src: [u8; 4],
        dst: [u8; 4],
        sport: u16,
        dport: u16,
        seq: u32,
        ack: u32,
        payload: &[u8],
    ) -> Vec<u8> {
        ipv4(6, src, dst, &tcp(sport, dport, seq, ack, payload))
    }

    /// IPv6/TCP segment carrying `payload` (no extension headers, hop limit 64); the payload
    /// starts at [`TCP6_PAYLOAD_OFFSET`].
    pub fn ipv6_tcp(
        src: [u8; 16],
        dst: [u8; 16],
        sport: u16,
        dport: u16,
        seq: u32,
        ack: u32,
        payload: &[u8],
    ) -> Vec<u8> {
        let t = tcp(sport, dport, seq, ack, payload);
        let mut h = vec![0x60, 0, 0, 0];
        h.extend_from_slice(&(t.len() as u16).to_be_bytes());
        h.extend_from_slice(&[6, 64]);
        h.extend_from_slice(&src);
        h.extend_from_slice(&dst);
        h.extend_from_slice(&t);
        h
    }
}

pub mod tshark {
    use std::path::Path;
    use std::process::Command;

    /// True if a `tshark` binary runs.
    pub fn available() -> bool {
        Command::new("tshark")
            .arg("--version")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    }

    /// `tshark -r FILE -T pdml`, returning stdout.
    pub fn pdml(file: &Path) -> Result<String, String> {
        let out = Command::new("tshark")
            .arg("-r")
            .arg(file)
            .args(["-T", "pdml"])
            .output()
            .map_err(|e| format!("cannot run tshark: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "tshark failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        String::from_utf8(out.stdout).map_err(|e| format!("tshark output not UTF-8: {e}"))
    }

    /// One `<field>` (nested fields are flattened into their protocol, in document order).
    #[derive(Debug, Clone)]
    pub struct Field {
        pub name: String,
        pub pos: usize,
        pub size: usize,
        pub show: String,
        pub value: String,
    }

    impl Field {
        /// `show` as a number: `0x..` hex, otherwise decimal.
        pub fn show_u64(&self) -> Option<u64> {
            let s = self.show.trim();
            match s.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16).ok(),
                None => s.parse().ok(),
            }
        }

        /// `value` (the field's bytes as hex) as bytes.
        pub fn value_bytes(&self) -> Option<Vec<u8>> {
            let v = self.value.trim();
            if !v.len().is_multiple_of(2) {
                return None;
            }
            (0..v.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&v[i..i + 2], 16).ok())
                .collect()
        }
    }

    /// One `<proto>` and its fields.
    #[derive(Debug, Clone, Default)]
    pub struct Proto {
        pub name: String,
        pub pos: usize,
        pub size: usize,
        pub fields: Vec<Field>,
    }

    impl Proto {
        /// The field called `name` at `rel_pos` bytes from the protocol's start.
        pub fn field(&self, name: &str, rel_pos: usize) -> Option<&Field> {
            self.fields
                .iter()
                .find(|f| f.name == name && f.pos == self.pos + rel_pos)
        }
    }

    /// One `<packet>`.
    #[derive(Debug, Clone, Default)]
    pub struct Packet {
        pub protos: Vec<Proto>,
    }

    impl Packet {
        /// The first protocol called `name`.
        pub fn proto(&self, name: &str) -> Option<&Proto> {
            self.protos.iter().find(|p| p.name == name)
        }
    }

    fn attr(tag: &str, name: &str) -> Option<String> {
        let key = format!(" {name}=\"");
        let start = tag.find(&key)? + key.len();
        let end = start + tag[start..].find('"')?;
        Some(
            tag[start..end]
                .replace("&quot;", "\"")
                .replace("&lt;", "<")
                .replace("&gt;", ">")
                .replace("&apos;", "'")
                .replace("&amp;", "&"),
        )
    }

    fn num(tag: &str, name: &str) -> usize {
        attr(tag, name).and_then(|v| v.parse().ok()).unwrap_or(0)
    }

    /// Parses PDML as tshark writes it (one element per line).
    pub fn parse_pdml(xml: &str) -> Vec<Packet> {
        let mut packets = Vec::new();
        let mut cur: Option<Packet> = None;
        for line in xml.lines() {
            let t = line.trim_start();
            if t.starts_with("<packet") {
                cur = Some(Packet::default());
            } else if t.starts_with("</packet>") {
                if let Some(p) = cur.take() {
                    packets.push(p);
                }
            } else if t.starts_with("<proto ") {
                if let Some(p) = cur.as_mut() {
                    p.protos.push(Proto {
                        name: attr(t, "name").unwrap_or_default(),
                        pos: num(t, "pos"),
                        size: num(t, "size"),
                        fields: Vec::new(),
                    });
                }
            } else if t.starts_with("<field ")
                && let Some(proto) = cur.as_mut().and_then(|p| p.protos.last_mut())
            {
                proto.fields.push(Field {
                    name: attr(t, "name").unwrap_or_default(),
                    pos: num(t, "pos"),
                    size: num(t, "size"),
                    show: attr(t, "show").unwrap_or_default(),
                    value: attr(t, "value").unwrap_or_default(),
                });
            }
        }
        packets
    }

    /// What a field should decode to.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Want {
        /// A number (`show`, hex or decimal).
        Uint(u64),
        /// A one-bit boolean.
        Bool(bool),
        /// Raw bytes (`value`), for addresses and GIDs.
        Bytes(Vec<u8>),
    }

    /// One expectation: field `name` at `pos` bytes from the protocol start decodes to `want`.
    #[derive(Debug, Clone)]
    pub struct Expect {
        pub name: &'static str,
        pub pos: usize,
        pub want: Want,
    }

    /// `Expect` for a number.
    pub fn uint(name: &'static str, pos: usize, v: impl Into<u64>) -> Expect {
        Expect {
            name,
            pos,
            want: Want::Uint(v.into()),
        }
    }

    /// `Expect` for a flag bit.
    pub fn bit(name: &'static str, pos: usize, v: bool) -> Expect {
        Expect {
            name,
            pos,
            want: Want::Bool(v),
        }
    }

    /// `Expect` for bytes.
    pub fn bytes(name: &'static str, pos: usize, v: &[u8]) -> Expect {
        Expect {
            name,
            pos,
            want: Want::Bytes(v.to_vec()),
        }
    }

    /// Compares `proto` against `expects`; returns one line per mismatch or missing field.
    pub fn check(proto: &Proto, expects: &[Expect]) -> Vec<String> {
        let mut errs = Vec::new();
        for e in expects {
            let Some(f) = proto.field(e.name, e.pos) else {
                errs.push(format!("{} at +{}: not decoded", e.name, e.pos));
                continue;
            };
            let ok = match &e.want {
                Want::Uint(v) => f.show_u64() == Some(*v),
                Want::Bool(v) => f.show_u64() == Some(*v as u64),
                Want::Bytes(v) => f.value_bytes().as_deref() == Some(&v[..]),
            };
            if !ok {
                errs.push(format!(
                    "{} at +{}: tshark shows {:?} (value {}), crate emitted {:?}",
                    e.name, e.pos, f.show, f.value, e.want
                ));
            }
        }
        errs
    }
}
