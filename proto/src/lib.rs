//! The reprobench wire protocol (`proto/reprobench/v1`) and the vocabulary every crate shares:
//! sweep specs, executor kinds, the synthetic dataset, android datasets, and the client side of
//! authentication.
//!
//! Only this crate knows the wire format; the coordinator and agent nodes meet through it.

pub mod android;
pub mod auth;
pub mod grading;
pub mod kind;
pub mod registry;
pub mod secret;
pub mod sweep;
pub mod swt;
pub mod swt_bench;
pub mod synthetic;
pub mod time;

/// Generated gRPC types and stubs for `reprobench.v1`.
pub mod v1 {
    tonic::include_proto!("reprobench.v1");
}

/// Protocol version carried by `Register`; a coordinator refuses nodes that speak another one.
pub const PROTOCOL_VERSION: u32 = 1;

/// Version of this build, reported by nodes at registration.
pub const BINARY_VERSION: &str = env!("CARGO_PKG_VERSION");
