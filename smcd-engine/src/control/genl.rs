//! The control families on smcd's socket: `nlctrl` (family id lookup), the kernel's
//! `SMC_GEN_NETLINK`, and the engine's `SMCD_ENGINE`. One function takes a request record and
//! returns the reply records.

use super::daemon::Daemon;
use super::device::ClientCtx;

/// Family id smcd serves `SMC_GEN_NETLINK` under.
pub const SMC_FAMILY_ID: u16 = 0x20;
/// Family id smcd serves `SMCD_ENGINE` under.
pub const ENGINE_FAMILY_ID: u16 = 0x21;
/// The fixed id of `nlctrl`.
pub const NLCTRL_ID: u16 = 0x10;

/// Handles one request record of a control family; returns the records to send back (each
/// record may hold several netlink messages).
pub fn handle(daemon: &mut Daemon, client: &ClientCtx, record: &[u8]) -> Vec<Vec<u8>> {
    let _ = (daemon, client, record);
    Vec::new()
}
