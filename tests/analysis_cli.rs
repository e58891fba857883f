//! `reprobench tables` on real published figures and on results exported by a real run.

mod common;

use common::bin;
use serde_json::Value;
use std::path::Path;
use std::process::Command;

fn shared() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data")
}

fn tables(args: &[&str]) -> Value {
    let out = Command::new(bin())
        .arg("tables")
        .args(args)
        .args(["--format", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tables failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Equal JSON, except that floats may differ in their last bits: the
/// aggregation's summation order follows polars' threads.
fn same_up_to_rounding(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1e-300)
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_up_to_rounding(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_up_to_rounding(v, w)))
        }
        _ => a == b,
    }
}

#[test]
fn ltgdroid_table_iv_improvements_are_reproduced_from_the_published_figures() {
    let csv = shared().join("papers/ltgdroid-table4-results.csv");
    if !csv.exists() {
        assert!(
            std::env::var("REPROBENCH_REQUIRE_SHARED").as_deref() != Ok("1"),
            "REPROBENCH_REQUIRE_SHARED=1 but ../shared is absent"
        );
        eprintln!("skipped: ../shared is absent");
        return;
    }
    let rows = tables(&[
        "--kind",
        "main",
        "--published",
        csv.to_str().unwrap(),
        "--reference",
        "LTGDroid",
    ]);
    let improvement = |method: &str| -> f64 {
        rows.as_array()
            .unwrap()
            .iter()
            .find(|r| r["method"] == method)
            .unwrap()["relative_improvement_pct"]
            .as_f64()
            .unwrap()
    };
    // The paper prints 49.16%, 34.85% and 556.30% (it rounded its inputs).
    assert!(
        (improvement("ReBL") - 49.16).abs() <= 0.05,
        "{}",
        improvement("ReBL")
    );
    assert!(
        (improvement("ReBL-visual") - 34.85).abs() <= 0.05,
        "{}",
        improvement("ReBL-visual")
    );
    assert!(
        (improvement("AdbGPT") - 556.30).abs() <= 0.3,
        "{}",
        improvement("AdbGPT")
    );
    assert!(
        rows.as_array()
            .unwrap()
            .iter()
            .all(|r| r["source"] == "published")
    );
}

#[test]
fn results_exported_as_parquet_and_jsonl_give_the_same_tables() {
    let dir = tempfile::tempdir().unwrap();
    let run = common::LocalRun::start(
        dir.path(),
        "s",
        "name='t'\ndatasets=['synthetic:40:1']\nrepeats=2\n[[agents]]\nname='synthetic'\nvariants=['full','no-x']\n",
        1,
        &[],
    );
    let (data, run_id) = (&run.data, run.run_id());
    let export = |format: &str, file: &str| {
        let path = dir.path().join(file);
        let st = Command::new(bin())
            .args([
                "results",
                run_id,
                "--data",
                data.to_str().unwrap(),
                "--format",
                format,
                "--out",
                path.to_str().unwrap(),
            ])
            .status()
            .unwrap();
        assert!(st.success());
        path
    };
    let (pq, jl) = (export("parquet", "r.parquet"), export("jsonl", "r.jsonl"));
    let a = tables(&["--results", pq.to_str().unwrap(), "--kind", "main"]);
    let b = tables(&["--results", jl.to_str().unwrap(), "--kind", "main"]);
    assert!(
        same_up_to_rounding(&a, &b),
        "parquet gave {a}\njsonl gave {b}"
    );
    assert_eq!(a.as_array().unwrap().len(), 2, "full and no-x");
    let ablation = tables(&["--results", pq.to_str().unwrap(), "--kind", "ablation"]);
    assert_eq!(ablation[0]["variant"], "synthetic");
    let succeeded = run.summary["succeeded"].as_f64().unwrap();
    let mean_sr: f64 = a
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["success_rate_pct"].as_f64().unwrap())
        .sum::<f64>()
        / 2.0;
    assert!(
        (mean_sr - 100.0 * succeeded / 160.0).abs() < 1e-6,
        "{mean_sr} vs {succeeded}/160"
    );
    for format in ["term", "md", "latex", "csv"] {
        let out = Command::new(bin())
            .args([
                "tables",
                "--results",
                pq.to_str().unwrap(),
                "--format",
                format,
            ])
            .output()
            .unwrap();
        assert!(out.status.success() && !out.stdout.is_empty(), "{format}");
    }
}

#[test]
fn compare_exits_1_on_a_significant_drop_and_report_writes_one_html_file() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, ok: &dyn Fn(usize) -> bool| {
        let text: String = (0..60)
            .map(|i| {
                serde_json::json!({"run_id": name, "dataset": "d", "instance_id": format!("i{i}"), "agent": "a",
                                   "variant": "full", "backbone": "b", "repeat": 0, "success": ok(i),
                                   "verdict": if ok(i) { "resolved" } else { "unresolved" }, "cost_usd": 0.1})
                .to_string()
                    + "\n"
            })
            .collect();
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let old = write("old.jsonl", &|_| true);
    let new_bad = write("bad.jsonl", &|i| i % 3 != 0); // 20 of 60 lost
    let new_same = write("same.jsonl", &|_| true);
    let code = |new: &Path| {
        Command::new(bin())
            .args([
                "compare",
                "--results",
                new.to_str().unwrap(),
                "--baseline",
                old.to_str().unwrap(),
                "--max-drop",
                "5",
            ])
            .output()
            .unwrap()
            .status
            .code()
    };
    assert_eq!(code(&new_bad), Some(1));
    assert_eq!(code(&new_same), Some(0));
    let html = dir.path().join("r.html");
    let st = Command::new(bin())
        .args([
            "report",
            "--results",
            old.to_str().unwrap(),
            new_bad.to_str().unwrap(),
            "--out",
            html.to_str().unwrap(),
        ])
        .status()
        .unwrap();
    assert!(st.success());
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("<svg") && page.contains("i59"));
    assert!(
        !page.contains("<script src") && !page.contains("<link "),
        "self-contained"
    );
}

#[test]
fn tables_and_compare_refuse_results_graded_under_different_rules() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, rules: &str, success: bool| {
        let rows: String = (0..4)
            .map(|i| {
                serde_json::json!({
                    "run_id": name, "sweep": "s", "track": "swt", "dataset": "swt-lite",
                    "instance_id": format!("o__r-{i}"), "repo_or_app": "o/r", "agent": "a",
                    "variant": "full", "backbone": "", "repeat": 0, "success": success && i % 2 == 0,
                    "verdict": "resolved", "rules": rules,
                })
                .to_string()
                    + "\n"
            })
            .collect();
        let p = dir.path().join(format!("{name}.jsonl"));
        std::fs::write(&p, rows).unwrap();
        p.to_str().unwrap().to_string()
    };
    let new = write("new", "swt-bench-2025-09", true);
    let old = write("old", "swt-bench-2024", true);
    let run = |args: &[&str]| Command::new(bin()).args(args).output().unwrap();
    let refused = run(&["tables", "--results", &new, &old, "--kind", "main"]);
    assert!(!refused.status.success());
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(
        why.contains("swt-bench-2024") && why.contains("--mixed-rules"),
        "{why}"
    );
    let allowed = run(&[
        "tables",
        "--results",
        &new,
        &old,
        "--kind",
        "main",
        "--mixed-rules",
    ]);
    assert!(
        allowed.status.success(),
        "{}",
        String::from_utf8_lossy(&allowed.stderr)
    );
    let refused = run(&["compare", "--results", &new, "--baseline", &old]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--mixed-rules"));
    let same = write("same", "swt-bench-2025-09", true);
    let ok = run(&["compare", "--results", &new, "--baseline", &same]);
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
}
