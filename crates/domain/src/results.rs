//! The results schema (DESIGN.md): one row per finished task, as `results.jsonl`, CSV and
//! Parquet carry it. It is its own serde type, apart from the wire message that brings rows from
//! the coordinator, and it is versioned: every row says which [`SCHEMA_VERSION`] wrote it, and a
//! reader refuses rows from a newer one instead of misreading them.

use serde::{Deserialize, Serialize};

/// The version of the results schema this build writes and reads. Rows written before the
/// schema carried a version read as version 1, the schema they were written in.
pub const SCHEMA_VERSION: u32 = 1;

/// The schema version a row was written in; defaults to [`SCHEMA_VERSION`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SchemaVersion(pub u32);

impl Default for SchemaVersion {
    fn default() -> Self {
        SchemaVersion(SCHEMA_VERSION)
    }
}

/// A row written by a newer reprobench than this one.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "a result row has schema version {found}, newer than the {SCHEMA_VERSION} this reprobench \
     reads: upgrade reprobench to read it"
)]
pub struct NewerSchema {
    /// The row's version.
    pub found: u32,
}

/// One finished task in the results schema. Optional fields are those only some tracks fill.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ResultRow {
    /// The schema version the row was written in.
    pub schema_version: SchemaVersion,
    /// Run id.
    pub run_id: String,
    /// Sweep name.
    pub sweep: String,
    /// Track (`synthetic`, `swt`, `android`).
    pub track: String,
    /// Dataset name.
    pub dataset: String,
    /// Instance id.
    pub instance_id: String,
    /// Repository (SWT) or app (Android).
    pub repo_or_app: String,
    /// Android: the bug's type (crash or not).
    pub bug_type: Option<String>,
    /// Agent name.
    pub agent: String,
    /// Variant name.
    pub variant: String,
    /// Backbone model name.
    pub backbone: String,
    /// Repeat index.
    pub repeat: u32,
    /// Whether the task succeeded (SWT: fail-to-pass; Android: reproduced).
    pub success: bool,
    /// The verdict in words.
    pub verdict: String,
    /// Error class, when the task ended in an error.
    pub error_class: Option<String>,
    /// Why the task ended in an error, in words.
    pub error_message: Option<String>,
    /// SWT: the grading rules' version (e.g. `swt-bench-2025-09`).
    pub rules: Option<String>,
    /// SWT: SWT-bench's coverage delta of the prediction (0-1).
    pub coverage_delta: Option<f64>,
    /// Grants of the task.
    pub attempts: u32,
    /// LLM calls metered.
    pub llm_calls: u64,
    /// Input tokens.
    pub tokens_in: u64,
    /// Output tokens.
    pub tokens_out: u64,
    /// Cached input tokens.
    pub tokens_cached: u64,
    /// Cost in US dollars.
    pub cost_usd: f64,
    /// Wall time in seconds.
    pub wall_s: f64,
    /// Android: actions taken.
    pub actions: Option<u32>,
    /// Android: length of the reproducing trace.
    pub trace_len: Option<u32>,
    /// Android: actions of the ground-truth trace.
    pub ground_truth_actions: Option<u32>,
    /// Feedback iterations of the agent.
    pub feedback_iterations: Option<u32>,
    /// SWT: whether the agent localized the right files.
    pub localized_files_correct: Option<bool>,
    /// Start time, RFC 3339 UTC.
    pub started_at: String,
    /// Finish time, RFC 3339 UTC.
    pub finished_at: String,
    /// The node that ran the last attempt.
    pub node_id: String,
    /// Where the task's artifacts are.
    pub artifact_path: String,
    /// Not part of the schema: the track's report (JSON), kept out of JSONL, CSV and Parquet.
    #[serde(skip)]
    pub details_json: String,
}

impl ResultRow {
    /// The row itself, or why this build cannot read it.
    pub fn checked(self) -> Result<ResultRow, NewerSchema> {
        if self.schema_version.0 > SCHEMA_VERSION {
            return Err(NewerSchema {
                found: self.schema_version.0,
            });
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_without_a_version_reads_as_version_1_and_a_newer_one_is_refused() {
        let old: ResultRow = serde_json::from_str(r#"{"run_id":"r","success":true}"#).unwrap();
        assert_eq!(old.schema_version, SchemaVersion(1));
        assert!(old.clone().checked().is_ok());
        let written = serde_json::to_value(&old).unwrap();
        assert_eq!(written["schema_version"], 1);
        assert!(written.get("details_json").is_none());
        let newer: ResultRow =
            serde_json::from_str(r#"{"schema_version":2,"run_id":"r"}"#).unwrap();
        assert_eq!(newer.checked(), Err(NewerSchema { found: 2 }));
    }
}
