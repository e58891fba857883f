//! `reprobench grade`: SWT-bench's verdict from six execution logs, with no execution — for
//! grade directories (SWT-bench's own logs or reprobench's), or for a finished run regraded from
//! the logs it kept, with today's parsers and rules.

use crate::swt_report::{self, one_cell, report_dir_name, write_instance_report};
use anyhow::{Result, bail};
use clap::Args;
use reprobench_agent_node::swt_executor::{put_coverage, put_grade};
use reprobench_coordinator::store::Store;
use reprobench_domain::grading::GradingSettings;
use reprobench_domain::results::ResultRow;
use reprobench_swt::case::{self, CaseError};
use reprobench_swt::grading::{InstanceGrade, Rules};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;

/// Options of `reprobench grade`.
#[derive(Args)]
pub struct GradeArgs {
    /// Grade directories, each holding pred_pre.log pred_post.log gold_pre.log gold_post.log
    /// base_pre.log base_post.log and a case.json ({"parser", "repo", "exit_codes"}); every
    /// reprobench report directory is one.
    #[arg(
        value_name = "DIR",
        required_unless_present = "run",
        conflicts_with = "run"
    )]
    dirs: Vec<PathBuf>,
    /// Regrade a finished run from the logs it kept (nothing is executed again); the new reports
    /// go beside the old ones, in DATA/reports/RUN/regraded-RULES.
    #[arg(long, value_name = "RUN")]
    run: Option<String>,
    /// Data directory holding the run (with --run).
    #[arg(long, value_name = "DIR", default_value = crate::DEFAULT_DATA)]
    data: PathBuf,
    /// Version of SWT-bench's rules: swt-bench-2025-09 (its code today), or swt-bench-2024 (before
    /// its commit 0816600 of 2025-09-11; the rules of results published before it).
    #[arg(long, value_name = "RULES", default_value_t = Rules::default())]
    rules: Rules,
    /// Let reprobench's suspicious findings change the verdict: passes of a run that exited
    /// non-zero count as failures, and any other finding leaves the instance unresolved.
    #[arg(long)]
    strict: bool,
    /// One JSON object per directory (with --run: one summary object).
    #[arg(long)]
    json: bool,
    /// Where the regraded reports go (with --run) [default: DATA/reports/RUN/regraded-RULES].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

/// `reprobench grade`.
pub fn grade(a: GradeArgs) -> Result<ExitCode> {
    match &a.run {
        Some(run) => regrade_run(&a, run),
        None => Ok(grade_dirs(&a.dirs, a.rules, a.strict, a.json)),
    }
}

/// The verdict in a few words.
fn headline(g: &InstanceGrade) -> String {
    let yes = |b: bool| if b { "yes" } else { "no" };
    let verdict = if !g.patch_applied {
        "patch not applied"
    } else if g.resolved {
        "resolved"
    } else {
        "unresolved"
    };
    let n = |t: &Option<reprobench_swt::grading::Categories>| t.as_ref().map_or(0, |t| t.len());
    let mut line = format!(
        "{verdict}  W {}  F→X {}  F→P {}  P→P {}  tests pred {} gold {} base {}",
        yes(g.applicable),
        yes(g.f2x),
        yes(g.f2p),
        yes(g.p2p),
        n(&g.tests_pred),
        n(&g.tests_gold),
        n(&g.tests_base)
    );
    if !g.suspicious.is_empty() {
        let kinds: BTreeSet<String> = g
            .suspicious
            .iter()
            .map(|s| format!("{} ({})", s.kind, s.run.as_deref().unwrap_or("-")))
            .collect();
        line.push_str(&format!(
            "  suspicious: {}",
            kinds.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
    if g.strict_changed {
        line.push_str("  [strict changed the verdict]");
    }
    line
}

fn grade_dirs(dirs: &[PathBuf], rules: Rules, strict: bool, json: bool) -> ExitCode {
    let mut failed = 0;
    for dir in dirs {
        match case::grade_dir(dir, rules, strict) {
            Ok(g) => {
                let coverage = case::coverage_of(dir, g.patch_applied);
                if json {
                    let mut v = serde_json::to_value(&g).expect("a grade serializes");
                    if let Some(c) = &coverage {
                        put_coverage(&mut v, c);
                    }
                    v["dir"] = dir.display().to_string().into();
                    println!("{v}");
                } else {
                    let mut line = headline(&g);
                    if let Some(c) =
                        coverage.and_then(|c| c.coverage_pred.zip(c.coverage_delta_pred))
                    {
                        line.push_str(&format!(
                            "  coverage {:.1}% Δ {:.1}%",
                            c.0 * 100.0,
                            c.1 * 100.0
                        ));
                    }
                    println!("{}: {line}", dir.display());
                }
            }
            Err(e) => {
                failed += 1;
                if json {
                    println!(
                        "{}",
                        serde_json::json!({"dir": dir.display().to_string(), "error": e.to_string()})
                    );
                }
                eprintln!("error: {e}");
            }
        }
    }
    if failed > 0 {
        eprintln!("{failed} of {} directories could not be graded", dirs.len());
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn regrade_run(a: &GradeArgs, run: &str) -> Result<ExitCode> {
    let store = Store::open_read_only(&a.data)?;
    crate::client::ensure_run(&store, run, &a.data)?;
    let mut rows: Vec<ResultRow> = store.results(run)?;
    rows.retain(|r| r.track == "swt");
    if rows.is_empty() {
        bail!("run `{run}` has no finished SWT result to regrade");
    }
    let old_reports = a.data.join("reports").join(run);
    let suffix = if a.strict { "-strict" } else { "" };
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| old_reports.join(format!("regraded-{}{suffix}", a.rules.name())));
    let single = one_cell(&rows);
    let (mut regraded, mut not_regradable, mut ungraded) = (0usize, Vec::new(), Vec::new());
    let mut changed: Vec<(String, bool, bool)> = Vec::new();
    for r in &mut rows {
        // The node's attempt directory, or the copy beside the old report if that is gone.
        let beside_report = old_reports.join(report_dir_name(r, single));
        let grade_dir = Some(PathBuf::from(&r.artifact_path))
            .filter(|d| d.join("case.json").is_file())
            .unwrap_or(beside_report);
        let mut report: serde_json::Value =
            serde_json::from_str(&r.details_json).unwrap_or_else(|_| serde_json::json!({}));
        report["verdict"] = r.verdict.clone().into();
        if grade_dir.join("case.json").is_file() {
            match case::grade_dir(&grade_dir, a.rules, a.strict) {
                Ok(g) => {
                    regraded += 1;
                    if g.resolved != r.success {
                        changed.push((r.instance_id.clone(), r.success, g.resolved));
                    }
                    put_grade(&mut report, &g);
                    if let Some(c) = case::coverage_of(&grade_dir, g.patch_applied) {
                        put_coverage(&mut report, &c);
                    }
                    r.success = g.resolved;
                    r.verdict = if g.resolved { "resolved" } else { "unresolved" }.into();
                    r.rules = Some(a.rules.name().into());
                    report["verdict"] = r.verdict.clone().into();
                    report["regraded"] = true.into();
                }
                Err(CaseError::NotGraded { why, .. }) => {
                    ungraded.push(format!("{}: {why}", r.instance_id));
                }
                Err(e) => return Err(e.into()),
            }
        } else if r.error_class.is_none() {
            not_regradable.push(r.instance_id.clone());
        }
        if let Some(c) = &r.error_class {
            report["error_class"] = c.clone().into();
        }
        if let Some(m) = &r.error_message {
            report["message"] = m.clone().into();
        }
        r.details_json = report.to_string();
        write_instance_report(
            &out.join(report_dir_name(r, single)),
            &report,
            Some(&grade_dir),
        )?;
    }
    let total = std::fs::read(old_reports.join("summary.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v["total_instances"].as_u64())
        .map_or(rows.len(), |n| n as usize);
    let grading = GradingSettings {
        rules: a.rules,
        strict: a.strict,
        coverage: true,
    };
    let mut summary = swt_report::summary(&rows, total, &[], grading);
    summary["regraded_instances"] = regraded.into();
    summary["not_regradable_ids"] = serde_json::json!(not_regradable);
    swt_report::write_summary_files(&out, &rows, &summary)?;
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "run_id": run,
                "rules": a.rules.name(),
                "strict": a.strict,
                "regraded": regraded,
                "resolved": summary["resolved_instances"],
                "suspicious": summary["suspicious_instances"],
                "changed": changed.iter().map(|(id, was, now)| serde_json::json!({"instance_id": id, "was": was, "now": now})).collect::<Vec<_>>(),
                "not_regradable": not_regradable,
                "reports": out.display().to_string(),
            })
        );
    } else {
        println!(
            "run {run} regraded under {}{}: {regraded} instances, {} resolved, {} suspicious",
            a.rules.name(),
            if a.strict { " (strict)" } else { "" },
            summary["resolved_instances"],
            summary["suspicious_instances"]
        );
        for (id, was, now) in &changed {
            let word = |b: &bool| if *b { "resolved" } else { "unresolved" };
            println!("  {id}: {} → {}", word(was), word(now));
        }
        if changed.is_empty() {
            println!("  no verdict changed");
        }
        println!("reports: {}", out.display());
    }
    for u in &ungraded {
        eprintln!("not graded (kept as it was): {u}");
    }
    if !not_regradable.is_empty() {
        eprintln!(
            "{} instances kept no logs (run made before reprobench kept them beside the reports); their old verdicts were kept: {}",
            not_regradable.len(),
            not_regradable.join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}
