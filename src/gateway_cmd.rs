//! `reprobench gateway`: the metering LLM proxy on its own, and `reprobench bench gateway`.

use anyhow::{Context, Result, bail};
use clap::Args;
use reprobench_domain::sweep::{BackboneSpec, Budget};
use reprobench_gateway::{Gateway, GatewayConfig};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Options of `reprobench gateway`.
#[derive(Args)]
pub struct GatewayArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8089")]
    listen: SocketAddr,
    /// TOML file with one `[[backbones]]` entry as in the sweep spec (and optionally a `[budget]`
    /// applied to each client key).
    #[arg(long, value_name = "FILE.toml")]
    backbone: PathBuf,
    /// Directory for one JSONL transcript per client key (requests, responses, timings; never keys).
    #[arg(long, value_name = "DIR")]
    transcripts: Option<PathBuf>,
    /// Serve recorded transcripts (a file or directory) by request hash instead of calling the
    /// backbone: a replay, and every answer says so.
    #[arg(long, value_name = "PATH")]
    replay: Option<PathBuf>,
    /// Open a task for this client at start and print `NAME KEY` on stdout: the key it sends as
    /// its bearer token, charged and budgeted as its own task (repeat for each client).
    #[arg(long = "client", value_name = "NAME")]
    clients: Vec<String>,
    /// Let any bearer string in: each new one becomes a task of its own with a fresh budget.
    /// Anyone who reaches the gateway can then spend the backbone's key: for a trusted machine.
    #[arg(long)]
    open: bool,
    /// Environment variable holding a key that lets other machines read /v1/usage and /metrics
    /// (without it they answer this machine's clients only).
    #[arg(long, value_name = "VAR")]
    stats_key_env: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BackboneFile {
    backbones: Vec<BackboneSpec>,
    #[serde(default)]
    budget: Option<Budget>,
}

/// Reads a backbone file: exactly one `[[backbones]]` entry.
fn read_backbone_file(path: &PathBuf) -> Result<(BackboneSpec, Option<Budget>)> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read backbone file {}", path.display()))?;
    let file: BackboneFile = toml::from_str(&text).with_context(|| {
        format!(
            "{} is not a backbone file: it needs one [[backbones]] entry with name, base_url, model (and api_key_env, price, params)",
            path.display()
        )
    })?;
    match <[BackboneSpec; 1]>::try_from(file.backbones) {
        Ok([b]) => Ok((b, file.budget)),
        Err(v) => bail!(
            "{} has {} [[backbones]] entries; the gateway serves exactly one (run one gateway per backbone)",
            path.display(),
            v.len()
        ),
    }
}

/// Runs the standalone gateway until Ctrl-C, then prints the totals.
pub async fn gateway(a: GatewayArgs) -> Result<()> {
    let (backbone, budget) = read_backbone_file(&a.backbone)?;
    if a.clients.is_empty() && !a.open {
        bail!(
            "the gateway needs to know its clients: give --client NAME for each (their keys are printed at start), or --open to let any bearer string in as its own client (for a trusted machine only: anyone who reaches the gateway can then spend the backbone's key)"
        );
    }
    for name in &a.clients {
        reprobench_domain::ids::check_name(name)
            .map_err(|rule| anyhow::anyhow!("--client {name:?}: {rule}"))?;
    }
    let stats_key = match &a.stats_key_env {
        Some(var) => Some(std::env::var(var).ok().filter(|v| !v.is_empty()).with_context(|| {
            format!("--stats-key-env {var}: ${var} is not set (or empty) in the gateway's environment")
        })?),
        None => None,
    };
    let task_budget = budget
        .as_ref()
        .map(reprobench_agents::run::task_budget)
        .unwrap_or_default();
    let config = GatewayConfig {
        transcripts: a.transcripts.clone(),
        replay: a.replay.clone(),
        open: a.open,
        stats_key,
        default_backbone: Some(backbone.clone()),
        default_budget: task_budget.clone(),
        ..GatewayConfig::default()
    };
    let gw = Gateway::start(a.listen, config)
        .await
        .with_context(|| format!("cannot start the gateway on {}", a.listen))?;
    for name in &a.clients {
        let key = gw
            .open_task(name, &backbone, task_budget.clone(), None)
            .with_context(|| format!("cannot open the task of client {name}"))?;
        println!("{name} {key}");
    }
    // Registered before the address is printed, so a client that stops us right away is heard.
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    if gw.is_replay() {
        say(format_args!(
            "gateway (REPLAY of {}: no model is called) on {}",
            a.replay
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            gw.base_url()
        ));
    } else {
        say(format_args!(
            "gateway on {} → backbone `{}` (model {} at {})",
            gw.base_url(),
            backbone.name,
            backbone.model,
            backbone.base_url
        ));
    }
    let keys = if a.open {
        "<any string; usage is charged per key>"
    } else {
        "<the key printed for the client>"
    };
    say(format_args!(
        "clients: OPENAI_BASE_URL={} OPENAI_API_KEY={keys}; usage at {}/usage, metrics at http://{}/metrics",
        gw.base_url(),
        gw.base_url(),
        gw.local_addr()
    ));
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    let totals = gw.totals();
    println!("{}", serde_json::to_string_pretty(&totals)?);
    gw.shutdown().await;
    Ok(())
}

/// Options of `reprobench bench gateway`.
#[derive(Args)]
pub struct GatewayBenchArgs {
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Sequential calls measured for latency (each way).
    #[arg(long, default_value_t = 2000)]
    calls: usize,
    /// Concurrent calls for the throughput figure.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Measure against this running OpenAI-compatible server (e.g. llama.cpp's with a real
    /// model, `http://127.0.0.1:8080/v1`) instead of the scripted upstream; use a small `--calls`.
    #[arg(long, value_name = "URL")]
    upstream: Option<String>,
    /// Model name sent to `--upstream`.
    #[arg(long, default_value = "default", requires = "upstream")]
    model: String,
    /// `max_tokens` of each call to `--upstream`, kept small so the model's time varies little.
    #[arg(long, default_value_t = 8, requires = "upstream")]
    max_tokens: u32,
    /// Also measure LiteLLM's proxy, this `litellm` executable (`tests/litellm_bench.sh` installs
    /// it from PyPI), in the same run against the same upstream; without it that arm is skipped.
    #[arg(long, value_name = "PATH")]
    litellm: Option<std::path::PathBuf>,
    /// LiteLLM's worker processes (`--num_workers`; 1 is LiteLLM's default).
    #[arg(long, default_value_t = 1, requires = "litellm")]
    litellm_workers: u32,
}

/// The gateway's added latency and throughput against a scripted upstream (not a model), or
/// against a running model server with `--upstream`; with `--litellm`, LiteLLM's proxy as well.
pub async fn bench(a: GatewayBenchArgs) -> Result<()> {
    use reprobench_gateway::bench::{BenchUpstream, LiteLlmArm, run_with};
    let target = match &a.upstream {
        Some(url) => {
            anyhow::ensure!(
                url.starts_with("http://") || url.starts_with("https://"),
                "--upstream {url}: give the server's base URL, e.g. http://127.0.0.1:8080/v1"
            );
            BenchUpstream::Server {
                base_url: url.clone(),
                model: a.model.clone(),
                max_tokens: a.max_tokens,
            }
        }
        None => BenchUpstream::Scripted,
    };
    let scripted = matches!(target, BenchUpstream::Scripted);
    let arm = a.litellm.clone().map(|command| LiteLlmArm {
        command,
        workers: a.litellm_workers,
        ready_within: std::time::Duration::from_secs(180),
    });
    let report = run_with(target, a.calls, a.concurrency, arm.as_ref()).await?;
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!("{}", serde_json::to_string_pretty(&report)?);
        if scripted {
            eprintln!(
                "(upstream: reprobench's scripted OpenAI-compatible server on loopback, not a model)"
            );
        }
    }
    // Printed first, so the figures of the calls that did answer are not lost.
    anyhow::ensure!(
        scripted || report.errors == 0,
        "bench gateway: {} calls to {} failed (`errors` above); is the server running and does it \
         serve model `{}`?",
        report.errors,
        a.upstream.as_deref().unwrap_or_default(),
        a.model
    );
    let litellm_errors = report.litellm.as_ref().map_or(0, |l| l.errors);
    anyhow::ensure!(
        litellm_errors == 0,
        "bench gateway: {litellm_errors} calls through LiteLLM's proxy failed (`litellm.errors` \
         above); its figures are not comparable"
    );
    Ok(())
}

/// One line on stderr for the operator; a closed stderr (the reader went away) does not stop
/// the gateway, which goes on serving its clients.
fn say(line: std::fmt::Arguments) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}
