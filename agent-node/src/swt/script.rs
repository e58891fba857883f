//! The script one SWT execution runs inside its sandbox, and how its output is read back. Pure.
//!
//! The script applies the test patch and (for "post" runs) the golden code patch with the
//! SWE-bench fallback chain (`git apply --verbose` → `git apply --verbose --reject` →
//! `patch --batch --fuzz=5 -p1 -i`, starting from a clean tree each time), removes its own files,
//! prints a start marker carrying a per-execution nonce, runs the test command, prints an end
//! marker, and exits with the test command's exit code. The exit code is taken from the
//! sandbox, not from printed text.

use crate::sandbox::InputFile;

/// Directory (inside the repository) holding the harness's files during an execution.
pub const HARNESS_DIR: &str = ".reprobench";
/// Exit code of the script when the test patch does not apply.
pub const EXIT_TEST_PATCH_FAILED: i64 = 97;
/// Exit code of the script when the golden code patch does not apply.
pub const EXIT_CODE_PATCH_FAILED: i64 = 98;

/// One execution's inputs.
#[derive(Debug, Clone)]
pub struct Plan<'a> {
    /// Test patch to apply first (none for the base run).
    pub test_patch: Option<&'a str>,
    /// Golden code patch to apply after it ("post" runs).
    pub code_patch: Option<&'a str>,
    /// Test command, e.g. `python -m pytest -rA -p no:cacheprovider`.
    pub test_cmd: &'a str,
    /// Test directives appended to the command.
    pub directives: &'a [String],
    /// Random marker text, unknown to the code under test.
    pub nonce: &'a str,
}

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
    for (label, patch, code) in [
        ("test", plan.test_patch, EXIT_TEST_PATCH_FAILED),
        ("code", plan.code_patch, EXIT_CODE_PATCH_FAILED),
    ] {
        if let Some(p) = patch {
            let name = format!("{HARNESS_DIR}/{label}.patch");
            files.push(InputFile {
                path: name.clone(),
                contents: p.as_bytes().to_vec(),
                mode: 0o644,
            });
            steps.push_str(&format!("apply {label} {name} || exit {code}\n"));
        }
    }
    let directives: Vec<String> = plan.directives.iter().map(|d| shell_quote(d)).collect();
    let script = format!(
        r#"#!/bin/bash
# reprobench SWT execution script
set -u
N={nonce}
export GIT_AUTHOR_NAME=reprobench GIT_AUTHOR_EMAIL=harness@reprobench.invalid
export GIT_COMMITTER_NAME=reprobench GIT_COMMITTER_EMAIL=harness@reprobench.invalid
git init -q . 2>/dev/null
echo '{dir}/' >> .git/info/exclude
git add -A >/dev/null 2>&1 && git commit -q --allow-empty --no-verify -m reprobench-base >/dev/null 2>&1
clean() {{ git reset -q --hard >/dev/null 2>&1; git clean -qfd >/dev/null 2>&1; }}
apply() {{
  if git apply --verbose "$2" >/dev/null 2>&1; then m=git-apply
  else clean; if git apply --verbose --reject "$2" >/dev/null 2>&1; then m=git-apply-reject
  else clean; if patch --batch --fuzz=5 -p1 -i "$2" >/dev/null 2>&1; then m=patch-fuzz
  else clean; echo "REPROBENCH-$N APPLY-FAILED $1"; return 1; fi; fi; fi
  git add -A >/dev/null 2>&1 && git commit -q --no-verify -m "reprobench-$1" >/dev/null 2>&1
  echo "REPROBENCH-$N APPLIED $1 $m"
}}
{steps}rm -rf {dir}
echo "REPROBENCH-$N START $(date +%s%N)"
{cmd} {directives}
rc=$?
echo "REPROBENCH-$N END $rc $(date +%s%N)"
exit $rc
"#,
        nonce = plan.nonce,
        dir = HARNESS_DIR,
        cmd = plan.test_cmd,
        directives = directives.join(" "),
    );
    let script_path = format!("{HARNESS_DIR}/run.sh");
    files.push(InputFile {
        path: script_path.clone(),
        contents: script.into_bytes(),
        mode: 0o755,
    });
    (files, vec!["bash".into(), script_path])
}

/// What the script's output says.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ScriptReport {
    /// How the test patch applied (`git-apply`, `git-apply-reject`, `patch-fuzz`), if it was given and applied.
    pub test_patch_method: Option<String>,
    /// How the golden code patch applied.
    pub code_patch_method: Option<String>,
    /// Which patch failed to apply (`test` or `code`).
    pub apply_failed: Option<String>,
    /// The tests started.
    pub started: bool,
    /// The test runner's output (between the markers; to the end if the end marker is missing).
    pub test_log: String,
    /// Nanoseconds the test command itself ran (from the script's own clock), when both markers were printed.
    pub test_ns: Option<u64>,
}

/// Reads the markers of a script's output.
pub fn read(output: &str, nonce: &str) -> ScriptReport {
    let tag = format!("REPROBENCH-{nonce} ");
    let mut r = ScriptReport::default();
    let mut log = String::new();
    let mut in_tests = false;
    let mut start_ns: Option<u64> = None;
    for line in output.lines() {
        if let Some(rest) = line.strip_prefix(&tag) {
            let words: Vec<&str> = rest.split_whitespace().collect();
            match words.as_slice() {
                ["APPLIED", "test", m] if !r.started => r.test_patch_method = Some(m.to_string()),
                ["APPLIED", "code", m] if !r.started => r.code_patch_method = Some(m.to_string()),
                ["APPLY-FAILED", which] if !r.started => r.apply_failed = Some(which.to_string()),
                ["START", rest @ ..] if !r.started => {
                    r.started = true;
                    in_tests = true;
                    start_ns = rest.first().and_then(|t| t.parse::<u64>().ok());
                }
                ["END", _, rest @ ..] if in_tests => {
                    in_tests = false;
                    let end_ns = rest.first().and_then(|t| t.parse::<u64>().ok());
                    r.test_ns = start_ns.zip(end_ns).map(|(a, b)| b.saturating_sub(a));
                }
                _ => {}
            }
            continue;
        }
        if in_tests {
            log.push_str(line);
            log.push('\n');
        }
    }
    r.test_log = log;
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_files_and_command() {
        let d = vec!["tests/test a.py".to_string()];
        let plan = Plan {
            test_patch: Some("T"),
            code_patch: Some("C"),
            test_cmd: "python -m pytest",
            directives: &d,
            nonce: "n1",
        };
        let (files, cmd) = build(&plan);
        assert_eq!(cmd, vec!["bash", ".reprobench/run.sh"]);
        let names: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            names,
            vec![
                ".reprobench/test.patch",
                ".reprobench/code.patch",
                ".reprobench/run.sh"
            ]
        );
        let script = String::from_utf8(files[2].contents.clone()).unwrap();
        assert!(script.contains("python -m pytest 'tests/test a.py'"));
        assert!(script.find("apply test").unwrap() < script.find("apply code").unwrap());
        let base = Plan {
            test_patch: None,
            code_patch: None,
            ..plan
        };
        assert_eq!(build(&base).0.len(), 1);
    }

    #[test]
    fn reads_markers_and_ignores_forged_ones() {
        let out = "REPROBENCH-n1 APPLIED test git-apply\n\
                   REPROBENCH-n1 APPLIED code patch-fuzz\n\
                   REPROBENCH-n1 START 1000\n\
                   PASSED tests/t.py::a\n\
                   REPROBENCH-n1 APPLIED test forged\n\
                   REPROBENCH-other END 0\n\
                   REPROBENCH-n1 END 1 5000\n\
                   trailing\n";
        let r = read(out, "n1");
        assert_eq!(r.test_patch_method.as_deref(), Some("git-apply"));
        assert_eq!(r.code_patch_method.as_deref(), Some("patch-fuzz"));
        assert!(r.started);
        assert_eq!(r.test_log, "PASSED tests/t.py::a\nREPROBENCH-other END 0\n");
        assert_eq!(r.test_ns, Some(4000));
        let failed = read("REPROBENCH-n1 APPLY-FAILED test\n", "n1");
        assert_eq!(failed.apply_failed.as_deref(), Some("test"));
        assert!(!failed.started);
        let hung = read("REPROBENCH-n1 START\nstill running\n", "n1");
        assert_eq!(hung.test_log, "still running\n");
    }
}
