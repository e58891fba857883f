//! The prompts of each stage: a system prompt and the user message that starts it.
//!
//! Every system prompt's first line is a fixed stage marker, `reproagent stage: <stage>` with
//! `<stage>` one of `localization`, `root-cause`, `planning`, `generation`, `review` (see
//! [`stage_marker`]); scripted test servers and logs can match on it. Later stages show the
//! earlier stages' outputs when those stages ran and produced one, and say so when they did not
//! (a variant skipped the stage, or it gave no answer), asking the model to work it out itself.

use super::parse::{RunSignal, output_excerpt};
use super::types::{Localization, ReviewVerdict, RootCause, TestPlan};
use crate::{InstanceBrief, TestRun};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::fmt::Write;

/// The prefix of every system prompt's first line.
pub const STAGE_MARKER_PREFIX: &str = "reproagent stage: ";

/// How many characters of a test's output a prompt shows.
pub const OUTPUT_EXCERPT_CHARS: usize = 6000;

/// The name of the built-in reflection tool (handled by the agent, not the workspace).
pub const THINK_TOOL: &str = "sequential_thinking";

/// A ReProAgent stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stage {
    /// Hierarchical bug localization.
    Localization,
    /// Root-cause analysis along the execution path.
    RootCause,
    /// Assertion-aware test planning.
    Planning,
    /// Test generation (and regeneration from feedback).
    Generation,
    /// Triadic review of a failing candidate.
    Review,
}

impl Stage {
    /// The stage's name in markers, logs and call counts.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Localization => "localization",
            Stage::RootCause => "root-cause",
            Stage::Planning => "planning",
            Stage::Generation => "generation",
            Stage::Review => "review",
        }
    }
}

/// The first line of `stage`'s system prompt: `reproagent stage: <name>`.
pub fn stage_marker(stage: Stage) -> String {
    format!("{STAGE_MARKER_PREFIX}{}", stage.as_str())
}

/// The stage whose marker opens `system_prompt`, if any (what scripted servers match on).
pub fn stage_of_system_prompt(system_prompt: &str) -> Option<Stage> {
    let name = system_prompt
        .lines()
        .next()?
        .strip_prefix(STAGE_MARKER_PREFIX)?;
    [
        Stage::Localization,
        Stage::RootCause,
        Stage::Planning,
        Stage::Generation,
        Stage::Review,
    ]
    .into_iter()
    .find(|s| s.as_str() == name.trim())
}

/// The outputs of earlier stages available to a later one (`None`: skipped or no answer).
#[derive(Debug, Clone, Copy, Default)]
pub struct Findings<'a> {
    /// Localization output.
    pub localization: Option<&'a Localization>,
    /// Root-cause output.
    pub root_cause: Option<&'a RootCause>,
    /// Test plan.
    pub plan: Option<&'a TestPlan>,
}

const ROLE: &str = "You are one stage of ReProAgent, an agent that turns a GitHub issue about a \
Python repository into a reproduction test: a test that fails on the repository's current, buggy \
code because of the reported bug, and passes once the bug is fixed.";

const TOOL_USE: &str = "Explore the repository with the tools you are given: text search (grep), \
file-name search (glob), reading files or line ranges (read_file), and the code graph \
(code_graph: definitions, callers, callees, class structure, imports), plus whatever else is \
offered. Use sequential_thinking to break the stage into steps, record hypotheses, and revise or \
branch earlier thoughts when evidence contradicts them. Do not modify repository files.";

/// The system prompt of `stage`, starting with its marker line.
pub fn system_prompt(stage: Stage) -> String {
    let body = match stage {
        Stage::Localization => LOCALIZATION_SYSTEM,
        Stage::RootCause => ROOT_CAUSE_SYSTEM,
        Stage::Planning => PLANNING_SYSTEM,
        Stage::Generation => GENERATION_SYSTEM,
        Stage::Review => REVIEW_SYSTEM,
    };
    let tools = if stage == Stage::Review { "" } else { TOOL_USE };
    format!("{}\n\n{ROLE}\n\n{body}\n\n{tools}", stage_marker(stage))
        .trim_end()
        .to_string()
}

const LOCALIZATION_SYSTEM: &str = "\
Your stage: bug localization by hierarchical analysis. Find the code the issue is about, \
narrowing from files to functions and classes to lines.

How to work:
1. Turn the issue into a search query: the symptoms, error messages and exception names, and \
every file, module, class and function it names (stack traces are especially useful).
2. Collect evidence two ways: keyword search for those names, messages, configuration options \
and line numbers; and the code graph, to follow call chains and imports across files and see how \
a fault could travel to the reported symptom.
3. Read the implementations of candidate files. Form hypotheses about where the fault lies and \
use them to reformulate your next searches; repeat until the candidates are well supported.
4. Inside each suspicious file, rank functions and classes by relevance to the issue and by \
structural closeness (calls, dependencies) to what you already found. Then narrow to line \
ranges: conditions, error handling, and the data flow that produces the wrong behaviour.

When you are done, reply with one JSON object and nothing else:
{
  \"files\": [{\"path\": \"pkg/module.py\", \"rationale\": \"...\", \"confidence\": 0.0}],
  \"functions\": [{\"path\": \"pkg/module.py\", \"name\": \"Class.method\", \"rationale\": \"...\", \"confidence\": 0.0}],
  \"lines\": [{\"path\": \"pkg/module.py\", \"start_line\": 1, \"end_line\": 2, \"rationale\": \"...\", \"confidence\": 0.0}]
}
Order each list from most to least suspicious. Paths are relative to the repository root. Every \
entry needs a rationale grounded in what you read, and a confidence between 0 and 1.";

const ROOT_CAUSE_SYSTEM: &str = "\
Your stage: root-cause analysis along the execution path. Explain why the reported failure \
happens, so that a later stage can trigger it in a test.

How to work:
1. Read the symptoms off the issue: exception types, error messages, wrong return values, wrong \
state.
2. Reconstruct the execution path from an entry point a user or test would call down to the point \
of failure, retrieving the functions, classes and dependencies along it as you go. If no \
suspicious locations are given, find the relevant code yourself first.
3. Find the logical defect: compare the behaviour the issue expects with what the code does, and \
name the pattern (wrong condition, missed case, boundary handling, wrong type or value, API \
misuse, ...).
4. State a root-cause hypothesis that says where the defect is and why it produces the symptoms. \
Check it against the code; gather more evidence and revise it until it explains both the \
symptoms and the code you read.

When you are done, reply with one JSON object and nothing else:
{
  \"summary\": \"the fault mechanism in a few sentences\",
  \"error_category\": \"e.g. logic error, boundary handling, API misuse\",
  \"execution_path\": [\"path.py:LINE function - what happens here\", \"...\"],
  \"trigger_conditions\": [\"what must hold (inputs, configuration, state, versions) for the failure to occur\"],
  \"confidence\": 0.0
}";

const PLANNING_SYSTEM: &str = "\
Your stage: assertion-aware test planning. Turn the analysis into a concrete plan for a single \
reproduction test, so that the test is structurally sound and misses nothing.

How to work:
1. Trigger conditions: from the root-cause analysis if you have one (otherwise from the issue and \
the code), derive the minimal conditions and key constraints that expose the bug.
2. Reproduction setup: look at the project's existing tests near the affected code to learn its \
conventions: where tests live, how they are named and run, base classes, fixtures, settings or \
app configuration, helper utilities. Decide the preconditions and environment the test needs \
(initialization, configuration, required state, version-specific behaviour), and the smallest \
inputs, parameter combinations and boundary values that trigger the bug.
3. Assertions: decide what observable signal shows the bug (exception and message, wrong return \
value, wrong internal state, output) and how buggy and intended behaviour differ. The assertions \
must check the intended behaviour, so that the test fails now and passes after a fix.

When you are done, reply with one JSON object and nothing else:
{
  \"environment_constraints\": [\"setup and initial state the test needs\"],
  \"minimal_inputs\": [\"inputs and parameter values that trigger the bug\"],
  \"expected_assertions\": [\"intended vs buggy behaviour, and what to assert\"],
  \"test_path\": \"path/of/a/new/test_file.py relative to the repository root, where the project's test runner collects it\",
  \"test_name\": \"test_function_name\"
}";

const GENERATION_SYSTEM: &str = "\
Your stage: test generation. Write ONE new pytest test file that reproduces the issue.

Requirements:
- It must FAIL on the current, buggy code because of the bug the issue describes, and PASS once \
the bug is fixed.
- Assert the intended behaviour. Do not assert the buggy behaviour, do not catch the bug's \
exception to make the test pass, and do not use skip or xfail.
- Reach the suspicious code through the setup and inputs that trigger the bug; keep the test \
minimal and self-contained (any configuration it needs, such as settings, is done in the file).
- Import only the project and the dependencies installed with it. Create a new file; do not edit \
existing ones.
- Check names, signatures and imports with the tools before you answer when unsure.

Answer with the file's path relative to the repository root and its complete contents, exactly \
in this form:
Test file: path/to/test_file.py
```python
# the complete test file
```
Your test will be run on the buggy code, and you may get the result and a review back to revise \
it; then answer again in the same form with the complete revised file.";

const REVIEW_SYSTEM: &str = "\
Your stage: triadic review. You are given the issue, a candidate reproduction test, and the \
result of running that test on the buggy code. Decide whether the test truly reproduces the \
issue, by three checks:
1. aligns_with_issue: the test exercises the functionality the issue is about, under the issue's \
trigger conditions, with assertions about the behaviour the issue says is wrong.
2. failure_from_test_logic: the failure comes from the test's own logic (its assertions, or the \
bug's exception raised by the code under test), not from something incidental: syntax errors, \
import or module errors, missing fixtures or dependencies, a misconfigured environment, or \
mistakes in how the test itself calls the code.
3. matches_reported_symptom: the observed failure matches the issue's error message, exception \
type, wrong value, or overall failure pattern.

Reply with one JSON object and nothing else:
{
  \"aligns_with_issue\": true,
  \"failure_from_test_logic\": true,
  \"matches_reported_symptom\": true,
  \"feedback\": \"when a check fails: what is wrong and concretely how to revise the test\"
}";

fn issue_section(brief: &InstanceBrief) -> String {
    let mut out = format!(
        "Repository: {}\n\n<issue>\n{}\n</issue>\n",
        brief.repo,
        brief.problem_statement.trim()
    );
    if !brief.hints.trim().is_empty() {
        let _ = write!(out, "\n<hints>\n{}\n</hints>\n", brief.hints.trim());
    }
    out
}

fn localization_section(loc: Option<&Localization>) -> String {
    let Some(loc) = loc else {
        return "Suspicious locations: not available (bug localization was not run or gave no \
answer). Find the relevant code yourself.\n"
            .into();
    };
    let mut out =
        String::from("Suspicious locations (from bug localization, most suspicious first):\n");
    for f in &loc.files {
        let _ = writeln!(
            out,
            "- file {} (confidence {:.2}): {}",
            f.path, f.confidence, f.rationale
        );
    }
    for f in &loc.functions {
        let _ = writeln!(
            out,
            "- {} in {} (confidence {:.2}): {}",
            f.name, f.path, f.confidence, f.rationale
        );
    }
    for l in &loc.lines {
        let _ = writeln!(
            out,
            "- lines {}-{} of {} (confidence {:.2}): {}",
            l.start_line, l.end_line, l.path, l.confidence, l.rationale
        );
    }
    out
}

fn bullet_list(out: &mut String, title: &str, items: &[String]) {
    if items.is_empty() {
        return;
    }
    let _ = writeln!(out, "{title}:");
    for item in items {
        let _ = writeln!(out, "  - {item}");
    }
}

fn root_cause_section(rc: Option<&RootCause>) -> String {
    let Some(rc) = rc else {
        return "Root-cause analysis: not available (it was not run or gave no answer). Work out \
how the bug is triggered from the issue and the code.\n"
            .into();
    };
    let mut out = format!(
        "Root-cause analysis (confidence {:.2}):\nSummary: {}\nError category: {}\n",
        rc.confidence, rc.summary, rc.error_category
    );
    bullet_list(&mut out, "Execution path", &rc.execution_path);
    bullet_list(&mut out, "Trigger conditions", &rc.trigger_conditions);
    out
}

fn plan_section(plan: Option<&TestPlan>) -> String {
    let Some(plan) = plan else {
        return "Test plan: not available (planning was not run or gave no answer). Decide the \
setup, inputs and assertions yourself, following the project's test conventions.\n"
            .into();
    };
    let mut out = String::from("Test plan:\n");
    bullet_list(
        &mut out,
        "Environment constraints",
        &plan.environment_constraints,
    );
    bullet_list(&mut out, "Minimal inputs", &plan.minimal_inputs);
    bullet_list(&mut out, "Expected assertions", &plan.expected_assertions);
    if !plan.test_path.trim().is_empty() {
        let _ = writeln!(out, "Suggested test file: {}", plan.test_path);
    }
    if !plan.test_name.trim().is_empty() {
        let _ = writeln!(out, "Suggested test name: {}", plan.test_name);
    }
    out
}

/// The localization stage's first user message.
pub fn localization_user(brief: &InstanceBrief) -> String {
    format!(
        "{}\nLocalize the code responsible for this issue, from files down to functions/classes \
and lines, then reply with the JSON object.",
        issue_section(brief)
    )
}

/// The root-cause stage's first user message.
pub fn root_cause_user(brief: &InstanceBrief, findings: Findings<'_>) -> String {
    format!(
        "{}\n{}\nAnalyse the root cause along the execution path, then reply with the JSON object.",
        issue_section(brief),
        localization_section(findings.localization)
    )
}

/// The planning stage's first user message.
pub fn planning_user(brief: &InstanceBrief, findings: Findings<'_>) -> String {
    format!(
        "{}\n{}\n{}\nPlan the reproduction test, then reply with the JSON object.",
        issue_section(brief),
        localization_section(findings.localization),
        root_cause_section(findings.root_cause)
    )
}

/// The generation stage's first user message.
pub fn generation_user(brief: &InstanceBrief, findings: Findings<'_>) -> String {
    format!(
        "{}\n{}\n{}\n{}\nWrite the reproduction test and answer with its path and a ```python block.",
        issue_section(brief),
        localization_section(findings.localization),
        root_cause_section(findings.root_cause),
        plan_section(findings.plan)
    )
}

fn run_section(run: &TestRun, signal: &RunSignal) -> String {
    let exit = run
        .exit_code
        .map_or_else(|| "none".to_string(), |c| c.to_string());
    format!(
        "Exit code: {exit}{}\nAutomatic classification: {}\n<output>\n{}\n</output>\n",
        if run.timed_out { " (timed out)" } else { "" },
        signal.describe(),
        output_excerpt(&run.output, OUTPUT_EXCERPT_CHARS).trim_end()
    )
}

/// The review stage's user message: the issue, the test, and its run on the buggy code.
pub fn review_user(
    brief: &InstanceBrief,
    test_path: &str,
    test_code: &str,
    run: &TestRun,
    signal: &RunSignal,
) -> String {
    format!(
        "{}\nCandidate reproduction test `{test_path}`:\n```python\n{}\n```\n\nResult of running \
it on the buggy code:\n{}\nReview the test with the three checks and reply with the JSON object.",
        issue_section(brief),
        test_code.trim_end(),
        run_section(run, signal)
    )
}

/// Why a candidate was sent back for revision.
#[derive(Debug, Clone, PartialEq)]
pub enum Rejection<'a> {
    /// The test passed on the buggy code.
    PassedOnBuggyCode,
    /// The deterministic pre-check found the failure was not from the test's logic.
    PreCheck,
    /// The triadic review failed.
    Review(&'a ReviewVerdict),
    /// The reviewer gave no usable verdict.
    ReviewUnavailable,
}

/// The feedback message sent back to the generation stage after a rejected candidate.
pub fn regeneration_feedback(
    test_path: &str,
    run: &TestRun,
    signal: &RunSignal,
    rejection: &Rejection<'_>,
) -> String {
    let mut out = format!(
        "Your test `{test_path}` was run on the buggy code.\n{}\n",
        run_section(run, signal)
    );
    match rejection {
        Rejection::PassedOnBuggyCode => out.push_str(
            "The test PASSED, so it does not reproduce the issue. Rework the inputs, setup and \
assertions so that the bug makes the test fail.\n",
        ),
        Rejection::PreCheck => out.push_str(
            "The failure is not caused by the test's logic but by a setup problem (imports, \
syntax, fixtures, collection, configuration, or a timeout). Fix it so that the test reaches the \
buggy code and fails on its assertion.\n",
        ),
        Rejection::Review(verdict) => {
            let mark = |ok: bool| if ok { "yes" } else { "NO" };
            let _ = write!(
                out,
                "The test failed, but the review did not accept it as a reproduction:\n\
- aligned with the issue: {}\n- failure caused by the test's logic: {}\n- matches the reported \
symptom: {}\nReviewer's feedback: {}\n",
                mark(verdict.aligns_with_issue),
                mark(verdict.failure_from_test_logic),
                mark(verdict.matches_reported_symptom),
                if verdict.feedback.trim().is_empty() {
                    "(none)"
                } else {
                    verdict.feedback.trim()
                }
            );
        }
        Rejection::ReviewUnavailable => out.push_str(
            "The test failed, but the reviewer could not confirm that the failure matches the \
issue. Make the assertions target the issue's reported symptom precisely.\n",
        ),
    }
    out.push_str(
        "Revise the test (preconditions, inputs and assertions) and answer again with the path and \
the complete file in a ```python block.",
    );
    out
}

/// Sent when the model's answer did not contain the stage's required output.
pub fn format_reminder(stage: Stage) -> String {
    match stage {
        Stage::Generation => "Your reply did not contain the test file. Answer with `Test file: \
<path>` followed by the complete file in a ```python block."
            .into(),
        _ => format!(
            "Your reply did not contain the {} JSON object in the required shape. Reply with that \
JSON object only.",
            stage.as_str()
        ),
    }
}

/// Sent (with no tools offered) when a stage's call limit is reached: answer now.
pub fn final_answer_request(stage: Stage) -> String {
    format!(
        "You have reached this stage's limit of tool use. Using what you have found so far, give \
your final answer now, with no more tool calls. {}",
        match stage {
            Stage::Generation =>
                "Answer with `Test file: <path>` and the complete file in a \
```python block.",
            _ => "Reply with the JSON object only.",
        }
    )
}

/// The OpenAI function spec of the built-in sequential-thinking tool.
pub fn think_tool_spec() -> Value {
    json!({
        "type": "function",
        "function": {
            "name": THINK_TOOL,
            "description": "Record one step of your reasoning: break the task into steps, state a \
    hypothesis, reflect on evidence, revise an earlier thought or branch to an alternative. Returns \
    the state of your thought sequence; it does not touch the repository.",
            "parameters": {
                "type": "object",
                "properties": {
                    "thought": {"type": "string", "description": "The current thinking step."},
                    "thought_number": {"type": "integer", "minimum": 1},
                    "total_thoughts": {"type": "integer", "minimum": 1, "description": "Current estimate, may change."},
                    "next_thought_needed": {"type": "boolean"},
                    "is_revision": {"type": "boolean"},
                    "revises_thought": {"type": "integer", "minimum": 1},
                    "branch_from_thought": {"type": "integer", "minimum": 1}
                },
                "required": ["thought", "thought_number", "total_thoughts", "next_thought_needed"]
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn brief() -> InstanceBrief {
        InstanceBrief {
            instance_id: "o__r-1".into(),
            repo: "o/r".into(),
            problem_statement: "f(0) raises ZeroDivisionError".into(),
            hints: String::new(),
        }
    }

    #[test]
    fn every_system_prompt_starts_with_its_marker() {
        for stage in [
            Stage::Localization,
            Stage::RootCause,
            Stage::Planning,
            Stage::Generation,
            Stage::Review,
        ] {
            let prompt = system_prompt(stage);
            assert_eq!(
                prompt.lines().next().unwrap(),
                format!("reproagent stage: {}", stage.as_str())
            );
            assert_eq!(stage_of_system_prompt(&prompt), Some(stage));
        }
        assert_eq!(stage_of_system_prompt("You are helpful"), None);
    }

    #[test]
    fn later_stages_show_earlier_outputs_or_say_they_are_missing() {
        let without = generation_user(&brief(), Findings::default());
        assert!(without.contains("Suspicious locations: not available"));
        assert!(without.contains("Root-cause analysis: not available"));
        assert!(without.contains("Test plan: not available"));
        assert!(without.contains("f(0) raises ZeroDivisionError"));

        let loc = Localization {
            files: vec![super::super::types::Suspect {
                path: "pkg/f.py".into(),
                rationale: "defines f".into(),
                confidence: 0.9,
                ..Default::default()
            }],
            ..Default::default()
        };
        let rc = RootCause {
            summary: "divides by its argument".into(),
            execution_path: vec!["pkg/f.py:3 f".into()],
            ..Default::default()
        };
        let plan = TestPlan {
            expected_assertions: vec!["f(0) == 0".into()],
            test_path: "tests/test_f.py".into(),
            ..Default::default()
        };
        let with = generation_user(
            &brief(),
            Findings {
                localization: Some(&loc),
                root_cause: Some(&rc),
                plan: Some(&plan),
            },
        );
        assert!(with.contains("file pkg/f.py (confidence 0.90): defines f"));
        assert!(with.contains("Summary: divides by its argument"));
        assert!(with.contains("  - pkg/f.py:3 f"));
        assert!(with.contains("Suggested test file: tests/test_f.py"));
        assert!(!with.contains("not available"));
    }

    #[test]
    fn feedback_names_the_failed_review_checks() {
        let verdict = ReviewVerdict {
            aligns_with_issue: true,
            failure_from_test_logic: true,
            matches_reported_symptom: false,
            feedback: "assert the message".into(),
        };
        let run = TestRun {
            exit_code: Some(1),
            timed_out: false,
            output: "E   AssertionError".into(),
        };
        let signal = RunSignal::Failed {
            exception: Some("AssertionError".into()),
        };
        let text = regeneration_feedback("t.py", &run, &signal, &Rejection::Review(&verdict));
        assert!(text.contains("matches the reported symptom: NO"));
        assert!(text.contains("aligned with the issue: yes"));
        assert!(text.contains("assert the message"));
        assert!(text.contains("Exit code: 1"));
    }
}
