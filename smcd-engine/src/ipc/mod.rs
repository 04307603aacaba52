//! Talking to `smcd`: netlink messages over its Unix `SOCK_SEQPACKET` socket ([`channel`]) and
//! an engine's registration with it ([`session`]: its GID, the pages smcd shares, the requests
//! that announce connections and listeners). Below the device and the driver; imports only
//! the shared-page layouts.

pub mod channel;
pub mod session;

pub use channel::{Channel, DEFAULT_SOCKET, socket_path};
pub use session::{ConnectVerdict, Hello, SmcdSession};
