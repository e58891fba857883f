//! `reprobench eval` end to end on swt-mini: real node processes, real git, real Python test
//! runs; the process executor always, the docker executor where the engine and base image are.

mod common;

use common::bin;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn datasets() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("datasets")
}

/// A scratch area whose directories the unprivileged execution user can reach.
fn scratch() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// `reprobench ARGS` on the test datasets, with its data, mirrors and caches in `dir`.
fn local_command(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(bin());
    c.args(args)
        .arg("--datasets")
        .arg(datasets())
        .arg("--data")
        .arg(dir.join("data"))
        .arg("--repos")
        .arg(dir.join("repos"))
        .arg("--cache-dir")
        .arg(dir.join("cache"));
    c
}

fn eval(dir: &Path, executor: &str, predictions: &str, extra: &[&str]) -> (Value, String) {
    let out = local_command(
        dir,
        &[
            "eval",
            "--dataset",
            "swt-mini",
            "--predictions",
            predictions,
            "--executor",
            executor,
            "--local-nodes",
            "2",
            "--json",
        ],
    )
    .args(extra)
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "eval failed: {stderr}");
    (
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout))),
        stderr,
    )
}

fn report(v: &Value, instance: &str) -> Value {
    let path = Path::new(v["reports"].as_str().unwrap())
        .join(instance)
        .join("report.json");
    serde_json::from_slice(
        &std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap()
}

fn instances() -> Vec<Value> {
    std::fs::read_to_string(datasets().join("swt-mini/instances.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn gold_resolves_every_instance_with_the_process_executor() {
    let dir = scratch();
    let (v, _) = eval(dir.path(), "process", "gold", &[]);
    assert_eq!(v["total"], 14);
    assert_eq!(v["resolved"], 14, "{v}");
    assert_eq!(v["errors"], 0);
    assert_eq!(v["applicable"], 14);
    assert_eq!(v["f2p"], 14);
    let summary: Value = serde_json::from_slice(
        &std::fs::read(Path::new(v["reports"].as_str().unwrap()).join("summary.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(summary["resolved_instances"], 14);
    assert_eq!(summary["resolved_ids"].as_array().unwrap().len(), 14);
    let r = report(&v, "reprobench__textkit-1");
    assert_eq!(r["resolved"], true);
    assert_eq!(r["patch_successfully_applied"], true);
    assert_eq!(
        r["executions"].as_object().unwrap().len(),
        6,
        "six executions"
    );
    // Gold's prediction is the golden test patch: its two runs are the gold ones, which are
    // read back instead of run again.
    let cached = |run: &str| r["executions"][run]["cached"].as_bool();
    assert_eq!(
        ["pred_pre", "pred_post", "gold_pre", "gold_post"].map(cached),
        [Some(false), Some(false), Some(true), Some(true)],
        "{r:#}"
    );

    assert_eq!(r["rules"], "swt-bench-2025-09");
    assert_eq!(summary["rules"], "swt-bench-2025-09");

    // Each report directory is a grade directory: its six logs and case.json regrade to the
    // same verdict with no execution.
    let report_dir = Path::new(v["reports"].as_str().unwrap()).join("reprobench__textkit-1");
    for run in [
        "pred_pre",
        "pred_post",
        "gold_pre",
        "gold_post",
        "base_pre",
        "base_post",
    ] {
        assert!(
            report_dir.join(format!("{run}.log")).is_file(),
            "{run}.log beside the report"
        );
    }
    let out = Command::new(bin())
        .args(["grade", "--json"])
        .arg(&report_dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let g: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(g["resolved"], true, "{g}");
    assert_eq!(g["tests_pred"], r["tests_pred"]);

    // The whole run regraded from its stored logs, under the older rules, beside the old reports.
    let out = Command::new(bin())
        .args(["grade", "--json", "--rules", "swt-bench-2024", "--run"])
        .arg(v["run_id"].as_str().unwrap())
        .arg("--data")
        .arg(dir.path().join("data"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let regraded: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(regraded["regraded"], 14, "{regraded}");
    let new_reports = PathBuf::from(regraded["reports"].as_str().unwrap());
    assert!(new_reports.starts_with(v["reports"].as_str().unwrap()));
    let summary24: Value =
        serde_json::from_slice(&std::fs::read(new_reports.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary24["rules"], "swt-bench-2024");
    let rows = std::fs::read_to_string(new_reports.join("results.jsonl")).unwrap();
    assert!(
        rows.lines()
            .all(|l| l.contains(r#""rules":"swt-bench-2024""#))
    );

    // The same command again reuses the finished run instead of redoing it.
    let (again, _) = eval(dir.path(), "process", "gold", &[]);
    assert_eq!(again["resumed"], true);
    assert_eq!(again["run_id"], v["run_id"]);
    assert_eq!(again["resolved"], 14);
}

#[test]
fn gold_resolves_every_instance_with_the_docker_executor() {
    if !common::docker_ready() {
        return;
    }
    let dir = scratch();
    let (v, _) = eval(dir.path(), "docker", "gold", &[]);
    assert_eq!(
        (
            v["total"].as_u64(),
            v["resolved"].as_u64(),
            v["errors"].as_u64()
        ),
        (Some(14), Some(14), Some(0)),
        "{v}"
    );
}

fn new_file(path: &str, body: &str) -> String {
    format!(
        "diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n@@ -0,0 +1,{} @@\n{}",
        body.lines().count(),
        body.lines().map(|l| format!("+{l}\n")).collect::<String>()
    )
}

#[test]
fn bad_inputs_are_classified_and_the_rest_of_the_run_completes() {
    let dir = scratch();
    let insts = instances();
    let id = |i: usize| insts[i]["instance_id"].as_str().unwrap().to_string();
    let pred = |i: usize, patch: Value| {
        serde_json::json!({"instance_id": id(i), "model_name_or_path": "stress", "model_patch": patch}).to_string()
    };
    // unittest-style, so pytest and unittest repositories both run them.
    let case = |name: &str, imports: &str, body: &str| {
        new_file(
            &format!("tests/test_{name}.py"),
            &format!(
                "import unittest\n{imports}\nclass TestStress(unittest.TestCase):\n    def test_{name}(self):\n{body}"
            ),
        )
    };
    let hang = case("hang", "import time", "        time.sleep(3600)\n");
    let bomb = case(
        "bomb",
        "import os",
        "        while True:\n            os.fork()\n",
    );
    let disk = case(
        "disk",
        "",
        "        with open('big.bin', 'wb') as f:\n            while True:\n                f.write(b'0' * (1 << 20))\n",
    );
    let net = case(
        "net",
        "import socket",
        "        socket.create_connection(('127.0.0.1', 9), timeout=3).close()\n",
    );
    // Removes a line no file has: no step of the fallback chain can apply it.
    let stale = "diff --git a/tests/__init__.py b/tests/__init__.py\n--- a/tests/__init__.py\n+++ b/tests/__init__.py\n@@ -1,1 +1,1 @@\n-this line is not in the file\n+def test_x(): pass\n".to_string();
    let lines = vec![
        pred(0, insts[0]["test_patch"].clone()), // a good prediction: resolved
        "{this is not json".to_string(),
        serde_json::json!({"instance_id": "nobody__nothing-1", "model_name_or_path": "stress", "model_patch": "x"}).to_string(),
        pred(1, Value::String(String::new())),
        pred(2, Value::String(" \n\t\n".into())),
        pred(3, Value::String("diff --git a/x.bin b/x.bin\nnew file mode 100644\nGIT binary patch\nliteral 3\nabc\n".into())),
        pred(4, Value::String(new_file("../outside.py", "x = 1\n"))),
        pred(5, Value::String(stale)),
        pred(6, Value::String(format!("{}{}", new_file("tests/test_big.py", "x = 1\n"), "+#\n".repeat(4 << 20)))),
        pred(7, Value::String(hang)),
        pred(8, Value::String(bomb)),
        pred(9, Value::String(disk)),
        pred(10, Value::String(net)),
        pred(11, Value::String("--- /etc/passwd\n+++ /etc/passwd\n@@ -1 +1 @@\n-a\n+b\n".into())),
    ];
    let file = dir.path().join("preds.jsonl");
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let (v, stderr) = eval(
        dir.path(),
        "process",
        file.to_str().unwrap(),
        &["--timeout-s", "15"],
    );
    assert!(
        stderr.contains(":2") && stderr.contains("malformed JSON"),
        "the bad line is named: {stderr}"
    );
    assert!(
        stderr.contains("nobody__nothing-1"),
        "the unknown id is named: {stderr}"
    );
    assert_eq!(
        v["completed"].as_u64().unwrap() + v["errors"].as_u64().unwrap(),
        15,
        "14 instances + the malformed line: {v}"
    );
    assert_eq!(v["resolved"], 1, "{v}");
    let class = |i: usize| {
        report(&v, &id(i))["error_class"]
            .as_str()
            .map(str::to_string)
    };
    let verdict = |i: usize| report(&v, &id(i))["verdict"].as_str().unwrap().to_string();
    assert_eq!(verdict(0), "resolved");
    assert_eq!((verdict(1), class(1)), ("unresolved".into(), None), "empty");
    assert_eq!(
        (verdict(2), class(2)),
        ("unresolved".into(), None),
        "whitespace"
    );
    assert_eq!(class(3).as_deref(), Some("bad_input:binary_patch"));
    // An errored instance's report names it too.
    assert_eq!(report(&v, &id(3))["instance_id"], id(3).as_str());
    assert_eq!(class(4).as_deref(), Some("bad_input:patch_outside_repo"));
    assert_eq!(
        report(&v, &id(5))["patch_successfully_applied"],
        false,
        "a patch that does not apply"
    );
    assert_eq!(class(6).as_deref(), Some("bad_input:patch_too_large"));
    // The hang is killed at the timeout; as in SWT-bench, an instance whose pred_pre execution
    // timed out is an error, and it says why where users look.
    let hung = report(&v, &id(7));
    assert_eq!(hung["error_class"], "timeout:pred_pre", "{hung}");
    assert!(
        hung["message"].as_str().unwrap().contains("timeout"),
        "{hung}"
    );
    let rows =
        std::fs::read_to_string(Path::new(v["reports"].as_str().unwrap()).join("results.jsonl"))
            .unwrap();
    let row: Value = rows
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|r| r["instance_id"] == id(3).as_str())
        .unwrap();
    assert!(
        row["error_message"].as_str().unwrap().contains("binary"),
        "{row}"
    );
    assert!(
        !row["started_at"].as_str().unwrap().starts_with("1970"),
        "{row}"
    );
    let status = Command::new(bin())
        .args(["status", "--attempts", "--json"])
        .arg(v["run_id"].as_str().unwrap())
        .arg("--data")
        .arg(dir.path().join("data"))
        .output()
        .unwrap();
    let status: Value = serde_json::from_slice(&status.stdout).unwrap();
    let attempt = status["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["instance_id"] == id(3).as_str())
        .unwrap()
        .clone();
    assert!(
        attempt["reason"]
            .as_str()
            .unwrap_or("")
            .contains("binary_patch"),
        "{attempt}"
    );
    // A fork bomb, a disk filler and a network call are graded or, when they outlast the
    // timeout in pred_pre, errors that say so; never lost.
    for i in [8, 9, 10] {
        let (v, c) = (verdict(i), class(i));
        assert!(
            v == "unresolved" || (v == "error" && c.as_deref() == Some("timeout:pred_pre")),
            "instance {i} is graded, not lost: {v} {c:?}"
        );
    }
    assert_eq!(
        class(11).as_deref(),
        Some("bad_input:patch_outside_repo"),
        "absolute path"
    );
    // Instances without a prediction (12, 13) are evaluated as empty: unresolved.
    assert_eq!(verdict(12), "unresolved");

    // Rerunning resumes the finished evaluation without redoing it.
    let (again, _) = eval(
        dir.path(),
        "process",
        file.to_str().unwrap(),
        &["--timeout-s", "15"],
    );
    assert_eq!(
        (again["resumed"].as_bool(), again["resolved"].as_u64()),
        (Some(true), Some(1))
    );
}

/// `reprobench run` of the sweep `dir/s.toml` with one local node, on the test datasets, its data,
/// mirrors and caches in `dir`.
fn run_sweep(dir: &Path) -> Command {
    let sweep = dir.join("s.toml");
    local_command(
        dir,
        &["run", &sweep.to_string_lossy(), "--local-nodes", "1"],
    )
}

/// Runs `reprobench run` on a gold sweep of swt-mini on the docker executor (named in the sweep)
/// with `extra` arguments; it must end within a minute (a sweep whose tasks no local node can
/// take would wait forever), unsuccessfully.
fn refused_run(extra: &[&str]) -> String {
    let dir = scratch();
    std::fs::write(
        dir.path().join("s.toml"),
        "name = \"kinds\"\ndatasets = [\"swt-mini\"]\n[[agents]]\nname = \"gold\"\n[eval]\nexecutor = \"docker\"\n",
    )
    .unwrap();
    let mut child = run_sweep(dir.path())
        .args(extra)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("`run {extra:?}` was still waiting after a minute");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "`run {extra:?}` succeeded: {stderr}");
    stderr
}

#[test]
fn a_sweep_the_local_nodes_cannot_run_is_refused_before_it_starts_naming_the_fix() {
    // Slots of another kind than the executor the sweep names.
    let stderr = refused_run(&["--node-slots", "process=1"]);
    assert!(stderr.contains("--node-slots docker=2"), "{stderr}");
    // A docker executor without its base image (or without an engine at all).
    let stderr = refused_run(&["--base-image", "reprobench-test/no-such-image:0"]);
    assert!(stderr.contains("executor = \"process\""), "{stderr}");
}

/// swt-mini's first instance as a dataset of its own, in `dir`.
fn one_instance_dataset(dir: &Path) -> PathBuf {
    let mini = datasets().join("swt-mini");
    let one = dir.join("swt-mini-1");
    std::fs::create_dir_all(&one).unwrap();
    let first = std::fs::read_to_string(mini.join("instances.jsonl")).unwrap();
    let first = first.lines().next().unwrap();
    std::fs::write(one.join("instances.jsonl"), format!("{first}\n")).unwrap();
    std::fs::copy(mini.join("env.json"), one.join("env.json")).unwrap();
    let manifest = serde_json::json!({
        "name": "swt-mini-1", "track": "swt", "instances": "instances.jsonl", "env": "env.json",
        "sources": mini.join("src"),
    });
    std::fs::write(one.join("manifest.json"), manifest.to_string()).unwrap();
    one
}

#[test]
fn run_chooses_the_executor_as_eval_does_when_the_sweep_names_none() {
    let dir = scratch();
    let dataset = one_instance_dataset(dir.path());
    std::fs::write(
        dir.path().join("s.toml"),
        format!(
            "name = \"auto\"\ndatasets = [\"{}\"]\n[[agents]]\nname = \"gold\"\n",
            dataset.display()
        ),
    )
    .unwrap();
    // Docker cannot run here (no such base image), so the process executor is chosen, and said.
    let out = run_sweep(dir.path())
        .arg("--json")
        .args(["--base-image", "reprobench-test/no-such-image:0"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("using the process executor"), "{stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["tasks"].as_u64(), v["succeeded"].as_u64()),
        (Some(1), Some(1)),
        "{v}"
    );
}
