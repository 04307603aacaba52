//! User-space SMC-D: the data plane library (`SmcListener`, `SmcStream`), the `smcd` control
//! plane and the tools built on them. Filled by issue 3 onwards.
