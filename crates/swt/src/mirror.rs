//! Repository mirrors: `REPOS/OWNER__NAME.git`, bare. For datasets that ship their sources
//! (swt-mini), `prepare` builds each mirror from the source tree with a fixed identity and date,
//! so the commit id is the same on every machine and matches the rows' `base_commit`.

use reprobench_domain::swt::{SwtInstance, mirror_name};
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

/// Why mirrors could not be built, or a file could not be read from one.
// Underlying errors are in the messages, not `source()`: anyhow's `{:#}` would repeat them.
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    /// git could not be started.
    #[error("cannot run git (is it installed?): {0}")]
    CannotRunGit(std::io::Error),
    /// A git command failed.
    #[error("git {} failed: {stderr}", .args.join(" "))]
    Git {
        /// Its arguments.
        args: Vec<String>,
        /// git's error output.
        stderr: String,
    },
    /// A directory could not be created.
    #[error("creating {}: {error}", path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// A directory of a source tree could not be listed.
    #[error("reading {}: {error}", path.display())]
    ReadDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// An entry of a source tree's directory could not be read.
    #[error("{0}")]
    ReadEntry(std::io::Error),
    /// A file of a source tree could not be copied.
    #[error("copying {}: {error}", path.display())]
    Copy {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// A copied file's mode could not be set.
    #[error("{error}")]
    SetMode {
        /// The copy.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The mirrors' directory has no absolute path.
    #[error("{}: {error}", path.display())]
    NoAbsolutePath {
        /// The directory as given.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// No scratch directory for building a mirror.
    #[error("{0}")]
    ScratchDir(std::io::Error),
    /// Instances of one repository with different base commits.
    #[error(
        "instances of {repo} use several base commits ({first}, {second}); a source tree makes one commit"
    )]
    SeveralBaseCommits {
        /// `owner/name`.
        repo: String,
        /// One base commit.
        first: String,
        /// Another.
        second: String,
    },
    /// No source tree for a repository.
    #[error("no source tree for {repo} at {}", path.display())]
    NoSourceTree {
        /// `owner/name`.
        repo: String,
        /// Where it should be.
        path: PathBuf,
    },
    /// The source tree makes another commit than the rows name.
    #[error(
        "the source tree of {repo} makes commit {made}, but the dataset's rows say {expected}; the sources and rows disagree"
    )]
    CommitMismatch {
        /// `owner/name`.
        repo: String,
        /// The commit the source tree makes.
        made: String,
        /// The rows' base commit.
        expected: String,
    },
    /// None of the requirement files is in the commit.
    #[error(
        "no requirements file at {} in commit {commit} of {}",
        .paths.join(" or "),
        mirror.display()
    )]
    NoRequirementsFile {
        /// The files looked for.
        paths: Vec<String>,
        /// The commit.
        commit: String,
        /// The mirror.
        mirror: PathBuf,
    },
}

fn git(args: &[&str], cwd: &Path) -> Result<String, MirrorError> {
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
        .map_err(MirrorError::CannotRunGit)?;
    if !out.status.success() {
        return Err(MirrorError::Git {
            args: args.iter().map(|a| a.to_string()).collect(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
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
fn copy_sources(from: &Path, to: &Path) -> Result<(), MirrorError> {
    std::fs::create_dir_all(to).map_err(|error| MirrorError::CreateDir {
        path: to.to_path_buf(),
        error,
    })?;
    let entries = std::fs::read_dir(from).map_err(|error| MirrorError::ReadDir {
        path: from.to_path_buf(),
        error,
    })?;
    for entry in entries {
        let entry = entry.map_err(MirrorError::ReadEntry)?;
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
            std::fs::copy(&src, &dst).map_err(|error| MirrorError::Copy {
                path: src.clone(),
                error,
            })?;
            std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o644))
                .map_err(|error| MirrorError::SetMode { path: dst, error })?;
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
) -> Result<Vec<MirrorReport>, MirrorError> {
    let mut wanted: BTreeMap<&str, &str> = BTreeMap::new();
    for inst in instances {
        if let Some(other) = wanted.insert(&inst.repo, &inst.base_commit)
            && other != inst.base_commit
        {
            return Err(MirrorError::SeveralBaseCommits {
                repo: inst.repo.clone(),
                first: other.to_string(),
                second: inst.base_commit.clone(),
            });
        }
    }
    // Absolute: git runs in a scratch directory below, where a relative path would be lost.
    let repos = &std::path::absolute(repos).map_err(|error| MirrorError::NoAbsolutePath {
        path: repos.to_path_buf(),
        error,
    })?;
    std::fs::create_dir_all(repos).map_err(|error| MirrorError::CreateDir {
        path: repos.clone(),
        error,
    })?;
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
            return Err(MirrorError::NoSourceTree {
                repo: repo.to_string(),
                path: src,
            });
        }
        let work = tempfile::tempdir().map_err(MirrorError::ScratchDir)?;
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
            return Err(MirrorError::CommitMismatch {
                repo: repo.to_string(),
                made,
                expected: commit.to_string(),
            });
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
pub fn requirements_at(
    mirror: &Path,
    commit: &str,
    paths: &[String],
) -> Result<String, MirrorError> {
    let (path, text) = paths
        .iter()
        .find_map(|p| file_at(mirror, commit, p).map(|t| (p.clone(), t)))
        .ok_or_else(|| MirrorError::NoRequirementsFile {
            paths: paths.to_vec(),
            commit: commit.to_string(),
            mirror: mirror.to_path_buf(),
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
        let message = err.to_string();
        let MirrorError::CommitMismatch { made, .. } = err else {
            panic!("not a commit mismatch: {message}");
        };
        assert!(
            message.contains(&format!("makes commit {made}, ")),
            "{message}"
        );
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
