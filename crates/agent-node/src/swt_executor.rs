//! The SWT executor: produces the task's test patch (gold, issue-snippet, or the given
//! prediction), then evaluates it as SWT-bench does — six executions (pred/gold/base × pre/post
//! the golden code patch; post runs apply the code patch first, then the test patch; the gold
//! runs use the golden test patch's test files, the others the prediction's), gold and base
//! cached per instance and test files — and grades their logs with SWT-bench's rules. The six
//! logs and a `case.json` are kept in the attempt's directory, which is a grade directory
//! (`reprobench grade DIR`).

use reprobench_agents::run::{self as agent_run, AgentProduct, AgentSetup};
use reprobench_domain::registry::ExecutorKind;
use reprobench_domain::swt::{SwtAgent, SwtPayload, mirror_name};
use reprobench_domain::time::now_ms;
use reprobench_executor::{
    AttemptContext, AttemptEnd, AttemptSpec, BoxFuture, Executor, bad_input,
    error_end as outcome_error,
};
use reprobench_gateway::Gateway;
use reprobench_proto::v1::{FailureClass, Outcome};
use reprobench_sandbox::{EnvRecipe, ExecRequest, Limits, Prepared, Sandbox, SandboxError};
use reprobench_swt::case::{self, CaseFile};
use reprobench_swt::grading::instance::{self, InstanceGrade, RUNS, RunInput};
use reprobench_swt::grading::{Categories, Category, Family, coverage};
use reprobench_swt::script::{self, PatchOutcome};
use reprobench_swt::{mirror, patch, snippet};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::runtime::CodePolicy;

/// Runs SWT tasks in a sandbox.
pub struct SwtExecutor {
    sandbox: Arc<dyn Sandbox>,
    repos: PathBuf,
    cache: PathBuf,
    artifacts: PathBuf,
    gateway: Option<Gateway>,
    /// The node's name and what it lets a sweep run (see [`CodePolicy`]).
    code: (String, CodePolicy),
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
            code: ("this node".into(), CodePolicy::own_user()),
        }
    }

    /// The same executor under node `node`'s policy on sweep-supplied code.
    pub fn with_code_policy(mut self, node: &str, policy: CodePolicy) -> SwtExecutor {
        self.code = (format!("node `{node}`"), policy);
        self
    }

    /// Why this node refuses to run `payload`'s sweep-supplied code, naming the flag that would
    /// allow it.
    fn refusal(&self, payload: &SwtPayload) -> Option<(&'static str, String)> {
        let (node, policy) = &self.code;
        if let SwtAgent::External { name, .. } = &payload.agent
            && !policy.agent_commands
        {
            return Some((
                "not_allowed:agent_command",
                format!(
                    "agent `{name}` is a command or image the sweep supplies, and {node} runs none: start it with --allow-agent-commands to run them (with the node's network and environment)"
                ),
            ));
        }
        if let SwtAgent::Llm { backbone, .. } | SwtAgent::External { backbone, .. } = &payload.agent
            && let Some(why) = self.gateway.as_ref().and_then(|g| g.refusal(backbone))
        {
            return Some(("not_allowed:backbone", why));
        }
        let env = &payload.env;
        if !policy.env_commands
            && env.has_commands()
            && !policy.shipped_envs.contains(&env.commands_fingerprint())
        {
            return Some((
                "not_allowed:env_commands",
                format!(
                    "the environment of {} runs commands of its own (pre_install/install/eval_commands) that are not those of SWT-bench's specs or reprobench's datasets, and {node} runs none: start it with --allow-env-commands to run them",
                    payload.instance.instance_id
                ),
            ));
        }
        None
    }

    /// The same executor with LLM agents enabled through `gateway`.
    pub fn with_gateway(mut self, gateway: Gateway) -> SwtExecutor {
        self.gateway = Some(gateway);
        self
    }
}

use reprobench_swt::grading::parsers::parser_for;

/// One execution as recorded in the report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExecRecord {
    /// Exit code of the test command (None: killed or never reached).
    pub exit_code: Option<i64>,
    /// Killed at the timeout.
    pub timed_out: bool,
    /// How each patch went (`git apply -v`, and whether fuzz would have applied a failed one).
    #[serde(default)]
    pub patches: Vec<PatchOutcome>,
    /// Milliseconds the command ran.
    pub command_ms: u64,
    /// Milliseconds of harness overhead around it.
    pub overhead_ms: u64,
    /// Milliseconds the test command itself ran (from its start in the sandbox, after the tree was
    /// prepared, to its end).
    #[serde(default)]
    pub test_ms: Option<u64>,
    /// Taken from the cache.
    #[serde(default)]
    pub cached: bool,
    /// The output outgrew the execution's cap: its middle was left out of the log.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub output_truncated: bool,
    /// Where the execution's time went, phase by phase in the order they ran (the sandbox's
    /// phases: for docker `create`, `attach`, `boot`, `copy`, `stage`, `unpack`, `command`,
    /// `exit`, `output`; for process `workdir`, `copy`, `stage`, `unpack`, `command`,
    /// `collect`, `cleanup`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timings: Vec<PhaseTiming>,
}

/// One phase of an execution in a report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhaseTiming {
    /// The phase's name.
    pub phase: String,
    /// Milliseconds it took.
    pub ms: f64,
}

/// A cached gold or base execution: its record, its log and its coverage counts.
#[derive(Serialize, Deserialize)]
struct CachedExecution {
    record: ExecRecord,
    log: String,
    #[serde(default)]
    coverage: Option<String>,
}

/// One execution's record, log and (when traced) the tracer's counts as JSON lines.
struct Execution {
    record: ExecRecord,
    log: String,
    coverage: Option<String>,
}

enum Which {
    Pred,
    Gold,
    Base,
}

fn sandbox_error(e: SandboxError) -> AttemptEnd {
    match e {
        SandboxError::Infra(m) => outcome_error(FailureClass::Infra, "sandbox", m),
        SandboxError::BadInput(m) => {
            outcome_error(FailureClass::BadInput, "bad_input:environment", m)
        }
    }
}

fn fnv_hex(parts: &[&str]) -> String {
    let mut h = reprobench_domain::swt::Fnv::default();
    for p in parts {
        h.add(p);
    }
    format!("{:016x}", h.0)
}

struct Job<'a> {
    payload: &'a SwtPayload,
    prepared: &'a Prepared,
    recipe: &'a EnvRecipe,
    limits: Limits,
}

/// One of the six executions.
struct Step<'a> {
    label: &'static str,
    which: Which,
    post: bool,
    test_patch: Option<&'a str>,
    directives: &'a [String],
}

/// The files whose lines the executions trace: those the golden code patch changes, when the
/// run computes coverage.
fn coverage_files(payload: &SwtPayload) -> Option<Vec<String>> {
    if !payload.grading.coverage {
        return None;
    }
    let files = coverage::changed_files(&payload.instance.patch);
    (!files.is_empty()).then_some(files)
}

/// The limits an execution ran under, as they enter its cache key: each can change what it
/// gives (a test killed for memory, a log cut at the output cap).
fn limits_key(l: &Limits) -> String {
    format!(
        "cpus={} memory_mb={} pids={} disk_mb={} timeout_ms={} max_output_bytes={}",
        l.cpus,
        l.memory_mb,
        l.pids,
        l.disk_mb,
        l.timeout.as_millis(),
        l.max_output_bytes
    )
}

/// The cache key of a gold/base execution: a hash of everything that can change its result
/// (the sandbox, its limits, tracing, the environment, the step and the patches), in `parts`.
fn execution_cache_key(parts: &[&str]) -> String {
    // v4: executions run in a sealed tree, the patches applied out of the test's sight.
    let mut all = vec!["swt-exec-v4"];
    all.extend_from_slice(parts);
    fnv_hex(&all)
}

impl SwtExecutor {
    /// Where a gold or base execution is cached (a prediction's never is: its runs are its own,
    /// and `--repeat-gold` needs them run anew).
    fn cache_file(&self, job: &Job<'_>, step: &Step<'_>) -> Option<PathBuf> {
        if matches!(step.which, Which::Pred) {
            return None;
        }
        self.content_file(job, step.label, step)
    }

    /// Where a prediction's execution is also stored: when its test patch is the golden one,
    /// it is the gold execution of the same step (same patches, test files, command and
    /// environment), so the gold step that follows reads it instead of running it again. Gold
    /// evaluations run four executions per instance instead of six; nothing reads a
    /// prediction's run from the cache.
    fn gold_twin_file(&self, job: &Job<'_>, step: &Step<'_>) -> Option<PathBuf> {
        let golden = step.test_patch == Some(job.payload.instance.test_patch.as_str());
        if !matches!(step.which, Which::Pred) || !golden {
            return None;
        }
        let label = step.label.replacen("pred_", "gold_", 1);
        self.content_file(job, &label, step)
    }

    /// The cache file of the execution `label` with `step`'s patches and test files.
    fn content_file(&self, job: &Job<'_>, label: &str, step: &Step<'_>) -> Option<PathBuf> {
        // A traced execution depends on the files traced and on the tracer itself.
        let traced = coverage_files(job.payload)
            .map(|f| format!("{}\n{}", f.join("\n"), script::COVERAGE_TRACER));
        let key = execution_cache_key(&[
            &self.sandbox.identity(),
            &limits_key(&job.limits),
            traced.as_deref().map_or("untraced", |f| f),
            &job.recipe.instance_key(),
            label,
            &step.directives.join("\n"),
            &job.payload.env.test_cmd,
            step.test_patch.unwrap_or(""),
            &job.payload.instance.patch,
        ]);
        Some(
            self.cache
                .join("swt-executions")
                .join(format!("{key}.json")),
        )
    }

    fn cached(&self, job: &Job<'_>, step: &Step<'_>) -> Option<Execution> {
        let file = self.cache_file(job, step)?;
        let c: CachedExecution = serde_json::from_slice(&std::fs::read(file).ok()?).ok()?;
        let mut record = c.record;
        record.cached = true;
        Some(Execution {
            record,
            log: c.log,
            coverage: c.coverage,
        })
    }

    async fn execute(&self, job: &Job<'_>, step: &Step<'_>) -> Result<Execution, SandboxError> {
        if let Some(e) = self.cached(job, step) {
            return Ok(e);
        }
        let traced = coverage_files(job.payload);
        let plan = script::Plan {
            test_patch: step.test_patch,
            code_patch: step.post.then_some(job.payload.instance.patch.as_str()),
            test_cmd: &job.payload.env.test_cmd,
            directives: step.directives,
            env: &job.recipe.env_vars,
            setup: &job.payload.env.eval_commands,
            coverage_files: traced.as_deref(),
        };
        let request = ExecRequest {
            limits: job.limits.clone(),
            ..script::build(&plan)
        };
        let out = self.sandbox.exec(job.prepared, request).await?;
        let report = script::read(&out);
        let record = ExecRecord {
            exit_code: if report.started { out.exit_code } else { None },
            timed_out: out.timed_out,
            patches: report.patches,
            command_ms: out.command_time.as_millis() as u64,
            overhead_ms: out.overhead.as_millis() as u64,
            test_ms: report
                .started
                .then_some(out.command_time.as_millis() as u64),
            cached: false,
            output_truncated: out.output_truncated,
            timings: out
                .phases
                .iter()
                .map(|p| PhaseTiming {
                    phase: p.name.to_string(),
                    ms: (p.took.as_secs_f64() * 1e4).round() / 10.0,
                })
                .collect(),
        };
        let exec = Execution {
            record,
            log: report.log,
            coverage: report.coverage,
        };
        let store = self
            .cache_file(job, step)
            .or_else(|| self.gold_twin_file(job, step));
        if let (Some(f), false) = (store, exec.record.timed_out) {
            if let Some(dir) = f.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            let tmp = f.with_extension(format!("tmp-{}", reprobench_domain::secret::random_hex(8)));
            let cached = CachedExecution {
                record: exec.record.clone(),
                log: exec.log.clone(),
                coverage: exec.coverage.clone(),
            };
            if std::fs::write(&tmp, serde_json::to_vec(&cached).unwrap_or_default()).is_ok() {
                let _ = std::fs::rename(&tmp, f);
            }
        }
        Ok(exec)
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
        if let Some((class, why)) = self.refusal(&payload) {
            return outcome_error(FailureClass::BadInput, class, why);
        }
        let inst = &payload.instance;
        let Some(family) = parser_for(&inst.repo, &payload.env.log_parser) else {
            return outcome_error(
                FailureClass::BadInput,
                "bad_input:log_parser",
                format!(
                    "{}: log parser `{}` is unknown; known: {}",
                    inst.instance_id,
                    payload.env.log_parser,
                    Family::names().join(", ")
                ),
            );
        };
        let artifact_dir = self
            .artifacts
            .join(&spec.run_id)
            .join(&inst.instance_id)
            .join(format!("t{}-e{}", spec.attempt.task_id, spec.attempt.epoch));
        let _ = std::fs::create_dir_all(&artifact_dir);
        let mirror = self.repos.join(mirror_name(&inst.repo));
        // Conda packages of the environment file that pip cannot give (named in the report).
        let mut conda_left_out = Vec::new();
        // Requirement and environment files are read where SWT-bench reads them: at the
        // environment-setup commit (the base commit when a row has none).
        let commit = if inst.environment_setup_commit.is_empty() {
            &inst.base_commit
        } else {
            &inst.environment_setup_commit
        };
        let requirements = if !payload.env.conda_env_files.is_empty() {
            let Some(yml) = payload
                .env
                .conda_env_files
                .iter()
                .find_map(|p| mirror::file_at(&mirror, commit, p))
            else {
                return outcome_error(
                    FailureClass::BadInput,
                    "bad_input:environment",
                    format!(
                        "{}: none of {} is in {} at {commit}; the environment spec installs from that file (update the mirror with `reprobench datasets import`)",
                        inst.instance_id,
                        payload.env.conda_env_files.join(", "),
                        mirror.display()
                    ),
                );
            };
            let (reqs, left) = reprobench_domain::swt_bench::conda_env_as_requirements(&yml);
            if !left.is_empty() {
                conda_left_out.push(format!(
                    "conda packages of the environment file that pip cannot install here: {}",
                    left.join(", ")
                ));
            }
            Some(reqs.join("\n") + "\n")
        } else if payload.env.requirements_files.is_empty() {
            None
        } else {
            match mirror::requirements_at(&mirror, commit, &payload.env.requirements_files) {
                Ok(text) => Some(text),
                Err(e) => {
                    return outcome_error(
                        FailureClass::BadInput,
                        "bad_input:environment",
                        format!(
                            "{}: {e}; the environment spec installs from that file (update the mirror with `reprobench datasets import`)",
                            inst.instance_id
                        ),
                    );
                }
            }
        };
        // Files of the base commit the mirror lacks or replaces: in the cache key and the report.
        let (tree_gaps, gitlinks) = if mirror.is_dir() {
            (
                reprobench_sandbox::tree::gaps(&mirror, &inst.base_commit).unwrap_or_default(),
                reprobench_sandbox::tree::gitlinks(&mirror, &inst.base_commit).unwrap_or_default(),
            )
        } else {
            (Vec::new(), Vec::new())
        };
        let recipe = EnvRecipe {
            repo: inst.repo.clone(),
            mirror,
            base_commit: inst.base_commit.clone(),
            python: payload.env.python.clone(),
            packages: payload.env.packages.clone(),
            pre_install: payload.env.pre_install.clone(),
            install: payload.env.install.clone(),
            requirements,
            pip_packages: payload.env.pip_packages.clone(),
            env_vars: payload
                .env
                .env_vars
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            standalone: payload.env.test_cmd.trim_start().starts_with("tox "),
            packages_as_of: payload.env.packages_as_of.clone(),
            tree_gaps: tree_gaps.iter().map(|g| g.key()).collect(),
            fresh_build_tools: payload.env.fresh_build_tools,
            conda_packages_as_of: payload.env.conda_packages_as_of.clone(),
            locales: payload.env.locales.clone(),
            system_packages: payload.env.system_packages.clone(),
            build_constraints: payload.env.build_constraints.clone(),
            dated_pip_for_install: payload.env.dated_pip_for_install,
            gitlinks,
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
        // The prediction's patch as SWT-bench evaluates it (line breaks, binary diffs, final newline).
        let test_patch = test_patch.map(|p| patch::swt_bench_model_patch(&p));
        if let Some(p) = &test_patch {
            let _ = std::fs::write(artifact_dir.join("test.patch"), p);
        }
        let rules = payload.grading.rules;
        let mut report = serde_json::json!({
            "instance_id": inst.instance_id,
            "patch_is_None": test_patch.is_none(),
            "patch_exists": test_patch.as_deref().is_some_and(|p| !p.trim().is_empty()),
            "patch_successfully_applied": false,
            "resolved": false,
            "coverage_pred": null, "coverage_gold": null, "coverage_base": null,
            "coverage_delta_pred": null, "coverage_delta_gold": null,
            "rules": rules.name(),
            "strict": payload.grading.strict,
            "parser": family.name(),
            "suspicious": [],
        });
        // What of the upstream environment this one does not reproduce: parts of the spec, and
        // files of the base commit that the mirror lacks (a partial clone) or replaces.
        let mut left_out = payload.env.left_out.clone();
        left_out.extend(tree_gaps.iter().map(|g| g.describe(&inst.base_commit)));
        left_out.extend(self.sandbox.environment_notes(&recipe));
        left_out.extend(conda_left_out);
        if !left_out.is_empty() {
            report["environment_left_out"] = serde_json::json!(left_out);
        }
        if let Some(note) = self.sandbox.isolation_note() {
            report["isolation"] = note.into();
        }
        if let Some(p) = &product
            && p.usage.calls_without_usage > 0
        {
            report["llm_calls_without_usage"] = p.usage.calls_without_usage.into();
            report["llm_tokens_note"] = format!(
                "{} of the agent's {} calls were answered without `usage`: their tokens and cost are estimates from the text ({} characters a token)",
                p.usage.calls_without_usage,
                p.usage.calls,
                reprobench_gateway::accounting::CHARS_PER_ESTIMATED_TOKEN
            )
            .into();
        }
        let finish = |report: serde_json::Value,
                      success: bool,
                      verdict: &str,
                      error: Option<(FailureClass, &str, String)>| {
            let mut report = report;
            if let Some(p) = &product {
                report["agent"] = p.summary.clone();
            }
            let agent_error = product
                .as_ref()
                .and_then(|p| p.error.as_ref())
                .map(|(c, k, m)| (*c, k.as_str(), m.clone()));
            let (class, error_class, message) =
                error
                    .or(agent_error)
                    .unwrap_or((FailureClass::None, "", String::new()));
            if !message.is_empty() {
                report["message"] = message.clone().into();
            }
            let _ = std::fs::write(
                artifact_dir.join("report.json"),
                serde_json::to_vec_pretty(&report).unwrap_or_default(),
            );
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
        let style = payload.env.test_directives.as_str();
        let swt_bench_style = style == reprobench_domain::swt_bench::SWT_BENCH_DIRECTIVES;
        let directives = if swt_bench_style {
            patch::swt_bench_directives(test_patch.as_deref().unwrap_or(""), &inst.repo)
        } else {
            patch::test_directives(&files, style)
        };
        report["test_directives"] = serde_json::json!(directives);
        if directives.is_empty() {
            report["note"] = "the test patch touches no Python file: no test to run".into();
            return finish(report, false, "unresolved", None);
        }
        // SWT-bench runs the golden test patch's own test files in the gold runs.
        let gold_directives = if swt_bench_style {
            patch::swt_bench_directives(&inst.test_patch, &inst.repo)
        } else {
            patch::validate(Some(&inst.test_patch))
                .map(|f| patch::test_directives(&f, style))
                .unwrap_or_default()
        };
        report["gold_test_directives"] = serde_json::json!(gold_directives);
        let preparing = std::time::Instant::now();
        let prepared = tokio::select! {
            p = self.sandbox.prepare(&recipe) => match p {
                Ok(p) => p,
                Err(e) => return sandbox_error(e),
            },
            _ = ctx.cancel.cancelled() => return AttemptEnd::Cancelled,
        };
        // Building (or finding) the instance's environment: near zero once it is cached.
        report["prepare_ms"] = (preparing.elapsed().as_secs_f64() * 1e3).round().into();
        let job = Job {
            payload: &payload,
            prepared: &prepared,
            recipe: &recipe,
            limits,
        };
        let pred = test_patch.as_deref();
        let gold = Some(inst.test_patch.as_str());
        let steps = [
            (Which::Pred, false, pred, &directives),
            (Which::Pred, true, pred, &directives),
            (Which::Gold, false, gold, &gold_directives),
            (Which::Gold, true, gold, &gold_directives),
            (Which::Base, false, None, &directives),
            (Which::Base, true, None, &directives),
        ];
        let mut executions: [Option<Execution>; 6] = Default::default();
        let mut timed_out_at: Option<&str> = None;
        for (i, (which, post, test_patch, directives)) in steps.into_iter().enumerate() {
            let step = Step {
                label: RUNS[i],
                which,
                post,
                test_patch,
                directives,
            };
            if timed_out_at.is_some() {
                // As in SWT-bench, the executions after a timeout are not run; cached gold and
                // base logs are still read.
                executions[i] = self.cached(&job, &step);
                continue;
            }
            let e = tokio::select! {
                r = self.execute(&job, &step) => match r {
                    Ok(r) => r,
                    Err(e) => return sandbox_error(e),
                },
                _ = ctx.cancel.cancelled() => return AttemptEnd::Cancelled,
            };
            if e.record.timed_out {
                timed_out_at = Some(RUNS[i]);
            }
            executions[i] = Some(e);
        }
        let case_file = CaseFile {
            instance_id: Some(inst.instance_id.clone()),
            parser: Some(family.name().into()),
            repo: Some(inst.repo.clone()),
            exit_codes: RUNS
                .iter()
                .zip(&executions)
                .filter_map(|(r, e)| e.as_ref().map(|e| (r.to_string(), e.record.exit_code)))
                .collect(),
            timed_out: RUNS
                .iter()
                .zip(&executions)
                .filter(|(_, e)| e.as_ref().is_some_and(|e| e.record.timed_out))
                .map(|(r, _)| r.to_string())
                .collect(),
            findings: RUNS
                .iter()
                .zip(&executions)
                .flat_map(|(r, e)| {
                    e.as_ref()
                        .map(|e| script_findings(r, &e.record))
                        .unwrap_or_default()
                })
                .collect(),
        };
        let logs: [Option<&str>; 6] =
            std::array::from_fn(|i| executions[i].as_ref().map(|e| e.log.as_str()));
        let coverage_texts: [Option<&str>; 6] =
            std::array::from_fn(|i| executions[i].as_ref().and_then(|e| e.coverage.as_deref()));
        let traced = coverage_files(&payload).is_some();
        if let Err(e) = case::write(&artifact_dir, &case_file, &logs)
            .and_then(|()| case::write_coverage(&artifact_dir, &coverage_texts))
            .and_then(|()| {
                if traced {
                    std::fs::write(artifact_dir.join(case::CODE_PATCH_FILE), &inst.patch)
                } else {
                    Ok(())
                }
            })
        {
            return outcome_error(
                FailureClass::Infra,
                "artifacts",
                format!(
                    "cannot write the execution logs to {}: {e}",
                    artifact_dir.display()
                ),
            );
        }
        report["logs"] = RUNS
            .iter()
            .zip(&executions)
            .filter(|(_, e)| e.is_some())
            .map(|(r, _)| (r.to_string(), serde_json::Value::from(format!("{r}.log"))))
            .collect::<serde_json::Map<_, _>>()
            .into();
        report["executions"] = RUNS
            .iter()
            .zip(&executions)
            .filter_map(|(r, e)| {
                e.as_ref().map(|e| {
                    (
                        r.to_string(),
                        serde_json::to_value(&e.record).unwrap_or_default(),
                    )
                })
            })
            .collect::<serde_json::Map<_, _>>()
            .into();
        if let Some(run) = timed_out_at {
            report["note"] = format!(
                "{run} was killed at the {} s timeout; the executions after it were not run",
                payload.limits.timeout_s
            )
            .into();
        }
        let runs: [RunInput; 6] = std::array::from_fn(|i| RunInput {
            log: logs[i].map(str::to_string),
            exit_code: executions[i].as_ref().and_then(|e| e.record.exit_code),
            timed_out: executions[i].as_ref().is_some_and(|e| e.record.timed_out),
            findings: executions[i]
                .as_ref()
                .map(|e| script_findings(RUNS[i], &e.record))
                .unwrap_or_default(),
        });
        let g = match instance::grade(&runs, family, rules, payload.grading.strict) {
            Ok(g) => g,
            Err(e) => {
                let msg = format!("{}: {e}", inst.instance_id);
                report["note"] = msg.clone().into();
                return finish(
                    report,
                    false,
                    "error",
                    Some((FailureClass::BadInput, "timeout:pred_pre", msg)),
                );
            }
        };
        put_grade(&mut report, &g);
        if traced {
            let counts =
                coverage_texts.map(|t| t.map(coverage::from_tracer_lines).unwrap_or_default());
            let figures = coverage::figures(
                &inst.patch,
                std::array::from_fn(|i| &counts[i]),
                g.patch_applied,
            );
            put_coverage(&mut report, &figures);
        }
        let verdict = if g.resolved { "resolved" } else { "unresolved" };
        finish(report, g.resolved, verdict, None)
    }
}

fn script_findings(run: &str, record: &ExecRecord) -> Vec<instance::Suspicion> {
    let mut found = script::ScriptReport {
        patches: record.patches.clone(),
        ..Default::default()
    }
    .findings(run);
    if record.output_truncated {
        found.push(instance::Suspicion::new(
            instance::finding::OUTPUT_TRUNCATED,
            run,
            "the output outgrew the execution's cap: its middle was left out of the log (the line `[reprobench: N bytes of output left out here ...]` marks where), so tests reported only there are not seen",
        ));
    }
    found
}

/// Tests of `pred` in `cat` that `base` does not have in it.
fn new_in(pred: &Categories, base: &Categories, cat: Category) -> Vec<String> {
    let in_base: BTreeSet<&String> = base
        .iter()
        .filter(|(_, c)| **c == cat)
        .map(|(id, _)| id)
        .collect();
    pred.iter()
        .filter(|(id, c)| **c == cat && !in_base.contains(id))
        .map(|(id, _)| id.clone())
        .collect()
}

/// Puts SWT-bench's coverage figures into an instance's `report.json` (null when none).
pub fn put_coverage(report: &mut serde_json::Value, f: &coverage::CoverageFigures) {
    if let (Ok(serde_json::Value::Object(figures)), Some(r)) =
        (serde_json::to_value(f), report.as_object_mut())
    {
        r.extend(figures);
    }
}

/// Puts a grade into an instance's `report.json`: SWT-bench's keys, the test categories, and
/// reprobench's findings.
pub fn put_grade(report: &mut serde_json::Value, g: &InstanceGrade) {
    report["patch_successfully_applied"] = g.patch_applied.into();
    report["resolved"] = g.resolved.into();
    report["applicable"] = g.applicable.into();
    report["f2x"] = g.f2x.into();
    report["f2p"] = g.f2p.into();
    report["p2p"] = g.p2p.into();
    report["rules"] = g.rules.name().into();
    report["strict"] = g.strict.into();
    report["parser"] = g.parser.name().into();
    report["suspicious"] = serde_json::to_value(&g.suspicious).unwrap_or_default();
    if g.strict_changed {
        report["strict_changed"] = true.into();
    }
    if let (Some(pred), Some(gold), Some(base)) = (&g.tests_pred, &g.tests_gold, &g.tests_base) {
        report["added_f2p"] = g.added_f2p.len().into();
        for (key, cat) in [
            ("added_f2p_tests", Category::FailToPass),
            ("added_p2f_tests", Category::PassToFail),
            ("added_f2f_tests", Category::FailToFail),
            ("added_p2p_tests", Category::PassToPass),
        ] {
            report[key] = serde_json::json!(new_in(pred, base, cat));
        }
        let show = |t: &BTreeMap<String, Category>| serde_json::to_value(t).unwrap_or_default();
        report["tests_pred"] = show(pred);
        report["tests_gold"] = show(gold);
        report["tests_base"] = show(base);
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
    fn kind(&self) -> ExecutorKind {
        self.sandbox.kind()
    }

    fn settle(&self) -> BoxFuture<()> {
        self.sandbox.settle()
    }

    fn run(&self, spec: AttemptSpec, ctx: AttemptContext) -> BoxFuture<AttemptEnd> {
        let this = SwtExecutor {
            sandbox: self.sandbox.clone(),
            repos: self.repos.clone(),
            cache: self.cache.clone(),
            artifacts: self.artifacts.clone(),
            gateway: self.gateway.clone(),
            code: self.code.clone(),
        };
        Box::pin(async move { this.evaluate(spec, ctx).await })
    }
}

#[cfg(test)]
mod cache_key_tests {
    use super::*;

    fn key(identity: &str, limits: &Limits) -> String {
        execution_cache_key(&[identity, &limits_key(limits), "untraced", "env", "gold"])
    }

    #[test]
    fn the_cache_key_changes_with_the_sandbox_and_every_limit() {
        let base = Limits::default();
        let k = key("process", &base);
        // A process-executor result is not reused by a docker evaluation, nor across images.
        assert_ne!(k, key("docker on reprobench/python-base:bookworm-2", &base));
        assert_ne!(
            key("docker on a:1", &base),
            key("docker on a:2", &base),
            "base image"
        );
        let variants = [
            Limits {
                cpus: base.cpus * 2.0,
                ..base.clone()
            },
            Limits {
                memory_mb: base.memory_mb + 1,
                ..base.clone()
            },
            Limits {
                pids: base.pids + 1,
                ..base.clone()
            },
            Limits {
                disk_mb: base.disk_mb + 1,
                ..base.clone()
            },
            Limits {
                timeout: base.timeout + Duration::from_secs(1),
                ..base.clone()
            },
            Limits {
                max_output_bytes: base.max_output_bytes + 1,
                ..base.clone()
            },
        ];
        for v in &variants {
            assert_ne!(k, key("process", v), "{v:?}");
        }
        assert_eq!(k, key("process", &base.clone()), "stable");
        let process = reprobench_sandbox::process::ProcessSandbox::new(
            tempfile::tempdir().unwrap().path().join("c"),
        );
        assert_eq!(process.identity(), "process");
    }
}
