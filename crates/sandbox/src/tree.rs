//! A repository's tree at a commit, written out of a bare mirror into a directory, as a clone
//! followed by a checkout of that commit would leave it (`.gitattributes`' `export-ignore` does
//! not apply, unlike `git archive`).
//!
//! Mirrors may lack objects: a partial clone (`extensions.partialClone`) leaves out blobs over
//! its filter's size, and asks its promisor remote for them when read. The tree is written from
//! a temporary index with those files taken out, so git never goes to the network for them, and
//! the caller is told which files were left out. A blob the mirror replaces (`git update-ref
//! refs/replace/BLOB SUBSTITUTE`, git's own replacement mechanism) is written from its
//! substitute, and the caller is told that too.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Why a commit's tree could not be read or written out of a mirror.
// Underlying errors are in the messages, not `source()`: anyhow's `{:#}` would repeat them.
#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    /// git (or the shell running it) could not be started.
    #[error("cannot run git (is it installed?): {0}")]
    CannotRunGit(std::io::Error),
    /// `git ls-tree` of the commit failed (the mirror lacks it, say).
    #[error("git ls-tree {commit} failed: {stderr}")]
    ListTree {
        /// The commit.
        commit: String,
        /// git's error output.
        stderr: String,
    },
    /// Listing the mirror's replace refs failed.
    #[error("git for-each-ref refs/replace/ failed: {stderr}")]
    ListReplaceRefs {
        /// git's error output.
        stderr: String,
    },
    /// Listing the mirror's substitute tags failed.
    #[error("git for-each-ref failed: {stderr}")]
    ListSubstituteTags {
        /// git's error output.
        stderr: String,
    },
    /// `git rev-list --all` failed.
    #[error("git rev-list --all failed: {stderr}")]
    ListCommits {
        /// git's error output.
        stderr: String,
    },
    /// Talking to `git cat-file --batch-check` failed.
    #[error("git cat-file --batch-check: {0}")]
    BatchCheckIo(std::io::Error),
    /// `git cat-file --batch-check` failed.
    #[error("git cat-file --batch-check in {} failed: {stderr}", mirror.display())]
    BatchCheck {
        /// The mirror.
        mirror: PathBuf,
        /// git's error output.
        stderr: String,
    },
    /// No temporary index could be made next to the destination.
    #[error("cannot make a temporary index beside {}: {error}", dest.display())]
    TemporaryIndex {
        /// The destination directory.
        dest: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// `git read-tree` of the commit failed.
    #[error("git read-tree {commit} failed: {stderr}")]
    ReadTree {
        /// The commit.
        commit: String,
        /// git's error output.
        stderr: String,
    },
    /// Talking to `git update-index` failed.
    #[error("git update-index: {0}")]
    UpdateIndexIo(std::io::Error),
    /// `git update-index --force-remove` (taking the absent files out of the index) failed.
    #[error("git update-index --force-remove failed: {stderr}")]
    RemoveFromIndex {
        /// git's error output.
        stderr: String,
    },
    /// `git checkout-index` into the destination failed.
    #[error("git checkout-index of {commit} into {} failed: {stderr}", dest.display())]
    CheckoutIndex {
        /// The commit.
        commit: String,
        /// The destination directory.
        dest: PathBuf,
        /// git's error output.
        stderr: String,
    },
    /// `git update-ref refs/replace/…` failed.
    #[error("git update-ref refs/replace/… failed: {stderr}")]
    UpdateReplaceRef {
        /// git's error output.
        stderr: String,
    },
    /// Making the destination a repository of its own failed.
    #[error("making {} a git repository failed: {stderr}", dest.display())]
    MakeRepository {
        /// The destination directory.
        dest: PathBuf,
        /// The commands' error output.
        stderr: String,
    },
}

/// A file of the commit's tree that is not written as the commit has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeGap {
    /// Path in the repository.
    pub path: String,
    /// The blob the commit names.
    pub blob: String,
    /// The blob written instead (a replace ref of the mirror); `None`: the file is left out.
    pub substitute: Option<String>,
}

impl TreeGap {
    /// `PATH BLOB SUBSTITUTE|-`, for cache keys.
    pub fn key(&self) -> String {
        format!(
            "{} {} {}",
            self.path,
            self.blob,
            self.substitute.as_deref().unwrap_or("-")
        )
    }

    /// One line for a report's `environment_left_out`.
    pub fn describe(&self, commit: &str) -> String {
        let short = |s: &str| s.chars().take(12).collect::<String>();
        match &self.substitute {
            None => format!(
                "{}: its blob {} at commit {} is not in the mirror (a partial clone's left-out object); checked out without that file",
                self.path,
                short(&self.blob),
                short(commit)
            ),
            Some(sub) => format!(
                "{}: its blob {} at commit {} is replaced by the mirror's refs/replace with {}; checked out with the substitute",
                self.path,
                short(&self.blob),
                short(commit),
                short(sub)
            ),
        }
    }
}

/// git on `mirror`, read-only, never fetching what the mirror lacks (git 2.44+ honours
/// `GIT_NO_LAZY_FETCH`; older ones try the promisor and fail on a machine without network).
fn git(mirror: &Path) -> Command {
    let mut c = Command::new("git");
    // The mirror may belong to another user (git refuses those otherwise).
    c.args(["-c", "safe.directory=*", "--git-dir"])
        .arg(mirror)
        .env("GIT_NO_LAZY_FETCH", "1")
        .stdin(Stdio::null());
    c
}

/// The standard output of `cmd`; when it fails, the error `failed` makes of its error output.
fn output(
    mut cmd: Command,
    failed: impl FnOnce(String) -> TreeError,
) -> Result<Vec<u8>, TreeError> {
    let out = cmd.output().map_err(TreeError::CannotRunGit)?;
    if !out.status.success() {
        return Err(failed(stderr_text(&out.stderr)));
    }
    Ok(out.stdout)
}

/// A command's error output as a message quotes it.
fn stderr_text(stderr: &[u8]) -> String {
    String::from_utf8_lossy(stderr).trim().to_string()
}

/// The entries of `commit`'s tree: `(type, object, path)`, `blob` or `commit` (a submodule).
fn entries(mirror: &Path, commit: &str) -> Result<Vec<(String, String, String)>, TreeError> {
    let mut ls = git(mirror);
    ls.args(["ls-tree", "-r", "-z", "--full-tree", commit]);
    let listing = output(ls, |stderr| TreeError::ListTree {
        commit: commit.to_string(),
        stderr,
    })?;
    // `MODE TYPE OID\tPATH`, NUL-terminated.
    Ok(listing
        .split(|b| *b == 0)
        .filter_map(|entry| {
            let entry = std::str::from_utf8(entry).ok()?;
            let (meta, path) = entry.split_once('\t')?;
            let mut meta = meta.split(' ');
            let (_mode, kind, oid) = (meta.next()?, meta.next()?, meta.next()?);
            Some((kind.to_string(), oid.to_string(), path.to_string()))
        })
        .collect())
}

/// The submodules of `commit`'s tree: `(commit, path)`. A checkout has an empty directory for
/// each, as a clone whose submodules were not initialised has; the one-commit repository records
/// them ([`base_commit_script`]), so `git submodule update --init` works where the network does.
pub fn gitlinks(mirror: &Path, commit: &str) -> Result<Vec<(String, String)>, TreeError> {
    Ok(entries(mirror, commit)?
        .into_iter()
        .filter(|(kind, _, _)| kind == "commit")
        .map(|(_, oid, path)| (oid, path))
        .collect())
}

/// The files of `commit`'s tree that the mirror lacks or replaces, in path order.
pub fn gaps(mirror: &Path, commit: &str) -> Result<Vec<TreeGap>, TreeError> {
    let blobs: Vec<(String, String)> = entries(mirror, commit)?
        .into_iter()
        .filter(|(kind, _, _)| kind == "blob")
        .map(|(_, oid, path)| (oid, path))
        .collect();
    let replaced = replace_refs(mirror)?;
    // One batch query for every blob, with replacement off: which the mirror itself lacks.
    let mut check = git(mirror);
    check
        .env("GIT_NO_REPLACE_OBJECTS", "1")
        .args(["cat-file", "--batch-check=%(objectname) %(objecttype)"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = check.spawn().map_err(TreeError::CannotRunGit)?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    let query: String = blobs.iter().map(|(oid, _)| format!("{oid}\n")).collect();
    let writer = std::thread::spawn(move || stdin.write_all(query.as_bytes()));
    let out = child.wait_with_output().map_err(TreeError::BatchCheckIo)?;
    let _ = writer.join();
    if !out.status.success() {
        return Err(TreeError::BatchCheck {
            mirror: mirror.to_path_buf(),
            stderr: stderr_text(&out.stderr),
        });
    }
    let missing: HashSet<&str> = std::str::from_utf8(&out.stdout)
        .unwrap_or("")
        .lines()
        .filter_map(|l| l.strip_suffix(" missing"))
        .collect();
    let mut gaps: Vec<TreeGap> = blobs
        .iter()
        .filter_map(|(oid, path)| {
            let substitute = replaced.get(oid).cloned();
            (missing.contains(oid.as_str()) || substitute.is_some()).then(|| TreeGap {
                path: path.clone(),
                blob: oid.clone(),
                substitute,
            })
        })
        .collect();
    gaps.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(gaps)
}

/// The mirror's replace refs: replaced object → its substitute.
fn replace_refs(mirror: &Path) -> Result<std::collections::HashMap<String, String>, TreeError> {
    let mut refs = git(mirror);
    refs.args([
        "for-each-ref",
        "--format=%(refname:strip=2) %(objectname)",
        "refs/replace/",
    ]);
    let text = output(refs, |stderr| TreeError::ListReplaceRefs { stderr })?;
    Ok(String::from_utf8_lossy(&text)
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect())
}

/// Writes `commit`'s tree from `mirror` into `dest` (an existing, empty directory): every file
/// the mirror has or replaces; returns the [`gaps`].
pub fn write_tree(mirror: &Path, commit: &str, dest: &Path) -> Result<Vec<TreeGap>, TreeError> {
    let gaps = gaps(mirror, commit)?;
    let index = tempfile::NamedTempFile::new_in(dest.parent().unwrap_or(Path::new("/tmp")))
        .map_err(|error| TreeError::TemporaryIndex {
            dest: dest.to_path_buf(),
            error,
        })?;
    let index_path = index.path().to_path_buf();
    let with_index = |args: &[&str]| {
        let mut c = git(mirror);
        c.env("GIT_INDEX_FILE", &index_path)
            .arg("--work-tree")
            .arg(dest)
            .args(args);
        c
    };
    output(with_index(&["read-tree", commit]), |stderr| {
        TreeError::ReadTree {
            commit: commit.to_string(),
            stderr,
        }
    })?;
    let absent: Vec<&TreeGap> = gaps.iter().filter(|g| g.substitute.is_none()).collect();
    if !absent.is_empty() {
        let mut remove = with_index(&["update-index", "--force-remove", "-z", "--stdin"]);
        remove
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = remove.spawn().map_err(TreeError::CannotRunGit)?;
        let paths: Vec<u8> = absent
            .iter()
            .flat_map(|g| g.path.bytes().chain(std::iter::once(0)))
            .collect();
        child
            .stdin
            .take()
            .expect("piped stdin")
            .write_all(&paths)
            .map_err(TreeError::UpdateIndexIo)?;
        let out = child.wait_with_output().map_err(TreeError::UpdateIndexIo)?;
        if !out.status.success() {
            return Err(TreeError::RemoveFromIndex {
                stderr: stderr_text(&out.stderr),
            });
        }
    }
    output(
        with_index(&["checkout-index", "--all", "--force"]),
        |stderr| TreeError::CheckoutIndex {
            commit: commit.to_string(),
            dest: dest.to_path_buf(),
            stderr,
        },
    )?;
    Ok(gaps)
}

/// Tags of a mirror that carry substitutes for blobs it lacks: `subst/NAME-for-PREFIX`, pointing
/// at a blob, for the missing blob whose id starts with PREFIX (7 or more hex digits). A
/// convention of reprobench's mirror tarballs, applied by `datasets import`.
pub const SUBSTITUTE_TAGS: &str = "refs/tags/subst/";

/// A substitute put in place: the missing blob, the tag, the blob that replaces it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Substitution {
    /// The blob the mirror lacks.
    pub blob: String,
    /// The tag's name under `subst/`.
    pub tag: String,
    /// The blob the tag points at.
    pub substitute: String,
}

/// Pairs missing blobs with substitute tags (`(name under subst/, object)`) by the tags'
/// `-for-PREFIX`; a blob that several tags could stand for gets none.
pub fn match_substitutes(missing: &[String], tags: &[(String, String)]) -> Vec<Substitution> {
    let mut out = Vec::new();
    for blob in missing {
        let fits: Vec<&(String, String)> = tags
            .iter()
            .filter(|(name, _)| {
                name.rsplit_once("-for-").is_some_and(|(_, prefix)| {
                    prefix.len() >= 7
                        && prefix.bytes().all(|b| b.is_ascii_hexdigit())
                        && blob.starts_with(&prefix.to_ascii_lowercase())
                })
            })
            .collect();
        if let [(name, object)] = fits[..] {
            out.push(Substitution {
                blob: blob.clone(),
                tag: name.clone(),
                substitute: object.clone(),
            });
        }
    }
    out
}

/// Makes the mirror's substitute tags ([`SUBSTITUTE_TAGS`]) stand in for the blobs it lacks in
/// any of its commits, as git replace refs, so checkouts use them (and reports name them).
pub fn replace_from_substitute_tags(mirror: &Path) -> Result<Vec<Substitution>, TreeError> {
    let mut list = git(mirror);
    list.args([
        "for-each-ref",
        "--format=%(refname:strip=3) %(objectname) %(objecttype)",
        SUBSTITUTE_TAGS,
    ]);
    let listing = output(list, |stderr| TreeError::ListSubstituteTags { stderr })?;
    let tags: Vec<(String, String)> = String::from_utf8_lossy(&listing)
        .lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let (name, object, kind) = (f.next()?, f.next()?, f.next()?);
            (kind == "blob").then(|| (name.to_string(), object.to_string()))
        })
        .collect();
    if tags.is_empty() {
        return Ok(Vec::new());
    }
    let mut commits = git(mirror);
    commits.args(["rev-list", "--all"]);
    let mut missing: Vec<String> = Vec::new();
    let all_commits = output(commits, |stderr| TreeError::ListCommits { stderr })?;
    for commit in String::from_utf8_lossy(&all_commits).lines() {
        for g in gaps(mirror, commit)? {
            if g.substitute.is_none() && !missing.contains(&g.blob) {
                missing.push(g.blob);
            }
        }
    }
    let subs = match_substitutes(&missing, &tags);
    for s in &subs {
        let mut update = git(mirror);
        update.args([
            "update-ref",
            &format!("refs/replace/{}", s.blob),
            &s.substitute,
        ]);
        output(update, |stderr| TreeError::UpdateReplaceRef { stderr })?;
    }
    Ok(subs)
}

/// Shell commands that make the working directory a git repository with one commit of
/// everything in it (tracked files that the repository's own `.gitignore` matches too) and the
/// submodules `gitlinks` (`(commit, path)`) recorded, with a fixed identity and date. Its objects
/// go into one pack: every execution copies the repository, and thousands of loose objects (one
/// per file) made copying and removing `.git` cost as much as the tree itself. The docker
/// instance layer and [`checkout`] both run it.
pub fn base_commit_script(gitlinks: &[(String, String)]) -> String {
    let mut script = String::from("git init -q . && git add -A -f");
    for (commit, path) in gitlinks {
        script.push_str(&format!(
            " && git update-index --add --cacheinfo 160000,{commit},{}",
            shell_quote(path)
        ));
    }
    script.push_str(
        " && GIT_AUTHOR_NAME=reprobench GIT_AUTHOR_EMAIL=reprobench@localhost \
           GIT_COMMITTER_NAME=reprobench GIT_COMMITTER_EMAIL=reprobench@localhost \
           GIT_AUTHOR_DATE=2000-01-01T00:00:00Z GIT_COMMITTER_DATE=2000-01-01T00:00:00Z \
           git commit -q --no-verify --allow-empty -m 'reprobench: base commit' \
         && git repack -a -d -q && git prune-packed",
    );
    script
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// [`write_tree`] into `dest`, then `dest` made a repository of its own whose one commit is that
/// tree ([`base_commit_script`]), so `git apply` and `git diff` work there; returns the [`gaps`].
/// The user's and the system's git configuration play no part.
pub fn checkout(mirror: &Path, commit: &str, dest: &Path) -> Result<Vec<TreeGap>, TreeError> {
    let gaps = write_tree(mirror, commit, dest)?;
    let out = Command::new("bash")
        .args(["-c", &base_commit_script(&gitlinks(mirror, commit)?)])
        .current_dir(dest)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .stdin(Stdio::null())
        .output()
        .map_err(TreeError::CannotRunGit)?;
    if !out.status.success() {
        return Err(TreeError::MakeRepository {
            dest: dest.to_path_buf(),
            stderr: stderr_text(&out.stderr),
        });
    }
    Ok(gaps)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(dir: &Path, script: &str) -> String {
        let out = Command::new("bash")
            .args(["-ec", script])
            .current_dir(dir)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@t")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@t")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// A bare mirror whose commit has a small file, a big file, an export-ignored file and an
    /// executable; a partial clone of it that left the big file's blob out.
    fn partial_mirror(root: &Path) -> (std::path::PathBuf, String, String) {
        let src = root.join("src");
        std::fs::create_dir(&src).unwrap();
        let commit = sh(
            &src,
            "git init -q . && git config uploadpack.allowFilter true \
             && mkdir -p data && head -c 20000 /dev/zero | tr '\\0' x > data/big.txt \
             && echo small > small.txt && echo 'ci.yml export-ignore' > .gitattributes \
             && echo ci > ci.yml && printf '#!/bin/sh\\n' > run.sh && chmod +x run.sh \
             && git add -A && git commit -qm one && git rev-parse HEAD",
        );
        let big_blob = sh(&src, "git rev-parse HEAD:data/big.txt");
        sh(
            root,
            "git clone -q --bare --no-local --filter=blob:limit=10k \"file://$PWD/src\" mirror.git",
        );
        (root.join("mirror.git"), commit, big_blob)
    }

    #[test]
    fn a_partial_mirror_writes_what_it_has_and_names_what_it_lacks() {
        let root = tempfile::tempdir().unwrap();
        let (mirror, commit, big) = partial_mirror(root.path());
        let dest = root.path().join("tree");
        std::fs::create_dir(&dest).unwrap();
        let gaps = checkout(&mirror, &commit, &dest).unwrap();
        // A repository of its own whose one commit is the tree written.
        assert_eq!(sh(&dest, "git status --porcelain"), "");
        assert_eq!(sh(&dest, "git rev-list --count HEAD"), "1");
        // Its objects packed: no loose object files for executions to copy.
        assert_eq!(sh(&dest, "git count-objects | cut -d' ' -f1"), "0");
        assert_eq!(
            gaps,
            vec![TreeGap {
                path: "data/big.txt".into(),
                blob: big,
                substitute: None
            }]
        );
        assert!(!dest.join("data/big.txt").exists());
        assert_eq!(
            std::fs::read_to_string(dest.join("small.txt")).unwrap(),
            "small\n"
        );
        // A checkout, not an archive: export-ignore does not apply; modes are kept.
        assert!(dest.join("ci.yml").exists());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dest.join("run.sh"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o111, 0o111);
        assert!(gaps[0].describe(&commit).contains("data/big.txt"));
    }

    #[test]
    fn a_replace_ref_supplies_the_missing_file() {
        let root = tempfile::tempdir().unwrap();
        let (mirror, commit, big) = partial_mirror(root.path());
        let sub = sh(&mirror, "echo substitute | git hash-object -w --stdin");
        sh(&mirror, &format!("git update-ref refs/replace/{big} {sub}"));
        let dest = root.path().join("tree");
        std::fs::create_dir(&dest).unwrap();
        let gaps = write_tree(&mirror, &commit, &dest).unwrap();
        assert_eq!(gaps.len(), 1);
        assert_eq!(gaps[0].substitute.as_deref(), Some(sub.as_str()));
        assert_eq!(
            std::fs::read_to_string(dest.join("data/big.txt")).unwrap(),
            "substitute\n"
        );
    }

    #[test]
    fn substitute_tags_match_by_prefix_and_only_when_unambiguous() {
        let missing = vec!["4a48cb86af74".to_string(), "34d568d1aaaa".to_string()];
        let tags = vec![
            ("eopc04-for-4a48cb86".to_string(), "s1".to_string()),
            ("eopc04-for-34d568d1".to_string(), "s2".to_string()),
            ("other-for-34d568".to_string(), "s3".to_string()), // 6 digits: too short
            ("no-prefix".to_string(), "s4".to_string()),
        ];
        let got = match_substitutes(&missing, &tags);
        assert_eq!(got.len(), 2);
        assert_eq!(
            (got[0].tag.as_str(), got[0].substitute.as_str()),
            ("eopc04-for-4a48cb86", "s1")
        );
        assert_eq!(got[1].substitute, "s2");
        let twice = vec![
            ("a-for-4a48cb86".to_string(), "x".to_string()),
            ("b-for-4a48cb8".to_string(), "y".to_string()),
        ];
        assert!(match_substitutes(&missing[..1], &twice).is_empty());
    }

    #[test]
    fn a_substitute_tag_becomes_a_replace_ref() {
        let root = tempfile::tempdir().unwrap();
        let (mirror, commit, big) = partial_mirror(root.path());
        let sub = sh(&mirror, "echo later version | git hash-object -w --stdin");
        sh(
            &mirror,
            &format!("git tag subst/big-for-{} {sub}", &big[..8]),
        );
        let subs = replace_from_substitute_tags(&mirror).unwrap();
        assert_eq!(subs.len(), 1);
        assert_eq!(
            (subs[0].blob.as_str(), subs[0].substitute.as_str()),
            (big.as_str(), sub.as_str())
        );
        let dest = root.path().join("tree");
        std::fs::create_dir(&dest).unwrap();
        let gaps = write_tree(&mirror, &commit, &dest).unwrap();
        assert_eq!(gaps[0].substitute.as_deref(), Some(sub.as_str()));
        assert_eq!(
            std::fs::read_to_string(dest.join("data/big.txt")).unwrap(),
            "later version\n"
        );
        // Again: nothing left to replace.
        assert!(replace_from_substitute_tags(&mirror).unwrap().is_empty());
    }

    #[test]
    fn a_submodule_is_an_empty_directory_recorded_in_the_checkouts_commit() {
        let root = tempfile::tempdir().unwrap();
        let sub = root.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        sh(
            &sub,
            "git init -q . && echo s > s && git add s && git commit -qm s",
        );
        let src = root.path().join("src");
        std::fs::create_dir(&src).unwrap();
        let commit = sh(
            &src,
            "git init -q . && echo a > a && git -c protocol.file.allow=always submodule add -q ../sub 'helpers dir' \
             && git commit -qm a && git rev-parse HEAD",
        );
        let linked = sh(&src, "git rev-parse 'HEAD:helpers dir'");
        sh(root.path(), "git clone -q --bare src mirror.git");
        let mirror = root.path().join("mirror.git");
        assert_eq!(
            gitlinks(&mirror, &commit).unwrap(),
            vec![(linked.clone(), "helpers dir".to_string())]
        );
        let dest = root.path().join("tree");
        std::fs::create_dir(&dest).unwrap();
        checkout(&mirror, &commit, &dest).unwrap();
        assert!(dest.join("helpers dir").is_dir());
        assert!(dest.join(".gitmodules").is_file());
        let recorded = sh(&dest, "git ls-tree HEAD 'helpers dir'");
        assert!(
            recorded.starts_with(&format!("160000 commit {linked}")),
            "{recorded}"
        );
    }

    #[test]
    fn a_whole_mirror_has_no_gaps_and_an_unknown_commit_is_an_error() {
        let root = tempfile::tempdir().unwrap();
        let src = root.path().join("src");
        std::fs::create_dir(&src).unwrap();
        let commit = sh(
            &src,
            "git init -q . && echo a > a && git add a && git commit -qm a && git rev-parse HEAD",
        );
        sh(root.path(), "git clone -q --bare src mirror.git");
        let mirror = root.path().join("mirror.git");
        assert!(gaps(&mirror, &commit).unwrap().is_empty());
        let err = gaps(&mirror, "0123456789abcdef0123456789abcdef01234567").unwrap_err();
        assert!(matches!(err, TreeError::ListTree { .. }), "{err}");
        assert!(err.to_string().contains("0123456789abcdef"), "{err}");
    }
}
