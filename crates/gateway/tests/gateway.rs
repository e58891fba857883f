//! The LLM gateway against a scripted upstream: metering, rewriting, streaming, retries,
//! limits, budgets, keys, transcripts, replay and metrics.

use reprobench_domain::sweep::{BackboneSpec, Price};
use reprobench_gateway::scripted::{ScriptedReply, ScriptedToolCall, ScriptedUpstream};
use reprobench_gateway::transcript::TranscriptLine;
use reprobench_gateway::{Gateway, GatewayConfig, RetryPolicy, TaskBudget, Usage};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

fn backbone(name: &str, base_url: &str) -> BackboneSpec {
    let mut params = BTreeMap::new();
    params.insert("temperature".to_string(), toml::Value::Float(0.2));
    params.insert("top_p".to_string(), toml::Value::Float(0.5));
    BackboneSpec {
        name: name.into(),
        base_url: base_url.into(),
        model: "upstream-model".into(),
        api_key_env: None,
        price: Price {
            input_per_mtok: 2.0,
            output_per_mtok: 8.0,
            cached_input_per_mtok: 0.5,
        },
        params,
        max_concurrency: None,
        requests_per_minute: None,
        timeout_s: None,
        text_only: false,
    }
}

fn fast_retries() -> RetryPolicy {
    RetryPolicy {
        max_retries: 3,
        base: Duration::from_millis(5),
        cap: Duration::from_millis(20),
    }
}

async fn start(config: GatewayConfig) -> Gateway {
    Gateway::start(
        "127.0.0.1:0".parse().unwrap(),
        GatewayConfig {
            retry: fast_retries(),
            ..config
        },
    )
    .await
    .unwrap()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

fn ask(content: &str) -> Value {
    json!({"model": "agent-asked-model", "messages": [{"role": "user", "content": content}]})
}

/// Posts a chat completion; returns status, the replay header, and the body (JSON, or the
/// raw text as a JSON string when it is not JSON).
async fn chat(gateway: &Gateway, key: &str, body: &Value) -> (u16, Option<String>, Value) {
    let response = client()
        .post(format!("{}/chat/completions", gateway.base_url()))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let replay = response
        .headers()
        .get("x-reprobench-replay")
        .map(|v| v.to_str().unwrap().to_string());
    let text = response.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, replay, body)
}

async fn get_json(gateway: &Gateway, path: &str) -> Value {
    let url = format!("http://{}{path}", gateway.local_addr());
    client()
        .get(url)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

fn assert_cost(actual: f64, expected: f64) {
    assert!(
        (actual - expected).abs() < 1e-12,
        "cost {actual} != {expected}"
    );
}

fn content(body: &Value) -> &str {
    body["choices"][0]["message"]["content"].as_str().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metering_is_exact_per_task_and_in_usage_endpoint() {
    let upstream = ScriptedUpstream::start(|req| {
        if req.body["messages"].to_string().contains("task A") {
            ScriptedReply::Message {
                content: Some("a".into()),
                tool_calls: vec![],
                prompt_tokens: 1000,
                completion_tokens: 200,
                cached_tokens: 400,
            }
        } else {
            ScriptedReply::Message {
                content: Some("b".into()),
                tool_calls: vec![],
                prompt_tokens: 300,
                completion_tokens: 50,
                cached_tokens: 0,
            }
        }
    })
    .await;
    let gw = start(GatewayConfig::default()).await;
    let spec = backbone("gpt", &upstream.base_url());
    let key_a = gw
        .open_task("A", &spec, TaskBudget::default(), None)
        .unwrap();
    let key_b = gw
        .open_task("B", &spec, TaskBudget::default(), None)
        .unwrap();
    for _ in 0..3 {
        assert_eq!(chat(&gw, &key_a, &ask("task A")).await.0, 200);
    }
    for _ in 0..2 {
        assert_eq!(chat(&gw, &key_b, &ask("task B")).await.0, 200);
    }
    // A: (600*2 + 400*0.5 + 200*8)/1e6 = $0.003 a call; B: (300*2 + 50*8)/1e6 = $0.001.
    let a = gw.task_usage(&key_a).unwrap();
    assert_eq!(
        (a.calls, a.tokens_in, a.tokens_out, a.tokens_cached),
        (3, 3000, 600, 1200)
    );
    assert_cost(a.cost_usd, 0.009);
    let b = gw.task_usage(&key_b).unwrap();
    assert_eq!(
        (b.calls, b.tokens_in, b.tokens_out, b.tokens_cached),
        (2, 600, 100, 0)
    );
    assert_cost(b.cost_usd, 0.002);
    assert!(!a.replay && a.failed_calls == 0 && a.retries == 0);
    let totals = gw.totals();
    assert_eq!((totals.calls, totals.tokens_in), (5, 3600));
    assert_cost(totals.cost_usd, 0.011);

    let usage = get_json(&gw, "/v1/usage").await;
    assert_eq!(usage["calls"], 5);
    assert_eq!(usage["tokens_out"], 700);
    assert_eq!(usage["tokens_cached"], 1200);
    assert_eq!(usage["replay"], false);
    assert_cost(usage["cost_usd"].as_f64().unwrap(), 0.011);
    assert!(usage.get("tasks").is_none());
    let per_task = get_json(&gw, "/v1/usage?per_task=true").await;
    let tasks: BTreeMap<String, Usage> = serde_json::from_value(per_task["tasks"].clone()).unwrap();
    // JSON carries floats to within rounding of their last digit, so compare seconds loosely.
    for (got, want) in [(&tasks["A"], &a), (&tasks["B"], &b)] {
        assert!((got.llm_seconds - want.llm_seconds).abs() < 1e-9);
        let exact = |u: &Usage| Usage {
            llm_seconds: 0.0,
            ..u.clone()
        };
        assert_eq!(exact(got), exact(want));
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_and_images_pass_through_with_model_and_params_rewritten() {
    let upstream = ScriptedUpstream::start(|_| ScriptedReply::Message {
        content: None,
        tool_calls: vec![ScriptedToolCall {
            name: "run_test".into(),
            arguments: "{\"path\":\"tests/test_x.py\"}".into(),
        }],
        prompt_tokens: 7,
        completion_tokens: 3,
        cached_tokens: 0,
    })
    .await;
    let gw = start(GatewayConfig::default()).await;
    let key = gw
        .open_task(
            "t",
            &backbone("gpt", &upstream.base_url()),
            TaskBudget::default(),
            None,
        )
        .unwrap();
    let image = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";
    let request = json!({
        "model": "whatever-the-agent-says",
        "top_p": 0.9,
        "messages": [
            {"role": "system", "content": "You reproduce bugs."},
            {"role": "user", "content": [
                {"type": "text", "text": "What does the screenshot show?"},
                {"type": "image_url", "image_url": {"url": image}}
            ]},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "tests/"}
        ],
        "tools": [{"type": "function", "function": {
            "name": "run_test", "description": "Run one test file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
        }}],
        "tool_choice": "auto"
    });
    let (status, _, body) = chat(&gw, &key, &request).await;
    assert_eq!(status, 200);
    assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");
    let call = &body["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "run_test");
    assert_eq!(
        call["function"]["arguments"],
        "{\"path\":\"tests/test_x.py\"}"
    );

    let mut expected = request.clone();
    expected["model"] = json!("upstream-model");
    expected["temperature"] = json!(0.2); // added from the backbone's params
    // top_p stays 0.9: the request set it.
    let seen = upstream.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body, expected);
    assert_eq!(seen[0].authorization, None);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_passes_chunks_through_and_counts_usage() {
    let upstream = ScriptedUpstream::start(|_| ScriptedReply::Message {
        content: Some("Hello from the stream".into()),
        tool_calls: vec![],
        prompt_tokens: 40,
        completion_tokens: 6,
        cached_tokens: 8,
    })
    .await;
    let gw = start(GatewayConfig::default()).await;
    let key = gw
        .open_task(
            "s",
            &backbone("gpt", &upstream.base_url()),
            TaskBudget::default(),
            None,
        )
        .unwrap();
    let mut request = ask("stream please");
    request["stream"] = json!(true);
    let response = client()
        .post(format!("{}/chat/completions", gw.base_url()))
        .bearer_auth(&key)
        .json(&request)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let text = response.text().await.unwrap();
    assert!(text.trim_end().ends_with("data: [DONE]"));
    let mut assembled = String::new();
    for line in text.lines() {
        if let Some(data) = line.strip_prefix("data: ")
            && data != "[DONE]"
        {
            let chunk: Value = serde_json::from_str(data).unwrap();
            if let Some(piece) = chunk["choices"][0]["delta"]["content"].as_str() {
                assembled.push_str(piece);
            }
        }
    }
    assert_eq!(assembled, "Hello from the stream");
    assert_eq!(
        upstream.requests()[0].body["stream_options"]["include_usage"],
        true
    );
    // Charged before `[DONE]` reached the agent.
    let usage = gw.task_usage(&key).unwrap();
    assert_eq!(
        (
            usage.calls,
            usage.tokens_in,
            usage.tokens_out,
            usage.tokens_cached
        ),
        (1, 40, 6, 8)
    );
    assert_cost(usage.cost_usd, (32.0 * 2.0 + 8.0 * 0.5 + 6.0 * 8.0) / 1e6);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limited_call_waits_for_retry_after_then_succeeds() {
    let upstream = ScriptedUpstream::start(|req| match req.index {
        0 => ScriptedReply::Status {
            code: 429,
            retry_after_s: Some(1),
            body: json!({"error": {"message": "slow down"}}).to_string(),
        },
        _ => ScriptedReply::text("ok"),
    })
    .await;
    let gw = start(GatewayConfig::default()).await;
    let key = gw
        .open_task(
            "r",
            &backbone("gpt", &upstream.base_url()),
            TaskBudget::default(),
            None,
        )
        .unwrap();
    let started = Instant::now();
    let (status, _, body) = chat(&gw, &key, &ask("hi")).await;
    assert_eq!(status, 200);
    assert_eq!(content(&body), "ok");
    // The policy's own backoff is at most 20 ms, so waiting a second is Retry-After's doing.
    assert!(started.elapsed() >= Duration::from_secs(1));
    let usage = gw.task_usage(&key).unwrap();
    assert_eq!((usage.calls, usage.retries, usage.failed_calls), (1, 1, 0));
    assert_eq!(upstream.requests().len(), 2);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_error_is_retried_and_persistent_errors_reach_the_agent() {
    let upstream = ScriptedUpstream::start(|req| {
        let flaky = req.body["messages"].to_string().contains("flaky");
        if flaky && req.index > 0 {
            ScriptedReply::text("recovered")
        } else {
            ScriptedReply::Status {
                code: if flaky { 500 } else { 503 },
                retry_after_s: None,
                body: json!({"error": {"message": "overloaded", "type": "server_error"}})
                    .to_string(),
            }
        }
    })
    .await;
    let gw = start(GatewayConfig::default()).await;
    let key = gw
        .open_task(
            "e",
            &backbone("gpt", &upstream.base_url()),
            TaskBudget::default(),
            None,
        )
        .unwrap();
    let (status, _, body) = chat(&gw, &key, &ask("flaky")).await;
    assert_eq!(status, 200);
    assert_eq!(content(&body), "recovered");
    let usage = gw.task_usage(&key).unwrap();
    assert_eq!((usage.calls, usage.retries), (1, 1));

    let (status, _, body) = chat(&gw, &key, &ask("down")).await;
    assert_eq!(status, 503);
    assert_eq!(body["error"]["message"], "overloaded");
    let usage = gw.task_usage(&key).unwrap();
    // One attempt plus max_retries (3) retries.
    assert_eq!((usage.calls, usage.failed_calls, usage.retries), (1, 1, 4));
    assert_eq!(upstream.requests().len(), 2 + 4);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_reply_past_the_timeout_is_retried() {
    let upstream = ScriptedUpstream::start(|req| match req.index {
        0 => ScriptedReply::Slow {
            delay: Duration::from_secs(5),
            then: Box::new(ScriptedReply::text("too late")),
        },
        _ => ScriptedReply::text("in time"),
    })
    .await;
    let gw = start(GatewayConfig::default()).await;
    let mut spec = backbone("gpt", &upstream.base_url());
    spec.timeout_s = Some(1);
    let key = gw
        .open_task("slow", &spec, TaskBudget::default(), None)
        .unwrap();
    let (status, _, body) = chat(&gw, &key, &ask("hi")).await;
    assert_eq!(status, 200);
    assert_eq!(content(&body), "in time");
    let usage = gw.task_usage(&key).unwrap();
    assert_eq!((usage.calls, usage.retries, usage.failed_calls), (1, 1, 0));
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_upstream_gives_502_after_retries() {
    let gw = start(GatewayConfig::default()).await;
    // Port 1 on loopback refuses connections; https exercises the TLS client setup.
    let key = gw
        .open_task(
            "gone",
            &backbone("gpt", "https://127.0.0.1:1/v1"),
            TaskBudget::default(),
            None,
        )
        .unwrap();
    let (status, _, body) = chat(&gw, &key, &ask("hi")).await;
    assert_eq!(status, 502);
    assert_eq!(body["error"]["type"], "upstream_unreachable");
    let usage = gw.task_usage(&key).unwrap();
    assert_eq!((usage.calls, usage.failed_calls, usage.retries), (0, 1, 3));
    gw.shutdown().await;
}

async fn assert_budget_rejection(gw: &Gateway, key: &str, which: &str) {
    let (status, _, body) = chat(gw, key, &ask("over budget")).await;
    assert_eq!(status, 402);
    assert_eq!(body["error"]["type"], "budget_exceeded");
    assert_eq!(body["error"]["code"], "budget_exceeded");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("{which} budget exhausted")),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausted_budgets_refuse_calls_without_reaching_upstream() {
    let upstream = ScriptedUpstream::start(|_| ScriptedReply::text("fine")).await;
    let gw = start(GatewayConfig::default()).await;
    let spec = backbone("gpt", &upstream.base_url());
    let open = |name: &str, budget: TaskBudget| gw.open_task(name, &spec, budget, None).unwrap();

    let calls = open(
        "calls",
        TaskBudget {
            max_calls: Some(2),
            ..TaskBudget::default()
        },
    );
    // Each text reply is 10 in + 5 out tokens costing (10*2 + 5*8)/1e6 = $0.00006.
    let tokens = open(
        "tokens",
        TaskBudget {
            max_tokens: Some(15),
            ..TaskBudget::default()
        },
    );
    let cost = open(
        "cost",
        TaskBudget {
            max_cost_usd: Some(0.00005),
            ..TaskBudget::default()
        },
    );
    let time = open(
        "time",
        TaskBudget {
            max_duration: Some(Duration::ZERO),
            ..TaskBudget::default()
        },
    );

    for key in [&calls, &calls, &tokens, &cost] {
        assert_eq!(chat(&gw, key, &ask("within budget")).await.0, 200);
    }
    let upstream_calls = upstream.requests().len();
    assert_eq!(upstream_calls, 4);
    assert_budget_rejection(&gw, &calls, "calls").await;
    assert_budget_rejection(&gw, &tokens, "tokens").await;
    assert_budget_rejection(&gw, &cost, "cost").await;
    assert_budget_rejection(&gw, &time, "time").await;
    assert_eq!(upstream.requests().len(), upstream_calls);
    for key in [&calls, &tokens, &cost, &time] {
        assert_eq!(gw.task_usage(key).unwrap().budget_rejections, 1);
    }
    assert_eq!(gw.task_usage(&calls).unwrap().calls, 2);
    assert_eq!(gw.totals().budget_rejections, 4);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_missing_and_closed_keys_are_refused() {
    let upstream = ScriptedUpstream::start(|_| ScriptedReply::text("fine")).await;
    let gw = start(GatewayConfig::default()).await;
    let key = gw
        .open_task(
            "k",
            &backbone("gpt", &upstream.base_url()),
            TaskBudget::default(),
            None,
        )
        .unwrap();
    assert!(key.starts_with("rb-"));
    let (status, _, body) = chat(&gw, "rb-not-a-key", &ask("hi")).await;
    assert_eq!(status, 401);
    assert_eq!(body["error"]["type"], "invalid_api_key");
    let no_auth = client()
        .post(format!("{}/chat/completions", gw.base_url()))
        .json(&ask("hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(no_auth.status().as_u16(), 401);

    assert_eq!(chat(&gw, &key, &ask("hi")).await.0, 200);
    let closed = gw.close_task(&key).unwrap();
    assert_eq!(closed.calls, 1);
    assert_eq!(chat(&gw, &key, &ask("hi")).await.0, 401);
    assert_eq!(gw.task_usage(&key), None);
    assert_eq!(gw.close_task(&key), None);
    assert_eq!(upstream.requests().len(), 1);
    // Closed tasks still count in the totals.
    assert_eq!(gw.totals().calls, 1);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_api_key_variable_is_a_clear_error() {
    let gw = start(GatewayConfig::default()).await;
    let mut spec = backbone("claude", "https://api.example.com/v1");
    spec.api_key_env = Some("RB_GATEWAY_TEST_SURELY_UNSET_KEY".into());
    let err = gw
        .open_task("t", &spec, TaskBudget::default(), None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("backbone `claude`"), "{err}");
    assert!(err.contains("$RB_GATEWAY_TEST_SURELY_UNSET_KEY"), "{err}");
    assert!(
        err.contains("export RB_GATEWAY_TEST_SURELY_UNSET_KEY="),
        "{err}"
    );
    gw.shutdown().await;
}

fn read_transcript(path: &Path) -> Vec<TranscriptLine> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_transcripts_replay_identically_without_upstream() {
    let record_dir = tempfile::tempdir().unwrap();
    let upstream = ScriptedUpstream::start(|req| ScriptedReply::Message {
        content: Some(format!("answer #{}", req.index)),
        tool_calls: vec![],
        prompt_tokens: 100,
        completion_tokens: 10 + req.index,
        cached_tokens: 20,
    })
    .await;
    let spec = backbone("gpt", &upstream.base_url());
    let gw = start(GatewayConfig {
        transcripts: Some(record_dir.path().to_path_buf()),
        ..GatewayConfig::default()
    })
    .await;
    let key = gw
        .open_task("proj/issue#1", &spec, TaskBudget::default(), None)
        .unwrap();
    let mut streamed = ask("stream it");
    streamed["stream"] = json!(true);
    let mut recorded = Vec::new();
    for request in [ask("same"), ask("same"), ask("other")] {
        let (status, replay, body) = chat(&gw, &key, &request).await;
        assert_eq!((status, replay), (200, None));
        recorded.push(body);
    }
    let (status, _, recorded_stream) = chat(&gw, &key, &streamed).await;
    assert_eq!(status, 200);
    let recorded_usage = gw.close_task(&key).unwrap();
    gw.shutdown().await;
    drop(upstream);

    let transcript = record_dir.path().join("proj_issue_1.jsonl");
    let lines = read_transcript(&transcript);
    assert_eq!(lines.len(), 4);
    assert!(lines.iter().all(|l| !l.replay && l.task == "proj/issue#1"));
    assert_eq!(lines[0].request_hash, lines[1].request_hash);
    assert_ne!(lines[0].request_hash, lines[2].request_hash);
    assert!(lines[3].stream);

    let replay_dir = tempfile::tempdir().unwrap();
    let gw = start(GatewayConfig {
        replay: Some(record_dir.path().to_path_buf()),
        transcripts: Some(replay_dir.path().to_path_buf()),
        ..GatewayConfig::default()
    })
    .await;
    assert!(gw.is_replay());
    let key = gw
        .open_task("proj/issue#1", &spec, TaskBudget::default(), None)
        .unwrap();
    for (request, expected) in [ask("same"), ask("same"), ask("other")]
        .iter()
        .zip(&recorded)
    {
        let (status, replay, body) = chat(&gw, &key, request).await;
        assert_eq!(status, 200);
        assert_eq!(replay.as_deref(), Some("1"));
        assert_eq!(&body, expected);
    }
    let (status, replay, replayed_stream) = chat(&gw, &key, &streamed).await;
    assert_eq!((status, replay.as_deref()), (200, Some("1")));
    assert_eq!(replayed_stream, recorded_stream);
    // A third identical request was never recorded.
    let (status, _, body) = chat(&gw, &key, &ask("same")).await;
    assert_eq!(status, 404);
    assert_eq!(body["error"]["type"], "replay_miss");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&lines[0].request_hash)
    );

    let usage = gw.task_usage(&key).unwrap();
    assert!(usage.replay);
    assert_eq!(
        (
            usage.calls,
            usage.tokens_in,
            usage.tokens_out,
            usage.tokens_cached
        ),
        (
            recorded_usage.calls,
            recorded_usage.tokens_in,
            recorded_usage.tokens_out,
            recorded_usage.tokens_cached
        )
    );
    assert_cost(usage.cost_usd, recorded_usage.cost_usd);
    assert_eq!(get_json(&gw, "/v1/usage").await["replay"], true);
    gw.shutdown().await;
    let replayed = read_transcript(&replay_dir.path().join("proj_issue_1.jsonl"));
    assert_eq!(replayed.len(), 5);
    assert!(replayed.iter().all(|l| l.replay && l.attempts == 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backbone_concurrency_limit_is_shared_by_tasks() {
    let upstream = ScriptedUpstream::start(|_| ScriptedReply::Slow {
        delay: Duration::from_millis(100),
        then: Box::new(ScriptedReply::text("done")),
    })
    .await;
    let gw = start(GatewayConfig::default()).await;
    let mut spec = backbone("gpt", &upstream.base_url());
    spec.max_concurrency = Some(2);
    let keys: Vec<String> = (0..4)
        .map(|i| {
            gw.open_task(&format!("t{i}"), &spec, TaskBudget::default(), None)
                .unwrap()
        })
        .collect();
    let mut calls = Vec::new();
    for i in 0..8 {
        let (gw, key) = (gw.clone(), keys[i % 4].clone());
        calls.push(tokio::spawn(
            async move { chat(&gw, &key, &ask("hi")).await.0 },
        ));
    }
    for call in calls {
        assert_eq!(call.await.unwrap(), 200);
    }
    assert_eq!(upstream.requests().len(), 8);
    assert_eq!(upstream.max_in_flight(), 2);
    assert_eq!(gw.totals().calls, 8);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_overspend_a_budget_by_at_most_one_reservation() {
    // Each answer is 10 in + 5 out tokens, and comes late: every call is in flight at once.
    let upstream = ScriptedUpstream::start(|_| ScriptedReply::Slow {
        delay: Duration::from_millis(300),
        then: Box::new(ScriptedReply::text("fine")),
    })
    .await;
    let gw = start(GatewayConfig::default()).await;
    let spec = backbone("gpt", &upstream.base_url());
    let limit = 100;
    let budget = TaskBudget {
        max_tokens: Some(limit),
        ..TaskBudget::default()
    };
    let key = gw.open_task("burst", &spec, budget, None).unwrap();
    let request =
        json!({"model": "m", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]});
    let reservation = reprobench_gateway::Reservation::of(&request, 20, &spec.price).tokens;
    let calls: Vec<_> = (0..12)
        .map(|_| {
            let (gw, key, request) = (gw.clone(), key.clone(), request.clone());
            tokio::spawn(async move { chat(&gw, &key, &request).await.0 })
        })
        .collect();
    let mut statuses = Vec::new();
    for call in calls {
        statuses.push(call.await.unwrap());
    }
    let used = gw.task_usage(&key).unwrap();
    let spent = used.tokens_in + used.tokens_out;
    assert!(
        spent <= limit + reservation,
        "{spent} tokens spent of a {limit}-token budget by concurrent calls ({statuses:?})"
    );
    assert!(statuses.contains(&402), "{statuses:?}");
    assert_eq!(used.calls as usize, upstream.requests().len());
    // The reservations are given back: the task's next call is admitted on what it used.
    assert_eq!(chat(&gw, &key, &request).await.0, 200);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budgeted_call_asks_the_upstream_for_no_more_than_the_gateways_output_cap() {
    let upstream = ScriptedUpstream::start(|_| ScriptedReply::text("fine")).await;
    let gw = start(GatewayConfig {
        max_output_tokens: Some(256),
        ..GatewayConfig::default()
    })
    .await;
    let spec = backbone("gpt", &upstream.base_url());
    let budgeted = TaskBudget {
        max_cost_usd: Some(1.0),
        ..TaskBudget::default()
    };
    let key = gw.open_task("capped", &spec, budgeted, None).unwrap();
    let free = gw
        .open_task("free", &spec, TaskBudget::default(), None)
        .unwrap();
    let mut greedy = ask("write a novel");
    greedy["max_completion_tokens"] = json!(1_000_000);
    assert_eq!(chat(&gw, &key, &ask("hi")).await.0, 200);
    assert_eq!(chat(&gw, &key, &greedy).await.0, 200);
    assert_eq!(chat(&gw, &free, &greedy).await.0, 200);
    let seen: Vec<Value> = upstream.requests().into_iter().map(|r| r.body).collect();
    assert_eq!(seen[0]["max_tokens"], 256);
    assert_eq!(seen[1]["max_completion_tokens"], 256);
    // Without a tokens or cost budget nothing is reserved, and the request goes as asked.
    assert_eq!(seen[2]["max_completion_tokens"], 1_000_000);
    assert!(seen[2].get("max_tokens").is_none());
    gw.shutdown().await;
}

/// This machine's address on its network (not loopback): where other machines reach it.
fn network_address() -> std::net::IpAddr {
    let probe = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    // No packet is sent: connecting a UDP socket only picks the route and the local address.
    probe
        .connect("10.255.255.254:9")
        .expect("this test needs a network interface besides loopback (a route to 10.0.0.0/8 or a default route)");
    let ip = probe.local_addr().unwrap().ip();
    assert!(!ip.is_loopback(), "{ip}");
    ip
}

async fn stats_status(url: String, key: Option<&str>) -> u16 {
    let mut request = client().get(url);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    request.send().await.unwrap().status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_and_metrics_answer_other_machines_only_with_the_stats_key() {
    let ip = network_address();
    for stats_key in [None, Some("stats-secret-0123")] {
        let gw = Gateway::start(
            "0.0.0.0:0".parse().unwrap(),
            GatewayConfig {
                stats_key: stats_key.map(str::to_string),
                ..GatewayConfig::default()
            },
        )
        .await
        .unwrap();
        let port = gw.local_addr().port();
        for path in ["/v1/usage?per_task=true", "/metrics"] {
            let here = format!("http://127.0.0.1:{port}{path}");
            let there = format!("http://{ip}:{port}{path}");
            assert_eq!(stats_status(here, None).await, 200, "{path} on loopback");
            match stats_key {
                None => {
                    assert_eq!(stats_status(there.clone(), None).await, 403, "{path}");
                    assert_eq!(stats_status(there, Some("guess")).await, 403, "{path}");
                }
                Some(key) => {
                    assert_eq!(stats_status(there.clone(), None).await, 401, "{path}");
                    assert_eq!(stats_status(there.clone(), Some("guess")).await, 401);
                    assert_eq!(stats_status(there, Some(key)).await, 200, "{path}");
                }
            }
        }
        gw.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_mode_charges_each_token_as_its_own_task() {
    let upstream = ScriptedUpstream::start(|_| ScriptedReply::text("hi")).await;
    let gw = start(GatewayConfig {
        open: true,
        default_backbone: Some(backbone("gpt", &upstream.base_url())),
        default_budget: TaskBudget {
            max_calls: Some(2),
            ..TaskBudget::default()
        },
        ..GatewayConfig::default()
    })
    .await;
    for token in ["alice-token-123", "alice-token-123", "bob-token-456"] {
        assert_eq!(chat(&gw, token, &ask("hi")).await.0, 200);
    }
    assert_eq!(chat(&gw, "alice-token-123", &ask("hi")).await.0, 402);
    let usage = get_json(&gw, "/v1/usage?per_task=true").await;
    let tasks = usage["tasks"].as_object().unwrap();
    assert_eq!(tasks.len(), 2);
    let mut calls: Vec<u64> = tasks
        .values()
        .map(|u| u["calls"].as_u64().unwrap())
        .collect();
    calls.sort();
    assert_eq!(calls, vec![1, 2]);
    assert!(
        tasks
            .keys()
            .all(|name| name.starts_with("open-") && !name.contains("token"))
    );
    let models = get_json(&gw, "/v1/models").await;
    assert_eq!(models["data"][0]["id"], "gpt");
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_expose_calls_tokens_retries_and_rejections() {
    let upstream = ScriptedUpstream::start(|req| match req.index {
        0 => ScriptedReply::Status {
            code: 500,
            retry_after_s: None,
            body: "{}".into(),
        },
        _ => ScriptedReply::text("fine"),
    })
    .await;
    let gw = start(GatewayConfig::default()).await;
    let spec = backbone("gpt", &upstream.base_url());
    let key = gw
        .open_task(
            "m",
            &spec,
            TaskBudget {
                max_calls: Some(2),
                ..TaskBudget::default()
            },
            None,
        )
        .unwrap();
    for _ in 0..3 {
        chat(&gw, &key, &ask("hi")).await;
    }
    let text = client()
        .get(format!("http://{}/metrics", gw.local_addr()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for expected in [
        "reprobench_gateway_calls_total{backbone=\"gpt\",status=\"200\"} 2",
        "reprobench_gateway_tokens_total{backbone=\"gpt\",kind=\"input\"} 20",
        "reprobench_gateway_tokens_total{backbone=\"gpt\",kind=\"output\"} 10",
        "reprobench_gateway_retries_total{backbone=\"gpt\"} 1",
        "reprobench_gateway_budget_rejections_total{backbone=\"gpt\"} 1",
        "reprobench_gateway_in_flight 0",
        "reprobench_gateway_call_duration_seconds_count{backbone=\"gpt\"} 2",
        "# TYPE reprobench_gateway_call_duration_seconds histogram",
    ] {
        assert!(text.contains(expected), "missing `{expected}` in:\n{text}");
    }
    assert!(text.contains("reprobench_gateway_cost_usd_total{backbone=\"gpt\"} 0.00012"));
    gw.shutdown().await;
}

/// Polls `f` every 20 ms until it is true or `deadline` passes.
async fn eventually(deadline: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + deadline;
    while Instant::now() < end {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    f()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_the_upstream_answers_is_charged_even_when_the_client_hung_up_first() {
    let upstream = ScriptedUpstream::start(|_| ScriptedReply::Slow {
        delay: Duration::from_millis(600),
        then: Box::new(ScriptedReply::text("answered after the client left")),
    })
    .await;
    let gw = start(GatewayConfig::default()).await;
    let key = gw
        .open_task(
            "hangup",
            &backbone("gpt", &upstream.base_url()),
            TaskBudget::default(),
            None,
        )
        .unwrap();
    let impatient = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    for body in [ask("plain"), {
        let mut b = ask("streamed");
        b["stream"] = json!(true);
        b
    }] {
        let sent = impatient
            .post(format!("{}/chat/completions", gw.base_url()))
            .bearer_auth(&key)
            .json(&body)
            .send()
            .await;
        assert!(sent.is_err(), "the client gives up before the answer");
    }
    // The upstream got both calls and answered them: both are charged, tokens and all.
    let charged = eventually(Duration::from_secs(20), || {
        gw.task_usage(&key).is_some_and(|u| u.calls == 2)
    })
    .await;
    let usage = gw.task_usage(&key).unwrap();
    assert!(charged, "{usage:?}");
    assert_eq!((usage.tokens_in, usage.tokens_out), (20, 10), "{usage:?}");
    assert_eq!(upstream.requests().len(), 2);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_without_usage_is_charged_an_estimate_and_counted() {
    let answer = json!({"id": "x", "object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "a".repeat(400)}, "finish_reason": "stop"}
    ]});
    let upstream = ScriptedUpstream::start(move |_| ScriptedReply::Status {
        code: 200,
        retry_after_s: None,
        body: answer.to_string(),
    })
    .await;
    let gw = start(GatewayConfig::default()).await;
    let budget = TaskBudget {
        max_tokens: Some(150),
        ..TaskBudget::default()
    };
    let key = gw
        .open_task(
            "nousage",
            &backbone("gpt", &upstream.base_url()),
            budget,
            None,
        )
        .unwrap();
    let (status, _, _) = chat(&gw, &key, &ask(&"q".repeat(40))).await;
    assert_eq!(status, 200);
    let usage = gw.task_usage(&key).unwrap();
    assert_eq!(usage.calls, 1);
    assert_eq!(usage.calls_without_usage, 1);
    assert_eq!((usage.tokens_in, usage.tokens_out), (10, 100), "{usage:?}");
    assert!(usage.cost_usd > 0.0, "{usage:?}");
    // The estimate counts against the budget: 110 of 150 tokens used, the next call may go,
    // and after it the budget is spent.
    let (status, _, _) = chat(&gw, &key, &ask(&"q".repeat(40))).await;
    assert_eq!(status, 200);
    let (status, _, body) = chat(&gw, &key, &ask("again")).await;
    assert_eq!(status, 402, "{body}");
    gw.shutdown().await;
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_tasks_leave_no_open_files_and_bounded_state() {
    let upstream = ScriptedUpstream::start(|_| ScriptedReply::text("ok")).await;
    let dir = tempfile::tempdir().unwrap();
    let gw = start(GatewayConfig {
        transcripts: Some(dir.path().to_path_buf()),
        ..GatewayConfig::default()
    })
    .await;
    let spec = backbone("gpt", &upstream.base_url());
    let before = open_fds();
    let mut peak_retained = 0;
    for i in 0..10_000 {
        let key = gw
            .open_task(&format!("t{i}"), &spec, TaskBudget::default(), None)
            .unwrap();
        // Every 20th task makes a call, so its transcript is written to.
        if i % 20 == 0 {
            assert_eq!(chat(&gw, &key, &ask("hi")).await.0, 200);
        }
        let usage = gw.close_task(&key).unwrap();
        assert_eq!(usage.calls, u64::from(i % 20 == 0));
        peak_retained = peak_retained.max(gw.retained_tasks().1);
    }
    // Each task had its transcript file open; none stays open after its task ends.
    let after = open_fds();
    assert!(
        after <= before + 16,
        "file descriptors grew from {before} to {after} over 10,000 tasks"
    );
    assert_eq!(gw.retained_tasks().0, 0, "no open task left");
    assert!(
        peak_retained <= reprobench_gateway::RETIRED_NAMES_KEPT,
        "{peak_retained}"
    );
    // Totals still count every call, and per-task usage lists the latest tasks by name.
    assert_eq!(gw.totals().calls, 500);
    let per_task = get_json(&gw, "/v1/usage?per_task=true").await;
    let tasks = per_task["tasks"].as_object().unwrap();
    assert!(
        tasks.contains_key("t9980"),
        "the latest closed task is listed"
    );
    let listed: u64 = tasks.values().map(|u| u["calls"].as_u64().unwrap()).sum();
    assert_eq!(
        listed, 500,
        "listed tasks and the earlier sum account for every call"
    );
    let lines = std::fs::read_to_string(dir.path().join("t9980.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 1);
    gw.shutdown().await;
}

/// A TCP socket of this process: its local and peer address and whether TCP_NODELAY is on.
struct OpenTcpSocket {
    local: std::net::SocketAddr,
    peer: Option<std::net::SocketAddr>,
    nodelay: bool,
}

/// IPv4 address of a socket fd, from getsockname or getpeername.
fn ipv4_of(
    fd: libc::c_int,
    get: unsafe extern "C" fn(
        libc::c_int,
        *mut libc::sockaddr,
        *mut libc::socklen_t,
    ) -> libc::c_int,
) -> Option<std::net::SocketAddr> {
    // SAFETY: the buffer and its length are valid for the call; a closed or non-socket fd
    // makes the call fail, which is handled.
    unsafe {
        let mut storage: libc::sockaddr_storage = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        if get(fd, &mut storage as *mut _ as *mut libc::sockaddr, &mut len) != 0
            || storage.ss_family as libc::c_int != libc::AF_INET
        {
            return None;
        }
        let v4 = &*(&storage as *const _ as *const libc::sockaddr_in);
        let ip = std::net::Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr));
        Some(std::net::SocketAddr::from((ip, u16::from_be(v4.sin_port))))
    }
}

/// Every IPv4 TCP socket this process holds open, read from /proc/self/fd.
fn open_tcp_sockets() -> Vec<OpenTcpSocket> {
    let mut sockets = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let is_socket = std::fs::read_link(entry.path())
            .map(|t| t.to_string_lossy().starts_with("socket:"))
            .unwrap_or(false);
        if !is_socket {
            continue;
        }
        let Some(local) = ipv4_of(fd, libc::getsockname) else {
            continue;
        };
        let mut flag: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: flag and len are valid for the call; failure is handled.
        let got = unsafe {
            libc::getsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_NODELAY,
                &mut flag as *mut _ as *mut libc::c_void,
                &mut len,
            )
        };
        if got != 0 {
            continue;
        }
        sockets.push(OpenTcpSocket {
            local,
            peer: ipv4_of(fd, libc::getpeername),
            nodelay: flag != 0,
        });
    }
    sockets
}

/// A streamed answer is relayed as many small writes; with Nagle's algorithm on, each waited
/// on the peer's delayed ACK (about 40 ms a call). Both of the gateway's sockets, the one it
/// accepted from the agent and the one it opened to the upstream, must send at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_sockets_of_a_relayed_stream_send_small_writes_at_once() {
    let upstream = ScriptedUpstream::start(|_| ScriptedReply::Message {
        content: Some("one two three four five".into()),
        tool_calls: vec![],
        prompt_tokens: 10,
        completion_tokens: 5,
        cached_tokens: 0,
    })
    .await;
    let gw = start(GatewayConfig::default()).await;
    let key = gw
        .open_task(
            "nodelay",
            &backbone("gpt", &upstream.base_url()),
            TaskBudget::default(),
            None,
        )
        .unwrap();
    let mut request = ask("stream please");
    request["stream"] = json!(true);
    // One client kept alive, so both connections stay open (pooled) while they are inspected.
    let agent = client();
    let response = agent
        .post(format!("{}/chat/completions", gw.base_url()))
        .bearer_auth(&key)
        .json(&request)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert!(response.text().await.unwrap().contains("[DONE]"));

    let upstream_addr: std::net::SocketAddr = upstream
        .base_url()
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let sockets = open_tcp_sockets();
    let accepted: Vec<_> = sockets
        .iter()
        .filter(|s| s.local == gw.local_addr() && s.peer.is_some())
        .collect();
    let to_upstream: Vec<_> = sockets
        .iter()
        .filter(|s| s.peer == Some(upstream_addr))
        .collect();
    assert!(!accepted.is_empty(), "the agent's connection is open");
    assert!(!to_upstream.is_empty(), "the upstream connection is open");
    assert!(
        accepted.iter().all(|s| s.nodelay),
        "TCP_NODELAY on the accepted socket"
    );
    assert!(
        to_upstream.iter().all(|s| s.nodelay),
        "TCP_NODELAY on the upstream socket"
    );
    drop(agent);
}

#[tokio::test]
async fn a_counting_upstream_answers_and_counts_without_keeping_requests() {
    use reprobench_gateway::scripted::{Keep, SCRIPTED};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = ScriptedUpstream::serve(listener, SCRIPTED, Keep::Count, |_| {
        ScriptedReply::text("counted")
    });
    for _ in 0..3 {
        let answer: Value = client()
            .post(format!("{}/chat/completions", upstream.base_url()))
            .json(&ask("hello"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(answer["choices"][0]["message"]["content"], "counted");
    }
    assert_eq!(upstream.request_count(), 3);
    assert!(upstream.requests().is_empty());
}
