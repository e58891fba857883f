//! The `process` sandbox, for machines without Docker: a cached virtualenv per environment
//! ([`venv`]), a cached checkout per instance ([`checkout`]), what the host must already have
//! checked instead of installed ([`host`]), and per execution a fresh copy of that checkout,
//! prepared and run in bubblewrap sandboxes ([`exec`]): the tree prepared out of the command's sight, the command
//! as an unprivileged user with its own `/tmp`, `/dev/shm`, processes and no network, the
//! environment read-only, and nothing else of the host's but its system directories. A node
//! that cannot give executions that refuses them, unless allowed to run them unisolated.

mod ahead;
pub use crate::stage_ahead::StageAheadMode;
mod checkout;
mod exec;
mod host;
mod venv;

use super::python::{
    build_once, copy_prefix_readable, find_python, find_python_where, has_own_prefix,
};
use super::system_packages;
use super::{
    BUILD_TOOLS, DATED_BUILD_TOOLS, DATED_PIP, EDITABLE_ROOTS_PY, EnvRecipe, ExecOutput,
    ExecRequest, NO_BUILD_EDITABLE, PIP_BUILD_CONSTRAINT_VAR, PIP_DATE_CAP_VAR, PIP_WITH_DATE_CAP,
    Prepared, Sandbox, SandboxError, dated_pip_install_note, retries_with_dated_pip,
};
use crate::BoxFuture;
use crate::ExecutorKind;
use checkout::*;
use host::*;
use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use venv::*;

/// The process sandbox.
pub struct ProcessSandbox {
    cache_dir: PathBuf,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The node runs as root: executions run as a uid of their own, interpreters must be
    /// reachable by it.
    as_root: bool,
    /// bubblewrap, when this node can isolate executions with it.
    bwrap: Option<PathBuf>,
    /// Why executions cannot be isolated on this node, if they cannot.
    isolation_problem: Option<String>,
    /// Run executions that cannot be isolated anyway (`--allow-unisolated-process`).
    allow_unisolated: bool,
    /// System packages and locales found on the host (`pkg:NAME`, `locale:NAME`), so that
    /// dpkg-query and `locale -a` are asked once; one found missing is asked again, since the
    /// user may install it after reading the error.
    on_host: Mutex<std::collections::BTreeSet<String>>,
    /// Trees staged ahead of their executions.
    ahead: Arc<ahead::StageAhead>,
}

/// A command the process sandbox runs on the host failed.
// Underlying errors are in the messages, not `source()`: anyhow's `{:#}` would repeat them.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HostCommandError {
    /// The setup step could not be started.
    #[error("{what}: cannot start: {error}")]
    CannotStart {
        /// What the step does.
        what: String,
        /// Why it could not start.
        error: std::io::Error,
    },
    /// The setup step ran and failed.
    #[error("{what} failed ({status}):\n{output_tail}")]
    Failed {
        /// What the step does.
        what: String,
        /// How it exited.
        status: std::process::ExitStatus,
        /// The last lines of its standard output, then of its error output.
        output_tail: String,
    },
}

/// Why this node cannot isolate executions, if it cannot: bubblewrap is missing or cannot make
/// a sandbox here, or (as root) the cache is out of reach of the executions' users.
fn isolation_problem(cache_dir: &Path, as_root: bool, bwrap: Option<&Path>) -> Option<String> {
    if as_root && !nobody_can_reach(cache_dir) {
        return Some(format!(
            "executions run as an unprivileged user, who cannot reach the cache directory {}; pick a --cache-dir under a world-traversable path",
            cache_dir.display()
        ));
    }
    let Some(bwrap) = bwrap else {
        return Some(
            "bubblewrap (`bwrap`) is not installed, and executions are isolated with it: install it (`apt-get install bubblewrap`)".into(),
        );
    };
    exec::probe(bwrap, as_root).err().map(|e| {
        if as_root {
            format!("{e}: executions run as an unprivileged user in user, mount, PID and network namespaces of their own; this kernel or container refuses them (allow unprivileged user namespaces: sysctl kernel.unprivileged_userns_clone=1, or AppArmor's kernel.apparmor_restrict_unprivileged_userns=0; in a container, one that may create namespaces)")
        } else {
            format!("{e}: executions run in user, mount, PID and network namespaces of their own; this kernel refuses them to a user that is not root (allow unprivileged user namespaces: sysctl kernel.unprivileged_userns_clone=1, or AppArmor's kernel.apparmor_restrict_unprivileged_userns=0), or run the node as root")
        }
    })
}

impl ProcessSandbox {
    /// A sandbox keeping virtualenvs, checkouts and work directories under `cache_dir`. Work
    /// directories that nodes no longer running left there are removed.
    pub fn new(cache_dir: PathBuf) -> ProcessSandbox {
        let _ = std::fs::create_dir_all(&cache_dir);
        let _ = std::fs::set_permissions(&cache_dir, std::fs::Permissions::from_mode(0o755));
        let removed = exec::remove_leftovers(&cache_dir.join("work"));
        if removed > 0 {
            tracing::info!(
                removed,
                "process sandbox: removed work directories of nodes no longer running"
            );
        }
        // SAFETY: geteuid has no preconditions.
        let as_root = unsafe { libc::geteuid() } == 0;
        let bwrap = exec::find_bwrap();
        let isolation_problem = isolation_problem(&cache_dir, as_root, bwrap.as_deref());
        if let Some(problem) = &isolation_problem {
            tracing::warn!(%problem, "process sandbox: executions cannot be isolated on this node");
        }
        ProcessSandbox {
            cache_dir,
            locks: Mutex::new(HashMap::new()),
            as_root,
            bwrap,
            isolation_problem,
            allow_unisolated: false,
            on_host: Mutex::new(Default::default()),
            ahead: Arc::new(ahead::StageAhead::new(StageAheadMode::default())),
        }
    }

    /// The same sandbox, staging the tree of an announced execution ([`Sandbox::exec_ahead`])
    /// ahead as `mode` says (the node's `--stage-ahead`; `Off` is the baseline that measures
    /// what staging ahead buys).
    pub fn stage_ahead(mut self, mode: StageAheadMode) -> ProcessSandbox {
        self.ahead = Arc::new(ahead::StageAhead::new(mode));
        self
    }

    /// The same sandbox, running executions it cannot isolate anyway when `allow` (the node's
    /// `--allow-unisolated-process`); every report then says so.
    pub fn allow_unisolated(mut self, allow: bool) -> ProcessSandbox {
        self.allow_unisolated = allow;
        self
    }

    /// Why executions cannot be isolated on this node, if they cannot.
    pub fn isolation_problem(&self) -> Option<&str> {
        self.isolation_problem.as_deref()
    }

    #[cfg(test)]
    fn with_isolation_problem(mut self, problem: &str) -> ProcessSandbox {
        self.isolation_problem = Some(problem.to_string());
        self
    }

    /// Whether executions run isolated, as an unprivileged user of their own (the node is root).
    pub fn isolates_user(&self) -> bool {
        self.as_root && self.isolation_problem.is_none()
    }

    fn lock_for(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.locks
            .lock()
            .expect("lock table")
            .entry(key.to_string())
            .or_default()
            .clone()
    }
}

/// Every directory from `path` up must be traversable by others for `nobody` to reach it.
pub fn nobody_can_reach(path: &Path) -> bool {
    let Ok(abs) = std::fs::canonicalize(path) else {
        return false;
    };
    abs.ancestors()
        .all(|a| std::fs::metadata(a).is_ok_and(|m| m.permissions().mode() & 0o001 != 0))
}

fn infra(what: &str, e: impl std::fmt::Display) -> SandboxError {
    SandboxError::Infra(format!("{what}: {e}"))
}

/// Runs a setup command to completion, returning its combined output on failure.
pub(crate) fn run_setup(
    cmd: &mut std::process::Command,
    what: &str,
) -> Result<(), HostCommandError> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|error| HostCommandError::CannotStart {
            what: what.to_string(),
            error,
        })?;
    if out.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    let tail: Vec<&str> = text.lines().rev().take(30).collect();
    Err(HostCommandError::Failed {
        what: what.to_string(),
        status: out.status,
        output_tail: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
    })
}

impl Sandbox for ProcessSandbox {
    fn kind(&self) -> ExecutorKind {
        ExecutorKind::Process
    }

    fn identity(&self) -> String {
        match self.isolation_note() {
            Some(_) => "process (unisolated)".into(),
            None => "process".into(),
        }
    }

    fn isolation_note(&self) -> Option<String> {
        let problem = self.isolation_problem.as_ref()?;
        self.allow_unisolated.then(|| {
            format!("executions ran without isolation (--allow-unisolated-process): {problem}")
        })
    }

    fn environment_notes(&self, recipe: &EnvRecipe) -> Vec<String> {
        let missing = self.locales_missing(recipe);
        if missing.is_empty() {
            return Vec::new();
        }
        vec![format!(
            "the {} locale, which SWT-bench's eval_commands generate with locale-gen, is compiled by reprobench with localedef into the environment and found through LOCPATH: this host has none and the process executor never changes the host",
            missing.join(", ")
        )]
    }

    fn prepared_notes(&self, prepared: &Prepared) -> Vec<String> {
        let Prepared::Checkout { venv, .. } = prepared else {
            return Vec::new();
        };
        std::fs::read_to_string(venv.join(PIP_NOTE_FILE))
            .map(|t| t.lines().map(str::to_string).collect())
            .unwrap_or_default()
    }

    fn prepare(&self, recipe: &EnvRecipe) -> BoxFuture<Result<Prepared, SandboxError>> {
        let cache = self.cache_dir.clone();
        let recipe = recipe.clone();
        if let Err(e) = self.build_packages_on_host(&recipe) {
            return Box::pin(async move { Err(e) });
        }
        let lock = self.lock_for(&recipe.instance_key());
        let env_lock = self.lock_for(&format!("venv-{}", venv_name(&recipe, self.as_root)));
        let public = self.as_root;
        Box::pin(async move {
            let _g = lock.lock().await;
            let venv = {
                let _e = env_lock.lock().await;
                let (c, r) = (cache.clone(), recipe.clone());
                tokio::task::spawn_blocking(move || prepare_venv(&c, &r, public))
                    .await
                    .map_err(|e| infra("venv task", e))??
            };
            let v = venv.clone();
            let template =
                tokio::task::spawn_blocking(move || prepare_checkout(&cache, &recipe, &v))
                    .await
                    .map_err(|e| infra("checkout task", e))??;
            Ok(Prepared::Checkout { template, venv })
        })
    }

    fn find_prepared(&self, recipe: &EnvRecipe) -> BoxFuture<Option<Prepared>> {
        let venv = venv::built_venv(&self.cache_dir, recipe, self.as_root);
        let template = venv
            .as_ref()
            .and_then(|v| checkout::built_checkout(&self.cache_dir, recipe, v));
        let found = venv
            .zip(template)
            .map(|(venv, template)| Prepared::Checkout { template, venv });
        Box::pin(async move { found })
    }

    fn exec_ahead(&self, prepared: &Prepared, req: &ExecRequest) {
        if let Ok(ctx) = self.context(prepared) {
            self.ahead.announce(ctx, req);
        }
    }

    fn exec(
        &self,
        prepared: &Prepared,
        req: ExecRequest,
    ) -> BoxFuture<Result<ExecOutput, SandboxError>> {
        let begun = std::time::Instant::now();
        let ctx = match self.context(prepared) {
            Ok(ctx) => ctx,
            Err(e) => return Box::pin(async move { Err(e) }),
        };
        let ahead = self.ahead.clone();
        Box::pin(async move {
            // Dropped with this future: a cancelled attempt's execution is killed at once.
            let _cancel = exec::CancelOnDrop(ctx.cancelled.clone());
            let tree = ahead.take(&ahead::StageKey::of(&ctx.template, &req)).await;
            tokio::task::spawn_blocking(move || {
                exec::exec_blocking(&ctx, req, begun, tree, &|| ahead.start())
            })
            .await
            .map_err(|e| infra("execution task", e))?
        })
    }

    fn settle(&self) -> BoxFuture<()> {
        let ahead = self.ahead.clone();
        Box::pin(async move { ahead.settle().await })
    }
}

impl ProcessSandbox {
    /// What an execution on `prepared` needs besides its request, or why this node refuses it.
    fn context(&self, prepared: &Prepared) -> Result<exec::Context, SandboxError> {
        let isolation = match (&self.isolation_problem, &self.bwrap, self.allow_unisolated) {
            (None, Some(bwrap), _) => exec::Isolation::Bwrap(bwrap.clone()),
            (_, _, true) => exec::Isolation::Unisolated,
            (problem, _, false) => {
                return Err(SandboxError::Infra(format!(
                    "this node cannot isolate process executions, so it refuses to run them: {}. Or start the node with --allow-unisolated-process to run them without isolation (every report then says so)",
                    problem.as_deref().unwrap_or("bubblewrap is missing")
                )));
            }
        };
        let Prepared::Checkout { template, venv } = prepared.clone() else {
            return Err(SandboxError::Infra(
                "the process sandbox was handed a docker image".into(),
            ));
        };
        Ok(exec::Context {
            cache: self.cache_dir.clone(),
            template,
            venv,
            as_root: self.as_root,
            isolation,
            cancelled: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{InputFile, Limits};
    use std::time::{Duration, Instant};

    /// A bare mirror with one commit holding `files`; returns (mirror, commit).
    pub(crate) fn mirror(dir: &Path, files: &[(&str, &str)]) -> (PathBuf, String) {
        let src = dir.join("src");
        std::fs::create_dir_all(&src).unwrap();
        for (p, c) in files {
            let path = src.join(p);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, c).unwrap();
        }
        let git = |args: &[&str], cwd: &Path| {
            let ok = std::process::Command::new("git")
                .args(args)
                .current_dir(cwd)
                .env("GIT_AUTHOR_NAME", "t")
                .env("GIT_AUTHOR_EMAIL", "t@t")
                .env("GIT_COMMITTER_NAME", "t")
                .env("GIT_COMMITTER_EMAIL", "t@t")
                .status()
                .unwrap()
                .success();
            assert!(ok, "git {args:?}");
        };
        git(&["init", "-q", "-b", "main"], &src);
        git(&["add", "-A"], &src);
        git(&["commit", "-q", "-m", "init"], &src);
        let out = std::process::Command::new("git")
            .args(["rev-parse", "HEAD"])
            .current_dir(&src)
            .output()
            .unwrap();
        let commit = String::from_utf8(out.stdout).unwrap().trim().to_string();
        let bare = dir.join("o__r.git");
        git(
            &[
                "clone",
                "-q",
                "--bare",
                src.to_str().unwrap(),
                bare.to_str().unwrap(),
            ],
            dir,
        );
        (bare, commit)
    }

    fn recipe(mirror: PathBuf, commit: String) -> EnvRecipe {
        let python = String::from_utf8(
            std::process::Command::new("python3")
                .args(["-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap()
        .trim()
        .to_string();
        EnvRecipe {
            repo: "o/r".into(),
            mirror,
            base_commit: commit,
            python,
            packages: vec![],
            pre_install: vec![],
            install: String::new(),
            ..Default::default()
        }
    }

    fn req(command: &[&str], timeout: Duration) -> ExecRequest {
        ExecRequest {
            files: vec![InputFile {
                path: "in/data.txt".into(),
                contents: b"hello".to_vec(),
                mode: 0o644,
            }],
            command: command.iter().map(|s| s.to_string()).collect(),
            env: vec![("GREETING".into(), "hi".into())],
            limits: Limits {
                timeout,
                ..Limits::default()
            },
            ..ExecRequest::default()
        }
    }

    /// What `tox --current-env` does: its env's `python` is a link to the running interpreter.
    /// From a virtualenv that link loses the venv's packages; from a standalone copy it keeps them.
    #[tokio::test]
    async fn a_standalone_environment_keeps_its_packages_through_a_link_to_its_python() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let (bare, commit) = mirror(dir.path(), &[("mod_here.py", "X = 1\n")]);
        let sb = ProcessSandbox::new(dir.path().join("cache"));
        let mut r = recipe(bare, commit);
        r.standalone = true;
        // An installed module: a .pth file in site-packages naming the checkout.
        r.install = "python -c \"import site, os; open(os.path.join(site.getsitepackages()[0], 'here.pth'), 'w').write(os.getcwd())\"".into();
        let prepared = match sb.prepare(&r).await {
            Ok(p) => p,
            Err(SandboxError::BadInput(m)) => {
                // Only the system's interpreter here: refused, saying what to install.
                assert!(m.contains("pyenv install"), "{m}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let out = sb
            .exec(
                &prepared,
                req(
                    &["bash", "-c", "mkdir -p other/bin && ln -s \"$(command -v python)\" other/bin/python && other/bin/python -c 'import sys, mod_here; print(mod_here.X, sys.prefix != sys.base_prefix)'"],
                    Duration::from_secs(120),
                ),
            )
            .await
            .unwrap();
        assert_eq!(out.exit_code, Some(0), "{}", out.output);
        assert_eq!(
            out.output.trim(),
            "1 False",
            "a whole interpreter, not a venv"
        );
    }

    /// apt steps of a spec never run on the host: their packages must be there already.
    #[tokio::test]
    async fn system_package_steps_are_checked_on_the_host_not_run() {
        if !system_packages::dpkg_available() {
            eprintln!("skipped: no dpkg-query on this host");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let (bare, commit) = mirror(dir.path(), &[("a.py", "A = 1\n")]);
        let sb = ProcessSandbox::new(dir.path().join("cache"));
        let mut r = recipe(bare, commit);
        r.pre_install = vec![
            "apt-get update && apt-get install -y coreutils reprobench-no-such-package && touch ran".into(),
        ];
        let err = sb.prepare(&r).await.unwrap_err();
        let SandboxError::BadInput(msg) = &err else {
            panic!("{err:?}")
        };
        assert!(
            msg.contains("apt-get install -y reprobench-no-such-package`")
                && msg.contains("docker executor"),
            "{msg}"
        );
        // With the packages there, the step is skipped and the rest of the command runs.
        r.pre_install =
            vec!["apt-get -y update && apt-get install -y coreutils && touch ran".into()];
        let prepared = sb.prepare(&r).await.expect("prepare");
        let out = sb
            .exec(&prepared, req(&["ls", "ran"], Duration::from_secs(60)))
            .await
            .unwrap();
        assert_eq!(out.exit_code, Some(0), "{}", out.output);
    }

    #[tokio::test]
    async fn runs_in_a_fresh_copy_with_inputs_and_kills_at_the_timeout() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let (bare, commit) = mirror(dir.path(), &[("app.py", "print('from app')\n")]);
        let sb = ProcessSandbox::new(dir.path().join("cache"));
        let prepared = sb
            .prepare(&recipe(bare.clone(), commit.clone()))
            .await
            .unwrap();
        assert_eq!(
            sb.prepare(&recipe(bare, commit)).await.unwrap(),
            prepared,
            "cached"
        );

        let out = sb
            .exec(&prepared, req(&["bash", "-c", "python app.py; cat in/data.txt; echo \" $GREETING\"; touch made_here; exit 3"], Duration::from_secs(60)))
            .await
            .unwrap();
        assert_eq!(out.exit_code, Some(3));
        assert!(!out.timed_out);
        assert_eq!(out.output, "from app\nhello hi\n");
        // The timeline: each phase in the order it ran, the command's the command's time.
        let names: Vec<&str> = out.phases.iter().map(|p| p.name).collect();
        assert_eq!(
            names,
            [
                "workdir", "copy", "stage", "unpack", "command", "collect", "cleanup"
            ]
        );
        assert_eq!(out.phases[4].took, out.command_time);
        let total: Duration = out.phases.iter().map(|p| p.took).sum();
        assert!(total <= out.command_time + out.overhead, "{out:?}");
        // The next execution starts from a clean copy.
        let out = sb
            .exec(
                &prepared,
                req(
                    &["bash", "-c", "test -e made_here"],
                    Duration::from_secs(60),
                ),
            )
            .await
            .unwrap();
        assert_eq!(out.exit_code, Some(1));

        let out = sb
            .exec(
                &prepared,
                req(
                    &["bash", "-c", "sleep 30 & sleep 30"],
                    Duration::from_millis(300),
                ),
            )
            .await
            .unwrap();
        assert!(out.timed_out);
        assert_eq!(out.exit_code, None);
        assert!(out.command_time < Duration::from_secs(10));

        let bad = ExecRequest {
            files: vec![InputFile {
                path: "../x".into(),
                contents: vec![],
                mode: 0o644,
            }],
            ..req(&["true"], Duration::from_secs(5))
        };
        assert!(matches!(
            sb.exec(&prepared, bad).await,
            Err(SandboxError::BadInput(_))
        ));
    }

    /// A patch that adds `name` holding `line`.
    fn adding(name: &str, line: &str) -> crate::PatchFile {
        crate::PatchFile {
            label: "test".into(),
            contents: format!(
                "diff --git a/{name} b/{name}\nnew file mode 100644\n--- /dev/null\n+++ b/{name}\n@@ -0,0 +1 @@\n+{line}\n"
            )
            .into_bytes(),
        }
    }

    #[tokio::test]
    async fn a_tree_staged_ahead_is_the_tree_staged_on_the_executions_path() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let (bare, commit) = mirror(dir.path(), &[("app.py", "print('from app')\n")]);
        // Always: the test's result must not depend on what else runs on the machine.
        let sb = ProcessSandbox::new(dir.path().join("cache")).stage_ahead(StageAheadMode::Always);
        let prepared = sb.prepare(&recipe(bare, commit)).await.unwrap();
        // What the command can see of its tree: names, sizes, times, modes, git's view.
        let look = "find . -path ./.git -prune -o -printf '%p %s %T@ %m\\n' | sort; git status --porcelain; git log --format='%H %ad'; cat new.py";
        let b = ExecRequest {
            patches: vec![adding("new.py", "X = 2")],
            ..req(&["bash", "-c", look], Duration::from_secs(60))
        };
        let phase_names = |o: &ExecOutput| o.phases.iter().map(|p| p.name).collect::<Vec<_>>();
        let took =
            |o: &ExecOutput, name: &str| o.phases.iter().find(|p| p.name == name).map(|p| p.took);

        // Announced, then staged while the execution before it runs, then taken.
        sb.exec_ahead(&prepared, &b);
        assert_eq!(sb.ahead.len(), 1);
        let first = sb
            .exec(&prepared, req(&["true"], Duration::from_secs(60)))
            .await
            .unwrap();
        assert_eq!(took(&first, "ahead"), None, "nothing was staged for it");
        let ahead = sb.exec(&prepared, b.clone()).await.unwrap();
        assert_eq!(ahead.exit_code, Some(0), "{}", ahead.output);
        assert_eq!(
            phase_names(&ahead),
            [
                "workdir", "copy", "stage", "ahead", "unpack", "command", "collect", "cleanup"
            ]
        );
        for off_path in ["workdir", "copy", "stage"] {
            assert_eq!(took(&ahead, off_path), Some(Duration::ZERO), "{off_path}");
        }
        assert_eq!(sb.ahead.len(), 0, "taken");
        assert_eq!(ahead.patches.len(), 1);
        assert!(ahead.patches[0].applied, "{}", ahead.prepare_log);

        // The same request staged on its path sees the same tree, to the second and the bit.
        let on_path = sb.exec(&prepared, b.clone()).await.unwrap();
        assert_eq!(took(&on_path, "ahead"), None);
        assert!(took(&on_path, "stage").unwrap() > Duration::ZERO);
        assert_eq!(on_path.output, ahead.output);
        assert!(on_path.output.contains("X = 2"), "{}", on_path.output);

        // A tree staged for another request is not taken; settling removes it.
        let c = ExecRequest {
            patches: vec![adding("new.py", "X = 3")],
            ..b.clone()
        };
        sb.exec_ahead(&prepared, &c);
        sb.exec(&prepared, req(&["true"], Duration::from_secs(60)))
            .await
            .unwrap();
        let other = sb.exec(&prepared, b.clone()).await.unwrap();
        assert_eq!(took(&other, "ahead"), None);
        assert_eq!(other.output, ahead.output);
        assert_eq!(sb.ahead.len(), 1);
        sb.settle().await;
        assert_eq!(sb.ahead.len(), 0);
        let left = std::fs::read_dir(dir.path().join("cache/work"))
            .unwrap()
            .count();
        assert_eq!(left, 0, "no work directory is left");

        // Off: nothing is announced.
        let off = ProcessSandbox::new(dir.path().join("cache")).stage_ahead(StageAheadMode::Off);
        off.exec_ahead(&prepared, &b);
        assert_eq!(off.ahead.len(), 0);
    }

    #[tokio::test]
    async fn an_execution_that_cannot_be_isolated_is_refused_unless_the_node_allows_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let (bare, commit) = mirror(dir.path(), &[("a.py", "")]);
        // As a root node without CAP_SYS_ADMIN finds at start (its probe's unshare fails).
        let problem = "unshare(Net) failed: Operation not permitted (os error 1)";
        let sb = ProcessSandbox::new(dir.path().join("cache")).with_isolation_problem(problem);
        let prepared = sb.prepare(&recipe(bare, commit)).await.unwrap();
        let err = sb
            .exec(&prepared, req(&["true"], Duration::from_secs(30)))
            .await
            .unwrap_err();
        let SandboxError::Infra(msg) = &err else {
            panic!("{err:?}")
        };
        assert!(
            msg.contains(problem) && msg.contains("--allow-unisolated-process"),
            "{msg}"
        );
        assert_eq!(sb.isolation_note(), None, "nothing ran unisolated");
        assert_eq!(sb.identity(), "process");

        // Allowed explicitly: it runs, and says so (reports, cache key).
        let sb = sb.allow_unisolated(true);
        let out = sb
            .exec(&prepared, req(&["echo", "ran"], Duration::from_secs(30)))
            .await
            .unwrap();
        assert_eq!(out.output.trim(), "ran", "{}", out.output);
        assert!(sb.isolation_note().unwrap().contains(problem));
        assert_eq!(sb.identity(), "process (unisolated)");
    }

    #[test]
    fn this_node_can_isolate_executions_when_it_runs_as_root() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: this check is for a node that runs as root");
            return;
        }
        let bwrap =
            exec::find_bwrap().expect("bubblewrap is installed (apt-get install bubblewrap)");
        assert_eq!(exec::probe(&bwrap, true), Ok(()));
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let sb = ProcessSandbox::new(dir.path().join("cache"));
        assert_eq!(sb.isolation_problem(), None);
    }

    #[test]
    fn a_node_without_bubblewrap_or_out_of_reach_says_why_it_cannot_isolate() {
        let dir = tempfile::tempdir().unwrap();
        let problem = isolation_problem(dir.path(), false, None).unwrap();
        assert!(problem.contains("apt-get install bubblewrap"), "{problem}");
        // A cache under a directory others cannot enter, on a root node.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let cache = dir.path().join("cache");
        std::fs::create_dir(&cache).unwrap();
        let problem = isolation_problem(&cache, true, Some(Path::new("/usr/bin/bwrap"))).unwrap();
        assert!(problem.contains("--cache-dir"), "{problem}");
        // A bwrap that is not one.
        let problem = isolation_problem(dir.path(), false, Some(Path::new("/bin/false"))).unwrap();
        assert!(
            problem.contains("bubblewrap could not make a sandbox"),
            "{problem}"
        );
    }

    #[test]
    fn work_directories_of_gone_nodes_are_removed_and_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        let mine = work.join(format!("exec-{}-x", exec::owner_tag()));
        let gone = work.join("exec-4294967294-1-x");
        let old_layout = work.join("exec-abcdef");
        for d in [&mine, &gone, &old_layout] {
            std::fs::create_dir_all(d.join("stage")).unwrap();
        }
        assert_eq!(exec::remove_leftovers(&work), 2);
        assert!(mine.exists() && !gone.exists() && !old_layout.exists());
    }

    #[tokio::test]
    async fn as_root_executions_have_no_network_and_a_process_limit() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let (bare, commit) = mirror(dir.path(), &[("a.py", "")]);
        let sb = ProcessSandbox::new(dir.path().join("cache"));
        if !sb.isolates_user() {
            eprintln!(
                "skipped: the process sandbox isolates executions only when the node runs as root"
            );
            return;
        }
        let prepared = sb.prepare(&recipe(bare, commit)).await.unwrap();
        let connect = "import socket\ntry:\n socket.create_connection(('127.0.0.1', 9), timeout=5)\nexcept OSError as e:\n print('refused', e.errno)\n";
        let out = sb
            .exec(
                &prepared,
                req(&["python", "-c", connect], Duration::from_secs(30)),
            )
            .await
            .unwrap();
        assert!(out.output.starts_with("refused"), "{}", out.output);
        let bomb = ExecRequest {
            limits: Limits {
                pids: 64,
                timeout: Duration::from_secs(3),
                ..Limits::default()
            },
            ..req(
                &[
                    "bash",
                    "-c",
                    "b() { b | b & }; b; sleep 1; echo survived # reprobench-bomb-marker",
                ],
                Duration::from_secs(3),
            )
        };
        let out = sb.exec(&prepared, bomb).await.unwrap();
        assert!(out.command_time < Duration::from_secs(20));
        // Killed processes take a moment to be reaped: poll with a deadline.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = std::process::Command::new("pgrep")
                .args(["-c", "-f", "reprobench-bomb-marker"])
                .output()
                .unwrap();
            let n = String::from_utf8_lossy(&left.stdout).trim().to_string();
            if n == "0" {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{n} processes of the execution are left"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    #[tokio::test]
    async fn as_root_an_execution_runs_in_a_tmpfs_of_its_disk_limit_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let (bare, commit) = mirror(dir.path(), &[("a.py", "")]);
        let sb = ProcessSandbox::new(dir.path().join("cache"));
        if !sb.isolates_user() {
            eprintln!("skipped: executions get a tmpfs only when the node runs as root");
            return;
        }
        let prepared = sb.prepare(&recipe(bare, commit)).await.unwrap();
        let capped = |command: &str| ExecRequest {
            limits: Limits {
                disk_mb: 8,
                ..Limits::default()
            },
            ..req(&["bash", "-c", command], Duration::from_secs(60))
        };
        // The repository and the execution's TMPDIR are on one 8 MiB tmpfs.
        let out = sb
            .exec(
                &prepared,
                capped("stat -f -c %T . \"$TMPDIR\"; df -k --output=size . | tail -1; test -f a.py && echo has-a"),
            )
            .await
            .unwrap();
        let lines: Vec<&str> = out.output.lines().map(str::trim).collect();
        assert_eq!(&lines[..2], ["tmpfs", "tmpfs"], "{}", out.output);
        assert_eq!(lines[2], "8192", "{}", out.output);
        assert_eq!(lines[3], "has-a", "{}", out.output);
        // Writing past the limit fails inside the execution.
        let out = sb
            .exec(
                &prepared,
                capped("head -c 16M /dev/zero 2>/dev/null > \"$TMPDIR/big\" && echo wrote || echo full"),
            )
            .await
            .unwrap();
        assert!(out.output.trim().ends_with("full"), "{}", out.output);
        // Nothing is left mounted or on disk.
        let work = dir.path().join("cache/work");
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
        assert!(!mounts.contains(&work.display().to_string()), "{mounts}");
        assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0);
    }

    #[tokio::test]
    async fn a_missing_commit_or_mirror_is_bad_input() {
        let dir = tempfile::tempdir().unwrap();
        let (bare, _) = mirror(dir.path(), &[("a.py", "")]);
        let sb = ProcessSandbox::new(dir.path().join("cache"));
        let err = sb.prepare(&recipe(bare, "0".repeat(40))).await.unwrap_err();
        assert!(
            matches!(err, SandboxError::BadInput(ref m) if m.contains("not in the mirror")),
            "{err}"
        );
        let err = sb
            .prepare(&recipe(dir.path().join("nope.git"), "0".repeat(40)))
            .await
            .unwrap_err();
        assert!(
            matches!(err, SandboxError::BadInput(ref m) if m.contains("no mirror")),
            "{err}"
        );
    }
}
