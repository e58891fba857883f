//! SWT-bench's environment specs, shipped as data in `datasets/swt-bench/env-specs.json`
//! (exported from logic-star-ai/swt-bench at 330a649, `src/constants.py`: per repository and
//! version the Python version, packages, pip pins, pre-install, install and test commands), and
//! how they read as reprobench environment specs. Pure apart from reading that file.
//!
//! SWT-bench builds its environments with conda; reprobench with a virtualenv and pip. The
//! packages conda would install by name are installed by pip under the same names (`name=1.2`
//! becomes `name==1.2`); a requirements file is read from the repository at the instance's
//! environment-setup commit as SWT-bench reads it; a conda `environment.yml` cannot be
//! reproduced, so only the pip part is installed and the spec says what was left out. SWT-bench
//! builds its images anew from PyPI; packages without a pin resolve as of the day its specs last
//! changed ([`SPECS_AS_OF`]), not as of today, where the Python version lets pip do that.

use crate::swt::EnvSpec;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Where the specs live, relative to the datasets directory.
pub const SPECS_FILE: &str = "swt-bench/env-specs.json";

/// The instant unpinned packages of SWT-bench's environments resolve at: the day its specs last
/// changed upstream (`src/constants.py`, commit 0ef5378, 2025-02-28), so a package released since
/// (docutils 0.22, which dropped `docutils.utils.roman` that sphinx 3-4 import) is not picked.
pub const SPECS_AS_OF: &str = "2025-02-28T00:00:00Z";
/// The first Python whose pip (26+) can resolve as of a date.
const FIRST_PYTHON_WITH_DATE_CAP: (u32, u32) = (3, 9);
/// End of life of the Pythons SWT-bench's specs ask for that reached it before [`SPECS_AS_OF`]
/// (python.org's release schedule, PEPs 478, 494, 537, 569). Conda's channels stop building
/// packages for a Python at its end of life, so a conda environment of that Python gets the
/// packages as they were then: scikit-learn 0.20-0.22 (Python 3.6) build with the Cython 0.29
/// conda gives them, and not with the Cython 3 pip would pick for 3.6 today.
const PYTHON_END_OF_LIFE: [((u32, u32), &str); 4] = [
    ((3, 5), "2020-09-30T00:00:00Z"),
    ((3, 6), "2021-12-23T00:00:00Z"),
    ((3, 7), "2023-06-27T00:00:00Z"),
    ((3, 8), "2024-10-07T00:00:00Z"),
];

/// Debian packages of SWT-bench's base image (`build-essential`) that a repository's environment
/// build needs: its requirements or its own code have C extensions built from source
/// (django's `pywatchman`, which PyPI has no wheel of).
const BUILD_SYSTEM_PACKAGES: [(&str, &[&str]); 4] = [
    ("django/django", &["gcc", "libc6-dev"]),
    ("astropy/astropy", &["gcc", "libc6-dev"]),
    ("scikit-learn/scikit-learn", &["gcc", "g++", "libc6-dev"]),
    ("matplotlib/matplotlib", &["gcc", "g++", "libc6-dev"]),
];

/// An environment whose spec pins packages that PyPI has no wheel of for the spec's Python, so
/// pip builds them where conda installs a binary: the build constraints and system packages give
/// those builds what the binaries were built with, and the reason goes into every report.
struct SourceBuildFix {
    /// The repository, as SWT-bench names it.
    repo: &'static str,
    /// The spec's version.
    version: &'static str,
    /// pip constraints of the source builds (`--build-constraint`).
    build_constraints: &'static [&'static str],
    /// Debian packages the source builds need besides the repository's.
    system_packages: &'static [&'static str],
    /// What the report says.
    why: &'static str,
}

/// pip options that SWT-bench's install commands pass and pip 26 no longer has (pip 25.3 removed
/// the legacy `setup.py develop`/`install` paths): an environment whose commands pass one goes
/// back to the pip of its date for them (see `EnvSpec::dated_pip_for_install`).
pub const PIP_OPTIONS_GONE_IN_26: [&str; 3] =
    ["--no-use-pep517", "--global-option", "--build-option"];

/// See [`SourceBuildFix`].
const SOURCE_BUILD_FIXES: [SourceBuildFix; 1] = [SourceBuildFix {
    repo: "scikit-learn/scikit-learn",
    version: "1.3",
    build_constraints: &["cython<3", "setuptools<60"],
    system_packages: &["gfortran", "libopenblas-dev", "pkg-config"],
    why: "numpy 1.19.2 and scipy 1.5.2, which the spec pins, have no wheel for Python 3.9 on PyPI (conda installs conda-forge's binaries): pip builds them from source, with Cython < 3 (their build requirements would take Cython 3, which cannot build them) and setuptools < 60 (scipy's build requirement numpy 1.17.3 is built too, and needs distutils' msvccompiler, which setuptools 60 drops) pinned for those builds (`--build-constraint`), and scipy against Debian's gfortran and OpenBLAS where conda's binary brings its own BLAS",
}];

/// matplotlib from 3.3 on downloads FreeType 2.6.1 and Qhull while it builds (SWT-bench's image
/// builds fetch them from sourceforge/savannah and qhull.org); reprobench builds it against the
/// system's instead, through matplotlib's own switches, and says so in every report.
const MATPLOTLIB_SYSTEM_LIBRARIES: (u32, u32) = (3, 3);

/// The `[libs]` section that makes matplotlib build against the system's FreeType and Qhull,
/// and the file its version reads it from (`setup.cfg` up to 3.3, `mplsetup.cfg` after).
fn matplotlib_libs_file(version: (u32, u32)) -> &'static str {
    if version <= (3, 3) {
        "setup.cfg"
    } else {
        "mplsetup.cfg"
    }
}

/// astropy before 4.0 builds with astropy-helpers, a git submodule on GitHub: the release of it
/// on PyPI whose `ah_bootstrap.py` is the commit's goes where the submodule would be.
const ASTROPY_HELPERS_BEFORE: (u32, u32) = (4, 0);
/// The script that finds and unpacks that release (run by the environment's Python).
const ASTROPY_HELPERS_PY: &str = include_str!("swt_bench/astropy_helpers.py");

/// Repositories whose conda environment file is installed with pip (its dependencies under their
/// PyPI names): matplotlib's lists pytest and the test plugins, which its spec's pip pins lack.
/// Others keep to the spec's pip packages (xarray's pins hold what its tests need).
const CONDA_ENV_BY_PIP: [&str; 1] = ["matplotlib/matplotlib"];

/// Conda packages whose PyPI name differs.
const CONDA_TO_PYPI: [(&str, &str); 3] = [
    ("pyqt", "PyQt5"),
    ("pytables", "tables"),
    ("matplotlib-base", "matplotlib"),
];

/// Conda packages pip cannot give an environment: the interpreter and pip themselves, system
/// libraries and programs conda packages (GTK, Graphviz), and bindings PyPI has no wheel of that
/// build only against system libraries (PyGObject, wxPython).
const CONDA_ONLY: [&str; 9] = [
    "python",
    "pip",
    "gtk3",
    "gtk4",
    "graphviz",
    "pygobject",
    "wxpython",
    "cairo",
    "ffmpeg",
];

/// A conda environment file's dependencies as pip requirements (conda's `name=1.2` as
/// `name==1.2`, PyPI's names for the few that differ, the `pip:` list as it is), and the conda
/// packages left out (see [`CONDA_ONLY`]). Reads the file's `dependencies:` list only. Pure.
pub fn conda_env_as_requirements(yml: &str) -> (Vec<String>, Vec<String>) {
    let (mut reqs, mut left_out) = (Vec::new(), Vec::new());
    let mut in_deps = false;
    let mut pip_indent: Option<usize> = None;
    for line in yml.lines() {
        let text = line.split(" #").next().unwrap_or_default();
        if text.trim().is_empty() || text.trim_start().starts_with('#') {
            continue;
        }
        let indent = text.len() - text.trim_start().len();
        if indent == 0 {
            in_deps = text.trim_end() == "dependencies:";
            pip_indent = None;
            continue;
        }
        let Some(item) = text.trim().strip_prefix("- ").map(str::trim) else {
            continue;
        };
        if !in_deps {
            continue;
        }
        if pip_indent.is_some_and(|p| indent > p) {
            reqs.push(item.to_string());
            continue;
        }
        pip_indent = None;
        if item == "pip:" {
            pip_indent = Some(indent);
            continue;
        }
        let name_end = item
            .find(|c: char| !(c.is_ascii_alphanumeric() || "-_.".contains(c)))
            .unwrap_or(item.len());
        let (name, spec) = item.split_at(name_end);
        let lower = name.to_ascii_lowercase();
        if CONDA_ONLY.contains(&lower.as_str()) {
            left_out.push(item.to_string());
            continue;
        }
        let pypi = CONDA_TO_PYPI
            .iter()
            .find(|(c, _)| *c == lower)
            .map_or(name, |(_, p)| p);
        reqs.push(pip_name(&format!("{pypi}{}", spec.trim())));
    }
    (reqs, left_out)
}

/// An `eval_commands` line split into the locales its locale-generation steps make
/// (`sed -i '/en_US.UTF-8/s/^# //g' /etc/locale.gen && locale-gen`, `locale-gen de_DE.UTF-8`)
/// and the rest of it (`None` when nothing is left to run).
fn split_locale_steps(line: &str) -> (Vec<String>, Option<String>) {
    let mut locales = Vec::new();
    let mut rest = Vec::new();
    for step in line.split("&&").map(str::trim).filter(|s| !s.is_empty()) {
        let words = shlex::split(step).unwrap_or_default();
        match words.first().map(String::as_str) {
            Some("locale-gen") => {
                locales.extend(words[1..].iter().filter(|w| !w.starts_with('-')).cloned())
            }
            Some("sed") if words.last().is_some_and(|w| w == "/etc/locale.gen") => {
                // `/NAME/s/^# //g` uncomments NAME's line.
                locales.extend(
                    words
                        .iter()
                        .filter_map(|w| w.strip_prefix('/')?.split_once("/s/"))
                        .map(|(name, _)| name.to_string()),
                )
            }
            _ => rest.push(step),
        }
    }
    let rest = (!rest.is_empty()).then(|| rest.join(" && "));
    (locales, rest)
}

/// `3.9` → (3, 9); `None` for anything else (`3`, `pypy`).
fn major_minor(python: &str) -> Option<(u32, u32)> {
    let (major, minor) = python.trim().split_once('.')?;
    Some((major.parse().ok()?, minor.split('.').next()?.parse().ok()?))
}

/// `test_directives` style of SWT-bench: the files of the test patch's `diff --git` headers
/// that are not data files, as module names for django.
pub const SWT_BENCH_DIRECTIVES: &str = "swt-bench";
/// `log_parser` of an SWT-bench spec: the parser SWT-bench picks for the repository.
pub const SWT_BENCH_PARSER: &str = "swt-bench";

/// One repository version's install spec.
#[derive(Debug, Clone, Deserialize)]
pub struct InstallSpec {
    /// Python major.minor.
    pub python: String,
    /// Conda package names (space-separated), `requirements.txt` or `environment.yml`.
    #[serde(default)]
    pub packages: String,
    /// pip requirement specifiers installed after the packages.
    #[serde(default)]
    pub pip_packages: Vec<String>,
    /// Commands run in the repository before `install`.
    #[serde(default)]
    pub pre_install: Vec<String>,
    /// The install command.
    #[serde(default)]
    pub install: String,
    /// Commands run before each test command.
    #[serde(default)]
    pub eval_commands: Vec<String>,
}

/// Why SWT-bench's specs file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SpecsError {
    /// The file is there but cannot be read.
    #[error("cannot read {}: {error}", path.display())]
    Read {
        /// The specs file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The file is not the exported specs.
    #[error("{}: not SWT-bench's env specs: {error}", path.display())]
    Parse {
        /// The specs file.
        path: PathBuf,
        /// What is wrong.
        error: serde_json::Error,
    },
}

/// The exported specs.
#[derive(Debug, Clone, Deserialize)]
pub struct SwtBenchSpecs {
    /// repo → version → install spec.
    pub install_specs: BTreeMap<String, BTreeMap<String, InstallSpec>>,
    /// repo → version → test command.
    pub test_commands: BTreeMap<String, BTreeMap<String, String>>,
    /// repo → requirement file paths, the first that exists is used.
    #[serde(default)]
    pub requirements_paths: BTreeMap<String, Vec<String>>,
    /// repo → conda environment file paths.
    #[serde(default)]
    pub env_yml_paths: BTreeMap<String, Vec<String>>,
}

/// `name=1.2` (conda) → `name==1.2` (pip); other specifiers unchanged.
fn pip_name(conda: &str) -> String {
    match conda.split_once('=') {
        Some((name, version))
            if !version.starts_with('=') && !name.ends_with(['<', '>', '!', '~']) =>
        {
            format!("{name}=={version}")
        }
        _ => conda.to_string(),
    }
}

impl SwtBenchSpecs {
    /// The specs file of a datasets directory.
    pub fn path(datasets_dir: &Path) -> PathBuf {
        datasets_dir.join(SPECS_FILE)
    }

    /// Reads the specs of a datasets directory; `None` when the file is not there.
    pub fn load(datasets_dir: &Path) -> Result<Option<SwtBenchSpecs>, SpecsError> {
        let path = SwtBenchSpecs::path(datasets_dir);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|error| SpecsError::Parse { path, error }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(SpecsError::Read { path, error }),
        }
    }

    /// The environment of `repo` at `version`, if SWT-bench has one.
    pub fn env(&self, repo: &str, version: &str) -> Option<EnvSpec> {
        let spec = self.install_specs.get(repo)?.get(version)?;
        let test_cmd = self.test_commands.get(repo)?.get(version)?.clone();
        let mut env = EnvSpec {
            python: spec.python.clone(),
            packages: Vec::new(),
            pre_install: spec.pre_install.clone(),
            install: spec.install.clone(),
            test_cmd,
            log_parser: SWT_BENCH_PARSER.into(),
            test_directives: SWT_BENCH_DIRECTIVES.into(),
            pip_packages: spec.pip_packages.clone(),
            requirements_files: Vec::new(),
            eval_commands: Vec::new(),
            env_vars: BTreeMap::from([(
                // Mirrors carry no release tags; setuptools_scm would make up a version.
                "SETUPTOOLS_SCM_PRETEND_VERSION".to_string(),
                version.to_string(),
            )]),
            left_out: Vec::new(),
            packages_as_of: None,
            fresh_build_tools: false,
            conda_packages_as_of: None,
            locales: Vec::new(),
            build_constraints: Vec::new(),
            conda_env_files: Vec::new(),
            dated_pip_for_install: false,
            system_packages: BUILD_SYSTEM_PACKAGES
                .iter()
                .find(|(r, _)| *r == repo)
                .map(|(_, p)| p.iter().map(|p| p.to_string()).collect())
                .unwrap_or_default(),
        };
        if let Some(fix) = SOURCE_BUILD_FIXES
            .iter()
            .find(|f| f.repo == repo && f.version == version)
        {
            env.build_constraints = fix
                .build_constraints
                .iter()
                .map(|c| c.to_string())
                .collect();
            env.system_packages
                .extend(fix.system_packages.iter().map(|p| p.to_string()));
            env.left_out.push(fix.why.to_string());
        }
        if repo == "matplotlib/matplotlib"
            && let Some(v) = major_minor(version)
            && v >= MATPLOTLIB_SYSTEM_LIBRARIES
        {
            let file = matplotlib_libs_file(v);
            env.pre_install.insert(
                0,
                format!(
                    "printf '[libs]\\nsystem_freetype = True\\nsystem_qhull = True\\n' > {file}"
                ),
            );
            env.system_packages
                .extend(["libfreetype-dev", "libqhull-dev", "pkg-config"].map(String::from));
            env.left_out.push(format!(
                "FreeType 2.6.1 and Qhull, which matplotlib's build downloads (from hosts this machine may not reach): it is built against the system's FreeType and Qhull instead (`system_freetype`/`system_qhull` in an untracked {file}). Text renders differently with another FreeType, so image-comparison tests with text in their images can fail here and pass in SWT-bench's image (matplotlib's own test suite pins FreeType 2.6.1 for them)"
            ));
        }
        if repo == "astropy/astropy"
            && major_minor(version).is_some_and(|v| v < ASTROPY_HELPERS_BEFORE)
        {
            env.pre_install.insert(
                0,
                format!("python - <<'REPROBENCH_PY'\n{ASTROPY_HELPERS_PY}REPROBENCH_PY"),
            );
            env.left_out.push(
                "the astropy_helpers git submodule (on GitHub): the release of astropy-helpers on PyPI whose ah_bootstrap.py is the commit's (the newest of them) is unpacked in its place".into(),
            );
        }
        // Locale generation needs root and changes the system: the executor provides the
        // locales instead (docker's base image has them all, as SWT-bench's has locales-all).
        for line in &spec.eval_commands {
            let (locales, rest) = split_locale_steps(line);
            for l in locales {
                if !env.locales.contains(&l) {
                    env.locales.push(l);
                }
            }
            env.eval_commands.extend(rest);
        }
        match major_minor(&spec.python) {
            Some(v) if v < FIRST_PYTHON_WITH_DATE_CAP => {
                // SWT-bench's conda environments come with the newest pip, setuptools and wheel
                // built for their Python; a venv of 3.6 has pip 18 (no `--no-use-pep517`).
                env.fresh_build_tools = true;
            }
            _ => env.packages_as_of = Some(SPECS_AS_OF.into()),
        }
        if env.packages_as_of.is_some()
            && let Some(option) = PIP_OPTIONS_GONE_IN_26.iter().find(|o| {
                env.pre_install
                    .iter()
                    .chain(std::iter::once(&env.install))
                    .any(|c| c.split_whitespace().any(|w| w == **o))
            })
        {
            env.dated_pip_for_install = true;
            env.left_out.push(format!(
                "the date cap's pip for the install commands: they pass `{option}`, which pip 26 (the first with --uploaded-prior-to) no longer has, so the environment starts with the setuptools and wheel of {} and, once the packages are installed, pip goes back to its newest release of that date, as in SWT-bench's conda environment; whatever the install commands still resolve is not date-capped",
                &SPECS_AS_OF[..10]
            ));
        }
        // tox would build its own virtualenv from PyPI, and executions have no network: with
        // tox-current-env among the spec's packages, the tests run in the instance's environment.
        let tox = env.test_cmd.trim_start();
        if let Some(rest) = tox.strip_prefix("tox ")
            && !rest.contains("--current-env")
            && env
                .pip_packages
                .iter()
                .any(|p| p.starts_with("tox-current-env"))
        {
            env.test_cmd = format!("tox --current-env {}", rest.trim_start());
            env.left_out.push(
                "tox's own virtualenv, which SWT-bench's containers build from PyPI at test time: executions have no network, so the tests run under `tox --current-env` in the instance's environment (the spec's packages, tox-current-env among them)".into(),
            );
        }
        match spec.packages.trim() {
            "requirements.txt" => {
                env.requirements_files = self
                    .requirements_paths
                    .get(repo)
                    .cloned()
                    .unwrap_or_default();
            }
            "environment.yml" => {
                let files = self.env_yml_paths.get(repo).cloned().unwrap_or_default();
                if CONDA_ENV_BY_PIP.contains(&repo) {
                    env.conda_env_files = files.clone();
                    env.left_out.push(format!(
                        "conda, which installs the environment file ({}) at the environment-setup commit: its dependencies are installed with pip under their PyPI names instead, from PyPI's wheels and sources, not conda-forge's builds",
                        files.join(" or ")
                    ));
                } else {
                    env.left_out.push(format!(
                        "the conda environment file ({}) at the environment-setup commit: conda is not used, only the spec's pip packages are installed",
                        files.join(" or ")
                    ));
                }
            }
            names => {
                // SWE-bench puts this string into a shell command (`conda create … {packages}`),
                // so quotes group and are removed as a shell does ('numpy==1.19.2' is numpy==1.19.2).
                let words = shlex::split(names)
                    .unwrap_or_else(|| names.split_whitespace().map(str::to_string).collect());
                env.packages = words.iter().map(|w| pip_name(w)).collect();
                // Conda installs these; for an older Python as its channels last had them.
                if env.packages_as_of.is_none() {
                    let eol = major_minor(&spec.python).and_then(|v| {
                        PYTHON_END_OF_LIFE
                            .iter()
                            .find(|(p, _)| *p == v)
                            .map(|(_, d)| *d)
                    });
                    env.conda_packages_as_of = Some(eol.unwrap_or(SPECS_AS_OF).to_string());
                }
            }
        }
        if env.packages_as_of.is_none() {
            let conda = match &env.conda_packages_as_of {
                Some(date) if date == SPECS_AS_OF => {
                    "; the spec's conda packages are capped at the specs' date".to_string()
                }
                Some(date) => format!(
                    "; the spec's conda packages are capped at {} instead, the end of life of Python {}",
                    &date[..10.min(date.len())],
                    spec.python.trim()
                ),
                None => String::new(),
            };
            env.left_out.insert(
                0,
                format!(
                    "pip packages without a pin resolve as of today, not as of SWT-bench's specs ({}): pip's date cap (--uploaded-prior-to) needs pip 26, which needs Python {}.{}+{conda}",
                    &SPECS_AS_OF[..10],
                    FIRST_PYTHON_WITH_DATE_CAP.0,
                    FIRST_PYTHON_WITH_DATE_CAP.1
                ),
            );
        }
        Some(env)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specs() -> SwtBenchSpecs {
        serde_json::from_str(
            r#"{
              "install_specs": {
                "psf/requests": {"2.0": {"python": "3.9", "packages": "pytest numpy=1.19", "install": "python -m pip install ."},
                                 "0.14": {"python": "3.6", "packages": "pytest", "install": "python -m pip install ."}},
                "pallets/flask": {"2.3": {"python": "3.11", "packages": "requirements.txt", "pip_packages": ["Werkzeug==2.3.7"], "install": "python -m pip install -e ."}},
                "pydata/xarray": {"0.12": {"python": "3.10", "packages": "environment.yml", "pip_packages": ["numpy==1.23.0"]}}
              },
              "test_commands": {
                "psf/requests": {"2.0": "pytest -rA", "0.14": "pytest -rA"},
                "pallets/flask": {"2.3": "pytest -rA"},
                "pydata/xarray": {"0.12": "pytest -rA"}
              },
              "requirements_paths": {"pallets/flask": ["requirements/dev.txt"]},
              "env_yml_paths": {"pydata/xarray": ["ci/requirements/environment.yml"]}
            }"#,
        )
        .unwrap()
    }

    #[test]
    fn tox_runs_in_the_current_env_when_the_spec_brings_tox_current_env() {
        let specs: SwtBenchSpecs = serde_json::from_str(
            r#"{
              "install_specs": {"sphinx-doc/sphinx": {"5.0": {"python": "3.9", "pip_packages": ["tox==4.16.0", "tox-current-env==0.0.11"], "install": "python -m pip install -e .[test]"}},
                                "x/y": {"1.0": {"python": "3.9", "pip_packages": ["tox==4.16.0"]}}},
              "test_commands": {"sphinx-doc/sphinx": {"5.0": "tox -epy39 -v --"}, "x/y": {"1.0": "tox -epy39 -v --"}}
            }"#,
        )
        .unwrap();
        let sphinx = specs.env("sphinx-doc/sphinx", "5.0").unwrap();
        assert_eq!(sphinx.test_cmd, "tox --current-env -epy39 -v --");
        assert!(
            sphinx.left_out[0].contains("--current-env"),
            "{:?}",
            sphinx.left_out
        );
        let plain = specs.env("x/y", "1.0").unwrap();
        assert_eq!(plain.test_cmd, "tox -epy39 -v --");
        assert!(plain.left_out.is_empty());
    }

    #[test]
    fn specs_read_as_environments() {
        let s = specs();
        let r = s.env("psf/requests", "2.0").unwrap();
        assert_eq!(r.python, "3.9");
        assert_eq!(r.packages_as_of.as_deref(), Some(SPECS_AS_OF));
        assert_eq!(r.packages, vec!["pytest", "numpy==1.19"]);
        assert_eq!(r.test_cmd, "pytest -rA");
        assert_eq!(r.test_directives, SWT_BENCH_DIRECTIVES);
        assert_eq!(r.env_vars["SETUPTOOLS_SCM_PRETEND_VERSION"], "2.0");
        let f = s.env("pallets/flask", "2.3").unwrap();
        assert_eq!(f.requirements_files, vec!["requirements/dev.txt"]);
        assert_eq!(f.pip_packages, vec!["Werkzeug==2.3.7"]);
        assert!(f.packages.is_empty());
        let x = s.env("pydata/xarray", "0.12").unwrap();
        assert!(
            x.left_out[0].contains("environment.yml"),
            "{:?}",
            x.left_out
        );
        let old = s.env("psf/requests", "0.14").unwrap();
        assert_eq!(old.packages_as_of, None, "no pip 26 for Python 3.6");
        assert!(old.fresh_build_tools, "3.6's own pip 18 is too old");
        // Its conda packages as of Python 3.6's end of life; 3.9+ caps every pip run instead.
        assert_eq!(
            old.conda_packages_as_of.as_deref(),
            Some("2021-12-23T00:00:00Z")
        );
        assert_eq!(
            s.env("psf/requests", "2.0").unwrap().conda_packages_as_of,
            None
        );
        assert!(!s.env("psf/requests", "2.0").unwrap().fresh_build_tools);
        assert!(
            old.left_out[0].contains("as of today")
                && old.left_out[0].contains("capped at 2021-12-23"),
            "{:?}",
            old.left_out
        );
        assert_eq!(major_minor("3.10"), Some((3, 10)));
        assert_eq!(major_minor("3"), None);
        assert!(s.env("psf/requests", "9.9").is_none());
        assert!(s.env("me/mine", "2.0").is_none());
    }

    #[test]
    fn locale_generation_is_read_out_of_eval_commands() {
        let (l, rest) =
            split_locale_steps("sed -i '/en_US.UTF-8/s/^# //g' /etc/locale.gen && locale-gen");
        assert_eq!((l, rest), (vec!["en_US.UTF-8".to_string()], None));
        let (l, rest) = split_locale_steps("locale-gen de_DE.UTF-8 && echo hi");
        assert_eq!(l, vec!["de_DE.UTF-8"]);
        assert_eq!(rest.as_deref(), Some("echo hi"));
        let (l, rest) = split_locale_steps("export LANG=en_US.UTF-8");
        assert!(l.is_empty());
        assert_eq!(rest.as_deref(), Some("export LANG=en_US.UTF-8"));
        let (l, rest) = split_locale_steps("sed -i 's/a/b/' setup.cfg");
        assert!(l.is_empty());
        assert_eq!(rest.as_deref(), Some("sed -i 's/a/b/' setup.cfg"));
    }

    #[test]
    fn django_3_needs_its_locale_and_a_compiler() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../datasets");
        let s = SwtBenchSpecs::load(&dir).unwrap().expect("shipped");
        let env = s.env("django/django", "3.0").unwrap();
        assert_eq!(env.locales, vec!["en_US.UTF-8"]);
        assert_eq!(
            env.eval_commands,
            [
                "export LANG=en_US.UTF-8",
                "export LANGUAGE=en_US:en",
                "export LC_ALL=en_US.UTF-8"
            ]
        );
        assert_eq!(env.system_packages, ["gcc", "libc6-dev"]);
        assert_eq!(env.requirements_files, ["tests/requirements/py3.txt"]);
        let env = s.env("django/django", "4.1").unwrap();
        assert!(env.locales.is_empty() && env.eval_commands.is_empty());
        assert!(
            s.env("psf/requests", "2.10")
                .unwrap()
                .system_packages
                .is_empty()
        );
    }

    #[test]
    fn matplotlib_builds_against_the_systems_freetype_and_qhull() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../datasets");
        let s = SwtBenchSpecs::load(&dir).unwrap().expect("shipped");
        let env = s.env("matplotlib/matplotlib", "3.5").unwrap();
        assert!(
            env.pre_install[0].ends_with("> mplsetup.cfg"),
            "{:?}",
            env.pre_install
        );
        assert!(
            env.pre_install[1].contains("apt-get"),
            "the spec's own steps follow"
        );
        assert!(env.system_packages.iter().any(|p| p == "libqhull-dev"));
        assert!(env.left_out.iter().any(|l| l.contains("FreeType 2.6.1")));
        let env = s.env("matplotlib/matplotlib", "3.3").unwrap();
        assert!(env.pre_install[0].ends_with("> setup.cfg"));
        let env = s.env("matplotlib/matplotlib", "3.1").unwrap();
        assert!(!env.pre_install[0].contains("system_freetype"));
    }

    #[test]
    fn astropy_1_3_gets_its_helpers_from_pypi() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../datasets");
        let s = SwtBenchSpecs::load(&dir).unwrap().expect("shipped");
        let env = s.env("astropy/astropy", "1.3").unwrap();
        assert!(env.pre_install[0].starts_with("python - <<'REPROBENCH_PY'\n"));
        assert!(env.pre_install[0].ends_with("\nREPROBENCH_PY"));
        assert!(
            !env.pre_install[0].contains("&&"),
            "one step for the apt reader"
        );
        assert!(env.left_out.iter().any(|l| l.contains("astropy_helpers")));
        let env = s.env("astropy/astropy", "5.1").unwrap();
        assert!(env.pre_install.iter().all(|c| !c.contains("REPROBENCH_PY")));
    }

    #[test]
    fn a_conda_environment_file_reads_as_pip_requirements() {
        let yml = "name: mpl-dev\nchannels:\n  - conda-forge\ndependencies:\n  - cairocffi\n  - numpy>=1.19\n  - pyqt\n  - python=3.8\n  - setuptools_scm\n  - wxpython\n  # docs\n  - pip\n  - pip:\n      - mpl-sphinx-theme\n      - pikepdf\n  - pytest!=4.6.0,!=5.4.0  # testing\n  - gtk4\n  - nbconvert[execute]!=6.0.0\n  - scipy=1.5\n";
        let (reqs, left_out) = conda_env_as_requirements(yml);
        assert_eq!(
            reqs,
            [
                "cairocffi",
                "numpy>=1.19",
                "PyQt5",
                "setuptools_scm",
                "mpl-sphinx-theme",
                "pikepdf",
                "pytest!=4.6.0,!=5.4.0",
                "nbconvert[execute]!=6.0.0",
                "scipy==1.5"
            ]
        );
        assert_eq!(left_out, ["python=3.8", "wxpython", "pip", "gtk4"]);
    }

    #[test]
    fn the_shipped_specs_parse_and_cover_the_slices_repositories() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../datasets");
        let s = SwtBenchSpecs::load(&dir).unwrap().expect("shipped");
        for (repo, version) in [
            ("psf/requests", "2.10"),
            ("pallets/flask", "2.3"),
            ("pytest-dev/pytest", "5.4"),
            ("sympy/sympy", "1.1"),
        ] {
            assert!(s.env(repo, version).is_some(), "{repo} {version}");
        }
        assert_eq!(pip_name("a>=1"), "a>=1");
        assert_eq!(pip_name("a==1"), "a==1");
        // scikit-learn 1.3's packages are shell-quoted in SWE-bench's specs.
        let env = s.env("scikit-learn/scikit-learn", "1.3").unwrap();
        assert_eq!(
            &env.packages[..5],
            [
                "numpy==1.19.2",
                "scipy==1.5.2",
                "cython==3.0.10",
                "pytest",
                "pandas<2.0.0"
            ]
        );
        assert!(env.packages.iter().all(|p| !p.contains(['\'', '"'])));
        assert_eq!(env.build_constraints, ["cython<3", "setuptools<60"]);
        assert!(env.system_packages.iter().any(|p| p == "gfortran"));
        assert!(env.left_out.iter().any(|l| l.contains("numpy 1.19.2")));
        let older = s.env("scikit-learn/scikit-learn", "1.4").unwrap();
        assert!(older.build_constraints.is_empty());
        assert!(!older.system_packages.iter().any(|p| p == "gfortran"));
        // Its install command passes --no-use-pep517 (gone in pip 26): the pip of the date installs.
        assert!(env.install.contains("--no-use-pep517"));
        assert!(env.dated_pip_for_install && older.dated_pip_for_install);
        assert!(env.left_out.iter().any(|l| l.contains("--no-use-pep517")));
        let django = s.env("django/django", "4.1").unwrap();
        assert!(django.packages_as_of.is_some() && !django.dated_pip_for_install);
    }
}
