//! The process sandbox's checkouts: one per instance, cached, with what its executions need
//! besides the virtualenv.

use super::*;

/// What executions of a checkout need besides the venv, `KEY=VALUE` per line:
/// `REPROBENCH_EDITABLE` (paths of the checkout, `:`-separated, that editable installs
/// registered; the same paths of the execution's copy go first on `PYTHONPATH`).
pub(super) const EXEC_ENV_FILE: &str = ".git/reprobench-exec-env";

/// A note in a venv that its install commands ran with another pip than the date cap's: its line
/// goes into the reports of the instances prepared with it ([`crate::Sandbox::prepared_notes`]).
pub(super) const PIP_NOTE_FILE: &str = "reprobench-install-pip-note";

/// Directories of `template` that editable installs made importable (see [`EDITABLE_ROOTS_PY`]).
pub(super) fn editable_roots(venv: &Path, template: &Path) -> Vec<String> {
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

/// Whether the checkout `dir` of `recipe` is ready with the venv `venv`: only together with it,
/// as a venv built anew has not seen the install steps.
fn checkout_ready(dir: &Path, recipe: &EnvRecipe, venv: &Path) -> bool {
    dir.join(".git/reprobench-ready").exists()
        && installed_marker(venv, &recipe.instance_key()).exists()
}

/// The recipe's checkout in `cache`, when it is built and installed into `venv`.
pub(super) fn built_checkout(cache: &Path, recipe: &EnvRecipe, venv: &Path) -> Option<PathBuf> {
    let dir = cache.join("checkouts").join(recipe.instance_key());
    checkout_ready(&dir, recipe, venv).then_some(dir)
}

pub(super) fn prepare_checkout(
    cache: &Path,
    recipe: &EnvRecipe,
    venv: &Path,
) -> Result<PathBuf, SandboxError> {
    let root = cache.join("checkouts");
    let dir = root.join(recipe.instance_key());
    let ready = || checkout_ready(&dir, recipe, venv);
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
        crate::tree::checkout(&recipe.mirror, &recipe.base_commit, &dir).map_err(|e| {
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
            let install = || {
                run_setup(
                    std::process::Command::new("bash")
                        .args(["-c", cmd])
                        .current_dir(&dir)
                        .envs(env.iter().map(|(k, v)| (k, v)))
                        .envs(recipe.env_vars.iter().map(|(k, v)| (k, v))),
                    &format!("`{cmd}` in {}", recipe.repo),
                )
            };
            match install() {
                Ok(()) => {}
                Err(HostCommandError::Failed { output_tail, .. })
                    if output_tail.contains(NO_BUILD_EDITABLE)
                        && retries_with_dated_pip(recipe) =>
                {
                    let Some(date) = &recipe.packages_as_of else {
                        return Err(SandboxError::BadInput(output_tail));
                    };
                    // The date cap's pip no longer falls back to `setup.py develop` for a build
                    // backend without PEP 660's hook; the pip of the cap's date, as in
                    // SWT-bench's conda environment, does.
                    pip_install(
                        venv,
                        &DATED_PIP.map(String::from),
                        &format!("going back to the pip of {date} for `{cmd}`"),
                        &env,
                    )?;
                    std::fs::write(
                        venv.join(PIP_NOTE_FILE),
                        dated_pip_install_note(date, cmd) + "\n",
                    )
                    .map_err(|e| infra("noting the pip of the install commands", e))?;
                    install().map_err(|e| SandboxError::BadInput(e.to_string()))?;
                }
                Err(e) => return Err(SandboxError::BadInput(e.to_string())),
            }
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
