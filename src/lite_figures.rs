//! `bench slice --lite-figures`: SWT-bench Lite as a whole, assembled from the per-instance
//! records committed under `docs/gold-validation/` (runs of `bench slice --all` and earlier gold
//! runs), without running anything: per repository and in total, how many Lite instances have
//! a record, how many resolve with gold, the slot time their executions and environment builds
//! took, and that time per instance and per execution beside SWE-bench's published figure.

use anyhow::{Context, Result};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// SWE-bench's published cost of its Lite evaluation: about 30 minutes on 16 cores with 12
/// workers, environment images cached, one execution per instance, 300 instances.
const SWE_BENCH_LITE: (f64, f64, f64) = (30.0, 16.0, 300.0);
/// Executions of a gold evaluation per instance in records that do not count them (written
/// before `executions_run` was kept, and before the gold twin): SWT-bench's six, prediction,
/// gold and base, each before and after the fix.
const GOLD_EXECUTIONS_UNCOUNTED: f64 = 6.0;

/// One instance's gold record, whichever file it came from.
#[derive(Debug, Clone, PartialEq)]
struct GoldRecord {
    resolved: bool,
    /// It ended in an error (an environment that did not build, say), not a verdict.
    errored: bool,
    /// Slot milliseconds of its executions (those run, not read from a cache).
    executions_ms: f64,
    /// How many executions ran (not read from a cache).
    executions_run: f64,
    /// Milliseconds building or finding its environment, when the record says.
    prepare_ms: Option<f64>,
    /// The tests ran under coverage tracing, when the record says.
    traced: Option<bool>,
}

/// Reads a record line: `bench slice --all`'s (`gold_resolved`, `executions_ms`,
/// `prepare_ms`, `coverage`) or an earlier gold run's (`verdict`, `wall_s`).
fn gold_record(v: &Value) -> Option<(String, GoldRecord)> {
    let id = v["instance_id"].as_str()?.to_string();
    // `bench slice --all`'s records name their executor; an errored one has no verdict.
    let record = if v.get("executor").is_some() {
        GoldRecord {
            resolved: v["gold_resolved"].as_bool() == Some(true),
            errored: v["error_class"].is_string(),
            executions_ms: v["executions_ms"].as_f64().unwrap_or(0.0),
            executions_run: v["executions_run"].as_f64().unwrap_or(
                if v["executions_ms"].as_f64().unwrap_or(0.0) > 0.0 {
                    GOLD_EXECUTIONS_UNCOUNTED
                } else {
                    0.0
                },
            ),
            prepare_ms: v["prepare_ms"].as_f64(),
            traced: v["coverage"].as_bool(),
        }
    } else {
        GoldRecord {
            resolved: v["verdict"].as_str()? == "resolved",
            errored: v["error_class"].is_string(),
            executions_ms: v["wall_s"].as_f64().unwrap_or(0.0) * 1000.0,
            executions_run: GOLD_EXECUTIONS_UNCOUNTED,
            prepare_ms: None,
            traced: None,
        }
    };
    Some((id, record))
}

/// The records of a directory, by instance: `slice-*.jsonl` (the newest format) over any other
/// `*.jsonl`, and within a kind the file read last (names in order) wins.
fn read_records(dir: &Path) -> Result<BTreeMap<String, GoldRecord>> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read the records in {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    // Older formats first, so that `slice-*` records replace them.
    files.sort_by_key(|p| {
        let name = p
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        (name.starts_with("slice-"), name)
    });
    let mut out = BTreeMap::new();
    for file in files {
        let text = std::fs::read_to_string(&file)?;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let v: Value = serde_json::from_str(line)
                .with_context(|| format!("{}: a line is not JSON", file.display()))?;
            if let Some((id, r)) = gold_record(&v) {
                out.insert(id, r);
            }
        }
    }
    Ok(out)
}

/// The figures of the Lite instances (`lite`: id → repository) from their records.
fn figures(lite: &BTreeMap<String, String>, records: &BTreeMap<String, GoldRecord>) -> Value {
    #[derive(Default)]
    struct Sums {
        lite: u32,
        recorded: u32,
        resolved: u32,
        traced: u32,
        executions_ms: f64,
        executions_run: f64,
        prepare_ms: f64,
        missing: Vec<String>,
        unresolved: Vec<String>,
        errored: Vec<String>,
    }
    let mut by_repo: BTreeMap<&str, Sums> = BTreeMap::new();
    for (id, repo) in lite {
        let s = by_repo.entry(repo).or_default();
        s.lite += 1;
        let Some(r) = records.get(id) else {
            s.missing.push(id.clone());
            continue;
        };
        s.recorded += 1;
        s.resolved += u32::from(r.resolved);
        s.traced += u32::from(r.traced == Some(true));
        s.executions_ms += r.executions_ms;
        s.executions_run += r.executions_run;
        s.prepare_ms += r.prepare_ms.unwrap_or(0.0);
        if r.errored {
            s.errored.push(id.clone());
        } else if !r.resolved {
            s.unresolved.push(id.clone());
        }
    }
    let minutes = |ms: f64| (ms / 6e3).round() / 10.0;
    let per = |ms: f64, n: u32| {
        if n == 0 {
            Value::Null
        } else {
            ((ms / 6e4 / f64::from(n) * 100.0).round() / 100.0).into()
        }
    };
    let mut rows = Vec::new();
    let mut total = Sums::default();
    for (repo, s) in &by_repo {
        rows.push(json!({
            "repo": repo,
            "lite": s.lite,
            "recorded": s.recorded,
            "gold_resolved": s.resolved,
            "traced": s.traced,
            "executions_min": minutes(s.executions_ms),
            "environment_build_min": minutes(s.prepare_ms),
            "slot_min_per_instance": per(s.executions_ms + s.prepare_ms, s.recorded),
            "missing": s.missing,
            "unresolved": s.unresolved,
            "errored": s.errored,
        }));
        total.lite += s.lite;
        total.recorded += s.recorded;
        total.resolved += s.resolved;
        total.traced += s.traced;
        total.executions_ms += s.executions_ms;
        total.executions_run += s.executions_run;
        total.prepare_ms += s.prepare_ms;
        total.errored.extend(s.errored.iter().cloned());
    }
    let slot_ms = total.executions_ms + total.prepare_ms;
    let (swe_wall, swe_cores, swe_instances) = SWE_BENCH_LITE;
    let swe_per_instance = swe_wall * swe_cores / swe_instances;
    let ours_per_instance = slot_ms / 6e4 / f64::from(total.recorded.max(1));
    let ours_per_execution = slot_ms / 6e4 / total.executions_run.max(1.0);
    json!({
        "by_repo": rows,
        "lite": total.lite,
        "recorded": total.recorded,
        "gold_resolved": total.resolved,
        "errored": total.errored,
        "traced": total.traced,
        "executions_run": total.executions_run,
        "executions_min": minutes(total.executions_ms),
        "environment_build_min": minutes(total.prepare_ms),
        "slot_min_per_instance": per(slot_ms, total.recorded),
        // The wall time the recorded work would take on N one-slot nodes, perfectly packed: a
        // lower bound (one repository's instances wait for its environments).
        "ideal_wall_min": {
            "1": minutes(slot_ms),
            "2": minutes(slot_ms / 2.0),
        },
        "swe_bench": {
            "core_min_per_instance": swe_per_instance,
            "core_min_per_execution": swe_per_instance,
            "ours_over_swe_bench_per_instance": ours_per_instance / swe_per_instance,
            "ours_over_swe_bench_per_execution": ours_per_execution / swe_per_instance,
        },
    })
}

/// The Lite figures from the records in `records` and the slice's membership and rows.
pub fn run(records: &Path, slice: &Path, json_out: bool) -> Result<()> {
    let membership: Value = serde_json::from_slice(
        &std::fs::read(slice.join("membership.json"))
            .with_context(|| format!("{}: no membership.json", slice.display()))?,
    )?;
    let ids: BTreeSet<&str> = membership["swt_bench_lite"]
        .as_array()
        .context("membership.json has no swt_bench_lite list")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let rows = std::fs::read_to_string(slice.join("rows.jsonl"))
        .with_context(|| format!("{}: no rows.jsonl", slice.display()))?;
    let lite: BTreeMap<String, String> = rows
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|r| {
            let id = r["instance_id"].as_str()?;
            ids.contains(id).then(|| {
                (
                    id.to_string(),
                    r["repo"].as_str().unwrap_or_default().to_string(),
                )
            })
        })
        .collect();
    let v = figures(&lite, &read_records(records)?);
    if json_out {
        println!("{v}");
        return Ok(());
    }
    println!(
        "| repository | Lite | recorded | gold resolved | errored | executions | environment builds | slot-min / instance |\n|---|---|---|---|---|---|---|---|"
    );
    for r in v["by_repo"].as_array().into_iter().flatten() {
        println!(
            "| {} | {} | {} | {} | {} | {} min | {} min | {} |",
            r["repo"].as_str().unwrap_or_default(),
            r["lite"],
            r["recorded"],
            r["gold_resolved"],
            r["errored"].as_array().map_or(0, Vec::len),
            r["executions_min"],
            r["environment_build_min"],
            r["slot_min_per_instance"]
        );
    }
    println!(
        "| all | {} | {} | {} | {} | {} min | {} min | {} |",
        v["lite"],
        v["recorded"],
        v["gold_resolved"],
        v["errored"].as_array().map_or(0, Vec::len),
        v["executions_min"],
        v["environment_build_min"],
        v["slot_min_per_instance"]
    );
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_record_formats_are_read_and_the_newer_wins() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("r-2026-12-01.jsonl"),
            "{\"instance_id\":\"r__r-1\",\"verdict\":\"resolved\",\"wall_s\":60}\n{\"instance_id\":\"r__r-2\",\"verdict\":\"unresolved\",\"wall_s\":30}\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("slice-r.jsonl"),
            "{\"instance_id\":\"r__r-2\",\"executor\":\"process\",\"gold_resolved\":true,\"executions_ms\":90000,\"executions_run\":6,\"prepare_ms\":30000,\"coverage\":true}\n{\"instance_id\":\"r__r-4\",\"executor\":\"process\",\"gold_resolved\":null,\"error_class\":\"bad_input:environment\",\"executions_ms\":0,\"prepare_ms\":5000}\n",
        )
        .unwrap();
        let records = read_records(dir.path()).unwrap();
        assert_eq!(records["r__r-1"].executions_ms, 60_000.0);
        assert_eq!(
            records["r__r-2"],
            GoldRecord {
                resolved: true,
                errored: false,
                executions_ms: 90_000.0,
                executions_run: 6.0,
                prepare_ms: Some(30_000.0),
                traced: Some(true)
            }
        );
        let lite = BTreeMap::from([
            ("r__r-1".to_string(), "r/r".to_string()),
            ("r__r-2".to_string(), "r/r".to_string()),
            ("r__r-3".to_string(), "r/r".to_string()),
            ("r__r-4".to_string(), "r/r".to_string()),
        ]);
        let v = figures(&lite, &records);
        let r = &v["by_repo"][0];
        assert_eq!(
            (r["lite"].as_u64(), r["recorded"].as_u64()),
            (Some(4), Some(3))
        );
        assert_eq!(r["gold_resolved"], 2);
        assert_eq!(r["missing"], json!(["r__r-3"]));
        assert_eq!(
            r["errored"],
            json!(["r__r-4"]),
            "an error is recorded, not resolved"
        );
        // 60 s + 90 s of executions and 30 + 5 s of environments over 3 instances.
        assert_eq!(r["slot_min_per_instance"], 1.03);
        assert_eq!(v["ideal_wall_min"]["2"], 1.5);
        assert_eq!(v["swe_bench"]["core_min_per_instance"], 1.6);
        assert_eq!(v["errored"], json!(["r__r-4"]));
        // r-1 (an older record) counts six executions, r-2 six and r-4 none: 185 s over 12.
        assert_eq!(v["executions_run"], 12.0);
        let per_execution = v["swe_bench"]["ours_over_swe_bench_per_execution"]
            .as_f64()
            .unwrap();
        assert!((per_execution - 185.0 / 60.0 / 12.0 / 1.6).abs() < 1e-9);
    }

    #[test]
    fn a_record_line_that_is_not_json_names_its_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("slice-x.jsonl"), "{not json\n").unwrap();
        let e = read_records(dir.path()).unwrap_err();
        assert!(format!("{e:#}").contains("slice-x.jsonl"), "{e:#}");
    }
}
