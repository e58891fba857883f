//! The process sandbox's virtualenvs: one per environment recipe, built once and cached, with
//! pip's date cap where the recipe's date asks for it, and standalone copies of an interpreter.

use super::*;

/// Environment of commands run with a virtualenv: its `bin` first, the interpreter's libraries.
pub(super) fn venv_env(venv: &Path) -> Vec<(String, String)> {
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
pub(super) const ENV_FILE: &str = ".reprobench-env";

pub(super) fn read_env_file(path: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub(super) fn pip_install(
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
pub(super) fn upgrade_pip_for_date_cap(
    venv: &Path,
    env: &[(String, String)],
) -> Result<(), SandboxError> {
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
pub(super) fn venv_name(recipe: &EnvRecipe, public: bool) -> String {
    let installs = !recipe.install.trim().is_empty() || !recipe.pre_install.is_empty();
    let key = if installs {
        format!("{}-{}", recipe.env_key(), recipe.instance_key())
    } else {
        recipe.env_key()
    };
    if public { format!("{key}-public") } else { key }
}

/// Marker in a venv: the install steps of the checkout `key` ran into it.
pub(super) fn installed_marker(venv: &Path, key: &str) -> PathBuf {
    venv.join(format!(".reprobench-installed-{key}"))
}

/// Marker in a venv: it is built.
fn ready_marker(venv: &Path) -> PathBuf {
    venv.join(".reprobench-ready")
}

/// The recipe's venv in `cache`, when it is built.
pub(super) fn built_venv(cache: &Path, recipe: &EnvRecipe, public: bool) -> Option<PathBuf> {
    let dir = cache.join("venvs").join(venv_name(recipe, public));
    ready_marker(&dir).exists().then_some(dir)
}

pub(super) fn prepare_venv(
    cache: &Path,
    recipe: &EnvRecipe,
    public: bool,
) -> Result<PathBuf, SandboxError> {
    let name = venv_name(recipe, public);
    let root = cache.join("venvs");
    let dir = root.join(&name);
    let marker = ready_marker(&dir);
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
                    Some(date) => crate::resolve::resolve_as_of(
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
pub(super) fn standalone_copy(
    python: &crate::python::Interpreter,
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
