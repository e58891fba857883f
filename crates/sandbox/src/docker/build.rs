//! Building env and instance layers: the Dockerfile and its in-memory context, the streamed build,
//! and telling a recipe's own failure (final) from the machinery's (retry elsewhere).

use super::super::{
    BUILD_TOOLS, DATED_BUILD_TOOLS, DATED_PIP, EnvRecipe, NO_BUILD_EDITABLE,
    PIP_BUILD_CONSTRAINT_VAR, PIP_DATE_CAP_VAR, PIP_WITH_DATE_CAP, SandboxError,
    dated_pip_install_note, retries_with_dated_pip,
};
use super::{KEY_LABEL, LAYER_LABEL, PARENT_LABEL, REPO_ARCHIVE, WORKDIR};
use bollard::Docker;
use bollard::query_parameters::{BuildImageOptionsBuilder, RemoveImageOptionsBuilder};
use futures_util::StreamExt;
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};
use tracing::{debug, info};

/// Where the CA bundle goes inside images.
const CA_PATH: &str = "/etc/reprobench/ca-certificates.crt";
/// Lines of build output quoted in an error.
const QUOTED_LINES: usize = 30;
/// Characters kept of one output line (a RUN line quotes a whole script).
const LINE_CHARS: usize = 300;
/// Lines of the failing step searched for signs of a network failure.
const KEPT_LINES: usize = 400;
/// Builds may download for a long time; the engine sends nothing until the context is read.
const BUILD_REQUEST_TIMEOUT: Duration = Duration::from_secs(6 * 3600);

/// Who wrote a piece of the build: a failure in the harness's own pieces is infrastructure, one
/// in the recipe's commands is (mostly) the instance's.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Origin {
    /// A piece of the harness itself (what it does, for the error message).
    Harness(&'static str),
    /// `pip install` of the recipe's packages.
    Packages,
    /// The recipe's `pre_install` command number N (0-based).
    PreInstall(usize),
    /// The recipe's `install` command.
    Install,
}

impl Origin {
    fn describe(&self) -> String {
        match self {
            Origin::Harness(what) => (*what).to_string(),
            Origin::Packages => "pip install of the recipe's packages".into(),
            Origin::PreInstall(i) => format!("pre_install command {}", i + 1),
            Origin::Install => "the install command".into(),
        }
    }
}

/// Printed (on a line of its own) before each piece of a [`Layer::script`] step, so a failure can
/// be traced to the piece.
const PIECE_MARK: &str = "reprobench-piece:";

/// Printed (on a line of its own) by an install piece that goes back to the pip of the date cap
/// ([`with_dated_pip_retry`]), so the build can say so in the instance's reports.
const DATED_PIP_MARK: &str = "reprobench-dated-pip";
/// Where an install piece keeps its output until it knows whether to retry.
const INSTALL_LOG: &str = "\"${TMPDIR:-/tmp}/reprobench-install.log\"";
/// Label of an instance image whose build departed from the upstream environment in a way only
/// building it showed: the reports' lines, as a JSON array of strings.
const NOTES_LABEL: &str = "reprobench.prepared-notes";

/// A layer to build: Dockerfile steps with their origin, context files, image labels.
///
/// Every step costs a container and a commit (seconds each on fuse-overlayfs), so the shell
/// work of a layer is one `RUN` of a script whose pieces announce themselves in the output.
#[derive(Debug)]
pub(super) struct Layer {
    steps: Vec<(String, Origin)>,
    /// Pieces of script steps, by the number they announce.
    pieces: Vec<Origin>,
    files: Vec<(String, Vec<u8>)>,
    labels: BTreeMap<String, String>,
}

impl Layer {
    fn new(from: &str, kind: &str, key: String) -> Layer {
        Layer {
            steps: vec![(
                format!("FROM {from}"),
                Origin::Harness("starting from the parent image"),
            )],
            pieces: Vec::new(),
            files: Vec::new(),
            labels: BTreeMap::from([
                (LAYER_LABEL.to_string(), kind.to_string()),
                (KEY_LABEL.to_string(), key),
                (PARENT_LABEL.to_string(), from.to_string()),
            ]),
        }
    }

    /// The image tag of this layer in `repo`: its key, then a hash of what it is built from (the
    /// Dockerfile, with its parent, script and labels, and the context files attached so far).
    /// A changed build script or parent makes a new tag, never a stale image reused.
    /// The content key the layer is labelled with.
    pub(super) fn key(&self) -> &str {
        self.labels.get(KEY_LABEL).map_or("", String::as_str)
    }

    pub(super) fn tag(&self, repo: &str) -> String {
        let mut h = reprobench_domain::swt::Fnv::default();
        h.add(&self.dockerfile());
        for (name, bytes) in &self.files {
            h.add(name);
            h.add_bytes(bytes);
        }
        let key = self.labels.get(KEY_LABEL).map_or("", String::as_str);
        format!("{repo}:{key}-{:016x}", h.0)
    }

    /// Adds a context file after the tag is known (one too large to hash on every prepare, and
    /// determined by the layer's key, as the repository archive at the base commit is).
    pub(super) fn attach(&mut self, name: &str, bytes: Vec<u8>) {
        self.files.push((name.to_string(), bytes));
    }

    fn step(&mut self, instruction: String, origin: Origin) {
        self.steps.push((instruction, origin));
    }

    /// One `RUN` of `sh -c` over pieces run in order, each announced, the first failure ending
    /// it with that piece's exit status. Exec form: JSON quoting survives any character.
    fn script(&mut self, pieces: Vec<(Origin, String)>) {
        let mut script = String::from("cd / || exit 1\n");
        for (origin, command) in pieces {
            let n = self.pieces.len();
            self.pieces.push(origin);
            script.push_str(&format!(
                "printf '\\n%s %s\\n' '{PIECE_MARK}' {n}\n{command} || exit $?\n"
            ));
        }
        let argv = serde_json::to_string(&["/bin/sh", "-c", &script]).expect("strings serialize");
        self.step(
            format!("RUN {argv}"),
            Origin::Harness("running the layer's commands"),
        );
    }

    /// Ends the layer with its labels: one `LABEL` step (build options would add one per label,
    /// each a commit).
    fn label(&mut self) {
        // Double quotes, with `\`, `"` and `$` (variable expansion) escaped.
        let quote = |v: &str| {
            let mut q = String::from('"');
            for c in v.chars() {
                if matches!(c, '\\' | '"' | '$') {
                    q.push('\\');
                }
                q.push(c);
            }
            q.push('"');
            q
        };
        let labels: Vec<String> = self
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={}", quote(v)))
            .collect();
        self.step(
            format!("LABEL {}", labels.join(" ")),
            Origin::Harness("labelling the image"),
        );
    }

    /// The Dockerfile text; step N of the build is line N.
    pub(super) fn dockerfile(&self) -> String {
        let mut s: String = self.steps.iter().map(|(i, _)| format!("{i}\n")).collect();
        s.insert_str(
            0,
            "# Generated by reprobench: one instruction per line, one step each.\n",
        );
        s
    }

    /// The build context: the Dockerfile and the files, as a tar made in memory.
    fn context(&self) -> Result<Vec<u8>, SandboxError> {
        let mut tar = tar::Builder::new(Vec::new());
        let dockerfile = self.dockerfile().into_bytes();
        let entries = std::iter::once(("Dockerfile", dockerfile.as_slice()))
            .chain(self.files.iter().map(|(n, b)| (n.as_str(), b.as_slice())));
        for (name, bytes) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_size(bytes.len() as u64);
            h.set_mode(0o644);
            // A fixed mtime keeps the context (and the engine's step cache) reproducible.
            h.set_mtime(0);
            h.set_cksum();
            tar.append_data(&mut h, name, bytes)
                .map_err(|e| SandboxError::Infra(format!("cannot make the build context: {e}")))?;
        }
        tar.into_inner()
            .map_err(|e| SandboxError::Infra(format!("cannot make the build context: {e}")))
    }

    /// Where a failure happened: the script piece last announced, else the Dockerfile step.
    fn origin(&self, step: Option<usize>, piece: Option<usize>) -> Option<&Origin> {
        piece.and_then(|p| self.pieces.get(p)).or_else(|| {
            step.and_then(|n| self.steps.get(n.checked_sub(1)?))
                .map(|(_, o)| o)
        })
    }
}

/// `s` as one shell word.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The python layer: a host interpreter's whole prefix at its own absolute path (so its built-in
/// library path holds) and `/usr/local/bin/pythonX.Y`, for a version the base image lacks. The
/// prefix's archive is attached as `python.tar` once the tag says it is needed.
pub(super) fn python_layer(base: &str, key: String, exe: &str, version: &str) -> Layer {
    let mut l = Layer::new(base, "python", key);
    // ADD unpacks a local tar archive.
    l.step(
        "ADD python.tar /".into(),
        Origin::Harness("unpacking the interpreter copied from the host"),
    );
    l.script(vec![(
        Origin::Harness("linking the interpreter and checking its venv module"),
        format!(
            "chmod 755 /root && ln -sf {exe} /usr/local/bin/python{version} && /usr/local/bin/python{version} -m venv --help >/dev/null"
        ),
    )]);
    l.label();
    l
}

/// reprobench's own image (what a Kubernetes chart runs): `binary` at `/usr/local/bin/reprobench`
/// over `base`, as the entrypoint, with the data and cache directories made.
pub(super) fn self_layer(base: &str, binary: Vec<u8>, version: &str) -> Layer {
    // Keyed by the binary itself: a rebuilt binary of the same version makes a new image.
    let mut h = reprobench_domain::swt::Fnv::default();
    h.add_bytes(&binary);
    let mut l = Layer::new(base, "self", format!("{version}-{:016x}", h.0));
    l.attach("reprobench", binary);
    l.step(
        "COPY reprobench /usr/local/bin/reprobench".into(),
        Origin::Harness("copying the reprobench binary in"),
    );
    l.script(vec![(
        Origin::Harness("checking the binary runs in the image"),
        "chmod 755 /usr/local/bin/reprobench && mkdir -p /data /cache && /usr/local/bin/reprobench --version".into(),
    )]);
    l.step(
        "ENTRYPOINT [\"/usr/local/bin/reprobench\"]".into(),
        Origin::Harness("setting the entrypoint"),
    );
    l.label();
    l
}

/// The env layer: CA bundle, a virtualenv at `/opt/venv` made by `python`, and in it the
/// recipe's packages, then its requirements file, then its pip pins.
pub(super) fn env_layer(
    base: &str,
    recipe: &EnvRecipe,
    ca_bundle: Option<Vec<u8>>,
    python: &str,
) -> Layer {
    let mut l = Layer::new(base, "env", recipe.env_key());
    // pip, requests and OpenSSL users trust the host's CAs (a TLS-intercepting proxy's too).
    let ca_env = match ca_bundle {
        Some(ca) => {
            l.files.push(("reprobench/ca-certificates.crt".into(), ca));
            format!(" PIP_CERT={CA_PATH} SSL_CERT_FILE={CA_PATH} REQUESTS_CA_BUNDLE={CA_PATH}")
        }
        None => String::new(),
    };
    // Requirements files, not argv: specifiers like `a>=1,<2` need no shell quoting.
    let lines = |v: &[String]| {
        let mut t = v.join("\n");
        t.push('\n');
        t.into_bytes()
    };
    l.files.push((
        "reprobench/requirements.txt".into(),
        lines(&recipe.packages),
    ));
    if let Some(reqs) = &recipe.requirements {
        l.files.push((
            "reprobench/repo-requirements.txt".into(),
            reqs.clone().into_bytes(),
        ));
    }
    l.files.push((
        "reprobench/pip-packages.txt".into(),
        lines(&recipe.pip_packages),
    ));
    l.step(
        "COPY reprobench/ /etc/reprobench/".into(),
        Origin::Harness("copying the CA bundle and requirements in"),
    );
    // Every pip run in this image and the instance's, its install commands' too, honours the cap.
    let mut date_cap = match &recipe.packages_as_of {
        Some(date) => format!(" {PIP_DATE_CAP_VAR}={}", sh_quote(date)),
        None => String::new(),
    };
    if !recipe.build_constraints.is_empty() {
        l.files.push((
            "reprobench/build-constraints.txt".into(),
            lines(&recipe.build_constraints),
        ));
        date_cap.push_str(&format!(
            " {PIP_BUILD_CONSTRAINT_VAR}=/etc/reprobench/build-constraints.txt"
        ));
    }
    // PATH names the virtualenv before it exists: the interpreter below is still the base one.
    l.step(
        format!(
            "ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH PIP_DISABLE_PIP_VERSION_CHECK=1 \
             PIP_NO_INPUT=1 PYTHONUNBUFFERED=1{ca_env}{date_cap}"
        ),
        Origin::Harness("setting the environment"),
    );
    let mut pieces = vec![if recipe.standalone {
        // A whole interpreter, as a conda environment is (see `EnvRecipe::standalone`).
        (
            Origin::Harness(
                "copying the interpreter's prefix to /opt/venv (a standalone environment)",
            ),
            format!(
                "p=\"$({python} -c 'import sys; print(sys.base_prefix)')\" && cp -a \"$p\" /opt/venv && {{ test -x /opt/venv/bin/python || ln -s \"$(basename \"$(readlink -f {python})\")\" /opt/venv/bin/python; }} && for f in /opt/venv/bin/*; do if [ ! -L \"$f\" ] && [ \"$(head -c 2 \"$f\")\" = '#!' ]; then sed -i '1s|^#!/.*/bin/python[0-9.]*$|#!/opt/venv/bin/python|' \"$f\"; fi; done"
            ),
        )
    } else {
        (
            Origin::Harness(
                "creating the virtualenv with `python -m venv` (the base image needs python3-venv)",
            ),
            format!("/usr/bin/env {python} -m venv /opt/venv"),
        )
    }];
    if !recipe.system_packages.is_empty() {
        // What the build needs from the system and the base image lacks (SWT-bench's base has
        // a C toolchain, and so has reprobench's: usually nothing to do).
        let list = recipe
            .system_packages
            .iter()
            .map(|p| sh_quote(p))
            .collect::<Vec<_>>()
            .join(" ");
        pieces.push((
            Origin::Harness("installing the system packages the build needs"),
            format!(
                "dpkg -s {list} >/dev/null 2>&1 || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends {list} && rm -rf /var/lib/apt/lists/*)"
            ),
        ));
    }
    if recipe.fresh_build_tools {
        // The newest pip, setuptools and wheel for the Python, as a new conda environment has.
        pieces.push((
            Origin::Packages,
            format!(
                "python -m pip install --no-cache-dir {}",
                BUILD_TOOLS.join(" ")
            ),
        ));
    }
    if recipe.packages_as_of.is_some() {
        // That pip itself is newer than the dates one caps at.
        // The recipe's when it fails: no pip 26 for the recipe's Python (before 3.9).
        pieces.push((
            Origin::Packages,
            format!(
                "env -u {PIP_DATE_CAP_VAR} python -m pip install --no-cache-dir --upgrade '{PIP_WITH_DATE_CAP}'"
            ),
        ));
    }
    if recipe.packages_as_of.is_some() && recipe.dated_pip_for_install {
        // A conda environment of the date has its setuptools and wheel before any package.
        pieces.push((
            Origin::Packages,
            format!(
                "python -m pip install --no-cache-dir {}",
                DATED_BUILD_TOOLS.join(" ")
            ),
        ));
    }
    for (present, file) in [
        (!recipe.packages.is_empty(), "requirements.txt"),
        (recipe.requirements.is_some(), "repo-requirements.txt"),
        (!recipe.pip_packages.is_empty(), "pip-packages.txt"),
    ] {
        if present {
            pieces.push((
                Origin::Packages,
                format!("python -m pip install --no-cache-dir -r /etc/reprobench/{file}"),
            ));
        }
    }
    if recipe.packages_as_of.is_some() && recipe.dated_pip_for_install {
        // The date cap now picks the newest pip before it, which the install commands run.
        pieces.push((
            Origin::Packages,
            format!(
                "python -m pip install --no-cache-dir {}",
                DATED_PIP.join(" ")
            ),
        ));
    }
    l.script(pieces);
    l.label();
    l
}

/// The instance layer: the repository at the base commit in [`WORKDIR`] as a git repository,
/// then the recipe's `pre_install` and `install` commands run there, then the tree archived in
/// [`REPO_ARCHIVE`] for the executions, and both closed to all but root. The archive of the
/// repository at the base commit is attached as `repo.tar` once the tag says it is needed.
pub(super) fn instance_layer(env_tag: &str, recipe: &EnvRecipe) -> Layer {
    let mut l = Layer::new(env_tag, "instance", recipe.instance_key());
    l.labels
        .insert("reprobench.repo".into(), recipe.repo.clone());
    l.labels
        .insert("reprobench.commit".into(), recipe.base_commit.clone());
    l.step(
        format!("WORKDIR {WORKDIR}"),
        Origin::Harness("creating the repository directory"),
    );
    // ADD unpacks a local tar archive into the directory.
    l.step(
        format!("ADD repo.tar {WORKDIR}/"),
        Origin::Harness("unpacking the repository"),
    );
    // safe.directory: copies may be owned by others. The one-commit repository as the process
    // executor's checkout has it (`tree::base_commit_script`).
    let git = format!(
        "cd {WORKDIR} \
        && git config --system user.name reprobench \
        && git config --system user.email reprobench@localhost \
        && git config --system --add safe.directory '*' \
        && {}",
        super::super::tree::base_commit_script(&recipe.gitlinks)
    );
    let mut pieces = vec![(
        Origin::Harness("making the repository a git repository (the base image needs git)"),
        git,
    )];
    // Each command in its own bash, from the repository root, as a Dockerfile RUN would, with
    // the recipe's variables.
    let exports: String = recipe
        .env_vars
        .iter()
        .filter(|(k, _)| !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .map(|(k, v)| format!("export {k}={} && ", sh_quote(v)))
        .collect();
    let in_repo = |c: &str| {
        format!(
            "(cd {WORKDIR} && {exports}exec /bin/bash -c {})",
            sh_quote(c)
        )
    };
    // As the process executor does: a command the date cap's pip refuses for a build backend
    // without PEP 660's hook runs again with the pip of the cap's date.
    let install_piece = |c: &str| {
        if retries_with_dated_pip(recipe) {
            with_dated_pip_retry(&in_repo(c))
        } else {
            in_repo(c)
        }
    };
    for (i, c) in recipe.pre_install.iter().enumerate() {
        pieces.push((Origin::PreInstall(i), install_piece(c)));
    }
    if !recipe.install.trim().is_empty() {
        pieces.push((Origin::Install, install_piece(&recipe.install)));
    }
    pieces.push((
        Origin::Harness("listing the repository's editable-install roots"),
        {
            // Base64, so no shell or Dockerfile quoting touches the script.
            use base64::Engine;
            let b64 = base64::engine::general_purpose::STANDARD
                .encode(super::super::EDITABLE_ROOTS_PY);
            format!(
                "mkdir -p /etc/reprobench && python -c \"import base64; exec(base64.b64decode('{b64}'))\" {WORKDIR} > /etc/reprobench/editable"
            )
        },
    ));
    pieces.push((
        Origin::Harness("archiving the repository for the executions and closing it"),
        format!(
            "d=$(dirname {REPO_ARCHIVE}) && mkdir -p \"$d\" && tar -C {WORKDIR} -cf {REPO_ARCHIVE} . \
            && chmod 600 {REPO_ARCHIVE} && chmod 700 \"$d\" {WORKDIR}"
        ),
    ));
    l.script(pieces);
    l.label();
    l
}

/// `command` (a shell command line), run again after `pip install` of the pip of the date cap
/// when its output says the date cap's pip refused an editable install for
/// [`NO_BUILD_EDITABLE`]; the retry prints [`DATED_PIP_MARK`] first. Any other failure keeps
/// its exit status.
fn with_dated_pip_retry(command: &str) -> String {
    let script = format!(
        "set -o pipefail\n\
         ( {command} ) 2>&1 | tee {INSTALL_LOG}\n\
         status=$?\n\
         if [ \"$status\" -eq 0 ]; then rm -f {INSTALL_LOG}; exit 0; fi\n\
         grep -qF {needle} {INSTALL_LOG} || exit \"$status\"\n\
         rm -f {INSTALL_LOG}\n\
         printf '\\n%s\\n' {DATED_PIP_MARK}\n\
         python -m pip install --no-cache-dir {dated} || exit $?\n\
         {command}\n",
        needle = sh_quote(NO_BUILD_EDITABLE),
        dated = DATED_PIP.join(" "),
    );
    format!("/bin/bash -c {}", sh_quote(&script))
}

/// The reports' lines for the pieces of an instance layer that went back to the pip of the date
/// cap ([`with_dated_pip_retry`]).
pub(super) fn dated_pip_notes(recipe: &EnvRecipe, pieces: &[Origin]) -> Vec<String> {
    let date = recipe.packages_as_of.as_deref().unwrap_or("the date cap");
    pieces
        .iter()
        .filter_map(|p| match p {
            Origin::PreInstall(i) => recipe.pre_install.get(*i),
            Origin::Install => Some(&recipe.install),
            _ => None,
        })
        .map(|cmd| dated_pip_install_note(date, cmd))
        .collect()
}

/// The reports' lines an instance image carries ([`NOTES_LABEL`]; none when it has no label).
pub(super) fn notes_of(image: &bollard::models::ImageInspect) -> Vec<String> {
    image
        .config
        .as_ref()
        .and_then(|c| c.labels.as_ref())
        .and_then(|l| l.get(NOTES_LABEL))
        .and_then(|v| serde_json::from_str(v).ok())
        .unwrap_or_default()
}

/// Puts `notes` on the image `tag` ([`NOTES_LABEL`]): a layer of one `LABEL` over it, tagged
/// `tag` in its place, so a cached image still says what its build showed. When that fails the
/// image is removed, so that no image without its notes stays cached.
pub(super) async fn label_notes(
    docker: &Docker,
    tag: &str,
    notes: &[String],
    recipe: &EnvRecipe,
) -> Result<(), SandboxError> {
    let mut layer = Layer {
        steps: vec![(
            format!("FROM {tag}"),
            Origin::Harness("starting from the instance image"),
        )],
        pieces: Vec::new(),
        files: Vec::new(),
        labels: BTreeMap::from([(
            NOTES_LABEL.to_string(),
            serde_json::to_string(notes).expect("strings serialize"),
        )]),
    };
    layer.label();
    let labelled = build(docker, tag, layer, recipe).await.map(drop);
    if labelled.is_err() {
        let options = RemoveImageOptionsBuilder::new().force(true).build();
        if let Err(e) = docker.remove_image(tag, Some(options), None).await {
            debug!(image = %tag, error = %e, "cannot remove an image left without its notes");
        }
    }
    labelled
}

/// Builds `layer` as `tag`, streaming the output to the debug log. Returns the script pieces
/// that went back to the pip of the date cap ([`with_dated_pip_retry`]).
pub(super) async fn build(
    docker: &Docker,
    tag: &str,
    layer: Layer,
    recipe: &EnvRecipe,
) -> Result<Vec<Origin>, SandboxError> {
    let started = Instant::now();
    let context = layer.context()?;
    info!(image = %tag, repo = %recipe.repo, context_kb = context.len() >> 10, "building image");
    let options = BuildImageOptionsBuilder::new()
        .t(tag)
        .rm(true)
        .forcerm(true)
        .build();
    let docker = docker.clone().with_timeout(BUILD_REQUEST_TIMEOUT);
    let mut stream = docker.build_image(options, None, Some(bollard::body_full(context.into())));
    let mut out = BuildOutput {
        pieces: layer.pieces.iter().map(Origin::describe).collect(),
        ..BuildOutput::default()
    };
    let error = loop {
        match stream.next().await {
            Some(Ok(info)) => {
                if let Some(text) = info.stream {
                    out.push(&text, tag);
                }
            }
            Some(Err(bollard::errors::Error::DockerStreamError { error })) => {
                out.flush();
                let origin = layer.origin(out.step, out.piece);
                break failure(tag, &layer, &out, origin, &error);
            }
            Some(Err(e)) => {
                out.flush();
                let mut msg = super::engine_error(&format!("building {tag}"), e).to_string();
                msg.push_str(&quote(&out));
                break SandboxError::Infra(msg);
            }
            None => {
                out.flush();
                info!(image = %tag, secs = started.elapsed().as_secs_f64(), "image built");
                let retried = out.dated_pip.iter().filter_map(|p| layer.pieces.get(*p));
                return Ok(retried.cloned().collect());
            }
        }
    };
    drop(stream);
    remove_intermediates(&docker, &out.images).await;
    Err(error)
}

/// Removes the images of the steps a failed build completed: untagged, nothing else would ever
/// remove them. Step 1 is the parent layer itself and stays. The engine refuses (harmlessly)
/// images that another image or a running build still builds on.
async fn remove_intermediates(docker: &Docker, images: &[(usize, String)]) {
    let options = RemoveImageOptionsBuilder::new()
        .force(false)
        .noprune(false)
        .build();
    for (_, id) in images.iter().rev().filter(|(step, _)| *step > 1) {
        match docker.remove_image(id, Some(options.clone()), None).await {
            Ok(_) => debug!(image = %id, "removed image of a failed build's step"),
            Err(e) => debug!(image = %id, error = %e, "kept image of a failed build's step"),
        }
    }
}

/// Build output as it streams: complete lines, the current step, the failing step's lines.
#[derive(Debug, Default)]
struct BuildOutput {
    partial: String,
    /// Last lines of the whole build (quoted in errors).
    tail: VecDeque<String>,
    /// Lines of the current step (searched for network failures).
    step_lines: VecDeque<String>,
    /// 1-based step number the engine is at.
    step: Option<usize>,
    /// Script piece the current step announced last.
    piece: Option<usize>,
    /// Images the steps made (step number, image id), in order.
    images: Vec<(usize, String)>,
    /// What each script piece is (shown in place of its mark).
    pieces: Vec<String>,
    /// Script pieces that printed [`DATED_PIP_MARK`].
    dated_pip: Vec<usize>,
}

impl BuildOutput {
    fn push(&mut self, text: &str, tag: &str) {
        self.partial.push_str(text);
        while let Some(nl) = self.partial.find('\n') {
            let line: String = self.partial.drain(..=nl).collect();
            self.line(line.trim_end().to_string(), tag);
        }
    }

    fn flush(&mut self) {
        if !self.partial.is_empty() {
            let line = std::mem::take(&mut self.partial);
            self.line(line.trim_end().to_string(), "");
        }
    }

    fn line(&mut self, line: String, tag: &str) {
        let mut marks = false;
        if let Some(n) = parse_step(&line) {
            self.step = Some(n);
            self.piece = None;
            self.step_lines.clear();
            info!(image = %tag, "{line}");
        } else if let Some(p) = line
            .strip_prefix(PIECE_MARK)
            .and_then(|p| p.trim().parse().ok())
        {
            self.piece = Some(p);
            self.step_lines.clear();
            marks = true;
            if let Some(what) = self.pieces.get(p) {
                push_capped(
                    &mut self.tail,
                    format!("[reprobench: {what}]"),
                    QUOTED_LINES,
                );
                return;
            }
        } else {
            if line == DATED_PIP_MARK
                && let Some(p) = self.piece
                && !self.dated_pip.contains(&p)
            {
                self.dated_pip.push(p);
            }
            if let (Some(step), Some(id)) = (self.step, step_image(&line)) {
                self.images.push((step, id.to_string()));
            }
            debug!(image = %tag, "{line}");
        }
        if !marks {
            push_capped(&mut self.step_lines, line.clone(), KEPT_LINES);
        }
        push_capped(&mut self.tail, line, QUOTED_LINES);
    }
}

/// Appends a line, dropping the oldest beyond `cap` lines and cutting it at [`LINE_CHARS`].
fn push_capped(buf: &mut VecDeque<String>, mut line: String, cap: usize) {
    if let Some((cut, _)) = line.char_indices().nth(LINE_CHARS) {
        line.truncate(cut);
        line.push('…');
    }
    if buf.len() == cap {
        buf.pop_front();
    }
    buf.push_back(line);
}

/// ` ---> 0123456789ab` → the image a step made (not ` ---> Running in …` or ` ---> Using cache`).
fn step_image(line: &str) -> Option<&str> {
    let id = line.trim().strip_prefix("---> ")?.trim();
    (id.len() >= 12 && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
}

/// `Step 3/7 : RUN …` → 3.
fn parse_step(line: &str) -> Option<usize> {
    let rest = line.strip_prefix("Step ")?;
    let (n, rest) = rest.split_once('/')?;
    rest.split_once(" : ")?;
    n.parse().ok()
}

/// Whose fault a failed build is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Blame {
    /// The machinery (engine, disk, network): retry elsewhere.
    Infra,
    /// The recipe's own commands: final.
    Recipe,
}

/// Signs in pip's (or curl's, git's) output that the network, not the recipe, failed.
const NETWORK_SIGNS: &[&str] = &[
    "Retrying (Retry(",
    "NewConnectionError",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "ProxyError",
    "SSLError",
    "CERTIFICATE_VERIFY_FAILED",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "Connection refused",
    "Connection reset by peer",
    "Could not fetch URL",
    "Read timed out",
    "Could not resolve host",
];

/// Blames a build failure: the harness's steps and a full disk are infrastructure; the recipe's
/// steps are the recipe's unless their output shows a network failure (pip needs the network).
pub(super) fn blame(origin: Option<&Origin>, step_lines: &[&str], error: &str) -> Blame {
    let no_space =
        |s: &str| s.contains("no space left on device") || s.contains("No space left on device");
    if no_space(error) || step_lines.iter().any(|l| no_space(l)) || !command_failed(error) {
        return Blame::Infra;
    }
    match origin {
        None | Some(Origin::Harness(_)) => Blame::Infra,
        Some(_) => {
            if step_lines
                .iter()
                .any(|l| NETWORK_SIGNS.iter().any(|s| l.contains(s)))
            {
                Blame::Infra
            } else {
                Blame::Recipe
            }
        }
    }
}

fn quote(out: &BuildOutput) -> String {
    if out.tail.is_empty() {
        return String::new();
    }
    let lines: Vec<&str> = out.tail.iter().map(String::as_str).collect();
    format!(
        "\n--- last {} lines of the build output ---\n{}",
        lines.len(),
        lines.join("\n")
    )
}

/// The engine's words for a step whose command ran and exited non-zero (the classic builder's).
const COMMAND_EXITED: &str = "returned a non-zero code";

/// Whether a build's error says the step's command ran and failed; any other error is the
/// engine's (it could not create or start the step's container, say), and the command's output
/// says nothing of the recipe.
fn command_failed(error: &str) -> bool {
    error.contains(COMMAND_EXITED)
}

fn failure(
    tag: &str,
    layer: &Layer,
    out: &BuildOutput,
    origin: Option<&Origin>,
    error: &str,
) -> SandboxError {
    let step_lines: Vec<&str> = out.step_lines.iter().map(String::as_str).collect();
    let at = match (out.step, origin) {
        (Some(n), Some(o)) => format!(" at step {n}/{} ({})", layer.steps.len(), o.describe()),
        _ => String::new(),
    };
    // The engine quotes the whole script; the exit status is what matters.
    let ran = command_failed(error);
    let error = match error.rfind(COMMAND_EXITED) {
        Some(i) => format!("the command {}", &error[i..]),
        None => error.trim().to_string(),
    };
    let head = format!("building {tag}{at} failed: {error}");
    match blame(origin, &step_lines, &error) {
        Blame::Recipe => SandboxError::BadInput(format!(
            "{head}; fix the instance's environment (packages, pre_install, install) or leave the \
             instance out{}",
            quote(out)
        )),
        Blame::Infra => {
            let hint = match origin {
                _ if !ran => {
                    "the engine could not run the step, so its commands did not run: check the \
                     engine (`docker info`, its default bridge network `docker network inspect \
                     bridge`, its disk), then retry"
                }
                Some(Origin::Harness(_)) => {
                    "the base image may lack what the harness needs: rebuild it with `reprobench \
                     images bootstrap --force` (or check the engine)"
                }
                _ => {
                    "check the network (pip needs PyPI), the disk space and the engine, then retry"
                }
            };
            SandboxError::Infra(format!("{head}; {hint}{}", quote(out)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recipe() -> EnvRecipe {
        EnvRecipe {
            repo: "o/n".into(),
            mirror: "/m".into(),
            base_commit: "abc".into(),
            python: "3.11".into(),
            packages: vec!["pytest>=7,<9".into()],
            pre_install: vec!["echo \"pre\" && touch x\nmore".into()],
            install: "pip install -e .".into(),
            ..Default::default()
        }
    }

    fn run_argv(layer: &Layer) -> Vec<String> {
        let (run, _) = layer
            .steps
            .iter()
            .find(|(i, _)| i.starts_with("RUN "))
            .unwrap();
        serde_json::from_str(&run["RUN ".len()..]).unwrap()
    }

    #[test]
    fn layers_have_one_instruction_per_line_and_few_steps() {
        let r = recipe();
        let env = env_layer("base:1", &r, Some(b"CA".to_vec()), "python3");
        let text = env.dockerfile();
        let instructions: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(instructions.len(), env.steps.len());
        assert_eq!(instructions[0], "FROM base:1");
        assert_eq!(env.steps.len(), 5, "{text}");
        assert_eq!(
            instructions[4],
            format!(
                r#"LABEL reprobench.key="{}" reprobench.layer="env" reprobench.parent="base:1""#,
                r.env_key()
            )
        );
        assert!(text.contains(&format!("SSL_CERT_FILE={CA_PATH}")), "{text}");
        assert!(run_argv(&env)[2].contains("python -m pip install --no-cache-dir -r"));
        assert!(
            env.files
                .iter()
                .any(|(n, b)| n == "reprobench/requirements.txt" && b == b"pytest>=7,<9\n")
        );
        assert_eq!(env.labels[LAYER_LABEL], "env");
        assert_eq!(env.labels[PARENT_LABEL], "base:1");
        assert!(matches!(
            env.pieces[..],
            [Origin::Harness(_), Origin::Packages]
        ));

        let mut inst = instance_layer("reprobench/env:k", &r);
        inst.attach("repo.tar", b"tar".to_vec());
        let text = inst.dockerfile();
        assert_eq!(
            text.lines().filter(|l| !l.starts_with('#')).count(),
            inst.steps.len()
        );
        assert_eq!(inst.steps.len(), 5, "{text}");
        assert_eq!(inst.pieces.len(), 5);
        assert_eq!(inst.pieces[1], Origin::PreInstall(0));
        assert_eq!(inst.pieces[2], Origin::Install);
        assert!(
            matches!(inst.pieces[3], Origin::Harness(_)),
            "the editable-roots probe"
        );
        // Last, once every install command ran: the archive the executions unpack, and the
        // repository and the archive closed to the test's user.
        assert!(matches!(inst.pieces[4], Origin::Harness(_)));
        let archiving = run_argv(&inst)[2].clone();
        let last = &archiving[archiving.rfind("tar -C").expect("the archiving piece")..];
        assert!(last.contains(&format!("-cf {REPO_ARCHIVE} .")), "{last}");
        assert!(
            last.contains(&format!("chmod 700 \"$d\" {WORKDIR}")),
            "{last}"
        );
        assert!(inst.context().unwrap().len() > 1024);
    }

    #[test]
    fn a_layer_built_otherwise_gets_another_tag() {
        let r = recipe();
        let tag = |l: &Layer| l.tag("reprobench/env");
        let env = env_layer("base:1", &r, None, "python3");
        assert_eq!(tag(&env), tag(&env_layer("base:1", &r, None, "python3")));
        assert!(tag(&env).starts_with(&format!("reprobench/env:{}-", r.env_key())));
        // Same recipe, another parent, interpreter, CA bundle or script: another image.
        assert_ne!(tag(&env), tag(&env_layer("base:2", &r, None, "python3")));
        assert_ne!(tag(&env), tag(&env_layer("base:1", &r, None, "python3.9")));
        assert_ne!(
            tag(&env),
            tag(&env_layer("base:1", &r, Some(b"CA".to_vec()), "python3"))
        );
        let mut changed = env_layer("base:1", &r, None, "python3");
        changed.script(vec![(Origin::Harness("more"), "true".into())]);
        assert_ne!(tag(&env), tag(&changed));
        // The instance layer's tag is known before its repository archive is made.
        let mut inst = instance_layer("reprobench/env:k", &r);
        let before = inst.tag("reprobench/instance");
        inst.attach("repo.tar", b"tar".to_vec());
        assert_ne!(before, inst.tag("reprobench/instance"));
        assert_eq!(
            before,
            instance_layer("reprobench/env:k", &r).tag("reprobench/instance")
        );
    }

    #[test]
    fn label_values_are_quoted() {
        let mut l = Layer::new("b", "env", "k".into());
        l.labels
            .insert("reprobench.repo".into(), r#"a"b$c\d"#.into());
        l.label();
        let (last, _) = l.steps.last().unwrap();
        assert!(last.contains(r#"reprobench.repo="a\"b\$c\\d""#), "{last}");
    }

    #[test]
    fn no_packages_means_no_pip_and_no_ca_means_no_ca_env() {
        let mut r = recipe();
        r.packages.clear();
        let env = env_layer("b", &r, None, "python3");
        assert!(!env.pieces.contains(&Origin::Packages));
        assert!(!run_argv(&env)[2].contains("pip install"));
        assert!(!env.dockerfile().contains(CA_PATH));
    }

    #[test]
    fn script_pieces_run_in_order_and_the_failing_one_is_found() {
        let mut l = Layer::new("b", "instance", "k".into());
        l.script(vec![
            (Origin::Harness("first"), "echo one".into()),
            (
                Origin::PreInstall(0),
                format!("echo {} && exit 3", sh_quote("it's\n\"quoted\"")),
            ),
            (Origin::Install, "echo never".into()),
        ]);
        let argv = run_argv(&l);
        let out = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(3));
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(
            text.contains("one\n")
                && text.contains("it's\n\"quoted\"\n")
                && !text.contains("never"),
            "{text}"
        );
        let mut o = BuildOutput::default();
        o.push("Step 2/2 : RUN [...]\n", "t");
        o.push(&text, "t");
        o.flush();
        assert_eq!((o.step, o.piece), (Some(2), Some(1)));
        assert_eq!(l.origin(o.step, o.piece), Some(&Origin::PreInstall(0)));
        assert_eq!(o.step_lines, ["it's", "\"quoted\""]);
        assert_eq!(
            l.origin(Some(1), None),
            Some(&Origin::Harness("starting from the parent image"))
        );
        assert_eq!(l.origin(Some(9), None), None);
    }

    /// Runs `pieces` as a layer's script on the host, with a `python` on PATH that only records
    /// its arguments in `calls` (so "pip install" of the dated pip changes nothing), and parses
    /// the output as a build would. Returns the exit status and the pieces that retried.
    fn run_with_stub_python(
        pieces: Vec<(Origin, String)>,
        dir: &std::path::Path,
    ) -> (Option<i32>, Vec<Origin>, String) {
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let python = bin.join("python");
        std::fs::write(
            &python,
            format!("#!/bin/sh\necho \"$*\" >> {}/calls\n", dir.display()),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut l = Layer::new("b", "instance", "k".into());
        l.script(pieces);
        let argv = run_argv(&l);
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let out = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .env("PATH", path)
            .env("TMPDIR", dir)
            .output()
            .unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let mut o = BuildOutput::default();
        o.push("Step 2/2 : RUN [...]\n", "t");
        o.push(&text, "t");
        o.flush();
        let retried = o.dated_pip.iter().map(|p| l.pieces[*p].clone()).collect();
        (out.status.code(), retried, text)
    }

    #[test]
    fn an_install_the_date_caps_pip_refuses_runs_again_with_the_dated_pip() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        // Refused once as pip 26 refuses a backend without PEP 660's hook, then installs; in a
        // subshell, as the instance layer's commands are (`((` would be arithmetic to bash).
        let refused_once = format!(
            "(if [ -e {d}/tried ]; then echo installed >> {d}/installs; exit 0; fi; touch {d}/tried; \
             echo \"ERROR: Project file:///testbed has a 'pyproject.toml' and its build backend is {NO_BUILD_EDITABLE}.\"; exit 1)"
        );
        let pieces = vec![
            (Origin::Harness("git"), "true".into()),
            (Origin::PreInstall(0), with_dated_pip_retry("echo pre")),
            (Origin::Install, with_dated_pip_retry(&refused_once)),
            (Origin::Harness("after"), format!("touch {d}/after")),
        ];
        let (code, retried, text) = run_with_stub_python(pieces, dir.path());
        assert_eq!(code, Some(0), "{text}");
        assert_eq!(retried, [Origin::Install], "{text}");
        let calls = std::fs::read_to_string(dir.path().join("calls")).unwrap();
        assert_eq!(
            calls,
            format!("-m pip install --no-cache-dir {}\n", DATED_PIP.join(" "))
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("installs")).unwrap(),
            "installed\n"
        );
        assert!(dir.path().join("after").exists() && text.contains(NO_BUILD_EDITABLE));
        assert!(!dir.path().join("reprobench-install.log").exists());

        // Any other failure keeps its status, and pip is left alone.
        let dir = tempfile::tempdir().unwrap();
        let pieces = vec![(
            Origin::Install,
            with_dated_pip_retry("echo other error; exit 7"),
        )];
        let (code, retried, _) = run_with_stub_python(pieces, dir.path());
        assert_eq!((code, retried), (Some(7), vec![]));
        assert!(!dir.path().join("calls").exists());

        // The reports name the command that went back to the dated pip.
        let mut r = recipe();
        r.packages_as_of = Some("2025-02-28T00:00:00Z".into());
        let notes = dated_pip_notes(&r, &[Origin::Install]);
        assert_eq!(
            notes,
            [dated_pip_install_note(
                "2025-02-28T00:00:00Z",
                "pip install -e ."
            )]
        );
        assert!(notes[0].contains("the pip of 2025-02-28:"), "{notes:?}");
        assert!(dated_pip_notes(&r, &[Origin::Packages]).is_empty());
    }

    #[test]
    fn only_a_date_capped_install_retries_with_the_dated_pip() {
        let retries =
            |r: &EnvRecipe| run_argv(&instance_layer("env:1", r))[2].contains(DATED_PIP_MARK);
        let mut r = recipe();
        assert!(!retries(&r), "no date cap: pip is not pip 26");
        r.packages_as_of = Some("2025-02-28T00:00:00Z".into());
        assert!(retries(&r));
        r.dated_pip_for_install = true;
        assert!(!retries(&r), "the dated pip from the start");
    }

    #[test]
    fn steps_are_parsed() {
        assert_eq!(parse_step("Step 3/7 : RUN x"), Some(3));
        assert_eq!(parse_step("Step 12/12 : LABEL a=b"), Some(12));
        assert_eq!(parse_step(" ---> Running in abc"), None);
        assert_eq!(parse_step("Step by step"), None);
        assert_eq!(step_image(" ---> 0123456789ab"), Some("0123456789ab"));
        assert_eq!(step_image(" ---> Running in 0123456789ab"), None);
        assert_eq!(step_image(" ---> Using cache"), None);
        let mut o = BuildOutput::default();
        o.push(
            "Step 1/3 : FROM x\n ---> aaaaaaaaaaaa\nStep 2/3 : ADD a b\n ---> Using cache\n",
            "t",
        );
        o.push(
            " ---> bbbbbbbbbbbb\nStep 3/3 : RUN x\n ---> Running in cccccccccccc\n",
            "t",
        );
        assert_eq!(o.images, [(1, "a".repeat(12)), (2, "b".repeat(12))]);
    }

    #[test]
    fn failures_are_blamed() {
        let err = "The command '/bin/sh -c pip install' returned a non-zero code: 1";
        let no_dist = ["ERROR: No matching distribution found for nosuchpkg"];
        assert_eq!(blame(Some(&Origin::Packages), &no_dist, err), Blame::Recipe);
        let net = [
            "WARNING: Retrying (Retry(total=4, connect=None)) after connection broken by 'NewConnectionError'",
            "ERROR: No matching distribution found for pytest",
        ];
        assert_eq!(blame(Some(&Origin::Packages), &net, err), Blame::Infra);
        assert_eq!(
            blame(Some(&Origin::Install), &["error: invalid syntax"], err),
            Blame::Recipe
        );
        assert_eq!(
            blame(Some(&Origin::PreInstall(0)), &["x"], err),
            Blame::Recipe
        );
        assert_eq!(
            blame(Some(&Origin::Harness("venv")), &["x"], err),
            Blame::Infra
        );
        assert_eq!(blame(None, &[], "unexpected EOF"), Blame::Infra);
        // The engine could not start the step's container: no command ran, the recipe is not
        // to blame whatever the step.
        let engine = "failed to create endpoint e on network bridge: adding interface v to \
                      bridge docker0 failed: could not find bridge docker0";
        assert_eq!(blame(Some(&Origin::Install), &["x"], engine), Blame::Infra);
        assert_eq!(blame(Some(&Origin::Packages), &[], engine), Blame::Infra);
        let full = ["write /x: no space left on device"];
        assert_eq!(blame(Some(&Origin::Install), &full, err), Blame::Infra);
    }

    #[test]
    fn output_is_split_into_lines_across_chunks() {
        let mut out = BuildOutput::default();
        out.push("Step 2/5 : RUN a\n", "t");
        out.push("partial ", "t");
        out.push("line\nnext", "t");
        out.flush();
        assert_eq!(out.step, Some(2));
        assert_eq!(out.step_lines, ["Step 2/5 : RUN a", "partial line", "next"]);
        for i in 0..100 {
            out.push(&format!("l{i}\n"), "t");
        }
        assert_eq!(out.tail.len(), QUOTED_LINES);
        assert_eq!(out.tail.back().unwrap(), "l99");
    }
}
