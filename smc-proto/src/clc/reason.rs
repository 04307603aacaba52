//! Decline / fallback reason codes (`SMC_CLC_DECL_*` in `net/smc/smc_clc.h`), with the
//! kernel's names, the names smc-tools prints and a one-line meaning.
//!
//! smc-tools (`stats.c`, `get_fbackstr()`) names 26 of the 36 codes (e.g. `PEER_NO_SMC`,
//! `MEMORY`, `CNF_ERR`) and prints `[unknown]` for the rest. For those ten
//! ([`smc_tools_knows`](ReasonCode::smc_tools_knows) is false) we use the kernel suffix, which
//! is what smc-tools itself does for every other code. Meanings follow the `smcss(8)` man
//! page where it lists the code and the kernel's comments otherwise.
//!
//! # Local-only meanings
//!
//! Two values never travel in a Decline but are recorded locally as a connection's fallback
//! reason:
//! * [`ReasonCode::PEERDECL`] (0x05000000): "the peer declined"; the peer's own code is kept
//!   separately (smcss shows `local/peer`). The kernel never sends it.
//! * a **negative errno** (e.g. `-EPROTO` stored as `0xffffffb9`): the handshake failed and no
//!   fallback is possible; the connection gets that error. See
//!   [`from_errno`](ReasonCode::from_errno) / [`errno`](ReasonCode::errno).

use core::fmt;

/// A CLC reason code (a Decline's *peer diagnosis*, or a local fallback reason). Unknown values
/// are kept as they are.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ReasonCode(pub u32);

struct Info {
    code: ReasonCode,
    kernel: &'static str,
    tools: &'static str,
    tools_knows: bool,
    meaning: &'static str,
}

const TABLE: [Info; 36] = [
    Info {
        code: ReasonCode::MEM,
        kernel: "SMC_CLC_DECL_MEM",
        tools: "MEMORY",
        tools_knows: true,
        meaning: "insufficient memory resources (out of memory, buffer creation failed)",
    },
    Info {
        code: ReasonCode::TIMEOUT_CL,
        kernel: "SMC_CLC_DECL_TIMEOUT_CL",
        tools: "TIMEOUT_CL",
        tools_knows: true,
        meaning: "timeout while waiting for the CONFIRM LINK message over the RDMA device",
    },
    Info {
        code: ReasonCode::TIMEOUT_AL,
        kernel: "SMC_CLC_DECL_TIMEOUT_AL",
        tools: "TIMEOUT_AL",
        tools_knows: true,
        meaning: "timeout while waiting for ADD LINK (RDMA device to be added)",
    },
    Info {
        code: ReasonCode::CNFERR,
        kernel: "SMC_CLC_DECL_CNFERR",
        tools: "CNF_ERR",
        tools_knows: true,
        meaning: "configuration error (e.g. no usable IP prefix)",
    },
    Info {
        code: ReasonCode::PEERNOSMC,
        kernel: "SMC_CLC_DECL_PEERNOSMC",
        tools: "PEER_NO_SMC",
        tools_knows: true,
        meaning: "peer did not indicate SMC (TCP option missing)",
    },
    Info {
        code: ReasonCode::IPSEC,
        kernel: "SMC_CLC_DECL_IPSEC",
        tools: "IPSEC",
        tools_knows: true,
        meaning: "connection uses IPsec",
    },
    Info {
        code: ReasonCode::NOSMCDEV,
        kernel: "SMC_CLC_DECL_NOSMCDEV",
        tools: "NOSMCDEV",
        tools_knows: true,
        meaning: "no SMC device found (R or D)",
    },
    Info {
        code: ReasonCode::NOSMCDDEV,
        kernel: "SMC_CLC_DECL_NOSMCDDEV",
        tools: "NOSMCDDEV",
        tools_knows: true,
        meaning: "no ISM device for SMC-D found",
    },
    Info {
        code: ReasonCode::NOSMCRDEV,
        kernel: "SMC_CLC_DECL_NOSMCRDEV",
        tools: "NOSMCRDEV",
        tools_knows: true,
        meaning: "no RDMA device for SMC-R found",
    },
    Info {
        code: ReasonCode::NOISM2SUPP,
        kernel: "SMC_CLC_DECL_NOISM2SUPP",
        tools: "NOISM2SUPP",
        tools_knows: true,
        meaning: "hardware has no ISMv2 support",
    },
    Info {
        code: ReasonCode::NOV2EXT,
        kernel: "SMC_CLC_DECL_NOV2EXT",
        tools: "NOV2EXT",
        tools_knows: true,
        meaning: "peer sent no CLC v2 extension",
    },
    Info {
        code: ReasonCode::NOV2DEXT,
        kernel: "SMC_CLC_DECL_NOV2DEXT",
        tools: "NOV2DEXT",
        tools_knows: true,
        meaning: "peer sent no CLC SMC-Dv2 extension",
    },
    Info {
        code: ReasonCode::NOSEID,
        kernel: "SMC_CLC_DECL_NOSEID",
        tools: "NOSEID",
        tools_knows: true,
        meaning: "peer sent no SEID",
    },
    Info {
        code: ReasonCode::NOSMCD2DEV,
        kernel: "SMC_CLC_DECL_NOSMCD2DEV",
        tools: "NOSMCD2DEV",
        tools_knows: true,
        meaning: "no SMC-Dv2 device found",
    },
    Info {
        code: ReasonCode::NOUEID,
        kernel: "SMC_CLC_DECL_NOUEID",
        tools: "NOUEID",
        tools_knows: false,
        meaning: "peer sent no UEID",
    },
    Info {
        code: ReasonCode::RELEASEERR,
        kernel: "SMC_CLC_DECL_RELEASEERR",
        tools: "RELEASEERR",
        tools_knows: false,
        meaning: "SMC release version negotiation failed",
    },
    Info {
        code: ReasonCode::MAXCONNERR,
        kernel: "SMC_CLC_DECL_MAXCONNERR",
        tools: "MAXCONNERR",
        tools_knows: false,
        meaning: "max connections per link group negotiation failed",
    },
    Info {
        code: ReasonCode::MAXLINKERR,
        kernel: "SMC_CLC_DECL_MAXLINKERR",
        tools: "MAXLINKERR",
        tools_knows: false,
        meaning: "max links per link group negotiation failed",
    },
    Info {
        code: ReasonCode::MODEUNSUPP,
        kernel: "SMC_CLC_DECL_MODEUNSUPP",
        tools: "MODEUNSUPP",
        tools_knows: true,
        meaning: "SMC modes do not match (R or D), or accepted mode/version was not proposed",
    },
    Info {
        code: ReasonCode::RMBE_EC,
        kernel: "SMC_CLC_DECL_RMBE_EC",
        tools: "RMBE_EC",
        tools_knows: true,
        meaning: "peer has eyecatcher in RMBE",
    },
    Info {
        code: ReasonCode::OPTUNSUPP,
        kernel: "SMC_CLC_DECL_OPTUNSUPP",
        tools: "OPTUNSUPP",
        tools_knows: true,
        meaning: "fastopen sockopt not supported",
    },
    Info {
        code: ReasonCode::DIFFPREFIX,
        kernel: "SMC_CLC_DECL_DIFFPREFIX",
        tools: "DIFFPREFIX",
        tools_knows: true,
        meaning: "IP prefix / subnet mismatch",
    },
    Info {
        code: ReasonCode::GETVLANERR,
        kernel: "SMC_CLC_DECL_GETVLANERR",
        tools: "GETVLANERR",
        tools_knows: true,
        meaning: "error retrieving VLAN ID of IP device",
    },
    Info {
        code: ReasonCode::ISMVLANERR,
        kernel: "SMC_CLC_DECL_ISMVLANERR",
        tools: "ISMVLANERR",
        tools_knows: true,
        meaning: "error while registering VLAN ID on ISM device",
    },
    Info {
        code: ReasonCode::NOACTLINK,
        kernel: "SMC_CLC_DECL_NOACTLINK",
        tools: "NOACTLINK",
        tools_knows: true,
        meaning: "no active SMC-R link in link group",
    },
    Info {
        code: ReasonCode::NOSRVLINK,
        kernel: "SMC_CLC_DECL_NOSRVLINK",
        tools: "NOSRVLINK",
        tools_knows: true,
        meaning: "SMC-R link from server not found",
    },
    Info {
        code: ReasonCode::VERSMISMAT,
        kernel: "SMC_CLC_DECL_VERSMISMAT",
        tools: "VERSMISMAT",
        tools_knows: true,
        meaning: "SMC version mismatch",
    },
    Info {
        code: ReasonCode::MAX_DMB,
        kernel: "SMC_CLC_DECL_MAX_DMB",
        tools: "MAX_DMB",
        tools_knows: true,
        meaning: "SMC-D DMB limit exceeded",
    },
    Info {
        code: ReasonCode::NOROUTE,
        kernel: "SMC_CLC_DECL_NOROUTE",
        tools: "NOROUTE",
        tools_knows: false,
        meaning: "SMC-Rv2 connection found no route to peer",
    },
    Info {
        code: ReasonCode::NOINDIRECT,
        kernel: "SMC_CLC_DECL_NOINDIRECT",
        tools: "NOINDIRECT",
        tools_knows: false,
        meaning: "SMC-Rv2 connection: peer says indirect but the route is direct",
    },
    Info {
        code: ReasonCode::SYNCERR,
        kernel: "SMC_CLC_DECL_SYNCERR",
        tools: "SYNCERR",
        tools_knows: true,
        meaning: "synchronization error (link group out of sync)",
    },
    Info {
        code: ReasonCode::PEERDECL,
        kernel: "SMC_CLC_DECL_PEERDECL",
        tools: "PEERDECL",
        tools_knows: true,
        meaning: "peer declined during handshake",
    },
    Info {
        code: ReasonCode::INTERR,
        kernel: "SMC_CLC_DECL_INTERR",
        tools: "INTERR",
        tools_knows: false,
        meaning: "internal error",
    },
    Info {
        code: ReasonCode::ERR_RTOK,
        kernel: "SMC_CLC_DECL_ERR_RTOK",
        tools: "ERR_RTOK",
        tools_knows: false,
        meaning: "rtoken handling failed",
    },
    Info {
        code: ReasonCode::ERR_RDYLNK,
        kernel: "SMC_CLC_DECL_ERR_RDYLNK",
        tools: "ERR_RDYLNK",
        tools_knows: false,
        meaning: "RDMA ready link failed",
    },
    Info {
        code: ReasonCode::ERR_REGBUF,
        kernel: "SMC_CLC_DECL_ERR_REGBUF",
        tools: "ERR_REGBUF",
        tools_knows: false,
        meaning: "RMB registration failed",
    },
];

impl ReasonCode {
    /// `0x01010000`: insufficient memory resources (out of memory, buffer creation failed).
    pub const MEM: ReasonCode = ReasonCode(0x01010000);
    /// `0x02010000`: timeout while waiting for the CONFIRM LINK message over the RDMA device.
    pub const TIMEOUT_CL: ReasonCode = ReasonCode(0x02010000);
    /// `0x02020000`: timeout while waiting for ADD LINK (RDMA device to be added).
    pub const TIMEOUT_AL: ReasonCode = ReasonCode(0x02020000);
    /// `0x03000000`: configuration error (e.g. no usable IP prefix).
    pub const CNFERR: ReasonCode = ReasonCode(0x03000000);
    /// `0x03010000`: peer did not indicate SMC (TCP option missing).
    pub const PEERNOSMC: ReasonCode = ReasonCode(0x03010000);
    /// `0x03020000`: connection uses IPsec.
    pub const IPSEC: ReasonCode = ReasonCode(0x03020000);
    /// `0x03030000`: no SMC device found (R or D).
    pub const NOSMCDEV: ReasonCode = ReasonCode(0x03030000);
    /// `0x03030001`: no ISM device for SMC-D found.
    pub const NOSMCDDEV: ReasonCode = ReasonCode(0x03030001);
    /// `0x03030002`: no RDMA device for SMC-R found.
    pub const NOSMCRDEV: ReasonCode = ReasonCode(0x03030002);
    /// `0x03030003`: hardware has no ISMv2 support.
    pub const NOISM2SUPP: ReasonCode = ReasonCode(0x03030003);
    /// `0x03030004`: peer sent no CLC v2 extension.
    pub const NOV2EXT: ReasonCode = ReasonCode(0x03030004);
    /// `0x03030005`: peer sent no CLC SMC-Dv2 extension.
    pub const NOV2DEXT: ReasonCode = ReasonCode(0x03030005);
    /// `0x03030006`: peer sent no SEID.
    pub const NOSEID: ReasonCode = ReasonCode(0x03030006);
    /// `0x03030007`: no SMC-Dv2 device found.
    pub const NOSMCD2DEV: ReasonCode = ReasonCode(0x03030007);
    /// `0x03030008`: peer sent no UEID.
    pub const NOUEID: ReasonCode = ReasonCode(0x03030008);
    /// `0x03030009`: SMC release version negotiation failed.
    pub const RELEASEERR: ReasonCode = ReasonCode(0x03030009);
    /// `0x0303000a`: max connections per link group negotiation failed.
    pub const MAXCONNERR: ReasonCode = ReasonCode(0x0303000a);
    /// `0x0303000b`: max links per link group negotiation failed.
    pub const MAXLINKERR: ReasonCode = ReasonCode(0x0303000b);
    /// `0x03040000`: SMC modes do not match (R or D), or accepted mode/version was not proposed.
    pub const MODEUNSUPP: ReasonCode = ReasonCode(0x03040000);
    /// `0x03050000`: peer has eyecatcher in RMBE.
    pub const RMBE_EC: ReasonCode = ReasonCode(0x03050000);
    /// `0x03060000`: fastopen sockopt not supported.
    pub const OPTUNSUPP: ReasonCode = ReasonCode(0x03060000);
    /// `0x03070000`: IP prefix / subnet mismatch.
    pub const DIFFPREFIX: ReasonCode = ReasonCode(0x03070000);
    /// `0x03080000`: error retrieving VLAN ID of IP device.
    pub const GETVLANERR: ReasonCode = ReasonCode(0x03080000);
    /// `0x03090000`: error while registering VLAN ID on ISM device.
    pub const ISMVLANERR: ReasonCode = ReasonCode(0x03090000);
    /// `0x030a0000`: no active SMC-R link in link group.
    pub const NOACTLINK: ReasonCode = ReasonCode(0x030a0000);
    /// `0x030b0000`: SMC-R link from server not found.
    pub const NOSRVLINK: ReasonCode = ReasonCode(0x030b0000);
    /// `0x030c0000`: SMC version mismatch.
    pub const VERSMISMAT: ReasonCode = ReasonCode(0x030c0000);
    /// `0x030d0000`: SMC-D DMB limit exceeded.
    pub const MAX_DMB: ReasonCode = ReasonCode(0x030d0000);
    /// `0x030e0000`: SMC-Rv2 connection found no route to peer.
    pub const NOROUTE: ReasonCode = ReasonCode(0x030e0000);
    /// `0x030f0000`: SMC-Rv2 connection: peer says indirect but the route is direct.
    pub const NOINDIRECT: ReasonCode = ReasonCode(0x030f0000);
    /// `0x04000000`: synchronization error (link group out of sync).
    pub const SYNCERR: ReasonCode = ReasonCode(0x04000000);
    /// `0x05000000`: peer declined during handshake.
    pub const PEERDECL: ReasonCode = ReasonCode(0x05000000);
    /// `0x09990000`: internal error.
    pub const INTERR: ReasonCode = ReasonCode(0x09990000);
    /// `0x09990001`: rtoken handling failed.
    pub const ERR_RTOK: ReasonCode = ReasonCode(0x09990001);
    /// `0x09990002`: RDMA ready link failed.
    pub const ERR_RDYLNK: ReasonCode = ReasonCode(0x09990002);
    /// `0x09990003`: RMB registration failed.
    pub const ERR_REGBUF: ReasonCode = ReasonCode(0x09990003);

    /// All 36 `SMC_CLC_DECL_*` codes, in the kernel header's order.
    pub const ALL: [ReasonCode; 36] = [
        ReasonCode::MEM,
        ReasonCode::TIMEOUT_CL,
        ReasonCode::TIMEOUT_AL,
        ReasonCode::CNFERR,
        ReasonCode::PEERNOSMC,
        ReasonCode::IPSEC,
        ReasonCode::NOSMCDEV,
        ReasonCode::NOSMCDDEV,
        ReasonCode::NOSMCRDEV,
        ReasonCode::NOISM2SUPP,
        ReasonCode::NOV2EXT,
        ReasonCode::NOV2DEXT,
        ReasonCode::NOSEID,
        ReasonCode::NOSMCD2DEV,
        ReasonCode::NOUEID,
        ReasonCode::RELEASEERR,
        ReasonCode::MAXCONNERR,
        ReasonCode::MAXLINKERR,
        ReasonCode::MODEUNSUPP,
        ReasonCode::RMBE_EC,
        ReasonCode::OPTUNSUPP,
        ReasonCode::DIFFPREFIX,
        ReasonCode::GETVLANERR,
        ReasonCode::ISMVLANERR,
        ReasonCode::NOACTLINK,
        ReasonCode::NOSRVLINK,
        ReasonCode::VERSMISMAT,
        ReasonCode::MAX_DMB,
        ReasonCode::NOROUTE,
        ReasonCode::NOINDIRECT,
        ReasonCode::SYNCERR,
        ReasonCode::PEERDECL,
        ReasonCode::INTERR,
        ReasonCode::ERR_RTOK,
        ReasonCode::ERR_RDYLNK,
        ReasonCode::ERR_REGBUF,
    ];

    fn info(self) -> Option<&'static Info> {
        TABLE.iter().find(|i| i.code == self)
    }

    /// The kernel's macro name, e.g. `"SMC_CLC_DECL_PEERNOSMC"`; `None` for unknown codes.
    pub fn kernel_name(self) -> Option<&'static str> {
        self.info().map(|i| i.kernel)
    }

    /// The name smc-tools prints (`smcd stats -d`), e.g. `"PEER_NO_SMC"`; for the ten codes
    /// smc-tools does not name, the kernel suffix (see the module docs). `None` for unknown
    /// codes.
    pub fn smc_tools_name(self) -> Option<&'static str> {
        self.info().map(|i| i.tools)
    }

    /// Whether smc-tools itself has a name for this code (false: the name is derived).
    pub fn smc_tools_knows(self) -> bool {
        self.info().is_some_and(|i| i.tools_knows)
    }

    /// One line saying what the code means; `None` for unknown codes.
    pub fn meaning(self) -> Option<&'static str> {
        self.info().map(|i| i.meaning)
    }

    /// Whether this is one of the 36 `SMC_CLC_DECL_*` codes.
    pub fn is_known(self) -> bool {
        self.info().is_some()
    }

    /// The local "no fallback possible" value for a handshake that failed with `errno`
    /// (positive, e.g. 71 for EPROTO): stored as the negative errno, as the kernel does.
    pub fn from_errno(errno: i32) -> ReasonCode {
        ReasonCode(errno.wrapping_neg() as u32)
    }

    /// `Some(errno)` (positive) when this value is a negative errno, i.e. the local
    /// "handshake error, no fallback" meaning.
    pub fn errno(self) -> Option<i32> {
        let v = self.0 as i32;
        (v < 0).then(|| v.wrapping_neg())
    }

    /// Whether this value only has a local meaning and is never sent in a Decline
    /// ([`PEERDECL`](Self::PEERDECL) or a negative errno).
    pub fn is_local_only(self) -> bool {
        self == ReasonCode::PEERDECL || self.errno().is_some()
    }
}

impl From<u32> for ReasonCode {
    fn from(v: u32) -> Self {
        ReasonCode(v)
    }
}

impl From<ReasonCode> for u32 {
    fn from(r: ReasonCode) -> u32 {
        r.0
    }
}

impl fmt::Debug for ReasonCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kernel_name() {
            Some(n) => write!(f, "ReasonCode({:#010x} {n})", self.0),
            None => write!(f, "ReasonCode({:#010x})", self.0),
        }
    }
}

/// `SMC_CLC_DECL_PEERNOSMC (0x03010000)`; `errno 71 (no fallback)`; `0x12345678 (unknown)`.
impl fmt::Display for ReasonCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(n) = self.kernel_name() {
            write!(f, "{n} ({:#010x})", self.0)
        } else if let Some(e) = self.errno() {
            write!(f, "errno {e} (no fallback)")
        } else {
            write!(f, "{:#010x} (unknown)", self.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_codes_named_and_unique() {
        for (i, c) in ReasonCode::ALL.iter().enumerate() {
            assert!(c.kernel_name().unwrap().starts_with("SMC_CLC_DECL_"));
            assert!(c.meaning().is_some());
            assert!(!ReasonCode::ALL[..i].contains(c), "{c} twice");
        }
        assert_eq!(
            ReasonCode::ALL
                .iter()
                .filter(|c| c.smc_tools_knows())
                .count(),
            26
        );
    }

    #[test]
    fn names_and_display() {
        assert_eq!(ReasonCode::PEERNOSMC.smc_tools_name(), Some("PEER_NO_SMC"));
        assert_eq!(ReasonCode::MEM.smc_tools_name(), Some("MEMORY"));
        assert_eq!(ReasonCode::CNFERR.smc_tools_name(), Some("CNF_ERR"));
        assert_eq!(ReasonCode::NOROUTE.smc_tools_name(), Some("NOROUTE"));
        assert!(!ReasonCode::NOROUTE.smc_tools_knows());
        assert_eq!(
            ReasonCode::PEERNOSMC.to_string(),
            "SMC_CLC_DECL_PEERNOSMC (0x03010000)"
        );
        assert_eq!(ReasonCode(0x1234_5678).to_string(), "0x12345678 (unknown)");
        assert_eq!(ReasonCode(0x1234_5678).kernel_name(), None);
    }

    #[test]
    fn errno_is_local_only() {
        let r = ReasonCode::from_errno(71);
        assert_eq!(r.0, 0xffff_ffb9);
        assert_eq!(r.errno(), Some(71));
        assert!(r.is_local_only());
        assert!(ReasonCode::PEERDECL.is_local_only());
        assert!(!ReasonCode::SYNCERR.is_local_only());
        assert_eq!(r.to_string(), "errno 71 (no fallback)");
        assert_eq!(ReasonCode::DIFFPREFIX.errno(), None);
    }
}
