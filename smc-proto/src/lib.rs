//! SMC wire formats, byte-compatible with the Linux kernel's `net/smc`.
//!
//! This crate has no IO, no clock and no threads: it turns bytes into plain values and values
//! into bytes. Every format follows the same shape (after smoltcp's `wire` module):
//!
//! * a checked **view** over a byte buffer (`Foo<T: AsRef<[u8]>>`) whose `new_checked`
//!   validates lengths once, after which no accessor can panic;
//! * a plain-data **repr** (`FooRepr`) with `parse(&view) -> Result<Repr, Error>`,
//!   `buffer_len()` and `emit(&mut view)`;
//! * codepoints as enums with an `Unknown(..)`/`Other(..)` arm, so an unknown value never fails
//!   to decode and survives a round trip.
//!
//! # Panic contract
//!
//! No function in this crate panics on any input bytes. Parsers return a typed error that
//! says what was wrong. `emit` functions may panic only when the caller hands them a buffer
//! shorter than the repr's own `buffer_len()`, which is a programming error, not bad input.
//!
//! # Modules and the kernel files they mirror
//!
//! | module | kernel | what |
//! |---|---|---|
//! | [`clc`] | `net/smc/smc_clc.[ch]` | the CLC handshake over TCP: Proposal, Accept, Confirm, Decline, reason codes |
//! | [`cdc`] | `net/smc/smc_cdc.[ch]` | connection data control: SMC-R 44-byte message, SMC-D 32-byte DMB header, cursors |
//! | [`llc`] | `net/smc/smc_llc.[ch]` | SMC-R link layer control messages |
//! | [`netlink`] | `net/smc/smc_netlink.c`, `include/uapi/linux/smc.h` | the `SMC_GEN_NETLINK` family, nlctrl, the engine family |
#![forbid(unsafe_code)]

pub mod cdc;
pub mod clc;
pub mod llc;
pub mod netlink;
pub mod wire;
