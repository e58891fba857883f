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

/// Locks a mutex, carrying on with the data if a panicking attempt poisoned it: one attempt's
/// panic must not make every later attempt on the node panic too.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
