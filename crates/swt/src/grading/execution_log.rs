//! One execution's log as SWT-bench reads it (`get_logs_eval`): the part of the log the parser
//! sees, the status map, and whether the log shows the patch applied; beside them, where in that
//! part each status was read and the runner's closing line, for [`injection`]'s checks. Pure.

use crate::grading::injection::{self, ClosingLine};
use crate::grading::parsers::{Family, Report, StatusMap};
use crate::grading::pytext;
use crate::grading::rules::Rules;
use regex::Regex;
use std::sync::LazyLock;

/// Lines SWT-bench's harness prints when an execution went wrong; a log holding one has an
/// empty status map and counts as "patch not applied".
pub const FAILURE_MARKERS: [&str; 5] = [
    ">>>>> Patch Apply Failed",
    ">>>>> Reset Failed",
    ">>>>> Tests Errored",
    ">>>>> Tests Timed Out",
    "Failed to reset task environment",
];

/// The coverage-traced test command; the parser sees only what follows it.
static TRACED_COMMAND: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\n\+ python3 [^\n]*trace.py --count -C coverage.cover [^\n]*\n")
        .expect("valid pattern")
});

/// What SWT-bench makes of one execution's log.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogReading {
    /// The status map.
    pub statuses: StatusMap,
    /// Every status the parser read, and where in the parsed text (see [`Report`]).
    pub reports: Vec<Report>,
    /// The runner's last closing summary line in the parsed text.
    pub closing_line: Option<ClosingLine>,
    /// The log says `applied patch` (any case) and holds no failure marker.
    pub patch_applied: bool,
    /// The failure marker the log holds, if any.
    pub failure_marker: Option<&'static str>,
    /// Where SWT-bench's code raises on this log (reprobench reads on, as said here).
    pub raises: Option<String>,
}

/// `text` holds `needle`, ASCII letters compared without case. Exactly Python's
/// `needle in text.lower()` for an ASCII `needle` without `k`: no other character lowers to one
/// of its letters.
fn contains_ignore_ascii_case(text: &str, needle: &str) -> bool {
    let (t, n) = (text.as_bytes(), needle.as_bytes());
    t.len() >= n.len() && t.windows(n.len()).any(|w| w.eq_ignore_ascii_case(n))
}

/// Reads one log (`None`: the log file does not exist, as after a timeout).
pub fn read(raw: Option<&str>, family: Family, rules: Rules) -> LogReading {
    let Some(raw) = raw else {
        return LogReading::default();
    };
    let raw = pytext::universal_newlines(raw);
    let raw: &str = &raw;
    let mut reading = LogReading::default();
    let mut content = raw;
    if raw.contains("trace.py --count -C coverage.cover") {
        let mut pieces = TRACED_COMMAND.find_iter(raw);
        match pieces.next() {
            Some(first) => {
                let end = pieces.next().map_or(raw.len(), |m| m.start());
                content = &raw[first.end()..end];
            }
            None => {
                reading.raises = Some(
                    "SWT-bench's grader raises IndexError: the log names the coverage tracer \
                     but has no traced test command line; the whole log was parsed"
                        .into(),
                )
            }
        }
    }
    if content.contains("+ cat coverage.cover")
        && let Some(cut) = content.find("\n+ cat coverage.cover")
    {
        content = &content[..cut];
    }
    if let Some(marker) = FAILURE_MARKERS.iter().find(|m| raw.contains(*m)) {
        reading.failure_marker = Some(marker);
        return reading;
    }
    let parsed = family.parse(content, rules);
    reading.statuses = parsed.statuses;
    reading.reports = parsed.reports;
    reading.closing_line = injection::closing_line(family, content);
    reading.raises = reading.raises.or(parsed.raises);
    reading.patch_applied = contains_ignore_ascii_case(raw, "applied patch");
    reading
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grading::parsers::TestStatus;

    fn read_pytest(raw: &str) -> LogReading {
        read(Some(raw), Family::Pytest, Rules::default())
    }

    #[test]
    fn only_the_traced_command_is_parsed() {
        let log = "+ pip install -e .\nERROR: pip said no\n\
                   + git apply -v -\nApplied patch tests/t.py cleanly.\n\
                   + python3 /root/trace.py --count -C coverage.cover --include-pattern x pytest -rA tests/t.py\n\
                   PASSED tests/t.py::a\n\
                   + cat coverage.cover\n{\"/testbed/x.py\": {\"1\": 1}}\nFAILED tests/t.py::a\n";
        let r = read_pytest(log);
        assert!(r.patch_applied);
        let want: StatusMap = [("tests/t.py::a".to_string(), TestStatus::Passed)].into();
        assert_eq!(r.statuses, want);
    }

    #[test]
    fn without_coverage_the_whole_log_is_parsed() {
        let r = read_pytest("ERROR: pip said no\r\nPASSED tests/t.py::a\rAPPLIED PATCH\n");
        assert_eq!(r.statuses.len(), 2, "{r:?}");
        assert!(r.patch_applied, "any case");
        assert!(!read_pytest("PASSED tests/t.py::a\n").patch_applied);
    }

    #[test]
    fn failure_markers_empty_the_map() {
        let r = read_pytest("Applied patch x cleanly.\nPASSED t.py::a\n>>>>> Tests Timed Out\n");
        assert_eq!(
            r,
            LogReading {
                failure_marker: Some(">>>>> Tests Timed Out"),
                ..LogReading::default()
            }
        );
        assert_eq!(
            read(None, Family::Pytest, Rules::default()),
            LogReading::default()
        );
    }

    #[test]
    fn a_tracer_name_without_its_command_line_is_reported() {
        let r = read_pytest("see trace.py --count -C coverage.cover\nPASSED t.py::a\n");
        assert!(r.raises.is_some());
        assert_eq!(r.statuses.len(), 1);
    }
}
