//! herald-core's integration tests: one test binary, one module per
//! behaviour (the in-process cluster, the observer, reliable publishing).
//! Run one module with `cargo test -p herald-core --test it -- MODULE::`.

mod cluster;
mod observer;
mod reliable;
