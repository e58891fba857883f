//! How every sandbox prepares the tree an execution's command runs in, out of the command's
//! sight. Pure: the shell script and the reading of what it printed.
//!
//! The prepared repository is copied to a *stage* the command never sees. The stage gets the
//! request's files and then its patches, each with `git apply -v` as SWT-bench applies them
//! (and, for one that fails, a dry run of `patch --fuzz=5` to tell whether fuzz would have
//! applied it). Then the stage is *sealed*: its git repository is replaced by a new one whose
//! single commit is the tree as it now is, with a fixed identity and date, holding only that
//! commit and its trees (written afresh, so nothing tells which objects are new) and an index
//! with no file times in it. Finally the stage is archived in name order with one modification
//! time for every entry ([`archive_args`]) and unpacked on a file system of its own, where the
//! command runs. So the tree the command sees is the same whichever patches went in, but for
//! their content: git's view is one commit and a clean status, every file has the same time,
//! files are created in name order (their inode numbers and creation times follow the names),
//! and no patch, script, marker or earlier state is left in it.

/// The modification time of every entry of a sealed tree, and the date of its commit:
/// 2000-01-01T00:00:00Z, as the prepared repository's own commit has.
pub const SEAL_TIME: i64 = 946_684_800;

/// The environment variable that names, in the command's environment, the directory holding
/// the request's support files.
pub const SUPPORT_ENV: &str = "REPROBENCH_SUPPORT";

/// How one patch went.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PatchOutcome {
    /// The patch's label (`code`, `test`).
    pub which: String,
    /// `git apply -v` succeeded.
    pub applied: bool,
    /// It failed, but `patch --fuzz=5` would have applied it.
    pub fuzz_would_apply: bool,
}

/// Shell functions (POSIX sh) that apply a patch (`apply LABEL FILE`) and seal the working
/// directory (`seal SCRATCH`), printing marker lines that start with `REPROBENCH-$N `; `N` must
/// be set (an unguessable nonce) and the working directory must be the stage, a git repository.
/// The user's and the system's git configuration play no part.
pub const FUNCTIONS: &str = r#"export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
apply() {
  git apply -v "$2" 2>&1
  rc=$?
  if [ "$rc" -eq 0 ]; then echo "REPROBENCH-$N APPLY $1 0 -"; return 0; fi
  if patch --dry-run --batch --fuzz=5 -p1 -i "$2" >/dev/null 2>&1; then f=fuzz; else f=no; fi
  echo "REPROBENCH-$N APPLY $1 $rc $f"
}
seal() {
  # Bytecode caches of the tree's sources go: every file is about to get one time, so a cache
  # of a source's earlier text of the same size would pass Python's check and run instead.
  find . -path ./.git -prune -o -type f \( -name '*.pyc' -o -name '*.pyo' \) -print |
  while IFS= read -r f; do
    d=${f%/*}; b=${f##*/}; n=${b%%.*}
    case "$d" in */__pycache__) src="${d%/__pycache__}/$n.py" ;; *) src="$d/$n.py" ;; esac
    if [ -f "$src" ]; then rm -f "$f"; fi
  done
  # Only files whose size or time changed are hashed again (the copy kept the times).
  git -c core.checkStat=minimal -c core.trustctime=false add -A >/dev/null 2>&1 || return 1
  tree=$(git write-tree) || return 1
  export GIT_AUTHOR_NAME=reprobench GIT_AUTHOR_EMAIL=reprobench@localhost \
    GIT_COMMITTER_NAME=reprobench GIT_COMMITTER_EMAIL=reprobench@localhost \
    GIT_AUTHOR_DATE=2000-01-01T00:00:00Z GIT_COMMITTER_DATE=2000-01-01T00:00:00Z
  commit=$(echo 'reprobench: base commit' | git commit-tree "$tree") || return 1
  rm -rf "$1/repo" && git init -q "$1/repo" || return 1
  # The commit and its trees, each object written whole and afresh: none is a delta of the
  # prepared repository's objects, so none tells that it is new.
  git rev-list --objects --no-object-names --filter=blob:none "$commit" \
    | git pack-objects -q --stdout --no-reuse-object --window=0 --depth=0 \
    | git -C "$1/repo" index-pack --stdin >/dev/null || return 1
  git -C "$1/repo" update-ref HEAD "$commit" || return 1
  git -C "$1/repo" read-tree "$commit" || return 1
  rm -rf .git && mv "$1/repo/.git" .git && rm -rf "$1/repo"
}
"#;

/// The shell lines that apply `patches` (label, file) in order and seal the working directory
/// with `scratch` as scratch space, after [`FUNCTIONS`]; the last marker is `SEALED`, or
/// `SEAL-FAILED` when sealing failed.
pub fn steps(patches: &[(String, String)], scratch: &str) -> String {
    let mut out = String::new();
    for (label, file) in patches {
        out.push_str(&format!("apply {} {}\n", quote(label), quote(file)));
    }
    out.push_str(&format!(
        "if seal {}; then echo \"REPROBENCH-$N SEALED\"; else echo \"REPROBENCH-$N SEAL-FAILED\"; fi\n",
        quote(scratch)
    ));
    out
}

/// `tar` arguments that archive the working directory (the sealed stage) to standard output in
/// name order, every entry with [`SEAL_TIME`] and, when given, the owner `uid`.
pub fn archive_args(uid: Option<u32>) -> Vec<String> {
    let mut args = vec![
        "--sort=name".to_string(),
        format!("--mtime=@{SEAL_TIME}"),
        "--numeric-owner".to_string(),
        "--format=gnu".to_string(),
    ];
    if let Some(uid) = uid {
        args.push(format!("--owner={uid}"));
        args.push(format!("--group={uid}"));
    }
    args.extend(["-cf", "-", "."].map(String::from));
    args
}

/// What preparing the tree printed: the log (`git apply -v`'s output, without the markers), how
/// each patch went, and whether the tree was sealed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StageReport {
    /// The output without the marker lines.
    pub log: String,
    /// The patches, in the order they were applied.
    pub patches: Vec<PatchOutcome>,
    /// The tree was sealed.
    pub sealed: bool,
}

/// Reads the output of [`steps`] (`nonce`: the one `N` was set to).
pub fn read(output: &str, nonce: &str) -> StageReport {
    let tag = format!("REPROBENCH-{nonce} ");
    let mut r = StageReport::default();
    for line in output.split_inclusive('\n') {
        let Some(rest) = line.strip_prefix(&tag) else {
            r.log.push_str(line);
            continue;
        };
        match rest.split_whitespace().collect::<Vec<_>>().as_slice() {
            ["APPLY", which, rc, fuzz] => r.patches.push(PatchOutcome {
                which: which.to_string(),
                applied: *rc == "0",
                fuzz_would_apply: *fuzz == "fuzz",
            }),
            ["SEALED"] => r.sealed = true,
            ["SEAL-FAILED"] => {}
            _ => r.log.push_str(line),
        }
    }
    r
}

/// `s` as one shell word (quoted only when it needs to be).
pub fn quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-:=+,".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::process::Command;

    fn sh(dir: &Path, script: &str) -> String {
        let out = Command::new("sh")
            .args(["-c", script])
            .current_dir(dir)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{script}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A stage as a sandbox has it: a one-commit repository (as `tree::checkout` makes it).
    fn stage(root: &Path) -> std::path::PathBuf {
        let dir = root.join("stage");
        std::fs::create_dir_all(dir.join("pkg")).unwrap();
        std::fs::write(dir.join("pkg/m.py"), "def f():\n    return 1\n").unwrap();
        std::fs::write(dir.join("pkg/other.py"), "X = 1\n").unwrap();
        std::fs::write(dir.join(".gitignore"), "build/\n").unwrap();
        sh(&dir, &crate::tree::base_commit_script(&[]));
        // An install artifact the repository ignores.
        std::fs::create_dir_all(dir.join("build")).unwrap();
        std::fs::write(dir.join("build/x.so"), "bin").unwrap();
        dir
    }

    const FIX: &str = "diff --git a/pkg/m.py b/pkg/m.py\n--- a/pkg/m.py\n+++ b/pkg/m.py\n@@ -1,2 +1,2 @@\n def f():\n-    return 1\n+    return 2\n";
    const TEST: &str = "diff --git a/tests/test_m.py b/tests/test_m.py\nnew file mode 100644\n--- /dev/null\n+++ b/tests/test_m.py\n@@ -0,0 +1 @@\n+assert True\n";

    fn prepare(root: &Path, patches: &[(&str, &str)]) -> (std::path::PathBuf, StageReport) {
        let dir = stage(root);
        let mut files = Vec::new();
        for (i, (label, text)) in patches.iter().enumerate() {
            let f = root.join(format!("{i}.patch"));
            std::fs::write(&f, text).unwrap();
            files.push((label.to_string(), f.display().to_string()));
        }
        let scratch = root.join("scratch");
        std::fs::create_dir(&scratch).unwrap();
        let script = format!(
            "N=n1\n{FUNCTIONS}{}",
            steps(&files, &scratch.display().to_string())
        );
        let out = sh(&dir, &script);
        (dir, read(&out, "n1"))
    }

    #[test]
    fn the_sealed_tree_is_one_commit_of_what_the_patches_made_and_a_clean_status() {
        let root = tempfile::tempdir().unwrap();
        let (dir, report) = prepare(
            root.path(),
            &[("code", FIX), ("test", TEST), ("test", "garbage\n")],
        );
        assert!(report.sealed, "{report:?}");
        assert_eq!(
            report
                .patches
                .iter()
                .map(|p| (p.which.as_str(), p.applied))
                .collect::<Vec<_>>(),
            [("code", true), ("test", true), ("test", false)]
        );
        assert!(
            report.log.contains("Applied patch pkg/m.py cleanly."),
            "{}",
            report.log
        );
        assert!(!report.log.contains("REPROBENCH-"), "{}", report.log);
        // One commit, the fixed identity and date, the patched tree, a clean status.
        assert_eq!(sh(&dir, "git rev-list --count HEAD").trim(), "1");
        assert_eq!(
            sh(&dir, "git log -1 --format='%an %ad %s' --date=unix").trim(),
            "reprobench 946684800 reprobench: base commit"
        );
        assert_eq!(
            sh(&dir, "git ls-tree -r --name-only HEAD"),
            ".gitignore\npkg/m.py\npkg/other.py\ntests/test_m.py\n"
        );
        assert_eq!(sh(&dir, "git status --porcelain"), "");
        assert_eq!(sh(&dir, "git diff HEAD --stat"), "");
        // Only the commit and its trees: no blob, so none old and none new.
        let objects = sh(
            &dir,
            "git cat-file --batch-all-objects --batch-check='%(objecttype)'",
        );
        assert!(!objects.contains("blob"), "{objects}");
        assert_eq!(objects.lines().filter(|l| *l == "commit").count(), 1);
    }

    #[test]
    fn the_repository_has_the_same_shape_whichever_patches_went_in() {
        // What a test can ask git about, beyond the tree itself: the same before and after the fix.
        let shape = |patches: &[(&str, &str)]| {
            let root = tempfile::tempdir().unwrap();
            let (dir, report) = prepare(root.path(), patches);
            assert!(report.sealed);
            sh(
                &dir,
                "git count-objects -v | grep -v size; git rev-list --all --count; \
                 git cat-file --batch-all-objects --batch-check='%(objecttype)' | sort | uniq -c; \
                 git status --porcelain --ignored; git stash list; git reflog | wc -l; \
                 find .git -type f | grep -v '/objects/pack/' | sort",
            )
        };
        assert_eq!(
            shape(&[("test", TEST)]),
            shape(&[("code", FIX), ("test", TEST)])
        );
    }

    #[test]
    fn bytecode_caches_of_the_trees_sources_go_and_others_stay() {
        let root = tempfile::tempdir().unwrap();
        let dir = stage(root.path());
        std::fs::create_dir_all(dir.join("pkg/__pycache__")).unwrap();
        for f in [
            "pkg/__pycache__/m.cpython-311.pyc",
            "pkg/other.pyc",
            "pkg/__pycache__/gone.cpython-311.pyc",
            "pkg/only.pyc",
        ] {
            std::fs::write(dir.join(f), "bytecode").unwrap();
        }
        let scratch = root.path().join("scratch");
        std::fs::create_dir(&scratch).unwrap();
        let out = sh(
            &dir,
            &format!(
                "N=n1\n{FUNCTIONS}{}",
                steps(&[], &scratch.display().to_string())
            ),
        );
        assert!(read(&out, "n1").sealed, "{out}");
        // Caches of sources that are there go; a bytecode file without its source is content.
        assert!(!dir.join("pkg/__pycache__/m.cpython-311.pyc").exists());
        assert!(!dir.join("pkg/other.pyc").exists());
        assert!(dir.join("pkg/__pycache__/gone.cpython-311.pyc").exists());
        assert!(dir.join("pkg/only.pyc").exists());
    }

    #[test]
    fn a_failed_seal_is_reported() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("not-a-repo");
        std::fs::create_dir(&dir).unwrap();
        let out = sh(
            &dir,
            &format!("N=n1\n{FUNCTIONS}{}", steps(&[], "/nonexistent/x")),
        );
        let r = read(&out, "n1");
        assert!(!r.sealed, "{out}");
    }

    #[test]
    fn markers_of_another_nonce_stay_in_the_log() {
        let r = read(
            "Checking patch a.py...\nREPROBENCH-n1 APPLY code 1 fuzz\nREPROBENCH-x SEALED\nREPROBENCH-n1 SEALED\n",
            "n1",
        );
        assert_eq!(r.log, "Checking patch a.py...\nREPROBENCH-x SEALED\n");
        assert_eq!(
            r.patches,
            [PatchOutcome {
                which: "code".into(),
                applied: false,
                fuzz_would_apply: true
            }]
        );
        assert!(r.sealed);
    }
}
