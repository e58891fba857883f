//! `bench preassess`: ltgdroid's wall time per report with pre-assessment on K = 1 and on K
//! device replicas, on the sim with its latency model, at equal success.
//!
//! The LLM is the guided scripted stand-in ([`super::guided`]) behind a fixed per-call delay:
//! it is not a model, and the figure measures the harness (device work and its overlap), not
//! reasoning. Latencies are scaled down by `scale` to keep the run short; wall times are
//! reported in model seconds (measured seconds divided by `scale`).

use super::guided::{GuidedShape, responder};
use super::{Config, Variant};
use crate::agent::AgentError;
use crate::agent::{Meter, ScriptedLlm};
use crate::device::Device;
use crate::device::DeviceError;
use crate::sim::{BugKind, Dataset, ModelError, SimDevice, SimLatency, replay};
use reprobench_domain::android::BugType;
use reprobench_gateway::llm::{AssistantTurn, Llm, LlmError};
use serde::Serialize;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Why a pre-assessment run could not give its figures.
#[derive(Debug, thiserror::Error)]
pub enum PreassessError {
    /// The simulator dataset did not load.
    #[error(transparent)]
    Dataset(#[from] ModelError),
    /// A chosen report is not in the dataset.
    #[error("no report `{report}` in {}; it has {}", dir.display(), known.join(", "))]
    UnknownReport {
        /// The report asked for.
        report: String,
        /// The dataset directory.
        dir: PathBuf,
        /// The reports it has.
        known: Vec<String>,
    },
    /// The report names an app the dataset has no model of.
    #[error("report {0} has no app")]
    NoApp(String),
    /// The agent failed on a report.
    #[error("{report}: {error}")]
    Agent {
        /// The report.
        report: String,
        /// What failed (in the message, not a `source()`, so it prints once).
        error: AgentError,
    },
    /// Replaying the agent's trace on a fresh device failed.
    #[error("{report}: replaying the trace: {error}")]
    Replay {
        /// The report.
        report: String,
        /// What failed (in the message, not a `source()`, so it prints once).
        error: DeviceError,
    },
}

/// A client that waits a fixed time before each answer (a stand-in for model latency).
#[derive(Clone)]
pub struct DelayedLlm<L> {
    inner: L,
    delay: Duration,
}

impl<L: Llm + Clone> DelayedLlm<L> {
    /// `inner` with `delay` before every answer.
    pub fn new(inner: L, delay: Duration) -> DelayedLlm<L> {
        DelayedLlm { inner, delay }
    }
}

impl<L: Llm> Llm for DelayedLlm<L> {
    async fn chat(
        &mut self,
        messages: &[Value],
        tools: &[Value],
    ) -> Result<AssistantTurn, LlmError> {
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        self.inner.chat(messages, tools).await
    }
}

/// Settings of the benchmark.
#[derive(Debug, Clone)]
pub struct PreassessOptions {
    /// The android-sim suite.
    pub dataset_dir: PathBuf,
    /// Replicas of the parallel run (K).
    pub replicas: usize,
    /// Factor applied to every latency (device and LLM) to shorten the run.
    pub scale: f64,
    /// Model-time latency of one LLM call, in milliseconds (an assumption, stated in the output).
    pub llm_latency_ms: u64,
    /// Reports to run (all when empty).
    pub reports: Vec<String>,
}

/// One report's run with a given number of replicas.
#[derive(Debug, Clone, Serialize)]
pub struct RunFigures {
    /// Wall time in model seconds.
    pub wall_s: f64,
    /// Whether the offered trace reproduces the bug on a fresh device.
    pub success: bool,
    /// UI actions executed.
    pub actions: usize,
    /// LLM calls made.
    pub llm_calls: usize,
    /// Length of the offered trace.
    pub trace_len: usize,
}

/// One report's figures at K = 1 and at K.
#[derive(Debug, Clone, Serialize)]
pub struct ReportFigures {
    /// Report id.
    pub report: String,
    /// Crash or non-crash.
    pub bug_type: String,
    /// Ground-truth actions.
    pub ground_truth_actions: usize,
    /// K = 1.
    pub k1: RunFigures,
    /// K replicas.
    pub kn: RunFigures,
    /// Whether both runs offered the same trace.
    pub same_trace: bool,
}

/// What `bench preassess --json` prints.
#[derive(Debug, Clone, Serialize)]
pub struct PreassessFigures {
    /// Always true: the devices are simulated.
    pub simulator: bool,
    /// What answers the prompts.
    pub llm: String,
    /// K of the parallel run.
    pub replicas: usize,
    /// Latency scale used.
    pub scale: f64,
    /// Device latencies of the model (ms): action, snapshot save, snapshot load, launch.
    pub latency_ms: [u64; 4],
    /// Assumed LLM latency per call (model ms).
    pub llm_latency_ms: u64,
    /// Reports run.
    pub reports: usize,
    /// Mean wall time per report at K = 1 (model seconds).
    pub wall_k1_s: f64,
    /// Mean wall time per report at K (model seconds); the field is named for K = 4.
    pub wall_k4_s: f64,
    /// `wall_k1_s / wall_k4_s`.
    pub speedup: f64,
    /// Reports reproduced at K = 1.
    pub success_k1: usize,
    /// Reports reproduced at K.
    pub success_k4: usize,
    /// Every report had the same outcome and trace at both K.
    pub equal_success: bool,
    /// Per report.
    pub per_report: Vec<ReportFigures>,
}

async fn one_run(
    ds: &Dataset,
    id: &str,
    latency: SimLatency,
    replicas: usize,
    llm_delay: Duration,
    scale: f64,
) -> Result<(RunFigures, Vec<crate::device::Action>), PreassessError> {
    let report = &ds.reports[id];
    let (first, package) = ds
        .device_for(id, latency)
        .ok_or_else(|| PreassessError::NoApp(id.to_string()))?;
    let others: Vec<SimDevice> = (1..replicas).map(|_| first.replica()).collect();
    let mut devices: Vec<&dyn Device> = vec![&first];
    devices.extend(others.iter().map(|d| d as &dyn Device));
    let scripted = ScriptedLlm::new(responder(
        report.ground_truth.clone(),
        GuidedShape::default(),
    ));
    let llm = DelayedLlm::new(scripted.clone(), llm_delay);
    let bug_type = match report.kind {
        BugKind::Crash => BugType::Crash,
        BugKind::NonCrash => BugType::NonCrash,
    };
    let cfg = Config::paper(Variant::parse("full").expect("full is a variant"), bug_type);
    let meter = Meter::new(100, Duration::from_secs(3600));
    let t = Instant::now();
    let run = super::run(
        &llm,
        &devices,
        &package,
        &report.android_report(),
        cfg,
        &meter,
    )
    .await
    .map_err(|error| PreassessError::Agent {
        report: id.to_string(),
        error,
    })?;
    let wall = t.elapsed().as_secs_f64() / scale;
    let (fresh, _) = ds
        .device_for(id, SimLatency::ZERO)
        .ok_or_else(|| PreassessError::NoApp(id.to_string()))?;
    let (screen, crash) = replay(&fresh, &package, &run.trace)
        .await
        .map_err(|error| PreassessError::Replay {
            report: id.to_string(),
            error,
        })?;
    Ok((
        RunFigures {
            wall_s: wall,
            success: report.reproduced(&screen, crash.as_ref()),
            actions: run.actions_executed,
            llm_calls: scripted.calls(),
            trace_len: run.trace.len(),
        },
        run.trace,
    ))
}

/// Runs every chosen report at K = 1 and at K, one run at a time.
pub async fn run(
    opts: &PreassessOptions,
    mut progress: impl FnMut(&str),
) -> Result<PreassessFigures, PreassessError> {
    let ds = Dataset::load(Path::new(&opts.dataset_dir))?;
    let ids: Vec<String> = if opts.reports.is_empty() {
        ds.reports.keys().cloned().collect()
    } else {
        opts.reports.clone()
    };
    if let Some(bad) = ids.iter().find(|i| !ds.reports.contains_key(*i)) {
        return Err(PreassessError::UnknownReport {
            report: bad.clone(),
            dir: opts.dataset_dir.clone(),
            known: ds.reports.keys().cloned().collect(),
        });
    }
    let scale = opts.scale.max(1e-4);
    let latency = SimLatency::default().scaled(scale);
    let llm_delay = Duration::from_secs_f64(opts.llm_latency_ms as f64 / 1000.0 * scale);
    let mut per_report = Vec::new();
    for id in &ids {
        progress(id);
        let (k1, t1) = one_run(&ds, id, latency, 1, llm_delay, scale).await?;
        let (kn, tn) = one_run(&ds, id, latency, opts.replicas, llm_delay, scale).await?;
        let r = &ds.reports[id];
        per_report.push(ReportFigures {
            report: id.clone(),
            bug_type: match r.kind {
                BugKind::Crash => "crash".into(),
                BugKind::NonCrash => "non-crash".into(),
            },
            ground_truth_actions: r.ground_truth.len(),
            same_trace: t1 == tn,
            k1,
            kn,
        });
    }
    let n = per_report.len().max(1) as f64;
    let wall_k1_s = per_report.iter().map(|r| r.k1.wall_s).sum::<f64>() / n;
    let wall_k4_s = per_report.iter().map(|r| r.kn.wall_s).sum::<f64>() / n;
    let d = SimLatency::default();
    Ok(PreassessFigures {
        simulator: true,
        llm: "scripted stand-in following the ground truth (not a model)".into(),
        replicas: opts.replicas,
        scale,
        latency_ms: [
            d.action_ms,
            d.snapshot_save_ms,
            d.snapshot_load_ms,
            d.launch_ms,
        ],
        llm_latency_ms: opts.llm_latency_ms,
        reports: per_report.len(),
        wall_k1_s,
        wall_k4_s,
        speedup: wall_k1_s / wall_k4_s.max(f64::MIN_POSITIVE),
        success_k1: per_report.iter().filter(|r| r.k1.success).count(),
        success_k4: per_report.iter().filter(|r| r.kn.success).count(),
        equal_success: per_report
            .iter()
            .all(|r| r.k1.success == r.kn.success && r.same_trace),
        per_report,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Options for one report of the bundled dataset, time scaled down 500 times.
    fn options_for(report: &str, replicas: usize, llm_latency_ms: u64) -> PreassessOptions {
        PreassessOptions {
            dataset_dir: crate::sim::source_dataset_dir(),
            replicas,
            scale: 0.002,
            llm_latency_ms,
            reports: vec![report.into()],
        }
    }

    #[tokio::test]
    async fn replicas_shorten_the_search_and_keep_its_result() {
        let opts = options_for("habitflow-07", 4, 1000);
        let f = run(&opts, |_| {}).await.unwrap();
        // Times are figures for `bench preassess`, not assertions; the outcome must not change.
        assert!(
            f.equal_success && f.success_k1 == 1 && f.success_k4 == 1,
            "{f:?}"
        );
        assert_eq!(f.per_report[0].k1.actions, f.per_report[0].kn.actions);
        assert!(f.wall_k1_s > 0.0 && f.wall_k4_s > 0.0);
    }

    #[tokio::test]
    async fn an_unknown_report_is_named_with_the_ones_there_are() {
        let opts = options_for("no-such-report", 2, 0);
        match run(&opts, |_| {}).await {
            Err(PreassessError::UnknownReport { report, known, .. }) => {
                assert_eq!(report, "no-such-report");
                assert!(known.iter().any(|k| k == "habitflow-07"), "{known:?}");
            }
            other => panic!("expected UnknownReport, got {other:?}"),
        }
    }
}
