//! Transcripts: one JSONL line per call, per task, with secrets scrubbed before writing.

use super::accounting::Usage;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// One call as recorded in a transcript.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TranscriptLine {
    /// Milliseconds since the Unix epoch when the call was received.
    pub ts_ms: u64,
    /// Task name.
    pub task: String,
    /// Backbone name.
    pub backbone: String,
    /// Model sent upstream.
    pub model: String,
    /// Hash of the forwarded request without `stream`/`stream_options` (see `replay::request_hash`).
    pub request_hash: String,
    /// The request body as forwarded upstream.
    pub request: Value,
    /// The response body; for streams, the list of parsed chunks.
    pub response: Value,
    /// True when the request asked for a stream (and `response` is a chunk list).
    #[serde(default)]
    pub stream: bool,
    /// HTTP status returned to the agent.
    pub status: u16,
    /// Milliseconds from receipt to the last byte.
    pub latency_ms: u64,
    /// Upstream attempts made (0 for replayed calls).
    pub attempts: u32,
    /// What this call used.
    pub usage: Usage,
    /// True when the response came from a recording.
    pub replay: bool,
}

/// An append-only JSONL transcript file shared by a task's concurrent calls.
#[derive(Debug)]
pub struct TranscriptWriter {
    path: PathBuf,
    file: Mutex<File>,
    secrets: Vec<String>,
}

impl TranscriptWriter {
    /// Opens (creating directories and the file) `path` for appending; `secrets` are
    /// replaced by `[redacted]` wherever they appear in a written line.
    pub fn open(path: &Path, secrets: Vec<String>) -> io::Result<TranscriptWriter> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(TranscriptWriter {
            path: path.to_path_buf(),
            file: Mutex::new(file),
            secrets,
        })
    }

    /// The file written to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one line.
    pub fn write(&self, line: &TranscriptLine) -> io::Result<()> {
        let mut value = serde_json::to_value(line).map_err(io::Error::other)?;
        scrub_value(&mut value, &self.secrets);
        let mut text = value.to_string();
        text.push('\n');
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        file.write_all(text.as_bytes())
    }
}

/// Replaces every occurrence of each non-empty secret in `text` by `[redacted]`.
pub fn scrub_text(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_string();
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        if out.contains(secret.as_str()) {
            out = out.replace(secret.as_str(), "[redacted]");
        }
    }
    out
}

/// Scrubs secrets from every string and object key inside a JSON value.
pub fn scrub_value(value: &mut Value, secrets: &[String]) {
    if secrets.iter().all(|s| s.is_empty()) {
        return;
    }
    match value {
        Value::String(s) => *s = scrub_text(s, secrets),
        Value::Array(items) => items.iter_mut().for_each(|v| scrub_value(v, secrets)),
        Value::Object(map) => {
            let entries = std::mem::take(map);
            for (key, mut v) in entries {
                scrub_value(&mut v, secrets);
                map.insert(scrub_text(&key, secrets), v);
            }
        }
        _ => {}
    }
}

/// A task name made safe as a file name: characters other than ASCII letters, digits,
/// `.`, `-` and `_` become `_`; leading dots are dropped.
pub fn sanitize_task_name(task: &str) -> String {
    let cleaned: String = task
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let cleaned = cleaned.trim_start_matches('.');
    if cleaned.is_empty() {
        "task".into()
    } else {
        cleaned.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn task_names_become_safe_file_names() {
        assert_eq!(
            sanitize_task_name("django__django-1234/full@gpt"),
            "django__django-1234_full_gpt"
        );
        assert_eq!(sanitize_task_name("../x"), "_x");
        assert_eq!(sanitize_task_name(""), "task");
    }

    #[test]
    fn secrets_are_scrubbed_from_strings_and_keys() {
        let secrets = vec!["sk-secret".to_string()];
        let mut v = json!({"a": ["Bearer sk-secret"], "sk-secret": 1, "n": 2});
        scrub_value(&mut v, &secrets);
        assert_eq!(
            v,
            json!({"a": ["Bearer [redacted]"], "[redacted]": 1, "n": 2})
        );
    }
}
