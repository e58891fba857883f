//! Reading model answers (JSON objects, a test file's path and code), writing the test as a
//! git patch, and classifying a test run on the buggy code.

use super::types::normalize_repo_path;
use crate::TestRun;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A fenced code block: its info string (language tag, lower-cased) and body.
#[derive(Debug, Clone, PartialEq)]
struct Fence<'a> {
    info: String,
    body: &'a str,
    /// Byte range of the whole block (fences included) in the text.
    span: (usize, usize),
}

/// The fenced code blocks of `text` (``` or ~~~), in order; an unclosed last block runs to the end.
fn fences(text: &str) -> Vec<Fence<'_>> {
    let mut out = Vec::new();
    let mut open: Option<(usize, String, usize, &str)> = None; // (start, info, body_start, marker)
    let mut pos = 0;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        let line_end = pos + line.len();
        match &open {
            None => {
                for marker in ["```", "~~~"] {
                    if let Some(rest) = trimmed.strip_prefix(marker) {
                        let info = rest.trim().trim_start_matches(['`', '~']).trim();
                        open = Some((pos, info.to_ascii_lowercase(), line_end, marker));
                        break;
                    }
                }
            }
            Some((start, info, body_start, marker)) => {
                if trimmed.trim_end().starts_with(marker)
                    && trimmed
                        .trim_end()
                        .trim_start_matches(marker.chars().next().unwrap())
                        .is_empty()
                {
                    out.push(Fence {
                        info: info.clone(),
                        body: &text[*body_start..pos],
                        span: (*start, line_end),
                    });
                    open = None;
                }
            }
        }
        pos = line_end;
    }
    if let Some((start, info, body_start, _)) = open {
        out.push(Fence {
            info,
            body: &text[body_start.min(text.len())..],
            span: (start, text.len()),
        });
    }
    out
}

/// The first JSON object in `text`: a ```json block, else any fenced block that is an object,
/// else the first balanced `{...}` that parses (prose around it is ignored). Trailing commas
/// before `}` or `]` are tolerated.
pub fn extract_json_object(text: &str) -> Option<Value> {
    let blocks = fences(text);
    let json_blocks = blocks.iter().filter(|f| f.info.starts_with("json"));
    let other_blocks = blocks.iter().filter(|f| !f.info.starts_with("json"));
    for block in json_blocks.chain(other_blocks) {
        if let Some(v) = parse_object(block.body.trim()) {
            return Some(v);
        }
        if let Some(v) = first_balanced_object(block.body) {
            return Some(v);
        }
    }
    first_balanced_object(text)
}

fn parse_object(candidate: &str) -> Option<Value> {
    let parsed = serde_json::from_str::<Value>(candidate)
        .ok()
        .or_else(|| serde_json::from_str::<Value>(&strip_trailing_commas(candidate)).ok())?;
    parsed.is_object().then_some(parsed)
}

/// Tries each `{` in turn: the balanced span starting there (respecting JSON strings), parsed.
fn first_balanced_object(text: &str) -> Option<Value> {
    let bytes = text.as_bytes();
    let mut search_from = 0;
    while let Some(offset) = text[search_from..].find('{') {
        let start = search_from + offset;
        if let Some(end) = balanced_end(bytes, start)
            && let Some(v) = parse_object(&text[start..=end])
        {
            return Some(v);
        }
        search_from = start + 1;
    }
    None
}

/// Index of the `}` closing the `{` at `start`, skipping braces inside JSON strings.
fn balanced_end(bytes: &[u8], start: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (i, &b) in bytes.iter().enumerate().skip(start) {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' => depth += 1,
            b'}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Removes commas directly followed (after whitespace) by `}` or `]`, outside strings.
fn strip_trailing_commas(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let (mut in_string, mut escaped) = (false, false);
    for (i, &c) in chars.iter().enumerate() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
        } else if c == '"' {
            in_string = true;
        } else if c == ',' {
            let next = chars[i + 1..].iter().find(|c| !c.is_whitespace());
            if matches!(next, Some('}') | Some(']')) {
                continue;
            }
        }
        out.push(c);
    }
    out
}

/// The test file a generation answer proposes.
#[derive(Debug, Clone, PartialEq)]
pub struct TestAnswer {
    /// The path the model named (normalized), if it named one.
    pub path: Option<String>,
    /// The file's contents (ends with a newline).
    pub code: String,
}

/// The test file in a generation answer: the last ```python block (else the last fenced block
/// that defines a `test` function), and the test-file path the answer names (see
/// [`looks_like_test_file`]; `None` when it names none).
pub fn extract_test_answer(text: &str) -> Option<TestAnswer> {
    let blocks = fences(text);
    let block = blocks
        .iter()
        .rev()
        .find(|f| {
            matches!(
                f.info.split_whitespace().next(),
                Some("python" | "py" | "python3")
            )
        })
        .or_else(|| {
            blocks
                .iter()
                .rev()
                .find(|f| f.body.contains("def test") || f.body.contains("class Test"))
        })?;
    let code = block.body.trim_matches('\n');
    if code.trim().is_empty() {
        return None;
    }
    let mut prose = String::with_capacity(text.len());
    let mut last = 0;
    for f in &blocks {
        prose.push_str(&text[last..f.span.0]);
        prose.push('\n');
        last = f.span.1;
    }
    prose.push_str(&text[last.min(text.len())..]);
    let path = test_path_in_answer(&prose, &block.info, code);
    Some(TestAnswer {
        path,
        code: format!("{}\n", code.trim_end()),
    })
}

/// `.py` paths mentioned in `text` (as whitespace- or punctuation-delimited tokens).
fn py_paths(text: &str) -> Vec<String> {
    text.split(|c: char| {
        c.is_whitespace()
            || matches!(
                c,
                '`' | '"' | '\'' | '(' | ')' | ',' | '*' | '<' | '>' | '[' | ']'
            )
    })
    .map(|t| t.trim_end_matches(['.', ':', ';']))
    .filter(|t| t.ends_with(".py") && t.len() > 3)
    .map(normalize_repo_path)
    .filter(|p| is_safe_relative_path(p))
    .collect()
}

/// The first test-file path among: paths on prose lines that say "file" or "path", any path in
/// the prose, the code block's info string (```` ```python tests/test_x.py ````), and a comment
/// on the code's first line.
fn test_path_in_answer(prose: &str, info: &str, code: &str) -> Option<String> {
    let labelled = prose.lines().flat_map(|line| {
        let lower = line.to_ascii_lowercase();
        if lower.contains("file") || lower.contains("path") {
            py_paths(line)
        } else {
            Vec::new()
        }
    });
    let first_comment = code
        .lines()
        .next()
        .and_then(|l| l.trim().strip_prefix('#'))
        .map(py_paths)
        .unwrap_or_default();
    labelled
        .chain(py_paths(prose))
        .chain(py_paths(info))
        .chain(first_comment)
        .find(|p| looks_like_test_file(p))
}

/// A `.py` file whose name marks it as a test (`test*.py` or `*_test.py`), so that a path the
/// model mentions in passing (a source file) is never taken for the test.
pub fn looks_like_test_file(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.ends_with(".py") && (name.starts_with("test") || name.ends_with("_test.py"))
}

/// A relative path that stays inside the repository: no `..`, not absolute, not empty.
pub fn is_safe_relative_path(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && !path.contains('\\')
        && path
            .split('/')
            .all(|part| !part.is_empty() && part != ".." && part != ".")
}

/// A git-style unified diff that creates `path` with `contents` (applies with `git apply`).
pub use reprobench_swt::patch::new_file_diff as new_file_patch;

/// What a test run on the buggy code says about a candidate reproduction test.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "signal", rename_all = "snake_case")]
pub enum RunSignal {
    /// The test passed: it does not reproduce the bug.
    Passed,
    /// The test failed in its own logic: an assertion or an exception raised by the code under
    /// test (named when the output shows it).
    Failed {
        /// The exception's name, e.g. `AssertionError`, `ValueError`.
        exception: Option<String>,
    },
    /// The test never got to its logic: import, syntax, fixture or collection errors, no test
    /// collected, or a test-runner error.
    SetupError {
        /// The error kind, e.g. `ModuleNotFoundError`, `fixture not found`.
        kind: String,
        /// The output line that shows it.
        detail: String,
    },
    /// Killed at the timeout.
    TimedOut,
}

impl RunSignal {
    /// A short label: `passed`, `failed`, `setup_error`, `timed_out`.
    pub fn label(&self) -> &'static str {
        match self {
            RunSignal::Passed => "passed",
            RunSignal::Failed { .. } => "failed",
            RunSignal::SetupError { .. } => "setup_error",
            RunSignal::TimedOut => "timed_out",
        }
    }

    /// One sentence describing the signal, for prompts and logs.
    pub fn describe(&self) -> String {
        match self {
            RunSignal::Passed => "the test PASSED on the buggy code".into(),
            RunSignal::Failed { exception: Some(e) } => {
                format!("the test FAILED on the buggy code with {e}")
            }
            RunSignal::Failed { exception: None } => "the test FAILED on the buggy code".into(),
            RunSignal::SetupError { kind, detail } => {
                format!("the test did not reach its logic: {kind} ({detail})")
            }
            RunSignal::TimedOut => "the test run TIMED OUT".into(),
        }
    }
}

/// The setup-error kind of a run in which no test ran.
const NO_TESTS: &str = "no tests ran";

/// Output markers of errors that stop a test before its logic runs: (needle, kind).
const SETUP_MARKERS: &[(&str, &str)] = &[
    ("ModuleNotFoundError", "ModuleNotFoundError"),
    ("ImportError while importing test module", "ImportError"),
    ("ImportError", "ImportError"),
    ("SyntaxError", "SyntaxError"),
    ("IndentationError", "IndentationError"),
    ("TabError", "TabError"),
    ("ERROR collecting", "collection error"),
    ("errors during collection", "collection error"),
    ("error during collection", "collection error"),
    ("ERROR at setup of", "setup error"),
    ("INTERNALERROR", "test runner internal error"),
    ("error: unrecognized arguments", "test runner usage error"),
    ("file or directory not found", "test file not found"),
    ("no tests ran", NO_TESTS),
    ("collected 0 items", NO_TESTS),
    ("Ran 0 tests", NO_TESTS),
];

/// Classifies a run on the buggy code: timed out; setup error (import, syntax, fixture or
/// collection errors, or no test ran); passed (exit code 0); else failed, naming the exception
/// when the output shows one. Pure: only looks at the exit code and output.
pub fn classify_run(run: &TestRun) -> RunSignal {
    if run.timed_out {
        return RunSignal::TimedOut;
    }
    // A run that exited 0 only counts as a setup error when nothing ran.
    let only_no_tests = run.exit_code == Some(0);
    if let Some(signal) = setup_error(&run.output, only_no_tests) {
        return signal;
    }
    match run.exit_code {
        Some(0) => RunSignal::Passed,
        Some(_) => RunSignal::Failed {
            exception: failing_exception(&run.output),
        },
        None => RunSignal::SetupError {
            kind: "killed".into(),
            detail: "the test process ended without an exit code".into(),
        },
    }
}

fn setup_error(output: &str, only_no_tests: bool) -> Option<RunSignal> {
    let markers = SETUP_MARKERS
        .iter()
        .filter(|(_, kind)| !only_no_tests || *kind == NO_TESTS);
    if only_no_tests {
        return first_marker(output, markers);
    }
    for line in output.lines() {
        if let Some(name) = fixture_not_found(line) {
            return Some(RunSignal::SetupError {
                kind: "fixture not found".into(),
                detail: format!("fixture '{name}' not found"),
            });
        }
    }
    first_marker(output, markers)
}

/// The setup error of the first of `markers` (in their order) found in `output`.
fn first_marker<'m>(
    output: &str,
    markers: impl Iterator<Item = &'m (&'m str, &'m str)>,
) -> Option<RunSignal> {
    for (needle, kind) in markers {
        if let Some(line) = output.lines().find(|l| l.contains(needle)) {
            return Some(RunSignal::SetupError {
                kind: (*kind).to_string(),
                detail: shorten(line.trim(), 200),
            });
        }
    }
    None
}

fn fixture_not_found(line: &str) -> Option<&str> {
    let rest = &line[line.find("fixture '")? + "fixture '".len()..];
    let end = rest.find('\'')?;
    rest[end..]
        .starts_with("' not found")
        .then_some(&rest[..end])
}

/// The exception that failed the test: pytest's `E   Name: …` lines, else the last line that
/// starts with an exception name.
fn failing_exception(output: &str) -> Option<String> {
    let exception_name = |s: &str| -> Option<String> {
        let head = s.split([':', ' ', '(']).next()?.trim();
        let short = head.rsplit('.').next()?;
        let looks_like = (short.ends_with("Error")
            || short.ends_with("Exception")
            || short.ends_with("Warning")
            || short == "Failed"
            || short == "KeyboardInterrupt"
            || short == "StopIteration")
            && short.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && short.chars().next().is_some_and(|c| c.is_ascii_uppercase());
        looks_like.then(|| short.to_string())
    };
    let pytest_e = output.lines().find_map(|l| {
        let rest = l.strip_prefix('E')?;
        rest.starts_with(char::is_whitespace)
            .then(|| exception_name(rest.trim_start()))
            .flatten()
    });
    if pytest_e.is_some() {
        return pytest_e;
    }
    if output.contains("assert ") && output.contains("FAILED") {
        return Some("AssertionError".into());
    }
    output.lines().rev().find_map(|l| {
        exception_name(l.trim_start()).filter(|_| l.contains(':') || l.trim().len() < 60)
    })
}

/// `text` cut to at most `max` characters (on a char boundary), with `…` when cut.
pub fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut out: String = text.chars().take(max).collect();
    out.push('…');
    out
}

/// The head and tail of a long test output, for prompts: at most `max` characters.
pub fn output_excerpt(output: &str, max: usize) -> String {
    let count = output.chars().count();
    if count <= max {
        return output.to_string();
    }
    let head_len = max / 4;
    let tail_len = max - head_len;
    let head: String = output.chars().take(head_len).collect();
    let tail: String = output.chars().skip(count - tail_len).collect();
    format!("{head}\n[… {} characters omitted …]\n{tail}", count - max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_from_fence_bare_text_and_trailing_prose() {
        let fenced = "Here it is:\n```json\n{\"a\": 1, \"b\": [1, 2,],}\n```\nThanks!";
        assert_eq!(
            extract_json_object(fenced),
            Some(json!({"a": 1, "b": [1, 2]}))
        );
        let bare =
            "I think {not json} but {\"x\": \"has } brace\", \"y\": {\"z\": true}} and more {";
        assert_eq!(
            extract_json_object(bare),
            Some(json!({"x": "has } brace", "y": {"z": true}}))
        );
        let unlabelled = "```\n{\"k\": null}\n```";
        assert_eq!(extract_json_object(unlabelled), Some(json!({"k": null})));
        assert_eq!(extract_json_object("no json here [1, 2]"), None);
        assert_eq!(extract_json_object("{{{{"), None);
    }

    #[test]
    fn test_answer_takes_path_and_last_python_block() {
        let text = "Test file: `tests/test_issue.py`\n\n```python\nimport x\n\ndef test_a():\n    assert x.f() == 1\n```\n";
        let answer = extract_test_answer(text).unwrap();
        assert_eq!(answer.path.as_deref(), Some("tests/test_issue.py"));
        assert_eq!(
            answer.code,
            "import x\n\ndef test_a():\n    assert x.f() == 1\n"
        );

        let commented =
            "```py\n# file: /testbed/pkg/tests/test_bug.py\ndef test_b():\n    assert False\n```";
        let answer = extract_test_answer(commented).unwrap();
        assert_eq!(answer.path.as_deref(), Some("pkg/tests/test_bug.py"));

        let unnamed = "```\ndef test_c():\n    assert 0\n```";
        assert_eq!(extract_test_answer(unnamed).unwrap().path, None);
        assert_eq!(
            extract_test_answer("just words about tests/test_x.py"),
            None
        );
        let mentions_source = "I fixed the import from pkg/calc.py.\nFile: tests/test_calc_bug.py\n```python\ndef test_e(): pass\n```";
        assert_eq!(
            extract_test_answer(mentions_source)
                .unwrap()
                .path
                .as_deref(),
            Some("tests/test_calc_bug.py")
        );
        let in_info = "```python tests/test_f.py\ndef test_f(): pass\n```";
        assert_eq!(
            extract_test_answer(in_info).unwrap().path.as_deref(),
            Some("tests/test_f.py")
        );
        let only_source = "File: pkg/calc.py\n```python\ndef test_g(): pass\n```";
        assert_eq!(extract_test_answer(only_source).unwrap().path, None);
        let escaping = "Path: ../../etc/test_evil.py\n```python\ndef test_d(): pass\n```";
        assert_eq!(extract_test_answer(escaping).unwrap().path, None);
    }

    #[test]
    fn patch_has_git_headers_and_counts_lines() {
        let patch = new_file_patch("tests/test_x.py", "a\nb\n");
        assert_eq!(
            patch,
            "diff --git a/tests/test_x.py b/tests/test_x.py\nnew file mode 100644\n--- /dev/null\n+++ b/tests/test_x.py\n@@ -0,0 +1,2 @@\n+a\n+b\n"
        );
        let no_newline = new_file_patch("t.py", "x = 1");
        assert!(no_newline.ends_with("@@ -0,0 +1 @@\n+x = 1\n\\ No newline at end of file\n"));
        let blank_lines = new_file_patch("t.py", "\n\nx\n");
        assert!(blank_lines.ends_with("@@ -0,0 +1,3 @@\n+\n+\n+x\n"));
    }

    #[test]
    fn patch_applies_with_git_apply() {
        let git_ok = std::process::Command::new("git")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !git_ok {
            eprintln!("skipping patch_applies_with_git_apply: git is not on PATH");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let git = |args: &[&str], stdin: Option<&str>| {
            use std::io::Write;
            let mut child = std::process::Command::new("git")
                .args(args)
                .current_dir(dir.path())
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            if let Some(input) = stdin {
                child
                    .stdin
                    .take()
                    .unwrap()
                    .write_all(input.as_bytes())
                    .unwrap();
            }
            child.wait_with_output().unwrap()
        };
        assert!(git(&["init", "-q"], None).status.success());
        let cases = [
            (
                "tests/test_a.py",
                "import os\n\n\ndef test_a():\n    assert os.sep == '\\\\'\n",
            ),
            ("test_b.py", "def test_b():\n    assert 1 == 2"),
            ("pkg/tests/test_c.py", "x = 1\n"),
        ];
        for (path, contents) in cases {
            let patch = new_file_patch(path, contents);
            let check = git(&["apply", "--check", "-"], Some(&patch));
            assert!(
                check.status.success(),
                "git apply --check failed for {path}: {}",
                String::from_utf8_lossy(&check.stderr)
            );
            let apply = git(&["apply", "-"], Some(&patch));
            assert!(apply.status.success());
            let written = std::fs::read_to_string(dir.path().join(path)).unwrap();
            assert_eq!(written, contents);
        }
    }

    fn run(exit_code: Option<i64>, timed_out: bool, output: &str) -> TestRun {
        TestRun {
            exit_code,
            timed_out,
            output: output.into(),
        }
    }

    #[test]
    fn classify_run_tells_pass_fail_setup_and_timeout_apart() {
        assert_eq!(classify_run(&run(None, true, "")), RunSignal::TimedOut);
        assert_eq!(
            classify_run(&run(Some(0), false, "1 passed in 0.1s")),
            RunSignal::Passed
        );
        let assertion = "    def test_a():\n>       assert f() == 2\nE       assert 1 == 2\nFAILED test_a.py::test_a - assert 1 == 2";
        assert_eq!(
            classify_run(&run(Some(1), false, assertion)),
            RunSignal::Failed {
                exception: Some("AssertionError".into())
            }
        );
        let raised = "E       ValueError: bad input\nFAILED t.py::test_x - ValueError: bad input";
        assert_eq!(
            classify_run(&run(Some(1), false, raised)),
            RunSignal::Failed {
                exception: Some("ValueError".into())
            }
        );
        let traceback = "Traceback (most recent call last):\n  File \"x\", line 1\ndjango.core.exceptions.FieldError: Cannot resolve\nFAILED (errors=1)";
        assert_eq!(
            classify_run(&run(Some(1), false, traceback)),
            RunSignal::Failed {
                exception: Some("FieldError".into())
            }
        );
    }

    #[test]
    fn classify_run_spots_setup_errors() {
        let cases = [
            (
                "E   ModuleNotFoundError: No module named 'foo'",
                "ModuleNotFoundError",
            ),
            (
                "ImportError while importing test module '/t.py'.",
                "ImportError",
            ),
            (
                "E     File \"t.py\", line 3\nE   SyntaxError: invalid syntax",
                "SyntaxError",
            ),
            (
                "E       fixture 'tmp_dir' not found\n>       available fixtures: tmp_path",
                "fixture not found",
            ),
            ("ERROR collecting tests/test_x.py", "collection error"),
            ("collected 0 items\n\nno tests ran in 0.01s", "no tests ran"),
        ];
        for (output, kind) in cases {
            match classify_run(&run(Some(1), false, output)) {
                RunSignal::SetupError { kind: k, .. } => assert_eq!(k, kind, "{output}"),
                other => panic!("{output}: {other:?}"),
            }
        }
        assert_eq!(
            classify_run(&run(Some(0), false, "ImportError shim\ncollected 0 items")),
            RunSignal::SetupError {
                kind: NO_TESTS.into(),
                detail: "collected 0 items".into()
            },
            "exit 0 with nothing run is not a pass"
        );
        assert_eq!(classify_run(&run(None, false, "")).label(), "setup_error");
        assert_eq!(
            classify_run(&run(Some(0), false, "warning: ImportError shim\n1 passed")),
            RunSignal::Passed,
            "a passing run that mentions an error name still passed"
        );
    }

    #[test]
    fn excerpts_keep_head_and_tail() {
        let long: String = (0..1000).map(|i| format!("{i}\n")).collect();
        let excerpt = output_excerpt(&long, 200);
        assert!(excerpt.starts_with("0\n1\n"));
        assert!(excerpt.ends_with("999\n"));
        assert!(excerpt.contains("omitted"));
        assert_eq!(shorten("abcdef", 3), "abc…");
        assert_eq!(shorten("ab", 3), "ab");
    }
}
