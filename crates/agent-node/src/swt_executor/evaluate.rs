//! One SWT evaluation as a pipeline of named steps: read the payload, plan the environment,
//! produce the test patch, choose the tests, prepare the environment, run the six executions,
//! keep their logs, grade. A step that ends the evaluation early returns the attempt's end as
//! its error ([`Early`]), so [`SwtExecutor::evaluate`] reads top to bottom.

// A step's error is the attempt's end, made once per attempt and returned at once: boxing it
// buys nothing.
#![allow(clippy::result_large_err)]

use super::*;
use std::path::Path;

/// A step's value, or the attempt's end when the step ends the evaluation early.
type Early<T> = Result<T, AttemptEnd>;

/// An error the attempt ends with: its class, its error class and its message.
type EndError = (FailureClass, String, String);

/// The instance's environment as the sandbox builds it.
struct EnvPlan {
    recipe: EnvRecipe,
    /// What of SWT-bench's environment this one does not reproduce: parts of the spec, files of
    /// the base commit the mirror lacks or replaces, the sandbox's own notes, conda packages.
    left_out: Vec<String>,
}

/// What every ending of the attempt reports beside its verdict.
struct Ending {
    started_at_ms: i64,
    start: Instant,
    artifact_dir: PathBuf,
    /// What an LLM or external agent produced (its usage is charged to the attempt).
    product: Option<AgentProduct>,
}

/// The test files (or SWT-bench's directives) the executions run.
struct Targets {
    /// The prediction's, for the pred and base runs.
    pred: Vec<String>,
    /// The golden test patch's, for the gold runs.
    gold: Vec<String>,
}

/// Why there is nothing to execute: the verdict to give, and the error if it is one.
struct NothingToRun {
    verdict: &'static str,
    error: Option<EndError>,
}

/// The six executions (those run or read from the cache), in [`RUNS`] order.
struct SixRuns {
    executions: [Option<Execution>; 6],
    /// The run that hit the timeout: the ones after it were not run.
    timed_out_at: Option<&'static str>,
}

impl SixRuns {
    fn logs(&self) -> [Option<&str>; 6] {
        std::array::from_fn(|i| self.executions[i].as_ref().map(|e| e.log.as_str()))
    }

    fn coverage_texts(&self) -> [Option<&str>; 6] {
        std::array::from_fn(|i| {
            self.executions[i]
                .as_ref()
                .and_then(|e| e.coverage.as_deref())
        })
    }

    /// `(run label, execution)` for each execution there is.
    fn present(&self) -> impl Iterator<Item = (&'static str, &Execution)> {
        RUNS.iter()
            .zip(&self.executions)
            .filter_map(|(r, e)| e.as_ref().map(|e| (*r, e)))
    }
}

/// The future's value, or the attempt's end if the attempt is cancelled first.
async fn unless_cancelled<T>(ctx: &AttemptContext, f: impl Future<Output = T>) -> Early<T> {
    tokio::select! {
        v = f => Ok(v),
        _ = ctx.cancel.cancelled() => Err(AttemptEnd::Cancelled),
    }
}

impl SwtExecutor {
    /// Evaluates one task's test patch as SWT-bench does.
    pub(super) async fn evaluate(&self, spec: AttemptSpec, ctx: AttemptContext) -> AttemptEnd {
        match self.evaluate_steps(spec, ctx).await {
            Ok(end) | Err(end) => end,
        }
    }

    async fn evaluate_steps(&self, spec: AttemptSpec, ctx: AttemptContext) -> Early<AttemptEnd> {
        let started_at_ms = now_ms();
        let start = Instant::now();
        let payload = read_payload(&spec)?;
        if let Some((class, why)) = self.refusal(&payload) {
            return Err(outcome_error(FailureClass::BadInput, class, why));
        }
        let family = log_parser(&payload)?;
        let artifact_dir = self.artifact_dir(&spec, &payload.instance.instance_id);
        let env = self.plan_environment(&payload)?;
        let limits = limits_of(&payload);
        let (test_patch, product) = self
            .produce_test_patch(&spec, &payload, &env.recipe, &limits, &artifact_dir, &ctx)
            .await?;
        // The prediction's patch as SWT-bench evaluates it (line breaks, binary diffs, final
        // newline).
        let test_patch = test_patch.map(|p| patch::swt_bench_model_patch(&p));
        if let Some(p) = &test_patch {
            let _ = std::fs::write(artifact_dir.join("test.patch"), p);
        }
        let ending = Ending {
            started_at_ms,
            start,
            artifact_dir,
            product,
        };
        let mut report = self.first_report(&payload, family, test_patch.as_deref(), &env, &ending);
        let targets = match choose_tests(&payload, test_patch.as_deref(), &mut report) {
            Ok(t) => t,
            Err(none) => return Ok(ending.finish(report, false, none.verdict, none.error)),
        };
        let preparing = Instant::now();
        let prepared = unless_cancelled(&ctx, self.sandbox.prepare(&env.recipe))
            .await?
            .map_err(sandbox_error)?;
        // Building (or finding) the instance's environment: near zero once it is cached.
        report["prepare_ms"] = (preparing.elapsed().as_secs_f64() * 1e3).round().into();
        let built_notes = self.sandbox.prepared_notes(&prepared);
        if !built_notes.is_empty() {
            let mut left_out = env.left_out.clone();
            left_out.extend(built_notes);
            report["environment_left_out"] = serde_json::json!(left_out);
        }
        let job = Job {
            payload: &payload,
            prepared: &prepared,
            recipe: &env.recipe,
            limits,
        };
        let runs = self
            .run_six(&job, test_patch.as_deref(), &targets, &ctx)
            .await?;
        keep_logs(&payload, family, &ending.artifact_dir, &runs)?;
        put_runs(&mut report, &runs, payload.limits.timeout_s);
        Ok(grade(&payload, family, &runs, report, &ending))
    }

    /// The attempt's own directory under the run's artifacts.
    fn artifact_dir(&self, spec: &AttemptSpec, instance_id: &str) -> PathBuf {
        let dir = self
            .artifacts
            .join(&spec.run_id)
            .join(instance_id)
            .join(format!("t{}-e{}", spec.attempt.task_id, spec.attempt.epoch));
        let _ = std::fs::create_dir_all(&dir);
        dir
    }

    /// The environment recipe: the spec's packages, the requirement or environment file read
    /// where SWT-bench reads it (the environment-setup commit, else the base commit), the
    /// mirror's gaps, and what all that leaves out.
    fn plan_environment(&self, payload: &SwtPayload) -> Early<EnvPlan> {
        let inst = &payload.instance;
        let env = &payload.env;
        let mirror = self.repos.join(mirror_name(&inst.repo));
        let mut conda_left_out = Vec::new();
        let commit = if inst.environment_setup_commit.is_empty() {
            &inst.base_commit
        } else {
            &inst.environment_setup_commit
        };
        let missing_file = |what: String| {
            outcome_error(
                FailureClass::BadInput,
                "bad_input:environment",
                format!(
                    "{}: {what}; the environment spec installs from that file (update the mirror with `reprobench datasets import`)",
                    inst.instance_id
                ),
            )
        };
        let requirements = if !env.conda_env_files.is_empty() {
            let yml = env
                .conda_env_files
                .iter()
                .find_map(|p| mirror::file_at(&mirror, commit, p))
                .ok_or_else(|| {
                    missing_file(format!(
                        "none of {} is in {} at {commit}",
                        env.conda_env_files.join(", "),
                        mirror.display()
                    ))
                })?;
            let (reqs, left) = reprobench_domain::swt_bench::conda_env_as_requirements(&yml);
            if !left.is_empty() {
                conda_left_out.push(format!(
                    "conda packages of the environment file that pip cannot install here: {}",
                    left.join(", ")
                ));
            }
            Some(reqs.join("\n") + "\n")
        } else if env.requirements_files.is_empty() {
            None
        } else {
            Some(
                mirror::requirements_at(&mirror, commit, &env.requirements_files)
                    .map_err(|e| missing_file(e.to_string()))?,
            )
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
            python: env.python.clone(),
            packages: env.packages.clone(),
            pre_install: env.pre_install.clone(),
            install: env.install.clone(),
            requirements,
            pip_packages: env.pip_packages.clone(),
            env_vars: env
                .env_vars
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            standalone: env.test_cmd.trim_start().starts_with("tox "),
            packages_as_of: env.packages_as_of.clone(),
            tree_gaps: tree_gaps.iter().map(|g| g.key()).collect(),
            fresh_build_tools: env.fresh_build_tools,
            conda_packages_as_of: env.conda_packages_as_of.clone(),
            locales: env.locales.clone(),
            system_packages: env.system_packages.clone(),
            build_constraints: env.build_constraints.clone(),
            dated_pip_for_install: env.dated_pip_for_install,
            gitlinks,
        };
        let mut left_out = env.left_out.clone();
        left_out.extend(tree_gaps.iter().map(|g| g.describe(&inst.base_commit)));
        left_out.extend(self.sandbox.environment_notes(&recipe));
        left_out.extend(conda_left_out);
        Ok(EnvPlan { recipe, left_out })
    }

    /// The test patch to evaluate: gold's, the issue snippet's, the prediction's, or what an LLM
    /// or external agent writes (with its product, whose usage the attempt is charged).
    async fn produce_test_patch(
        &self,
        spec: &AttemptSpec,
        payload: &SwtPayload,
        recipe: &EnvRecipe,
        limits: &Limits,
        artifact_dir: &Path,
        ctx: &AttemptContext,
    ) -> Early<(Option<String>, Option<AgentProduct>)> {
        let inst = &payload.instance;
        let backbone = match &payload.agent {
            SwtAgent::Gold => return Ok((Some(inst.test_patch.clone()), None)),
            SwtAgent::IssueSnippet => {
                return Ok((snippet::test_patch(&inst.problem_statement), None));
            }
            SwtAgent::Prediction { patch, .. } => return Ok((patch.clone(), None)),
            SwtAgent::Llm { backbone, .. } | SwtAgent::External { backbone, .. } => backbone,
        };
        let Some(gateway) = &self.gateway else {
            return Err(outcome_error(
                FailureClass::Infra,
                "no_gateway",
                "this node runs no LLM gateway, so it cannot run LLM agents".into(),
            ));
        };
        let prepared = unless_cancelled(ctx, self.sandbox.prepare(recipe))
            .await?
            .map_err(sandbox_error)?;
        let setup = AgentSetup {
            gateway,
            sandbox: self.sandbox.clone(),
            prepared,
            instance: inst,
            env: &payload.env,
            mirror: &recipe.mirror,
            scratch: &self.cache.join("checkouts"),
            artifacts: artifact_dir,
            // Stable across runs, so a replay finds this cell's recordings.
            task: format!(
                "{}/{}/{}/{}",
                inst.instance_id, spec.agent, spec.variant, backbone.name
            ),
            limits: limits.clone(),
        };
        let product = match &payload.agent {
            SwtAgent::Llm {
                name,
                variant,
                backbone,
                budget,
            } => agent_run::run_builtin(setup, name, variant, backbone, budget, &ctx.cancel).await,
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
            _ => unreachable!("the other agents returned above"),
        };
        let Some(product) = product else {
            return Err(AttemptEnd::Cancelled);
        };
        if let Some((class, error_class, message)) = &product.error
            && *class != FailureClass::None
        {
            let mut end = outcome_error(*class, error_class, message.clone());
            if let AttemptEnd::Finished(o) = &mut end {
                charge(o, &product);
                o.artifact_path = artifact_dir.display().to_string();
            }
            return Err(end);
        }
        Ok((product.test_patch.clone(), Some(product)))
    }

    /// The report before any execution: the patch's state, the rules, what the environment
    /// leaves out, the sandbox's isolation, and the agent's calls without usage.
    fn first_report(
        &self,
        payload: &SwtPayload,
        family: Family,
        test_patch: Option<&str>,
        env: &EnvPlan,
        ending: &Ending,
    ) -> serde_json::Value {
        let mut report = serde_json::json!({
            "instance_id": payload.instance.instance_id,
            "patch_is_None": test_patch.is_none(),
            "patch_exists": test_patch.is_some_and(|p| !p.trim().is_empty()),
            "patch_successfully_applied": false,
            "resolved": false,
            "coverage_pred": null, "coverage_gold": null, "coverage_base": null,
            "coverage_delta_pred": null, "coverage_delta_gold": null,
            "rules": payload.grading.rules.name(),
            "strict": payload.grading.strict,
            "parser": family.name(),
            "suspicious": [],
        });
        if !env.left_out.is_empty() {
            report["environment_left_out"] = serde_json::json!(env.left_out);
        }
        if let Some(note) = self.sandbox.isolation_note() {
            report["isolation"] = note.into();
        }
        if let Some(p) = &ending.product
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
        report
    }

    /// The first execution a task would run (its environment found built, nothing built for
    /// it), worked out from its payload alone: for a task whose test patch is known before it
    /// runs (gold, the issue's snippet, a prediction), `None` for the others and for a task
    /// that would end before any execution.
    pub(super) async fn first_execution(
        &self,
        payload_json: &str,
    ) -> Option<(Prepared, ExecRequest)> {
        let payload: SwtPayload = serde_json::from_str(payload_json).ok()?;
        if self.refusal(&payload).is_some() || log_parser(&payload).is_err() {
            return None;
        }
        let inst = &payload.instance;
        let test_patch = match &payload.agent {
            SwtAgent::Gold => Some(inst.test_patch.clone()),
            SwtAgent::IssueSnippet => snippet::test_patch(&inst.problem_statement),
            SwtAgent::Prediction { patch, .. } => patch.clone(),
            SwtAgent::Llm { .. } | SwtAgent::External { .. } => return None,
        };
        let test_patch = test_patch.map(|p| patch::swt_bench_model_patch(&p));
        let pred = test_patch.as_deref();
        let targets = choose_tests(&payload, pred, &mut serde_json::json!({})).ok()?;
        let env = self.plan_environment(&payload).ok()?;
        let prepared = self.sandbox.find_prepared(&env.recipe).await?;
        let job = Job {
            payload: &payload,
            prepared: &prepared,
            recipe: &env.recipe,
            limits: limits_of(&payload),
        };
        let steps = six_steps(&payload, pred, &targets);
        let first = steps.iter().find(|s| !self.will_be_cached(&job, s, pred))?;
        let request = self.request(&job, first);
        Some((prepared, request))
    }

    /// The six executions in order. As in SWT-bench, those after a timeout are not run (cached
    /// gold and base logs are still read).
    async fn run_six(
        &self,
        job: &Job<'_>,
        pred: Option<&str>,
        targets: &Targets,
        ctx: &AttemptContext,
    ) -> Early<SixRuns> {
        let steps = six_steps(job.payload, pred, targets);
        let mut runs = SixRuns {
            executions: Default::default(),
            timed_out_at: None,
        };
        for (i, step) in steps.iter().enumerate() {
            if runs.timed_out_at.is_some() {
                runs.executions[i] = self.cached(job, step);
                continue;
            }
            if !self.will_be_cached(job, step, pred) {
                // The next execution's tree is prepared while this one runs: this task's next,
                // else the first of the task the coordinator named as the node's next.
                match steps[i + 1..]
                    .iter()
                    .find(|s| !self.will_be_cached(job, s, pred))
                {
                    Some(next) => self.announce(job, next),
                    None => self.announce_upcoming(),
                }
            }
            let e = unless_cancelled(ctx, self.execute(job, step))
                .await?
                .map_err(sandbox_error)?;
            if e.record.timed_out {
                runs.timed_out_at = Some(RUNS[i]);
            }
            runs.executions[i] = Some(e);
        }
        Ok(runs)
    }
}

impl Ending {
    /// The attempt's outcome, with `report` written beside its logs. `error` (else the agent's
    /// own error) names what went wrong.
    fn finish(
        &self,
        mut report: serde_json::Value,
        success: bool,
        verdict: &str,
        error: Option<EndError>,
    ) -> AttemptEnd {
        if let Some(p) = &self.product {
            report["agent"] = p.summary.clone();
        }
        let agent_error = self.product.as_ref().and_then(|p| p.error.clone());
        let (class, error_class, message) =
            error
                .or(agent_error)
                .unwrap_or((FailureClass::None, String::new(), String::new()));
        if !message.is_empty() {
            report["message"] = message.clone().into();
        }
        let _ = std::fs::write(
            self.artifact_dir.join("report.json"),
            serde_json::to_vec_pretty(&report).unwrap_or_default(),
        );
        let mut outcome = Outcome {
            success,
            verdict: verdict.into(),
            failure_class: class,
            error_class,
            error_message: message,
            wall_s: self.start.elapsed().as_secs_f64(),
            started_at_ms: self.started_at_ms,
            finished_at_ms: now_ms(),
            artifact_path: self.artifact_dir.display().to_string(),
            details_json: report.to_string(),
            ..Default::default()
        };
        if let Some(p) = &self.product {
            charge(&mut outcome, p);
        }
        AttemptEnd::Finished(outcome)
    }
}

/// SWT-bench's six executions of a task, in [`RUNS`] order: pred, gold and base, each before
/// and after the golden code patch.
fn six_steps<'a>(
    payload: &'a SwtPayload,
    pred: Option<&'a str>,
    targets: &'a Targets,
) -> Vec<Step<'a>> {
    let gold = Some(payload.instance.test_patch.as_str());
    let steps = [
        (Which::Pred, false, pred, &targets.pred),
        (Which::Pred, true, pred, &targets.pred),
        (Which::Gold, false, gold, &targets.gold),
        (Which::Gold, true, gold, &targets.gold),
        (Which::Base, false, None, &targets.pred),
        (Which::Base, true, None, &targets.pred),
    ];
    steps
        .into_iter()
        .enumerate()
        .map(|(i, (which, post, test_patch, directives))| Step {
            label: RUNS[i],
            which,
            post,
            test_patch,
            directives,
        })
        .collect()
}

/// The task's SWT payload.
fn read_payload(spec: &AttemptSpec) -> Early<SwtPayload> {
    serde_json::from_str(&spec.payload_json).map_err(|e| {
        AttemptEnd::Finished(bad_input(
            "bad_payload",
            format!("task {} has no valid SWT payload: {e}", spec.instance_id),
        ))
    })
}

/// The log parser the instance's spec names.
fn log_parser(payload: &SwtPayload) -> Early<Family> {
    let inst = &payload.instance;
    parser_for(&inst.repo, &payload.env.log_parser).ok_or_else(|| {
        outcome_error(
            FailureClass::BadInput,
            "bad_input:log_parser",
            format!(
                "{}: log parser `{}` is unknown; known: {}",
                inst.instance_id,
                payload.env.log_parser,
                Family::names().join(", ")
            ),
        )
    })
}

/// Each execution's limits, from the sweep's `[eval]`.
fn limits_of(payload: &SwtPayload) -> Limits {
    Limits {
        cpus: payload.limits.cpus,
        memory_mb: payload.limits.memory_mb,
        pids: payload.limits.pids,
        disk_mb: payload.limits.disk_mb,
        timeout: Duration::from_secs(payload.limits.timeout_s),
        ..Limits::default()
    }
}

/// The tests the executions run: the prediction's and the golden test patch's, as SWT-bench
/// chooses them (written into `report`), or why there is nothing to run.
fn choose_tests(
    payload: &SwtPayload,
    test_patch: Option<&str>,
    report: &mut serde_json::Value,
) -> Result<Targets, NothingToRun> {
    let inst = &payload.instance;
    let files = match patch::validate(test_patch) {
        Ok(f) => f,
        Err(patch::PatchProblem::Empty) => {
            report["note"] = "no test patch: nothing to evaluate".into();
            return Err(NothingToRun {
                verdict: "unresolved",
                error: None,
            });
        }
        Err(problem) => {
            let msg = problem.message(&inst.instance_id);
            report["note"] = msg.clone().into();
            return Err(NothingToRun {
                verdict: "error",
                error: Some((
                    FailureClass::BadInput,
                    format!("bad_input:{}", problem.class()),
                    msg,
                )),
            });
        }
    };
    let style = payload.env.test_directives.as_str();
    let swt_bench_style = style == reprobench_domain::swt_bench::SWT_BENCH_DIRECTIVES;
    let pred = if swt_bench_style {
        patch::swt_bench_directives(test_patch.unwrap_or(""), &inst.repo)
    } else {
        patch::test_directives(&files, style)
    };
    report["test_directives"] = serde_json::json!(pred);
    if pred.is_empty() {
        report["note"] = "the test patch touches no Python file: no test to run".into();
        return Err(NothingToRun {
            verdict: "unresolved",
            error: None,
        });
    }
    // SWT-bench runs the golden test patch's own test files in the gold runs.
    let gold = if swt_bench_style {
        patch::swt_bench_directives(&inst.test_patch, &inst.repo)
    } else {
        patch::validate(Some(&inst.test_patch))
            .map(|f| patch::test_directives(&f, style))
            .unwrap_or_default()
    };
    report["gold_test_directives"] = serde_json::json!(gold);
    Ok(Targets { pred, gold })
}

/// Writes the six logs, `case.json`, the coverage counts and (when traced) the golden code
/// patch into the attempt's directory, which `reprobench grade DIR` regrades.
fn keep_logs(
    payload: &SwtPayload,
    family: Family,
    artifact_dir: &Path,
    runs: &SixRuns,
) -> Early<()> {
    let inst = &payload.instance;
    let case_file = CaseFile {
        instance_id: Some(inst.instance_id.clone()),
        parser: Some(family.name().into()),
        repo: Some(inst.repo.clone()),
        exit_codes: runs
            .present()
            .map(|(r, e)| (r.to_string(), e.record.exit_code))
            .collect(),
        timed_out: runs
            .present()
            .filter(|(_, e)| e.record.timed_out)
            .map(|(r, _)| r.to_string())
            .collect(),
        findings: runs
            .present()
            .flat_map(|(r, e)| script_findings(r, &e.record))
            .collect(),
    };
    let traced = coverage_files(payload).is_some();
    case::write(artifact_dir, &case_file, &runs.logs())
        .and_then(|()| case::write_coverage(artifact_dir, &runs.coverage_texts()))
        .and_then(|()| {
            if traced {
                std::fs::write(artifact_dir.join(case::CODE_PATCH_FILE), &inst.patch)
            } else {
                Ok(())
            }
        })
        .map_err(|e| {
            outcome_error(
                FailureClass::Infra,
                "artifacts",
                format!(
                    "cannot write the execution logs to {}: {e}",
                    artifact_dir.display()
                ),
            )
        })
}

/// The executions in the report: their log files, their records, and the timeout's note.
fn put_runs(report: &mut serde_json::Value, runs: &SixRuns, timeout_s: u64) {
    report["logs"] = runs
        .present()
        .map(|(r, _)| (r.to_string(), serde_json::Value::from(format!("{r}.log"))))
        .collect::<serde_json::Map<_, _>>()
        .into();
    report["executions"] = runs
        .present()
        .map(|(r, e)| {
            (
                r.to_string(),
                serde_json::to_value(&e.record).unwrap_or_default(),
            )
        })
        .collect::<serde_json::Map<_, _>>()
        .into();
    if let Some(run) = runs.timed_out_at {
        report["note"] = format!(
            "{run} was killed at the {timeout_s} s timeout; the executions after it were not run"
        )
        .into();
    }
}

/// Grades the six logs with SWT-bench's rules (and the coverage figures when traced) and ends
/// the attempt with the verdict.
fn grade(
    payload: &SwtPayload,
    family: Family,
    runs: &SixRuns,
    mut report: serde_json::Value,
    ending: &Ending,
) -> AttemptEnd {
    let inst = &payload.instance;
    let logs = runs.logs();
    let inputs: [RunInput; 6] = std::array::from_fn(|i| {
        let e = runs.executions[i].as_ref();
        RunInput {
            log: logs[i].map(str::to_string),
            exit_code: e.and_then(|e| e.record.exit_code),
            timed_out: e.is_some_and(|e| e.record.timed_out),
            findings: e
                .map(|e| script_findings(RUNS[i], &e.record))
                .unwrap_or_default(),
        }
    });
    let g = match instance::grade(
        &inputs,
        family,
        payload.grading.rules,
        payload.grading.strict,
    ) {
        Ok(g) => g,
        Err(e) => {
            let msg = format!("{}: {e}", inst.instance_id);
            report["note"] = msg.clone().into();
            return ending.finish(
                report,
                false,
                "error",
                Some((FailureClass::BadInput, "timeout:pred_pre".into(), msg)),
            );
        }
    };
    put_grade(&mut report, &g);
    if coverage_files(payload).is_some() {
        let counts = runs
            .coverage_texts()
            .map(|t| t.map(coverage::from_tracer_lines).unwrap_or_default());
        let figures = coverage::figures(
            &inst.patch,
            std::array::from_fn(|i| &counts[i]),
            g.patch_applied,
        );
        put_coverage(&mut report, &figures);
    }
    let verdict = if g.resolved { "resolved" } else { "unresolved" };
    ending.finish(report, g.resolved, verdict, None)
}
