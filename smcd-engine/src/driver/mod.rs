//! The driver: the code that touches sockets, shared memory, readiness descriptors and clocks
//! on behalf of connections. It feeds the sans-IO core (`smc-core`) and carries out what it
//! returns, through a transport (`crate::transport`) and the devices (`crate::device`).

pub mod conn;
pub mod connect;
pub mod engine;
pub mod handshake;
pub mod lgr;
pub mod listener;
pub mod watcher;
