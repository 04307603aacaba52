//! The SMC protocol without IO: everything that *decides*, and nothing that waits, reads a
//! clock or touches the operating system. The driver (`smcd-engine`) feeds it what happened and
//! carries out what it asks for; `quinn-proto` is the model.
//!
//! The crate is `#![no_std]` (plus `alloc`): it cannot open a socket, map memory, sleep or read
//! the time even by accident. Time comes in as an [`Instant`] argument; randomness comes in as
//! values the driver chose.
//!
//! | module | what | kernel |
//! |---|---|---|
//! | [`conn`] | one connection: absolute tx/rx positions, peer cursors, window-update rule, autocork, autosplit, urgent data, close; inputs are the peer's CDC as host values and the application's calls, outputs are [`conn::Effects`] | `smc_tx.c`, `smc_rx.c`, `smc_cdc.c`, `smc_close.c` |
//! | [`close`] | the close state machine on its own | `smc_close.c` |
//! | [`cursor`] | wire cursors ↔ absolute positions, with the peer treated as hostile | `smc_cdc.h` |
//! | [`window`] | the send and receive rules as pure functions | `smc_tx.c`, `smc_rx.c` |
//! | [`handshake`] | the CLC handshake as client and server state machines (bytes in, bytes out, decisions, reason codes) | `af_smc.c`, `smc_clc.c` |
//! | [`lgr`] | link-group bookkeeping: which group a connection joins, reuse rules, idle expiry | `smc_core.c` |
//! | [`llc`] | SMC-R link layer control of one link group: first-contact CONFIRM_LINK, ADD_LINK with the rkey exchange, DELETE_LINK, CONFIRM/DELETE_RKEY, TEST_LINK, link-down decisions; messages in, actions out | `smc_llc.c`, `smc_core.c` (link down) |
//!
//! # The contract with a driver
//!
//! * Every method returns at once. Where the kernel would sleep, the core returns what it is
//!   waiting for and the driver sleeps.
//! * Nothing here panics on input from the peer: a CDC or CLC message that breaks the rules is
//!   an error value (a [`conn::Violation`], a decline reason), never a panic.
//! * Positions are absolute 64-bit byte counts; a 64-bit count does not wrap in the life of a
//!   connection. The wire's `(wrap, count)` cursors exist only at the edges ([`cursor`]).
#![no_std]
#![forbid(unsafe_code)]

extern crate alloc;
#[cfg(test)]
extern crate std;

pub mod close;
pub mod conn;
pub mod cursor;
pub mod gid;
pub mod handshake;
pub mod lgr;
pub mod llc;
pub mod time;
pub mod window;

pub use gid::Gid;
pub use time::Instant;
