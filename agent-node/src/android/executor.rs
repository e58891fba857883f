//! The `sim` executor: runs an android task's agent on a simulated device of the report's app
//! and grades it with the report's verifier (crash oracle or on-screen symptom).

use super::device::Device;
use super::explore::{TraceOutcome, monkey};
use super::sim::{Dataset, SimLatency, replay};
use crate::executor::{
    AttemptContext, AttemptEnd, AttemptSpec, BoxFuture, Executor, bad_input, error_end as error,
};
use reprobench_proto::android::AndroidPayload;
use reprobench_proto::time::now_ms;
use reprobench_proto::v1::{FailureClass, Outcome};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs android tasks on simulated devices.
pub struct SimExecutor {
    datasets: Arc<std::collections::BTreeMap<String, PathBuf>>,
    latency: SimLatency,
    artifacts: PathBuf,
}

impl SimExecutor {
    /// An executor that finds the `android-sim` suite at `sim_dir`, scales the simulated latency
    /// by `latency_scale` (0: instant), and writes each attempt's trace under `artifacts`.
    pub fn new(sim_dir: PathBuf, latency_scale: f64, artifacts: PathBuf) -> SimExecutor {
        SimExecutor {
            datasets: Arc::new([("android-sim".to_string(), sim_dir)].into()),
            latency: SimLatency::default().scaled(latency_scale),
            artifacts,
        }
    }
}

async fn run(
    datasets: Arc<std::collections::BTreeMap<String, PathBuf>>,
    latency: SimLatency,
    artifacts: PathBuf,
    spec: AttemptSpec,
) -> AttemptEnd {
    let started_at_ms = now_ms();
    let start = Instant::now();
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
    let Some(dir) = datasets.get(&payload.dataset) else {
        return error(
            FailureClass::BadInput,
            "bad_input:dataset",
            format!(
                "the sim executor runs android-sim only, not `{}`",
                payload.dataset
            ),
        );
    };
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
        ds.device_for(&payload.instance_id, latency),
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
    let device: &dyn Device = &device;
    if let Err(e) = device.clear(&package).await {
        return error(FailureClass::Infra, "device", e.to_string());
    }
    let max_actions = payload.max_actions as usize;
    let budget = Duration::from_secs_f64(payload.max_minutes.max(0.0) * 60.0);
    let work = async {
        match payload.agent.as_str() {
            "gold-trace" => {
                let trace: Vec<_> = report
                    .ground_truth
                    .iter()
                    .take(max_actions)
                    .cloned()
                    .collect();
                replay(device, &package, &trace)
                    .await
                    .map(|(last_screen, crash)| TraceOutcome {
                        trace,
                        crash,
                        last_screen,
                    })
            }
            "monkey" => monkey(device, &package, payload.seed, max_actions).await,
            other => Err(super::device::DeviceError::Rejected(format!(
                "agent `{other}` does not run on the sim executor"
            ))),
        }
    };
    let out = match tokio::time::timeout(budget, work).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => return error(FailureClass::Infra, "device", e.to_string()),
        Err(_) => TraceOutcome::default(),
    };
    let reproduced = report.reproduced(&out.last_screen, out.crash.as_ref());
    let dir = artifacts
        .join(&spec.run_id)
        .join(&payload.instance_id)
        .join(format!("t{}-e{}", spec.attempt.task_id, spec.attempt.epoch));
    let _ = std::fs::create_dir_all(&dir);
    let details = serde_json::json!({
        "simulator": true,
        "device": "sim",
        "reproduced": reproduced,
        "crash": out.crash,
        "trace": out.trace,
    });
    let _ = std::fs::write(
        dir.join("trace.json"),
        serde_json::to_vec_pretty(&details).unwrap_or_default(),
    );
    let actions = out.trace.len() as u32;
    AttemptEnd::Finished(Outcome {
        success: reproduced,
        verdict: if reproduced {
            "reproduced"
        } else {
            "not_reproduced"
        }
        .into(),
        actions: Some(actions),
        trace_len: Some(actions),
        wall_s: start.elapsed().as_secs_f64(),
        started_at_ms,
        finished_at_ms: now_ms(),
        artifact_path: dir.display().to_string(),
        details_json: details.to_string(),
        ..Default::default()
    })
}

impl Executor for SimExecutor {
    fn kind(&self) -> &'static str {
        "sim"
    }

    fn run(&self, spec: AttemptSpec, ctx: AttemptContext) -> BoxFuture<AttemptEnd> {
        let (datasets, latency, artifacts) =
            (self.datasets.clone(), self.latency, self.artifacts.clone());
        Box::pin(async move {
            tokio::select! {
                end = run(datasets, latency, artifacts, spec) => end,
                _ = ctx.cancel.cancelled() => AttemptEnd::Cancelled,
            }
        })
    }
}
