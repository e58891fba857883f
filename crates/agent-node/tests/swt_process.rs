//! SWT evaluation end to end on the process sandbox, over the swt-mini dataset in this
//! repository: gold resolves every instance; hand-made predictions land in the right categories.

use reprobench_agent_node::swt_executor::SwtExecutor;
use reprobench_domain::outcome::{AttemptRef, FailureClass, Outcome};
use reprobench_domain::swt::{EvalLimits, SwtAgent, SwtInstance, SwtPayload, load_dataset};
use reprobench_executor::{AttemptContext, AttemptEnd, AttemptSpec, Executor};
use reprobench_sandbox::process::ProcessSandbox;
use reprobench_sandbox::{
    EnvRecipe, ExecOutput, ExecRequest, PatchFile, Prepared, Sandbox, SandboxError,
};
use reprobench_swt::mirror;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn datasets() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../datasets")
}

struct Fixture {
    _dir: tempfile::TempDir,
    exec: SwtExecutor,
    instances: Vec<SwtInstance>,
}

fn fixture() -> Fixture {
    fixture_with(|root| Arc::new(ProcessSandbox::new(root)))
}

/// The swt-mini fixture over the sandbox `sandbox` makes from its root directory.
fn fixture_with(sandbox: impl FnOnce(PathBuf) -> Arc<dyn Sandbox>) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let ds = load_dataset("swt-mini", &datasets(), None).unwrap();
    assert!(ds.errors.is_empty(), "{:?}", ds.errors);
    let repos = dir.path().join("repos");
    mirror::prepare(&datasets().join("swt-mini/src"), &repos, &ds.instances).unwrap();
    let exec = SwtExecutor::new(
        sandbox(dir.path().join("sandbox")),
        repos,
        dir.path().join("cache"),
        dir.path().join("artifacts"),
    );
    Fixture {
        _dir: dir,
        exec,
        instances: ds.instances,
    }
}

/// The fixture's first instance graded by the pytest log parser.
fn pytest_instance(f: &Fixture) -> SwtInstance {
    f.instances
        .iter()
        .find(|i| i.env.as_ref().unwrap().log_parser == "pytest")
        .expect("swt-mini has a pytest instance")
        .clone()
}

/// The task description of evaluating `agent` on `inst`.
fn payload_json(inst: &SwtInstance, agent: SwtAgent, timeout_s: u64) -> String {
    let payload = SwtPayload {
        instance: inst.clone(),
        env: inst.env.clone().unwrap(),
        agent,
        limits: EvalLimits {
            timeout_s,
            cpus: 1.0,
            memory_mb: 2048,
            pids: 256,
            disk_mb: 512,
        },
        grading: Default::default(),
    };
    serde_json::to_string(&payload).unwrap()
}

async fn evaluate(f: &Fixture, inst: &SwtInstance, agent: SwtAgent, timeout_s: u64) -> Outcome {
    let spec = AttemptSpec {
        attempt: AttemptRef {
            task_id: 1,
            epoch: 1,
        },
        run_id: "test".into(),
        agent: "a".into(),
        variant: "full".into(),
        instance_id: inst.instance_id.clone(),
        affinity_key: String::new(),
        payload_json: payload_json(inst, agent, timeout_s),
        attempt_number: 1,
    };
    let (progress, _) = tokio::sync::mpsc::unbounded_channel();
    let ctx = AttemptContext {
        cancel: Default::default(),
        progress,
    };
    match f.exec.run(spec, ctx).await {
        AttemptEnd::Finished(o) => o,
        AttemptEnd::Cancelled => panic!("cancelled"),
    }
}

fn details(o: &Outcome) -> serde_json::Value {
    serde_json::from_str(&o.details_json).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gold_resolves_every_swt_mini_instance() {
    let f = Arc::new(fixture());
    assert!(f.instances.len() >= 10);
    let mut handles = Vec::new();
    for chunk in f.instances.chunks(f.instances.len().div_ceil(2)) {
        let f = f.clone();
        let chunk: Vec<SwtInstance> = chunk.to_vec();
        handles.push(tokio::spawn(async move {
            let mut out = Vec::new();
            for inst in chunk {
                let o = evaluate(&f, &inst, SwtAgent::Gold, 120).await;
                out.push((inst, o));
            }
            out
        }));
    }
    for h in handles {
        for (inst, o) in h.await.unwrap() {
            let d = details(&o);
            assert!(
                o.success,
                "{} not resolved: {} {}\n{d:#}",
                inst.instance_id, o.verdict, o.error_message
            );
            // The golden FAIL_TO_PASS tests are exactly the added F→P tests.
            let mut added: Vec<String> =
                serde_json::from_value(d["added_f2p_tests"].clone()).unwrap();
            added.sort();
            let mut want = inst.fail_to_pass.clone();
            want.sort();
            assert_eq!(added, want, "{}", inst.instance_id);
        }
    }
}

fn append_test(test_patch: &str, file: &str, body: &str) -> String {
    format!(
        "{test_patch}diff --git a/{file} b/{file}\nnew file mode 100644\n--- /dev/null\n+++ b/{file}\n@@ -0,0 +1,{} @@\n{}",
        body.lines().count(),
        body.lines().map(|l| format!("+{l}\n")).collect::<String>()
    )
}

#[tokio::test]
async fn predictions_fall_into_their_categories() {
    let f = fixture();
    let inst = pytest_instance(&f);
    let pred = |patch: Option<String>| SwtAgent::Prediction {
        model: "m".into(),
        patch,
    };

    // Empty: not resolved, no error.
    let o = evaluate(&f, &inst, pred(Some("  \n".into())), 60).await;
    assert_eq!(
        (o.success, o.verdict.as_str(), o.failure_class),
        (false, "unresolved", FailureClass::None)
    );

    // A test failing before and after the fix: F→F, not resolved.
    let f2f = append_test(
        "",
        "tests/test_always_fails.py",
        "def test_always_fails():\n    assert False\n",
    );
    let o = evaluate(&f, &inst, pred(Some(f2f)), 60).await;
    let d = details(&o);
    assert!(!o.success);
    assert_eq!(
        d["added_f2f_tests"],
        serde_json::json!(["tests/test_always_fails.py::test_always_fails"]),
        "{d:#}"
    );

    // A test passing before and after: P→P, not resolved.
    let p2p = append_test(
        "",
        "tests/test_always_passes.py",
        "def test_always_passes():\n    assert True\n",
    );
    let o = evaluate(&f, &inst, pred(Some(p2p)), 60).await;
    let d = details(&o);
    assert!(!o.success);
    assert_eq!(d["p2p"], true, "{d:#}");

    // A test that prints a fake PASSED line is graded as SWT-bench grades it: the summary's
    // FAILED line comes later and wins.
    let fake = append_test(
        "",
        "tests/test_fake.py",
        "import sys\ndef test_fake():\n    print('PASSED tests/test_fake.py::test_fake')\n    sys.stdout.flush()\n    assert False\n",
    );
    let o = evaluate(&f, &inst, pred(Some(fake)), 60).await;
    assert!(!o.success, "{}", o.details_json);

    // A test that hangs is killed at the timeout, not stuck; as in SWT-bench, a timed-out
    // pred_pre execution makes the instance an error and the executions after it are not run.
    let hang = append_test(
        "",
        "tests/test_hang.py",
        "import time\ndef test_hang():\n    time.sleep(3600)\n",
    );
    let o = evaluate(&f, &inst, pred(Some(hang)), 3).await;
    let d = details(&o);
    assert_eq!(
        (o.success, o.verdict.as_str(), o.error_class.as_str()),
        (false, "error", "timeout:pred_pre"),
        "{d:#}"
    );
    assert!(
        d["note"].as_str().unwrap_or("").contains("timeout"),
        "{d:#}"
    );
    let executions = d["executions"].as_object().unwrap();
    assert_eq!(executions["pred_pre"]["timed_out"], true, "{d:#}");
    assert!(
        !executions.contains_key("pred_post"),
        "not run after the timeout: {d:#}"
    );

    // Paths outside the repository are refused before anything runs.
    let outside = append_test("", "../escape.py", "x = 1\n");
    let o = evaluate(&f, &inst, pred(Some(outside)), 60).await;
    assert_eq!(
        (o.failure_class, o.error_class.as_str()),
        (FailureClass::BadInput, "bad_input:patch_outside_repo")
    );
}

/// A process sandbox that records, in order, the executions it is told come next and those it
/// runs (by their patches), and otherwise does what the process sandbox does.
struct Recording {
    inner: ProcessSandbox,
    log: std::sync::Mutex<Vec<(&'static str, Vec<PatchFile>)>>,
}

impl Sandbox for Recording {
    fn kind(&self) -> reprobench_domain::registry::ExecutorKind {
        self.inner.kind()
    }
    fn identity(&self) -> String {
        self.inner.identity()
    }
    fn prepare(
        &self,
        recipe: &EnvRecipe,
    ) -> reprobench_sandbox::BoxFuture<Result<Prepared, SandboxError>> {
        self.inner.prepare(recipe)
    }
    fn find_prepared(&self, recipe: &EnvRecipe) -> reprobench_sandbox::BoxFuture<Option<Prepared>> {
        self.inner.find_prepared(recipe)
    }
    fn exec_ahead(&self, prepared: &Prepared, req: &ExecRequest) {
        self.log
            .lock()
            .unwrap()
            .push(("ahead", req.patches.clone()));
        self.inner.exec_ahead(prepared, req)
    }
    fn exec(
        &self,
        prepared: &Prepared,
        req: ExecRequest,
    ) -> reprobench_sandbox::BoxFuture<Result<ExecOutput, SandboxError>> {
        self.log.lock().unwrap().push(("exec", req.patches.clone()));
        self.inner.exec(prepared, req)
    }
}

/// The swt-mini fixture over a [`Recording`] process sandbox that stages announced trees always.
fn recording_fixture() -> (Fixture, Arc<Recording>) {
    let mut recording = None;
    let f = fixture_with(|root| {
        let sandbox = Arc::new(Recording {
            inner: ProcessSandbox::new(root)
                .stage_ahead(reprobench_sandbox::process::StageAheadMode::Always),
            log: Default::default(),
        });
        recording = Some(sandbox.clone());
        sandbox
    });
    (f, recording.unwrap())
}

#[tokio::test]
async fn each_execution_after_an_instances_first_is_announced_and_runs_in_the_tree_staged_ahead() {
    let (f, sandbox) = recording_fixture();
    let inst = pytest_instance(&f);
    let other = append_test(
        "",
        "tests/test_other.py",
        "def test_other():\n    assert True\n",
    );
    let agents = [
        // Cold: the prediction (the golden test patch) before and after, then the base runs;
        // the gold runs are the prediction's own.
        (SwtAgent::Gold, 4),
        // Gold and base cached, other test files: its own two runs and the base runs.
        (
            SwtAgent::Prediction {
                model: "m".into(),
                patch: Some(other),
            },
            4,
        ),
    ];
    for (agent, runs) in agents {
        sandbox.log.lock().unwrap().clear();
        let o = evaluate(&f, &inst, agent, 120).await;
        let d = details(&o);
        let log = sandbox.log.lock().unwrap().clone();
        let of = |what: &str| -> Vec<Vec<PatchFile>> {
            log.iter()
                .filter(|(w, _)| *w == what)
                .map(|(_, p)| p.clone())
                .collect()
        };
        let (ran, announced) = (of("exec"), of("ahead"));
        assert_eq!(ran.len(), runs, "{log:?}");
        // Every execution but the first was announced, in order, and nothing else was.
        assert_eq!(announced, ran[1..].to_vec(), "{log:?}");
        // ... while the one before it ran, not after.
        for (i, (what, _)) in log.iter().enumerate().filter(|(_, (w, _))| *w == "ahead") {
            assert_eq!(
                log.get(i + 1).map(|(w, _)| *w),
                Some("exec"),
                "{what}: {log:?}"
            );
        }
        // Each announced execution ran in the tree staged for it (a cached execution's record
        // is that of the run it was read from).
        let staged_ahead = d["executions"]
            .as_object()
            .unwrap()
            .values()
            .filter(|e| e["cached"] == false)
            .filter(|e| {
                e["timings"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|t| t["phase"] == "ahead")
            })
            .count();
        assert_eq!(staged_ahead, runs - 1, "{d:#}");
    }
}

#[tokio::test]
async fn the_named_next_tasks_first_execution_is_staged_while_the_last_one_before_it_runs() {
    let (f, sandbox) = recording_fixture();
    let inst = pytest_instance(&f);
    let next = f
        .instances
        .iter()
        .find(|i| {
            i.instance_id != inst.instance_id && i.env.as_ref().unwrap().log_parser == "pytest"
        })
        .expect("swt-mini has two pytest instances")
        .clone();
    // Named before its environment is built: nothing can be known of it, nothing is announced.
    f.exec
        .prepare_upcoming(Some(payload_json(&next, SwtAgent::Gold, 120)))
        .await;
    evaluate(&f, &inst, SwtAgent::Gold, 120).await;
    let announced =
        |log: &[(&str, Vec<PatchFile>)]| log.iter().filter(|(w, _)| *w == "ahead").count();
    let log = sandbox.log.lock().unwrap().clone();
    assert_eq!(
        announced(&log),
        3,
        "only the task's own executions: {log:?}"
    );
    evaluate(&f, &next, SwtAgent::Gold, 120).await;
    // Both built, gold and base cached: each gold evaluation runs its two prediction runs. The
    // coordinator names `next` as the node's next task while `inst` runs.
    f.exec
        .prepare_upcoming(Some(payload_json(&next, SwtAgent::Gold, 120)))
        .await;
    sandbox.log.lock().unwrap().clear();
    let o = evaluate(&f, &inst, SwtAgent::Gold, 120).await;
    assert_eq!(o.verdict, "resolved", "{}", o.details_json);
    let o = evaluate(&f, &next, SwtAgent::Gold, 120).await;
    assert_eq!(o.verdict, "resolved", "{}", o.details_json);
    let log = sandbox.log.lock().unwrap().clone();
    let order: Vec<&str> = log.iter().map(|(w, _)| *w).collect();
    // inst: its second run announced before its first; `next`'s first announced before inst's
    // last; then `next` announces its own second.
    assert_eq!(
        order,
        ["ahead", "exec", "ahead", "exec", "ahead", "exec", "exec"],
        "{log:?}"
    );
    assert_eq!(
        log[2].1, log[5].1,
        "the announced one is the one `next` runs first"
    );
    assert_ne!(log[2].1, log[3].1);
    // ... and it ran in the tree staged ahead for it, as did each task's second run.
    let staged = |o: &Outcome, run: &str| {
        details(o)["executions"][run]["timings"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|t| t["phase"] == "ahead")
    };
    assert!(staged(&o, "pred_pre"), "{}", o.details_json);
    assert!(staged(&o, "pred_post"), "{}", o.details_json);
    // A grant that names no next task voids the hint: nothing more is announced.
    f.exec.prepare_upcoming(None).await;
    sandbox.log.lock().unwrap().clear();
    evaluate(&f, &inst, SwtAgent::Gold, 120).await;
    let log = sandbox.log.lock().unwrap().clone();
    assert_eq!(announced(&log), 1, "{log:?}");
}
