//! The `sim` executor: runs an android task's agent on a simulated device of the report's app
//! and grades it with the report's verifier (crash oracle or on-screen symptom).
//!
//! LLM agents (`ltgdroid`, `rebl`, `rebl-visual`, `adbgpt`) call their backbone through the
//! node's gateway with a per-task key; their offered trace is graded by replaying it from app
//! start on a fresh device of the same app. `ltgdroid` pre-assesses on K replicas.

// A step's error is the attempt's end, made once per attempt and returned at once: boxing it
// buys nothing.
#![allow(clippy::result_large_err)]

use super::agent::AgentError;
use super::device::Device;
use super::explore::{TraceOutcome, monkey};
use super::llm_agents;
use super::sim::{BugKind, Dataset, SimDevice, SimLatency, SimReport, replay};
use reprobench_domain::android::AndroidPayload;
use reprobench_domain::android::BugType;
use reprobench_domain::outcome::{FailureClass, Outcome};
use reprobench_domain::registry::ExecutorKind;
use reprobench_domain::registry::{self, AgentKind, Track};
use reprobench_domain::time::now_ms;
use reprobench_executor::{
    AttemptContext, AttemptEnd, AttemptSpec, BoxFuture, Executor, bad_input, error_end as error,
};
use reprobench_gateway::Gateway;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Device replicas `ltgdroid` pre-assesses on, unless configured otherwise.
pub const DEFAULT_PREASSESS_REPLICAS: usize = 4;

/// Runs android tasks on simulated devices.
#[derive(Clone)]
pub struct SimExecutor {
    /// The `android-sim` suite.
    sim_dir: PathBuf,
    latency: SimLatency,
    artifacts: PathBuf,
    gateway: Option<Gateway>,
    replicas: usize,
}

impl SimExecutor {
    /// An executor that finds the `android-sim` suite at `sim_dir`, scales the simulated latency
    /// by `latency_scale` (0: instant), and writes each attempt's trace under `artifacts`.
    pub fn new(sim_dir: PathBuf, latency_scale: f64, artifacts: PathBuf) -> SimExecutor {
        SimExecutor {
            sim_dir,
            latency: SimLatency::default().scaled(latency_scale),
            artifacts,
            gateway: None,
            replicas: DEFAULT_PREASSESS_REPLICAS,
        }
    }

    /// The same executor with LLM agents enabled through `gateway`.
    pub fn with_gateway(mut self, gateway: Gateway) -> SimExecutor {
        self.gateway = Some(gateway);
        self
    }

    /// The same executor with `k` device replicas for ltgdroid's pre-assessment (at least 1).
    pub fn with_replicas(mut self, k: usize) -> SimExecutor {
        self.replicas = k.max(1);
        self
    }
}

/// Runs one attempt; an attempt that ends in an error still says where its files (the LLM
/// transcript among them) are and how long it ran.
async fn run(setup: SimExecutor, spec: AttemptSpec) -> AttemptEnd {
    let started_at_ms = now_ms();
    let start = Instant::now();
    let mut files = None;
    let mut end = attempt(setup, spec, started_at_ms, start, &mut files).await;
    if let (AttemptEnd::Finished(o), Some(dir)) = (&mut end, files)
        && o.artifact_path.is_empty()
    {
        o.artifact_path = dir.display().to_string();
        o.wall_s = start.elapsed().as_secs_f64();
        o.started_at_ms = started_at_ms;
        o.finished_at_ms = now_ms();
    }
    end
}

async fn attempt(
    setup: SimExecutor,
    spec: AttemptSpec,
    started_at_ms: i64,
    start: Instant,
    files: &mut Option<PathBuf>,
) -> AttemptEnd {
    let payload: AndroidPayload = match serde_json::from_str(&spec.payload_json) {
        Ok(p) => p,
        Err(e) => {
            return AttemptEnd::Finished(bad_input(
                "bad_payload",
                format!(
                    "task {} has no valid android payload: {e}",
                    spec.instance_id
                ),
            ));
        }
    };
    let dir = match suite_dir(&setup, &payload) {
        Ok(dir) => dir,
        Err(end) => return end,
    };
    let dir = &dir;
    let ds = match Dataset::load(dir) {
        Ok(d) => d,
        Err(e) => {
            return error(
                FailureClass::Infra,
                "sim_dataset",
                format!("{}: {e}", dir.display()),
            );
        }
    };
    let (Some(report), Some((device, package))) = (
        ds.reports.get(&payload.instance_id),
        ds.device_for(&payload.instance_id, setup.latency),
    ) else {
        return error(
            FailureClass::BadInput,
            "bad_input:instance",
            format!(
                "report `{}` is not in {}",
                payload.instance_id,
                dir.display()
            ),
        );
    };
    if let Err(e) = device.clear(&package).await {
        return error(FailureClass::Infra, "device", e.to_string());
    }
    let artifact_dir = setup
        .artifacts
        .join(&spec.run_id)
        .join(&payload.instance_id)
        .join(format!("t{}-e{}", spec.attempt.task_id, spec.attempt.epoch));
    let _ = std::fs::create_dir_all(&artifact_dir);
    *files = Some(artifact_dir.clone());
    let max_actions = payload.max_actions as usize;
    let budget = Duration::from_secs_f64(payload.max_minutes.max(0.0) * 60.0);
    let dev: &dyn Device = &device;
    let mut outcome = Outcome::default();
    let mut details = serde_json::json!({"simulator": true, "device": "sim"});
    let kind = registry::agent_kind(Track::Android, &payload.agent);
    let (reproduced, trace, actions) = match kind {
        Some(AgentKind::GoldTrace | AgentKind::Monkey) => {
            let monkey_seed = (kind == Some(AgentKind::Monkey)).then_some(payload.seed);
            match play_scripted(dev, &package, report, monkey_seed, max_actions, budget).await {
                Ok(out) => {
                    details["crash"] = serde_json::json!(out.crash);
                    let reproduced = report.reproduced(&out.last_screen, out.crash.as_ref());
                    let n = out.trace.len();
                    (reproduced, out.trace, n)
                }
                Err(end) => return end,
            }
        }
        _ => {
            let play = LlmPlay {
                setup: &setup,
                payload: &payload,
                report,
                ds: &ds,
                device: &device,
                package: &package,
                artifact_dir: &artifact_dir,
            };
            match play.run(budget, &mut outcome, &mut details).await {
                Ok(played) => played,
                Err(end) => return end,
            }
        }
    };
    details["reproduced"] = reproduced.into();
    details["trace"] = serde_json::json!(trace);
    let _ = std::fs::write(
        artifact_dir.join("trace.json"),
        serde_json::to_vec_pretty(&details).unwrap_or_default(),
    );
    AttemptEnd::Finished(Outcome {
        success: reproduced,
        verdict: if reproduced {
            "reproduced"
        } else {
            "not_reproduced"
        }
        .into(),
        actions: Some(actions as u32),
        trace_len: Some(trace.len() as u32),
        wall_s: start.elapsed().as_secs_f64(),
        started_at_ms,
        finished_at_ms: now_ms(),
        artifact_path: artifact_dir.display().to_string(),
        details_json: details.to_string(),
        ..outcome
    })
}

/// What an LLM agent's attempt on the simulator plays with.
struct LlmPlay<'a> {
    setup: &'a SimExecutor,
    payload: &'a AndroidPayload,
    report: &'a SimReport,
    ds: &'a Dataset,
    device: &'a SimDevice,
    package: &'a str,
    artifact_dir: &'a std::path::Path,
}

impl LlmPlay<'_> {
    /// Runs the agent within `budget` (and a hard stop a little after it) on the device and its
    /// replicas, metering its calls into `outcome`, then grades its trace by replaying it from
    /// app start on a fresh device: whether it reproduced, its trace, the actions it executed.
    /// An agent that failed ends the attempt (its calls still charged).
    async fn run(
        &self,
        budget: Duration,
        outcome: &mut Outcome,
        details: &mut serde_json::Value,
    ) -> Result<(bool, Vec<super::device::Action>, usize), AttemptEnd> {
        let LlmPlay {
            setup,
            payload,
            report,
            ds,
            device,
            package,
            artifact_dir,
        } = *self;
        // A hard stop a little after the time budget (the meter and the gateway stop at it).
        let hard_stop = budget.mul_f64(1.1) + Duration::from_secs(30);
        let replicas: Vec<SimDevice> = (1..setup.replicas).map(|_| device.replica()).collect();
        let mut devices: Vec<&dyn Device> = vec![device];
        devices.extend(replicas.iter().map(|d| d as &dyn Device));
        let bug_type = match report.kind {
            BugKind::Crash => BugType::Crash,
            BugKind::NonCrash => BugType::NonCrash,
        };
        let android_report = report.android_report();
        let work = llm_agents::run(
            setup.gateway.as_ref(),
            payload,
            &android_report,
            bug_type,
            &devices,
            package,
            artifact_dir,
        );
        let (agent_run, usage) = match tokio::time::timeout(hard_stop, work).await {
            Ok(Ok(p)) => p,
            Ok(Err((class, what, msg))) => return Err(error(class, what, msg)),
            Err(_) => {
                return Err(error(
                    FailureClass::Infra,
                    "agent_timeout",
                    format!("the agent ran past its {} min budget", payload.max_minutes),
                ));
            }
        };
        let u = &usage;
        outcome.llm_calls = u.calls;
        outcome.tokens_in = u.tokens_in;
        outcome.tokens_out = u.tokens_out;
        outcome.tokens_cached = u.tokens_cached;
        outcome.cost_usd = u.cost_usd;
        let run = match agent_run {
            Ok(run) => run,
            Err(failed) => {
                // The calls made before the failure are charged to the attempt all the same.
                let (class, error_class, m) = match failed {
                    // The prompt outgrew the model: an agent failure, final.
                    AgentError::ContextLength(m) => (
                        FailureClass::Agent,
                        reprobench_gateway::llm::CONTEXT_LENGTH_CLASS,
                        m,
                    ),
                    AgentError::Llm(m) => (FailureClass::Infra, "llm_error", m),
                    AgentError::Device(e) => (FailureClass::Infra, "device", e.to_string()),
                };
                let mut end = error(class, error_class, m);
                if let AttemptEnd::Finished(o) = &mut end {
                    o.llm_calls = outcome.llm_calls;
                    o.tokens_in = outcome.tokens_in;
                    o.tokens_out = outcome.tokens_out;
                    o.cost_usd = outcome.cost_usd;
                }
                return Err(end);
            }
        };
        let _ = std::fs::write(
            artifact_dir.join(format!("{}.json", payload.agent)),
            serde_json::to_vec_pretty(&run.log).unwrap_or_default(),
        );
        // Graded by replaying the offered trace from app start on a fresh device.
        let reproduced = match ds.device_for(&payload.instance_id, SimLatency::ZERO) {
            Some((fresh, _)) => match replay(&fresh, package, &run.trace).await {
                Ok((screen, crash)) => {
                    details["crash"] = serde_json::json!(crash);
                    report.reproduced(&screen, crash.as_ref())
                }
                Err(e) => {
                    details["replay_error"] = e.to_string().into();
                    false
                }
            },
            None => false,
        };
        details["claimed"] = run.claimed.into();
        details["exhausted"] = serde_json::json!(run.exhausted);
        details["replay"] = setup.gateway.as_ref().is_some_and(|g| g.is_replay()).into();
        // As the papers count it: the agent claimed a reproduction within its budget, and
        // the replay confirms it.
        details["replay_reproduces"] = reproduced.into();
        let success = counts_as_reproduced(reproduced, &run);
        Ok((success, run.trace, run.actions_executed))
    }
}

/// The sim suite the payload names: `android-sim` (the node's), or a suite given by an absolute
/// path the node can read.
fn suite_dir(setup: &SimExecutor, payload: &AndroidPayload) -> Result<PathBuf, AttemptEnd> {
    let by_path = Some(PathBuf::from(&payload.dataset))
        .filter(|p| p.is_absolute() && p.join("manifest.json").is_file());
    let by_name = (payload.dataset == "android-sim").then(|| setup.sim_dir.clone());
    by_name.or(by_path).ok_or_else(|| {
        error(
            FailureClass::BadInput,
            "bad_input:dataset",
            format!(
                "the sim executor runs android-sim, or a sim suite given by an absolute path on the node, not `{}`",
                payload.dataset
            ),
        )
    })
}

/// The scripted agents within the time budget: `monkey` with its seed, else `gold-trace` (the
/// report's ground truth replayed); what a budget cuts short reproduces nothing.
async fn play_scripted(
    dev: &dyn Device,
    package: &str,
    report: &SimReport,
    monkey_seed: Option<u64>,
    max_actions: usize,
    budget: Duration,
) -> Result<TraceOutcome, AttemptEnd> {
    let work = async {
        if let Some(seed) = monkey_seed {
            return monkey(dev, package, seed, max_actions).await;
        }
        let trace: Vec<_> = report
            .ground_truth
            .iter()
            .take(max_actions)
            .cloned()
            .collect();
        replay(dev, package, &trace)
            .await
            .map(|(last_screen, crash)| TraceOutcome {
                trace,
                crash,
                last_screen,
            })
    };
    match tokio::time::timeout(budget, work).await {
        Ok(Ok(out)) => Ok(out),
        Ok(Err(e)) => Err(error(FailureClass::Infra, "device", e.to_string())),
        Err(_) => Ok(TraceOutcome::default()),
    }
}

/// Success as the papers count it: the agent claimed a reproduction, within its budget, and the
/// replay of its trace on a fresh device reproduces the bug.
pub fn counts_as_reproduced(replay_reproduces: bool, run: &crate::agent::AndroidRun) -> bool {
    replay_reproduces && run.claimed && run.exhausted.is_none()
}

impl Executor for SimExecutor {
    fn kind(&self) -> ExecutorKind {
        ExecutorKind::Sim
    }

    fn run(&self, spec: AttemptSpec, ctx: AttemptContext) -> BoxFuture<AttemptEnd> {
        let setup = self.clone();
        Box::pin(async move {
            tokio::select! {
                end = run(setup, spec) => end,
                _ = ctx.cancel.cancelled() => AttemptEnd::Cancelled,
            }
        })
    }
}

#[cfg(test)]
mod success_tests {
    use super::counts_as_reproduced;
    use crate::agent::AndroidRun;

    #[test]
    fn a_reproduction_counts_only_when_claimed_within_the_budget() {
        let run = |claimed: bool, exhausted: bool| AndroidRun {
            claimed,
            exhausted: exhausted.then(|| {
                crate::agent::Meter::new(0, std::time::Duration::from_secs(1))
                    .take_action()
                    .unwrap_err()
            }),
            ..AndroidRun::default()
        };
        assert!(counts_as_reproduced(true, &run(true, false)));
        assert!(!counts_as_reproduced(true, &run(false, false)));
        assert!(!counts_as_reproduced(true, &run(true, true)));
        assert!(!counts_as_reproduced(false, &run(true, false)));
    }
}
