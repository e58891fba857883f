//! The reprobench agent node: connects to a coordinator, runs granted attempts on its
//! executors up to its slots, heartbeats, and delivers results. It wires the executors of the
//! other crates (synthetic, SWT, Android) into one runtime. It never depends on the coordinator
//! crate: the two meet only through `reprobench-proto`.

pub mod attempt;
pub mod runtime;
pub mod swt_executor;
pub mod synthetic;

pub use runtime::{NodeConfig, NodeError, run_node};
