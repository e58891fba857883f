//! The reprobench coordinator: the gRPC services nodes and users talk to, the durable SQLite
//! store, and the work-stealing scheduler. It never depends on the agent-node crate: the two
//! meet only through `reprobench-proto`.

pub mod core;
pub mod credentials;
pub mod kubernetes;
pub mod lifecycle;
pub mod machine;
pub mod metrics;
pub mod review;
pub mod scheduler;
pub mod server;
pub mod sim;
pub mod store;
pub mod sweep;

pub use server::{Coordinator, ServeConfig, ServeError, served_url, start};

/// `n` random bytes from the OS, hex-encoded (tokens, run ids); panics when the OS cannot give
/// any, rather than make up a guessable token.
pub fn random_hex(n: usize) -> String {
    reprobench_domain::secret::random_hex(n)
}
