//! SWT-bench grading: test transitions between the runs before and after the golden code fix,
//! and the instance-level verdicts (resolved, applicability, F→X, F→P, P→P). Pure.
//!
//! Semantics (SWT-bench): for a run X ∈ {pred, gold, base}, each test's status before ("pre")
//! and after ("post") the golden code patch gives a transition. A missing test counts as failing.
//! The prediction's *added* transitions are those it shows that the base run (no test patch)
//! does not show for the same test. `resolved`: at least one added F→P, and no added P→F and no
//! added F→F. Applicable: the patch applied and at least 10% of the base run's tests still run.

use crate::swt::logparse::{TestStatus, TestStatuses};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// A test's transition from before to after the golden fix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Transition {
    /// Fails (or is missing) before, passes after.
    #[serde(rename = "FAIL_TO_PASS")]
    FailToPass,
    /// Passes before and after.
    #[serde(rename = "PASS_TO_PASS")]
    PassToPass,
    /// Fails (or is missing) before and after (present in at least one).
    #[serde(rename = "FAIL_TO_FAIL")]
    FailToFail,
    /// Passes before, fails (or is missing) after.
    #[serde(rename = "PASS_TO_FAIL")]
    PassToFail,
    /// Anything involving a skip.
    #[serde(rename = "UNMATCHED")]
    Unmatched,
}

/// The transition of one test, `None` when it is missing from both runs.
pub fn transition(pre: Option<TestStatus>, post: Option<TestStatus>) -> Option<Transition> {
    use TestStatus::*;
    let failing = |s: Option<TestStatus>| matches!(s, None | Some(Failed) | Some(Error));
    Some(match (pre, post) {
        (None, None) => return None,
        (Some(Skipped), _) | (_, Some(Skipped)) => Transition::Unmatched,
        (Some(Passed), Some(Passed)) => Transition::PassToPass,
        (Some(Passed), _) => Transition::PassToFail,
        (p, Some(Passed)) if failing(p) => Transition::FailToPass,
        _ => Transition::FailToFail,
    })
}

/// Transitions of every test seen in either run.
pub fn transitions(pre: &TestStatuses, post: &TestStatuses) -> BTreeMap<String, Transition> {
    let ids: BTreeSet<&String> = pre.keys().chain(post.keys()).collect();
    ids.into_iter()
        .filter_map(|id| {
            transition(pre.get(id).copied(), post.get(id).copied()).map(|t| (id.clone(), t))
        })
        .collect()
}

/// Instance-level grade of a prediction against the base run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Grade {
    /// S: added F→P, no added P→F, no added F→F.
    pub resolved: bool,
    /// W: the patch applied and ≥ 10% of the base run's tests still run.
    pub applicable: bool,
    /// F→X: an added F→P or F→F.
    pub f2x: bool,
    /// F→P: an added F→P.
    pub f2p: bool,
    /// P→P: an added P→P.
    pub p2p: bool,
    /// Tests with an added F→P.
    pub added_f2p: Vec<String>,
    /// Tests with an added P→F.
    pub added_p2f: Vec<String>,
    /// Tests with an added F→F.
    pub added_f2f: Vec<String>,
    /// Tests with an added P→P.
    pub added_p2p: Vec<String>,
    /// Tests the base run reported.
    pub base_tests: usize,
    /// Of those, how many the prediction's runs still reported.
    pub base_tests_still_run: usize,
}

/// Grades a prediction's transitions against the base run's.
pub fn grade(
    pred: &BTreeMap<String, Transition>,
    base: &BTreeMap<String, Transition>,
    patch_applied: bool,
) -> Grade {
    let added = |kind: Transition| -> Vec<String> {
        pred.iter()
            .filter(|(id, t)| **t == kind && base.get(*id) != Some(&kind))
            .map(|(id, _)| id.clone())
            .collect()
    };
    let added_f2p = added(Transition::FailToPass);
    let added_p2f = added(Transition::PassToFail);
    let added_f2f = added(Transition::FailToFail);
    let added_p2p = added(Transition::PassToPass);
    let base_tests = base.len();
    let base_tests_still_run = base.keys().filter(|id| pred.contains_key(*id)).count();
    let applicable = patch_applied && (base_tests == 0 || base_tests_still_run * 10 >= base_tests);
    Grade {
        resolved: patch_applied
            && !added_f2p.is_empty()
            && added_p2f.is_empty()
            && added_f2f.is_empty(),
        applicable,
        f2x: patch_applied && (!added_f2p.is_empty() || !added_f2f.is_empty()),
        f2p: patch_applied && !added_f2p.is_empty(),
        p2p: patch_applied && !added_p2p.is_empty(),
        added_f2p,
        added_p2f,
        added_f2f,
        added_p2p,
        base_tests,
        base_tests_still_run,
    }
}

/// Makes printed fake "PASSED" lines harmless: when the runner exited non-zero (or was killed)
/// yet no test is reported as failing, no reported pass can be trusted, so passes become failures.
pub fn distrust_passes_on_failed_exit(statuses: &mut TestStatuses, exit_code: Option<i64>) {
    let failed_exit = exit_code != Some(0);
    let any_failure = statuses
        .values()
        .any(|s| matches!(s, TestStatus::Failed | TestStatus::Error));
    if failed_exit && !any_failure {
        for s in statuses.values_mut() {
            if *s == TestStatus::Passed {
                *s = TestStatus::Failed;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TestStatus::*;
    use Transition::*;

    fn statuses(pairs: &[(&str, TestStatus)]) -> TestStatuses {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    fn table(pairs: &[(&str, Transition)]) -> BTreeMap<String, Transition> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn every_transition_category() {
        let cases = [
            (Some(Failed), Some(Passed), Some(FailToPass)),
            (Some(Error), Some(Passed), Some(FailToPass)),
            (None, Some(Passed), Some(FailToPass)),
            (Some(Passed), Some(Passed), Some(PassToPass)),
            (Some(Failed), Some(Failed), Some(FailToFail)),
            (Some(Failed), None, Some(FailToFail)),
            (None, Some(Error), Some(FailToFail)),
            (Some(Passed), Some(Failed), Some(PassToFail)),
            (Some(Passed), None, Some(PassToFail)),
            (Some(Skipped), Some(Passed), Some(Unmatched)),
            (Some(Passed), Some(Skipped), Some(Unmatched)),
            (None, None, None),
        ];
        for (pre, post, want) in cases {
            assert_eq!(transition(pre, post), want, "{pre:?} -> {post:?}");
        }
        let t = transitions(
            &statuses(&[("a", Failed), ("b", Passed)]),
            &statuses(&[("a", Passed), ("c", Passed)]),
        );
        assert_eq!(
            t,
            table(&[("a", FailToPass), ("b", PassToFail), ("c", FailToPass)])
        );
    }

    fn check(
        pred: &[(&str, Transition)],
        base: &[(&str, Transition)],
        applied: bool,
        want: (bool, bool, bool, bool, bool),
    ) {
        let g = grade(&table(pred), &table(base), applied);
        assert_eq!(
            (g.resolved, g.applicable, g.f2x, g.f2p, g.p2p),
            want,
            "pred {pred:?} base {base:?}: {g:?}"
        );
    }

    #[test]
    fn resolved_needs_an_added_f2p_and_nothing_bad() {
        // (resolved, applicable, f2x, f2p, p2p)
        check(
            &[("new", FailToPass)],
            &[],
            true,
            (true, true, true, true, false),
        );
        check(
            &[("new", FailToPass), ("old", PassToPass)],
            &[("old", PassToPass)],
            true,
            (true, true, true, true, false),
        );
        // A test failing before and after: F→F, not resolved.
        check(
            &[("t", FailToFail)],
            &[],
            true,
            (false, true, true, false, false),
        );
        check(
            &[("t", FailToPass), ("u", FailToFail)],
            &[],
            true,
            (false, true, true, true, false),
        );
        // A test passing before and after: P→P, not resolved.
        check(
            &[("t", PassToPass)],
            &[],
            true,
            (false, true, false, false, true),
        );
        // An added P→F spoils it.
        check(
            &[("t", FailToPass), ("old", PassToFail)],
            &[("old", PassToPass)],
            true,
            (false, true, true, true, false),
        );
        // F→P already in the base run is not added.
        check(
            &[("t", FailToPass)],
            &[("t", FailToPass)],
            true,
            (false, true, false, false, false),
        );
        // F→F already in the base run is not added: still resolved.
        check(
            &[("t", FailToPass), ("flaky", FailToFail)],
            &[("flaky", FailToFail)],
            true,
            (true, true, true, true, false),
        );
        // Unmatched never counts.
        check(
            &[("t", Unmatched)],
            &[],
            true,
            (false, true, false, false, false),
        );
        // A patch that did not apply gets nothing.
        check(
            &[("t", FailToPass)],
            &[],
            false,
            (false, false, false, false, false),
        );
        // Nothing at all (empty prediction).
        check(&[], &[], true, (false, true, false, false, false));
    }

    #[test]
    fn applicability_needs_a_tenth_of_the_base_tests() {
        let base: Vec<(String, Transition)> =
            (0..20).map(|i| (format!("b{i}"), PassToPass)).collect();
        let base_ref: Vec<(&str, Transition)> =
            base.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        check(
            &[("b0", PassToPass), ("new", FailToPass)],
            &base_ref,
            true,
            (true, false, true, true, false),
        );
        check(
            &[("b0", PassToPass), ("b1", PassToPass), ("new", FailToPass)],
            &base_ref,
            true,
            (true, true, true, true, false),
        );
    }

    #[test]
    fn fake_passes_after_a_failed_exit_are_not_believed() {
        let mut s = statuses(&[("t", Passed)]);
        distrust_passes_on_failed_exit(&mut s, Some(1));
        assert_eq!(s["t"], Failed);
        let mut s = statuses(&[("t", Passed)]);
        distrust_passes_on_failed_exit(&mut s, None);
        assert_eq!(s["t"], Failed, "killed at the timeout");
        let mut s = statuses(&[("t", Passed), ("u", Failed)]);
        distrust_passes_on_failed_exit(&mut s, Some(1));
        assert_eq!(s["t"], Passed, "a real failure explains the exit code");
        let mut s = statuses(&[("t", Passed)]);
        distrust_passes_on_failed_exit(&mut s, Some(0));
        assert_eq!(s["t"], Passed);
    }
}
