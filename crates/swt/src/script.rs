//! What one SWT execution asks of its sandbox, and how its output is read back. Pure.
//!
//! As SWT-bench's evaluation script does, an execution applies the golden code patch ("post"
//! runs) and then the test patch (each with one more final newline, as SWT-bench's
//! here-document gives it) with `git apply -v`, whose output goes to the log, goes on when one
//! does not apply, and runs the test command with the test directives after the spec's
//! `eval_commands`. The sandbox applies the patches out of the test's sight and reports how each
//! went (and, for one that failed, whether `patch --fuzz=5` would have applied it); the test
//! command runs in the tree they made, sealed so that nothing tells which patches went in (see
//! `reprobench_sandbox::stage`). Nothing the test prints can pose as the harness: its output
//! comes back apart from the patches' and the exit code from the sandbox. With coverage, the
//! tracer is a support file outside the tree and its counts file is read back after the
//! command; the counts are written by the traced process itself, so a test could forge them.

use crate::grading::instance::{Suspicion, finding};
use reprobench_sandbox::stage::{SUPPORT_ENV, quote as shell_quote};
use reprobench_sandbox::{ExecOutput, ExecRequest, InputFile, PatchFile};

pub use reprobench_sandbox::PatchOutcome;

/// One execution's inputs.
#[derive(Debug, Clone)]
pub struct Plan<'a> {
    /// Test patch (none for the base runs).
    pub test_patch: Option<&'a str>,
    /// Golden code patch, applied before the test patch ("post" runs).
    pub code_patch: Option<&'a str>,
    /// Test command, e.g. `python -m pytest -rA -p no:cacheprovider`.
    pub test_cmd: &'a str,
    /// Test directives appended to the command.
    pub directives: &'a [String],
    /// Environment variables exported before anything runs.
    pub env: &'a [(String, String)],
    /// Shell lines run before the test command (SWT-bench's `eval_commands`).
    pub setup: &'a [String],
    /// Files (relative to the repository) whose line counts are traced, as SWT-bench's coverage
    /// runs do; `None` runs the test command untraced.
    pub coverage_files: Option<&'a [String]>,
}

/// reprobench's line-count tracer, run inside the sandbox for coverage.
pub const COVERAGE_TRACER: &str = include_str!("coverage_tracer.py");
/// The tracer's name among the support files.
const TRACER_FILE: &str = "coverage_tracer.py";
/// The tracer's counts file among the support files, read back after the command.
const COUNTS_FILE: &str = "counts.jsonl";

/// The execution a plan asks for (limits at their defaults: the caller sets them).
pub fn build(plan: &Plan<'_>) -> ExecRequest {
    let mut patches = Vec::new();
    for (label, patch) in [("code", plan.code_patch), ("test", plan.test_patch)] {
        if let Some(p) = patch {
            // SWT-bench feeds each patch to `git apply` through a here-document, which ends it
            // with one more newline.
            patches.push(PatchFile {
                label: label.to_string(),
                contents: format!("{p}\n").into_bytes(),
            });
        }
    }
    let directives: Vec<String> = plan.directives.iter().map(|d| shell_quote(d)).collect();
    let command = format!("{} {}", plan.test_cmd, directives.join(" "));
    let mut support = Vec::new();
    let mut collect = None;
    let command = match plan.coverage_files {
        Some(changed) => {
            support.push(InputFile {
                path: TRACER_FILE.to_string(),
                contents: COVERAGE_TRACER.as_bytes().to_vec(),
                mode: 0o644,
            });
            collect = Some(COUNTS_FILE.to_string());
            let mut tracer = format!(
                r#"python3 "${SUPPORT_ENV}/{TRACER_FILE}" --out "${SUPPORT_ENV}/{COUNTS_FILE}" --root "$PWD""#
            );
            for f in changed {
                tracer.push_str(&format!(" --file {}", shell_quote(f)));
            }
            crate::grading::coverage::traced_command(&command, &tracer)
        }
        None => command,
    };
    let mut script = String::from("set -u\n");
    for (k, v) in plan.env {
        if k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') && !k.is_empty() {
            script.push_str(&format!("export {k}={}\n", shell_quote(v)));
        }
    }
    for line in plan.setup {
        script.push_str(line);
        script.push('\n');
    }
    script.push_str(&command);
    script.push('\n');
    ExecRequest {
        patches,
        support,
        collect,
        command: vec!["bash".into(), "-c".into(), script],
        ..ExecRequest::default()
    }
}

/// What an execution gave, read for grading.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ScriptReport {
    /// The patches, in the order they were applied.
    pub patches: Vec<PatchOutcome>,
    /// The test command started.
    pub started: bool,
    /// What the grader reads: the patches' `git apply -v` output, then the test command's.
    pub log: String,
    /// The test command's own output.
    pub test_log: String,
    /// The tracer's counts (JSON lines), when the execution traced coverage.
    pub coverage: Option<String>,
}

impl ScriptReport {
    /// Findings for the grader: patches that did not apply with `git apply -v` but would with fuzz.
    pub fn findings(&self, run: &str) -> Vec<Suspicion> {
        self.patches
            .iter()
            .filter(|p| !p.applied && p.fuzz_would_apply)
            .map(|p| {
                Suspicion::new(
                    finding::PATCH_NEEDS_FUZZ,
                    run,
                    format!(
                        "the {} patch does not apply with `git apply -v` (so it was not applied, as in SWT-bench) but would with `patch --fuzz=5`",
                        if p.which == "code" { "golden code" } else { "test" }
                    ),
                )
            })
            .collect()
    }
}

/// Reads what an execution gave.
pub fn read(out: &ExecOutput) -> ScriptReport {
    let mut log = out.prepare_log.clone();
    if !log.is_empty() && !log.ends_with('\n') {
        log.push('\n');
    }
    log.push_str(&out.output);
    ScriptReport {
        patches: out.patches.clone(),
        started: out.started,
        log,
        test_log: out.output.clone(),
        coverage: out
            .collected
            .as_ref()
            .map(|c| String::from_utf8_lossy(c).into_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patches_code_first_with_the_here_document_newline_and_the_command_with_its_setup() {
        let d = vec!["tests/test a.py".to_string()];
        let plan = Plan {
            test_patch: Some("T"),
            code_patch: Some("C"),
            test_cmd: "python -m pytest",
            directives: &d,
            env: &[("A_B".to_string(), "x y".to_string())],
            setup: &["export LANG=C.UTF-8".to_string()],
            coverage_files: None,
        };
        let req = build(&plan);
        assert_eq!(
            req.patches,
            vec![
                PatchFile {
                    label: "code".into(),
                    contents: b"C\n".to_vec()
                },
                PatchFile {
                    label: "test".into(),
                    contents: b"T\n".to_vec()
                }
            ]
        );
        assert!(req.files.is_empty() && req.support.is_empty() && req.collect.is_none());
        assert_eq!(&req.command[..2], ["bash", "-c"]);
        assert_eq!(
            req.command[2],
            "set -u\nexport A_B='x y'\nexport LANG=C.UTF-8\npython -m pytest 'tests/test a.py'\n"
        );
        let base = Plan {
            test_patch: None,
            code_patch: None,
            ..plan
        };
        assert!(build(&base).patches.is_empty());
    }

    #[test]
    fn coverage_runs_trace_the_changed_files_from_the_support_directory_and_collect_the_counts() {
        let d = vec!["tests/t.py".to_string()];
        let changed = vec!["pkg/m.py".to_string()];
        let plan = Plan {
            test_patch: Some("T"),
            code_patch: None,
            test_cmd: "pytest -rA --tb=no",
            directives: &d,
            env: &[],
            setup: &[],
            coverage_files: Some(&changed),
        };
        let req = build(&plan);
        assert_eq!(req.support.len(), 1);
        assert_eq!(req.support[0].path, "coverage_tracer.py");
        assert_eq!(req.collect.as_deref(), Some("counts.jsonl"));
        assert!(
            req.command[2].contains(r#"python3 "$REPROBENCH_SUPPORT/coverage_tracer.py" --out "$REPROBENCH_SUPPORT/counts.jsonl" --root "$PWD" --file pkg/m.py -m pytest -rA  tests/t.py"#),
            "{}",
            req.command[2]
        );
    }

    #[test]
    fn the_log_is_the_patches_output_then_the_tests_and_nothing_the_test_printed_is_harness() {
        let out = ExecOutput {
            prepare_log: "Checking patch x.py...\nApplied patch x.py cleanly.".into(),
            output: "REPROBENCH-n1 END 0\nPASSED t.py::a\n".into(),
            patches: vec![PatchOutcome {
                which: "test".into(),
                applied: false,
                fuzz_would_apply: true,
            }],
            started: true,
            collected: Some(b"{\"m.py\": {\"1\": 1}}\n".to_vec()),
            ..ExecOutput::default()
        };
        let r = read(&out);
        assert_eq!(
            r.log,
            "Checking patch x.py...\nApplied patch x.py cleanly.\nREPROBENCH-n1 END 0\nPASSED t.py::a\n"
        );
        assert_eq!(r.test_log, out.output);
        assert_eq!(r.coverage.as_deref(), Some("{\"m.py\": {\"1\": 1}}\n"));
        let f = r.findings("pred_pre");
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].kind, finding::PATCH_NEEDS_FUZZ);
    }
}
