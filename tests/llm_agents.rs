//! LLM agents end to end through the cluster: `reproagent` (each variant), `zero-shot-plus`,
//! `libro` and an external Python agent on a subset of swt-mini, their calls answered by a
//! scripted OpenAI-compatible server started by this test (not a model), metered by each node's
//! gateway, and their test patches evaluated SWT-bench style with the process executor.

mod common;

use common::bin;
use reprobench_agent_node::gateway::scripted::{ScriptedReply, ScriptedRequest, ScriptedUpstream};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const SECRET: &str = "sk-test-secret-7f3a9c0d1e";
const PROMPT_TOKENS: u64 = 1000;
const COMPLETION_TOKENS: u64 = 100;
const CACHED_TOKENS: u64 = 200;
/// $/call at 2.0 in, 8.0 out, 0.5 cached per million tokens.
const COST_PER_CALL: f64 = ((PROMPT_TOKENS - CACHED_TOKENS) as f64 * 2.0
    + CACHED_TOKENS as f64 * 0.5
    + COMPLETION_TOKENS as f64 * 8.0)
    / 1e6;

fn datasets() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("datasets")
}

/// The swt-mini rows used here: the first instance of each repository.
fn subset() -> Vec<Value> {
    let mut seen = std::collections::BTreeSet::new();
    std::fs::read_to_string(datasets().join("swt-mini/instances.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| seen.insert(r["repo"].as_str().unwrap().to_string()))
        .take(2)
        .collect()
}

/// A dataset directory holding `rows` with swt-mini's environments and sources.
fn write_subset(dir: &Path, rows: &[Value]) -> PathBuf {
    let d = dir.join("mini-subset");
    std::fs::create_dir_all(&d).unwrap();
    let text: String = rows.iter().map(|r| r.to_string() + "\n").collect();
    std::fs::write(d.join("instances.jsonl"), text).unwrap();
    std::fs::copy(datasets().join("swt-mini/env.json"), d.join("env.json")).unwrap();
    let manifest = json!({
        "name": "mini-subset", "track": "swt", "instances": "instances.jsonl", "env": "env.json",
        "sources": datasets().join("swt-mini/src"),
    });
    std::fs::write(d.join("manifest.json"), manifest.to_string()).unwrap();
    d
}

/// A reproduction test for an instance, made from its golden test patch: the import lines of the
/// test file it changes and the test functions it adds, as a new file.
fn reproduction_test(row: &Value, repos: &Path) -> String {
    let patch = row["test_patch"].as_str().unwrap();
    let file = patch
        .lines()
        .find_map(|l| l.strip_prefix("+++ b/"))
        .unwrap()
        .to_string();
    let mirror = repos.join(row["repo"].as_str().unwrap().replace('/', "__") + ".git");
    let base = Command::new("git")
        .arg("-C")
        .arg(&mirror)
        .args([
            "show",
            &format!("{}:{file}", row["base_commit"].as_str().unwrap()),
        ])
        .output()
        .unwrap();
    let original = String::from_utf8_lossy(&base.stdout);
    let mut out: String = original
        .lines()
        .filter(|l| l.starts_with("import ") || l.starts_with("from "))
        .map(|l| format!("{l}\n"))
        .collect();
    out.push('\n');
    for l in patch.lines() {
        if let Some(added) = l.strip_prefix('+')
            && !l.starts_with("+++")
        {
            out.push_str(added);
            out.push('\n');
        }
    }
    out
}

fn message(content: &str) -> ScriptedReply {
    ScriptedReply::Message {
        content: Some(content.to_string()),
        tool_calls: vec![],
        prompt_tokens: PROMPT_TOKENS,
        completion_tokens: COMPLETION_TOKENS,
        cached_tokens: CACHED_TOKENS,
    }
}

/// Answers each agent's requests by the marker in its system prompt, for the instance whose
/// issue title appears in the request.
fn responder(
    tests: BTreeMap<String, (String, String)>,
) -> impl Fn(&ScriptedRequest) -> ScriptedReply {
    move |req: &ScriptedRequest| {
        // Upstream trouble the gateway must absorb without charging anyone for it.
        match req.index % 13 {
            3 => {
                return ScriptedReply::Status {
                    code: 500,
                    retry_after_s: None,
                    body: "scripted: server error".into(),
                };
            }
            7 => {
                return ScriptedReply::Status {
                    code: 429,
                    retry_after_s: Some(0),
                    body: "scripted: slow down".into(),
                };
            }
            _ => {}
        }
        let text = req.body["messages"].to_string();
        let system = req.body["messages"][0]["content"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let Some((code, golden_file)) = tests
            .iter()
            .find(|(title, _)| text.contains(title.as_str()))
            .map(|(_, v)| v.clone())
        else {
            return ScriptedReply::Status {
                code: 400,
                retry_after_s: None,
                body: "scripted: unknown instance".into(),
            };
        };
        let python = format!("Test file `tests/test_reproduction.py`:\n```python\n{code}```\n");
        let has_tool_result = req.body["messages"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
        if system.starts_with("reproagent stage: localization") {
            if !has_tool_result {
                return ScriptedReply::Message {
                    content: None,
                    tool_calls: vec![reprobench_agent_node::gateway::scripted::ScriptedToolCall {
                        name: "grep".into(),
                        arguments: json!({"pattern": "def "}).to_string(),
                    }],
                    prompt_tokens: PROMPT_TOKENS,
                    completion_tokens: COMPLETION_TOKENS,
                    cached_tokens: CACHED_TOKENS,
                };
            }
            let loc = json!({
                "files": [{"path": golden_file, "rationale": "the function named in the issue lives here", "confidence": 0.9}],
                "functions": [], "lines": []
            });
            return message(&format!("```json\n{loc}\n```"));
        }
        if system.starts_with("reproagent stage: root-cause") {
            return message(&json!({"summary": "the bug", "error_category": "logic", "execution_path": ["a", "b"], "trigger_conditions": ["input"], "confidence": 0.8}).to_string());
        }
        if system.starts_with("reproagent stage: planning") {
            return message(&json!({"environment_constraints": [], "minimal_inputs": ["x"], "expected_assertions": ["y"], "test_path": "tests/test_reproduction.py", "test_name": "test_x"}).to_string());
        }
        if system.starts_with("reproagent stage: review") {
            return message(&json!({"aligns_with_issue": true, "failure_from_test_logic": true, "matches_reported_symptom": true, "feedback": ""}).to_string());
        }
        if req.index % 5 == 1 {
            return ScriptedReply::Slow {
                delay: std::time::Duration::from_millis(300),
                then: Box::new(message(&python)),
            };
        }
        message(&python)
    }
}

fn sweep(dataset: &Path, upstream: &str, agents: &str, budget: &str) -> String {
    format!(
        r#"name = "llm-agents"
datasets = ["{dataset}"]
{agents}
[[backbones]]
name = "scripted"
base_url = "{upstream}"
model = "scripted-model"
api_key_env = "RB_TEST_LLM_KEY"
price = {{ input_per_mtok = 2.0, output_per_mtok = 8.0, cached_input_per_mtok = 0.5 }}
[budget]
{budget}
[eval]
executor = "process"
timeout_s = 120
"#,
        dataset = dataset.display()
    )
}

struct Setup {
    dir: tempfile::TempDir,
    dataset: PathBuf,
    rows: Vec<Value>,
}

fn setup() -> Setup {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let rows = subset();
    let dataset = write_subset(dir.path(), &rows);
    // Build the mirrors first, so the scripted answers can read the test files at the base commit.
    let out = Command::new(bin())
        .args(["datasets", "prepare"])
        .arg(&dataset)
        .arg("--repos")
        .arg(dir.path().join("repos"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Setup { dir, dataset, rows }
}

fn run_sweep(s: &Setup, spec: &str) -> Vec<Value> {
    let path = s.dir.path().join("sweep.toml");
    std::fs::write(&path, spec).unwrap();
    let data = s.dir.path().join("data");
    let common = |cmd: &mut Command| {
        cmd.arg("--data").arg(&data);
    };
    let mut run = Command::new(bin());
    run.args(["run"])
        .arg(&path)
        .args(["--local-nodes", "2", "--json", "--new"]);
    common(&mut run);
    run.arg("--repos")
        .arg(s.dir.path().join("repos"))
        .arg("--cache-dir")
        .arg(s.dir.path().join("cache"))
        .env("RB_TEST_LLM_KEY", SECRET);
    let out = run.output().unwrap();
    assert!(
        out.status.success(),
        "run failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut res = Command::new(bin());
    res.args([
        "results",
        summary["run_id"].as_str().unwrap(),
        "--format",
        "jsonl",
    ]);
    common(&mut res);
    let out = res.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn scripted(s: &Setup, rt: &tokio::runtime::Runtime) -> ScriptedUpstream {
    let repos = s.dir.path().join("repos");
    let tests: BTreeMap<String, (String, String)> = s
        .rows
        .iter()
        .map(|r| {
            let title = r["problem_statement"]
                .as_str()
                .unwrap()
                .lines()
                .next()
                .unwrap()
                .to_string();
            let golden = r["patch"]
                .as_str()
                .unwrap()
                .lines()
                .find_map(|l| l.strip_prefix("+++ b/"))
                .unwrap()
                .to_string();
            (title, (reproduction_test(r, &repos), golden))
        })
        .collect();
    rt.block_on(ScriptedUpstream::start(responder(tests)))
}

fn transcript_text(row: &Value) -> String {
    std::fs::read_to_string(
        Path::new(row["artifact_path"].as_str().unwrap()).join("transcript.jsonl"),
    )
    .unwrap_or_default()
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                files_under(&p, out);
            } else if p.is_file() {
                out.push(p);
            }
        }
    }
}

#[test]
fn every_agent_and_variant_runs_metered_through_the_cluster() {
    let s = setup();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let upstream = scripted(&s, &rt);
    let agent_py = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny_agent.py");
    let agents = format!(
        r#"[[agents]]
name = "reproagent"
variants = ["full", "no-localization", "no-rca", "no-planning", "no-review"]
[[agents]]
name = "zero-shot-plus"
[[agents]]
name = "libro"
[[agents]]
name = "tiny-external"
command = ["python3", "{}"]
"#,
        agent_py.display()
    );
    let rows = run_sweep(&s, &sweep(&s.dataset, &upstream.base_url(), &agents, ""));
    assert_eq!(
        rows.len(),
        s.rows.len() * 8,
        "one row per instance, agent and variant"
    );
    for r in &rows {
        let who = format!("{}/{} on {}", r["agent"], r["variant"], r["instance_id"]);
        assert_eq!(r["verdict"], "resolved", "{who}: {r}");
        assert_eq!(r["backbone"], "scripted");
        let calls = r["llm_calls"].as_u64().unwrap();
        assert!(calls >= 1, "{who} made no metered call");
        assert_eq!(
            r["tokens_in"].as_u64().unwrap(),
            calls * PROMPT_TOKENS,
            "{who}"
        );
        assert_eq!(
            r["tokens_out"].as_u64().unwrap(),
            calls * COMPLETION_TOKENS,
            "{who}"
        );
        assert_eq!(
            r["tokens_cached"].as_u64().unwrap(),
            calls * CACHED_TOKENS,
            "{who}"
        );
        let cost = r["cost_usd"].as_f64().unwrap();
        assert!(
            (cost - calls as f64 * COST_PER_CALL).abs() < 1e-9,
            "{who}: cost {cost}"
        );
        // Each variant skips its stage: no request of that stage is in the task's transcript.
        let transcript = transcript_text(r);
        assert!(!transcript.is_empty(), "{who} has no transcript");
        if r["agent"] == "reproagent" {
            let stages = ["localization", "root-cause", "planning", "review"];
            let skipped = match r["variant"].as_str().unwrap() {
                "no-localization" => Some("localization"),
                "no-rca" => Some("root-cause"),
                "no-planning" => Some("planning"),
                "no-review" => Some("review"),
                _ => None,
            };
            for stage in stages {
                let marker = format!("reproagent stage: {stage}");
                assert_eq!(
                    transcript.contains(&marker),
                    Some(stage) != skipped,
                    "{who}: stage {stage}"
                );
            }
            assert_eq!(
                r["localized_files_correct"].as_bool(),
                (skipped != Some("localization")).then_some(true),
                "{who}"
            );
            assert!(r["feedback_iterations"].is_u64(), "{who}");
        }
    }
    // The key reached the upstream, and nothing the harness wrote holds it.
    assert!(
        upstream
            .requests()
            .iter()
            .all(|q| q.authorization.as_deref() == Some(&format!("Bearer {SECRET}"))),
        "every upstream call carries the backbone's key"
    );
    let mut files = Vec::new();
    files_under(s.dir.path(), &mut files);
    assert!(
        files.len() > 50,
        "artifacts, logs and transcripts were written"
    );
    for f in files {
        if let Ok(bytes) = std::fs::read(&f) {
            assert!(
                !String::from_utf8_lossy(&bytes).contains(SECRET),
                "{} holds the API key",
                f.display()
            );
        }
    }
}

#[test]
fn a_call_budget_stops_the_agent_and_what_it_has_is_evaluated() {
    let s = setup();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let upstream = scripted(&s, &rt);
    let agents = "[[agents]]\nname = \"reproagent\"\n";
    let rows = run_sweep(
        &s,
        &sweep(
            &s.dataset,
            &upstream.base_url(),
            agents,
            "max_llm_calls = 3",
        ),
    );
    assert_eq!(rows.len(), s.rows.len());
    for r in &rows {
        assert!(r["llm_calls"].as_u64().unwrap() <= 3, "{r}");
        assert_eq!(
            r["verdict"], "unresolved",
            "stopped before generating a test: {r}"
        );
        let report: Value = serde_json::from_slice(
            &std::fs::read(Path::new(r["artifact_path"].as_str().unwrap()).join("report.json"))
                .unwrap(),
        )
        .unwrap();
        assert_eq!(report["agent"]["stopped_by"], "budget", "{report}");
    }
    let answered = upstream
        .requests()
        .iter()
        .filter(|q| !matches!(q.index % 13, 3 | 7))
        .count();
    assert!(answered <= 3 * s.rows.len(), "{answered} answered calls");
}
