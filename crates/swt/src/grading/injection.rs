//! Result lines a test may have printed itself. A reproduction test is untrusted code: it can
//! print lines shaped like its runner's own (`PASSED tests/t.py::test_x`, `test_x (m.T) ... ok`).
//! SWT-bench's parsers read them like the runner's, and so must reprobench's (parity); this module
//! only notices where the parsed part of a log contradicts itself. It works on the parser's own
//! reports ([`Report`]: id, status, where in the parsed text), so it sees exactly what the parser
//! read. Pure.
//!
//! **`results_after_summary`**: the parser reads a test's status from text after the runner's
//! closing summary line, the last one in the parsed text; none, no finding. Closing lines: pytest
//! families `==== 1 failed, 2 passed in 0.12s ====` (`... in 2.01 seconds ...`, `... (0:01:15)`,
//! `no tests ran in ...`; colour codes removed first), Django and unittest `Ran N test(s) in
//! X.XXXs`, SymPy `==== tests finished: ... in X seconds ====`. A report counts where the parser
//! reads the test's name ([`Report::at`]): for Django, a verbose line after the summary counts,
//! while an earlier `test_x ... FAIL` whose status word the expression finds in the closing
//! `FAILED (failures=1)` does not. Statuses PASSED, FAILED, ERROR and SKIPPED count; other words
//! from a status position do not (pytest's `ERROR: file or directory not found: ...` after `no
//! tests ran`, tox's `ERROR:   py39: commands failed`).
//!
//! **`conflicting_results`**: one test is reported PASSED and FAILED (either order), or ERROR and
//! later PASSED with no ERROR after that PASSED, by different places of the log; SKIPPED and other
//! words are left out. PASSED then ERROR is no conflict: pytest's `-rA` summary lists a test
//! whose call passed and whose teardown failed as PASSED, then ERROR (passes come before errors
//! and failures), and `-v` prints the same pair on its progress lines first (PASSED, ERROR,
//! PASSED, ERROR). Left out, per family:
//! * pytest families: a conflict that pytest's own `short test summary info` block (the last one,
//!   up to the closing line; every test has finished when it is written) holds by itself: a
//!   test run twice, or ids the parser merges (cut at whitespace, `[/a/b]` → `[/b]`,
//!   `MouseButton.LEFT` → `1`).
//! * SymPy: a test is its file and name (the file from the failure header, or the last
//!   `path.py[N]` line), as equal names in two files are two tests; a status line the expression
//!   read across a line break (`... in test_x` then the traceback line `    ok = f()`) is left out.
//! * Django: a status its expression found off the test's own line ([`Report::borrowed`]: past
//!   another test's name, as `test_a ... FAIL` takes the next line's `ok`, or more than one line
//!   after the name, as `OK` from migration output printed in between) is left out; `FAIL:` and
//!   `ERROR:` lines count.
//! * unittest: every line the parser reads counts.

use crate::grading::execution_log::LogReading;
use crate::grading::instance::{Suspicion, finding};
use crate::grading::parsers::{self, Family, Report, TestStatus};
use crate::grading::pytext;
use regex::Regex;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::LazyLock;

/// The runner's closing summary line in the parsed text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClosingLine {
    /// Byte offset just past the line (before its newline).
    pub end: usize,
    /// The line, without colour codes and surrounding whitespace.
    pub text: String,
    /// Where pytest's `short test summary info` block before it starts: the runner writes it
    /// after every test has run, so no test prints into it.
    pub results_from: Option<usize>,
}

/// pytest's: `==== 1 failed, 2 passed, 1 warning in 0.12s ====`, `=== 1 passed in 2.01 seconds
/// ===` (pytest < 6), `... in 75.10s (0:01:15) ...`, `==== no tests ran in 0.01s ====`; the bars
/// are absent under `-q`.
static PYTEST_CLOSING: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"^(?:=+ )?(?:no tests ran|\d+ [a-z][a-z-]*(?:, \d+ [a-z][a-z-]*)*) in \d+(?:\.\d+)?(?:s| seconds)(?: \([0-9a-z:, ]+\))?(?: =+)?$",
    )
    .expect("valid pattern")
});

/// unittest's and Django's: `Ran 7 tests in 27.312s`, `Ran 1 test in 0.001s`.
static RAN_TESTS: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^Ran \d+ tests? in \d+(?:\.\d+)?s$").expect("valid pattern"));

/// SymPy's `bin/test`: `==== tests finished: 3 passed, 1 failed, in 0.52 seconds ====` (no bars
/// when the line is wider than the terminal).
static SYMPY_CLOSING: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(?:=+ )?tests finished: .* in \d+(?:\.\d+)? seconds(?: =+)?$")
        .expect("valid pattern")
});

static PYTEST_SHORT_SUMMARY: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^=+ short test summary info =+$").expect("valid pattern"));

/// The last closing summary line of `family`'s runner in `log` (the text the parser reads).
pub fn closing_line(family: Family, log: &str) -> Option<ClosingLine> {
    let pattern: &Regex = match family {
        Family::Django | Family::Unittest => &RAN_TESTS,
        Family::Sympy => &SYMPY_CLOSING,
        Family::Pytest
        | Family::PytestOptions
        | Family::PytestV2
        | Family::Seaborn
        | Family::Matplotlib => &PYTEST_CLOSING,
    };
    let pytest_like = !matches!(family, Family::Django | Family::Unittest | Family::Sympy);
    let (mut last, mut block) = (None, None);
    // Every closing line holds ` in `: a cheap test before the cleaning and the expression.
    for (at, line) in parsers::lines(log)
        .filter(|(_, l)| l.contains(" in ") || (pytest_like && l.contains("short test summary")))
    {
        let clean: Cow<'_, str> = if pytest_like {
            parsers::strip_colour(line)
        } else {
            Cow::Borrowed(line)
        };
        let clean_line = pytext::strip(&clean);
        if pattern.is_match(clean_line) {
            last = Some((at + line.len(), shown(clean_line), block));
        } else if pytest_like && PYTEST_SHORT_SUMMARY.is_match(clean_line) {
            block = Some(at);
        }
    }
    last.map(|(end, text, results_from)| ClosingLine {
        end,
        text,
        results_from,
    })
}

/// At most 100 characters of `s` (hostile output can be long).
fn shown(s: &str) -> String {
    match s.char_indices().nth(100) {
        Some((cut, _)) => format!("{}…", &s[..cut]),
        None => s.to_string(),
    }
}

fn word(s: TestStatus) -> &'static str {
    match s {
        TestStatus::Passed => "PASSED",
        TestStatus::Failed => "FAILED",
        TestStatus::Error => "ERROR",
        TestStatus::Skipped => "SKIPPED",
        TestStatus::Other => "another word",
    }
}

/// The first three `items` joined, and how many more there are.
fn listed(items: &[String], more_of: &str) -> String {
    let mut text = items.iter().take(3).cloned().collect::<Vec<_>>().join("; ");
    if items.len() > 3 {
        text.push_str(&format!(" and {} more {more_of}", items.len() - 3));
    }
    text
}

const A_TEST_CAN_PRINT: &str = "a test can print such lines itself to fake a result";

/// Statuses read after the closing summary line.
fn after_summary(run: &str, reading: &LogReading) -> Option<Suspicion> {
    let close = reading.closing_line.as_ref()?;
    let late: Vec<String> = reading
        .reports
        .iter()
        .filter(|r| r.at >= close.end && r.status != TestStatus::Other)
        .map(|r| format!("`{}` {}", shown(&r.id), word(r.status)))
        .collect();
    if late.is_empty() {
        return None;
    }
    Some(Suspicion::new(
        finding::RESULTS_AFTER_SUMMARY,
        run,
        format!(
            "the log reports {} after the runner's closing summary line `{}`; {A_TEST_CAN_PRINT}",
            listed(&late, "statuses"),
            close.text
        ),
    ))
}

/// PASSED and FAILED, or ERROR and a later PASSED that no ERROR follows (pytest `-v -rA` prints
/// PASSED, ERROR for a failed teardown twice: progress line, then summary).
fn conflicting(seq: &[TestStatus]) -> bool {
    let has = |s| seq.contains(&s);
    let error_then_pass = seq
        .iter()
        .rposition(|s| *s == TestStatus::Passed)
        .is_some_and(|p| {
            seq[..p].contains(&TestStatus::Error) && !seq[p..].contains(&TestStatus::Error)
        });
    (has(TestStatus::Passed) && has(TestStatus::Failed)) || error_then_pass
}

/// The distinct statuses of `reports`, in log order.
fn sequence<'a>(reports: impl Iterator<Item = &'a &'a Report>) -> Vec<TestStatus> {
    let mut seq: Vec<TestStatus> = reports.map(|r| r.status).collect();
    seq.dedup();
    seq
}

/// Ids the log gives conflicting statuses.
fn conflicts(run: &str, reading: &LogReading) -> Option<Suspicion> {
    let mut by_test: BTreeMap<(&str, Option<&str>), Vec<&Report>> = BTreeMap::new();
    for r in &reading.reports {
        if !r.borrowed
            && matches!(
                r.status,
                TestStatus::Passed | TestStatus::Failed | TestStatus::Error
            )
        {
            by_test
                .entry((&r.id, r.file.as_deref()))
                .or_default()
                .push(r);
        }
    }
    // pytest's closing block: what it says, the runner says (a test run twice, ids the parser
    // merges); only a conflict it does not hold by itself is the log's.
    let block = reading
        .closing_line
        .as_ref()
        .and_then(|c| Some(c.results_from?..c.end));
    let mut found = Vec::new();
    for ((id, _), mut reports) in by_test {
        reports.sort_by_key(|r| r.at);
        let seq = sequence(reports.iter());
        if !conflicting(&seq) {
            continue;
        }
        if let Some(block) = &block
            && conflicting(&sequence(reports.iter().filter(|r| block.contains(&r.at))))
        {
            continue;
        }
        let said: Vec<&str> = seq.iter().map(|s| word(*s)).collect();
        let kept = reading.statuses.get(id).map_or("no status", |s| word(*s));
        found.push(format!(
            "`{}` {} (the grade uses {kept})",
            shown(id),
            said.join(", then ")
        ));
    }
    if found.is_empty() {
        return None;
    }
    Some(Suspicion::new(
        finding::CONFLICTING_RESULTS,
        run,
        format!(
            "different lines of the log report {}; {A_TEST_CAN_PRINT}",
            listed(&found, "tests")
        ),
    ))
}

/// The injected-result findings about execution `run`.
pub fn findings(run: &str, reading: &LogReading) -> Vec<Suspicion> {
    after_summary(run, reading)
        .into_iter()
        .chain(conflicts(run, reading))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grading::execution_log;
    use crate::grading::rules::Rules;
    use finding::{CONFLICTING_RESULTS as CONFLICT, RESULTS_AFTER_SUMMARY as AFTER};

    /// The findings on `log`, all of which the parser reads (no coverage-traced command).
    fn found(family: Family, log: &str) -> Vec<Suspicion> {
        let reading = execution_log::read(Some(log), family, Rules::default());
        findings("pred_post", &reading)
    }

    fn check(family: Family, log: &str, expected: &[&str]) {
        let got: Vec<String> = found(family, log).into_iter().map(|s| s.kind).collect();
        assert_eq!(got, expected, "\n{log}");
    }

    #[test]
    fn closing_lines_in_their_shapes() {
        let closing = |family, line: &str| closing_line(family, line).map(|c| c.text);
        for line in [
            "============= 1 failed, 23 passed, 1 skipped, 17 warnings in 6.93s =============",
            "=== 1 passed in 2.01 seconds ===",
            "======== 2 passed, 1 pytest-warnings in 0.10 seconds ========",
            "=================== 3 passed in 75.10s (0:01:15) ===================",
            "============================ no tests ran in 0.01s =============================",
            "\x1b[32m====== \x1b[32m\x1b[1m1 passed\x1b[0m\x1b[32m in 0.12s\x1b[0m\x1b[32m ======\x1b[0m",
            "1 failed, 2 passed in 0.12s",
        ] {
            assert!(closing(Family::PytestV2, line).is_some(), "{line:?}");
        }
        assert_eq!(
            closing(
                Family::Seaborn,
                "\x1b[32m=== \x1b[1m1 passed\x1b[0m in 0.1s ===\x1b[0m"
            )
            .as_deref(),
            Some("=== 1 passed in 0.1s ===")
        );
        for line in [
            "============================= test session starts ==============================",
            "=========================== short test summary info ============================",
            "=== warnings summary ===",
            "Ran 1 test in 0.001s",
            "PASSED t.py::test_runs_in_0s",
        ] {
            assert_eq!(closing(Family::Pytest, line), None, "{line:?}");
        }
        assert!(closing(Family::Django, "Ran 1 test in 0.001s").is_some());
        assert!(closing(Family::Unittest, "Ran 12 tests in 27.312s").is_some());
        assert_eq!(closing(Family::Django, "=== 1 passed in 0.1s ==="), None);
        assert!(
            closing(
                Family::Sympy,
                "====== tests finished: 3 passed, 3 failed, 2 exceptions, in 56.94 seconds ======"
            )
            .is_some()
        );
        assert!(closing(Family::Sympy, "tests finished: 1 passed, in 0.01 seconds").is_some());
        // The last one counts.
        let c = closing_line(
            Family::Pytest,
            "== 1 passed in 0.1s ==\nPASSED t.py::a\n== 2 passed in 0.2s ==\n",
        )
        .unwrap();
        assert_eq!((c.text.as_str(), c.end), ("== 2 passed in 0.2s ==", 60));
    }

    #[test]
    fn a_status_printed_after_pytests_closing_line_is_noticed() {
        let log = "FAILED t.py::test_b - boom\n\
                   ==== 1 failed in 0.12s ====\n\
                   PASSED t.py::test_b\n";
        let f = found(Family::Pytest, log);
        assert_eq!(f[0].kind, AFTER);
        assert_eq!(
            f[0].message,
            "the log reports `t.py::test_b` PASSED after the runner's closing summary line \
             `==== 1 failed in 0.12s ====`; a test can print such lines itself to fake a result"
        );
        assert_eq!(f[1].kind, CONFLICT);
        assert!(
            f[1].message
                .contains("`t.py::test_b` FAILED, then PASSED (the grade uses PASSED)"),
            "{}",
            f[1].message
        );
        // Without a closing line there is nothing to be after.
        check(Family::Pytest, "PASSED t.py::test_a\n", &[]);
        check(
            Family::Seaborn,
            "== 1 passed in 0.1s ==\nt.py::x PASSED [100%]\n",
            &[AFTER],
        );
        check(
            Family::PytestV2,
            "== 1 passed in 0.1s ==\nt.py::x SKIPPED\n",
            &[AFTER],
        );
    }

    #[test]
    fn runner_lines_after_the_closing_line_are_not_statuses() {
        // pytest's usage error after `no tests ran`: the parser reads `file` as ERROR:.
        check(
            Family::Pytest,
            "collected 0 items\n\n=== no tests ran in 0.27s ===\n\
             ERROR: file or directory not found: tests/test_new.py\n\n",
            &[],
        );
        // pytest's own test suite prints inner sessions, closing line included.
        check(
            Family::Pytest,
            "----- Captured stdout call -----\n\
             === short test summary info ===\nPASSED test_inner.py::test_ok\n\
             === 1 passed in 0.01s ===\n\
             === short test summary info ===\nPASSED testing/t.py::test_outer\n\
             === 1 passed in 0.50s ===\n",
            &[],
        );
    }

    #[test]
    fn pytests_teardown_errors_are_no_conflict() {
        let summary =
            "PASSED t.py::a\nERROR t.py::a - teardown\n=== 1 passed, 1 error in 0.1s ===\n";
        check(Family::Pytest, summary, &[]);
        // `-v -rA` under pytest_v2: progress lines, then the summary.
        check(
            Family::PytestV2,
            "t.py::a PASSED\nt.py::a ERROR\n=== short test summary info ===\n\
             PASSED t.py::a\nERROR t.py::a - teardown\n=== 1 passed, 1 error in 0.1s ===\n",
            &[],
        );
        // An ERROR that a PASSED follows is one.
        check(
            Family::Pytest,
            "ERROR t.py::a - setup\nPASSED t.py::a\n=== 1 passed, 1 error in 0.1s ===\n",
            &[CONFLICT],
        );
        // SKIPPED takes no part.
        check(Family::Pytest, "SKIPPED t.py::a\nPASSED t.py::a\n", &[]);
    }

    #[test]
    fn a_printed_line_against_the_runners_summary_is_a_conflict() {
        check(
            Family::Pytest,
            "=== PASSES ===\n___ test_other ___\n--- Captured stdout call ---\n\
             FAILED t.py::a\n=== short test summary info ===\nPASSED t.py::a\n\
             PASSED t.py::test_other\n=== 2 passed in 0.1s ===\n",
            &[CONFLICT],
        );
    }

    #[test]
    fn the_runners_own_summary_block_does_not_conflict_with_itself() {
        // Two tests pytest_options merges into `t.py::u[/a.so]`, and one run twice.
        let block = "PASSED t.py::u[/x/a.so]\nPASSED t.py::twice\n\
                     FAILED t.py::u[/y/a.so] - boom\nFAILED t.py::twice\n\
                     === 2 failed, 2 passed in 0.1s ===\n";
        check(
            Family::PytestOptions,
            &format!("=== short test summary info ===\n{block}"),
            &[],
        );
        // The block's bounds matter: without its header the lines are anyone's.
        let f = found(Family::PytestOptions, block);
        assert_eq!(f.len(), 1);
        assert!(
            f[0].message
                .contains("`t.py::u[/a.so]` PASSED, then FAILED")
        );
        assert!(f[0].message.contains("`t.py::twice` PASSED, then FAILED"));
    }

    #[test]
    fn django() {
        // A verbose line after `Ran`: buffered stdout of a test lands there.
        check(
            Family::Django,
            "test_a (m.T) ... ok\n\n------\nRan 1 test in 0.001s\n\nOK\n\
             test_fake (m.T) ... ok\n",
            &[AFTER],
        );
        // The expression takes test_a's status from the closing `OK (...)`; its name is earlier.
        check(
            Family::Django,
            "test_a (m.T) ... expected failure\n\n------\nRan 1 test in 0.001s\n\n\
             OK (expected failures=1)\n",
            &[],
        );
        // test_a's `FAIL` is no status word: the expression takes test_b's `ok`.
        check(
            Family::Django,
            "test_a (m.T) ... FAIL\ntest_b (m.T) ... ok\n\n=======\nFAIL: test_a (m.T)\n\
             ------\nRan 2 tests in 0.1s\n\nFAILED (failures=1)\n",
            &[],
        );
        // Django's stdout (migrations) interleaved before the status.
        check(
            Family::Django,
            "test_a (m.T) ... Testing against Django installed in '/testbed/django'\n\
             Importing application m\n  Applying admin.0001_initial... OK\nFAIL\n\n=======\n\
             FAIL: test_a (m.T)\n------\nRan 1 test in 0.1s\n\nFAILED (failures=1)\n",
            &[],
        );
        // An `ok` on the test's own line, then its failure block.
        check(
            Family::Django,
            "test_a (m.T) ... ok\nFAIL\n\n=======\nFAIL: test_a (m.T)\n------\n\
             Ran 1 test in 0.1s\n\nFAILED (failures=1)\n",
            &[CONFLICT],
        );
        // A docstring line between the name and the status is the test's own.
        check(
            Family::Django,
            "test_a (m.T)\nDoes a thing. ... ok\n\n=======\nFAIL: test_a (m.T)\n",
            &[CONFLICT],
        );
    }

    const SYMPY_HEAD: &str = "sympy/t/tests/test_x.py[2] \ntest_a F\ntest_b ok\n\n\
        ________________________________________________________________________________\n\
        ____________________ sympy/t/tests/test_x.py:test_a ____________________\n\
        Traceback (most recent call last):\n  File \"/testbed/sympy/t/tests/test_x.py\", \
        line 3, in test_a\n    ok = f()\nAssertionError\n\n";

    #[test]
    fn sympy() {
        let closing = "=== tests finished: 1 passed, 1 failed, in 0.10 seconds ===\n";
        // The traceback's `in test_a` and `ok = f()` are read as `test_a ok`, across lines.
        check(Family::Sympy, &format!("{SYMPY_HEAD}{closing}"), &[]);
        check(
            Family::Sympy,
            &format!("{SYMPY_HEAD}{closing}test_a ok \n"),
            &[AFTER, CONFLICT],
        );
        // Status lines win over failure headers wherever they are.
        let printed = SYMPY_HEAD.replace("test_b ok\n", "test_b test_a ok\nok\n");
        check(Family::Sympy, &format!("{printed}{closing}"), &[CONFLICT]);
        // Equal names in two files are two tests.
        let two_files = format!(
            "sympy/a/tests/test_p.py[1] \ntest_a ok\n{}{closing}",
            SYMPY_HEAD.replace("test_b ok", "test_b F")
        );
        check(Family::Sympy, &two_files, &[]);
    }

    #[test]
    fn unittest() {
        check(
            Family::Unittest,
            "test_a (m.T.test_a) ... FAIL\n\n=====\nFAIL: test_a (m.T.test_a)\n-----\n\
             Ran 1 test in 0.001s\n\nFAILED (failures=1)\ntest_a (m.T.test_a) ... ok\n",
            &[AFTER, CONFLICT],
        );
        check(
            Family::Unittest,
            "test_a (m.T.test_a) ... ok\n-----\nRan 1 test in 0.001s\n\nOK\n",
            &[],
        );
    }

    #[test]
    fn long_lists_are_cut() {
        let log: String = (0..5)
            .map(|i| format!("FAILED t.py::t{i}\nPASSED t.py::t{i}\n"))
            .collect();
        let f = found(Family::Pytest, &log);
        assert!(
            f[0].message.contains(" and 2 more tests;"),
            "{}",
            f[0].message
        );
        assert!(f[0].message.contains("`t.py::t2`") && !f[0].message.contains("`t.py::t3`"));
    }
}
