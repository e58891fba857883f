//! The SWT executor: produces the task's test patch (gold, issue-snippet, or the given
//! prediction), then evaluates it as SWT-bench does — six executions (pred/gold/base × pre/post
//! the golden code patch; post runs apply the code patch first, then the test patch; the gold
//! runs use the golden test patch's test files, the others the prediction's), gold and base
//! cached per instance and test files — and grades their logs with SWT-bench's rules. The six
//! logs and a `case.json` are kept in the attempt's directory, which is a grade directory
//! (`reprobench grade DIR`).

use reprobench_agents::run::{self as agent_run, AgentProduct, AgentSetup};
use reprobench_domain::outcome::{FailureClass, Outcome};
use reprobench_domain::registry::ExecutorKind;
use reprobench_domain::swt::{SwtAgent, SwtPayload, mirror_name};
use reprobench_domain::time::now_ms;
use reprobench_executor::{
    AttemptContext, AttemptEnd, AttemptSpec, BoxFuture, Executor, bad_input,
    error_end as outcome_error,
};
use reprobench_gateway::Gateway;
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

mod evaluate;

/// Runs SWT tasks in a sandbox.
pub struct SwtExecutor {
    sandbox: Arc<dyn Sandbox>,
    repos: PathBuf,
    cache: PathBuf,
    artifacts: PathBuf,
    gateway: Option<Gateway>,
    /// The node's name and what it lets a sweep run (see [`CodePolicy`]).
    code: (String, CodePolicy),
    /// The first execution of the task the coordinator named as the node's next.
    upcoming: Arc<std::sync::Mutex<UpcomingExecution>>,
    /// Whether the coordinator's hints are used ([`Executor::upcoming`]).
    next_task_ahead: bool,
}

/// The first execution of the task the coordinator named last as the node's next
/// ([`Executor::upcoming`]), once worked out; announced to the sandbox when a task runs its
/// last execution.
#[derive(Default)]
struct UpcomingExecution {
    /// Counts the hints, so that a hint worked out late does not replace a newer one.
    hint: u64,
    /// The named task's description, and its first execution once worked out.
    first: Option<(String, Prepared, ExecRequest)>,
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
            upcoming: Arc::default(),
            next_task_ahead: true,
        }
    }

    /// The same executor, announcing the first execution of the node's next task (as the
    /// coordinator names it) while the current task's last one runs, or (`false`) not.
    pub fn with_next_task_ahead(mut self, on: bool) -> SwtExecutor {
        self.next_task_ahead = on;
        self
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
    /// Milliseconds of CPU (user and system) the test command and the children it waited for
    /// used, where the sandbox tells (docker).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_cpu_ms: Option<u64>,
    /// Taken from the cache.
    #[serde(default)]
    pub cached: bool,
    /// The output outgrew the execution's cap: its middle was left out of the log.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub output_truncated: bool,
    /// Where the execution's time went, phase by phase in the order they ran (the sandbox's
    /// phases: for docker `create`, `attach`, `boot`, `copy`, `input`, `files`, `stage`,
    /// `unpack`, `go` (or `ahead` for a tree staged ahead, every phase before it 0), `command`,
    /// `exit`, `output`, the first four 0 for a container booted ahead while the execution
    /// before ran; for process `workdir`, `copy`, `stage`, `ahead` for a tree staged ahead,
    /// `unpack`, `command`, `collect`, `cleanup`).
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
/// Whether `test_patch` is the instance's golden test patch: its runs are the gold runs too.
fn is_golden(job: &Job<'_>, test_patch: Option<&str>) -> bool {
    test_patch == Some(job.payload.instance.test_patch.as_str())
}

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
        if !matches!(step.which, Which::Pred) || !is_golden(job, step.test_patch) {
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

    /// Whether `step` will be read from the cache rather than run, once the steps before it
    /// ran: its cache file is there, or it is a gold step whose file the prediction's step
    /// (test patch `pred`) writes as its gold twin.
    fn will_be_cached(&self, job: &Job<'_>, step: &Step<'_>, pred: Option<&str>) -> bool {
        let twin_made = matches!(step.which, Which::Gold) && is_golden(job, pred);
        twin_made || self.cache_file(job, step).is_some_and(|f| f.exists())
    }

    /// Tells the sandbox that `step` runs next, so that it can prepare its tree while the
    /// current execution runs.
    fn announce(&self, job: &Job<'_>, step: &Step<'_>) {
        self.sandbox
            .exec_ahead(job.prepared, &self.request(job, step));
    }

    /// Announces the first execution of the node's next task (as the coordinator named it),
    /// once: its container is then booted and its tree staged while this task's last one runs.
    fn announce_upcoming(&self) {
        let first = self
            .upcoming
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .first
            .take();
        if let Some((_, prepared, request)) = first {
            self.sandbox.exec_next_task_ahead(&prepared, &request);
        }
    }

    /// The sandbox request of `step`.
    fn request(&self, job: &Job<'_>, step: &Step<'_>) -> ExecRequest {
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
        ExecRequest {
            limits: job.limits.clone(),
            ..script::build(&plan)
        }
    }

    async fn execute(&self, job: &Job<'_>, step: &Step<'_>) -> Result<Execution, SandboxError> {
        if let Some(e) = self.cached(job, step) {
            return Ok(e);
        }
        let out = self
            .sandbox
            .exec(job.prepared, self.request(job, step))
            .await?;
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
            test_cpu_ms: out
                .command_cpu
                .filter(|_| report.started)
                .map(|d| d.as_millis() as u64),
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

impl SwtExecutor {
    /// What [`Executor::upcoming`] does, awaited: works out the first execution of the task
    /// `payload_json` describes and keeps it for [`SwtExecutor::announce_upcoming`] (`None`, or
    /// a task whose first execution cannot be known yet: nothing is kept).
    pub async fn prepare_upcoming(&self, payload_json: Option<String>) {
        let hint = self.new_hint();
        if let Some(payload_json) = payload_json {
            self.keep_upcoming(hint, &payload_json).await;
        }
    }

    /// Voids the kept first execution for a new hint, and numbers the hint.
    fn new_hint(&self) -> u64 {
        let mut upcoming = self
            .upcoming
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        upcoming.hint += 1;
        upcoming.first = None;
        upcoming.hint
    }

    /// Works out the first execution of hint `hint`'s task and keeps it, unless a newer hint
    /// came meanwhile.
    async fn keep_upcoming(&self, hint: u64, payload_json: &str) {
        let first = self.first_execution(payload_json).await;
        let mut upcoming = self
            .upcoming
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if upcoming.hint == hint {
            upcoming.first =
                first.map(|(prepared, request)| (payload_json.to_string(), prepared, request));
        }
    }

    /// Forgets the named task's first execution when `payload_json`'s task starts (on another
    /// slot, before the last execution of the one that was to announce it).
    fn started(&self, payload_json: &str) {
        let mut upcoming = self
            .upcoming
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if upcoming
            .first
            .as_ref()
            .is_some_and(|(named, ..)| named == payload_json)
        {
            upcoming.first = None;
        }
    }

    /// The same executor, for a task of its own (everything shared, nothing copied).
    fn share(&self) -> SwtExecutor {
        SwtExecutor {
            sandbox: self.sandbox.clone(),
            repos: self.repos.clone(),
            cache: self.cache.clone(),
            artifacts: self.artifacts.clone(),
            gateway: self.gateway.clone(),
            code: self.code.clone(),
            upcoming: self.upcoming.clone(),
            next_task_ahead: self.next_task_ahead,
        }
    }
}

impl Executor for SwtExecutor {
    fn kind(&self) -> ExecutorKind {
        self.sandbox.kind()
    }

    fn settle(&self) -> BoxFuture<()> {
        self.sandbox.settle()
    }

    fn run(&self, spec: AttemptSpec, ctx: AttemptContext) -> BoxFuture<AttemptEnd> {
        self.started(&spec.payload_json);
        let this = self.share();
        Box::pin(async move { this.evaluate(spec, ctx).await })
    }

    fn upcoming(&self, payload_json: Option<String>) {
        if !self.next_task_ahead {
            return;
        }
        // Numbered now, in the order the grants came; worked out in the background.
        let hint = self.new_hint();
        if let Some(payload_json) = payload_json {
            let this = self.share();
            tokio::spawn(async move { this.keep_upcoming(hint, &payload_json).await });
        }
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
