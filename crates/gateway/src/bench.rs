//! Gateway overhead benchmark: latency and throughput against an upstream (a scripted one that
//! answers immediately, or a running model server), called directly and through the gateway in
//! the same run.

use super::scripted::{ScriptedReply, ScriptedUpstream};
use super::{Gateway, GatewayConfig, TaskBudget};
use reprobench_domain::sweep::{BackboneSpec, Price};
use serde::Serialize;
use serde_json::json;
use std::collections::BTreeMap;
use std::net::SocketAddr;
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
    /// Throughput calling the upstream directly.
    pub direct_calls_per_s: f64,
    /// Throughput through the gateway.
    pub gateway_calls_per_s: f64,
    /// Calls the gateway metered (should equal the calls made through it).
    pub gateway_metered_calls: u64,
    /// Calls that failed in any measurement (should be 0).
    pub errors: usize,
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

/// The two ways a call goes: straight to the upstream, or through the gateway.
struct Ways<'a> {
    client: &'a reqwest::Client,
    direct_url: &'a str,
    gateway_url: &'a str,
    key: &'a str,
}

impl Ways<'_> {
    /// `calls` sequential calls each way, direct and through the gateway in turn, so a drift in
    /// the upstream's speed (a real model's) reaches both alike; each list sorted.
    async fn paired(
        &self,
        body: &serde_json::Value,
        calls: usize,
        errors: &mut usize,
    ) -> (Vec<f64>, Vec<f64>) {
        let (mut direct, mut through) = (Vec::with_capacity(calls), Vec::with_capacity(calls));
        for _ in 0..calls {
            direct.push(timed_call(self.client, self.direct_url, "none", body, errors).await);
            through.push(timed_call(self.client, self.gateway_url, self.key, body, errors).await);
        }
        direct.sort_by(f64::total_cmp);
        through.sort_by(f64::total_cmp);
        (direct, through)
    }
}

async fn throughput(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    body: &serde_json::Value,
    calls: usize,
    concurrency: usize,
    errors: &mut usize,
) -> f64 {
    let next = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency.max(1) {
        let (client, url, key) = (client.clone(), url.to_string(), key.to_string());
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
    *errors += failed.load(Ordering::Relaxed);
    calls as f64 / start.elapsed().as_secs_f64().max(1e-9)
}

/// Runs the benchmark against the scripted upstream: `calls` sequential calls each way, `calls`
/// sequential streamed calls each way, then `calls` calls by `concurrency` concurrent callers
/// each way.
pub async fn run(calls: usize, concurrency: usize) -> BenchReport {
    run_against(BenchUpstream::Scripted, calls, concurrency).await
}

/// [`run`] against `target`.
pub async fn run_against(target: BenchUpstream, calls: usize, concurrency: usize) -> BenchReport {
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
    let direct_url = format!("{base_url}/chat/completions");
    let gateway_url = format!("{}/chat/completions", gateway.base_url());
    let mut errors = 0;
    let ways = Ways {
        client: &client,
        direct_url: &direct_url,
        gateway_url: &gateway_url,
        key: &key,
    };
    // Warm both connection pools.
    ways.paired(&plain, 10.min(calls.max(1)), &mut errors).await;
    let warmup_calls = gateway.task_usage(&key).map_or(0, |u| u.calls);
    let (direct, through) = ways.paired(&plain, calls, &mut errors).await;
    let (direct_stream, through_stream) = ways.paired(&streamed, calls, &mut errors).await;
    let direct_tp = throughput(
        &client,
        &direct_url,
        "none",
        &plain,
        calls,
        concurrency,
        &mut errors,
    )
    .await;
    let gateway_tp = throughput(
        &client,
        &gateway_url,
        &key,
        &plain,
        calls,
        concurrency,
        &mut errors,
    )
    .await;
    let metered = gateway.task_usage(&key).map_or(0, |u| u.calls) - warmup_calls;
    gateway.shutdown().await;

    let (d50, d99) = (percentile(&direct, 0.5), percentile(&direct, 0.99));
    let (g50, g99) = (percentile(&through, 0.5), percentile(&through, 0.99));
    let (ds50, ds99) = (
        percentile(&direct_stream, 0.5),
        percentile(&direct_stream, 0.99),
    );
    let (gs50, gs99) = (
        percentile(&through_stream, 0.5),
        percentile(&through_stream, 0.99),
    );
    BenchReport {
        note,
        calls,
        concurrency,
        direct_p50_ms: d50,
        direct_p99_ms: d99,
        gateway_p50_ms: g50,
        gateway_p99_ms: g99,
        added_p50_ms: g50 - d50,
        added_p99_ms: g99 - d99,
        direct_stream_p50_ms: ds50,
        direct_stream_p99_ms: ds99,
        gateway_stream_p50_ms: gs50,
        gateway_stream_p99_ms: gs99,
        added_stream_p50_ms: gs50 - ds50,
        direct_calls_per_s: direct_tp,
        gateway_calls_per_s: gateway_tp,
        gateway_metered_calls: metered,
        errors,
    }
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
