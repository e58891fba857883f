//! [`Workspace`] for SWT agents: read-only repository tools over a checkout on the node, and
//! `bash`, `python` and test runs in fresh copies of the instance's sandbox environment.

use super::tools::ToolBox;
use super::{TestRun, Workspace};
use reprobench_domain::sync::lock;
use reprobench_sandbox::stage::SUPPORT_ENV;
use reprobench_sandbox::{ExecRequest, InputFile, Limits, Prepared, Sandbox, SandboxError};
use reprobench_swt::{patch, script};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Characters of command output handed back to the model.
const MAX_TOOL_OUTPUT: usize = 8_000;

/// Why a sandbox tool call or a test run in a [`SandboxWorkspace`] failed.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    /// A `bash` or `python` call's arguments are not valid JSON.
    #[error("error: arguments are not a JSON object ({source}); expected {{\"{field}\": \"...\"}}")]
    ArgumentsNotJson {
        field: &'static str,
        source: serde_json::Error,
    },
    /// A `bash` or `python` call lacks its string argument.
    #[error("error: missing string argument `{field}`")]
    MissingArgument { field: &'static str },
    /// The test file's path is absolute or leaves the repository.
    #[error(transparent)]
    TestPathRefused(SandboxError),
    /// The sandbox could not run the test.
    #[error("the sandbox could not run the test: {0}")]
    Sandbox(#[source] SandboxError),
    /// The test file could not be written into the repository (its patch did not apply).
    #[error("the test file {path} could not be written into the repository")]
    TestNotWritten { path: String },
}

/// A workspace over one instance: its checkout (for reading) and its sandbox (for running).
pub struct SandboxWorkspace {
    /// Shared with the blocking threads the tools run on (walks, greps, code-graph builds).
    tools: Arc<ToolBox>,
    sandbox: Arc<dyn Sandbox>,
    prepared: Prepared,
    test_cmd: String,
    directive_style: String,
    limits: Limits,
    test_runs: AtomicU32,
    commands: AtomicU32,
    /// The task's `python` cells so far (its session, replayed before each new cell).
    python_cells: std::sync::Mutex<Vec<String>>,
    /// The repository's test files and their BM25 index, built on first use (LIBRO's placement).
    test_files: Arc<std::sync::OnceLock<Arc<TestFileIndex>>>,
}

/// The test files of a checkout, indexed by their text.
struct TestFileIndex {
    paths: Vec<String>,
    index: super::tools::bm25::Bm25Index,
}

impl SandboxWorkspace {
    /// A workspace reading `checkout` and running in `prepared` with `test_cmd`; `limits` bound
    /// each run (their timeout is shortened to two minutes for `bash`/`python` tool calls).
    pub fn new(
        checkout: &std::path::Path,
        sandbox: Arc<dyn Sandbox>,
        prepared: Prepared,
        test_cmd: &str,
        directive_style: &str,
        limits: Limits,
    ) -> SandboxWorkspace {
        SandboxWorkspace {
            tools: Arc::new(ToolBox::new(checkout)),
            sandbox,
            prepared,
            test_cmd: test_cmd.to_string(),
            directive_style: directive_style.to_string(),
            limits,
            test_runs: AtomicU32::new(0),
            commands: AtomicU32::new(0),
            python_cells: std::sync::Mutex::default(),
            test_files: Arc::default(),
        }
    }

    /// The same workspace, its code graph shared with every workspace of `commit` of
    /// `repository` in this process (the checkout must be that commit, unmodified: agents write
    /// only into their sandboxes' copies).
    pub fn with_shared_graph(mut self, repository: &str, commit: &str) -> SandboxWorkspace {
        let root = self.tools.repo().root().to_path_buf();
        self.tools = Arc::new(ToolBox::shared(root, repository, commit));
        self
    }

    /// The read-only tools (for retrieval by baselines).
    pub fn toolbox(&self) -> &ToolBox {
        &self.tools
    }

    /// The read-only tools, to move onto a blocking thread.
    pub fn shared_toolbox(&self) -> Arc<ToolBox> {
        self.tools.clone()
    }

    /// How many test runs and sandbox commands the agent made.
    pub fn runs(&self) -> (u32, u32) {
        (
            self.test_runs.load(Ordering::Relaxed),
            self.commands.load(Ordering::Relaxed),
        )
    }

    /// Runs `command` in a fresh copy of the repository, with `support` files outside it.
    async fn run_command(&self, support: Vec<InputFile>, command: Vec<String>) -> String {
        self.run_command_timed(support, command).await.0
    }

    /// Runs `code` as the next cell of the task's Python session: the earlier cells run again
    /// first, their output discarded (so their state carries over), then `code`, whose last
    /// expression's value is printed. A cell killed at the time limit is not kept.
    async fn run_python_cell(&self, code: String) -> String {
        let mut cells = lock(&self.python_cells).clone();
        cells.push(code);
        let support = vec![
            InputFile {
                path: "session.py".into(),
                contents: PYTHON_SESSION.as_bytes().to_vec(),
                mode: 0o644,
            },
            InputFile {
                path: "cells.json".into(),
                contents: serde_json::to_vec(&cells).expect("strings serialize"),
                mode: 0o644,
            },
        ];
        let run = format!("exec python \"${}/session.py\"", SUPPORT_ENV);
        let (text, timed_out) = self
            .run_command_timed(support, vec!["sh".into(), "-c".into(), run])
            .await;
        if !timed_out {
            let code = cells.pop().expect("the new cell");
            lock(&self.python_cells).push(code);
        }
        text
    }

    /// [`Self::run_command`], also saying whether the time limit killed it.
    async fn run_command_timed(
        &self,
        support: Vec<InputFile>,
        command: Vec<String>,
    ) -> (String, bool) {
        self.commands.fetch_add(1, Ordering::Relaxed);
        let limits = Limits {
            timeout: self.limits.timeout.min(Duration::from_secs(120)),
            ..self.limits.clone()
        };
        let seconds = limits.timeout.as_secs();
        match self
            .sandbox
            .exec(
                &self.prepared,
                ExecRequest {
                    support,
                    command,
                    limits,
                    ..ExecRequest::default()
                },
            )
            .await
        {
            Ok(out) => {
                let status = match (out.exit_code, out.timed_out) {
                    (_, true) => format!("killed at the {seconds} s limit"),
                    (Some(c), _) => format!("exit code {c}"),
                    (None, _) => "no exit code".to_string(),
                };
                (cap(&format!("[{status}]\n{}", out.output)), out.timed_out)
            }
            Err(e) => (
                format!("error: the sandbox could not run the command: {e}"),
                false,
            ),
        }
    }
}

/// The `python` tool's session driver (runs inside the sandbox, Python 3.6 to 3.13).
const PYTHON_SESSION: &str = include_str!("python_session.py");

/// Cuts long output to its head and tail (a test run's verdict is at its end).
pub fn cap(text: &str) -> String {
    if text.len() <= MAX_TOOL_OUTPUT {
        return text.to_string();
    }
    let mut head = MAX_TOOL_OUTPUT / 3;
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len() - (MAX_TOOL_OUTPUT - head);
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    format!(
        "{}\n[... {} characters left out ...]\n{}",
        &text[..head],
        tail - head,
        &text[tail..]
    )
}

/// `path`, or beside it under a new name when the repository already has a file there (a new
/// test file must not collide with an existing one, or its patch would not apply).
pub fn unused_test_path(root: &std::path::Path, path: &str) -> String {
    if !root.join(path).exists() {
        return path.to_string();
    }
    let stem = path.strip_suffix(".py").unwrap_or(path);
    (1..)
        .map(|i| {
            if i == 1 {
                format!("{stem}_reproduction.py")
            } else {
                format!("{stem}_reproduction_{i}.py")
            }
        })
        .find(|p| !root.join(p).exists())
        .expect("some name is free")
}

/// A new-file test patch moved to an unused path when its target already exists in `root`
/// (the same renaming [`SandboxWorkspace`] applies when it runs the test).
pub fn relocate_new_file_patch(root: &std::path::Path, test_patch: String) -> String {
    let files = patch::diff_files(&test_patch);
    let [file] = files.as_slice() else {
        return test_patch;
    };
    match (&file.old, &file.new) {
        (None, Some(path)) if root.join(path).exists() => {
            let fresh = unused_test_path(root, path);
            test_patch
                .replace(&format!("a/{path}"), &format!("a/{fresh}"))
                .replace(&format!("b/{path}"), &format!("b/{fresh}"))
        }
        _ => test_patch,
    }
}

/// Specs of the tools that run in the sandbox.
pub fn sandbox_tool_specs() -> Vec<Value> {
    vec![
        json!({"type": "function", "function": {
            "name": "bash",
            "description": "Run a shell command in a fresh copy of the repository at the base commit, with the project's environment installed (no network, 120 s limit). Files you wrote earlier are not there.",
            "parameters": {"type": "object", "properties": {
                "command": {"type": "string", "description": "the shell command"}},
                "required": ["command"]}}}),
        json!({"type": "function", "function": {
            "name": "python",
            "description": "Run Python code in this task's interactive session, in the repository at the base commit with the project's environment installed (no network, 120 s limit per call). Names, imports and objects from your earlier python calls are kept: each call silently re-runs your earlier calls first (their output is not shown; keep them quick), then runs this one and prints the value of its last expression, as an interactive interpreter does. Files written to the repository are not kept between calls.",
            "parameters": {"type": "object", "properties": {
                "code": {"type": "string", "description": "Python source to run"}},
                "required": ["code"]}}}),
    ]
}

fn string_arg(arguments: &str, field: &'static str) -> Result<String, WorkspaceError> {
    let v: Value = serde_json::from_str(arguments)
        .map_err(|source| WorkspaceError::ArgumentsNotJson { field, source })?;
    v.get(field)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or(WorkspaceError::MissingArgument { field })
}

impl Workspace for SandboxWorkspace {
    fn tool_specs(&self) -> Vec<Value> {
        let mut specs = super::tools::tool_specs();
        specs.extend(sandbox_tool_specs());
        specs
    }

    async fn call_tool(&self, name: &str, arguments: &str) -> String {
        match name {
            "bash" => match string_arg(arguments, "command") {
                Ok(cmd) => {
                    self.run_command(vec![], vec!["bash".into(), "-c".into(), cmd])
                        .await
                }
                Err(error) => error.to_string(),
            },
            "python" => match string_arg(arguments, "code") {
                Ok(code) => self.run_python_cell(code).await,
                Err(error) => error.to_string(),
            },
            // Repository walks, greps and the tree-sitter code graph are blocking work: they
            // run off the runtime's workers, so the node's heartbeats never wait behind them.
            _ => {
                let (tools, name, arguments) =
                    (self.tools.clone(), name.to_string(), arguments.to_string());
                tokio::task::spawn_blocking(move || tools.call(&name, &arguments).text)
                    .await
                    .unwrap_or_else(|e| format!("error: the tool failed: {e}"))
            }
        }
    }

    async fn most_similar_test_file(&self, code: &str) -> Option<String> {
        let (tools, cell, code) = (
            self.tools.clone(),
            self.test_files.clone(),
            code.to_string(),
        );
        tokio::task::spawn_blocking(move || {
            let built = cell.get_or_init(|| {
                let paths: Vec<String> = tools
                    .repo()
                    .python_files()
                    .into_iter()
                    .filter(|p| super::reproagent::parse::looks_like_test_file(p))
                    .collect();
                let docs: Vec<String> = paths
                    .iter()
                    .map(|p| format!("{p}\n{}", tools.repo().read_text(p).unwrap_or_default()))
                    .collect();
                let index = super::tools::bm25::Bm25Index::build(&docs);
                Arc::new(TestFileIndex { paths, index })
            });
            let (best, _) = built.index.search(&code, 1).into_iter().next()?;
            built.paths.get(best).cloned()
        })
        .await
        .ok()
        .flatten()
    }

    async fn file_text(&self, path: &str) -> Result<Option<String>, String> {
        let (tools, path) = (self.tools.clone(), path.to_string());
        tokio::task::spawn_blocking(move || match tools.repo().read_text(&path) {
            Ok(text) => Ok(Some(text)),
            Err(super::tools::ToolError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.to_string()),
        })
        .await
        .unwrap_or_else(|e| Err(format!("the read failed: {e}")))
    }

    async fn run_test(&self, path: &str, contents: &str) -> Result<TestRun, WorkspaceError> {
        reprobench_sandbox::check_relative_path(path).map_err(WorkspaceError::TestPathRefused)?;
        self.test_runs.fetch_add(1, Ordering::Relaxed);
        let path = &unused_test_path(self.tools.repo().root(), path);
        let diff = patch::new_file_diff(path, contents);
        let files = patch::diff_files(&diff);
        let directives = patch::test_directives(&files, &self.directive_style);
        let request = script::build(&script::Plan {
            test_patch: Some(&diff),
            code_patch: None,
            test_cmd: &self.test_cmd,
            directives: &directives,
            env: &[],
            setup: &[],
            // The agent's own test runs need no coverage.
            coverage_files: None,
        });
        let out = self
            .sandbox
            .exec(
                &self.prepared,
                ExecRequest {
                    limits: self.limits.clone(),
                    ..request
                },
            )
            .await
            .map_err(WorkspaceError::Sandbox)?;
        let report = script::read(&out);
        if report.patches.iter().any(|p| !p.applied) {
            return Err(WorkspaceError::TestNotWritten {
                path: path.to_string(),
            });
        }
        Ok(TestRun {
            exit_code: if report.started { out.exit_code } else { None },
            timed_out: out.timed_out,
            output: cap(if report.started {
                &report.test_log
            } else {
                &out.output
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reprobench_sandbox::process::ProcessSandbox;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn bad_sandbox_tool_arguments_are_answered_with_the_exact_texts() {
        let json_error = serde_json::from_str::<Value>("{").unwrap_err();
        assert_eq!(
            string_arg("{", "code").unwrap_err().to_string(),
            format!(
                "error: arguments are not a JSON object ({json_error}); expected {{\"code\": \"...\"}}"
            )
        );
        assert_eq!(
            string_arg(r#"{"cmd": "ls"}"#, "command")
                .unwrap_err()
                .to_string(),
            "error: missing string argument `command`"
        );
        assert_eq!(string_arg(r#"{"command": "ls"}"#, "command").unwrap(), "ls");
    }

    #[tokio::test]
    async fn python_calls_of_a_task_share_one_session_and_only_the_last_one_speaks() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        std::fs::create_dir_all(repo.join("pkg")).unwrap();
        std::fs::write(repo.join("pkg/__init__.py"), "VALUE = 41\n").unwrap();
        // The sandbox seals a checkout's tree against its commit: the repository is a git one.
        for args in [
            &["init", "-q"][..],
            &["add", "-A"],
            &["commit", "-q", "-m", "base"],
        ] {
            let ok = std::process::Command::new("git")
                .args(args)
                .current_dir(&repo)
                .envs([("GIT_AUTHOR_NAME", "t"), ("GIT_AUTHOR_EMAIL", "t@t")])
                .envs([("GIT_COMMITTER_NAME", "t"), ("GIT_COMMITTER_EMAIL", "t@t")])
                .status()
                .unwrap()
                .success();
            assert!(ok, "git {args:?}");
        }
        let venv = dir.path().join("venv");
        // The system interpreter: a sandbox user can read it (pyenv's under /root it cannot).
        let made = std::process::Command::new("/usr/bin/python3")
            .args(["-m", "venv", "--without-pip"])
            .arg(&venv)
            .status()
            .unwrap();
        assert!(made.success(), "python3 -m venv failed");
        let sandbox = ProcessSandbox::new(dir.path().join("cache"));
        // Where bubblewrap is missing the session is checked unisolated (isolation is the
        // sandbox's own tests' subject).
        let sandbox = match sandbox.isolation_problem() {
            Some(_) => sandbox.allow_unisolated(true),
            None => sandbox,
        };
        let prepared = Prepared::Checkout {
            template: repo.clone(),
            venv,
        };
        let limits = Limits {
            timeout: Duration::from_secs(10),
            ..Limits::default()
        };
        let ws = SandboxWorkspace::new(
            &repo,
            Arc::new(sandbox),
            prepared,
            "pytest",
            "pytest",
            limits,
        );
        let call = |code: &str| {
            let arguments = json!({ "code": code }).to_string();
            let ws = &ws;
            async move { ws.call_tool("python", &arguments).await }
        };
        let first = call("import pkg\nx = pkg.VALUE\nprint('said once')").await;
        assert!(first.contains("said once"), "{first}");
        let failed = call("x += 1\nraise ValueError('after the change')").await;
        assert!(failed.contains("ValueError: after the change"), "{failed}");
        // Earlier calls ran again (x is 42, the failed call's change kept), silently.
        let second = call("def double(v):\n    return 2 * v\nx").await;
        assert!(second.contains("42"), "{second}");
        assert!(!second.contains("said once"), "{second}");
        let third = call("double(x)").await;
        assert!(third.contains("84"), "{third}");
        // A call killed at the time limit is not replayed by the next ones.
        let killed = call("import time\ny = 1\ntime.sleep(60)").await;
        assert!(killed.contains("killed at the"), "{killed}");
        let after = call("print('y' in globals(), x)").await;
        assert!(after.contains("False 42"), "{after}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn tool_calls_leave_the_runtime_free_for_other_tasks() {
        // A checkout big enough that the code graph takes a while to build.
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        for i in 0..300 {
            let pkg = repo.join(format!("pkg{}", i % 10));
            std::fs::create_dir_all(&pkg).unwrap();
            let body: String = (0..40)
                .map(|j| format!("def f{i}_{j}(x):\n    return g{j}(x) + {j}\n\n"))
                .collect();
            std::fs::write(pkg.join(format!("m{i}.py")), body).unwrap();
        }
        let sandbox: Arc<dyn Sandbox> = Arc::new(ProcessSandbox::new(dir.path().join("cache")));
        let prepared = Prepared::Checkout {
            template: repo.clone(),
            venv: dir.path().join("venv"),
        };
        let ws = SandboxWorkspace::new(
            &repo,
            sandbox,
            prepared,
            "pytest",
            "pytest",
            Limits::default(),
        );
        // On a one-thread runtime another task runs during the call only if the call's work is
        // off the runtime's thread (a heartbeat, in a node).
        let ticks = Arc::new(AtomicU64::new(0));
        let ticker = {
            let ticks = ticks.clone();
            tokio::spawn(async move {
                loop {
                    ticks.fetch_add(1, Ordering::Relaxed);
                    tokio::task::yield_now().await;
                }
            })
        };
        tokio::task::yield_now().await;
        let before = ticks.load(Ordering::Relaxed);
        let out = ws
            .call_tool("code_graph", r#"{"op": "find", "name": "f299_39"}"#)
            .await;
        let during = ticks.load(Ordering::Relaxed) - before;
        ticker.abort();
        assert!(out.contains("m299.py"), "{out}");
        assert!(
            during > 0,
            "the runtime ran nothing else while the tool worked"
        );
    }
}
