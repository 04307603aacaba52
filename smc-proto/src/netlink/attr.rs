//! Netlink attribute plumbing shared by every family in this module: the one walker over
//! attribute streams ([`attrs`], the kernel's `nla_for_each_attr` with `nla_ok`, typed
//! [`AttrError`]s), value codecs (`u8` .. `u64`, `NLA_UINT`, strings, nests) and the
//! `attr_enum!` macro that turns a table of `Variant(type) = KIND => Codec` lines into an
//! attribute enum implementing [`Nla`] (so `netlink-packet-core` emits it) and [`Attr`] (our
//! lenient parser).
//!
//! Every family here (`SMC_GEN_NETLINK`, `SMCD_ENGINE`, `SMCD_LOOPBACK`, nlctrl) walks its
//! attributes with [`attrs`], at the top level and in every nest; so can code outside this
//! crate that must look at raw attributes (the daemon's policy checks).
//!
//! # Leniency rules (the same at every nesting level)
//!
//! * An attribute whose kind this crate does not know becomes `Other(DefaultNla)` and is
//!   re-emitted byte for byte, flags included.
//! * A *known* attribute whose value does not decode (wrong length for its type, a string that
//!   is not UTF-8, a scalar carrying `NLA_F_NESTED`/`NLA_F_NET_BYTEORDER`, a nest whose inner
//!   attribute stream is malformed or whose length is not a multiple of 4) also becomes
//!   `Other(..)`: one bad attribute never makes a whole dump unreadable, and nothing is lost.
//! * Only a malformed *top-level* attribute stream is an error (there is nothing to keep the
//!   bytes in), see [`NlError::Attributes`]; 1..3 bytes after its last attribute are ignored,
//!   as the kernel's `nla_parse` does (it only logs "bytes leftover").
//! * A family may refuse a message whose *known* attribute did not decode
//!   ([`Attr::is_malformed`]); `SMCD_LOOPBACK` does, see its module.
//!
//! Values are in host byte order, as netlink is.

use core::iter::FusedIterator;
use core::marker::PhantomData;

use netlink_packet_core::{DefaultNla, NLA_F_NESTED, NLA_TYPE_MASK, Nla};

use super::NlError;

/// Size of an attribute header (`struct nlattr`).
pub const NLA_HDRLEN: usize = 4;

/// Largest value an attribute can carry: its 16-bit length field includes the 4-byte header.
pub const MAX_ATTR_VALUE_LEN: usize = u16::MAX as usize - NLA_HDRLEN;

/// Rounds up to the 4-byte netlink alignment (`NLA_ALIGN`, `NLMSG_ALIGN`).
#[inline]
pub const fn align4(n: usize) -> usize {
    n.saturating_add(3) & !3
}

/// One attribute as found in a buffer: its raw type field (flags included) and its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawAttr<'a> {
    /// The 16-bit type field as sent, `NLA_F_NESTED` and `NLA_F_NET_BYTEORDER` included.
    pub kind_raw: u16,
    /// The value, without header or padding.
    pub value: &'a [u8],
}

impl RawAttr<'_> {
    /// The attribute number without flag bits.
    pub fn kind(&self) -> u16 {
        self.kind_raw & NLA_TYPE_MASK
    }

    /// The flag bits of the type field (`NLA_F_NESTED`, `NLA_F_NET_BYTEORDER`).
    pub fn flags(&self) -> u16 {
        self.kind_raw & !NLA_TYPE_MASK
    }

    /// Whether `NLA_F_NESTED` is set.
    pub fn is_nested(&self) -> bool {
        self.kind_raw & NLA_F_NESTED != 0
    }

    /// This attribute as a [`DefaultNla`] that re-emits the same bytes.
    pub fn to_default(&self) -> DefaultNla {
        DefaultNla::new(self.kind_raw, self.value.to_vec())
    }
}

/// Where and why an attribute stream stops being well formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed attribute stream at offset {offset}: {kind}")]
pub struct AttrError {
    /// Offset of the offending attribute header within the stream.
    pub offset: usize,
    /// What is wrong with it.
    pub kind: AttrErrorKind,
}

/// What is wrong with an attribute header (the three checks of the kernel's `nla_ok`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AttrErrorKind {
    /// 1..3 bytes are left: not enough for a header. The kernel's `nla_parse` ignores such a
    /// tail unless it validates strictly (`NL_VALIDATE_TRAILING`).
    #[error("{have} bytes left, fewer than a 4-byte attribute header")]
    ShortHeader {
        /// Bytes left.
        have: usize,
    },
    /// `nla_len` is smaller than the header itself.
    #[error("attribute length {len} is shorter than its header")]
    LengthBelowHeader {
        /// The declared length.
        len: u16,
    },
    /// `nla_len` runs past the end of the stream (or of the enclosing nest).
    #[error("attribute length {len} runs past the end of its container ({have} bytes left)")]
    PastEnd {
        /// The declared length.
        len: u16,
        /// Bytes left in the container, header included.
        have: usize,
    },
}

impl From<AttrError> for NlError {
    fn from(e: AttrError) -> Self {
        NlError::Attributes {
            offset: e.offset,
            reason: e.kind,
        }
    }
}

/// Walks an attribute stream: the kernel's `nla_for_each_attr` loop with its `nla_ok` checks.
///
/// Yields each attribute in order, checking every length before it is used; the last one may
/// omit its padding. At the first malformed header it yields one [`AttrError`] and then ends,
/// because nothing after it can be framed. Callers choose their policy on top:
///
/// * strict (the kernel's `NL_VALIDATE_TRAILING`): `attrs(buf).collect::<Result<Vec<_>, _>>()`;
/// * lenient (`nla_parse` without it, which stops at the bad header):
///   `attrs(buf).map_while(Result::ok)`;
/// * this crate's decoders: an error is fatal except a [`AttrErrorKind::ShortHeader`] tail
///   after the top-level attributes.
pub fn attrs(buf: &[u8]) -> AttrIter<'_> {
    AttrIter { buf, pos: 0 }
}

/// The iterator [`attrs`] returns.
#[derive(Debug, Clone)]
pub struct AttrIter<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> AttrIter<'a> {
    /// The bytes not yet walked (empty once the iterator has ended, also after an error).
    pub fn rest(&self) -> &'a [u8] {
        self.buf.get(self.pos..).unwrap_or_default()
    }

    fn fail(&mut self, kind: AttrErrorKind) -> Option<Result<RawAttr<'a>, AttrError>> {
        let offset = self.pos;
        self.pos = self.buf.len();
        Some(Err(AttrError { offset, kind }))
    }
}

impl<'a> Iterator for AttrIter<'a> {
    type Item = Result<RawAttr<'a>, AttrError>;

    fn next(&mut self) -> Option<Self::Item> {
        let rest = self.rest();
        if rest.is_empty() {
            return None;
        }
        if rest.len() < NLA_HDRLEN {
            return self.fail(AttrErrorKind::ShortHeader { have: rest.len() });
        }
        let len = u16::from_ne_bytes([rest[0], rest[1]]);
        let kind_raw = u16::from_ne_bytes([rest[2], rest[3]]);
        let total = usize::from(len);
        if total < NLA_HDRLEN {
            return self.fail(AttrErrorKind::LengthBelowHeader { len });
        }
        if total > rest.len() {
            return self.fail(AttrErrorKind::PastEnd {
                len,
                have: rest.len(),
            });
        }
        // The last attribute may omit its padding; `pos` then simply passes the end.
        self.pos = self.pos.saturating_add(align4(total));
        Some(Ok(RawAttr {
            kind_raw,
            value: &rest[NLA_HDRLEN..total],
        }))
    }
}

impl FusedIterator for AttrIter<'_> {}

/// An attribute enum generated by `attr_enum!` (or written by hand, like the command-aware
/// top-level enums).
pub trait Attr: Nla + Sized {
    /// Decodes one attribute. Never fails: what does not decode becomes `Other(..)`.
    fn parse_raw(kind_raw: u16, value: &[u8]) -> Self;

    /// Whether this is an `Other(..)` whose attribute number this type knows: a known
    /// attribute whose value (or flags) did not decode, kept raw.
    fn is_malformed(&self) -> bool;

    /// Whether this attribute (and everything nested in it) fits netlink's 16-bit attribute
    /// length. `netlink-packet-core` would overflow the length field otherwise, so every
    /// byte-producing helper in this module checks it first.
    fn fits(&self) -> bool;
}

/// Parses an attribute stream leniently. `None` if the stream itself is malformed.
pub(crate) fn parse_nest<T: Attr>(raw: &[u8]) -> Option<Vec<T>> {
    // The kernel closes every nest on a 4-byte boundary (nla_nest_end measures up to the
    // padded tail). A nest that does not is kept raw, so that re-emitting it can never grow it.
    if !raw.len().is_multiple_of(4) {
        return None;
    }
    attrs(raw)
        .map(|a| a.map(|a| T::parse_raw(a.kind_raw, a.value)))
        .collect::<Result<_, _>>()
        .ok()
}

/// Parses a top-level attribute stream (the bytes after a genetlink header). 1..3 bytes after
/// the last attribute are ignored, as the kernel's `nla_parse` does.
pub(crate) fn parse_top<T, F>(raw: &[u8], mut parse: F) -> Result<Vec<T>, NlError>
where
    F: FnMut(u16, &[u8]) -> T,
{
    let mut out = Vec::new();
    for a in attrs(raw) {
        match a {
            Ok(a) => out.push(parse(a.kind_raw, a.value)),
            Err(AttrError {
                kind: AttrErrorKind::ShortHeader { .. },
                ..
            }) => break,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(out)
}

/// Total emitted size of a list of attributes.
pub(crate) fn attrs_len<T: Nla>(attrs: &[T]) -> usize {
    attrs
        .iter()
        .map(|a| align4(a.value_len()) + NLA_HDRLEN)
        .sum()
}

/// Emits a list of attributes into `buf` (which must be at least `attrs_len(attrs)` long).
///
/// Written here rather than through `netlink-packet-core`'s `Emitable for &[T]`: that one
/// drops `NLA_F_NET_BYTEORDER` when an attribute also has `NLA_F_NESTED` (setting the second
/// flag re-reads the masked type), so a kept `Other` attribute with both flags would not
/// round-trip. Here the type field is `Nla::kind()` as is, flags included.
pub(crate) fn emit_attrs<T: Nla>(attrs: &[T], buf: &mut [u8]) {
    let mut pos = 0;
    for a in attrs {
        let vlen = a.value_len();
        let total = align4(vlen) + NLA_HDRLEN;
        let out = &mut buf[pos..pos + total];
        // Callers check `Attr::fits` before emitting; saturate rather than wrap regardless.
        let len = u16::try_from(vlen + NLA_HDRLEN).unwrap_or(u16::MAX);
        out[0..2].copy_from_slice(&len.to_ne_bytes());
        out[2..4].copy_from_slice(&a.kind().to_ne_bytes());
        a.emit_value(&mut out[NLA_HDRLEN..NLA_HDRLEN + vlen]);
        out[NLA_HDRLEN + vlen..].fill(0);
        pos += total;
    }
}

/// Whether a [`DefaultNla`] fits the 16-bit attribute length.
pub(crate) fn default_fits(nla: &DefaultNla) -> bool {
    nla.value_len() <= MAX_ATTR_VALUE_LEN
}

/// How one attribute value type is encoded.
pub trait AttrCodec {
    /// The Rust type the value decodes to.
    type Value;
    /// Whether the attribute is a nest (emitted with `NLA_F_NESTED`).
    const NESTED: bool = false;
    /// Encoded length of the value (without header and padding).
    fn len(v: &Self::Value) -> usize;
    /// Writes the value into a buffer of exactly `len(v)` bytes.
    fn emit(v: &Self::Value, buf: &mut [u8]);
    /// Decodes a value; `None` keeps the attribute as `Other(..)`.
    fn parse(raw: &[u8]) -> Option<Self::Value>;
    /// Whether the value (recursively) fits netlink's 16-bit attribute length.
    fn fits(v: &Self::Value) -> bool {
        Self::len(v) <= MAX_ATTR_VALUE_LEN
    }
}

/// Whether an attribute's flag bits are acceptable for a codec.
#[inline]
pub(crate) fn flags_ok<C: AttrCodec>(flags: u16) -> bool {
    if C::NESTED {
        // Older kernels opened some SMC nests without the flag (nla_nest_start_noflag).
        flags == 0 || flags == NLA_F_NESTED
    } else {
        flags == 0
    }
}

macro_rules! fixed_codec {
    ($(#[$m:meta])* $name:ident, $ty:ty, $n:expr) => {
        $(#[$m])*
        #[derive(Debug)]
        pub struct $name;
        impl AttrCodec for $name {
            type Value = $ty;
            fn len(_: &$ty) -> usize {
                $n
            }
            fn emit(v: &$ty, buf: &mut [u8]) {
                buf[..$n].copy_from_slice(&v.to_ne_bytes());
            }
            fn parse(raw: &[u8]) -> Option<$ty> {
                Some(<$ty>::from_ne_bytes(raw.try_into().ok()?))
            }
        }
    };
}

fixed_codec!(
    /// `NLA_U8`.
    U8,
    u8,
    1
);
fixed_codec!(
    /// `NLA_U16`, host order.
    U16,
    u16,
    2
);
fixed_codec!(
    /// `NLA_U32`, host order.
    U32,
    u32,
    4
);
fixed_codec!(
    /// `NLA_U64`, host order. The kernel's `nla_put_u64_64bit` inserts a zero-length PAD
    /// attribute first only on architectures without efficient unaligned access; every
    /// architecture this project targets has it, so we never pad (PAD attributes that arrive
    /// are kept as the enum's `Pad` variant).
    U64,
    u64,
    8
);

/// `NLA_UINT` (`nla_put_uint`): 4 bytes when the value fits in 32 bits, else 8. Both widths are
/// accepted on parse.
#[derive(Debug)]
pub struct Uint;
impl AttrCodec for Uint {
    type Value = u64;
    fn len(v: &u64) -> usize {
        if *v <= u64::from(u32::MAX) { 4 } else { 8 }
    }
    fn emit(v: &u64, buf: &mut [u8]) {
        match u32::try_from(*v) {
            Ok(small) => buf[..4].copy_from_slice(&small.to_ne_bytes()),
            Err(_) => buf[..8].copy_from_slice(&v.to_ne_bytes()),
        }
    }
    fn parse(raw: &[u8]) -> Option<u64> {
        match raw.len() {
            4 => Some(u64::from(u32::from_ne_bytes(raw.try_into().ok()?))),
            8 => Some(u64::from_ne_bytes(raw.try_into().ok()?)),
            _ => None,
        }
    }
}

/// A value the kernel declares as `u16` but emits with `nla_put_u32` (SMC-D's
/// `SMC_NLA_LGR_D_CHID`): emitted as 4 bytes, accepted as 2 or 4.
#[derive(Debug)]
pub struct U32Or16;
impl AttrCodec for U32Or16 {
    type Value = u32;
    fn len(_: &u32) -> usize {
        4
    }
    fn emit(v: &u32, buf: &mut [u8]) {
        buf[..4].copy_from_slice(&v.to_ne_bytes());
    }
    fn parse(raw: &[u8]) -> Option<u32> {
        match raw.len() {
            2 => Some(u32::from(u16::from_ne_bytes(raw.try_into().ok()?))),
            4 => Some(u32::from_ne_bytes(raw.try_into().ok()?)),
            _ => None,
        }
    }
}

/// `NLA_NUL_STRING` as the kernel's `nla_put_string` writes it: the bytes and one NUL.
///
/// Parsing follows C: the string ends at the first NUL (or at the end of the value if there is
/// none); it must be UTF-8, else the attribute is kept as `Other`. Strings given to builders
/// must not contain NUL.
#[derive(Debug)]
pub struct Str;
impl AttrCodec for Str {
    type Value = String;
    fn len(v: &String) -> usize {
        v.len() + 1
    }
    fn emit(v: &String, buf: &mut [u8]) {
        buf[..v.len()].copy_from_slice(v.as_bytes());
        buf[v.len()] = 0;
    }
    fn parse(raw: &[u8]) -> Option<String> {
        let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
        core::str::from_utf8(&raw[..end]).ok().map(str::to_owned)
    }
}

/// `NLA_BINARY`: raw bytes.
#[derive(Debug)]
pub struct Bytes;
impl AttrCodec for Bytes {
    type Value = Vec<u8>;
    fn len(v: &Vec<u8>) -> usize {
        v.len()
    }
    fn emit(v: &Vec<u8>, buf: &mut [u8]) {
        buf[..v.len()].copy_from_slice(v);
    }
    fn parse(raw: &[u8]) -> Option<Vec<u8>> {
        Some(raw.to_vec())
    }
}

/// A nest of attributes of type `T`, emitted with `NLA_F_NESTED` (as `nla_nest_start` does).
#[derive(Debug)]
pub struct Nest<T>(PhantomData<T>);
impl<T: Attr> AttrCodec for Nest<T> {
    type Value = Vec<T>;
    const NESTED: bool = true;
    fn len(v: &Vec<T>) -> usize {
        attrs_len(v)
    }
    fn emit(v: &Vec<T>, buf: &mut [u8]) {
        emit_attrs(v, buf)
    }
    fn parse(raw: &[u8]) -> Option<Vec<T>> {
        parse_nest(raw)
    }
    fn fits(v: &Vec<T>) -> bool {
        v.iter().all(Attr::fits) && attrs_len(v) <= MAX_ATTR_VALUE_LEN
    }
}

/// Declares an attribute enum from a table of `Variant(Type) = KIND => Codec,` lines and an
/// optional `units { Variant = KIND, }` block for zero-length attributes (the kernel's PAD).
/// Every generated enum ends in `Other(DefaultNla)`.
macro_rules! attr_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $var:ident($ty:ty) = $kind:path => $codec:ty, )*
        }
        $( units { $( $(#[$umeta:meta])* $uvar:ident = $ukind:path, )* } )?
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum $name {
            $( $(#[$vmeta])* $var($ty), )*
            $( $( $(#[$umeta])* $uvar, )* )?
            /// An attribute this crate does not know, or a known one whose value did not
            /// decode; kept byte for byte (flags included) and re-emitted unchanged.
            Other(::netlink_packet_core::DefaultNla),
        }

        impl ::netlink_packet_core::Nla for $name {
            fn value_len(&self) -> usize {
                match self {
                    $( Self::$var(v) => <$codec as $crate::netlink::attr::AttrCodec>::len(v), )*
                    $( $( Self::$uvar => 0, )* )?
                    Self::Other(o) => ::netlink_packet_core::Nla::value_len(o),
                }
            }
            fn kind(&self) -> u16 {
                match self {
                    $( Self::$var(_) => {
                        if <$codec as $crate::netlink::attr::AttrCodec>::NESTED {
                            $kind | ::netlink_packet_core::NLA_F_NESTED
                        } else {
                            $kind
                        }
                    } )*
                    $( $( Self::$uvar => $ukind, )* )?
                    Self::Other(o) => ::netlink_packet_core::Nla::kind(o),
                }
            }
            fn emit_value(&self, buf: &mut [u8]) {
                match self {
                    $( Self::$var(v) => <$codec as $crate::netlink::attr::AttrCodec>::emit(v, buf), )*
                    $( $( Self::$uvar => {} )* )?
                    Self::Other(o) => ::netlink_packet_core::Nla::emit_value(o, buf),
                }
            }
        }

        impl $crate::netlink::attr::Attr for $name {
            #[allow(unreachable_code, unused_variables)]
            fn parse_raw(kind_raw: u16, value: &[u8]) -> Self {
                let kind = kind_raw & ::netlink_packet_core::NLA_TYPE_MASK;
                let flags = kind_raw & !::netlink_packet_core::NLA_TYPE_MASK;
                $(
                    if kind == $kind && $crate::netlink::attr::flags_ok::<$codec>(flags) {
                        if let Some(v) = <$codec as $crate::netlink::attr::AttrCodec>::parse(value) {
                            return Self::$var(v);
                        }
                    }
                )*
                $( $(
                    if kind == $ukind && flags == 0 && value.is_empty() {
                        return Self::$uvar;
                    }
                )* )?
                Self::Other(::netlink_packet_core::DefaultNla::new(kind_raw, value.to_vec()))
            }

            fn is_malformed(&self) -> bool {
                match self {
                    Self::Other(o) => {
                        let kind = ::netlink_packet_core::Nla::kind(o)
                            & ::netlink_packet_core::NLA_TYPE_MASK;
                        false $( || kind == $kind )* $( $( || kind == $ukind )* )?
                    }
                    _ => false,
                }
            }

            fn fits(&self) -> bool {
                match self {
                    $( Self::$var(v) => <$codec as $crate::netlink::attr::AttrCodec>::fits(v), )*
                    $( $( Self::$uvar => true, )* )?
                    Self::Other(o) => $crate::netlink::attr::default_fits(o),
                }
            }
        }
    };
}

pub(crate) use attr_enum;

#[cfg(test)]
mod tests {
    use super::*;

    fn walk(buf: &[u8]) -> Vec<Result<RawAttr<'_>, AttrError>> {
        attrs(buf).collect()
    }

    #[test]
    fn walker_rejects_bad_lengths() {
        // length 3 < header
        assert_eq!(
            walk(&[3, 0, 1, 0]),
            [Err(AttrError {
                offset: 0,
                kind: AttrErrorKind::LengthBelowHeader { len: 3 }
            })]
        );
        // length 12 > buffer
        assert_eq!(
            walk(&[12, 0, 1, 0, 0, 0, 0, 0]),
            [Err(AttrError {
                offset: 0,
                kind: AttrErrorKind::PastEnd { len: 12, have: 8 }
            })]
        );
        // two leftover bytes: one attribute, then the error, then nothing
        let mut it = attrs(&[4, 0, 1, 0, 9, 9]);
        assert_eq!(it.next().unwrap().unwrap().kind(), 1);
        assert_eq!(it.rest(), &[9, 9]);
        assert_eq!(
            it.next(),
            Some(Err(AttrError {
                offset: 4,
                kind: AttrErrorKind::ShortHeader { have: 2 }
            }))
        );
        assert_eq!(it.next(), None);
        assert_eq!(it.rest(), &[] as &[u8]);
        // ...which the top-level parser ignores and a nest does not accept.
        assert_eq!(parse_top(&[4, 0, 1, 0, 9, 9], |k, _| k).unwrap(), [1]);
        assert!(matches!(
            parse_top(&[4, 0, 1, 0, 3, 0, 1, 0], |k, _| k),
            Err(NlError::Attributes { offset: 4, .. })
        ));
        // last attribute without its padding is fine
        let a = walk(&[5, 0, 2, 0, 7]);
        let a = a[0].as_ref().unwrap();
        assert_eq!(a.value, &[7]);
        assert_eq!(a.kind(), 2);
    }

    #[test]
    fn walker_reports_flags() {
        let a = walk(&[8, 0, 3, 0x80, 1, 2, 3, 4])[0].unwrap();
        assert_eq!(a.kind(), 3);
        assert_eq!(a.flags(), NLA_F_NESTED);
        assert!(a.is_nested());
        assert_eq!(a.to_default().kind(), 0x8003);
    }

    #[test]
    fn uint_width() {
        assert_eq!(Uint::len(&5), 4);
        assert_eq!(Uint::len(&(1 << 40)), 8);
        assert_eq!(Uint::parse(&7u32.to_ne_bytes()), Some(7));
        assert_eq!(Uint::parse(&7u64.to_ne_bytes()), Some(7));
        assert_eq!(Uint::parse(&[1, 2, 3]), None);
    }

    #[test]
    fn strings_stop_at_nul() {
        assert_eq!(Str::parse(b"abc\0\0"), Some("abc".into()));
        assert_eq!(Str::parse(b"abc"), Some("abc".into()));
        assert_eq!(Str::parse(b""), Some(String::new()));
        assert_eq!(Str::parse(&[0xff, 0]), None);
    }

    #[test]
    fn align() {
        assert_eq!(align4(0), 0);
        assert_eq!(align4(5), 8);
        assert_eq!(align4(usize::MAX), usize::MAX & !3);
    }
}
