//! `python -m unittest -v` (reprobench's own family; SWT-bench has none).
//!
//! Lines `test_x (pkg.mod.Class.test_x) ... ok` (Python ≥ 3.11) or `test_x (pkg.mod.Class) ...
//! ok` (older; the id is normalised to `pkg.mod.Class.test_x`), a docstring line between the name
//! and ` ... `, output printed before the status, several tests on one line when a test printed
//! no status (older Pythons with a failing `subTest`), indented subtest lines `test_x (...)
//! (i=1) ... FAIL`, and `FAIL:`/`ERROR:` blocks, subtest parameters included. A failing subtest
//! fails its test. The worse of two reports for a test wins.

use super::{Parsed, Report, TestStatus};

/// Pseudo-tests unittest reports when a module cannot be imported (e.g. a test file that does
/// not exist before the test patch): not tests, so not counted.
const LOADER_FAILURE: &str = "unittest.loader.";

/// Records `status` for the test `id` named at `at`; the worse status wins.
fn record(out: &mut Parsed, (id, at): (String, usize), status: TestStatus) {
    if id.starts_with(LOADER_FAILURE) {
        return;
    }
    out.reports.push(Report::new(id.clone(), status, at));
    let e = out.statuses.entry(id).or_insert(status);
    *e = (*e).max(status);
}

/// The status a verbose line's tail starts with.
fn status_word(text: &str) -> Option<TestStatus> {
    let t = text.trim();
    Some(if t == "ok" || t == "expected failure" {
        TestStatus::Passed
    } else if t == "FAIL" || t == "unexpected success" {
        TestStatus::Failed
    } else if t == "ERROR" {
        TestStatus::Error
    } else if t.starts_with("skipped") {
        TestStatus::Skipped
    } else {
        return None;
    })
}

fn valid(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == '.')
}

/// `name (dotted)` or `name (dotted) (params)` → the normalised id, if the text has that shape.
fn test_id(head: &str) -> Option<String> {
    let head = head.trim();
    let open = head.find(" (")?;
    let name = &head[..open];
    let rest = &head[open + 2..];
    let close = rest.find(')')?;
    let dotted = &rest[..close];
    let params = rest[close + 1..].trim();
    if !valid(name) || name.contains('.') || !valid(dotted) {
        return None;
    }
    let params_ok = params.is_empty() || (params.starts_with('(') && params.ends_with(')'));
    if !params_ok {
        return None;
    }
    Some(if dotted.ends_with(&format!(".{name}")) {
        dotted.to_string()
    } else {
        format!("{dotted}.{name}")
    })
}

/// `unittest -v` output → statuses.
pub fn parse(log: &str) -> Parsed {
    let mut out = Parsed::default();
    // A test whose line ended before its status (a docstring, output, or subtests follow), and
    // where it is named.
    let mut pending: Option<(String, usize)> = None;
    for (at, line) in super::lines(log) {
        let line = line.trim_end();
        if let Some((rest, status)) = line
            .strip_prefix("FAIL: ")
            .map(|r| (r, TestStatus::Failed))
            .or_else(|| line.strip_prefix("ERROR: ").map(|r| (r, TestStatus::Error)))
        {
            if let Some(id) = test_id(rest) {
                record(&mut out, (id, at), status);
            }
            continue;
        }
        let (line, open_end) = match line.strip_suffix(" ...") {
            Some(l) => (l, true),
            None => (line, false),
        };
        let mut parts = line.split(" ... ");
        let head = parts.next().unwrap_or("");
        let tails: Vec<&str> = parts.collect();
        if tails.is_empty() && !open_end {
            // No ` ... ` here: a name whose docstring follows, or a status on its own line.
            if let Some(id) = test_id(head) {
                pending = Some((id, at));
            } else if let Some(s) = status_word(head)
                && let Some(named) = pending.take()
            {
                record(&mut out, named, s);
            }
            continue;
        }
        // The head is a test (or subtest) name, or the docstring of the pending test.
        let mut current = test_id(head).map(|id| (id, at)).or_else(|| pending.take());
        for tail in tails {
            if let Some(s) = status_word(tail) {
                if let Some(named) = current.take() {
                    record(&mut out, named, s);
                }
            } else if let Some(id) = test_id(tail) {
                // The previous test printed no status (its subtests report in FAIL: blocks).
                current = Some((id, at));
            }
        }
        pending = current;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::StatusMap;
    use super::*;
    use TestStatus::*;

    fn check(log: &str, expected: &[(&str, TestStatus)]) {
        let got = parse(log).statuses;
        let want: StatusMap = expected.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        assert_eq!(got, want, "\n{log}");
    }

    #[test]
    fn verbose_with_docstrings_prints_and_summary_blocks() {
        check(
            "test_a (tests.test_m.TestC.test_a) ... ok\n\
             test_b (tests.test_m.TestC.test_b) ... FAIL\n\
             test_c (tests.test_m.TestC)\n\
             Docstring of c ... ERROR\n\
             test_d (tests.test_m.TestC.test_d) ... printed something\n\
             ok\n\
             test_e (tests.test_m.TestC.test_e) ... skipped 'why'\n\
             test_f (tests.test_m.TestC.test_f) ... expected failure\n\
             test_missing (unittest.loader._FailedTest.test_missing) ... ERROR\n\
             \n\
             ======================================================================\n\
             FAIL: test_b (tests.test_m.TestC.test_b)\n\
             ----------------------------------------------------------------------\n\
             Traceback (most recent call last):\n\
             Ran 6 tests in 0.001s\n\
             FAILED (failures=1, errors=1, skipped=1)\n",
            &[
                ("tests.test_m.TestC.test_a", Passed),
                ("tests.test_m.TestC.test_b", Failed),
                ("tests.test_m.TestC.test_c", Error),
                ("tests.test_m.TestC.test_d", Passed),
                ("tests.test_m.TestC.test_e", Skipped),
                ("tests.test_m.TestC.test_f", Passed),
            ],
        );
    }

    #[test]
    fn a_failing_subtest_fails_its_test() {
        // Python 3.11+: the subtest's line is indented under the test's.
        check(
            "test_a (test_sub.T.test_a) ... \n  test_a (test_sub.T.test_a) (i=1) ... FAIL\n\
             test_b (test_sub.T.test_b) ... ok\n\
             ======================================================================\n\
             FAIL: test_a (test_sub.T.test_a) (i=1)\n",
            &[("test_sub.T.test_a", Failed), ("test_sub.T.test_b", Passed)],
        );
        // Python 3.8: no status for the test, the next test's name on the same line.
        check(
            "test_a (test_sub.T) ... test_b (test_sub.T) ... ok\n\
             test_c (test_sub.T) ... ok\n\
             ======================================================================\n\
             FAIL: test_a (test_sub.T) (i=1)\n",
            &[
                ("test_sub.T.test_a", Failed),
                ("test_sub.T.test_b", Passed),
                ("test_sub.T.test_c", Passed),
            ],
        );
    }
}
