//! Sandboxes: where an SWT execution runs. One interface, two kinds: `docker` (images in layers,
//! one container per execution, no network, resource limits) and `process` (a temporary checkout
//! and a virtualenv, for machines without Docker; weaker isolation, and it says so).
//!
//! An execution is: a fresh copy of the repository at the base commit with its environment
//! installed, some files written into it and some patches applied to it out of the command's
//! sight, the tree then sealed (see [`stage`]), one command run in it with a timeout, as an
//! unprivileged user in a world of its own (its own `/tmp`, `/dev/shm`, `HOME`, processes and no
//! network), output captured, and every process it started ended.

pub use reprobench_domain::registry::ExecutorKind;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

pub mod docker;
pub mod locales;
pub mod mirrors;
pub mod process;
pub(crate) mod python;
pub mod resolve;
pub mod stage;
pub mod stage_ahead;
pub mod system_packages;
pub mod tree;

pub use stage::PatchOutcome;
pub use stage_ahead::StageAheadMode;

/// A boxed future, so sandboxes of different kinds sit behind one trait object.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Prints, one per line and relative to the checkout given as its argument, the directories of
/// the checkout that editable installs made importable: paths in `.pth` and `.egg-link` files,
/// and for setuptools' editable finders the directory each mapped package sits in (its path with
/// as many trailing components taken off as the dotted name has parts: `'a.b': '/ck/a/b'` gives
/// `/ck`; a path that does not end with the name's parts cannot be put on `sys.path` and is
/// left out). Executions run in a copy of the checkout elsewhere; the copy's same directories go
/// first on `PYTHONPATH`, so imports see the patched code. A package's own directory there would
/// shadow the standard library (sympy's `sympy/codegen/ast.py` over `ast`). Python 3.5+, run with
/// the environment's interpreter.
pub(crate) const EDITABLE_ROOTS_PY: &str = r#"import sys
sys.path[:] = [p for p in sys.path if p]
import ast, os, sysconfig
root = sys.argv[1].rstrip('/')

def package_dirs(text):
    try:
        tree = ast.parse(text)
    except Exception:
        return []
    pairs = []
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif getattr(ast, 'AnnAssign', None) and isinstance(node, ast.AnnAssign):
            targets, value = [node.target], node.value
        else:
            continue
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        if not set(names) & set(['MAPPING', 'NAMESPACES']) or value is None:
            continue
        try:
            table = ast.literal_eval(value)
        except Exception:
            continue
        if not isinstance(table, dict):
            continue
        for key, paths in table.items():
            if isinstance(paths, str):
                paths = [paths]
            for path in paths:
                if isinstance(key, str) and isinstance(path, str):
                    pairs.append((key, path))
    dirs = []
    for key, path in pairs:
        parts = key.split('.')
        tail = os.path.normpath(path).split(os.sep)
        if len(tail) > len(parts) and tail[-len(parts):] == parts:
            dirs.append(os.sep.join(tail[:-len(parts)]) or os.sep)
    return dirs

found = set()
paths = sysconfig.get_paths()
for d in set([paths['purelib'], paths['platlib']]):
    if not os.path.isdir(d):
        continue
    for n in os.listdir(d):
        finder = n.startswith('__editable__') and n.endswith('_finder.py')
        if not (n.endswith('.pth') or n.endswith('.egg-link') or finder):
            continue
        try:
            text = open(os.path.join(d, n), encoding='utf-8', errors='replace').read()
        except OSError:
            continue
        if finder:
            cands = package_dirs(text)
        else:
            cands = [line.strip() for line in text.splitlines()]
        for s in cands:
            if s == root or s.startswith(root + '/'):
                found.add(os.path.relpath(s, root))
print('\n'.join(sorted(found)))
"#;

/// What an environment with [`EnvRecipe::fresh_build_tools`] upgrades first (`pip install
/// --upgrade …`): the newest pip, setuptools and wheel for its Python.
pub(crate) const BUILD_TOOLS: [&str; 4] = ["--upgrade", "pip", "setuptools", "wheel"];

/// pip's environment variable for `--uploaded-prior-to` ([`EnvRecipe::packages_as_of`]).
pub(crate) const PIP_DATE_CAP_VAR: &str = "PIP_UPLOADED_PRIOR_TO";
/// The pip that has `--uploaded-prior-to`: 26 and later, which need Python 3.9+.
pub(crate) const PIP_WITH_DATE_CAP: &str = "pip>=26";
/// What puts back the newest pip before the date cap (`pip install …` under
/// [`PIP_DATE_CAP_VAR`]): the installed, newer pip is not a candidate once reinstalling is forced.
pub(crate) const DATED_PIP: [&str; 3] = ["--force-reinstall", "--no-deps", "pip"];
/// What a new conda environment of the cap's date has besides pip (`pip install …` under
/// [`PIP_DATE_CAP_VAR`], before the packages): its setuptools and wheel (a venv has no wheel, and
/// pip's `--no-use-pep517` needs both).
pub(crate) const DATED_BUILD_TOOLS: [&str; 3] = ["--upgrade", "setuptools", "wheel"];
/// What pip says of a build backend without PEP 660's editable hook (pip 25.3 and later, which no
/// longer fall back to `setup.py develop`).
pub(crate) const NO_BUILD_EDITABLE: &str = "missing the 'build_editable' hook";

/// The report's line for an environment whose install command `cmd` ran again with the pip of
/// `date` (the date cap's), after the date cap's pip refused it for [`NO_BUILD_EDITABLE`].
pub(crate) fn dated_pip_install_note(date: &str, cmd: &str) -> String {
    let date = date.get(..10).unwrap_or(date);
    format!(
        "the install commands ran with the pip of {date}: the date cap's pip (26, the first with --uploaded-prior-to) refused `{cmd}` because the build backend the repository pins has no PEP 660 build_editable hook, and the pip of {date} falls back to `setup.py develop`, as SWT-bench's conda environment's pip did"
    )
}

/// Whether a recipe's install commands go back to the pip of the date cap when the cap's pip
/// refuses an editable install for [`NO_BUILD_EDITABLE`] (not when they use that pip from the
/// start, [`EnvRecipe::dated_pip_for_install`]).
pub(crate) fn retries_with_dated_pip(recipe: &EnvRecipe) -> bool {
    recipe.packages_as_of.is_some() && !recipe.dated_pip_for_install
}
/// pip's environment variable for `--build-constraint` ([`EnvRecipe::build_constraints`]).
pub(crate) const PIP_BUILD_CONSTRAINT_VAR: &str = "PIP_BUILD_CONSTRAINT";

/// Everything needed to build the environment an instance's executions run in.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EnvRecipe {
    /// `owner/name`.
    pub repo: String,
    /// Bare mirror of the repository (`REPOS/OWNER__NAME.git`).
    pub mirror: PathBuf,
    /// Commit the executions start from.
    pub base_commit: String,
    /// Python version wanted, e.g. `3.11` (the base image's or host's Python must match major.minor).
    pub python: String,
    /// pip requirement specifiers installed into the environment.
    pub packages: Vec<String>,
    /// Shell commands run in the repository before `install`.
    pub pre_install: Vec<String>,
    /// Shell command that installs the repository into the environment ("" for none).
    pub install: String,
    /// A requirements file's text, installed with `pip install -r` after `packages`.
    pub requirements: Option<String>,
    /// pip requirement specifiers installed last (pins over what came before).
    pub pip_packages: Vec<String>,
    /// Environment variables of the install commands and of the executions.
    pub env_vars: Vec<(String, String)>,
    /// The environment is a whole interpreter (a copy of its prefix, as a conda environment is)
    /// instead of a virtualenv: `tox --current-env` links its env's `python` to the running
    /// interpreter, and a link to a virtualenv's `python` outside it is no longer in the venv.
    pub standalone: bool,
    /// pip considers only files uploaded before this instant (see `EnvSpec::packages_as_of`).
    pub packages_as_of: Option<String>,
    /// Files of the base commit that the mirror lacks or replaces (see [`tree::gaps`]), one
    /// `PATH BLOB SUBSTITUTE|-` each: a mirror that gains a substitute is a new instance layer.
    pub tree_gaps: Vec<String>,
    /// Upgrade pip, setuptools and wheel first (see `EnvSpec::fresh_build_tools`).
    pub fresh_build_tools: bool,
    /// Submodules of the base commit, `(commit, path)` (see [`tree::gitlinks`]).
    pub gitlinks: Vec<(String, String)>,
    /// `packages` resolve as of this instant on the host and install as pins (see
    /// `EnvSpec::conda_packages_as_of` and [`resolve`]).
    pub conda_packages_as_of: Option<String>,
    /// Locales the executions need (see `EnvSpec::locales`).
    pub locales: Vec<String>,
    /// Debian packages the build needs (see `EnvSpec::system_packages`).
    pub system_packages: Vec<String>,
    /// pip constraints of source builds (see `EnvSpec::build_constraints`).
    pub build_constraints: Vec<String>,
    /// Go back to the newest pip of `packages_as_of` once the packages are installed (see
    /// `EnvSpec::dated_pip_for_install`).
    pub dated_pip_for_install: bool,
}

impl EnvRecipe {
    /// Content hash of the environment layer (Python and its packages).
    pub fn env_key(&self) -> String {
        let mut packages = self.packages.clone();
        if self.requirements.is_some() || !self.pip_packages.is_empty() {
            // Kept apart so that recipes without them hash as they always did.
            packages.push("--requirements".into());
            packages.extend(self.requirements.iter().cloned());
            packages.push("--pip-packages".into());
            packages.extend(self.pip_packages.iter().cloned());
        }
        if self.standalone {
            packages.push("--standalone".into());
        }
        if let Some(date) = &self.packages_as_of {
            packages.push(format!("--packages-as-of={date}"));
        }
        if self.fresh_build_tools {
            packages.push("--fresh-build-tools".into());
        }
        if let Some(date) = &self.conda_packages_as_of {
            packages.push(format!("--conda-packages-as-of={date}"));
        }
        if !self.locales.is_empty() {
            packages.push(format!("--locales={}", self.locales.join(",")));
        }
        if !self.build_constraints.is_empty() {
            packages.push(format!(
                "--build-constraints={}",
                self.build_constraints.join(",")
            ));
        }
        if self.dated_pip_for_install {
            packages.push("--dated-build-tools-and-pip".into());
        }
        if !self.system_packages.is_empty() {
            // An image installs those its base lacks.
            packages.push(format!(
                "--system-packages={}",
                self.system_packages.join(",")
            ));
        }
        reprobench_domain::swt::env_key(&self.python, &packages)
    }

    /// Content hash of the instance layer (environment + repository at the base commit + install).
    pub fn instance_key(&self) -> String {
        let mut h = reprobench_domain::swt::Fnv::default();
        // v2: the instance layer lists its editable-install roots.
        h.add("instance-v2");
        h.add(&self.env_key());
        h.add(&self.repo);
        h.add(&self.base_commit);
        for c in &self.pre_install {
            h.add(c);
        }
        h.add(&self.install);
        for (k, v) in &self.env_vars {
            h.add(k);
            h.add(v);
        }
        for g in &self.tree_gaps {
            h.add(g);
        }
        format!("{:016x}", h.0)
    }
}

/// An execution's output kept within a cap: its first half and its last half, with a line in
/// between saying how much was left out. Test summaries (pytest's `-rA` section) and the
/// harness's own closing lines come last, so the tail matters as much as the head.
#[derive(Debug)]
pub(crate) struct CappedOutput {
    head_cap: usize,
    tail_cap: usize,
    head: Vec<u8>,
    /// The latest bytes; holds up to twice `tail_cap` between trims.
    tail: Vec<u8>,
    left_out: u64,
}

impl CappedOutput {
    /// Keeps at most `cap` bytes of output (and one line saying what was left out).
    pub(crate) fn new(cap: usize) -> Self {
        let head_cap = cap / 2;
        CappedOutput {
            head_cap,
            tail_cap: cap - head_cap,
            head: Vec::new(),
            tail: Vec::new(),
            left_out: 0,
        }
    }

    /// Takes the next bytes of output.
    pub(crate) fn push(&mut self, mut bytes: &[u8]) {
        if self.head.len() < self.head_cap {
            let n = bytes.len().min(self.head_cap - self.head.len());
            self.head.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
        }
        self.tail.extend_from_slice(bytes);
        if self.tail.len() > 2 * self.tail_cap.max(1) {
            let drop = self.tail.len() - self.tail_cap;
            self.tail.drain(..drop);
            self.left_out += drop as u64;
        }
    }

    /// The kept output, and whether some was left out. The tail starts at a line's beginning.
    pub(crate) fn finish(mut self) -> (Vec<u8>, bool) {
        if self.tail.len() > self.tail_cap {
            let drop = self.tail.len() - self.tail_cap;
            self.tail.drain(..drop);
            self.left_out += drop as u64;
        }
        if self.left_out == 0 {
            self.head.extend_from_slice(&self.tail);
            return (self.head, false);
        }
        let line_start = self
            .tail
            .iter()
            .position(|b| *b == b'\n')
            .map_or(0, |i| i + 1);
        self.left_out += line_start as u64;
        let mut out = self.head;
        if !out.ends_with(b"\n") {
            out.push(b'\n');
        }
        out.extend_from_slice(
            format!(
                "[reprobench: {} bytes of output left out here; an execution keeps its first {} and last {} bytes]\n",
                self.left_out, self.head_cap, self.tail_cap
            )
            .as_bytes(),
        );
        out.extend_from_slice(&self.tail[line_start..]);
        (out, true)
    }
}

/// Resource limits of one execution.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// CPUs (fractional allowed).
    pub cpus: f64,
    /// Memory in MiB.
    pub memory_mb: u64,
    /// Maximum number of processes/threads.
    pub pids: u64,
    /// Writable scratch space in MiB (work directory and /tmp).
    pub disk_mb: u64,
    /// Wall-clock limit; the whole process tree is killed when it passes.
    pub timeout: Duration,
    /// Output kept (bytes): its first and last halves; the middle is dropped and
    /// `output_truncated` set.
    pub max_output_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            cpus: 1.0,
            memory_mb: 2048,
            pids: 256,
            disk_mb: 1024,
            timeout: Duration::from_secs(1800),
            max_output_bytes: 16 << 20,
        }
    }
}

/// A file written into an execution: into its tree ([`ExecRequest::files`]) or its support
/// directory ([`ExecRequest::support`]).
#[derive(Debug, Clone, PartialEq)]
pub struct InputFile {
    /// Path relative to the directory it goes into; must not escape it.
    pub path: String,
    /// Contents.
    pub contents: Vec<u8>,
    /// Unix mode, e.g. 0o644 or 0o755.
    pub mode: u32,
}

/// A patch applied to an execution's tree before its command runs.
#[derive(Debug, Clone, PartialEq)]
pub struct PatchFile {
    /// What it is (`code`, `test`): the label of its [`PatchOutcome`].
    pub label: String,
    /// The diff, as `git apply` reads it.
    pub contents: Vec<u8>,
}

/// One execution.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExecRequest {
    /// Files written into the tree, before the patches; they become part of it.
    pub files: Vec<InputFile>,
    /// Patches applied in order with `git apply -v` (a failed one does not stop the execution),
    /// out of the command's sight: neither they nor their output are in its reach.
    pub patches: Vec<PatchFile>,
    /// Files placed in a directory outside the tree that the command can read and write; its
    /// path is in the command's environment as [`stage::SUPPORT_ENV`].
    pub support: Vec<InputFile>,
    /// A file of the support directory read back once the command has ended.
    pub collect: Option<String>,
    /// argv, run with the tree as current directory.
    pub command: Vec<String>,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
    /// Limits.
    pub limits: Limits,
}

/// What an execution produced.
#[derive(Debug, Clone, Default)]
pub struct ExecOutput {
    /// Exit code of the command; `None` when it was killed (timeout) or never started.
    pub exit_code: Option<i64>,
    /// The timeout fired and the process tree was killed.
    pub timed_out: bool,
    /// The command's stdout and stderr, interleaved as written, lossily decoded, kept within
    /// `max_output_bytes` (its head and tail).
    pub output: String,
    /// Output was cut.
    pub output_truncated: bool,
    /// What applying the patches printed (`git apply -v`).
    pub prepare_log: String,
    /// How each patch went, in order.
    pub patches: Vec<PatchOutcome>,
    /// The command started (the tree was prepared).
    pub started: bool,
    /// The [`ExecRequest::collect`] file's contents, when it was there.
    pub collected: Option<Vec<u8>>,
    /// Time the command ran (from start to exit or kill).
    pub command_time: Duration,
    /// CPU time (user and system) the command and the children it waited for used, where the
    /// sandbox can tell.
    pub command_cpu: Option<Duration>,
    /// Time the harness itself spent around it (copies, patches, sealing, start, cleanup).
    pub overhead: Duration,
    /// Where the execution's wall time went, phase by phase in the order they ran (the
    /// command among them); phases the sandbox could not time are left out.
    pub phases: Vec<Phase>,
}

/// One phase of an execution and how long it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Phase {
    /// What ran: for example `copy` (the checkout into the stage), `stage` (files, patches,
    /// seal), `unpack` (the sealed tree into the command's tmpfs), `command`.
    pub name: &'static str,
    /// How long it took.
    pub took: Duration,
}

/// Sandbox failures, classified for the scheduler.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The machinery failed (engine down, build failed for a network reason, disk full): retry elsewhere.
    #[error("{0}")]
    Infra(String),
    /// The instance cannot be prepared (commit missing from the mirror, install fails): final.
    #[error("{0}")]
    BadInput(String),
}

/// A prepared environment: an image tag (docker) or a checkout template and virtualenv (process).
#[derive(Debug, Clone, PartialEq)]
pub enum Prepared {
    /// Docker image tag of the instance layer; the repository sits at [`docker::WORKDIR`].
    Image(String),
    /// A checkout at the base commit with its environment, copied afresh for every execution.
    Checkout {
        /// The template checkout.
        template: PathBuf,
        /// The virtualenv whose `bin/` goes first on PATH.
        venv: PathBuf,
    },
}

/// Where executions run.
pub trait Sandbox: Send + Sync {
    /// The executor kind this sandbox serves (docker or process).
    fn kind(&self) -> ExecutorKind;
    /// Everything about this sandbox, beyond a recipe and its limits, that can change what an
    /// execution gives: its kind, and for docker its base image. Part of the cache key of
    /// gold/base executions, so one sandbox's results are never reused by another.
    fn identity(&self) -> String {
        self.kind().to_string()
    }
    /// Set when this node runs executions it cannot isolate (allowed by an explicit flag): what
    /// every report it produces must say.
    fn isolation_note(&self) -> Option<String> {
        None
    }
    /// How the environment this sandbox builds for `recipe` departs from the upstream one, in
    /// words for a report's `environment_left_out` (none by default).
    fn environment_notes(&self, _recipe: &EnvRecipe) -> Vec<String> {
        Vec::new()
    }
    /// How a prepared environment departs from the upstream one in ways only building it
    /// showed (a fallback its build took), in words for the report (none by default).
    fn prepared_notes(&self, _prepared: &Prepared) -> Vec<String> {
        Vec::new()
    }
    /// Builds (or finds cached) the environment for a recipe.
    fn prepare(&self, recipe: &EnvRecipe) -> crate::BoxFuture<Result<Prepared, SandboxError>>;
    /// The environment for a recipe when it is there already, building and resolving nothing
    /// (for work announced before its grant); `None` when anything is missing, and by default.
    fn find_prepared(&self, _recipe: &EnvRecipe) -> crate::BoxFuture<Option<Prepared>> {
        Box::pin(async { None })
    }
    /// Says that an execution of `req` on `prepared` comes next, so the sandbox may prepare
    /// its tree while another execution runs (process: staged ahead); the `exec` of an equal
    /// request then runs in it, exactly as in a tree prepared on its path. Only a hint:
    /// nothing by default, and an announced execution that never comes is discarded.
    fn exec_ahead(&self, _prepared: &Prepared, _req: &ExecRequest) {}
    /// [`Sandbox::exec_ahead`] for the first execution of the node's next task, while the
    /// current task's last one runs: a guess of the coordinator's, so the sandbox may spend
    /// less on it (docker boots its container only once a core is idle, unless the stage-ahead
    /// mode is `always`). As `exec_ahead` by default.
    fn exec_next_task_ahead(&self, prepared: &Prepared, req: &ExecRequest) {
        self.exec_ahead(prepared, req);
    }
    /// Runs one execution in a fresh copy of a prepared environment.
    fn exec(
        &self,
        prepared: &Prepared,
        req: ExecRequest,
    ) -> crate::BoxFuture<Result<ExecOutput, SandboxError>>;
    /// Finishes what executions left for later (docker: containers being removed or made
    /// ahead), so the sandbox leaves nothing behind; for a node that stops.
    fn settle(&self) -> crate::BoxFuture<()> {
        Box::pin(async {})
    }
}

/// Writes `value` as JSON to `path` (its directory made if need be) through a file beside it
/// renamed over it, so a crash never leaves half a file.
pub(crate) fn write_json_whole(
    path: &std::path::Path,
    value: &impl serde::Serialize,
) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(std::path::Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    serde_json::to_writer_pretty(&mut tmp, value)?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Rejects paths that are absolute or climb out of the work directory.
pub fn check_relative_path(path: &str) -> Result<(), SandboxError> {
    let p = std::path::Path::new(path);
    let escapes = p.is_absolute()
        || p.components().any(|c| {
            !matches!(
                c,
                std::path::Component::Normal(_) | std::path::Component::CurDir
            )
        });
    if escapes || path.is_empty() {
        return Err(SandboxError::BadInput(format!(
            "file path `{path}` must be relative and stay inside the repository"
        )));
    }
    Ok(())
}

pub(crate) use reprobench_domain::sync::lock;

#[cfg(test)]
mod tests {
    fn kept(cap: usize, chunks: &[&str]) -> (String, bool) {
        let mut c = CappedOutput::new(cap);
        for chunk in chunks {
            c.push(chunk.as_bytes());
        }
        let (bytes, truncated) = c.finish();
        (String::from_utf8(bytes).unwrap(), truncated)
    }

    #[test]
    fn output_within_the_cap_is_kept_whole() {
        assert_eq!(
            kept(10, &["abc\n", "defgh\n"]),
            ("abc\ndefgh\n".into(), false)
        );
        assert_eq!(kept(10, &[]), (String::new(), false));
        assert_eq!(kept(10, &["0123456789"]), ("0123456789".into(), false));
    }

    #[test]
    fn long_output_keeps_its_head_and_its_tail_from_a_line_start() {
        // A summary at the end survives a long middle, whatever the chunking.
        let lines: Vec<String> = (0..1000).map(|i| format!("line {i}\n")).collect();
        let whole: String = lines.concat();
        for chunk in [1, 7, 4096] {
            let pieces: Vec<&str> = (0..whole.len())
                .step_by(chunk)
                .map(|i| &whole[i..(i + chunk).min(whole.len())])
                .collect();
            let (text, truncated) = kept(200, &pieces);
            assert!(truncated);
            assert!(text.starts_with("line 0\nline 1\n"), "{text}");
            assert!(text.ends_with("line 998\nline 999\n"), "{text}");
            let marker = text
                .lines()
                .find(|l| l.starts_with("[reprobench: "))
                .unwrap();
            let left_out: usize = marker["[reprobench: ".len()..]
                .split(' ')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            let after = &text[text.find(marker).unwrap() + marker.len() + 1..];
            assert!(
                after.starts_with("line "),
                "the tail starts at a line: {after}"
            );
            assert_eq!(100 + left_out + after.len(), whole.len(), "chunk {chunk}");
        }
    }

    use super::*;

    fn recipe() -> EnvRecipe {
        EnvRecipe {
            repo: "o/n".into(),
            mirror: "/m".into(),
            base_commit: "abc".into(),
            python: "3.11".into(),
            packages: vec!["pytest".into()],
            pre_install: vec![],
            install: String::new(),
            ..Default::default()
        }
    }

    #[test]
    fn keys_follow_content() {
        let a = recipe();
        let mut b = recipe();
        b.base_commit = "def".into();
        assert_eq!(
            a.env_key(),
            b.env_key(),
            "the environment does not depend on the commit"
        );
        assert_ne!(a.instance_key(), b.instance_key());
        b.packages.push("numpy".into());
        assert_ne!(a.env_key(), b.env_key());
    }

    /// Runs [`EDITABLE_ROOTS_PY`] in a fresh venv of the host's `python3` whose site-packages
    /// holds `files`; `None` when this machine has no `python3` with `venv`.
    fn editable_roots_of(
        checkout: &std::path::Path,
        files: &[(&str, String)],
    ) -> Option<Vec<String>> {
        let tmp = tempfile::tempdir().unwrap();
        let venv = tmp.path().join("venv");
        let made = std::process::Command::new("python3")
            .args(["-m", "venv", "--without-pip"])
            .arg(&venv)
            .status()
            .ok()?;
        if !made.success() {
            return None;
        }
        let site = std::process::Command::new(venv.join("bin/python"))
            .args([
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            ])
            .output()
            .unwrap();
        let site = std::path::PathBuf::from(String::from_utf8(site.stdout).unwrap().trim());
        for (name, text) in files {
            std::fs::write(site.join(name), text).unwrap();
        }
        let out = std::process::Command::new(venv.join("bin/python"))
            .args(["-c", EDITABLE_ROOTS_PY])
            .arg(checkout)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(
            String::from_utf8(out.stdout)
                .unwrap()
                .lines()
                .map(str::to_string)
                .collect(),
        )
    }

    #[test]
    fn editable_finders_give_the_directory_a_package_sits_in_never_the_package_itself() {
        // setuptools' finder as sympy's editable install writes it: namespace packages (test
        // directories without __init__.py) map to their own directories. Putting
        // `sympy/codegen` on sys.path made `import ast` load sympy/codegen/ast.py.
        let ck = "/ck/sympy-1.12";
        let finder = format!(
            "import sys\nMAPPING: dict[str, str] = {{'sympy': '{ck}/sympy'}}\n\
             NAMESPACES: dict[str, list[str]] = {{'sympy.codegen.tests': ['{ck}/sympy/codegen/tests'], \
             'sympy.parsing.autolev._antlr': ['{ck}/sympy/parsing/autolev/_antlr']}}\n\
             PATH_PLACEHOLDER = '__editable__.sympy-1.12.finder' + \".__path_hook__\"\n"
        );
        let Some(roots) = editable_roots_of(
            ck.as_ref(),
            &[("__editable___sympy_1_12_finder.py", finder)],
        ) else {
            eprintln!("skipped: no python3 with venv here");
            return;
        };
        assert_eq!(roots, vec!["."], "only the checkout's root");

        // A src layout, an older finder without annotations, a name that does not match its
        // directory (no sys.path entry can make it importable), a .pth and an .egg-link.
        let finder = format!(
            "MAPPING = {{'pkg': '{ck}/src/pkg', 'other': '{ck}/lib/renamed'}}\nNAMESPACES = {{}}\n"
        );
        let roots = editable_roots_of(
            ck.as_ref(),
            &[
                ("__editable___pkg_0_1_finder.py", finder),
                ("legacy.pth", format!("{ck}/tools\nimport os\n/elsewhere\n")),
                ("old.egg-link", format!("{ck}\n.\n")),
            ],
        )
        .unwrap();
        assert_eq!(roots, vec![".", "src", "tools"]);
    }

    #[test]
    fn paths_stay_inside() {
        assert!(check_relative_path("tests/test_x.py").is_ok());
        assert!(check_relative_path("../x").is_err());
        assert!(check_relative_path("/etc/passwd").is_err());
        assert!(check_relative_path("a/../../b").is_err());
        assert!(check_relative_path("").is_err());
    }
}
