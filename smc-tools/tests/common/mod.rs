//! The shared harness (the `smc-tests` library) with this package's binaries filled in:
//! cargo sets `CARGO_BIN_EXE_<name>` only for the integration tests of the package that owns
//! the binaries, so the paths are expanded here, in each test crate, and handed to the harness.
#![allow(dead_code, unused_imports)]

pub use smc_tests::*;
use std::path::Path;

/// smcd, smcctl, smc-perf and smc-cat as cargo built them for these tests.
pub const BINS: Bins = smc_tests::bins!();

/// Runs smcctl with `args` (split on blanks) and the given socket (or none).
pub fn smcctl(socket: Option<&Path>, args: &str) -> Run {
    BINS.smcctl(socket, args)
}

/// Runs smcctl with exactly these arguments.
pub fn smcctl_args(socket: Option<&Path>, args: &[&str]) -> Run {
    BINS.smcctl_args(socket, args)
}
