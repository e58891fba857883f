//! The driver: runs the stages in order (skipping the variant's ablated one), each as a
//! tool-using conversation, then the generate → run → review → regenerate loop.

use super::parse::{
    RunSignal, classify_run, extract_json_object, extract_test_answer, is_safe_relative_path,
    looks_like_test_file, new_file_patch, shorten,
};
use super::prompts::{
    self, Findings, Rejection, Stage, THINK_TOOL, final_answer_request, format_reminder,
    system_prompt,
};
use super::types::{
    Localization, ReviewVerdict, RootCause, StageOutput, TestPlan, normalize_repo_path,
};
use crate::{InstanceBrief, Llm, LlmError, TestRun, ToolCall, Workspace};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// Where the test goes when neither the model nor the plan names a usable path.
pub const DEFAULT_TEST_PATH: &str = "tests/test_reproduce_issue.py";

/// At most this many characters of a tool result go back to the model.
pub const MAX_TOOL_RESULT_CHARS: usize = 20_000;

/// A suggested `top_k` for [`localized_files_correct`].
pub const LOCALIZATION_TOP_K: usize = 3;

const STEP_ARGS_CHARS: usize = 200;
const STEP_RESULT_CHARS: usize = 300;
const STEP_TEXT_CHARS: usize = 1000;

/// Which stages run: the full approach, or one stage ablated (as in the paper's RQ3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Variant {
    /// All stages.
    Full,
    /// Without hierarchical bug localization.
    NoLocalization,
    /// Without root-cause analysis.
    NoRca,
    /// Without test planning.
    NoPlanning,
    /// Without feedback iteration and triadic review: the first generated test, run once.
    NoReview,
}

impl Variant {
    /// Every variant, `full` first.
    pub const ALL: [Variant; 5] = [
        Variant::Full,
        Variant::NoLocalization,
        Variant::NoRca,
        Variant::NoPlanning,
        Variant::NoReview,
    ];

    /// The variant's name as in sweep specs.
    pub fn as_str(self) -> &'static str {
        match self {
            Variant::Full => "full",
            Variant::NoLocalization => "no-localization",
            Variant::NoRca => "no-rca",
            Variant::NoPlanning => "no-planning",
            Variant::NoReview => "no-review",
        }
    }

    /// Whether `stage` runs in this variant.
    pub fn runs(self, stage: Stage) -> bool {
        !matches!(
            (self, stage),
            (Variant::NoLocalization, Stage::Localization)
                | (Variant::NoRca, Stage::RootCause)
                | (Variant::NoPlanning, Stage::Planning)
                | (Variant::NoReview, Stage::Review)
        )
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A variant name that is not one of [`Variant::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown reproagent variant `{0}`; valid variants: full, no-localization, no-rca, no-planning, no-review"
)]
pub struct UnknownVariant(pub String);

impl FromStr for Variant {
    type Err = UnknownVariant;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Variant::ALL
            .into_iter()
            .find(|v| v.as_str() == s.trim())
            .ok_or_else(|| UnknownVariant(s.to_string()))
    }
}

/// The interaction budget (the paper's settings are the defaults).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// LLM calls per stage invocation: each of localization, root cause and planning; each
    /// generation round (one candidate test); each review.
    pub max_llm_calls_per_stage: u32,
    /// Regenerations after a rejected candidate; at most this many + 1 candidates.
    pub max_feedback_iterations: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_llm_calls_per_stage: 50,
            max_feedback_iterations: 20,
        }
    }
}

/// One entry of the run's step log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Step {
    /// Text the model wrote, or a sequential-thinking thought.
    Reasoning {
        /// Stage.
        stage: Stage,
        /// The text (shortened).
        text: String,
    },
    /// A tool call and its result.
    ToolCall {
        /// Stage.
        stage: Stage,
        /// Tool name.
        name: String,
        /// Arguments (shortened).
        args: String,
        /// Result (shortened).
        result: String,
    },
    /// A candidate test run on the buggy code.
    TestRun {
        /// Test file path.
        path: String,
        /// Exit code.
        exit_code: Option<i64>,
        /// Killed at the timeout.
        timed_out: bool,
        /// The classification: `passed`, `failed`, `setup_error`, `timed_out`.
        signal: String,
        /// What the classification says.
        summary: String,
    },
    /// A triadic review verdict.
    Verdict {
        /// Whether all three checks held.
        passed: bool,
        /// The verdict.
        verdict: ReviewVerdict,
    },
    /// Stage started, skipped, gave no answer, candidate rejected or accepted, and the like.
    Note {
        /// Stage.
        stage: Stage,
        /// What happened.
        text: String,
    },
}

/// What a run produced.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReproOutcome {
    /// The test as a patch creating the file (see [`new_file_patch`]), if any.
    pub test_patch: Option<String>,
    /// The test file's path, if any.
    pub test_path: Option<String>,
    /// The localization stage's output.
    pub localization: Option<Localization>,
    /// The root-cause stage's output.
    pub root_cause: Option<RootCause>,
    /// The planning stage's output.
    pub plan: Option<TestPlan>,
    /// Every triadic review verdict, in order.
    pub reviews: Vec<ReviewVerdict>,
    /// How many times a rejected candidate was sent back for regeneration.
    pub feedback_iterations: u32,
    /// LLM calls per stage name.
    pub llm_calls_by_stage: BTreeMap<String, u32>,
    /// Stage names that ran, in order.
    pub stages_run: Vec<String>,
    /// The step log.
    pub steps: Vec<Step>,
    /// Why the run stopped early: `budget`, `feedback_limit`, or `llm_error: …`.
    pub stopped_by: Option<String>,
}

/// Whether any of the golden (patched) files is among the top `top_k` files of the
/// localization's ranking (the usual Top-k hit of fault-localization studies). The ranking is
/// the files list, then files only named by function or line entries; paths are compared after
/// normalization (`./`, `/testbed/` prefixes dropped).
pub fn localized_files_correct(loc: &Localization, golden_files: &[String], top_k: usize) -> bool {
    let ranked = loc.ranked_files();
    let top = &ranked[..ranked.len().min(top_k)];
    golden_files
        .iter()
        .map(|g| normalize_repo_path(g))
        .any(|g| !g.is_empty() && top.contains(&g))
}

/// Runs ReProAgent on one instance; never fails, returns what it has (see
/// [`ReproOutcome::stopped_by`]).
pub async fn run<L: Llm, W: Workspace>(
    brief: &InstanceBrief,
    variant: Variant,
    limits: &Limits,
    llm: &mut L,
    ws: &W,
) -> ReproOutcome {
    let mut tools = ws.tool_specs();
    let workspace_thinks = tools.iter().any(|t| tool_name(t) == Some(THINK_TOOL));
    if !workspace_thinks {
        tools.push(prompts::think_tool_spec());
    }
    let mut driver = Driver {
        brief,
        variant,
        limits,
        llm,
        ws,
        tools,
        workspace_thinks,
        outcome: ReproOutcome::default(),
        thoughts: 0,
        best: None,
    };
    let stop = driver.run_stages().await.err();
    driver.finish(stop)
}

fn tool_name(spec: &Value) -> Option<&str> {
    spec.pointer("/function/name")
        .or_else(|| spec.get("name"))
        .and_then(Value::as_str)
}

/// Why the run ended before accepting a test.
#[derive(Debug, Clone, PartialEq)]
enum Stop {
    Budget,
    FeedbackLimit,
    LlmFailed(String),
    ContextLength(String),
}

impl Stop {
    fn label(&self) -> String {
        match self {
            Stop::Budget => "budget".into(),
            Stop::FeedbackLimit => "feedback_limit".into(),
            Stop::LlmFailed(msg) => format!("llm_error: {msg}"),
            Stop::ContextLength(msg) => format!("{}: {msg}", super::super::CONTEXT_LENGTH_STOP),
        }
    }
}

/// A candidate test and how good it is: 3 accepted by review; 2 failed in its own logic;
/// 1 setup error, timeout or unrunnable; 0 passed on the buggy code.
#[derive(Debug, Clone)]
struct Candidate {
    path: String,
    code: String,
    rank: u8,
}

struct Driver<'a, L, W> {
    brief: &'a InstanceBrief,
    variant: Variant,
    limits: &'a Limits,
    llm: &'a mut L,
    ws: &'a W,
    tools: Vec<Value>,
    workspace_thinks: bool,
    outcome: ReproOutcome,
    thoughts: u32,
    best: Option<Candidate>,
}

fn message(role: &str, content: &str) -> Value {
    json!({"role": role, "content": content})
}

fn assistant_message(content: Option<&str>, calls: &[ToolCall]) -> Value {
    // An assistant message needs content unless it carries tool calls.
    let content = match content {
        None if calls.is_empty() => Some(""),
        other => other,
    };
    let mut msg = json!({"role": "assistant", "content": content});
    if !calls.is_empty() {
        msg["tool_calls"] = calls
            .iter()
            .map(|c| {
                json!({
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments}
                })
            })
            .collect();
    }
    msg
}

impl<L: Llm, W: Workspace> Driver<'_, L, W> {
    async fn run_stages(&mut self) -> Result<(), Stop> {
        let brief = self.brief;
        if self.begin(Stage::Localization) {
            let mut messages = vec![
                message("system", &system_prompt(Stage::Localization)),
                message("user", &prompts::localization_user(brief)),
            ];
            self.outcome.localization = self
                .converse(Stage::Localization, &mut messages, true, json_answer)
                .await?;
        }
        if self.begin(Stage::RootCause) {
            let user = prompts::root_cause_user(brief, self.findings());
            let mut messages = vec![
                message("system", &system_prompt(Stage::RootCause)),
                message("user", &user),
            ];
            self.outcome.root_cause = self
                .converse(Stage::RootCause, &mut messages, true, json_answer)
                .await?;
        }
        if self.begin(Stage::Planning) {
            let user = prompts::planning_user(brief, self.findings());
            let mut messages = vec![
                message("system", &system_prompt(Stage::Planning)),
                message("user", &user),
            ];
            self.outcome.plan = self
                .converse(Stage::Planning, &mut messages, true, json_answer)
                .await?;
        }
        self.begin(Stage::Generation);
        self.generate_and_review().await
    }

    fn findings(&self) -> Findings<'_> {
        Findings {
            localization: self.outcome.localization.as_ref(),
            root_cause: self.outcome.root_cause.as_ref(),
            plan: self.outcome.plan.as_ref(),
        }
    }

    /// Records the stage as run, or as skipped by the variant; returns whether it runs.
    fn begin(&mut self, stage: Stage) -> bool {
        if self.variant.runs(stage) {
            self.outcome.stages_run.push(stage.as_str().to_string());
            true
        } else {
            self.note(stage, format!("skipped by variant {}", self.variant));
            false
        }
    }

    fn note(&mut self, stage: Stage, text: impl Into<String>) {
        self.outcome.steps.push(Step::Note {
            stage,
            text: text.into(),
        });
    }

    /// The generation stage: generate, run, pre-check and review, regenerate from feedback.
    async fn generate_and_review(&mut self) -> Result<(), Stop> {
        let mut messages = vec![
            message("system", &system_prompt(Stage::Generation)),
            message(
                "user",
                &prompts::generation_user(self.brief, self.findings()),
            ),
        ];
        loop {
            let answer = self
                .converse(Stage::Generation, &mut messages, true, extract_test_answer)
                .await?;
            let Some(answer) = answer else {
                if self.variant == Variant::NoReview {
                    return Ok(());
                }
                self.next_round()?;
                messages.push(message("user", &format_reminder(Stage::Generation)));
                continue;
            };
            let path = self.test_path_for(answer.path.as_deref());
            let code = answer.code;
            let (run, signal) = match self.ws.run_test(&path, &code).await {
                Ok(run) => {
                    let signal = classify_run(&run);
                    (run, signal)
                }
                Err(e) => {
                    let run = TestRun {
                        exit_code: None,
                        timed_out: false,
                        output: format!("the test could not be run: {e}"),
                    };
                    let signal = RunSignal::SetupError {
                        kind: "test run error".into(),
                        detail: shorten(&e.to_string(), STEP_RESULT_CHARS),
                    };
                    (run, signal)
                }
            };
            self.outcome.steps.push(Step::TestRun {
                path: path.clone(),
                exit_code: run.exit_code,
                timed_out: run.timed_out,
                signal: signal.label().into(),
                summary: signal.describe(),
            });

            if self.variant == Variant::NoReview {
                self.offer(Candidate {
                    path,
                    code,
                    rank: 0,
                });
                self.note(
                    Stage::Generation,
                    "no-review: returning the first test as generated",
                );
                return Ok(());
            }
            if !self.outcome.stages_run.iter().any(|s| s == "review") {
                self.outcome.stages_run.push(Stage::Review.as_str().into());
            }

            let rank = match signal {
                RunSignal::Passed => 0,
                RunSignal::Failed { .. } => 2,
                RunSignal::SetupError { .. } | RunSignal::TimedOut => 1,
            };
            // Record before reviewing, so a budget stop during review still returns it.
            self.offer(Candidate {
                path: path.clone(),
                code: code.clone(),
                rank,
            });
            let verdict;
            let rejection = match &signal {
                RunSignal::Passed => Rejection::PassedOnBuggyCode,
                RunSignal::TimedOut => Rejection::PreCheck,
                RunSignal::SetupError { kind, .. } if !self.issue_mentions(kind) => {
                    Rejection::PreCheck
                }
                RunSignal::Failed { .. } | RunSignal::SetupError { .. } => {
                    verdict = self.review(&path, &code, &run, &signal).await?;
                    match &verdict {
                        Some(v) if v.passed() => {
                            self.offer(Candidate {
                                path: path.clone(),
                                code,
                                rank: 3,
                            });
                            self.note(Stage::Review, format!("accepted {path}"));
                            return Ok(());
                        }
                        Some(v) => Rejection::Review(v),
                        None => Rejection::ReviewUnavailable,
                    }
                }
            };
            let why = match &rejection {
                Rejection::PassedOnBuggyCode => "pre-check: passed on the buggy code".to_string(),
                Rejection::PreCheck => format!("pre-check: {}", signal.describe()),
                Rejection::Review(_) => "triadic review failed".to_string(),
                Rejection::ReviewUnavailable => "no usable review verdict".to_string(),
            };
            self.note(Stage::Review, format!("rejected {path}: {why}"));
            let feedback = prompts::regeneration_feedback(&path, &run, &signal, &rejection);
            self.next_round()?;
            messages.push(message("user", &feedback));
        }
    }

    /// Counts one more feedback iteration, or stops at the limit.
    fn next_round(&mut self) -> Result<(), Stop> {
        if self.outcome.feedback_iterations >= self.limits.max_feedback_iterations {
            self.note(Stage::Generation, "feedback iteration limit reached");
            return Err(Stop::FeedbackLimit);
        }
        self.outcome.feedback_iterations += 1;
        Ok(())
    }

    /// Whether the issue text names `kind` (e.g. an `ImportError` that is itself the bug), in
    /// which case a setup-looking failure goes to the reviewer instead of the pre-check.
    fn issue_mentions(&self, kind: &str) -> bool {
        kind.ends_with("Error") && self.brief.problem_statement.contains(kind)
    }

    /// The path to write the test at: the model's, else the plan's, else the default (only safe
    /// relative paths of test-named files count).
    fn test_path_for(&self, proposed: Option<&str>) -> String {
        let plan_path = self
            .outcome
            .plan
            .as_ref()
            .map(|p| normalize_repo_path(&p.test_path));
        [proposed.map(normalize_repo_path), plan_path]
            .into_iter()
            .flatten()
            .find(|p| is_safe_relative_path(p) && looks_like_test_file(p))
            .unwrap_or_else(|| DEFAULT_TEST_PATH.to_string())
    }

    /// Keeps `candidate` if it is at least as good as the best so far (later wins ties);
    /// tests that passed on the buggy code are kept only by `no-review`.
    fn offer(&mut self, candidate: Candidate) {
        if candidate.rank == 0 && self.variant != Variant::NoReview {
            return;
        }
        if self.best.as_ref().is_none_or(|b| candidate.rank >= b.rank) {
            self.best = Some(candidate);
        }
    }

    /// The triadic review of a failing candidate (no tools).
    async fn review(
        &mut self,
        path: &str,
        code: &str,
        run: &TestRun,
        signal: &RunSignal,
    ) -> Result<Option<ReviewVerdict>, Stop> {
        let mut messages = vec![
            message("system", &system_prompt(Stage::Review)),
            message(
                "user",
                &prompts::review_user(self.brief, path, code, run, signal),
            ),
        ];
        let verdict: Option<ReviewVerdict> = self
            .converse(Stage::Review, &mut messages, false, json_answer)
            .await?;
        if let Some(v) = &verdict {
            self.outcome.reviews.push(v.clone());
            self.outcome.steps.push(Step::Verdict {
                passed: v.passed(),
                verdict: v.clone(),
            });
        }
        Ok(verdict)
    }

    /// One stage conversation: calls the model (with tools when `use_tools`), runs its tool
    /// calls, and returns the first reply `accept` parses. At most `max_llm_calls_per_stage`
    /// calls; with tools, the last allowed call offers none and asks for the final answer.
    async fn converse<T>(
        &mut self,
        stage: Stage,
        messages: &mut Vec<Value>,
        use_tools: bool,
        accept: impl Fn(&str) -> Option<T>,
    ) -> Result<Option<T>, Stop> {
        let max = self.limits.max_llm_calls_per_stage;
        let mut calls = 0;
        while calls < max {
            let last_call = calls + 1 == max;
            let offer_tools = use_tools && !last_call;
            if use_tools && last_call && calls > 0 {
                messages.push(message("user", &final_answer_request(stage)));
            }
            let tools: &[Value] = if offer_tools { &self.tools } else { &[] };
            let result = self.llm.chat(messages, tools).await;
            calls += 1;
            *self
                .outcome
                .llm_calls_by_stage
                .entry(stage.as_str().to_string())
                .or_insert(0) += 1;
            let turn = match result {
                Ok(turn) => turn,
                Err(LlmError::Budget(msg)) => {
                    self.note(stage, format!("LLM budget exhausted: {msg}"));
                    return Err(Stop::Budget);
                }
                Err(LlmError::Failed(msg)) => {
                    self.note(stage, format!("LLM call failed: {msg}"));
                    return Err(Stop::LlmFailed(msg));
                }
                Err(LlmError::ContextLength(msg)) => {
                    self.note(
                        stage,
                        format!("the prompt outgrew the model's context: {msg}"),
                    );
                    return Err(Stop::ContextLength(msg));
                }
            };
            let content = turn.content.as_deref().unwrap_or("");
            messages.push(assistant_message(turn.content.as_deref(), &turn.tool_calls));
            if !content.trim().is_empty() {
                self.outcome.steps.push(Step::Reasoning {
                    stage,
                    text: shorten(content.trim(), STEP_TEXT_CHARS),
                });
            }
            for call in &turn.tool_calls {
                let result = if offer_tools {
                    self.call_tool(stage, call).await
                } else {
                    "error: no tools are available now; give your final answer.".to_string()
                };
                messages.push(json!({
                    "role": "tool",
                    "tool_call_id": call.id,
                    "content": shorten(&result, MAX_TOOL_RESULT_CHARS),
                }));
            }
            if turn.tool_calls.is_empty() || !offer_tools {
                if let Some(answer) = accept(content) {
                    return Ok(Some(answer));
                }
                if calls < max {
                    messages.push(message("user", &format_reminder(stage)));
                }
            }
        }
        self.note(stage, format!("no answer within {max} LLM calls"));
        Ok(None)
    }

    async fn call_tool(&mut self, stage: Stage, call: &ToolCall) -> String {
        let result = if call.name == THINK_TOOL && !self.workspace_thinks {
            self.think(stage, &call.arguments)
        } else {
            self.ws.call_tool(&call.name, &call.arguments).await
        };
        self.outcome.steps.push(Step::ToolCall {
            stage,
            name: call.name.clone(),
            args: shorten(&call.arguments, STEP_ARGS_CHARS),
            result: shorten(&result, STEP_RESULT_CHARS),
        });
        result
    }

    /// The built-in sequential-thinking tool: logs the thought, reports the sequence's state.
    fn think(&mut self, stage: Stage, arguments: &str) -> String {
        let Some(args) = serde_json::from_str::<Value>(arguments)
            .ok()
            .filter(Value::is_object)
        else {
            return format!(
                "error: {THINK_TOOL} takes a JSON object with `thought`, `thought_number`, \
`total_thoughts` and `next_thought_needed`"
            );
        };
        let Some(thought) = args.get("thought").and_then(Value::as_str) else {
            return format!("error: {THINK_TOOL} needs a `thought` string");
        };
        self.thoughts += 1;
        let number = args
            .get("thought_number")
            .and_then(Value::as_u64)
            .unwrap_or(u64::from(self.thoughts));
        let total = args
            .get("total_thoughts")
            .and_then(Value::as_u64)
            .unwrap_or(number)
            .max(number);
        let revises = args.get("revises_thought").and_then(Value::as_u64);
        let label = match revises {
            Some(r) => format!("thought {number}/{total} (revises {r})"),
            None => format!("thought {number}/{total}"),
        };
        self.outcome.steps.push(Step::Reasoning {
            stage,
            text: shorten(&format!("{label}: {thought}"), STEP_TEXT_CHARS),
        });
        json!({
            "thought_number": number,
            "total_thoughts": total,
            "next_thought_needed": args.get("next_thought_needed").and_then(Value::as_bool).unwrap_or(true),
            "thoughts_recorded": self.thoughts,
        })
        .to_string()
    }

    fn finish(mut self, stop: Option<Stop>) -> ReproOutcome {
        if let Some(best) = self.best.take() {
            self.outcome.test_patch = Some(new_file_patch(&best.path, &best.code));
            self.outcome.test_path = Some(best.path);
        }
        self.outcome.stopped_by = stop.map(|s| s.label());
        self.outcome
    }
}

/// A stage's JSON answer in `text`, if it has one.
fn json_answer<T: StageOutput>(text: &str) -> Option<T> {
    extract_json_object(text).and_then(|v| T::from_json(&v))
}
