//! User-space SMC: applications get TCP-like sockets ([`SmcListener`], [`SmcStream`]) whose
//! bytes move through shared memory when both ends are SMC-capable, after a CLC handshake over
//! the TCP connection that is byte-compatible with Linux; otherwise they stay TCP and record
//! the kernel's fallback reason.
//!
//! # Layers (see `docs/architecture.md`)
//!
//! Dependencies point one way: `api` → `driver` → `transport`, `device` → `ipc` → `layout`,
//! with `smc-core` (the sans-IO protocol) under the driver. `control` is the `smcd` daemon and
//! uses the lower layers only.
//!
//! | module | role | kernel counterpart |
//! |---|---|---|
//! | [`api`] | `std::net`-shaped sockets | `af_smc.c` socket ops |
//! | [`driver`] | connections over a transport, the handshake runner, connect, listen, link groups, the engine | `af_smc.c`, `smc_core.c`, `smc_cdc.c`, `smc_tx.c`, `smc_rx.c`, `smc_close.c` |
//! | [`transport`] | what an established link does: write into the peer's buffer, publish a CDC, completions, readiness | `smc_cdc.c` send paths, `smc_ism.c` `move_data` |
//! | [`device`] | buffer providers: DMB memory, register, attach | `smc_ism.c`, `smc_loopback.c` |
//! | [`ipc`] | the channel to `smcd` and the engine's registration with it | (the SYN option's role, `smc_netlink.c` transport) |
//! | [`layout`] | pages shared between smcd and engines | `smc_stats.c`, `smc_sysctl.c` state |
//! | [`bpf`] | the SMC TCP option through a BPF `sock_ops` program: its maps, the engine-facing calls, smcd's loader | `tcp_output.c`/`tcp_input.c` SMC option, `smc_hs_congested` |
//! | [`control`] | the `smcd` daemon: device registry and control socket | `smc_loopback.c` DMB table, `smc_netlink.c` |

pub mod api;
pub mod bpf;
pub mod control;
pub mod device;
pub mod driver;
pub mod fork;
pub mod ipc;
pub mod layout;
pub mod settings;
pub mod smcr;
pub mod sys;
pub mod transport;

pub use api::{Mode, SmcConnecting, SmcListener, SmcStream};
pub use driver::conn::StateArea;
pub use driver::engine::{Engine, EngineConfig};
pub use driver::handshake::Fallback;
pub use settings::Settings;
