//! How an attempt ended, as executors report it: the outcome and its failure class, and the
//! attempt it belongs to. The node's runtime converts them to the wire (`reprobench_proto`'s
//! `convert`); executors never see the protocol.

use serde::{Deserialize, Serialize};

/// Which attempt: the task and the lease epoch it was granted under.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
pub struct AttemptRef {
    /// The task's id.
    pub task_id: u64,
    /// The grant's epoch (one per grant of the task).
    pub epoch: u64,
}

/// Why an attempt ended without a verdict, which decides whether it is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureClass {
    /// The agent ran to the end (success or not is in `success`).
    #[default]
    None,
    /// The agent failed: final, not retried.
    Agent,
    /// The machinery failed: retried on a new attempt (bounded by the run's `max_attempts`).
    Infra,
    /// The instance or prediction is unusable: final, not retried.
    BadInput,
}

/// What an attempt that ran to its end reports.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Outcome {
    /// Whether the task succeeded (SWT: fail-to-pass; Android: reproduced).
    pub success: bool,
    /// The verdict in words.
    pub verdict: String,
    /// Why it ended without a verdict, if it did.
    pub failure_class: FailureClass,
    /// Short machine-readable class of the error, empty when none.
    pub error_class: String,
    /// The error in words.
    pub error_message: String,
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
    /// Feedback iterations of the agent.
    pub feedback_iterations: Option<u32>,
    /// SWT: whether the agent localized the right files.
    pub localized_files_correct: Option<bool>,
    /// Start, in milliseconds since the Unix epoch.
    pub started_at_ms: i64,
    /// Finish, in milliseconds since the Unix epoch.
    pub finished_at_ms: i64,
    /// Where the attempt's files are.
    pub artifact_path: String,
    /// The track's report (SWT: SWT-bench's `report.json`), as JSON.
    pub details_json: String,
}
