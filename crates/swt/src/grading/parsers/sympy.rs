//! `parse_log_sympy`: SymPy's `bin/test`.
//!
//! Two expressions over the whole log: `____ file.py:test_x ____` failure headers record the
//! name after the colon(s) as FAILED, then `test_x  ok|F|E` lines record `test_x`, overwriting.
//! Since SWT-bench's 2025-09 rules a whitespace character must follow the status (so `test_x
//! Fixed` is no failure); the 2024 rules lack that.

use super::{Parsed, Report, TestStatus};
use crate::grading::pytext::{NON_SPACE_CLASS, SPACE_CLASS};
use regex::Regex;
use std::sync::LazyLock;

static FAILURE_HEADER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"_\n(_*) (.*)\.py::?(.*) (_*)").expect("valid pattern"));

fn status_line(trailing_space: bool) -> Regex {
    let tail = if trailing_space { SPACE_CLASS } else { "" };
    Regex::new(&format!(
        "test_({NON_SPACE_CLASS}*){SPACE_CLASS}+(E|F|ok){tail}"
    ))
    .expect("valid pattern")
}

/// The line opening a test file's results: `sympy/core/tests/test_basic.py[3] `.
static FILE_LINE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?m)^(\S+\.py)\[\d+\]").expect("valid pattern"));

static STATUS_LINE: LazyLock<Regex> = LazyLock::new(|| status_line(true));
static STATUS_LINE_2024: LazyLock<Regex> = LazyLock::new(|| status_line(false));

/// `parse_log_sympy`, with the status followed by whitespace when `trailing_space`.
pub fn parse(log: &str, trailing_space: bool) -> Parsed {
    let mut out = Parsed::default();
    for c in FAILURE_HEADER.captures_iter(log) {
        let at = c.get(0).map_or(0, |m| m.start());
        out.record(Report {
            file: Some(format!("{}.py", &c[2])),
            ..Report::new(c[3].to_string(), TestStatus::Failed, at)
        });
    }
    let files: Vec<(usize, &str)> = FILE_LINE
        .captures_iter(log)
        .filter_map(|c| Some((c.get(0)?.start(), c.get(1)?.as_str())))
        .collect();
    let line = if trailing_space {
        &*STATUS_LINE
    } else {
        &*STATUS_LINE_2024
    };
    for c in line.captures_iter(log) {
        let status = match &c[2] {
            "E" => TestStatus::Error,
            "F" => TestStatus::Failed,
            _ => TestStatus::Passed,
        };
        let (Some(whole), Some(word)) = (c.get(0), c.get(2)) else {
            continue;
        };
        let at = whole.start();
        let file = files[..files.partition_point(|&(p, _)| p < at)]
            .last()
            .map(|&(_, f)| f.to_string());
        out.record(Report {
            borrowed: log[at..word.start()].contains('\n'),
            file,
            ..Report::new(format!("test_{}", &c[1]), status, at)
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::StatusMap;
    use super::*;
    use TestStatus::*;

    fn check(log: &str, trailing_space: bool, expected: &[(&str, TestStatus)]) {
        let got = parse(log, trailing_space).statuses;
        let want: StatusMap = expected.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        assert_eq!(got, want, "\n{log}");
    }

    #[test]
    fn status_lines_and_failure_headers() {
        let log = "sympy/core/tests/test_basic.py[3] \n\
                   test_a ok\n\
                   test_b F\n\
                   test_c E\n\
                   test_d Fixed\n\
                   \n\
                   ________________________________________________________________________________\n\
                   ______ sympy/core/tests/test_basic.py:test_b _______\n\
                   ____ sympy/x/tests/test_y.py::test_e ____\n";
        // test_e's header is not found: the previous match took the underscores it needs.
        check(
            log,
            true,
            &[("test_a", Passed), ("test_b", Failed), ("test_c", Error)],
        );
        check(
            log,
            false,
            &[
                ("test_a", Passed),
                ("test_b", Failed),
                ("test_c", Error),
                ("test_d", Failed),
            ],
        );
        check(
            "________\n___ a.py:test_q ___\n\n_______\n___ b.py::test_r ___\n",
            true,
            &[("test_q", Failed), ("test_r", Failed)],
        );
    }

    #[test]
    fn ids_are_the_bare_function_names() {
        // The same function name in two files is one id; the last line wins.
        check(
            "a/test_1.py[1] test_same ok\nb/test_2.py[1] test_same F\n",
            true,
            &[("test_same", Failed)],
        );
        // The pattern is not anchored: `mytest_x ok` counts as `test_x`.
        check("mytest_x ok\n", true, &[("test_x", Passed)]);
    }
}
