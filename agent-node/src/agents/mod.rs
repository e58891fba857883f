//! Agents that produce an artifact for an instance, and the tools they use.
//!
//! The agents' logic is written against two small traits, [`Llm`] (chat completions, through the
//! node's metering gateway in production) and [`Workspace`] (repository tools and test runs in the
//! instance's sandbox), so it can be tested with scripted stand-ins and no IO.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::future::Future;

pub mod baselines;
pub mod checkout;
pub mod external;
pub mod external_image;
pub mod llm_client;
pub mod reproagent;
pub mod run;
pub mod tools;
pub mod workspace;

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
    ) -> impl Future<Output = Result<TestRun, String>> + Send;
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
