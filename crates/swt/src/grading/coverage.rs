//! SWT-bench's second metric, pure: how much of the golden code patch the prediction's tests
//! execute. Each execution traces line counts in the files the golden code patch changes (see
//! `coverage_tracer.py`); the changed lines that are executable (the tracer lists them for the
//! golden and base runs) are the denominator. As SWT-bench's `get_pred_report` (330a649)
//! computes them:
//!
//! - removed lines count against the pre-fix runs, added lines against the post-fix runs;
//! - `coverage_pred`/`coverage_gold`: changed executable lines the pred/gold runs execute;
//! - `coverage_base`: the same for the runs without a test patch, where SWT-bench reads the
//!   post-fix base run for removed lines too (kept, since it decides the delta);
//! - `coverage_delta_pred`/`coverage_delta_gold`: lines whose count in the pred/gold run is
//!   higher than in the base run.
//!
//! Each figure is a share of the executable changed lines, `None` when there is none or the
//! model patch did not apply.

use super::pytext;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Line execution counts per file (path relative to the repository root).
pub type LineCounts = BTreeMap<String, BTreeMap<i64, i64>>;

/// A changed line: (file, line number).
type Line = (String, i64);

/// The five coverage figures of an instance (SWT-bench's report keys).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct CoverageFigures {
    /// Share of executable changed lines the prediction's runs execute.
    pub coverage_pred: Option<f64>,
    /// Share the golden test patch's runs execute.
    pub coverage_gold: Option<f64>,
    /// Share the runs without a test patch execute.
    pub coverage_base: Option<f64>,
    /// Share the prediction's runs execute more often than the base runs.
    pub coverage_delta_pred: Option<f64>,
    /// Share the golden test patch's runs execute more often than the base runs.
    pub coverage_delta_gold: Option<f64>,
}

/// Adds one `{path: {line: count}}` object into `into`, paths with `strip` removed.
fn add_object(into: &mut LineCounts, v: &serde_json::Value, strip: &str) -> bool {
    let Some(files) = v.as_object() else {
        return false;
    };
    for (path, lines) in files {
        let Some(lines) = lines.as_object() else {
            return false;
        };
        let key = if strip.is_empty() {
            path.clone()
        } else {
            path.replace(strip, "")
        };
        let file = into.entry(key).or_default();
        for (line, count) in lines {
            let (Ok(line), Some(count)) = (line.trim().parse::<i64>(), count.as_i64()) else {
                continue;
            };
            // Saturating: the counts come from the run (a test can write any line there).
            let total = file.entry(line).or_insert(0);
            *total = total.saturating_add(count);
        }
    }
    true
}

/// The counts reprobench's tracer wrote: one JSON object per line, counts summed over lines
/// (each traced process appends its own).
pub fn from_tracer_lines(text: &str) -> LineCounts {
    let mut counts = LineCounts::new();
    for line in text.lines() {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(line.trim()) {
            add_object(&mut counts, &v, "");
        }
    }
    counts
}

/// The counts in one of SWT-bench's own evaluation logs: the `{"/testbed/…": …}` lines after
/// the first `+ cat coverage.cover` line, up to a `+ git checkout` line; `None` when the log has
/// no coverage dump.
pub fn from_swt_bench_log(log: &str) -> Option<LineCounts> {
    // As `readlines()` of a text file: universal newlines, lines ending at `\n`.
    let text = pytext::universal_newlines(log);
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let start = lines
        .iter()
        .position(|l| pytext::strip(l) == "+ cat coverage.cover")?;
    let mut counts = LineCounts::new();
    for line in &lines[start + 1..] {
        if line.starts_with("+ git checkout") {
            break;
        }
        if !line.starts_with("{\"/testbed/") {
            continue;
        }
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(pytext::strip(line)) {
            add_object(&mut counts, &v, "/testbed/");
        }
    }
    Some(counts)
}

/// The files a patch changes (both sides of its `diff --git a/X b/Y` lines), which the tracer
/// counts lines in.
pub fn changed_files(patch: &str) -> Vec<String> {
    let mut files = BTreeSet::new();
    for line in patch.lines() {
        let Some(rest) = line.strip_prefix("diff --git a/") else {
            continue;
        };
        // The last " b/" splits the two paths, as a greedy match would.
        if let Some(i) = rest.rfind(" b/") {
            files.insert(rest[..i].to_string());
            files.insert(rest[i + 3..].to_string());
        }
    }
    files.into_iter().collect()
}

/// Header of a hunk: (source start, source length, target start, target length).
fn hunk_header(line: &str) -> Option<(i64, i64, i64, i64)> {
    let rest = line.strip_prefix("@@ -")?;
    let (ranges, _) = rest.split_once(" @@")?;
    let (src, tgt) = ranges.split_once(" +")?;
    let range = |r: &str| -> Option<(i64, i64)> {
        match r.split_once(',') {
            Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
            None => Some((r.parse().ok()?, 1)),
        }
    };
    let (s, sl) = range(src)?;
    let (t, tl) = range(tgt)?;
    Some((s, sl, t, tl))
}

/// Header path without its side prefix (`a/`, `b/`: the first two characters) and timestamp.
fn header_path(rest: &str) -> String {
    let name = rest
        .split('\t')
        .next()
        .unwrap_or(rest)
        .trim_end_matches('\r');
    name.chars().skip(2).collect()
}

/// The lines a patch removes (file and line before it) and adds (file and line after it).
pub fn changed_lines(patch: &str) -> (Vec<Line>, Vec<Line>) {
    let (mut removed, mut added) = (Vec::new(), Vec::new());
    let (mut source, mut target) = (String::new(), String::new());
    // Lines of the current hunk still to come on each side, and the next line numbers.
    let (mut src_left, mut tgt_left, mut src_no, mut tgt_no) = (0i64, 0i64, 0i64, 0i64);
    for line in patch.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if src_left > 0 || tgt_left > 0 {
            match line.chars().next() {
                // Saturating: a hunk header may carry any i64 (`@@ -9223372036854775807 ...`).
                Some('-') => {
                    removed.push((source.clone(), src_no));
                    src_no = src_no.saturating_add(1);
                    src_left = src_left.saturating_sub(1);
                }
                Some('+') => {
                    added.push((target.clone(), tgt_no));
                    tgt_no = tgt_no.saturating_add(1);
                    tgt_left = tgt_left.saturating_sub(1);
                }
                Some('\\') => {}
                Some(' ') | None => {
                    src_no = src_no.saturating_add(1);
                    tgt_no = tgt_no.saturating_add(1);
                    src_left = src_left.saturating_sub(1);
                    tgt_left = tgt_left.saturating_sub(1);
                }
                Some(_) => {
                    src_left = 0;
                    tgt_left = 0;
                }
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("--- ") {
            source = header_path(rest);
        } else if let Some(rest) = line.strip_prefix("+++ ") {
            target = header_path(rest);
        } else if let Some((s, sl, t, tl)) = hunk_header(line) {
            (src_no, src_left, tgt_no, tgt_left) = (s, sl, t, tl);
        }
    }
    (removed, added)
}

/// The changed lines the given runs list as executable.
fn executable(lines: &[Line], runs: [&LineCounts; 2]) -> Vec<Line> {
    lines
        .iter()
        .filter(|(file, no)| {
            runs.iter()
                .any(|r| r.get(file).is_some_and(|l| l.contains_key(no)))
        })
        .cloned()
        .collect()
}

/// The counts of `lines` in `run` (0 when absent).
fn restricted(lines: &[Line], run: &LineCounts) -> BTreeMap<Line, i64> {
    lines
        .iter()
        .map(|(file, no)| {
            let n = run.get(file).and_then(|l| l.get(no)).copied().unwrap_or(0);
            ((file.clone(), *no), n)
        })
        .collect()
}

/// Per line, the count in `run` minus the count in `base`.
fn delta(
    lines: &[Line],
    base: &BTreeMap<Line, i64>,
    run: &BTreeMap<Line, i64>,
) -> BTreeMap<Line, i64> {
    lines
        .iter()
        .map(|l| {
            let d = run.get(l).copied().unwrap_or(0) - base.get(l).copied().unwrap_or(0);
            (l.clone(), d)
        })
        .collect()
}

fn covered(removed: &BTreeMap<Line, i64>, added: &BTreeMap<Line, i64>) -> usize {
    removed.values().filter(|n| **n > 0).count() + added.values().filter(|n| **n > 0).count()
}

/// The coverage figures from the golden code patch and the six runs' counts (pred, gold, base ×
/// pre, post); all `None` when the model patch did not apply.
pub fn figures(code_patch: &str, runs: [&LineCounts; 6], patch_applied: bool) -> CoverageFigures {
    if !patch_applied {
        return CoverageFigures::default();
    }
    let [
        pred_pre,
        pred_post,
        gold_pre,
        gold_post,
        base_pre,
        base_post,
    ] = runs;
    let (removed, added) = changed_lines(code_patch);
    let removed = executable(&removed, [gold_pre, base_pre]);
    let added = executable(&added, [gold_post, base_post]);
    let n = removed.len() + added.len();
    if n == 0 {
        return CoverageFigures::default();
    }
    let (pred_r, pred_a) = (
        restricted(&removed, pred_pre),
        restricted(&added, pred_post),
    );
    let (gold_r, gold_a) = (
        restricted(&removed, gold_pre),
        restricted(&added, gold_post),
    );
    let (base_r, base_a) = (
        restricted(&removed, base_post),
        restricted(&added, base_post),
    );
    let share = |k: usize| Some(k as f64 / n as f64);
    CoverageFigures {
        coverage_pred: share(covered(&pred_r, &pred_a)),
        coverage_gold: share(covered(&gold_r, &gold_a)),
        coverage_base: share(covered(&base_r, &base_a)),
        coverage_delta_pred: share(covered(
            &delta(&removed, &base_r, &pred_r),
            &delta(&added, &base_a, &pred_a),
        )),
        coverage_delta_gold: share(covered(
            &delta(&removed, &base_r, &gold_r),
            &delta(&added, &base_a, &gold_a),
        )),
    }
}

/// SWT-bench's `Mean coverage` and `Mean coverage delta` over the instances that have a
/// `coverage_pred` (0 when none has).
pub fn means<'a>(figures: impl IntoIterator<Item = &'a CoverageFigures>) -> (f64, f64) {
    let (mut sum, mut sum_delta, mut n) = (0.0, 0.0, 0usize);
    for f in figures {
        if let Some(c) = f.coverage_pred {
            sum += c;
            sum_delta += f.coverage_delta_pred.unwrap_or(0.0);
            n += 1;
        }
    }
    if n == 0 {
        (0.0, 0.0)
    } else {
        (sum / n as f64, sum_delta / n as f64)
    }
}

/// The test command traced as SWT-bench traces it: `--tb=no` dropped; the first `python -m` or
/// `python3 -m` becomes the tracer's `-m`; a command starting with `pytest`, `unittest` or `tox`
/// runs as the tracer's module; SymPy's `PYTHONWARNINGS=…` prefix stays in front (with the
/// character-set strip SWT-bench applies to the rest); anything else runs as the tracer's script.
pub fn traced_command(command: &str, tracer: &str) -> String {
    const WARNINGS: &str = "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning'";
    let cleaned = command.replace("--tb=no", "");
    if let Some((at, len)) = python_dash_m(&cleaned) {
        // The module runs with the working directory first on sys.path, as `python -m` gives it
        // (SWT-bench's tracer leaves its own directory there; none of its repositories'
        // commands is a `python -m` one).
        return format!(
            "{}{tracer} --cwd-first -m{}",
            &cleaned[..at],
            &cleaned[at + len..]
        );
    }
    let trimmed = pytext::strip(&cleaned);
    if ["pytest", "unittest", "tox"]
        .iter()
        .any(|p| trimmed.starts_with(p))
    {
        return format!("{tracer} -m {cleaned}");
    }
    if trimmed.starts_with(WARNINGS) {
        let rest = cleaned.trim_matches(|c: char| WARNINGS.contains(c));
        let rest = pytext::strip(rest);
        return format!("{WARNINGS} {tracer} {rest}");
    }
    format!("{tracer} {cleaned}")
}

/// Byte offset and length of the first `python -m` or `python3 -m` in `s`.
fn python_dash_m(s: &str) -> Option<(usize, usize)> {
    let mut from = 0;
    while let Some(i) = s[from..].find("python") {
        let at = from + i;
        let rest = &s[at + 6..];
        if rest.starts_with(" -m") {
            return Some((at, 9));
        }
        if rest.starts_with("3 -m") {
            return Some((at, 10));
        }
        from = at + 6;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATCH: &str = "diff --git a/pkg/m.py b/pkg/m.py\n--- a/pkg/m.py\n+++ b/pkg/m.py\n@@ -1,3 +1,5 @@\n def f(x):\n-    return 1\n+    if x:\n+        return 2\n+    return 1\n \n@@ -10,2 +11,2 @@\n-a = 1\n+a = 2\n b = 3\n";

    fn counts(entries: &[(&str, &[(i64, i64)])]) -> LineCounts {
        entries
            .iter()
            .map(|(f, l)| (f.to_string(), l.iter().copied().collect()))
            .collect()
    }

    #[test]
    fn changed_lines_follow_both_sides_of_each_hunk() {
        let (removed, added) = changed_lines(PATCH);
        let f = |n: i64| ("pkg/m.py".to_string(), n);
        assert_eq!(removed, vec![f(2), f(10)]);
        assert_eq!(added, vec![f(2), f(3), f(4), f(11)]);
        assert_eq!(changed_files(PATCH), vec!["pkg/m.py"]);
    }

    #[test]
    fn extreme_hunk_numbers_and_counts_saturate() {
        // Found writing fuzz/ (diff_reader, jsonl_rows targets): these overflowed i64 and panicked.
        let (removed, _) = changed_lines("@@ -9223372036854775807 +1 @@\n-x\n-y\n");
        let f = |n: i64| (String::new(), n);
        assert_eq!(removed, vec![f(i64::MAX), f(i64::MAX)]);
        let (removed, added) = changed_lines("@@ -1,-9223372036854775808 +1 @@\n x\n+y\n");
        assert_eq!((removed, added), (vec![], vec![]));
        let counts =
            from_tracer_lines("{\"a.py\":{\"1\":9223372036854775807}}\n{\"a.py\":{\"1\":1}}\n");
        assert_eq!(counts["a.py"][&1], i64::MAX);
    }

    #[test]
    fn figures_count_executable_lines_and_the_delta_over_base_post() {
        // Executable: removed 2 and 10 (gold_pre lists them), added 2, 3, 4, 11 (gold_post).
        let gold_pre = counts(&[("pkg/m.py", &[(1, 1), (2, 1), (10, 1)])]);
        let gold_post = counts(&[("pkg/m.py", &[(2, 1), (3, 1), (4, 0), (11, 1)])]);
        let base_pre = counts(&[("pkg/m.py", &[(2, 5)])]);
        let base_post = counts(&[("pkg/m.py", &[(2, 1), (11, 1)])]);
        let pred_pre = counts(&[("pkg/m.py", &[(2, 1)])]);
        let pred_post = counts(&[("pkg/m.py", &[(2, 2), (3, 1)])]);
        let f = figures(
            PATCH,
            [
                &pred_pre, &pred_post, &gold_pre, &gold_post, &base_pre, &base_post,
            ],
            true,
        );
        // pred: removed 2, added 2 and 3 → 3 of 6.
        assert_eq!(f.coverage_pred, Some(0.5));
        // gold: removed 2 and 10, added 2, 3, 11 → 5 of 6.
        assert_eq!(f.coverage_gold, Some(5.0 / 6.0));
        // base reads base_post for removed lines too: removed 2, added 2, 11 → 3 of 6.
        assert_eq!(f.coverage_base, Some(0.5));
        // pred over base: removed 2 (1-1=0), added 2 (2-1), 3 (1-0) → 2 of 6.
        assert_eq!(f.coverage_delta_pred, Some(2.0 / 6.0));
        // gold over base: removed 10 (1-0), added 3 (1-0) → 2 of 6.
        assert_eq!(f.coverage_delta_gold, Some(2.0 / 6.0));
        let none = figures(
            PATCH,
            [
                &pred_pre, &pred_post, &gold_pre, &gold_post, &base_pre, &base_post,
            ],
            false,
        );
        assert_eq!(none, CoverageFigures::default());
        let empty = LineCounts::new();
        assert_eq!(
            figures(PATCH, [&empty; 6], true),
            CoverageFigures::default(),
            "no executable changed line, no figure"
        );
    }

    #[test]
    fn swt_bench_logs_are_read_after_cat_and_summed_per_file() {
        let log = "+ python3 /root/trace.py --count -C coverage.cover x\n{\"/testbed/a.py\": {\"1\": 9}}\n+ cat coverage.cover\n{\"/testbed/a.py\": {\"1\": 1, \"2\": 0}}\nnoise\n{\"/testbed/a.py\": {\"1\": 2}}\n{\"/testbed/b.py\": broken\n+ git checkout abc\n{\"/testbed/a.py\": {\"1\": 100}}\n";
        let c = from_swt_bench_log(log).unwrap();
        assert_eq!(c, counts(&[("a.py", &[(1, 3), (2, 0)])]));
        assert_eq!(from_swt_bench_log("no dump\n"), None);
        assert_eq!(
            from_tracer_lines("{\"a.py\": {\"3\": 1}}\n{\"a.py\": {\"3\": 2, \"4\": 0}}\n"),
            counts(&[("a.py", &[(3, 3), (4, 0)])])
        );
    }

    #[test]
    fn test_commands_are_traced_as_swt_bench_traces_them() {
        let t = "python3 T";
        assert_eq!(
            traced_command("pytest --no-header -rA --tb=no -p no:cacheprovider a.py", t),
            "python3 T -m pytest --no-header -rA  -p no:cacheprovider a.py"
        );
        assert_eq!(
            traced_command("python -m pytest -rA a.py", t),
            "python3 T --cwd-first -m pytest -rA a.py"
        );
        assert_eq!(
            traced_command("./tests/runtests.py --verbosity 2 x", t),
            "python3 T ./tests/runtests.py --verbosity 2 x"
        );
        // SWT-bench strips the prefix's characters from both ends: `.py` loses its `y`, which
        // SymPy's runner still matches as a substring.
        assert_eq!(
            traced_command(
                "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose sympy/core/tests/test_basic.py",
                t
            ),
            "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' python3 T bin/test -C --verbose sympy/core/tests/test_basic.p"
        );
        assert_eq!(
            traced_command("tox -epy39 -v -- tests/t.py", t),
            "python3 T -m tox -epy39 -v -- tests/t.py"
        );
    }

    #[test]
    fn means_skip_instances_without_figures() {
        let a = CoverageFigures {
            coverage_pred: Some(0.5),
            coverage_delta_pred: Some(0.25),
            ..Default::default()
        };
        let b = CoverageFigures {
            coverage_pred: Some(1.0),
            coverage_delta_pred: Some(0.75),
            ..Default::default()
        };
        assert_eq!(means([&a, &b, &CoverageFigures::default()]), (0.75, 0.5));
        assert_eq!(means([&CoverageFigures::default()]), (0.0, 0.0));
    }
}
