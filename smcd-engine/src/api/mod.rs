//! The application interface, shaped like `std::net` so a TCP program ports by changing type
//! names (`net/smc/af_smc.c`'s socket operations).

pub mod listener;
pub mod stream;

pub use listener::SmcListener;
pub use stream::{Mode, SmcConnecting, SmcStream, SmcdSummary};
