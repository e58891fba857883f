//! One execution: a throwaway container with limits, its output, its removal whatever happens.

use super::super::{
    CappedOutput, ExecOutput, ExecRequest, Limits, SandboxError, check_relative_path,
};
use super::{CONTAINER_LABEL, WORKDIR, engine_error};
use bollard::Docker;
use bollard::errors::Error as EngineError;
use bollard::models::{
    ContainerCreateBody, ContainerWaitResponse, HostConfig, HostConfigLogConfig,
};
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, CreateContainerOptions, RemoveContainerOptionsBuilder,
};
use futures_util::StreamExt;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// Where the input files are bind-mounted (read-only) before being copied into `/work`.
const INPUT_DIR: &str = "/reprobench-in";
/// Exit status of the wrapper when it could not set `/work` up (the command never ran).
/// (Unusual on purpose: the command's own statuses are told apart by the start marker anyway.)
const SETUP_FAILED: i64 = 223;
/// Printed by the wrapper right before it execs the command: marks the command's start and is
/// stripped from the output.
const MARKER: &[u8] = b"\x1ereprobench: command starts\x1e\n";
/// The wrapper, run as `sh -c WRAPPER reprobench-exec ARGV…`: stderr joins stdout so the output
/// is interleaved as written; the repository, then the input files, go into the tmpfs at /work;
/// the copy's editable-install roots (listed by the instance layer) go first on PYTHONPATH.
const WRAPPER: &str = r#"exec 2>&1
if ! { cp -a /testbed/. /work/ && cp -a /reprobench-in/. /work/ && cd /work; }; then
  echo "reprobench: copying the repository and the input files into /work failed"
  exit 223
fi
if [ -s /etc/reprobench/editable ]; then
  p=""
  while IFS= read -r r; do p="${p:+$p:}/work/$r"; done < /etc/reprobench/editable
  export PYTHONPATH="$p${PYTHONPATH:+:$PYTHONPATH}"
fi
printf '\036reprobench: command starts\036\n'
exec "$@"
"#;
/// How long a killed container may take to stop.
const STOP_GRACE: Duration = Duration::from_secs(60);
/// How long output may keep arriving after the container stopped.
const OUTPUT_GRACE: Duration = Duration::from_secs(10);

/// Engine warnings about limits it does not enforce, each logged once per sandbox.
#[derive(Debug, Default)]
pub(super) struct LimitWarnings(Mutex<HashSet<String>>);

impl LimitWarnings {
    fn warn(&self, message: &str) {
        if self
            .0
            .lock()
            .expect("warnings poisoned")
            .insert(message.to_string())
        {
            warn!(engine = %message, "the Docker engine does not enforce a limit; executions go on without it");
        }
    }
}

/// Runs one execution of `req` in a fresh container of `image`.
pub(super) async fn exec(
    docker: &Docker,
    image: &str,
    req: ExecRequest,
    warnings: &LimitWarnings,
) -> Result<ExecOutput, SandboxError> {
    if req.command.is_empty() {
        return Err(SandboxError::BadInput(
            "the execution has an empty command: give argv".into(),
        ));
    }
    for f in &req.files {
        check_relative_path(&f.path)?;
    }
    if let Some((k, _)) = req
        .env
        .iter()
        .find(|(k, _)| k.is_empty() || k.contains('='))
    {
        return Err(SandboxError::BadInput(format!(
            "environment variable name `{k}` is not valid: names are non-empty and have no `=`"
        )));
    }
    let files = req.files.clone();
    let input = tokio::task::spawn_blocking(move || write_inputs(&files))
        .await
        .map_err(|e| SandboxError::Infra(format!("writing input files panicked: {e}")))??;

    let mut argv: Vec<String> = vec![
        "/bin/sh".into(),
        "-c".into(),
        WRAPPER.into(),
        "reprobench-exec".into(),
    ];
    argv.extend(req.command.iter().cloned());
    let mut env: Vec<String> = Vec::new();
    // The root filesystem is read-only: tools that write under $HOME get the tmpfs instead.
    if !req.env.iter().any(|(k, _)| k == "HOME") {
        env.push("HOME=/tmp".into());
    }
    env.extend(req.env.iter().map(|(k, v)| format!("{k}={v}")));
    let spec = Spec {
        image,
        argv,
        env,
        limits: &req.limits,
        input_dir: Some(input.path()),
        marker: true,
    };
    let out = run(docker, spec, warnings).await?;
    if out.exit_code == Some(SETUP_FAILED) && !out.marker_seen {
        return Err(SandboxError::BadInput(format!(
            "could not copy the repository and input files into /work (limits.disk_mb = {} MiB): \
             raise limits.disk_mb. Output:\n{}",
            req.limits.disk_mb, out.output.output
        )));
    }
    Ok(out.output)
}

/// Python major.minor of an image, by running `python3` in it.
pub(super) async fn python_version(
    docker: &Docker,
    image: &str,
    warnings: &LimitWarnings,
) -> Result<String, SandboxError> {
    let limits = Limits {
        disk_mb: 16,
        timeout: Duration::from_secs(120),
        max_output_bytes: 64 << 10,
        ..Limits::default()
    };
    let argv = [
        "python3",
        "-c",
        "import sys; print('%d.%d' % sys.version_info[:2])",
    ];
    let spec = Spec {
        image,
        argv: argv.iter().map(|s| s.to_string()).collect(),
        env: Vec::new(),
        limits: &limits,
        input_dir: None,
        marker: false,
    };
    let out = run(docker, spec, warnings).await?.output;
    let version = out.output.trim();
    let looks_right =
        version.split('.').count() == 2 && version.split('.').all(|p| p.parse::<u32>().is_ok());
    if out.exit_code != Some(0) || !looks_right {
        return Err(SandboxError::Infra(format!(
            "base image {image} cannot tell its Python version (`python3` exited with {:?}): {}; \
             rebuild it with `reprobench images bootstrap --force` or pass another base image",
            out.exit_code,
            out.output.trim()
        )));
    }
    debug!(image, version, "base image Python");
    Ok(version.to_string())
}

/// What to run.
struct Spec<'a> {
    image: &'a str,
    argv: Vec<String>,
    env: Vec<String>,
    limits: &'a Limits,
    /// Host directory bound read-only at [`INPUT_DIR`].
    input_dir: Option<&'a Path>,
    /// The command prints [`MARKER`] when it starts.
    marker: bool,
}

/// What came back, plus whether the wrapper reached the command.
struct Ran {
    output: ExecOutput,
    exit_code: Option<i64>,
    marker_seen: bool,
}

/// Creates, runs, and removes one container.
async fn run(
    docker: &Docker,
    spec: Spec<'_>,
    warnings: &LimitWarnings,
) -> Result<Ran, SandboxError> {
    let begun = Instant::now();
    let id = create(docker, &spec, warnings).await?;
    let mut container = Container {
        docker: docker.clone(),
        id,
        removed: false,
    };
    let driven = drive(docker, &container.id, &spec).await;
    // Removed on every path: here when we get this far, by the guard's Drop when cancelled.
    if let Err(e) = container.remove().await {
        warn!(container = %container.id, error = %e, "cannot remove execution container");
    }
    let driven = driven?;
    let command_time = driven.command_time;
    let exit_code = driven.exit_code;
    Ok(Ran {
        output: ExecOutput {
            exit_code,
            timed_out: driven.timed_out,
            output: String::from_utf8_lossy(&driven.output).into_owned(),
            output_truncated: driven.output_truncated,
            command_time,
            overhead: begun.elapsed().saturating_sub(command_time),
        },
        exit_code,
        marker_seen: driven.marker_seen,
    })
}

/// A limit the engine may refuse to set on this kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Limit {
    Cpu,
    Memory,
    Pids,
}

/// Which limit an engine error says is unsupported, if that is what it says.
fn unsupported_limit(message: &str) -> Option<Limit> {
    let m = message.to_lowercase();
    if !(m.contains("does not support")
        || m.contains("not supported")
        || m.contains("cgroup is not mounted"))
    {
        return None;
    }
    if m.contains("pids") {
        Some(Limit::Pids)
    } else if m.contains("memory") || m.contains("swap") {
        Some(Limit::Memory)
    } else if m.contains("cpu") {
        Some(Limit::Cpu)
    } else {
        None
    }
}

fn container_body(spec: &Spec<'_>, dropped: &HashSet<Limit>) -> ContainerCreateBody {
    let l = spec.limits;
    let positive = |v: i64| (v > 0).then_some(v);
    let memory = positive((l.memory_mb as i64).saturating_mul(1 << 20))
        .filter(|_| !dropped.contains(&Limit::Memory));
    let size = if l.disk_mb > 0 {
        format!(",size={}m", l.disk_mb)
    } else {
        String::new()
    };
    let tmpfs = HashMap::from([
        (
            "/work".to_string(),
            format!("rw,exec,nosuid,nodev,mode=1777{size}"),
        ),
        (
            "/tmp".to_string(),
            format!("rw,exec,nosuid,nodev,mode=1777{size}"),
        ),
    ]);
    let host_config = HostConfig {
        network_mode: Some("none".into()),
        nano_cpus: positive((l.cpus * 1e9) as i64).filter(|_| !dropped.contains(&Limit::Cpu)),
        memory,
        // Swap equal to memory: no swap on top, so the memory limit is the limit.
        memory_swap: memory,
        pids_limit: positive(l.pids as i64).filter(|_| !dropped.contains(&Limit::Pids)),
        readonly_rootfs: Some(true),
        tmpfs: Some(tmpfs),
        binds: spec
            .input_dir
            .map(|d| vec![format!("{}:{INPUT_DIR}:ro", d.display())]),
        // The output is collected through attach; a log driver would copy it to the host disk.
        log_config: Some(HostConfigLogConfig {
            typ: Some("none".into()),
            config: None,
        }),
        // An init as PID 1 reaps orphans, which would otherwise count against the pids limit.
        init: Some(true),
        security_opt: Some(vec!["no-new-privileges".into()]),
        ..Default::default()
    };
    ContainerCreateBody {
        image: Some(spec.image.to_string()),
        cmd: Some(spec.argv.clone()),
        env: Some(spec.env.clone()),
        working_dir: Some(if spec.marker { WORKDIR } else { "/" }.into()),
        labels: Some(HashMap::from([
            (CONTAINER_LABEL.to_string(), "docker".to_string()),
            ("reprobench.image".to_string(), spec.image.to_string()),
        ])),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(false),
        host_config: Some(host_config),
        ..Default::default()
    }
}

/// Creates the container, dropping limits the engine refuses as unsupported (with a warning).
async fn create(
    docker: &Docker,
    spec: &Spec<'_>,
    warnings: &LimitWarnings,
) -> Result<String, SandboxError> {
    let mut dropped = HashSet::new();
    loop {
        match docker
            .create_container(
                None::<CreateContainerOptions>,
                container_body(spec, &dropped),
            )
            .await
        {
            Ok(r) => {
                for w in &r.warnings {
                    warnings.warn(w);
                }
                return Ok(r.id);
            }
            Err(EngineError::DockerResponseServerError {
                status_code,
                message,
            }) => {
                if let Some(limit) = unsupported_limit(&message).filter(|l| !dropped.contains(l)) {
                    warnings.warn(&message);
                    dropped.insert(limit);
                    continue;
                }
                if status_code == 404 {
                    return Err(SandboxError::Infra(format!(
                        "image {} is gone from the engine ({message}): prepare the instance again",
                        spec.image
                    )));
                }
                return Err(SandboxError::Infra(format!(
                    "the Docker engine refused to create the execution container: {message}"
                )));
            }
            Err(e) => return Err(engine_error("creating the execution container", e)),
        }
    }
}

/// Removes its container when dropped, unless already removed: executions cancelled mid-way
/// leave nothing behind.
struct Container {
    docker: Docker,
    id: String,
    removed: bool,
}

impl Container {
    async fn remove(&mut self) -> Result<(), EngineError> {
        self.removed = true;
        let options = RemoveContainerOptionsBuilder::new()
            .force(true)
            .v(true)
            .build();
        match self.docker.remove_container(&self.id, Some(options)).await {
            Err(EngineError::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(()),
            r => r,
        }
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if self.removed {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            warn!(container = %self.id, "no runtime to remove the execution container; remove it with `docker rm -f`");
            return;
        };
        let (docker, id) = (self.docker.clone(), self.id.clone());
        rt.spawn(async move {
            let options = RemoveContainerOptionsBuilder::new()
                .force(true)
                .v(true)
                .build();
            if let Err(e) = docker.remove_container(&id, Some(options)).await {
                warn!(container = %id, error = %e, "cannot remove execution container");
            }
        });
    }
}

struct Driven {
    exit_code: Option<i64>,
    timed_out: bool,
    output: Vec<u8>,
    output_truncated: bool,
    marker_seen: bool,
    command_time: Duration,
}

/// Attaches, starts, waits with the timeout (killing the container when it passes), collects.
async fn drive(docker: &Docker, id: &str, spec: &Spec<'_>) -> Result<Driven, SandboxError> {
    let options = AttachContainerOptionsBuilder::new()
        .stream(true)
        .stdout(true)
        .stderr(true)
        .build();
    // Attached before start, so no output is missed.
    let attached = docker
        .attach_container(id, Some(options))
        .await
        .map_err(|e| engine_error("attaching to the execution container", e))?;
    let collector = Arc::new(Mutex::new(Collector::new(
        spec.limits.max_output_bytes,
        spec.marker,
    )));
    let mut reader = tokio::spawn({
        let collector = collector.clone();
        let mut stream = attached.output;
        async move {
            while let Some(Ok(chunk)) = stream.next().await {
                collector
                    .lock()
                    .expect("collector poisoned")
                    .push(chunk.as_ref(), Instant::now());
            }
        }
    });
    let _stop_reader = AbortOnDrop(reader.abort_handle());

    docker
        .start_container(id, None)
        .await
        .map_err(|e| engine_error("starting the execution container", e))?;
    let started = Instant::now();
    let mut wait = Box::pin(docker.wait_container(id, None));
    let deadline = tokio::time::Instant::from_std(started + spec.limits.timeout);
    let (exit_code, timed_out, ended) = match tokio::time::timeout_at(deadline, wait.next()).await {
        Ok(status) => (Some(exit_status(status)?), false, Instant::now()),
        Err(_) => {
            let ended = Instant::now();
            // SIGKILL to the container's PID 1 ends its whole PID namespace: every process.
            let killed = docker.kill_container(id, None).await;
            let status = tokio::time::timeout(STOP_GRACE, wait.next()).await.map_err(|_| {
                SandboxError::Infra(format!(
                    "execution container {id} did not stop within {STOP_GRACE:?} of being killed"
                ))
            })?;
            match killed {
                Ok(()) => (None, true, ended),
                // It exited on its own just as the timeout passed: that is a normal exit.
                Err(EngineError::DockerResponseServerError {
                    status_code: 409, ..
                }) => (Some(exit_status(status)?), false, ended),
                Err(e) => return Err(engine_error("killing the timed-out execution container", e)),
            }
        }
    };
    // The attach stream ends once the container has stopped; do not wait forever for it.
    if tokio::time::timeout(OUTPUT_GRACE, &mut reader)
        .await
        .is_err()
    {
        warn!(container = %id, "output did not end after the container stopped; keeping what came");
    }
    let mut output = std::mem::replace(&mut *crate::lock(&collector), Collector::new(0, false));
    output.finish();
    let command_start = match output.marker {
        Marker::Seen(at) => at,
        _ => started,
    };
    if exit_code == Some(137) && !timed_out {
        let oom = docker
            .inspect_container(id, None)
            .await
            .ok()
            .and_then(|c| c.state)
            .and_then(|s| s.oom_killed)
            .unwrap_or(false);
        if oom {
            warn!(container = %id, memory_mb = spec.limits.memory_mb, "execution was killed for exceeding its memory limit");
        }
    }
    let marker_seen = matches!(output.marker, Marker::Seen(_));
    let (output, output_truncated) = output.kept.finish();
    Ok(Driven {
        exit_code,
        timed_out,
        output,
        output_truncated,
        marker_seen,
        command_time: ended.saturating_duration_since(command_start),
    })
}

struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn exit_status(
    item: Option<Result<ContainerWaitResponse, EngineError>>,
) -> Result<i64, SandboxError> {
    match item {
        Some(Ok(r)) => Ok(r.status_code),
        // bollard reports non-zero exits as errors.
        Some(Err(EngineError::DockerContainerWaitError { code, .. })) => Ok(code),
        Some(Err(e)) => Err(engine_error("waiting for the execution container", e)),
        None => Err(SandboxError::Infra(
            "the Docker engine ended the wait for the execution container without an exit status"
                .into(),
        )),
    }
}

/// Whether the start marker was seen.
#[derive(Debug, Clone, PartialEq)]
enum Marker {
    /// Not expected.
    Off,
    /// Expected; the first bytes so far (a prefix of the marker).
    Waiting(Vec<u8>),
    /// Seen when.
    Seen(Instant),
    /// Expected but the output began otherwise.
    Absent,
}

/// Output as it arrives: kept within a cap (its head and tail), the start marker stripped.
#[derive(Debug)]
struct Collector {
    kept: CappedOutput,
    marker: Marker,
}

impl Collector {
    fn new(max: usize, marker: bool) -> Self {
        Collector {
            kept: CappedOutput::new(max),
            marker: if marker {
                Marker::Waiting(Vec::new())
            } else {
                Marker::Off
            },
        }
    }

    fn push(&mut self, bytes: &[u8], now: Instant) {
        let Marker::Waiting(head) = &mut self.marker else {
            self.keep(bytes);
            return;
        };
        head.extend_from_slice(bytes);
        let head = std::mem::take(head);
        if head.starts_with(MARKER) {
            self.marker = Marker::Seen(now);
            self.keep(&head[MARKER.len()..]);
        } else if MARKER.starts_with(&head) {
            self.marker = Marker::Waiting(head);
        } else {
            self.marker = Marker::Absent;
            self.keep(&head);
        }
    }

    /// The output ended: a partial marker was output after all.
    fn finish(&mut self) {
        if let Marker::Waiting(head) = &mut self.marker {
            let head = std::mem::take(head);
            self.marker = Marker::Absent;
            self.keep(&head);
        }
    }

    fn keep(&mut self, bytes: &[u8]) {
        self.kept.push(bytes);
    }
}

/// Writes the input files into a fresh host directory (bound read-only into the container).
fn write_inputs(files: &[super::super::InputFile]) -> Result<tempfile::TempDir, SandboxError> {
    use std::os::unix::fs::PermissionsExt;
    let io = |e: std::io::Error| {
        SandboxError::Infra(format!("cannot write input files to the temp dir: {e}"))
    };
    let dir = tempfile::Builder::new()
        .prefix("reprobench-in-")
        .tempdir()
        .map_err(io)?;
    // Readable by the container's root even when the engine remaps users.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).map_err(io)?;
    for f in files {
        let path = dir.path().join(&f.path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        std::fs::write(&path, &f.contents).map_err(io)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(f.mode & 0o7777))
            .map_err(io)?;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wrapper_prints_the_marker_and_its_setup_status() {
        let printf = WRAPPER.lines().find(|l| l.starts_with("printf")).unwrap();
        let out = std::process::Command::new("sh")
            .args(["-c", printf])
            .output()
            .unwrap();
        assert_eq!(out.stdout, MARKER);
        assert!(WRAPPER.contains(&format!("exit {SETUP_FAILED}\n")));
    }

    #[test]
    fn marker_is_stripped_even_when_split() {
        let t = Instant::now();
        let mut c = Collector::new(100, true);
        c.push(&MARKER[..5], t);
        assert_eq!(c.marker, Marker::Waiting(MARKER[..5].to_vec()));
        let mut rest = MARKER[5..].to_vec();
        rest.extend_from_slice(b"hello");
        c.push(&rest, t);
        c.push(b" world", t);
        c.finish();
        assert_eq!(c.marker, Marker::Seen(t));
        assert_eq!(c.kept.finish().0, b"hello world");
    }

    #[test]
    fn output_without_marker_is_kept_whole() {
        let t = Instant::now();
        let mut c = Collector::new(100, true);
        c.push(b"cp: error", t);
        c.finish();
        assert_eq!(c.marker, Marker::Absent);
        assert_eq!(c.kept.finish().0, b"cp: error");
        let mut c = Collector::new(100, true);
        c.push(&MARKER[..3], t);
        c.finish();
        assert_eq!(c.kept.finish().0, &MARKER[..3]);
    }

    #[test]
    fn output_is_kept_within_the_cap() {
        let t = Instant::now();
        let mut c = Collector::new(8, false);
        c.push(b"ab\n", t);
        c.push(b"cdef\nghij\nkl", t);
        let (kept, truncated) = c.kept.finish();
        let kept = String::from_utf8(kept).unwrap();
        assert!(truncated);
        assert!(kept.starts_with("ab\nc\n[reprobench: 9 bytes"), "{kept}");
        assert!(kept.ends_with("bytes]\nkl"), "{kept}");
    }

    #[test]
    fn unsupported_limits_are_recognised() {
        let cases = [
            (
                "Your kernel does not support pids limit capabilities or the cgroup is not mounted.",
                Some(Limit::Pids),
            ),
            (
                "Your kernel does not support swap limit capabilities",
                Some(Limit::Memory),
            ),
            (
                "NanoCPUs can not be set, as your kernel does not support CPU CFS scheduler or the cgroup is not mounted",
                Some(Limit::Cpu),
            ),
            ("No such image: x", None),
            ("invalid mount config", None),
        ];
        for (msg, want) in cases {
            assert_eq!(unsupported_limit(msg), want, "{msg}");
        }
    }

    #[test]
    fn limits_become_host_config() {
        let limits = Limits {
            cpus: 1.5,
            memory_mb: 512,
            pids: 64,
            disk_mb: 100,
            ..Limits::default()
        };
        let spec = Spec {
            image: "img",
            argv: vec!["true".into()],
            env: vec![],
            limits: &limits,
            input_dir: Some(Path::new("/tmp/in")),
            marker: true,
        };
        let hc = container_body(&spec, &HashSet::new()).host_config.unwrap();
        assert_eq!(hc.network_mode.as_deref(), Some("none"));
        assert_eq!(hc.nano_cpus, Some(1_500_000_000));
        assert_eq!(hc.memory, Some(512 << 20));
        assert_eq!(hc.memory_swap, hc.memory);
        assert_eq!(hc.pids_limit, Some(64));
        assert_eq!(hc.readonly_rootfs, Some(true));
        assert_eq!(
            hc.tmpfs.unwrap()["/work"],
            "rw,exec,nosuid,nodev,mode=1777,size=100m"
        );
        assert_eq!(hc.binds.unwrap(), ["/tmp/in:/reprobench-in:ro"]);
        let hc = container_body(&spec, &HashSet::from([Limit::Pids, Limit::Cpu]))
            .host_config
            .unwrap();
        assert_eq!((hc.pids_limit, hc.nano_cpus), (None, None));
    }
}
