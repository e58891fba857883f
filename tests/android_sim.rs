//! The android track on the simulator through the cluster: `gold-trace` validates the
//! `android-sim` suite (every report reproduced from its ground truth), and `monkey` with fixed
//! seeds reproduces some crash reports and no non-crash one. The device is the `sim` executor's
//! simulator, never an emulator.

mod common;

use common::bin;
use serde_json::Value;
use std::process::Command;

#[test]
fn gold_trace_reproduces_every_sim_report_and_monkey_no_non_crash_one() {
    let dir = tempfile::tempdir().unwrap();
    let sweep = dir.path().join("android.toml");
    std::fs::write(
        &sweep,
        "name = \"android-sim\"\ndatasets = [\"android-sim\"]\nseed = 3\n[[agents]]\nname = \"gold-trace\"\n[[agents]]\nname = \"monkey\"\n",
    )
    .unwrap();
    let data = dir.path().join("data");
    let out = Command::new(bin())
        .arg("run")
        .arg(&sweep)
        .args(["--local-nodes", "1", "--json", "--data"])
        .arg(&data)
        .arg("--artifacts")
        .arg(dir.path().join("artifacts"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run: Value = serde_json::from_slice(&out.stdout).unwrap();
    let results = Command::new(bin())
        .args([
            "results",
            run["run_id"].as_str().unwrap(),
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
    let of = |agent: &'static str| rows.iter().filter(move |r| r["agent"] == agent);
    assert_eq!(of("gold-trace").count(), 12);
    for r in of("gold-trace") {
        assert_eq!(r["track"], "android");
        assert_eq!(r["verdict"], "reproduced", "{r}");
        assert_eq!(r["trace_len"], r["ground_truth_actions"], "{r}");
        let details: Value = serde_json::from_slice(
            &std::fs::read(
                std::path::Path::new(r["artifact_path"].as_str().unwrap()).join("trace.json"),
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(details["simulator"], true);
    }
    assert_eq!(of("monkey").count(), 12);
    for r in of("monkey") {
        assert!(r["actions"].as_u64().unwrap() <= 100, "{r}");
        if r["bug_type"] == "non-crash" {
            assert_eq!(r["verdict"], "not_reproduced", "{r}");
        }
    }
}
