//! Repository mirrors: `REPOS/OWNER__NAME.git`, bare. For datasets that ship their sources
//! (swt-mini), `prepare` builds each mirror from the source tree with a fixed identity and date,
//! so the commit id is the same on every machine and matches the rows' `base_commit`.

use reprobench_proto::swt::{SwtInstance, mirror_name};
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Fixed author/committer date of dataset commits.
const DATE: &str = "2024-01-01T00:00:00Z";

/// What `prepare` did for one repository.
#[derive(Debug, Clone, PartialEq)]
pub struct MirrorReport {
    /// `owner/name`.
    pub repo: String,
    /// The mirror.
    pub mirror: PathBuf,
    /// The commit made.
    pub commit: String,
    /// The mirror already had it.
    pub already_present: bool,
}

fn git(args: &[&str], cwd: &Path) -> Result<String, String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(cwd)
        .env("GIT_AUTHOR_NAME", "reprobench")
        .env("GIT_AUTHOR_EMAIL", "datasets@reprobench.invalid")
        .env("GIT_AUTHOR_DATE", DATE)
        .env("GIT_COMMITTER_NAME", "reprobench")
        .env("GIT_COMMITTER_EMAIL", "datasets@reprobench.invalid")
        .env("GIT_COMMITTER_DATE", DATE)
        .output()
        .map_err(|e| format!("cannot run git (is it installed?): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "git {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Whether a mirror has a commit.
pub fn has_commit(mirror: &Path, commit: &str) -> bool {
    Command::new("git")
        .arg("-C")
        .arg(mirror)
        .args(["cat-file", "-e", &format!("{commit}^{{commit}}")])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Copies a source tree, leaving out caches, with regular files at mode 0644.
fn copy_sources(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::create_dir_all(to).map_err(|e| format!("creating {}: {e}", to.display()))?;
    let entries =
        std::fs::read_dir(from).map_err(|e| format!("reading {}: {e}", from.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| e.to_string())?;
        let name = entry.file_name();
        let name_s = name.to_string_lossy();
        if name_s == "__pycache__" || name_s == ".git" || name_s.ends_with(".pyc") {
            continue;
        }
        let src = entry.path();
        let dst = to.join(&name);
        if src.is_dir() {
            copy_sources(&src, &dst)?;
        } else {
            std::fs::copy(&src, &dst).map_err(|e| format!("copying {}: {e}", src.display()))?;
            std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o644))
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// Builds the mirrors of the repositories the instances use from `sources/NAME/`, checking that
/// each commit made equals the rows' `base_commit`.
pub fn prepare(
    sources: &Path,
    repos: &Path,
    instances: &[SwtInstance],
) -> Result<Vec<MirrorReport>, String> {
    let mut wanted: BTreeMap<&str, &str> = BTreeMap::new();
    for inst in instances {
        if let Some(other) = wanted.insert(&inst.repo, &inst.base_commit)
            && other != inst.base_commit
        {
            return Err(format!(
                "instances of {} use several base commits ({other}, {}); a source tree makes one commit",
                inst.repo, inst.base_commit
            ));
        }
    }
    // Absolute: git runs in a scratch directory below, where a relative path would be lost.
    let repos = &std::path::absolute(repos).map_err(|e| format!("{}: {e}", repos.display()))?;
    std::fs::create_dir_all(repos).map_err(|e| format!("creating {}: {e}", repos.display()))?;
    let mut reports = Vec::new();
    for (repo, commit) in wanted {
        let mirror = repos.join(mirror_name(repo));
        if has_commit(&mirror, commit) {
            reports.push(MirrorReport {
                repo: repo.into(),
                mirror,
                commit: commit.into(),
                already_present: true,
            });
            continue;
        }
        let name = repo.rsplit('/').next().unwrap_or(repo);
        let src = sources.join(name);
        if !src.is_dir() {
            return Err(format!("no source tree for {repo} at {}", src.display()));
        }
        let work = tempfile::tempdir().map_err(|e| e.to_string())?;
        let tree = work.path().join("tree");
        copy_sources(&src, &tree)?;
        git(&["init", "-q", "-b", "main", "."], &tree)?;
        git(&["add", "-A"], &tree)?;
        git(
            &[
                "-c",
                "core.autocrlf=false",
                "-c",
                "commit.gpgsign=false",
                "commit",
                "-q",
                "-m",
                &format!("Import {name}"),
            ],
            &tree,
        )?;
        let made = git(&["rev-parse", "HEAD"], &tree)?;
        if made != commit {
            return Err(format!(
                "the source tree of {repo} makes commit {made}, but the dataset's rows say {commit}; the sources and rows disagree"
            ));
        }
        let _ = std::fs::remove_dir_all(&mirror);
        git(
            &[
                "clone",
                "-q",
                "--bare",
                tree.to_str().unwrap_or("."),
                mirror.to_str().unwrap_or("mirror.git"),
            ],
            work.path(),
        )?;
        reports.push(MirrorReport {
            repo: repo.into(),
            mirror,
            commit: made,
            already_present: false,
        });
    }
    Ok(reports)
}

/// A file of `mirror` at `commit`, `None` when the commit has no such file.
pub fn file_at(mirror: &Path, commit: &str, path: &str) -> Option<String> {
    let out = Command::new("git")
        .arg("--git-dir")
        .arg(mirror)
        .args(["show", &format!("{commit}:{path}")])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The requirements of a repository at `commit` as SWT-bench assembles them: the first of
/// `paths` that exists, its `-r FILE` includes (relative to its directory) inlined first, and
/// lines starting with `-e .`, `#` or `.[test` left out.
pub fn requirements_at(mirror: &Path, commit: &str, paths: &[String]) -> Result<String, String> {
    let (path, text) = paths
        .iter()
        .find_map(|p| file_at(mirror, commit, p).map(|t| (p.clone(), t)))
        .ok_or_else(|| {
            format!(
                "no requirements file at {} in commit {commit} of {}",
                paths.join(" or "),
                mirror.display()
            )
        })?;
    Ok(assemble_requirements(&path, &text, |included| {
        file_at(mirror, commit, included)
    }))
}

/// SWT-bench's `get_requirements_by_commit` over a file and a reader of its includes. Pure.
fn assemble_requirements(path: &str, text: &str, read: impl Fn(&str) -> Option<String>) -> String {
    let excluded = |line: &str| {
        let t = line.trim();
        t.starts_with("-e .") || t.starts_with('#') || t.starts_with(".[test")
    };
    let dir = path.rsplit_once('/').map_or("", |(d, _)| d);
    let (mut included, mut own) = (Vec::new(), Vec::new());
    for line in text.split('\n') {
        if let Some(file) = line.trim().strip_prefix("-r") {
            let file = file.trim();
            let full = if dir.is_empty() {
                file.to_string()
            } else {
                format!("{dir}/{file}")
            };
            if let Some(extra) = read(&full) {
                included.extend(
                    extra
                        .split('\n')
                        .filter(|l| !excluded(l))
                        .map(str::to_string),
                );
            }
        } else if !excluded(line) {
            own.push(line.to_string());
        }
    }
    included.push(own.join("\n"));
    included.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inst(repo: &str, commit: &str) -> SwtInstance {
        serde_json::from_value(serde_json::json!({
            "instance_id": "x", "repo": repo, "base_commit": commit, "patch": "", "test_patch": "", "problem_statement": ""
        }))
        .unwrap()
    }

    #[test]
    fn builds_a_reproducible_mirror_and_refuses_a_mismatch() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src/lib");
        std::fs::create_dir_all(src.join("pkg/__pycache__")).unwrap();
        std::fs::write(src.join("pkg/__init__.py"), "X = 1\n").unwrap();
        std::fs::write(src.join("pkg/__pycache__/junk.pyc"), "junk").unwrap();
        let repos = dir.path().join("repos");
        let err = prepare(
            &dir.path().join("src"),
            &repos,
            &[inst("o/lib", &"0".repeat(40))],
        )
        .unwrap_err();
        let made = err
            .split("makes commit ")
            .nth(1)
            .unwrap()
            .split(',')
            .next()
            .unwrap()
            .to_string();
        let r = prepare(&dir.path().join("src"), &repos, &[inst("o/lib", &made)]).unwrap();
        assert_eq!(r[0].commit, made);
        assert!(!r[0].already_present);
        assert!(has_commit(&repos.join("o__lib.git"), &made));
        let again = prepare(&dir.path().join("src"), &repos, &[inst("o/lib", &made)]).unwrap();
        assert!(again[0].already_present);
    }
}

#[cfg(test)]
mod requirements_tests {
    use super::assemble_requirements;

    #[test]
    fn includes_come_first_and_editables_and_comments_go() {
        let got = assemble_requirements(
            "requirements/dev.txt",
            "# dev\n-r tests.txt\n-e .\nblack==23.1\n",
            |p| (p == "requirements/tests.txt").then(|| "pytest==7.3\n# c\n.[test]\n".into()),
        );
        assert_eq!(got, "pytest==7.3\n\nblack==23.1\n");
    }
}
