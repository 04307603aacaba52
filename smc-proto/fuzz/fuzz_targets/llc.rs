#![no_main]
//! Fuzz target for the llc decoders (placeholder until the decoder exists).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = data;
});
