//! The seam every agent calls an LLM through: the [`Llm`] trait, its turn and error types, and
//! [`GatewayLlm`], the client that sends chat completions to the node's gateway with the task's
//! virtual key, so every call an agent makes is metered, budgeted and transcribed there.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::future::Future;
use std::time::Duration;
/// One tool call requested by the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id, echoed in the tool message that answers it.
    pub id: String,
    /// Function name.
    pub name: String,
    /// Arguments as the model wrote them (a JSON object, possibly malformed).
    pub arguments: String,
}

/// One assistant turn of a chat completion.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AssistantTurn {
    /// Text content, if any.
    pub content: Option<String>,
    /// Tool calls, if any.
    pub tool_calls: Vec<ToolCall>,
}

/// How an agent's `stopped_by` begins when the model refused a prompt as longer than its
/// context window; the task then ends as an agent failure of class [`CONTEXT_LENGTH_CLASS`].
pub const CONTEXT_LENGTH_STOP: &str = "context_length";

/// The error class of a task whose agent stopped on a context-length refusal.
pub const CONTEXT_LENGTH_CLASS: &str = "agent:context_length";

/// Why a chat completion gave no turn.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LlmError {
    /// The task's budget (calls, tokens, cost or time) is used up: the agent must stop and
    /// return what it has.
    #[error("budget exhausted: {0}")]
    Budget(String),
    /// The call failed after the gateway's retries.
    #[error("LLM call failed: {0}")]
    Failed(String),
    /// The model refused the prompt as longer than its context window: the agent's own
    /// doing, final (the same prompt fails again on a retry).
    #[error("the prompt exceeds the model's context window: {0}")]
    ContextLength(String),
}

/// A chat-completions client (OpenAI message and tool formats).
pub trait Llm: Send {
    /// Sends `messages` (OpenAI chat messages) with `tools` (OpenAI function specs, may be
    /// empty) and returns the assistant's turn.
    fn chat(
        &mut self,
        messages: &[Value],
        tools: &[Value],
    ) -> impl Future<Output = Result<AssistantTurn, LlmError>> + Send;
}

/// A chat-completions client bound to one task's virtual key.
#[derive(Clone)]
pub struct GatewayLlm {
    http: reqwest::Client,
    url: String,
    key: String,
    extra: serde_json::Map<String, Value>,
}

impl GatewayLlm {
    /// A client for `base_url` (e.g. `http://127.0.0.1:PORT/v1`) using `key`.
    pub fn new(base_url: &str, key: &str) -> GatewayLlm {
        GatewayLlm {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(3600))
                .build()
                .expect("an HTTP client builds"),
            url: format!("{}/chat/completions", base_url.trim_end_matches('/')),
            key: key.to_string(),
            extra: serde_json::Map::new(),
        }
    }

    /// The same client with request fields added to every call (e.g. `temperature`, `n`).
    pub fn with_params(mut self, params: serde_json::Map<String, Value>) -> GatewayLlm {
        self.extra = params;
        self
    }
}

/// Reads the assistant turn out of a chat-completion response body.
pub fn parse_turn(body: &Value) -> Result<AssistantTurn, LlmError> {
    let message = body
        .pointer("/choices/0/message")
        .ok_or_else(|| LlmError::Failed(format!("response has no choices[0].message: {body}")))?;
    let content = message
        .get("content")
        .and_then(Value::as_str)
        .map(str::to_string);
    let tool_calls = message
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(|calls| {
            calls
                .iter()
                .enumerate()
                .map(|(i, c)| ToolCall {
                    id: c
                        .get("id")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                        .unwrap_or_else(|| format!("call_{i}")),
                    name: c
                        .pointer("/function/name")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string(),
                    arguments: c
                        .pointer("/function/arguments")
                        .and_then(Value::as_str)
                        .unwrap_or("{}")
                        .to_string(),
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(AssistantTurn {
        content,
        tool_calls,
    })
}

/// True when a 400 answer says the prompt is longer than the model's context window: OpenAI's
/// and llama.cpp's `code: "context_length_exceeded"`, or a message that says so (vLLM,
/// Ollama and others word it "maximum context length" or "context window").
fn is_context_length_error(status: u16, body: &Value, message: &str) -> bool {
    if status != 400 {
        return false;
    }
    if body.pointer("/error/code").and_then(Value::as_str) == Some("context_length_exceeded") {
        return true;
    }
    let message = message.to_ascii_lowercase();
    message.contains("context length") || message.contains("context window")
}

/// Classifies a non-success answer of the gateway.
pub fn error_of(status: u16, body: &Value) -> LlmError {
    let message = body
        .pointer("/error/message")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| body.to_string());
    let kind = body.pointer("/error/type").and_then(Value::as_str);
    if status == 402 || kind == Some("budget_exceeded") {
        LlmError::Budget(message)
    } else if is_context_length_error(status, body, &message) {
        LlmError::ContextLength(message)
    } else {
        LlmError::Failed(format!("HTTP {status}: {message}"))
    }
}

/// The chat-completions request body an agent's call sends: `messages`, `tools` when there are
/// any, and the client's `extra` fields (the gateway sets the backbone's model).
pub fn request_body(
    messages: &[Value],
    tools: &[Value],
    extra: &serde_json::Map<String, Value>,
) -> Value {
    let mut body = json!({ "model": "default", "messages": messages });
    if !tools.is_empty() {
        body["tools"] = Value::Array(tools.to_vec());
    }
    for (k, v) in extra {
        body[k] = v.clone();
    }
    body
}

impl Llm for GatewayLlm {
    async fn chat(
        &mut self,
        messages: &[Value],
        tools: &[Value],
    ) -> Result<AssistantTurn, LlmError> {
        let body = request_body(messages, tools, &self.extra);
        let resp = self
            .http
            .post(&self.url)
            .bearer_auth(&self.key)
            .json(&body)
            .send()
            .await
            .map_err(|e| LlmError::Failed(format!("gateway unreachable: {e}")))?;
        let status = resp.status().as_u16();
        let text = resp
            .text()
            .await
            .map_err(|e| LlmError::Failed(format!("reading the gateway's answer: {e}")))?;
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if status / 100 != 2 {
            return Err(error_of(status, &value));
        }
        parse_turn(&value)
    }
}

/// The gateway budget of a task.
pub fn task_budget(b: &reprobench_domain::sweep::Budget) -> crate::TaskBudget {
    crate::TaskBudget {
        max_calls: b.max_llm_calls,
        max_tokens: b.max_tokens,
        max_cost_usd: (b.max_cost_usd > 0.0).then_some(b.max_cost_usd),
        max_duration: (b.max_minutes > 0.0).then(|| Duration::from_secs_f64(b.max_minutes * 60.0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_and_errors_are_read() {
        let body = json!({"choices":[{"message":{"content":null,"tool_calls":[
            {"id":"c1","type":"function","function":{"name":"grep","arguments":"{\"pattern\":\"x\"}"}}]}}]});
        let t = parse_turn(&body).unwrap();
        assert_eq!(t.content, None);
        assert_eq!(t.tool_calls[0].name, "grep");
        assert_eq!(t.tool_calls[0].id, "c1");
        assert!(parse_turn(&json!({})).is_err());
        let budget = json!({"error":{"type":"budget_exceeded","message":"calls exhausted"}});
        assert_eq!(
            error_of(402, &budget),
            LlmError::Budget("calls exhausted".into())
        );
        assert!(matches!(
            error_of(500, &json!({"error":{"message":"boom"}})),
            LlmError::Failed(m) if m.contains("500") && m.contains("boom")
        ));
        // llama.cpp's server, word for word.
        let llama = json!({"error":{"message":"This model's maximum context length is 2048 tokens. However, you requested 3041 tokens (3031 in the messages, 10 in the completion). Please reduce the length of the messages or completion.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}});
        assert!(matches!(error_of(400, &llama), LlmError::ContextLength(m) if m.contains("2048")));
        let worded =
            json!({"error":{"message":"prompt is longer than the model's context window"}});
        assert!(matches!(error_of(400, &worded), LlmError::ContextLength(_)));
        // The same words with another status are not a context-length error.
        assert!(matches!(error_of(500, &llama), LlmError::Failed(_)));
        assert!(matches!(
            error_of(400, &json!({"error":{"message":"bad tools"}})),
            LlmError::Failed(_)
        ));
    }
}
