//! SWT-bench's grading rules, as its code applies them (`src/grading.py`, `figures/util.py`),
//! in two versions. Pure.
//!
//! * Per pair of runs (before/after the golden code fix) every id in either status map gets a
//!   category. Only a literal PASSED or FAILED counts; any other status, or no status, is "x".
//! * `resolved` (S): the prediction's FAIL_TO_PASS tests include every base FAIL_TO_PASS test and
//!   at least one more, and its PASS_TO_FAIL and FAIL_TO_FAIL tests are all base ones too.
//! * `applicable` (W): the number of tests in the prediction's categories is at least a tenth of
//!   the number in the base runs' (compared as floating point, as Python does).
//! * F→X, F→P, P→P: a prediction test in that category (F→X: FAIL_TO_PASS or FAIL_TO_FAIL) that
//!   the base runs do not have in it.
//!
//! The two versions differ where SWT-bench's code changed: commit 0816600 (2025-09-11) stopped
//! counting failed→x and x→x tests as FAIL_TO_FAIL, and the sympy parser's status must be
//! followed by whitespace since the same release.

use crate::grading::parsers::{StatusMap, TestStatus};
pub use reprobench_domain::grading::Rules;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// A test's category across a pair of runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Category {
    /// failed or x → passed.
    #[serde(rename = "FAIL_TO_PASS")]
    FailToPass,
    /// passed → passed.
    #[serde(rename = "PASS_TO_PASS")]
    PassToPass,
    /// failed or x → failed (2024 rules: also failed → x and x → x).
    #[serde(rename = "FAIL_TO_FAIL")]
    FailToFail,
    /// passed → failed or x.
    #[serde(rename = "PASS_TO_FAIL")]
    PassToFail,
    /// failed → x and x → x (2025-09 rules; none under the 2024 rules).
    #[serde(rename = "UNMATCHED")]
    Unmatched,
}

/// Test id → category.
pub type Categories = BTreeMap<String, Category>;

#[derive(Clone, Copy, PartialEq)]
enum Seen {
    Passed,
    Failed,
    X,
}

fn seen(map: &StatusMap, id: &str) -> Seen {
    match map.get(id) {
        Some(TestStatus::Passed) => Seen::Passed,
        Some(TestStatus::Failed) => Seen::Failed,
        _ => Seen::X,
    }
}

/// The category of every id of `pre` or `post`.
pub fn categorize(pre: &StatusMap, post: &StatusMap, rules: Rules) -> Categories {
    let ids: BTreeSet<&String> = pre.keys().chain(post.keys()).collect();
    ids.into_iter()
        .map(|id| {
            use Seen::*;
            let c = match (seen(pre, id), seen(post, id)) {
                (Passed, Passed) => Category::PassToPass,
                (Passed, _) => Category::PassToFail,
                (_, Passed) => Category::FailToPass,
                (_, Failed) => Category::FailToFail,
                (Failed | X, X) => match rules {
                    Rules::SwtBench202509 => Category::Unmatched,
                    Rules::SwtBench2024 => Category::FailToFail,
                },
            };
            (id.clone(), c)
        })
        .collect()
}

/// The categories of the three pairs of runs.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct TestCategories {
    /// The prediction's runs.
    pub pred: Categories,
    /// The golden test patch's runs (reported only; no verdict reads them).
    pub gold: Categories,
    /// The runs without a test patch.
    pub base: Categories,
}

/// An instance's verdict.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Verdict {
    /// S.
    pub resolved: bool,
    /// W.
    pub applicable: bool,
    /// F→X.
    pub f2x: bool,
    /// F→P.
    pub f2p: bool,
    /// P→P.
    pub p2p: bool,
    /// The categories; `None` when the model patch did not apply (then every flag is false).
    pub tests: Option<TestCategories>,
}

fn with(c: &Categories, cat: Category) -> BTreeSet<&str> {
    c.iter()
        .filter(|(_, k)| **k == cat)
        .map(|(id, _)| id.as_str())
        .collect()
}

impl Verdict {
    /// The verdict of an applied patch from the categories of its runs.
    pub fn of(tests: TestCategories) -> Verdict {
        let (pred, base) = (&tests.pred, &tests.base);
        let new_in = |cat: Category| -> BTreeSet<&str> {
            let b = with(base, cat);
            with(pred, cat)
                .into_iter()
                .filter(|id| !b.contains(id))
                .collect()
        };
        let base_f2p = with(base, Category::FailToPass);
        let pred_f2p = with(pred, Category::FailToPass);
        let new_f2p = new_in(Category::FailToPass);
        let new_p2f = new_in(Category::PassToFail);
        let new_f2f = new_in(Category::FailToFail);
        let resolved = pred_f2p.is_superset(&base_f2p)
            && !new_f2p.is_empty()
            && new_p2f.is_empty()
            && new_f2f.is_empty();
        let applicable = pred.len() as f64 >= 0.1 * base.len() as f64;
        let (f2x, f2p) = (
            !new_f2p.is_empty() || !new_f2f.is_empty(),
            !new_f2p.is_empty(),
        );
        let p2p = !new_in(Category::PassToPass).is_empty();
        Verdict {
            resolved,
            applicable,
            f2x,
            f2p,
            p2p,
            tests: Some(tests),
        }
    }

    /// Prediction tests that are FAIL_TO_PASS and not so in the base runs (SWT-bench's `added_f2p`).
    pub fn added_f2p(&self) -> Vec<&str> {
        let Some(t) = &self.tests else {
            return vec![];
        };
        let b = with(&t.base, Category::FailToPass);
        with(&t.pred, Category::FailToPass)
            .into_iter()
            .filter(|id| !b.contains(id))
            .collect()
    }
}

/// SWT-bench's verdict from the six status maps (pred, gold, base × pre, post).
pub fn verdict(maps: &[StatusMap; 6], patch_applied: bool, rules: Rules) -> Verdict {
    if !patch_applied {
        return Verdict::default();
    }
    Verdict::of(TestCategories {
        pred: categorize(&maps[0], &maps[1], rules),
        gold: categorize(&maps[2], &maps[3], rules),
        base: categorize(&maps[4], &maps[5], rules),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use Category::*;
    use TestStatus::*;

    fn statuses(pairs: &[(&str, TestStatus)]) -> StatusMap {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    fn cat(pre: Option<TestStatus>, post: Option<TestStatus>, rules: Rules) -> Category {
        let m = |s: Option<TestStatus>| s.map(|s| statuses(&[("t", s)])).unwrap_or_default();
        categorize(&m(pre), &m(post), rules)["t"]
    }

    #[test]
    fn only_passed_and_failed_count_as_statuses() {
        let now = Rules::SwtBench202509;
        let cases = [
            (Some(Failed), Some(Passed), FailToPass),
            (Some(Error), Some(Passed), FailToPass),
            (None, Some(Passed), FailToPass),
            (Some(Skipped), Some(Passed), FailToPass),
            (Some(Passed), Some(Passed), PassToPass),
            (Some(Failed), Some(Failed), FailToFail),
            (None, Some(Failed), FailToFail),
            (Some(Error), Some(Failed), FailToFail),
            (Some(Passed), Some(Failed), PassToFail),
            (Some(Passed), None, PassToFail),
            (Some(Passed), Some(Error), PassToFail),
            (Some(Passed), Some(Skipped), PassToFail),
            (Some(Failed), None, Unmatched),
            (Some(Failed), Some(Error), Unmatched),
            (Some(Error), Some(Error), Unmatched),
            (Some(Skipped), Some(Other), Unmatched),
            (None, Some(Error), Unmatched),
        ];
        for (pre, post, want) in cases {
            assert_eq!(cat(pre, post, now), want, "{pre:?} -> {post:?}");
        }
    }

    #[test]
    fn the_2024_rules_count_unmatched_tests_as_fail_to_fail() {
        let old = Rules::SwtBench2024;
        assert_eq!(cat(Some(Error), Some(Error), old), FailToFail);
        assert_eq!(cat(Some(Failed), None, old), FailToFail);
        assert_eq!(cat(None, Some(Skipped), old), FailToFail);
        assert_eq!(cat(Some(Passed), None, old), PassToFail);
        assert_eq!(cat(Some(Failed), Some(Passed), old), FailToPass);
    }

    fn table(pairs: &[(&str, Category)]) -> Categories {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    /// (resolved, applicable, f2x, f2p, p2p) of pred against base.
    fn check(
        pred: &[(&str, Category)],
        base: &[(&str, Category)],
        want: (bool, bool, bool, bool, bool),
    ) {
        let v = Verdict::of(TestCategories {
            pred: table(pred),
            gold: Categories::new(),
            base: table(base),
        });
        assert_eq!(
            (v.resolved, v.applicable, v.f2x, v.f2p, v.p2p),
            want,
            "pred {pred:?} base {base:?}"
        );
    }

    #[test]
    fn resolved_needs_a_new_f2p_every_base_f2p_and_nothing_new_failing() {
        check(&[("new", FailToPass)], &[], (true, true, true, true, false));
        check(&[("t", FailToFail)], &[], (false, true, true, false, false));
        check(
            &[("t", FailToPass), ("u", FailToFail)],
            &[],
            (false, true, true, true, false),
        );
        check(&[("t", PassToPass)], &[], (false, true, false, false, true));
        check(
            &[("t", FailToPass), ("old", PassToFail)],
            &[("old", PassToPass)],
            (false, true, true, true, false),
        );
        // Already F→P without the test patch: not new.
        check(
            &[("t", FailToPass)],
            &[("t", FailToPass)],
            (false, true, false, false, false),
        );
        // An F→F the base runs have too is not new: still resolved.
        check(
            &[("t", FailToPass), ("flaky", FailToFail)],
            &[("flaky", FailToFail)],
            (true, true, true, true, false),
        );
        // A base F→P test the prediction's runs lose spoils it.
        check(
            &[("t", FailToPass), ("b", PassToPass)],
            &[("b", FailToPass)],
            (false, true, true, true, true),
        );
        check(&[("t", Unmatched)], &[], (false, true, false, false, false));
        check(&[], &[], (false, true, false, false, false));
    }

    #[test]
    fn applicability_counts_every_prediction_test_against_a_tenth_of_the_base() {
        let base: Vec<(String, Category)> =
            (0..30).map(|i| (format!("b{i}"), PassToPass)).collect();
        let base: Vec<(&str, Category)> = base.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        // New tests count too, in any category: 3 of 30 is a tenth.
        check(
            &[("n1", FailToPass), ("n2", Unmatched), ("n3", PassToFail)],
            &base,
            (false, true, true, true, false),
        );
        check(
            &[("n1", FailToPass), ("n2", Unmatched)],
            &base,
            (true, false, true, true, false),
        );
        // Against 31 base tests, 3 is short of a tenth.
        let base31: Vec<(String, Category)> =
            (0..31).map(|i| (format!("b{i}"), PassToPass)).collect();
        let base31: Vec<(&str, Category)> = base31.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        check(
            &[("n1", FailToPass), ("n2", Unmatched), ("n3", PassToFail)],
            &base31,
            (false, false, true, true, false),
        );
        // No base tests: anything applied is applicable, even no test at all.
        check(&[], &[], (false, true, false, false, false));
    }

    #[test]
    fn an_unapplied_patch_gets_nothing() {
        let maps: [StatusMap; 6] = Default::default();
        assert_eq!(verdict(&maps, false, Rules::default()), Verdict::default());
        assert!(verdict(&maps, true, Rules::default()).tests.is_some());
    }
}
