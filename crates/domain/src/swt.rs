//! The SWT track's data: instances in the SWE-bench/SWT-bench schema, environment specs,
//! predictions, and their loaders (JSON, JSONL). Pure apart from reading the given files.

use crate::sweep::{BackboneSpec, Budget};
use serde::{Deserialize, Deserializer, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One SWT-bench instance (SWE-bench row).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SwtInstance {
    /// `owner__name-NUMBER`.
    pub instance_id: String,
    /// `owner/name`.
    pub repo: String,
    /// Commit the instance starts from.
    pub base_commit: String,
    /// Golden code patch (the fix).
    pub patch: String,
    /// Golden test patch.
    pub test_patch: String,
    /// The issue text.
    pub problem_statement: String,
    /// Hints from the issue thread.
    #[serde(default)]
    pub hints_text: String,
    /// Creation date.
    #[serde(default)]
    pub created_at: String,
    /// Version key into the environment map.
    #[serde(default)]
    pub version: String,
    /// Tests that fail before and pass after the golden patch.
    #[serde(rename = "FAIL_TO_PASS", default, deserialize_with = "string_list")]
    pub fail_to_pass: Vec<String>,
    /// Tests that pass before and after.
    #[serde(rename = "PASS_TO_PASS", default, deserialize_with = "string_list")]
    pub pass_to_pass: Vec<String>,
    /// Commit whose environment the instance uses.
    #[serde(default, deserialize_with = "maybe_json_string")]
    pub environment_setup_commit: String,
    /// An environment given inline with the row (overrides the dataset's map).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<EnvSpec>,
}

/// How to build and test a repository at a version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnvSpec {
    /// Python major.minor.
    #[serde(default = "default_python")]
    pub python: String,
    /// pip requirement specifiers.
    #[serde(default)]
    pub packages: Vec<String>,
    /// Shell commands run in the repository before `install`.
    #[serde(default)]
    pub pre_install: Vec<String>,
    /// Shell command installing the repository ("" for none).
    #[serde(default)]
    pub install: String,
    /// Test command; test directives are appended.
    pub test_cmd: String,
    /// Log parser name (`pytest`, `unittest`, or a per-repo parser).
    #[serde(default = "default_parser")]
    pub log_parser: String,
    /// How test files are named on the command line: `paths` (tests/test_x.py), `modules`
    /// (tests.test_x), or `swt-bench` (SWT-bench's: every file of the test patch but data files,
    /// django's as modules).
    #[serde(default = "default_directives")]
    pub test_directives: String,
    /// pip requirement specifiers installed after `packages` (SWT-bench's `pip_packages`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pip_packages: Vec<String>,
    /// Requirement files of the repository at the instance's environment-setup commit, the first
    /// that exists installed with its `-r` includes (SWT-bench's `packages: requirements.txt`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requirements_files: Vec<String>,
    /// Shell lines run before each test command (SWT-bench's `eval_commands`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub eval_commands: Vec<String>,
    /// Environment variables of the install and test commands.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env_vars: BTreeMap<String, String>,
    /// Parts of the upstream spec this environment does not reproduce, in words (reported with
    /// every result of the instance).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<String>,
    /// pip considers only files uploaded before this instant (ISO 8601, e.g.
    /// `2025-02-28T00:00:00Z`), so requirements without a pin resolve as they did then; through
    /// pip's `--uploaded-prior-to` (pip 26+, Python 3.9+).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packages_as_of: Option<String>,
    /// The environment starts from the newest pip, setuptools and wheel for its Python, as a
    /// new conda environment does, instead of the ones its Python shipped with.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fresh_build_tools: bool,
    /// `packages` (conda's in SWT-bench) resolve as they did at this instant, on the host, for
    /// this Python (its own pip is too old to cap dates), and are installed as pins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conda_packages_as_of: Option<String>,
    /// Locales the executions need (`en_US.UTF-8`): SWT-bench's `eval_commands` generate them
    /// with `locale-gen` as root, which an execution is not, so the executor provides them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub locales: Vec<String>,
    /// Debian packages the environment's build needs that SWT-bench's base image has (a C
    /// compiler for extensions built from source): the docker executor's base image has them,
    /// the process executor checks that the host has them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub system_packages: Vec<String>,
    /// pip constraints for the isolated build environments of packages built from source
    /// (pip's `--build-constraint`, pip 25.3+), not for what is installed: `cython<3` builds
    /// numpy 1.19.2 the way conda-forge's binary was built.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub build_constraints: Vec<String>,
    /// Conda environment files of the repository at the instance's environment-setup commit, the
    /// first that exists read and its dependencies installed with pip under their PyPI names
    /// (see `swt_bench::conda_env_as_requirements`), before the pip pins.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conda_env_files: Vec<String>,
    /// The environment starts with the setuptools and wheel of `packages_as_of` and, once its
    /// packages are installed (date-capped by pip 26), goes back to the newest pip of that date:
    /// a conda environment of the date, as SWT-bench's was, for install commands that pass
    /// options pip 26 no longer has (see `swt_bench::PIP_OPTIONS_GONE_IN_26`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dated_pip_for_install: bool,
}

fn default_python() -> String {
    "3.11".into()
}
fn default_parser() -> String {
    "pytest".into()
}
fn default_directives() -> String {
    "paths".into()
}

impl EnvSpec {
    /// Content hash of the environment layer (Python and packages): the scheduler's affinity key.
    pub fn env_key(&self) -> String {
        let mut packages = self.packages.clone();
        if !self.pip_packages.is_empty() || !self.requirements_files.is_empty() {
            // Kept apart so that specs without them hash as they always did.
            packages.push("--pip-packages".into());
            packages.extend(self.pip_packages.iter().cloned());
            packages.push("--requirements".into());
            packages.extend(self.requirements_files.iter().cloned());
        }
        if let Some(date) = &self.packages_as_of {
            packages.push(format!("--packages-as-of={date}"));
        }
        if self.fresh_build_tools {
            packages.push("--fresh-build-tools".into());
        }
        if let Some(date) = &self.conda_packages_as_of {
            packages.push(format!("--conda-packages-as-of={date}"));
        }
        if !self.locales.is_empty() {
            packages.push(format!("--locales={}", self.locales.join(",")));
        }
        if !self.conda_env_files.is_empty() {
            packages.push(format!("--conda-env={}", self.conda_env_files.join(",")));
        }
        if !self.build_constraints.is_empty() {
            packages.push(format!(
                "--build-constraints={}",
                self.build_constraints.join(",")
            ));
        }
        if self.dated_pip_for_install {
            packages.push("--dated-build-tools-and-pip".into());
        }
        env_key(&self.python, &packages)
    }

    /// The commands this environment runs through a shell while it is built and before tests
    /// (`pre_install`, `install`, `eval_commands`), as one comparable string: what a node compares
    /// with reprobench's own environments before running them (see [`shipped_env_commands`]).
    pub fn commands_fingerprint(&self) -> String {
        serde_json::json!([self.pre_install, self.install, self.eval_commands]).to_string()
    }

    /// Whether the environment runs any command of its own through a shell.
    pub fn has_commands(&self) -> bool {
        !self.pre_install.is_empty()
            || !self.install.trim().is_empty()
            || !self.eval_commands.is_empty()
    }
}

/// The command fingerprints of reprobench's own environments among dataset files given as
/// (path under the datasets directory, contents): SWT-bench's specs
/// (`swt-bench/env-specs.json`) and every dataset's `env.json`. Files that do not parse add
/// nothing. Pure.
pub fn shipped_env_commands<'a>(
    files: impl IntoIterator<Item = (&'a str, &'a [u8])>,
) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for (path, bytes) in files {
        let path = path.replace('\\', "/");
        if path == crate::swt_bench::SPECS_FILE {
            if let Ok(specs) = serde_json::from_slice::<crate::swt_bench::SwtBenchSpecs>(bytes) {
                for (repo, versions) in &specs.install_specs {
                    out.extend(
                        versions
                            .keys()
                            .filter_map(|version| specs.env(repo, version))
                            .map(|env| env.commands_fingerprint()),
                    );
                }
            }
        } else if path.ends_with("/env.json")
            && let Ok(map) = serde_json::from_slice::<EnvMap>(bytes)
        {
            out.extend(
                map.values()
                    .flat_map(|v| v.values())
                    .map(EnvSpec::commands_fingerprint),
            );
        }
    }
    out
}

/// Content hash of an environment (Python version and packages), shared by the scheduler's
/// affinity key and the sandboxes' image tags.
pub fn env_key(python: &str, packages: &[String]) -> String {
    let mut h = Fnv::default();
    h.add("env-v1");
    h.add(python);
    for p in packages {
        h.add(p);
    }
    format!("{:016x}", h.0)
}

/// Environment map: repo → version → spec.
pub type EnvMap = BTreeMap<String, BTreeMap<String, EnvSpec>>;

/// One prediction (SWT-bench compatible).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    /// Instance it answers.
    pub instance_id: String,
    /// Model or system name.
    #[serde(default)]
    pub model_name_or_path: String,
    /// The generated test as a diff; `None` when the system produced nothing.
    #[serde(default)]
    pub model_patch: Option<String>,
}

/// FNV-1a over length-prefixed strings (stable across Rust versions, unlike `DefaultHasher`).
#[derive(Debug)]
pub struct Fnv(pub u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    /// Adds a string (length-prefixed, so ("ab","c") and ("a","bc") differ).
    pub fn add(&mut self, s: &str) {
        self.add_bytes(s.as_bytes());
    }

    /// Adds bytes (length-prefixed, as [`Fnv::add`]).
    pub fn add_bytes(&mut self, bytes: &[u8]) {
        for b in (bytes.len() as u64).to_le_bytes().iter().chain(bytes) {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// Accepts a list of strings or a JSON-encoded string holding one (as in the Hugging Face rows).
fn string_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        List(Vec<String>),
        Text(String),
        Null(()),
    }
    match Either::deserialize(d)? {
        Either::List(v) => Ok(v),
        Either::Null(()) => Ok(Vec::new()),
        Either::Text(s) if s.trim().is_empty() => Ok(Vec::new()),
        Either::Text(s) => serde_json::from_str(&s).map_err(|e| {
            serde::de::Error::custom(format!(
                "expected a list of test ids (or a JSON string of one): {e}"
            ))
        }),
    }
}

/// Accepts a string, or a JSON-encoded string (`"\"abc\""`), or null.
fn maybe_json_string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s: Option<String> = Option::deserialize(d)?;
    let s = s.unwrap_or_default();
    if s.starts_with('"')
        && let Ok(inner) = serde_json::from_str::<String>(&s)
    {
        return Ok(inner);
    }
    Ok(s)
}

/// A row that could not be used, with where it is and what is wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct RowError {
    /// File and line (1-based) or index.
    pub location: String,
    /// The instance id, when it could be read.
    pub instance_id: Option<String>,
    /// What is wrong and what to do.
    pub message: String,
}

impl std::fmt::Display for RowError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.instance_id {
            Some(id) => write!(f, "{} ({id}): {}", self.location, self.message),
            None => write!(f, "{}: {}", self.location, self.message),
        }
    }
}

/// Rows parsed from a file: the good ones, and an error for each bad one (none is dropped silently).
#[derive(Debug, Clone, Default)]
pub struct Parsed<T> {
    /// Usable rows.
    pub rows: Vec<T>,
    /// Rejected rows.
    pub errors: Vec<RowError>,
}

/// Parses JSON (an array) or JSONL text into rows; `name` names the source in errors.
pub fn parse_rows<T: for<'de> Deserialize<'de>>(name: &str, text: &str) -> Parsed<T> {
    let mut out = Parsed {
        rows: Vec::new(),
        errors: Vec::new(),
    };
    let trimmed = text.trim_start();
    if trimmed.starts_with('[') {
        match serde_json::from_str::<Vec<serde_json::Value>>(trimmed) {
            Ok(values) => {
                for (i, v) in values.into_iter().enumerate() {
                    push_row(&mut out, format!("{name}[{i}]"), v);
                }
            }
            Err(e) => out.errors.push(RowError {
                location: name.to_string(),
                instance_id: None,
                message: format!("not a JSON array of rows: {e}; write JSONL (one object per line) or a JSON array"),
            }),
        }
        return out;
    }
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let location = format!("{name}:{}", i + 1);
        match serde_json::from_str::<serde_json::Value>(line) {
            Ok(v) => push_row(&mut out, location, v),
            Err(e) => out.errors.push(RowError {
                location,
                instance_id: None,
                message: format!("malformed JSON line ({e}); fix or delete this line"),
            }),
        }
    }
    out
}

fn push_row<T: for<'de> Deserialize<'de>>(
    out: &mut Parsed<T>,
    location: String,
    v: serde_json::Value,
) {
    let instance_id = v
        .get("instance_id")
        .and_then(|x| x.as_str())
        .map(str::to_string);
    if let Some(id) = &instance_id
        && let Err(message) = crate::ids::checked("instance_id", id)
    {
        out.errors.push(RowError {
            location,
            instance_id,
            message,
        });
        return;
    }
    match serde_json::from_value::<T>(v) {
        Ok(row) => out.rows.push(row),
        Err(e) => out.errors.push(RowError {
            location,
            instance_id,
            message: format!("row does not match the schema: {e}"),
        }),
    }
}

/// Why a dataset, its rows or its environment map could not be loaded.
// Underlying errors are in the messages, not `source()`: anyhow's `{:#}` would repeat them.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file could not be read.
    #[error("cannot read {}: {error}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// A Parquet file, and this build has no Parquet reader.
    #[cfg(not(feature = "parquet"))]
    #[error(
        "{} is Parquet, which this build does not read: build with reprobench-domain's `parquet` \
         feature (the reprobench binary has it) or convert the file to JSONL",
        path.display()
    )]
    ParquetNotBuilt {
        /// The file.
        path: PathBuf,
    },
    /// A file that is not Parquet.
    #[cfg(feature = "parquet")]
    #[error("{} is not a readable Parquet file: {error}", path.display())]
    NotParquet {
        /// The file.
        path: PathBuf,
        /// What the reader said.
        error: parquet::errors::ParquetError,
    },
    /// A Parquet file whose rows cannot be read.
    #[cfg(feature = "parquet")]
    #[error("{}: cannot read rows: {error}", path.display())]
    ParquetRows {
        /// The file.
        path: PathBuf,
        /// What the reader said.
        error: parquet::errors::ParquetError,
    },
    /// No environment spec for an instance, inline or in the map.
    #[error(
        "no environment spec for repo `{repo}` version `{version}`; add it to the dataset's env map or give the row an inline `env`"
    )]
    NoEnvSpec {
        /// The instance's repository.
        repo: String,
        /// The instance's version.
        version: String,
    },
    /// Neither a file, nor a directory, nor a dataset name with a manifest.
    #[error(
        "unknown {kind} `{name}`: no file of that name and no {}/manifest.json; `reprobench datasets list` shows the known ones",
        dir.display()
    )]
    UnknownDataset {
        /// What kind of dataset was asked for (`dataset`, `android dataset`).
        kind: String,
        /// The name or path given.
        name: String,
        /// Where its manifest would be.
        dir: PathBuf,
    },
    /// A manifest that does not parse.
    #[error("{}: not a dataset manifest: {error}", path.display())]
    BadManifest {
        /// The manifest.
        path: PathBuf,
        /// What is wrong.
        error: serde_json::Error,
    },
    /// A manifest whose rows file is not there.
    #[error(
        "dataset `{dataset}` has no rows at {} yet; {}",
        rows.display(),
        missing_rows_remedy(.dataset, *.fetchable)
    )]
    NoRows {
        /// The dataset's name.
        dataset: String,
        /// Where its rows should be.
        rows: PathBuf,
        /// Whether `datasets fetch` can get them (the manifest has a source).
        fetchable: bool,
    },
    /// An environment map that does not parse.
    #[error(
        "{}: not an environment map (repo → version → spec): {error}",
        path.display()
    )]
    BadEnvMap {
        /// The map's file.
        path: PathBuf,
        /// What is wrong.
        error: serde_json::Error,
    },
    /// An environment map given explicitly that does not exist.
    #[error("environment map {} does not exist", path.display())]
    NoEnvMap {
        /// The path given.
        path: PathBuf,
    },
    /// SWT-bench's specs could not be read.
    #[error(transparent)]
    SwtBenchSpecs(#[from] crate::swt_bench::SpecsError),
}

/// How to get the rows of a dataset that has none yet.
fn missing_rows_remedy(dataset: &str, fetchable: bool) -> String {
    if fetchable {
        format!("run `reprobench datasets fetch {dataset}`")
    } else {
        "restore it from the repository".into()
    }
}

/// Reads rows from a `.json`, `.jsonl` or `.parquet` file.
pub fn load_rows<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Parsed<T>, LoadError> {
    if path.extension().is_some_and(|e| e == "parquet") {
        return load_parquet_rows(path);
    }
    let text = std::fs::read_to_string(path).map_err(|error| LoadError::Read {
        path: path.to_path_buf(),
        error,
    })?;
    Ok(parse_rows(&path.display().to_string(), &text))
}

/// Without the `parquet` feature a Parquet file is refused with the way to read it.
#[cfg(not(feature = "parquet"))]
fn load_parquet_rows<T>(path: &Path) -> Result<Parsed<T>, LoadError> {
    Err(LoadError::ParquetNotBuilt {
        path: path.to_path_buf(),
    })
}

/// Reads rows from a Parquet file (as the Hugging Face hub serves datasets), one JSON object per row.
#[cfg(feature = "parquet")]
fn load_parquet_rows<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Parsed<T>, LoadError> {
    let file = std::fs::File::open(path).map_err(|error| LoadError::Read {
        path: path.to_path_buf(),
        error,
    })?;
    // parquet 57 panics on some malformed files (an `unwrap` in its footer decoder): such a file
    // is not readable Parquet, like any other, rather than the end of the process.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        read_parquet_rows(path, file)
    }))
    .unwrap_or_else(|panic| {
        let what = (panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(LoadError::NotParquet {
            path: path.to_path_buf(),
            error: parquet::errors::ParquetError::General(format!(
                "the Parquet reader failed: {what}"
            )),
        })
    })
}

#[cfg(feature = "parquet")]
fn read_parquet_rows<T: for<'de> Deserialize<'de>>(
    path: &Path,
    file: std::fs::File,
) -> Result<Parsed<T>, LoadError> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let reader = SerializedFileReader::new(file).map_err(|error| LoadError::NotParquet {
        path: path.to_path_buf(),
        error,
    })?;
    let rows = reader
        .get_row_iter(None)
        .map_err(|error| LoadError::ParquetRows {
            path: path.to_path_buf(),
            error,
        })?;
    let mut out = Parsed {
        rows: Vec::new(),
        errors: Vec::new(),
    };
    for (i, row) in rows.enumerate() {
        let location = format!("{}[{i}]", path.display());
        match row {
            Ok(row) => push_row(&mut out, location, row.to_json_value()),
            // The reader does not move past a broken row group: it repeats the error forever.
            Err(e) => {
                out.errors.push(RowError {
                    location,
                    instance_id: None,
                    message: format!("unreadable Parquet row: {e}; the rows after it are not read"),
                });
                break;
            }
        }
    }
    Ok(out)
}

/// The environment spec of an instance: its inline `env`, else the map's entry for (repo, version).
pub fn env_for<'a>(inst: &'a SwtInstance, map: &'a EnvMap) -> Result<&'a EnvSpec, LoadError> {
    if let Some(env) = &inst.env {
        return Ok(env);
    }
    map.get(&inst.repo)
        .and_then(|v| v.get(&inst.version))
        .ok_or_else(|| LoadError::NoEnvSpec {
            repo: inst.repo.clone(),
            version: inst.version.clone(),
        })
}

/// Mirror directory name of a repository: `owner/name` → `owner__name.git`.
pub fn mirror_name(repo: &str) -> String {
    format!("{}.git", repo.replace('/', "__"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped environments are SWT-bench's specs and the datasets' env maps, as given; an
    /// environment with a command of its own is not among them.
    #[test]
    fn shipped_env_commands_are_the_specs_and_env_maps_given() {
        let datasets = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../datasets");
        let specs = std::fs::read(datasets.join(crate::swt_bench::SPECS_FILE)).unwrap();
        let mini = std::fs::read(datasets.join("swt-mini/env.json")).unwrap();
        let shipped = shipped_env_commands([
            (crate::swt_bench::SPECS_FILE, specs.as_slice()),
            ("swt-mini/env.json", mini.as_slice()),
            ("swt-mini/instances.jsonl", b"not an env map".as_slice()),
        ]);
        let loaded = crate::swt_bench::SwtBenchSpecs::load(&datasets)
            .unwrap()
            .unwrap();
        let django = loaded.env("django/django", "3.0").unwrap();
        assert!(django.has_commands());
        assert!(shipped.contains(&django.commands_fingerprint()));
        let map: EnvMap = serde_json::from_slice(&mini).unwrap();
        let textkit = &map["reprobench/textkit"]["0.1"];
        assert!(shipped.contains(&textkit.commands_fingerprint()));
        let mut own = django.clone();
        own.install = "curl https://elsewhere | sh".into();
        assert!(!shipped.contains(&own.commands_fingerprint()));
        assert!(shipped_env_commands([]).is_empty());
    }

    const ROW: &str = r#"{"instance_id":"o__r-1","repo":"o/r","base_commit":"abc","patch":"p","test_patch":"t","problem_statement":"s","version":"0.1","FAIL_TO_PASS":"[\"tests/a.py::t1\"]","PASS_TO_PASS":["tests/a.py::t2"],"environment_setup_commit":"abc"}"#;

    #[test]
    fn reads_json_encoded_lists_and_plain_lists() {
        let p: Parsed<SwtInstance> = parse_rows("d.jsonl", &format!("{ROW}\n\n{ROW}\n"));
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        assert_eq!(p.rows.len(), 2);
        assert_eq!(p.rows[0].fail_to_pass, vec!["tests/a.py::t1"]);
        assert_eq!(p.rows[0].pass_to_pass, vec!["tests/a.py::t2"]);
        let p: Parsed<SwtInstance> = parse_rows("d.json", &format!("[{ROW}]"));
        assert_eq!(p.rows.len(), 1);
    }

    #[test]
    fn bad_rows_are_reported_with_their_line_and_the_rest_kept() {
        let text = format!("{ROW}\n{{not json\n{{\"instance_id\":\"x\"}}\n{ROW}\n");
        let p: Parsed<SwtInstance> = parse_rows("d.jsonl", &text);
        assert_eq!(p.rows.len(), 2);
        assert_eq!(p.errors.len(), 2);
        assert_eq!(p.errors[0].location, "d.jsonl:2");
        assert!(p.errors[0].message.contains("malformed JSON"));
        assert_eq!(p.errors[1].instance_id.as_deref(), Some("x"));
    }

    #[test]
    fn env_lookup_and_keys() {
        let p: Parsed<SwtInstance> = parse_rows("d", ROW);
        let inst = &p.rows[0];
        let spec: EnvSpec = serde_json::from_str(r#"{"test_cmd":"python -m pytest"}"#).unwrap();
        assert_eq!(
            (spec.python.as_str(), spec.log_parser.as_str()),
            ("3.11", "pytest")
        );
        let mut map = EnvMap::new();
        assert!(
            env_for(inst, &map)
                .unwrap_err()
                .to_string()
                .contains("`o/r` version `0.1`")
        );
        map.entry("o/r".into())
            .or_default()
            .insert("0.1".into(), spec.clone());
        assert_eq!(env_for(inst, &map).unwrap(), &spec);
        let mut other = spec.clone();
        other.packages.push("numpy".into());
        assert_ne!(spec.env_key(), other.env_key());
        assert_eq!(mirror_name("django/django"), "django__django.git");
    }

    #[test]
    #[cfg(feature = "parquet")]
    fn reads_parquet_rows() {
        use parquet::data_type::{ByteArray, ByteArrayType};
        use parquet::file::properties::WriterProperties;
        use parquet::file::writer::SerializedFileWriter;
        use parquet::schema::parser::parse_message_type;
        use std::sync::Arc;
        let columns = [
            ("instance_id", ["o__r-1", "o__r-2"]),
            ("repo", ["o/r", "o/r"]),
            ("base_commit", ["abc", "abc"]),
            ("patch", ["p", "p"]),
            ("test_patch", ["t", "t"]),
            ("problem_statement", ["s", "s"]),
            ("version", ["0.1", "0.1"]),
            ("FAIL_TO_PASS", ["[\"tests/a.py::t1\"]", "[]"]),
        ];
        let schema = format!(
            "message swt {{ {} }}",
            columns
                .iter()
                .map(|(n, _)| format!("REQUIRED BYTE_ARRAY {n} (UTF8);"))
                .collect::<String>()
        );
        let dir = std::env::temp_dir().join(format!("reprobench-parquet-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("rows.parquet");
        let file = std::fs::File::create(&path).unwrap();
        let schema = Arc::new(parse_message_type(&schema).unwrap());
        let mut writer =
            SerializedFileWriter::new(file, schema, Arc::new(WriterProperties::builder().build()))
                .unwrap();
        let mut group = writer.next_row_group().unwrap();
        for (_, values) in &columns {
            let mut col = group.next_column().unwrap().unwrap();
            let data: Vec<ByteArray> = values.iter().map(|v| ByteArray::from(*v)).collect();
            col.typed::<ByteArrayType>()
                .write_batch(&data, None, None)
                .unwrap();
            col.close().unwrap();
        }
        group.close().unwrap();
        writer.close().unwrap();
        let p: Parsed<SwtInstance> = load_rows(&path).unwrap();
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        assert_eq!(p.rows.len(), 2);
        assert_eq!(p.rows[0].fail_to_pass, vec!["tests/a.py::t1"]);
        assert_eq!(p.rows[1].instance_id, "o__r-2");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    #[cfg(feature = "parquet")]
    fn a_broken_parquet_page_is_one_error_not_a_hang() {
        // Found by fuzz/ (parquet_rows): a one-row file whose page header's first byte is 0, so
        // the page has no type. The reader's row iterator then returns that error forever.
        const BROKEN: &[u8] = &[
            0x50, 0x41, 0x52, 0x31, 0x00, 0x00, 0x15, 0x0a, 0x15, 0x0a, 0x2c, 0x15, 0x02, 0x15,
            0x00, 0x15, 0x06, 0x15, 0x06, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x61, 0x19, 0x1c,
            0x16, 0x08, 0x15, 0x2c, 0x16, 0x00, 0x00, 0x00, 0x15, 0x02, 0x19, 0x2c, 0x48, 0x01,
            0x6d, 0x15, 0x02, 0x00, 0x15, 0x0c, 0x25, 0x00, 0x18, 0x0b, 0x69, 0x6e, 0x73, 0x74,
            0x61, 0x6e, 0x63, 0x65, 0x5f, 0x69, 0x64, 0x25, 0x00, 0x00, 0x16, 0x02, 0x19, 0x1c,
            0x19, 0x1c, 0x26, 0x00, 0x1c, 0x15, 0x0c, 0x19, 0x25, 0x00, 0x06, 0x19, 0x18, 0x0b,
            0x69, 0x6e, 0x73, 0x74, 0x61, 0x6e, 0x63, 0x65, 0x5f, 0x69, 0x64, 0x15, 0x00, 0x16,
            0x02, 0x16, 0x2c, 0x16, 0x2c, 0x26, 0x08, 0x49, 0x1c, 0x15, 0x00, 0x15, 0x00, 0x15,
            0x02, 0x00, 0x00, 0x16, 0x34, 0x15, 0x14, 0x00, 0x16, 0x2c, 0x16, 0x02, 0x26, 0x08,
            0x16, 0x2c, 0x14, 0x00, 0x00, 0x28, 0x00, 0x19, 0x1c, 0x1c, 0x00, 0x00, 0x00, 0x67,
            0x00, 0x00, 0x00, 0x50, 0x41, 0x52, 0x31,
        ];
        let dir =
            std::env::temp_dir().join(format!("reprobench-parquet-broken-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("rows.parquet");
        std::fs::write(&path, BROKEN).unwrap();
        let p: Parsed<SwtInstance> = load_rows(&path).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(p.rows.is_empty());
        assert_eq!(p.errors.len(), 1, "{:?}", p.errors);
        assert!(p.errors[0].message.contains("not read"), "{}", p.errors[0]);
    }

    #[test]
    #[cfg(feature = "parquet")]
    fn a_parquet_file_the_reader_panics_on_is_not_parquet() {
        // Found by fuzz/ (parquet_rows): a one-row file whose statistics' `is_max_value_exact`
        // is an i32, not a bool; parquet 57's footer decoder unwraps a None on it.
        const PANICS: &[u8] = &[
            0x50, 0x41, 0x52, 0x31, 0x15, 0x00, 0x15, 0x0a, 0x15, 0x0a, 0x2c, 0x15, 0x02, 0x15,
            0x00, 0x15, 0x06, 0x15, 0x06, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x61, 0x19, 0x1c,
            0x16, 0x08, 0x15, 0x2c, 0x16, 0x00, 0x00, 0x19, 0x16, 0x02, 0x00, 0x15, 0x02, 0x19,
            0x2c, 0x48, 0x01, 0x6d, 0x15, 0x02, 0x00, 0x15, 0x0c, 0x25, 0x00, 0x18, 0x0b, 0x69,
            0x6e, 0x73, 0x74, 0x61, 0x6e, 0x63, 0x65, 0x5f, 0x69, 0x64, 0x25, 0x00, 0x00, 0x16,
            0x02, 0x19, 0x1c, 0x19, 0x1c, 0x26, 0x00, 0x1c, 0x15, 0x0c, 0x19, 0x25, 0x00, 0x06,
            0x19, 0x18, 0x0b, 0x69, 0x6e, 0x73, 0x74, 0x61, 0x6e, 0x63, 0x65, 0x5f, 0x69, 0x64,
            0x15, 0x00, 0x16, 0x02, 0x16, 0x2c, 0x16, 0x2c, 0x26, 0x08, 0x3c, 0x36, 0x00, 0x28,
            0x01, 0x61, 0x18, 0x01, 0x61, 0x15, 0x11, 0x00, 0x19, 0x1c, 0x15, 0x00, 0x15, 0x00,
            0x15, 0x02, 0x00, 0x3c, 0x16, 0x02, 0x00, 0x00, 0x16, 0x34, 0x15, 0x1a, 0x00, 0x16,
            0x2c, 0x16, 0x02, 0x26, 0x08, 0x16, 0x2c, 0x14, 0x00, 0x00, 0x28, 0x00, 0x19, 0x1c,
            0x1c, 0x00, 0x00, 0x00, 0x77, 0x00, 0x00, 0x00, 0x50, 0x41, 0x52, 0x31,
        ];
        let dir =
            std::env::temp_dir().join(format!("reprobench-parquet-panics-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("rows.parquet");
        std::fs::write(&path, PANICS).unwrap();
        let err = load_rows::<SwtInstance>(&path).unwrap_err();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(matches!(err, LoadError::NotParquet { .. }), "{err}");
    }

    #[test]
    fn predictions_may_have_no_patch() {
        let p: Parsed<Prediction> = parse_rows(
            "p",
            "{\"instance_id\":\"a\",\"model_name_or_path\":\"m\",\"model_patch\":null}\n",
        );
        assert_eq!(p.rows[0].model_patch, None);
    }
}

/// Which test patch an SWT task evaluates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum SwtAgent {
    /// The golden test patch.
    Gold,
    /// The `issue-snippet` baseline (built on the node from the issue text).
    IssueSnippet,
    /// A built-in LLM agent (`reproagent`, `zero-shot-plus`, `libro`), run on the node through
    /// its metering gateway.
    Llm {
        /// Agent name.
        name: String,
        /// Variant (ablation), e.g. `no-review`.
        variant: String,
        /// The backbone its calls go to.
        backbone: BackboneSpec,
        /// Per-task budget.
        budget: Budget,
    },
    /// An external agent: a command or a local container image, given the instance as JSON and
    /// the gateway as its OpenAI endpoint; it writes a test patch.
    External {
        /// Agent name.
        name: String,
        /// argv of the command (inside the image, when `image` is set).
        command: Vec<String>,
        /// Local container image, if the agent is packaged as one.
        image: Option<String>,
        /// The backbone its calls go to.
        backbone: BackboneSpec,
        /// Per-task budget.
        budget: Budget,
    },
    /// A given prediction.
    Prediction {
        /// `model_name_or_path`.
        model: String,
        /// The prediction's patch; `None` when the system produced nothing for this instance.
        patch: Option<String>,
    },
}

/// Limits of each execution of an SWT task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalLimits {
    /// Seconds per execution.
    pub timeout_s: u64,
    /// CPUs.
    pub cpus: f64,
    /// Memory (MiB).
    pub memory_mb: u64,
    /// Processes.
    pub pids: u64,
    /// Scratch disk (MiB).
    pub disk_mb: u64,
}

/// What an SWT task tells the node (the grant's payload).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SwtPayload {
    /// The instance, its environment resolved inline.
    pub instance: SwtInstance,
    /// Its environment.
    pub env: EnvSpec,
    /// Where the test patch comes from.
    pub agent: SwtAgent,
    /// Execution limits.
    pub limits: EvalLimits,
    /// How the executions are graded.
    #[serde(default)]
    pub grading: crate::grading::GradingSettings,
}

/// A dataset manifest (`datasets/NAME/manifest.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Dataset name.
    pub name: String,
    /// Track (`swt`).
    pub track: String,
    /// Rows file, relative to the manifest.
    pub instances: String,
    /// Environment map file, relative to the manifest.
    #[serde(default)]
    pub env: Option<String>,
    /// Directory of repository sources that `datasets prepare` turns into mirrors.
    #[serde(default)]
    pub sources: Option<String>,
    /// Where `datasets fetch` gets the rows.
    #[serde(default)]
    pub source: Option<RemoteSource>,
    /// Rows left out (SWT-bench's filter lists).
    #[serde(default)]
    pub exclude: Option<Exclusions>,
    /// Instances after exclusion, when known.
    #[serde(default)]
    pub expected_instances: Option<usize>,
}

/// A Hugging Face dataset split.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RemoteSource {
    /// `owner/name` on the Hugging Face hub.
    pub huggingface_dataset: String,
    /// Split name.
    pub split: String,
    /// Rows in the split.
    #[serde(default)]
    pub rows: Option<usize>,
}

/// Instance ids left out of a dataset, and where the list comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Exclusions {
    /// Provenance of the list.
    pub origin: String,
    /// The ids.
    pub instance_ids: Vec<String>,
}

/// A dataset read from disk: usable instances (environment inline), and every problem found.
#[derive(Debug, Clone)]
pub struct LoadedDataset {
    /// Name used in results.
    pub name: String,
    /// Directory of the manifest (None for a plain rows file).
    pub dir: Option<std::path::PathBuf>,
    /// The manifest, when there is one.
    pub manifest: Option<Manifest>,
    /// Usable instances, each with `env` filled in.
    pub instances: Vec<SwtInstance>,
    /// Rows that could not be used.
    pub errors: Vec<RowError>,
    /// Rows left out by the manifest's exclusion list.
    pub excluded: usize,
}

/// Finds the datasets directory: `$REPROBENCH_DATASETS`, else `./datasets`, else next to the binary's checkout.
pub fn default_datasets_dir() -> std::path::PathBuf {
    if let Ok(d) = std::env::var("REPROBENCH_DATASETS") {
        return d.into();
    }
    let cwd = std::path::PathBuf::from("datasets");
    if cwd.is_dir() {
        return cwd;
    }
    // target/{debug,release}/reprobench → the checkout's datasets/
    if let Some(d) = std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.parent()?.parent()?.join("datasets")))
        && d.is_dir()
    {
        return d;
    }
    cwd
}

/// Where a dataset named `name_or_path` is: `Some(dir)` for a directory (given, or under
/// `datasets_dir` with a manifest), `None` for a rows file; an error naming the `kind` of
/// dataset when it is neither.
pub fn dataset_location(
    name_or_path: &str,
    datasets_dir: &Path,
    kind: &str,
) -> Result<Option<std::path::PathBuf>, LoadError> {
    let as_path = Path::new(name_or_path);
    if as_path.is_dir() {
        return Ok(Some(as_path.to_path_buf()));
    }
    if as_path.is_file() {
        return Ok(None);
    }
    let d = datasets_dir.join(name_or_path);
    if !d.join("manifest.json").is_file() {
        return Err(LoadError::UnknownDataset {
            kind: kind.to_string(),
            name: name_or_path.to_string(),
            dir: d,
        });
    }
    Ok(Some(d))
}

/// Loads a dataset by name (a directory under `datasets_dir` with a manifest), by directory, or
/// from a JSON/JSONL rows file (with `env_file` for rows that carry no inline `env`).
pub fn load_dataset(
    name_or_path: &str,
    datasets_dir: &Path,
    env_file: Option<&Path>,
) -> Result<LoadedDataset, LoadError> {
    let dir = dataset_location(name_or_path, datasets_dir, "dataset")?;
    let as_path = Path::new(name_or_path);
    let (name, rows_path, env_path, manifest) = match &dir {
        Some(d) => {
            let mpath = d.join("manifest.json");
            let text = std::fs::read_to_string(&mpath).map_err(|error| LoadError::Read {
                path: mpath.clone(),
                error,
            })?;
            let m: Manifest =
                serde_json::from_str(&text).map_err(|error| LoadError::BadManifest {
                    path: mpath.clone(),
                    error,
                })?;
            let rows = d.join(&m.instances);
            if !rows.is_file() {
                return Err(LoadError::NoRows {
                    dataset: m.name,
                    rows,
                    fetchable: m.source.is_some(),
                });
            }
            let env = env_file
                .map(Path::to_path_buf)
                .or_else(|| m.env.as_ref().map(|e| d.join(e)));
            (m.name.clone(), rows, env, Some(m))
        }
        None => {
            let stem = as_path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("dataset")
                .to_string();
            (
                stem,
                as_path.to_path_buf(),
                env_file.map(Path::to_path_buf),
                None,
            )
        }
    };
    let parsed: Parsed<SwtInstance> = load_rows(&rows_path)?;
    let env_map: EnvMap = match &env_path {
        Some(p) if p.is_file() => {
            let text = std::fs::read_to_string(p).map_err(|error| LoadError::Read {
                path: p.clone(),
                error,
            })?;
            serde_json::from_str(&text).map_err(|error| LoadError::BadEnvMap {
                path: p.clone(),
                error,
            })?
        }
        Some(p) if env_file.is_some() => {
            return Err(LoadError::NoEnvMap { path: p.clone() });
        }
        _ => EnvMap::new(),
    };
    let excluded_ids: std::collections::BTreeSet<&str> = manifest
        .as_ref()
        .and_then(|m| m.exclude.as_ref())
        .map(|e| e.instance_ids.iter().map(String::as_str).collect())
        .unwrap_or_default();
    let mut out = LoadedDataset {
        name,
        dir,
        manifest: manifest.clone(),
        instances: Vec::new(),
        errors: parsed.errors,
        excluded: 0,
    };
    let mut seen = std::collections::BTreeSet::new();
    let swt_bench = crate::swt_bench::SwtBenchSpecs::load(datasets_dir)?;
    for mut inst in parsed.rows {
        if excluded_ids.contains(inst.instance_id.as_str()) {
            out.excluded += 1;
            continue;
        }
        let location = rows_path.display().to_string();
        if !seen.insert(inst.instance_id.clone()) {
            out.errors.push(RowError {
                location,
                instance_id: Some(inst.instance_id),
                message: "duplicate instance id; keep one row per instance".into(),
            });
            continue;
        }
        // The dataset's own map first, then SWT-bench's specs for its repositories.
        let env = env_for(&inst, &env_map).cloned().or_else(|e| {
            swt_bench
                .as_ref()
                .and_then(|s| s.env(&inst.repo, &inst.version))
                .ok_or_else(|| {
                    format!(
                        "{e}, or to SWT-bench's specs ({})",
                        crate::swt_bench::SwtBenchSpecs::path(datasets_dir).display()
                    )
                })
        });
        match env {
            Ok(env) => {
                inst.env = Some(env);
                out.instances.push(inst);
            }
            Err(message) => out.errors.push(RowError {
                location,
                instance_id: Some(inst.instance_id),
                message,
            }),
        }
    }
    Ok(out)
}
