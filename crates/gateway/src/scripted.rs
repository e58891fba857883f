//! A scripted OpenAI-compatible upstream for tests and benchmarks.
//!
//! It is NOT a language model: every answer is chosen by a Rust closure or a list of
//! rules, and each response says so (`system_fingerprint: "reprobench-scripted"` and a
//! `reprobench_note` field). It records the requests it receives and the highest number
//! it answered at once.

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use axum::routing::post;
use serde::Deserialize;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::lock;

/// What the scripted upstream answers to one request.
#[derive(Debug, Clone, PartialEq)]
pub enum ScriptedReply {
    /// A successful chat completion.
    Message {
        /// Assistant text.
        content: Option<String>,
        /// Tool calls the "assistant" makes.
        tool_calls: Vec<ScriptedToolCall>,
        /// Reported `prompt_tokens`.
        prompt_tokens: u64,
        /// Reported `completion_tokens`.
        completion_tokens: u64,
        /// Reported `prompt_tokens_details.cached_tokens`.
        cached_tokens: u64,
    },
    /// An HTTP error status with a raw body and an optional `Retry-After` (seconds).
    Status {
        /// HTTP status.
        code: u16,
        /// `Retry-After` seconds.
        retry_after_s: Option<u64>,
        /// Response body, sent as is.
        body: String,
    },
    /// Waits, then answers with `then`.
    Slow {
        /// How long to wait before answering.
        delay: Duration,
        /// The answer after the wait.
        then: Box<ScriptedReply>,
    },
}

/// One tool call in a scripted reply.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedToolCall {
    /// Function name.
    pub name: String,
    /// Arguments as a JSON string.
    pub arguments: String,
}

impl ScriptedReply {
    /// A text answer reporting 10 prompt tokens, 5 completion tokens, none cached.
    pub fn text(content: &str) -> Self {
        ScriptedReply::Message {
            content: Some(content.to_string()),
            tool_calls: Vec::new(),
            prompt_tokens: 10,
            completion_tokens: 5,
            cached_tokens: 0,
        }
    }
}

/// The serde form of a [`ScriptedReply`], e.g. `{"message": {"content": "hi"}}`,
/// `{"status": {"code": 429, "retry_after_s": 1}}`, `{"slow": {"delay_ms": 50, "then": …}}`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ScriptedReplySpec {
    /// See [`ScriptedReply::Message`]; token counts default to 10/5/0.
    Message {
        /// Assistant text.
        #[serde(default)]
        content: Option<String>,
        /// Tool calls.
        #[serde(default)]
        tool_calls: Vec<ScriptedToolCall>,
        /// Reported prompt tokens.
        #[serde(default = "ten")]
        prompt_tokens: u64,
        /// Reported completion tokens.
        #[serde(default = "five")]
        completion_tokens: u64,
        /// Reported cached tokens.
        #[serde(default)]
        cached_tokens: u64,
    },
    /// See [`ScriptedReply::Status`].
    Status {
        /// HTTP status.
        code: u16,
        /// `Retry-After` seconds.
        #[serde(default)]
        retry_after_s: Option<u64>,
        /// Response body.
        #[serde(default)]
        body: String,
    },
    /// See [`ScriptedReply::Slow`].
    Slow {
        /// Milliseconds to wait.
        delay_ms: u64,
        /// The answer after the wait.
        then: Box<ScriptedReplySpec>,
    },
}

fn ten() -> u64 {
    10
}

fn five() -> u64 {
    5
}

impl From<ScriptedReplySpec> for ScriptedReply {
    fn from(spec: ScriptedReplySpec) -> Self {
        match spec {
            ScriptedReplySpec::Message {
                content,
                tool_calls,
                prompt_tokens,
                completion_tokens,
                cached_tokens,
            } => ScriptedReply::Message {
                content,
                tool_calls,
                prompt_tokens,
                completion_tokens,
                cached_tokens,
            },
            ScriptedReplySpec::Status {
                code,
                retry_after_s,
                body,
            } => ScriptedReply::Status {
                code,
                retry_after_s,
                body,
            },
            ScriptedReplySpec::Slow { delay_ms, then } => ScriptedReply::Slow {
                delay: Duration::from_millis(delay_ms),
                then: Box::new((*then).into()),
            },
        }
    }
}

/// A rule: the first whose `contains` occurs in the JSON of the request's messages answers.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedRule {
    /// Text to look for in the serialized `messages`; `""` matches every request.
    pub contains: String,
    /// The answer.
    pub reply: ScriptedReplySpec,
}

/// A request as the scripted upstream received it.
#[derive(Debug, Clone, PartialEq)]
pub struct ScriptedRequest {
    /// The JSON body.
    pub body: Value,
    /// The `Authorization` header, if any.
    pub authorization: Option<String>,
    /// 0-based arrival order.
    pub index: u64,
}

type Responder = dyn Fn(&ScriptedRequest) -> ScriptedReply + Send + Sync;

/// How a scripted upstream names itself in every answer (`system_fingerprint` and
/// `reprobench_note`), so that no answer passes for a model's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpstreamIdentity {
    /// The answers' `system_fingerprint`.
    pub fingerprint: &'static str,
    /// The answers' `reprobench_note`.
    pub note: &'static str,
}

/// The identity of test servers: scripted answers.
pub const SCRIPTED: UpstreamIdentity = UpstreamIdentity {
    fingerprint: "reprobench-scripted",
    note: "scripted test upstream, not a language model",
};

struct ScriptedState {
    identity: UpstreamIdentity,
    responder: Box<Responder>,
    /// Every request received, kept for tests to read; `None` for a long-lived server that
    /// only counts them.
    requests: Option<Mutex<Vec<ScriptedRequest>>>,
    next_index: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
}

/// What a scripted upstream keeps of the requests it answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// Every request, for tests to read back.
    Requests,
    /// Only their number (a long-lived server).
    Count,
}

/// A running scripted upstream on 127.0.0.1; stops when dropped.
pub struct ScriptedUpstream {
    addr: SocketAddr,
    state: Arc<ScriptedState>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for ScriptedUpstream {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl ScriptedUpstream {
    /// Starts on a free loopback port, answering each request with `responder`.
    pub async fn start(
        responder: impl Fn(&ScriptedRequest) -> ScriptedReply + Send + Sync + 'static,
    ) -> ScriptedUpstream {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding a loopback port for the scripted upstream");
        ScriptedUpstream::serve(listener, SCRIPTED, Keep::Requests, responder)
    }

    /// Serves on `listener`, every answer naming itself as `identity`, keeping the requests it
    /// receives or only counting them (`keep`).
    pub fn serve(
        listener: tokio::net::TcpListener,
        identity: UpstreamIdentity,
        keep: Keep,
        responder: impl Fn(&ScriptedRequest) -> ScriptedReply + Send + Sync + 'static,
    ) -> ScriptedUpstream {
        let state = Arc::new(ScriptedState {
            identity,
            responder: Box::new(responder),
            requests: (keep == Keep::Requests).then(|| Mutex::new(Vec::new())),
            next_index: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            max_in_flight: AtomicU64::new(0),
        });
        let addr = listener
            .local_addr()
            .expect("the scripted upstream's listener has an address");
        let app = Router::new()
            .route("/v1/chat/completions", post(answer))
            .with_state(state.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        ScriptedUpstream {
            addr,
            state,
            server,
        }
    }

    /// Starts with rules: the first rule whose `contains` occurs in the JSON of the
    /// request's messages answers; a request no rule matches gets a 400.
    pub async fn from_rules(rules: Vec<ScriptedRule>) -> ScriptedUpstream {
        let rules: Vec<(String, ScriptedReply)> = rules
            .into_iter()
            .map(|r| (r.contains, r.reply.into()))
            .collect();
        ScriptedUpstream::start(move |request| {
            let messages = request
                .body
                .get("messages")
                .map(Value::to_string)
                .unwrap_or_default();
            rules
                .iter()
                .find(|(contains, _)| messages.contains(contains.as_str()))
                .map(|(_, reply)| reply.clone())
                .unwrap_or_else(|| ScriptedReply::Status {
                    code: 400,
                    retry_after_s: None,
                    body: json!({"error": {"message": "no scripted rule matches this request",
                        "type": "invalid_request_error", "code": "no_rule"}})
                    .to_string(),
                })
        })
        .await
    }

    /// The OpenAI base URL, `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The requests received so far, in arrival order (none when it only counts them).
    pub fn requests(&self) -> Vec<ScriptedRequest> {
        self.state
            .requests
            .as_ref()
            .map(|r| lock(r).clone())
            .unwrap_or_default()
    }

    /// How many requests it has received.
    pub fn request_count(&self) -> u64 {
        self.state.next_index.load(Ordering::SeqCst)
    }

    /// The most requests being answered at once so far.
    pub fn max_in_flight(&self) -> u64 {
        self.state.max_in_flight.load(Ordering::SeqCst)
    }
}

struct InFlightCount(Arc<ScriptedState>);

impl Drop for InFlightCount {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn answer(
    State(state): State<Arc<ScriptedState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    state.max_in_flight.fetch_max(now, Ordering::SeqCst);
    let _count = InFlightCount(state.clone());
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let request = ScriptedRequest {
        body,
        authorization: headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
        index: state.next_index.fetch_add(1, Ordering::SeqCst),
    };
    if let Some(requests) = &state.requests {
        lock(requests).push(request.clone());
    }
    let mut reply = (state.responder)(&request);
    while let ScriptedReply::Slow { delay, then } = reply {
        tokio::time::sleep(delay).await;
        reply = *then;
    }
    match reply {
        ScriptedReply::Status {
            code,
            retry_after_s,
            body,
        } => {
            let mut response = Response::new(Body::from(body));
            *response.status_mut() =
                StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let headers = response.headers_mut();
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            if let Some(secs) = retry_after_s {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
            }
            response
        }
        ScriptedReply::Message {
            content,
            tool_calls,
            prompt_tokens,
            completion_tokens,
            cached_tokens,
        } => {
            let model = request.body.get("model").cloned().unwrap_or(json!("none"));
            let id = format!("chatcmpl-scripted-{}", request.index);
            let usage = json!({
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "prompt_tokens_details": {"cached_tokens": cached_tokens},
            });
            let calls: Vec<Value> = tool_calls
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    json!({"id": format!("call_{}_{i}", request.index), "type": "function",
                           "function": {"name": c.name, "arguments": c.arguments}})
                })
                .collect();
            let finish = if calls.is_empty() {
                "stop"
            } else {
                "tool_calls"
            };
            let stream = request.body.get("stream").and_then(Value::as_bool) == Some(true);
            if stream {
                let include_usage = request
                    .body
                    .pointer("/stream_options/include_usage")
                    .and_then(Value::as_bool)
                    == Some(true);
                stream_reply(
                    state.identity,
                    &id,
                    &model,
                    content,
                    &calls,
                    finish,
                    include_usage.then_some(usage),
                )
            } else {
                let mut message = json!({"role": "assistant", "content": content});
                if !calls.is_empty() {
                    message["tool_calls"] = Value::Array(calls);
                }
                let body = json!({
                    "id": id, "object": "chat.completion", "created": 0, "model": model,
                    "system_fingerprint": state.identity.fingerprint,
                    "reprobench_note": state.identity.note,
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    "usage": usage,
                });
                let mut response = Response::new(Body::from(body.to_string()));
                response.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                response
            }
        }
        ScriptedReply::Slow { .. } => unreachable!("slow replies are unwrapped above"),
    }
}

/// An SSE response: role, content in two pieces, tool calls, finish, optional usage, DONE.
fn stream_reply(
    identity: UpstreamIdentity,
    id: &str,
    model: &Value,
    content: Option<String>,
    calls: &[Value],
    finish: &str,
    usage: Option<Value>,
) -> Response {
    let chunk = |choices: Value, usage: Value| {
        json!({"id": id, "object": "chat.completion.chunk", "created": 0, "model": model,
               "system_fingerprint": identity.fingerprint, "choices": choices, "usage": usage})
    };
    let delta = |delta: Value, finish: Value| json!([{"index": 0, "delta": delta, "finish_reason": finish}]);
    let mut chunks = vec![chunk(
        delta(json!({"role": "assistant", "content": ""}), Value::Null),
        Value::Null,
    )];
    if let Some(text) = content {
        let cut = text
            .char_indices()
            .nth(text.chars().count() / 2)
            .map_or(0, |(i, _)| i);
        for piece in [&text[..cut], &text[cut..]] {
            chunks.push(chunk(
                delta(json!({"content": piece}), Value::Null),
                Value::Null,
            ));
        }
    }
    for (i, call) in calls.iter().enumerate() {
        let mut call = call.clone();
        call["index"] = json!(i);
        chunks.push(chunk(
            delta(json!({"tool_calls": [call]}), Value::Null),
            Value::Null,
        ));
    }
    chunks.push(chunk(delta(json!({}), json!(finish)), Value::Null));
    if let Some(usage) = usage {
        chunks.push(chunk(json!([]), usage));
    }
    let mut events: Vec<Result<Bytes, std::io::Error>> = chunks
        .iter()
        .map(|c| Ok(Bytes::from(format!("data: {c}\n\n"))))
        .collect();
    events.push(Ok(Bytes::from_static(b"data: [DONE]\n\n")));
    let mut response = Response::new(Body::from_stream(futures_util::stream::iter(events)));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_from_json() {
        let rules: Vec<ScriptedRule> = serde_json::from_value(json!([
            {"contains": "bug", "reply": {"message": {"content": "found it", "tool_calls": [
                {"name": "run", "arguments": "{}"}]}}},
            {"contains": "", "reply": {"slow": {"delay_ms": 5, "then": {"status": {"code": 429, "retry_after_s": 1}}}}}
        ]))
        .unwrap();
        let first: ScriptedReply = rules[0].reply.clone().into();
        assert!(
            matches!(first, ScriptedReply::Message { prompt_tokens: 10, completion_tokens: 5, ref tool_calls, .. } if tool_calls.len() == 1)
        );
        let second: ScriptedReply = rules[1].reply.clone().into();
        assert_eq!(
            second,
            ScriptedReply::Slow {
                delay: Duration::from_millis(5),
                then: Box::new(ScriptedReply::Status {
                    code: 429,
                    retry_after_s: Some(1),
                    body: String::new()
                })
            }
        );
    }
}
