//! The SWT executor: produces the task's test patch (gold, issue-snippet, or the given
//! prediction), then evaluates it as SWT-bench does — six executions (pred/gold/base × pre/post
//! the golden code patch) with the same test directives, gold and base cached per instance and
//! directives — and grades it.

use crate::agents::run::{self as agent_run, AgentProduct, AgentSetup};
use crate::executor::{
    AttemptContext, AttemptEnd, AttemptSpec, BoxFuture, Executor, bad_input,
    error_end as outcome_error,
};
use crate::gateway::Gateway;
use crate::sandbox::{EnvRecipe, ExecRequest, Limits, Prepared, Sandbox, SandboxError};
use crate::swt::grading::{self, Transition};
use crate::swt::logparse::{self, LogParser, TestStatuses};
use crate::swt::{patch, script, snippet};
use reprobench_proto::swt::{SwtAgent, SwtPayload, mirror_name};
use reprobench_proto::time::now_ms;
use reprobench_proto::v1::{FailureClass, Outcome};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs SWT tasks in a sandbox.
pub struct SwtExecutor {
    sandbox: Arc<dyn Sandbox>,
    repos: PathBuf,
    cache: PathBuf,
    artifacts: PathBuf,
    gateway: Option<Gateway>,
}

impl SwtExecutor {
    /// An executor over `sandbox`, finding mirrors in `repos`, caching gold/base executions in
    /// `cache`, and writing each attempt's files under `artifacts`.
    pub fn new(
        sandbox: Arc<dyn Sandbox>,
        repos: PathBuf,
        cache: PathBuf,
        artifacts: PathBuf,
    ) -> SwtExecutor {
        SwtExecutor {
            sandbox,
            repos,
            cache,
            artifacts,
            gateway: None,
        }
    }

    /// The same executor with LLM agents enabled through `gateway`.
    pub fn with_gateway(mut self, gateway: Gateway) -> SwtExecutor {
        self.gateway = Some(gateway);
        self
    }
}

/// One execution as recorded in the report and the cache.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExecRecord {
    /// Exit code of the test command (None: killed or never reached).
    pub exit_code: Option<i64>,
    /// Killed at the timeout.
    pub timed_out: bool,
    /// How the test patch applied.
    pub test_patch_method: Option<String>,
    /// How the golden code patch applied.
    pub code_patch_method: Option<String>,
    /// Which patch failed to apply.
    pub apply_failed: Option<String>,
    /// Test statuses, after distrusting passes of a failed run.
    pub statuses: BTreeMap<String, logparse::TestStatus>,
    /// Milliseconds the command ran.
    pub command_ms: u64,
    /// Milliseconds of harness overhead around it.
    pub overhead_ms: u64,
    /// Milliseconds the test command itself ran (inside the sandbox, excluding patching and copying).
    #[serde(default)]
    pub test_ms: Option<u64>,
    /// Taken from the cache.
    #[serde(default)]
    pub cached: bool,
}

enum Which {
    Pred,
    Gold,
    Base,
}

impl Which {
    fn name(&self) -> &'static str {
        match self {
            Which::Pred => "pred",
            Which::Gold => "gold",
            Which::Base => "base",
        }
    }
}

fn sandbox_error(e: SandboxError) -> AttemptEnd {
    match e {
        SandboxError::Infra(m) => outcome_error(FailureClass::Infra, "sandbox", m),
        SandboxError::BadInput(m) => {
            outcome_error(FailureClass::BadInput, "bad_input:environment", m)
        }
    }
}

fn nonce() -> String {
    let mut buf = [0u8; 8];
    use std::io::Read;
    let _ = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut buf));
    buf.iter().map(|b| format!("{b:02x}")).collect::<String>() + &format!("{:x}", now_ms())
}

fn fnv_hex(parts: &[&str]) -> String {
    let mut h = reprobench_proto::swt::Fnv::default();
    for p in parts {
        h.add(p);
    }
    format!("{:016x}", h.0)
}

struct Job<'a> {
    payload: &'a SwtPayload,
    parser: &'static dyn LogParser,
    prepared: &'a Prepared,
    recipe: &'a EnvRecipe,
    directives: &'a [String],
    limits: Limits,
    log_dir: PathBuf,
}

impl SwtExecutor {
    async fn execute(
        &self,
        job: &Job<'_>,
        which: Which,
        post: bool,
        test_patch: Option<&str>,
    ) -> Result<ExecRecord, SandboxError> {
        let label = format!("{}_{}", which.name(), if post { "post" } else { "pre" });
        let cache_file = match which {
            Which::Pred => None,
            _ => {
                let key = fnv_hex(&[
                    "swt-exec-v1",
                    &job.recipe.instance_key(),
                    &label,
                    &job.directives.join("\n"),
                    &job.payload.env.test_cmd,
                    test_patch.unwrap_or(""),
                    &job.payload.instance.patch,
                ]);
                Some(
                    self.cache
                        .join("swt-executions")
                        .join(format!("{key}.json")),
                )
            }
        };
        if let Some(f) = &cache_file
            && let Some(mut rec) = std::fs::read(f)
                .ok()
                .and_then(|b| serde_json::from_slice::<ExecRecord>(&b).ok())
        {
            rec.cached = true;
            return Ok(rec);
        }
        let nonce = nonce();
        let plan = script::Plan {
            test_patch,
            code_patch: post.then_some(job.payload.instance.patch.as_str()),
            test_cmd: &job.payload.env.test_cmd,
            directives: job.directives,
            nonce: &nonce,
        };
        let (files, command) = script::build(&plan);
        let out = self
            .sandbox
            .exec(
                job.prepared,
                ExecRequest {
                    files,
                    command,
                    env: vec![],
                    limits: job.limits.clone(),
                },
            )
            .await?;
        let _ = std::fs::write(job.log_dir.join(format!("{label}.log")), &out.output);
        let report = script::read(&out.output, &nonce);
        let mut statuses: TestStatuses = if report.started {
            job.parser.parse(&report.test_log)
        } else {
            TestStatuses::new()
        };
        let exit_code = if report.started { out.exit_code } else { None };
        if report.started {
            grading::distrust_passes_on_failed_exit(&mut statuses, exit_code);
        }
        let rec = ExecRecord {
            exit_code,
            timed_out: out.timed_out,
            test_patch_method: report.test_patch_method,
            code_patch_method: report.code_patch_method,
            apply_failed: report.apply_failed,
            statuses,
            command_ms: out.command_time.as_millis() as u64,
            overhead_ms: out.overhead.as_millis() as u64,
            test_ms: report.test_ns.map(|ns| ns / 1_000_000),
            cached: false,
        };
        if let (Some(f), false) = (&cache_file, rec.timed_out) {
            if let Some(dir) = f.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            let tmp = f.with_extension(format!("tmp-{nonce}"));
            if std::fs::write(&tmp, serde_json::to_vec(&rec).unwrap_or_default()).is_ok() {
                let _ = std::fs::rename(&tmp, f);
            }
        }
        Ok(rec)
    }

    async fn evaluate(&self, spec: AttemptSpec, ctx: AttemptContext) -> AttemptEnd {
        let started_at_ms = now_ms();
        let start = Instant::now();
        let payload: SwtPayload = match serde_json::from_str(&spec.payload_json) {
            Ok(p) => p,
            Err(e) => {
                return AttemptEnd::Finished(bad_input(
                    "bad_payload",
                    format!("task {} has no valid SWT payload: {e}", spec.instance_id),
                ));
            }
        };
        let inst = &payload.instance;
        let Some(parser) = logparse::parser_for(&payload.env.log_parser) else {
            return outcome_error(
                FailureClass::BadInput,
                "bad_input:log_parser",
                format!(
                    "{}: log parser `{}` is unknown; known: {}",
                    inst.instance_id,
                    payload.env.log_parser,
                    logparse::parser_names().join(", ")
                ),
            );
        };
        let artifact_dir = self
            .artifacts
            .join(&spec.run_id)
            .join(&inst.instance_id)
            .join(format!("t{}-e{}", spec.attempt.task_id, spec.attempt.epoch));
        let log_dir = artifact_dir.join("logs");
        let _ = std::fs::create_dir_all(&log_dir);
        let recipe = EnvRecipe {
            repo: inst.repo.clone(),
            mirror: self.repos.join(mirror_name(&inst.repo)),
            base_commit: inst.base_commit.clone(),
            python: payload.env.python.clone(),
            packages: payload.env.packages.clone(),
            pre_install: payload.env.pre_install.clone(),
            install: payload.env.install.clone(),
        };
        let limits = Limits {
            cpus: payload.limits.cpus,
            memory_mb: payload.limits.memory_mb,
            pids: payload.limits.pids,
            disk_mb: payload.limits.disk_mb,
            timeout: Duration::from_secs(payload.limits.timeout_s),
            ..Limits::default()
        };
        let mut product: Option<AgentProduct> = None;
        let test_patch: Option<String> = match &payload.agent {
            SwtAgent::Gold => Some(inst.test_patch.clone()),
            SwtAgent::IssueSnippet => snippet::test_patch(&inst.problem_statement),
            SwtAgent::Prediction { patch, .. } => patch.clone(),
            SwtAgent::Llm { .. } | SwtAgent::External { .. } => {
                let Some(gateway) = &self.gateway else {
                    return outcome_error(
                        FailureClass::Infra,
                        "no_gateway",
                        "this node runs no LLM gateway, so it cannot run LLM agents".into(),
                    );
                };
                let prepared = tokio::select! {
                    p = self.sandbox.prepare(&recipe) => match p {
                        Ok(p) => p,
                        Err(e) => return sandbox_error(e),
                    },
                    _ = ctx.cancel.cancelled() => return AttemptEnd::Cancelled,
                };
                let setup = AgentSetup {
                    gateway,
                    sandbox: self.sandbox.clone(),
                    prepared,
                    instance: inst,
                    env: &payload.env,
                    mirror: &recipe.mirror,
                    scratch: &self.cache.join("checkouts"),
                    artifacts: &artifact_dir,
                    // Stable across runs, so a replay finds this cell's recordings.
                    task: format!(
                        "{}/{}/{}/{}",
                        inst.instance_id,
                        spec.agent,
                        spec.variant,
                        match &payload.agent {
                            SwtAgent::Llm { backbone, .. }
                            | SwtAgent::External { backbone, .. } => backbone.name.as_str(),
                            _ => "",
                        }
                    ),
                    limits: limits.clone(),
                };
                let p = match &payload.agent {
                    SwtAgent::Llm {
                        name,
                        variant,
                        backbone,
                        budget,
                    } => {
                        agent_run::run_builtin(setup, name, variant, backbone, budget, &ctx.cancel)
                            .await
                    }
                    SwtAgent::External {
                        command,
                        image,
                        backbone,
                        budget,
                        ..
                    } => {
                        agent_run::run_external(
                            setup,
                            command,
                            image.as_deref(),
                            backbone,
                            budget,
                            &ctx.cancel,
                        )
                        .await
                    }
                    _ => unreachable!("matched above"),
                };
                let Some(p) = p else {
                    return AttemptEnd::Cancelled;
                };
                if let Some((class, error_class, message)) = &p.error
                    && *class != FailureClass::None
                {
                    let mut end = outcome_error(*class, error_class, message.clone());
                    if let AttemptEnd::Finished(o) = &mut end {
                        charge(o, &p);
                        o.artifact_path = artifact_dir.display().to_string();
                    }
                    return end;
                }
                let patch = p.test_patch.clone();
                product = Some(p);
                patch
            }
        };
        if let Some(p) = &test_patch {
            let _ = std::fs::write(artifact_dir.join("test.patch"), p);
        }
        let mut report = serde_json::json!({
            "instance_id": inst.instance_id,
            "patch_is_None": test_patch.is_none(),
            "patch_exists": test_patch.as_deref().is_some_and(|p| !p.trim().is_empty()),
            "patch_successfully_applied": false,
            "resolved": false,
            "coverage_pred": null, "coverage_gold": null, "coverage_base": null,
            "coverage_delta_pred": null, "coverage_delta_gold": null,
        });
        let finish = |report: serde_json::Value,
                      success: bool,
                      verdict: &str,
                      error: Option<(FailureClass, &str, String)>| {
            let mut report = report;
            if let Some(p) = &product {
                report["agent"] = p.summary.clone();
            }
            let _ = std::fs::write(
                artifact_dir.join("report.json"),
                serde_json::to_vec_pretty(&report).unwrap_or_default(),
            );
            let agent_error = product
                .as_ref()
                .and_then(|p| p.error.as_ref())
                .map(|(c, k, m)| (*c, k.as_str(), m.clone()));
            let (class, error_class, message) =
                error
                    .or(agent_error)
                    .unwrap_or((FailureClass::None, "", String::new()));
            let mut outcome = Outcome {
                success,
                verdict: verdict.into(),
                failure_class: class as i32,
                error_class: error_class.into(),
                error_message: message,
                wall_s: start.elapsed().as_secs_f64(),
                started_at_ms,
                finished_at_ms: now_ms(),
                artifact_path: artifact_dir.display().to_string(),
                details_json: report.to_string(),
                ..Default::default()
            };
            if let Some(p) = &product {
                charge(&mut outcome, p);
            }
            AttemptEnd::Finished(outcome)
        };
        let files = match patch::validate(test_patch.as_deref()) {
            Ok(f) => f,
            Err(patch::PatchProblem::Empty) => {
                report["note"] = "no test patch: nothing to evaluate".into();
                return finish(report, false, "unresolved", None);
            }
            Err(problem) => {
                let msg = problem.message(&inst.instance_id);
                report["note"] = msg.clone().into();
                return finish(
                    report,
                    false,
                    "error",
                    Some((
                        FailureClass::BadInput,
                        &format!("bad_input:{}", problem.class()),
                        msg,
                    )),
                );
            }
        };
        let directives = patch::test_directives(&files, &payload.env.test_directives);
        report["test_directives"] = serde_json::json!(directives);
        if directives.is_empty() {
            report["note"] = "the test patch touches no Python file: no test to run".into();
            return finish(report, false, "unresolved", None);
        }
        let prepared = tokio::select! {
            p = self.sandbox.prepare(&recipe) => match p {
                Ok(p) => p,
                Err(e) => return sandbox_error(e),
            },
            _ = ctx.cancel.cancelled() => return AttemptEnd::Cancelled,
        };
        let job = Job {
            payload: &payload,
            parser,
            prepared: &prepared,
            recipe: &recipe,
            directives: &directives,
            limits,
            log_dir,
        };
        let pred = test_patch.as_deref();
        let gold = Some(inst.test_patch.as_str());
        let mut records: BTreeMap<String, ExecRecord> = BTreeMap::new();
        let plan: [(&str, Which, bool, Option<&str>); 6] = [
            ("pred_pre", Which::Pred, false, pred),
            ("pred_post", Which::Pred, true, pred),
            ("gold_pre", Which::Gold, false, gold),
            ("gold_post", Which::Gold, true, gold),
            ("base_pre", Which::Base, false, None),
            ("base_post", Which::Base, true, None),
        ];
        for (label, which, post, test_patch) in plan {
            let rec = tokio::select! {
                r = self.execute(&job, which, post, test_patch) => match r {
                    Ok(r) => r,
                    Err(e) => return sandbox_error(e),
                },
                _ = ctx.cancel.cancelled() => return AttemptEnd::Cancelled,
            };
            let failed_patch = rec.apply_failed.clone();
            records.insert(label.to_string(), rec);
            if label == "pred_pre" && failed_patch.is_some() {
                report["executions"] = serde_json::to_value(&records).unwrap_or_default();
                report["note"] = "the test patch does not apply to the base commit".into();
                return finish(report, false, "unresolved", None);
            }
            if failed_patch.as_deref() == Some("code") {
                report["executions"] = serde_json::to_value(&records).unwrap_or_default();
                let msg = format!(
                    "{}: the golden code patch does not apply on top of the {label} test patch",
                    inst.instance_id
                );
                report["note"] = msg.clone().into();
                return finish(
                    report,
                    false,
                    "error",
                    Some((
                        FailureClass::BadInput,
                        "bad_input:golden_patch_conflict",
                        msg,
                    )),
                );
            }
        }
        let tr = |pre: &str, post: &str| {
            grading::transitions(&records[pre].statuses, &records[post].statuses)
        };
        let (t_pred, t_gold, t_base) = (
            tr("pred_pre", "pred_post"),
            tr("gold_pre", "gold_post"),
            tr("base_pre", "base_post"),
        );
        let g = grading::grade(&t_pred, &t_base, true);
        report["patch_successfully_applied"] = true.into();
        report["resolved"] = g.resolved.into();
        report["applicable"] = g.applicable.into();
        report["f2x"] = g.f2x.into();
        report["f2p"] = g.f2p.into();
        report["p2p"] = g.p2p.into();
        report["added_f2p"] = g.added_f2p.len().into();
        report["added_f2p_tests"] = serde_json::json!(g.added_f2p);
        report["added_p2f_tests"] = serde_json::json!(g.added_p2f);
        report["added_f2f_tests"] = serde_json::json!(g.added_f2f);
        report["added_p2p_tests"] = serde_json::json!(g.added_p2p);
        report["base_tests"] = g.base_tests.into();
        report["base_tests_still_run"] = g.base_tests_still_run.into();
        let show = |t: &BTreeMap<String, Transition>| serde_json::to_value(t).unwrap_or_default();
        report["tests_pred"] = show(&t_pred);
        report["tests_gold"] = show(&t_gold);
        report["tests_base"] = show(&t_base);
        report["executions"] = serde_json::to_value(&records).unwrap_or_default();
        let timed_out: Vec<&String> = records
            .iter()
            .filter(|(_, r)| r.timed_out)
            .map(|(k, _)| k)
            .collect();
        if !timed_out.is_empty() {
            report["note"] = format!(
                "killed at the {} s timeout: {timed_out:?}",
                payload.limits.timeout_s
            )
            .into();
        }
        let verdict = if g.resolved { "resolved" } else { "unresolved" };
        finish(report, g.resolved, verdict, None)
    }
}

/// Puts an agent's metered usage and its agent-side figures on the outcome.
fn charge(o: &mut Outcome, p: &AgentProduct) {
    o.llm_calls = p.usage.calls;
    o.tokens_in = p.usage.tokens_in;
    o.tokens_out = p.usage.tokens_out;
    o.tokens_cached = p.usage.tokens_cached;
    o.cost_usd = p.usage.cost_usd;
    o.feedback_iterations = p.feedback_iterations;
    o.localized_files_correct = p.localized_files_correct;
}

impl Executor for SwtExecutor {
    fn kind(&self) -> &'static str {
        self.sandbox.kind()
    }

    fn run(&self, spec: AttemptSpec, ctx: AttemptContext) -> BoxFuture<AttemptEnd> {
        let this = SwtExecutor {
            sandbox: self.sandbox.clone(),
            repos: self.repos.clone(),
            cache: self.cache.clone(),
            artifacts: self.artifacts.clone(),
            gateway: self.gateway.clone(),
        };
        Box::pin(async move { this.evaluate(spec, ctx).await })
    }
}
