//! A grade directory: the six execution logs of one instance and its `case.json`, as SWT-bench's
//! logs come (the parity corpus) and as reprobench writes them beside every report. Reading one
//! and grading it is `reprobench grade DIR`.
//!
//! `case.json`: `{"parser": ..., "repo": ..., "exit_codes": {"pred_pre": 1, ...}}`, and in
//! reprobench's own directories also `instance_id`, `timed_out` (runs killed at the timeout) and
//! `findings` (what the harness noticed while running them, such as a patch that applies only
//! with fuzz). reprobench's logs are its executions' output without its own marker lines.
//! Runs that traced coverage leave `RUN.coverage` (the tracer's counts, a JSON object per line;
//! not named `.jsonl`, which `--replay` reads as transcripts) and the directory
//! `golden_code.patch`, from which SWT-bench's coverage figures are computed.

use crate::grading::instance::{self, InstanceGrade, RUNS, RunInput, Suspicion, finding};
use crate::grading::{Family, Rules, coverage};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// `case.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CaseFile {
    /// The instance (reprobench's directories).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    /// Log parser family; SWT-bench's parser for `repo` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parser: Option<String>,
    /// `owner/name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<String>,
    /// Exit status of the test command per run (`null`: killed or never started).
    #[serde(default)]
    pub exit_codes: BTreeMap<String, Option<i64>>,
    /// Runs killed at the timeout.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timed_out: Vec<String>,
    /// What the harness noticed while running the executions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<Suspicion>,
}

impl CaseFile {
    /// The parser family this case names, or SWT-bench's for its repository.
    pub fn family(&self, dir: &Path) -> Result<Family, CaseError> {
        match (&self.parser, &self.repo) {
            (Some(p), _) => Family::from_name(p).ok_or_else(|| CaseError::UnknownParser {
                dir: dir.to_path_buf(),
                parser: p.clone(),
            }),
            (None, Some(r)) => Family::for_repo(r).ok_or_else(|| CaseError::NoParser {
                dir: dir.to_path_buf(),
                repo: Some(r.clone()),
            }),
            (None, None) => Err(CaseError::NoParser {
                dir: dir.to_path_buf(),
                repo: None,
            }),
        }
    }
}

/// Why a directory cannot be graded.
#[derive(Debug, thiserror::Error)]
pub enum CaseError {
    /// No readable `case.json`.
    #[error(
        "{}: cannot read case.json ({why}); a grade directory holds the six logs and a case.json such as {{\"parser\": \"pytest\", \"repo\": \"owner/name\", \"exit_codes\": {{}}}}",
        dir.display()
    )]
    NoCaseFile {
        /// The directory.
        dir: PathBuf,
        /// The IO or JSON error.
        why: String,
    },
    /// A parser name no family has.
    #[error(
        "{}: case.json names parser `{parser}`; known: {}",
        dir.display(),
        Family::names().join(", ")
    )]
    UnknownParser {
        /// The directory.
        dir: PathBuf,
        /// The name given.
        parser: String,
    },
    /// No parser named and none known for the repository.
    #[error(
        "{}: case.json names no parser and {} SWT-bench repository; add \"parser\": one of {}",
        dir.display(),
        repo.as_ref().map_or("no".to_string(), |r| format!("`{r}` is no")),
        Family::names().join(", ")
    )]
    NoParser {
        /// The directory.
        dir: PathBuf,
        /// The repository given.
        repo: Option<String>,
    },
    /// A log that exists but cannot be read.
    #[error("{}: {why}", path.display())]
    Unreadable {
        /// The log.
        path: PathBuf,
        /// The IO error.
        why: String,
    },
    /// SWT-bench would give no verdict.
    #[error("{}: {why}", dir.display())]
    NotGraded {
        /// Why.
        why: instance::NotGraded,
        /// The directory.
        dir: PathBuf,
    },
}

/// The case file and the six runs of a grade directory.
pub fn load(dir: &Path) -> Result<(CaseFile, Family, [RunInput; 6]), CaseError> {
    let case_path = dir.join("case.json");
    let case: CaseFile = std::fs::read(&case_path)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
        .map_err(|why| CaseError::NoCaseFile {
            dir: dir.to_path_buf(),
            why,
        })?;
    let family = case.family(dir)?;
    let mut runs: [RunInput; 6] = Default::default();
    for (i, name) in RUNS.iter().enumerate() {
        let path = dir.join(format!("{name}.log"));
        let bytes = match std::fs::read(&path) {
            Ok(b) => Some(b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                return Err(CaseError::Unreadable {
                    path,
                    why: e.to_string(),
                });
            }
        };
        let mut findings = Vec::new();
        let log = bytes.map(|b| match String::from_utf8(b) {
            Ok(s) => s,
            Err(e) => {
                findings.push(Suspicion::new(
                    finding::SWT_BENCH_RAISES,
                    name,
                    "the log is not UTF-8 (SWT-bench raises UnicodeDecodeError); read with replacement characters",
                ));
                String::from_utf8_lossy(e.as_bytes()).into_owned()
            }
        });
        findings.extend(
            case.findings
                .iter()
                .filter(|f| f.run.as_deref() == Some(*name))
                .cloned(),
        );
        runs[i] = RunInput {
            log,
            exit_code: case.exit_codes.get(*name).copied().flatten(),
            timed_out: case.timed_out.iter().any(|t| t == name),
            findings,
        };
    }
    Ok((case, family, runs))
}

/// Grades a directory under `rules`.
pub fn grade_dir(dir: &Path, rules: Rules, strict: bool) -> Result<InstanceGrade, CaseError> {
    let (_, family, runs) = load(dir)?;
    instance::grade(&runs, family, rules, strict).map_err(|why| CaseError::NotGraded {
        why,
        dir: dir.to_path_buf(),
    })
}

/// The golden code patch beside the logs, which the coverage figures are measured against.
pub const CODE_PATCH_FILE: &str = "golden_code.patch";

/// Writes the tracer's counts of each run that traced coverage (`RUN.coverage`).
pub fn write_coverage(dir: &Path, counts: &[Option<&str>; 6]) -> std::io::Result<()> {
    for (name, text) in RUNS.iter().zip(counts) {
        if let Some(text) = text {
            std::fs::write(dir.join(format!("{name}.coverage")), text)?;
        }
    }
    Ok(())
}

/// SWT-bench's coverage figures of a grade directory, when it holds the golden code patch
/// (`golden_code.patch`) and its runs' counts: reprobench's `RUN.coverage` files, or the
/// coverage dumps in SWT-bench's own logs. `None` when there is nothing to measure.
pub fn coverage_of(dir: &Path, patch_applied: bool) -> Option<coverage::CoverageFigures> {
    let code_patch = std::fs::read_to_string(dir.join(CODE_PATCH_FILE)).ok()?;
    let mut any = false;
    let counts: [coverage::LineCounts; 6] = std::array::from_fn(|i| {
        let name = RUNS[i];
        if let Ok(text) = std::fs::read_to_string(dir.join(format!("{name}.coverage"))) {
            any = true;
            return coverage::from_tracer_lines(&text);
        }
        let log = std::fs::read(dir.join(format!("{name}.log"))).unwrap_or_default();
        match coverage::from_swt_bench_log(&String::from_utf8_lossy(&log)) {
            Some(c) => {
                any = true;
                c
            }
            None => coverage::LineCounts::new(),
        }
    });
    any.then(|| {
        coverage::figures(
            &code_patch,
            std::array::from_fn(|i| &counts[i]),
            patch_applied,
        )
    })
}

/// Writes a grade directory: the logs given (a run without one gets no file) and `case.json`.
pub fn write(dir: &Path, case: &CaseFile, logs: &[Option<&str>; 6]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (name, log) in RUNS.iter().zip(logs) {
        let path = dir.join(format!("{name}.log"));
        match log {
            Some(text) => std::fs::write(&path, text)?,
            None => match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            },
        }
    }
    std::fs::write(
        dir.join("case.json"),
        serde_json::to_vec_pretty(case).map_err(std::io::Error::other)?,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reprobench_directories_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let pre = "Applied patch tests/t.py cleanly.\nFAILED tests/t.py::new\n";
        let post = "Applied patch tests/t.py cleanly.\nPASSED tests/t.py::new\n";
        let case = CaseFile {
            instance_id: Some("o__r-1".into()),
            parser: Some("pytest".into()),
            repo: Some("o/r".into()),
            exit_codes: RUNS.iter().map(|r| (r.to_string(), Some(0))).collect(),
            timed_out: vec![],
            findings: vec![Suspicion::new(
                finding::PATCH_NEEDS_FUZZ,
                "gold_post",
                "the test patch would apply only with fuzz",
            )],
        };
        write(
            dir.path(),
            &case,
            &[
                Some(pre),
                Some(post),
                Some(""),
                Some(""),
                Some(""),
                Some(""),
            ],
        )
        .unwrap();
        let g = grade_dir(dir.path(), Rules::default(), false).unwrap();
        assert!(g.resolved, "{g:?}");
        assert!(
            g.suspicious
                .iter()
                .any(|f| f.kind == finding::PATCH_NEEDS_FUZZ)
        );
        let (read_back, family, runs) = load(dir.path()).unwrap();
        assert_eq!(read_back, case);
        assert_eq!(family, Family::Pytest);
        assert_eq!(runs[3].findings.len(), 1);
    }

    #[test]
    fn bad_directories_say_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let e = grade_dir(dir.path(), Rules::default(), false).unwrap_err();
        assert!(e.to_string().contains("case.json"), "{e}");
        std::fs::write(dir.path().join("case.json"), r#"{"repo": "me/mine"}"#).unwrap();
        let e = grade_dir(dir.path(), Rules::default(), false).unwrap_err();
        assert!(e.to_string().contains("\"parser\""), "{e}");
        std::fs::write(dir.path().join("case.json"), r#"{"repo": "psf/requests"}"#).unwrap();
        let e = grade_dir(dir.path(), Rules::default(), false).unwrap_err();
        assert!(e.to_string().contains("pred_pre"), "{e}");
    }
}
