//! One instance graded from its six execution logs: SWT-bench's verdict, and reprobench's own
//! checks beside it (`suspicious`), which change the verdict only when asked (`strict`). Pure.

use crate::grading::execution_log::{self, LogReading};
use crate::grading::injection;
use crate::grading::parsers::{Family, StatusMap, TestStatus};
use crate::grading::rules::{self, Categories, Rules};
use serde::{Deserialize, Serialize};

/// The six executions, in SWT-bench's order: the model's test patch, the golden test patch, no
/// test patch; each before and after the golden code fix.
pub const RUNS: [&str; 6] = [
    "pred_pre",
    "pred_post",
    "gold_pre",
    "gold_post",
    "base_pre",
    "base_post",
];

/// Kinds of suspicious findings.
pub mod finding {
    /// A run printed passes and no failure, yet its test command exited non-zero.
    pub const PASSES_AFTER_FAILED_EXIT: &str = "passes_after_failed_exit";
    /// The test command exited 127: the shell did not find it.
    pub const COMMAND_NOT_FOUND: &str = "command_not_found";
    /// The test command exited 0 and the parser found no test in its log.
    pub const EMPTY_PARSE: &str = "empty_parse";
    /// A patch did not apply with `git apply -v` (so SWT-bench does not apply it) but would with
    /// `patch --fuzz`.
    pub const PATCH_NEEDS_FUZZ: &str = "patch_needs_fuzz";
    /// SWT-bench's own code raises on this log and gives no verdict; reprobench read on.
    pub const SWT_BENCH_RAISES: &str = "swt_bench_raises";
    /// The execution's output outgrew its cap and its middle was left out of the log.
    pub const OUTPUT_TRUNCATED: &str = "output_truncated";
    /// The execution was killed at the timeout; as in SWT-bench its log counts as missing.
    pub const TIMED_OUT: &str = "timed_out";
    /// The parser reads a test's status from text after the runner's closing summary line.
    pub const RESULTS_AFTER_SUMMARY: &str = "results_after_summary";
    /// Lines of one log give a test conflicting statuses: PASSED and FAILED, or ERROR then PASSED.
    pub const CONFLICTING_RESULTS: &str = "conflicting_results";
}

/// One suspicious finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Suspicion {
    /// One of [`finding`]'s kinds.
    pub kind: String,
    /// The execution it concerns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// What was seen, in words.
    pub message: String,
}

impl Suspicion {
    /// A finding about execution `run`.
    pub fn new(kind: &str, run: &str, message: impl Into<String>) -> Suspicion {
        Suspicion {
            kind: kind.into(),
            run: Some(run.into()),
            message: message.into(),
        }
    }
}

/// One execution as the grader sees it.
#[derive(Debug, Clone, Default)]
pub struct RunInput {
    /// Its log; `None` when there is none (never run).
    pub log: Option<String>,
    /// Exit status of its test command, when known.
    pub exit_code: Option<i64>,
    /// Killed at the timeout (its log counts as missing, as in SWT-bench).
    pub timed_out: bool,
    /// What the harness noticed while running it.
    pub findings: Vec<Suspicion>,
}

/// An instance's grade.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InstanceGrade {
    /// S: SWT-bench's success flag (after `strict`, when asked).
    pub resolved: bool,
    /// W: the applicability filter.
    pub applicable: bool,
    /// F→X.
    pub f2x: bool,
    /// F→P.
    pub f2p: bool,
    /// P→P.
    pub p2p: bool,
    /// Categories of the prediction's runs; absent when the model patch did not apply.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tests_pred: Option<Categories>,
    /// Categories of the golden test patch's runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tests_gold: Option<Categories>,
    /// Categories of the runs without a test patch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tests_base: Option<Categories>,
    /// The rules that graded it.
    pub rules: Rules,
    /// reprobench's findings; they change the verdict only under `strict`.
    pub suspicious: Vec<Suspicion>,
    /// The log parser.
    pub parser: Family,
    /// SWT-bench's "patch successfully applied" (from the pred_pre log).
    pub patch_applied: bool,
    /// Prediction tests that are F→P and not F→P without the test patch.
    pub added_f2p: Vec<String>,
    /// Findings were allowed to change the verdict.
    pub strict: bool,
    /// Under `strict`, the verdict differs from SWT-bench's.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub strict_changed: bool,
}

/// Why an instance gets no verdict.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotGraded {
    /// SWT-bench counts an instance whose pred_pre execution left no log as an error.
    #[error(
        "pred_pre has no log ({0}): SWT-bench counts such an instance as an error, not as unresolved"
    )]
    NoPredPreLog(&'static str),
}

fn passes_without_failures(m: &StatusMap) -> bool {
    m.values().any(|s| *s == TestStatus::Passed)
        && !m
            .values()
            .any(|s| matches!(s, TestStatus::Failed | TestStatus::Error))
}

fn findings(run: &str, input: &RunInput, reading: &LogReading) -> Vec<Suspicion> {
    let mut out = input.findings.clone();
    if input.timed_out {
        out.push(Suspicion::new(
            finding::TIMED_OUT,
            run,
            "killed at the timeout; graded as a missing log, as SWT-bench does",
        ));
        return out;
    }
    if let Some(why) = &reading.raises {
        out.push(Suspicion::new(finding::SWT_BENCH_RAISES, run, why.clone()));
    }
    match input.exit_code {
        Some(127) => out.push(Suspicion::new(
            finding::COMMAND_NOT_FOUND,
            run,
            "the test command exited 127: the shell did not find it (check the environment's test_cmd)",
        )),
        Some(0)
            if input.log.is_some()
                && reading.failure_marker.is_none()
                && reading.statuses.is_empty() =>
        {
            out.push(Suspicion::new(
                finding::EMPTY_PARSE,
                run,
                "the test command exited 0 but the parser found no test in its output",
            ))
        }
        _ => {}
    }
    if let Some(code) = input.exit_code
        && code != 0
        && code != 127
        && passes_without_failures(&reading.statuses)
    {
        out.push(Suspicion::new(
            finding::PASSES_AFTER_FAILED_EXIT,
            run,
            format!("the log reports passes and no failure, yet the test command exited {code}"),
        ));
    }
    out.extend(injection::findings(run, reading));
    out
}

/// Grades an instance from its six executions (in [`RUNS`] order).
pub fn grade(
    runs: &[RunInput; 6],
    family: Family,
    rules: Rules,
    strict: bool,
) -> Result<InstanceGrade, NotGraded> {
    if runs[0].timed_out {
        return Err(NotGraded::NoPredPreLog("it was killed at the timeout"));
    }
    if runs[0].log.is_none() {
        return Err(NotGraded::NoPredPreLog("it never ran"));
    }
    let readings: Vec<LogReading> = runs
        .iter()
        .map(|r| {
            let log = if r.timed_out { None } else { r.log.as_deref() };
            execution_log::read(log, family, rules)
        })
        .collect();
    let mut suspicious = Vec::new();
    let mut maps: [StatusMap; 6] = Default::default();
    for (i, (input, reading)) in runs.iter().zip(&readings).enumerate() {
        let found = findings(RUNS[i], input, reading);
        maps[i] = reading.statuses.clone();
        if strict
            && found
                .iter()
                .any(|f| f.kind == finding::PASSES_AFTER_FAILED_EXIT)
        {
            for s in maps[i].values_mut() {
                if *s == TestStatus::Passed {
                    *s = TestStatus::Failed;
                }
            }
        }
        suspicious.extend(found);
    }
    let patch_applied = readings[0].patch_applied;
    let mut v = rules::verdict(&maps, patch_applied, rules);
    let mut strict_changed = false;
    if strict {
        let plain = if suspicious.is_empty() {
            v.clone()
        } else {
            let plain_maps: [StatusMap; 6] = std::array::from_fn(|i| readings[i].statuses.clone());
            rules::verdict(&plain_maps, patch_applied, rules)
        };
        if suspicious
            .iter()
            .any(|f| f.kind != finding::PASSES_AFTER_FAILED_EXIT)
        {
            v.resolved = false;
        }
        strict_changed = plain.resolved != v.resolved
            || plain.applicable != v.applicable
            || plain.f2x != v.f2x
            || plain.f2p != v.f2p
            || plain.p2p != v.p2p;
    }
    let added_f2p = v.added_f2p().into_iter().map(String::from).collect();
    let (tests_pred, tests_gold, tests_base) = match v.tests {
        Some(t) => (Some(t.pred), Some(t.gold), Some(t.base)),
        None => (None, None, None),
    };
    Ok(InstanceGrade {
        resolved: v.resolved,
        applicable: v.applicable,
        f2x: v.f2x,
        f2p: v.f2p,
        p2p: v.p2p,
        tests_pred,
        tests_gold,
        tests_base,
        rules,
        suspicious,
        parser: family,
        patch_applied,
        added_f2p,
        strict,
        strict_changed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const APPLIED: &str = "Checking patch tests/t.py...\nApplied patch tests/t.py cleanly.\n";

    fn run(log: &str, exit: i64) -> RunInput {
        RunInput {
            log: Some(log.to_string()),
            exit_code: Some(exit),
            ..RunInput::default()
        }
    }

    fn six(pred_pre: RunInput, pred_post: RunInput) -> [RunInput; 6] {
        [
            pred_pre,
            pred_post,
            run(&format!("{APPLIED}PASSED tests/t.py::old\n"), 0),
            run(&format!("{APPLIED}PASSED tests/t.py::old\n"), 0),
            run("PASSED tests/t.py::old\n", 0),
            run("PASSED tests/t.py::old\n", 0),
        ]
    }

    fn kinds(g: &InstanceGrade) -> Vec<&str> {
        g.suspicious.iter().map(|s| s.kind.as_str()).collect()
    }

    #[test]
    fn a_reproduction_test_resolves() {
        let runs = six(
            run(
                &format!("{APPLIED}FAILED tests/t.py::new - boom\nPASSED tests/t.py::old\n"),
                1,
            ),
            run(
                &format!("{APPLIED}PASSED tests/t.py::new\nPASSED tests/t.py::old\n"),
                0,
            ),
        );
        let g = grade(&runs, Family::Pytest, Rules::default(), false).unwrap();
        assert!(
            g.resolved && g.applicable && g.f2x && g.f2p && !g.p2p,
            "{g:?}"
        );
        assert_eq!(g.added_f2p, vec!["tests/t.py::new"]);
        assert!(g.suspicious.is_empty(), "{:?}", g.suspicious);
    }

    #[test]
    fn the_exit_code_never_changes_the_verdict_unless_strict() {
        // A crash after the summary: passes printed, exit 139.
        let runs = six(
            run(&format!("{APPLIED}FAILED tests/t.py::new\n"), 1),
            run(&format!("{APPLIED}PASSED tests/t.py::new\n"), 139),
        );
        let g = grade(&runs, Family::Pytest, Rules::default(), false).unwrap();
        assert!(g.resolved);
        assert_eq!(kinds(&g), vec![finding::PASSES_AFTER_FAILED_EXIT]);
        let strict = grade(&runs, Family::Pytest, Rules::default(), true).unwrap();
        assert!(!strict.resolved && strict.strict_changed, "{strict:?}");
    }

    #[test]
    fn other_findings_leave_a_strict_instance_unresolved() {
        let runs = six(
            run(&format!("{APPLIED}FAILED tests/t.py::new\n"), 1),
            run(&format!("{APPLIED}PASSED tests/t.py::new\n"), 0),
        );
        let mut with_fuzz = runs.clone();
        with_fuzz[3].findings.push(Suspicion::new(
            finding::PATCH_NEEDS_FUZZ,
            "gold_post",
            "the golden test patch applies only with fuzz",
        ));
        assert!(
            grade(&with_fuzz, Family::Pytest, Rules::default(), false)
                .unwrap()
                .resolved
        );
        let g = grade(&with_fuzz, Family::Pytest, Rules::default(), true).unwrap();
        assert!(!g.resolved && g.strict_changed);
        let mut empty = runs.clone();
        empty[5] = run("collected 0 items\n", 0);
        let g = grade(&empty, Family::Pytest, Rules::default(), false).unwrap();
        assert_eq!(kinds(&g), vec![finding::EMPTY_PARSE]);
        let mut missing = runs;
        missing[1].exit_code = Some(127);
        let g = grade(&missing, Family::Pytest, Rules::default(), false).unwrap();
        assert!(kinds(&g).contains(&finding::COMMAND_NOT_FOUND));
    }

    #[test]
    fn injected_results_change_only_a_strict_verdict() {
        // The reproduction test fails after the fix too, then prints a PASSED line at exit.
        let forged = format!(
            "{APPLIED}FAILED tests/t.py::new - boom\n=== 1 failed in 0.10s ===\n\
             PASSED tests/t.py::new\n"
        );
        let runs = six(
            run(&format!("{APPLIED}FAILED tests/t.py::new\n"), 1),
            run(&forged, 1),
        );
        let g = grade(&runs, Family::Pytest, Rules::default(), false).unwrap();
        assert!(g.resolved && g.f2p, "SWT-bench's verdict stands: {g:?}");
        assert_eq!(
            kinds(&g),
            vec![
                finding::PASSES_AFTER_FAILED_EXIT,
                finding::RESULTS_AFTER_SUMMARY,
                finding::CONFLICTING_RESULTS
            ]
        );
        assert!(
            g.suspicious
                .iter()
                .all(|s| s.run.as_deref() == Some("pred_post"))
        );
        // Exit 0 (os._exit in an atexit hook): the new findings alone make a strict verdict.
        let mut exit_0 = runs.clone();
        exit_0[1].exit_code = Some(0);
        let plain = grade(&exit_0, Family::Pytest, Rules::default(), false).unwrap();
        let strict = grade(&exit_0, Family::Pytest, Rules::default(), true).unwrap();
        assert_eq!(
            kinds(&strict),
            vec![finding::RESULTS_AFTER_SUMMARY, finding::CONFLICTING_RESULTS]
        );
        assert!(plain.resolved && !strict.resolved && strict.strict_changed);
        assert_eq!(
            (strict.f2p, strict.tests_pred, strict.added_f2p),
            (plain.f2p, plain.tests_pred, plain.added_f2p),
            "only `resolved` moves"
        );
    }

    #[test]
    fn timeouts_grade_as_missing_logs() {
        let mut runs = six(
            run(&format!("{APPLIED}FAILED tests/t.py::new\n"), 1),
            run(&format!("{APPLIED}PASSED tests/t.py::new\n"), 0),
        );
        runs[1].timed_out = true;
        let g = grade(&runs, Family::Pytest, Rules::default(), false).unwrap();
        assert!(!g.resolved);
        assert_eq!(
            g.tests_pred.as_ref().unwrap()["tests/t.py::new"],
            rules::Category::Unmatched
        );
        assert_eq!(kinds(&g), vec![finding::TIMED_OUT]);
        runs[0].timed_out = true;
        assert!(grade(&runs, Family::Pytest, Rules::default(), false).is_err());
    }

    #[test]
    fn an_unapplied_patch_has_no_tests_maps() {
        let runs = six(
            run("error: patch failed\n", 1),
            run("PASSED tests/t.py::new\n", 0),
        );
        let g = grade(&runs, Family::Pytest, Rules::default(), false).unwrap();
        assert!(!g.patch_applied && g.tests_pred.is_none() && !g.applicable);
        let json = serde_json::to_value(&g).unwrap();
        assert!(json.get("tests_pred").is_none());
        assert_eq!(json["rules"], "swt-bench-2025-09");
    }
}
