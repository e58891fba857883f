//! The gateway benchmark without the rest of the binary (same code as `reprobench bench gateway`):
//! `cargo run --release -p reprobench-gateway --example gateway_bench -- [CALLS] [CONCURRENCY]
//! [--litellm PATH/TO/litellm] [--litellm-workers N]` (`tests/litellm_bench.sh` installs LiteLLM
//! and runs this with `--litellm`).

use reprobench_gateway::bench::{BenchUpstream, LiteLlmArm, run_with};
use std::time::Duration;

#[tokio::main]
async fn main() {
    let (mut numbers, mut litellm, mut workers) = (Vec::new(), None, 1);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--litellm" => litellm = Some(args.next().expect("--litellm PATH/TO/litellm")),
            "--litellm-workers" => {
                workers = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .expect("--litellm-workers N")
            }
            _ => numbers.push(arg.parse::<usize>().unwrap_or_else(|_| {
                panic!(
                    "{arg}: expected [CALLS] [CONCURRENCY] [--litellm PATH] [--litellm-workers N]"
                )
            })),
        }
    }
    let calls = numbers.first().copied().unwrap_or(2000);
    let concurrency = numbers.get(1).copied().unwrap_or(64);
    let arm = litellm.map(|command| LiteLlmArm {
        command: command.into(),
        workers,
        ready_within: Duration::from_secs(180),
    });
    let report = match run_with(BenchUpstream::Scripted, calls, concurrency, arm.as_ref()).await {
        Ok(report) => report,
        Err(e) => {
            eprintln!("gateway_bench: {e}");
            std::process::exit(1);
        }
    };
    println!(
        "{}",
        serde_json::to_string_pretty(&report).expect("serializes")
    );
}
