//! `parse_log_django`: Django's test runner at verbosity 2.
//!
//! SWT-bench reads it with one backtracking regular expression over the whole log (a test name
//! `test...  (module.Class)`, anything up to ` ...`, anything up to a status word) and then lets
//! `FAIL: test_x (module.Class)` / `ERROR: ...` lines overwrite what it found. The expression uses
//! look-aheads, which the `regex` crate does not have, so this module computes the same matches
//! directly. Worked out from the expression (positions are in the whole log):
//!
//! * A match starts at a word boundary on `test` or `app_unmigrated`, takes the following
//!   non-whitespace run, at least one whitespace character, `(`, and everything up to the first
//!   `)`: that text is the test id (it may span lines).
//! * The ` ...` after it: the first `...` that starts after the `)` and is preceded by
//!   whitespace; failing that (or if no status follows it), a `...` right at the `)`.
//! * The status after that `...` at `r`: let `f` be the first position after `r` holding one of
//!   `test_ app_unmigrated OK ok FAILED ERROR skipped` as a whole word. If that word is a status
//!   and whitespace precedes it, it is the status; otherwise a status word right at `r`
//!   (`...ok`); otherwise there is no match here and the search moves on by one position.

use super::{Parsed, Report, TestStatus};
use crate::grading::pytext;

/// Words the status search may not run past.
const STOP_WORDS: [&str; 7] = [
    "test_",
    "app_unmigrated",
    "OK",
    "ok",
    "FAILED",
    "ERROR",
    "skipped",
];

fn status_of(word: &str) -> Option<TestStatus> {
    Some(match word {
        "OK" | "ok" => TestStatus::Passed,
        "skipped" => TestStatus::Skipped,
        "FAILED" => TestStatus::Failed,
        "ERROR" => TestStatus::Error,
        _ => return None,
    })
}

/// A log with the positions the expression keys on.
struct Text<'a> {
    s: &'a str,
    /// Starts of `...` (overlapping: `....` starts twice), ascending.
    dots: Vec<usize>,
    /// Starts of whole-word stop words, ascending, with the word.
    stops: Vec<(usize, &'static str)>,
}

impl<'a> Text<'a> {
    fn new(s: &'a str) -> Text<'a> {
        let b = s.as_bytes();
        let dots = (0..b.len().saturating_sub(2))
            .filter(|&i| &b[i..i + 3] == b"...")
            .collect();
        let mut stops: Vec<(usize, &'static str)> = Vec::new();
        for w in STOP_WORDS {
            for (i, _) in s.match_indices(w) {
                if boundary(s, i) && boundary(s, i + w.len()) {
                    stops.push((i, w));
                }
            }
        }
        stops.sort_unstable();
        Text { s, dots, stops }
    }

    fn first_dots_after(&self, i: usize) -> Option<usize> {
        let k = self.dots.partition_point(|&p| p <= i);
        self.dots.get(k).copied()
    }

    fn first_stop_after(&self, i: usize) -> Option<(usize, &'static str)> {
        let k = self.stops.partition_point(|&(p, _)| p <= i);
        self.stops.get(k).copied()
    }

    /// The status after the `...` ending at `r`, where its word starts, and where the match ends.
    fn status_after(&self, r: usize) -> Option<(TestStatus, usize, usize)> {
        if let Some((f, w)) = self.first_stop_after(r)
            && let Some(st) = status_of(w)
            && char_before(self.s, f).is_some_and(pytext::is_space)
        {
            return Some((st, f, f + w.len()));
        }
        ["OK", "ok", "FAILED", "ERROR", "skipped"]
            .into_iter()
            .find(|w| self.s[r..].starts_with(w) && boundary(self.s, r + w.len()))
            .and_then(|w| status_of(w).map(|st| (st, r, r + w.len())))
    }

    /// The whole expression at `start` (a boundary on `test`/`app_unmigrated`, `prefix` bytes
    /// long): the id, its status, where the status word starts and the end of the match.
    fn match_at(&self, start: usize, prefix: usize) -> Option<(&'a str, TestStatus, usize, usize)> {
        let after = name_end(self.s, start, prefix)?;
        let mut ends = Vec::with_capacity(2);
        if let Some(q) = self.first_dots_after(after)
            && char_before(self.s, q).is_some_and(pytext::is_space)
        {
            ends.push(q + 3);
        }
        if self.s[after..].starts_with("...") {
            ends.push(after + 3);
        }
        ends.into_iter().find_map(|r| {
            self.status_after(r)
                .map(|(st, word, end)| (&self.s[start..after], st, word, end))
        })
    }
}

fn char_before(s: &str, i: usize) -> Option<char> {
    s[..i].chars().next_back()
}

/// `\b` at byte `i` of `s`.
fn boundary(s: &str, i: usize) -> bool {
    let before = char_before(s, i).is_some_and(pytext::is_word);
    let at = s[i..].chars().next().is_some_and(pytext::is_word);
    before != at
}

/// `(prefix)([^\s]*)\s+\([^)]*\)` at `start`: the position after the `)`.
fn name_end(s: &str, start: usize, prefix: usize) -> Option<usize> {
    let mut i = start + prefix;
    let rest = &s[i..];
    i += rest.find(pytext::is_space).unwrap_or(rest.len());
    let rest = &s[i..];
    let spaces = rest.find(|c| !pytext::is_space(c)).unwrap_or(rest.len());
    if spaces == 0 {
        return None;
    }
    i += spaces;
    if !s[i..].starts_with('(') {
        return None;
    }
    let close = s[i + 1..].find(')')?;
    Some(i + 1 + close + 1)
}

/// Starts of `\b(word...)` for each of `words`, ascending, with the word's length.
fn name_starts(s: &str, words: &[&str]) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = words
        .iter()
        .flat_map(|w| {
            s.match_indices(w)
                .filter(|(i, _)| boundary(s, *i))
                .map(|(i, _)| (i, w.len()))
        })
        .collect();
    out.sort_unstable();
    out
}

/// `FAIL:`/`ERROR:` lines: the test named between the key and its next occurrence, if exactly
/// one name is there.
fn failure_line(line: &str, key: &str) -> Option<String> {
    if !line.starts_with(key) || !line[key.len()..].starts_with(':') {
        return None;
    }
    let rest = &line[key.len()..];
    let segment = rest.find(key).map_or(rest, |i| &rest[..i]);
    let mut found = None;
    let mut count = 0;
    let mut from = 0;
    for (start, prefix) in name_starts(segment, &["test_", "app_unmigrated"]) {
        if start < from {
            continue;
        }
        if let Some(end) = name_end(segment, start, prefix) {
            count += 1;
            found = Some(&segment[start..end]);
            from = end;
        }
    }
    (count == 1).then(|| found.unwrap_or_default().to_string())
}

/// `parse_log_django`.
pub fn parse(log: &str) -> Parsed {
    let mut out = Parsed::default();
    let text = Text::new(log);
    let names = name_starts(log, &["test", "app_unmigrated"]);
    let mut from = 0;
    for &(start, prefix) in &names {
        if start < from {
            continue;
        }
        if let Some((id, status, word, end)) = text.match_at(start, prefix) {
            let after = start + id.len();
            let borrowed = log[after..word].matches('\n').nth(1).is_some()
                || names_between(log, &names, after, word);
            out.record(Report {
                borrowed,
                ..Report::new(id.to_string(), status, start)
            });
            from = end;
        }
    }
    for (at, line) in super::lines(log) {
        for (key, status) in [("ERROR", TestStatus::Error), ("FAIL", TestStatus::Failed)] {
            if let Some(id) = failure_line(line, key) {
                out.report(id, status, at);
            }
        }
    }
    out
}

/// A whole test name (`test... (...)`, as the expression's first part reads one) starts in
/// `from..to`: a status word at `to` was found past another test's name.
fn names_between(log: &str, names: &[(usize, usize)], from: usize, to: usize) -> bool {
    let first = names.partition_point(|&(p, _)| p < from);
    names[first..]
        .iter()
        .take_while(|&&(p, _)| p < to)
        .any(|&(p, prefix)| name_end(log, p, prefix).is_some())
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
    fn verbose_lines_with_descriptions_and_failure_blocks() {
        check(
            "test_a (app.tests.T) ... ok\n\
             test_b (app.tests.T) ... FAIL\n\
             test_c (app.tests.T)\nA docstring that runs on ... ERROR\n\
             test_d (app.tests.T) ... skipped 'no db'\n\
             test_e (app.tests.T) ... ok\n\
             ======================================================================\n\
             FAIL: test_b (app.tests.T)\n\
             ERROR: test_e (app.tests.T)\n\
             ----------------------------------------------------------------------\n\
             Ran 5 tests in 0.1s\n\nFAILED (failures=1, errors=1)\n",
            &[
                ("test_a (app.tests.T)", Passed),
                // `FAIL` is no status word, and `test_c` no stop word (no boundary after
                // `test_`): test_b's match runs on to test_c's ERROR; its FAIL: line wins.
                ("test_b (app.tests.T)", Failed),
                ("test_d (app.tests.T)", Skipped),
                ("test_e (app.tests.T)", Error),
            ],
        );
    }

    #[test]
    fn the_status_search_runs_past_unknown_words() {
        check(
            "test_a (m.T) ... FAIL\ntest_b (m.T) ... ok\n",
            &[("test_a (m.T)", Passed)],
        );
        check(
            "testing (m.T) ... testing ok\n",
            &[("testing (m.T)", Passed)],
        );
        // A whole-word `test_` stops it.
        check("test_a (m.T) ... test_ ok\n", &[]);
        check("test_a (m.T) ... test_ \n ok", &[]);
    }

    #[test]
    fn dots_right_after_the_name_fall_back() {
        check("test_a (m.T)... ok\n", &[("test_a (m.T)", Passed)]);
        check("test_a (m.T)...ok\n", &[("test_a (m.T)", Passed)]);
        check(
            "test_a (m.T)... x ... FAILED\n",
            &[("test_a (m.T)", Failed)],
        );
        check("test_a (m.T)x... ok\n", &[]);
        check("test_a (m.T) ....ok", &[]);
        check("test_a (m.T) .... ok", &[("test_a (m.T)", Passed)]);
    }

    #[test]
    fn names_span_lines_and_words_need_boundaries() {
        check("test_a\n(m.T) ... OK\n", &[("test_a\n(m.T)", Passed)]);
        check("mytest_a (m.T) ... ok\n", &[]);
        check("x.test_a (m.T) ... okay ok\n", &[("test_a (m.T)", Passed)]);
        check(
            "app_unmigrated (m.T) ... ok\n",
            &[("app_unmigrated (m.T)", Passed)],
        );
    }

    #[test]
    fn failure_lines_need_exactly_one_name() {
        check("FAIL: test_x (m.T)\n", &[("test_x (m.T)", Failed)]);
        check("ERROR: test_x (m.T) test_y (m.T)\n", &[]);
        // The name is looked for between the key and its next occurrence.
        check("FAIL: test_x (m.FAIL) \n", &[]);
        check("ERROR:test_x (m.T)\n", &[("test_x (m.T)", Error)]);
        check("FAILED: test_x (m.T)\n", &[]);
    }

    /// SWT-bench's two expressions run by a backtracking engine (look-aheads included), with
    /// Python's `\s`, over texts from words that matter to them: the direct computation above
    /// must find the same ids and statuses.
    #[test]
    fn agrees_with_the_backtracking_expression_on_generated_logs() {
        use crate::grading::pytext::{NON_SPACE_CLASS, SPACE_CLASS};
        use reprobench_domain::synthetic::SplitMix64;
        let main = fancy_regex::RegexBuilder::new(&format!(
            r"(?P<testname>\b(test|app_unmigrated)({NON_SPACE_CLASS}*){SPACE_CLASS}+\([^)]*\))((.|\n)(?!\.\.\.))*{SPACE_CLASS}*\.\.\.((.|\n)(?!\b(test_|app_unmigrated|OK|ok|FAILED|ERROR|skipped)\b))*{SPACE_CLASS}*\b(?P<status>OK|ok|FAILED|ERROR|skipped)\b"
        ))
        .backtrack_limit(100_000_000)
        .build()
        .unwrap();
        let line = regex::Regex::new(&format!(
            r"\b(test_|app_unmigrated)({NON_SPACE_CLASS}*){SPACE_CLASS}+\([^)]*\)"
        ))
        .unwrap();
        let reference = |log: &str| -> StatusMap {
            let mut out = StatusMap::new();
            for m in main.captures_iter(log) {
                let m = m.unwrap();
                out.insert(m["testname"].to_string(), status_of(&m["status"]).unwrap());
            }
            for l in log.split('\n') {
                for (key, st) in [("ERROR", Error), ("FAIL", Failed)] {
                    if l.starts_with(&format!("{key}:")) {
                        let seg = l.split(key).nth(1).unwrap_or("");
                        let found: Vec<_> = line.find_iter(seg).collect();
                        if found.len() == 1 {
                            out.insert(found[0].as_str().to_string(), st);
                        }
                    }
                }
            }
            out
        };
        let words = [
            "test_a",
            "test_b",
            "test",
            "testing",
            "test_",
            "app_unmigrated",
            " ",
            "  ",
            "\n",
            "\t",
            "\x1c",
            "\u{a0}",
            "(m.T)",
            "(",
            ")",
            "...",
            "....",
            ".",
            " ... ",
            "ok",
            "OK",
            "okay",
            "FAIL",
            "FAIL:",
            "FAILED",
            "ERROR",
            "ERROR:",
            "skipped",
            "x",
            "_",
            "y.z",
        ];
        let mut rng = SplitMix64::new(1729);
        for case in 0..3000 {
            let n = 1 + (rng.next_u64() % 40) as usize;
            let log: String = (0..n)
                .map(|_| words[(rng.next_u64() % words.len() as u64) as usize])
                .collect();
            assert_eq!(
                parse(&log).statuses,
                reference(&log),
                "case {case}: {log:?}"
            );
        }
    }
}
