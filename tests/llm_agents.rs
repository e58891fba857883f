//! LLM agents end to end through the cluster: `reproagent` (each variant), `zero-shot-plus`,
//! `libro` and an external Python agent on swt-mini, their calls answered by a
//! scripted OpenAI-compatible server started by this test (not a model), metered by each node's
//! gateway, and their test patches evaluated SWT-bench style with the process executor.

mod common;

use common::bin;
use reprobench_gateway::scripted::{ScriptedReply, ScriptedRequest, ScriptedUpstream};
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

/// The swt-mini rows the smaller tests use: the first instance of two repositories.
fn subset() -> Vec<Value> {
    one_instance_per_repository().into_iter().take(2).collect()
}

/// swt-mini's first instance of each repository (each of its environments and log parsers).
fn one_instance_per_repository() -> Vec<Value> {
    let mut seen = std::collections::BTreeSet::new();
    all_of_swt_mini()
        .into_iter()
        .filter(|r| seen.insert(r["repo"].as_str().unwrap().to_string()))
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

/// A reproduction test for an instance, made from its golden test patch: the test file it
/// changes, as it reads after the patch, written as a new file.
fn reproduction_test(row: &Value, repos: &Path) -> String {
    let patch = row["test_patch"].as_str().unwrap();
    let file = patch
        .lines()
        .find_map(|l| l.strip_prefix("+++ b/"))
        .unwrap()
        .to_string();
    let mirror = repos.join(row["repo"].as_str().unwrap().replace('/', "__") + ".git");
    let work = tempfile::tempdir().unwrap();
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .arg("-C")
            .arg(work.path())
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    git(&["clone", "-q", &mirror.to_string_lossy(), "."]);
    git(&["checkout", "-q", row["base_commit"].as_str().unwrap()]);
    std::fs::write(work.path().join("gold.patch"), patch).unwrap();
    git(&["apply", "gold.patch"]);
    std::fs::read_to_string(work.path().join(&file)).unwrap()
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
        let text: String = req.body["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m["content"].as_str())
            .collect::<Vec<_>>()
            .join("\n");
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
                    tool_calls: vec![reprobench_gateway::scripted::ScriptedToolCall {
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
    setup_with(subset())
}

fn all_of_swt_mini() -> Vec<Value> {
    std::fs::read_to_string(datasets().join("swt-mini/instances.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn setup_with(rows: Vec<Value>) -> Setup {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
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
    run_sweep_with(s, spec, &[])
}

fn run_sweep_with(s: &Setup, spec: &str, extra: &[&str]) -> Vec<Value> {
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
        .args(extra);
    if extra.is_empty() {
        run.env("RB_TEST_LLM_KEY", SECRET);
    }
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
    scripted_with_repos(s, &s.dir.path().join("repos"), rt)
}

fn scripted_with_repos(s: &Setup, repos: &Path, rt: &tokio::runtime::Runtime) -> ScriptedUpstream {
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
            (title, (reproduction_test(r, repos), golden))
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
    let s = setup_with(one_instance_per_repository());
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
    // With no `params` in the sweep, ReProAgent samples as its paper does.
    let reproagent_calls: Vec<_> = upstream
        .requests()
        .into_iter()
        .filter(|q| q.body["messages"].to_string().contains("reproagent stage:"))
        .collect();
    assert!(!reproagent_calls.is_empty());
    for q in &reproagent_calls {
        assert_eq!(
            (&q.body["temperature"], &q.body["top_p"]),
            (&json!(0.7), &json!(0.8)),
            "{}",
            q.body
        );
    }
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

/// One HTTP/1.1 exchange on loopback: (status, body).
fn http(
    addr: &str,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: Option<&Value>,
) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    let payload = body.map(|b| b.to_string()).unwrap_or_default();
    let auth = key
        .map(|k| format!("Authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{payload}",
        payload.len()
    )
    .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    let status = raw.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// The address a standalone gateway child says it listens on. Its stderr is read to the end on
/// a thread, so the gateway never writes into a closed pipe.
fn gateway_address(child: &mut std::process::Child) -> String {
    use std::io::BufRead;
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in stderr.lines() {
            let Ok(line) = line else { break };
            if let Some(rest) = line.split("http://").nth(1)
                && let Some(tx) = tx.take()
            {
                let _ = tx.send(rest.split('/').next().unwrap_or_default().to_string());
            }
        }
    });
    rx.recv_timeout(std::time::Duration::from_secs(60))
        .expect("the gateway exited or said no address within 60 s")
}

#[test]
fn the_standalone_gateway_lets_in_only_the_clients_it_was_given_unless_told_open() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let upstream = rt.block_on(ScriptedUpstream::start(|_req: &ScriptedRequest| {
        message("pong")
    }));
    let backbone = dir.path().join("backbone.toml");
    std::fs::write(
        &backbone,
        format!(
            "[[backbones]]\nname = \"scripted\"\nbase_url = \"{}\"\nmodel = \"scripted-model\"\n",
            upstream.base_url()
        ),
    )
    .unwrap();
    // Neither clients nor --open: refused before listening, saying what to give.
    let out = Command::new(bin())
        .args(["gateway", "--listen", "127.0.0.1:0", "--backbone"])
        .arg(&backbone)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--client") && err.contains("--open"), "{err}");
    let mut child = Command::new(bin())
        .args([
            "gateway",
            "--client",
            "alice",
            "--listen",
            "127.0.0.1:0",
            "--backbone",
        ])
        .arg(&backbone)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let (name, key) = line.trim().split_once(' ').expect("NAME KEY");
    let (name, key) = (name.to_string(), key.to_string());
    assert_eq!(name, "alice");
    let addr = gateway_address(&mut child);
    let ask = json!({"model": "anything", "messages": [{"role": "user", "content": "ping"}]});
    let (status, body) = http(
        &addr,
        "POST",
        "/v1/chat/completions",
        Some(&key),
        Some(&ask),
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = http(
        &addr,
        "POST",
        "/v1/chat/completions",
        Some("alice"),
        Some(&ask),
    );
    assert_eq!(status, 401, "{body}");
    assert_eq!(upstream.requests().len(), 1);
    // SAFETY: plain syscall on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    assert!(child.wait().unwrap().success());
}

#[test]
fn the_standalone_gateway_meters_each_client_key_and_enforces_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let upstream = rt.block_on(ScriptedUpstream::start(|_req: &ScriptedRequest| {
        message("pong")
    }));
    let backbone = dir.path().join("backbone.toml");
    std::fs::write(
        &backbone,
        format!(
            "[[backbones]]\nname = \"scripted\"\nbase_url = \"{}\"\nmodel = \"scripted-model\"\napi_key_env = \"RB_TEST_LLM_KEY\"\nprice = {{ input_per_mtok = 2.0, output_per_mtok = 8.0, cached_input_per_mtok = 0.5 }}\n[budget]\nmax_llm_calls = 2\n",
            upstream.base_url()
        ),
    )
    .unwrap();
    let transcripts = dir.path().join("transcripts");
    let mut child = Command::new(bin())
        .args(["gateway", "--open", "--listen", "127.0.0.1:0", "--backbone"])
        .arg(&backbone)
        .arg("--transcripts")
        .arg(&transcripts)
        .env("RB_TEST_LLM_KEY", SECRET)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let addr = gateway_address(&mut child);
    let ask = json!({"model": "anything", "messages": [{"role": "user", "content": "ping"}]});
    for (key, want) in [
        ("alice-token", 200),
        ("alice-token", 200),
        ("alice-token", 402),
        ("bob-token", 200),
    ] {
        let (status, body) = http(&addr, "POST", "/v1/chat/completions", Some(key), Some(&ask));
        assert_eq!(status, want, "{key}: {body}");
        if status == 402 {
            assert!(body.contains("budget_exceeded"), "{body}");
        }
    }
    let (status, body) = http(&addr, "GET", "/v1/usage?per_task=true", None, None);
    assert_eq!(status, 200);
    let usage: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(usage["calls"], 3);
    assert_eq!(usage["tokens_in"], 3 * PROMPT_TOKENS);
    assert_eq!(usage["tokens_cached"], 3 * CACHED_TOKENS);
    assert!((usage["cost_usd"].as_f64().unwrap() - 3.0 * COST_PER_CALL).abs() < 1e-12);
    assert_eq!(usage["budget_rejections"], 1);
    assert_eq!(usage["tasks"].as_object().unwrap().len(), 2, "{usage}");
    let (_, metrics) = http(&addr, "GET", "/metrics", None, None);
    assert!(
        metrics.contains("reprobench_gateway_calls_total"),
        "{metrics}"
    );
    // Ctrl-C: the gateway prints its totals and exits.
    // SAFETY: plain syscall on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let totals: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(totals["calls"], 3);
    let mut files = Vec::new();
    files_under(&transcripts, &mut files);
    assert_eq!(files.len(), 2, "one transcript per client key");
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for secret in [SECRET, "alice-token", "bob-token"] {
            assert!(!text.contains(secret), "{} holds {secret}", f.display());
        }
    }
    assert!(
        upstream
            .requests()
            .iter()
            .all(|q| q.authorization.as_deref() == Some(&format!("Bearer {SECRET}")[..]))
    );
}

#[test]
fn quickstart_also_runs_the_llm_agents_when_a_backbone_is_configured() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(bin())
        .args(["datasets", "prepare", "swt-mini"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = all_of_swt_mini();
    let s = Setup {
        dir: tempfile::tempdir().unwrap(),
        dataset: datasets().join("swt-mini"),
        rows,
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let upstream = scripted_with_repos(&s, &datasets().join("repos"), &rt);
    let data = dir.path().join("data");
    let out = Command::new(bin())
        .args(["quickstart", "--json", "--data"])
        .arg(&data)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("REPROBENCH_BASE_URL", upstream.base_url())
        .env("REPROBENCH_MODEL", "scripted-model")
        .env("REPROBENCH_API_KEY", SECRET)
        .env_remove("OPENAI_API_KEY")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "quickstart failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    let results = Command::new(bin())
        .args([
            "results",
            summary["run_id"].as_str().unwrap(),
            "--format",
            "jsonl",
            "--data",
        ])
        .arg(&data)
        .output()
        .unwrap();
    let rows: Vec<Value> = String::from_utf8_lossy(&results.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for agent in ["reproagent", "zero-shot-plus"] {
        let mine: Vec<&Value> = rows.iter().filter(|r| r["agent"] == agent).collect();
        assert_eq!(
            mine.len(),
            s.rows.len(),
            "{agent} ran on every swt-mini instance"
        );
        for r in mine {
            assert_eq!(r["verdict"], "resolved", "{r}");
            assert!(r["llm_calls"].as_u64().unwrap() >= 1, "{r}");
            assert_eq!(r["backbone"], "scripted-model");
        }
    }
    assert_eq!(
        rows.iter().filter(|r| r["agent"] == "gold").count(),
        s.rows.len()
    );
    // android-sim gets ltgdroid too (this scripted server answers only swt prompts, so its
    // tasks end as LLM errors: the point is that they were run, metered, and recorded).
    let android = Command::new(bin())
        .args([
            "results",
            summary["android"]["run_id"].as_str().unwrap(),
            "--format",
            "jsonl",
            "--data",
        ])
        .arg(&data)
        .output()
        .unwrap();
    let android: Vec<Value> = String::from_utf8_lossy(&android.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ltgdroid: Vec<&Value> = android
        .iter()
        .filter(|r| r["agent"] == "ltgdroid")
        .collect();
    assert_eq!(
        ltgdroid.len(),
        12,
        "ltgdroid ran on every android-sim report"
    );
    assert!(ltgdroid.iter().all(|r| r["backbone"] == "scripted-model"));
    assert_eq!(
        android
            .iter()
            .filter(|r| r["agent"] == "gold-trace" && r["success"] == true)
            .count(),
        12
    );
}

#[test]
fn a_replayed_run_gets_the_same_answers_without_calling_the_backbone() {
    let s = setup();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let upstream = scripted(&s, &rt);
    let agents = "[[agents]]\nname = \"reproagent\"\n[[agents]]\nname = \"zero-shot-plus\"\n";
    let recorded = run_sweep(&s, &sweep(&s.dataset, &upstream.base_url(), agents, ""));
    let calls_before = upstream.requests().len();
    let run_id = recorded[0]["run_id"].as_str().unwrap();
    let transcripts = s.dir.path().join("cache/artifacts").join(run_id);
    // The backbone now points nowhere and its key is not set: only the replay can answer.
    let replayed = run_sweep_with(
        &s,
        &sweep(&s.dataset, "http://127.0.0.1:9/v1", agents, ""),
        &["--replay", transcripts.to_str().unwrap()],
    );
    assert_eq!(
        upstream.requests().len(),
        calls_before,
        "the replay called the upstream"
    );
    let cell = |r: &Value| format!("{}/{}/{}", r["instance_id"], r["agent"], r["variant"]);
    let before: BTreeMap<String, &Value> = recorded.iter().map(|r| (cell(r), r)).collect();
    assert_eq!(replayed.len(), recorded.len());
    for r in &replayed {
        let was = before[&cell(r)];
        for field in [
            "verdict",
            "llm_calls",
            "tokens_in",
            "tokens_out",
            "cost_usd",
        ] {
            assert_eq!(r[field], was[field], "{}: {field}", cell(r));
        }
        let report: Value = serde_json::from_slice(
            &std::fs::read(Path::new(r["artifact_path"].as_str().unwrap()).join("report.json"))
                .unwrap(),
        )
        .unwrap();
        assert_eq!(report["agent"]["replay"], true, "{}", cell(r));
    }
}

#[test]
fn an_external_agent_packaged_as_a_local_image_runs_unchanged_and_metered() {
    if !common::docker_ready() {
        return;
    }
    let s = setup();
    let context = s.dir.path().join("agent-image");
    std::fs::create_dir_all(&context).unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny_agent.py"),
        context.join("tiny_agent.py"),
    )
    .unwrap();
    std::fs::write(
        context.join("Dockerfile"),
        "FROM reprobench/python-base:bookworm-2\nCOPY tiny_agent.py /agent/tiny_agent.py\nENTRYPOINT [\"python3\", \"/agent/tiny_agent.py\"]\n",
    )
    .unwrap();
    let tag = "reprobench-test/tiny-agent:1";
    let built = Command::new("docker")
        .args(["build", "-q", "-t", tag])
        .arg(&context)
        .env("DOCKER_BUILDKIT", "0")
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let upstream = scripted(&s, &rt);
    // A service of the node's machine on loopback, which the agent's container tries to reach:
    // with the host's network it could.
    let loopback_service = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    loopback_service.set_nonblocking(true).unwrap();
    let probe = loopback_service.local_addr().unwrap();
    let agents = format!(
        "[[agents]]\nname = \"tiny-image\"\nimage = \"{tag}\"\ncommand = [\"--probe\", \"{probe}\"]\n"
    );
    let rows = run_sweep(&s, &sweep(&s.dataset, &upstream.base_url(), &agents, ""));
    assert_eq!(rows.len(), s.rows.len());
    for r in &rows {
        assert_eq!(r["verdict"], "resolved", "{r}");
        assert_eq!(r["llm_calls"], 1, "{r}");
        assert_eq!(r["tokens_in"], PROMPT_TOKENS);
        assert!(r["error_class"].is_null(), "{r}");
    }
    match loopback_service.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("an agent container reached the node's loopback: {other:?}"),
    }
    // The agents' network (one per node process that raced to make it) routes nothing out.
    let listed = Command::new("docker")
        .args([
            "network",
            "ls",
            "-q",
            "--filter",
            "name=^reprobench-agents$",
        ])
        .output()
        .unwrap();
    let ids: Vec<String> = String::from_utf8_lossy(&listed.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect();
    assert!(!ids.is_empty());
    for id in ids {
        let internal = Command::new("docker")
            .args(["network", "inspect", "-f", "{{.Internal}}", &id])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&internal.stdout).trim(), "true");
    }
}

/// The oracle backbone (`reprobench oracle`, a perfect model's answers from the golden patches,
/// not a language model) turns every SWT agent and variant into a resolved instance: the
/// pipeline from an agent's answer to a verdict loses nothing on the way.
#[test]
fn with_the_oracle_backbone_every_swt_agent_and_variant_resolves() {
    let s = setup();
    let mut oracle = Command::new(bin())
        .args(["oracle", "--swt"])
        .arg(s.dataset.join("instances.jsonl"))
        .arg("--repos")
        .arg(s.dir.path().join("repos"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut url = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(oracle.stdout.take().unwrap()),
        &mut url,
    )
    .unwrap();
    let agents = r#"[[agents]]
name = "reproagent"
variants = ["full", "no-localization", "no-rca", "no-planning", "no-review"]
[[agents]]
name = "zero-shot-plus"
[[agents]]
name = "libro"
"#;
    let rows = run_sweep(&s, &sweep(&s.dataset, url.trim(), agents, ""));
    let _ = oracle.kill();
    let _ = oracle.wait();
    assert_eq!(
        rows.len(),
        s.rows.len() * 7,
        "one row per instance, agent and variant"
    );
    for r in &rows {
        let who = format!("{}/{} on {}", r["agent"], r["variant"], r["instance_id"]);
        assert_eq!(r["verdict"], "resolved", "{who}: {r}");
        assert!(r["llm_calls"].as_u64().unwrap() >= 1, "{who}");
    }
}
