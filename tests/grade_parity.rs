//! `reprobench grade` against SWT-bench's own verdicts: every case of the public parity corpus
//! (`../shared/data/swt-parity`, six logs and the `expected.json` SWT-bench's code gives) must
//! come out identical on the five booleans and the three test maps. Skipped when `../shared` is
//! absent, failed instead under `REPROBENCH_REQUIRE_SHARED=1`.

mod common;

use common::{bin, shared_data};
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

const VERDICT_KEYS: [&str; 8] = [
    "resolved",
    "applicable",
    "f2x",
    "f2p",
    "p2p",
    "tests_pred",
    "tests_gold",
    "tests_base",
];

fn cases(root: &std::path::Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("case.json").is_file())
        .collect();
    dirs.sort();
    dirs
}

#[test]
fn every_public_parity_case_is_graded_as_swt_bench_grades_it() {
    let Some(root) = shared_data("swt-parity") else {
        return;
    };
    let dirs = cases(&root);
    assert_eq!(dirs.len(), 300, "the public corpus has 300 cases");
    let out = Command::new(bin())
        .args(["grade", "--json"])
        .args(&dirs)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "grade failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), dirs.len(), "one JSON line per directory");
    let mut mismatches = Vec::new();
    for (dir, got) in dirs.iter().zip(&lines) {
        assert_eq!(got["dir"], dir.display().to_string(), "lines come in order");
        assert_eq!(got["rules"], "swt-bench-2025-09", "the default rules");
        let want: Value =
            serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
        for key in VERDICT_KEYS {
            if got.get(key) != want.get(key) {
                mismatches.push(format!(
                    "{} {key}: got {} want {}",
                    dir.file_name().unwrap().to_string_lossy(),
                    got.get(key).map_or("absent".into(), |v| v.to_string()),
                    want.get(key).map_or("absent".into(), |v| v.to_string())
                ));
            }
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} differences from SWT-bench:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}

#[test]
fn a_case_missing_its_pred_pre_log_is_an_error_as_in_swt_bench() {
    let Some(root) = shared_data("swt-parity") else {
        return;
    };
    let src = &cases(&root)[0];
    let dir = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(src).unwrap().flatten() {
        if f.file_name() != "pred_pre.log" {
            std::fs::copy(f.path(), dir.path().join(f.file_name())).unwrap();
        }
    }
    let out = Command::new(bin())
        .args(["grade", "--json"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let line: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        line["error"].as_str().unwrap().contains("pred_pre"),
        "{line}"
    );
}
