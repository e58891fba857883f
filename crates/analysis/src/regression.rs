//! The nightly regression gate behind `reprobench compare --results NEW --baseline OLD
//! [--max-drop PP]`: pair the tasks of two runs, and call it a regression only when the success
//! rate dropped by more than the allowed margin *and* the drop is unlikely to be noise (exact
//! McNemar test on the tasks that flipped). Pure.

use crate::stats::{bootstrap_diff_ci, mcnemar_exact_p};
use reprobench_domain::results::ResultRow;
use std::collections::BTreeMap;
use std::fmt::{self, Write};

/// Resamples of the bootstrap interval in every comparison.
pub const BOOTSTRAP_RESAMPLES: usize = 10_000;
/// Seed of the bootstrap: fixed, so the same two files always give the same report.
pub const BOOTSTRAP_SEED: u64 = 0x00C0_FFEE_2024;
/// A drop counts as significant below this McNemar p-value.
pub const SIGNIFICANCE: f64 = 0.05;
/// Unpaired tasks listed by name in the report on each side; the rest are only counted.
const UNPAIRED_SHOWN: usize = 10;

/// What makes two result rows the same task: everything but the run that produced them.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskKey {
    /// Dataset name.
    pub dataset: String,
    /// Instance id within the dataset.
    pub instance_id: String,
    /// Agent name.
    pub agent: String,
    /// Variant name.
    pub variant: String,
    /// Backbone name.
    pub backbone: String,
    /// Repeat index.
    pub repeat: u32,
}

impl TaskKey {
    /// The key of a result row.
    pub fn of(row: &ResultRow) -> TaskKey {
        TaskKey {
            dataset: row.dataset.clone(),
            instance_id: row.instance_id.clone(),
            agent: row.agent.clone(),
            variant: row.variant.clone(),
            backbone: row.backbone.clone(),
            repeat: row.repeat,
        }
    }
}

impl fmt::Display for TaskKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}  {}/{}/{}  repeat {}",
            self.dataset, self.instance_id, self.agent, self.variant, self.backbone, self.repeat
        )
    }
}

/// The outcome of comparing a new run with a baseline over the tasks both contain.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    /// Tasks present on both sides.
    pub paired: usize,
    /// Success rate of the new run over the paired tasks, in percent (NaN with no pair).
    pub new_success_pct: f64,
    /// Success rate of the baseline over the paired tasks, in percent (NaN with no pair).
    pub old_success_pct: f64,
    /// `old_success_pct − new_success_pct`, in percentage points: positive means worse.
    pub drop_pp: f64,
    /// Paired tasks that succeeded in the baseline and fail now, in key order.
    pub broken: Vec<TaskKey>,
    /// Paired tasks that failed in the baseline and succeed now, in key order.
    pub fixed: Vec<TaskKey>,
    /// Two-sided exact McNemar p-value on the flips (`broken` vs `fixed`).
    pub p_value: f64,
    /// Paired bootstrap 95% interval of new − old, in percentage points.
    pub ci95_pp: (f64, f64),
    /// Tasks only in the new run (not compared), in key order.
    pub only_new: Vec<TaskKey>,
    /// Tasks only in the baseline (not compared), in key order.
    pub only_old: Vec<TaskKey>,
    /// Rows ignored because a later row on the same side had the same key.
    pub duplicate_rows: usize,
    /// The largest drop tolerated, in percentage points.
    pub max_drop_pp: f64,
    /// The gate's decision: `drop_pp > max_drop_pp` and `p_value < SIGNIFICANCE`.
    pub regressed: bool,
}

/// Outcome per task; a later row with the same key replaces an earlier one (a re-run appended
/// to the same results file supersedes the first result). Returns the map and the replaced count.
fn outcomes(rows: &[ResultRow]) -> (BTreeMap<TaskKey, bool>, usize) {
    let mut map = BTreeMap::new();
    let mut duplicates = 0;
    for r in rows {
        if map.insert(TaskKey::of(r), r.success).is_some() {
            duplicates += 1;
        }
    }
    (map, duplicates)
}

/// Compares a new run with a baseline: pairs tasks by (dataset, instance, agent, variant,
/// backbone, repeat), and flags a regression when the success rate over the paired tasks dropped
/// by more than `max_drop_pp` percentage points with McNemar p < 0.05.
pub fn compare(new: &[ResultRow], old: &[ResultRow], max_drop_pp: f64) -> Comparison {
    let (new_map, dup_new) = outcomes(new);
    let (old_map, dup_old) = outcomes(old);
    let mut pairs = Vec::new();
    let mut broken = Vec::new();
    let mut fixed = Vec::new();
    let mut only_old = Vec::new();
    for (key, &was) in &old_map {
        match new_map.get(key) {
            Some(&now) => {
                pairs.push((was, now));
                match (was, now) {
                    (true, false) => broken.push(key.clone()),
                    (false, true) => fixed.push(key.clone()),
                    _ => {}
                }
            }
            None => only_old.push(key.clone()),
        }
    }
    let only_new: Vec<TaskKey> = new_map
        .keys()
        .filter(|k| !old_map.contains_key(*k))
        .cloned()
        .collect();
    let paired = pairs.len();
    let rate = |successes: usize| 100.0 * successes as f64 / paired as f64;
    let old_success_pct = rate(pairs.iter().filter(|p| p.0).count());
    let new_success_pct = rate(pairs.iter().filter(|p| p.1).count());
    let drop_pp = old_success_pct - new_success_pct;
    let p_value = mcnemar_exact_p(broken.len() as u64, fixed.len() as u64);
    Comparison {
        paired,
        new_success_pct,
        old_success_pct,
        drop_pp,
        ci95_pp: bootstrap_diff_ci(&pairs, BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, 0.95),
        broken,
        fixed,
        p_value,
        only_new,
        only_old,
        duplicate_rows: dup_new + dup_old,
        max_drop_pp,
        // NaN (no pair) compares false, so an empty comparison never fails the gate by itself.
        regressed: drop_pp > max_drop_pp && p_value < SIGNIFICANCE,
    }
}

/// A readable report: the tasks that flipped, then the unpaired tasks, then the statistics and
/// the decision on one line.
pub fn render_comparison(c: &Comparison) -> String {
    let mut out = String::new();
    let mut list = |title: &str, keys: &[TaskKey], shown: usize| {
        if keys.is_empty() {
            return;
        }
        let _ = writeln!(out, "{title}: {}", keys.len());
        for k in keys.iter().take(shown) {
            let _ = writeln!(out, "  {k}");
        }
        if keys.len() > shown {
            let _ = writeln!(out, "  … and {} more", keys.len() - shown);
        }
    };
    list("broken (success → failure)", &c.broken, usize::MAX);
    list("fixed (failure → success)", &c.fixed, usize::MAX);
    list(
        "only in the new results (not compared)",
        &c.only_new,
        UNPAIRED_SHOWN,
    );
    list(
        "only in the baseline (not compared)",
        &c.only_old,
        UNPAIRED_SHOWN,
    );
    if c.duplicate_rows > 0 {
        let _ = writeln!(
            out,
            "{} duplicate rows ignored (the last row of each task counts)",
            c.duplicate_rows
        );
    }
    if c.paired == 0 {
        let _ = writeln!(
            out,
            "no task is in both files: check that --results and --baseline ran the same \
             datasets, agents, variants and backbones; verdict: not compared"
        );
        return out;
    }
    let decision = if c.regressed {
        "REGRESSED"
    } else if c.drop_pp > c.max_drop_pp {
        "ok (drop not significant)"
    } else {
        "ok"
    };
    let _ = writeln!(
        out,
        "{} paired tasks: success {:.1}% → {:.1}%, drop {:.1} pp (max {:.1}), \
         {} broken / {} fixed, McNemar p = {}, 95% CI of new − old [{:.1}, {:.1}] pp: {decision}",
        c.paired,
        c.old_success_pct,
        c.new_success_pct,
        c.drop_pp,
        c.max_drop_pp,
        c.broken.len(),
        c.fixed.len(),
        format_p(c.p_value),
        c.ci95_pp.0,
        c.ci95_pp.1,
    );
    out
}

/// A p-value with three decimals, or in scientific notation when that would print 0.000.
fn format_p(p: f64) -> String {
    if p >= 0.001 {
        format!("{p:.3}")
    } else {
        format!("{p:.1e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(instance: usize, success: bool) -> ResultRow {
        ResultRow {
            dataset: "swt-lite".into(),
            instance_id: format!("django__django-{instance}"),
            agent: "a".into(),
            variant: "full".into(),
            backbone: "gpt".into(),
            success,
            ..Default::default()
        }
    }

    /// `n` rows whose instance `i` succeeds when `ok(i)`.
    fn run(n: usize, ok: impl Fn(usize) -> bool) -> Vec<ResultRow> {
        (0..n).map(|i| row(i, ok(i))).collect()
    }

    #[test]
    fn no_change_passes() {
        let old = run(100, |i| i % 2 == 0);
        let c = compare(&old.clone(), &old, 2.0);
        assert_eq!((c.paired, c.broken.len(), c.fixed.len()), (100, 0, 0));
        assert_eq!(
            (c.old_success_pct, c.new_success_pct, c.drop_pp),
            (50.0, 50.0, 0.0)
        );
        assert_eq!((c.p_value, c.ci95_pp), (1.0, (0.0, 0.0)));
        assert!(!c.regressed);
        let text = render_comparison(&c);
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.ends_with("[0.0, 0.0] pp: ok\n"), "{text}");
    }

    #[test]
    fn large_significant_drop_regresses() {
        // 60% → 40%: instances 0..20 broke, none fixed. McNemar(20, 0) = 2^-19.
        let old = run(100, |i| i < 60);
        let new = run(100, |i| (20..60).contains(&i));
        let c = compare(&new, &old, 5.0);
        assert_eq!(
            (c.old_success_pct, c.new_success_pct, c.drop_pp),
            (60.0, 40.0, 20.0)
        );
        assert_eq!((c.broken.len(), c.fixed.len()), (20, 0));
        assert_eq!(c.broken[0].instance_id, "django__django-0");
        assert_eq!(c.p_value, 2f64.powi(-19));
        assert!(
            c.ci95_pp.0 < -20.0 && -20.0 < c.ci95_pp.1 && c.ci95_pp.1 < 0.0,
            "{:?}",
            c.ci95_pp
        );
        assert!(c.regressed);
        let text = render_comparison(&c);
        assert!(text.starts_with("broken (success → failure): 20\n  swt-lite/django__django-0  a/full/gpt  repeat 0\n"), "{text}");
        assert!(text.contains("McNemar p = 1.9e-6,"), "{text}");
        assert!(text.trim_end().ends_with("REGRESSED"), "{text}");
    }

    #[test]
    fn small_drop_that_is_not_significant_passes() {
        // 3 broken, 1 fixed: a 2 pp drop over 100 tasks, above the margin but McNemar p = 0.625.
        let old = run(100, |i| i < 50);
        let new = run(100, |i| (3..51).contains(&i));
        let c = compare(&new, &old, 1.0);
        assert_eq!((c.broken.len(), c.fixed.len()), (3, 1));
        assert!((c.drop_pp - 2.0).abs() < 1e-9);
        assert_eq!(c.p_value, 0.625);
        assert!(c.ci95_pp.0 < 0.0 && c.ci95_pp.1 >= 0.0, "{:?}", c.ci95_pp);
        assert!(!c.regressed);
        let text = render_comparison(&c);
        assert!(
            text.contains("fixed (failure → success): 1\n  swt-lite/django__django-50"),
            "{text}"
        );
        assert!(text.contains("McNemar p = 0.625,"), "{text}");
        assert!(
            text.trim_end().ends_with("ok (drop not significant)"),
            "{text}"
        );
        // The same drop within a wider margin is simply ok.
        assert!(
            render_comparison(&compare(&new, &old, 5.0))
                .trim_end()
                .ends_with("pp: ok")
        );
    }

    #[test]
    fn unpaired_and_duplicate_rows_are_counted_not_compared() {
        let old = run(10, |_| true);
        // The new run lost instances 0..3 (e.g. a shorter dataset) and gained 10..25; one task
        // was re-run and appended, and only its last row counts.
        let mut new = run(25, |_| true).split_off(3);
        new.push(row(5, false));
        new.push(row(5, true));
        let mut other_repeat = row(4, false);
        other_repeat.repeat = 1;
        new.push(other_repeat);
        let c = compare(&new, &old, 0.0);
        assert_eq!(c.paired, 7);
        assert_eq!((c.broken.len(), c.fixed.len(), c.drop_pp), (0, 0, 0.0));
        assert_eq!(c.only_old.len(), 3);
        assert_eq!(c.only_new.len(), 16);
        assert_eq!(c.duplicate_rows, 2);
        assert!(!c.regressed);
        let text = render_comparison(&c);
        assert!(
            text.contains("only in the new results (not compared): 16\n"),
            "{text}"
        );
        assert!(text.contains("  … and 6 more\n"), "{text}");
        assert!(
            text.contains("only in the baseline (not compared): 3\n"),
            "{text}"
        );
        assert!(text.contains("2 duplicate rows ignored"), "{text}");

        let none = compare(&run(3, |_| true), &[], 0.0);
        assert_eq!((none.paired, none.regressed), (0, false));
        assert!(none.drop_pp.is_nan());
        assert!(render_comparison(&none).contains("no task is in both files"));
    }
}
