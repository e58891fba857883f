//! Host Python interpreters for environments: found on PATH, in /usr/local/bin and /usr/bin,
//! and among pyenv's versions; copied where an unprivileged user can run them when needed.

use super::SandboxError;
use std::path::{Path, PathBuf};
use std::process::Stdio;

fn infra(what: &str, e: impl std::fmt::Display) -> SandboxError {
    SandboxError::Infra(format!("{what}: {e}"))
}

pub(crate) use super::process::{nobody_can_reach, run_setup};

/// An interpreter a virtualenv can be made from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Interpreter {
    /// The binary.
    pub exe: PathBuf,
    /// Its installation prefix (`sys.base_prefix`).
    pub prefix: PathBuf,
    /// Its `major.minor`.
    pub version: String,
    /// Its shared libraries, when it is a copy whose built-in library path points elsewhere.
    pub lib_dir: Option<PathBuf>,
}

/// Whether a probed `major.minor` satisfies a wanted version: `3.9` (or `3.9.18`) wants 3.9,
/// `3` (SWE-bench's "any Python 3") any 3.x, an empty one anything.
pub(crate) fn version_matches(wanted: &str, found: &str) -> bool {
    let w: Vec<&str> = wanted.trim().split('.').filter(|p| !p.is_empty()).collect();
    let f: Vec<&str> = found.trim().split('.').collect();
    match w.len() {
        0 => true,
        1 => f.first() == w.first(),
        _ => f.len() >= 2 && f[..2] == w[..2],
    }
}

/// Where pyenv keeps its interpreters: `$PYENV_ROOT/versions/*`, `~/.pyenv/versions/*`.
fn pyenv_versions() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    if let Some(home) = std::env::var_os("HOME") {
        roots.push(PathBuf::from(home).join(".pyenv"));
    }
    let mut out = Vec::new();
    for root in roots {
        let Ok(entries) = std::fs::read_dir(root.join("versions")) else {
            continue;
        };
        let mut dirs: Vec<PathBuf> = entries.flatten().map(|e| e.path().join("bin")).collect();
        dirs.sort();
        dirs.reverse(); // newest patch release first
        out.extend(dirs);
    }
    out
}

/// (major.minor, base prefix, executable) of an interpreter, if it runs.
fn probe(candidate: &Path) -> Option<(String, PathBuf, PathBuf)> {
    let out = std::process::Command::new(candidate)
        .args(["-c", "import sys; print('%d.%d' % sys.version_info[:2]); print(sys.base_prefix); print(sys.executable)"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = text.lines();
    Some((
        lines.next()?.to_string(),
        PathBuf::from(lines.next()?),
        PathBuf::from(lines.next()?),
    ))
}

/// A copy of an interpreter's whole prefix under `cache/pythons`, readable by everyone, for an
/// unprivileged execution user that cannot reach the original (pyenv's under /root). Its
/// libraries come first on `LD_LIBRARY_PATH`, since such builds name their own by absolute path.
fn public_copy(
    cache: &Path,
    prefix: &Path,
    exe: &Path,
    version: &str,
) -> Result<Interpreter, SandboxError> {
    let name = format!(
        "{}-{}",
        prefix.file_name().unwrap_or_default().to_string_lossy(),
        &reprobench_domain::swt::env_key(&prefix.display().to_string(), &[])[..8]
    );
    let root = cache.join("pythons");
    let dir = root.join(&name);
    let rel = exe.strip_prefix(prefix).map_err(|_| {
        infra(
            "copying the interpreter",
            "its binary is outside its prefix",
        )
    })?;
    let interpreter = Interpreter {
        exe: dir.join(rel),
        prefix: dir.clone(),
        version: version.to_string(),
        lib_dir: Some(dir.join("lib")),
    };
    let marker = dir.join(".reprobench-ready");
    build_once(
        &dir,
        &root.join(format!("{name}.lock")),
        || marker.exists(),
        || {
            copy_prefix_readable(prefix, &dir, "for the execution user")?;
            std::fs::write(&marker, b"").map_err(|e| infra("marking the interpreter copy ready", e))
        },
    )?;
    Ok(interpreter)
}

/// A host interpreter of the wanted version: `pythonX.Y`/`python3` on PATH, in /usr/local/bin
/// and /usr/bin, then pyenv's. With `public` (executions run unprivileged) one that user can run;
/// failing that, a copy of one it cannot reach.
pub(crate) fn find_python(
    wanted: &str,
    public: bool,
    cache: &Path,
) -> Result<Interpreter, SandboxError> {
    find_python_where(wanted, public, cache, |_| true)
}

/// [`find_python`] among the interpreters whose prefix `accept` takes.
pub(crate) fn find_python_where(
    wanted: &str,
    public: bool,
    cache: &Path,
    accept: impl Fn(&Path) -> bool,
) -> Result<Interpreter, SandboxError> {
    let names = [format!("python{wanted}"), "python3".to_string()];
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.extend(["/usr/local/bin", "/usr/bin"].map(PathBuf::from));
    dirs.extend(pyenv_versions());
    let mut unreachable: Option<(PathBuf, PathBuf, String)> = None;
    let mut seen = std::collections::BTreeSet::new();
    for dir in &dirs {
        for name in &names {
            let candidate = dir.join(name);
            if !candidate.is_file() {
                continue;
            }
            let Some((version, prefix, exe)) = probe(&candidate) else {
                continue;
            };
            if !version_matches(wanted, &version) || !accept(&prefix) || !seen.insert(exe.clone()) {
                continue;
            }
            if public && !(nobody_can_reach(&prefix) && nobody_can_reach(&exe)) {
                unreachable.get_or_insert((prefix, exe, version));
                continue;
            }
            return Ok(Interpreter {
                exe,
                prefix,
                version,
                lib_dir: None,
            });
        }
    }
    if let Some((prefix, exe, version)) = unreachable {
        return public_copy(cache, &prefix, &exe, &version);
    }
    Err(SandboxError::BadInput(format!(
        "the instance wants Python {wanted}, and this machine has no such interpreter (looked for python{wanted} and python3 on PATH, in /usr/local/bin, /usr/bin and pyenv's versions); install it (e.g. `pyenv install {wanted}`), or use the docker executor, which builds a base image per Python version"
    )))
}

/// Whether an interpreter prefix is its own (pyenv's, /usr/local/...) rather than the system's,
/// so that copying it copies one interpreter.
pub(crate) fn has_own_prefix(prefix: &Path) -> bool {
    prefix != Path::new("/usr") && prefix != Path::new("/")
}

/// Copies an interpreter's prefix to `dir`, readable by every user.
pub(crate) fn copy_prefix_readable(
    prefix: &Path,
    dir: &Path,
    what: &str,
) -> Result<(), SandboxError> {
    run_setup(
        std::process::Command::new("cp")
            .arg("-a")
            .arg(prefix)
            .arg(dir),
        &format!("copying {} {what}", prefix.display()),
    )
    .map_err(|e| SandboxError::Infra(e.to_string()))?;
    run_setup(
        std::process::Command::new("chmod")
            .args(["-R", "a+rX"])
            .arg(dir),
        &format!("making {} readable", dir.display()),
    )
    .map_err(|e| SandboxError::Infra(e.to_string()))
}

/// Builds `dir` once, in place (never moved: scripts and editable installs record its path).
/// `ready` says whether it is built (`build` writes what `ready` checks). Node processes sharing
/// the cache take turns on the lock file `lock`; a failed build leaves no `dir` behind.
pub(crate) fn build_once(
    dir: &Path,
    lock: &Path,
    ready: impl Fn() -> bool,
    build: impl FnOnce() -> Result<(), SandboxError>,
) -> Result<(), SandboxError> {
    if ready() {
        return Ok(());
    }
    if let Some(parent) = lock.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| infra(&format!("creating {}", parent.display()), e))?;
    }
    let _lock = FileLock::acquire(lock)?;
    if ready() {
        return Ok(());
    }
    let _ = std::fs::remove_dir_all(dir);
    let built = build();
    if built.is_err() {
        let _ = std::fs::remove_dir_all(dir);
    }
    built
}

/// An exclusive lock on a file, held until dropped: node processes sharing a cache directory
/// build each environment once.
struct FileLock {
    _held: std::fs::File,
}

impl FileLock {
    fn acquire(path: &Path) -> Result<FileLock, SandboxError> {
        use std::os::fd::AsRawFd;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(|e| infra(&format!("opening the lock {}", path.display()), e))?;
        // SAFETY: flock on a file descriptor we own.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(infra("locking", std::io::Error::last_os_error()));
        }
        Ok(FileLock { _held: f })
    }
}

#[cfg(test)]
mod tests {
    use super::{SandboxError, build_once, version_matches};
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn build_once_builds_one_time_across_threads_and_a_failure_leaves_nothing() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("env");
        let lock = root.path().join("locks/env.lock");
        let marker = dir.join("ready");
        let failed = build_once(
            &dir,
            &lock,
            || marker.exists(),
            || {
                std::fs::create_dir_all(&dir).unwrap();
                Err(SandboxError::Infra("pip failed".into()))
            },
        );
        assert!(failed.is_err());
        assert!(
            !dir.exists(),
            "a failed build leaves no half-built directory"
        );
        let builds = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    build_once(
                        &dir,
                        &lock,
                        || marker.exists(),
                        || {
                            builds.fetch_add(1, Ordering::SeqCst);
                            std::fs::create_dir_all(&dir).unwrap();
                            std::thread::sleep(std::time::Duration::from_millis(20));
                            std::fs::write(&marker, b"").unwrap();
                            Ok(())
                        },
                    )
                    .unwrap();
                });
            }
        });
        assert_eq!(builds.load(Ordering::SeqCst), 1);
        assert!(marker.exists());
    }

    #[test]
    fn versions_match_as_specs_mean_them() {
        assert!(version_matches("3.9", "3.9"));
        assert!(!version_matches("3.9", "3.10"));
        assert!(version_matches("3", "3.11"));
        assert!(!version_matches("3", "2.7"));
        assert!(version_matches("3.11.4", "3.11"));
        assert!(version_matches("", "3.11"));
        assert!(!version_matches("3.1", "3.11"));
    }
}
