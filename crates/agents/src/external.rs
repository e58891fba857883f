//! External agents: anyone's agent, run unchanged as a command on the node.
//!
//! The contract (also in README, "External agents"):
//! - the working directory is a checkout of the repository at the base commit (`REPROBENCH_REPO`);
//! - `REPROBENCH_INSTANCE` is a JSON file with `instance_id`, `repo`, `base_commit`,
//!   `problem_statement`, `hints_text`, `created_at`, `version` (never the golden patches);
//! - `OPENAI_BASE_URL` and `OPENAI_API_KEY` point at the node's gateway with a key charged to this
//!   task (`OPENAI_MODEL` names the backbone; the gateway sends its real model name upstream);
//! - the agent writes its test patch (a unified diff against the base commit) to
//!   `REPROBENCH_OUTPUT`; `REPROBENCH_ARTIFACTS` is a directory for anything else it keeps;
//! - `{instance}`, `{repo}`, `{output}` and `{artifacts}` in the command are replaced by those paths;
//! - it is killed (with its process group) at the task's time budget; stdout and stderr go to
//!   `agent.log` beside the task's other artifacts.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// What an external agent was given.
pub struct ExternalInvocation<'a> {
    /// argv, placeholders not yet replaced.
    pub command: &'a [String],
    /// The instance JSON file.
    pub instance_file: &'a Path,
    /// The checkout (working directory).
    pub repo: &'a Path,
    /// Where the agent writes its test patch.
    pub output: &'a Path,
    /// Directory for the agent's other files (and `agent.log`).
    pub artifacts: &'a Path,
    /// Gateway base URL (`…/v1`).
    pub base_url: &'a str,
    /// The task's virtual key.
    pub key: &'a str,
    /// Backbone name, passed as `OPENAI_MODEL`.
    pub model: &'a str,
    /// Time budget.
    pub timeout: Duration,
}

/// How an external agent ended.
#[derive(Debug, Clone, PartialEq)]
pub struct ExternalEnd {
    /// Exit code (None: killed or not started).
    pub exit_code: Option<i32>,
    /// Killed at the time budget.
    pub timed_out: bool,
    /// The test patch it wrote, if any.
    pub patch: Option<String>,
    /// Why it could not be started, if it was not.
    pub start_error: Option<String>,
    /// Its log file.
    pub log: PathBuf,
}

/// The argv with placeholders replaced.
pub fn expand(inv: &ExternalInvocation<'_>) -> Vec<String> {
    inv.command
        .iter()
        .map(|a| {
            a.replace("{instance}", &inv.instance_file.to_string_lossy())
                .replace("{repo}", &inv.repo.to_string_lossy())
                .replace("{output}", &inv.output.to_string_lossy())
                .replace("{artifacts}", &inv.artifacts.to_string_lossy())
        })
        .collect()
}

fn kill_group(pid: Option<u32>) {
    if let Some(pid) = pid {
        // SAFETY: plain syscall on a process group we created.
        unsafe {
            libc::kill(-(pid as i32), libc::SIGKILL);
        }
    }
}

/// Runs the agent to its end, its time budget, or cancellation (`None`).
pub async fn run(inv: &ExternalInvocation<'_>, cancel: &CancellationToken) -> Option<ExternalEnd> {
    let argv = expand(inv);
    let log = inv.artifacts.join("agent.log");
    let mut end = ExternalEnd {
        exit_code: None,
        timed_out: false,
        patch: None,
        start_error: None,
        log: log.clone(),
    };
    let _ = std::fs::create_dir_all(inv.artifacts);
    let (out, err) = match std::fs::File::create(&log).and_then(|f| Ok((f.try_clone()?, f))) {
        Ok(p) => p,
        Err(e) => {
            end.start_error = Some(format!("cannot create {}: {e}", log.display()));
            return Some(end);
        }
    };
    let mut cmd = tokio::process::Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .current_dir(inv.repo)
        .env("OPENAI_BASE_URL", inv.base_url)
        .env("OPENAI_API_BASE", inv.base_url)
        .env("OPENAI_API_KEY", inv.key)
        .env("OPENAI_MODEL", inv.model)
        .env("REPROBENCH_INSTANCE", inv.instance_file)
        .env("REPROBENCH_REPO", inv.repo)
        .env("REPROBENCH_OUTPUT", inv.output)
        .env("REPROBENCH_ARTIFACTS", inv.artifacts)
        .env_remove("REPROBENCH_API_KEY")
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            end.start_error = Some(format!(
                "cannot start external agent `{}`: {e}; give an absolute path or a program on the node's PATH",
                argv[0]
            ));
            return Some(end);
        }
    };
    let pid = child.id();
    tokio::select! {
        status = child.wait() => {
            end.exit_code = status.ok().and_then(|s| s.code());
            kill_group(pid);
        }
        _ = tokio::time::sleep(inv.timeout) => {
            kill_group(pid);
            let _ = child.wait().await;
            end.timed_out = true;
        }
        _ = cancel.cancelled() => {
            kill_group(pid);
            let _ = child.wait().await;
            return None;
        }
    }
    end.patch = std::fs::read_to_string(inv.output)
        .ok()
        .filter(|p| !p.trim().is_empty());
    Some(end)
}
