//! Making the base image without a registry: debootstrap a Debian root filesystem, give it the
//! host's CA bundle, import it into the engine. Takes about a minute and 400 MB.

use super::super::SandboxError;
use super::{
    DEFAULT_BASE_IMAGE, LAYER_LABEL, connect_engine, default_cache_dir, engine_error, find_image,
};
use bollard::query_parameters::CreateImageOptionsBuilder;
use futures_util::StreamExt;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tracing::{info, warn};

/// Packages of the base image: Python with venv and headers (for the env layer; a conda Python
/// has its headers, and django 5.0's requirements build a C extension), git and patch (to apply
/// predictions), CA certificates, ps (for tests that inspect processes), then the packages of
/// SWT-bench's own base image (its `_DOCKERFILE_BASE`: a C toolchain, libffi and libtiff
/// headers, every locale, time zones, curl, wget, jq, xxd), so environments build and run as
/// they do there (django 3.x exports `LANG=en_US.UTF-8`; its requirements build C extensions).
/// A change here needs a new [`super::DEFAULT_BASE_IMAGE`] tag: images are found by tag.
const PACKAGES: &str = "python3,python3-venv,python3-dev,git,patch,ca-certificates,procps,bubblewrap,\
                        build-essential,libffi-dev,libtiff-dev,locales,locales-all,tzdata,curl,wget,jq,xxd";
/// Where the CA bundle goes (the system bundle path, so everything trusts it).
const ROOTFS_CA: &str = "etc/ssl/certs/ca-certificates.crt";
/// Directories emptied after debootstrap: caches and docs nobody in a container reads.
const PRUNED: &[&str] = &[
    "var/cache/apt/archives",
    "var/lib/apt/lists",
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
];
/// Output lines of debootstrap kept for an error message.
const QUOTED_LINES: usize = 30;

/// How to build the base image.
#[derive(Debug, Clone, PartialEq)]
pub struct BootstrapOptions {
    /// Tag of the image made.
    pub tag: String,
    /// Debian suite (its Python is the image's: bookworm 3.11, trixie 3.13).
    pub suite: String,
    /// Debian mirror URL.
    pub mirror: String,
    /// Directory the root filesystem is made in (removed afterwards).
    pub work_dir: PathBuf,
    /// Build even if the tag exists.
    pub force: bool,
}

impl Default for BootstrapOptions {
    fn default() -> Self {
        BootstrapOptions {
            tag: DEFAULT_BASE_IMAGE.into(),
            suite: "bookworm".into(),
            mirror: "http://deb.debian.org/debian".into(),
            work_dir: default_cache_dir().join("bootstrap"),
            force: false,
        }
    }
}

/// Builds the Python base image with debootstrap and imports it as `opts.tag`; skips when the
/// tag exists unless `opts.force`. Needs root, debootstrap and tar. Returns the tag.
pub async fn bootstrap_base_image(opts: &BootstrapOptions) -> Result<String, SandboxError> {
    let docker = connect_engine().await?;
    if !opts.force && find_image(&docker, &opts.tag).await?.is_some() {
        eprintln!(
            "bootstrap: {} exists; nothing to do (pass --force to rebuild it)",
            opts.tag
        );
        return Ok(opts.tag.clone());
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err(SandboxError::Infra(
            "debootstrap needs root: run `reprobench images bootstrap` as root (e.g. with sudo)"
                .into(),
        ));
    }
    let debootstrap = find_tool("debootstrap").ok_or_else(|| {
        SandboxError::Infra(
            "debootstrap is not installed: run `apt-get update && apt-get install -y debootstrap`"
                .into(),
        )
    })?;
    let tar = find_tool("tar").ok_or_else(|| {
        SandboxError::Infra("tar is not installed: run `apt-get install -y tar`".into())
    })?;
    std::fs::create_dir_all(&opts.work_dir).map_err(|e| {
        SandboxError::Infra(format!(
            "cannot create work dir {}: {e}",
            opts.work_dir.display()
        ))
    })?;
    let rootfs = opts
        .work_dir
        .join(format!("rootfs-{}-{}", opts.suite, std::process::id()));
    let result = build(&docker, opts, &debootstrap, &tar, &rootfs).await;
    eprintln!("bootstrap: removing {}", rootfs.display());
    let to_remove = rootfs.clone();
    let removed = tokio::task::spawn_blocking(move || remove_rootfs(&to_remove)).await;
    if let Ok(Err(e)) | Err(e) = removed.map_err(std::io::Error::other) {
        warn!(rootfs = %rootfs.display(), error = %e, "cannot remove the bootstrap root filesystem");
    }
    result
}

async fn build(
    docker: &bollard::Docker,
    opts: &BootstrapOptions,
    debootstrap: &Path,
    tar: &Path,
    rootfs: &Path,
) -> Result<String, SandboxError> {
    let started = Instant::now();
    if rootfs.exists() {
        let stale = rootfs.to_path_buf();
        tokio::task::spawn_blocking(move || remove_rootfs(&stale))
            .await
            .map_err(std::io::Error::other)
            .and_then(|r| r)
            .map_err(|e| SandboxError::Infra(format!("cannot clear {}: {e}", rootfs.display())))?;
    }
    eprintln!(
        "bootstrap: debootstrap {} from {} into {} (about a minute)",
        opts.suite,
        opts.mirror,
        rootfs.display()
    );
    let mut cmd = tokio::process::Command::new(debootstrap);
    // A clean environment: the caller's locale, proxies or Python variables must not leak in.
    cmd.env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("LC_ALL", "C")
        .env("DEBIAN_FRONTEND", "noninteractive")
        .arg("--variant=minbase")
        .arg(format!("--include={PACKAGES}"))
        .arg(&opts.suite)
        .arg(rootfs)
        .arg(&opts.mirror);
    run_logged(cmd, "debootstrap").await.map_err(|failure| {
        SandboxError::Infra(format!(
            "debootstrap of {} from {} failed: check the suite name and that the mirror is \
             reachable\n--- last lines of its output ---\n{failure}",
            opts.suite, opts.mirror
        ))
    })?;
    eprintln!(
        "bootstrap: debootstrap done in {:.0}s",
        started.elapsed().as_secs_f64()
    );

    let fs_err = |what: &str, e: std::io::Error| {
        SandboxError::Infra(format!("{what} in {}: {e}", rootfs.display()))
    };
    match super::read_host_ca() {
        // The image must trust what the host trusts (a TLS-intercepting proxy's CA included).
        Some(ca) => {
            std::fs::write(rootfs.join(ROOTFS_CA), &ca)
                .map_err(|e| fs_err("cannot write the CA bundle", e))?;
            std::fs::create_dir_all(rootfs.join("etc/reprobench"))
                .map_err(|e| fs_err("cannot create etc/reprobench", e))?;
            std::fs::write(rootfs.join("etc/reprobench/ca-certificates.crt"), &ca)
                .map_err(|e| fs_err("cannot write the CA bundle", e))?;
        }
        None => warn!("no CA bundle found on the host; the image keeps Debian's"),
    }
    for dir in PRUNED {
        empty_dir(&rootfs.join(dir)).map_err(|e| fs_err(&format!("cannot empty {dir}"), e))?;
    }

    eprintln!(
        "bootstrap: importing the root filesystem into the engine as {}",
        opts.tag
    );
    import(docker, tar, rootfs, opts).await?;
    let image = find_image(docker, &opts.tag).await?.ok_or_else(|| {
        SandboxError::Infra(format!(
            "the engine accepted the import but has no image {}",
            opts.tag
        ))
    })?;
    let mb = image.size.unwrap_or(0) >> 20;
    eprintln!(
        "bootstrap: {} ready ({mb} MB) in {:.0}s",
        opts.tag,
        started.elapsed().as_secs_f64()
    );
    info!(image = %opts.tag, size_mb = mb, secs = started.elapsed().as_secs_f64(), "base image bootstrapped");
    Ok(opts.tag.clone())
}

/// A bootstrap command that could not be run or failed.
// Underlying errors are in the messages, not `source()`: anyhow's `{:#}` would repeat them.
#[derive(Debug, thiserror::Error)]
enum BootstrapCommandError {
    /// The command could not be started.
    #[error("cannot start {name}: {error}")]
    CannotStart {
        /// The command's name.
        name: String,
        /// Why.
        error: std::io::Error,
    },
    /// Waiting for the command failed.
    #[error("waiting for {name}: {error}")]
    Wait {
        /// The command's name.
        name: String,
        /// Why.
        error: std::io::Error,
    },
    /// The command ran and failed.
    #[error("{name} exited with {status}\n{last_lines}")]
    Failed {
        /// The command's name.
        name: String,
        /// How it exited.
        status: std::process::ExitStatus,
        /// The last lines of its output.
        last_lines: String,
    },
}

/// Runs a command, printing its stage lines on stderr; on failure returns its last lines.
async fn run_logged(
    mut cmd: tokio::process::Command,
    name: &str,
) -> Result<(), BootstrapCommandError> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .map_err(|error| BootstrapCommandError::CannotStart {
            name: name.to_string(),
            error,
        })?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let mut readers = Vec::new();
    for pipe in [
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
    ]
    .into_iter()
    .flatten()
    {
        let tx = tx.clone();
        readers.push(tokio::spawn(async move {
            let mut lines = BufReader::new(pipe).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        }));
    }
    drop(tx);
    let mut tail: VecDeque<String> = VecDeque::new();
    while let Some(line) = rx.recv().await {
        // Per-package lines are hundreds; the stage lines tell where it is.
        const CHATTY: &[&str] = &[
            "I: Retrieving",
            "I: Validating",
            "I: Extracting",
            "I: Unpacking",
            "I: Configuring",
        ];
        if !CHATTY.iter().any(|p| line.starts_with(p)) {
            eprintln!("bootstrap: {name}: {line}");
        }
        if tail.len() == QUOTED_LINES {
            tail.pop_front();
        }
        tail.push_back(line);
    }
    let status = child
        .wait()
        .await
        .map_err(|error| BootstrapCommandError::Wait {
            name: name.to_string(),
            error,
        })?;
    if status.success() {
        Ok(())
    } else {
        Err(BootstrapCommandError::Failed {
            name: name.to_string(),
            status,
            last_lines: Vec::from(tail).join("\n"),
        })
    }
}

/// Streams `tar -c` of the root filesystem into the engine's import (no registry involved).
async fn import(
    docker: &bollard::Docker,
    tar: &Path,
    rootfs: &Path,
    opts: &BootstrapOptions,
) -> Result<(), SandboxError> {
    let (repo, tag) = split_tag(&opts.tag);
    let changes = vec![
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
        "ENV LANG=C.UTF-8".to_string(),
        format!("LABEL {LAYER_LABEL}=base reprobench.suite={}", opts.suite),
        "WORKDIR /".to_string(),
        r#"CMD ["/bin/bash"]"#.to_string(),
    ];
    let options = CreateImageOptionsBuilder::new()
        .from_src("-")
        .repo(repo)
        .tag(tag)
        .changes(changes)
        .message("reprobench bootstrap (debootstrap)")
        .build();
    let mut child = tokio::process::Command::new(tar)
        .arg("--numeric-owner")
        .arg("-C")
        .arg(rootfs)
        .args(["-c", "."])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| SandboxError::Infra(format!("cannot run tar: {e}")))?;
    let stdout = child.stdout.take().expect("stdout is piped");
    let chunks = futures_util::stream::unfold(Some(stdout), |state| async move {
        let mut out = state?;
        let mut buf = vec![0u8; 1 << 20];
        match out.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(buf.into()), Some(out)))
            }
            // Yield the error once; the engine then aborts the import.
            Err(e) => Some((Err(e), None)),
        }
    });
    // A whole root filesystem takes a while to send: no request timeout.
    let docker = docker
        .clone()
        .with_timeout(std::time::Duration::from_secs(3600));
    let mut progress =
        docker.create_image(Some(options), Some(bollard::body_try_stream(chunks)), None);
    let mut failed = None;
    while let Some(item) = progress.next().await {
        if let Err(e) = item {
            failed = Some(e);
            break;
        }
    }
    let tar_out = child
        .wait_with_output()
        .await
        .map_err(|e| SandboxError::Infra(format!("waiting for tar: {e}")))?;
    if !tar_out.status.success() {
        return Err(SandboxError::Infra(format!(
            "tar of {} failed: {}",
            rootfs.display(),
            String::from_utf8_lossy(&tar_out.stderr).trim()
        )));
    }
    match failed {
        Some(e) => Err(engine_error(&format!("importing {}", opts.tag), e)),
        None => Ok(()),
    }
}

/// `repo/name:tag` → (`repo/name`, `tag`); a registry port is not a tag.
fn split_tag(image: &str) -> (&str, &str) {
    match image.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => (repo, tag),
        _ => (image, "latest"),
    }
}

/// `name` on PATH or in the sbin directories (where debootstrap lives but PATH may not reach).
fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn empty_dir(dir: &Path) -> std::io::Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for e in entries {
        let e = e?;
        if e.file_type()?.is_dir() {
            std::fs::remove_dir_all(e.path())?;
        } else {
            std::fs::remove_file(e.path())?;
        }
    }
    Ok(())
}

/// Unmounts anything left mounted inside (a failed debootstrap can leave /proc), then removes it.
fn remove_rootfs(rootfs: &Path) -> std::io::Result<()> {
    if !rootfs.exists() {
        return Ok(());
    }
    let canonical = rootfs.canonicalize()?;
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut inside: Vec<PathBuf> = mounts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .map(|m| PathBuf::from(m.replace("\\040", " ")))
        .filter(|m| m.starts_with(&canonical) && *m != canonical)
        .collect();
    // Deepest first.
    inside.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    for m in inside {
        let c = std::ffi::CString::new(m.as_os_str().as_encoded_bytes())?;
        // SAFETY: c is a valid NUL-terminated path; MNT_DETACH only detaches the mount.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
            return Err(std::io::Error::other(format!(
                "cannot unmount {} ({}); unmount it and remove the directory by hand",
                m.display(),
                std::io::Error::last_os_error()
            )));
        }
    }
    std::fs::remove_dir_all(rootfs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_split() {
        assert_eq!(
            split_tag("reprobench/python-base:bookworm-2"),
            ("reprobench/python-base", "bookworm-2")
        );
        assert_eq!(split_tag("img"), ("img", "latest"));
        assert_eq!(split_tag("host:5000/img"), ("host:5000/img", "latest"));
        assert_eq!(split_tag("host:5000/img:t"), ("host:5000/img", "t"));
    }

    #[test]
    fn rootfs_removal_handles_missing_and_plain_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("rootfs");
        assert!(remove_rootfs(&root).is_ok());
        std::fs::create_dir_all(root.join("var/cache/apt/archives")).unwrap();
        std::fs::write(root.join("var/cache/apt/archives/x.deb"), "x").unwrap();
        empty_dir(&root.join("var/cache/apt/archives")).unwrap();
        assert!(root.join("var/cache/apt/archives").is_dir());
        assert!(!root.join("var/cache/apt/archives/x.deb").exists());
        remove_rootfs(&root).unwrap();
        assert!(!root.exists());
    }
}
