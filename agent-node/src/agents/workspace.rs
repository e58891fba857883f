//! [`Workspace`] for SWT agents: read-only repository tools over a checkout on the node, and
//! `bash`, `python` and test runs in fresh copies of the instance's sandbox environment.

use super::tools::ToolBox;
use super::{TestRun, Workspace};
use crate::sandbox::{ExecRequest, InputFile, Limits, Prepared, Sandbox};
use crate::swt::{patch, script};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Characters of command output handed back to the model.
const MAX_TOOL_OUTPUT: usize = 8_000;

/// A workspace over one instance: its checkout (for reading) and its sandbox (for running).
pub struct SandboxWorkspace {
    tools: ToolBox,
    sandbox: Arc<dyn Sandbox>,
    prepared: Prepared,
    test_cmd: String,
    directive_style: String,
    limits: Limits,
    test_runs: AtomicU32,
    commands: AtomicU32,
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
            tools: ToolBox::new(checkout),
            sandbox,
            prepared,
            test_cmd: test_cmd.to_string(),
            directive_style: directive_style.to_string(),
            limits,
            test_runs: AtomicU32::new(0),
            commands: AtomicU32::new(0),
        }
    }

    /// The read-only tools (for retrieval by baselines).
    pub fn toolbox(&self) -> &ToolBox {
        &self.tools
    }

    /// How many test runs and sandbox commands the agent made.
    pub fn runs(&self) -> (u32, u32) {
        (
            self.test_runs.load(Ordering::Relaxed),
            self.commands.load(Ordering::Relaxed),
        )
    }

    async fn run_command(&self, files: Vec<InputFile>, command: Vec<String>) -> String {
        self.commands.fetch_add(1, Ordering::Relaxed);
        let limits = Limits {
            timeout: self.limits.timeout.min(Duration::from_secs(120)),
            ..self.limits.clone()
        };
        match self
            .sandbox
            .exec(
                &self.prepared,
                ExecRequest {
                    files,
                    command,
                    env: vec![],
                    limits,
                },
            )
            .await
        {
            Ok(out) => {
                let status = match (out.exit_code, out.timed_out) {
                    (_, true) => "killed at the 120 s limit".to_string(),
                    (Some(c), _) => format!("exit code {c}"),
                    (None, _) => "no exit code".to_string(),
                };
                cap(&format!("[{status}]\n{}", out.output))
            }
            Err(e) => format!("error: the sandbox could not run the command: {e}"),
        }
    }
}

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
            "description": "Run a Python snippet in a fresh copy of the repository at the base commit, with the project's environment installed (no network, 120 s limit).",
            "parameters": {"type": "object", "properties": {
                "code": {"type": "string", "description": "Python source to run"}},
                "required": ["code"]}}}),
    ]
}

fn string_arg(arguments: &str, field: &str) -> Result<String, String> {
    let v: Value = serde_json::from_str(arguments).map_err(|e| {
        format!("error: arguments are not a JSON object ({e}); expected {{\"{field}\": \"...\"}}")
    })?;
    v.get(field)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| format!("error: missing string argument `{field}`"))
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
                Err(e) => e,
            },
            "python" => match string_arg(arguments, "code") {
                Ok(code) => {
                    let path = format!("{}/snippet.py", script::HARNESS_DIR);
                    let file = InputFile {
                        path: path.clone(),
                        contents: code.into_bytes(),
                        mode: 0o644,
                    };
                    self.run_command(vec![file], vec!["python".into(), path])
                        .await
                }
                Err(e) => e,
            },
            _ => self.tools.call(name, arguments).text,
        }
    }

    async fn run_test(&self, path: &str, contents: &str) -> Result<TestRun, String> {
        crate::sandbox::check_relative_path(path).map_err(|e| e.to_string())?;
        self.test_runs.fetch_add(1, Ordering::Relaxed);
        let path = &unused_test_path(self.tools.repo().root(), path);
        let diff = patch::new_file_diff(path, contents);
        let files = patch::diff_files(&diff);
        let directives = patch::test_directives(&files, &self.directive_style);
        let nonce = format!("{:016x}", {
            let mut h = reprobench_proto::swt::Fnv::default();
            h.add(path);
            h.add(contents);
            h.add(&reprobench_proto::time::now_ms().to_string());
            h.0
        });
        let (files, command) = script::build(&script::Plan {
            test_patch: Some(&diff),
            code_patch: None,
            test_cmd: &self.test_cmd,
            directives: &directives,
            nonce: &nonce,
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
                    files,
                    command,
                    env: vec![],
                    limits: self.limits.clone(),
                },
            )
            .await
            .map_err(|e| format!("the sandbox could not run the test: {e}"))?;
        let report = script::read(&out.output, &nonce);
        if report.patches.iter().any(|p| !p.applied) {
            return Err(format!(
                "the test file {path} could not be written into the repository"
            ));
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
