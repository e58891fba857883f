//! Pure server-sent-events handling for streamed chat completions: splitting a byte
//! stream into `data:` events, and converting between chunk lists and whole completions.

use serde_json::{Map, Value, json};

/// Incremental parser of an SSE byte stream into the JSON of its `data:` events.
#[derive(Debug, Default)]
pub struct SseParser {
    pending: Vec<u8>,
    /// Parsed chunks, in order.
    pub chunks: Vec<Value>,
    /// True once `data: [DONE]` was seen.
    pub done: bool,
}

impl SseParser {
    /// Feeds bytes as they arrive; complete events are parsed into `chunks`.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
        while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            self.take_line(&line);
        }
    }

    /// Parses whatever is left once the stream ended without a final newline.
    pub fn finish(&mut self) {
        let rest = std::mem::take(&mut self.pending);
        self.take_line(&rest);
    }

    fn take_line(&mut self, line: &[u8]) {
        let Ok(line) = std::str::from_utf8(line) else {
            return;
        };
        let line = line.trim_end_matches(['\r', '\n']);
        let Some(data) = line.strip_prefix("data:") else {
            return;
        };
        let data = data.trim();
        if data == "[DONE]" {
            self.done = true;
        } else if let Ok(chunk) = serde_json::from_str::<Value>(data) {
            self.chunks.push(chunk);
        }
    }

    /// The `usage` object of the last chunk that carried one.
    pub fn usage(&self) -> Option<&Value> {
        self.chunks
            .iter()
            .rev()
            .filter_map(|c| c.get("usage"))
            .find(|u| u.is_object())
    }
}

/// Encodes chunks as an SSE body ending in `data: [DONE]`.
pub fn encode_sse(chunks: &[Value]) -> String {
    let mut out = String::new();
    for chunk in chunks {
        out.push_str("data: ");
        out.push_str(&chunk.to_string());
        out.push_str("\n\n");
    }
    out.push_str("data: [DONE]\n\n");
    out
}

/// Turns a whole chat completion into equivalent stream chunks (one delta per choice,
/// then a usage chunk with empty `choices`).
pub fn completion_to_chunks(completion: &Value) -> Vec<Value> {
    let mut base = Map::new();
    for field in ["id", "created", "model", "system_fingerprint"] {
        if let Some(v) = completion.get(field) {
            base.insert(field.into(), v.clone());
        }
    }
    base.insert("object".into(), json!("chat.completion.chunk"));
    let mut chunks = Vec::new();
    for (i, choice) in completion
        .get("choices")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let mut delta = choice.get("message").cloned().unwrap_or_else(|| json!({}));
        if let Some(calls) = delta.get_mut("tool_calls").and_then(Value::as_array_mut) {
            for (k, call) in calls.iter_mut().enumerate() {
                if let Some(call) = call.as_object_mut() {
                    call.entry("index").or_insert(json!(k));
                }
            }
        }
        let mut chunk = base.clone();
        chunk.insert(
            "choices".into(),
            json!([{
                "index": choice.get("index").cloned().unwrap_or(json!(i)),
                "delta": delta,
                "finish_reason": choice.get("finish_reason").cloned().unwrap_or(Value::Null),
            }]),
        );
        chunks.push(Value::Object(chunk));
    }
    if let Some(usage) = completion.get("usage").filter(|u| u.is_object()) {
        let mut chunk = base;
        chunk.insert("choices".into(), json!([]));
        chunk.insert("usage".into(), usage.clone());
        chunks.push(Value::Object(chunk));
    }
    chunks
}

/// Assembles stream chunks into the whole chat completion they stand for (content and
/// tool-call arguments concatenated per choice and index).
pub fn chunks_to_completion(chunks: &[Value]) -> Value {
    let mut out = Map::new();
    let mut choices: Vec<(u64, Map<String, Value>, Value)> = Vec::new();
    for chunk in chunks {
        for field in ["id", "created", "model", "system_fingerprint"] {
            if let Some(v) = chunk.get(field) {
                out.entry(field).or_insert_with(|| v.clone());
            }
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            out.insert("usage".into(), usage.clone());
        }
        for choice in chunk
            .get("choices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let index = choice.get("index").and_then(Value::as_u64).unwrap_or(0);
            let pos = match choices.iter().position(|(i, _, _)| *i == index) {
                Some(pos) => pos,
                None => {
                    choices.push((index, Map::new(), Value::Null));
                    choices.len() - 1
                }
            };
            let (_, message, finish) = &mut choices[pos];
            if let Some(reason) = choice.get("finish_reason").filter(|r| !r.is_null()) {
                *finish = reason.clone();
            }
            let Some(delta) = choice.get("delta").and_then(Value::as_object) else {
                continue;
            };
            for (key, value) in delta {
                match key.as_str() {
                    "content" | "reasoning_content" => append_text(message, key, value),
                    "tool_calls" => merge_tool_calls(message, value),
                    _ => {
                        if !value.is_null() {
                            message.insert(key.clone(), value.clone());
                        }
                    }
                }
            }
        }
    }
    out.insert("object".into(), json!("chat.completion"));
    let choices: Vec<Value> = choices
        .into_iter()
        .map(|(index, mut message, finish)| {
            message.entry("role").or_insert(json!("assistant"));
            message.entry("content").or_insert(Value::Null);
            json!({"index": index, "message": message, "finish_reason": finish})
        })
        .collect();
    out.insert("choices".into(), Value::Array(choices));
    Value::Object(out)
}

fn append_text(message: &mut Map<String, Value>, key: &str, piece: &Value) {
    let Some(piece) = piece.as_str() else {
        return;
    };
    match message.get_mut(key) {
        Some(Value::String(text)) => text.push_str(piece),
        _ => {
            message.insert(key.into(), json!(piece));
        }
    }
}

fn merge_tool_calls(message: &mut Map<String, Value>, deltas: &Value) {
    let calls = message
        .entry("tool_calls")
        .or_insert_with(|| json!([]))
        .as_array_mut()
        .expect("tool_calls is created as an array");
    for delta in deltas.as_array().into_iter().flatten() {
        let index = delta.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
        while calls.len() <= index {
            calls.push(json!({"function": {"name": "", "arguments": ""}}));
        }
        let call = calls[index]
            .as_object_mut()
            .expect("tool calls are objects");
        for field in ["id", "type"] {
            if let Some(v) = delta.get(field).filter(|v| !v.is_null()) {
                call.insert(field.into(), v.clone());
            }
        }
        if let Some(function) = delta.get("function") {
            let target = call
                .get_mut("function")
                .and_then(Value::as_object_mut)
                .expect("function is created as an object");
            for field in ["name", "arguments"] {
                if let Some(piece) = function.get(field).and_then(Value::as_str) {
                    match target.get_mut(field) {
                        Some(Value::String(text)) => text.push_str(piece),
                        _ => {
                            target.insert(field.into(), json!(piece));
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parser_handles_events_split_across_reads() {
        let body =
            "data: {\"a\":1}\n\ndata: {\"usage\":{\"prompt_tokens\":3}}\r\n\r\ndata: [DONE]\n\n";
        let mut parser = SseParser::default();
        for piece in body.as_bytes().chunks(5) {
            parser.feed(piece);
        }
        parser.finish();
        assert_eq!(parser.chunks.len(), 2);
        assert!(parser.done);
        assert_eq!(parser.usage().unwrap()["prompt_tokens"], 3);
    }

    #[test]
    fn completion_round_trips_through_chunks() {
        let completion = json!({
            "id": "c1", "created": 5, "model": "m", "object": "chat.completion",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": "hi",
                "tool_calls": [{"id": "t1", "type": "function",
                    "function": {"name": "run", "arguments": "{\"x\":1}"}}]
            }}],
            "usage": {"prompt_tokens": 4, "completion_tokens": 2}
        });
        let chunks = completion_to_chunks(&completion);
        assert_eq!(chunks.len(), 2);
        let mut back = chunks_to_completion(&chunks);
        back["choices"][0]["message"]["tool_calls"][0]
            .as_object_mut()
            .unwrap()
            .remove("index");
        assert_eq!(back, completion);
    }

    #[test]
    fn deltas_concatenate() {
        let chunks = vec![
            json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "He"}}]}),
            json!({"choices": [{"index": 0, "delta": {"content": "llo"}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "a", "type": "function", "function": {"name": "f", "arguments": "{"}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}, "finish_reason": "stop"}]}),
        ];
        let done = chunks_to_completion(&chunks);
        let message = &done["choices"][0]["message"];
        assert_eq!(message["content"], "Hello");
        assert_eq!(message["tool_calls"][0]["function"]["arguments"], "{}");
        assert_eq!(done["choices"][0]["finish_reason"], "stop");
    }
}
