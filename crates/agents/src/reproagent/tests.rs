//! Driver tests with a scripted model (answering by stage marker) and a fake workspace.

use super::prompts::stage_of_system_prompt;
use super::*;
use crate::{AssistantTurn, InstanceBrief, Llm, LlmError, TestRun, ToolCall, Workspace};
use serde_json::{Value, json};
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// One scripted model reply.
#[derive(Debug, Clone)]
enum Reply {
    Text(String),
    Tools(Vec<(&'static str, String)>),
    Budget,
    Fail(&'static str),
    TooLong(&'static str),
}

fn text(s: &str) -> Reply {
    Reply::Text(s.to_string())
}

/// One recorded model call.
#[derive(Debug, Clone)]
struct Call {
    stage: Stage,
    tools_offered: usize,
    last_message: String,
}

/// Answers by the stage marker of the system prompt: the stage's queue first, then its
/// fallback reply forever.
#[derive(Default)]
struct ScriptedLlm {
    queues: HashMap<Stage, VecDeque<Reply>>,
    fallbacks: HashMap<Stage, Reply>,
    calls: Vec<Call>,
    next_id: u32,
}

impl ScriptedLlm {
    fn then(mut self, stage: Stage, replies: impl IntoIterator<Item = Reply>) -> Self {
        self.queues.entry(stage).or_default().extend(replies);
        self
    }

    fn always(mut self, stage: Stage, reply: Reply) -> Self {
        self.fallbacks.insert(stage, reply);
        self
    }

    fn calls_in(&self, stage: Stage) -> usize {
        self.calls.iter().filter(|c| c.stage == stage).count()
    }
}

impl Llm for ScriptedLlm {
    async fn chat(
        &mut self,
        messages: &[Value],
        tools: &[Value],
    ) -> Result<AssistantTurn, LlmError> {
        let system = messages[0]["content"].as_str().unwrap_or_default();
        let stage = stage_of_system_prompt(system).expect("every system prompt has a stage marker");
        let last_message = messages
            .last()
            .and_then(|m| m["content"].as_str())
            .unwrap_or_default()
            .to_string();
        self.calls.push(Call {
            stage,
            tools_offered: tools.len(),
            last_message,
        });
        let reply = self
            .queues
            .get_mut(&stage)
            .and_then(VecDeque::pop_front)
            .or_else(|| self.fallbacks.get(&stage).cloned())
            .unwrap_or_else(|| panic!("no scripted reply for stage {}", stage.as_str()));
        match reply {
            Reply::Text(content) => Ok(AssistantTurn {
                content: Some(content),
                tool_calls: vec![],
            }),
            Reply::Tools(calls) => Ok(AssistantTurn {
                content: None,
                tool_calls: calls
                    .into_iter()
                    .map(|(name, arguments)| {
                        self.next_id += 1;
                        ToolCall {
                            id: format!("call_{}", self.next_id),
                            name: name.to_string(),
                            arguments,
                        }
                    })
                    .collect(),
            }),
            Reply::Budget => Err(LlmError::Budget("calls".into())),
            Reply::Fail(msg) => Err(LlmError::Failed(msg.into())),
            Reply::TooLong(msg) => Err(LlmError::ContextLength(msg.into())),
        }
    }
}

/// A workspace with `grep` and `read_file`, scripted test runs (the last one repeats), and a
/// record of tool calls and written tests.
struct FakeWorkspace {
    runs: Mutex<VecDeque<TestRun>>,
    tool_calls: Mutex<Vec<(String, String)>>,
    tests_run: Mutex<Vec<(String, String)>>,
}

impl FakeWorkspace {
    fn with_runs(runs: impl IntoIterator<Item = TestRun>) -> Self {
        FakeWorkspace {
            runs: Mutex::new(runs.into_iter().collect()),
            tool_calls: Mutex::default(),
            tests_run: Mutex::default(),
        }
    }

    fn tests_run(&self) -> Vec<(String, String)> {
        self.tests_run.lock().unwrap().clone()
    }
}

impl Workspace for FakeWorkspace {
    fn tool_specs(&self) -> Vec<Value> {
        ["grep", "read_file"]
            .iter()
            .map(|name| json!({"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}))
            .collect()
    }

    async fn call_tool(&self, name: &str, arguments: &str) -> String {
        self.tool_calls
            .lock()
            .unwrap()
            .push((name.to_string(), arguments.to_string()));
        match serde_json::from_str::<Value>(arguments) {
            Ok(_) => format!("{name} result: pkg/calc.py:3: return a / b"),
            Err(e) => format!("error: arguments are not valid JSON: {e}"),
        }
    }

    async fn run_test(
        &self,
        path: &str,
        contents: &str,
    ) -> Result<TestRun, crate::workspace::WorkspaceError> {
        self.tests_run
            .lock()
            .unwrap()
            .push((path.to_string(), contents.to_string()));
        let mut runs = self.runs.lock().unwrap();
        let run = if runs.len() > 1 {
            runs.pop_front().unwrap()
        } else {
            runs.front().cloned().expect("a scripted run")
        };
        Ok(run)
    }
}

fn brief() -> InstanceBrief {
    InstanceBrief {
        instance_id: "acme__calc-7".into(),
        repo: "acme/calc".into(),
        problem_statement: "divide(1, 0) raises ZeroDivisionError instead of returning inf".into(),
        hints: String::new(),
    }
}

fn failing_run() -> TestRun {
    TestRun {
        exit_code: Some(1),
        timed_out: false,
        output: "E       ZeroDivisionError: division by zero\nFAILED tests/test_div.py::test_div"
            .into(),
    }
}

fn passing_run() -> TestRun {
    TestRun {
        exit_code: Some(0),
        timed_out: false,
        output: "1 passed in 0.01s".into(),
    }
}

fn import_error_run() -> TestRun {
    TestRun {
        exit_code: Some(2),
        timed_out: false,
        output: "E   ModuleNotFoundError: No module named 'calcx'\nInterrupted: 1 error during collection"
            .into(),
    }
}

const LOCALIZATION_JSON: &str = r#"Found it.
```json
{"files": [{"path": "pkg/calc.py", "rationale": "defines divide", "confidence": "high"}],
 "functions": [{"path": "pkg/calc.py", "name": "divide", "rationale": "divides", "confidence": 0.8}],
 "lines": [{"path": "pkg/calc.py", "start_line": 3, "end_line": 3, "rationale": "a / b", "confidence": 0.7}]}
```"#;

const ROOT_CAUSE_JSON: &str = r#"{"summary": "divide does not handle b == 0", "error_category": "boundary handling",
 "execution_path": ["pkg/calc.py:3 divide"], "trigger_conditions": ["b is 0"], "confidence": 0.9}"#;

const PLAN_JSON: &str = r#"{"environment_constraints": [], "minimal_inputs": ["divide(1, 0)"],
 "expected_assertions": ["returns inf"], "test_path": "tests/test_div.py", "test_name": "test_div"}"#;

const REVIEW_PASS: &str = r#"{"aligns_with_issue": true, "failure_from_test_logic": true, "matches_reported_symptom": true, "feedback": ""}"#;
const REVIEW_FAIL: &str = r#"{"aligns_with_issue": true, "failure_from_test_logic": true, "matches_reported_symptom": false, "feedback": "assert on the return value"}"#;

fn test_answer(version: u32) -> Reply {
    Reply::Text(format!(
        "Test file: tests/test_div.py\n```python\nfrom pkg.calc import divide\n\n\ndef test_div():\n    # version {version}\n    assert divide(1, 0) == float('inf')\n```"
    ))
}

fn test_code(version: u32) -> String {
    format!(
        "from pkg.calc import divide\n\n\ndef test_div():\n    # version {version}\n    assert divide(1, 0) == float('inf')\n"
    )
}

/// A model that gets every stage right on the first answer.
fn cooperative_llm() -> ScriptedLlm {
    ScriptedLlm::default()
        .always(Stage::Localization, text(LOCALIZATION_JSON))
        .always(Stage::RootCause, text(ROOT_CAUSE_JSON))
        .always(Stage::Planning, text(PLAN_JSON))
        .always(Stage::Generation, test_answer(1))
        .always(Stage::Review, text(REVIEW_PASS))
}

fn calls(outcome: &ReproOutcome, stage: Stage) -> u32 {
    outcome
        .llm_calls_by_stage
        .get(stage.as_str())
        .copied()
        .unwrap_or(0)
}

#[tokio::test]
async fn full_run_fills_every_stage_and_returns_the_reviewed_test_as_a_patch() {
    let mut llm = cooperative_llm().then(
        Stage::Localization,
        [
            Reply::Tools(vec![(
                "sequential_thinking",
                r#"{"thought": "look for divide", "thought_number": 1, "total_thoughts": 2, "next_thought_needed": true}"#.into(),
            )]),
            Reply::Tools(vec![("grep", r#"{"pattern": "def divide"}"#.into())]),
        ],
    );
    let ws = FakeWorkspace::with_runs([failing_run()]);
    let outcome = run(&brief(), Variant::Full, &Limits::default(), &mut llm, &ws).await;

    assert_eq!(outcome.stopped_by, None);
    assert_eq!(outcome.test_path.as_deref(), Some("tests/test_div.py"));
    assert_eq!(
        outcome.test_patch.as_deref(),
        Some(new_file_patch("tests/test_div.py", &test_code(1)).as_str())
    );
    let loc = outcome.localization.as_ref().unwrap();
    assert_eq!(loc.files[0].path, "pkg/calc.py");
    assert_eq!(loc.files[0].confidence, 0.9);
    assert_eq!(
        outcome.root_cause.as_ref().unwrap().error_category,
        "boundary handling"
    );
    assert_eq!(outcome.plan.as_ref().unwrap().test_name, "test_div");
    assert_eq!(outcome.reviews.len(), 1);
    assert!(outcome.reviews[0].passed());
    assert_eq!(outcome.feedback_iterations, 0);
    assert_eq!(
        outcome.stages_run,
        vec![
            "localization",
            "root-cause",
            "planning",
            "generation",
            "review"
        ]
    );
    assert_eq!(calls(&outcome, Stage::Localization), 3);
    assert_eq!(calls(&outcome, Stage::Generation), 1);
    assert_eq!(calls(&outcome, Stage::Review), 1);
    assert_eq!(
        ws.tests_run(),
        vec![("tests/test_div.py".to_string(), test_code(1))]
    );
    // The thought stays with the agent; only grep reaches the workspace.
    assert_eq!(ws.tool_calls.lock().unwrap().len(), 1);
    assert!(outcome.steps.iter().any(|s| matches!(s,
        Step::Reasoning { stage: Stage::Localization, text } if text.contains("look for divide"))));
    assert!(outcome.steps.iter().any(|s| matches!(s,
        Step::ToolCall { name, result, .. } if name == "grep" && result.contains("return a / b"))));
    assert!(
        outcome
            .steps
            .iter()
            .any(|s| matches!(s, Step::TestRun { signal, .. } if signal == "failed"))
    );
    assert!(
        outcome
            .steps
            .iter()
            .any(|s| matches!(s, Step::Verdict { passed: true, .. }))
    );
    // Tools were offered in tool stages, never to the reviewer; and later prompts carry findings.
    assert!(
        llm.calls
            .iter()
            .filter(|c| c.stage == Stage::Review)
            .all(|c| c.tools_offered == 0)
    );
    assert!(
        llm.calls
            .iter()
            .filter(|c| c.stage == Stage::Localization)
            .all(|c| c.tools_offered == 3)
    );
    let generation_prompt = &llm
        .calls
        .iter()
        .find(|c| c.stage == Stage::Generation)
        .unwrap()
        .last_message;
    assert!(generation_prompt.contains("divide does not handle b == 0"));
    assert!(generation_prompt.contains("Suggested test file: tests/test_div.py"));
}

#[tokio::test]
async fn each_ablation_makes_no_calls_in_its_stage_and_lacks_its_output() {
    for (variant, skipped) in [
        (Variant::NoLocalization, Stage::Localization),
        (Variant::NoRca, Stage::RootCause),
        (Variant::NoPlanning, Stage::Planning),
    ] {
        let mut llm = cooperative_llm();
        let ws = FakeWorkspace::with_runs([failing_run()]);
        let outcome = run(&brief(), variant, &Limits::default(), &mut llm, &ws).await;
        assert_eq!(llm.calls_in(skipped), 0, "{variant}");
        assert_eq!(calls(&outcome, skipped), 0, "{variant}");
        assert!(
            !outcome.stages_run.iter().any(|s| s == skipped.as_str()),
            "{variant}"
        );
        assert_eq!(
            outcome.localization.is_none(),
            skipped == Stage::Localization
        );
        assert_eq!(outcome.root_cause.is_none(), skipped == Stage::RootCause);
        assert_eq!(outcome.plan.is_none(), skipped == Stage::Planning);
        assert!(outcome.test_patch.is_some(), "{variant}");
        assert_eq!(outcome.reviews.len(), 1, "{variant}");
        let generation_prompt = &llm
            .calls
            .iter()
            .find(|c| c.stage == Stage::Generation)
            .unwrap()
            .last_message;
        assert!(generation_prompt.contains("not available"), "{variant}");
    }
}

#[tokio::test]
async fn no_review_returns_the_first_test_after_one_run_even_if_it_passes() {
    let mut llm = cooperative_llm();
    let ws = FakeWorkspace::with_runs([passing_run()]);
    let outcome = run(
        &brief(),
        Variant::NoReview,
        &Limits::default(),
        &mut llm,
        &ws,
    )
    .await;
    assert_eq!(llm.calls_in(Stage::Review), 0);
    assert!(outcome.reviews.is_empty());
    assert_eq!(outcome.feedback_iterations, 0);
    assert_eq!(calls(&outcome, Stage::Generation), 1);
    assert_eq!(ws.tests_run().len(), 1);
    assert_eq!(
        outcome.test_patch,
        Some(new_file_patch("tests/test_div.py", &test_code(1)))
    );
    assert_eq!(
        outcome.stages_run,
        vec!["localization", "root-cause", "planning", "generation"]
    );
    assert_eq!(outcome.stopped_by, None);
}

#[tokio::test]
async fn a_failed_review_sends_feedback_and_the_regenerated_test_is_returned() {
    let mut llm = cooperative_llm()
        .then(Stage::Generation, [test_answer(1), test_answer(2)])
        .then(Stage::Review, [text(REVIEW_FAIL), text(REVIEW_PASS)]);
    let ws = FakeWorkspace::with_runs([failing_run()]);
    let outcome = run(&brief(), Variant::Full, &Limits::default(), &mut llm, &ws).await;
    assert_eq!(outcome.feedback_iterations, 1);
    assert_eq!(outcome.reviews.len(), 2);
    assert!(!outcome.reviews[0].passed() && outcome.reviews[1].passed());
    assert_eq!(
        outcome.test_patch,
        Some(new_file_patch("tests/test_div.py", &test_code(2)))
    );
    assert_eq!(outcome.stopped_by, None);
    let second_generation = &llm
        .calls
        .iter()
        .filter(|c| c.stage == Stage::Generation)
        .nth(1)
        .unwrap()
        .last_message;
    assert!(second_generation.contains("assert on the return value"));
    assert!(second_generation.contains("matches the reported symptom: NO"));
}

#[tokio::test]
async fn a_test_passing_on_buggy_code_is_never_accepted_nor_reviewed() {
    let mut llm = cooperative_llm();
    let ws = FakeWorkspace::with_runs([passing_run()]);
    let limits = Limits {
        max_feedback_iterations: 2,
        ..Limits::default()
    };
    let outcome = run(&brief(), Variant::Full, &limits, &mut llm, &ws).await;
    assert_eq!(outcome.test_patch, None);
    assert_eq!(outcome.test_path, None);
    assert_eq!(
        llm.calls_in(Stage::Review),
        0,
        "the pre-check rejects without the model"
    );
    assert_eq!(outcome.feedback_iterations, 2);
    assert_eq!(ws.tests_run().len(), 3);
    assert_eq!(outcome.stopped_by.as_deref(), Some("feedback_limit"));
    let feedback = &llm
        .calls
        .iter()
        .filter(|c| c.stage == Stage::Generation)
        .nth(1)
        .unwrap()
        .last_message;
    assert!(feedback.contains("PASSED"));
}

#[tokio::test]
async fn a_setup_error_is_rejected_by_the_pre_check_then_regenerated() {
    let mut llm = cooperative_llm().then(Stage::Generation, [test_answer(1), test_answer(2)]);
    let ws = FakeWorkspace::with_runs([import_error_run(), failing_run()]);
    let outcome = run(&brief(), Variant::Full, &Limits::default(), &mut llm, &ws).await;
    assert_eq!(
        llm.calls_in(Stage::Review),
        1,
        "only the second test reaches the reviewer"
    );
    assert_eq!(outcome.feedback_iterations, 1);
    assert_eq!(
        outcome.test_patch,
        Some(new_file_patch("tests/test_div.py", &test_code(2)))
    );
    let feedback = &llm
        .calls
        .iter()
        .filter(|c| c.stage == Stage::Generation)
        .nth(1)
        .unwrap()
        .last_message;
    assert!(feedback.contains("ModuleNotFoundError"));
}

#[tokio::test]
async fn a_setup_error_the_issue_reports_goes_to_the_reviewer() {
    let mut issue = brief();
    issue.problem_statement =
        "`import pkg.calc` fails with ModuleNotFoundError: No module named 'calcx'".into();
    let mut llm = cooperative_llm();
    let ws = FakeWorkspace::with_runs([import_error_run()]);
    let outcome = run(&issue, Variant::Full, &Limits::default(), &mut llm, &ws).await;
    assert_eq!(llm.calls_in(Stage::Review), 1);
    assert!(outcome.test_patch.is_some());
    assert_eq!(outcome.feedback_iterations, 0);
}

#[tokio::test]
async fn the_feedback_limit_stops_regeneration_and_keeps_the_last_failing_test() {
    let mut llm = cooperative_llm()
        .then(
            Stage::Generation,
            [test_answer(1), test_answer(2), test_answer(3)],
        )
        .always(Stage::Generation, test_answer(4))
        .always(Stage::Review, text(REVIEW_FAIL));
    let ws = FakeWorkspace::with_runs([failing_run()]);
    let limits = Limits {
        max_feedback_iterations: 3,
        ..Limits::default()
    };
    let outcome = run(&brief(), Variant::Full, &limits, &mut llm, &ws).await;
    assert_eq!(outcome.stopped_by.as_deref(), Some("feedback_limit"));
    assert_eq!(outcome.feedback_iterations, 3);
    assert_eq!(outcome.reviews.len(), 4);
    assert_eq!(calls(&outcome, Stage::Generation), 4);
    assert_eq!(
        outcome.test_patch,
        Some(new_file_patch("tests/test_div.py", &test_code(4)))
    );
}

#[tokio::test]
async fn a_budget_stop_during_review_returns_the_test_so_far() {
    let mut llm = cooperative_llm().then(Stage::Review, [Reply::Budget]);
    let ws = FakeWorkspace::with_runs([failing_run()]);
    let outcome = run(&brief(), Variant::Full, &Limits::default(), &mut llm, &ws).await;
    assert_eq!(outcome.stopped_by.as_deref(), Some("budget"));
    assert_eq!(
        outcome.test_patch,
        Some(new_file_patch("tests/test_div.py", &test_code(1)))
    );
    assert!(
        outcome.localization.is_some() && outcome.root_cause.is_some() && outcome.plan.is_some()
    );
    assert!(outcome.reviews.is_empty());
    assert_eq!(
        calls(&outcome, Stage::Review),
        1,
        "the refused call is counted"
    );
}

#[tokio::test]
async fn a_budget_stop_before_generation_returns_the_analysis_without_a_test() {
    let mut llm = cooperative_llm().then(Stage::RootCause, [Reply::Budget]);
    let ws = FakeWorkspace::with_runs([failing_run()]);
    let outcome = run(&brief(), Variant::Full, &Limits::default(), &mut llm, &ws).await;
    assert_eq!(outcome.stopped_by.as_deref(), Some("budget"));
    assert!(outcome.localization.is_some());
    assert!(outcome.root_cause.is_none() && outcome.plan.is_none());
    assert_eq!(outcome.test_patch, None);
    assert_eq!(
        llm.calls_in(Stage::Planning) + llm.calls_in(Stage::Generation),
        0
    );
}

#[tokio::test]
async fn a_budget_stop_keeps_an_earlier_logic_failure_over_a_later_setup_error() {
    let mut llm = cooperative_llm()
        .then(
            Stage::Generation,
            [test_answer(1), test_answer(2), Reply::Budget],
        )
        .then(Stage::Review, [text(REVIEW_FAIL)]);
    let ws = FakeWorkspace::with_runs([failing_run(), import_error_run()]);
    let outcome = run(&brief(), Variant::Full, &Limits::default(), &mut llm, &ws).await;
    assert_eq!(outcome.stopped_by.as_deref(), Some("budget"));
    assert_eq!(outcome.feedback_iterations, 2);
    assert_eq!(
        outcome.test_patch,
        Some(new_file_patch("tests/test_div.py", &test_code(1)))
    );
}

#[tokio::test]
async fn an_llm_failure_stops_with_its_message() {
    let mut llm = cooperative_llm().then(Stage::Planning, [Reply::Fail("HTTP 500")]);
    let ws = FakeWorkspace::with_runs([failing_run()]);
    let outcome = run(&brief(), Variant::Full, &Limits::default(), &mut llm, &ws).await;
    assert_eq!(outcome.stopped_by.as_deref(), Some("llm_error: HTTP 500"));
    assert!(outcome.root_cause.is_some());
    assert_eq!(outcome.test_patch, None);
}

#[tokio::test]
async fn a_prompt_too_long_for_the_model_stops_the_run_as_such() {
    let mut llm = cooperative_llm().then(Stage::Planning, [Reply::TooLong("2048 tokens at most")]);
    let ws = FakeWorkspace::with_runs([failing_run()]);
    let outcome = run(&brief(), Variant::Full, &Limits::default(), &mut llm, &ws).await;
    assert_eq!(
        outcome.stopped_by.as_deref(),
        Some("context_length: 2048 tokens at most")
    );
    assert!(outcome.root_cause.is_some());
    assert_eq!(outcome.test_patch, None);
}

#[tokio::test]
async fn the_per_stage_call_limit_holds_when_the_model_keeps_calling_tools() {
    let grep = Reply::Tools(vec![("grep", r#"{"pattern": "divide"}"#.into())]);
    let mut llm = cooperative_llm().always(Stage::Localization, grep);
    let ws = FakeWorkspace::with_runs([failing_run()]);
    let limits = Limits {
        max_llm_calls_per_stage: 5,
        ..Limits::default()
    };
    let outcome = run(&brief(), Variant::Full, &limits, &mut llm, &ws).await;
    assert_eq!(calls(&outcome, Stage::Localization), 5);
    let offered: Vec<usize> = llm
        .calls
        .iter()
        .filter(|c| c.stage == Stage::Localization)
        .map(|c| c.tools_offered)
        .collect();
    assert_eq!(
        offered,
        vec![3, 3, 3, 3, 0],
        "the last call asks for the answer without tools"
    );
    let last = &llm
        .calls
        .iter()
        .filter(|c| c.stage == Stage::Localization)
        .nth(4)
        .unwrap()
        .last_message;
    assert!(last.contains("final answer"));
    assert_eq!(
        ws.tool_calls.lock().unwrap().len(),
        4,
        "tool calls on the no-tools turn are not run"
    );
    assert!(outcome.localization.is_none());
    assert!(outcome.stages_run.contains(&"localization".to_string()));
    // The run goes on without localization.
    assert!(outcome.test_patch.is_some());
    assert_eq!(outcome.stopped_by, None);
}

#[tokio::test]
async fn malformed_tool_arguments_and_junk_answers_are_survived() {
    let mut llm = cooperative_llm()
        .then(
            Stage::Localization,
            [
                Reply::Tools(vec![
                    ("grep", "{pattern: divide".into()),
                    ("sequential_thinking", "not json at all".into()),
                ]),
                text("I believe the bug is somewhere in calc. {not: json}"),
                text("```json\n{\"unrelated\": true}\n```"),
            ],
        )
        .then(Stage::RootCause, [text("{\"summary\": \"\"}")])
        .then(Stage::Generation, [text("Here is my idea, no code yet.")]);
    let ws = FakeWorkspace::with_runs([failing_run()]);
    let outcome = run(&brief(), Variant::Full, &Limits::default(), &mut llm, &ws).await;
    assert_eq!(calls(&outcome, Stage::Localization), 4);
    assert!(outcome.localization.is_some());
    assert_eq!(
        calls(&outcome, Stage::RootCause),
        2,
        "an empty summary is not an answer"
    );
    assert!(outcome.root_cause.is_some());
    assert_eq!(calls(&outcome, Stage::Generation), 2);
    assert_eq!(
        outcome.feedback_iterations, 0,
        "a reminder within the round is not feedback"
    );
    assert!(outcome.test_patch.is_some());
    let results: Vec<&String> = outcome
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::ToolCall { result, .. } => Some(result),
            _ => None,
        })
        .collect();
    assert!(results[0].starts_with("error: arguments are not valid JSON"));
    assert!(results[1].starts_with("error: sequential_thinking takes a JSON object"));
    let reminder = &llm
        .calls
        .iter()
        .filter(|c| c.stage == Stage::Localization)
        .nth(2)
        .unwrap()
        .last_message;
    assert!(reminder.contains("did not contain the localization JSON"));
}

#[tokio::test]
async fn a_generation_round_without_a_test_counts_as_a_feedback_iteration() {
    let mut llm =
        cooperative_llm().then(Stage::Generation, [text("no code"), text("still no code")]);
    let ws = FakeWorkspace::with_runs([failing_run()]);
    let limits = Limits {
        max_llm_calls_per_stage: 2,
        ..Limits::default()
    };
    let outcome = run(&brief(), Variant::Full, &limits, &mut llm, &ws).await;
    assert_eq!(outcome.feedback_iterations, 1);
    assert_eq!(calls(&outcome, Stage::Generation), 3);
    assert!(outcome.test_patch.is_some());
}

#[tokio::test]
async fn the_test_path_falls_back_to_the_plan_then_the_default() {
    let unnamed = text("```python\ndef test_x():\n    assert False\n```");
    let mut llm = cooperative_llm().always(Stage::Generation, unnamed.clone());
    let ws = FakeWorkspace::with_runs([failing_run()]);
    let outcome = run(&brief(), Variant::Full, &Limits::default(), &mut llm, &ws).await;
    assert_eq!(outcome.test_path.as_deref(), Some("tests/test_div.py"));

    let mut llm = cooperative_llm().always(Stage::Generation, unnamed);
    let outcome = run(
        &brief(),
        Variant::NoPlanning,
        &Limits::default(),
        &mut llm,
        &ws,
    )
    .await;
    assert_eq!(outcome.test_path.as_deref(), Some(DEFAULT_TEST_PATH));
}

#[test]
fn variants_parse_from_their_names_and_unknown_names_list_the_valid_ones() {
    for variant in Variant::ALL {
        assert_eq!(variant.as_str().parse::<Variant>(), Ok(variant));
    }
    let err = "no-ra".parse::<Variant>().unwrap_err().to_string();
    for name in [
        "full",
        "no-localization",
        "no-rca",
        "no-planning",
        "no-review",
    ] {
        assert!(err.contains(name), "{err}");
    }
    assert!(err.contains("no-ra"));
    assert_eq!(Limits::default().max_llm_calls_per_stage, 50);
    assert_eq!(Limits::default().max_feedback_iterations, 20);
}

#[test]
fn localized_files_correct_looks_at_the_top_k_ranked_files() {
    let loc = Localization {
        files: vec![
            Suspect {
                path: "./pkg/a.py".into(),
                ..Default::default()
            },
            Suspect {
                path: "pkg/b.py".into(),
                ..Default::default()
            },
        ],
        functions: vec![Suspect {
            path: "pkg/c.py".into(),
            name: "C.f".into(),
            ..Default::default()
        }],
        lines: vec![],
    };
    let golden = |p: &str| vec![p.to_string()];
    assert!(localized_files_correct(&loc, &golden("pkg/a.py"), 1));
    assert!(!localized_files_correct(&loc, &golden("pkg/b.py"), 1));
    assert!(localized_files_correct(&loc, &golden("pkg/b.py"), 2));
    assert!(localized_files_correct(
        &loc,
        &golden("/testbed/pkg/c.py"),
        3
    ));
    assert!(!localized_files_correct(&loc, &golden("pkg/d.py"), 10));
    assert!(localized_files_correct(
        &loc,
        &["pkg/d.py".into(), "pkg/b.py".into()],
        2
    ));
    assert!(!localized_files_correct(&loc, &[], 3));
    assert!(!localized_files_correct(&loc, &golden("pkg/a.py"), 0));
    assert!(!localized_files_correct(
        &Localization::default(),
        &golden("pkg/a.py"),
        3
    ));
}
