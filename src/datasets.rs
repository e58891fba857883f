//! Datasets on the client side: attaching a sweep's datasets and predictions to its submission,
//! and `reprobench datasets list|show|validate|prepare|fetch`.

use anyhow::{Context, Result, bail};
use reprobench_android::github::{self, GITHUB_API_DEFAULT, GITHUB_API_ENV};
use reprobench_coordinator::sweep::{Attachments, dataset_key, predictions_key};
use reprobench_domain::dataset_kind::{DatasetKind, classify, resolve};
use reprobench_domain::sweep::SweepSpec;
use reprobench_domain::swt::{self, LoadedDataset, Prediction, RowError};
use reprobench_swt::grading::Family;
use reprobench_swt::grading::parsers::parser_for;
use reprobench_swt::{mirror, patch};
use std::path::{Path, PathBuf};

/// Reads every non-synthetic dataset and predictions file a sweep names and returns them as
/// attachments, with the rows that could not be used (which are left out, not fatal).
pub fn attach(
    spec: &SweepSpec,
    datasets_dir: &Path,
    base: &Path,
) -> Result<(Attachments, Vec<RowError>)> {
    let mut att = Attachments::new();
    let mut problems = Vec::new();
    for name in &spec.datasets {
        match classify(name, datasets_dir, base) {
            DatasetKind::Synthetic => {}
            DatasetKind::AndroidSim(dir) => {
                att.insert(
                    reprobench_domain::android::android_rows_key(name),
                    android_rows(&dir)?,
                );
            }
            DatasetKind::AndroidReal(dir) => {
                let (rows, errors) = android_manifest_rows(&dir)?;
                problems.extend(errors);
                att.insert(reprobench_domain::android::android_rows_key(name), rows);
            }
            DatasetKind::Swt => {
                let ds = load(name, datasets_dir, base, None)?;
                problems.extend(ds.errors.iter().cloned());
                att.insert(dataset_key(name), rows_jsonl(&ds));
            }
        }
    }
    for agent in &spec.agents {
        if let Some(path) = &agent.predictions {
            let full = resolve(base, path);
            let parsed: swt::Parsed<Prediction> = swt::load_rows(&full)?;
            problems.extend(parsed.errors);
            let text: String = parsed
                .rows
                .iter()
                .map(|p| serde_json::to_string(p).expect("serializes") + "\n")
                .collect();
            att.insert(predictions_key(path), text);
        }
    }
    Ok((att, problems))
}

/// The rows of a real-app android dataset as a sweep attaches them (the node reads the
/// reports and APKs), and the rows that could not be read.
fn android_manifest_rows(dir: &Path) -> Result<(String, Vec<RowError>)> {
    use reprobench_domain::android::{AndroidRow, load_android_dataset};
    let name = dir.display().to_string();
    let ds = load_android_dataset(&name, dir, None)?;
    let rows = ds
        .instances
        .iter()
        .map(|i| {
            let row = AndroidRow {
                instance_id: i.instance_id.clone(),
                app: i.app.clone(),
                bug_type: i.bug_type,
                ground_truth_actions: i.ground_truth_actions,
                real_app: true,
            };
            serde_json::to_string(&row).expect("serializes") + "\n"
        })
        .collect();
    Ok((rows, ds.errors))
}

/// The rows of a simulator dataset as a sweep attaches them.
fn android_rows(dir: &Path) -> Result<String> {
    use reprobench_android::sim::{BugKind, Dataset};
    use reprobench_domain::android::{AndroidRow, BugType};
    let ds = Dataset::load(dir).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
    Ok(ds
        .reports
        .iter()
        .map(|(id, r)| {
            let row = AndroidRow {
                instance_id: id.clone(),
                app: r.app.clone(),
                bug_type: match r.kind {
                    BugKind::Crash => BugType::Crash,
                    BugKind::NonCrash => BugType::NonCrash,
                },
                ground_truth_actions: Some(r.ground_truth.len() as u32),
                real_app: false,
            };
            serde_json::to_string(&row).expect("serializes") + "\n"
        })
        .collect())
}

/// Loads a dataset by name or path (paths relative to `base` too).
pub fn load(
    name_or_path: &str,
    datasets_dir: &Path,
    base: &Path,
    env: Option<&Path>,
) -> Result<LoadedDataset> {
    let candidate = resolve(base, name_or_path);
    let arg = if candidate.exists() {
        candidate.display().to_string()
    } else {
        name_or_path.to_string()
    };
    Ok(swt::load_dataset(&arg, datasets_dir, env)?)
}

/// The usable instances as JSONL, environment inline.
pub fn rows_jsonl(ds: &LoadedDataset) -> String {
    ds.instances
        .iter()
        .map(|i| serde_json::to_string(i).expect("an instance serializes") + "\n")
        .collect()
}

/// Prints each unusable row with where it is and what to do (to stderr).
pub fn print_row_errors(errors: &[RowError]) {
    for e in errors {
        eprintln!("skipped: {e}");
    }
}

/// `datasets list`.
pub fn list(datasets_dir: &Path) -> Result<()> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(datasets_dir)
        .with_context(|| {
            format!(
                "cannot read the datasets directory {}; pass --datasets DIR",
                datasets_dir.display()
            )
        })?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("manifest.json").is_file())
        .collect();
    names.sort();
    println!("{:<16} {:<6} {:>9}  state", "dataset", "track", "instances");
    for dir in names {
        let name = dir
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        match swt::load_dataset(&name, datasets_dir, None) {
            Ok(ds) => {
                let state = if ds.errors.is_empty() {
                    "ready".to_string()
                } else {
                    format!("ready, {} bad rows", ds.errors.len())
                };
                println!(
                    "{:<16} {:<6} {:>9}  {state}",
                    name,
                    "swt",
                    ds.instances.len()
                );
            }
            Err(e) => {
                let expected = std::fs::read_to_string(dir.join("manifest.json"))
                    .ok()
                    .and_then(|t| serde_json::from_str::<swt::Manifest>(&t).ok())
                    .and_then(|m| m.expected_instances)
                    .map_or("-".to_string(), |n| n.to_string());
                let state = if matches!(
                    e,
                    swt::LoadError::NoRows {
                        fetchable: true,
                        ..
                    }
                ) {
                    format!("not fetched (`reprobench datasets fetch {name}`)")
                } else {
                    e.to_string()
                };
                println!("{:<16} {:<6} {:>9}  {state}", name, "swt", expected);
            }
        }
    }
    println!(
        "{:<16} {:<6} {:>9}  generated from the name (synthetic:N:MEAN_MS[:SIGMA])",
        "synthetic:*", "-", "N"
    );
    Ok(())
}

/// `datasets show`.
pub fn show(name: &str, datasets_dir: &Path, env: Option<&Path>) -> Result<()> {
    let ds = load(name, datasets_dir, Path::new("."), env)?;
    println!(
        "dataset {} — {} instances ({} excluded by the manifest, {} unusable rows)",
        ds.name,
        ds.instances.len(),
        ds.excluded,
        ds.errors.len()
    );
    if let Some(m) = &ds.manifest {
        if let Some(src) = &m.source {
            println!("source: {} ({})", src.huggingface_dataset, src.split);
        }
        if let Some(ex) = &m.exclude {
            println!("excluded: {} ids from {}", ex.instance_ids.len(), ex.origin);
        }
    }
    let mut repos: std::collections::BTreeMap<&str, usize> = Default::default();
    for i in &ds.instances {
        *repos.entry(i.repo.as_str()).or_default() += 1;
    }
    println!("\n{:<28} {:>9}", "repo", "instances");
    for (r, n) in repos {
        println!("{r:<28} {n:>9}");
    }
    println!(
        "\n{:<32} {:>5} {:>5}  first line of the issue",
        "instance", "F2P", "P2P"
    );
    for i in &ds.instances {
        let first = i
            .problem_statement
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        let first: String = first.chars().take(60).collect();
        println!(
            "{:<32} {:>5} {:>5}  {first}",
            i.instance_id,
            i.fail_to_pass.len(),
            i.pass_to_pass.len()
        );
    }
    print_row_errors(&ds.errors);
    Ok(())
}

/// Problems `validate` finds in one instance.
fn instance_problems(i: &swt::SwtInstance) -> Vec<String> {
    let mut out = Vec::new();
    let env = i.env.as_ref().expect("load_dataset fills env");
    if parser_for(&i.repo, &env.log_parser).is_none() {
        out.push(format!(
            "log parser `{}` is unknown (known: {})",
            env.log_parser,
            Family::names().join(", ")
        ));
    }
    if i.base_commit.len() != 40 || !i.base_commit.chars().all(|c| c.is_ascii_hexdigit()) {
        out.push(format!(
            "base_commit `{}` is not a 40-hex commit id",
            i.base_commit
        ));
    }
    if let Err(p) = patch::validate(Some(&i.patch)) {
        out.push(format!("golden patch: {}", p.class()));
    }
    match patch::validate(Some(&i.test_patch)) {
        Err(p) => out.push(format!("golden test patch: {}", p.class())),
        Ok(files) if patch::test_directives(&files, &env.test_directives).is_empty() => {
            out.push("golden test patch touches no Python file".into())
        }
        Ok(_) => {}
    }
    if i.fail_to_pass.is_empty() {
        out.push("FAIL_TO_PASS is empty".into());
    }
    out
}

/// `datasets validate`: exit status 1 when any row or instance has a problem.
pub fn validate(name: &str, datasets_dir: &Path, env: Option<&Path>) -> Result<bool> {
    let here = Path::new(".");
    match classify(name, datasets_dir, here) {
        DatasetKind::AndroidSim(dir) => return validate_android_sim(name, &dir),
        DatasetKind::AndroidReal(dir) => return validate_android_manifest(&dir),
        DatasetKind::Synthetic | DatasetKind::Swt => {}
    }
    let ds = load(name, datasets_dir, here, env)?;
    let mut bad = ds.errors.len();
    print_row_errors(&ds.errors);
    for i in &ds.instances {
        for p in instance_problems(i) {
            println!("{}: {p}", i.instance_id);
            bad += 1;
        }
    }
    if let Some(expected) = ds.manifest.as_ref().and_then(|m| m.expected_instances)
        && ds.instances.len() != expected
    {
        println!(
            "{}: {} instances, the manifest expects {expected}",
            ds.name,
            ds.instances.len()
        );
        bad += 1;
    }
    println!(
        "{}: {} instances checked, {bad} problems",
        ds.name,
        ds.instances.len()
    );
    Ok(bad == 0)
}

/// `datasets validate` of a simulator suite: its apps and reports load, and every report names
/// one of its apps.
fn validate_android_sim(name: &str, dir: &Path) -> Result<bool> {
    use reprobench_android::sim::Dataset;
    let ds = Dataset::load(dir).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
    let mut bad = 0;
    for (id, report) in &ds.reports {
        if !ds.apps.contains_key(&report.app) {
            println!(
                "{id}: its app `{}` is not among the suite's apps",
                report.app
            );
            bad += 1;
        }
    }
    println!(
        "{name}: {} reports on {} apps checked, {bad} problems (a simulator suite)",
        ds.reports.len(),
        ds.apps.len()
    );
    Ok(bad == 0)
}

/// `datasets validate` of a real-app android dataset: its rows load and, where the reports were
/// fetched, each row has its report. Reports not fetched yet are listed, not counted as problems.
fn validate_android_manifest(dir: &Path) -> Result<bool> {
    use reprobench_domain::android::load_android_dataset;
    let ds = load_android_dataset(&dir.display().to_string(), dir, None)?;
    print_row_errors(&ds.errors);
    let bad = ds.errors.len();
    let missing = ds.missing_reports.len();
    if missing > 0 {
        let hint = ds
            .missing_reports
            .first()
            .map(|e| e.message.clone())
            .unwrap_or_default();
        println!(
            "{}: {missing} of {} reports not here yet ({hint})",
            ds.name,
            ds.instances.len()
        );
    }
    println!(
        "{}: {} instances checked, {bad} problems, {missing} reports to fetch",
        ds.name,
        ds.instances.len()
    );
    Ok(bad == 0)
}

/// `datasets prepare`: builds the repository mirrors of a dataset that ships its sources.
pub fn prepare(name: &str, datasets_dir: &Path, repos: &Path) -> Result<()> {
    let ds = load(name, datasets_dir, Path::new("."), None)?;
    let sources = match (
        &ds.dir,
        ds.manifest.as_ref().and_then(|m| m.sources.as_ref()),
    ) {
        (Some(dir), Some(src)) => dir.join(src),
        _ => bail!(
            "dataset `{}` ships no sources to build mirrors from; `reprobench datasets fetch {}` mirrors its repositories instead",
            ds.name,
            ds.name
        ),
    };
    for r in mirror::prepare(&sources, repos, &ds.instances)? {
        let what = if r.already_present {
            "present"
        } else {
            "built"
        };
        eprintln!(
            "{what:>8} {} {} at {}",
            r.repo,
            &r.commit[..12],
            r.mirror.display()
        );
    }
    Ok(())
}

/// Makes sure the mirrors of a local dataset exist (builds them from its sources when it ships them).
pub fn ensure_mirrors(ds: &LoadedDataset, repos: &Path) -> Result<()> {
    let missing = ds
        .instances
        .iter()
        .any(|i| !mirror::has_commit(&repos.join(swt::mirror_name(&i.repo)), &i.base_commit));
    if !missing {
        return Ok(());
    }
    match (
        &ds.dir,
        ds.manifest.as_ref().and_then(|m| m.sources.as_ref()),
    ) {
        (Some(dir), Some(src)) => {
            mirror::prepare(&dir.join(src), repos, &ds.instances)?;
            Ok(())
        }
        // Instances whose mirror is missing are reported per instance by the nodes (bad input).
        _ => Ok(()),
    }
}

/// Whether a TCP connection to `host:port` opens within 5 s (the offline check of `fetch`).
fn reachable(host: &str, port: u16) -> Result<(), String> {
    let addr = std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
        .map_err(|e| e.to_string())?
        .next()
        .ok_or_else(|| "no address".to_string())?;
    std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(5))
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// The fetch helper, run with the host's python3.
const FETCH_SCRIPT: &str = include_str!("scripts/fetch_swt.py");

/// `datasets fetch`: for SWT datasets, rows from the Hugging Face datasets API, environment specs
/// exported from the `swebench` package, repositories mirrored with git; for android datasets
/// whose reports come from GitHub issues, one `REPORT_ID.json` per row. Offline, it stops at
/// once and says so.
pub async fn fetch(name: &str, datasets_dir: &Path, repos: &Path) -> Result<()> {
    let dir = datasets_dir.join(name);
    let manifest_path = dir.join("manifest.json");
    let text = std::fs::read_to_string(&manifest_path).with_context(|| {
        format!(
            "unknown dataset `{name}` (no {}); `reprobench datasets list` shows the known ones",
            manifest_path.display()
        )
    })?;
    if serde_json::from_str::<serde_json::Value>(&text).is_ok_and(|v| v["track"] == "android") {
        return fetch_android_reports(name, datasets_dir).await;
    }
    let manifest: swt::Manifest =
        serde_json::from_str(&text).with_context(|| format!("{}", manifest_path.display()))?;
    let Some(source) = &manifest.source else {
        bail!(
            "dataset `{name}` has no remote source; it ships its rows (use `reprobench datasets prepare {name}` for its mirrors)"
        );
    };
    let host = "datasets-server.huggingface.co";
    // DNS and TCP probes and the python3 fetch block: they run on blocking threads.
    let probe = tokio::task::spawn_blocking(move || reachable(host, 443))
        .await
        .unwrap_or_else(|e| Err(e.to_string()));
    if let Err(e) = probe {
        bail!(
            "cannot reach {host} ({e}): this machine looks offline for the Hugging Face datasets API, so `{}` rows of {} cannot be fetched here. \
             Fetch on a connected machine and copy datasets/{name}/instances.jsonl and env.json (and the mirrors) over, or evaluate a rows file with `reprobench eval --dataset ROWS.jsonl --env ENV.json`",
            source.split,
            source.huggingface_dataset
        );
    }
    let status = tokio::process::Command::new("python3")
        .arg("-c")
        .arg(FETCH_SCRIPT)
        .arg(&manifest_path)
        .arg(&dir)
        .arg(repos)
        .status()
        .await
        .context("running python3 for the fetch (is it installed?)")?;
    if !status.success() {
        bail!("fetching `{name}` failed ({status}); see the messages above");
    }
    Ok(())
}

/// Stops with a clear message when the API base cannot be reached (offline machine).
fn check_github_reachable(base: &str, reports_dir: &Path) -> Result<()> {
    let url = reqwest::Url::parse(base)
        .with_context(|| format!("{GITHUB_API_ENV}=`{base}` is not a URL"))?;
    let host = url.host_str().unwrap_or_default().to_string();
    let port = url.port_or_known_default().unwrap_or(443);
    if let Err(e) = reachable(&host, port) {
        bail!(
            "cannot reach {host}:{port} ({e}): this machine looks offline for the GitHub API ({base}), so the bug reports cannot be fetched here. \
             Fetch them on a connected machine (`reprobench datasets fetch` there) and copy the REPORT_ID.json files into {}, \
             or copy the reports of the LTGDroid replication package there: its 75 reports are in this JSON form already",
            reports_dir.display()
        );
    }
    Ok(())
}

/// `datasets fetch` for an android dataset: each row's GitHub issue and comments become
/// `REPORT_ID.json` in LTGDroid's form. Existing files are kept (resumable); a failed row is
/// reported and the others go on; the command fails at the end naming the failed rows.
async fn fetch_android_reports(name: &str, datasets_dir: &Path) -> Result<()> {
    use reprobench_domain::android::{ReportSource, load_android_dataset};
    let ds = load_android_dataset(name, datasets_dir, None)?;
    let manifest = ds.manifest.as_ref().expect("loaded from a manifest");
    match manifest.source.as_ref().map(|s| s.reports) {
        Some(ReportSource::GithubIssues) => {}
        None => bail!("dataset `{name}` has no remote source; it ships its reports"),
    }
    let dir = ds.dir.clone().expect("loaded from a directory");
    let reports_dir = dir.join(manifest.reports.as_deref().unwrap_or("reports"));
    std::fs::create_dir_all(&reports_dir)
        .with_context(|| format!("cannot create {}", reports_dir.display()))?;
    let base = std::env::var(GITHUB_API_ENV)
        .ok()
        .filter(|b| !b.trim().is_empty())
        .unwrap_or_else(|| GITHUB_API_DEFAULT.to_string());
    let mut plan = github::plan_reports(&ds.instances, &reports_dir, &base, Path::exists);
    for e in ds.errors.iter() {
        plan.failed.push((
            e.instance_id.clone().unwrap_or_else(|| e.location.clone()),
            e.message.clone(),
        ));
    }
    let mut fetched = 0usize;
    if !plan.jobs.is_empty() {
        // The DNS and TCP probe blocks: it runs on a blocking thread.
        let (probe_base, probe_dir) = (base.clone(), reports_dir.clone());
        tokio::task::spawn_blocking(move || check_github_reachable(&probe_base, &probe_dir))
            .await
            .context("the GitHub reachability probe stopped")??;
        let client = reqwest::Client::builder()
            .user_agent(concat!("reprobench/", env!("CARGO_PKG_VERSION")))
            .timeout(std::time::Duration::from_secs(60))
            .build()
            .context("building the HTTP client")?;
        let bar = indicatif::ProgressBar::new(plan.jobs.len() as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{prefix:>8} [{bar:32}] {pos}/{len} {msg}")
                .expect("static template")
                .progress_chars("=> "),
        );
        bar.set_prefix("reports");
        for job in &plan.jobs {
            bar.set_message(job.instance_id.clone());
            match github::fetch_report(&client, job).await {
                Ok(()) => fetched += 1,
                Err(e) => {
                    bar.suspend(|| eprintln!("failed {}: {e}", job.instance_id));
                    plan.failed.push((job.instance_id.clone(), e));
                }
            }
            bar.inc(1);
        }
        bar.finish_and_clear();
    }
    eprintln!(
        "{name}: {fetched} reports fetched, {} already in {}, {} failed",
        plan.present,
        reports_dir.display(),
        plan.failed.len()
    );
    if !plan.failed.is_empty() {
        let list: Vec<String> = plan
            .failed
            .iter()
            .map(|(id, why)| format!("  {id}: {why}"))
            .collect();
        bail!(
            "{} rows of `{name}` have no report (run the same command again to retry them):\n{}",
            plan.failed.len(),
            list.join("\n")
        );
    }
    Ok(())
}
