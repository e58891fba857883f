//! SWT-bench's evaluation outputs, shared by `eval` and `grade --run`: `summary.json` (its run
//! summary, with reprobench's extra counts), `results.jsonl`, and one report directory per
//! result holding `report.json` beside the six logs.

use anyhow::{Context, Result};
use reprobench_domain::grading::GradingSettings;
use reprobench_domain::results::ResultRow;
use reprobench_domain::swt::RowError;
use reprobench_swt::grading::RUNS;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// SWT-bench's run summary, plus F→P, F→X, P→P, applicability and suspicious counts and the
/// rules that graded it.
pub fn summary(
    rows: &[reprobench_domain::results::ResultRow],
    total: usize,
    unusable: &[RowError],
    grading: GradingSettings,
) -> serde_json::Value {
    let mut ids: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    let mut coverage = Vec::new();
    for r in rows {
        let d: serde_json::Value = serde_json::from_str(&r.details_json).unwrap_or_default();
        if r.error_class.is_none() {
            coverage.push(reprobench_swt::grading::coverage::CoverageFigures {
                coverage_pred: d["coverage_pred"].as_f64(),
                coverage_delta_pred: d["coverage_delta_pred"].as_f64(),
                ..Default::default()
            });
        }
        let id = r.instance_id.clone();
        if r.error_class.is_some() {
            ids.entry("error_ids").or_default().push(id);
            continue;
        }
        ids.entry("completed_ids").or_default().push(id.clone());
        ids.entry(if r.success {
            "resolved_ids"
        } else {
            "unresolved_ids"
        })
        .or_default()
        .push(id);
        for key in ["applicable", "f2p", "f2x", "p2p"] {
            if d[key] == true {
                *counts.entry(key).or_default() += 1;
            }
        }
        if d["suspicious"].as_array().is_some_and(|s| !s.is_empty()) {
            ids.entry("suspicious_ids")
                .or_default()
                .push(r.instance_id.clone());
        }
    }
    for e in unusable {
        ids.entry("error_ids")
            .or_default()
            .push(e.instance_id.clone().unwrap_or_else(|| e.location.clone()));
    }
    let n = |k: &str| ids.get(k).map_or(0, Vec::len);
    let list = |k: &str| serde_json::json!(ids.get(k).cloned().unwrap_or_default());
    let (mean_coverage, mean_coverage_delta) = reprobench_swt::grading::coverage::means(&coverage);
    serde_json::json!({
        "total_instances": total,
        "completed_instances": n("completed_ids"),
        "resolved_instances": n("resolved_ids"),
        "unresolved_instances": n("unresolved_ids"),
        "error_instances": n("error_ids"),
        "applicable_instances": counts.get("applicable").copied().unwrap_or(0),
        "f2p_instances": counts.get("f2p").copied().unwrap_or(0),
        "f2x_instances": counts.get("f2x").copied().unwrap_or(0),
        "p2p_instances": counts.get("p2p").copied().unwrap_or(0),
        "suspicious_instances": n("suspicious_ids"),
        "Mean coverage": mean_coverage,
        "Mean coverage delta": mean_coverage_delta,
        "rules": grading.rules.name(),
        "strict": grading.strict,
        "completed_ids": list("completed_ids"),
        "resolved_ids": list("resolved_ids"),
        "unresolved_ids": list("unresolved_ids"),
        "error_ids": list("error_ids"),
        "suspicious_ids": list("suspicious_ids"),
    })
}

/// Writes `results.jsonl` and `summary.json` into `dir`.
pub fn write_summary_files(
    dir: &Path,
    rows: &[reprobench_domain::results::ResultRow],
    summary: &serde_json::Value,
) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut jsonl = String::new();
    for r in rows {
        jsonl.push_str(&serde_json::to_string(r)?);
        jsonl.push('\n');
    }
    std::fs::write(dir.join("results.jsonl"), jsonl)?;
    std::fs::write(
        dir.join("summary.json"),
        serde_json::to_vec_pretty(summary)?,
    )?;
    Ok(())
}

/// The report directory of a row: the instance id, or with several cells per instance
/// `AGENT.VARIANT.BACKBONE.rREPEAT/INSTANCE`.
pub fn report_dir_name(r: &ResultRow, one_cell: bool) -> PathBuf {
    if one_cell {
        PathBuf::from(&r.instance_id)
    } else {
        let backbone = if r.backbone.is_empty() {
            "-"
        } else {
            &r.backbone
        };
        PathBuf::from(format!(
            "{}.{}.{}.r{}",
            r.agent, r.variant, backbone, r.repeat
        ))
        .join(&r.instance_id)
    }
}

/// Whether every row of a run is the same (agent, variant, backbone, repeat) cell.
pub fn one_cell(rows: &[ResultRow]) -> bool {
    let cells: BTreeSet<(&str, &str, &str, u32)> = rows
        .iter()
        .map(|r| {
            (
                r.agent.as_str(),
                r.variant.as_str(),
                r.backbone.as_str(),
                r.repeat,
            )
        })
        .collect();
    cells.len() <= 1
}

/// Writes one instance's `report.json`, and beside it the six logs and `case.json` of its grade
/// directory `logs_from` when that is on this machine (hard links where possible).
pub fn write_instance_report(
    dir: &Path,
    report: &serde_json::Value,
    logs_from: Option<&Path>,
) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut report = report.clone();
    if let Some(src) = logs_from.filter(|s| s.join("case.json").is_file() && *s != dir) {
        let names = RUNS
            .iter()
            .map(|r| format!("{r}.log"))
            .chain(["case.json".to_string()]);
        for name in names {
            let (from, to) = (src.join(&name), dir.join(&name));
            let _ = std::fs::remove_file(&to);
            if from.is_file() && std::fs::hard_link(&from, &to).is_err() {
                std::fs::copy(&from, &to).with_context(|| {
                    format!("cannot copy {} to {}", from.display(), to.display())
                })?;
            }
        }
    } else if let Some(src) = logs_from
        && !src.join("case.json").is_file()
    {
        report["logs_at"] = src.display().to_string().into();
    }
    std::fs::write(dir.join("report.json"), serde_json::to_vec_pretty(&report)?)
        .with_context(|| format!("cannot write {}", dir.join("report.json").display()))?;
    Ok(())
}
