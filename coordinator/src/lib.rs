//! The reprobench coordinator: the gRPC services nodes and users talk to, the durable SQLite
//! store, and the work-stealing scheduler. It never depends on the agent-node crate: the two
//! meet only through `reprobench-proto`.

pub mod core;
pub mod kubernetes;
pub mod metrics;
pub mod review;
pub mod scheduler;
pub mod server;
pub mod sim;
pub mod store;
pub mod sweep;

pub use server::{Coordinator, ServeConfig, ServeError, served_url, start};

/// `n` random bytes from the OS, hex-encoded (tokens, run ids).
pub fn random_hex(n: usize) -> String {
    use std::io::Read;
    let mut buf = vec![0u8; n];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .is_err()
    {
        // No /dev/urandom: fall back to time and pid, still unique enough for run ids.
        let seed = reprobench_proto::time::now_ms() as u64 ^ u64::from(std::process::id()) << 32;
        let mut rng = reprobench_proto::synthetic::SplitMix64::new(seed);
        buf.iter_mut().for_each(|b| *b = rng.next_u64() as u8);
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
}
