//! Real SWT-bench instances end to end, offline: psf/requests from the real slice in
//! `../shared/data/real/swt-slice` (its rows, its mirror tarball), environments from SWT-bench's
//! specs shipped in `datasets/swt-bench`, the process executor. The golden test patches resolve,
//! a test that reproduces nothing does not, and AssertFlip's published predictions get their
//! official verdicts under the rules they were graded with. Skipped when `../shared` is absent,
//! failed instead under `REPROBENCH_REQUIRE_SHARED=1`.

mod common;

use common::{bin, shared_data};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

const INSTANCES: [&str; 2] = ["psf__requests-1142", "psf__requests-3362"];

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

fn run(args: &[&str], dir: &Path) -> (bool, String, String) {
    let out = Command::new(bin())
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn eval(dir: &Path, rows: &Path, predictions: &str, extra: &[&str]) -> Value {
    let data = dir.join("data");
    let cache = dir.join("cache");
    let repos = dir.join("repos");
    let datasets = datasets();
    let mut args = vec![
        "eval",
        "--dataset",
        rows.to_str().unwrap(),
        "--predictions",
        predictions,
        "--executor",
        "process",
        "--local-nodes",
        "1",
        "--json",
        "--datasets",
        datasets.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--cache-dir",
        cache.to_str().unwrap(),
        "--repos",
        repos.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let (ok, stdout, stderr) = run(&args, dir);
    assert!(ok, "eval failed: {stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"))
}

fn report(v: &Value, instance: &str) -> Value {
    let p = Path::new(v["reports"].as_str().unwrap())
        .join(instance)
        .join("report.json");
    serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap()
}

fn jsonl(path: &Path, rows: impl Iterator<Item = Value>) {
    let text: String = rows.map(|r| r.to_string() + "\n").collect();
    std::fs::write(path, text).unwrap();
}

/// Imports the slice's mirror `OWNER__NAME` into DIR/repos and writes the rows of `ids` to
/// DIR/rows.jsonl; that file and the rows.
fn import_rows(slice: &Path, dir: &Path, mirror: &str, ids: &[&str]) -> (PathBuf, Vec<Value>) {
    let tarball = slice.join(format!("repos/{mirror}.git.tar.gz"));
    let repos = dir.join("repos");
    let (ok, stdout, stderr) = run(
        &[
            "datasets",
            "import",
            tarball.to_str().unwrap(),
            "--repos",
            repos.to_str().unwrap(),
        ],
        dir,
    );
    assert!(ok && stdout.contains("imported"), "{stdout}{stderr}");
    let rows: Vec<Value> = std::fs::read_to_string(slice.join("rows.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| ids.contains(&r["instance_id"].as_str().unwrap()))
        .collect();
    assert_eq!(rows.len(), ids.len());
    let rows_file = dir.join("rows.jsonl");
    jsonl(&rows_file, rows.iter().cloned());
    (rows_file, rows)
}

#[test]
fn requests_from_the_real_slice_is_graded_as_swt_bench_grades_it() {
    let Some(slice) = shared_data("real/swt-slice") else {
        return;
    };
    let dir = scratch();
    // The rows as they are: no env, so SWT-bench's specs give Python 3.9 and its test command.
    let (rows_file, rows) = import_rows(&slice, dir.path(), "psf__requests", &INSTANCES);
    assert!(rows.iter().all(|r| r.get("env").is_none()));

    let gold = eval(dir.path(), &rows_file, "gold", &[]);
    assert_eq!(
        (gold["total"].as_u64(), gold["resolved"].as_u64()),
        (Some(2), Some(2)),
        "{gold}"
    );
    let r = report(&gold, "psf__requests-3362");
    assert_eq!(r["parser"], "pytest_options");
    // SWT-bench's coverage: the golden tests run the golden patch's changed lines, more than the
    // runs without them do; the gold "prediction" is the golden test patch.
    for id in INSTANCES {
        let g = report(&gold, id);
        let share = |k: &str| {
            g[k].as_f64()
                .unwrap_or_else(|| panic!("{id}: no {k}: {g:#}"))
        };
        assert!(
            share("coverage_gold") > 0.0 && share("coverage_delta_gold") > 0.0,
            "{id}: {g:#}"
        );
        assert_eq!(g["coverage_pred"], g["coverage_gold"], "{id}");
    }
    let summary: Value = serde_json::from_slice(
        &std::fs::read(Path::new(gold["reports"].as_str().unwrap()).join("summary.json")).unwrap(),
    )
    .unwrap();
    assert!(
        summary["Mean coverage delta"].as_f64().unwrap() > 0.0,
        "{summary}"
    );
    assert!(
        r["test_directives"] == serde_json::json!(["tests/test_requests.py"]),
        "{r}"
    );

    // A test that passes before and after the fix reproduces nothing.
    let passing = "diff --git a/tests/test_nothing.py b/tests/test_nothing.py\nnew file mode 100644\n--- /dev/null\n+++ b/tests/test_nothing.py\n@@ -0,0 +1,4 @@\n+import requests\n+\n+def test_import():\n+    assert requests.get\n";
    let preds = dir.path().join("preds.jsonl");
    jsonl(
        &preds,
        INSTANCES.iter().map(|id| {
            serde_json::json!({"instance_id": id, "model_name_or_path": "nothing", "model_patch": passing})
        }),
    );
    let nothing = eval(dir.path(), &rows_file, preds.to_str().unwrap(), &[]);
    assert_eq!(nothing["resolved"], 0, "{nothing}");
    let r = report(&nothing, "psf__requests-1142");
    let pred_pre_log = std::fs::read_to_string(
        Path::new(nothing["reports"].as_str().unwrap()).join("psf__requests-1142/pred_pre.log"),
    )
    .unwrap_or_default();
    assert_eq!(
        r["p2p"], true,
        "a passing new test is P→P: {r:#}\npred_pre.log:\n{pred_pre_log}"
    );
    assert!(
        report(&nothing, "psf__requests-1142")["executions"]["gold_pre"]["cached"] == true,
        "gold and base come from the cache: only the prediction's two executions run"
    );

    // AssertFlip's predictions get their official verdicts under the rules of their time.
    let official: Value = serde_json::from_slice(
        &std::fs::read(slice.join("verdicts/AssertFlip-requests-flask-pytest.json")).unwrap(),
    )
    .unwrap();
    let af = dir.path().join("assertflip.jsonl");
    let all = std::fs::read_to_string(slice.join("predictions/AssertFlip.jsonl")).unwrap();
    jsonl(
        &af,
        all.lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|p| INSTANCES.contains(&p["instance_id"].as_str().unwrap())),
    );
    let v = eval(
        dir.path(),
        &rows_file,
        af.to_str().unwrap(),
        &["--rules", "swt-bench-2024"],
    );
    for id in INSTANCES {
        assert_eq!(
            report(&v, id)["resolved"],
            official["instances"][id]["resolved"],
            "{id}: {}",
            report(&v, id)
        );
    }
}

/// django 3.0 (Python 3.6) from the real slice: SWT-bench's django specs end to end. Its
/// `eval_commands` export `LANG=en_US.UTF-8`, and without that locale Python 3.6 runs in ASCII and
/// django__django-10914's `migrate` dies with `UnicodeEncodeError`; its requirements build
/// `pywatchman` from source. AssertFlip's prediction for django__django-11001 gets its official
/// verdict.
#[test]
fn django_3_0_from_the_real_slice_resolves_with_its_locale() {
    let Some(slice) = shared_data("real/swt-slice") else {
        return;
    };
    const DJANGO: [&str; 2] = ["django__django-10914", "django__django-11001"];
    let dir = scratch();
    let (rows_file, _) = import_rows(&slice, dir.path(), "django__django", &DJANGO);
    let gold = eval(dir.path(), &rows_file, "gold", &[]);
    assert_eq!(
        (gold["total"].as_u64(), gold["resolved"].as_u64()),
        (Some(2), Some(2)),
        "{gold}"
    );
    let r = report(&gold, "django__django-10914");
    assert_eq!(r["parser"], "django");
    assert_eq!(
        r["test_directives"],
        serde_json::json!(["test_utils.tests"]),
        "django's test files as dotted modules"
    );
    let post = std::fs::read_to_string(
        Path::new(gold["reports"].as_str().unwrap()).join("django__django-10914/pred_post.log"),
    )
    .unwrap();
    assert!(!post.contains("UnicodeEncodeError"), "{post}");

    let official: Value = serde_json::from_slice(
        &std::fs::read(slice.join("verdicts/AssertFlip-django.json")).unwrap(),
    )
    .unwrap();
    let af = dir.path().join("assertflip.jsonl");
    let all = std::fs::read_to_string(slice.join("predictions/AssertFlip.jsonl")).unwrap();
    jsonl(
        &af,
        all.lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|p| p["instance_id"] == "django__django-11001"),
    );
    let v = eval(
        dir.path(),
        &rows_file,
        af.to_str().unwrap(),
        &["--rules", "swt-bench-2024"],
    );
    assert_eq!(
        report(&v, "django__django-11001")["resolved"],
        official["instances"]["django__django-11001"]["resolved"],
        "{}",
        report(&v, "django__django-11001")
    );
}
