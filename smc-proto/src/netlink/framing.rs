//! Netlink message framing: a buffer holds one or more messages, each a 16-byte `nlmsghdr`
//! (`len`, `type`, `flags`, `seq`, `pid`, host order) followed by its payload, the next one
//! starting at the following 4-byte boundary (`NLMSG_ALIGN`).
//!
//! Types below 16 are netlink's own: `NLMSG_NOOP` (1), `NLMSG_ERROR` (2: an `int` error, 0 for
//! an ACK or a negative errno, followed by the request's header, or the whole request when the
//! error is not capped), `NLMSG_DONE` (3: ends a dump; an `int`, may be empty) and
//! `NLMSG_OVERRUN` (4). Everything else is a generic netlink message: a 4-byte `genlmsghdr`
//! (`cmd`, `version`, reserved `u16`) and attributes.
//!
//! How the kernel answers (net/netlink/af_netlink.c `netlink_ack`, `netlink_dump_done`):
//!
//! * a dump request (`NLM_F_REQUEST | NLM_F_DUMP`) gets messages flagged `NLM_F_MULTI` and one
//!   `NLMSG_DONE` (also `NLM_F_MULTI`, error 0); it gets no separate ACK even if it asked for
//!   one;
//! * a do request gets its reply (flags 0), then, with `NLM_F_ACK`, an ACK: `NLMSG_ERROR` with
//!   error 0, flag `NLM_F_CAPPED`, and only the request's 16-byte header;
//! * a failed request gets `NLMSG_ERROR` with `-errno`, flags 0, and the whole request (header
//!   and payload) echoed.
//!
//! Replies carry the request's sequence number and port id.
//!
//! Parsing checks every length before using it and rejects a declared message length above
//! [`MAX_MESSAGE_LEN`] before allocating anything.

use core::fmt::Debug;
use core::num::NonZeroI32;

use netlink_packet_core::{
    DoneMessage, Emitable, ErrorMessage, NLMSG_DONE, NLMSG_ERROR, NLMSG_NOOP, NLMSG_OVERRUN,
    NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_generic::{GenlFamily, GenlHeader, GenlMessage};

use super::NlError;
use super::attr::align4;

pub use netlink_packet_core::{
    NLM_F_ACK, NLM_F_ACK_TLVS, NLM_F_CAPPED, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_ECHO,
    NLM_F_MULTIPART, NLM_F_REQUEST,
};

/// `NLM_F_MULTI` (the kernel's name; `netlink-packet-core` calls it `NLM_F_MULTIPART`).
pub const NLM_F_MULTI: u16 = NLM_F_MULTIPART;

/// Size of `struct nlmsghdr`.
pub const NLMSG_HDRLEN: usize = 16;

/// Size of `struct genlmsghdr`.
pub const GENL_HDRLEN: usize = 4;

/// First message type that is not a netlink control message.
pub const NLMSG_MIN_TYPE: u16 = 0x10;

/// Largest message this crate parses. The kernel's dump messages are at most a page or two
/// (netlink's default dump buffer is 32 KiB); one MiB leaves room and still bounds what a
/// reader sized from `nlmsg_len` may allocate.
pub const MAX_MESSAGE_LEN: usize = 1 << 20;

/// A generic netlink message of family payload `T`.
pub type Message<T> = NetlinkMessage<GenlMessage<T>>;

/// A family payload this module can parse with typed errors and emit with size checks.
pub trait GenlPayload: GenlFamily + Emitable + Debug + Sized {
    /// Decodes the attributes after the genetlink header. The header is passed because some
    /// families (SMC) number their top-level attributes per command.
    fn parse_genl(header: &GenlHeader, attrs: &[u8]) -> Result<Self, NlError>;

    /// Whether every attribute fits netlink's 16-bit attribute length.
    fn fits(&self) -> bool;
}

/// One message split off a buffer, header decoded, payload not yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawMessage<'a> {
    /// The decoded `nlmsghdr`.
    pub header: NetlinkHeader,
    /// The payload (`nlmsg_len - 16` bytes).
    pub payload: &'a [u8],
}

impl RawMessage<'_> {
    /// The message's bytes as they were (header re-encoded, which is lossless).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = vec![0u8; NLMSG_HDRLEN + self.payload.len()];
        self.header.emit(&mut out[..NLMSG_HDRLEN]);
        out[NLMSG_HDRLEN..].copy_from_slice(self.payload);
        out
    }

    /// The genetlink command byte, if this is a family message with a genetlink header.
    pub fn genl_cmd(&self) -> Option<u8> {
        (self.header.message_type >= NLMSG_MIN_TYPE)
            .then(|| self.payload.first().copied())
            .flatten()
    }
}

/// Decodes the `nlmsghdr` at the start of `buf` and checks its length against the buffer
/// and [`MAX_MESSAGE_LEN`]. Returns the header; a stream reader can use
/// `header.length` to know how much to read once 16 bytes are in.
pub fn peek_header(buf: &[u8]) -> Result<NetlinkHeader, NlError> {
    if buf.len() < NLMSG_HDRLEN {
        return Err(NlError::Truncated {
            what: "netlink header",
            need: NLMSG_HDRLEN,
            have: buf.len(),
        });
    }
    let h = decode_header(buf);
    let declared = h.length as usize;
    if declared < NLMSG_HDRLEN {
        return Err(NlError::BadMessageLength { declared: h.length });
    }
    if declared > MAX_MESSAGE_LEN {
        return Err(NlError::TooLarge {
            declared,
            max: MAX_MESSAGE_LEN,
        });
    }
    Ok(h)
}

/// Splits a buffer into messages. Trailing bytes shorter than a header after the last message
/// (padding) are ignored; anything else that does not frame is an error.
pub fn split_messages(buf: &[u8]) -> Result<Vec<RawMessage<'_>>, NlError> {
    let mut out = Vec::new();
    let mut pos = 0usize;
    while pos < buf.len() {
        let rest = &buf[pos..];
        if rest.len() < NLMSG_HDRLEN && !out.is_empty() && rest.iter().all(|&b| b == 0) {
            break; // alignment padding after the last message
        }
        let header = peek_header(rest)?;
        let len = header.length as usize;
        if len > rest.len() {
            return Err(NlError::Truncated {
                what: "netlink message",
                need: len,
                have: rest.len(),
            });
        }
        out.push(RawMessage {
            header,
            payload: &rest[NLMSG_HDRLEN..len],
        });
        pos = pos.saturating_add(align4(len));
    }
    Ok(out)
}

/// Decodes one message of family payload `T` (or a netlink control message).
pub fn parse_message<T: GenlPayload>(raw: &RawMessage<'_>) -> Result<Message<T>, NlError> {
    let p = raw.payload;
    let payload = match raw.header.message_type {
        NLMSG_NOOP => NetlinkPayload::Noop,
        NLMSG_ERROR => {
            if p.len() < 4 {
                return Err(NlError::Truncated {
                    what: "NLMSG_ERROR",
                    need: 4,
                    have: p.len(),
                });
            }
            let mut e = ErrorMessage::default();
            e.code = NonZeroI32::new(i32::from_ne_bytes([p[0], p[1], p[2], p[3]]));
            e.header = p[4..].to_vec();
            NetlinkPayload::Error(e)
        }
        NLMSG_DONE => {
            let mut d = DoneMessage::default();
            // The kernel allows an empty NLMSG_DONE.
            if !p.is_empty() {
                if p.len() < 4 {
                    return Err(NlError::Truncated {
                        what: "NLMSG_DONE",
                        need: 4,
                        have: p.len(),
                    });
                }
                d.code = i32::from_ne_bytes([p[0], p[1], p[2], p[3]]);
                d.extended_ack = p[4..].to_vec();
            }
            NetlinkPayload::Done(d)
        }
        NLMSG_OVERRUN => NetlinkPayload::Overrun(p.to_vec()),
        t if t < NLMSG_MIN_TYPE => return Err(NlError::ReservedMessageType(t)),
        t => {
            if p.len() < GENL_HDRLEN {
                return Err(NlError::Truncated {
                    what: "genetlink header",
                    need: GENL_HDRLEN,
                    have: p.len(),
                });
            }
            let gh = GenlHeader {
                cmd: p[0],
                version: p[1],
            };
            let inner = T::parse_genl(&gh, &p[GENL_HDRLEN..])?;
            NetlinkPayload::InnerMessage(GenlMessage::new(gh, inner, t))
        }
    };
    Ok(NetlinkMessage::new(raw.header, payload))
}

/// Splits and decodes every message in `buf` as family payload `T` (control messages too).
pub fn parse_messages<T: GenlPayload>(buf: &[u8]) -> Result<Vec<Message<T>>, NlError> {
    split_messages(buf)?.iter().map(parse_message).collect()
}

/// Like [`parse_messages`], but every non-control message must carry `family_id`.
pub fn parse_family_messages<T: GenlPayload>(
    buf: &[u8],
    family_id: u16,
) -> Result<Vec<Message<T>>, NlError> {
    split_messages(buf)?
        .iter()
        .map(|raw| {
            let t = raw.header.message_type;
            if t >= NLMSG_MIN_TYPE && t != family_id {
                return Err(NlError::UnexpectedFamily {
                    got: t,
                    expected: family_id,
                });
            }
            parse_message(raw)
        })
        .collect()
}

fn header(flags: u16, seq: u32, port: u32) -> NetlinkHeader {
    let mut h = NetlinkHeader::default();
    h.flags = flags;
    h.sequence_number = seq;
    h.port_number = port;
    h
}

/// Wraps a family payload with its genetlink header (`cmd` and `version` from the payload)
/// and netlink header; `finalize` is applied so the message can be emitted as is.
pub fn message<T: GenlPayload>(
    family_id: u16,
    payload: T,
    flags: u16,
    seq: u32,
    port: u32,
) -> Message<T> {
    let genl = GenlHeader {
        cmd: payload.command(),
        version: payload.version(),
    };
    let mut m = NetlinkMessage::new(
        header(flags, seq, port),
        NetlinkPayload::InnerMessage(GenlMessage::new(genl, payload, family_id)),
    );
    m.finalize();
    m
}

/// A dump request: `NLM_F_REQUEST | NLM_F_DUMP`, as smc-tools sends for every `GET_*`/`DUMP_*`
/// command (libnl also sets `NLM_F_ACK`; pass `ack` to do the same; the kernel sends no ACK
/// for dumps either way).
pub fn dump_request<T: GenlPayload>(family_id: u16, payload: T, seq: u32, ack: bool) -> Message<T> {
    let flags = NLM_F_REQUEST | NLM_F_DUMP | if ack { NLM_F_ACK } else { 0 };
    message(family_id, payload, flags, seq, 0)
}

/// A do request: `NLM_F_REQUEST`, plus `NLM_F_ACK` when the caller wants the success ACK.
pub fn do_request<T: GenlPayload>(family_id: u16, payload: T, seq: u32, ack: bool) -> Message<T> {
    let flags = NLM_F_REQUEST | if ack { NLM_F_ACK } else { 0 };
    message(family_id, payload, flags, seq, 0)
}

/// The reply to a do request (flags 0, the request's sequence number and port id).
pub fn do_reply<T: GenlPayload>(family_id: u16, request: &NetlinkHeader, payload: T) -> Message<T> {
    message(
        family_id,
        payload,
        0,
        request.sequence_number,
        request.port_number,
    )
}

/// The answer to a dump request: one `NLM_F_MULTI` message per item, then `NLMSG_DONE`.
pub fn dump_reply<T: GenlPayload>(
    family_id: u16,
    request: &NetlinkHeader,
    items: impl IntoIterator<Item = T>,
) -> Vec<Message<T>> {
    let mut out: Vec<Message<T>> = items
        .into_iter()
        .map(|p| {
            message(
                family_id,
                p,
                NLM_F_MULTI,
                request.sequence_number,
                request.port_number,
            )
        })
        .collect();
    out.push(done(request));
    out
}

/// `NLMSG_DONE` ending a dump: flag `NLM_F_MULTI`, error 0 (netlink_dump_done).
pub fn done<T: GenlPayload>(request: &NetlinkHeader) -> Message<T> {
    let mut m = NetlinkMessage::new(
        header(NLM_F_MULTI, request.sequence_number, request.port_number),
        NetlinkPayload::Done(DoneMessage::default()),
    );
    m.finalize();
    m
}

/// The ACK for a successful request: `NLMSG_ERROR` with error 0, flag `NLM_F_CAPPED`, carrying
/// only the request's header (netlink_ack).
pub fn ack<T: GenlPayload>(request: &NetlinkHeader) -> Message<T> {
    error_message(request, None, header_bytes(request), NLM_F_CAPPED)
}

/// The reply to a failed request: `NLMSG_ERROR` with `-errno` (give `errno` as the positive
/// libc constant or already negated) and the whole request echoed, as the kernel does unless
/// the socket asked for capped errors. `errno == 0` gives an [`ack`].
pub fn error_reply<T: GenlPayload>(request: &RawMessage<'_>, errno: i32) -> Message<T> {
    match NonZeroI32::new(negate_errno(errno)) {
        None => ack(&request.header),
        Some(code) => error_message(&request.header, Some(code), request.to_bytes(), 0),
    }
}

/// Like [`error_reply`], but echoing only the request's header (`NLM_F_CAPPED`), for callers
/// that no longer hold the request's payload.
pub fn error_reply_capped<T: GenlPayload>(request: &NetlinkHeader, errno: i32) -> Message<T> {
    match NonZeroI32::new(negate_errno(errno)) {
        None => ack(request),
        Some(code) => error_message(request, Some(code), header_bytes(request), NLM_F_CAPPED),
    }
}

fn negate_errno(errno: i32) -> i32 {
    if errno > 0 { -errno } else { errno }
}

fn header_bytes(h: &NetlinkHeader) -> Vec<u8> {
    let mut b = vec![0u8; NLMSG_HDRLEN];
    h.emit(&mut b);
    b
}

fn error_message<T: GenlPayload>(
    request: &NetlinkHeader,
    code: Option<NonZeroI32>,
    echoed: Vec<u8>,
    flags: u16,
) -> Message<T> {
    let mut e = ErrorMessage::default();
    e.code = code;
    e.header = echoed;
    let mut m = NetlinkMessage::new(
        header(flags, request.sequence_number, request.port_number),
        NetlinkPayload::Error(e),
    );
    m.finalize();
    m
}

/// The error of an `NLMSG_ERROR`: 0 for an ACK, else a negative errno.
pub fn errno_of(e: &ErrorMessage) -> i32 {
    e.code.map_or(0, NonZeroI32::get)
}

/// The request header echoed in an `NLMSG_ERROR`, if at least 16 bytes were echoed.
pub fn echoed_header(e: &ErrorMessage) -> Option<NetlinkHeader> {
    (e.header.len() >= NLMSG_HDRLEN).then(|| decode_header(&e.header))
}

/// Decodes the 16 header bytes; the caller guarantees `buf.len() >= 16`.
fn decode_header(b: &[u8]) -> NetlinkHeader {
    let mut h = NetlinkHeader::default();
    h.length = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
    h.message_type = u16::from_ne_bytes([b[4], b[5]]);
    h.flags = u16::from_ne_bytes([b[6], b[7]]);
    h.sequence_number = u32::from_ne_bytes([b[8], b[9], b[10], b[11]]);
    h.port_number = u32::from_ne_bytes([b[12], b[13], b[14], b[15]]);
    h
}

/// How a reply stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyEnd {
    /// `NLMSG_DONE` (end of a dump), with its error field (0 normally).
    Done(i32),
    /// `NLMSG_ERROR` with error 0: the ACK of a do request.
    Ack,
    /// `NLMSG_ERROR` with a negative errno.
    Error(i32),
}

/// The family payloads of a batch of reply messages, and how the exchange ended if the batch
/// says so (`None`: more messages will follow, read again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyBatch<T> {
    /// Family payloads in order.
    pub payloads: Vec<T>,
    /// Set by the first `NLMSG_DONE` or `NLMSG_ERROR`; messages after it are ignored.
    pub end: Option<ReplyEnd>,
}

/// Sorts parsed reply messages into payloads and the end marker, as a client reading a dump
/// or a do reply needs. `NLMSG_NOOP` and `NLMSG_OVERRUN` are skipped.
pub fn collect_replies<T>(msgs: impl IntoIterator<Item = Message<T>>) -> ReplyBatch<T> {
    let mut payloads = Vec::new();
    let mut end = None;
    for m in msgs {
        match m.payload {
            NetlinkPayload::InnerMessage(g) => payloads.push(g.payload),
            NetlinkPayload::Done(d) => end = Some(ReplyEnd::Done(d.code)),
            NetlinkPayload::Error(e) => {
                end = Some(match errno_of(&e) {
                    0 => ReplyEnd::Ack,
                    n => ReplyEnd::Error(n),
                })
            }
            _ => {}
        }
        if end.is_some() {
            break;
        }
    }
    ReplyBatch { payloads, end }
}

/// Encodes one message: checks attribute sizes, sets `nlmsg_len` and `nlmsg_type` from the
/// payload, and emits.
pub fn to_bytes<T: GenlPayload>(msg: &Message<T>) -> Result<Vec<u8>, NlError> {
    let mut out = Vec::new();
    append_bytes(msg, &mut out)?;
    Ok(out)
}

/// Encodes several messages one after another, each starting on a 4-byte boundary.
pub fn to_bytes_many<'a, T: GenlPayload + 'a + Clone>(
    msgs: impl IntoIterator<Item = &'a Message<T>>,
) -> Result<Vec<u8>, NlError> {
    let mut out = Vec::new();
    for m in msgs {
        let pad = align4(out.len()) - out.len();
        out.extend(core::iter::repeat_n(0u8, pad));
        append_bytes(m, &mut out)?;
    }
    Ok(out)
}

fn append_bytes<T: GenlPayload>(msg: &Message<T>, out: &mut Vec<u8>) -> Result<(), NlError> {
    let payload_len = match &msg.payload {
        NetlinkPayload::InnerMessage(g) => {
            if !g.payload.fits() {
                return Err(NlError::ValueTooLong);
            }
            g.buffer_len()
        }
        NetlinkPayload::Error(e) => e.buffer_len(),
        NetlinkPayload::Done(d) => d.buffer_len(),
        NetlinkPayload::Overrun(b) => b.len(),
        _ => 0,
    };
    let total = NLMSG_HDRLEN + payload_len;
    let length = u32::try_from(total).map_err(|_| NlError::TooLarge {
        declared: total,
        max: MAX_MESSAGE_LEN,
    })?;
    let mut h = msg.header;
    h.length = length;
    h.message_type = match &msg.payload {
        // The id the message was parsed with or built for wins over a family's static id
        // (nlctrl's 16), so re-emitting a parsed message keeps its type.
        NetlinkPayload::InnerMessage(g) => match g.resolved_family_id() {
            0 => g.family_id(),
            id => id,
        },
        NetlinkPayload::Error(_) => NLMSG_ERROR,
        NetlinkPayload::Done(_) => NLMSG_DONE,
        NetlinkPayload::Overrun(_) => NLMSG_OVERRUN,
        _ => NLMSG_NOOP,
    };
    let start = out.len();
    out.resize(start + total, 0);
    let buf = &mut out[start..];
    h.emit(&mut buf[..NLMSG_HDRLEN]);
    let body = &mut buf[NLMSG_HDRLEN..];
    match &msg.payload {
        NetlinkPayload::InnerMessage(g) => g.emit(body),
        NetlinkPayload::Error(e) => e.emit(body),
        NetlinkPayload::Done(d) => d.emit(body),
        NetlinkPayload::Overrun(b) => body.copy_from_slice(b),
        _ => {}
    }
    Ok(())
}

/// Implements `netlink-packet-generic`'s parse trait for a [`GenlPayload`] by delegating to
/// [`GenlPayload::parse_genl`] (its error type is a string; ours is typed).
macro_rules! impl_parseable_via_genl {
    ($t:ty) => {
        impl
            ::netlink_packet_core::ParseableParametrized<[u8], ::netlink_packet_generic::GenlHeader>
            for $t
        {
            fn parse_with_param(
                buf: &[u8],
                header: ::netlink_packet_generic::GenlHeader,
            ) -> Result<Self, ::netlink_packet_core::DecodeError> {
                <$t as $crate::netlink::framing::GenlPayload>::parse_genl(&header, buf)
                    .map_err(|e| ::netlink_packet_core::DecodeError::from(e.to_string()))
            }
        }
    };
}

pub(crate) use impl_parseable_via_genl;
