//! HTTP routes: chat completions (forwarded, streamed or replayed), usage, models, metrics.

use super::accounting::{Reservation, TokenCounts, Usage, cap_output_tokens};
use super::replay::request_hash;
use super::sse::{SseParser, chunks_to_completion, completion_to_chunks, encode_sse};
use super::transcript::TranscriptLine;
use super::upstream::Forwarded;
use super::{DEFAULT_MAX_OUTPUT_TOKENS, Shared, Task, lock};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::StreamExt;
use reprobench_domain::secret::same_secret;
use serde::Deserialize;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

type AppState = Arc<Shared>;

/// The gateway's routes.
pub(crate) fn router(shared: AppState) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/usage", get(usage))
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .with_state(shared)
}

/// An OpenAI-shaped error response.
fn error_response(status: u16, kind: &str, message: &str) -> Response {
    json_response(
        status,
        &json!({"error": {"message": message, "type": kind, "code": kind}}),
    )
}

fn json_response(status: u16, body: &Value) -> Response {
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

async fn not_found() -> Response {
    error_response(
        404,
        "not_found",
        "no such route; the gateway serves POST /v1/chat/completions, GET /v1/models, GET /v1/usage and GET /metrics",
    )
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))?;
    let token = token.trim();
    (!token.is_empty()).then_some(token)
}

/// What a text-only backbone gets in place of an image.
pub const IMAGE_OMITTED: &str = "[image omitted: this model reads text only]";

/// Turns every message's list of content parts into one string: text parts as they are, each
/// image part as [`IMAGE_OMITTED`]. Returns how many images were left out.
pub fn text_only_messages(messages: &mut Value) -> usize {
    let mut omitted = 0;
    for message in messages.as_array_mut().into_iter().flatten() {
        let Some(parts) = message.get("content").and_then(Value::as_array) else {
            continue;
        };
        let text: Vec<&str> = parts
            .iter()
            .map(|part| match part.get("type").and_then(Value::as_str) {
                Some("text") => part.get("text").and_then(Value::as_str).unwrap_or(""),
                _ => {
                    omitted += 1;
                    IMAGE_OMITTED
                }
            })
            .collect();
        message["content"] = json!(text.join("\n"));
    }
    omitted
}

/// Sets the backbone's model, adds its parameters the request does not set, asks streams to
/// report usage, and gives a text-only backbone text only.
fn rewrite_request(request: &mut serde_json::Map<String, Value>, task: &Task, stream: bool) {
    request.insert("model".into(), json!(task.backbone.model));
    if task.backbone.text_only
        && let Some(messages) = request.get_mut("messages")
    {
        text_only_messages(messages);
    }
    for (name, value) in &task.backbone.params {
        if !request.contains_key(name)
            && let Ok(value) = serde_json::to_value(value)
        {
            request.insert(name.clone(), value);
        }
    }
    if stream {
        let options = request.entry("stream_options").or_insert_with(|| json!({}));
        if !options.is_object() {
            *options = json!({});
        }
        options["include_usage"] = json!(true);
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Marks a call in flight for its task and the gauge, holding its reservation; undone on drop
/// (after the call's usage is charged).
struct InFlight {
    shared: AppState,
    task: Arc<Task>,
    reservation: Reservation,
}

impl InFlight {
    fn new(shared: &AppState, task: &Arc<Task>, reservation: Reservation) -> InFlight {
        lock(&shared.metrics).add_in_flight(1);
        InFlight {
            shared: shared.clone(),
            task: task.clone(),
            reservation,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut state = lock(&self.task.state);
        state.in_flight = state.in_flight.saturating_sub(1);
        state.reserved.release(&self.reservation);
        drop(state);
        lock(&self.shared.metrics).add_in_flight(-1);
    }
}

/// Everything known about a call once it has ended.
struct CallRecord {
    ts_ms: u64,
    started: Instant,
    request: Value,
    request_hash: String,
    response: Value,
    stream: bool,
    status: u16,
    attempts: u32,
    tokens: Option<TokenCounts>,
    replay: bool,
}

/// Charges a finished call to its task, counts it in the metrics, writes its transcript line.
fn finish_call(shared: &Shared, task: &Task, call: CallRecord) {
    let latency = call.started.elapsed();
    let success = (200..300).contains(&call.status);
    let mut usage = match (success, call.tokens) {
        (true, Some(tokens)) => tokens.as_call_usage(&task.backbone.price),
        // No `usage` in the answer: a provider still bills it, so the call is charged an
        // estimate (and counted as such), and budgets see it.
        (true, None) => Usage {
            calls_without_usage: 1,
            ..TokenCounts::estimate(&call.request, &call.response)
                .as_call_usage(&task.backbone.price)
        },
        (false, _) => Usage {
            failed_calls: 1,
            ..Usage::default()
        },
    };
    usage.retries = u64::from(call.attempts.saturating_sub(1));
    usage.llm_seconds = latency.as_secs_f64();
    usage.replay = call.replay;
    shared.charge(task, &usage);
    {
        let mut metrics = lock(&shared.metrics);
        metrics.record_call(
            &task.backbone.name,
            call.status,
            usage.tokens_in,
            usage.tokens_out,
            usage.tokens_cached,
            usage.cost_usd,
            usage.llm_seconds,
        );
        for _ in 0..usage.retries {
            metrics.record_retry(&task.backbone.name);
        }
    }
    if let Some(transcript) = &task.transcript {
        let line = TranscriptLine {
            ts_ms: call.ts_ms,
            task: task.name.clone(),
            backbone: task.backbone.name.clone(),
            model: task.backbone.model.clone(),
            request_hash: call.request_hash,
            request: call.request,
            response: call.response,
            stream: call.stream,
            status: call.status,
            latency_ms: latency.as_millis() as u64,
            attempts: call.attempts,
            usage,
            replay: call.replay,
        };
        if let Err(e) = transcript.write(&line) {
            tracing::warn!(
                task = %task.name,
                path = %transcript.path().display(),
                "cannot append to transcript: {e}"
            );
        }
    }
}

async fn chat_completions(
    State(shared): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let ts_ms = now_ms();
    let Some(token) = bearer(&headers) else {
        return error_response(
            401,
            "invalid_api_key",
            "missing `Authorization: Bearer <key>`: use the virtual key the harness gave this agent",
        );
    };
    let task = match shared.task_for_key(token) {
        Ok(Some(task)) => task,
        Ok(None) => {
            return error_response(
                401,
                "invalid_api_key",
                "unknown or closed gateway key: use the virtual key the harness gave this task, while the task is open",
            );
        }
        Err(e) => return error_response(500, "gateway_error", &e.to_string()),
    };
    let mut request = match serde_json::from_slice::<Value>(&body) {
        Ok(Value::Object(map)) => map,
        _ => {
            return error_response(
                400,
                "invalid_request_error",
                "the request body must be a JSON object (an OpenAI chat completion request)",
            );
        }
    };
    let stream = request.get("stream").and_then(Value::as_bool) == Some(true);
    rewrite_request(&mut request, &task, stream);
    // A call that tokens or dollars are counted against holds its worst case while in flight,
    // and that worst case is bounded: its output limit is at most the gateway's cap.
    let reservation = if task.budget.max_tokens.is_some() || task.budget.max_cost_usd.is_some() {
        let cap = shared
            .config
            .max_output_tokens
            .unwrap_or(DEFAULT_MAX_OUTPUT_TOKENS);
        let output = cap_output_tokens(&mut request, cap);
        Reservation::of(
            &Value::Object(request.clone()),
            output,
            &task.backbone.price,
        )
    } else {
        Reservation::default()
    };
    {
        let mut state = lock(&task.state);
        if let Err(exhausted) = task.budget.check(
            &state.usage,
            state.in_flight,
            &state.reserved,
            task.opened.elapsed(),
        ) {
            state.usage.budget_rejections += 1;
            drop(state);
            lock(&shared.metrics).record_budget_rejection(&task.backbone.name);
            return error_response(402, "budget_exceeded", &exhausted.message(&task.name));
        }
        state.in_flight += 1;
        state.reserved.add(&reservation);
    }
    let in_flight = InFlight::new(&shared, &task, reservation);
    let request = Value::Object(request);
    let hash = request_hash(&request);
    let call = CallRecord {
        ts_ms,
        started,
        request,
        request_hash: hash,
        response: Value::Null,
        stream,
        status: 0,
        attempts: 0,
        tokens: None,
        replay: false,
    };
    if shared.replay.is_some() {
        return replay_call(&shared, &task, call);
    }
    // The upstream call and its metering run in a task of their own: when the client hangs up
    // first, axum drops this handler, but the upstream (which a provider bills) still answers
    // and is charged.
    let forwarded = tokio::spawn(forward_and_meter(shared, task, call, in_flight, stream));
    match forwarded.await {
        Ok(reply) => reply,
        Err(e) => error_response(
            500,
            "gateway_error",
            &format!("the gateway's call task failed: {e}"),
        ),
    }
}

/// Forwards a call upstream, charges its answer to its task, and builds the client's reply.
async fn forward_and_meter(
    shared: AppState,
    task: Arc<Task>,
    call: CallRecord,
    in_flight: InFlight,
    stream: bool,
) -> Response {
    let body = Bytes::from(call.request.to_string());
    match task
        .upstream
        .forward(body, stream, &shared.config.retry)
        .await
    {
        Forwarded::Complete {
            status,
            content_type,
            body,
            attempts,
        } => {
            let response = serde_json::from_slice::<Value>(&body)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
            let tokens = TokenCounts::from_response(&response);
            finish_call(
                &shared,
                &task,
                CallRecord {
                    response,
                    status,
                    attempts,
                    tokens,
                    ..call
                },
            );
            drop(in_flight);
            let mut reply = Response::new(Body::from(body));
            *reply.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
            let content_type = content_type
                .and_then(|c| HeaderValue::from_str(&c).ok())
                .unwrap_or(HeaderValue::from_static("application/json"));
            reply
                .headers_mut()
                .insert(header::CONTENT_TYPE, content_type);
            reply
        }
        Forwarded::Failed {
            status,
            message,
            attempts,
        } => {
            let kind = if status == 504 {
                "upstream_timeout"
            } else {
                "upstream_unreachable"
            };
            let response = json!({"error": {"message": message, "type": kind, "code": kind}});
            finish_call(
                &shared,
                &task,
                CallRecord {
                    response: response.clone(),
                    status,
                    attempts,
                    ..call
                },
            );
            drop(in_flight);
            json_response(status, &response)
        }
        Forwarded::Stream {
            response,
            permit,
            attempts,
        } => {
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(64);
            let relay_shared = shared.clone();
            tokio::spawn(async move {
                let _permit = permit;
                let _in_flight = in_flight;
                let mut parser = SseParser::default();
                let mut chunks = response.bytes_stream();
                let mut client_gone = false;
                let mut pending_call = Some(call);
                // Charges the call once: when `[DONE]` arrives (before the agent sees it,
                // so usage is current when the agent is done) or when the stream ends.
                let mut finish = |parser: &SseParser, status: u16| {
                    if let Some(call) = pending_call.take() {
                        finish_call(
                            &relay_shared,
                            &task,
                            CallRecord {
                                response: Value::Array(parser.chunks.clone()),
                                status,
                                attempts,
                                tokens: parser.usage().and_then(TokenCounts::from_usage),
                                ..call
                            },
                        );
                    }
                };
                while let Some(item) = chunks.next().await {
                    match item {
                        Ok(bytes) => {
                            parser.feed(&bytes);
                            if parser.done {
                                finish(&parser, 200);
                            }
                            if !client_gone && tx.send(Ok(bytes)).await.is_err() {
                                client_gone = true;
                            }
                        }
                        Err(e) => {
                            parser.finish();
                            finish(&parser, if e.is_timeout() { 504 } else { 502 });
                            let _ = tx
                                .send(Err(std::io::Error::other("upstream stream broke off")))
                                .await;
                            break;
                        }
                    }
                }
                parser.finish();
                finish(&parser, 200);
            });
            let body = futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|item| (item, rx))
            });
            let mut reply = Response::new(Body::from_stream(body));
            reply.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            );
            reply
                .headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            reply
        }
    }
}

/// Answers from the recordings; never calls an upstream.
fn replay_call(shared: &Shared, task: &Task, call: CallRecord) -> Response {
    let recorded = shared
        .replay
        .as_ref()
        .and_then(|index| lock(index).take(&task.name, &call.request_hash));
    let Some(recorded) = recorded else {
        let source = shared
            .replay
            .as_ref()
            .map(|index| lock(index).source().display().to_string())
            .unwrap_or_default();
        let message = format!(
            "task {}: no recorded response for request hash {} in replay source {source} (the request differs from the recorded run, or was made more times than recorded)",
            task.name, call.request_hash
        );
        let response =
            json!({"error": {"message": message, "type": "replay_miss", "code": "replay_miss"}});
        finish_call(
            shared,
            task,
            CallRecord {
                response: response.clone(),
                status: 404,
                replay: true,
                ..call
            },
        );
        return json_response(404, &response);
    };
    let success = (200..300).contains(&recorded.status);
    let tokens = success.then_some(TokenCounts {
        prompt: recorded.usage.tokens_in,
        completion: recorded.usage.tokens_out,
        cached: recorded.usage.tokens_cached,
    });
    let chunks_recorded = recorded.stream && recorded.response.is_array();
    let (body, content_type, response) = if call.stream && success {
        let chunks = if chunks_recorded {
            recorded.response.as_array().cloned().unwrap_or_default()
        } else {
            completion_to_chunks(&recorded.response)
        };
        (
            encode_sse(&chunks),
            "text/event-stream",
            Value::Array(chunks),
        )
    } else {
        let whole = if chunks_recorded {
            chunks_to_completion(recorded.response.as_array().map_or(&[], |c| c))
        } else {
            recorded.response
        };
        let text = match &whole {
            Value::String(raw) => raw.clone(),
            other => other.to_string(),
        };
        (text, "application/json", whole)
    };
    let status = recorded.status;
    finish_call(
        shared,
        task,
        CallRecord {
            response,
            status,
            tokens,
            replay: true,
            ..call
        },
    );
    let mut reply = Response::new(Body::from(body));
    *reply.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    let headers = reply.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert("x-reprobench-replay", HeaderValue::from_static("1"));
    reply
}

#[derive(Deserialize)]
struct UsageQuery {
    #[serde(default)]
    per_task: bool,
}

/// Why `peer` may not read the gateway's usage and metrics (every task's names and figures):
/// clients on this machine may, others only with the stats key.
fn stats_refusal(shared: &Shared, peer: SocketAddr, headers: &HeaderMap) -> Option<Response> {
    if peer.ip().is_loopback() {
        return None;
    }
    let key = shared.config.stats_key.as_deref();
    match (key, bearer(headers)) {
        (Some(key), Some(given)) if same_secret(given.as_bytes(), key.as_bytes()) => None,
        (Some(_), _) => Some(error_response(
            401,
            "invalid_api_key",
            "/v1/usage and /metrics need the gateway's stats key from other machines: send `Authorization: Bearer <key>` with the value of the variable the gateway was started with (--stats-key-env)",
        )),
        (None, _) => Some(error_response(
            403,
            "forbidden",
            "/v1/usage and /metrics answer clients on the gateway's own machine only: read them there, or start the gateway with --stats-key-env VAR and send that key",
        )),
    }
}

async fn usage(
    State(shared): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Query(query): Query<UsageQuery>,
) -> Response {
    if let Some(refusal) = stats_refusal(&shared, peer, &headers) {
        return refusal;
    }
    let mut body = serde_json::to_value(shared.totals()).unwrap_or_else(|_| json!({}));
    if query.per_task {
        body["tasks"] = serde_json::to_value(shared.usage_by_task()).unwrap_or_else(|_| json!({}));
    }
    json_response(200, &body)
}

async fn models(State(shared): State<AppState>) -> Response {
    let data: Vec<Value> = shared
        .backbone_names()
        .into_iter()
        .map(|name| json!({"id": name, "object": "model", "created": 0, "owned_by": "reprobench-gateway"}))
        .collect();
    json_response(200, &json!({"object": "list", "data": data}))
}

async fn metrics(
    State(shared): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    if let Some(refusal) = stats_refusal(&shared, peer, &headers) {
        return refusal;
    }
    let text = lock(&shared.metrics).render();
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        text,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_only_backbone_gets_strings_with_a_note_for_each_image() {
        let mut messages = json!([
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [
                {"type": "text", "text": "the screen:"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "text", "text": "what next?"},
            ]},
        ]);
        assert_eq!(text_only_messages(&mut messages), 1);
        assert_eq!(messages[0]["content"], "be brief");
        assert_eq!(
            messages[1]["content"],
            format!("the screen:\n{IMAGE_OMITTED}\nwhat next?")
        );
        // Nothing left to change: a second pass omits nothing.
        assert_eq!(text_only_messages(&mut messages), 0);
    }
}
