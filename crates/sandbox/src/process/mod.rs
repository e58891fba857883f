//! The `process` sandbox, for machines without Docker: a cached virtualenv per environment, a
//! cached checkout per instance, and per execution a fresh copy of that checkout, prepared and run
//! in bubblewrap sandboxes ([`exec`]): the tree prepared out of the command's sight, the command
//! as an unprivileged user with its own `/tmp`, `/dev/shm`, processes and no network, the
//! environment read-only, and nothing else of the host's but its system directories. A node
//! that cannot give executions that refuses them, unless allowed to run them unisolated.

mod exec;

use super::python::{
    build_once, copy_prefix_readable, find_python, find_python_where, has_own_prefix,
};
use super::system_packages;
use super::{
    BUILD_TOOLS, DATED_BUILD_TOOLS, DATED_PIP, EDITABLE_ROOTS_PY, EnvRecipe, ExecOutput,
    ExecRequest, PIP_BUILD_CONSTRAINT_VAR, PIP_DATE_CAP_VAR, PIP_WITH_DATE_CAP, Prepared, Sandbox,
    SandboxError,
};
use crate::BoxFuture;
use crate::ExecutorKind;
use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

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
            // Locales the host lacks, compiled into the venv (bound into every execution).
            let missing = crate::locales::missing_on_host(&recipe.locales);
            if !missing.is_empty() {
                let locpath = dir.join("locales");
                for name in &missing {
                    crate::locales::compile(&locpath, name).map_err(|e| {
                        SandboxError::BadInput(format!(
                            "{}'s executions need the {name} locale, which this host lacks: {e}",
                            recipe.repo
                        ))
                    })?;
                }
                env_text.push_str(&format!("LOCPATH={}\n", locpath.display()));
            }
            if !recipe.build_constraints.is_empty() {
                let file = dir.join("reprobench-build-constraints.txt");
                std::fs::write(&file, recipe.build_constraints.join("\n") + "\n")
                    .map_err(|e| infra("writing the build constraints", e))?;
                env_text.push_str(&format!("{PIP_BUILD_CONSTRAINT_VAR}={}\n", file.display()));
            }
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
            // A conda environment of the cap's date around the install commands.
            let dated = recipe
                .packages_as_of
                .as_ref()
                .filter(|_| recipe.dated_pip_for_install);
            if let Some(date) = dated {
                pip_install(
                    &dir,
                    &DATED_BUILD_TOOLS.map(String::from),
                    &format!("installing the setuptools and wheel of {date}"),
                    &env,
                )?;
            }
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
            if let Some(date) = dated {
                // The date cap now picks the newest pip before it, which the install commands run.
                pip_install(
                    &dir,
                    &DATED_PIP.map(String::from),
                    &format!("going back to the pip of {date} for the install commands"),
                    &env,
                )?;
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

impl ProcessSandbox {
    /// Those of `wanted` (named `KIND:NAME` in the memo) that `missing` reports absent; present
    /// ones are remembered.
    fn missing_on_host<E>(
        &self,
        kind: &str,
        wanted: &[String],
        missing: impl FnOnce(&[String]) -> Result<Vec<String>, E>,
    ) -> Result<Vec<String>, E> {
        let key = |w: &String| format!("{kind}:{w}");
        let unknown: Vec<String> = {
            let memo = self.on_host.lock().expect("memo lock");
            wanted
                .iter()
                .filter(|w| !memo.contains(&key(w)))
                .cloned()
                .collect()
        };
        if unknown.is_empty() {
            return Ok(Vec::new());
        }
        let absent = missing(&unknown)?;
        let mut memo = self.on_host.lock().expect("memo lock");
        memo.extend(unknown.iter().filter(|u| !absent.contains(u)).map(key));
        Ok(absent)
    }

    /// The recipe's locales the host lacks.
    fn locales_missing(&self, recipe: &EnvRecipe) -> Vec<String> {
        self.missing_on_host::<std::convert::Infallible>("locale", &recipe.locales, |w| {
            Ok(crate::locales::missing_on_host(w))
        })
        .unwrap_or_else(|e| match e {})
    }

    /// The system packages the recipe's build needs (a C compiler, ...) are on the host; they
    /// are never installed on it. A host dpkg cannot be asked about is not checked: the build
    /// then fails with its own message if one is missing.
    fn build_packages_on_host(&self, recipe: &EnvRecipe) -> Result<(), SandboxError> {
        if recipe.system_packages.is_empty() || !system_packages::dpkg_available() {
            return Ok(());
        }
        let missing = self
            .missing_on_host(
                "pkg",
                &recipe.system_packages,
                system_packages::missing_on_host,
            )
            .map_err(|e| SandboxError::Infra(e.to_string()))?;
        if missing.is_empty() {
            return Ok(());
        }
        Err(SandboxError::BadInput(format!(
            "building {}'s environment needs system packages that SWT-bench's base image has and this host lacks: {}; the process executor never changes this host's packages: install them (`apt-get install -y {}`), or use the docker executor, whose base image has them",
            recipe.repo,
            missing.join(" "),
            missing.join(" ")
        )))
    }
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

    fn exec(
        &self,
        prepared: &Prepared,
        req: ExecRequest,
    ) -> BoxFuture<Result<ExecOutput, SandboxError>> {
        let isolation = match (&self.isolation_problem, &self.bwrap, self.allow_unisolated) {
            (None, Some(bwrap), _) => exec::Isolation::Bwrap(bwrap.clone()),
            (_, _, true) => exec::Isolation::Unisolated,
            (problem, _, false) => {
                let message = format!(
                    "this node cannot isolate process executions, so it refuses to run them: {}. Or start the node with --allow-unisolated-process to run them without isolation (every report then says so)",
                    problem.as_deref().unwrap_or("bubblewrap is missing")
                );
                return Box::pin(async move { Err(SandboxError::Infra(message)) });
            }
        };
        let Prepared::Checkout { template, venv } = prepared.clone() else {
            return Box::pin(async move {
                Err(SandboxError::Infra(
                    "the process sandbox was handed a docker image".into(),
                ))
            });
        };
        let cancelled = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ctx = exec::Context {
            cache: self.cache_dir.clone(),
            template,
            venv,
            as_root: self.as_root,
            isolation,
            cancelled: cancelled.clone(),
        };
        Box::pin(async move {
            // Dropped with this future: a cancelled attempt's execution is killed at once.
            let _cancel = exec::CancelOnDrop(cancelled);
            tokio::task::spawn_blocking(move || exec::exec_blocking(&ctx, req))
                .await
                .map_err(|e| infra("execution task", e))?
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
