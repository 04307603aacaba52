//! RDMA devices that know nothing of SMC.
//!
//! - [`verbs`]: the verbs-shaped vocabulary every device speaks: protection domains, memory
//!   regions with remote keys and bounds and permission checks, reliable-connected queue
//!   pairs that walk RESET → INIT → RTR → RTS, SEND and RDMA WRITE work requests (two
//!   scatter/gather entries, inline data, signaled or not), completion queues with
//!   request-notify and report-missed-events, error completions.
//! - [`soft`]: a user-space RoCEv2 device. Real packets on UDP port 4791 ([`wire`]: BTH, RETH,
//!   AETH, ICRC), segmentation at the path MTU, and RC reliability the way the kernel's rxe does
//!   it: AckReq on the last packet of a message and every 64, cumulative ACKs, one sequence NAK
//!   per gap, go-back-N retransmission with the QP's timeout and retry count, RNR NAKs,
//!   duplicates re-acknowledged and not executed again; a send completes only when its ACK
//!   arrived. The same device also speaks RoCE v1 (Ethertype 0x8915 frames with a GRH,
//!   [`wire::v1`]) on an Ethernet netdev through a packet socket (`SoftDevice::open_roce_v1`).
//! - `rnic` (feature `rnic`): real RNICs and rxe through libibverbs, loaded at run time
//!   (sideway); the conformance suite runs on one where a device exists.
//!
//! SMC's use of it (link groups, CDC SENDs, RDMA WRITEs into RMBs) lives in `smcd-engine`;
//! this crate can be tested and reused alone.

#[cfg(feature = "rnic")]
pub mod rnic;
pub mod soft;
pub mod verbs;
pub mod wire;
