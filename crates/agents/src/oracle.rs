//! The SWT oracle: a stand-in backbone that answers the SWT agents' requests as a perfect model
//! would, from each instance's golden patches. It is not a language model and never poses as
//! one: it proves the pipeline from an agent's answer to a verdict (parsing, placement, diff
//! construction, paths, environments) on real instances without a large model.
//!
//! A perfect model, per protocol:
//! - `reproagent`: localization names the golden patch's files and changed lines, root-cause
//!   analysis and planning describe the golden change and the golden test, generation writes the
//!   golden tests as a new file (the golden test file after the golden test patch, its tests cut
//!   to those the patch adds or changes), review accepts;
//! - `zero-shot-plus`: in SWT-bench's custom diff format, the blocks that turn each Python file of
//!   the golden test patch into its text after the patch, as exactly as the format allows;
//! - `libro`: the same new file of the golden tests.
//!
//! The oracle is stateless: each request is answered from its own text (the issue in it names
//! the instance; the system prompt names the agent and the stage). Pure: the test file's text at
//! the base commit is read by the caller ([`OracleCase::of`]).

use crate::custom_diff;
use crate::reproagent::Stage;
use crate::reproagent::prompts::stage_of_system_prompt;
use reprobench_domain::swt::SwtInstance;
use reprobench_swt::patch;
use serde_json::{Value, json};
use std::collections::BTreeSet;

/// What every oracle answer says of itself (the server's `reprobench_note`).
pub const ORACLE_NOTE: &str = "reprobench oracle: answers from the instance's golden patches \
(or an android report's ground truth), not a language model";

/// How many characters of the issue identify an instance in a prompt.
const ISSUE_KEY_CHARS: usize = 200;

/// What the oracle knows of one instance.
#[derive(Debug, Clone, PartialEq)]
pub struct OracleCase {
    /// Instance id.
    pub instance_id: String,
    /// The issue's first characters, whitespace collapsed: how a prompt names the instance.
    issue_key: String,
    /// The golden code patch.
    patch: String,
    /// The golden code patch's changed ranges ([`changed_ranges`]); `Err` says why it cannot be
    /// read (then localization and root cause answer with that, never with an empty list).
    changed: Result<Vec<(String, usize, usize)>, String>,
    /// The golden fail-to-pass tests.
    fail_to_pass: Vec<String>,
    /// The golden test file (the test patch's Python file with the most added lines) and the
    /// golden tests as a new file made from it ([`golden_tests_only`]); `Err` says why there is
    /// none.
    test_file: Result<(String, String), String>,
    /// A perfect `zero-shot-plus` answer ([`custom_diff_answer`]); `Err` says why there is none.
    custom_diff: Result<String, String>,
}

impl OracleCase {
    /// The case of `inst`; `file_at(path)` reads a file at the instance's base commit (`None`:
    /// no such file, as for a file the test patch creates).
    pub fn of(inst: &SwtInstance, file_at: impl Fn(&str) -> Option<String>) -> OracleCase {
        OracleCase {
            instance_id: inst.instance_id.clone(),
            issue_key: issue_key(&inst.problem_statement),
            patch: inst.patch.clone(),
            changed: changed_ranges(&inst.patch),
            fail_to_pass: inst.fail_to_pass.clone(),
            test_file: golden_test_file(&inst.test_patch, &file_at),
            custom_diff: custom_diff_answer(&inst.test_patch, &file_at),
        }
    }

    /// Why the oracle cannot answer some of this instance's questions as a perfect model would
    /// (an unreadable golden patch, no golden test file, no custom diff); empty when it can.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Err(why) = &self.changed {
            out.push(format!("the golden code patch cannot be read ({why})"));
        }
        if let Err(why) = &self.test_file {
            out.push(format!("no golden test file to answer with ({why})"));
        }
        if let Err(why) = &self.custom_diff {
            out.push(format!("no custom diff for zero-shot-plus ({why})"));
        }
        out
    }

    /// The golden test file's path and text, or why the oracle has none.
    pub fn test_file(&self) -> Result<(&str, &str), &str> {
        match &self.test_file {
            Ok((path, text)) => Ok((path, text)),
            Err(why) => Err(why),
        }
    }
}

/// The first characters of an issue, whitespace collapsed.
fn issue_key(issue: &str) -> String {
    collapse(issue).chars().take(ISSUE_KEY_CHARS).collect()
}

fn collapse(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The test patch's Python file with the most added lines, and its text after the patch.
fn golden_test_file(
    test_patch: &str,
    file_at: impl Fn(&str) -> Option<String>,
) -> Result<(String, String), String> {
    let path = patch::diff_files(test_patch)
        .into_iter()
        .filter_map(|f| f.new)
        .filter(|p| p.ends_with(".py"))
        .max_by_key(|p| added_lines(test_patch, p))
        .ok_or("the golden test patch changes no Python file")?;
    let before = file_at(&path).unwrap_or_default();
    let after = patch::apply_to_text(&before, test_patch, &path)?;
    let tests = golden_tests_only(&after, &added_line_numbers(test_patch, &path))?;
    Ok((path, tests))
}

/// The 1-based line numbers, in the file after `patch`, of the lines it adds to `path`.
fn added_line_numbers(patch: &str, path: &str) -> BTreeSet<usize> {
    patch::hunks_of(patch, path)
        .unwrap_or_default()
        .iter()
        .flat_map(|h| h.added_line_numbers().collect::<Vec<_>>())
        .collect()
}

/// The golden test file as a new file of the golden tests: everything that is no test
/// (imports, helpers, fixtures, settings, test classes' other members) is kept, and of the test
/// functions and methods (`test*`) only those with a line the golden patch adds. A perfect
/// model asked for a new test file writes the golden tests, not a copy of every test beside
/// them (whose failures without a network, say, would count as the prediction's).
fn golden_tests_only(text: &str, added: &BTreeSet<usize>) -> Result<String, String> {
    let mut parser = tree_sitter::Parser::new();
    parser
        .set_language(&tree_sitter_python::LANGUAGE.into())
        .map_err(|e| format!("the Python grammar cannot be loaded: {e}"))?;
    let tree = parser
        .parse(text, None)
        .ok_or("the golden test file cannot be parsed")?;
    let touched = |node: tree_sitter::Node| {
        added
            .range(node.start_position().row + 1..=node.end_position().row + 1)
            .next()
            .is_some()
    };
    let mut cut: Vec<(usize, usize)> = Vec::new();
    let mut root = tree.root_node().walk();
    for item in tree.root_node().children(&mut root) {
        let definition = definition_of(item);
        match definition.map(|d| d.kind()) {
            Some("function_definition") if is_test(definition, text) && !touched(item) => {
                cut.push(whole_lines(text, item));
            }
            Some("class_definition") => {
                let Some(body) = definition.and_then(|d| d.child_by_field_name("body")) else {
                    continue;
                };
                let mut walk = body.walk();
                let members: Vec<_> = body.named_children(&mut walk).collect();
                let untouched_tests: Vec<_> = members
                    .iter()
                    .filter(|m| {
                        definition_of(**m).is_some_and(|d| {
                            d.kind() == "function_definition" && is_test(Some(d), text)
                        }) && !touched(**m)
                    })
                    .collect();
                if untouched_tests.is_empty() {
                    continue;
                }
                let statements = members.iter().filter(|m| m.kind() != "comment").count();
                if untouched_tests.len() == statements {
                    // A class left without statements (comments are none): the class goes too.
                    cut.push(whole_lines(text, item));
                } else {
                    cut.extend(untouched_tests.iter().map(|m| whole_lines(text, **m)));
                }
            }
            _ => {}
        }
    }
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (start, end) in cut {
        out.push_str(&text[at..start.max(at)]);
        at = end.max(at);
    }
    out.push_str(&text[at..]);
    Ok(out)
}

/// The function or class a statement defines (through its decorators), if it defines one.
fn definition_of(node: tree_sitter::Node) -> Option<tree_sitter::Node> {
    match node.kind() {
        "function_definition" | "class_definition" => Some(node),
        "decorated_definition" => node.child_by_field_name("definition"),
        _ => None,
    }
}

/// Whether a function definition is a test (its name starts with `test`).
fn is_test(definition: Option<tree_sitter::Node>, text: &str) -> bool {
    definition
        .and_then(|d| d.child_by_field_name("name"))
        .and_then(|n| text.get(n.byte_range()))
        .is_some_and(|name| name.starts_with("test"))
}

/// The byte range of the whole lines `node` spans (its line's start to the end of its last line)
/// and the blank lines after them.
fn whole_lines(text: &str, node: tree_sitter::Node) -> (usize, usize) {
    let start = text[..node.start_byte()].rfind('\n').map_or(0, |i| i + 1);
    let mut end = text[node.end_byte()..]
        .find('\n')
        .map_or(text.len(), |i| node.end_byte() + i + 1);
    while let Some(line) = text[end..].split_inclusive('\n').next() {
        if !line.trim().is_empty() {
            break;
        }
        end += line.len();
    }
    (start, end)
}

/// A perfect `zero-shot-plus` answer: a custom diff whose blocks turn each Python file of the
/// golden test patch from its text at the base commit into its text after the patch, as far as
/// the format can ([`custom_diff::blocks_between`]).
fn custom_diff_answer(
    test_patch: &str,
    file_at: impl Fn(&str) -> Option<String>,
) -> Result<String, String> {
    let mut blocks = Vec::new();
    let mut problems = Vec::new();
    let paths = patch::diff_files(test_patch)
        .into_iter()
        .filter_map(|f| f.new)
        .filter(|p| p.ends_with(".py"));
    for path in paths {
        let before = file_at(&path);
        match patch::apply_to_text(before.as_deref().unwrap_or(""), test_patch, &path) {
            Ok(after) => blocks.extend(custom_diff::blocks_between(
                &path,
                before.as_deref(),
                &after,
            )),
            Err(why) => problems.push(why),
        }
    }
    if blocks.is_empty() {
        return Err(problems
            .into_iter()
            .next()
            .unwrap_or_else(|| "the golden test patch changes no Python file".to_string()));
    }
    Ok(custom_diff::render(&blocks))
}

/// Lines `patch` adds to `path`.
fn added_lines(patch: &str, path: &str) -> usize {
    patch::hunks_of(patch, path)
        .unwrap_or_default()
        .iter()
        .map(|h| h.lines.iter().filter(|(k, _)| *k == '+').count())
        .sum()
}

/// Which protocol a request belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    ReproAgent(Stage),
    ZeroShotPlus,
    Libro,
}

/// The SWT agents' oracle over a set of instances.
#[derive(Debug, Clone, Default)]
pub struct SwtOracle {
    cases: Vec<OracleCase>,
}

impl SwtOracle {
    /// An oracle knowing `cases`.
    pub fn new(cases: Vec<OracleCase>) -> SwtOracle {
        SwtOracle { cases }
    }

    /// The instances it knows.
    pub fn cases(&self) -> &[OracleCase] {
        &self.cases
    }

    /// The assistant message a perfect model would send for this chat-completions request
    /// body, as `{"content": ..., "tool_calls": []}`; `None` when the request is no SWT agent's
    /// or names no instance the oracle knows. An instance without a usable golden test file is
    /// answered with a text that says so (the agent then fails as it would on a useless answer).
    pub fn answer(&self, request: &Value) -> Option<Value> {
        let messages = request.get("messages")?.as_array()?;
        let system = messages
            .iter()
            .find(|m| m["role"] == "system")
            .map(message_text)
            .unwrap_or_default();
        let protocol = protocol_of(&system)?;
        let text = collapse(
            &messages
                .iter()
                .map(message_text)
                .collect::<Vec<_>>()
                .join("\n"),
        );
        let case = self
            .cases
            .iter()
            .filter(|c| !c.issue_key.is_empty() && text.contains(&c.issue_key))
            .max_by_key(|c| c.issue_key.len())?;
        Some(json!({"content": reply(case, protocol), "tool_calls": []}))
    }
}

/// A message's text (string content, or its text parts).
fn message_text(message: &Value) -> String {
    match &message["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

fn protocol_of(system: &str) -> Option<Protocol> {
    if let Some(stage) = stage_of_system_prompt(system) {
        return Some(Protocol::ReproAgent(stage));
    }
    let first = system.lines().next().unwrap_or_default();
    if first.starts_with(crate::baselines::ZSP_MARKER) {
        Some(Protocol::ZeroShotPlus)
    } else if first.starts_with(crate::baselines::LIBRO_MARKER) {
        Some(Protocol::Libro)
    } else {
        None
    }
}

/// A fenced block of `code` with a fence that no line of `code` closes.
fn fenced(info: &str, code: &str) -> String {
    let fence = ["```", "~~~", "````", "~~~~~"]
        .into_iter()
        .find(|f| !code.lines().any(|l| l.trim_start().starts_with(f)))
        .unwrap_or("``````");
    let newline = if code.ends_with('\n') { "" } else { "\n" };
    format!("{fence}{info}\n{code}{newline}{fence}\n")
}

/// The golden code patch's changed ranges: (path, first old line, last old line); `Err` when
/// the patch cannot be read or changes no file.
fn changed_ranges(code_patch: &str) -> Result<Vec<(String, usize, usize)>, String> {
    let files = patch::file_hunks(code_patch)?;
    if files.is_empty() {
        return Err("it changes no file".into());
    }
    let mut out = Vec::new();
    for file in &files {
        let Some(path) = file.old.as_ref().or(file.new.as_ref()) else {
            continue;
        };
        for hunk in &file.hunks {
            let last = hunk.old_start + hunk.old_len().max(1) - 1;
            out.push((path.clone(), hunk.old_start, last));
        }
    }
    Ok(out)
}

/// The test function of a fail-to-pass id (`tests/x.py::T::test_a[p]` → `test_a`;
/// `test_a (app.tests.T)` → `test_a`).
fn test_function(id: &str) -> String {
    let id = id.split(" (").next().unwrap_or(id);
    let id = id.rsplit("::").next().unwrap_or(id);
    id.split('[').next().unwrap_or(id).to_string()
}

fn reply(case: &OracleCase, protocol: Protocol) -> String {
    let files = crate::run::golden_files(&case.patch);
    let ranges = match (&case.changed, protocol) {
        (Ok(ranges), _) => ranges.as_slice(),
        (Err(why), Protocol::ReproAgent(Stage::Localization | Stage::RootCause)) => {
            return format!("The oracle cannot read the golden code patch of this instance: {why}");
        }
        (Err(_), _) => &[],
    };
    let test = case.test_file();
    let test_path = test.map(|(p, _)| p.to_string()).unwrap_or_default();
    let test_names: Vec<String> = case.fail_to_pass.iter().map(|t| test_function(t)).collect();
    match protocol {
        Protocol::ReproAgent(Stage::Localization) => json!({
            "files": files.iter().map(|f| json!({"path": f,
                "rationale": "the golden patch changes this file", "confidence": 1.0}))
                .collect::<Vec<_>>(),
            "functions": [],
            "lines": ranges.iter().map(|(p, a, b)| json!({"path": p, "start_line": a,
                "end_line": b, "rationale": "the golden patch changes these lines",
                "confidence": 1.0})).collect::<Vec<_>>(),
        })
        .to_string(),
        Protocol::ReproAgent(Stage::RootCause) => json!({
            "summary": format!("The fault is in the code the golden patch changes ({}).",
                files.join(", ")),
            "error_category": "the golden patch's fix",
            "execution_path": ranges.iter().map(|(p, a, _)| format!("{p}:{a} - changed by the fix"))
                .collect::<Vec<_>>(),
            "trigger_conditions": [format!("what the golden tests {} exercise",
                test_names.join(", "))],
            "confidence": 1.0,
        })
        .to_string(),
        Protocol::ReproAgent(Stage::Planning) => json!({
            "environment_constraints": ["as in the golden test file"],
            "minimal_inputs": ["as in the golden tests"],
            "expected_assertions": ["the golden tests' assertions"],
            "test_path": test_path,
            "test_name": test_names.first().cloned().unwrap_or_default(),
        })
        .to_string(),
        Protocol::ReproAgent(Stage::Generation) => match test {
            Ok((path, text)) => format!("Test file: {path}\n{}", fenced("python", text)),
            Err(why) => format!("The oracle has no golden test file for this instance: {why}"),
        },
        Protocol::ReproAgent(Stage::Review) => json!({
            "aligns_with_issue": true,
            "failure_from_test_logic": true,
            "matches_reported_symptom": true,
            "feedback": "",
        })
        .to_string(),
        Protocol::ZeroShotPlus => match &case.custom_diff {
            Ok(answer) => answer.clone(),
            Err(why) => format!("The oracle has no custom diff for this instance: {why}"),
        },
        Protocol::Libro => match test {
            Ok((_, text)) => fenced("python", text),
            Err(why) => format!("The oracle has no golden test file for this instance: {why}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance() -> SwtInstance {
        serde_json::from_value(json!({
            "instance_id": "o__r-1",
            "repo": "o/r",
            "base_commit": "abc",
            "patch": "diff --git a/pkg/m.py b/pkg/m.py\n--- a/pkg/m.py\n+++ b/pkg/m.py\n@@ -3,2 +3,2 @@\n def f():\n-    return 1\n+    return 2\n",
            "test_patch": "diff --git a/tests/test_m.py b/tests/test_m.py\n--- a/tests/test_m.py\n+++ b/tests/test_m.py\n@@ -1,2 +1,6 @@\n import pkg\n def test_old(): pass\n+\n+\n+def test_f():\n+    assert pkg.m.f() == 2\n",
            "problem_statement": "  f() returns\n 1,   but the docs say 2.\n",
            "FAIL_TO_PASS": ["tests/test_m.py::test_f"],
        }))
        .unwrap()
    }

    fn oracle() -> SwtOracle {
        let base = "import pkg\ndef test_old(): pass\n".to_string();
        SwtOracle::new(vec![OracleCase::of(&instance(), move |p| {
            (p == "tests/test_m.py").then(|| base.clone())
        })])
    }

    fn request(system: &str, user: &str) -> Value {
        json!({"messages": [{"role": "system", "content": system},
                            {"role": "user", "content": user}]})
    }

    #[test]
    fn generation_writes_the_golden_tests_as_a_new_file_and_review_accepts() {
        let o = oracle();
        let issue = "Repository: o/r\n<issue>\nf() returns 1, but the docs say 2.\n</issue>";
        let generated = o
            .answer(&request(
                &crate::reproagent::prompts::system_prompt(Stage::Generation),
                issue,
            ))
            .unwrap();
        let answer =
            crate::reproagent::parse::extract_test_answer(generated["content"].as_str().unwrap())
                .unwrap();
        assert_eq!(answer.path.as_deref(), Some("tests/test_m.py"));
        assert_eq!(
            answer.code,
            "import pkg\ndef test_f():\n    assert pkg.m.f() == 2\n"
        );
        let review = o
            .answer(&request(
                &crate::reproagent::prompts::system_prompt(Stage::Review),
                issue,
            ))
            .unwrap();
        let verdict: Value = serde_json::from_str(review["content"].as_str().unwrap()).unwrap();
        assert_eq!(verdict["aligns_with_issue"], true);
        let loc = o
            .answer(&request(
                &crate::reproagent::prompts::system_prompt(Stage::Localization),
                issue,
            ))
            .unwrap();
        let loc: Value = serde_json::from_str(loc["content"].as_str().unwrap()).unwrap();
        assert_eq!(loc["files"][0]["path"], "pkg/m.py");
        assert_eq!(loc["lines"][0]["start_line"], 3);
    }

    #[test]
    fn an_unreadable_golden_patch_is_said_not_answered_with_empty_lists() {
        let mut inst = instance();
        inst.patch = "diff --git a/pkg/m.py b/pkg/m.py\n--- a/pkg/m.py\n+++ b/pkg/m.py\n@@ -x,2 +3,2 @@\n def f():\n".into();
        let case = OracleCase::of(&inst, |_| None);
        let problems = case.problems();
        assert!(
            problems
                .iter()
                .any(|p| p.contains("golden code patch cannot be read")
                    && p.contains("@@ -x,2 +3,2 @@")),
            "{problems:?}"
        );
        let o = SwtOracle::new(vec![case]);
        let issue = "Repository: o/r\n<issue>\nf() returns 1, but the docs say 2.\n</issue>";
        for stage in [Stage::Localization, Stage::RootCause] {
            let answer = o
                .answer(&request(
                    &crate::reproagent::prompts::system_prompt(stage),
                    issue,
                ))
                .unwrap();
            let text = answer["content"].as_str().unwrap();
            assert!(text.contains("cannot read the golden code patch"), "{text}");
        }
        assert!(oracle().cases()[0].problems().is_empty());
    }

    #[test]
    fn the_baselines_get_the_golden_test_patch_and_file() {
        let o = oracle();
        let issue = "# Issue\nf() returns 1,\nbut the docs say 2.";
        let zsp = o
            .answer(&request(crate::baselines::ZSP_MARKER, issue))
            .unwrap();
        // A custom diff that converts to a patch giving exactly the golden test file.
        let blocks = custom_diff::parse(zsp["content"].as_str().unwrap());
        assert!(custom_diff::is_custom_diff(&blocks), "{zsp}");
        let base = "import pkg\ndef test_old(): pass\n";
        let converted = custom_diff::convert(&blocks, |p| {
            Ok((p == "tests/test_m.py").then(|| base.to_string()))
        });
        let golden = patch::apply_to_text(base, &instance().test_patch, "tests/test_m.py");
        let patch = converted.patch.expect("a patch");
        assert_eq!(
            patch::apply_to_text(base, &patch, "tests/test_m.py"),
            golden,
            "{patch}"
        );
        let libro = o
            .answer(&request(crate::baselines::LIBRO_MARKER, issue))
            .unwrap();
        let blocks = crate::baselines::fenced_blocks(libro["content"].as_str().unwrap());
        assert!(
            blocks[0].1.ends_with("assert pkg.m.f() == 2\n"),
            "{blocks:?}"
        );
    }

    #[test]
    fn requests_of_no_known_instance_or_agent_are_left_to_others() {
        let o = oracle();
        assert_eq!(
            o.answer(&request(crate::baselines::LIBRO_MARKER, "another issue")),
            None
        );
        assert_eq!(
            o.answer(&request(
                "You are a helpful assistant.",
                "f() returns 1, but the docs say 2."
            )),
            None
        );
    }

    #[test]
    fn only_the_tests_the_golden_patch_adds_or_changes_are_kept() {
        let before = "import os\n\n\nclass TestA:\n    def setup_method(self):\n        self.x = 1\n\n    def test_old(self):\n        assert os\n\n\nclass TestB:\n    def test_b(self):\n        pass\n    # a comment is no statement\n\n\n@mark\ndef test_mod():\n    pass\n";
        let patch = "diff --git a/t/test_a.py b/t/test_a.py\n--- a/t/test_a.py\n+++ b/t/test_a.py\n@@ -8,6 +8,9 @@ class TestA:\n     def test_old(self):\n         assert os\n \n+    def test_new(self):\n+        assert self.x == 2\n+\n \n class TestB:\n     def test_b(self):\n";
        let after = patch::apply_to_text(before, patch, "t/test_a.py").unwrap();
        let kept = golden_tests_only(&after, &added_line_numbers(patch, "t/test_a.py")).unwrap();
        assert_eq!(
            kept,
            "import os\n\n\nclass TestA:\n    def setup_method(self):\n        self.x = 1\n\n    def test_new(self):\n        assert self.x == 2\n\n\n"
        );
    }

    #[test]
    fn code_in_the_test_file_cannot_close_the_answer_s_fence() {
        let code = "x = '''\n```\n'''\n";
        let text = fenced("python", code);
        assert!(text.starts_with("~~~python\n"), "{text}");
        assert_eq!(
            crate::reproagent::parse::extract_test_answer(&format!(
                "Test file: tests/test_a.py\n{text}"
            ))
            .unwrap()
            .code,
            code
        );
    }
}
