//! The driver: the only code that touches sockets, shared memory, futexes, eventfds and
//! clocks. It feeds the core and carries out what it returns.

pub mod channel;
pub mod conn;
pub mod connect;
pub mod engine;
pub mod handshake;
pub mod lgr;
pub mod listener;
