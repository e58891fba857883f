//! `reprobench bench slice --all`: every SWT-bench instance of the real slice (Lite and the
//! Verified sample), repository by repository: gold, then AssertFlip's predictions under the
//! rules of their time against every official verdict the slice has, optionally gold again N
//! times to find flaky instances. The work directory is durable: every step is an `eval` that
//! resumes where it stopped, and a crash or a reboot loses at most the executions in flight.
//! Per-instance key fields go to `--record DIR` after each repository, so they can be committed
//! as the run goes; the README table is printed at the end.

use anyhow::{Context, Result};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What `--all` (or `--repeat-gold`) runs.
pub struct AllOptions {
    /// The slice directory (rows.jsonl, membership.json, repos/, predictions/, verdicts/).
    pub slice: PathBuf,
    /// Short repository names to run (empty: every repository of the slice).
    pub repos: Vec<String>,
    /// Instances to run (empty: every SWT-bench instance of those repositories).
    pub instance_ids: BTreeSet<String>,
    /// docker or process.
    pub executor: String,
    /// Local nodes, one slot each.
    pub nodes: u32,
    /// The durable work directory.
    pub work: PathBuf,
    /// Where per-instance key fields go (`slice-REPO.jsonl`), if anywhere.
    pub record: Option<PathBuf>,
    /// Gold runs per instance (1: no repeat).
    pub repeat_gold: u32,
    /// Skip the predictions.
    pub gold_only: bool,
    /// The predictions [default: SLICE/predictions/AssertFlip.jsonl].
    pub predictions: Option<PathBuf>,
    /// Extra `eval` arguments (`--no-coverage`, `--timeout-s N`).
    pub eval_args: Vec<String>,
    /// Print one JSON object only.
    pub json: bool,
}

/// One repository's mirror tarball and SWT-bench rows in the slice.
#[derive(Debug)]
pub(crate) struct Repo {
    /// `django`.
    pub short: String,
    /// `django/django`.
    pub name: String,
    /// `SLICE/repos/django__django.git.tar.gz`.
    pub tarball: PathBuf,
    /// Rows (JSON lines) of its SWT-bench instances.
    pub rows: Vec<String>,
}

/// The slice's repositories with SWT-bench instances (those of `wanted`, short or mirror
/// names; none: all), fewest instances first.
pub(crate) fn slice_repos(slice: &Path, wanted: &[String]) -> Result<Vec<Repo>> {
    let membership: Value = serde_json::from_slice(
        &std::fs::read(slice.join("membership.json"))
            .with_context(|| format!("{}: no membership.json", slice.display()))?,
    )?;
    let swt: BTreeSet<String> = ["swt_bench_lite", "swt_bench_verified_sample"]
        .iter()
        .flat_map(|k| membership[k].as_array().cloned().unwrap_or_default())
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    let rows = std::fs::read_to_string(slice.join("rows.jsonl"))?;
    let mut repos = Vec::new();
    for entry in std::fs::read_dir(slice.join("repos"))?.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        let Some(mirror) = file.strip_suffix(".git.tar.gz") else {
            continue;
        };
        let short = mirror.rsplit("__").next().unwrap_or(mirror).to_string();
        if !wanted.is_empty() && !wanted.iter().any(|w| *w == short || w == mirror) {
            continue;
        }
        let name = mirror.replacen("__", "/", 1);
        let mine: Vec<String> = rows
            .lines()
            .filter(|l| {
                serde_json::from_str::<Value>(l).is_ok_and(|r| {
                    r["repo"] == name.as_str()
                        && r["instance_id"].as_str().is_some_and(|i| swt.contains(i))
                })
            })
            .map(str::to_string)
            .collect();
        if !mine.is_empty() {
            repos.push(Repo {
                short,
                name,
                tarball: entry.path(),
                rows: mine,
            });
        }
    }
    for w in wanted {
        anyhow::ensure!(
            repos
                .iter()
                .any(|r| r.short == *w || r.name.replace('/', "__") == *w),
            "--repos {w}: no mirror with SWT-bench instances of that name in {}",
            slice.join("repos").display()
        );
    }
    repos.sort_by(|a, b| (a.rows.len(), &a.short).cmp(&(b.rows.len(), &b.short)));
    Ok(repos)
}

/// The repositories' rows narrowed to `ids` (none: all of them); an id of no row is an error.
pub(crate) fn only_instances(repos: Vec<Repo>, ids: &BTreeSet<String>) -> Result<Vec<Repo>> {
    if ids.is_empty() {
        return Ok(repos);
    }
    let id_of = |l: &str| {
        serde_json::from_str::<Value>(l)
            .ok()
            .and_then(|r| r["instance_id"].as_str().map(str::to_string))
    };
    let known: BTreeSet<String> = repos
        .iter()
        .flat_map(|r| r.rows.iter().filter_map(|l| id_of(l)))
        .collect();
    let unknown: Vec<&String> = ids.difference(&known).collect();
    anyhow::ensure!(
        unknown.is_empty(),
        "--instance-id {}: not an SWT-bench instance of the chosen repositories of the slice",
        unknown
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(",")
    );
    Ok(repos
        .into_iter()
        .map(|mut r| {
            r.rows
                .retain(|l| id_of(l).is_some_and(|i| ids.contains(&i)));
            r
        })
        .filter(|r| !r.rows.is_empty())
        .collect())
}

/// What tells a run of some instances apart in `walls.json` (`@3:a-1..a-9`; none for all), so
/// that its wall time is its own.
fn subset_tag(ids: &BTreeSet<String>) -> String {
    match (ids.first(), ids.last()) {
        (Some(first), Some(last)) => format!("@{}:{first}..{last}", ids.len()),
        _ => String::new(),
    }
}

/// `records` merged into the JSON lines of `earlier` (a record file of an earlier run): a
/// record replaces the earlier one of its instance, the others are kept; sorted by instance.
fn merged_records(earlier: &str, records: &[Value]) -> String {
    let mut by_id: BTreeMap<String, Value> = earlier
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|r| Some((r["instance_id"].as_str()?.to_string(), r)))
        .collect();
    for r in records {
        if let Some(id) = r["instance_id"].as_str() {
            by_id.insert(id.to_string(), r.clone());
        }
    }
    by_id.values().map(|r| format!("{r}\n")).collect()
}

/// Every official verdict of the slice's `verdicts/*.json` files: instance → resolved.
fn official_verdicts(slice: &Path) -> Result<BTreeMap<String, bool>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(slice.join("verdicts"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let v: Value = serde_json::from_slice(&std::fs::read(&path)?)
            .with_context(|| format!("{}: not a verdicts file", path.display()))?;
        for (id, r) in v["instances"].as_object().into_iter().flatten() {
            if let Some(resolved) = r["resolved"].as_bool() {
                out.insert(id.clone(), resolved);
            }
        }
    }
    Ok(out)
}

/// The reports of a finished evaluation, by instance.
fn reports(run: &Value) -> BTreeMap<String, Value> {
    let dir = PathBuf::from(run["reports"].as_str().unwrap_or_default());
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        if let Some(r) = std::fs::read(entry.path().join("report.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            && let Some(id) = r["instance_id"].as_str()
        {
            out.insert(id.to_string(), r);
        }
    }
    out
}

/// What an instance took on its slot: milliseconds building its environment, milliseconds of
/// its executions, and how many executions ran (those read from a cache are not counted).
fn instance_ms(r: &Value) -> (f64, f64, usize) {
    let prepare = r["prepare_ms"].as_f64().unwrap_or(0.0);
    let ran: Vec<&Value> = r["executions"]
        .as_object()
        .into_iter()
        .flat_map(|m| m.values())
        .filter(|e| e["cached"] != true)
        .collect();
    let executions: f64 = ran
        .iter()
        .map(|e| e["command_ms"].as_f64().unwrap_or(0.0) + e["overhead_ms"].as_f64().unwrap_or(0.0))
        .sum();
    (prepare, executions, ran.len())
}

/// Wall seconds spent per step, summed over every invocation (a resumed step adds its part).
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Walls(BTreeMap<String, f64>);

impl Walls {
    fn file(work: &Path) -> PathBuf {
        work.join("walls.json")
    }
    fn load(work: &Path) -> Walls {
        std::fs::read(Walls::file(work))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }
    /// Runs `f`, adding its wall time to `step` (saved at once, so a crash keeps it).
    fn timed<T>(&mut self, work: &Path, step: &str, f: impl FnOnce() -> T) -> Result<T> {
        let started = Instant::now();
        let out = f();
        *self.0.entry(step.to_string()).or_default() += started.elapsed().as_secs_f64();
        std::fs::write(Walls::file(work), serde_json::to_vec_pretty(self)?)?;
        Ok(out)
    }
}

/// One `reprobench eval` of the work directory (resumed when it ran before), its progress on
/// stderr; its JSON, or why it failed.
fn eval(
    o: &AllOptions,
    rows: &Path,
    predictions: &str,
    data: &str,
    cache: &str,
    extra: &[&str],
) -> Result<Value> {
    let exe = std::env::current_exe()?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("eval")
        .arg("--dataset")
        .arg(rows)
        .args([
            "--predictions",
            predictions,
            "--executor",
            &o.executor,
            "--json",
        ])
        .args([
            "--local-nodes",
            &o.nodes.to_string(),
            "--slots-per-node",
            "1",
        ])
        .arg("--data")
        .arg(o.work.join(data))
        .arg("--cache-dir")
        .arg(o.work.join(cache))
        .arg("--repos")
        .arg(o.work.join("repos"))
        .args(&o.eval_args)
        .args(extra)
        .stdin(std::process::Stdio::null());
    if !o.json {
        cmd.arg("--progress");
    }
    let out = cmd
        .stderr(if o.json {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::inherit()
        })
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "the evaluation in {} failed ({}){}; run the same command again to resume it",
        o.work.join(data).display(),
        out.status,
        if o.json {
            format!(": {}", String::from_utf8_lossy(&out.stderr).trim())
        } else {
            " (its output is above)".to_string()
        }
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// Whether an evaluation reused a run from an earlier invocation in which instances ended in an
/// error: those are final within a run, so a new run is what retries them once their cause (a
/// host package, a network) may have been fixed.
fn errored_before(eval_json: &Value) -> bool {
    eval_json["resumed"] == true && eval_json["errors"].as_u64().is_some_and(|n| n > 0)
}

/// Runs the benchmark; prints the table (and the JSON figures).
pub fn run(o: &AllOptions) -> Result<()> {
    std::fs::create_dir_all(&o.work)
        .with_context(|| format!("cannot create the work directory {}", o.work.display()))?;
    let repos = only_instances(slice_repos(&o.slice, &o.repos)?, &o.instance_ids)?;
    let official = official_verdicts(&o.slice)?;
    let predictions_file = o
        .predictions
        .clone()
        .unwrap_or_else(|| o.slice.join("predictions/AssertFlip.jsonl"));
    let predictions_text = if o.gold_only {
        String::new()
    } else {
        std::fs::read_to_string(&predictions_file).with_context(|| {
            format!(
                "cannot read the predictions {} (pass --predictions FILE, or --gold-only)",
                predictions_file.display()
            )
        })?
    };
    let say = |m: String| {
        if !o.json {
            eprintln!("{m}");
        }
    };
    let total: usize = repos.iter().map(|r| r.rows.len()).sum();
    say(format!(
        "{total} SWT-bench instances of {} repositories, {} executor, {} local nodes; work directory {} (run the same command again to resume)",
        repos.len(),
        o.executor,
        o.nodes,
        o.work.display()
    ));
    let mut step = Step {
        o,
        official: &official,
        predictions_text: &predictions_text,
        walls: Walls::load(&o.work),
        say: &say,
    };
    let mut table = Vec::new();
    let mut done = 0usize;
    for (k, repo) in repos.iter().enumerate() {
        say(format!(
            "[{}/{}] {} ({} instances; {done} of {total} before it)",
            k + 1,
            repos.len(),
            repo.name,
            repo.rows.len()
        ));
        let row = step.repository(repo)?;
        if row.get("error").is_none() {
            say(format!("{}: {}", repo.name, table_line(&row)));
        }
        table.push(row);
        done += repo.rows.len();
    }
    let v = json!({
        "executor": o.executor,
        "nodes": o.nodes,
        "work": o.work.display().to_string(),
        "instances": total,
        "repeat_gold": o.repeat_gold.max(1),
        "by_repo": table,
    });
    if o.json {
        println!("{v}");
    } else {
        println!("{}", markdown_table(&table));
        println!("{}", serde_json::to_string_pretty(&v)?);
    }
    Ok(())
}

/// What every repository's step shares: the options, the official verdicts, AssertFlip's (or
/// the given) predictions, the steps' wall times and where progress goes.
struct Step<'a> {
    o: &'a AllOptions,
    official: &'a BTreeMap<String, bool>,
    predictions_text: &'a str,
    walls: Walls,
    say: &'a dyn Fn(String),
}

/// One repository's files in the work directory and its steps' keys.
struct RepoFiles {
    rows: PathBuf,
    cache: String,
    walls_key: String,
}

impl Step<'_> {
    /// One repository: gold (and its repeats), the predictions, the records and the table row.
    /// A failed evaluation is the row's `error`, said at once; the others go on.
    fn repository(&mut self, repo: &Repo) -> Result<Value> {
        let o = self.o;
        reprobench_sandbox::mirrors::import_mirrors(
            std::slice::from_ref(&repo.tarball),
            &o.work.join("repos"),
            |l| (self.say)(l.to_string()),
        )?;
        let rows = o.work.join(format!("rows-{}.jsonl", repo.short));
        std::fs::write(
            &rows,
            repo.rows
                .iter()
                .map(|l| format!("{l}\n"))
                .collect::<String>(),
        )?;
        let files = RepoFiles {
            rows,
            cache: format!("cache/{}", repo.short),
            walls_key: format!("{}{}", repo.short, subset_tag(&o.instance_ids)),
        };
        let mut row = json!({"repo": repo.name, "instances": repo.rows.len()});
        let repeats = match self.gold(repo, &files)? {
            Ok(repeats) => repeats,
            Err(e) => {
                (self.say)(format!("{}: {e:#}", repo.name));
                row["error"] = format!("{e:#}").into();
                return Ok(row);
            }
        };
        let gold_reports = repeats[0].clone();
        let flaky = flaky_instances(&repeats);
        let pred_reports = self.predictions(repo, &files, &gold_reports, &mut row)?;
        let versions: BTreeMap<String, Value> = repo
            .rows
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|r| Some((r["instance_id"].as_str()?.to_string(), r["version"].clone())))
            .collect();
        let mut records = instance_records(&gold_reports, &pred_reports, self.official, &repeats);
        for r in &mut records {
            let id = r["instance_id"].as_str().unwrap_or_default().to_string();
            r["version"] = versions.get(&id).cloned().unwrap_or(Value::Null);
            r["executor"] = o.executor.clone().into();
            r["coverage"] = (!o.eval_args.iter().any(|a| a == "--no-coverage")).into();
        }
        if let Some(dir) = &o.record {
            std::fs::create_dir_all(dir)?;
            let file = dir.join(format!("slice-{}.jsonl", repo.short));
            let earlier = std::fs::read_to_string(&file).unwrap_or_default();
            std::fs::write(&file, merged_records(&earlier, &records))?;
        }
        let figures = repo_figures(&records, &gold_reports);
        row.as_object_mut()
            .expect("object")
            .extend(figures.as_object().cloned().unwrap_or_default());
        row["flaky"] = json!(flaky);
        row["wall_s"] = self
            .walls
            .0
            .iter()
            .filter(|(k, _)| k.starts_with(&format!("{}/", files.walls_key)))
            .map(|(_, v)| *v)
            .sum::<f64>()
            .into();
        row["disk_bytes"] = if o.executor == "process" {
            crate::bench::dir_bytes(&o.work.join(&files.cache)).into()
        } else {
            Value::Null
        };
        Ok(row)
    }

    /// Gold, then its repeats, each in a data directory of its own (the prediction's executions,
    /// the golden test patch before and after the fix, run anew every time): the reports of each
    /// round, the first being gold's. The inner error is gold's evaluation failing.
    fn gold(&mut self, repo: &Repo, f: &RepoFiles) -> Result<Result<Vec<BTreeMap<String, Value>>>> {
        let (o, say) = (self.o, self.say);
        let gold_data = format!("data/{}/gold", repo.short);
        let key = format!("{}/gold", f.walls_key);
        let mut gold = self.walls.timed(&o.work, &key, || {
            eval(o, &f.rows, "gold", &gold_data, &f.cache, &[])
        })?;
        if let Ok(g) = &gold
            && errored_before(g)
        {
            say(format!(
                "{}: {} instances had ended in an error in the run this one resumed; running gold again (the cause may be fixed now)",
                repo.name, g["errors"]
            ));
            gold = self.walls.timed(&o.work, &key, || {
                eval(o, &f.rows, "gold", &gold_data, &f.cache, &["--new"])
            })?;
        }
        let gold = match gold {
            Ok(g) => g,
            Err(e) => return Ok(Err(e)),
        };
        let mut repeats = vec![reports(&gold)];
        for n in 2..=o.repeat_gold.max(1) {
            let r = self
                .walls
                .timed(&o.work, &format!("{}/gold-repeat", f.walls_key), || {
                    eval(
                        o,
                        &f.rows,
                        "gold",
                        &format!("data/{}/gold-repeat-{n}", repo.short),
                        &f.cache,
                        &[],
                    )
                })?;
            repeats.push(reports(&r?));
        }
        Ok(Ok(repeats))
    }

    /// The predictions for this repository's instances, under the rules of their time, with
    /// gold and base cached: their reports, and in `row` how much of the slots' time the tests
    /// ran, where the rest went, and how many executions a prediction cost (or why they failed).
    fn predictions(
        &mut self,
        repo: &Repo,
        f: &RepoFiles,
        gold_reports: &BTreeMap<String, Value>,
        row: &mut Value,
    ) -> Result<BTreeMap<String, Value>> {
        let o = self.o;
        let preds: String = self
            .predictions_text
            .lines()
            .filter(|l| {
                serde_json::from_str::<Value>(l).is_ok_and(|p| {
                    p["instance_id"]
                        .as_str()
                        .is_some_and(|i| gold_reports.contains_key(i))
                })
            })
            .map(|l| format!("{l}\n"))
            .collect();
        if preds.is_empty() {
            return Ok(BTreeMap::new());
        }
        let file = o.work.join(format!("predictions-{}.jsonl", repo.short));
        std::fs::write(&file, preds)?;
        let preds_data = format!("data/{}/predictions", repo.short);
        let run_predictions = |extra: &[&str]| {
            let mut args = vec!["--rules", "swt-bench-2024"];
            args.extend_from_slice(extra);
            eval(
                o,
                &f.rows,
                &file.display().to_string(),
                &preds_data,
                &f.cache,
                &args,
            )
        };
        let key = format!("{}/predictions", f.walls_key);
        let mut r = self.walls.timed(&o.work, &key, || run_predictions(&[]))?;
        if r.as_ref().is_ok_and(errored_before) {
            r = self
                .walls
                .timed(&o.work, &key, || run_predictions(&["--new"]))?;
        }
        match r {
            Ok(r) => {
                let figures = crate::bench::execution_figures(&r);
                let wall = self.walls.0.get(&key).copied().unwrap_or(0.0);
                row["predictions_efficiency"] = figures.efficiency(wall, o.nodes as usize).into();
                row["predictions_phases"] = figures.phases_json();
                let pred_reports = reports(&r);
                row["predictions_executions_per_instance"] =
                    (figures.run as f64 / pred_reports.len().max(1) as f64).into();
                Ok(pred_reports)
            }
            Err(e) => {
                (self.say)(format!("{} predictions: {e:#}", repo.name));
                row["predictions_error"] = format!("{e:#}").into();
                Ok(BTreeMap::new())
            }
        }
    }
}

/// Instances whose verdict changed between the gold repetitions.
fn flaky_instances(repeats: &[BTreeMap<String, Value>]) -> Vec<String> {
    let ids: BTreeSet<&String> = repeats.iter().flat_map(|r| r.keys()).collect();
    ids.into_iter()
        .filter(|id| {
            let seen: BTreeSet<String> = repeats
                .iter()
                .map(|r| {
                    r.get(*id).map_or("missing".to_string(), |x| {
                        format!("{}/{}", x["resolved"], x["verdict"])
                    })
                })
                .collect();
            seen.len() > 1
        })
        .cloned()
        .collect()
}

/// Per-instance key fields, sorted by instance.
fn instance_records(
    gold: &BTreeMap<String, Value>,
    preds: &BTreeMap<String, Value>,
    official: &BTreeMap<String, bool>,
    repeats: &[BTreeMap<String, Value>],
) -> Vec<Value> {
    gold.iter()
        .map(|(id, r)| {
            let (prepare_ms, executions_ms, executions_run) = instance_ms(r);
            let p = preds.get(id);
            let mut rec = json!({
                "instance_id": id,
                "gold_resolved": r["resolved"],
                "gold_verdict": r["verdict"],
                "error_class": r["error_class"],
                "message": r["message"],
                "coverage_gold": r["coverage_gold"],
                "coverage_delta_gold": r["coverage_delta_gold"],
                "environment_left_out": r["environment_left_out"],
                "prepare_ms": prepare_ms,
                "executions_ms": executions_ms,
                "executions_run": executions_run,
                "assertflip_resolved": p.map(|p| p["resolved"].clone()),
                "assertflip_verdict": p.map(|p| p["verdict"].clone()),
                "official_resolved": official.get(id),
            });
            if repeats.len() > 1 {
                rec["gold_resolved_repeats"] = repeats
                    .iter()
                    .map(|x| x.get(id).map_or(Value::Null, |x| x["resolved"].clone()))
                    .collect();
            }
            rec
        })
        .collect()
}

/// A repository's figures from its instance records.
fn repo_figures(records: &[Value], gold: &BTreeMap<String, Value>) -> Value {
    let resolved = records
        .iter()
        .filter(|r| r["gold_resolved"] == true)
        .count();
    let compared: Vec<&Value> = records
        .iter()
        .filter(|r| r["official_resolved"].is_boolean() && r["assertflip_resolved"].is_boolean())
        .collect();
    let agree = compared
        .iter()
        .filter(|r| r["official_resolved"] == r["assertflip_resolved"])
        .count();
    let disagreements: Vec<&Value> = compared
        .iter()
        .filter(|r| r["official_resolved"] != r["assertflip_resolved"])
        .map(|r| &r["instance_id"])
        .collect();
    let (prepare, executions) = gold
        .values()
        .map(instance_ms)
        .fold((0.0, 0.0), |(a, b), (p, e, _)| (a + p, b + e));
    let n = records.len().max(1) as f64;
    json!({
        "gold_resolved": resolved,
        "gold_unresolved": records.iter().filter(|r| r["gold_resolved"] != true).map(|r| &r["instance_id"]).collect::<Vec<_>>(),
        "official_compared": compared.len(),
        "official_agree": agree,
        "official_disagreements": disagreements,
        "environment_build_s": prepare / 1e3,
        "slot_minutes_per_instance": (prepare + executions) / 6e4 / n,
    })
}

/// `12/12 gold, AssertFlip 5/5, 3.2 min, env 1.1 min, 1.2 GB`.
fn table_line(r: &Value) -> String {
    if let Some(e) = r["error"].as_str() {
        return format!("error: {e}");
    }
    format!(
        "{}/{} gold, official verdicts {}/{}, {:.1} min, environments {:.1} min, {}",
        r["gold_resolved"],
        r["instances"],
        r["official_agree"],
        r["official_compared"],
        r["wall_s"].as_f64().unwrap_or(0.0) / 60.0,
        r["environment_build_s"].as_f64().unwrap_or(0.0) / 60.0,
        r["disk_bytes"]
            .as_u64()
            .map_or("disk n/a".to_string(), |b| format!(
                "{:.2} GB",
                b as f64 / 1e9
            )),
    )
}

/// The README table.
fn markdown_table(rows: &[Value]) -> String {
    let mut t = String::from(
        "| repository | gold resolved | AssertFlip: official verdicts reproduced | wall | environment builds | core-min / instance | disk | flaky (gold repeated) |\n|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        if let Some(e) = r["error"].as_str() {
            t.push_str(&format!(
                "| {} | error: {} | | | | | | |\n",
                r["repo"].as_str().unwrap_or_default(),
                e.lines().next().unwrap_or_default()
            ));
            continue;
        }
        t.push_str(&format!(
            "| {} | {}/{} | {}/{} | {:.1} min | {:.1} min | {:.2} | {} | {} |\n",
            r["repo"].as_str().unwrap_or_default(),
            r["gold_resolved"],
            r["instances"],
            r["official_agree"],
            r["official_compared"],
            r["wall_s"].as_f64().unwrap_or(0.0) / 60.0,
            r["environment_build_s"].as_f64().unwrap_or(0.0) / 60.0,
            r["slot_minutes_per_instance"].as_f64().unwrap_or(0.0),
            r["disk_bytes"]
                .as_u64()
                .map_or("—".to_string(), |b| format!("{:.2} GB", b as f64 / 1e9)),
            r["flaky"].as_array().map_or(String::new(), |f| f
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(", ")),
        ));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(resolved: bool, verdict: &str) -> Value {
        json!({"resolved": resolved, "verdict": verdict})
    }

    #[test]
    fn a_verdict_that_changes_between_repeats_is_flaky() {
        let a = BTreeMap::from([
            ("x".to_string(), report(true, "resolved")),
            ("y".to_string(), report(true, "resolved")),
            ("z".to_string(), report(false, "unresolved")),
        ]);
        let mut b = a.clone();
        b.insert("y".into(), report(false, "unresolved"));
        b.remove("z");
        assert_eq!(flaky_instances(&[a.clone(), b]), vec!["y", "z"]);
        assert!(flaky_instances(&[a.clone(), a]).is_empty());
    }

    #[test]
    fn only_a_resumed_run_with_errors_is_run_again() {
        assert!(errored_before(&json!({"resumed": true, "errors": 2})));
        assert!(!errored_before(&json!({"resumed": false, "errors": 2})));
        assert!(!errored_before(&json!({"resumed": true, "errors": 0})));
    }

    #[test]
    fn figures_compare_only_instances_with_an_official_verdict() {
        let gold = BTreeMap::from([
            (
                "r-1".to_string(),
                json!({"resolved": true, "prepare_ms": 60000.0, "executions": {"pred_pre": {"command_ms": 50000.0, "overhead_ms": 10000.0}, "gold_pre": {"cached": true, "command_ms": 1e9}}}),
            ),
            (
                "r-2".to_string(),
                json!({"resolved": false, "prepare_ms": 0.0}),
            ),
            ("r-3".to_string(), json!({"resolved": true})),
        ]);
        let preds = BTreeMap::from([
            ("r-1".to_string(), json!({"resolved": true})),
            ("r-2".to_string(), json!({"resolved": true})),
        ]);
        let official = BTreeMap::from([("r-1".to_string(), true), ("r-2".to_string(), false)]);
        let recs = instance_records(&gold, &preds, &official, std::slice::from_ref(&gold));
        assert_eq!(recs.len(), 3);
        assert!(recs[2]["official_resolved"].is_null());
        assert_eq!(
            recs[0]["executions_run"], 1,
            "a cached execution did not run"
        );
        let f = repo_figures(&recs, &gold);
        assert_eq!(f["gold_resolved"], 2);
        assert_eq!(f["official_compared"], 2);
        assert_eq!(f["official_agree"], 1);
        assert_eq!(f["official_disagreements"], json!(["r-2"]));
        assert_eq!(f["environment_build_s"], 60.0);
        // (60 s + 60 s) over 3 instances, in minutes.
        assert!((f["slot_minutes_per_instance"].as_f64().unwrap() - 2.0 / 3.0).abs() < 1e-9);
        let table = markdown_table(&[
            json!({"repo": "r/r", "instances": 3, "gold_resolved": 2, "official_agree": 1, "official_compared": 2, "wall_s": 120.0, "environment_build_s": 60.0, "slot_minutes_per_instance": 0.5, "disk_bytes": 2_000_000_000u64, "flaky": ["r-2"]}),
        ]);
        assert!(
            table.contains("| r/r | 2/3 | 1/2 | 2.0 min | 1.0 min | 0.50 | 2.00 GB | r-2 |"),
            "{table}"
        );
    }

    #[test]
    fn a_partial_run_replaces_its_instances_records_and_keeps_the_others() {
        let earlier = "{\"instance_id\":\"a-1\",\"gold_resolved\":false}\n{\"instance_id\":\"a-3\",\"gold_resolved\":true}\n";
        let new = [
            json!({"instance_id": "a-2", "gold_resolved": true}),
            json!({"instance_id": "a-1", "gold_resolved": true}),
        ];
        let merged: Vec<Value> = merged_records(earlier, &new)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let ids: Vec<&str> = merged
            .iter()
            .map(|r| r["instance_id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["a-1", "a-2", "a-3"]);
        assert_eq!(merged[0]["gold_resolved"], true);
        assert_eq!(merged[2]["gold_resolved"], true);
    }

    #[test]
    fn instance_ids_narrow_the_rows_and_an_unknown_id_is_refused() {
        let repo = |short: &str, ids: &[&str]| Repo {
            short: short.into(),
            name: format!("{short}/{short}"),
            tarball: PathBuf::new(),
            rows: ids
                .iter()
                .map(|i| json!({"instance_id": i}).to_string())
                .collect(),
        };
        let repos = || vec![repo("a", &["a-1", "a-2"]), repo("b", &["b-1"])];
        let only = only_instances(repos(), &BTreeSet::from(["a-2".to_string()])).unwrap();
        assert_eq!(only.len(), 1);
        assert_eq!(only[0].rows.len(), 1);
        assert!(only[0].rows[0].contains("a-2"));
        assert_eq!(only_instances(repos(), &BTreeSet::new()).unwrap().len(), 2);
        let err = only_instances(repos(), &BTreeSet::from(["c-9".to_string()])).unwrap_err();
        assert!(format!("{err}").contains("c-9"));
    }
}
