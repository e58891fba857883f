//! Agents that produce an artifact for an instance, and the tools they use.
//!
//! The agents' logic is written against two small traits, [`Llm`] (chat completions, through the
//! node's metering gateway in production) and [`Workspace`] (repository tools and test runs in the
//! instance's sandbox), so it can be tested with scripted stand-ins and no IO.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::future::Future;

// The LLM seam lives with the gateway, so the Android track uses it without the SWT agents.
pub use reprobench_gateway::llm::{
    AssistantTurn, CONTEXT_LENGTH_CLASS, CONTEXT_LENGTH_STOP, GatewayLlm, Llm, LlmError, ToolCall,
};

pub mod baselines;
pub mod checkout;
pub mod custom_diff;
pub mod external;
pub mod external_image;
pub mod oracle;
pub mod reproagent;
pub mod run;
pub mod tools;
pub mod workspace;

/// The result of running one test file in the instance's environment at the base commit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TestRun {
    /// Exit code of the test command; `None` when killed at the timeout.
    pub exit_code: Option<i64>,
    /// Killed at the timeout.
    pub timed_out: bool,
    /// Interleaved stdout and stderr.
    pub output: String,
}

/// What an agent may do with the instance's repository.
pub trait Workspace: Send + Sync {
    /// OpenAI function specs of the tools [`Workspace::call_tool`] accepts.
    fn tool_specs(&self) -> Vec<Value>;
    /// Runs one tool call; errors come back as text for the model to read.
    fn call_tool(&self, name: &str, arguments: &str) -> impl Future<Output = String> + Send;
    /// Writes `contents` at `path` (relative to the repository root) in a fresh copy of the
    /// environment at the base commit and runs it with the instance's test command.
    fn run_test(
        &self,
        path: &str,
        contents: &str,
    ) -> impl Future<Output = Result<TestRun, workspace::WorkspaceError>> + Send;
    /// The repository's existing test file most like `code` (where LIBRO places a test);
    /// `None` when the workspace cannot tell.
    fn most_similar_test_file(&self, code: &str) -> impl Future<Output = Option<String>> + Send {
        let _ = code;
        async { None }
    }
    /// The text of the file at `path` (relative to the repository root) at the base commit:
    /// `Ok(None)` when there is none, `Err` when it cannot be read as text. The default knows
    /// no files.
    fn file_text(&self, path: &str) -> impl Future<Output = Result<Option<String>, String>> + Send {
        let _ = path;
        async { Ok(None) }
    }
}

/// What an agent is told about the instance.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InstanceBrief {
    /// Instance id.
    pub instance_id: String,
    /// `owner/name`.
    pub repo: String,
    /// The issue text.
    pub problem_statement: String,
    /// Hints (comments), possibly empty.
    pub hints: String,
}
