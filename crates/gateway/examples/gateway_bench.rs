//! The gateway benchmark without the rest of the binary (same code as `reprobench bench gateway`):
//! `cargo run --release -p reprobench-gateway --example gateway_bench [CALLS] [CONCURRENCY]`.

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let calls = args.next().and_then(|a| a.parse().ok()).unwrap_or(2000);
    let concurrency = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    let report = reprobench_gateway::bench::run(calls, concurrency).await;
    println!(
        "{}",
        serde_json::to_string_pretty(&report).expect("serializes")
    );
}
