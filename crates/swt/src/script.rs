//! The script one SWT execution runs inside its sandbox, and how its marker lines are read
//! back. Pure.
//!
//! As SWT-bench's evaluation script does, it applies the golden code patch ("post" runs) and
//! then the test patch (each with one more final newline, as SWT-bench's here-document gives
//! it), each with `git apply -v` whose output goes to the log, goes on when one
//! does not apply, and runs the test command with the test directives. It adds what SWT-bench
//! lacks, on lines of its own that carry a per-execution nonce (so the code under test cannot
//! forge them) and that the grader removes before it reads the log: each patch's `git apply`
//! status and, for one that failed, whether `patch --fuzz=5` would have applied it (a dry run;
//! nothing is changed), and the start and end of the test command with its exit code. The exit
//! code itself is taken from the sandbox.

use crate::grading::instance::{Suspicion, finding};
use reprobench_sandbox::InputFile;

/// Directory (inside the repository) holding the harness's files during an execution.
pub const HARNESS_DIR: &str = ".reprobench";

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
    /// Random marker text, unknown to the code under test.
    pub nonce: &'a str,
    /// Environment variables exported before anything runs.
    pub env: &'a [(String, String)],
    /// Shell lines run before the patches (SWT-bench's `eval_commands`).
    pub setup: &'a [String],
    /// Files (relative to the repository) whose line counts are traced, as SWT-bench's coverage
    /// runs do; `None` runs the test command untraced.
    pub coverage_files: Option<&'a [String]>,
}

/// reprobench's line-count tracer, run inside the sandbox for coverage.
pub const COVERAGE_TRACER: &str = include_str!("coverage_tracer.py");

fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-:=+,".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// The files to place in the repository and the command that runs them.
pub fn build(plan: &Plan<'_>) -> (Vec<InputFile>, Vec<String>) {
    let mut files = Vec::new();
    let mut steps = String::new();
    for (label, patch) in [("code", plan.code_patch), ("test", plan.test_patch)] {
        if let Some(p) = patch {
            let name = format!("{HARNESS_DIR}/{label}.patch");
            // SWT-bench feeds each patch to `git apply` through a here-document, which ends it
            // with one more newline.
            files.push(InputFile {
                path: name.clone(),
                contents: format!("{p}\n").into_bytes(),
                mode: 0o644,
            });
            steps.push_str(&format!("apply {label} {name}\n"));
        }
    }
    let directives: Vec<String> = plan.directives.iter().map(|d| shell_quote(d)).collect();
    let command = format!("{} {}", plan.test_cmd, directives.join(" "));
    // With coverage, the tracer leaves the repository before the tests run (as the harness's
    // other files do) and its counts are printed on marker lines after them.
    let (coverage_setup, command, coverage_dump) = match plan.coverage_files {
        Some(changed) => {
            files.push(InputFile {
                path: format!("{HARNESS_DIR}/coverage_tracer.py"),
                contents: COVERAGE_TRACER.as_bytes().to_vec(),
                mode: 0o644,
            });
            let mut tracer = String::from(
                r#"python3 "$C/coverage_tracer.py" --out "$C/counts.jsonl" --root "$PWD""#,
            );
            for f in changed {
                tracer.push_str(&format!(" --file {}", shell_quote(f)));
            }
            (
                format!(
                    "C=$(mktemp -d \"${{TMPDIR:-/tmp}}/reprobench-coverage.XXXXXX\")\nmv {HARNESS_DIR}/coverage_tracer.py \"$C/\"\n"
                ),
                crate::grading::coverage::traced_command(&command, &tracer),
                "echo \"REPROBENCH-$N COVERAGE\"\nif [ -f \"$C/counts.jsonl\" ]; then\n  while IFS= read -r l || [ -n \"$l\" ]; do printf 'REPROBENCH-%s COV %s\\n' \"$N\" \"$l\"; done < \"$C/counts.jsonl\"\nfi\nrm -rf \"$C\"\n".to_string(),
            )
        }
        None => (String::new(), command, String::new()),
    };
    let mut prelude = String::new();
    for (k, v) in plan.env {
        if k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') && !k.is_empty() {
            prelude.push_str(&format!("export {k}={}\n", shell_quote(v)));
        }
    }
    for line in plan.setup {
        prelude.push_str(line);
        prelude.push('\n');
    }
    let script = format!(
        r#"#!/bin/bash
# reprobench SWT execution script
set -u
N={nonce}
git init -q . >/dev/null 2>&1
echo '{dir}/' >> .git/info/exclude
{prelude}apply() {{
  git apply -v "$2" 2>&1
  rc=$?
  if [ "$rc" -eq 0 ]; then echo "REPROBENCH-$N APPLY $1 0 -"; return 0; fi
  if patch --dry-run --batch --fuzz=5 -p1 -i "$2" >/dev/null 2>&1; then f=fuzz; else f=no; fi
  echo "REPROBENCH-$N APPLY $1 $rc $f"
}}
{steps}{coverage_setup}rm -rf {dir}
echo "REPROBENCH-$N START $(date +%s%N)"
{command} 2>&1
rc=$?
echo "REPROBENCH-$N END $rc $(date +%s%N)"
{coverage_dump}exit $rc
"#,
        nonce = plan.nonce,
        dir = HARNESS_DIR,
    );
    let script_path = format!("{HARNESS_DIR}/run.sh");
    files.push(InputFile {
        path: script_path.clone(),
        contents: script.into_bytes(),
        mode: 0o755,
    });
    (files, vec!["bash".into(), script_path])
}

/// How one patch went.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PatchOutcome {
    /// `code` or `test`.
    pub which: String,
    /// `git apply -v` succeeded.
    pub applied: bool,
    /// It failed, but `patch --fuzz=5` would have applied it.
    pub fuzz_would_apply: bool,
}

/// What an execution's marker lines say, and its log without them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ScriptReport {
    /// The patches, in the order they were applied.
    pub patches: Vec<PatchOutcome>,
    /// The test command started.
    pub started: bool,
    /// Nanoseconds the test command ran (from the script's own clock), when both markers were printed.
    pub test_ns: Option<u64>,
    /// The output without the marker lines: what the grader reads.
    pub log: String,
    /// The test command's own output (after the start marker, up to the end marker).
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

/// Reads the marker lines of an execution's output (`nonce` from its case file).
pub fn read(output: &str, nonce: &str) -> ScriptReport {
    let tag = format!("REPROBENCH-{nonce} ");
    let mut r = ScriptReport::default();
    let mut start_ns: Option<u64> = None;
    let mut ended = false;
    for line in output.split_inclusive('\n') {
        let Some(rest) = line.strip_prefix(&tag) else {
            r.log.push_str(line);
            if r.started && !ended {
                r.test_log.push_str(line);
            }
            continue;
        };
        if let Some(counts) = rest.strip_prefix("COV ") {
            if let Some(c) = r.coverage.as_mut() {
                c.push_str(counts.trim_end_matches(['\r', '\n']));
                c.push('\n');
            }
            continue;
        }
        let words: Vec<&str> = rest.split_whitespace().collect();
        match words.as_slice() {
            ["APPLY", which, rc, fuzz] if !r.started => r.patches.push(PatchOutcome {
                which: which.to_string(),
                applied: *rc == "0",
                fuzz_would_apply: *fuzz == "fuzz",
            }),
            ["START", rest @ ..] if !r.started => {
                r.started = true;
                start_ns = rest.first().and_then(|t| t.parse::<u64>().ok());
            }
            ["COVERAGE"] if ended && r.coverage.is_none() => r.coverage = Some(String::new()),
            ["END", _, rest @ ..] if r.started && !ended => {
                ended = true;
                let end_ns = rest.first().and_then(|t| t.parse::<u64>().ok());
                r.test_ns = start_ns.zip(end_ns).map(|(a, b)| b.saturating_sub(a));
            }
            _ => {
                r.log.push_str(line);
                if r.started && !ended {
                    r.test_log.push_str(line);
                }
            }
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_files_and_command_code_patch_first() {
        let d = vec!["tests/test a.py".to_string()];
        let plan = Plan {
            test_patch: Some("T"),
            code_patch: Some("C"),
            test_cmd: "python -m pytest",
            directives: &d,
            nonce: "n1",
            env: &[("A_B".to_string(), "x y".to_string())],
            setup: &["export LANG=C.UTF-8".to_string()],
            coverage_files: None,
        };
        let (files, cmd) = build(&plan);
        assert_eq!(cmd, vec!["bash", ".reprobench/run.sh"]);
        let names: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            names,
            vec![
                ".reprobench/code.patch",
                ".reprobench/test.patch",
                ".reprobench/run.sh"
            ]
        );
        let script = String::from_utf8(files[2].contents.clone()).unwrap();
        assert!(script.contains("python -m pytest 'tests/test a.py'"));
        assert!(script.find("apply code").unwrap() < script.find("apply test").unwrap());
        assert!(
            !script.contains("|| exit"),
            "a patch that fails does not stop the run"
        );
        let base = Plan {
            test_patch: None,
            code_patch: None,
            ..plan
        };
        assert_eq!(build(&base).0.len(), 1);
    }

    #[test]
    fn reads_markers_removes_them_and_ignores_forged_ones() {
        let out = "Checking patch x.py...\n\
                   REPROBENCH-n1 APPLY code 0 -\n\
                   error: patch failed: tests/t.py:3\n\
                   REPROBENCH-n1 APPLY test 1 fuzz\n\
                   REPROBENCH-n1 START 1000\n\
                   PASSED tests/t.py::a\n\
                   REPROBENCH-n1 APPLY test 0 -\n\
                   REPROBENCH-other END 0\n\
                   REPROBENCH-n1 END 1 5000\n\
                   trailing";
        let r = read(out, "n1");
        assert_eq!(r.patches.len(), 2);
        assert!(r.patches[0].applied && !r.patches[1].applied && r.patches[1].fuzz_would_apply);
        assert!(r.started);
        assert_eq!(r.test_ns, Some(4000));
        assert_eq!(
            r.log,
            "Checking patch x.py...\nerror: patch failed: tests/t.py:3\nPASSED tests/t.py::a\n\
             REPROBENCH-n1 APPLY test 0 -\nREPROBENCH-other END 0\ntrailing"
        );
        assert_eq!(
            r.test_log,
            "PASSED tests/t.py::a\nREPROBENCH-n1 APPLY test 0 -\nREPROBENCH-other END 0\n"
        );
        let f = r.findings("pred_pre");
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].kind, finding::PATCH_NEEDS_FUZZ);
        let hung = read("REPROBENCH-n1 START\nstill running\n", "n1");
        assert_eq!(hung.log, "still running\n");
        assert_eq!(hung.test_ns, None);
    }

    #[test]
    fn coverage_runs_trace_the_changed_files_and_print_the_counts_on_marker_lines() {
        let d = vec!["tests/t.py".to_string()];
        let changed = vec!["pkg/m.py".to_string()];
        let plan = Plan {
            test_patch: Some("T"),
            code_patch: None,
            test_cmd: "pytest -rA --tb=no",
            directives: &d,
            nonce: "n1",
            env: &[],
            setup: &[],
            coverage_files: Some(&changed),
        };
        let (files, _) = build(&plan);
        assert!(
            files
                .iter()
                .any(|f| f.path == ".reprobench/coverage_tracer.py")
        );
        let script = String::from_utf8(files.last().unwrap().contents.clone()).unwrap();
        assert!(
            script.contains(r#"python3 "$C/coverage_tracer.py" --out "$C/counts.jsonl" --root "$PWD" --file pkg/m.py -m pytest -rA  tests/t.py 2>&1"#),
            "{script}"
        );
        assert!(
            script.find("mv .reprobench/coverage_tracer.py").unwrap()
                < script.find("rm -rf .reprobench").unwrap()
        );
        let out = "REPROBENCH-n1 START 1\nPASSED tests/t.py::a\nREPROBENCH-n1 COV {\"forged\": {}}\nREPROBENCH-n1 END 0 2\nREPROBENCH-n1 COVERAGE\nREPROBENCH-n1 COV {\"pkg/m.py\": {\"1\": 1}}\n";
        let r = read(out, "n1");
        assert_eq!(r.coverage.as_deref(), Some("{\"pkg/m.py\": {\"1\": 1}}\n"));
        assert_eq!(r.log, "PASSED tests/t.py::a\n");
        assert_eq!(
            read("REPROBENCH-n1 START 1\nREPROBENCH-n1 END 0 2\n", "n1").coverage,
            None
        );
    }
}
