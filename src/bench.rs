//! `reprobench bench …`: `scheduler` (on a real local cluster and, for scale, by the
//! discrete-event simulation over the same scheduling code), `eval` (harness overhead per
//! execution), `tables` (the analysis over a million rows), `preassess` (ltgdroid's K device
//! replicas), `grade` (the parity corpus and each parser family) and `slice` (the real SWT-bench
//! slice, and `--all` for the whole of it). The benchmarks of one crate's code live in that
//! crate (`reprobench_analysis::bench`, `reprobench_swt::bench`,
//! `reprobench_android::ltgdroid::bench`, `reprobench_gateway::bench`; `bench tools` in
//! `bench_tools`; the docker engine's disk, evictions and floor are
//! `reprobench_sandbox::docker::usage`'s): here are their arguments and printing, and the
//! benchmarks of the whole harness, which drive `reprobench` itself.

use crate::local::LocalCluster;
use anyhow::{Context, Result};
use clap::Args;
use reprobench_coordinator::core::CoreConfig;
use reprobench_coordinator::scheduler::Policy;
use reprobench_coordinator::sim::{SimConfig, simulate};
use reprobench_domain::kind::SlotSpec;
use reprobench_domain::synthetic::SyntheticDataset;
use reprobench_proto::v1::{ListRunsRequest, SubmitRunRequest, WatchRunRequest};
use reprobench_sandbox::docker::unix_now;
use reprobench_sandbox::docker::usage::{
    ContainerCreations, containers_wall_ms, engine_floor_ms, image_bytes, images_evicted_since,
    newest_instance_image, storage_driver,
};
use std::time::{Duration, Instant};

/// Options of the scheduler benchmark.
#[derive(Args)]
pub struct SchedulerBenchArgs {
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Tasks in the heterogeneous load.
    #[arg(long, default_value_t = 400)]
    tasks: u32,
    /// Mean task duration (ms) of the heterogeneous load.
    #[arg(long, default_value_t = 100.0)]
    mean_ms: f64,
    /// Nodes (each with --slots synthetic slots) for the heterogeneous load.
    #[arg(long, default_value_t = 4)]
    nodes: u32,
    /// Slots per node.
    #[arg(long, default_value_t = 2)]
    slots: u32,
    /// Zero-duration tasks pushed through the cluster to measure dispatch.
    #[arg(long, default_value_t = 20_000)]
    dispatch_tasks: u32,
    /// Simulated nodes.
    #[arg(long, default_value_t = 1000)]
    sim_nodes: u32,
    /// Simulated tasks.
    #[arg(long, default_value_t = 100_000)]
    sim_tasks: u32,
    /// Workload seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

struct Makespan {
    wall_s: f64,
    lower_bound_s: f64,
}

/// Runs the benchmark and prints its figures.
pub async fn scheduler(a: SchedulerBenchArgs) -> Result<()> {
    let say = |m: String| {
        if !a.json {
            eprintln!("{m}");
        }
    };
    say(format!(
        "heterogeneous load: synthetic:{}:{} on {} nodes × {} slots (synthetic tasks: timed sleeps, no agent runs)",
        a.tasks, a.mean_ms, a.nodes, a.slots
    ));
    let ours = makespan(&a, Policy::AffinityStealing)
        .await
        .context("heterogeneous load, affinity + stealing")?;
    say(format!(
        "  affinity + stealing:  makespan {:.2}s, lower bound {:.2}s",
        ours.wall_s, ours.lower_bound_s
    ));
    let base = makespan(&a, Policy::StaticRoundRobin)
        .await
        .context("heterogeneous load, static round-robin")?;
    say(format!(
        "  static round-robin:   makespan {:.2}s, lower bound {:.2}s",
        base.wall_s, base.lower_bound_s
    ));

    say(format!(
        "dispatch: {} zero-duration tasks through 2 nodes × 64 slots",
        a.dispatch_tasks
    ));
    let (dispatch_per_s, submit_s) = dispatch(&a).await.context("dispatch benchmark")?;
    say(format!(
        "  {dispatch_per_s:.0} tasks/s (submitting them took {submit_s:.2}s)"
    ));

    say(format!(
        "simulation: {} nodes × 2 slots, {} tasks, mean 100 ms",
        a.sim_nodes, a.sim_tasks
    ));
    let sim_cfg = SimConfig {
        nodes: a.sim_nodes,
        slots_per_node: 2,
        tasks: a.sim_tasks,
        mean_ms: 100.0,
        sigma: 1.0,
        keys: a.sim_nodes.max(1),
        seed: a.seed,
        policy: Policy::AffinityStealing,
    };
    let cpu0 = thread_cpu_s();
    let sim = simulate(&sim_cfg);
    let sim_cpu_s = thread_cpu_s() - cpu0;
    let sim_static = simulate(&SimConfig {
        policy: Policy::StaticRoundRobin,
        ..sim_cfg.clone()
    });
    say(format!(
        "  makespan ratio {:.3} (static {:.3}); scheduler {:.2} µs per task; whole simulation {:.2}s CPU; {} steals",
        sim.makespan_ratio,
        sim_static.makespan_ratio,
        sim.scheduler_us_per_task,
        sim_cpu_s,
        sim.steals
    ));
    let v = serde_json::json!({
        "makespan_ratio": ours.wall_s / ours.lower_bound_s,
        "makespan_ratio_static": base.wall_s / base.lower_bound_s,
        "makespan_s": ours.wall_s,
        "makespan_static_s": base.wall_s,
        "lower_bound_s": ours.lower_bound_s,
        "dispatch_tasks_per_s": dispatch_per_s,
        "dispatch_tasks": a.dispatch_tasks,
        "sim_nodes": a.sim_nodes,
        "sim_tasks": a.sim_tasks,
        "sim_makespan_ratio": sim.makespan_ratio,
        "sim_makespan_ratio_static": sim_static.makespan_ratio,
        "sim_cpu_us_per_task": sim.scheduler_us_per_task,
        "sim_total_cpu_s": sim_cpu_s,
        "sim_steals": sim.steals,
        "seed": a.seed,
    });
    print_figures(&v, a.json)?;
    Ok(())
}

fn sweep(name: &str, dataset: &str, seed: u64) -> String {
    format!(
        "name = \"{name}\"\ndatasets = [\"{dataset}\"]\nseed = {seed}\n[[agents]]\nname = \"synthetic\"\n"
    )
}

async fn makespan(a: &SchedulerBenchArgs, policy: Policy) -> Result<Makespan> {
    let dataset = format!("synthetic:{}:{}", a.tasks, a.mean_ms);
    let durations: Vec<f64> = SyntheticDataset::parse(&dataset)
        .expect("synthetic name")?
        .instances(a.seed)
        .iter()
        .map(|i| i.duration_ms as f64 / 1000.0)
        .collect();
    let slots = f64::from(a.nodes * a.slots);
    let lower_bound_s =
        (durations.iter().sum::<f64>() / slots).max(durations.iter().copied().fold(0.0, f64::max));
    let wall_s = timed_run(
        a.nodes,
        a.slots,
        policy,
        &sweep("bench-makespan", &dataset, a.seed),
    )
    .await?
    .0;
    Ok(Makespan {
        wall_s,
        lower_bound_s,
    })
}

async fn dispatch(a: &SchedulerBenchArgs) -> Result<(f64, f64)> {
    let dataset = format!("synthetic:{}:0", a.dispatch_tasks);
    let (wall_s, submit_s) = timed_run(
        2,
        64,
        Policy::AffinityStealing,
        &sweep("bench-dispatch", &dataset, a.seed),
    )
    .await?;
    Ok((f64::from(a.dispatch_tasks) / wall_s, submit_s))
}

/// Starts a fresh local cluster, waits for its nodes, submits the sweep and waits for the end.
/// Returns (seconds from accepted submission to the run's end, seconds the submission took).
async fn timed_run(nodes: u32, slots: u32, policy: Policy, sweep: &str) -> Result<(f64, f64)> {
    let dir = tempdir()?;
    let core = CoreConfig {
        policy,
        ..CoreConfig::default()
    };
    let spec = [SlotSpec {
        kind: reprobench_domain::registry::ExecutorKind::Synthetic,
        slots,
    }];
    let local = crate::local::LocalNodes {
        count: nodes,
        slots: spec.to_vec(),
        args: vec![],
    };
    let mut cluster = LocalCluster::start(&dir, &local, core).await?;
    let result = async {
        cluster
            .wait_for_nodes(nodes, Duration::from_secs(30))
            .await?;
        let mut c = cluster.address.run_client().await?;
        let t0 = Instant::now();
        let sub = c
            .submit_run(SubmitRunRequest {
                sweep_toml: sweep.into(),
                ..Default::default()
            })
            .await?
            .into_inner();
        let submit_s = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let mut stream = c
            .watch_run(WatchRunRequest {
                run_id: sub.run_id.clone(),
            })
            .await?
            .into_inner();
        while let Some(p) = stream.message().await? {
            if p.run.is_some_and(|r| r.state != "running") {
                break;
            }
        }
        let wall = t1.elapsed().as_secs_f64();
        let runs = c.list_runs(ListRunsRequest {}).await?.into_inner().runs;
        let run = runs
            .iter()
            .find(|r| r.run_id == sub.run_id)
            .context("the run vanished")?;
        anyhow::ensure!(
            run.state == "finished",
            "benchmark run ended as {}",
            run.state
        );
        Ok::<_, anyhow::Error>((wall, submit_s))
    }
    .await;
    cluster.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// A scratch directory for one benchmark, reachable by the unprivileged execution user.
fn tempdir() -> Result<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!(
        "reprobench-bench-{}",
        reprobench_coordinator::random_hex(6)
    ));
    std::fs::create_dir_all(&dir)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
    Ok(dir)
}

fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// Options of the evaluation benchmark.
#[derive(Args)]
pub struct EvalBenchArgs {
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Executor to measure [default: docker when available, else process].
    #[arg(long)]
    executor: Option<String>,
}

/// Prints a benchmark's figures: one JSON line with `--json`, indented JSON otherwise.
fn print_figures(v: &serde_json::Value, json: bool) -> Result<()> {
    if json {
        println!("{v}");
    } else {
        println!("{}", serde_json::to_string_pretty(v)?);
    }
    Ok(())
}

/// The median of `v` (NaN when empty): the 50th percentile, interpolated between the two middle
/// values of an even count.
fn median(v: Vec<f64>) -> f64 {
    reprobench_analysis::stats::percentile(&v, 50.0)
}

/// One `reprobench eval --predictions gold` of swt-mini in a scratch directory, as a child process.
fn gold_eval(
    scratch: &std::path::Path,
    executor: &str,
    nodes: u32,
) -> Result<(serde_json::Value, f64)> {
    let exe = std::env::current_exe()?;
    let t = Instant::now();
    let out = std::process::Command::new(exe)
        .args([
            "eval",
            "--dataset",
            "swt-mini",
            "--predictions",
            "gold",
            "--executor",
            executor,
            "--json",
            "--new",
        ])
        .args(["--local-nodes", &nodes.to_string(), "--slots-per-node", "1"])
        .arg("--data")
        .arg(scratch.join("data"))
        .arg("--cache-dir")
        .arg(scratch.join("cache"))
        .output()?;
    let wall = t.elapsed().as_secs_f64();
    anyhow::ensure!(
        out.status.success(),
        "gold evaluation failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((serde_json::from_slice(&out.stdout)?, wall))
}

/// `reprobench bench eval`.
pub async fn eval(a: EvalBenchArgs) -> Result<()> {
    let executor = match a.executor {
        Some(e) => e,
        None => crate::eval::auto_executor(&crate::NodeOptions::defaults(), a.json)
            .await
            .to_string(),
    };
    let say = |m: String| {
        if !a.json {
            eprintln!("{m}");
        }
    };
    let root = tempdir()?;
    say(format!(
        "warm-up: gold on swt-mini with the {executor} executor (builds environments; not measured)"
    ));
    gold_eval(&root.join("warm"), &executor, 2)?;
    // Each measured run gets a fresh cache of gold/base executions, so all six executions run;
    // environments (images, virtualenvs) stay warm.
    say("measuring: 1 node × 1 slot".into());
    let (one, wall_1) = gold_eval(&root.join("one"), &executor, 1)?;
    say("measuring: 2 nodes × 1 slot".into());
    let (_two, wall_2) = gold_eval(&root.join("two"), &executor, 2)?;
    anyhow::ensure!(
        one["resolved"] == 14,
        "gold did not resolve every instance: {one}"
    );
    let reports = std::path::PathBuf::from(one["reports"].as_str().unwrap_or_default());
    let (mut overhead, mut test) = (Vec::new(), Vec::new());
    for entry in std::fs::read_dir(&reports)?.flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path().join("report.json")) else {
            continue;
        };
        let r: serde_json::Value = serde_json::from_str(&text)?;
        for e in r["executions"]
            .as_object()
            .into_iter()
            .flat_map(|m| m.values())
        {
            let (Some(cmd), Some(over), Some(t)) = (
                e["command_ms"].as_f64(),
                e["overhead_ms"].as_f64(),
                e["test_ms"].as_f64(),
            ) else {
                continue;
            };
            if e["cached"] == true {
                continue;
            }
            test.push(t);
            overhead.push(cmd + over - t);
        }
    }
    let executions = test.len();
    let (overhead_ms_median, test_ms_median) = (median(overhead), median(test));
    let v = serde_json::json!({
        "executor": executor,
        "executions": executions,
        "overhead_ms_median": overhead_ms_median,
        "test_ms_median": test_ms_median,
        "overhead_ratio": overhead_ms_median / test_ms_median,
        "wall_1_node_s": wall_1,
        "wall_2_nodes_s": wall_2,
        "speedup_2_nodes": wall_1 / wall_2,
    });
    let _ = std::fs::remove_dir_all(&root);
    print_figures(&v, a.json)?;
    Ok(())
}

/// Options of the tables benchmark.
#[derive(Args)]
pub struct TablesBenchArgs {
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Result rows to generate.
    #[arg(long, default_value_t = 1_000_000)]
    rows: usize,
}

/// `reprobench bench tables`: builds the main and overlap tables over generated result rows
/// (`reprobench_analysis::bench`).
pub fn tables(a: TablesBenchArgs) -> Result<()> {
    let v = reprobench_analysis::bench::tables(a.rows)?;
    print_figures(&v, a.json)?;
    Ok(())
}

/// Options of the pre-assessment benchmark.
#[derive(Args)]
pub struct PreassessBenchArgs {
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Device replicas of the parallel run (K).
    #[arg(long, default_value_t = 4)]
    replicas: usize,
    /// Factor on every latency, to shorten the run; times are reported in model seconds.
    #[arg(long, default_value_t = 0.02)]
    scale: f64,
    /// Assumed latency of one LLM call, in model milliseconds.
    #[arg(long, default_value_t = 1000)]
    llm_latency_ms: u64,
    /// Reports to run (repeatable) [default: every android-sim report].
    #[arg(long = "report", value_name = "ID")]
    reports: Vec<String>,
    /// The android-sim suite [default: DATASETS/android-sim].
    #[arg(long, value_name = "DIR")]
    android_sim: Option<std::path::PathBuf>,
}

/// `reprobench bench preassess`.
pub async fn preassess(a: PreassessBenchArgs) -> Result<()> {
    use reprobench_android::ltgdroid::bench as pb;
    let dataset_dir = a
        .android_sim
        .unwrap_or_else(|| reprobench_domain::swt::default_datasets_dir().join("android-sim"));
    let opts = pb::PreassessOptions {
        dataset_dir,
        replicas: a.replicas.max(1),
        scale: a.scale,
        llm_latency_ms: a.llm_latency_ms,
        reports: a.reports,
    };
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} preassess {msg} [{elapsed}]")
            .expect("a valid progress template"),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    let figures = pb::run(&opts, |id| {
        bar.set_message(format!("{id}: K=1, then K={}", opts.replicas))
    })
    .await?;
    bar.finish_and_clear();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&figures)?);
        return Ok(());
    }
    println!(
        "ltgdroid pre-assessment on the simulator (latency model scaled by {}; LLM: {}, {} ms per call assumed)",
        figures.scale, figures.llm, figures.llm_latency_ms
    );
    println!(
        "{:<18} {:>9} {:>9} {:>8} {:>8}  same",
        "report",
        "K=1 s",
        format!("K={} s", figures.replicas),
        "actions",
        "success"
    );
    for r in &figures.per_report {
        println!(
            "{:<18} {:>9.1} {:>9.1} {:>8} {:>8}  {}",
            r.report,
            r.k1.wall_s,
            r.kn.wall_s,
            r.k1.actions,
            r.k1.success && r.kn.success,
            r.same_trace
        );
    }
    println!(
        "mean wall per report: K=1 {:.1} s, K={} {:.1} s, speedup {:.2}; reproduced {}/{} and {}/{}",
        figures.wall_k1_s,
        figures.replicas,
        figures.wall_k4_s,
        figures.speedup,
        figures.success_k1,
        figures.reports,
        figures.success_k4,
        figures.reports
    );
    Ok(())
}

/// Options of the grading benchmark.
#[derive(Args)]
pub struct GradeBenchArgs {
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// A directory of grade directories with `expected.json` [default: ../shared/data/swt-parity].
    #[arg(long, value_name = "DIR")]
    corpus: Option<std::path::PathBuf>,
    /// Rounds over the corpus (the median round is reported).
    #[arg(long, default_value_t = 10)]
    rounds: usize,
    /// Size of the single-log measurement, in bytes.
    #[arg(long, default_value_t = 40 * 1024)]
    log_bytes: usize,
}

/// `reprobench bench grade`: cases per second of `grade` over a parity corpus (reading the files
/// and grading, then grading only), how many agree with SWT-bench's verdicts, and logs per second
/// of each parser family on one log of `--log-bytes`.
pub fn grade(a: GradeBenchArgs) -> Result<()> {
    let corpus = a
        .corpus
        .clone()
        .unwrap_or_else(|| std::path::PathBuf::from("../shared/data/swt-parity"));
    let dirs = reprobench_swt::bench::corpus_cases(&corpus).with_context(|| {
        format!(
            "cannot read the corpus {}; pass --corpus DIR (grade directories with expected.json)",
            corpus.display()
        )
    })?;
    anyhow::ensure!(
        !dirs.is_empty(),
        "{}: no grade directory in it",
        corpus.display()
    );
    let mut v = reprobench_swt::bench::grade(&dirs, a.rounds, a.log_bytes)?;
    v["corpus"] = corpus.display().to_string().into();
    print_figures(&v, a.json)?;
    Ok(())
}

/// Options of the real-slice benchmark.
#[derive(Args)]
pub struct SliceBenchArgs {
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// The real SWT-bench slice (rows.jsonl, membership.json, repos/, predictions/) [default: ../shared/data/real/swt-slice].
    #[arg(long, value_name = "DIR")]
    slice: Option<std::path::PathBuf>,
    /// Repositories whose SWT-bench instances are run (short names: requests, flask, pytest, sympy, ...)
    /// [default: requests,flask,pytest; with --all, every repository of the slice].
    #[arg(long, value_delimiter = ',')]
    repos: Vec<String>,
    /// The whole slice, repository by repository: gold, then the predictions (AssertFlip's)
    /// under the rules of their time against every official verdict in SLICE/verdicts; resumable
    /// (the work directory is durable); per-instance key fields to --record; the README table.
    #[arg(long)]
    all: bool,
    /// Only these instances of the chosen repositories (repeatable or comma-separated); with
    /// --all, records of other instances already in --record DIR are kept.
    #[arg(long = "instance-id", value_name = "ID", value_delimiter = ',')]
    instance_ids: Vec<String>,
    /// SWT-bench Lite as a whole from the records in --record DIR (every Lite instance of the
    /// slice: recorded or not, gold resolved, slot time per instance beside SWE-bench's
    /// published cost); runs nothing.
    #[arg(long)]
    lite_figures: bool,
    /// With --all: run gold N times and list the instances whose verdict changed (flaky tests).
    #[arg(long, value_name = "N", default_value_t = 1)]
    repeat_gold: u32,
    /// With --all: write per-instance key fields to DIR/slice-REPO.jsonl after each repository
    /// [default: docs/gold-validation when it exists here].
    #[arg(long, value_name = "DIR")]
    record: Option<std::path::PathBuf>,
    /// With --all: run the tests untraced (no coverage figures; faster).
    #[arg(long)]
    no_coverage: bool,
    /// With --all: seconds per execution before it is killed [default: eval's].
    #[arg(long, value_name = "S")]
    timeout_s: Option<u64>,
    /// Executor: process or docker [default: docker when the engine and the base image are there].
    #[arg(long, value_name = "KIND")]
    executor: Option<String>,
    /// Predictions run once gold and base are cached (SWT-bench format) [default: SLICE/predictions/AssertFlip.jsonl].
    #[arg(long, value_name = "FILE")]
    predictions: Option<std::path::PathBuf>,
    /// Gold validation only: one cold gold evaluation on `--nodes` nodes, its figures per repository.
    #[arg(long)]
    gold_only: bool,
    /// What preparing executions ahead buys, without the warm gold runs: the cold gold run
    /// (resumed from --work), the predictions once (their base runs cached), then the
    /// predictions again without and with each way of preparing ahead, on 1 node and on 2.
    #[arg(long, conflicts_with = "gold_only")]
    ahead_only: bool,
    /// Only these arms of the comparison of preparing ahead (docker: without, booted_only,
    /// within_task, with, with_always; process: without, within_task, with) [default: all].
    #[arg(long, value_delimiter = ',', value_name = "ARMS")]
    arms: Vec<String>,
    /// Node counts of the comparison of preparing ahead, each arm on each.
    #[arg(long, value_delimiter = ',', value_name = "N", default_values_t = [1u32, 2])]
    arm_nodes: Vec<u32>,
    /// Local nodes (one slot each) of the `--gold-only` evaluation.
    #[arg(long, default_value_t = 2)]
    nodes: u32,
    /// Keep mirrors, caches and reports in DIR instead of a scratch directory removed after; running
    /// again with the same DIR resumes (finished instances are not run again).
    #[arg(long, value_name = "DIR")]
    work: Option<std::path::PathBuf>,
    /// Official per-instance verdicts of the predictions ({"instances": {ID: {"resolved": bool}}})
    /// to compare with [default: SLICE/verdicts/AssertFlip-requests-flask-pytest.json].
    #[arg(long, value_name = "FILE")]
    verdicts: Option<std::path::PathBuf>,
}

/// How a run's verdicts compare with official ones, per repository, with every disagreement and
/// what its report says. Instances without an official verdict are not compared.
fn official_agreement(run: &serde_json::Value, official: &serde_json::Value) -> serde_json::Value {
    let reports = std::path::PathBuf::from(run["reports"].as_str().unwrap_or_default());
    let mut by_repo: std::collections::BTreeMap<String, (u32, u32)> = Default::default();
    let mut disagreements = Vec::new();
    for entry in std::fs::read_dir(&reports).into_iter().flatten().flatten() {
        let Some(r) = std::fs::read(entry.path().join("report.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        else {
            continue;
        };
        let id = r["instance_id"].as_str().unwrap_or_default();
        let Some(expected) = official["instances"][id]["resolved"].as_bool() else {
            continue;
        };
        let repo = id
            .rsplit_once('-')
            .map_or(id.to_string(), |(p, _)| p.replacen("__", "/", 1));
        let e = by_repo.entry(repo).or_default();
        e.0 += 1;
        let ours = r["resolved"] == true;
        if ours == expected {
            e.1 += 1;
        } else {
            disagreements.push(serde_json::json!({
                "instance_id": id,
                "official_resolved": expected,
                "reprobench_resolved": ours,
                "verdict": r["verdict"],
                "error_class": r["error_class"],
                "message": r["message"],
                "suspicious": r["suspicious"],
            }));
        }
    }
    let (compared, agree) = by_repo
        .values()
        .fold((0, 0), |(c, a), (n, ok)| (c + n, a + ok));
    serde_json::json!({
        "compared": compared,
        "agree": agree,
        "by_repo": by_repo
            .into_iter()
            .map(|(repo, (n, ok))| (repo, serde_json::json!({"compared": n, "agree": ok})))
            .collect::<serde_json::Map<_, _>>(),
        "disagreements": disagreements,
    })
}

/// Gold validation per repository: instances, resolved, and for each unresolved instance what
/// its report says (error class and message, or the test categories).
fn gold_by_repo(run: &serde_json::Value) -> serde_json::Value {
    let reports = std::path::PathBuf::from(run["reports"].as_str().unwrap_or_default());
    let mut by_repo: std::collections::BTreeMap<String, (u32, u32, Vec<serde_json::Value>)> =
        Default::default();
    for entry in std::fs::read_dir(&reports).into_iter().flatten().flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path().join("report.json")) else {
            continue;
        };
        let Ok(r) = serde_json::from_str::<serde_json::Value>(&text) else {
            continue;
        };
        let id = r["instance_id"].as_str().unwrap_or_default().to_string();
        let repo = id
            .rsplit_once('-')
            .map_or(id.clone(), |(p, _)| p.replacen("__", "/", 1));
        let e = by_repo.entry(repo).or_default();
        e.0 += 1;
        if r["resolved"] == true {
            e.1 += 1;
        } else {
            e.2.push(serde_json::json!({
                "instance_id": id,
                "verdict": r["verdict"],
                "error_class": r["error_class"],
                "message": r["message"],
                "applied": r["patch_successfully_applied"],
                "f2p": r["f2p"], "f2x": r["f2x"], "p2p": r["p2p"],
                "added_f2f_tests": r["added_f2f_tests"],
                "added_p2f_tests": r["added_p2f_tests"],
            }));
        }
    }
    by_repo
        .into_iter()
        .map(|(repo, (n, ok, bad))| {
            (
                repo,
                serde_json::json!({"instances": n, "resolved": ok, "unresolved": bad}),
            )
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// One `reprobench eval` as a child process: its JSON and its wall time.
fn slice_eval(
    root: &std::path::Path,
    rows: &std::path::Path,
    predictions: &str,
    executor: &str,
    nodes: u32,
    data: &str,
    extra: &[&str],
) -> Result<(serde_json::Value, f64)> {
    let exe = std::env::current_exe()?;
    let t = Instant::now();
    let out = std::process::Command::new(exe)
        .arg("eval")
        .arg("--dataset")
        .arg(rows)
        .args([
            "--predictions",
            predictions,
            "--executor",
            executor,
            "--json",
        ])
        .args(["--local-nodes", &nodes.to_string(), "--slots-per-node", "1"])
        .arg("--data")
        .arg(root.join(data))
        .arg("--cache-dir")
        .arg(root.join("cache"))
        .arg("--repos")
        .arg(root.join("repos"))
        .args(extra)
        .output()?;
    let wall = t.elapsed().as_secs_f64();
    anyhow::ensure!(
        out.status.success(),
        "evaluation failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((serde_json::from_slice(&out.stdout)?, wall))
}

/// Per-execution figures of a run's reports: executions run (not from the cache), the harness
/// overhead ms and test command ms of each, and the ms of each phase summed over them.
pub(crate) struct ExecutionFigures {
    pub(crate) run: usize,
    overhead: Vec<f64>,
    test: Vec<f64>,
    /// CPU ms of the test commands that report it (docker), and how many do.
    test_cpu: Vec<f64>,
    phases: Vec<(String, f64)>,
    /// Executions whose tree was staged ahead (an `ahead` phase in their timeline).
    staged_ahead: usize,
    /// Executions that took a container booted ahead (docker: their `create` phase is 0).
    booted_ahead: usize,
}

impl ExecutionFigures {
    /// `Σ test-command time / (wall × slots)`: the share of the slots' time the tests ran.
    pub(crate) fn efficiency(&self, wall_s: f64, slots: usize) -> f64 {
        self.test.iter().sum::<f64>() / (wall_s * 1000.0 * slots.max(1) as f64)
    }

    /// Seconds of CPU of the test commands, when every execution run reported its own.
    pub(crate) fn command_cpu_s(&self) -> Option<f64> {
        (self.run > 0 && self.test_cpu.len() == self.run)
            .then(|| self.test_cpu.iter().sum::<f64>() / 1000.0)
    }

    /// Milliseconds of every phase of every execution run.
    pub(crate) fn phases_ms(&self) -> f64 {
        self.phases.iter().map(|(_, ms)| ms).sum()
    }

    /// The phases' total ms, in the order they first appeared, with their share of all.
    pub(crate) fn phases_json(&self) -> serde_json::Value {
        let all = self.phases_ms();
        self.phases
            .iter()
            .map(|(name, ms)| {
                serde_json::json!({
                    "phase": name,
                    "total_s": (ms / 100.0).round() / 10.0,
                    "share": if all > 0.0 { (ms / all * 1000.0).round() / 1000.0 } else { 0.0 },
                })
            })
            .collect()
    }
}

pub(crate) fn execution_figures(v: &serde_json::Value) -> ExecutionFigures {
    let reports = std::path::PathBuf::from(v["reports"].as_str().unwrap_or_default());
    let (mut run, mut overhead, mut test, mut test_cpu) = (0, Vec::new(), Vec::new(), Vec::new());
    let (mut staged_ahead, mut booted_ahead) = (0, 0);
    let mut phases: Vec<(String, f64)> = Vec::new();
    for entry in std::fs::read_dir(&reports).into_iter().flatten().flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path().join("report.json")) else {
            continue;
        };
        let Ok(r) = serde_json::from_str::<serde_json::Value>(&text) else {
            continue;
        };
        for e in r["executions"]
            .as_object()
            .into_iter()
            .flat_map(|m| m.values())
        {
            if e["cached"] == true {
                continue;
            }
            run += 1;
            for t in e["timings"].as_array().into_iter().flatten() {
                let (Some(name), Some(ms)) = (t["phase"].as_str(), t["ms"].as_f64()) else {
                    continue;
                };
                staged_ahead += usize::from(name == "ahead");
                booted_ahead += usize::from(name == "create" && ms == 0.0);
                match phases.iter_mut().find(|(n, _)| n == name) {
                    Some((_, total)) => *total += ms,
                    None => phases.push((name.to_string(), ms)),
                }
            }
            if let (Some(cmd), Some(over), Some(t)) = (
                e["command_ms"].as_f64(),
                e["overhead_ms"].as_f64(),
                e["test_ms"].as_f64(),
            ) {
                test.push(t);
                overhead.push(cmd + over - t);
            }
            if let Some(cpu) = e["test_cpu_ms"].as_f64() {
                test_cpu.push(cpu);
            }
        }
    }
    ExecutionFigures {
        run,
        overhead,
        test,
        test_cpu,
        phases,
        staged_ahead,
        booted_ahead,
    }
}

/// Bytes under a directory (`du -sb`), 0 when it cannot be read.
pub(crate) fn dir_bytes(p: &std::path::Path) -> u64 {
    let out = std::process::Command::new("du")
        .args(["-sb"])
        .arg(p)
        .output();
    out.ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// The engine's floor, measured now: the median wall of one container and the machine's CPU
/// time per container (every process, the CLI's included), the harness's median overhead per
/// execution as a multiple of the wall, and the boot's copy per repository of `repos`
/// ([`boot_copy_json`]) (docker only; nulls otherwise).
fn engine_floor_json(
    executor: &str,
    overhead_ms_median: f64,
    repos: &[String],
) -> serde_json::Value {
    const RUNS: usize = 15;
    let before = MachineCpu::now();
    let floor = (executor == "docker")
        .then(|| engine_floor_ms(reprobench_sandbox::docker::DEFAULT_BASE_IMAGE, RUNS))
        .flatten();
    let cpu_s = floor.and_then(|_| Some(MachineCpu::now()?.busy_s - before?.busy_s));
    serde_json::json!({
        "engine_floor_ms_median": floor,
        "engine_floor_cpu_s_per_container": cpu_s.map(|s| s / RUNS as f64),
        "overhead_over_engine_floor": floor.map(|f| overhead_ms_median / f),
        // fuse-overlayfs serves every file a container reads from its image in a user-space
        // process, outside the container's CPU: the figures depend on it.
        "storage_driver": (executor == "docker").then(storage_driver).flatten(),
        "boot_copy": if executor == "docker" { boot_copy_json(repos) } else { serde_json::Value::Null },
    })
}

/// What giving a container's stage its tree costs at boot, on the newest instance image of each
/// repository in `repos`: machine CPU seconds and median wall per container (10 in a row, with
/// the executions' options: read-only root, no network, no log, an init, `/stage` a tmpfs) of
/// an empty container, of copying the image's tree file by file (a tar pipe from `/testbed`, as
/// boots did before 7d42b60), and of unpacking the image's archive of it (as they do now).
fn boot_copy_json(repos: &[String]) -> serde_json::Value {
    use reprobench_sandbox::docker::{WORKDIR, unpack_into_stage};
    const RUNS: usize = 10;
    let options = [
        "--read-only",
        "--network",
        "none",
        "--log-driver",
        "none",
        "--init",
        "--user",
        "0:0",
        "--tmpfs",
        "/stage:rw,exec,mode=0700",
    ];
    let ways = [
        ("empty", "true".to_string()),
        (
            "tree_copied",
            format!("mkdir /stage/repo && tar -C {WORKDIR} -cf - . | tar -C /stage/repo -xpf -"),
        ),
        ("archive_unpacked", unpack_into_stage()),
    ];
    let mut by_repo = serde_json::Map::new();
    for repo in repos {
        let Some(image) = newest_instance_image(repo) else {
            continue;
        };
        let mut figures = serde_json::Map::new();
        figures.insert("image".into(), image.clone().into());
        for (way, script) in &ways {
            let before = MachineCpu::now();
            let wall = containers_wall_ms(&image, &options, &["sh", "-c", script], RUNS);
            let cpu_s = wall.and_then(|_| Some(MachineCpu::now()?.busy_s - before?.busy_s));
            figures.insert(
                way.to_string(),
                serde_json::json!({
                    "cpu_s_per_container": cpu_s.map(|s| s / RUNS as f64),
                    "wall_ms_median": wall,
                }),
            );
        }
        by_repo.insert(repo.clone(), figures.into());
    }
    by_repo.into()
}

/// Which profile this binary was built with: `debug` or `release`.
fn harness_build() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// The machine's CPU time so far, summed over its cores (`/proc/stat`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct MachineCpu {
    /// Seconds some process or the kernel ran (user, nice, system, irq, softirq, steal).
    busy_s: f64,
    /// Seconds in all, idle and waiting on IO included.
    all_s: f64,
    /// CPU seconds of this process's children that were waited for, and of theirs: an
    /// evaluation's own processes (its coordinator, nodes and what they ran on the host; not
    /// a container's processes, which the engine starts).
    children_s: f64,
    /// CPU seconds of the Docker engine's containers, removed ones included (their parent
    /// cgroup), where it can be read.
    containers_s: Option<f64>,
}

impl MachineCpu {
    /// Reads `/proc/stat` now; `None` where there is none.
    pub(crate) fn now() -> Option<MachineCpu> {
        // SAFETY: sysconf only reads a configuration value.
        let ticks_per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        let text = std::fs::read_to_string("/proc/stat").ok()?;
        let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: getrusage writes a whole rusage into the buffer it is given.
        let usage = unsafe {
            (libc::getrusage(libc::RUSAGE_CHILDREN, usage.as_mut_ptr()) == 0)
                .then(|| usage.assume_init())
        }?;
        let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        Some(MachineCpu {
            children_s: seconds(usage.ru_utime) + seconds(usage.ru_stime),
            containers_s: reprobench_sandbox::docker::usage::containers_cpu_s(),
            ..MachineCpu::parse(&text, ticks_per_s as f64)?
        })
    }

    /// The totals of `/proc/stat`'s first (`cpu`) line, in seconds at `ticks_per_s`.
    fn parse(proc_stat: &str, ticks_per_s: f64) -> Option<MachineCpu> {
        let line = proc_stat.lines().find(|l| l.starts_with("cpu "))?;
        let ticks: Vec<f64> = line
            .split_whitespace()
            .skip(1)
            .map(|t| t.parse().ok())
            .collect::<Option<_>>()?;
        if ticks.len() < 8 || ticks_per_s <= 0.0 {
            return None;
        }
        // user nice system idle iowait irq softirq steal (guest time is within user and nice).
        let busy = ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6] + ticks[7];
        Some(MachineCpu {
            busy_s: busy / ticks_per_s,
            all_s: (busy + ticks[3] + ticks[4]) / ticks_per_s,
            children_s: 0.0,
            containers_s: None,
        })
    }

    /// Where the machine's CPU went from `self` to `later` during a run of `executions`
    /// executions whose test commands took `command_s` in all: busy seconds, their share of
    /// all, and per execution the busy seconds, those beyond the commands' own time, and those
    /// of the evaluation's own processes. On docker, with the commands' own CPU
    /// (`command_cpu_s`, when every execution reported it) and the containers' CPU read, it
    /// splits the rest too: the containers' scripts (copies, patches, seal, unpacking) and the
    /// engine with whatever else ran.
    fn spent_until(
        &self,
        later: &MachineCpu,
        executions: usize,
        command_s: f64,
        command_cpu_s: Option<f64>,
    ) -> serde_json::Value {
        let busy = later.busy_s - self.busy_s;
        let all = later.all_s - self.all_s;
        let per = |s: f64| s / executions.max(1) as f64;
        let harness = later.children_s - self.children_s;
        let mut v = serde_json::json!({
            "busy_s": busy,
            "busy_share": if all > 0.0 { busy / all } else { 0.0 },
            "busy_s_per_execution": per(busy),
            "busy_s_beyond_commands_per_execution": per(busy - command_s),
            "harness_processes_s_per_execution": per(harness),
        });
        if let Some(containers) = self
            .containers_s
            .zip(later.containers_s)
            .map(|(a, b)| b - a)
        {
            v["containers_s_per_execution"] = per(containers).into();
            v["engine_and_rest_s_per_execution"] = per(busy - containers - harness).into();
            if let Some(commands) = command_cpu_s {
                v["commands_cpu_s_per_execution"] = per(commands).into();
                v["container_scripts_s_per_execution"] = per(containers - commands).into();
            }
        }
        v
    }
}

/// `bench slice --all`'s options from the command line.
fn all_options(
    a: &SliceBenchArgs,
    slice: std::path::PathBuf,
    executor: String,
) -> Result<crate::slice_all::AllOptions> {
    let mut eval_args = Vec::new();
    if a.no_coverage {
        eval_args.push("--no-coverage".to_string());
    }
    if let Some(t) = a.timeout_s {
        eval_args.extend(["--timeout-s".to_string(), t.to_string()]);
    }
    let work = a
        .work
        .clone()
        .unwrap_or_else(|| std::path::PathBuf::from("/var/tmp/reprobench-slice-all"));
    let record = a.record.clone().or_else(|| {
        let d = std::path::PathBuf::from("docs/gold-validation");
        d.is_dir().then_some(d)
    });
    Ok(crate::slice_all::AllOptions {
        slice,
        repos: a.repos.clone(),
        instance_ids: a.instance_ids.iter().cloned().collect(),
        executor,
        nodes: a.nodes,
        work: std::path::absolute(&work)?,
        record,
        repeat_gold: a.repeat_gold,
        gold_only: a.gold_only,
        predictions: a.predictions.clone(),
        eval_args,
        json: a.json,
    })
}

/// `bench slice --gold-only`: gold on `nodes` local nodes, with where the executions' time went.
fn gold_validation(
    root: &std::path::Path,
    rows: &std::path::Path,
    executor: &str,
    nodes: u32,
    repos: &[String],
) -> Result<serde_json::Value> {
    let (gold, wall) = slice_eval(root, rows, "gold", executor, nodes, "data-gold", &[])?;
    let figures = execution_figures(&gold);
    let ExecutionFigures {
        run,
        overhead,
        test,
        ..
    } = &figures;
    let (overhead_ms_median, test_ms_median) = (median(overhead.clone()), median(test.clone()));
    let (overhead_sum, test_sum): (f64, f64) = (overhead.iter().sum(), test.iter().sum());
    Ok(serde_json::json!({
        "executions_run": run,
        "efficiency": figures.efficiency(wall, nodes as usize),
        "phases": figures.phases_json(),
        "overhead_ms_median": overhead_ms_median,
        "test_ms_median": test_ms_median,
        "overhead_ratio_median": overhead_ms_median / test_ms_median,
        "overhead_ratio_total": overhead_sum / test_sum,
        "executor": executor,
        "nodes": nodes,
        "gold_resolved": gold["resolved"],
        "wall_s": wall,
        "resumed": gold["resumed"],
        "mean_coverage": gold["mean_coverage"],
        "mean_coverage_delta": gold["mean_coverage_delta"],
        "by_repo": gold_by_repo(&gold),
        "reports": gold["reports"],
        "engine": engine_floor_json(executor, overhead_ms_median, repos),
    }))
}

/// Agreement of the predictions' run `preds` with the official verdicts (`--verdicts`, else the
/// slice's AssertFlip verdicts of requests, flask and pytest; null when there are none).
fn official_verdicts(
    a: &SliceBenchArgs,
    slice: &std::path::Path,
    preds: &serde_json::Value,
) -> Result<serde_json::Value> {
    let verdicts_file = a
        .verdicts
        .clone()
        .unwrap_or_else(|| slice.join("verdicts/AssertFlip-requests-flask-pytest.json"));
    Ok(match std::fs::read(&verdicts_file) {
        Ok(bytes) => {
            let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
                anyhow::anyhow!("{}: not a verdicts file: {e}", verdicts_file.display())
            })?;
            let mut agreement = official_agreement(preds, &v);
            agreement["file"] = verdicts_file.display().to_string().into();
            agreement
        }
        Err(e) if a.verdicts.is_some() => {
            anyhow::bail!("cannot read --verdicts {}: {e}", verdicts_file.display())
        }
        Err(_) => serde_json::Value::Null,
    })
}

/// `reprobench bench slice`: gold validation of the real slice's instances of some repositories
/// (cold and warm, 1 and 2 local nodes), a prediction set once gold and base are cached, harness
/// overhead per execution against the test command's own time, the disk the environments use,
/// and the prediction set again without and with the next execution prepared ahead.
pub async fn slice(a: SliceBenchArgs) -> Result<()> {
    let slice = a
        .slice
        .clone()
        .unwrap_or_else(|| std::path::PathBuf::from("../shared/data/real/swt-slice"));
    if a.lite_figures {
        let records = a
            .record
            .clone()
            .unwrap_or_else(|| std::path::PathBuf::from("docs/gold-validation"));
        return crate::lite_figures::run(&records, &slice, a.json);
    }
    anyhow::ensure!(
        slice.join("rows.jsonl").is_file(),
        "{}: no rows.jsonl; pass --slice DIR (the real SWT-bench slice)",
        slice.display()
    );
    let executor = match a.executor.clone() {
        Some(e) => e,
        None => crate::eval::auto_executor(&crate::NodeOptions::defaults(), a.json)
            .await
            .to_string(),
    };
    if a.all {
        return crate::slice_all::run(&all_options(&a, slice, executor)?);
    }
    anyhow::ensure!(
        a.repeat_gold <= 1 && a.record.is_none() && !a.no_coverage && a.timeout_s.is_none(),
        "--repeat-gold, --record, --no-coverage and --timeout-s go with --all"
    );
    let repos = if a.repos.is_empty() {
        vec![
            "requests".to_string(),
            "flask".to_string(),
            "pytest".to_string(),
        ]
    } else {
        a.repos.clone()
    };
    let say = |m: String| {
        if !a.json {
            eprintln!("{m}");
        }
    };
    let root = match &a.work {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            std::fs::canonicalize(dir)?
        }
        None => tempdir()?,
    };
    // Mirrors of the chosen repositories, and their SWT-bench instances.
    let chosen = crate::slice_all::only_instances(
        crate::slice_all::slice_repos(&slice, &repos)?,
        &a.instance_ids.iter().cloned().collect(),
    )?;
    let tarballs: Vec<std::path::PathBuf> = chosen.iter().map(|r| r.tarball.clone()).collect();
    let wanted_repos: Vec<String> = chosen.iter().map(|r| r.name.clone()).collect();
    // Progress goes to stderr: stdout carries the benchmark's (JSON) result.
    reprobench_sandbox::mirrors::import_mirrors(&tarballs, &root.join("repos"), |l| {
        eprintln!("{l}")
    })?;
    let rows_text: String = chosen
        .iter()
        .flat_map(|r| &r.rows)
        .map(|l| format!("{l}\n"))
        .collect();
    let rows = root.join("rows.jsonl");
    std::fs::write(&rows, &rows_text)?;
    let instances = rows_text.lines().count();
    say(format!(
        "{instances} SWT-bench instances of {} with the {executor} executor",
        wanted_repos.join(", ")
    ));
    let started_unix = unix_now();
    let images_before = if executor == "docker" {
        image_bytes()
    } else {
        0
    };
    if a.gold_only {
        say(format!(
            "gold validation: {} local nodes, one slot each",
            a.nodes
        ));
        let mut v = gold_validation(&root, &rows, &executor, a.nodes, &wanted_repos)?;
        v["repos"] = wanted_repos.into();
        v["instances"] = instances.into();
        return finish_slice(&root, a.work.is_none(), &v, a.json);
    }
    say("gold, cold (builds every environment), 1 node".into());
    let (cold, wall_cold) = slice_eval(&root, &rows, "gold", &executor, 1, "data-cold", &[])?;
    let predictions = a
        .predictions
        .clone()
        .unwrap_or_else(|| slice.join("predictions/AssertFlip.jsonl"));
    if a.ahead_only {
        say(format!(
            "{} with gold cached, 1 node (caches their base runs)",
            predictions.display()
        ));
        let args = ["--rules", "swt-bench-2024"];
        let preds_file = predictions.display().to_string();
        let (preds, wall_preds) =
            slice_eval(&root, &rows, &preds_file, &executor, 1, "data-preds", &args)?;
        let v = serde_json::json!({
            "executor": executor,
            "repos": wanted_repos,
            "instances": instances,
            "gold_resolved": cold["resolved"],
            "wall_cold_1_node_s": wall_cold,
            "cold_resumed": cold["resumed"],
            "wall_new_predictions_s": wall_preds,
            "new_predictions_resumed": preds["resumed"],
            "new_predictions_resolved": preds["resolved"],
            "new_predictions_official_verdicts": official_verdicts(&a, &slice, &preds)?,
            "ahead": ahead_comparison(&root, &rows, &preds_file, &executor, &a.arms, &a.arm_nodes, &say)?,
        });
        let with_overhead = v["ahead"]["1_node"]["with"]["overhead_ms_median"].as_f64();
        let mut v = v;
        v["engine"] =
            engine_floor_json(&executor, with_overhead.unwrap_or(f64::NAN), &wanted_repos);
        return finish_slice(&root, a.work.is_none(), &v, a.json);
    }
    say("gold again: reuses the finished evaluation".into());
    let (again, wall_again) = slice_eval(&root, &rows, "gold", &executor, 1, "data-cold", &[])?;
    // Warm environments, every execution run again (a fresh execution cache each).
    let fresh_executions = |r: &std::path::Path| {
        let _ = std::fs::remove_dir_all(r.join("cache/swt-executions"));
    };
    fresh_executions(&root);
    say("gold, environments warm, 1 node".into());
    let (warm1, wall_warm_1) =
        slice_eval(&root, &rows, "gold", &executor, 1, "data-warm1", &["--new"])?;
    fresh_executions(&root);
    say("gold, environments warm, 2 nodes".into());
    let (_warm2, wall_warm_2) =
        slice_eval(&root, &rows, "gold", &executor, 2, "data-warm2", &["--new"])?;
    say(format!(
        "{} with gold and base cached, 1 node",
        predictions.display()
    ));
    let (preds, wall_preds) = slice_eval(
        &root,
        &rows,
        &predictions.display().to_string(),
        &executor,
        1,
        "data-preds",
        &["--rules", "swt-bench-2024"],
    )?;
    let official = official_verdicts(&a, &slice, &preds)?;
    let ahead = ahead_comparison(
        &root,
        &rows,
        &predictions.display().to_string(),
        &executor,
        &a.arms,
        &a.arm_nodes,
        &say,
    )?;
    let run_cold = execution_figures(&cold).run;
    let warm_figures = execution_figures(&warm1);
    let (overhead, test) = (&warm_figures.overhead, &warm_figures.test);
    let preds_figures = execution_figures(&preds);
    let run_preds = preds_figures.run;
    let (overhead_ms_median, test_ms_median) = (median(overhead.clone()), median(test.clone()));
    let (overhead_sum, test_sum): (f64, f64) = (overhead.iter().sum(), test.iter().sum());
    let disk = if executor == "docker" {
        image_bytes().saturating_sub(images_before)
    } else {
        dir_bytes(&root.join("cache/process"))
    };
    let v = serde_json::json!({
        "executor": executor,
        "repos": wanted_repos,
        "instances": instances,
        "gold_resolved": cold["resolved"],
        "gold_unresolved_ids": std::fs::read(std::path::Path::new(cold["reports"].as_str().unwrap_or_default()).join("summary.json")).ok().and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok()).map(|s| s["unresolved_ids"].clone()),
        "wall_cold_1_node_s": wall_cold,
        "wall_warm_1_node_s": wall_warm_1,
        "wall_warm_2_nodes_s": wall_warm_2,
        // A resumed cold run (--work kept from before) built nothing now.
        "cold_resumed": cold["resumed"],
        "environment_build_s": if cold["resumed"] == true { serde_json::Value::Null } else { (wall_cold - wall_warm_1).into() },
        "wall_rerun_s": wall_again,
        "rerun_resumed": again["resumed"],
        "executions_per_instance_gold_cold": run_cold as f64 / instances.max(1) as f64,
        "executions_per_instance_new_prediction": run_preds as f64 / instances.max(1) as f64,
        "wall_new_predictions_s": wall_preds,
        "new_predictions_efficiency": preds_figures.efficiency(wall_preds, 1),
        "new_predictions_phases": preds_figures.phases_json(),
        "warm_1_node_efficiency": warm_figures.efficiency(wall_warm_1, 1),
        "warm_1_node_phases": warm_figures.phases_json(),
        "new_predictions_resolved": preds["resolved"],
        "new_predictions_mean_coverage": preds["mean_coverage"],
        "new_predictions_mean_coverage_delta": preds["mean_coverage_delta"],
        "new_predictions_official_verdicts": official,
        "ahead": ahead,
        "gold_mean_coverage_delta": cold["mean_coverage_delta"],
        "overhead_ms_median": overhead_ms_median,
        "test_ms_median": test_ms_median,
        "overhead_ratio_median": overhead_ms_median / test_ms_median,
        "overhead_ratio_total": overhead_sum / test_sum,
        "engine": engine_floor_json(&executor, overhead_ms_median, &wanted_repos),
        "environment_disk_bytes": disk,
        "image_budget_gb": crate::NodeOptions::defaults().image_budget_gb,
        "images_evicted": if executor == "docker" { images_evicted_since(started_unix) } else { Vec::new() },
        "gold_by_repo": gold_by_repo(&cold),
    });
    finish_slice(&root, a.work.is_none(), &v, a.json)
}

/// The prediction runs without and with the next execution prepared ahead (process: its tree
/// staged, `--stage-ahead off`; docker: nothing ahead, `--no-boot-ahead`, then only its
/// container booted, `--stage-ahead off`, then its tree staged in it too; both: within a task
/// only, `--no-next-task-ahead`, then the next task's first execution too; docker last with
/// `--stage-ahead always`, whose boots and staging wait for no idle core), on 1 node and on 2,
/// the arms one after the other from the same cache (gold and base executions cached by the
/// run before): walls, efficiency and phases of each, and the wall ratios.
fn ahead_comparison(
    root: &std::path::Path,
    rows: &std::path::Path,
    predictions: &str,
    executor: &str,
    only_arms: &[String],
    node_counts: &[u32],
    say: &dyn Fn(String),
) -> Result<serde_json::Value> {
    let all_arms: &[(&str, &[&str])] = if executor == "docker" {
        &[
            ("without", &["--no-boot-ahead"]),
            (
                "booted_only",
                &["--stage-ahead", "off", "--no-next-task-ahead"],
            ),
            ("within_task", &["--no-next-task-ahead"]),
            ("with", &[]),
            ("with_always", &["--stage-ahead", "always"]),
        ]
    } else {
        &[
            ("without", &["--stage-ahead", "off"]),
            ("within_task", &["--no-next-task-ahead"]),
            ("with", &[]),
        ]
    };
    if node_counts.is_empty() || node_counts.contains(&0) {
        anyhow::bail!("--arm-nodes: give one or more node counts, each at least 1 (e.g. 1,2)");
    }
    let arms = chosen_arms(all_arms, only_arms, executor)?;
    let arms = arms.as_slice();
    let off_flag = all_arms[0].1;
    let mut by_nodes = serde_json::Map::new();
    for &nodes in node_counts {
        let order: Vec<String> = arms
            .iter()
            .map(|(name, flag)| format!("{name} ({})", flag.join(" ")))
            .collect();
        say(format!(
            "the same predictions again on {nodes} node(s), {} (the base runs cached for each)",
            order.join(", then ")
        ));
        let mut by_arm = serde_json::Map::new();
        let mut walls = Vec::new();
        for &(name, flag) in arms {
            let mut extra = vec!["--rules", "swt-bench-2024", "--new"];
            extra.extend(flag);
            let data = format!("data-preds-{nodes}-{name}");
            let cpu_before = MachineCpu::now();
            let creations = (executor == "docker")
                .then(ContainerCreations::start)
                .flatten();
            let (run, wall) = slice_eval(root, rows, predictions, executor, nodes, &data, &extra)?;
            let cpu_after = MachineCpu::now();
            // Every execution run took one container; the rest were booted ahead and not taken.
            let containers = creations.map(ContainerCreations::stop);
            let figures = execution_figures(&run);
            let command_s = figures.test.iter().sum::<f64>() / 1000.0;
            walls.push(wall);
            by_arm.insert(
                name.into(),
                serde_json::json!({
                    "containers_created": containers,
                    "containers_not_taken": containers.map(|c| c.saturating_sub(figures.run)),
                    "wall_s": wall,
                    "executions": figures.run,
                    "executions_staged_ahead": figures.staged_ahead,
                    "executions_booted_ahead": figures.booted_ahead,
                    "efficiency": figures.efficiency(wall, nodes as usize),
                    "overhead_ms_median": median(figures.overhead.clone()),
                    "test_ms_median": median(figures.test.clone()),
                    "phases": figures.phases_json(),
                    // The slots' time in no execution's phase: the run's start and end, the
                    // scheduling, grading and store writes between executions, an idle slot at the end.
                    "slot_s_outside_executions": wall * nodes as f64 - figures.phases_ms() / 1000.0,
                    "cpu": cpu_before.zip(cpu_after).map(|(b, a)| b.spent_until(&a, figures.run, command_s, figures.command_cpu_s())),
                    "resolved": run["resolved"],
                }),
            );
        }
        let wall_of = |arm: &str| {
            let i = arms.iter().position(|(name, _)| *name == arm);
            i.map(|i| walls[i])
        };
        if let (Some(with), Some(without)) = (wall_of("with"), wall_of("without")) {
            by_arm.insert("wall_ratio_with_to_without".into(), (with / without).into());
        }
        // What announcing the next task's first execution bought over preparing within a task.
        if let (Some(with), Some(within)) = (wall_of("with"), wall_of("within_task")) {
            by_arm.insert(
                "wall_ratio_with_to_within_task".into(),
                (with / within).into(),
            );
        }
        by_nodes.insert(format!("{nodes}_node"), by_arm.into());
    }
    let mut v = serde_json::Map::new();
    v.insert("off_flag".into(), off_flag.join(" ").into());
    v.insert(
        "cores".into(),
        std::thread::available_parallelism()
            .map_or(0, |n| n.get())
            .into(),
    );
    v.insert("harness_build".into(), harness_build().into());
    v.extend(by_nodes);
    Ok(v.into())
}

/// The arms of [`ahead_comparison`] named in `only` (all when empty), in their own order; an
/// error names an unknown arm and the executor's arms.
fn chosen_arms<'a>(
    all: &'a [(&'a str, &'a [&'a str])],
    only: &[String],
    executor: &str,
) -> Result<Vec<(&'a str, &'a [&'a str])>> {
    let names: Vec<&str> = all.iter().map(|(name, _)| *name).collect();
    if let Some(unknown) = only.iter().find(|o| !names.contains(&o.as_str())) {
        anyhow::bail!(
            "--arms: no arm {unknown:?} on the {executor} executor; its arms are {}",
            names.join(", ")
        );
    }
    Ok(all
        .iter()
        .filter(|(name, _)| only.is_empty() || only.iter().any(|o| o == name))
        .copied()
        .collect())
}

/// Removes the slice benchmark's scratch directory (unless `--work` named it) and prints its figures.
fn finish_slice(
    root: &std::path::Path,
    scratch: bool,
    v: &serde_json::Value,
    json: bool,
) -> Result<()> {
    if scratch {
        let _ = std::fs::remove_dir_all(root);
    }
    print_figures(v, json)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arms_of_the_ahead_comparison_are_chosen_by_name_in_their_own_order() {
        let all: &[(&str, &[&str])] = &[("without", &["--x"]), ("within_task", &[]), ("with", &[])];
        fn names<'a>(v: Vec<(&'a str, &'a [&'a str])>) -> Vec<&'a str> {
            v.into_iter().map(|(n, _)| n).collect()
        }
        assert_eq!(names(chosen_arms(all, &[], "process").unwrap()).len(), 3);
        let only = ["with".to_string(), "without".to_string()];
        assert_eq!(
            names(chosen_arms(all, &only, "process").unwrap()),
            ["without", "with"]
        );
        let err = chosen_arms(all, &["always".to_string()], "process").unwrap_err();
        assert!(
            err.to_string().contains("without, within_task, with"),
            "{err}"
        );
    }

    #[test]
    fn execution_figures_count_what_ran_ahead_and_skip_cached_executions() {
        let dir = tempfile::tempdir().unwrap();
        let timings = |phases: &[(&str, f64)]| {
            phases
                .iter()
                .map(|(p, ms)| serde_json::json!({"phase": p, "ms": ms}))
                .collect::<Vec<_>>()
        };
        let execution = |phases: &[(&str, f64)], test_ms: u64| {
            serde_json::json!({
                "cached": false, "command_ms": test_ms + 50, "overhead_ms": 100,
                "test_ms": test_ms, "test_cpu_ms": test_ms / 2, "timings": timings(phases),
            })
        };
        let report = serde_json::json!({"instance_id": "o__r-1", "executions": {
            // Booted on its path.
            "pred_pre": execution(&[("create", 40.0), ("boot", 200.0), ("go", 1.0), ("command", 900.0)], 800),
            // Booted ahead, its tree staged ahead.
            "pred_post": execution(&[("create", 0.0), ("boot", 0.0), ("ahead", 2.0), ("command", 700.0)], 600),
            // Booted ahead only.
            "base_pre": execution(&[("create", 0.0), ("boot", 0.0), ("go", 1.0), ("command", 300.0)], 200),
            "gold_pre": {"cached": true, "command_ms": 5, "overhead_ms": 0, "test_ms": 5,
                         "timings": timings(&[("create", 0.0), ("ahead", 1.0)])},
        }});
        std::fs::create_dir(dir.path().join("o__r-1")).unwrap();
        std::fs::write(
            dir.path().join("o__r-1/report.json"),
            serde_json::to_vec(&report).unwrap(),
        )
        .unwrap();
        let f = execution_figures(&serde_json::json!({"reports": dir.path()}));
        assert_eq!((f.run, f.staged_ahead, f.booted_ahead), (3, 1, 2));
        // The cached execution's CPU is not counted: (800 + 600 + 200) / 2 ms.
        assert_eq!(f.command_cpu_s(), Some(0.8));
        assert_eq!(
            f.phases_ms(),
            40.0 + 200.0 + 1.0 + 900.0 + 2.0 + 700.0 + 1.0 + 300.0
        );
        // Σ test / (wall × slots): 1.6 s of tests in 1 s on 2 slots.
        assert_eq!(f.efficiency(1.0, 2), 0.8);
    }

    #[test]
    fn machine_cpu_reads_busy_and_all_seconds_from_proc_stat() {
        let at = |user: u64, idle: u64| {
            format!("cpu  {user} 10 30 {idle} 5 1 2 3 7 0\ncpu0 1 2 3 4 5 6 7 8 0 0\nintr 1\n")
        };
        let close = |x: f64, y: f64| assert!((x - y).abs() < 1e-9, "{x} != {y}");
        let a = MachineCpu::parse(&at(100, 1000), 100.0).unwrap();
        let later = |m: MachineCpu, children_s: f64| MachineCpu { children_s, ..m };
        // busy: user, nice, system, irq, softirq, steal; all adds idle and iowait.
        close(a.busy_s, 1.46);
        close(a.all_s, 1.46 + 10.05);
        let b = later(MachineCpu::parse(&at(400, 1300), 100.0).unwrap(), 0.5);
        let spent = a.spent_until(&b, 2, 1.0, Some(0.8));
        let field = |k: &str| spent[k].as_f64().unwrap();
        close(field("busy_s"), 3.0);
        close(field("busy_share"), 0.5);
        close(field("busy_s_per_execution"), 1.5);
        close(field("busy_s_beyond_commands_per_execution"), 1.0);
        close(field("harness_processes_s_per_execution"), 0.25);
        // No containers' CPU read: no split of the rest.
        assert!(spent.get("containers_s_per_execution").is_none());
        // With the containers' 2 s: 1 s of it the commands', 1 s their scripts'; the engine
        // and the rest 3 - 2 - 0.5.
        let with_containers = |m: MachineCpu, s: f64| MachineCpu {
            containers_s: Some(s),
            ..m
        };
        let a = with_containers(a, 10.0);
        let b = with_containers(b, 12.0);
        let spent = a.spent_until(&b, 2, 1.0, Some(1.0));
        let field = |k: &str| spent[k].as_f64().unwrap();
        close(field("containers_s_per_execution"), 1.0);
        close(field("commands_cpu_s_per_execution"), 0.5);
        close(field("container_scripts_s_per_execution"), 0.5);
        close(field("engine_and_rest_s_per_execution"), 0.25);
        // Without every command's CPU, no split between commands and scripts.
        assert!(
            a.spent_until(&b, 2, 1.0, None)
                .get("container_scripts_s_per_execution")
                .is_none()
        );
        assert_eq!(MachineCpu::parse("intr 1\n", 100.0), None);
        assert_eq!(MachineCpu::parse("cpu  1 2 x 4 5 6 7 8\n", 100.0), None);
        assert!(MachineCpu::now().is_some_and(|c| c.all_s >= c.busy_s && c.busy_s > 0.0));
        // A child that spins counts in the children's CPU once it is waited for.
        let before = MachineCpu::now().unwrap().children_s;
        let status = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"])
            .status()
            .unwrap();
        assert!(status.success());
        assert!(MachineCpu::now().unwrap().children_s > before);
    }

    #[test]
    fn official_agreement_compares_only_instances_with_an_official_verdict() {
        let dir = tempfile::tempdir().unwrap();
        for (id, resolved) in [
            ("psf__requests-1", true),
            ("psf__requests-2", false),
            ("pallets__flask-3", true),
            ("sympy__sympy-4", true),
        ] {
            let d = dir.path().join(id);
            std::fs::create_dir_all(&d).unwrap();
            let report =
                serde_json::json!({"instance_id": id, "resolved": resolved, "verdict": "x"});
            std::fs::write(d.join("report.json"), report.to_string()).unwrap();
        }
        let official = serde_json::json!({"instances": {
            "psf__requests-1": {"resolved": true},
            "psf__requests-2": {"resolved": false},
            "pallets__flask-3": {"resolved": false},
            "pallets__flask-9": {"resolved": true},
        }});
        let run = serde_json::json!({"reports": dir.path().display().to_string()});
        let a = official_agreement(&run, &official);
        assert_eq!(
            (a["compared"].as_u64(), a["agree"].as_u64()),
            (Some(3), Some(2))
        );
        assert_eq!(a["by_repo"]["psf/requests"]["agree"], 2);
        assert_eq!(a["by_repo"]["pallets/flask"]["compared"], 1);
        assert!(a["by_repo"]["sympy/sympy"].is_null());
        let d = a["disagreements"].as_array().unwrap();
        assert_eq!(d.len(), 1);
        assert_eq!(d[0]["instance_id"], "pallets__flask-3");
        assert_eq!(d[0]["official_resolved"], false);
    }
}
