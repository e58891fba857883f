//! One execution: a throwaway container with limits, its output, its removal whatever happens.
//!
//! The container starts as root with a handful of capabilities and reads its inputs from its
//! standard input (an archive: the script, the patches, the files, the support files), never
//! from a mount. The script unpacks the image's archive of the repository ([`super::REPO_ARCHIVE`],
//! root's alone) into `/stage` (a tmpfs only root can enter; owners, modes and times kept, and
//! one file read through the storage driver where copying the tree read each of its files),
//! writes the files, applies the patches and seals the tree ([`crate::stage`]), unpacks it into
//! `/work` (a tmpfs of its own, owned by the test's user) in name order, removes the stage, and
//! then, once the execution is handed the container (a [`GO`] line after the archive), runs the
//! command as an unprivileged user ([`TEST_UID`]) that can gain no privilege. The
//! script's marker lines carry a nonce that only root's script holds, so the command cannot
//! print them; it waits for the command, says how it ended, and prints the collected file.
//! When the script ends, so does the container, and with it every process the command started.
//!
//! Ahead ([`Ahead`]): while an execution runs, the container for the next one of the same image
//! and limits is booted and makes its copy; when the next execution was announced
//! ([`crate::Sandbox::exec_ahead`]), it is also given that execution's archive, stages its tree
//! and waits for the go line, which only an execution of an equal request sends.

use super::super::stage::{self, SUPPORT_ENV};
use super::super::stage_ahead::{self, StageAheadMode};
use super::super::{
    CappedOutput, ExecOutput, ExecRequest, Limits, SandboxError, check_relative_path,
};
use super::{CONTAINER_LABEL, engine_error, unix_ns};
use bollard::Docker;
use bollard::errors::Error as EngineError;
use bollard::models::{
    ContainerCreateBody, ContainerWaitResponse, HostConfig, HostConfigLogConfig,
};
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, CreateContainerOptions, ListContainersOptionsBuilder,
    RemoveContainerOptionsBuilder,
};
use futures_util::StreamExt;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tracing::{debug, info, warn};

/// The uid (and gid) the command runs as: no user of the image, not root.
pub const TEST_UID: u32 = 1000;
/// The host name every execution has.
pub const HOSTNAME: &str = "reprobench";
/// Where the support files are in the container.
const SUPPORT_DIR: &str = "/reprobench";
/// Exit status of the script when it could not set the tree up (the command never ran).
const SETUP_FAILED: i64 = 223;
/// The container's command: note when it began, unpack the repository's archive into root's
/// stage (owners, modes and times kept), note when that was done, then
/// read the input archive (its length on a first line) from standard input and run the script
/// (which reads the [`GO`] line that follows from the same input).
/// The same for every execution: nothing in it is the execution's, so a container can be
/// booted, its copy made, before the execution that takes it is known.
fn boot_command() -> String {
    format!(
        "date +%s%N > /stage/booted; \
         if {}; then date +%s%N > /stage/copied; else rm -rf /stage/repo; fi; \
         IFS= read -r n && mkdir -m 700 /stage/in && head -c \"$n\" | tar -x -f - -C /stage/in && exec /bin/sh /stage/in/run.sh",
        super::unpack_into_stage()
    )
}
/// The line that hands an execution its container: the script waits for it, after staging and
/// unpacking the tree, before the command starts. Written right after the archive, or, when
/// the archive was written ahead, by the execution that takes the container.
const GO: &[u8] = b"go\n";
/// Capabilities root's script needs (copies keeping owners and modes, the switch to the test's
/// user); the command has none.
const CAPABILITIES: [&str; 5] = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID"];
/// How long a killed container may take to stop.
const STOP_GRACE: Duration = Duration::from_secs(60);
/// How long output may keep arriving after the container stopped.
const OUTPUT_GRACE: Duration = Duration::from_secs(10);
/// Label naming the node process that made a container (`HOST/PID-START`), so a later node can
/// remove the containers of one that is gone.
const OWNER_LABEL: &str = "reprobench.owner";

/// This process as an owner: host name, pid and start time.
fn owner() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!(
        "{}/{}",
        host.trim(),
        process_tag(std::process::id()).unwrap_or_default()
    )
}

/// `PID-START` of a live process (start: field 22 of `/proc/PID/stat`).
fn process_tag(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    Some(format!("{pid}-{}", after.split_whitespace().nth(19)?))
}

/// Whether the owner a container names is a node process of this host that is gone.
fn owner_is_gone(label: &str, this_host: &str) -> bool {
    let Some((host, tag)) = label.split_once('/') else {
        return false;
    };
    if host != this_host {
        return false; // another host's: it may be alive
    }
    let pid = tag.split('-').next().and_then(|p| p.parse::<u32>().ok());
    pid.and_then(process_tag).as_deref() != Some(tag)
}

/// Removes the execution containers that node processes of this host no longer running left
/// behind (a crashed node's), and stopped ones made before containers named their owner;
/// returns how many.
pub(super) async fn remove_leftovers(docker: &Docker) -> usize {
    let filters = HashMap::from([("label".to_string(), vec![CONTAINER_LABEL.to_string()])]);
    let options = ListContainersOptionsBuilder::new()
        .all(true)
        .filters(&filters)
        .build();
    let containers = match docker.list_containers(Some(options)).await {
        Ok(c) => c,
        Err(e) => {
            warn!(error = %e, "cannot list execution containers to remove leftovers");
            return 0;
        }
    };
    let this = owner();
    let this_host = this.split('/').next().unwrap_or_default().to_string();
    let mut removed = 0;
    for c in containers {
        let Some(id) = c.id else { continue };
        let labels = c.labels.unwrap_or_default();
        let running = c.state.map(|s| s.to_string()) == Some("running".to_string());
        let gone = match labels.get(OWNER_LABEL) {
            Some(owner) => owner_is_gone(owner, &this_host),
            None => !running,
        };
        if !gone {
            continue;
        }
        let options = RemoveContainerOptionsBuilder::new()
            .force(true)
            .v(true)
            .build();
        match docker.remove_container(&id, Some(options)).await {
            Ok(()) => removed += 1,
            Err(e) => {
                warn!(container = %id, error = %e, "cannot remove a leftover execution container")
            }
        }
    }
    if removed > 0 {
        info!(
            removed,
            "removed execution containers of nodes no longer running"
        );
    }
    removed
}

/// Engine warnings about limits it does not enforce, each logged once per sandbox.
#[derive(Debug, Default)]
pub(super) struct LimitWarnings(Mutex<std::collections::HashSet<String>>);

impl LimitWarnings {
    fn note(&self, message: &str) {
        if crate::lock(&self.0).insert(message.to_string()) {
            warn!(engine = %message, "the Docker engine warned about a limit");
        }
    }
}

/// The root script of an execution: stage, patches, seal, `/work`, the command, its end.
fn script(nonce: &str, req: &ExecRequest) -> String {
    let q = stage::quote;
    let patches: Vec<(String, String)> = req
        .patches
        .iter()
        .enumerate()
        .map(|(i, p)| (p.label.clone(), format!("/stage/in/patches/{i}.patch")))
        .collect();
    let command: Vec<String> = req.command.iter().map(|w| q(w)).collect();
    let collect = req.collect.as_deref().map(|c| format!("{SUPPORT_DIR}/{c}"));
    let mut s = format!(
        "N={nonce}\nU={TEST_UID}\nexec 2>&1 3<&0 </dev/null\n\
         failed() {{ echo \"REPROBENCH-$N SETUP-FAILED $1\"; exit {SETUP_FAILED}; }}\n\
         phase() {{ echo \"REPROBENCH-$N PHASE $1 $(date +%s%N)\"; }}\n\
         [ -f /stage/copied ] || failed 'copying the repository'\n\
         echo \"REPROBENCH-$N PHASE boot $(cat /stage/booted)\"\n\
         echo \"REPROBENCH-$N PHASE copy $(cat /stage/copied)\"\n\
         phase input\n\
         if [ -d /stage/in/files ]; then cp -a /stage/in/files/. /stage/repo/ || failed 'writing the files'; fi\n\
         phase files\n"
    );
    // In a subshell: nothing the stage sets reaches the command.
    s.push_str("(\ncd /stage/repo || exit 1\n");
    s.push_str(stage::FUNCTIONS);
    s.push_str(&stage::steps(&patches, "/stage/seal"));
    s.push_str(")\ncd /stage/repo || failed 'entering the stage'\nphase stage\n");
    s.push_str(&format!(
        "tar {} | (cd /work && tar -x -p -f -) || failed 'unpacking the tree into /work'\n\
         cd / && rm -rf /stage/repo /stage/seal\n\
         if [ -d /stage/in/support ]; then cp -a /stage/in/support/. {SUPPORT_DIR}/ || failed 'writing the support files'; fi\n",
        stage::archive_args(Some(TEST_UID)).join(" ")
    ));
    if let Some(c) = &collect {
        s.push_str(&format!(
            "mkdir -p \"$(dirname {c})\" && : > {c} && chown \"$U:$U\" {c} || failed 'making the collected file'\n",
            c = q(c)
        ));
    }
    // The tree's copy of every editable-install root (listed by the instance layer) first on
    // PYTHONPATH.
    s.push_str(&format!(
        "if [ -s /etc/reprobench/editable ]; then\n  p=\"\"\n  while IFS= read -r r; do p=\"${{p:+$p:}}/work/$r\"; done < /etc/reprobench/editable\n  export PYTHONPATH=\"$p${{PYTHONPATH:+:$PYTHONPATH}}\"\nfi\n\
         export {SUPPORT_ENV}={SUPPORT_DIR}\n\
         cd /work\n\
         phase unpack\n\
         IFS= read -r go <&3 && [ \"$go\" = go ] || exit 1\n\
         exec 3<&-\n\
         echo \"REPROBENCH-$N START $(date +%s%N)\"\n\
         times > /stage/cpu-before\n\
         setpriv --reuid=\"$U\" --regid=\"$U\" --clear-groups -- {}\n\
         rc=$?\n\
         times > /stage/cpu-after\n\
         echo \"REPROBENCH-$N END $rc $(date +%s%N) $(tail -n 1 /stage/cpu-before) $(tail -n 1 /stage/cpu-after)\"\n",
        command.join(" ")
    ));
    if let Some(c) = &collect {
        s.push_str(&format!(
            "if [ -f {c} ]; then base64 {c} | while IFS= read -r l; do echo \"REPROBENCH-$N COLLECT $l\"; done; fi\n",
            c = q(c)
        ));
    }
    s.push_str("echo \"REPROBENCH-$N DONE\"\nexit $rc\n");
    s
}

/// The archive the container reads from its standard input, with its length on a first line.
fn input_archive(run_sh: &str, req: &ExecRequest) -> Result<Vec<u8>, SandboxError> {
    let io =
        |e: std::io::Error| SandboxError::Infra(format!("packing the execution's inputs: {e}"));
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |path: &str, contents: &[u8], mode: u32| -> Result<(), SandboxError> {
        let mut h = tar::Header::new_gnu();
        h.set_size(contents.len() as u64);
        h.set_mode(mode & 0o7777);
        h.set_mtime(stage::SEAL_TIME as u64);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, path, contents).map_err(io)
    };
    add("run.sh", run_sh.as_bytes(), 0o700)?;
    for (i, p) in req.patches.iter().enumerate() {
        add(&format!("patches/{i}.patch"), &p.contents, 0o600)?;
    }
    for (dir, files) in [("files", &req.files), ("support", &req.support)] {
        for f in files {
            check_relative_path(&f.path)?;
            add(&format!("{dir}/{}", f.path), &f.contents, f.mode)?;
        }
    }
    let bytes = b.into_inner().map_err(io)?;
    let mut out = format!("{}\n", bytes.len()).into_bytes();
    out.extend_from_slice(&bytes);
    Ok(out)
}

/// Refuses a request that cannot run: an empty command, a bad environment variable name, a
/// collected file's path that leaves the support directory.
fn validate(req: &ExecRequest) -> Result<(), SandboxError> {
    if req.command.is_empty() {
        return Err(SandboxError::BadInput(
            "the execution has an empty command: give argv".into(),
        ));
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
    if let Some(c) = &req.collect {
        check_relative_path(c)?;
    }
    Ok(())
}

/// The container an execution of `req` runs in (its input left to fill): the same for every
/// request with the same image, environment and limits.
fn execution_spec<'a>(image: &'a str, req: &'a ExecRequest) -> Spec<'a> {
    let mut env: Vec<String> = Vec::new();
    // The root filesystem is read-only: tools that write under $HOME get the tmpfs instead.
    if !req.env.iter().any(|(k, _)| k == "HOME") {
        env.push("HOME=/tmp".into());
    }
    env.extend(req.env.iter().map(|(k, v)| format!("{k}={v}")));
    Spec {
        image,
        argv: vec!["/bin/sh".into(), "-c".into(), boot_command()],
        env,
        limits: &req.limits,
        stdin: Some(Vec::new()),
        execution: true,
    }
}

/// Runs one execution of `req` in a fresh container of `image`: one booted ahead for the same
/// image and limits when `ahead` holds one (and, when it staged this very request's tree ahead,
/// that tree), else one booted now; either way the next one is booted ahead while this one runs.
pub(super) async fn exec(
    docker: &Docker,
    image: &str,
    req: ExecRequest,
    warnings: &LimitWarnings,
    removals: &Removals,
    ahead: &Ahead,
) -> Result<ExecOutput, SandboxError> {
    let begun = Instant::now();
    validate(&req)?;
    let mut spec = execution_spec(image, &req);
    let taken = ahead.take(&spec.key(), &req).await;
    let (booted, staged_nonce) = match taken {
        Some(t) => (Some(t.booted), t.staged_nonce),
        None => (None, None),
    };
    let staged_ahead = staged_nonce.is_some();
    let nonce = staged_nonce.unwrap_or_else(|| reprobench_domain::secret::random_hex(16));
    let mut input = if staged_ahead {
        Vec::new()
    } else {
        input_archive(&script(&nonce, &req), &req)?
    };
    input.extend_from_slice(GO);
    spec.stdin = Some(input);
    let ran = run(
        docker,
        spec,
        Framer::new(&nonce, req.limits.max_output_bytes),
        warnings,
        removals,
        Some((ahead, booted)),
    )
    .await?;
    let times = ran.times;
    let parts = ran.output.finish();
    let staged = stage::read(&parts.setup, &nonce);
    if !parts.started {
        if ran.timed_out {
            return Err(SandboxError::Infra(format!(
                "preparing the tree (copies, patches, sealing) took the whole timeout of {:?}",
                req.limits.timeout
            )));
        }
        // The script's own failure line names the step; the nonce stays out of the error.
        let failure = format!("REPROBENCH-{nonce} SETUP-FAILED ");
        let (failed_at, said): (Vec<&str>, Vec<&str>) =
            staged.log.lines().partition(|l| l.starts_with(&failure));
        let step = failed_at.first().map_or("", |l| l[failure.len()..].trim());
        let said = said.join("\n");
        let said = said.trim();
        if ran.exit_code == Some(SETUP_FAILED) {
            return Err(SandboxError::BadInput(format!(
                "could not set the execution's tree up in its tmpfs ({step}; limits.disk_mb = {} MiB): raise limits.disk_mb. It said: {said}",
                req.limits.disk_mb
            )));
        }
        return Err(SandboxError::Infra(format!(
            "the execution container ended ({:?}) before its command started: {said}",
            ran.exit_code
        )));
    }
    let command_time = match parts.test_ns {
        Some(ns) => Duration::from_nanos(ns),
        None => ran.ran_for,
    };
    let handover = if staged_ahead { "ahead" } else { "go" };
    let phases = timeline(&times, &parts, handover);
    Ok(ExecOutput {
        exit_code: if ran.timed_out { None } else { ran.exit_code },
        timed_out: ran.timed_out,
        output: parts.test,
        output_truncated: parts.test_truncated,
        prepare_log: staged.log,
        patches: staged.patches,
        started: true,
        collected: parts.collected,
        command_time,
        command_cpu: parts.command_cpu,
        overhead: begun.elapsed().saturating_sub(command_time),
        phases,
    })
}

/// An execution's phases from the host's times and the script's marks: creating and attaching
/// to the container, its start up to the script, the copy, the stage, the unpacking, the
/// handover up to the command's start (`handover`: `go`, or `ahead` when the tree was staged
/// ahead, which then includes waiting for that staging to end), the command, its exit as the
/// engine reported it, and the end of its output. Phases that ended before the execution took
/// its container took none of its time; phases whose ends are not known (the script did not
/// get that far) are left out.
fn timeline(host: &HostTimes, framed: &Framed, handover: &'static str) -> Vec<crate::Phase> {
    let phase = |name, took| crate::Phase { name, took };
    let mut out = vec![phase("create", host.create), phase("attach", host.attach)];
    let mut ends: Vec<(&'static str, u64)> = framed.marks.clone();
    ends.extend(framed.start_ns.map(|t| (handover, t)));
    ends.extend(framed.end_ns.map(|t| ("command", t)));
    ends.push(("exit", host.exit_seen_ns));
    let mut last = host.start_requested_ns;
    for (name, end) in ends {
        out.push(phase(name, Duration::from_nanos(end.saturating_sub(last))));
        last = last.max(end);
    }
    out.push(phase("output", host.output_wait));
    out
}

/// The phases the root script marks as each ends, in order: the container's start up to its
/// command (`boot`), the repository's copy into the stage (`copy`; both are over before the
/// execution is handed over when the container was booted ahead, and take no time of it then),
/// reading the execution's input up to the script (`input`), writing its files (`files`), its
/// patches and the seal (`stage`), the tree's unpacking into `/work` (`unpack`; these four are
/// over before the handover too when the tree was staged ahead).
const SCRIPT_PHASES: [&str; 6] = ["boot", "copy", "input", "files", "stage", "unpack"];

/// The longest line read as a marker; longer lines beginning like one are output.
const MAX_MARKER_LINE: usize = 1 << 16;
/// What the script printed before the command started (the copies, the patches) keeps at most
/// this much.
const SETUP_CAP: usize = 4 << 20;

/// An execution's output as it arrives, split by the script's marker lines (which carry the
/// nonce): the setup before the command started, the command's output (kept within its cap,
/// head and tail), its time, and the collected file. A line is held back only while it may
/// still be a marker, so long lines stream through.
#[derive(Debug)]
struct Framer {
    tag: Vec<u8>,
    setup: Vec<u8>,
    test: CappedOutput,
    collected: Vec<u8>,
    collecting: bool,
    started: bool,
    ended: bool,
    start_ns: Option<u64>,
    test_ns: Option<u64>,
    end_ns: Option<u64>,
    /// CPU time the command and the children it waited for used, as the script's shell read it.
    command_cpu: Option<Duration>,
    /// The command's exit status, as the script said it.
    status: Option<i64>,
    /// The script gave its last mark: all the output that counts is in.
    done: bool,
    /// The root script's phase marks before the command: (phase, when it ended in ns).
    marks: Vec<(&'static str, u64)>,
    /// The current line's beginning, held while it may be a marker.
    line: Vec<u8>,
    holding: bool,
    at_line_start: bool,
}

impl Framer {
    fn new(nonce: &str, cap: usize) -> Framer {
        Framer {
            tag: format!("REPROBENCH-{nonce} ").into_bytes(),
            setup: Vec::new(),
            test: CappedOutput::new(cap),
            collected: Vec::new(),
            collecting: false,
            started: false,
            ended: false,
            start_ns: None,
            test_ns: None,
            end_ns: None,
            command_cpu: None,
            status: None,
            done: false,
            marks: Vec::new(),
            line: Vec::new(),
            holding: false,
            at_line_start: true,
        }
    }

    fn push(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.at_line_start {
                self.holding = true;
                self.line.clear();
                self.at_line_start = false;
            }
            let (piece, rest, ends) = match bytes.iter().position(|b| *b == b'\n') {
                Some(i) => (&bytes[..=i], &bytes[i + 1..], true),
                None => (bytes, &[][..], false),
            };
            if self.holding {
                self.line.extend_from_slice(piece);
                let n = self.line.len().min(self.tag.len());
                if self.line[..n] != self.tag[..n] || self.line.len() > MAX_MARKER_LINE {
                    self.holding = false;
                    let line = std::mem::take(&mut self.line);
                    self.emit(&line);
                } else if ends {
                    self.holding = false;
                    let line = std::mem::take(&mut self.line);
                    self.marker(&line);
                }
            } else {
                self.emit(piece);
            }
            self.at_line_start = ends;
            bytes = rest;
        }
    }

    fn emit(&mut self, bytes: &[u8]) {
        if self.started {
            self.test.push(bytes);
        } else if self.setup.len() < SETUP_CAP {
            let n = bytes.len().min(SETUP_CAP - self.setup.len());
            self.setup.extend_from_slice(&bytes[..n]);
        }
    }

    fn marker(&mut self, line: &[u8]) {
        let text = String::from_utf8_lossy(line);
        let words: Vec<&str> = text
            .get(self.tag.len()..)
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        match words.as_slice() {
            ["START", t] if !self.started => {
                self.started = true;
                self.start_ns = t.parse().ok();
            }
            ["END", status, t, cpu @ ..] if self.started && !self.ended => {
                self.ended = true;
                self.command_cpu = command_cpu(cpu);
                self.status = status.parse().ok();
                self.end_ns = t.parse::<u64>().ok();
                self.test_ns = self
                    .start_ns
                    .zip(self.end_ns)
                    .map(|(a, b)| b.saturating_sub(a));
            }
            ["PHASE", name, t] if !self.started => {
                let name = SCRIPT_PHASES.iter().copied().find(|p| p == name);
                if let (Some(name), Ok(t)) = (name, t.parse::<u64>()) {
                    self.marks.push((name, t));
                }
            }
            ["DONE"] if self.ended => self.done = true,
            ["COLLECT", chunk] if self.ended => {
                self.collecting = true;
                self.collected.extend_from_slice(chunk.as_bytes());
            }
            // The stage's markers stay in the setup text for `stage::read`; anything else is
            // output.
            _ => self.emit(line),
        }
    }

    /// The output ended.
    fn finish(mut self) -> Framed {
        use base64::Engine;
        if self.holding {
            let line = std::mem::take(&mut self.line);
            self.emit(&line);
        }
        let (test, truncated) = self.test.finish();
        Framed {
            setup: String::from_utf8_lossy(&self.setup).into_owned(),
            started: self.started,
            test: String::from_utf8_lossy(&test).into_owned(),
            test_truncated: truncated,
            test_ns: self.test_ns,
            marks: self.marks,
            start_ns: self.start_ns,
            end_ns: self.end_ns,
            command_cpu: self.command_cpu,
            collected: self
                .collecting
                .then(|| {
                    base64::engine::general_purpose::STANDARD
                        .decode(&self.collected)
                        .ok()
                })
                .flatten(),
        }
    }
}

/// The command's CPU time from the shell's `times` before and after it, the children's line of
/// each (`user system`, as `0m1.250000s 0m0.040000s`): the children's growth, or `None` when
/// the words are not four such times.
fn command_cpu(words: &[&str]) -> Option<Duration> {
    let seconds = |w: &str| -> Option<f64> {
        let (m, s) = w.strip_suffix('s')?.split_once('m')?;
        let (m, s) = (m.parse::<f64>().ok()?, s.parse::<f64>().ok()?);
        (m >= 0.0 && s >= 0.0).then_some(m * 60.0 + s)
    };
    let [u0, s0, u1, s1] = words else { return None };
    let before = seconds(u0)? + seconds(s0)?;
    let after = seconds(u1)? + seconds(s1)?;
    Some(Duration::from_secs_f64((after - before).max(0.0)))
}

/// An execution's output, framed.
#[derive(Debug, Default, PartialEq)]
struct Framed {
    /// Before the command started: the copies, the patches (for [`stage::read`]).
    setup: String,
    /// The command started.
    started: bool,
    /// The command's output, and whatever its leftovers printed after it ended.
    test: String,
    /// Its middle was left out.
    test_truncated: bool,
    /// Nanoseconds the command ran, by the container's clock.
    test_ns: Option<u64>,
    /// The root script's phase marks before the command (unix ns when each ended).
    marks: Vec<(&'static str, u64)>,
    /// When the command started and ended (unix ns).
    start_ns: Option<u64>,
    end_ns: Option<u64>,
    /// CPU time of the command (user and system, its waited-for children included).
    command_cpu: Option<Duration>,
    /// The collected file, when printed.
    collected: Option<Vec<u8>>,
}

/// Python major.minor of an image, by running `python3` in it.
pub(super) async fn python_version(
    docker: &Docker,
    image: &str,
    warnings: &LimitWarnings,
    removals: &Removals,
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
        stdin: None,
        execution: false,
    };
    let ran = run(
        docker,
        spec,
        CappedOutput::new(64 << 10),
        warnings,
        removals,
        None,
    )
    .await?;
    let (bytes, _) = ran.output.finish();
    let text = String::from_utf8_lossy(&bytes);
    let version = text.trim();
    let looks_right =
        version.split('.').count() == 2 && version.split('.').all(|p| p.parse::<u32>().is_ok());
    if ran.exit_code != Some(0) || !looks_right {
        return Err(SandboxError::Infra(format!(
            "base image {image} cannot tell its Python version (`python3` exited with {:?}): {}; \
             rebuild it with `reprobench images bootstrap --force` or pass another base image",
            ran.exit_code, version
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
    /// Bytes written to the container's standard input once it started.
    stdin: Option<Vec<u8>>,
    /// An execution (its tmpfs mounts), not a probe of the image.
    execution: bool,
}

impl Spec<'_> {
    /// What its container's body is made of, except what is the same for every execution: the
    /// containers booted ahead for one key can run any execution with that key.
    fn key(&self) -> String {
        let l = self.limits;
        format!(
            "{}\n{:?}\n{:?}\n{} {} {} {}\n{} {}",
            self.image,
            self.argv,
            self.env,
            l.cpus,
            l.memory_mb,
            l.pids,
            l.disk_mb,
            self.stdin.is_some(),
            self.execution
        )
    }
}

/// Where a container's output goes as it arrives.
trait Sink: Send + 'static {
    fn take(&mut self, bytes: &[u8]);
    /// Whether the output has shown that the command started.
    fn started(&self) -> bool {
        false
    }
    /// The exit status the output itself gave as final (the root script's last mark), once it
    /// has: nothing the container prints after it counts.
    fn finished(&self) -> Option<i64> {
        None
    }
}

impl Sink for CappedOutput {
    fn take(&mut self, bytes: &[u8]) {
        self.push(bytes);
    }
}

impl Sink for Framer {
    fn take(&mut self, bytes: &[u8]) {
        self.push(bytes);
    }

    fn started(&self) -> bool {
        self.started
    }

    fn finished(&self) -> Option<i64> {
        self.done.then_some(self.status).flatten()
    }
}

/// What came back.
struct Ran<S> {
    output: S,
    exit_code: Option<i64>,
    timed_out: bool,
    /// From start to exit or kill.
    ran_for: Duration,
    /// The container's life as the host saw it.
    times: HostTimes,
}

/// The host's times of a container's life.
#[derive(Debug, Default, Clone, Copy)]
struct HostTimes {
    /// Creating it.
    create: Duration,
    /// Attaching to its output.
    attach: Duration,
    /// When it was asked to start, or, booted ahead, handed the execution (unix ns).
    start_requested_ns: u64,
    /// When its exit, or the script's last mark, was seen (unix ns).
    exit_seen_ns: u64,
    /// Waiting for the end of its output after the exit.
    output_wait: Duration,
}

/// How many removals may run in the background before an execution waits for its own.
const MAX_PENDING_REMOVALS: usize = 8;

/// Execution containers being removed off the executions' critical path: an execution
/// returns once its container has stopped and its output is in, and the removal goes on in
/// the background. Their count, so eviction and tests can wait until none is left; a node
/// that ends before they finish leaves stopped containers, which the next sandbox to connect
/// removes ([`remove_leftovers`]).
#[derive(Debug, Clone)]
pub(super) struct Removals {
    pending: Arc<tokio::sync::watch::Sender<usize>>,
}

impl Default for Removals {
    fn default() -> Removals {
        Removals {
            pending: Arc::new(tokio::sync::watch::channel(0).0),
        }
    }
}

impl Removals {
    /// Removes `container`: in the background, unless too many removals are pending already
    /// (then now, so they never pile up).
    async fn remove(&self, mut container: Container) {
        if *self.pending.borrow() >= MAX_PENDING_REMOVALS {
            container.remove_logged().await;
            return;
        }
        self.pending.send_modify(|n| *n += 1);
        let pending = self.pending.clone();
        tokio::spawn(async move {
            container.remove_logged().await;
            pending.send_modify(|n| *n = n.saturating_sub(1));
        });
    }

    /// Waits until no removal is pending.
    pub(super) async fn settle(&self) {
        let mut pending = self.pending.subscribe();
        let _ = pending.wait_for(|n| *n == 0).await;
    }
}

/// Runs one container and removes it, its output going to `sink`: with `ahead`, the container
/// taken from it when there is one (and the next is booted ahead), else one made now.
async fn run<S: Sink>(
    docker: &Docker,
    spec: Spec<'_>,
    sink: S,
    warnings: &LimitWarnings,
    removals: &Removals,
    ahead: Option<(&Ahead, Option<Booted>)>,
) -> Result<Ran<S>, SandboxError> {
    let body = container_body(&spec);
    let (ahead, taken) = match ahead {
        Some((ahead, taken)) => (Some(ahead), taken),
        None => (None, None),
    };
    let mut booted = match taken {
        Some(mut b) => {
            // Its creation and start were off this execution's path, which begins now.
            b.times = HostTimes {
                start_requested_ns: unix_ns(),
                ..HostTimes::default()
            };
            b
        }
        None => boot(docker, &body, spec.image, warnings).await?,
    };
    // The announced ones boot once this one has (two at once would slow this one's).
    let next_keys = match ahead {
        Some(ahead) => ahead.boot_next(docker, removals),
        None => Vec::new(),
    };
    let attached = booted
        .attached
        .take()
        .expect("a booted container is driven once");
    // Once this one's command runs, the announced ones may be staged.
    let on_start = ahead.map(|ahead| {
        let (ahead, removals) = (ahead.clone(), removals.clone());
        Box::new(move || {
            for key in next_keys {
                ahead.stage_next(key, &removals);
            }
        }) as Box<dyn FnOnce() + Send>
    });
    let mut sink = sink;
    sink.take(&std::mem::take(&mut booted.early_output));
    let driven = drive(
        docker,
        &booted.container.id,
        attached,
        booted.times,
        &spec,
        sink,
        on_start,
    )
    .await;
    // Removed on every path: here when we get this far, by the guard's Drop when cancelled.
    removals.remove(booted.container).await;
    driven
}

/// A container created, attached to and started, its command waiting for its input (an
/// execution's copies the repository first).
pub(super) struct Booted {
    container: Container,
    /// Its output and input, until an execution drives it.
    attached: Option<bollard::container::AttachContainerResults>,
    /// Output read before an execution took it (staging ahead: up to the unpacked tree).
    early_output: Vec<u8>,
    /// Creating, attaching and the start request; the rest is filled as it runs.
    times: HostTimes,
}

/// Creates a container of `body`, attaches to it (before its start, so no output is missed)
/// and starts it; a limit the engine refuses, or says it will not enforce, fails it.
async fn boot(
    docker: &Docker,
    body: &ContainerCreateBody,
    image: &str,
    warnings: &LimitWarnings,
) -> Result<Booted, SandboxError> {
    let creating = Instant::now();
    let container = Container {
        docker: docker.clone(),
        id: create(docker, body, image, warnings).await?,
        removed: false,
    };
    let create = creating.elapsed();
    let options = AttachContainerOptionsBuilder::new()
        .stream(true)
        .stdin(body.open_stdin == Some(true))
        .stdout(true)
        .stderr(true)
        .build();
    let attaching = Instant::now();
    let attached = docker
        .attach_container(&container.id, Some(options))
        .await
        .map_err(|e| engine_error("attaching to the execution container", e))?;
    let attach = attaching.elapsed();
    let start_requested_ns = unix_ns();
    docker
        .start_container(&container.id, None)
        .await
        .map_err(|e| engine_error("starting the execution container", e))?;
    Ok(Booted {
        container,
        attached: Some(attached),
        early_output: Vec::new(),
        times: HostTimes {
            create,
            attach,
            start_requested_ns,
            ..HostTimes::default()
        },
    })
}

/// The most containers booted ahead at once (the oldest goes when one more is booted), and the
/// most executions announced and not yet staged.
const MAX_AHEAD: usize = 4;
/// How long a container booted ahead waits for an execution before it is removed; one that
/// staged an announced execution's tree waits that long beyond its timeout (the execution
/// before it may run that long), and an announcement is forgotten after that long.
const AHEAD_IDLE: Duration = Duration::from_secs(30);
/// How often `when-idle` reads the host's load while an announced execution waits to be staged.
const IDLE_POLL: Duration = Duration::from_millis(50);

/// Containers booted ahead of the executions that will take them: when an execution starts and
/// the next one of the same image and limits was announced, a container for it is booted (and
/// its copy of the repository made) while the current one runs, so the next execution skips
/// both. Once the current command runs, and the stage-ahead mode says so, that container is
/// also given the announced execution's input and stages its tree; only an execution of an
/// equal request takes it then. One per image and limits, at most [`MAX_AHEAD`], each removed
/// after [`AHEAD_IDLE`] unused.
#[derive(Clone)]
pub(super) struct Ahead {
    state: Arc<AheadState>,
}

struct AheadState {
    /// Off: every execution boots its own container.
    on: bool,
    /// When an announced execution's tree is staged in the container booted for it.
    stage: StageAheadMode,
    spares: Mutex<Vec<Spare>>,
    /// Executions announced as coming next and not staged yet.
    announced: Mutex<Vec<Announced>>,
    /// Keys being booted, each until its container is kept or its boot failed (watched, so
    /// that draining, and an execution of that key, can wait for them).
    booting: tokio::sync::watch::Sender<Vec<String>>,
    /// Keys of the node's next task waiting for an idle core before their container boots.
    waiting_for_idle: Mutex<HashSet<String>>,
    serial: std::sync::atomic::AtomicU64,
}

/// A container booted ahead, with the image and limits it was booted for.
struct Spare {
    key: String,
    serial: u64,
    booted: Booted,
    /// The execution whose tree it staged, if it was given one.
    staged: Option<StagedFor>,
}

impl Spare {
    /// Booted for `key` and given no execution's tree yet: any execution of `key` may take it.
    fn is_unstaged_for(&self, key: &str) -> bool {
        self.key == key && self.staged.is_none()
    }
}

impl AheadState {
    /// A container booted ahead for `key` that staged nothing waits.
    fn has_unstaged_spare(&self, key: &str) -> bool {
        crate::lock(&self.spares)
            .iter()
            .any(|s| s.is_unstaged_for(key))
    }
}

/// The announced execution a container booted ahead was given the input of: it staged that
/// execution's tree, with that nonce, and waits for the go line.
struct StagedFor {
    request: ExecRequest,
    nonce: String,
}

/// An execution announced as coming next ([`crate::Sandbox::exec_ahead`]).
struct Announced {
    key: String,
    image: String,
    request: ExecRequest,
    since: Instant,
    /// The first execution of the node's next task (not of the task that runs): unless the
    /// mode is `always`, its container boots only once a core is idle.
    next_task: bool,
}

/// A container an execution takes from [`Ahead`].
pub(super) struct Taken {
    booted: Booted,
    /// The nonce of its script when it staged this execution's tree ahead.
    staged_nonce: Option<String>,
}

impl Ahead {
    /// Boots containers ahead when `on`, and stages announced executions in them as `stage`
    /// says; else never.
    pub(super) fn new(on: bool, stage: StageAheadMode) -> Ahead {
        Ahead {
            state: Arc::new(AheadState {
                on,
                stage,
                spares: Mutex::default(),
                announced: Mutex::default(),
                booting: tokio::sync::watch::channel(Vec::new()).0,
                waiting_for_idle: Mutex::default(),
                serial: Default::default(),
            }),
        }
    }

    /// Announces that an execution of `request` on `image` comes next, so that a container is
    /// booted ahead for it (and stages its tree, as the mode says); `next_task` when it is the
    /// first of the node's next task. A request that fails validation is not announced.
    pub(super) fn announce(&self, image: &str, request: &ExecRequest, next_task: bool) {
        let state = &self.state;
        // An invalid request is not prepared: its execution meets the error on its path.
        if !state.on || validate(request).is_err() {
            return;
        }
        let key = execution_spec(image, request).key();
        let mut announced = crate::lock(&state.announced);
        announced.retain(|a| a.since.elapsed() < AHEAD_IDLE);
        if announced
            .iter()
            .any(|a| a.key == key && a.request == *request)
        {
            return;
        }
        if announced.len() >= MAX_AHEAD {
            announced.remove(0);
        }
        announced.push(Announced {
            key,
            image: image.to_string(),
            request: request.clone(),
            since: Instant::now(),
            next_task,
        });
    }

    /// The container for an execution of `request` (container key `key`): the one that staged
    /// this request's tree ahead, else one booted ahead and not staged, waiting for one of
    /// that key being booted; `None` when there is none.
    async fn take(&self, key: &str, request: &ExecRequest) -> Option<Taken> {
        let state = &self.state;
        // Run now, it is no longer one to stage ahead.
        crate::lock(&state.announced).retain(|a| !(a.key == key && a.request == *request));
        if !state.on {
            return None;
        }
        let mut booting = state.booting.subscribe();
        let _ = booting
            .wait_for(|keys| !keys.iter().any(|k| k == key))
            .await;
        let mut spares = crate::lock(&state.spares);
        let staged_for_it =
            |s: &Spare| s.key == key && s.staged.as_ref().is_some_and(|f| f.request == *request);
        let i = spares
            .iter()
            .position(staged_for_it)
            .or_else(|| spares.iter().position(|s| s.is_unstaged_for(key)))?;
        let spare = spares.remove(i);
        Some(Taken {
            booted: spare.booted,
            staged_nonce: spare.staged.map(|f| f.nonce),
        })
    }

    /// Boots a container ahead, in the background and one after the other, for each container
    /// key an announced execution has (of any image: the announced one may be the first
    /// execution of the node's next task), unless one of that key that staged no execution is
    /// there or one is on its way. Returns the announced keys, which the executions' start
    /// may stage (oldest first). A failure only means the execution boots its own (and reports
    /// why).
    fn boot_next(&self, docker: &Docker, removals: &Removals) -> Vec<String> {
        let state = &self.state;
        // Nothing is booted for an execution nobody said would come: on busy cores an unused
        // container's start and copy would only slow the tests that run.
        if !state.on {
            return Vec::new();
        }
        // The next task's container waits for an idle core (unless the mode is `always`): on
        // as many busy slots as cores, its boot only slows the tests that run.
        let core_idle = std::cell::OnceCell::new();
        let must_wait = |a: &Announced| {
            a.next_task
                && state.stage != StageAheadMode::Always
                && !*core_idle.get_or_init(|| stage_ahead::stage_now(StageAheadMode::WhenIdle))
        };
        let mut later = Vec::new();
        let announced: Vec<(String, ContainerCreateBody)> = {
            let announced = crate::lock(&state.announced);
            let mut seen = Vec::new();
            for a in announced.iter().filter(|a| a.since.elapsed() < AHEAD_IDLE) {
                if !seen.iter().any(|(k, _)| *k == a.key) {
                    let body = container_body(&execution_spec(&a.image, &a.request));
                    if must_wait(a) {
                        later.push((a.key.clone(), body.clone()));
                    }
                    seen.push((a.key.clone(), body));
                }
            }
            seen
        };
        let keys = announced.iter().map(|(k, _)| k.clone()).collect();
        for (key, body) in later {
            if !state.has_unstaged_spare(&key)
                && crate::lock(&state.waiting_for_idle).insert(key.clone())
            {
                self.boot_when_idle(key, body, docker, removals);
            }
        }
        let to_boot: Vec<(String, ContainerCreateBody)> = announced
            .into_iter()
            .filter(|(key, _)| {
                let waits = crate::lock(&state.waiting_for_idle).contains(key);
                !waits && !state.has_unstaged_spare(key) && self.claim(key)
            })
            .collect();
        if to_boot.is_empty() {
            return keys;
        }
        let (this, docker, removals) = (self.clone(), docker.clone(), removals.clone());
        tokio::spawn(async move {
            for (key, body) in to_boot {
                let image = body.image.clone().unwrap_or_default();
                match boot(&docker, &body, &image, &LimitWarnings::default()).await {
                    Ok(booted) => this.keep(key.clone(), booted, None, &removals).await,
                    Err(e) => debug!(error = %e, "booting an execution container ahead failed"),
                }
                this.release(&key);
            }
        });
        keys
    }

    /// Boots the container of the next task's key `key` once a core is idle (read every
    /// [`IDLE_POLL`]) while its execution stays announced, then stages it as the mode says.
    /// When its execution comes first (it boots its own), the wait ends: an execution of the
    /// same key announced by that task meanwhile boots at once, as within a task.
    fn boot_when_idle(
        &self,
        key: String,
        body: ContainerCreateBody,
        docker: &Docker,
        removals: &Removals,
    ) {
        let (this, docker, removals) = (self.clone(), docker.clone(), removals.clone());
        tokio::spawn(async move {
            let idle = loop {
                tokio::time::sleep(IDLE_POLL).await;
                if !this.announced_for_next_task(&key) {
                    break false;
                }
                if stage_ahead::stage_now(StageAheadMode::WhenIdle) {
                    break true;
                }
            };
            // What is still announced of `key` once the next task's execution came is that
            // task's own next execution, which `boot_next` left to this wait.
            let boots = idle || this.announced(&key);
            // Claimed before it stops waiting: an execution of that key then waits for this boot.
            let claimed = boots && this.claim_while_announced(&key).await;
            crate::lock(&this.state.waiting_for_idle).remove(&key);
            if !claimed {
                return;
            }
            // Its execution came, or the node drains, between the reading and the claim; or a
            // container of that key was booted meanwhile.
            if this.state.has_unstaged_spare(&key) || !this.announced(&key) {
                this.release(&key);
                return;
            }
            let image = body.image.clone().unwrap_or_default();
            match boot(&docker, &body, &image, &LimitWarnings::default()).await {
                Ok(booted) => this.keep(key.clone(), booted, None, &removals).await,
                Err(e) => debug!(error = %e, "booting an execution container ahead failed"),
            }
            this.release(&key);
            this.stage_next(key, &removals);
        });
    }

    /// Claims `key` ([`Ahead::claim`]), waiting while another holds it (a staging that found
    /// no container to stage in lets go at once), as long as an execution of `key` stays
    /// announced; whether it was claimed.
    async fn claim_while_announced(&self, key: &str) -> bool {
        let mut booting = self.state.booting.subscribe();
        loop {
            if self.claim(key) {
                return true;
            }
            // The watch's value is read under a lock: `is_ok` lets it go before the next claim.
            let freed = booting
                .wait_for(|keys| !keys.iter().any(|k| k == key))
                .await
                .is_ok();
            if !freed || !self.announced(key) {
                return false;
            }
        }
    }

    /// Marks `key` as being booted or staged, unless it already is; whether it was free.
    fn claim(&self, key: &str) -> bool {
        self.state.booting.send_if_modified(|keys| {
            let free = !keys.iter().any(|k| k == key);
            if free {
                keys.push(key.to_string());
            }
            free
        })
    }

    /// Ends what [`Ahead::claim`] began for `key`.
    fn release(&self, key: &str) {
        self.state
            .booting
            .send_modify(|keys| keys.retain(|k| k != key));
    }

    /// Whether the first execution of the node's next task is announced with container key
    /// `key` (and not forgotten).
    fn announced_for_next_task(&self, key: &str) -> bool {
        let announced = crate::lock(&self.state.announced);
        announced
            .iter()
            .any(|a| a.key == key && a.next_task && a.since.elapsed() < AHEAD_IDLE)
    }

    /// Whether an execution of container key `key` is announced (and not forgotten).
    fn announced(&self, key: &str) -> bool {
        let announced = crate::lock(&self.state.announced);
        announced
            .iter()
            .any(|a| a.key == key && a.since.elapsed() < AHEAD_IDLE)
    }

    /// An execution of container key `key` started its command: when an execution of that key
    /// was announced, gives its input, once the mode says to stage (`when-idle`: as soon as a
    /// core is idle while that announcement stands, read every [`IDLE_POLL`]), to a container
    /// booted ahead for `key` (once booted), in the background, so it stages the tree and
    /// waits for the go line. Claims `key` as being booted meanwhile, so its execution waits
    /// for it.
    fn stage_next(&self, key: String, removals: &Removals) {
        let state = &self.state;
        if !state.on || state.stage == StageAheadMode::Off || !self.announced(&key) {
            return;
        }
        let (this, removals) = (self.clone(), removals.clone());
        tokio::spawn(async move {
            // The command's own start keeps a core busy for a moment: the reading is repeated.
            while !stage_ahead::stage_now(this.state.stage) {
                tokio::time::sleep(IDLE_POLL).await;
                if !this.announced(&key) {
                    return;
                }
            }
            // A next task's key waiting for an idle core is staged by its boot, once booted.
            if crate::lock(&this.state.waiting_for_idle).contains(&key) {
                return;
            }
            let mut booting = this.state.booting.subscribe();
            let _ = booting.wait_for(|keys| !keys.contains(&key)).await;
            if !this.claim(&key) {
                return;
            }
            this.stage_in_spare(&key, &removals).await;
            this.release(&key);
        });
    }

    /// Writes the input of the execution announced first for `key` into a container booted
    /// ahead for `key` that staged nothing, and keeps it as staged for that execution (within
    /// that execution's timeout, else the container goes).
    async fn stage_in_spare(&self, key: &str, removals: &Removals) {
        // With no container to stage in, the announcement stays for the one booted later.
        if !self.state.has_unstaged_spare(key) {
            return;
        }
        let next = {
            let mut announced = crate::lock(&self.state.announced);
            announced.retain(|a| a.since.elapsed() < AHEAD_IDLE);
            let i = announced.iter().position(|a| a.key == key);
            i.map(|i| announced.remove(i))
        };
        let Some(next) = next else { return };
        let spare = {
            let mut spares = crate::lock(&self.state.spares);
            let i = spares.iter().position(|s| s.is_unstaged_for(key));
            i.map(|i| spares.remove(i))
        };
        let Some(Spare { mut booted, .. }) = spare else {
            return;
        };
        let timeout = next.request.limits.timeout;
        let nonce = reprobench_domain::secret::random_hex(16);
        let staged = async {
            let input = input_archive(&script(&nonce, &next.request), &next.request)?;
            let Booted {
                attached,
                early_output,
                ..
            } = &mut booted;
            let attached = attached
                .as_mut()
                .expect("a container booted ahead is attached");
            let stage = async {
                attached.input.write_all(&input).await?;
                attached.input.flush().await?;
                // Read until the tree is unpacked (or its setup failed and the output ended):
                // the output is kept for the execution, and the container is then ready.
                let ready = format!("REPROBENCH-{nonce} PHASE unpack ");
                let failed = format!("REPROBENCH-{nonce} SETUP-FAILED ");
                let longest = ready.len().max(failed.len());
                while let Some(Ok(chunk)) = attached.output.next().await {
                    // From one marker's length back: a marker split across chunks is found.
                    let from = early_output.len().saturating_sub(longest);
                    early_output.extend_from_slice(chunk.as_ref());
                    let tail = &early_output[from..];
                    if holds(tail, ready.as_bytes()) || holds(tail, failed.as_bytes()) {
                        break;
                    }
                }
                Ok::<(), std::io::Error>(())
            };
            match tokio::time::timeout(timeout, stage).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(SandboxError::Infra(format!(
                    "sending the inputs to the execution container: {e}"
                ))),
                Err(_) => Err(SandboxError::Infra(format!(
                    "the execution container did not stage its tree within {timeout:?}"
                ))),
            }
        };
        match staged.await {
            Ok(()) => {
                let staged = StagedFor {
                    request: next.request,
                    nonce,
                };
                self.keep(key.to_string(), booted, Some(staged), removals)
                    .await
            }
            Err(e) => {
                debug!(error = %e, "staging an announced execution ahead failed");
                removals.remove(booted.container).await;
            }
        }
    }

    /// Keeps a container booted ahead until an execution takes it or it has waited too long
    /// ([`AHEAD_IDLE`], and beyond the staged execution's timeout when it staged one).
    async fn keep(
        &self,
        key: String,
        booted: Booted,
        staged: Option<StagedFor>,
        removals: &Removals,
    ) {
        let serial = self
            .state
            .serial
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let idle = match &staged {
            Some(s) => s.request.limits.timeout + AHEAD_IDLE,
            None => AHEAD_IDLE,
        };
        let oldest = {
            let mut spares = crate::lock(&self.state.spares);
            spares.push(Spare {
                key,
                serial,
                booted,
                staged,
            });
            (spares.len() > MAX_AHEAD).then(|| spares.remove(0))
        };
        if let Some(old) = oldest {
            removals.remove(old.booted.container).await;
        }
        let (this, removals) = (self.clone(), removals.clone());
        tokio::spawn(async move {
            tokio::time::sleep(idle).await;
            let idle = {
                let mut spares = crate::lock(&this.state.spares);
                let i = spares.iter().position(|s| s.serial == serial);
                i.map(|i| spares.remove(i))
            };
            if let Some(idle) = idle {
                removals.remove(idle.booted.container).await;
            }
        });
    }

    /// Containers booted ahead, waiting for an execution: (ready, being booted).
    pub(super) fn count(&self) -> (usize, usize) {
        (
            crate::lock(&self.state.spares).len(),
            self.state.booting.borrow().len(),
        )
    }

    /// How many keys of the node's next task wait for an idle core before their container boots.
    pub(super) fn waiting_for_idle(&self) -> usize {
        crate::lock(&self.state.waiting_for_idle).len()
    }

    /// How many of the containers booted ahead staged an announced execution's tree.
    pub(super) fn staged(&self) -> usize {
        let spares = crate::lock(&self.state.spares);
        spares.iter().filter(|s| s.staged.is_some()).count()
    }

    /// Forgets the announced executions and removes every container booted ahead, once those
    /// being booted are.
    pub(super) async fn drain(&self, removals: &Removals) {
        crate::lock(&self.state.announced).clear();
        let mut booting = self.state.booting.subscribe();
        let _ = booting.wait_for(|keys| keys.is_empty()).await;
        let spares = std::mem::take(&mut *crate::lock(&self.state.spares));
        for s in spares {
            removals.remove(s.booted.container).await;
        }
    }
}

/// Whether `needle` occurs in `hay`.
fn holds(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// A limit the engine may refuse to set on this kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Limit {
    Cpu,
    Memory,
    Pids,
}

impl Limit {
    fn name(self) -> &'static str {
        match self {
            Limit::Cpu => "CPU",
            Limit::Memory => "memory",
            Limit::Pids => "process",
        }
    }
}

/// Which limit an engine error or warning says is not enforced, if that is what it says.
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

/// The engine's warning that it cannot limit swap matters only where there is swap to use.
fn host_has_swap() -> bool {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("SwapTotal:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|v| v != "0"))
        })
        .unwrap_or(true)
}

fn refused(limit: Limit, message: &str) -> SandboxError {
    SandboxError::Infra(format!(
        "the Docker engine does not enforce the {} limit here ({message}), and executions are not run without it: give the engine's cgroups that controller (for swap on cgroup v1, boot with swapaccount=1), or use another node",
        limit.name()
    ))
}

fn container_body(spec: &Spec<'_>) -> ContainerCreateBody {
    let l = spec.limits;
    let positive = |v: i64| (v > 0).then_some(v);
    let memory = positive((l.memory_mb as i64).saturating_mul(1 << 20));
    let size = |mb: u64| {
        if mb > 0 {
            format!(",size={mb}m")
        } else {
            String::new()
        }
    };
    let mut tmpfs = HashMap::from([(
        "/tmp".to_string(),
        format!("rw,exec,nosuid,nodev,mode=1777{}", size(l.disk_mb)),
    )]);
    if spec.execution {
        tmpfs.extend([
            (
                "/stage".to_string(),
                format!(
                    "rw,exec,nosuid,nodev,mode=0700{}",
                    size(l.disk_mb.saturating_mul(2))
                ),
            ),
            (
                "/work".to_string(),
                format!(
                    "rw,exec,nosuid,nodev,mode=0755,uid={TEST_UID},gid={TEST_UID}{}",
                    size(l.disk_mb)
                ),
            ),
            (
                SUPPORT_DIR.to_string(),
                format!("rw,nosuid,nodev,mode=0755{}", size(l.disk_mb)),
            ),
        ]);
    }
    let host_config = HostConfig {
        network_mode: Some("none".into()),
        nano_cpus: positive((l.cpus * 1e9) as i64),
        memory,
        // Swap equal to memory: no swap on top, so the memory limit is the limit.
        memory_swap: memory,
        pids_limit: positive(l.pids as i64),
        readonly_rootfs: Some(true),
        tmpfs: Some(tmpfs),
        // The output is collected through attach; a log driver would copy it to the host disk.
        log_config: Some(HostConfigLogConfig {
            typ: Some("none".into()),
            config: None,
        }),
        // An init as PID 1 reaps orphans, which would otherwise count against the pids limit.
        init: Some(true),
        cap_drop: Some(vec!["ALL".into()]),
        cap_add: Some(CAPABILITIES.iter().map(|c| c.to_string()).collect()),
        security_opt: Some(vec!["no-new-privileges".into()]),
        ..Default::default()
    };
    let with_stdin = spec.stdin.is_some();
    ContainerCreateBody {
        image: Some(spec.image.to_string()),
        cmd: Some(spec.argv.clone()),
        env: Some(spec.env.clone()),
        user: Some("0:0".into()),
        // The same for every execution (the engine's default is the container's random id).
        hostname: Some(HOSTNAME.into()),
        working_dir: Some("/".into()),
        labels: Some(HashMap::from([
            (CONTAINER_LABEL.to_string(), "docker".to_string()),
            ("reprobench.image".to_string(), spec.image.to_string()),
            (OWNER_LABEL.to_string(), owner()),
        ])),
        attach_stdin: Some(with_stdin),
        open_stdin: Some(with_stdin),
        stdin_once: Some(with_stdin),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(false),
        host_config: Some(host_config),
        ..Default::default()
    }
}

/// Creates the container; a limit the engine refuses, or says it will not enforce, fails it.
async fn create(
    docker: &Docker,
    body: &ContainerCreateBody,
    image: &str,
    warnings: &LimitWarnings,
) -> Result<String, SandboxError> {
    match docker
        .create_container(None::<CreateContainerOptions>, body.clone())
        .await
    {
        Ok(r) => {
            for w in &r.warnings {
                warnings.note(w);
                let swap_only = w.to_lowercase().contains("swap") && !host_has_swap();
                if let Some(limit) = unsupported_limit(w).filter(|_| !swap_only) {
                    let options = RemoveContainerOptionsBuilder::new().force(true).build();
                    let _ = docker.remove_container(&r.id, Some(options)).await;
                    return Err(refused(limit, w));
                }
            }
            Ok(r.id)
        }
        Err(EngineError::DockerResponseServerError {
            status_code,
            message,
        }) => {
            if let Some(limit) = unsupported_limit(&message) {
                return Err(refused(limit, &message));
            }
            if status_code == 404 {
                return Err(SandboxError::Infra(format!(
                    "image {image} is gone from the engine ({message}): prepare the instance again"
                )));
            }
            Err(SandboxError::Infra(format!(
                "the Docker engine refused to create the execution container: {message}"
            )))
        }
        Err(e) => Err(engine_error("creating the execution container", e)),
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
    /// Removes it, saying so in the log when the engine would not.
    async fn remove_logged(&mut self) {
        if let Err(e) = self.remove().await {
            warn!(container = %self.id, error = %e, "cannot remove execution container");
        }
    }

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

/// Feeds the input to a started container, waits with the timeout (killing the container when
/// it passes) until it exits or its output gives its last mark, collects; calls `on_start`
/// once the output shows that the command started.
async fn drive<S: Sink>(
    docker: &Docker,
    id: &str,
    attached: bollard::container::AttachContainerResults,
    mut times: HostTimes,
    spec: &Spec<'_>,
    sink: S,
    mut on_start: Option<Box<dyn FnOnce() + Send>>,
) -> Result<Ran<S>, SandboxError> {
    let collector = Arc::new(Mutex::new(Some(sink)));
    let (finished_tx, mut finished) = tokio::sync::oneshot::channel::<i64>();
    let mut reader = tokio::spawn({
        let collector = collector.clone();
        let mut stream = attached.output;
        async move {
            while let Some(Ok(chunk)) = stream.next().await {
                let mut sink = crate::lock(&collector);
                let Some(sink) = sink.as_mut() else { break };
                sink.take(chunk.as_ref());
                if sink.started()
                    && let Some(started) = on_start.take()
                {
                    started();
                }
                if let Some(status) = sink.finished() {
                    let _ = finished_tx.send(status);
                    break;
                }
            }
        }
    });
    let _stop_reader = AbortOnDrop(reader.abort_handle());
    // Kept open until the end: closing it may end the attached connection.
    let mut input = attached.input;
    let started = Instant::now();
    if let Some(bytes) = &spec.stdin {
        match input.write_all(bytes).await {
            // A container that staged its tree ahead and ended (its setup failed) reads no go
            // line: its output and exit say why, as they would have on the execution's path.
            Err(e) if bytes.as_slice() == GO => {
                debug!(container = %id, error = %e, "the go line was not read")
            }
            Err(e) => {
                return Err(SandboxError::Infra(format!(
                    "sending the inputs to the execution container: {e}"
                )));
            }
            Ok(()) => {}
        }
        let _ = input.flush().await;
    }
    let mut wait = Box::pin(docker.wait_container(id, None));
    let deadline = tokio::time::Instant::from_std(started + spec.limits.timeout);
    // The script's last mark ends the execution as its exit would: the container is removed
    // (whatever it still runs with it) off the execution's path.
    let ended = tokio::time::timeout_at(deadline, async {
        tokio::select! {
            status = wait.next() => Ended::Exited(status),
            Ok(status) = &mut finished => Ended::Finished(status),
        }
    })
    .await;
    let (exit_code, timed_out, by_script) = match ended {
        Ok(Ended::Finished(status)) => (Some(status), false, true),
        Ok(Ended::Exited(status)) => (Some(exit_status(status)?), false, false),
        Err(_) => {
            // SIGKILL to the container's PID 1 ends its whole PID namespace: every process.
            let killed = docker.kill_container(id, None).await;
            let status = tokio::time::timeout(STOP_GRACE, wait.next()).await.map_err(|_| {
                SandboxError::Infra(format!(
                    "execution container {id} did not stop within {STOP_GRACE:?} of being killed"
                ))
            })?;
            match killed {
                Ok(()) => (None, true, false),
                // It exited on its own just as the timeout passed: that is a normal exit.
                Err(EngineError::DockerResponseServerError {
                    status_code: 409, ..
                }) => (Some(exit_status(status)?), false, false),
                Err(e) => return Err(engine_error("killing the timed-out execution container", e)),
            }
        }
    };
    let ran_for = started.elapsed();
    times.exit_seen_ns = unix_ns();
    let exited = Instant::now();
    // The attach stream ends once the container has stopped; do not wait forever for it.
    if !by_script
        && tokio::time::timeout(OUTPUT_GRACE, &mut reader)
            .await
            .is_err()
    {
        warn!(container = %id, "output did not end after the container stopped; keeping what came");
    }
    times.output_wait = exited.elapsed();
    drop(input);
    if exit_code == Some(137) && !timed_out && !by_script {
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
    let output = crate::lock(&collector)
        .take()
        .expect("the output is taken once");
    Ok(Ran {
        output,
        exit_code,
        timed_out,
        ran_for,
        times,
    })
}

/// How a container's run ended before its timeout.
enum Ended {
    /// The engine saw it exit.
    Exited(Option<Result<ContainerWaitResponse, EngineError>>),
    /// Its output gave its last mark, with this status.
    Finished(i64),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(chunks: &[&str], cap: usize) -> Framed {
        let mut f = Framer::new("n1", cap);
        for c in chunks {
            f.push(c.as_bytes());
        }
        f.finish()
    }

    #[test]
    fn output_is_framed_by_the_scripts_markers_and_forged_ones_stay_the_tests() {
        let text = "Checking patch a.py...\nREPROBENCH-n1 APPLY code 0 -\nREPROBENCH-n1 SEALED\n\
                    REPROBENCH-n1 START 1000\nPASSED t.py::a\nREPROBENCH-x END 0 9\n\
                    REPROBENCH-n1 APPLY test 0 -\nREPROBENCH-n1 END 1 5000\nlate output\n\
                    REPROBENCH-n1 COLLECT aGk=\nREPROBENCH-n1 END 0 9999\n";
        // Whatever the chunking.
        for size in [1, 3, 7, 64, text.len()] {
            let chunks: Vec<&str> = (0..text.len())
                .step_by(size)
                .map(|i| &text[i..(i + size).min(text.len())])
                .collect();
            let p = framed(&chunks, 1 << 20);
            assert!(p.started);
            assert_eq!(
                p.setup,
                "Checking patch a.py...\nREPROBENCH-n1 APPLY code 0 -\nREPROBENCH-n1 SEALED\n"
            );
            assert_eq!(
                p.test,
                "PASSED t.py::a\nREPROBENCH-x END 0 9\nREPROBENCH-n1 APPLY test 0 -\nlate output\nREPROBENCH-n1 END 0 9999\n",
                "chunks of {size}"
            );
            assert_eq!(p.test_ns, Some(4000));
            assert_eq!(p.command_cpu, None);
            assert_eq!(p.collected.as_deref(), Some(&b"hi"[..]));
        }
        let r = stage::read(&framed(&[text], 1 << 20).setup, "n1");
        assert!(r.sealed && r.patches[0].applied);
        // Killed before its end: no time, nothing collected; a partial last line is kept.
        let p = framed(&["REPROBENCH-n1 START 1\nstill running\nREPROB"], 1 << 20);
        assert_eq!(
            (p.test.as_str(), p.test_ns, p.collected),
            ("still running\nREPROB", None, None)
        );
    }

    #[test]
    fn the_commands_cpu_is_what_its_children_grew_by_between_the_two_readings() {
        let p = framed(
            &[
                "REPROBENCH-n1 START 1\nok\nREPROBENCH-n1 END 0 9 0m0.250000s 0m0.040000s 1m2.500000s 0m0.290000s\n",
            ],
            1 << 20,
        );
        assert_eq!(p.test_ns, Some(8));
        assert_eq!(p.command_cpu.map(|d| d.as_millis()), Some(62_500));
        for bad in [
            &["0m0.1s", "0m0.1s", "0m0.2s"][..],
            &["1", "2", "3", "4"],
            &["0m-1s", "0m0s", "0m1s", "0m0s"],
        ] {
            assert_eq!(command_cpu(bad), None, "{bad:?}");
        }
        // A forged end line is output; the real one still counts.
        let p = framed(
            &[
                "REPROBENCH-n1 START 1\nREPROBENCH-n2 END 0 9 0m0s 0m0s 9m0s 0m0s\nREPROBENCH-n1 END 0 9 0m0s 0m0s 0m1.5s 0m0s\n",
            ],
            1 << 20,
        );
        assert_eq!(p.command_cpu, Some(Duration::from_millis(1500)));
        assert!(p.test.contains("REPROBENCH-n2 END"));
    }

    #[test]
    fn the_scripts_phase_marks_make_the_timeline_and_forged_ones_are_output() {
        let text = "REPROBENCH-n1 PHASE boot 1100\nREPROBENCH-n1 PHASE copy 1300\n\
                    REPROBENCH-n1 PHASE input 1350\nREPROBENCH-n1 PHASE files 1400\n\
                    REPROBENCH-x PHASE stage 1\nREPROBENCH-n1 PHASE stage 1600\n\
                    REPROBENCH-n1 PHASE unpack 1990\n\
                    REPROBENCH-n1 START 2000\nREPROBENCH-n1 PHASE stage 9\n\
                    REPROBENCH-n1 END 0 7000\n";
        let f = framed(&[text], 1 << 20);
        assert_eq!(
            f.marks,
            [
                ("boot", 1100),
                ("copy", 1300),
                ("input", 1350),
                ("files", 1400),
                ("stage", 1600),
                ("unpack", 1990)
            ]
        );
        assert_eq!(
            f.test, "REPROBENCH-n1 PHASE stage 9\n",
            "a mark after the start is the test's"
        );
        assert!(f.setup.contains("REPROBENCH-x PHASE stage 1"));
        let host = HostTimes {
            create: Duration::from_nanos(40),
            attach: Duration::from_nanos(5),
            start_requested_ns: 1000,
            exit_seen_ns: 7300,
            output_wait: Duration::from_nanos(20),
        };
        let timeline: Vec<(&str, u64)> = timeline(&host, &f, "go")
            .iter()
            .map(|p| (p.name, p.took.as_nanos() as u64))
            .collect();
        assert_eq!(
            timeline,
            [
                ("create", 40),
                ("attach", 5),
                ("boot", 100),
                ("copy", 200),
                ("input", 50),
                ("files", 50),
                ("stage", 200),
                ("unpack", 390),
                ("go", 10),
                ("command", 5000),
                ("exit", 300),
                ("output", 20)
            ]
        );
        // Booted ahead: handed the execution after its boot and copy, which take none of it.
        let ahead = HostTimes {
            create: Duration::ZERO,
            attach: Duration::ZERO,
            start_requested_ns: 1320,
            ..host
        };
        let took: Vec<u64> = super::timeline(&ahead, &f, "go")
            .iter()
            .map(|p| p.took.as_nanos() as u64)
            .collect();
        assert_eq!(took, [0, 0, 0, 0, 30, 50, 200, 390, 10, 5000, 300, 20]);
        // Its tree staged ahead too: handed over once unpacked, waiting only for the start.
        let staged = HostTimes {
            start_requested_ns: 1995,
            ..ahead
        };
        let timeline: Vec<(&str, u64)> = super::timeline(&staged, &f, "ahead")
            .iter()
            .map(|p| (p.name, p.took.as_nanos() as u64))
            .collect();
        assert_eq!(
            timeline,
            [
                ("create", 0),
                ("attach", 0),
                ("boot", 0),
                ("copy", 0),
                ("input", 0),
                ("files", 0),
                ("stage", 0),
                ("unpack", 0),
                ("ahead", 5),
                ("command", 5000),
                ("exit", 300),
                ("output", 20)
            ]
        );
    }

    #[test]
    fn only_the_scripts_last_mark_after_the_end_finishes_the_output() {
        let mut f = Framer::new("n1", 1 << 20);
        f.push(b"REPROBENCH-n1 START 1\nREPROBENCH-n1 DONE\nREPROBENCH-x END 0 2\n");
        assert_eq!(f.finished(), None, "a last mark before the end is output");
        f.push(b"REPROBENCH-n1 END 3 9\nREPROBENCH-x DONE\n");
        assert_eq!(f.finished(), None, "a forged last mark is output");
        f.push(b"REPROBENCH-n1 DONE\n");
        assert_eq!(f.finished(), Some(3));
        let p = f.finish();
        assert_eq!(
            p.test,
            "REPROBENCH-n1 DONE\nREPROBENCH-x END 0 2\nREPROBENCH-x DONE\n"
        );
    }

    #[test]
    fn the_cap_applies_to_the_command_output_alone() {
        let long = "x".repeat(10_000);
        let p = framed(
            &[
                "Applied patch a.py cleanly.\nREPROBENCH-n1 START 1\n",
                &long,
                "\nthe end\n",
                "REPROBENCH-n1 END 0 2\n",
            ],
            1000,
        );
        assert_eq!(p.setup, "Applied patch a.py cleanly.\n");
        assert!(p.test_truncated);
        assert!(p.test.starts_with(&"x".repeat(500)), "{}", p.test);
        assert!(p.test.ends_with("\nthe end\n"), "{}", p.test);
    }

    #[test]
    fn the_script_holds_the_nonce_and_the_patches_and_the_container_command_neither() {
        let req = ExecRequest {
            patches: vec![crate::PatchFile {
                label: "code".into(),
                contents: b"diff".to_vec(),
            }],
            command: vec!["bash".into(), "-c".into(), "echo 'hi'".into()],
            collect: Some("counts.jsonl".into()),
            ..ExecRequest::default()
        };
        let s = script("nonce123", &req);
        assert!(s.starts_with("N=nonce123\n"));
        assert!(s.contains("apply code /stage/in/patches/0.patch"));
        assert!(s.contains("setpriv --reuid=\"$U\" --regid=\"$U\" --clear-groups -- bash -c 'echo '\\''hi'\\'''"), "{s}");
        assert!(s.find("rm -rf /stage/repo").unwrap() < s.find(" START ").unwrap());
        // The command starts only once the go line is read, and has no way to the input.
        assert!(
            s.starts_with("N=nonce123\nU=1000\nexec 2>&1 3<&0 </dev/null\n"),
            "{s}"
        );
        let go = s.find("read -r go <&3").unwrap();
        assert!(s.find("PHASE unpack").is_none() && s.find("phase unpack").unwrap() < go);
        assert!(
            go < s.find("exec 3<&-").unwrap()
                && s.find("exec 3<&-").unwrap() < s.find(" START ").unwrap()
        );
        let boot = boot_command();
        assert!(!boot.contains("nonce") && !boot.contains("patch"));
        let archive = input_archive(&s, &req).unwrap();
        let (len, rest) = archive.split_at(archive.iter().position(|b| *b == b'\n').unwrap() + 1);
        assert_eq!(
            std::str::from_utf8(len)
                .unwrap()
                .trim()
                .parse::<usize>()
                .unwrap(),
            rest.len()
        );
        let mut names: Vec<String> = tar::Archive::new(rest)
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        names.sort();
        assert_eq!(names, ["patches/0.patch", "run.sh"]);
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
        let e = refused(Limit::Pids, "no pids").to_string();
        assert!(
            e.contains("process limit") && e.contains("not run without it"),
            "{e}"
        );
    }

    #[test]
    fn limits_and_privileges_become_host_config() {
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
            stdin: Some(vec![]),
            execution: true,
        };
        let body = container_body(&spec);
        assert_eq!(body.user.as_deref(), Some("0:0"));
        assert_eq!(body.open_stdin, Some(true));
        let hc = body.host_config.unwrap();
        assert_eq!(hc.network_mode.as_deref(), Some("none"));
        assert_eq!(hc.nano_cpus, Some(1_500_000_000));
        assert_eq!(hc.memory, Some(512 << 20));
        assert_eq!(hc.memory_swap, hc.memory);
        assert_eq!(hc.pids_limit, Some(64));
        assert_eq!(hc.readonly_rootfs, Some(true));
        assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(hc.security_opt, Some(vec!["no-new-privileges".to_string()]));
        let tmpfs = hc.tmpfs.unwrap();
        assert_eq!(
            tmpfs["/work"],
            "rw,exec,nosuid,nodev,mode=0755,uid=1000,gid=1000,size=100m"
        );
        assert_eq!(tmpfs["/stage"], "rw,exec,nosuid,nodev,mode=0700,size=200m");
        assert!(hc.binds.is_none(), "nothing of the host is mounted");
    }

    #[test]
    fn an_owner_of_another_host_is_never_judged_gone() {
        assert!(!owner_is_gone("elsewhere/1-1", "here"));
        let me = owner();
        let host = me.split('/').next().unwrap();
        assert!(!owner_is_gone(&me, host), "this process is alive");
        assert!(
            owner_is_gone(&format!("{host}/4294967294-1"), host),
            "no such process"
        );
    }
}
