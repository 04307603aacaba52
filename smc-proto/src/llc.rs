//! Placeholder: filled by the smc-proto work (issue 2).
