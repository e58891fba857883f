//! Hostile predictions (`tests/hostile/predictions.py`): "reproduction tests" that never call the
//! code under test and pass only when the harness lets them tell a post-fix run from a pre-fix
//! one (git's view, file times, state an earlier execution left, the golden fix or the harness's
//! script somewhere readable, a process an earlier execution left, the environment). Each must be
//! graded unresolved, on both executors, because nothing leaks: every hostile test must run and
//! fail in both runs. Gold still resolves every instance, and a genuine reproduction that prints
//! forged result lines is named in `suspicious` and refused under `--strict`.

mod common;

use common::{bin, docker_ready};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A scratch area whose directories the unprivileged execution user can reach.
fn scratch() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// The generator's output for `args`, written to a file in `dir`.
fn predictions(dir: &Path, name: &str, args: &[&str]) -> PathBuf {
    let out = Command::new("python3")
        .arg(root().join("tests/hostile/predictions.py"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = dir.join(name);
    std::fs::write(&path, &out.stdout).unwrap();
    path
}

fn eval(dir: &Path, executor: &str, predictions: &str, extra: &[&str]) -> Value {
    let out = Command::new(bin())
        .args([
            "eval",
            "--dataset",
            "swt-mini",
            "--predictions",
            predictions,
        ])
        .args(["--executor", executor, "--local-nodes", "2", "--json"])
        .arg("--datasets")
        .arg(root().join("datasets"))
        .arg("--data")
        .arg(dir.join("data"))
        .arg("--repos")
        .arg(dir.join("repos"))
        .arg("--cache-dir")
        .arg(dir.join("cache"))
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "eval failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn report(v: &Value, instance: &str) -> Value {
    let path = Path::new(v["reports"].as_str().unwrap())
        .join(instance)
        .join("report.json");
    serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
}

/// Whether one of a report's executions ran in a tree staged ahead.
fn ran_a_tree_staged_ahead(report: &Value) -> bool {
    let executions = report["executions"].as_object().into_iter().flatten();
    executions
        .flat_map(|(_, e)| e["timings"].as_array().into_iter().flatten())
        .any(|t| t["phase"] == "ahead")
}

/// `(kind, instance)` of every hostile prediction.
fn kinds() -> Vec<(String, String)> {
    let out = Command::new("python3")
        .arg(root().join("tests/hostile/predictions.py"))
        .arg("--kinds")
        .output()
        .unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let mut f = l.split('\t');
            (f.next().unwrap().into(), f.next().unwrap().into())
        })
        .collect()
}

fn nothing_leaks_on(executor: &str) {
    let dir = scratch();
    let hostile = predictions(dir.path(), "hostile.jsonl", &[]);
    // Every announced execution's tree staged ahead: a hostile test that ran in such a tree
    // must learn no more than one whose tree was staged on its path.
    let always = ["--stage-ahead", "always"];
    let v = eval(dir.path(), executor, hostile.to_str().unwrap(), &always);
    assert_eq!(v["errors"], 0, "{v}");
    let kinds = kinds();
    assert!(kinds.len() >= 13, "{kinds:?}");
    let staged_ahead = kinds
        .iter()
        .filter(|(_, instance)| ran_a_tree_staged_ahead(&report(&v, instance)))
        .count();
    assert!(
        staged_ahead > 0,
        "{executor}: no hostile test ran in a tree staged ahead"
    );
    for (kind, instance) in &kinds {
        let r = report(&v, instance);
        assert_eq!(r["resolved"], false, "{executor}: `{kind}` leaked: {r}");
        // The hostile test ran, and failed both before and after the fix: it learnt nothing.
        let tests = r["tests_pred"]
            .as_object()
            .unwrap_or_else(|| panic!("{executor}: `{kind}`: {r}"));
        let id = tests
            .keys()
            .find(|id| id.contains(&format!("test_hostile_{kind}")))
            .unwrap_or_else(|| panic!("{executor}: `{kind}`'s test did not run: {r}"));
        assert_eq!(tests[id], "FAIL_TO_FAIL", "{executor}: `{kind}`: {r}");
    }
    assert_eq!(v["resolved"], 0, "{v}");

    // The control: gold resolves every instance in the same cluster setup and cache.
    let gold = eval(dir.path(), executor, "gold", &[]);
    assert_eq!(gold["resolved"], 14, "{executor}: {gold}");

    // A genuine reproduction that prints forged result lines after the runner's summary: SWT-bench
    // grades it resolved (the forged lines change no status it reads), reprobench names the
    // lines, and `--strict` refuses it.
    let injected = predictions(dir.path(), "injected.jsonl", &["--injected"]);
    let id = ["--instance-id", "reprobench__textkit-1"];
    let lenient = eval(dir.path(), executor, injected.to_str().unwrap(), &id);
    let r = report(&lenient, "reprobench__textkit-1");
    assert_eq!(r["resolved"], true, "{executor}: {r}");
    let kinds_found: Vec<&str> = r["suspicious"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["kind"].as_str().unwrap())
        .collect();
    for want in ["results_after_summary", "conflicting_results"] {
        assert!(
            kinds_found.contains(&want),
            "{executor}: {want} not found: {r}"
        );
    }
    let mut strict_args = id.to_vec();
    strict_args.extend(["--strict", "--new"]);
    let strict = eval(
        dir.path(),
        executor,
        injected.to_str().unwrap(),
        &strict_args,
    );
    assert_eq!(
        report(&strict, "reprobench__textkit-1")["resolved"],
        false,
        "{executor}"
    );
}

#[test]
fn hostile_predictions_learn_nothing_with_the_process_executor() {
    nothing_leaks_on("process");
}

#[test]
fn hostile_predictions_learn_nothing_with_the_docker_executor() {
    if !docker_ready() {
        return;
    }
    nothing_leaks_on("docker");
}
