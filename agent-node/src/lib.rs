//! The reprobench agent node: connects to a coordinator, runs granted attempts on its
//! executors up to its slots, heartbeats, and delivers results. It never depends on the
//! coordinator crate: the two meet only through `reprobench-proto`.

pub mod agents;
pub mod android;
pub mod executor;
pub mod gateway;
pub mod kubernetes;
pub mod runtime;
pub mod sandbox;
pub mod swt;
pub mod synthetic;

pub use runtime::{NodeConfig, NodeError, run_node};
