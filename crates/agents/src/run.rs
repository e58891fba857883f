//! Runs an SWT task's agent on the node: a checkout and a gateway key for the task, then the
//! built-in agent or the external command, then the test patch and the metered usage.

use super::InstanceBrief;
use super::baselines;
use super::checkout;
use super::external::{self, ExternalInvocation};
use super::reproagent;
use super::tools::bm25;
use super::workspace::SandboxWorkspace;
use reprobench_domain::outcome::FailureClass;
use reprobench_domain::registry::{self, AgentKind, Track};
use reprobench_domain::sweep::{BackboneSpec, Budget};
use reprobench_domain::swt::{EnvSpec, SwtInstance};
use reprobench_gateway::llm::GatewayLlm;
use reprobench_gateway::{Gateway, Usage};
use reprobench_sandbox::{Limits, Prepared, Sandbox};
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// LIBRO samples per instance.
pub const LIBRO_SAMPLES: u32 = 5;

/// What the agent left for evaluation.
#[derive(Debug, Default)]
pub struct AgentProduct {
    /// The test patch (none: the agent produced nothing).
    pub test_patch: Option<String>,
    /// Metered LLM usage of the task.
    pub usage: Usage,
    /// Feedback iterations (reproagent).
    pub feedback_iterations: Option<u32>,
    /// Whether the golden patch's files were among the top suspicious files (reproagent).
    pub localized_files_correct: Option<bool>,
    /// An agent-side failure worth recording (the patch, if any, is still evaluated).
    pub error: Option<(FailureClass, String, String)>,
    /// A summary of the agent's run for the report.
    pub summary: Value,
}

/// What the agent may use.
pub struct AgentSetup<'a> {
    /// The node's gateway.
    pub gateway: &'a Gateway,
    /// The sandbox and the instance's prepared environment.
    pub sandbox: Arc<dyn Sandbox>,
    /// Prepared environment.
    pub prepared: Prepared,
    /// The instance.
    pub instance: &'a SwtInstance,
    /// Its environment.
    pub env: &'a EnvSpec,
    /// The bare mirror of its repository.
    pub mirror: &'a Path,
    /// Scratch space for the checkout.
    pub scratch: &'a Path,
    /// The attempt's artifact directory.
    pub artifacts: &'a Path,
    /// Task name for the gateway (metering and transcript).
    pub task: String,
    /// Limits of each sandbox run.
    pub limits: Limits,
}

pub use reprobench_gateway::llm::task_budget;

/// Files the golden code patch touches.
pub fn golden_files(code_patch: &str) -> Vec<String> {
    reprobench_swt::patch::diff_files(code_patch)
        .into_iter()
        .filter_map(|f| f.old.or(f.new))
        .collect()
}

fn brief_of(inst: &SwtInstance) -> InstanceBrief {
    InstanceBrief {
        instance_id: inst.instance_id.clone(),
        repo: inst.repo.clone(),
        problem_statement: inst.problem_statement.clone(),
        hints: inst.hints_text.clone(),
    }
}

/// The instance as external agents see it: no golden patches, no test lists.
pub fn public_instance(inst: &SwtInstance) -> Value {
    json!({
        "instance_id": inst.instance_id,
        "repo": inst.repo,
        "base_commit": inst.base_commit,
        "problem_statement": inst.problem_statement,
        "hints_text": inst.hints_text,
        "created_at": inst.created_at,
        "version": inst.version,
    })
}

fn infra(class: &str, msg: String) -> Option<(FailureClass, String, String)> {
    Some((FailureClass::Infra, class.to_string(), msg))
}

/// Opens the task's gateway key and checks the repository out; on failure, the product that
/// records why.
async fn start(
    setup: &AgentSetup<'_>,
    backbone: &BackboneSpec,
    budget: &Budget,
) -> Result<(String, checkout::Checkout), AgentProduct> {
    let mut failed = AgentProduct::default();
    let key = match setup.gateway.open_task(
        &setup.task,
        backbone,
        task_budget(budget),
        Some(setup.artifacts.join("transcript.jsonl")),
    ) {
        Ok(k) => k,
        Err(e) => {
            failed.error = Some((
                FailureClass::BadInput,
                "bad_input:backbone".into(),
                e.to_string(),
            ));
            return Err(failed);
        }
    };
    match checkout::checkout(setup.mirror, &setup.instance.base_commit, setup.scratch).await {
        Ok(c) => Ok((key, c)),
        Err(e) => {
            setup.gateway.close_task(&key);
            failed.error = infra("checkout", e.to_string());
            Err(failed)
        }
    }
}

/// Runs a built-in LLM agent (`name`, `variant`); `None` when cancelled.
pub async fn run_builtin(
    setup: AgentSetup<'_>,
    name: &str,
    variant: &str,
    backbone: &BackboneSpec,
    budget: &Budget,
    cancel: &CancellationToken,
) -> Option<AgentProduct> {
    let mut product = AgentProduct::default();
    let (key, checkout) = match start(&setup, backbone, budget).await {
        Ok(started) => started,
        Err(failed) => return Some(failed),
    };
    let ws = SandboxWorkspace::new(
        checkout.path(),
        setup.sandbox.clone(),
        setup.prepared.clone(),
        &setup.env.test_cmd,
        &setup.env.test_directives,
        setup.limits.clone(),
    )
    .with_shared_graph(&setup.instance.repo, &setup.instance.base_commit);
    let brief = brief_of(setup.instance);
    let kind = registry::agent_kind(Track::Swt, name);
    let (defaults, sampling) = sampling_of(kind, backbone);
    let mut llm = GatewayLlm::new(&setup.gateway.base_url(), &key).with_params(defaults);
    // Hard stop a little after the time budget (the gateway refuses calls at the budget itself).
    let hard_stop = Duration::from_secs_f64((budget.max_minutes.max(0.1) * 60.0) * 1.1 + 30.0);
    let work = async {
        match kind {
            Some(AgentKind::ReproAgent) => {
                let variant = match variant.parse::<reproagent::Variant>() {
                    Ok(v) => v,
                    Err(e) => {
                        let e = e.to_string();
                        return (
                            None,
                            json!({"error": e}),
                            None,
                            None,
                            Some((FailureClass::BadInput, "bad_input:variant".to_string(), e)),
                        );
                    }
                };
                let limits = reproagent::Limits {
                    max_llm_calls_per_stage: budget.max_llm_calls_per_stage,
                    max_feedback_iterations: budget.max_feedback_iterations,
                };
                let out = reproagent::run(&brief, variant, &limits, &mut llm, &ws).await;
                let golden = golden_files(&setup.instance.patch);
                let correct = out.localization.as_ref().map(|l| {
                    reproagent::localized_files_correct(l, &golden, reproagent::LOCALIZATION_TOP_K)
                });
                let _ = std::fs::write(
                    setup.artifacts.join("reproagent.json"),
                    serde_json::to_vec_pretty(&out).unwrap_or_default(),
                );
                let err = llm_failure(out.stopped_by.as_deref());
                let summary = json!({
                    "stages_run": out.stages_run,
                    "llm_calls_by_stage": out.llm_calls_by_stage,
                    "reviews": out.reviews.len(),
                    "stopped_by": out.stopped_by,
                });
                (
                    out.test_patch.clone(),
                    summary,
                    Some(out.feedback_iterations),
                    correct,
                    err,
                )
            }
            Some(AgentKind::ZeroShotPlus) => {
                let context = retrieved_context(&ws, &brief.problem_statement).await;
                let out = baselines::zero_shot_plus(&brief, &context, &mut llm, &ws).await;
                baseline_result(out, setup.artifacts, "zero-shot-plus.json")
            }
            Some(AgentKind::Libro) => {
                let out = baselines::libro(&brief, LIBRO_SAMPLES, &mut llm, &ws).await;
                baseline_result(out, setup.artifacts, "libro.json")
            }
            _ => (
                None,
                Value::Null,
                None,
                None,
                Some((
                    FailureClass::BadInput,
                    "bad_input:agent".to_string(),
                    format!("agent `{name}` is not a built-in LLM agent of the swt track"),
                )),
            ),
        }
    };
    let result = tokio::select! {
        r = tokio::time::timeout(hard_stop, work) => Some(r),
        _ = cancel.cancelled() => None,
    };
    let result = result.map(|r| {
        r.map(|(patch, summary, iterations, correct, err)| {
            let patch =
                patch.map(|p| super::workspace::relocate_new_file_patch(checkout.path(), p));
            (patch, summary, iterations, correct, err)
        })
    });
    product.usage = setup.gateway.close_task(&key).unwrap_or_default();
    let r = result?;
    match r {
        Ok((patch, summary, iterations, correct, err)) => {
            product.test_patch = patch;
            product.summary = summary;
            product.feedback_iterations = iterations;
            product.localized_files_correct = correct;
            product.error = err;
        }
        Err(_) => {
            product.error = Some((
                FailureClass::None,
                "agent_timeout".into(),
                format!("the agent ran past its {} min budget", budget.max_minutes),
            ));
        }
    }
    let (runs, commands) = ws.runs();
    product.summary["replay"] = setup.gateway.is_replay().into();
    product.summary["sampling"] = Value::Object(sampling);
    product.summary["test_runs"] = runs.into();
    product.summary["sandbox_commands"] = commands.into();
    Some(product)
}

/// The sampling each built-in agent's paper gives it: ReProAgent temperature 0.7 and top_p 0.8
/// (its paper's top_k 20 and repetition_penalty 1.05 are for open-source backbones "when
/// supported", which a backbone opts into with `params`); LIBRO temperature 0.7 (its samples
/// must differ); `zero-shot-plus` none (SWT-bench's ZeroShotPlus leaves the model's default).
pub fn paper_sampling(kind: Option<AgentKind>) -> &'static [(&'static str, f64)] {
    match kind {
        Some(AgentKind::ReproAgent) => &[("temperature", 0.7), ("top_p", 0.8)],
        Some(AgentKind::Libro) => &[("temperature", 0.7)],
        _ => &[],
    }
}

/// The request fields the agent sends (its paper's sampling where the backbone's `params` do not
/// set them: a sweep's choice wins), and the sampling in effect, recorded in the results.
fn sampling_of(
    kind: Option<AgentKind>,
    backbone: &BackboneSpec,
) -> (
    serde_json::Map<String, Value>,
    serde_json::Map<String, Value>,
) {
    let mut defaults = serde_json::Map::new();
    for (name, value) in paper_sampling(kind) {
        if !backbone.params.contains_key(*name) {
            defaults.insert(name.to_string(), json!(value));
        }
    }
    let mut effective = defaults.clone();
    for (name, value) in &backbone.params {
        if let Ok(value) = serde_json::to_value(value) {
            effective.insert(name.clone(), value);
        }
    }
    (defaults, effective)
}

type Produced = (
    Option<String>,
    Value,
    Option<u32>,
    Option<bool>,
    Option<(FailureClass, String, String)>,
);

fn baseline_result(out: baselines::BaselineOutcome, dir: &Path, file: &str) -> Produced {
    let _ = std::fs::write(
        dir.join(file),
        serde_json::to_vec_pretty(&out).unwrap_or_default(),
    );
    let err = llm_failure(out.stopped_by.as_deref());
    let summary = json!({"llm_calls": out.llm_calls, "candidates": out.candidates.len(), "stopped_by": out.stopped_by, "answer_form": out.answer_form});
    (out.test_patch, summary, None, None, err)
}

/// An agent that stopped because its LLM calls failed (not its budget) hit an infrastructure
/// failure: the task is retried.
fn llm_failure(stopped_by: Option<&str>) -> Option<(FailureClass, String, String)> {
    let s = stopped_by?;
    if s.starts_with("llm_error") {
        Some((FailureClass::Infra, "llm_error".to_string(), s.to_string()))
    } else if s.starts_with(super::CONTEXT_LENGTH_STOP) {
        // The agent's prompt outgrew the model: final, as a retry sends the same prompt.
        Some((
            FailureClass::Agent,
            super::CONTEXT_LENGTH_CLASS.to_string(),
            s.to_string(),
        ))
    } else {
        None
    }
}

/// The BM25-retrieved code shown to `zero-shot-plus`: the top chunks for the issue text.
/// The code graph's build and the retrieval run on a blocking thread, off the runtime's workers.
pub async fn retrieved_context(ws: &SandboxWorkspace, issue: &str) -> String {
    let (tb, issue) = (ws.shared_toolbox(), issue.to_string());
    let chunks =
        tokio::task::spawn_blocking(move || bm25::retrieve(tb.repo(), tb.graph(), &issue, 5))
            .await
            .unwrap_or_default();
    let mut out = String::new();
    for c in chunks {
        out.push_str(&format!(
            "## {} (lines {}-{})\n```python\n{}\n```\n",
            c.path, c.start_line, c.end_line, c.text
        ));
    }
    out
}

/// Runs an external agent; `None` when cancelled.
pub async fn run_external(
    setup: AgentSetup<'_>,
    command: &[String],
    image: Option<&str>,
    backbone: &BackboneSpec,
    budget: &Budget,
    cancel: &CancellationToken,
) -> Option<AgentProduct> {
    let mut product = AgentProduct::default();
    let (key, checkout) = match start(&setup, backbone, budget).await {
        Ok(started) => started,
        Err(failed) => return Some(failed),
    };
    let agent_dir = setup.artifacts.join("agent");
    let _ = std::fs::create_dir_all(&agent_dir);
    let instance_file = setup.artifacts.join("instance.json");
    let _ = std::fs::write(&instance_file, public_instance(setup.instance).to_string());
    let output = setup.artifacts.join("agent-output.patch");
    let inv = ExternalInvocation {
        command,
        instance_file: &instance_file,
        repo: checkout.path(),
        output: &output,
        artifacts: &agent_dir,
        base_url: &setup.gateway.base_url(),
        key: &key,
        model: &backbone.name,
        timeout: Duration::from_secs_f64(budget.max_minutes.max(0.1) * 60.0),
    };
    let end = match image {
        Some(image) => {
            super::external_image::run(&inv, setup.gateway, image, setup.artifacts, cancel).await
        }
        None => external::run(&inv, cancel).await,
    };
    product.usage = setup.gateway.close_task(&key).unwrap_or_default();
    let end = end?;
    product.summary = json!({
        "replay": setup.gateway.is_replay(),
        "exit_code": end.exit_code,
        "timed_out": end.timed_out,
        "log": end.log.display().to_string(),
    });
    product.test_patch = end.patch;
    product.error = if let Some(e) = end.start_error {
        Some((FailureClass::BadInput, "bad_input:agent_command".into(), e))
    } else if end.timed_out {
        Some((
            FailureClass::None,
            "agent_timeout".into(),
            format!("killed at the {} min budget", budget.max_minutes),
        ))
    } else if end.exit_code != Some(0) {
        Some((
            FailureClass::None,
            "agent_failed".into(),
            format!(
                "the agent exited with {:?}; see {}",
                end.exit_code,
                end.log.display()
            ),
        ))
    } else {
        None
    };
    Some(product)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_length_stop_is_a_final_agent_failure_and_a_failed_call_an_infra_one() {
        let (class, error_class, _) =
            llm_failure(Some("context_length: the prompt has 3041 tokens")).unwrap();
        assert_eq!(class, FailureClass::Agent);
        assert_eq!(error_class, crate::CONTEXT_LENGTH_CLASS);
        let (class, error_class, _) = llm_failure(Some("llm_error: HTTP 500: boom")).unwrap();
        assert_eq!(
            (class, error_class.as_str()),
            (FailureClass::Infra, "llm_error")
        );
        assert_eq!(llm_failure(Some("budget")), None);
        assert_eq!(llm_failure(None), None);
    }

    #[test]
    fn the_papers_sampling_is_the_default_and_a_sweeps_params_win() {
        let backbone = |params: Value| {
            serde_json::from_value::<BackboneSpec>(json!({
                "name": "b", "base_url": "http://127.0.0.1:1/v1", "model": "m", "params": params,
            }))
            .unwrap()
        };
        let (sent, effective) = sampling_of(Some(AgentKind::ReproAgent), &backbone(json!({})));
        assert_eq!(
            Value::Object(sent),
            json!({"temperature": 0.7, "top_p": 0.8})
        );
        assert_eq!(
            Value::Object(effective),
            json!({"temperature": 0.7, "top_p": 0.8})
        );
        let (sent, effective) = sampling_of(
            Some(AgentKind::ReproAgent),
            &backbone(json!({"temperature": 0.0, "seed": 3})),
        );
        assert_eq!(Value::Object(sent), json!({"top_p": 0.8}));
        assert_eq!(
            Value::Object(effective),
            json!({"temperature": 0.0, "top_p": 0.8, "seed": 3})
        );
        let (sent, _) = sampling_of(Some(AgentKind::ZeroShotPlus), &backbone(json!({})));
        assert!(sent.is_empty());
        let (sent, _) = sampling_of(Some(AgentKind::Libro), &backbone(json!({})));
        assert_eq!(Value::Object(sent), json!({"temperature": 0.7}));
    }
}
