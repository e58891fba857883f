//! Test-log parsers: a runner's output → {test id: status}. Pure.
//!
//! Seven families follow SWT-bench's `log_parsers.py` line for line, odd cases included: a later
//! line for the same id overwrites an earlier one, ids end at the first whitespace, and
//! summary-looking lines count wherever they appear. [`Family::for_repo`] is SWT-bench's
//! repository → parser map. `unittest` is reprobench's own family, for repositories outside
//! SWT-bench; there the worse of two reports for one test wins.

mod django;
mod pytest;
mod sympy;
mod unittest;

pub(crate) use pytest::strip_colour;

use crate::grading::rules::Rules;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A test's status as a parser records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum TestStatus {
    /// `PASSED` (pytest), `ok`/`OK` (django, sympy, unittest).
    Passed,
    /// `SKIPPED`, `skipped`.
    Skipped,
    /// `FAILED`, `FAIL`, `F`.
    Failed,
    /// `ERROR`, `E`.
    Error,
    /// Any other word a parser took from a status position (`ERROR:`, `PASSED:`, the second
    /// word of a line ending in a status, ...). Grading treats it like a missing test.
    Other,
}

impl TestStatus {
    /// The status a pytest-style line's status word stands for.
    pub fn from_word(word: &str) -> TestStatus {
        match word {
            "PASSED" => TestStatus::Passed,
            "FAILED" => TestStatus::Failed,
            "SKIPPED" => TestStatus::Skipped,
            "ERROR" => TestStatus::Error,
            _ => TestStatus::Other,
        }
    }
}

/// Test id → status.
pub type StatusMap = BTreeMap<String, TestStatus>;

/// One status a parser read for a test, and where; `statuses` is made of these, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The test id, as it goes into the status map.
    pub id: String,
    /// The status read.
    pub status: TestStatus,
    /// Byte offset in the log where the test is named: the start of its line for the line-based
    /// parsers (pytest families, `FAIL:`/`ERROR:` lines, unittest), the start of the matched
    /// text for SymPy's expressions and Django's verbose-line expression.
    pub at: usize,
    /// The status word is not on the test's own line: SymPy's expression crossed a line break
    /// (`... in test_x` then a traceback line `    ok = f()`), or Django's ran on past another
    /// test's name or beyond the line after the name (`test_a ... FAIL` takes the next test's
    /// `ok`, or `OK` from interleaved migration output). The word reports something else.
    pub borrowed: bool,
    /// The test file the log places the report in, where the id leaves it out: SymPy's ids are
    /// bare function names (from a failure header, or the last `path.py[N]` line before).
    pub file: Option<String>,
}

impl Report {
    /// A report on the test's own line, with no file beside the id.
    pub fn new(id: String, status: TestStatus, at: usize) -> Report {
        Report {
            id,
            status,
            at,
            borrowed: false,
            file: None,
        }
    }
}

/// What a parser made of a log.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Parsed {
    /// Statuses by test id.
    pub statuses: StatusMap,
    /// Every status read, in the order the parser applied them (for SymPy, failure headers
    /// first, whatever their place in the log).
    pub reports: Vec<Report>,
    /// SWT-bench's parser raises on this log (an `IndexError` on a one-word status line); it
    /// would give no verdict. reprobench skips the line and says so here.
    pub raises: Option<String>,
}

impl Parsed {
    /// Records a report; its status overwrites an earlier one for the id.
    fn record(&mut self, report: Report) {
        self.statuses.insert(report.id.clone(), report.status);
        self.reports.push(report);
    }

    /// Records `status` for `id`, read at `at` on the test's own line.
    fn report(&mut self, id: String, status: TestStatus, at: usize) {
        self.record(Report::new(id, status, at));
    }

    fn raise_at(&mut self, line: &str) {
        if self.raises.is_none() {
            let shown: String = line.chars().take(80).collect();
            self.raises = Some(format!(
                "SWT-bench's parser raises IndexError on the line `{shown}`; the line was skipped"
            ));
        }
    }
}

/// A log parser family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Family {
    /// pytest `-rA`: `STATUS id` lines.
    #[serde(rename = "pytest")]
    Pytest,
    /// pytest with path-like parametrisations cut to their last component (requests, pylint, pydicom).
    #[serde(rename = "pytest_options")]
    PytestOptions,
    /// pytest with colour codes and control characters stripped, and `id STATUS` lines read (astropy, scikit-learn, sphinx).
    #[serde(rename = "pytest_v2")]
    PytestV2,
    /// Django's runner at verbosity 2.
    #[serde(rename = "django")]
    Django,
    /// SymPy's `bin/test`.
    #[serde(rename = "sympy")]
    Sympy,
    /// seaborn's pytest output: FAILED and PASSED only.
    #[serde(rename = "seaborn")]
    Seaborn,
    /// pytest with `MouseButton` names as numbers.
    #[serde(rename = "matplotlib")]
    Matplotlib,
    /// `python -m unittest -v` (reprobench's own; not an SWT-bench family).
    #[serde(rename = "unittest")]
    Unittest,
}

impl Family {
    /// Every family, SWT-bench's seven first.
    pub const ALL: [Family; 8] = [
        Family::Pytest,
        Family::PytestOptions,
        Family::PytestV2,
        Family::Django,
        Family::Sympy,
        Family::Seaborn,
        Family::Matplotlib,
        Family::Unittest,
    ];

    /// The name used in environment specs and `case.json` (SWT-bench's, without `parse_log_`).
    pub fn name(self) -> &'static str {
        match self {
            Family::Pytest => "pytest",
            Family::PytestOptions => "pytest_options",
            Family::PytestV2 => "pytest_v2",
            Family::Django => "django",
            Family::Sympy => "sympy",
            Family::Seaborn => "seaborn",
            Family::Matplotlib => "matplotlib",
            Family::Unittest => "unittest",
        }
    }

    /// The family called `name`.
    pub fn from_name(name: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.name() == name)
    }

    /// Names of all families, for messages.
    pub fn names() -> Vec<&'static str> {
        Family::ALL.iter().map(|f| f.name()).collect()
    }

    /// SWT-bench's parser for a repository (`owner/name`), `None` outside SWT-bench.
    pub fn for_repo(repo: &str) -> Option<Family> {
        Some(match repo {
            "astropy/astropy" | "scikit-learn/scikit-learn" | "sphinx-doc/sphinx" => {
                Family::PytestV2
            }
            "django/django" => Family::Django,
            "matplotlib/matplotlib" => Family::Matplotlib,
            "mwaskom/seaborn" => Family::Seaborn,
            "psf/requests" | "pydicom/pydicom" | "pylint-dev/pylint" => Family::PytestOptions,
            "sympy/sympy" => Family::Sympy,
            "marshmallow-code/marshmallow"
            | "pallets/flask"
            | "pvlib/pvlib-python"
            | "pydata/xarray"
            | "pylint-dev/astroid"
            | "pytest-dev/pytest"
            | "pyvista/pyvista"
            | "sqlfluff/sqlfluff"
            | "nielstron/humaneval_fix" => Family::Pytest,
            _ => return None,
        })
    }

    /// Parses a log (already with Python's newlines) as SWT-bench's parser of this family does
    /// under `rules`.
    pub fn parse(self, log: &str, rules: Rules) -> Parsed {
        match self {
            Family::Pytest => pytest::parse(log, pytest::Dialect::Plain),
            Family::PytestOptions => pytest::parse(log, pytest::Dialect::Options),
            Family::Matplotlib => pytest::parse(log, pytest::Dialect::Matplotlib),
            Family::PytestV2 => pytest::parse_v2(log),
            Family::Seaborn => pytest::parse_seaborn(log),
            Family::Django => django::parse(log),
            Family::Sympy => sympy::parse(log, rules.sympy_status_needs_trailing_space()),
            Family::Unittest => unittest::parse(log),
        }
    }
}

/// `log.split('\n')` with each line's byte offset.
pub(crate) fn lines(log: &str) -> impl Iterator<Item = (usize, &str)> {
    log.split('\n').scan(0, |next, line| {
        let at = *next;
        *next += line.len() + 1;
        Some((at, line))
    })
}

/// The parser of an instance: SWT-bench's for its repository, else the environment's.
pub fn parser_for(repo: &str, env_parser: &str) -> Option<Family> {
    Family::for_repo(repo).or_else(|| Family::from_name(env_parser))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_repos_map_as_swt_bench_does() {
        for f in Family::ALL {
            assert_eq!(Family::from_name(f.name()), Some(f));
        }
        assert_eq!(Family::from_name("parse_log_django"), None);
        assert_eq!(
            Family::for_repo("psf/requests"),
            Some(Family::PytestOptions)
        );
        assert_eq!(
            Family::for_repo("sphinx-doc/sphinx"),
            Some(Family::PytestV2)
        );
        assert_eq!(Family::for_repo("pallets/flask"), Some(Family::Pytest));
        assert_eq!(Family::for_repo("reprobench/textkit"), None);
    }
}
