//! Generic netlink families served by `smcd` (placeholder header; the SMC_GEN_NETLINK work of
//! issue 2 fills the rest).

pub mod loopback;
