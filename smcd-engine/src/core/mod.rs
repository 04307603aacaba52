//! The sans-IO core: state machines and rules that take inputs and return decisions. Nothing
//! here calls the OS, reads a clock or sleeps.

pub mod close;
pub mod cursor;
pub mod handshake;
pub mod window;
