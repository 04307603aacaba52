//! What the flag bytes of the CDC and LLC modules share, on top of the `bitflags` crate.
//!
//! The kernel declares these bytes as C bitfields (`struct smc_cdc_producer_flags`,
//! `struct smc_cdc_conn_state_flags`) or plain `u8 flags` with `#define`d masks. On the wire they
//! are single bytes whose bit 7 is the most significant bit. Each type is a `bitflags!` struct
//! over the whole byte that ends in `const _ = !0;`: every bit counts as known to `bitflags`, so
//! `from_bits` never fails, `!`/`complement` and `from_bits_truncate` drop nothing, and a bit we
//! have no name for survives a parse/emit round trip. Parsers use `from_bits_retain` (or
//! `From<u8>`).
//!
//! [`flag_byte!`] adds what `bitflags` does not have: `EMPTY`, `KNOWN` (only the named bits,
//! since `all()` is every bit), `unknown_bits()`, `From<u8>`, `From<Flags> for u8`, and a
//! `Debug` that shows the byte, every name whose bits are set (aliases included, because the
//! LLC names depend on the message type) and the bits without a name.

use core::fmt;

use bitflags::Flags;

/// Adds `EMPTY`, `KNOWN`, `unknown_bits`, the `u8` conversions and [`fmt_flag_byte`]'s
/// `Debug` to a `bitflags!` type over `u8`.
macro_rules! flag_byte {
    ($name:ident) => {
        impl $name {
            /// No bit set.
            pub const EMPTY: Self = Self::empty();

            /// Every bit this type names (unlike `all()`, which is every bit of the byte).
            pub const KNOWN: Self = {
                let flags = <Self as ::bitflags::Flags>::FLAGS;
                let mut bits = 0u8;
                let mut i = 0;
                while i < flags.len() {
                    if flags[i].is_named() {
                        bits |= flags[i].value().bits();
                    }
                    i += 1;
                }
                Self::from_bits_retain(bits)
            };

            /// The bits that have no name in this type (kept, never interpreted).
            #[inline]
            pub const fn unknown_bits(self) -> u8 {
                self.bits() & !Self::KNOWN.bits()
            }
        }

        impl From<u8> for $name {
            /// Every bit is kept, named or not.
            #[inline]
            fn from(bits: u8) -> Self {
                Self::from_bits_retain(bits)
            }
        }

        impl From<$name> for u8 {
            #[inline]
            fn from(f: $name) -> u8 {
                f.bits()
            }
        }

        impl ::core::fmt::Debug for $name {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                $crate::cdc::flags::fmt_flag_byte(f, stringify!($name), *self)
            }
        }
    };
}

pub(crate) use flag_byte;

/// `Name(0x87: WRITE_BLOCKED | unknown 0x07)`: the byte, each name all of whose bits are set,
/// then the bits no name covers. An empty byte is `Name(0x00)`.
pub(crate) fn fmt_flag_byte<F>(f: &mut fmt::Formatter<'_>, name: &str, flags: F) -> fmt::Result
where
    F: Flags<Bits = u8>,
{
    let bits = flags.bits();
    write!(f, "{name}({bits:#04x}")?;
    let mut sep = ": ";
    let mut known = 0u8;
    for flag in F::FLAGS.iter().filter(|flag| flag.is_named()) {
        let value = flag.value().bits();
        known |= value;
        if value != 0 && bits & value == value {
            write!(f, "{sep}{}", flag.name())?;
            sep = " | ";
        }
    }
    let unknown = bits & !known;
    if unknown != 0 {
        write!(f, "{sep}unknown {unknown:#04x}")?;
    }
    f.write_str(")")
}
