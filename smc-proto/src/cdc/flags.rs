//! Small flag-byte newtypes shared by the CDC and LLC modules.
//!
//! The kernel declares these bytes as C bitfields (`struct smc_cdc_producer_flags`,
//! `struct smc_cdc_conn_state_flags`) or plain `u8 flags` with `#define`d masks. On the wire they
//! are single bytes whose bit 7 is the most significant bit. A newtype over the whole byte keeps
//! bits we do not know about, so an unknown bit survives a parse/emit round trip.

/// Defines a `u8` flag newtype with named bit constants, `bits`/`from_bits`, set operations,
/// one boolean getter per named bit, and a `Debug` that names the bits and shows unknown ones.
macro_rules! flags_newtype {
    (
        $(#[$meta:meta])*
        $name:ident {
            $( $(#[$cmeta:meta])* $konst:ident = $value:expr => $getter:ident ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name(u8);

        impl $name {
            $( $(#[$cmeta])* pub const $konst: Self = Self($value); )*

            /// No bit set.
            pub const EMPTY: Self = Self(0);

            /// Every bit this type names.
            pub const KNOWN: Self = Self(0 $(| $value)*);

            /// Wraps a raw byte; bits without a name are kept.
            #[inline]
            pub const fn from_bits(bits: u8) -> Self {
                Self(bits)
            }

            /// The raw byte.
            #[inline]
            pub const fn bits(self) -> u8 {
                self.0
            }

            /// True if every bit of `other` is set in `self`.
            #[inline]
            pub const fn contains(self, other: Self) -> bool {
                self.0 & other.0 == other.0
            }

            /// `self` with the bits of `other` added.
            #[inline]
            #[must_use]
            pub const fn union(self, other: Self) -> Self {
                Self(self.0 | other.0)
            }

            /// `self` without the bits of `other`.
            #[inline]
            #[must_use]
            pub const fn difference(self, other: Self) -> Self {
                Self(self.0 & !other.0)
            }

            /// Sets or clears the bits of `other`.
            #[inline]
            pub fn set(&mut self, other: Self, on: bool) {
                if on {
                    self.0 |= other.0;
                } else {
                    self.0 &= !other.0;
                }
            }

            /// The bits that have no name in this type (kept, never interpreted).
            #[inline]
            pub const fn unknown_bits(self) -> u8 {
                self.0 & !Self::KNOWN.0
            }

            $(
                #[doc = concat!("True if [`", stringify!($name), "::", stringify!($konst), "`] is set.")]
                #[inline]
                pub const fn $getter(self) -> bool {
                    self.0 & $value != 0
                }
            )*
        }

        impl core::ops::BitOr for $name {
            type Output = Self;
            #[inline]
            fn bitor(self, rhs: Self) -> Self {
                self.union(rhs)
            }
        }

        impl core::ops::BitOrAssign for $name {
            #[inline]
            fn bitor_assign(&mut self, rhs: Self) {
                self.0 |= rhs.0;
            }
        }

        impl From<u8> for $name {
            #[inline]
            fn from(bits: u8) -> Self {
                Self(bits)
            }
        }

        impl From<$name> for u8 {
            #[inline]
            fn from(f: $name) -> u8 {
                f.0
            }
        }

        impl core::fmt::Debug for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                write!(f, "{}({:#04x}", stringify!($name), self.0)?;
                let mut sep = ": ";
                $(
                    if self.0 & $value == $value && $value != 0 {
                        write!(f, "{}{}", sep, stringify!($konst))?;
                        sep = " | ";
                    }
                )*
                if self.unknown_bits() != 0 {
                    write!(f, "{}unknown {:#04x}", sep, self.unknown_bits())?;
                }
                write!(f, ")")
            }
        }
    };
}

pub(crate) use flags_newtype;
