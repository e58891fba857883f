//! Test-log parsers: turn a test runner's output into a status per test id. Pure.
//!
//! One interface, one implementation per runner (pytest, unittest); per-repository parsers
//! (django, sympy, ...) plug in by name through [`parser_for`].

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Outcome of one test. Ordered from best to worst: when a log reports a test twice, the worse wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum TestStatus {
    /// Passed (an expected failure counts as passed, as in SWE-bench).
    Passed,
    /// Skipped.
    Skipped,
    /// Failed an assertion.
    Failed,
    /// Errored (setup, import, exception outside the assertion).
    Error,
}

/// Test id → status.
pub type TestStatuses = BTreeMap<String, TestStatus>;

/// Parses one runner's log.
pub trait LogParser: Sync {
    /// Name used in environment specs (`log_parser`).
    fn name(&self) -> &'static str;
    /// Statuses of the tests the log reports.
    fn parse(&self, log: &str) -> TestStatuses;
}

/// The parser registered under `name`.
pub fn parser_for(name: &str) -> Option<&'static dyn LogParser> {
    PARSERS.iter().copied().find(|p| p.name() == name)
}

/// Names of the registered parsers.
pub fn parser_names() -> Vec<&'static str> {
    PARSERS.iter().map(|p| p.name()).collect()
}

static PARSERS: &[&dyn LogParser] = &[&Pytest, &Unittest];

fn record(out: &mut TestStatuses, id: &str, status: TestStatus) {
    let id = id.trim();
    if id.is_empty() {
        return;
    }
    let e = out.entry(id.to_string()).or_insert(status);
    *e = (*e).max(status);
}

/// pytest with `-rA` (short summary lines `STATUS id[ - message]`) or `-v` (`id STATUS [ NN%]`).
pub struct Pytest;

fn pytest_status(word: &str) -> Option<TestStatus> {
    Some(match word {
        "PASSED" | "XFAIL" | "XPASS" => TestStatus::Passed,
        "FAILED" => TestStatus::Failed,
        "ERROR" => TestStatus::Error,
        "SKIPPED" => TestStatus::Skipped,
        _ => return None,
    })
}

/// The test id at the start of `rest`: up to the closing `]` of a parametrization, else up to " - " or a space.
fn pytest_id(rest: &str) -> &str {
    let rest = rest.trim_start();
    let end = match (rest.find('['), rest.find(' ')) {
        (Some(b), sp) if sp.is_none_or(|s| b < s) => {
            rest[b..].find(']').map_or(rest.len(), |e| b + e + 1)
        }
        (_, Some(s)) => s,
        _ => rest.len(),
    };
    &rest[..end]
}

impl LogParser for Pytest {
    fn name(&self) -> &'static str {
        "pytest"
    }

    fn parse(&self, log: &str) -> TestStatuses {
        let mut out = TestStatuses::new();
        for line in log.lines() {
            let line = line.trim_end();
            let mut words = line.split_whitespace();
            let Some(first) = words.next() else { continue };
            if let Some(status) = pytest_status(first) {
                // Short summary: "PASSED tests/x.py::t" (SKIPPED lines name a file:line, not an id).
                let id = pytest_id(&line[first.len()..]);
                if id.contains("::") {
                    record(&mut out, id, status);
                }
                continue;
            }
            if first.contains("::") {
                // Verbose: "tests/x.py::t PASSED  [ 50%]".
                let id = pytest_id(line);
                let after = line[id.len()..].split_whitespace().next().unwrap_or("");
                if let Some(status) = pytest_status(after) {
                    record(&mut out, id, status);
                }
            }
        }
        out
    }
}

/// Pseudo-tests unittest reports when a module cannot be imported (e.g. a test file that does
/// not exist before the test patch): not tests, so not counted.
const LOADER_FAILURE: &str = "unittest.loader.";

/// `python -m unittest -v`: `test_x (pkg.mod.Class.test_x) ... ok` and the FAIL:/ERROR: blocks.
/// Ids are normalised to `pkg.mod.Class.test_x` (older Pythons print `(pkg.mod.Class)`).
pub struct Unittest;

fn unittest_status(text: &str) -> Option<TestStatus> {
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

/// `name (dotted)` → normalised id, if the text has that shape.
fn unittest_id(head: &str) -> Option<String> {
    let head = head.trim();
    let open = head.find(" (")?;
    let name = &head[..open];
    let dotted = head[open + 2..].strip_suffix(')')?;
    let valid = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_alphanumeric() || c == '_' || c == '.')
    };
    if !valid(name) || !valid(dotted) || name.contains('.') {
        return None;
    }
    Some(if dotted.ends_with(&format!(".{name}")) {
        dotted.to_string()
    } else {
        format!("{dotted}.{name}")
    })
}

impl LogParser for Unittest {
    fn name(&self) -> &'static str {
        "unittest"
    }

    fn parse(&self, log: &str) -> TestStatuses {
        let mut out = TestStatuses::new();
        let mut pending: Option<String> = None;
        for line in log.lines() {
            let line = line.trim_end();
            if let Some(rest) = line
                .strip_prefix("FAIL: ")
                .or_else(|| line.strip_prefix("ERROR: "))
            {
                let status = if line.starts_with("FAIL") {
                    TestStatus::Failed
                } else {
                    TestStatus::Error
                };
                if let Some(id) = unittest_id(rest).filter(|id| !id.starts_with(LOADER_FAILURE)) {
                    record(&mut out, &id, status);
                }
                continue;
            }
            if let Some((head, tail)) = line.split_once(" ... ") {
                // The head may be the id line itself, or a docstring line after a pending id.
                let id = unittest_id(head)
                    .or_else(|| pending.take())
                    .filter(|id| !id.starts_with(LOADER_FAILURE));
                if let Some(id) = id {
                    match unittest_status(tail) {
                        Some(s) => record(&mut out, &id, s),
                        None => pending = Some(id), // the test printed; its status comes on a later line
                    }
                }
                continue;
            }
            if let Some(id) = unittest_id(line) {
                pending = Some(id); // a docstring line follows
                continue;
            }
            if let (Some(id), Some(s)) = (pending.as_ref(), unittest_status(line)) {
                let id = id.clone();
                record(&mut out, &id, s);
                pending = None;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TestStatus::*;

    fn check(parser: &str, log: &str, expected: &[(&str, TestStatus)]) {
        let got = parser_for(parser).unwrap().parse(log);
        let want: TestStatuses = expected.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        assert_eq!(got, want, "\n{log}");
    }

    #[test]
    fn pytest_short_summary_and_verbose_lines() {
        check(
            "pytest",
            "tests/test_a.py::test_one PASSED                [ 33%]\n\
             tests/test_a.py::TestK::test_two FAILED         [ 66%]\n\
             ============ short test summary info ============\n\
             PASSED tests/test_a.py::test_one\n\
             FAILED tests/test_a.py::TestK::test_two - AssertionError: assert 1 == 2\n\
             ERROR tests/test_b.py::test_three - ImportError: nope\n\
             SKIPPED [1] tests/test_b.py:12: not on linux\n\
             XFAIL tests/test_b.py::test_x - reason\n\
             PASSED tests/test_c.py::test_p[a - b]\n",
            &[
                ("tests/test_a.py::test_one", Passed),
                ("tests/test_a.py::TestK::test_two", Failed),
                ("tests/test_b.py::test_three", Error),
                ("tests/test_b.py::test_x", Passed),
                ("tests/test_c.py::test_p[a - b]", Passed),
            ],
        );
    }

    #[test]
    fn the_worse_of_two_reports_wins() {
        // A test that prints a fake PASSED line for itself still fails.
        check(
            "pytest",
            "PASSED tests/t.py::test_x\nFAILED tests/t.py::test_x - assert False\n",
            &[("tests/t.py::test_x", Failed)],
        );
    }

    #[test]
    fn unittest_verbose_with_docstrings_prints_and_summary_blocks() {
        check(
            "unittest",
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
    fn unknown_parsers_are_none() {
        assert!(parser_for("django").is_none());
        assert_eq!(parser_names(), vec!["pytest", "unittest"]);
    }
}
