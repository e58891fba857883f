//! Gateway overhead benchmark: latency and throughput against an upstream (a scripted one that
//! answers immediately, or a running model server), called directly and through the gateway in
//! the same run, and optionally through LiteLLM's proxy as a third arm ([`litellm`]).

pub mod litellm;

use super::scripted::{ScriptedReply, ScriptedUpstream};
use super::{Gateway, GatewayConfig, TaskBudget};
use reprobench_domain::sweep::{BackboneSpec, Price};
use serde::Serialize;
use serde_json::json;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Results of one benchmark run (milliseconds and calls per second).
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// What was measured against what.
    pub note: String,
    /// Calls per measurement.
    pub calls: usize,
    /// Concurrent callers in the throughput measurements.
    pub concurrency: usize,
    /// Sequential latency calling the upstream directly, median.
    pub direct_p50_ms: f64,
    /// Sequential latency calling the upstream directly, 99th percentile.
    pub direct_p99_ms: f64,
    /// Sequential latency through the gateway, median.
    pub gateway_p50_ms: f64,
    /// Sequential latency through the gateway, 99th percentile.
    pub gateway_p99_ms: f64,
    /// `gateway_p50_ms - direct_p50_ms`.
    pub added_p50_ms: f64,
    /// `gateway_p99_ms - direct_p99_ms`.
    pub added_p99_ms: f64,
    /// Sequential streamed calls (`"stream": true`, read to the last byte) directly, median.
    pub direct_stream_p50_ms: f64,
    /// Sequential streamed calls directly, 99th percentile.
    pub direct_stream_p99_ms: f64,
    /// Sequential streamed calls through the gateway, median.
    pub gateway_stream_p50_ms: f64,
    /// Sequential streamed calls through the gateway, 99th percentile.
    pub gateway_stream_p99_ms: f64,
    /// `gateway_stream_p50_ms - direct_stream_p50_ms`.
    pub added_stream_p50_ms: f64,
    /// `gateway_stream_p99_ms - direct_stream_p99_ms`.
    pub added_stream_p99_ms: f64,
    /// Throughput calling the upstream directly.
    pub direct_calls_per_s: f64,
    /// Throughput through the gateway.
    pub gateway_calls_per_s: f64,
    /// Calls the gateway metered (should equal the calls made through it).
    pub gateway_metered_calls: u64,
    /// Calls that failed in any measurement of the direct and gateway arms (should be 0).
    pub errors: usize,
    /// The same measurements through LiteLLM's proxy, when it was run (`--litellm`).
    pub litellm: Option<LiteLlmFigures>,
    /// Why the LiteLLM arm did not run, when it did not.
    pub litellm_note: Option<String>,
}

/// LiteLLM's proxy measured in the same run as the direct and gateway arms, against the same
/// upstream, its sequential calls taking turns with theirs.
#[derive(Debug, Clone, Serialize)]
pub struct LiteLlmFigures {
    /// The version its readiness probe reported.
    pub version: Option<String>,
    /// Its worker processes (`--num_workers`).
    pub workers: u32,
    /// Sequential latency through LiteLLM, median.
    pub p50_ms: f64,
    /// Sequential latency through LiteLLM, 99th percentile.
    pub p99_ms: f64,
    /// Sequential streamed calls through LiteLLM, median.
    pub stream_p50_ms: f64,
    /// Sequential streamed calls through LiteLLM, 99th percentile.
    pub stream_p99_ms: f64,
    /// `p50_ms - direct_p50_ms`.
    pub added_p50_ms: f64,
    /// `p99_ms - direct_p99_ms`.
    pub added_p99_ms: f64,
    /// `stream_p50_ms - direct_stream_p50_ms`.
    pub added_stream_p50_ms: f64,
    /// `stream_p99_ms - direct_stream_p99_ms`.
    pub added_stream_p99_ms: f64,
    /// Throughput through LiteLLM at the same concurrency.
    pub calls_per_s: f64,
    /// The gateway's added latency over LiteLLM's, plain p50 (target ≤ 0.01).
    pub gateway_over_litellm_added_p50: f64,
    /// The same at p99.
    pub gateway_over_litellm_added_p99: f64,
    /// The same for streamed calls at p50.
    pub gateway_over_litellm_added_stream_p50: f64,
    /// The same for streamed calls at p99.
    pub gateway_over_litellm_added_stream_p99: f64,
    /// The gateway's calls per second over LiteLLM's (target ≥ 100).
    pub gateway_over_litellm_calls_per_s: f64,
    /// Calls through LiteLLM that failed (should be 0).
    pub errors: usize,
}

/// How to run the LiteLLM arm.
#[derive(Debug, Clone)]
pub struct LiteLlmArm {
    /// The `litellm` executable (e.g. a virtual environment's `bin/litellm`).
    pub command: PathBuf,
    /// Its worker processes; 1 is LiteLLM's default.
    pub workers: u32,
    /// How long it may take to answer its readiness probe after it is started.
    pub ready_within: Duration,
}

/// The `q`-quantile (0..=1) of sorted milliseconds, nearest rank.
pub fn percentile(sorted_ms: &[f64], q: f64) -> f64 {
    if sorted_ms.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted_ms.len() as f64).ceil() as usize;
    sorted_ms[rank.clamp(1, sorted_ms.len()) - 1]
}

async fn one_call(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    body: &serde_json::Value,
) -> bool {
    match client.post(url).bearer_auth(key).json(body).send().await {
        Ok(response) => response.status().is_success() && response.bytes().await.is_ok(),
        Err(_) => false,
    }
}

/// Where the benchmark's calls go.
#[derive(Debug, Clone)]
pub enum BenchUpstream {
    /// reprobench's scripted server, started for the run, answering `pong` at once (not a model).
    Scripted,
    /// An OpenAI-compatible server that is already running, e.g. llama.cpp's with a real model;
    /// each call asks `model` for at most `max_tokens` tokens at temperature 0.
    Server {
        /// Base URL, e.g. `http://127.0.0.1:8080/v1`.
        base_url: String,
        /// Model name sent with each call.
        model: String,
        /// `max_tokens` of each call.
        max_tokens: u32,
    },
}

impl BenchUpstream {
    /// The request body of one call.
    fn body(&self, stream: bool) -> serde_json::Value {
        let messages = json!([{"role": "user", "content": "Say pong."}]);
        match self {
            BenchUpstream::Scripted => {
                json!({"model": "bench", "stream": stream, "messages": messages})
            }
            BenchUpstream::Server {
                model, max_tokens, ..
            } => json!({"model": model, "stream": stream, "messages": messages,
                        "max_tokens": max_tokens, "temperature": 0.0}),
        }
    }
}

/// One call, read to its last byte (`data: [DONE]` when streamed): its latency in milliseconds;
/// a failed call counts in `errors`.
async fn timed_call(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    body: &serde_json::Value,
    errors: &mut usize,
) -> f64 {
    let start = Instant::now();
    if !one_call(client, url, key, body).await {
        *errors += 1;
    }
    start.elapsed().as_secs_f64() * 1e3
}

/// One way a call goes: straight to the upstream, through the gateway, or through LiteLLM.
struct Way {
    url: String,
    key: String,
    errors: usize,
}

impl Way {
    fn new(base_url: &str, key: &str) -> Way {
        Way {
            url: format!("{}/chat/completions", base_url.trim_end_matches('/')),
            key: key.to_string(),
            errors: 0,
        }
    }
}

/// `calls` sequential calls each way, the ways taking turns, so a drift in the upstream's speed
/// (a real model's) reaches all alike: each way's latencies, sorted.
async fn interleaved(
    client: &reqwest::Client,
    ways: &mut [&mut Way],
    body: &serde_json::Value,
    calls: usize,
) -> Vec<Vec<f64>> {
    let mut times = vec![Vec::with_capacity(calls); ways.len()];
    for _ in 0..calls {
        for (way, times) in ways.iter_mut().zip(&mut times) {
            times.push(timed_call(client, &way.url, &way.key, body, &mut way.errors).await);
        }
    }
    for times in &mut times {
        times.sort_by(f64::total_cmp);
    }
    times
}

/// Sequential latency of one way, plain and streamed: p50, p99, streamed p50, streamed p99.
struct Latency([f64; 4]);

impl Latency {
    fn of(plain: &[f64], streamed: &[f64]) -> Latency {
        Latency([
            percentile(plain, 0.5),
            percentile(plain, 0.99),
            percentile(streamed, 0.5),
            percentile(streamed, 0.99),
        ])
    }

    /// Each figure minus the same figure of `base`.
    fn over(&self, base: &Latency) -> [f64; 4] {
        std::array::from_fn(|i| self.0[i] - base.0[i])
    }
}

/// `calls` calls by `concurrency` concurrent callers one way: calls per second.
async fn throughput(
    client: &reqwest::Client,
    way: &mut Way,
    body: &serde_json::Value,
    calls: usize,
    concurrency: usize,
) -> f64 {
    let next = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency.max(1) {
        let (client, url, key) = (client.clone(), way.url.clone(), way.key.clone());
        let (next, failed, body) = (next.clone(), failed.clone(), body.clone());
        workers.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < calls {
                if !one_call(&client, &url, &key, &body).await {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for worker in workers {
        let _ = worker.await;
    }
    way.errors += failed.load(Ordering::Relaxed);
    calls as f64 / start.elapsed().as_secs_f64().max(1e-9)
}

/// Runs the benchmark against the scripted upstream: `calls` sequential calls each way, `calls`
/// sequential streamed calls each way, then `calls` calls by `concurrency` concurrent callers
/// each way.
pub async fn run(calls: usize, concurrency: usize) -> BenchReport {
    run_against(BenchUpstream::Scripted, calls, concurrency).await
}

/// [`run`] against `target`, without LiteLLM.
pub async fn run_against(target: BenchUpstream, calls: usize, concurrency: usize) -> BenchReport {
    run_with(target, calls, concurrency, None)
        .await
        .expect("without LiteLLM nothing is started that could fail")
}

/// [`run`] against `target`, and through LiteLLM's proxy as a third arm when `litellm` is given
/// (started before the measurements, stopped after them, also when they fail). The error is
/// LiteLLM's: it was given and could not be started.
pub async fn run_with(
    target: BenchUpstream,
    calls: usize,
    concurrency: usize,
    litellm: Option<&LiteLlmArm>,
) -> Result<BenchReport, litellm::LiteLlmError> {
    let scripted = match target {
        BenchUpstream::Scripted => {
            Some(ScriptedUpstream::start(|_| ScriptedReply::text("pong")).await)
        }
        BenchUpstream::Server { .. } => None,
    };
    let (base_url, model, note) = match &target {
        BenchUpstream::Server {
            base_url,
            model,
            max_tokens,
        } => (
            base_url.trim_end_matches('/').to_string(),
            model.clone(),
            format!(
                "model server at {base_url} (model {model}, max_tokens {max_tokens}, temperature 0)"
            ),
        ),
        BenchUpstream::Scripted => (
            scripted
                .as_ref()
                .map(ScriptedUpstream::base_url)
                .unwrap_or_default(),
            "scripted".to_string(),
            "scripted upstream (not a model) answering immediately on loopback".to_string(),
        ),
    };
    let (plain, streamed) = (target.body(false), target.body(true));
    // LiteLLM serves the name the calls ask for, forwarding it as the model the upstream serves.
    let proxy = match litellm {
        Some(arm) => Some(
            litellm::LiteLlmProxy::start(
                &arm.command,
                plain["model"].as_str().unwrap_or("bench"),
                &model,
                &base_url,
                arm.workers,
                arm.ready_within,
            )
            .await?,
        ),
        None => None,
    };
    let backbone = BackboneSpec {
        name: "bench".into(),
        base_url: base_url.clone(),
        model,
        api_key_env: None,
        price: Price {
            input_per_mtok: 1.0,
            output_per_mtok: 2.0,
            cached_input_per_mtok: 0.5,
        },
        params: BTreeMap::new(),
        max_concurrency: Some(concurrency.max(64) as u32),
        requests_per_minute: None,
        timeout_s: Some(300),
        text_only: false,
    };
    let gateway = Gateway::start(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        GatewayConfig::default(),
    )
    .await
    .expect("starting a loopback gateway for the benchmark");
    let key = gateway
        .open_task("bench", &backbone, TaskBudget::default(), None)
        .expect("opening the benchmark task");
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(concurrency.max(64))
        .timeout(Duration::from_secs(300))
        .build()
        .expect("building the benchmark HTTP client");
    let mut direct = Way::new(&base_url, "none");
    let mut through = Way::new(&gateway.base_url(), &key);
    let mut lite = proxy
        .as_ref()
        .map(|p| Way::new(&p.base_url(), p.master_key()));
    let mut ways: Vec<&mut Way> = [Some(&mut direct), Some(&mut through), lite.as_mut()]
        .into_iter()
        .flatten()
        .collect();
    // Warm the connection pools, and LiteLLM's lazily loaded code for both kinds of call.
    let warmup = 10.min(calls.max(1));
    interleaved(&client, &mut ways, &plain, warmup).await;
    interleaved(&client, &mut ways, &streamed, warmup).await;
    let warmup_calls = gateway.task_usage(&key).map_or(0, |u| u.calls);
    let plain_times = interleaved(&client, &mut ways, &plain, calls).await;
    let stream_times = interleaved(&client, &mut ways, &streamed, calls).await;
    let mut calls_per_s = Vec::new();
    for way in ways.iter_mut() {
        calls_per_s.push(throughput(&client, way, &plain, calls, concurrency).await);
    }
    drop(ways);
    let metered = gateway.task_usage(&key).map_or(0, |u| u.calls) - warmup_calls;
    gateway.shutdown().await;
    let version = proxy.as_ref().and_then(|p| p.version().map(str::to_string));
    if let Some(proxy) = proxy {
        proxy.stop().await;
    }

    let lat: Vec<Latency> = plain_times
        .iter()
        .zip(&stream_times)
        .map(|(p, s)| Latency::of(p, s))
        .collect();
    let (d, g) = (&lat[0], &lat[1]);
    let [added_p50, added_p99, added_stream_p50, added_stream_p99] = g.over(d);
    let litellm_figures = match (litellm, lat.get(2), lite) {
        (Some(arm), Some(l), Some(way)) => {
            let added = l.over(d);
            let ratio = |i: usize| g.over(d)[i] / added[i];
            Some(LiteLlmFigures {
                version,
                workers: arm.workers,
                p50_ms: l.0[0],
                p99_ms: l.0[1],
                stream_p50_ms: l.0[2],
                stream_p99_ms: l.0[3],
                added_p50_ms: added[0],
                added_p99_ms: added[1],
                added_stream_p50_ms: added[2],
                added_stream_p99_ms: added[3],
                calls_per_s: calls_per_s[2],
                gateway_over_litellm_added_p50: ratio(0),
                gateway_over_litellm_added_p99: ratio(1),
                gateway_over_litellm_added_stream_p50: ratio(2),
                gateway_over_litellm_added_stream_p99: ratio(3),
                gateway_over_litellm_calls_per_s: calls_per_s[1] / calls_per_s[2],
                errors: way.errors,
            })
        }
        _ => None,
    };
    Ok(BenchReport {
        note,
        calls,
        concurrency,
        direct_p50_ms: d.0[0],
        direct_p99_ms: d.0[1],
        gateway_p50_ms: g.0[0],
        gateway_p99_ms: g.0[1],
        added_p50_ms: added_p50,
        added_p99_ms: added_p99,
        direct_stream_p50_ms: d.0[2],
        direct_stream_p99_ms: d.0[3],
        gateway_stream_p50_ms: g.0[2],
        gateway_stream_p99_ms: g.0[3],
        added_stream_p50_ms: added_stream_p50,
        added_stream_p99_ms: added_stream_p99,
        direct_calls_per_s: calls_per_s[0],
        gateway_calls_per_s: calls_per_s[1],
        gateway_metered_calls: metered,
        errors: direct.errors + through.errors,
        litellm_note: litellm_figures
            .is_none()
            .then(|| litellm::SKIPPED_NOTE.to_string()),
        litellm: litellm_figures,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&v, 1.0), 100.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn small_run_meters_every_gateway_call() {
        let report = run(20, 4).await;
        assert_eq!(report.errors, 0);
        // Plain sequential, streamed sequential and concurrent calls, 20 each.
        assert_eq!(report.gateway_metered_calls, 60);
        assert!(report.gateway_stream_p99_ms >= report.gateway_stream_p50_ms);
        assert!(report.gateway_calls_per_s > 0.0 && report.direct_calls_per_s > 0.0);
        assert!(report.gateway_p99_ms >= report.gateway_p50_ms);
        // Without a LiteLLM command the third arm is skipped, saying how to get it.
        assert!(report.litellm.is_none());
        let note = report.litellm_note.expect("a skip note");
        assert!(note.contains("tests/litellm_bench.sh"), "{note}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_running_server_is_measured_with_the_model_and_max_tokens_asked_for() {
        let server = ScriptedUpstream::start(|_| ScriptedReply::text("pong")).await;
        let target = BenchUpstream::Server {
            base_url: format!("{}/", server.base_url()),
            model: "smollm2".into(),
            max_tokens: 4,
        };
        let report = run_against(target, 5, 2).await;
        assert_eq!(report.errors, 0);
        assert_eq!(report.gateway_metered_calls, 15);
        assert!(report.note.contains("model server"), "{}", report.note);
        // Every call, direct or through the gateway, asked for the model and max_tokens given.
        let requests = server.requests();
        assert!(!requests.is_empty());
        assert!(
            requests
                .iter()
                .all(|r| r.body["max_tokens"] == 4 && r.body["temperature"] == 0.0),
            "{:?}",
            requests.first().map(|r| &r.body)
        );
        assert!(requests.iter().all(|r| r.body["model"] == "smollm2"));
    }
}
