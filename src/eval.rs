//! `reprobench eval`: evaluate predictions (or the gold test patches) on an SWT dataset over the
//! cluster, with SWT-bench semantics, and write SWT-bench-style reports.

use crate::client::{Finished, Interrupted, run_local, submit_and_wait};
use crate::local::LocalNodes;
use crate::{NodeOptions, Target, datasets, swt_report};
use anyhow::{Result, anyhow, bail};
use clap::Args;
use reprobench_coordinator::sweep::{Attachments, dataset_key, predictions_key};
use reprobench_domain::grading::{GradingSettings, Rules};
use reprobench_domain::kind::SlotSpec;
use reprobench_domain::registry::{self, ExecutorKind, Track};
use reprobench_domain::sweep::{AgentSpec, EvalSettings, SweepSpec};
use reprobench_domain::swt::{self, Prediction, RowError};
use reprobench_proto::v1::SubmitRunRequest;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Options of `reprobench eval`.
#[derive(Args)]
pub struct EvalArgs {
    /// Dataset: a name (swt-mini, swt-lite, swt-verified), a dataset directory, or a JSON/JSONL rows file.
    #[arg(long, value_name = "NAME|PATH")]
    dataset: String,
    /// Environment map (repo → version → spec) for a rows file whose rows carry no inline `env`.
    #[arg(long, value_name = "FILE")]
    env: Option<PathBuf>,
    /// Predictions (SWT-bench JSONL/JSON: instance_id, model_name_or_path, model_patch), or `gold`, or `issue-snippet`.
    #[arg(long, value_name = "FILE|gold|issue-snippet")]
    predictions: String,
    /// Agent name in the results [default: the predictions' model_name_or_path with `/` as `__`, or gold/issue-snippet].
    #[arg(long, value_name = "NAME")]
    agent: Option<String>,
    /// Evaluate only these instances (repeatable).
    #[arg(long = "instance-id", value_name = "ID")]
    instance_ids: Vec<String>,
    /// Evaluate only the instances of these repositories (`owner/name` or `name`; repeatable or comma-separated).
    #[arg(
        long = "repo",
        id = "only_repos",
        value_name = "REPO",
        value_delimiter = ','
    )]
    only_repos: Vec<String>,
    /// Executor: docker, or process (a checkout and a virtualenv) [default: docker when the engine and the base image are there].
    #[arg(long, value_name = "KIND")]
    executor: Option<String>,
    /// Seconds per execution before its process tree is killed.
    #[arg(long, default_value_t = 1800)]
    timeout_s: u64,
    /// Version of SWT-bench's rules: swt-bench-2025-09 (its code today), or swt-bench-2024 (before
    /// its commit 0816600 of 2025-09-11; the rules of results published before it).
    #[arg(long, value_name = "RULES", default_value_t = Rules::default())]
    rules: Rules,
    /// Let reprobench's suspicious findings change verdicts: passes of a run that exited non-zero
    /// count as failures, and any other finding leaves the instance unresolved.
    #[arg(long)]
    strict: bool,
    /// Run the tests without SWT-bench's line tracing: faster, but no coverage figures (and the
    /// test command runs untraced, unlike SWT-bench's own runs).
    #[arg(long)]
    no_coverage: bool,
    /// Resolve packages without a pin as of this day or instant (`2025-02-28`, or ISO 8601 with a
    /// zone), through pip's --uploaded-prior-to (pip 26, Python 3.9+), or `latest` for today's
    /// [default: the environment spec's; SWT-bench's specs: 2025-02-28, the day they last changed;
    /// their conda packages for a Python older than 3.9: that Python's end of life, resolved on
    /// the host; `latest` drops both].
    #[arg(long, value_name = "DATE|latest", value_parser = parse_packages_as_of)]
    packages_as_of: Option<AsOf>,
    /// Start an embedded coordinator and N node processes on this machine.
    #[arg(long, value_name = "N", conflicts_with = "coordinator")]
    local_nodes: Option<u32>,
    /// Slots of each local node.
    #[arg(long, default_value_t = 2)]
    slots_per_node: u32,
    #[command(flatten)]
    node: NodeOptions,
    #[command(flatten)]
    target: Target,
    /// Datasets directory [default: ./datasets].
    #[arg(long, value_name = "DIR")]
    datasets: Option<PathBuf>,
    /// Where reports go [default: DATA/reports/RUN].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Print one JSON object with the totals.
    #[arg(long)]
    json: bool,
    /// Draw the progress bars on stderr even with --json (on a terminal only).
    #[arg(long)]
    progress: bool,
    /// Evaluate anew even if this exact evaluation ran before (default: reuse or resume it).
    #[arg(long)]
    new: bool,
}

/// `--packages-as-of`: a date cap, or none.
#[derive(Debug, Clone, PartialEq)]
enum AsOf {
    /// pip's `--uploaded-prior-to` value.
    Date(String),
    /// No cap: today's packages.
    Latest,
}

/// `latest`, `YYYY-MM-DD` (midnight UTC) or `YYYY-MM-DDTHH:MM:SS` with `Z` or an offset.
fn parse_packages_as_of(s: &str) -> Result<AsOf, String> {
    if s == "latest" {
        return Ok(AsOf::Latest);
    }
    let bad = || {
        format!(
            "`{s}` is not a date: give YYYY-MM-DD (midnight UTC), an ISO 8601 instant with its zone (2025-02-28T12:00:00Z), or `latest`"
        )
    };
    let date_ok = |d: &str| {
        let p: Vec<&str> = d.split('-').collect();
        p.len() == 3
            && [4, 2, 2]
                .iter()
                .zip(&p)
                .all(|(n, x)| x.len() == *n && x.bytes().all(|b| b.is_ascii_digit()))
    };
    match s.split_once('T') {
        None if date_ok(s) => Ok(AsOf::Date(format!("{s}T00:00:00Z"))),
        Some((d, t))
            if date_ok(d)
                && (t.ends_with('Z') || t.contains('+') || t.matches('-').count() == 1)
                && t.starts_with(|c: char| c.is_ascii_digit()) =>
        {
            Ok(AsOf::Date(s.to_string()))
        }
        _ => Err(bad()),
    }
}

/// The executor to use when none is named: docker if the engine and base image are there.
pub async fn auto_executor(node: &NodeOptions, quiet: bool) -> ExecutorKind {
    match docker_unready(node).await {
        None => ExecutorKind::Docker,
        Some(why) => {
            if !quiet {
                eprintln!(
                    "using the process executor (a checkout and a virtualenv per environment): {why}"
                );
            }
            ExecutorKind::Process
        }
    }
}

/// The SWT executor `--executor NAME` names.
pub fn swt_executor(name: &str) -> Result<ExecutorKind> {
    match ExecutorKind::parse(name) {
        Some(kind @ (ExecutorKind::Docker | ExecutorKind::Process)) => Ok(kind),
        _ => bail!("--executor {name}: use docker or process"),
    }
}

/// Why the docker executor cannot run here (no engine, no base image), or `None` when it can.
pub async fn docker_unready(node: &NodeOptions) -> Option<String> {
    let cfg = node.settings().docker;
    let stage = reprobench_sandbox::StageAheadMode::default();
    match reprobench_sandbox::docker::DockerSandbox::connect(cfg, stage).await {
        Ok(sb) => sb.base_python().await.err().map(|e| e.to_string()),
        Err(e) => Some(e.to_string()),
    }
}

/// Writes `INSTANCE/report.json` per result (with the six logs and `case.json` beside it),
/// `summary.json` and `results.jsonl`.
fn write_reports(dir: &Path, done: &Finished, summary: &serde_json::Value) -> Result<()> {
    let one_cell = swt_report::one_cell(&done.rows);
    for r in &done.rows {
        let mut report: serde_json::Value =
            serde_json::from_str(&r.details_json).unwrap_or_else(|_| serde_json::json!({}));
        // An instance that errored before it was graded has no details: it still says which.
        if report.get("instance_id").is_none() {
            report["instance_id"] = r.instance_id.clone().into();
        }
        report["verdict"] = r.verdict.clone().into();
        if let Some(c) = &r.error_class {
            report["error_class"] = c.clone().into();
        }
        if let Some(m) = &r.error_message {
            report["message"] = m.clone().into();
        }
        let artifacts = (!r.artifact_path.is_empty()).then(|| Path::new(&r.artifact_path));
        swt_report::write_instance_report(
            &dir.join(swt_report::report_dir_name(r, one_cell)),
            &report,
            artifacts,
        )?;
    }
    swt_report::write_summary_files(dir, &done.rows, summary)
}

/// Reads a predictions file: usable predictions for known instances, and problems with the rest.
fn load_predictions(
    path: &Path,
    known: &BTreeSet<String>,
) -> Result<(Vec<Prediction>, Vec<RowError>)> {
    let parsed: swt::Parsed<Prediction> = swt::load_rows(path)?;
    let mut problems = parsed.errors;
    let mut keep = Vec::new();
    let mut seen = BTreeSet::new();
    for p in parsed.rows {
        if !known.contains(&p.instance_id) {
            problems.push(RowError {
                location: path.display().to_string(),
                instance_id: Some(p.instance_id.clone()),
                message: "unknown instance id for this dataset; check the dataset name or the id"
                    .into(),
            });
        } else if !seen.insert(p.instance_id.clone()) {
            problems.push(RowError {
                location: path.display().to_string(),
                instance_id: Some(p.instance_id.clone()),
                message: "a second prediction for this instance; the first is used".into(),
            });
        } else {
            keep.push(p);
        }
    }
    Ok((keep, problems))
}

/// `reprobench eval`.
pub async fn eval(a: EvalArgs) -> Result<ExitCode> {
    let datasets_dir = a.datasets.clone().unwrap_or_else(swt::default_datasets_dir);
    let mut ds = datasets::load(&a.dataset, &datasets_dir, Path::new("."), a.env.as_deref())?;
    let mut problems = std::mem::take(&mut ds.errors);
    select_instances(&a, &mut ds, &mut problems)?;
    let total = ds.instances.len()
        + problems
            .iter()
            .filter(|p| p.location != "--instance-id")
            .count();
    let known: BTreeSet<String> = ds.instances.iter().map(|i| i.instance_id.clone()).collect();
    let mut attachments = Attachments::new();
    let agent = eval_agent(&a, &known, &mut attachments, &mut problems)?;
    if ds.instances.is_empty() {
        datasets::print_row_errors(&problems);
        bail!("no usable instance to evaluate in `{}`", ds.name);
    }
    datasets::print_row_errors(&problems);
    let executor = match &a.executor {
        Some(name) => swt_executor(name)?,
        None => auto_executor(&a.node, a.json).await,
    };
    attachments.insert(dataset_key(&ds.name), datasets::rows_jsonl(&ds));
    let spec = SweepSpec {
        name: format!("eval-{}-{}", ds.name, agent.name),
        datasets: vec![ds.name.clone()],
        repeats: 1,
        seed: 0,
        max_attempts: 3,
        agents: vec![agent],
        backbones: vec![],
        budget: Default::default(),
        eval: EvalSettings {
            executor,
            timeout_s: a.timeout_s,
            rules: a.rules,
            strict: a.strict,
            coverage: !a.no_coverage,
            ..EvalSettings::default()
        },
    };
    let req = SubmitRunRequest {
        sweep_toml: spec.to_toml(),
        resume_existing: !a.new,
        attachments: attachments.into_iter().collect(),
        reuse_finished: !a.new,
    };
    let data = a
        .target
        .data
        .clone()
        .unwrap_or_else(|| PathBuf::from(crate::DEFAULT_DATA));
    let done = if let Some(n) = a.local_nodes {
        let settings = a.node.settings();
        datasets::ensure_mirrors(&ds, &settings.repos)?;
        let nodes = LocalNodes {
            count: n,
            slots: vec![SlotSpec {
                kind: executor,
                slots: a.slots_per_node,
            }],
            args: a.node.node_args(),
        };
        run_local(&data, &nodes, req, a.json && !a.progress).await?
    } else {
        let address = crate::client::address_of(&a.target)?;
        submit_and_wait(&address, req, a.json && !a.progress)
            .await
            .map_err(|e| match e.downcast::<Interrupted>() {
                Ok(i) => anyhow!("{i}; it goes on in the coordinator"),
                Err(e) => e,
            })?
    };
    let grading = GradingSettings {
        rules: a.rules,
        strict: a.strict,
        coverage: !a.no_coverage,
    };
    let summary = swt_report::summary(&done.rows, total, &problems, grading);
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| data.join("reports").join(&done.summary.run_id));
    write_reports(&out, &done, &summary)?;
    print_eval(&a, &spec, &ds.name, executor, total, &done, &summary, &out);
    Ok(ExitCode::SUCCESS)
}

/// Keeps the instances `--instance-id` and `--repo` name (an id the dataset lacks is a row
/// problem; a repository it lacks, an error naming the ones it has), and applies
/// `--packages-as-of`.
fn select_instances(
    a: &EvalArgs,
    ds: &mut swt::LoadedDataset,
    problems: &mut Vec<RowError>,
) -> Result<()> {
    if !a.instance_ids.is_empty() {
        let wanted: BTreeSet<&str> = a.instance_ids.iter().map(String::as_str).collect();
        let have: BTreeSet<&str> = ds
            .instances
            .iter()
            .map(|i| i.instance_id.as_str())
            .collect();
        for missing in wanted.difference(&have) {
            problems.push(RowError {
                location: "--instance-id".into(),
                instance_id: Some(missing.to_string()),
                message: format!("not in dataset `{}`", ds.name),
            });
        }
        ds.instances
            .retain(|i| wanted.contains(i.instance_id.as_str()));
    }
    if !a.only_repos.is_empty() {
        let wanted = |repo: &str| {
            a.only_repos
                .iter()
                .any(|r| r == repo || repo.rsplit('/').next() == Some(r.as_str()))
        };
        let have: BTreeSet<String> = ds.instances.iter().map(|i| i.repo.clone()).collect();
        if !have.iter().any(|r| wanted(r)) {
            bail!(
                "--repo {}: no instance of dataset `{}` is of that repository; it has {}",
                a.only_repos.join(","),
                ds.name,
                have.into_iter().collect::<Vec<_>>().join(", ")
            );
        }
        ds.instances.retain(|i| wanted(&i.repo));
        // Rows that did not load have no repository; SWE-bench ids begin with `owner__name-`.
        problems.retain(|p| {
            p.instance_id.as_deref().is_none_or(|id| {
                id.rsplit_once('-')
                    .is_none_or(|(prefix, _)| wanted(&prefix.replacen("__", "/", 1)))
            })
        });
    }
    if let Some(as_of) = &a.packages_as_of {
        for env in ds.instances.iter_mut().filter_map(|i| i.env.as_mut()) {
            env.packages_as_of = match as_of {
                AsOf::Date(d) => Some(d.clone()),
                AsOf::Latest => None,
            };
            if matches!(as_of, AsOf::Latest) {
                env.conda_packages_as_of = None;
            }
        }
    }
    Ok(())
}

/// The agent to evaluate: a built-in one that needs no backbone (`gold`, `issue-snippet`) or a
/// predictions file, whose rows are attached (malformed lines become row problems; predictions
/// for unknown or repeated ids are only reported).
fn eval_agent(
    a: &EvalArgs,
    known: &BTreeSet<String>,
    attachments: &mut Attachments,
    problems: &mut Vec<RowError>,
) -> Result<AgentSpec> {
    Ok(match a.predictions.as_str() {
        // The built-in agents that need no backbone (gold, issue-snippet).
        name if registry::agent(Track::Swt, name).is_some_and(|a| !a.calls_llm) => AgentSpec {
            name: a.agent.clone().unwrap_or(a.predictions.clone()),
            variants: vec!["full".into()],
            predictions: None,
            command: None,
            image: None,
        },
        file => {
            let path = PathBuf::from(file);
            if !path.is_file() {
                bail!(
                    "predictions file {file} does not exist; pass a JSONL/JSON predictions file, `gold` or `issue-snippet`"
                );
            }
            let (preds, bad) = load_predictions(&path, known)?;
            // Malformed lines count as errors; predictions for unknown or repeated ids are only reported.
            let (lines, ids): (Vec<RowError>, Vec<RowError>) =
                bad.into_iter().partition(|b| b.instance_id.is_none());
            for e in &ids {
                eprintln!("ignored: {e}");
            }
            problems.extend(lines);
            let model = a
                .agent
                .clone()
                .or_else(|| {
                    preds
                        .iter()
                        .map(|p| p.model_name_or_path.clone())
                        .find(|m| !m.is_empty())
                        // The agent name is a directory name; SWT-bench names the model's log
                        // directory the same way.
                        .map(|m| m.replace('/', "__"))
                })
                .unwrap_or_else(|| "predictions".into());
            let text: String = preds
                .iter()
                .map(|p| serde_json::to_string(p).expect("serializes") + "\n")
                .collect();
            attachments.insert(predictions_key(file), text);
            AgentSpec {
                name: model,
                variants: vec!["full".into()],
                predictions: Some(file.to_string()),
                command: None,
                image: None,
            }
        }
    })
}

/// Prints an evaluation's figures: one JSON object, or a table.
#[allow(clippy::too_many_arguments)]
fn print_eval(
    a: &EvalArgs,
    spec: &SweepSpec,
    dataset: &str,
    executor: ExecutorKind,
    total: usize,
    done: &Finished,
    summary: &serde_json::Value,
    out: &Path,
) {
    let n = |k: &str| summary[k].as_u64().unwrap_or(0);
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "run_id": done.summary.run_id,
                "dataset": dataset,
                "executor": executor,
                "total": total,
                "completed": n("completed_instances"),
                "resolved": n("resolved_instances"),
                "applicable": n("applicable_instances"),
                "f2p": n("f2p_instances"),
                "f2x": n("f2x_instances"),
                "p2p": n("p2p_instances"),
                "errors": n("error_instances"),
                "suspicious": n("suspicious_instances"),
                "mean_coverage": summary["Mean coverage"],
                "mean_coverage_delta": summary["Mean coverage delta"],
                "rules": a.rules.name(),
                "strict": a.strict,
                "resumed": done.resumed,
                "wall_s": done.elapsed.as_secs_f64(),
                "reports": out.display().to_string(),
            })
        );
    } else {
        let pct = |k: &str| {
            if total == 0 {
                0.0
            } else {
                100.0 * n(k) as f64 / total as f64
            }
        };
        println!(
            "{} on {} ({} executor, run {}, rules {}{}): {total} instances",
            spec.agents[0].name,
            dataset,
            executor,
            done.summary.run_id,
            a.rules.name(),
            if a.strict { ", strict" } else { "" }
        );
        for (label, key) in [
            ("resolved (S)", "resolved_instances"),
            ("applicable (W)", "applicable_instances"),
            ("F→X", "f2x_instances"),
            ("F→P", "f2p_instances"),
            ("P→P", "p2p_instances"),
            ("errors", "error_instances"),
            ("suspicious", "suspicious_instances"),
        ] {
            println!("  {label:<15} {:>5}  {:>6.2}%", n(key), pct(key));
        }
        if !a.no_coverage {
            let share = |k: &str| 100.0 * summary[k].as_f64().unwrap_or(0.0);
            println!(
                "  coverage        mean {:.2}%, mean delta {:.2}% (SWT-bench's, over the graded instances)",
                share("Mean coverage"),
                share("Mean coverage delta")
            );
        }
        println!("reports: {}", out.display());
    }
    if let Some(hint) = rerun_hint(done.resumed, n("error_instances")) {
        eprintln!("{hint}");
    }
}

/// What to do about instances that errored in a run this evaluation reused or resumed rather
/// than ran anew (an engine that failed then is not retried by running the same command again).
fn rerun_hint(resumed: bool, errors: u64) -> Option<String> {
    (resumed && errors > 0).then(|| {
        format!(
            "{errors} instance(s) errored in this evaluation's earlier run, which was reused: each \
             report's `message` says why; once that is mended, pass --new to evaluate again \
             (executions already run and cached, gold and base, are not run again)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_of_a_reused_run_say_how_to_evaluate_again() {
        let hint = rerun_hint(true, 3).unwrap();
        assert!(hint.starts_with("3 instance(s) errored") && hint.contains("--new"));
        // A run made now, or one without errors, needs no such word.
        assert_eq!(rerun_hint(false, 3), None);
        assert_eq!(rerun_hint(true, 0), None);
    }

    #[test]
    fn packages_as_of_reads_days_instants_and_latest() {
        let date = |s: &str| parse_packages_as_of(s);
        assert_eq!(date("latest"), Ok(AsOf::Latest));
        assert_eq!(
            date("2025-02-28"),
            Ok(AsOf::Date("2025-02-28T00:00:00Z".into()))
        );
        for instant in [
            "2025-02-28T12:30:00Z",
            "2025-02-28T12:30:00+02:00",
            "2025-02-28T12:30:00-05:00",
        ] {
            assert_eq!(date(instant), Ok(AsOf::Date(instant.into())));
        }
        for bad in [
            "",
            "yesterday",
            "2025-2-28",
            "28-02-2025",
            "2025-02-28T12:30:00",
            "2025-02-28Tnoon",
        ] {
            let e = date(bad).unwrap_err();
            assert!(e.contains("YYYY-MM-DD") && e.contains(bad), "{bad}: {e}");
        }
    }
}
