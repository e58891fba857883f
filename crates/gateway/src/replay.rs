//! Replay: recorded transcript lines indexed by request hash; the k-th identical request
//! gets the k-th recording. When a task's request has no recording with its hash (a tool or
//! test output in it differs, e.g. a timing), the task's next unused recording in recording
//! order answers it, so a re-run of the same agent gets the same sequence of answers.

use super::transcript::TranscriptLine;
use reprobench_domain::swt::Fnv;
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Hash of a request for replay: FNV-1a over its canonical JSON (object keys sorted)
/// with `stream` and `stream_options` removed, as 16 hex digits.
pub fn request_hash(request: &Value) -> String {
    let mut request = request.clone();
    if let Some(map) = request.as_object_mut() {
        map.remove("stream");
        map.remove("stream_options");
    }
    let mut canonical = String::new();
    write_canonical(&request, &mut canonical);
    let mut h = Fnv::default();
    h.add("chat-v1");
    h.add(&canonical);
    format!("{:016x}", h.0)
}

/// Writes JSON with object keys sorted, whatever map ordering serde_json was built with.
fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// Why a replay source could not be loaded.
#[derive(Debug)]
pub struct ReplayLoadError {
    /// The file at fault.
    pub path: PathBuf,
    /// What is wrong with it.
    pub message: String,
}

struct Recording {
    line: TranscriptLine,
    used: bool,
    seq: usize,
}

/// Recorded calls by request hash, consumed in recording order.
pub struct ReplayIndex {
    source: PathBuf,
    by_hash: HashMap<String, Vec<Recording>>,
}

impl ReplayIndex {
    /// Loads a transcript file, or every `*.jsonl` file under a directory (recursively, sorted
    /// by path: a run's artifact directory holds one `transcript.jsonl` per task).
    pub fn load(source: &Path) -> Result<ReplayIndex, ReplayLoadError> {
        let fail = |path: &Path, message: String| ReplayLoadError {
            path: path.to_path_buf(),
            message,
        };
        let is_dir = source.is_dir();
        let files = if is_dir {
            let mut files = Vec::new();
            let mut dirs = vec![source.to_path_buf()];
            while let Some(dir) = dirs.pop() {
                let entries = std::fs::read_dir(&dir).map_err(|e| fail(&dir, e.to_string()))?;
                for path in entries.filter_map(|e| e.ok().map(|e| e.path())) {
                    if path.is_dir() && !path.is_symlink() {
                        dirs.push(path);
                    } else if path.extension().is_some_and(|x| x == "jsonl") {
                        files.push(path);
                    }
                }
            }
            files.sort();
            files
        } else {
            vec![source.to_path_buf()]
        };
        let mut lines = Vec::new();
        for file in &files {
            let text = std::fs::read_to_string(file).map_err(|e| fail(file, e.to_string()))?;
            let mut raws = text
                .lines()
                .enumerate()
                .filter(|(_, raw)| !raw.trim().is_empty())
                .peekable();
            // In a directory, other JSON-lines files (results, predictions) are not
            // transcripts: a file whose first line is not a transcript line is passed over.
            if is_dir
                && raws
                    .peek()
                    .is_some_and(|(_, raw)| serde_json::from_str::<TranscriptLine>(raw).is_err())
            {
                continue;
            }
            for (n, raw) in raws {
                let line: TranscriptLine = serde_json::from_str(raw).map_err(|e| {
                    fail(
                        file,
                        format!("line {} is not a transcript line: {e}", n + 1),
                    )
                })?;
                lines.push(line);
            }
        }
        if lines.is_empty() {
            return Err(fail(
                source,
                format!(
                    "no recorded LLM calls in {} of them ({} .jsonl files looked at)",
                    if is_dir { "any" } else { "it" },
                    files.len()
                ),
            ));
        }
        Ok(ReplayIndex::from_lines(source, lines))
    }

    /// Indexes lines already in memory; `source` names them in error messages.
    pub fn from_lines(source: &Path, lines: Vec<TranscriptLine>) -> ReplayIndex {
        let mut by_hash: HashMap<String, Vec<Recording>> = HashMap::new();
        for (seq, line) in lines.into_iter().enumerate() {
            by_hash
                .entry(line.request_hash.clone())
                .or_default()
                .push(Recording {
                    line,
                    used: false,
                    seq,
                });
        }
        ReplayIndex {
            source: source.to_path_buf(),
            by_hash,
        }
    }

    /// Where the recordings came from.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// Number of recorded calls.
    pub fn len(&self) -> usize {
        self.by_hash.values().map(Vec::len).sum()
    }

    /// True when nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes the next unused recording of `hash`, preferring ones recorded for `task`; failing
    /// that, `task`'s next unused recording in recording order.
    pub fn take(&mut self, task: &str, hash: &str) -> Option<TranscriptLine> {
        if let Some(recordings) = self.by_hash.get_mut(hash) {
            let pos = recordings
                .iter()
                .position(|r| !r.used && r.line.task == task)
                .or_else(|| recordings.iter().position(|r| !r.used));
            if let Some(pos) = pos {
                recordings[pos].used = true;
                return Some(recordings[pos].line.clone());
            }
        }
        let next = self
            .by_hash
            .values_mut()
            .flat_map(|v| v.iter_mut())
            .filter(|r| !r.used && r.line.task == task)
            .min_by_key(|r| r.seq)?;
        next.used = true;
        Some(next.line.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accounting::Usage;
    use serde_json::json;

    #[test]
    fn hash_ignores_key_order_and_stream_flags() {
        let a = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        let b = json!({"messages": [{"content": "hi", "role": "user"}], "model": "m",
                       "stream": true, "stream_options": {"include_usage": true}});
        assert_eq!(request_hash(&a), request_hash(&b));
        assert_eq!(request_hash(&a).len(), 16);
        let c = json!({"model": "m", "messages": [{"role": "user", "content": "hi!"}]});
        assert_ne!(request_hash(&a), request_hash(&c));
    }

    fn line(task: &str, hash: &str, answer: &str) -> TranscriptLine {
        TranscriptLine {
            ts_ms: 0,
            task: task.into(),
            backbone: "b".into(),
            model: "m".into(),
            request_hash: hash.into(),
            request: json!({}),
            response: json!({"answer": answer}),
            stream: false,
            status: 200,
            latency_ms: 1,
            attempts: 1,
            usage: Usage::default(),
            replay: false,
        }
    }

    #[test]
    fn a_directory_passes_over_other_json_lines_files_and_an_empty_one_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let results = dir.path().join("results.jsonl");
        std::fs::write(&results, "{\"instance_id\": \"a\", \"resolved\": true}\n").unwrap();
        let err = ReplayIndex::load(dir.path())
            .err()
            .expect("no transcripts in it");
        assert!(
            err.message.contains("no recorded LLM calls"),
            "{}",
            err.message
        );
        // An explicit file that is no transcript is an error naming its line.
        let err = ReplayIndex::load(&results).err().expect("not a transcript");
        assert!(err.message.contains("line 1"), "{}", err.message);
        let task_dir = dir.path().join("task-1");
        std::fs::create_dir(&task_dir).unwrap();
        let recorded = serde_json::to_string(&line("t", "h", "x")).unwrap();
        std::fs::write(task_dir.join("transcript.jsonl"), format!("{recorded}\n")).unwrap();
        let index = ReplayIndex::load(dir.path()).unwrap();
        assert_eq!(index.len(), 1);
        // A transcript that breaks later on is still an error, not silently cut short.
        std::fs::write(
            task_dir.join("transcript.jsonl"),
            format!("{recorded}\nnot json\n"),
        )
        .unwrap();
        let err = ReplayIndex::load(dir.path()).err().expect("a broken line");
        assert!(err.message.contains("line 2"), "{}", err.message);
    }

    #[test]
    fn identical_requests_get_recordings_in_order() {
        let mut index = ReplayIndex::from_lines(
            Path::new("rec"),
            vec![
                line("t1", "h", "first"),
                line("t1", "h", "second"),
                line("t2", "h", "other task"),
            ],
        );
        assert_eq!(index.len(), 3);
        assert_eq!(
            index.take("t2", "h").unwrap().response["answer"],
            "other task"
        );
        assert_eq!(index.take("t1", "h").unwrap().response["answer"], "first");
        assert_eq!(index.take("t1", "h").unwrap().response["answer"], "second");
        assert!(index.take("t1", "h").is_none());
        assert!(index.take("t1", "missing").is_none());
    }

    #[test]
    fn a_changed_request_gets_its_tasks_next_recording() {
        let mut index = ReplayIndex::from_lines(
            Path::new("rec"),
            vec![
                line("t1", "a", "first"),
                line("t2", "x", "other task"),
                line("t1", "b", "second"),
                line("t1", "c", "third"),
            ],
        );
        assert_eq!(index.take("t1", "a").unwrap().response["answer"], "first");
        // The second request differs (say, a test timing in it): answered in order.
        assert_eq!(index.take("t1", "b2").unwrap().response["answer"], "second");
        assert_eq!(index.take("t1", "c").unwrap().response["answer"], "third");
        assert!(
            index.take("t1", "d").is_none(),
            "t2's recordings are not t1's"
        );
    }
}
