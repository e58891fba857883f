//! The reprobench wire protocol (`proto/reprobench/v1`): generated gRPC types and stubs, the
//! protocol version, and two hand-written modules: [`auth`], the client end of the transport (the
//! join token and TLS on a channel to the coordinator), and [`convert`], the results schema's
//! rows to and from the wire. The vocabulary the messages carry is `reprobench-domain`'s.
//!
//! Only this crate knows the wire format; the coordinator and agent nodes meet through it.

pub mod auth;
pub mod convert;

/// Generated gRPC types and stubs for `reprobench.v1`.
pub mod v1 {
    tonic::include_proto!("reprobench.v1");
}

/// Protocol version carried by `Register`; a coordinator refuses nodes that speak another one.
pub const PROTOCOL_VERSION: u32 = 1;

/// Version of this build, reported by nodes at registration.
pub const BINARY_VERSION: &str = env!("CARGO_PKG_VERSION");
