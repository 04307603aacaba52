//! The daemon's state and its socket server (`smcd`): the loopback device registry, and the
//! control-plane families served over netlink.

pub mod daemon;
pub mod device;
pub mod genl;
pub mod rnic;
pub mod server;
