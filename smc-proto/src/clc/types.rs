//! Small value types shared by the CLC messages: EIDs, hostnames, OS type, device ids, and the
//! constants of `net/smc/smc.h` / `smc_clc.h` / `smc_ism.h` that the layouts refer to.

use core::fmt;

/// Length of an EID (`SMC_MAX_EID_LEN`) and of the hostname (`SMC_MAX_HOSTNAME_LEN`).
pub const EID_LEN: usize = 32;
/// `SMC_RELEASE_0`: SMC v2.0.
pub const SMC_RELEASE_0: u8 = 0;
/// `SMC_RELEASE_1` (= `SMC_RELEASE`, "v2.1"): what current Linux sends.
pub const SMC_RELEASE_1: u8 = 1;
/// `SMC_SPF_EMULATED_ISM_DEV`: supplemental feature bit 0, the peer understands 128-bit
/// emulated-ISM GIDs (two GID/CHID entries per device, `gid_ext` in Accept/Confirm).
pub const SMC_SPF_EMULATED_ISM_DEV: u16 = 0x0001;
/// `SMC_FEATURE_MASK`: all supplemental features Linux supports (just the one above).
pub const SMC_FEATURE_MASK: u16 = SMC_SPF_EMULATED_ISM_DEV;
/// First CHID reserved for emulated ISM devices (`SMC_ISM_EMULATED_CHID_START`-style range
/// 0xFF00..=0xFFFF; virtio-ism 0xFF00-0xFFFE).
pub const EMULATED_CHID_START: u16 = 0xFF00;
/// CHID of the loopback-ism device.
pub const LOOPBACK_CHID: u16 = 0xFFFF;

/// Whether `chid` belongs to an emulated ISM device (`__smc_ism_is_emulated()`), which takes
/// two GID/CHID entries in a Proposal and a `gid_ext` in Accept/Confirm.
pub const fn is_emulated_chid(chid: u16) -> bool {
    chid >= EMULATED_CHID_START
}

/// An 8-byte SMC-R system id (`id_for_peer`, `local_systemid`).
pub type PeerId = [u8; 8];
/// A 16-byte RoCE GID.
pub type RoceGid = [u8; 16];

/// A 32-byte EID (user EID or system EID), blank padded on the wire.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Eid(pub [u8; EID_LEN]);

impl Eid {
    /// All zero: "no EID" (what Linux sends in Accept/Confirm when none was negotiated).
    pub const ZERO: Eid = Eid([0; EID_LEN]);

    /// `s` padded with blanks to 32 bytes; `None` if longer than 32 bytes. No character check:
    /// see [`is_valid_ueid`](Self::is_valid_ueid).
    pub fn new(s: &str) -> Option<Eid> {
        pad32(s.as_bytes()).map(Eid)
    }

    /// Whether this is all zero.
    pub fn is_zero(&self) -> bool {
        self.0 == [0; EID_LEN]
    }

    /// The bytes without trailing blanks and NULs.
    pub fn trimmed(&self) -> &[u8] {
        trim32(&self.0)
    }

    /// The kernel's `smc_clc_ueid_valid()`: after stripping trailing blanks, non-empty,
    /// starts with `A-Z`/`0-9`, and only `A-Z 0-9 . -` follow.
    pub fn is_valid_ueid(&self) -> bool {
        let mut end = EID_LEN;
        // C isspace(): blank, \t \n \v \f \r.
        while end > 0 && (self.0[end - 1].is_ascii_whitespace() || self.0[end - 1] == 0x0b) {
            end -= 1;
        }
        let s = &self.0[..end];
        let upper_or_digit = |c: u8| c.is_ascii_uppercase() || c.is_ascii_digit();
        match s.split_first() {
            None => false,
            Some((first, rest)) => {
                upper_or_digit(*first)
                    && rest
                        .iter()
                        .all(|&c| upper_or_digit(c) || c == b'.' || c == b'-')
            }
        }
    }
}

impl Default for Eid {
    fn default() -> Self {
        Eid::ZERO
    }
}

impl fmt::Debug for Eid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Eid({:?})", String::from_utf8_lossy(self.trimmed()))
    }
}

/// The 32-byte hostname of the first contact extension (ASCII, blank padded; Linux copies
/// the first 32 bytes of its nodename).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Hostname(pub [u8; EID_LEN]);

impl Hostname {
    /// `s` truncated to 32 bytes and blank padded, as `smc_clc_init()` builds it.
    pub fn new(s: &str) -> Hostname {
        let b = s.as_bytes();
        let n = b.len().min(EID_LEN);
        let mut h = [b' '; EID_LEN];
        h[..n].copy_from_slice(&b[..n]);
        Hostname(h)
    }

    /// The bytes without trailing blanks and NULs.
    pub fn trimmed(&self) -> &[u8] {
        trim32(&self.0)
    }
}

impl Default for Hostname {
    fn default() -> Self {
        Hostname([0; EID_LEN])
    }
}

impl fmt::Debug for Hostname {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Hostname({:?})", String::from_utf8_lossy(self.trimmed()))
    }
}

fn pad32(b: &[u8]) -> Option<[u8; EID_LEN]> {
    if b.len() > EID_LEN {
        return None;
    }
    let mut a = [b' '; EID_LEN];
    a[..b.len()].copy_from_slice(b);
    Some(a)
}

fn trim32(b: &[u8; EID_LEN]) -> &[u8] {
    let mut end = EID_LEN;
    while end > 0 && (b[end - 1] == b' ' || b[end - 1] == 0) {
        end -= 1;
    }
    &b[..end]
}

/// Peer operating system (a nibble in Decline and in the first contact extension;
/// `SMC_CLC_OS_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum OsType {
    /// 0: not given (Linux v1 Declines).
    #[default]
    Unset,
    /// 1: z/OS.
    ZOs,
    /// 2: Linux.
    Linux,
    /// 3: AIX.
    Aix,
    /// Any other nibble (Wireshark calls 15 "Unknown").
    Other(u8),
}

impl OsType {
    /// Decodes the low nibble of `v`.
    pub fn from_nibble(v: u8) -> Self {
        match v & 0x0f {
            0 => OsType::Unset,
            1 => OsType::ZOs,
            2 => OsType::Linux,
            3 => OsType::Aix,
            x => OsType::Other(x),
        }
    }

    /// The nibble (only the low 4 bits of an `Other` value are kept).
    pub fn nibble(self) -> u8 {
        match self {
            OsType::Unset => 0,
            OsType::ZOs => 1,
            OsType::Linux => 2,
            OsType::Aix => 3,
            OsType::Other(x) => x & 0x0f,
        }
    }
}

/// One SMC-D device as proposed or selected: the 64-bit GID and, for an emulated ISM device
/// (e.g. loopback-ism), the upper 64 bits of its 128-bit GID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SmcdDevice {
    /// GID (for emulated devices: the first 8 bytes of the 128-bit GID).
    pub gid: u64,
    /// `gid_ext`, the second 8 bytes of an emulated device's GID; `None` for native ISM.
    pub gid_ext: Option<u64>,
    /// CHID.
    pub chid: u16,
}

impl SmcdDevice {
    /// The loopback-ism device: CHID 0xFFFF, 128-bit GID `gid` ‖ `gid_ext`.
    pub const fn loopback(gid: u64, gid_ext: u64) -> Self {
        SmcdDevice {
            gid,
            gid_ext: Some(gid_ext),
            chid: LOOPBACK_CHID,
        }
    }

    /// Whether the CHID is in the emulated range.
    pub const fn is_emulated(&self) -> bool {
        is_emulated_chid(self.chid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eid_rules() {
        let e = Eid::new("SMC-LO.EID1").unwrap();
        assert_eq!(e.trimmed(), b"SMC-LO.EID1");
        assert!(e.is_valid_ueid());
        assert!(!Eid::new("-LEADING").unwrap().is_valid_ueid());
        assert!(!Eid::new("lower").unwrap().is_valid_ueid());
        assert!(!Eid::new("").unwrap().is_valid_ueid());
        assert!(!Eid::new("A B").unwrap().is_valid_ueid());
        assert!(!Eid::ZERO.is_valid_ueid());
        assert!(Eid::new(&"X".repeat(33)).is_none());
        assert_eq!(Hostname::new(&"h".repeat(40)).0, [b'h'; 32]);
        assert_eq!(Hostname::new("ab").trimmed(), b"ab");
        assert_eq!(OsType::from_nibble(0x12), OsType::Linux);
        assert_eq!(OsType::Other(0x1f).nibble(), 0x0f);
        assert!(SmcdDevice::loopback(1, 2).is_emulated());
        assert!(!is_emulated_chid(0xFEFF));
    }
}
