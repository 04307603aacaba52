//! Unit-test helpers: real encode/decode round trips through smc-proto's framing, so the
//! formatting tests see exactly what a client parses off the wire.

use smc_proto::netlink::engine::EngineMessage;
use smc_proto::netlink::framing::{self, GenlPayload, NLM_F_MULTI};
use smc_proto::netlink::smc::SmcGenlMessage;

fn roundtrip<T: GenlPayload>(family: u16, p: T) -> T {
    let m = framing::message(family, p, NLM_F_MULTI, 7, 0);
    let bytes = framing::to_bytes(&m).expect("encode");
    let msgs = framing::parse_family_messages::<T>(&bytes, family).expect("decode");
    let mut batch = framing::collect_replies(msgs);
    assert_eq!(batch.payloads.len(), 1);
    batch.payloads.remove(0)
}

/// Encodes an `SMC_GEN_NETLINK` message as a server would send it and parses it back.
pub fn roundtrip_smc(p: SmcGenlMessage) -> SmcGenlMessage {
    roundtrip(0x20, p)
}

/// Same for `SMCD_ENGINE`.
pub fn roundtrip_engine(p: EngineMessage) -> EngineMessage {
    roundtrip(0x21, p)
}
