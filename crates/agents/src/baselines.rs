//! The two LLM baselines of the SWT track, through the same gateway as every agent.
//!
//! - `zero-shot-plus`: SWT-bench's ZeroShotPlus: one prompt holding the issue and BM25-retrieved
//!   code, answered in SWT-bench's custom diff format and converted into a test patch as
//!   SWT-bench converts it ([`crate::custom_diff`]); an answer not in that format is taken as
//!   a ```diff block, or else a python block written as a new file.
//! - `libro`: LIBRO's few-shot prompting with issue → test examples, several samples, each run on
//!   the buggy code; candidates that fail for a reason other than setup are clustered by their
//!   failure and the largest cluster's shortest test is chosen.

use super::{InstanceBrief, Llm, LlmError, TestRun, Workspace, custom_diff};
use reprobench_swt::patch;
use serde::Serialize;
use serde_json::{Value, json};

/// What a baseline produced.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BaselineOutcome {
    /// The test patch, if the model gave a usable one.
    pub test_patch: Option<String>,
    /// LLM calls made.
    pub llm_calls: u32,
    /// Candidates and what became of them (libro).
    pub candidates: Vec<Value>,
    /// Why it stopped early, if it did.
    pub stopped_by: Option<String>,
    /// The form the answer came in (zero-shot-plus).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer_form: Option<AnswerForm>,
    /// What the conversion of a custom diff said: failures and what it left out.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// The form of a `zero-shot-plus` answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AnswerForm {
    /// SWT-bench's custom diff (a block with mode `rewrite` or `insert`), converted as
    /// SWT-bench converts it, whether or not that gave a patch.
    CustomDiff,
    /// A ```diff block that is a valid patch.
    UnifiedDiff,
    /// A python block, written as a new test file.
    PythonFile,
    /// None of these: no test patch.
    Unusable,
}

/// Fenced code blocks of `text` as (language tag, body): a fence of three or more backticks or
/// tildes opens a block, and only a line of the same character, at least as long, closes it
/// (so code holding a shorter fence stays whole); an unclosed last block runs to the end.
pub fn fenced_blocks(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        let Some(mark) = ['`', '~']
            .into_iter()
            .find(|c| t.starts_with(&c.to_string().repeat(3)))
        else {
            continue;
        };
        let width = t.chars().take_while(|c| *c == mark).count();
        let tag = t[width..].trim().to_lowercase();
        let mut body = String::new();
        for l in lines.by_ref() {
            let close = l.trim();
            if close.len() >= width && close.chars().all(|c| c == mark) {
                break;
            }
            body.push_str(l);
            body.push('\n');
        }
        out.push((tag, body));
    }
    out
}

/// A test patch read from a model's answer: a ```diff block that is a valid patch, or else a
/// python block written as a new file at the path named before it (default `default_path`).
pub fn test_patch_from_answer(answer: &str, default_path: &str) -> Option<String> {
    patch_of_answer(answer, default_path).map(|(_, patch)| patch)
}

/// [`test_patch_from_answer`] and which of its two forms the patch came from.
fn patch_of_answer(answer: &str, default_path: &str) -> Option<(AnswerForm, String)> {
    let blocks = fenced_blocks(answer);
    for (tag, body) in &blocks {
        if (tag == "diff"
            || tag == "patch"
            || body.starts_with("diff --git")
            || body.starts_with("--- "))
            && patch::validate(Some(body)).is_ok()
        {
            return Some((AnswerForm::UnifiedDiff, body.clone()));
        }
    }
    let (_, code) = blocks.iter().find(|(tag, b)| {
        (tag == "python" || tag == "py" || tag.is_empty()) && b.contains("def test")
    })?;
    let path = answer
        .split(|c: char| c.is_whitespace() || c == '`' || c == '*' || c == '"' || c == '\'')
        .find(|w| w.ends_with(".py") && !w.starts_with('/') && !w.contains(".."))
        .unwrap_or(default_path);
    Some((AnswerForm::PythonFile, patch::new_file_diff(path, code)))
}

/// Where a baseline's new test file goes.
pub fn default_test_path(instance_id: &str) -> String {
    let slug: String = instance_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("tests/test_reproduce_{slug}.py")
}

/// How `zero-shot-plus`'s system prompt starts (what oracles and scripted servers match on).
pub const ZSP_MARKER: &str = "zero-shot-plus:";

const ZSP_SYSTEM: &str = "zero-shot-plus: You write tests that check whether a reported issue in a Python repository is resolved: they fail on the current code because of the issue, and pass once it is fixed.";

/// How the ZeroShotPlus prompt opens (SWT-bench's opening, in our words).
const ZSP_OPENING: &str = "Below are an issue posted on a repository (in <issue/> brackets) and the contents of some of the repository's files that hold relevant code (in <code> brackets); code from third-party dependencies or from files not shown may be needed as well. Identify the issue and write a test case that verifies a proposed solution to it. Details follow at the end.";

/// SWT-bench's ZeroShotPlus instructions (`PLUS_PROMPT` in its `dataset/swt_bench.py`): the
/// custom diff format, its rule for insertions and its worked example are theirs verbatim (a
/// model must see the format exactly as SWT-bench shows it); the prose around them is ours.
pub const ZSP_INSTRUCTIONS: &str = r#"Write test cases that check whether a solution resolves the user's issue (above, in <issue/> brackets).
Give them as a diff in the custom format explained below.

A diff in this format has this general shape.
```custom-diff
diff
<path/filename>
< "rewrite" or "insert" >
< rough line number / EOF / BOF >
< insert function that should be added or rewritten >
end diff
< repeat blocks of diff as necessary >
```
Insertion can only be done at the end or beginning of the file, indicated by EOF or BOF respectively.

For example, here is a file before a change.
[start of demo/test_file.py]
1 def test_euclidean(a, b):
2     assert euclidean(0, 0) == 0
3     assert euclidean(0, 1) == 1
4     assert euclidean(1, 0) == 1
5     assert euclidean(1, 1) == 1
6
7 @pytest.mark.parametrize("a, b, expected", [(0, 0, 0), (0, 1, 1), (1, 0, 1), (1, 1, 1)])
8 def test_gcd(a, b):
9     assert gcd(a, b) == expected
10
[end of demo/file.py]

This diff extends test_euclidean and adds test_lcm, turning the file above into the one below.
```custom-diff
diff
demo/file.py
rewrite
1
def test_euclidean(a, b):
    assert euclidean(0, 0) == 0
    assert euclidean(0, 1) == 1
    assert euclidean(1, 0) == 1
    assert euclidean(1, 1) == 1
    assert euclidean(100, 10) == 10
end diff
diff
demo/file.py
insert
EOF
@pytest.mark.parametrize("a, b, expected", [(0, 0, 0), (0, 1, 1), (1, 0, 1), (1, 1, 1), (100, 10, 10)])
def test_lcm(a, b):
    assert lcm(a, b) == expected
end diff
```

The file after the change.
[start of demo/file.py]
1 def test_euclidean(a, b):
2     assert euclidean(0, 0) == 0
3     assert euclidean(0, 1) == 1
4     assert euclidean(1, 0) == 1
5     assert euclidean(1, 1) == 1
6     assert euclidean(100, 10) == 10
7
8 @pytest.mark.parametrize("a, b, expected", [(0, 0, 0), (0, 1, 1), (1, 0, 1), (1, 1, 1)])
9 def test_gcd(a, b):
10     assert gcd(a, b) == expected
11
12 @pytest.mark.parametrize("a, b, expected", [(0, 0, 0), (0, 1, 1), (1, 0, 1), (1, 1, 1), (100, 10, 10)])
13 def test_lcm(a, b):
14     assert lcm(a, b) == expected
15
[end of demo/file.py]

Each block names the file by its path, the function, and an approximate line number; use as many independent blocks as you need, in one file or in several.
Reason as much as you find useful, but the answer itself must follow the custom diff format.
Write test cases only: do not try to fix the issue.
"#;

/// The user message of `zero-shot-plus`: the issue, the retrieved code and the instructions.
pub fn zero_shot_plus_prompt(brief: &InstanceBrief, context: &str) -> String {
    format!(
        "{ZSP_OPENING}\n<issue>\n{issue}\n</issue>\n<code>\n{context}</code>\n\n{ZSP_INSTRUCTIONS}",
        issue = brief.problem_statement.trim_end(),
    )
}

/// `zero-shot-plus`: one call with the issue and retrieved code (`context`); a custom diff is
/// converted against the files it names as `ws` reads them.
pub async fn zero_shot_plus<L: Llm, W: Workspace>(
    brief: &InstanceBrief,
    context: &str,
    llm: &mut L,
    ws: &W,
) -> BaselineOutcome {
    let messages = [
        json!({"role": "system", "content": ZSP_SYSTEM}),
        json!({"role": "user", "content": zero_shot_plus_prompt(brief, context)}),
    ];
    let mut out = BaselineOutcome::default();
    let answer = match llm.chat(&messages, &[]).await {
        Ok(turn) => turn.content.unwrap_or_default(),
        Err(e) => {
            out.stopped_by = Some(stop_reason(&e));
            return out;
        }
    };
    out.llm_calls = 1;
    let blocks = custom_diff::parse(&answer);
    if custom_diff::is_custom_diff(&blocks) {
        let mut files = std::collections::BTreeMap::new();
        for path in custom_diff::paths(&blocks) {
            let text = ws.file_text(&path).await;
            files.insert(path, text);
        }
        let conversion =
            custom_diff::convert(&blocks, |p| files.get(p).cloned().unwrap_or(Ok(None)));
        out.answer_form = Some(AnswerForm::CustomDiff);
        out.test_patch = conversion.patch;
        out.notes = conversion.notes;
        return out;
    }
    match patch_of_answer(&answer, &default_test_path(&brief.instance_id)) {
        Some((form, patch)) => {
            out.answer_form = Some(form);
            out.test_patch = Some(patch);
        }
        None => out.answer_form = Some(AnswerForm::Unusable),
    }
    out
}

fn stop_reason(e: &LlmError) -> String {
    match e {
        LlmError::Budget(_) => "budget".into(),
        LlmError::Failed(m) => format!("llm_error: {m}"),
        LlmError::ContextLength(m) => format!("{}: {m}", super::CONTEXT_LENGTH_STOP),
    }
}

/// How `libro`'s system prompt starts (what oracles and scripted servers match on).
pub const LIBRO_MARKER: &str = "libro:";

const LIBRO_SYSTEM: &str = "libro: You turn bug reports into JUnit-style reproducing tests; here the project is Python and the tests are pytest functions.";

/// The few-shot examples shown to `libro` (issue → reproducing test).
pub const LIBRO_EXAMPLES: &[(&str, &str)] = &[
    (
        "`slugify(\"Hello  World\")` returns `hello--world`; repeated spaces should give a single dash.",
        "from textkit import slugify\n\n\ndef test_repeated_spaces_give_one_dash():\n    assert slugify(\"Hello  World\") == \"hello-world\"\n",
    ),
    (
        "Parsing an empty config file raises `KeyError: 'sections'` instead of returning an empty config.",
        "from confparse import parse\n\n\ndef test_empty_file_gives_empty_config():\n    config = parse(\"\")\n    assert config.sections == []\n",
    ),
];

/// Whether a run failed for a setup reason rather than the test's own logic.
pub fn is_setup_failure(run: &TestRun) -> bool {
    use super::reproagent::{RunSignal, classify_run};
    run.exit_code.is_none()
        || matches!(
            classify_run(run),
            RunSignal::SetupError { .. } | RunSignal::TimedOut
        )
}

/// The line that names a failure (the last `E   ...` line or exception line), to cluster on.
pub fn failure_signature(output: &str) -> String {
    output
        .lines()
        .rev()
        .find(|l| {
            let t = l.trim_start();
            t.starts_with("E ") || t.contains("Error:") || t.contains("Error")
        })
        .map(|l| {
            let without_numbers: String = l.chars().filter(|c| !c.is_ascii_digit()).collect();
            without_numbers.trim().to_string()
        })
        .unwrap_or_default()
}

/// `libro`: `samples` few-shot samples, run and reranked.
pub async fn libro<L: Llm, W: Workspace>(
    brief: &InstanceBrief,
    samples: u32,
    llm: &mut L,
    ws: &W,
) -> BaselineOutcome {
    let default_path = default_test_path(&brief.instance_id);
    let mut shots = String::new();
    for (issue, test) in LIBRO_EXAMPLES {
        shots.push_str(&format!(
            "# Issue\n{issue}\n# Reproducing test\n```python\n{test}```\n\n"
        ));
    }
    let user = format!(
        "{shots}# Issue\n{issue}\n# Reproducing test\n(repository {repo}; answer with one ```python block holding a complete pytest file)",
        issue = brief.problem_statement,
        repo = brief.repo
    );
    let messages = [
        json!({"role": "system", "content": LIBRO_SYSTEM}),
        json!({"role": "user", "content": user}),
    ];
    let mut out = BaselineOutcome::default();
    // (signature, code) of candidates that fail on the buggy code for a non-setup reason.
    let mut failing: Vec<(String, String)> = Vec::new();
    let mut first_valid: Option<String> = None;
    for i in 0..samples {
        let turn = match llm.chat(&messages, &[]).await {
            Ok(t) => t,
            Err(e) => {
                out.stopped_by = Some(stop_reason(&e));
                break;
            }
        };
        out.llm_calls += 1;
        let Some(code) = turn.content.as_deref().and_then(|a| {
            fenced_blocks(a)
                .into_iter()
                .find(|(_, b)| b.contains("def test"))
                .map(|(_, b)| b)
        }) else {
            out.candidates
                .push(json!({"sample": i, "status": "no test in the answer"}));
            continue;
        };
        first_valid.get_or_insert_with(|| code.clone());
        let path = libro_placement(ws, &code, &default_path).await;
        let entry = match ws.run_test(&path, &code).await {
            Ok(run) if run.exit_code == Some(0) => {
                json!({"sample": i, "path": path, "status": "passes on the buggy code"})
            }
            Ok(run) if is_setup_failure(&run) => {
                json!({"sample": i, "path": path, "status": "setup failure"})
            }
            Ok(run) => {
                let sig = failure_signature(&run.output);
                failing.push((sig.clone(), code.clone()));
                json!({"sample": i, "path": path, "status": "fails", "signature": sig})
            }
            Err(e) => json!({"sample": i, "path": path, "status": format!("not run: {e}")}),
        };
        out.candidates.push(entry);
    }
    let chosen = choose_libro(&failing, &brief.problem_statement).or(first_valid);
    if let Some(code) = chosen {
        let path = libro_placement(ws, &code, &default_path).await;
        out.test_patch = Some(patch::new_file_diff(&path, &code));
    }
    out
}

/// Where LIBRO puts a test: beside the repository's existing test file most like it (LIBRO
/// injects a test into the most similar test class; here the answer is a whole file, so it goes
/// into a new file in that file's directory, where the same package, fixtures and settings
/// apply), else `default_path`.
async fn libro_placement<W: Workspace>(ws: &W, code: &str, default_path: &str) -> String {
    ws.most_similar_test_file(code)
        .await
        .unwrap_or_else(|| default_path.to_string())
}

/// LIBRO's selection: clusters of failures with the same signature, ranked first by whether the
/// failure names something the issue names (an exception or message the report mentions), then
/// by size; the chosen cluster's shortest test.
pub fn choose_libro(failing: &[(String, String)], issue: &str) -> Option<String> {
    let mut clusters: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for (sig, code) in failing {
        clusters.entry(sig).or_default().push(code);
    }
    let issue_tokens: std::collections::HashSet<String> =
        super::tools::bm25::tokenize(issue).into_iter().collect();
    // An exception's name (`KeyError`, `ValueError`; not the bare word "error") in both.
    let names_exception = |t: &str| {
        ["error", "exception", "warning"]
            .iter()
            .any(|end| t.len() > end.len() && t.ends_with(end))
    };
    let matches_issue = |sig: &str| {
        super::tools::bm25::tokenize(sig)
            .iter()
            .any(|t| names_exception(t) && issue_tokens.contains(t))
    };
    clusters
        .iter()
        .max_by_key(|(sig, c)| (matches_issue(sig), c.len()))
        .and_then(|(_, c)| {
            c.iter()
                .min_by_key(|code| code.len())
                .map(|s| s.to_string())
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AssistantTurn;

    /// A model that always gives one answer, and records the prompts it got.
    struct OneAnswer(String, Vec<Value>);

    impl Llm for OneAnswer {
        async fn chat(
            &mut self,
            messages: &[Value],
            _tools: &[Value],
        ) -> Result<AssistantTurn, LlmError> {
            self.1.extend(messages.iter().cloned());
            Ok(AssistantTurn {
                content: Some(self.0.clone()),
                tool_calls: vec![],
            })
        }
    }

    /// A workspace holding `tests/test_a.py` (and a directory `tests/data`).
    struct Files;

    impl Workspace for Files {
        fn tool_specs(&self) -> Vec<Value> {
            vec![]
        }
        async fn call_tool(&self, _: &str, _: &str) -> String {
            String::new()
        }
        async fn run_test(
            &self,
            _: &str,
            _: &str,
        ) -> Result<TestRun, crate::workspace::WorkspaceError> {
            Ok(TestRun::default())
        }
        async fn file_text(&self, path: &str) -> Result<Option<String>, String> {
            match path {
                "tests/test_a.py" => Ok(Some("def test_a():\n    assert 1\n".into())),
                "tests/data" => Err("`tests/data` is a directory".into()),
                _ => Ok(None),
            }
        }
    }

    async fn zsp(answer: &str) -> (BaselineOutcome, Vec<Value>) {
        let brief = InstanceBrief {
            instance_id: "o__r-1".into(),
            repo: "o/r".into(),
            problem_statement: "f() is wrong".into(),
            hints: String::new(),
        };
        let mut llm = OneAnswer(answer.to_string(), vec![]);
        let out = zero_shot_plus(&brief, "## m.py\n", &mut llm, &Files).await;
        (out, llm.1)
    }

    #[tokio::test]
    async fn zero_shot_plus_converts_a_custom_diff_and_falls_back_to_other_forms() {
        let custom = "```custom-diff\ndiff\ntests/test_a.py\ninsert\nEOF\ndef test_b():\n    assert f()\nend diff\n```";
        let (out, prompt) = zsp(custom).await;
        assert_eq!(out.answer_form, Some(AnswerForm::CustomDiff));
        let patch = out.test_patch.unwrap();
        assert!(
            patch.contains("+def test_b():\n+    assert f()\n"),
            "{patch}"
        );
        let system = prompt[0]["content"].as_str().unwrap();
        assert!(system.starts_with(ZSP_MARKER));
        let user = prompt[1]["content"].as_str().unwrap();
        assert!(user.contains("<issue>\nf() is wrong\n</issue>\n<code>\n## m.py\n</code>"));
        assert!(
            user.contains("< \"rewrite\" or \"insert\" >\n< rough line number / EOF / BOF >\n")
        );
        // A custom diff that fails gives no patch, and says why.
        let (out, _) =
            zsp("diff\ntests/test_a.py\nrewrite\n1\ndef test_zzz():\n    pass\nend diff").await;
        assert_eq!(
            (out.answer_form, out.test_patch),
            (Some(AnswerForm::CustomDiff), None)
        );
        assert!(out.notes[0].contains("test_zzz"), "{:?}", out.notes);
        let (out, _) = zsp("diff\ntests/data\ninsert\nEOF\nx = 1\nend diff").await;
        assert_eq!(out.test_patch, None);
        assert!(out.notes[0].contains("directory"), "{:?}", out.notes);
        // Other forms.
        let diff = "diff --git a/tests/test_x.py b/tests/test_x.py\nnew file mode 100644\n--- /dev/null\n+++ b/tests/test_x.py\n@@ -0,0 +1,2 @@\n+def test_x():\n+    assert False\n";
        let (out, _) = zsp(&format!("```diff\n{diff}```")).await;
        assert_eq!(
            (out.answer_form, out.test_patch.as_deref()),
            (Some(AnswerForm::UnifiedDiff), Some(diff))
        );
        let (out, _) = zsp("```python\ndef test_y():\n    assert 0\n```").await;
        assert_eq!(out.answer_form, Some(AnswerForm::PythonFile));
        assert!(
            out.test_patch
                .unwrap()
                .contains("+++ b/tests/test_reproduce_o__r_1.py")
        );
        let (out, _) = zsp("I cannot help.").await;
        assert_eq!(
            (out.answer_form, out.test_patch),
            (Some(AnswerForm::Unusable), None)
        );
    }

    #[test]
    fn answers_become_patches() {
        let diff = "diff --git a/tests/test_x.py b/tests/test_x.py\nnew file mode 100644\n--- /dev/null\n+++ b/tests/test_x.py\n@@ -0,0 +1,2 @@\n+def test_x():\n+    assert False\n";
        let a = format!("Here:\n```diff\n{diff}```\nDone.");
        assert_eq!(
            test_patch_from_answer(&a, "tests/t.py").as_deref(),
            Some(diff)
        );
        let b =
            "Put this in `tests/test_bug.py`:\n```python\ndef test_bug():\n    assert 1 == 2\n```";
        let p = test_patch_from_answer(b, "tests/t.py").unwrap();
        assert!(p.contains("+++ b/tests/test_bug.py"));
        assert!(p.contains("+    assert 1 == 2"));
        assert_eq!(test_patch_from_answer("no code here", "t.py"), None);
    }

    #[test]
    fn libro_picks_the_largest_failure_cluster() {
        let f = |s: &str, c: &str| (s.to_string(), c.to_string());
        let failing = vec![
            f("E AssertionError", "long long test"),
            f("E KeyError", "k1"),
            f("E AssertionError", "short"),
        ];
        assert_eq!(choose_libro(&failing, "").as_deref(), Some("short"));
        // A failure that names the issue's exception wins over a larger cluster.
        assert_eq!(
            choose_libro(&failing, "Parsing raises a KeyError").as_deref(),
            Some("k1")
        );
        assert_eq!(choose_libro(&[], ""), None);
        let setup = TestRun {
            exit_code: Some(2),
            timed_out: false,
            output: "E   ModuleNotFoundError: No module named 'x'".into(),
        };
        assert!(is_setup_failure(&setup));
        assert_eq!(
            failure_signature("a\nE   assert 12 == 3\nfoo"),
            "E   assert  =="
        );
    }
}
