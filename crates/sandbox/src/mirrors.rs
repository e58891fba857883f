//! Mirrors brought as tarballs (`OWNER__NAME.git.tar.gz`, one bare repository each, made with
//! `tar -czf` above the mirror): unpacked into the repositories directory the sandboxes check
//! out from, checked to be bare repositories of the tarball's name, and given their substitute
//! blobs ([`crate::tree::replace_from_substitute_tags`]). `datasets import` and `bench slice`
//! use it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Why an import stopped, in words that name the file and what to do.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ImportError(String);

fn cannot(what: impl std::fmt::Display, e: impl std::fmt::Display) -> ImportError {
    ImportError(format!("{what}: {e}"))
}

/// The tarballs `paths` name: files ending in `.git.tar.gz`, or directories holding some.
pub fn tarballs_in(paths: &[PathBuf]) -> Result<Vec<PathBuf>, ImportError> {
    let mut tarballs = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(p)
                .map_err(|e| cannot(format!("cannot read {}", p.display()), e))?
                .flatten()
                .map(|e| e.path())
                .filter(|f| f.to_string_lossy().ends_with(".git.tar.gz"))
                .collect();
            found.sort();
            if found.is_empty() {
                return Err(ImportError(format!(
                    "{}: no OWNER__NAME.git.tar.gz in it",
                    p.display()
                )));
            }
            tarballs.extend(found);
        } else if p.to_string_lossy().ends_with(".git.tar.gz") {
            tarballs.push(p.clone());
        } else {
            return Err(ImportError(format!(
                "{}: not a mirror tarball; give OWNER__NAME.git.tar.gz files (a bare repository each) or a directory of them",
                p.display()
            )));
        }
    }
    Ok(tarballs)
}

/// Unpacks the tarballs `paths` name into `repos`, telling `say` one line per tarball (and one
/// per substitute blob). A mirror already there is kept.
pub fn import_mirrors(
    paths: &[PathBuf],
    repos: &Path,
    say: impl Fn(&str),
) -> Result<(), ImportError> {
    let tarballs = tarballs_in(paths)?;
    std::fs::create_dir_all(repos)
        .map_err(|e| cannot(format!("cannot create {}", repos.display()), e))?;
    for t in &tarballs {
        let file = t
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let name = file.trim_end_matches(".tar.gz").to_string();
        let dest = repos.join(&name);
        if dest.join("HEAD").is_file() {
            say(&format!("{name}: already in {}", repos.display()));
            say_substitutes(&dest, &name, &say)?;
            continue;
        }
        let tmp = tempfile::Builder::new()
            .prefix(".import-")
            .tempdir_in(repos)
            .map_err(|e| {
                cannot(
                    format!("cannot create a directory in {}", repos.display()),
                    e,
                )
            })?;
        let status = Command::new("tar")
            .arg("-xzf")
            .arg(t)
            .arg("-C")
            .arg(tmp.path())
            .status()
            .map_err(|e| cannot("cannot run tar", e))?;
        if !status.success() {
            return Err(ImportError(format!(
                "{}: tar could not unpack it ({status})",
                t.display()
            )));
        }
        let unpacked = tmp.path().join(&name);
        let bare = Command::new("git")
            .arg("--git-dir")
            .arg(&unpacked)
            .args(["rev-parse", "--is-bare-repository"])
            .output()
            .map_err(|e| cannot("cannot run git", e))?;
        if String::from_utf8_lossy(&bare.stdout).trim() != "true" {
            return Err(ImportError(format!(
                "{}: it does not hold a bare repository named {name}; make it with `tar -czf {file} {name}` from the directory above the mirror",
                t.display()
            )));
        }
        std::fs::rename(&unpacked, &dest)
            .map_err(|e| cannot(format!("cannot move the mirror to {}", dest.display()), e))?;
        let commits = Command::new("git")
            .arg("--git-dir")
            .arg(&dest)
            .args(["rev-list", "--all", "--count"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        say(&format!(
            "{name}: imported into {} ({commits} commits)",
            repos.display()
        ));
        say_substitutes(&dest, &name, &say)?;
    }
    Ok(())
}

/// Puts a mirror's substitute tags in place of the blobs it lacks (git replace refs) and says
/// which.
fn say_substitutes(mirror: &Path, name: &str, say: &impl Fn(&str)) -> Result<(), ImportError> {
    let subs = crate::tree::replace_from_substitute_tags(mirror).map_err(|e| cannot(name, e))?;
    for s in subs {
        say(&format!(
            "{name}: blob {} is not in the mirror; its substitute subst/{} ({}) stands in for it (refs/replace)",
            &s.blob[..12.min(s.blob.len())],
            s.tag,
            &s.substitute[..12.min(s.substitute.len())]
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git(args: &[&str], dir: &Path) {
        let ok = Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@t")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@t")
            .status()
            .unwrap()
            .success();
        assert!(ok, "git {args:?}");
    }

    #[test]
    fn a_tarball_of_a_bare_repository_is_imported_once_and_anything_else_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        git(&["init", "-q"], &work);
        std::fs::write(work.join("f"), "x\n").unwrap();
        git(&["add", "f"], &work);
        git(&["commit", "-qm", "one"], &work);
        let packs = dir.path().join("packs");
        std::fs::create_dir_all(&packs).unwrap();
        git(
            &["clone", "-q", "--bare", "work", "packs/o__r.git"],
            dir.path(),
        );
        let ok = Command::new("tar")
            .args(["-czf", "o__r.git.tar.gz", "o__r.git"])
            .current_dir(&packs)
            .status()
            .unwrap()
            .success();
        assert!(ok);
        std::fs::remove_dir_all(packs.join("o__r.git")).unwrap();
        let repos = dir.path().join("repos");
        let said = std::cell::RefCell::new(Vec::new());
        let say = |l: &str| said.borrow_mut().push(l.to_string());
        import_mirrors(std::slice::from_ref(&packs), &repos, say).unwrap();
        assert!(repos.join("o__r.git/HEAD").is_file());
        assert!(said.borrow()[0].contains("imported"), "{:?}", said.borrow());
        import_mirrors(std::slice::from_ref(&packs), &repos, say).unwrap();
        assert!(
            said.borrow()[1].contains("already in"),
            "{:?}",
            said.borrow()
        );

        // A file of another name, an empty directory, and a tarball of something else.
        let other = dir.path().join("notes.txt");
        std::fs::write(&other, "x").unwrap();
        let err = import_mirrors(&[other], &repos, |_| {}).unwrap_err();
        assert!(err.to_string().contains("not a mirror tarball"), "{err}");
        let empty = dir.path().join("empty");
        std::fs::create_dir_all(&empty).unwrap();
        let err = import_mirrors(&[empty], &repos, |_| {}).unwrap_err();
        assert!(
            err.to_string().contains("no OWNER__NAME.git.tar.gz"),
            "{err}"
        );
        let ok = Command::new("tar")
            .args(["-czf", "packs/x__y.git.tar.gz", "work"])
            .current_dir(dir.path())
            .status()
            .unwrap()
            .success();
        assert!(ok);
        let err = import_mirrors(&[packs.join("x__y.git.tar.gz")], &repos, |_| {}).unwrap_err();
        assert!(
            err.to_string().contains("does not hold a bare repository"),
            "{err}"
        );
        assert!(!repos.join("x__y.git").exists());
    }
}
