//! Generic netlink: the kernel's `SMC_GEN_NETLINK` family, the `nlctrl` family-id lookup, the
//! engine's own `SMCD_ENGINE` family, and netlink message framing.
//!
//! Mirrors `include/uapi/linux/smc.h` and `net/smc/smc_netlink.c` (plus the `smc_nl_*` dump
//! functions in `smc_core.c`, `smc_ism.c`, `smc_ib.c`, `smc_stats.c`, `smc_clc.c` and
//! `af_smc.c`), and `ctrl_fill_info` in `net/netlink/genetlink.c`. The daemon's control socket
//! (a Unix `SOCK_SEQPACKET` socket) carries exactly these messages, so `smcctl` and smc-tools
//! style clients speak to `smcd` as they would to the kernel.
//!
//! | module | what |
//! |---|---|
//! | [`framing`] | splitting a buffer into netlink messages, `NLMSG_DONE`/`NLMSG_ERROR`, request and reply builders |
//! | [`smc`] | `SMC_GEN_NETLINK`: commands, every attribute and nest numbered as the kernel, typed replies |
//! | [`ctrl`] | `nlctrl` (`CTRL_CMD_GETFAMILY`): resolve a family name to an id, and answer such a request |
//! | [`loopback`] | `SMCD_LOOPBACK`: the engine-to-smcd device channel (fixed id 0x22) |
//! | [`engine`] | `SMCD_ENGINE`: sysctls, namespaces, socket dump (what the kernel does through `/proc/sys/net/smc` and sock_diag) |
//! | [`attr`] | attribute codecs and the lenient attribute parser shared by all families |
//!
//! Types are built on `netlink-packet-core` 0.9 and `netlink-packet-generic` 0.5: a message is
//! a `NetlinkMessage<GenlMessage<F>>` where `F` is [`smc::SmcGenlMessage`],
//! [`engine::EngineMessage`] or [`ctrl::CtrlMessage`], each implementing `GenlFamily`,
//! `Emitable` and `ParseableParametrized<[u8], GenlHeader>`. The functions in [`framing`] add
//! typed errors ([`NlError`]) and length checks on top.
//!
//! # Panic contract
//!
//! Parsing never panics, whatever the bytes. Emitting through `netlink-packet-core`'s
//! `Emitable::emit` panics if the buffer is shorter than `buffer_len()`, or if a value the
//! caller built is longer than an attribute can carry (65531 bytes: the length field is 16
//! bits); the byte-producing helpers in [`framing`] check the latter and return
//! [`NlError::ValueTooLong`] instead.
//!
//! Netlink is host byte order; the byte arrays in the tests are little-endian.

pub mod attr;
pub mod ctrl;
pub mod engine;
pub mod framing;
pub mod loopback;
pub mod smc;

pub use framing::{GenlPayload, Message, RawMessage};

/// What went wrong while decoding (or preparing to encode) a netlink message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NlError {
    /// The buffer ends before a structure does.
    #[error("{what} truncated: need {need} bytes, have {have}")]
    Truncated {
        /// Which structure.
        what: &'static str,
        /// Bytes it needs.
        need: usize,
        /// Bytes there are.
        have: usize,
    },
    /// `nlmsg_len` is smaller than the netlink header itself.
    #[error("netlink message length {declared} is shorter than the 16-byte header")]
    BadMessageLength {
        /// The declared length.
        declared: u32,
    },
    /// `nlmsg_len` is larger than this crate accepts (checked before anything is allocated).
    #[error("netlink message length {declared} exceeds the limit of {max} bytes")]
    TooLarge {
        /// The declared length.
        declared: usize,
        /// [`framing::MAX_MESSAGE_LEN`].
        max: usize,
    },
    /// Message types 5..=15 are reserved for netlink control messages nobody defines.
    #[error("reserved netlink message type {0}")]
    ReservedMessageType(u16),
    /// A message of another family arrived where one family was expected.
    #[error("netlink message type {got} is not the expected family id {expected}")]
    UnexpectedFamily {
        /// `nlmsg_type` found.
        got: u16,
        /// The family id expected.
        expected: u16,
    },
    /// The top-level attribute stream of a message is malformed (nested streams are kept raw
    /// instead, see [`attr`]).
    #[error("malformed attribute stream at offset {offset}: {reason}")]
    Attributes {
        /// Offset within the attribute area.
        offset: usize,
        /// What was wrong.
        reason: attr::AttrErrorKind,
    },
    /// A family that refuses malformed known attributes (`SMCD_LOOPBACK`) got one: the value
    /// of attribute `kind` does not decode as that attribute's type.
    #[error("attribute {kind} has a value that does not decode as its type")]
    InvalidAttribute {
        /// The attribute number (flag bits removed).
        kind: u16,
    },
    /// A reply lacks an attribute the caller needs (for example `CTRL_ATTR_FAMILY_ID`).
    #[error("missing attribute {0}")]
    MissingAttribute(&'static str),
    /// A value the caller built does not fit a 16-bit attribute length.
    #[error("an attribute value is longer than the 65531 bytes netlink can carry")]
    ValueTooLong,
}
