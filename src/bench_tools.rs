//! `reprobench bench tools`: the repository tools of the built-in agents on a real checkout. The
//! code graph's build time and resident memory with N concurrent tasks, each building its own
//! graph (as before graphs were shared) or sharing one per commit (as agents do now), and grep's
//! latency per call. Each mode runs in a child process of its own, so its peak memory is its
//! own.

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use reprobench_agents::tools::{ToolBox, graph_builds};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::Instant;

/// How the N tasks of one measurement get their code graphs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GraphMode {
    /// Every task builds its own graph.
    Separate,
    /// Tasks of one commit share one graph.
    Shared,
}

/// Options of `reprobench bench tools`.
#[derive(Args)]
pub struct ToolsBenchArgs {
    /// A checkout of a Python repository (e.g. django or sympy at a base commit).
    #[arg(long, value_name = "DIR")]
    repo: PathBuf,
    /// Concurrent tasks on the one checkout.
    #[arg(long, default_value_t = 4)]
    tasks: usize,
    /// grep calls timed (five patterns in turn).
    #[arg(long, default_value_t = 25)]
    greps: usize,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Measure one mode in this process and print its JSON (how the benchmark runs its children).
    #[arg(long, value_enum, hide = true)]
    one_mode: Option<GraphMode>,
}

/// Patterns an agent greps for: definitions, raises, imports, a word.
const PATTERNS: [&str; 5] = [
    r"def get_\w+",
    r"class \w+Error",
    r"^import os",
    r"raise ValueError",
    r"TODO",
];

/// A line of /proc/self/status in MiB (`VmHWM`: peak resident, `VmRSS`: resident now).
fn status_mib(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn percentile(mut values: Vec<f64>, q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    values[((values.len() - 1) as f64 * q).round() as usize]
}

/// One mode, measured in this process.
fn measure(a: &ToolsBenchArgs, mode: GraphMode) -> Value {
    let rss_before = status_mib("VmRSS");
    let started = Instant::now();
    let boxes: Vec<ToolBox> = (0..a.tasks.max(1))
        .map(|_| match mode {
            GraphMode::Separate => ToolBox::new(&a.repo),
            GraphMode::Shared => ToolBox::shared(&a.repo, "bench/repo", "bench-commit"),
        })
        .collect();
    let files = std::thread::scope(|scope| {
        let handles: Vec<_> = boxes
            .iter()
            .map(|b| scope.spawn(|| b.graph().files().count()))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .max()
            .unwrap_or_default()
    });
    let graphs_s = started.elapsed().as_secs_f64();
    let rss_with_graphs = status_mib("VmRSS");
    let mut grep_ms = Vec::new();
    for i in 0..a.greps {
        let pattern = PATTERNS[i % PATTERNS.len()];
        let args = json!({"pattern": pattern, "max_hits": 50}).to_string();
        let t = Instant::now();
        let _ = boxes[0].call("grep", &args);
        grep_ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    json!({
        "mode": format!("{mode:?}").to_lowercase(),
        "tasks": boxes.len(),
        "python_files_parsed": files,
        "graph_builds": graph_builds(),
        "graphs_wall_s": graphs_s,
        "rss_mib_before": rss_before,
        "rss_mib_with_graphs": rss_with_graphs,
        "graph_rss_mib_per_task": (rss_with_graphs - rss_before) / boxes.len() as f64,
        "peak_rss_mib": status_mib("VmHWM"),
        "grep_ms_median": percentile(grep_ms.clone(), 0.5),
        "grep_ms_p90": percentile(grep_ms, 0.9),
    })
}

/// `reprobench bench tools`.
pub fn tools(a: ToolsBenchArgs) -> Result<()> {
    if !a.repo.is_dir() {
        bail!(
            "--repo {}: not a directory; give a checkout of a Python repository (e.g. `git clone ../shared/data/real/swt-slice/repos/django__django.git` after unpacking it, then `git checkout` a base commit)",
            a.repo.display()
        );
    }
    if let Some(mode) = a.one_mode {
        println!("{}", measure(&a, mode));
        return Ok(());
    }
    let exe = std::env::current_exe().context("finding this binary to run the measurements")?;
    let mut results = Vec::new();
    for mode in [GraphMode::Separate, GraphMode::Shared] {
        let out = std::process::Command::new(&exe)
            .args(["bench", "tools", "--repo"])
            .arg(&a.repo)
            .args(["--tasks", &a.tasks.to_string()])
            .args(["--greps", &a.greps.to_string()])
            .args(["--one-mode", &format!("{mode:?}").to_lowercase()])
            .output()
            .context("running a measurement")?;
        if !out.status.success() {
            bail!(
                "the {mode:?} measurement failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        results.push(serde_json::from_slice::<Value>(&out.stdout)?);
    }
    let report = json!({
        "repo": a.repo.display().to_string(),
        "separate": results[0],
        "shared": results[1],
        "peak_rss_ratio_shared_to_separate":
            results[1]["peak_rss_mib"].as_f64().unwrap_or(0.0)
                / results[0]["peak_rss_mib"].as_f64().unwrap_or(1.0).max(1e-9),
    });
    if a.json {
        println!("{report}");
    } else {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}
