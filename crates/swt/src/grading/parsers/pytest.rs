//! The pytest families: `pytest`, `pytest_options`, `matplotlib`, `pytest_v2` and `seaborn`.

use super::{Parsed, TestStatus};
use crate::grading::pytext;
use regex::Regex;
use std::borrow::Cow;
use std::sync::LazyLock;

/// The four status words a pytest-family line may start with.
const STATUS_WORDS: [&str; 4] = ["FAILED", "PASSED", "SKIPPED", "ERROR"];

fn starts_with_status(line: &str) -> bool {
    STATUS_WORDS.iter().any(|w| line.starts_with(w))
}

fn ends_with_status(line: &str) -> bool {
    STATUS_WORDS.iter().any(|w| line.ends_with(w))
}

/// The variants of SWT-bench's plain pytest parser.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// `parse_log_pytest`.
    Plain,
    /// `parse_log_pytest_options`: `main[/a/b/c]` becomes `main[/c]`.
    Options,
    /// `parse_log_matplotlib`: `MouseButton.LEFT`/`RIGHT` become `1`/`3` first.
    Matplotlib,
}

/// A FAILED line's ` - ` separators become single spaces, so the message never joins the id.
fn failed_dashes(line: &str) -> Cow<'_, str> {
    if line.starts_with("FAILED") && line.contains(" - ") {
        Cow::Owned(line.replace(" - ", " "))
    } else {
        Cow::Borrowed(line)
    }
}

/// `main[option]` with a path-like option cut to its last component, as pytest_options does
/// (`(.*?)\[(.*)\]` then `"/" + option.split("/")[-1]`).
fn rewrite_option(id: &str) -> Cow<'_, str> {
    let (Some(open), Some(close)) = (id.find('['), id.rfind(']')) else {
        return Cow::Borrowed(id);
    };
    if close < open {
        return Cow::Borrowed(id);
    }
    let (main, mut option) = (&id[..open], &id[open + 1..close]);
    if option.starts_with('/') && !option.starts_with("//") && !option.contains('*') {
        option = option.rsplit('/').next().unwrap_or("");
        return Cow::Owned(format!("{main}[/{option}]"));
    }
    if close + 1 == id.len() {
        Cow::Borrowed(id)
    } else {
        Cow::Owned(format!("{main}[{option}]"))
    }
}

/// `parse_log_pytest`, `parse_log_pytest_options` and `parse_log_matplotlib`.
pub fn parse(log: &str, dialect: Dialect) -> Parsed {
    let mut out = Parsed::default();
    for (at, raw) in super::lines(log) {
        let line: Cow<'_, str> = if dialect == Dialect::Matplotlib && raw.contains("MouseButton.") {
            Cow::Owned(
                raw.replace("MouseButton.LEFT", "1")
                    .replace("MouseButton.RIGHT", "3"),
            )
        } else {
            Cow::Borrowed(raw)
        };
        if !starts_with_status(&line) {
            continue;
        }
        let line = failed_dashes(&line);
        let mut words = pytext::split(&line);
        let (Some(status), Some(id)) = (words.next(), words.next()) else {
            continue;
        };
        let id = match dialect {
            Dialect::Options => rewrite_option(id),
            _ => Cow::Borrowed(id),
        };
        out.report(id.into_owned(), TestStatus::from_word(status), at);
    }
    out
}

static COLOUR_CODE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\[\d+m").expect("valid pattern"));

/// pytest_v2's cleaning: `[NNm` colour codes removed, then the characters U+0001–U+001F.
pub(crate) fn strip_colour(line: &str) -> Cow<'_, str> {
    let line = if line.contains('[') {
        COLOUR_CODE.replace_all(line, "")
    } else {
        Cow::Borrowed(line)
    };
    if line.chars().any(|c| ('\u{1}'..='\u{1f}').contains(&c)) {
        Cow::Owned(
            line.chars()
                .filter(|c| !('\u{1}'..='\u{1f}').contains(c))
                .collect(),
        )
    } else {
        line
    }
}

/// `parse_log_pytest_v2`: cleaned lines; `STATUS id` lines and, for older pytest, lines ending
/// in a status word (`id STATUS`, first word → second word).
pub fn parse_v2(log: &str) -> Parsed {
    let mut out = Parsed::default();
    for (at, raw) in super::lines(log) {
        let line = strip_colour(raw);
        if starts_with_status(&line) {
            let line = failed_dashes(&line);
            let mut words = pytext::split(&line);
            match (words.next(), words.next()) {
                (Some(status), Some(id)) => {
                    out.report(id.to_string(), TestStatus::from_word(status), at);
                }
                _ => out.raise_at(&line),
            }
        } else if ends_with_status(&line) {
            let mut words = pytext::split(&line);
            if let (Some(id), Some(status)) = (words.next(), words.next()) {
                out.report(id.to_string(), TestStatus::from_word(status), at);
            }
        }
    }
    out
}

/// `parse_log_seaborn`: `FAILED id ...`, `id PASSED ...` (a line containing ` PASSED ` whose
/// second word is PASSED) and `PASSED id` lines; nothing else is recorded.
pub fn parse_seaborn(log: &str) -> Parsed {
    let mut out = Parsed::default();
    for (at, line) in super::lines(log) {
        if line.starts_with("FAILED") {
            match pytext::split(line).nth(1) {
                Some(id) => out.report(id.to_string(), TestStatus::Failed, at),
                None => out.raise_at(line),
            }
        } else if line.contains(" PASSED ") {
            let mut words = pytext::split(line);
            match (words.next(), words.next()) {
                (Some(id), Some("PASSED")) => out.report(id.to_string(), TestStatus::Passed, at),
                (Some(_), Some(_)) => {}
                _ => out.raise_at(line),
            }
        } else if line.starts_with("PASSED") {
            match pytext::split(line).nth(1) {
                Some(id) => out.report(id.to_string(), TestStatus::Passed, at),
                None => out.raise_at(line),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::{Family, StatusMap};
    use super::*;
    use crate::grading::rules::Rules;
    use TestStatus::*;

    fn check(family: Family, log: &str, expected: &[(&str, TestStatus)]) {
        let got = family.parse(log, Rules::default()).statuses;
        let want: StatusMap = expected.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        assert_eq!(got, want, "\n{log}");
    }

    #[test]
    fn pytest_reads_summary_lines_only_and_the_last_line_wins() {
        check(
            Family::Pytest,
            "tests/test_a.py::test_one PASSED                [ 33%]\n\
             PASSED tests/test_a.py::test_one\n\
             FAILED tests/test_a.py::TestK::test_two - AssertionError: assert 1 == 2\n\
             ERROR tests/test_b.py::test_three - ImportError: nope\n\
             SKIPPED [1] tests/test_b.py:12: not on linux\n\
             XFAIL tests/test_b.py::test_x - reason\n\
             XPASS tests/test_b.py::test_y\n\
             PASSED tests/test_c.py::test_p[a b]\n\
             ERROR: Could not find a version that satisfies the requirement\n\
             PASSED\n\
             FAILED tests/t.py::flip\n\
             PASSED tests/t.py::flip\n",
            &[
                ("tests/test_a.py::test_one", Passed),
                ("tests/test_a.py::TestK::test_two", Failed),
                ("tests/test_b.py::test_three", Error),
                ("[1]", Skipped),
                ("tests/test_c.py::test_p[a", Passed),
                ("Could", Other),
                ("tests/t.py::flip", Passed),
            ],
        );
    }

    #[test]
    fn failed_dashes_become_spaces_and_python_whitespace_splits() {
        check(
            Family::Pytest,
            "FAILED t.py::x[a - b] - boom\nPASSED\x1ct.py::y\n",
            &[("t.py::x[a", Failed), ("t.py::y", Passed)],
        );
    }

    #[test]
    fn pytest_options_cuts_path_like_parametrisations() {
        check(
            Family::PytestOptions,
            "PASSED tests/t.py::test_url[/usr/lib/x.so]\n\
             PASSED tests/t.py::test_url[//host/share]\n\
             PASSED tests/t.py::test_glob[/a/*.py]\n\
             PASSED tests/t.py::test_plain[abc]\n\
             PASSED tests/t.py::test_tail[/a/b]extra\n\
             PASSED tests/t.py::test_two[/x/y]-[z]\n",
            &[
                ("tests/t.py::test_url[/x.so]", Passed),
                ("tests/t.py::test_url[//host/share]", Passed),
                ("tests/t.py::test_glob[/a/*.py]", Passed),
                ("tests/t.py::test_plain[abc]", Passed),
                ("tests/t.py::test_tail[/b]", Passed),
                ("tests/t.py::test_two[/y]-[z]", Passed),
            ],
        );
    }

    #[test]
    fn matplotlib_names_mouse_buttons_by_number() {
        check(
            Family::Matplotlib,
            "PASSED lib/t.py::test_click[MouseButton.LEFT]\nFAILED lib/t.py::test_click[MouseButton.RIGHT] - x\n",
            &[
                ("lib/t.py::test_click[1]", Passed),
                ("lib/t.py::test_click[3]", Failed),
            ],
        );
    }

    #[test]
    fn pytest_v2_strips_colour_and_reads_trailing_statuses() {
        check(
            Family::PytestV2,
            "\x1b[32mPASSED\x1b[0m tests/t.py::test_a\n\
             tests/t.py::test_b PASSED\n\
             tests/t.py::test_c PASSED [ 50%]\n\
             \x1b[1m\x1b[31mFAILED\x1b[0m tests/t.py::test_d - assert 0\n\
             some words then ERROR\n\
             PASSED\ttests/t.py::test_tab extra\n",
            &[
                ("tests/t.py::test_a", Passed),
                ("tests/t.py::test_b", Passed),
                ("tests/t.py::test_d", Failed),
                ("some", Other),
                ("extra", Other),
            ],
        );
        let p = Family::PytestV2.parse("PASSED\n", Rules::default());
        assert!(p.raises.is_some(), "SWT-bench raises on a bare status line");
    }

    #[test]
    fn seaborn_knows_only_failed_and_passed() {
        check(
            Family::Seaborn,
            "tests/t.py::test_a PASSED [ 10%]\n\
             FAILED tests/t.py::test_b - boom\n\
             PASSED tests/t.py::test_c\n\
             ERROR tests/t.py::test_d\n\
             SKIPPED [1] tests/t.py:3: no\n\
             x y PASSED z\n",
            &[
                ("tests/t.py::test_a", Passed),
                ("tests/t.py::test_b", Failed),
                ("tests/t.py::test_c", Passed),
            ],
        );
        assert!(
            Family::Seaborn
                .parse("FAILED\n", Rules::default())
                .raises
                .is_some()
        );
    }
}
