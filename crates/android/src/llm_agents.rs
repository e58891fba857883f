//! Runs one android LLM agent (`ltgdroid`, `rebl`, `rebl-visual`, `adbgpt`) for a task, on the
//! devices an executor provides, with a gateway key of the task's own: what the `sim` and
//! `emulator` executors share.

use super::agent::{AgentError, AndroidRun, Meter};
use super::baselines;
use super::device::{Device, DeviceError};
use super::ltgdroid::{self, Config, Variant};
use reprobench_domain::android::{AndroidPayload, AndroidReport, BugType};
use reprobench_domain::outcome::FailureClass;
use reprobench_domain::registry::{self, AgentKind, Track};
use reprobench_gateway::llm::task_budget;
use reprobench_gateway::llm::{GatewayLlm, Llm};
use reprobench_gateway::{Gateway, Usage};
use std::path::Path;
use std::time::Duration;

/// Why the agent could not be started: the failure class, the error class and the message.
pub type SetupError = (FailureClass, &'static str, String);

/// Runs the task's LLM agent on `devices` (ltgdroid pre-assesses on all of them; the baselines
/// use the first) and returns its run, or its error, with the metered usage. The task's key is
/// named `instance/agent/variant/backbone`, stable across runs so replays find it.
pub async fn run(
    gateway: Option<&Gateway>,
    payload: &AndroidPayload,
    report: &AndroidReport,
    bug_type: BugType,
    devices: &[&dyn Device],
    package: &str,
    artifact_dir: &Path,
) -> Result<(Result<AndroidRun, AgentError>, Usage), SetupError> {
    let Some(gateway) = gateway else {
        return Err((
            FailureClass::Infra,
            "no_gateway",
            "this node runs no LLM gateway, so it cannot run LLM agents".into(),
        ));
    };
    let Some(backbone) = &payload.backbone else {
        return Err((
            FailureClass::BadInput,
            "bad_input:backbone",
            format!("agent `{}` has no backbone in its task", payload.agent),
        ));
    };
    if devices.is_empty() {
        return Err((
            FailureClass::Infra,
            "device",
            "no device to run the agent on".into(),
        ));
    }
    let budget = payload.budget.clone().unwrap_or_default();
    let task = format!(
        "{}/{}/{}/{}",
        payload.instance_id, payload.agent, payload.variant, backbone.name
    );
    let key = gateway
        .open_task(
            &task,
            backbone,
            task_budget(&budget),
            Some(artifact_dir.join("transcript.jsonl")),
        )
        .map_err(|e| (FailureClass::BadInput, "bad_input:backbone", e.to_string()))?;
    let llm = GatewayLlm::new(&gateway.base_url(), &key);
    let meter = Meter::new(
        payload.max_actions as usize,
        Duration::from_secs_f64(payload.max_minutes.max(0.0) * 60.0),
    );
    let run = run_agent(
        &llm,
        &payload.agent,
        &payload.variant,
        report,
        bug_type,
        devices,
        package,
        &meter,
    )
    .await;
    let usage = gateway.close_task(&key).unwrap_or_default();
    Ok((run, usage))
}

/// Runs the android LLM agent `agent` (variant `variant`, with the paper's settings) with `llm`
/// on `devices` (ltgdroid pre-assesses on all of them; the baselines use the first) within
/// `meter`'s budget.
#[allow(clippy::too_many_arguments)]
pub async fn run_agent<L: Llm + Clone + Sync>(
    llm: &L,
    agent: &str,
    variant: &str,
    report: &AndroidReport,
    bug_type: BugType,
    devices: &[&dyn Device],
    package: &str,
    meter: &Meter,
) -> Result<AndroidRun, AgentError> {
    let Some(first) = devices.first().copied() else {
        return Err(AgentError::Device(DeviceError::Rejected(
            "no device to run the agent on".into(),
        )));
    };
    let kind = registry::agent_kind(Track::Android, agent);
    match kind {
        Some(AgentKind::LtgDroid) => match Variant::parse(variant) {
            Some(variant) => {
                let cfg = Config::paper(variant, bug_type);
                ltgdroid::run(llm, devices, package, report, cfg, meter).await
            }
            None => Err(AgentError::Llm(format!(
                "ltgdroid has no variant `{variant}`"
            ))),
        },
        Some(AgentKind::Rebl | AgentKind::ReblVisual) => {
            let visual = kind == Some(AgentKind::ReblVisual);
            baselines::rebl(&mut llm.clone(), first, package, report, visual, meter).await
        }
        Some(AgentKind::AdbGpt) => {
            baselines::adbgpt(&mut llm.clone(), first, package, report, meter).await
        }
        _ => Err(AgentError::Llm(format!(
            "agent `{agent}` is not an android LLM agent"
        ))),
    }
}
