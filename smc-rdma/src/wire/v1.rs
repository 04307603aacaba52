//! RoCE v1 frames: an Ethernet header with Ethertype 0x8915, the InfiniBand global route header
//! (GRH, 40 bytes, laid out as an IPv6 header whose addresses are the GIDs and whose next
//! header is 0x1B, the BTH), then the same transport as RoCEv2 ([`Packet`]: BTH, RETH or AETH,
//! payload, pad, ICRC). IBTA vol. 1 annex A16 (RoCE); Wireshark's `packet-infiniband.c` decodes
//! it from the Ethertype (`eth.type == 0x8915`).
//!
//! **The ICRC.** As for RoCEv2 ([`super::icrc`]) the CRC-32 starts with eight bytes of ones in
//! place of InfiniBand's local route header, then covers the GRH with its variant fields
//! (traffic class, flow label, hop limit) set to ones, then the BTH with its byte 4 set to
//! ones, then the rest of the packet; it is appended little endian. (rxe speaks RoCEv2 only,
//! so there is no kernel implementation of the v1 ICRC to follow; this is the IBTA's
//! variant-field rule applied to the GRH, the same rule `rxe_icrc.c` applies to an IPv6 header.
//! The property tests recompute it from the rule written out bit by bit.)
//!
//! **GIDs.** RoCE v1 has no IP layer: a frame goes to a MAC address. The GID a RoCE v1 port
//! has first in its table (the kernel's default GID, `roce_gid_mgmt.c` `make_default_gid`) is
//! the link-local address of its MAC, `fe80::` and the modified EUI-64 (`addrconf_ifid_eui48`:
//! the universal/local bit flipped, `ff:fe` in the middle); the MAC of such a GID is read back
//! out of it ([`mac_of_gid`], the kernel's `rdma_get_ll_mac`). GIDs of IP addresses would need
//! neighbour resolution and are not handled here.
//!
//! **Panic contract:** [`Frame::parse`] takes any bytes and returns a typed error; [`Frame::emit`]
//! panics only when its buffer is shorter than [`Frame::buffer_len`] (a caller bug).

use super::{Packet, WireError, icrc_over};

/// The Ethertype of RoCE v1.
pub const ETHERTYPE_ROCE: u16 = 0x8915;
/// Ethernet header without a VLAN tag.
pub const ETH_LEN: usize = 14;
/// Global route header.
pub const GRH_LEN: usize = 40;
/// Ethernet and GRH: where the BTH starts.
pub const HEADERS_LEN: usize = ETH_LEN + GRH_LEN;
/// The GRH's next header for an InfiniBand BTH (IBTA: 0x1B).
pub const NEXT_HEADER_BTH: u8 = 0x1b;
/// The GRH's version field (IPv6's).
pub const GRH_VERSION: u8 = 6;

/// The global route header fields a sender chooses (the payload length and next header follow
/// from the packet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grh {
    /// Traffic class (masked in the ICRC).
    pub tclass: u8,
    /// Flow label, 20 bits (masked in the ICRC).
    pub flow_label: u32,
    /// Hop limit (masked in the ICRC).
    pub hop_limit: u8,
    /// Source GID.
    pub sgid: [u8; 16],
    /// Destination GID.
    pub dgid: [u8; 16],
}

impl Grh {
    /// The 40 bytes of the header for a transport packet of `payload_len` bytes (ICRC
    /// included).
    fn bytes(&self, payload_len: u16) -> [u8; GRH_LEN] {
        let mut b = [0u8; GRH_LEN];
        let w = (u32::from(GRH_VERSION) << 28)
            | (u32::from(self.tclass) << 20)
            | (self.flow_label & 0x000f_ffff);
        b[0..4].copy_from_slice(&w.to_be_bytes());
        b[4..6].copy_from_slice(&payload_len.to_be_bytes());
        b[6] = NEXT_HEADER_BTH;
        b[7] = self.hop_limit;
        b[8..24].copy_from_slice(&self.sgid);
        b[24..40].copy_from_slice(&self.dgid);
        b
    }
}

/// A RoCE v1 frame: Ethernet addresses, GRH, transport packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// Destination MAC.
    pub dst_mac: [u8; 6],
    /// Source MAC.
    pub src_mac: [u8; 6],
    /// Global route header.
    pub grh: Grh,
    /// BTH and what follows, ICRC included.
    pub packet: Packet<'a>,
}

/// What is wrong with a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Shorter than the Ethernet header and GRH, or than the GRH's payload length.
    #[error("RoCE v1 frame truncated: {need} bytes needed, {have} present")]
    Truncated {
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// Another Ethertype (a VLAN tag is not taken: the socket receives untagged frames).
    #[error("Ethertype {0:#06x} is not RoCE v1")]
    EtherType(u16),
    /// A GRH version other than 6.
    #[error("GRH version {0} (6 expected)")]
    Version(u8),
    /// A next header other than the BTH.
    #[error("GRH next header {0:#04x} is not a BTH (0x1b)")]
    NextHeader(u8),
    /// The transport packet behind the GRH.
    #[error(transparent)]
    Transport(#[from] WireError),
}

impl<'a> Frame<'a> {
    /// The frame's length: headers and transport packet (no Ethernet padding, no FCS).
    pub fn buffer_len(&self) -> usize {
        HEADERS_LEN + self.packet.buffer_len()
    }

    /// Parses an Ethernet frame (without FCS). Bytes after the GRH's payload length are
    /// Ethernet padding and ignored.
    pub fn parse(buf: &'a [u8]) -> Result<Self, FrameError> {
        if buf.len() < HEADERS_LEN {
            return Err(FrameError::Truncated {
                need: HEADERS_LEN,
                have: buf.len(),
            });
        }
        let ethertype = u16::from_be_bytes([buf[12], buf[13]]);
        if ethertype != ETHERTYPE_ROCE {
            return Err(FrameError::EtherType(ethertype));
        }
        let g: &[u8; GRH_LEN] = buf[ETH_LEN..HEADERS_LEN].try_into().expect("40");
        if g[0] >> 4 != GRH_VERSION {
            return Err(FrameError::Version(g[0] >> 4));
        }
        if g[6] != NEXT_HEADER_BTH {
            return Err(FrameError::NextHeader(g[6]));
        }
        let paylen = usize::from(u16::from_be_bytes([g[4], g[5]]));
        if buf.len() < HEADERS_LEN + paylen {
            return Err(FrameError::Truncated {
                need: HEADERS_LEN + paylen,
                have: buf.len(),
            });
        }
        let w = u32::from_be_bytes([g[0], g[1], g[2], g[3]]);
        let grh = Grh {
            tclass: (w >> 20) as u8,
            flow_label: w & 0x000f_ffff,
            hop_limit: g[7],
            sgid: g[8..24].try_into().expect("16"),
            dgid: g[24..40].try_into().expect("16"),
        };
        let packet = Packet::parse_with(&buf[HEADERS_LEN..HEADERS_LEN + paylen], |body| {
            icrc(g, body)
        })?;
        Ok(Self {
            dst_mac: buf[0..6].try_into().expect("6"),
            src_mac: buf[6..12].try_into().expect("6"),
            grh,
            packet,
        })
    }

    /// Writes the frame into `buf` (at least [`Frame::buffer_len`] bytes) with the GRH's
    /// payload length, the pad count and the ICRC set; returns the length written. A packet
    /// longer than a GRH's payload length can say (65,535 bytes) gets the length modulo 2^16:
    /// no Ethernet carries one.
    pub fn emit(&self, buf: &mut [u8]) -> usize {
        let len = self.buffer_len();
        buf[0..6].copy_from_slice(&self.dst_mac);
        buf[6..12].copy_from_slice(&self.src_mac);
        buf[12..14].copy_from_slice(&ETHERTYPE_ROCE.to_be_bytes());
        let g = self.grh.bytes(self.packet.buffer_len() as u16);
        buf[ETH_LEN..HEADERS_LEN].copy_from_slice(&g);
        self.packet
            .emit_with(&mut buf[HEADERS_LEN..len], |body| icrc(&g, body));
        len
    }
}

/// The ICRC of a RoCE v1 packet behind the GRH `grh` (as on the wire), whose transport bytes
/// without the ICRC are `body` (module docs).
pub fn icrc(grh: &[u8; GRH_LEN], body: &[u8]) -> u32 {
    let mut pseudo = [0u8; 8 + GRH_LEN];
    pseudo[..8].fill(0xff);
    let g = &mut pseudo[8..];
    g.copy_from_slice(grh);
    g[0] |= 0x0f; // traffic class (high nibble) ...
    g[1] = 0xff; // ... traffic class (low nibble) and flow label
    g[2] = 0xff;
    g[3] = 0xff;
    g[7] = 0xff; // hop limit
    icrc_over(&pseudo, body)
}

/// The RoCE v1 default GID of a MAC: `fe80::` with the modified EUI-64 of the MAC.
pub fn gid_of_mac(mac: [u8; 6]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    g[8] = mac[0] ^ 0x02;
    g[9] = mac[1];
    g[10] = mac[2];
    g[11] = 0xff;
    g[12] = 0xfe;
    g[13] = mac[3];
    g[14] = mac[4];
    g[15] = mac[5];
    g
}

/// The MAC of a link-local EUI-64 GID ([`gid_of_mac`] backwards); `None` for any other GID.
pub fn mac_of_gid(g: &[u8; 16]) -> Option<[u8; 6]> {
    let link_local = g[0] == 0xfe && g[1] == 0x80 && g[2..8].iter().all(|&b| b == 0);
    (link_local && g[11] == 0xff && g[12] == 0xfe)
        .then(|| [g[8] ^ 0x02, g[9], g[10], g[13], g[14], g[15]])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Bth, Opcode};

    fn frame(payload: &[u8]) -> Frame<'_> {
        let mut bth = Bth::new(Opcode::SendOnly, 0x1234, 77);
        bth.ack_req = true;
        Frame {
            dst_mac: [2, 0, 0, 0, 0, 2],
            src_mac: [2, 0, 0, 0, 0, 1],
            grh: Grh {
                tclass: 0,
                flow_label: 0,
                hop_limit: 1,
                sgid: gid_of_mac([2, 0, 0, 0, 0, 1]),
                dgid: gid_of_mac([2, 0, 0, 0, 0, 2]),
            },
            packet: Packet::new(bth, None, None, payload),
        }
    }

    #[test]
    fn a_send_round_trips_and_its_variant_fields_are_masked() {
        let f = frame(b"hello");
        let mut buf = vec![0; f.buffer_len()];
        assert_eq!(f.emit(&mut buf), 54 + 12 + 8 + 4);
        assert_eq!(&buf[12..14], &[0x89, 0x15]);
        assert_eq!(buf[14] >> 4, 6);
        assert_eq!(u16::from_be_bytes([buf[18], buf[19]]), 12 + 8 + 4);
        assert_eq!(buf[20], 0x1b);
        let mut want = f;
        want.packet.bth.pad = 3;
        assert_eq!(Frame::parse(&buf), Ok(want));
        // Traffic class, flow label and hop limit may change on the way.
        let mut v = buf.clone();
        v[14] |= 0x0f;
        v[15] = 0xab;
        v[17] = 0x55;
        v[21] = 64;
        assert!(Frame::parse(&v).is_ok());
        // A GID may not.
        let mut v = buf.clone();
        v[30] ^= 1;
        assert!(matches!(
            Frame::parse(&v),
            Err(FrameError::Transport(WireError::Icrc { .. }))
        ));
        // Ethernet padding after the packet is ignored.
        let mut v = buf.clone();
        v.extend_from_slice(&[0; 6]);
        assert_eq!(Frame::parse(&v), Ok(want));
    }

    #[test]
    fn eui64_gids_map_back_to_their_mac() {
        let mac = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
        let g = gid_of_mac(mac);
        assert_eq!(
            g,
            [
                0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x50, 0x54, 0x00, 0xff, 0xfe, 0x12, 0x34, 0x56
            ]
        );
        assert_eq!(mac_of_gid(&g), Some(mac));
        let mut v4 = [0u8; 16];
        v4[10] = 0xff;
        v4[11] = 0xff;
        assert_eq!(mac_of_gid(&v4), None);
    }
}
