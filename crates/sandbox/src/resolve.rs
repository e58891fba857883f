//! Requirements resolved as of a date for a Python whose own pip cannot do that (pip 26, the
//! first with `--uploaded-prior-to`, needs Python 3.9+): a pip 26 on the host resolves them for
//! the target Python (`--python-version`, wheels only, `--dry-run --report`), and the environment
//! installs the pins it reports.

use super::python::{Interpreter, build_once, find_python, run_setup};
use super::{PIP_WITH_DATE_CAP, SandboxError};
use std::path::{Path, PathBuf};

/// Host Pythons a resolver venv can be made from, newest first (pip 26 needs 3.9+).
const RESOLVER_PYTHONS: [&str; 5] = ["3.13", "3.12", "3.11", "3.10", "3.9"];

/// A pip installation report (`--report`) that does not say what to install.
#[derive(Debug, thiserror::Error)]
pub enum PipReportError {
    /// The report has no `install` list.
    #[error("pip's report has no `install` list")]
    NoInstallList,
    /// An entry of the list without a name or version.
    #[error("an entry of pip's report lacks a name or version: {entry}")]
    IncompleteEntry {
        /// The entry, as the report has it.
        entry: serde_json::Value,
    },
}

/// `name==version` for every distribution in a pip installation report (`--report`), pip itself
/// left out; in the report's order.
pub fn pins_from_report(report: &serde_json::Value) -> Result<Vec<String>, PipReportError> {
    let install = report["install"]
        .as_array()
        .ok_or(PipReportError::NoInstallList)?;
    install
        .iter()
        .filter_map(|item| {
            let meta = &item["metadata"];
            match (meta["name"].as_str(), meta["version"].as_str()) {
                (Some(name), _) if name.eq_ignore_ascii_case("pip") => None,
                (Some(name), Some(version)) => Some(Ok(format!("{name}=={version}"))),
                _ => Some(Err(PipReportError::IncompleteEntry {
                    entry: item.clone(),
                })),
            }
        })
        .collect()
}

/// A host interpreter of 3.9 or later, for the resolver venv.
fn host_python(cache: &Path) -> Result<Interpreter, SandboxError> {
    RESOLVER_PYTHONS
        .iter()
        .find_map(|v| {
            find_python(v, false, cache)
                .ok()
                .filter(|i| i.version == *v)
        })
        .ok_or_else(|| {
            SandboxError::BadInput(format!(
                "resolving packages as of a date for an older Python needs a host Python 3.9 or later (for pip 26), and none of python{} was found on PATH, in /usr/bin or among pyenv's versions: install one (`apt-get install -y python3 python3-venv` or `pyenv install 3.11`)",
                RESOLVER_PYTHONS.join(", python")
            ))
        })
}

/// The resolver venv in the cache (pip 26 on a host Python), built once.
fn resolver(cache: &Path) -> Result<PathBuf, SandboxError> {
    let root = cache.join("resolver");
    let dir = root.join("pip26");
    let marker = dir.join(".reprobench-ready");
    build_once(
        &dir,
        &root.join("pip26.lock"),
        || marker.exists(),
        || {
            let python = host_python(cache)?;
            run_setup(
                std::process::Command::new(&python.exe)
                    .args(["-m", "venv"])
                    .arg(&dir),
                "creating the resolver's virtualenv",
            )
            .map_err(|e| SandboxError::Infra(e.to_string()))?;
            run_setup(
                std::process::Command::new(dir.join("bin/python")).args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    "--upgrade",
                    PIP_WITH_DATE_CAP,
                ]),
                "installing pip 26 for the resolver (needs PyPI)",
            )
            .map_err(|e| SandboxError::Infra(e.to_string()))?;
            std::fs::write(&marker, b"")
                .map_err(|e| SandboxError::Infra(format!("marking the resolver ready: {e}")))
        },
    )?;
    Ok(dir)
}

/// Where the pins of one resolution are kept: a resolution as of a past date gives the same pins
/// again, so it runs once per cache (and a built environment needs no PyPI to be found again).
fn resolution_file(cache: &Path, requirements: &[String], python: &str, date: &str) -> PathBuf {
    let mut h = reprobench_domain::swt::Fnv::default();
    for part in ["resolved-as-of-v1", python, date] {
        h.add(part);
    }
    for r in requirements {
        h.add(r);
    }
    cache
        .join("resolver")
        .join("resolved")
        .join(format!("{:016x}.json", h.0))
}

/// The pins [`resolve_as_of`] found before for these arguments, if it ran in this cache.
pub fn resolved_before(
    cache: &Path,
    requirements: &[String],
    python: &str,
    date: &str,
) -> Option<Vec<String>> {
    let text = std::fs::read(resolution_file(cache, requirements, python, date)).ok()?;
    serde_json::from_slice(&text).ok()
}

/// Pins (`name==version`, dependencies included) of `requirements` for Python `python` (`3.6`)
/// as they resolved at `date` (ISO 8601), from wheels only; resolved once per cache.
pub fn resolve_as_of(
    cache: &Path,
    requirements: &[String],
    python: &str,
    date: &str,
) -> Result<Vec<String>, SandboxError> {
    if let Some(pins) = resolved_before(cache, requirements, python, date) {
        return Ok(pins);
    }
    let pins = resolve_with_pip(cache, requirements, python, date)?;
    let file = resolution_file(cache, requirements, python, date);
    // A lost write only means resolving again.
    if let Err(e) = crate::write_json_whole(&file, &pins) {
        tracing::warn!(error = %e, file = %file.display(), "cannot keep a resolution");
    }
    Ok(pins)
}

/// [`resolve_as_of`] without its cache: pip 26 on the host, asked now.
fn resolve_with_pip(
    cache: &Path,
    requirements: &[String],
    python: &str,
    date: &str,
) -> Result<Vec<String>, SandboxError> {
    let venv = resolver(cache)?;
    let scratch = tempfile::tempdir_in(cache)
        .map_err(|e| SandboxError::Infra(format!("a scratch directory for the resolver: {e}")))?;
    let report = scratch.path().join("report.json");
    let what = format!(
        "resolving `{}` for Python {python} as of {date}",
        requirements.join(" ")
    );
    run_setup(
        std::process::Command::new(venv.join("bin/python"))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--dry-run",
                "--ignore-installed",
                "--only-binary=:all:",
                "--python-version",
                python,
                "--uploaded-prior-to",
                date,
                "--report",
            ])
            .arg(&report)
            .args(requirements)
            .env_remove("PIP_UPLOADED_PRIOR_TO"),
        &what,
    )
    .map_err(|e| {
        SandboxError::BadInput(format!(
            "{e}\n(no wheel for Python {python} uploaded before {date} satisfies them; `eval --packages-as-of latest` installs today's instead)"
        ))
    })?;
    let text = std::fs::read(&report)
        .map_err(|e| SandboxError::Infra(format!("reading pip's report: {e}")))?;
    let value: serde_json::Value = serde_json::from_slice(&text)
        .map_err(|e| SandboxError::Infra(format!("pip's report is not JSON: {e}")))?;
    pins_from_report(&value).map_err(|e| SandboxError::Infra(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_becomes_pins_without_pip() {
        let report = serde_json::json!({"version": "1", "install": [
            {"metadata": {"name": "Cython", "version": "0.29.26"}, "requested": true},
            {"metadata": {"name": "pip", "version": "21.3.1"}},
            {"metadata": {"name": "python-dateutil", "version": "2.8.2"}, "requested": false},
        ]});
        assert_eq!(
            pins_from_report(&report).unwrap(),
            vec!["Cython==0.29.26", "python-dateutil==2.8.2"]
        );
        assert!(pins_from_report(&serde_json::json!({"install": [{"metadata": {}}]})).is_err());
        assert!(pins_from_report(&serde_json::json!({})).is_err());
    }

    /// PyPI, as the environments' own pip runs reach it: Cython for Python 3.6 as it was at 3.6's
    /// end of life is 0.29.26 (0.29.26 came out on 2021-12-16, 0.29.27 in 2022), while today's
    /// newest for 3.6 is a Cython 3, which scikit-learn 0.20 does not build with.
    #[test]
    fn cython_for_python_36_as_of_its_end_of_life() {
        let cache = tempfile::tempdir().unwrap();
        let pins = resolve_as_of(
            cache.path(),
            &["cython".to_string()],
            "3.6",
            "2021-12-23T00:00:00Z",
        )
        .unwrap();
        assert_eq!(pins, vec!["Cython==0.29.26"]);
        // Kept: asked again, the same pins come from the cache, not from PyPI.
        let args = (&["cython".to_string()][..], "3.6", "2021-12-23T00:00:00Z");
        assert_eq!(
            resolved_before(cache.path(), args.0, args.1, args.2),
            Some(pins.clone())
        );
        let kept = resolution_file(cache.path(), args.0, args.1, args.2);
        std::fs::write(&kept, br#"["Cython==0.0.1"]"#).unwrap();
        assert_eq!(
            resolve_as_of(cache.path(), args.0, args.1, args.2).unwrap(),
            vec!["Cython==0.0.1"],
            "a kept resolution is read, not made again"
        );
        assert_eq!(
            resolved_before(cache.path(), args.0, "3.7", args.2),
            None,
            "another Python is another resolution"
        );
        // A date before any wheel of the package for that Python: a clear error naming them.
        let err = resolve_as_of(
            cache.path(),
            &["numpy".to_string()],
            "3.6",
            "2010-01-01T00:00:00Z",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("numpy") && err.contains("3.6"), "{err}");
    }
}
