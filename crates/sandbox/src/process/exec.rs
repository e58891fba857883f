//! One execution of the process sandbox, in two sandboxes of bubblewrap (`bwrap`) one after the
//! other, so that what prepares the tree and what runs the command never meet:
//!
//! 1. **stage**: the checkout is copied to a stage directory on the host; a first sandbox (no
//!    network, its own processes, the stage and the patches the only writable and readable
//!    things of the harness's) writes the files, applies the patches and seals the tree
//!    ([`crate::stage`]);
//! 2. **command**: the sealed stage is archived on the host and streamed into a second sandbox,
//!    which unpacks it into a fresh tmpfs at the checkout's own path (so editable installs and
//!    console scripts find it), signals that it is ready, and runs the command as an
//!    unprivileged user: its own `/tmp`, `/dev/shm`, `HOME` and `TMPDIR` (tmpfs, gone with it), its
//!    own PID namespace (every process it started dies when the command ends or is killed at the
//!    timeout, `setsid` or not), no network, the environment read-only, the support files
//!    read-only but for the one file collected afterwards, and nothing else of the host's but the
//!    system directories.
//!
//! A node allowed to run unisolated (`--allow-unisolated-process`) runs the same two phases as
//! plain processes: a process group killed at the end, and nothing hidden.

use super::{ENV_FILE, EXEC_ENV_FILE, infra, read_env_file};
use crate::stage::{self, SUPPORT_ENV};
use crate::{CappedOutput, ExecOutput, ExecRequest, SandboxError, check_relative_path};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Where the support directory is inside the command's sandbox.
const SUPPORT_DIR: &str = "/reprobench";
/// The uid (and gid) the command has inside its sandbox, as on the docker executor.
const COMMAND_UID: &str = "1000";
/// Where the stage is inside the stage sandbox.
const STAGE_DIR: &str = "/stage";
/// Where the patches and the stage script are inside the stage sandbox.
const INPUT_DIR: &str = "/in";
/// Exit status of the command sandbox's start-up when it could not unpack the tree.
const UNPACK_FAILED: i32 = 223;
/// The command sandbox's start-up and end, run as `sh -c INIT sh COLLECT ARGV…` in the directory
/// the tree goes to: unpack the tree from standard input and the support files from fd 5, close
/// them and the argument file, say "ready" on fd 4, run the command (without fd 4), then send
/// the collected file (`COLLECT`, in the support directory) on fd 4 and end as the command did.
const INIT: &str = r#"c=$1; shift
tar -x -p -f - 2>&1 || exit 223
tar -x -f - -C "$REPROBENCH_SUPPORT" <&5 2>&1 || exit 223
exec </dev/null 3<&- 5<&-
printf r >&4 || exit 223
"$@" 4>&-
rc=$?
if [ -n "$c" ] && [ -f "$REPROBENCH_SUPPORT/$c" ]; then cat "$REPROBENCH_SUPPORT/$c" >&4; fi
exit $rc
"#;
/// How long the stage phase may take (copies, `git apply`, sealing) before it counts as hung.
const STAGE_TIMEOUT: Duration = Duration::from_secs(600);

/// How an execution is isolated.
#[derive(Clone, Debug)]
pub(super) enum Isolation {
    /// In bubblewrap sandboxes (`bwrap` at this path).
    Bwrap(PathBuf),
    /// As plain processes (the node allows it explicitly).
    Unisolated,
}

/// Everything an execution needs besides its request.
#[derive(Clone, Debug)]
pub(super) struct Context {
    /// The sandbox's cache directory (work directories go under `work/`).
    pub cache: PathBuf,
    /// The prepared checkout.
    pub template: PathBuf,
    /// Its environment.
    pub venv: PathBuf,
    /// The node runs as root: commands run as a uid of their own, work directories are tmpfs.
    pub as_root: bool,
    /// How executions are isolated.
    pub isolation: Isolation,
    /// Set when the execution is no longer wanted (its future was dropped: the attempt was
    /// cancelled, revoked or drained): whatever runs is killed.
    pub cancelled: Arc<AtomicBool>,
}

/// Sets its flag when dropped: an execution whose future is dropped is killed, not left to run
/// to its timeout.
pub(super) struct CancelOnDrop(pub Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The uids of this process's running executions.
static UIDS_IN_USE: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

/// Executions run as root get an unprivileged uid of their own (not a system user), so the
/// process limit is per execution: a fork bomb in one execution cannot starve its neighbours.
/// Drawn at random from a wide range, so it tells an execution nothing (a counter would tell it
/// how many ran before it, and so which run of its instance it is); released when dropped.
struct ExecutionUid(u32);

impl ExecutionUid {
    const FIRST: u32 = 200_000;
    const RANGE: u32 = 1 << 20;

    fn draw() -> ExecutionUid {
        let mut in_use = crate::lock(&UIDS_IN_USE);
        loop {
            let random = u32::from_str_radix(&reprobench_domain::secret::random_hex(4), 16)
                .expect("hex digits");
            let uid = Self::FIRST + random % Self::RANGE;
            if !in_use.contains(&uid) {
                in_use.push(uid);
                return ExecutionUid(uid);
            }
        }
    }
}

impl Drop for ExecutionUid {
    fn drop(&mut self) {
        crate::lock(&UIDS_IN_USE).retain(|u| *u != self.0);
    }
}

/// This process's identity for the names of its work directories: pid and start time (clock
/// ticks since boot), so a later node can tell a dead owner's leftovers from a live one's.
pub(super) fn owner_tag() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        start_time(std::process::id()).unwrap_or(0)
    )
}

/// A process's start time (field 22 of `/proc/PID/stat`).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces: count from its closing parenthesis.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the owner named by a work directory (`exec-PID-START-…`) is gone.
fn owner_is_gone(name: &str) -> bool {
    let mut parts = name.strip_prefix("exec-").unwrap_or(name).split('-');
    let (Some(pid), Some(start)) = (parts.next(), parts.next()) else {
        return true;
    };
    let (Ok(pid), Ok(start)) = (pid.parse::<u32>(), start.parse::<u64>()) else {
        return true; // an older layout, written before owners were named
    };
    start_time(pid) != Some(start)
}

/// Removes the work directories that nodes no longer running left under `work_root` (a crash
/// leaves them, and their tmpfs mounted); returns how many.
pub(super) fn remove_leftovers(work_root: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(work_root) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("exec-") || !owner_is_gone(&name) {
            continue;
        }
        unmount(&entry.path());
        if std::fs::remove_dir_all(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Lazily unmounts whatever is mounted at `dir` (nothing of an execution is left to use it).
fn unmount(dir: &Path) {
    if let Ok(target) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) {
        // SAFETY: a valid NUL-terminated path.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Whether mounting a private tmpfs over work directories was refused once: then no execution
/// tries again.
static TMPFS_REFUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Mounts a tmpfs of `size_mb` MiB at `dir`; false when it cannot.
fn mount_tmpfs(dir: &Path, size_mb: u64) -> bool {
    use std::sync::atomic::Ordering;
    if TMPFS_REFUSED.load(Ordering::Relaxed) {
        return false;
    }
    let Ok(target) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    let options = std::ffi::CString::new(format!("mode=0755,size={size_mb}m")).expect("no NUL");
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            options.as_ptr().cast(),
        )
    };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        TMPFS_REFUSED.store(true, Ordering::Relaxed);
        tracing::warn!(error = %err, "process sandbox: cannot mount a tmpfs for work directories; they stay on disk");
        return false;
    }
    true
}

/// An execution's directory on the host: `stage/` (the tree being prepared), `in/` (the patches
/// and the stage script), `support/` (the support files), `scratch/`; a tmpfs of its own when
/// the node is root. Unmounted and removed when dropped.
struct WorkDir {
    dir: tempfile::TempDir,
    mounted: bool,
}

impl WorkDir {
    fn create(cache: &Path, as_root: bool, size_mb: u64) -> Result<WorkDir, SandboxError> {
        let root = cache.join("work");
        std::fs::create_dir_all(&root).map_err(|e| infra("creating the work directory", e))?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("exec-{}-", owner_tag()))
            .tempdir_in(&root)
            .map_err(|e| infra("creating the work directory", e))?;
        let mounted = as_root && mount_tmpfs(dir.path(), size_mb);
        for d in ["stage", "in", "support", "scratch"] {
            std::fs::create_dir(dir.path().join(d))
                .map_err(|e| infra("creating the work directory", e))?;
        }
        Ok(WorkDir { dir, mounted })
    }

    fn path(&self, part: &str) -> PathBuf {
        self.dir.path().join(part)
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if self.mounted {
            unmount(self.dir.path());
        }
    }
}

/// Sets a hard and soft limit of `value`, or keeps a lower hard limit already in force.
/// False when neither holds (the execution would run without that limit).
fn set_limit(resource: libc::__rlimit_resource_t, value: u64) -> bool {
    let mut current = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit with valid structs; both are async-signal-safe.
    unsafe {
        let value = if libc::getrlimit(resource, &mut current) == 0 {
            (value as libc::rlim_t).min(current.rlim_max)
        } else {
            value as libc::rlim_t
        };
        let lim = libc::rlimit {
            rlim_cur: value,
            rlim_max: value,
        };
        libc::setrlimit(resource, &lim) == 0
    }
}

/// What the command's process gets between fork and exec.
#[derive(Clone, Copy)]
struct ChildSetup {
    /// Run as this uid (and gid), when the node is root.
    uid: Option<u32>,
    /// Process limit (per uid), address space, file size.
    nproc: u64,
    address_space: u64,
    file_size: u64,
    /// Fail when a limit cannot be set (isolated executions), or carry on (unisolated).
    strict: bool,
    /// fds moved to 3, 4 and 5 in the child (bwrap's argument file, the report pipe, the
    /// support files' archive).
    fd3: Option<libc::c_int>,
    fd4: Option<libc::c_int>,
    fd5: Option<libc::c_int>,
}

impl ChildSetup {
    /// No uid change, no limits, no fds moved (the harness's own steps).
    fn unlimited() -> ChildSetup {
        ChildSetup {
            uid: None,
            nproc: u64::MAX,
            address_space: u64::MAX,
            file_size: u64::MAX,
            strict: false,
            fd3: None,
            fd4: None,
            fd5: None,
        }
    }

    /// Installs the setup on `cmd`. Only async-signal-safe calls run in the child.
    fn install(self, cmd: &mut Command) {
        // SAFETY: only async-signal-safe libc calls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let refuse = || Err(std::io::Error::last_os_error());
                libc::setsid();
                // Moved out of the way first (a source may be 3 or 4 itself), then into place;
                // the copies close at exec, the targets stay open.
                let mut moved = [-1; 3];
                for (i, from) in [self.fd3, self.fd4, self.fd5].into_iter().enumerate() {
                    if let Some(fd) = from {
                        moved[i] = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 10);
                        if moved[i] < 0 {
                            return refuse();
                        }
                    }
                }
                for (i, target) in [3, 4, 5].into_iter().enumerate() {
                    if moved[i] >= 0 && libc::dup2(moved[i], target) < 0 {
                        return refuse();
                    }
                }
                // Every limit is set (`&`, not `&&`), then checked.
                let limited = set_limit(libc::RLIMIT_AS, self.address_space)
                    & set_limit(libc::RLIMIT_FSIZE, self.file_size)
                    & set_limit(libc::RLIMIT_CORE, 0);
                if !limited && self.strict {
                    return refuse();
                }
                if let Some(uid) = self.uid
                    && (libc::setgroups(0, std::ptr::null()) != 0
                        || libc::setgid(uid) != 0
                        || libc::setuid(uid) != 0)
                {
                    return refuse();
                }
                if !set_limit(libc::RLIMIT_NPROC, self.nproc) && self.strict {
                    return refuse();
                }
                Ok(())
            });
        }
    }
}

/// The host's system directories as a sandbox sees them (read-only; the merged-/usr links as
/// links), with `/proc`, a minimal `/dev` and everything else absent.
pub(super) fn system_args() -> Vec<String> {
    let mut args: Vec<String> = ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
        .map(String::from)
        .to_vec();
    for top in ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"] {
        match std::fs::read_link(top) {
            Ok(target) => args.extend([
                "--symlink".to_string(),
                target.display().to_string(),
                top.to_string(),
            ]),
            Err(_) if Path::new(top).is_dir() => {
                args.extend(["--ro-bind".to_string(), top.to_string(), top.to_string()])
            }
            Err(_) => {}
        }
    }
    args.extend(
        [
            "--ro-bind-try",
            "/sys",
            "/sys",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--unshare-all",
            "--die-with-parent",
            "--new-session",
        ]
        .map(String::from),
    );
    args
}

/// `--size BYTES --tmpfs DIR` (bubblewrap's size applies to the next tmpfs).
fn sized_tmpfs(dir: &str, mb: u64) -> [String; 4] {
    [
        "--size".into(),
        (mb.max(1) << 20).to_string(),
        "--tmpfs".into(),
        dir.into(),
    ]
}

/// Host directories the environment needs besides the system's: the venv, the interpreter's
/// prefix it was made from (`home` in `pyvenv.cfg`), and the library directories its variables
/// name; each bound read-only at its own path.
fn environment_dirs(venv: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![venv.to_path_buf()];
    let cfg = std::fs::read_to_string(venv.join("pyvenv.cfg")).unwrap_or_default();
    for line in cfg.lines() {
        if let Some((key, value)) = line.split_once('=')
            && key.trim() == "home"
            && let Some(prefix) = Path::new(value.trim()).parent()
        {
            dirs.push(prefix.to_path_buf());
        }
    }
    for (k, v) in read_env_file(&venv.join(ENV_FILE)) {
        if k == "LD_LIBRARY_PATH" || k == "LOCPATH" {
            dirs.extend(v.split(':').filter(|p| !p.is_empty()).map(PathBuf::from));
        }
    }
    let system = ["/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64"];
    let mut kept: Vec<PathBuf> = Vec::new();
    for d in dirs {
        let d = std::fs::canonicalize(&d).unwrap_or(d);
        let covered = system.iter().any(|s| d.starts_with(s))
            || kept.iter().any(|k| d.starts_with(k))
            || d == Path::new("/");
        if !covered && d.is_dir() {
            kept.retain(|k| !k.starts_with(&d));
            kept.push(d);
        }
    }
    kept
}

/// A pipe holding bubblewrap's arguments (NUL-separated) for `--args 3`; the read end.
fn args_pipe(args: &[String]) -> Result<OwnedFd, SandboxError> {
    let (reader, mut writer) = std::io::pipe().map_err(|e| infra("creating a pipe", e))?;
    let mut bytes = Vec::new();
    for a in args {
        if a.contains('\0') {
            return Err(SandboxError::BadInput(format!(
                "an argument of the execution holds a NUL byte: `{}`",
                a.replace('\0', "\\0")
            )));
        }
        bytes.extend_from_slice(a.as_bytes());
        bytes.push(0);
    }
    // Larger than a pipe holds: written from a thread while bubblewrap reads it.
    std::thread::spawn(move || {
        let _ = writer.write_all(&bytes);
    });
    Ok(reader.into())
}

/// A child and its combined output, read on a thread into a capped buffer.
struct Running {
    child: Child,
    collector: std::thread::JoinHandle<(Vec<u8>, bool)>,
}

impl Running {
    /// Waits for the child until `deadline`, killing it (and its process group) when it passes
    /// or `cancelled` is set; `poll` runs on every turn (to notice the ready signal). Returns
    /// its status (`None`: killed).
    fn wait(
        &mut self,
        mut deadline: Instant,
        cancelled: &AtomicBool,
        mut poll: impl FnMut() -> Option<Instant>,
    ) -> Result<Option<std::process::ExitStatus>, SandboxError> {
        loop {
            if let Some(new) = poll() {
                deadline = new;
            }
            match self.child.try_wait() {
                Ok(Some(s)) => return Ok(Some(s)),
                Ok(None) if Instant::now() >= deadline || cancelled.load(Ordering::Relaxed) => {
                    self.kill();
                    let _ = self.child.wait();
                    return Ok(None);
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => return Err(infra("waiting for the execution", e)),
            }
        }
    }

    fn kill(&self) {
        let pgid = self.child.id() as libc::pid_t;
        // SAFETY: signalling the process group the child created with setsid.
        unsafe { libc::killpg(pgid, libc::SIGKILL) };
    }

    /// Ends what is left of the process group and takes the output.
    fn finish(self) -> (Vec<u8>, bool) {
        self.kill();
        self.collector.join().unwrap_or_default()
    }
}

/// Starts `cmd` with its stdout and stderr going, interleaved, into a buffer kept within `cap`.
fn spawn_collected(mut cmd: Command, cap: usize, what: &str) -> Result<Running, SandboxError> {
    let (reader, writer) = std::io::pipe().map_err(|e| infra("creating the output pipe", e))?;
    let writer2 = writer
        .try_clone()
        .map_err(|e| infra("creating the output pipe", e))?;
    cmd.stdout(Stdio::from(writer)).stderr(Stdio::from(writer2));
    let child = cmd
        .spawn()
        .map_err(|e| infra(&format!("starting {what}"), e))?;
    drop(cmd); // closes our copies of the pipe's write end
    let collector = std::thread::spawn(move || {
        let mut kept = CappedOutput::new(cap);
        let mut reader = reader;
        let mut chunk = [0u8; 64 * 1024];
        loop {
            match reader.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => kept.push(&chunk[..n]),
            }
        }
        kept.finish()
    });
    Ok(Running { child, collector })
}

fn write_files(root: &Path, files: &[crate::InputFile]) -> Result<(), SandboxError> {
    for f in files {
        check_relative_path(&f.path)?;
        let dest = root.join(&f.path);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent).map_err(|e| infra("writing input files", e))?;
        }
        std::fs::write(&dest, &f.contents).map_err(|e| infra("writing input files", e))?;
        std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(f.mode & 0o7777))
            .map_err(|e| infra("writing input files", e))?;
    }
    Ok(())
}

fn copy_tree(from: &Path, to: &Path) -> Result<(), SandboxError> {
    let out = Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", from.display()))
        .arg(to)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| infra("copying the checkout", e))?;
    if !out.status.success() {
        return Err(SandboxError::Infra(format!(
            "copying {} failed ({}): {}",
            from.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// An execution's tree, staged: its work directory, what staging printed, and the phases it
/// took (`workdir`, `copy`, `stage`).
pub(super) struct StagedTree {
    work: WorkDir,
    report: stage::StageReport,
    phases: Vec<crate::Phase>,
}

/// Phase 1 of an execution of `req` (on a blocking thread), which `validate` accepted: its
/// work directory, the checkout's copy with the request's files, then the patches and the seal.
pub(super) fn stage_blocking(ctx: &Context, req: &ExecRequest) -> Result<StagedTree, SandboxError> {
    let mut clock = PhaseClock::new(Instant::now());
    let disk_mb = req.limits.disk_mb.max(1);
    // The stage (a copy of the checkout), on a tmpfs of its own when root.
    let work = WorkDir::create(&ctx.cache, ctx.as_root, disk_mb.saturating_mul(2))?;
    clock.lap("workdir");
    copy_tree(&ctx.template, &work.path("stage")).map_err(|e| match e {
        SandboxError::Infra(msg) if work.mounted => SandboxError::BadInput(format!(
            "{msg}: the execution's stage holds limits.disk_mb = {disk_mb} MiB twice; raise limits.disk_mb"
        )),
        other => other,
    })?;
    write_files(&work.path("stage"), &req.files)?;
    clock.lap("copy");
    let report = stage_tree(ctx, &work, req)?;
    clock.lap("stage");
    Ok(StagedTree {
        work,
        report,
        phases: clock.phases,
    })
}

/// Runs one execution of `req` (on a blocking thread) that began at `begun`. Its tree is
/// `ahead` when that was staged ahead, else staged now. `command_started` is called once the
/// command runs.
pub(super) fn exec_blocking(
    ctx: &Context,
    req: ExecRequest,
    begun: Instant,
    ahead: Option<StagedTree>,
    command_started: &dyn Fn(),
) -> Result<ExecOutput, SandboxError> {
    let mut clock = PhaseClock::new(begun);
    // All of the request, not only what its tree depends on.
    validate(&req)?;
    let tree = match ahead {
        Some(tree) => {
            // Staged off the execution's path: its phases took none of the execution's time.
            for p in &tree.phases {
                clock.phases.push(crate::Phase {
                    name: p.name,
                    took: Duration::ZERO,
                });
            }
            // Since the execution began: waiting for the tree while it was still being staged.
            clock.lap("ahead");
            tree
        }
        None => {
            let tree = stage_blocking(ctx, &req)?;
            clock.phases.extend(tree.phases.iter().copied());
            clock.last = Instant::now();
            tree
        }
    };
    let uid = ctx.as_root.then(ExecutionUid::draw);
    let mut out = run_command(
        ctx,
        &tree.work,
        &req,
        uid.as_ref().map(|u| u.0),
        &mut clock,
        command_started,
    )?;
    out.prepare_log = tree.report.log;
    out.patches = tree.report.patches;
    drop(tree.work);
    clock.lap("cleanup");
    out.overhead = begun.elapsed().saturating_sub(out.command_time);
    out.phases = clock.phases;
    Ok(out)
}

/// Times an execution's phases one after the other.
struct PhaseClock {
    last: Instant,
    phases: Vec<crate::Phase>,
}

impl PhaseClock {
    fn new(start: Instant) -> PhaseClock {
        PhaseClock {
            last: start,
            phases: Vec::new(),
        }
    }

    /// Ends the phase `name` now (it began where the last one ended).
    fn lap(&mut self, name: &'static str) {
        self.lap_at(name, Instant::now());
    }

    /// Ends the phase `name` at `at`.
    fn lap_at(&mut self, name: &'static str, at: Instant) {
        let took = at.saturating_duration_since(self.last);
        self.last = self.last.max(at);
        self.phases.push(crate::Phase { name, took });
    }
}

/// Checks a request's command, paths and environment names before anything is staged.
pub(super) fn validate(req: &ExecRequest) -> Result<(), SandboxError> {
    if req.command.is_empty() {
        return Err(SandboxError::BadInput("empty command".into()));
    }
    for f in req.files.iter().chain(&req.support) {
        check_relative_path(&f.path)?;
    }
    if let Some(c) = &req.collect {
        check_relative_path(c)?;
    }
    if let Some((k, _)) = req
        .env
        .iter()
        .find(|(k, _)| k.is_empty() || k.contains('=') || k.contains('\0'))
    {
        return Err(SandboxError::BadInput(format!(
            "environment variable name `{k}` is not valid: names are non-empty and have no `=`"
        )));
    }
    Ok(())
}

/// Phase 1: the files, the patches and the seal, in the stage, out of the command's sight.
fn stage_tree(
    ctx: &Context,
    work: &WorkDir,
    req: &ExecRequest,
) -> Result<stage::StageReport, SandboxError> {
    let nonce = reprobench_domain::secret::random_hex(16);
    let input = work.path("in");
    let (input_dir, stage_dir, scratch) = match ctx.isolation {
        Isolation::Bwrap(_) => (
            PathBuf::from(INPUT_DIR),
            PathBuf::from(STAGE_DIR),
            "/tmp".to_string(),
        ),
        Isolation::Unisolated => (
            input.clone(),
            work.path("stage"),
            work.path("scratch").display().to_string(),
        ),
    };
    let mut patches = Vec::new();
    for (i, p) in req.patches.iter().enumerate() {
        let name = format!("{i}.patch");
        std::fs::write(input.join(&name), &p.contents)
            .map_err(|e| infra("writing the patches", e))?;
        patches.push((p.label.clone(), input_dir.join(&name).display().to_string()));
    }
    let script = format!(
        "N={nonce}\n{}{}",
        stage::FUNCTIONS,
        stage::steps(&patches, &scratch)
    );
    std::fs::write(input.join("stage.sh"), script)
        .map_err(|e| infra("writing the stage script", e))?;
    let script_path = input_dir.join("stage.sh");

    let bwrap_args = || {
        let mut args = system_args();
        args.extend([
            "--bind".into(),
            work.path("stage").display().to_string(),
            STAGE_DIR.into(),
            "--ro-bind".into(),
            input.display().to_string(),
            INPUT_DIR.into(),
            "--tmpfs".into(),
            "/tmp".into(),
            "--chdir".into(),
            STAGE_DIR.into(),
        ]);
        args
    };
    let argv = ["/bin/sh".to_string(), script_path.display().to_string()];
    let (mut cmd, args_fd) = isolated(
        &ctx.isolation,
        bwrap_args,
        &argv,
        &stage_dir,
        ChildSetup::unlimited(),
    )?;
    cmd.env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", "/tmp")
        .env("LANG", "C.UTF-8")
        .stdin(Stdio::null());
    let mut running = spawn_collected(cmd, req.limits.max_output_bytes, "the stage")?;
    drop(args_fd);
    let status = running.wait(Instant::now() + STAGE_TIMEOUT, &ctx.cancelled, || None)?;
    let (bytes, _) = running.finish();
    let text = String::from_utf8_lossy(&bytes);
    let report = stage::read(&text, &nonce);
    if status.is_none() {
        return Err(SandboxError::Infra(format!(
            "preparing the tree (copies, patches, sealing) took over {STAGE_TIMEOUT:?}"
        )));
    }
    if !report.sealed {
        return Err(SandboxError::Infra(format!(
            "preparing the tree failed ({}):\n{}",
            status.map_or("killed".to_string(), |s| s.to_string()),
            report.log.trim()
        )));
    }
    Ok(report)
}

/// An archive of the support files, in memory.
fn support_archive(files: &[crate::InputFile]) -> Result<Vec<u8>, SandboxError> {
    let io = |e: std::io::Error| infra("packing the support files", e);
    let mut b = tar::Builder::new(Vec::new());
    for f in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(f.contents.len() as u64);
        h.set_mode(f.mode & 0o7777);
        h.set_mtime(stage::SEAL_TIME as u64);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, &f.path, f.contents.as_slice())
            .map_err(io)?;
    }
    b.into_inner().map_err(io)
}

/// A pipe whose write end a thread fills with `bytes` (then closes); the read end.
fn fed_pipe(bytes: Vec<u8>) -> Result<OwnedFd, SandboxError> {
    let (reader, mut writer) = std::io::pipe().map_err(|e| infra("creating a pipe", e))?;
    std::thread::spawn(move || {
        let _ = writer.write_all(&bytes);
    });
    Ok(reader.into())
}

/// What the command sandbox sends back on fd 4: a ready byte, then the collected file.
struct Reports {
    fd: OwnedFd,
    ready_at: Option<Instant>,
    collected: Vec<u8>,
    ended: bool,
}

impl Reports {
    /// Reads what has arrived; the time the ready byte came, when it just came.
    fn poll(&mut self) -> Option<Instant> {
        let mut newly_ready = None;
        let mut buf = [0u8; 64 * 1024];
        while !self.ended {
            // SAFETY: reading into a valid buffer from a valid (non-blocking) fd.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                self.ended = n == 0;
                break;
            }
            let mut bytes = &buf[..n as usize];
            if self.ready_at.is_none() {
                let now = Instant::now();
                self.ready_at = Some(now);
                newly_ready = Some(now);
                bytes = &bytes[1..];
            }
            if self.collected.len() < COLLECT_CAP {
                self.collected.extend_from_slice(bytes);
            }
        }
        newly_ready
    }
}

/// The most of a collected file kept.
const COLLECT_CAP: usize = 256 << 20;

/// Phase 2: the sealed tree streamed into the command's sandbox, and the command.
fn run_command(
    ctx: &Context,
    work: &WorkDir,
    req: &ExecRequest,
    uid: Option<u32>,
    clock: &mut PhaseClock,
    command_started: &dyn Fn(),
) -> Result<ExecOutput, SandboxError> {
    let disk_mb = req.limits.disk_mb.max(1);
    let (repo, support) = command_dirs(ctx, work, uid)?;
    // The archive of the sealed stage, made on the host, streamed into the sandbox.
    let mut archive = Command::new("tar");
    archive
        .args(stage::archive_args(None))
        .current_dir(work.path("stage"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut archiver = archive.spawn().map_err(|e| infra("starting tar", e))?;
    let tree_stream = archiver.stdout.take().expect("piped");
    let support_fd = fed_pipe(support_archive(&req.support)?)?;

    let (reports_fd, reports_writer) = report_pipe()?;
    let env = command_env(ctx, work, req, &repo, &support);

    let mut argv = vec![
        "/bin/sh".to_string(),
        "-c".into(),
        INIT.into(),
        "sh".into(),
        req.collect.clone().unwrap_or_default(),
    ];
    argv.extend(req.command.iter().cloned());
    let setup = ChildSetup {
        uid,
        nproc: req.limits.pids,
        address_space: req.limits.memory_mb.saturating_mul(1 << 20),
        file_size: disk_mb.saturating_mul(1 << 20),
        strict: matches!(ctx.isolation, Isolation::Bwrap(_)),
        fd3: None,
        fd4: Some(reports_writer.as_raw_fd()),
        fd5: Some(support_fd.as_raw_fd()),
    };
    let bwrap_args = || {
        let mut args = system_args();
        // Private scratch first: the environment may sit under /tmp or /var/tmp itself.
        args.extend(sized_tmpfs("/tmp", disk_mb));
        args.extend(sized_tmpfs("/var/tmp", disk_mb));
        args.extend(sized_tmpfs("/dev/shm", disk_mb));
        for d in environment_dirs(&ctx.venv) {
            let d = d.display().to_string();
            args.extend(["--ro-bind".into(), d.clone(), d]);
        }
        let repo_s = repo.display().to_string();
        args.extend(sized_tmpfs(&repo_s, disk_mb));
        args.extend(sized_tmpfs(SUPPORT_DIR, disk_mb));
        // One identity inside, whatever uid the execution has outside.
        args.extend(
            [
                "--uid",
                COMMAND_UID,
                "--gid",
                COMMAND_UID,
                "--hostname",
                "reprobench",
                "--chdir",
            ]
            .map(String::from),
        );
        args.push(repo_s);
        args
    };
    let (mut cmd, args_fd) = isolated(&ctx.isolation, bwrap_args, &argv, &repo, setup)?;
    cmd.env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::from(tree_stream));
    let spawned = Instant::now();
    let mut running = spawn_collected(cmd, req.limits.max_output_bytes, "the execution")?;
    drop(args_fd);
    drop(support_fd);
    drop(reports_writer);
    let mut reports = Reports {
        fd: reports_fd,
        ready_at: None,
        collected: Vec::new(),
        ended: false,
    };
    let timeout = req.limits.timeout;
    // Unpacking may take its time too, but not forever: the stage's limit from the start, then
    // the timeout from the command's start.
    let stage_dir = work.path("stage");
    let status = running.wait(spawned + timeout + STAGE_TIMEOUT, &ctx.cancelled, || {
        let ready = reports.poll()?;
        command_started();
        // The tree is in the sandbox: the stage's copy need not take memory while the test runs.
        let stage_dir = stage_dir.clone();
        std::thread::spawn(move || std::fs::remove_dir_all(stage_dir));
        Some(ready + timeout)
    })?;
    let ended = Instant::now();
    let (bytes, output_truncated) = running.finish();
    reports.poll();
    let archived = archiver.wait_with_output();
    let Some(command_start) = reports.ready_at else {
        return Err(did_not_start(status, &bytes, archived, disk_mb));
    };
    // The sandbox's start and the tree's unpacking, the command, then collecting its ends.
    clock.lap_at("unpack", command_start);
    clock.lap_at("command", ended);
    clock.lap("collect");
    let exit_code = status.and_then(|s| {
        use std::os::unix::process::ExitStatusExt;
        s.code()
            .map(i64::from)
            .or_else(|| s.signal().map(|sig| 128 + i64::from(sig)))
    });
    Ok(ExecOutput {
        exit_code,
        timed_out: status.is_none(),
        output: String::from_utf8_lossy(&bytes).into_owned(),
        output_truncated,
        prepare_log: String::new(),
        patches: Vec::new(),
        started: true,
        collected: (req.collect.is_some() && status.is_some()).then_some(reports.collected),
        command_time: ended.saturating_duration_since(command_start),
        command_cpu: None,
        overhead: Duration::ZERO,
        phases: Vec::new(),
    })
}

/// The command's environment: the venv's, the support directory's, the environment's files (the
/// tree's copy of every editable-install root first on `PYTHONPATH`, so imports resolve to the
/// tree the patches went into), then the request's.
fn command_env(
    ctx: &Context,
    work: &WorkDir,
    req: &ExecRequest,
    repo: &Path,
    support: &Path,
) -> Vec<(String, String)> {
    let venv = &ctx.venv;
    let mut env: Vec<(String, String)> = vec![
        (
            "PATH".into(),
            format!("{}/bin:/usr/local/bin:/usr/bin:/bin", venv.display()),
        ),
        ("VIRTUAL_ENV".into(), venv.display().to_string()),
        ("HOME".into(), "/tmp".into()),
        ("TMPDIR".into(), "/tmp".into()),
        ("LANG".into(), "C.UTF-8".into()),
        ("PYTHONDONTWRITEBYTECODE".into(), "1".into()),
        (SUPPORT_ENV.into(), support.display().to_string()),
    ];
    if matches!(ctx.isolation, Isolation::Unisolated) {
        let scratch = work.path("scratch").display().to_string();
        env.push(("HOME".into(), scratch.clone()));
        env.push(("TMPDIR".into(), scratch));
    }
    env.extend(read_env_file(&venv.join(ENV_FILE)));
    for (k, v) in read_env_file(&ctx.template.join(EXEC_ENV_FILE)) {
        if k == "REPROBENCH_EDITABLE" {
            if !v.is_empty() {
                let paths: Vec<String> = v
                    .split(':')
                    .map(|r| repo.join(r).display().to_string())
                    .collect();
                env.push(("PYTHONPATH".into(), paths.join(":")));
            }
        } else {
            env.push((k, v));
        }
    }
    env.extend(req.env.iter().cloned());
    env
}

/// `argv` in the execution's isolation: under bubblewrap with the options `bwrap_args` gives
/// (through a pipe, which the caller holds until the child has started and then drops; the
/// command on the command line, as bubblewrap wants it), or as it is, in `dir`, when unisolated.
/// `setup` is applied in the child.
fn isolated(
    isolation: &Isolation,
    bwrap_args: impl FnOnce() -> Vec<String>,
    argv: &[String],
    dir: &Path,
    setup: ChildSetup,
) -> Result<(Command, Option<OwnedFd>), SandboxError> {
    match isolation {
        Isolation::Bwrap(bwrap) => {
            let fd = args_pipe(&bwrap_args())?;
            let mut cmd = Command::new(bwrap);
            cmd.args(["--args", "3", "--"]).args(argv);
            ChildSetup {
                fd3: Some(fd.as_raw_fd()),
                ..setup
            }
            .install(&mut cmd);
            Ok((cmd, Some(fd)))
        }
        Isolation::Unisolated => {
            let mut cmd = Command::new(&argv[0]);
            cmd.args(&argv[1..]).current_dir(dir);
            setup.install(&mut cmd);
            Ok((cmd, None))
        }
    }
}

/// Where the tree and the support files are for the command: the checkout's own path inside the
/// sandbox (editable installs point there) and a tmpfs; directories of the work directory, handed
/// to the execution's user, when unisolated.
fn command_dirs(
    ctx: &Context,
    work: &WorkDir,
    uid: Option<u32>,
) -> Result<(PathBuf, PathBuf), SandboxError> {
    match ctx.isolation {
        Isolation::Bwrap(_) => Ok((ctx.template.clone(), PathBuf::from(SUPPORT_DIR))),
        Isolation::Unisolated => {
            let (tree, support) = (work.path("tree"), work.path("support"));
            std::fs::create_dir(&tree).map_err(|e| infra("creating the tree", e))?;
            for d in [&tree, &support, &work.path("scratch")] {
                if let Some(uid) = uid {
                    std::os::unix::fs::chown(d, Some(uid), Some(uid))
                        .map_err(|e| infra("handing the tree to the execution's user", e))?;
                }
            }
            Ok((tree, support))
        }
    }
}

/// The pipe the sandbox's init reports on (the command's start, collected files): its reading
/// end, non-blocking so the wait loop can poll it, and its writing end for the child.
fn report_pipe() -> Result<(OwnedFd, OwnedFd), SandboxError> {
    let (reader, writer) = std::io::pipe().map_err(|e| infra("creating the report pipe", e))?;
    let reader: OwnedFd = reader.into();
    // SAFETY: a valid fd we own; only its status flags change.
    unsafe {
        let flags = libc::fcntl(reader.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(reader.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
    Ok((reader, writer.into()))
}

/// Why an execution whose command never started failed: its tree did not fit the tmpfs (the
/// input's fault, with the limit to raise), or the sandbox did not start (with what it and the
/// archiver said).
fn did_not_start(
    status: Option<std::process::ExitStatus>,
    output: &[u8],
    archived: std::io::Result<std::process::Output>,
    disk_mb: u64,
) -> SandboxError {
    let archive_error = archived
        .ok()
        .filter(|o| !o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stderr).trim().to_string())
        .unwrap_or_default();
    let said = String::from_utf8_lossy(output).trim().to_string();
    if status.and_then(|s| s.code()) == Some(UNPACK_FAILED) {
        return SandboxError::BadInput(format!(
            "could not unpack the tree into the execution's tmpfs of limits.disk_mb = {disk_mb} MiB: raise limits.disk_mb. It said: {said}"
        ));
    }
    SandboxError::Infra(format!(
        "the execution's sandbox did not start ({}): {said}{}",
        status.map_or("killed".to_string(), |s| s.to_string()),
        if archive_error.is_empty() {
            String::new()
        } else {
            format!("; archiving the tree: {archive_error}")
        }
    ))
}

/// Whether bubblewrap at `bwrap` can give an execution its sandbox here (as the uid executions
/// get, when the node is root): runs `true` in one. The error says why not.
pub(super) fn probe(bwrap: &Path, as_root: bool) -> Result<(), String> {
    let mut args = system_args();
    args.extend(sized_tmpfs("/tmp", 1));
    let fd = args_pipe(&args).map_err(|e| e.to_string())?;
    let mut cmd = Command::new(bwrap);
    cmd.args(["--args", "3", "--", "/bin/true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let uid = as_root.then(ExecutionUid::draw);
    ChildSetup {
        uid: uid.as_ref().map(|u| u.0),
        nproc: 64,
        strict: true,
        fd3: Some(fd.as_raw_fd()),
        ..ChildSetup::unlimited()
    }
    .install(&mut cmd);
    let out = cmd
        .output()
        .map_err(|e| format!("cannot start {}: {e}", bwrap.display()))?;
    drop(fd);
    if out.status.success() {
        Ok(())
    } else {
        let said = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = said.trim().lines().rev().take(3).collect();
        Err(format!(
            "bubblewrap could not make a sandbox ({}): {}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
        ))
    }
}

/// `bwrap` on PATH or in the usual places.
pub(super) fn find_bwrap() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/bin".into(), "/usr/local/bin".into(), "/bin".into()])
        .map(|d| d.join("bwrap"))
        .find(|p| p.is_file())
}
