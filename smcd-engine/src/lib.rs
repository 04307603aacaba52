//! User-space SMC-D: applications get TCP-like sockets ([`SmcListener`], [`SmcStream`]) whose
//! bytes move through shared memory when both ends are SMC-capable, after a CLC handshake over
//! the TCP connection that is byte-compatible with Linux; otherwise they stay TCP and record
//! the kernel's fallback reason.
//!
//! # Layers (see `docs/architecture.md`)
//!
//! | module | role | kernel counterpart |
//! |---|---|---|
//! | [`core`] | sans-IO rules: close state machine, window and send rules, handshake decisions | `smc_close.c`, `smc_tx.c`/`smc_rx.c` rules, `af_smc.c` decisions |
//! | [`device`] | SMC-D devices: DMB memory, attach, signal | `smc_ism.c`, `smc_loopback.c` |
//! | [`driver`] | sockets, shared memory, waits: connections, link groups, listener, engine | `af_smc.c`, `smc_core.c`, `smc_cdc.c`, `smc_tx.c`, `smc_rx.c` |
//! | [`control`] | the `smcd` daemon: device registry and control socket | `smc_loopback.c` DMB table, `smc_netlink.c` |
//! | [`api`] | `std::net`-shaped sockets | `af_smc.c` socket ops |

pub mod api;
pub mod control;
pub mod core;
pub mod device;
pub mod driver;
pub mod layout;
pub mod settings;

pub use api::{Mode, SmcListener, SmcStream};
pub use driver::engine::{Engine, EngineConfig};
pub use driver::handshake::Fallback;
pub use settings::Settings;
