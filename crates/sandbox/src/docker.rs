//! Docker sandbox: images in three layers, one throwaway container per execution.
//!
//! Layers, each built locally through the engine's build API and never pulled:
//! - base ([`DockerConfig::base_image`]): an OS with Python, git and patch, made once by
//!   [`bootstrap_base_image`] (debootstrap + import, no registry needed);
//! - env (`reprobench/env:<EnvRecipe::env_key>-<content>`): a virtualenv at `/opt/venv` with the
//!   recipe's packages;
//! - instance (`reprobench/instance:<EnvRecipe::instance_key>-<content>`): the repository at the
//!   base commit at [`WORKDIR`], as a git repository, with its install commands run, then
//!   archived in [`REPO_ARCHIVE`] and both closed to all but root.
//!
//! An execution runs in a container with no network, CPU/memory/pids limits (refused limits fail
//! it), a read-only root filesystem, all capabilities dropped but the few its root script needs,
//! and no new privileges: the inputs come in on its standard input, the tree is prepared out of
//! the command's sight and sealed ([`crate::stage`]) into a size-limited tmpfs at `/work`, the
//! command runs as an unprivileged user, and the container is removed afterwards whatever
//! happens (in the background once it has stopped and its output is in). A sandbox that connects removes the containers that crashed nodes left behind.
//!
//! Images are tagged by the recipe's key and a hash of the layer's Dockerfile (its parent, script
//! and labels) and small context files, so a tag that exists is up to date, also after
//! reprobench changes how a layer is built. Their last use is kept
//! in a small JSON file in [`DockerConfig::cache_dir`]; when reprobench's images outgrow the
//! disk budget the least recently used go first ([`plan_eviction`]).

use super::python::{find_python_where, has_own_prefix, version_matches};
use super::{EnvRecipe, ExecOutput, ExecRequest, Prepared, Sandbox, SandboxError};
use crate::BoxFuture;
use crate::ExecutorKind;
use bollard::Docker;
use bollard::query_parameters::{ListImagesOptionsBuilder, RemoveImageOptionsBuilder};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};
use tracing::{debug, info, warn};

mod bootstrap;
mod build;
mod run;
pub mod usage;

pub use bootstrap::{BootstrapOptions, bootstrap_base_image};

/// Builds reprobench's own image, `tag`, from the running binary over `base` (the base image of
/// the docker executor, which has Python and git), with no registry; skips when `tag` already
/// holds this very binary (its key label) unless `force`. Returns the tag.
pub async fn build_self_image(base: &str, tag: &str, force: bool) -> Result<String, SandboxError> {
    let docker = connect_engine().await?;
    let exe = std::env::current_exe()
        .map_err(|e| SandboxError::Infra(format!("cannot find the running binary: {e}")))?;
    let binary = std::fs::read(&exe)
        .map_err(|e| SandboxError::Infra(format!("cannot read {}: {e}", exe.display())))?;
    let layer = build::self_layer(base, binary, env!("CARGO_PKG_VERSION"));
    if let Some(existing) = find_image(&docker, tag).await? {
        let key = existing
            .config
            .as_ref()
            .and_then(|c| c.labels.as_ref())
            .and_then(|l| l.get(KEY_LABEL));
        if !force && key.map(String::as_str) == Some(layer.key()) {
            eprintln!(
                "images self: {tag} holds this binary; nothing to do (pass --force to rebuild it)"
            );
            return Ok(tag.to_string());
        }
        if !force {
            eprintln!("images self: {tag} holds another build of reprobench; rebuilding it");
        }
    }
    if find_image(&docker, base).await?.is_none() {
        return Err(SandboxError::Infra(format!(
            "the base image {base} is not in the engine: build it with `reprobench images bootstrap` (or pass --base IMAGE)"
        )));
    }
    let recipe = EnvRecipe {
        repo: "reprobench".into(),
        ..EnvRecipe::default()
    };
    build::build(&docker, tag, layer, &recipe).await?;
    Ok(tag.to_string())
}

/// Where the repository sits in instance images, where their install commands ran; closed to
/// the command (mode 700): the tree as it was before the patches would tell them apart.
pub const WORKDIR: &str = "/testbed";
/// The repository's archive in instance images, made once its install commands ran, root's
/// alone: each execution's container unpacks it into its stage, one file read through the
/// storage driver instead of every file of the tree.
pub const REPO_ARCHIVE: &str = "/var/lib/reprobench/repo.tar";

/// The shell command with which a container's boot gives root's stage the repository: the
/// image's archive ([`REPO_ARCHIVE`]) unpacked into `/stage/repo`, owners, modes and times kept.
pub fn unpack_into_stage() -> String {
    format!("mkdir /stage/repo && tar -C /stage/repo -xpf {REPO_ARCHIVE}")
}
/// Base image used when none is configured; `reprobench images bootstrap` builds it.
pub const DEFAULT_BASE_IMAGE: &str = "reprobench/python-base:bookworm-2";
/// Label every reprobench container carries (value `docker`), to find leftovers.
pub const CONTAINER_LABEL: &str = "reprobench.sandbox";
/// Label on reprobench images naming their layer (`base`, `env` or `instance`).
pub const LAYER_LABEL: &str = "reprobench.layer";

/// Repository of environment layer images.
const ENV_REPO: &str = "reprobench/env";
/// Repository of instance layer images.
const INSTANCE_REPO: &str = "reprobench/instance";
/// Repository of python layers (a host interpreter over the base image).
const PYTHON_REPO: &str = "reprobench/python";
/// Label with the content key an image was built from.
const KEY_LABEL: &str = "reprobench.key";
/// Label naming the image a layer was built on (for its own size and eviction order).
const PARENT_LABEL: &str = "reprobench.parent";
/// File in the cache directory with the last use of each image.
const USAGE_FILE: &str = "docker-images.json";
/// Host CA bundle handed to builds, so pip works behind a TLS-intercepting proxy.
const HOST_CA_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// One lock per image tag, shared by every sandbox of the process, so concurrent prepares build
/// each layer once.
static BUILD_LOCKS: LazyLock<Mutex<BuildLocks>> = LazyLock::new(Mutex::default);
type BuildLocks = HashMap<String, Arc<tokio::sync::Mutex<()>>>;

fn build_lock(tag: &str) -> Arc<tokio::sync::Mutex<()>> {
    let mut locks = crate::lock(&BUILD_LOCKS);
    locks.entry(tag.to_string()).or_default().clone()
}

/// Forgets locks nobody holds or waits for, so the map does not grow with every recipe.
fn drop_idle_locks() {
    let mut locks = crate::lock(&BUILD_LOCKS);
    locks.retain(|_, l| Arc::strong_count(l) > 1);
}

/// Configuration of the Docker sandbox.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DockerConfig {
    /// Image the environment layers are built on; must exist locally and have the wanted Python.
    pub base_image: String,
    /// Directory for the image usage file (and bootstrap work files).
    pub cache_dir: PathBuf,
    /// Bytes reprobench's env and instance images may use before the least recently used go.
    pub disk_budget_bytes: u64,
    /// Boot the container of an announced next execution ([`Sandbox::exec_ahead`]), and make
    /// its copy of the repository, while an execution of the same image and limits runs, off
    /// the next one's critical path.
    #[serde(default = "boot_ahead_default")]
    pub boot_ahead: bool,
}

fn boot_ahead_default() -> bool {
    true
}

impl Default for DockerConfig {
    fn default() -> Self {
        DockerConfig {
            base_image: DEFAULT_BASE_IMAGE.into(),
            cache_dir: default_cache_dir(),
            disk_budget_bytes: 20 << 30,
            boot_ahead: true,
        }
    }
}

/// `$XDG_CACHE_HOME/reprobench`, else `~/.cache/reprobench` (else a directory under the temp dir).
pub fn default_cache_dir() -> PathBuf {
    let nonempty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(x) = nonempty("XDG_CACHE_HOME") {
        return PathBuf::from(x).join("reprobench");
    }
    if let Some(h) = nonempty("HOME") {
        return PathBuf::from(h).join(".cache").join("reprobench");
    }
    std::env::temp_dir().join("reprobench-cache")
}

/// Connects to the local engine (or `DOCKER_HOST`) and settles on an API version both speak.
pub(crate) async fn connect_engine() -> Result<Docker, SandboxError> {
    let unreachable = |e: bollard::errors::Error| {
        SandboxError::Infra(format!(
            "cannot reach the Docker engine ({e}): start Docker (e.g. `systemctl start docker`) \
             or use the process executor (`--slots process=N`)"
        ))
    };
    let docker = Docker::connect_with_defaults().map_err(unreachable)?;
    // The client speaks a newer API than old engines (20.10 speaks 1.41): step down to theirs.
    let docker = docker.negotiate_version().await.map_err(unreachable)?;
    debug!(api = %docker.client_version(), "connected to the Docker engine");
    Ok(docker)
}

/// Looks an image up; `Ok(None)` when the engine does not have it.
pub(crate) async fn find_image(
    docker: &Docker,
    image: &str,
) -> Result<Option<bollard::models::ImageInspect>, SandboxError> {
    match docker.inspect_image(image).await {
        Ok(i) => Ok(Some(i)),
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => Ok(None),
        Err(e) => Err(engine_error(&format!("inspecting image {image}"), e)),
    }
}

/// Errors with `Infra` (saying how to make it) unless the base image is in the engine.
async fn require_base(docker: &Docker, base: &str) -> Result<(), SandboxError> {
    match find_image(docker, base).await? {
        Some(_) => Ok(()),
        None => Err(SandboxError::Infra(format!(
            "base image {base} is not in the local Docker engine: run `reprobench images \
             bootstrap` (or pass an existing base image)"
        ))),
    }
}

/// An engine call that failed: the machinery's fault, retry elsewhere.
pub(crate) fn engine_error(what: &str, e: bollard::errors::Error) -> SandboxError {
    SandboxError::Infra(format!(
        "Docker engine error while {what}: {e} (check `docker info` and the engine's log)"
    ))
}

/// The Docker sandbox.
#[derive(Clone)]
pub struct DockerSandbox {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for DockerSandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerSandbox")
            .field("cfg", &self.inner.cfg)
            .finish_non_exhaustive()
    }
}

struct Inner {
    docker: Docker,
    cfg: DockerConfig,
    /// Python major.minor of the base image, asked once.
    base_python: tokio::sync::OnceCell<String>,
    /// Last use (unix seconds) of each image, mirrored in the usage file.
    usage: Mutex<HashMap<String, u64>>,
    /// One eviction at a time.
    evicting: tokio::sync::Mutex<()>,
    /// Limits the engine said it does not enforce, warned about once each.
    limit_warnings: run::LimitWarnings,
    /// Containers of finished executions being removed in the background.
    removals: run::Removals,
    /// Containers booted ahead of the executions that will take them.
    ahead: run::Ahead,
    /// The host interpreter found for each (Python version, standalone), so that a prepare
    /// probes the host's interpreters (a process each, pyenv's shims among them) once, not on
    /// every instance.
    host_pythons: Mutex<HashMap<(String, bool), crate::python::Interpreter>>,
    /// What each instance image's build showed of its departures (`build::notes_of`), by tag,
    /// for [`Sandbox::prepared_notes`].
    prepared_notes: Mutex<HashMap<String, Vec<String>>>,
}

impl DockerSandbox {
    /// Connects to the local Docker engine. `stage_ahead` says when the container booted ahead
    /// for an announced execution ([`Sandbox::exec_ahead`]) is also given its input, so it
    /// stages the tree (files, patches, seal, unpacking) before the execution takes it (needs
    /// `cfg.boot_ahead`; the node's `--stage-ahead`, which serves the process sandbox too).
    /// Errors with `Infra` when the engine cannot be reached.
    pub async fn connect(
        cfg: DockerConfig,
        stage_ahead: crate::StageAheadMode,
    ) -> Result<DockerSandbox, SandboxError> {
        let docker = connect_engine().await?;
        run::remove_leftovers(&docker).await;
        let usage = load_usage(&cfg.cache_dir.join(USAGE_FILE));
        let ahead = run::Ahead::new(cfg.boot_ahead, stage_ahead);
        Ok(DockerSandbox {
            inner: Arc::new(Inner {
                docker,
                cfg,
                base_python: tokio::sync::OnceCell::new(),
                usage: Mutex::new(usage),
                evicting: tokio::sync::Mutex::default(),
                limit_warnings: run::LimitWarnings::default(),
                removals: run::Removals::default(),
                ahead,
                host_pythons: Mutex::default(),
                prepared_notes: Mutex::default(),
            }),
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> &DockerConfig {
        &self.inner.cfg
    }

    /// The engine connection (for tools and tests that inspect what the sandbox left behind).
    pub fn engine(&self) -> &Docker {
        &self.inner.docker
    }

    /// Removes the containers booted ahead and waits until those of finished executions,
    /// removed in the background, are gone: the sandbox leaves nothing behind.
    pub async fn settle(&self) {
        Sandbox::settle(self).await
    }

    /// Execution containers booted ahead: (ready for an execution, being booted).
    pub fn booted_ahead(&self) -> (usize, usize) {
        self.inner.ahead.count()
    }

    /// How many containers of the node's next task wait for an idle core before they boot.
    pub fn waiting_for_idle_core(&self) -> usize {
        self.inner.ahead.waiting_for_idle()
    }

    /// How many of the containers booted ahead staged an announced execution's tree.
    pub fn staged_ahead(&self) -> usize {
        self.inner.ahead.staged()
    }

    /// Python major.minor of the base image (asked once by running it).
    pub async fn base_python(&self) -> Result<String, SandboxError> {
        self.inner.base_python().await
    }

    /// reprobench's env and instance images as eviction sees them (sizes, last use, in use).
    pub async fn cached_images(&self) -> Result<Vec<CachedImage>, SandboxError> {
        self.inner.cached_images().await
    }

    /// Removes least recently used env and instance images until they fit the disk budget.
    pub async fn enforce_budget(&self) {
        self.inner.enforce_budget().await
    }
}

impl Sandbox for DockerSandbox {
    fn kind(&self) -> ExecutorKind {
        ExecutorKind::Docker
    }

    fn identity(&self) -> String {
        format!("docker on {}", self.inner.cfg.base_image)
    }

    fn prepared_notes(&self, prepared: &Prepared) -> Vec<String> {
        let Prepared::Image(tag) = prepared else {
            return Vec::new();
        };
        let notes = crate::lock(&self.inner.prepared_notes);
        notes.get(tag).cloned().unwrap_or_default()
    }

    fn prepare(&self, recipe: &EnvRecipe) -> BoxFuture<Result<Prepared, SandboxError>> {
        let inner = self.inner.clone();
        let recipe = recipe.clone();
        Box::pin(async move { inner.prepare(recipe, Missing::Build).await })
    }

    fn find_prepared(&self, recipe: &EnvRecipe) -> BoxFuture<Option<Prepared>> {
        let inner = self.inner.clone();
        let recipe = recipe.clone();
        Box::pin(async move { inner.prepare(recipe, Missing::Refuse).await.ok() })
    }

    fn exec_ahead(&self, prepared: &Prepared, req: &ExecRequest) {
        if let Prepared::Image(image) = prepared {
            self.inner.ahead.announce(image, req, false);
        }
    }

    fn exec_next_task_ahead(&self, prepared: &Prepared, req: &ExecRequest) {
        if let Prepared::Image(image) = prepared {
            self.inner.ahead.announce(image, req, true);
        }
    }

    fn exec(
        &self,
        prepared: &Prepared,
        req: ExecRequest,
    ) -> BoxFuture<Result<ExecOutput, SandboxError>> {
        let inner = self.inner.clone();
        let prepared = prepared.clone();
        Box::pin(async move { inner.exec(prepared, req).await })
    }

    fn settle(&self) -> BoxFuture<()> {
        let inner = self.inner.clone();
        Box::pin(async move { inner.settle().await })
    }
}

/// What [`Inner::prepare`] does with a layer (or a resolution) that is not there yet.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Missing {
    /// Builds it.
    Build,
    /// Fails (with [`not_built`]): only what is there already is found.
    Refuse,
}

/// The error of a find-only prepare ([`Missing::Refuse`]) that met something not built.
fn not_built(what: &str) -> SandboxError {
    SandboxError::Infra(format!("{what} is not built yet"))
}

impl Inner {
    async fn prepare(
        self: Arc<Self>,
        mut recipe: EnvRecipe,
        missing: Missing,
    ) -> Result<Prepared, SandboxError> {
        let (base, python) = self.python_base(&recipe, missing).await?;
        if let Some(date) = recipe.conda_packages_as_of.clone()
            && !recipe.packages.is_empty()
        {
            // Resolved on the host (the image's pip is too old to cap dates); the pins go into
            // the env layer's requirements, so they are part of its tag.
            let (cache, packages, version) = (
                self.cfg.cache_dir.clone(),
                recipe.packages.clone(),
                recipe.python.clone(),
            );
            recipe.packages = match missing {
                Missing::Refuse => {
                    super::resolve::resolved_before(&cache, &packages, &version, &date)
                        .ok_or_else(|| not_built("the resolution of the conda packages"))?
                }
                Missing::Build => tokio::task::spawn_blocking(move || {
                    super::resolve::resolve_as_of(&cache, &packages, &version, &date)
                })
                .await
                .map_err(|e| SandboxError::Infra(format!("resolver task: {e}")))??,
            };
        }

        let env_layer = build::env_layer(&base, &recipe, read_host_ca(), &python);
        let env_tag = env_layer.tag(ENV_REPO);
        let mut instance_layer = build::instance_layer(&env_tag, &recipe);
        let instance_tag = instance_layer.tag(INSTANCE_REPO);
        let _pins = Pins::new(&[&env_tag, &instance_tag]);

        let mut built = false;
        {
            let lock = build_lock(&env_tag);
            let _held = lock.lock().await;
            if find_image(&self.docker, &env_tag).await?.is_none() {
                if missing == Missing::Refuse {
                    return Err(not_built("the environment layer"));
                }
                build::build(&self.docker, &env_tag, env_layer, &recipe).await?;
                built = true;
            }
        }
        let notes = {
            let lock = build_lock(&instance_tag);
            let _held = lock.lock().await;
            match find_image(&self.docker, &instance_tag).await? {
                Some(image) => build::notes_of(&image),
                None if missing == Missing::Refuse => {
                    return Err(not_built("the instance layer"));
                }
                None => {
                    instance_layer.attach("repo.tar", archive_commit(&recipe).await?);
                    let retried =
                        build::build(&self.docker, &instance_tag, instance_layer, &recipe).await?;
                    built = true;
                    let notes = build::dated_pip_notes(&recipe, &retried);
                    if !notes.is_empty() {
                        build::label_notes(&self.docker, &instance_tag, &notes, &recipe).await?;
                    }
                    notes
                }
            }
        };
        if !notes.is_empty() {
            crate::lock(&self.prepared_notes).insert(instance_tag.clone(), notes);
        }
        drop_idle_locks();
        self.touch(&[&env_tag, &instance_tag]);
        if built {
            self.enforce_budget().await;
        }
        Ok(Prepared::Image(instance_tag))
    }

    async fn exec(
        self: Arc<Self>,
        prepared: Prepared,
        req: ExecRequest,
    ) -> Result<ExecOutput, SandboxError> {
        let Prepared::Image(image) = prepared else {
            return Err(SandboxError::BadInput(
                "the docker sandbox was handed a checkout prepared by the process sandbox: \
                 prepare the recipe with the docker sandbox"
                    .into(),
            ));
        };
        let _pins = Pins::new(&[&image]);
        self.touch(&[&image]);
        run::exec(
            &self.docker,
            &image,
            req,
            &self.limit_warnings,
            &self.removals,
            &self.ahead,
        )
        .await
    }

    /// The image the env layer starts from and the interpreter it makes the venv with: the base
    /// image when its Python is the one wanted, else a python layer over it holding a host
    /// interpreter of that version (pyenv's, say), built once.
    async fn python_base(
        &self,
        recipe: &EnvRecipe,
        missing: Missing,
    ) -> Result<(String, String), SandboxError> {
        let base = self.cfg.base_image.clone();
        // Checked on every prepare, not only by the cached base_python: it may have been removed.
        require_base(&self.docker, &base).await?;
        // Learning the base image's Python runs a container: not for a find-only prepare.
        let have = match (missing, self.base_python.get()) {
            (Missing::Refuse, None) => return Err(not_built("the base image's Python version")),
            _ => self.base_python().await?,
        };
        let have_mm: String = have.split('.').take(2).collect::<Vec<_>>().join(".");
        let want = recipe.python.trim();
        // A standalone environment copies an interpreter's own prefix: never the image's /usr.
        if !recipe.standalone && (want.is_empty() || version_matches(want, &have_mm)) {
            return Ok((base, "python3".into()));
        }
        let (w, cache) = (want.to_string(), self.cfg.cache_dir.clone());
        let standalone = recipe.standalone;
        let found = crate::lock(&self.host_pythons)
            .get(&(w.clone(), standalone))
            .cloned();
        let no_python = |_: SandboxError| {
            if standalone {
                SandboxError::BadInput(format!(
                    "this instance's tests run under `tox --current-env`, which needs a standalone Python {want} with a prefix of its own (not a virtualenv, not the system's /usr) to copy into the image; install one with `pyenv install {want}`"
                ))
            } else {
                SandboxError::BadInput(format!(
                    "the instance wants Python {want}; base image {base} has Python {have} and this machine has no Python {want} to copy into an image (looked on PATH, in /usr/local/bin, /usr/bin and pyenv's versions): install it (e.g. `pyenv install {want}`), or make a base image with it (`reprobench images bootstrap --suite SUITE --tag TAG` from a Debian suite that ships it) and pass --base-image TAG"
                ))
            }
        };
        let host = match found {
            Some(host) => host,
            None => {
                let host = tokio::task::spawn_blocking(move || {
                    find_python_where(&w, false, &cache, |p| !standalone || has_own_prefix(p))
                })
                .await
                .map_err(|e| SandboxError::Infra(format!("interpreter search task: {e}")))?
                .map_err(no_python)?;
                crate::lock(&self.host_pythons)
                    .insert((want.to_string(), standalone), host.clone());
                host
            }
        };
        let key = reprobench_domain::swt::env_key(
            &format!("python-layer-v1 {base} {}", host.prefix.display()),
            std::slice::from_ref(&host.version),
        );
        let exe = host.exe.display().to_string();
        let mut layer = build::python_layer(
            &base,
            format!("{}-{key}", host.version),
            &exe,
            &host.version,
        );
        let tag = layer.tag(PYTHON_REPO);
        let lock = build_lock(&tag);
        let _held = lock.lock().await;
        if find_image(&self.docker, &tag).await?.is_none() {
            if missing == Missing::Refuse {
                return Err(not_built("the python layer"));
            }
            let prefix = host.prefix.clone();
            let tar = tokio::task::spawn_blocking(move || tar_prefix(&prefix))
                .await
                .map_err(|e| SandboxError::Infra(format!("interpreter archive task: {e}")))??;
            layer.attach("python.tar", tar);
            build::build(&self.docker, &tag, layer, recipe).await?;
        }
        Ok((tag, exe))
    }

    async fn base_python(&self) -> Result<String, SandboxError> {
        let base = &self.cfg.base_image;
        self.base_python
            .get_or_try_init(|| async {
                require_base(&self.docker, base).await?;
                run::python_version(&self.docker, base, &self.limit_warnings, &self.removals).await
            })
            .await
            .cloned()
    }

    /// Records a use of images now, in memory and in the usage file.
    fn touch(&self, tags: &[&str]) {
        let now = unix_now();
        let snapshot = {
            let mut usage = crate::lock(&self.usage);
            for t in tags {
                usage.insert(t.to_string(), now);
            }
            usage.clone()
        };
        // Recording use must never fail an execution: a lost update only shifts eviction order.
        if let Err(e) = save_usage(&self.cfg.cache_dir.join(USAGE_FILE), &snapshot) {
            warn!(error = %e, dir = %self.cfg.cache_dir.display(), "cannot record image use");
        }
    }

    async fn settle(&self) {
        self.ahead.drain(&self.removals).await;
        self.removals.settle().await;
    }

    async fn enforce_budget(&self) {
        let _one = self.evicting.lock().await;
        let images = match self.cached_images().await {
            Ok(i) => i,
            Err(e) => {
                warn!(error = %e, "cannot list reprobench images to enforce the disk budget");
                return;
            }
        };
        let plan = plan_eviction(&images, self.cfg.disk_budget_bytes);
        if plan.is_empty() {
            return;
        }
        // The engine refuses to remove an image a container still uses, a stopped one too.
        self.settle().await;
        let total: u64 = images.iter().map(|i| i.own_bytes).sum();
        info!(
            total_mb = total >> 20,
            budget_mb = self.cfg.disk_budget_bytes >> 20,
            removing = plan.len(),
            "reprobench images exceed the disk budget"
        );
        let options = RemoveImageOptionsBuilder::new()
            .force(false)
            .noprune(false)
            .build();
        for tag in &plan {
            // Without force the engine refuses images a container (even a stopped one) uses.
            match self
                .docker
                .remove_image(tag, Some(options.clone()), None)
                .await
            {
                Ok(_) => {
                    info!(image = %tag, "evicted image");
                    crate::lock(&self.usage).remove(tag);
                }
                Err(e) => warn!(image = %tag, error = %e, "cannot evict image"),
            }
        }
        let snapshot = crate::lock(&self.usage).clone();
        if let Err(e) = save_usage(&self.cfg.cache_dir.join(USAGE_FILE), &snapshot) {
            warn!(error = %e, "cannot record image use");
        }
    }

    /// reprobench's env and instance images, with the bytes each adds over its parent.
    async fn cached_images(&self) -> Result<Vec<CachedImage>, SandboxError> {
        let filters = HashMap::from([("label".to_string(), vec![LAYER_LABEL.to_string()])]);
        let options = ListImagesOptionsBuilder::new().filters(&filters).build();
        let listed = self
            .docker
            .list_images(Some(options))
            .await
            .map_err(|e| engine_error("listing images", e))?;
        let mut size_of: HashMap<String, u64> = HashMap::new();
        for s in &listed {
            for t in &s.repo_tags {
                size_of.insert(t.clone(), s.size.max(0) as u64);
            }
        }
        let usage = crate::lock(&self.usage).clone();
        let pins = crate::lock(&PINS).clone();
        let mut out = Vec::new();
        for s in listed {
            let kind = match s.labels.get(LAYER_LABEL).map(String::as_str) {
                Some("env") => LayerKind::Env,
                Some("instance") => LayerKind::Instance,
                _ => continue,
            };
            let repo = match kind {
                LayerKind::Env => ENV_REPO,
                LayerKind::Instance => INSTANCE_REPO,
            };
            let Some(tag) = s
                .repo_tags
                .iter()
                .find(|t| t.starts_with(&format!("{repo}:")))
            else {
                continue;
            };
            let parent = s.labels.get(PARENT_LABEL).cloned();
            let parent_size = match &parent {
                Some(p) => match size_of.get(p) {
                    Some(n) => *n,
                    None => find_image(&self.docker, p)
                        .await?
                        .and_then(|i| i.size)
                        .unwrap_or(0)
                        .max(0) as u64,
                },
                None => 0,
            };
            out.push(CachedImage {
                tag: tag.clone(),
                kind,
                own_bytes: (s.size.max(0) as u64).saturating_sub(parent_size),
                last_use: usage.get(tag).copied().unwrap_or(s.created.max(0) as u64),
                in_use: pins.get(tag).is_some_and(|n| *n > 0),
                parent: parent.filter(|_| kind == LayerKind::Instance),
            });
        }
        Ok(out)
    }
}

/// Images a running exec or prepare of any sandbox of the process needs: never evicted.
static PINS: LazyLock<Mutex<HashMap<String, usize>>> = LazyLock::new(Mutex::default);

/// Marks images as needed for as long as it lives.
struct Pins {
    tags: Vec<String>,
}

impl Pins {
    fn new(tags: &[&str]) -> Self {
        let mut pins = crate::lock(&PINS);
        for t in tags {
            *pins.entry(t.to_string()).or_default() += 1;
        }
        Pins {
            tags: tags.iter().map(|t| t.to_string()).collect(),
        }
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        let mut pins = crate::lock(&PINS);
        for t in &self.tags {
            if let Some(n) = pins.get_mut(t) {
                *n -= 1;
                if *n == 0 {
                    pins.remove(t);
                }
            }
        }
    }
}

/// Errors with `BadInput` unless the base image's Python has the major.minor the recipe wants.
/// An interpreter's prefix as a tar whose paths are its absolute paths without the leading `/`,
/// symbolic links kept.
fn tar_prefix(prefix: &std::path::Path) -> Result<Vec<u8>, SandboxError> {
    let mut tar = tar::Builder::new(Vec::new());
    tar.follow_symlinks(false);
    let inside = prefix.strip_prefix("/").unwrap_or(prefix);
    tar.append_dir_all(inside, prefix)
        .and_then(|_| tar.into_inner())
        .map_err(|e| {
            SandboxError::Infra(format!(
                "cannot archive the interpreter at {}: {e}",
                prefix.display()
            ))
        })
}

/// The repository at the base commit as a tar, from the bare mirror (see [`super::tree`]).
async fn archive_commit(recipe: &EnvRecipe) -> Result<Vec<u8>, SandboxError> {
    let (repo, commit, mirror) = (&recipe.repo, recipe.base_commit.trim(), &recipe.mirror);
    let missing = |why: &str| {
        SandboxError::BadInput(format!(
            "commit `{commit}` of {repo} {why} (mirror {}): run `reprobench datasets prepare` \
             (or fetch the commit into the mirror)",
            mirror.display()
        ))
    };
    if commit.is_empty() || commit.starts_with('-') || commit.contains(char::is_whitespace) {
        return Err(missing("is not a commit id"));
    }
    if !mirror.exists() {
        return Err(missing("cannot be read: the mirror does not exist"));
    }
    let git = |args: &[&str]| {
        let mut c = tokio::process::Command::new("git");
        // Read-only use; the mirror may belong to another user (git refuses those otherwise).
        c.args(["-c", "safe.directory=*", "-C"])
            .arg(mirror)
            .args(args)
            .kill_on_drop(true);
        c
    };
    let no_git = |e: std::io::Error| {
        SandboxError::Infra(format!(
            "cannot run git on this host ({e}): install it (`apt-get install -y git`)"
        ))
    };
    let check = git(&["cat-file", "-e", &format!("{commit}^{{commit}}")])
        .output()
        .await
        .map_err(no_git)?;
    if !check.status.success() {
        let why = String::from_utf8_lossy(&check.stderr);
        return Err(missing(&match why.trim() {
            "" => "is not in the mirror".to_string(),
            why => format!("cannot be read from the mirror ({why})"),
        }));
    }
    // The tree as a checkout leaves it (what the mirror has of it), tarred.
    let (mirror, commit) = (mirror.clone(), commit.to_string());
    let repo = repo.clone();
    tokio::task::spawn_blocking(move || {
        let scratch = tempfile::tempdir()
            .map_err(|e| SandboxError::Infra(format!("cannot make a scratch directory: {e}")))?;
        let dest = scratch.path().join("repo");
        std::fs::create_dir(&dest)
            .map_err(|e| SandboxError::Infra(format!("cannot make a scratch directory: {e}")))?;
        super::tree::write_tree(&mirror, &commit, &dest).map_err(|e| {
            SandboxError::BadInput(format!(
                "cannot check out {repo} at {commit} from {}: {e}",
                mirror.display()
            ))
        })?;
        let mut tar = tar::Builder::new(Vec::new());
        tar.follow_symlinks(false);
        tar.append_dir_all(".", &dest)
            .and_then(|_| tar.into_inner())
            .map_err(|e| SandboxError::Infra(format!("cannot archive {repo} at {commit}: {e}")))
    })
    .await
    .map_err(|e| SandboxError::Infra(format!("repository archive task: {e}")))?
}

/// The host's CA bundle, if it has one where distributions put it.
fn read_host_ca() -> Option<Vec<u8>> {
    HOST_CA_BUNDLES.iter().find_map(|p| std::fs::read(p).ok())
}

/// Now, in nanoseconds since the Unix epoch (the clock a container's `date +%s%N` reads).
pub(crate) fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Now, in whole seconds since the Unix epoch (as `docker events --since` takes them).
pub fn unix_now() -> u64 {
    unix_ns() / 1_000_000_000
}

fn load_usage(path: &Path) -> HashMap<String, u64> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            warn!(path = %path.display(), error = %e, "image usage file unreadable; starting afresh");
            HashMap::new()
        }),
        Err(_) => HashMap::new(),
    }
}

fn save_usage(path: &Path, usage: &HashMap<String, u64>) -> std::io::Result<()> {
    crate::write_json_whole(path, usage)
}

/// Which reprobench layer an image is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// `reprobench/env:…`: Python packages.
    Env,
    /// `reprobench/instance:…`: a repository at a commit, installed.
    Instance,
}

/// An image the cache may evict, as [`plan_eviction`] sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedImage {
    /// Image tag.
    pub tag: String,
    /// Layer kind.
    pub kind: LayerKind,
    /// Bytes the image adds over its parent (what removing it frees).
    pub own_bytes: u64,
    /// Last use, unix seconds.
    pub last_use: u64,
    /// A running execution or preparation needs it.
    pub in_use: bool,
    /// For instance images, the env image tag they are built on.
    pub parent: Option<String>,
}

/// Which images to remove so the rest fit `budget` bytes: least recently used instance images
/// first, then env images; never one in use, nor an env image an in-use or kept instance image
/// is built on (removing it would free nothing). Returns tags in removal order.
pub fn plan_eviction(images: &[CachedImage], budget: u64) -> Vec<String> {
    let mut total: u64 = images.iter().map(|i| i.own_bytes).sum();
    let mut removed: Vec<String> = Vec::new();
    if total <= budget {
        return removed;
    }
    for kind in [LayerKind::Instance, LayerKind::Env] {
        let mut candidates: Vec<&CachedImage> = images
            .iter()
            .filter(|i| i.kind == kind && !i.in_use)
            .collect();
        candidates.sort_by(|a, b| (a.last_use, &a.tag).cmp(&(b.last_use, &b.tag)));
        for c in candidates {
            if total <= budget {
                return removed;
            }
            if kind == LayerKind::Env {
                let removed_set: HashSet<&str> = removed.iter().map(String::as_str).collect();
                let has_child = images.iter().any(|i| {
                    i.kind == LayerKind::Instance
                        && i.parent.as_deref() == Some(&c.tag)
                        && !removed_set.contains(i.tag.as_str())
                });
                if has_child {
                    continue;
                }
            }
            total = total.saturating_sub(c.own_bytes);
            removed.push(c.tag.clone());
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn img(tag: &str, kind: LayerKind, mb: u64, last_use: u64) -> CachedImage {
        CachedImage {
            tag: tag.into(),
            kind,
            own_bytes: mb << 20,
            last_use,
            in_use: false,
            parent: None,
        }
    }

    fn inst(tag: &str, parent: &str, mb: u64, last_use: u64) -> CachedImage {
        CachedImage {
            parent: Some(parent.into()),
            ..img(tag, LayerKind::Instance, mb, last_use)
        }
    }

    fn check(images: &[CachedImage], budget_mb: u64, expected: &[&str]) {
        assert_eq!(
            plan_eviction(images, budget_mb << 20),
            expected,
            "images: {images:#?}"
        );
    }

    #[test]
    fn nothing_goes_under_budget() {
        let images = [img("e1", LayerKind::Env, 100, 1), inst("i1", "e1", 50, 2)];
        check(&images, 150, &[]);
        check(&[], 0, &[]);
    }

    #[test]
    fn least_recently_used_instances_go_first_and_only_as_many_as_needed() {
        let images = [
            img("e1", LayerKind::Env, 100, 1),
            inst("i1", "e1", 50, 30),
            inst("i2", "e1", 50, 10),
            inst("i3", "e1", 50, 20),
        ];
        check(&images, 160, &["i2", "i3"]);
        check(&images, 210, &["i2"]);
    }

    #[test]
    fn env_images_go_after_instances_and_only_without_children() {
        let images = [
            img("e_old", LayerKind::Env, 100, 1),
            img("e_new", LayerKind::Env, 100, 50),
            inst("i_old", "e_new", 10, 2),
            inst("i_new", "e_old", 10, 60),
        ];
        // Both instances go first (oldest first); then the oldest env.
        check(&images, 110, &["i_old", "i_new", "e_old"]);
        let mut kept = images.clone();
        kept[3].in_use = true;
        // i_new is in use, so its parent e_old stays; e_new goes once its child i_old is gone.
        check(&kept, 110, &["i_old", "e_new"]);
    }

    #[test]
    fn in_use_images_are_never_removed_even_over_budget() {
        let mut images = [img("e1", LayerKind::Env, 100, 1), inst("i1", "e1", 100, 2)];
        images[1].in_use = true;
        check(&images, 0, &[]);
        images[1].in_use = false;
        images[0].in_use = true;
        check(&images, 0, &["i1"]);
    }

    #[test]
    fn ties_break_by_tag() {
        let images = [
            inst("b", "e", 10, 5),
            inst("a", "e", 10, 5),
            img("e", LayerKind::Env, 1, 0),
        ];
        check(&images, 11, &["a"]);
    }

    #[test]
    fn usage_file_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join(USAGE_FILE);
        assert!(load_usage(&path).is_empty());
        let usage = HashMap::from([("reprobench/env:1".to_string(), 7u64)]);
        save_usage(&path, &usage).unwrap();
        assert_eq!(load_usage(&path), usage);
        std::fs::write(&path, "not json").unwrap();
        assert!(load_usage(&path).is_empty());
    }
}
