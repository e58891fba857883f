//! The `process` sandbox, for machines without Docker: a cached virtualenv per environment, a
//! cached checkout per instance, and a fresh copy of that checkout per execution.
//!
//! Isolation is weaker than Docker's and best-effort: each execution runs in its own session
//! (the timeout kills the whole process group), with rlimits on processes, address space and
//! file size; when the node runs as root it also gets an empty network namespace and runs as
//! `nobody`, which makes the process limit bite and keeps it out of everything but its copy.

use super::python::{
    build_once, copy_prefix_readable, find_python, find_python_where, has_own_prefix,
};
use super::system_packages;
use super::{
    BUILD_TOOLS, CappedOutput, EDITABLE_ROOTS_PY, EnvRecipe, ExecOutput, ExecRequest,
    PIP_DATE_CAP_VAR, PIP_WITH_DATE_CAP, Prepared, Sandbox, SandboxError, check_relative_path,
};
use crate::BoxFuture;
use crate::ExecutorKind;
use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Executions run as root get an unprivileged uid of their own (not a system user), so the
/// process limit is per execution: a fork bomb in one execution cannot starve its neighbours,
/// which it would if they all shared `nobody`. Node processes offset by pid to rarely collide.
fn execution_uid() -> u32 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 256;
    200_000 + (std::process::id() % 200) * 256 + n
}

/// The process sandbox.
pub struct ProcessSandbox {
    cache_dir: PathBuf,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    as_nobody: bool,
    /// How executions get a network namespace of their own (none when `isolation_problem`).
    namespace: Namespace,
    /// Why executions cannot be isolated on this node, if they cannot.
    isolation_problem: Option<String>,
    /// Run executions that cannot be isolated anyway (`--allow-unisolated-process`).
    allow_unisolated: bool,
}

/// How an execution is cut off from the network.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Namespace {
    /// `unshare(CLONE_NEWNET)`: the node runs as root with CAP_SYS_ADMIN.
    Net,
    /// `unshare(CLONE_NEWUSER | CLONE_NEWNET)`: an unprivileged node with user namespaces.
    UserAndNet,
}

impl Namespace {
    fn flags(self) -> libc::c_int {
        match self {
            Namespace::Net => libc::CLONE_NEWNET,
            Namespace::UserAndNet => libc::CLONE_NEWUSER | libc::CLONE_NEWNET,
        }
    }
}

/// A command the process sandbox runs on the host failed: a setup step, or the probe of whether
/// executions can have a namespace of their own.
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
    /// The namespace probe started but did not succeed.
    #[error("a probe in the namespace exited with {0}")]
    ProbeExited(std::process::ExitStatus),
    /// The namespace probe could not enter the namespace.
    #[error("unshare({namespace:?}) failed: {error}")]
    Unshare {
        /// The namespace asked for.
        namespace: Namespace,
        /// What unshare said.
        error: std::io::Error,
    },
}

/// Whether a child can enter `ns` here: forks `/bin/sh -c 'exit 0'` that does; the error when not.
fn probe_namespace(ns: Namespace) -> Result<(), HostCommandError> {
    let mut cmd = std::process::Command::new("/bin/sh");
    cmd.args(["-c", "exit 0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let flags = ns.flags();
    // SAFETY: only unshare, which is async-signal-safe, between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::unshare(flags) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    match cmd.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(HostCommandError::ProbeExited(s)),
        Err(error) => Err(HostCommandError::Unshare {
            namespace: ns,
            error,
        }),
    }
}

impl ProcessSandbox {
    /// A sandbox keeping virtualenvs, checkouts and work directories under `cache_dir`.
    pub fn new(cache_dir: PathBuf) -> ProcessSandbox {
        let _ = std::fs::create_dir_all(&cache_dir);
        let _ = std::fs::set_permissions(&cache_dir, std::fs::Permissions::from_mode(0o755));
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let as_nobody = root && nobody_can_reach(&cache_dir);
        let namespace = if root {
            Namespace::Net
        } else {
            Namespace::UserAndNet
        };
        let isolation_problem = if root && !as_nobody {
            Some(format!(
                "`nobody` cannot reach the cache directory {}, so executions would run as root with the network and no process limit; pick a --cache-dir under a world-traversable path",
                cache_dir.display()
            ))
        } else {
            probe_namespace(namespace).err().map(|e| match namespace {
                Namespace::Net => format!(
                    "{e}: the node runs as root without CAP_SYS_ADMIN, so executions would keep the network; give the node CAP_SYS_ADMIN (a privileged container)"
                ),
                Namespace::UserAndNet => format!(
                    "{e}: the node is not root and this kernel refuses it a user namespace, so executions would keep the network; run the node as root, or allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, or AppArmor's kernel.apparmor_restrict_unprivileged_userns=0)"
                ),
            })
        };
        if let Some(problem) = &isolation_problem {
            tracing::warn!(%problem, "process sandbox: executions cannot be isolated on this node");
        }
        ProcessSandbox {
            cache_dir,
            locks: Mutex::new(HashMap::new()),
            as_nobody,
            namespace,
            isolation_problem,
            allow_unisolated: false,
        }
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

    /// Whether executions run as `nobody` in their own network namespace.
    pub fn isolates_user(&self) -> bool {
        self.as_nobody
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

/// Environment of commands run with a virtualenv: its `bin` first, the interpreter's libraries.
fn venv_env(venv: &Path) -> Vec<(String, String)> {
    let mut env = vec![
        (
            "PATH".to_string(),
            format!(
                "{}/bin:{}",
                venv.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        ),
        ("VIRTUAL_ENV".to_string(), venv.display().to_string()),
    ];
    env.extend(read_env_file(&venv.join(ENV_FILE)));
    env
}

/// A venv's extra environment (the interpreter's `LD_LIBRARY_PATH`), `KEY=VALUE` per line.
const ENV_FILE: &str = ".reprobench-env";

fn read_env_file(path: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn pip_install(
    venv: &Path,
    args: &[String],
    what: &str,
    env: &[(String, String)],
) -> Result<(), SandboxError> {
    let result = run_setup(
        std::process::Command::new(venv.join("bin/python"))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-input",
            ])
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v))),
        what,
    );
    result.map_err(|e| {
        let e = e.to_string();
        // A resolver error names the package; anything else (no network, index down) is infrastructure.
        let bad = e.contains("No matching distribution")
            || e.contains("Could not find a version")
            || e.contains("ResolutionImpossible")
            || e.contains("requires a different Python");
        if bad {
            SandboxError::BadInput(e)
        } else {
            SandboxError::Infra(e)
        }
    })
}

/// Upgrades the venv's pip to one with `--uploaded-prior-to` (itself not date-capped: that pip
/// was released after the dates one caps at).
fn upgrade_pip_for_date_cap(venv: &Path, env: &[(String, String)]) -> Result<(), SandboxError> {
    let args = ["--upgrade".to_string(), PIP_WITH_DATE_CAP.to_string()];
    pip_install(venv, &args, "upgrading pip", env).map_err(|e| match e {
        SandboxError::BadInput(msg) => SandboxError::BadInput(format!(
            "the environment resolves packages as of a date (packages_as_of), which needs pip 26 or later, and pip 26 needs Python 3.9 or later: drop packages_as_of from the spec for an older Python ({msg})"
        )),
        other => other,
    })
}

/// The venv's name in the cache. An environment whose install steps put the repository into the
/// venv (`pip install .` copies it into site-packages) gets a venv per instance, as a container
/// image per instance does: instances of one environment at other commits must not see it.
/// Interpreters differ when executions run as nobody (it must be able to run the venv's).
fn venv_name(recipe: &EnvRecipe, public: bool) -> String {
    let installs = !recipe.install.trim().is_empty() || !recipe.pre_install.is_empty();
    let key = if installs {
        format!("{}-{}", recipe.env_key(), recipe.instance_key())
    } else {
        recipe.env_key()
    };
    if public { format!("{key}-public") } else { key }
}

/// Marker in a venv: the install steps of the checkout `key` ran into it.
fn installed_marker(venv: &Path, key: &str) -> PathBuf {
    venv.join(format!(".reprobench-installed-{key}"))
}

fn prepare_venv(cache: &Path, recipe: &EnvRecipe, public: bool) -> Result<PathBuf, SandboxError> {
    let name = venv_name(recipe, public);
    let root = cache.join("venvs");
    let dir = root.join(&name);
    let marker = dir.join(".reprobench-ready");
    let lock = root.join(format!("{name}.lock"));
    build_once(
        &dir,
        &lock,
        || marker.exists(),
        || {
            // A standalone environment copies an interpreter's own prefix, never the system's.
            let python = if recipe.standalone {
                find_python_where(&recipe.python, public, cache, has_own_prefix).map_err(|e| match e {
                    SandboxError::BadInput(_) => SandboxError::BadInput(format!(
                        "this instance's tests run under `tox --current-env`, which needs a standalone Python {} with a prefix of its own (not a virtualenv, not the system's /usr); install one with `pyenv install {}`, or use the docker executor",
                        recipe.python, recipe.python
                    )),
                    other => other,
                })?
            } else {
                find_python(&recipe.python, public, cache)?
            };
            let lib_env: Vec<(String, String)> = python
                .lib_dir
                .iter()
                .map(|l| ("LD_LIBRARY_PATH".to_string(), l.display().to_string()))
                .collect();
            let lib_env = if recipe.standalone {
                standalone_copy(&python, &dir)?
            } else {
                run_setup(
                    std::process::Command::new(&python.exe)
                        .args(["-m", "venv"])
                        .arg(&dir)
                        .envs(lib_env.iter().map(|(k, v)| (k, v))),
                    "creating a virtualenv",
                )
                .map_err(|e| SandboxError::Infra(e.to_string()))?;
                lib_env
            };
            let mut env_text: String = lib_env.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
            std::fs::write(dir.join(ENV_FILE), &env_text)
                .map_err(|e| infra("writing the venv's environment", e))?;
            if recipe.fresh_build_tools {
                // A new conda environment has the newest pip, setuptools and wheel built for its
                // Python; a venv has the ones its Python shipped with (3.6's pip 18 lacks
                // `--no-use-pep517`, which scikit-learn's install command passes).
                pip_install(
                    &dir,
                    &BUILD_TOOLS.map(String::from),
                    "upgrading pip, setuptools and wheel",
                    &venv_env(&dir),
                )?;
            }
            if let Some(date) = &recipe.packages_as_of {
                upgrade_pip_for_date_cap(&dir, &venv_env(&dir))?;
                // Every later pip run in this venv, the install commands' too, honours the cap.
                env_text.push_str(&format!("{PIP_DATE_CAP_VAR}={date}\n"));
                std::fs::write(dir.join(ENV_FILE), &env_text)
                    .map_err(|e| infra("writing the venv's environment", e))?;
            }
            let env = venv_env(&dir);
            if !recipe.packages.is_empty() {
                let packages = match &recipe.conda_packages_as_of {
                    Some(date) => super::resolve::resolve_as_of(
                        cache,
                        &recipe.packages,
                        &python.version,
                        date,
                    )?,
                    None => recipe.packages.clone(),
                };
                let what = format!("pip install {}", packages.join(" "));
                pip_install(&dir, &packages, &what, &env)?;
            }
            if let Some(reqs) = &recipe.requirements {
                let file = dir.join("reprobench-requirements.txt");
                std::fs::write(&file, reqs).map_err(|e| infra("writing the requirements", e))?;
                let args = ["-r".to_string(), file.display().to_string()];
                pip_install(
                    &dir,
                    &args,
                    "pip install -r (the repository's requirements)",
                    &env,
                )?;
            }
            if !recipe.pip_packages.is_empty() {
                let what = format!("pip install {}", recipe.pip_packages.join(" "));
                pip_install(&dir, &recipe.pip_packages, &what, &env)?;
            }
            std::fs::write(&marker, b"").map_err(|e| infra("marking the venv ready", e))
        },
    )?;
    Ok(dir)
}

/// A whole interpreter at `dir` (its prefix copied, readable by all) in place of a virtualenv,
/// with `bin/python`; its `LD_LIBRARY_PATH`. The interpreter has a prefix of its own (pyenv's, say).
fn standalone_copy(
    python: &super::python::Interpreter,
    dir: &Path,
) -> Result<Vec<(String, String)>, SandboxError> {
    let exe = python.exe.strip_prefix(&python.prefix).map_err(|_| {
        infra(
            "copying the interpreter",
            "its binary is outside its prefix",
        )
    })?;
    copy_prefix_readable(&python.prefix, dir, "as the instance's environment")?;
    if !dir.join("bin/python").exists() {
        std::os::unix::fs::symlink(dir.join(exe), dir.join("bin/python"))
            .map_err(|e| infra("linking bin/python", e))?;
    }
    // The copied scripts (pip, ...) still name the original interpreter: point them at the copy.
    for entry in std::fs::read_dir(dir.join("bin"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let path = entry.path();
        if path.is_symlink() {
            continue;
        }
        let Ok(text) = std::fs::read(&path) else {
            continue;
        };
        let first = text.split(|b| *b == b'\n').next().unwrap_or_default();
        let names_python = first.starts_with(b"#!/")
            && String::from_utf8_lossy(first)
                .rsplit('/')
                .next()
                .is_some_and(|n| n.trim().starts_with("python"));
        if names_python {
            let mut fixed = format!("#!{}", dir.join("bin/python").display()).into_bytes();
            fixed.extend_from_slice(&text[first.len()..]);
            std::fs::write(&path, fixed).map_err(|e| infra("pointing a script at the copy", e))?;
        }
    }
    Ok(vec![(
        "LD_LIBRARY_PATH".to_string(),
        dir.join("lib").display().to_string(),
    )])
}

/// What executions of a checkout need besides the venv, `KEY=VALUE` per line:
/// `REPROBENCH_EDITABLE` (paths of the checkout, `:`-separated, that editable installs
/// registered; the same paths of the execution's copy go first on `PYTHONPATH`).
const EXEC_ENV_FILE: &str = ".git/reprobench-exec-env";

/// Directories of `template` that editable installs made importable (see [`EDITABLE_ROOTS_PY`]).
fn editable_roots(venv: &Path, template: &Path) -> Vec<String> {
    let out = std::process::Command::new(venv.join("bin/python"))
        .args(["-c", EDITABLE_ROOTS_PY])
        .arg(template)
        .envs(read_env_file(&venv.join(ENV_FILE)))
        .stdin(Stdio::null())
        .output();
    out.map(|o| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect()
    })
    .unwrap_or_default()
}

fn prepare_checkout(
    cache: &Path,
    recipe: &EnvRecipe,
    venv: &Path,
) -> Result<PathBuf, SandboxError> {
    let root = cache.join("checkouts");
    let dir = root.join(recipe.instance_key());
    // Ready only together with its venv: a venv built anew has not seen the install steps.
    let ready = || {
        dir.join(".git/reprobench-ready").exists()
            && installed_marker(venv, &recipe.instance_key()).exists()
    };
    // Built in place under a lock, never moved: editable installs record the checkout's path.
    let lock = root.join(format!("{}.lock", recipe.instance_key()));
    build_once(&dir, &lock, ready, || {
        if !recipe.mirror.is_dir() {
            return Err(SandboxError::BadInput(format!(
                "no mirror of {} at {}; run `reprobench datasets prepare` (or `fetch`, or `import`) for its dataset, or pass --repos DIR",
                recipe.repo,
                recipe.mirror.display()
            )));
        }
        let has_commit = std::process::Command::new("git")
            .arg("-C")
            .arg(&recipe.mirror)
            .args([
                "cat-file",
                "-e",
                &format!("{}^{{commit}}", recipe.base_commit),
            ])
            .stderr(Stdio::null())
            .status()
            .map_err(|e| infra("running git (is it installed?)", e))?;
        if !has_commit.success() {
            return Err(SandboxError::BadInput(format!(
                "commit {} of {} is not in the mirror {}; update the mirror (`reprobench datasets prepare`/`fetch`/`import`) or fix base_commit",
                recipe.base_commit,
                recipe.repo,
                recipe.mirror.display()
            )));
        }
        // The commit's tree (what the mirror has of it) as a repository of its own.
        std::fs::create_dir_all(&dir).map_err(|e| infra("creating the checkout", e))?;
        super::tree::checkout(&recipe.mirror, &recipe.base_commit, &dir).map_err(|e| {
            SandboxError::BadInput(format!(
                "cannot check out {} at {} from {}: {e}",
                recipe.repo,
                recipe.base_commit,
                recipe.mirror.display()
            ))
        })?;
        let env = venv_env(venv);
        for cmd in recipe
            .pre_install
            .iter()
            .chain(std::iter::once(&recipe.install))
            .filter(|c| !c.trim().is_empty())
        {
            let cmd = &without_system_steps(cmd, &recipe.repo)?;
            if cmd.is_empty() {
                continue;
            }
            run_setup(
                std::process::Command::new("bash")
                    .args(["-c", cmd])
                    .current_dir(&dir)
                    .envs(env.iter().map(|(k, v)| (k, v)))
                    .envs(recipe.env_vars.iter().map(|(k, v)| (k, v))),
                &format!("`{cmd}` in {}", recipe.repo),
            )
            .map_err(|e| SandboxError::BadInput(e.to_string()))?;
        }
        // The recipe's variables reach executions through their script.
        let exec_env = format!(
            "REPROBENCH_EDITABLE={}\n",
            editable_roots(venv, &dir).join(":")
        );
        std::fs::write(dir.join(EXEC_ENV_FILE), exec_env)
            .map_err(|e| infra("writing the checkout's environment", e))?;
        std::fs::write(installed_marker(venv, &recipe.instance_key()), b"")
            .and_then(|()| std::fs::write(dir.join(".git/reprobench-ready"), b""))
            .map_err(|e| infra("marking the checkout ready", e))
    })?;
    Ok(dir)
}

/// `cmd` without its system package steps, which would change the host's packages: they are
/// checked instead (the packages they install must be on the host already).
fn without_system_steps(cmd: &str, repo: &str) -> Result<String, SandboxError> {
    let split = system_packages::split(cmd);
    if !split.packages.is_empty() {
        let missing = system_packages::missing_on_host(&split.packages).map_err(|e| {
            SandboxError::BadInput(format!(
                "{repo}'s environment installs system packages ({}) with `{cmd}`, and {e}: use the docker executor, where they go into the image",
                split.packages.join(" ")
            ))
        })?;
        if !missing.is_empty() {
            return Err(SandboxError::BadInput(format!(
                "{repo}'s environment installs system packages with `{cmd}`; the process executor never changes this host's packages, and {} {} not installed here: install them (`apt-get install -y {}`), or use the docker executor, where they go into the image",
                missing.join(" "),
                if missing.len() == 1 { "is" } else { "are" },
                missing.join(" ")
            )));
        }
    }
    Ok(split.rest)
}

/// How one execution is isolated: the namespace it enters, and whether failures to isolate or
/// limit it are tolerated.
#[derive(Clone, Copy, Debug)]
struct Isolation {
    namespace: Option<Namespace>,
    best_effort: bool,
}

/// Limits applied in the child between fork and exec (only async-signal-safe calls there).
#[derive(Clone, Copy)]
struct ChildLimits {
    nproc: u64,
    address_space: u64,
    file_size: u64,
    as_nobody: bool,
    /// The namespace to enter; `None` when the node runs executions unisolated (allowed).
    namespace: Option<Namespace>,
    /// Carry on when a limit or the namespace cannot be set (`--allow-unisolated-process`).
    best_effort: bool,
}

/// Sets a hard and soft limit of `value`, or keeps a lower hard limit already in force.
/// False when neither holds (the execution would run without that limit).
fn set_limit(resource: libc::__rlimit_resource_t, value: u64) -> bool {
    let mut current = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit with valid structs; both are async-signal-safe.
    unsafe {
        let value = if libc::getrlimit(resource, &mut current) == 0 {
            (value as libc::rlim_t).min(current.rlim_max)
        } else {
            value as libc::rlim_t
        };
        let lim = libc::rlimit {
            rlim_cur: value,
            rlim_max: value,
        };
        libc::setrlimit(resource, &lim) == 0
    }
}

fn read_capped(mut r: impl Read, cap: usize) -> (Vec<u8>, bool) {
    let mut kept = CappedOutput::new(cap);
    let mut chunk = [0u8; 64 * 1024];
    loop {
        match r.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => kept.push(&chunk[..n]),
        }
    }
    kept.finish()
}

fn copy_tree(from: &Path, to: &Path) -> Result<(), SandboxError> {
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", from.display()))
        .arg(to)
        .status()
        .map_err(|e| infra("copying the checkout", e))?;
    if !status.success() {
        return Err(SandboxError::Infra(format!(
            "copying {} failed ({status}); is the disk full?",
            from.display()
        )));
    }
    Ok(())
}

/// Whether mounting a private tmpfs over work directories was refused once (not root, or a
/// container without the capability): then no execution tries again.
static TMPFS_REFUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Mounts a tmpfs of `disk_mb` MiB (0: the kernel's default) at `dir`; false when it cannot.
fn mount_work_tmpfs(dir: &Path, disk_mb: u64) -> bool {
    use std::sync::atomic::Ordering;
    if TMPFS_REFUSED.load(Ordering::Relaxed) {
        return false;
    }
    let Ok(target) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    let size = if disk_mb > 0 {
        format!(",size={disk_mb}m")
    } else {
        String::new()
    };
    let options = std::ffi::CString::new(format!("mode=0755{size}")).expect("no NUL");
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            options.as_ptr().cast(),
        )
    };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        TMPFS_REFUSED.store(true, Ordering::Relaxed);
        tracing::warn!(error = %err, "process sandbox: cannot mount a tmpfs for executions; they copy the checkout to disk instead");
        return false;
    }
    true
}

/// Unmounts the tmpfs at its path when dropped (lazily: nothing of the execution is left to use
/// it), before the work directory under it is removed.
struct UnmountOnDrop(Option<PathBuf>);

impl Drop for UnmountOnDrop {
    fn drop(&mut self) {
        if let Some(dir) = &self.0
            && let Ok(target) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        {
            // SAFETY: a valid NUL-terminated path.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

fn exec_blocking(
    cache: &Path,
    template: &Path,
    venv: &Path,
    req: ExecRequest,
    as_nobody: bool,
    isolation: Isolation,
) -> Result<ExecOutput, SandboxError> {
    let started = Instant::now();
    let work_root = cache.join("work");
    std::fs::create_dir_all(&work_root).map_err(|e| infra("creating the work directory", e))?;
    let work = tempfile::Builder::new()
        .prefix("exec-")
        .tempdir_in(&work_root)
        .map_err(|e| infra("creating the work directory", e))?;
    // As root, the execution's root is a tmpfs of its own, as a container's /work is: copying
    // the checkout into memory and dropping it cost a third of doing so on disk, and the disk
    // limit holds. Elsewhere (or where mounting is refused) it stays a directory on disk.
    let private_tmpfs = as_nobody && mount_work_tmpfs(work.path(), req.limits.disk_mb);
    // Declared after `work`, so on every early return it is dropped (unmounted) first.
    let unmount = UnmountOnDrop(private_tmpfs.then(|| work.path().to_path_buf()));
    // The execution's own root, as a container's: the repository copy in `repo/`, HOME and TMPDIR
    // in `tmp/` beside it, both the execution user's. Tools that look upwards from a temporary
    // directory (pytest's rootdir) find neither the repository's configuration nor a directory
    // they cannot write.
    let repo = work.path().join("repo");
    let scratch = work.path().join("tmp");
    for d in [&repo, &scratch] {
        std::fs::create_dir(d).map_err(|e| infra("creating the work directory", e))?;
    }
    copy_tree(template, &repo).map_err(|e| match e {
        SandboxError::Infra(msg) if private_tmpfs => SandboxError::BadInput(format!(
            "{msg}: the execution's tmpfs holds limits.disk_mb = {} MiB; raise limits.disk_mb",
            req.limits.disk_mb
        )),
        other => other,
    })?;
    for f in &req.files {
        check_relative_path(&f.path)?;
        let dest = repo.join(&f.path);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent).map_err(|e| infra("writing input files", e))?;
        }
        std::fs::write(&dest, &f.contents).map_err(|e| infra("writing input files", e))?;
        std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(f.mode))
            .map_err(|e| infra("writing input files", e))?;
    }
    let uid = execution_uid();
    if as_nobody {
        // The copy must be writable by the unprivileged user the execution runs as.
        let status = std::process::Command::new("chown")
            .args(["-R", &format!("{uid}:{uid}")])
            .arg(work.path())
            .status();
        if !status.is_ok_and(|s| s.success()) {
            return Err(SandboxError::Infra(
                "cannot hand the work directory to nobody".into(),
            ));
        }
    }
    let (reader, writer) = std::io::pipe().map_err(|e| infra("creating the output pipe", e))?;
    let writer2 = writer
        .try_clone()
        .map_err(|e| infra("creating the output pipe", e))?;
    let Some((program, args)) = req.command.split_first() else {
        return Err(SandboxError::BadInput("empty command".into()));
    };
    // The checkout's variables; the execution's copy of every editable-install root first on
    // PYTHONPATH, so imports resolve to the copy the patches went into.
    let mut extra = read_env_file(&venv.join(ENV_FILE));
    for (k, v) in read_env_file(&template.join(EXEC_ENV_FILE)) {
        if k == "REPROBENCH_EDITABLE" {
            if !v.is_empty() {
                let paths: Vec<String> = v
                    .split(':')
                    .map(|r| repo.join(r).display().to_string())
                    .collect();
                extra.push(("PYTHONPATH".into(), paths.join(":")));
            }
        } else {
            extra.push((k, v));
        }
    }
    let mut cmd = std::process::Command::new(program);
    cmd.args(args)
        .current_dir(&repo)
        .env_clear()
        .env(
            "PATH",
            format!("{}/bin:/usr/local/bin:/usr/bin:/bin", venv.display()),
        )
        .env("VIRTUAL_ENV", venv)
        .env("HOME", &scratch)
        .env("TMPDIR", &scratch)
        .env("LANG", "C.UTF-8")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .envs(extra.iter().map(|(k, v)| (k, v)))
        .envs(req.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::from(writer))
        .stderr(Stdio::from(writer2));
    let limits = ChildLimits {
        nproc: req.limits.pids,
        address_space: req.limits.memory_mb.saturating_mul(1 << 20),
        file_size: req.limits.disk_mb.saturating_mul(1 << 20),
        as_nobody,
        namespace: isolation.namespace,
        best_effort: isolation.best_effort,
    };
    // SAFETY: only async-signal-safe libc calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            // Fails closed: a limit or a namespace that cannot be set stops the execution,
            // unless the node was started with --allow-unisolated-process.
            let refuse = || Err(std::io::Error::last_os_error());
            libc::setsid();
            // Every limit is set (`&`, not `&&`), then checked.
            let limited = set_limit(libc::RLIMIT_AS, limits.address_space)
                & set_limit(libc::RLIMIT_FSIZE, limits.file_size)
                & set_limit(libc::RLIMIT_CORE, 0);
            if !limited && !limits.best_effort {
                return refuse();
            }
            // An empty network namespace: no route anywhere.
            if let Some(ns) = limits.namespace
                && libc::unshare(ns.flags()) != 0
                && !limits.best_effort
            {
                return refuse();
            }
            if limits.as_nobody
                && (libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(uid) != 0
                    || libc::setuid(uid) != 0)
            {
                return refuse();
            }
            if !set_limit(libc::RLIMIT_NPROC, limits.nproc) && !limits.best_effort {
                return refuse();
            }
            Ok(())
        });
    }
    let setup = started.elapsed();
    let command_start = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| infra(&format!("starting `{program}`"), e))?;
    drop(cmd); // closes our copies of the pipe's write end
    let pgid = child.id() as libc::pid_t;
    let cap = req.limits.max_output_bytes;
    let collector = std::thread::spawn(move || read_capped(reader, cap));
    let deadline = command_start + req.limits.timeout;
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if Instant::now() >= deadline => {
                timed_out = true;
                // SAFETY: signalling the process group we created with setsid.
                unsafe { libc::killpg(pgid, libc::SIGKILL) };
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(infra("waiting for the command", e)),
        }
    };
    let command_time = command_start.elapsed();
    // Background processes the command left behind would hold the pipe open: end them.
    // SAFETY: as above.
    unsafe { libc::killpg(pgid, libc::SIGKILL) };
    let (bytes, output_truncated) = collector.join().unwrap_or_default();
    let teardown_start = Instant::now();
    drop(unmount); // frees the tmpfs with the copy in it
    drop(work); // removes the copy (or the empty mount point)
    let exit_code = status.and_then(|s| {
        use std::os::unix::process::ExitStatusExt;
        s.code()
            .map(i64::from)
            .or_else(|| s.signal().map(|sig| 128 + i64::from(sig)))
    });
    Ok(ExecOutput {
        exit_code: if timed_out { None } else { exit_code },
        timed_out,
        output: String::from_utf8_lossy(&bytes).into_owned(),
        output_truncated,
        command_time,
        overhead: setup + teardown_start.elapsed(),
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

    fn prepare(&self, recipe: &EnvRecipe) -> BoxFuture<Result<Prepared, SandboxError>> {
        let cache = self.cache_dir.clone();
        let recipe = recipe.clone();
        let lock = self.lock_for(&recipe.instance_key());
        let env_lock = self.lock_for(&format!("venv-{}", venv_name(&recipe, self.as_nobody)));
        let public = self.as_nobody;
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

    fn exec(
        &self,
        prepared: &Prepared,
        req: ExecRequest,
    ) -> BoxFuture<Result<ExecOutput, SandboxError>> {
        let cache = self.cache_dir.clone();
        let prepared = prepared.clone();
        let as_nobody = self.as_nobody;
        let isolation = match (&self.isolation_problem, self.allow_unisolated) {
            (None, _) => Isolation {
                namespace: Some(self.namespace),
                best_effort: false,
            },
            (Some(_), true) => Isolation {
                namespace: None,
                best_effort: true,
            },
            (Some(problem), false) => {
                let message = format!(
                    "this node cannot isolate process executions, so it refuses to run them: {problem}. Or start the node with --allow-unisolated-process to run them with the network (every report then says so)"
                );
                return Box::pin(async move { Err(SandboxError::Infra(message)) });
            }
        };
        Box::pin(async move {
            let Prepared::Checkout { template, venv } = prepared else {
                return Err(SandboxError::Infra(
                    "the process sandbox was handed a docker image".into(),
                ));
            };
            tokio::task::spawn_blocking(move || {
                exec_blocking(&cache, &template, &venv, req, as_nobody, isolation)
            })
            .await
            .map_err(|e| infra("execution task", e))?
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{InputFile, Limits};

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
            eprintln!("skipped: the probe's namespace needs root here");
            return;
        }
        assert_eq!(
            probe_namespace(Namespace::Net).map_err(|e| e.to_string()),
            Ok(())
        );
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let sb = ProcessSandbox::new(dir.path().join("cache"));
        assert_eq!(sb.isolation_problem(), None);
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
        assert_eq!(out.output.trim(), "full", "{}", out.output);
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
